-- The shared half of the policy-set script: arguments every key uses, the
-- loading and checking of one key's value, dedupe records and the store.
-- It is not a script on its own: `scripts.rs` puts it where
-- each driver names it in an include line, before the algorithms.
--
-- A key's value is one string: the state header (the algorithm's tag byte,
-- then doubles packed with struct.pack, the first one being the mark, the
-- highest effective time at which the state was written), then, once the
-- key has had a dedupe record, the records trailer: three doubles, the
-- newest record's written_at, the oldest sequence number still held and
-- the next one to give. Doubles hold every integer below 2^53 exactly, and
-- nothing here is ever formatted as text.
--
-- The records themselves live in the key's records key (the counter key
-- plus ':dedupe', the same hash tag, passed in KEYS), a hash, so a lookup,
-- an append and an eviction each touch one field whatever the key holds
-- (docs/benchmarks.md measured the one-string layout this replaces: every
-- call read, scanned and rewrote all of them):
--   evaluation id (16 bytes) -> remaining, reset_after, written_at, seq
--   seq (one packed double, 8 bytes) -> the evaluation id written at seq,
--     then its written_at (a double)
-- Sequence numbers are given in time order, so the records held are those
-- of seq in [oldest, next), oldest first, and expiring or evicting the
-- oldest is reading one field. A seq field names the id whose record holds that
-- seq: re-recording an id (its old record expired) drops its old seq field.
local now = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local evaluation_id = ARGV[3]
-- Tag bytes: 'F' fixed window, 'S' sliding counter, 'B' token bucket; a
-- policy's kind argument is its tag, in lower case for a shadow policy.
local FIXED_WINDOW, SLIDING_COUNTER, TOKEN_BUCKET = 70, 83, 66
-- Lower case is upper case + 32; every kind byte from 97 ('a') on is shadow.
local SHADOW, SHADOW_KINDS = 32, 97

-- Header bytes of each algorithm's state: the tag, then the doubles its
-- file packs (mark first). The drivers test them inline: a helper function
-- would be one more closure to create on every call.
local FIXED_WINDOW_HEADER, SLIDING_COUNTER_HEADER, TOKEN_BUCKET_HEADER = 25, 33, 25

local TRAILER = 24

-- The records lookup of one key at effective time `t`: only where a record
-- can exist (dedupe on, a trailer, its newest record live), one HMGET that
-- also fetches the oldest seq field, which an append expires or evicts.
-- Returns the live record's remaining and reset_after (nil when there is
-- none), the seq of the id's stored record (false when none is known:
-- it must go when the id is recorded again), and the prefetched oldest seq
-- field (false for none held, nil when not fetched).
local function lookup(dkey, raw, header, t, ttl, capacity)
  if capacity == 0 or not raw or #raw == header then return nil, nil, false, nil end
  local newest, oldest, next_seq = struct.unpack('ddd', raw, header + 1)
  -- Nothing live: the next append restarts the records (store below).
  if newest + ttl <= t then return nil, nil, false, nil end
  local got = redis.call('HMGET', dkey, evaluation_id, struct.pack('d', oldest))
  local record, evict = got[1], got[2]
  if not record then return nil, nil, false, evict end
  local remaining, reset_after, written_at, seq = struct.unpack('dddd', record)
  if written_at + ttl > t then return remaining, reset_after, seq, evict end
  return nil, nil, seq, evict
end

-- Writes one key: its state as the algorithm packed it (tag, mark, ...),
-- then its records trailer, and when `charged` this evaluation's record,
-- evicting the oldest beyond `capacity`; the key and its records key live
-- until absence means the same as their content, plus the slack
-- (docs/algorithms.md steps 6 and 7). Dedupe off (capacity 0) writes no
-- trailer, so old records neither replay nor keep the key alive.
-- `header` is the stored value's header length (0 when absent); `seq` and
-- `evict` are what `lookup` returned.
local function store(key, dkey, state, state_end, raw, header, t, slack, ttl, capacity,
                     charged, remaining, reset_after, seq, evict)
  local last = state_end
  if capacity > 0 then
    local newest, oldest, next_seq = nil, 0, 0
    if raw and #raw > header then
      newest, oldest, next_seq = struct.unpack('ddd', raw, header + 1)
    end
    if charged then
      if not newest or newest + ttl <= t then
        -- No record is live (or none was ever held, or dedupe was off):
        -- whatever the records key holds is dead, so it starts again,
        -- and an id seen before has no seq field left to drop.
        redis.call('DEL', dkey)
        oldest, next_seq = 0, 0
      else
        local drop = {}
        -- The id's expired record is overwritten below; its seq field goes.
        if seq then drop[1] = struct.pack('d', seq) end
        -- From the oldest: expired records go (as the memory provider
        -- drops them), then the oldest beyond capacity. Each record goes
        -- once, so this reads about one field per append. The newest is
        -- live, so the loop stops before it.
        while oldest < next_seq do
          local at = struct.pack('d', oldest)
          local held = evict
          if held == nil then held = redis.call('HMGET', dkey, at)[1] end
          evict = nil
          -- A seq without a field is an id recorded again since: a hole.
          if held then
            if next_seq + 1 - oldest <= capacity and struct.unpack('d', held, 17) + ttl > t then
              break
            end
            drop[#drop + 1] = string.sub(held, 1, 16)
            drop[#drop + 1] = at
          end
          oldest = oldest + 1
        end
        if #drop > 0 then redis.call('HDEL', dkey, unpack(drop)) end
      end
      redis.call('HSET', dkey, evaluation_id, struct.pack('dddd', remaining, reset_after, t, next_seq),
        struct.pack('d', next_seq), evaluation_id .. struct.pack('d', t))
      newest, next_seq = t, next_seq + 1
    end
    if newest then
      local live = newest + ttl
      if live > last then last = live end
      state = state .. struct.pack('ddd', newest, oldest, next_seq)
      local lifetime = last + slack - t
      if lifetime < 1 then lifetime = 1 end
      -- The records key lives as long as the key, so a record is never
      -- lost before it, and a key with a trailer always has its records
      -- key: in a migrating Cluster slot a script whose keys are only
      -- partly there is refused (TRYAGAIN) until the slot has moved.
      redis.call('PEXPIRE', dkey, lifetime)
    end
  end
  local lifetime = last + slack - t
  if lifetime < 1 then lifetime = 1 end
  redis.call('SET', key, state, 'PX', lifetime)
end
