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
# - sequence parallelism (parallel.sequence_parallel) in bf16 and f16: the
#   all-gathers carry the half values the matmuls round their operands to
#   anyway (a norm's output, a row-parallel layer's output gradient), the
#   reduce-scatters f32 partial sums, so the arithmetic is plain tp's but
#   for the order of the whole views' gradient sums (norms, biases of the
#   row-parallel layers, the position embedding: each rank's tokens, then
#   the group's sum). One SGD step: within 1e-6 and 1% of the precision's
#   distance from f32 of plain tp 2 (measured 5.6e-9 bf16, 1.9e-9 f16: f32
#   rounding; a value rounded to half where plain tp keeps it f32 is ~u,
#   2^-9 or 2^-12). 20 steps: sp tp 2 (bf16, f16), tp 2 x pp 2 (bf16) and
#   dp 2 x tp 2 zero1 (f16) within the bounds above of one rank, and sp
#   tp 2 of plain tp 2 the same; with regather, and with activation
#   checkpointing, the bits of sp without it;
#   tp_seq_mb and tp_sent_mb exactly what half gathers send; the f16 inf
#   on one rank skips the step on both, and the resume, as above.
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
SP=(--set parallel.sequence_parallel=true)
# RUN PRECISION WHAT [REF]: against one rank in PRECISION (or REF, a run in
# that precision)
near_one() {
  local d f l ref=${4:-$tmp/one_$2} who="one rank in $2"
  [ -n "${4:-}" ] && who="${4##*/}"
  d=$("$HASH" --diff "$ref/ckpt" "$1/ckpt")
  f=$("$HASH" --diff "$tmp/one_f32/ckpt" "$tmp/one_$2/ckpt")
  l=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
      if a and len(a) == len(b) else "none")' "$(loss_steps "$ref")" "$(loss_steps "$1")")
  awk -v d="$d" -v f="$f" -v l="$l" 'BEGIN { exit !(d != "" && d + 0 <= 5e-3 && d + 0 <= 1.5 * f && l != "none" && l + 0 <= 1e-4) }' &&
    ok "$3: parameters within $d of $who ($2 to f32: $f), losses within $l" ||
    bad "$3: parameters differ from $who by '$d' ($2 to f32: '$f'), losses by '$l'"
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
  # sequence parallel: plain tp's arithmetic but for the whole views' sums
  run 2 train "${cfg[@]}" "${sgd[@]}" --quiet --resume never --set train.precision=$p \
    --set parallel.tp=2 "${SP[@]}" --set "log.run_dir=$tmp/s3_$p"
  [ $rc = 0 ] || { bad "one SGD step, sequence parallel tp 2 in $p (rc $rc)"; cat "$tmp/out"; }
  d=$("$HASH" --diff "$tmp/s2_$p/ckpt" "$tmp/s3_$p/ckpt")
  awk -v d="$d" -v f="$f" 'BEGIN { exit !(d != "" && d + 0 <= 1e-6 && d + 0 <= 0.01 * f) }' &&
    ok "one SGD step, sequence parallel tp 2 in $p: parameters within $d of plain tp 2 ($p to f32: $f)" ||
    bad "one SGD step, sequence parallel tp 2 in $p: '$d' from plain tp 2 ($p to f32: '$f')"
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

# -- sequence parallelism: against one rank and plain tp in the same
#    precision; with regather the same bits (the same values gathered)
for p in bf16 f16; do
  run 2 train "${cfg[@]}" --quiet --resume never --set train.precision=$p \
    --set parallel.tp=2 "${SP[@]}" --set "log.run_dir=$tmp/sp_$p"
  [ $rc = 0 ] || { bad "sequence parallel tp 2 $p (rc $rc)"; cat "$tmp/out"; }
  near_one "$tmp/sp_$p" $p "sequence parallel tp 2, $p"
  near_one "$tmp/sp_$p" $p "sequence parallel tp 2, $p" "$tmp/tp_$p"
  run 2 train "${cfg[@]}" --quiet --resume never --set train.precision=$p \
    --set parallel.tp=2 "${SP[@]}" --set parallel.sequence_parallel_regather=true \
    --set "log.run_dir=$tmp/rg_$p"
  a=$("$HASH" "$tmp/sp_$p/ckpt")
  b=$("$HASH" "$tmp/rg_$p/ckpt")
  [ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(loss_steps "$tmp/sp_$p")" = "$(loss_steps "$tmp/rg_$p")" ] &&
    ok "sequence parallel tp 2 $p with regather: the bits and losses of sp without it" ||
    bad "sequence parallel tp 2 $p with regather (rc $rc): '$b' vs '$a'"
done
# activation checkpointing: the recomputed forward gathers the same half
# values again
run 2 train "${cfg[@]}" --quiet --resume never --set train.precision=bf16 \
  --set parallel.tp=2 "${SP[@]}" --set train.activation_checkpointing=every:2 \
  --set "log.run_dir=$tmp/ck_bf16"
a=$("$HASH" "$tmp/sp_bf16/ckpt")
b=$("$HASH" "$tmp/ck_bf16/ckpt")
[ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] &&
  ok "sequence parallel tp 2 bf16 with activation checkpointing: the bits of sp without it" ||
  bad "sequence parallel tp 2 bf16 with activation checkpointing (rc $rc): '$b' vs '$a'"
python3 - "$tmp"/{tp_bf16,sp_bf16,rg_bf16,tp_f16,sp_f16}/metrics.jsonl <<'EOF' && ok "sequence parallel tp 2 in bf16/f16: tp_seq_mb and tp_sent_mb of half all-gathers, less activation memory" || bad "sequence parallel tp 2 in bf16/f16: the bytes in metrics.jsonl"
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
tp, sp, rg, tp16, sp16 = (last(p) for p in sys.argv[1:])
MiB = 2**20
# one (rows, T, C) f32 buffer: 8 x 16 x 32 floats; 2 micro-batches a step.
# A micro-batch: 14 reduce-scatters of f32 partial sums (3 blocks x 2 + the
# embedding forward, 3 x 2 + the output layer backward); 14 all-gathers:
# 13 of half values (forward the inputs of qkv, fc, the output layer; back
# the output gradients of attention's and the MLP's projections), 1 f32
# (the embedding's output gradient, its f32 gradient's operand)
n = 8 * 16 * 32 * 4
whole = (16 * 32 + 3 * 6 * 32 + 2 * 32) * 4
for a, b in ((tp, sp), (tp16, sp16)):
    assert b["tp_seq_mb"] == 2 * (15 + 13 / 2) * n / MiB, b
    assert b["tp_reduce_mb"] == (2 * 4 * 8 * 16 * 4 + whole) / MiB, b
    # at tp 2 a gathered buffer of b bytes sends b / 2: each half one n / 4
    # less than f32's
    extra = b["tp_sent_mb"] - a["tp_sent_mb"]
    assert abs(extra - (whole - 2 * 13 * n / 4) / MiB) < 1e-9, (extra, a, b)
# regather: the 7 inputs gathered again in backward, in half
assert rg["tp_seq_mb"] == sp["tp_seq_mb"] + 2 * 7 * n / 2 / MiB, rg
assert abs(rg["tp_sent_mb"] - sp["tp_sent_mb"] - 2 * 7 * n / 4 / MiB) < 1e-9, rg
assert sp["mem_act_mb"] < tp["mem_act_mb"] and rg["mem_act_mb"] < sp["mem_act_mb"]
for name, r in (("plain tp 2 bf16", tp), ("sp tp 2 bf16", sp),
                ("sp regather bf16", rg), ("plain tp 2 f16", tp16),
                ("sp tp 2 f16", sp16)):
    print("%-18s tp_sent_mb %.6f tp_seq_mb %.4f tp_reduce_mb %.6f mem_act_mb %.3f"
          % (name, r["tp_sent_mb"], r.get("tp_seq_mb", 0), r["tp_reduce_mb"],
             r["mem_act_mb"]))
EOF
run 4 train "${cfg[@]}" --quiet --resume never --set train.precision=bf16 \
  --set parallel.tp=2 --set parallel.pp=2 --set parallel.micro_batches=4 \
  "${SP[@]}" --set "log.run_dir=$tmp/sp_tpp_bf16"
[ $rc = 0 ] || { bad "sequence parallel tp 2 x pp 2 bf16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/sp_tpp_bf16" bf16 "sequence parallel tp 2 x pp 2 (1f1b, 4 micro-batches), bf16"
run 4 train "${cfg[@]}" --quiet --resume never --set train.precision=f16 \
  --set parallel.tp=2 --set train.batch_size=4 --set parallel.strategy=zero1 \
  "${SP[@]}" --set "log.run_dir=$tmp/sp_dtz_f16"
[ $rc = 0 ] || { bad "sequence parallel dp 2 x tp 2 zero1 f16 (rc $rc)"; cat "$tmp/out"; }
near_one "$tmp/sp_dtz_f16" f16 "sequence parallel dp 2 x tp 2 zero1, f16"
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
#    with clipping (the norm's path) and without (the plain step's), and
#    with sequence parallelism (the whole views' parts summed, then
#    unscaled and checked)
for v in "grad_clip 0.5" "grad_clip 0" "grad_clip 0.5, sequence parallel"; do
  clip=${v#grad_clip }
  clip=${clip%%,*}
  f=("${cfg[@]}" --quiet --resume never --set train.precision=f16 --set parallel.tp=2
    --set train.steps=8 --set optim.grad_clip=$clip)
  k=$clip
  case $v in *sequence*) f+=("${SP[@]}") k=sp ;; esac
  inf_either_rank "tp 2 f16, $v" "inf_$k" "${f[@]}"
done

# -- f16 resume: the scaler's state is in the checkpoint (plain tp and
#    sequence parallel)
for v in tp sp; do
  r=("${cfg[@]}" --quiet --set train.precision=f16 --set parallel.tp=2
    --set train.loss_scale_init=8388608 --set train.loss_scale_growth_interval=3
    --set train.steps=12)
  [ $v = sp ] && r+=("${SP[@]}")
  run 2 train "${r[@]}" --resume never --set "log.run_dir=$tmp/straight_$v"
  run 2 train "${r[@]}" --resume never --set "log.run_dir=$tmp/resumed_$v" --stop-at 7
  run 2 train "${r[@]}" --resume auto --set "log.run_dir=$tmp/resumed_$v"
  a=$("$HASH" "$tmp/straight_$v/ckpt")
  b=$("$HASH" "$tmp/resumed_$v/ckpt")
  [ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(scales "$tmp/straight_$v")" = "$(scales "$tmp/resumed_$v")" ] &&
    ok "${v/tp/plain} tp 2 f16 stopped at step 7 and resumed: the bits and scales of the straight run ($(scales "$tmp/straight_$v" | wc -w) steps)" ||
    bad "${v/tp/plain} tp 2 f16 resume: '$b' vs '$a'; $(scales "$tmp/resumed_$v") vs $(scales "$tmp/straight_$v")"
done
for p in bf16 f16; do
  "$LOOM" config check "$SRC/examples/small_gpt.yaml" --set parallel.tp=2 "${SP[@]}" \
    --set train.precision=$p >"$tmp/out" 2>&1 &&
    ok "config check: sequence parallelism with train.precision $p accepted" ||
    { bad "config check: sequence parallelism with $p refused"; cat "$tmp/out"; }
done
finish parallel_tp_half
