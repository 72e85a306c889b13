#!/usr/bin/env bash
# LOOM_INIT=env://: ranks started by a plain shell loop with torchrun's
# variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) form
# one world: the comm test's whole matrix at 3 and 4 ranks (the host's
# ranks found by name: the shared-memory path is on); DDP training equals
# `loom run -n 2` bit for bit; errors name what is wrong (no master in
# time, a rank missing, sizes that disagree, an unknown method, a missing
# variable), without hanging; `loom run --nnodes 1 --nproc-per-node 2`
# equals loom run -n 2 and restarts a killed rank's group, which resumes;
# the rendezvous leaves no process or file; a master port in use is named
# with the ephemeral range it lies in.
. "$(dirname "$0")/../lib.sh"
BIN=$1
export TMPDIR=$tmp LOOM_THREADS=1 OMP_NUM_THREADS=1
base=$(port_base)
n=0
# start N PROG...: ranks 0..N-1 in the background, logs $tmp/e.K; waits.
start() {
  local np=$1 r pids=()
  shift
  n=$((n + 1))
  for r in $(seq 0 $((np - 1))); do
    LOOM_INIT=env:// RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$((base + n)) LOOM_RDZV_TIMEOUT=${TO:-60} "$@" >"$tmp/e.$r" 2>&1 &
    pids+=($!)
  done
  codes=""
  for r in "${pids[@]}"; do
    wait "$r"
    codes="$codes $?"
  done
}

for np in 3 4; do
  t0=$(date +%s.%N)
  start $np env LOOM_COMM_CHECK=1 "$BIN"
  t1=$(date +%s.%N)
  if [ "$codes" = "$(printf ' 0%.0s' $(seq $np))" ] && grep -q "backend mpi, shm 1, $np ranks" "$tmp/e.0"; then
    ok "$np ranks from a shell loop: the comm matrix passes, shared memory on ($(echo "$t1 - $t0" | bc) s with the tests)"
  else
    bad "$np ranks: exit codes$codes"
    tail -n 5 "$tmp"/e.*
  fi
done

# DDP, deterministic: the same bits as loom run -n 2.
cat "$SRC"/docs/*.md | head -c 60000 >"$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=1
  --set model.d_model=32 --set model.heads=2 --set model.context=16 --set train.batch_size=2
  --set train.steps=6 --set log.every=1 --set parallel.strategy=ddp
  --set parallel.deterministic=true --set checkpoint.enabled=false --set log.per_rank=true --quiet)
"$LOOM" run -n 2 --timeout 120 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/ref" >"$tmp/ref.out" 2>&1 ||
  bad "loom run -n 2: $(tail -3 "$tmp/ref.out")"
start 2 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/env"
losses() { grep -o '"loss": *[^,}]*' "$1/metrics.jsonl"; }
if [ "$codes" = " 0 0" ] && [ -s "$tmp/env/metrics.jsonl" ] && [ "$(losses "$tmp/ref")" = "$(losses "$tmp/env")" ]; then
  ok "loom train on 2 env:// ranks: every loss equals loom run -n 2, bit for bit"
else
  bad "env:// training: codes$codes; $(diff <(losses "$tmp/ref") <(losses "$tmp/env") | head -3)"
  tail -n 5 "$tmp"/e.*
fi
grep -q "2 of the 2 ranks on this host; shared memory" "$tmp/env/logs/rank-1.log" &&
  ok "rank 1's log: $(grep -o 'comm: .*' "$tmp/env/logs/rank-1.log" | head -1)" ||
  bad "rank 1's log: $(grep 'comm:' "$tmp/env/logs/rank-1.log")"

# loom run --nnodes (torchrun's flags): this host's ranks through env://,
# supervised; a rank killed mid-run restarts the host's group, which
# resumes from its checkpoint to the same bits.
"$LOOM" run --nnodes 1 --nproc-per-node 2 --master-port $((base + 90)) --timeout 120 \
  "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/nn" >"$tmp/nn.out" 2>&1 &&
  [ "$(losses "$tmp/ref")" = "$(losses "$tmp/nn")" ] &&
  ok "loom run --nnodes 1 --nproc-per-node 2: every loss equals loom run -n 2" ||
  { bad "loom run --nnodes"; tail -n 5 "$tmp/nn.out"; }
LOOM_FAULT=1:4:segv "$LOOM" run --nnodes 1 --nproc-per-node 2 --master-port $((base + 91)) \
  --max-restarts 1 --timeout 120 "$LOOM" train "${cfg[@]}" --set checkpoint.enabled=true \
  --set checkpoint.every=2 --set "log.run_dir=$tmp/nf" >"$tmp/nf.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "restart 1 of 1" "$tmp/nf.out" && grep -q "recovered in" "$tmp/nf.out" &&
  [ "$(loss_steps "$tmp/nf")" = "$(loss_steps "$tmp/ref")" ] &&
  ok "--nnodes, rank 1 killed at step 4: restarted, resumed from step 2, every loss the same" ||
  { bad "--nnodes restart (rc $rc)"; tail -n 8 "$tmp/nf.out"; }
"$LOOM" run --nnodes 2 --nproc-per-node 2 "$LOOM" train x.yaml >"$tmp/u.out" 2>&1
[ $? = 2 ] && grep -q "needs --node-rank" "$tmp/u.out" && ok "--nnodes 2 without --node-rank: exit 2" ||
  { bad "--nnodes usage"; cat "$tmp/u.out"; }
"$LOOM" run --nnodes 2 --node-rank 1 "$LOOM" train x.yaml >"$tmp/u.out" 2>&1
[ $? = 2 ] && grep -q "needs --master-addr" "$tmp/u.out" && ok "--nnodes 2 without --master-addr: exit 2" ||
  { bad "--nnodes master"; cat "$tmp/u.out"; }
# Hosts on different restarts (each host's loom run counts its own): rank
# 1 on its host's restart 1 of job j, rank 0 on its first attempt with
# --resume never. Rank 0 decides, so both start afresh, together (before,
# rank 1 looked for the job's checkpoint with collectives rank 0 never ran,
# and both stalled until the watchdog).
LOOM_RUN_JOB=j LOOM_COMM_TIMEOUT=30 start 2 sh -c 'LOOM_RESTART_COUNT=$RANK exec "$@"' sh \
  "$LOOM" train "${cfg[@]}" --set checkpoint.enabled=true --set "log.run_dir=$tmp/rc" --resume never
[ "$codes" = " 0 0" ] && [ "$(losses "$tmp/ref")" = "$(losses "$tmp/rc")" ] &&
  ok "restart counts 0 and 1 on two ranks: rank 0's decides, both trained from the start" ||
  { bad "restart counts that differ: codes$codes"; tail -n 3 "$tmp"/e.*; }
# SIGTERM to rank 1 alone: both stop at one step, and both exit 143 (rank 0
# caught no signal; it stops on the one rank 1 caught, not as SIGINT).
long=("${cfg[@]}" --set train.steps=1000000 --set checkpoint.enabled=true --set "log.run_dir=$tmp/st")
pids=()
for r in 0 1; do
  LOOM_INIT=env:// RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$((base + 80)) LOOM_RDZV_TIMEOUT=60 "$LOOM" train "${long[@]}" >"$tmp/st.$r" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1200); do [ -s "$tmp/st/metrics.jsonl" ] && break; sleep 0.05; done
kill -TERM "${pids[1]}"
codes=""
for p in "${pids[@]}"; do
  wait "$p"
  codes="$codes $?"
done
[ "$codes" = " 143 143" ] && ok "SIGTERM to rank 1 alone: both ranks exit 143" ||
  { bad "SIGTERM to rank 1 alone: codes$codes"; tail -n 3 "$tmp"/st.*; }

# Errors: each names the problem and ends the process, no hang.
TO=2 start 1 env RANK=1 WORLD_SIZE=2 "$BIN"
[ "$codes" != " 0" ] && grep -q "rank 1 cannot reach the master 127.0.0.1:$((base + n)) within 2 s (LOOM_RDZV_TIMEOUT" "$tmp/e.0" &&
  ok "no master: $(grep -o 'env://.*' "$tmp/e.0" | head -1)" || { bad "no master"; cat "$tmp/e.0"; }
TO=2 start 1 env WORLD_SIZE=3 "$BIN"
[ "$codes" != " 0" ] && grep -q "1 of 3 ranks joined at port $((base + n)) within 2 s (LOOM_RDZV_TIMEOUT, loom run --rdzv-timeout); missing: 1 2" "$tmp/e.0" &&
  ok "ranks missing: $(grep -o 'env://.*' "$tmp/e.0" | head -1)" || { bad "ranks missing"; cat "$tmp/e.0"; }
# Rank 1 believes in a world of 3, rank 0 in one of 2.
n=$((n + 1))
LOOM_INIT=env:// RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((base + n)) LOOM_RDZV_TIMEOUT=20 \
  "$BIN" >"$tmp/e.0" 2>&1 &
p0=$!
LOOM_INIT=env:// RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((base + n)) LOOM_RDZV_TIMEOUT=20 \
  "$BIN" >"$tmp/e.1" 2>&1
c1=$?
wait $p0
c0=$?
[ $c0 != 0 ] && [ $c1 != 0 ] && grep -q "said rank 1 of 3; the master has WORLD_SIZE 2" "$tmp/e.0" &&
  grep -q "does not match the master's world" "$tmp/e.1" &&
  ok "sizes disagree: both exit ($c0, $c1): $(grep -o 'env://.*' "$tmp/e.0" | head -1)" ||
  { bad "sizes disagree ($c0, $c1)"; cat "$tmp/e.0" "$tmp/e.1"; }
LOOM_INIT=tcp://x RANK=0 WORLD_SIZE=2 "$BIN" >"$tmp/e.0" 2>&1
[ $? != 0 ] && grep -q "LOOM_INIT='tcp://x': the one method is env://" "$tmp/e.0" &&
  ok "an unknown method is named" || { bad "unknown method"; cat "$tmp/e.0"; }
LOOM_INIT=env:// WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "$BIN" >"$tmp/e.0" 2>&1
[ $? != 0 ] && grep -q "needs RANK in the environment" "$tmp/e.0" &&
  ok "a missing RANK is named" || { bad "missing RANK"; cat "$tmp/e.0"; }
LOOM_INIT=env:// RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=99999 "$BIN" >"$tmp/e.0" 2>&1
[ $? != 0 ] && grep -q "MASTER_PORT='99999' is not a whole number from 1 to 65535" "$tmp/e.0" &&
  ok "a bad MASTER_PORT is named" || { bad "bad port"; cat "$tmp/e.0"; }
# A port another process holds, inside the ephemeral range (the kernel
# picks it: bind to port 0), is named with the range and a way out; the
# holder keeps it for as long as rank 0 runs.
python3 - "$BIN" >"$tmp/e.0" 2>&1 <<'PY'
import os, socket, subprocess, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
env = dict(os.environ, LOOM_INIT="env://", RANK="0", WORLD_SIZE="2",
           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
print("held", s.getsockname()[1], flush=True)
sys.exit(subprocess.run([sys.argv[1]], env=env).returncode)
PY
[ $? != 0 ] && grep -q "cannot listen on MASTER_PORT $(awk '/^held/{print $2}' "$tmp/e.0"): Address already in use (it lies in this host's ephemeral range" "$tmp/e.0" &&
  ok "a port in use: $(grep -o 'cannot listen.*' "$tmp/e.0")" || { bad "port in use"; cat "$tmp/e.0"; }

# Nothing left: the rendezvous directory, ompi-server, the singletons' orted.
left=$(find "$tmp" -maxdepth 1 -name 'loom-rdzv-*' | wc -l)
[ "$left" = 0 ] && ok "no rendezvous directory left" || bad "$left rendezvous directories left"
for _ in $(seq 100); do
  procs=$(pgrep -f "ompi-server --no-daemonize -r $tmp/" | while read -r p; do
    [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = Z ] || echo "$p"; done)
  [ -z "$procs" ] && break
  sleep 0.1 # polled: the server ends on its parent's SIGTERM
done
[ -z "$procs" ] && ok "no ompi-server left" || bad "ompi-server left: $procs"
finish comm_env_init
