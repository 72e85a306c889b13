#!/usr/bin/env bash
# Stops lose no work: loom run -n 2 ... loom train stopped by SIGTERM, SIGHUP
# or --timeout, or with SIGTERM sent to one rank directly, ends with every
# rank stopped at one agreed step and that step saved; loom run says so in
# one line and exits 128 + signal (124 for --timeout); nothing is restarted
# and nothing is left running.
source "$(dirname "$0")/lib.sh"
skip_unless_launcher
long=("${job[@]}" --set train.steps=1000000 --set checkpoint.every=1000000)
# Polls (never a fixed sleep) up to 60 s.
wait_until() {
  local i
  for i in $(seq 1200); do "$@" && return 0; sleep 0.05; done
  return 1
}
# Rank $1 of the running job has completed a step.
stepped() {
  local s
  s=$(awk '$1 == "step" { print $2 }' "$TMPDIR"/loom-run-*/attempt-0/rank-"$1" 2>/dev/null | head -1)
  [ -n "$s" ] && [ "$s" != - ]
}
# start DIR [loom run options]: the job in the background, its pid in $jobpid.
start() {
  local dir=$1
  shift
  "$LOOM" run -n 2 "$@" "$LOOM" train "${long[@]}" --set "log.run_dir=$dir" >"$tmp/out" 2>&1 &
  jobpid=$!
}
check_stopped() { # name dir want_rc by
  local name=$1 dir=$2 want=$3 by=$4 why="" step d
  step=$(sed -n "s/^loom run: stopped by $by at step \([0-9]*\), checkpoint saved.*/\1/p" "$tmp/out")
  [ "$rc" = "$want" ] || why="$why rc $rc;"
  [ -n "$step" ] || why="$why no 'stopped by $by at step N, checkpoint saved' line;"
  d=$(digest "$dir/ckpt")
  [ -n "$step" ] && [[ $d == "step $step "* ]] || why="$why checkpoint '$d' is not of step $step;"
  has "restart" && why="$why restarted;"
  left_behind "$dir" && why="$why processes left behind;"
  [ -z "$why" ] && ok "$name: rc $want, stopped at step $step, saved" || { bad "$name:$why"; cat "$tmp/out"; }
}
hydra=$("$LOOM" run --dry-run -n 2 prog | grep mpiexec)
for sig in TERM HUP INT; do
  dir="$tmp/sig_$sig"
  start "$dir" --max-restarts 1
  wait_until stepped 0 && wait_until stepped 1
  kill -$sig $jobpid
  wait $jobpid
  rc=$?
  case $sig in TERM) want=143 ;; HUP) want=129 ;; INT) want=130 ;; esac
  check_stopped "SIG$sig to loom run" "$dir" $want "SIG$sig"
  # Open MPI's banners go to RUN/logs/launcher.log, not to the console;
  # MPICH's hydra writes none for ranks that exit (with 143) on their own.
  if [ $sig = TERM ] && [ -z "$hydra" ]; then
    ! has "Primary job|mpirun.* detected that|^-----" && grep -q "Primary job" "$dir/logs/launcher.log" &&
      ok "launcher banners in $dir/logs/launcher.log, not on the console" ||
      { bad "launcher banners"; cat "$tmp/out"; }
  elif [ $sig = TERM ]; then
    ! has "BAD TERMINATION|EXIT STRING|^=====" && ok "no launcher banner on the console" ||
      { bad "launcher banners"; cat "$tmp/out"; }
  fi
done
# --timeout: SIGTERM to the ranks when the time is up, exit code 124.
dir="$tmp/timeout"
start "$dir" --timeout 3
wait $jobpid
rc=$?
check_stopped "--timeout 3" "$dir" 124 "the time limit"
# SIGTERM sent to one rank, not to loom run: all stop at one step and save;
# asked for, so not a failure and not restarted.
dir="$tmp/direct"
start "$dir" --max-restarts 1
wait_until stepped 1
pid=$(awk '$1 == "pid" { print $2 }' "$TMPDIR"/loom-run-*/attempt-0/rank-1)
kill -TERM "$pid"
wait $jobpid
rc=$?
check_stopped "SIGTERM sent to rank 1" "$dir" 143 "SIGTERM sent to the ranks"
! has "died from signal" || bad "SIGTERM sent to rank 1: reported as a death"

# -- Faults told plainly.
# loom ckpt inspect on a run directory finds its ckpt/ itself.
"$LOOM" ckpt inspect "$tmp/sig_TERM" >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && has "^checkpoints in $tmp/sig_TERM/ckpt$" && has "training resumes from:" &&
  ok "loom ckpt inspect RUN: looks in RUN/ckpt" || { bad "ckpt inspect RUN: rc $rc"; cat "$tmp/out"; }
# The word loom is this loom: no need for it on PATH.
(cd "$tmp" && PATH=/usr/bin:/bin "$LOOM" run -n 2 loom train "${job[@]}" --set train.steps=4 \
  --set "log.run_dir=$tmp/nopath" >"$tmp/out" 2>&1)
rc=$?
[ $rc = 0 ] && has "done at step 4" && ok "loom not on PATH: loom run -n 2 loom train works" ||
  { bad "loom not on PATH: rc $rc"; cat "$tmp/out"; }
# The console's loss is the metrics file's (the mean of the window).
"$LOOM" train "${job[@]}" --set train.steps=4 --set log.every=2 --set log.progress=lines \
  --set "log.run_dir=$tmp/lossq" >"$tmp/out" 2>&1
c=$(sed -n 's/^step 4\/4 .*| loss \([0-9.]*\) |.*/\1/p' "$tmp/out")
m=$(grep '"step":4,' "$tmp/lossq/metrics.jsonl" | grep -o '"loss":[-0-9.e+]*' | cut -d: -f2)
[ -n "$c" ] && [ -n "$m" ] && [ "$(awk -v m="$m" 'BEGIN { printf "%.4f", m }')" = "$c" ] &&
  ok "console loss $c = metrics loss $m at step 4" || { bad "console loss '$c' vs metrics '$m'"; cat "$tmp/out"; }
# A program that is not there.
"$LOOM" run -n 2 no-such-program-xyz >"$tmp/out" 2>&1
rc=$?
[ $rc = 127 ] && has "^loom run: program not found: no-such-program-xyz$" && ! has "signal" &&
  ok "program not found: rc 127, said so" || { bad "program not found: rc $rc"; cat "$tmp/out"; }
finish
