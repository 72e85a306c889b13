#!/usr/bin/env bash
# make bench: every benchmark in bench/ with settings that finish in about
# ten minutes on 2 cores, loom and its peer alternating in each, then one
# table of the headline figures (each row names its unit). The full tables
# of each benchmark are kept in BENCH_OUT (default a temporary directory,
# printed). Environment: the benchmarks' own (NO_TORCH=1 and TORCH=0 drop
# the PyTorch peer), ONLY="gemm comm ..." to run some of them.
#   usage: bench/run_all.sh [BUILD_DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
ONLY=${ONLY:-"gemm comm train_throughput ckpt_save recovery"}
bench_cpu_header
echo "# full tables in $out"

run() { # name command...
  local name=$1
  shift
  case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
  bench_note "$name: $*"
  if "$@" >"$out/$name.txt" 2>"$out/$name.err"; then
    echo "ok" >"$out/$name.status"
  else
    echo "failed ($?): see $out/$name.err" >"$out/$name.status"
  fi
}
run gemm bash "$here/gemm.sh" "$BUILD" 1
run comm bash "$here/comm.sh" "$BUILD" 2 1M,16M allreduce
run train_throughput bash "$here/train_throughput.sh" "$BUILD" 20
run ckpt_save env STEPS=60 bash "$here/ckpt_save.sh"
run recovery env REPEAT=1 bash "$here/recovery.sh" "$BUILD"

echo
printf "%-18s %-44s %s\n" "benchmark" "status" "table"
for n in $ONLY; do
  [ -f "$out/$n.status" ] || continue
  printf "%-18s %-44s %s\n" "$n" "$(cat "$out/$n.status")" "$out/$n.txt"
done
for n in $ONLY; do
  [ -s "$out/$n.txt" ] || continue
  echo
  echo "## $n"
  cat "$out/$n.txt"
done
