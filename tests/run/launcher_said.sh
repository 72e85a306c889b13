#!/usr/bin/env bash
# A job that fails in MPI_Init (or wherever only the launcher says why):
# loom run's failure lines quote the launcher's first lines that read as
# errors (at most 3 per attempt) and name RUN/logs/launcher.log, where its
# messages went. Before, `OMPI_MCA_btl=bogus loom run -n 2 loom train ...`
# said only "rank 0 ... died from signal 9 (SIGKILL) before its first step".
# Open MPI only (its MCA variables make MPI_Init fail); elsewhere it skips.
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
"$LOOM" run --dry-run -n 2 prog | grep -q '^command: mpirun.openmpi\|^command: [^ ]*ompi\|^command: mpirun ' ||
  { echo "skipped: needs Open MPI's mpirun"; exit 77; }
head -c 20000 "$SRC/docs/run.md" >"$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=1
  --set model.d_model=32 --set model.heads=2 --set model.context=16 --set train.batch_size=2
  --set train.steps=2 --set checkpoint.enabled=false --quiet)

# A transport that does not exist: MPI_Init fails in every rank, on each of
# the two attempts (--max-restarts 1).
OMPI_MCA_btl=bogus "$LOOM" run -n 2 --timeout 60 --max-restarts 1 --restart-delay 0 \
  "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/btl" >"$tmp/btl.out" 2>&1
rc=$?
log="$tmp/btl/logs/launcher.log"
# Each attempt: before its 'job failed' line, the launcher quoted (at most
# 3 lines, the last naming the log) or, where nothing it wrote read as an
# error (under load Open MPI may print only its help system's own errors
# for one attempt), the log named; and across the attempts, MPI_Init's
# failure quoted.
attempts=$(awk -v lp="$log" '
  /^loom run: the launcher said: "/ { q = 1; n = 1; named = index($0, lp) > 0; next }
  /^loom run:   "/ { n++; named = index($0, lp) > 0; next }
  /^loom run: the launcher.s messages are in / { q = 1; n = 0; named = index($0, lp) > 0; next }
  /^loom run: job failed/ { if (!q || n > 3 || !named) bad = 1; q = 0; a++ }
  END { print (bad ? "bad" : a) }' "$tmp/btl.out")
[ $rc != 0 ] && [ -s "$log" ] && [ "$attempts" = 2 ] &&
  grep -qi '^loom run: .*".*\(MPI_Init\|A requested component was not found\)' "$tmp/btl.out" &&
  ! grep -q '^loom run: .*show_help.c' "$tmp/btl.out" &&
  ok "MPI_Init failed: each of the 2 attempts told the launcher's words or its log, before its verdict" ||
  { bad "MPI_Init failure not told: rc $rc, attempts '$attempts'"; cat "$tmp/btl.out"; }
finish launcher_said
