#!/usr/bin/env bash
# MLflow (the tracking server and its Python client) for the test of loom's
# MLflow sink (tests/obs/mlflow.sh), in a virtual environment of its own
# made on first use from PyPI: mlflow is large (its server, SQLAlchemy,
# alembic, ...), so the shared tests venv (ensure-pyenv.sh) stays without
# it. Prints the interpreter's path. Idempotent.
#   LOOM_MLFLOW_VENV: where (default ~/.cache/loom/mlflow-venv).
set -euo pipefail
venv=${LOOM_MLFLOW_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/mlflow-venv}
pkgs=(mlflow)
mods="mlflow, mlflow.server"
PY="$venv/bin/python"
if ! "$PY" -c "import $mods" >/dev/null 2>&1; then
  if [ ! -x "$PY" ]; then
    echo "ensure-mlflow: making the virtual environment $venv" >&2
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv" >&2; then
      rm -rf "$venv"
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >&2
      python3 -m venv "$venv" >&2
    fi
  fi
  echo "ensure-mlflow: pip install ${pkgs[*]} into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "${pkgs[@]}" >&2
  "$PY" -c "import $mods" >&2
fi
echo "$PY"
