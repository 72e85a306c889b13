/* The distributed sampler: coverage per epoch, disjoint ranks, the tail
 * rules, epochs and seeds, and the same global batches at any world size. */
#include "loom/data.h"
#include "tt.h"

static loom_sampler *make(int64_t n, uint64_t seed, loom_tail tail,
                          int64_t batch, int rank, int world) {
  loom_sampler_opts o = loom_sampler_opts_default();
  o.seed = seed;
  o.tail = tail;
  o.batch = batch;
  o.rank = rank;
  o.world = world;
  loom_sampler *s = NULL;
  if (loom_sampler_new(&s, n, &o) != LOOM_OK) {
    fprintf(stderr, "sampler_new: %s\n", loom_last_error());
    return NULL;
  }
  return s;
}

/* The whole epoch as one rank sees it: out (nb*B), returns rows. */
static int64_t epoch_rows(loom_sampler *s, int64_t *out) {
  int64_t k = 0, cnt;
  for (int64_t b = 0; b < loom_sampler_num_batches(s); b++) {
    if (loom_sampler_batch(s, b, out + k, &cnt) != LOOM_OK)
      return -1;
    k += cnt;
  }
  return k;
}

TT_TEST(test_once_per_epoch) {
  const int64_t N = 1000;
  int64_t rows[1100];
  int seen[1000];
  for (int tail = 0; tail < LOOM_TAIL_COUNT; tail++) {
    loom_sampler *s = make(N, 5, (loom_tail)tail, 64, 0, 1);
    TT_REQUIRE(s != NULL);
    for (int64_t e = 0; e < 3; e++) {
      TT_REQUIRE_OK(loom_sampler_set_epoch(s, e));
      TT_CHECK_EQ(loom_sampler_epoch(s), e);
      int64_t k = epoch_rows(s, rows);
      memset(seen, 0, sizeof seen);
      for (int64_t i = 0; i < k; i++)
        seen[rows[i]]++;
      int once = 0, twice = 0, never = 0;
      for (int64_t i = 0; i < N; i++) {
        once += seen[i] == 1;
        twice += seen[i] == 2;
        never += seen[i] == 0;
      }
      if (tail == LOOM_TAIL_DROP) { /* 15 batches of 64: 40 left out */
        TT_CHECK_EQ(loom_sampler_num_batches(s), 15);
        TT_CHECK_EQ(k, 960);
        TT_CHECK_EQ(once, 960);
        TT_CHECK_EQ(never, 40);
      } else if (tail == LOOM_TAIL_PAD) { /* 16 batches: 24 repeated */
        TT_CHECK_EQ(loom_sampler_num_batches(s), 16);
        TT_CHECK_EQ(k, 1024);
        TT_CHECK_EQ(once, 976);
        TT_CHECK_EQ(twice, 24);
        TT_CHECK_EQ(never, 0);
        /* the padding repeats the epoch's order from its start */
        for (int i = 0; i < 24; i++)
          TT_CHECK_EQ(rows[1000 + i], rows[i]);
      } else { /* a short last batch of 40 */
        TT_CHECK_EQ(loom_sampler_num_batches(s), 16);
        TT_CHECK_EQ(k, 1000);
        TT_CHECK_EQ(once, 1000);
      }
    }
    loom_sampler_free(s);
  }
  loom_sampler_free(NULL);
}

TT_TEST(test_disjoint_ranks) {
  const int64_t N = 1000;
  const int W = 3;
  for (int tail = 0; tail < LOOM_TAIL_COUNT; tail++) {
    int64_t rows[3][400], k[3];
    int seen[1000] = {0};
    int64_t nb = -1;
    for (int r = 0; r < W; r++) {
      loom_sampler *s = make(N, 11, (loom_tail)tail, 32, r, W);
      TT_REQUIRE(s != NULL);
      TT_REQUIRE_OK(loom_sampler_set_epoch(s, 4));
      if (nb < 0)
        nb = loom_sampler_num_batches(s);
      TT_CHECK_EQ(loom_sampler_num_batches(s), nb); /* same on all ranks */
      k[r] = epoch_rows(s, rows[r]);
      loom_sampler_free(s);
    }
    for (int r = 0; r < W; r++)
      for (int64_t i = 0; i < k[r]; i++)
        seen[rows[r][i]]++;
    int64_t total = k[0] + k[1] + k[2], covered = 0, dup = 0;
    for (int i = 0; i < N; i++) {
      covered += seen[i] > 0;
      dup += seen[i] > 1;
    }
    if (tail == LOOM_TAIL_DROP) { /* 10 global batches of 96 */
      TT_CHECK_EQ(nb, 10);
      TT_CHECK_EQ(total, 960);
      TT_CHECK_EQ(dup, 0);
      TT_CHECK_EQ(k[0], k[2]);
    } else if (tail == LOOM_TAIL_PAD) { /* 11 x 96 = 1056: 56 repeated */
      TT_CHECK_EQ(nb, 11);
      TT_CHECK_EQ(total, 1056);
      TT_CHECK_EQ(covered, N);
      TT_CHECK_EQ(dup, 56);
      TT_CHECK(k[0] == k[1] && k[1] == k[2]); /* no rank runs short */
    } else { /* the last global batch has 40 rows: 32 + 8 + 0 */
      TT_CHECK_EQ(total, N);
      TT_CHECK_EQ(dup, 0);
      TT_CHECK_EQ(k[0], 10 * 32 + 32);
      TT_CHECK_EQ(k[1], 10 * 32 + 8);
      TT_CHECK_EQ(k[2], 10 * 32);
    }
  }
}

TT_TEST(test_epochs_and_seeds) {
  const int64_t N = 500;
  int64_t a[500], b[500], c[500];
  loom_sampler *s1 = make(N, 1, LOOM_TAIL_PARTIAL, 50, 0, 1);
  loom_sampler *s2 = make(N, 1, LOOM_TAIL_PARTIAL, 50, 0, 1);
  loom_sampler *s3 = make(N, 2, LOOM_TAIL_PARTIAL, 50, 0, 1);
  TT_REQUIRE(s1 && s2 && s3);
  TT_REQUIRE_OK(loom_sampler_set_epoch(s1, 0));
  epoch_rows(s1, a);
  TT_REQUIRE_OK(loom_sampler_set_epoch(s1, 1));
  epoch_rows(s1, b);
  TT_CHECK(memcmp(a, b, sizeof a) != 0); /* epochs differ */
  /* the same seed and epoch give the same order, reached in any order */
  TT_REQUIRE_OK(loom_sampler_set_epoch(s2, 7));
  TT_REQUIRE_OK(loom_sampler_set_epoch(s2, 1));
  epoch_rows(s2, c);
  TT_CHECK(memcmp(b, c, sizeof b) == 0);
  TT_REQUIRE_OK(loom_sampler_set_epoch(s1, 0));
  epoch_rows(s1, c);
  TT_CHECK(memcmp(a, c, sizeof a) == 0);
  /* another seed, another order */
  TT_REQUIRE_OK(loom_sampler_set_epoch(s3, 0));
  epoch_rows(s3, c);
  TT_CHECK(memcmp(a, c, sizeof a) != 0);
  /* shuffled: not the identity */
  int fixed = 0;
  for (int i = 0; i < N; i++)
    fixed += a[i] == i;
  TT_CHECK(fixed < 20);
  loom_sampler_free(s1);
  loom_sampler_free(s2);
  loom_sampler_free(s3);

  /* without shuffle the order is the identity in every epoch */
  loom_sampler_opts o = loom_sampler_opts_default();
  o.shuffle = false;
  o.batch = 7;
  o.tail = LOOM_TAIL_PARTIAL;
  loom_sampler *s = NULL;
  TT_REQUIRE_OK(loom_sampler_new(&s, N, &o));
  TT_REQUIRE_OK(loom_sampler_set_epoch(s, 3));
  TT_CHECK_EQ(epoch_rows(s, c), N);
  int id = 1;
  for (int i = 0; i < N; i++)
    id &= c[i] == i;
  TT_CHECK(id);
  loom_sampler_free(s);
}

/* Fisher-Yates done right reaches every permutation about equally often:
 * 2400 epochs of 4 samples, each of the 24 orders about 100 times. */
TT_TEST(test_shuffle_uniform) {
  loom_sampler *s = make(4, 123, LOOM_TAIL_DROP, 4, 0, 1);
  TT_REQUIRE(s != NULL);
  int count[256] = {0};
  for (int64_t e = 0; e < 2400; e++) {
    int64_t r[4], cnt;
    TT_REQUIRE_OK(loom_sampler_set_epoch(s, e));
    TT_REQUIRE_OK(loom_sampler_batch(s, 0, r, &cnt));
    count[r[0] * 64 + r[1] * 16 + r[2] * 4 + r[3]]++;
  }
  int distinct = 0, lo = 1 << 30, hi = 0;
  for (int i = 0; i < 256; i++)
    if (count[i]) {
      distinct++;
      lo = count[i] < lo ? count[i] : lo;
      hi = count[i] > hi ? count[i] : hi;
    }
  TT_CHECK_EQ(distinct, 24);
  TT_CHECK(lo > 55 && hi < 150); /* about 10 standard deviations apart */
  loom_sampler_free(s);
}

/* Global batch b is the same samples in the same order at world sizes 1, 2
 * and 4 (batch GB, GB/2, GB/4 per rank): rank r holds its slice. */
TT_TEST(test_global_batch_invariance) {
  const int64_t N = 203, GB = 16;
  for (int tail = 0; tail < LOOM_TAIL_COUNT; tail++) {
    loom_sampler *one = make(N, 77, (loom_tail)tail, GB, 0, 1);
    TT_REQUIRE(one != NULL);
    for (int64_t e = 0; e < 2; e++) {
      TT_REQUIRE_OK(loom_sampler_set_epoch(one, e));
      int64_t nb = loom_sampler_num_batches(one);
      for (int W = 2; W <= 4; W *= 2) {
        loom_sampler *rk[4];
        for (int r = 0; r < W; r++) {
          rk[r] = make(N, 77, (loom_tail)tail, GB / W, r, W);
          TT_REQUIRE(rk[r] != NULL);
          TT_REQUIRE_OK(loom_sampler_set_epoch(rk[r], e));
          TT_CHECK_EQ(loom_sampler_num_batches(rk[r]), nb);
        }
        int bad = 0;
        for (int64_t b = 0; b < nb; b++) {
          int64_t ref[16], cat[16], g[16], cnt, k = 0, gcnt;
          TT_REQUIRE_OK(loom_sampler_batch(one, b, ref, &cnt));
          for (int r = 0; r < W; r++) {
            int64_t c;
            TT_REQUIRE_OK(loom_sampler_batch(rk[r], b, cat + k, &c));
            k += c;
          }
          TT_REQUIRE_OK(loom_sampler_global_batch(rk[W - 1], b, g, &gcnt));
          bad += k != cnt || gcnt != cnt;
          for (int64_t i = 0; i < cnt && i < k; i++)
            bad += cat[i] != ref[i] || g[i] != ref[i];
        }
        TT_CHECK_EQ(bad, 0);
        for (int r = 0; r < W; r++)
          loom_sampler_free(rk[r]);
      }
    }
    loom_sampler_free(one);
  }
}

/* The order is part of loom's format: a checkpoint resumed by a later
 * version must see the same batches. These are seed 1234, epochs 0 and 1. */
TT_TEST(test_golden_order) {
  const int64_t want[2][10] = {{1, 6, 5, 2, 0, 8, 4, 9, 3, 7},
                               {1, 4, 9, 7, 3, 0, 8, 5, 2, 6}};
  loom_sampler *s = make(10, 1234, LOOM_TAIL_DROP, 10, 0, 1);
  TT_REQUIRE(s != NULL);
  for (int e = 0; e < 2; e++) {
    int64_t got[10], cnt;
    TT_REQUIRE_OK(loom_sampler_set_epoch(s, e));
    TT_REQUIRE_OK(loom_sampler_batch(s, 0, got, &cnt));
    TT_CHECK(memcmp(got, want[e], sizeof got) == 0);
  }
  loom_sampler_free(s);
}

TT_TEST(test_pad_smaller_than_batch) {
  /* 3 samples, global batch 8: the order repeats to fill it */
  loom_sampler *s = make(3, 1, LOOM_TAIL_PAD, 4, 1, 2);
  TT_REQUIRE(s != NULL);
  TT_CHECK_EQ(loom_sampler_num_batches(s), 1);
  int64_t g[8], cnt, mine[4];
  TT_REQUIRE_OK(loom_sampler_global_batch(s, 0, g, &cnt));
  TT_CHECK_EQ(cnt, 8);
  for (int i = 3; i < 8; i++)
    TT_CHECK_EQ(g[i], g[i % 3]);
  TT_REQUIRE_OK(loom_sampler_batch(s, 0, mine, &cnt));
  TT_CHECK_EQ(cnt, 4);
  TT_CHECK(memcmp(mine, g + 4, sizeof mine) == 0);
  loom_sampler_free(s);
}

TT_TEST(test_errors) {
  loom_sampler *s = NULL;
  loom_sampler_opts o = loom_sampler_opts_default();
  o.batch = 8;
  o.world = 2;
  o.rank = 2;
  TT_CHECK_EQ(loom_sampler_new(&s, 100, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "rank 2") != NULL);
  o.rank = 0;
  TT_CHECK_EQ(loom_sampler_new(&s, 0, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_sampler_new(&s, 15, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "'pad'") != NULL);
  o.batch = 0;
  TT_CHECK_EQ(loom_sampler_new(&s, 100, &o), LOOM_ERR_INVALID_ARG);
  o.batch = 8;
  TT_REQUIRE_OK(loom_sampler_new(&s, 100, &o));
  int64_t idx[8], cnt;
  TT_CHECK_EQ(loom_sampler_batch(s, 6, idx, &cnt), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_sampler_batch(s, -1, idx, &cnt), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_sampler_set_epoch(s, -1), LOOM_ERR_INVALID_ARG);
  loom_sampler_free(s);
  loom_tail t;
  TT_CHECK_OK(loom_tail_parse("pad", &t));
  TT_CHECK_EQ(t, LOOM_TAIL_PAD);
  TT_CHECK_STR(loom_tail_name(LOOM_TAIL_PARTIAL), "partial");
  TT_CHECK_EQ(loom_tail_parse("drop_last", &t), LOOM_ERR_INVALID_ARG);
}

int main(void) {
  TT_RUN(test_once_per_epoch);
  TT_RUN(test_disjoint_ranks);
  TT_RUN(test_epochs_and_seeds);
  TT_RUN(test_shuffle_uniform);
  TT_RUN(test_global_batch_invariance);
  TT_RUN(test_golden_order);
  TT_RUN(test_pad_smaller_than_batch);
  TT_RUN(test_errors);
  return tt_finish();
}
