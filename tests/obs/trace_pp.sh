#!/usr/bin/env bash
# log.trace with a pipeline (pp 2, 2 micro-batches, 1f1b and gpipe): each
# rank's main track has every step's data wait, each micro-batch's forward
# and backward, its waits on the other stage ("pipeline wait") and the
# optimizer, none overlapping; on rank 0 they sum to metrics.jsonl's
# data_wait_s, forward_s, backward_s, pp_wait_s and optim_s + comm_wait_s,
# and each rank's pipeline waits to its rank_pp_wait_s (one step a line).
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
head -c 40000 "$SRC/docs/parallel.md" >"$tmp/text.txt"
gpt=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set parallel.pp=2
  --set parallel.micro_batches=2 --set train.steps=4 --set log.every=1 --set train.eval_every=2
  --set train.eval_batches=1 --set checkpoint.enabled=false --set log.trace=true --quiet)

for sched in 1f1b gpipe; do
  run 2 train "${gpt[@]}" --set parallel.pp_schedule=$sched --set "log.run_dir=$tmp/$sched"
  [ $rc = 0 ] || { bad "$sched: 2-rank pipeline run (rc $rc): $(tail -3 "$tmp/out")"; continue; }
  python3 - "$tmp/$sched" <<'PY' >"$tmp/check" 2>&1
import json, sys
run = sys.argv[1]
def check(cond, msg):
    print(("ok: " if cond else "FAILED: ") + msg)
metrics = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"step_s"' in l]
check(len(metrics) == 4, f"{len(metrics)} training lines")
for rank in (0, 1):
    ev = json.load(open(f"{run}/trace/rank-{rank}.json"))
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    main = [t for t, n in names.items() if n == "main"]
    spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "train"
             and main and e["tid"] == main[0]]
    kinds = {e["name"] for e in spans}
    check(kinds >= {"data wait", "forward", "backward", "optimizer", "evaluation"},
          f"rank {rank}: train spans {sorted(kinds)}")
    # The step's phases follow each other on one thread: none overlaps the
    # next (evaluation holds forwards of its own, not timed as steps').
    step = sorted((e for e in spans if e["name"] != "evaluation"), key=lambda e: e["ts"])
    over = [(a["name"], b["name"]) for a, b in zip(step, step[1:])
            if b["ts"] < a["ts"] + a["dur"] - 1]
    check(not over, f"rank {rank}: step spans do not overlap {over[:3]}")
    for m in metrics:
        s = m["step"] - 1  # a line of step N: the step whose spans carry N - 1
        def of(name):
            return [e for e in spans if e["name"] == name and e["args"].get("step") == s]
        def total(name):
            return sum(e["dur"] for e in of(name)) / 1e6
        mbs = sorted(e["args"].get("micro_batch") for e in of("forward"))
        check(mbs == [0, 1] and sorted(e["args"].get("micro_batch") for e in of("backward")) == [0, 1],
              f"rank {rank} step {m['step']}: a forward and a backward of each micro-batch")
        pairs = [("pipeline wait", m["rank_pp_wait_s"][rank], total("pipeline wait"))]
        if rank == 0:
            pairs += [("forward", m["forward_s"], total("forward")),
                      ("backward", m["backward_s"], total("backward")),
                      ("data wait", m["data_wait_s"], total("data wait")),
                      ("pipeline wait (pp_wait_s)", m["pp_wait_s"], total("pipeline wait")),
                      ("optimizer", m["optim_s"] + m.get("comm_wait_s", 0), total("optimizer"))]
        for name, want, got in pairs:
            check(abs(got - want) <= 0.02 * want + 20e-6,
                  f"rank {rank} step {m['step']}: {name} spans {got:.6f} s, metrics {want:.6f} s")
PY
  grep -c '^ok' "$tmp/check" | xargs -I{} echo "$sched: {} checks passed"
  grep -q FAILED "$tmp/check" && { bad "$sched: the pipeline's trace:"; grep -v '^ok' "$tmp/check"; }
  grep -q '^ok' "$tmp/check" || { bad "$sched: no checks ran"; cat "$tmp/check"; }
  "$LOOM" report --trace "$tmp/$sched" >"$tmp/rep" 2>&1 && grep -q "2 ranks" "$tmp/rep" &&
    ok "$sched: report --trace merges the pipeline's ranks" || { bad "$sched: report --trace"; cat "$tmp/rep"; }
done
finish obs_trace_pp
