#!/usr/bin/env bash
# bench/ddp_scaling: data-parallel scaling of the reference workloads, loom
# next to PyTorch DDP (gloo) measured in the same run: 1 rank x 1 thread,
# 2 ranks x 1 thread, scaling efficiency and loom's share of reduction time
# hidden behind backward.
#   usage: bench/ddp_scaling.sh [BUILD_DIR] [MODELS] [PROCS]
#   MODELS: all (default) or a comma list of fashion-mlp, fashion-cnn, kjv-gpt
# Environment: STEPS (timed steps; default per model), LOOM_DDP_ARGS (more
# ddp_bench options, e.g. "--bucket-mb 5 --compress bf16"), NO_TORCH=1 (loom
# only), RAW=FILE (keep the JSON result lines).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
MODELS=${2:-all}
PROCS=${3:-2}
[ "$MODELS" = all ] && MODELS=fashion-mlp,fashion-cnn,kjv-gpt
BENCH="$BUILD/tests/parallel/ddp_bench"
[ -x "$BENCH" ] || { echo "build it first: cmake --build $BUILD --target ddp_bench" >&2; exit 1; }
LOOM="$BUILD/loom"
[ "${NO_TORCH:-0}" = 1 ] || bench_ensure_torch
bench_check_load
out=${RAW:-$(mktemp)}
[ -n "${RAW:-}" ] || trap 'rm -f "$out"' EXIT
bench_fair_env 1
export LOOM_THREADS=1

# P ranks of ddp_bench: through `loom run` when it is built, else mpirun.
ranks() {
  local n=$1
  shift
  if [ "$n" = 1 ]; then
    "$BENCH" "$@"
  elif [ -x "$LOOM" ] && "$LOOM" run --help >/dev/null 2>&1; then
    "$LOOM" run -n "$n" --threads 1 "$BENCH" "$@"
  else
    mpirun --oversubscribe --allow-run-as-root -n "$n" -x LOOM_THREADS \
      -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x OMP_WAIT_POLICY "$BENCH" "$@"
  fi
}

steps=()
[ -n "${STEPS:-}" ] && steps=(--steps "$STEPS")
IFS=, read -ra models <<<"$MODELS"
for m in "${models[@]}"; do
  # shellcheck disable=SC2086
  one=$(ranks 1 --model "$m" "${steps[@]}" | grep '^{')
  # shellcheck disable=SC2086
  many=$(ranks "$PROCS" --model "$m" "${steps[@]}" --nosync ${LOOM_DDP_ARGS:-} | grep '^{')
  echo "$one" >>"$out"
  # The efficiency against the 1-rank line of the same run, and a note.
  "$TORCH_PYTHON" - "$one" "$many" >>"$out" <<'EOF'
import json, sys
one, many = json.loads(sys.argv[1]), json.loads(sys.argv[2])
p = many["procs"]
many["baseline_throughput"] = one["throughput"]
many["scaling_efficiency"] = round(many["throughput"] / (p * one["throughput"]), 3)
if "throughput_nosync" in many:
    many["efficiency_nosync"] = round(many["throughput_nosync"] / (p * one["throughput"]), 3)
print(json.dumps(many))
r = many
ms = lambda k: f"{1e3 * r[k]:.2f}"
print(f"[bench] loom {r['model']}: {p} ranks {r['throughput']:,.0f} {r['unit']} vs 1 rank "
      f"{one['throughput']:,.0f}: efficiency {r['scaling_efficiency']} (without reduction "
      f"{r.get('efficiency_nosync')}), hidden {100 * r['hidden_share']:.0f}%; per step (ms) "
      f"forward {ms('forward_s')}, backward {ms('backward_s')}, waiting for reduction "
      f"{ms('comm_wait_s')}, optimizer {ms('optim_s')}; reduction on the comm thread "
      f"{ms('reduce_s')} in {r['buckets']} buckets", file=sys.stderr)
EOF
  if [ "${NO_TORCH:-0}" != 1 ]; then
    bench_torch ddp_scaling --model "$m" --procs "$PROCS" --threads 1 --nosync \
      ${STEPS:+--steps "$STEPS"} >>"$out" || bench_note "pytorch $m failed"
  fi
done
bench_table "$out"
