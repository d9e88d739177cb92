-- Sliding counter (docs/algorithms.md) over one key's state: mark, window
-- start, current count, previous count. Included by `policy-set.lua` after
-- the prelude; arguments and results as in `fixed-window.lua` (a settle
-- moves the current count only: a refund of a reservation of the previous
-- window gives nothing back).
local function sliding_counter(raw, t, charge, limit, window)
  local window_start = t - t % window
  local elapsed = t - window_start
  local current, previous = 0, 0
  if raw then
    local stored_start, stored_current, stored_previous = struct.unpack('ddd', raw, 10)
    if stored_start == window_start then
      current, previous = stored_current, stored_previous
    elseif stored_start == window_start - window then
      previous = stored_current
    end
  end
  local estimate = math.floor(previous * (window - elapsed) / window) + current
  local reset_after = window_start + window - t
  if estimate + cost > limit and (charge == true or not charge) then
    -- The smallest wait after which the same request passes with no other traffic.
    local retry_after = nil
    local spare = limit - cost - current
    if spare >= 0 and previous > 0 then
      local x = window - math.floor(((spare + 1) * window - 1) / previous)
      if x < window then retry_after = x - elapsed end
    end
    if not retry_after then
      local x = 0
      if current > 0 then
        x = math.max(0, window - math.floor(((limit - cost + 1) * window - 1) / current))
      end
      if x < window then
        retry_after = reset_after + x
      else
        retry_after = reset_after + window
      end
    end
    return false, math.max(0, limit - estimate), reset_after, math.max(1, retry_after)
  end
  if not charge then return true, limit - estimate, reset_after, 0 end
  local end_at = window_start + 2 * window
  if charge == true then
    return true, limit - (estimate + cost), reset_after, 0,
      struct.pack('Bdddd', SLIDING_COUNTER, t, window_start, current + cost, previous), end_at
  end
  local weighted = estimate - current
  if charge == 'force' then
    current = current + cost
  elseif charge >= window_start then
    -- A refund of a reservation of this window.
    current = math.max(0, current - cost)
  end
  return true, math.max(0, limit - (weighted + current)), reset_after, 0,
    struct.pack('Bdddd', SLIDING_COUNTER, t, window_start, current, previous), end_at
end
