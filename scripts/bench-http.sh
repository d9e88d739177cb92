#!/usr/bin/env bash
# The whole HTTP edge under wrk: the same `ca-skeleton serve` with the rate
# limiter disabled, on the memory provider and on a local redis-server, side
# by side in one run. Usage: scripts/bench-http.sh [path/to/ca-skeleton]
# Needs wrk and redis-server; uses ports 18080 and 6391 (never 6379).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ca-skeleton}
duration=${DURATION:-10s}
connections=${CONNECTIONS:-32}
rounds=${ROUNDS:-3}

redis-server --port 6391 --save "" --appendonly no --daemonize yes --logfile /dev/null >/dev/null
trap 'redis-cli -p 6391 shutdown nosave >/dev/null 2>&1 || true' EXIT

run() { # run <provider>
    CA_SKELETON_SERVER__LISTEN=127.0.0.1:18080 \
    CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER="$1" \
        "$bin" --config config/bench.toml serve >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 50); do curl -sf http://127.0.0.1:18080/healthz >/dev/null && break; sleep 0.1; done
    local rps
    # Non-2xx must stay 0: a 429 or 503 would measure the refusal path.
    rps=$(wrk -t1 -c"$connections" -d"$duration" -s scripts/bench-http.lua --latency \
        http://127.0.0.1:18080 | awk '/Requests\/sec/ {rps=$2} / 50%/ {p50=$2} / 99%/ {p99=$2}
        /Non-2xx/ {bad=$5} END {print rps, p50, p99, bad + 0}')
    kill -TERM "$pid"; wait "$pid" || true
    echo "$1 $rps"
}

echo "provider requests_per_sec p50 p99 non_2xx"
for round in $(seq "$rounds"); do
    for provider in disabled memory redis; do run "$provider"; done
done
