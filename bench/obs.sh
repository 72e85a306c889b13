#!/usr/bin/env bash
# bench/obs: what observing costs. The three reference workloads (fashion-mlp,
# fashion-cnn, kjv-gpt; one rank, STEPS steps, a metrics line every EVERY,
# the first line not counted) with nothing on, with log.trace, with
# log.tensorboard, with log.per_rank and with log.mlflow (a local `mlflow
# server` from scripts/ensure-mlflow.sh; left out when PyPI is not there),
# the variants in turn for ROUNDS rounds in the same run;
# the table gives each variant's median step (metrics.jsonl step_s) and its
# overhead against nothing. kjv-gpt runs STEPS / 5 steps (its steps are
# 60 times longer).
#   usage: bench/obs.sh [BUILD_DIR]   env: STEPS (200; at least 10 x EVERY),
#          EVERY (10), ROUNDS (3), VARIANTS ("none trace tensorboard per_rank
#          mlflow"; without none, no overhead column)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
STEPS=${STEPS:-200} EVERY=${EVERY:-10} ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-none trace tensorboard per_rank mlflow}
for v in $VARIANTS; do
  case $v in
  none | trace | tensorboard | per_rank | mlflow) ;;
  *) echo "obs: VARIANTS: unknown variant '$v' (none, trace, tensorboard, per_rank, mlflow)" >&2; exit 2 ;;
  esac
done
# kjv-gpt runs STEPS / 5 steps; each workload needs two metrics lines, the
# first not counted
if [ $((STEPS / 5)) -lt $((2 * EVERY)) ]; then
  echo "obs: STEPS=$STEPS, EVERY=$EVERY: kjv-gpt runs STEPS / 5 = $((STEPS / 5)) steps, fewer than the $((2 * EVERY)) that give two metrics lines (the first is not counted): STEPS must be at least $((10 * EVERY))" >&2
  exit 2
fi
bench_check_load
bench_fair_env 1
export LOOM_THREADS=${LOOM_THREADS:-1} LOOM_LOG=warn
tmp=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill -- -"$server" 2>/dev/null; rm -rf "$tmp"' EXIT
MLFLOW_URI=
if [[ " $VARIANTS " == *" mlflow "* ]]; then
  if PY=$("$LOOM_ROOT/scripts/ensure-mlflow.sh" 2>/dev/null); then
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$(dirname "$PY")/mlflow" server \
      --backend-store-uri "sqlite:///$tmp/mlflow.db" --artifacts-destination "$tmp/art" \
      --host 127.0.0.1 --port "$port" --workers 1 >"$tmp/mlflow.log" 2>&1 &
    server=$!
    for _ in $(seq 240); do
      "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "http://127.0.0.1:$port" 2>/dev/null && break
      sleep 0.5
    done
    MLFLOW_URI=http://127.0.0.1:$port
  else
    echo "# mlflow: scripts/ensure-mlflow.sh failed (no PyPI?): left out"
    VARIANTS=${VARIANTS/mlflow/}
  fi
fi
[[ " $VARIANTS " == *" none "* ]] || echo "# VARIANTS has no none: no overhead to give (\"-\")"
echo "# one rank x $LOOM_THREADS threads, $STEPS steps, a metrics line every $EVERY (the first not counted), $ROUNDS rounds in turn"
rows="$tmp/rows"
: >"$rows"
one() { # WORKLOAD VARIANT
  local d="$tmp/$1_$2" extra=() steps=$STEPS
  [ "$1" = kjv_gpt ] && steps=$((STEPS / 5))
  case $2 in
  trace) extra=(--set log.trace=true) ;;
  tensorboard) extra=(--set log.tensorboard=true) ;;
  per_rank) extra=(--set log.per_rank=true) ;;
  mlflow) extra=(--set "log.mlflow.uri=$MLFLOW_URI" --set log.mlflow.experiment=bench) ;;
  esac
  rm -rf "$d"
  "$LOOM" train "$LOOM_ROOT/examples/$1.yaml" --quiet --resume never --set train.epochs=0 \
    --set train.steps="$steps" --set log.every="$EVERY" --set train.eval_every=0 \
    --set train.eval_batches=1 --set checkpoint.enabled=false --set "log.run_dir=$d" \
    "${extra[@]}" >"$d.out" 2>&1 || { echo "$1 $2 failed:" >&2; tail -3 "$d.out" >&2; return 0; }
  python3 - "$d" "$1" "$2" >>"$rows" <<'PY'
import json, sys
d, w, v = sys.argv[1], sys.argv[2], sys.argv[3]
steps = [json.loads(l)["step_s"] for l in open(d + "/metrics.jsonl") if '"step_s"' in l]
print(json.dumps({"workload": w, "variant": v, "steps": steps[1:]}))
PY
}
for _ in $(seq "$ROUNDS"); do
  for w in fashion_mlp fashion_cnn kjv_gpt; do
    for v in $VARIANTS; do one $w $v; done
  done
done
python3 - "$rows" <<'PY'
import json, statistics, sys
acc = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    acc.setdefault((r["workload"], r["variant"]), []).extend(r["steps"])
# "-": no step measured (a failed run, said above), or no "none" to compare with
med = {k: statistics.median(s) for k, s in acc.items() if s}
print(f"{'workload':<12} {'variant':<12} {'median_step_ms':>14} {'overhead':>9}")
for (w, v) in acc:
    m, base = med.get((w, v)), med.get((w, "none"))
    ms = f"{m * 1e3:14.3f}" if m is not None else f"{'-':>14}"
    oh = f"{(m / base - 1) * 100:8.1f}%" if m is not None and base else f"{'-':>9}"
    print(f"{w:<12} {v:<12} {ms} {oh}")
PY
