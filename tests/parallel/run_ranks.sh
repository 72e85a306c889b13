#!/usr/bin/env bash
# Runs a test program on N ranks: `loom run -n N` when the launcher is built,
# else mpirun directly. Usage: run_ranks.sh N PROGRAM [ARGS...]
set -euo pipefail
n=$1
shift
export LOOM_THREADS=${LOOM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# A hang becomes an error naming the collective well before CTest's timeout.
export LOOM_COMM_TIMEOUT=${LOOM_COMM_TIMEOUT:-60}
# Sanitizer builds: Open MPI's own allocations live until exit; full stacks
# (Open MPI has no frame pointers) so the suppressions can see its libraries.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$0")" && pwd)/lsan_mpi.supp}
# That is slow, so only the 2-rank run checks leaks (the others the rest).
if [ "$n" = 2 ]; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0
else
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
if [ -n "${LOOM_BIN:-}" ] && "$LOOM_BIN" run --help >/dev/null 2>&1; then
  exec "$LOOM_BIN" run -n "$n" "$@"
fi
exec mpirun --oversubscribe --allow-run-as-root -n "$n" \
  -x LOOM_THREADS -x OMP_NUM_THREADS -x LOOM_COMM_TIMEOUT -x LSAN_OPTIONS -x ASAN_OPTIONS \
  "$@"
