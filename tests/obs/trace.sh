#!/usr/bin/env bash
# log.trace: every rank writes a Chrome/Perfetto trace (JSON trace events)
# that loads as JSON; its spans of each step sum to metrics.jsonl's parts
# (data_wait_s, forward_s, backward_s, optim_s + comm_wait_s: within 2%);
# forward and backward have a span per top-level module inside them; the
# communication thread's collectives are on a track of their own with their
# bytes; memory counters; loom report --trace merges the ranks (a process
# each, one time line) and takes a file cut short by a crash, naming it;
# the latest attempt's files only, an earlier attempt's kept aside (a
# restart, a resume, a run of another size), damaged, missing and misnamed
# rank files named; a full disk warned of; LOOM_TRACE=DIR
# writes there instead; off by default; log.profile (the old name) is
# refused at config check.
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
head -c 40000 "$SRC/docs/parallel.md" >"$tmp/text.txt"
gpt=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=2
  --set model.d_model=64 --set model.heads=2 --set model.context=32 --set train.batch_size=4
  --set train.steps=6 --set log.every=1 --set train.eval_every=3 --set train.eval_batches=2
  --set checkpoint.every=3 --set parallel.strategy=ddp --set parallel.bucket_mb=0.01 --quiet)

run 2 train "${gpt[@]}" --set log.trace=true --set "log.run_dir=$tmp/run"
[ $rc = 0 ] || { bad "2-rank traced run (rc $rc)"; cat "$tmp/out"; }
"$LOOM" report --trace "$tmp/run" >"$tmp/rep" 2>&1 &&
  grep -q "2 ranks" "$tmp/rep" && ok "report --trace: $(cat "$tmp/rep")" ||
  { bad "report --trace failed"; cat "$tmp/rep"; }

python3 - "$tmp/run" <<'PY' >"$tmp/check" 2>&1
import collections, json, sys
run = sys.argv[1]
fails = []
def check(cond, msg):
    print(("ok: " if cond else "FAILED: ") + msg)
metrics = [json.loads(l) for l in open(run + "/metrics.jsonl")]
for rank in (0, 1):
    ev = json.load(open(f"{run}/trace/rank-{rank}.json"))
    check(all(e.get("pid") == rank for e in ev), f"rank {rank}: every event of process {rank}")
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    spans = [e for e in ev if e.get("ph") == "X"]
    main = [t for t, n in names.items() if n == "main"]
    comm = [t for t, n in names.items() if n == "comm"]
    check(len(main) == 1 and len(comm) == 1, f"rank {rank}: tracks {sorted(names.values())}")
    if not (main and comm):
        continue
    coll = [e for e in spans if e["tid"] == comm[0]]
    ar = [e for e in coll if e["name"] == "allreduce" and e["args"]["bytes"] > 0]
    check(len(ar) >= 12, f"rank {rank}: {len(ar)} all-reduces on the comm track, with bytes")
    check({e["name"] for e in ev if e.get("ph") == "C"} >= {"memory", "peak rss"},
          f"rank {rank}: memory counters")
    # Each step's phases against metrics.jsonl (rank 0 writes it): a line
    # of step N holds the step whose spans carry step N - 1.
    if rank == 0:
        for m in metrics:
            if "forward_s" not in m:
                continue
            s = m["step"] - 1
            def total(name):
                return sum(e["dur"] for e in spans if e["name"] == name and
                           e["cat"] == "train" and e["args"].get("step") == s) / 1e6
            opt = [e for e in spans if e["name"] == "optimizer" and e["args"].get("step") == s]
            pairs = [("forward", m["forward_s"], total("forward")),
                     ("backward", m["backward_s"], total("backward")),
                     ("data wait", m["data_wait_s"], total("data wait")),
                     ("optimizer", m["optim_s"] + m.get("comm_wait_s", 0),
                      sum(e["dur"] for e in opt) / 1e6)]
            for name, want, got in pairs:
                check(abs(got - want) <= 0.02 * want + 20e-6,
                      f"step {m['step']}: {name} spans {got:.6f} s, metrics {want:.6f} s")
    # Forward and backward of each top-level module inside the step's own.
    fwd = [e for e in spans if e["cat"] == "train" and e["name"] == "forward"]
    mods = [e for e in spans if e["cat"] == "forward"]
    units = {e["name"] for e in mods}
    check({"emb", "blocks.0", "blocks.1", "ln_f", "head"} <= units, f"rank {rank}: module spans {sorted(units)}")
    inside = sum(any(f["ts"] <= e["ts"] and e["ts"] + e["dur"] <= f["ts"] + f["dur"] + 1e-3
                     for f in fwd) for e in mods)
    train_mods = sum(1 for e in mods)  # evaluation's forwards are outside the steps
    check(inside >= 5 * len(fwd), f"rank {rank}: {inside} of {train_mods} module forwards inside the {len(fwd)} step forwards")
    check(sum(1 for e in spans if e["cat"] == "backward") == 5 * 6,
          f"rank {rank}: 5 module backwards a step")
    check(any(e["name"] == "evaluation" for e in spans) and any(e["name"] == "checkpoint" for e in spans),
          f"rank {rank}: evaluation and checkpoint spans")
merged = json.load(open(run + "/trace.json"))
check({e["pid"] for e in merged} == {0, 1}, "merged: processes 0 and 1")
m0 = min(e["ts"] for e in merged if "ts" in e)
check(0 <= m0 < 1e6, f"merged: one time line, starting at {m0:.0f} us")
PY
grep '^ok' "$tmp/check" | head -50
grep -q FAILED "$tmp/check" && { bad "trace content:"; grep -v '^ok' "$tmp/check"; }
grep -q '^ok' "$tmp/check" || { bad "no checks ran"; cat "$tmp/check"; }

# Ranks on hosts whose clocks disagree (emulated: rank K names its host
# <host>/rankK and reads the wall clock 5 s x K ahead): the merge brings
# them to rank 0's clock by the offsets measured at the start; each step's
# optimizer span (after the same all-reduce) begins at about the same time
# on both ranks. Without the offsets they would be 5 s apart.
LOOM_TRACE_EMULATE_HOSTS=5 run 2 train "${gpt[@]}" --set log.trace=true --set "log.run_dir=$tmp/hosts"
[ $rc = 0 ] || { bad "2-rank traced run, emulated hosts (rc $rc)"; cat "$tmp/out"; }
"$LOOM" report --trace "$tmp/hosts" >"$tmp/rep" 2>&1 && grep -q "brought to rank 0's" "$tmp/rep" &&
  ok "emulated hosts: $(cat "$tmp/rep")" || { bad "emulated hosts: report --trace"; cat "$tmp/rep"; }
mkdir -p "$tmp/nosync"
for f in "$tmp"/hosts/trace/rank-*.json; do grep -v loom_clock_sync "$f" >"$tmp/nosync/$(basename "$f")"; done
"$LOOM" report --trace "$tmp/nosync" -o "$tmp/nosync.json" >"$tmp/rep2" 2>&1
python3 - "$tmp/hosts/trace.json" "$tmp/nosync.json" <<'PY' >"$tmp/check" 2>&1
import json, sys
def gaps(path):
    ev = json.load(open(path))
    opt = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("name") == "optimizer":
            opt.setdefault(e["args"]["step"], {})[e["pid"]] = e["ts"]
    return [abs(v[1] - v[0]) / 1e6 for v in opt.values() if len(v) == 2]
synced, raw = gaps(sys.argv[1]), gaps(sys.argv[2])
assert len(synced) == 6, synced
# A loaded machine can hold one rank back for a while in a step, so the
# typical step (the median) must line up closely, and none may be near the
# 5 s the emulated clocks differ by.
med = sorted(synced)[len(synced) // 2]
assert med < 0.05, f"synced: ranks' optimizer starts {med:.3f} s apart (median)"
assert max(synced) < 1.0, f"synced: a step's optimizer starts {max(synced):.3f} s apart"
assert min(raw) > 4.9, f"the control without offsets: {min(raw):.3f} s apart"
print(f"ok: steps aligned within {1e3 * med:.2f} ms median, {1e3 * max(synced):.2f} ms at most (without the offsets {min(raw):.2f} s apart)")
PY
grep -q '^ok' "$tmp/check" && ok "emulated hosts: $(cat "$tmp/check" | sed 's/^ok: //')" ||
  { bad "emulated hosts: alignment"; cat "$tmp/check"; }

# A file cut short mid-line (a crash) still merges, without that line.
cp -r "$tmp/run/trace" "$tmp/cut"
f="$tmp/cut/rank-1.json"
head -c $(($(wc -c <"$f") / 2)) "$f" >"$f.part" && mv "$f.part" "$f"
"$LOOM" report --trace "$tmp/cut" -o "$tmp/cut.json" >"$tmp/rep" 2>&1 &&
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/cut.json" &&
  ok "a rank file cut in half merges: $(cat "$tmp/rep")" || { bad "cut file"; cat "$tmp/rep"; }
grep -q "rank-1.json is cut short" "$tmp/rep" && ok "the cut file is named" ||
  { bad "a cut file merged without a word"; cat "$tmp/rep"; }
# Not a trace: left out naming the file and why, the other rank merged;
# rank 0 then named as missing. Every file unusable: exit 1 naming one.
echo '[{"x":1}]' >"$tmp/cut/rank-0.json"
"$LOOM" report --trace "$tmp/cut" -o "$tmp/x.json" >"$tmp/rep" 2>&1
[ $? = 0 ] && grep -q "rank-0.json: no loom_clock" "$tmp/rep" && grep -q "1 rank," "$tmp/rep" &&
  grep -q "rank 0's trace (rank-0.json) is missing" "$tmp/rep" && ok "not a trace: left out: $(cat "$tmp/rep")" ||
  { bad "a foreign file"; cat "$tmp/rep"; }
: >"$tmp/cut/rank-1.json"
"$LOOM" report --trace "$tmp/cut" -o "$tmp/x.json" >"$tmp/rep" 2>&1
[ $? = 1 ] && grep -q "no rank file to merge: .*rank-0.json: no loom_clock" "$tmp/rep" &&
  ok "no usable file: exit 1" || { bad "no usable file"; cat "$tmp/rep"; }
# Ranks that are not there, or another rank's content under a name: named.
mkdir "$tmp/gap"
cp "$tmp/run/trace/rank-1.json" "$tmp/gap/rank-1.json"
"$LOOM" report --trace "$tmp/gap" -o "$tmp/x.json" >"$tmp/rep" 2>&1 &&
  grep -q "rank 0's trace (rank-0.json) is missing from the merge (the attempt has that rank)" "$tmp/rep" &&
  ok "only rank-1.json: rank 0 named as missing" || { bad "a missing rank"; cat "$tmp/rep"; }
cp "$tmp/run/trace/rank-0.json" "$tmp/gap/rank-0.json"
mv "$tmp/gap/rank-1.json" "$tmp/gap/rank-2.json"
"$LOOM" report --trace "$tmp/gap" -o "$tmp/x.json" >"$tmp/rep" 2>&1 &&
  grep -q "rank-2.json holds rank 1's trace, not rank 2's: left out" "$tmp/rep" &&
  grep -q "rank 1's trace (rank-1.json) is missing" "$tmp/rep" && grep -q "1 rank," "$tmp/rep" &&
  ok "rank 1's trace named rank-2.json: left out, rank 1 missing" || { bad "a misnamed rank"; cat "$tmp/rep"; }
# A 1-rank attempt after the 2-rank one: the 2-rank attempt's rank-0.json
# is kept in attempt-*/, the merge takes the new rank-0.json alone and
# names the stale rank-1.json; the kept attempt merges on its own.
cp -r "$tmp/run/trace" "$tmp/mix"
LOOM_TRACE="$tmp/mix" "$LOOM" train "${gpt[@]}" --set train.steps=1 --set "log.run_dir=$tmp/run5" >"$tmp/out" 2>&1 ||
  { bad "1-rank run after a 2-rank one"; cat "$tmp/out"; }
kept=$(ls -d "$tmp"/mix/attempt-*/ 2>/dev/null)
[ -n "$kept" ] && cmp -s "$kept/rank-0.json" "$tmp/run/trace/rank-0.json" &&
  ok "the earlier attempt's rank-0.json kept in $(basename "$kept")" || { bad "earlier attempt lost"; ls -R "$tmp/mix"; }
"$LOOM" report --trace "$tmp/mix" -o "$tmp/x.json" >"$tmp/rep" 2>&1 && grep -q "1 rank," "$tmp/rep" &&
  grep -q "mix/rank-1.json is from an earlier attempt (2 rank(s)" "$tmp/rep" &&
  ok "merge: the latest attempt only, the stale rank-1.json named" || { bad "mixed attempts"; cat "$tmp/rep"; }
cp "$tmp/mix/rank-1.json" "$kept/" && "$LOOM" report --trace "$kept" -o "$tmp/x.json" >"$tmp/rep" 2>&1 &&
  grep -q "2 ranks," "$tmp/rep" && ! grep -q warn "$tmp/rep" && ok "the kept attempt merges on its own" ||
  { bad "kept attempt"; cat "$tmp/rep"; }
# A crash and a restart under loom run: the crashed attempt's timeline (up
# to its last flush) is kept; the restart's warm-up spans carry no step.
LOOM_FAULT=1:5:segv "$LOOM" run -n 2 --timeout 120 --max-restarts 1 "$LOOM" train "${gpt[@]}" --set log.trace=true \
  --set log.every=2 --set "log.run_dir=$tmp/crash" >"$tmp/out" 2>&1 || { bad "restarted run"; cat "$tmp/out"; }
kept=$(ls -d "$tmp"/crash/trace/attempt-*/ 2>/dev/null)
[ -n "$kept" ] && grep -q '"step":3}' "$kept/rank-1.json" && grep -q '"step":5}' "$tmp/crash/trace/rank-1.json" &&
  ok "restart: the crashed attempt's trace kept in $(basename "$kept")" || { bad "crashed attempt's trace"; ls -R "$tmp/crash/trace"; }
grep -q '"name":"warm-up"' "$tmp/crash/trace/rank-0.json" && grep -q '"name":"forward".*"warm_up":true' "$tmp/crash/trace/rank-0.json" &&
  ! grep -q '"cat":"train","name":"forward".*"step":0}' "$tmp/crash/trace/rank-0.json" &&
  ok "restart: warm-up spans marked warm_up, none at step 0" || bad "restart: warm-up spans"
# A trace that cannot be written (a full file system, root only): a warning
# naming the file and the events lost; the merge says it is cut short.
mkdir "$tmp/full"
if mount -t tmpfs -o size=64k tmpfs "$tmp/full" 2>/dev/null; then
  LOOM_TRACE="$tmp/full/tr" "$LOOM" train "${gpt[@]}" --set train.steps=200 --set checkpoint.enabled=false \
    --set "log.run_dir=$tmp/run6" >"$tmp/out" 2>&1
  grep -q "trace: $tmp/full/tr/rank-0.json could not be written (No space left on device): [0-9]* of [0-9]* events lost" "$tmp/out" &&
    ok "full disk: $(grep -o 'trace: .*' "$tmp/out")" || { bad "full disk: no warning"; tail -3 "$tmp/out"; }
  "$LOOM" report --trace "$tmp/full/tr" -o "$tmp/x.json" >"$tmp/rep" 2>&1 && grep -q "rank-0.json is cut short" "$tmp/rep" &&
    ok "full disk: the merge says the file is cut short" || { bad "full disk: merge"; cat "$tmp/rep"; }
  umount "$tmp/full"
else
  echo "skip: a full file system needs mount (root)"
fi
"$LOOM" report --trace "$tmp/none" >"$tmp/rep" 2>&1
[ $? = 1 ] && grep -q "$tmp/none" "$tmp/rep" && ok "no trace directory: exit 1" || { bad "missing dir"; cat "$tmp/rep"; }
"$LOOM" report >"$tmp/rep" 2>&1
[ $? = 2 ] && ok "report without --trace: exit 2" || bad "report without arguments"

# LOOM_TRACE=DIR: the files go there; off by default: no trace directory.
LOOM_TRACE="$tmp/env" "$LOOM" train "${gpt[@]}" --set train.steps=2 --set "log.run_dir=$tmp/run2" >"$tmp/out" 2>&1
[ -s "$tmp/env/rank-0.json" ] && [ ! -e "$tmp/run2/trace" ] && ok "LOOM_TRACE=DIR writes DIR/rank-0.json" ||
  { bad "LOOM_TRACE"; cat "$tmp/out"; }
"$LOOM" train "${gpt[@]}" --set train.steps=2 --set "log.run_dir=$tmp/run3" >"$tmp/out" 2>&1
[ ! -e "$tmp/run3/trace" ] && ok "no trace by default" || bad "a trace without log.trace"
# The old key is refused, naming the new one.
"$LOOM" config check "$SRC/examples/small_gpt.yaml" --set log.profile=true >"$tmp/out" 2>&1
[ $? = 2 ] && grep -q "log.trace" "$tmp/out" && ok "log.profile: exit 2 naming log.trace" ||
  { bad "log.profile"; cat "$tmp/out"; }
# A link planted where a rank file goes is refused, never followed.
mkdir -p "$tmp/run4/trace"
echo keep >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/run4/trace/rank-0.json"
"$LOOM" train "${gpt[@]}" --set train.steps=1 --set log.trace=true --set "log.run_dir=$tmp/run4" >"$tmp/out" 2>&1
rc=$?
[ "$(cat "$tmp/victim")" = keep ] && [ -L "$tmp/run4/trace/rank-0.json" ] && [ $rc != 0 ] &&
  [ "$(grep -m1 -o 'trace: .*' "$tmp/out" | grep -o 'rank-0\.json' | wc -l)" = 1 ] &&
  ok "a link in the trace's place: refused, not written through, named once (exit $rc: $(grep -m1 -o 'trace: .*' "$tmp/out"))" ||
  { bad "the trace and a link (exit $rc)"; cat "$tmp/out"; }
# loom report --trace writes trace.json whole or not at all: a merge
# killed half way (SIGKILL here; Ctrl-C alike) leaves the previous
# trace.json as it was and its temporary .trace.json.tmp.PID, which the
# next merge removes, its process being gone; nothing else of that pattern
# (a link, a live process's, another file's). Before: trace.json was
# truncated at the start and written in place, and a kill left a part of
# it that is not JSON. The kill waits for the temporary (or, as the old
# binary does, for trace.json to change) by polling.
mkdir -p "$tmp/big/trace"
python3 - "$tmp/big/trace/rank-0.json" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write('[\n{"ph":"M","name":"loom_clock","pid":0,"tid":0,"args":{"monotonic_s":1.0,'
            '"wall_s":1700000000.0,"host":"h","world":1}},\n')
    for i in range(200000):
        f.write('{"ph":"X","cat":"train","name":"forward","pid":0,"tid":1,"ts":%d.5,'
                '"dur":1.25,"args":{"step":%d}},\n' % (3 * i, i))
    f.write('{"ph":"M","name":"loom_end","pid":0,"tid":0,"args":{}}\n]\n')
PY
"$LOOM" report --trace "$tmp/big" >"$tmp/rep" 2>&1 || { bad "large merge"; cat "$tmp/rep"; }
cp "$tmp/big/trace.json" "$tmp/big.prev"
was=$(stat -c %i:%s "$tmp/big/trace.json")
"$LOOM" report --trace "$tmp/big" >"$tmp/rep" 2>&1 &
pid=$!
for _ in $(seq 3000); do # polled, 30 s at most
  if [ -e "$tmp/big/.trace.json.tmp.$pid" ] ||
    [ "$(stat -c %i:%s "$tmp/big/trace.json" 2>/dev/null)" != "$was" ]; then
    kill -KILL $pid
    break
  fi
  kill -0 $pid 2>/dev/null || break
  sleep 0.01
done
wait $pid
rc=$?
[ $rc = 137 ] && [ -f "$tmp/big/.trace.json.tmp.$pid" ] && cmp -s "$tmp/big/trace.json" "$tmp/big.prev" &&
  ok "a merge killed while writing: the previous trace.json intact, its temporary left" ||
  bad "a merge killed while writing (rc $rc): trace.json $(stat -c %s "$tmp/big/trace.json" 2>&1) bytes of $(stat -c %s "$tmp/big.prev"), $(ls -A "$tmp/big" | tr '\n' ' ')"
echo keep >"$tmp/victim2"
ln -s "$tmp/victim2" "$tmp/big/.trace.json.tmp.4194305" # no such pid, a link
echo live >"$tmp/big/.trace.json.tmp.$$"                # this shell's, alive
echo other >"$tmp/big/.other.json.tmp.4194305"           # another file's
echo dead >"$tmp/big/.trace.json.tmp.4194306" # no such pid (above pid_max)
"$LOOM" report --trace "$tmp/big" >"$tmp/rep" 2>&1
rc=$?
python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); assert len(t) == 200003, len(t)' \
  "$tmp/big/trace.json" >"$tmp/check" 2>&1
[ $rc = 0 ] && [ ! -s "$tmp/check" ] && [ ! -e "$tmp/big/.trace.json.tmp.$pid" ] &&
  [ ! -e "$tmp/big/.trace.json.tmp.4194306" ] &&
  [ -L "$tmp/big/.trace.json.tmp.4194305" ] && [ "$(cat "$tmp/victim2")" = keep ] &&
  [ -f "$tmp/big/.trace.json.tmp.$$" ] && [ -f "$tmp/big/.other.json.tmp.4194305" ] &&
  ok "the next merge: valid JSON, the temporaries of dead processes removed, nothing else" ||
  { bad "the next merge (rc $rc): $(ls -A "$tmp/big" | tr '\n' ' ')"; cat "$tmp/rep" "$tmp/check"; }
finish obs_trace
