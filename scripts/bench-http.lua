-- wrk script: each request carries one of 10,000 API keys, so the edge
-- limits 10,000 distinct subjects (the same spread as `ca-skeleton bench`).
math.randomseed(42)
request = function()
  return wrk.format("GET", "/api/hello", { ["x-api-key"] = "bench-key-" .. math.random(1, 10000) })
end
