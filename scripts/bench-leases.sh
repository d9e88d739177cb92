#!/usr/bin/env bash
# Redis cost of an in-flight lease: an acquire (the single-key
# concurrency script, lua/single-lease.lua) and its release (lua/release.lua)
# beside one fixed-window decision (lua/single-policy.lua), each composed as
# adapter-redis/src/scripts.rs composes it, on one redis-server on a free
# loopback port (never 6379), pinned to CPU 0 (the client to CPU 1) where
# there are two CPUs.
#
# redis-benchmark cannot pair a release with its acquire (it draws every
# random argument anew), so each case is a file of RESP commands sent with
# `redis-cli --pipe`: the fixed window once per request, the lease as its
# acquire then its release (the same key and lease id). Keys spread over
# 1,000 subjects, every request has a fresh evaluation id, nothing is ever
# refused, and a lease is released before the next acquire of its key, as
# under a service that is not overloaded: the key holds the mark and at
# most one lease. A third case, `acquire`, sends the acquires alone, with
# leases that live 1 ms: a key's next acquire (1,000 requests, so 1,000 ms
# of caller time, later) sweeps the one it finds expired, so the key again
# holds the mark and at most one lease, and a lease's cost splits into its
# acquire and, by difference, its release. Per case it prints, as medians over the rounds (the two
# cases alternating first), the server's CPU time (user + system, from
# /proc, so time the server spent preempted on a shared machine does not
# count) and INFO commandstats' usec_per_call of EVALSHA, per request
# (a lease's request is its two calls), and the ratio to the fixed window.
#
# With MEASURE=instructions it counts instead, with valgrind's cachegrind,
# the instructions a fresh redis-server runs per request (its total for the
# case, less the total of an idle server that loaded the same scripts): a
# count the other load on a shared machine does not move, so one round is
# enough.
#
# Usage: scripts/bench-leases.sh [rounds]
# Env: REQUESTS (100000), MEASURE (cpu or instructions)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${REQUESTS:-100000}
measure=${MEASURE:-cpu}
. scripts/bench-common.sh
start_bench_redis
# This tree's scripts as scripts.rs composes them (F, C the lease set's, R).
composed_scripts "$work" ""
mv "$work/C.lua" "$work/L.lua"
declare -A sha
for script in F L R; do sha[$script]=$(rcli SCRIPT LOAD "$(cat "$work/$script.lua")"); done
# ARGV blocks after time, cost and id (lua/policy-set.lua): a fixed window
# and a concurrency policy that never refuse; leases live a minute.
fixed="F 1000 1000 0 0 $big 60000"
lease="C 1000 1000 0 0 10000 60000 1000"
short="C 1000 1000 0 0 10000 1 1000"
# resp <file> <commands, one a line, arguments space-separated>: the RESP
# encoding redis-cli --pipe sends.
resp() {
    awk 'BEGIN {ORS = ""} {printf "*%d\r\n", NF; for (i = 1; i <= NF; i++)
        printf "$%d\r\n%s\r\n", length($i), $i}' >"$1"
}
awk -v n="$requests" -v d="${sha[F]}" -v now="$now" -v block="$fixed" 'BEGIN {
    for (i = 1; i <= n; i++)
        printf "EVALSHA %s 1 bench:{v1:%d}:f %d 1 %016d %s\n", d, i % 1000, now + i, i, block
}' | resp "$work/fixed.resp"
awk -v n="$requests" -v l="${sha[L]}" -v r="${sha[R]}" -v now="$now" -v block="$lease" 'BEGIN {
    for (i = 1; i <= n; i++) {
        printf "EVALSHA %s 1 bench:{v1:%d}:c %d 1 %016d %s\n", l, i % 1000, now + i, i, block
        printf "EVALSHA %s 1 bench:{v1:%d}:c %016d %d\n", r, i % 1000, i, now + i
    }
}' | resp "$work/lease.resp"
awk -v n="$requests" -v l="${sha[L]}" -v now="$now" -v block="$short" 'BEGIN {
    for (i = 1; i <= n; i++)
        printf "EVALSHA %s 1 bench:{v1:%d}:c %d 1 %016d %s\n", l, i % 1000, now + i, i, block
}' | resp "$work/acquire.resp"
# The per-EVALSHA figures are per request for the fixed window; a lease's
# request is two calls.
declare -A calls_per=([fixed]=1 [lease]=2 [acquire]=1)
one() {
    local name=$1 before after
    rcli FLUSHALL >/dev/null
    rcli CONFIG RESETSTAT >/dev/null
    before=$(cpu)
    "${pin_client[@]}" redis-cli -p "$port" --pipe <"$work/$name.resp" >/dev/null
    after=$(cpu)
    echo "$name $(usec | awk -v c="${calls_per[$name]}" '{printf "%.2f", $1 * c}') $(awk \
        -v d=$((after - before)) -v t="$tick" -v n="$requests" \
        'BEGIN {printf "%.2f", d * 1e6 / t / n}')"
}
if [ "$measure" = instructions ]; then
    rounds=1
    # counted <out> [resp file]: a fresh server under cachegrind with the
    # scripts loaded, the file piped if any, its total instructions.
    counted() {
        local out=$1 at=$((port + 1)) script
        valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$out" \
            redis-server --port "$at" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$work" >/dev/null 2>&1 &
        local server=$!
        for _ in $(seq 300); do redis-cli -p "$at" ping >/dev/null 2>&1 && break; sleep 0.1; done
        for script in F L R; do
            redis-cli -p "$at" SCRIPT LOAD "$(cat "$work/$script.lua")" >/dev/null
        done
        if [ $# -gt 1 ]; then redis-cli -p "$at" --pipe <"$2" >/dev/null; fi
        redis-cli -p "$at" shutdown nosave >/dev/null 2>&1 || true
        wait "$server" || true
        awk '/^summary:/ {print $2}' "$out"
    }
    idle=$(counted "$work/idle")
    one() {
        local total
        total=$(counted "$work/ir.$1" "$work/$1.resp")
        echo "$1 - $(((total - idle) / requests))"
    }
fi
for round in $(seq "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="fixed lease acquire"; else order="acquire lease fixed"; fi
    for name in $order; do one "$name"; done
done >"$work/runs"
median() { awk -v c="$1" -v f="$2" '$1 == c {print $f}' "$work/runs" |
    sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
if [ "$measure" = instructions ]; then
    echo "case: instructions per request (ratio to fixed)"
    for name in fixed lease acquire; do
        echo "$name: $(median "$name" 3) ($(awk -v a="$(median "$name" 3)" \
            -v b="$(median fixed 3)" 'BEGIN {printf "%.2f", a / b}')x)"
    done
else
    echo "case: usec_per_call, cpu_us per request (medians of $rounds; ratio to fixed)"
    for name in fixed lease acquire; do
        u=$(median "$name" 2) c=$(median "$name" 3)
        echo "$name: $u, $c ($(awk -v a="$u" -v b="$(median fixed 2)" -v x="$c" \
            -v y="$(median fixed 3)" 'BEGIN {printf "%.2fx, %.2fx", a / b, x / y}'))"
    done
    echo "rounds:"
    cat "$work/runs"
fi
