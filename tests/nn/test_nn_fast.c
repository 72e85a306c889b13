/* The nn layer's shortcuts change no result: a sequential does not compute
 * the gradient flowing into leading parameter-free children when no input
 * gradient is asked for (the parameter gradients are the same bits as when
 * it is), and buffers written by `backward_to` instead of cleared and added
 * into give the bits of the cleared ones (an input gradient buffer full of
 * NaN comes out as one full of zeros does). */
#include <math.h>
#include <string.h>

#include "tt.h"

#include "loom/nn.h"

/* Forward on x, an output gradient from a fixed seed, backward into a
 * zeroed gradient buffer; copies the parameter gradients to g (N) and, with
 * dx, the input gradient (dx's contents before: fill). */
static void run(loom_model *m, const loom_tensor *x, float *g, float *dx,
                float fill) {
  loom_tensor out, dout;
  TT_REQUIRE_OK(loom_model_forward(m, x, &out));
  TT_REQUIRE_OK(loom_model_output_grad(m, &dout));
  loom_rng r = loom_rng_init(5, 1);
  loom_rng_fill_uniform(&r, dout.data, (size_t)loom_tensor_numel(&dout), -1, 1);
  loom_model_zero_grad(m);
  loom_tensor di;
  if (dx) {
    di = *x;
    di.data = dx;
    for (int64_t i = 0; i < loom_tensor_numel(x); i++)
      dx[i] = fill;
  }
  TT_REQUIRE_OK(loom_model_backward(m, NULL, dx ? &di : NULL));
  memcpy(g, loom_model_grads(m),
         (size_t)loom_model_num_params(m) * sizeof(float));
}

/* Parameter gradients without and with the input gradient asked for; the
 * input gradient written over NaN and over zeros. */
static void check_model(loom_model *m, const loom_tensor *x) {
  int64_t n = loom_model_num_params(m), nx = loom_tensor_numel(x);
  float *g0 = loom_malloc((size_t)n * sizeof(float));
  float *g1 = loom_malloc((size_t)n * sizeof(float));
  float *g2 = loom_malloc((size_t)n * sizeof(float));
  float *dnan = loom_malloc((size_t)nx * sizeof(float));
  float *dzero = loom_malloc((size_t)nx * sizeof(float));
  run(m, x, g0, NULL, 0);
  run(m, x, g1, dnan, NAN);
  run(m, x, g2, dzero, 0.0f);
  TT_CHECK(memcmp(g0, g1, (size_t)n * sizeof(float)) == 0);
  TT_CHECK(memcmp(g0, g2, (size_t)n * sizeof(float)) == 0);
  TT_CHECK(memcmp(dnan, dzero, (size_t)nx * sizeof(float)) == 0);
  double sg = 0, sx = 0;
  for (int64_t i = 0; i < n; i++)
    sg += fabs(g0[i]);
  for (int64_t i = 0; i < nx; i++)
    sx += fabs(dzero[i]);
  TT_CHECK(sg > 0 && isfinite(sg)); /* a real gradient, not zeros */
  TT_CHECK(sx > 0 && isfinite(sx));
  loom_free(g0);
  loom_free(g1);
  loom_free(g2);
  loom_free(dnan);
  loom_free(dzero);
}

static loom_tensor images(int64_t n, int c, int h, int w, float **buf) {
  int64_t d[4] = {n, c, h, w};
  *buf = loom_malloc((size_t)(n * c * h * w) * sizeof(float));
  loom_rng r = loom_rng_init(3, 2);
  loom_rng_fill_normal(&r, *buf, (size_t)(n * c * h * w), 0, 1);
  return loom_tensor_view(*buf, LOOM_F32, 4, d);
}

/* flatten first: fc1's input gradient is skipped when not asked for */
TT_TEST(mlp_skips_unneeded_input_gradient) {
  loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
  o.in = 36;
  o.hidden = 24;
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, &o, NULL));
  float *buf;
  loom_tensor x = images(5, 1, 6, 6, &buf);
  check_model(m, &x);
  loom_model_free(m);
  loom_free(buf);
}

/* Two parameter-free children before the first layer (flatten, relu), and a
 * nested sequential after it. */
TT_TEST(leading_children_without_parameters) {
  loom_module *seq, *inner, *k;
  TT_REQUIRE_OK(loom_sequential_new(&seq));
  TT_REQUIRE_OK(loom_flatten_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "flat", k));
  TT_REQUIRE_OK(loom_relu_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "act0", k));
  TT_REQUIRE_OK(loom_linear_new(&k, 16, 12, true));
  TT_REQUIRE_OK(loom_sequential_add(seq, "fc1", k));
  TT_REQUIRE_OK(loom_sequential_new(&inner));
  TT_REQUIRE_OK(loom_gelu_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(inner, "act", k));
  TT_REQUIRE_OK(loom_linear_new(&k, 12, 5, true));
  TT_REQUIRE_OK(loom_sequential_add(inner, "fc", k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "head", inner));
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, seq, NULL));
  float *buf;
  loom_tensor x = images(7, 1, 4, 4, &buf);
  check_model(m, &x);
  loom_model_free(m);
  loom_free(buf);
}

/* relu and max pooling write their input gradients (backward_to) */
TT_TEST(cnn_written_gradients) {
  loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
  o.in_h = o.in_w = 12;
  o.c1 = 4;
  o.c2 = 6;
  o.kernel = 3;
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, &o, NULL));
  float *buf;
  loom_tensor x = images(3, 1, 12, 12, &buf);
  check_model(m, &x);
  loom_model_free(m);
  loom_free(buf);
}

/* conv, relu, pool, linear: the ReLU and pool run fused; with the pool
 * wrapped in a sequential of its own they cannot be. The same bits. */
static void conv_relu_pool(bool fusable, loom_model **out) {
  loom_module *seq, *k, *wrap;
  TT_REQUIRE_OK(loom_sequential_new(&seq));
  TT_REQUIRE_OK(loom_conv2d_new(&k, 1, 3, 3, 1, 0, true));
  TT_REQUIRE_OK(loom_sequential_add(seq, "conv", k));
  TT_REQUIRE_OK(loom_relu_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "relu", k));
  TT_REQUIRE_OK(loom_maxpool2d_new(&k, 2, 2));
  if (fusable) {
    TT_REQUIRE_OK(loom_sequential_add(seq, "pool", k));
  } else {
    TT_REQUIRE_OK(loom_sequential_new(&wrap));
    TT_REQUIRE_OK(loom_sequential_add(wrap, "pool", k));
    TT_REQUIRE_OK(loom_sequential_add(seq, "wrap", wrap));
  }
  TT_REQUIRE_OK(loom_flatten_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "flat", k));
  TT_REQUIRE_OK(loom_linear_new(&k, 3 * 5 * 5, 4, true));
  TT_REQUIRE_OK(loom_sequential_add(seq, "fc", k));
  TT_REQUIRE_OK(loom_model_new(out, seq, NULL));
}

TT_TEST(relu_pool_fused_as_apart) {
  loom_model *a = NULL, *b = NULL;
  conv_relu_pool(true, &a);
  conv_relu_pool(false, &b);
  TT_REQUIRE(a && b);
  int64_t n = loom_model_num_params(a);
  TT_REQUIRE(n == loom_model_num_params(b));
  memcpy(loom_model_params(b), loom_model_params(a), (size_t)n * sizeof(float));
  float *buf;
  loom_tensor x = images(6, 1, 12, 12, &buf);
  int64_t nx = loom_tensor_numel(&x);
  float *ga = loom_malloc((size_t)n * sizeof(float));
  float *gb = loom_malloc((size_t)n * sizeof(float));
  float *da = loom_malloc((size_t)nx * sizeof(float));
  float *db = loom_malloc((size_t)nx * sizeof(float));
  loom_tensor oa, ob;
  run(a, &x, ga, da, NAN);
  TT_REQUIRE_OK(loom_model_forward(a, &x, &oa));
  run(b, &x, gb, db, 0.0f);
  TT_REQUIRE_OK(loom_model_forward(b, &x, &ob));
  TT_CHECK(memcmp(oa.data, ob.data, (size_t)loom_tensor_numel(&oa) * 4) == 0);
  TT_CHECK(memcmp(ga, gb, (size_t)n * sizeof(float)) == 0);
  TT_CHECK(memcmp(da, db, (size_t)nx * sizeof(float)) == 0);
  /* without the input gradient too */
  run(a, &x, ga, NULL, 0.0f);
  TT_CHECK(memcmp(ga, gb, (size_t)n * sizeof(float)) == 0);
  loom_free(ga);
  loom_free(gb);
  loom_free(da);
  loom_free(db);
  loom_free(buf);
  loom_model_free(a);
  loom_model_free(b);
}

/* a ReLU and a pool first: nothing before them needs their gradient */
TT_TEST(relu_pool_first) {
  loom_module *seq, *k;
  TT_REQUIRE_OK(loom_sequential_new(&seq));
  TT_REQUIRE_OK(loom_relu_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "relu", k));
  TT_REQUIRE_OK(loom_maxpool2d_new(&k, 2, 2));
  TT_REQUIRE_OK(loom_sequential_add(seq, "pool", k));
  TT_REQUIRE_OK(loom_conv2d_new(&k, 2, 3, 3, 1, 0, true));
  TT_REQUIRE_OK(loom_sequential_add(seq, "conv", k));
  TT_REQUIRE_OK(loom_flatten_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(seq, "flat", k));
  TT_REQUIRE_OK(loom_linear_new(&k, 3 * 4 * 4, 4, true));
  TT_REQUIRE_OK(loom_sequential_add(seq, "fc", k));
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, seq, NULL));
  float *buf;
  loom_tensor x = images(3, 2, 12, 12, &buf);
  check_model(m, &x);
  loom_model_free(m);
  loom_free(buf);
}

int main(void) {
  loom_set_threads(1);
  TT_RUN(mlp_skips_unneeded_input_gradient);
  TT_RUN(leading_children_without_parameters);
  TT_RUN(cnn_written_gradients);
  TT_RUN(relu_pool_fused_as_apart);
  TT_RUN(relu_pool_first);
  return tt_finish();
}
