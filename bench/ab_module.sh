#!/usr/bin/env bash
# Before/after for a benchmark module: `python -m MODULE ARGS` run from two trees in turn
# (DIR_A, DIR_B; the order swapped every round), ROUNDS times, each JSON line it prints tagged
# with its side and round; the load average is in each line. The trees share this venv (an
# editable install: the module and the services it starts come from the tree it runs in).
#
#   DIR_A=/tmp/old DIR_B=. ROUNDS=3 bash bench/ab_module.sh bench.grpc_server_cost --rounds 1
#   DIR_A=/tmp/old ROUNDS=3 bash bench/ab_module.sh bench.gateway_cost --rounds 1
set -eu
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
A="$(cd "${DIR_A:?DIR_A: the before tree}" && pwd)"; B="$(cd "${DIR_B:-$ROOT}" && pwd)"
MODULE="${1:?a module, e.g. bench.grpc_server_cost}"; shift
for round in $(seq 1 "${ROUNDS:-3}"); do
  order="A B"; [ $((round % 2)) = 0 ] && order="B A"
  for side in $order; do
    dir=$A; [ "$side" = B ] && dir=$B
    (cd "$dir" && "$PY" -m "$MODULE" "$@") | while IFS= read -r line; do
      case "$line" in
        "{"*) printf '{"side": "%s", "tree": "%s", "ab_round": %s, %s\n' "$side" "$dir" "$round" "${line#\{}" ;;
        *) printf '%s\n' "$line" ;;
      esac
    done
  done
done
