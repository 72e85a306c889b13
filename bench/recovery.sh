#!/usr/bin/env bash
# bench/recovery: time from a SIGKILL of rank 1 to the first training step
# completed after the restart, for kjv-gpt on 2 ranks, loom run beside
# torchrun (bench/torch/recovery.sh, same scenario) measured in the same run;
# REPEAT rounds, medians, with the parts of each.
#   usage: bench/recovery.sh [BUILD_DIR]
# Environment: REPEAT (rounds, default 3), STEPS (12), CKPT_EVERY (5),
# KILL_STEP (8: rank 1 is killed once it completed step KILL_STEP-1, i.e.
# about to run step 8, between the checkpoints of steps 5 and 10), THREADS
# (per rank, 1), TORCH=0 or NO_TORCH=1 (loom only), KEEP=DIR (keep the runs
# there: a new or empty directory, or one this bench made before).
#
# loom's side: loom run -n 2 --max-restarts 1 --restart-delay 0 --report R
# loom train examples/kjv_gpt.yaml; the bench reads rank 1's run status file
# (loom run's LOOM_RUN_DIR, found through TMPDIR) and SIGKILLs the rank from
# outside once it completed step KILL_STEP-1, noting the time. Parts, each
# from the end of the previous one: detect (loom run knew), stop (every
# process of the failed attempt gone), delay (the next launch), start
# (launch -> the last rank's communication ready), load (-> the last rank
# resumed from the checkpoint), first step (-> the last rank completed its
# first step). See docs/run.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: cmake --build $BUILD --target loom" >&2; exit 1; }
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-12}
CKPT_EVERY=${CKPT_EVERY:-5}
KILL_STEP=${KILL_STEP:-8}
THREADS=${THREADS:-1}
if [ -n "${KEEP:-}" ]; then
  work=$KEEP
  bench_own_dir "$work" bench/recovery || exit 2
else
  work=$(mktemp -d /tmp/loom-bench-recovery.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
TEXT="$LOOM_ROOT/data/kjv.txt"
cd "$LOOM_ROOT" # kjv-gpt reads data/kjv.txt
[ -s "$TEXT" ] || "$LOOM" data kjv >&2
bench_check_load
results="$work/results.jsonl"
: >"$results"

# One loom round in $1: prints its result line to $results.
loom_round() {
  local dir=$1
  rm -rf "$dir"
  mkdir -p "$dir/tmp"
  # TMPDIR: loom run makes its LOOM_RUN_DIR there, where the killer finds it.
  TMPDIR="$dir/tmp" "$LOOM" run -n 2 --threads "$THREADS" --max-restarts 1 \
    --restart-delay 0 --report "$dir/report.jsonl" \
    "$LOOM" train examples/kjv_gpt.yaml --steps 1000 --stop-at "$STEPS" --quiet \
    --set checkpoint.every="$CKPT_EVERY" --set checkpoint.dir="$dir/ckpt" \
    --set log.run_dir="$dir/run" --set train.eval_every=0 \
    >"$dir/out.log" 2>"$dir/err.log" &
  local job=$! st="" pid="" f=""
  # Kill rank 1 once it completed step KILL_STEP-1 (its status file says).
  for _ in $(seq 12000); do
    f=$(ls "$dir"/tmp/loom-run-*/attempt-0/rank-1 2>/dev/null | head -1)
    if [ -n "$f" ]; then
      st=$(awk '$1 == "step" { print $2 }' "$f" 2>/dev/null)
      if [ -n "$st" ] && [ "$st" != "-" ] && [ "$st" -ge $((KILL_STEP - 1)) ]; then
        pid=$(awk '$1 == "pid" { print $2 }' "$f")
        kill -9 "$pid"
        date +%s.%N >"$dir/kill_time"
        break
      fi
    fi
    kill -0 $job 2>/dev/null || break
    sleep 0.005
  done
  local rc=0
  wait $job || rc=$?
  if [ ! -s "$dir/kill_time" ] || [ $rc != 0 ]; then
    bench_note "loom round in $dir: rc $rc, killed: $([ -s "$dir/kill_time" ] && echo yes || echo no); see $dir/err.log"
    tail -5 "$dir/err.log" >&2
    return 1
  fi
  grep "^loom run:" "$dir/err.log" | sed 's/^/[loom] /' >&2
  python3 - "$dir" "$STEPS" "$CKPT_EVERY" "$KILL_STEP" "$THREADS" >>"$results" <<'PY'
import json, sys
d, steps, every, kill_step, threads = sys.argv[1], *map(int, sys.argv[2:])
tk = float(open(d + "/kill_time").read())
ev = {}
for line in open(d + "/report.jsonl"):
    e = json.loads(line)
    ev.setdefault(e["event"], e)
r, f = ev["recovered"], ev["failure"]
cr = r["t_comm_ready"] or r["t_spawn"]
ld = r["t_loaded"] or cr
parts = {"detect_s": f["t_detect"] - tk, "stop_s": r["stop_s"], "delay_s": r["delay_s"],
         "start_s": cr - r["t_spawn"], "load_s": ld - cr, "first_step_s": r["t_first_step"] - ld}
print(json.dumps({"bench": "recovery", "impl": "loom", "model": "kjv-gpt", "launcher": "loom run",
                  "procs": 2, "threads": threads, "steps": steps, "ckpt_every": every,
                  "kill_step": kill_step, "failed_rank": f.get("rank"), "signal": f.get("signal"),
                  "resumed_at_step": r["step"], "recovery_s": round(r["t_first_step"] - tk, 4),
                  "parts": {k: round(v, 4) for k, v in parts.items()}}))
PY
}

torch=0
bench_torch_peer && torch=1
for i in $(seq "$REPEAT"); do
  bench_note "round $i of $REPEAT: loom"
  loom_round "$work/loom-$i" || exit 1
  if [ $torch = 1 ]; then
    bench_note "round $i of $REPEAT: torchrun"
    # The peer's own round (its defaults: 12 steps, checkpoints every 5, kill
    # about to run step 8, 1 thread per worker), on the same text.
    bench_torch recovery launch --steps "$STEPS" --ckpt-every "$CKPT_EVERY" \
      --kill-step "$KILL_STEP" --threads "$THREADS" --text "$TEXT" \
      ${KEEP:+--run-dir "$work/torch-$i"} | grep -v '"summary"' >>"$results" || exit 1
  fi
done

echo
echo "# bench/recovery: kjv-gpt, 2 ranks x $THREADS thread(s), SIGKILL of rank 1 about to run step $KILL_STEP (checkpoints every $CKPT_EVERY), $REPEAT round(s), medians"
echo "# load average $(bench_loadavg) on $(nproc) cores"
peer="torchrun ($TORCH_PEER)"
[ $torch = 1 ] || peer="torchrun: ${TORCH_PEER#PyTorch: }"
python3 - "$results" "${BENCH_HEADLINES:-}" "$peer" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
headlines, peer = sys.argv[2], sys.argv[3]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
def side(impl):
    rs = [r for r in recs if r.get("impl") == impl and r.get("recovery_s") is not None]
    if not rs:
        return None, {}, []
    keys = list(rs[0]["parts"])
    return med([r["recovery_s"] for r in rs]), {k: med([r["parts"][k] for r in rs]) for k in keys}, \
        sorted(r["recovery_s"] for r in rs)
lt, lp, lall = side("loom")
tt, tp, tall = side("pytorch")
fmt = lambda x: "-" if x is None else f"{x:.3f}"
print(f"{'':12s} {'total (s)':>10s}  {'runs':>28s}  parts (s)")
if lt is not None:
    print(f"{'loom run':12s} {fmt(lt):>10s}  {' '.join(fmt(x) for x in lall):>28s}  " +
          ", ".join(f"{k[:-2]} {fmt(v)}" for k, v in lp.items()))
if tt is not None:
    print(f"{'torchrun':12s} {fmt(tt):>10s}  {' '.join(fmt(x) for x in tall):>28s}  " +
          ", ".join(f"{k[:-2]} {fmt(v)}" for k, v in tp.items()))
if lt and tt:
    print(f"torchrun / loom: {tt / lt:.2f}x")
if headlines:
    runs = len(lall)
    with open(headlines, "a") as f:
        f.write(f"kjv-gpt, 2 ranks: SIGKILL to 1st step after restart, "
                f"{'median of ' + str(runs) + ' rounds' if runs > 1 else '1 round'}\ts\t"
                f"{fmt(lt)}\t{fmt(tt)}\t{peer}\n")
PY
