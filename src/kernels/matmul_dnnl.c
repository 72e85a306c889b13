/* Half GEMM through oneDNN's matmul primitive (docs/precision.md): C (f32)
 * = alpha op(A) op(B) + beta C with A and B in bf16 (or f16), run by
 * oneDNN's AVX512-BF16 or AMX kernels (AVX512-FP16 for f16, oneDNN 3.x)
 * with f32 sums. A primitive fixes the shape,
 * the strides and the transposes, so one is built per (tile) shape and
 * cached. With thread-count invariance on (loom_gemm_set_deterministic),
 * C is cut by the same grid as the f32 GEMM and every tile runs on one
 * thread (oneDNN runs serially inside a parallel region), K partials
 * added in chunk order: the bits depend on the shape alone. Off, one
 * primitive runs the whole GEMM on oneDNN's threads. */
#include "internal.h"

#ifdef LOOM_HAVE_DNNL
#include "dnnl_compat.h"
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct mm_key {
  int M, N, K, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  bool serial; /* built for one thread (loom_kern_half_matmul_serial) */
  bool bias;   /* adds a bias row (1, N) of f32 (loom_kern_half_matmul_bias) */
  dnnl_data_type_t dt; /* of A and B: dnnl_bf16 or dnnl_f16 */
} mm_key;

typedef struct mm_entry {
  mm_key key;
  dnnl_primitive_t prim; /* NULL: oneDNN has no fast kernel for it */
  dnnl_memory_desc_t a, b, c, pad, bias;
  size_t pad_bytes;
  bool brgemm; /* oneDNN's blocked kernels (AMX or AVX512-BF16 tiles) */
  /* When the strided shape gets only oneDNN's older gemm kernel but the
   * same shape packed densely gets the blocked one (oneDNN 2.x's blocked
   * matmul takes a transposed A only with lda = M, and a C only with
   * ldc = N), or gets no fast kernel at all where the dense shape does
   * (3.x's blocked matmul takes no strided operand, and f16 has no gemm
   * kernel): the dense shape's entry; the call packs A and B into dense
   * copies and stages C. NULL otherwise. */
  const struct mm_entry *dense;
} mm_entry;

/* Shapes kept: a model has a few GEMMs per layer, each a few tile shapes. */
#define MM_CACHE_MAX 512
static mm_entry g_mm[MM_CACHE_MAX];
static int g_nmm;
static pthread_mutex_t g_mm_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void) {
  if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success)
    g_engine = NULL;
}

static bool same(const mm_key *x, const mm_key *y) {
  return x->M == y->M && x->N == y->N && x->K == y->K && x->lda == y->lda &&
         x->ldb == y->ldb && x->ldc == y->ldc && x->ta == y->ta &&
         x->tb == y->tb && x->alpha == y->alpha && x->beta == y->beta &&
         x->serial == y->serial && x->bias == y->bias && x->dt == y->dt;
}

/* oneDNN's type for half type dt (bf16 or f16) */
static dnnl_data_type_t ddt(loom_dtype dt) {
  return dt == LOOM_F16 ? dnnl_f16 : dnnl_bf16;
}

/* A matrix of rows x cols, row-major with stride ld, or its transpose. */
static bool md_of(dnnl_memory_desc_t *md, int rows, int cols, int ld,
                  bool trans, dnnl_data_type_t dt) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  return md_strides(md, 2, dims, dt, strides);
}

/* e's descriptors given back (3.x: handles; a failed build) */
static void mds_free(mm_entry *e) {
  md_free(&e->a);
  md_free(&e->b);
  md_free(&e->c);
  md_free(&e->bias);
  md_free(&e->pad);
}

/* LOOM_DNNL_BLOCKED_ONLY=1 (tests): a shape without a blocked kernel
 * counts as one without a fast kernel, as f16's strided shapes are on 3.x
 * (no gemm-based f16 matmul); so the packed dense fallback runs on any
 * CPU with a bf16 unit. */
static bool blocked_only(void) {
  const char *v = getenv("LOOM_DNNL_BLOCKED_ONLY");
  return v && strcmp(v, "1") == 0;
}

/* Builds the primitive for k; false when oneDNN offers only its reference
 * kernels (no bf16 unit, or a layout its fast kernels do not take). */
static bool build(mm_entry *e) {
  const mm_key *k = &e->key;
  e->prim = NULL;
  pthread_once(&g_engine_once, engine_init);
  if (!g_engine)
    return false;
  if (!md_of(&e->a, k->M, k->K, k->lda, k->ta, k->dt) ||
      !md_of(&e->b, k->K, k->N, k->ldb, k->tb, k->dt) ||
      !md_of(&e->c, k->M, k->N, k->ldc, false, dnnl_f32) ||
      (k->bias && !md_of(&e->bias, 1, k->N, k->N, false, dnnl_f32))) {
    mds_free(e);
    return false;
  }
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  bool ok = dnnl_primitive_attr_create(&attr) == dnnl_success &&
            dnnl_post_ops_create(&po) == dnnl_success;
  if (ok)
    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (ok)
    ok = alpha_beta(attr, po, k->alpha, k->beta);
  if (ok && dnnl_post_ops_len(po) > 0)
    ok = dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  dnnl_primitive_desc_t pd = NULL;
  if (ok)
    ok =
        pd_matmul(&pd, g_engine, MD(e->a), MD(e->b),
                  k->bias ? MD(e->bias) : NULL, MD(e->c), attr) == dnnl_success;
  if (po)
    dnnl_post_ops_destroy(po);
  if (attr)
    dnnl_primitive_attr_destroy(attr);
  if (!ok) {
    mds_free(e);
    return false;
  }
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) !=
          dnnl_success ||
      !impl || strncmp(impl, "ref", 3) == 0 ||
      (blocked_only() && strncmp(impl, "brg", 3) != 0)) {
    dnnl_primitive_desc_destroy(pd);
    mds_free(e);
    return false;
  }
  e->brgemm = strncmp(impl, "brg", 3) == 0;
  loom_md_ref pad =
      dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  e->pad_bytes = pad ? dnnl_memory_desc_get_size(pad) : 0;
  ok = (e->pad_bytes == 0 || md_copy(&e->pad, pad)) &&
       dnnl_primitive_create(&e->prim, pd) == dnnl_success;
  dnnl_primitive_desc_destroy(pd);
  if (!ok) {
    e->prim = NULL;
    mds_free(e);
  }
  return ok;
}

/* Whether k's operands and C are dense (each row's elements follow the
 * last row's: ld = the row's length). */
static bool dense_key(const mm_key *k) {
  return k->lda == (k->ta ? k->M : k->K) && k->ldb == (k->tb ? k->K : k->N) &&
         k->ldc == k->N;
}

/* Whether strided shapes that get oneDNN's older gemm kernel take the
 * packed dense primitive instead: on an AMX CPU, where the blocked kernel
 * runs on the tile unit (the older one does not); measured slower on
 * AVX512-BF16 alone (docs/precision.md). LOOM_BF16_PACK=0 or 1 decides
 * instead (for measuring). */
static bool pack_on(void) {
  const char *v = getenv("LOOM_BF16_PACK");
  if (v && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0))
    return v[0] == '1';
  return loom_cpu_get_features()->amx_bf16;
}

/* The entry for k, built if new (g_mm_lock held); NULL when full. */
static mm_entry *find_locked(const mm_key *k) {
  for (int i = 0; i < g_nmm; i++)
    if (same(&g_mm[i].key, k))
      return &g_mm[i];
  if (g_nmm >= MM_CACHE_MAX)
    return NULL;
  mm_entry *e = &g_mm[g_nmm++];
  memset(e, 0, sizeof *e);
  e->key = *k;
  /* a kernel that fixes its thread split when built (a K reduction over
   * threads) must not see more than the one it will run on */
  const int save = k->serial ? omp_get_max_threads() : 1;
  if (k->serial)
    omp_set_num_threads(1);
  (void)build(e);
  if (k->serial)
    omp_set_num_threads(save);
  /* A strided shape on the older kernel (pack_on), or with no fast kernel
   * at all (oneDNN 3.x's blocked kernels refuse strided operands, and f16
   * has no other): the dense shape's primitive, if it has a fast one. */
  const bool older = e->prim && !e->brgemm && pack_on();
  if (!dense_key(k) && (older || !e->prim)) {
    mm_key d = *k;
    d.lda = k->ta ? k->M : k->K;
    d.ldb = k->tb ? k->K : k->N;
    if (k->ldc != k->N) { /* staged: C = staged + beta C */
      d.ldc = k->N;
      d.beta = 0.0f;
    }
    const mm_entry *de = find_locked(&d);
    if (de && de->prim && (de->brgemm || !e->prim))
      e->dense = de;
  }
  return e;
}

/* Whether e runs: its own primitive, or the dense shape's. */
static bool usable(const mm_entry *e) { return e && (e->prim || e->dense); }

/* The cached entry for k (built on first use; entries are never removed,
 * so a pointer stays valid). NULL when the cache is full. */
static const mm_entry *lookup(const mm_key *k) {
  pthread_mutex_lock(&g_mm_lock);
  const mm_entry *found = find_locked(k);
  pthread_mutex_unlock(&g_mm_lock);
  return found;
}

/* Each thread's stream, oneDNN scratchpad and memory objects for the
 * primitives it ran last (their data pointers set per call), kept for the
 * thread's life: the attention kernel runs thousands of small matmuls a
 * step, and a scratchpad per call (mmap and munmap past malloc's
 * threshold) or three or four memory objects made per call cost more than
 * the matmuls. Every thread's cache is also linked from g_caches, so it
 * stays reachable (leak checkers); a thread that ends leaves its cache
 * there (the pool threads that run kernels live as long as the process). */
#define T_MEM 48
typedef struct t_mem {
  const mm_entry *e;
  dnnl_memory_t m[5]; /* A, B, C, scratchpad, bias (NULL: none) */
} t_mem;
#define T_RECENT 16
typedef struct t_cache {
  struct t_cache *next;
  dnnl_stream_t stream;
  void *pad;
  size_t pad_bytes;
  void *stage; /* dense copies of A and B, and C staged (mm_entry.dense) */
  size_t stage_bytes;
  const mm_entry *recent[T_RECENT]; /* the last entries found, newest first */
  t_mem mems[T_MEM];
  int nmems, oldest;
} t_cache;
static t_cache *g_caches;
static _Thread_local t_cache *t_cache_p;

static t_cache *my_cache(void) {
  if (t_cache_p)
    return t_cache_p;
  t_cache *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  pthread_mutex_lock(&g_mm_lock);
  c->next = g_caches;
  g_caches = c;
  pthread_mutex_unlock(&g_mm_lock);
  return t_cache_p = c;
}

/* The thread's memory objects for e, made on first use (replacing the
 * oldest when all are taken); NULL on failure. */
static t_mem *mems_of(t_cache *c, const mm_entry *e) {
  for (int i = 0; i < c->nmems; i++)
    if (c->mems[i].e == e)
      return &c->mems[i];
  t_mem *x;
  if (c->nmems < T_MEM) {
    x = &c->mems[c->nmems++];
  } else {
    x = &c->mems[c->oldest];
    c->oldest = (c->oldest + 1) % T_MEM;
    for (int i = 0; i < 5; i++)
      if (x->m[i])
        dnnl_memory_destroy(x->m[i]);
  }
  memset(x, 0, sizeof *x);
  const loom_md_ref md[5] = {MD(e->a), MD(e->b), MD(e->c),
                             e->pad_bytes ? MD(e->pad) : NULL,
                             e->key.bias ? MD(e->bias) : NULL};
  for (int i = 0; i < 5; i++)
    if (md[i] && dnnl_memory_create(&x->m[i], md[i], g_engine,
                                    DNNL_MEMORY_NONE) != dnnl_success) {
      for (int k = 0; k < i; k++)
        if (x->m[k])
          dnnl_memory_destroy(x->m[k]);
      memset(x, 0, sizeof *x);
      return NULL;
    }
  x->e = e;
  return x;
}

/* Runs e's primitive on the calling thread's share; 0 on success. */
static int exec_prim(t_cache *c, const mm_entry *e, const uint16_t *A,
                     const uint16_t *B, float *C, const float *bias) {
  if (e->pad_bytes > c->pad_bytes) {
    void *np = malloc(e->pad_bytes);
    if (!np)
      return -1;
    free(c->pad);
    c->pad = np;
    c->pad_bytes = e->pad_bytes;
  }
  if (!c->stream &&
      dnnl_stream_create(&c->stream, g_engine, dnnl_stream_default_flags) !=
          dnnl_success) {
    c->stream = NULL;
    return -1;
  }
  t_mem *x = mems_of(c, e);
  if (!x)
    return -1;
  void *ptr[5] = {(void *)A, (void *)B, C, c->pad, (void *)bias};
  for (int i = 0; i < 5; i++)
    if (x->m[i] && dnnl_memory_set_data_handle(x->m[i], ptr[i]) != dnnl_success)
      return -1;
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, x->m[0]},
                             {DNNL_ARG_WEIGHTS, x->m[1]},
                             {DNNL_ARG_DST, x->m[2]}};
  int na = 3;
  if (x->m[3])
    args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, x->m[3]};
  if (x->m[4])
    args[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, x->m[4]};
  int rc = (int)dnnl_primitive_execute(e->prim, c->stream, na, args);
  if (rc == 0)
    rc = (int)dnnl_stream_wait(c->stream);
  return rc;
}

/* rows x cols of src (row stride ld) into dst, packed (row stride cols). */
static void pack(uint16_t *dst, const uint16_t *src, int rows, int cols,
                 int ld) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * cols, src + r * ld, (size_t)cols * sizeof *dst);
}

/* Runs k's entry e on the calling thread; 0 on success. With e->dense,
 * the strided operands are packed and a strided C staged: the dense
 * primitive's products, then C = staged + beta C (the sum post-op's
 * arithmetic). */
static int run(const mm_entry *e, const uint16_t *A, const uint16_t *B,
               float *C, const float *bias) {
  t_cache *c = my_cache();
  if (!c)
    return -1;
  const mm_entry *d = e->dense;
  if (!d)
    return exec_prim(c, e, A, B, C, bias);
  const mm_key *k = &e->key, *dk = &d->key;
  const int ar = k->ta ? k->K : k->M, ac = k->ta ? k->M : k->K;
  const int br = k->tb ? k->N : k->K, bc = k->tb ? k->K : k->N;
  const bool pa = k->lda != dk->lda, pb = k->ldb != dk->ldb,
             pc = k->ldc != dk->ldc;
  const size_t na = pa ? (size_t)ar * ac : 0, nb = pb ? (size_t)br * bc : 0;
  const size_t a_bytes = (na * sizeof *A + 63) / 64 * 64,
               b_bytes = (nb * sizeof *B + 63) / 64 * 64;
  const size_t need =
      a_bytes + b_bytes + (pc ? (size_t)k->M * k->N * sizeof *C : 0);
  if (need > c->stage_bytes) {
    void *np = aligned_alloc(64, (need + 63) / 64 * 64);
    if (!np)
      return -1;
    free(c->stage);
    c->stage = np;
    c->stage_bytes = need;
  }
  if (!c->stage) /* a dense entry always packs or stages something */
    return -1;
  uint16_t *a = pa ? c->stage : (uint16_t *)A;
  uint16_t *b = pb ? (uint16_t *)((char *)c->stage + a_bytes) : (uint16_t *)B;
  float *cc = pc ? (float *)(void *)((char *)c->stage + a_bytes + b_bytes) : C;
  if (pa)
    pack(a, A, ar, ac, k->lda);
  if (pb)
    pack(b, B, br, bc, k->ldb);
  int rc = exec_prim(c, d, a, b, cc, bias);
  if (rc || !pc)
    return rc;
  const float beta = k->beta;
  for (int64_t i = 0; i < k->M; i++) {
    float *ci = C + i * k->ldc;
    const float *si = cc + i * k->N;
    if (beta == 0.0f)
      memcpy(ci, si, (size_t)k->N * sizeof *ci);
    else
      for (int j = 0; j < k->N; j++)
        ci[j] = si[j] + beta * ci[j];
  }
  return 0;
}

/* lookup(k) through the calling thread's last entries first (no lock). */
static const mm_entry *find(const mm_key *k) {
  t_cache *c = my_cache();
  if (!c)
    return lookup(k);
  for (int i = 0; i < T_RECENT && c->recent[i]; i++)
    if (same(&c->recent[i]->key, k))
      return c->recent[i];
  const mm_entry *e = lookup(k);
  if (usable(e)) {
    memmove(c->recent + 1, c->recent,
            (T_RECENT - 1) * sizeof(const mm_entry *));
    c->recent[0] = e;
  }
  return e;
}

bool loom_kern_half_matmul_probe(loom_dtype dt) {
  mm_key k = {64,    64,   64,   64,    64,    64,     false,
              false, 1.0f, 0.0f, false, false, ddt(dt)};
  const mm_entry *e = lookup(&k);
  return usable(e);
}

int loom_dnnl_version(void) {
  const dnnl_version_t *v = dnnl_version();
  return v ? v->major * 100 + v->minor : 0;
}

/* Runs op on one thread: a tile; 0 on success, -1 when oneDNN has no fast
 * kernel for the shape (the caller converts instead). */
static int tile(loom_dtype dt, bool ta, bool tb, int M, int N, int K,
                float alpha, const uint16_t *A, int lda, const uint16_t *B,
                int ldb, float beta, float *C, int ldc, const float *bias) {
  mm_key k = {M,  N,     K,    lda,   ldb,          ldc,    ta,
              tb, alpha, beta, false, bias != NULL, ddt(dt)};
  const mm_entry *e = find(&k);
  if (!usable(e))
    return -1;
  return run(e, A, B, C, bias);
}

bool loom_kern_half_matmul_serial_ok(loom_dtype dt, bool ta, bool tb, int M,
                                     int N, int K, float alpha, int lda,
                                     int ldb, float beta, int ldc) {
  mm_key k = {M,  N,     K,    lda,  ldb,   ldc,    ta,
              tb, alpha, beta, true, false, ddt(dt)};
  const mm_entry *e = lookup(&k);
  return usable(e);
}

int loom_kern_half_matmul_serial(loom_dtype dt, bool ta, bool tb, int M, int N,
                                 int K, float alpha, const uint16_t *A, int lda,
                                 const uint16_t *B, int ldb, float beta,
                                 float *C, int ldc) {
  if (M <= 0 || N <= 0)
    return 0;
  mm_key k = {M,  N,     K,    lda,  ldb,   ldc,    ta,
              tb, alpha, beta, true, false, ddt(dt)};
  const mm_entry *e = find(&k);
  if (!usable(e))
    return -1;
  return run(e, A, B, C, NULL);
}

typedef struct mm_ctx {
  loom_dtype dt;
  bool ta, tb;
  float alpha;
  const uint16_t *A, *B;
  int lda, ldb;
  const float *bias; /* (N) or NULL */
} mm_ctx;

static int tile_bf16(void *ctx, int i0, int j0, int k0, int mm, int nn, int kk,
                     float beta, float *c, int ldc) {
  const mm_ctx *x = ctx;
  const uint16_t *a = x->ta ? x->A + (int64_t)k0 * x->lda + i0
                            : x->A + (int64_t)i0 * x->lda + k0;
  const uint16_t *b = x->tb ? x->B + (int64_t)j0 * x->ldb + k0
                            : x->B + (int64_t)k0 * x->ldb + j0;
  return tile(x->dt, x->ta, x->tb, mm, nn, kk, x->alpha, a, x->lda, b, x->ldb,
              beta, c, ldc, x->bias ? x->bias + j0 : NULL);
}

/* C = alpha op(A) op(B) + beta C (+ the bias row, when given: then alpha
 * 1, beta 0 and no K partials, else LOOM_ERR_UNSUPPORTED). */
static loom_status matmul(loom_dtype dt, bool ta, bool tb, int M, int N, int K,
                          float alpha, const uint16_t *A, int lda,
                          const uint16_t *B, int ldb, float beta, float *C,
                          int ldc, const float *bias) {
  if (!loom_gemm_get_deterministic()) {
    int save = omp_get_max_threads();
    omp_set_num_threads(loom_threads());
    int rc =
        tile(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    omp_set_num_threads(save);
    return rc == 0 ? LOOM_OK : LOOM_ERR_UNSUPPORTED;
  }
  loom_kern_gemm_plan p;
  loom_kern_gemm_plan_make(M, N, K, &p);
  const bool part = p.gk > 1; /* K partials into an (M, N) buffer each */
  if (part && bias)
    return LOOM_ERR_UNSUPPORTED;
  const int tasks = p.gm * p.gn * p.gk;
  /* Every tile shape has a fast primitive, or nothing is touched. */
  for (int t = 0; t < tasks; t++) {
    const int kb = t / (p.gm * p.gn), rest = t % (p.gm * p.gn);
    const int i0 = (rest / p.gn) * p.tm, j0 = (rest % p.gn) * p.tn;
    mm_key k = {M - i0 < p.tm ? M - i0 : p.tm,
                N - j0 < p.tn ? N - j0 : p.tn,
                K - kb * p.kc < p.kc ? K - kb * p.kc : p.kc,
                lda,
                ldb,
                part ? N : ldc,
                ta,
                tb,
                alpha,
                part ? 0.0f : beta,
                false,
                bias != NULL,
                ddt(dt)};
    const mm_entry *e = lookup(&k);
    if (!usable(e))
      return LOOM_ERR_UNSUPPORTED;
  }
  mm_ctx x = {dt, ta, tb, alpha, A, B, lda, ldb, bias};
  int rc;
  LOOM_TRY(
      loom_kern_gemm_tiled(M, N, K, beta, C, ldc, NULL, tile_bf16, &x, &rc));
  return rc == 0 ? LOOM_OK
                 : loom_error(LOOM_ERR_INTERNAL,
                              "%s gemm %dx%dx%d: oneDNN matmul failed (%d)",
                              loom_dtype_name(dt), M, N, K, rc);
}

loom_status loom_kern_half_matmul(loom_dtype dt, bool ta, bool tb, int M, int N,
                                  int K, float alpha, const uint16_t *A,
                                  int lda, const uint16_t *B, int ldb,
                                  float beta, float *C, int ldc) {
  return matmul(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

loom_status loom_kern_half_matmul_bias(loom_dtype dt, bool ta, bool tb, int M,
                                       int N, int K, const uint16_t *A, int lda,
                                       const uint16_t *B, int ldb,
                                       const float *bias, float *C, int ldc) {
  if (!bias)
    return LOOM_ERR_UNSUPPORTED;
  return matmul(dt, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, bias);
}

#else /* no oneDNN */

bool loom_kern_half_matmul_serial_ok(loom_dtype dt, bool ta, bool tb, int M,
                                     int N, int K, float alpha, int lda,
                                     int ldb, float beta, int ldc) {
  (void)dt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha,
      (void)lda;
  (void)ldb, (void)beta, (void)ldc;
  return false;
}

int loom_kern_half_matmul_serial(loom_dtype dt, bool ta, bool tb, int M, int N,
                                 int K, float alpha, const uint16_t *A, int lda,
                                 const uint16_t *B, int ldb, float beta,
                                 float *C, int ldc) {
  (void)dt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A;
  (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
  return -1;
}

bool loom_kern_half_matmul_probe(loom_dtype dt) {
  (void)dt;
  return false;
}
loom_status loom_kern_half_matmul_bias(loom_dtype dt, bool ta, bool tb, int M,
                                       int N, int K, const uint16_t *A, int lda,
                                       const uint16_t *B, int ldb,
                                       const float *bias, float *C, int ldc) {
  (void)dt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda,
      (void)B;
  (void)ldb, (void)bias, (void)C, (void)ldc;
  return LOOM_ERR_UNSUPPORTED;
}
int loom_dnnl_version(void) { return 0; }
loom_status loom_kern_half_matmul(loom_dtype dt, bool ta, bool tb, int M, int N,
                                  int K, float alpha, const uint16_t *A,
                                  int lda, const uint16_t *B, int ldb,
                                  float beta, float *C, int ldc) {
  (void)dt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A;
  (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
  return LOOM_ERR_UNSUPPORTED;
}

#endif
