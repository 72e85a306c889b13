#!/usr/bin/env bash
# The torchrun side of bench/recovery: kjv-gpt on 2 workers, one SIGKILLed between checkpoints, time to the first step after the restart.
# Usage: bench/torch/recovery.sh [recovery.py launch options: --repeat N --steps S --ckpt-every K --kill-step S --text PATH --keep ...]
# One JSON line per run on stdout (and a summary line with --repeat N > 1); notes on stderr.
set -euo pipefail
. "$(cd "$(dirname "$0")/.." && pwd)/lib.sh"
bench_ensure_torch
bench_check_load
exec "$TORCH_PYTHON" "$BENCH_DIR/torch/recovery.py" launch "$@"
