#!/usr/bin/env bash
# train.precision bf16 (or PRECISION: f16, with its default dynamic loss
# scaling) on real data (Fashion-MNIST): MODEL (fashion_mlp or fashion_cnn)
# trained STEPS steps of batch 128 reaches at least MIN% test accuracy; the
# log names the path. Registered three times (tests/loop/CMakeLists):
# - fashion_mlp 300 82: f32 reaches 84.2% there and bf16 84.2%;
# - fashion_cnn 60 75 (its convolutions in bf16): f32 77.3%, bf16 77.2%
#   (19-28 s wall at load 13 on 2 cores);
# - fashion_mlp 300 82 f16: f16 84.3%, no step skipped.
# (AMD EPYC, seed 1234.) The thresholds leave room for the rounding's drift,
# not for a broken path (a layer reading wrong weights or a stale bf16 copy
# stays far below).
. "$(dirname "$0")/../lib.sh"
model=${1:?model} steps=${2:?steps} min=${3:?threshold} prec=${4:-bf16}
export LOOM_LOG=info
"$LOOM" train "$SRC/examples/$model.yaml" --resume never \
  --set train.precision="$prec" --set train.epochs=0 --set train.steps="$steps" \
  --set train.eval_every=0 --set checkpoint.enabled=false \
  --set log.progress=off --set "log.run_dir=$tmp/run" >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && ok "$model $prec trains" || { bad "rc $rc"; cat "$tmp/out"; }
grep -Eq "$prec: .*($prec storage|oneDNN matmul)" "$tmp/out" && ok "the log names the path" ||
  bad "no '$prec:' line in the log"
if [ "$prec" = f16 ]; then
  grep -q "loss scaling: dynamic from 65536" "$tmp/out" &&
    ok "f16 scales the loss dynamically" || bad "no loss scaling line"
fi
acc=$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$tmp/out")
python3 -c "import sys; sys.exit(0 if float('${acc:-0}') >= $min else 1)" &&
  ok "test accuracy $acc% >= $min%" || bad "test accuracy '$acc' below $min%"
finish "${prec}_quality $model"
