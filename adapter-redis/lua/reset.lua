-- An operator's reset: one DEL of the counter key, which with dedupe on
-- also holds the records (prelude.lua), so the next request starts fresh
-- and an evaluation id seen before charges again. Deleting an absent key is
-- a no-op: the reset is idempotent.
--
-- KEYS[1]: the counter key. Reply: 1 when it existed, else 0.
return redis.call('DEL', KEYS[1])
