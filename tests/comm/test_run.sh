#!/usr/bin/env bash
# loom run: exit codes (first failing rank's), -n 1 without MPI, the
# environment of the ranks (threads per rank, pass-through, user values
# kept), --hosts / --hostfile, --timeout, signal forwarding with no process
# left behind, restarts with LOOM_RESTART_COUNT.
set -u
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# loom run's job directories (one is left by the loom run killed below) go
# with the test's own directory.
export TMPDIR="$tmp"
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAILED: $1"; fail=1; }
expect_rc() { # description expected actual
  if [ "$2" = "$3" ]; then ok "$1 (rc $3)"; else bad "$1: rc $3, expected $2"; fi
}
# Waiting is polling for the state wanted (up to 20 s), never a fixed sleep.
wait_until() {
  local i
  for i in $(seq 400); do "$@" && return 0; sleep 0.05; done
  return 1
}
# The live (not zombie) processes whose command line matches $1.
live() {
  pgrep -f "$1" | while read -r p; do
    [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = Z ] || echo "$p"; done
}
none_left() { [ -z "$(live "$1")" ]; }
# Both ranks of the job below are running their shell.
ranks_up() { [ "$(live "^sh -c sleep 30; echo $marker" | wc -l)" -ge 2 ]; }
cores=$(nproc)
# Under MPICH's hydra or Open MPI's mpirun alike (hydra exits with the raw
# signal number; loom run reads the signal from its banner).
hydra=0
"$LOOM" run --dry-run -n 2 prog | grep -q "mpiexec" && hydra=1
t2=$(( cores / 2 )); [ $t2 -lt 1 ] && t2=1

"$LOOM" run -n 2 true; expect_rc "-n 2 true" 0 $?
"$LOOM" run -n 1 sh -c 'exit 3'; expect_rc "-n 1 exit code" 3 $?
"$LOOM" run -n 2 sh -c 'exit $(( OMPI_COMM_WORLD_RANK * 5 + PMI_RANK * 5 ))' 2>/dev/null
expect_rc "-n 2 first failing rank's code" 5 $?
"$LOOM" run -n 3 sh -c 'kill -9 $$' 2>/dev/null; rc=$?
# (hydra itself fails now and then, exit 255 and "control_cb ... assert
# (!closed) failed", when programs that never speak PMI all die at once.)
if [ $rc = 137 ] || { [ $hydra = 1 ] && [ $rc = 255 ]; }; then ok "rank killed by SIGKILL (rc $rc)"
else bad "rank killed: rc $rc, expected 137"; fi
"$LOOM" run -n 1 /nonexistent/program 2>/dev/null; expect_rc "missing program" 127 $?
"$LOOM" run -n 2 2>/dev/null; expect_rc "no program: usage error" 2 $?

# -n 1 runs the program itself: no MPI launcher around it.
out=$("$LOOM" run -n 1 sh -c 'echo "${OMPI_COMM_WORLD_SIZE:-none} $LOOM_THREADS"')
[ "$out" = "none $cores" ] && ok "-n 1 direct, LOOM_THREADS=$cores" || bad "-n 1: '$out'"

# Threads per rank = cores / ranks on the host; the environment passes
# through; values the user set are kept.
out=$(LOOM_RUN_TEST_VAR=hello "$LOOM" run -n 2 sh -c 'echo "$LOOM_THREADS $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS $LOOM_RUN_TEST_VAR $LOOM_RESTART_COUNT"' | sort -u)
[ "$out" = "$t2 $t2 $t2 hello 0" ] && ok "-n 2 environment: $out" || bad "-n 2 environment: '$out'"
out=$(OMP_NUM_THREADS=3 "$LOOM" run -n 4 sh -c 'echo "$LOOM_THREADS $OMP_NUM_THREADS"' | sort -u)
t4=$(( cores / 4 )); [ $t4 -lt 1 ] && t4=1
[ "$out" = "$t4 3" ] && ok "-n 4 threads $t4, user OMP_NUM_THREADS kept" || bad "-n 4 environment: '$out'"
out=$("$LOOM" run -n 2 --threads 5 sh -c 'echo $LOOM_THREADS' | sort -u)
[ "$out" = 5 ] && ok "--threads" || bad "--threads: '$out'"

# Hosts.
n=$("$LOOM" run --hosts localhost:2 sh -c 'echo x' | wc -l)
[ "$n" = 2 ] && ok "--hosts localhost:2 gives 2 ranks" || bad "--hosts: $n ranks"
# Hosts are parsed strictly: slots bounded, a bad hostfile named with its
# line, nothing started (exit 2).
"$LOOM" run --hosts localhost:100000 true 2>/dev/null; expect_rc "--hosts with 100000 slots" 2 $?
printf 'localhost slots=2\nnode2 slots=abc\n' >"$tmp/badhosts"
"$LOOM" run --hostfile "$tmp/badhosts" true 2>"$tmp/hf.err"; rc=$?
if [ $rc = 2 ] && grep -q "badhosts: line 2: 'slots=abc'" "$tmp/hf.err"; then ok "bad hostfile: file, line and reason (rc 2)"
else bad "bad hostfile: rc $rc, '$(cat "$tmp/hf.err")'"; fi
printf 'localhost slots=3\n' >"$tmp/hosts"
n=$("$LOOM" run --hostfile "$tmp/hosts" sh -c 'echo x' | wc -l)
[ "$n" = 3 ] && ok "--hostfile gives 3 ranks" || bad "--hostfile: $n ranks"
if [ $hydra = 1 ]; then
  "$LOOM" run --dry-run --hostfile "$tmp/hosts" prog | grep -q -- "-hosts localhost:3" && ok "--dry-run: hydra gets the hostfile as -hosts" || bad "--dry-run"
else
  "$LOOM" run --dry-run -n 4 prog | grep -q -- "--bind-to none" && ok "--dry-run shows no binding" || bad "--dry-run"
fi

# Inside a SLURM allocation: srun, with the PMI that matches loom's MPI and
# the task count of the allocation (only the command line: no SLURM here).
out=$(SLURM_JOB_ID=7 SLURM_NTASKS=3 SLURM_NNODES=1 SLURM_CPUS_ON_NODE=6 "$LOOM" run --dry-run prog 2>&1)
if echo "$out" | grep -q "command: srun -n 3 --kill-on-bad-exit=1 --mpi=pmi" && echo "$out" | grep -q "LOOM_THREADS=2 "; then
  ok "SLURM: srun -n 3, 2 threads per rank"
else bad "SLURM dry run: $out"; fi

# --timeout stops the job: exit code 124.
"$LOOM" run -n 2 --timeout 1 sleep 20 2>/dev/null; expect_rc "--timeout" 124 $?

# Signals: SIGTERM to loom run stops every rank, nothing is left.
marker="loom_run_marker_$$"
"$LOOM" run -n 2 sh -c "sleep 30; echo $marker" &
pid=$!
wait_until ranks_up
t0=$(date +%s)
kill -TERM $pid
wait $pid; rc=$?
t1=$(date +%s)
[ $rc = 143 ] && ok "SIGTERM: rc 143 in $((t1 - t0)) s" || bad "SIGTERM: rc $rc"
wait_until none_left "$marker"
left=$(live "$marker")
[ -z "$left" ] && ok "no process left after SIGTERM" || { bad "left behind: $left"; kill -9 $left; }

# SIGINT (Ctrl-C) likewise.
"$LOOM" run -n 2 sh -c "sleep 30; echo $marker" &
pid=$!
wait_until ranks_up
kill -INT $pid
wait $pid; rc=$?
[ $rc = 130 ] && ok "SIGINT: rc 130" || bad "SIGINT: rc $rc"
wait_until none_left "$marker"
left=$(live "$marker")
[ -z "$left" ] && ok "no process left after SIGINT" || { bad "left behind after SIGINT: $left"; kill -9 $left; }

# loom run killed outright (SIGKILL, as a CI timeout may do): the launcher
# is told by the kernel and takes its ranks down.
"$LOOM" run -n 2 sh -c "sleep 30; echo $marker" &
pid=$!
wait_until ranks_up
kill -KILL $pid
wait $pid 2>/dev/null
wait_until none_left "$marker"
left=$(live "$marker")
[ -z "$left" ] && ok "no process left after SIGKILL of loom run" || { bad "left behind after SIGKILL: $left"; kill -9 $left; }

# Restarts: fails twice, then succeeds on the third start.
out=$("$LOOM" run -n 2 --max-restarts 3 --restart-delay 0 sh -c '[ "$LOOM_RESTART_COUNT" -ge 2 ] || exit 4' 2>&1); rc=$?
[ $rc = 0 ] && echo "$out" | grep -q "restart 2 of 3" && ok "restarts until success" || bad "restarts: rc $rc: $out"
"$LOOM" run -n 1 --max-restarts 1 --restart-delay 0 sh -c 'exit 6' 2>/dev/null; expect_rc "restarts exhausted" 6 $?

# loom bench comm prints the table, every element right, loom and MPI.
for np in 1 3; do
  out=$("$LOOM" run -n $np "$LOOM" bench comm --op all --dtype bf16 --sizes 4K,1M --iters 2 --warmup 1 2>&1); rc=$?
  rows=$(echo "$out" | grep -cE '^ +[0-9]+ +[0-9]+ .*\|')
  wrong=$(echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ .*\|' | awk -F'|' '{split($2,a," "); split($3,b," "); if (a[4] != 0 || (NF > 3 && b[4] != 0)) print}')
  if [ $rc = 0 ] && [ "$rows" = 10 ] && [ -z "$wrong" ]; then ok "bench comm -n $np: $rows rows, none wrong"
  else bad "bench comm -n $np: rc $rc rows $rows"; echo "$out"; fi
  # the redop only where something is reduced; the MPI library named once
  badop=$(echo "$out" | awk '/^# loom bench comm:/ { op = $5; sub(",", "", op) }
    /^ +[0-9]+ +[0-9]+ .*\|/ { split($0, f, "|"); split(f[1], a, " ")
      want = (op == "allreduce" || op == "reducescatter") ? "sum" : "-"
      if (a[4] != want) print op ": " a[4] }')
  if [ -z "$badop" ]; then ok "bench comm -n $np: redop sum for allreduce/reducescatter, - for the rest"
  else bad "bench comm -n $np: redop column: $badop"; fi
  lib=$(echo "$out" | grep -c '^# mpi: [^ ]')
  if [ "$lib" = 1 ]; then ok "bench comm -n $np: $(echo "$out" | grep '^# mpi: ')"
  else bad "bench comm -n $np: $lib '# mpi:' lines, expected 1"; fi
done

[ $fail = 0 ] && echo "comm_run: all passed"
exit $fail
