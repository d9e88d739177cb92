-- Release of one lease (docs/algorithms.md, "Concurrency (in-flight
-- leases)"): its id leaves every lease key of its set (concurrency.lua),
-- in one EVALSHA (the keys share the subject's hash tag). Idempotent: a
-- lease already gone (released, swept, or its key expired or reset) is
-- not held, and nothing else changes: no other lease, no mark, no expiry.
-- A lease past its expiry at the caller's time is removed but freed no
-- slot, so it does not count. A key of another type holds no lease and is
-- left alone; any other error (NOPERM, say) fails the script as it came.
--
-- KEYS: the lease keys (1 to 8). ARGV[1]: the lease id (16 bytes),
-- ARGV[2]: caller time (epoch ms).
-- Reply: how many of the keys held the lease live.
local now = ARGV[2] + 0
local released = 0
for k = 1, #KEYS do
  local expires_at = redis.pcall('ZSCORE', KEYS[k], ARGV[1])
  if type(expires_at) == 'table' then
    if string.find(expires_at.err, 'WRONGTYPE', 1, true) ~= 1 then return error(expires_at) end
  elseif expires_at then
    redis.call('ZREM', KEYS[k], ARGV[1])
    if expires_at + 0 > now then released = released + 1 end
  end
end
return released
