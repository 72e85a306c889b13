#!/usr/bin/env bash
# train.precision f16 with loss scaling (docs/precision.md): the dynamic
# scale follows its rules step by step (halved and the step skipped on an
# overflow, doubled after the growth interval); an inf on ONE rank's part of
# the gradient skips the step on every rank (ZeRO-1 and ZeRO-2: the other
# rank never sees it); deterministic mode gives the same bits on 1 and 2
# ranks with accumulation and clipping; a run stopped at a checkpoint and
# resumed ends with the weights and the scale sequence of the straight run;
# a scale that cannot be halved again stops the run before a checkpoint
# could hold it; a checkpoint's scaler fields out of range are refused.
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: test_f16_train.sh DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}

# RUN INIT INTERVAL: the scale of each step follows the rules from INIT;
# prints the number of skips and of growths.
check_rules() {
  python3 -c 'import json, sys
run, scale, interval = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
good = skipped = skips = grows = 0
step = 0
for l in open(run + "/metrics.jsonl"):
    r = json.loads(l)
    if "loss_scale" not in r: continue
    assert r["step"] == step + 1, "one line a step: %r" % r
    step = r["step"]
    if r["skipped_steps"] == skipped + 1:
        scale *= 0.5; good = 0; skips += 1
    else:
        assert r["skipped_steps"] == skipped, r
        good += 1
        if good == interval:
            scale *= 2; good = 0; grows += 1
    skipped = r["skipped_steps"]
    got = r["loss_scale"]
    assert abs(got - scale) <= 1e-6 * scale, "step %d: scale %r, want %r" % (step, got, scale)
print(skips, grows)' "$@"
}

mlp=("$SRC/examples/small_mlp.yaml" --set train.precision=f16
  --set log.progress=off --set log.every=1 --set train.eval_every=0)

# -- the rules, one rank: from 2^30 the first steps overflow f16 and are
# skipped; then the scale doubles every 4 good steps until it overflows
# again.
"$LOOM" train "${mlp[@]}" --resume never --set train.steps=40 \
  --set train.batch_size=8 --set train.loss_scale_init=1073741824 \
  --set train.loss_scale_growth_interval=4 --set "log.run_dir=$tmp/rules" \
  >"$tmp/out" 2>&1 || bad "f16 rules run"
if r=$(check_rules "$tmp/rules" 1073741824 4 2>"$tmp/err"); then
  set -- $r
  [ "$1" -ge 3 ] && [ "$2" -ge 2 ] &&
    ok "dynamic scale follows the rules over 40 steps ($1 skipped, $2 growths)" ||
    bad "dynamic scale: $1 skips and $2 growths (want >= 3 and >= 2)"
else
  bad "dynamic scale broke its rules: $(tail -1 "$tmp/err")"
fi
LOOM_LOG=info "$LOOM" train "${mlp[@]}" --resume never --set train.steps=2 \
  --set train.batch_size=8 --set train.loss_scale_init=1e30 \
  --set "log.run_dir=$tmp/huge" >"$tmp/out" 2>&1
grep -q "step 1 skipped: a gradient holds an inf or NaN (loss scale 1e+30); loss scale now 5e+29" "$tmp/out" &&
  grep -q "f16: .*f16 storage" "$tmp/out" &&
  ok "an overflow is logged with the step and the new scale" ||
  { bad "no skip logged"; cat "$tmp/out"; }
# a static scale: never changes, an overflow still skips
"$LOOM" train "${mlp[@]}" --resume never --set train.steps=3 \
  --set train.batch_size=8 --set train.loss_scale=1e30 \
  --set "log.run_dir=$tmp/static" >"$tmp/out" 2>&1 || bad "static run"
[ "$(scales "$tmp/static")" = "1:1e+30:1 2:1e+30:2 3:1e+30:3" ] &&
  ok "a static scale stays, its overflows skip" ||
  bad "static scale: $(scales "$tmp/static")"
# ... and says so as a warning (a run at a scale that always overflows
# trained nothing, with INFO lines only): at the 1st, 2nd, 4th ... skip
[ "$(grep -c '^warn: step [0-9]* skipped: a gradient holds an inf or NaN at the static loss scale 1e+30' "$tmp/out")" = 2 ] &&
  grep -q "^warn: step 2 skipped: .*(2 step(s) skipped so far); a static scale never backs off" "$tmp/out" &&
  ok "a static scale's overflows are warnings (steps 1 and 2 of 3)" ||
  { bad "static scale: no warning"; cat "$tmp/out"; }

# -- an inf on one rank's part only: every rank skips that step. Same
# weights whichever rank holds it; other weights than without it.
for strat in zero1 zero2; do
  zr=("${mlp[@]}" --resume never --set train.steps=8 --set train.batch_size=4
    --set parallel.strategy=$strat --set optim.grad_clip=1)
  inf_either_rank "$strat" "$strat" "${zr[@]}"
done

# -- deterministic mode, accumulation, clipping: the same bits on 1 and 2
# ranks, and a skipped step among them.
det=(--resume never --set parallel.deterministic=true
  --set parallel.virtual_shards=4 --set train.accumulate=2
  --set optim.grad_clip=0.5 --set train.batch_size=4 --set train.steps=12
  --set train.loss_scale_init=1048576 --set train.loss_scale_growth_interval=3)
ref=""
for n in 1 2; do
  run $n train "${mlp[@]}" "${det[@]}" --set "log.run_dir=$tmp/det_$n"
  h=$("$HASH" "$tmp/det_$n/ckpt")
  l=$(loss_steps "$tmp/det_$n")
  s=$(scales "$tmp/det_$n")
  if [ $rc != 0 ]; then
    bad "f16 deterministic on $n ranks (rc $rc)"
    cat "$tmp/out"
  elif [ -z "$ref" ]; then
    ref="$h $l $s"
    case "$s" in
    *":1 "*) ok "f16 deterministic, 1 rank: params $h, a step skipped" ;;
    *) bad "f16 deterministic: no step skipped ($s)" ;;
    esac
  elif [ "$h $l $s" = "$ref" ]; then
    ok "f16 deterministic, $n ranks: same params, losses and scales as 1 rank"
  else
    bad "f16 deterministic, $n ranks: '$h' vs 1 rank '${ref%% *}'"
  fi
done

# -- resume: 12 steps straight, and 6 + 6 from the step-6 checkpoint, with
# the scale growing every 4 good steps (so the good-step count must
# survive) and skips among them.
common=("${mlp[@]}" --set train.batch_size=8 --set checkpoint.every=6
  --set train.loss_scale_init=8388608 --set train.loss_scale_growth_interval=4)
for leg in straight:12 resumed:6 resumed:12; do
  dir=${leg%%:*} to=${leg##*:}
  fresh=(--resume never)
  [ "$leg" = resumed:12 ] && fresh=() # from the checkpoint of step 6
  "$LOOM" train "${common[@]}" "${fresh[@]}" --set train.steps="$to" \
    --set "log.run_dir=$tmp/$dir" >"$tmp/out" 2>&1 || bad "$dir run to $to"
done
a=$("$HASH" "$tmp/straight/ckpt")
b=$("$HASH" "$tmp/resumed/ckpt")
[ -n "$a" ] && [ "$a" = "$b" ] &&
  ok "f16 resumed at step 6: the weights of the straight run ($a)" ||
  bad "f16 resume: $b vs straight $a"
sa=$(scales "$tmp/straight")
sb=$(scales "$tmp/resumed")
[ "$sa" = "$sb" ] && [ "$(loss_steps "$tmp/straight")" = "$(loss_steps "$tmp/resumed")" ] &&
  ok "f16 resumed: the same losses and scales step by step ($sa)" ||
  bad "f16 resumed scales: '$sb' vs straight '$sa'"

# -- a scale that cannot back off again: from 2e-38 (the smallest normal
# f32 is 1.18e-38) an inf at step 3 leaves nowhere to go. The run stops
# there with the reason, never writes a checkpoint of a scale no run can
# resume with, and the one of step 2 resumes.
LOOM_FAULT=0:3:grad_inf "$LOOM" train "${mlp[@]}" --resume never \
  --set train.steps=6 --set train.batch_size=8 --set checkpoint.every=2 \
  --set train.loss_scale_init=2e-38 --set "log.run_dir=$tmp/floor" \
  >"$tmp/out" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "step 3: f16 loss scaling: a gradient holds an inf or NaN even at loss scale 2e-38, which cannot be halved again" "$tmp/out" &&
  [ "$(ls "$tmp/floor/ckpt" | grep step_ | tr '\n' ' ')" = "step_00000002 " ] &&
  "$LOOM" ckpt verify "$tmp/floor/ckpt" >/dev/null 2>&1 &&
  ok "a scale that cannot be halved again stops the run at that step (rc $rc); step 2's checkpoint stands" ||
  { bad "scale floor: rc $rc, checkpoints $(ls "$tmp/floor/ckpt" | tr '\n' ' ')"; cat "$tmp/out"; }
"$LOOM" train "${mlp[@]}" --set train.steps=4 --set train.batch_size=8 \
  --set checkpoint.every=2 --set train.loss_scale_init=2e-38 \
  --set "log.run_dir=$tmp/floor" >"$tmp/out" 2>&1 &&
  ok "the run stopped at the floor resumes from step 2 (no fault: it trains on)" ||
  { bad "resume after the floor"; cat "$tmp/out"; }

# -- the scaler's fields of a checkpoint, checked on resume: each bad
# value (its manifest's checksum made good again) is refused with the
# file and the field named, never trained on
edit_manifest() { # MANIFEST PYTHON_REGEX REPLACEMENT: edited, crc32c redone
  python3 - "$@" <<'PY'
import re, sys
path, pat, rep = sys.argv[1:4]
text = open(path, "rb").read().decode()
text, n = re.subn(pat, rep, text, count=1)
assert n == 1, "no match for " + pat
def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF
at = text.rindex('"manifest_crc32c"')
d = text.index('"0x', at) + 3
text = text[:d] + "00000000" + text[d + 8:]
text = text[:d] + "%08x" % crc32c(text.encode()) + text[d + 8:]
open(path, "wb").write(text.encode())
PY
}
for case in 'loss_scale|"loss_scale":\s*[^,]*|"loss_scale": 1e39|loss_scale: 1e+39 is outside' \
  'loss_scale|"loss_scale":\s*[^,]*|"loss_scale": 1e-50|loss_scale: 1e-50 is outside' \
  'mode|"mode":\s*"dynamic"|"mode": "bogus"|extra.loss_scaler.mode: '"'"'bogus'"'"': expected dynamic or static' \
  'skipped|"skipped":\s*[0-9]+|"skipped": 1e300|extra.loss_scaler.skipped: 1.0000000000000001e+300: expected a whole number' \
  'good_steps|"good_steps":\s*[0-9]+|"good_steps": -1|extra.loss_scaler.good_steps: -1: expected a whole number'; do
  IFS='|' read -r name pat rep want <<<"$case"
  rm -rf "$tmp/bad_$name"
  mkdir -p "$tmp/bad_$name/ckpt"
  cp -r "$tmp/resumed/ckpt/step_00000006" "$tmp/bad_$name/ckpt/"
  edit_manifest "$tmp/bad_$name/ckpt/step_00000006/manifest.json" "$pat" "$rep" || bad "editing $name"
  "$LOOM" train "${common[@]}" --set train.steps=12 \
    --resume "$tmp/bad_$name/ckpt/step_00000006" --set "log.run_dir=$tmp/bad_$name/run" >"$tmp/out" 2>&1
  rc=$?
  [ $rc != 0 ] && grep -q "bad_$name/ckpt/step_00000006/manifest.json.*$want" "$tmp/out" &&
    [ ! -e "$tmp/bad_$name/run/ckpt/step_00000012" ] &&
    ok "a checkpoint's $rep is refused on resume, naming the manifest and the field" ||
    { bad "checkpoint with $rep: rc $rc"; cat "$tmp/out"; }
  # loom ckpt verify refuses what a resume refuses
  "$LOOM" ckpt verify "$tmp/bad_$name/ckpt/step_00000006" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 1 ] && grep -q "step_00000006/manifest.json.*$want" "$tmp/out" &&
    ok "loom ckpt verify: $rep is damage (exit 1)" ||
    { bad "ckpt verify of $rep: rc $rc"; cat "$tmp/out"; }
done
finish f16_train
