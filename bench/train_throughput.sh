#!/usr/bin/env bash
# bench/train_throughput: single-process fp32 training throughput of the
# reference workloads, loom next to PyTorch (same model, batch and thread
# count, measured in the same run), at 1 and 2 threads, with each one's share
# of the sgemm limit.   usage: bench/train_throughput.sh [BUILD_DIR] [STEPS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
STEPS=${2:-40}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build loom first (make)" >&2; exit 1; }
bench_ensure_torch
bench_check_load
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for t in 1 2; do
  bench_fair_env "$t"
  LOOM_THREADS=$t "$LOOM" bench gemm --threads "$t" --json --shape 1024 >>"$out" 2>/dev/null || true
  for m in fashion-mlp fashion-cnn kjv-gpt; do
    LOOM_THREADS=$t "$LOOM" bench train --model "$m" --threads "$t" --steps "$STEPS" --json >>"$out"
    bench_torch train_throughput --model "$m" --threads "$t" --steps "$STEPS" >>"$out"
  done
done
bench_table "$out"
