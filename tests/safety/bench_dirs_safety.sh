#!/usr/bin/env bash
# A directory the user names for a bench's files (bench/recovery.sh KEEP=,
# bench/ckpt_save.sh RUN_DIR=, bench/torch/recovery.py --run-dir) must be
# new, empty or made by the same bench before: the benches remove and
# rewrite names inside it, so a directory holding the user's files, a link
# or a file is refused before anything runs, and nothing in it changes.
# Every victim is built in this test's own temporary directory.
. "$(dirname "$0")/../lib.sh"
T=$tmp
BUILD=$(dirname "$LOOM")
check() { # WHAT CMD...: ok when CMD succeeds
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
# A user's directory with names the benches write: loom-1 (recovery.sh's
# round), results.jsonl, results.txt, ckpt and events.jsonl (recovery.py's).
victim() {
  rm -rf "$T/user"
  mkdir -p "$T/user/loom-1" "$T/user/ckpt"
  echo mine >"$T/user/loom-1/notes.txt"
  echo mine >"$T/user/ckpt/model.pt"
  for f in results.jsonl results.txt events.jsonl kill_time; do
    echo mine >"$T/user/$f"
  done
}
intact() { # WHAT: every victim file still says "mine", nothing added
  local f bad_files=""
  for f in loom-1/notes.txt ckpt/model.pt results.jsonl results.txt \
    events.jsonl kill_time; do
    grep -qx mine "$T/user/$f" 2>/dev/null || bad_files="$bad_files $f"
  done
  if [ -z "$bad_files" ] && [ ! -e "$T/user/.loom-bench" ] &&
    [ "$(find "$T/user" | wc -l)" = 9 ]; then
    ok "$1: the user's files intact"
  else
    bad "$1: changed:${bad_files:- (a name added)}"
  fi
}

# bench_own_dir, the shell side.
own() ( . "$SRC/bench/lib.sh" && bench_own_dir "$1" "${2:-bench/x}" )
victim
own "$T/user" 2>"$T/err"
check "lib: a user's directory refused" test $? -ne 0
check "lib: with a reason" grep -q "holds files this bench did not make" "$T/err"
intact "lib"
ln -s "$T/user" "$T/link"
own "$T/link" 2>"$T/err"
check "lib: a link refused" test $? -ne 0
check "lib: the link kept" test -L "$T/link"
intact "lib, through a link"
echo file >"$T/afile"
own "$T/afile" 2>/dev/null
check "lib: a file refused" test $? -ne 0
check "lib: the file intact" grep -qx file "$T/afile"
own "$T/none/sub" 2>/dev/null
check "lib: a missing parent refused" test $? -ne 0
check "lib: no parent made" test ! -e "$T/none"
check "lib: a new directory made" own "$T/new"
check "lib: and marked" grep -qx bench/x "$T/new/.loom-bench"
touch "$T/new/result"
check "lib: the same bench's directory again" own "$T/new"
own "$T/new" bench/y 2>/dev/null
check "lib: another bench's directory refused" test $? -ne 0
mkdir "$T/empty"
check "lib: an empty directory" own "$T/empty"
mv "$T/new/.loom-bench" "$T/mark"
ln -s "$T/mark" "$T/new/.loom-bench"
own "$T/new" 2>/dev/null
check "lib: a linked mark refused" test $? -ne 0

# The benches themselves refuse before they run anything.
victim
KEEP="$T/user" REPEAT=1 NO_TORCH=1 timeout 60 bash "$SRC/bench/recovery.sh" \
  "$BUILD" >"$T/out" 2>"$T/err"
check "recovery.sh KEEP=user dir: exit 2" test $? = 2
intact "recovery.sh"
victim
RUN_DIR="$T/user" LOOM="$LOOM" timeout 60 bash "$SRC/bench/ckpt_save.sh" \
  >"$T/out" 2>"$T/err"
check "ckpt_save.sh RUN_DIR=user dir: exit 2" test $? = 2
intact "ckpt_save.sh"
victim
timeout 60 python3 "$SRC/bench/torch/recovery.py" launch --run-dir "$T/user" \
  >"$T/out" 2>"$T/err"
check "recovery.py --run-dir user dir: exit 2" test $? = 2
intact "recovery.py"

# peerenv.own_dir, the Python side, on the same cases.
pyown() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import peerenv
peerenv.own_dir(sys.argv[2], sys.argv[3])' "$SRC/bench/torch" "$1" "${2:-bench/x}" 2>/dev/null
}
victim
pyown "$T/user"
check "py: a user's directory refused" test $? = 2
intact "py"
pyown "$T/link"
check "py: a link refused" test $? = 2
pyown "$T/none/sub"
check "py: a missing parent refused" test $? = 2
check "py: no parent made" test ! -e "$T/none"
check "py: a new directory made" pyown "$T/pynew"
check "py: and marked" grep -qx bench/x "$T/pynew/.loom-bench"
touch "$T/pynew/result"
check "py: the same bench's directory again" pyown "$T/pynew"
pyown "$T/pynew" bench/y
check "py: another bench's directory refused" test $? = 2
finish bench_dirs_safety
