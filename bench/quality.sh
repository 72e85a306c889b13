#!/usr/bin/env bash
# Mixed precision's quality on real data, the full runs that make test only
# samples (tests/loop/bf16_quality.sh):
# - fashion-mlp and fashion-cnn, their examples' 5 epochs, in f32 and in
#   each precision of PRECISIONS: the test accuracy after the last epoch
#   (targets 87% and 88%, f32's targets, in every precision);
# - kjv-gpt, its example's settings, the validation loss at step 500 (on
#   the whole validation split) in f32 and each precision: within 0.02 of
#   f32's.
# One table: model, precision, the figure, its target, and whether it met
# it; the CPU model and flags above it (the bf16 path differs between CPUs:
# the log's "bf16:" line is printed under the table). Seeds are the
# examples' own, so the figures are the same on every run of a machine.
#   usage: bench/quality.sh [BUILD_DIR]
# Environment: PRECISIONS (default "bf16 f16"), MODELS (default
# "fashion_mlp fashion_cnn kjv_gpt"), THREADS (default: the cores).
# About 20 minutes on 2 cores (Zen 4, idle).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM=$BUILD/loom
[ -x "$LOOM" ] || { echo "quality: no $LOOM (make build first)" >&2; exit 2; }
PRECISIONS=${PRECISIONS:-bf16 f16}
MODELS=${MODELS:-fashion_mlp fashion_cnn kjv_gpt}
export LOOM_THREADS=${THREADS:-$(nproc)} OMP_NUM_THREADS=${THREADS:-$(nproc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bench_check_load

declare -A fig
paths=""
for m in $MODELS; do
  for p in f32 $PRECISIONS; do
    args=("$LOOM_ROOT/examples/$m.yaml" --resume never --set train.precision="$p"
      --set checkpoint.enabled=false --set log.progress=off --set "log.run_dir=$tmp/$m.$p")
    [ "$m" = kjv_gpt ] && args+=(--set train.steps=500 --set train.eval_every=500)
    t0=$(date +%s)
    LOOM_LOG=info "$LOOM" train "${args[@]}" >"$tmp/$m.$p.out" 2>&1
    rc=$?
    bench_note "$m $p: rc $rc, $(($(date +%s) - t0)) s"
    if [ $rc != 0 ]; then
      fig[$m.$p]="failed"
      tail -5 "$tmp/$m.$p.out" >&2
      continue
    fi
    if [ "$m" = kjv_gpt ]; then
      fig[$m.$p]=$(sed -n 's/^validation loss: \([0-9.]*\) nats.*/\1/p' "$tmp/$m.$p.out" | tail -1)
    else
      fig[$m.$p]=$(sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$tmp/$m.$p.out" | tail -1)
    fi
    [ "$p" != f32 ] && paths="$paths$(grep -o "$p: .*" "$tmp/$m.$p.out" | head -1)"$'\n'
  done
done

printf '%-12s %-9s %-22s %-16s %s\n' model precision figure target met
for m in $MODELS; do
  for p in f32 $PRECISIONS; do
    v=${fig[$m.$p]:-}
    case $m in
      fashion_mlp) what="test accuracy ${v}%" tgt=">= 87%" ok=$(awk -v v="$v" 'BEGIN { print (v + 0 >= 87) ? "yes" : "no" }') ;;
      fashion_cnn) what="test accuracy ${v}%" tgt=">= 88%" ok=$(awk -v v="$v" 'BEGIN { print (v + 0 >= 88) ? "yes" : "no" }') ;;
      kjv_gpt)
        f=${fig[$m.f32]:-}
        what="val loss @500 $v"
        if [ "$p" = f32 ]; then
          tgt="(reference)" ok="-"
        else
          tgt="within 0.02 of f32"
          ok=$(awk -v v="$v" -v f="$f" 'BEGIN { d = v - f; if (d < 0) d = -d; print (v != "" && f != "" && d <= 0.02) ? sprintf("yes (%+.4f)", v - f) : sprintf("no (%+.4f)", v - f) }')
        fi
        ;;
      *) what=$v tgt="" ok="" ;;
    esac
    [ "$v" = failed ] && ok="failed"
    printf '%-12s %-9s %-22s %-16s %s\n' "$m" "$p" "$what" "$tgt" "$ok"
  done
done
printf '%s' "$paths" | sort -u | sed 's/^/# path: /'
echo "# threads $LOOM_THREADS; load $(bench_loadavg) at the end"
