-- Fixed window (docs/algorithms.md): state = mark, window start, count.
-- The first byte tags the algorithm, so state written under another
-- algorithm (a policy changed it without a new revision) is refused, not misread.
local TAG = 'F'
local HEADER = 25
-- #include prelude.lua

local limit = tonumber(ARGV[8])
local window = tonumber(ARGV[9])
local window_start = now - now % window
local count = 0
if header then
  local stored_start, stored_count = struct.unpack('dd', header, 10)
  if stored_start == window_start then count = stored_count end
end
local reset_after = window_start + window - now
if count + cost > limit then
  return {'denied', math.max(0, limit - count), reset_after, reset_after, 0}
end
count = count + cost
remember(limit - count, reset_after)
store(struct.pack('ddd', now, window_start, count), window_start + window)
return {'allowed', limit - count, reset_after, 0, 0}
