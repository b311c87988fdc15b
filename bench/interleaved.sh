#!/usr/bin/env bash
# Interleaved A/B (and Dynamo): two JetServe stacks up at once (trees DIR_A and DIR_B, or one tree
# with an environment variable VAR set to A and to B), optionally Dynamo 1.6.1 too (DYN=1, the
# Dynamo reference bench kit, KIT), and the kit's loadgen run against each in turn, CYCLES times N requests:
# every system sees the same machine state (this 2-core VM's speed drifts by tens of percent
# within minutes, so runs minutes apart do not compare). Prints per-side medians, per-cycle ratios.
#
#   bash bench/interleaved.sh                              # this tree against itself
#   DIR_A=/path/to/old/clone DYN=1 CYCLES=10 N=60 bash bench/interleaved.sh
#   VAR=SOME_ENV A=0 B=1 C=64 MT=64 N=1000 CYCLES=3 bash bench/interleaved.sh
# (make bench-c1 is the fresh-start, alternated-rounds comparison with Dynamo the issue asks for.)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
KIT="${KIT:-$ROOT/../shared/bench}"; KV="${KIT_VENV:-$HOME/.cache/jetserve-bench/dynamo-venv}/bin/python"
MODEL_DIR="${MODEL_DIR:-$HOME/.cache/jetserve-bench/qwen3-model}"
VAR="${VAR:-JETSERVE_BENCH_SIDE}"; A="${A:-A}"; B="${B:-B}"
cd "$ROOT"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
declare -A RUNS PIDS URLS
for side in A B; do
  val=${!side}
  RUN=$(mktemp -d); RUNS[$side]=$RUN
  DIRV=DIR_$side; D=${!DIRV:-$ROOT}
  (cd $D && exec env $VAR=$val ${EXTRA_ENV:-} "$PY" -m services.cli up --http-port 0 --grpc-port 0 --workers 2 --router-mode ${MODE:-round-robin} --mocker-speedup-ratio 0 --log-level WARNING --model-path "$MODEL_DIR" --model-name Qwen/Qwen3-0.6B --run-dir $RUN ${UPARGS:-} > $RUN/up.log 2>&1) &
  PIDS[$side]=$!
done
for side in A B; do
  RUN=${RUNS[$side]}
  for i in $(seq 1 240); do grep -q "JetServe is up" $RUN/up.log && break; sleep 0.5; done
  URLS[$side]=$(grep -o "http://127.0.0.1:[0-9]*" $RUN/up.log | head -1)
done
SIDES="A B"
if [ "${DYN:-0}" = 1 ]; then
  DRUN=$(mktemp -d); read DH DN < <("$PY" -c "from services.cli.stack import free_ports; print(*free_ports(2))")
  RUN_DIR=$DRUN/run HTTP_PORT=$DH NATS_PORT=$DN ROUTER_MODE=round-robin NUM_WORKERS=2 SPEEDUP=1000000 $KIT/dynamo_up.sh > $DRUN/up.log 2>&1 || { cat $DRUN/up.log; exit 1; }
  URLS[D]=http://127.0.0.1:$DH; RUNS[D]=$DRUN/run; SIDES="A B D"
fi
sleep 3
for c in $(seq 1 ${CYCLES:-10}); do for side in $SIDES; do
  $KV $KIT/loadgen.py --url ${URLS[$side]} --model Qwen/Qwen3-0.6B --client raw --endpoint chat -c ${C:-1} -n ${N:-60} --max-tokens ${MT:-32} --prompt-words 32 --warmup 2 --seed $c --cpu-pid-dir ${RUNS[$side]} --compact 2>/dev/null >> $OUT/$side.jsonl
done; done
[ "${DYN:-0}" = 1 ] && { RUN_DIR=$DRUN/run $KIT/dynamo_down.sh > /dev/null 2>&1; rm -rf "$DRUN"; }
for side in A B; do kill -INT ${PIDS[$side]}; done
for side in A B; do wait ${PIDS[$side]}; rm -rf ${RUNS[$side]}; done
python3 - $OUT <<'PY'
import json, sys, statistics as st
out=sys.argv[1]
res={}
import os
for side in [x for x in "ABD" if os.path.exists(f"{out}/{x}.jsonl")]:
    rows=[json.loads(l) for l in open(f"{out}/{side}.jsonl")]
    p50=[r["ttft_ms_p50"] for r in rows]; p99=[r["ttft_ms_p99"] for r in rows]
    cpu={}
    for r in rows:
        for k,v in r["cpu_ms_per_req"].items(): cpu.setdefault(k,[]).append(v)
    res[side]=(st.median(p50), st.median(p99), {k: round(st.median(v),3) for k,v in cpu.items()}, p50)
    rps=[r["req_per_s"] for r in rows]; print(side, "req/s median", round(st.median(rps),1), rps); print(side, "ttft p50 median", round(st.median(p50),2), "p99 median", round(st.median(p99),2), "per-batch p50s", p50)
    print("   cpu med", res[side][2])
a,b=res["A"][3],res["B"][3]
print("B/A per-cycle ratio median", round(st.median([y/x for x,y in zip(a,b)]),3), "B<A in", sum(y<x for x,y in zip(a,b)), "of", len(a))
if "D" in res:
    d=res["D"][3]
    for s_ in "AB":
        x=res[s_][3]; print(f"{s_}/D per-cycle ratio median", round(st.median([p/q for p,q in zip(x,d)]),3), f"{s_}<D in", sum(p<q for p,q in zip(x,d)), "of", len(d))
PY
