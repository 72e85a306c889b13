#!/usr/bin/env bash
# A rank skips a collective: with LOOM_COMM_TIMEOUT=2 the other ranks'
# watchdog must fire, name the operation and the missing rank, and end the
# job with exit code 75 well before the test's timeout, leaving no process
# behind. Three ways of knowing who is missing: the shared-memory board with
# and without checks, and check headers over MPI. Then the same job under
# loom run --max-restarts 1 completes on its second start.
set -u
BIN=$1
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
. "$(dirname "$0")/../marked.sh"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0
check() { # description, condition already evaluated as $?
  if [ "$2" != 0 ]; then echo "FAILED: $1"; fail=1; fi
}
for mode in "LOOM_COMM_CHECK=1" "LOOM_COMM_CHECK=0" "LOOM_COMM_CHECK=1 LOOM_COMM_SHM=0"; do
  echo "== $mode"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  env LOOM_TEST_MARK="$mark" $mode LOOM_COMM_TIMEOUT=2 "$LOOM" run -n 3 --timeout 60 "$BIN" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  cat "$out"
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  echo "exit code $rc after $secs s"
  [ "$rc" = 75 ]; check "$mode: exit code $rc, expected 75" $?
  grep -q "watchdog: allreduce #2 (count 16, f32, sum)" "$out"; check "$mode: operation not named" $?
  grep -q "ranks not arrived: 1$" "$out"; check "$mode: missing rank not named" $?
  awk -v s="$secs" 'BEGIN{exit !(s < 30)}'; check "$mode: took $secs s" $?
  marked_left; check "$mode: processes left behind" $?
done
# The launcher restarts the group after the watchdog ended it; the second
# start (LOOM_RESTART_COUNT=1) completes.
echo "== --max-restarts 1"
LOOM_COMM_TIMEOUT=2 "$LOOM" run -n 3 --timeout 60 --max-restarts 1 --restart-delay 0 "$BIN" >"$out" 2>&1
rc=$?
grep "loom run:" "$out"
[ "$rc" = 0 ]; check "restart: exit code $rc, expected 0" $?
grep -q "job failed (exit code 75: the communication watchdog fired) .* restart 1 of 1" "$out"
check "restart: no restart message" $?

[ $fail = 0 ] && echo "comm_watchdog: all passed"
exit $fail
