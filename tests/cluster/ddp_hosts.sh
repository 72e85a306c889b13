#!/usr/bin/env bash
# DDP across emulated hosts (tests/cluster/hosts.sh: network namespaces, a
# bridge, 1 Gbit/s tbf links): `loom run --hosts` over Open MPI with its
# daemons started through the ssh stand-in, 2 hosts x 1 rank, 2 hosts x 2
# ranks and 4 hosts x 2 ranks, deterministic mode: every loss and the
# validation loss equal, bit for bit, those of the same number of ranks on
# one host and those of one rank; ZeRO-1 and ZeRO-3 at 2 x 2 too, their
# all-gathers hierarchical; each rank
# says which host it ran on; the gradients went over the links (the byte
# counters); not deterministic, the hierarchical all-reduce agrees with the
# flat one to rounding; nothing is left behind. Skips (77) where namespaces cannot be
# made (not root).
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/hosts.sh"
hosts_start 4 1gbit cluster_ddp "loom is built against another MPI; the emulated hosts drive Open MPI's rsh agent"
ok "4 emulated hosts, 1 Gbit/s links"

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

# Deterministic mode: any number of ranks gives the bits of one rank.
"$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/one1" >"$tmp/one1.out" 2>&1 ||
  bad "one rank: $(tail -3 "$tmp/one1.out")"
# LAYOUT: hosts x ranks a host.
for layout in 2x1 2x2 4x2; do
  nh=${layout%x*} per=${layout#*x}
  np=$((nh * per))
  spec=$(for k in $(seq 1 "$nh"); do printf 'host%d:%d,' "$k" "$per"; done)
  spec=${spec%,}
  "$LOOM" run -n "$np" --timeout 300 "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/one$np" \
    >"$tmp/one$np.out" 2>&1 || bad "$np ranks on one host: $(tail -3 "$tmp/one$np.out")"
  before=$(rx 2)
  if ! on_host 1 "$LOOM" run --hosts "$spec" -n "$np" --timeout 300 \
    "$LOOM" train "${cfg[@]}" --set "log.run_dir=$tmp/two$np" >"$tmp/two$np.out" 2>&1; then
    bad "$nh hosts x $per: $(tail -5 "$tmp/two$np.out")"
    # what each rank said last (a run stopped by the time limit once, with
    # no step logged, in CI's clang stage: the ranks' logs tell where)
    for f in "$tmp/two$np"/logs/*; do
      [ -f "$f" ] && { echo "--- $f"; tail -8 "$f"; }
    done
  fi
  moved=$(($(rx 2) - before))
  if [ -s "$tmp/two$np/metrics.jsonl" ] && [ "$(losses "$tmp/one$np")" = "$(losses "$tmp/two$np")" ] &&
    [ "$(losses "$tmp/two$np" | grep -c val_loss)" = 1 ]; then
    ok "$nh hosts x $per rank(s): every loss and the validation loss equal $np ranks on one host, bit for bit"
  else
    bad "$nh hosts x $per: losses differ: $(diff <(losses "$tmp/one$np") <(losses "$tmp/two$np") | head -4)"
  fi
  [ "$(losses "$tmp/one1")" = "$(losses "$tmp/two$np")" ] &&
    ok "$nh hosts x $per: the bits of one rank" || bad "$nh hosts x $per: differs from one rank"
  hosts=$(grep -ho ' of '"$np"' on host[0-9]' "$tmp/two$np"/logs/rank-*.log | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  want=$(for k in $(seq 1 "$nh"); do printf ' %d of %d on host%d;' "$per" "$np" "$k"; done)
  [ "$hosts" = "$want" ] &&
    ok "$nh hosts x $per: $per rank(s) on each host ($hosts)" || bad "$nh hosts x $per: ranks on: $hosts"
  # 8 steps of an all-reduce of the gradients (~0.5 M parameters, 2 MB).
  [ "$moved" -gt 8000000 ] && ok "$nh hosts x $per: host2 received $((moved / 1000000)) MB over its link" ||
    bad "$nh hosts x $per: host2 received only $moved bytes: the ranks did not talk over the link"
done

# ZeRO across 2 hosts x 2: the parameters' all-gathers (and the
# deterministic gradient sums' all-gather-v) take the two levels too, and
# the result is still the bits of one rank.
for strat in zero1 zero3; do
  on_host 1 env LOOM_LOG=debug "$LOOM" run --hosts host1:2,host2:2 -n 4 --timeout 300 \
    "$LOOM" train "${cfg[@]}" --set parallel.strategy=$strat --set "log.run_dir=$tmp/$strat" \
    >"$tmp/$strat.out" 2>&1 || bad "2 hosts x 2, $strat: $(tail -5 "$tmp/$strat.out")"
  gathers=$(grep -o '\[rank 3\] debug: comm: hierarchical path: .*' "$tmp/$strat.out" | grep -o '[0-9]* all-gathers')
  [ -s "$tmp/$strat/metrics.jsonl" ] && [ "$(losses "$tmp/one1")" = "$(losses "$tmp/$strat")" ] &&
    [ "${gathers%% *}" -gt 8 ] 2>/dev/null &&
    ok "2 hosts x 2, $strat: the bits of one rank; rank 3 took $gathers hierarchically" ||
    bad "2 hosts x 2, $strat: gathers '$gathers'; $(diff <(losses "$tmp/one1") <(losses "$tmp/$strat") | head -4)"
done

# Not deterministic: the gradients' all-reduce goes hierarchically (shared
# memory inside each host, one piece a rank between hosts), and agrees with
# the flat all-reduce (LOOM_COMM_HIER=0) to rounding; each run says which.
fast=("${cfg[@]}" --set parallel.deterministic=false)
for mode in hier flat; do
  [ $mode = flat ] && flag=0 || flag=1
  on_host 1 env LOOM_COMM_HIER=$flag "$LOOM" run --hosts host1:2,host2:2 -n 4 --timeout 300 \
    "$LOOM" train "${fast[@]}" --set "log.run_dir=$tmp/$mode" >"$tmp/$mode.out" 2>&1 ||
    bad "2 hosts x 2, $mode all-reduce: $(tail -5 "$tmp/$mode.out")"
done
grep -q "all-reduce, reduce-scatter and all-gather hierarchical" "$tmp/hier/logs/rank-0.log" &&
  grep -q "MPI between the ranks" "$tmp/flat/logs/rank-0.log" &&
  ok "2 hosts x 2: $(grep -o 'comm: .*' "$tmp/hier/logs/rank-0.log" | head -1)" ||
  bad "2 hosts x 2: the logs do not say hierarchical / flat: $(grep -h 'comm:' "$tmp"/{hier,flat}/logs/rank-0.log)"
python3 - "$tmp/hier" "$tmp/flat" >"$tmp/cmp" 2>&1 <<'PY'
import json, sys
def losses(d):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r]
h, f = losses(sys.argv[1]), losses(sys.argv[2])
assert len(h) == len(f) == 8, (len(h), len(f))
worst = max(abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(h, f))
assert worst < 1e-4, f"losses differ by {worst:.2e} (relative)"
print(f"8 losses within {worst:.1e} (relative) of the flat all-reduce's")
PY
[ $? = 0 ] && ok "2 hosts x 2, hierarchical: $(cat "$tmp/cmp")" || { bad "hierarchical against flat"; cat "$tmp/cmp"; }

hosts_down
left=$(ip netns list | grep -c "^${HOSTS_PREFIX}" || true)
[ "$left" = 0 ] && ok "no namespace left" || bad "$left namespaces left"
finish cluster_ddp
