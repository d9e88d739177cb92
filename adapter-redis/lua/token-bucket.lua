-- Token bucket (docs/algorithms.md): state = mark, tokens, updated_at.
-- The first byte tags the algorithm, so state written under another
-- algorithm (a policy changed it without a new revision) is refused, not misread.
local TAG = 'B'
local HEADER = 25
-- #include prelude.lua

local capacity = tonumber(ARGV[8])
local refill = tonumber(ARGV[9])
local period = tonumber(ARGV[10])
local tokens, updated_at = capacity, now
if header then
  tokens, updated_at = struct.unpack('dd', header, 10)
  -- Whole periods only: the partial period is kept in updated_at.
  local periods = math.floor((now - updated_at) / period)
  if periods > 0 then
    tokens = math.min(capacity, tokens + periods * refill)
    updated_at = updated_at + periods * period
  end
end
if tokens >= capacity then
  -- A full bucket restarts its refill clock.
  tokens = capacity
  updated_at = now
end
local allowed = tokens >= cost
local retry_after = 0
if allowed then
  tokens = tokens - cost
else
  retry_after = updated_at + math.ceil((cost - tokens) / refill) * period - now
end
local reset_after = 0
if tokens < capacity then
  reset_after = updated_at + math.ceil((capacity - tokens) / refill) * period - now
end
if allowed then remember(tokens, reset_after) end
-- A denial writes the state too (mark and lifetime included).
store(struct.pack('ddd', now, tokens, updated_at), now + reset_after)
if allowed then
  return {'allowed', tokens, reset_after, 0, 0}
end
return {'denied', tokens, reset_after, retry_after, 0}
