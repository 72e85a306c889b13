#!/usr/bin/env bash
# bench/cluster: loom's all-reduce across emulated hosts (tests/cluster/
# hosts.sh: network namespaces joined by a bridge, tbf-limited links) beside
# plain MPI's on the same buffers in the same run (loom bench comm), for
# each link rate and layout: 2 hosts x 1 rank and 2 hosts x 2 ranks. busbw
# against the link rate says how much of the wire a large all-reduce uses.
# Needs root. Flat algorithms only: the hierarchical all-reduce is not built
# yet (issue 16).
#   usage: bench/cluster.sh [BUILD_DIR]   env: RATES ("1gbit 200mbit"),
#          SIZES (1M,16M,64M), LAYOUTS ("1 2": ranks per host)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
RATES=${RATES:-1gbit 200mbit} SIZES=${SIZES:-1M,16M,64M} LAYOUTS=${LAYOUTS:-1 2}
SRC=$LOOM_ROOT
tmp=$(mktemp -d)
. "$LOOM_ROOT/tests/cluster/hosts.sh"
hosts_can || { echo "bench/cluster: needs root and ip netns" >&2; exit 1; }
trap 'hosts_down; rm -rf "$tmp"' EXIT
bench_check_load
export LOOM_THREADS=1 OMP_NUM_THREADS=1
echo "# loom bench comm allreduce f32 across 2 emulated hosts (tbf both ways; ~5 us latency)"
for rate in $RATES; do
  hosts_down
  hosts_up 2 "$rate"
  for per in $LAYOUTS; do
    echo "## $rate, 2 hosts x $per rank(s)"
    on_host 1 "$LOOM" run --hosts "host1:$per,host2:$per" -n $((2 * per)) \
      "$LOOM" bench comm --op allreduce --sizes "$SIZES" 2>&1 | grep -v '^\[bench\]'
  done
done
