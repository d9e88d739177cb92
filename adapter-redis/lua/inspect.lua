-- An operator's inspect: one counter key's state, decoded with the layout
-- prelude.lua writes (docs/algorithms.md, "Stored state on Redis"). It
-- only reads (the key's TYPE, then one GET, or the state field of a key
-- that holds dedupe records, or a lease set's members), so it charges,
-- extends and records nothing; the algorithm then runs in Rust, in the
-- step every other provider shares. Asking the type first keeps the
-- server's error counts still: a GET tried on a hash is a WRONGTYPE error
-- in INFO errorstats, which operators alert on.
--
-- KEYS[1]: the counter key. Reply: {'absent'}, {'corrupt'} (another tag or
-- length, a lease set without its mark, or a key of a type no script
-- writes), {'state', tag, mark, a, b, c}: the tag byte and the state's
-- doubles after it (c is 0 for a two-number state), all whole numbers
-- below 2^53 in magnitude (a token bucket's tokens below zero after a
-- settle's charge past it), so the integer reply is exact; or for a lease set
-- (concurrency.lua) {'leases', mark, then each lease id and its
-- expires_at}, expired leases the sweep has not removed yet included.
-- #include prelude.lua

local kind = redis.call('TYPE', KEYS[1]).ok
local raw
if kind == 'string' then
  raw = redis.call('GET', KEYS[1])
elseif kind == 'hash' then
  raw = redis.call('HMGET', KEYS[1], 's')[1]
elseif kind == 'zset' then
  -- Every member with its score, the mark (scored -1 - mark) first: a
  -- key holds at most max-in-flight live leases.
  local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  if members[1] ~= LEASE_MARK then return {'corrupt'} end
  local reply = {'leases', -1 - members[2]}
  for i = 3, #members, 2 do
    reply[#reply + 1] = members[i]
    reply[#reply + 1] = members[i + 1] + 0
  end
  return reply
elseif kind == 'none' then
  return {'absent'}
else
  return {'corrupt'}
end
-- A hash without its state field is read as absent, as `evaluate` reads it.
if not raw then return {'absent'} end
local header, tag = header_of(raw)
if not header then return {'corrupt'} end
-- The tag, then the doubles after it (mark first). unpack also returns the
-- position after the last one: the reply carries four numbers after the
-- tag, zero beyond the state's own.
local doubles = (header - 1) / 8
local reply = {'state', tag, struct.unpack(string.rep('d', doubles), raw, 2)}
for i = 3 + doubles, 6 do reply[i] = 0 end
reply[7] = nil
return reply
