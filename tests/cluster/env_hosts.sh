#!/usr/bin/env bash
# LOOM_INIT=env:// across emulated hosts (tests/cluster/hosts.sh): each rank
# started on its own host by hand, no mpirun, with torchrun's variables and
# host1 as the master. 2 hosts x 2 ranks of deterministic DDP give the bits
# of the same 4 ranks under loom run on one host; each host's ranks find
# each other (shared memory inside the host, the hierarchical all-reduce
# between hosts); the gradients crossed the link; the same job through
# `loom run --nnodes 2 --node-rank K` on each host; a rank whose master is
# on no host gives up naming it; nothing is left behind. Skips (77) where
# namespaces cannot be made (not root) or loom is built against MPICH.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/hosts.sh"
export TMPDIR=$tmp
hosts_start 2 1gbit cluster_env "LOOM_INIT=env:// needs Open MPI"

cat "$SRC"/docs/*.md 2>/dev/null | head -c 100000 >"$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=2
  --set model.d_model=64 --set model.heads=2 --set model.context=32 --set train.batch_size=2
  --set train.steps=6 --set log.every=1 --set parallel.strategy=ddp
  --set parallel.deterministic=true --set checkpoint.enabled=false --set log.per_rank=true --quiet)
losses() { grep -o '"loss": *[^,}]*' "$1/metrics.jsonl"; }
rx() { ip -n "${HOSTS_PREFIX}n$1" -s -j link show lnk0 | python3 -c 'import json, sys
print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'; }

"$LOOM" run -n 4 --timeout 300 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/ref" >"$tmp/ref.out" 2>&1 ||
  bad "4 ranks on one host: $(tail -3 "$tmp/ref.out")"
port=$(port_base)
before=$(rx 2)
t0=$(date +%s.%N)
pids=()
for r in 0 1 2 3; do
  k=$((r / 2 + 1))
  on_host $k env LOOM_INIT=env:// MASTER_ADDR=10.79.0.11 MASTER_PORT=$port RANK=$r WORLD_SIZE=4 \
    LOCAL_RANK=$((r % 2)) LOOM_RDZV_TIMEOUT=120 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/env" \
    >"$tmp/r$r.out" 2>&1 &
  pids+=($!)
done
codes=""
for p in "${pids[@]}"; do wait "$p"; codes="$codes $?"; done
secs=$(echo "$(date +%s.%N) - $t0" | bc)
moved=$(($(rx 2) - before))
if [ "$codes" = " 0 0 0 0" ] && [ -s "$tmp/env/metrics.jsonl" ] && [ "$(losses "$tmp/ref")" = "$(losses "$tmp/env")" ]; then
  ok "2 hosts x 2 ranks from env://, no mpirun: every loss equals 4 ranks under loom run, bit for bit (${secs%???????} s with start-up)"
else
  bad "env:// across hosts: exit codes$codes; $(diff <(losses "$tmp/ref") <(losses "$tmp/env") | head -3)"
  tail -n 40 "$tmp"/r*.out
fi
for r in 0 3; do
  grep -q "2 of the 4 ranks on this host; all-reduce, reduce-scatter and all-gather hierarchical" "$tmp/env/logs/rank-$r.log" &&
    grep -q " of 4 on host$((r / 2 + 1))" "$tmp/env/logs/rank-$r.log" &&
    ok "rank $r: $(grep -o 'rank [0-9] of 4 on host[0-9]' "$tmp/env/logs/rank-$r.log" | head -1); $(grep -o 'comm: .*' "$tmp/env/logs/rank-$r.log" | head -1)" ||
    bad "rank $r's log: $(grep -h 'comm:\|of 4 on' "$tmp/env/logs/rank-$r.log")"
done
[ "$moved" -gt 1000000 ] && ok "host2 received $((moved / 1000000)) MB over its link" ||
  bad "host2 received only $moved bytes"

# The same with torchrun's flags: loom run --nnodes on each host.
for k in 1 2; do
  on_host $k "$LOOM" run --nnodes 2 --node-rank $((k - 1)) --nproc-per-node 2 --master-addr 10.79.0.11 \
    --master-port $((port + 1)) --timeout 200 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/nn" \
    >"$tmp/nn$k.out" 2>&1 &
  pids[$k]=$!
done
wait "${pids[1]}"
c1=$?
wait "${pids[2]}"
c2=$?
[ $c1 = 0 ] && [ $c2 = 0 ] && [ "$(losses "$tmp/ref")" = "$(losses "$tmp/nn")" ] &&
  ok "loom run --nnodes 2 --node-rank K --nproc-per-node 2 on each host: every loss equals loom run -n 4" ||
  { bad "--nnodes across hosts ($c1, $c2)"; tail -n 40 "$tmp"/nn*.out; }

# A master on no host: the rank gives up within LOOM_RDZV_TIMEOUT, naming it.
on_host 2 env LOOM_INIT=env:// MASTER_ADDR=10.79.0.99 MASTER_PORT=$port RANK=1 WORLD_SIZE=2 \
  LOOM_RDZV_TIMEOUT=3 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/none" >"$tmp/none.out" 2>&1
[ $? != 0 ] && grep -q "cannot reach the master 10.79.0.99:$port" "$tmp/none.out" &&
  ok "an unreachable master: $(grep -o 'env://.*' "$tmp/none.out" | head -1)" || { bad "unreachable master"; cat "$tmp/none.out"; }
# The same through loom run --nnodes with --rdzv-timeout: its rank gives up
# in time, and loom run exits non-zero (nothing to restart into).
start=$(date +%s)
on_host 2 "$LOOM" run --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 10.79.0.99 \
  --master-port $((port + 2)) --rdzv-timeout 3 --timeout 60 "$LOOM" train "${cfg[@]}" \
  --set "log.run_dir=$tmp/none2" >"$tmp/none2.out" 2>&1
rc=$? took=$(($(date +%s) - start))
[ $rc != 0 ] && [ $took -lt 40 ] && grep -q "cannot reach the master 10.79.0.99:$((port + 2))" "$tmp/none2.out" &&
  ok "loom run --rdzv-timeout 3, master unreachable: exit $rc after ${took} s" ||
  { bad "loom run --rdzv-timeout (rc $rc, ${took} s)"; tail -5 "$tmp/none2.out"; }

hosts_down
left=$(ip netns list | grep -c "^${HOSTS_PREFIX}" || true)
[ "$left" = 0 ] && ok "no namespace left" || bad "$left namespaces left"
[ -z "$(find "$tmp" -maxdepth 1 -name 'loom-rdzv-*')" ] && ok "no rendezvous directory left" || bad "rendezvous directory left"
# each process's Open MPI session base (LOOM_INIT=env://), removed at exit
[ -z "$(find "$tmp" -maxdepth 1 -name 'loom-ompi-*')" ] && ok "no session base left" ||
  bad "session bases left: $(find "$tmp" -maxdepth 2 -path '*loom-ompi-*' | head -5)"
finish cluster_env
