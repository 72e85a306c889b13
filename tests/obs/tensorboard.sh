#!/usr/bin/env bash
# log.tensorboard: the event files that a run writes, read back with
# TensorBoard's own reader (PyPI tensorboard, EventAccumulator): every
# number of every metrics.jsonl line is a scalar of the same name at the
# same step with the same wall time (equal in f32, to one f32 step), and
# nothing else is there; a resumed
# run adds a second file, which purges the steps it logs again (a crash
# after the last checkpoint); 2 ranks write one file (rank 0); off by default.
# LOOM_NO_PYPI=1 skips the reading (no PyPI), saying so.
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
# Open MPI's own leaks (the 2-rank run) under the ASan build.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
if [ "${LOOM_NO_PYPI:-0}" = 1 ]; then
  echo "skipped: LOOM_NO_PYPI=1 (TensorBoard's reader comes from PyPI)"
  exit 0
fi
PY=$("$SRC/scripts/ensure-pyenv.sh") || { bad "scripts/ensure-pyenv.sh failed"; finish obs_tensorboard; }
head -c 40000 "$SRC/docs/parallel.md" >"$tmp/text.txt"
gpt=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=1
  --set model.d_model=32 --set model.heads=2 --set model.context=32 --set train.batch_size=2
  --set log.every=2 --set train.eval_every=4 --set train.eval_batches=2 --set optim.grad_clip=1
  --set checkpoint.every=4 --quiet)

# The events of DIR/tb against DIR/metrics.jsonl; FILES: event files wanted.
check() { # DIR FILES WHAT
  "$PY" - "$1" "$2" <<'PY' >"$tmp/check" 2>&1
import glob, json, struct, sys
from tensorboard.backend.event_processing import event_accumulator as ea
d, files = sys.argv[1], int(sys.argv[2])
got = sorted(glob.glob(d + "/tb/events.out.tfevents.*"))
assert len(got) == files, f"{len(got)} event files, wanted {files}"
acc = ea.EventAccumulator(d + "/tb", size_guidance={ea.SCALARS: 0})
acc.Reload()
tb = {}
for tag in acc.Tags()["scalars"]:
    for e in acc.Scalars(tag):
        tb.setdefault((tag, e.step), []).append((e.wall_time, e.value))
want = {}
for line in open(d + "/metrics.jsonl"):
    r = json.loads(line)
    for k, v in r.items():
        if k in ("step", "epoch", "time", "ranks") or isinstance(v, (str, bool, list)) or v is None:
            continue
        want.setdefault((k, r["step"]), []).append((r["time"], v))
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
n = 0
for key, vals in want.items():
    assert key in tb, f"{key} missing from TensorBoard"
    assert len(tb[key]) == len(vals), f"{key}: {len(tb[key])} events, {len(vals)} lines"
    for (wt, v), (twt, tv) in zip(sorted(vals), sorted(tb[key])):
        assert abs(wt - twt) < 2e-3, f"{key}: wall time {twt} vs {wt}"
        # metrics.jsonl holds 9 significant digits of the double, the event
        # the double rounded to f32: one f32 step apart at most
        assert tv == f32(v) or abs(tv - v) <= abs(v) * 2**-23, f"{key}: {tv} vs {v}"
        n += 1
extra = set(tb) - set(want)
assert not extra, f"in TensorBoard, not in metrics.jsonl: {sorted(extra)[:5]}"
tags = sorted({k for k, _ in want})
print(f"{n} scalars, {len(tags)} tags ({', '.join(tags[:6])}, ...)")
PY
  if [ $? = 0 ]; then ok "$3: $(tail -1 "$tmp/check")"; else bad "$3: $(tail -3 "$tmp/check" | tr "\n" " ")"; fi
}

"$LOOM" train "${gpt[@]}" --set train.steps=8 --set log.tensorboard=true \
  --set "log.run_dir=$tmp/a" --resume never >"$tmp/out" 2>&1 ||
  { bad "training with log.tensorboard (rc $?)"; cat "$tmp/out"; }
grep -q '"val_loss"' "$tmp/a/metrics.jsonl" 2>/dev/null &&
  check "$tmp/a" 1 "8 steps: every metrics.jsonl number in TensorBoard" ||
  bad "no evaluation line in metrics.jsonl"

# Resumed: the first file stays, a second one carries the new steps.
"$LOOM" train "${gpt[@]}" --set train.steps=12 --set log.tensorboard=true \
  --set "log.run_dir=$tmp/a" --resume auto >"$tmp/out" 2>&1 ||
  { bad "resuming with log.tensorboard (rc $?)"; cat "$tmp/out"; }
check "$tmp/a" 2 "resumed at step 8 to 12: two event files, all lines"

# A crash after step 6 (checkpoint at 4): the resumed run logs step 6
# again; its file starts with a restart at step 5 (SessionLog START), so
# TensorBoard drops the first file's step 6 and each step is there once,
# as in metrics.jsonl.
LOOM_FAULT=0:7:segv "$LOOM" train "${gpt[@]}" --set train.steps=8 --set log.tensorboard=true \
  --set "log.run_dir=$tmp/e" --resume never >"$tmp/out" 2>&1
rc=$?
# (under ASan the segv is its report and exit 1)
[ $rc = 139 ] || { [ -n "${LOOM_TEST_SANITIZED:-}" ] && [ $rc != 0 ]; } ||
  bad "a segv at step 7 (rc $rc)"
"$LOOM" train "${gpt[@]}" --set train.steps=8 --set log.tensorboard=true \
  --set "log.run_dir=$tmp/e" --resume auto >"$tmp/out" 2>&1 ||
  { bad "resuming after the crash (rc $?)"; cat "$tmp/out"; }
check "$tmp/e" 2 "crashed after step 6, resumed from 4: each step once"

# Two ranks: rank 0 alone writes.
run 2 train "${gpt[@]}" --set train.steps=4 --set log.tensorboard=true \
  --set "log.run_dir=$tmp/b" --resume never
[ $rc = 0 ] || { bad "2 ranks with log.tensorboard (rc $rc)"; cat "$tmp/out"; }
check "$tmp/b" 1 "2 ranks: one event file"

# Off by default; tensorboard without metrics.jsonl.
"$LOOM" train "${gpt[@]}" --set train.steps=2 --set "log.run_dir=$tmp/c" \
  --resume never >"$tmp/out" 2>&1
[ ! -e "$tmp/c/tb" ] && ok "off by default: no tb/" || bad "tb/ written without log.tensorboard"
"$LOOM" train "${gpt[@]}" --set train.steps=2 --set log.metrics=false \
  --set log.tensorboard=true --set "log.run_dir=$tmp/d" --resume never >"$tmp/out" 2>&1
[ ! -e "$tmp/d/metrics.jsonl" ] && [ -n "$(ls "$tmp/d/tb" 2>/dev/null)" ] &&
  ok "log.metrics false, log.tensorboard true: event file only" ||
  bad "log.metrics false with tensorboard: $(ls "$tmp/d" "$tmp/d/tb" 2>&1 | tr '\n' ' ')"
finish obs_tensorboard
