#!/usr/bin/env bash
# loom train never deletes or writes through a link, and deletes only its
# own names: pruning (checkpoint.keep), a restart from scratch (--resume
# never) and the clean-up of a failed save, each met with links to victims,
# a file in place of a step directory, a stranger's file in a step
# directory, `latest` pointing outside, a read-only step directory and a
# metrics file replaced by a link. Every victim lives in this test's own
# temporary directory and is compared by checksum afterwards.
set -u
LOOM=${LOOM_BIN:?}
SRC=${LOOM_SRC:?}
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
T=$(mktemp -d /tmp/loom_safety_train.XXXXXX)
# Link-safe removal of our own directory: rm -rf never follows links.
trap 'chmod -R u+w "$T" 2>/dev/null; rm -rf "$T"' EXIT
passed=0
failed=0
check() { # description, then a command that must succeed
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
    passed=$((passed + 1))
  else
    echo "FAILED: $what"
    failed=$((failed + 1))
  fi
}
has() { grep -qF -- "$1" "$T/out"; }
# A tree's checksum: names, link targets, contents (tar does not follow
# links).
sum_tree() { tar --sort=name --mtime=@0 -cf - -C "$1" . 2>/dev/null | sha256sum; }
sum_file() { sha256sum <"$1"; }

# A tiny MLP, a checkpoint every 2 steps.
train() { # RUN_DIR [options]: output in $T/out, status in $rc
  local dir=$1
  shift
  "$LOOM" train "$SRC/examples/small_mlp.yaml" --set log.progress=off \
    --set train.eval_every=0 --set checkpoint.every=2 \
    --set "log.run_dir=$dir" "$@" >"$T/out" 2>&1
  rc=$?
}

# Victims: a directory whose names are loom's own, and a file.
V=$T/victim
mkdir -p "$V/sub"
echo '{"victim": true}' >"$V/manifest.json"
echo precious >"$V/shard_00000.bin"
echo deep >"$V/sub/deep.txt"
VF=$T/victim_file
echo step_00000006 >"$VF"
sv=$(sum_tree "$V")
sf=$(sum_file "$VF")
intact() { [ "$(sum_tree "$V")" = "$sv" ] && [ "$(sum_file "$VF")" = "$sf" ]; }

# ---- pruning, with strangers planted in a run's checkpoint directory
R=$T/prune
train "$R" --set train.steps=6 --set checkpoint.keep=1
check "first run trains" test "$rc" -eq 0
C=$R/ckpt
ln -s "$V" "$C/step_00000001"
echo "a file" >"$C/step_00000003"
mkdir "$C/step_00000004" && cp "$C/step_00000006/manifest.json" "$C/step_00000004/"
chmod 555 "$C/step_00000004"
echo mine >"$C/step_00000006/notes.txt"
ln -s "$VF" "$C/step_00000006/shard_00001.bin"
rm "$C/latest" && ln -s "$VF" "$C/latest"
LOOM_LOG=info train "$R" --set train.steps=12 --set checkpoint.keep=1
check "prune: the run goes on (exit 0)" test "$rc" -eq 0
check "prune: victims intact" intact
check "prune: latest not followed" has "ckpt/latest: a symbolic link, not followed"
check "prune: resumed from step 6" has "step_00000006 (step 6"
check "prune: linked step reported" has "ckpt/step_00000001: a symbolic link, not followed; left in place"
check "prune: file in place of a step reported" has "ckpt/step_00000003: a file loom did not write; left in place"
check "prune: read-only step reported" has "ckpt/step_00000004: a read-only directory; left in place"
check "prune: stranger's file reported" has "ckpt/step_00000006/notes.txt: a file loom did not write"
check "prune: link inside a step reported" has "ckpt/step_00000006/shard_00001.bin: a symbolic link, not followed"
check "prune: latest replaced, reported" has "ckpt/latest was a symbolic link: replaced by a file"
check "prune: links kept" test -L "$C/step_00000001" -a -L "$C/step_00000006/shard_00001.bin"
check "prune: kept step whole" test -f "$C/step_00000006/manifest.json" -a -f "$C/step_00000004/manifest.json"
check "prune: loom's old steps pruned" test ! -e "$C/step_00000008" -a ! -e "$C/step_00000010"
check "prune: newest saved" test -f "$C/step_00000012/manifest.json"
check "prune: latest is a file naming step 12" grep -qx step_00000012 "$C/latest"

# ---- restart from scratch over an earlier run's steps
R=$T/restart
train "$R" --set train.steps=4 --set checkpoint.keep=0
check "earlier run trains" test "$rc" -eq 0
C=$R/ckpt
rm -r "$C/step_00000002" && ln -s "$V" "$C/step_00000002"
ln -s "$VF" "$C/step_00000004/shard_00001.bin"
echo mine >"$C/step_00000004/notes.txt"
echo "a file" >"$C/step_00000006"
mkdir "$C/step_00000003" && cp "$C/step_00000004/manifest.json" "$C/step_00000003/"
chmod 555 "$C/step_00000003"
rm "$C/latest" && ln -s "$VF" "$C/latest"
train "$R" --resume never --set train.steps=6 --set checkpoint.keep=1
check "restart: exit 0" test "$rc" -eq 0
check "restart: victims intact" intact
check "restart: old linked step reported" has "ckpt/.step_00000002.tmp: a symbolic link, not followed; left in place"
check "restart: link inside an old step reported" has "ckpt/.step_00000004.tmp/shard_00001.bin: a symbolic link, not followed"
check "restart: stranger's file in an old step reported" has "ckpt/.step_00000004.tmp/notes.txt: a file loom did not write"
check "restart: file in place of a step reported" has "ckpt/.step_00000006.tmp: a file loom did not write"
check "restart: read-only step reported" has "ckpt/step_00000003: a read-only directory; left in place"
check "restart: latest replaced, reported" has "ckpt/latest was a symbolic link: replaced by a file"
check "restart: new steps saved" test -f "$C/step_00000006/manifest.json" -a ! -L "$C/step_00000006"
check "restart: latest names step 6" grep -qx step_00000006 "$C/latest"

# ---- a failed save's clean-up: a stale temporary holding a link
R=$T/failed
C=$R/ckpt
mkdir -p "$C/.step_00000002.tmp"
ln -s "$VF" "$C/.step_00000002.tmp/shard_00000.bin"
echo mine >"$C/.step_00000002.tmp/notes.txt"
echo "a file" >"$C/step_00000001"
mkdir "$C/step_00000000" && echo x >"$C/step_00000000/manifest.json"
chmod 555 "$C/step_00000000"
ln -s "$V" "$C/step_00000003"
ln -s "$VF" "$C/latest"
train "$R" --resume never --set train.steps=4 --set checkpoint.keep=1 \
  --set checkpoint.on_error=continue
check "failed save: the run goes on (exit 0)" test "$rc" -eq 0
check "failed save: victims intact" intact
check "failed save: the save names the link" has ".step_00000002.tmp/shard_00000.bin: create failed: a symbolic link is in its place"
check "failed save: clean-up reports the link" has ".step_00000002.tmp/shard_00000.bin: a symbolic link, not followed; left in place"
check "failed save: clean-up reports the stranger" has ".step_00000002.tmp/notes.txt: a file loom did not write"
check "failed save: file in place of a step reported" has "ckpt/step_00000001: a file loom did not write"
check "failed save: read-only step reported" has "ckpt/step_00000000: a read-only directory"
check "failed save: linked step reported" has "ckpt/step_00000003: a symbolic link, not followed"
check "failed save: latest replaced, reported" has "ckpt/latest was a symbolic link: replaced by a file"
check "failed save: the next save works" test -f "$C/step_00000004/manifest.json"

# ---- metrics.jsonl replaced by a link, or hard-linked to a victim
R=$T/metrics
mkdir -p "$R"
ln -s "$VF" "$R/metrics.jsonl"
train "$R" --set train.steps=2
check "metrics link: refused (non-zero exit)" test "$rc" -ne 0
check "metrics link: the error names the file" has "$R/metrics.jsonl: cannot open for writing: a symbolic link is in its place"
check "metrics link: victims intact" intact
rm "$R/metrics.jsonl" && ln "$VF" "$R/metrics.jsonl"
train "$R" --set train.steps=2 --resume never
check "metrics hard link: refused" test "$rc" -ne 0
check "metrics hard link: the error says why" has "it has other hard links"
check "metrics hard link: victims intact" intact

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
