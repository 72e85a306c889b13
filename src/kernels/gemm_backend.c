/* GEMM backend choice (oneDNN, OpenBLAS, naive) and the deterministic
 * switch: process state, built once (gemm.c, the arithmetic, is built once
 * per instruction set). */
#include <math.h>
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
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_gemm_backend_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(name, backend_names, LOOM_GEMM_BACKEND_COUNT,
                           "GEMM backend", &i));
  *out = (loom_gemm_backend)i;
  return LOOM_OK;
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

/* ------------------------------------------------------------ tile grid */

/* The grid is a function of (M, N, K) alone. Each tile costs the library a
 * repack of its A rows and B columns, so tiles are kept large: about
 * GEMM_TILE_FLOPS of work each up to GEMM_TILES_NARROW of them (two for any
 * GEMM over GEMM_SPLIT_FLOPS); a GEMM too big for that many gets more tiles
 * only at GEMM_WIDE_TILE_FLOPS each, up to GEMM_TILES_MAX; always a power of
 * two of them (2, 4, 8... threads share them evenly), at least
 * GEMM_TILE_MIN on a side (twice that when K is long, where cutting K is the
 * cheaper way to more tiles: K chunks of at least GEMM_KCHUNK_MIN whose
 * partials are added in chunk order). Tuned on the reference workloads'
 * shapes at 2 threads: the grid runs at 0.9-1.0x of dnnl_sgemm's own
 * threading there. The wide tiles are for one thread a rank on big layers
 * (an 85M GPT's 512x3072x768 forward: 64 tiles of 128x192 ran at 0.81-0.91x
 * of one dnnl_sgemm call on Zen 4, 32 of 256x192 at 0.97): 16 threads still
 * get at least a tile each of any GEMM over 256 MFLOP. */
#define GEMM_TILE_MIN 64
#define GEMM_TILES_NARROW 16
#define GEMM_TILES_MAX 64
#define GEMM_TILE_FLOPS 16e6
#define GEMM_WIDE_TILE_FLOPS 64e6
#define GEMM_SPLIT_FLOPS 0.5e6
#define GEMM_KCHUNK_MIN 1024
#define GEMM_KCHUNKS_MAX 16

static int ceil_div(int a, int b) { return (a + b - 1) / b; }
static int round16(int a) { return (a + 15) / 16 * 16; }

static int pow2_floor(double x) {
  int p = 1;
  while (p * 2 <= x && p < (1 << 20))
    p *= 2;
  return p;
}

void loom_kern_gemm_plan_make(int M, int N, int K, loom_kern_gemm_plan *p) {
  const double work = 2.0 * M * N * (double)K;
  int target = pow2_floor(work / GEMM_TILE_FLOPS);
  if (target > GEMM_TILES_NARROW) {
    const int wide = pow2_floor(work / GEMM_WIDE_TILE_FLOPS);
    target = wide > GEMM_TILES_NARROW ? wide : GEMM_TILES_NARROW;
  }
  if (target > GEMM_TILES_MAX)
    target = GEMM_TILES_MAX;
  if (target < 2 && work >= GEMM_SPLIT_FLOPS)
    target = 2; /* even a small GEMM is worth two threads */
  /* M x N in gm x gn tiles, both powers of two (so 2, 4, 8... threads share
   * them evenly), as square as the shape allows, no side under TILE_MIN
   * unless the matrix itself is smaller. */
  /* with a long K, keep tiles larger and cut K instead (the partials cost
   * little next to K's work; small tiles repack A and B more) */
  const int side = K >= 2 * GEMM_KCHUNK_MIN ? 2 * GEMM_TILE_MIN : GEMM_TILE_MIN;
  int gm = 1, gn = 1;
  while (gm * gn < target) {
    const bool can_m = M / (gm * 2) >= side;
    const bool can_n = N / (gn * 2) >= side;
    if (can_n && (!can_m || N / gn > M / gm))
      gn *= 2;
    else if (can_m)
      gm *= 2;
    else
      break;
  }
  p->tm = gm == 1 ? M : round16(ceil_div(M, gm));
  p->tn = gn == 1 ? N : round16(ceil_div(N, gn));
  p->gm = ceil_div(M, p->tm);
  p->gn = ceil_div(N, p->tn);
  /* Too few tiles for the work and a long K: cut K too. */
  int gk = 1;
  while (p->gm * p->gn * gk < target && gk < GEMM_KCHUNKS_MAX &&
         K / (gk * 2) >= GEMM_KCHUNK_MIN)
    gk *= 2;
  p->kc = gk > 1 ? round16(ceil_div(K, gk)) : K;
  p->gk = ceil_div(K, p->kc);
}

loom_status loom_kern_gemm_tiled(int M, int N, int K, float beta, float *C,
                                 int ldc, const float *bias,
                                 loom_kern_tile_fn fn, void *ctx, int *rc) {
  loom_kern_gemm_plan p;
  loom_kern_gemm_plan_make(M, N, K, &p);
  *rc = 0;
  float *part = NULL;
  if (p.gk > 1) {
    part = loom_malloc((size_t)p.gk * M * N * sizeof(float));
    if (!part)
      return loom_error_context(LOOM_ERR_NOMEM, "gemm %dx%dx%d", M, N, K);
  }
  const int tasks = p.gm * p.gn * p.gk;
  const int nt = loom_kern_nthreads_flops(tasks, 2.0 * M * N * (double)K);
  atomic_int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int t = 0; t < tasks; t++) {
    const int kb = t / (p.gm * p.gn), rest = t % (p.gm * p.gn);
    const int i0 = (rest / p.gn) * p.tm, j0 = (rest % p.gn) * p.tn;
    const int k0 = kb * p.kc;
    const int mm = M - i0 < p.tm ? M - i0 : p.tm;
    const int nn = N - j0 < p.tn ? N - j0 : p.tn;
    const int kk = K - k0 < p.kc ? K - k0 : p.kc;
    float *c = C + (int64_t)i0 * ldc + j0;
    if (bias && !part) /* the tile's rows set to the bias as it is made */
      for (int i = 0; i < mm; i++)
        memcpy(c + (int64_t)i * ldc, bias + j0, (size_t)nn * sizeof(float));
    int r = part ? fn(ctx, i0, j0, k0, mm, nn, kk, 0.0f,
                      part + ((int64_t)kb * M + i0) * N + j0, N)
                 : fn(ctx, i0, j0, k0, mm, nn, kk, beta, c, ldc);
    if (r != 0)
      atomic_store(&failed, r);
  }
  *rc = atomic_load(&failed);
  if (part && *rc == 0)
    loom_kern_gemm_fold(part, p.gk, M, N, beta, bias, C, ldc);
  loom_free(part);
  return LOOM_OK;
}

void loom_kern_gemm_fold(const float *part, int gk, int M, int N, float beta,
                         const float *bias, float *C, int ldc) {
  int nr = loom_kern_nthreads((int64_t)M * N * gk, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nr) schedule(static) if (nr > 1)
  for (int i = 0; i < M; i++) {
    float *c = C + (int64_t)i * ldc;
    const float *prior = bias ? bias : c; /* what beta scales */
    for (int j = 0; j < N; j++) {
      float s = part[(int64_t)i * N + j];
      for (int kb = 1; kb < gk; kb++)
        s += part[((int64_t)kb * M + i) * N + j];
      c[j] = beta == 0.0f ? s : fmaf(beta, prior[j], s);
    }
  }
}

/* ------------------------------------------------------- half-type paths */

/* Whether the environment variable var (LOOM_BF16_PATH, LOOM_F16_PATH)
 * forces the conversion: "convert"; "auto" or unset leave the choice to
 * the CPU; anything else is warned about and treated as auto. */
static bool env_forces_convert(const char *var) {
  const char *env = getenv(var);
  if (env && strcmp(env, "convert") == 0)
    return true;
  if (env && *env && strcmp(env, "auto") != 0)
    LOOM_WARN("%s=%s: expected auto or convert; auto", var, env);
  return false;
}

/* *slot's path, chosen by choose() at the first call (-1: not yet). */
static int path_once(atomic_int *slot, int (*choose)(void)) {
  int p = atomic_load(slot);
  if (p < 0) {
    int expected = -1;
    atomic_compare_exchange_strong(slot, &expected, choose());
    p = atomic_load(slot);
  }
  return p;
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

/* The bf16 path, chosen once: LOOM_BF16_PATH (convert, or auto: the
 * default), else oneDNN's matmul when the GEMM backend is dnnl and the CPU
 * has a bf16 unit that oneDNN drives (a probe primitive it builds with a
 * kernel of its own, not its reference loops), else the conversion. */
static atomic_int g_bf16_path = -1;

static int choose_bf16_path(void) {
  if (env_forces_convert("LOOM_BF16_PATH"))
    return LOOM_BF16_PATH_CONVERT;
  const loom_cpu_features *f = loom_cpu_get_features();
  if (loom_gemm_get_backend() != LOOM_GEMM_DNNL ||
      !(f->avx512_bf16 || f->amx_bf16) ||
      !loom_kern_half_matmul_probe(LOOM_BF16))
    return LOOM_BF16_PATH_CONVERT;
  return f->amx_bf16 ? LOOM_BF16_PATH_AMX : LOOM_BF16_PATH_AVX512_BF16;
}

loom_bf16_path loom_bf16_get_path(void) {
  return (loom_bf16_path)path_once(&g_bf16_path, choose_bf16_path);
}

bool loom_half_on_unit(loom_dtype dt) {
  if (dt == LOOM_BF16)
    return loom_bf16_get_path() != LOOM_BF16_PATH_CONVERT;
  return dt == LOOM_F16 && loom_f16_get_path() != LOOM_F16_PATH_CONVERT;
}

loom_status loom_bf16_set_path(loom_bf16_path p) {
  if ((int)p < 0 || p >= LOOM_BF16_PATH_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "bf16 path %d", (int)p);
  if (p != LOOM_BF16_PATH_CONVERT) {
    const loom_cpu_features *f = loom_cpu_get_features();
    bool has = p == LOOM_BF16_PATH_AMX ? f->amx_bf16 : f->avx512_bf16;
    if (!has || loom_gemm_get_backend() != LOOM_GEMM_DNNL ||
        !loom_kern_half_matmul_probe(LOOM_BF16))
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "bf16 path %s: this CPU or build has no such unit "
                        "for oneDNN's matmul (GEMM backend %s)",
                        loom_bf16_path_name(p),
                        loom_gemm_backend_name(loom_gemm_get_backend()));
  }
  atomic_store(&g_bf16_path, (int)p);
  return LOOM_OK;
}

/* ------------------------------------------------------------------- f16 */

static const char *const f16_path_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_F16_PATH_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof f16_path_names / sizeof f16_path_names[0] ==
                   LOOM_F16_PATH_COUNT,
               "one name per f16 path");

const char *loom_f16_path_name(loom_f16_path p) {
  if ((int)p < 0 || p >= LOOM_F16_PATH_COUNT)
    return "unknown";
  return f16_path_names[p];
}

/* The f16 path, chosen once as bf16's: LOOM_F16_PATH (convert or auto),
 * else oneDNN's matmul where the CPU has AVX512-FP16 and the oneDNN built
 * in has f16 kernels for it (3.x; Debian's 2.6.3 has none), else the
 * conversion. */
static atomic_int g_f16_path = -1;

/* Whether this process can run f16 on the unit; if not and why is given,
 * the part that is missing, in words. */
static bool f16_unit_here(char *why, size_t n) {
  const bool fp16 = loom_cpu_get_features()->avx512_fp16;
  const bool dnnl = loom_gemm_get_backend() == LOOM_GEMM_DNNL;
  if (fp16 && dnnl && loom_kern_half_matmul_probe(LOOM_F16))
    return true;
  if (!why)
    return false;
  const int v = loom_dnnl_version();
  if (!fp16)
    snprintf(why, n, "this CPU has no AVX512-FP16");
  else if (!dnnl)
    snprintf(why, n, "the GEMM backend is %s, not dnnl",
             loom_gemm_backend_name(loom_gemm_get_backend()));
  else if (v < 300)
    snprintf(why, n,
             "oneDNN %d.%d has no f16 kernels for it (3.x has: build with "
             "LOOM_DNNL_ROOT, scripts/fetch-onednn3.sh)",
             v / 100, v % 100);
  else
    snprintf(why, n, "oneDNN %d.%d offers no fast f16 matmul here", v / 100,
             v % 100);
  return false;
}

static int choose_f16_path(void) {
  if (env_forces_convert("LOOM_F16_PATH"))
    return LOOM_F16_PATH_CONVERT;
  return f16_unit_here(NULL, 0) ? LOOM_F16_PATH_AVX512_FP16
                                : LOOM_F16_PATH_CONVERT;
}

loom_f16_path loom_f16_get_path(void) {
  return (loom_f16_path)path_once(&g_f16_path, choose_f16_path);
}

loom_status loom_f16_set_path(loom_f16_path p) {
  if ((int)p < 0 || p >= LOOM_F16_PATH_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "f16 path %d", (int)p);
  char why[160];
  if (p != LOOM_F16_PATH_CONVERT && !f16_unit_here(why, sizeof why))
    return loom_error(LOOM_ERR_UNSUPPORTED, "f16 path %s: %s",
                      loom_f16_path_name(p), why);
  atomic_store(&g_f16_path, (int)p);
  return LOOM_OK;
}

const char *loom_half_path_describe(loom_dtype dt) {
  const loom_cpu_features *f = loom_cpu_get_features();
  const loom_isa isa = loom_cpu_isa();
  if (dt == LOOM_F16 && loom_f16_get_path() == LOOM_F16_PATH_AVX512_FP16)
    return "AVX512-FP16 (oneDNN matmul and convolution: f16 operands, f32 "
           "sums, attention included; convolutions of under 4 input "
           "channels convert to f32)";
  if (dt == LOOM_F16) /* the avx2 and avx512 copies convert with F16C */
    return isa >= LOOM_ISA_AVX2
               ? "F16C (f32 arithmetic, f16 storage)"
               : "base (f32 arithmetic, f16 storage, scalar conversions)";
  if (dt != LOOM_BF16)
    return "?";
  switch (loom_bf16_get_path()) {
  /* what runs on the unit: src/kernels/half.c, attention.c */
  case LOOM_BF16_PATH_AMX:
    return "AMX (oneDNN matmul and convolution: bf16 operands, f32 sums, "
           "attention included; convolutions of under 4 input channels "
           "convert to f32)";
  case LOOM_BF16_PATH_AVX512_BF16:
    return "AVX512-BF16 (oneDNN matmul and convolution: bf16 operands, f32 "
           "sums, attention included; convolutions of under 4 input "
           "channels convert to f32)";
  default:
    break;
  }
  /* the conversion path, by the copy of the kernels that runs it */
  static const char *const convert[LOOM_ISA_COUNT] = {
      [LOOM_ISA_BASE] = "base (f32 arithmetic, bf16 storage)",
      [LOOM_ISA_AVX2] = "AVX2 (f32 arithmetic, bf16 storage)",
      [LOOM_ISA_AVX512] = "AVX-512 (f32 arithmetic, bf16 storage)"};
  static const char *const unused[LOOM_ISA_COUNT] = {
      [LOOM_ISA_BASE] = "base (f32 arithmetic, bf16 storage; this CPU's bf16 "
                        "unit unused)",
      [LOOM_ISA_AVX2] = "AVX2 (f32 arithmetic, bf16 storage; LOOM_BF16_PATH "
                        "convert or no oneDNN: this CPU's bf16 unit unused)",
      [LOOM_ISA_AVX512] = "AVX-512 (f32 arithmetic, bf16 storage; "
                          "LOOM_BF16_PATH convert or no oneDNN: this CPU's "
                          "bf16 unit unused)"};
  return (f->amx_bf16 || f->avx512_bf16 ? unused : convert)[isa];
}
