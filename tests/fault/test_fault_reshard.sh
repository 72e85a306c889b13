#!/usr/bin/env bash
# Resuming on another world size. Deterministic: 4 ranks, rank 2 killed
# after step 14, resumed on 2 ranks from the 4 ranks' checkpoint of step 10:
# the same bits as the uninterrupted run. Not deterministic (3 ranks is not
# a power of two): 2 ranks killed after step 14, resumed on 3 ranks, which go
# on from sample 320 of the epoch (10 steps x 32), none skipped or repeated
# (test_resume_data.c checks the order itself), then 2 ranks again.
source "$(dirname "$0")/lib.sh"
skip_unless_launcher
export LOOM_LOG=info

run 1 "$tmp/ref"
ref=$(digest "$tmp/ref/ckpt")
[ $rc = 0 ] && [[ $ref == "step 30 "* ]] && ok "uninterrupted, 1 rank: $ref" ||
  { bad "uninterrupted run: rc $rc, $ref"; cat "$tmp/out"; }

# -- 4 ranks killed, 2 ranks resume.
LOOM_FAULT=2:14:exit run 4 "$tmp/a"
[ $rc = 1 ] && [ "$(digest "$tmp/a/ckpt" | cut -d' ' -f2)" = 10 ] &&
  ok "4 ranks: rank 2 exits after step 14, checkpoint of step 10 (${secs} s)" ||
  { bad "4 ranks killed: rc $rc"; cat "$tmp/out"; }
run 2 "$tmp/a"
d=$(digest "$tmp/a/ckpt")
[ $rc = 0 ] && has "resuming from .*step_00000010 \(step 10, written by 4 ranks" &&
  [ "$d" = "$ref" ] && ok "4 -> 2 ranks: the same bits (${secs} s)" ||
  { bad "4 -> 2 ranks: rc $rc, '$d' vs '$ref'"; cat "$tmp/out"; }
left_behind "$tmp/a" && bad "4 -> 2: processes left behind"

# -- 2 ranks killed, 3 ranks resume, then 2 again; not deterministic.
nd=(--set parallel.deterministic=false --set parallel.virtual_shards=8)
LOOM_FAULT=1:14:exit run 2 "$tmp/b" -- "${nd[@]}" --set train.steps=40
[ $rc = 1 ] && [ "$(digest "$tmp/b/ckpt" | cut -d' ' -f2,4)" = "10 0:320" ] &&
  ok "2 ranks: killed after step 14, checkpoint of step 10 at sample 320" ||
  { bad "2 ranks killed: rc $rc: $(digest "$tmp/b/ckpt")"; cat "$tmp/out"; }
run 3 "$tmp/b" -- "${nd[@]}" --set train.steps=40 --stop-at 20
d=$(digest "$tmp/b/ckpt/step_00000020")
[ $rc = 0 ] && has "resuming from .*step_00000010 \(step 10, written by 2 ranks; data: epoch 0 from sample 320\)" &&
  [[ $d == "step 20 sample 0:800 "* ]] &&
  ok "2 -> 3 ranks: from sample 320, 10 steps of 48 to sample 800" ||
  { bad "2 -> 3 ranks: rc $rc, $d"; cat "$tmp/out"; }
run 2 "$tmp/b" -- "${nd[@]}" --set train.steps=40
d=$(digest "$tmp/b/ckpt")
[ $rc = 0 ] && has "written by 3 ranks; data: epoch 0 from sample 800\)" &&
  [[ $d == "step 40 sample 0:1440 "* ]] &&
  ok "3 -> 2 ranks: from sample 800 to 1440 at step 40" ||
  { bad "3 -> 2 ranks: rc $rc, $d"; cat "$tmp/out"; }
left_behind "$tmp/b" && bad "2 -> 3: processes left behind"

finish
