#!/usr/bin/env bash
# Elastic across emulated hosts: `loom run --hostfile` with --min-np asks
# every other host through mpirun's agent before each start. Deterministic
# DDP on host1:2,host2:2; at step 4 host2 leaves (its link cut, every
# process on it killed): the job restarts without it on host1's 2 ranks
# (host2 "does not answer"), resumes from its checkpoint (4 ranks -> 2)
# and finishes with the bits of the uninterrupted 4-rank run. Then host2
# comes back (link up): the next start takes it in (2 -> 4 ranks) and
# trains on. Skips (77) without root or with MPICH.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/hosts.sh"
hosts_start 2 1gbit cluster_elastic "the emulated hosts drive Open MPI's rsh agent"

cat "$SRC"/docs/*.md 2>/dev/null | head -c 100000 >"$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=1
  --set model.d_model=32 --set model.heads=2 --set model.context=16 --set train.batch_size=2
  --set train.steps=12 --set log.every=1 --set parallel.strategy=ddp --set parallel.deterministic=true
  --set parallel.virtual_shards=4 --set checkpoint.every=2 --quiet)
last_step() { [ -s "$1/metrics.jsonl" ] && tail -n 1 "$1/metrics.jsonl" | grep -o '"step": *[0-9]*' | grep -o '[0-9]*$' || echo 0; }

"$LOOM" run -n 4 --timeout 200 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/ref" >"$tmp/ref.out" 2>&1 ||
  bad "4 ranks on one host: $(tail -3 "$tmp/ref.out")"
printf 'host1 slots=2\nhost2 slots=2\n' >"$tmp/hosts"
# Rank 0 slowed to 0.3 s a step (first start only), so host2 can leave
# mid-run.
on_host 1 env LOOM_FAULT=0:1:slow:0.3 "$LOOM" run --hostfile "$tmp/hosts" --min-np 2 --max-restarts 2 \
  --hang-timeout 4 --restart-delay 0.5 --timeout 200 \
  "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/el" >"$tmp/el.out" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ "$(last_step "$tmp/el")" -ge 4 ] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1 # polled: the run's own progress
done
# host2 leaves: its link down, everything on it killed.
ip -n "${HOSTS_PREFIX}n2" link set lnk0 down
for p in $(ip netns pids "${HOSTS_PREFIX}n2"); do kill -9 "$p" 2>/dev/null; done
wait $job
rc=$?
if [ $rc = 0 ] && grep -q "host host2 does not answer" "$tmp/el.out" && [ "$(loss_steps "$tmp/el")" = "$(loss_steps "$tmp/ref")" ]; then
  ok "host2 left: restarted on host1 alone, every loss the bits of 4 ranks; loom run said: $(grep -h 'does not answer\|recovered in' "$tmp/el.out" | tr '\n' ' ')"
else
  bad "host2 leaving (rc $rc)"
  tail -n 15 "$tmp/el.out"
fi
# host2 comes back: the next start takes it in and trains on to step 16.
ip -n "${HOSTS_PREFIX}n2" link set lnk0 up
# (mpirun's extra agent arguments, OMPI_MCA_plm_rsh_args, go to the probe
# as well, before the host.)
on_host 1 env OMPI_MCA_plm_rsh_args="-o ServerAliveInterval=7" RSH_LOG="$tmp/rsh.log" \
  "$LOOM" run --hostfile "$tmp/hosts" --min-np 2 --max-restarts 1 --timeout 200 \
  "$LOOM" train "${cfg[@]}" --set train.steps=16 --set log.per_rank=true --set "log.run_dir=$tmp/el" \
  >"$tmp/back.out" 2>&1
rc=$?
if [ $rc = 0 ] && ! grep -q "does not answer" "$tmp/back.out" && [ "$(last_step "$tmp/el")" = 16 ] &&
  grep -q " of 4 on host2" "$tmp"/el/logs/rank-3.log; then
  ok "host2 back: the next start ran 4 ranks again (rank 3 on host2), resumed from the 2-rank checkpoint to step 16"
else
  bad "host2 coming back (rc $rc)"
  tail -n 10 "$tmp/back.out"
fi
grep -qx -- "-o ServerAliveInterval=7 host2 true" "$tmp/rsh.log" &&
  ok "the probe passed OMPI_MCA_plm_rsh_args to the agent: $(grep -m1 ' true$' "$tmp/rsh.log")" ||
  bad "the probe's agent call: $(cat "$tmp/rsh.log" 2>/dev/null | head -3)"
hosts_down
left=$(ip netns list | grep -c "^${HOSTS_PREFIX}" || true)
[ "$left" = 0 ] && ok "no namespace left" || bad "$left namespaces left"
finish cluster_elastic
