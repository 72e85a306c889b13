#!/usr/bin/env bash
# ZeRO-3 / FSDP on the data-parallel dimension of a pipeline
# (parallel.strategy zero3 or fsdp with parallel.pp), dp 2 x pp 2, the GPT
# of test_pipe_zero.sh (3 blocks, the output layer tied to the embedding)
# with accumulation, 2 micro-batches, clipping and an evaluation every 5
# steps, 20 steps. Each replica keeps its cut of the stage's parameters
# between steps and gathers the stage whole at the start of the next one
# (and for evaluation), so the arithmetic is zero2's:
# - zero3 (1f1b, gpipe) and fsdp: the bits of zero2 on the same mesh, every
#   step's loss and every validation loss; within 1e-5 of one rank; bf16
#   with zero2's bits;
# - mem_params_mb about half of zero2's between steps, mem_params_peak_mb
#   zero2's (the stage whole for the step);
# - stopped at step 7 and resumed under zero3 and ddp (the bits of the
#   straight run) and on one rank (within 1e-5); ddp stopped at step 7
#   resumed under zero3 with the bits;
# - a rank killed at step 7 is restarted by loom run --max-restarts and
#   ends with the bits of the uninterrupted run;
# - dp 2 x tp 2 x pp 2 zero3: the bits of zero2 on that mesh, less
#   parameter memory, and stopped at step 7 and resumed with its bits;
#   fsdp with sequence parallelism there: zero2's bits;
# - loom estimate's zero3 rows: zero2's; parallel.shard_unit other than
#   blocks refused with a pipeline at loom config check.
. "$(dirname "$0")/pipe_lib.sh"
cfg+=(--set train.eval_every=5)
samev() { # RUN REF WHAT: same, and the same validation losses
  same "$@"
  [ -n "$(val_losses "$2")" ] && [ "$(val_losses "$1")" = "$(val_losses "$2")" ] ||
    bad "$3: validation losses '$(val_losses "$1")' against '$(val_losses "$2")'"
}

one one --resume never
pz z2 zero2 --resume never
pz z3 zero3 --resume never
pz z3g zero3 --resume never --set parallel.pp_schedule=gpipe
pz fs fsdp --resume never
samev "$tmp/z3" "$tmp/z2" "dp 2 x pp 2 zero3, 1f1b, clipped, evaluated"
samev "$tmp/z3g" "$tmp/z2" "dp 2 x pp 2 zero3, gpipe"
samev "$tmp/fs" "$tmp/z2" "dp 2 x pp 2 fsdp"
close "$tmp/z3" "dp 2 x pp 2 zero3"
python3 - "$tmp/z2/metrics.jsonl" "$tmp/z3/metrics.jsonl" <<'PY' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert 0.4 < z["mem_params_mb"] / d["mem_params_mb"] < 0.6, (z["mem_params_mb"], d["mem_params_mb"])
assert z["mem_params_peak_mb"] == d["mem_params_mb"], (z, d)
assert z["mem_grads_mb"] == d["mem_grads_mb"] and z["mem_optim_mb"] == d["mem_optim_mb"], (z, d)
print("rank 0, MiB: parameters kept %.4f under zero3 (peak %.4f), %.4f under zero2; "
      "gradient %.4f, optimizer %.4f both" % (z["mem_params_mb"], z["mem_params_peak_mb"],
      d["mem_params_mb"], z["mem_grads_mb"], z["mem_optim_mb"]))
PY
  ok "zero3 with pp: half the parameters kept between steps, the stage whole at the peak" ||
  bad "zero3 with pp: memory"
grep -q '"strategy":.*"zero3+pipeline"' "$tmp/fs/env.json" &&
  ok "run info: zero3+pipeline" || bad "run info: $(grep strategy "$tmp/fs/env.json")"

# -- bf16: zero2's bits (the half copy made after the gather)
pz z2_bf16 zero2 --resume never --set train.precision=bf16
pz z3_bf16 zero3 --resume never --set train.precision=bf16
samev "$tmp/z3_bf16" "$tmp/z2_bf16" "dp 2 x pp 2 zero3, bf16"

# -- resume across strategies and meshes: the checkpoint is canonical
pz rs_z3 zero3 --resume never --stop-at 7
for s in zero3 ddp; do
  cp -a "$tmp/rs_z3" "$tmp/rs_z3_$s"
  pz "rs_z3_$s" $s --resume auto
  same "$tmp/rs_z3_$s" "$tmp/z3" "zero3 stopped at step 7, resumed under $s"
done
cp -a "$tmp/rs_z3" "$tmp/rs_z3_1"
one rs_z3_1 --resume auto
close "$tmp/rs_z3_1" "zero3 at dp 2 x pp 2 stopped at step 7, resumed on one rank"
pz rs_ddp_z3 ddp --resume never --stop-at 7
pz rs_ddp_z3 zero3 --resume auto
same "$tmp/rs_ddp_z3" "$tmp/z3" "ddp stopped at step 7, resumed under zero3"

# -- a rank killed after step 7: restarted, resumed from step 5
pz whole zero3 --resume never --set checkpoint.every=5
LOOM_FAULT=2:7:exit:9 "$LOOM" run -n 4 --timeout 120 --max-restarts 1 \
  "$LOOM" train "${cfg[@]}" "${mesh[@]}" --resume auto \
  --set "log.run_dir=$tmp/killed" --set checkpoint.every=5 \
  --set parallel.strategy=zero3 >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "restart" "$tmp/out" || { bad "killed under zero3 (rc $rc)"; cat "$tmp/out"; }
same "$tmp/killed" "$tmp/whole" "zero3 with pp, rank 2 killed at step 7, restarted"

# -- dp 2 x tp 2 x pp 2: each replica keeps its cut of its tp part of the
#    stage's range (a save puts the slice together from the whole part)
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume never \
  --set parallel.strategy=zero2 --set "log.run_dir=$tmp/t_z2"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero2 (rc $rc)"; cat "$tmp/out"; }
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume never \
  --set parallel.strategy=zero3 --set "log.run_dir=$tmp/t_z3" --set checkpoint.every=5
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero3 (rc $rc)"; cat "$tmp/out"; }
samev "$tmp/t_z3" "$tmp/t_z2" "dp 2 x tp 2 x pp 2 zero3, saved every 5 steps"
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume never \
  --set parallel.strategy=zero3 --set "log.run_dir=$tmp/t_rs" --stop-at 7
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" --resume auto \
  --set parallel.strategy=zero3 --set "log.run_dir=$tmp/t_rs"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero3 resumed (rc $rc)"; cat "$tmp/out"; }
same "$tmp/t_rs" "$tmp/t_z2" "dp 2 x tp 2 x pp 2 zero3 stopped at step 7, resumed"
# and with sequence parallelism (fsdp): zero2's bits
sp=(--set parallel.sequence_parallel=true --set model.context=32)
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" "${sp[@]}" --resume never \
  --set parallel.strategy=zero2 --set "log.run_dir=$tmp/s_z2"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero2 sp (rc $rc)"; cat "$tmp/out"; }
run 8 train "${cfg[@]}" "${mesh[@]}" "${tp[@]}" "${sp[@]}" --resume never \
  --set parallel.strategy=fsdp --set "log.run_dir=$tmp/s_fs"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 fsdp sp (rc $rc)"; cat "$tmp/out"; }
samev "$tmp/s_fs" "$tmp/s_z2" "dp 2 x tp 2 x pp 2 fsdp with sequence parallelism"
python3 - "$tmp/t_z2/metrics.jsonl" "$tmp/t_z3/metrics.jsonl" <<'PY' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert z["mem_params_mb"] < 0.75 * d["mem_params_mb"], (z["mem_params_mb"], d["mem_params_mb"])
PY
  ok "dp 2 x tp 2 x pp 2 zero3: less parameter memory kept than zero2" ||
  bad "dp 2 x tp 2 x pp 2 zero3: parameter memory"

# -- loom estimate: zero3's rows are zero2's (the peaks; the bytes sent);
#    config check: the units of a gather are the stage's whole
for s in zero2 zero3; do
  "$LOOM" estimate "${cfg[@]:0:5}" "${mesh[@]}" -n 4 --strategy $s \
    --set model.d_model=256 >"$tmp/est_$s" 2>&1 || { bad "loom estimate --strategy $s"; cat "$tmp/est_$s"; }
done
[ -n "$(grep '^stage0' "$tmp/est_zero2")" ] &&
  [ "$(grep '^stage' "$tmp/est_zero2")" = "$(grep '^stage' "$tmp/est_zero3")" ] &&
  grep -q "between steps a rank keeps 1/2" "$tmp/est_zero3" &&
  ok "loom estimate --strategy zero3 with pp 2: zero2's rows, 1/2 kept between steps" ||
  { bad "loom estimate's zero3 rows"; cat "$tmp/est_zero3"; }
"$LOOM" config check "${cfg[@]:0:5}" "${mesh[@]}" --set parallel.strategy=fsdp >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && ok "config check pp 2 fsdp: rc 0" || { bad "config check pp 2 fsdp: rc $rc"; cat "$tmp/out"; }
"$LOOM" config check "${cfg[@]:0:5}" "${mesh[@]}" --set parallel.strategy=zero3 \
  --set parallel.shard_unit=every:2 >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -qF "supports blocks (the default) only" "$tmp/out" &&
  ok "config check pp 2 zero3 shard_unit every:2: rc 2" ||
  { bad "config check pp 2 shard_unit: rc $rc"; cat "$tmp/out"; }
finish parallel_pipe_zero3
