/* Tests of the optimizers: PyTorch reference values, hand-computed steps,
 * ranged and sharded steps, thread-count determinism, state for
 * checkpoints, invalid options and allocation failures. */
#include <string.h>

#include "loom/kernels.h"
#include "loom/optim.h"
#include "ref_torch.h"
#include "tt.h"

/* The layout of gen_ref.py: N = 37 elements in four views. */
#define REF_N 37
static const float ref_lrs[4] = {0.1f, 0.05f, 0.02f, 0.05f};

static void ref_views(loom_param v[4]) {
  static const struct {
    const char *name;
    int64_t off, numel;
    bool decay;
  } t[4] = {{"fc1.weight", 0, 20, true},
            {"fc1.bias", 20, 5, false},
            {"fc2.weight", 25, 10, true},
            {"fc2.bias", 35, 2, false}};
  memset(v, 0, 4 * sizeof *v);
  for (int i = 0; i < 4; i++) {
    snprintf(v[i].name, sizeof v[i].name, "%s", t[i].name);
    v[i].offset = t[i].off;
    v[i].numel = t[i].numel;
    v[i].ndim = 1;
    v[i].shape[0] = t[i].numel;
    v[i].decay = t[i].decay;
  }
}

/* Exact binary fractions, as gen_ref.py. */
static float ref_p0(int i) { return (float)((i * 7) % 19 - 9) / 16.0f; }
static float ref_grad(int i, int s) {
  return (float)((i * 5 + s * 3) % 23 - 11) / 32.0f;
}

TT_TEST(test_kind_names) {
  loom_optim_kind k;
  for (int i = 0; i < LOOM_OPTIM_KIND_COUNT; i++) {
    TT_CHECK_OK(loom_optim_kind_parse(loom_optim_kind_name(i), &k));
    TT_CHECK_EQ(k, i);
  }
  TT_CHECK_STR(loom_optim_kind_name(LOOM_OPTIM_ADAMW), "adamw");
  TT_CHECK_STR(loom_optim_kind_name(LOOM_OPTIM_KIND_COUNT), "?");
  TT_CHECK_EQ(loom_optim_kind_parse("adam", &k), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "'adam'") != NULL);
  TT_CHECK_EQ(loom_optim_kind_parse(NULL, &k), LOOM_ERR_INVALID_ARG);
}

typedef struct ref_case {
  const char *name;
  loom_optim_kind kind;
  double momentum, beta1, beta2, eps, wd;
  bool nesterov, masked, null_views;
  const float *p, *s0, *s1; /* expected params and state buffers */
} ref_case;

TT_TEST(test_torch_reference) {
  const ref_case cases[] = {
      {"sgd_plain", LOOM_OPTIM_SGD, 0, 0, 0, 0, 0, false, false, true,
       ref_sgd_plain_p, NULL, NULL},
      {"sgd_momentum", LOOM_OPTIM_SGD, 0.9, 0, 0, 0, 0, false, false, false,
       ref_sgd_momentum_p, ref_sgd_momentum_buf, NULL},
      {"sgd_nesterov_wd_masked", LOOM_OPTIM_SGD, 0.9, 0, 0, 0, 0.01, true, true,
       false, ref_sgd_nesterov_wd_masked_p, ref_sgd_nesterov_wd_masked_buf,
       NULL},
      {"sgd_momentum_wd_all", LOOM_OPTIM_SGD, 0.5, 0, 0, 0, 0.1, false, false,
       false, ref_sgd_momentum_wd_all_p, ref_sgd_momentum_wd_all_buf, NULL},
      {"adamw_masked", LOOM_OPTIM_ADAMW, 0, 0.9, 0.999, 1e-8, 0.1, false, true,
       false, ref_adamw_masked_p, ref_adamw_masked_m, ref_adamw_masked_v},
      {"adamw_all", LOOM_OPTIM_ADAMW, 0, 0.8, 0.99, 1e-3, 0.1, false, false,
       true, ref_adamw_all_p, ref_adamw_all_m, ref_adamw_all_v},
      {"adamw_nodecay", LOOM_OPTIM_ADAMW, 0, 0.9, 0.999, 1e-8, 0, false, true,
       false, ref_adamw_nodecay_p, ref_adamw_nodecay_m, ref_adamw_nodecay_v},
  };
  loom_param views[4];
  ref_views(views);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const ref_case *rc = &cases[c];
    loom_optim_opts opts = loom_optim_opts_default();
    opts.kind = rc->kind;
    opts.momentum = rc->momentum;
    opts.nesterov = rc->nesterov;
    opts.beta1 = rc->beta1;
    opts.beta2 = rc->beta2;
    opts.eps = rc->eps;
    opts.weight_decay = rc->wd;
    opts.decay_all = !rc->masked;
    loom_optim *o = NULL;
    TT_REQUIRE_OK(loom_optim_new(&o, &opts, rc->null_views ? NULL : views,
                                 rc->null_views ? 0 : 4, REF_N));
    float p[REF_N], g[REF_N];
    for (int i = 0; i < REF_N; i++)
      p[i] = ref_p0(i);
    for (int s = 0; s < 4; s++) {
      for (int i = 0; i < REF_N; i++)
        g[i] = ref_grad(i, s);
      TT_CHECK_OK(loom_optim_step(o, p, g, ref_lrs[s]));
    }
    TT_CHECK_EQ(loom_optim_get_step(o), 4);
    /* PyTorch's AVX2 kernels fuse some multiply-adds and loom does not, so
     * the two differ by ulps (max 7e-7 relative here); a wrong formula (say
     * beta2 rounded to f32 first) is off by 1e-5. */
    if (!TT_CHECK_CLOSE(p, rc->p, REF_N, 1e-7, 2e-6))
      fprintf(stderr, "  in case %s\n", rc->name);
    const float *want[2] = {rc->s0, rc->s1};
    TT_CHECK_EQ(loom_optim_state_count(o), rc->s1 ? 2 : rc->s0 ? 1 : 0);
    for (int i = 0; i < loom_optim_state_count(o); i++) {
      loom_optim_state st;
      TT_REQUIRE_OK(loom_optim_state_get(o, i, &st));
      TT_CHECK_EQ(st.count, REF_N);
      if (!TT_CHECK_CLOSE(st.data, want[i], REF_N, 1e-12, 2e-6))
        fprintf(stderr, "  in case %s, state %s\n", rc->name, st.name);
    }
    loom_optim_free(o);
  }
}

/* One element, by hand. */
static float one_step(loom_optim_opts *opts, bool decay, float p0,
                      const float *gs, int nsteps, float lr) {
  loom_param v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "w");
  v.numel = 1;
  v.decay = decay;
  loom_optim *o = NULL;
  if (loom_optim_new(&o, opts, &v, 1, 1) != LOOM_OK)
    return NAN;
  float p = p0;
  for (int s = 0; s < nsteps; s++)
    if (loom_optim_step(o, &p, &gs[s], lr) != LOOM_OK)
      p = NAN;
  loom_optim_free(o);
  return p;
}

TT_TEST(test_hand_computed) {
  const float ones[2] = {1.0f, 1.0f};
  loom_optim_opts o = loom_optim_opts_default();
  float half = 0.5f;
  TT_CHECK_NEAR(one_step(&o, true, 1.0f, &half, 1, 0.1f), 0.95, 1e-7);
  o.momentum = 0.9; /* buf 1 then 1.9: p 0.9 then 0.71 */
  TT_CHECK_NEAR(one_step(&o, true, 1.0f, ones, 2, 0.1f), 0.71, 1e-6);
  o.nesterov = true; /* p -= 0.1*(1 + 0.9*1), then 0.1*(1 + 0.9*1.9) */
  TT_CHECK_NEAR(one_step(&o, true, 1.0f, ones, 2, 0.1f), 0.539, 1e-6);
  o = loom_optim_opts_default();
  o.weight_decay = 0.5; /* g + wd*p = 1 + 1 */
  TT_CHECK_NEAR(one_step(&o, true, 2.0f, ones, 1, 0.1f), 1.8, 1e-6);
  TT_CHECK_NEAR(one_step(&o, false, 2.0f, ones, 1, 0.1f), 1.9, 1e-6);
  o.decay_all = true;
  TT_CHECK_NEAR(one_step(&o, false, 2.0f, ones, 1, 0.1f), 1.8, 1e-6);
  /* AdamW's first step moves by lr * g/|g| after bias correction; the
   * decoupled decay multiplies by 1 - lr*wd first. */
  o = loom_optim_opts_default();
  o.kind = LOOM_OPTIM_ADAMW;
  o.weight_decay = 0.5;
  float g = -3.0f;
  TT_CHECK_NEAR(one_step(&o, true, 2.0f, &g, 1, 0.1f), 2.0, 1e-6);
  TT_CHECK_NEAR(one_step(&o, false, 2.0f, &g, 1, 0.1f), 2.1, 1e-6);
  /* Zero gradients: AdamW only decays; eps keeps 0/0 away. */
  float z[2] = {0.0f, 0.0f};
  TT_CHECK_NEAR(one_step(&o, true, 2.0f, z, 2, 0.1f), 2.0 * 0.95 * 0.95, 1e-6);
  /* lr 0 leaves the weights alone. */
  TT_CHECK(one_step(&o, true, 2.0f, &g, 1, 0.0f) == 2.0f);
}

/* A larger layout: 200003 elements in views of odd sizes, every other one
 * without decay, and a gap in the middle; several threads take part. */
#define BIG_N 200003
#define BIG_V 9

static void big_views(loom_param v[BIG_V]) {
  static const int64_t sizes[BIG_V] = {1, 4099, 31, 60000, 7, 70001, 5, 9, 0};
  memset(v, 0, BIG_V * sizeof *v);
  int64_t at = 0;
  for (int i = 0; i < BIG_V; i++) {
    snprintf(v[i].name, sizeof v[i].name, "p%d", i);
    if (i == 4)
      at += 1000; /* a gap no view covers */
    v[i].offset = at;
    v[i].numel = i == BIG_V - 1 ? BIG_N - at : sizes[i];
    v[i].ndim = 1;
    v[i].shape[0] = v[i].numel;
    v[i].decay = i % 2 == 0;
    at += v[i].numel;
  }
}

static void big_data(float *p, float *g, int s) {
  loom_rng r = loom_rng_init(1234, (uint64_t)s);
  loom_rng_fill_normal(&r, g, BIG_N, 0.0f, 0.1f);
  if (p) {
    loom_rng q = loom_rng_init(99, 0);
    loom_rng_fill_normal(&q, p, BIG_N, 0.0f, 1.0f);
  }
}

static loom_optim_opts big_opts(loom_optim_kind kind) {
  loom_optim_opts o = loom_optim_opts_default();
  o.kind = kind;
  o.weight_decay = 0.05;
  if (kind == LOOM_OPTIM_SGD) {
    o.momentum = 0.9;
    o.nesterov = true;
  }
  return o;
}

/* Runs 3 steps of a full optimizer; returns params and the state buffers. */
static loom_status run_full(loom_optim_kind kind, float *p, float *s0,
                            float *s1) {
  loom_param v[BIG_V];
  big_views(v);
  loom_optim_opts opts = big_opts(kind);
  loom_optim *o = NULL;
  LOOM_TRY(loom_optim_new(&o, &opts, v, BIG_V, BIG_N));
  float *g = loom_malloc(sizeof(float) * BIG_N);
  if (!g) {
    loom_optim_free(o);
    return LOOM_ERR_NOMEM;
  }
  big_data(p, g, 0);
  loom_status st = LOOM_OK;
  for (int s = 0; s < 3 && st == LOOM_OK; s++) {
    big_data(NULL, g, s);
    st = loom_optim_step(o, p, g, 0.01f);
  }
  loom_optim_state a;
  if (st == LOOM_OK && loom_optim_state_get(o, 0, &a) == LOOM_OK)
    memcpy(s0, a.data, sizeof(float) * BIG_N);
  if (st == LOOM_OK && loom_optim_state_get(o, 1, &a) == LOOM_OK)
    memcpy(s1, a.data, sizeof(float) * BIG_N);
  loom_clear_error();
  loom_free(g);
  loom_optim_free(o);
  return st;
}

typedef struct big_bufs {
  float *p, *s0, *s1, *q, *t0, *t1, *g;
} big_bufs;

static bool big_alloc(big_bufs *b) {
  float **all[] = {&b->p, &b->s0, &b->s1, &b->q, &b->t0, &b->t1, &b->g};
  bool ok = true;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    *all[i] = loom_calloc(BIG_N, sizeof(float));
    ok = ok && *all[i];
  }
  return ok;
}

static void big_release(big_bufs *b) {
  float *all[] = {b->p, b->s0, b->s1, b->q, b->t0, b->t1, b->g};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
}

#define BITWISE_EQ(a, b, n) (memcmp((a), (b), sizeof(float) * (size_t)(n)) == 0)

TT_TEST(test_range_equals_full) {
  big_bufs b;
  TT_REQUIRE(big_alloc(&b));
  loom_param v[BIG_V];
  big_views(v);
  for (int kind = 0; kind < LOOM_OPTIM_KIND_COUNT; kind++) {
    TT_REQUIRE_OK(run_full(kind, b.p, b.s0, b.s1));
    /* The same steps as ranges cut anywhere, in any order. */
    loom_optim_opts opts = big_opts(kind);
    loom_optim *o = NULL;
    TT_REQUIRE_OK(loom_optim_new(&o, &opts, v, BIG_V, BIG_N));
    big_data(b.q, b.g, 0);
    const int64_t cuts[][2] = {
        {50001, 120000}, {0, 7}, {120000, BIG_N}, {7, 50001}, {9, 9}};
    for (int s = 0; s < 3; s++) {
      big_data(NULL, b.g, s);
      for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++)
        TT_CHECK_OK(
            loom_optim_step_range(o, b.q, b.g, 0.01f, cuts[c][0], cuts[c][1]));
      TT_CHECK_EQ(loom_optim_get_step(o), s);
      loom_optim_finish_step(o);
    }
    TT_CHECK(BITWISE_EQ(b.p, b.q, BIG_N));
    loom_optim_state st;
    TT_REQUIRE_OK(loom_optim_state_get(o, 0, &st));
    TT_CHECK(BITWISE_EQ(b.s0, st.data, BIG_N));
    loom_optim_free(o);

    /* A shard [sb, se): its state is (se - sb) long; step_shard on local
     * copies and step on the full buffers both match the full optimizer
     * there, and step leaves the rest of the buffers alone. */
    const int64_t sb = 4100, se = 134567, S = se - sb;
    opts.shard_begin = sb;
    opts.shard_end = se;
    loom_optim *sh = NULL, *sf = NULL;
    TT_REQUIRE_OK(loom_optim_new(&sh, &opts, v, BIG_V, BIG_N));
    TT_REQUIRE_OK(loom_optim_new(&sf, &opts, v, BIG_V, BIG_N));
    big_data(b.q, b.g, 0);
    memcpy(b.t0, b.q + sb, sizeof(float) * S); /* local params */
    memcpy(b.t1, b.q, sizeof(float) * BIG_N);  /* untouched copy */
    for (int s = 0; s < 3; s++) {
      big_data(NULL, b.g, s);
      TT_CHECK_OK(loom_optim_step_shard(sh, b.t0, b.g + sb, 0.01f));
      TT_CHECK_OK(loom_optim_step(sf, b.q, b.g, 0.01f));
    }
    TT_CHECK(BITWISE_EQ(b.t0, b.p + sb, S));
    TT_CHECK(BITWISE_EQ(b.q + sb, b.p + sb, S));
    TT_CHECK(BITWISE_EQ(b.q, b.t1, sb));
    TT_CHECK(BITWISE_EQ(b.q + se, b.t1 + se, BIG_N - se));
    for (int i = 0; i < loom_optim_state_count(sh); i++) {
      TT_REQUIRE_OK(loom_optim_state_get(sh, i, &st));
      TT_CHECK_EQ(st.begin, sb);
      TT_CHECK_EQ(st.count, S);
      TT_CHECK(BITWISE_EQ(st.data, (i == 0 ? b.s0 : b.s1) + sb, S));
    }
    /* Ranges outside the shard are refused. */
    TT_CHECK_EQ(loom_optim_step_range(sh, b.q, b.g, 0.01f, sb - 1, se),
                LOOM_ERR_INVALID_ARG);
    TT_CHECK_EQ(loom_optim_step_range(sh, b.q, b.g, 0.01f, sb, se + 1),
                LOOM_ERR_INVALID_ARG);
    loom_optim_free(sh);
    loom_optim_free(sf);
  }
  big_release(&b);
}

/* loom_optim_set_rounded: the same parameters, and beside them each one
 * rounded (loom_round_half's bits), from full steps, ranges and a shard,
 * in bf16 and f16, on 2 threads (blocks cut inside each thread's part). */
TT_TEST(test_rounded_copy) {
  big_bufs b;
  TT_REQUIRE(big_alloc(&b));
  float *r = loom_calloc(BIG_N, sizeof(float));
  float *want = loom_calloc(BIG_N, sizeof(float));
  TT_REQUIRE(r && want);
  loom_param v[BIG_V];
  big_views(v);
  loom_set_threads(2);
  const loom_dtype halves[] = {LOOM_BF16, LOOM_F16};
  for (int kind = 0; kind < LOOM_OPTIM_KIND_COUNT; kind++) {
    TT_REQUIRE_OK(run_full(kind, b.p, b.s0, b.s1));
    for (int h = 0; h < 2; h++) {
      const loom_dtype dt = halves[h];
      for (int ranges = 0; ranges < 2; ranges++) {
        loom_optim_opts opts = big_opts(kind);
        loom_optim *o = NULL;
        TT_REQUIRE_OK(loom_optim_new(&o, &opts, v, BIG_V, BIG_N));
        TT_REQUIRE_OK(loom_optim_set_rounded(o, dt, r));
        big_data(b.q, b.g, 0);
        memset(r, 0xff, sizeof(float) * BIG_N);
        for (int s = 0; s < 3; s++) {
          big_data(NULL, b.g, s);
          if (ranges) {
            TT_CHECK_OK(
                loom_optim_step_range(o, b.q, b.g, 0.01f, 70001, BIG_N));
            TT_CHECK_OK(loom_optim_step_range(o, b.q, b.g, 0.01f, 0, 70001));
            loom_optim_finish_step(o);
          } else {
            TT_CHECK_OK(loom_optim_step(o, b.q, b.g, 0.01f));
          }
        }
        TT_CHECK(BITWISE_EQ(b.p, b.q, BIG_N));
        TT_REQUIRE_OK(loom_round_half(dt, want, b.q, BIG_N));
        TT_CHECK(BITWISE_EQ(r, want, BIG_N));
        /* cleared: the copy is left alone */
        TT_REQUIRE_OK(loom_optim_set_rounded(o, dt, NULL));
        memcpy(b.t1, r, sizeof(float) * BIG_N);
        TT_CHECK_OK(loom_optim_step(o, b.q, b.g, 0.01f));
        TT_CHECK(BITWISE_EQ(r, b.t1, BIG_N));
        loom_optim_free(o);
      }
    }
    /* a shard on local buffers: the copy addressed as they are */
    const int64_t sb = 4100, se = 134567, S = se - sb;
    loom_optim_opts opts = big_opts(kind);
    opts.shard_begin = sb;
    opts.shard_end = se;
    loom_optim *sh = NULL;
    TT_REQUIRE_OK(loom_optim_new(&sh, &opts, v, BIG_V, BIG_N));
    TT_REQUIRE_OK(loom_optim_set_rounded(sh, LOOM_BF16, r));
    big_data(b.q, b.g, 0);
    memcpy(b.t0, b.q + sb, sizeof(float) * S);
    for (int s = 0; s < 3; s++) {
      big_data(NULL, b.g, s);
      TT_CHECK_OK(loom_optim_step_shard(sh, b.t0, b.g + sb, 0.01f));
    }
    TT_CHECK(BITWISE_EQ(b.t0, b.p + sb, S));
    TT_REQUIRE_OK(loom_round_half(LOOM_BF16, want, b.t0, S));
    TT_CHECK(BITWISE_EQ(r, want, S));
    TT_CHECK_EQ(loom_optim_set_rounded(sh, LOOM_F32, r), LOOM_ERR_INVALID_ARG);
    TT_CHECK_OK(loom_optim_set_rounded(sh, LOOM_F32, NULL));
    loom_clear_error();
    loom_optim_free(sh);
  }
  loom_set_threads(0);
  TT_CHECK_EQ(loom_optim_set_rounded(NULL, LOOM_BF16, r), LOOM_ERR_INVALID_ARG);
  loom_clear_error();
  loom_free(r);
  loom_free(want);
  big_release(&b);
}

TT_TEST(test_threads_deterministic) {
  big_bufs b;
  TT_REQUIRE(big_alloc(&b));
  int saved = loom_threads();
  for (int kind = 0; kind < LOOM_OPTIM_KIND_COUNT; kind++) {
    loom_set_threads(1);
    TT_REQUIRE_OK(run_full(kind, b.p, b.s0, b.s1));
    for (int nt = 2; nt <= 3; nt++) {
      loom_set_threads(nt);
      TT_REQUIRE_OK(run_full(kind, b.q, b.t0, b.t1));
      TT_CHECK(BITWISE_EQ(b.p, b.q, BIG_N));
      TT_CHECK(BITWISE_EQ(b.s0, b.t0, BIG_N));
      if (kind == LOOM_OPTIM_ADAMW)
        TT_CHECK(BITWISE_EQ(b.s1, b.t1, BIG_N));
    }
  }
  loom_set_threads(saved);
  big_release(&b);
}

TT_TEST(test_state_checkpoint) {
  loom_param v[4];
  ref_views(v);
  loom_optim_opts opts = loom_optim_opts_default();
  TT_CHECK_EQ(loom_optim_opts_state_count(&opts), 0);
  opts.momentum = 0.9;
  TT_CHECK_EQ(loom_optim_opts_state_count(&opts), 1);
  loom_optim *o = NULL;
  loom_optim_state st;
  TT_REQUIRE_OK(loom_optim_new(&o, &opts, v, 4, REF_N));
  TT_REQUIRE_OK(loom_optim_state_get(o, 0, &st));
  TT_CHECK_STR(st.name, "sgd.momentum");
  TT_CHECK_EQ(loom_optim_state_get(o, 1, &st), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_optim_get_opts(o)->shard_end, REF_N);
  loom_optim_free(o);

  opts.kind = LOOM_OPTIM_ADAMW;
  opts.weight_decay = 0.1;
  TT_CHECK_EQ(loom_optim_opts_state_count(&opts), 2);
  loom_optim *a = NULL, *b = NULL;
  TT_REQUIRE_OK(loom_optim_new(&a, &opts, v, 4, REF_N));
  TT_REQUIRE_OK(loom_optim_new(&b, &opts, v, 4, REF_N));
  float pa[REF_N], pb[REF_N], g[REF_N];
  for (int i = 0; i < REF_N; i++)
    pa[i] = ref_p0(i);
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < REF_N; i++)
      g[i] = ref_grad(i, s);
    TT_CHECK_OK(loom_optim_step(a, pa, g, 0.01f));
  }
  /* "Save" a, "restore" into b: step count, state buffers, params. */
  const char *names[2] = {"adamw.m", "adamw.v"};
  for (int i = 0; i < 2; i++) {
    loom_optim_state sa, sb;
    TT_REQUIRE_OK(loom_optim_state_get(a, i, &sa));
    TT_REQUIRE_OK(loom_optim_state_get(b, i, &sb));
    TT_CHECK_STR(sa.name, names[i]);
    TT_CHECK_EQ(sa.count, REF_N);
    memcpy(sb.data, sa.data, sizeof(float) * (size_t)sa.count);
  }
  TT_CHECK_OK(loom_optim_set_step(b, loom_optim_get_step(a)));
  TT_CHECK_EQ(loom_optim_get_step(b), 2);
  memcpy(pb, pa, sizeof pa);
  for (int s = 2; s < 4; s++) {
    for (int i = 0; i < REF_N; i++)
      g[i] = ref_grad(i, s);
    TT_CHECK_OK(loom_optim_step(a, pa, g, 0.01f));
    TT_CHECK_OK(loom_optim_step(b, pb, g, 0.01f));
  }
  TT_CHECK(BITWISE_EQ(pa, pb, REF_N));
  /* Without the step count the bias correction differs. */
  TT_CHECK_OK(loom_optim_set_step(b, 0));
  TT_CHECK_OK(loom_optim_step(a, pa, g, 0.01f));
  TT_CHECK_OK(loom_optim_step(b, pb, g, 0.01f));
  TT_CHECK(!BITWISE_EQ(pa, pb, REF_N));
  TT_CHECK_EQ(loom_optim_set_step(b, -1), LOOM_ERR_INVALID_ARG);
  loom_optim_free(a);
  loom_optim_free(b);
}

/* Expects loom_optim_new to refuse opts with a message holding `word`. */
static void expect_bad(const loom_optim_opts *opts, const loom_param *v, int nv,
                       int64_t n, const char *word, int line) {
  loom_optim *o = (loom_optim *)&o; /* must come back NULL */
  loom_clear_error();
  loom_status s = loom_optim_new(&o, opts, v, nv, n);
  if (s != LOOM_ERR_INVALID_ARG || o != NULL ||
      !strstr(loom_last_error(), word)) {
    tt_fail_prefix(__FILE__, line);
    fprintf(stderr, "expected INVALID_ARG mentioning '%s', got %s: '%s'\n",
            word, loom_status_name(s), loom_last_error());
    tt_fail_done();
  }
  if (s == LOOM_OK)
    loom_optim_free(o);
}

TT_TEST(test_invalid) {
  loom_param v[4];
  ref_views(v);
  loom_optim_opts d = loom_optim_opts_default(), o;
#define BAD(field, value, word)                                                \
  do {                                                                         \
    o = d;                                                                     \
    o.field = value;                                                           \
    expect_bad(&o, v, 4, REF_N, word, __LINE__);                               \
  } while (0)
  BAD(kind, (loom_optim_kind)7, "kind");
  BAD(momentum, -0.5, "momentum");
  BAD(momentum, NAN, "momentum");
  BAD(nesterov, true, "nesterov");
  BAD(weight_decay, -1.0, "weight_decay");
  BAD(weight_decay, INFINITY, "weight_decay");
  BAD(shard_begin, -1, "shard");
  BAD(shard_end, REF_N + 1, "shard");
  d.kind = LOOM_OPTIM_ADAMW;
  BAD(beta1, 1.0, "beta1");
  BAD(beta2, -0.1, "beta2");
  BAD(beta2, NAN, "beta2");
  BAD(eps, -1e-8, "eps");
  o = d;
  o.shard_begin = 10;
  o.shard_end = 5;
  expect_bad(&o, v, 4, REF_N, "shard", __LINE__);
#undef BAD
  expect_bad(&d, v, 4, -1, "size", __LINE__);
  expect_bad(&d, NULL, 4, REF_N, "views", __LINE__);
  expect_bad(&d, v, 4, 30, "outside", __LINE__); /* views past n */
  loom_param w[4];
  memcpy(w, v, sizeof w);
  w[2].offset = 24; /* overlaps fc1.bias */
  expect_bad(&d, w, 4, REF_N, "fc2.weight", __LINE__);

  /* Bad calls on a good optimizer. */
  loom_optim *opt = NULL;
  TT_REQUIRE_OK(loom_optim_new(&opt, &d, v, 4, REF_N));
  float p[REF_N] = {0}, g[REF_N] = {0};
  TT_CHECK_EQ(loom_optim_step(opt, p, g, -0.1f), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "learning rate") != NULL);
  TT_CHECK_EQ(loom_optim_step(opt, p, g, NAN), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_optim_step(opt, NULL, g, 0.1f), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_optim_step_range(opt, p, g, 0.1f, 5, 3),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_optim_step_range(opt, p, g, 0.1f, 0, REF_N + 1),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_optim_step(NULL, p, g, 0.1f), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_optim_get_step(opt), 0); /* failed steps do not count */
  loom_optim_free(opt);
  loom_optim_free(NULL);
}

TT_TEST(test_nomem) {
  loom_param v[4];
  ref_views(v);
  for (int kind = 0; kind < LOOM_OPTIM_KIND_COUNT; kind++) {
    loom_optim_opts opts = big_opts(kind);
    int failures = 0;
    for (long k = 1; k < 100; k++) {
      loom_optim *o = (loom_optim *)&o;
      loom_alloc_fail_after(k);
      loom_status s = loom_optim_new(&o, &opts, v, 4, REF_N);
      loom_alloc_fail_after(0);
      if (s == LOOM_OK) {
        loom_optim_free(o);
        break;
      }
      TT_CHECK_EQ(s, LOOM_ERR_NOMEM);
      TT_CHECK(o == NULL);
      failures++;
    }
    /* object, runs, and one buffer per state */
    TT_CHECK_EQ(failures, 2 + loom_optim_opts_state_count(&opts));
  }
}

int main(void) {
  TT_RUN(test_kind_names);
  TT_RUN(test_torch_reference);
  TT_RUN(test_hand_computed);
  TT_RUN(test_range_equals_full);
  TT_RUN(test_rounded_copy);
  TT_RUN(test_threads_deterministic);
  TT_RUN(test_state_checkpoint);
  TT_RUN(test_invalid);
  TT_RUN(test_nomem);
  return tt_finish();
}
