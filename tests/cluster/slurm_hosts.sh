#!/usr/bin/env bash
# loom under a real SLURM across emulated hosts (tests/cluster/hosts.sh:
# network namespaces on a bridge, 1 Gbit/s links; tests/cluster/slurmd.sh:
# a munged, a slurmctld and slurmds of this test's own). slurmctld runs in
# the switch's namespace, reached at 10.79.0.1 on the bridge (the clients
# run there too); one slurmd in each host's namespace (NodeName hostK,
# NodeAddr 10.79.0.(10+K), host name hostK, its own pid file, spool, log
# and TmpFS); one munged serves all (its socket is a path); the file system
# is shared (the run directory, as on NFS). host3 is a spare: a higher
# Weight, so the scheduler takes host1 and host2 first.
#   1. examples/slurm/train.sbatch on 2 nodes x 2 tasks: loom's ranks run
#      on host1 and host2 (each rank's log says where; the gradients cross
#      host2's link) and train to the bits of the same run as 4 ranks on
#      one host (deterministic mode).
#   2. A node dies mid-run: once step 4's checkpoint exists, every process
#      on the job's other node (not the batch host: its slurmd, slurmstepd
#      and ranks) is killed. slurmctld finds the node not answering
#      (SlurmdTimeout), sets it DOWN, cancels the job's step "due to node
#      failure" and requeues the job (--requeue); it starts again on the
#      nodes left (host1 and the spare host3), resumes from the checkpoint
#      and ends with the bits of the uninterrupted run. The dead node's
#      slurmd started again, the node is back in service
#      (ReturnToService=2).
# Nothing is left behind (no daemon, job process, munge socket or
# namespace), also when a check fails midway or the test is stopped (the
# trap). Skips (77) when not root, without network namespaces, without
# SLURM, or with loom built against MPICH (the steps use --mpi=pmix).
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/slurmd.sh"
. "$(dirname "$0")/hosts.sh"
t_start=$SECONDS
slurm_can || {
  echo "skipped: needs root and SLURM (munge slurmctld slurmd slurm-client), which could not be installed"
  exit 77
}
hosts_start 3 1gbit cluster_slurm_hosts "loom is built against MPICH; these SLURM steps use srun --mpi=pmix (Open MPI)"
export LOOM_LOG=info
HEAD_NS="${HOSTS_PREFIX}sw"

host_killed() { # K: SIGKILL to every process in host K's namespace; true once none is left
  local p ns="${HOSTS_PREFIX}n$1"
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  [ -z "$(ip netns pids "$ns" 2>/dev/null)" ]
}
# At exit, whatever failed: the jobs, the daemons (by their pid files),
# any process still carrying the mark or still on a host, the namespaces,
# the files.
cleanup() {
  slurm_down >/dev/null 2>&1
  local p
  for p in $(slurm_left); do kill -KILL "$p" 2>/dev/null; done
  for p in 1 2 3; do host_killed "$p"; done
  hosts_down
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' TERM INT HUP

# The head: an address on the bridge, in the switch's namespace, where
# slurmctld listens and the clients run.
ip -n "$HEAD_NS" link set lo up && ip -n "$HEAD_NS" addr add 10.79.0.1/24 dev br0 ||
  { bad "an address for the head on the bridge"; finish cluster_slurm_hosts; }
on_head() { ip netns exec "$HEAD_NS" "$@"; }
for c in sbatch squeue scontrol scancel sinfo; do eval "$c() { on_head $c \"\$@\"; }"; done

SLURM_CTLD="$(hostname -s)(10.79.0.1)"
SLURM_NODES="NodeName=host1 NodeAddr=10.79.0.11 CPUs=2 Weight=1 State=UNKNOWN
NodeName=host2 NodeAddr=10.79.0.12 CPUs=2 Weight=1 State=UNKNOWN
NodeName=host3 NodeAddr=10.79.0.13 CPUs=2 Weight=2 State=UNKNOWN"
SLURM_PARTITION="host[1-3]"
# A dead node is found in ~25 s here (SlurmdTimeout, the pings' own
# timeouts); a job's ranks stuck in a collective with the dead node's
# ranks are killed KillWait after SIGTERM.
SLURM_NODE_TIMEOUT=10
SLURM_KILL_WAIT=5

# K: hostK's slurmd, in its network namespace (nsenter: `ip netns exec`
# would give it a fresh /sys without /sys/fs/cgroup, and slurmd 22.05 does
# not start without) under its own host name; every job step on the node
# inherits both.
node_start() {
  slurm_node_dirs "host$1" &&
    nsenter --net="/run/netns/${HOSTS_PREFIX}n$1" unshare --uts -- env SLURM_TEST_MARK="$SLURM_TEST_MARK" \
      /bin/sh -c 'hostname "$0" && exec slurmd -N "$0"' "host$1"
}
nodes_idle() { # NODE...: each idle
  local n
  for n in "$@"; do node_idle "$n" || return 1; done
}
slurm_said() { # JOBID: what SLURM says, when something did not happen
  echo "--- scontrol show job $1"
  scontrol show job "$1" 2>&1 | head -30
  echo "--- sinfo -N"
  sinfo -N 2>&1
  local f
  for f in "$SLURM_DIR"/log/*.log; do
    echo "--- $f"
    tail -n 12 "$f"
  done
}

t=$SECONDS
slurm_prepare && on_head env SLURM_TEST_MARK="$SLURM_TEST_MARK" slurmctld &&
  node_start 1 && node_start 2 && node_start 3 &&
  wait_for 60 "the nodes to be idle" nodes_idle host1 host2 host3 || {
  bad "starting munged, slurmctld and 3 slurmds"
  slurm_said 0
  finish cluster_slurm_hosts
}
ok "munged, slurmctld on the head and a slurmd on each of 3 hosts up in $((SECONDS - t)) s"

cfg=("$SRC/examples/small_mlp.yaml" --set train.steps=16 --set checkpoint.every=4
  --set checkpoint.keep=8 --set log.every=1 --set train.eval_every=8
  --set parallel.deterministic=true --set log.per_rank=true)
losses() { # RUN: the last loss and val_loss written for every step
  python3 -c 'import json, sys
seen = {}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    for k in ("loss", "val_loss"):
        if k in r: seen[(r["step"], k)] = repr(r[k])
for (s, k), v in sorted(seen.items()): print(s, k, v)' "$1"
}
last_step() { tail -n 1 "$1/metrics.jsonl" | grep -o '"step": *[0-9]*' | grep -o '[0-9]*$'; }
rx() { # K: bytes host K received on its link
  ip -n "${HOSTS_PREFIX}n$1" -s -j link show lnk0 | python3 -c 'import json, sys
print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'
}
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_field() { scontrol show job "$1" 2>/dev/null | grep -o " $2=[^ ]*" | cut -d= -f2; }
job_nodes() { scontrol show hostnames "$(job_field "$1" NodeList)" 2>/dev/null | sort | tr '\n' ' '; }
job_gone() { [ -z "$(squeue -h -j "$1" 2>/dev/null)" ]; }
job_pending() { [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = PENDING ]; }
node_down() { sinfo -h -n "$1" -o %T 2>/dev/null | grep -q '^down'; }
latest_is() { grep -qx "step_0*$2" "$1/ckpt/latest" 2>/dev/null; }
stepd_of() { # JOBID: pids of this cluster's slurmstepd of that job
  local p
  for p in $(slurm_left); do
    case "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in "slurmstepd: [$1."*) echo "$p" ;; esac
  done
}
# Requeued: back in the queue and its first start gone from the nodes
# left (a slurmstepd may outlive its job by a few seconds; a step of the
# next start that came sooner would find its PMIx socket in use).
job_requeued() { # JOBID NODE...
  local j=$1
  shift
  job_pending "$j" && [ -z "$(stepd_of "$j")" ] && nodes_idle "$@"
}
# NAME [VAR=VALUE...]: train.sbatch on 2 nodes x 2 tasks into $tmp/NAME,
# the job's id in $jid. Its ranks' TMPDIR (Open MPI's session directories,
# loom run's job directory) is in the test's directory; Open MPI between
# hosts over lnk0 (TCP), shared memory inside a host.
submit() {
  local name=$1
  shift
  jid=$(on_head env SLURM_TEST_MARK="$SLURM_TEST_MARK" TMPDIR="$SLURM_DIR/tmp" LOOM_BIN="$LOOM" \
    OMPI_MCA_btl_vader_backing_directory="$SLURM_DIR/tmp" OMPI_MCA_pml=ob1 \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lnk0 RUN_DIR="$tmp/$name" "$@" \
    sbatch --parsable --nodes=2 --ntasks-per-node=2 --ntasks=4 -o "$tmp/$name.out" -J "$name" \
    "$SRC/examples/slurm/train.sbatch" "${cfg[@]}" 2>"$tmp/$name.sbatch")
  [ -n "$jid" ] || bad "$name: sbatch: $(cat "$tmp/$name.sbatch")"
}
ranks_on() { # RUN N: "host:ranks ..." of the N-th start in the ranks' logs
  local f
  for f in "$1"/logs/rank-*.log; do
    grep -o -- '---- rank [0-9]* of 4 on [a-z0-9]*' "$f" | sed -n "$2p" | grep -o '[a-z0-9]*$'
  done | sort | uniq -c | awk '{printf "%s:%s ", $2, $1}'
}
check_job() { # NAME WHAT: COMPLETED, with the reference's losses
  local name=$1 what=$2 st
  st=$(job_state "$jid")
  if [ "$st" = COMPLETED ] && [ -s "$tmp/$name/metrics.jsonl" ] &&
    [ "$(losses "$tmp/$name")" = "$(losses "$tmp/ref")" ]; then
    ok "$what: COMPLETED, every loss and val_loss equal those of 4 ranks on one host, bit for bit"
  else
    bad "$what: state $st; $(diff <(losses "$tmp/ref") <(losses "$tmp/$name" 2>&1) | head -4)"
    tail -n 15 "$tmp/$name.out"
    slurm_said "$jid"
  fi
}

# The reference: the same config, 4 ranks under plain loom run on one host.
t=$SECONDS
"$LOOM" run -n 4 --timeout 120 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/ref" >"$tmp/ref.out" 2>&1 &&
  ok "the reference, 4 ranks on one host, in $((SECONDS - t)) s" ||
  bad "loom run -n 4: $(tail -3 "$tmp/ref.out")"

# 1. Two nodes, two tasks each.
t=$SECONDS
before=$(rx 2)
submit plain
wait_for 120 "job $jid (plain)" job_gone "$jid" || slurm_said "$jid"
moved=$(($(rx 2) - before))
check_job plain "sbatch --nodes=2 --ntasks-per-node=2 train.sbatch in $((SECONDS - t)) s"
on=$(ranks_on "$tmp/plain" 1)
[ "$on" = "host1:2 host2:2 " ] && [ "$(job_nodes "$jid")" = "host1 host2 " ] &&
  ok "plain: NodeList=$(job_field "$jid" NodeList), the ranks ran on $on" ||
  bad "plain: NodeList=$(job_field "$jid" NodeList), ranks on '$on'"
grep -q ' 2 of the 4 ranks on this host' "$tmp/plain/logs/rank-3.log" &&
  ok "plain: rank 3 says $(grep -o 'comm: .*' "$tmp/plain/logs/rank-3.log" | head -1)" ||
  bad "plain: rank 3's log: $(grep 'comm:' "$tmp/plain/logs/rank-3.log")"
# 16 all-reduces of ~25,000 gradients (100 kB) between the hosts.
[ "$moved" -gt 1000000 ] && ok "plain: host2 received $((moved / 1000)) kB over its link" ||
  bad "plain: host2 received only $moved bytes: the ranks did not talk over the link"

# 2. A node dies mid-run. Rank 0 is slow after step 5 in the first start
# only (LOOM_FAULT fires while LOOM_RESTART_COUNT, from SLURM_RESTART_COUNT,
# is 0), so the job is still running when the node dies.
t=$SECONDS
submit killed LOOM_FAULT=0:5:slow:1
wait_for 120 "step 4's checkpoint of job $jid" latest_is "$tmp/killed" 4 || slurm_said "$jid"
batch=$(job_field "$jid" BatchHost)
first=$(job_nodes "$jid")
victim=$(for n in $first; do [ "$n" != "$batch" ] && echo "$n"; done)
case "$batch $victim" in
"host1 host2" | "host2 host1") ;;
*)
  bad "job $jid: batch host '$batch', nodes '$first'"
  slurm_said "$jid"
  finish cluster_slurm_hosts
  ;;
esac
k=${victim#host}
wait_for 20 "every process on $victim to be killed" host_killed "$k"
t_kill=$SECONDS
at=$(last_step "$tmp/killed")
[ "${at:-16}" -lt 16 ] && ok "killed every process on $victim (job $jid's other node; the batch host is $batch) at step $at" ||
  bad "job $jid had ended (step $at) before $victim was killed"
wait_for 90 "$victim to be down" node_down "$victim" || slurm_said "$jid"
t_down=$SECONDS
wait_for 60 "job $jid back in the queue" job_requeued "$jid" "$batch" host3 || slurm_said "$jid"
ok "$victim DOWN $((t_down - t_kill)) s after the kill, job $jid requeued $((SECONDS - t_kill)) s after ($(job_field "$jid" Reason))"
grep -q "requeue job JobId=$jid due to failure of node $victim" "$SLURM_DIR/log/slurmctld.log" &&
  ok "slurmctld: $(grep -o "requeue job JobId=$jid due to failure of node $victim" "$SLURM_DIR/log/slurmctld.log"); the job's output: $(grep -o "srun: error: Node failure on $victim\|CANCELLED AT [^ ]* DUE TO NODE FAILURE" "$tmp/killed.out" | sort -u | tr '\n' ' ')" ||
  bad "not requeued for the node's failure: $(grep "JobId=$jid" "$SLURM_DIR/log/slurmctld.log")"
# SLURM holds a requeued job back for about two minutes (its begin time:
# the credentials' lifetime); the test lets it go at once.
scontrol update JobId="$jid" StartTime=now
wait_for 120 "job $jid (requeued)" job_gone "$jid" || slurm_said "$jid"
check_job killed "job with a node killed in $((SECONDS - t)) s"
restarts=$(job_field "$jid" Restarts)
nodes=$(job_nodes "$jid")
want=$(printf '%s\n' "$batch" host3 | sort | tr '\n' ' ')
ran1=$(ranks_on "$tmp/killed" 1)
ran2=$(ranks_on "$tmp/killed" 2)
[ "$restarts" = 1 ] && [ "$nodes" = "$want" ] && [ "$ran1" = "host1:2 host2:2 " ] &&
  [ "$ran2" = "$(for n in $want; do printf '%s:2 ' "$n"; done)" ] &&
  ok "killed: requeued once (Restarts=$restarts); the ranks ran on $ran1, then on $ran2" ||
  bad "killed: Restarts=$restarts, nodes '$nodes'; the ranks ran on '$ran1', then on '$ran2'"
resumed=$(grep -o 'resuming from [^ ]* (step [0-9]*' "$tmp/killed.out" | grep -o '[0-9]*$')
[ -n "$resumed" ] && [ "$resumed" -ge 4 ] && [ "$resumed" -lt 16 ] &&
  ok "killed: the second start resumed from the checkpoint of step $resumed" ||
  bad "killed: no resume from a checkpoint: $(grep -i 'resum\|loom job' "$tmp/killed.out")"

# The node back: its slurmd started again registers, the node is idle.
t=$SECONDS
node_start "$k" && wait_for 60 "$victim to be back" node_idle "$victim" &&
  ok "$victim's slurmd started again: the node is back in service in $((SECONDS - t)) s" ||
  bad "$victim not back: $(sinfo -N 2>&1)"

slurm_down
[ -e "$SLURM_DIR/munge/sock" ] && bad "munged's socket is left"
left=$(slurm_left)
[ -z "$left" ] && ok "teardown: no daemon or job process left" ||
  bad "left running: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)"
hosts_down
left=$(ip netns list | grep -c "^${HOSTS_PREFIX}" || true)
[ "$left" = 0 ] && ok "no namespace left" || bad "$left namespaces left"
echo "cluster_slurm_hosts: $((SECONDS - t_start)) s"
finish cluster_slurm_hosts
