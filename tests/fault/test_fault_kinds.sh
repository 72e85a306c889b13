#!/usr/bin/env bash
# LOOM_FAULT on rank 1 of 2, between checkpoints, under loom run: with
# --max-restarts 2 each kind (exit, segv, hang, corrupt, slow) ends in a
# finished job whose state equals the uninterrupted run's bit for bit, with
# nothing left running; with --max-restarts 0 the job fails with the rank's
# status. A LOOM_FAULT that does not parse is a clear error at the start.
source "$(dirname "$0")/lib.sh"
skip_unless_launcher

# -- a bad LOOM_FAULT: exit code 2 and one line naming the item, at once.
for spec in "1:x:segv|step 'x' is not a step number" \
  "1:5:melt|unknown kind 'melt'" "1:5|expected RANK:STEP:KIND" \
  "0:5:exit:0|exit code '0' is not in 1..255" \
  "0:5:segv:2|kind 'segv' takes no argument" \
  "1:5:exit|rank 1 does not exist in a job of 1 rank"; do
  LOOM_FAULT=${spec%%|*} "$LOOM" train "${job[@]}" --set "log.run_dir=$tmp/bad" \
    >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && has "LOOM_FAULT: .*${spec#*|}" && [ ! -d "$tmp/bad/ckpt" ] &&
    ok "LOOM_FAULT=${spec%%|*}: rc 2, '${spec#*|}'" ||
    { bad "LOOM_FAULT=${spec%%|*}: rc $rc"; cat "$tmp/out"; }
done
# Not armed after a restart.
LOOM_RESTART_COUNT=1 LOOM_FAULT=0:3:exit:9 "$LOOM" train "${job[@]}" \
  --set train.steps=5 --set "log.run_dir=$tmp/restarted" >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && ! has "fault injected" && ok "LOOM_RESTART_COUNT=1: not armed" ||
  { bad "LOOM_RESTART_COUNT=1: rc $rc"; cat "$tmp/out"; }

# -- the uninterrupted run.
run 2 "$tmp/ref"
ref=$(digest "$tmp/ref/ckpt")
[ $rc = 0 ] && [[ $ref == "step 30 "* ]] && ok "uninterrupted: $ref (${secs} s)" ||
  { bad "uninterrupted run: rc $rc, $ref"; cat "$tmp/out"; }

# -- each kind under --max-restarts 2.
# (async: saves on background threads, rank 0 committing on its own; the
# corrupt fault then fires when the commit of step 20 is concluded, at the
# save of step 30.)
for item in 1:14:exit:3 1:14:segv 1:14:hang 1:14:corrupt 1:24:slow:0.1 \
  1:14:exit:async 1:14:corrupt:async; do
  spec=${item%:async}
  opt=()
  [ "$spec" != "$item" ] && opt=(--set checkpoint.async=true)
  kind=$(echo "$spec" | cut -d: -f3)
  dir="$tmp/k_$kind${opt[*]:+_async}"
  to=$LOOM_COMM_TIMEOUT
  [ "$kind" = hang ] && to=2
  # segv under ASan: the kernel's signal, not ASan's report of it.
  ao=$ASAN_OPTIONS
  [ "$kind" = segv ] && ao="$ao:handle_segv=0"
  LOOM_FAULT=$spec LOOM_COMM_TIMEOUT=$to ASAN_OPTIONS=$ao \
    run 2 "$dir" --max-restarts 2 --restart-delay 0 -- "${opt[@]}"
  d=$(digest "$dir/ckpt")
  why=""
  [ $rc = 0 ] || why="$why rc $rc;"
  has "fault injected: $kind" || why="$why no 'fault injected: $kind';"
  if [ "$kind" = slow ]; then
    has "restart" && why="$why restarted;"
  else
    has "restart 1 of 2" || why="$why no restart;"
    has "restart 2 of 2" && why="$why restarted twice;"
  fi
  case $kind in
  segv)
    has "signal 11" || why="$why signal 11 not reported;"
    # The launcher's banner (Open MPI's, or hydra's on its stdout) goes to
    # RUN/logs/launcher.log, not to the console.
    has "Primary job|noticed that|BAD TERMINATION|EXIT STRING|^=====|^-----" &&
      why="$why a launcher banner on the console;"
    [ -s "$dir/logs/launcher.log" ] || why="$why no launcher.log;" ;;
  hang) has "watchdog" || why="$why no watchdog;" ;;
  corrupt)
    has "step_00000020 is not usable.*shard_00001.bin.*checksum mismatch" ||
      why="$why damage not named;"
    has "using the older checkpoint .*step_00000010" || why="$why no fallback;" ;;
  esac
  [[ $d == "step 30 "* ]] && [ "$d" = "$ref" ] || why="$why state '$d' != '$ref';"
  left_behind "$dir" && why="$why processes left behind;"
  if [ -z "$why" ]; then
    ok "$item, --max-restarts 2: finished, same bits (${secs} s)"
  else
    bad "$item:$why"
    cat "$tmp/out"
  fi
done

# -- the standby group's ranks warm up (forward and backward, state restored)
# before their gate, and the restart is theirs: rank 1 hangs at step 14 (the
# live group stalls, holding the run directory's lock), the standby group
# warms up and waits at its gate (its rank 0 says it warmed up), then rank 1 is
# killed. The standby's rank 0 locks the run directory once past its gate;
# before, it tried while the live group held the lock, exited 2 ("in use
# by another run") and the restart was a cold launch. Same bits at the end.
mkdir -p "$tmp/sbt"
TMPDIR="$tmp/sbt" LOOM_LOG=info LOOM_FAULT=1:14:hang \
  "$LOOM" run -n 2 --timeout 120 --max-restarts 1 --restart-delay 0 \
  --standby on --report "$tmp/warm.report" "$LOOM" train "${job[@]}" \
  --set "log.run_dir=$tmp/warm" >"$tmp/out" 2>&1 &
jb=$!
# Until the standby has warmed up (its rank 0 says so; the gate comes next),
# 60 s at most.
for _ in $(seq 1200); do
  has "warmed up before the checkpoint" && break
  kill -0 $jb 2>/dev/null || break
  sleep 0.05
done
pid=$(awk '$1 == "pid" { print $2 }' "$tmp"/sbt/loom-run-*/attempt-0/rank-1 2>/dev/null)
[ -n "$pid" ] && kill -9 "$pid"
wait $jb
rc=$?
d=$(digest "$tmp/warm/ckpt")
[ $rc = 0 ] && has "restart 1 of 1" && has "warmed up before the checkpoint" &&
  ! has "in use by another run" &&
  grep '"event":"restart"' "$tmp/warm.report" | grep -q '"standby":true' &&
  [ "$d" = "$ref" ] && ! left_behind "$tmp/warm" &&
  ok "standby warmed up, restarted from its gate: same bits" ||
  { bad "standby restart: rc $rc, state '$d' != '$ref'"; cat "$tmp/out" "$tmp/warm.report"; }

# -- --max-restarts 0: the failing rank's status, and a message.
LOOM_FAULT=1:14:exit:3 run 2 "$tmp/n_exit" --max-restarts 0
[ $rc = 3 ] && has "fault injected: exit 3 at step 14" &&
  has "loom run: .*rank 1.*code 3" &&
  ! left_behind "$tmp/n_exit" &&
  [ "$(digest "$tmp/n_exit/ckpt" | cut -d' ' -f2)" = 10 ] &&
  ok "exit 3, --max-restarts 0: rc 3, step 10 kept" ||
  { bad "exit 3, --max-restarts 0: rc $rc"; cat "$tmp/out"; }
ASAN_OPTIONS="${ASAN_OPTIONS}:handle_segv=0" LOOM_FAULT=1:14:segv \
  run 2 "$tmp/n_segv" --max-restarts 0
[ $rc = 139 ] && has "fault injected: segv at step 14" &&
  has "loom run: .*rank 1.*signal 11" && ! left_behind "$tmp/n_segv" &&
  ok "segv, --max-restarts 0: rc 139" ||
  { bad "segv, --max-restarts 0: rc $rc"; cat "$tmp/out"; }

finish
