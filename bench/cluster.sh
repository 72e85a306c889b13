#!/usr/bin/env bash
# bench/cluster: loom's all-reduce across emulated hosts (tests/cluster/
# hosts.sh: network namespaces joined by a bridge, tbf-limited links), for
# each link rate, number of hosts and ranks a host: loom flat
# (LOOM_COMM_HIER=0: MPI's all-reduce over all ranks, chunked), loom
# hierarchical (the default when a host has more than one rank: shared
# memory inside each host, 1/L of the data a rank between hosts) and plain
# MPI_Allreduce, all on the same buffers in the same run, flat and
# hierarchical alternating ROUNDS times (the best of each is kept). busbw
# against the link rate says how much of the wire a large all-reduce uses.
# Then DDP training of kjv-gpt (DDP_MODEL) on HOSTS x 2 ranks: loom flat,
# loom hierarchical and PyTorch DDP (gloo; its processes started on each
# host with env://), tokens/s, alternating ROUNDS times. Needs root.
#   usage: bench/cluster.sh [BUILD_DIR]   env: RATES ("1gbit 200mbit"),
#          HOSTS ("2"), SIZES (1M,16M,64M), LAYOUTS ("1 2": ranks a host),
#          OPS ("allreduce"; also allgather, reducescatter: ZeRO's two),
#          ROUNDS (2), DDP (1; 0 skips the training part), DDP_MODEL
#          (kjv-gpt; gpt85: the ~85M-parameter byte GPT of bench/zero.sh,
#          12 layers, d_model 768, context 256, one row a rank, loom train
#          against bench/torch/fsdp.py --strategy ddp; a list runs each),
#          DDP_STEPS (15 for kjv-gpt, 4 for gpt85), NO_TORCH=1 (loom only),
#          COMM (1; 0 skips the collectives part)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
RATES=${RATES:-1gbit 200mbit} HOSTS=${HOSTS:-2} SIZES=${SIZES:-1M,16M,64M}
LAYOUTS=${LAYOUTS:-1 2} ROUNDS=${ROUNDS:-2} OPS=${OPS:-allreduce}
SRC=$LOOM_ROOT
tmp=$(mktemp -d)
. "$LOOM_ROOT/tests/cluster/hosts.sh"
hosts_can || { echo "bench/cluster: needs root and ip netns" >&2; exit 1; }
trap 'hosts_down; rm -rf "$tmp"' EXIT
bench_check_load
export LOOM_THREADS=1 OMP_NUM_THREADS=1
[ "${COMM:-1}" = 1 ] &&
  echo "# loom bench comm ($OPS) f32 across emulated hosts (tbf both ways; ~5 us latency)"

one() { # HOSTS PER HIER OUT
  local h=$1 per=$2 hier=$3 list="" i
  for i in $(seq 1 "$h"); do list="$list${list:+,}host$i:$per"; done
  on_host 1 env LOOM_COMM_HIER="$hier" "$LOOM" run --hosts "$list" -n $((h * per)) \
    "$LOOM" bench comm --op "$op" --sizes "$SIZES" 2>&1 | grep -v '^\[bench\]' >"$4"
}

[ "${COMM:-1}" = 1 ] && for rate in $RATES; do
  for h in $HOSTS; do
    hosts_down
    hosts_up "$h" "$rate"
    for op in $OPS; do
    for per in $LAYOUTS; do
      echo "## $op, $rate, $h hosts x $per rank(s)"
      if [ "$per" = 1 ]; then
        one "$h" 1 1 "$tmp/t" && cat "$tmp/t"
        continue
      fi
      for r in $(seq "$ROUNDS"); do
        one "$h" "$per" 0 "$tmp/flat.$r"
        one "$h" "$per" 1 "$tmp/hier.$r"
      done
      echo "# flat (LOOM_COMM_HIER=0), round 1:"
      cat "$tmp/flat.1"
      echo "# hierarchical, round 1:"
      cat "$tmp/hier.1"
      # Per size: the best loom time of each, and plain MPI's best.
      cat "$tmp"/flat.* | awk '!/^#/ && NF > 8 {print "flat", $1, $6, $11}' >"$tmp/all"
      cat "$tmp"/hier.* | awk '!/^#/ && NF > 8 {print "hier", $1, $6, $11}' >>"$tmp/all"
      # busbw as nccl-tests count it: algbw x 2(p-1)/p for an all-reduce,
      # x (p-1)/p for the others.
      awk -v per="$per" -v h="$h" -v op="$op" '
        { k = $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
          if (!((k, $1) in best) || $3 < best[k, $1]) best[k, $1] = $3
          if (!(k in mpi) || $4 < mpi[k]) mpi[k] = $4 }
        END {
          p = h * per; f = (op == "allreduce" ? 2 : 1) * (p - 1) / p
          printf "# best of the rounds, busbw GB/s (%d ranks): size | flat | hierarchical | plain MPI | hierarchical / flat\n", p
          for (i = 1; i <= n; i++) { k = order[i]
            bf = k / best[k, "flat"] / 1e3 * f; bh = k / best[k, "hier"] / 1e3 * f; bm = k / mpi[k] / 1e3 * f
            printf "%12d | %6.3f | %6.3f | %6.3f | %5.2fx\n", k, bf, bh, bm, bh / bf } }' "$tmp/all"
    done
    done
  done
done

[ "${DDP:-1}" = 1 ] || exit 0
# ---- DDP training across the hosts: loom (flat, hierarchical), PyTorch.
BENCH="$BUILD/tests/parallel/ddp_bench"
[ -x "$BENCH" ] || { echo "bench/cluster: no $BENCH (make build)" >&2; exit 1; }
torch=0
bench_torch_peer && torch=1
bench_fair_env 1
head -c 30000 /dev/urandom | base64 >"$tmp/text.txt"
G85=(--set model.layers=12 --set model.d_model=768 --set model.heads=12 --set model.context=256
  --set train.batch_size=1 --set checkpoint.every=0 --set log.every=1 --set train.eval_every=0
  --set train.eval_batches=1 --set "data.path=$tmp/text.txt" --set parallel.strategy=ddp)
loom_ddp() { # HOSTS HIER: rank 0's JSON line
  local h=$1 list="" i
  for i in $(seq 1 "$h"); do list="$list${list:+,}host$i:2"; done
  if [ "$M" = gpt85 ]; then
    rm -rf "$tmp/g85"
    on_host 1 env LOOM_COMM_HIER="$2" LOOM_LOG=warn "$LOOM" run --hosts "$list" -n $((2 * h)) \
      --threads 1 --timeout 3000 "$LOOM" train "$LOOM_ROOT/examples/small_gpt.yaml" --resume never \
      --quiet "${G85[@]}" --set train.steps="$STEPS" --set "log.run_dir=$tmp/g85" >/dev/null 2>&1 || return 0
    python3 - "$tmp/g85" $((2 * h)) <<'PY'
import json, statistics, sys
steps = [json.loads(l)["step_s"] for l in open(sys.argv[1] + "/metrics.jsonl") if '"step_s"' in l]
step = statistics.median(steps[1:] or steps)
print(json.dumps({"throughput": 256 * int(sys.argv[2]) / step, "unit": "tokens/s"}))
PY
    return 0
  fi
  on_host 1 env LOOM_COMM_HIER="$2" "$LOOM" run --hosts "$list" -n $((2 * h)) --threads 1 \
    "$BENCH" --model "$M" --steps "$STEPS" 2>/dev/null | grep '^{' | tail -1
}
torch_ddp() { # HOSTS: PyTorch DDP (gloo), 2 processes a host, env:// at host1
  local h=$1 k r port=$((29000 + $$ % 1000)) pids=() cmd
  if [ "$M" = gpt85 ]; then
    cmd=("$BENCH_DIR/torch/fsdp.py" --worker --strategy ddp --steps "$STEPS")
  else
    cmd=("$BENCH_DIR/torch/ddp_scaling.py" --worker --model "$M" --threads 1 --steps "$STEPS"
      --timeout 300)
  fi
  for k in $(seq 1 "$h"); do
    for r in 0 1; do
      local rank=$(((k - 1) * 2 + r))
      [ $rank = 0 ] && continue
      on_host "$k" env RANK=$rank LOCAL_RANK=$r WORLD_SIZE=$((2 * h)) MASTER_ADDR=10.79.0.11 \
        MASTER_PORT=$port GLOO_SOCKET_IFNAME=lnk0 OMP_WAIT_POLICY=PASSIVE \
        "$TORCH_PYTHON" "${cmd[@]}" >/dev/null 2>&1 &
      pids+=($!)
    done
  done
  on_host 1 env RANK=0 LOCAL_RANK=0 WORLD_SIZE=$((2 * h)) MASTER_ADDR=10.79.0.11 \
    MASTER_PORT=$port GLOO_SOCKET_IFNAME=lnk0 OMP_WAIT_POLICY=PASSIVE \
    "$TORCH_PYTHON" "${cmd[@]}" 2>/dev/null | grep '^{' | tail -1 |
    python3 -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if "tokens_per_s" in r:
        r = {"throughput": r["tokens_per_s"], "unit": "tokens/s"}
    print(json.dumps(r))'
  wait "${pids[@]}" 2>/dev/null || true
}
for M in ${DDP_MODEL:-kjv-gpt}; do
if [ "$M" = gpt85 ]; then STEPS=${DDP_STEPS:-4}; else STEPS=${DDP_STEPS:-15}; fi
echo "# DDP $M across emulated hosts, 2 ranks a host x 1 thread: ${TORCH_PEER:-PyTorch: skipped}"
for rate in $RATES; do
  for h in $HOSTS; do
    hosts_down
    hosts_up "$h" "$rate"
    : >"$tmp/ddp"
    for r in $(seq "$ROUNDS"); do
      echo "flat $(loom_ddp "$h" 0)" >>"$tmp/ddp"
      echo "hier $(loom_ddp "$h" 1)" >>"$tmp/ddp"
      [ $torch = 1 ] && echo "torch $(torch_ddp "$h")" >>"$tmp/ddp"
    done
    python3 - "$tmp/ddp" "$rate" "$h" "$M" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    side, _, js = line.partition(" ")
    try:
        r = json.loads(js)
    except ValueError:
        print(f"# {side}: a round failed", file=sys.stderr)
        continue
    t = r.get("throughput", 0)
    if t > best.get(side, (0, None))[0]:
        best[side] = (t, r)
unit = next((r.get("unit", "items") for _, r in best.values()), "items")
print(f"## {sys.argv[4]}, {sys.argv[2]}, {sys.argv[3]} hosts x 2: best round, {unit}")
for side in ("flat", "hier", "torch"):
    if side in best:
        print(f"{side:6s} {best[side][0]:12,.0f}")
if "hier" in best and "flat" in best:
    print(f"hierarchical / flat {best['hier'][0] / best['flat'][0]:.2f}x")
if "torch" in best:
    top = max(best.get("hier", (0,))[0], best.get("flat", (0,))[0])
    print(f"loom (better of the two) / PyTorch DDP {top / best['torch'][0]:.2f}x")
PY
  done
done
done
