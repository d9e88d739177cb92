-- Fixed window (docs/algorithms.md) over one key's state: mark, window
-- start, count. Included by `policy-set.lua` after the prelude.
--
-- `raw` is the key's value (false when absent), `t` its effective time,
-- `charge` false for a spared run; then the policy's parameters from ARGV.
-- Returns allowed, remaining, reset_after, retry_after, and when the run
-- writes state: the packed state (tag byte, then mark) and state_end. A denial or a
-- spared run (charge false) writes nothing.
local function fixed_window(raw, t, charge, limit, window)
  local window_start = t - t % window
  local count = 0
  if raw then
    local stored_start, stored_count = struct.unpack('dd', raw, 10)
    if stored_start == window_start then count = stored_count end
  end
  local reset_after = window_start + window - t
  if count + cost > limit then
    return false, math.max(0, limit - count), reset_after, math.max(1, reset_after)
  end
  if not charge then return true, limit - count, reset_after, 0 end
  count = count + cost
  return true, limit - count, reset_after, 0,
    struct.pack('Bddd', FIXED_WINDOW, t, window_start, count), window_start + window
end
