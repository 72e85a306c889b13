#!/usr/bin/env bash
# bench/cluster: loom's all-reduce across emulated hosts (tests/cluster/
# hosts.sh: network namespaces joined by a bridge, tbf-limited links), for
# each link rate, number of hosts and ranks a host: loom flat
# (LOOM_COMM_HIER=0: MPI's all-reduce over all ranks, chunked), loom
# hierarchical (the default when a host has more than one rank: shared
# memory inside each host, 1/L of the data a rank between hosts) and plain
# MPI_Allreduce, all on the same buffers in the same run, flat and
# hierarchical alternating ROUNDS times (the best of each is kept). busbw
# against the link rate says how much of the wire a large all-reduce uses.
# Needs root.
#   usage: bench/cluster.sh [BUILD_DIR]   env: RATES ("1gbit 200mbit"),
#          HOSTS ("2"), SIZES (1M,16M,64M), LAYOUTS ("1 2": ranks a host),
#          ROUNDS (2)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
RATES=${RATES:-1gbit 200mbit} HOSTS=${HOSTS:-2} SIZES=${SIZES:-1M,16M,64M}
LAYOUTS=${LAYOUTS:-1 2} ROUNDS=${ROUNDS:-2}
SRC=$LOOM_ROOT
tmp=$(mktemp -d)
. "$LOOM_ROOT/tests/cluster/hosts.sh"
hosts_can || { echo "bench/cluster: needs root and ip netns" >&2; exit 1; }
trap 'hosts_down; rm -rf "$tmp"' EXIT
bench_check_load
export LOOM_THREADS=1 OMP_NUM_THREADS=1
echo "# loom bench comm allreduce f32 across emulated hosts (tbf both ways; ~5 us latency)"

one() { # HOSTS PER HIER OUT
  local h=$1 per=$2 hier=$3 list="" i
  for i in $(seq 1 "$h"); do list="$list${list:+,}host$i:$per"; done
  on_host 1 env LOOM_COMM_HIER="$hier" "$LOOM" run --hosts "$list" -n $((h * per)) \
    "$LOOM" bench comm --op allreduce --sizes "$SIZES" 2>&1 | grep -v '^\[bench\]' >"$4"
}

for rate in $RATES; do
  for h in $HOSTS; do
    hosts_down
    hosts_up "$h" "$rate"
    for per in $LAYOUTS; do
      echo "## $rate, $h hosts x $per rank(s)"
      if [ "$per" = 1 ]; then
        one "$h" 1 1 "$tmp/t" && cat "$tmp/t"
        continue
      fi
      for r in $(seq "$ROUNDS"); do
        one "$h" "$per" 0 "$tmp/flat.$r"
        one "$h" "$per" 1 "$tmp/hier.$r"
      done
      echo "# flat (LOOM_COMM_HIER=0), round 1:"
      cat "$tmp/flat.1"
      echo "# hierarchical, round 1:"
      cat "$tmp/hier.1"
      # Per size: the best loom time of each, and plain MPI's best.
      cat "$tmp"/flat.* | awk '!/^#/ && NF > 8 {print "flat", $1, $6, $11}' >"$tmp/all"
      cat "$tmp"/hier.* | awk '!/^#/ && NF > 8 {print "hier", $1, $6, $11}' >>"$tmp/all"
      awk -v per="$per" -v h="$h" '
        { k = $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
          if (!((k, $1) in best) || $3 < best[k, $1]) best[k, $1] = $3
          if (!(k in mpi) || $4 < mpi[k]) mpi[k] = $4 }
        END {
          p = h * per; f = 2 * (p - 1) / p
          printf "# best of the rounds, busbw GB/s (%d ranks): size | flat | hierarchical | MPI_Allreduce | hierarchical / flat\n", p
          for (i = 1; i <= n; i++) { k = order[i]
            bf = k / best[k, "flat"] / 1e3 * f; bh = k / best[k, "hier"] / 1e3 * f; bm = k / mpi[k] / 1e3 * f
            printf "%12d | %6.3f | %6.3f | %6.3f | %5.2fx\n", k, bf, bh, bm, bh / bf } }' "$tmp/all"
    done
  done
done
