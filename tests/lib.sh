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
# A base for TCP ports this test listens on (base .. base+99): below the
# kernel's ephemeral range, from which every connecting socket and MPI's
# own listeners take their ports; a fixed port in it can be taken by a
# test running beside this one (seen: "Address already in use").
port_base() {
  local lo
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  if [ "$lo" -gt 11100 ]; then
    echo $((lo - 11100 + $$ % 10000))
  else
    echo $((20000 + $$ % 20000))
  fi
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
# WHAT NAME ARGS...: `loom train ARGS` on 2 ranks three times (f16): with
# an inf in rank 0's gradient at step 5, in rank 1's, and with none (run
# directories $tmp/NAME_r0, _r1 and _none; $HASH digests a checkpoint).
# Rank 1's overflow skips step 5 and halves the scale in rank 0's metrics;
# the two overflowing runs end with the same weights and scales, other
# weights than the run without.
inf_either_rank() {
  local what=$1 name=$2 a b c s0 s1
  shift 2
  LOOM_FAULT=0:5:grad_inf run 2 train "$@" --set "log.run_dir=$tmp/${name}_r0"
  a=$("$HASH" "$tmp/${name}_r0/ckpt")
  s0=$(scales "$tmp/${name}_r0")
  LOOM_FAULT=1:5:grad_inf run 2 train "$@" --set "log.run_dir=$tmp/${name}_r1"
  b=$("$HASH" "$tmp/${name}_r1/ckpt")
  s1=$(scales "$tmp/${name}_r1")
  run 2 train "$@" --set "log.run_dir=$tmp/${name}_none"
  c=$("$HASH" "$tmp/${name}_none/ckpt")
  case " $s1 " in
  *" 5:32768:1 "*) ok "$what: rank 1's inf at step 5 skips the step and halves the scale (rank 0's metrics)" ;;
  *) bad "$what: rank 0 did not skip rank 1's overflow: $s1" ;;
  esac
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && [ "$s0" = "$s1" ] &&
    ok "$what: the same weights whichever rank overflowed ($a), other than without ($c)" ||
    bad "$what: rank 0 inf '$a', rank 1 inf '$b', none '$c'"
}
# NAME STRATEGY [ARGS...]: `loom train "${cfg[@]}" ARGS` at dp 2 x tp 2
# under STRATEGY on 4 ranks, into $tmp/NAME; a failure is reported.
tp_mesh() {
  local name=$1 s=$2
  shift 2
  run 4 train "${cfg[@]}" --set "log.run_dir=$tmp/$name" --set parallel.tp=2 \
    --set parallel.strategy="$s" "$@"
  [ $rc = 0 ] || { bad "$name (rc $rc)"; cat "$tmp/out"; }
}
# STRATEGY REF: dp 2 x tp 2 under STRATEGY with rank 1 exiting after step
# 7, restarted by loom run --max-restarts from step 5's checkpoint; its
# parameters must be REF's bits.
tp_mesh_killed() {
  local s=$1 ref=$2
  LOOM_FAULT=1:7:exit:9 "$LOOM" run -n 4 --timeout 120 --max-restarts 1 \
    "$LOOM" train "${cfg[@]}" --resume auto --set "log.run_dir=$tmp/killed" \
    --set checkpoint.every=5 --set parallel.tp=2 --set parallel.strategy="$s" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 0 ] && grep -q "restart" "$tmp/out" || { bad "killed under $s (rc $rc)"; cat "$tmp/out"; }
  same "$tmp/killed" "$ref" "$s, rank 1 killed at step 7, restarted"
}
# "SETTINGS|MESSAGE"...: loom config check of cfg's model and data (its
# first 13 words) at tp 2 with each SETTINGS (`--set` between settings)
# exits 2 naming MESSAGE.
tp_refused() {
  local x
  for x in "$@"; do
    # shellcheck disable=SC2086
    "$LOOM" config check "${cfg[@]:0:13}" --set parallel.tp=2 --set ${x%%|*} >"$tmp/out" 2>&1
    rc=$?
    [ $rc = 2 ] && grep -qF "${x#*|}" "$tmp/out" && ok "config check tp 2 --set ${x%%|*}: rc 2" ||
      { bad "config check tp 2 --set ${x%%|*}: rc $rc"; cat "$tmp/out"; }
  done
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
