-- A set of one policy that holds leases: the fast path of `policy-set.lua`
-- for a lease key, with the same ARGV and reply layout (see there) for
-- exactly one key, and the same answers. At the `#algorithm` line
-- `scripts.rs` puts the lease algorithm's file (which defines lease_read,
-- lease_held_on_time and lease_store too), binding `algorithm` to its
-- function. Its record capacity
-- (ARGV[8]) is always 0: a lease id is its own dedupe.
-- #include prelude.lua
-- #algorithm

local key = KEYS[1]
local mark, lease, held, corrupt = lease_read(key)
if corrupt then return {'corrupt', 1} end
local t = now
local aside = nil
if mark then
  local by = mark - now - ARGV[5]
  if by > 0 then
    if not unreachable(mark, ARGV[5] + 0) then return {'clock_unsafe', by} end
    -- Set aside: only the leases a taker on time could hold count.
    held, aside = lease_held_on_time(key, ARGV[10] + 0, ARGV[5] + 0)
  elseif mark > t then
    t = mark
  end
end
local max_in_flight = ARGV[9] + 0
-- This evaluation's live lease: the same lease again, nothing added.
if lease and lease > t then
  return {'allowed', 2, math.max(0, max_in_flight - held), 0, 0}
end
local allowed, remaining, reset_after, retry_after, expires_at =
  algorithm(held, t, true, max_in_flight, ARGV[10] + 0, ARGV[11] + 0, ARGV[5] + 0)
if expires_at and mark and not aside then
  local by = ahead_of_redis(mark, ARGV[5] + 0)
  if by then return {'clock_unsafe', by} end
end
if expires_at then lease_store(key, t, expires_at, ARGV[6] + 0, mark ~= nil, aside) end
-- A shadow policy alone never blocks; its refusal takes no lease.
if allowed or string.byte(ARGV[4]) >= SHADOW_KINDS then
  return {'allowed', allowed and 1 or 0, remaining, reset_after, retry_after}
end
return {'denied', 0, remaining, reset_after, retry_after}
