#!/usr/bin/env bash
# examples/k8s checked offline (no cluster): the MPIJob, the Indexed Job,
# their Services, ConfigMaps and volume claims against the Kubernetes
# OpenAPI schemas (kubernetes-validate from PyPI, in a virtual environment
# made on first use: scripts/ensure-pyenv.sh) and the MPI operator's
# v2beta1 API; the commands against loom's own options (loom run --dry-run
# with a hostfile written as the operator writes it), the training configs
# through loom config check, the environment variables, the numbers that
# must agree, and the image's Containerfile against the libraries of the
# built binary. Each check is also run on copies broken on purpose, which
# it must report. tests/cluster/k8s_check.py holds the checks.
# Without PyPI (LOOM_NO_PYPI=1, or no network on first use) it skips (77).
. "$(dirname "$0")/../lib.sh"
if [ "${LOOM_NO_PYPI:-0}" = 1 ]; then
  echo "skipped: LOOM_NO_PYPI=1 (kubernetes-validate comes from PyPI)"
  exit 77
fi
if ! PY=$(LOOM_PY_VENV=${LOOM_K8S_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/k8s-venv} \
  LOOM_PY_PKGS=kubernetes-validate LOOM_PY_MODS=kubernetes_validate LOOM_PY_NAME=cluster_k8s \
  "$SRC/scripts/ensure-pyenv.sh"); then
  echo "skipped: no virtual environment with kubernetes-validate (PyPI unreachable?)"
  exit 77
fi
if "$PY" "$SRC/tests/cluster/k8s_check.py" "$LOOM" "$SRC" "$tmp"; then
  ok "examples/k8s"
else
  bad "examples/k8s"
fi
finish cluster_k8s
