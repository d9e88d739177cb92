-- An operator's reset: the counter key and its dedupe records key go in
-- one DEL, so the next request starts fresh and an evaluation id seen
-- before charges again. Both keys share the subject's hash tag (one slot,
-- so this also runs on a Cluster). Deleting an absent key is a no-op: the
-- reset is idempotent.
--
-- KEYS[1]: the counter key; KEYS[2]: its records key. Reply: how many of
-- the two existed.
return redis.call('DEL', KEYS[1], KEYS[2])
