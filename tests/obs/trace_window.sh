#!/usr/bin/env bash
# log.trace's step window and size cap: log.trace_start/trace_steps record
# only those steps (every thread: the step's spans, module spans, the comm
# thread's collectives, counters; the evaluation and checkpoint after a
# step with it), the file's header is written regardless and the ranks
# merge (DDP, ZeRO-3, a pipeline of pp 2); log.trace_every repeats the
# window; a resumed run counts on from its checkpoint; log.trace_max_mb stops
# a rank's file at the cap (never past it) with a loom_capped record, one
# warning naming the file, the cap, the step and the key, the merge naming
# it, and training untouched (the same losses as without a trace);
# LOOM_TRACE=DIR honours the keys; config check refuses bad values and the
# keys without log.trace (exit 2, naming what is supported).
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
seeded_text "$tmp/text.txt" 40000
gpt=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=2
  --set model.d_model=32 --set model.heads=2 --set model.context=16 --set train.batch_size=4
  --set log.every=1 --set train.eval_batches=2 --set parallel.strategy=ddp
  --set parallel.bucket_mb=0.01 --quiet)

# RUN RANKS STEPS: each rank file of RUN/trace holds the train spans of
# exactly STEPS (comma separated), and every event after the header lies
# inside a window: between a loom_window_open marker (or the file's start
# when the window starts at step 0) and the next loom_window_close; module
# spans and comm spans are there. Extra checks by name in $want.
check_steps() {
  python3 - "$1" "$2" "$3" "${want:-}" <<'PY' >"$tmp/check" 2>&1
import json, sys
run, ranks, steps, want = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
steps = {int(s) for s in steps.split(",")}
def check(cond, msg):
    print(("ok: " if cond else "FAILED: ") + msg)
for rank in range(ranks):
    path = f"{run}/trace/rank-{rank}.json"
    ev = json.load(open(path))
    names = [e.get("name") for e in ev]
    check("loom_clock" in names and "process_name" in names and names[-1] == "loom_end",
          f"rank {rank}: the header and the closing record")
    if ranks > 1:
        check("loom_clock_sync" in names, f"rank {rank}: the clock sync record")
    train = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "train"
             and "step" in e.get("args", {})]
    got = {e["args"]["step"] for e in train}
    check(got == steps, f"rank {rank}: train spans of steps {sorted(got)}, want {sorted(steps)}")
    for s in steps:
        kinds = {e["name"] for e in train if e["args"]["step"] == s}
        check({"data wait", "forward", "backward", "optimizer"} <= kinds,
              f"rank {rank}: step {s}: {sorted(kinds)}")
    # The windows as the markers say: [open ts, close ts), the first from
    # the file's start when no open marker precedes a close.
    marks = sorted((e["ts"], e["name"], e["args"].get("step")) for e in ev
                   if e.get("name") in ("loom_window_open", "loom_window_close"))
    wins, t_open = [], None if (marks and marks[0][1] == "loom_window_open") else -1e300
    for ts, name, _ in marks:
        if name == "loom_window_open":
            t_open = ts
        elif t_open is not None:
            wins.append((t_open, ts))
            t_open = None
    if t_open is not None:
        wins.append((t_open, 1e300))
    timed = [e for e in ev if "ts" in e and e.get("name") not in
             ("loom_window_open", "loom_window_close", "loom_capped")]
    outside = [e for e in timed if not any(a <= e["ts"] and e["ts"] + e.get("dur", 0) <= b + 1e-3
                                           for a, b in wins)]
    check(timed and not outside, f"rank {rank}: {len(timed)} events, all inside the "
          f"{len(wins)} window(s) the markers say; outside: {[(e['name'], e['ts']) for e in outside[:3]]}")
    opened = sorted(m[2] for m in marks if m[1] == "loom_window_open")
    check(all(s in steps for s in opened), f"rank {rank}: windows open at steps {opened}")
    mods = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("forward", "backward")]
    check(ranks == 1 or any(e.get("cat") == "comm" for e in ev) or "pp" in run,
          f"rank {rank}: comm spans")
    check("pp" in run or len(mods) >= 2 * len(steps), f"rank {rank}: {len(mods)} module spans")
    for w in want.split(";"):
        if not w:
            continue
        name, n = w.split("=")
        k = sum(1 for e in ev if e.get("name") == name and e.get("ph") in ("X", "C"))
        check(k == int(n), f"rank {rank}: {k} '{name}' events, want {n}")
PY
  grep -c '^ok' "$tmp/check" | xargs -I{} echo "$4: {} checks passed"
  grep -q FAILED "$tmp/check" && { bad "$4:"; grep -v '^ok' "$tmp/check"; }
  grep -q '^ok' "$tmp/check" || { bad "$4: no checks ran"; cat "$tmp/check"; }
}
merges() { # RUN RANKS WHAT
  "$LOOM" report --trace "$1" >"$tmp/rep" 2>&1 && grep -q "$2 rank" "$tmp/rep" &&
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1/trace.json" &&
    ok "$3: report --trace merges: $(cat "$tmp/rep")" || { bad "$3: report --trace"; cat "$tmp/rep"; }
}

# A window of steps 3..5 of 10 on 2 ranks (DDP): the evaluation after step
# 4 (eval_every 5) and the checkpoint after step 5 (checkpoint.every 3) are
# in it, the checkpoint after step 2 and the final evaluation (step 9) not;
# a memory counter after each of its steps.
run 2 train "${gpt[@]}" --set train.steps=10 --set train.eval_every=5 --set checkpoint.every=3 \
  --set log.trace=true --set log.trace_start=3 --set log.trace_steps=3 --set "log.run_dir=$tmp/win"
[ $rc = 0 ] || { bad "window 3..5 (rc $rc)"; cat "$tmp/out"; }
want="evaluation=1;checkpoint=1;memory=3" check_steps "$tmp/win" 2 3,4,5 "window 3..5 of 10, 2 ranks"
merges "$tmp/win" 2 "window 3..5"

# ZeRO-3 (parameters gathered unit by unit on the comm thread), window
# 2..3 of 6.
run 2 train "${gpt[@]}" --set parallel.strategy=zero3 --set train.steps=6 --set train.eval_every=100 \
  --set checkpoint.enabled=false --set log.trace=true --set log.trace_start=2 --set log.trace_steps=2 \
  --set "log.run_dir=$tmp/zero3"
[ $rc = 0 ] || { bad "zero3 window (rc $rc)"; cat "$tmp/out"; }
want="evaluation=0;memory=2" check_steps "$tmp/zero3" 2 2,3 "zero3, window 2..3 of 6"
merges "$tmp/zero3" 2 "zero3 window"

# trace_every: 2 steps every 5 from step 1 of 12 (1, 2, 6, 7, 11), with
# LOOM_TRACE=DIR choosing the directory; on one rank.
LOOM_TRACE="$tmp/every/trace" "$LOOM" train "${gpt[@]}" --set train.steps=12 --set train.eval_every=100 \
  --set checkpoint.enabled=false --set log.trace=true --set log.trace_start=1 --set log.trace_steps=2 \
  --set log.trace_every=5 --set "log.run_dir=$tmp/every_run" >"$tmp/out" 2>&1 ||
  { bad "trace_every run"; cat "$tmp/out"; }
want="evaluation=1;memory=5" check_steps "$tmp/every" 1 1,2,6,7,11 "every 5 from step 1, 2 steps, LOOM_TRACE"
merges "$tmp/every" 1 "trace_every"

# A resumed run counts on from its checkpoint: 4 steps, then resumed to 8
# with the window at steps 5..6.
"$LOOM" train "${gpt[@]}" --set train.steps=4 --set train.eval_every=100 --set "log.run_dir=$tmp/res" \
  >"$tmp/out" 2>&1 || { bad "resume: first part"; cat "$tmp/out"; }
"$LOOM" train "${gpt[@]}" --set train.steps=8 --set train.eval_every=100 --set log.trace=true \
  --set log.trace_start=5 --set log.trace_steps=2 --set "log.run_dir=$tmp/res" >"$tmp/out" 2>&1 ||
  { bad "resume: second part"; cat "$tmp/out"; }
want="evaluation=0" check_steps "$tmp/res" 1 5,6 "resumed at step 4, window 5..6"

# A pipeline (pp 2, 1F1B), window 1..2 of 4: both ranks, merged.
run 2 train "${gpt[@]}" --set parallel.strategy=auto --set parallel.pp=2 --set parallel.micro_batches=2 \
  --set train.steps=4 --set train.eval_every=100 --set checkpoint.enabled=false --set log.trace=true \
  --set log.trace_start=1 --set log.trace_steps=2 --set "log.run_dir=$tmp/pp"
[ $rc = 0 ] || { bad "pp 2 window (rc $rc)"; cat "$tmp/out"; }
want="evaluation=0" check_steps "$tmp/pp" 2 1,2 "pp 2, window 1..2 of 4"
merges "$tmp/pp" 2 "pp 2 window"

# The cap: 0.05 MB (52,428 bytes) over 40 steps on 2 ranks (about 2.5 KB a
# step a rank: reached near step 20). Each file ends at most at the cap
# (what is buffered counts: nothing is written past it) and within 4 KiB
# below it, holds the loom_capped record (step, cap) and the closing
# record; each rank warns once; the merge names the capped files; the
# losses are those of a run without a trace, bit for bit.
cap=0.05
run 2 train "${gpt[@]}" --set train.steps=40 --set train.eval_every=100 --set checkpoint.enabled=false \
  --set log.trace=true --set log.trace_max_mb=$cap --set "log.run_dir=$tmp/cap"
[ $rc = 0 ] || { bad "capped run (rc $rc)"; cat "$tmp/out"; }
cp "$tmp/out" "$tmp/cap_out"
run 2 train "${gpt[@]}" --set train.steps=40 --set train.eval_every=100 --set checkpoint.enabled=false \
  --set "log.run_dir=$tmp/nocap"
[ $rc = 0 ] || { bad "untraced run (rc $rc)"; cat "$tmp/out"; }
for r in 0 1; do
  f="$tmp/cap/trace/rank-$r.json"
  size=$(stat -c %s "$f" 2>/dev/null || echo 0)
  python3 - "$f" "$cap" <<'PY' >"$tmp/check" 2>&1
import json, sys
path, cap = sys.argv[1], int(float(sys.argv[2]) * 1024 * 1024)
ev = json.load(open(path))
size = len(open(path, "rb").read())
c = [e for e in ev if e.get("name") == "loom_capped"]
assert size <= cap, f"{size} bytes, past the cap of {cap}"
assert size > cap - 4096, f"{size} bytes: stopped {cap - size} bytes before the cap of {cap}"
assert len(c) == 1 and c[0]["args"]["max_bytes"] == cap and c[0]["args"]["step"] > 5, c
assert ev[-1]["name"] == "loom_end" and ev.index(c[0]) >= len(ev) - 2, "loom_capped is not the last event"
steps = [e["args"]["step"] for e in ev if "step" in e.get("args", {}) and e.get("cat") == "train"]
assert max(steps) <= c[0]["args"]["step"] < 39, (max(steps), c[0]["args"])
print(f"{size} bytes of {cap}, capped at step {c[0]['args']['step']}")
PY
  [ $? = 0 ] && ok "cap $cap MB, rank $r: $(cat "$tmp/check")" || { bad "cap, rank $r ($size bytes)"; cat "$tmp/check"; }
  n=$(grep -c "\[rank $r\].*trace: .*rank-$r.json reached its cap of $cap MB at step [0-9]*.*log.trace_max_mb" "$tmp/cap_out")
  [ "$n" = 1 ] && ok "cap: rank $r warned once: $(grep -m1 -o "\[rank $r\].*reached its cap.*" "$tmp/cap_out")" ||
    { bad "cap: rank $r warned $n times"; cat "$tmp/cap_out"; }
done
"$LOOM" report --trace "$tmp/cap" >"$tmp/rep" 2>&1 && grep -q "2 ranks" "$tmp/rep" &&
  [ "$(grep -c 'rank-[01].json was capped at 0.05 MB at step [0-9]*' "$tmp/rep")" = 2 ] &&
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/cap/trace.json" &&
  ok "cap: the merge names both capped files: $(tr '\n' ' ' <"$tmp/rep")" || { bad "cap: merge"; cat "$tmp/rep"; }
[ -n "$(loss_steps "$tmp/cap")" ] && [ "$(loss_steps "$tmp/cap")" = "$(loss_steps "$tmp/nocap")" ] &&
  [ "$(grep -c '"step": *40' "$tmp/cap/metrics.jsonl")" -ge 1 ] &&
  ok "cap: training went on to step 40, the losses of the run without a trace" ||
  bad "cap: training changed: $(loss_steps "$tmp/cap" | cut -c1-80) against $(loss_steps "$tmp/nocap" | cut -c1-80)"

# config check: each bad value and the keys without a trace, exit 2 naming
# what is supported; good ones accepted.
refused() { # WHAT MESSAGE SETTINGS...
  local what=$1 msg=$2
  shift 2
  "$LOOM" config check "$SRC/examples/small_gpt.yaml" "$@" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -qF -- "$msg" "$tmp/out" && ok "config check $what: exit 2: $(tail -1 "$tmp/out")" ||
    { bad "config check $what: rc $rc"; cat "$tmp/out"; }
}
on=(--set log.trace=true)
refused "trace_start -1" "key 'log.trace_start': -1 is out of range (must be >= 0)" "${on[@]}" --set log.trace_start=-1
refused "trace_steps -2" "key 'log.trace_steps': -2 is out of range (must be >= 0)" "${on[@]}" --set log.trace_steps=-2
refused "trace_every -5" "key 'log.trace_every': -5 is out of range (must be >= 0)" "${on[@]}" --set log.trace_every=-5
refused "trace_max_mb -1" "key 'log.trace_max_mb': -1 is out of range (must be >= 0)" "${on[@]}" --set log.trace_max_mb=-1
refused "trace_every 3 with trace_steps 3" "key 'log.trace_every': 3 is not more than log.trace_steps (3)" \
  "${on[@]}" --set log.trace_steps=3 --set log.trace_every=3
refused "trace_every without trace_steps" "key 'log.trace_every': 10 repeats a window of log.trace_steps steps" \
  "${on[@]}" --set log.trace_every=10
for k in trace_start=5 trace_steps=3 trace_max_mb=0.5; do
  refused "log.$k without log.trace" "key 'log.${k%%=*}': applies to a trace (log.trace true) only, and log.trace is false" \
    --set "log.$k"
done
"$LOOM" config check "$SRC/examples/small_gpt.yaml" "${on[@]}" --set log.trace_start=100 --set log.trace_steps=10 \
  --set log.trace_every=1000 --set log.trace_max_mb=0.05 >"$tmp/out" 2>&1 &&
  ok "config check: a window every 1000 steps and a cap accepted" || { bad "good window refused"; cat "$tmp/out"; }
"$LOOM" config check "$SRC/examples/small_gpt.yaml" --set log.trace_max_mb=1024 --set log.trace_start=0 >"$tmp/out" 2>&1 &&
  ok "config check: the defaults without log.trace accepted" || { bad "defaults refused"; cat "$tmp/out"; }
finish obs_trace_window
