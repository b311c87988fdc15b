#!/usr/bin/env bash
# Dynamo 1.6.1 with a KServe gRPC frontend, for bench.serving --protocols grpc http.
# 1) the kit's dynamo_up.sh, unmodified: nats + HTTP frontend (OpenAI) + mocker;
# 2) a second dynamo.frontend in --kserve-grpc-server mode (a gRPC-mode frontend serves NO
#    OpenAI HTTP routes), sharing the same workers through the same file-discovery dir, started
#    through frontend_with_template.py so that a request template sets max_tokens (Dynamo's
#    KServe path ignores request `parameters`; the mocker refuses requests without max_tokens).
# Knobs: all of dynamo_up.sh's, plus
#   GRPC_PORT [18103]  GRPC_METRICS_PORT [18104]  MAX_TOKENS [32]  (one value per frontend start)
set -euo pipefail
HERE0="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KIT="${KIT:-$(cd "$HERE0/../../../shared/bench" && pwd)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="$HOME/.cache/jetserve-bench"
VENV="${VENV:-$CACHE/dynamo-venv}"
MODEL_NAME="${MODEL_NAME:-Qwen/Qwen3-0.6B}"
ROUTER_MODE="${ROUTER_MODE:-round-robin}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
REQUEST_PLANE="${REQUEST_PLANE:-tcp}"
EVENT_PLANE="${EVENT_PLANE:-nats}"
NATS_PORT="${NATS_PORT:-14222}"
GRPC_PORT="${GRPC_PORT:-18103}"
GRPC_METRICS_PORT="${GRPC_METRICS_PORT:-18104}"
MAX_TOKENS="${MAX_TOKENS:-32}"
RUN_DIR="${RUN_DIR:-${TMPDIR:-/tmp}/jetserve-bench-dynamo}"
export RUN_DIR VENV MODEL_NAME ROUTER_MODE BLOCK_SIZE REQUEST_PLANE EVENT_PLANE NATS_PORT

for p in "$GRPC_PORT" "$GRPC_METRICS_PORT"; do
  ss -ltn | awk '{print $4}' | grep -qE "[:.]$p\$" && { echo "kserve_up: port $p in use" >&2; exit 1; }
done
"$KIT/dynamo_up.sh"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"

printf '{"model": "%s", "temperature": 0.0, "max_completion_tokens": %d}\n' "$MODEL_NAME" "$MAX_TOKENS" \
  > "$RUN_DIR/request_template.json"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NATS_SERVER="nats://127.0.0.1:${NATS_PORT}"
export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV="$RUN_DIR/dynkv"
export DYN_TCP_RPC_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1
export DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
export DYN_LOG="${DYN_LOG:-warn}" DYN_REQUEST_TEMPLATE="$RUN_DIR/request_template.json"
# --http-port is the gRPC port in this mode; --http-host is ignored (it binds 0.0.0.0).
"$VENV/bin/python" "$HERE/frontend_with_template.py" --kserve-grpc-server \
  --http-host 127.0.0.1 --http-port "$GRPC_PORT" --grpc-metrics-port "$GRPC_METRICS_PORT" \
  --discovery-backend file --request-plane "$REQUEST_PLANE" --event-plane "$EVENT_PLANE" \
  --router-mode "$ROUTER_MODE" --kv-cache-block-size "$BLOCK_SIZE" \
  > "$RUN_DIR/frontend_grpc.log" 2>&1 &
echo $! > "$RUN_DIR/frontend_grpc.pid"
ok=0
for ((i = 0; i < 600; i++)); do  # up to 60 s: the model is listed on the gRPC frontend's metrics port
  kill -0 "$(cat "$RUN_DIR/frontend_grpc.pid")" 2>/dev/null || break
  if curl -sf "http://127.0.0.1:$GRPC_METRICS_PORT/v1/models" 2>/dev/null | grep -qF "\"$MODEL_NAME\""; then ok=1; break; fi
  sleep 0.1
done
if [ "$ok" != 1 ]; then
  echo "kserve_up: gRPC frontend not ready; log tail:" >&2; tail -n 20 "$RUN_DIR/frontend_grpc.log" >&2
  "$HERE/kserve_down.sh" >&2 || true
  exit 1
fi
sleep 1
echo "ready-grpc: 127.0.0.1:$GRPC_PORT (metrics http://127.0.0.1:$GRPC_METRICS_PORT/metrics) max_tokens=$MAX_TOKENS" \
     "pids: $(for f in "$RUN_DIR"/*.pid; do printf '%s=%s ' "$(basename "$f" .pid)" "$(cat "$f")"; done)"
