#!/usr/bin/env bash
# `loom data`: help, usage errors (exit 2), failures (exit 1) with one clear
# line, the KJV step when `bible` is installed, info and shard.
set -u
LOOM=${LOOM_BIN:?LOOM_BIN not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # description, then a command that must succeed
  local what=$1
  shift
  if "$@"; then pass=$((pass + 1)); else
    fail=$((fail + 1))
    echo "FAIL: $what" >&2
  fi
}
rc_of() { "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }

check "data --help" test "$(rc_of "$LOOM" data --help)" = 0
check "help lists kjv" grep -q "kjv" "$tmp/out"
check "data kjv --help" test "$(rc_of "$LOOM" data kjv --help)" = 0
check "kjv help names the packages" grep -q "bible-kjv-text" "$tmp/out"
check "no subcommand: usage" test "$(rc_of "$LOOM" data)" = 2
check "unknown subcommand" test "$(rc_of "$LOOM" data nope)" = 2
check "unknown option" test "$(rc_of "$LOOM" data kjv --nope)" = 2
check "unknown option named" grep -q -- "--nope" "$tmp/err"
check "missing bible: exit 1" \
  test "$(rc_of "$LOOM" data kjv --out "$tmp/k.txt" --bible /nonexistent/bible)" = 1
check "missing bible: one line naming the packages" \
  grep -q "^loom data kjv: .*apt-get install bible-kjv bible-kjv-text" "$tmp/err"

if command -v bible >/dev/null && [ -r /usr/lib/bible.data ]; then
  check "kjv prepares" test "$(LOOM_DATA_DIR="$tmp/dd" rc_of "$LOOM" data kjv)" = 0
  check "kjv counts" grep -q "31102 verses, 4137850 bytes, CRC32C acd215d7" "$tmp/out"
  check "kjv default path" test "$(stat -c %s "$tmp/dd/kjv.txt")" = 4137850
  check "kjv cached" test "$(LOOM_DATA_DIR="$tmp/dd" rc_of "$LOOM" data kjv)" = 0
  check "kjv says cached" grep -q "cached" "$tmp/out"
  check "info on text" test "$(rc_of "$LOOM" data info "$tmp/dd/kjv.txt")" = 0
  check "info splits" grep -q "val split: 413785 bytes, 3232 windows" "$tmp/out"
else
  echo "SKIP: kjv preparation (apt-get install bible-kjv bible-kjv-text)"
fi

printf 'hello world, hello loom\n' >"$tmp/t.txt"
check "shard writes" test "$(rc_of "$LOOM" data shard "$tmp/t.txt" "$tmp/t.bin")" = 0
check "shard size" test "$(stat -c %s "$tmp/t.bin")" = $((1024 + 2 * 24))
check "info on shard" test "$(rc_of "$LOOM" data info "$tmp/t.bin")" = 0
check "info shard fields" grep -q "magic 20240520 version 1, 24 tokens of 2 bytes, largest id 119" "$tmp/out"
# A large input is read and written a block at a time: 64 MiB of bytes
# (a 128 MiB shard) in a few MiB of memory, where holding the text, its
# tokens and the shard took 5 times the input (about 320 MiB here).
truncate -s 64M "$tmp/big.txt"
/usr/bin/time -f "%M" -o "$tmp/rss" "$LOOM" data shard "$tmp/big.txt" "$tmp/big.bin" >"$tmp/out" 2>"$tmp/err"
check "shard of 64 MiB: written" grep -q "big.bin: 67108864 tokens" "$tmp/out"
check "shard of 64 MiB: its size" test "$(stat -c %s "$tmp/big.bin")" = $((1024 + 2 * 67108864))
check "shard of 64 MiB: peak RSS $(tail -1 "$tmp/rss") KiB under 48 MiB" test "$(tail -1 "$tmp/rss")" -lt 49152
check "shard of 64 MiB: reads back" test "$(rc_of "$LOOM" data info "$tmp/big.bin")" = 0
check "shard of 64 MiB: its tokens" grep -q "67108864 tokens of 2 bytes, largest id 0" "$tmp/out"
rm -f "$tmp/big.txt" "$tmp/big.bin"
# Stopped while it writes (once its temporary exists), it leaves no hidden
# .OUT.tmp.PID behind, and ends by the signal (130, 143).
mkdir "$tmp/stop"
truncate -s 600M "$tmp/stop/in.txt"
for sig in INT TERM; do
  "$LOOM" data shard "$tmp/stop/in.txt" "$tmp/stop/out.bin" 2>/dev/null &
  p=$!
  for _ in $(seq 1000); do # until the temporary exists (10 s at most)
    compgen -G "$tmp/stop/.out.bin.tmp.*" >/dev/null && break
    sleep 0.01
  done
  kill -"$sig" $p
  wait $p
  rc=$?
  want=$([ $sig = INT ] && echo 130 || echo 143)
  check "shard stopped by SIG$sig: exit $want ($rc)" test "$rc" = "$want"
  check "shard stopped by SIG$sig: no temporary left" test -z "$(compgen -G "$tmp/stop/.out.bin.tmp.*")"
  check "shard stopped by SIG$sig: no shard" test ! -e "$tmp/stop/out.bin"
done
# One killed outright (SIGKILL: nothing runs) leaves it; the next shard of
# that name removes it, not a live process's nor a link of that name.
dead=$(sh -c 'echo $$')
echo partial >"$tmp/stop/.out.bin.tmp.$dead"
echo live >"$tmp/stop/.out.bin.tmp.$$"
ln -s "$tmp/t.txt" "$tmp/stop/.out.bin.tmp.999999"
check "shard after a SIGKILLed one" test "$(rc_of "$LOOM" data shard "$tmp/t.txt" "$tmp/stop/out.bin")" = 0
check "shard after a SIGKILLed one: its temporary removed" test ! -e "$tmp/stop/.out.bin.tmp.$dead"
check "shard after a SIGKILLed one: a live process's kept" test -e "$tmp/stop/.out.bin.tmp.$$"
check "shard after a SIGKILLed one: a link kept" test -L "$tmp/stop/.out.bin.tmp.999999"
rm -rf "$tmp/stop"
head -c 1000 "$tmp/t.bin" >"$tmp/cut.bin"
check "info on a truncated shard: exit 1" test "$(rc_of "$LOOM" data info "$tmp/cut.bin")" = 1
check "truncated shard named" grep -q "cut.bin: truncated" "$tmp/err"

# bench --data kjv on a token shard uses the shard reader, as info does: a
# truncated shard is an error (it was read as text and "benchmarked", rc 0)
seq 1 1000 >"$tmp/long.txt"
check "shard of long.txt" test "$(rc_of "$LOOM" data shard "$tmp/long.txt" "$tmp/long.bin")" = 0
check "bench on a shard" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.bin" --batch 2 --batches 3 --compute 1)" = 0
head -c 2000 "$tmp/long.bin" >"$tmp/long-cut.bin"
check "bench on a truncated shard: exit 1" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long-cut.bin" --batch 2 --batches 3 --compute 1)" = 1
check "bench: truncated shard named" grep -q "^loom data bench: $tmp/long-cut.bin: truncated" "$tmp/err"
check "bench on text" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.txt" --batch 2 --batches 3 --compute 1)" = 0

# option values out of range are usage errors (exit 2) naming the value as
# given and the range, before any work: --context 99999999999999999999 was
# clamped to 2^63-1 (exit 1), --prefetch 100000000 failed after a first pass
# (exit 1), --compute 0.5 was refused though the help did not ask for an
# integer
check "info --context too large: exit 2" \
  test "$(rc_of "$LOOM" data info "$tmp/long.txt" --context 99999999999999999999)" = 2
check "info --context too large: named as given" \
  grep -q -- "--context needs an integer in \[1, 16777216\], not '99999999999999999999'" "$tmp/err"
check "info --context -5: exit 2" test "$(rc_of "$LOOM" data info "$tmp/long.txt" --context -5)" = 2
check "bench --prefetch 100000000: exit 2" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.txt" --batch 2 --batches 3 --prefetch 100000000)" = 2
check "bench --prefetch: the range named" \
  grep -q -- "--prefetch needs an integer in \[0, 64\], not '100000000'" "$tmp/err"
check "bench --prefetch: nothing run" test ! -s "$tmp/out"
check "bench --prefetch 0" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.txt" --batch 2 --batches 3 --prefetch 0 --compute 1)" = 0
check "bench --compute 0.5" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.txt" --batch 2 --batches 3 --compute 0.5)" = 0
check "bench --compute 0.5 reported" grep -q "prefetch 2, 0.5 ms compute per step" "$tmp/out"
check "bench --compute -1: exit 2" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.txt" --compute -1)" = 2
check "bench --compute -1 named" grep -q -- "--compute needs milliseconds in \[0, 60000\]" "$tmp/err"
check "bench --batches too large: exit 2" \
  test "$(rc_of "$LOOM" data bench --data kjv --path "$tmp/long.txt" --batches 99999999999999999999)" = 2

# shard: an input that is not a regular file is refused (a FIFO blocked
# forever, a directory made an empty shard), a missing one says why; the
# output is never a device, pipe or directory, nor written through a link
mkfifo "$tmp/in-fifo" "$tmp/out-fifo.bin"
mkdir "$tmp/in-dir" "$tmp/out-dir.bin"
check "shard: FIFO input: exit 1" \
  test "$(rc_of timeout 10 "$LOOM" data shard "$tmp/in-fifo" "$tmp/o.bin")" = 1
check "shard: FIFO input named" grep -q "in-fifo: not a regular file" "$tmp/err"
check "shard: directory input: exit 1" \
  test "$(rc_of "$LOOM" data shard "$tmp/in-dir" "$tmp/o.bin")" = 1
check "shard: directory input named" grep -q "in-dir: not a regular file" "$tmp/err"
check "shard: missing input: exit 1" \
  test "$(rc_of "$LOOM" data shard "$tmp/no-such" "$tmp/o.bin")" = 1
check "shard: missing input's reason" grep -q "no-such: No such file or directory" "$tmp/err"
check "shard: nothing written for a bad input" test ! -e "$tmp/o.bin"
check "shard: FIFO output: exit 1" \
  test "$(rc_of timeout 10 "$LOOM" data shard "$tmp/t.txt" "$tmp/out-fifo.bin")" = 1
check "shard: FIFO output named" grep -q "out-fifo.bin: .*not a regular file" "$tmp/err"
check "shard: FIFO output left in place" test -p "$tmp/out-fifo.bin"
check "shard: directory output: exit 1" \
  test "$(rc_of "$LOOM" data shard "$tmp/t.txt" "$tmp/out-dir.bin")" = 1
check "shard: directory output left in place" test -d "$tmp/out-dir.bin"
echo keep >"$tmp/target"
ln -s "$tmp/target" "$tmp/link.bin"
check "shard: link output" test "$(rc_of "$LOOM" data shard "$tmp/t.txt" "$tmp/link.bin")" = 0
check "shard: link target untouched" test "$(cat "$tmp/target")" = keep
check "shard: link replaced by the shard" test "$(stat -c %s "$tmp/link.bin")" = $((1024 + 2 * 24))
check "shard: link replacement reported" grep -q "link.bin was a symbolic link" "$tmp/err"
# shard: OUT naming IN itself (same name, hard link, symbolic link) is
# refused before anything is written: the input was overwritten with rc 0
printf 'keep this text\n' >"$tmp/same.txt"
ln "$tmp/same.txt" "$tmp/same-hard.bin"
ln -s "$tmp/same.txt" "$tmp/same-sym.bin"
for o in same.txt same-hard.bin same-sym.bin; do
  check "shard: OUT $o is IN: exit 2" \
    test "$(rc_of "$LOOM" data shard "$tmp/same.txt" "$tmp/$o")" = 2
  check "shard: OUT $o is IN: named" grep -q "$o is the same file as $tmp/same.txt" "$tmp/err"
  check "shard: OUT $o is IN: input kept" test "$(cat "$tmp/same.txt")" = "keep this text"
done
check "shard: OUT is IN: symbolic link kept" test -L "$tmp/same-sym.bin"
# shard: OUT's directory must exist (it was created, even /nonexist at the
# root), and a write that fails names OUT, not only its temporary
check "shard: missing directory: exit 1" \
  test "$(rc_of "$LOOM" data shard "$tmp/t.txt" "$tmp/nodir/sub/o.bin")" = 1
check "shard: missing directory named" \
  grep -q "^loom data shard: $tmp/nodir/sub/o.bin: its directory $tmp/nodir/sub does not exist" "$tmp/err"
check "shard: missing directory not created" test ! -e "$tmp/nodir"
check "shard: a file as directory: exit 1" \
  test "$(rc_of "$LOOM" data shard "$tmp/t.txt" "$tmp/t.txt/o.bin")" = 1
check "shard: a file as directory named" grep -q "o.bin: $tmp/t.txt is not a directory" "$tmp/err"
if [ -d /proc/self ]; then
  check "shard: uncreatable OUT: exit 1" \
    test "$(rc_of "$LOOM" data shard "$tmp/t.txt" /proc/loom-test.bin)" = 1
  check "shard: uncreatable OUT named" \
    grep -q "^loom data shard: /proc/loom-test.bin: cannot create its temporary" "$tmp/err"
fi
left=$(find "$tmp" -maxdepth 1 -name '*.tmp.*')
check "shard: no temporary left" test -z "$left"

# info finds the kind from the content, not from the name: a text under a
# directory named idx..., a gzip IDX named images.gz, a plain IDX and a
# shard with names that say nothing
python3 - "$tmp" <<'PYEOF'
import gzip, struct, sys
d = sys.argv[1]
idx = struct.pack(">IIII", 0x803, 2, 3, 4) + bytes(range(24))
open(d + "/images.gz", "wb").write(gzip.compress(idx))
open(d + "/images.raw", "wb").write(idx)
open(d + "/text.gz", "wb").write(gzip.compress(b"hello world " * 20))
open(d + "/tail-idx.gz", "wb").write(gzip.compress(idx) + b"GARBAGEGARBAGE")
PYEOF
mkdir -p "$tmp/idxstuff-ubyte"
seq 1 200 >"$tmp/idxstuff-ubyte/kjv.txt"
check "info: text under an idx directory" \
  test "$(rc_of "$LOOM" data info "$tmp/idxstuff-ubyte/kjv.txt" --context 4)" = 0
check "info: text described as text" grep -q "kjv.txt: text, val split" "$tmp/out"
check "info: gzip IDX named images.gz" test "$(rc_of "$LOOM" data info "$tmp/images.gz")" = 0
check "info: images.gz is IDX" grep -q "images.gz: IDX, unsigned bytes, 3 dimensions (2, 3, 4)" "$tmp/out"
check "info: plain IDX named images.raw" test "$(rc_of "$LOOM" data info "$tmp/images.raw")" = 0
check "info: images.raw is IDX" grep -q "images.raw: IDX, unsigned bytes, 3 dimensions (2, 3, 4)" "$tmp/out"
cp "$tmp/t.bin" "$tmp/tokens.dat"
check "info: shard named tokens.dat" test "$(rc_of "$LOOM" data info "$tmp/tokens.dat")" = 0
check "info: tokens.dat is a shard" grep -q "tokens.dat: llm.c token shard, magic 20240520" "$tmp/out"
check "info: gzip text: exit 1" test "$(rc_of "$LOOM" data info "$tmp/text.gz")" = 1
check "info: gzip text named" grep -q "text.gz: gzip data .* not an IDX magic" "$tmp/err"
check "info: gzip IDX + garbage: exit 1" test "$(rc_of "$LOOM" data info "$tmp/tail-idx.gz")" = 1
check "info: garbage offset named" grep -q "tail-idx.gz: trailing data at byte offset .*: 14 bytes" "$tmp/err"
printf 'not a shard at all\n' >"$tmp/bad.bin"
check "info: .bin without the magic: exit 1" test "$(rc_of "$LOOM" data info "$tmp/bad.bin")" = 1
check "info: .bin without the magic named" grep -q "bad.bin: " "$tmp/err"
mkfifo "$tmp/fifo"
check "info: FIFO refused" test "$(rc_of timeout 10 "$LOOM" data info "$tmp/fifo")" = 1
check "info: FIFO named" grep -q "fifo: not a regular file" "$tmp/err"

# each split of a text reports its own largest byte (the val split gave the
# whole file's)
python3 -c 'import sys; open(sys.argv[1], "wb").write(b"z" * 90 + b"a" * 10)' "$tmp/za.txt"
check "info on za.txt" test "$(rc_of "$LOOM" data info "$tmp/za.txt" --context 4)" = 0
check "train split's largest byte" grep -q "train split: 90 bytes, .* largest byte 122$" "$tmp/out"
check "val split's largest byte" grep -q "val split: 10 bytes, .* largest byte 97$" "$tmp/out"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
