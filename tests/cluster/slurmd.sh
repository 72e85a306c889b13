# A SLURM cluster of this test's own, sourced after tests/lib.sh: a munged,
# a slurmctld and one slurmd a node, started by hand (no systemd here),
# every file under $tmp/slurm (config, state, spool, logs, pid files, the
# munge key and socket, each node's TmpFS where the PMIx plugin makes its
# directories), ports found free, all daemons as root (SlurmUser=root:
# nothing has to be readable by the slurm user). The munged has a socket of
# its own, so it neither needs nor disturbs one that serves the machine
# (its socket is a path: every network namespace reaches it). The daemons,
# and the jobs through sbatch, carry SLURM_TEST_MARK in their environment:
# what is left after slurm_down is found by it. Stopped only by the pids in
# their own pid files.
#   slurm_can          root, and the binaries (installed when missing)
#   slurm_up           one node "localhost" on this machine; SLURM_CONF is
#                      exported for the clients
#   slurm_prepare      munged and slurm.conf only, for SLURM_CTLD (the
#                      SlurmctldHost line's value), SLURM_NODES (NodeName
#                      lines), SLURM_PARTITION (its Nodes=),
#                      SLURM_NODE_TIMEOUT (SlurmdTimeout) and
#                      SLURM_KILL_WAIT (KillWait); the caller
#                      starts slurmctld and the slurmds where it wants them
#   slurm_node_dirs N  make node N's spool and TmpFS
#   slurm_down         cancel every job, stop the daemons (also at exit)
#   slurm_stop_node N  stop node N's slurmd (by its pid file)
#   slurm_left         pids of processes still carrying the mark
#   node_idle [NODE]   NODE (localhost) is idle
#   wait_for S WHAT CMD...  poll CMD until it succeeds, S seconds at most
# The clients (sinfo, squeue, scancel) are called by name: a test whose
# slurmctld is reached only from a namespace wraps them in functions.
SLURM_DIR="$tmp/slurm"
SLURM_TEST_MARK="loom-slurm-test-$$-$RANDOM"
SLURM_BINS="munged munge slurmctld slurmd sbatch squeue scontrol scancel srun salloc sinfo"

slurm_can() {
  [ "$(id -u)" = 0 ] || return 1
  local b missing=0
  for b in $SLURM_BINS; do command -v "$b" >/dev/null 2>&1 || missing=1; done
  if [ $missing = 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing munge slurmctld slurmd slurm-client"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -qq install -y \
      --no-install-recommends munge slurmctld slurmd slurm-client >/dev/null 2>&1 || true
  fi
  for b in $SLURM_BINS; do command -v "$b" >/dev/null 2>&1 || return 1; done
}

wait_for() { # SECONDS WHAT CMD...: polls CMD until it succeeds
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do
    if [ $SECONDS -ge $end ]; then
      echo "timed out waiting for $what"
      return 1
    fi
    sleep 0.05
  done
}

# Alive: the pid exists and is not a zombie (PID 1 here reaps late, and
# kill -0 succeeds on a zombie).
alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]
}

port_free() { ! ss -Htln "sport = :$1" | grep -q .; }

SLURM_CTLD="$(hostname -s)(127.0.0.1)"
SLURM_NODES="NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN"
SLURM_PARTITION=localhost
SLURM_NODE_TIMEOUT=60
SLURM_KILL_WAIT=10

slurm_prepare() {
  local d=$SLURM_DIR p
  mkdir -p "$d"/munge "$d"/state "$d"/spool "$d"/log "$d"/nodetmp "$d"/tmp || return 1
  chmod 700 "$d"/munge
  head -c 1024 /dev/urandom >"$d"/munge/key && chmod 400 "$d"/munge/key || return 1
  # --force: the socket's directory is not open to all users (the test's
  # own temporary directory); every client here runs as root anyway.
  env SLURM_TEST_MARK="$SLURM_TEST_MARK" munged --force --socket="$d/munge/sock" \
    --key-file="$d/munge/key" --pid-file="$d/munge/pid" --log-file="$d/munge/log" \
    --seed-file="$d/munge/seed" || return 1
  wait_for 20 munged munge_ok || return 1
  # Two free ports next to each other, from a start that differs per test.
  p=$((20000 + ($$ * 7) % 20000))
  while ! port_free $p || ! port_free $((p + 1)); do p=$((p + 2)); done
  cat >"$d"/slurm.conf <<EOF
# Written by tests/cluster/slurmd.sh for one test; removed with it.
ClusterName=lt$$
SlurmctldHost=$SLURM_CTLD
SlurmctldPort=$p
SlurmdPort=$((p + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/sock
# No cgroups, no systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
# A rank that fails ends its step (an MPICH step would hang otherwise).
KillOnBadExit=1
# A node that was down (killed, not responding) is back in service once
# its slurmd registers again.
ReturnToService=2
SlurmctldPidFile=$d/slurmctld.pid
# Per node (%n: its NodeName): the slurmd's pid file, spool and log, and
# the TmpFS where the PMIx plugin makes its directories (one for all
# nodes, they would collide: "File exists").
SlurmdPidFile=$d/slurmd.%n.pid
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.%n.log
TmpFS=$d/nodetmp/%n
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node may claim more CPUs than the machine has.
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MessageTimeout=10
# A node whose slurmd has not answered for this long is down: its jobs are
# requeued (--requeue) or ended.
SlurmdTimeout=$SLURM_NODE_TIMEOUT
InactiveLimit=0
# Finished jobs stay visible to scontrol for the whole test.
MinJobAge=600
# SIGTERM to a job's processes, then SIGKILL this much later.
KillWait=$SLURM_KILL_WAIT
$SLURM_NODES
PartitionName=debug Nodes=$SLURM_PARTITION Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$d/slurm.conf"
}

slurm_node_dirs() { mkdir -p "$SLURM_DIR/spool/$1" "$SLURM_DIR/nodetmp/$1"; }

slurm_up() {
  slurm_prepare || return 1
  env SLURM_TEST_MARK="$SLURM_TEST_MARK" slurmctld || return 1
  slurm_node_dirs localhost || return 1
  env SLURM_TEST_MARK="$SLURM_TEST_MARK" slurmd -N localhost || return 1
  wait_for 60 "the node to be idle" node_idle
}

munge_ok() { munge -S "$SLURM_DIR/munge/sock" -n </dev/null 2>/dev/null | unmunge -S "$SLURM_DIR/munge/sock" >/dev/null 2>&1; }
node_idle() { sinfo -h -n "${1:-localhost}" -o %T 2>/dev/null | grep -q '^idle'; }
queue_empty() { [ -z "$(squeue -h -o %i 2>/dev/null)" ]; }

stop_pidfile() { # FILE NAME: SIGTERM, then SIGKILL after 10 s
  local pf=$1 name=$2 pid
  [ -f "$pf" ] || return 0
  pid=$(cat "$pf")
  case "$pid" in '' | *[!0-9]*) return 0 ;; esac
  if alive "$pid" && grep -qx "$name" "/proc/$pid/comm" 2>/dev/null; then
    kill -TERM "$pid"
    if ! wait_for 10 "$name to stop" eval '! alive '"$pid"; then
      kill -KILL "$pid" 2>/dev/null
      wait_for 10 "$name to die" eval '! alive '"$pid"
    fi
  fi
  rm -f "$pf"
}

slurm_down() {
  [ -d "$SLURM_DIR" ] || return 0
  if [ -f "$SLURM_DIR/slurmctld.pid" ] && alive "$(cat "$SLURM_DIR/slurmctld.pid")"; then
    scancel --quiet --user="$(id -un)" 2>/dev/null
    wait_for 30 "the jobs to end" queue_empty
  fi
  local pf
  for pf in "$SLURM_DIR"/slurmd.*.pid; do stop_pidfile "$pf" slurmd; done
  stop_pidfile "$SLURM_DIR/slurmctld.pid" slurmctld
  stop_pidfile "$SLURM_DIR/munge/pid" munged
}

slurm_stop_node() { stop_pidfile "$SLURM_DIR/slurmd.$1.pid" slurmd; }

slurm_left() { # pids of live processes with this test's mark
  local e pid
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/}
    pid=${pid%/environ}
    [ "$pid" = $$ ] && continue
    if grep -qzx "SLURM_TEST_MARK=$SLURM_TEST_MARK" "$e" 2>/dev/null && alive "$pid"; then
      echo "$pid"
    fi
  done
}
