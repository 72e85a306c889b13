#!/usr/bin/env bash
# bench/train_throughput: single-process training throughput of the
# reference workloads in f32 and bf16, loom next to PyTorch (same model,
# batch and thread count, measured in the same run, one after the other for
# each row and round), with each one's share of the sgemm limit and the
# peak RSS of each process. bf16 is loom's train.precision: bf16 (`loom bench
# train --precision bf16`) against PyTorch under torch.autocast("cpu",
# torch.bfloat16); the CPU's flags that decide the bf16 paths (avx2,
# avx512f, avx512_bf16, amx_bf16) are printed above the table.
#   usage: bench/train_throughput.sh [BUILD_DIR] [STEPS]   (STEPS: 40)
# Environment: PRECISIONS ("f32 bf16"), THREADS ("1 2"), MODELS
# (fashion-mlp,fashion-cnn,kjv-gpt), ROUNDS (1: each row's loom and PyTorch
# runs repeated, the rows in turn; the table keeps the median round and the
# median of the rounds' loom/PyTorch ratios), NO_TORCH=1 or TORCH=0 (loom
# only), RAW=FILE (keep the JSON result lines), BENCH_ISA=avx2 (both sides
# capped to AVX2 and FMA: an AVX2-only CPU emulated, bench/lib.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
STEPS=${2:-${STEPS:-40}}
PRECISIONS=${PRECISIONS:-f32 bf16}
THREADS=${THREADS:-1 2}
MODELS=${MODELS:-fashion-mlp,fashion-cnn,kjv-gpt}
ROUNDS=${ROUNDS:-1}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build loom first (make)" >&2; exit 1; }
torch=0
bench_torch_peer && torch=1
bench_check_load
bench_cap_isa
echo "# peer: ${TORCH_PEER:-PyTorch: skipped}; OMP_WAIT_POLICY=PASSIVE, equal thread counts; $STEPS timed steps, $ROUNDS round(s)"
tmp=$(mktemp -d)
out=${RAW:-$tmp/results.jsonl}
trap 'rm -rf "$tmp"' EXIT

# ROUND COMMAND...: runs COMMAND under /usr/bin/time and appends its result
# lines to $out with the round and the process's peak RSS (MB) added.
measured() {
  local round=$1
  shift
  if ! /usr/bin/time -f %M -o "$tmp/rss" "$@" >"$tmp/lines"; then
    bench_note "failed: $*"
    return 0
  fi
  python3 - "$tmp/lines" "$tmp/rss" "$round" >>"$out" <<'PY'
import json, sys
rss = int(open(sys.argv[2]).read().split()[-1]) / 1024
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        r.update(round=int(sys.argv[3]), peak_rss_mb=round(rss, 1))
        print(json.dumps(r))
PY
}

IFS=, read -ra models <<<"$MODELS"
for t in $THREADS; do
  bench_fair_env "$t"
  # The sgemm limit: raw dnnl_sgemm at 1024^3 (column 8 of loom bench gemm's
  # table), as a result line the table reads.
  LOOM_THREADS=$t "$LOOM" bench gemm --threads "$t" --backend dnnl 2>/dev/null |
    awk -v t="$t" '/^square 1024/ { printf "{\"bench\":\"gemm\",\"impl\":\"dnnl_sgemm\",\"threads\":%d,\"gflops\":%s}\n", t, $8 }' >>"$out"
  for ((r = 1; r <= ROUNDS; r++)); do
    for m in "${models[@]}"; do
      for p in $PRECISIONS; do
        measured "$r" env LOOM_THREADS="$t" "$LOOM" bench train --model "$m" --threads "$t" \
          --steps "$STEPS" --precision "$p" --json
        [ $torch = 0 ] || measured "$r" "$TORCH_PYTHON" "$BENCH_DIR/torch/train_throughput.py" \
          --model "$m" --threads "$t" --steps "$STEPS" --precision "$p"
      done
    done
  done
done
echo "# load average at the end: $(bench_loadavg)"
bench_table "$out"
