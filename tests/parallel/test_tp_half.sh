#!/usr/bin/env bash
# bf16 and f16 with tensor parallelism (train.precision with parallel.tp),
# the GPT of test_tp.sh:
# - one SGD step, tp 2 against one rank, both in bf16 and in f16: the
#   parameters within 5% of the distance between that precision and f32
#   (measured 2%): a wrong operand anywhere (a head, a weight's half copy,
#   a reduction) is a difference of the order of that distance or more.
# - 20 AdamW steps with accumulation and clipping: tp 2 (bf16 and f16),
#   tp 2 x pp 2 (bf16), dp 2 x tp 2 zero1 and zero2 (f16) against one rank
#   in the same precision with the same global batch: every step's loss
#   within 1e-4 (measured ~1e-5), the parameters within 5e-3 and within
#   1.5 times the precision's distance from f32. Not closer: the
#   row-parallel layers sum the ranks' f32 partial products in another
#   order, and a last-bit difference that reaches one of the half
#   roundings (linear inputs, attention's Q, K, V, P, dO, dS) becomes a
#   unit of the half format there (2^-8 or 2^-11); over 20 steps the
#   runs drift apart as two runs in that precision with other rounding
#   noise (AdamW's normalised steps amplify it for parameters whose
#   gradients are near zero).
# - f16: an inf in one tp rank's gradient at step 5 skips the step on
#   every rank and halves the scale (the same weights whichever rank held
#   it), with and without clipping; stopped at step 7 and resumed, the bits and scales of the straight
#   run.
# - the log names the path; the rank's half copy is its part of the model.
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: test_tp_half.sh DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
seeded_text "$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
  --set model.layers=3 --set model.heads=4 --set train.batch_size=8
  --set train.accumulate=2 --set optim.grad_clip=0.5 --set train.steps=20
  --set log.every=1 --set checkpoint.every=0 --set log.progress=off)
one() { # PRECISION: the one-rank reference
  run 1 train "${cfg[@]}" --quiet --resume never --set train.precision="$1" \
    --set "log.run_dir=$tmp/one_$1"
  [ $rc = 0 ] || { bad "one rank, $1 (rc $rc)"; cat "$tmp/out"; }
}
# RUN PRECISION WHAT: against one rank in PRECISION
near_one() {
  local d f l
  d=$("$HASH" --diff "$tmp/one_$2/ckpt" "$1/ckpt")
  f=$("$HASH" --diff "$tmp/one_f32/ckpt" "$tmp/one_$2/ckpt")
  l=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
      if a and len(a) == len(b) else "none")' "$(loss_steps "$tmp/one_$2")" "$(loss_steps "$1")")
  awk -v d="$d" -v f="$f" -v l="$l" 'BEGIN { exit !(d != "" && d + 0 <= 5e-3 && d + 0 <= 1.5 * f && l != "none" && l + 0 <= 1e-4) }' &&
    ok "$3: parameters within $d of one rank in $2 ($2 to f32: $f), losses within $l" ||
    bad "$3: parameters differ by '$d' ($2 to f32: '$f'), losses by '$l'"
}
# -- one SGD step
sgd=(--set train.steps=1 --set optim.name=sgd --set optim.lr=0.3 --set optim.momentum=0)
run 1 train "${cfg[@]}" "${sgd[@]}" --quiet --resume never --set "log.run_dir=$tmp/s_f32"
for p in bf16 f16; do
  run 1 train "${cfg[@]}" "${sgd[@]}" --quiet --resume never --set train.precision=$p \
    --set "log.run_dir=$tmp/s1_$p"
  run 2 train "${cfg[@]}" "${sgd[@]}" --quiet --resume never --set train.precision=$p \
    --set parallel.tp=2 --set "log.run_dir=$tmp/s2_$p"
  d=$("$HASH" --diff "$tmp/s1_$p/ckpt" "$tmp/s2_$p/ckpt")
  f=$("$HASH" --diff "$tmp/s_f32/ckpt" "$tmp/s1_$p/ckpt")
  awk -v d="$d" -v f="$f" 'BEGIN { exit !(d != "" && f + 0 > 0 && d + 0 <= 0.05 * f) }' &&
    ok "one SGD step, tp 2 in $p: parameters within $d of one rank ($p to f32: $f)" ||
    bad "one SGD step, tp 2 in $p: '$d' from one rank ($p to f32: '$f')"
done

for p in f32 bf16 f16; do one $p; done

LOOM_LOG=info run 2 train "${cfg[@]}" --resume never --set train.precision=bf16 \
  --set parallel.tp=2 --set "log.run_dir=$tmp/tp_bf16"
[ $rc = 0 ] || { bad "tp 2 bf16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/tp_bf16" bf16 "tp 2, bf16"
grep -q "bf16: .*master weights, optimizer and reductions f32" "$tmp/out" &&
  ok "the log names the bf16 path: $(grep -o 'bf16: [^;]*' "$tmp/out" | head -1)" ||
  bad "no bf16 line in the log"
python3 - "$tmp/one_bf16/metrics.jsonl" "$tmp/tp_bf16/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
a, b = (last(p) for p in sys.argv[1:])
ratio = b["mem_params_mb"] / a["mem_params_mb"]
assert 0.4 < ratio <= 0.55, ratio
print("parameters and their bf16 copy a rank: %.4f of %.4f MiB (%.3f)" % (b["mem_params_mb"], a["mem_params_mb"], ratio))
EOF
  ok "tp 2 bf16: a rank's parameters and half copy at most 0.55 x one rank's" ||
  bad "tp 2 bf16: parameter memory"
run 2 train "${cfg[@]}" --quiet --resume never --set train.precision=f16 \
  --set parallel.tp=2 --set "log.run_dir=$tmp/tp_f16"
[ $rc = 0 ] || { bad "tp 2 f16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/tp_f16" f16 "tp 2, f16 (dynamic loss scaling)"
run 4 train "${cfg[@]}" --quiet --resume never --set train.precision=bf16 \
  --set parallel.tp=2 --set parallel.pp=2 --set parallel.micro_batches=4 \
  --set "log.run_dir=$tmp/tpp_bf16"
[ $rc = 0 ] || { bad "tp 2 x pp 2 bf16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/tpp_bf16" bf16 "tp 2 x pp 2 (1f1b, 4 micro-batches), bf16"
run 4 train "${cfg[@]}" --quiet --resume never --set train.precision=f16 \
  --set parallel.tp=2 --set train.batch_size=4 --set parallel.strategy=zero1 \
  --set "log.run_dir=$tmp/dtz_f16"
[ $rc = 0 ] || { bad "dp 2 x tp 2 zero1 f16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/dtz_f16" f16 "dp 2 x tp 2 zero1, f16"
run 4 train "${cfg[@]}" --quiet --resume never --set train.precision=f16 \
  --set parallel.tp=2 --set train.batch_size=4 --set parallel.strategy=zero2 \
  --set "log.run_dir=$tmp/dtz2_f16"
[ $rc = 0 ] || { bad "dp 2 x tp 2 zero2 f16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/dtz2_f16" f16 "dp 2 x tp 2 zero2 (the cut unscaled), f16"

# -- f16: an inf in one tp rank's gradient (each holds a different part),
#    with clipping (the norm's path) and without (the plain step's)
for clip in 0.5 0; do
  f=("${cfg[@]}" --quiet --resume never --set train.precision=f16 --set parallel.tp=2
    --set train.steps=8 --set optim.grad_clip=$clip)
  LOOM_FAULT=0:5:grad_inf run 2 train "${f[@]}" --set "log.run_dir=$tmp/inf0_$clip"
  a=$("$HASH" "$tmp/inf0_$clip/ckpt")
  s0=$(scales "$tmp/inf0_$clip")
  LOOM_FAULT=1:5:grad_inf run 2 train "${f[@]}" --set "log.run_dir=$tmp/inf1_$clip"
  b=$("$HASH" "$tmp/inf1_$clip/ckpt")
  s1=$(scales "$tmp/inf1_$clip")
  run 2 train "${f[@]}" --set "log.run_dir=$tmp/inf_none_$clip"
  c=$("$HASH" "$tmp/inf_none_$clip/ckpt")
  case " $s1 " in
  *" 5:32768:1 "*) ok "tp 2 f16, grad_clip $clip: rank 1's inf at step 5 skips the step and halves the scale (rank 0's metrics)" ;;
  *) bad "tp 2 f16, grad_clip $clip: rank 0 did not skip rank 1's overflow: $s1" ;;
  esac
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && [ "$s0" = "$s1" ] &&
    ok "tp 2 f16, grad_clip $clip: the same weights whichever rank overflowed, other than without" ||
    bad "tp 2 f16, grad_clip $clip: rank 0 inf '$a', rank 1 inf '$b', none '$c'"
done

# -- f16 resume: the scaler's state is in the checkpoint
r=("${cfg[@]}" --quiet --set train.precision=f16 --set parallel.tp=2
  --set train.loss_scale_init=8388608 --set train.loss_scale_growth_interval=3
  --set train.steps=12)
run 2 train "${r[@]}" --resume never --set "log.run_dir=$tmp/straight"
run 2 train "${r[@]}" --resume never --set "log.run_dir=$tmp/resumed" --stop-at 7
run 2 train "${r[@]}" --resume auto --set "log.run_dir=$tmp/resumed"
a=$("$HASH" "$tmp/straight/ckpt")
b=$("$HASH" "$tmp/resumed/ckpt")
[ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(scales "$tmp/straight")" = "$(scales "$tmp/resumed")" ] &&
  ok "tp 2 f16 stopped at step 7 and resumed: the bits and scales of the straight run ($(scales "$tmp/straight" | wc -w) steps)" ||
  bad "tp 2 f16 resume: '$b' vs '$a'; $(scales "$tmp/resumed") vs $(scales "$tmp/straight")"
finish parallel_tp_half
