#!/usr/bin/env bash
# bench/comm: loom's collectives beside plain MPI, measured in the same run
# on the same buffers (loom bench comm under loom run), for each rank count
# and operation, then one summary table of bus bandwidth (and its rows as
# make bench's headlines).
#   usage: bench/comm.sh [BUILD_DIR] [RANKS] [SIZES] [OPS]
#   defaults: build  2,4  1M,16M,64M,256M  allreduce,reducescatter,allgather
# Environment: DTYPE (f32), ITERS (loom bench comm's --iters), REPEAT (runs
# per configuration, default 1; the summary keeps each side's best busbw),
# SHARED=1 (buffers from loom_group_mem_alloc: loom's direct path), SYNC=1
# (wait for each operation before posting the next), RAW=FILE (keep the full
# tables).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
RANKS=${2:-2,4}
SIZES=${3:-1M,16M,64M,256M}
OPS=${4:-allreduce,reducescatter,allgather}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: cmake --build $BUILD --target loom" >&2; exit 1; }
bench_check_load
out=${RAW:-$(mktemp)}
[ -n "${RAW:-}" ] || trap 'rm -f "$out"' EXIT
: >"$out"
for n in ${RANKS//,/ }; do
  for op in ${OPS//,/ }; do
    for _ in $(seq "${REPEAT:-1}"); do
      "$LOOM" run -n "$n" "$LOOM" bench comm --op "$op" --dtype "${DTYPE:-f32}" \
        --sizes "$SIZES" ${ITERS:+--iters "$ITERS"} \
        ${SHARED:+--shared} ${SYNC:+--sync} | tee -a "$out"
    done
  done
done
echo
echo "# bus bandwidth (GB/s), loom vs plain MPI (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather)${SHARED:+, shared buffers}"
echo "# load average $(bench_loadavg) on $(nproc) cores"
# the MPI library the mpi columns ran (loom bench comm's first line)
grep -m1 '^# mpi:' "$out" || echo "# mpi: not named (no loom bench comm output)"
awk -v hl="${BENCH_HEADLINES:-}" -v dtype="${DTYPE:-f32}" -v shared="${SHARED:+, shared buffers}" '
  /^# loom bench comm:/ { op = $5; sub(",", "", op); ranks = $8 }
  /^ +[0-9]+ +[0-9]+ .*\|/ {
    split($0, f, "|"); split(f[1], a, " "); split(f[2], l, " "); split(f[3], m, " ")
    k = op " " ranks " " a[1]
    if (!(k in best_l) || l[3] > best_l[k]) best_l[k] = l[3]
    if (!(k in best_m) || m[3] > best_m[k]) best_m[k] = m[3]
    if (!(k in seen)) { seen[k] = 1; order[++n] = k }
  }
  END {
    printf "%-14s %5s %12s %10s %10s %8s\n", "op", "ranks", "size(B)", "loom", "mpi", "loom/mpi"
    for (i = 1; i <= n; i++) {
      split(order[i], kk, " ")
      r = best_m[order[i]] > 0 ? best_l[order[i]] / best_m[order[i]] : 0
      printf "%-14s %5s %12s %10.2f %10.2f %8.2f\n", kk[1], kk[2], kk[3], best_l[order[i]], best_m[order[i]], r
    }
    if (hl == "") exit
    mpi["allreduce"] = "MPI_Allreduce"; mpi["reducescatter"] = "MPI_Reduce_scatter_block"; mpi["allgather"] = "MPI_Allgather"
    for (i = 1; i <= n; i++) {
      split(order[i], kk, " ")
      b = kk[3] + 0
      size = b >= 1048576 && b % 1048576 == 0 ? (b / 1048576) " MiB" : b >= 1024 && b % 1024 == 0 ? (b / 1024) " KiB" : b " B"
      printf "%s %s %s%s, %s ranks: bus bandwidth\tGB/s\t%.2f\t%.2f\tplain %s\n", kk[1], size, dtype, shared, kk[2], best_l[order[i]], best_m[order[i]], (kk[1] in mpi ? mpi[kk[1]] : "MPI") >> hl
    }
  }' "$out"
