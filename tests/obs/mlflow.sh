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
#      value, and the run is FINISHED.
# mlflow_driver (tests/obs/mlflow_driver.c) does the logging. LOOM_NO_PYPI=1
# skips it (no PyPI), saying so.
. "$(dirname "$0")/../lib.sh"
export LOOM_LOG=warn
if [ "${LOOM_NO_PYPI:-0}" = 1 ]; then
  echo "skipped: LOOM_NO_PYPI=1 (the MLflow server and client come from PyPI)"
  exit 0
fi
DRIVER=${MLFLOW_DRIVER:?MLFLOW_DRIVER must name the mlflow_driver executable}
PY=$("$SRC/scripts/ensure-mlflow.sh") || { bad "scripts/ensure-mlflow.sh failed"; finish obs_mlflow; }
MLFLOW=$(dirname "$PY")/mlflow
echo "mlflow $("$PY" -c 'import mlflow; print(mlflow.__version__)')"
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

start_server "first start" || finish obs_mlflow

# ---------------------------------------------------------------- 1. a run
{
  cat "$SRC/examples/small_gpt.yaml"
  "$PY" -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 400)'
} >"$tmp/artifact.bin"
"$DRIVER" basic "$URI" loom-basic "$tmp/artifact.bin" >"$tmp/out1" 2>&1 ||
  bad "mlflow_driver basic (rc $?): $(cat "$tmp/out1")"
run1=$(sed -n 's/^run_id=//p' "$tmp/out1")
"$PY" - "$URI" "$run1" "$tmp/artifact.bin" "$tmp/dl" <<'PY' >"$tmp/check1" 2>&1
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
if [ $? = 0 ]; then ok "a run read back with MlflowClient: $(tail -1 "$tmp/check1")"; else bad "a run: $(tail -5 "$tmp/check1")"; fi

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
"$PY" - "$URI" "$run2" <<'PY' >"$tmp/check2" 2>&1
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
if [ $? = 0 ]; then ok "outage: $(tail -1 "$tmp/check2")"; else bad "outage: $(tail -5 "$tmp/check2")"; fi
finish obs_mlflow
