-- An operator's reset: one UNLINK of the counter key, which with dedupe on
-- also holds the records (prelude.lua), so the next request starts fresh
-- and an evaluation id seen before charges again. UNLINK frees a large
-- hash (a key at a high record cap) off Redis's main thread, where DEL
-- would block it. Deleting an absent key is a no-op: the reset is
-- idempotent.
--
-- KEYS[1]: the counter key. Reply: 1 when it existed, else 0.
return redis.call('UNLINK', KEYS[1])
