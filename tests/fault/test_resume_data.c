/* Resuming the data position on another world size: a job of Wa ranks saves
 * its position after k global batches, a job of Wb ranks (simulated here as
 * Wb loaders in one process) seeks to it; within the epoch every sample
 * comes in the epoch's order with none skipped or repeated, whatever the
 * tail rule, and the next epoch is the usual one. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "loom/data.h"
#include "tt.h"

#define N 103 /* samples: a prime, so no global batch divides it */

static loom_dataset *ds;

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

/* N images of 1x1 pixel and their labels, as IDX files. */
static int make_dataset(const char *dir) {
  char im[256], lb[256];
  snprintf(im, sizeof im, "%s/images", dir);
  snprintf(lb, sizeof lb, "%s/labels", dir);
  unsigned char b[16 + N];
  put_be32(b, 0x803);
  put_be32(b + 4, N);
  put_be32(b + 8, 1);
  put_be32(b + 12, 1);
  for (int i = 0; i < N; i++)
    b[16 + i] = (unsigned char)i;
  FILE *f = fopen(im, "wb");
  if (!f || fwrite(b, 1, 16 + N, f) != 16 + N || fclose(f) != 0)
    return 1;
  put_be32(b, 0x801);
  put_be32(b + 4, N);
  for (int i = 0; i < N; i++)
    b[8 + i] = (unsigned char)(i % 10);
  f = fopen(lb, "wb");
  if (!f || fwrite(b, 1, 8 + N, f) != 8 + N || fclose(f) != 0)
    return 1;
  return loom_dataset_open_idx(&ds, im, lb, NULL) != LOOM_OK;
}

static loom_loader_opts opts(int64_t batch, int rank, int world, loom_tail tail,
                             int prefetch) {
  loom_loader_opts o = loom_loader_opts_default();
  o.sampler.seed = 7;
  o.sampler.batch = batch;
  o.sampler.rank = rank;
  o.sampler.world = world;
  o.sampler.tail = tail;
  o.prefetch = prefetch;
  return o;
}

/* The order of epoch `epoch`: one rank, batches of one, nothing dropped. */
static void epoch_order(int64_t epoch, int64_t *order) {
  loom_loader *l = NULL;
  loom_loader_opts o = opts(1, 0, 1, LOOM_TAIL_PARTIAL, 0);
  TT_REQUIRE_OK(loom_loader_new(&l, ds, &o));
  loom_loader_state st = {epoch, 0, 1};
  TT_REQUIRE_OK(loom_loader_set_state(l, &st));
  for (int i = 0; i < N; i++) {
    const loom_batch *b;
    TT_REQUIRE_OK(loom_loader_next(l, &b));
    order[i] = b->sample[0];
  }
  loom_loader_free(l);
}

/* A job of W ranks with batch B per rank. */
typedef struct job {
  int world;
  loom_loader *l[4];
} job;

static loom_status job_new(job *j, int world, int64_t batch, loom_tail tail,
                           int prefetch) {
  j->world = world;
  for (int r = 0; r < world; r++) {
    loom_loader_opts o = opts(batch, r, world, tail, prefetch);
    LOOM_TRY(loom_loader_new(&j->l[r], ds, &o));
  }
  return LOOM_OK;
}

static void job_free(job *j) {
  for (int r = 0; r < j->world; r++)
    loom_loader_free(j->l[r]);
}

/* One global batch: every rank's rows in rank order appended to ids. */
static loom_status job_next(job *j, int64_t *ids, int64_t *n, int64_t *epoch,
                            int64_t *index) {
  for (int r = 0; r < j->world; r++) {
    const loom_batch *b;
    LOOM_TRY(loom_loader_next(j->l[r], &b));
    for (int64_t i = 0; i < b->size; i++)
      ids[(*n)++] = b->sample[i];
    if (r == 0) {
      *epoch = b->epoch;
      *index = b->index;
    } else if (b->epoch != *epoch || b->index != *index) {
      return loom_error(LOOM_ERR_INTERNAL, "ranks at different batches");
    }
  }
  return LOOM_OK;
}

/* Wa ranks take k global batches, Wb ranks go on from there to the end of
 * the epoch, and Wc ranks after them once more (two resumes); then epoch 1
 * must be the usual one. */
static bool reported; /* one case printed per failing test is enough */

static void check_chain(loom_tail tail, int64_t B, int wa, int64_t k, int wb,
                        int64_t k2, int wc, int prefetch) {
  static int64_t order[N], ids[4 * N];
  epoch_order(0, order);
  int64_t n = 0, epoch = 0, index = 0, sample = 0, at_epoch = 0;
  int64_t gb_end = 0; /* the global batch of the job that ended the epoch */
  int worlds[3] = {wa, wb, wc};
  int64_t takes[3] = {k, k2, -1}; /* -1: to the end of the epoch */
  for (int s = 0; s < 3; s++) {
    job j;
    memset(&j, 0, sizeof j);
    TT_REQUIRE_OK(job_new(&j, worlds[s], B, tail, prefetch));
    if (s > 0)
      for (int r = 0; r < j.world; r++)
        TT_REQUIRE_OK(loom_loader_seek(j.l[r], at_epoch, sample));
    int64_t gb = B * worlds[s];
    for (int64_t t = 0; takes[s] < 0 || t < takes[s]; t++) {
      loom_loader_state st;
      loom_loader_get_state(j.l[0], &st);
      if (st.epoch != 0)
        break;
      int64_t before = n;
      TT_REQUIRE_OK(job_next(&j, ids, &n, &epoch, &index));
      TT_REQUIRE(epoch == 0);
      TT_CHECK(n - before <= gb);
    }
    loom_loader_state st;
    loom_loader_get_state(j.l[0], &st);
    if (at_epoch == 0 && st.epoch != 0)
      gb_end = gb;
    at_epoch = st.epoch;
    sample = loom_loader_sample(j.l[0]);
    for (int r = 1; r < j.world; r++)
      TT_CHECK_EQ(loom_loader_sample(j.l[r]), sample);
    if (s == 2) {
      /* Epoch 1 as a fresh job of Wc ranks starts it. */
      static int64_t got[4 * N], want[4 * N];
      int64_t ng = 0, nw = 0, e1, i1, e2, i2;
      TT_REQUIRE_OK(job_next(&j, got, &ng, &e1, &i1));
      job f;
      memset(&f, 0, sizeof f);
      TT_REQUIRE_OK(job_new(&f, worlds[s], B, tail, prefetch));
      loom_loader_state e1_start = {1, 0, gb};
      for (int r = 0; r < f.world; r++)
        TT_REQUIRE_OK(loom_loader_set_state(f.l[r], &e1_start));
      TT_REQUIRE_OK(job_next(&f, want, &nw, &e2, &i2));
      TT_CHECK(e1 == 1 && i1 == 0 && e2 == 1 && i2 == 0 && ng == nw);
      TT_CHECK(memcmp(got, want, (size_t)ng * sizeof got[0]) == 0);
      job_free(&f);
    }
    job_free(&j);
  }
  /* In the epoch's order, none skipped (but what the tail rule drops at
   * the end), none repeated (but what padding adds at the end). */
  int64_t distinct = n < N ? n : N;
  bool in_order = true;
  for (int64_t i = 0; i < distinct; i++)
    in_order = in_order && ids[i] == order[i];
  for (int64_t i = N; i < n; i++)
    in_order = in_order && ids[i] == order[i - N];
  TT_CHECK(in_order);
  if (tail == LOOM_TAIL_DROP)
    TT_CHECK(n <= N && N - n < gb_end);
  else if (tail == LOOM_TAIL_PAD)
    TT_CHECK(n >= N && n - N < gb_end);
  else
    TT_CHECK_EQ(n, N);
  if (tt_cur_failed && !reported) {
    reported = true;
    fprintf(stderr,
            "  (tail %s, batch %lld, %d ranks x %lld, %d ranks x %lld, then "
            "%d ranks: %lld samples)\n",
            loom_tail_name(tail), (long long)B, wa, (long long)k, wb,
            (long long)k2, wc, (long long)n);
  }
}

TT_TEST(test_two_to_three_ranks) {
  for (int t = 0; t < LOOM_TAIL_COUNT; t++)
    for (int64_t k = 1; k <= 4; k++)
      check_chain((loom_tail)t, 4, 2, k, 3, 2, 3, 2);
}

TT_TEST(test_four_to_two_to_three) {
  for (int t = 0; t < LOOM_TAIL_COUNT; t++)
    for (int64_t k = 1; k <= 3; k++)
      for (int64_t k2 = 0; k2 <= 3; k2++)
        check_chain((loom_tail)t, 3, 4, k, 2, k2, 3, k2 & 1 ? 0 : 2);
}

TT_TEST(test_three_to_four_to_one) {
  for (int t = 0; t < LOOM_TAIL_COUNT; t++)
    for (int64_t k = 1; k <= 5; k++)
      check_chain((loom_tail)t, 5, 3, k, 4, 1, 1, 1);
}

/* The last few samples of an epoch are fewer than a global batch of the
 * new job: with tail drop the epoch is over. */
TT_TEST(test_seek_edges) {
  job j;
  memset(&j, 0, sizeof j);
  TT_REQUIRE_OK(job_new(&j, 2, 8, LOOM_TAIL_DROP, 2));
  TT_REQUIRE_OK(loom_loader_seek(j.l[0], 0, N - 5));
  TT_CHECK_EQ(loom_loader_sample(j.l[0]), 0);
  const loom_batch *b;
  TT_REQUIRE_OK(loom_loader_next(j.l[0], &b));
  TT_CHECK(b->epoch == 1 && b->index == 0);
  /* A whole number of global batches: the usual position. */
  TT_REQUIRE_OK(loom_loader_seek(j.l[0], 2, 32));
  loom_loader_state st;
  loom_loader_get_state(j.l[0], &st);
  TT_CHECK(st.epoch == 2 && st.batch == 2);
  TT_CHECK_EQ(loom_loader_epoch_batches(j.l[0], 2), N / 16);
  /* Mid-batch: fewer or more batches in that epoch, starting there. */
  TT_REQUIRE_OK(loom_loader_seek(j.l[0], 2, 20));
  TT_CHECK_EQ(loom_loader_epoch_batches(j.l[0], 2), (N - 20) / 16);
  TT_CHECK_EQ(loom_loader_epoch_batches(j.l[0], 3), N / 16);
  TT_CHECK_EQ(loom_loader_batch_first(j.l[0], 2, 1), 36);
  TT_CHECK_EQ(loom_loader_sample(j.l[0]), 20);
  TT_CHECK_EQ(loom_loader_seek(j.l[0], 0, N + 1), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_loader_seek(j.l[0], -1, 0), LOOM_ERR_INVALID_ARG);
  /* set_state forgets a seek's mid-batch start. */
  loom_loader_state s0 = {2, 1, 16};
  TT_REQUIRE_OK(loom_loader_set_state(j.l[0], &s0));
  TT_CHECK_EQ(loom_loader_sample(j.l[0]), 16);
  job_free(&j);
}

int main(void) {
  char dir[] = "/tmp/loom_resume_data.XXXXXX";
  if (!mkdtemp(dir) || make_dataset(dir)) {
    fprintf(stderr, "cannot make the data set: %s\n", loom_last_error());
    return 1;
  }
  TT_RUN(test_two_to_three_ranks);
  TT_RUN(test_four_to_two_to_three);
  TT_RUN(test_three_to_four_to_one);
  TT_RUN(test_seek_edges);
  loom_dataset_free(ds);
  char p[300];
  snprintf(p, sizeof p, "%s/images", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/labels", dir);
  unlink(p);
  rmdir(dir);
  return tt_finish();
}
