/* GEMM backend choice (oneDNN, OpenBLAS, naive) and the deterministic
 * switch: process state, built once (gemm.c, the arithmetic, is built once
 * per instruction set). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

static const char *const backend_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_GEMM_BACKEND_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof backend_names / sizeof backend_names[0] ==
                   LOOM_GEMM_BACKEND_COUNT,
               "one name per GEMM backend");

static atomic_int g_backend = -1; /* -1: not decided yet */
static atomic_int g_det = -1;

const char *loom_gemm_backend_name(loom_gemm_backend b) {
  if ((int)b < 0 || b >= LOOM_GEMM_BACKEND_COUNT)
    return "unknown";
  return backend_names[b];
}

loom_status loom_gemm_backend_parse(const char *name, loom_gemm_backend *out) {
  if (!name || !out)
    return loom_error(LOOM_ERR_INVALID_ARG, "gemm backend: NULL argument");
  for (int i = 0; i < LOOM_GEMM_BACKEND_COUNT; i++)
    if (strcmp(name, backend_names[i]) == 0) {
      *out = (loom_gemm_backend)i;
      return LOOM_OK;
    }
  return loom_error(LOOM_ERR_INVALID_ARG,
                    "unknown GEMM backend '%s' (expected dnnl, openblas or "
                    "naive)",
                    name);
}

static loom_gemm_backend default_backend(void) {
#if defined(LOOM_HAVE_DNNL) && !defined(LOOM_GEMM_DEFAULT_OPENBLAS)
  return LOOM_GEMM_DNNL;
#else
  return LOOM_GEMM_OPENBLAS;
#endif
}

loom_status loom_gemm_set_backend(loom_gemm_backend b) {
  if ((int)b < 0 || b >= LOOM_GEMM_BACKEND_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "GEMM backend %d out of range",
                      (int)b);
#ifndef LOOM_HAVE_DNNL
  if (b == LOOM_GEMM_DNNL)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "GEMM backend 'dnnl': loom was built without oneDNN");
#endif
  atomic_store(&g_backend, (int)b);
  return LOOM_OK;
}

loom_gemm_backend loom_gemm_get_backend(void) {
  int b = atomic_load(&g_backend);
  if (b >= 0)
    return (loom_gemm_backend)b;
  loom_gemm_backend chosen = default_backend();
  const char *env = getenv("LOOM_GEMM");
  if (env && *env) {
    loom_gemm_backend parsed = chosen;
    if (loom_gemm_backend_parse(env, &parsed) != LOOM_OK)
      LOOM_WARN("LOOM_GEMM=%s: unknown backend, using %s", env,
                backend_names[chosen]);
    else if (loom_gemm_set_backend(parsed) != LOOM_OK)
      LOOM_WARN("LOOM_GEMM=%s: %s; using %s", env, loom_last_error(),
                backend_names[chosen]);
    else
      chosen = parsed;
  }
  int expected = -1;
  atomic_compare_exchange_strong(&g_backend, &expected, (int)chosen);
  return (loom_gemm_backend)atomic_load(&g_backend);
}

void loom_gemm_set_deterministic(bool on) { atomic_store(&g_det, on ? 1 : 0); }

bool loom_gemm_get_deterministic(void) {
  int d = atomic_load(&g_det);
  if (d >= 0)
    return d != 0;
  const char *env = getenv("LOOM_GEMM_DETERMINISTIC");
  d = 1;
  if (env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0 ||
              strcmp(env, "false") == 0 || strcmp(env, "no") == 0))
    d = 0;
  int expected = -1;
  atomic_compare_exchange_strong(&g_det, &expected, d);
  return atomic_load(&g_det) != 0;
}

/* ------------------------------------------------------------------ bf16 */

static const char *const bf16_path_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_BF16_PATH_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof bf16_path_names / sizeof bf16_path_names[0] ==
                   LOOM_BF16_PATH_COUNT,
               "one name per bf16 path");

const char *loom_bf16_path_name(loom_bf16_path p) {
  if ((int)p < 0 || p >= LOOM_BF16_PATH_COUNT)
    return "unknown";
  return bf16_path_names[p];
}

/* Only the conversion path is built: oneDNN's bf16 matmul for AMX and
 * AVX512-BF16 comes later (docs/precision.md). */
loom_bf16_path loom_bf16_get_path(void) { return LOOM_BF16_PATH_CONVERT; }

const char *loom_half_path_describe(loom_dtype dt) {
  const loom_cpu_features *f = loom_cpu_get_features();
  const bool avx2 = loom_cpu_isa() == LOOM_ISA_AVX2;
  if (dt == LOOM_F16) /* the avx2 copy converts with F16C */
    return avx2 ? "F16C (f32 arithmetic, f16 storage)"
                : "base (f32 arithmetic, f16 storage, scalar conversions)";
  if (dt != LOOM_BF16)
    return "?";
  if (f->amx_bf16)
    return avx2 ? "AVX2 (f32 arithmetic, bf16 storage; this CPU's AMX is "
                  "not used yet)"
                : "base (f32 arithmetic, bf16 storage; this CPU's AMX is "
                  "not used yet)";
  if (f->avx512_bf16)
    return avx2 ? "AVX2 (f32 arithmetic, bf16 storage; this CPU's "
                  "AVX512-BF16 is not used yet)"
                : "base (f32 arithmetic, bf16 storage; this CPU's "
                  "AVX512-BF16 is not used yet)";
  return avx2 ? "AVX2 (f32 arithmetic, bf16 storage)"
              : "base (f32 arithmetic, bf16 storage)";
}
