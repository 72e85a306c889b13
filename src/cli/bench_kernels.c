/* loom bench kernels: milliseconds per call of loom's own vector code (the
 * kernels and the optimizer update built once per instruction set) at the
 * shapes of the reference GPT, for the copy this process runs. One copy a
 * process (loom_cpu_isa), so bench/kernels.sh runs it once per LOOM_ISA,
 * alternating, to compare them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/core.h"
#include "loom/kernels.h"
#include "loom/optim.h"

/* kjv-gpt: batch 32 x context 128 tokens, d_model 128, 4 heads, MLP 512,
 * byte vocabulary (256); about 0.83M parameters. */
enum { KB = 32, KT = 128, KC = 128, KNH = 4, KF = 512, KV = 256 };
#define KN (KB * KT)
#define KPARAMS (1 << 20)

typedef struct buffers {
  float *x, *y, *d, *z, *w, *b, *dw, *db, *mean, *rstd, *att, *scr, *big;
  uint16_t *h;
  int32_t *tgt;
} buffers;

static void usage(FILE *f) {
  fprintf(f,
          "usage: loom bench kernels [--threads N] [--reps K]\n\n"
          "Milliseconds per call (best of K runs, default 20) of loom's own\n"
          "vector code at the reference GPT's shapes (kjv-gpt: 4096 rows,\n"
          "d_model 128, MLP 512, 4 heads of 128 tokens, 256 classes; AdamW\n"
          "over 1M parameters), for the instruction-set copy this process\n"
          "runs: LOOM_ISA=base|avx2|avx512 chooses it (bench/kernels.sh\n"
          "runs each copy this CPU has, alternating).\n\n"
          "  --threads N   threads (default: LOOM_THREADS or all cores; at "
          "most %d)\n"
          "  --reps K      runs per kernel, the best kept (default 20)\n",
          LOOM_THREADS_MAX);
}

static double best_ms(int reps, void (*fn)(buffers *), buffers *m) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    const double t0 = loom_time_now();
    fn(m);
    const double t = loom_time_now() - t0;
    best = t < best ? t : best;
  }
  return best * 1e3;
}

/* The kernels timed: each the call the GPT's step makes (per layer). */
static void k_gelu_fwd(buffers *m) {
  loom_gelu_forward(m->y, m->x, (int64_t)KN * KF);
}
static void k_gelu_fwd_bf16(buffers *m) {
  loom_gelu_forward_half(LOOM_BF16, m->h, m->x, (int64_t)KN * KF);
}
static void k_gelu_bwd(buffers *m) {
  loom_gelu_backward_to(m->z, m->x, m->d, (int64_t)KN * KF);
}
static void k_ln_fwd(buffers *m) {
  loom_layernorm_forward(m->y, m->mean, m->rstd, m->x, m->w, m->b, KN, KC);
}
static void k_ln_bwd(buffers *m) {
  loom_layernorm_backward(m->z, m->dw, m->db, m->d, m->x, m->w, m->mean,
                          m->rstd, KN, KC);
}
static void k_attn_fwd(buffers *m) {
  (void)loom_attention_forward(m->y, m->att, m->x, KB, KT, KC, KNH);
}
static void k_attn_bwd(buffers *m) {
  (void)loom_attention_backward(m->z, m->scr, m->d, m->x, m->att, KB, KT, KC,
                                KNH);
}
static void k_xent(buffers *m) {
  loom_crossentropy_forward(m->mean, m->y, m->x, m->tgt, KN, KV);
}
static void k_add(buffers *m) {
  loom_add_forward(m->y, m->x, m->d, (int64_t)KN * KC);
}
static void k_to_bf16(buffers *m) {
  loom_cvt_f32_to_bf16(m->h, m->x, (int64_t)KN * KF);
}
static void k_from_bf16(buffers *m) {
  loom_cvt_bf16_to_f32(m->y, m->h, (int64_t)KN * KF);
}

static loom_optim *g_adamw;
static void k_adamw(buffers *m) {
  (void)loom_optim_step(g_adamw, m->big, m->big + KPARAMS, 1e-3f);
}

static const struct {
  const char *name, *shape;
  void (*fn)(buffers *);
  int64_t elems; /* for ns per element */
} kernels[] = {
    {"gelu forward", "4096x512", k_gelu_fwd, (int64_t)KN *KF},
    {"gelu forward bf16", "4096x512", k_gelu_fwd_bf16, (int64_t)KN *KF},
    {"gelu backward", "4096x512", k_gelu_bwd, (int64_t)KN *KF},
    {"layernorm forward", "4096x128", k_ln_fwd, (int64_t)KN *KC},
    {"layernorm backward", "4096x128", k_ln_bwd, (int64_t)KN *KC},
    {"attention forward", "32x4x128x128", k_attn_fwd, (int64_t)KB *KNH *KT *KT},
    {"attention backward", "32x4x128x128", k_attn_bwd,
     (int64_t)KB *KNH *KT *KT},
    {"cross-entropy fwd", "4096x256", k_xent, (int64_t)KN *KV},
    {"residual add", "4096x128", k_add, (int64_t)KN *KC},
    {"f32 -> bf16", "4096x512", k_to_bf16, (int64_t)KN *KF},
    {"bf16 -> f32", "4096x512", k_from_bf16, (int64_t)KN *KF},
    {"adamw step", "1M", k_adamw, KPARAMS},
};
#define NKERNELS (int)(sizeof kernels / sizeof kernels[0])

static int parse_count(const char *o, const char *v, int hi, int *out) {
  int n;
  if (!loom_parse_int(v, &n) || n < 1 || n > hi) {
    fprintf(stderr,
            "loom bench kernels: %s wants a count in [1, %d], not '%s'\n", o,
            hi, v);
    return -1;
  }
  *out = n;
  return 0;
}

int loom_bench_kernels(int argc, char **argv) {
  int threads = 0, reps = 20;
  for (int i = 1; i < argc; i += 2) {
    const char *o = argv[i];
    if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
      usage(stdout);
      return LOOM_EXIT_OK;
    }
    if (strcmp(o, "--threads") != 0 && strcmp(o, "--reps") != 0) {
      fprintf(stderr, "loom bench kernels: unknown option %s (try --help)\n",
              o);
      return LOOM_EXIT_USAGE;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "loom bench kernels: %s needs a value\n", o);
      return LOOM_EXIT_USAGE;
    }
    bool is_reps = strcmp(o, "--reps") == 0;
    if (parse_count(o, argv[i + 1], is_reps ? 1 << 20 : LOOM_THREADS_MAX,
                    is_reps ? &reps : &threads) != 0)
      return LOOM_EXIT_USAGE;
  }
  if (loom_cpu_check() != LOOM_OK) {
    fprintf(stderr, "loom bench kernels: %s\n", loom_last_error());
    return LOOM_EXIT_USAGE;
  }
  if (threads > 0)
    loom_set_threads(threads);

  const int64_t big = (int64_t)KN * KF; /* the largest activation */
  const int64_t att = (int64_t)KB * KNH * KT * KT;
  buffers m = {0};
  m.x = loom_malloc((size_t)big * sizeof(float));
  m.y = loom_malloc((size_t)(big > att ? big : att) * sizeof(float));
  m.d = loom_malloc((size_t)big * sizeof(float));
  m.z = loom_malloc((size_t)big * sizeof(float));
  m.att = loom_malloc((size_t)att * sizeof(float));
  m.scr = loom_malloc((size_t)att * sizeof(float));
  m.big = loom_malloc((size_t)2 * KPARAMS * sizeof(float));
  m.h = loom_malloc((size_t)big * sizeof(uint16_t));
  m.w = loom_malloc(KC * sizeof(float));
  m.b = loom_malloc(KC * sizeof(float));
  m.dw = loom_calloc(KC, sizeof(float));
  m.db = loom_calloc(KC, sizeof(float));
  m.mean = loom_malloc(KN * sizeof(float));
  m.rstd = loom_malloc(KN * sizeof(float));
  m.tgt = loom_malloc(KN * sizeof(int32_t));
  loom_optim_opts oo = loom_optim_opts_default();
  oo.kind = LOOM_OPTIM_ADAMW;
  oo.weight_decay = 0.1;
  int rc = LOOM_EXIT_FAIL;
  if (!m.x || !m.y || !m.d || !m.z || !m.att || !m.scr || !m.big || !m.h ||
      !m.w || !m.b || !m.dw || !m.db || !m.mean || !m.rstd || !m.tgt ||
      loom_optim_new(&g_adamw, &oo, NULL, 0, KPARAMS) != LOOM_OK) {
    fprintf(stderr, "loom bench kernels: %s\n", loom_last_error());
    goto out;
  }
  /* inputs of the size activations have: x is also the qkv of attention
   * (4096 x 384 of it) and the logits of the loss */
  loom_rng r = loom_rng_init(1, 1);
  loom_rng_fill_uniform(&r, m.x, (size_t)big, -3.0f, 3.0f);
  loom_rng_fill_uniform(&r, m.d, (size_t)big, -1.0f, 1.0f);
  loom_rng_fill_uniform(&r, m.big, (size_t)2 * KPARAMS, -0.1f, 0.1f);
  for (int c = 0; c < KC; c++) {
    m.w[c] = 1.0f + 0.01f * (float)c;
    m.b[c] = 0.01f * (float)c;
  }
  for (int n = 0; n < KN; n++)
    m.tgt[n] = (int32_t)(loom_rng_u32(&r) % KV);
  k_attn_fwd(&m); /* att holds probabilities before the backward runs */

  const loom_cpu_features *f = loom_cpu_get_features();
  printf("# loom bench kernels: copy %s, %d thread%s, ms per call, best of "
         "%d\n",
         loom_isa_name(loom_cpu_isa()), loom_threads(),
         loom_threads() == 1 ? "" : "s", reps);
  printf("# cpu: avx2 %d, avx512f %d, avx512bw %d, avx512vl %d, avx512dq %d, "
         "avx512_bf16 %d, avx512_fp16 %d\n",
         f->avx2, f->avx512f, f->avx512bw, f->avx512vl, f->avx512dq,
         f->avx512_bf16, f->avx512_fp16);
  printf("%-20s %-13s %9s %8s\n", "kernel", "shape", "ms", "ns/elem");
  for (int k = 0; k < NKERNELS; k++) {
    kernels[k].fn(&m); /* first touch, caches */
    const double ms = best_ms(reps, kernels[k].fn, &m);
    printf("%-20s %-13s %9.3f %8.3f\n", kernels[k].name, kernels[k].shape, ms,
           ms * 1e6 / (double)kernels[k].elems);
    fflush(stdout);
  }
  rc = LOOM_EXIT_OK;
out:
  loom_optim_free(g_adamw);
  g_adamw = NULL;
  loom_free(m.x);
  loom_free(m.y);
  loom_free(m.d);
  loom_free(m.z);
  loom_free(m.att);
  loom_free(m.scr);
  loom_free(m.big);
  loom_free(m.h);
  loom_free(m.w);
  loom_free(m.b);
  loom_free(m.dw);
  loom_free(m.db);
  loom_free(m.mean);
  loom_free(m.rstd);
  loom_free(m.tgt);
  return rc;
}
