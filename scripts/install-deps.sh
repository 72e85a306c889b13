#!/usr/bin/env bash
# Installs every Debian package loom needs to build, test and run its demos.
# Idempotent: installs only what is missing; safe to run again.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang-format
  libdnnl-dev libopenblas-dev libyaml-dev libcjson-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist bible-kjv-text bible-kjv
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg to finish rather than failing on the lock.
for _ in $(seq 1 120); do
  if ! fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; then break; fi
  sleep 1
done
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
