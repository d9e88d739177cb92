#!/usr/bin/env bash
# Redis CPU per decision of the composed rate-limit scripts of two trees side
# by side: a base commit's `adapter-redis/lua` against this tree's, each
# composed as adapter-redis/src/scripts.rs composes it. Starts its own
# redis-server on a free loopback port (never 6379), pins it to CPU 0 and
# redis-benchmark to CPU 1 when there are two CPUs, runs each case on both
# trees back to back (which first alternating by round) and prints, per case, the median over the rounds of the
# server's CPU time per EVALSHA (user + system, from /proc, so time the
# server spent preempted on a shared machine is not counted; network and
# parsing included, alike for both trees), base then this tree, and the
# same for INFO commandstats' usec_per_call (wall time inside the call).
#
# With MEASURE=instructions it counts instead, with valgrind's cachegrind,
# the instructions a fresh redis-server runs per EVALSHA (its total for the
# case, less the total of an idle server that loaded the same scripts, over
# the calls): a count the other load on a shared machine does not move, so
# one round is enough.
#
# Usage: scripts/bench-scripts.sh BASE [rounds]
# Env: REQUESTS (200000), MEASURE (cpu or instructions), ONLY (a case-name
# pattern), THIS_LUA (another directory of Lua files, in the layout from
# before the algorithm registry, to set against BASE instead of this tree)
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1
rounds=${2:-3}
requests=${REQUESTS:-200000}
measure=${MEASURE:-cpu}
. scripts/bench-common.sh
start_bench_redis
mkdir "$work/base"
for file in $(git ls-tree --name-only "$base" adapter-redis/lua/); do
    git show "$base:$file" >"$work/base/$(basename "$file")"
done
# A base with the algorithm registry composes its scripts itself: its
# composed_scripts example, built in a worktree of it.
base_composes=
if git cat-file -e "$base:adapter-redis/examples/composed_scripts.rs" 2>/dev/null; then
    base_composes=1
    git worktree add --detach "$work/tree" "$base" >/dev/null
    trap 'git worktree remove --force "$work/tree" >/dev/null 2>&1 || true; redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
    (cd "$work/tree" && cargo run -q --release -p adapter-redis --example composed_scripts -- "$work" base)
fi
k1='bench:{v1:__rand_int__}:a'
k2='bench:{v1:__rand_int__}:b'
flood='bench:{v1:flood}:a'
# Per-key ARGV blocks after time, cost and id (lua/policy-set.lua).
fw_off="F 1000 1000 0 0 $big 60000"
fw_on="F 1000 1000 5000 256 $big 60000"
sc_off="S 1000 1000 0 0 $big 60000"
tb_off="B 1000 1000 0 0 $big 1 1000"
# GCRA: a burst never reached, T = 1 ms (whole microseconds in ARGV).
g_off="G 1000 1000 0 0 $big 1000"
tb_flood="B 1000 1000 0 0 1 1 3600000"
# case_run <name> <script> <keyspace> <numkeys> <keys and args...>: the
# case on both trees, in the order of $trees (only on a tree that has the
# script's algorithm: a base from before GCRA has no gcra.lua).
case_run() {
    local name=$1 script=$2 keyspace=$3 tree
    shift 3
    case $name in ${ONLY:-*}) ;; *) return ;; esac
    for tree in $trees; do
        [ -n "${sha[$tree$script]:-}" ] || continue
        one "$tree" "$name" "${sha[$tree$script]}" "$keyspace" "$@"
    done
}
one() {
    local tree=$1 name=$2 digest=$3 keyspace=$4
    shift 4
    rcli FLUSHALL >/dev/null
    rcli CONFIG RESETSTAT >/dev/null
    local before after
    before=$(cpu)
    "${pin_client[@]}" redis-benchmark -p "$port" -c 64 -P 16 -n "$requests" -r "$keyspace" \
        --csv EVALSHA "$digest" "$@" >/dev/null
    after=$(cpu)
    echo "$tree $name $(usec) $(awk -v d=$((after - before)) -v t="$tick" -v n="$requests" \
        'BEGIN {printf "%.2f", d * 1e6 / t / n}')"
}
cases() {
    case_run fixed-off F 1000 1 "$k1" $now 1 $rid $fw_off
    case_run fixed-on F 100000 1 "$k1" $now 1 $rid $fw_on
    case_run sliding-off S 1000 1 "$k1" $now 1 $rid $sc_off
    case_run bucket-off B 1000 1 "$k1" $now 1 $rid $tb_off
    case_run gcra-off G 1000 1 "$k1" $now 1 $rid $g_off
    case_run set-fixed+bucket-off P 1000 2 "$k1" "$k2" $now 1 $rid $fw_off $tb_off
    case_run set-fixed+fixed-on P 100000 2 "$k1" "$k2" $now 1 $rid $fw_on $fw_on
    # The second key refuses: the first runs again spared (lua/policy-set.lua step 6).
    case_run set-refused P 1000 2 "$k1" "$flood" $now 1 $rid $fw_off $tb_flood
}
declare -A sha
for tree in base this; do
    case $tree in base) dir=$work/base ;; this) dir=${THIS_LUA:-} ;; esac
    if [ -z "$dir" ] || { [ "$tree" = base ] && [ -n "$base_composes" ]; }; then
        # A tree with the algorithm registry composes its scripts from it.
        [ "$tree" = this ] && composed_scripts "$work" this
        scripts="F S B P G"
        for script in $scripts; do sha[$tree$script]=$(rcli SCRIPT LOAD "$(cat "$work/$tree$script.lua")"); done
        continue
    fi
    compose "$dir" single-policy.lua fixed-window.lua fixed_window >"$work/${tree}F.lua"
    compose "$dir" single-policy.lua sliding-counter.lua sliding_counter >"$work/${tree}S.lua"
    compose "$dir" single-policy.lua token-bucket.lua token_bucket >"$work/${tree}B.lua"
    compose "$dir" policy-set.lua - - >"$work/${tree}P.lua"
    scripts="F S B P"
    if [ -f "$dir/gcra.lua" ]; then
        compose "$dir" single-policy.lua gcra.lua gcra >"$work/${tree}G.lua"
        scripts="$scripts G"
    fi
    for script in $scripts; do
        sha[$tree$script]=$(rcli SCRIPT LOAD "$(cat "$work/$tree$script.lua")")
    done
done
if [ "$measure" = instructions ]; then
    rounds=1
    # counted <tree> <out> [redis-benchmark args]: a fresh server under
    # cachegrind with the tree's scripts loaded, the calls if any, its total.
    counted() {
        local tree=$1 out=$2 at=$((port + 1)) script
        shift 2
        valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$out" \
            redis-server --port "$at" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$work" >/dev/null 2>&1 &
        local server=$!
        for _ in $(seq 300); do redis-cli -p "$at" ping >/dev/null 2>&1 && break; sleep 0.1; done
        for script in F S B P G; do
            [ -f "$work/$tree$script.lua" ] || continue
            redis-cli -p "$at" SCRIPT LOAD "$(cat "$work/$tree$script.lua")" >/dev/null
        done
        if [ $# -gt 0 ]; then
            redis-benchmark -p "$at" -c 64 -P 16 -n "$requests" --csv "$@" >/dev/null
        fi
        redis-cli -p "$at" shutdown nosave >/dev/null 2>&1 || true
        wait "$server" || true
        awk '/^summary:/ {print $2}' "$out"
    }
    declare -A idle
    for tree in base this; do idle[$tree]=$(counted "$tree" "$work/idle.$tree"); done
    one() {
        local tree=$1 name=$2 digest=$3 keyspace=$4 total
        shift 4
        total=$(counted "$tree" "$work/ir.$tree.$name" -r "$keyspace" EVALSHA "$digest" "$@")
        echo "$tree $name $(((total - ${idle[$tree]}) / requests)) -"
    }
fi
for round in $(seq "$rounds"); do
    if [ $((round % 2)) = 1 ]; then trees="base this"; else trees="this base"; fi
    cases
done >"$work/runs"
if [ "$measure" = instructions ]; then
    echo "case: instructions per call base, this"
else
    echo "case: cpu_us_per_call base, this; usec_per_call base, this (medians of $rounds)"
fi
for name in $(awk '{print $2}' "$work/runs" | awk '!seen[$0]++'); do
    # The median of a field over the rounds; "-" for a case a tree did not run.
    median() { awk -v t="$1" -v c="$name" -v f="$2" '$1 == t && $2 == c {print $f}' "$work/runs" |
        sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "-"}'; }
    if [ "$measure" = instructions ]; then
        echo "$name $(median base 3) $(median this 3)"
    else
        echo "$name $(median base 4) $(median this 4); $(median base 3) $(median this 3)"
    fi
done
