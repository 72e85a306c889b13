#!/usr/bin/env bash
# loom run's supervision with a stand-in rank (run_fake_rank): the failure
# line for an exit code, a fatal signal, a SIGKILL from outside and the
# communication watchdog; the exit status of --max-restarts 0; no restart for
# exit code 2; a restart that recovers (the parts of the recovered line add
# up); --min-np/--max-np with a hostfile rewritten between attempts; the
# --report JSON lines; the standby group; no process or directory left behind.
set -u
FAKE=${1:?usage: test_supervise.sh RUN_FAKE_RANK}
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
tmp=$(mktemp -d)
marker="loom_supervise_$$"
cleanup() {
  pkill -9 -f "$marker" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0 n_ok=0 n_bad=0
ok() { echo "ok: $1"; n_ok=$((n_ok + 1)); }
bad() { echo "FAILED: $1"; fail=1; n_bad=$((n_bad + 1)); }
host=$(hostname)
# The same tests under Open MPI's mpirun and MPICH's hydra (mpiexec). A
# machine without the launcher is a real skip (CTest SKIP_RETURN_CODE 77).
command -v "$("$LOOM" run --dry-run -n 2 prog | sed -n 's/^command: \([^ ]*\).*/\1/p')" >/dev/null \
  || { echo "skipped: no mpirun"; exit 77; }
# Waiting is polling for the state wanted, never a fixed sleep: under load a
# fixed sleep is either too short or wasted. Up to 60 s (the CTest timeout
# catches a real hang).
wait_until() { # command...
  local i
  for i in $(seq 1200); do "$@" && return 0; sleep 0.05; done
  return 1
}
wait_for_file() { wait_until test -s "$1"; }
# The step a rank last recorded in its status file under $2 (a TMPDIR).
rank_step() { # rank tmpdir
  awk '$1 == "step" { print $2 }' "$2"/loom-run-*/attempt-0/rank-"$1" 2>/dev/null | head -1
}
stepped() { # rank tmpdir: it completed a step
  local s; s=$(rank_step "$1" "$2"); [ -n "$s" ] && [ "$s" != - ]
}
# Nothing of the job may survive it (zombies waiting for PID 1 aside): what
# is left is looked for until it is gone, up to 10 s.
live_left() {
  pgrep -f "$marker" | while read -r p; do
    [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = Z ] || echo "$p"; done
}
no_leftovers() { # description
  local i left
  for i in $(seq 200); do left=$(live_left); [ -z "$left" ] && break; sleep 0.05; done
  [ -z "$left" ] && ok "$1: no process left" ||
    { bad "$1: left behind: $(ps -o pid,ppid,stat,etime,args -p "$(echo $left | tr ' ' ,)" | tail -n +2)"; kill -9 $left 2>/dev/null; }
}
# The value of a numeric field of the first JSON line of an event.
field() { # file event key
  grep "\"event\":\"$2\"" "$1" | head -1 | grep -o "\"$3\":[-0-9.e+]*" | head -1 | cut -d: -f2
}
# loom run's status directories go here, to be counted at the end.
mkdir -p "$tmp/rt"
export TMPDIR="$tmp/rt"

# 1. A rank exits with a code: the line names it, the job fails with its
#    code (--max-restarts 0), the report has the failure.
"$LOOM" run -n 2 --report "$tmp/r1" "$FAKE" --fault 1:5:exit "$marker" 2>"$tmp/e1"; rc=$?
line=$(grep "^loom run: rank" "$tmp/e1")
want="loom run: rank 1 (host $host, pid [0-9]*) exited with code 3 after step 5 (fault injected: exit at step 5); stopped the other 1 rank(s) in [0-9.]* s"
[ $rc = 3 ] && ok "exit code 3 passed on" || bad "exit: rc $rc"
echo "$line" | grep -qx "$want" && ok "exit line: $line" || { bad "exit line"; cat "$tmp/e1"; }
grep -q "^loom run: job failed (exit code 3) after" "$tmp/e1" && ok "--max-restarts 0: job failed line" || bad "no job failed line"
f=$(grep '"event":"failure"' "$tmp/r1")
for kv in '"rank":1' "\"host\":\"$host\"" '"exit_code":3' '"signal":null' '"last_step":5' '"code":3' '"recorded":true' '"note":"fault injected: exit at step 5"'; do
  echo "$f" | grep -qF "$kv" || bad "report failure lacks $kv: $f"
done
[ "$(grep -c '"event"' "$tmp/r1")" = 3 ] && grep -q '"event":"start".*"np":2' "$tmp/r1" && grep -q '"event":"end".*"code":3' "$tmp/r1" \
  && ok "report: start, failure, end" || { bad "report events"; cat "$tmp/r1"; }
no_leftovers "exit"

# 1b. A rank that records its exit code and then never leaves (stuck in its
#     exit handlers): the record is acted on, the rank killed with the rest.
t0=$(date +%s)
"$LOOM" run -n 2 --timeout 60 "$FAKE" --steps 100000 --fault 1:3:stuck-exit "$marker" 2>"$tmp/e1b"; rc=$?
t1=$(date +%s)
[ $rc = 3 ] && [ $((t1 - t0)) -lt 30 ] && grep -q "^loom run: rank 1 (host $host, pid [0-9]*) exited with code 3 after step 3" "$tmp/e1b" \
  && ok "exit recorded, process stuck: rc 3 in $((t1 - t0)) s" || { bad "stuck exit: rc $rc in $((t1 - t0)) s"; cat "$tmp/e1b"; }
no_leftovers "stuck exit"

# 1c. The same under -n 1, where the launcher is the rank itself: loom run's
#     own SIGKILL of the stuck rank is no launcher death (it was reported
#     as "the launcher died from signal 9" whenever the kill won the race
#     with the rank's exit; stuck-exit makes it win every time).
"$LOOM" run -n 1 --timeout 60 --max-restarts 1 --restart-delay 0 "$FAKE" --steps 5 --fault 0:3:stuck-exit "$marker" 2>"$tmp/e1c"; rc=$?
[ $rc = 0 ] && grep -q "^loom run: rank 0 (host $host, pid [0-9]*) exited with code 3 after step 3" "$tmp/e1c" \
  && grep -q "^loom run: job failed (exit code 3) after [0-9.]* s; restart 1 of 1" "$tmp/e1c" && ! grep -q "launcher died" "$tmp/e1c" \
  && ok "-n 1, exit recorded, process killed by loom run: exit code 3, no launcher death" || { bad "-n 1 stuck exit: rc $rc"; cat "$tmp/e1c"; }
no_leftovers "-n 1 stuck exit"

# 2. A fatal signal, recorded by the rank's handler.
"$LOOM" run -n 3 "$FAKE" --fault 2:4:segv "$marker" 2>"$tmp/e2"; rc=$?
[ $rc = 139 ] && ok "segv: rc 139" || bad "segv: rc $rc"
grep -q "^loom run: rank 2 (host $host, pid [0-9]*) died from signal 11 (SIGSEGV) after step 4 (fault injected: segv at step 4); stopped the other 2 rank(s) in" "$tmp/e2" \
  && ok "segv line" || { bad "segv line"; cat "$tmp/e2"; }
no_leftovers "segv"

# 3. SIGKILL from outside: no record at all; the launcher's verdict names
#    the signal. The test kills rank 1 once it is training.
mkdir -p "$tmp/pids"
"$LOOM" run -n 2 --report "$tmp/r3" "$FAKE" --steps 100000 --step-ms 5 --pids "$tmp/pids" "$marker" 2>"$tmp/e3" &
job=$!
wait_for_file "$tmp/pids/rank-1.pid"
wait_until stepped 1 "$TMPDIR"
kill -9 "$(cat "$tmp/pids/rank-1.pid")"
wait $job; rc=$?
[ $rc = 137 ] && ok "SIGKILL from outside: rc 137" || bad "SIGKILL from outside: rc $rc"
grep -q "^loom run: rank 1 (host $host, pid $(cat "$tmp/pids/rank-1.pid")) died from signal 9 (SIGKILL) after step [0-9]*; stopped the other 1 rank(s) in" "$tmp/e3" \
  && ok "SIGKILL line: $(grep '^loom run: rank' "$tmp/e3")" || { bad "SIGKILL line"; cat "$tmp/e3"; }
grep '"event":"failure"' "$tmp/r3" | grep -q '"rank":1,.*"exit_code":null,"signal":9,"recorded":false' \
  && ok "report: signal 9, not recorded by the rank" || { bad "report SIGKILL"; cat "$tmp/r3"; }
no_leftovers "SIGKILL from outside"

# 3b. The launcher itself killed: the first line says so, no rank is blamed.
rm -f "$tmp/pids"/*
"$LOOM" run -n 2 "$FAKE" --steps 100000 --step-ms 5 --pids "$tmp/pids" "$marker" 2>"$tmp/e3b" &
job=$!
wait_for_file "$tmp/pids/rank-1.pid"
# The launcher: the rank's parent (mpirun), or its grandparent under MPICH's
# hydra (mpiexec, above its hydra_pmi_proxy).
launcher=$(awk '{print $4}' /proc/"$(cat "$tmp/pids/rank-1.pid")"/stat)
[ "$(cat /proc/"$launcher"/comm)" = hydra_pmi_proxy ] && launcher=$(awk '{print $4}' /proc/"$launcher"/stat)
kill -9 "$launcher"
wait $job; rc=$?
head -1 "$tmp/e3b" | grep -q "^loom run: the launcher died: .* (pid $launcher) was killed by signal 9 (SIGKILL); its 2 rank(s) were stopped" \
  && [ $rc = 137 ] && ! grep -q "^loom run: rank" "$tmp/e3b" && ok "launcher killed: first line says so, rc 137" || { bad "launcher killed: rc $rc"; cat "$tmp/e3b"; }
no_leftovers "launcher killed"

# 4. Exit code 2 (configuration error) is not restarted.
"$LOOM" run -n 2 --max-restarts 3 --restart-delay 0 --report "$tmp/r4" "$FAKE" --fault 0:2:usage "$marker" 2>"$tmp/e4"; rc=$?
[ $rc = 2 ] && ok "usage error: rc 2" || bad "usage error: rc $rc"
grep -q "not restarted, since it would fail the same way" "$tmp/e4" && ! grep -q '"event":"restart"' "$tmp/r4" \
  && ok "exit code 2: no restart" || { bad "exit code 2 restarted"; cat "$tmp/e4"; }
no_leftovers "usage error"

# 5. The watchdog: rank 1 stops taking part; another rank's watchdog fires
#    and names it; exit code 75.
LOOM_COMM_TIMEOUT=1 "$LOOM" run -n 3 --timeout 60 "$FAKE" --comm --fault 1:3:hang "$marker" 2>"$tmp/e5"; rc=$?
[ $rc = 75 ] && ok "watchdog: rc 75" || bad "watchdog: rc $rc"
grep -q "^loom run: the communication watchdog fired on rank [02] (host $host, pid [0-9]*) after step 3: watchdog: allreduce #4 .*ranks not arrived: 1; stopped the other 2 rank(s) in" "$tmp/e5" \
  && ok "watchdog line" || { bad "watchdog line"; cat "$tmp/e5"; }
no_leftovers "watchdog"

# 5b. A hang: rank 1 stops taking part outside any collective, the others
#    wait for it; no step for --hang-timeout 1 s: named, exit code 76,
#    restarted like a crash, and the job finishes.
LOOM_COMM_TIMEOUT=600 "$LOOM" run -n 2 --hang-timeout 1 --max-restarts 1 --restart-delay 0 --report "$tmp/r17" \
  "$FAKE" --comm --fault 1:5:hang --steps 10 --step-ms 20 --resume 4 "$marker" 2>"$tmp/e17"; rc=$?
[ $rc = 0 ] && grep -q "^loom run: no progress for [0-9.]* s (hang timeout 1 s) on rank(s) [01] (step 5), [01] (step 5); rank [01] (host $host, pid [0-9]*) stopped first; stopped the other 1 rank(s) in" "$tmp/e17" \
  && grep -q "job failed (exit code 76: no progress within the hang timeout) after [0-9.]* s; restart 1 of 1" "$tmp/e17" \
  && grep '"event":"failure"' "$tmp/r17" | grep -q '"code":76,.*"hang":true' \
  && ok "hang: found within --hang-timeout 1, restarted, finished" || { bad "hang: rc $rc"; cat "$tmp/e17"; }
no_leftovers "hang"
# One rank stopped from outside (SIGSTOP): found the same way.
rm -f "$tmp/pids"/*
LOOM_COMM_TIMEOUT=600 "$LOOM" run -n 2 --hang-timeout 1 "$FAKE" --comm --steps 100000 --step-ms 5 --pids "$tmp/pids" "$marker" 2>"$tmp/e18" &
job=$!
wait_for_file "$tmp/pids/rank-1.pid"
wait_until stepped 1 "$TMPDIR"
kill -STOP "$(cat "$tmp/pids/rank-1.pid")"
wait $job; rc=$?
[ $rc = 76 ] && grep -q "^loom run: no progress for [0-9.]* s (hang timeout 1 s) on rank(s) " "$tmp/e18" \
  && ok "SIGSTOP of rank 1: a hang, rc 76" || { bad "SIGSTOP: rc $rc"; cat "$tmp/e18"; }
no_leftovers "SIGSTOP"

# 6. A restart that recovers: the recovered line and its parts.
"$LOOM" run -n 2 --max-restarts 2 --restart-delay 0.2 --report "$tmp/r6" "$FAKE" --fault 1:5:abort --resume 4 --steps 8 --load-ms 50 "$marker" 2>"$tmp/e6"; rc=$?
[ $rc = 0 ] && ok "restart: job finished" || { bad "restart: rc $rc"; cat "$tmp/e6"; }
grep -q "^loom run: rank 1 .* died from signal 6 (SIGABRT) after step 5" "$tmp/e6" && grep -q "restart 1 of 2 in 0.2 s" "$tmp/e6" \
  && ok "restart after SIGABRT" || { bad "restart lines"; cat "$tmp/e6"; }
rec=$(grep "^loom run: recovered in" "$tmp/e6")
echo "$rec" | grep -qE "^loom run: recovered in [0-9.]+ s \(detect [0-9.]+, stop [0-9.]+, delay [0-9.]+, start [0-9.]+, load [0-9.]+, first step [0-9.]+\) at step 5$" \
  && ok "recovered line: $rec" || { bad "recovered line: '$rec'"; cat "$tmp/e6"; }
sum=$(awk -v t="$(field "$tmp/r6" recovered total_s)" -v a="$(field "$tmp/r6" recovered detect_s)" -v b="$(field "$tmp/r6" recovered stop_s)" \
  -v c="$(field "$tmp/r6" recovered delay_s)" -v d="$(field "$tmp/r6" recovered start_s)" -v e="$(field "$tmp/r6" recovered load_s)" \
  -v f="$(field "$tmp/r6" recovered first_step_s)" \
  'BEGIN { s = a + b + c + d + e + f; d2 = s - t; if (d2 < 0) d2 = -d2;
           print (d2 < 1e-6 && c >= 0.2 && e >= 0.05 && t > 0) ? "ok" : "bad " s " vs " t }')
[ "$sum" = ok ] && ok "report: recovery parts add up (delay >= 0.2, load >= 0.05)" || { bad "recovery parts: $sum"; cat "$tmp/r6"; }
[ "$(field "$tmp/r6" recovered step)" = 5 ] && [ "$(field "$tmp/r6" recovered ranks)" = 2 ] \
  && ok "report: recovered at step 5 on 2 ranks" || bad "report recovered: $(grep recovered "$tmp/r6")"
no_leftovers "restart"

# 7. Elastic: 4 slots, rank 3 fails, the hostfile shrinks to 2 slots during
#    the restart delay; the group restarts on 2 ranks and finishes.
printf 'localhost slots=4\n' >"$tmp/hosts"
"$LOOM" run --hostfile "$tmp/hosts" --min-np 2 --max-np 8 --max-restarts 1 --restart-delay 2 --report "$tmp/r7" \
  "$FAKE" --fault 3:3:exit --steps 6 --resume 2 "$marker" 2>"$tmp/e7" &
job=$!
wait_until grep -q "restart 1 of 1" "$tmp/e7"
printf '# one host went away\nlocalhost slots=2\n' >"$tmp/hosts"
wait $job; rc=$?
[ $rc = 0 ] && ok "elastic: job finished" || { bad "elastic: rc $rc"; cat "$tmp/e7"; }
grep -q "^loom run: restart 1 of 1 on 2 ranks (was 4): the hostfile now has 2 slot(s)" "$tmp/e7" \
  && ok "elastic: restart line names the new np" || { bad "elastic restart line"; cat "$tmp/e7"; }
grep '"event":"start"' "$tmp/r7" | grep -q '"np":4' && grep '"event":"restart"' "$tmp/r7" | grep -q '"np":2,"prev_np":4,"slots":2' \
  && [ "$(field "$tmp/r7" recovered ranks)" = 2 ] && ok "elastic: report 4 -> 2 ranks, recovered on 2" || { bad "elastic report"; cat "$tmp/r7"; }
no_leftovers "elastic"

# --max-np caps the ranks; --min-np refuses too few slots.
n=$("$LOOM" run --hostfile "$tmp/hosts" --max-np 1 sh -c "echo $marker" | wc -l)
[ "$n" = 1 ] && ok "--max-np 1 on 2 slots: 1 rank" || bad "--max-np: $n ranks"
"$LOOM" run --hostfile "$tmp/hosts" --min-np 3 true 2>"$tmp/e8"; rc=$?
[ $rc = 2 ] && grep -q "offers 2 slot(s), fewer than --min-np 3" "$tmp/e8" && ok "--min-np 3 on 2 slots: refused" || { bad "--min-np: rc $rc"; cat "$tmp/e8"; }
"$LOOM" run -n 2 --max-np 2 true 2>/dev/null; [ $? = 2 ] && ok "--max-np without a hostfile: usage error" || bad "--max-np without hosts"
# The hostfile shrinks below --min-np: the job ends with the failure.
printf 'localhost slots=2\n' >"$tmp/hosts"
"$LOOM" run --hostfile "$tmp/hosts" --min-np 2 --max-restarts 1 --restart-delay 2 "$FAKE" --fault 1:2:exit "$marker" 2>"$tmp/e9" &
job=$!
wait_until grep -q "restart 1 of 1" "$tmp/e9"
printf 'localhost slots=1\n' >"$tmp/hosts"
wait $job; rc=$?
[ $rc = 3 ] && grep -q "offers 1 slot(s), fewer than --min-np 2; not starting" "$tmp/e9" \
  && ok "elastic: too few slots at restart ends the job with the rank's code" || { bad "elastic below min: rc $rc"; cat "$tmp/e9"; }
no_leftovers "elastic below min"

# 8. Standby: the next group is started ahead, waits at its communication
#    set-up, and takes over at once; it is discarded when the hosts change,
#    and never outlives the job (finished, or loom run killed).
"$LOOM" run -n 2 --standby on --max-restarts 1 --restart-delay 0 --report "$tmp/r11" "$FAKE" --comm \
  --fault 1:10:exit --steps 14 --step-ms 30 --resume 6 "$marker" 2>"$tmp/e11"; rc=$?
[ $rc = 0 ] && grep -q '"event":"standby","attempt":1' "$tmp/r11" && grep '"event":"restart"' "$tmp/r11" | grep -q '"standby":true' \
  && [ "$(field "$tmp/r11" recovered step)" = 7 ] && ok "standby: restart 1 taken by the standby group, recovered at step 7" \
  || { bad "standby restart: rc $rc"; cat "$tmp/e11" "$tmp/r11"; }
no_leftovers "standby restart"
# A program that moves the gate after its preparation: the recovery's load
# part no longer holds the preparation (--load-ms 400).
"$LOOM" run -n 2 --standby on --max-restarts 1 --restart-delay 0 --report "$tmp/r16" "$FAKE" --comm --late-gate \
  --load-ms 400 --fault 1:10:exit --steps 14 --step-ms 30 --resume 6 "$marker" 2>"$tmp/e16"; rc=$?
load=$(field "$tmp/r16" recovered load_s)
[ $rc = 0 ] && grep '"event":"restart"' "$tmp/r16" | grep -q '"standby":true' && awk -v l="$load" 'BEGIN { exit !(l < 0.3) }' \
  && ok "standby with a late gate: load part $load s (preparation of 0.4 s done ahead)" || { bad "late gate: rc $rc load $load"; cat "$tmp/e16" "$tmp/r16"; }
no_leftovers "late gate"
"$LOOM" run -n 2 --standby on --max-restarts 3 --report "$tmp/r12" "$FAKE" --comm --steps 10 --step-ms 20 "$marker" 2>"$tmp/e12"; rc=$?
[ $rc = 0 ] && grep -q '"event":"standby"' "$tmp/r12" && ok "standby: job finished with its standby waiting" || { bad "standby unused: rc $rc"; cat "$tmp/e12"; }
no_leftovers "standby unused"
printf 'localhost slots=3\n' >"$tmp/hosts"
"$LOOM" run --hostfile "$tmp/hosts" --standby on --max-restarts 1 --restart-delay 2 --report "$tmp/r13" \
  "$FAKE" --comm --fault 2:8:exit --steps 12 --step-ms 30 --resume 4 "$marker" 2>"$tmp/e13" &
job=$!
wait_until grep -q "restart 1 of 1" "$tmp/e13"
printf 'localhost slots=2\n' >"$tmp/hosts"
wait $job; rc=$?
[ $rc = 0 ] && grep '"event":"restart"' "$tmp/r13" | grep -q '"np":2,.*"standby":false' \
  && ok "standby: discarded when the hostfile changed (3 -> 2 ranks)" || { bad "standby elastic: rc $rc"; cat "$tmp/e13" "$tmp/r13"; }
no_leftovers "standby elastic"
# (its status directory goes elsewhere: a killed loom run cannot remove it)
mkdir -p "$tmp/killed"
TMPDIR="$tmp/killed" "$LOOM" run -n 2 --standby on --max-restarts 1 --report "$tmp/r14" "$FAKE" --comm --steps 100000 --step-ms 20 "$marker" 2>/dev/null &
job=$!
wait_until grep -qs '"event":"standby"' "$tmp/r14"
# the standby ranks are up and waiting at their gate
wait_until test -e "$(echo "$tmp"/killed/loom-run-*/attempt-1)/rank-1"
kill -KILL $job
wait $job 2>/dev/null
no_leftovers "standby, loom run killed"
# The next loom run removes the directory the killed one left behind.
[ -n "$(ls -d "$tmp"/killed/loom-run-* 2>/dev/null)" ] || bad "killed loom run: no directory to find"
TMPDIR="$tmp/killed" "$LOOM" run -n 1 true
left=$(ls -d "$tmp"/killed/loom-run-* 2>/dev/null)
[ -z "$left" ] && ok "a killed loom run's directory is removed by the next one" || bad "stale directory left: $left"
# A stale job directory of a dead loom run: a process of its job still
# about is stopped, its own files removed; a link in it is removed as a link
# (its target untouched) and an unexpected file keeps the directory.
mkdir -p "$tmp/stale/loom-run-abcdef/attempt-0" "$tmp/stale/loom-run-ghijkl" "$tmp/victim"
echo keep >"$tmp/victim/precious"
touch "$tmp/stale/loom-run-abcdef/owner" "$tmp/stale/loom-run-abcdef/attempt-0/rank-0"
(LOOM_RUN_DIR="$tmp/stale/loom-run-abcdef/attempt-0" exec sleep "300.$$" &)
touch "$tmp/stale/loom-run-ghijkl/owner" "$tmp/stale/loom-run-ghijkl/notes.txt"
ln -s "$tmp/victim" "$tmp/stale/loom-run-ghijkl/attempt-0"
wait_until pgrep -f "^sleep 300.$$$" >/dev/null
TMPDIR="$tmp/stale" "$LOOM" run -n 1 true 2>"$tmp/e19"
[ ! -e "$tmp/stale/loom-run-abcdef" ] && wait_until sh -c "! pgrep -f '^sleep 300.$$$' >/dev/null" \
  && ok "stale job directory removed, its leftover process stopped" || { bad "stale job directory"; ls -R "$tmp/stale"; cat "$tmp/e19"; }
[ "$(cat "$tmp/victim/precious" 2>/dev/null)" = keep ] && [ -e "$tmp/stale/loom-run-ghijkl/notes.txt" ] \
  && ok "stale job directory with a link and a stranger: victim intact, stranger kept" || { bad "link-safe removal"; ls -lR "$tmp/stale" "$tmp/victim"; }
# A job directory being made (loom-new-*: its owner created and locked
# there, then renamed to loom-run-*) belongs to a loom run starting beside
# this one and is left alone, even with its owner not yet locked; one older
# than a minute with a free owner is a loom run killed while making it.
mkdir -p "$tmp/stale/loom-new-mnopqr" "$tmp/stale/loom-new-stuvwx"
touch "$tmp/stale/loom-new-mnopqr/owner" "$tmp/stale/loom-new-stuvwx/owner"
touch -d '2 minutes ago' "$tmp/stale/loom-new-stuvwx"
TMPDIR="$tmp/stale" "$LOOM" run -n 1 true 2>"$tmp/e20"
[ -e "$tmp/stale/loom-new-mnopqr/owner" ] && [ ! -e "$tmp/stale/loom-new-stuvwx" ] &&
  [ -z "$(ls -d "$tmp"/stale/loom-run-* 2>/dev/null | grep -v ghijkl)" ] &&
  ok "a directory being made left alone, an old one removed, none of this run left" ||
  { bad "loom-new-* directories"; ls -la "$tmp/stale"; cat "$tmp/e20"; }

# auto: only loom train waits at the gate; another program is never doubled.
out=$("$LOOM" run -n 2 --max-restarts 1 --report "$tmp/r15" sh -c "sleep 0.3; echo $marker" 2>&1)
[ "$(echo "$out" | grep -c "$marker")" = 2 ] && ! grep -q '"event":"standby"' "$tmp/r15" && ok "standby auto: off for another program" || bad "standby auto: $out"

# One rank, no MPI: the same supervision.
"$LOOM" run -n 1 "$FAKE" --fault 0:2:segv "$marker" 2>"$tmp/e10"; rc=$?
[ $rc = 139 ] && grep -q "^loom run: rank 0 (host $host, pid [0-9]*) died from signal 11 (SIGSEGV) after step 2 (fault injected: segv at step 2)$" "$tmp/e10" \
  && ok "-n 1: segv line" || { bad "-n 1 segv: rc $rc"; cat "$tmp/e10"; }

# --nnodes (loom run's own launcher of this host's ranks): rank 1 records
# exit code 3 and never leaves; loom run kills this host's ranks. The
# launcher's line names rank 1 with its recorded code, not 137 from the
# kill (nor rank 0, killed alongside), and "the other N rank(s)" counts this
# host's 2 ranks, not the world's 4.
"$LOOM" run --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 --timeout 60 \
  "$FAKE" --steps 100000 --fault 1:3:stuck-exit "$marker" 2>"$tmp/e21"; rc=$?
[ $rc = 3 ] && grep -q "^loom run: rank 1 (local 1) exited with code 3; ending this host's other ranks$" "$tmp/e21" \
  && ! grep -q "exited with code 137" "$tmp/e21" \
  && grep -q "^loom run: rank 1 (host $host, pid [0-9]*) exited with code 3 after step 3 (fault injected: stuck-exit at step 3); stopped the other 1 rank(s) in" "$tmp/e21" \
  && ok "--nnodes: rank 1's recorded code 3 named, this host's other rank counted" || { bad "--nnodes lines: rc $rc"; cat "$tmp/e21"; }
no_leftovers "--nnodes"

# The run status directories are gone.
left=$(cd "$tmp/rt" && ls -d loom-run-* 2>/dev/null)
[ -z "$left" ] && ok "no loom-run-* directory left" || bad "loom-run-* directories left: $left"

echo "$n_ok passed, $n_bad failed"
exit $fail
