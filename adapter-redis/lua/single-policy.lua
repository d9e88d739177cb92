-- A set of one policy: the fast path of `policy-set.lua`, with the same
-- ARGV and reply layout (see there) for exactly one key, and the same
-- answers. `scripts.rs` builds one per algorithm: at the `#algorithm`
-- line it puts that algorithm's file, then a line binding `algorithm` to
-- the function the file defines, so the script creates no closure, table
-- or loop it does not use (measured: docs/benchmarks.md). Numbers in ARGV
-- are read by arithmetic coercion, as in `policy-set.lua`; the third and
-- fourth of an algorithm's arguments (`Arguments::MAX`) by tonumber, which
-- gives an algorithm nil for one it is not sent.
-- #include prelude.lua
-- #algorithm

local key = KEYS[1]
local t = now
local capacity = ARGV[8] + 0
local raw, record, hashed = load(key, capacity)
local header, stored, mark = 0, nil, nil
local tag = string.byte(ARGV[4])
if tag >= SHADOW_KINDS then tag = tag - SHADOW end
if raw then
  header, stored = header_of(raw)
  if not header then return {'corrupt', 1} end
  mark = struct.unpack('d', raw, 2)
  local by = mark - now - ARGV[5]
  if by > 0 then
    if not unreachable(mark, ARGV[5] + 0) then return {'clock_unsafe', by} end
    -- A mark no clock on Redis's time reaches: its state is set aside and
    -- the key decided afresh at this caller's time (its records stay).
    raw, header, stored, mark = false, 0, tag, nil
  elseif mark > t then
    t = mark
  end
end
local ttl = ARGV[7] + 0
-- This evaluation's record, read with the state: a live one replays.
local stale = nil
if record then
  local remaining, reset_after, written_at, seq = struct.unpack('dddd', record)
  if written_at + ttl > t then return {'allowed', 2, remaining, reset_after, 0} end
  stale = seq
end
if raw and stored ~= tag then return {'corrupt', 1} end
local allowed, remaining, reset_after, retry_after, state, state_end =
  algorithm(raw, t, true, ARGV[9] + 0, ARGV[10] + 0, tonumber(ARGV[11]),
    tonumber(ARGV[12]))
-- A shadow policy alone never blocks; its denial charges nothing.
local admitted = allowed or tag ~= string.byte(ARGV[4])
if state and mark then
  local by = ahead_of_redis(mark, ARGV[5] + 0)
  if by then return {'clock_unsafe', by} end
end
if state then
  store(key, state, state_end, raw, header, hashed, t, ARGV[6] + 0, ttl, capacity, allowed,
    remaining, reset_after, stale)
end
if admitted then
  return {'allowed', allowed and 1 or 0, remaining, reset_after, retry_after}
end
return {'denied', 0, remaining, reset_after, retry_after}
