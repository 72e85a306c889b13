#!/usr/bin/env bash
# bench/gemm: loom_gemm (per backend) beside raw dnnl_sgemm and raw
# cblas_sgemm at 1024^3 and the reference workloads' GEMM shapes, at each
# thread count (loom bench gemm), then a summary: the geometric mean over
# the shapes of loom/raw for each backend.
#   usage: bench/gemm.sh [BUILD_DIR] [THREADS] [BACKEND]
#   defaults: build  1,2  all
# Environment: ITERS (calls per run, loom bench gemm's --iters), RAW=FILE
# (keep the full tables), LOOM_GEMM_DETERMINISTIC=0 (measure loom_gemm with
# the libraries' own threading instead of loom's thread-count invariant grid).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
THREADS=${2:-1,2}
BACKEND=${3:-all}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: cmake --build $BUILD --target loom" >&2; exit 1; }
bench_check_load
out=${RAW:-$(mktemp)}
[ -n "${RAW:-}" ] || trap 'rm -f "$out"' EXIT
: >"$out"
for t in ${THREADS//,/ }; do
  # OpenBLAS starts a pool of its own at load: size it like the run.
  OPENBLAS_NUM_THREADS="$t" "$LOOM" bench gemm --threads "$t" --backend "$BACKEND" \
    ${ITERS:+--iters "$ITERS"} | tee -a "$out"
  echo | tee -a "$out"
done
echo "# loom_gemm / raw library, geometric mean over the shapes (1.00 = as fast)"
echo "# load average $(bench_loadavg) on $(nproc) cores"
awk '
  /^# loom bench gemm:/ { t = $5 }
  /^workload/ { for (i = 1; i <= NF; i++) col[i] = $i; ncol = NF; next }
  /^#/ || NF == 0 { next }
  {
    # the numbers are the last (ncol - 5) fields: workload names have spaces
    first = NF - (ncol - 6)
    for (i = first; i <= NF; i++) v[col[i - first + 6]] = $i + 0
    if (v["dnnl_sgemm"] > 0 && v["loom:dnnl"] > 0) { s[t, "dnnl"] += log(v["loom:dnnl"] / v["dnnl_sgemm"]); n[t, "dnnl"]++ }
    if (v["cblas_sgemm"] > 0 && v["loom:openblas"] > 0) { s[t, "openblas"] += log(v["loom:openblas"] / v["cblas_sgemm"]); n[t, "openblas"]++ }
    if (v["cblas_sgemm"] > 0 && v["loom:dnnl"] > 0) { s[t, "best"] += log(v["loom:dnnl"] / v["cblas_sgemm"]); n[t, "best"]++ }
    if (!(t in seen)) { seen[t] = 1; order[++nt] = t }
    delete v
  }
  END {
    printf "%-8s %22s %26s %26s\n", "threads", "loom:dnnl/dnnl_sgemm", "loom:openblas/cblas_sgemm", "loom:dnnl/cblas_sgemm"
    for (i = 1; i <= nt; i++) {
      t = order[i]
      printf "%-8s", t
      split("dnnl openblas best", ks, " ")
      for (k = 1; k <= 3; k++)
        if (n[t, ks[k]] > 0) printf " %*.2f", (k == 1 ? 22 : 26), exp(s[t, ks[k]] / n[t, ks[k]])
        else printf " %*s", (k == 1 ? 22 : 26), "-"
      printf "\n"
    }
  }' "$out"
