#!/usr/bin/env bash
# loom report on hand-made run directories whose files are damaged or not
# files at all: a pipe at metrics.jsonl, config.yaml or env.json is refused
# at once, naming it (never waited on); a NUL byte in metrics.jsonl makes
# its line unreadable, and the lines after it are read.
. "$(dirname "$0")/../lib.sh"
export LOOM_LOG=warn
good='{"step":5,"loss":1,"step_s":0.1}
{"step":10,"loss":2,"step_s":0.1}'

# A pipe at metrics.jsonl: exit 1 naming it, within seconds.
mkdir "$tmp/p1" && mkfifo "$tmp/p1/metrics.jsonl"
timeout 20 "$LOOM" report "$tmp/p1" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "p1/metrics.jsonl: not a regular file" "$tmp/out" &&
  ok "a pipe at metrics.jsonl: exit 1 naming it" || bad "pipe at metrics.jsonl: rc $rc: $(cat "$tmp/out")"
# A pipe at config.yaml or env.json: the page is written, a warning names it.
for f in config.yaml env.json; do
  mkdir "$tmp/p-$f" && echo "$good" >"$tmp/p-$f/metrics.jsonl" && mkfifo "$tmp/p-$f/$f"
  timeout 20 "$LOOM" report "$tmp/p-$f" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 0 ] && grep -q "p-$f/$f: not a regular file" "$tmp/out" &&
    ok "a pipe at $f: named, left out" || bad "pipe at $f: rc $rc: $(cat "$tmp/out")"
done

# A NUL byte: its line is unreadable; the two after it are read.
mkdir "$tmp/nul"
printf 'x\000\n{"step":5,"loss":1,"step_s":0.1}\n{"step":10,"loss":2,"step_s":0.1}\n' >"$tmp/nul/metrics.jsonl"
"$LOOM" report "$tmp/nul" >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "from 2 metrics lines" "$tmp/out" &&
  grep -q "1 unreadable lines skipped, the first at line 1" "$tmp/nul/report.html" &&
  ok "a NUL byte: its line skipped, the rest read" || bad "NUL byte: rc $rc: $(cat "$tmp/out")"
printf '{"step":5,"loss":1,"st\000ep_s":0.1}\n{"step":10,"loss":2,"step_s":0.1}\n' >"$tmp/nul/metrics.jsonl"
"$LOOM" report "$tmp/nul" >"$tmp/out" 2>&1 && grep -q "from 1 metrics lines" "$tmp/out" &&
  ok "a NUL inside a JSON line: that line unreadable" || bad "NUL inside a line: $(cat "$tmp/out")"

finish obs_report_input
