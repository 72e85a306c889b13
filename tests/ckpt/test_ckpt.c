/* Tests of checkpoints: bitwise round trips, resharding reads (3 ranks
 * written, read as 1 and 2), every kind of damage detected with the file
 * named and the fallback to the previous valid checkpoint, keep-K pruning,
 * failed saves (fault hook at every file-system call, and a real ENOSPC on
 * a small tmpfs when mounting is allowed), async saves, allocation
 * failures and API misuse. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "loom/ckpt.h"
#include "tt.h"

/* ---------------------------------------------------------------- helpers */

static char base_dir[64];
static int root_seq;

/* A fresh, empty directory path (not created) under the test's temp dir. */
static const char *new_root(char *buf, size_t n) {
  snprintf(buf, n, "%s/r%d", base_dir, root_seq++);
  return buf;
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static bool dir_has_tmp(const char *root) {
  DIR *d = opendir(root);
  if (!d)
    return false;
  struct dirent *e;
  bool found = false;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, ".step_", 6) == 0)
      found = true;
  closedir(d);
  return found;
}

static void fill_bits(void *p, size_t bytes, uint64_t seed) {
  loom_rng r = loom_rng_init(seed, 7);
  unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++)
    b[i] = (unsigned char)loom_rng_u32(&r);
}

/* A small model: three views over N = 1003 floats. */
#define N 1003
static loom_param views_a[3], views_b[2];

static void init_views(void) {
  views_a[0] = (loom_param){
      .offset = 0, .numel = 1000, .ndim = 2, .shape = {10, 100}, .decay = true};
  snprintf(views_a[0].name, LOOM_PARAM_NAME_MAX, "fc1.weight");
  views_a[1] = (loom_param){
      .offset = 1000, .numel = 2, .ndim = 1, .shape = {2}, .decay = false};
  snprintf(views_a[1].name, LOOM_PARAM_NAME_MAX, "fc1.bias");
  views_a[2] =
      (loom_param){.offset = 1002, .numel = 1, .ndim = 0, .decay = false};
  snprintf(views_a[2].name, LOOM_PARAM_NAME_MAX, "scale");
  /* Another model with the same element count. */
  views_b[0] = (loom_param){
      .offset = 0, .numel = 1002, .ndim = 2, .shape = {2, 501}, .decay = true};
  snprintf(views_b[0].name, LOOM_PARAM_NAME_MAX, "w");
  views_b[1] = (loom_param){
      .offset = 1002, .numel = 1, .ndim = 1, .shape = {1}, .decay = false};
  snprintf(views_b[1].name, LOOM_PARAM_NAME_MAX, "b");
}

static loom_ckpt_rng rngs[2];

static loom_ckpt_meta make_meta(int64_t step, const loom_param *views, int nv) {
  loom_ckpt_meta m = loom_ckpt_meta_default();
  snprintf(m.strategy, sizeof m.strategy, "ddp");
  snprintf(m.optimizer, sizeof m.optimizer, "adamw");
  snprintf(m.schedule, sizeof m.schedule, "cosine");
  m.config_hash = 0xfedcba9876543210ULL;
  m.views = views;
  m.n_views = nv;
  m.optimizer_step = step;
  m.schedule_step = step;
  m.lr = 0.1 + 1e-17 * (double)step; /* bitwise check of doubles */
  m.loss_scale = 65536.0;
  snprintf(rngs[0].name, sizeof rngs[0].name, "dropout");
  rngs[0].state = loom_rng_init(0xffffffffffffffffULL, 3);
  loom_rng_seek(&rngs[0].state, 123456789012345ULL);
  snprintf(rngs[1].name, sizeof rngs[1].name, "data");
  rngs[1].state = loom_rng_init(42, 9);
  m.rngs = rngs;
  m.n_rngs = 2;
  m.data = (loom_ckpt_data_pos){2, 37, 37 * 128};
  m.extra_json = "{\"note\": \"hi\", \"list\": [1, 2.5, null]}";
  return m;
}

/* The buffers of one checkpoint of the small model. */
typedef struct state {
  float params[N], m[N];
  int32_t tokens[77];
  double scalar;
  uint16_t half[300];
  uint8_t bytes[5];
} state;

static void make_state(state *s, uint64_t seed) {
  fill_bits(s, sizeof *s, seed); /* every bit pattern, NaNs included */
}

static loom_status save_state(const char *root, int64_t step, const state *s,
                              const loom_param *views, int nv, int keep) {
  loom_ckpt_meta m = make_meta(step, views, nv);
  loom_ckpt_buffer bufs[] = {
      {"params", LOOM_F32, N, s->params},  {"optim.adamw.m", LOOM_F32, N, s->m},
      {"tokens", LOOM_I32, 77, s->tokens}, {"scalar", LOOM_F64, 1, &s->scalar},
      {"half", LOOM_BF16, 300, s->half},   {"bytes", LOOM_U8, 5, s->bytes},
      {"empty", LOOM_F32, 0, NULL},
  };
  return loom_ckpt_save(root, step, &m, bufs, 7, keep);
}

static void check_state(const loom_ckpt *c, const state *s) {
  state got;
  memset(&got, 0xab, sizeof got);
  TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, N, got.params));
  TT_CHECK_OK(loom_ckpt_read_range(c, "optim.adamw.m", 0, N, got.m));
  TT_CHECK_OK(loom_ckpt_read_range(c, "tokens", 0, 77, got.tokens));
  TT_CHECK_OK(loom_ckpt_read_range(c, "scalar", 0, 1, &got.scalar));
  TT_CHECK_OK(loom_ckpt_read_range(c, "half", 0, 300, got.half));
  TT_CHECK_OK(loom_ckpt_read_range(c, "bytes", 0, 5, got.bytes));
  TT_CHECK_OK(loom_ckpt_read_range(c, "empty", 0, 0, NULL));
  TT_CHECK(memcmp(got.params, s->params, sizeof got.params) == 0);
  TT_CHECK(memcmp(got.m, s->m, sizeof got.m) == 0);
  TT_CHECK(memcmp(got.tokens, s->tokens, sizeof got.tokens) == 0);
  TT_CHECK(memcmp(&got.scalar, &s->scalar, sizeof got.scalar) == 0);
  TT_CHECK(memcmp(got.half, s->half, sizeof got.half) == 0);
  TT_CHECK(memcmp(got.bytes, s->bytes, sizeof got.bytes) == 0);
}

/* Opens the checkpoint of `step` under root (FULL) and compares it. */
static void check_saved(const char *root, int64_t step, const state *s) {
  char dir[512];
  loom_ckpt *c = NULL;
  TT_CHECK_OK(loom_ckpt_dir_name(root, step, dir, sizeof dir));
  TT_CHECK_OK(loom_ckpt_open(&c, dir, NULL));
  if (!c)
    return;
  TT_CHECK_EQ(loom_ckpt_get_meta(c)->step, step);
  check_state(c, s);
  loom_ckpt_close(c);
}

/* ------------------------------------------------------------------ tests */

TT_TEST(test_round_trip) {
  char root[128];
  new_root(root, sizeof root);
  static state s;
  make_state(&s, 1);
  /* Small blocks, so buffers span several. */
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.block_bytes = 256;
  loom_ckpt_writer *w = NULL;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 500, &o));
  loom_ckpt_meta m = make_meta(500, views_a, 3);
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N, s.params));
  TT_CHECK_OK(loom_ckpt_writer_add(w, "optim.adamw.m", LOOM_F32, N, 0, N, s.m));
  TT_CHECK_OK(loom_ckpt_writer_add(w, "half", LOOM_BF16, 300, 0, 300, s.half));
  TT_CHECK_OK(loom_ckpt_writer_set_meta(w, &m));
  TT_CHECK(strstr(loom_ckpt_writer_path(w), "/step_00000500") != NULL);
  TT_CHECK_OK(loom_ckpt_writer_write(w));
  TT_CHECK_OK(loom_ckpt_writer_commit(w));
  loom_ckpt_writer_free(w);

  int64_t latest = -1;
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 500);
  char dir[512];
  TT_CHECK_OK(loom_ckpt_dir_name(root, 500, dir, sizeof dir));
  loom_ckpt *c = NULL;
  TT_REQUIRE_OK(loom_ckpt_open(&c, dir, NULL));
  const loom_ckpt_meta *g = loom_ckpt_get_meta(c);
  TT_CHECK_EQ(g->step, 500);
  TT_CHECK_EQ(g->world_size, 1);
  TT_CHECK_STR(g->strategy, "ddp");
  TT_CHECK_STR(g->optimizer, "adamw");
  TT_CHECK_STR(g->schedule, "cosine");
  TT_CHECK(g->config_hash == 0xfedcba9876543210ULL);
  TT_CHECK(g->layout_hash == loom_ckpt_layout_hash(views_a, 3));
  TT_CHECK(g->layout_hash != loom_ckpt_layout_hash(views_b, 2));
  TT_CHECK_EQ(g->optimizer_step, 500);
  TT_CHECK(memcmp(&g->lr, &m.lr, sizeof m.lr) == 0);
  TT_CHECK(g->loss_scale == 65536.0);
  TT_CHECK_EQ(g->data.epoch, 2);
  TT_CHECK_EQ(g->data.batch, 37);
  TT_CHECK_EQ(g->data.sample, 37 * 128);
  TT_REQUIRE(g->n_rngs == 2);
  TT_CHECK_STR(g->rngs[0].name, "dropout");
  TT_CHECK(g->rngs[0].state.seed == 0xffffffffffffffffULL &&
           g->rngs[0].state.stream == 3 &&
           g->rngs[0].state.counter == 123456789012345ULL);
  TT_CHECK(memcmp(&g->rngs[1].state, &rngs[1].state, sizeof(loom_rng)) == 0);
  TT_REQUIRE(g->n_views == 3);
  for (int i = 0; i < 3; i++) {
    TT_CHECK_STR(g->views[i].name, views_a[i].name);
    TT_CHECK_EQ(g->views[i].offset, views_a[i].offset);
    TT_CHECK_EQ(g->views[i].numel, views_a[i].numel);
    TT_CHECK_EQ(g->views[i].ndim, views_a[i].ndim);
    TT_CHECK(memcmp(g->views[i].shape, views_a[i].shape,
                    sizeof views_a[i].shape) == 0);
    TT_CHECK_EQ(g->views[i].decay, views_a[i].decay);
  }
  TT_CHECK_STR(g->extra_json, "{\"note\":\"hi\",\"list\":[1,2.5,null]}");
  /* Buffers: names, dtypes, sizes, blocks of at most 256 bytes. */
  TT_CHECK_EQ(loom_ckpt_buffer_count(c), 3);
  loom_ckpt_buffer_info bi;
  TT_CHECK_OK(loom_ckpt_buffer_find(c, "half", &bi));
  TT_CHECK_EQ(bi.dtype, LOOM_BF16);
  TT_CHECK_EQ(bi.count, 300);
  TT_CHECK_EQ(bi.n_blocks, 3); /* 128 + 128 + 44 elements */
  TT_CHECK_OK(loom_ckpt_buffer_get(c, 0, &bi));
  TT_CHECK_STR(bi.name, "params");
  TT_CHECK_EQ(bi.n_blocks, 16);
  TT_CHECK_EQ(loom_ckpt_buffer_find(c, "grads", &bi), LOOM_ERR_MISMATCH);
  TT_CHECK_EQ(loom_ckpt_buffer_get(c, 3, &bi), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_file_count(c), 1);
  loom_ckpt_file_info fi;
  TT_CHECK_OK(loom_ckpt_file_get(c, 0, &fi));
  TT_CHECK_STR(fi.name, "shard_00000.bin");
  TT_CHECK_EQ(fi.n_blocks, 16 + 16 + 3);
  TT_CHECK_OK(loom_ckpt_verify(c));
  TT_CHECK_HAS(loom_ckpt_manifest_text(c), "\"manifest_crc32c\"");
  /* Whole and partial reads, bitwise. */
  static float got[N];
  TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, N, got));
  TT_CHECK(memcmp(got, s.params, sizeof got) == 0);
  loom_rng r = loom_rng_init(5, 0);
  for (int t = 0; t < 200; t++) {
    int64_t a = (int64_t)loom_rng_below(&r, N + 1);
    int64_t b = a + (int64_t)loom_rng_below(&r, (uint64_t)(N - a + 1));
    memset(got, 0, sizeof got);
    TT_CHECK_OK(loom_ckpt_read_range(c, "optim.adamw.m", a, b, got));
    TT_CHECK(memcmp(got, s.m + a, (size_t)(b - a) * sizeof(float)) == 0);
  }
  TT_CHECK_EQ(loom_ckpt_read_range(c, "params", 10, N + 1, got),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_read_range(c, "params", 10, 5, got),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_read_range(c, "nope", 0, 1, got), LOOM_ERR_MISMATCH);
  loom_ckpt_close(c);

  /* The one-call save of every dtype; the list of steps. */
  TT_CHECK_OK(save_state(root, 7, &s, views_a, 3, 0));
  check_saved(root, 7, &s);
  int64_t *steps = NULL;
  int n = 0;
  TT_CHECK_OK(loom_ckpt_list(root, &steps, &n));
  TT_CHECK(n == 2 && steps && steps[0] == 7 && steps[1] == 500);
  loom_free(steps);
  TT_CHECK(!dir_has_tmp(root));
}

/* Writes the checkpoint of `step` as 3 ranks would, one writer per rank:
 * params split [0,334) [334,700) [700,1003); m split [] [0,500) [500,1003);
 * "count" written by rank 0 alone. */
static loom_status save_3_ranks(const char *root, int64_t step,
                                const state *s) {
  const int64_t pb[4] = {0, 334, 700, N}, mb[4] = {0, 0, 500, N};
  loom_ckpt_writer *w[3] = {NULL, NULL, NULL};
  loom_status st = LOOM_OK;
  for (int r = 0; r < 3 && st == LOOM_OK; r++) {
    loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
    o.rank = r;
    o.world = 3;
    o.block_bytes = 64 + 16 * r; /* blocks of 16, 20 and 24 floats */
    st = loom_ckpt_writer_new(&w[r], root, step, &o);
    if (st == LOOM_OK)
      st = loom_ckpt_writer_add(w[r], "params", LOOM_F32, N, pb[r], pb[r + 1],
                                s->params + pb[r]);
    if (st == LOOM_OK)
      st = loom_ckpt_writer_add(w[r], "m", LOOM_F32, N, mb[r], mb[r + 1],
                                s->m + mb[r]);
    if (st == LOOM_OK && r == 0)
      st = loom_ckpt_writer_add(w[r], "count", LOOM_F64, 1, 0, 1, &s->scalar);
  }
  loom_ckpt_meta m = make_meta(step, views_a, 3);
  if (st == LOOM_OK)
    st = loom_ckpt_writer_set_meta(w[0], &m);
  /* Ranks write in any order; rank 0 commits after all succeeded. */
  for (int r = 2; r >= 0 && st == LOOM_OK; r--)
    st = loom_ckpt_writer_write(w[r]);
  if (st == LOOM_OK)
    st = loom_ckpt_writer_commit(w[0]);
  else if (w[0])
    loom_ckpt_writer_abort(w[0]);
  for (int r = 0; r < 3; r++)
    loom_ckpt_writer_free(w[r]);
  return st;
}

TT_TEST(test_reshard) {
  char root[128];
  new_root(root, sizeof root);
  static state s;
  make_state(&s, 2);
  TT_REQUIRE_OK(save_3_ranks(root, 30, &s));
  loom_ckpt *c = NULL;
  char dir[512];
  TT_CHECK_OK(loom_ckpt_dir_name(root, 30, dir, sizeof dir));
  TT_REQUIRE_OK(loom_ckpt_open(&c, dir, NULL));
  TT_CHECK_EQ(loom_ckpt_get_meta(c)->world_size, 3);
  TT_CHECK_EQ(loom_ckpt_file_count(c), 3);
  loom_ckpt_buffer_info bi;
  TT_CHECK_OK(loom_ckpt_buffer_find(c, "m", &bi));
  TT_CHECK_EQ(bi.n_shards, 2);
  TT_CHECK_OK(loom_ckpt_buffer_find(c, "params", &bi));
  TT_CHECK_EQ(bi.n_shards, 3);
  static float got[N];
  /* As 1 rank: everything. */
  TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, N, got));
  TT_CHECK(memcmp(got, s.params, sizeof got) == 0);
  TT_CHECK_OK(loom_ckpt_read_range(c, "m", 0, N, got));
  TT_CHECK(memcmp(got, s.m, sizeof got) == 0);
  double d = 0;
  TT_CHECK_OK(loom_ckpt_read_range(c, "count", 0, 1, &d));
  TT_CHECK(memcmp(&d, &s.scalar, sizeof d) == 0);
  /* As 2 ranks (ZeRO-style halves), each across shard boundaries. */
  const int64_t half[3] = {0, 502, N};
  for (int r = 0; r < 2; r++) {
    memset(got, 0, sizeof got);
    TT_CHECK_OK(loom_ckpt_read_range(c, "params", half[r], half[r + 1], got));
    TT_CHECK(memcmp(got, s.params + half[r],
                    (size_t)(half[r + 1] - half[r]) * sizeof(float)) == 0);
    TT_CHECK_OK(loom_ckpt_read_range(c, "m", half[r], half[r + 1], got));
    TT_CHECK(memcmp(got, s.m + half[r],
                    (size_t)(half[r + 1] - half[r]) * sizeof(float)) == 0);
  }
  /* As 4 and 5 ranks, and random ranges. */
  for (int world = 4; world <= 5; world++)
    for (int r = 0; r < world; r++) {
      int64_t a = N * r / world, b = N * (r + 1) / world;
      TT_CHECK_OK(loom_ckpt_read_range(c, "params", a, b, got));
      TT_CHECK(memcmp(got, s.params + a, (size_t)(b - a) * sizeof(float)) == 0);
    }
  loom_rng rr = loom_rng_init(11, 0);
  for (int t = 0; t < 300; t++) {
    int64_t a = (int64_t)loom_rng_below(&rr, N + 1);
    int64_t b = a + (int64_t)loom_rng_below(&rr, (uint64_t)(N - a + 1));
    TT_CHECK_OK(loom_ckpt_read_range(c, "m", a, b, got));
    TT_CHECK(memcmp(got, s.m + a, (size_t)(b - a) * sizeof(float)) == 0);
  }
  loom_ckpt_close(c);
  TT_CHECK(!dir_has_tmp(root));
}

/* Ranks whose ranges do not tile a buffer: commit refuses, abort cleans. */
static void bad_tiling(const int64_t *bounds, loom_dtype dt1, const char *msg) {
  char root[128];
  new_root(root, sizeof root);
  static float data[N];
  loom_ckpt_writer *w[2] = {NULL, NULL};
  for (int r = 0; r < 2; r++) {
    loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
    o.rank = r;
    o.world = 2;
    TT_REQUIRE_OK(loom_ckpt_writer_new(&w[r], root, 4, &o));
    TT_CHECK_OK(loom_ckpt_writer_add(w[r], "params", r ? dt1 : LOOM_F32, N,
                                     bounds[2 * r], bounds[2 * r + 1],
                                     data + bounds[2 * r]));
    TT_CHECK_OK(loom_ckpt_writer_write(w[r]));
  }
  TT_CHECK_EQ(loom_ckpt_writer_commit(w[0]), LOOM_ERR_MISMATCH);
  TT_CHECK_HAS(loom_last_error(), msg);
  loom_ckpt_writer_abort(w[0]);
  TT_CHECK_HAS(loom_last_error(), msg); /* cleaning up keeps the message */
  TT_CHECK(!dir_has_tmp(root));
  TT_CHECK(!exists(loom_ckpt_writer_path(w[0])));
  loom_ckpt_writer_free(w[0]);
  loom_ckpt_writer_free(w[1]);
}

/* Ranks as threads, writing at the same time into a directory none has
 * created yet; then rank 0 commits. */
typedef struct rank_job {
  const char *root;
  int rank, world;
  const float *data;
  loom_status st;
} rank_job;

static void *rank_main(void *arg) {
  rank_job *j = arg;
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.rank = j->rank;
  o.world = j->world;
  o.block_bytes = 128;
  loom_ckpt_writer *w = NULL;
  int64_t a = (int64_t)N * j->rank / j->world;
  int64_t b = (int64_t)N * (j->rank + 1) / j->world;
  j->st = loom_ckpt_writer_new(&w, j->root, 9, &o);
  if (j->st == LOOM_OK)
    j->st = loom_ckpt_writer_add(w, "params", LOOM_F32, N, a, b, j->data + a);
  if (j->st == LOOM_OK)
    j->st = loom_ckpt_writer_write(w);
  loom_ckpt_writer_free(w);
  return NULL;
}

TT_TEST(test_concurrent_ranks) {
  char root[128], sub[160];
  new_root(root, sizeof root);
  snprintf(sub, sizeof sub, "%s/a/b/ckpt", root); /* several levels to make */
  static float data[N];
  fill_bits(data, sizeof data, 77);
  enum { W = 4 };
  rank_job jobs[W];
  pthread_t th[W];
  for (int r = 0; r < W; r++) {
    jobs[r] = (rank_job){sub, r, W, data, LOOM_OK};
    TT_REQUIRE(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0);
  }
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    TT_CHECK_OK(jobs[r].st);
  }
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.world = W;
  loom_ckpt_writer *w = NULL;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, sub, 9, &o));
  /* Rank 0 again, as the committer: its shard is rewritten the same. */
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N / W, data));
  TT_CHECK_OK(loom_ckpt_writer_write(w));
  TT_CHECK_OK(loom_ckpt_writer_commit(w));
  loom_ckpt_writer_free(w);
  loom_ckpt *c = NULL;
  TT_REQUIRE_OK(loom_ckpt_open_latest_valid(&c, sub, NULL));
  static float got[N];
  TT_CHECK_EQ(loom_ckpt_get_meta(c)->world_size, W);
  TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, N, got));
  TT_CHECK(memcmp(got, data, sizeof got) == 0);
  loom_ckpt_close(c);
}

TT_TEST(test_commit_checks) {
  const int64_t gap[4] = {0, 300, 400, N}, overlap[4] = {0, 500, 400, N},
                good[4] = {0, 500, 500, N}, short_[4] = {0, 500, 500, 1000};
  bad_tiling(gap, LOOM_F32,
             "buffer 'params': elements [300, 400) are in no "
             "shard");
  bad_tiling(overlap, LOOM_F32,
             "buffer 'params': elements [400, 500) are in "
             "two shards");
  bad_tiling(short_, LOOM_F32, "elements [1000, 1003) are in no shard");
  bad_tiling(good, LOOM_BF16,
             "buffer 'params' is f32 x 1003 on rank 0 but "
             "bf16 x 1003 on rank 1");
  /* A rank that never wrote its shard. */
  char root[128];
  new_root(root, sizeof root);
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.world = 2;
  loom_ckpt_writer *w = NULL;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 4, &o));
  TT_CHECK_OK(loom_ckpt_writer_write(w));
  TT_CHECK_EQ(loom_ckpt_writer_commit(w), LOOM_ERR_IO);
  TT_CHECK_HAS(loom_last_error(), "shard_00001.bin: No such file or directory "
                                  "(did rank 1 write its shard?)");
  loom_ckpt_writer_abort(w);
  loom_ckpt_writer_free(w);
  TT_CHECK(!dir_has_tmp(root));
  /* A stale shard of another attempt (other world size) is refused. */
  static float data[N];
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 4, &o));
  loom_ckpt_writer_opts o3 = o;
  o3.world = 3;
  o3.rank = 1;
  loom_ckpt_writer *w3 = NULL;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w3, root, 4, &o3));
  TT_CHECK_OK(loom_ckpt_writer_add(w3, "params", LOOM_F32, N, 0, N, data));
  TT_CHECK_OK(loom_ckpt_writer_write(w3));
  TT_CHECK_OK(loom_ckpt_writer_write(w));
  TT_CHECK_EQ(loom_ckpt_writer_commit(w), LOOM_ERR_MISMATCH);
  TT_CHECK_HAS(loom_last_error(), "written by rank 1 of 3 for step 4, expected "
                                  "rank 1 of 2 for step 4 (a stale file?)");
  loom_ckpt_writer_abort(w);
  loom_ckpt_writer_free(w);
  loom_ckpt_writer_free(w3);
}

/* Three checkpoints (steps 1, 2, 3) of the small model. */
static void three(const char *root, state *s) {
  for (int i = 0; i < 3; i++) {
    make_state(&s[i], 100 + (uint64_t)i);
    TT_CHECK_OK(save_state(root, i + 1, &s[i], views_a, 3, 0));
  }
}

/* Expects open_latest_valid to choose `want` and to warn with `warn`. */
static void expect_fallback(const char *root, int64_t want, const char *warn,
                            const state *s) {
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.layout_hash = loom_ckpt_layout_hash(views_a, 3);
  loom_ckpt *c = NULL;
  tt_capture_begin();
  loom_status st = loom_ckpt_open_latest_valid(&c, root, &oo);
  const char *out = tt_capture_end();
  TT_CHECK_OK(st);
  TT_REQUIRE(c != NULL);
  TT_CHECK_EQ(loom_ckpt_get_meta(c)->step, want);
  check_state(c, s);
  loom_ckpt_close(c);
  if (warn)
    TT_CHECK_HAS(out, warn);
  else
    TT_CHECK_STR(out, "");
  char dir[512];
  int64_t step = 0;
  tt_capture_begin();
  st = loom_ckpt_find_latest_valid(root, &oo, dir, sizeof dir, &step);
  tt_capture_end();
  TT_CHECK_OK(st);
  TT_CHECK_EQ(step, want);
  TT_CHECK(strstr(dir, "/step_000000") != NULL);
}

static loom_status open_dir(const char *root, int64_t step,
                            loom_ckpt_verify_level v) {
  char dir[512];
  loom_ckpt_dir_name(root, step, dir, sizeof dir);
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.verify = v;
  oo.layout_hash = loom_ckpt_layout_hash(views_a, 3);
  loom_ckpt *c = NULL;
  loom_status st = loom_ckpt_open(&c, dir, &oo);
  loom_ckpt_close(c);
  return st;
}

static void set_bytes(const char *path, long off, const char *bytes, size_t n) {
  int fd = open(path, O_WRONLY);
  TT_REQUIRE(fd >= 0);
  TT_CHECK(pwrite(fd, bytes, n, off) == (ssize_t)n);
  close(fd);
}

TT_TEST(test_damage) {
  static state s[3];
  char root[128], p[2048], d3[512];
  loom_ckpt_damage_kind k;
  TT_CHECK_OK(loom_ckpt_damage_parse("truncate", &k));
  TT_CHECK_EQ(k, LOOM_CKPT_DAMAGE_TRUNCATE);
  TT_CHECK_EQ(loom_ckpt_damage_parse("burn", &k), LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_ckpt_damage_name(LOOM_CKPT_DAMAGE_LATEST), "latest");

  /* No checkpoints at all: nothing, quietly. */
  new_root(root, sizeof root);
  loom_ckpt *c = (loom_ckpt *)1;
  TT_CHECK_OK(loom_ckpt_open_latest_valid(&c, root, NULL));
  TT_CHECK(c == NULL);
  int64_t step = 0;
  TT_CHECK_OK(loom_ckpt_find_latest_valid(root, NULL, p, sizeof p, &step));
  TT_CHECK_EQ(step, -1);
  TT_CHECK_EQ(loom_ckpt_open(&c, root, NULL), LOOM_ERR_IO);
  TT_CHECK_HAS(loom_last_error(), "no such checkpoint directory");

  /* Healthy: latest, no warning. */
  three(root, s);
  expect_fallback(root, 3, NULL, &s[2]);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);

  /* A flipped byte: found by FULL verification and by any read of that
   * block, but not by META (sizes and headers are intact). */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  TT_CHECK_OK(loom_ckpt_damage(d3, LOOM_CKPT_DAMAGE_FLIP, 0));
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_FULL), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p,
           "%s/shard_00000.bin: block of 'params' [0, 1003) at "
           "byte 64: checksum mismatch",
           d3);
  TT_CHECK_HAS(loom_last_error(), p);
  TT_CHECK_OK(open_dir(root, 3, LOOM_CKPT_VERIFY_META));
  loom_ckpt_open_opts meta = loom_ckpt_open_opts_default();
  meta.verify = LOOM_CKPT_VERIFY_META;
  TT_REQUIRE_OK(loom_ckpt_open(&c, d3, &meta));
  static float got[N];
  TT_CHECK_EQ(loom_ckpt_read_range(c, "params", 5, 6, got), LOOM_ERR_CORRUPT);
  TT_CHECK_HAS(loom_last_error(), p);
  TT_CHECK_OK(loom_ckpt_read_range(c, "optim.adamw.m", 0, N, got));
  TT_CHECK_EQ(loom_ckpt_verify(c), LOOM_ERR_CORRUPT);
  TT_CHECK_EQ(loom_ckpt_verify_file(c, 0, LOOM_CKPT_VERIFY_FULL),
              LOOM_ERR_CORRUPT);
  TT_CHECK_OK(loom_ckpt_verify_file(c, 0, LOOM_CKPT_VERIFY_META));
  TT_CHECK_EQ(loom_ckpt_verify_file(c, 1, LOOM_CKPT_VERIFY_FULL),
              LOOM_ERR_INVALID_ARG);
  loom_ckpt_close(c);
  snprintf(p, sizeof p,
           "warn: checkpoint %s is not usable, passing over it: "
           "%s/shard_00000.bin: block of 'params'",
           d3, d3);
  expect_fallback(root, 2, p, &s[1]);

  /* A truncated shard. */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  TT_CHECK_OK(loom_ckpt_damage(d3, LOOM_CKPT_DAMAGE_TRUNCATE, 0));
  TT_CHECK_OK(open_dir(root, 3, LOOM_CKPT_VERIFY_NONE)); /* manifest only */
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_META), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p, "%s/shard_00000.bin: truncated: ", d3);
  TT_CHECK_HAS(loom_last_error(), p);
  TT_CHECK_HAS(loom_last_error(), "bytes, the manifest says");
  expect_fallback(root, 2, p, &s[1]);

  /* A missing manifest. */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  TT_CHECK_OK(loom_ckpt_damage(d3, LOOM_CKPT_DAMAGE_MANIFEST, 0));
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_META), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p, "%s/manifest.json: missing", d3);
  TT_CHECK_STR(loom_last_error(), p);
  expect_fallback(root, 2, p, &s[1]);

  /* A missing shard file. */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  snprintf(p, sizeof p, "%s/shard_00000.bin", d3);
  TT_CHECK(unlink(p) == 0);
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_META), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p, "%s/shard_00000.bin: missing", d3);
  TT_CHECK_STR(loom_last_error(), p);
  expect_fallback(root, 2, p, &s[1]);

  /* An altered manifest (one digit of the step): its own checksum. */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  snprintf(p, sizeof p, "%s/manifest.json", d3);
  {
    FILE *f = fopen(p, "rb");
    TT_REQUIRE(f != NULL);
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, "\"step\":\t3");
    TT_REQUIRE(at != NULL);
    set_bytes(p, (long)(at - text) + 8, "4", 1);
  }
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_META), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p, "%s/manifest.json: checksum mismatch", d3);
  TT_CHECK_HAS(loom_last_error(), p);
  expect_fallback(root, 2, p, &s[1]);

  /* A manifest cut short. */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  snprintf(p, sizeof p, "%s/manifest.json", d3);
  TT_CHECK(truncate(p, 300) == 0);
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_META), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p, "%s/manifest.json: no manifest_crc32c at its end", d3);
  TT_CHECK_HAS(loom_last_error(), p);
  expect_fallback(root, 2, p, &s[1]);

  /* A manifest from another model (another layout) in step 3. */
  new_root(root, sizeof root);
  three(root, s);
  TT_CHECK_OK(save_state(root, 3, &s[2], views_b, 2, 0));
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  TT_CHECK_EQ(open_dir(root, 3, LOOM_CKPT_VERIFY_META), LOOM_ERR_MISMATCH);
  snprintf(p, sizeof p,
           "%s/manifest.json: written for another model (layout "
           "hash 0x",
           d3);
  TT_CHECK_HAS(loom_last_error(), p);
  expect_fallback(root, 2, p, &s[1]);

  /* `latest` missing: the newest valid checkpoint, with a warning. */
  new_root(root, sizeof root);
  three(root, s);
  loom_ckpt_dir_name(root, 3, d3, sizeof d3);
  TT_CHECK_OK(loom_ckpt_damage(d3, LOOM_CKPT_DAMAGE_LATEST, 0));
  TT_CHECK_EQ(loom_ckpt_read_latest(root, &step), LOOM_ERR_IO);
  snprintf(p, sizeof p, "%s/latest: missing", root);
  TT_CHECK_STR(loom_last_error(), p);
  snprintf(p, sizeof p,
           "warn: %s/latest: missing; using the newest valid "
           "checkpoint instead",
           root);
  expect_fallback(root, 3, p, &s[2]);

  /* `latest` holding garbage, then pointing at a step that is gone. */
  snprintf(p, sizeof p, "%s/latest", root);
  FILE *f = fopen(p, "w");
  TT_REQUIRE(f != NULL);
  fputs("../../etc\n", f);
  fclose(f);
  TT_CHECK_EQ(loom_ckpt_read_latest(root, &step), LOOM_ERR_CORRUPT);
  snprintf(p, sizeof p, "%s/latest: does not name a checkpoint", root);
  expect_fallback(root, 3, p, &s[2]);
  snprintf(p, sizeof p, "%s/latest", root);
  f = fopen(p, "w");
  fputs("step_00000009\n", f);
  fclose(f);
  snprintf(p, sizeof p, "%s/step_00000009: no such checkpoint directory", root);
  expect_fallback(root, 3, p, &s[2]);

  /* Everything damaged: an error, not a fresh start. */
  new_root(root, sizeof root);
  three(root, s);
  for (int i = 1; i <= 3; i++) {
    loom_ckpt_dir_name(root, i, d3, sizeof d3);
    TT_CHECK_OK(loom_ckpt_damage(d3, LOOM_CKPT_DAMAGE_TRUNCATE, 0));
  }
  tt_capture_begin();
  loom_status st = loom_ckpt_open_latest_valid(&c, root, NULL);
  const char *out = tt_capture_end();
  TT_CHECK_EQ(st, LOOM_ERR_CORRUPT);
  TT_CHECK(c == NULL);
  snprintf(p, sizeof p, "%s: no valid checkpoint (3 damaged", root);
  TT_CHECK_HAS(loom_last_error(), p);
  TT_CHECK_HAS(out, "step_00000001/shard_00000.bin: truncated");
}

TT_TEST(test_keep_and_history) {
  char root[128], p[2048];
  new_root(root, sizeof root);
  static state s[5];
  for (int i = 0; i < 5; i++)
    make_state(&s[i], 200 + (uint64_t)i);
  /* Stale temporary directories of an earlier crash, and of a later step. */
  TT_CHECK(mkdir(root, 0755) == 0);
  snprintf(p, sizeof p, "%s/.step_00000005.tmp", root);
  TT_CHECK(mkdir(p, 0755) == 0);
  snprintf(p, sizeof p, "%s/.step_00000005.tmp/shard_00000.bin", root);
  FILE *f = fopen(p, "w");
  fputs("junk", f);
  fclose(f);
  snprintf(p, sizeof p, "%s/.step_00000099.tmp", root);
  TT_CHECK(mkdir(p, 0755) == 0);
  for (int i = 0; i < 4; i++)
    TT_CHECK_OK(save_state(root, 10 * (i + 1), &s[i], views_a, 3, 2));
  int64_t *steps = NULL;
  int n = 0;
  TT_CHECK_OK(loom_ckpt_list(root, &steps, &n));
  TT_CHECK(n == 2 && steps[0] == 30 && steps[1] == 40);
  loom_free(steps);
  snprintf(p, sizeof p, "%s/.step_00000005.tmp", root);
  TT_CHECK(!exists(p));
  snprintf(p, sizeof p, "%s/.step_00000099.tmp", root);
  TT_CHECK(exists(p)); /* not ours to judge */
  rmdir(p);
  check_saved(root, 30, &s[2]);
  check_saved(root, 40, &s[3]);
  /* The same step again (a run resumed from 30 that reaches 40): replaced
   * atomically, still one step_40, with the new content. */
  TT_CHECK_OK(save_state(root, 40, &s[4], views_a, 3, 2));
  check_saved(root, 40, &s[4]);
  check_saved(root, 30, &s[2]);
  TT_CHECK(!dir_has_tmp(root));
  /* A newer directory that `latest` does not name (an abandoned run) is
   * ignored, and never taken as a fallback. */
  char d40[512], d50[512];
  loom_ckpt_dir_name(root, 40, d40, sizeof d40);
  loom_ckpt_dir_name(root, 50, d50, sizeof d50);
  char other[128];
  new_root(other, sizeof other);
  TT_CHECK_OK(save_state(other, 50, &s[0], views_a, 3, 0));
  char o50[512];
  loom_ckpt_dir_name(other, 50, o50, sizeof o50);
  TT_CHECK(rename(o50, d50) == 0);
  expect_fallback(root, 40, NULL, &s[4]);
  TT_CHECK_OK(loom_ckpt_damage(d40, LOOM_CKPT_DAMAGE_FLIP, 0));
  expect_fallback(root, 30, "step_00000040 is not usable", &s[2]);
  /* before_step: only older ones (a multi-rank load that failed). */
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.before_step = 40;
  int64_t step;
  TT_CHECK_OK(loom_ckpt_find_latest_valid(root, &oo, p, sizeof p, &step));
  TT_CHECK_EQ(step, 30);
  /* keep 0 keeps all. */
  new_root(root, sizeof root);
  for (int i = 0; i < 4; i++)
    TT_CHECK_OK(save_state(root, i, &s[i], views_a, 3, 0));
  TT_CHECK_OK(loom_ckpt_list(root, &steps, &n));
  TT_CHECK_EQ(n, 4);
  loom_free(steps);
}

/* After a failed save of step 2: step 1 intact, no temporary left, and
 * whatever `latest` says is valid. */
static void check_after_failure(const char *root, const state *s1) {
  check_saved(root, 1, s1);
  TT_CHECK(!dir_has_tmp(root));
  loom_ckpt *c = NULL;
  tt_capture_begin();
  loom_status st = loom_ckpt_open_latest_valid(&c, root, NULL);
  const char *out = tt_capture_end();
  TT_CHECK_OK(st);
  TT_CHECK(c != NULL);
  TT_CHECK_STR(out, "");
  loom_ckpt_close(c);
}

TT_TEST(test_failed_save) {
  char root[128];
  new_root(root, sizeof root);
  static state s1, s2;
  make_state(&s1, 301);
  make_state(&s2, 302);
  TT_REQUIRE_OK(save_state(root, 1, &s1, views_a, 3, 1));
  /* Fail each file-system call of a save in turn. */
  int failures = 0;
  for (long n = 1; n < 200; n++) {
    loom_ckpt_fail_io_after(n, ENOSPC);
    loom_status st = save_state(root, 2, &s2, views_a, 3, 1);
    loom_ckpt_fail_io_after(0, 0);
    if (st == LOOM_OK)
      break;
    failures++;
    TT_CHECK_EQ(st, LOOM_ERR_IO);
    TT_CHECK_HAS(loom_last_error(), "No space left on device");
    TT_CHECK_HAS(loom_last_error(), root);
    check_after_failure(root, &s1);
  }
  TT_CHECK(failures >= 10);
  printf("save: %d file-system failures\n", failures);
  int64_t latest;
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 2);
  check_saved(root, 2, &s2);
  /* keep 1: step 1 went only once step 2 was complete. */
  TT_CHECK_EQ(open_dir(root, 1, LOOM_CKPT_VERIFY_META), LOOM_ERR_IO);

  /* Multi-rank: rank 1's write fails; rank 0 aborts; nothing changes. */
  new_root(root, sizeof root);
  TT_REQUIRE_OK(save_state(root, 1, &s1, views_a, 3, 0));
  loom_ckpt_writer *w[2];
  for (int r = 0; r < 2; r++) {
    loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
    o.rank = r;
    o.world = 2;
    TT_REQUIRE_OK(loom_ckpt_writer_new(&w[r], root, 2, &o));
    TT_CHECK_OK(loom_ckpt_writer_add(w[r], "params", LOOM_F32, N, r ? 500 : 0,
                                     r ? N : 500, s2.params + (r ? 500 : 0)));
  }
  TT_CHECK_OK(loom_ckpt_writer_write(w[0]));
  loom_ckpt_fail_io_after(3, EIO); /* open, header, then the payload */
  TT_CHECK_EQ(loom_ckpt_writer_write(w[1]), LOOM_ERR_IO);
  loom_ckpt_fail_io_after(0, 0);
  TT_CHECK_HAS(loom_last_error(), "shard_00001.bin: write failed: Input/output "
                                  "error");
  char p[2048];
  snprintf(p, sizeof p, "%s/.step_00000002.tmp/shard_00001.bin", root);
  TT_CHECK(!exists(p)); /* the failed rank removed its file */
  TT_CHECK_EQ(loom_ckpt_writer_commit(w[1]), LOOM_ERR_INVALID_ARG);
  loom_ckpt_writer_abort(w[0]);
  loom_ckpt_writer_free(w[0]);
  loom_ckpt_writer_free(w[1]);
  check_after_failure(root, &s1);
  int64_t *steps;
  int ns;
  TT_CHECK_OK(loom_ckpt_list(root, &steps, &ns));
  TT_CHECK(ns == 1 && steps[0] == 1);
  loom_free(steps);
}

/* A real full disk: a 256 KiB tmpfs, when this process may mount one. */
TT_TEST(test_enospc_tmpfs) {
  char mnt[300];
  snprintf(mnt, sizeof mnt, "%s/tmpfs", base_dir);
  TT_REQUIRE(mkdir(mnt, 0755) == 0);
  if (mount("loom-test", mnt, "tmpfs", 0, "size=256k") != 0) {
    printf("test_enospc_tmpfs: skipped (cannot mount a tmpfs: %s)\n",
           strerror(errno));
    rmdir(mnt);
    return;
  }
  char root[400];
  snprintf(root, sizeof root, "%s/ckpt", mnt);
  static float small[8000], big[60000];
  fill_bits(small, sizeof small, 1);
  fill_bits(big, sizeof big, 2);
  loom_ckpt_buffer b1 = {"params", LOOM_F32, 8000, small};
  loom_ckpt_buffer b2 = {"params", LOOM_F32, 60000, big};
  loom_ckpt_meta m = make_meta(1, NULL, 0);
  TT_CHECK_OK(loom_ckpt_save(root, 1, &m, &b1, 1, 0));
  loom_status st = loom_ckpt_save(root, 2, &m, &b2, 1, 0);
  TT_CHECK_EQ(st, LOOM_ERR_IO);
  TT_CHECK_HAS(loom_last_error(), "No space left on device");
  TT_CHECK_HAS(loom_last_error(), "/.step_00000002.tmp/shard_00000.bin");
  TT_CHECK(!dir_has_tmp(root));
  int64_t latest = -1;
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 1);
  loom_ckpt *c = NULL;
  TT_CHECK_OK(loom_ckpt_open_latest_valid(&c, root, NULL));
  if (c) {
    static float got[8000];
    TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, 8000, got));
    TT_CHECK(memcmp(got, small, sizeof got) == 0);
    loom_ckpt_close(c);
  }
  /* Room again: the next save works. */
  TT_CHECK_OK(loom_ckpt_save(root, 3, &m, &b1, 1, 1));
  TT_CHECK(umount2(mnt, MNT_DETACH) == 0);
  rmdir(mnt);
}

TT_TEST(test_async) {
  char root[128];
  new_root(root, sizeof root);
  static float data[N], orig[N];
  fill_bits(data, sizeof data, 9);
  memcpy(orig, data, sizeof data);
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.copy = true;
  loom_ckpt_writer *w = NULL;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 100, &o));
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N, data));
  loom_ckpt_meta m = make_meta(100, views_a, 3);
  TT_CHECK_OK(loom_ckpt_writer_set_meta(w, &m));
  TT_CHECK_OK(loom_ckpt_writer_start(w, false));
  /* Training goes on and changes the parameters at once. */
  for (int i = 0; i < N; i++)
    data[i] = (float)i;
  TT_CHECK_EQ(loom_ckpt_writer_start(w, false), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_commit(w), LOOM_ERR_INVALID_ARG); /* running */
  TT_CHECK_OK(loom_ckpt_writer_wait(w));
  bool done = false;
  TT_CHECK_OK(loom_ckpt_writer_test(w, &done));
  TT_CHECK(done);
  TT_CHECK_OK(loom_ckpt_writer_commit(w));
  loom_ckpt_writer_free(w);
  loom_ckpt *c = NULL;
  TT_REQUIRE_OK(loom_ckpt_open_latest_valid(&c, root, NULL));
  static float got[N];
  TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, N, got));
  TT_CHECK(memcmp(got, orig, sizeof got) == 0);
  loom_ckpt_close(c);

  /* Single rank: the thread commits too; poll until done. */
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 200, &o));
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N, data));
  TT_CHECK_OK(loom_ckpt_writer_start(w, true));
  for (int i = 0; i < 100000 && !done; i++) {
    done = false;
    TT_CHECK_OK(loom_ckpt_writer_test(w, &done));
    if (!done)
      usleep(100);
  }
  TT_CHECK_OK(loom_ckpt_writer_wait(w));
  loom_ckpt_writer_free(w);
  int64_t latest;
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 200);

  /* A failure on the thread comes back from wait, message and all. */
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 300, &o));
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N, data));
  loom_ckpt_fail_io_after(2, ENOSPC);
  TT_CHECK_OK(loom_ckpt_writer_start(w, true));
  loom_clear_error();
  TT_CHECK_EQ(loom_ckpt_writer_wait(w), LOOM_ERR_IO);
  loom_ckpt_fail_io_after(0, 0);
  TT_CHECK_HAS(loom_last_error(),
               "shard_00000.bin: write failed: No space left "
               "on device");
  loom_ckpt_writer_abort(w);
  loom_ckpt_writer_free(w);
  TT_CHECK(!dir_has_tmp(root));
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 200);

  /* Committing from the thread needs world 1. */
  o.world = 2;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 400, &o));
  TT_CHECK_EQ(loom_ckpt_writer_start(w, true), LOOM_ERR_INVALID_ARG);
  loom_ckpt_writer_abort(w);
  loom_ckpt_writer_free(w); /* never started: free is quick */
}

TT_TEST(test_alloc_failures) {
  char root[128];
  new_root(root, sizeof root);
  static state s1, s2;
  make_state(&s1, 401);
  make_state(&s2, 402);
  TT_REQUIRE_OK(save_state(root, 1, &s1, views_a, 3, 2));
  int failures = 0;
  /* Every allocation up to 80, then every 5th: the manifest's hundreds of
   * small JSON nodes all fail the same way, and each try costs an fsync. */
  for (long n = 1; n < 2000; n += n < 80 ? 1 : 5) {
    loom_alloc_fail_after(n);
    loom_status st = save_state(root, 2, &s2, views_a, 3, 2);
    loom_alloc_fail_after(0);
    if (st == LOOM_OK)
      break;
    failures++;
    TT_CHECK_EQ(st, LOOM_ERR_NOMEM);
    if (st != LOOM_ERR_NOMEM)
      fprintf(stderr, "n=%ld: %s\n", n, loom_last_error());
    check_saved(root, 1, &s1);
    TT_CHECK(!dir_has_tmp(root));
  }
  TT_CHECK(failures >= 10);
  printf("save: %d allocation failures\n", failures);
  check_saved(root, 2, &s2);
  /* Opening and reading. */
  failures = 0;
  for (long n = 1; n < 2000; n++) {
    loom_ckpt *c = NULL;
    float got[40];
    loom_alloc_fail_after(n);
    tt_capture_begin();
    loom_status st = loom_ckpt_open_latest_valid(&c, root, NULL);
    if (st == LOOM_OK)
      st = loom_ckpt_read_range(c, "params", 3, 43, got);
    tt_capture_end();
    loom_alloc_fail_after(0);
    loom_ckpt_close(c);
    if (st == LOOM_OK) {
      TT_CHECK(memcmp(got, s2.params + 3, sizeof got) == 0);
      break;
    }
    failures++;
    TT_CHECK_EQ(st, LOOM_ERR_NOMEM);
  }
  TT_CHECK(failures >= 10);
}

TT_TEST(test_misuse) {
  char root[128];
  new_root(root, sizeof root);
  loom_ckpt_writer *w = NULL;
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  TT_CHECK_EQ(loom_ckpt_writer_new(&w, "", 1, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_new(&w, root, -1, &o), LOOM_ERR_INVALID_ARG);
  o.rank = 2;
  TT_CHECK_EQ(loom_ckpt_writer_new(&w, root, 1, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "rank 2 of world 1");
  o.rank = 0;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 1, &o));
  float x[4] = {0};
  TT_CHECK_EQ(loom_ckpt_writer_add(w, "bad name", LOOM_F32, 4, 0, 4, x),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_add(w, "a_name_that_is_far_too_long_for_it",
                                   LOOM_F32, 4, 0, 4, x),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_add(w, "p", LOOM_F32, 4, 2, 5, x),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_add(w, "p", LOOM_F32, 4, 0, 4, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_ckpt_writer_add(w, "p", LOOM_F32, 4, 0, 4, x));
  TT_CHECK_EQ(loom_ckpt_writer_add(w, "p", LOOM_F32, 4, 0, 4, x),
              LOOM_ERR_INVALID_ARG);
  loom_ckpt_meta m = loom_ckpt_meta_default();
  m.extra_json = "[1, 2]";
  TT_CHECK_EQ(loom_ckpt_writer_set_meta(w, &m), LOOM_ERR_INVALID_ARG);
  m.extra_json = "{bad";
  TT_CHECK_EQ(loom_ckpt_writer_set_meta(w, &m), LOOM_ERR_INVALID_ARG);
  m.extra_json = NULL;
  m.lr = INFINITY;
  TT_CHECK_EQ(loom_ckpt_writer_set_meta(w, &m), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_commit(w), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "commit needs rank 0's shard written first");
  TT_CHECK_OK(loom_ckpt_writer_write(w));
  TT_CHECK_EQ(loom_ckpt_writer_write(w), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_ckpt_writer_add(w, "q", LOOM_F32, 4, 0, 4, x),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_ckpt_writer_commit(w)); /* no meta: the defaults */
  loom_ckpt_writer_free(w);
  loom_ckpt_writer_free(NULL);
  loom_ckpt_close(NULL);
  loom_ckpt_writer_abort(NULL);
  char buf[8];
  TT_CHECK_EQ(loom_ckpt_dir_name(root, 1, buf, sizeof buf),
              LOOM_ERR_INVALID_ARG);
  /* A checkpoint of a later format version is refused by name. */
  char dir[512], p[2048];
  loom_ckpt_dir_name(root, 1, dir, sizeof dir);
  loom_ckpt *c = NULL;
  TT_REQUIRE_OK(loom_ckpt_open(&c, dir, NULL));
  TT_CHECK_STR(loom_ckpt_get_meta(c)->strategy, "");
  TT_CHECK_EQ(loom_ckpt_get_meta(c)->n_views, 0);
  TT_CHECK_STR(loom_ckpt_get_meta(c)->extra_json, "{}");
  loom_ckpt_close(c);
  snprintf(p, sizeof p, "%s/shard_00000.bin", dir);
  set_bytes(p, 8, "\x02", 1); /* header version 2 */
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.verify = LOOM_CKPT_VERIFY_META;
  TT_CHECK_EQ(loom_ckpt_open(&c, dir, &oo), LOOM_ERR_CORRUPT);
  TT_CHECK_HAS(loom_last_error(), "shard_00000.bin: header checksum mismatch");
}

/* A manifest (or any small file) read whole into buf, NUL-terminated;
 * *len 0 when it cannot be read. */
static void read_text(const char *path, char *buf, size_t cap, size_t *len) {
  *len = 0;
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  TT_REQUIRE(f != NULL);
  *len = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[*len] = '\0';
}

/* The file at path replaced by buf[0, len). */
static void write_text(const char *path, const char *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  TT_REQUIRE(f != NULL);
  fwrite(buf, 1, len, f);
  fclose(f);
}

/* Rewrites the manifest's own checksum after an edit, as a careful forger
 * would, so that the field checks behind it are what gets tested. */
static void fix_manifest_crc(char *text, size_t len) {
  char *p = NULL, *q = text;
  while ((q = strstr(q, "\"manifest_crc32c\"")) != NULL)
    p = q++;
  char *d = p ? strstr(p, "\"0x") : NULL;
  if (!d || d + 12 > text + len)
    return;
  memcpy(d + 3, "00000000", 8);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", loom_crc32c(0, text, len));
  memcpy(d + 3, hex, 8);
}

/* Mutated manifests with valid checksums: every outcome is a clean status;
 * no crash, no read outside the files, no leak (under ASan). */
TT_TEST(test_fuzz_manifest) {
  char root[128], dir[512], mpath[600];
  new_root(root, sizeof root);
  static state s;
  make_state(&s, 5);
  TT_REQUIRE_OK(save_3_ranks(root, 1, &s));
  loom_ckpt_dir_name(root, 1, dir, sizeof dir);
  snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
  static char orig[65536], text[65536];
  size_t len;
  read_text(mpath, orig, sizeof orig, &len);
  TT_REQUIRE(len > 0);
  loom_rng r = loom_rng_init(2024, 0);
  int opened = 0, refused = 0;
  static float got[N];
  for (int it = 0; it < 400; it++) {
    memcpy(text, orig, len + 1);
    int edits = 1 + (int)loom_rng_below(&r, 3);
    for (int e = 0; e < edits; e++) {
      size_t at = (size_t)loom_rng_below(&r, len - 40);
      const char *repl = "0123456789-.e\"{}[],:x ";
      text[at] = repl[loom_rng_below(&r, strlen(repl))];
    }
    fix_manifest_crc(text, len);
    write_text(mpath, text, len);
    loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
    oo.verify = LOOM_CKPT_VERIFY_NONE;
    loom_ckpt *c = NULL;
    loom_status st = loom_ckpt_open(&c, dir, &oo);
    if (st != LOOM_OK) {
      TT_CHECK(st == LOOM_ERR_CORRUPT || st == LOOM_ERR_UNSUPPORTED);
      refused++;
      continue;
    }
    opened++;
    for (int b = 0; b < loom_ckpt_buffer_count(c); b++) {
      loom_ckpt_buffer_info bi;
      loom_ckpt_buffer_get(c, b, &bi);
      if (bi.count <= N && loom_dtype_size(bi.dtype) <= 4) {
        st = loom_ckpt_read_range(c, bi.name, 0, bi.count, got);
        TT_CHECK(st == LOOM_OK || st == LOOM_ERR_CORRUPT);
      }
    }
    st = loom_ckpt_verify(c);
    TT_CHECK(st == LOOM_OK || st == LOOM_ERR_CORRUPT);
    loom_ckpt_close(c);
  }
  TT_CHECK(opened > 0 && refused > 0);
  /* The original again: still good. */
  write_text(mpath, orig, len);
  TT_CHECK_OK(open_dir(root, 1, LOOM_CKPT_VERIFY_FULL));
}

/* Views that lie beyond the params buffer, overlap or disagree with their
 * shape: the writer reads its manifest back as the reader will before it
 * commits, so the save fails with the reader's reason and the checkpoint
 * before it stays `latest`, unpruned (keep 1), with nothing left behind
 * (issue 10; before, the save succeeded and keep deleted step 1). */
TT_TEST(test_views_checked) {
  char root[128];
  new_root(root, sizeof root);
  static state s;
  make_state(&s, 11);
  TT_REQUIRE_OK(save_state(root, 1, &s, views_a, 3, 1));
  static const char *const why[] = {
      "offset: [2000, 2002) lies beyond the 'params' buffer (1003 elements)",
      "views[0].numel: not the product of its shape",
      "views[1].offset: overlaps"};
  for (int k = 0; k < 3; k++) {
    loom_param bad[3];
    memcpy(bad, views_a, sizeof bad);
    if (k == 0)
      bad[1].offset = 2000;
    else if (k == 1)
      bad[0].numel = 999;
    else
      bad[1].offset = 999;
    TT_CHECK_EQ(save_state(root, 2 + k, &s, bad, 3, 1), LOOM_ERR_CORRUPT);
    TT_CHECK_HAS(loom_last_error(), "would not be read back; not committed");
    TT_CHECK_HAS(loom_last_error(), why[k]);
  }
  char got[512], path[600];
  int64_t step = -1;
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  TT_CHECK_OK(loom_ckpt_find_latest_valid(root, &oo, got, sizeof got, &step));
  TT_CHECK_EQ(step, 1);
  snprintf(path, sizeof path, "%s/latest", root);
  FILE *f = fopen(path, "r");
  TT_REQUIRE(f != NULL);
  char line[64] = "";
  TT_CHECK(fgets(line, sizeof line, f) != NULL);
  fclose(f);
  TT_CHECK_STR(line, "step_00000001\n");
  int entries = 0;
  DIR *d = opendir(root);
  TT_REQUIRE(d != NULL);
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    entries += e->d_name[0] != '.';
  closedir(d);
  TT_CHECK_EQ(entries, 2); /* step_00000001 and latest */
}

/* Swaps the offsets and checksums of two blocks of rank 2's shard in the
 * manifest (buffer ba's block ka with buffer bb's block kb) and rewrites the
 * manifest's own checksum, as a forger would. */
static void swap_blocks(const char *mpath, int ba, int ka, int bb, int kb) {
  static char text[65536];
  size_t len;
  read_text(mpath, text, sizeof text, &len);
  cJSON *root = cJSON_Parse(text);
  TT_REQUIRE(root != NULL);
  cJSON *bufs = cJSON_GetObjectItemCaseSensitive(root, "buffers");
  cJSON *x[2] = {NULL, NULL};
  const int b[2] = {ba, bb}, k[2] = {ka, kb};
  for (int i = 0; i < 2; i++) {
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(bufs, b[i]),
                                                 "shards");
    cJSON *s = cJSON_GetArrayItem(sh, cJSON_GetArraySize(sh) - 1); /* rank 2 */
    x[i] =
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(s, "blocks"), k[i]);
    TT_REQUIRE(x[i] != NULL);
  }
  const char *keys[2] = {"offset", "crc32c"};
  for (int j = 0; j < 2; j++) {
    cJSON *v0 = cJSON_DetachItemFromObjectCaseSensitive(x[0], keys[j]);
    cJSON *v1 = cJSON_DetachItemFromObjectCaseSensitive(x[1], keys[j]);
    cJSON_AddItemToObject(x[0], keys[j], v1);
    cJSON_AddItemToObject(x[1], keys[j], v0);
  }
  /* The self-checksum last, as the writer puts it. */
  cJSON *crc = cJSON_DetachItemFromObjectCaseSensitive(root, "manifest_crc32c");
  cJSON_AddItemToObject(root, "manifest_crc32c", crc);
  char *out = cJSON_Print(root);
  cJSON_Delete(root);
  TT_REQUIRE(out != NULL);
  size_t n = strlen(out);
  fix_manifest_crc(out, n);
  write_text(mpath, out, n);
  cJSON_free(out);
}

/* A manifest whose "strategy" holds a name loom does not know, its own
 * checksum recomputed: refused, naming the field and the value (it was
 * taken, and inspect and verify passed it). The writer refuses to write
 * one. */
TT_TEST(test_unknown_strategy) {
  char root[128], dir[512], mpath[600];
  new_root(root, sizeof root);
  static state s;
  make_state(&s, 7);
  TT_REQUIRE_OK(save_state(root, 1, &s, views_a, 3, 1));
  loom_ckpt_dir_name(root, 1, dir, sizeof dir);
  snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
  static char text[65536];
  size_t len;
  read_text(mpath, text, sizeof text, &len);
  cJSON *root_j = cJSON_Parse(text);
  TT_REQUIRE(root_j != NULL);
  TT_REQUIRE(cJSON_ReplaceItemInObjectCaseSensitive(
      root_j, "strategy", cJSON_CreateString("bogus")));
  cJSON *crc =
      cJSON_DetachItemFromObjectCaseSensitive(root_j, "manifest_crc32c");
  cJSON_AddItemToObject(root_j, "manifest_crc32c", crc);
  char *out = cJSON_Print(root_j);
  cJSON_Delete(root_j);
  TT_REQUIRE(out != NULL);
  size_t n = strlen(out);
  fix_manifest_crc(out, n);
  write_text(mpath, out, n);
  cJSON_free(out);
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.verify = LOOM_CKPT_VERIFY_NONE;
  loom_ckpt *c = NULL;
  TT_CHECK_EQ(loom_ckpt_open(&c, dir, &oo), LOOM_ERR_CORRUPT);
  TT_CHECK(c == NULL);
  TT_CHECK_HAS(loom_last_error(), "manifest.json: strategy: unknown strategy "
                                  "'bogus'");
  /* Every known name round-trips; the writer refuses an unknown one. */
  for (int k = 0; k < LOOM_CKPT_STRATEGY_COUNT; k++) {
    loom_ckpt_strategy got = LOOM_CKPT_STRATEGY_COUNT;
    TT_CHECK_OK(loom_ckpt_strategy_parse(
        loom_ckpt_strategy_name((loom_ckpt_strategy)k), &got));
    TT_CHECK_EQ((int)got, k);
  }
  loom_ckpt_meta m = make_meta(2, views_a, 3);
  snprintf(m.strategy, sizeof m.strategy, "bogus");
  loom_ckpt_buffer buf = {"params", LOOM_F32, N, s.params};
  TT_CHECK_EQ(loom_ckpt_save(root, 2, &m, &buf, 1, 1), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "unknown strategy 'bogus'");
}

/* A manifest whose blocks were moved about and whose own checksum was then
 * recomputed: the shard's block index disagrees, and the checkpoint is
 * refused rather than loading one buffer's bytes (or another range) as
 * another's. */
TT_TEST(test_forged_blocks) {
  char root[128], dir[512], mpath[600];
  new_root(root, sizeof root);
  static state s;
  make_state(&s, 6);
  TT_REQUIRE_OK(save_3_ranks(root, 1, &s));
  loom_ckpt_dir_name(root, 1, dir, sizeof dir);
  snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
  static char orig[65536];
  size_t len;
  read_text(mpath, orig, sizeof orig, &len);
  TT_REQUIRE(len > 0);
  TT_CHECK_OK(open_dir(root, 1, LOOM_CKPT_VERIFY_META));
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  loom_ckpt *c = NULL;
  /* params' first block with m's first block: both 24 floats. */
  swap_blocks(mpath, 0, 0, 1, 0);
  for (int v = LOOM_CKPT_VERIFY_META; v <= LOOM_CKPT_VERIFY_FULL; v++) {
    oo.verify = (loom_ckpt_verify_level)v;
    TT_CHECK_EQ(loom_ckpt_open(&c, dir, &oo), LOOM_ERR_CORRUPT);
    TT_CHECK_HAS(loom_last_error(), "shard_00002.bin: the manifest's block "
                                    "of 'params' [700, 724) at byte");
    TT_CHECK_HAS(loom_last_error(), "(another buffer's block)");
  }
  /* Two blocks of one buffer trade places. */
  write_text(mpath, orig, len);
  TT_CHECK_OK(open_dir(root, 1, LOOM_CKPT_VERIFY_FULL));
  swap_blocks(mpath, 0, 0, 0, 1);
  TT_CHECK_EQ(loom_ckpt_open(&c, dir, NULL), LOOM_ERR_CORRUPT);
  TT_CHECK_HAS(loom_last_error(), "(its range, dtype or checksum differ)");
  /* An unknown verification level is refused, not taken for none. */
  write_text(mpath, orig, len);
  TT_REQUIRE_OK(loom_ckpt_open(&c, dir, NULL));
  TT_CHECK_EQ(loom_ckpt_verify_file(c, 0, (loom_ckpt_verify_level)9),
              LOOM_ERR_INVALID_ARG);
  loom_ckpt_close(c);
  swap_blocks(mpath, 0, 0, 0, 1);
  /* The search for a checkpoint to resume from passes over it. */
  char got[512];
  int64_t step = -1;
  oo.verify = LOOM_CKPT_VERIFY_FULL;
  TT_CHECK_EQ(loom_ckpt_find_latest_valid(root, &oo, got, sizeof got, &step),
              LOOM_ERR_CORRUPT);
}

int main(void) {
  loom_log_set_level(LOOM_LOG_WARN);
  snprintf(base_dir, sizeof base_dir, "/tmp/loom_test_ckpt_XXXXXX");
  if (!mkdtemp(base_dir)) {
    perror("mkdtemp");
    return 1;
  }
  init_views();
  TT_RUN(test_round_trip);
  TT_RUN(test_reshard);
  TT_RUN(test_concurrent_ranks);
  TT_RUN(test_commit_checks);
  TT_RUN(test_damage);
  TT_RUN(test_keep_and_history);
  TT_RUN(test_failed_save);
  TT_RUN(test_enospc_tmpfs);
  TT_RUN(test_async);
  TT_RUN(test_alloc_failures);
  TT_RUN(test_misuse);
  TT_RUN(test_fuzz_manifest);
  TT_RUN(test_views_checked);
  TT_RUN(test_forged_blocks);
  TT_RUN(test_unknown_strategy);
  /* Remove the test's directories: base/rN/step_X/files and base/rN/... */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", base_dir);
  return tt_finish();
}
