#!/usr/bin/env bash
# train.precision bf16 under `loom run`: deterministic mode gives the same
# bits (weights, losses) on 1, 2 and 4 ranks for the MLP, a CNN and a GPT,
# under ddp and zero3, as in f32 (test_ddp_train.sh), and not f32's bits; a bf16 run stopped at a
# checkpoint and resumed ends with the weights of the run that did not stop
# (the f32 master weights are what is saved; the bf16 copy is made again).
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: test_bf16_train.sh DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}

# a text of its own (tests/lib.sh): a docs edit must not move the
# comparisons below
seeded_text "$tmp/text.txt" 260000
det=(--resume never --set parallel.deterministic=true
  --set parallel.virtual_shards=4 --set train.accumulate=2
  --set log.every=1 --set log.progress=off --set train.precision=bf16)
for model in mlp cnn gpt; do
  if [ $model = mlp ]; then
    cfg=("$SRC/examples/small_mlp.yaml" --set train.batch_size=4
      --set train.steps=12 --set train.eval_every=6)
  elif [ $model = cnn ]; then
    cfg=("$SRC/examples/small_cnn.yaml" --set train.batch_size=4
      --set train.steps=12 --set train.eval_every=6)
  else
    cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
      --set train.batch_size=2 --set train.steps=8 --set optim.grad_clip=0.5
      --set train.eval_every=4 --set checkpoint.every=4)
  fi
  ref=""
  h1=""
  # ZeRO-3 too: its half copy is made unit by unit as the units arrive
  for ns in "1 ddp" "2 ddp" "4 ddp" "2 zero3" "4 zero3"; do
    set -- $ns
    n=$1 st=$2
    run $n train "${cfg[@]}" "${det[@]}" --set parallel.strategy=$st \
      --set "log.run_dir=$tmp/det_${model}_${n}_$st"
    if [ $rc != 0 ]; then
      bad "bf16 deterministic $model on $n ranks, $st (rc $rc)"
      cat "$tmp/out"
      continue
    fi
    h=$("$HASH" "$tmp/det_${model}_${n}_$st/ckpt")
    l=$(grep -o '"\(loss\|accuracy\|val_loss\|val_accuracy\|grad_norm\)":[^,}]*' \
      "$tmp/det_${model}_${n}_$st/metrics.jsonl" | md5sum)
    if [ -z "$ref" ]; then
      ref="$h $l"
      h1=$h
      ok "bf16 deterministic $model, 1 rank: params $h"
    elif [ "$h $l" = "$ref" ]; then
      ok "bf16 deterministic $model, $n ranks, $st: same params and losses as 1 rank"
    else
      bad "bf16 deterministic $model, $n ranks, $st: '$h $l' vs 1 rank '$ref'"
    fi
  done
  # the same run in f32 ends elsewhere: bf16 did run
  run 1 train "${cfg[@]}" "${det[@]}" --set train.precision=f32 \
    --set "log.run_dir=$tmp/f32_${model}"
  h32=$("$HASH" "$tmp/f32_${model}/ckpt")
  [ $rc = 0 ] && [ -n "$h1" ] && [ "$h32" != "$h1" ] &&
    ok "$model: f32 ends with other weights than bf16" ||
    bad "$model: f32 run (rc $rc) has bf16's weights $h32"
done

# -- resume: 8 steps straight, and 4 + 4 from the step-4 checkpoint.
common=("$SRC/examples/small_mlp.yaml" --set train.precision=bf16
  --set train.batch_size=8 --set checkpoint.every=4 --set train.eval_every=0
  --set log.progress=off --set log.every=1)
"$LOOM" train "${common[@]}" --resume never --set train.steps=8 \
  --set "log.run_dir=$tmp/straight" >"$tmp/out" 2>&1 || bad "straight run"
"$LOOM" train "${common[@]}" --resume never --set train.steps=4 \
  --set "log.run_dir=$tmp/resumed" >"$tmp/out" 2>&1 || bad "first half"
"$LOOM" train "${common[@]}" --set train.steps=8 \
  --set "log.run_dir=$tmp/resumed" >"$tmp/out" 2>&1 || bad "second half"
a=$("$HASH" "$tmp/straight/ckpt")
b=$("$HASH" "$tmp/resumed/ckpt")
[ -n "$a" ] && [ "$a" = "$b" ] &&
  ok "bf16 resumed at step 4: the weights of the straight run ($a)" ||
  bad "bf16 resume: $b vs straight $a"
[ "$(loss_steps "$tmp/straight")" = "$(loss_steps "$tmp/resumed")" ] &&
  ok "bf16 resumed: the same losses step by step" ||
  bad "bf16 resumed losses differ"
finish bf16_train
