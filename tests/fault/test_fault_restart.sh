#!/usr/bin/env bash
# A restart under loom run --max-restarts goes on from the newest checkpoint
# the job itself wrote (LOOM_RUN_JOB, recorded in each manifest), whatever
# --resume told the first attempt: --resume DIR pruned since by
# checkpoint.keep, --resume DIR kept (keep 0), --resume never; a newer
# checkpoint of another run in the same directory is never taken; a job that
# wrote none yet starts again as the first attempt did. Each ends with the
# uninterrupted run's bits.
source "$(dirname "$0")/lib.sh"
skip_unless_launcher

run 2 "$tmp/ref"
ref=$(digest "$tmp/ref/ckpt")
[ $rc = 0 ] && [[ $ref == "step 30 "* ]] && ok "uninterrupted: $ref" ||
  { bad "uninterrupted run: rc $rc, $ref"; cat "$tmp/out"; }
# An earlier run stopped after step 10: the checkpoint the jobs name.
run 2 "$tmp/base" -- --stop-at 10
[ $rc = 0 ] && [ -d "$tmp/base/ckpt/step_00000010" ] && ok "stopped at step 10" ||
  { bad "stop at 10: rc $rc"; cat "$tmp/out"; }

going_on='restart 1 of job run-[0-9a-f]{16}: going on from the job.s newest checkpoint'

# --resume DIR with checkpoint.keep 1: the first attempt's save of step 20
# pruned DIR; the restart goes on from step 20 (it failed on the missing
# DIR at every restart). Two ranks: rank 0 finds, the others are told.
cp -r "$tmp/base" "$tmp/a"
LOOM_LOG=info LOOM_FAULT=1:24:exit run 2 "$tmp/a" --max-restarts 2 --restart-delay 0 -- \
  --set checkpoint.keep=1 --resume "$tmp/a/ckpt/step_00000010"
d=$(digest "$tmp/a/ckpt")
[ $rc = 0 ] && has "fault injected: exit" && has "$going_on" &&
  has "resuming from $tmp/a/ckpt/step_00000020 " && ! has "no such checkpoint" &&
  [ ! -d "$tmp/a/ckpt/step_00000010" ] && [ "$d" = "$ref" ] &&
  ok "--resume DIR pruned by keep 1: the restart went on from step 20, same bits" ||
  { bad "--resume DIR, keep 1: rc $rc, '$d'"; cat "$tmp/out"; }

# keep 0: DIR is still there, but the job's own step 20 is newer.
cp -r "$tmp/base" "$tmp/b"
LOOM_LOG=info LOOM_FAULT=0:24:exit run 1 "$tmp/b" --max-restarts 2 --restart-delay 0 -- \
  --set checkpoint.keep=0 --resume "$tmp/b/ckpt/step_00000010"
d=$(digest "$tmp/b/ckpt/step_00000030")
[ $rc = 0 ] && has "$going_on" && has "resuming from $tmp/b/ckpt/step_00000020 " &&
  [ "$(grep -c "resuming from $tmp/b/ckpt/step_00000010 " "$tmp/out")" = 1 ] &&
  [ "$d" = "$ref" ] &&
  ok "--resume DIR, keep 0: the restart went on from step 20, not DIR's 10, same bits" ||
  { bad "--resume DIR, keep 0: rc $rc, '$d'"; cat "$tmp/out"; }

# --resume never, beside another run's newer checkpoint (step 50, another
# seed): the restart goes on from the job's step 20, not from step 1 and not
# from the stranger's step 50.
run 1 "$tmp/c" -- --set train.seed=99 --set train.steps=50 --set checkpoint.every=50
other=$(digest "$tmp/c/ckpt/step_00000050")
[ $rc = 0 ] && [[ $other == "step 50 "* ]] || { bad "other run: rc $rc"; cat "$tmp/out"; }
LOOM_LOG=info LOOM_FAULT=0:24:exit run 1 "$tmp/c" --max-restarts 2 --restart-delay 0 -- --resume never
d=$(digest "$tmp/c/ckpt/step_00000030")
[ $rc = 0 ] && has "$going_on" && has "resuming from $tmp/c/ckpt/step_00000020 " &&
  ! has "resuming from .*step_00000050" && [ "$d" = "$ref" ] &&
  [ "$(digest "$tmp/c/ckpt/step_00000050")" = "$other" ] &&
  ok "--resume never: the restart went on from the job's step 20, not another run's 50, same bits" ||
  { bad "--resume never: rc $rc, '$d'"; cat "$tmp/out"; }

# The job failed before its first save: the restart starts as the first
# attempt did, from DIR.
cp -r "$tmp/base" "$tmp/d"
LOOM_LOG=info LOOM_FAULT=0:14:exit run 1 "$tmp/d" --max-restarts 2 --restart-delay 0 -- \
  --set checkpoint.keep=1 --resume "$tmp/d/ckpt/step_00000010"
d=$(digest "$tmp/d/ckpt")
[ $rc = 0 ] && has "restart 1 of job run-[0-9a-f]{16}: no checkpoint of this job in .* yet; starting as the first attempt did" &&
  [ "$(grep -c "resuming from $tmp/d/ckpt/step_00000010 " "$tmp/out")" = 2 ] && [ "$d" = "$ref" ] &&
  ok "no checkpoint of the job yet: the restart resumed from DIR again, same bits" ||
  { bad "no job checkpoint: rc $rc, '$d'"; cat "$tmp/out"; }

# A job id that is not one: an error naming the variable (rc 2).
LOOM_RUN_JOB='a/b' "$LOOM" train "${job[@]}" --set "log.run_dir=$tmp/e" >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && has "LOOM_RUN_JOB: 'a/b': a job id is" && ok "bad LOOM_RUN_JOB: rc 2" ||
  { bad "bad LOOM_RUN_JOB: rc $rc"; cat "$tmp/out"; }

finish
