#!/usr/bin/env bash
# Pipeline parallelism (parallel.pp, parallel.micro_batches, pp_schedule,
# parallel.dp) in loom train, a GPT of 3 blocks (6 units: embedding, 3
# blocks, final norm, output layer tied to the embedding, so 2 and 4 stages
# split it unevenly), with accumulation and clipping, 20 steps:
# - pp 2 and pp 4 under gpipe and 1f1b, dp 2 x pp 2, and 4 micro-batches on
#   one rank against one rank without micro-batches (the same global
#   batch): every step's loss and the final parameters within 1e-5;
# - gpipe and 1f1b give the same bits, and so do pp 2 and pp 4 (the
#   latter with its own parallel.pp_split);
# - a run stopped at pp 2 resumes on one rank, and one stopped on one rank
#   resumes at pp 4 (gpipe), each ending within 1e-5 of the whole run;
# - a rank killed at pp 2 is restarted by loom run --max-restarts and ends
#   with the bits of the uninterrupted run;
# - metrics.jsonl has the measured bubble next to the theory;
# - config errors: tp 3 with 2 heads, pp with the mlp, micro-batches that do not
#   divide the batch, a bad pp_split, zero1 with pp, a mesh that does not
#   fit the job.
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: test_pipe.sh DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
head -c 60000 "$SRC/docs/parallel.md" >"$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
  --set model.layers=3 --set train.batch_size=8 --set train.accumulate=2
  --set optim.grad_clip=0.5 --set train.steps=20 --set train.eval_every=10
  --set train.eval_batches=2 --set log.every=1 --set checkpoint.every=0
  --set log.progress=off --quiet)
hashof() { "$HASH" "$1/ckpt" | cut -d' ' -f1-2; }
# RUN against the reference: the largest relative difference of the
# parameters and of any step's loss, both within 1e-5.
close() {
  local d l
  d=$("$HASH" --diff "$tmp/ref/ckpt" "$1/ckpt")
  l=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
      if a and len(a) == len(b) else "none")' "$(loss_steps "$tmp/ref")" "$(loss_steps "$1")")
  awk -v d="$d" -v l="$l" 'BEGIN { exit !(d != "" && d + 0 <= 1e-5 && l != "none" && l + 0 <= 1e-5) }' &&
    ok "$2: parameters within $d, losses within $l of one rank" ||
    bad "$2: parameters differ by '$d', losses by '$l'"
}
pp() { # N PP SCHEDULE M NAME [ARGS...]: a run under loom run
  local n=$1 p=$2 s=$3 m=$4 name=$5
  shift 5
  run "$n" train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/$name" \
    --set parallel.pp="$p" --set parallel.pp_schedule="$s" \
    --set parallel.micro_batches="$m" "$@"
  [ $rc = 0 ] || { bad "$name (rc $rc)"; cat "$tmp/out"; }
}

run 1 train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/ref"
[ $rc = 0 ] || { bad "the one-rank reference (rc $rc)"; cat "$tmp/out"; }

# -- the same global batch through every mesh
pp 1 1 1f1b 4 m4
close "$tmp/m4" "4 micro-batches on one rank"
# pp 4 1f1b with a split of its own (units 1 | 2 | 2 | 1; balanced is
# 2 | 1 | 1 | 2 here): another split, the same arithmetic
for x in "2 gpipe" "2 1f1b" "4 gpipe" "4 1f1b [1,2,2,1]"; do
  set -- $x
  pp "$1" "$1" "$2" 4 "pp$1_$2" ${3:+--set parallel.pp_split=$3}
  close "$tmp/pp$1_$2" "pp $1, $2${3:+ split $3}, 4 micro-batches"
done
# dp 2 x pp 2: the global batch is batch_size x accumulate x dp
pp 4 2 1f1b 2 dp2pp2 --set train.batch_size=4
close "$tmp/dp2pp2" "dp 2 x pp 2, 1f1b, 2 micro-batches"
a=$(hashof "$tmp/pp2_gpipe")
for r in pp2_1f1b pp4_gpipe pp4_1f1b; do
  b=$(hashof "$tmp/$r")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "$r = pp2_gpipe, bit for bit ($b)" ||
    bad "$r '$b' vs pp2_gpipe '$a'"
done
python3 - "$tmp/pp4_1f1b/metrics.jsonl" <<'EOF' && ok "pp 4: bubble measured next to the theory (0.429)" || bad "pp 4: no bubble in metrics.jsonl"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"pp_bubble"' in l][-1]
assert abs(r["pp_bubble_theory"] - 3 / 7) < 1e-6, r
assert 0 <= r["pp_bubble"] <= 1 and len(r["rank_pp_bubble"]) == 4, r
assert r["pp_stages"] == 4 and r["pp_micro_batches"] == 4, r
EOF

# -- resume across meshes, both ways
d="$tmp/rs_pp2_1"
pp 2 2 1f1b 4 rs_pp2_1 --stop-at 7
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto
[ $rc = 0 ] && [ "$("$HASH" "$d/ckpt" | cut -d' ' -f1)" = 20 ] ||
  { bad "pp 2 -> 1 rank: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped at pp 2 (step 7), resumed on one rank"
d="$tmp/rs_1_pp4"
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume never --stop-at 7
run 4 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto \
  --set parallel.pp=4 --set parallel.pp_schedule=gpipe \
  --set parallel.micro_batches=2
[ $rc = 0 ] || { bad "1 rank -> pp 4: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped on one rank (step 7), resumed at pp 4"

# -- a rank killed after step 7 (its neighbour is inside step 8's
#    pipeline): restarted, resumed from step 5, the bits of the whole run
pp 2 2 1f1b 4 whole --set checkpoint.every=5
LOOM_FAULT=1:7:exit:9 "$LOOM" run -n 2 --timeout 120 --max-restarts 1 \
  "$LOOM" train "${cfg[@]}" --resume auto --set "log.run_dir=$tmp/killed" \
  --set checkpoint.every=5 --set parallel.pp=2 --set parallel.micro_batches=4 \
  >"$tmp/out" 2>&1
rc=$?
a=$(hashof "$tmp/whole")
b=$(hashof "$tmp/killed")
[ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "restart" "$tmp/out" &&
  ok "rank 1 killed at pp 2: restarted, the bits of the uninterrupted run ($b)" ||
  { bad "killed at pp 2: '$b' vs '$a' (rc $rc)"; cat "$tmp/out"; }

# -- config errors (exit 2, at loom config check) and a mesh that does not
#    fit the job (at start-up)
G="$SRC/examples/small_gpt.yaml"
for x in "parallel.tp=3 --set parallel.pp=2|does not divide model.heads (2)" \
  "parallel.micro_batches=3|does not divide train.batch_size" \
  "parallel.pp=2 --set parallel.pp_split=[1,2]|parallel.pp is 2 and the model has 5 units" \
  "parallel.pp=2 --set parallel.strategy=zero1|the pipeline supports auto or ddp" \
  "parallel.pp=6|at most one stage a unit" \
  "parallel.pp=2 --set model.name=mlp --set data.dataset=fashion-mnist|supports model gpt"; do
  "$LOOM" config check "$G" --set ${x%%|*} >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -qF "${x#*|}" "$tmp/out" && ok "config check --set ${x%%|*}: rc 2" ||
    { bad "config check --set ${x%%|*}: rc $rc"; cat "$tmp/out"; }
done
run 4 train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/mesh" \
  --set parallel.dp=3 --set parallel.pp=2
[ $rc = 2 ] && grep -q "parallel.dp 3 x parallel.tp 1 x parallel.pp 2 = 6 ranks, but the job has 4" "$tmp/out" &&
  ok "dp 3 x pp 2 on 4 ranks: rc 2, named" || { bad "mesh 3 x 2 on 4 ranks (rc $rc)"; cat "$tmp/out"; }
finish parallel_pipe
