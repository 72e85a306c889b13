#!/usr/bin/env bash
# ZeRO-1 over the replicas of a tensor-parallel mesh (parallel.strategy
# zero1 with parallel.tp), dp 2 x tp 2, the GPT of test_tp.sh with
# accumulation and clipping, 20 steps:
# - the bits of DDP on the same mesh (every loss, the checkpoint), with
#   half of DDP's optimizer memory a rank (mem_optim_mb);
# - stopped at step 7 and resumed: under zero1 and under ddp, and a DDP
#   run resumed under zero1, each with the bits of the uninterrupted run;
#   resumed on one rank, within 1e-5 of the one-rank run;
# - a rank killed at step 7 is restarted by loom run --max-restarts and
#   ends with the bits of the uninterrupted run;
# - loom estimate's zero1 row: half the optimizer, the gather sent;
# - dp 2 x tp 2 x pp 2 under zero1: the bits of ddp on that mesh, and a
#   stopped run resumed with them;
# - zero2 (the DDP keeps the reduced gradient of the replica's cut):
#   ddp's bits without clipping, within 1e-6 with it (the norm is summed
#   from the cuts), less gradient memory, and a stopped run resumed with
#   the bits of the straight one
#   (zero3 with tp: test_tp_zero3.sh; zero2 and zero3 with a pipeline:
#   test_pipe_zero.sh, test_pipe_zero3.sh).
. "$(dirname "$0")/../lib.sh"
HASH=${1:?usage: test_tp_zero.sh DDP_CKPT_HASH}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT=60 LOOM_LOG=warn
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
seeded_text "$tmp/text.txt"
cfg=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt"
  --set model.layers=3 --set model.heads=4 --set train.batch_size=4
  --set train.accumulate=2 --set optim.grad_clip=0.5 --set train.steps=20
  --set log.every=1 --set checkpoint.every=0 --set log.progress=off --quiet)
hashof() { "$HASH" "$1/ckpt" | cut -d' ' -f1-2; }

tp_mesh ddp ddp --resume never
tp_mesh z1 zero1 --resume never
same "$tmp/z1" "$tmp/ddp" "dp 2 x tp 2, zero1"
python3 - "$tmp/ddp/metrics.jsonl" "$tmp/z1/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert z["mem_params_mb"] == d["mem_params_mb"], (z, d)
ratio = z["mem_optim_mb"] / d["mem_optim_mb"]
assert 0.49 < ratio < 0.51, ratio
print("optimizer state a rank: %.4f MiB under zero1, %.4f under ddp (%.3f)"
      % (z["mem_optim_mb"], d["mem_optim_mb"], ratio))
EOF
  ok "zero1: half of ddp's optimizer state a rank" || bad "zero1: optimizer memory"

# -- stopped at step 7 and resumed: the checkpoint is canonical, so the
#    strategy may change on resume
tp_mesh rs_z1 zero1 --resume never --stop-at 7
tp_mesh rs_z1 zero1 --resume auto
same "$tmp/rs_z1" "$tmp/z1" "zero1 stopped at step 7, resumed under zero1"
tp_mesh rs_z1d zero1 --resume never --stop-at 7
tp_mesh rs_z1d ddp --resume auto
same "$tmp/rs_z1d" "$tmp/ddp" "zero1 stopped at step 7, resumed under ddp"
tp_mesh rs_dz1 ddp --resume never --stop-at 7
tp_mesh rs_dz1 zero1 --resume auto
same "$tmp/rs_dz1" "$tmp/z1" "ddp stopped at step 7, resumed under zero1"
run 1 train "${cfg[@]}" --set train.batch_size=8 --resume never --set "log.run_dir=$tmp/one"
[ $rc = 0 ] || { bad "the one-rank run (rc $rc)"; cat "$tmp/out"; }
tp_mesh rs_1 zero1 --resume never --stop-at 7
run 1 train "${cfg[@]}" --set train.batch_size=8 --resume auto --set "log.run_dir=$tmp/rs_1"
[ $rc = 0 ] || { bad "zero1 -> one rank (rc $rc)"; cat "$tmp/out"; }
d=$("$HASH" --diff "$tmp/one/ckpt" "$tmp/rs_1/ckpt")
awk -v d="$d" 'BEGIN { exit !(d != "" && d + 0 <= 1e-5) }' &&
  ok "zero1 at dp 2 x tp 2 stopped at step 7, resumed on one rank: parameters within $d of the one-rank run" ||
  bad "zero1 -> one rank: parameters differ by '$d'"

# -- a rank killed after step 7: restarted, resumed from step 5
tp_mesh whole zero1 --resume never --set checkpoint.every=5
tp_mesh_killed zero1 "$tmp/whole"

# -- zero2: the reduced gradient of the cut only
tp_mesh z2 zero2 --resume never
d=$("$HASH" --diff "$tmp/ddp/ckpt" "$tmp/z2/ckpt")
awk -v d="$d" 'BEGIN { exit !(d != "" && d + 0 <= 1e-6) }' &&
  ok "dp 2 x tp 2 zero2 with clipping: parameters within $d of ddp ($(hashof "$tmp/z2"), ddp $(hashof "$tmp/ddp"))" ||
  bad "zero2 with clipping: '$d' from ddp"
tp_mesh nc_ddp ddp --resume never --set optim.grad_clip=0
tp_mesh nc_z2 zero2 --resume never --set optim.grad_clip=0
same "$tmp/nc_z2" "$tmp/nc_ddp" "dp 2 x tp 2 zero2 without clipping"
python3 - "$tmp/ddp/metrics.jsonl" "$tmp/z2/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
assert z["mem_grads_mb"] < d["mem_grads_mb"], (z["mem_grads_mb"], d["mem_grads_mb"])
assert z["peak_rss_mb"] < d["peak_rss_mb"] + 1, (z["peak_rss_mb"], d["peak_rss_mb"])
assert 0.49 < z["mem_optim_mb"] / d["mem_optim_mb"] < 0.51
print("gradients a rank: %.4f MiB under zero2, %.4f under ddp" % (z["mem_grads_mb"], d["mem_grads_mb"]))
EOF
  ok "zero2: less gradient memory than ddp, half its optimizer state" || bad "zero2: memory"
tp_mesh rs_z2 zero2 --resume never --stop-at 7
tp_mesh rs_z2 zero2 --resume auto
same "$tmp/rs_z2" "$tmp/z2" "zero2 stopped at step 7, resumed under zero2"

# -- one replica (tp 2 on 2 ranks): zero1 and zero2 are ddp over a group
#    of one, and give its bits; a stopped zero2 run resumes with them
one=(--set train.batch_size=8)
run 2 train "${cfg[@]}" "${one[@]}" --resume never --set parallel.tp=2 --set "log.run_dir=$tmp/t_ddp"
for s in zero1 zero2; do
  run 2 train "${cfg[@]}" "${one[@]}" --resume never --set parallel.tp=2 \
    --set parallel.strategy=$s --set "log.run_dir=$tmp/t_$s" --stop-at 7
  run 2 train "${cfg[@]}" "${one[@]}" --resume auto --set parallel.tp=2 \
    --set parallel.strategy=$s --set "log.run_dir=$tmp/t_$s"
  [ $rc = 0 ] || { bad "tp 2 $s, one replica (rc $rc)"; cat "$tmp/out"; }
  same "$tmp/t_$s" "$tmp/t_ddp" "tp 2 on 2 ranks (one replica) $s, stopped at step 7 and resumed"
done

# -- dp 2 x tp 2 x pp 2: each replica steps its cut of its tp part of the
#    stage's range
pp=(--set parallel.pp=2 --set parallel.micro_batches=2 --set train.batch_size=4)
run 8 train "${cfg[@]}" "${pp[@]}" --resume never --set parallel.tp=2 --set "log.run_dir=$tmp/p_ddp"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 ddp (rc $rc)"; cat "$tmp/out"; }
run 8 train "${cfg[@]}" "${pp[@]}" --resume never --set parallel.tp=2 \
  --set parallel.strategy=zero1 --set "log.run_dir=$tmp/p_z1" --stop-at 7
run 8 train "${cfg[@]}" "${pp[@]}" --resume auto --set parallel.tp=2 \
  --set parallel.strategy=zero1 --set "log.run_dir=$tmp/p_z1"
[ $rc = 0 ] || { bad "dp 2 x tp 2 x pp 2 zero1 (rc $rc)"; cat "$tmp/out"; }
same "$tmp/p_z1" "$tmp/p_ddp" "dp 2 x tp 2 x pp 2 zero1, stopped at step 7 and resumed"
python3 - "$tmp/p_ddp/metrics.jsonl" "$tmp/p_z1/metrics.jsonl" <<'EOF' &&
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
d, z = (last(p) for p in sys.argv[1:])
ratio = z["mem_optim_mb"] / d["mem_optim_mb"]
assert 0.49 < ratio < 0.51, ratio
EOF
  ok "dp 2 x tp 2 x pp 2 zero1: half of ddp's optimizer state on rank 0" ||
  bad "dp 2 x tp 2 x pp 2 zero1: optimizer memory"

# -- loom estimate: the zero1 row holds half the optimizer state and sends
#    the parameters' gather ((D-1)/D of the rank's part) more than ddp
"$LOOM" estimate "${cfg[@]:0:13}" --set parallel.tp=2 -n 4 --set train.batch_size=64 \
  --set model.d_model=256 >"$tmp/est" 2>&1
part=$(sed -n 's/.*(\([0-9]*\) parameters); .*/\1/p' "$tmp/est")
awk -v p="$part" '$1 == "ddp" { od = $5; sd = $11 } $1 == "zero1" { oz = $5; sz = $11 }
  END { g = p * 4 / 2 / 1048576; exit !(p > 0 && oz - od / 2 < 0.11 && od / 2 - oz < 0.11 &&
        (sz - sd) - g < 0.11 && g - (sz - sd) < 0.11) }' "$tmp/est" &&
  ok "loom estimate, dp 2 x tp 2: zero1 $(awk '$1 == "zero1" { print $5 " MiB of optimizer, sends " $11 }' "$tmp/est") MiB" ||
  { bad "loom estimate's zero1 row"; cat "$tmp/est"; }

finish parallel_tp_zero
