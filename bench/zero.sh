#!/usr/bin/env bash
# bench/zero: sharded data parallelism. A byte-level GPT (default about 85M
# parameters: 12 layers, d_model 768, context 256) on 1, 2 and 4 ranks x 1
# thread: per-rank peak RSS and tokens/s under ddp, zero1, zero2, zero3 and
# zero3 + activation checkpointing, and PyTorch's DDP and FSDP2 (fully_shard,
# gloo) on the same model in the same run, alternating.
#   usage: bench/zero.sh [BUILD_DIR]
# Environment: LAYERS, DMODEL, HEADS, CONTEXT, BATCH (rows per rank, 1),
# STEPS (5; the first is not timed), RANKS ("1 2 4"), ROUNDS (2: every run
# repeated, the rounds in turn, so that a slow minute of a shared machine
# does not fall on one strategy; the table gives the median step over all
# rounds), NO_TORCH=1 or TORCH=0, LARGEST=1 (also the largest model per
# strategy, below; long).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
L=${LAYERS:-12} C=${DMODEL:-768} H=${HEADS:-12} T=${CONTEXT:-256}
B=${BATCH:-1} S=${STEPS:-5} RANKS=${RANKS-"1 2 4"} ROUNDS=${ROUNDS:-2}
torch=0
bench_torch_peer && torch=1
bench_check_load
echo "# peer: ${TORCH_PEER:-PyTorch: skipped}, DDP and FSDP2 (gloo) on CPU; OMP_WAIT_POLICY=PASSIVE, 1 thread a rank"
bench_fair_env 1
export LOOM_THREADS=1 LOOM_LOG=warn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# small: the evaluation at the end reads the whole held-out 10%
head -c 30000 /dev/urandom | base64 >"$tmp/text.txt"

# the parameter count of loom's rows (the peer's counts its own)
params=$("$LOOM" estimate "$LOOM_ROOT/examples/small_gpt.yaml" -n 1 --set model.layers="$L" \
  --set model.d_model="$C" --set model.heads="$H" --set model.context="$T" \
  --set train.batch_size="$B" | sed -n 's/.*gpt, \([0-9]*\) parameters.*/\1/p') || params=""
echo "# GPT: $L layers, d_model $C, $H heads, context $T, byte vocabulary; $B row(s) per rank, AdamW f32"
echo "# loom: metrics.jsonl step_s (steps 2..$S), peak RSS of the largest rank (/usr/bin/time); $ROUNDS round(s)"
echo "# each row: the median step over all rounds, the largest RSS; x_ddp: tokens/s over the same side's ddp"
rows="$tmp/rows"
: >"$rows"

# RANKS DIR ARGS...: loom train of the GPT on RANKS ranks x 1 thread, its
# run directory DIR, each rank's peak RSS (KiB) in DIR.rss.<rank> (the rank
# from the launcher's environment), the output in DIR.out.
loom_train_rss() {
  local n=$1 d=$2
  shift 2
  "$LOOM" run -n "$n" --threads 1 --timeout 3000 sh -c \
    '/usr/bin/time -f %M -o "$0.rss.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" "$@"' "$d" \
    "$LOOM" train "$LOOM_ROOT/examples/small_gpt.yaml" --resume never --quiet \
    --set train.eval_every=0 --set train.eval_batches=1 --set "log.run_dir=$d" \
    "$@" >"$d.out" 2>&1
}

loom_one() { # RANKS STRATEGY AC
  local n=$1 s=$2 ac=$3 d="$tmp/run_$1_$2_$3"
  rm -rf "$d"
  loom_train_rss "$n" "$d" --set model.layers="$L" --set model.d_model="$C" --set model.heads="$H" \
    --set model.context="$T" --set train.batch_size="$B" --set train.steps="$S" \
    --set checkpoint.every=0 --set log.every=1 --set "data.path=$tmp/text.txt" \
    --set parallel.strategy="$s" --set train.activation_checkpointing="$ac" || {
    echo "loom $s on $n ranks failed:" >&2; tail -5 "$d.out" >&2; return 0; }
  python3 - "$d" "$n" "$s" "$ac" "$B" "$T" "$params" >>"$rows" <<'PY'
import glob, json, sys
d, n, s, ac, b, t, params = sys.argv[1:]
lines = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"step_s"' in l]
steps = [l["step_s"] for l in lines[1:]] or [lines[0]["step_s"]]
rss = max(int(open(f).read().split()[-1]) for f in glob.glob(d + ".rss.*")) / 1024
name = s + ("+ac" if ac != "none" else "")
tok = int(b) * int(t) * int(n)
print(json.dumps({"ranks": int(n), "side": "loom", "strategy": name, "params": int(params) if params else "",
                  "tokens": [tok / x for x in steps], "rss": rss}))
PY
}
torch_one() { # RANKS STRATEGY
  [ $torch = 1 ] || return 0
  local r
  r=$(bench_torch fsdp --ranks "$1" --strategy "$2" --layers "$L" --d-model "$C" \
    --heads "$H" --context "$T" --batch "$B" --steps "$S" --port "$(bench_free_port)" 2>"$tmp/torch.err") || {
    echo "PyTorch $2 on $1 ranks failed:" >&2; tail -3 "$tmp/torch.err" >&2; return 0; }
  python3 - "$r" >>"$rows" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(json.dumps({"ranks": r["ranks"], "side": "pytorch", "strategy": r["strategy"],
                  "params": r["params"], "tokens": [r["tokens_per_s"]], "rss": r["rss_mb"]}))
PY
}

for n in $RANKS; do
  for _ in $(seq "$ROUNDS"); do
    loom_one "$n" ddp none
    torch_one "$n" ddp
    [ "$n" = 1 ] && continue
    loom_one "$n" zero1 none
    loom_one "$n" zero2 none
    torch_one "$n" fsdp_grad_op
    loom_one "$n" zero3 none
    torch_one "$n" fsdp
    loom_one "$n" zero3 blocks
  done
done
# The table; loom_vs_pt: loom's tokens/s over PyTorch's at the same sharding
# (zero2 and FSDP2 SHARD_GRAD_OP, zero3 and FULL_SHARD, ddp and DDP).
python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
acc = {}
for r in rows:
    k = (r["ranks"], r["side"], r["strategy"])
    a = acc.setdefault(k, {"tokens": [], "rss": 0, "params": r["params"]})
    a["tokens"] += r["tokens"]
    a["rss"] = max(a["rss"], r["rss"])
med = {k: statistics.median(v["tokens"]) for k, v in acc.items()}
peer = {"ddp": "ddp", "zero2": "fsdp_grad_op", "zero3": "fsdp"}
print(f"{'ranks':<6} {'strategy':<22} {'params':>10} {'tokens_per_s':>12} {'rss_mb_rank':>12} {'x_ddp':>6} {'loom_vs_pt':>10}")
for k, v in acc.items():
    n, side, s = k
    x = med[k] / med[(n, side, "ddp")] if (n, side, "ddp") in med else float("nan")
    p = (n, "pytorch", peer.get(s, ""))
    vs = f"{med[k] / med[p]:10.2f}" if side == "loom" and p in med else f"{'':>10}"
    print(f"{n:<6} {side + ' ' + s:<22} {v['params']:>10} {med[k]:12.0f} {v['rss']:12.0f} {x:6.2f} {vs}")
PY

# LARGEST=1: the largest GPT (d_model 2048, 16 heads, context 256, layers
# chosen) that trains 3 steps on 2 ranks under each strategy, loom's and
# PyTorch's: loom estimate picks the most layers whose total fits 90% of
# MemTotal over the 2 ranks, then real runs decide: one layer more while a
# run succeeds, one less while it fails. PyTorch has no estimator: two short runs (2 and 4 layers) give
# its bytes a layer, the most layers that fit MemTotal are tried, then one
# more while a run succeeds, one less while it fails (a rank the kernel
# kills for memory fails the run). Long: minutes per run at this size on 2
# cores. LARGEST_LOOM (default "ddp zero1 zero2 zero3") and LARGEST_TORCH
# ("ddp fsdp_grad_op fsdp") choose the strategies; RANKS="" skips the
# throughput table.
[ "${LARGEST:-0}" = 1 ] || exit 0
budget=$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024 * 0.9 / 2 }' /proc/meminfo)
echo "# largest GPT on 2 ranks, d_model 2048, 16 heads, context 256, 1 row per rank, 3 steps; loom's budget $((budget >> 20)) MiB a rank"
printf '%-8s %-14s %8s %14s %12s\n' side strategy layers parameters rss_mb_rank
big=(--set model.d_model=2048 --set model.heads=16 --set model.context=256 --set train.batch_size=1)
# a few KB: the final evaluation of a billion parameters reads all of the 10% held out
head -c 4500 /dev/urandom | base64 >"$tmp/small.txt"
loom_big() { # STRATEGY LAYERS: 3 steps on 2 ranks, status
  loom_train_rss 2 "$tmp/big_$1_$2" "${big[@]}" --set model.layers="$2" --set train.steps=3 \
    --set checkpoint.enabled=false --set "data.path=$tmp/small.txt" --set parallel.strategy="$1"
}
for s in ${LARGEST_LOOM-ddp zero1 zero2 zero3}; do
  L=1
  while :; do
    tot=$("$LOOM" estimate "$LOOM_ROOT/examples/small_gpt.yaml" -n 2 --strategy $s "${big[@]}" \
      --set model.layers=$((L + 1)) | awk -v s=$s '$1 == s { print $10 }')
    awk -v t="$tot" -v b="$budget" 'BEGIN { exit !(t * 1048576 <= b) }' || break
    L=$((L + 1))
  done
  # From the estimate's answer: one layer more while a run succeeds (as
  # for PyTorch below: the machine decides), one less while it fails.
  best=0
  if loom_big $s $L; then
    best=$L
    while loom_big $s $((L + 1)); do L=$((L + 1)); best=$L; done
  else
    while [ $L -gt 1 ]; do
      L=$((L - 1))
      loom_big $s $L && { best=$L; break; }
    done
  fi
  [ $best -gt 0 ] || continue
  p=$("$LOOM" estimate "$LOOM_ROOT/examples/small_gpt.yaml" -n 2 "${big[@]}" \
    --set model.layers=$best | sed -n 's/.*gpt, \([0-9]*\) parameters.*/\1/p')
  r=$(cat "$tmp/big_${s}_$best".rss.* | sort -n | tail -1)
  printf '%-8s %-14s %8d %14d %12d\n' loom $s $best "$p" $((r / 1024))
done
[ $torch = 1 ] || exit 0
# LAYERS: one PyTorch run of 3 steps; its JSON line in $tmp/pt_L, status.
torch_big() {
  bench_torch fsdp --ranks 2 --strategy "$1" --layers "$2" --d-model 2048 --heads 16 \
    --context 256 --batch 1 --steps 3 --port "$(bench_free_port)" >"$tmp/pt_$2" 2>"$tmp/pt_$2.err"
}
pt_field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
for s in ${LARGEST_TORCH-ddp fsdp_grad_op fsdp}; do
  torch_big $s 2 && torch_big $s 4 || { echo "PyTorch $s: the small runs failed" >&2; tail -3 "$tmp/pt_2.err" >&2; continue; }
  r2=$(pt_field "$tmp/pt_2" rss_mb) r4=$(pt_field "$tmp/pt_4" rss_mb)
  L=$(awk -v a="$r2" -v b="$r4" -v m="$mem_kb" 'BEGIN {
    per = (b - a) / 2; L = 4 + int((m / 1024 / 2 - b) / per); print (L > 4 ? L : 4) }')
  best=0
  if torch_big $s $L; then
    best=$L
    while torch_big $s $((L + 1)); do L=$((L + 1)); best=$L; done
  else
    while [ $L -gt 4 ]; do
      L=$((L - 1))
      torch_big $s $L && { best=$L; break; }
    done
  fi
  [ $best -gt 0 ] || best=4
  printf '%-8s %-14s %8d %14d %12.0f\n' pytorch $s $best "$(pt_field "$tmp/pt_$best" params)" \
    "$(pt_field "$tmp/pt_$best" rss_mb)"
done
