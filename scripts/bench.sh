#!/usr/bin/env bash
# Every benchmark figure in one run: builds the release binary once,
# starts a private redis-server on a free loopback port (never 6379), and
# measures side by side, ROUNDS times, alternating:
#   - the limit: redis-benchmark EVALSHA of our own single-key fixed-window
#     script (c=64 -P 16 over 1,000 keys, and c=1), plus Redis CPU per call
#     (INFO commandstats usec_per_call) with dedupe off, on with sparse
#     records, on at the record cap, under a deny flood, and a replay; and
#     the settle script (lua/settle.lua) on the same keys: an
#     after-the-fact charge, and a settle of no live reservation;
#   - `ca-skeleton bench` through the Redis provider: dedupe off and on at
#     c=64, GCRA and a lease acquire+release at c=64, dedupe off at c=1, and
#     a deny flood (one subject) with redis.deny-cache.enabled true and false
#     when the binary knows that key; each with usec_per_call and client CPU
#     (user+sys) per decision, beside a bare redis crate client
#     (examples/bare_client.rs) at c=64 and c=1;
#   - HTTP under wrk: the same server with the limiter disabled, on the
#     memory provider and on Redis (requests/s, p50, p99), and, when
#     adapter-web/examples/governor_edge.rs exists, axum + tower_governor
#     beside the same server without the governor layer;
#   - scale (adapter-memory/benches/scale.rs): decisions/s and p99 of the
#     memory provider (fixed window with dedupe off and on, GCRA, a lease
#     acquire+release) beside governor's keyed limiter at 1,000 / 100,000 /
#     1,000,000 subjects;
# then once: the resident memory per subject at 1,000,000 subjects (ours
# and governor's, one process each), Redis used_memory per subject at
# 1,000,000 subjects (adapter-redis/examples/redis_scale.rs: dedupe off and
# on, GCRA, a lease, and the floor of a plain SET with the same key length
# and TTL), the Envoy RLS over gRPC (adapter-envoy-rls/benches/grpc.rs, its
# own ROUNDS), optionally the Envoy RLS on Redis beside Kuadrant/limitador
# (scripts/bench-limitador.sh, given LIMITADOR_SRC, a limitador checkout;
# skipped, saying why, without it), and the criterion memory-provider
# bench; and writes the
# medians as a dated table between the bench.sh markers of
# docs/bench-results.md (replaced on every run). redis-server is pinned to
# CPU 0 and every client to CPU 1 when there are at least two CPUs (HTTP,
# Envoy and the Redis memory fill run unpinned but for redis-server).
#
# Usage: scripts/bench.sh          Env: ROUNDS (3), DURATION (seconds per
# run, 5), REQUESTS (redis-benchmark calls per run, 200000), SUBJECTS
# (the scale counts, 1000,100000,1000000), MEMORY_SUBJECTS (the memory
# figures' subjects, 1000000), SKIP_CRITERION=1, LIMITADOR_SRC (see
# scripts/bench-limitador.sh), DOC (the file to write,
# docs/bench-results.md; DOC=- prints the table only). QUICK=1: one short round
# of everything (1 s runs, 100,000 subjects at most, criterion cut short), to
# check the script end to end in a few minutes; its figures are not to quote.
# Any failing step stops the run with its line and command, and a figure
# missing at the end fails it: no table is written from a partial run.
set -Eeuo pipefail
trap 'echo "bench.sh: FAILED at line $LINENO: $BASH_COMMAND (exit $?)" >&2' ERR
cd "$(dirname "$0")/.."
if [ "${QUICK:-}" = 1 ]; then
    rounds=${ROUNDS:-1}
    duration=${DURATION:-1}
    requests=${REQUESTS:-20000}
    scale_subjects=${SUBJECTS:-1000,100000}
    memory_subjects=${MEMORY_SUBJECTS:-100000}
    criterion_times=(--warm-up-time 0.2 --measurement-time 0.5 --sample-size 10)
else
    rounds=${ROUNDS:-3}
    duration=${DURATION:-5}
    requests=${REQUESTS:-200000}
    scale_subjects=${SUBJECTS:-1000,100000,1000000}
    memory_subjects=${MEMORY_SUBJECTS:-1000000}
    criterion_times=(--warm-up-time 1 --measurement-time 3)
fi
doc=${DOC:-docs/bench-results.md}

need() { # need <tool> <how to install>
    command -v "$1" >/dev/null 2>&1 || { echo "bench.sh: $1 is missing; $2" >&2; exit 2; }
}
need cargo "install Rust with rustup (https://rustup.rs)"
for tool in redis-server redis-cli redis-benchmark; do
    need "$tool" "on Debian/Ubuntu: apt-get install redis-server (it ships redis-cli and redis-benchmark)"
done
need wrk "on Debian/Ubuntu: apt-get install wrk"
need curl "on Debian/Ubuntu: apt-get install curl"
need awk "on Debian/Ubuntu: apt-get install gawk"
cpus=$(nproc)
if [ "$cpus" -ge 2 ]; then
    need taskset "on Debian/Ubuntu: apt-get install util-linux"
    server_pin=(taskset -c 0)
    client_pin=(taskset -c 1)
else
    server_pin=()
    client_pin=()
fi

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { # a port nothing listens on, away from 6379
    local port
    for _ in $(seq 100); do
        port=$((20000 + RANDOM % 20000))
        listening "$port" || { echo "$port"; return; }
    done
    echo "bench.sh: no free port found" >&2
    exit 2
}

echo "bench.sh: building the release binary" >&2
cargo build --release --locked -p app-bootstrap >&2
cargo build --release --locked -p adapter-redis --example bare_client --example redis_scale >&2
cargo bench --locked -p adapter-memory --bench scale --no-run >&2
cargo bench --locked -p adapter-envoy-rls --bench grpc --no-run >&2
bin=target/release/ca-skeleton
bare=target/release/examples/bare_client
redis_scale=target/release/examples/redis_scale
# bench_exe <crate> <bench>: the bench binary cargo built (run directly, so
# pinning and timing cover it alone, not cargo).
bench_exe() {
    local exe
    exe=$(cargo bench --locked -p "$1" --bench "$2" --no-run 2>&1 |
        sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
    [ -x "$exe" ] || { echo "bench.sh: no bench binary for $1 --bench $2" >&2; exit 1; }
    echo "$exe"
}
scale_bin=$(bench_exe adapter-memory scale)
grpc_bin=$(bench_exe adapter-envoy-rls grpc)
# The tower_governor pair comes with lane edge's example; until it exists
# the HTTP table has no such rows.
governor_edge=""
if [ -f adapter-web/examples/governor_edge.rs ]; then
    cargo build --release --locked -p adapter-web --example governor_edge >&2
    governor_edge=target/release/examples/governor_edge
fi

work=$(mktemp -d)
port=$(free_port)
cleanup() {
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"${server_pin[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --logfile "$work/redis.log" --dir "$work"
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$port" "$@"; }

# The service reads config/bench.toml; these point it at our server.
export CA_SKELETON_REDIS__URLS="[redis://127.0.0.1:$port]"
export RUST_LOG=warn
"$bin" --config config/bench.toml check-config >/dev/null 2>"$work/check.log" || {
    cat "$work/check.log" >&2
    echo "bench.sh: config/bench.toml does not load with this binary" >&2
    exit 2
}
# redis.deny-cache is newer than this script's first version: measure it
# only when the binary knows the key.
if CA_SKELETON_REDIS__DENY_CACHE__ENABLED=true "$bin" --config config/bench.toml check-config \
    >/dev/null 2>&1; then
    deny_cache=yes
else
    deny_cache=no
    echo "bench.sh: this build has no redis.deny-cache key; the deny flood runs once, without it" >&2
fi

# --- the limit: redis-benchmark on our own script ---------------------------
# The single-key fixed-window script, as scripts.rs composes it.
. scripts/bench-common.sh
composed_scripts "$work" this
cp "$work/thisF.lua" "$work/single.lua"
sha=$(rcli SCRIPT LOAD "$(cat "$work/single.lua")")
settle_sha=$(rcli SCRIPT LOAD "$(cat "$work/thisU.lua")")

usec_per_call() {
    rcli INFO commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $6}'
}
evalsha_calls() {
    rcli INFO commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $2}'
}

# fill <key>: 256 charges with fresh ids, so the key is at its record cap.
fill() {
    redis-benchmark -p "$port" -c 1 -n 256 -r 100000000 -q \
        EVALSHA "$sha" 1 "$1" $now 1 $rid $on >/dev/null
}

# rb <case> <clients> <pipeline> <keyspace> <filled key or -> <EVALSHA args...>:
# one redis-benchmark run on a flushed server (the key filled first);
# prints "<case> rps <v>", "<case> usec <v>" and, for c=1, "<case> p50_us <v>".
# -r is the range of every __rand_int__ (keys and ids alike): one key with
# fresh ids takes a range of 10^8.
rb() {
    local case=$1 clients=$2 pipeline=$3 keyspace=$4 filled=$5
    shift 5
    rcli FLUSHALL >/dev/null
    [ "$filled" = - ] || fill "$filled"
    rcli CONFIG RESETSTAT >/dev/null
    local n=$requests
    [ "$clients" = 1 ] && n=$((requests / 10))
    local line
    line=$("${client_pin[@]}" redis-benchmark -p "$port" -c "$clients" -P "$pipeline" -n "$n" \
        -r "$keyspace" --csv EVALSHA "$@" | tail -1 | tr -d '"')
    echo "$case rps $(echo "$line" | awk -F, '{print $(NF-6)}')"
    [ "$clients" = 1 ] && echo "$case p50_us $(echo "$line" | awk -F, '{print $(NF-3) * 1000}')"
    echo "$case usec $(usec_per_call)"
}

limit_round() {
    local key='bench:{v1:__rand_int__}:fixed:1' one='bench:{v1:flood}:fixed:1'
    rb rb-off 64 16 1000 - "$sha" 1 "$key" $now 1 $rid $off
    rb rb-off-c1 1 1 1000 - "$sha" 1 "$key" $now 1 $rid $off
    # Dedupe on: sparse records (100,000 keys, about two records each),
    # one key at its record cap, a deny flood on that key, a replay.
    rb rb-on-sparse 64 16 100000 - "$sha" 1 "$key" $now 1 $rid $on
    rb rb-on-cap 64 16 100000000 "$one" "$sha" 1 "$one" $now 1 $rid $on
    rb rb-on-flood 64 16 100000000 "$one" "$sha" 1 "$one" $now 1 $rid $flood_on
    rb rb-off-flood 64 16 1000 - "$sha" 1 "$one" $now 1 $rid $flood_off
    rb rb-on-replay 64 16 1000 - "$sha" 1 "$one" $now 1 0123456789abcdef $on
    # The settle (ARGV: time, reserved, its own id, the reservation's id,
    # used, then the same block), dedupe on, sparse keys: a reservation
    # of 0 settled with 1 charges it and keeps the settle's record (the
    # write a charging decision makes); one of 1 whose id no key holds
    # reads and writes nothing.
    rb rb-settle-charge 64 16 100000 - "$settle_sha" 1 "$key" $now 0 $rid 0123456789abcdef 1 $on
    rb rb-settle-unknown 64 16 100000 - "$settle_sha" 1 "$key" $now 1 $rid 0123456789abcdef 0 $on
}

# --- ca-skeleton bench through the Redis provider ---------------------------
field() { grep -o "\"$2\":[0-9.]*" "$1" | head -1 | cut -d: -f2; }

# cs <case> <policy> <concurrency> <subjects> [ENV=value...]: one run; prints
# rps, p50_us, p99_us, usec (Redis CPU per call), cpu_us (client user+sys
# per decision), denied_pct and calls_per_decision (EVALSHA per decision).
cs() {
    local case=$1 policy=$2 concurrency=$3 subjects=$4
    shift 4
    rcli FLUSHALL >/dev/null
    rcli CONFIG RESETSTAT >/dev/null
    local TIMEFORMAT='%U %S'
    { time env CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER=redis "$@" "${client_pin[@]}" \
        "$bin" --config config/bench.toml bench --policy "$policy" --concurrency "$concurrency" \
        --subjects "$subjects" --duration "${duration}s" >"$work/bench.json" 2>"$work/bench.log"
    } 2>"$work/time"
    local decisions calls
    decisions=$(field "$work/bench.json" decisions)
    calls=$(evalsha_calls)
    echo "$case rps $(field "$work/bench.json" decisions_per_sec)"
    echo "$case p50_us $(field "$work/bench.json" p50_us)"
    echo "$case p99_us $(field "$work/bench.json" p99_us)"
    echo "$case usec $(usec_per_call)"
    awk -v d="$decisions" '{printf "'"$case"' cpu_us %.3f\n", ($1 + $2) * 1e6 / d}' "$work/time"
    awk -v d="$decisions" -v n="$(field "$work/bench.json" denied)" \
        'BEGIN {printf "'"$case"' denied_pct %.1f\n", 100 * n / d}'
    awk -v d="$decisions" -v c="${calls:-0}" \
        'BEGIN {printf "'"$case"' calls_per_decision %.4f\n", c / d}'
}

# The anchor of client CPU (c=64) and of c=1 latency: the same script
# through a bare redis crate MultiplexedConnection + Script
# (adapter-redis/examples/bare_client.rs). bare_run <case> <concurrency>.
bare_run() {
    local case=$1 concurrency=$2
    rcli FLUSHALL >/dev/null
    rcli CONFIG RESETSTAT >/dev/null
    local TIMEFORMAT='%U %S'
    { time "${client_pin[@]}" "$bare" "redis://127.0.0.1:$port" "$concurrency" 1000 "$duration" \
        >"$work/bare.json" 2>"$work/bare.log"; } 2>"$work/time"
    local decisions
    decisions=$(field "$work/bare.json" decisions)
    echo "$case rps $(field "$work/bare.json" decisions_per_sec)"
    echo "$case p50_us $(field "$work/bare.json" p50_us)"
    echo "$case usec $(usec_per_call)"
    awk -v d="$decisions" '{printf "'"$case"' cpu_us %.3f\n", ($1 + $2) * 1e6 / d}' "$work/time"
}

client_round() {
    bare_run bare 64
    bare_run bare-c1 1
    cs cs-off fixed-nodedupe 64 1000
    cs cs-on fixed 64 1000
    cs cs-gcra gcra 64 1000
    cs cs-leases leases 64 1000
    cs cs-off-c1 fixed-nodedupe 1 1000
    if [ "$deny_cache" = yes ]; then
        cs cs-flood-cache flood 64 1 CA_SKELETON_REDIS__DENY_CACHE__ENABLED=true
        cs cs-flood-nocache flood 64 1 CA_SKELETON_REDIS__DENY_CACHE__ENABLED=false
    else
        cs cs-flood-nocache flood 64 1
    fi
}

# --- HTTP under wrk ---------------------------------------------------------
# wrk_server <case> <probe path> <server command...>: starts the server (it
# must listen on $http_port), waits until the probe answers, runs wrk
# against it and prints the case's figures, then stops it. The probe sends
# the same x-api-key as the load, so a keyed route answers it too.
wrk_server() {
    local case=$1 probe=$2 pid up=no
    shift 2
    "$@" >/dev/null 2>"$work/server.log" &
    pid=$!
    for _ in $(seq 200); do
        curl -sf -H 'x-api-key: bench-key-1' "http://127.0.0.1:$http_port$probe" >/dev/null &&
            { up=yes; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ "$up" != yes ]; then
        echo "bench.sh: $case did not come up on port $http_port:" >&2
        cat "$work/server.log" >&2
        kill -TERM "$pid" 2>/dev/null || true
        exit 1
    fi
    # Non-2xx must stay 0: a 429 or 503 would measure the refusal path.
    wrk -t1 -c32 -d"${duration}s" -s scripts/bench-http.lua --latency "http://127.0.0.1:$http_port" |
        awk -v c="$case" '
            function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; return v * 1e6 }
            /Requests\/sec/ {print c, "rps", $2} / 50%/ {print c, "p50_us", us($2)}
            / 99%/ {print c, "p99_us", us($2)} /Non-2xx/ {bad = $5}
            END {print c, "non_2xx", bad + 0}'
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || true
}

http() { # http <provider>
    local provider=$1
    rcli FLUSHALL >/dev/null
    # A fresh port per server: nothing else may have taken the last one.
    http_port=$(free_port)
    wrk_server "http-$provider" /healthz env CA_SKELETON_SERVER__LISTEN="127.0.0.1:$http_port" \
        CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER="$provider" \
        "$bin" --config config/bench.toml serve
}

# http_governor <governor|plain>: axum + tower_governor
# (adapter-web/examples/governor_edge.rs), keyed by the same x-api-key
# header, with and without the governor layer.
http_governor() {
    local mode=$1
    http_port=$(free_port)
    wrk_server "http-tower-$mode" /api/hello "$governor_edge" "$mode" "127.0.0.1:$http_port"
}

http_round() {
    for provider in disabled memory redis; do http "$provider"; done
    if [ -n "$governor_edge" ]; then
        http_governor plain
        http_governor governor
    fi
}

# --- scale: the memory provider and governor over more and more subjects ----
# One line per contender and count: "scale:<contender>:<subjects> <figure> <v>".
scale_round() {
    SCALE_PART=decisions SCALE_SECS=$duration SCALE_SUBJECTS=$scale_subjects \
        "${client_pin[@]}" "$scale_bin" >"$work/scale.out" 2>"$work/scale.log" || {
        cat "$work/scale.log" >&2
        echo "bench.sh: FAILED: the scale bench" >&2
        exit 1
    }
    awk '$1 == "decisions" {c = "scale:" $2 ":" $3
        print c, "rps", $4; print c, "p50_ns", $5; print c, "p99_ns", $6; print c, "allowed_pct", $7
        print c, "cpu_rps", $8}' \
        "$work/scale.out"
}

started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
    echo "bench.sh: round $round of $rounds" >&2
    { limit_round; client_round; http_round; scale_round; } | sed "s/^/$round /" |
        tee -a "$work/rounds" >&2
done

# Once: memory per subject (deterministic enough for one run), then the
# Envoy RLS bench, which alternates its own rounds.
echo "bench.sh: resident memory per subject, $memory_subjects subjects" >&2
SCALE_PART=rss SCALE_RSS_SUBJECTS=$memory_subjects "${client_pin[@]}" "$scale_bin" \
    >"$work/rss.out" 2>"$work/rss.log" ||
    { cat "$work/rss.log" >&2; echo "bench.sh: FAILED: the RSS part of the scale bench" >&2; exit 1; }
cat "$work/rss.out" >&2
echo "bench.sh: Redis used_memory per subject, $memory_subjects subjects" >&2
REDIS_SCALE_SUBJECTS=$memory_subjects "$redis_scale" >"$work/redis-mem.out" 2>"$work/redis-mem.log" ||
    { cat "$work/redis-mem.log" >&2; echo "bench.sh: FAILED: $redis_scale" >&2; exit 1; }
cat "$work/redis-mem.out" >&2
echo "bench.sh: Envoy RLS over gRPC, $rounds rounds" >&2
SECS=$duration ROUNDS=$rounds REDIS=1 "$grpc_bin" >"$work/grpc.out" 2>"$work/grpc.log" ||
    { cat "$work/grpc.log" >&2; echo "bench.sh: FAILED: the Envoy RLS bench" >&2; exit 1; }
# "round <r> c=64: disabled <n>/s p50 <a> us p99 <b> us | memory ... | memory/disabled <x>"
# and "round <r> c=64: redis <n>/s p50 <a> us p99 <b> us".
awk '$1 == "round" {for (i = 4; i <= NF; i++) if ($i ~ /^(disabled|memory|redis)$/ && $(i + 1) ~ /\/s$/) {
        c = "envoy-" $i; v = $(i + 1); sub(/\/s$/, "", v)
        print $2, c, "rps", v; print $2, c, "p50_us", $(i + 3); print $2, c, "p99_us", $(i + 6)
    }}' "$work/grpc.out" | tee -a "$work/rounds" >&2
# Optional: it skips, saying why, without LIMITADOR_SRC or a peer that builds.
echo "bench.sh: the Envoy RLS on Redis beside Kuadrant/limitador (scripts/bench-limitador.sh)" >&2
ROUNDS=$rounds SECS=$duration SUBJECTS=10000 scripts/bench-limitador.sh >"$work/limitador.out" 2>"$work/limitador.log" ||
    { cat "$work/limitador.out" "$work/limitador.log" >&2; echo "bench.sh: FAILED: scripts/bench-limitador.sh" >&2; exit 1; }
cat "$work/limitador.out" >&2
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

criterion=""
if [ "${SKIP_CRITERION:-}" != 1 ]; then
    echo "bench.sh: criterion memory-provider bench" >&2
    "${client_pin[@]}" cargo bench --locked -p adapter-memory --bench decisions -- \
        "${criterion_times[@]}" >"$work/criterion" 2>&1 ||
        { cat "$work/criterion" >&2; echo "bench.sh: FAILED: the criterion bench" >&2; exit 1; }
    # "<group>/<n>-thread  time: [low mid high]", the id sometimes on a line of its own.
    criterion=$(awk '/^[a-z+-]+\/[0-9]-thread/ {id = $1}
        /time:/ {print id, $(NF-3), $(NF-2)}' "$work/criterion")
fi

# Medians per case and figure, then the table.
awk '{v[$2 " " $3] = v[$2 " " $3] " " $4} END {
    for (k in v) {
        n = split(substr(v[k], 2), a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) {t = a[i]; a[i] = a[j]; a[j] = t}
        m = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        print k, m, substr(v[k], 2)
    }
}' "$work/rounds" | sort >"$work/medians"
med() { awk -v k="$1 $2" '$1 " " $2 == k {print $3}' "$work/medians"; }
all() { awk -v k="$1 $2" '$1 " " $2 == k {$1 = $2 = $3 = ""; sub(/^ +/, ""); gsub(/ /, " / "); print}' "$work/medians"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b == 0) print "—"; else printf "%.2fx", a / b}'; }
# rr <case a> <case b> <figure>: the median over rounds of a/b in each
# round, with the rounds' ratios: load that moves both alike cancels out.
rr() {
    awk -v a="$1" -v b="$2" -v f="$3" '$3 == f && $2 == a {x[$1] = $4} $3 == f && $2 == b {y[$1] = $4}
        END {
            n = 0; list = ""
            for (r = 1; r <= 999; r++) if ((r in x) && (r in y) && y[r] > 0) {
                v[++n] = x[r] / y[r]; list = list (n > 1 ? " / " : "") sprintf("%.2f", x[r] / y[r])
            }
            if (n == 0) {print "—"; exit}
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) {t = v[i]; v[i] = v[j]; v[j] = t}
            m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
            printf "%.2fx (rounds %s)", m, list
        }' "$work/rounds"
}
dec() { awk -v a="$1" 'BEGIN {if (a == "") print "—"; else printf "%.1f", a}'; }
int() { awk -v a="$1" 'BEGIN {if (a == "") print "—"; else printf "%d", a + 0.5}'; }

# Every figure must be there: a step that printed nothing fails the run.
missing=""
expect() { [ -n "$(med "$1" "$2")" ] || missing="$missing $1/$2"; }
for c in rb-off rb-off-c1 rb-on-sparse rb-on-cap rb-on-flood rb-off-flood rb-on-replay \
    rb-settle-charge rb-settle-unknown bare bare-c1 cs-off cs-on cs-gcra cs-leases cs-off-c1 cs-flood-nocache; do
    expect "$c" rps
    expect "$c" usec
done
[ "$deny_cache" = no ] || expect cs-flood-cache rps
http_cases="http-disabled http-memory http-redis"
[ -z "$governor_edge" ] || http_cases="$http_cases http-tower-plain http-tower-governor"
for c in $http_cases envoy-disabled envoy-memory envoy-redis; do
    expect "$c" rps
    expect "$c" p99_us
done
scale_contenders="governor-keyed fixed-window fixed-window+dedupe gcra concurrency+release"
for n in ${scale_subjects//,/ }; do
    for c in $scale_contenders; do
        expect "scale:$c:$n" rps
        expect "scale:$c:$n" p99_ns
        expect "scale:$c:$n" cpu_rps
    done
done
for c in $scale_contenders; do
    grep -q "^rss $c $memory_subjects " "$work/rss.out" || missing="$missing rss/$c"
done
for c in dedupe-off dedupe-on gcra lease-acquire-release floor-set; do
    grep -q "^redis-mem $c $memory_subjects " "$work/redis-mem.out" || missing="$missing redis-mem/$c"
done
if [ -n "$missing" ]; then
    echo "bench.sh: FAILED: figures missing from this run:$missing" >&2
    exit 1
fi
rss() { awk -v c="$1" '$1 == "rss" && $2 == c {print $4}' "$work/rss.out"; }
# rmem <case> <column>: a column of a redis-mem line (4 bytes per subject,
# 5 key length, 6 type, 7 state length, 8 PTTL ms, 9 MEMORY USAGE).
rmem() { awk -v c="$1" -v k="$2" '$1 == "redis-mem" && $2 == c {print $k}' "$work/redis-mem.out"; }
rcap() { awk -v r="$1" '$1 == "redis-cap" && $3 == r {print $4}' "$work/redis-mem.out"; }
thousands() { awk -v a="$1" 'BEGIN {s = sprintf("%d", a + 0.5); o = ""
    while (length(s) > 3) {o = "," substr(s, length(s) - 2) o; s = substr(s, 1, length(s) - 3)}
    print s o}'; }

limit=$(med rb-off rps)
{
    echo "<!-- bench.sh:begin (generated by scripts/bench.sh; replaced on every run) -->"
    echo "## All figures in one run (\`scripts/bench.sh\`)"
    echo
    [ "${QUICK:-}" != 1 ] || echo "**QUICK=1: one short round, a check of the script; not figures to quote.**"
    echo
    echo "Run $started, \`ROUNDS=$rounds DURATION=$duration REQUESTS=$requests SUBJECTS=$scale_subjects"
    echo "MEMORY_SUBJECTS=$memory_subjects scripts/bench.sh\`;"
    echo "$cpus CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'));"
    echo "load average $load_start at the start, $load_end at the end;"
    echo "$(redis-server --version | awk '{print $1, $2, $3}'); redis-server pinned to CPU 0"
    echo "and every client to CPU 1$([ "$cpus" -ge 2 ] || echo ' (not pinned: one CPU)')."
    echo "Medians of $rounds rounds (each round's figure after the median). Nothing keeps other"
    echo "processes off the CPUs: compare the load averages. Ratios measured side by side in one"
    echo "round are what count; absolute figures move with the machine's other load."
    echo
    echo "Commands: the limit is \`redis-benchmark -c 64 -P 16 -r 1000 -n $requests EVALSHA\` of"
    echo "the single-key fixed-window script (\`adapter-redis/lua/single-policy.lua\`, composed as"
    echo "\`scripts.rs\` does) over 1,000 keys, every call allowed and charged; \`c=1\` is the same"
    echo "with \`-c 1 -P 1\`. The provider rows are \`ca-skeleton --config config/bench.toml bench"
    echo "--policy <p> --concurrency <c> --subjects <n> --duration ${duration}s\` with"
    echo "\`CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER=redis\` (\`fixed-nodedupe\`: dedupe off;"
    echo "\`fixed\`: dedupe at its defaults; \`flood\`: 2,000 per second for one subject). Redis"
    echo "µs/call is \`usec_per_call\` of \`cmdstat_evalsha\` after \`CONFIG RESETSTAT\`; client CPU"
    echo "is user+sys of the bench process over its decisions."
    echo
    echo "The \"vs limit\" column divides the medians; the per-round ratios follow the table."
    echo
    echo "| what | decisions/s | vs limit | p50 µs | p99 µs | Redis µs/call | client CPU µs/decision |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    echo "| limit: redis-benchmark c=64 -P 16, dedupe off ($(all rb-off rps)) | $(int "$limit") | 1.00x | | | $(med rb-off usec) | |"
    echo "| bare \`redis\` crate MultiplexedConnection + Script, c=64, dedupe off ($(all bare rps)) | $(int "$(med bare rps)") | $(ratio "$(med bare rps)" "$limit") | | | $(med bare usec) | $(med bare cpu_us) |"
    for c in cs-off:"bench c=64, dedupe off" cs-on:"bench c=64, dedupe on (defaults)" \
        cs-gcra:"bench c=64, GCRA (\`--policy gcra\`)" \
        cs-leases:"bench c=64, a lease acquire+release (\`--policy leases\`)"; do
        local_case=${c%%:*}
        echo "| ${c#*:} ($(all "$local_case" rps)) | $(int "$(med "$local_case" rps)") | $(ratio "$(med "$local_case" rps)" "$limit") | $(dec "$(med "$local_case" p50_us)") | $(dec "$(med "$local_case" p99_us)") | $(med "$local_case" usec) | $(med "$local_case" cpu_us) |"
    done
    echo "| redis-benchmark c=1, dedupe off | $(int "$(med rb-off-c1 rps)") | | $(med rb-off-c1 p50_us) | | $(med rb-off-c1 usec) | |"
    echo "| bare crate c=1, dedupe off ($(all bare-c1 rps)) | $(int "$(med bare-c1 rps)") | | $(dec "$(med bare-c1 p50_us)") | | $(med bare-c1 usec) | $(med bare-c1 cpu_us) |"
    echo "| bench c=1, dedupe off ($(all cs-off-c1 rps)) | $(int "$(med cs-off-c1 rps)") | | $(dec "$(med cs-off-c1 p50_us)") | $(dec "$(med cs-off-c1 p99_us)") | $(med cs-off-c1 usec) | $(med cs-off-c1 cpu_us) |"
    echo
    echo "Ratios, each the median of the per-round ratios (the rounds side by side):"
    echo
    echo "- dedupe off / limit: $(rr cs-off rb-off rps) (target ≥ 0.95x)."
    echo "- dedupe on / limit: $(rr cs-on rb-off rps) (target ≥ 0.8x)."
    echo "- bare crate / limit: $(rr bare rb-off rps); bench dedupe off / bare crate: $(rr cs-off bare rps)."
    echo "- client CPU per decision, bench / bare crate: $(rr cs-off bare cpu_us) (target 2.0 µs,"
    echo "  against a bare crate's 1.5 µs on a quiet machine)."
    echo "- c=1 p50, bench / redis-benchmark -c 1: $(rr cs-off-c1 rb-off-c1 p50_us) (target ≤ 1.1x;"
    echo "  redis-benchmark reports whole µs); bench / bare crate -c 1: $(rr cs-off-c1 bare-c1 p50_us)."
    echo "- Redis µs/call, bench dedupe on / off: $(rr cs-on cs-off usec) (target ≤ 1.5x)."
    echo
    echo "Redis CPU per call of the script under redis-benchmark (c=64 -P 16), dedupe on, against dedupe off:"
    echo
    echo "| case | µs/call (rounds) | vs dedupe off |"
    echo "| --- | ---: | ---: |"
    for c in rb-off:"dedupe off, 1,000 keys" rb-on-sparse:"dedupe on, sparse records (100,000 keys)" \
        rb-on-cap:"dedupe on, one key at its 256-record cap" rb-on-flood:"dedupe on, deny flood on one key" \
        rb-off-flood:"dedupe off, deny flood on one key" rb-on-replay:"dedupe on, a replay (same id)" \
        rb-settle-charge:"settle, dedupe on (sparse): an after-the-fact charge of 1" \
        rb-settle-unknown:"settle, dedupe on (sparse): no live reservation, nothing written"; do
        local_case=${c%%:*}
        echo "| ${c#*:} | $(med "$local_case" usec) ($(all "$local_case" usec)) | $(rr "$local_case" rb-off usec) |"
    done
    echo
    echo "- deny flood, dedupe on / dedupe off (both refusing): $(rr rb-on-flood rb-off-flood usec) (target ≤ 1.5x)."
    echo "- a replay / a fresh evaluation (dedupe on, sparse): $(rr rb-on-replay rb-on-sparse usec) (target ≤ 1.0x)."
    echo "- a settle that charges / a charging decision (dedupe on, sparse): $(rr rb-settle-charge rb-on-sparse usec)."
    echo
    echo "Deny flood: \`bench --policy flood --subjects 1 --concurrency 64\`:"
    echo
    echo "| deny cache | decisions/s (rounds) | denied | EVALSHA per decision | Redis µs/call | client CPU µs/decision |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    if [ "$deny_cache" = yes ]; then
        echo "| on | $(int "$(med cs-flood-cache rps)") ($(all cs-flood-cache rps)) | $(med cs-flood-cache denied_pct) % | $(med cs-flood-cache calls_per_decision) | $(med cs-flood-cache usec) | $(med cs-flood-cache cpu_us) |"
        echo "| off | $(int "$(med cs-flood-nocache rps)") ($(all cs-flood-nocache rps)) | $(med cs-flood-nocache denied_pct) % | $(med cs-flood-nocache calls_per_decision) | $(med cs-flood-nocache usec) | $(med cs-flood-nocache cpu_us) |"
        echo
        echo "- cache on / off: $(rr cs-flood-cache cs-flood-nocache rps) decisions/s (target ≥ 10x)."
    else
        echo "| (no \`redis.deny-cache\` in this build) | $(int "$(med cs-flood-nocache rps)") ($(all cs-flood-nocache rps)) | $(med cs-flood-nocache denied_pct) % | $(med cs-flood-nocache calls_per_decision) | $(med cs-flood-nocache usec) | $(med cs-flood-nocache cpu_us) |"
    fi
    echo
    echo "HTTP: \`ca-skeleton --config config/bench.toml serve\` under \`wrk -t1 -c32 -d${duration}s"
    echo "--latency -s scripts/bench-http.lua\` (\`GET /api/hello\`, 10,000 API keys), the limiter"
    echo "disabled, on the memory provider and on Redis (policy \`fixed\`, dedupe at its defaults);"
    echo "wrk and the server unpinned:"
    echo
    echo "| limiter | requests/s (rounds) | vs disabled | p50 µs | p99 µs | non-2xx |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    for provider in disabled memory redis; do
        echo "| $provider | $(int "$(med "http-$provider" rps)") ($(all "http-$provider" rps)) | $(rr "http-$provider" http-disabled rps) | $(med "http-$provider" p50_us) | $(med "http-$provider" p99_us) | $(med "http-$provider" non_2xx) |"
    done
    if [ -n "$governor_edge" ]; then
        echo
        echo "axum + tower_governor (\`adapter-web/examples/governor_edge.rs\`, keyed by the same"
        echo "\`x-api-key\`), under the same wrk, beside the same server without the governor layer:"
        echo
        echo "| server | requests/s (rounds) | vs its own server | p50 µs | p99 µs | non-2xx |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: |"
        for mode in plain governor; do
            echo "| $mode | $(int "$(med "http-tower-$mode" rps)") ($(all "http-tower-$mode" rps)) | $(rr "http-tower-$mode" http-tower-plain rps) | $(med "http-tower-$mode" p50_us) | $(med "http-tower-$mode" p99_us) | $(med "http-tower-$mode" non_2xx) |"
        done
        echo
        echo "- ours on the memory provider / disabled: $(rr http-memory http-disabled rps) (target ≥ 0.9x);"
        echo "  tower_governor / its own server: $(rr http-tower-governor http-tower-plain rps)."
    fi
    echo
    echo "Envoy RLS over gRPC: \`SECS=$duration ROUNDS=$rounds REDIS=1 cargo bench -p adapter-envoy-rls"
    echo "--bench grpc\` (a tonic client at c=64 over 4 connections, 1,000 subjects, the allowed"
    echo "path; client and server in one process, unpinned; the bench alternates its own rounds):"
    echo
    echo "| limiter | decisions/s (rounds) | vs disabled | p50 µs | p99 µs |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    for provider in disabled memory redis; do
        echo "| $provider | $(int "$(med "envoy-$provider" rps)") ($(all "envoy-$provider" rps)) | $(rr "envoy-$provider" envoy-disabled rps) | $(med "envoy-$provider" p50_us) | $(med "envoy-$provider" p99_us) |"
    done
    echo
    echo "Scale: one thread deciding over N subjects in a fixed pseudo-random order, after one"
    echo "decision for each (\`SCALE_SECS=$duration SCALE_SUBJECTS=$scale_subjects cargo bench -p"
    echo "adapter-memory --bench scale\`, pinned to CPU 1, medians of $rounds rounds). Subjects shaped"
    echo "like the edge's pseudonyms (\`v1:\` + 64 hex), 100 per second per subject (8,640,000 in a"
    echo "one-day fixed window, so the store holds every subject for the run as governor does; GCRA"
    echo "100/s with a burst of 100; governor the same quota keyed by the pseudonym's \`String\`). p99 is sampled: each batch"
    echo "of 64 decisions is timed and its mean recorded; p99 is of those means (a lone slow"
    echo "decision shows diluted 64x; time the thread waits for a CPU counts, so under load p99"
    echo "shows the load). Per CPU s divides by the thread's time on a CPU"
    echo "(\`/proc/thread-self/schedstat\`), which other processes do not move."
    echo
    printf '| contender |'
    for n in ${scale_subjects//,/ }; do
        printf ' %s: decisions/s | per CPU s | p99 ns | allowed |' "$(thousands "$n")"
    done
    echo
    printf '| --- |'
    for n in ${scale_subjects//,/ }; do printf ' ---: | ---: | ---: | ---: |'; done
    echo
    for c in $scale_contenders; do
        printf '| %s |' "$c"
        for n in ${scale_subjects//,/ }; do
            printf ' %s | %s | %s | %s %% |' "$(int "$(med "scale:$c:$n" rps)")" \
                "$(int "$(med "scale:$c:$n" cpu_rps)")" "$(med "scale:$c:$n" p99_ns)" \
                "$(med "scale:$c:$n" allowed_pct)"
        done
        echo
    done
    echo
    for n in ${scale_subjects//,/ }; do
        echo "- $(thousands "$n") subjects, per CPU second, fixed window / governor: $(rr "scale:fixed-window:$n" "scale:governor-keyed:$n" cpu_rps); dedupe on / off: $(rr "scale:fixed-window+dedupe:$n" "scale:fixed-window:$n" cpu_rps)."
    done
    echo
    echo "Memory per subject at $(thousands "$memory_subjects") subjects, one decision each. In process:"
    echo "resident set growth (\`/proc/self/statm\`) over the fill, one process per contender"
    echo "(\`SCALE_PART=rss SCALE_RSS_SUBJECTS=$memory_subjects cargo bench -p adapter-memory --bench scale\`):"
    echo
    echo "| contender | bytes per subject | vs governor |"
    echo "| --- | ---: | ---: |"
    for c in $scale_contenders; do
        echo "| $c | $(rss "$c") | $(ratio "$(rss "$c")" "$(rss governor-keyed)") |"
    done
    echo
    echo "Redis: \`INFO memory\` used_memory growth over the fill through the adapter"
    echo "(\`REDIS_SCALE_SUBJECTS=$memory_subjects cargo run --release -p adapter-redis --example"
    echo "redis_scale\`, a private $(redis-server --version | awk '{print $3}'), one-day windows); the floor is"
    echo "a plain \`SET key value PX ttl\` of the same key names (the fixed window's), the value as"
    echo "long as its state and the TTL its \`PTTL\` after the fill:"
    echo
    echo "| case | bytes per subject | vs floor | key length | type | state length | PTTL ms | MEMORY USAGE of one key |"
    echo "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"
    for c in dedupe-off dedupe-on gcra lease-acquire-release floor-set; do
        echo "| $c | $(rmem "$c" 4) | $(ratio "$(rmem "$c" 4)" "$(rmem floor-set 4)") | $(rmem "$c" 5) | $(rmem "$c" 6) | $(rmem "$c" 7) | $(rmem "$c" 8) | $(rmem "$c" 9) |"
    done
    echo
    echo "- dedupe off / the floor: $(ratio "$(rmem dedupe-off 4)" "$(rmem floor-set 4)") (target ≤ 2x)."
    echo "- dedupe on holds one record per key here; its bound is the record cap: \`MEMORY USAGE\` of"
    echo "  one key with 1 record $(rcap 1) bytes, at the cap ($(awk '$1 == "redis-cap" && $3 != 1 {print $3}' \
        "$work/redis-mem.out") records) $(awk '$1 == "redis-cap" && $3 != 1 {print $4}' "$work/redis-mem.out") bytes."
    if [ -n "$criterion" ]; then
        echo
        echo "Memory provider, one keyed decision: \`cargo bench -p adapter-memory --bench decisions --"
        echo "${criterion_times[*]}\` (pinned to CPU 1, so the 2-thread cases share one"
        echo "CPU and show contention, not scaling; criterion's median, one run):"
        echo
        echo "| case | median |"
        echo "| --- | ---: |"
        echo "$criterion" | awk '{printf "| %s | %s %s |\n", $1, $2, $3}'
    fi
    echo
    if grep -q '^conditions:' "$work/limitador.out"; then
        echo "The Envoy RLS on Redis beside Kuadrant/limitador's server on the same Redis"
        echo "(\`scripts/bench-limitador.sh\`, whose header says what each column is):"
        echo
        echo '```'
        cat "$work/limitador.out"
        echo '```'
    else
        echo "Beside Kuadrant/limitador: not measured ($(cat "$work/limitador.out"))."
    fi
    echo "<!-- bench.sh:end -->"
} >"$work/table"

if [ "$doc" = - ]; then
    cat "$work/table"
    exit 0
fi
# Replace the generated section, or append it the first time.
if grep -q '^<!-- bench.sh:begin' "$doc"; then
    awk -v table="$work/table" '
        /^<!-- bench.sh:begin/ {while ((getline l < table) > 0) print l; skip = 1; next}
        /^<!-- bench.sh:end/ {skip = 0; next}
        !skip {print}' "$doc" >"$work/doc"
    cp "$work/doc" "$doc"
else
    { echo; cat "$work/table"; } >>"$doc"
fi
echo "bench.sh: wrote the table into $doc" >&2
