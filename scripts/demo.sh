#!/usr/bin/env bash
# make demo: trains the fashion-mlp reference model on Fashion-MNIST,
# data-parallel on 2 ranks when the launcher can, and prints test accuracy.
set -euo pipefail
BUILD=${1:-build}
LOOM="$BUILD/loom"
cd "$(dirname "$0")/.."
RUN=runs/demo
ARGS=(train examples/fashion_mlp.yaml --resume never --set "log.run_dir=$RUN")
echo "== loom demo: fashion-mlp (784-512-512-10), Fashion-MNIST, 5 epochs"
if "$LOOM" run --help >/dev/null 2>&1; then
  echo "== 2 ranks, data parallel: $LOOM run -n 2 $LOOM ${ARGS[*]}"
  exec "$LOOM" run -n 2 "$LOOM" "${ARGS[@]}"
else
  echo "== 1 process: $LOOM ${ARGS[*]}"
  exec "$LOOM" "${ARGS[@]}"
fi
