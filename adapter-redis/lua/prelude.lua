-- The shared half of the policy-set script: arguments every key uses, the
-- loading and checking of one key's value, dedupe records and the store.
-- It is not a script on its own: `scripts.rs` puts it where
-- each driver names it in an include line, before the algorithms.
--
-- A key's value is one string: the state header (the algorithm's tag byte,
-- then doubles packed with struct.pack, the first one being the mark, the
-- highest effective time at which the state was written), then the dedupe
-- records, 40 bytes each, oldest first: evaluation id (16 bytes),
-- remaining, reset_after, written_at (doubles). Doubles hold every integer
-- below 2^53 exactly, and nothing here is ever formatted as text.
local now = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local evaluation_id = ARGV[3]
local RECORD = 40
-- Tag bytes: 'F' fixed window, 'S' sliding counter, 'B' token bucket; a
-- policy's kind argument is its tag, in lower case for a shadow policy.
local FIXED_WINDOW, SLIDING_COUNTER, TOKEN_BUCKET = 70, 83, 66
-- Lower case is upper case + 32; every kind byte from 97 ('a') on is shadow.
local SHADOW, SHADOW_KINDS = 32, 97

-- Header bytes of each algorithm's state: the tag, then the doubles its
-- file packs (mark first). The drivers test them inline: a helper function
-- would be one more closure to create on every call.
local FIXED_WINDOW_HEADER, SLIDING_COUNTER_HEADER, TOKEN_BUCKET_HEADER = 25, 33, 25

-- The offset of this evaluation's record in `records` when it is live at
-- effective time `t`, else nil. Ids are stored at record boundaries; a
-- match elsewhere is bytes of other fields. The newest record of the id
-- decides, as in shared_contract::evaluate_set.
local function live_record(records, t, ttl)
  local found = nil
  local from = 1
  while true do
    local at = string.find(records, evaluation_id, from, true)
    if not at then break end
    if (at - 1) % RECORD == 0 then found = at end
    from = at + 1
  end
  if found and struct.unpack('d', records, found + 32) + ttl > t then return found end
  return nil
end

-- Writes one key: its state as the algorithm packed it (tag, mark, ...),
-- then its records after dropping the expired ones and, when `charged`,
-- this evaluation's record; the key lives until absence means the same
-- as its content, plus the slack (docs/algorithms.md steps 6 and 7).
-- Dedupe off (capacity 0) drops old records, so they neither replay nor
-- keep the key alive.
local function store(key, state, state_end, records, t, slack, ttl, capacity, charged,
                     remaining, reset_after)
  local last = state_end
  if capacity > 0 then
    -- Records are appended in time order, so the expired ones are a prefix.
    local first = 1
    while first <= #records and struct.unpack('d', records, first + 32) + ttl <= t do
      first = first + RECORD
    end
    if first > 1 then records = string.sub(records, first) end
    if charged then
      records = records .. evaluation_id .. struct.pack('ddd', remaining, reset_after, t)
      local keep = capacity * RECORD
      if #records > keep then records = string.sub(records, #records - keep + 1) end
    end
    if #records > 0 then
      local newest = struct.unpack('d', records, #records - RECORD + 33) + ttl
      if newest > last then last = newest end
      -- The value's one concatenation, only when it has records: the
      -- algorithm packed the state with its tag.
      state = state .. records
    end
  end
  local lifetime = last + slack - t
  if lifetime < 1 then lifetime = 1 end
  redis.call('SET', key, state, 'PX', lifetime)
end
