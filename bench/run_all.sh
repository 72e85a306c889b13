#!/usr/bin/env bash
# make bench: every benchmark in bench/ with settings that finish in about
# ten minutes on 2 cores (gemm, comm, train_throughput, ddp_scaling,
# ckpt_save, recovery), loom and its peer alternating in each, then the CPU
# header and one table of the headline figures: a row per measurement with
# its unit, loom's figure, the peer's (PyTorch, plain MPI, the raw GEMM
# library) and their ratio. A benchmark that failed or was not run gets a row
# saying so; a peer that did not run shows "-" and why in its name. Exits 1
# when a benchmark failed.
#
# Each benchmark appends its headlines to the file named by BENCH_HEADLINES
# (lines of tab-separated measure, unit, loom, peer, peer name; "-" where not
# measured; see bench_headline in lib.sh); this script sets it per benchmark.
# The full tables of each benchmark (NAME.txt), its notes (NAME.err) and its
# headlines (NAME.headlines) are kept in BENCH_OUT (default a temporary
# directory, printed).
#
# Environment: the benchmarks' own (NO_TORCH=1 or TORCH=0 drop the PyTorch
# peer), ONLY="gemm comm ..." to run some of them, BENCH_OUT=DIR.
#   usage: bench/run_all.sh [BUILD_DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
# Absolute: recovery.sh changes directory.
BUILD=$(cd "${1:-$LOOM_ROOT/build}" && pwd) || exit 1
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
ALL="gemm comm train_throughput ddp_scaling ckpt_save recovery"
ONLY=${ONLY:-$ALL}
for n in $ONLY; do
  case " $ALL " in *" $n "*) ;; *) echo "run_all: unknown benchmark '$n' (one of: $ALL)" >&2; exit 2 ;; esac
done
load_start=$(bench_loadavg)
bench_note "full tables in $out"

declare -A status took
run() { # name command...
  local name=$1 t0 rc=0
  shift
  case " $ONLY " in *" $name "*) ;; *) status[$name]="not run (not in ONLY)"; return 0 ;; esac
  bench_note "$name: $*"
  rm -f "$out/$name.headlines"
  t0=$(date +%s)
  BENCH_HEADLINES="$out/$name.headlines" "$@" >"$out/$name.txt" 2>"$out/$name.err" || rc=$?
  took[$name]=$(($(date +%s) - t0))
  if [ $rc = 0 ]; then
    status[$name]=ok
  else
    status[$name]="failed (exit $rc), see $out/$name.err"
  fi
  bench_note "$name: ${status[$name]} in ${took[$name]} s"
}
run gemm bash "$here/gemm.sh" "$BUILD" 1
run comm bash "$here/comm.sh" "$BUILD" 2 1M,16M allreduce
run train_throughput bash "$here/train_throughput.sh" "$BUILD" 20
run ddp_scaling env REPEAT=1 TORCH_REPEAT=1 bash "$here/ddp_scaling.sh" "$BUILD"
run ckpt_save env STEPS=60 LOOM="$BUILD/loom" bash "$here/ckpt_save.sh"
run recovery env REPEAT=1 bash "$here/recovery.sh" "$BUILD"

# The rows: each benchmark's headlines, then a row for a failure or a
# benchmark without any; one for each benchmark not run.
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for n in $ALL; do
  h="$out/$n.headlines"
  if [ -s "$h" ]; then
    awk -v n="$n" -F'\t' 'NF == 5 { print n "\t" $0 }' "$h" >>"$rows"
  fi
  case ${status[$n]} in
  ok) [ -s "$h" ] || printf '%s\tno headline figures: see %s\t-\t-\t-\t-\n' "$n" "$out/$n.txt" >>"$rows" ;;
  *) printf '%s\t%s\t-\t-\t-\t-\n' "$n" "${status[$n]}" >>"$rows" ;;
  esac
done

echo
bench_cpu_header
echo "# load average (1, 5, 15 min) $load_start at the start, $(bench_loadavg) at the end, on $(nproc) cores"
awk -F'\t' '
  function ratio(l, p) {
    if (l !~ /^[0-9.]+$/ || p !~ /^[0-9.]+$/ || p + 0 == 0) return "-"
    return sprintf("%.2fx", l / p)
  }
  NR == FNR {
    r = ratio($4, $5)
    if (FNR == 1) { w[1] = 9; w[2] = 7; w[3] = 4; w[4] = 4; w[5] = 4; w[6] = 9 }
    for (i = 1; i <= 5; i++) if (length($i) > w[i]) w[i] = length($i)
    if (length(r) > w[6]) w[6] = length(r)
    next
  }
  FNR == 1 {
    printf "%-*s  %-*s  %-*s  %*s  %*s  %*s  %s\n", w[1], "benchmark", w[2], "measure", w[3], "unit",
      w[4], "loom", w[5], "peer", w[6], "loom/peer", "peer name"
  }
  {
    printf "%-*s  %-*s  %-*s  %*s  %*s  %*s  %s\n", w[1], $1, w[2], $2, w[3], $3, w[4], $4, w[5], $5,
      w[6], ratio($4, $5), $6
  }' "$rows" "$rows"
echo "# loom and peer in the row's unit; loom/peer above 1 puts loom ahead for a rate (.../s, %), below 1 for a time (s, ms)"
t=""
for n in $ALL; do [ -n "${took[$n]:-}" ] && t="$t, $n ${took[$n]} s"; done
echo "# seconds taken: ${t#, }"
echo "# full tables: $out/NAME.txt (notes in NAME.err)"
# Failed when a benchmark did.
for n in $ONLY; do
  [ "${status[$n]}" = ok ] || exit 1
done
