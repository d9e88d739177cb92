-- The shared half of the policy-set script: arguments every key uses, the
-- loading and checking of one key's value, dedupe records and the store.
-- It is not a script on its own: `scripts.rs` puts it where
-- each driver names it in an include line, before the algorithms.
--
-- A key's value depends on its policy's dedupe. With dedupe off it is a
-- string: the state header (the algorithm's tag byte, then doubles packed
-- with struct.pack, the first one being the mark, the highest effective
-- time at which the state was written), SET with its lifetime at every
-- write. With dedupe on it is a hash holding the state and its records
-- together, so the one read every evaluation makes also finds the
-- evaluation's record (docs/benchmarks.md measured the layouts this
-- replaces: records inside the state string, then in a second key):
--   's' -> the state header, then the records trailer: five doubles, the
--     newest record's written_at, the oldest held record's written_at (a
--     lower bound once a sweep stopped short), the oldest seq still held,
--     the next seq to give, and the time until which the last write asked
--     the key to live (its caller time; no script reads it back: see
--     `store`)
--   evaluation id (16 bytes) -> remaining, reset_after, written_at, seq
--   seq (one packed double, 8 bytes) -> the evaluation id written at seq,
--     then its written_at (a double)
-- Sequence numbers are given in time order, so the records held are those
-- of seq in [oldest, next), oldest first, and expiring or evicting the
-- oldest is reading one field. A seq field names the id whose record holds
-- that seq: re-recording an id (its old record expired) drops its old seq
-- field, leaving a hole that a sweep steps over.
-- Doubles hold every integer below 2^53 exactly, and nothing here is ever
-- formatted as text.
local now = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local evaluation_id = ARGV[3]
-- Tag bytes: each registered algorithm's (its `RateAlgorithm::TAG`), as
-- a constant named after its function in upper case (FIXED_WINDOW for
-- fixed_window); LEASES is the tag of the algorithm whose key is a lease
-- set (concurrency.lua), never a state header, so its tag names only its
-- kind. A policy's kind argument is its tag, in lower case for a shadow
-- policy. `scripts.rs` writes them here from the registry.
-- #tags
-- Lower case is upper case + 32; every kind byte from 97 ('a') on is shadow.
local SHADOW, SHADOW_KINDS = 32, 97

-- The member of a lease set (concurrency.lua) that holds its mark: one
-- byte, so never a lease id (16 bytes).
local LEASE_MARK = 'm'

-- The records trailer a key with dedupe on keeps after its header.
local TRAILER = 40

-- Redis's own clock (epoch ms), the arbiter of which caller clock is wrong
-- (docs/algorithms.md step 3): read at most once per call, and only when a
-- clock must be judged (a mark beyond a caller's bound, or a write that
-- moves a key's mark forward). nil when this user may not run TIME (a rule
-- printed before it was needed): clocks are then judged only against each
-- other, as the marks alone do.
local redis_ms = false
local function redis_now()
  if redis_ms == false then
    local time = redis.pcall('TIME')
    if time.err then
      redis_ms = nil
    else
      redis_ms = time[1] * 1000 + math.floor(time[2] / 1000)
    end
  end
  return redis_ms
end

-- Whether `mark`, beyond this caller's bound, is one no clock on Redis's
-- time can reach: this caller is within `regression` of Redis's clock and
-- the mark is further than that ahead of it. Only a writer whose clock ran
-- ahead put it there; its state is set aside rather than lock the key for
-- everyone on time until its window ends.
local function unreachable(mark, regression)
  local server = redis_now()
  return server ~= nil and now - server <= regression and server - now <= regression
    and mark > server + regression
end

-- How far beyond its bound this caller's clock is ahead of Redis's, when
-- writing would move `mark` (within reach of Redis's clock) to a time no
-- clock on Redis's time reaches; nil when the write may go ahead. The
-- caller is then the wrong clock: it is refused and writes nothing.
local function ahead_of_redis(mark, regression)
  if now <= mark then return nil end
  local server = redis_now()
  if server == nil or mark > server + regression then return nil end
  local by = now - server - regression
  if by > 0 then return by end
  return nil
end

-- The header length and tag of a stored value (`raw`, not false): when
-- its tag is an algorithm's and it is that algorithm's header alone (a
-- string) or with the records trailer (a hash's state field); nil for any
-- other value, which is corrupt. The one place that knows every
-- algorithm's header: the drivers and the inspect read a value through
-- it.
local function header_of(raw)
  -- Each header is the tag byte, then the doubles the algorithm's file
  -- packs (mark first); `scripts.rs` writes each algorithm's branch here
  -- from the registry, its length a literal (no local, no upvalue).
  local tag, header = string.byte(raw, 1), nil
-- #headers
  local size = #raw - header
  if size == 0 or size == TRAILER then return header, tag end
  return nil
end

-- Expired records are swept at most this many per write, so a key that
-- holds many never makes one call long; each write sweeps again until none
-- is left.
local SWEEP = 8

-- Reads key's value the way its policy keeps it: with dedupe off (capacity
-- 0) one GET; with dedupe on one HMGET of the state and this evaluation's
-- record, and `also`'s record in the same read when it is given (a
-- settle's reservation). Returns the state (with its trailer when the key
-- is a hash; false when absent), the id's record (nil for none), whether
-- the key is a hash and `also`'s record (nil for none). A key of the
-- other type (the policy's dedupe changed across a restart without a new
-- revision) is read the other way, after a WRONGTYPE error that INFO
-- errorstats counts. A hash read with dedupe off becomes the string at
-- once (its bytes and expiry kept: SET .. KEEPTTL),
-- so that error comes once, even for a subject that is only refused and so
-- never writes; a string read with dedupe on is converted by its next
-- write. Any other error (NOPERM, say) fails the script as it came.
local function wrong_type(reply)
  if string.find(reply.err, 'WRONGTYPE', 1, true) ~= 1 then error(reply) end
end
local function load(key, capacity, also)
  if capacity == 0 then
    local raw = redis.pcall('GET', key)
    if type(raw) ~= 'table' then return raw, nil, false end
    wrong_type(raw)
    raw = redis.call('HMGET', key, 's')[1]
    if raw then redis.call('SET', key, raw, 'KEEPTTL') end
    return raw, nil, not raw
  end
  local got
  if also then
    got = redis.pcall('HMGET', key, 's', evaluation_id, also)
  else
    got = redis.pcall('HMGET', key, 's', evaluation_id)
  end
  if got.err then
    wrong_type(got)
    return redis.call('GET', key), nil, false
  end
  return got[1], got[2], true, got[3]
end

-- Writes one key: its state as the algorithm packed it (tag, mark, ...),
-- and with dedupe on its records trailer and, when `charged`, this
-- evaluation's record, evicting the oldest beyond `capacity`; every write
-- with dedupe on also sweeps expired records, oldest first, at most SWEEP
-- of them (docs/algorithms.md step 7). The key lives until absence means
-- the same as its content, plus the slack (steps 6 and 7), counted from
-- the caller's own clock. Redis keeps the expiry as an instant of its own
-- clock, which no caller reads, so an expiry another writer set cannot be
-- judged from caller times (a writer whose clock ran ahead set it short
-- for everyone slower): every write asks for its own lifetime. A string
-- gets it with the SET; a hash with a PEXPIRE that, once the key has an
-- expiry, only moves it later (GT), so the key lives as long as the latest
-- need of any writer. `header` is the stored state's header length (0 when
-- absent), `hashed` whether the key is a hash (from `load`), `stale` the
-- seq of this id's expired record (nil for none).
local function store(key, state, state_end, raw, header, hashed, t, slack, ttl, capacity,
                     charged, remaining, reset_after, stale)
  if capacity == 0 then
    local lifetime = state_end + slack - now
    if lifetime < 1 then lifetime = 1 end
    redis.call('SET', key, state, 'PX', lifetime)
    return
  end
  local newest, oldest_at, oldest, next_seq = 0, 0, 0, 0
  if hashed then
    if raw and #raw == header + TRAILER then
      newest, oldest_at, oldest, next_seq = struct.unpack('dddd', raw, header + 1)
    end
  elseif raw then
    -- A string of this revision, written with dedupe off: it becomes the hash.
    redis.call('UNLINK', key)
  end
  local count = next_seq - oldest
  local drop = nil
  -- The id's expired record is overwritten below; its seq field goes.
  if charged and stale then drop = {struct.pack('d', stale)} end
  local expired = count > 0 and oldest_at + ttl <= t
  if expired or (charged and count >= capacity) then
    -- From the oldest: expired ones go (up to SWEEP at once), and for a
    -- charge the one beyond capacity; the first live one within capacity
    -- stays.
    local reads = 1
    if expired then reads = math.min(count, SWEEP) end
    local fields = {}
    for i = 1, reads do fields[i] = struct.pack('d', oldest + i - 1) end
    local held = redis.call('HMGET', key, unpack(fields))
    drop = drop or {}
    for i = 1, reads do
      local link = held[i]
      -- A seq without a field is an id recorded again since: a hole.
      if link then
        local at = struct.unpack('d', link, 17)
        oldest_at = at
        if at + ttl > t and (count < capacity or not charged) then break end
        drop[#drop + 1] = string.sub(link, 1, 16)
        drop[#drop + 1] = fields[i]
      end
      count = count - 1
      oldest = oldest + 1
    end
  end
  if drop and #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
  if charged then
    if oldest == next_seq then oldest_at = t end
    newest = t
    next_seq = next_seq + 1
  end
  local need = state_end
  if newest + ttl > need then need = newest + ttl end
  need = need + slack
  state = state .. struct.pack('ddddd', newest, oldest_at, oldest, next_seq, need)
  if charged then
    local seq = next_seq - 1
    redis.call('HSET', key, 's', state,
      evaluation_id, struct.pack('dddd', remaining, reset_after, t, seq),
      struct.pack('d', seq), evaluation_id .. struct.pack('d', t))
  else
    redis.call('HSET', key, 's', state)
  end
  local lifetime = need - now
  if lifetime < 1 then lifetime = 1 end
  if hashed and raw then
    redis.call('PEXPIRE', key, lifetime, 'GT')
  else
    -- A new hash has no expiry, which GT would take for an endless one.
    redis.call('PEXPIRE', key, lifetime)
  end
end
