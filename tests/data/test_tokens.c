/* llm.c token shards (write, read back, damage) and token-window data sets
 * over shards and over byte-level text. */
#include <sys/stat.h>

#include "loom/data.h"
#include "tt.h"
#include "util.h"

static void le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* A raw shard: header (magic, version, count) then `nbytes` token bytes. */
static void write_raw_shard(const char *path, uint32_t magic, uint32_t version,
                            uint32_t count, const uint8_t *tok, size_t nbytes) {
  uint8_t *b = calloc(1, 1024 + nbytes);
  le32(b, magic);
  le32(b + 4, version);
  le32(b + 8, count);
  memcpy(b + 1024, tok, nbytes);
  tu_write(path, b, 1024 + nbytes);
  free(b);
}

TT_TEST(test_shard_roundtrip) {
  enum { N = 5000 };
  uint16_t *tok = malloc(N * sizeof *tok);
  for (int i = 0; i < N; i++)
    tok[i] = (uint16_t)((i * 7919) % 50257);
  const char *p = tu_path("sub/dir/a.bin");
  TT_REQUIRE_OK(loom_shard_write(p, tok, N));
  loom_shard s;
  TT_REQUIRE_OK(loom_shard_open(p, &s));
  TT_CHECK_EQ(s.magic, 20240520);
  TT_CHECK_EQ(s.version, 1);
  TT_CHECK_EQ(s.width, 2);
  TT_CHECK_EQ(s.ntok, N);
  uint32_t maxt = 0;
  int bad = 0;
  for (int i = 0; i < N; i++) {
    bad += loom_shard_token(&s, i) != tok[i];
    if (tok[i] > maxt)
      maxt = tok[i];
  }
  TT_CHECK_EQ(bad, 0);
  TT_CHECK_EQ(s.max_token, maxt);
  loom_shard_close(&s);
  loom_shard_close(&s);
  /* the exact layout llm.c writes: header of 256 int32, little-endian */
  FILE *f = fopen(p, "rb");
  TT_REQUIRE(f != NULL);
  uint8_t h[1028];
  TT_REQUIRE(fread(h, 1, sizeof h, f) == sizeof h);
  fclose(f);
  TT_CHECK(h[0] == (20240520 & 0xff) && h[4] == 1 && h[8] == (N & 0xff) &&
           h[9] == (N >> 8));
  int zeros = 1;
  for (int i = 12; i < 1024; i++)
    zeros &= h[i] == 0;
  TT_CHECK(zeros);
  TT_CHECK(h[1024] == (uint8_t)tok[0] && h[1025] == (uint8_t)(tok[0] >> 8));
  struct stat sb;
  TT_CHECK(stat(p, &sb) == 0 && sb.st_size == 1024 + 2 * N);
  free(tok);
}

TT_TEST(test_shard_u32) {
  uint8_t tok[4 * 3];
  le32(tok, 5);
  le32(tok + 4, 128255);
  le32(tok + 8, 70000);
  const char *p = tu_path("llama.bin");
  write_raw_shard(p, 20240801, 7, 3, tok, sizeof tok);
  loom_shard s;
  TT_REQUIRE_OK(loom_shard_open(p, &s));
  TT_CHECK_EQ(s.width, 4);
  TT_CHECK_EQ(loom_shard_token(&s, 1), 128255);
  TT_CHECK_EQ(loom_shard_token(&s, 2), 70000);
  TT_CHECK_EQ(s.max_token, 128255);
  loom_shard_close(&s);
}

static void expect_shard_fail(const char *p, loom_status want,
                              const char *part) {
  loom_shard s;
  TT_CHECK_EQ(loom_shard_open(p, &s), want);
  TT_CHECK(tu_msg_has(p));
  TT_CHECK(tu_msg_has(part));
  TT_CHECK(s.map == NULL);
}

TT_TEST(test_shard_damage) {
  uint8_t tok[20] = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0, 9, 0};
  const char *p = tu_path("bad.bin");
  write_raw_shard(p, 20240521, 1, 10, tok, 20);
  expect_shard_fail(p, LOOM_ERR_CORRUPT, "wrong magic 20240521");
  write_raw_shard(p, 20240520, 2, 10, tok, 20);
  expect_shard_fail(p, LOOM_ERR_UNSUPPORTED, "version 2");
  write_raw_shard(p, 20240520, 1, 10, tok, 19);
  expect_shard_fail(p, LOOM_ERR_CORRUPT, "truncated");
  write_raw_shard(p, 20240520, 1, 11, tok, 20);
  expect_shard_fail(p, LOOM_ERR_CORRUPT, "truncated");
  write_raw_shard(p, 20240520, 1, 9, tok, 20);
  expect_shard_fail(p, LOOM_ERR_CORRUPT, "trailing");
  write_raw_shard(p, 20240520, 1, 0xffffffffu, tok, 20);
  expect_shard_fail(p, LOOM_ERR_CORRUPT, "negative");
  tu_write(p, tok, 20);
  expect_shard_fail(p, LOOM_ERR_CORRUPT, "truncated token shard header");
  expect_shard_fail(tu_path("none.bin"), LOOM_ERR_IO, "No such file");
  loom_dataset *ds = NULL;
  TT_CHECK_EQ(loom_dataset_open_shards(&ds, tu_path("none*.bin"), NULL),
              LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("none*.bin"));
}

/* Shards whose token i is its own position (plus a shard tag), so a
 * window's tokens say where it was cut. */
TT_TEST(test_shard_windows) {
  enum { T = 16 };
  const int64_t n0 = 1000, n1 = 333;
  uint16_t *t = malloc(1000 * sizeof *t);
  for (int i = 0; i < 1000; i++)
    t[i] = (uint16_t)i;
  TT_REQUIRE_OK(loom_shard_write(tu_path("w_000.bin"), t, n0));
  for (int i = 0; i < 333; i++)
    t[i] = (uint16_t)(10000 + i);
  TT_REQUIRE_OK(loom_shard_write(tu_path("w_001.bin"), t, n1));
  free(t);
  loom_text_opts o = loom_text_opts_default();
  o.context = T;
  o.seed = 42;
  for (int ro = 0; ro < 2; ro++) {
    o.random_offset = ro;
    loom_dataset *ds = NULL;
    TT_REQUIRE_OK(loom_dataset_open_shards(&ds, tu_path("w_*.bin"), &o));
    loom_dataset_info info;
    loom_dataset_get_info(ds, &info);
    int64_t w0 = ro ? n0 / T - 1 : (n0 - 1) / T;
    int64_t w1 = ro ? n1 / T - 1 : (n1 - 1) / T;
    TT_CHECK_EQ(info.len, w0 + w1);
    TT_CHECK_EQ(info.T, T);
    TT_CHECK_EQ(info.tokens, n0 + n1);
    TT_CHECK_EQ(info.classes, 10000 + 332 + 1);
    int64_t N = info.len;
    int64_t *idx = malloc((size_t)N * sizeof *idx);
    for (int64_t i = 0; i < N; i++)
      idx[i] = i;
    loom_batch b;
    TT_REQUIRE_OK(loom_batch_alloc(&b, ds, N));
    int offsets_seen = 0, prev_off = -1;
    for (int64_t e = 0; e < 6; e++) {
      TT_REQUIRE_OK(loom_dataset_fill(ds, e, idx, N, &b));
      const int32_t *x = b.x.data, *y = b.y.data;
      int64_t off = x[0]; /* window 0 starts at the epoch's offset */
      TT_CHECK(off >= 0 && off < T);
      if (!ro)
        TT_CHECK_EQ(off, 0);
      if (off != prev_off)
        offsets_seen++;
      prev_off = (int)off;
      int bad = 0;
      for (int64_t i = 0; i < N; i++) {
        int64_t shard = i < w0 ? 0 : 1;
        int64_t start = off + (i - (shard ? w0 : 0)) * T;
        int64_t base = shard ? 10000 : 0, len = shard ? n1 : n0;
        bad += start + T + 1 > len; /* inside its shard */
        for (int k = 0; k < T; k++) {
          bad += x[i * T + k] != base + start + k;
          bad += y[i * T + k] != base + start + k + 1;
        }
      }
      TT_CHECK_EQ(bad, 0);
    }
    if (ro)
      TT_CHECK(offsets_seen >= 2); /* the offset moves between epochs */
    loom_batch_free(&b);
    free(idx);
    loom_dataset_free(ds);
  }
}

TT_TEST(test_text_splits) {
  enum { T = 8 };
  const int64_t n = 1003; /* val = round(100.3) = 100 bytes, train 903 */
  uint8_t *text = malloc(n);
  loom_rng r = loom_rng_init(3, 0);
  for (int64_t i = 0; i < n; i++)
    text[i] = (uint8_t)(32 + loom_rng_below(&r, 95));
  text[500] = 200;
  const char *p = tu_path("text.txt");
  tu_write(p, text, (size_t)n);
  loom_text_opts o = loom_text_opts_default();
  o.context = T;
  o.seed = 9;
  loom_dataset *tr = NULL, *va = NULL;
  TT_REQUIRE_OK(loom_dataset_open_text(&tr, p, LOOM_SPLIT_TRAIN, &o));
  TT_REQUIRE_OK(loom_dataset_open_text(&va, p, LOOM_SPLIT_VAL, &o));
  loom_dataset_info it, iv;
  loom_dataset_get_info(tr, &it);
  loom_dataset_get_info(va, &iv);
  TT_CHECK_EQ(it.tokens, 903);
  TT_CHECK_EQ(iv.tokens, 100);
  TT_CHECK_EQ(it.len, 903 / T - 1);   /* random offset */
  TT_CHECK_EQ(iv.len, (100 - 1) / T); /* offset 0 */
  TT_CHECK_EQ(it.classes, 201);
  loom_batch b;
  TT_REQUIRE_OK(loom_batch_alloc(&b, tr, it.len));
  int64_t *idx = malloc((size_t)it.len * sizeof *idx);
  for (int64_t i = 0; i < it.len; i++)
    idx[i] = it.len - 1 - i; /* any order */
  for (int64_t e = 0; e < 4; e++) {
    TT_REQUIRE_OK(loom_dataset_fill(tr, e, idx, it.len, &b));
    const int32_t *x = b.x.data, *y = b.y.data;
    /* find the offset from the first window, then check them all */
    int64_t off = -1;
    for (int64_t c = 0; c < T && off < 0; c++) {
      int64_t s0 = c + idx[0] * T, ok = 1;
      for (int k = 0; k < T; k++)
        ok &= x[k] == text[s0 + k];
      if (ok)
        off = c;
    }
    TT_REQUIRE(off >= 0);
    int bad = 0;
    for (int64_t i = 0; i < it.len; i++) {
      int64_t s = off + idx[i] * T;
      bad += s + T + 1 > 903; /* never into the val bytes */
      for (int k = 0; k < T; k++)
        bad += x[i * T + k] != text[s + k] || y[i * T + k] != text[s + k + 1];
    }
    TT_CHECK_EQ(bad, 0);
  }
  loom_batch_free(&b);
  /* val: fixed windows from byte 903 on, the same in every epoch */
  TT_REQUIRE_OK(loom_batch_alloc(&b, va, iv.len));
  for (int64_t i = 0; i < iv.len; i++)
    idx[i] = i;
  for (int64_t e = 0; e < 3; e++) {
    TT_REQUIRE_OK(loom_dataset_fill(va, e, idx, iv.len, &b));
    const int32_t *x = b.x.data, *y = b.y.data;
    int bad = 0;
    for (int64_t i = 0; i < iv.len; i++)
      for (int k = 0; k < T; k++)
        bad += x[i * T + k] != text[903 + i * T + k] ||
               y[i * T + k] != text[903 + i * T + k + 1];
    TT_CHECK_EQ(bad, 0);
  }
  loom_batch_free(&b);
  free(idx);
  loom_dataset_free(tr);
  loom_dataset_free(va);

  /* too short for one window, bad options, missing file */
  o.context = 600;
  TT_CHECK_EQ(loom_dataset_open_text(&tr, p, LOOM_SPLIT_TRAIN, &o),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK(tu_msg_has("too few"));
  TT_CHECK(tr == NULL);
  o.context = 8;
  o.val_fraction = 1.0;
  TT_CHECK_EQ(loom_dataset_open_text(&tr, p, LOOM_SPLIT_TRAIN, &o),
              LOOM_ERR_INVALID_ARG);
  o.val_fraction = 0.1;
  TT_CHECK_EQ(
      loom_dataset_open_text(&tr, tu_path("nothing.txt"), LOOM_SPLIT_TRAIN, &o),
      LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("nothing.txt"));
  free(text);
}

/* Each split of a text reports its own largest byte: 90 'z' then 10 'a'
 * gave the val split the whole file's 'z' (classes 123). */
TT_TEST(test_text_split_classes) {
  uint8_t za[100];
  memset(za, 'z', 90);
  memset(za + 90, 'a', 10);
  const char *p = tu_path("za.txt");
  tu_write(p, za, sizeof za);
  loom_text_opts o = loom_text_opts_default();
  o.context = 4;
  loom_dataset *tr = NULL, *va = NULL;
  TT_REQUIRE_OK(loom_dataset_open_text(&tr, p, LOOM_SPLIT_TRAIN, &o));
  TT_REQUIRE_OK(loom_dataset_open_text(&va, p, LOOM_SPLIT_VAL, &o));
  loom_dataset_info it, iv;
  loom_dataset_get_info(tr, &it);
  loom_dataset_get_info(va, &iv);
  TT_CHECK_EQ(it.tokens, 90);
  TT_CHECK_EQ(iv.tokens, 10);
  TT_CHECK_EQ(it.classes, 'z' + 1);
  TT_CHECK_EQ(iv.classes, 'a' + 1);
  /* the vocabulary check still covers each split's own bytes */
  TT_CHECK_OK(loom_dataset_check_vocab(va, 'a' + 1));
  TT_CHECK_EQ(loom_dataset_check_vocab(tr, 'a' + 1), LOOM_ERR_CONFIG);
  TT_CHECK(tu_msg_has("za.txt: byte 0 is 122"));
  loom_dataset_free(tr);
  loom_dataset_free(va);
}

/* A token outside the vocabulary, in a validation shard or in text, is an
 * error on open naming the file and the position (issue 10: it was found
 * only at evaluation, without the file). A FIFO is refused, not waited on. */
TT_TEST(test_vocab_and_fifo) {
  uint8_t tok[20] = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 0x60, 0xea, 8, 0};
  const char *p = tu_path("val_000.bin");
  write_raw_shard(p, 20240520, 1, 10, tok, 20);
  loom_dataset *ds = NULL;
  loom_text_opts o = loom_text_opts_default();
  o.context = 2;
  o.random_offset = false;
  TT_REQUIRE_OK(loom_dataset_open_shards(&ds, tu_path("val_*.bin"), &o));
  TT_CHECK_OK(loom_dataset_check_vocab(ds, 60001));
  TT_CHECK_EQ(loom_dataset_check_vocab(ds, 50257), LOOM_ERR_CONFIG);
  TT_CHECK(tu_msg_has(p));
  TT_CHECK(tu_msg_has("token 6 (byte 1036) is 60000"));
  TT_CHECK(tu_msg_has("model.vocab 50257"));
  loom_dataset_free(ds);
  tu_write(tu_path("t.txt"), "abcdefgh\x80ijklmnop", 17);
  TT_REQUIRE_OK(
      loom_dataset_open_text(&ds, tu_path("t.txt"), LOOM_SPLIT_TRAIN, &o));
  TT_CHECK_OK(loom_dataset_check_vocab(ds, 256));
  TT_CHECK_EQ(loom_dataset_check_vocab(ds, 128), LOOM_ERR_CONFIG);
  TT_CHECK(tu_msg_has("t.txt: byte 8 is 128"));
  loom_dataset_free(ds);
  const char *fifo = tu_path("fifo.bin");
  TT_REQUIRE(mkfifo(fifo, 0600) == 0);
  expect_shard_fail(fifo, LOOM_ERR_IO, "not a regular file");
  TT_CHECK_EQ(loom_dataset_open_text(&ds, fifo, LOOM_SPLIT_TRAIN, &o),
              LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("not a regular file"));
  loom_idx idx;
  TT_CHECK_EQ(loom_idx_read(fifo, &idx), LOOM_ERR_IO);
  unlink(fifo);
}

/* loom_shard_write never writes into a pipe or directory at its path
 * (rename replaced a FIFO there), and replaces a link without touching
 * its target; loom_text_read refuses what is not a regular file. */
TT_TEST(test_shard_write_targets) {
  uint16_t tok[4] = {1, 2, 3, 4};
  const char *fifo = tu_path("wfifo.bin");
  TT_REQUIRE(mkfifo(fifo, 0600) == 0);
  TT_CHECK_EQ(loom_shard_write(fifo, tok, 4), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("wfifo.bin"));
  TT_CHECK(tu_msg_has("not a regular file"));
  struct stat sb;
  TT_CHECK(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
  const char *dir = tu_path("wdir.bin");
  TT_REQUIRE(mkdir(dir, 0700) == 0);
  TT_CHECK_EQ(loom_shard_write(dir, tok, 4), LOOM_ERR_IO);
  TT_CHECK(lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
  const char *target = tu_path("wtarget"), *link = tu_path("wlink.bin");
  tu_write(target, "keep", 4);
  TT_REQUIRE(symlink(target, link) == 0);
  TT_CHECK_OK(loom_shard_write(link, tok, 4));
  TT_CHECK(stat(target, &sb) == 0 && sb.st_size == 4);
  TT_CHECK(lstat(link, &sb) == 0 && S_ISREG(sb.st_mode) &&
           sb.st_size == 1024 + 8);
  loom_shard s;
  TT_REQUIRE_OK(loom_shard_open(link, &s));
  TT_CHECK_EQ(s.ntok, 4);
  TT_CHECK_EQ(loom_shard_token(&s, 3), 4u);
  loom_shard_close(&s);
  uint8_t *data = NULL;
  int64_t n = -1;
  TT_CHECK_EQ(loom_text_read(fifo, &data, &n), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("not a regular file"));
  TT_CHECK_EQ(loom_text_read(dir, &data, &n), LOOM_ERR_IO);
  TT_CHECK(data == NULL);
  TT_CHECK_OK(loom_text_read(target, &data, &n));
  TT_CHECK_EQ(n, 4);
  TT_CHECK(data && memcmp(data, "keep", 4) == 0);
  loom_free(data);
}

int main(void) {
  tu_tmpdir();
  TT_RUN(test_shard_roundtrip);
  TT_RUN(test_shard_u32);
  TT_RUN(test_shard_damage);
  TT_RUN(test_shard_windows);
  TT_RUN(test_text_splits);
  TT_RUN(test_text_split_classes);
  TT_RUN(test_vocab_and_fifo);
  TT_RUN(test_shard_write_targets);
  tu_cleanup();
  return tt_finish();
}
