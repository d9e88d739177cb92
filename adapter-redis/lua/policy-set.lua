-- Policy set (docs/algorithms.md "Policy sets"): one request against every
-- key of its set, atomically, in one EVALSHA. Caller time comes in ARGV
-- and every decision is made at it; Redis's TIME is read only to judge
-- which caller clock is wrong (prelude.lua `redis_now`). Numbers in ARGV
-- are decimal integers.
--
-- KEYS: the set's n counter keys in the set's order (1 to 8), all under
-- one hash tag; a key whose policy has dedupe on holds its records too
-- (prelude.lua); the key of a policy that holds leases is its lease set
-- (its algorithm's Lua file).
-- ARGV[1] caller time (epoch ms), ARGV[2] cost, ARGV[3] evaluation id
-- (16 bytes); then one block per key, in KEYS order:
--   +0 kind: the algorithm's tag (`RateAlgorithm::TAG`, an upper-case
--      letter), in lower case for a shadow policy
--   +1 maximum clock regression (ms)   +2 TTL slack = max(grace, regression) (ms)
--   +3 dedupe TTL (ms)                 +4 dedupe record capacity (0 = off)
--   +5.. the algorithm's arguments (`RateAlgorithm::arguments`, as many
--      as its `Lua::arity`), which its Lua function takes after
--      (raw, t, charge)
-- Reply, a flat array led by the set's status:
--   {'allowed' | 'denied', then per key: answer (0 denied, 1 allowed,
--    2 replayed), remaining, reset_after (ms), retry_after (ms)}
--   {'clock_unsafe', the largest lag beyond a key's bound (ms)}
--   {'corrupt', the 1-based index of the key}: state of another algorithm,
--    or a value of a shape no script writes. Nothing is written.
-- #include prelude.lua

-- What this driver creates is created on every call (Redis caches the
-- compiled chunk, not its tables, closures or conversions), so it keeps
-- that to a minimum (measured: docs/benchmarks.md). Numbers in ARGV are
-- read by arithmetic coercion (`ARGV[i] + 0`): the same conversion as
-- tonumber, without a C call that converts the string twice.
-- The globals the loops use, as locals: a local is a register, a global a
-- table lookup on every use.
local ARGV, KEYS, redis, struct, byte = ARGV, KEYS, redis, struct, string.byte
-- The reply and the scratch table are sized for a set of two (the
-- common burst + sustained pair): growing a table key by key rehashes it
-- at every power of two. Their nils are free slots; the reply ends at its
-- first nil, so a set of one sends only its own answers, and a larger set
-- grows them.
local reply = {'allowed', nil, nil, nil, nil, nil, nil, nil, nil}
-- Key k's scratch is SLOTS slots from s = SLOTS * k - (SLOTS - 1), at these
-- offsets: BLOCK the start of its ARGV block, TIME its effective time, RAW
-- its value (false when absent), HEADER its header length, CAPACITY its
-- dedupe record capacity (0 = off), STATE the state a run wants written
-- (nil for none) and STATE_END that state's end; then this evaluation's
-- record as read with the state: RECORD the packed record, replaced by a
-- live record's remaining (nil for none), RECORD_RESET that record's
-- reset_after, STALE the seq of an expired one (nil for none); HASHED
-- whether the key is a hash (prelude.lua `load`); KIND its kind
-- byte, read once; MARK its mark as kept (nil when absent or set aside:
-- prelude.lua `unreachable`); last, ASIDE, for a lease key whose mark was
-- set aside, the latest expiry a taker on Redis's time could have given
-- (the leases beyond it are swept at the write).
local SLOTS = 14
local BLOCK, TIME, RAW, HEADER, CAPACITY, STATE, STATE_END, RECORD, RECORD_RESET, STALE, HASHED,
  KIND, MARK, ASIDE = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13
local scratch = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}

-- The set's size, and where each key's ARGV block starts: five bounds,
-- then the algorithm's arguments (`scripts.rs` writes the width of each
-- algorithm's here).
local n, at = 0, 4
while ARGV[at] do
  n = n + 1
  local s, kind = SLOTS * n - (SLOTS - 1), byte(ARGV[at])
  scratch[s + BLOCK], scratch[s + KIND] = at, kind
-- #widths
end

-- Steps 2 and 3, with step 5 folded in: load every key (the bound holds
-- on each, and inside it a key's time never runs backwards) and run its
-- algorithm charging right away. The run only computes: whatever a later
-- step decides (clock_unsafe, replay, corrupt) discards it, and nothing is
-- written before step 7. Shadow policies never decide admission.
local beyond, replay, failed, admitted = nil, false, nil, true
-- Each algorithm is included where the first key of its is read, so its
-- closures are created only by a set that uses it: `scripts.rs` writes,
-- for each registered algorithm, its `<function>_run` local and its
-- branch (its file, then the binding), and for the lease algorithm the
-- lease functions its file defines too (lease_read, lease_store,
-- lease_held_on_time).
-- #runs
local lease_read_run, lease_store_run, lease_held_on_time_run = nil, nil, nil
for k = 1, n do
  local s = SLOTS * k - (SLOTS - 1)
  local b, tag = scratch[s + BLOCK], scratch[s + KIND]
  local enforced = tag < SHADOW_KINDS
  if not enforced then tag = tag - SHADOW end
-- #load
  local t = now
  local capacity = ARGV[b + 4] + 0
  local raw, record, hashed, header, stored, kept = nil, nil, false, 0, tag, nil
  if tag == LEASES then
    -- A lease key: RAW holds its live leases, HEADER whether it has a
    -- mark (so an expiry), RECORD and RECORD_RESET the answer of this
    -- evaluation's live lease (a replay; HASHED stays false, so step 4's
    -- lookups leave it as it is).
    local mark, lease, held, corrupt = lease_read_run(KEYS[k])
    if corrupt then return {'corrupt', k} end
    raw, header, kept = held, mark ~= nil, mark
    if mark then
      if mark > now then
        local by = mark - now - ARGV[b + 1]
        if by > 0 and unreachable(mark, ARGV[b + 1] + 0) then
          -- Set aside: only the leases a taker on time could hold count.
          raw, scratch[s + ASIDE] = lease_held_on_time_run(KEYS[k], ARGV[b + 6] + 0,
            ARGV[b + 1] + 0)
          kept = nil
        else
          if by > 0 and (not beyond or by > beyond) then beyond = by end
          t = mark
        end
      end
      if lease and lease > t then
        record = math.max(0, ARGV[b + 5] - raw)
        scratch[s + RECORD_RESET] = 0
        replay = true
      end
    end
  else
    raw, record, hashed = load(KEYS[k], capacity)
  end
  if raw and tag ~= LEASES then
    header, stored = header_of(raw)
    if not header then return {'corrupt', k} end
    local mark = struct.unpack('d', raw, 2)
    kept = mark
    -- The bound is never negative, so only a mark ahead of the caller can
    -- break it: the usual key (mark behind) never converts it.
    if mark > now then
      local by = mark - now - ARGV[b + 1]
      if by > 0 and unreachable(mark, ARGV[b + 1] + 0) then
        -- A mark no clock on Redis's time reaches: the state is set aside
        -- and the key decided afresh at this caller's time (records stay).
        raw, header, stored, kept = false, 0, tag, nil
      else
        if by > 0 and (not beyond or by > beyond) then beyond = by end
        t = mark
      end
    end
  end
  scratch[s + TIME], scratch[s + RAW], scratch[s + HEADER], scratch[s + CAPACITY] =
    t, raw, header, capacity
  scratch[s + RECORD], scratch[s + HASHED], scratch[s + MARK] = record, hashed, kept
  -- A key of another algorithm (or of an unknown kind) fails the set at
  -- its run, the first in key order; `spared` below tells which way.
  if stored ~= tag then
    failed = failed or k
  elseif not failed then
    local allowed, remaining, reset_after, retry_after, state, state_end
    -- Each algorithm's run, charging (`scripts.rs` writes the branches).
-- #charge
    if not failed then
      local r = 4 * k - 2
      reply[r], reply[r + 1], reply[r + 2], reply[r + 3] =
        allowed and 1 or 0, remaining, reset_after, retry_after
      scratch[s + STATE], scratch[s + STATE_END] = state, state_end
      if not allowed and enforced then admitted = false end
    end
  end
end
if beyond then return {'clock_unsafe', beyond} end

-- Step 4's lookups, once the clock bound holds everywhere: each record
-- came with its key's state; a live one replays. (A lease key's replay
-- was found with its leases.)
for k = 1, n do
  local s = SLOTS * k - (SLOTS - 1)
  local record = scratch[s + RECORD]
  if record and scratch[s + HASHED] then
    local remaining, reset_after, written_at, seq = struct.unpack('dddd', record)
    if written_at + ARGV[scratch[s + BLOCK] + 3] > scratch[s + TIME] then
      scratch[s + RECORD], scratch[s + RECORD_RESET] = remaining, reset_after
      replay = true
    else
      scratch[s + RECORD], scratch[s + STALE] = nil, seq
    end
  end
end

-- Runs a key's algorithm spared (steps 4 and 6), given its ARGV block,
-- kind byte, value (a lease key's: its live leases) and effective time
-- from its scratch (passed in, so the closure captures no offsets); nil
-- when the key holds another algorithm's state.
-- Only a replay, a failure or a refusal needs it, so an admitted set never
-- creates this closure.
local spared = nil
if replay or failed or not admitted then
  spared = function(b, tag, raw, t)
    if tag >= SHADOW_KINDS then tag = tag - SHADOW end
    -- A lease key's value is its live leases, no state header: its run
    -- first, then every other algorithm's (`scripts.rs` writes them).
-- #spare
    return error('unknown algorithm kind')
  end
end

-- Step 4: a live record of this evaluation in any key replays the whole
-- set: that key answers its record, every other key its spared run.
-- Nothing is written anywhere.
if replay then
  for k = 1, n do
    local s = SLOTS * k - (SLOTS - 1)
    local r = 4 * k - 2
    if scratch[s + RECORD] then
      reply[r], reply[r + 1], reply[r + 2], reply[r + 3] =
        2, scratch[s + RECORD], scratch[s + RECORD_RESET], 0
    else
      local allowed, remaining, reset_after, retry_after =
        spared(scratch[s + BLOCK], scratch[s + KIND], scratch[s + RAW], scratch[s + TIME])
      if allowed == nil then return {'corrupt', k} end
      reply[r] = allowed and 1 or 0
      reply[r + 1], reply[r + 2], reply[r + 3] = remaining, reset_after, retry_after
    end
  end
  return reply
end

-- Step 5's failure: the first key whose run could not happen.
if failed then
  local s = SLOTS * failed - (SLOTS - 1)
  if spared(scratch[s + BLOCK], scratch[s + KIND], scratch[s + RAW], scratch[s + TIME]) == nil then
    return {'corrupt', failed}
  end
end

if not admitted then
  -- Step 6: nothing is charged anywhere: every key that allowed runs
  -- again spared.
  reply[1] = 'denied'
  for k = 1, n do
    local r = 4 * k - 2
    if reply[r] == 1 then
      local s = SLOTS * k - (SLOTS - 1)
      local _, remaining, reset_after, retry_after, state, state_end =
        spared(scratch[s + BLOCK], scratch[s + KIND], scratch[s + RAW], scratch[s + TIME])
      reply[r + 1], reply[r + 2], reply[r + 3] = remaining, reset_after, retry_after
      scratch[s + STATE], scratch[s + STATE_END] = state, state_end
    end
  end
end

-- Before step 7: a write that would move a key's mark beyond Redis's
-- clock, from a caller whose clock ran ahead of it, is refused (prelude.lua
-- `ahead_of_redis`) and nothing is written anywhere.
for k = 1, n do
  local s = SLOTS * k - (SLOTS - 1)
  if scratch[s + STATE] and scratch[s + MARK] then
    local by = ahead_of_redis(scratch[s + MARK], ARGV[scratch[s + BLOCK] + 1] + 0)
    if by then return {'clock_unsafe', by} end
  end
end

-- Step 7: write each key whose run wrote state; a charged key of an
-- admitted set keeps this evaluation's record.
for k = 1, n do
  local s = SLOTS * k - (SLOTS - 1)
  local state = scratch[s + STATE]
  if state then
    local b = scratch[s + BLOCK]
    local r = 4 * k - 2
    local capacity = scratch[s + CAPACITY]
    local kind = scratch[s + KIND]
    if kind == LEASES or kind == LEASES + SHADOW then
      -- Only a charge writes a lease key: its state is the new lease's
      -- expiry.
      lease_store_run(KEYS[k], scratch[s + TIME], state, ARGV[b + 2] + 0, scratch[s + HEADER],
        scratch[s + ASIDE])
    elseif capacity > 0 then
      store(KEYS[k], state, scratch[s + STATE_END], scratch[s + RAW], scratch[s + HEADER],
        scratch[s + HASHED], scratch[s + TIME], ARGV[b + 2] + 0, ARGV[b + 3] + 0, capacity,
        admitted and reply[r] == 1, reply[r + 1], reply[r + 2], scratch[s + STALE])
    else
      -- Dedupe off: `store` without records, inline (a call with its
      -- eleven arguments costs more than these three lines).
      local lifetime = scratch[s + STATE_END] + ARGV[b + 2] - now
      if lifetime < 1 then lifetime = 1 end
      redis.call('SET', KEYS[k], state, 'PX', lifetime)
    end
  end
end
return reply
