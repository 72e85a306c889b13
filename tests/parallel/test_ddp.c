/* ddp on one rank (self backend): bucket layout, the hook's launches and
 * errors, no_sync, option checks, deterministic shards on one rank against
 * a hand-made tree, sums, and equality with plain training. */
#include "tt.h"

#include "ddp_util.h"
#include "loom/comm.h"
#include "loom/parallel.h"

static loom_group *world;

static loom_ddp_opts opts_mb(double first, double cap) {
  loom_ddp_opts o = loom_ddp_opts_default();
  o.first_bucket_mb = first;
  o.bucket_mb = cap;
  return o;
}

/* fashion-mlp at full size: 669,706 parameters in 6 views. */
TT_TEST(buckets_reference_mlp) {
  loom_model *m = NULL;
  TT_REQUIRE_OK(loom_fashion_mlp_new(&m, NULL, NULL));
  loom_ddp *d = NULL;
  loom_ddp_opts o = loom_ddp_opts_default();
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, &o));
  /* First bucket: fc3.bias, fc3.weight, fc2.bias, fc2.weight (reaches 1 MiB
   * with fc2.weight); then the rest in one bucket of at most 25 MiB. */
  TT_CHECK_EQ(loom_ddp_num_buckets(d), 2);
  int64_t b, e;
  int np;
  TT_CHECK_OK(loom_ddp_bucket(d, 0, &b, &e, &np));
  TT_CHECK_EQ(b, 784 * 512 + 512);
  TT_CHECK_EQ(e, 669706);
  TT_CHECK_EQ(np, 4);
  TT_CHECK_OK(loom_ddp_bucket(d, 1, &b, &e, &np));
  TT_CHECK_EQ(b, 0);
  TT_CHECK_EQ(e, 784 * 512 + 512);
  TT_CHECK_EQ(np, 2);
  TT_CHECK(loom_ddp_bucket(d, 2, &b, &e, &np) == LOOM_ERR_INVALID_ARG);
  loom_ddp_free(d);

  /* A tiny cap: one bucket per parameter, in reverse order. */
  o = opts_mb(1e-9, 1e-9);
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, &o));
  TT_CHECK_EQ(loom_ddp_num_buckets(d), 6);
  for (int i = 0; i < 6; i++) {
    TT_CHECK_OK(loom_ddp_bucket(d, i, &b, &e, &np));
    const loom_param *v = loom_model_view(m, 5 - i);
    TT_CHECK_EQ(b, v->offset);
    TT_CHECK_EQ(e, v->offset + v->numel);
    TT_CHECK_EQ(np, 1);
  }
  loom_ddp_free(d);

  /* bucket_mb 0 and no minimum count: one bucket for everything. */
  o = opts_mb(0, 0);
  o.min_buckets = 0;
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, &o));
  TT_CHECK_EQ(loom_ddp_num_buckets(d), 1);
  loom_ddp_free(d);
  loom_model_free(m);
}

/* kjv-gpt (842,496 parameters, 3.4 MB): 25 MiB buckets would leave all but
 * the first MiB to reduce after backward; buckets of about an eighth of the
 * model (min_buckets 8) cut it finely, and the last bucket (the tied token
 * embedding, final last) stays small. */
TT_TEST(buckets_reference_gpt) {
  loom_model *m = NULL;
  TT_REQUIRE_OK(loom_gpt_new(&m, NULL, NULL));
  loom_ddp *d = NULL;
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, NULL));
  int nb = loom_ddp_num_buckets(d);
  TT_CHECK(nb >= 7); /* a bucket closes once it reaches an eighth */
  int64_t most = 0, b, e, prev = loom_model_num_params(m);
  for (int i = 0; i < nb; i++) {
    TT_CHECK_OK(loom_ddp_bucket(d, i, &b, &e, NULL));
    TT_CHECK_EQ(e, prev); /* contiguous, from the end of the buffer */
    prev = b;
    if (e - b > most)
      most = e - b;
  }
  TT_CHECK_EQ(prev, 0);
  /* At most an eighth of the model plus one parameter. */
  TT_CHECK(most <= 842496 / 8 + 65536);
  TT_CHECK_OK(loom_ddp_bucket(d, nb - 1, &b, &e, NULL));
  TT_CHECK(e - b <= 842496 / 8 + 65536);
  loom_ddp_free(d);
  /* min_buckets 0: PyTorch's rule alone, 1 MiB then the rest. */
  loom_ddp_opts o = loom_ddp_opts_default();
  o.min_buckets = 0;
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, &o));
  TT_CHECK_EQ(loom_ddp_num_buckets(d), 2);
  loom_ddp_free(d);
  loom_model_free(m);
}

/* With one rank, DDP training is plain training, bit for bit. */
TT_TEST(one_rank_equals_plain) {
  for (int k = 0; k < W_COUNT; k++) {
    loom_model *a = NULL, *r = NULL;
    loom_optim *oa = NULL, *orf = NULL;
    loom_xent *x = NULL;
    float lr;
    TT_REQUIRE_OK(w_model((w_kind)k, 7, &a));
    TT_REQUIRE_OK(w_model((w_kind)k, 7, &r));
    TT_REQUIRE_OK(w_optim((w_kind)k, a, &oa, &lr));
    TT_REQUIRE_OK(w_optim((w_kind)k, r, &orf, &lr));
    TT_REQUIRE_OK(loom_xent_new(&x));
    loom_ddp *d = NULL;
    loom_ddp_opts o = opts_mb(1e-4, 1e-3);
    TT_REQUIRE_OK(loom_ddp_new(&d, a, world, &o));
    static w_batch b;
    for (int step = 0; step < 5; step++) {
      w_fill((w_kind)k, 3, step * 8, 8, &b);
      TT_CHECK_OK(loom_ddp_zero_grad(d));
      TT_CHECK_OK(w_micro(a, x, &b, 1.0f, NULL, NULL));
      TT_CHECK_OK(loom_ddp_step(d, oa, lr));
      loom_model_zero_grad(r);
      TT_CHECK_OK(w_micro(r, x, &b, 1.0f, NULL, NULL));
      TT_CHECK_OK(
          loom_optim_step(orf, loom_model_params(r), loom_model_grads(r), lr));
    }
    int64_t n = loom_model_num_params(a);
    TT_CHECK(memcmp(loom_model_params(a), loom_model_params(r),
                    (size_t)n * sizeof(float)) == 0);
    loom_ddp_stats st;
    loom_ddp_get_stats(d, &st);
    TT_CHECK_EQ(st.steps, 5);
    TT_CHECK(st.buckets >= 2);
    TT_CHECK_NEAR(loom_ddp_hidden_share(&st), 1.0, 0);
    loom_ddp_free(d);
    loom_xent_free(x);
    loom_optim_free(oa);
    loom_optim_free(orf);
    loom_model_free(a);
    loom_model_free(r);
  }
}

/* Two reducing backward passes in one step are an error, not a race. */
TT_TEST(second_sync_backward_is_an_error) {
  loom_model *m = NULL;
  loom_xent *x = NULL;
  TT_REQUIRE_OK(w_model(W_MLP, 1, &m));
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_ddp *d = NULL;
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, NULL));
  static w_batch b;
  w_fill(W_MLP, 1, 0, 4, &b);
  TT_CHECK_OK(loom_ddp_zero_grad(d));
  TT_CHECK_OK(w_micro(m, x, &b, 1.0f, NULL, NULL));
  loom_status s = w_micro(m, x, &b, 1.0f, NULL, NULL);
  TT_CHECK(s == LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "second final gradient") != NULL);
  /* no_sync for the first of two micro-batches is fine. */
  TT_CHECK_OK(loom_ddp_zero_grad(d));
  loom_ddp_set_sync(d, false);
  TT_CHECK(!loom_ddp_get_sync(d));
  TT_CHECK_OK(w_micro(m, x, &b, 0.5f, NULL, NULL));
  loom_ddp_set_sync(d, true);
  TT_CHECK_OK(w_micro(m, x, &b, 0.5f, NULL, NULL));
  TT_CHECK_OK(loom_ddp_wait(d));
  loom_ddp_free(d);
  loom_xent_free(x);
  loom_model_free(m);
}

TT_TEST(bad_options) {
  loom_model *m = NULL;
  TT_REQUIRE_OK(w_model(W_MLP, 1, &m));
  loom_ddp *d = NULL;
  loom_ddp_opts o = loom_ddp_opts_default();
  o.deterministic = true;
  o.virtual_shards = 6;
  TT_CHECK(loom_ddp_new(&d, m, world, &o) == LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "power-of-two") != NULL);
  TT_CHECK(d == NULL);
  o.virtual_shards = 4;
  o.compress = LOOM_BF16;
  TT_CHECK(loom_ddp_new(&d, m, world, &o) == LOOM_ERR_INVALID_ARG);
  o = loom_ddp_opts_default();
  o.compress = LOOM_I32;
  TT_CHECK(loom_ddp_new(&d, m, world, &o) == LOOM_ERR_INVALID_ARG);
  o = loom_ddp_opts_default();
  o.bucket_mb = -1;
  TT_CHECK(loom_ddp_new(&d, m, world, &o) == LOOM_ERR_INVALID_ARG);
  /* Shards outside deterministic mode, join without uneven. */
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, NULL));
  TT_CHECK(loom_ddp_shard_begin(d, 0) == LOOM_ERR_INVALID_ARG);
  bool done;
  TT_CHECK(loom_ddp_join(d, &done) == LOOM_ERR_INVALID_ARG);
  double v[9] = {0};
  TT_CHECK(loom_ddp_sum_post(d, v, 9) == LOOM_ERR_INVALID_ARG);
  TT_CHECK(loom_ddp_sum_wait(d, v) == LOOM_ERR_INVALID_ARG);
  loom_ddp_free(d);
  loom_model_free(m);
}

/* Deterministic mode on one rank: four shards of two rows each, averaged in
 * the tree ((s0+s1)/2 + (s2+s3)/2)/2, computed here by hand. */
TT_TEST(deterministic_one_rank_tree) {
  loom_model *m = NULL, *r = NULL;
  loom_xent *x = NULL;
  TT_REQUIRE_OK(w_model(W_CNN, 5, &m));
  TT_REQUIRE_OK(w_model(W_CNN, 5, &r));
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_ddp_opts o = opts_mb(1e-4, 1e-3);
  o.deterministic = true;
  o.virtual_shards = 4;
  loom_ddp *d = NULL;
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, &o));
  int first, count;
  loom_ddp_shards(d, &first, &count);
  TT_CHECK_EQ(first, 0);
  TT_CHECK_EQ(count, 4);
  int64_t n = loom_model_num_params(m);
  static w_batch b;
  static float s[4][4096];
  TT_REQUIRE(n <= 4096);
  /* Two accumulated micro-batches of 8 rows (shards of 2 rows). */
  TT_CHECK_OK(loom_ddp_zero_grad(d));
  double loss[4] = {0};
  for (int mb = 0; mb < 2; mb++) {
    loom_ddp_set_sync(d, mb == 1);
    for (int j = 0; j < 4; j++) {
      w_fill(W_CNN, 9, mb * 8 + j * 2, 2, &b);
      TT_CHECK_OK(loom_ddp_shard_begin(d, j));
      double ls;
      TT_CHECK_OK(w_micro(m, x, &b, 0.5f, &ls, NULL));
      loss[j] += ls;
    }
  }
  TT_CHECK_OK(loom_ddp_wait(d));
  /* By hand on the reference model. */
  for (int j = 0; j < 4; j++) {
    loom_model_zero_grad(r);
    for (int mb = 0; mb < 2; mb++) {
      w_fill(W_CNN, 9, mb * 8 + j * 2, 2, &b);
      TT_CHECK_OK(w_micro(r, x, &b, 0.5f, NULL, NULL));
    }
    memcpy(s[j], loom_model_grads(r), (size_t)n * sizeof(float));
  }
  for (int64_t i = 0; i < n; i++) {
    float l = (s[0][i] + s[1][i]) * 0.5f, h = (s[2][i] + s[3][i]) * 0.5f;
    s[0][i] = (l + h) * 0.5f;
  }
  TT_CHECK(memcmp(loom_model_grads(m), s[0], (size_t)n * sizeof(float)) == 0);
  /* Sums over shards, in shard order. */
  double sums[4][2], out[2];
  for (int j = 0; j < 4; j++) {
    sums[j][0] = loss[j];
    sums[j][1] = (double)j;
  }
  TT_CHECK_OK(loom_ddp_sum_post(d, &sums[0][0], 2));
  TT_CHECK_OK(loom_ddp_sum_wait(d, out));
  TT_CHECK(out[0] == ((loss[0] + loss[1]) + loss[2]) + loss[3]);
  TT_CHECK(out[1] == 6.0);
  TT_CHECK(loom_ddp_shard_begin(d, 4) == LOOM_ERR_INVALID_ARG);
  loom_ddp_free(d);
  loom_xent_free(x);
  loom_model_free(m);
  loom_model_free(r);
}

/* Uneven inputs on one rank: join ends at once. */
TT_TEST(join_alone) {
  loom_model *m = NULL;
  TT_REQUIRE_OK(w_model(W_MLP, 1, &m));
  loom_ddp_opts o = loom_ddp_opts_default();
  o.uneven = true;
  loom_ddp *d = NULL;
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, &o));
  bool done = false;
  TT_CHECK_OK(loom_ddp_join(d, &done));
  TT_CHECK(done);
  loom_ddp_free(d);
  loom_model_free(m);
}

int main(void) {
  loom_comm_opts co = loom_comm_opts_default();
  co.backend = LOOM_COMM_SELF;
  if (loom_group_world(&co, &world) != LOOM_OK) {
    fprintf(stderr, "no world group: %s\n", loom_last_error());
    return 1;
  }
  TT_RUN(buckets_reference_mlp);
  TT_RUN(buckets_reference_gpt);
  TT_RUN(one_rank_equals_plain);
  TT_RUN(second_sync_backward_is_an_error);
  TT_RUN(bad_options);
  TT_RUN(deterministic_one_rank_tree);
  TT_RUN(join_alone);
  loom_group_free(world);
  return tt_finish();
}
