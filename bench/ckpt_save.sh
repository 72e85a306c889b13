#!/usr/bin/env bash
# What a checkpoint save costs the training step, sync vs checkpoint.async,
# for fashion-mlp (1 rank) and kjv-gpt (2 ranks): runs each with a save every
# EVERY steps and log.every 1, then reads step_s from metrics.jsonl. A save
# happens after its step's metrics line, so its cost lands in the next
# step's step_s: the "save steps" are those right after a checkpoint step.
#
#   bench/ckpt_save.sh                       # both workloads
#   WORKLOADS=kjv-gpt STEPS=200 bench/ckpt_save.sh
#
# Environment: LOOM (the binary, default build/loom), STEPS (default 120),
# EVERY (default 10), WORKLOADS ("fashion-mlp kjv-gpt"), RUN_DIR (where the
# runs and checkpoints go: a new or empty directory, or one this bench made
# before; default a temporary directory on the disk of the
# current directory, deleted afterwards), THREADS (per rank, default cores /
# ranks). Output: one table row per workload and mode, then the differences.
# Headlines (make bench): per workload, the time a save blocks training with
# async saves beside that with sync saves (loom has no outside peer here).
set -eu
. "$(dirname "$0")/lib.sh"
LOOM=${LOOM:-$LOOM_ROOT/build/loom}
STEPS=${STEPS:-120}
EVERY=${EVERY:-10}
WORKLOADS=${WORKLOADS:-fashion-mlp kjv-gpt}
[ -x "$LOOM" ] || { echo "ckpt_save: no loom binary at $LOOM (set LOOM=)" >&2; exit 2; }
keep_dir=1
if [ -n "${RUN_DIR:-}" ]; then
  bench_own_dir "$RUN_DIR" bench/ckpt_save || exit 2
else
  RUN_DIR=$(mktemp -d "$PWD/ckpt_save.XXXXXX")
  keep_dir=0
fi
trap '[ $keep_dir = 1 ] || rm -rf "$RUN_DIR"' EXIT
bench_check_load

results="$RUN_DIR/results.txt"
: >"$results"
for w in $WORKLOADS; do
  case $w in
  fashion-mlp) cfg=$LOOM_ROOT/examples/fashion_mlp.yaml ranks=1 ;;
  kjv-gpt) cfg=$LOOM_ROOT/examples/kjv_gpt.yaml ranks=2 ;;
  *) echo "ckpt_save: unknown workload '$w' (fashion-mlp, kjv-gpt)" >&2; exit 2 ;;
  esac
  t=${THREADS:-$(( $(nproc) / ranks ))}
  [ "$t" -ge 1 ] || t=1
  for mode in sync async; do
    dir="$RUN_DIR/$w-$mode"
    async=false
    [ $mode = async ] && async=true
    bench_note "$w, $ranks rank(s) x $t thread(s), $mode saves every $EVERY steps, $STEPS steps"
    LOOM_THREADS=$t OMP_NUM_THREADS=$t "$LOOM" run -n "$ranks" "$LOOM" train "$cfg" \
      --resume never --set train.epochs=0 --set "train.steps=$STEPS" \
      --set train.eval_every=0 --set train.eval_batches=1 \
      --set "checkpoint.every=$EVERY" --set "checkpoint.async=$async" \
      --set checkpoint.keep=2 --set log.every=1 --set log.progress=off \
      --set "log.run_dir=$dir" >"$dir.log" 2>&1 ||
      { cat "$dir.log" >&2; exit 1; }
    bytes=$(du -sb "$dir/ckpt/step_$(printf %08d "$STEPS")" | cut -f1)
    echo "$w $ranks $mode $EVERY $bytes $dir/metrics.jsonl" >>"$results"
  done
done

python3 - "$results" "${BENCH_HEADLINES:-}" <<'EOF'
import json, statistics, sys

# step ms: median step_s of steps without a save; save step ms: of the steps
# that carry one; cost: their difference; blocked ms: median ckpt_s, the time
# the training thread spent in the save itself (rank 0).
rows = [l.split() for l in open(sys.argv[1])]
print(f"{'workload':<12} {'ranks':>5} {'mode':<5} {'ckpt MB':>7} {'step ms':>8} "
      f"{'save step ms':>12} {'cost ms':>8} {'blocked ms':>10} {'saves':>5}")
by = {}
for w, ranks, mode, every, nbytes, path in rows:
    every = int(every)
    plain, saved, blocked = [], [], []
    for line in open(path):
        m = json.loads(line)
        if "step_s" not in m:
            continue
        k = m["step"]
        if k <= 2:  # warm-up: first touches, thread start
            continue
        if "ckpt_s" in m:
            blocked.append(m["ckpt_s"] * 1e3)
        (saved if (k - 1) % every == 0 else plain).append(m["step_s"] * 1e3)
    med, med_s = statistics.median(plain), statistics.median(saved)
    blk = statistics.median(blocked)
    by[(w, mode)] = (med, med_s, blk)
    print(f"{w:<12} {ranks:>5} {mode:<5} {int(nbytes) / 1e6:>7.1f} {med:>8.2f} "
          f"{med_s:>12.2f} {med_s - med:>8.2f} {blk:>10.2f} {len(saved):>5}")
for w in dict.fromkeys(k[0] for k in by):
    if (w, "sync") in by and (w, "async") in by:
        (a, b, x), (c, d, y) = by[(w, "sync")], by[(w, "async")]
        print(f"{w}: a save blocks training {x:.2f} ms sync, {y:.2f} ms async; "
              f"step time with a save {b - a:+.2f} ms sync, {d - c:+.2f} ms "
              f"async (median steps {a:.2f} / {c:.2f} ms)")
        if sys.argv[2]:
            ranks = next(r[1] for r in rows if r[0] == w)
            with open(sys.argv[2], "a") as f:
                f.write(f"{w}, {ranks} rank{'s' if ranks != '1' else ''}: a save blocks training, "
                        f"async\tms\t{y:.2f}\t{x:.2f}\tloom, sync saves\n")
EOF
