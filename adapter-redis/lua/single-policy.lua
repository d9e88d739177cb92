-- A set of one policy: the fast path of `policy-set.lua`, with the same
-- ARGV and reply layout (see there) for exactly one key, and the same
-- answers. `scripts.rs` builds one per algorithm: it puts the algorithm's
-- file at its `algorithm.lua` include line, followed by a line binding
-- `algorithm` to its function, so the script creates no closure, table or
-- loop it does not use (measured: docs/benchmarks.md).
-- #include prelude.lua
-- #include algorithm.lua

local key, dkey = KEYS[1], KEYS[2]
local t = now
local raw = redis.call('GET', key)
local header = 0
if raw then
  local stored = string.byte(raw, 1)
  header = FIXED_WINDOW_HEADER
  if stored == SLIDING_COUNTER then
    header = SLIDING_COUNTER_HEADER
  elseif stored == TOKEN_BUCKET then
    header = TOKEN_BUCKET_HEADER
  elseif stored ~= FIXED_WINDOW then
    return {'corrupt', 1}
  end
  if #raw ~= header and #raw ~= header + TRAILER then return {'corrupt', 1} end
  local mark = struct.unpack('d', raw, 2)
  local by = mark - now - tonumber(ARGV[5])
  if by > 0 then return {'clock_unsafe', by} end
  if mark > t then t = mark end
end
local tag = string.byte(ARGV[4])
if tag >= SHADOW_KINDS then tag = tag - SHADOW end
local capacity = tonumber(ARGV[8])
local ttl = tonumber(ARGV[7])
local replayed, replayed_reset, seq, evict = lookup(dkey, raw, header, t, ttl, capacity)
if replayed then return {'allowed', 2, replayed, replayed_reset, 0} end
if raw and string.byte(raw, 1) ~= tag then return {'corrupt', 1} end
local allowed, remaining, reset_after, retry_after, state, state_end =
  algorithm(raw, t, true, tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]))
-- A shadow policy alone never blocks; its denial charges nothing.
local admitted = allowed or tag ~= string.byte(ARGV[4])
if state then
  store(key, dkey, state, state_end, raw, header, t, tonumber(ARGV[6]), ttl, capacity, allowed,
    remaining, reset_after, seq, evict)
end
if admitted then
  return {'allowed', allowed and 1 or 0, remaining, reset_after, retry_after}
end
return {'denied', 0, remaining, reset_after, retry_after}
