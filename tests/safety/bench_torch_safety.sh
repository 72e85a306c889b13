#!/usr/bin/env bash
# bench/torch/ensure_torch.sh and scripts/ensure-pyenv.sh remove only what
# they made: a venv path that was there before they ran (the user's files,
# an empty directory, a link, a file) survives a failed `python3 -m venv`.
# A named TORCH_PYTHON without torch installs nothing.
# python3, apt-get, pip, sudo and fuser are fakes on PATH: no network,
# nothing installed.
. "$(dirname "$0")/../lib.sh"
ENSURE="$SRC/bench/torch/ensure_torch.sh"
T=$tmp
check() { # WHAT CMD...: ok when CMD succeeds
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
mkdir "$T/bin"
# python3 -m venv DIR: leaves a partial DIR behind and fails
cat >"$T/bin/python3" <<'SH'
#!/bin/sh
echo "python3 $*" >>"$FAKE_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3" && echo partial >"$3/partial"; fi
exit 1
SH
for c in apt-get pip; do
  # shellcheck disable=SC2016 # $* and $FAKE_LOG are the fake's own
  printf '#!/bin/sh\necho "%s $*" >>"$FAKE_LOG"\nexit 1\n' "$c" >"$T/bin/$c"
done
printf '#!/bin/sh\nexec "$@"\n' >"$T/bin/sudo"
printf '#!/bin/sh\nexit 1\n' >"$T/bin/fuser"
chmod +x "$T/bin/"*
export FAKE_LOG="$T/log"

# ensure VENV [VAR=VALUE...]: ensure_torch.sh with the fakes; its stderr in $T/err
ensure() {
  local v=$1
  shift
  : >"$FAKE_LOG"
  env -u TORCH_PYTHON -u LOOM_TORCH PATH="$T/bin:$PATH" LOOM_TORCH_VENV="$v" "$@" \
    timeout 20 bash "$ENSURE" >"$T/out" 2>"$T/err"
}

# The tester's case: a directory of the user's, not a venv.
mkdir "$T/user"
echo "my work" >"$T/user/notes.txt"
ensure "$T/user"
check "user dir: fails" test $? -ne 0
check "user dir: the user's file intact" grep -qx "my work" "$T/user/notes.txt"
check "user dir: refused with a reason" grep -q "not a virtual environment" "$T/err"
check "user dir: no venv tried in it" test ! -e "$T/user/partial"

# The same directory behind a link: neither the link nor its target goes.
ln -s "$T/user" "$T/link"
ensure "$T/link"
check "link: fails" test $? -ne 0
check "link: kept" test -L "$T/link"
check "link: target's file intact" grep -qx "my work" "$T/user/notes.txt"

# A venv of the user's without bin/python (pyvenv.cfg): venv is tried there
# and fails; the directory and the user's file stay.
mkdir "$T/oldvenv"
touch "$T/oldvenv/pyvenv.cfg"
echo "mine" >"$T/oldvenv/keep.txt"
ensure "$T/oldvenv"
check "existing venv: fails" test $? -ne 0
check "existing venv: venv was tried" grep -q "python3 -m venv $T/oldvenv" "$FAKE_LOG"
check "existing venv: the user's file intact" grep -qx "mine" "$T/oldvenv/keep.txt"

# An empty directory that was there stays.
mkdir "$T/empty"
ensure "$T/empty"
check "empty dir: fails" test $? -ne 0
check "empty dir: kept" test -d "$T/empty"

# A file where the venv would go is refused and kept.
echo "a file" >"$T/afile"
ensure "$T/afile"
check "file: fails" test $? -ne 0
check "file: intact" grep -qx "a file" "$T/afile"

# A path where nothing was: what the failed venv left is removed.
ensure "$T/new/venv"
check "new path: fails" test $? -ne 0
check "new path: venv was tried" grep -q "python3 -m venv $T/new/venv" "$FAKE_LOG"
check "new path: its partial venv removed" test ! -e "$T/new/venv"

# A named interpreter without torch: nothing installed anywhere, said so.
printf '#!/bin/sh\nexit 1\n' >"$T/nopy"
chmod +x "$T/nopy"
ensure "$T/named" TORCH_PYTHON="$T/nopy"
check "TORCH_PYTHON without torch: fails" test $? -ne 0
check "TORCH_PYTHON without torch: said" grep -q "TORCH_PYTHON=$T/nopy cannot import torch; installing nothing" "$T/err"
check "TORCH_PYTHON without torch: no venv made" test ! -e "$T/named"
check "TORCH_PYTHON without torch: no python3, pip or apt-get run" test ! -s "$FAKE_LOG"
ensure "$T/named" TORCH_PYTHON="$T/nopy" LOOM_TORCH=debian
check "debian, TORCH_PYTHON without torch: fails" test $? -ne 0
check "debian, TORCH_PYTHON without torch: no apt-get run" test ! -s "$FAKE_LOG"

# scripts/ensure-pyenv.sh (and ensure-mlflow.sh through it): the same rules.
pyenv() {
  : >"$FAKE_LOG"
  PATH="$T/bin:$PATH" LOOM_PY_VENV="$1" timeout 20 bash "$SRC/scripts/ensure-pyenv.sh" \
    >"$T/out" 2>"$T/err"
}
pyenv "$T/user"
check "ensure-pyenv, user dir: fails" test $? -ne 0
check "ensure-pyenv, user dir: the user's file intact" grep -qx "my work" "$T/user/notes.txt"
check "ensure-pyenv, user dir: refused with a reason" grep -q "not a virtual environment" "$T/err"
pyenv "$T/oldvenv"
check "ensure-pyenv, existing venv: fails" test $? -ne 0
check "ensure-pyenv, existing venv: the user's file intact" grep -qx "mine" "$T/oldvenv/keep.txt"
pyenv "$T/new2/venv"
check "ensure-pyenv, new path: fails" test $? -ne 0
check "ensure-pyenv, new path: its partial venv removed" test ! -e "$T/new2/venv"

finish safety_bench_torch
