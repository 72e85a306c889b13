/* The prefetching loader: the same batches as direct sampling whatever the
 * prefetch depth, exact resume from a saved position, data-wait figures,
 * clean shutdown (also run under ThreadSanitizer). */
#include <math.h>
#include <time.h>

#include "loom/data.h"
#include "tt.h"
#include "util.h"

static loom_dataset *images; /* 100 images of 2x3, labels 0..9 */
static loom_dataset *tokens; /* 51 windows of 8+1 tokens */

static void make_datasets(void) {
  uint8_t buf[1024];
  size_t k = 0;
  const uint8_t ih[16] = {0, 0, 8, 3, 0, 0, 0, 100, 0, 0, 0, 2, 0, 0, 0, 3};
  memcpy(buf, ih, 16);
  k = 16;
  for (int i = 0; i < 600; i++)
    buf[k++] = (uint8_t)(i * 13);
  tu_write(tu_path("im"), buf, k);
  const uint8_t lh[8] = {0, 0, 8, 1, 0, 0, 0, 100};
  memcpy(buf, lh, 8);
  for (int i = 0; i < 100; i++)
    buf[8 + i] = (uint8_t)(i % 10);
  tu_write(tu_path("lb"), buf, 108);
  if (loom_dataset_open_idx(&images, tu_path("im"), tu_path("lb"), NULL)) {
    fprintf(stderr, "%s\n", loom_last_error());
    exit(1);
  }
  uint16_t t[8 * 51 + 8];
  for (int i = 0; i < 8 * 51 + 8; i++)
    t[i] = (uint16_t)(i * 31 % 1000);
  if (loom_shard_write(tu_path("t.bin"), t, 8 * 51 + 8) != LOOM_OK) {
    fprintf(stderr, "%s\n", loom_last_error());
    exit(1);
  }
  loom_text_opts o = loom_text_opts_default();
  o.context = 8;
  o.seed = 3;
  if (loom_dataset_open_shards(&tokens, tu_path("t.bin"), &o) != LOOM_OK) {
    fprintf(stderr, "%s\n", loom_last_error());
    exit(1);
  }
}

static loom_loader_opts opts(int64_t batch, int prefetch, loom_tail tail) {
  loom_loader_opts o = loom_loader_opts_default();
  o.sampler.seed = 99;
  o.sampler.batch = batch;
  o.sampler.tail = tail;
  o.prefetch = prefetch;
  return o;
}

/* Batch `a` holds the same rows, samples and position as `b`. */
static int same_batch(const loom_batch *a, const loom_batch *b) {
  if (a->size != b->size || a->epoch != b->epoch || a->index != b->index)
    return 0;
  size_t xb = loom_tensor_bytes(&a->x), yb = loom_tensor_bytes(&a->y);
  return xb == loom_tensor_bytes(&b->x) && yb == loom_tensor_bytes(&b->y) &&
         memcmp(a->x.data, b->x.data, xb) == 0 &&
         memcmp(a->y.data, b->y.data, yb) == 0 &&
         memcmp(a->sample, b->sample, (size_t)a->size * sizeof *a->sample) == 0;
}

/* The loader's batches equal sampler + fill done by hand, over several
 * epochs, for every prefetch depth and tail rule. */
TT_TEST(test_same_as_direct) {
  loom_dataset *sets[2] = {images, tokens};
  for (int d = 0; d < 2; d++)
    for (int tail = 0; tail < LOOM_TAIL_COUNT; tail++)
      for (int pf = 0; pf <= 3; pf += 3) {
        loom_loader_opts o = opts(7, pf, (loom_tail)tail);
        loom_loader *l = NULL;
        TT_REQUIRE_OK(loom_loader_new(&l, sets[d], &o));
        loom_sampler *s = NULL;
        TT_REQUIRE_OK(
            loom_sampler_new(&s, loom_dataset_len(sets[d]), &o.sampler));
        int64_t nb = loom_sampler_num_batches(s);
        TT_CHECK_EQ(loom_loader_batches_per_epoch(l), nb);
        loom_batch ref;
        TT_REQUIRE_OK(loom_batch_alloc(&ref, sets[d], 7));
        int bad = 0;
        for (int64_t step = 0; step < 3 * nb + 2; step++) {
          int64_t e = step / nb, b = step % nb, idx[7], cnt;
          TT_REQUIRE_OK(loom_sampler_set_epoch(s, e));
          TT_REQUIRE_OK(loom_sampler_batch(s, b, idx, &cnt));
          TT_REQUIRE_OK(loom_dataset_fill(sets[d], e, idx, cnt, &ref));
          ref.index = b;
          const loom_batch *got = NULL;
          TT_REQUIRE_OK(loom_loader_next(l, &got));
          bad += !same_batch(got, &ref);
          bad += got->last_in_epoch != (b == nb - 1);
        }
        TT_CHECK_EQ(bad, 0);
        TT_CHECK_EQ(loom_loader_served(l), 3 * nb + 2);
        loom_batch_free(&ref);
        loom_sampler_free(s);
        loom_loader_free(l);
      }
}

/* Copies of the next n batches (x and y bytes, positions). */
typedef struct rec {
  int64_t epoch, index;
  uint8_t x[7 * 6 * 4], y[7 * 4];
} rec;

static loom_status record(loom_loader *l, rec *r, int n) {
  for (int i = 0; i < n; i++) {
    const loom_batch *b;
    LOOM_TRY(loom_loader_next(l, &b));
    r[i].epoch = b->epoch;
    r[i].index = b->index;
    memset(r[i].x, 0, sizeof r[i].x);
    memset(r[i].y, 0, sizeof r[i].y);
    memcpy(r[i].x, b->x.data, loom_tensor_bytes(&b->x));
    memcpy(r[i].y, b->y.data, loom_tensor_bytes(&b->y));
  }
  return LOOM_OK;
}

/* Stop anywhere, save the position, resume in a new loader: the batches
 * continue exactly as in the uninterrupted run. */
TT_TEST(test_resume) {
  enum { TOTAL = 60 };
  static rec full[TOTAL], resumed[TOTAL];
  loom_loader_opts o = opts(7, 2, LOOM_TAIL_DROP); /* 14 batches/epoch */
  loom_loader *l = NULL;
  TT_REQUIRE_OK(loom_loader_new(&l, images, &o));
  TT_REQUIRE_OK(record(l, full, TOTAL));
  loom_loader_free(l);
  const int stops[] = {0, 1, 13, 14, 15, 37};
  for (size_t k = 0; k < sizeof stops / sizeof stops[0]; k++) {
    int at = stops[k];
    TT_REQUIRE_OK(loom_loader_new(&l, images, &o));
    TT_REQUIRE_OK(record(l, resumed, at));
    loom_loader_state st;
    loom_loader_get_state(l, &st);
    TT_CHECK_EQ(st.epoch, at / 14);
    TT_CHECK_EQ(st.batch, at % 14);
    TT_CHECK_EQ(st.global_batch, 7);
    loom_loader_free(l); /* the run stops (batches prefetched are lost) */
    for (int pf = 0; pf <= 4; pf += 4) {
      loom_loader_opts o2 = o;
      o2.prefetch = pf;
      TT_REQUIRE_OK(loom_loader_new(&l, images, &o2));
      TT_REQUIRE_OK(loom_loader_set_state(l, &st));
      TT_REQUIRE_OK(record(l, resumed + at, TOTAL - at));
      TT_CHECK(memcmp(full, resumed, sizeof full) == 0);
      loom_loader_free(l);
    }
  }
  /* set_state on a running loader rewinds it */
  TT_REQUIRE_OK(loom_loader_new(&l, images, &o));
  TT_REQUIRE_OK(record(l, resumed, 20));
  loom_loader_state st = {0, 5, 7};
  TT_REQUIRE_OK(loom_loader_set_state(l, &st));
  TT_REQUIRE_OK(record(l, resumed, 10));
  TT_CHECK(memcmp(full + 5, resumed, 10 * sizeof(rec)) == 0);
  /* the end of an epoch is the start of the next */
  st.batch = 14;
  TT_REQUIRE_OK(loom_loader_set_state(l, &st));
  TT_REQUIRE_OK(record(l, resumed, 1));
  TT_CHECK(memcmp(full + 14, resumed, sizeof(rec)) == 0);
  st.batch = 15;
  TT_CHECK_EQ(loom_loader_set_state(l, &st), LOOM_ERR_INVALID_ARG);
  st.batch = -1;
  TT_CHECK_EQ(loom_loader_set_state(l, &st), LOOM_ERR_INVALID_ARG);
  loom_loader_free(l);
}

/* A position saved with one global batch resumes with another after the
 * same number of samples (e.g. more ranks at the same batch per rank). */
TT_TEST(test_resume_other_global_batch) {
  loom_loader_opts o8 = opts(8, 2, LOOM_TAIL_DROP);
  loom_loader_opts o16 = opts(16, 2, LOOM_TAIL_DROP);
  loom_loader *a = NULL, *b = NULL;
  TT_REQUIRE_OK(loom_loader_new(&a, images, &o8));
  TT_REQUIRE_OK(loom_loader_new(&b, images, &o16));
  loom_loader_state st = {1, 6, 8}; /* 48 samples into epoch 1 */
  TT_REQUIRE_OK(loom_loader_set_state(a, &st));
  TT_REQUIRE_OK(loom_loader_set_state(b, &st));
  loom_loader_state sb;
  loom_loader_get_state(b, &sb);
  TT_CHECK_EQ(sb.epoch, 1);
  TT_CHECK_EQ(sb.batch, 3);
  TT_CHECK_EQ(sb.global_batch, 16);
  const loom_batch *x1, *x2, *y;
  int64_t s1[8], s2[8];
  TT_REQUIRE_OK(loom_loader_next(a, &x1));
  memcpy(s1, x1->sample, sizeof s1);
  TT_REQUIRE_OK(loom_loader_next(a, &x2));
  memcpy(s2, x2->sample, sizeof s2);
  TT_REQUIRE_OK(loom_loader_next(b, &y));
  TT_CHECK(memcmp(y->sample, s1, sizeof s1) == 0);
  TT_CHECK(memcmp(y->sample + 8, s2, sizeof s2) == 0);
  st.batch = 5; /* 40 samples: not a whole batch of 16 */
  TT_CHECK_EQ(loom_loader_set_state(b, &st), LOOM_ERR_MISMATCH);
  loom_loader_free(a);
  loom_loader_free(b);
}

/* Positions whose arithmetic would overflow, or that lie past the end of
 * an epoch, are refused naming the field, never wrapped or rounded into
 * the next epoch. images: 100 samples, batch 7, drop: 14 batches. */
TT_TEST(test_state_ranges) {
  loom_loader_opts o = opts(7, 0, LOOM_TAIL_DROP);
  loom_loader *l = NULL;
  TT_REQUIRE_OK(loom_loader_new(&l, images, &o));
  struct {
    loom_loader_state st;
    loom_status want;
    const char *says;
  } cases[] = {
      {{0, INT64_MAX / 2, 3}, LOOM_ERR_INVALID_ARG, "batch"},
      {{0, INT64_MAX, INT64_MAX}, LOOM_ERR_INVALID_ARG, "batch"},
      {{INT64_MAX, 2, 7}, LOOM_ERR_INVALID_ARG, "epoch"},
      {{INT64_MAX, 14, 7}, LOOM_ERR_INVALID_ARG, "epoch"},
      {{-1, 0, 7}, LOOM_ERR_INVALID_ARG, "epoch"},
      {{0, -1, 7}, LOOM_ERR_INVALID_ARG, "batch"},
      {{0, 0, -7}, LOOM_ERR_INVALID_ARG, "global_batch"},
      /* 4000 samples of a 100-sample epoch, at another global batch */
      {{0, 1000, 4}, LOOM_ERR_INVALID_ARG, "beyond"},
      {{0, 26, 4}, LOOM_ERR_INVALID_ARG, "beyond"}, /* ceil(100/4) = 25 */
      {{0, 15, 7}, LOOM_ERR_INVALID_ARG, "beyond"},
      {{0, 5, 8}, LOOM_ERR_MISMATCH, "global batches"}, /* 40 of 7s */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TT_CHECK_EQ(loom_loader_set_state(l, &cases[i].st), cases[i].want);
    TT_CHECK_HAS(loom_last_error(), cases[i].says);
  }
  /* the ends still work: the last batches at another global batch (25 of
   * 4 = 100 samples: the next epoch; 14 of 7 likewise) */
  loom_loader_state st = {3, 25, 4}, got;
  o = opts(4, 0, LOOM_TAIL_DROP);
  loom_loader *l4 = NULL;
  TT_REQUIRE_OK(loom_loader_new(&l4, images, &o));
  TT_CHECK_OK(loom_loader_set_state(l4, &st));
  loom_loader_get_state(l4, &got);
  TT_CHECK_EQ(got.epoch, 4);
  TT_CHECK_EQ(got.batch, 0);
  loom_loader_free(l4);
  st = (loom_loader_state){(int64_t)1 << 40, 14, 7};
  TT_CHECK_OK(loom_loader_set_state(l, &st));
  loom_loader_get_state(l, &got);
  TT_CHECK_EQ(got.epoch, ((int64_t)1 << 40) + 1);
  const loom_batch *b;
  TT_CHECK_OK(loom_loader_next(l, &b));
  /* seek */
  TT_CHECK_EQ(loom_loader_seek(l, INT64_MAX, 4), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "epoch");
  TT_CHECK_EQ(loom_loader_seek(l, INT64_MAX - 1, 100), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_loader_seek(l, -1, 0), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_loader_seek(l, 0, 101), LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_loader_seek(l, 2, 100));
  loom_loader_get_state(l, &got);
  TT_CHECK_EQ(got.epoch, 3);
  TT_CHECK_OK(loom_loader_next(l, &b));
  loom_loader_free(l);
}

/* A batch allocated for one data set is refused by another whose rows do
 * not fit it (kind, dtype or sample shape), not written past. */
TT_TEST(test_fill_foreign_batch) {
  loom_batch bt, bi;
  TT_REQUIRE_OK(loom_batch_alloc(&bt, tokens, 2)); /* x i32 (2, 8) */
  TT_REQUIRE_OK(loom_batch_alloc(&bi, images, 2)); /* x f32 (2, 1, 2, 3) */
  int64_t idx[2] = {0, 1};
  TT_CHECK_EQ(loom_dataset_fill(images, 0, idx, 2, &bt), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "not allocated for");
  TT_CHECK_EQ(loom_dataset_fill(tokens, 0, idx, 2, &bi), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "not allocated for");
  /* the same kind with another sample shape */
  loom_batch other = bi;
  other.x.shape[3] = 2;
  TT_CHECK_EQ(loom_dataset_fill(images, 0, idx, 2, &other),
              LOOM_ERR_INVALID_ARG);
  other = bt;
  other.y.shape[1] = 9;
  TT_CHECK_EQ(loom_dataset_fill(tokens, 0, idx, 2, &other),
              LOOM_ERR_INVALID_ARG);
  /* a batch that was freed */
  loom_batch gone;
  memset(&gone, 0, sizeof gone);
  TT_CHECK_EQ(loom_dataset_fill(images, 0, idx, 0, &gone),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_dataset_fill(images, 0, idx, 2, &bi));
  TT_CHECK_OK(loom_dataset_fill(tokens, 0, idx, 2, &bt));
  loom_batch_free(&bt);
  loom_batch_free(&bi);
}

/* Two ranks with batch 4 together make the batches of one rank with batch
 * 8, rows in rank order, token windows included (their offsets are keyed by
 * epoch, not rank). */
TT_TEST(test_ranks_make_the_global_batch) {
  loom_dataset *sets[2] = {images, tokens};
  for (int d = 0; d < 2; d++) {
    loom_loader_opts o1 = opts(8, 2, LOOM_TAIL_PAD);
    loom_loader *one = NULL, *rk[2] = {NULL, NULL};
    TT_REQUIRE_OK(loom_loader_new(&one, sets[d], &o1));
    for (int r = 0; r < 2; r++) {
      loom_loader_opts o = opts(4, 1, LOOM_TAIL_PAD);
      o.sampler.rank = r;
      o.sampler.world = 2;
      TT_REQUIRE_OK(loom_loader_new(&rk[r], sets[d], &o));
    }
    int bad = 0;
    for (int step = 0; step < 40; step++) {
      const loom_batch *g, *a, *b;
      TT_REQUIRE_OK(loom_loader_next(one, &g));
      TT_REQUIRE_OK(loom_loader_next(rk[0], &a));
      TT_REQUIRE_OK(loom_loader_next(rk[1], &b));
      size_t xh = loom_tensor_bytes(&a->x), yh = loom_tensor_bytes(&a->y);
      bad += a->size + b->size != g->size;
      bad += memcmp(g->x.data, a->x.data, xh) != 0;
      bad += memcmp((const uint8_t *)g->x.data + xh, b->x.data, xh) != 0;
      bad += memcmp(g->y.data, a->y.data, yh) != 0;
      bad += memcmp((const uint8_t *)g->y.data + yh, b->y.data, yh) != 0;
      bad += a->epoch != g->epoch || b->index != g->index;
    }
    TT_CHECK_EQ(bad, 0);
    loom_loader_free(one);
    loom_loader_free(rk[0]);
    loom_loader_free(rk[1]);
  }
}

static void sleep_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* wait_s is what next() blocked; the totals add up. No figure is compared
 * with a time limit. */
TT_TEST(test_data_wait) {
  for (int pf = 0; pf <= 2; pf += 2) {
    loom_loader_opts o = opts(10, pf, LOOM_TAIL_PAD);
    loom_loader *l = NULL;
    TT_REQUIRE_OK(loom_loader_new(&l, images, &o));
    double sum = 0;
    int neg = 0;
    for (int i = 0; i < 25; i++) {
      const loom_batch *b;
      TT_REQUIRE_OK(loom_loader_next(l, &b));
      neg += b->wait_s < 0;
      sum += b->wait_s;
      if (pf && i % 5 == 0)
        sleep_ms(1); /* some compute: the thread gets ahead */
    }
    TT_CHECK_EQ(neg, 0);
    TT_CHECK_NEAR(loom_loader_wait_total(l), sum, 1e-9);
    TT_CHECK_EQ(loom_loader_served(l), 25);
    if (pf == 0) /* without a thread every batch is made while waiting */
      TT_CHECK(sum > 0);
    loom_loader_free(l);
  }
}

/* Start and stop loaders in every state: blocked on a full ring, in the
 * middle of an epoch, right after creation. Leaks and races show under
 * ASan and TSan. */
TT_TEST(test_shutdown) {
  for (int i = 0; i < 50; i++) {
    loom_loader_opts o = opts(1 + i % 9, 1 + i % 4, (loom_tail)(i % 3));
    loom_loader *l = NULL;
    TT_REQUIRE_OK(loom_loader_new(&l, i % 2 ? images : tokens, &o));
    for (int k = 0; k < i % 7; k++) {
      const loom_batch *b;
      TT_REQUIRE_OK(loom_loader_next(l, &b));
    }
    if (i % 5 == 0) {
      loom_loader_state st = {2, 1, 0};
      TT_REQUIRE_OK(loom_loader_set_state(l, &st));
    }
    loom_loader_free(l);
  }
  loom_loader_free(NULL);
}

TT_TEST(test_bad_options) {
  loom_loader *l = NULL;
  loom_loader_opts o = opts(7, 65, LOOM_TAIL_DROP);
  TT_CHECK_EQ(loom_loader_new(&l, images, &o), LOOM_ERR_INVALID_ARG);
  o = opts(200, 2, LOOM_TAIL_DROP); /* 100 samples, drop: no batch */
  TT_CHECK_EQ(loom_loader_new(&l, images, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK(l == NULL);
  /* every allocation of loom_loader_new fails in turn, cleanly */
  int failures = 0;
  for (long n = 1; n < 40; n++) {
    o = opts(7, 2, LOOM_TAIL_DROP);
    loom_alloc_fail_after(n);
    loom_status st = loom_loader_new(&l, images, &o);
    loom_alloc_fail_after(0);
    if (st == LOOM_OK) {
      loom_loader_free(l);
      break;
    }
    TT_CHECK_EQ(st, LOOM_ERR_NOMEM);
    failures++;
  }
  TT_CHECK(failures >= 5);
}

/* loom_dataset_from_arrays: the caller's f32 samples and i32 labels (one
 * above 255), copied; the loader serves them as given, each sample once an
 * epoch, shuffled, with a partial last batch; bad input named. */
TT_TEST(test_from_arrays) {
  enum { N = 37, D = 5 };
  float x[N * D];
  int32_t y[N];
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < D; j++)
      x[i * D + j] = (float)(i * 10 + j) + 0.25f;
    y[i] = i == 7 ? 300 : i % 4;
  }
  loom_array_opts ao = loom_array_opts_default();
  ao.name = "mine";
  loom_dataset *ds = NULL;
  TT_REQUIRE_OK(loom_dataset_from_arrays(&ds, x, y, N, 1, 1, D, &ao));
  loom_dataset_info info;
  loom_dataset_get_info(ds, &info);
  TT_CHECK_EQ(info.kind, LOOM_DATASET_IMAGES);
  TT_CHECK_EQ(info.len, N);
  TT_CHECK(info.C == 1 && info.H == 1 && info.W == D);
  TT_CHECK_EQ(info.classes, 301);
  TT_CHECK_STR(info.source, "mine");
  float keep[N * D];
  memcpy(keep, x, sizeof x);
  for (int i = 0; i < N * D; i++) /* copied: the caller's arrays are free */
    x[i] = -1.0f;
  loom_loader_opts o = opts(8, 2, LOOM_TAIL_PARTIAL);
  loom_loader *l = NULL;
  TT_REQUIRE_OK(loom_loader_new(&l, ds, &o));
  for (int e = 0; e < 2; e++) {
    int seen[N] = {0};
    bool last = false, in_order = true;
    int64_t rows = 0;
    while (!last) {
      const loom_batch *b;
      TT_REQUIRE_OK(loom_loader_next(l, &b));
      TT_CHECK_EQ(b->epoch, e);
      for (int64_t r = 0; r < b->size; r++) {
        int64_t i = b->sample[r];
        seen[i]++;
        in_order = in_order && i == rows;
        rows++;
        const float *row = (const float *)b->x.data + r * D;
        TT_CHECK(memcmp(row, keep + i * D, D * sizeof(float)) == 0);
        TT_CHECK_EQ(((const int32_t *)b->y.data)[r], i == 7 ? 300 : i % 4);
      }
      last = b->last_in_epoch;
      if (last)
        TT_CHECK_EQ(b->size, N % 8); /* the partial tail */
    }
    int once = 0;
    for (int i = 0; i < N; i++)
      once += seen[i] == 1;
    TT_CHECK_EQ(once, N);
    TT_CHECK(!in_order); /* shuffled */
  }
  loom_loader_free(l);
  loom_dataset_free(ds);

  /* Bad input: each refused, naming the set and the sample. */
  memcpy(x, keep, sizeof x);
  loom_dataset *bad = NULL;
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, NULL, y, N, 1, 1, D, &ao),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "mine: x (the samples) is NULL");
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, 0, 1, 1, D, &ao),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, N, 1, 0, D, &ao),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "tabular data: C = H = 1, W features");
  TT_CHECK_EQ(loom_dataset_from_arrays(NULL, x, y, N, 1, 1, D, &ao),
              LOOM_ERR_INVALID_ARG);
  ao.classes = 4; /* label 300 of sample 7 is outside */
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, N, 1, 1, D, &ao),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "label 300 of sample 7 is outside [0, 4)");
  ao.classes = -1;
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, N, 1, 1, D, &ao),
              LOOM_ERR_INVALID_ARG);
  ao.classes = 0;
  y[3] = -2;
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, N, 1, 1, D, &ao),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "label -2 of sample 3");
  y[3] = 3;
  x[12 * D + 4] = NAN;
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, N, 1, 1, D, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "arrays: sample 12, value 4 is nan");
  x[12 * D + 4] = INFINITY;
  TT_CHECK_EQ(loom_dataset_from_arrays(&bad, x, y, N, 1, 1, D, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK(bad == NULL);
}

int main(void) {
  tu_tmpdir();
  make_datasets();
  TT_RUN(test_same_as_direct);
  TT_RUN(test_resume);
  TT_RUN(test_resume_other_global_batch);
  TT_RUN(test_state_ranges);
  TT_RUN(test_fill_foreign_batch);
  TT_RUN(test_ranks_make_the_global_batch);
  TT_RUN(test_data_wait);
  TT_RUN(test_shutdown);
  TT_RUN(test_bad_options);
  TT_RUN(test_from_arrays);
  loom_dataset_free(images);
  loom_dataset_free(tokens);
  tu_cleanup();
  return tt_finish();
}
