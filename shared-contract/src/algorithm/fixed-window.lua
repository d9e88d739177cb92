-- Fixed window (docs/algorithms.md) over one key's state: mark, window
-- start, count. Included by `policy-set.lua` after the prelude.
--
-- `raw` is the key's value (false when absent), `t` its effective time,
-- `charge` true to charge, false for a spared run, or a settle's
-- (docs/algorithms.md "Settling usage"): 'force' charges `cost` without
-- the check; a number, the effective time a reservation was charged at,
-- gives `cost` back when that time is in this window (a number, not a
-- second variable the function would capture: a captured variable costs
-- every call its upvalue); both allow. Then the policy's parameters from
-- ARGV. Returns allowed, remaining, reset_after, retry_after, and when the
-- run writes state: the packed state (tag byte, then mark) and state_end.
-- A denial or a spared run (charge false) writes nothing.
local function fixed_window(raw, t, charge, limit, window)
  local window_start = t - t % window
  local count = 0
  if raw then
    local stored_start, stored_count = struct.unpack('dd', raw, 10)
    if stored_start == window_start then count = stored_count end
  end
  local reset_after = window_start + window - t
  -- A settle's charge is never refused (tested only past the limit).
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
    elseif charge >= window_start then
      count = math.max(0, count - cost)
    end
    remaining = math.max(0, limit - count)
  end
  return true, remaining, reset_after, 0,
    struct.pack('Bddd', FIXED_WINDOW, t, window_start, count), window_start + window
end
