#!/usr/bin/env bash
# bench/gemm: loom_gemm (per backend) beside raw dnnl_sgemm and raw
# cblas_sgemm at 1024^3 and the reference workloads' GEMM shapes, at each
# thread count (loom bench gemm), then a summary: the geometric mean over
# the shapes of loom/raw for each backend. Headlines (make bench): per thread
# count, the geometric means of loom_gemm's and the raw library's GFLOP/s
# for each backend, and 1024^3 through oneDNN.
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
# the oneDNN and OpenBLAS that ran (loom bench gemm's line)
grep -m1 '^# libraries:' "$out" || echo "# libraries: not named (no loom bench gemm output)"
awk -v hl="${BENCH_HEADLINES:-}" '
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
    # the geometric means of each side over the same shapes, for the headlines
    if (v["dnnl_sgemm"] > 0 && v["loom:dnnl"] > 0) { gl[t, "dnnl"] += log(v["loom:dnnl"]); gr[t, "dnnl"] += log(v["dnnl_sgemm"]) }
    if (v["cblas_sgemm"] > 0 && v["loom:openblas"] > 0) { gl[t, "openblas"] += log(v["loom:openblas"]); gr[t, "openblas"] += log(v["cblas_sgemm"]) }
    if ($1 == "square" && $2 == "1024^3") { sq[t, "loom"] = v["loom:dnnl"]; sq[t, "raw"] = v["dnnl_sgemm"] }
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
    if (hl == "") exit
    for (i = 1; i <= nt; i++) {
      t = order[i]
      th = t " thread" (t == 1 ? "" : "s")
      if (n[t, "dnnl"] > 0)
        printf "loom_gemm on oneDNN, geomean of %d shapes, %s\tGFLOP/s\t%.1f\t%.1f\tdnnl_sgemm (oneDNN)\n", n[t, "dnnl"], th, exp(gl[t, "dnnl"] / n[t, "dnnl"]), exp(gr[t, "dnnl"] / n[t, "dnnl"]) >> hl
      if (n[t, "openblas"] > 0)
        printf "loom_gemm on OpenBLAS, geomean of %d shapes, %s\tGFLOP/s\t%.1f\t%.1f\tcblas_sgemm (OpenBLAS)\n", n[t, "openblas"], th, exp(gl[t, "openblas"] / n[t, "openblas"]), exp(gr[t, "openblas"] / n[t, "openblas"]) >> hl
      if (sq[t, "loom"] > 0 && sq[t, "raw"] > 0)
        printf "loom_gemm on oneDNN, 1024^3, %s\tGFLOP/s\t%.1f\t%.1f\tdnnl_sgemm (oneDNN)\n", th, sq[t, "loom"], sq[t, "raw"] >> hl
    }
  }' "$out"
