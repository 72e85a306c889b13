#!/usr/bin/env bash
# bench/obs: what observing costs. The three reference workloads (fashion-mlp,
# fashion-cnn, kjv-gpt; one rank, STEPS steps, a metrics line every EVERY,
# the first line not counted) with nothing on, with log.trace, and with
# log.tensorboard, the variants in turn for ROUNDS rounds in the same run;
# the table gives each variant's median step (metrics.jsonl step_s) and its
# overhead against nothing. kjv-gpt runs STEPS / 5 steps (its steps are
# 60 times longer).
#   usage: bench/obs.sh [BUILD_DIR]   env: STEPS (200), EVERY (10), ROUNDS (3)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
STEPS=${STEPS:-200} EVERY=${EVERY:-10} ROUNDS=${ROUNDS:-3}
bench_check_load
bench_fair_env 1
export LOOM_THREADS=${LOOM_THREADS:-1} LOOM_LOG=warn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# one rank x $LOOM_THREADS threads, $STEPS steps, a metrics line every $EVERY (the first not counted), $ROUNDS rounds in turn"
rows="$tmp/rows"
: >"$rows"
one() { # WORKLOAD VARIANT
  local d="$tmp/$1_$2" extra=() steps=$STEPS
  [ "$1" = kjv_gpt ] && steps=$((STEPS / 5))
  case $2 in
  trace) extra=(--set log.trace=true) ;;
  tensorboard) extra=(--set log.tensorboard=true) ;;
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
    for v in none trace tensorboard; do one $w $v; done
  done
done
python3 - "$rows" <<'PY'
import json, statistics, sys
acc = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    acc.setdefault((r["workload"], r["variant"]), []).extend(r["steps"])
print(f"{'workload':<12} {'variant':<12} {'median_step_ms':>14} {'overhead':>9}")
for (w, v), s in acc.items():
    m = statistics.median(s)
    base = statistics.median(acc[(w, "none")])
    print(f"{w:<12} {v:<12} {m * 1e3:14.3f} {(m / base - 1) * 100:8.1f}%")
PY
