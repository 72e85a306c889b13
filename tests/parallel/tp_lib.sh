#!/usr/bin/env bash
# Shared by test_tp.sh and test_tp_sp.sh (source it first): tests/lib.sh,
# the seeded text, the GPT config of the tensor-parallel tests (3 blocks,
# d_model 32, 4 heads, accumulation 2, clipping, 20 steps), and the
# comparisons with a one-rank run.
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
HASH=${1:?usage: $0 DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
# A text of its own (seeded), not a file of the tree: the comparisons
# below are tight, and an edit elsewhere must not move them.
seeded_text "$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
  --set model.layers=3 --set model.heads=4 --set train.batch_size=8
  --set train.accumulate=2 --set optim.grad_clip=0.5 --set train.steps=20
  --set train.eval_every=10 --set train.eval_batches=2 --set log.every=1
  --set checkpoint.every=0 --set log.progress=off --quiet)
hashof() { "$HASH" "$1/ckpt" | cut -d' ' -f1-2; }
last_val() {
  python3 -c 'import json, sys
v = [json.loads(l)["val_loss"] for l in open(sys.argv[1] + "/metrics.jsonl") if "val_loss" in l]
print(v[-1] if v else "none")' "$1"
}
# RUN against REF: the largest relative difference of the parameters, of
# any step's loss and of the last validation loss, all within 1e-5.
close() {
  local d l v ref=${3:-$tmp/ref}
  d=$("$HASH" --diff "$ref/ckpt" "$1/ckpt")
  l=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
      if a and len(a) == len(b) else "none")' "$(loss_steps "$ref")" "$(loss_steps "$1")")
  v=$(python3 -c 'import sys
a, b = sys.argv[1], sys.argv[2]
print("none" if "none" in (a, b) else abs(float(a) - float(b)) / abs(float(a)))' "$(last_val "$ref")" "$(last_val "$1")")
  awk -v d="$d" -v l="$l" -v v="$v" 'BEGIN { exit !(d != "" && d + 0 <= 1e-5 && l != "none" && l + 0 <= 1e-5 && v != "none" && v + 0 <= 1e-5) }' &&
    ok "$2: parameters within $d, losses within $l, validation loss within $v of one rank" ||
    bad "$2: parameters differ by '$d', losses by '$l', validation loss by '$v'"
}
tp() { # N TP NAME [ARGS...]: a run under loom run
  local n=$1 p=$2 name=$3
  shift 3
  run "$n" train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/$name" \
    --set parallel.tp="$p" "$@"
  [ $rc = 0 ] || { bad "$name (rc $rc)"; cat "$tmp/out"; }
}

