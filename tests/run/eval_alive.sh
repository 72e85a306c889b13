#!/usr/bin/env bash
# A long evaluation is not a hang: the final evaluation covers the whole
# validation split, which can take far longer than a step. Each evaluation
# batch beats (loom_runstat_beat), and loom run's hang detection counts the
# beat as a sign of life: with --hang-timeout 2 a job whose final evaluation
# takes several seconds finishes instead of being killed as "no progress"
# (and restarted into the same evaluation).
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
for _ in 1 2 3 4 5 6 7 8; do cat "$SRC"/docs/*.md; done >"$tmp/text.txt"
# TEXT NAME: 2 ranks, 4 steps, then the final evaluation over half of TEXT
# (thousands of one-row batches) under --hang-timeout 2; sets rc.
evaluated() {
  "$LOOM" run -n 2 --hang-timeout 2 --max-restarts 0 "$LOOM" train "$SRC/examples/small_gpt.yaml" \
    --set "data.path=$1" --set data.val_fraction=0.5 --set model.layers=2 \
    --set model.d_model=64 --set model.heads=2 --set model.context=64 --set train.batch_size=1 \
    --set train.steps=4 --set log.every=1 --set train.eval_every=100 --set checkpoint.enabled=false \
    --set "log.run_dir=$tmp/$2" --quiet >"$tmp/$2.out" 2>&1
  rc=$?
}
# NAME: seconds from the last step's metrics line to the last line (the
# final evaluation's), empty if there is none.
eval_seconds() {
  python3 -c 'import json,sys
ls=[json.loads(l) for l in open(sys.argv[1])]
print(ls[-1]["time"] - [l for l in ls if "step_s" in l][-1]["time"])' "$tmp/$1/metrics.jsonl" 2>/dev/null
}
over_timeout() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 2.2 else 1)" "${1:-0}"; }

evaluated "$tmp/text.txt" run
t_last=$(eval_seconds run)
if [ $rc = 0 ] && grep -q '"val_loss"' "$tmp/run/metrics.jsonl"; then
  ok "a final evaluation of ${t_last:-?} s under --hang-timeout 2 finished"
else
  bad "rc $rc: $(tail -3 "$tmp/run.out")"
fi
# The evaluation must have outlasted the timeout for the check to mean
# anything.
over_timeout "$t_last" &&
  ok "the evaluation outlasted the hang timeout" ||
  bad "the evaluation took ${t_last:-?} s, not over the 2 s timeout: make the split larger"
# Uneven shares: rank 1's evaluation batches come 4 ms late (LOOM_FAULT
# slow_data), so rank 0 ends its share seconds before rank 1 and waits for
# it. Waiting for a rank that is still evaluating is not a hang either
# (before the fix rank 0 sat silent in the closing reduction and loom run
# stopped the job, more so on a loaded machine).
head -c 200000 "$tmp/text.txt" >"$tmp/small.txt"
LOOM_FAULT=1:4:slow_data:0.004 evaluated "$tmp/small.txt" run2
t2=$(eval_seconds run2)
if [ $rc = 0 ] && grep -q '"val_loss"' "$tmp/run2/metrics.jsonl"; then
  ok "rank 0 waited for rank 1's late evaluation share under --hang-timeout 2"
else
  bad "uneven evaluation shares: rc $rc: $(tail -3 "$tmp/run2.out")"
fi
over_timeout "$t2" &&
  ok "rank 1's share took ${t2} s, over the hang timeout" ||
  bad "rank 1's share took ${t2:-?} s, not over the 2 s timeout: more batches or a longer delay"
# A stop during the final evaluation: the last step's checkpoint is written
# before the evaluation, and the evaluation ends at the stop instead of
# running through the split (under SLURM a SIGKILL follows the SIGTERM after
# its grace period): exit 143 in seconds, step 4 saved, no evaluation logged.
# NAME [--set KEY=VALUE]...: that run, SIGTERM once step 4's checkpoint is
# there. Independent ranks (DDP) stop their shares and learn of it in the
# closing sums; a tensor group's, a pipeline's and ZeRO-3's ranks run each
# batch together and agree on the stop before each one.
stopped_in_eval() {
  local name=$1
  shift
  LOOM_FAULT=0:1:slow_data:0.05,1:1:slow_data:0.05 "$LOOM" run -n 2 --max-restarts 0 \
    "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/small.txt" \
    --set data.val_fraction=0.5 --set model.layers=2 --set model.d_model=64 \
    --set model.heads=2 --set model.context=64 --set train.batch_size=1 --set train.steps=4 \
    --set train.eval_every=100 --set checkpoint.every=100 --set "log.run_dir=$tmp/$name" "$@" \
    >"$tmp/$name.out" 2>&1 &
  local job=$!
  # Polls (never a fixed sleep) up to 60 s for step 4's checkpoint.
  for _ in $(seq 1200); do [ -e "$tmp/$name/ckpt/latest" ] && break; sleep 0.05; done
  local t0
  t0=$(date +%s.%N)
  kill -TERM $job
  wait $job
  rc=$?
  local took
  took=$(python3 -c "import sys, time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$t0")
  if [ $rc = 143 ] && grep -q "stopped by SIGTERM at step 4, checkpoint saved" "$tmp/$name.out" &&
    [ "$(cat "$tmp/$name/ckpt/latest")" = step_00000004 ] && ! grep -q '"val_loss"' "$tmp/$name/metrics.jsonl"; then
    ok "$name: SIGTERM during the final evaluation: exit 143 after $took s, step 4 saved, nothing logged of it"
  else
    bad "$name: SIGTERM during the final evaluation: rc $rc after $took s: $(tail -3 "$tmp/$name.out")"
  fi
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 20 else 1)" "$took" &&
    ok "$name: the stop did not wait for the evaluation (${took} s)" ||
    bad "$name: the stop waited ${took} s for the evaluation"
}
stopped_in_eval stop
# A stop during a periodic evaluation (step 4 of 8, its checkpoint written
# first) stops the run at that step, as one during the step does: before,
# it trained step 5 first and saved that.
LOOM_FAULT=0:1:slow_data:0.05,1:1:slow_data:0.05 "$LOOM" run -n 2 --max-restarts 0 \
  "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/small.txt" \
  --set data.val_fraction=0.5 --set model.layers=2 --set model.d_model=64 \
  --set model.heads=2 --set model.context=64 --set train.batch_size=1 --set train.steps=8 \
  --set train.eval_every=4 --set train.eval_batches=0 --set checkpoint.every=4 \
  --set "log.run_dir=$tmp/periodic" >"$tmp/periodic.out" 2>&1 &
job=$!
for _ in $(seq 1200); do [ -e "$tmp/periodic/ckpt/latest" ] && break; sleep 0.05; done
kill -TERM $job
wait $job
rc=$?
if [ $rc = 143 ] && grep -q "stopped by SIGTERM at step 4, checkpoint saved" "$tmp/periodic.out" &&
  [ "$(cat "$tmp/periodic/ckpt/latest")" = step_00000004 ] && [ ! -e "$tmp/periodic/ckpt/step_00000005" ]; then
  ok "SIGTERM during a periodic evaluation: exit 143, stopped at its step 4"
else
  bad "SIGTERM during a periodic evaluation: rc $rc, latest $(cat "$tmp/periodic/ckpt/latest" 2>/dev/null): $(tail -3 "$tmp/periodic.out")"
fi
# Its resume runs step 4's evaluation first: the checkpoint was saved
# before the evaluation the stop cut, so metrics.jsonl had none (before, the
# resumed run went on to step 5 and step 4 never had one). Then a run that
# evaluated at its stop step (--stop-at 4) is resumed: nothing is redone.
# NAME [ARG]...: 2 ranks of the periodic run's settings, into NAME.
periodic() {
  local name=$1
  shift
  LOOM_LOG=info "$LOOM" run -n 2 --max-restarts 0 "$LOOM" train "$SRC/examples/small_gpt.yaml" \
    --set "data.path=$tmp/small.txt" --set data.val_fraction=0.5 --set model.layers=2 \
    --set model.d_model=64 --set model.heads=2 --set model.context=64 --set train.batch_size=1 \
    --set train.steps=8 --set train.eval_every=4 --set train.eval_batches=4 \
    --set checkpoint.every=4 --set "log.run_dir=$tmp/$name" "$@" >>"$tmp/$name.out" 2>&1
  rc=$?
}
# NAME STEP: how many evaluation lines of STEP metrics.jsonl holds.
evals_at() {
  python3 -c 'import json,sys
print(sum(1 for l in open(sys.argv[1]) if "val_loss" in json.loads(l) and json.loads(l)["step"] == int(sys.argv[2])))' \
    "$tmp/$1/metrics.jsonl" "$2"
}
periodic periodic --resume auto
if [ $rc = 0 ] && grep -q "step 4's evaluation is missing" "$tmp/periodic.out" &&
  [ "$(evals_at periodic 4)" = 1 ] && [ "$(evals_at periodic 8)" = 1 ]; then
  ok "the resume ran step 4's evaluation the stop had cut, once, then trained to step 8"
else
  bad "resume after a stop in step 4's evaluation: rc $rc, evaluations at 4: $(evals_at periodic 4): $(tail -3 "$tmp/periodic.out")"
fi
periodic atstop --stop-at 4
periodic atstop --resume auto
if [ $rc = 0 ] && ! grep -q "evaluation is missing" "$tmp/atstop.out" &&
  [ "$(evals_at atstop 4)" = 1 ] && [ "$(evals_at atstop 8)" = 1 ]; then
  ok "a resume after an evaluation that finished redoes nothing"
else
  bad "resume after --stop-at 4: rc $rc, evaluations at 4: $(evals_at atstop 4): $(tail -3 "$tmp/atstop.out")"
fi
stopped_in_eval stop_tp --set parallel.tp=2
stopped_in_eval stop_pp --set parallel.pp=2
stopped_in_eval stop_zero3 --set parallel.strategy=zero3
finish run_eval_alive
