/* Tests of the obs layer: TensorBoard event files read back by a decoder
 * written here from the format's description (TFRecord framing, protobuf
 * wire format), and metric lines reaching both sinks. The real reader,
 * TensorBoard's own, is tests/obs/tensorboard.sh. */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/obs.h"
#include "tt.h"

/* ------------------------------------------------------ a small reader */

typedef struct {
  double wall;
  int64_t step;
  char version[32];
  int n;
  char tags[16][48];
  float values[16];
} event;

static uint64_t varint(const unsigned char **p, const unsigned char *end) {
  uint64_t v = 0;
  for (int s = 0; *p < end && s < 64; s += 7) {
    unsigned char b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80))
      break;
  }
  return v;
}

static uint64_t le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* One Summary.Value. */
static bool parse_value(const unsigned char *p, const unsigned char *end,
                        event *e) {
  if (e->n >= 16)
    return false;
  while (p < end) {
    uint64_t k = varint(&p, end);
    if (k == (1 << 3 | 2)) {
      uint64_t n = varint(&p, end);
      if (n >= sizeof e->tags[0] || p + n > end)
        return false;
      memcpy(e->tags[e->n], p, n);
      e->tags[e->n][n] = '\0';
      p += n;
    } else if (k == (2 << 3 | 5)) {
      uint32_t u = (uint32_t)le(p, 4);
      memcpy(&e->values[e->n], &u, 4);
      p += 4;
    } else {
      return false;
    }
  }
  e->n++;
  return true;
}

static bool parse_event(const unsigned char *p, const unsigned char *end,
                        event *e) {
  memset(e, 0, sizeof *e);
  while (p < end) {
    uint64_t k = varint(&p, end);
    if (k == (1 << 3 | 1)) {
      uint64_t u = le(p, 8);
      memcpy(&e->wall, &u, 8);
      p += 8;
    } else if (k == (2 << 3 | 0)) {
      e->step = (int64_t)varint(&p, end);
    } else if (k == (3 << 3 | 2)) {
      uint64_t n = varint(&p, end);
      if (n >= sizeof e->version)
        return false;
      memcpy(e->version, p, n);
      p += n;
    } else if (k == (5 << 3 | 2)) {
      uint64_t n = varint(&p, end);
      const unsigned char *s = p, *se = p + n;
      if (se > end)
        return false;
      while (s < se) {
        if (varint(&s, se) != (1 << 3 | 2))
          return false;
        uint64_t m = varint(&s, se);
        if (!parse_value(s, s + m, e))
          return false;
        s += m;
      }
      p = se;
    } else {
      return false;
    }
  }
  return p == end;
}

/* Reads every record of the file into ev (at most max); -1 on a bad
 * frame or checksum. */
static int read_events(const char *path, event *ev, int max) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  int n = 0;
  unsigned char head[12];
  while (fread(head, 1, 12, f) == 12) {
    uint64_t len = le(head, 8);
    if ((uint32_t)le(head + 8, 4) != loom_tb_masked_crc(head, 8) ||
        len > 65536 || n >= max) {
      n = -1;
      break;
    }
    unsigned char *b = malloc(len + 4);
    if (!b || fread(b, 1, len + 4, f) != len + 4 ||
        (uint32_t)le(b + len, 4) != loom_tb_masked_crc(b, len) ||
        !parse_event(b, b + len, &ev[n])) {
      free(b);
      n = -1;
      break;
    }
    free(b);
    n++;
  }
  fclose(f);
  return n;
}

static void tmpdir(char *buf, size_t n) {
  snprintf(buf, n, "/tmp/loom_obs_XXXXXX");
  if (!mkdtemp(buf))
    buf[0] = '\0';
}

/* ---------------------------------------------------------------- tests */

TT_TEST(test_masked_crc) {
  /* CRC32C("123456789") = 0xe3069283; masked: rotated right 15, plus
   * 0xa282ead8. */
  uint32_t c = 0xe3069283u;
  uint32_t want = ((c >> 15) | (c << 17)) + 0xa282ead8u;
  TT_CHECK(loom_crc32c(0, "123456789", 9) == c);
  TT_CHECK(loom_tb_masked_crc("123456789", 9) == want);
}

TT_TEST(test_event_file) {
  char dir[64];
  tmpdir(dir, sizeof dir);
  TT_REQUIRE(dir[0]);
  loom_tb *w = NULL;
  TT_CHECK_OK(loom_tb_open(&w, dir));
  TT_REQUIRE(w != NULL);
  TT_CHECK(strstr(loom_tb_path(w), "/events.out.tfevents.") != NULL);
  const char *tags[3] = {"loss", "a_rather_long_tag_name_for_the_length", "x"};
  float v1[3] = {2.5f, -1e-7f, 1e30f};
  TT_CHECK_OK(loom_tb_scalars(w, 7, 1700000000.25, tags, v1, 3));
  float v2[1] = {0.125f};
  TT_CHECK_OK(loom_tb_scalars(w, 300000, 1700000001.5, tags, v2, 1));
  char path[1024];
  snprintf(path, sizeof path, "%s", loom_tb_path(w));
  loom_tb_close(w);
  event ev[4];
  int n = read_events(path, ev, 4);
  TT_CHECK(n == 3);
  if (n == 3) {
    TT_CHECK(strcmp(ev[0].version, "brain.Event:2") == 0 && ev[0].n == 0);
    TT_CHECK(ev[1].step == 7 && ev[1].wall == 1700000000.25 && ev[1].n == 3);
    for (int i = 0; i < 3 && ev[1].n == 3; i++)
      TT_CHECK(strcmp(ev[1].tags[i], tags[i]) == 0 && ev[1].values[i] == v1[i]);
    TT_CHECK(ev[2].step == 300000 && ev[2].n == 1 && ev[2].values[0] == 0.125f);
  }
  unlink(path);
  rmdir(dir);
}

/* A metrics line reaches metrics.jsonl and, but for its coordinates (step,
 * epoch, time) and its text, the event file. */
TT_TEST(test_metrics_both_sinks) {
  char dir[64];
  tmpdir(dir, sizeof dir);
  TT_REQUIRE(dir[0]);
  loom_metrics_opts o = loom_metrics_opts_default();
  o.tensorboard = true;
  loom_metrics *m = NULL;
  TT_CHECK_OK(loom_metrics_open_opts(&m, dir, &o));
  TT_REQUIRE(m != NULL);
  loom_metrics_begin(m);
  loom_metrics_int(m, "step", 12);
  loom_metrics_int(m, "epoch", 1);
  loom_metrics_num(m, "time", 1700000002.0);
  loom_metrics_num(m, "loss", 3.25);
  loom_metrics_int(m, "tokens", 4096);
  loom_metrics_str(m, "note", "text is not a scalar");
  TT_CHECK_OK(loom_metrics_end(m));
  char tb[1024], jl[1024];
  snprintf(tb, sizeof tb, "%s", loom_metrics_tb_path(m));
  snprintf(jl, sizeof jl, "%s", loom_metrics_path(m));
  loom_metrics_close(m);
  event ev[4];
  int n = read_events(tb, ev, 4);
  TT_CHECK(n == 2);
  if (n == 2) {
    TT_CHECK(ev[1].step == 12 && ev[1].wall == 1700000002.0 && ev[1].n == 2);
    TT_CHECK(strcmp(ev[1].tags[0], "loss") == 0 && ev[1].values[0] == 3.25f);
    TT_CHECK(strcmp(ev[1].tags[1], "tokens") == 0 &&
             ev[1].values[1] == 4096.0f);
  }
  FILE *f = fopen(jl, "r");
  char line[512] = "";
  TT_CHECK(f && fgets(line, sizeof line, f));
  if (f)
    fclose(f);
  TT_CHECK(strstr(line, "\"loss\":3.25") != NULL);
  unlink(tb);
  unlink(jl);
  char sub[1100];
  snprintf(sub, sizeof sub, "%s/tb", dir);
  rmdir(sub);
  rmdir(dir);
}

/* Misuse of a metrics line: NULL handles and keys are errors, never a
 * crash (they dereferenced NULL), and a spoilt line is not written (a line
 * without begin wrote '"step":1}' to metrics.jsonl). */
TT_TEST(test_metrics_misuse) {
  loom_metrics_begin(NULL);
  loom_metrics_int(NULL, "step", 1);
  loom_metrics_num(NULL, "loss", 1);
  loom_metrics_str(NULL, "k", "v");
  loom_metrics_nums(NULL, "a", NULL, 2);
  TT_CHECK_EQ(loom_metrics_end(NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strcmp(loom_metrics_path(NULL), "") == 0);
  TT_CHECK(strcmp(loom_metrics_tb_path(NULL), "") == 0);
  TT_CHECK_EQ(loom_metrics_open(NULL, "/nonexistent", false),
              LOOM_ERR_INVALID_ARG);
  loom_metrics *m = (loom_metrics *)1;
  TT_CHECK_EQ(loom_metrics_open(&m, NULL, false), LOOM_ERR_INVALID_ARG);
  TT_CHECK(m == NULL);
  TT_CHECK_EQ(loom_tb_open(NULL, NULL), LOOM_ERR_INVALID_ARG);
  char dir[64];
  tmpdir(dir, sizeof dir);
  TT_REQUIRE(dir[0]);
  TT_CHECK_OK(loom_metrics_open(&m, dir, false));
  TT_REQUIRE(m != NULL);
  loom_metrics_int(m, "step", 1); /* no begin */
  TT_CHECK_EQ(loom_metrics_end(m), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "loom_metrics_begin") != NULL);
  loom_metrics_begin(m);
  loom_metrics_int(m, NULL, 1);
  TT_CHECK_EQ(loom_metrics_end(m), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "NULL key") != NULL);
  loom_metrics_begin(m);
  loom_metrics_nums(m, "a", NULL, 3);
  TT_CHECK_EQ(loom_metrics_end(m), LOOM_ERR_INVALID_ARG);
  loom_metrics_begin(m);
  loom_metrics_int(m, "step", 2);
  loom_metrics_str(m, "note", NULL);
  loom_metrics_num(m, "a\"b", 1.5);
  TT_CHECK_OK(loom_metrics_end(m));
  char jl[1024];
  snprintf(jl, sizeof jl, "%s", loom_metrics_path(m));
  loom_metrics_close(m);
  FILE *f = fopen(jl, "r");
  char text[512] = "";
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = '\0';
  if (f)
    fclose(f);
  TT_CHECK(strcmp(text, "{\"step\":2,\"note\":null,\"a\\\"b\":1.5}\n") == 0);
  if (strcmp(text, "{\"step\":2,\"note\":null,\"a\\\"b\":1.5}\n") != 0)
    fprintf(stderr, "  metrics.jsonl: '%s'\n", text);
  unlink(jl);
  rmdir(dir);
}

/* The trace's C API: user regions (nested, an end without a begin), spans
 * from another thread on a track of its own, counters; off after stop; a
 * second start while one is open refused; the file loads through
 * loom_trace_merge. */
static void *traced_thread(void *arg) {
  (void)arg;
  loom_trace_thread_name("worker");
  for (int i = 0; i < 1000; i++) { /* 3 threads: past the 256 KiB buffer */
    double t = loom_time_now();
    loom_trace_span("test", "from \"worker\"", t, t + 1e-3, "\"k\":1");
  }
  return NULL;
}

static int count_in(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  char line[1024];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    n += strstr(line, needle) != NULL;
  if (f)
    fclose(f);
  return n;
}

TT_TEST(test_trace_api) {
  char dir[64], path[128], merged[128];
  tmpdir(dir, sizeof dir);
  TT_REQUIRE(dir[0]);
  snprintf(path, sizeof path, "%s/rank-3.json", dir);
  snprintf(merged, sizeof merged, "%s/all.json", dir);
  TT_CHECK(!loom_trace_enabled());
  loom_trace_begin("ignored"); /* no trace: nothing */
  loom_trace_end();
  TT_REQUIRE_OK(loom_trace_start(path, 3, 4));
  TT_CHECK(loom_trace_enabled());
  TT_CHECK_EQ(loom_trace_start(path, 3, 4), LOOM_ERR_INVALID_ARG);
  loom_trace_end(); /* without a begin: nothing */
  loom_trace_begin("outer");
  loom_trace_begin("inner");
  loom_trace_end();
  loom_trace_end();
  loom_trace_counter("memory", loom_time_now(), "\"a_mb\":1.5");
  pthread_t th[3];
  for (int i = 0; i < 3; i++)
    TT_REQUIRE(pthread_create(&th[i], NULL, traced_thread, NULL) == 0);
  for (int i = 0; i < 10; i++)
    loom_trace_span("test", "main", 0, 1, NULL);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  uint64_t events = 0;
  loom_trace_stop(&events);
  TT_CHECK(!loom_trace_enabled());
  loom_trace_span("test", "after stop", 0, 1, NULL); /* dropped */
  /* main's name, 2 regions, a counter, 10 spans; each worker's name and
   * 1000 spans */
  TT_CHECK_EQ(events, 14 + 3 * 1001);
  TT_CHECK_EQ(count_in(path, "\"cat\":\"user\",\"name\":\"inner\""), 1);
  TT_CHECK_EQ(count_in(path, "\"cat\":\"user\",\"name\":\"outer\""), 1);
  TT_CHECK_EQ(count_in(path, "from \\\"worker\\\""), 3000);
  TT_CHECK_EQ(count_in(path, "after stop"), 0);
  TT_CHECK_EQ(count_in(path, "\"pid\":3"), count_in(path, "\"pid\""));
  loom_trace_merge_info info;
  TT_CHECK_OK(loom_trace_merge(dir, merged, &info));
  TT_CHECK_EQ(info.ranks, 1);
  /* process_name, loom_clock and the others */
  TT_CHECK_EQ(info.events, 16 + 3 * 1001);
  TT_CHECK(info.one_host);
  unlink(path);
  unlink(merged);
  rmdir(dir);
}

/* A window of 2 steps every 5 from step 2 (2, 3, 7, 8): only those steps'
 * spans and counters; a region begun outside the window and ended inside
 * it, one begun inside and ended outside, and a span that began before
 * the window opened are left out, and the stack of regions stays right;
 * markers where it opens and closes; thread names and the header
 * whatever the window; the file merges. Bad windows are refused. */
TT_TEST(test_trace_window) {
  char dir[64], path[128], merged[128];
  tmpdir(dir, sizeof dir);
  TT_REQUIRE(dir[0]);
  snprintf(path, sizeof path, "%s/rank-0.json", dir);
  snprintf(merged, sizeof merged, "%s/all.json", dir);
  loom_trace_opts o = loom_trace_opts_default();
  o.start = 2;
  o.steps = 2;
  o.every = 2; /* not more than steps */
  TT_CHECK_EQ(loom_trace_start_opts(path, 0, 1, &o), LOOM_ERR_INVALID_ARG);
  o.steps = 0; /* every without steps */
  TT_CHECK_EQ(loom_trace_start_opts(path, 0, 1, &o), LOOM_ERR_INVALID_ARG);
  o.every = 0;
  o.start = -1;
  TT_CHECK_EQ(loom_trace_start_opts(path, 0, 1, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK(!loom_trace_is_open());
  o.start = 2;
  o.steps = 2;
  o.every = 5;
  TT_REQUIRE_OK(loom_trace_start_opts(path, 0, 1, &o));
  TT_CHECK(loom_trace_is_open());
  TT_CHECK(!loom_trace_enabled()); /* the window starts at step 2 */
  loom_trace_span("test", "setup", 0, 1, NULL);
  double early = 0;
  for (int k = 0; k < 10; k++) {
    loom_trace_step(k);
    TT_CHECK_EQ(loom_trace_enabled(), k == 2 || k == 3 || k == 7 || k == 8);
    double t = loom_time_now();
    char args[32];
    snprintf(args, sizeof args, "\"step\":%d", k);
    loom_trace_span("test", "step", t, t + 1e-6, args);
    loom_trace_counter("c", t, args);
    if (k == 1) {
      loom_trace_begin("straddle in"); /* outside: not recorded */
      early = loom_time_now();
    }
    if (k == 2) {
      loom_trace_end(); /* closes "straddle in", not "inside" */
      loom_trace_begin("inside");
      loom_trace_span("comm", "began before", early, loom_time_now(), NULL);
    }
    if (k == 3) {
      loom_trace_end(); /* "inside": recorded */
      loom_trace_begin("straddle out");
    }
    if (k == 4)
      loom_trace_end(); /* "straddle out": the window closed */
  }
  loom_trace_thread_name("main again"); /* metadata: outside the window too */
  loom_trace_stop(NULL);
  TT_CHECK(!loom_trace_is_open());
  for (int k = 0; k < 10; k++) {
    char needle[64];
    snprintf(needle, sizeof needle, "\"args\":{\"step\":%d}}", k);
    bool in = k == 2 || k == 3 || k == 7 || k == 8;
    bool edge = k == 2 || k == 4 || k == 7 || k == 9; /* a marker's step */
    /* the span and the counter, and a window's marker */
    TT_CHECK_EQ(count_in(path, needle), (in ? 2 : 0) + edge);
  }
  TT_CHECK_EQ(count_in(path, "\"name\":\"setup\""), 0);
  TT_CHECK_EQ(count_in(path, "\"name\":\"inside\""), 1);
  TT_CHECK_EQ(count_in(path, "straddle"), 0);
  TT_CHECK_EQ(count_in(path, "began before"), 0);
  TT_CHECK_EQ(count_in(path, "\"name\":\"loom_window_open\""), 2);
  TT_CHECK_EQ(count_in(path, "\"name\":\"loom_window_close\""), 2);
  TT_CHECK_EQ(count_in(path, "main again"), 1);
  TT_CHECK_EQ(count_in(path, "\"name\":\"loom_clock\""), 1);
  TT_CHECK_EQ(count_in(path, "\"name\":\"loom_end\""), 1);
  loom_trace_merge_info info;
  TT_CHECK_OK(loom_trace_merge(dir, merged, &info));
  TT_CHECK_EQ(info.ranks, 1);
  TT_CHECK_EQ(info.capped, 0);
  unlink(path);
  unlink(merged);
  rmdir(dir);
}

/* The cap: 3 threads write past an 8 KiB cap; the file ends at or below
 * it with one loom_capped record (its max_bytes), recording off from
 * then on, the closing record written at stop; the merge counts it. */
TT_TEST(test_trace_cap) {
  char dir[64], path[128], merged[128];
  tmpdir(dir, sizeof dir);
  TT_REQUIRE(dir[0]);
  snprintf(path, sizeof path, "%s/rank-0.json", dir);
  snprintf(merged, sizeof merged, "%s/all.json", dir);
  loom_trace_opts o = loom_trace_opts_default();
  o.max_bytes = 8192;
  o.max_name = "the test's cap";
  TT_REQUIRE_OK(loom_trace_start_opts(path, 0, 1, &o));
  loom_trace_step(7);
  pthread_t th[3];
  for (int i = 0; i < 3; i++)
    TT_REQUIRE(pthread_create(&th[i], NULL, traced_thread, NULL) == 0);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  TT_CHECK(loom_trace_capped());
  TT_CHECK(!loom_trace_enabled());
  TT_CHECK(loom_trace_is_open());
  loom_trace_step(8); /* no window reopens a capped trace */
  TT_CHECK(!loom_trace_enabled());
  loom_trace_stop(NULL);
  struct stat sb;
  TT_REQUIRE(stat(path, &sb) == 0);
  TT_CHECK(sb.st_size <= 8192 && sb.st_size > 8192 - 1024);
  TT_CHECK_EQ(count_in(path, "\"name\":\"loom_capped\""), 1);
  TT_CHECK_EQ(count_in(path, "\"max_bytes\":8192,"), 1);
  TT_CHECK_EQ(count_in(path, "\"step\":7,\"raise\":\"the test's cap\""), 1);
  TT_CHECK_EQ(count_in(path, "\"name\":\"loom_end\""), 1);
  loom_trace_merge_info info;
  TT_CHECK_OK(loom_trace_merge(dir, merged, &info));
  TT_CHECK_EQ(info.capped, 1);
  unlink(path);
  unlink(merged);
  rmdir(dir);
}

int main(void) {
  TT_RUN(test_trace_api);
  TT_RUN(test_trace_window);
  TT_RUN(test_trace_cap);
  TT_RUN(test_masked_crc);
  TT_RUN(test_event_file);
  TT_RUN(test_metrics_both_sinks);
  TT_RUN(test_metrics_misuse);
  return tt_finish();
}
