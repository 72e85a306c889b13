/* IDX reader and image data sets: small files written here (plain and
 * gzip), every kind of damage, and the real Fashion-MNIST when installed. */
#include <sys/stat.h>
#include <zlib.h>

#include "loom/data.h"
#include "tt.h"
#include "util.h"

/* An IDX file of unsigned bytes: magic, dims, then `n` data bytes (pass
 * fewer than the dims need to truncate it). */
static size_t idx_bytes(uint8_t *out, uint32_t magic, const uint32_t *dims,
                        int ndim, const uint8_t *data, size_t n) {
  size_t k = 0;
  for (int s = 24; s >= 0; s -= 8)
    out[k++] = (uint8_t)(magic >> s);
  for (int i = 0; i < ndim; i++)
    for (int s = 24; s >= 0; s -= 8)
      out[k++] = (uint8_t)(dims[i] >> s);
  memcpy(out + k, data, n);
  return k + n;
}

static void write_file(const char *path, const uint8_t *b, size_t n, int gz) {
  if (!gz) {
    tu_write(path, b, n);
    return;
  }
  gzFile g = gzopen(path, "wb");
  if (!g || gzwrite(g, b, (unsigned)n) != (int)n) {
    fprintf(stderr, "gzwrite %s failed\n", path);
    exit(1);
  }
  gzclose(g);
}

/* N=5 images of 3x4 and their 5 labels, plain or gzip. */
static uint8_t pix[5 * 12];
static uint8_t lab[5] = {3, 0, 2, 1, 3};
static void write_pair(const char *im, const char *lb, int gz) {
  uint8_t buf[256];
  uint32_t d3[3] = {5, 3, 4}, d1[1] = {5};
  for (int i = 0; i < 60; i++)
    pix[i] = (uint8_t)(i * 37 + 11);
  pix[0] = 0;
  pix[1] = 255;
  write_file(im, buf, idx_bytes(buf, 0x00000803, d3, 3, pix, 60), gz);
  write_file(lb, buf, idx_bytes(buf, 0x00000801, d1, 1, lab, 5), gz);
}

TT_TEST(test_plain_and_gzip) {
  for (int gz = 0; gz < 2; gz++) {
    const char *im = tu_path(gz ? "im.gz" : "im"),
               *lb = tu_path(gz ? "lb.gz" : "lb");
    write_pair(im, lb, gz);
    loom_idx m;
    TT_REQUIRE_OK(loom_idx_read(im, &m));
    TT_CHECK_EQ(m.ndim, 3);
    TT_CHECK_EQ(m.dims[0], 5);
    TT_CHECK_EQ(m.dims[1], 3);
    TT_CHECK_EQ(m.dims[2], 4);
    TT_CHECK_EQ(m.bytes, 60);
    TT_CHECK(memcmp(m.data, pix, 60) == 0);
    loom_idx_free(&m);
    TT_CHECK(m.data == NULL);
    loom_idx_free(&m); /* twice is harmless */
    TT_REQUIRE_OK(loom_idx_read(lb, &m));
    TT_CHECK_EQ(m.ndim, 1);
    TT_CHECK_EQ(m.dims[0], 5);
    TT_CHECK(memcmp(m.data, lab, 5) == 0);
    loom_idx_free(&m);
  }
}

/* The status and the file named in the message. */
static void expect_fail(const char *path, loom_status want, const char *part) {
  loom_idx m;
  loom_status st = loom_idx_read(path, &m);
  TT_CHECK_EQ(st, want);
  TT_CHECK(tu_msg_has(path));
  TT_CHECK(tu_msg_has(part));
  TT_CHECK(m.data == NULL);
}

TT_TEST(test_damage) {
  uint8_t buf[256], data[64] = {0};
  uint32_t d3[3] = {5, 3, 4};
  for (int gz = 0; gz < 2; gz++) {
    char name[64];
    /* data cut short */
    snprintf(name, sizeof name, "trunc%d", gz);
    const char *p = tu_path(name);
    write_file(p, buf, idx_bytes(buf, 0x803, d3, 3, data, 59), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "truncated");
    /* A header that asks for 0.9 TB over 16 bytes of data: an error, and
     * the allocations stay small (at most 64 MiB for gzip, which is
     * inflated to learn its size). */
    snprintf(name, sizeof name, "huge%d", gz);
    p = tu_path(name);
    uint32_t huge[3] = {40000, 40000, 600};
    write_file(p, buf, idx_bytes(buf, 0x803, huge, 3, data, 16), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "truncated");
    /* header cut short */
    snprintf(name, sizeof name, "hdr%d", gz);
    p = tu_path(name);
    write_file(p, buf, 10, gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "truncated IDX header");
    write_file(p, buf, 2, gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "truncated IDX header");
    /* wrong magic */
    snprintf(name, sizeof name, "magic%d", gz);
    p = tu_path(name);
    write_file(p, buf, idx_bytes(buf, 0x12340803, d3, 3, data, 60), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "wrong magic");
    write_file(p, buf, idx_bytes(buf, 0x00000703, d3, 3, data, 60), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "wrong magic");
    /* float elements: a real IDX type loom does not read */
    write_file(p, buf, idx_bytes(buf, 0x00000D03, d3, 3, data, 60), gz);
    expect_fail(p, LOOM_ERR_UNSUPPORTED, "float32");
    /* 0 or 5 dimensions */
    write_file(p, buf, idx_bytes(buf, 0x00000800, d3, 0, data, 60), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "0 dimensions");
    write_file(p, buf, idx_bytes(buf, 0x00000805, d3, 3, data, 60), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "5 dimensions");
    /* a zero dimension */
    uint32_t dz[3] = {5, 0, 4};
    write_file(p, buf, idx_bytes(buf, 0x803, dz, 3, data, 60), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "dimension 1 is 0");
    /* more data than the header describes */
    write_file(p, buf, idx_bytes(buf, 0x803, d3, 3, data, 61), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "trailing data");
    /* an absurd size */
    uint32_t dbig[3] = {0xffffffffu, 0xffffffffu, 4};
    write_file(p, buf, idx_bytes(buf, 0x803, dbig, 3, data, 60), gz);
    expect_fail(p, LOOM_ERR_CORRUPT, "more than");
  }
  /* a gzip stream cut in the middle */
  const char *p = tu_path("cut.gz");
  uint8_t big[4096 + 16];
  uint32_t d2[2] = {64, 64};
  loom_rng r = loom_rng_init(7, 0);
  uint8_t noise[4096];
  for (int i = 0; i < 4096; i++)
    noise[i] = (uint8_t)loom_rng_u32(&r); /* incompressible */
  write_file(p, big, idx_bytes(big, 0x802, d2, 2, noise, 4096), 1);
  struct stat sb;
  TT_REQUIRE(stat(p, &sb) == 0);
  TT_REQUIRE(truncate(p, sb.st_size / 2) == 0);
  expect_fail(p, LOOM_ERR_CORRUPT, "truncated");
  /* a damaged gzip trailer (CRC) */
  write_file(p, big, idx_bytes(big, 0x802, d2, 2, noise, 4096), 1);
  FILE *f = fopen(p, "r+b");
  TT_REQUIRE(f != NULL);
  fseek(f, -8, SEEK_END);
  fputc(0x5a, f);
  fclose(f);
  expect_fail(p, LOOM_ERR_CORRUPT, "gzip");
  /* missing file */
  expect_fail(tu_path("no-such-file.gz"), LOOM_ERR_IO, "No such file");
}

/* Appends n bytes to path; returns the size it had (-1 on failure). */
static long append_bytes(const char *path, const void *b, size_t n) {
  struct stat sb;
  FILE *f = stat(path, &sb) == 0 ? fopen(path, "ab") : NULL;
  if (!f)
    return -1;
  bool ok = fwrite(b, 1, n, f) == n;
  return fclose(f) == 0 && ok ? (long)sb.st_size : -1;
}

/* Bytes after a gzip stream that are not another gzip member are refused
 * with their offset (gzread ignored them: a valid .gz + "GARBAGEGARBAGE" or
 * + 100 zero bytes was read as a good file). Concatenated members are
 * gzip's own format and read as one stream. */
TT_TEST(test_gzip_trailing_bytes) {
  const char *p = tu_path("tail-im.gz"), *lb = tu_path("tail-lb.gz");
  char want[128];
  write_pair(p, lb, 1);
  long at = append_bytes(p, "GARBAGEGARBAGE", 14);
  TT_REQUIRE(at > 0);
  snprintf(want, sizeof want, "trailing data at byte offset %ld: 14 bytes", at);
  expect_fail(p, LOOM_ERR_CORRUPT, want);
  TT_CHECK(tu_msg_has(p));
  static const uint8_t zeros[100];
  write_pair(p, lb, 1);
  at = append_bytes(p, zeros, sizeof zeros);
  TT_REQUIRE(at > 0);
  snprintf(want, sizeof want, "trailing data at byte offset %ld: 100 bytes",
           at);
  expect_fail(p, LOOM_ERR_CORRUPT, want);
  write_pair(p, lb, 1);
  TT_REQUIRE(append_bytes(p, "\x1f", 1) > 0); /* not even a gzip magic */
  expect_fail(p, LOOM_ERR_CORRUPT, "trailing data");
  loom_idx m;
  TT_CHECK_EQ(loom_idx_read_header(p, &m), LOOM_OK); /* the header is fine */
  /* a second member holding the last bytes of the data: one stream */
  uint8_t buf[256];
  uint32_t d3[3] = {5, 3, 4};
  size_t n = idx_bytes(buf, 0x00000803, d3, 3, pix, 60);
  write_file(p, buf, n - 7, 1);
  const char *second = tu_path("second.gz");
  write_file(second, buf + n - 7, 7, 1);
  uint8_t sec[256];
  FILE *f = fopen(second, "rb");
  TT_REQUIRE(f != NULL);
  size_t k = fread(sec, 1, sizeof sec, f);
  fclose(f);
  TT_REQUIRE(append_bytes(p, sec, k) > 0);
  TT_REQUIRE_OK(loom_idx_read(p, &m));
  TT_CHECK_EQ((long)m.bytes, 60);
  TT_CHECK(memcmp(m.data, pix, 60) == 0);
  loom_idx_free(&m);
  /* ... and garbage after the second member is refused too */
  TT_REQUIRE(append_bytes(p, "GARBAGE", 7) > 0);
  expect_fail(p, LOOM_ERR_CORRUPT, "trailing data at byte offset");
}

TT_TEST(test_image_dataset) {
  const char *im = tu_path("ds-im.gz"), *lb = tu_path("ds-lb");
  write_pair(im, lb, 1);
  write_pair(im, lb, 1);
  loom_image_opts o = {0.25f, 0.5f};
  loom_dataset *ds = NULL;
  TT_REQUIRE_OK(loom_dataset_open_idx(&ds, im, lb, &o));
  loom_dataset_info info;
  loom_dataset_get_info(ds, &info);
  TT_CHECK_EQ(info.kind, LOOM_DATASET_IMAGES);
  TT_CHECK_EQ(info.len, 5);
  TT_CHECK_EQ(info.C, 1);
  TT_CHECK_EQ(info.H, 3);
  TT_CHECK_EQ(info.W, 4);
  TT_CHECK_EQ(info.classes, 4);
  TT_CHECK_STR(info.source, im);
  loom_batch b;
  TT_REQUIRE_OK(loom_batch_alloc(&b, ds, 3));
  int64_t idx[2] = {4, 0};
  TT_REQUIRE_OK(loom_dataset_fill(ds, 0, idx, 2, &b));
  TT_CHECK_EQ(b.size, 2);
  TT_CHECK_EQ(b.x.shape[0], 2);
  TT_CHECK_EQ(b.x.shape[1], 1);
  TT_CHECK_EQ(b.x.shape[2], 3);
  TT_CHECK_EQ(b.x.shape[3], 4);
  TT_CHECK_EQ(b.y.shape[0], 2);
  const float *x = b.x.data;
  const int32_t *y = b.y.data;
  float want[24];
  for (int p = 0; p < 12; p++) {
    want[p] = ((float)pix[48 + p] / 255.0f - 0.25f) / 0.5f;
    want[12 + p] = ((float)pix[p] / 255.0f - 0.25f) / 0.5f;
  }
  TT_CHECK(memcmp(x, want, sizeof want) == 0); /* bit for bit */
  TT_CHECK_NEAR(x[12], -0.5, 1e-7);            /* pixel 0 */
  TT_CHECK_NEAR(x[13], 1.5, 1e-6);             /* pixel 255 */
  TT_CHECK_EQ(y[0], 3);
  TT_CHECK_EQ(y[1], 3);
  TT_CHECK_EQ(b.sample[0], 4);
  /* out of range and over capacity are refused */
  int64_t bad[1] = {5};
  TT_CHECK_EQ(loom_dataset_fill(ds, 0, bad, 1, &b), LOOM_ERR_INVALID_ARG);
  int64_t four[4] = {0, 1, 2, 3};
  TT_CHECK_EQ(loom_dataset_fill(ds, 0, four, 4, &b), LOOM_ERR_INVALID_ARG);
  loom_batch_free(&b);
  loom_batch_free(&b);
  loom_dataset_free(ds);
  loom_dataset_free(NULL);
}

TT_TEST(test_image_dataset_errors) {
  uint8_t buf[256], data[60] = {0};
  uint32_t d3[3] = {5, 3, 4}, d2[2] = {5, 12}, d1[1] = {4}, d12[2] = {5, 1};
  const char *im3 = tu_path("e-im3"), *im2 = tu_path("e-im2");
  const char *lb4 = tu_path("e-lb4"), *lb2 = tu_path("e-lb2");
  tu_write(im3, buf, idx_bytes(buf, 0x803, d3, 3, data, 60));
  tu_write(im2, buf, idx_bytes(buf, 0x802, d2, 2, data, 60));
  tu_write(lb4, buf, idx_bytes(buf, 0x801, d1, 1, data, 4));
  tu_write(lb2, buf, idx_bytes(buf, 0x802, d12, 2, data, 5));
  loom_dataset *ds = (loom_dataset *)1;
  /* images with 2 dimensions */
  TT_CHECK_EQ(loom_dataset_open_idx(&ds, im2, lb4, NULL), LOOM_ERR_CORRUPT);
  TT_CHECK(tu_msg_has(im2));
  TT_CHECK(tu_msg_has("3 dimensions"));
  TT_CHECK(ds == NULL);
  /* labels with 2 dimensions */
  TT_CHECK_EQ(loom_dataset_open_idx(&ds, im3, lb2, NULL), LOOM_ERR_CORRUPT);
  TT_CHECK(tu_msg_has(lb2));
  TT_CHECK(tu_msg_has("1 dimension"));
  /* 5 images, 4 labels */
  TT_CHECK_EQ(loom_dataset_open_idx(&ds, im3, lb4, NULL), LOOM_ERR_CORRUPT);
  TT_CHECK(tu_msg_has(im3));
  TT_CHECK(tu_msg_has(lb4));
  TT_CHECK(tu_msg_has("5 images"));
  TT_CHECK(tu_msg_has("4 labels"));
  /* a missing file */
  TT_CHECK_EQ(loom_dataset_open_idx(&ds, im3, tu_path("nope"), NULL),
              LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("nope"));
  /* bad normalisation */
  loom_image_opts o = {0.1f, 0.0f};
  TT_CHECK_EQ(loom_dataset_open_idx(&ds, im3, lb4, &o), LOOM_ERR_INVALID_ARG);
}

/* Every allocation of an open fails in turn: a clean NOMEM each time. */
TT_TEST(test_alloc_failures) {
  const char *im = tu_path("a-im.gz"), *lb = tu_path("a-lb.gz");
  write_pair(im, lb, 1);
  int failures = 0;
  for (long n = 1; n < 40; n++) {
    loom_dataset *ds = NULL;
    loom_alloc_fail_after(n);
    loom_status st = loom_dataset_open_idx(&ds, im, lb, NULL);
    loom_alloc_fail_after(0);
    if (st == LOOM_OK) {
      loom_dataset_free(ds);
      break;
    }
    TT_CHECK_EQ(st, LOOM_ERR_NOMEM);
    TT_CHECK(ds == NULL);
    failures++;
  }
  TT_CHECK(failures >= 4);
}

/* Fashion-MNIST layout in a directory of our own (data.path), plain files. */
TT_TEST(test_fashion_layout) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s", tu_path("fm"));
  TT_REQUIRE(mkdir(dir, 0777) == 0);
  loom_dataset *ds = NULL;
  TT_CHECK_EQ(loom_dataset_open_fashion(&ds, dir, LOOM_SPLIT_VAL, NULL),
              LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("t10k-images-idx3-ubyte.gz"));
  TT_CHECK(tu_msg_has(LOOM_FASHION_MNIST_PACKAGE));
  uint8_t buf[4096], px[2 * 784], lb[2] = {7, 9};
  uint32_t d3[3] = {2, 28, 28}, d1[1] = {2};
  for (int i = 0; i < 2 * 784; i++)
    px[i] = (uint8_t)i;
  char p[700];
  snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
  tu_write(p, buf, idx_bytes(buf, 0x803, d3, 3, px, sizeof px));
  TT_CHECK_EQ(loom_dataset_open_fashion(&ds, dir, LOOM_SPLIT_VAL, NULL),
              LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("t10k-labels-idx1-ubyte"));
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
  tu_write(p, buf, idx_bytes(buf, 0x801, d1, 1, lb, 2));
  TT_REQUIRE_OK(loom_dataset_open_fashion(&ds, dir, LOOM_SPLIT_VAL, NULL));
  TT_CHECK_EQ(loom_dataset_len(ds), 2);
  loom_dataset_info info;
  loom_dataset_get_info(ds, &info);
  TT_CHECK_EQ(info.classes, 10);
  loom_dataset_free(ds);
  /* not 28x28: refused */
  uint32_t d3b[3] = {2, 28, 27};
  snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
  tu_write(p, buf, idx_bytes(buf, 0x803, d3b, 3, px, 2 * 28 * 27));
  TT_CHECK_EQ(loom_dataset_open_fashion(&ds, dir, LOOM_SPLIT_VAL, NULL),
              LOOM_ERR_CORRUPT);
  TT_CHECK(tu_msg_has("28x27"));
}

TT_TEST(test_real_fashion_mnist) {
  struct stat sb;
  if (stat(LOOM_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", &sb) != 0) {
    printf("SKIP test_real_fashion_mnist: %s is not installed\n",
           LOOM_FASHION_MNIST_PACKAGE);
    return;
  }
  loom_dataset *tr = NULL, *te = NULL;
  TT_REQUIRE_OK(loom_dataset_open_fashion(&tr, NULL, LOOM_SPLIT_TRAIN, NULL));
  TT_REQUIRE_OK(loom_dataset_open_fashion(&te, NULL, LOOM_SPLIT_VAL, NULL));
  TT_CHECK_EQ(loom_dataset_len(tr), 60000);
  TT_CHECK_EQ(loom_dataset_len(te), 10000);
  loom_batch b;
  TT_REQUIRE_OK(loom_batch_alloc(&b, tr, 10));
  int64_t idx[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const int32_t tr_labels[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  const int32_t te_labels[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  TT_REQUIRE_OK(loom_dataset_fill(tr, 0, idx, 10, &b));
  for (int i = 0; i < 10; i++)
    TT_CHECK_EQ(((int32_t *)b.y.data)[i], tr_labels[i]);
  /* image 0: its byte sum is 76247, pixel (14,14) is 217 */
  const float *x = b.x.data;
  double sum = 0;
  for (int p = 0; p < 784; p++)
    sum += ((double)x[p] * LOOM_FASHION_STD + LOOM_FASHION_MEAN) * 255.0;
  TT_CHECK_NEAR(sum, 76247.0, 0.05);
  TT_CHECK(x[14 * 28 + 14] ==
           (217.0f / 255.0f - LOOM_FASHION_MEAN) / LOOM_FASHION_STD);
  TT_REQUIRE_OK(loom_dataset_fill(te, 0, idx, 10, &b));
  for (int i = 0; i < 10; i++)
    TT_CHECK_EQ(((int32_t *)b.y.data)[i], te_labels[i]);
  loom_batch_free(&b);
  loom_dataset_free(tr);
  loom_dataset_free(te);
}

TT_TEST(test_names) {
  loom_split s;
  TT_CHECK_OK(loom_split_parse("val", &s));
  TT_CHECK_EQ(s, LOOM_SPLIT_VAL);
  TT_CHECK_STR(loom_split_name(LOOM_SPLIT_TRAIN), "train");
  TT_CHECK_EQ(loom_split_parse("test", &s), LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_dataset_kind_name(LOOM_DATASET_TOKENS), "tokens");
}

/* loom_data_file_detect: the kind from the first bytes, not the name. */
TT_TEST(test_file_detect) {
  uint8_t buf[256];
  uint32_t d3[3] = {5, 3, 4};
  size_t n = idx_bytes(buf, 0x00000803, d3, 3, pix, 60);
  loom_data_file k = LOOM_DATA_FILE_COUNT;
  const char *p = tu_path("idx-named.txt");
  write_file(p, buf, n, 0);
  TT_CHECK_OK(loom_data_file_detect(p, &k));
  TT_CHECK_EQ(k, LOOM_DATA_FILE_IDX);
  p = tu_path("images.gz");
  write_file(p, buf, n, 1);
  TT_CHECK_OK(loom_data_file_detect(p, &k));
  TT_CHECK_EQ(k, LOOM_DATA_FILE_IDX);
  uint16_t tok[3] = {1, 2, 3};
  p = tu_path("shard.data");
  TT_REQUIRE_OK(loom_shard_write(p, tok, 3));
  TT_CHECK_OK(loom_data_file_detect(p, &k));
  TT_CHECK_EQ(k, LOOM_DATA_FILE_SHARD);
  TT_CHECK(strcmp(loom_data_file_name(k), "llm.c token shard") == 0);
  p = tu_path("idx3-ubyte");
  tu_write(p, "hello", 5);
  TT_CHECK_OK(loom_data_file_detect(p, &k));
  TT_CHECK_EQ(k, LOOM_DATA_FILE_TEXT);
  tu_write(p, "", 0);
  TT_CHECK_OK(loom_data_file_detect(p, &k));
  TT_CHECK_EQ(k, LOOM_DATA_FILE_TEXT);
  p = tu_path("text-idx.gz");
  write_file(p, (const uint8_t *)"hello world", 11, 1);
  TT_CHECK_EQ(loom_data_file_detect(p, &k), LOOM_ERR_UNSUPPORTED);
  TT_CHECK(tu_msg_has(p));
  p = tu_path("fifo-idx.gz");
  TT_REQUIRE(mkfifo(p, 0600) == 0);
  TT_CHECK_EQ(loom_data_file_detect(p, &k), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("not a regular file"));
  TT_CHECK_EQ(loom_data_file_detect(tu_dir, &k), LOOM_ERR_IO);
  TT_CHECK_EQ(loom_data_file_detect(tu_path("none"), &k), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("No such file"));
}

int main(void) {
  tu_tmpdir();
  TT_RUN(test_plain_and_gzip);
  TT_RUN(test_damage);
  TT_RUN(test_image_dataset);
  TT_RUN(test_image_dataset_errors);
  TT_RUN(test_alloc_failures);
  TT_RUN(test_gzip_trailing_bytes);
  TT_RUN(test_file_detect);
  TT_RUN(test_fashion_layout);
  TT_RUN(test_real_fashion_mnist);
  TT_RUN(test_names);
  tu_cleanup();
  return tt_finish();
}
