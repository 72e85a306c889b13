#!/usr/bin/env bash
# Makes the PyTorch peer importable and prints its version (one line on stdout:
# "pytorch VERSION SOURCE DETAIL python PYVERSION PATH").
#   LOOM_TORCH=pypi (default): PyPI's torch in a virtual environment at
#     LOOM_TORCH_VENV (default ~/.cache/loom/torch-venv), made on first use
#     (about 5 GB, a few minutes); LOOM_TORCH_VERSION pins a version.
#   LOOM_TORCH=debian: Debian's python3-torch (1.13) under /usr/bin/python3,
#     installed with apt if missing.
# TORCH_PYTHON names the interpreter to use (lib.sh sets it from the above).
# An interpreter other than the default one (the venv's python, or
# /usr/bin/python3 for debian) is the user's: nothing is installed for it, and
# it lacking torch is an error.
# The venv directory is made only where nothing is: a path that exists but is
# not a directory, or a non-empty directory that is not a virtual environment
# (no pyvenv.cfg), is refused. If making the venv fails, what this run made is
# removed, never a directory that was there before it ran.
set -euo pipefail

src=${LOOM_TORCH:-pypi}
venv=${LOOM_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/torch-venv}
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  # wait for another apt/dpkg rather than failing on its lock (polled)
  for _ in $(seq 1 120); do
    if ! fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; then break; fi
    sleep 1
  done
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >&2
}

# not_ours DEFAULT: TORCH_PYTHON naming another interpreter is the user's:
# installing into the default one would not make it import torch.
not_ours() {
  if [ -n "${TORCH_PYTHON:-}" ] && [ "$TORCH_PYTHON" != "$1" ]; then
    echo "ensure_torch: TORCH_PYTHON=$TORCH_PYTHON cannot import torch; installing nothing (install torch for it, or unset TORCH_PYTHON to use $1)" >&2
    exit 1
  fi
}

case $src in
debian)
  PY=${TORCH_PYTHON:-/usr/bin/python3}
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    not_ours /usr/bin/python3
    echo "ensure_torch: $PY cannot import torch; installing python3-torch" >&2
    apt_install python3-torch
  fi
  detail="debian $(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null || echo unknown)"
  ;;
pypi)
  PY=${TORCH_PYTHON:-$venv/bin/python}
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    not_ours "$venv/bin/python"
    if [ ! -x "$venv/bin/python" ]; then
      made=0
      if [ -L "$venv" ] || [ -e "$venv" ]; then
        if [ ! -d "$venv" ]; then
          echo "ensure_torch: LOOM_TORCH_VENV=$venv exists and is not a directory; not touching it (set LOOM_TORCH_VENV to a new path)" >&2
          exit 1
        fi
        if [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; then
          echo "ensure_torch: LOOM_TORCH_VENV=$venv is a non-empty directory but not a virtual environment (no pyvenv.cfg); not touching it (set LOOM_TORCH_VENV to a new path)" >&2
          exit 1
        fi
      else
        made=1
      fi
      echo "ensure_torch: making the virtual environment $venv (PyPI torch, about 5 GB)" >&2
      base=$(command -v python3 || echo /usr/bin/python3)
      if ! "$base" -m venv "$venv" >&2 2>/dev/null; then
        # only what this run made: a directory that was there stays
        if [ $made = 1 ]; then rm -rf -- "$venv"; fi
        apt_install python3-venv
        /usr/bin/python3 -m venv "$venv" >&2
      fi
    fi
    echo "ensure_torch: pip install numpy torch${LOOM_TORCH_VERSION:+==$LOOM_TORCH_VERSION} into $venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check numpy "torch${LOOM_TORCH_VERSION:+==$LOOM_TORCH_VERSION}" >&2
  fi
  detail="pypi $venv"
  ;;
*)
  echo "ensure_torch: LOOM_TORCH='$src': expected pypi or debian" >&2
  exit 2
  ;;
esac
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "ensure_torch: $PY still cannot import torch" >&2
  exit 1
fi
"$PY" -c 'import sys, torch; print("pytorch", torch.__version__, sys.argv[1], "python", sys.version.split()[0], sys.executable)' "$detail"
