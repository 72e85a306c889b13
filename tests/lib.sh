#!/usr/bin/env bash
# Shared by the script tests: the loom binary and source tree, a temporary
# directory removed at exit, ok/bad checks, and a job under loom run.
# Source it first; end the script with `finish NAME`.
set -u
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
SRC=${LOOM_SRC:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() {
  echo "FAILED: $1"
  fail=1
}
run() { # N ARGS...: loom run -n N loom ARGS (output in $tmp/out, code in $rc)
  local n=$1
  shift
  "$LOOM" run -n "$n" --timeout 120 "$LOOM" "$@" >"$tmp/out" 2>&1
  rc=$?
}
# RUN: each step's loss, the last one written for a step (a resumed run
# writes the steps after its checkpoint again), in step order.
loss_steps() {
  python3 -c 'import json, sys
seen = {}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    if "loss" in r: seen[r["step"]] = repr(r["loss"])
print(" ".join(seen[k] for k in sorted(seen)))' "$1"
}
# RUN REF WHAT: the same checkpoint bits (hashof RUN, which the script
# defines) and the same loss at every step, as one check.
same() {
  local a b
  a=$(hashof "$2")
  b=$(hashof "$1")
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(loss_steps "$1")" = "$(loss_steps "$2")" ] &&
    ok "$3: the bits of $(basename "$2") ($b)" ||
    bad "$3: '$b' against $(basename "$2")'s '$a'"
}
finish() { # NAME: the summary line and the exit status
  [ $fail = 0 ] && echo "$1: all passed"
  exit $fail
}
# RUN: "step:loss_scale:skipped_steps" of every metrics line (f16's loss
# scaler), in step order.
scales() {
  python3 -c 'import json, sys
seen = {}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    if "loss_scale" in r: seen[r["step"]] = "%d:%g:%d" % (r["step"], r["loss_scale"], r["skipped_steps"])
print(" ".join(seen[k] for k in sorted(seen)))' "$1"
}
# seeded_text FILE [BYTES]: English-like text of its own (seeded, the same
# bytes every time) for tests whose comparisons are tight: a file of the
# tree (docs) changes with edits, and moves them.
seeded_text() {
  python3 - "$1" "${2:-60000}" <<'PYEOF'
import random, sys
r = random.Random(1234)
words = ("the rank sends its part of the sum to the next stage while the "
         "pipeline waits for a micro batch and each layer keeps what "
         "backward needs in one arena of memory so that gradients flow "
         "back through the model in reverse order").split()
out, n, size = [], 0, int(sys.argv[2])
while n < size:
    s = " ".join(r.choice(words) for _ in range(r.randint(5, 17))) + ". "
    out.append(s[0].upper() + s[1:])
    n += len(s)
open(sys.argv[1], "w").write("".join(out)[:size])
PYEOF
}
