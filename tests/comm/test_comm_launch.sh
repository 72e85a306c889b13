#!/usr/bin/env bash
# The mpi backend's launch checks: a size announced by the launcher that MPI
# does not see is an error naming both; ranks started without a thread
# count divide the host's cores; a user's LOOM_THREADS sets all three pools.
set -u
PROG=${1:?usage: test_comm_launch.sh PROGRAM}
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
fail=0
# Fake the other MPI's launcher: hydra's PMI_SIZE for an Open MPI build,
# Open MPI's OMPI_COMM_WORLD_SIZE for an MPICH build.
var=PMI_SIZE
"$LOOM" run --dry-run -n 2 prog | grep -q "mpiexec" && var=OMPI_COMM_WORLD_SIZE
"$PROG" mismatch $var || fail=1
# An empty LOOM_THREADS is kept by loom run and means "not set".
LOOM_THREADS= OMP_NUM_THREADS= "$LOOM" run -n 2 "$PROG" threads || fail=1
# A user's LOOM_THREADS sets the BLAS and OpenMP pools to the same.
line=$(env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS LOOM_THREADS=3 "$LOOM" run --dry-run -n 2 prog | tail -1)
[ "$line" = "LOOM_THREADS=3 OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3" ] ||
  { echo "FAILED: LOOM_THREADS=3 gave: $line"; fail=1; }
[ $fail = 0 ] && echo "3 passed, 0 failed" || echo "FAILED"
exit $fail
