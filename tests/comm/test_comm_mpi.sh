#!/usr/bin/env bash
# Runs the multi-rank comm test through `loom run` with 1, 2, 3 and 4 ranks
# (more ranks than cores is fine), on the shared-memory path, the plain MPI
# path, with tiny pipeline chunks and without checks; then makes sure no
# rank is left behind.
set -u
BIN=$1
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
. "$(dirname "$0")/../marked.sh"
fail=0
run() { # np [VAR=value...]
  local np=$1
  shift
  echo "== loom run -n $np ($*)"
  if ! env LOOM_TEST_MARK="$mark" "$@" "$LOOM" run -n "$np" --timeout 100 "$BIN"; then
    echo "FAILED: $np ranks $*"
    fail=1
  fi
}
for np in 1 2 3 4; do
  run "$np" LOOM_COMM_SHM=1
done
run 2 LOOM_COMM_SHM=0
# Two hosts of two ranks (consecutive ranks as hosts): the all-reduce goes
# through both hosts' shared memory and MPI between them.
run 4 LOOM_COMM_FAKE_HOSTS=2
if [ -z "${LOOM_TEST_SANITIZED:-}" ]; then
  run 3 LOOM_COMM_SHM=0
  run 3 LOOM_COMM_CHUNK=4096
  run 4 LOOM_COMM_FAKE_HOSTS=2 LOOM_COMM_CHUNK=4096
  run 4 LOOM_COMM_FAKE_HOSTS=4
  run 6 LOOM_COMM_FAKE_HOSTS=3
  run 2 LOOM_COMM_CHECK=0
else
  run 2 LOOM_COMM_CHUNK=4096
fi
# Only this test's ranks: comm_env_init runs the same binary beside it.
if ! marked_left; then
  echo "FAILED: processes left behind"
  fail=1
fi
[ $fail = 0 ] && echo "comm_mpi: all runs passed"
exit $fail
