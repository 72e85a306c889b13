#!/usr/bin/env bash
# bench/train_throughput: single-process fp32 training throughput of the
# reference workloads, loom next to PyTorch (same model, batch and thread
# count, measured in the same run), at 1 and 2 threads, with each one's share
# of the sgemm limit.   usage: bench/train_throughput.sh [BUILD_DIR] [STEPS]
# Environment: NO_TORCH=1 or TORCH=0 (loom only).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
STEPS=${2:-40}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build loom first (make)" >&2; exit 1; }
torch=0
bench_torch_peer && torch=1
bench_check_load
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for t in 1 2; do
  bench_fair_env "$t"
  # The sgemm limit: raw dnnl_sgemm at 1024^3 (column 8 of loom bench gemm's
  # table), as a result line the table reads.
  LOOM_THREADS=$t "$LOOM" bench gemm --threads "$t" --backend dnnl 2>/dev/null |
    awk -v t="$t" '/^square 1024/ { printf "{\"bench\":\"gemm\",\"impl\":\"dnnl_sgemm\",\"threads\":%d,\"gflops\":%s}\n", t, $8 }' >>"$out"
  for m in fashion-mlp fashion-cnn kjv-gpt; do
    LOOM_THREADS=$t "$LOOM" bench train --model "$m" --threads "$t" --steps "$STEPS" --json >>"$out"
    [ $torch = 0 ] || bench_torch train_throughput --model "$m" --threads "$t" --steps "$STEPS" >>"$out"
  done
done
bench_table "$out"
