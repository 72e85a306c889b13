#!/usr/bin/env bash
# Open MPI's shared-memory segments (vader_segment.*, 4 MiB of RAM a rank)
# go into a directory of the job's own (in LOOM_RUN_SHM, default /dev/shm),
# not into /dev/shm itself, where a launcher killed outright (SIGKILL) left
# them for good. loom run removes that directory at the end; the next loom
# run removes one whose loom run is gone (its owner lock free), and only the
# names loom run and Open MPI write there. Everything here lives in this
# test's own directory (TMPDIR and LOOM_RUN_SHM point into it).
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
case "$("$LOOM" run --dry-run -n 2 "$LOOM" --version 2>&1)" in
*openmpi*) ;;
*)
  echo "skipped: the launcher is not Open MPI's mpirun"
  exit 77
  ;;
esac
mkdir -p "$tmp/shm" "$tmp/t"
export LOOM_RUN_SHM=$tmp/shm TMPDIR=$tmp/t
# NAME STEPS: 2 ranks of small_mlp into $tmp/NAME, in the foreground.
train() {
  "$LOOM" run -n 2 --max-restarts 0 "$LOOM" train "$SRC/examples/small_mlp.yaml" \
    --set "train.steps=$2" --set "log.run_dir=$tmp/$1" --quiet >"$tmp/$1.out" 2>&1
}
segments() { find "$tmp/shm" -name 'vader_segment.*' | wc -l; }
shm_dirs() { find "$tmp/shm" -mindepth 1 -maxdepth 1 | wc -l; }

# A long run, killed with its launcher once its segments are there.
"$LOOM" run -n 2 --max-restarts 0 "$LOOM" train "$SRC/examples/small_mlp.yaml" \
  --set train.steps=100000000 --set "log.run_dir=$tmp/long" --quiet >"$tmp/long.out" 2>&1 &
job=$!
for _ in $(seq 1200); do [ "$(segments)" -ge 2 ] && break; sleep 0.05; done
n=$(segments)
[ "$n" -ge 2 ] && ok "the ranks' $n segments are in the job's directory under LOOM_RUN_SHM" ||
  bad "no segment appeared under LOOM_RUN_SHM: $(find "$tmp/shm") $(tail -3 "$tmp/long.out")"
# loom run and its launcher (mpirun) at once: neither can clean up
kill -KILL $job $(pgrep -P $job) 2>/dev/null
wait $job 2>/dev/null
# the ranks go when their launcher does; waited for (never a fixed sleep)
for _ in $(seq 600); do pgrep -f "log.run_dir=$tmp/long" >/dev/null || break; sleep 0.05; done
[ "$(segments)" -ge 2 ] && ok "SIGKILL of loom run and mpirun left the segments in the job's directory" ||
  bad "the segments went with SIGKILL: the check below means nothing"
dir=$(find "$tmp/shm" -mindepth 1 -maxdepth 1 -name 'loom-run-*')

# A stranger's file in it: the next run leaves that directory whole.
echo mine >"$dir/notes.txt"
train next 3 || bad "the next run failed: $(tail -3 "$tmp/next.out")"
[ -f "$dir/notes.txt" ] && [ "$(segments)" -ge 2 ] &&
  ok "a stale directory holding a file loom did not write is left whole" ||
  bad "the stale directory with a stranger's file was touched: $(find "$tmp/shm")"
rm "$dir/notes.txt"

# Without it, the next run removes the dead job's directory, and its own.
train next2 3 || bad "the next run failed: $(tail -3 "$tmp/next2.out")"
[ "$(shm_dirs)" = 0 ] && ok "the next loom run removed the dead job's segments and its own" ||
  bad "left under LOOM_RUN_SHM: $(find "$tmp/shm")"
# Where no directory can be made (an immutable directory: root cannot
# write there either), the job runs as before and nothing is said on
# stderr: it is not an error (before, every run printed "loom run: cannot
# make a directory in ..."). Where chattr +i does not work, not checked.
mkdir "$tmp/imm"
trap 'chattr -i "$tmp/imm" 2>/dev/null; rm -rf "$tmp"' EXIT
if chattr +i "$tmp/imm" 2>/dev/null; then
  LOOM_RUN_SHM=$tmp/imm train immrun 3
  rc=$?
  chattr -i "$tmp/imm"
  if [ $rc = 0 ] && ! grep -q "loom run: cannot" "$tmp/immrun.out"; then
    ok "LOOM_RUN_SHM where nothing can be made: the job ran, nothing said"
  else
    bad "LOOM_RUN_SHM where nothing can be made: rc $rc: $(tail -3 "$tmp/immrun.out")"
  fi
else
  echo "not checked: chattr +i does not work on $tmp"
fi
finish run_shm_segments
