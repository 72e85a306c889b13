/* ddp on P ranks (run by `loom run -n P` or mpirun): P ranks with batch b
 * match 1 rank with batch P*b (computed here by every rank on its own), with
 * accumulation too; deterministic mode gives the bits of one rank; config
 * and model mismatches are errors on every rank; a rank with fewer batches
 * joins and nobody hangs; bf16 compression stays close. */
#include <stdlib.h>

#include "tt.h"

#include "ddp_util.h"
#include "loom/comm.h"
#include "loom/parallel.h"

static loom_group *world;
static int rank, nranks;

static void abort_all(void) { loom_group_abort(world, 1); }

#define STEPS 20
#define B 4 /* rows per rank per micro-batch */

/* All ranks hold the same bits in p (n)? */
static bool same_on_all_ranks(const float *p, int64_t n) {
  uint64_t h = loom_hash64(LOOM_HASH64_INIT, p, (size_t)n * sizeof(float));
  uint64_t mine[2] = {h, ~h}, out[2];
  loom_req r = LOOM_REQ_INIT;
  /* max(h) == h and max(~h) == ~h on every rank <=> all equal. */
  if (loom_allreduce(mine, out, 2, LOOM_I64, LOOM_MAX, world, &r) != LOOM_OK ||
      loom_wait(&r) != LOOM_OK)
    return false;
  int ok = out[0] == h && out[1] == ~h, all = 0;
  if (loom_allreduce(&ok, &all, 1, LOOM_I32, LOOM_MIN, world, &r) != LOOM_OK ||
      loom_wait(&r) != LOOM_OK)
    return false;
  return all == 1;
}

/* DDP on the world with accumulation `acc` vs one process training on the
 * whole global batch of every step. */
static void equivalence(w_kind k, int acc, loom_dtype compress, double tol) {
  loom_model *a = NULL, *r = NULL;
  loom_optim *oa = NULL, *orf = NULL;
  loom_xent *x = NULL;
  loom_ddp *d = NULL;
  float lr;
  /* Different seeds: the broadcast must make rank 0's weights everyone's. */
  TT_REQUIRE_OK(w_model(k, 100 + (uint64_t)rank, &a));
  TT_REQUIRE_OK(w_model(k, 100, &r));
  TT_REQUIRE_OK(w_optim(k, a, &oa, &lr));
  TT_REQUIRE_OK(w_optim(k, r, &orf, &lr));
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_ddp_opts o = loom_ddp_opts_default();
  /* Small buckets so that several are in flight during backward. */
  o.first_bucket_mb = 2e-4;
  o.bucket_mb = 1e-3;
  o.compress = compress;
  TT_REQUIRE_OK(loom_ddp_new(&d, a, world, &o));
  int64_t n = loom_model_num_params(a);
  TT_CHECK(memcmp(loom_model_params(a), loom_model_params(r),
                  (size_t)n * sizeof(float)) == 0);
  static w_batch bt;
  int64_t gb = (int64_t)B * nranks; /* global rows per micro-batch */
  for (int s = 0; s < STEPS; s++) {
    TT_REQUIRE_OK(loom_ddp_zero_grad(d));
    for (int m = 0; m < acc; m++) {
      loom_ddp_set_sync(d, m == acc - 1);
      int64_t first = ((int64_t)s * acc + m) * gb;
      w_fill(k, 11, first + (int64_t)rank * B, B, &bt);
      TT_REQUIRE_OK(w_micro(a, x, &bt, 1.0f / (float)acc, NULL, NULL));
    }
    TT_REQUIRE_OK(loom_ddp_step(d, oa, lr));
    loom_model_zero_grad(r);
    for (int m = 0; m < acc; m++) {
      w_fill(k, 11, ((int64_t)s * acc + m) * gb, gb, &bt);
      TT_REQUIRE_OK(w_micro(r, x, &bt, 1.0f / (float)acc, NULL, NULL));
    }
    TT_REQUIRE_OK(
        loom_optim_step(orf, loom_model_params(r), loom_model_grads(r), lr));
  }
  const float *pa = loom_model_params(a), *pr = loom_model_params(r);
  double rd = w_reldiff(pa, pr, n);
  if (rank == 0)
    printf("%s P=%d acc=%d %s: %d buckets, max |diff| / max |p| = %.3g\n",
           w_names[k], nranks, acc, loom_dtype_name(compress),
           loom_ddp_num_buckets(d), rd);
  /* Relative to the largest parameter: elements that no gradient defines
   * (a GPT's key bias: softmax ignores it) follow rounding noise under
   * AdamW, so an element-wise relative test would only measure noise. */
  TT_CHECK(rd <= tol);
  TT_CHECK(same_on_all_ranks(pa, n));
  /* The parameters moved: the comparison is not of initial weights. */
  loom_model *init = NULL;
  TT_REQUIRE_OK(w_model(k, 100, &init));
  TT_CHECK(w_reldiff(pa, loom_model_params(init), n) > 1e-3);
  loom_model_free(init);
  loom_ddp_free(d);
  loom_xent_free(x);
  loom_optim_free(oa);
  loom_optim_free(orf);
  loom_model_free(a);
  loom_model_free(r);
}

TT_TEST(equivalence_mlp) { equivalence(W_MLP, 1, LOOM_F32, 1e-5); }
TT_TEST(equivalence_cnn) { equivalence(W_CNN, 1, LOOM_F32, 1e-5); }
TT_TEST(equivalence_gpt) { equivalence(W_GPT, 1, LOOM_F32, 1e-5); }
TT_TEST(equivalence_accumulate_mlp) { equivalence(W_MLP, 3, LOOM_F32, 1e-5); }
TT_TEST(equivalence_accumulate_cnn) { equivalence(W_CNN, 2, LOOM_F32, 1e-5); }
TT_TEST(equivalence_accumulate_gpt) { equivalence(W_GPT, 2, LOOM_F32, 1e-5); }
TT_TEST(compressed_bf16) { equivalence(W_MLP, 1, LOOM_BF16, 1e-2); }

/* Deterministic mode on the world vs deterministic mode on a group of one
 * (this rank alone, all V shards local): the same bits. */
static void deterministic(w_kind k, int acc) {
  loom_group *solo = NULL;
  TT_REQUIRE_OK(loom_group_split(world, rank, 0, &solo));
  TT_REQUIRE(solo && loom_group_size(solo) == 1);
  loom_model *a = NULL, *r = NULL;
  loom_optim *oa = NULL, *orf = NULL;
  loom_xent *x = NULL;
  loom_ddp *da = NULL, *dr = NULL;
  float lr;
  TT_REQUIRE_OK(w_model(k, 200, &a));
  TT_REQUIRE_OK(w_model(k, 200, &r));
  TT_REQUIRE_OK(w_optim(k, a, &oa, &lr));
  TT_REQUIRE_OK(w_optim(k, r, &orf, &lr));
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_ddp_opts o = loom_ddp_opts_default();
  o.first_bucket_mb = 2e-4;
  o.bucket_mb = 1e-3;
  o.deterministic = true;
  o.virtual_shards = 8;
  TT_REQUIRE_OK(loom_ddp_new(&da, a, world, &o));
  TT_REQUIRE_OK(loom_ddp_new(&dr, r, solo, &o));
  int first, count, rf, rc;
  loom_ddp_shards(da, &first, &count);
  loom_ddp_shards(dr, &rf, &rc);
  TT_CHECK_EQ(count * nranks, 8);
  TT_CHECK_EQ(first, rank * count);
  TT_CHECK_EQ(rc, 8);
  const int rows = 2; /* per shard */
  static w_batch bt;
  double loss_a = 0, loss_r = 0;
  for (int s = 0; s < STEPS; s++) {
    TT_REQUIRE_OK(loom_ddp_zero_grad(da));
    TT_REQUIRE_OK(loom_ddp_zero_grad(dr));
    double la[8] = {0}, lrf[8] = {0};
    for (int m = 0; m < acc; m++) {
      int64_t base = ((int64_t)s * acc + m) * 8 * rows;
      loom_ddp_set_sync(da, m == acc - 1);
      loom_ddp_set_sync(dr, m == acc - 1);
      for (int j = 0; j < count; j++) {
        w_fill(k, 13, base + (int64_t)(first + j) * rows, rows, &bt);
        TT_REQUIRE_OK(loom_ddp_shard_begin(da, j));
        double ls;
        TT_REQUIRE_OK(w_micro(a, x, &bt, 1.0f / (float)acc, &ls, NULL));
        la[j] += ls;
      }
      for (int j = 0; j < 8; j++) {
        w_fill(k, 13, base + (int64_t)j * rows, rows, &bt);
        TT_REQUIRE_OK(loom_ddp_shard_begin(dr, j));
        double ls;
        TT_REQUIRE_OK(w_micro(r, x, &bt, 1.0f / (float)acc, &ls, NULL));
        lrf[j] += ls;
      }
    }
    TT_REQUIRE_OK(loom_ddp_sum_post(da, la, 1));
    if (s == 0) /* out of order: the ones before it are waited for first */
      TT_REQUIRE_OK(loom_ddp_wait_bucket(da, loom_ddp_num_buckets(da) - 1));
    TT_REQUIRE_OK(loom_ddp_step(da, oa, lr));
    TT_REQUIRE_OK(loom_ddp_step(dr, orf, lr));
    TT_REQUIRE_OK(loom_ddp_sum_wait(da, &loss_a));
    TT_REQUIRE_OK(loom_ddp_sum_post(dr, lrf, 1));
    TT_REQUIRE_OK(loom_ddp_sum_wait(dr, &loss_r));
    TT_CHECK(loss_a == loss_r);
  }
  int64_t n = loom_model_num_params(a);
  const float *pa = loom_model_params(a), *pr = loom_model_params(r);
  size_t same = 0;
  for (int64_t i = 0; i < n; i++)
    same += memcmp(&pa[i], &pr[i], sizeof(float)) == 0;
  if (rank == 0)
    printf("deterministic %s P=%d acc=%d: %zu of %lld parameters bitwise "
           "equal to one rank's, loss %.9g vs %.9g\n",
           w_names[k], nranks, acc, same, (long long)n, loss_a, loss_r);
  TT_CHECK_EQ(same, n);
  TT_CHECK(same_on_all_ranks(pa, n));
  loom_ddp_free(da);
  loom_ddp_free(dr);
  loom_group_free(solo);
  loom_xent_free(x);
  loom_optim_free(oa);
  loom_optim_free(orf);
  loom_model_free(a);
  loom_model_free(r);
}

TT_TEST(deterministic_mlp) { deterministic(W_MLP, 1); }
TT_TEST(deterministic_cnn) { deterministic(W_CNN, 2); }
TT_TEST(deterministic_gpt) { deterministic(W_GPT, 1); }

/* A different config on one rank, then a different model: every rank gets
 * LOOM_ERR_MISMATCH naming the odd rank, and nobody hangs. */
TT_TEST(mismatch_is_an_error) {
  loom_model *m = NULL;
  TT_REQUIRE_OK(w_model(W_MLP, 1, &m));
  loom_ddp_opts o = loom_ddp_opts_default();
  o.check_config = true;
  o.config_hash = rank == nranks - 1 ? 0xbadull : 0x600dull;
  loom_ddp *d = NULL;
  loom_status s = loom_ddp_new(&d, m, world, &o);
  TT_CHECK(s == LOOM_ERR_MISMATCH);
  TT_CHECK(d == NULL);
  char want[64];
  snprintf(want, sizeof want, "rank %d differs from rank 0", nranks - 1);
  TT_CHECK(strstr(loom_last_error(), want) != NULL);
  TT_CHECK(strstr(loom_last_error(), "config") != NULL);
  if (rank == 0)
    printf("config mismatch: %s\n", loom_last_error());
  loom_model_free(m);

  /* Rank 1 builds a CNN where the others build an MLP. */
  TT_REQUIRE_OK(w_model(rank == 1 ? W_CNN : W_MLP, 1, &m));
  s = loom_ddp_new(&d, m, world, NULL);
  TT_CHECK(s == LOOM_ERR_MISMATCH);
  TT_CHECK(strstr(loom_last_error(), "model layout") != NULL);
  TT_CHECK(strstr(loom_last_error(), "of rank 1 differs") != NULL);
  if (rank == 0)
    printf("model mismatch: %s\n", loom_last_error());
  loom_model_free(m);

  /* Different DDP options (bucket sizes). */
  TT_REQUIRE_OK(w_model(W_MLP, 1, &m));
  o = loom_ddp_opts_default();
  o.bucket_mb = rank == 0 ? 25 : 10;
  s = loom_ddp_new(&d, m, world, &o);
  TT_CHECK(s == LOOM_ERR_MISMATCH);
  TT_CHECK(strstr(loom_last_error(), "data-parallel options") != NULL);
  /* Rank 1 runs out of memory while setting up: it says so, the others
   * name it, and nobody waits for it in a collective. */
  if (rank == 1)
    loom_alloc_fail_after(2); /* the struct, then the first bucket table */
  o = loom_ddp_opts_default();
  s = loom_ddp_new(&d, m, world, &o);
  loom_alloc_fail_after(0);
  if (rank == 1) {
    TT_CHECK(s == LOOM_ERR_NOMEM);
  } else {
    TT_CHECK(s == LOOM_ERR_REMOTE);
    TT_CHECK(strstr(loom_last_error(), "rank 1 could not set up") != NULL);
  }
  if (rank == 0)
    printf("setup failure on rank 1: %s\n", loom_last_error());
  /* And the group still works afterwards. */
  TT_REQUIRE_OK(loom_ddp_new(&d, m, world, NULL));
  loom_ddp_free(d);
  loom_model_free(m);
}

/* Rank r has 6 - r batches: the ranks that run out join; the others go on
 * averaging over the ranks still training; the replicas stay equal and match
 * one process that trains on the rows of the active ranks. */
TT_TEST(uneven_inputs_join) {
  loom_model *a = NULL, *r = NULL;
  loom_optim *oa = NULL, *orf = NULL;
  loom_xent *x = NULL;
  loom_ddp *d = NULL;
  float lr;
  TT_REQUIRE_OK(w_model(W_MLP, 300, &a));
  TT_REQUIRE_OK(w_model(W_MLP, 300, &r));
  TT_REQUIRE_OK(w_optim(W_MLP, a, &oa, &lr));
  TT_REQUIRE_OK(w_optim(W_MLP, r, &orf, &lr));
  TT_REQUIRE_OK(loom_xent_new(&x));
  loom_ddp_opts o = loom_ddp_opts_default();
  o.uneven = true;
  o.first_bucket_mb = 2e-4;
  o.bucket_mb = 1e-3;
  TT_REQUIRE_OK(loom_ddp_new(&d, a, world, &o));
  static w_batch bt;
  int mine = 6 - rank, steps = 0;
  for (int s = 0;; s++) {
    if (s < mine) {
      TT_REQUIRE_OK(loom_ddp_zero_grad(d));
      w_fill(W_MLP, 17, ((int64_t)s * nranks + rank) * B, B, &bt);
      TT_REQUIRE_OK(w_micro(a, x, &bt, 1.0f, NULL, NULL));
    } else {
      bool done;
      TT_REQUIRE_OK(loom_ddp_join(d, &done));
      if (done)
        break;
    }
    TT_REQUIRE_OK(loom_ddp_step(d, oa, lr));
    steps++;
    /* The reference: the rows of the ranks with a batch at step s. */
    int active = 0;
    for (int q = 0; q < nranks; q++)
      active += s < 6 - q;
    loom_model_zero_grad(r);
    for (int q = 0; q < active; q++) {
      w_fill(W_MLP, 17, ((int64_t)s * nranks + q) * B, B, &bt);
      TT_REQUIRE_OK(w_micro(r, x, &bt, 1.0f / (float)active, NULL, NULL));
    }
    TT_REQUIRE_OK(
        loom_optim_step(orf, loom_model_params(r), loom_model_grads(r), lr));
  }
  TT_CHECK_EQ(steps, 6);
  int64_t n = loom_model_num_params(a);
  TT_CHECK(same_on_all_ranks(loom_model_params(a), n));
  double rd = w_reldiff(loom_model_params(a), loom_model_params(r), n);
  if (rank == 0)
    printf("uneven inputs P=%d: %d steps, max |diff| / max |p| = %.3g\n",
           nranks, steps, rd);
  TT_CHECK(rd <= 1e-5);
  loom_ddp_free(d);
  loom_xent_free(x);
  loom_optim_free(oa);
  loom_optim_free(orf);
  loom_model_free(a);
  loom_model_free(r);
}

int main(int argc, char **argv) {
  if (loom_group_world(NULL, &world) != LOOM_OK) {
    fprintf(stderr, "no world group: %s\n", loom_last_error());
    return 1;
  }
  rank = loom_group_rank(world);
  nranks = loom_group_size(world);
  tt_rank = rank;
  tt_on_fail = abort_all;
  loom_log_set_rank(rank);
  bool pow2 = (nranks & (nranks - 1)) == 0;
  /* argv[1]: "all" (default), "quick" (no accumulation or compression). */
  bool all = argc < 2 || strcmp(argv[1], "all") == 0;
  TT_RUN(equivalence_mlp);
  TT_RUN(equivalence_cnn);
  TT_RUN(equivalence_gpt);
  if (all) {
    TT_RUN(equivalence_accumulate_mlp);
    TT_RUN(equivalence_accumulate_cnn);
    TT_RUN(equivalence_accumulate_gpt);
    TT_RUN(compressed_bf16);
  }
  if (pow2) {
    TT_RUN(deterministic_mlp);
    TT_RUN(deterministic_cnn);
    TT_RUN(deterministic_gpt);
  }
  if (nranks > 1)
    TT_RUN(mismatch_is_an_error);
  TT_RUN(uneven_inputs_join);
  int rc = tt_finish();
  loom_group_free(world);
  return rc;
}
