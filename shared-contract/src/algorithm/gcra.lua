-- GCRA (docs/algorithms.md) over one key's state: mark, tat (the
-- theoretical arrival time, epoch microseconds). Included by
-- `policy-set.lua` after the prelude; arguments and results as in
-- `fixed-window.lua`, with the parameters `burst` and `interval` (the
-- emission interval T, whole microseconds). A denial or a spared run
-- writes nothing. A settle's 'force' adds `cost` cells to the backlog
-- past the burst; its refund (a number) takes them off what the schedule
-- has not yet paid, whenever the reservation was. Every number here is a
-- whole number below 2^53, but a double's quotient can round up to the
-- next integer, so divisions go through `gcra_div`, which corrects it.
local function gcra_div(x, y)
  local q = math.floor(x / y)
  if q * y > x then
    q = q - 1
  elseif (q + 1) * y <= x then
    q = q + 1
  end
  return q
end

-- Microseconds to milliseconds, rounded up.
local function gcra_millis(x)
  local q = gcra_div(x, 1000)
  if q * 1000 < x then q = q + 1 end
  return q
end

-- remaining and reset_after at backlog d: the cells that conform now, and
-- when the next one beyond them does (0 when all do).
local function gcra_budget(burst, interval, whole, d)
  local remaining = 0
  if whole > d then remaining = gcra_div(whole - d, interval) end
  if remaining >= burst then return burst, 0 end
  local next = d - (burst - remaining - 1) * interval
  if next < 0 then next = 0 end
  return remaining, gcra_millis(next)
end

local function gcra(raw, t, charge, burst, interval)
  local u = t * 1000
  local a = u
  if raw then
    local tat = struct.unpack('d', raw, 10)
    if tat > u then a = tat end
  end
  local d = a - u
  local whole = burst * interval
  local needed = d + cost * interval
  if needed > whole and (charge == true or not charge) then
    local remaining, reset_after = gcra_budget(burst, interval, whole, d)
    local retry_after = gcra_millis(needed - whole)
    if retry_after < 1 then retry_after = 1 end
    return false, remaining, reset_after, retry_after
  end
  if not charge then
    local remaining, reset_after = gcra_budget(burst, interval, whole, d)
    return true, remaining, reset_after, 0
  end
  if charge ~= true and charge ~= 'force' then
    needed = d - cost * interval
    if needed < 0 then needed = 0 end
  end
  local tat = u + needed
  local remaining, reset_after = gcra_budget(burst, interval, whole, needed)
  return true, remaining, reset_after, 0, struct.pack('Bdd', GCRA, t, tat), gcra_millis(tat)
end
