#!/usr/bin/env bash
# Wire compression (parallel.compress bf16 and f16) on the data-parallel
# dimension of a pipeline, dp 2 x pp 2, the GPT of test_pipe_zero.sh (3
# blocks, the output layer tied to the embedding) with accumulation, 2
# micro-batches and clipping, 20 steps, against one rank (f32, the same
# global batch) and against DDP without a pipeline (dp 2, the same
# compression and global batch):
# - 1f1b and gpipe give the same bits, and so does zero2 over dp (each
#   piece reduced to its owner in 16 bits, the owner's cut widened);
# - within 1e-4 of DDP's run with the same compression: both put the same
#   values on the wire (each replica's own mean gradient, averaged; the
#   pipeline's replica, whose gradient is its 1/D share of the sum, scales
#   by D first) and differ only by the f32 order of the micro-batches'
#   accumulation (the uncompressed pipeline is within 1e-6 of one rank),
#   which now and then moves an element across a rounding boundary of the
#   16-bit format. Measured 1.2e-5 (bf16) and 1.6e-5 (f16); the f16 sum
#   without the scaling (the share on the wire, deeper in f16's subnormals)
#   gave 1e-3, as far as compression itself;
# - against one rank in f32: the wire rounds every gradient element to 8
#   (bf16) or 11 (f16, fewer below 2^-14) significant bits, and AdamW
#   normalises each element's update to about lr (1e-3) a step, so an
#   element whose gradient is small against its rounding moves by up to
#   about lr a step. Measured 1.0e-3 (bf16) and 0.9e-3 (f16) of the largest
#   parameter (the LayerNorm gains, 1) after 20 steps: one step's lr, and
#   every step's loss within 1e-5. Allowed: 5 lr for the parameters, 1e-4
#   for the losses; and more than 1e-5 from one rank (the uncompressed
#   pipeline's distance), else nothing was rounded;
# - metrics.jsonl: pp_dp_mb (the bytes handed to the dp sum a step) half
#   of f32's, and mem_comm_mb up by the same (the 16-bit copy of the
#   stage's range);
# - dp 2 x tp 2 x pp 2 bf16: within 1e-4 of dp 2 x tp 2 bf16 without a
#   pipeline, zero2 with the same bits, within 5 lr of one rank;
# - loom estimate: stage 0 sends 2 bytes an element less under ddp, 1
#   under zero2, and keeps 2 more (the copy);
# - loom config check accepts bf16 and f16 with parallel.pp (also zero2,
#   tp 2); deterministic mode stays refused with a pipeline, compressed or
#   not (it reduces in f32).
. "$(dirname "$0")/pipe_lib.sh"
cfg+=(--resume never)
# REF RUN MAX [MIN] WHAT: RUN's parameters within MAX of REF's, relative
# to REF's largest; with MIN, also more than MIN from them and every
# step's loss within 1e-4 of REF's.
near() {
  local ref=$1 r=$2 max=$3 min="" what d l=""
  if [ $# = 5 ]; then min=$4 what=$5; else what=$4; fi
  d=$("$HASH" --diff "$tmp/$ref/ckpt" "$tmp/$r/ckpt")
  if [ -n "$min" ]; then
    l=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
      if a and len(a) == len(b) else "none")' "$(loss_steps "$tmp/$ref")" "$(loss_steps "$tmp/$r")")
  fi
  awk -v d="$d" -v x="$max" -v n="${min:-0}" -v l="${l:-0}" \
    'BEGIN { exit !(d != "" && d + 0 <= x + 0 && d + 0 > n + 0 && l != "none" && l + 0 <= 1e-4) }' &&
    ok "$what: parameters within $d${l:+, losses within $l} of $ref" ||
    bad "$what: parameters differ by '$d'${l:+, losses by '$l'} from $ref (allowed ${min:+$min < d <= }$max)"
}
job() { # N NAME [ARGS...]: loom train under loom run into $tmp/NAME
  local n=$1 name=$2
  shift 2
  run "$n" train "${cfg[@]}" --set "log.run_dir=$tmp/$name" "$@"
  [ $rc = 0 ] || { bad "$name (rc $rc)"; cat "$tmp/out"; }
}
last() { # RUN KEY: rank 0's last value of KEY in metrics.jsonl
  python3 -c 'import json, sys
print([json.loads(l) for l in open(sys.argv[1]) if sys.argv[2] in l][-1][sys.argv[2]])' \
    "$tmp/$1/metrics.jsonl" "$2"
}

job 1 one
job 4 p32 "${mesh[@]}"
for c in bf16 f16; do
  job 2 ddp_$c --set train.batch_size=4 --set parallel.compress=$c
  job 4 p_$c "${mesh[@]}" --set parallel.compress=$c
  job 4 g_$c "${mesh[@]}" --set parallel.compress=$c --set parallel.pp_schedule=gpipe
  job 4 z_$c "${mesh[@]}" --set parallel.compress=$c --set parallel.strategy=zero2
  job 4 zg_$c "${mesh[@]}" --set parallel.compress=$c --set parallel.strategy=zero2 \
    --set parallel.pp_schedule=gpipe
  same "$tmp/g_$c" "$tmp/p_$c" "dp 2 x pp 2 $c, gpipe"
  same "$tmp/z_$c" "$tmp/p_$c" "dp 2 x pp 2 $c, zero2 1f1b"
  same "$tmp/zg_$c" "$tmp/p_$c" "dp 2 x pp 2 $c, zero2 gpipe"
  near ddp_$c p_$c 1e-4 "dp 2 x pp 2 $c against dp 2 DDP $c"
  near one p_$c 5e-3 1e-5 "dp 2 x pp 2 $c against one rank in f32"
  near one ddp_$c 5e-3 1e-5 "dp 2 DDP $c against one rank in f32"
  awk -v a="$(last p32 pp_dp_mb)" -v b="$(last p_$c pp_dp_mb)" \
    -v ca="$(last p32 mem_comm_mb)" -v cb="$(last p_$c mem_comm_mb)" \
    -v cz="$(last z_$c mem_comm_mb)" \
    'BEGIN { d = cb - ca; h = b - a / 2; exit !(a > 0 && h * h < 1e-12 * a * a && d > 0.999 * b && d < 1.001 * b && cz == cb) }' &&
    ok "dp 2 x pp 2 $c: rank 0 hands $(last p_$c pp_dp_mb) MiB a step to the dp sum ($(last p32 pp_dp_mb) in f32), keeps a copy of that size" ||
    bad "dp 2 x pp 2 $c: pp_dp_mb $(last p_$c pp_dp_mb) (f32 $(last p32 pp_dp_mb)), mem_comm_mb $(last p_$c mem_comm_mb) (f32 $(last p32 mem_comm_mb), zero2 $(last z_$c mem_comm_mb))"
done

# -- dp 2 x tp 2 x pp 2: each (stage, tp rank)'s replicas sum in bf16
job 1 one4 --set model.heads=4
job 4 dt_bf16 "${tp[@]}" --set train.batch_size=4 --set parallel.compress=bf16
job 8 t_bf16 "${mesh[@]}" "${tp[@]}" --set parallel.compress=bf16
job 8 tz_bf16 "${mesh[@]}" "${tp[@]}" --set parallel.compress=bf16 --set parallel.strategy=zero2
same "$tmp/tz_bf16" "$tmp/t_bf16" "dp 2 x tp 2 x pp 2 bf16, zero2"
near dt_bf16 t_bf16 1e-4 "dp 2 x tp 2 x pp 2 bf16 against dp 2 x tp 2 bf16"
near one4 t_bf16 5e-3 1e-5 "dp 2 x tp 2 x pp 2 bf16 against one rank in f32"

# -- loom estimate: what stage 0 sends a step and keeps for the wire
for s in ddp zero2; do
  for c in none bf16; do
    "$LOOM" estimate "${cfg[@]:0:5}" "${mesh[@]}" -n 4 --strategy $s \
      --set model.d_model=256 --set parallel.compress=$c >"$tmp/est_${s}_$c" 2>&1 ||
      { bad "loom estimate --strategy $s compress $c"; cat "$tmp/est_${s}_$c"; }
  done
  own=$(awk '$2 == "stage" && $3 == "0:" { print $7 }' "$tmp/est_${s}_none")
  stage0() { awk '$1 == "stage0" { print $'"$2"' }' "$tmp/est_${s}_$1"; }
  # ddp: an all-reduce, 2 (D-1)/D of the range, 2 bytes an element less;
  # zero2: the reduce-scatter's (D-1)/D, and the f32 gather unchanged
  k=$([ $s = ddp ] && echo 2 || echo 1)
  awk -v own="$own" -v k=$k -v s0="$(stage0 none 11)" -v s1="$(stage0 bf16 11)" \
    -v c0="$(stage0 none 8)" -v c1="$(stage0 bf16 8)" 'BEGIN { m = 1048576;
      exit !(own > 0 && (s0 - s1) - k * own / m < 0.11 && k * own / m - (s0 - s1) < 0.11 &&
             (c1 - c0) - 2 * own / m < 0.11 && 2 * own / m - (c1 - c0) < 0.11) }' &&
    ok "loom estimate $s, stage 0 ($own parameters): sends $(stage0 bf16 11) MiB a step in bf16 ($(stage0 none 11) in f32), comm $(stage0 bf16 8) ($(stage0 none 8))" ||
    { bad "loom estimate $s with bf16: sent $(stage0 bf16 11) vs $(stage0 none 11), comm $(stage0 bf16 8) vs $(stage0 none 8)"; cat "$tmp/est_${s}_bf16"; }
done

# -- loom config check: accepted (exit 0); deterministic stays refused
G="$SRC/examples/small_gpt.yaml"
for x in "parallel.compress=bf16" "parallel.compress=f16" \
  "parallel.compress=bf16 --set parallel.strategy=zero2" \
  "parallel.compress=f16 --set parallel.tp=2 --set model.heads=4"; do
  "$LOOM" config check "$G" --set parallel.pp=2 --set $x >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 0 ] && ok "config check pp 2 --set $x: rc 0" ||
    { bad "config check pp 2 --set $x: rc $rc"; cat "$tmp/out"; }
done
"$LOOM" config check "$G" --set parallel.pp=2 --set parallel.compress=bf16 \
  --set parallel.deterministic=true >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -qF "true with parallel.pp 2: the pipeline supports false" "$tmp/out" &&
  ok "config check pp 2 bf16 deterministic: rc 2, named" ||
  { bad "config check pp 2 bf16 deterministic: rc $rc"; cat "$tmp/out"; }
finish parallel_pipe_compress
