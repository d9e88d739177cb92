#!/usr/bin/env bash
# Redis CPU per call of three dedupe layouts side by side (docs/benchmarks.md,
# "Choices the code cites"): the single-key fixed-window script
# of commit 8f8cfad (records in `<counter key>:dedupe`), this tree's (records
# in the counter key, a hash), and this tree's with its HSET cut to the state
# field (no record written: a measurement variant, not a correct script).
# Starts its own redis-server on a free loopback port (never 6379), pins it to
# CPU 0 and redis-benchmark to CPU 1 when there are two CPUs, and prints
# "<layout> <case> <usec_per_call>" per run, the layouts alternating.
#
# Usage: scripts/bench-dedupe-layouts.sh [rounds]   Env: REQUESTS (200000)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${REQUESTS:-200000}
. scripts/bench-common.sh
start_bench_redis

mkdir "$work/old"
for file in prelude.lua single-policy.lua fixed-window.lua; do
    git show "8f8cfad:adapter-redis/lua/$file" >"$work/old/$file"
done
compose "$work/old" single-policy.lua fixed-window.lua fixed_window >"$work/old.lua"
# This tree's, as scripts.rs composes it from the algorithm registry.
composed_scripts "$work" this
cp "$work/thisF.lua" "$work/new.lua"
# The variant: the charged HSET writes the state field alone.
awk '/redis.call\(.HSET., key, .s., state,$/ {print "    redis.call(\047HSET\047, key, \047s\047, state)"; skip = 2; next}
     skip > 0 {skip--; next} {print}' "$work/new.lua" >"$work/nofields.lua"
grep -q "redis.call('HSET', key, 's', state)$" "$work/nofields.lua"
key='bench:{v1:__rand_int__}:fixed:1'
one='bench:{v1:flood}:fixed:1'
usec() { rcli INFO commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $6}'; }
# run <case> <keyspace> <fill: key or -> <EVALSHA args...>
run() {
    local case=$1 keyspace=$2 fill=$3
    shift 3
    rcli FLUSHALL >/dev/null
    if [ "$fill" != - ]; then
        redis-benchmark -p "$port" -c 1 -n 256 -r 100000000 -q \
            EVALSHA "$sha" "$keys" "$fill" ${second:+"$fill:dedupe"} $now 1 $rid $on >/dev/null
    fi
    rcli CONFIG RESETSTAT >/dev/null
    "${pin_client[@]}" redis-benchmark -p "$port" -c 64 -P 16 -n "$requests" -r "$keyspace" \
        --csv EVALSHA "$@" >/dev/null
    echo "$layout $case $(usec)"
}
for _ in $(seq "$rounds"); do
    for layout in old new nofields; do
        case $layout in
            old) keys=2 second=yes ;;
            new | nofields) keys=1 second= ;;
        esac
        sha=$(rcli SCRIPT LOAD "$(cat "$work/$layout.lua")")
        run off 1000 - "$sha" 1 "$key" $now 1 $rid $off
        run on-sparse 100000 - "$sha" "$keys" "$key" ${second:+"$key:dedupe"} $now 1 $rid $on
        run on-cap 100000000 "$one" "$sha" "$keys" "$one" ${second:+"$one:dedupe"} $now 1 $rid $on
        run on-flood 100000000 "$one" "$sha" "$keys" "$one" ${second:+"$one:dedupe"} $now 1 $rid $flood_on
        run off-flood 1000 - "$sha" 1 "$one" $now 1 $rid $flood_off
        run on-replay 1000 - "$sha" "$keys" "$one" ${second:+"$one:dedupe"} $now 1 0123456789abcdef $on
    done
done
