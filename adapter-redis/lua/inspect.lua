-- An operator's inspect: one counter key's state, decoded with the layout
-- prelude.lua writes (docs/algorithms.md, "Stored state on Redis"). It
-- only reads (the key's TYPE, then one GET, or the state field of a key
-- that holds dedupe records), so it charges, extends and records nothing;
-- the algorithm then runs in Rust, in the step every other provider
-- shares. Asking the type first keeps the server's error counts still: a
-- GET tried on a hash is a WRONGTYPE error in INFO errorstats, which
-- operators alert on.
--
-- KEYS[1]: the counter key. Reply: {'absent'}, {'corrupt'} (another tag or
-- length, or a key of a type no script writes), or {'state', tag, mark, a,
-- b, c}: the tag byte and the state's doubles after it (c is 0 for a
-- two-number state), all whole numbers below 2^53, so the integer reply is
-- exact.
local kind = redis.call('TYPE', KEYS[1]).ok
local raw
if kind == 'string' then
  raw = redis.call('GET', KEYS[1])
elseif kind == 'hash' then
  raw = redis.call('HMGET', KEYS[1], 's')[1]
elseif kind == 'none' then
  return {'absent'}
else
  return {'corrupt'}
end
-- A hash without its state field is read as absent, as `evaluate` reads it.
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
