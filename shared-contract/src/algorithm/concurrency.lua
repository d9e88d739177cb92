-- In-flight leases (docs/algorithms.md, "Concurrency (in-flight leases)")
-- over one key: a sorted set whose members are the lease ids (evaluation
-- ids, 16 bytes) scored by their expires_at (epoch ms), and the mark, held
-- as the member LEASE_MARK (prelude.lua) scored by -1 - mark: below every
-- expiry and below 0, so the sweep of expired leases
-- (`ZREMRANGEBYSCORE key 0 t`) never removes it and the count of live
-- leases (`ZCOUNT key t+1 +inf`) never counts it. Included by
-- `policy-set.lua` and `single-lease.lua` after the prelude.

-- Reads a lease key before its run: its mark (nil for none), the expiry
-- of this evaluation's lease (nil for none) and the live leases at the
-- key's effective time max(now, mark): those with expires_at > t. A key of
-- another type (another algorithm's string or hash under the same
-- revision) is corrupt: the fourth result is then true. Scores come back
-- as decimal text of whole numbers below 2^53, so the arithmetic coercion
-- is exact; t + 1 is the exclusive bound of whole milliseconds without a
-- text '(' bound. A key without a mark holds no lease: every write adds
-- both, and neither the sweep nor a release removes the mark.
local function lease_read(key)
  local scores = redis.pcall('ZMSCORE', key, LEASE_MARK, evaluation_id)
  if scores.err then
    wrong_type(scores)
    return nil, nil, 0, true
  end
  local mark, lease = scores[1], scores[2]
  if not mark then return nil, nil, 0, false end
  mark = -1 - mark
  local t = now
  if mark > t then t = mark end
  if lease then lease = lease + 0 end
  return mark, lease, redis.call('ZCOUNT', key, t + 1, '+inf'), false
end

-- The live leases at the caller's time when the key's mark is set aside
-- (prelude.lua `unreachable`): only those a taker on Redis's time could
-- have given, expiring after `now` and no later than `now + lease_ttl + 3 *
-- regression` (such a taker's clock, and the mark it was evaluated at, are
-- each within the bound of Redis's clock, which is within it of this
-- caller's). Returns their count and that latest expiry; the write sweeps
-- the leases beyond it, a writer ahead of time's.
local function lease_held_on_time(key, lease_ttl, regression)
  local latest = now + lease_ttl + 3 * regression
  return redis.call('ZCOUNT', key, now + 1, latest), latest
end

-- The run, as `fixed-window.lua`'s, over the `held` live leases at t:
-- admitted iff held + 1 <= max_in_flight, whatever the cost (a lease is one
-- slot). Returns allowed, remaining, reset_after (always 0: no window),
-- retry_after (the policy's retry-after on a refusal) and, for a charging
-- run that allows, the new lease's expires_at as both the state to write
-- and its end. The lease counts for lease_ttl + regression (the policy's
-- maximum clock regression): a clock ahead of the taker's by up to the
-- bound must never drop a lease the taker still holds.
local function concurrency(held, t, charge, max_in_flight, lease_ttl, retry_after, regression)
  if held + 1 > max_in_flight then
    return false, math.max(0, max_in_flight - held), 0, math.max(1, retry_after)
  end
  if not charge then return true, max_in_flight - held, 0, 0 end
  local expires_at = t + lease_ttl + regression
  return true, max_in_flight - held - 1, 0, 0, expires_at, expires_at
end

-- Writes the lease of this evaluation: the lease and the mark in one ZADD,
-- then the sweep of every lease expired at t (after the ZADD, so the key
-- never empties in between: an emptied key would lose its expiry), then
-- the lifetime: the lease's expiry plus the slack, counted from the
-- caller's time. `existed` says the key held a mark, so it has an expiry
-- that GT may only move later (prelude.lua `store` says why); a new key
-- has none, which GT would read as endless. `aside` (nil unless the key's
-- mark was set aside) is the latest expiry a taker on time gives: the
-- leases beyond it go with the mark they came with.
local function lease_store(key, t, expires_at, slack, existed, aside)
  redis.call('ZADD', key, -1 - t, LEASE_MARK, expires_at, evaluation_id)
  redis.call('ZREMRANGEBYSCORE', key, 0, t)
  if aside then redis.call('ZREMRANGEBYSCORE', key, aside + 1, '+inf') end
  local lifetime = expires_at + slack - now
  if lifetime < 1 then lifetime = 1 end
  if existed then
    redis.call('PEXPIRE', key, lifetime, 'GT')
  else
    redis.call('PEXPIRE', key, lifetime)
  end
end
