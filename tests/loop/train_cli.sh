#!/usr/bin/env bash
# loom train from the command line: each bad config is one exact line and
# exit code 2 with nothing written; --stop-at then --resume auto finishes
# the run from its checkpoint; --print-config; metrics.jsonl lines.
set -u
LOOM=${LOOM_BIN:?}
SRC=${LOOM_SRC:?}
T=$(mktemp -d /tmp/loom_train_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"
passes=0
fails=0
check() {
  local name=$1
  shift
  if "$@"; then passes=$((passes + 1)); else
    echo "FAIL: $name (rc=$rc, output: $out)" >&2
    fails=$((fails + 1))
  fi
}
run() {
  out=$("$@" 2>&1)
  rc=$?
}

# A table of bad configs: file text | the exact message.
bad() {
  local name=$1 text=$2 want=$3
  printf '%b' "$text" >"$name.yaml"
  run "$LOOM" train "$name.yaml" --set "log.run_dir=$T/run_$name"
  check "$name exit code" test "$rc" -eq 2
  check "$name message" test "$out" = "loom train: $want"
  check "$name writes nothing" test ! -e "$T/run_$name"
}
bad unknown 'optim:\n  lrr: 0.1\n' \
  "unknown.yaml:2:3: key 'optim.lrr': unknown key (did you mean 'optim.lr'?)"
bad type 'train:\n  batch_size: abc\n' \
  "type.yaml:2:15: key 'train.batch_size': expected an integer or auto, got 'abc'"
bad range 'optim:\n  lr: -1\n' \
  "range.yaml:2:7: key 'optim.lr': -1 is out of range (must be in (0, 1000])"
bad syntax 'optim:\n  lr: [1\n' \
  "syntax.yaml:3:1: YAML syntax error: did not find expected ',' or ']' (while parsing a flow sequence)"
# Issue 10: a key this build cannot honour with the others fails before
# training, as a config error (exit 2, never restarted by loom run).
bad precision 'train:\n  precision: bf16\n  loss_scale: dynamic\n' \
  "precision.yaml:3:3: key 'train.loss_scale': 'dynamic' is for train.precision f16; precision 'bf16' has f32's exponent range and needs no loss scaling: it supports auto or 0"
# A data.path that does not exist is an error naming it; nothing is created
# there (it used to make the directories and write 4 MB, exit 0).
run "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$T/no/such/kjv.txt" \
  --set "log.run_dir=$T/run_nokjv" --resume never
check "missing kjv path exit code" test "$rc" -eq 2
check "missing kjv path message" test "$out" = "loom train: data.path: cannot read $T/no/such/kjv.txt: No such file or directory (leave data.path empty to use the King James Bible prepared by loom)"
check "missing kjv path creates nothing" test ! -e "$T/no"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "data.path=$T/no/fashion" \
  --set "log.run_dir=$T/run_nofashion" --resume never
check "missing fashion path exit code" test "$rc" -eq 2
check "missing fashion path message" test "$out" = "loom train: data.path: cannot read the directory $T/no/fashion: No such file or directory"
# A data.path of the wrong kind, or a data set missing a file: exit 2
# (the same on every start, so loom run does not restart it).
touch "$T/plain"
mkdir -p "$T/emptydir"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "data.path=$T/plain" \
  --set "log.run_dir=$T/run_plain" --resume never
check "fashion path a file: exit 2" test "$rc" -eq 2
check "fashion path a file: message" test "$out" = "loom train: data.path: $T/plain is not a directory (fashion-mnist reads the directory of its four IDX files)"
run "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$T/emptydir" \
  --set "log.run_dir=$T/run_kjvdir" --resume never
check "kjv path a directory: exit 2" test "$rc" -eq 2
check "kjv path a directory: message" test "$out" = "loom train: data.path: $T/emptydir is not a regular file (dataset kjv reads one text file)"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "data.path=$T/emptydir" \
  --set "log.run_dir=$T/run_fdir" --resume never
check "fashion files missing: exit 2" test "$rc" -eq 2
check "fashion files missing: names the file" grep -q "emptydir/train-images-idx3-ubyte.gz is missing" <<<"$out"
# A label outside Fashion-MNIST's 10 classes names the labels file; a
# symbolic link in a loop is named as what it is, not as missing.
mkdir -p "$T/fm"
for f in /usr/share/datasets/fashion-mnist/*-idx*-ubyte.gz; do ln -s "$f" "$T/fm/"; done
rm "$T/fm/train-labels-idx1-ubyte.gz"
python3 - "$T/fm" <<'PY'
import gzip, sys
b = bytearray(gzip.open('/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz').read())
b[100] = 12
gzip.open(sys.argv[1] + '/train-labels-idx1-ubyte.gz', 'wb').write(bytes(b))
PY
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "data.path=$T/fm" \
  --set "log.run_dir=$T/run_fm" --resume never
check "label 12: exit 2" test "$rc" -eq 2
check "label 12: the labels file named" test "$out" = "loom train: $T/fm/train-labels-idx1-ubyte.gz: not Fashion-MNIST: a label is 12 (expected 10 classes, labels 0 to 9)"
rm "$T/fm/train-labels-idx1-ubyte.gz"
ln -s loop_b "$T/fm/train-labels-idx1-ubyte.gz"
ln -s train-labels-idx1-ubyte.gz "$T/fm/loop_b"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "data.path=$T/fm" \
  --set "log.run_dir=$T/run_fm2" --resume never
check "link loop: exit 2" test "$rc" -eq 2
check "link loop: named as a loop" grep -q "train-labels-idx1-ubyte.gz: Too many levels of symbolic links" <<<"$out"
run "$LOOM" train missing.yaml
check "missing file" test "$rc" -eq 2 -a "$out" = "loom train: missing.yaml: cannot open config: No such file or directory"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set optim.lr=x
check "bad --set" test "$rc" -eq 2 -a "$out" = "loom train: --set optim.lr=x: key 'optim.lr': expected a number, got 'x'"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --bogus
check "bad option" test "$rc" -eq 2
run "$LOOM" train
check "no config" test "$rc" -eq 2
run "$LOOM" train --help
check "help" grep -q -- "--resume auto|never|DIR" <<<"$out"
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --print-config --set optim.lr=0.125
check "print-config" grep -q "lr: 0.125" <<<"$out"

# A token id outside the vocabulary in the validation shard: refused at the
# start (exit 2), naming the file and the position, not at evaluation.
python3 - "$T" <<'PY'
import struct, sys
def shard(p, toks):
    h = struct.pack('<iii', 20240520, 1, len(toks)) + bytes(1024 - 12)
    open(p, 'wb').write(h + b''.join(struct.pack('<H', t) for t in toks))
shard(sys.argv[1] + '/train.bin', [i % 200 for i in range(5000)])
shard(sys.argv[1] + '/val.bin', [i % 200 for i in range(700)] + [300] + [1] * 100)
PY
run "$LOOM" train "$SRC/examples/small_gpt.yaml" --set data.dataset=bin \
  --set "data.path=$T/train.bin" --set "data.val_path=$T/val.bin" \
  --set "log.run_dir=$T/run_vocab"
check "val token outside vocab: exit 2" test "$rc" -eq 2
check "val token outside vocab: file and position" test "$out" = \
  "loom train: $T/val.bin: token 700 (byte 2424) is 300, outside the vocabulary (model.vocab 256)"

# A run directory another run holds (its .lock flocked, here by flock(1)):
# refused at once with exit 2, nothing of the other run's touched.
mkdir -p "$T/held"
echo "pid 4242 on elsewhere" >"$T/held/.lock"
echo keep >"$T/held/metrics.jsonl"
# the holder is the sleep itself (the subshell execs it), so killing it
# ends the lock: no process tool needed. It says through a FIFO once it
# holds the lock, so the test waits for that event, not for a guessed time
# (a 10 s poll was too short on a loaded machine).
mkfifo "$T/held_ready"
(
  exec 9>>"$T/held/.lock"
  if flock -n 9; then
    echo held >"$T/held_ready"
    exec sleep 600
  fi
  echo refused >"$T/held_ready"
) </dev/null >/dev/null 2>&1 &
holder=$!
read -r held <"$T/held_ready"
check "held run dir: lock taken by the holder" test "$held" = held
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/held" --resume never
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
check "held run dir: exit 2" test "$rc" -eq 2
check "held run dir: message" test "$out" = "loom train: log.run_dir $T/held is in use by another run (pid 4242 on elsewhere): two runs in one directory would overwrite each other's checkpoints and metrics; wait for it to end or set another log.run_dir"
check "held run dir: untouched" test "$(cat "$T/held/metrics.jsonl")" = keep

# Compression with one replica: nothing is reduced across replicas, and
# the run says so rather than ignoring the key without a word.
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/cmp" --set train.steps=2 \
  --set parallel.compress=bf16
check "compress on 1 rank: trains" test "$rc" -eq 0
check "compress on 1 rank: said" grep -q "warn: parallel.compress bf16: one replica (parallel.dp 1 of 1 rank(s)), so no gradient is reduced" <<<"$out"

# A resume on other data (the config hash leaves data.path out, so moved
# data resumes) is said, with both sizes; the same data says nothing.
cat "$SRC"/docs/*.md >"$T/all.txt"
head -c 100000 "$T/all.txt" >"$T/part.txt"
run "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$T/all.txt" --set train.steps=4 \
  --set "log.run_dir=$T/otherdata" --quiet
check "other data: first run" test "$rc" -eq 0
run "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$T/all.txt" --set train.steps=6 \
  --set "log.run_dir=$T/otherdata" --quiet
check "same data: no data warning" eval '! grep -q "saved training on other data" <<<"$out"'
run "$LOOM" train "$SRC/examples/small_gpt.yaml" --set "data.path=$T/part.txt" --set train.steps=8 \
  --set "log.run_dir=$T/otherdata" --quiet
check "other data: resumed" test "$rc" -eq 0
check "other data: said with both sizes" grep -q "^warn: $T/otherdata/ckpt/step_00000006 was saved training on other data: [0-9]* training and [0-9]* validation samples, where this run's data (data.path '$T/part.txt') has 5624 and 624; resuming at its position" <<<"$out"

# A resume with another config names the keys that changed (the
# checkpoint's extra.config), not only that something did.
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/othercfg" --set train.steps=4 --quiet
check "other config: first run" test "$rc" -eq 0
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/othercfg" --set train.steps=6 \
  --set optim.lr=0.02 --set schedule.name=step --set schedule.gamma=0.5 --quiet
check "other config: resumed" test "$rc" -eq 0
check "other config: the keys named" grep -qx "warn: $T/othercfg/ckpt/step_00000004 was saved with a different config (optim.lr 0.05, now 0.02; schedule.name constant, now step; schedule.gamma 0.1, now 0.5; train.steps 4, now 6); resuming with the current one" <<<"$out"

# A stopped run has no final evaluation: its summary names the last
# periodic one (2 batches at step 10) by step, and prints no result line.
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/stopsum" --stop-at 15
check "stopped summary: exit 0" test "$rc" -eq 0
check "stopped summary: the periodic evaluation named" grep -q "^stopped at step 15: .*; last evaluation at step 10 (train.eval_batches batches): val_loss [0-9.]*$" <<<"$out"
check "stopped summary: no test accuracy" eval '! grep -q "^test accuracy" <<<"$out"'

# Interrupted at step 7, then resumed to the end (20 steps).
ARGS=("$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/run" --set log.progress=lines)
run "$LOOM" train "${ARGS[@]}" --resume never --stop-at 7
check "stop-at exit" test "$rc" -eq 0
check "stopped at 7" grep -q "stopped at step 7" <<<"$out"
check "checkpoint of step 7" test -d "$T/run/ckpt/step_00000007"
LOOM_LOG=info run "$LOOM" train "${ARGS[@]}" --resume auto
check "resume exit" test "$rc" -eq 0
check "resumed from 7" grep -q "resuming from .*step_00000007 (step 7" <<<"$out"
check "done at 20" grep -q "done at step 20" <<<"$out"
check "test accuracy printed" grep -q "^test accuracy: [0-9.]*%$" <<<"$out"
run "$LOOM" ckpt verify "$T/run/ckpt"
check "final checkpoint verifies" test "$rc" -eq 0
# Resuming under another optimizer: exit 2 (a restart would fail the same
# way), the run's checkpoints kept.
run "$LOOM" train "${ARGS[@]}" --set optim.name=adamw --set optim.momentum=0 --steps 24
check "other optimizer: exit 2" test "$rc" -eq 2
check "other optimizer: message" grep -q "step_00000020: saved with optimizer 'sgd', the config says 'adamw'" <<<"$out"
check "other optimizer: checkpoint kept" test -d "$T/run/ckpt/step_00000020"
# --resume with a checkpoint directory, its latest file or a run directory,
# as loom ckpt reads them: the newest valid checkpoint there.
i=0
for form in "$T/run/ckpt" "$T/run/ckpt/latest" "$T/run"; do
  i=$((i + 1))
  LOOM_LOG=info run "$LOOM" train "${ARGS[@]}" --resume "$form" --set "log.run_dir=$T/form$i"
  check "--resume $form: exit 0" test "$rc" -eq 0
  check "--resume $form: from step 20" grep -q "resuming from $T/run/ckpt/step_00000020 (step 20" <<<"$out"
done
run "$LOOM" train "${ARGS[@]}" --resume "$T/emptydir/" --set "log.run_dir=$T/form_none"
check "--resume of a directory without checkpoints: an error" test "$rc" -ne 0
# An explicit --resume PATH that gives no checkpoint is the command line's
# error, exit 2 (loom run restarts exit 1, which would fail the same way):
# a missing path, an empty checkpoint directory, a run whose checkpoints
# are all damaged.
mkdir -p "$T/emptyrun/ckpt" "$T/dmg"
cp -r "$T/run/ckpt" "$T/dmg/ckpt"
for d in "$T"/dmg/ckpt/step_*; do rm "$d/manifest.json"; done
for form in "$T/nonexist|$T/nonexist: no such checkpoint directory" \
  "$T/emptyrun/ckpt|--resume $T/emptyrun/ckpt: no checkpoint in $T/emptyrun/ckpt (it holds none)" \
  "$T/emptyrun|--resume $T/emptyrun: no checkpoint in $T/emptyrun/ckpt (it holds none)" \
  "$T/dmg|--resume $T/dmg: $T/dmg/ckpt: no valid checkpoint"; do
  run "$LOOM" train "${ARGS[@]}" --resume "${form%%|*}" --set "log.run_dir=$T/form_bad"
  check "--resume ${form%%|*}: exit 2" test "$rc" -eq 2
  check "--resume ${form%%|*}: said" grep -qF -e "${form#*|}" <<<"$out"
done
check "metrics lines" test "$(grep -c '"loss"' "$T/run/metrics.jsonl")" -eq 4
check "eval lines" test "$(grep -c '"val_accuracy"' "$T/run/metrics.jsonl")" -ge 2
# Resumed from an older checkpoint: the steps after it are logged again,
# and metrics.jsonl holds each step once, in order (the abandoned lines cut
# off, with a last line left unfinished by a crash).
run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/again" --resume never
check "again: first run" test "$rc" -eq 0
printf '{"step":21,"lo' >>"$T/again/metrics.jsonl"
LOOM_LOG=info run "$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$T/again" \
  --resume "$T/again/ckpt/step_00000010"
check "again: resumed from 10" grep -q "resuming from .*step_00000010 (step 10" <<<"$out"
check "again: cut said" grep -q "metrics.jsonl: .* bytes of steps after 10 cut off" <<<"$out"
steps=$(grep -o '^{"step":[0-9]*' "$T/again/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
check "again: each step once, in order ($steps)" test "$(grep -c '"loss"' "$T/again/metrics.jsonl")" -eq 4
check "again: steps in order ($steps)" test "$(grep -o '^{"step":[0-9]*' "$T/again/metrics.jsonl" | cut -d: -f2 | sort -n -c 2>&1)" = ""
# The run stopped at step 7 and resumed logs steps 10, 15 and 20 as the
# uninterrupted one does: its checkpoint kept the loss window of steps 6-7.
losses() { grep '"loss"' "$1/metrics.jsonl" | grep -o '"step":[0-9]*,\|"loss":[-0-9.e+]*' | tr -d '\n'; }
check "resumed at 7: the losses of the run without a stop ($(losses "$T/run"))" test "$(losses "$T/run")" = "$(losses "$T/again")"
check "again: whole lines" test "$(tail -c 1 "$T/again/metrics.jsonl" | od -An -c | tr -d ' ')" = '\n'

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
