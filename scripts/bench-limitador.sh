#!/usr/bin/env bash
# Our Envoy RLS on the Redis provider beside Kuadrant/limitador's
# limitador-server on the same private redis-server, the same limit on the
# same descriptors, the same load generator.
#
#   LIMITADOR_SRC=/path/to/limitador ROUNDS=3 SECS=5 scripts/bench-limitador.sh
#
# LIMITADOR_SRC is a Kuadrant/limitador source checkout (its workspace
# root); nothing is fetched here. Without it, without `protoc`, or when the
# peer does not build, the script says why and exits 0. The peer is built
# from a copy under LIMITADOR_BUILD_DIR (target/limitador-peer), its own
# target dir inside, with this command (run in the copy):
#
#   CARGO_TARGET_DIR=$LIMITADOR_BUILD_DIR/target CARGO_PROFILE_RELEASE_LTO=false \
#     CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 OPENSSL_NO_VENDOR=1 \
#     cargo build --release --locked -p limitador-server
#
# The copy differs from the checkout only in its build: `limitador` is
# taken without its default `disk_storage` feature (RocksDB, whose C++ build
# takes longer than the rest together), with a stub
# `storage::disk::OptimizeFor` so the server's `disk` subcommand still
# compiles (it then refuses to start), and with its `storage::keys::bin`
# module and `variables_for_key`, which the redis storage uses too,
# compiled without that feature. The release profile is ours (cargo's
# default: no LTO, 16 codegen units) for both servers, where limitador's
# own manifest asks for fat LTO and one codegen unit; OpenSSL is the
# system's instead of a vendored build.
# A copy is made once per checkout commit (LIMITADOR_REFRESH=1 makes it
# again).
#
# The limit, for both: domain `edge`, descriptor key `remote_address`, each
# value its own counter, a fixed window of 60 s holding 1,000,000,000, so
# every call is allowed (the ok/over columns show it); the calls spread over
# SUBJECTS (10,000) values. Ours: a generated config with that one rule on a
# fixed-window policy, dedupe off (limitador keeps no dedupe records).
# Limitador: a limits file, namespace `edge`, `variables:
# ["descriptors[0].remote_address"]`, `conditions: []`.
#
# Pinning (two CPUs): redis-server on CPU 0, the RLS server under test alone
# on CPU 1, the load generator on CPU 0 beside redis-server. One CPU each
# for three processes is not to be had on two; this way each server under
# test has a whole CPU and never shares it with the client, the same for
# both contenders, and what each process spends a decision is measured
# apart (the CPU columns), which stays comparable whichever CPU fills
# first. The client is not lighter than Redis: about 35 µs a decision at
# c=64 against Redis's 14 (limitador) to 31 (ours), so at c=64 CPU 0 can
# be what limits a run; the cpu0 / cpu1 columns say which did.
#
# Each run, ROUNDS times alternating at c=64 and at c=1 (the grpc bench's
# ADDR mode: 4 connections, SECS seconds): ours on Redis, limitador on
# `redis`, limitador on `redis_cached` (its defaults: counters kept in
# process and flushed to Redis in batches, so its Redis CPU per decision
# is not comparable and it trades accuracy away, as its configuration
# guide says).
# Columns: decisions/s, p50 and p99 (µs), calls answered OK and OVER_LIMIT,
# Redis CPU (INFO cpu used_cpu_sys + used_cpu_user, before and after), the
# server's (/proc/PID/stat) and the client's CPU (bash's `time`), each in µs
# per decision, and how busy that made CPU 0 (Redis + client) and CPU 1
# (the server), in CPUs: the one near 1 is the bottleneck of that run.
# FLUSHALL before each run.
#
# Then exactness: one instance, then two, of each server on the one Redis, a
# limit of EXACT_LIMIT (100) per hour on one descriptor value, EXACT_CALLS
# (1,000) calls at c=64 spread over the instances; the OK count must be the
# limit exactly. Ours failing that fails the script; limitador's counts are
# reported (its `redis` storage reads the counter, then increments it, in
# two round trips: concurrent calls all pass the read).
#
# Needs redis-server, redis-cli, curl, python3, taskset (two CPUs), cargo,
# protoc (Debian: protobuf-compiler) and, for OPENSSL_NO_VENDOR, the system
# OpenSSL headers (Debian: libssl-dev).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3} secs=${SECS:-5} subjects=${SUBJECTS:-10000}
exact_limit=${EXACT_LIMIT:-100} exact_calls=${EXACT_CALLS:-1000}
build_dir=${LIMITADOR_BUILD_DIR:-target/limitador-peer}

skip() {
    echo "bench-limitador.sh: skipped: $*"
    exit 0
}
[ -n "${LIMITADOR_SRC:-}" ] || skip "LIMITADOR_SRC is unset (the path of a Kuadrant/limitador checkout)"
[ -f "$LIMITADOR_SRC/limitador-server/Cargo.toml" ] ||
    skip "LIMITADOR_SRC=$LIMITADOR_SRC holds no limitador-server/Cargo.toml"
command -v protoc >/dev/null 2>&1 || skip "protoc is missing (Debian: apt-get install protobuf-compiler)"
for tool in redis-server redis-cli curl python3 cargo; do
    command -v "$tool" >/dev/null 2>&1 || { echo "bench-limitador.sh: $tool is missing" >&2; exit 2; }
done
pin_redis=() pin_server=() pin_load=()
if [ "$(nproc)" -ge 2 ]; then pin_redis=(taskset -c 0) pin_server=(taskset -c 1) pin_load=(taskset -c 0); fi

# The peer: a copy of the checkout, patched as above, built in release.
src=$(cd "$LIMITADOR_SRC" && pwd)
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
stamp="$src $(git -C "$src" rev-parse HEAD 2>/dev/null || echo no-git)"
if [ "${LIMITADOR_REFRESH:-}" = 1 ] || [ "$(cat "$build_dir/src.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$build_dir/src"
    cp -r "$src" "$build_dir/src"
    rm -rf "$build_dir/src/target"
    python3 - "$build_dir/src" <<'EOF' || skip "the limitador checkout does not take the bench's patch (see above)"
import pathlib, sys
root = pathlib.Path(sys.argv[1])
def edit(rel, old, new):
    p = root / rel
    s = p.read_text()
    if old not in s:
        sys.exit(f"bench-limitador.sh: no {old!r} in {rel}")
    p.write_text(s.replace(old, new, 1))
edit("limitador-server/Cargo.toml", 'limitador = { path = "../limitador" }',
     'limitador = { path = "../limitador", default-features = false, features = ["redis_storage"] }')
edit("limitador/src/storage/mod.rs", '#[cfg(feature = "disk_storage")]\npub mod disk;',
     '#[cfg(feature = "disk_storage")]\npub mod disk;\n#[cfg(not(feature = "disk_storage"))]\n'
     'pub mod disk {\n    #[derive(PartialEq, Eq, Debug)]\n    pub enum OptimizeFor {\n'
     '        Space,\n        Throughput,\n    }\n}')
# keys.rs calls its `bin` encoding on the redis path too, but gates it (and
# the counter method it uses) on disk_storage: without that feature it would
# not compile.
edit("limitador/src/storage/keys.rs", '#[cfg(feature = "disk_storage")]\npub mod bin {', 'pub mod bin {')
edit("limitador/src/counter.rs", '#[cfg(feature = "disk_storage")]\n    pub(crate) fn variables_for_key',
     'pub(crate) fn variables_for_key')
edit("limitador-server/src/main.rs", "use limitador::storage::disk::DiskStorage;\n", "")
edit("limitador-server/src/main.rs", "DiskStorage::open(cfg.path.as_str(), cfg.optimization)",
     'Err::<limitador::storage::in_memory::InMemoryStorage, String>'
     '(format!("disk storage not built: {:?}", cfg.optimization))')
EOF
    echo "$stamp" >"$build_dir/src.stamp"
fi
echo "bench-limitador.sh: building limitador-server (log: $build_dir/build.log)" >&2
(cd "$build_dir/src" && CARGO_TARGET_DIR="$build_dir/target" CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 OPENSSL_NO_VENDOR=1 \
    cargo build --release --locked -p limitador-server) >"$build_dir/build.log" 2>&1 ||
    { tail -20 "$build_dir/build.log"; skip "limitador-server did not build (above, the end of its log)"; }
peer="$build_dir/target/release/limitador-server"

echo "bench-limitador.sh: building ours" >&2
cargo build -q --release --locked -p app-bootstrap >&2
grpc_bin=$(cargo bench --locked -p adapter-envoy-rls --bench grpc --no-run 2>&1 |
    sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
[ -x "$grpc_bin" ] || { echo "bench-limitador.sh: no grpc bench binary" >&2; exit 1; }
ours="${CARGO_TARGET_DIR:-target}/release/ca-skeleton"

work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
[ "$port" != 6379 ] || port=$(free_port)
servers=()
cleanup() {
    local pid
    for pid in "${servers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"${pin_redis[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --logfile "$work/redis.log" --dir "$work"
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$port" "$@"; }
redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
tick=$(getconf CLK_TCK)
proc_cpu() { awk -v t="$tick" '{printf "%.6f", ($14 + $15) / t}' "/proc/$1/stat"; }

# config <limit> <window>: ours, one RLS rule on one fixed-window policy.
config() {
    cat <<EOF
[capabilities.rate-limit]
provider = "redis"
default-policy = "peer"

[capabilities.rate-limit.policies.peer]
algorithm = "fixed-window"
limit = $1
window = "$2s"
evaluation-dedup = { enabled = false }

[pseudonymizer.keys]
1 = "benchmark-only-key-not-a-secret-0123456789"

[redis]
enabled = true
urls = ["redis://127.0.0.1:$port"]
key-prefix = "bench:"

[[envoy-rls.rules]]
domain = "edge"
descriptor = ["remote_address"]
policies = "peer"
EOF
}
# limits <limit> <window>: limitador's, the same limit.
limits() {
    cat <<EOF
- namespace: edge
  max_value: $1
  seconds: $2
  conditions: []
  variables: ["descriptors[0].remote_address"]
EOF
}
config 1000000000 60 >"$work/ours.toml"
config "$exact_limit" 3600 >"$work/ours-exact.toml"
limits 1000000000 60 >"$work/limits.yaml"
limits "$exact_limit" 3600 >"$work/limits-exact.yaml"

# start <contender> <load|exact>: one server under test on CPU 1, a child
# of this shell; sets pid and rls (its port) and adds it to servers.
start() {
    local http ready=0 suffix="" health
    [ "$2" = exact ] && suffix=-exact
    http=$(free_port) rls=$(free_port)
    case $1 in
    ours)
        CA_SKELETON_SERVER__LISTEN="127.0.0.1:$http" CA_SKELETON_ENVOY_RLS__LISTEN="127.0.0.1:$rls" \
            "${pin_server[@]}" "$ours" --config "$work/ours$suffix.toml" serve \
            >/dev/null 2>>"$work/ours.log" &
        pid=$! health="http://127.0.0.1:$http/healthz" ;;
    limitador-redis | limitador-redis_cached)
        "${pin_server[@]}" "$peer" -b 127.0.0.1 -p "$rls" -B 127.0.0.1 -P "$http" \
            "$work/limits$suffix.yaml" "${1#limitador-}" "redis://127.0.0.1:$port" \
            >/dev/null 2>>"$work/limitador.log" &
        pid=$! health="http://127.0.0.1:$http/status" ;;
    esac
    servers+=("$pid")
    for _ in $(seq 100); do
        if curl -sf "$health" >/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$rls") 2>/dev/null; then
            ready=1
            break
        fi
        sleep 0.1
    done
    if [ "$ready" != 1 ]; then
        cat "$work/ours.log" "$work/limitador.log" 2>/dev/null >&2
        echo "bench-limitador.sh: $1 did not start" >&2
        exit 1
    fi
}
# stop: every server started, ended and waited for.
stop() {
    local one
    for one in "${servers[@]}"; do kill -TERM "$one"; done
    for one in "${servers[@]}"; do wait "$one" 2>/dev/null || true; done
    servers=()
}

# one <contender> <concurrency>: one run, one line of the table.
one() {
    local r0 r1 s0 s1 out c
    rcli FLUSHALL >/dev/null
    start "$1" load
    r0=$(redis_cpu) s0=$(proc_cpu "$pid")
    # The client's user + sys seconds come last, from bash's `time`.
    out=$( { TIMEFORMAT='%U %S'; time ADDR="127.0.0.1:$rls" SECS=$secs CONCURRENCY=$2 \
        SUBJECTS=$subjects REQUESTS=0 "${pin_load[@]}" "$grpc_bin" 2>/dev/null; } 2>&1 )
    r1=$(redis_cpu) s1=$(proc_cpu "$pid")
    stop
    c=$(printf '%s\n' "$out" | tail -1)
    printf '%s\n' "$out" | awk -v who="$1" -v n="$2" -v r="$r0 $r1" -v s="$s0 $s1" -v c="$c" '/ c=/ {
        sub("/s", "", $3); split(r, rr, " "); split(s, ss, " "); split(c, cc, " ")
        d = $11 + $13; if (d == 0) d = 1
        ru = (rr[2] - rr[1]) * 1e6 / d; su = (ss[2] - ss[1]) * 1e6 / d; cu = (cc[1] + cc[2]) * 1e6 / d
        printf "%-24s %3d %9.0f %6d %7d %9d %5d %8.2f %8.2f %8.2f %5.2f %5.2f\n", who, n, $3, $5, $8,
            $11, $13, ru, su, cu, (ru + cu) * $3 / 1e6, su * $3 / 1e6}' |
        tee -a "$work/runs"
}

echo "conditions: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')," \
    "redis-server on CPU 0, server under test on CPU 1, load generator on CPU 0;" \
    "SECS=$secs ROUNDS=$rounds SUBJECTS=$subjects; $(date -u '+%Y-%m-%d %H:%M UTC')"
header() {
    printf '%-31s %3s %9s %6s %7s %9s %5s %8s %8s %8s %5s %5s\n' "$1" c decisions/s p50_us p99_us \
        ok over redis_us server_us client_us cpu0 cpu1
}
header contender
for _ in $(seq "$rounds"); do
    for c in 64 1; do
        for who in ours limitador-redis limitador-redis_cached; do one "$who" "$c"; done
    done
done
# The median of each column over the rounds.
header median
python3 - "$work/runs" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    runs.setdefault((f[0], int(f[1])), []).append([float(x) for x in f[2:]])
for (who, c), rows in runs.items():
    m = [statistics.median(col) for col in zip(*rows)]
    print(f"{'median ' + who:<31} {c:>3} {m[0]:9.0f} {m[1]:6.0f} {m[2]:7.0f} {m[3]:9.0f}"
          f" {m[4]:5.0f} {m[5]:8.2f} {m[6]:8.2f} {m[7]:8.2f} {m[8]:5.2f} {m[9]:5.2f}")
EOF

# exact <contender> <instances>: that many instances on the one Redis, one
# descriptor value, EXACT_CALLS calls over them; the OK count in $work/exact.
exact() {
    local addrs=""
    # Ours counts in windows aligned to the hour: keep the burst inside one.
    while [ $(($(date +%s) % 3600)) -gt 3590 ]; do sleep 1; done
    rcli FLUSHALL >/dev/null
    for _ in $(seq "$2"); do
        start "$1" exact
        addrs="$addrs${addrs:+,}127.0.0.1:$rls"
    done
    ADDR=$addrs REQUESTS=$exact_calls CONCURRENCY=64 SUBJECTS=1 \
        "${pin_load[@]}" "$grpc_bin" 2>/dev/null | awk '/ c=/ {print $11}' >"$work/exact"
    stop
}
echo "exactness: $exact_calls calls at c=64 on one descriptor value, a limit of $exact_limit an hour," \
    "one instance and two instances on one Redis"
status=0
for who in ours limitador-redis limitador-redis_cached; do
    for n in 1 2; do
        exact "$who" "$n"
        ok=$(cat "$work/exact")
        verdict="the limit exactly"
        [ "$ok" = "$exact_limit" ] || verdict="not the limit"
        echo "  $who, $n instance(s): ${ok:-no answer} OK ($verdict)"
        if [ "$who" = ours ] && [ "$ok" != "$exact_limit" ]; then status=1; fi
    done
done
exit "$status"
