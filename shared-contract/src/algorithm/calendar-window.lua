-- Calendar window (docs/algorithms.md) over one key's state: mark, period
-- start, count, the fixed window's fields under the tag 'P'. Included after
-- the prelude, whose `header_of` reads its header (25 bytes, as the fixed
-- window's).
--
-- No calendar is read here: the caller computes, at its own time, the
-- current period's start and end and the next period's end in the policy's
-- time zone, and they come in ARGV. `t` is the key's effective time: the
-- caller's time or a mark ahead of it by at most the clock-regression
-- bound (at most an hour, less than the shortest period, 23 hours), so it
-- lies in the current period or the next one.
--
-- `raw` is the key's value (false when absent), `charge` as in
-- `fixed-window.lua` (a refund gives back only a reservation of this
-- period). Returns allowed, remaining, reset_after, retry_after, and when
-- the run writes state: the packed state (tag byte, then mark) and
-- state_end. A denial or a spared run (charge false) writes nothing.
local function calendar_window(raw, t, charge, limit, period_start, period_end, next_end)
  if t >= period_end then
    -- A mark of the next period (another instance's clock, ahead within
    -- the bound, wrote it): count in that period, as the caller would at t.
    period_start, period_end = period_end, next_end
  end
  local count = 0
  if raw then
    local stored_start, stored_count = struct.unpack('dd', raw, 10)
    if stored_start == period_start then count = stored_count end
  end
  local reset_after = math.max(0, period_end - t)
  if count + cost > limit and (charge == true or not charge) then
    return false, math.max(0, limit - count), reset_after, math.max(1, reset_after)
  end
  if not charge then return true, limit - count, reset_after, 0 end
  local remaining
  if charge == true then
    count = count + cost
    remaining = limit - count
  else
    if charge == 'force' then
      count = count + cost
    elseif charge >= period_start then
      count = math.max(0, count - cost)
    end
    remaining = math.max(0, limit - count)
  end
  return true, remaining, reset_after, 0,
    struct.pack('Bddd', CALENDAR_WINDOW, t, period_start, count), period_end
end
