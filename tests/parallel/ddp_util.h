/* Helpers of the ddp tests: small variants of the three reference models,
 * synthetic samples keyed by their global index (the same at any world
 * size), one training micro-step, and comparisons of parameter buffers. */
#ifndef LOOM_TESTS_DDP_UTIL_H
#define LOOM_TESTS_DDP_UTIL_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/nn.h"
#include "loom/optim.h"

typedef enum { W_MLP, W_CNN, W_GPT, W_COUNT } w_kind;
static const char *const w_names[W_COUNT] = {"mlp", "cnn", "gpt"};

/* Sample shapes: MLP (16) images, CNN (1,12,12), GPT T = 16 of vocab 32. */
#define W_MLP_IN 16
#define W_IMG 12
#define W_T 16
#define W_VOCAB 32
#define W_CLASSES 10

__attribute__((unused)) static loom_status w_model(w_kind k, uint64_t seed,
                                                   loom_model **out) {
  loom_model_opts mo = loom_model_opts_default();
  mo.seed = seed;
  switch (k) {
  case W_MLP: {
    loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
    o.in = W_MLP_IN;
    o.hidden = 32;
    o.n_hidden = 2;
    o.classes = W_CLASSES;
    return loom_fashion_mlp_new(out, &o, &mo);
  }
  case W_CNN: {
    loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
    o.in_c = 1;
    o.in_h = o.in_w = W_IMG;
    o.c1 = 4;
    o.c2 = 8;
    o.kernel = 3;
    o.pool = 2;
    o.classes = W_CLASSES;
    return loom_fashion_cnn_new(out, &o, &mo);
  }
  default: {
    loom_gpt_opts o = loom_gpt_opts_default();
    o.vocab = W_VOCAB;
    o.context = W_T;
    o.n_layer = 2;
    o.d_model = 32;
    o.n_head = 2;
    o.mlp_ratio = 4;
    mo.init = LOOM_INIT_GPT2;
    mo.init_std = 0.02f;
    mo.init_n_layer = 2;
    return loom_gpt_new(out, &o, &mo);
  }
  }
}

__attribute__((unused)) static loom_status
w_optim(w_kind k, const loom_model *m, loom_optim **out, float *lr) {
  loom_optim_opts oo = loom_optim_opts_default();
  if (k == W_GPT) {
    oo.kind = LOOM_OPTIM_ADAMW;
    oo.weight_decay = 0.01;
    *lr = 3e-4f; /* kjv-gpt's rate */
  } else {
    oo.kind = LOOM_OPTIM_SGD;
    oo.momentum = 0.9;
    *lr = 0.05f;
  }
  int nv = loom_model_num_views(m);
  loom_param views[64];
  if (nv > 64)
    return LOOM_ERR_INTERNAL;
  for (int i = 0; i < nv; i++)
    views[i] = *loom_model_view(m, i);
  return loom_optim_new(out, &oo, views, nv, loom_model_num_params(m));
}

/* A batch of rows [first, first + n) of the global sample sequence. */
typedef struct w_batch {
  loom_tensor x;
  int32_t *y; /* (n) classes or (n, T) next tokens */
  int64_t n;
  float xf[4096 * 4];
  int32_t xi[4096];
  int32_t yy[4096];
} w_batch;

__attribute__((unused)) static void
w_fill(w_kind k, uint64_t seed, int64_t first, int64_t n, w_batch *b) {
  b->n = n;
  b->y = b->yy;
  for (int64_t r = 0; r < n; r++) {
    loom_rng g = loom_rng_init(seed, (uint64_t)(first + r));
    if (k == W_GPT) {
      /* A learnable pattern: tokens mostly follow t+1 mod vocab. */
      int32_t t = (int32_t)loom_rng_below(&g, W_VOCAB);
      for (int i = 0; i <= W_T; i++) {
        int32_t nx = loom_rng_uniform(&g) < 0.8f
                         ? (t + 1) % W_VOCAB
                         : (int32_t)loom_rng_below(&g, W_VOCAB);
        if (i < W_T) {
          b->xi[r * W_T + i] = t;
          b->yy[r * W_T + i] = nx;
        }
        t = nx;
      }
    } else {
      int64_t f = k == W_MLP ? W_MLP_IN : W_IMG * W_IMG;
      int32_t c = (int32_t)loom_rng_below(&g, W_CLASSES);
      for (int64_t i = 0; i < f; i++)
        b->xf[r * f + i] =
            loom_rng_normal(&g) * 0.5f + ((i % W_CLASSES) == c ? 1.0f : 0.0f);
      b->yy[r] = c;
    }
  }
  if (k == W_GPT) {
    int64_t d[2] = {n, W_T};
    b->x = loom_tensor_view(b->xi, LOOM_I32, 2, d);
  } else if (k == W_MLP) {
    int64_t d[2] = {n, W_MLP_IN};
    b->x = loom_tensor_view(b->xf, LOOM_F32, 2, d);
  } else {
    int64_t d[4] = {n, 1, W_IMG, W_IMG};
    b->x = loom_tensor_view(b->xf, LOOM_F32, 4, d);
  }
}

/* Forward, loss, backward (adding into the gradients) with the loss scaled
 * by `scale`; *loss_sum and *count (may be NULL) get the loss statistics. */
__attribute__((unused)) static loom_status
w_micro(loom_model *m, loom_xent *x, const w_batch *b, float scale,
        double *loss_sum, int64_t *count) {
  loom_tensor logits, dl;
  loom_xent_stats st;
  LOOM_TRY(loom_model_forward(m, &b->x, &logits));
  LOOM_TRY(loom_xent_forward(x, &logits, b->y, &st));
  LOOM_TRY(loom_model_output_grad(m, &dl));
  LOOM_TRY(loom_xent_backward(x, &dl, scale));
  LOOM_TRY(loom_model_backward(m, NULL, NULL));
  if (loss_sum)
    *loss_sum = st.loss_sum;
  if (count)
    *count = st.count;
  return LOOM_OK;
}

/* max |a - b| / max |b|: a relative distance between two parameter sets
 * that individual near-zero elements do not dominate. */
__attribute__((unused)) static double w_reldiff(const float *a, const float *b,
                                                int64_t n) {
  double md = 0, mb = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (d > md || isnan(d))
      md = isnan(d) ? INFINITY : d;
    if (fabs((double)b[i]) > mb)
      mb = fabs((double)b[i]);
  }
  return mb > 0 ? md / mb : md;
}

#endif /* LOOM_TESTS_DDP_UTIL_H */
