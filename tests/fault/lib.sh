#!/usr/bin/env bash
# Shared by the fault tests: environment, checks, a tiny deterministic
# training job, and the search for processes left behind.
set -u
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
SRC=${LOOM_SRC:?}
DIGEST=${CKPT_DIGEST:?CKPT_DIGEST must name the ckpt_digest tool}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LOOM_COMM_TIMEOUT=${LOOM_COMM_TIMEOUT:-60}
unset LOOM_FAULT LOOM_RESTART_COUNT
# Sanitizer builds: Open MPI's own allocations live until exit; a rank killed
# on purpose is no leak report.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:print_suppressions=0}
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom_fault.XXXXXX")
cleanup_extra=""
trap 'eval "$cleanup_extra"; rm -rf "$tmp"' EXIT
# Whatever loom run or the trainer put in TMPDIR goes with the test's own
# directory (a loom run killed on purpose cannot remove its loom-run-*).
mkdir -p "$tmp/tmp"
export TMPDIR="$tmp/tmp"
# A configuration these tests cannot run in is a skip (CTest
# SKIP_RETURN_CODE 77), never a pass: they need the launcher loom run picks.
skip_unless_launcher() {
  local cmd
  cmd=$("$LOOM" run --dry-run -n 2 prog | sed -n 's/^command: \([^ ]*\).*/\1/p')
  command -v "$cmd" >/dev/null || { echo "skipped: no $cmd"; exit 77; }
}
passed=0
failed=0
ok() {
  echo "ok: $1"
  passed=$((passed + 1))
}
bad() {
  echo "FAILED: $1"
  failed=$((failed + 1))
}
check() { # description, then a command that must succeed
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
has() { grep -qE -- "$1" "$tmp/out"; }
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}

# The job: a small MLP, deterministic (the same bits at 1, 2 and 4 ranks),
# checkpoints at steps 10, 20 and 30.
job=("$SRC/examples/small_mlp.yaml" --set parallel.deterministic=true
  --set parallel.virtual_shards=4 --set train.steps=30
  --set checkpoint.every=10 --set checkpoint.keep=3
  --set log.progress=off --set train.eval_every=0)

# run N DIR [loom run options] -- [loom train options]: output in $tmp/out,
# exit code in $rc, seconds in $secs.
run() {
  local n=$1 dir=$2
  shift 2
  local pre=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    pre+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  local t0 t1
  t0=$(date +%s.%N)
  "$LOOM" run -n "$n" --timeout 120 "${pre[@]}" "$LOOM" train "${job[@]}" \
    --set "log.run_dir=$dir" "$@" >"$tmp/out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
}

digest() { "$DIGEST" "$1" 2>&1; }

# Processes whose command line holds $1 (the run directory: unique to one
# job), zombies aside; any found are killed so later tests are not disturbed.
# (Polled for up to 10 s, not a fixed sleep: under load the last ones may
# take a moment to go.)
left_behind() {
  local left i
  for i in $(seq 200); do
    left=$(pgrep -f -- "$1" | while read -r p; do
      [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = Z ] || echo "$p"
    done)
    [ -z "$left" ] && break
    sleep 0.05
  done
  if [ -n "$left" ]; then
    echo "left behind: $(ps -o pid,args -p $(echo $left | tr ' ' ,) 2>/dev/null)"
    kill -9 $left 2>/dev/null
    return 0
  fi
  return 1
}
