-- Sliding counter (docs/algorithms.md): state = mark, window start, current
-- count, previous count.
-- The first byte tags the algorithm, so state written under another
-- algorithm (a policy changed it without a new revision) is refused, not misread.
local TAG = 'S'
local HEADER = 33
-- #include prelude.lua

local limit = tonumber(ARGV[8])
local window = tonumber(ARGV[9])
local window_start = now - now % window
local elapsed = now - window_start
local current, previous = 0, 0
if header then
  local stored_start, stored_current, stored_previous = struct.unpack('ddd', header, 10)
  if stored_start == window_start then
    current, previous = stored_current, stored_previous
  elseif stored_start == window_start - window then
    previous = stored_current
  end
end
local estimate = math.floor(previous * (window - elapsed) / window) + current
local reset_after = window_start + window - now
if estimate + cost > limit then
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
  return {'denied', math.max(0, limit - estimate), reset_after, retry_after, 0}
end
current = current + cost
local remaining = limit - (estimate + cost)
remember(remaining, reset_after)
store(struct.pack('dddd', now, window_start, current, previous), window_start + 2 * window)
return {'allowed', remaining, reset_after, 0, 0}
