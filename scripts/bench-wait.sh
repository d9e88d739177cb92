#!/usr/bin/env bash
# `ca-skeleton bench` on a local six-node Redis Cluster (3 masters, 1 replica
# each), with and without replica-acknowledged charges (`wait-replicas`),
# side by side in one run. Usage: scripts/bench-wait.sh [path/to/ca-skeleton]
# Needs redis-server and redis-cli; uses ports 7411-7416 and 17411-17416
# (never 6379). Prints one JSON line per run, prefixed by its settings.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ca-skeleton}
duration=${DURATION:-10s}
ports=(7411 7412 7413 7414 7415 7416)
dir=$(mktemp -d)

cleanup() {
    for port in "${ports[@]}"; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

for port in "${ports[@]}"; do
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
        --cluster-port $((port + 10000)) --cluster-config-file nodes.conf \
        --cluster-node-timeout 1000 --cluster-require-full-coverage no \
        --save "" --appendonly no --dir "$dir/$port" --daemonize yes --logfile "$dir/$port.log"
done
for port in "${ports[@]}"; do
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 \
    --cluster-yes >/dev/null
until redis-cli -p 7411 cluster info | grep -q cluster_state:ok; do sleep 0.1; done
sleep 2 # replicas finish their first sync

urls=$(printf 'redis://127.0.0.1:%s,' "${ports[@]}")
for wait in 0 1; do
    for concurrency in 1 64; do
        printf 'wait-replicas=%s concurrency=%s ' "$wait" "$concurrency"
        CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER=redis \
        CA_SKELETON_REDIS__TOPOLOGY=cluster \
        CA_SKELETON_REDIS__URLS="${urls%,}" \
        CA_SKELETON_REDIS__WAIT_REPLICAS="$wait" \
            "$bin" --config config/bench.toml bench --policy fixed \
            --concurrency "$concurrency" --subjects 10000 --duration "$duration"
    done
done
