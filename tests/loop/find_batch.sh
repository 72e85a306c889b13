#!/usr/bin/env bash
# loom train --find-batch-size: the sizes it tries (multiples of
# parallel.micro_batches), a trial that loom train refuses (exit 2: its
# config or data, not its memory) ends the search with that reason, and the
# configs it cannot serve are refused (exit 2); its trials die with it (a
# SIGKILL), a closed stdout stops it cleanly (exit 141), and a finder
# removes what one that is gone left in TMPDIR.
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1
export TMPDIR="$tmp/t"
mkdir -p "$TMPDIR"
cfg=$SRC/examples/small_gpt.yaml
head -c 200000 "$SRC/docs/parallel.md" >"$tmp/text.txt"
text=(--set "data.path=$tmp/text.txt")

# parallel.micro_batches=4: every trial a multiple of 4 (before, trial 1
# was refused, "4 does not divide train.batch_size (1)", and the finder
# said "nothing fits", exit 1). The budget: the smallest of these that the
# estimate fills with some rows (the process's own memory differs with the
# libraries: oneDNN 3 needs about 20 MiB more than oneDNN 2).
mem=""
for m in 28M 40M 56M 80M 120M; do
  a=$("$LOOM" estimate "$cfg" --memory $m "${text[@]}" --set parallel.micro_batches=4 2>/dev/null |
    sed -n 's/^largest train.batch_size within .*: \([0-9][0-9]*\)$/\1/p')
  [ -n "$a" ] && [ "$a" -ge 8 ] && { mem=$m; break; }
done
[ -n "$mem" ] || { bad "no budget up to 120M fits 8 rows by the estimate"; mem=120M; }
"$LOOM" train "$cfg" --find-batch-size --memory $mem "${text[@]}" \
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

# A budget above the machine's memory is capped at MemTotal, with a note:
# the estimate's bound is then MemTotal's (before: 99999T taken as given,
# trials doubled towards the OOM killer). A refused data path ends the
# search after the header, at the first trial.
kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
missing=(--set "data.path=$tmp/no-such-file")
"$LOOM" estimate "$cfg" --memory "${kb}K" "${missing[@]}" >"$tmp/est" 2>&1
want=$(sed -n 's/^largest train.batch_size within [0-9]*K under [a-z0-9]*: \([0-9]*\)$/\1/p' "$tmp/est")
"$LOOM" train "$cfg" --find-batch-size --memory 99999T "${missing[@]}" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
got=$(sed -n 's/^# the estimate allows \([0-9]*\);.*/\1/p' "$tmp/out")
grep -q "^# --memory 99999T is more than this machine's memory: the budget is MemTotal, " "$tmp/out" &&
  grep -q "(--memory, capped at MemTotal)" "$tmp/out" && [ -n "$want" ] && [ "$got" = "$want" ] &&
  ok "--memory 99999T: capped at MemTotal ($kb kB), bound $got" ||
  bad "--memory 99999T: bound '$got', want '$want' (MemTotal's), rc $rc"
# train.batch_size auto under a launcher (here its variable alone, and
# --print-config: nothing trains): the same cap, per rank of the host.
"$LOOM" estimate "$cfg" --memory "${kb}K" >"$tmp/est" 2>&1
want=$(sed -n 's/^largest train.batch_size within [0-9]*K under [a-z0-9]*: \([0-9]*\)$/\1/p' "$tmp/est")
OMPI_COMM_WORLD_SIZE=1 "$LOOM" train "$cfg" --set train.batch_size=auto --memory 99999T \
  --print-config >"$tmp/out" 2>&1
rc=$?
got=$(sed -n 's/^train.batch_size auto: \([0-9]*\) (loom estimate for 1 rank.*/\1/p' "$tmp/out")
[ $rc = 0 ] && grep -q "^train.batch_size auto: --memory 99999T is more than this host's memory" "$tmp/out" &&
  [ -n "$want" ] && [ "$got" = "$want" ] &&
  ok "batch_size auto under a launcher, --memory 99999T: MemTotal's $got" ||
  { bad "auto under a launcher: '$got', want '$want', rc $rc"; head -3 "$tmp/out"; }
# A budget below a MiB is printed in KiB (before: "within 0 MiB").
"$LOOM" train "$cfg" --find-batch-size --memory 1K "${text[@]}" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "within 1 KiB (--memory)" "$tmp/out" &&
  grep -q "^nothing fits: even 1 row needs more than 1 KiB by the estimate$" "$tmp/out" &&
  ok "--memory 1K: within 1 KiB, nothing fits" || { bad "--memory 1K: rc $rc"; cat "$tmp/out"; }

# The trials live and die with the finder, and what they leave is the
# finder's to remove. The old binary: a SIGKILLed finder's trial ran on
# (one for 4 minutes) and its directory stayed for good; `| head` killed
# the finder by SIGPIPE (exit 141), its directory left behind.
mlp=("$SRC/examples/small_mlp.yaml" --find-batch-size --memory 2G)
# SIGKILL of the finder: its trial dies with it (PR_SET_PDEATHSIG). The
# trial hangs after its first step (LOOM_FAULT, which the trial inherits),
# so nothing but its parent's death ends it; /proc polled, not slept on.
export TMPDIR="$tmp/k"
mkdir -p "$TMPDIR"
LOOM_FAULT=0:1:hang "$LOOM" train "${mlp[@]}" >"$tmp/out" 2>&1 &
pid=$!
trial=""
for _ in $(seq 1200); do # polled, 60 s at most: the trial started
  trial=$(pgrep -P $pid | head -1)
  [ -n "$trial" ] && break
  sleep 0.05
done
kill -KILL $pid
wait $pid 2>/dev/null
gone=""
for _ in $(seq 400); do # polled, 20 s at most: the trial gone (or a zombie)
  s=$(awk '{ print $3 }' "/proc/$trial/stat" 2>/dev/null)
  if [ -z "$s" ] || [ "$s" = Z ]; then
    gone=1
    break
  fi
  sleep 0.05
done
[ -n "$trial" ] && [ -n "$gone" ] && ok "finder SIGKILLed: its trial (pid $trial) died with it" ||
  bad "finder SIGKILLed: its trial '$trial' still runs"
[ -n "$trial" ] && kill -KILL "$trial" 2>/dev/null # the old binary's orphan
# Its directory stays (nothing ran to remove it); the next finder in that
# TMPDIR removes it, its finder being gone (its lock free), and nothing
# else: not a directory of that name without an owner file (an older
# loom's), not a link of that name to one with an owner.
mkdir -p "$TMPDIR/loom-find-batch-noownr" "$tmp/elsewhere/b1"
echo 1 >"$tmp/elsewhere/owner"
ln -s "$tmp/elsewhere" "$TMPDIR/loom-find-batch-linkkk"
left=$(ls -A "$TMPDIR" | grep -v -e noownr -e linkkk)
"$LOOM" train "$cfg" --find-batch-size --memory 200M \
  --set "data.path=$tmp/no-such-file" >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && [ -n "$left" ] && [ "$(ls -A "$TMPDIR" | tr '\n' ' ')" = "loom-find-batch-linkkk loom-find-batch-noownr " ] &&
  [ -f "$tmp/elsewhere/owner" ] && [ -d "$tmp/elsewhere/b1" ] &&
  ok "the next finder removed $left of the finder that is gone, nothing else" ||
  bad "the next finder (rc $rc): '$left' left as $(ls -A "$TMPDIR" | tr '\n' ' ')"
# stdout's reader gone (| head -2): the finder stops its trial, removes its
# directory and exits 141 as SIGPIPE would have (ignored meanwhile).
export TMPDIR="$tmp/p"
mkdir -p "$TMPDIR"
"$LOOM" train "${mlp[@]}" 2>"$tmp/err" | head -2 >"$tmp/out"
rc=${PIPESTATUS[0]}
[ $rc = 141 ] && [ "$(wc -l <"$tmp/out")" = 2 ] && [ -z "$(ls -A "$TMPDIR")" ] &&
  [ -z "$(pgrep -f "log.run_dir=$TMPDIR")" ] &&
  ok "| head -2: exit 141, its trial stopped, nothing left in TMPDIR" ||
  { bad "| head -2: rc $rc, left in TMPDIR: '$(ls -A "$TMPDIR")'"; cat "$tmp/err"; }
export TMPDIR="$tmp/t"
finish train_find_batch
