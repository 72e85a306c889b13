#!/usr/bin/env bash
# Makes Debian's PyTorch (python3-torch) importable by /usr/bin/python3, installing it if missing, and prints its version.
# Usage: bench/torch/ensure_torch.sh        (one line on stdout: "pytorch VERSION debian PKGVERSION python PYVERSION PATH")
# Debian's build is the peer on purpose: the `python3` first on PATH may be another
# interpreter without Debian's packages, so every peer script runs /usr/bin/python3.
set -euo pipefail

PY=${TORCH_PYTHON:-/usr/bin/python3}

if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "ensure_torch: $PY cannot import torch; installing python3-torch" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  # wait for another apt/dpkg rather than failing on its lock
  for _ in $(seq 1 120); do
    if ! fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; then break; fi
    sleep 1
  done
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends python3-torch >&2
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    echo "ensure_torch: python3-torch installed but $PY still cannot import torch" >&2
    exit 1
  fi
fi

deb=$(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null || echo unknown)
"$PY" -c 'import sys, torch; print("pytorch", torch.__version__, "debian", sys.argv[1], "python", sys.version.split()[0], sys.executable)' "$deb"
