#!/usr/bin/env bash
# ZeRO-2 on the data-parallel dimension of a pipeline (parallel.strategy
# zero2 with parallel.pp), dp 2 x pp 2, the GPT of test_pipe.sh (3 blocks,
# the output layer tied to the embedding) with accumulation, 2
# micro-batches and clipping, 20 steps:
# - 1f1b and gpipe: the bits of ddp on the same mesh (the cuts begin at
#   whole chunks of the norm's sum, so even the clipped norm is ddp's),
#   every step's loss and the parameters within 1e-5 of one rank; bf16
#   with ddp's bits, an f16 inf in one replica's cut skipping the step
#   everywhere;
# - after the reduce a rank keeps the gradient of its cut only
#   (mem_grads_mb below ddp's, mem_grads_peak_mb ddp's: the stage's
#   gradient still accumulates whole) and half the optimizer state;
# - stopped at step 7 and resumed under zero2, ddp and zero1 at dp 2 x
#   pp 2 (the bits of the straight run) and on one rank (within 1e-5 of
#   the one-rank run); ddp, zero1 and one-rank runs stopped at step 7
#   resumed under zero2 the same ways;
# - a rank killed at step 7 is restarted by loom run --max-restarts and
#   ends with the bits of the uninterrupted run;
# - dp 2 x tp 2 x pp 2 zero2: the bits of ddp on that mesh, less
#   gradient memory, and stopped at step 7 and resumed with its bits;
# - loom estimate's zero2 rows: zero1's optimizer state, ddp's bytes sent
#   (zero3 and fsdp with a pipeline: test_pipe_zero3.sh).
. "$(dirname "$0")/pipe_lib.sh"

one one --resume never
pz ddp ddp --resume never
pz z2 zero2 --resume never
pz z2g zero2 --resume never --set parallel.pp_schedule=gpipe
same "$tmp/z2" "$tmp/ddp" "dp 2 x pp 2 zero2, 1f1b, clipped"
same "$tmp/z2g" "$tmp/ddp" "dp 2 x pp 2 zero2, gpipe, clipped"
close "$tmp/z2" "dp 2 x pp 2 zero2"
python3 - "$tmp/ddp/metrics.jsonl" "$tmp/z2/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert z["mem_grads_mb"] < 0.75 * d["mem_grads_mb"], (z["mem_grads_mb"], d["mem_grads_mb"])
assert z["mem_grads_peak_mb"] == d["mem_grads_peak_mb"], (z, d)
assert 0.45 < z["mem_optim_mb"] / d["mem_optim_mb"] < 0.55, (z, d)
assert z["mem_params_mb"] == d["mem_params_mb"], (z, d)
print("rank 0, MiB: gradient kept %.4f under zero2, %.4f under ddp (peak %.4f); "
      "optimizer %.4f, %.4f" % (z["mem_grads_mb"], d["mem_grads_mb"],
      z["mem_grads_peak_mb"], z["mem_optim_mb"], d["mem_optim_mb"]))
EOF
  ok "zero2 with pp: the gradient of the cut kept, half the optimizer state" ||
  bad "zero2 with pp: memory"
grep -q '"strategy":.*"zero2+pipeline"' "$tmp/z2/env.json" &&
  ok "run info: zero2+pipeline" || bad "run info: $(grep strategy "$tmp/z2/env.json")"

# -- bf16: ddp's bits; f16 with an inf injected into replica 1's cut of
#    stage 1's gradient at step 5: every rank skips that step
pz ddp_bf16 ddp --resume never --set train.precision=bf16
pz z2_bf16 zero2 --resume never --set train.precision=bf16
same "$tmp/z2_bf16" "$tmp/ddp_bf16" "dp 2 x pp 2 zero2, bf16"
LOOM_FAULT=3:5:grad_inf pz z2_f16 zero2 --resume never --set train.precision=f16
python3 - "$tmp/z2_f16/metrics.jsonl" <<'EOF' && ok "zero2 with pp, f16: an inf in rank 3's cut skips step 5 on rank 0 too" || bad "zero2 with pp, f16: no skip seen on rank 0"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"skipped_steps"' in l]
assert r[-1]["skipped_steps"] == 1, r[-1]
EOF

# -- resume across strategies and meshes: the checkpoint is canonical
pz rs_z2 zero2 --resume never --stop-at 7
for s in zero2 ddp zero1; do
  cp -a "$tmp/rs_z2" "$tmp/rs_z2_$s"
  pz "rs_z2_$s" $s --resume auto
  same "$tmp/rs_z2_$s" "$tmp/z2" "zero2 stopped at step 7, resumed under $s"
done
cp -a "$tmp/rs_z2" "$tmp/rs_z2_1"
one rs_z2_1 --resume auto
close "$tmp/rs_z2_1" "zero2 at dp 2 x pp 2 stopped at step 7, resumed on one rank"
for s in ddp zero1; do
  pz "rs_${s}_z2" $s --resume never --stop-at 7
  pz "rs_${s}_z2" zero2 --resume auto
  same "$tmp/rs_${s}_z2" "$tmp/z2" "$s stopped at step 7, resumed under zero2"
done
one rs_1_z2 --resume never --stop-at 7
pz rs_1_z2 zero2 --resume auto
close "$tmp/rs_1_z2" "one rank stopped at step 7, resumed under zero2 at dp 2 x pp 2"

# -- a rank killed after step 7: restarted, resumed from step 5
pz whole zero2 --resume never --set checkpoint.every=5
LOOM_FAULT=1:7:exit:9 "$LOOM" run -n 4 --timeout 120 --max-restarts 1 \
  "$LOOM" train "${cfg[@]}" "${mesh[@]}" --resume auto \
  --set "log.run_dir=$tmp/killed" --set checkpoint.every=5 \
  --set parallel.strategy=zero2 >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "restart" "$tmp/out" || { bad "killed under zero2 (rc $rc)"; cat "$tmp/out"; }
same "$tmp/killed" "$tmp/whole" "zero2 with pp, rank 1 killed at step 7, restarted"

# -- dp 2 x tp 2 x pp 2: each replica keeps the gradient of its cut of its
#    tp part of the stage's range
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume never --set "log.run_dir=$tmp/t_ddp"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 ddp (rc $rc)"; cat "$tmp/out"; }
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume never \
  --set parallel.strategy=zero2 --set "log.run_dir=$tmp/t_z2"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero2 (rc $rc)"; cat "$tmp/out"; }
same "$tmp/t_z2" "$tmp/t_ddp" "dp 2 x tp 2 x pp 2 zero2, clipped"
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume never \
  --set parallel.strategy=zero2 --set "log.run_dir=$tmp/t_rs" --stop-at 7
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume auto \
  --set parallel.strategy=zero2 --set "log.run_dir=$tmp/t_rs"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero2 resumed (rc $rc)"; cat "$tmp/out"; }
same "$tmp/t_rs" "$tmp/t_z2" "dp 2 x tp 2 x pp 2 zero2 stopped at step 7, resumed"
python3 - "$tmp/t_ddp/metrics.jsonl" "$tmp/t_z2/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert z["mem_grads_mb"] < 0.75 * d["mem_grads_mb"], (z["mem_grads_mb"], d["mem_grads_mb"])
EOF
  ok "dp 2 x tp 2 x pp 2 zero2: less gradient kept than ddp" ||
  bad "dp 2 x tp 2 x pp 2 zero2: gradient memory"

# -- loom estimate: zero2's rows hold zero1's optimizer state and send
#    ddp's bytes (a reduce-scatter and the gather, not an all-reduce and
#    the gather)
for s in ddp zero1 zero2; do
  "$LOOM" estimate "${cfg[@]:0:5}" "${mesh[@]}" -n 4 --strategy $s \
    --set model.d_model=256 >"$tmp/est_$s" 2>&1 || { bad "loom estimate --strategy $s"; cat "$tmp/est_$s"; }
done
stage0() { awk '$1 == "stage0" { print $'"$2"' }' "$tmp/est_$1"; }
awk -v o1="$(stage0 zero1 5)" -v o2="$(stage0 zero2 5)" -v s0="$(stage0 ddp 11)" \
  -v s1="$(stage0 zero1 11)" -v s2="$(stage0 zero2 11)" \
  'BEGIN { exit !(o1 > 0 && o1 == o2 && s2 == s0 && s1 > s2) }' &&
  ok "loom estimate, stage 0: zero2 $(stage0 zero2 5) MiB of optimizer (zero1 $(stage0 zero1 5)), sends $(stage0 zero2 11) (ddp $(stage0 ddp 11), zero1 $(stage0 zero1 11))" ||
  { bad "loom estimate's zero2 rows"; cat "$tmp/est_zero2"; }

finish parallel_pipe_zero
