#!/usr/bin/env bash
# GPU benchmark of the transformers engine (issue 11): HfEngine in-process, then the whole
# JetServe stack over HTTP, at concurrency 1, 16 and 64 (bench/gpu/engine_bench.py says more).
#
#   bash bench/gpu/run.sh                       # on the GPU machine; figures to $OUT (or --out)
#   bash bench/gpu/run.sh --tiny --device cpu   # a CPU smoke run with a 2-layer toy model
#
# JetServe's own dependencies may be installed with `pip install --target DIR` and put on
# PYTHONPATH (bench/gpu/wheels.sh); nats-server then lives in DIR/bin, which goes on PATH here.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
IFS=: read -ra entries <<< "${PYTHONPATH:-}"
for entry in "${entries[@]}"; do
  if [ -n "$entry" ] && [ -f "$entry/bin/nats-server" ]; then
    chmod +x "$entry/bin/nats-server" 2>/dev/null || true
    export PATH="$entry/bin:$PATH"
  fi
done
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
args=()
if [ -n "${OUT:-}" ]; then args+=(--out "$OUT"); fi
exec "$PY" -m bench.gpu.engine_bench "${args[@]}" "$@"
