#!/usr/bin/env bash
# Damaged checkpoints and full disks, met by `loom train` under loom run.
# Each kind of damage to the newest checkpoint (a truncated shard, a flipped
# byte, a missing manifest, the manifest of another model) makes the resumed
# run fall back to the previous one with a warning naming the file, and end
# with the uninterrupted run's bits; all damaged is an error, never a fresh
# start; all of another model is a configuration error (rc 2). A save that fills the disk (a small tmpfs) leaves the previous
# checkpoint intact and is reported; checkpoint.on_error stop ends the run
# with the error (sync and async saves), continue warns and trains on.
source "$(dirname "$0")/lib.sh"
skip_unless_launcher

run 2 "$tmp/ref"
ref=$(digest "$tmp/ref/ckpt")
ref10=$(digest "$tmp/ref/ckpt/step_00000010")
[ $rc = 0 ] && [[ $ref == "step 30 "* ]] && [[ $ref10 == "step 10 "* ]] &&
  ok "uninterrupted: $ref" || { bad "uninterrupted run: rc $rc, $ref"; cat "$tmp/out"; }

# A run stopped after step 20: checkpoints of steps 10 and 20.
run 2 "$tmp/base" -- --stop-at 20
[ $rc = 0 ] && [ -d "$tmp/base/ckpt/step_00000020" ] && ok "stopped at step 20" ||
  { bad "stop at 20: rc $rc"; cat "$tmp/out"; }
# Another model's checkpoint of step 20, for its manifest.
"$LOOM" train "${job[@]}" --set model.hidden=[16] --set parallel.deterministic=false --set parallel.virtual_shards=8 \
  --set train.steps=20 --set "log.run_dir=$tmp/other" >"$tmp/out" 2>&1 ||
  { bad "other model"; cat "$tmp/out"; }

flip() { # FILE OFFSET: invert one byte
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $((255 - b)))" |
    dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

for kind in truncate flip manifest other; do
  dir="$tmp/d_$kind"
  cp -r "$tmp/base" "$dir"
  s20="$dir/ckpt/step_00000020"
  case $kind in
  truncate)
    truncate -s $(($(stat -c %s "$s20/shard_00001.bin") / 2)) "$s20/shard_00001.bin"
    want="shard_00001.bin: truncated" ;;
  flip)
    flip "$s20/shard_00000.bin" 100
    want="shard_00000.bin: block of 'params' .* checksum mismatch" ;;
  manifest)
    rm "$s20/manifest.json"
    want="manifest.json: missing" ;;
  other)
    cp "$tmp/other/ckpt/step_00000020/manifest.json" "$s20/manifest.json"
    want="manifest.json: written for another model" ;;
  esac
  run 2 "$dir"
  d=$(digest "$dir/ckpt")
  [ $rc = 0 ] && has "step_00000020 is not usable, passing over it: .*$want" &&
    has "using the older checkpoint .*step_00000010" && [ "$d" = "$ref" ] &&
    ok "$kind: fell back to step 10 naming the file, same bits at the end" ||
    { bad "$kind: rc $rc, '$d'"; cat "$tmp/out"; }
done

# Everything damaged: an error naming the directory, not a fresh start.
dir="$tmp/d_all"
cp -r "$tmp/base" "$dir"
rm "$dir/ckpt/step_00000020/manifest.json" "$dir/ckpt/step_00000010/manifest.json"
run 2 "$dir"
[ $rc = 1 ] && has "no valid checkpoint" && [ ! -d "$dir/ckpt/step_00000030" ] &&
  ok "all damaged: an error (rc 1), no fresh start" ||
  { bad "all damaged: rc $rc"; cat "$tmp/out"; }

# Every checkpoint written for another model (--resume auto, the model
# changed): a configuration error (rc 2, never restarted) naming each one and
# the way out, no fresh start over them, nothing removed.
dir="$tmp/d_model"
cp -r "$tmp/base" "$dir"
before=$(digest "$dir/ckpt")
run 2 "$dir" --max-restarts 2 --restart-delay 0 -- --set model.hidden=[16]
[ $rc = 2 ] && has "step_00000020 is not usable, passing over it: .*written for another model" &&
  has "step_00000010 is not usable, passing over it: .*written for another model" &&
  has "no checkpoint of this model \(2 written for another model; each named above\): to start this model from scratch here use --resume never" &&
  ! has "restart 1 of" && [ ! -d "$dir/ckpt/step_00000030" ] && [ "$(digest "$dir/ckpt")" = "$before" ] &&
  ok "another model's checkpoints: rc 2, each named, not restarted, kept" ||
  { bad "another model: rc $rc"; cat "$tmp/out"; }

# -- A full disk: a tmpfs with room for one checkpoint (about 200 KB) only.
mnt="$tmp/mnt"
mkdir -p "$mnt"
if ! mount -t tmpfs -o size=300k loom-fault "$mnt" 2>"$tmp/out"; then
  echo "disk full: skipped (cannot mount a tmpfs: $(cat "$tmp/out"))"
  finish
  exit
fi
cleanup_extra="umount '$mnt' 2>/dev/null"
for mode in stop async continue; do
  rm -rf "${mnt:?}"/*
  opt=(--set "checkpoint.dir=$mnt/ckpt")
  case $mode in
  stop) opt+=(--set checkpoint.on_error=stop) ;;
  async) opt+=(--set checkpoint.on_error=stop --set checkpoint.async=true) ;;
  continue) opt+=(--set checkpoint.on_error=continue) ;;
  esac
  # (a full disk is not retried: --max-restarts does not restart it)
  run 2 "$tmp/full_$mode" --max-restarts 2 --restart-delay 0 -- "${opt[@]}"
  d=$(digest "$mnt/ckpt")
  why=""
  has "No space left on device" || why="$why no ENOSPC message;"
  has "$mnt/ckpt/.step_00000020.tmp/shard_0000[01].bin" || why="$why file not named;"
  [ "$d" = "$ref10" ] || why="$why step 10 not intact ('$d');"
  [ "$(cat "$mnt/ckpt/latest")" = step_00000010 ] || why="$why latest moved;"
  ls -a "$mnt/ckpt" | grep -q '\.tmp' && why="$why temporary left;"
  "$LOOM" ckpt verify "$mnt/ckpt" >/dev/null 2>&1 || why="$why verify failed;"
  # No space: exit code 74, which loom run does not restart.
  [ $rc = 74 ] || why="$why rc $rc;"
  has "restart 1 of" && why="$why restarted;"
  has "not restarted, since it would fail the same way" || why="$why no 'not restarted';"
  if [ $mode = continue ]; then
    # Training goes on past the failed save of step 20; the final save of
    # step 30 fails too, and that is no success: the trained state is lost.
    has "checkpoint of step 20 not saved, training goes on" || why="$why no warning;"
    has "the final checkpoint \(step 30\) was not saved" || why="$why final save failure not said;"
  else
    has "saving the checkpoint of step 20" || why="$why step not named;"
  fi
  [ -z "$why" ] && ok "disk full, on_error $mode: step 10 intact, reported" ||
    { bad "disk full, $mode:$why"; cat "$tmp/out"; }
done
umount "$mnt" && cleanup_extra=""

finish
