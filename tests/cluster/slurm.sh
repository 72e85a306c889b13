#!/usr/bin/env bash
# loom under a real SLURM (tests/cluster/slurmd.sh: munged, slurmctld and
# slurmd of this test's own, on this machine): examples/slurm/train.sbatch
# with 2 tasks trains to the bits of the same run under plain `loom run -n
# 2` (deterministic mode), through loom run (srun --mpi=pmix or pmi2) and
# through srun by hand; a job requeued mid-run (`scontrol requeue` once a
# checkpoint exists) starts again, resumes from its checkpoint and ends
# with the same bits; inside an allocation loom run names the failing rank
# under srun and under mpirun (whose ranks all see SLURM_PROCID=0) and
# gives each task SLURM_CPUS_PER_TASK threads; nothing is left behind.
# Skips (77) when not root or SLURM cannot be installed.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/slurmd.sh"
export LOOM_LOG=info
slurm_can || {
  echo "skipped: needs root and SLURM (munge slurmctld slurmd slurm-client), which could not be installed"
  exit 77
}
trap 'slurm_down >/dev/null; rm -rf "$tmp"' EXIT
t_start=$SECONDS
slurm_up || {
  bad "starting munged, slurmctld and slurmd: $(tail -n 5 "$SLURM_DIR"/log/*.log 2>/dev/null)"
  finish cluster_slurm
}
ok "munged, slurmctld and slurmd up in $((SECONDS - t_start)) s (ports $(grep -h 'Port=' "$SLURM_CONF" | tr '\n' ' '))"

# Everything a job writes stays in $tmp: Open MPI's session directory and
# shared-memory files, loom run's job directory.
jobenv=(env SLURM_TEST_MARK="$SLURM_TEST_MARK" TMPDIR="$SLURM_DIR/tmp" LOOM_BIN="$LOOM"
  OMPI_MCA_btl_vader_backing_directory="$SLURM_DIR/tmp")
cfg=("$SRC/examples/small_mlp.yaml" --set train.steps=16 --set checkpoint.every=4
  --set checkpoint.keep=8 --set log.every=1 --set train.eval_every=8 --set parallel.deterministic=true)

losses() { # RUN: the last loss and val_loss of every step in metrics.jsonl
  python3 -c 'import json, sys
seen = {}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    for k in ("loss", "val_loss"):
        if k in r: seen[(r["step"], k)] = repr(r[k])
for (s, k), v in sorted(seen.items()): print(s, k, v)' "$1"
}
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_gone() { [ -z "$(squeue -h -j "$1" 2>/dev/null)" ]; }
# Requeued and its first start gone: back in the queue, and no slurmstepd
# of the job left (one may outlive the job's end by a few seconds, and a
# step of the next start that came sooner would find its PMIx socket and
# fail: SLURM holds a requeued job back for two minutes for such reasons).
stepd_of() { # JOBID: pids of this cluster's slurmstepd of that job
  local p
  for p in $(slurm_left); do
    case "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in "slurmstepd: [$1."*) echo "$p" ;; esac
  done
}
job_requeued() {
  [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = PENDING ] && node_idle && [ -z "$(stepd_of "$1")" ]
}
latest_is() { grep -qx "step_0*$2" "$1/ckpt/latest" 2>/dev/null; }
submit() { # NAME [VAR=VALUE...]: sbatch train.sbatch into $tmp/NAME; the job id in $jid
  local name=$1
  shift
  jid=$("${jobenv[@]}" RUN_DIR="$tmp/$name" "$@" sbatch --parsable -o "$tmp/$name.out" \
    -J "$name" "$SRC/examples/slurm/train.sbatch" "${cfg[@]}" 2>"$tmp/$name.sbatch")
  [ -n "$jid" ] || bad "$name: sbatch: $(cat "$tmp/$name.sbatch")"
}
check_job() { # NAME WHAT: the job ended COMPLETED, with the reference's losses
  local name=$1 what=$2 st
  st=$(job_state "$jid")
  if [ "$st" = COMPLETED ] && [ -s "$tmp/$name/metrics.jsonl" ] &&
    [ "$(losses "$tmp/$name")" = "$(losses "$tmp/ref")" ]; then
    ok "$what: COMPLETED, every loss and val_loss equal loom run -n 2's, bit for bit"
  else
    bad "$what: state $st; $(diff <(losses "$tmp/ref") <(losses "$tmp/$name" 2>&1) | head -4); $(tail -5 "$tmp/$name.out")"
  fi
  [ -d "$tmp/$name/ckpt/step_00000016" ] && ok "$what: the final checkpoint is in the run directory" ||
    bad "$what: no final checkpoint: $(ls "$tmp/$name/ckpt" 2>&1)"
}

# The reference: the same config under plain loom run.
"$LOOM" run -n 2 --timeout 120 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/ref" >"$tmp/ref.out" 2>&1 ||
  bad "loom run -n 2: $(tail -3 "$tmp/ref.out")"

# 1. train.sbatch through loom run, which starts the ranks with srun.
t=$SECONDS
submit plain
wait_for 120 "job $jid (plain)" job_gone "$jid"
check_job plain "sbatch train.sbatch (loom run -> srun) in $((SECONDS - t)) s"
grep -q '2 rank(s) x 1 thread(s)' "$tmp/plain.out" &&
  grep -q 'data parallel (ddp): 2 ranks x 1 thread(s)' "$tmp/plain.out" &&
  ok "plain: 2 ranks, 1 thread each (--cpus-per-task=1)" ||
  bad "plain: ranks and threads: $(grep -h 'rank(s)\|ranks x' "$tmp/plain.out")"

# 2. The same with srun by hand.
t=$SECONDS
submit bysrun LAUNCHER=srun
wait_for 120 "job $jid (srun)" job_gone "$jid"
check_job bysrun "sbatch train.sbatch with LAUNCHER=srun in $((SECONDS - t)) s"

# 3. Requeued mid-run: rank 0 is slow after step 5 in the first start only
# (LOOM_FAULT fires while LOOM_RESTART_COUNT is 0; loom run takes it from
# SLURM_RESTART_COUNT). Once step 4's checkpoint exists the job is
# requeued; its ranks get SIGTERM (they may save the step they stop at),
# it goes back to the queue and, started again, resumes from the latest
# checkpoint. SLURM holds a requeued job back for two minutes (its begin
# time); the test lets it start at once.
t=$SECONDS
submit requeued LOOM_FAULT=0:5:slow:0.5
wait_for 120 "step 4's checkpoint of job $jid" latest_is "$tmp/requeued" 4 &&
  scontrol requeue "$jid" && ok "requeued job $jid at step $(($(cat "$tmp/requeued/metrics.jsonl" | grep -c '"loss"'))) (checkpoint of step 4 saved)" ||
  bad "could not requeue job $jid: $(job_state "$jid")"
wait_for 60 "job $jid back in the queue" job_requeued "$jid" &&
  scontrol update JobId="$jid" StartTime=now || bad "job $jid was not requeued: $(job_state "$jid")"
wait_for 120 "job $jid (requeued)" job_gone "$jid"
check_job requeued "requeued job in $((SECONDS - t)) s"
restarts=$(scontrol show job "$jid" | grep -o 'Restarts=[0-9]*')
[ "$restarts" = Restarts=1 ] && grep -q 'restart 1, run directory' "$tmp/requeued.out" &&
  ok "requeued: ran twice ($restarts), the second start saw SLURM_RESTART_COUNT=1" ||
  bad "requeued: $restarts; $(grep 'loom job' "$tmp/requeued.out")"
resumed=$(grep -o 'resuming from [^ ]* (step [0-9]*' "$tmp/requeued.out" | grep -o '[0-9]*$')
[ -n "$resumed" ] && [ "$resumed" -ge 4 ] && [ "$resumed" -lt 16 ] &&
  grep -q 'LOOM_FAULT not armed: this is restart 1' "$tmp/requeued.out" &&
  ok "requeued: resumed from its checkpoint of step $resumed, the fault not armed again" ||
  bad "requeued: no resume from a checkpoint: $(grep -i 'resum\|fault' "$tmp/requeued.out")"

# 4. The time-limit warning (--signal=B:USR1@120), sent by hand: the
# script stops the ranks, which save the step they are on, and requeues
# the job itself.
t=$SECONDS
submit warned LOOM_FAULT=0:5:slow:0.5
wait_for 120 "step 4's checkpoint of job $jid" latest_is "$tmp/warned" 4 &&
  scancel --batch --signal=USR1 "$jid" || bad "could not signal job $jid: $(job_state "$jid")"
wait_for 60 "job $jid back in the queue" job_requeued "$jid" &&
  scontrol update JobId="$jid" StartTime=now || bad "job $jid did not requeue itself: $(job_state "$jid"); $(tail -3 "$tmp/warned.out")"
wait_for 120 "job $jid (warned)" job_gone "$jid"
# Under load SLURM 22.05 was seen (once in CI) to fail the second start of
# a job that requeued itself, before its script printed anything
# (JobState=FAILED). loom's part was done (the ranks saved, the script
# requeued the job): say what SLURM said, requeue it once more, go on.
if [ "$(job_state "$jid")" != COMPLETED ] && ! grep -q 'resuming from' "$tmp/warned.out"; then
  echo "note: SLURM's second start of job $jid failed before it printed: $(scontrol show job "$jid" | grep -o 'JobState=[^ ]*\|Reason=[^ ]*\|ExitCode=[^ ]*' | tr '\n' ' '); requeued once more"
  scontrol requeue "$jid" 2>/dev/null
  wait_for 60 "job $jid back in the queue" job_requeued "$jid" && scontrol update JobId="$jid" StartTime=now
  wait_for 120 "job $jid (warned, again)" job_gone "$jid"
fi
check_job warned "job warned of its time limit in $((SECONDS - t)) s"
stop=$(grep -o 'stopped by SIGTERM at step [0-9]*, checkpoint saved' "$tmp/warned.out" | grep -o 'step [0-9]*')
resumed=$(grep -o 'resuming from [^ ]* (step [0-9]*' "$tmp/warned.out" | grep -o 'step [0-9]*')
[ -n "$stop" ] && [ "$stop" = "$resumed" ] && grep -q 'stopped before the time limit.*requeueing' "$tmp/warned.out" &&
  ok "warned: stopped at $stop with a checkpoint, requeued itself, resumed from $resumed" ||
  bad "warned: stop '$stop', resumed '$resumed': $(grep -i 'stop\|resum\|requeu' "$tmp/warned.out")"

# 5. Ranks and threads inside an allocation: rank 1 fails; loom run names
# it under srun (PMIX_RANK/PMI_RANK) and under mpirun, whose ranks all see
# SLURM_PROCID=0; each task's threads are its --cpus-per-task.
for l in srun mpirun; do
  "${jobenv[@]}" LOOM_FAULT=1:3:exit:3 timeout 120 salloc -Q -n 2 -c 2 "$LOOM" run --launcher $l \
    "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/alloc-$l" >"$tmp/alloc-$l.out" 2>&1
  rc=$?
  if [ $rc = 3 ] && grep -q 'loom run: rank 1 .*exited with code 3 after step 3' "$tmp/alloc-$l.out" &&
    grep -q 'ddp): 2 ranks x 2 thread(s)' "$tmp/alloc-$l.out"; then
    ok "in an allocation, --launcher $l: rank 1's failure named, 2 ranks x 2 threads (-c 2)"
  else
    bad "--launcher $l in an allocation: exit code $rc: $(grep 'loom run\|ranks x' "$tmp/alloc-$l.out")"
  fi
done
dry=$("${jobenv[@]}" timeout 60 salloc -Q -n 2 -c 2 "$LOOM" run --dry-run "$LOOM" train x.yaml 2>&1)
echo "$dry" | grep -q '^command: srun -n 2 --kill-on-bad-exit=1 --mpi=pmi[x2] --cpus-per-task=2 ' &&
  ok "loom run in an allocation: $(echo "$dry" | grep '^command' | cut -d' ' -f2-7)" ||
  bad "loom run --dry-run in an allocation: $dry"

# srun without an MPI plugin: each task would come up alone and train its
# own one-rank job into the same run directory; loom says so and fails.
"${jobenv[@]}" timeout 60 srun -Q -n 2 --mpi=none "$LOOM" train "${cfg[@]}" \
  --set "log.run_dir=$tmp/nopmi" >"$tmp/nopmi.out" 2>&1
rc=$?
[ $rc != 0 ] && grep -q 'srun started 2 tasks .* alone in its world.*srun --mpi=pmi' "$tmp/nopmi.out" &&
  ok "srun --mpi=none: refused (exit code $rc), naming the --mpi to use" ||
  bad "srun --mpi=none: exit code $rc: $(head -c 600 "$tmp/nopmi.out")"

slurm_down
left=$(slurm_left)
[ -z "$left" ] && ok "teardown: no daemon or job process left" ||
  bad "left running: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)"
for p in $left; do kill -KILL "$p" 2>/dev/null; done
echo "cluster_slurm: $((SECONDS - t_start)) s"
finish cluster_slurm
