#!/usr/bin/env bash
# Installs every Debian package loom needs to build, test and run its demos.
# Idempotent: installs only what is missing; safe to run again. Then the
# Python packages of the tests, from PyPI (scripts/ensure-pyenv.sh).
set -euo pipefail

# One line per package: what loom uses it for.
PKGS=(
  build-essential        # gcc, make: the default compiler
  cmake                  # the build (CMake + CTest)
  pkg-config             # finds the libraries below; the install test uses it
  clang                  # the second compiler CI builds with; libFuzzer harnesses
  libclang-rt-14-dev     # clang's sanitizer and fuzzer runtimes
  clang-format           # make format
  clang-tidy             # make lint
  psmisc                 # fuser: this script waits for another apt to finish
  stress-ng              # load beside the suite, for the green-under-load check
  libdnnl-dev            # oneDNN: GEMM, convolution, bf16 on AMX
  libopenblas-dev        # BLAS fallback for GEMM
  libyaml-dev            # YAML configs
  libcjson-dev           # JSON: manifests, metrics, reports
  zlib1g-dev             # gzip-compressed data files
  libcurl4-openssl-dev   # MLflow's REST API (log.mlflow)
  libopenmpi-dev         # Open MPI, the default MPI (comm layer)
  openmpi-bin            # mpirun, used by loom run
  libmpich-dev           # MPICH, the second MPI CI builds against
  mpich                  # MPICH's mpiexec (hydra)
  munge                  # SLURM's authentication (tests/cluster/slurm.sh starts its own munged)
  slurmctld              # SLURM's controller (started by hand in the test, not by apt)
  slurmd                 # SLURM's node daemon (likewise)
  slurm-client           # sbatch, srun, squeue, scontrol (examples/slurm/train.sbatch)
  dataset-fashion-mnist  # Fashion-MNIST images (fashion-mlp, fashion-cnn)
  bible-kjv-text         # the King James Bible (kjv-gpt)
  bible-kjv              # its reader, which prints the text
  python3-venv           # virtual environments: PyPI packages of the tests (ensure-pyenv.sh)
  chromium               # renders loom report's page headless in its test (obs_report)
)
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Python packages the tests read loom's output with (TensorBoard's event
# reader; MLflow's server and client, in a venv of their own), from PyPI
# into virtual environments; the tests make them too.
pyenv() {
  [ "${LOOM_NO_PYPI:-0}" = 1 ] && return 0
  "$(dirname "$0")/ensure-pyenv.sh" >/dev/null
  "$(dirname "$0")/ensure-mlflow.sh" >/dev/null
}

if [ ${#missing[@]} -eq 0 ]; then
  pyenv
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg to finish rather than failing on the lock.
for _ in $(seq 1 120); do
  command -v fuser >/dev/null 2>&1 || break
  if ! fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; then break; fi
  sleep 1
done
# The lock may be taken again between the check above and apt: apt waits.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
pyenv
