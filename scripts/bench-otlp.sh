#!/usr/bin/env bash
# HTTP on the memory provider with trace export off, on at sample-ratio 1.0
# and on at 0.01, side by side, ROUNDS times alternating (docs/benchmarks.md,
# "Traces"). The collector is a local sink that answers every OTLP/HTTP
# export 200, so the figure is our side of the export: the spans, the batch
# processor and the protobuf requests. Prints one line per run and the
# medians' ratios to export off.
#
#   ROUNDS=3 DURATION=5 scripts/bench-otlp.sh
#
# Needs wrk, curl, python3 (the sink) and awk.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-3}
duration=${DURATION:-5}
for tool in wrk curl python3 awk; do
    command -v "$tool" >/dev/null || { echo "bench-otlp.sh: $tool is missing" >&2; exit 1; }
done
work=$(mktemp -d)
sink_pid=
cleanup() { [ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cargo build --release -q -p app-bootstrap --bin ca-skeleton
bin=target/release/ca-skeleton

sink_port=$(free_port)
python3 - "$sink_port" <<'EOF' &
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
EOF
sink_pid=$!

run() { # run <case> [VAR=value ...]
    local case=$1 port pid up=no
    shift
    port=$(free_port)
    env CA_SKELETON_SERVER__LISTEN="127.0.0.1:$port" \
        CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER=memory \
        CA_SKELETON_REDIS__ENABLED=false "$@" \
        "$bin" --config config/bench.toml serve >/dev/null 2>"$work/serve.log" &
    pid=$!
    for _ in $(seq 200); do
        curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && { up=yes; break; }
        sleep 0.1
    done
    [ "$up" = yes ] || { cat "$work/serve.log" >&2; exit 1; }
    wrk -t1 -c32 -d"${duration}s" -s scripts/bench-http.lua --latency "http://127.0.0.1:$port" |
        awk -v c="$case" '
            function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; return v * 1e6 }
            /Requests\/sec/ {rps = $2} / 99%/ {p99 = us($2)} /Non-2xx/ {bad = $5}
            END {printf "%s rps %d p99_us %d non_2xx %d\n", c, rps, p99, bad + 0}'
    kill -TERM "$pid"
    wait "$pid" || true
}

endpoint="CA_SKELETON_TELEMETRY__OTLP__ENDPOINT=http://127.0.0.1:$sink_port"
for round in $(seq "$rounds"); do
    echo "bench-otlp.sh: round $round of $rounds" >&2
    run off
    run on-1.0 "$endpoint" CA_SKELETON_TELEMETRY__OTLP__SAMPLE_RATIO=1.0
    run on-0.01 "$endpoint" CA_SKELETON_TELEMETRY__OTLP__SAMPLE_RATIO=0.01
done | tee "$work/runs"
awk '{rps[$1] = rps[$1] " " $3}
     function median(list,   n, v, i, j, t) {
         n = split(list, v, " ")
         for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
         return v[int((n + 1) / 2)]
     }
     END {
         off = median(rps["off"])
         printf "median rps: off %d, on at 1.0 %d (%.2fx), on at 0.01 %d (%.2fx)\n",
             off, median(rps["on-1.0"]), median(rps["on-1.0"]) / off,
             median(rps["on-0.01"]), median(rps["on-0.01"]) / off
     }' "$work/runs"
