#!/usr/bin/env bash
# loom train --find-batch-size: the sizes it tries (multiples of
# parallel.micro_batches), a trial that loom train refuses (exit 2: its
# config or data, not its memory) ends the search with that reason, and the
# configs it cannot serve are refused (exit 2).
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1
export TMPDIR="$tmp/t"
mkdir -p "$TMPDIR"
cfg=$SRC/examples/small_gpt.yaml
head -c 200000 "$SRC/docs/parallel.md" >"$tmp/text.txt"
text=(--set "data.path=$tmp/text.txt")

# parallel.micro_batches=4: every trial a multiple of 4 (before, trial 1
# was refused, "4 does not divide train.batch_size (1)", and the finder
# said "nothing fits", exit 1).
"$LOOM" train "$cfg" --find-batch-size --memory 28M "${text[@]}" \
  --set parallel.micro_batches=4 >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
sizes=$(awk '$1 ~ /^[0-9]+$/ { print $1 }' "$tmp/out" | tr '\n' ' ')
b=$(sed -n 's/^largest train.batch_size that fits: \([0-9]*\)$/\1/p' "$tmp/out")
odd=$(for s in $sizes; do [ $((s % 4)) = 0 ] || echo "$s"; done)
[ -n "$sizes" ] && [ -z "$odd" ] && ok "micro_batches 4: trials at $sizes" ||
  bad "micro_batches 4: trials '$sizes' (not multiples of 4: '$odd')"
if [ -n "${LOOM_TEST_SANITIZED:-}" ]; then # shadow memory: maybe none fits
  [ $rc = 0 ] || [ $rc = 1 ] && ok "micro_batches 4 (sanitized): rc $rc" || bad "micro_batches 4: rc $rc"
else
  [ $rc = 0 ] && [ -n "$b" ] && [ $((b % 4)) = 0 ] && ok "micro_batches 4: answer $b" ||
    bad "micro_batches 4: rc $rc, answer '$b'"
fi
[ -z "$(ls -A "$TMPDIR")" ] && ok "the trials left nothing behind" || bad "left in TMPDIR: $(ls "$TMPDIR")"

# A trial refused (exit 2: here its data) ends the search with its reason,
# exit 2; it is never "did not fit".
"$LOOM" train "$cfg" --find-batch-size --memory 200M \
  --set "data.path=$tmp/no-such-file" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ $rc = 2 ] && grep -q "no-such-file" "$tmp/out" && ! grep -q "nothing fits" "$tmp/out" &&
  [ "$(awk '$1 ~ /^[0-9]+$/' "$tmp/out" | wc -l)" = 1 ] &&
  ok "a refused trial: exit 2 with its reason, no more trials" ||
  bad "a refused trial: rc $rc"
[ -z "$(ls -A "$TMPDIR")" ] && ok "the refused trial left nothing behind" || bad "left in TMPDIR: $(ls "$TMPDIR")"

# A pipeline or a tp group: refused as docs/parallel.md says, exit 2 (before,
# the estimate's "parallel.dp 0 x parallel.pp 2 is not the 1 ranks" and
# "parallel.tp 2 does not divide the 1 ranks", exit 1).
for kv in pp=2 tp=2; do
  "$LOOM" train "$cfg" --find-batch-size --memory 200M "${text[@]}" \
    --set "parallel.$kv" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "^loom train: --find-batch-size is refused with parallel.${kv%=*} 2" "$tmp/out" &&
    ok "parallel.$kv: refused, exit 2" || { bad "parallel.$kv: rc $rc"; cat "$tmp/out"; }
done

finish train_find_batch
