#!/usr/bin/env bash
# KServe gRPC, JetServe against Dynamo 1.6.1's frontend (--kserve-grpc-server) + mocker, the same
# client (bench.serving's grpc and grpc-grpcio), workloads (a) and (b), alternated, ROUNDS times.
# Dynamo takes max_tokens only from a request template, so its stack is started per workload.
# Prints one JSON line per run with "system". Needs the Dynamo reference bench kit installed
# (install_dynamo.sh, make_model_dir.py). Usage: bench/dynamo/compare_kserve.sh [ROUNDS]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
ROUNDS="${1:-2}"
export RUN_DIR="${RUN_DIR:-${TMPDIR:-/tmp}/jetserve-bench-dynamo-kserve}"
export HTTP_PORT="${HTTP_PORT:-18100}" NATS_PORT="${NATS_PORT:-14322}"
export GRPC_PORT="${GRPC_PORT:-18103}" GRPC_METRICS_PORT="${GRPC_METRICS_PORT:-18104}"
tag() { "$PY" -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        print(json.dumps({"system": sys.argv[1], **json.loads(line)}), flush=True)' "$1"; }
cd "$ROOT"
for ((round = 1; round <= ROUNDS; round++)); do
  for workload in a b; do
    tokens=32; [ "$workload" = b ] && tokens=64
    MAX_TOKENS=$tokens "$HERE/kserve_up.sh" >&2
    trap '"$HERE/kserve_down.sh" >&2' EXIT
    "$PY" -m bench.serving --url "http://127.0.0.1:$HTTP_PORT" --grpc "127.0.0.1:$GRPC_PORT" \
      --protocols grpc grpc-grpcio --workloads "$workload" \
      --pids "frontend=$(cat "$RUN_DIR/frontend_grpc.pid")" "mocker=$(cat "$RUN_DIR/mocker.pid")" \
             "nats=$(cat "$RUN_DIR/nats.pid")" | tag dynamo
    "$HERE/kserve_down.sh" >&2
    trap - EXIT
    "$PY" -m bench.serving --protocols grpc grpc-grpcio --workloads "$workload" 2>/dev/null | tag jetserve
  done
done
