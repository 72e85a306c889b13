#!/usr/bin/env bash
# make demo: trains the fashion-mlp reference model on Fashion-MNIST,
# data-parallel on 2 ranks (`loom run -n 2 loom train`), with the progress
# bar on a terminal, and checks that test accuracy reaches 85%.
set -euo pipefail
BUILD=${1:-build}
LOOM="$BUILD/loom"
cd "$(dirname "$0")/.."
RUN=runs/demo
ARGS=(train examples/fashion_mlp.yaml --resume never --set "log.run_dir=$RUN")
# The ranks' output reaches the terminal through the launcher's pipes, so
# ask for the bar when this script's stderr is a terminal.
[ -t 2 ] && ARGS+=(--set log.progress=bar)
echo "== loom demo: fashion-mlp (784-512-512-10), Fashion-MNIST, 5 epochs"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if "$LOOM" run --help >/dev/null 2>&1; then
  echo "== 2 ranks, data parallel: $LOOM run -n 2 $LOOM ${ARGS[*]}"
  "$LOOM" run -n 2 "$LOOM" "${ARGS[@]}" | tee "$out"
else
  echo "== 1 process: $LOOM ${ARGS[*]}"
  "$LOOM" "${ARGS[@]}" | tee "$out"
fi
acc=$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$out" | tail -1)
if [ -z "$acc" ] || ! awk -v a="$acc" 'BEGIN { exit !(a >= 85) }'; then
  echo "== demo FAILED: test accuracy ${acc:-missing}, expected at least 85%" >&2
  exit 1
fi
echo "== metrics: $RUN/metrics.jsonl, checkpoints: $RUN/ckpt"
