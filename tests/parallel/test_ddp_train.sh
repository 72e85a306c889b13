#!/usr/bin/env bash
# `loom run -n N loom train`: data-parallel training from a config. Rank 0
# alone reports; a 2-rank checkpoint resumes on 1 rank; deterministic mode
# gives the same bits (weights, losses) on 1, 2 and 4 ranks; a short last
# batch that leaves a rank empty does not hang; a config that differs on one
# rank, or strategy none on 2 ranks, is a clear error.
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: test_ddp_train.sh DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
# Sanitizer builds: Open MPI's own allocations live until exit (full stacks
# so that the suppressions see its libraries).
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}

# -- 2 ranks: one report, metrics with the communication profile, a
#    checkpoint of two shards.
run 2 train "$SRC/examples/small_mlp.yaml" --resume never \
  --set "log.run_dir=$tmp/a" --set log.progress=lines
[ $rc = 0 ] && ok "2 ranks train" || { bad "2 ranks train (rc $rc)"; cat "$tmp/out"; }
n=$(grep -c '^test accuracy' "$tmp/out")
[ "$n" = 1 ] && ok "one final report" || bad "$n final reports"
n=$(grep -c '^step 20/20' "$tmp/out")
[ "$n" = 1 ] && ok "one progress line per step" || bad "step 20 printed $n times"
m="$tmp/a/metrics.jsonl"
n=$(grep -c '"step":20,"epoch"' "$m")
[ "$n" = 1 ] && ok "metrics written once" || bad "step 20 in metrics $n times"
grep -q '"ranks":2' "$m" && grep -q '"comm_wait_s"' "$m" &&
  grep -q '"reduce_s"' "$m" && grep -q '"comm_hidden"' "$m" &&
  grep -q '"accuracy"' "$m" && ok "metrics: ranks, accuracy, comm profile" ||
  bad "metrics fields: $(head -1 "$m")"
ls "$tmp/a/ckpt/step_00000020/shard_00001.bin" >/dev/null 2>&1 &&
  grep -q '"world_size":[[:space:]]*2' "$tmp/a/ckpt/step_00000020/manifest.json" &&
  ok "checkpoint of 2 shards" || bad "checkpoint: $(ls "$tmp/a/ckpt"/*)"

# -- the 2-rank checkpoint resumes on one rank.
"$LOOM" train "$SRC/examples/small_mlp.yaml" --set "log.run_dir=$tmp/a" \
  --steps 30 >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && [ -d "$tmp/a/ckpt/step_00000030" ] &&
  ok "resumed on 1 rank from 2 ranks' checkpoint" ||
  { bad "resume on 1 rank (rc $rc)"; cat "$tmp/out"; }

# -- deterministic mode: bitwise equal weights and losses at 1, 2, 4 ranks,
#    with accumulation, for the MLP and (with clipping) a GPT.
# a text of its own (tests/lib.sh): a docs edit must not move the
# comparisons below
seeded_text "$tmp/text.txt" 260000
det=(--resume never --set parallel.deterministic=true
  --set parallel.virtual_shards=4 --set train.accumulate=2
  --set log.every=1 --set log.progress=off)
for model in mlp gpt; do
  if [ $model = mlp ]; then
    cfg=("$SRC/examples/small_mlp.yaml" --set train.batch_size=4
      --set train.steps=12 --set train.eval_every=6)
  else
    cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
      --set train.batch_size=2 --set train.steps=8 --set optim.grad_clip=0.5
      --set train.eval_every=4 --set checkpoint.every=4)
  fi
  ref=""
  for n in 1 2 4; do
    run $n train "${cfg[@]}" "${det[@]}" --set "log.run_dir=$tmp/det_${model}_$n"
    if [ $rc != 0 ]; then
      bad "deterministic $model on $n ranks (rc $rc)"
      cat "$tmp/out"
      continue
    fi
    h=$("$HASH" "$tmp/det_${model}_$n/ckpt")
    # every number the run reported, minus times and rates
    l=$(grep -o '"\(loss\|accuracy\|val_loss\|val_accuracy\|grad_norm\)":[^,}]*' \
      "$tmp/det_${model}_$n/metrics.jsonl" | md5sum)
    if [ -z "$ref" ]; then
      ref="$h $l"
      ok "deterministic $model, 1 rank: params $h"
    elif [ "$h $l" = "$ref" ]; then
      ok "deterministic $model, $n ranks: same params and losses as 1 rank"
    else
      bad "deterministic $model, $n ranks: '$h $l' vs 1 rank '$ref'"
    fi
  done
done

# -- a short last batch that leaves rank 1 empty (60000 = 2727 x 22 + 6),
#    with accumulation: no hang, and the epoch completes.
run 2 train "$SRC/examples/small_mlp.yaml" --resume never \
  --set "log.run_dir=$tmp/tail" --set model.hidden=[8] \
  --set train.batch_size=11 --set train.accumulate=2 --set train.steps=0 \
  --set train.epochs=1 --set data.tail=partial --set train.eval_batches=1 \
  --set train.eval_every=0 --set checkpoint.enabled=false \
  --set log.every=1000 --set log.progress=off
[ $rc = 0 ] && grep -q '^done at step 1364' "$tmp/out" &&
  ok "empty last batch on rank 1: no hang, 1364 steps" ||
  { bad "short last batch (rc $rc)"; tail -5 "$tmp/out"; }

# -- rank 1 runs another config: an error on every rank naming rank 1.
cat >"$tmp/odd.sh" <<EOF
#!/bin/sh
r=\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-0}}
extra=""
[ "\$r" = 1 ] && extra="optim.lr=0.1" || extra="optim.lr=0.05"
exec "$LOOM" train "$SRC/examples/small_mlp.yaml" --resume never \
  --set "log.run_dir=$tmp/odd" --set "\$extra"
EOF
chmod +x "$tmp/odd.sh"
"$LOOM" run -n 2 --timeout 120 "$tmp/odd.sh" >"$tmp/out" 2>&1
rc=$?
n=$(grep -c 'config (loom_config_hash) of rank 1 differs from rank 0' "$tmp/out")
[ $rc != 0 ] && [ $rc != 124 ] && [ "$n" = 2 ] &&
  ok "config differing on rank 1: error on both ranks (rc $rc)" ||
  { bad "config mismatch (rc $rc, $n messages)"; cat "$tmp/out"; }

# -- strategy none on 2 ranks: a config error (exit code 2).
run 2 train "$SRC/examples/small_mlp.yaml" --resume never \
  --set "log.run_dir=$tmp/none" --set parallel.strategy=none
[ $rc = 2 ] && grep -q "strategy 'none' with 2 ranks" "$tmp/out" &&
  ok "strategy none on 2 ranks: config error" ||
  { bad "strategy none (rc $rc)"; cat "$tmp/out"; }

finish ddp_train
