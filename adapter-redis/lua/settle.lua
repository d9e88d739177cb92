-- Settle (docs/algorithms.md "Settling usage"): what a request used,
-- settled against what it reserved, over every key of its set, atomically,
-- in one EVALSHA; the same answer `shared_contract::settle_set` gives.
-- Caller time comes in ARGV, as for an evaluation (policy-set.lua), and
-- Redis's TIME only judges which caller clock is wrong.
--
-- KEYS: the set's keys, as an evaluation of the reservation sends them.
-- ARGV[1] caller time (epoch ms), ARGV[2] the reservation's cost c,
-- ARGV[3] the settle's own id (16 bytes, the id its records are kept
-- under), ARGV[4] the reservation's evaluation id (16 bytes; empty for an
-- id minted once, which no record is looked up or kept for), ARGV[5] the
-- units used u; then one block per key, in KEYS order, as policy-set.lua's.
-- Reply:
--   {'applied', 1}: each key holding a live record of the reservation
--    (every key but a concurrency one for c = 0) took the difference and
--    keeps the settle's record; {'applied', 0}: nothing to change (u = c,
--    or c = 0 over concurrency keys alone), nothing written
--   {'repeated'}: a live record of the settle in some key; nothing written
--   {'unknown'}: no key holds a live record of the reservation; nothing
--    written
--   {'clock_unsafe', the largest lag beyond a key's bound (ms)}
--   {'corrupt', the 1-based index of the key}: a value of a shape no
--    script writes, or a key to settle holding another algorithm's state.
--    Nothing is written.
-- Concurrency keys take no settle; only their marks bound the clock.
-- #include prelude.lua

local ARGV, KEYS, byte = ARGV, KEYS, string.byte
local reservation = ARGV[4]
local records = reservation ~= ''
if not records then reservation = nil end
local reserved, used = cost, ARGV[5] + 0
-- Every key that takes the settle takes the same units: the excess
-- charged, or the rest given back. The algorithms read them as `cost`.
local refund = used < reserved
if refund then
  cost = reserved - used
else
  cost = used - reserved
end

-- Where each key's ARGV block starts, and its kind byte.
local blocks, kinds = {}, {}
local n, at = 0, 6
while ARGV[at] do
  n = n + 1
  local kind = byte(ARGV[at])
  blocks[n], kinds[n] = at, kind
-- #widths
end

-- Load every key: the clock bound holds on each (a mark set aside as in an
-- evaluation), a live record of the settle repeats it, and a key takes
-- the settle at the time of its live record of the reservation.
-- #runs
local lease_read_run, lease_store_run, lease_held_on_time_run = nil, nil, nil
local beyond, repeated, settles = nil, false, false
-- Per key: effective time, value, header length, whether a hash, kept
-- mark, the settle's expired record's seq, the reservation's time.
local times, raws, headers, hashes, marks, stales, takes = {}, {}, {}, {}, {}, {}, {}
for k = 1, n do
  local b, tag = blocks[k], kinds[k]
  if tag >= SHADOW_KINDS then tag = tag - SHADOW end
-- #load
  local regression = ARGV[b + 1] + 0
  if tag == LEASES then
    -- A key of another type holds no lease and no mark: it bounds nothing.
    local mark = lease_read_run(KEYS[k])
    if mark and mark - now > regression and not unreachable(mark, regression) then
      local by = mark - now - regression
      if not beyond or by > beyond then beyond = by end
    end
  else
    local t = now
    local raw, own, hashed, held = load(KEYS[k], ARGV[b + 4] + 0, reservation)
    local header, mark = 0, nil
    if raw then
      local stored
      header, stored = header_of(raw)
      if not header then return {'corrupt', k} end
      if stored ~= tag then header = -1 end
      mark = struct.unpack('d', raw, 2)
      if mark > now then
        local by = mark - now - regression
        if by > 0 and unreachable(mark, regression) then
          -- A mark no clock on Redis's time reaches: the state is set
          -- aside and the key settled afresh at this caller's time.
          raw, header, mark = false, 0, nil
        else
          if by > 0 and (not beyond or by > beyond) then beyond = by end
          t = mark
        end
      end
    end
    local ttl = ARGV[b + 3] + 0
    if records and own then
      local _, _, written_at, seq = struct.unpack('dddd', own)
      if written_at + ttl > t then repeated = true else stales[k] = seq end
    end
    local take = nil
    if reserved == 0 then
      take = t
    elseif records and held then
      local _, _, written_at = struct.unpack('dddd', held)
      if written_at + ttl > t then take = written_at end
    end
    if take then settles = true end
    times[k], raws[k], headers[k], hashes[k], marks[k], takes[k] = t, raw, header, hashed, mark, take
  end
end
if beyond then return {'clock_unsafe', beyond} end
if repeated then return {'repeated'} end
if not settles then
  if reserved == 0 then return {'applied', 0} end
  return {'unknown'}
end

-- Every run first, so a key of another algorithm writes nothing anywhere.
local states, ends, remainings, resets = {}, {}, {}, {}
for k = 1, n do
  if takes[k] then
    -- The header is -1 for a state of another algorithm.
    if headers[k] < 0 then return {'corrupt', k} end
    local b, tag, raw, t = blocks[k], kinds[k], raws[k], times[k]
    if tag >= SHADOW_KINDS then tag = tag - SHADOW end
    -- A refund names the budget by the reservation's time.
    local charge = 'force'
    if refund then charge = takes[k] end
    local remaining, reset_after, state, state_end, _
    -- Each algorithm's settle run (`scripts.rs` writes the branches).
-- #settle
    states[k], ends[k], remainings[k], resets[k] = state, state_end, remaining, reset_after
  end
end

-- A write that would move a key's mark beyond Redis's clock, from a
-- caller whose clock ran ahead of it, is refused and nothing is written.
for k = 1, n do
  if states[k] and marks[k] then
    local by = ahead_of_redis(marks[k], ARGV[blocks[k] + 1] + 0)
    if by then return {'clock_unsafe', by} end
  end
end

-- Each key settled keeps the settle's record (unless the ids are minted
-- once), so a retry after a lost reply repeats it.
for k = 1, n do
  if states[k] then
    local b = blocks[k]
    store(KEYS[k], states[k], ends[k], raws[k], headers[k], hashes[k], times[k], ARGV[b + 2] + 0,
      ARGV[b + 3] + 0, ARGV[b + 4] + 0, records, remainings[k], resets[k], stales[k])
  end
end
return {'applied', 1}
