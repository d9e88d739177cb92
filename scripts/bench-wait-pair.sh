#!/usr/bin/env bash
# `ca-skeleton bench` on a standalone master and one replica, with and
# without replica-acknowledged charges (`wait-replicas`), side by side in
# each of ROUNDS rounds; then with the replica frozen (SIGSTOP), so every
# charge's WAIT runs out, at the master's default hz and at hz 100. redis-server on CPU 0, the client on CPU 1.
# Usage: scripts/bench-wait-pair.sh [path/to/ca-skeleton]
# Needs redis-server, redis-cli and taskset; uses ports 7431 and 7432 (never
# 6379). Prints one JSON line per run, prefixed by its settings.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ca-skeleton}
duration=${DURATION:-10s}
rounds=${ROUNDS:-3}
# The redis.wait-connections values of the WAIT rows, each round.
pools=${POOLS:-8}
master=7431
replica=7432
dir=$(mktemp -d)

cleanup() {
    # A frozen replica would never act on the shutdown.
    [ -f "$dir/replica.pid" ] && kill -CONT "$(cat "$dir/replica.pid")" 2>/dev/null || true
    for port in "$master" "$replica"; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

start() { # port [args...]
    local port=$1
    shift
    taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$dir" --dbfilename "$port.rdb" --daemonize yes --logfile "$dir/$port.log" \
        --pidfile "$dir/$port.pid" "$@"
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
}
start "$master"
start "$replica" --replicaof 127.0.0.1 "$master"
until redis-cli -p "$replica" info replication | grep -q master_link_status:up; do sleep 0.1; done
cp "$dir/$replica.pid" "$dir/replica.pid"

bench() { # wait-replicas concurrency replica [wait-connections]
    local pool=${4:-8}
    printf 'wait-replicas=%s wait-connections=%s concurrency=%s replica=%s ' "$1" "$pool" "$2" "$3"
    CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER=redis \
    CA_SKELETON_REDIS__URLS="redis://127.0.0.1:$master" \
    CA_SKELETON_REDIS__WAIT_REPLICAS="$1" \
    CA_SKELETON_REDIS__WAIT_CONNECTIONS="$pool" \
        taskset -c 1 "$bin" --config config/bench.toml bench --policy fixed \
        --concurrency "$2" --subjects 10000 --duration "$duration" 2>/dev/null
}
for round in $(seq "$rounds"); do
    echo "# round $round"
    bench 0 64 up
    for pool in $pools; do bench 1 64 up "$pool"; done
done
# A master whose every client is blocked in WAIT ends a timed-out WAIT at
# its next cron tick: `hz` times a second (default 10).
kill -STOP "$(cat "$dir/replica.pid")"
for hz in 10 100; do
    redis-cli -p "$master" config set hz "$hz" >/dev/null
    for concurrency in 8 64; do bench 1 "$concurrency" "frozen(hz=$hz)"; done
done
kill -CONT "$(cat "$dir/replica.pid")"
