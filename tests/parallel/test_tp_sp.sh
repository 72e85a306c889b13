#!/usr/bin/env bash
# Sequence parallelism (parallel.sequence_parallel) with tensor parallelism
# in loom train, on the GPT of test_tp.sh (tp_lib.sh: 3 blocks, d_model
# 32, 4 heads, accumulation 2, clipping, 20 steps):
# - tp 2, tp 4, dp 2 x tp 2, tp 2 x pp 2, zero1 over dp 2 x tp 2 (and
#   x pp 2), zero2 and zero3 over dp 2 x tp 2 and zero2 over dp 2 x tp 2 x
#   pp 2 against one rank with the same
#   global batch: every step's loss, the last validation loss and the
#   parameters within 1e-5;
# - dp 2 x tp 2 with dropout, activation checkpointing and micro-batches
#   against one rank with dropout (the masks do not depend on tp);
# - a run stopped with sequence parallelism resumes on one rank and under
#   plain tp, and one stopped on one rank resumes at tp 4 with it;
# - parallel.sequence_parallel_regather (the gathered inputs not kept but
#   gathered again in backward) at tp 2, and at tp 4 with dropout;
# - metrics.jsonl: tp_seq_mb (the all-gathers' and reduce-scatters'
#   buffers), tp_sent_mb the same as plain tp's (reduce-scatter + all-gather
#   = all-reduce) but for the whole views' gradient sum, and with regather
#   one all-gather more per column-parallel layer and micro-batch;
# - the activation memory of a tp 2 rank (mem_act_mb, peak_rss_mb) with and
#   without it on a larger context and batch: it falls by what the layout
#   says (a block keeps 6 (B,T,C) tensors without, 2 whole + 6 cut with,
#   6 cut with regather);
# - config errors (exit 2 at loom config check).
. "$(dirname "$0")/tp_lib.sh"
SP=(--set parallel.sequence_parallel=true)

run 1 train "${cfg[@]}" --resume never --set "log.run_dir=$tmp/ref"
[ $rc = 0 ] || { bad "the one-rank reference (rc $rc)"; cat "$tmp/out"; }

# -- the same global batch through every mesh
tp 2 2 tp2 "${SP[@]}"
close "$tmp/tp2" "tp 2, sequence parallel"
tp 4 4 tp4 "${SP[@]}"
close "$tmp/tp4" "tp 4, sequence parallel"
tp 4 2 dp2tp2 --set train.batch_size=4 "${SP[@]}"
close "$tmp/dp2tp2" "dp 2 x tp 2, sequence parallel"
tp 4 2 tp2pp2 --set parallel.pp=2 --set parallel.micro_batches=4 "${SP[@]}"
close "$tmp/tp2pp2" "tp 2 x pp 2 (1f1b, 4 micro-batches), sequence parallel"
# ZeRO-1, -2 and -3 over the replicas: the whole views' parts summed over
# the tp group before the sharded step (under zero2 and zero3 each rank
# holds only its replica's cut of the gradient: the parts in the cut, which
# may end inside a view); zero1 and zero2 with a pipeline too
for z in zero1 zero2 zero3; do
  tp 4 2 "$z" --set train.batch_size=4 --set parallel.strategy=$z "${SP[@]}"
  close "$tmp/$z" "dp 2 x tp 2, $z, sequence parallel"
done
for z in zero1 zero2; do
  tp 8 2 "${z}pp" --set train.batch_size=4 --set parallel.strategy=$z \
    --set parallel.pp=2 --set parallel.micro_batches=2 "${SP[@]}"
  close "$tmp/${z}pp" "dp 2 x tp 2 x pp 2, $z, sequence parallel"
done
# a cut that ends inside a whole view: 1 block of d_model 16, context 64;
# the position embedding (whole) spans [2048, 3072) of a tp 2 rank's part,
# replica 1's cut begins at 2396
cut=(--set model.layers=1 --set model.d_model=16 --set model.context=64)
run 1 train "${cfg[@]}" "${cut[@]}" --resume never --set "log.run_dir=$tmp/cref"
[ $rc = 0 ] || { bad "the one-rank reference, 1 block (rc $rc)"; cat "$tmp/out"; }
tp 4 2 z2cut "${cut[@]}" --set train.batch_size=4 --set parallel.strategy=zero2 "${SP[@]}"
close "$tmp/z2cut" "dp 2 x tp 2, zero2, sequence parallel, a cut inside the position embedding" "$tmp/cref"
tp 4 2 z3cut "${cut[@]}" --set train.batch_size=4 --set parallel.strategy=zero3 "${SP[@]}"
close "$tmp/z3cut" "dp 2 x tp 2, zero3, sequence parallel, a cut inside the position embedding" "$tmp/cref"
RG=("${SP[@]}" --set parallel.sequence_parallel_regather=true)
tp 2 2 rg2 "${RG[@]}"
close "$tmp/rg2" "tp 2, sequence parallel, inputs gathered again in backward"

# -- what is sent: plain tp 2 against sequence-parallel tp 2
tp 2 2 plain
python3 - "$tmp/plain/metrics.jsonl" "$tmp/tp2/metrics.jsonl" "$tmp/rg2/metrics.jsonl" <<'EOF' && ok "tp 2: tp_seq_mb, tp_sent_mb as plain tp's plus the whole views' gradient sum" || bad "tp 2: the sequence-parallel bytes in metrics.jsonl"
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
plain, sp, rg = (last(p) for p in sys.argv[1:])
MiB = 2**20
# a micro-batch: 8 rows x 16 tokens x 32 floats through 4 x 3 blocks + 2
# collectives; 2 micro-batches a step. Plain tp all-reduces each; sequence
# parallelism reduce-scatters and all-gathers each (both counted whole).
n = 8 * 16 * 32 * 4
assert "tp_seq_mb" not in plain, plain
assert sp["tp_seq_mb"] == 2 * 2 * 14 * n / MiB, sp
# all-reduced: the loss's 4 floats a row (both), and the gradients of the
# whole views (sequence parallelism): the position embedding 16 x 32, and
# per block two norms' weights and biases and two biases of 32, ln_f's 64
whole = (16 * 32 + 3 * 6 * 32 + 2 * 32) * 4
assert plain["tp_reduce_mb"] == 2 * (14 * n + 4 * 8 * 16 * 4) / MiB, plain
assert sp["tp_reduce_mb"] == (2 * 4 * 8 * 16 * 4 + whole) / MiB, sp
# sent by a rank at tp 2: an all-reduce of b sends b, an all-gather or a
# reduce-scatter of a whole buffer b sends b / 2
extra = sp["tp_sent_mb"] - plain["tp_sent_mb"]
assert abs(extra - whole / MiB) < 1e-9, (extra, whole / MiB)
print("tp 2 a step: plain all-reduces %.4f MiB, sends %.6f MiB; sequence "
      "parallel gathers/scatters %.4f MiB, all-reduces %.6f MiB, sends "
      "%.6f MiB (+%d bytes: the whole views' gradients)" %
      (plain["tp_reduce_mb"], plain["tp_sent_mb"], sp["tp_seq_mb"],
       sp["tp_reduce_mb"], sp["tp_sent_mb"], whole))
# regather: the inputs of qkv and fc in each block and of the output layer
# all-gathered once more in backward, 2 micro-batches
again = 2 * (2 * 3 + 1) * n
assert rg["tp_seq_mb"] == sp["tp_seq_mb"] + again / MiB, rg
assert abs(rg["tp_sent_mb"] - sp["tp_sent_mb"] - again / 2 / MiB) < 1e-9, rg
print("with regather: gathers/scatters %.4f MiB, sends %.6f MiB" %
      (rg["tp_seq_mb"], rg["tp_sent_mb"]))
EOF

# -- dropout (keyed by the global sample and element: the same masks on
#    any rank's share of the tokens), activation checkpointing (the
#    forward's collectives again in backward) and micro-batches
drop=(--set model.dropout=0.1 --set train.activation_checkpointing=every:2)
run 1 train "${cfg[@]}" "${drop[@]}" --resume never --set "log.run_dir=$tmp/dref"
[ $rc = 0 ] || { bad "the one-rank reference with dropout (rc $rc)"; cat "$tmp/out"; }
tp 4 2 dtp "${drop[@]}" --set train.batch_size=4 --set parallel.micro_batches=2 "${SP[@]}"
close "$tmp/dtp" "dp 2 x tp 2, sequence parallel, with dropout, activation checkpointing, 2 micro-batches" "$tmp/dref"
tp 4 4 dtp4 "${drop[@]}" "${RG[@]}"
close "$tmp/dtp4" "tp 4, sequence parallel with regather, with dropout and activation checkpointing" "$tmp/dref"

# -- resume across meshes
d="$tmp/rs_sp_1"
tp 2 2 rs_sp_1 --stop-at 7 "${SP[@]}"
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto
[ $rc = 0 ] && [ "$("$HASH" "$d/ckpt" | cut -d' ' -f1)" = 20 ] ||
  { bad "tp 2 sequence parallel -> 1 rank: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped at tp 2 with sequence parallelism (step 7), resumed on one rank"
d="$tmp/rs_sp_tp"
tp 4 2 rs_sp_tp --set train.batch_size=4 --stop-at 7 "${SP[@]}"
run 2 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto --set parallel.tp=2
[ $rc = 0 ] || { bad "dp 2 x tp 2 sequence parallel -> plain tp 2: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped at dp 2 x tp 2 with sequence parallelism (step 7), resumed at plain tp 2"
d="$tmp/rs_1_sp"
run 1 train "${cfg[@]}" --set "log.run_dir=$d" --resume never --stop-at 7
run 4 train "${cfg[@]}" --set "log.run_dir=$d" --resume auto --set parallel.tp=4 "${SP[@]}"
[ $rc = 0 ] || { bad "1 rank -> tp 4 sequence parallel: the resumed run (rc $rc)"; cat "$tmp/out"; }
close "$d" "stopped on one rank (step 7), resumed at tp 4 with sequence parallelism"

# -- activation memory of a tp 2 rank: context 128, 16 rows, d_model 64
big=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
  --set model.context=128 --set model.d_model=64 --set model.heads=4
  --set model.layers=3 --set train.batch_size=16 --set train.steps=3
  --set train.eval_every=0 --set log.every=1 --set checkpoint.every=0
  --set log.progress=off --quiet --resume never --set parallel.tp=2)
run 2 train "${big[@]}" --set "log.run_dir=$tmp/mem_tp"
[ $rc = 0 ] || { bad "memory run, plain tp 2 (rc $rc)"; cat "$tmp/out"; }
run 2 train "${big[@]}" --set "log.run_dir=$tmp/mem_sp" "${SP[@]}"
[ $rc = 0 ] || { bad "memory run, tp 2 sequence parallel (rc $rc)"; cat "$tmp/out"; }
run 2 train "${big[@]}" --set "log.run_dir=$tmp/mem_rg" "${RG[@]}"
[ $rc = 0 ] || { bad "memory run, tp 2 sequence parallel, regather (rc $rc)"; cat "$tmp/out"; }
python3 - "$tmp/mem_tp/metrics.jsonl" "$tmp/mem_sp/metrics.jsonl" "$tmp/mem_rg/metrics.jsonl" <<'EOF' && ok "tp 2: activation memory falls with sequence parallelism" || bad "tp 2: activation memory with sequence parallelism"
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
tp, sp, rg = (last(p) for p in sys.argv[1:])
for name, r in (("plain tp 2", tp), ("sequence parallel", sp),
                ("sequence parallel, regather", rg)):
    print("%-28s mem_act_mb %6.2f (%.3fx)  peak_rss_mb %6.1f  tp_sent_mb %.3f" %
          (name, r["mem_act_mb"], r["mem_act_mb"] / tp["mem_act_mb"],
           r["peak_rss_mb"], r["tp_sent_mb"]))
# one (B,T,C) tensor: 16 x 128 x 64 floats, 0.5 MiB; 3 blocks. A block
# keeps 6 of them without (the norms' outputs, the two projections'
# outputs, the two residual sums), half of each with sequence parallelism
# plus the gathered inputs of qkv and fc whole: one fewer at tp 2; with
# regather not those two either
NC = 16 * 128 * 64 * 4 / 2**20
assert tp["mem_act_mb"] - sp["mem_act_mb"] >= 3 * NC - 1e-9, (tp, sp)
assert sp["mem_act_mb"] - rg["mem_act_mb"] >= 3 * 2 * NC - 1e-9, (sp, rg)
EOF

# -- config errors (exit 2, at loom config check)
G="$SRC/examples/small_gpt.yaml"
for x in "parallel.sequence_parallel=true|true with parallel.tp 1: sequence parallelism" \
  "parallel.sequence_parallel=true --set parallel.tp=2 --set model.name=mlp --set data.dataset=fashion-mnist|true with model 'mlp': supported with model gpt only" \
  "parallel.sequence_parallel=true --set parallel.tp=2 --set model.name=cnn --set data.dataset=fashion-mnist|true with model 'cnn': supported with model gpt only" \
  "parallel.sequence_parallel=true --set parallel.tp=2 --set model.context=17|true with model.context 17 and parallel.tp 2" \
  "parallel.sequence_parallel=maybe|parallel.sequence_parallel" \
  "parallel.sequence_parallel_regather=true --set parallel.tp=2|true without parallel.sequence_parallel"; do
  "$LOOM" config check "$G" --set ${x%%|*} >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -qF "${x#*|}" "$tmp/out" && ok "config check --set ${x%%|*}: rc 2" ||
    { bad "config check --set ${x%%|*}: rc $rc"; cat "$tmp/out"; }
done
for x in "parallel.tp=2" "parallel.tp=2 --set parallel.pp=2" "parallel.tp=2 --set parallel.dp=2" \
  "parallel.tp=2 --set parallel.strategy=zero2" "parallel.tp=2 --set parallel.strategy=zero3" \
  "parallel.tp=2 --set parallel.strategy=fsdp" "parallel.tp=2 --set parallel.strategy=zero2 --set parallel.pp=2" \
  "parallel.tp=2 --set parallel.strategy=fsdp --set parallel.pp=2"; do
  "$LOOM" config check "$G" --set parallel.sequence_parallel=true --set $x >"$tmp/out" 2>&1 &&
    ok "config check sequence_parallel with --set $x: accepted" ||
    { bad "config check sequence_parallel with --set $x: rc $?"; cat "$tmp/out"; }
done
finish parallel_tp_sp
