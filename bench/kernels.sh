#!/usr/bin/env bash
# bench/kernels: loom's own vector code (GELU, layer norm, attention, the
# loss, bf16 conversions, the AdamW update) at kjv-gpt's shapes, once per
# instruction-set copy this CPU runs (LOOM_ISA: base, avx2, avx512), the
# copies alternating round after round in the same run (`loom bench
# kernels`). The table keeps each copy's best milliseconds per kernel over
# the rounds and its speed against the avx2 copy's (avx2's ms over its ms;
# against base where there is no avx2 copy).
#   usage: bench/kernels.sh [BUILD_DIR] [THREADS]   (THREADS: 1)
# Environment: ROUNDS (3), ISAS (default: every copy this CPU runs), REPS
# (runs per kernel and round, the best kept: 20), RAW=FILE (keep the runs'
# output).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
THREADS=${2:-1}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: cmake --build $BUILD --target loom" >&2; exit 1; }
bench_check_load
bench_fair_env "$THREADS"
if [ -z "${ISAS:-}" ]; then
  ISAS=
  for isa in base avx2 avx512; do
    # loom refuses a LOOM_ISA this CPU or build lacks before any command
    LOOM_ISA=$isa "$LOOM" bench kernels --help >/dev/null 2>&1 && ISAS="$ISAS $isa"
  done
fi
out=${RAW:-$(mktemp)}
[ -n "${RAW:-}" ] || trap 'rm -f "$out"' EXIT
: >"$out"
for r in $(seq "${ROUNDS:-3}"); do
  for isa in $ISAS; do
    echo "## round $r copy $isa" >>"$out"
    LOOM_ISA=$isa "$LOOM" bench kernels --threads "$THREADS" --reps "${REPS:-20}" >>"$out"
  done
done
echo "# loom bench kernels, $THREADS thread(s), copies alternating for ${ROUNDS:-3} round(s): best ms per call over the rounds; speed: the reference copy's ms over the copy's; load average $(bench_loadavg) at the end"
awk -v isas="$ISAS" '
  /^## round/ { isa = $5; next }
  /^#/ || /^kernel/ || NF == 0 { next }
  {
    # name words, then shape, ms, ns/elem
    name = $1; for (i = 2; i <= NF - 3; i++) name = name " " $i
    if (!(name in seen)) { seen[name] = 1; order[++n] = name; shape[name] = $(NF - 2) }
    k = name SUBSEP isa
    if (!(k in best) || $(NF - 1) + 0 < best[k]) best[k] = $(NF - 1) + 0
  }
  END {
    m = split(isas, cp, " ")
    ref = ""
    for (i = 1; i <= m; i++) if (cp[i] == "avx2") ref = "avx2"
    if (ref == "") ref = cp[1]
    printf "%-20s %-13s", "kernel", "shape"
    for (i = 1; i <= m; i++) printf " %9s", cp[i] " ms"
    for (i = 1; i <= m; i++) if (cp[i] != ref) printf " %12s", cp[i] " speed"
    printf "\n"
    for (j = 1; j <= n; j++) {
      nm = order[j]
      printf "%-20s %-13s", nm, shape[nm]
      for (i = 1; i <= m; i++) printf " %9.3f", best[nm, cp[i]]
      for (i = 1; i <= m; i++) if (cp[i] != ref) {
        v = best[nm, cp[i]]
        if (v > 0) printf " %11.2fx", best[nm, ref] / v; else printf " %12s", "-"
      }
      printf "\n"
    }
  }' "$out"
