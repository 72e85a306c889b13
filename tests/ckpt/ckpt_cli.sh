#!/usr/bin/env bash
# loom ckpt inspect / verify on checkpoints written by ckpt_sample: exit
# codes, what is printed, and damage found with the file named.
set -u
LOOM=${LOOM_BIN:?}
SAMPLE=${CKPT_SAMPLE:?}
T=$(mktemp -d /tmp/loom_ckpt_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
passes=0
check() { # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passes=$((passes + 1)); else
    echo "FAIL: $name" >&2
    fails=$((fails + 1))
  fi
}
run() { # run CMD... : output in $out, status in $rc
  out=$("$@" 2>&1)
  rc=$?
}
has() { grep -qF -- "$1" <<<"$out"; }

R=$T/ckpt
"$SAMPLE" "$R" 100 1 || exit 1
"$SAMPLE" "$R" 200 3 || exit 1

run "$LOOM" ckpt inspect "$R/step_00000200"
check "inspect exits 0" test "$rc" -eq 0
check "inspect shows the step" has "step         200"
check "inspect shows the world size" has "world size   3 (strategy zero1)"
check "inspect shows the optimizer" has "optimizer    adamw, step 200"
check "inspect shows the data position" has "data         epoch 1, batch 17, sample 544"
check "inspect lists buffers" has "adamw.v"
check "inspect lists parameters" has "fc1.weight"
check "inspect shows shapes" has "64x64"
check "inspect checks files" has "shard_00002.bin  rank 2"
check "inspect says OK" has "OK"
check "inspect shows extra" has '{"best_val_loss":1.93}'

run "$LOOM" ckpt inspect "$R/latest"
check "inspect latest file" has "checkpoint   $R/step_00000200"
run "$LOOM" ckpt inspect "$R"
check "inspect root lists" has "step_00000100"
check "inspect root resumes from 200" has "checkpoint   $R/step_00000200"
run "$LOOM" ckpt inspect --json "$R/step_00000100"
check "inspect --json" has '"format":	"loom-checkpoint"'

run "$LOOM" ckpt verify "$R"
check "verify healthy exits 0" test "$rc" -eq 0

# A flipped byte in rank 1's shard of step 200.
printf '\x01' | dd of="$R/step_00000200/shard_00001.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
run "$LOOM" ckpt verify "$R/step_00000200"
check "verify damaged exits 1" test "$rc" -eq 1
check "verify names the file" has "$R/step_00000200/shard_00001.bin: block of 'params'"
check "verify says checksum" has "checksum mismatch"
run "$LOOM" ckpt verify "$R"
check "verify root exits 1" test "$rc" -eq 1
check "verify root: 100 OK" has "step_00000100"
run "$LOOM" ckpt inspect "$R/step_00000200"
check "inspect damaged exits 1" test "$rc" -eq 1
check "inspect damaged says BAD" has "BAD: $R/step_00000200/shard_00001.bin"
run "$LOOM" ckpt inspect "$R"
check "inspect root falls back to 100" has "checkpoint   $R/step_00000100"
check "inspect root with damage exits 1" test "$rc" -eq 1
check "inspect root warns" has "step_00000200 is not usable"

# A truncated shard and a missing manifest.
"$SAMPLE" "$R" 300 2 || exit 1
truncate -s 1000 "$R/step_00000300/shard_00000.bin"
run "$LOOM" ckpt verify "$R/step_00000300"
check "truncated exits 1" test "$rc" -eq 1
check "truncated named" has "$R/step_00000300/shard_00000.bin: truncated: 1000 bytes"
rm "$R/step_00000100/manifest.json"
run "$LOOM" ckpt verify "$R/step_00000100"
check "no manifest exits 1" test "$rc" -eq 1
check "no manifest named" has "$R/step_00000100/manifest.json: missing"
rm "$R/latest"
run "$LOOM" ckpt verify "$R"
check "missing latest exits 1" test "$rc" -eq 1
check "missing latest named" has "$R/latest: missing"

# A FIFO or a directory in place of a checkpoint file: "not a regular
# file", never a read that waits for a writer (timeout turns a hang into a
# failed check).
for what in fifo dir; do
  for f in shard_00000.bin manifest.json; do
    C=$T/$what-$f
    "$SAMPLE" "$C" 100 1 || exit 1
    rm "$C/step_00000100/$f"
    if [ $what = fifo ]; then mkfifo "$C/step_00000100/$f"; else mkdir "$C/step_00000100/$f"; fi
    for cmd in "verify" "inspect" "inspect --no-verify"; do
      # shellcheck disable=SC2086
      run timeout 10 "$LOOM" ckpt $cmd "$C/step_00000100"
      check "$what as $f: $cmd exits 1" test "$rc" -eq 1
      check "$what as $f: $cmd names it" has "$C/step_00000100/$f: not a regular file"
    done
    run timeout 10 "$LOOM" ckpt verify "$C"
    check "$what as $f: verify of the directory exits 1" test "$rc" -eq 1
    check "$what as $f: verify of the directory names it" has "$C/step_00000100/$f: not a regular file"
    # inspect of the directory searches as `loom train --resume auto` does
    run timeout 10 "$LOOM" ckpt inspect "$C"
    check "$what as $f: the resume search passes over it" has "step_00000100 is not usable"
  done
done

# A step directory whose manifest says another step (copied or renamed by
# hand): BAD in verify, as training passes over it.
"$SAMPLE" "$T/mv" 100 1 || exit 1
mv "$T/mv/step_00000100" "$T/mv/step_00000150"
echo step_00000150 >"$T/mv/latest"
run "$LOOM" ckpt verify "$T/mv"
check "renamed step exits 1" test "$rc" -eq 1
check "renamed step named" has "step_00000150   "
check "renamed step says why" has "$T/mv/step_00000150/manifest.json: says step 100, not 150"

# An empty directory: nothing verified is a failure, not a pass (it exited
# 0), for verify and inspect alike.
mkdir "$T/empty"
run "$LOOM" ckpt verify "$T/empty"
check "verify empty dir exits 1" test "$rc" -eq 1
check "verify empty dir says so" has "no checkpoints in $T/empty: nothing to check"
run "$LOOM" ckpt inspect "$T/empty"
check "inspect empty dir exits 1" test "$rc" -eq 1

# inspect of a directory exits 1 whenever its list shows damage, as verify
# does, though training would resume from a good checkpoint: a garbage
# `latest` exited 0 while a damaged shard exited 1.
"$SAMPLE" "$T/lat" 100 1 || exit 1
"$SAMPLE" "$T/lat" 200 1 || exit 1
run "$LOOM" ckpt inspect "$T/lat"
check "inspect healthy dir exits 0" test "$rc" -eq 0
echo garbage >"$T/lat/latest"
run "$LOOM" ckpt inspect "$T/lat"
check "inspect, latest garbage: exit 1" test "$rc" -eq 1
check "inspect, latest garbage: BAD" has "latest          BAD: $T/lat/latest: does not name a checkpoint"
check "inspect, latest garbage: resume target shown" has "checkpoint   $T/lat/step_00000200"
run "$LOOM" ckpt verify "$T/lat"
check "verify, latest garbage: exit 1" test "$rc" -eq 1
echo step_00000200 >"$T/lat/latest"
printf '\x01' | dd of="$T/lat/step_00000100/shard_00000.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
run "$LOOM" ckpt inspect "$T/lat"
check "inspect, older checkpoint damaged: exit 1" test "$rc" -eq 1
check "inspect, older checkpoint damaged: resume target shown" has "checkpoint   $T/lat/step_00000200"
# Usage errors.
run "$LOOM" ckpt
check "no args exits 2" test "$rc" -eq 2
run "$LOOM" ckpt frobnicate "$R"
check "bad subcommand exits 2" test "$rc" -eq 2
run "$LOOM" ckpt verify
check "verify without dir exits 2" test "$rc" -eq 2
run "$LOOM" ckpt --help
check "help exits 0" test "$rc" -eq 0
check "help documents verify" has "loom ckpt verify DIR"
run "$LOOM" ckpt inspect "$T/nope"
check "missing dir exits 1" test "$rc" -eq 1
check "missing dir named" has "$T/nope: no such checkpoint directory"

echo "$passes passed, $fails failed"
test "$fails" -eq 0
