/* Tests of nn models: parameter counts and layout, initialisation, the
 * activation arena, determinism across runs and thread counts, the gradient
 * hook, dropout keys, and error paths (bad shapes, allocation failures). */
#include <math.h>
#include <string.h>

#include "gradcheck.h"

static loom_gpt_opts tiny_gpt(void) {
  loom_gpt_opts o = loom_gpt_opts_default();
  o.vocab = 13;
  o.context = 8;
  o.n_layer = 2;
  o.d_model = 16;
  o.n_head = 2;
  return o;
}

/* ------------------------------------------------------------- layout */

static void check_contiguous(const loom_model *m) {
  int64_t off = 0;
  for (int i = 0; i < loom_model_num_views(m); i++) {
    const loom_param *v = loom_model_view(m, i);
    TT_CHECK_EQ(v->offset, off);
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
      n *= v->shape[d];
    TT_CHECK_EQ(v->numel, n);
    off += v->numel;
  }
  TT_CHECK_EQ(off, loom_model_num_params(m));
}

TT_TEST(test_param_counts) {
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, NULL, NULL));
  TT_CHECK_EQ(loom_model_num_params(m), 669706);
  TT_CHECK_EQ(loom_model_num_views(m), 6);
  TT_CHECK_STR(loom_model_view(m, 0)->name, "fc1.weight");
  TT_CHECK_STR(loom_model_view(m, 5)->name, "fc3.bias");
  check_contiguous(m);
  loom_model_free(m);

  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, NULL, NULL));
  TT_CHECK_EQ(loom_model_num_params(m), 62346);
  TT_CHECK_STR(loom_model_view(m, 0)->name, "conv1.weight");
  TT_CHECK_EQ(loom_model_view(m, 0)->ndim, 4);
  TT_CHECK_STR(loom_model_view(m, 5)->name, "fc.bias");
  check_contiguous(m);
  loom_model_free(m);

  TT_REQUIRE_OK(loom_gpt_new(&m, NULL, NULL));
  TT_CHECK_EQ(loom_model_num_params(m), 842496);
  /* emb (2) + 4 blocks x 12 + ln_f (2); the head is tied: no view. */
  TT_CHECK_EQ(loom_model_num_views(m), 52);
  TT_CHECK_STR(loom_model_view(m, 0)->name, "emb.tok.weight");
  TT_CHECK_STR(loom_model_view(m, 1)->name, "emb.pos.weight");
  TT_CHECK_STR(loom_model_view(m, 2)->name, "blocks.0.ln1.weight");
  TT_CHECK_STR(loom_model_view(m, 4)->name, "blocks.0.attn.qkv.weight");
  TT_CHECK_STR(loom_model_view(m, 13)->name, "blocks.0.mlp.proj.bias");
  TT_CHECK_STR(loom_model_view(m, 51)->name, "ln_f.bias");
  int i;
  TT_CHECK_OK(loom_model_find(m, "blocks.3.mlp.fc.weight", &i));
  TT_CHECK_EQ(loom_model_view(m, i)->shape[0], 512);
  TT_CHECK_EQ(loom_model_view(m, i)->shape[1], 128);
  TT_CHECK_EQ(loom_model_find(m, "head.weight", &i), LOOM_ERR_INVALID_ARG);
  check_contiguous(m);
  /* Decay: matmul weights and embeddings, not biases or norms. */
  for (int v = 0; v < loom_model_num_views(m); v++) {
    const loom_param *p = loom_model_view(m, v);
    bool want = p->ndim >= 2;
    TT_CHECK_EQ(p->decay, want);
  }
  loom_model_free(m);

  /* Without biases: no linear biases and no LayerNorm biases. */
  loom_gpt_opts o = loom_gpt_opts_default();
  o.bias = false;
  TT_REQUIRE_OK(loom_gpt_new(&m, &o, NULL));
  int64_t C = 128, L = 4;
  TT_CHECK_EQ(loom_model_num_params(m),
              256 * C + 128 * C + L * (12 * C * C + 2 * C) + C);
  loom_model_free(m);
}

TT_TEST(test_layout_hash) {
  loom_model *a, *b, *c;
  loom_gpt_opts o = tiny_gpt();
  loom_model_opts mo = loom_model_opts_default();
  mo.init = LOOM_INIT_GPT2;
  TT_REQUIRE_OK(loom_gpt_new(&a, &o, &mo));
  mo.seed = 99; /* values differ, layout does not */
  TT_REQUIRE_OK(loom_gpt_new(&b, &o, &mo));
  o.n_head = 4; /* same parameter layout: heads are not parameters */
  o.mlp_ratio = 2;
  TT_REQUIRE_OK(loom_gpt_new(&c, &o, &mo));
  TT_CHECK(loom_model_layout_hash(a) == loom_model_layout_hash(b));
  TT_CHECK(loom_model_layout_hash(a) != loom_model_layout_hash(c));
  loom_model_free(a);
  loom_model_free(b);
  loom_model_free(c);
}

/* ------------------------------------------------------ initialisation */

static void moments(const float *x, int64_t n, double *mean, double *std,
                    float *lo, float *hi) {
  double s = 0, s2 = 0;
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
    *lo = fminf(*lo, x[i]);
    *hi = fmaxf(*hi, x[i]);
  }
  *mean = s / n;
  *std = sqrt(s2 / n - *mean * *mean);
}

TT_TEST(test_init_torch) {
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, NULL, NULL));
  double mean, std;
  float lo, hi;
  const float *p = loom_model_params(m);
  const loom_param *w = loom_model_view(m, 0); /* fc1.weight, fan_in 784 */
  double bound = 1.0 / sqrt(784.0);
  moments(p + w->offset, w->numel, &mean, &std, &lo, &hi);
  TT_CHECK(lo >= -bound && hi <= bound);
  TT_CHECK_NEAR(std, bound / sqrt(3.0), 0.01 * bound);
  TT_CHECK_NEAR(mean, 0.0, 0.01 * bound);
  const loom_param *b = loom_model_view(m, 3); /* fc2.bias, fan_in 512 */
  moments(p + b->offset, b->numel, &mean, &std, &lo, &hi);
  TT_CHECK(lo >= -1.0 / sqrt(512.0) && hi <= 1.0 / sqrt(512.0));
  TT_CHECK(std > 0.0);
  loom_model_free(m);
}

TT_TEST(test_init_gpt2) {
  loom_model *m;
  TT_REQUIRE_OK(loom_gpt_new(&m, NULL, NULL));
  const float *p = loom_model_params(m);
  double mean, std;
  float lo, hi;
  int i;
  TT_REQUIRE_OK(loom_model_find(m, "emb.tok.weight", &i));
  const loom_param *v = loom_model_view(m, i);
  moments(p + v->offset, v->numel, &mean, &std, &lo, &hi);
  TT_CHECK_NEAR(std, 0.02, 0.0005);
  TT_REQUIRE_OK(loom_model_find(m, "blocks.1.attn.qkv.weight", &i));
  v = loom_model_view(m, i);
  moments(p + v->offset, v->numel, &mean, &std, &lo, &hi);
  TT_CHECK_NEAR(std, 0.02, 0.0005);
  /* Residual projections: 0.02 / sqrt(2 * 4 layers). */
  const char *proj[] = {"blocks.2.attn.proj.weight",
                        "blocks.0.mlp.proj.weight"};
  for (int k = 0; k < 2; k++) {
    TT_REQUIRE_OK(loom_model_find(m, proj[k], &i));
    v = loom_model_view(m, i);
    moments(p + v->offset, v->numel, &mean, &std, &lo, &hi);
    TT_CHECK_NEAR(std, 0.02 / sqrt(8.0), 0.0004);
  }
  const char *ones[] = {"blocks.0.ln1.weight", "ln_f.weight"};
  const char *zeros[] = {"blocks.0.ln1.bias", "blocks.3.mlp.fc.bias",
                         "blocks.1.attn.proj.bias", "ln_f.bias"};
  for (int k = 0; k < 2; k++) {
    TT_REQUIRE_OK(loom_model_find(m, ones[k], &i));
    v = loom_model_view(m, i);
    for (int64_t j = 0; j < v->numel; j++)
      TT_CHECK(p[v->offset + j] == 1.0f);
  }
  for (int k = 0; k < 4; k++) {
    TT_REQUIRE_OK(loom_model_find(m, zeros[k], &i));
    v = loom_model_view(m, i);
    for (int64_t j = 0; j < v->numel; j++)
      TT_CHECK(p[v->offset + j] == 0.0f);
  }
  loom_model_free(m);
}

TT_TEST(test_init_keys) {
  /* Same seed: bitwise the same; another seed: different; a parameter's
   * values do not depend on the layers after it. */
  loom_model *a, *b, *c, *d;
  loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
  TT_REQUIRE_OK(loom_fashion_mlp_new(&a, &o, NULL));
  TT_REQUIRE_OK(loom_fashion_mlp_new(&b, &o, NULL));
  loom_model_opts mo = loom_model_opts_default();
  mo.seed = 7;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&c, &o, &mo));
  o.classes = 12;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&d, &o, NULL));
  size_t bytes = (size_t)loom_model_num_params(a) * sizeof(float);
  TT_CHECK(memcmp(loom_model_params(a), loom_model_params(b), bytes) == 0);
  TT_CHECK(memcmp(loom_model_params(a), loom_model_params(c), bytes) != 0);
  int64_t first4 = loom_model_view(a, 4)->offset; /* fc1, fc2 */
  TT_CHECK(memcmp(loom_model_params(a), loom_model_params(d),
                  (size_t)first4 * sizeof(float)) == 0);
  /* Re-initialising gives the same values back. */
  memset(loom_model_params(a), 0, bytes);
  TT_CHECK_OK(loom_model_init_params(a, NULL));
  TT_CHECK(memcmp(loom_model_params(a), loom_model_params(b), bytes) == 0);
  /* he_normal: std sqrt(2/fan_in), zero biases. */
  mo = loom_model_opts_default();
  mo.init = LOOM_INIT_HE_NORMAL;
  TT_CHECK_OK(loom_model_init_params(a, &mo));
  double mean, std;
  float lo, hi;
  const loom_param *w = loom_model_view(a, 2);
  moments(loom_model_params(a) + w->offset, w->numel, &mean, &std, &lo, &hi);
  TT_CHECK_NEAR(std, sqrt(2.0 / 512.0), 0.01 * sqrt(2.0 / 512.0));
  TT_CHECK(loom_model_params(a)[loom_model_view(a, 1)->offset] == 0.0f);
  loom_init_scheme s;
  TT_CHECK_OK(loom_init_scheme_parse("gpt2", &s));
  TT_CHECK_EQ(s, LOOM_INIT_GPT2);
  TT_CHECK_EQ(loom_init_scheme_parse("xavier", &s), LOOM_ERR_INVALID_ARG);
  loom_model_free(a);
  loom_model_free(b);
  loom_model_free(c);
  loom_model_free(d);
}

/* ------------------------------------------------ training-step helpers */

typedef struct step_result {
  float *out;
  float *grads;
  double loss;
  int64_t correct;
} step_result;

/* One forward + cross-entropy + backward; copies output and gradients. */
static loom_status run_step(loom_model *m, const loom_tensor *in,
                            const int32_t *targets, step_result *r) {
  loom_xent *x;
  loom_tensor out, dout;
  loom_xent_stats s;
  LOOM_TRY(loom_xent_new(&x));
  loom_model_zero_grad(m);
  loom_status st = loom_model_forward(m, in, &out);
  if (st == LOOM_OK)
    st = loom_xent_forward(x, &out, targets, &s);
  if (st == LOOM_OK)
    st = loom_model_output_grad(m, &dout);
  if (st == LOOM_OK)
    st = loom_xent_backward(x, &dout, 1.0f);
  if (st == LOOM_OK)
    st = loom_model_backward(m, NULL, NULL);
  if (st == LOOM_OK && r) {
    int64_t n = loom_tensor_numel(&out);
    r->out = loom_malloc((size_t)n * sizeof(float));
    r->grads = loom_malloc((size_t)loom_model_num_params(m) * sizeof(float));
    if (!r->out || !r->grads)
      st = LOOM_ERR_NOMEM;
    else {
      memcpy(r->out, out.data, (size_t)n * sizeof(float));
      memcpy(r->grads, loom_model_grads(m),
             (size_t)loom_model_num_params(m) * sizeof(float));
      r->loss = s.loss;
      r->correct = s.correct;
    }
  }
  loom_xent_free(x);
  return st;
}

static void free_result(step_result *r) {
  loom_free(r->out);
  loom_free(r->grads);
}

/* Inputs and targets for the three reference models. */
typedef struct batch {
  loom_tensor in;
  int32_t *targets;
} batch;

static loom_status make_batch(batch *b, int which, int B, int T, int V) {
  memset(b, 0, sizeof *b);
  loom_rng r = loom_rng_init(31, (uint64_t)which);
  if (which == 2) {
    LOOM_TRY(loom_tensor_new(&b->in, LOOM_I32, 2, (int64_t[]){B, T}));
    int32_t *ids = b->in.data;
    for (int i = 0; i < B * T; i++)
      ids[i] = (int32_t)loom_rng_below(&r, (uint64_t)V);
    b->targets = loom_malloc((size_t)B * T * sizeof(int32_t));
    if (!b->targets)
      return LOOM_ERR_NOMEM;
    for (int i = 0; i < B * T; i++)
      b->targets[i] = (int32_t)loom_rng_below(&r, (uint64_t)V);
    return LOOM_OK;
  }
  LOOM_TRY(loom_tensor_new(&b->in, LOOM_F32, 4, (int64_t[]){B, 1, 28, 28}));
  loom_rng_fill_normal(&r, b->in.data, (size_t)B * 784, 0.0f, 1.0f);
  b->targets = loom_malloc((size_t)B * sizeof(int32_t));
  if (!b->targets)
    return LOOM_ERR_NOMEM;
  for (int i = 0; i < B; i++)
    b->targets[i] = (int32_t)loom_rng_below(&r, 10);
  return LOOM_OK;
}

static void free_batch(batch *b) {
  loom_tensor_free(&b->in);
  loom_free(b->targets);
}

static loom_status make_model(loom_model **m, int which, float dropout) {
  if (which == 0)
    return loom_fashion_mlp_new(m, NULL, NULL);
  if (which == 1)
    return loom_fashion_cnn_new(m, NULL, NULL);
  loom_gpt_opts o = loom_gpt_opts_default();
  o.n_layer = 2;
  o.dropout = dropout;
  return loom_gpt_new(m, &o, NULL);
}

/* ----------------------------------------------------------- determinism */

TT_TEST(test_determinism_threads) {
  const char *names[] = {"fashion-mlp", "fashion-cnn", "kjv-gpt"};
  for (int which = 0; which < 3; which++) {
    for (int drop = 0; drop < (which == 2 ? 2 : 1); drop++) {
      step_result r[3];
      memset(r, 0, sizeof r);
      int64_t n_out = 0, n_par = 0;
      batch b;
      int B = which == 2 ? 4 : 32;
      TT_REQUIRE_OK(make_batch(&b, which, B, 64, 256));
      /* run 0: 1 thread; run 1: 2 threads; run 2: 1 thread again. */
      for (int run = 0; run < 3; run++) {
        loom_set_threads(run == 1 ? 2 : 1);
        loom_model *m;
        TT_REQUIRE_OK(make_model(&m, which, drop ? 0.1f : 0.0f));
        loom_model_set_step(m, 5, 64);
        TT_CHECK_OK(run_step(m, &b.in, b.targets, &r[run]));
        loom_tensor out;
        TT_CHECK_OK(loom_model_forward(m, &b.in, &out));
        n_out = loom_tensor_numel(&out);
        n_par = loom_model_num_params(m);
        loom_model_free(m);
      }
      for (int run = 1; run < 3; run++) {
        if (!r[0].out || !r[run].out)
          continue;
        bool same_out =
            memcmp(r[0].out, r[run].out, (size_t)n_out * sizeof(float)) == 0;
        bool same_grad = memcmp(r[0].grads, r[run].grads,
                                (size_t)n_par * sizeof(float)) == 0;
        if (!same_out || !same_grad)
          fprintf(stderr,
                  "  %s%s: run %d (%d threads) differs from 1 thread "
                  "(output %s, gradients %s)\n",
                  names[which], drop ? " with dropout" : "", run,
                  run == 1 ? 2 : 1, same_out ? "same" : "DIFFERENT",
                  same_grad ? "same" : "DIFFERENT");
        TT_CHECK(same_out);
        TT_CHECK(same_grad);
        TT_CHECK(r[0].loss == r[run].loss);
      }
      for (int run = 0; run < 3; run++)
        free_result(&r[run]);
      free_batch(&b);
    }
  }
  loom_set_threads(1);
}

/* ------------------------------------------------------------ dropout */

TT_TEST(test_dropout_keys) {
  /* The mask of a sample depends on (seed, step, global sample index), not
   * on the batch it came in: rows 2,3 of a batch of 4 at base 0 equal rows
   * 0,1 of a batch of 2 at base 2 (two ranks vs one). */
  loom_module *d;
  TT_REQUIRE_OK(loom_dropout_new(&d, 0.5f));
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, d, NULL));
  enum { F = 300 };
  float ones[4 * F];
  for (int i = 0; i < 4 * F; i++)
    ones[i] = 1.0f;
  float y4[4 * F], y2[2 * F], y4b[4 * F];
  loom_tensor in4 = loom_tensor_view(ones, LOOM_F32, 2, (int64_t[]){4, F});
  loom_tensor in2 = loom_tensor_view(ones, LOOM_F32, 2, (int64_t[]){2, F});
  loom_tensor out;
  loom_model_set_step(m, 9, 0);
  TT_REQUIRE_OK(loom_model_forward(m, &in4, &out));
  memcpy(y4, out.data, sizeof y4);
  loom_model_set_step(m, 9, 2);
  TT_REQUIRE_OK(loom_model_forward(m, &in2, &out));
  memcpy(y2, out.data, sizeof y2);
  TT_CHECK(memcmp(y4 + 2 * F, y2, sizeof y2) == 0);
  /* About half dropped, the rest scaled by 2. */
  int kept = 0;
  for (int i = 0; i < 4 * F; i++) {
    TT_CHECK(y4[i] == 0.0f || y4[i] == 2.0f);
    kept += y4[i] != 0.0f;
  }
  TT_CHECK(kept > 4 * F * 4 / 10 && kept < 4 * F * 6 / 10);
  /* Another step gives another mask; eval mode is the identity. */
  loom_model_set_step(m, 10, 0);
  TT_REQUIRE_OK(loom_model_forward(m, &in4, &out));
  memcpy(y4b, out.data, sizeof y4b);
  TT_CHECK(memcmp(y4, y4b, sizeof y4) != 0);
  loom_model_set_training(m, false);
  TT_CHECK(!loom_model_training(m));
  TT_REQUIRE_OK(loom_model_forward(m, &in4, &out));
  TT_CHECK(memcmp(out.data, ones, sizeof y4) == 0);
  loom_model_free(m);

  /* A GPT with dropout in eval mode computes what the one without does. */
  loom_gpt_opts o = tiny_gpt();
  loom_model *a, *b;
  TT_REQUIRE_OK(loom_gpt_new(&a, &o, NULL));
  o.dropout = 0.2f;
  TT_REQUIRE_OK(loom_gpt_new(&b, &o, NULL));
  TT_CHECK(loom_model_layout_hash(a) == loom_model_layout_hash(b));
  loom_model_set_training(b, false);
  int32_t ids[2 * 8];
  for (int i = 0; i < 16; i++)
    ids[i] = (i * 7) % 13;
  loom_tensor t = loom_tensor_view(ids, LOOM_I32, 2, (int64_t[]){2, 8});
  loom_tensor oa, ob;
  TT_REQUIRE_OK(loom_model_forward(a, &t, &oa));
  TT_REQUIRE_OK(loom_model_forward(b, &t, &ob));
  TT_CHECK(memcmp(oa.data, ob.data, 2 * 8 * 13 * sizeof(float)) == 0);
  loom_model_set_training(b, true);
  TT_REQUIRE_OK(loom_model_forward(b, &t, &ob));
  TT_CHECK(memcmp(oa.data, ob.data, 2 * 8 * 13 * sizeof(float)) != 0);
  loom_model_free(a);
  loom_model_free(b);
}

/* --------------------------------------------------------------- hooks */

typedef struct hook_log {
  int n, cap;
  int index[128];
  int64_t offset[128], numel[128];
  float *snap;        /* gradients as they were when reported */
  const float *grads; /* the model's gradient buffer */
  int fail_at;        /* return an error at this call (or -1) */
} hook_log;

static loom_status record_hook(void *user, int index, int64_t offset,
                               int64_t numel) {
  hook_log *h = user;
  if (h->n == h->fail_at)
    return loom_error(LOOM_ERR_REMOTE, "hook failed on purpose");
  if (h->n < 128) {
    h->index[h->n] = index;
    h->offset[h->n] = offset;
    h->numel[h->n] = numel;
  }
  h->n++;
  memcpy(h->snap + offset, h->grads + offset, (size_t)numel * sizeof(float));
  return LOOM_OK;
}

TT_TEST(test_grad_hook) {
  for (int which = 0; which < 3; which++) {
    loom_model *m;
    TT_REQUIRE_OK(make_model(&m, which, 0.0f));
    batch b;
    TT_REQUIRE_OK(make_batch(&b, which, 2, 16, 256));
    hook_log h;
    memset(&h, 0, sizeof h);
    h.fail_at = -1;
    h.snap = loom_calloc((size_t)loom_model_num_params(m), sizeof(float));
    h.grads = loom_model_grads(m);
    TT_REQUIRE(h.snap);
    loom_model_set_grad_hook(m, record_hook, &h);
    /* Two micro-batches: the hook fires on each backward. */
    TT_CHECK_OK(run_step(m, &b.in, b.targets, NULL));
    int nv = loom_model_num_views(m);
    TT_CHECK_EQ(h.n, nv);
    for (int k = 0; k < nv && k < h.n; k++) {
      int want = nv - 1 - k; /* reverse forward order */
      TT_CHECK_EQ(h.index[k], want);
      TT_CHECK_EQ(h.offset[k], loom_model_view(m, want)->offset);
      TT_CHECK_EQ(h.numel[k], loom_model_view(m, want)->numel);
    }
    /* Final when reported: nothing changed afterwards (for the GPT this
     * includes the tied embedding, reported last). */
    TT_CHECK(memcmp(h.snap, loom_model_grads(m),
                    (size_t)loom_model_num_params(m) * sizeof(float)) == 0);
    /* An error from the hook stops backward and comes back from it. */
    h.n = 0;
    h.fail_at = 1;
    loom_tensor out;
    TT_CHECK_OK(loom_model_forward(m, &b.in, &out));
    TT_CHECK_EQ(loom_model_backward(m, NULL, NULL), LOOM_ERR_REMOTE);
    loom_model_set_grad_hook(m, NULL, NULL);
    loom_free(h.snap);
    free_batch(&b);
    loom_model_free(m);
  }
}

/* ------------------------------------------ arena, accumulation, grads */

TT_TEST(test_arena_and_steps) {
  loom_model *m;
  TT_REQUIRE_OK(make_model(&m, 2, 0.0f));
  batch big, small;
  TT_REQUIRE_OK(make_batch(&big, 2, 8, 32, 256));
  TT_REQUIRE_OK(make_batch(&small, 2, 3, 32, 256));
  loom_shape s = loom_shape_make(LOOM_I32, 2, (int64_t[]){8, 32});
  TT_REQUIRE_OK(loom_model_plan(m, &s));
  size_t arena = loom_model_arena_bytes(m);
  size_t act = 0, scratch = 0;
  TT_CHECK_EQ(loom_module_act_bytes(loom_model_root(m), &s, &act, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_model_act_bytes(m, &s, &act, &scratch));
  TT_CHECK(act > 0 && scratch > 0 && act + scratch <= arena);
  /* Steady state: no allocation per step, whatever the batch order. */
  loom_xent *x;
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_tensor out, dout;
  loom_xent_stats st;
  for (int i = 0; i < 4; i++) {
    batch *b = i % 2 ? &small : &big;
    long before = loom_alloc_count();
    TT_CHECK_OK(loom_model_forward(m, &b->in, &out));
    TT_CHECK_OK(loom_xent_forward(x, &out, b->targets, &st));
    TT_CHECK_OK(loom_model_output_grad(m, &dout));
    TT_CHECK_OK(loom_xent_backward(x, &dout, 1.0f));
    TT_CHECK_OK(loom_model_backward(m, NULL, NULL));
    if (i > 0)
      TT_CHECK_EQ(loom_alloc_count(), before);
  }
  TT_CHECK_EQ(loom_model_arena_bytes(m), arena);
  /* A longer batch grows the arena. */
  batch bigger;
  TT_REQUIRE_OK(make_batch(&bigger, 2, 16, 32, 256));
  TT_CHECK_OK(loom_model_forward(m, &bigger.in, &out));
  TT_CHECK(loom_model_arena_bytes(m) > arena);
  TT_CHECK_EQ(out.shape[0], 16);
  TT_CHECK_EQ(out.shape[2], 256);

  /* Backward adds: two backward passes give twice the gradient; binding an
   * external buffer sends gradients there. */
  int64_t n = loom_model_num_params(m);
  float *g1 = loom_malloc((size_t)n * sizeof(float));
  float *ext = loom_calloc((size_t)n, sizeof(float));
  TT_REQUIRE(g1 && ext);
  loom_model_zero_grad(m);
  TT_CHECK_OK(loom_model_forward(m, &big.in, &out));
  TT_CHECK_OK(loom_xent_forward(x, &out, big.targets, &st));
  TT_CHECK_OK(loom_model_output_grad(m, &dout));
  TT_CHECK_OK(loom_xent_backward(x, &dout, 1.0f));
  TT_CHECK_OK(loom_model_backward(m, NULL, NULL));
  memcpy(g1, loom_model_grads(m), (size_t)n * sizeof(float));
  TT_CHECK_OK(loom_model_backward(m, NULL, NULL));
  /* Not bitwise 2x: a GEMM with beta 1 may add its K-blocks one by one. */
  for (int64_t i = 0; i < n; i++)
    ext[i] = 2.0f * g1[i];
  TT_CHECK_CLOSE(loom_model_grads(m), ext, (size_t)n, 1e-7, 1e-5);
  memset(ext, 0, (size_t)n * sizeof(float));
  loom_model_bind_grads(m, ext);
  TT_CHECK(loom_model_grads(m) == ext);
  TT_CHECK_OK(loom_model_backward(m, NULL, NULL));
  TT_CHECK(memcmp(ext, g1, (size_t)n * sizeof(float)) == 0);
  loom_model_bind_grads(m, NULL);
  TT_CHECK(loom_model_grads(m) != ext);
  /* Bound parameters: a scaled copy changes the output; restoring the own
   * buffer gives the old output back bitwise. */
  float *own = loom_model_params(m);
  float *y0 = loom_malloc((size_t)loom_tensor_numel(&out) * sizeof(float));
  TT_REQUIRE(y0);
  TT_CHECK_OK(loom_model_forward(m, &big.in, &out));
  size_t ybytes = (size_t)loom_tensor_numel(&out) * sizeof(float);
  memcpy(y0, out.data, ybytes);
  for (int64_t i = 0; i < n; i++)
    ext[i] = 0.5f * own[i];
  loom_model_bind_params(m, ext);
  TT_CHECK(loom_model_params(m) == ext);
  TT_CHECK_OK(loom_model_forward(m, &big.in, &out));
  TT_CHECK(memcmp(y0, out.data, ybytes) != 0);
  loom_model_bind_params(m, NULL);
  TT_CHECK(loom_model_params(m) == own);
  TT_CHECK_OK(loom_model_forward(m, &big.in, &out));
  TT_CHECK(memcmp(y0, out.data, ybytes) == 0);
  loom_free(y0);
  loom_free(g1);
  loom_free(ext);
  loom_xent_free(x);
  free_batch(&big);
  free_batch(&small);
  free_batch(&bigger);
  loom_model_free(m);
}

TT_TEST(test_module_act_bytes) {
  /* A standalone linear layer: its output (N,OC) is its only activation. */
  loom_module *l;
  TT_REQUIRE_OK(loom_linear_new(&l, 5, 7, true));
  loom_shape s = loom_shape_make(LOOM_F32, 2, (int64_t[]){10, 5});
  size_t act = 0, scratch = 1;
  TT_CHECK_OK(loom_module_act_bytes(l, &s, &act, &scratch));
  TT_CHECK_EQ(act, (10 * 7 * 4 + 63) / 64 * 64);
  TT_CHECK_EQ(scratch, 0);
  TT_CHECK_STR(loom_module_type(l), "linear");
  s.dim[1] = 6;
  TT_CHECK_EQ(loom_module_act_bytes(l, &s, &act, NULL), LOOM_ERR_INVALID_ARG);
  loom_module_free(l);
}

TT_TEST(test_input_gradient) {
  /* dinput of the MLP against finite differences of the loss. */
  loom_fashion_mlp_opts o = {
      .in = 10, .hidden = 6, .n_hidden = 1, .classes = 4};
  loom_model *m;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, &o, NULL));
  loom_tensor in;
  TT_REQUIRE_OK(loom_tensor_new(&in, LOOM_F32, 2, (int64_t[]){3, 10}));
  loom_rng r = loom_rng_init(1, 1);
  loom_rng_fill_normal(&r, in.data, 30, 0.0f, 1.0f);
  int32_t t[3] = {0, 3, 1};
  gc g;
  TT_REQUIRE_OK(gc_init(&g, m, in, t));
  g.h = 1e-3;
  g.kinked = true;
  TT_CHECK_EQ(gc_check(&g, "mlp input"), 0);
  gc_release(&g);
  loom_tensor_free(&in);
  loom_model_free(m);
}

/* ----------------------------------------------------------- error paths */

static bool has(const char *s) { return strstr(loom_last_error(), s) != NULL; }

TT_TEST(test_errors_shapes) {
  loom_model *m;
  loom_tensor out;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, NULL, NULL));
  float xs[2 * 100] = {0};
  loom_tensor bad = loom_tensor_view(xs, LOOM_F32, 2, (int64_t[]){2, 100});
  TT_CHECK_EQ(loom_model_forward(m, &bad, &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("fc1 (linear)") && has("784"));
  /* backward without a successful forward */
  TT_CHECK_EQ(loom_model_backward(m, NULL, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("forward"));
  int32_t ids[4] = {0};
  loom_tensor iid = loom_tensor_view(ids, LOOM_I32, 2, (int64_t[]){2, 2});
  TT_CHECK_EQ(loom_model_forward(m, &iid, &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("f32"));
  TT_CHECK_EQ(loom_model_forward(m, NULL, &out), LOOM_ERR_INVALID_ARG);
  /* A good forward, then a wrong output gradient or input gradient. */
  float img[784 * 2] = {0};
  loom_tensor good = loom_tensor_view(img, LOOM_F32, 2, (int64_t[]){2, 784});
  TT_REQUIRE_OK(loom_model_forward(m, &good, &out));
  TT_CHECK_EQ(out.shape[1], 10);
  float g[30];
  loom_tensor dg = loom_tensor_view(g, LOOM_F32, 2, (int64_t[]){3, 10});
  TT_CHECK_EQ(loom_model_backward(m, &dg, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("output gradient"));
  loom_model_free(m);

  TT_REQUIRE_OK(loom_fashion_cnn_new(&m, NULL, NULL));
  float im3[3 * 28 * 28] = {0};
  loom_tensor c3 =
      loom_tensor_view(im3, LOOM_F32, 4, (int64_t[]){1, 3, 28, 28});
  TT_CHECK_EQ(loom_model_forward(m, &c3, &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("conv1 (conv2d)"));
  loom_tensor small =
      loom_tensor_view(im3, LOOM_F32, 4, (int64_t[]){1, 1, 20, 20});
  TT_CHECK_EQ(loom_model_forward(m, &small, &out), LOOM_ERR_INVALID_ARG);
  loom_model_free(m);

  loom_gpt_opts o = tiny_gpt();
  TT_REQUIRE_OK(loom_gpt_new(&m, &o, NULL));
  int32_t tok[2 * 9] = {0};
  loom_tensor longer = loom_tensor_view(tok, LOOM_I32, 2, (int64_t[]){2, 9});
  TT_CHECK_EQ(loom_model_forward(m, &longer, &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("emb (embedding)") && has("T <= 8"));
  tok[3] = 13; /* vocab is 13 */
  loom_tensor t8 = loom_tensor_view(tok, LOOM_I32, 2, (int64_t[]){2, 8});
  TT_CHECK_EQ(loom_model_forward(m, &t8, &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("outside [0, 13)"));
  tok[3] = 1;
  TT_REQUIRE_OK(loom_model_forward(m, &t8, &out));
  float din[16];
  loom_tensor dt = loom_tensor_view(din, LOOM_F32, 2, (int64_t[]){2, 8});
  TT_CHECK_EQ(loom_model_backward(m, &out, &dt), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("no gradient"));
  /* The loss: targets out of range, backward before forward, bad shape. */
  loom_xent *x;
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_tensor dl;
  TT_REQUIRE_OK(loom_model_output_grad(m, &dl));
  TT_CHECK_EQ(loom_xent_backward(x, &dl, 1.0f), LOOM_ERR_INVALID_ARG);
  int32_t tg[16] = {0};
  tg[5] = 13;
  TT_CHECK_EQ(loom_xent_forward(x, &out, tg, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("target 13"));
  tg[5] = -1;
  TT_CHECK_OK(loom_xent_forward(x, &out, tg, NULL));
  loom_tensor wrong =
      loom_tensor_view(dl.data, LOOM_F32, 2, (int64_t[]){2, 13});
  TT_CHECK_EQ(loom_xent_backward(x, &wrong, 1.0f), LOOM_ERR_INVALID_ARG);
  loom_xent_free(x);
  loom_model_free(m);
}

TT_TEST(test_errors_construction) {
  loom_module *a = NULL, *b = NULL, *s = NULL;
  loom_model *m = NULL;
  TT_CHECK_EQ(loom_linear_new(&a, 0, 3, true), LOOM_ERR_INVALID_ARG);
  TT_CHECK(a == NULL);
  TT_CHECK_EQ(loom_attention_new(&a, 10, 3, true), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("heads"));
  TT_CHECK_EQ(loom_dropout_new(&a, 1.0f), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_conv2d_new(&a, 1, 1, 3, 0, 0, true), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_maxpool2d_new(&a, 0, 1), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_embedding_new(&a, 0, 3, 0), LOOM_ERR_INVALID_ARG);
  loom_gpt_opts o = tiny_gpt();
  o.n_head = 3;
  TT_CHECK_EQ(loom_gpt_new(&m, &o, NULL), LOOM_ERR_INVALID_ARG);
  loom_fashion_cnn_opts co = loom_fashion_cnn_opts_default();
  co.in_h = 10;
  TT_CHECK_EQ(loom_fashion_cnn_new(&m, &co, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(m == NULL);
  /* Duplicate names; a module with two parents; an empty sequential. */
  TT_REQUIRE_OK(loom_sequential_new(&s));
  TT_REQUIRE_OK(loom_linear_new(&a, 2, 2, true));
  TT_REQUIRE_OK(loom_linear_new(&b, 2, 2, true));
  TT_CHECK_OK(loom_sequential_add(s, "x", a));
  TT_CHECK_EQ(loom_sequential_add(s, "y", a), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("already has a parent"));
  TT_CHECK_OK(loom_sequential_add(s, "x", b));
  TT_CHECK_EQ(loom_sequential_count(s), 2);
  TT_CHECK_EQ(loom_model_new(&m, s, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("x.weight"));
  TT_REQUIRE_OK(loom_sequential_new(&s));
  TT_REQUIRE_OK(loom_model_new(&m, s, NULL));
  TT_CHECK_EQ(loom_model_num_params(m), 0);
  float v[2] = {1, 2};
  loom_tensor in = loom_tensor_view(v, LOOM_F32, 1, (int64_t[]){2});
  loom_tensor out;
  TT_CHECK_EQ(loom_model_forward(m, &in, &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("no modules"));
  loom_model_free(m);
  /* A tied layer whose owner is not in the model. */
  loom_module *emb, *head;
  TT_REQUIRE_OK(loom_embedding_new(&emb, 5, 4, 0));
  TT_REQUIRE_OK(loom_linear_tied_new(&head, emb, 0));
  TT_CHECK_EQ(loom_model_new(&m, head, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("tied"));
  loom_module_free(emb);
  loom_model_free(NULL);
  loom_module_free(NULL);
  loom_xent_free(NULL);
  char buf[40];
  loom_shape sh = loom_shape_make(LOOM_F32, 3, (int64_t[]){2, 3, 4});
  TT_CHECK_STR(loom_shape_str(&sh, buf, sizeof buf), "f32(2,3,4)");
}

/* A model fixes its layout: a module added to its root (or to a sequential
 * nested in it) afterwards would have no views (param_first -1) and its
 * forward would read past the model's views. */
TT_TEST(test_sequential_add_after_model) {
  loom_module *seq, *inner, *res, *l1, *l2, *l3;
  TT_REQUIRE_OK(loom_sequential_new(&seq));
  TT_REQUIRE_OK(loom_sequential_new(&inner));
  TT_REQUIRE_OK(loom_linear_new(&l1, 2, 2, true));
  TT_REQUIRE_OK(loom_sequential_add(seq, "a", l1));
  TT_REQUIRE_OK(loom_residual_new(&res, inner));
  TT_REQUIRE_OK(loom_sequential_add(seq, "r", res));
  TT_REQUIRE_OK(loom_linear_new(&l3, 2, 2, true));
  /* before the model: adding to a nested sequential is fine */
  TT_REQUIRE_OK(loom_sequential_add(inner, "c", l3));
  loom_model *m;
  TT_REQUIRE_OK(loom_model_new(&m, seq, NULL));
  TT_REQUIRE_OK(loom_linear_new(&l2, 2, 2, true));
  TT_CHECK_EQ(loom_sequential_add(seq, "b", l2), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("part of a model"));
  TT_CHECK_EQ(loom_sequential_count(seq), 2);
  TT_REQUIRE_OK(loom_linear_new(&l2, 2, 2, true));
  TT_CHECK_EQ(loom_sequential_add(inner, "d", l2), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("part of a model"));
  TT_CHECK_EQ(loom_sequential_count(inner), 1);
  float x[4] = {1, 2, 3, 4};
  loom_tensor in = loom_tensor_view(x, LOOM_F32, 2, (int64_t[]){2, 2}), out;
  TT_CHECK_OK(loom_model_forward(m, &in, &out));
  loom_model_free(m);
}

/* A sequential added to itself, or to a sequential it holds, would make a
 * tree that every walk (free, listing, plan) recurses through forever. The
 * refused module stays the caller's (freeing it would free seq). */
TT_TEST(test_sequential_add_cycle) {
  loom_module *a, *b, *c, *r;
  TT_REQUIRE_OK(loom_sequential_new(&a));
  TT_CHECK_EQ(loom_sequential_add(a, "self", a), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("cycle"));
  TT_CHECK_EQ(loom_sequential_count(a), 0);
  TT_REQUIRE_OK(loom_sequential_new(&b));
  TT_REQUIRE_OK(loom_sequential_add(a, "b", b));
  TT_CHECK_EQ(loom_sequential_add(b, "a", a), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("cycle"));
  /* deeper: a > b > residual > c, then c gets a */
  TT_REQUIRE_OK(loom_sequential_new(&c));
  TT_REQUIRE_OK(loom_residual_new(&r, c));
  TT_REQUIRE_OK(loom_sequential_add(b, "r", r));
  TT_CHECK_EQ(loom_sequential_add(c, "a", a), LOOM_ERR_INVALID_ARG);
  TT_CHECK(has("cycle"));
  TT_CHECK_EQ(loom_sequential_count(b), 1);
  TT_CHECK_EQ(loom_sequential_count(c), 0);
  loom_module_free(a); /* frees b, r and c; no recursion without end */
}

/* Every allocation in building, planning and one training step fails in
 * turn: each failure is LOOM_ERR_NOMEM and nothing leaks (ASan). */
static loom_status build_and_step(int which) {
  loom_model *m = NULL;
  batch b;
  memset(&b, 0, sizeof b);
  loom_status st;
  if (which == 2) {
    loom_gpt_opts o = tiny_gpt();
    o.dropout = 0.1f;
    st = loom_gpt_new(&m, &o, NULL);
  } else if (which == 1) {
    st = loom_fashion_cnn_new(&m, NULL, NULL);
  } else {
    st = loom_fashion_mlp_new(&m, NULL, NULL);
  }
  if (st == LOOM_OK)
    st = make_batch(&b, which, 2, 8, 13);
  if (st == LOOM_OK)
    st = run_step(m, &b.in, b.targets, NULL);
  free_batch(&b);
  loom_model_free(m);
  return st;
}

TT_TEST(test_alloc_failures) {
  for (int which = 0; which < 3; which++) {
    int nomem = 0;
    bool ok = false;
    for (long n = 1; n < 500 && !ok; n++) {
      loom_alloc_fail_after(n);
      loom_status st = build_and_step(which);
      loom_alloc_fail_after(0);
      if (st == LOOM_OK)
        ok = true;
      else {
        if (st != LOOM_ERR_NOMEM)
          fprintf(stderr, "  model %d, failing allocation %ld: %s (%s)\n",
                  which, n, loom_status_name(st), loom_last_error());
        TT_CHECK_EQ(st, LOOM_ERR_NOMEM);
        nomem++;
      }
    }
    TT_CHECK(ok);
    TT_CHECK(nomem >= 5);
  }
}

/* ------------------------------------------------ activation checkpointing */

/* Output, gradients and the hook's order of a 4-block GPT with dropout,
 * checkpointed in segments of K blocks (0: not at all), after two steps
 * (gradients accumulate); also its activation bytes. */
typedef struct ac_run {
  float *out, *grads;
  int order[64], norder;
  size_t act;
} ac_run;

static loom_status ac_hook(void *user, int index, int64_t offset,
                           int64_t numel) {
  ac_run *r = user;
  (void)offset;
  (void)numel;
  if (r->norder < 64)
    r->order[r->norder++] = index;
  return LOOM_OK;
}

static void ac_train(int every, ac_run *r) {
  loom_gpt_opts o = tiny_gpt();
  o.n_layer = 4;
  o.dropout = 0.2f;
  o.checkpoint_every = every;
  loom_model_opts mo = loom_model_opts_default();
  mo.init = LOOM_INIT_GPT2;
  mo.seed = 7;
  loom_model *m;
  TT_REQUIRE_OK(loom_gpt_new(&m, &o, &mo));
  enum { B = 3, T = 8 };
  int32_t ids[B * T];
  for (int i = 0; i < B * T; i++)
    ids[i] = (i * 7 + 3) % 13;
  int64_t d[2] = {B, T};
  loom_tensor in = loom_tensor_view(ids, LOOM_I32, 2, d);
  loom_shape shp = loom_shape_make(LOOM_I32, 2, d);
  size_t scratch;
  TT_REQUIRE_OK(loom_model_act_bytes(m, &shp, &r->act, &scratch));
  loom_model_set_grad_hook(m, ac_hook, r);
  int64_t n = loom_model_num_params(m), nout = (int64_t)B * T * 13;
  r->out = malloc((size_t)nout * sizeof(float));
  for (int step = 0; step < 2; step++) {
    loom_model_set_step(m, (uint64_t)step, 0);
    loom_tensor out, dout;
    TT_REQUIRE_OK(loom_model_forward(m, &in, &out));
    memcpy(r->out, out.data, (size_t)nout * sizeof(float));
    TT_REQUIRE_OK(loom_model_output_grad(m, &dout));
    float *g = dout.data;
    for (int64_t i = 0; i < nout; i++)
      g[i] = 0.01f * (float)((i * 5) % 11) - 0.05f;
    TT_REQUIRE_OK(loom_model_backward(m, NULL, NULL));
  }
  r->grads = malloc((size_t)n * sizeof(float));
  memcpy(r->grads, loom_model_grads(m), (size_t)n * sizeof(float));
  r->norder = r->norder > 64 ? 64 : r->norder;
  TT_CHECK_EQ(n, loom_model_num_params(m));
  loom_model_free(m);
}

TT_TEST(test_activation_checkpointing) {
  ac_run ref = {0};
  ac_train(0, &ref);
  int64_t n = 0;
  {
    loom_gpt_opts o = tiny_gpt();
    o.n_layer = 4;
    loom_model *m;
    TT_REQUIRE_OK(loom_gpt_new(&m, &o, NULL));
    n = loom_model_num_params(m);
    loom_model_free(m);
  }
  for (int every = 1; every <= 4; every++) {
    ac_run r = {0};
    ac_train(every, &r);
    TT_CHECK(memcmp(r.out, ref.out, (size_t)3 * 8 * 13 * sizeof(float)) == 0);
    TT_CHECK(memcmp(r.grads, ref.grads, (size_t)n * sizeof(float)) == 0);
    TT_CHECK_EQ(r.norder, ref.norder);
    TT_CHECK(memcmp(r.order, ref.order, sizeof r.order) == 0);
    if (every < 4) /* one segment of all 4 blocks saves nothing */
      TT_CHECK(r.act < ref.act);
    printf(
        "checkpoint every %d block(s): activations %zu bytes (%zu without)\n",
        every, r.act, ref.act);
    free(r.out);
    free(r.grads);
  }
  free(ref.out);
  free(ref.grads);
  /* Not nestable. */
  loom_module *inner, *outer, *seg;
  TT_REQUIRE_OK(loom_sequential_new(&inner));
  TT_REQUIRE_OK(loom_checkpoint_new(&seg, inner));
  TT_REQUIRE_OK(loom_checkpoint_new(&outer, seg));
  int64_t d2[2] = {2, 4};
  loom_shape s2 = loom_shape_make(LOOM_F32, 2, d2);
  size_t a, sc;
  TT_CHECK_EQ(loom_module_act_bytes(outer, &s2, &a, &sc), LOOM_ERR_INVALID_ARG);
  loom_module_free(outer);
}

int main(void) {
  /* Small shapes: 1 thread unless a test sets its own count. */
  loom_set_threads(1);
  TT_RUN(test_param_counts);
  TT_RUN(test_activation_checkpointing);
  TT_RUN(test_layout_hash);
  TT_RUN(test_init_torch);
  TT_RUN(test_init_gpt2);
  TT_RUN(test_init_keys);
  TT_RUN(test_determinism_threads);
  TT_RUN(test_dropout_keys);
  TT_RUN(test_grad_hook);
  TT_RUN(test_arena_and_steps);
  TT_RUN(test_module_act_bytes);
  TT_RUN(test_input_gradient);
  TT_RUN(test_errors_shapes);
  TT_RUN(test_errors_construction);
  TT_RUN(test_sequential_add_after_model);
  TT_RUN(test_sequential_add_cycle);
  TT_RUN(test_alloc_failures);
  return tt_finish();
}
