#!/usr/bin/env bash
# MLflow (the tracking server and its Python client) for the test of loom's
# MLflow sink (tests/obs/mlflow.sh), in a virtual environment of its own
# made on first use from PyPI: mlflow is large (its server, SQLAlchemy,
# alembic, ...), so the shared tests venv (ensure-pyenv.sh) stays without
# it. Prints the interpreter's path. Idempotent.
#   LOOM_MLFLOW_VENV: where (default ~/.cache/loom/mlflow-venv).
set -euo pipefail
LOOM_PY_VENV=${LOOM_MLFLOW_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/mlflow-venv} \
  LOOM_PY_PKGS=mlflow LOOM_PY_MODS="mlflow, mlflow.server" LOOM_PY_NAME=ensure-mlflow \
  exec "$(dirname "$0")/ensure-pyenv.sh"
