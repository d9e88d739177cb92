-- The shared first half of the three rate-limit scripts. It is not a script
-- on its own: `RateLimitScripts` puts it where an algorithm file says
-- `-- #include prelude.lua`, after the file has defined TAG and HEADER.
--
-- KEYS[1] is the subject's counter key. Its value is one string: the state
-- header (the algorithm's tag byte, then doubles packed with struct.pack,
-- the first one being the mark, the highest caller time at which the state
-- was written), then the dedupe records, 40 bytes each, oldest first: evaluation id (16 bytes), remaining,
-- reset_after, written_at (doubles). Doubles hold every integer below 2^53
-- exactly, and nothing here is ever formatted as text.
-- ARGV: 1 caller time (epoch ms), 2 cost, 3 maximum clock regression (ms),
-- 4 TTL slack = max(cleanup grace, regression) (ms), 5 dedupe TTL (ms, 0 =
-- off), 6 dedupe record capacity, 7 evaluation id (16 bytes), 8.. algorithm.
-- Reply: {status, remaining, reset_after_ms, retry_after_ms, replayed 0/1}.
local key = KEYS[1]
local now = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local regression = tonumber(ARGV[3])
local slack = tonumber(ARGV[4])
local dedup_ttl = tonumber(ARGV[5])
local dedup_capacity = tonumber(ARGV[6])
local evaluation_id = ARGV[7]
local RECORD = 40

local raw = redis.call('GET', key)
local header = nil
local records = ''
if raw then
  if #raw < HEADER or (#raw - HEADER) % RECORD ~= 0 or string.sub(raw, 1, 1) ~= TAG then
    return {'corrupt', 0, 0, 0, 0}
  end
  local mark = struct.unpack('d', raw, 2)
  if mark - now > regression then
    return {'clock_unsafe', 0, 0, mark - now - regression, 0}
  end
  -- Inside the bound, time never runs backwards within a key.
  if mark > now then now = mark end
  header = raw
  records = string.sub(raw, HEADER + 1)
end

if dedup_ttl > 0 then
  -- Records are appended in time order, so the expired ones are a prefix.
  local first = 1
  while first <= #records and struct.unpack('d', records, first + 32) + dedup_ttl <= now do
    first = first + RECORD
  end
  if first > 1 then records = string.sub(records, first) end
  local from = 1
  while true do
    local at = string.find(records, evaluation_id, from, true)
    if not at then break end
    if (at - 1) % RECORD == 0 then
      local remaining, reset_after = struct.unpack('dd', records, at + 16)
      return {'allowed', remaining, reset_after, 0, 1}
    end
    from = at + 1
  end
else
  records = ''
end

-- Appends the record of a charged evaluation and evicts the oldest beyond capacity.
local function remember(remaining, reset_after)
  if dedup_ttl > 0 and dedup_capacity > 0 then
    records = records .. evaluation_id .. struct.pack('ddd', remaining, reset_after, now)
    local keep = dedup_capacity * RECORD
    if #records > keep then records = string.sub(records, #records - keep + 1) end
  end
end

-- Writes state and records; the key lives until absence means the same as
-- its content, plus the slack (docs/algorithms.md step 7).
local function store(state, state_end)
  local last = state_end
  if #records > 0 then
    local newest = struct.unpack('d', records, #records - RECORD + 33) + dedup_ttl
    if newest > last then last = newest end
  end
  local lifetime = last - now + slack
  if lifetime < 1 then lifetime = 1 end
  redis.call('SET', key, TAG .. state .. records, 'PX', lifetime)
end
