/* Every backward kernel against central finite differences of its own
 * forward kernel: loss = sum(out * g) with fixed random g, summed in
 * double; sampled entries of each input and parameter. */
#include <stdlib.h>

#include "kt.h"

#define H_STEP 1e-3f
#define ATOL 2e-3
#define RTOL 1e-2
#define SAMPLES 48

/* ------------------------------------------------------------ unary ops */

typedef struct unary_ctx {
  void (*fwd)(float *out, const float *inp, int64_t n);
  float *x, *out, *g;
  int64_t n;
} unary_ctx;

static double unary_loss(void *p) {
  unary_ctx *c = p;
  c->fwd(c->out, c->x, c->n);
  return kt_dot_d(c->out, c->g, c->n);
}

static void check_unary(void (*fwd)(float *, const float *, int64_t),
                        void (*bwd)(float *, const float *, const float *,
                                    int64_t),
                        float lo, float hi, int away_from_zero) {
  const int64_t n = 301;
  unary_ctx c = {fwd, kt_rand(n, 1, lo, hi), kt_zeros(n), kt_rand(n, 2, -1, 1),
                 n};
  float *grad = kt_zeros(n);
  TT_REQUIRE(c.x && c.out && c.g && grad);
  if (away_from_zero) /* a kink at 0: keep the steps off it */
    for (int64_t i = 0; i < n; i++)
      c.x[i] += c.x[i] < 0 ? -0.05f : 0.05f;
  bwd(grad, c.x, c.g, n);
  KT_CHECK_FD(unary_loss, &c, c.x, n, grad, H_STEP, SAMPLES, ATOL, RTOL);
  loom_free(c.x);
  loom_free(c.out);
  loom_free(c.g);
  loom_free(grad);
}

TT_TEST(grad_relu) {
  check_unary(loom_relu_forward, loom_relu_backward, -2, 2, 1);
}

TT_TEST(grad_gelu) {
  check_unary(loom_gelu_forward, loom_gelu_backward, -4, 4, 0);
}

/* ---------------------------------------------------------------- rows */

typedef struct rows_ctx {
  int kind; /* 0 softmax, 1 log-softmax, 2 cross-entropy */
  float *x, *out, *g, *probs;
  int32_t *t;
  int N, C;
} rows_ctx;

static double rows_loss(void *p) {
  rows_ctx *c = p;
  if (c->kind == 0)
    loom_softmax_forward(c->out, c->x, c->N, c->C);
  else if (c->kind == 1)
    loom_log_softmax_forward(c->out, c->x, c->N, c->C);
  else {
    loom_crossentropy_forward(c->out, c->probs, c->x, c->t, c->N, c->C);
    return kt_dot_d(c->out, c->g, c->N);
  }
  return kt_dot_d(c->out, c->g, (size_t)c->N * c->C);
}

TT_TEST(grad_softmax_family) {
  const int N = 6, C = 37;
  const size_t nc = (size_t)N * C;
  int32_t t[6] = {0, 36, -1, 5, 17, 2};
  for (int kind = 0; kind < 3; kind++) {
    rows_ctx c = {kind,
                  kt_rand(nc, 10 + kind, -3, 3),
                  kt_zeros(nc),
                  kt_rand(nc, 20, -1, 1),
                  kt_zeros(nc),
                  t,
                  N,
                  C};
    float *grad = kt_zeros(nc);
    TT_REQUIRE(c.x && c.out && c.g && c.probs && grad);
    rows_loss(&c);
    if (kind == 0)
      loom_softmax_backward(grad, c.out, c.g, N, C);
    else if (kind == 1)
      loom_log_softmax_backward(grad, c.out, c.g, N, C);
    else
      loom_crossentropy_backward(grad, c.probs, t, c.g, N, C);
    KT_CHECK_FD(rows_loss, &c, c.x, (int64_t)nc, grad, H_STEP, SAMPLES, ATOL,
                RTOL);
    if (kind == 2) /* the ignored row has no gradient */
      for (int j = 0; j < C; j++)
        TT_CHECK(grad[2 * C + j] == 0.0f);
    loom_free(c.x);
    loom_free(c.out);
    loom_free(c.g);
    loom_free(c.probs);
    loom_free(grad);
  }
}

/* ------------------------------------------------------------ layernorm */

typedef struct ln_ctx {
  float *x, *w, *b, *out, *mean, *rstd, *g;
  int N, C;
} ln_ctx;

static double ln_loss(void *p) {
  ln_ctx *c = p;
  loom_layernorm_forward(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N,
                         c->C);
  return kt_dot_d(c->out, c->g, (size_t)c->N * c->C);
}

TT_TEST(grad_layernorm) {
  const int N = 5, C = 19;
  const size_t nc = (size_t)N * C;
  ln_ctx c = {kt_rand(nc, 30, -2, 2),
              kt_rand(C, 31, 0.5f, 1.5f),
              kt_rand(C, 32, -1, 1),
              kt_zeros(nc),
              kt_zeros(N),
              kt_zeros(N),
              kt_rand(nc, 33, -1, 1),
              N,
              C};
  float *gx = kt_zeros(nc), *gw = kt_zeros(C), *gb = kt_zeros(C);
  TT_REQUIRE(c.x && c.w && c.b && c.out && c.mean && c.rstd && c.g && gx &&
             gw && gb);
  ln_loss(&c);
  loom_layernorm_backward(gx, gw, gb, c.g, c.x, c.w, c.mean, c.rstd, N, C);
  KT_CHECK_FD(ln_loss, &c, c.x, (int64_t)nc, gx, H_STEP, SAMPLES, ATOL, RTOL);
  KT_CHECK_FD(ln_loss, &c, c.w, C, gw, H_STEP, SAMPLES, ATOL, RTOL);
  KT_CHECK_FD(ln_loss, &c, c.b, C, gb, H_STEP, SAMPLES, ATOL, RTOL);
  float *bufs[] = {c.x, c.w, c.b, c.out, c.mean, c.rstd, c.g, gx, gw, gb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
}

/* --------------------------------------------------------------- linear */

typedef struct lin_ctx {
  float *x, *w, *b, *out, *g;
  int N, C, OC;
} lin_ctx;

static double lin_loss(void *p) {
  lin_ctx *c = p;
  TT_CHECK_OK(loom_linear_forward(c->out, c->x, c->w, c->b, c->N, c->C, c->OC));
  return kt_dot_d(c->out, c->g, (size_t)c->N * c->OC);
}

TT_TEST(grad_linear) {
  const int N = 7, C = 13, OC = 9;
  lin_ctx c = {kt_rand((size_t)N * C, 40, -1, 1),
               kt_rand((size_t)OC * C, 41, -1, 1),
               kt_rand(OC, 42, -1, 1),
               kt_zeros((size_t)N * OC),
               kt_rand((size_t)N * OC, 43, -1, 1),
               N,
               C,
               OC};
  float *gx = kt_zeros((size_t)N * C), *gw = kt_zeros((size_t)OC * C);
  float *gb = kt_zeros(OC);
  TT_REQUIRE(c.x && c.w && c.b && c.out && c.g && gx && gw && gb);
  TT_CHECK_OK(loom_linear_backward(gx, gw, gb, c.g, c.x, c.w, N, C, OC));
  KT_CHECK_FD(lin_loss, &c, c.x, (int64_t)N * C, gx, H_STEP, SAMPLES, ATOL,
              RTOL);
  KT_CHECK_FD(lin_loss, &c, c.w, (int64_t)OC * C, gw, H_STEP, SAMPLES, ATOL,
              RTOL);
  KT_CHECK_FD(lin_loss, &c, c.b, OC, gb, H_STEP, SAMPLES, ATOL, RTOL);
  float *bufs[] = {c.x, c.w, c.b, c.out, c.g, gx, gw, gb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
}

/* ------------------------------------------------------------ attention */

typedef struct att_ctx {
  float *qkv, *out, *att, *g;
  int B, T, C, NH;
} att_ctx;

static double att_loss(void *p) {
  att_ctx *c = p;
  TT_CHECK_OK(
      loom_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH));
  return kt_dot_d(c->out, c->g, (size_t)c->B * c->T * c->C);
}

static void check_attention(int B, int T, int C, int NH) {
  const size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * NH * T * T;
  att_ctx c = {kt_rand(nq, 50, -1, 1),
               kt_zeros((size_t)B * T * C),
               kt_zeros(na),
               kt_rand((size_t)B * T * C, 51, -1, 1),
               B,
               T,
               C,
               NH};
  float *grad = kt_zeros(nq), *scratch = kt_zeros(na);
  TT_REQUIRE(c.qkv && c.out && c.att && c.g && grad && scratch);
  att_loss(&c);
  TT_CHECK_OK(
      loom_attention_backward(grad, scratch, c.g, c.qkv, c.att, B, T, C, NH));
  KT_CHECK_FD(att_loss, &c, c.qkv, (int64_t)nq, grad, H_STEP, 96, ATOL, RTOL);
  float *bufs[] = {c.qkv, c.out, c.att, c.g, grad, scratch};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
}

TT_TEST(grad_attention) {
  check_attention(2, 70, 12, 3); /* T crosses a query block */
  check_attention(2, 21, 32, 2); /* the GPT head size */
}

/* ---------------------------------------------------------- convolution */

typedef struct conv_ctx {
  float *x, *w, *b, *out, *col, *g;
  loom_conv2d_dims d;
  size_t ny;
} conv_ctx;

static double conv_loss(void *p) {
  conv_ctx *c = p;
  TT_CHECK_OK(loom_conv2d_forward(c->out, c->col, c->x, c->w, c->b, &c->d));
  return kt_dot_d(c->out, c->g, c->ny);
}

TT_TEST(grad_conv2d) {
  const loom_conv2d_dims dims[] = {{3, 2, 7, 6, 4, 3, 3, 2, 1},
                                   {2, 3, 5, 5, 2, 2, 3, 1, 0},
                                   {3, 6, 5, 6, 3, 3, 3, 1, 1}}; /* oneDNN */
  for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
    const loom_conv2d_dims d = dims[k];
    const size_t nx = (size_t)d.N * d.C * d.H * d.W;
    const size_t nw = (size_t)d.OC * d.C * d.KH * d.KW;
    const size_t ny =
        (size_t)d.N * d.OC * loom_conv2d_out_h(&d) * loom_conv2d_out_w(&d);
    conv_ctx c = {kt_rand(nx, 60, -1, 1),
                  kt_rand(nw, 61, -1, 1),
                  kt_rand(d.OC, 62, -1, 1),
                  kt_zeros(ny),
                  kt_zeros((size_t)loom_conv2d_col_floats(&d)),
                  kt_rand(ny, 63, -1, 1),
                  d,
                  ny};
    float *gx = kt_zeros(nx), *gw = kt_zeros(nw), *gb = kt_zeros(d.OC);
    TT_REQUIRE(c.x && c.w && c.b && c.out && c.col && c.g && gx && gw && gb);
    TT_CHECK_OK(loom_conv2d_backward(gx, gw, gb, c.col, c.g, c.x, c.w, &d));
    KT_CHECK_FD(conv_loss, &c, c.x, (int64_t)nx, gx, H_STEP, SAMPLES, ATOL,
                RTOL);
    KT_CHECK_FD(conv_loss, &c, c.w, (int64_t)nw, gw, H_STEP, SAMPLES, ATOL,
                RTOL);
    KT_CHECK_FD(conv_loss, &c, c.b, d.OC, gb, H_STEP, SAMPLES, ATOL, RTOL);
    float *bufs[] = {c.x, c.w, c.b, c.out, c.col, c.g, gx, gw, gb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      loom_free(bufs[i]);
  }
}

/* -------------------------------------------------------------- maxpool */

typedef struct pool_ctx {
  float *x, *out, *g;
  int32_t *am;
  int N, C, H, W, K, S;
  size_t ny;
} pool_ctx;

static double pool_loss(void *p) {
  pool_ctx *c = p;
  loom_maxpool2d_forward(c->out, c->am, c->x, c->N, c->C, c->H, c->W, c->K,
                         c->S);
  return kt_dot_d(c->out, c->g, c->ny);
}

TT_TEST(grad_maxpool) {
  const int N = 2, C = 3, H = 7, W = 6, K = 3, S = 2; /* overlapping windows */
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
  pool_ctx c = {kt_zeros(nx),
                kt_zeros(ny),
                kt_rand(ny, 70, -1, 1),
                loom_malloc(ny * sizeof(int32_t)),
                N,
                C,
                H,
                W,
                K,
                S,
                ny};
  float *grad = kt_zeros(nx);
  TT_REQUIRE(c.x && c.out && c.g && c.am && grad);
  /* distinct values 0.01 apart: a step of 1e-3 never changes a maximum */
  loom_rng r = loom_rng_init(71, 0);
  for (size_t i = 0; i < nx; i++)
    c.x[i] = 0.01f * (float)i;
  for (size_t i = nx - 1; i > 0; i--) {
    size_t j = (size_t)loom_rng_below(&r, i + 1);
    float t = c.x[i];
    c.x[i] = c.x[j];
    c.x[j] = t;
  }
  pool_loss(&c);
  loom_maxpool2d_backward(grad, c.g, c.am, N, C, H, W, K, S);
  KT_CHECK_FD(pool_loss, &c, c.x, (int64_t)nx, grad, H_STEP, 256, ATOL, RTOL);
  loom_free(c.x);
  loom_free(c.out);
  loom_free(c.g);
  loom_free(c.am);
  loom_free(grad);
}

/* ---------------------------------------------------- embedding, dropout */

typedef struct emb_ctx {
  float *table, *out, *g, *x;
  int32_t *ids;
  uint8_t *mask;
  int N, C;
} emb_ctx;

static double emb_loss(void *p) {
  emb_ctx *c = p;
  loom_embedding_forward(c->out, c->ids, c->table, c->N, c->C);
  return kt_dot_d(c->out, c->g, (size_t)c->N * c->C);
}

static double drop_loss(void *p) {
  emb_ctx *c = p;
  loom_rng r = loom_rng_init(5, 5); /* the same mask every time */
  loom_dropout_forward(c->out, c->mask, c->x, 0.25f, &r, (int64_t)c->N * c->C);
  return kt_dot_d(c->out, c->g, (size_t)c->N * c->C);
}

TT_TEST(grad_embedding_dropout) {
  const int V = 5, N = 9, C = 6;
  int32_t ids[9] = {0, 3, 3, 1, 4, 0, 3, 2, 2};
  emb_ctx c = {kt_rand((size_t)V * C, 80, -1, 1),
               kt_zeros((size_t)N * C),
               kt_rand((size_t)N * C, 81, -1, 1),
               kt_rand((size_t)N * C, 82, -1, 1),
               ids,
               loom_malloc((size_t)N * C),
               N,
               C};
  float *gt = kt_zeros((size_t)V * C), *gx = kt_zeros((size_t)N * C);
  TT_REQUIRE(c.table && c.out && c.g && c.x && c.mask && gt && gx);
  loom_embedding_backward(gt, c.g, ids, N, C);
  KT_CHECK_FD(emb_loss, &c, c.table, (int64_t)V * C, gt, H_STEP, 64, ATOL,
              RTOL);
  drop_loss(&c);
  loom_dropout_backward(gx, c.mask, c.g, 0.25f, (int64_t)N * C);
  KT_CHECK_FD(drop_loss, &c, c.x, (int64_t)N * C, gx, H_STEP, 64, ATOL, RTOL);
  float *bufs[] = {c.table, c.out, c.g, c.x, gt, gx};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
  loom_free(c.mask);
}

int main(void) {
  TT_RUN(grad_relu);
  TT_RUN(grad_gelu);
  TT_RUN(grad_softmax_family);
  TT_RUN(grad_layernorm);
  TT_RUN(grad_linear);
  TT_RUN(grad_attention);
  TT_RUN(grad_conv2d);
  TT_RUN(grad_maxpool);
  TT_RUN(grad_embedding_dropout);
  return tt_finish();
}
