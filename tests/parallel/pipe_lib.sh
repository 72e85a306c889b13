# Shared by the pipeline tests with data parallelism (test_pipe_zero.sh,
# test_pipe_zero3.sh, test_pipe_compress.sh): the GPT of test_pipe.sh (3
# blocks, the output layer tied to the embedding) with accumulation 2 and
# clipping, 20 steps, a dp 2 x pp 2 mesh of 2 micro-batches, and helpers.
# Source it with the script's arguments; usage: SCRIPT DDP_CKPT_HASH.
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: $(basename "$0") DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
seeded_text "$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
  --set model.layers=3 --set train.batch_size=8 --set train.accumulate=2
  --set optim.grad_clip=0.5 --set train.steps=20 --set log.every=1
  --set checkpoint.every=0 --set log.progress=off --quiet)
mesh=(--set parallel.pp=2 --set parallel.micro_batches=2 --set train.batch_size=4)
tp=(--set parallel.tp=2 --set model.heads=4)
hashof() { "$HASH" "$1/ckpt" | cut -d' ' -f1-2; }
val_losses() { # RUN: every validation loss, in step order
  python3 -c 'import json, sys
seen = {}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    if "val_loss" in r: seen[r["step"]] = repr(r["val_loss"])
print(" ".join(seen[k] for k in sorted(seen)))' "$1"
}
close() { # RUN WHAT: parameters and every loss within 1e-5 of one rank ($tmp/one)
  local d l
  d=$("$HASH" --diff "$tmp/one/ckpt" "$1/ckpt")
  l=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
      if a and len(a) == len(b) else "none")' "$(loss_steps "$tmp/one")" "$(loss_steps "$1")")
  awk -v d="$d" -v l="$l" 'BEGIN { exit !(d != "" && d + 0 <= 1e-5 && l != "none" && l + 0 <= 1e-5) }' &&
    ok "$2: parameters within $d, losses within $l of one rank" ||
    bad "$2: parameters differ by '$d', losses by '$l'"
}
pz() { # NAME STRATEGY [ARGS...]: dp 2 x pp 2 under loom run
  local name=$1 s=$2
  shift 2
  run 4 train "${cfg[@]}" "${mesh[@]}" --set "log.run_dir=$tmp/$name" \
    --set parallel.strategy="$s" "$@"
  [ $rc = 0 ] || { bad "$name (rc $rc)"; cat "$tmp/out"; }
}
one() { # NAME [ARGS...]: one rank, the same global batch
  local name=$1
  shift
  run 1 train "${cfg[@]}" --set "log.run_dir=$tmp/$name" "$@"
  [ $rc = 0 ] || { bad "$name on one rank (rc $rc)"; cat "$tmp/out"; }
}
