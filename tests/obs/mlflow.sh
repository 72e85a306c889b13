#!/usr/bin/env bash
# log.mlflow: loom's MLflow client (src/obs/mlflow.c) against a real
# tracking server, `mlflow server` from PyPI (scripts/ensure-mlflow.sh) on
# a SQLite store and its artifact proxy, read back with MLflow's own client
# (MlflowClient):
#   1. params, tags, 3 metrics x 50 steps (values, steps and times exact),
#      NaN and an infinity, two artifacts (bytes equal), status FINISHED;
#   2. a server that goes away mid-run: values sent, the server killed
#      (SIGKILL), values logged while it is down (the calls return at
#      once), the server started again on the same port and store, more
#      values; every step of the three phases is there once, with its
#      value, and the run is FINISHED;
#   3. loom train resumed and restarted under loom run: one run;
#   4. rank 0 killed (segv) with values queued while the server was
#      stopped, the job resumed: every value of metrics.jsonl there once;
#   5. a diverged run: FAILED, with its three artifacts.
# mlflow_driver (tests/obs/mlflow_driver.c) does the logging. LOOM_NO_PYPI=1
# skips it (no PyPI), saying so.
. "$(dirname "$0")/../lib.sh"
export LOOM_LOG=warn LOOM_THREADS=1 OMP_NUM_THREADS=1
# Open MPI's own leaks (the 2-rank runs) under the ASan build.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
if [ "${LOOM_NO_PYPI:-0}" = 1 ]; then
  echo "skipped: LOOM_NO_PYPI=1 (the MLflow server and client come from PyPI)"
  exit 0
fi
DRIVER=${MLFLOW_DRIVER:?MLFLOW_DRIVER must name the mlflow_driver executable}
PY=$("$SRC/scripts/ensure-mlflow.sh") || { bad "scripts/ensure-mlflow.sh failed"; finish obs_mlflow; }
MLFLOW=$(dirname "$PY")/mlflow
# (the installed version's metadata: importing mlflow takes seconds)
echo "mlflow $("$PY" -c 'from importlib.metadata import version; print(version("mlflow"))')"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URI=http://127.0.0.1:$port

# The server in a process group of its own (setsid), so that killing the
# group takes its workers too; killed at exit whatever happens.
server=
stop_server() { # SIGNAL
  [ -n "$server" ] || return 0
  kill -"$1" -- -"$server" 2>/dev/null
  wait "$server" 2>/dev/null
  server=
}
trap 'stop_server KILL; rm -rf "$tmp"' EXIT
start_server() { # WHAT: started and answering within 120 s, else false
  local t0=$SECONDS
  # No job runner (a second Python process the test does not use).
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$MLFLOW" server --backend-store-uri "sqlite:///$tmp/db.sqlite" \
    --artifacts-destination "$tmp/artifacts" --host 127.0.0.1 --port "$port" \
    --workers 1 >>"$tmp/server.log" 2>&1 &
  server=$!
  while [ $((SECONDS - t0)) -lt 120 ]; do
    kill -0 "$server" 2>/dev/null || break
    if "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "$URI" 2>/dev/null; then
      echo "$1: server ready in $((SECONDS - t0)) s"
      return 0
    fi
    sleep 0.5
  done
  bad "$1: mlflow server not ready within 120 s: $(tail -5 "$tmp/server.log")"
  return 1
}
wait_line() { # PATTERN FILE: within 120 s
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt 120 ]; do
    grep -q "$1" "$2" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

# The checks read back with MlflowClient: `check N ARGS... <<'PY'` keeps
# check N's program (stdin) and arguments; run_checks, at the end, runs
# them in order in one interpreter (importing MLflow's client took 2-4 s
# a check, five times), each with its own sys.argv, its output and
# traceback in $tmp/checkN and its status in $tmp/checkN.rc. Nothing a
# check reads changes after its phase: each phase has an experiment of its
# own, and the store outlives the server's kill and stop.
check() { # N ARGS...
  local n=$1
  shift
  cat >"$tmp/check$n.py"
  printf '%s\0' "$@" >"$tmp/check$n.args"
}
run_checks() {
  "$PY" - "$tmp" <<'PY' >"$tmp/checks.log" 2>&1
import contextlib, glob, io, os, sys, traceback
tmp = sys.argv[1]
for n in sorted(int(p[len(tmp) + 6:-3]) for p in glob.glob(tmp + "/check*.py")):
    code = open(f"{tmp}/check{n}.py").read()
    args = open(f"{tmp}/check{n}.args", "rb").read().split(b"\0")[:-1]
    sys.argv = ["-"] + [os.fsdecode(a) for a in args]
    out, rc = io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            exec(compile(code, f"check{n}", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            rc = 1
    open(f"{tmp}/check{n}", "w").write(out.getvalue())
    open(f"{tmp}/check{n}.rc", "w").write(str(rc))
PY
}
passed() { [ "$(cat "$tmp/check$1.rc" 2>/dev/null)" = 0 ]; } # N

start_server "first start" || finish obs_mlflow

# ---------------------------------------------------------------- 1. a run
{
  cat "$SRC/examples/small_gpt.yaml"
  "$PY" -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 400)'
} >"$tmp/artifact.bin"
"$DRIVER" basic "$URI" loom-basic "$tmp/artifact.bin" >"$tmp/out1" 2>&1 ||
  bad "mlflow_driver basic (rc $?): $(cat "$tmp/out1")"
run1=$(sed -n 's/^run_id=//p' "$tmp/out1")
check 1 "$URI" "$run1" "$tmp/artifact.bin" "$tmp/dl" <<'PY'
import filecmp, math, sys
from mlflow import MlflowClient
uri, run_id, artifact, outdir = sys.argv[1:5]
c = MlflowClient(tracking_uri=uri)
e = c.get_experiment_by_name("loom-basic")
assert e is not None, "no experiment loom-basic"
runs = c.search_runs([e.experiment_id])
assert [r.info.run_id for r in runs] == [run_id], f"runs {[r.info.run_id for r in runs]}, want [{run_id}]"
r = c.get_run(run_id)
assert r.info.status == "FINISHED", r.info.status
assert r.info.run_name == "driver-basic", r.info.run_name
want = {"lr": "0.001", "batch_size": "32", "note": 'a "quoted" value, a \\ and ünicöde'}
assert r.data.params == want, f"params {r.data.params}"
for k, v in {"model": "mlp", "mlflow.source.name": "loom"}.items():
    assert r.data.tags.get(k) == v, f"tag {k}: {r.data.tags.get(k)!r}"
assert r.data.tags.get("loom.version"), "no tag loom.version"
n = 0
for key, f in (("loss", lambda s: 1.0 / (s + 1)), ("acc", lambda s: s / 50.0), ("lr", lambda s: s * 0.25)):
    got = sorted((m.step, m.value, m.timestamp) for m in c.get_metric_history(run_id, key))
    want = [(s, f(s), (1700000000 + s) * 1000) for s in range(50)]
    assert got == want, f"{key}: {len(got)} values; first differing: " + str(
        next(((g, w) for g, w in zip(got, want) if g != w), None))
    n += len(got)
nan = c.get_metric_history(run_id, "nan_metric")
assert len(nan) == 1 and math.isnan(nan[0].value), f"nan_metric {nan}"
inf = c.get_metric_history(run_id, "inf_metric")
assert len(inf) == 1 and inf[0].value == sys.float_info.max, f"inf_metric {inf}"
top = sorted(a.path for a in c.list_artifacts(run_id))
assert top == ["config.yaml", "sub"], f"artifacts {top}"
sub = [a.path for a in c.list_artifacts(run_id, "sub")]
assert sub == ["sub/data.bin"], f"artifacts in sub/ {sub}"
for a in ("config.yaml", "sub/data.bin"):
    p = c.download_artifacts(run_id, a, outdir)
    assert filecmp.cmp(p, artifact, shallow=False), f"{a}: bytes differ"
print(f"{n} metric values, 3 params, tags, NaN, inf, 2 artifacts, FINISHED")
PY

# ------------------------------------------- 2. the server goes away mid-run
mkfifo "$tmp/ctl"
trap '' PIPE # a driver that died: the writes below fail, the script goes on
"$DRIVER" outage "$URI" loom-outage <"$tmp/ctl" >"$tmp/out2" 2>&1 &
driver=$!
exec 3>"$tmp/ctl"
if wait_line "^sent:" "$tmp/out2"; then
  stop_server KILL
  echo go >&3
  wait_line "^logged:" "$tmp/out2" || bad "the driver did not log while the server was down: $(cat "$tmp/out2")"
  grep -q "failure seen 1" "$tmp/out2" && ok "server killed: a failure seen, $(grep '^logged:' "$tmp/out2" | cut -d' ' -f2-)" ||
    bad "server killed: no failure seen: $(cat "$tmp/out2")"
  # The calls return at once while the server is down (a bound far above
  # what they take, far below a request's timeout of 2 s).
  longest=$(sed -n 's/.*longest \([0-9.]*\) ms.*/\1/p' "$tmp/out2")
  awk -v t="${longest:-1e9}" 'BEGIN { exit !(t < 200) }' &&
    ok "no logging call waited for the network (longest ${longest} ms)" ||
    bad "a logging call took ${longest} ms while the server was down"
  start_server "restart" || true
else
  bad "the driver's first values never reached the server: $(cat "$tmp/out2")"
fi
echo go >&3
exec 3>&-
wait "$driver" || bad "mlflow_driver outage (rc $?): $(cat "$tmp/out2")"
run2=$(sed -n 's/^run_id=//p' "$tmp/out2")
grep -E "^(sent|down|closing):|closed" "$tmp/out2"
check 2 "$URI" "$run2" <<'PY'
import sys
from mlflow import MlflowClient
uri, run_id = sys.argv[1:3]
c = MlflowClient(tracking_uri=uri)
r = c.get_run(run_id)
got = sorted((m.step, m.value) for m in c.get_metric_history(run_id, "x"))
want = [(s, 1.5 * s) for s in range(300)]
missing = sorted(set(s for s, _ in want) - set(s for s, _ in got))
assert got == want, f"{len(got)} values of 300; missing steps {missing[:10]}; first differing " + str(
    next(((g, w) for g, w in zip(got, want) if g != w), None))
assert r.info.status == "FINISHED", r.info.status
print("300 steps (100 before, 100 during, 100 after the outage), each once, FINISHED")
PY
# ------------------------- 3. loom train with log.mlflow, resumed, restarted
# Two ranks train 8 steps (a FINISHED MLflow run; RUN/mlflow_run_id); the
# job is then resumed to 16 steps, rank 1 exits after step 12, loom run
# starts it again from the step-8 checkpoint: one MLflow run throughout,
# gone on with, its params the configuration (as first logged: MLflow's
# params do not change), its tags the job, every number of metrics.jsonl at
# its step (and the steps of metrics.jsonl only), the artifacts, FINISHED.
cat "$SRC"/docs/*.md 2>/dev/null | head -c 60000 >"$tmp/text.txt"
tr=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set model.layers=1
  --set model.d_model=32 --set model.heads=2 --set model.context=32 --set train.batch_size=2
  --set log.every=2 --set train.eval_every=8 --set train.eval_batches=1
  --set checkpoint.every=4 --set "log.mlflow.uri=$URI" --set log.mlflow.experiment=loom-test
  --set "log.run_dir=$tmp/run" --quiet)
"$LOOM" run -n 2 --timeout 120 "$LOOM" train "${tr[@]}" --set train.steps=8 >"$tmp/out3" 2>&1 ||
  bad "loom train with log.mlflow: $(tail -5 "$tmp/out3")"
[ -s "$tmp/run/mlflow_run_id" ] && ok "RUN/mlflow_run_id written" || bad "no RUN/mlflow_run_id"
LOOM_FAULT=1:12:exit "$LOOM" run -n 2 --timeout 120 --max-restarts 1 --restart-delay 0 \
  "$LOOM" train "${tr[@]}" --set train.steps=16 >>"$tmp/out3" 2>&1 ||
  bad "loom train with log.mlflow, resumed: $(tail -5 "$tmp/out3")"
check 3 "$URI" "$tmp/run" <<'PY'
import json, math, os, sys, tempfile
from mlflow import MlflowClient
uri, run = sys.argv[1:3]
c = MlflowClient(tracking_uri=uri)
e = c.get_experiment_by_name("loom-test")
runs = c.search_runs([e.experiment_id])
assert len(runs) == 1, f"{len(runs)} runs: a resume and a restart go on with the same run"
r = runs[0]
assert r.info.run_id == open(run + "/mlflow_run_id").read().strip()
assert r.info.status == "FINISHED", r.info.status
assert r.info.run_name == "run", r.info.run_name
p = r.data.params
assert p["model.d_model"] == "32" and p["train.steps"] == "8", p
assert p["log.mlflow.experiment"] == '"loom-test"' or p["log.mlflow.experiment"] == "loom-test", p["log.mlflow.experiment"]
assert len(p) > 60, len(p)
t = r.data.tags
assert t["loom.ranks"] == "2" and t["loom.strategy"] == "ddp", t
want = {}
for line in open(run + "/metrics.jsonl"):
    o = json.loads(line)
    for k, v in o.items():
        if k in ("step", "epoch", "time", "ranks") or not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        want.setdefault(k, {}).setdefault(o["step"], []).append(float(v))
for k, steps in want.items():
    got = {}
    for m in c.get_metric_history(r.info.run_id, k):
        got.setdefault(m.step, []).append(m.value)
    assert sorted(got) == sorted(steps), (k, sorted(got), sorted(steps))
    # MLflow keeps the values the first attempt logged for steps 9-12 too;
    # metrics.jsonl keeps only the restarted attempt's (it cuts the lines
    # after the checkpoint it resumes from): each of those is in MLflow.
    for s, vals in steps.items():
        for w in vals:
            assert any(math.isclose(v, w, rel_tol=1e-7, abs_tol=1e-12) for v in got[s]), (k, s, w, got[s])
arts = sorted(a.path for a in c.list_artifacts(r.info.run_id))
assert arts == ["config.yaml", "env.json", "report.html"], arts
d = c.download_artifacts(r.info.run_id, "config.yaml", tempfile.mkdtemp())
assert open(d, "rb").read() == open(run + "/config.yaml", "rb").read()
assert 16 in want["loss"] and 10 in want["loss"], sorted(want["loss"])
print(f"1 run over a resume and a restart, {len(p)} params, {len(want)} metrics at every step of metrics.jsonl, 3 artifacts, FINISHED")
PY
grep -q "restart" "$tmp/out3" && ok "the job was restarted" || bad "the job was not restarted: $(tail -3 "$tmp/out3")"

# ------------------- 4. rank 0 dies with values queued, the job resumed
# One rank, 0.4 s a step, a segv after step 10 (checkpoint at 8); once the
# MLflow run exists the server is stopped (SIGSTOP), so what rank 0 logs
# from then on waits in its queue and dies with it (exit 139; the run stays
# RUNNING). The server goes on (SIGCONT) and the job is resumed from step
# 8: it goes on with the same run and sends metrics.jsonl's lines up to
# step 8 that the server lacks, with their times; every (key, step) of
# metrics.jsonl is in MLflow exactly once, and the run is FINISHED.
tr4=("${tr[@]}" --set "log.run_dir=$tmp/run4" --set log.mlflow.experiment=loom-crash
  --set train.steps=12)
LOOM_FAULT=0:1:slow:0.4,0:10:segv "$LOOM" train "${tr4[@]}" >"$tmp/out4" 2>&1 &
job=$!
for _ in $(seq 150); do
  [ -s "$tmp/run4/mlflow_run_id" ] || ! kill -0 "$job" 2>/dev/null && break
  sleep 0.1
done
made=$([ -s "$tmp/run4/mlflow_run_id" ] && cat "$tmp/run4/mlflow_run_id")
kill -STOP -- -"$server"
wait "$job"
rc4=$?
kill -CONT -- -"$server"
# (under a sanitizer the segv is its report and exit code, not 139)
[ $rc4 = 139 ] || { [ -n "${LOOM_TEST_SANITIZED:-}" ] && [ $rc4 != 0 ]; } ||
  bad "the segv after step 10 (rc $rc4): $(tail -3 "$tmp/out4")"
# A request in flight at the crash reaches the server late: let it land.
sleep 2
"$LOOM" train "${tr4[@]}" >>"$tmp/out4" 2>&1 || bad "resuming after the crash (rc $?): $(tail -5 "$tmp/out4")"
check 4 "$URI" "$tmp/run4" "$made" <<'PY'
import json, sys
from mlflow import MlflowClient
uri, run, made = sys.argv[1:4]
c = MlflowClient(tracking_uri=uri)
runs = c.search_runs([c.get_experiment_by_name("loom-crash").experiment_id])
assert len(runs) == 1, f"{len(runs)} runs"
r = runs[0]
if made:
    assert r.info.run_id == made, (r.info.run_id, made)
assert r.info.status == "FINISHED", r.info.status
want = {}
for line in open(run + "/metrics.jsonl"):
    o = json.loads(line)
    for k, v in o.items():
        if k in ("step", "epoch", "time", "ranks") or not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        want.setdefault(k, []).append((o["step"], float(v), round(o["time"] * 1000)))
n = 0
for k, vals in want.items():
    got = sorted((m.step, m.value, m.timestamp) for m in c.get_metric_history(r.info.run_id, k))
    assert got == sorted(vals), (k, "server", got, "metrics.jsonl", sorted(vals))
    n += len(vals)
how = "gone on with" if made else "made by the resumed job (none before the crash)"
print(f"{n} values of {len(want)} metrics once each, exact, the run {how}, FINISHED")
PY

# ------------------------------------- 5. a diverged run's artifacts
# optim.lr 1000 without clipping: "the loss is -nan", exit 1; the run is
# FAILED and has config.yaml, env.json and report.html, as a finished one.
"$LOOM" train "${tr[@]}" --set "log.run_dir=$tmp/run5" --set log.mlflow.experiment=loom-nan \
  --set train.steps=12 --set optim.lr=1000 --set optim.grad_clip=0 >"$tmp/out5" 2>&1
rc5=$?
[ $rc5 = 1 ] && grep -q "training diverged" "$tmp/out5" ||
  bad "lr 1000 did not diverge (rc $rc5): $(tail -3 "$tmp/out5")"
check 5 "$URI" <<'PY'
import sys
from mlflow import MlflowClient
c = MlflowClient(tracking_uri=sys.argv[1])
runs = c.search_runs([c.get_experiment_by_name("loom-nan").experiment_id])
assert len(runs) == 1, f"{len(runs)} runs"
r = runs[0]
assert r.info.status == "FAILED", r.info.status
arts = sorted(a.path for a in c.list_artifacts(r.info.run_id))
assert arts == ["config.yaml", "env.json", "report.html"], arts
print("FAILED, with config.yaml, env.json and report.html")
PY

# -------------------- 6. a job whose rank crashed, no restart left
# Rank 1 dies (segv) after step 6 under loom run with no restart: Open MPI
# takes rank 0 down at once, so no rank ends the MLflow run, and it stayed
# RUNNING for good. loom run ends it as FAILED after the last attempt (the
# server still saying RUNNING), and says so.
LOOM_FAULT=1:6:segv "$LOOM" run -n 2 --timeout 120 --max-restarts 0 "$LOOM" train "${tr[@]}" \
  --set "log.run_dir=$tmp/run6" --set log.mlflow.experiment=loom-dead --set train.steps=12 \
  >"$tmp/out6" 2>&1
rc6=$?
[ $rc6 != 0 ] || bad "the job with a crashed rank exited 0"
check 6 "$URI" "$tmp/run6" <<'PY'
import sys
from mlflow import MlflowClient
uri, run = sys.argv[1:3]
c = MlflowClient(tracking_uri=uri)
runs = c.search_runs([c.get_experiment_by_name("loom-dead").experiment_id])
assert len(runs) == 1, f"{len(runs)} runs"
r = runs[0]
assert r.info.run_id == open(run + "/mlflow_run_id").read().strip()
assert r.info.status == "FAILED", r.info.status
assert r.info.end_time, "no end time"
print("FAILED, with an end time")
PY

# ------------------------------------------------------------- the checks
run_checks
cat "$tmp/checks.log" # what no check's output took (empty when all is well)
if passed 1; then ok "a run read back with MlflowClient: $(tail -1 "$tmp/check1")"; else bad "a run: $(tail -5 "$tmp/check1")"; fi
if passed 2; then ok "outage: $(tail -1 "$tmp/check2")"; else bad "outage: $(tail -5 "$tmp/check2")"; fi
if passed 3; then ok "loom train: $(tail -1 "$tmp/check3")"; else bad "loom train with log.mlflow: $(tail -8 "$tmp/check3")"; fi
if passed 4; then ok "rank 0 crashed with values queued: $(tail -1 "$tmp/check4")"; else bad "rank 0 crashed with values queued: $(tail -4 "$tmp/check4")"; fi
if passed 5; then ok "diverged: $(tail -1 "$tmp/check5")"; else bad "diverged: $(tail -4 "$tmp/check5")"; fi
if passed 6 && grep -q "ended as FAILED" "$tmp/out6"; then
  ok "a rank crashed, no restart left: the MLflow run $(tail -1 "$tmp/check6"), by loom run"
else
  bad "a rank crashed, no restart left (rc $rc6): $(tail -4 "$tmp/check6") $(grep "loom run" "$tmp/out6" | tail -3)"
fi

finish obs_mlflow
