#!/usr/bin/env bash
# Redis CPU per rate-limit script call: `usec_per_call` of cmdstat_evalsha
# (INFO commandstats, after CONFIG RESETSTAT) for the script of branch
# `main` (one fixed-window key, dedupe off: BEFORE) and for this tree's
# scripts (AFTER): the single-key fixed-window script a set of one runs, and
# the policy-set script with one and with two fixed-window keys,
# dedupe off, every call allowed and charged (GET + SET per key). Rounds
# alternate the scripts so drift hits them alike.
#
# FLOOR-1 and FLOOR-2 are bare scripts that only GET and SET the same
# keys with a value of the same size (one key, two keys) and return a reply
# of the same shape: what any script doing this work costs at least.
#
# redis-server is pinned to core 0 and redis-benchmark to core 1, on a
# private port (never 6379). Usage: scripts/bench-script.sh [rounds]
# Env: PORT (default 6393), REQUESTS (200000), CLIENTS (64), PIPELINE (16),
# BEFORE_REF (git ref of the old script, default main), OLD_SET_REF (a git
# ref whose policy-set driver is measured over two keys too, e.g. sets;
# default none).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
port=${PORT:-6393}
requests=${REQUESTS:-200000}
clients=${CLIENTS:-64}
pipeline=${PIPELINE:-16}
before_ref=${BEFORE_REF:-main}
old_set_ref=${OLD_SET_REF:-}
work=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# Puts each `-- #include <file>` line's file in, as scripts.rs does.
# The single-key driver takes its algorithm's file at `algorithm.lua`,
# then a line binding `algorithm` to that file's function.
compose() { # compose <dir> <file> [<algorithm file> <function>]
    awk -v dir="$1" -v alg="${3:-}" -v fn="${4:-}" '
        /^-- #include algorithm.lua/ {f=dir"/"alg; while ((getline l < f) > 0) print l; close(f)
                                      print "local algorithm = " fn; next}
        /^-- #include / {f=dir"/"$3; while ((getline l < f) > 0) print l; close(f); next}
        {print}' "$1/$2"
}
mkdir -p "$work/before"
for file in prelude.lua fixed-window.lua; do
    git show "$before_ref:adapter-redis/lua/$file" >"$work/before/$file"
done
compose "$work/before" fixed-window.lua >"$work/before.lua"
compose adapter-redis/lua policy-set.lua >"$work/after.lua"
if [ -n "$old_set_ref" ]; then
    mkdir -p "$work/old-set"
    for file in prelude.lua fixed-window.lua sliding-counter.lua token-bucket.lua policy-set.lua; do
        git show "$old_set_ref:adapter-redis/lua/$file" >"$work/old-set/$file"
    done
    compose "$work/old-set" policy-set.lua >"$work/old-set.lua"
fi
compose adapter-redis/lua single-policy.lua fixed-window.lua fixed_window >"$work/single.lua"
# Dedupe on: BEFORE_REF's single-key script (records inside the counter
# string) beside this tree's (records in the `:dedupe` hash).
mkdir -p "$work/old-single"
for file in prelude.lua fixed-window.lua single-policy.lua; do
    git show "$before_ref:adapter-redis/lua/$file" >"$work/old-single/$file"
done
compose "$work/old-single" single-policy.lua fixed-window.lua fixed_window >"$work/old-single.lua"
cat >"$work/floor1.lua" <<'LUA'
local raw = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'F0123456789abcdef01234567', 'PX', 1750)
return {'allowed', 1, 999, 750, 0}
LUA
cat >"$work/floor2.lua" <<'LUA'
local a = redis.call('GET', KEYS[1])
local b = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[1], 'F0123456789abcdef01234567', 'PX', 1750)
redis.call('SET', KEYS[2], 'F0123456789abcdef01234567', 'PX', 1750)
return {'allowed', 1, 999, 750, 0, 1, 999, 750, 0}
LUA

taskset -c 0 redis-server --port "$port" --save "" --appendonly no --daemonize yes \
    --logfile "$work/redis.log" --dir "$work"
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
before=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/before.lua")")
after=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/after.lua")")
single=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/single.lua")")
old_single=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/old-single.lua")")
floor1=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/floor1.lua")")
floor2=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/floor2.lua")")
if [ -n "$old_set_ref" ]; then
    old_set=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/old-set.lua")")
fi

now=1800000000250
id=0123456789abcdef
# A limit no run reaches, so every call is allowed and writes.
limit=1000000000000
fw_old="1000 1000 0 0 $id $limit 1000"      # regression slack ttl capacity id limit window
fw_new="F 1000 1000 0 0 $limit 1000"         # kind regression slack ttl capacity limit window

# Dedupe on at its defaults (TTL 5 s, 256 records): a new id per call
# (redis-benchmark puts 12 random digits at __rand_int__), so every call is
# allowed, charged and appends a record.
fw_dedupe="F 1000 5000 5000 256 $limit 1000"
rid="0000__rand_int__"                          # 16 bytes

# fill <script> <keys...>: 256 charges on the keys, so the key is at its
# record cap before the measured run (a busy subject).
fill() {
    local script=$1; shift
    local n=$#
    for i in $(seq 256); do
        redis-cli -p "$port" EVALSHA "$script" "$n" "$@" $now 1 "$(printf 'fill%012d' "$i")" \
            $fw_dedupe >/dev/null
    done
}

measure() { # measure <label> <EVALSHA arguments...>; FILL=<keys count> first fills
    local label=$1; shift
    redis-cli -p "$port" FLUSHALL >/dev/null
    if [ -n "${FILL:-}" ]; then fill "$1" "${@:3:$FILL}"; fi
    redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
    taskset -c 1 redis-benchmark -p "$port" -c "$clients" -P "$pipeline" -n "$requests" -q \
        EVALSHA "$@" >/dev/null
    local usec
    usec=$(redis-cli -p "$port" INFO commandstats | tr -d '\r' |
        awk -F'[=,]' '/^cmdstat_evalsha:/ {print $6}')
    printf '%s %s\n' "$label" "$usec"
}

echo "round script usec_per_call"
for round in $(seq "$rounds"); do
    echo "$round $(measure before-fixed-window "$before" 1 'ca:rl:{bench:1:v1:00}' $now 1 $fw_old)"
    # What the adapter sends for a set of one: the single-key script.
    echo "$round $(measure after-single-key "$single" 1 'ca:rl:{v1:00}:a:1' $now 1 $id $fw_new)"
    echo "$round $(measure after-set-script-of-1 "$after" 1 'ca:rl:{v1:00}:a:1' $now 1 $id $fw_new)"
    echo "$round $(measure after-set-of-2 "$after" 2 'ca:rl:{v1:00}:a:1' 'ca:rl:{v1:00}:b:1' \
        $now 1 $id $fw_new $fw_new)"
    if [ -n "$old_set_ref" ]; then
        echo "$round $(measure old-set-of-2 "$old_set" 2 'ca:rl:{v1:00}:a:1' 'ca:rl:{v1:00}:b:1' \
            $now 1 $id $fw_new $fw_new)"
    fi
    # Dedupe on: a fresh key per call (random key), and one busy key
    # holding 256 records; BEFORE_REF's script (one key) and this tree's
    # (the key and its records key).
    echo "$round $(measure dedupe-fresh-before "$old_single" 1 'ca:rl:{v1:__rand_int__}:a:1' \
        $now 1 $rid $fw_dedupe)"
    echo "$round $(measure dedupe-fresh-after "$single" 2 'ca:rl:{v1:__rand_int__}:a:1' \
        'ca:rl:{v1:__rand_int__}:a:1:dedupe' $now 1 $rid $fw_dedupe)"
    echo "$round $(FILL=1 measure dedupe-busy-before "$old_single" 1 'ca:rl:{v1:00}:a:1' \
        $now 1 $rid $fw_dedupe)"
    echo "$round $(FILL=2 measure dedupe-busy-after "$single" 2 'ca:rl:{v1:00}:a:1' \
        'ca:rl:{v1:00}:a:1:dedupe' $now 1 $rid $fw_dedupe)"
    echo "$round $(measure floor-1 "$floor1" 1 'ca:rl:{v1:00}:a:1' $now 1 $id $fw_new)"
    echo "$round $(measure floor-2 "$floor2" 2 'ca:rl:{v1:00}:a:1' 'ca:rl:{v1:00}:b:1' \
        $now 1 $id $fw_new $fw_new)"
done | tee "$work/rounds"
# Medians per script, and the ratios the issue sets its bars on.
awk '{v[$2] = v[$2] " " $3} END {
    for (s in v) {
        n = split(substr(v[s], 2), a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
        m[s] = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        printf "median %s %.2f\n", s, m[s]
    }
    printf "ratio single-key/before %.3f\n", m["after-single-key"] / m["before-fixed-window"]
    printf "ratio set-of-2/single-key %.3f\n", m["after-set-of-2"] / m["after-single-key"]
    printf "ratio floor-2/floor-1 %.3f\n", m["floor-2"] / m["floor-1"]
    printf "ratio set-of-2/floor-2 %.3f\n", m["after-set-of-2"] / m["floor-2"]
    printf "ratio single-key/floor-1 %.3f\n", m["after-single-key"] / m["floor-1"]
    printf "ratio dedupe-busy-after/single-key %.3f\n", m["dedupe-busy-after"] / m["after-single-key"]
    printf "ratio dedupe-busy-before/single-key %.3f\n", m["dedupe-busy-before"] / m["after-single-key"]
    printf "ratio dedupe-fresh-after/single-key %.3f\n", m["dedupe-fresh-after"] / m["after-single-key"]
    printf "ratio dedupe-fresh-before/single-key %.3f\n", m["dedupe-fresh-before"] / m["after-single-key"]
    if ("old-set-of-2" in m) printf "ratio old-set-of-2/single-key %.3f\n", m["old-set-of-2"] / m["after-single-key"]
}' "$work/rounds" | sort
