#!/usr/bin/env bash
# Redis's own counters per script call of the single-key fixed-window script
# at its 256-record cap (a fresh id per call, caller time fixed), for a
# commit's scripts and this tree's alternately (docs/benchmarks.md, "How
# to run"): how many of each command a call
# sends and each command's usec_per_call, from INFO commandstats. Command
# counts do not depend on the machine's load; the times do.
# Starts its own redis-server on a free loopback port (never 6379).
#
# Usage: scripts/bench-dedupe-expiry.sh [commit] [rounds]   Env: REQUESTS (200000)
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:-8f66ea8}
rounds=${2:-3}
requests=${REQUESTS:-200000}
. scripts/bench-common.sh
start_bench_redis
mkdir "$work/before"
for file in prelude.lua single-policy.lua fixed-window.lua; do
    git show "$before:adapter-redis/lua/$file" >"$work/before/$file"
done
compose "$work/before" single-policy.lua fixed-window.lua fixed_window >"$work/before.lua"
# This tree's, as scripts.rs composes it from the algorithm registry.
composed_scripts "$work" this
one='bench:{v1:cap}:fixed:1'
for round in $(seq "$rounds"); do
    for layout in before after; do
        script=$work/before.lua
        [ "$layout" = after ] && script=$work/thisF.lua
        sha=$(rcli SCRIPT LOAD "$(cat "$script")")
        rcli FLUSHALL >/dev/null
        redis-benchmark -p "$port" -c 1 -n 256 -r 100000000 -q \
            EVALSHA "$sha" 1 "$one" $now 1 $rid $on >/dev/null
        rcli CONFIG RESETSTAT >/dev/null
        redis-benchmark -p "$port" -c 64 -P 16 -n "$requests" -r 100000000 --csv \
            EVALSHA "$sha" 1 "$one" $now 1 $rid $on >/dev/null
        rcli INFO commandstats | tr -d '\r' | awk -F'[:=,]' -v layout="$layout" -v round="$round" \
            '/^cmdstat_(evalsha|hmget|hset|hdel|pexpire):/ {
                 sub("cmdstat_", "", $1); printf "%s %s %s calls=%s usec_per_call=%s\n", round, layout, $1, $3, $7}'
    done
done
