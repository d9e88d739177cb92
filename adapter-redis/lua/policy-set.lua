-- Policy set (docs/algorithms.md "Policy sets"): one request against every
-- key of its set, atomically, in one EVALSHA. Scripts never call TIME:
-- caller time comes in ARGV. Numbers in ARGV are decimal integers.
--
-- KEYS: the set's keys in the set's order (1 to 8), all under one hash tag.
-- ARGV[1] caller time (epoch ms), ARGV[2] cost, ARGV[3] evaluation id
-- (16 bytes); then one block per key, in KEYS order:
--   +0 kind: the algorithm's tag, 'F' fixed window, 'S' sliding counter,
--      'B' token bucket; in lower case ('f', 's', 'b') for a shadow policy
--   +1 maximum clock regression (ms)   +2 TTL slack = max(grace, regression) (ms)
--   +3 dedupe TTL (ms)                 +4 dedupe record capacity (0 = off)
--   +5.. the algorithm: F, S: limit, window (ms); B: capacity, refill
--      tokens, refill period (ms)
-- Reply, a flat array led by the set's status:
--   {'allowed' | 'denied', then per key: answer (0 denied, 1 allowed,
--    2 replayed), remaining, reset_after (ms), retry_after (ms)}
--   {'clock_unsafe', the largest lag beyond a key's bound (ms)}
--   {'corrupt', the 1-based index of the key}: state of another algorithm,
--    or a value of a shape no script writes. Nothing is written.
-- #include prelude.lua
-- #include fixed-window.lua
-- #include sliding-counter.lua
-- #include token-bucket.lua

local n = #KEYS
-- Per key k, scratch[6k-5 .. 6k]: the start of its ARGV block, its
-- effective time, its value (false when absent), its records, then the
-- state a run wants written (false for none) and that state's end. One
-- table for every key keeps a set of one as cheap as a single script.
local scratch = {}

-- Step 2 and 3: load every key; the bound holds on each, and inside it a
-- key's time never runs backwards.
local beyond = nil
local block = 4
for k = 1, n do
  local s = 6 * k - 5
  local t = now
  local raw = redis.call('GET', KEYS[k])
  local records = ''
  if raw then
    local stored, header = string.byte(raw, 1), FIXED_WINDOW_HEADER
    if stored == SLIDING_COUNTER then
      header = SLIDING_COUNTER_HEADER
    elseif stored == TOKEN_BUCKET then
      header = TOKEN_BUCKET_HEADER
    elseif stored ~= FIXED_WINDOW then
      return {'corrupt', k}
    end
    if #raw < header or (#raw - header) % RECORD ~= 0 then return {'corrupt', k} end
    local mark = struct.unpack('d', raw, 2)
    local by = mark - now - tonumber(ARGV[block + 1])
    if by > 0 and (not beyond or by > beyond) then beyond = by end
    if mark > t then t = mark end
    records = string.sub(raw, header + 1)
  end
  scratch[s], scratch[s + 1], scratch[s + 2], scratch[s + 3] = block, t, raw, records
  scratch[s + 4] = false
  local kind = string.byte(ARGV[block])
  if kind == TOKEN_BUCKET or kind == TOKEN_BUCKET + SHADOW then
    block = block + 8
  else
    block = block + 7
  end
end
if beyond then return {'clock_unsafe', beyond} end

-- Runs key k's algorithm at its effective time, charging or spared; nil
-- when the key holds another algorithm's state.
local function run(k, charge)
  local s = 6 * k - 5
  local b = scratch[s]
  local tag = string.byte(ARGV[b])
  if tag >= SHADOW_KINDS then tag = tag - SHADOW end
  local raw = scratch[s + 2]
  if raw and string.byte(raw, 1) ~= tag then return nil end
  local t = scratch[s + 1]
  if tag == FIXED_WINDOW then
    return fixed_window(raw, t, charge, tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]))
  elseif tag == SLIDING_COUNTER then
    return sliding_counter(raw, t, charge, tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]))
  elseif tag == TOKEN_BUCKET then
    return token_bucket(raw, t, charge, tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]),
      tonumber(ARGV[b + 7]))
  end
  return error('unknown algorithm kind')
end

local reply = {'allowed'}

-- Step 4: a live record of this evaluation in any key replays the whole
-- set: that key answers its record, every other key its spared run.
-- Nothing is written anywhere.
local replay = false
for k = 1, n do
  local s = 6 * k - 5
  local b = scratch[s]
  if tonumber(ARGV[b + 4]) > 0
    and live_record(scratch[s + 3], scratch[s + 1], tonumber(ARGV[b + 3])) then
    replay = true
    break
  end
end
if replay then
  for k = 1, n do
    local s = 6 * k - 5
    local b = scratch[s]
    local at = nil
    if tonumber(ARGV[b + 4]) > 0 then
      at = live_record(scratch[s + 3], scratch[s + 1], tonumber(ARGV[b + 3]))
    end
    local r = 4 * k - 2
    if at then
      local remaining, reset_after = struct.unpack('dd', scratch[s + 3], at + 16)
      reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 2, remaining, reset_after, 0
    else
      local allowed, remaining, reset_after, retry_after = run(k, false)
      if allowed == nil then return {'corrupt', k} end
      reply[r] = allowed and 1 or 0
      reply[r + 1], reply[r + 2], reply[r + 3] = remaining, reset_after, retry_after
    end
  end
  return reply
end

-- Step 5: every key's algorithm, charging; step 6: the set is admitted
-- iff every enforced policy allowed. Shadow policies never decide.
local admitted = true
for k = 1, n do
  local allowed, remaining, reset_after, retry_after, state, state_end = run(k, true)
  if allowed == nil then return {'corrupt', k} end
  local r, s = 4 * k - 2, 6 * k - 5
  reply[r] = allowed and 1 or 0
  reply[r + 1], reply[r + 2], reply[r + 3] = remaining, reset_after, retry_after
  scratch[s + 4], scratch[s + 5] = state or false, state_end
  if not allowed and string.byte(ARGV[scratch[s]]) < SHADOW_KINDS then admitted = false end
end
if not admitted then
  -- Nothing is charged anywhere: every key that allowed runs again spared.
  reply[1] = 'denied'
  for k = 1, n do
    local r = 4 * k - 2
    if reply[r] == 1 then
      local _, remaining, reset_after, retry_after, state, state_end = run(k, false)
      local s = 6 * k - 5
      reply[r + 1], reply[r + 2], reply[r + 3] = remaining, reset_after, retry_after
      scratch[s + 4], scratch[s + 5] = state or false, state_end
    end
  end
end

-- Step 7: write each key whose run wrote state; a charged key of an
-- admitted set keeps this evaluation's record.
for k = 1, n do
  local s = 6 * k - 5
  local state = scratch[s + 4]
  if state then
    local b = scratch[s]
    local r = 4 * k - 2
    local tag = string.byte(ARGV[b])
    if tag >= SHADOW_KINDS then tag = tag - SHADOW end
    store(KEYS[k], tag, state, scratch[s + 5], scratch[s + 3], scratch[s + 1],
      tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]),
      admitted and reply[r] == 1, reply[r + 1], reply[r + 2])
  end
end
return reply
