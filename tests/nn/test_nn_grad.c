/* Gradient checks of every nn module type and the cross-entropy loss:
 * backward against central finite differences, for inputs and parameters. */
#include <math.h>
#include <string.h>

#include "gradcheck.h"

/* Runs the check on a model made of `root` with a random normal f32 input
 * of the given shape. */
static void check_module(const char *what, loom_module *root, int ndim,
                         const int64_t *shape, uint64_t seed) {
  loom_model *m = NULL;
  loom_model_opts mo = loom_model_opts_default();
  mo.seed = seed;
  TT_REQUIRE_OK(loom_model_new(&m, root, &mo));
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, ndim, shape));
  gc_fill_normal(in.data, loom_tensor_numel(&in), seed + 1, 1.0f);
  gc g;
  TT_CHECK_OK(gc_init(&g, m, in, NULL));
  TT_CHECK_EQ(gc_check(&g, what), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

TT_TEST(grad_linear) {
  loom_module *l;
  TT_REQUIRE_OK(loom_linear_new(&l, 5, 4, true));
  check_module("linear", l, 2, (int64_t[]){3, 5}, 1);
  TT_REQUIRE_OK(loom_linear_new(&l, 5, 3, false));
  check_module("linear 3-D, no bias", l, 3, (int64_t[]){2, 3, 5}, 2);
}

TT_TEST(grad_conv2d) {
  loom_module *c;
  TT_REQUIRE_OK(loom_conv2d_new(&c, 2, 3, 3, 1, 1, true));
  check_module("conv2d pad 1", c, 4, (int64_t[]){2, 2, 6, 5}, 3);
  TT_REQUIRE_OK(loom_conv2d_new(&c, 2, 2, 3, 2, 0, true));
  check_module("conv2d stride 2", c, 4, (int64_t[]){2, 2, 7, 6}, 4);
}

/* Inputs away from kinks: every |x| >= 0.1, so a step of h = 0.01 never
 * crosses zero. */
static void fill_away_from_zero(float *x, int64_t n, uint64_t seed) {
  loom_rng r = loom_rng_init(seed, 5);
  for (int64_t i = 0; i < n; i++) {
    float u = 0.1f + loom_rng_uniform(&r);
    x[i] = (loom_rng_u32(&r) & 1) ? u : -u;
  }
}

static void check_kinked(const char *what, loom_module *root, int ndim,
                         const int64_t *shape, bool distinct) {
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, root, NULL));
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, ndim, shape));
  int64_t n = loom_tensor_numel(&in);
  float *x = in.data;
  if (distinct) {
    /* A shuffled ladder of values 0.05 apart: window maxima are unique and
     * stay maxima under a step of 0.01. */
    loom_rng r = loom_rng_init(9, 9);
    for (int64_t i = 0; i < n; i++)
      x[i] = 0.05f * (float)(i - n / 2);
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)loom_rng_below(&r, (uint64_t)i + 1);
      float t = x[i];
      x[i] = x[j];
      x[j] = t;
    }
  } else {
    fill_away_from_zero(x, n, 11);
  }
  gc g;
  TT_CHECK_OK(gc_init(&g, m, in, NULL));
  TT_CHECK_EQ(gc_check(&g, what), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

TT_TEST(grad_maxpool2d) {
  loom_module *p;
  TT_REQUIRE_OK(loom_maxpool2d_new(&p, 2, 2));
  check_kinked("maxpool2d", p, 4, (int64_t[]){2, 2, 4, 6}, true);
  TT_REQUIRE_OK(loom_maxpool2d_new(&p, 3, 2));
  check_kinked("maxpool2d k3 s2", p, 4, (int64_t[]){1, 2, 7, 5}, true);
}

TT_TEST(grad_relu) {
  loom_module *r;
  TT_REQUIRE_OK(loom_relu_new(&r));
  check_kinked("relu", r, 2, (int64_t[]){4, 7}, false);
}

TT_TEST(grad_gelu) {
  loom_module *g;
  TT_REQUIRE_OK(loom_gelu_new(&g));
  check_module("gelu", g, 3, (int64_t[]){2, 3, 5}, 5);
}

TT_TEST(grad_layernorm) {
  loom_module *l;
  TT_REQUIRE_OK(loom_layernorm_new(&l, 6, true));
  check_module("layernorm", l, 2, (int64_t[]){4, 6}, 6);
  TT_REQUIRE_OK(loom_layernorm_new(&l, 5, false));
  check_module("layernorm without bias", l, 3, (int64_t[]){2, 2, 5}, 7);
}

/* Embeddings take ids: only parameter gradients. */
static void check_embedding(const char *what, int V, int C, int T_max, int ndim,
                            const int64_t *shape) {
  loom_module *e;
  TT_REQUIRE_OK(loom_embedding_new(&e, V, C, T_max));
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, e, NULL));
  loom_tensor ids;
  TT_REQUIRE_OK(loom_tensor_new(&ids, LOOM_I32, ndim, shape));
  int32_t *id = ids.data;
  for (int64_t i = 0; i < loom_tensor_numel(&ids); i++)
    id[i] = (int32_t)((i * 5 + 2) % V); /* repeats: scatter-add */
  gc g;
  TT_CHECK_OK(gc_init(&g, m, ids, NULL));
  TT_CHECK_EQ(gc_check(&g, what), 0);
  gc_release(&g);
  loom_tensor_free(&ids);
  loom_model_free(m);
}

TT_TEST(grad_embedding) {
  check_embedding("token embedding", 7, 5, 0, 2, (int64_t[]){2, 6});
}

TT_TEST(grad_position_embedding) {
  check_embedding("token + position embedding", 6, 4, 5, 2, (int64_t[]){3, 4});
}

TT_TEST(grad_attention) {
  loom_module *a;
  TT_REQUIRE_OK(loom_attention_new(&a, 8, 2, true));
  check_module("attention", a, 3, (int64_t[]){2, 4, 8}, 8);
  TT_REQUIRE_OK(loom_attention_new(&a, 6, 3, false));
  check_module("attention, 3 heads, no bias", a, 3, (int64_t[]){1, 5, 6}, 9);
}

TT_TEST(grad_mlp) {
  loom_module *p;
  TT_REQUIRE_OK(loom_mlp_new(&p, 4, 16, true, 0.0f));
  check_module("mlp", p, 3, (int64_t[]){2, 3, 4}, 10);
}

TT_TEST(grad_transformer_block) {
  loom_module *b;
  TT_REQUIRE_OK(loom_transformer_block_new(&b, 8, 2, 4, true, 0.0f));
  check_module("transformer block", b, 3, (int64_t[]){2, 4, 8}, 11);
}

TT_TEST(grad_sequential) {
  loom_module *s, *k;
  TT_REQUIRE_OK(loom_sequential_new(&s));
  TT_REQUIRE_OK(loom_linear_new(&k, 5, 6, true));
  TT_REQUIRE_OK(loom_sequential_add(s, "a", k));
  TT_REQUIRE_OK(loom_gelu_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(s, "act", k));
  TT_REQUIRE_OK(loom_linear_new(&k, 6, 3, true));
  TT_REQUIRE_OK(loom_sequential_add(s, "b", k));
  check_module("sequential", s, 2, (int64_t[]){4, 5}, 12);
}

TT_TEST(grad_residual) {
  loom_module *r, *k;
  TT_REQUIRE_OK(loom_linear_new(&k, 5, 5, true));
  TT_REQUIRE_OK(loom_residual_new(&r, k));
  check_module("residual", r, 2, (int64_t[]){3, 5}, 13);
}

TT_TEST(grad_dropout) {
  /* A fixed step and sample base fix the masks, so the objective is
   * differentiable and finite differences see the same mask. */
  loom_module *s, *k;
  TT_REQUIRE_OK(loom_sequential_new(&s));
  TT_REQUIRE_OK(loom_linear_new(&k, 6, 8, true));
  TT_REQUIRE_OK(loom_sequential_add(s, "fc", k));
  TT_REQUIRE_OK(loom_dropout_new(&k, 0.4f));
  TT_REQUIRE_OK(loom_sequential_add(s, "drop", k));
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, s, NULL));
  loom_model_set_step(m, 3, 100);
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, 2, (int64_t[]){5, 6}));
  gc_fill_normal(in.data, 30, 14, 1.0f);
  gc g;
  TT_CHECK_OK(gc_init(&g, m, in, NULL));
  TT_CHECK_EQ(gc_check(&g, "dropout (training)"), 0);
  loom_model_set_training(m, false);
  TT_CHECK_EQ(gc_check(&g, "dropout (eval)"), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

TT_TEST(grad_flatten) {
  loom_module *s, *k;
  TT_REQUIRE_OK(loom_sequential_new(&s));
  TT_REQUIRE_OK(loom_flatten_new(&k));
  TT_REQUIRE_OK(loom_sequential_add(s, "flatten", k));
  TT_REQUIRE_OK(loom_linear_new(&k, 12, 3, true));
  TT_REQUIRE_OK(loom_sequential_add(s, "fc", k));
  check_module("flatten", s, 4, (int64_t[]){2, 3, 2, 2}, 15);
  TT_REQUIRE_OK(loom_flatten_new(&k));
  check_module("flatten alone", k, 3, (int64_t[]){2, 3, 2}, 16);
}

/* The loss alone: d(mean loss)/dlogits against finite differences, with an
 * ignored row and a scale. */
TT_TEST(grad_crossentropy) {
  enum { N = 5, V = 7 };
  float z[N * V], dz[N * V], fd[N * V];
  int32_t t[N] = {3, -1, 0, 6, 3};
  gc_fill_normal(z, N * V, 17, 2.0f);
  loom_tensor logits = loom_tensor_view(z, LOOM_F32, 2, (int64_t[]){N, V});
  loom_tensor dlogits = loom_tensor_view(dz, LOOM_F32, 2, (int64_t[]){N, V});
  loom_xent *x;
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_xent_stats s;
  TT_REQUIRE_OK(loom_xent_forward(x, &logits, t, &s));
  TT_CHECK_EQ(s.count, 4);
  const float scale = 0.5f;
  TT_REQUIRE_OK(loom_xent_backward(x, &dlogits, scale));
  for (int i = 0; i < N * V; i++) {
    float orig = z[i];
    double h = 1e-2;
    z[i] = (float)(orig + h);
    float up = z[i];
    loom_xent_forward(x, &logits, t, &s);
    double lp = s.loss;
    z[i] = (float)(orig - h);
    float dn = z[i];
    loom_xent_forward(x, &logits, t, &s);
    double lm = s.loss;
    z[i] = orig;
    fd[i] = (float)(scale * (lp - lm) / ((double)up - (double)dn));
  }
  TT_CHECK_CLOSE(dz, fd, N * V, 1e-4, 1e-2);
  /* The ignored row has no gradient. */
  for (int j = 0; j < V; j++)
    TT_CHECK(dz[1 * V + j] == 0.0f);
  /* Loss and accuracy against a direct computation in double. */
  TT_REQUIRE_OK(loom_xent_forward(x, &logits, t, &s));
  double sum = 0;
  int correct = 0;
  for (int i = 0; i < N; i++) {
    if (t[i] < 0)
      continue;
    double mx = -INFINITY, se = 0;
    int best = 0;
    for (int j = 0; j < V; j++) {
      if (z[i * V + j] > mx) {
        mx = z[i * V + j];
        best = j;
      }
    }
    for (int j = 0; j < V; j++)
      se += exp(z[i * V + j] - mx);
    sum += -(z[i * V + t[i]] - mx - log(se));
    correct += best == t[i];
  }
  TT_CHECK_NEAR(s.loss, sum / 4, 1e-5);
  TT_CHECK_NEAR(s.loss_sum, sum, 4e-5);
  TT_CHECK_EQ(s.correct, correct);
  loom_xent_free(x);
}

/* Accuracy counts the rows whose first largest logit is the target, as the
 * scan `best = 0; if (z[j] > z[best]) best = j` decides: ties to the first,
 * -0 and +0 equal, a NaN never wins (in row[0] it keeps 0), infinities,
 * rows long enough for the 4-lane search and a tail. */
static int scan_argmax(const float *z, int V) {
  int best = 0;
  for (int j = 1; j < V; j++)
    if (z[j] > z[best])
      best = j;
  return best;
}

TT_TEST(xent_accuracy_argmax) {
  enum { V = 23 };
  float rows[][V] = {{0}, {0}, {0}, {0}, {0}, {0}, {0}};
  gc_fill_normal(rows[0], V, 5, 1.0f);
  memcpy(rows[1], rows[0], sizeof rows[0]);
  rows[1][7] = rows[1][19] = 9.0f; /* a tie: the first */
  rows[2][3] = -0.0f;              /* all zeros, -0 before the rest */
  memcpy(rows[3], rows[0], sizeof rows[0]);
  rows[3][5] = NAN; /* a NaN in the middle never wins */
  rows[3][21] = 50.0f;
  memcpy(rows[4], rows[0], sizeof rows[0]);
  rows[4][0] = NAN; /* in row[0]: the scan keeps 0 */
  rows[4][9] = 50.0f;
  memcpy(rows[5], rows[0], sizeof rows[0]);
  rows[5][22] = INFINITY; /* in the tail */
  rows[5][2] = INFINITY;
  for (int j = 0; j < V; j++)
    rows[6][j] = -INFINITY;
  loom_xent *x;
  TT_REQUIRE_OK(loom_xent_new(&x));
  for (int r = 0; r < 7; r++)
    for (int v = 3; v <= V; v += 10) { /* 3: the scan alone; 13, 23 */
      loom_tensor logits =
          loom_tensor_view(rows[r], LOOM_F32, 2, (int64_t[]){1, v});
      const int want = scan_argmax(rows[r], v);
      for (int32_t t = 0; t < v; t++) {
        loom_xent_stats st;
        TT_REQUIRE_OK(loom_xent_forward(x, &logits, &t, &st));
        if (st.correct != (t == want))
          fprintf(stderr, "  row %d V %d target %d: correct %lld, argmax %d\n",
                  r, v, t, (long long)st.correct, want);
        TT_CHECK_EQ(st.correct, t == want);
      }
    }
  loom_xent_free(x);
}

int main(void) {
  loom_set_threads(1); /* tiny shapes: threads would only add overhead */
  TT_RUN(xent_accuracy_argmax);
  TT_RUN(grad_linear);
  TT_RUN(grad_conv2d);
  TT_RUN(grad_maxpool2d);
  TT_RUN(grad_relu);
  TT_RUN(grad_gelu);
  TT_RUN(grad_layernorm);
  TT_RUN(grad_embedding);
  TT_RUN(grad_position_embedding);
  TT_RUN(grad_attention);
  TT_RUN(grad_mlp);
  TT_RUN(grad_transformer_block);
  TT_RUN(grad_sequential);
  TT_RUN(grad_residual);
  TT_RUN(grad_dropout);
  TT_RUN(grad_flatten);
  TT_RUN(grad_crossentropy);
  return tt_finish();
}
