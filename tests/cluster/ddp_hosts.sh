#!/usr/bin/env bash
# DDP across emulated hosts (tests/cluster/hosts.sh: network namespaces, a
# bridge, 1 Gbit/s tbf links): `loom run --hosts` over Open MPI with its
# daemons started through the ssh stand-in, 2 hosts x 1 rank and 2 hosts x
# 2 ranks, deterministic mode: every loss and the validation loss equal,
# bit for bit, those of the same number of ranks on one host; each rank
# says which host it ran on; the gradients went over the links (the byte
# counters); nothing is left behind. Skips (77) where namespaces cannot be
# made (not root).
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/hosts.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
hosts_can || { echo "skipped: cannot make network namespaces here (needs root and ip netns)"; exit 77; }
"$LOOM" run --dry-run -n 2 prog | grep -q '^command: mpirun.openmpi\|^command: [^ ]*ompi\|^command: mpirun ' ||
  { echo "skipped: loom is built against another MPI; the emulated hosts drive Open MPI's rsh agent"; exit 77; }
trap 'hosts_down; rm -rf "$tmp"' EXIT
hosts_up 2 1gbit || { bad "making 2 emulated hosts"; finish cluster_ddp; }
ok "2 emulated hosts, 1 Gbit/s links"

cat "$SRC"/docs/*.md 2>/dev/null | head -c 100000 >"$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=2
  --set model.d_model=128 --set model.heads=2 --set model.context=32 --set train.batch_size=2
  --set train.steps=8 --set log.every=1 --set train.eval_every=8 --set train.eval_batches=2
  --set parallel.strategy=ddp --set parallel.deterministic=true --set checkpoint.enabled=false
  --set log.per_rank=true --quiet)

losses() { # RUN: every loss and val_loss of metrics.jsonl, as written
  python3 -c 'import json, sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    for k in ("loss", "val_loss"):
        if k in r: print(r["step"], k, repr(r[k]))' "$1"
}
rx() { # K: bytes host K received on its link
  ip -n "${HOSTS_PREFIX}n$1" -s -j link show lnk0 | python3 -c 'import json, sys
print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'
}

for per in 1 2; do
  np=$((2 * per))
  "$LOOM" run -n "$np" --timeout 300 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/one$np" \
    >"$tmp/one$np.out" 2>&1 || bad "$np ranks on one host: $(tail -3 "$tmp/one$np.out")"
  before=$(rx 2)
  on_host 1 "$LOOM" run --hosts "host1:$per,host2:$per" -n "$np" --timeout 300 \
    "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/two$np" >"$tmp/two$np.out" 2>&1 ||
    bad "2 hosts x $per: $(tail -5 "$tmp/two$np.out")"
  moved=$(($(rx 2) - before))
  if [ -s "$tmp/two$np/metrics.jsonl" ] && [ "$(losses "$tmp/one$np")" = "$(losses "$tmp/two$np")" ] &&
    [ "$(losses "$tmp/two$np" | grep -c val_loss)" = 1 ]; then
    ok "2 hosts x $per rank(s): every loss and the validation loss equal $np ranks on one host, bit for bit"
  else
    bad "2 hosts x $per: losses differ: $(diff <(losses "$tmp/one$np") <(losses "$tmp/two$np") | head -4)"
  fi
  hosts=$(grep -ho ' of '"$np"' on host[0-9]' "$tmp/two$np"/logs/rank-*.log | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  [ "$hosts" = " $per of $np on host1; $per of $np on host2;" ] &&
    ok "2 hosts x $per: the ranks ran on host1 and host2 ($hosts)" || bad "2 hosts x $per: ranks on: $hosts"
  # 8 steps of an all-reduce of the gradients (~0.5 M parameters, 2 MB).
  [ "$moved" -gt 8000000 ] && ok "2 hosts x $per: host2 received $((moved / 1000000)) MB over its link" ||
    bad "2 hosts x $per: host2 received only $moved bytes: the ranks did not talk over the link"
done

hosts_down
left=$(ip netns list | grep -c "^${HOSTS_PREFIX}" || true)
[ "$left" = 0 ] && ok "no namespace left" || bad "$left namespaces left"
finish cluster_ddp
