#!/usr/bin/env bash
# Stop what kserve_up.sh started: the gRPC frontend (its PID file only, cmdline checked),
# then the kit's dynamo_down.sh for mocker, HTTP frontend and nats (same RUN_DIR).
HERE0="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KIT="${KIT:-$(cd "$HERE0/../../../shared/bench" && pwd)}"
RUN_DIR="${RUN_DIR:-${TMPDIR:-/tmp}/jetserve-bench-dynamo}"
f="$RUN_DIR/frontend_grpc.pid"
if [ -f "$f" ]; then
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF frontend_with_template.py; then
    kill -TERM "$pid"
    for _ in $(seq 1 80); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "stopped frontend_grpc ($pid) with SIGKILL"; else echo "stopped frontend_grpc ($pid)"; fi
  else
    echo "frontend_grpc ($pid) not running (or PID reused); left alone"
  fi
  rm -f "$f"
fi
RUN_DIR="$RUN_DIR" "$KIT/dynamo_down.sh"
