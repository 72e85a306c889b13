#!/usr/bin/env bash
# ZeRO-3 (FSDP) over the replicas of a tensor-parallel mesh
# (parallel.strategy zero3 or fsdp with parallel.tp), dp 2 x tp 2, the GPT
# of test_tp_zero.sh with accumulation and clipping, 20 steps:
# - the bits of zero2 on the same mesh (the same cuts: the same reduced
#   gradients, the same norm summed from the cuts) and fsdp's the same;
#   within 1e-6 of ddp with clipping (the norm's double sums in another
#   order can move its last float bit; measured 0), and ddp's bits without
#   clipping (a reduce-scatter of two adds what the all-reduce adds);
#   bf16 and f16 (loss scaling) with the bits of zero2 in that precision;
#   ddp's validation losses (3 batches at step 10 over 2 replicas: one
#   runs the last batch again for the gathers; the whole split at the end);
# - within 1e-5 of one rank (parameters, losses, validation loss);
# - memory a rank (metrics.jsonl): half of ddp's optimizer state, less
#   gradient memory, the parameters resident between steps about half of
#   ddp's, at their peak the cut and the two units gathered at once;
# - stopped at step 7 and resumed: under zero3 (the bits), under ddp and a
#   zero1 run resumed under zero3 (the bits of ddp without clipping), on one
#   rank and a one-rank run resumed at dp 2 x tp 2 (within 1e-5);
# - a rank killed at step 7 is restarted by loom run --max-restarts and
#   ends with the bits of the uninterrupted run;
# - tp 2 on 2 ranks (one replica): ddp's bits; a short last batch that
#   leaves a replica without rows: ddp's bits;
# - loom estimate's zero3 row: half the optimizer, the cut and two units of
#   parameters, the reduce-scatter and two gathers a pass sent.
. "$(dirname "$0")/tp_lib.sh"
# 3 batches in the periodic evaluation: one replica runs the last again
cfg=("${cfg[@]}" --set train.batch_size=4 --set train.eval_batches=3)
vals() { # RUN: every validation loss
  python3 -c 'import json, sys
print(" ".join(repr(json.loads(l)["val_loss"]) for l in open(sys.argv[1] + "/metrics.jsonl") if "val_loss" in l))' "$1"
}
within() { # RUN REF TOL WHAT: parameters within TOL (relative)
  local d
  d=$("$HASH" --diff "$2/ckpt" "$1/ckpt")
  awk -v d="$d" -v t="$3" 'BEGIN { exit !(d != "" && d + 0 <= t + 0) }' &&
    ok "$4: parameters within $d of $(basename "$2")" ||
    bad "$4: parameters differ from $(basename "$2") by '$d'"
}
nc=(--set optim.grad_clip=0)

tp_mesh ddp ddp --resume never
tp_mesh z2 zero2 --resume never
tp_mesh z3 zero3 --resume never
tp_mesh fsdp fsdp --resume never
same "$tmp/z3" "$tmp/z2" "dp 2 x tp 2 zero3 with clipping"
same "$tmp/fsdp" "$tmp/z3" "dp 2 x tp 2 fsdp"
within "$tmp/z3" "$tmp/ddp" 1e-6 "dp 2 x tp 2 zero3 with clipping against ddp"
v=$(vals "$tmp/z3")
[ "${v// /}" != "" ] && [ "$(echo "$v" | wc -w)" = 2 ] && [ "$v" = "$(vals "$tmp/ddp")" ] &&
  ok "zero3: ddp's validation losses ($v)" ||
  bad "zero3: validation losses '$v', ddp '$(vals "$tmp/ddp")'"
grep -q '"strategy":.*"zero3+tensor"' "$tmp/z3/env.json" &&
  ok "env.json: strategy zero3+tensor" || bad "env.json: $(grep strategy "$tmp/z3/env.json")"
tp_mesh nc_ddp ddp --resume never "${nc[@]}"
tp_mesh nc_z3 zero3 --resume never "${nc[@]}"
same "$tmp/nc_z3" "$tmp/nc_ddp" "dp 2 x tp 2 zero3 without clipping"

# -- one rank, the same global batch
run 1 train "${cfg[@]}" --set train.batch_size=8 --resume never --set "log.run_dir=$tmp/ref"
[ $rc = 0 ] || { bad "the one-rank run (rc $rc)"; cat "$tmp/out"; }
close "$tmp/z3" "dp 2 x tp 2 zero3"

# -- memory a rank: the last step's mem_* (a larger model, so that pages
#    do not decide)
big=(--set model.d_model=64 --set model.layers=6 --set train.steps=2 --set train.eval_every=0)
tp_mesh m_ddp ddp --resume never "${big[@]}"
tp_mesh m_z3 zero3 --resume never "${big[@]}"
python3 - "$tmp/m_ddp/metrics.jsonl" "$tmp/m_z3/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert 0.49 < z["mem_optim_mb"] / d["mem_optim_mb"] < 0.51, (z, d)
assert z["mem_grads_mb"] < 0.75 * d["mem_grads_mb"], (z, d)
assert z["mem_params_mb"] < 0.55 * d["mem_params_mb"], (z, d)
# the cut and at most the two largest units (a block: 12 d^2 / tp + ...)
assert z["mem_params_peak_mb"] < 0.85 * d["mem_params_mb"], (z, d)
print("a rank, MiB: params %.4f (peak %.4f), grads %.4f, optimizer %.4f under "
      "zero3; %.4f, %.4f, %.4f under ddp" % (z["mem_params_mb"],
      z["mem_params_peak_mb"], z["mem_grads_mb"], z["mem_optim_mb"],
      d["mem_params_mb"], d["mem_grads_mb"], d["mem_optim_mb"]))
EOF
  ok "zero3: parameters, gradients and optimizer state a rank below ddp's" ||
  bad "zero3: memory"

# -- bf16 and f16: zero2's bits in the same precision
for p in bf16 f16; do
  tp_mesh h_z2_$p zero2 --resume never --set train.precision=$p --set train.steps=8
  tp_mesh h_z3_$p zero3 --resume never --set train.precision=$p --set train.steps=8
  same "$tmp/h_z3_$p" "$tmp/h_z2_$p" "dp 2 x tp 2 zero3 in $p"
done

# -- stopped at step 7 and resumed: the checkpoint is canonical
tp_mesh rs_z3 zero3 --resume never --stop-at 7
tp_mesh rs_z3 zero3 --resume auto
same "$tmp/rs_z3" "$tmp/z3" "zero3 stopped at step 7, resumed under zero3"
tp_mesh rs_z3d zero3 --resume never --stop-at 7 "${nc[@]}"
tp_mesh rs_z3d ddp --resume auto "${nc[@]}"
same "$tmp/rs_z3d" "$tmp/nc_ddp" "zero3 stopped at step 7, resumed under ddp"
tp_mesh rs_z1z3 zero1 --resume never --stop-at 7 "${nc[@]}"
tp_mesh rs_z1z3 zero3 --resume auto "${nc[@]}"
same "$tmp/rs_z1z3" "$tmp/nc_ddp" "zero1 stopped at step 7, resumed under zero3"
tp_mesh rs_1 zero3 --resume never --stop-at 7
run 1 train "${cfg[@]}" --set train.batch_size=8 --resume auto --set "log.run_dir=$tmp/rs_1"
[ $rc = 0 ] || { bad "zero3 -> one rank (rc $rc)"; cat "$tmp/out"; }
close "$tmp/rs_1" "zero3 at dp 2 x tp 2 stopped at step 7, resumed on one rank"
run 1 train "${cfg[@]}" --set train.batch_size=8 --resume never --set "log.run_dir=$tmp/rs_2" --stop-at 7
tp_mesh rs_2 zero3 --resume auto
close "$tmp/rs_2" "one rank stopped at step 7, resumed under zero3 at dp 2 x tp 2"

# -- a rank killed after step 7: restarted, resumed from step 5
tp_mesh_killed zero3 "$tmp/z3"

# -- one replica: zero3 over a group of one is ddp
run 2 train "${cfg[@]}" --set train.batch_size=8 --resume never --set parallel.tp=2 --set "log.run_dir=$tmp/t_ddp"
run 2 train "${cfg[@]}" --set train.batch_size=8 --resume never --set parallel.tp=2 \
  --set parallel.strategy=zero3 --set "log.run_dir=$tmp/t_z3"
[ $rc = 0 ] || { bad "tp 2 zero3, one replica (rc $rc)"; cat "$tmp/out"; }
same "$tmp/t_z3" "$tmp/t_ddp" "tp 2 on 2 ranks (one replica) zero3"

# -- a short last batch (one epoch, batch 5 a replica, accumulation 2: the
#    last micro-batch leaves replica 1 without rows; it runs its passes
#    with weight 0 for the gathers): ddp's bits
for s in ddp zero3; do
  tp_mesh tail_$s $s --resume never --set train.steps=0 --set train.epochs=1 \
    --set data.tail=partial --set train.batch_size=5 --set train.eval_every=0 \
    --set log.every=50
done
same "$tmp/tail_zero3" "$tmp/tail_ddp" "zero3, a short last batch"

# -- loom estimate: zero3 holds half the optimizer state, the cut and two
#    units of the parameters, and sends the gradient's reduce-scatter and
#    two gathers of the part a pass ((D-1)/D of each)
"$LOOM" estimate "${cfg[@]:0:13}" --set parallel.tp=2 -n 4 --set train.batch_size=64 \
  --set model.d_model=256 --set model.layers=8 >"$tmp/est" 2>&1
part=$(sed -n 's/.*(\([0-9]*\) parameters); .*/\1/p' "$tmp/est")
awk -v p="$part" '$1 == "ddp" { pd = $3; od = $5; sd = $11 } $1 == "zero3" { pz = $3; oz = $5; sz = $11 }
  END { m = p * 4 / 1048576; g = m / 2 * (1 + 2 * 2) - m;
        exit !(p > 0 && oz - od / 2 < 0.11 && od / 2 - oz < 0.11 && pz < pd &&
               pz > pd / 2 && (sz - sd) - g < 0.11 && g - (sz - sd) < 0.11) }' "$tmp/est" &&
  ok "loom estimate, dp 2 x tp 2: zero3 $(awk '$1 == "zero3" { print $3 " MiB of parameters, " $5 " of optimizer, sends " $11 }' "$tmp/est") MiB" ||
  { bad "loom estimate's zero3 row"; cat "$tmp/est"; }

# (zero3 and fsdp with tp and a pipeline: test_pipe_zero3.sh)
finish parallel_tp_zero3
