/* Gradient checks of the three reference models at small sizes, through the
 * cross-entropy loss: every parameter (the GPT's tied embedding included)
 * against central finite differences. */
#include <string.h>

#include "gradcheck.h"

static void fill_targets(int32_t *t, int n, int V, uint64_t seed) {
  loom_rng r = loom_rng_init(seed, 3);
  for (int i = 0; i < n; i++)
    t[i] = (int32_t)loom_rng_below(&r, (uint64_t)V);
}

TT_TEST(grad_fashion_mlp) {
  loom_fashion_mlp_opts o = {
      .in = 12, .hidden = 8, .n_hidden = 2, .classes = 5};
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, &o, NULL));
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, 2, (int64_t[]){4, 12}));
  gc_fill_normal(in.data, 48, 21, 1.0f);
  int32_t t[4];
  fill_targets(t, 4, 5, 22);
  gc g;
  TT_REQUIRE_OK(gc_init(&g, m, in, t));
  g.h = 1e-3;
  g.kinked = true;
  TT_CHECK_EQ(gc_check(&g, "fashion-mlp"), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

TT_TEST(grad_fashion_cnn) {
  /* 14x14 -> conv3 12x12 -> pool 6x6 -> conv3 4x4 -> pool 2x2 -> fc. One
   * image and He init keep kinks rare: a weight step h moves a
   * pre-activation by about h |x|, against pre-activations of about
   * sqrt(2) |x| (with torch init, 3x smaller). */
  loom_fashion_cnn_opts o = {.in_c = 1,
                             .in_h = 14,
                             .in_w = 14,
                             .c1 = 3,
                             .c2 = 4,
                             .kernel = 3,
                             .pool = 2,
                             .classes = 5};
  loom_model_opts mo = loom_model_opts_default();
  mo.init = LOOM_INIT_HE_NORMAL;
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, &o, &mo));
  TT_CHECK_EQ(loom_model_num_params(m),
              (3 * 9 + 3) + (4 * 3 * 9 + 4) + (16 * 5 + 5));
  /* Biases away from 0 too (He init zeroes them). */
  for (int v = 0; v < loom_model_num_views(m); v++) {
    const loom_param *p = loom_model_view(m, v);
    if (p->ndim == 1)
      gc_fill_normal(loom_model_params(m) + p->offset, p->numel, 27 + v, 0.5f);
  }
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, 4, (int64_t[]){1, 1, 14, 14}));
  gc_fill_normal(in.data, 196, 23, 1.0f);
  int32_t t[1];
  fill_targets(t, 1, 5, 24);
  gc g;
  TT_REQUIRE_OK(gc_init(&g, m, in, t));
  g.h = 1e-3;
  g.kinked = true;
  TT_CHECK_EQ(gc_check(&g, "fashion-cnn"), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

/* The mlp of any widths (issue 10: only equal widths and ReLU worked), a
 * linear model (no hidden layer), ReLU and GELU. */
static void check_mlp(const char *what, const int *widths, int n, loom_act act,
                      int64_t want_params) {
  loom_fashion_mlp_opts o = {
      .in = 12, .n_hidden = n, .classes = 5, .widths = widths, .act = act};
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, &o, NULL));
  TT_CHECK_EQ(loom_model_num_params(m), want_params);
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, 2, (int64_t[]){4, 12}));
  gc_fill_normal(in.data, 48, 21, 1.0f);
  int32_t t[4];
  fill_targets(t, 4, 5, 22);
  gc g;
  TT_REQUIRE_OK(gc_init(&g, m, in, t));
  g.h = 1e-3;
  g.kinked = act == LOOM_ACT_RELU;
  TT_CHECK_EQ(gc_check(&g, what), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

TT_TEST(grad_mlp_widths) {
  const int w[3] = {9, 4, 7};
  check_mlp("mlp 12-9-4-7-5 relu", w, 3, LOOM_ACT_RELU,
            (12 * 9 + 9) + (9 * 4 + 4) + (4 * 7 + 7) + (7 * 5 + 5));
  check_mlp("mlp 12-9-4-7-5 gelu", w, 3, LOOM_ACT_GELU,
            (12 * 9 + 9) + (9 * 4 + 4) + (4 * 7 + 7) + (7 * 5 + 5));
  check_mlp("mlp 12-5 linear", NULL, 0, LOOM_ACT_RELU, 12 * 5 + 5);
}

/* The cnn with three conv stages and GELU (issue 10: only two, ReLU):
 * 22x22 -> conv3 20 -> pool 10 -> conv3 8 -> pool 4 -> conv3 2 -> pool 1 ->
 * fc. */
TT_TEST(grad_cnn_three_convs_gelu) {
  const int ch[3] = {3, 4, 2};
  loom_fashion_cnn_opts o = {.in_c = 1,
                             .in_h = 22,
                             .in_w = 22,
                             .kernel = 3,
                             .pool = 2,
                             .classes = 5,
                             .n_conv = 3,
                             .channels = ch,
                             .act = LOOM_ACT_GELU};
  int h, w;
  loom_fashion_cnn_out_hw(&o, &h, &w);
  TT_CHECK_EQ(h, 1);
  TT_CHECK_EQ(w, 1);
  loom_model_opts mo = loom_model_opts_default();
  mo.init = LOOM_INIT_HE_NORMAL;
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, &o, &mo));
  TT_CHECK_EQ(loom_model_num_params(m),
              (3 * 9 + 3) + (4 * 3 * 9 + 4) + (2 * 4 * 9 + 2) + (2 * 5 + 5));
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, 4, (int64_t[]){2, 1, 22, 22}));
  gc_fill_normal(in.data, 2 * 22 * 22, 31, 1.0f);
  int32_t t[2];
  fill_targets(t, 2, 5, 32);
  gc g;
  TT_REQUIRE_OK(gc_init(&g, m, in, t));
  g.h = 1e-3;
  g.kinked = true; /* max-pool picks */
  TT_CHECK_EQ(gc_check(&g, "cnn 3 convs gelu"), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
  /* Too many stages for the image: an error, not a crash. */
  const int ch4[4] = {3, 4, 2, 2};
  o.channels = ch4;
  o.n_conv = 4;
  TT_CHECK_EQ(loom_fashion_cnn_new(&m, &o, &mo), LOOM_ERR_INVALID_ARG);
}

static void check_gpt(const char *what, float dropout, bool bias) {
  loom_gpt_opts o = loom_gpt_opts_default();
  o.vocab = 11;
  o.context = 6;
  o.n_layer = 2;
  o.d_model = 8;
  o.n_head = 2;
  o.dropout = dropout;
  o.bias = bias;
  /* A larger init than GPT-2's 0.02 so every path carries signal. */
  loom_model_opts mo = loom_model_opts_default();
  mo.init = LOOM_INIT_GPT2;
  mo.init_std = 0.3f;
  loom_model *m;
  TT_REQUIRE_OK(loom_gpt_new(&m, &o, &mo));
  loom_model_set_step(m, 2, 40);
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_I32, 2, (int64_t[]){2, 5}));
  int32_t *ids = in.data;
  fill_targets(ids, 10, 11, 25);
  int32_t t[10];
  fill_targets(t, 10, 11, 26);
  t[7] = -1; /* an ignored position */
  gc g;
  TT_REQUIRE_OK(gc_init(&g, m, in, t));
  TT_CHECK_EQ(gc_check(&g, what), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

TT_TEST(grad_gpt) { check_gpt("kjv-gpt small", 0.0f, true); }
TT_TEST(grad_gpt_dropout) { check_gpt("kjv-gpt small, dropout", 0.2f, true); }
TT_TEST(grad_gpt_nobias) { check_gpt("kjv-gpt small, no bias", 0.0f, false); }

TT_TEST(tied_embedding_sums_both_uses) {
  /* The tied weight's gradient is the embedding's scatter-add plus the
   * output layer's dout^T @ x: with the head's share removed (by giving
   * the logits zero gradient) only the embedding part remains, and the
   * full gradient differs from it. */
  loom_gpt_opts o = loom_gpt_opts_default();
  o.vocab = 7;
  o.context = 4;
  o.n_layer = 1;
  o.d_model = 8;
  o.n_head = 2;
  loom_model *m;
  TT_REQUIRE_OK(loom_gpt_new(&m, &o, NULL));
  int32_t ids[4] = {1, 2, 3, 1};
  loom_tensor in = loom_tensor_view(ids, LOOM_I32, 2, (int64_t[]){1, 4});
  loom_tensor out;
  TT_REQUIRE_OK(loom_model_forward(m, &in, &out));
  float dl[4 * 7];
  memset(dl, 0, sizeof dl);
  loom_tensor dout = loom_tensor_view(dl, LOOM_F32, 3, (int64_t[]){1, 4, 7});
  loom_model_zero_grad(m);
  TT_REQUIRE_OK(loom_model_backward(m, &dout, NULL));
  const float *g = loom_model_grads(m);
  int zero = 1;
  for (int i = 0; i < 7 * 8; i++)
    zero &= g[i] == 0.0f;
  TT_CHECK(zero); /* no gradient in, none out */
  dl[5] = 1.0f;   /* d loss / d logit(t=0, v=5): token 5 never appears */
  loom_model_zero_grad(m);
  TT_REQUIRE_OK(loom_model_backward(m, &dout, NULL));
  int nz = 0;
  for (int j = 0; j < 8; j++)
    nz += g[5 * 8 + j] != 0.0f; /* row 5 gets the head's share only */
  TT_CHECK(nz > 0);
  loom_model_free(m);
}

int main(void) {
  loom_set_threads(1); /* tiny shapes: threads would only add overhead */
  TT_RUN(grad_fashion_mlp);
  TT_RUN(grad_fashion_cnn);
  TT_RUN(grad_mlp_widths);
  TT_RUN(grad_cnn_three_convs_gelu);
  TT_RUN(grad_gpt);
  TT_RUN(grad_gpt_dropout);
  TT_RUN(grad_gpt_nobias);
  TT_RUN(tied_embedding_sums_both_uses);
  return tt_finish();
}
