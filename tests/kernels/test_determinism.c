/* Bitwise invariance to the thread count: every kernel, at sizes that do
 * fork threads, run at 1, 2 and 3 threads with every GEMM backend, must
 * give identical bits (the reductions — layernorm, linear and conv
 * parameter gradients, embedding scatter — included). */
#include <stdlib.h>

#include "kt.h"

enum { NE = 100000 };        /* elementwise */
enum { SN = 512, SC = 256 }; /* softmax, cross-entropy */
/* layernorm: rows of 96 (16-column strips), of 310 (row segments; enough
 * elements for 3 threads) */
enum { LN = 1024, LC = 96, LN2 = 320, LC2 = 310 };
enum { LX = LN2 * LC2 > LN *LC ? LN2 *LC2 : LN *LC }; /* the shared x */
enum { FN = 512, FC = 784, FOC = 128 };      /* linear (an MLP layer) */
enum { AB = 4, AT = 128, AC = 64, ANH = 4 }; /* attention */
enum { PN = 16, PC = 8, PH = 24, PK = 2 };   /* maxpool */
enum { EV = 50, EN = 4096, EC = 40 };        /* embedding */
static const loom_conv2d_dims CD = {40, 3, 12, 12, 8, 3, 3, 1, 1};
/* C >= 4: oneDNN's primitives under the dnnl backend */
static const loom_conv2d_dims CD2 = {37, 8, 9, 9, 6, 3, 3, 1, 1};

typedef struct inputs {
  float *x, *d, *sx, *sd, *lx, *lw, *lb, *fx, *fw, *fb, *fd, *qkv, *ad;
  float *cx, *cw, *cb, *px, *et, *ed;
  int32_t *tgt, *ids;
} inputs;

/* Every result of one run, flattened into one buffer. */
typedef struct outputs {
  float *buf;
  size_t n, used;
} outputs;

static float *take(outputs *o, size_t n) {
  float *p = o->buf + o->used;
  o->used += n;
  TT_CHECK(o->used <= o->n);
  return p;
}

static size_t conv_out(const loom_conv2d_dims *d) {
  return (size_t)d->N * d->OC * loom_conv2d_out_h(d) * loom_conv2d_out_w(d);
}

static size_t conv_floats(const loom_conv2d_dims *d) {
  return (size_t)loom_conv2d_col_floats(d) + conv_out(d) +
         (size_t)d->N * d->C * d->H * d->W +
         (size_t)d->OC * d->C * d->KH * d->KW + d->OC;
}

/* Forward and backward of one convolution; the input gradient of the
 * forward output scaled by 0.5 stands in for dout. */
static void run_conv(const loom_conv2d_dims *d, const float *x, const float *w,
                     const float *b, outputs *o);

static size_t outputs_size(void) {
  const size_t pooled = (size_t)PN * PC * (PH / PK) * (PH / PK);
  return 3 * (size_t)NE + 3 * (size_t)SN * SC + SN + 2 * (size_t)LN * LC +
         2 * LN + 2 * LC + 2 * (size_t)LN2 * LC2 + 2 * LN2 + 2 * LC2 +
         (size_t)FN * FOC + (size_t)FN * FC + (size_t)FOC * FC + FOC +
         (size_t)AB * AT * AC + 2 * (size_t)AB * ANH * AT * AT +
         (size_t)AB * AT * 3 * AC + conv_floats(&CD) + conv_floats(&CD2) +
         2 * pooled + (size_t)PN * PC * PH * PH + (size_t)EN * EC +
         (size_t)EV * EC;
}

static void run_all(const inputs *in, outputs *o) {
  o->used = 0;
  memset(o->buf, 0, o->n * sizeof(float));
  loom_gelu_forward(take(o, NE), in->x, NE);
  loom_gelu_backward(take(o, NE), in->x, in->d, NE);
  loom_relu_backward(take(o, NE), in->x, in->d, NE);
  float *sm = take(o, (size_t)SN * SC);
  loom_softmax_forward(sm, in->sx, SN, SC);
  loom_softmax_backward(take(o, (size_t)SN * SC), sm, in->sd, SN, SC);
  float *probs = take(o, (size_t)SN * SC), *loss = take(o, SN);
  loom_crossentropy_forward(loss, probs, in->sx, in->tgt, SN, SC);
  loom_crossentropy_backward(sm, probs, in->tgt, in->sd, SN, SC);
  float *ly = take(o, (size_t)LN * LC), *lm = take(o, LN), *lr = take(o, LN);
  loom_layernorm_forward(ly, lm, lr, in->lx, in->lw, in->lb, LN, LC);
  loom_layernorm_backward(take(o, (size_t)LN * LC), take(o, LC), take(o, LC),
                          ly, in->lx, in->lw, lm, lr, LN, LC);
  /* rows over 256 wide: the parameter gradients' other walk (the threads'
   * column blocks 310, 160 + 150, 112 + 112 + 86 wide) */
  float *ly2 = take(o, (size_t)LN2 * LC2), *lm2 = take(o, LN2),
        *lr2 = take(o, LN2);
  loom_layernorm_forward(ly2, lm2, lr2, in->lx, in->lw, in->lb, LN2, LC2);
  loom_layernorm_backward(take(o, (size_t)LN2 * LC2), take(o, LC2),
                          take(o, LC2), ly2, in->lx, in->lw, lm2, lr2, LN2,
                          LC2);
  TT_CHECK_OK(loom_linear_forward(take(o, (size_t)FN * FOC), in->fx, in->fw,
                                  in->fb, FN, FC, FOC));
  TT_CHECK_OK(loom_linear_backward(take(o, (size_t)FN * FC),
                                   take(o, (size_t)FOC * FC), take(o, FOC),
                                   in->fd, in->fx, in->fw, FN, FC, FOC));
  float *att = take(o, (size_t)AB * ANH * AT * AT);
  TT_CHECK_OK(loom_attention_forward(take(o, (size_t)AB * AT * AC), att,
                                     in->qkv, AB, AT, AC, ANH));
  TT_CHECK_OK(loom_attention_backward(take(o, (size_t)AB * AT * 3 * AC),
                                      take(o, (size_t)AB * ANH * AT * AT),
                                      in->ad, in->qkv, att, AB, AT, AC, ANH));
  run_conv(&CD, in->cx, in->cw, in->cb, o);
  run_conv(&CD2, in->cx, in->cw, in->cb, o);
  const size_t pooled = (size_t)PN * PC * (PH / PK) * (PH / PK);
  float *py = take(o, pooled);
  int32_t *am = (int32_t *)take(o, pooled);
  loom_maxpool2d_forward(py, am, in->px, PN, PC, PH, PH, PK, PK);
  loom_maxpool2d_backward(take(o, (size_t)PN * PC * PH * PH), py, am, PN, PC,
                          PH, PH, PK, PK);
  float *ey = take(o, (size_t)EN * EC);
  loom_embedding_forward(ey, in->ids, in->et, EN, EC);
  loom_embedding_backward(take(o, (size_t)EV * EC), ey, in->ids, EN, EC);
}

static void run_conv(const loom_conv2d_dims *d, const float *x, const float *w,
                     const float *b, outputs *o) {
  float *col = take(o, (size_t)loom_conv2d_col_floats(d));
  float *y = take(o, conv_out(d));
  TT_CHECK_OK(loom_conv2d_forward(y, col, x, w, b, d));
  loom_scale(y, 0.5f, (int64_t)conv_out(d));
  TT_CHECK_OK(
      loom_conv2d_backward(take(o, (size_t)d->N * d->C * d->H * d->W),
                           take(o, (size_t)d->OC * d->C * d->KH * d->KW),
                           take(o, d->OC), col, y, x, w, d));
}

TT_TEST(every_kernel_thread_count_invariant) {
  inputs in = {kt_rand(NE, 1, -3, 3),
               kt_rand(NE, 2, -1, 1),
               kt_rand((size_t)SN * SC, 3, -5, 5),
               kt_rand((size_t)SN * SC, 4, -1, 1),
               kt_rand((size_t)LX, 5, -2, 2),
               kt_rand(LC2, 6, 0.5f, 1.5f),
               kt_rand(LC2, 7, -1, 1),
               kt_rand((size_t)FN * FC, 8, -1, 1),
               kt_rand((size_t)FOC * FC, 9, -0.1f, 0.1f),
               kt_rand(FOC, 10, -1, 1),
               kt_rand((size_t)FN * FOC, 11, -1, 1),
               kt_rand((size_t)AB * AT * 3 * AC, 12, -1, 1),
               kt_rand((size_t)AB * AT * AC, 13, -1, 1),
               kt_rand(40000, 14, -1, 1), /* inputs of CD and CD2 */
               kt_rand(1000, 15, -1, 1),
               kt_rand(16, 16, -1, 1),
               kt_rand((size_t)PN * PC * PH * PH, 18, -1, 1),
               kt_rand((size_t)EV * EC, 19, -1, 1),
               NULL,
               loom_malloc(SN * sizeof(int32_t)),
               loom_malloc(EN * sizeof(int32_t))};
  TT_REQUIRE(in.x && in.d && in.sx && in.sd && in.lx && in.lw && in.lb &&
             in.fx && in.fw && in.fb && in.fd && in.qkv && in.ad && in.cx &&
             in.cw && in.cb && in.px && in.et && in.tgt && in.ids);
  for (int n = 0; n < SN; n++)
    in.tgt[n] = n % 9 == 0 ? -1 : (n * 31) % SC;
  for (int n = 0; n < EN; n++)
    in.ids[n] = (n * 7 + n / 13) % EV; /* many repeats per row */
  const size_t total = outputs_size();
  outputs o[3];
  for (int t = 0; t < 3; t++) {
    o[t].buf = loom_malloc(total * sizeof(float));
    o[t].n = total;
    TT_REQUIRE(o[t].buf);
  }
  for (int be = 0; be < LOOM_GEMM_BACKEND_COUNT; be++) {
    if (loom_gemm_set_backend((loom_gemm_backend)be) != LOOM_OK)
      continue;
    for (int t = 0; t < 3; t++) {
      loom_set_threads(t + 1);
      run_all(&in, &o[t]);
    }
    if (!kt_same_bits(o[0].buf, o[1].buf, total) ||
        !kt_same_bits(o[0].buf, o[2].buf, total))
      fprintf(stderr, "    backend %s:\n",
              loom_gemm_backend_name((loom_gemm_backend)be));
    KT_CHECK_SAME_BITS(o[0].buf, o[1].buf, total);
    KT_CHECK_SAME_BITS(o[0].buf, o[2].buf, total);
  }
  loom_set_threads(0);
  float *bufs[] = {in.x,  in.d,  in.sx, in.sd, in.lx,    in.lw,    in.lb,
                   in.fx, in.fw, in.fb, in.fd, in.qkv,   in.ad,    in.cx,
                   in.cw, in.cb, in.px, in.et, o[0].buf, o[1].buf, o[2].buf};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
  loom_free(in.tgt);
  loom_free(in.ids);
}

int main(void) {
  loom_gemm_set_deterministic(true);
  TT_RUN(every_kernel_thread_count_invariant);
  return tt_finish();
}
