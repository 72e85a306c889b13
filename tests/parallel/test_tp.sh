#!/usr/bin/env bash
# Tensor parallelism (parallel.tp, with parallel.dp) in loom train, the GPT
# of the pipeline tests (3 blocks, d_model 32) with 4 heads, accumulation
# and clipping, 20 steps:
# - tp 2, tp 4, dp 2 x tp 2, tp 2 x pp 2 and dp 2 x tp 2 x pp 2 against
#   one rank with the same global batch: every step's loss, the final
#   validation loss and the parameters within 1e-5 (the checkpoints, in the
#   canonical layout whatever the mesh);
# - the same with dropout, activation checkpointing and micro-batches
#   (dropout masks do not depend on tp);
# - a run stopped at dp 2 x tp 2 resumes on one rank, one stopped on one
#   rank resumes at tp 4, one stopped at tp 2 x pp 2 on one rank and the
#   reverse, each within 1e-5 of the whole run;
# - a rank killed at tp 2 is restarted by loom run --max-restarts and ends
#   with the bits of the uninterrupted run;
# - metrics.jsonl: tp_size, tp_wait_s, tp_reduce_mb (4 layers + 2
#   reductions of a micro-batch's activations, 4 rows' floats a row for the
#   loss: 0.44140625 MiB a step here), and a tp 2 rank's parameters at most
#   0.55 x a whole model's;
# - config errors (exit 2 at loom config check) and a mesh that does not
#   fit the job (at start-up).
. "$(dirname "$0")/tp_lib.sh"
run 1 train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/ref"
[ $rc = 0 ] || { bad "the one-rank reference (rc $rc)"; cat "$tmp/out"; }

# -- the same global batch through every mesh
tp 2 2 tp2
close "$tmp/tp2" "tp 2"
tp 4 4 tp4
close "$tmp/tp4" "tp 4"
# dp 2 x tp 2: the global batch is batch_size x accumulate x dp
tp 4 2 dp2tp2 --set train.batch_size=4
close "$tmp/dp2tp2" "dp 2 x tp 2"
# tp x pp: each stage's part cut over its tp group; and the three together
tp 4 2 tp2pp2 --set parallel.pp=2 --set parallel.micro_batches=4
close "$tmp/tp2pp2" "tp 2 x pp 2 (1f1b, 4 micro-batches)"
tp 8 2 dp2tp2pp2 --set parallel.pp=2 --set parallel.micro_batches=2 \
  --set train.batch_size=4
close "$tmp/dp2tp2pp2" "dp 2 x tp 2 x pp 2 (1f1b, 2 micro-batches)"
python3 - "$tmp/ref/metrics.jsonl" "$tmp/tp2/metrics.jsonl" "$tmp/dp2tp2/metrics.jsonl" <<'EOF' && ok "tp 2: tp keys in metrics.jsonl (0.44140625 MiB reduced a step), parameters a rank <= 0.55 x the whole model's" || bad "tp 2: metrics.jsonl's tp keys or parameter memory"
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
ref, tp2, dp2 = (last(p) for p in sys.argv[1:])
assert tp2["tp_size"] == 2 and tp2["dp_replicas"] == 1, tp2
# a micro-batch: 8 rows x 16 tokens x 32 floats, 4 x 3 blocks + 2 times,
# and 4 floats a row for the loss; 2 micro-batches a step
assert tp2["tp_reduce_mb"] == 2 * (14 * 8 * 16 * 32 + 4 * 8 * 16) * 4 / 2**20, tp2
assert 0 <= tp2["tp_wait_s"] <= tp2["step_s"], tp2
assert dp2["tp_size"] == 2 and dp2["dp_replicas"] == 2, dp2
ratio = tp2["mem_params_mb"] / ref["mem_params_mb"]
assert 0.4 < ratio <= 0.55, ratio
print("parameters a rank: %.4f of %.4f MiB (%.3f)" % (tp2["mem_params_mb"], ref["mem_params_mb"], ratio))
EOF
# dropout (masks keyed by the global sample and element: the same at any
# tp), activation checkpointing (the forward's reductions run again in
# backward) and micro-batches
drop=(--set model.dropout=0.1 --set train.activation_checkpointing=every:2)
run 1 train "${cfg[@]}" "${drop[@]}" --resume never --set "log.run_dir=$tmp/dref"
[ $rc = 0 ] || { bad "the one-rank reference with dropout (rc $rc)"; cat "$tmp/out"; }
tp 4 2 dtp "${drop[@]}" --set train.batch_size=4 --set parallel.micro_batches=2
close "$tmp/dtp" "dp 2 x tp 2 with dropout, activation checkpointing, 2 micro-batches" "$tmp/dref"

# -- resume across meshes, both ways
d="$tmp/rs_tp_1"
tp 4 2 rs_tp_1 --set train.batch_size=4 --stop-at 7
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto
[ $rc = 0 ] && [ "$("$HASH" "$d/ckpt" | cut -d' ' -f1)" = 20 ] ||
  { bad "dp 2 x tp 2 -> 1 rank: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped at dp 2 x tp 2 (step 7), resumed on one rank"
d="$tmp/rs_1_tp4"
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume never --stop-at 7
run 4 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto --set parallel.tp=4
[ $rc = 0 ] || { bad "1 rank -> tp 4: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped on one rank (step 7), resumed at tp 4"
d="$tmp/rs_tppp_1"
tp 4 2 rs_tppp_1 --set parallel.pp=2 --set parallel.micro_batches=4 --stop-at 7
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto
[ $rc = 0 ] || { bad "tp 2 x pp 2 -> 1 rank: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped at tp 2 x pp 2 (step 7), resumed on one rank"
d="$tmp/rs_1_tppp"
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume never --stop-at 7
run 4 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto --set parallel.tp=2 \
  --set parallel.pp=2 --set parallel.micro_batches=2 --set parallel.pp_schedule=gpipe
[ $rc = 0 ] || { bad "1 rank -> tp 2 x pp 2: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped on one rank (step 7), resumed at tp 2 x pp 2 (gpipe)"

# -- a rank killed after step 7: restarted, resumed from step 5, the bits
#    of the whole run
tp 2 2 whole --set checkpoint.every=5
LOOM_FAULT=1:7:exit:9 "$LOOM" run -n 2 --timeout 120 --max-restarts 1 \
  "$LOOM" train "${cfg[@]}" --resume auto --set "log.run_dir=$tmp/killed" \
  --set checkpoint.every=5 --set parallel.tp=2 >"$tmp/out" 2>&1
rc=$?
a=$(hashof "$tmp/whole")
b=$(hashof "$tmp/killed")
[ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "restart" "$tmp/out" &&
  ok "rank 1 killed at tp 2: restarted, the bits of the uninterrupted run ($b)" ||
  { bad "killed at tp 2: '$b' vs '$a' (rc $rc)"; cat "$tmp/out"; }

# -- config errors (exit 2, at loom config check) and a mesh that does not
#    fit the job (at start-up)
G="$SRC/examples/small_gpt.yaml"
for x in "parallel.tp=2 --set model.name=mlp --set data.dataset=fashion-mnist|model 'mlp' supports 1" \
  "parallel.tp=2 --set model.name=cnn --set data.dataset=fashion-mnist|model 'cnn' supports 1" \
  "parallel.tp=4|does not divide model.heads (2)" \
  "parallel.tp=2 --set parallel.deterministic=true|tensor parallelism supports false"; do
  "$LOOM" config check "$G" --set ${x%%|*} >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -qF "${x#*|}" "$tmp/out" && ok "config check --set ${x%%|*}: rc 2" ||
    { bad "config check --set ${x%%|*}: rc $rc"; cat "$tmp/out"; }
done
for s in auto fsdp; do
  "$LOOM" config check "$G" --set parallel.tp=2 --set parallel.pp=2 --set parallel.strategy=$s >"$tmp/out" 2>&1 &&
    ok "config check --set parallel.tp=2 --set parallel.pp=2 --set parallel.strategy=$s: accepted" ||
    { bad "config check --set parallel.tp=2 --set parallel.pp=2 --set parallel.strategy=$s: rc $?"; cat "$tmp/out"; }
done
run 4 train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/mesh" \
  --set parallel.dp=3 --set parallel.tp=2
[ $rc = 2 ] && grep -q "parallel.dp 3 x parallel.tp 2 x parallel.pp 1 = 6 ranks, but the job has 4" "$tmp/out" &&
  ok "dp 3 x tp 2 on 4 ranks: rc 2, named" || { bad "mesh 3 x 2 on 4 ranks (rc $rc)"; cat "$tmp/out"; }
run 3 train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/mesh3" \
  --set parallel.tp=2
[ $rc = 2 ] && grep -q "parallel.tp 2 x parallel.pp 1 does not divide the job's 3 ranks" "$tmp/out" &&
  ok "tp 2 on 3 ranks: rc 2, named" || { bad "tp 2 on 3 ranks (rc $rc)"; cat "$tmp/out"; }
finish parallel_tp
