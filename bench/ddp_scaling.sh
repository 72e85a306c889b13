#!/usr/bin/env bash
# bench/ddp_scaling: data-parallel scaling of the reference workloads, loom
# next to PyTorch DDP (gloo) measured in the same run: 1 rank x 1 thread,
# 2 ranks x 1 thread, scaling efficiency and loom's share of reduction time
# hidden behind backward; in f32 and, with PRECISIONS="f32 bf16", in bf16
# (loom's train.precision: bf16 against PyTorch's DDP under
# torch.autocast("cpu", torch.bfloat16); gradients reduced in f32 on both).
#   usage: bench/ddp_scaling.sh [BUILD_DIR] [MODELS] [PROCS]
#   MODELS: all (default) or a comma list of fashion-mlp, fashion-cnn, kjv-gpt
# Environment: PRECISIONS ("f32"; "f32 bf16" for both), STEPS (timed steps;
# default per model), REPEAT (rounds of loom's
# 1-rank and P-rank runs, medians kept; default 3), TORCH_REPEAT (rounds of
# the PyTorch peer, run inside loom's rounds so that both see the same phases
# of a shared machine, medians kept; default 1), LOOM_DDP_ARGS (more
# ddp_bench options, e.g. "--bucket-mb 5 --compress bf16"), NO_TORCH=1 or
# TORCH=0 (loom only), RAW=FILE (keep the JSON result lines).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
MODELS=${2:-all}
PROCS=${3:-2}
[ "$MODELS" = all ] && MODELS=fashion-mlp,fashion-cnn,kjv-gpt
BENCH="$BUILD/tests/parallel/ddp_bench"
[ -x "$BENCH" ] || { echo "build it first: cmake --build $BUILD --target ddp_bench" >&2; exit 1; }
LOOM="$BUILD/loom"
torch=0
bench_torch_peer && torch=1
bench_check_load
echo "# peer: ${TORCH_PEER:-PyTorch: skipped}, DDP (gloo) on CPU; OMP_WAIT_POLICY=PASSIVE, 1 thread a rank"
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
REPEAT=${REPEAT:-3}
TORCH_REPEAT=${TORCH_REPEAT:-1}
[ $torch = 1 ] || TORCH_REPEAT=0
torch_round() {
  bench_torch ddp_scaling --model "$1" --procs "$PROCS" --threads 1 --nosync \
    --precision "$prec" ${STEPS:+--steps "$STEPS"} || bench_note "pytorch $1 $prec failed"
}
PRECISIONS=${PRECISIONS:-f32}
IFS=, read -ra models <<<"$MODELS"
for m in "${models[@]}"; do
for prec in $PRECISIONS; do
  # Rounds of (1 rank, P ranks[, PyTorch]) one after the other, so that slow
  # phases of a shared machine hit every side; each side's median round is
  # kept.
  ones=() manys=() torch_lines=()
  rounds=$((REPEAT > TORCH_REPEAT ? REPEAT : TORCH_REPEAT))
  for ((r = 0; r < rounds; r++)); do
    if ((r < REPEAT)); then
      ones+=("$(ranks 1 --model "$m" --precision "$prec" "${steps[@]}" | grep '^{')")
      # shellcheck disable=SC2086
      manys+=("$(ranks "$PROCS" --model "$m" --precision "$prec" "${steps[@]}" --nosync \
        ${LOOM_DDP_ARGS:-} | grep '^{')")
    fi
    if ((r < TORCH_REPEAT)); then
      while IFS= read -r line; do
        torch_lines+=("$line")
      done < <(torch_round "$m" | grep '^{')
    fi
  done
  # The efficiency of the medians, and a note.
  python3 - "${#ones[@]}" "${ones[@]}" "${manys[@]}" >>"$out" <<'EOF'
import json, sys
k = int(sys.argv[1])
runs = [json.loads(a) for a in sys.argv[2:]]
def median(rs):
    rs = sorted(rs, key=lambda r: r["throughput"])
    return rs[len(rs) // 2]
one, many = median(runs[:k]), median(runs[k:])
p = many["procs"]
for r in (one, many):
    r["rounds"] = k
    r["round_throughputs"] = [x["throughput"] for x in (runs[:k] if r is one else runs[k:])]
many["baseline_throughput"] = one["throughput"]
many["scaling_efficiency"] = round(many["throughput"] / (p * one["throughput"]), 3)
if "throughput_nosync" in many:
    many["efficiency_nosync"] = round(many["throughput_nosync"] / (p * one["throughput"]), 3)
    # steps with and without reduction alternate in one job: what the
    # reduction costs, apart from what sharing the machine costs
    many["comm_efficiency"] = round(many["throughput"] / many["throughput_nosync"], 3)
print(json.dumps(one))
print(json.dumps(many))
r = many
ms = lambda key: f"{1e3 * r[key]:.2f}"
print(f"[bench] loom {r['model']} {r.get('precision', 'f32')}: {p} ranks {r['throughput']:,.0f} {r['unit']} vs 1 rank "
      f"{one['throughput']:,.0f} (medians of {k} rounds): efficiency {r['scaling_efficiency']} "
      f"(without reduction {r.get('efficiency_nosync')}; with / without reduction "
      f"{r.get('comm_efficiency')}), hidden {100 * r['hidden_share']:.0f}%; "
      f"per step (ms) forward {ms('forward_s')}, backward {ms('backward_s')}, waiting for "
      f"reduction {ms('comm_wait_s')}, optimizer {ms('optim_s')}; reduction on the comm thread "
      f"{ms('reduce_s')} in {r['buckets']} buckets", file=sys.stderr)
EOF
  if ((${#torch_lines[@]} > 0)); then
    # the median round of each process count
    python3 - "${torch_lines[@]}" >>"$out" <<'EOF'
import json, sys
by = {}
for a in sys.argv[1:]:
    r = json.loads(a)
    by.setdefault(r.get("procs"), []).append(r)
for rs in by.values():
    rs.sort(key=lambda r: r.get("throughput", 0))
    med = rs[len(rs) // 2]
    if len(rs) > 1:
        med["rounds"] = len(rs)
        med["round_throughputs"] = [r.get("throughput") for r in rs]
    print(json.dumps(med))
EOF
  fi
done
done
bench_table "$out"
