/* Tests of the core layer: status, errors, allocation hook, dtypes, tensors,
 * arenas, Philox RNG, CRC32C. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "tt.h"

TT_TEST(test_status_and_errors) {
  TT_CHECK_STR(loom_status_str(LOOM_OK), "ok");
  TT_CHECK_STR(loom_status_name(LOOM_ERR_CORRUPT), "LOOM_ERR_CORRUPT");
  TT_CHECK_STR(loom_status_str((loom_status)-99), "unknown status");
  loom_status s = loom_error(LOOM_ERR_IO, "cannot open %s", "x.bin");
  TT_CHECK_EQ(s, LOOM_ERR_IO);
  TT_CHECK_STR(loom_last_error(), "cannot open x.bin");
  loom_error_context(s, "loading %s", "ckpt");
  TT_CHECK_STR(loom_last_error(), "loading ckpt: cannot open x.bin");
  loom_clear_error();
  TT_CHECK_STR(loom_last_error(), "");
}

TT_TEST(test_alloc_hook) {
  void *a = loom_malloc(100);
  TT_CHECK(a != NULL);
  TT_CHECK(((uintptr_t)a & 63) == 0);
  loom_free(a);
  loom_free(NULL);
  loom_alloc_fail_after(2);
  void *b = loom_malloc(10);
  void *c = loom_malloc(10);
  void *d = loom_malloc(10);
  TT_CHECK(b != NULL);
  TT_CHECK(c == NULL);
  TT_CHECK(d != NULL);
  loom_free(b);
  loom_free(d);
  loom_alloc_fail_after(0);
  TT_CHECK(loom_calloc(SIZE_MAX / 2, 4) == NULL);
}

TT_TEST(test_dtypes) {
  TT_CHECK_EQ(loom_dtype_size(LOOM_F32), 4);
  TT_CHECK_EQ(loom_dtype_size(LOOM_BF16), 2);
  TT_CHECK_STR(loom_dtype_name(LOOM_I64), "i64");
  loom_dtype dt;
  TT_CHECK_OK(loom_dtype_parse("f16", &dt));
  TT_CHECK_EQ(dt, LOOM_F16);
  TT_CHECK_EQ(loom_dtype_parse("f8", &dt), LOOM_ERR_INVALID_ARG);
  /* bf16: exact values survive, others round to nearest even. */
  TT_CHECK(loom_bf16_to_f32(loom_f32_to_bf16(1.5f)) == 1.5f);
  TT_CHECK(loom_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80); /* tie -> even */
  TT_CHECK(loom_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82); /* tie -> even */
  TT_CHECK(isnan(loom_bf16_to_f32(loom_f32_to_bf16(NAN))));
  /* f16 round trips and edge cases. */
  float vals[] = {0.0f,
                  1.0f,
                  -2.5f,
                  65504.0f,
                  6.103515625e-05f,
                  5.960464477539063e-08f,
                  0.333251953125f};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
    TT_CHECK(loom_f16_to_f32(loom_f32_to_f16(vals[i])) == vals[i]);
  TT_CHECK(isinf(loom_f16_to_f32(loom_f32_to_f16(70000.0f))));
  TT_CHECK(loom_f32_to_f16(1.0f) == 0x3c00);
  TT_CHECK(loom_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie -> even */
  TT_CHECK(loom_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);
  TT_CHECK(isnan(loom_f16_to_f32(loom_f32_to_f16(NAN))));
  /* Every f16 value converts to f32 and back unchanged (but NaNs). */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = loom_f16_to_f32((loom_f16)h);
    if (!isnan(f) && loom_f32_to_f16(f) != h)
      bad++;
  }
  TT_CHECK_EQ(bad, 0);
}

TT_TEST(test_tensors) {
  int64_t shape[3] = {2, 3, 4};
  loom_tensor t;
  TT_REQUIRE_OK(loom_tensor_new(&t, LOOM_F32, 3, shape));
  TT_CHECK_EQ(loom_tensor_numel(&t), 24);
  TT_CHECK_EQ(loom_tensor_bytes(&t), 96);
  TT_CHECK_EQ(t.stride[0], 12);
  TT_CHECK_EQ(t.stride[2], 1);
  TT_CHECK(loom_tensor_is_contiguous(&t));
  int64_t s2[2] = {6, 4};
  loom_tensor r;
  TT_CHECK_OK(loom_tensor_reshape(&t, 2, s2, &r));
  TT_CHECK_EQ(r.shape[0], 6);
  int64_t s3[2] = {5, 5};
  TT_CHECK_EQ(loom_tensor_reshape(&t, 2, s3, &r), LOOM_ERR_INVALID_ARG);
  loom_tensor sl;
  TT_CHECK_OK(loom_tensor_slice0(&t, 1, 1, &sl));
  TT_CHECK((float *)sl.data == (float *)t.data + 12);
  TT_CHECK_EQ(loom_tensor_slice0(&t, 1, 2, &sl), LOOM_ERR_INVALID_ARG);
  int64_t neg[1] = {-1};
  loom_tensor bad;
  TT_CHECK_EQ(loom_tensor_new(&bad, LOOM_F32, 1, neg), LOOM_ERR_INVALID_ARG);
  loom_tensor_free(&t);
  loom_tensor_free(&t);
}

TT_TEST(test_arena) {
  loom_arena *a;
  TT_REQUIRE_OK(loom_arena_new(&a, 1000));
  void *p = loom_arena_alloc(a, 10);
  void *q = loom_arena_alloc(a, 100);
  TT_CHECK(p && q && ((uintptr_t)q & 63) == 0);
  TT_CHECK_EQ(loom_arena_used(a), 64 + 128);
  TT_CHECK(loom_arena_alloc(a, 5000) == NULL);
  loom_arena_reset(a);
  TT_CHECK_EQ(loom_arena_used(a), 0);
  loom_arena_free(a);
  loom_arena_free(NULL);
}

/* Shapes whose element count or byte size overflows are refused, never
 * allocated short; numel and bytes say so instead of wrapping. */
TT_TEST(test_tensor_size_overflow) {
  loom_tensor t;
  const int64_t big[][2] = {
      {(int64_t)1 << 31, (int64_t)1 << 31}, /* 2^62 f32: 2^64 bytes */
      {(int64_t)1 << 62, 8},                /* 2^65 elements */
      {INT64_MAX, 2},
      {(int64_t)1 << 61, 1}, /* 2^63 bytes of f32 */
  };
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
    memset(&t, 0, sizeof t);
    TT_CHECK_EQ(loom_tensor_new(&t, LOOM_F32, 2, big[i]), LOOM_ERR_INVALID_ARG);
    TT_CHECK_HAS(loom_last_error(), "too large");
    TT_CHECK(t.data == NULL);
  }
  loom_tensor v = loom_tensor_view(NULL, LOOM_F32, 2, big[1]);
  TT_CHECK_EQ(loom_tensor_numel(&v), -1);
  TT_CHECK(loom_tensor_bytes(&v) == SIZE_MAX);
  v = loom_tensor_view(NULL, LOOM_F32, 2, big[3]);
  TT_CHECK_EQ(loom_tensor_numel(&v), (int64_t)1 << 61);
  TT_CHECK(loom_tensor_bytes(&v) == SIZE_MAX);
  /* a zero dimension makes the product 0 whatever the others */
  const int64_t zero[3] = {0, INT64_MAX, INT64_MAX};
  v = loom_tensor_view(NULL, LOOM_F32, 3, zero);
  TT_CHECK_EQ(loom_tensor_numel(&v), 0);
  TT_CHECK_OK(loom_tensor_new(&t, LOOM_F32, 3, zero));
  loom_tensor_free(&t);
  /* a reshape to an overflowing shape is refused too */
  int64_t one[1] = {4};
  TT_REQUIRE_OK(loom_tensor_new(&t, LOOM_F32, 1, one));
  loom_tensor r;
  TT_CHECK_EQ(loom_tensor_reshape(&t, 2, big[1], &r), LOOM_ERR_INVALID_ARG);
  loom_tensor_free(&t);
}

/* A capacity that rounds past SIZE_MAX is refused, not made 0. */
TT_TEST(test_arena_capacity_overflow) {
  const size_t caps[] = {SIZE_MAX, SIZE_MAX - 62, SIZE_MAX - 63};
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
    loom_arena *a = (loom_arena *)1;
    TT_CHECK_EQ(loom_arena_new(&a, caps[i]), LOOM_ERR_NOMEM);
    TT_CHECK(a == NULL);
  }
}

TT_TEST(test_philox_known_answers) {
  /* Known-answer vectors of Philox4x32-10 from the Random123 distribution. */
  uint32_t out[4];
  uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
  loom_philox4x32(c0, k0, out);
  TT_CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du &&
           out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u);
  uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  uint32_t k1[2] = {0xffffffffu, 0xffffffffu};
  loom_philox4x32(c1, k1, out);
  TT_CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu &&
           out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu);
  uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  uint32_t k2[2] = {0xa4093822u, 0x299f31d0u};
  loom_philox4x32(c2, k2, out);
  TT_CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu &&
           out[2] == 0x5001e420u && out[3] == 0x24126ea1u);
}

/* A fill gives the values of the draws made one by one, whatever the
 * thread count, from any counter, and leaves r where they would. */
TT_TEST(test_rng_fill_threads) {
  const size_t n = 3 * 65536 + 123; /* chunks, and a tail */
  float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
  TT_REQUIRE(want && got);
  for (int normal = 0; normal < 2; normal++) {
    loom_rng one = loom_rng_init(9, 3);
    loom_rng_seek(&one, 5); /* a fill from inside a Philox block */
    for (size_t i = 0; i < n; i++)
      want[i] = normal ? 0.5f + 2.0f * loom_rng_normal(&one)
                       : -1.0f + 3.0f * loom_rng_uniform(&one);
    const uint32_t next = loom_rng_u32(&one);
    for (int t = 1; t <= 3; t++) {
      loom_set_threads(t);
      loom_rng r = loom_rng_init(9, 3);
      loom_rng_seek(&r, 5);
      memset(got, 0, n * sizeof(float));
      if (normal)
        loom_rng_fill_normal(&r, got, n, 0.5f, 2.0f);
      else
        loom_rng_fill_uniform(&r, got, n, -1.0f, 2.0f);
      TT_CHECK(memcmp(want, got, n * sizeof(float)) == 0);
      TT_CHECK_EQ(loom_rng_u32(&r), next);
    }
  }
  loom_set_threads(0);
  free(want);
  free(got);
}

TT_TEST(test_rng_streams) {
  loom_rng a = loom_rng_init(42, 7), b = loom_rng_init(42, 7);
  for (int i = 0; i < 10; i++)
    TT_CHECK(loom_rng_u32(&a) == loom_rng_u32(&b));
  /* Seeking reaches the same value as drawing. */
  loom_rng c = loom_rng_init(42, 7);
  loom_rng_seek(&c, 5);
  loom_rng d = loom_rng_init(42, 7);
  for (int i = 0; i < 5; i++)
    loom_rng_u32(&d);
  TT_CHECK(loom_rng_u32(&c) == loom_rng_u32(&d));
  /* The block cache follows a changed seed or stream (checkpoints restore
   * the fields directly). */
  loom_rng h = loom_rng_init(42, 7);
  loom_rng_u32(&h);
  h.seed = 43;
  loom_rng h2 = loom_rng_init(43, 7);
  loom_rng_seek(&h2, 1);
  TT_CHECK(loom_rng_u32(&h) == loom_rng_u32(&h2));
  loom_rng z = {42, 7, 5, 0, 0, 0, {0, 0, 0, 0}}; /* a zeroed cache */
  loom_rng zr = loom_rng_init(42, 7);
  loom_rng_seek(&zr, 5);
  TT_CHECK(loom_rng_u32(&z) == loom_rng_u32(&zr));
  /* Another stream differs. */
  loom_rng e = loom_rng_init(42, 8), f = loom_rng_init(42, 7);
  TT_CHECK(loom_rng_u32(&e) != loom_rng_u32(&f));
  /* Moments of uniform and normal. */
  loom_rng g = loom_rng_init(1, 0);
  double s = 0, s2 = 0, n = 200000;
  for (int i = 0; i < n; i++) {
    double x = loom_rng_normal(&g);
    s += x;
    s2 += x * x;
  }
  TT_CHECK_NEAR(s / n, 0.0, 0.01);
  TT_CHECK_NEAR(s2 / n, 1.0, 0.02);
  double u = 0;
  for (int i = 0; i < n; i++) {
    float x = loom_rng_uniform(&g);
    TT_CHECK(x >= 0.0f && x < 1.0f);
    u += x;
  }
  TT_CHECK_NEAR(u / n, 0.5, 0.005);
  int counts[7] = {0};
  for (int i = 0; i < 70000; i++)
    counts[loom_rng_below(&g, 7)]++;
  for (int i = 0; i < 7; i++)
    TT_CHECK(counts[i] > 9500 && counts[i] < 10500);
  TT_CHECK(loom_rng_stream_id(1, 2, 3) != loom_rng_stream_id(1, 3, 2));
}

TT_TEST(test_crc32c_and_hash) {
  /* Standard check value of CRC-32C. */
  TT_CHECK(loom_crc32c(0, "123456789", 9) == 0xe3069283u);
  uint32_t part = loom_crc32c(0, "1234", 4);
  TT_CHECK(loom_crc32c(part, "56789", 5) == 0xe3069283u);
  TT_CHECK(loom_crc32c(0, "", 0) == 0);
  /* Long and odd-sized buffers against a bit-at-a-time reference. */
  unsigned char buf[1027];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = (unsigned char)(i * 131 + 7);
  for (size_t len = 0; len <= sizeof buf; len += 57) {
    uint32_t ref = 0xffffffffu;
    for (size_t i = 0; i < len; i++) {
      ref ^= buf[i];
      for (int k = 0; k < 8; k++)
        ref = (ref & 1) ? (ref >> 1) ^ 0x82F63B78u : ref >> 1;
    }
    TT_CHECK(loom_crc32c(0, buf, len) == ~ref);
  }
  TT_CHECK(loom_hash64(LOOM_HASH64_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
}

TT_TEST(test_threads_and_time) {
  TT_CHECK(loom_cores() >= 1);
  TT_CHECK(loom_threads() >= 1);
  loom_set_threads(1);
  TT_CHECK_EQ(loom_threads(), 1);
  double t0 = loom_time_now();
  TT_CHECK(loom_time_now() >= t0);
  TT_CHECK(loom_time_wall() > 1.6e9);
}

/* An enum's name table: the index, the names listed when unknown, NULL
 * name or out never dereferenced. */
TT_TEST(test_name_parse) {
  static const char *const names[] = {"drop", "pad", "partial"};
  int i = -1;
  TT_CHECK_OK(loom_name_parse("pad", names, 3, "tail rule", &i));
  TT_CHECK_EQ(i, 1);
  TT_CHECK_OK(loom_name_parse("partial", names, 3, "tail rule", NULL));
  TT_CHECK_EQ(loom_name_parse("Pad", names, 3, "tail rule", &i),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_last_error(),
               "unknown tail rule 'Pad' (expected drop, pad or partial)");
  TT_CHECK_EQ(i, 1);
  TT_CHECK_EQ(loom_name_parse(NULL, names, 3, "tail rule", &i),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_last_error(),
               "unknown tail rule '(null)' (expected drop, pad or partial)");
  TT_CHECK_EQ(loom_name_parse("x", names, 1, NULL, &i), LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_last_error(), "unknown name 'x' (expected drop)");
}

/* Strict integers: garbage, trailing text and overflow fail and leave the
 * output alone; atoi would have read each of them as a number. */
TT_TEST(test_parse_integers) {
  int v = 7;
  int64_t w = 7;
  TT_CHECK(loom_parse_int("42", &v) && v == 42);
  TT_CHECK(loom_parse_int("-3", &v) && v == -3);
  v = 7;
  TT_CHECK(!loom_parse_int("", &v));
  TT_CHECK(!loom_parse_int("abc", &v));
  TT_CHECK(!loom_parse_int("12x", &v));
  TT_CHECK(!loom_parse_int("2147483648", &v));
  TT_CHECK(!loom_parse_int(NULL, &v));
  TT_CHECK_EQ(v, 7);
  TT_CHECK(loom_parse_i64("9223372036854775807", &w) && w == INT64_MAX);
  TT_CHECK(!loom_parse_i64("9223372036854775808", &w));
  const char *end = NULL;
  TT_CHECK(loom_parse_i64_at(" 12 34", &end, &w) && w == 12);
  TT_CHECK(loom_parse_i64_at(end, &end, &w) && w == 34 && *end == '\0');
  TT_CHECK(!loom_parse_i64_at(end, &end, &w));
}

/* Reserved memory: zero until written, given back by loom_vmem_release
 * (partial pages cleared), counted by loom_vmem_resident; large buffers on
 * 2 MiB boundaries (huge pages where the system gives them). */
TT_TEST(test_vmem) {
  const size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  size_t sizes[2] = {5 * ps + 100, LOOM_VMEM_HUGE_MIN + 3 * ps + 100};
  for (int k = 0; k < 2; k++) {
    size_t n = sizes[k];
    unsigned char *p = loom_vmem_new(n);
    TT_CHECK(p != NULL);
    if (!p)
      return;
    if (k == 1)
      TT_CHECK((uintptr_t)p % ((size_t)2 << 20) == 0);
    TT_CHECK(loom_vmem_resident(p, 0, n) == 0);
    TT_CHECK(p[0] == 0 && p[n - 1] == 0);
    memset(p, 7, n);
    TT_CHECK(loom_vmem_resident(p, 0, n) >= n - ps);
    /* [ps/2, n - ps/2): the whole pages inside go back, the half pages at
     * either end are cleared, the bytes outside kept. */
    loom_vmem_release(p, ps / 2, n - ps / 2);
    TT_CHECK(p[ps / 2 - 1] == 7 && p[ps / 2] == 0);
    TT_CHECK(p[n - ps / 2 - 1] == 0 && p[n - ps / 2] == 7);
    size_t after = loom_vmem_resident(p, ps, n - 2 * ps);
    TT_CHECK(after == 0);
    size_t nz = 0;
    for (size_t i = ps / 2; i < n - ps / 2; i += 61)
      nz += p[i] != 0;
    TT_CHECK(nz == 0);
    memset(p + ps, 1, ps); /* a page given back can be written again */
    TT_CHECK(p[ps] == 1 && loom_vmem_resident(p, ps, 2 * ps) == ps);
    loom_vmem_free(p, n);
  }
}

/* Memory by category: counts, peaks, names; a bad category does nothing. */
TT_TEST(test_mem_categories) {
  size_t now0, peak0, now, peak;
  loom_mem_get(LOOM_MEM_COMM, &now0, &peak0);
  loom_mem_add(LOOM_MEM_COMM, 1000);
  loom_mem_add(LOOM_MEM_COMM, 500);
  loom_mem_sub(LOOM_MEM_COMM, 1000);
  loom_mem_get(LOOM_MEM_COMM, &now, &peak);
  TT_CHECK_EQ(now, now0 + 500);
  TT_CHECK(peak >= now0 + 1500);
  loom_mem_reset_peaks();
  loom_mem_get(LOOM_MEM_COMM, NULL, &peak);
  TT_CHECK_EQ(peak, now0 + 500);
  loom_mem_sub(LOOM_MEM_COMM, 500);
  size_t data0;
  loom_mem_get(LOOM_MEM_DATA, &data0, NULL);
  loom_mem_add(LOOM_MEM_CAT_COUNT, 7); /* ignored */
  loom_mem_get(LOOM_MEM_CAT_COUNT, &now, &peak);
  TT_CHECK(now == 0 && peak == 0);
  loom_mem_get(LOOM_MEM_DATA, &now, NULL);
  TT_CHECK_EQ(now, data0);
  TT_CHECK_STR(loom_mem_cat_name(LOOM_MEM_COMM), "comm");
  TT_CHECK_STR(loom_mem_cat_name(LOOM_MEM_DATA), "data");
  TT_CHECK_STR(loom_mem_cat_name(LOOM_MEM_CAT_COUNT), "?");
}

/* The log's file sink: info reaches the file even when the console shows
 * only warnings; every line is time-stamped; NULL stops it. */
TT_TEST(test_log_file) {
  FILE *f = tmpfile();
  TT_REQUIRE(f != NULL);
  loom_log_level old = loom_log_get_level();
  loom_log_set_level(LOOM_LOG_WARN);
  loom_log_set_file(f, true);
  LOOM_INFO("an info line %d", 1);
  LOOM_DEBUG("a debug line");
  loom_log_file("only in the file");
  loom_log_set_file(NULL, false);
  LOOM_WARN("after the file");
  loom_log_set_level(old);
  rewind(f);
  char line[512];
  int n = 0;
  bool info = false, only = false, debug = false, after = false, stamped = true;
  while (fgets(line, sizeof line, f)) {
    n++;
    info |= strstr(line, "an info line 1") != NULL;
    only |= strstr(line, "only in the file") != NULL;
    debug |= strstr(line, "a debug line") != NULL;
    after |= strstr(line, "after the file") != NULL;
    /* 2026-11-26T12:08:48.756Z */
    stamped &= strlen(line) > 25 && line[4] == '-' && line[10] == 'T' &&
               line[19] == '.' && line[23] == 'Z' && line[24] == ' ';
  }
  fclose(f);
  TT_CHECK_EQ(n, 2);
  TT_CHECK(info && only && !debug && !after && stamped);
}

int main(void) {
  TT_RUN(test_mem_categories);
  TT_RUN(test_log_file);
  TT_RUN(test_parse_integers);
  TT_RUN(test_name_parse);
  TT_RUN(test_status_and_errors);
  TT_RUN(test_alloc_hook);
  TT_RUN(test_vmem);
  TT_RUN(test_dtypes);
  TT_RUN(test_tensors);
  TT_RUN(test_arena);
  TT_RUN(test_tensor_size_overflow);
  TT_RUN(test_arena_capacity_overflow);
  TT_RUN(test_philox_known_answers);
  TT_RUN(test_rng_streams);
  TT_RUN(test_rng_fill_threads);
  TT_RUN(test_crc32c_and_hash);
  TT_RUN(test_threads_and_time);
  return tt_finish();
}
