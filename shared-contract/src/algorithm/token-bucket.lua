-- Token bucket (docs/algorithms.md) over one key's state: mark, tokens,
-- updated_at. Included by `policy-set.lua` after the prelude; arguments
-- and results as in `fixed-window.lua`, except that every run writes its
-- state: a denial or a spared run writes the refill (mark and lifetime
-- included) and keeps its tokens. A settle's 'force' may leave tokens
-- below zero (a debt the refill pays first; `remaining` says 0), its
-- refund (a number) puts them back up to the capacity, whenever the
-- reservation was.
local function token_bucket(raw, t, charge, capacity, refill, period)
  local tokens, updated_at = capacity, t
  if raw then
    tokens, updated_at = struct.unpack('dd', raw, 10)
    -- Whole periods only: the partial period is kept in updated_at.
    local periods = math.floor((t - updated_at) / period)
    if periods > 0 then
      tokens = math.min(capacity, tokens + periods * refill)
      updated_at = updated_at + periods * period
    end
  end
  if tokens >= capacity then
    -- A full bucket restarts its refill clock.
    tokens = capacity
    updated_at = t
  end
  local allowed = tokens >= cost
  local retry_after = 0
  if charge == true then
    if allowed then tokens = tokens - cost end
  elseif charge then
    allowed = true
    if charge == 'force' then
      tokens = tokens - cost
    else
      tokens = math.min(capacity, tokens + cost)
    end
  end
  if not allowed then
    retry_after = math.max(1, updated_at + math.ceil((cost - tokens) / refill) * period - t)
  end
  local reset_after = 0
  if tokens < capacity then
    reset_after = updated_at + math.ceil((capacity - tokens) / refill) * period - t
  end
  local remaining = tokens
  if remaining < 0 then remaining = 0 end
  return allowed, remaining, reset_after, retry_after,
    struct.pack('Bddd', TOKEN_BUCKET, t, tokens, updated_at), t + reset_after
end
