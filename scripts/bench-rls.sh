#!/usr/bin/env bash
# The Envoy RLS over gRPC with server and client on different CPUs: the
# release binary serves config/bench.toml's RLS rule with the limiter off
# (`provider = "disabled"`, the same listener answering OK) and on the
# memory provider, alternating ROUNDS times; the client is the grpc bench
# in its ADDR mode (concurrency 64 over 4 connections, 1,000 subjects).
# Prints each run and the median ratio memory / disabled.
#
#   ROUNDS=3 SECS=5 scripts/bench-rls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3} secs=${SECS:-5}
pin_server=() pin_client=()
if [ "$(nproc)" -ge 2 ]; then pin_server=(taskset -c 0) pin_client=(taskset -c 1); fi

cargo build -q --release -p app-bootstrap
cargo bench -q -p adapter-envoy-rls --bench grpc --no-run 2>/dev/null
bin=target/release/ca-skeleton
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# one <provider>: decisions/s of one run
one() {
    local provider=$1 http rls pid
    http=$(free_port) rls=$(free_port)
    CA_SKELETON_SERVER__LISTEN="127.0.0.1:$http" CA_SKELETON_ENVOY_RLS__LISTEN="127.0.0.1:$rls" \
        CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER="$provider" \
        "${pin_server[@]}" "$bin" --config config/bench.toml serve >/dev/null 2>"$work/serve.log" &
    pid=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$http/healthz" >/dev/null && break; sleep 0.1; done
    ADDR="127.0.0.1:$rls" SECS=$secs "${pin_client[@]}" cargo bench -q -p adapter-envoy-rls --bench grpc 2>/dev/null |
        awk -v p="$provider" '/c=/ {sub("/s", "", $3); print p, $3, $5, $8}'
    kill -TERM "$pid"
    wait "$pid" || true
}

printf 'provider decisions/s p50_us p99_us\n'
for _ in $(seq "$rounds"); do
    one disabled
    one memory
done | tee "$work/runs"
awk '$1 == "disabled" {d[++n] = $2} $1 == "memory" {m[++k] = $2}
    END {for (i = 1; i <= n; i++) printf "%.3f\n", m[i] / d[i]}' "$work/runs" | sort -n |
    awk '{r[++n] = $1} END {printf "median memory / disabled over %d rounds: %s\n", n, r[int((n + 1) / 2)]}'
