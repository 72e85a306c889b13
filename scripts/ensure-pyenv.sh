#!/usr/bin/env bash
# The Python packages loom's tests read its output with (TensorBoard's own
# event reader), in a virtual environment made on first use from PyPI;
# prints the interpreter's path. Idempotent.
#   LOOM_PY_VENV: where (default ~/.cache/loom/py-venv).
# Other environments are made the same way (scripts/ensure-mlflow.sh):
#   LOOM_PY_PKGS (what pip installs), LOOM_PY_MODS (what must import),
#   LOOM_PY_NAME (the name in messages).
set -euo pipefail
venv=${LOOM_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/py-venv}
read -r -a pkgs <<<"${LOOM_PY_PKGS:-tensorboard}"
mods=${LOOM_PY_MODS:-tensorboard.backend.event_processing.event_accumulator}
name=${LOOM_PY_NAME:-ensure-pyenv}
PY="$venv/bin/python"
if ! "$PY" -c "import $mods" >/dev/null 2>&1; then
  if [ ! -x "$PY" ]; then
    # made only where nothing is; a failure removes what this run made,
    # never a directory (the user's files) that was there before
    made=0
    if [ -L "$venv" ] || [ -e "$venv" ]; then
      if [ ! -d "$venv" ] || { [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; }; then
        echo "$name: $venv exists and is not a virtual environment (no pyvenv.cfg); not touching it (set LOOM_PY_VENV to a new path)" >&2
        exit 1
      fi
    else
      made=1
    fi
    echo "$name: making the virtual environment $venv" >&2
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv" >&2; then
      if [ $made = 1 ]; then rm -rf -- "$venv"; fi
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >&2
      python3 -m venv "$venv" >&2
    fi
  fi
  echo "$name: pip install ${pkgs[*]} into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "${pkgs[@]}" >&2
  "$PY" -c "import $mods" >&2
fi
echo "$PY"
