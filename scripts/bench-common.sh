# Sourced by the bench scripts. compose <dir> <driver> <algorithm file> <function>
# prints a driver script with its include lines filled in, as
# adapter-redis/src/scripts.rs composes it (the algorithm's file at the
# `#algorithm` line, followed by the line binding `algorithm`). The
# `#include algorithm.lua` form is the same line in trees before it.
compose() {
    awk -v dir="$1" -v alg="$3" -v fn="$4" '
        /^-- #algorithm$|^-- #include algorithm.lua/ {f=dir"/"alg; while ((getline l < f) > 0) print l; close(f)
                                      print "local algorithm = " fn; next}
        /^-- #include / {f=dir"/"$3; while ((getline l < f) > 0) print l; close(f); next}
        {print}' "$1/$2"
}

# composed_scripts <dir> <prefix>: this tree's scripts as scripts.rs
# composes them from the algorithm registry, one file each:
# <prefix><tag>.lua per algorithm (F, S, B, G, C), <prefix>P.lua, <prefix>R.lua.
composed_scripts() {
    cargo run -q --release -p adapter-redis --example composed_scripts -- "$1" "$2"
}

# The redis-benchmark cases of the single-key fixed-window script. ARGV after
# time, cost and id: kind regression slack dedupe-ttl capacity limit window.
now=1800000000250
big=1000000000000
off="F 1000 1000 0 0 $big 60000"
on="F 1000 1000 5000 256 $big 60000"
flood_on="F 1000 1000 5000 256 1 60000"
flood_off="F 1000 1000 0 0 1 60000"
rid=0000__rand_int__ # 16 bytes, a new id per call

# start_bench_redis: a throwaway redis-server on a random loopback port,
# pinned to CPU 0 where there are two (clients then take CPU 1 through
# "${pin_client[@]}"), in a temporary $work removed at exit; rcli talks to it.
start_bench_redis() {
    pin_server=() pin_client=()
    if [ "$(nproc)" -ge 2 ]; then pin_server=(taskset -c 0) pin_client=(taskset -c 1); fi
    work=$(mktemp -d)
    port=$((20000 + RANDOM % 20000))
    trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
    "${pin_server[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --daemonize yes --logfile "$work/redis.log" --dir "$work"
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    bench_pid=$(redis-cli -p "$port" INFO server | tr -d '\r' | awk -F: '/^process_id:/ {print $2}')
    tick=$(getconf CLK_TCK)
}
rcli() { redis-cli -p "$port" "$@"; }
# usec_per_call of EVALSHA since the last CONFIG RESETSTAT; a script that
# failed any call measures nothing.
usec() {
    rcli INFO commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ {
        if ($10 != 0) {print "failed_calls=" $10 > "/dev/stderr"; exit 1}; print $6}'
}
# The bench server's CPU time so far (user + system), in clock ticks ($tick
# a second).
cpu() { awk '{print $14 + $15}' "/proc/$bench_pid/stat"; }
