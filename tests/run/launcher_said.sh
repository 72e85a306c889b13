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
heads=$(grep -c '^loom run: the launcher said: "' "$tmp/btl.out")
quotes=$(grep -c '^loom run: the launcher said: "\|^loom run:   "' "$tmp/btl.out")
[ $rc != 0 ] && [ -s "$log" ] && [ "$heads" = 2 ] && [ "$quotes" -le 6 ] &&
  grep -q '^loom run: .*"It looks like MPI_INIT failed' "$tmp/btl.out" &&
  [ "$(grep -cF "($log)" "$tmp/btl.out")" = 2 ] &&
  ok "MPI_Init failed: the launcher quoted on each attempt ($quotes lines), with its log's path" ||
  { bad "MPI_Init failure not told: rc $rc, $heads heads, $quotes quotes"; cat "$tmp/btl.out"; }
# The quote comes before the verdict of its attempt.
awk '/^loom run: the launcher said/ { q = 1 } /^loom run: job failed/ { if (!q) bad = 1; q = 0 }
  END { exit bad }' "$tmp/btl.out" && ok "each attempt's quote before its 'job failed' line" ||
  { bad "quote order"; cat "$tmp/btl.out"; }
finish launcher_said
