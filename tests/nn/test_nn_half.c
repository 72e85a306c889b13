/* Mixed precision in nn: each module type in bf16 and in f16 against the
 * same model in f32 (outputs, parameter and input gradients), the linear
 * and conv2d layers to the bit against f32 arithmetic on rounded operands,
 * the activation memory that a half type saves, when the half weight copy
 * is refreshed, thread counts and activation checkpointing (same bits),
 * and the errors. Every test runs once per half type (g_half).
 *
 * Tolerance of the comparison with f32, relative in norm over a whole
 * tensor: TOL = 8 u, with u the type's unit roundoff (bf16: 2^-8, so
 * 2^-5 = 3.1%; f16: 2^-11, so 2^-8 = 0.39%). Rounding moves an operand by
 * at most u relative; a product of two rounded operands by at most 2u + u^2
 * of its size, and a matmul's result by that much of sum |a b|. A gradient
 * here goes through at most four such roundings in a row (the weight, the
 * input or the activation handed on in half, the output gradient, and the
 * layer above's): 4 x 2u = 8u in the worst case of each step; with inputs
 * of random signs the errors of a sum partly cancel, so the worst case of
 * sum |a b| against |sum a b| (about twice) is not reached in norm. The values
 * here are far above f16's subnormal range (2^-14), where its relative error
 * would grow. What is measured is 3 to 10 times smaller (the errors have random
 * signs); an error in the path (an f32 operand read as half, a stale
 * weight, bf16 read as f16) is far larger. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gradcheck.h"
#include "loom/kernels.h"

/* The half type the tests run in (main runs them for each). */
static loom_dtype g_half = LOOM_BF16;

/* Bytes a parameter of the model's own copy: 2 where the matmuls run on
 * the CPU's unit, 4 on the conversion path (f32 values of the type). */
static size_t copy_bytes(void) { return loom_half_on_unit(g_half) ? 2 : 4; }
#define TOL (g_half == LOOM_BF16 ? 1.0 / 32.0 : 1.0 / 256.0)

static double rel_err(const float *a, const float *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    s += (double)b[i] * b[i];
  }
  return s > 0 ? sqrt(d / s) : sqrt(d);
}

typedef loom_status (*build_fn)(loom_model **out);

#define WRAP(out, ctor, root)                                                  \
  do {                                                                         \
    loom_module *root = NULL;                                                  \
    LOOM_TRY(ctor);                                                            \
    return loom_model_new(out, root, NULL);                                    \
  } while (0)

static loom_status b_linear(loom_model **out) {
  WRAP(out, loom_linear_new(&l, 37, 23, true), l);
}

/* linear, activation, linear */
static loom_status b_seq(loom_model **out, bool gelu) {
  loom_module *s, *k;
  LOOM_TRY(loom_sequential_new(&s));
  loom_status st = loom_linear_new(&k, 37, 64, true);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "fc1", k);
  if (st == LOOM_OK)
    st = gelu ? loom_gelu_new(&k) : loom_relu_new(&k);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "act", k);
  if (st == LOOM_OK)
    st = loom_linear_new(&k, 64, 23, true);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "fc2", k);
  if (st != LOOM_OK) {
    loom_module_free(s);
    return st;
  }
  return loom_model_new(out, s, NULL);
}
static loom_status b_relu(loom_model **out) { return b_seq(out, false); }
static loom_status b_gelu(loom_model **out) { return b_seq(out, true); }

/* layernorm into a linear layer (the norm hands its output on in bf16) */
static loom_status b_ln(loom_model **out) {
  loom_module *s, *k;
  LOOM_TRY(loom_sequential_new(&s));
  loom_status st = loom_layernorm_new(&k, 37, true);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "ln", k);
  if (st == LOOM_OK)
    st = loom_linear_new(&k, 37, 23, true);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "fc", k);
  if (st != LOOM_OK) {
    loom_module_free(s);
    return st;
  }
  return loom_model_new(out, s, NULL);
}

static loom_status b_attn(loom_model **out) {
  WRAP(out, loom_attention_new(&a, 32, 4, true), a);
}

static loom_status b_mlp(loom_model **out) {
  WRAP(out, loom_mlp_new(&a, 32, 96, true, 0.0f), a);
}

static loom_status b_block(loom_model **out) {
  WRAP(out, loom_transformer_block_new(&a, 32, 4, 4, true, 0.0f), a);
}

/* with dropout: the attention and its dropout are a sequential inside the
 * block, planned (dry-run first) with a half input */
static loom_status b_block_drop(loom_model **out) {
  WRAP(out, loom_transformer_block_new(&a, 32, 4, 4, true, 0.1f), a);
}

static loom_gpt_opts tiny_gpt(void) {
  loom_gpt_opts o = loom_gpt_opts_default();
  o.vocab = 29;
  o.context = 12;
  o.n_layer = 2;
  o.d_model = 32;
  o.n_head = 4;
  return o;
}

static loom_status b_gpt(loom_model **out) {
  loom_gpt_opts o = tiny_gpt();
  return loom_gpt_new(out, &o, NULL);
}

static loom_status b_gpt_drop(loom_model **out) {
  loom_gpt_opts o = tiny_gpt();
  o.dropout = 0.1f;
  return loom_gpt_new(out, &o, NULL);
}

static loom_status b_fmlp(loom_model **out) {
  loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
  o.hidden = 48;
  return loom_fashion_mlp_new(out, &o, NULL);
}

/* conv, ReLU, conv: the ReLU hands its output on in bf16 */
static loom_status b_convs(loom_model **out) {
  loom_module *s, *k;
  LOOM_TRY(loom_sequential_new(&s));
  loom_status st = loom_conv2d_new(&k, 3, 8, 3, 1, 1, true);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "conv1", k);
  if (st == LOOM_OK)
    st = loom_relu_new(&k);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "act", k);
  if (st == LOOM_OK)
    st = loom_conv2d_new(&k, 8, 5, 3, 2, 0, true);
  if (st == LOOM_OK)
    st = loom_sequential_add(s, "conv2", k);
  if (st != LOOM_OK) {
    loom_module_free(s);
    return st;
  }
  return loom_model_new(out, s, NULL);
}

/* fashion-cnn, narrow: conv, ReLU + pool (the pool hands on in bf16),
 * conv, ReLU + pool, flatten, linear. A 2x2 max is a kink too: two
 * values of a window within a rounding of each other swap in bf16, and
 * the gradient moves whole to the other (measured: conv1's weight
 * gradient 6% off with 6 images). Pooling windows of 1 keep the path
 * (the fused ReLU + pool, the pool's bf16 output) without that; the pool
 * takes its max in f32 and rounds after it, so its choice is f32's on
 * the same input; bf16_same_bits runs the 2x2 pool. */
static loom_status b_cnn(loom_model **out) {
  loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
  o.c1 = 6;
  o.c2 = 12;
  o.pool = 1;
  return loom_fashion_cnn_new(out, &o, NULL);
}

/* Runs forward and backward with the same input and output gradient;
 * out/grads/dinp filled (dinp only for a float input). */
typedef struct run {
  float *out, *grads, *dinp;
  int64_t out_n, np, in_n;
} run;

static void run_free(run *r) {
  loom_free(r->out);
  loom_free(r->grads);
  loom_free(r->dinp);
  memset(r, 0, sizeof *r);
}

static loom_status run_model(loom_model *m, const loom_tensor *in, run *r) {
  loom_tensor y;
  memset(r, 0, sizeof *r);
  LOOM_TRY(loom_model_forward(m, in, &y));
  r->out_n = loom_tensor_numel(&y);
  r->np = loom_model_num_params(m);
  r->in_n = loom_tensor_numel(in);
  r->out = loom_malloc((size_t)r->out_n * sizeof(float));
  float *dout = loom_malloc((size_t)r->out_n * sizeof(float));
  r->grads = loom_malloc((size_t)r->np * sizeof(float));
  r->dinp = loom_malloc((size_t)r->in_n * sizeof(float));
  if (!r->out || !dout || !r->grads || !r->dinp) {
    loom_free(dout);
    return LOOM_ERR_NOMEM;
  }
  memcpy(r->out, y.data, (size_t)r->out_n * sizeof(float));
  gc_fill_normal(dout, r->out_n, 31, 1.0f);
  loom_tensor dy = loom_tensor_view(dout, LOOM_F32, y.ndim, y.shape);
  loom_tensor dx = loom_tensor_view(r->dinp, in->dtype, in->ndim, in->shape);
  loom_model_zero_grad(m);
  loom_status st =
      loom_model_backward(m, &dy, in->dtype == LOOM_F32 ? &dx : NULL);
  loom_free(dout);
  LOOM_TRY(st);
  memcpy(r->grads, loom_model_grads(m), (size_t)r->np * sizeof(float));
  return LOOM_OK;
}

/* A ReLU is a kink: a pre-activation within a rounding of 0 falls on the
 * other side in bf16 and its row's gradient changes by O(1), not by the
 * format's error. The ReLU models' fc1 (or conv1 and conv2) get biases of
 * +-2 (their pre-activations have a standard deviation of about 0.6
 * here), so no
 * pre-activation lies that close to 0; half the units are on, half off. */
static void away_from_kink(loom_model *m) {
  static const char *const names[] = {"fc1.bias", "conv1.bias", "conv2.bias"};
  for (int k = 0; k < 3; k++) {
    int i;
    if (loom_model_find(m, names[k], &i) != LOOM_OK)
      continue;
    const loom_param *v = loom_model_view(m, i);
    float *b = loom_model_params(m) + v->offset;
    for (int64_t j = 0; j < v->numel; j++)
      b[j] += j % 2 ? 2.0f : -2.0f;
  }
  loom_model_params_updated(m);
}

/* The model in f32 and in bf16 from the same seed on the same input. */
static void compare(const char *name, build_fn build, const loom_tensor *in) {
  loom_model *a = NULL, *b = NULL;
  TT_REQUIRE_OK(build(&a));
  TT_REQUIRE_OK(build(&b));
  if (build == b_relu || build == b_convs || build == b_cnn) {
    away_from_kink(a);
    away_from_kink(b);
  }
  TT_REQUIRE_OK(loom_model_set_precision(b, g_half));
  TT_CHECK_EQ(loom_model_precision(b), g_half);
  run ra, rb;
  TT_REQUIRE_OK(run_model(a, in, &ra));
  TT_REQUIRE_OK(run_model(b, in, &rb));
  double e = rel_err(rb.out, ra.out, ra.out_n), worst = e;
  TT_CHECK(e <= TOL);
  TT_CHECK(e > 0); /* it did round */
  for (int i = 0; i < loom_model_num_views(a); i++) {
    const loom_param *v = loom_model_view(a, i);
    double g = rel_err(rb.grads + v->offset, ra.grads + v->offset, v->numel);
    if (!(g <= TOL))
      fprintf(stderr, "  %s: %s gradient off by %.3g\n", name, v->name, g);
    TT_CHECK(g <= TOL);
    worst = g > worst ? g : worst;
  }
  if (in->dtype == LOOM_F32) {
    double g = rel_err(rb.dinp, ra.dinp, ra.in_n);
    TT_CHECK(g <= TOL);
    worst = g > worst ? g : worst;
  }
  printf("  %-12s output %.2e, worst gradient or output %.2e (tolerance "
         "%.2e)\n",
         name, e, worst, TOL);
  run_free(&ra);
  run_free(&rb);
  loom_model_free(a);
  loom_model_free(b);
}

static float *normal(int64_t n, uint64_t seed) {
  float *x = loom_malloc((size_t)n * sizeof(float));
  if (x)
    gc_fill_normal(x, n, seed, 1.0f);
  return x;
}

TT_TEST(modules_against_f32) {
  float *x = normal(2 * 9 * 37, 1);
  float *xc = normal(2 * 9 * 32, 2);
  float *img = normal(6 * 784, 3);
  float *xi = normal(2 * 3 * 9 * 9, 4);
  int32_t ids[2 * 12];
  TT_REQUIRE(x && xc && img && xi);
  for (int i = 0; i < 2 * 12; i++)
    ids[i] = (i * 7 + 3) % 29;
  loom_tensor t37 = loom_tensor_view(x, LOOM_F32, 3, (int64_t[]){2, 9, 37});
  loom_tensor t32 = loom_tensor_view(xc, LOOM_F32, 3, (int64_t[]){2, 9, 32});
  loom_tensor ti = loom_tensor_view(img, LOOM_F32, 2, (int64_t[]){6, 784});
  loom_tensor t39 = loom_tensor_view(xi, LOOM_F32, 4, (int64_t[]){2, 3, 9, 9});
  loom_tensor tc =
      loom_tensor_view(img, LOOM_F32, 4, (int64_t[]){6, 1, 28, 28});
  loom_tensor tok = loom_tensor_view(ids, LOOM_I32, 2, (int64_t[]){2, 12});
  compare("linear", b_linear, &t37);
  compare("relu", b_relu, &t37);
  compare("gelu", b_gelu, &t37);
  compare("layernorm", b_ln, &t37);
  compare("attention", b_attn, &t32);
  compare("mlp", b_mlp, &t32);
  compare("block", b_block, &t32);
  compare("block+drop", b_block_drop, &t32);
  compare("gpt", b_gpt, &tok);
  compare("gpt+drop", b_gpt_drop, &tok);
  compare("fashion-mlp", b_fmlp, &ti);
  compare("conv2d", b_convs, &t39);
  compare("fashion-cnn", b_cnn, &tc);
  loom_free(xi);
  loom_free(x);
  loom_free(xc);
  loom_free(img);
}

/* Without a bias, and with weights, input and output gradient already
 * bf16 values, the bf16 layer's arithmetic is f32's: the same bits. */
TT_TEST(linear_exact) {
  loom_module *la, *lb;
  loom_model *a, *b;
  TT_REQUIRE_OK(loom_linear_new(&la, 45, 19, false));
  TT_REQUIRE_OK(loom_model_new(&a, la, NULL));
  TT_REQUIRE_OK(loom_linear_new(&lb, 45, 19, false));
  TT_REQUIRE_OK(loom_model_new(&b, lb, NULL));
  TT_REQUIRE_OK(loom_model_set_precision(b, g_half));
  TT_CHECK_OK(loom_round_half(g_half, loom_model_params(a),
                              loom_model_params(a), loom_model_num_params(a)));
  const int64_t N = 33;
  float *x = normal(N * 45, 5), *xr = normal(N * 45, 5);
  TT_REQUIRE(x && xr);
  TT_CHECK_OK(loom_round_half(g_half, xr, xr, N * 45));
  loom_tensor tx = loom_tensor_view(x, LOOM_F32, 2, (int64_t[]){N, 45});
  loom_tensor txr = loom_tensor_view(xr, LOOM_F32, 2, (int64_t[]){N, 45});
  loom_tensor ya, yb, dya, dyb;
  TT_REQUIRE_OK(loom_model_forward(a, &txr, &ya));
  TT_REQUIRE_OK(loom_model_forward(b, &tx, &yb));
  TT_CHECK(memcmp(ya.data, yb.data, (size_t)N * 19 * sizeof(float)) == 0);
  TT_REQUIRE_OK(loom_model_output_grad(a, &dya));
  TT_REQUIRE_OK(loom_model_output_grad(b, &dyb));
  gc_fill_normal(dya.data, N * 19, 8, 1.0f);
  gc_fill_normal(dyb.data, N * 19, 8, 1.0f);
  TT_CHECK_OK(loom_round_half(g_half, dya.data, dya.data, N * 19));
  float *dxa = normal(N * 45, 1), *dxb = normal(N * 45, 1);
  TT_REQUIRE(dxa && dxb);
  loom_tensor ta = loom_tensor_view(dxa, LOOM_F32, 2, (int64_t[]){N, 45});
  loom_tensor tb = loom_tensor_view(dxb, LOOM_F32, 2, (int64_t[]){N, 45});
  TT_REQUIRE_OK(loom_model_backward(a, NULL, &ta));
  TT_REQUIRE_OK(loom_model_backward(b, NULL, &tb));
  TT_CHECK(memcmp(dxa, dxb, (size_t)N * 45 * sizeof(float)) == 0);
  TT_CHECK(memcmp(loom_model_grads(a), loom_model_grads(b),
                  (size_t)loom_model_num_params(a) * sizeof(float)) == 0);
  loom_free(x);
  loom_free(xr);
  loom_free(dxa);
  loom_free(dxb);
  loom_model_free(a);
  loom_model_free(b);
}

/* The same for a convolution (with its bias: summed from the f32 output
 * gradient, equal here) on both engines' shapes: C = 5 takes oneDNN's
 * when the GEMM backend is dnnl, C = 1 im2col. */
static void conv_exact_one(int C, int OC, int K, int stride, int pad) {
  loom_module *ca, *cb;
  loom_model *a, *b;
  TT_REQUIRE_OK(loom_conv2d_new(&ca, C, OC, K, stride, pad, true));
  TT_REQUIRE_OK(loom_model_new(&a, ca, NULL));
  TT_REQUIRE_OK(loom_conv2d_new(&cb, C, OC, K, stride, pad, true));
  TT_REQUIRE_OK(loom_model_new(&b, cb, NULL));
  TT_REQUIRE_OK(loom_model_set_precision(b, g_half));
  /* the bias too: both models' f32 bias is then the same */
  TT_CHECK_OK(loom_round_half(g_half, loom_model_params(a),
                              loom_model_params(a), loom_model_num_params(a)));
  TT_CHECK_OK(loom_round_half(g_half, loom_model_params(b),
                              loom_model_params(b), loom_model_num_params(b)));
  loom_model_params_updated(b);
  const int64_t N = 3, H = 11, W = 10, nx = N * C * H * W;
  float *x = normal(nx, 5), *xr = normal(nx, 5);
  TT_REQUIRE(x && xr);
  TT_CHECK_OK(loom_round_half(g_half, xr, xr, nx));
  int64_t shape[4] = {N, C, H, W};
  loom_tensor tx = loom_tensor_view(x, LOOM_F32, 4, shape);
  loom_tensor txr = loom_tensor_view(xr, LOOM_F32, 4, shape);
  loom_tensor ya, yb, dya, dyb;
  TT_REQUIRE_OK(loom_model_forward(a, &txr, &ya));
  TT_REQUIRE_OK(loom_model_forward(b, &tx, &yb));
  const int64_t ny = loom_tensor_numel(&ya);
  TT_CHECK(memcmp(ya.data, yb.data, (size_t)ny * sizeof(float)) == 0);
  TT_REQUIRE_OK(loom_model_output_grad(a, &dya));
  TT_REQUIRE_OK(loom_model_output_grad(b, &dyb));
  gc_fill_normal(dya.data, ny, 8, 1.0f);
  gc_fill_normal(dyb.data, ny, 8, 1.0f);
  TT_CHECK_OK(loom_round_half(g_half, dya.data, dya.data, ny));
  TT_CHECK_OK(loom_round_half(g_half, dyb.data, dyb.data, ny));
  float *dxa = normal(nx, 1), *dxb = normal(nx, 1);
  TT_REQUIRE(dxa && dxb);
  loom_tensor ta = loom_tensor_view(dxa, LOOM_F32, 4, shape);
  loom_tensor tb = loom_tensor_view(dxb, LOOM_F32, 4, shape);
  TT_REQUIRE_OK(loom_model_backward(a, NULL, &ta));
  TT_REQUIRE_OK(loom_model_backward(b, NULL, &tb));
  TT_CHECK(memcmp(dxa, dxb, (size_t)nx * sizeof(float)) == 0);
  TT_CHECK(memcmp(loom_model_grads(a), loom_model_grads(b),
                  (size_t)loom_model_num_params(a) * sizeof(float)) == 0);
  loom_free(x);
  loom_free(xr);
  loom_free(dxa);
  loom_free(dxb);
  loom_model_free(a);
  loom_model_free(b);
}

TT_TEST(conv2d_exact) {
  conv_exact_one(5, 7, 3, 1, 1);
  conv_exact_one(1, 4, 5, 2, 0);
}

/* What is kept from forward to backward shrinks: the outputs handed on to
 * bf16 matmuls are 2 bytes an element instead of 4. */
TT_TEST(activation_memory) {
  loom_model *m;
  size_t a32, a16, s32, s16;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, NULL, NULL));
  loom_shape in = loom_shape_make(LOOM_F32, 4, (int64_t[]){128, 1, 28, 28});
  TT_REQUIRE_OK(loom_model_act_bytes(m, &in, &a32, &s32));
  TT_REQUIRE_OK(loom_model_set_precision(m, g_half));
  TT_REQUIRE_OK(loom_model_act_bytes(m, &in, &a16, &s16));
  /* fc1 and fc2 out f32, the two ReLUs' outputs bf16, fc3 out f32 */
  TT_CHECK_EQ(a32, (size_t)128 * (512 * 4 + 10) * 4);
  TT_CHECK_EQ(a16, (size_t)128 * (512 * 2 * 4 + 512 * 2 * 2 + 10 * 4));
  TT_CHECK_EQ(loom_model_half_bytes(m), (size_t)669706 * copy_bytes());
  printf("  fashion-mlp batch 128: activations %zu -> %zu bytes, scratch %zu "
         "-> %zu\n",
         a32, a16, s32, s16);
  loom_model_free(m);
  TT_REQUIRE_OK(loom_gpt_new(&m, NULL, NULL));
  in = loom_shape_make(LOOM_I32, 2, (int64_t[]){32, 128});
  TT_REQUIRE_OK(loom_model_act_bytes(m, &in, &a32, &s32));
  TT_REQUIRE_OK(loom_model_set_precision(m, g_half));
  TT_REQUIRE_OK(loom_model_act_bytes(m, &in, &a16, &s16));
  /* per block ln1, heads, ln2 (C each) and GELU (4C) at 2 bytes, and
   * ln_f: (4 * 7 + 1) * B*T*C * 2 bytes fewer; and per block the attention
   * probabilities (B,NH,T,T), which feed the P V matmul, at 2 bytes */
  TT_CHECK_EQ(a32 - a16, (size_t)(4 * 7 + 1) * 32 * 128 * 128 * 2 +
                             (size_t)4 * 32 * 4 * 128 * 128 * 2);
  printf("  kjv-gpt batch 32x128: activations %zu -> %zu bytes (%.1f%%), "
         "scratch %zu -> %zu\n",
         a32, a16, 100.0 * (double)a16 / (double)a32, s32, s16);
  loom_model_free(m);
  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, NULL, NULL));
  in = loom_shape_make(LOOM_F32, 4, (int64_t[]){128, 1, 28, 28});
  TT_REQUIRE_OK(loom_model_act_bytes(m, &in, &a32, &s32));
  TT_REQUIRE_OK(loom_model_set_precision(m, g_half));
  TT_REQUIRE_OK(loom_model_act_bytes(m, &in, &a16, &s16));
  /* conv1 out (kept by the fused ReLU), pool1 out and argmax, conv2 out,
   * pool2 out and argmax, fc out; pool1's output (conv2's input) in bf16 */
  const size_t B = 128;
  TT_CHECK_EQ(
      a32,
      B * (32 * 24 * 24 + 2 * 32 * 12 * 12 + 64 * 8 * 8 + 2 * 64 * 4 * 4 + 10) *
          4);
  TT_CHECK_EQ(a32 - a16, B * 32 * 12 * 12 * 2);
  printf("  fashion-cnn batch 128: activations %zu -> %zu bytes (%.1f%%), "
         "scratch %zu -> %zu\n",
         a32, a16, 100.0 * (double)a16 / (double)a32, s32, s16);
  loom_model_free(m);
}

/* The copy is made on the first forward after a change the model knows
 * of (set_precision, init, bind) or loom_model_params_updated; writing the
 * parameters alone leaves the copy (so a step reads it, never rebuilds). */
TT_TEST(copy_refresh) {
  loom_model *m;
  TT_REQUIRE_OK(b_linear(&m));
  TT_REQUIRE_OK(loom_model_set_precision(m, g_half));
  float *x = normal(4 * 37, 9);
  TT_REQUIRE(x);
  loom_tensor t = loom_tensor_view(x, LOOM_F32, 2, (int64_t[]){4, 37});
  float y1[4 * 23], y2[4 * 23], y3[4 * 23];
  loom_tensor y;
  TT_REQUIRE_OK(loom_model_forward(m, &t, &y));
  memcpy(y1, y.data, sizeof y1);
  float *p = loom_model_params(m);
  for (int i = 0; i < 37 * 23; i++) /* the weight only */
    p[i] *= 2.0f;
  TT_REQUIRE_OK(loom_model_forward(m, &t, &y));
  memcpy(y2, y.data, sizeof y2);
  TT_CHECK(memcmp(y1, y2, sizeof y1) == 0);
  loom_model_params_updated(m);
  TT_REQUIRE_OK(loom_model_forward(m, &t, &y));
  memcpy(y3, y.data, sizeof y3);
  TT_CHECK(memcmp(y1, y3, sizeof y1) != 0);
  /* back to f32: the copy goes, the f32 weights are used */
  TT_REQUIRE_OK(loom_model_set_precision(m, LOOM_F32));
  TT_CHECK_EQ(loom_model_half_bytes(m), (size_t)0);
  TT_REQUIRE_OK(loom_model_forward(m, &t, &y));
  TT_CHECK(memcmp(y3, y.data, sizeof y3) != 0);
  loom_free(x);
  loom_model_free(m);
}

/* The model's own copy on the conversion path (f32 values of the half
 * type) and a bound 2-byte copy (ZeRO-3's, a pipeline's) give the same
 * bits, and loom_model_refresh_half fills either; a change of path makes
 * the copy of the other kind on the next forward. */
TT_TEST(copy_kinds) {
  /* on the conversion path (main sets bf16's; f16's is set here, where a
   * CPU with AVX512-FP16 would take the unit) */
  const loom_f16_path f16_was = loom_f16_get_path();
  TT_CHECK_OK(loom_f16_set_path(LOOM_F16_PATH_CONVERT));
  int32_t ids[4 * 12];
  for (int i = 0; i < 4 * 12; i++)
    ids[i] = (i * 7 + 3) % 29;
  loom_tensor tok = loom_tensor_view(ids, LOOM_I32, 2, (int64_t[]){4, 12});
  loom_gpt_opts o = tiny_gpt();
  loom_model *own, *bound;
  TT_REQUIRE_OK(loom_gpt_new(&own, &o, NULL));
  TT_REQUIRE_OK(loom_gpt_new(&bound, &o, NULL));
  TT_REQUIRE_OK(loom_model_set_precision(own, g_half));
  TT_REQUIRE_OK(loom_model_set_precision(bound, g_half));
  const int64_t np = loom_model_num_params(own);
  TT_CHECK(!loom_half_on_unit(g_half));
  TT_CHECK_EQ(loom_model_half_bytes(own), (size_t)np * 4);
  uint16_t *buf = loom_malloc((size_t)np * 2);
  TT_REQUIRE(buf);
  loom_model_bind_half(bound, buf);
  TT_CHECK_EQ(loom_model_half_bytes(bound), (size_t)0);
  const loom_range all = {0, np};
  TT_REQUIRE_OK(loom_model_refresh_half(bound, &all, 1));
  run r[2];
  TT_REQUIRE_OK(run_model(own, &tok, &r[0]));
  TT_REQUIRE_OK(run_model(bound, &tok, &r[1]));
  TT_CHECK(memcmp(r[0].out, r[1].out, (size_t)r[0].out_n * 4) == 0);
  TT_CHECK(memcmp(r[0].grads, r[1].grads, (size_t)np * 4) == 0);
  run_free(&r[0]);
  /* refresh_half on the own copy, by ranges: the new weights are read */
  float *p = loom_model_params(own);
  for (int64_t i = 0; i < np; i++)
    p[i] *= 0.5f;
  const loom_range halves[2] = {{0, np / 2}, {np / 2, np - np / 2}};
  TT_REQUIRE_OK(loom_model_refresh_half(own, halves, 2));
  TT_REQUIRE_OK(run_model(own, &tok, &r[0]));
  TT_CHECK(memcmp(r[0].out, r[1].out, (size_t)r[0].out_n * 4) != 0);
  run_free(&r[0]);
  run_free(&r[1]);
  /* unbound: the model's own copy again, of the path's kind */
  loom_model_bind_half(bound, NULL);
  TT_REQUIRE_OK(run_model(bound, &tok, &r[1]));
  TT_CHECK_EQ(loom_model_half_bytes(bound), (size_t)np * 4);
  run_free(&r[1]);
  if (g_half == LOOM_BF16 &&
      (loom_bf16_set_path(LOOM_BF16_PATH_AMX) == LOOM_OK ||
       loom_bf16_set_path(LOOM_BF16_PATH_AVX512_BF16) == LOOM_OK)) {
    TT_REQUIRE_OK(run_model(bound, &tok, &r[1]));
    TT_CHECK_EQ(loom_model_half_bytes(bound), (size_t)np * 2);
    run_free(&r[1]);
    TT_CHECK_OK(loom_bf16_set_path(LOOM_BF16_PATH_CONVERT));
  }
  TT_CHECK_OK(loom_f16_set_path(f16_was));
  loom_clear_error();
  loom_free(buf);
  loom_model_free(own);
  loom_model_free(bound);
}

/* Same bits at 1 and 2 threads, and with activation checkpointing. */
TT_TEST(half_same_bits) {
  int32_t ids[4 * 12];
  for (int i = 0; i < 4 * 12; i++)
    ids[i] = (i * 5 + 1) % 29;
  loom_tensor tok = loom_tensor_view(ids, LOOM_I32, 2, (int64_t[]){4, 12});
  run r[3];
  for (int k = 0; k < 3; k++) {
    loom_model *m;
    loom_gpt_opts o = tiny_gpt();
    o.checkpoint_every = k == 2 ? 1 : 0;
    TT_REQUIRE_OK(loom_gpt_new(&m, &o, NULL));
    TT_REQUIRE_OK(loom_model_set_precision(m, g_half));
    loom_set_threads(k == 1 ? 2 : 1);
    TT_REQUIRE_OK(run_model(m, &tok, &r[k]));
    loom_model_free(m);
  }
  loom_set_threads(0);
  for (int k = 1; k < 3; k++) {
    TT_CHECK(memcmp(r[0].out, r[k].out, (size_t)r[0].out_n * 4) == 0);
    TT_CHECK(memcmp(r[0].grads, r[k].grads, (size_t)r[0].np * 4) == 0);
  }
  for (int k = 0; k < 3; k++)
    run_free(&r[k]);
  /* fashion-cnn (narrow, 2x2 pools) at 1 and 2 threads */
  float *img = normal(6 * 784, 3);
  TT_REQUIRE(img);
  loom_tensor tc =
      loom_tensor_view(img, LOOM_F32, 4, (int64_t[]){6, 1, 28, 28});
  for (int k = 0; k < 2; k++) {
    loom_model *m;
    loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
    o.c1 = 6;
    o.c2 = 12;
    TT_REQUIRE_OK(loom_fashion_cnn_new(&m, &o, NULL));
    TT_REQUIRE_OK(loom_model_set_precision(m, g_half));
    loom_set_threads(k + 1);
    TT_REQUIRE_OK(run_model(m, &tc, &r[k]));
    loom_model_free(m);
  }
  loom_set_threads(0);
  TT_CHECK(memcmp(r[0].out, r[1].out, (size_t)r[0].out_n * 4) == 0);
  TT_CHECK(memcmp(r[0].grads, r[1].grads, (size_t)r[0].np * 4) == 0);
  TT_CHECK(memcmp(r[0].dinp, r[1].dinp, (size_t)r[0].in_n * 4) == 0);
  for (int k = 0; k < 2; k++)
    run_free(&r[k]);
  loom_free(img);
}

/* A module without a bf16 form (ops->f32_only; none of loom's own since
 * conv2d has one): an identity. */
static loom_status f32o_params(loom_module *m, loom_nn_visit *v) {
  (void)m;
  (void)v;
  return LOOM_OK;
}
static loom_status f32o_plan(loom_module *m, loom_nn_plan *p,
                             const loom_shape *in, loom_shape *out) {
  (void)m;
  (void)p;
  *out = *in;
  return LOOM_OK;
}
static loom_status f32o_forward(loom_module *m, loom_nn_ctx *ctx,
                                const void *in, const float **out) {
  (void)m;
  (void)ctx;
  *out = in;
  return LOOM_OK;
}
static loom_status f32o_backward(loom_module *m, loom_nn_ctx *ctx,
                                 const float *dout, float *dinp) {
  (void)ctx;
  if (dinp)
    loom_accumulate(dinp, dout, loom_shape_numel(&m->in));
  return LOOM_OK;
}
static void f32o_free(loom_module *m) { loom_free(m); }
static const loom_module_ops f32o_ops = {.name = "f32o",
                                         .params = f32o_params,
                                         .plan = f32o_plan,
                                         .forward = f32o_forward,
                                         .backward = f32o_backward,
                                         .free = f32o_free,
                                         .f32_only = true};

TT_TEST(half_errors) {
  loom_model *m;
  /* the CNN has a bf16 form now */
  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, NULL, NULL));
  TT_CHECK_OK(loom_model_set_precision(m, g_half));
  loom_model_free(m);
  loom_module *s, *k;
  TT_REQUIRE_OK(loom_sequential_new(&s));
  TT_REQUIRE_OK(loom_linear_new(&k, 4, 4, true));
  TT_REQUIRE_OK(loom_sequential_add(s, "fc", k));
  k = loom_calloc(1, sizeof *k);
  TT_REQUIRE(k);
  loom_module_init_base(k, &f32o_ops);
  TT_REQUIRE_OK(loom_sequential_add(s, "odd", k));
  TT_REQUIRE_OK(loom_model_new(&m, s, NULL));
  TT_CHECK(loom_model_set_precision(m, g_half) == LOOM_ERR_UNSUPPORTED);
  TT_CHECK(strstr(loom_last_error(), "odd (f32o)") != NULL);
  TT_CHECK_EQ(loom_model_precision(m), LOOM_F32);
  loom_model_free(m);
  TT_REQUIRE_OK(b_linear(&m));
  TT_CHECK(loom_model_set_precision(m, LOOM_F64) == LOOM_ERR_UNSUPPORTED);
  /* from one half type to the other: the copy is made again */
  TT_CHECK_OK(loom_model_set_precision(m, LOOM_BF16));
  TT_CHECK_OK(loom_model_set_precision(m, LOOM_F16));
  TT_CHECK_EQ(loom_model_precision(m), LOOM_F16);
  TT_CHECK_EQ(loom_model_half_bytes(m), (size_t)(37 * 23 + 23) * copy_bytes());
  TT_CHECK(loom_model_set_precision(m, LOOM_I32) == LOOM_ERR_UNSUPPORTED);
  /* refresh: negative counts and NULL ranges refused */
  TT_CHECK(loom_model_refresh_half(m, NULL, 1) == LOOM_ERR_INVALID_ARG);
  loom_range r0 = {0, 1};
  TT_CHECK(loom_model_refresh_half(m, &r0, -1) == LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_model_refresh_half(m, NULL, 0));
  TT_CHECK_OK(loom_model_set_precision(m, LOOM_F32));
  loom_model_free(m);
  /* NULL models: errors or harmless answers, never a crash */
  TT_CHECK(loom_model_set_precision(NULL, g_half) == LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_model_precision(NULL), LOOM_F32);
  TT_CHECK_EQ(loom_model_half_bytes(NULL), (size_t)0);
  TT_CHECK(loom_model_rounded_copy(NULL) == NULL);
  loom_model_params_updated(NULL);
  loom_model_bind_half(NULL, NULL);
  TT_CHECK(loom_model_refresh_half(NULL, &r0, 1) == LOOM_ERR_INVALID_ARG);
}

int main(void) {
  static const loom_dtype halves[] = {LOOM_BF16, LOOM_F16};
  /* the conversion path (bitwise against f32 on rounded operands) */
  TT_CHECK_OK(loom_bf16_set_path(LOOM_BF16_PATH_CONVERT));
  for (int i = 0; i < 2; i++) {
    g_half = halves[i];
    printf("%s:\n", loom_dtype_name(g_half));
    TT_RUN(modules_against_f32);
    TT_RUN(linear_exact);
    TT_RUN(conv2d_exact);
    TT_RUN(activation_memory);
    TT_RUN(copy_refresh);
    TT_RUN(copy_kinds);
    TT_RUN(half_same_bits);
    TT_RUN(half_errors);
  }
  /* bf16 on the CPU's bf16 unit, where there is one: every module within
   * the same tolerance of f32, the same bits at any thread count */
  g_half = LOOM_BF16;
  if (loom_bf16_set_path(LOOM_BF16_PATH_AMX) == LOOM_OK ||
      loom_bf16_set_path(LOOM_BF16_PATH_AVX512_BF16) == LOOM_OK) {
    printf("bf16 on %s:\n", loom_bf16_path_name(loom_bf16_get_path()));
    TT_RUN(modules_against_f32);
    TT_RUN(half_same_bits);
  }
  loom_clear_error();
  return tt_finish();
}
