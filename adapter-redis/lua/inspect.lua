-- An operator's inspect: one counter key's state, decoded with the layout
-- prelude.lua writes (docs/algorithms.md, "Stored state on Redis"). It
-- only reads (one GET, or the state field of a key that holds dedupe
-- records), so it charges, extends and records nothing; the algorithm
-- then runs in Rust, in the step every other provider shares.
--
-- KEYS[1]: the counter key. Reply: {'absent'}, {'corrupt'} (another tag or
-- length), or {'state', tag, mark, a, b, c}: the tag byte and the state's
-- doubles after it (c is 0 for a two-number state), all whole numbers
-- below 2^53, so the integer reply is exact.
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' then
  -- A hash holds its state in field 's'; any other error fails as it came.
  if string.find(raw.err, 'WRONGTYPE', 1, true) ~= 1 then error(raw) end
  raw = redis.call('HMGET', KEYS[1], 's')[1]
end
if not raw then return {'absent'} end
local tag = string.byte(raw, 1)
local header
if tag == 70 or tag == 66 then header = 25 elseif tag == 83 then header = 33 else
  return {'corrupt'}
end
local size = #raw - header
if size ~= 0 and size ~= 24 and size ~= 40 then return {'corrupt'} end
if header == 25 then
  local mark, a, b = struct.unpack('ddd', raw, 2)
  return {'state', tag, mark, a, b, 0}
end
local mark, a, b, c = struct.unpack('dddd', raw, 2)
return {'state', tag, mark, a, b, c}
