/* The timeline trace: Chrome/Perfetto trace events (JSON array format), one
 * file per rank, one event per line so that loom report --trace can merge
 * the ranks line by line. Events go to a buffer under a mutex (a few dozen
 * a step) and reach the file when it fills, at loom_trace_flush and at
 * loom_trace_stop; a file cut short by a crash still loads (the closing
 * bracket of the array is optional in that format). */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/obs.h"

enum { BUF_CAP = 256 * 1024, STACK_MAX = 32, NAME_MAX_ = 96 };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_on;
static FILE *g_f;
static char g_path[1024];
static char *g_buf;
static size_t g_len;
static int g_rank;
static double g_t0; /* loom_time_now() at start: ts 0 */
static atomic_int g_next_tid;
static uint64_t g_events, g_dropped;

static _Thread_local int t_tid; /* 0: not yet numbered */
static _Thread_local int t_depth;
static _Thread_local struct {
  char name[NAME_MAX_];
  double t0;
} t_stack[STACK_MAX];

static int my_tid(void) {
  if (t_tid == 0)
    t_tid = atomic_fetch_add(&g_next_tid, 1) + 1;
  return t_tid;
}

/* Writes what the buffer holds (under g_mu). */
static void flush_locked(void) {
  if (g_f && g_len) {
    if (fwrite(g_buf, 1, g_len, g_f) != g_len)
      g_dropped++;
    fflush(g_f);
  }
  g_len = 0;
}

/* Appends one line (an event object and its comma) under g_mu. */
static void put_line(const char *line, size_t n) {
  pthread_mutex_lock(&g_mu);
  if (g_f) {
    if (g_len + n > BUF_CAP)
      flush_locked();
    if (n <= BUF_CAP) {
      memcpy(g_buf + g_len, line, n);
      g_len += n;
      g_events++;
    }
  }
  pthread_mutex_unlock(&g_mu);
}

/* name as a JSON string body: quotes, backslashes and control characters
 * escaped, cut to fit. */
static void json_escape(char *dst, size_t cap, const char *s) {
  size_t k = 0;
  for (; s && *s && k + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      dst[k++] = '\\';
      dst[k++] = (char)c;
    } else if (c < 0x20) {
      k += (size_t)snprintf(dst + k, cap - k, "\\u%04x", c);
    } else {
      dst[k++] = (char)c;
    }
  }
  dst[k] = '\0';
}

static double us(double t) { return (t - g_t0) * 1e6; }

/* LOOM_TRACE_EMULATE_HOSTS=SKEW (tests): rank K names its host
 * "<host>/rank<K>" and reads the wall clock SKEW*K seconds ahead, as
 * ranks on hosts whose clocks disagree would. */
static double emulated_skew(int rank) {
  const char *e = getenv("LOOM_TRACE_EMULATE_HOSTS");
  return e && *e ? strtod(e, NULL) * rank : 0;
}

double loom_trace_wall(void) {
  return loom_time_wall() + emulated_skew(g_rank);
}

void loom_trace_clock_sync(double offset_s, double spread_s, int rounds) {
  if (!loom_trace_enabled())
    return;
  char line[256];
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"M\",\"name\":\"loom_clock_sync\",\"pid\":%d,"
                   "\"tid\":0,\"args\":{\"offset_s\":%.9f,\"spread_s\":%.9f,"
                   "\"rounds\":%d}},\n",
                   g_rank, offset_s, spread_s, rounds);
  if (n > 0 && (size_t)n < sizeof line)
    put_line(line, (size_t)n);
  loom_trace_flush();
}

bool loom_trace_enabled(void) { return atomic_load(&g_on); }

const char *loom_trace_path(void) { return g_path; }

loom_status loom_trace_start(const char *path, int rank) {
  if (!path || !*path)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_trace_start: no path");
  pthread_mutex_lock(&g_mu);
  if (g_f) {
    pthread_mutex_unlock(&g_mu);
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trace_start: a trace is already being written "
                      "(%s)",
                      g_path);
  }
  loom_status s = LOOM_OK;
  g_buf = loom_malloc(BUF_CAP);
  if (!g_buf)
    s = LOOM_ERR_NOMEM;
  /* A new file, never through a link planted in its place. */
  if (s == LOOM_OK)
    s = loom_fs_open_append(path, true, &g_f);
  if (s != LOOM_OK) {
    loom_free(g_buf);
    g_buf = NULL;
    pthread_mutex_unlock(&g_mu);
    return loom_error_context(s, "trace: opening %s", path);
  }
  snprintf(g_path, sizeof g_path, "%s", path);
  g_rank = rank;
  g_t0 = loom_time_now();
  g_len = 0;
  g_events = g_dropped = 0;
  fputs("[\n", g_f);
  /* The clock: ts 0 is this moment of the host's monotonic clock (and of
   * the wall clock), which loom report --trace uses to put the ranks on
   * one time line: by the monotonic clock on one host, by the wall clock
   * across hosts. */
  char host[256] = "", ehost[300];
  gethostname(host, sizeof host - 1);
  if (getenv("LOOM_TRACE_EMULATE_HOSTS")) {
    size_t hl = strlen(host);
    snprintf(host + hl, sizeof host - hl, "/rank%d", rank);
  }
  json_escape(ehost, sizeof ehost, host);
  fprintf(g_f,
          "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"name\":\"rank %d\"}},\n"
          "{\"ph\":\"M\",\"name\":\"loom_clock\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"monotonic_s\":%.9f,\"wall_s\":%.6f,\"host\":\"%s\"}},"
          "\n",
          rank, rank, rank, g_t0, loom_trace_wall(), ehost);
  atomic_store(&g_on, true);
  pthread_mutex_unlock(&g_mu);
  loom_trace_thread_name("main");
  return LOOM_OK;
}

void loom_trace_flush(void) {
  pthread_mutex_lock(&g_mu);
  flush_locked();
  pthread_mutex_unlock(&g_mu);
}

void loom_trace_stop(uint64_t *events) {
  atomic_store(&g_on, false);
  pthread_mutex_lock(&g_mu);
  if (g_f) {
    flush_locked();
    /* The last event ends with a comma: close the array with an empty
     * metadata object so that strict JSON readers load the file too. */
    fprintf(g_f,
            "{\"ph\":\"M\",\"name\":\"loom_end\",\"pid\":%d,\"tid\":0,"
            "\"args\":{}}\n]\n",
            g_rank);
    fclose(g_f);
    g_f = NULL;
  }
  if (events)
    *events = g_events;
  loom_free(g_buf);
  g_buf = NULL;
  g_len = 0;
  pthread_mutex_unlock(&g_mu);
}

void loom_trace_thread_name(const char *name) {
  if (!loom_trace_enabled())
    return;
  char esc[NAME_MAX_], line[256];
  json_escape(esc, sizeof esc, name);
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,"
                   "\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n",
                   g_rank, my_tid(), esc);
  if (n > 0 && (size_t)n < sizeof line)
    put_line(line, (size_t)n);
}

void loom_trace_span(const char *cat, const char *name, double t0, double t1,
                     const char *args) {
  if (!loom_trace_enabled())
    return;
  char ename[NAME_MAX_], ecat[32], line[512];
  json_escape(ename, sizeof ename, name);
  json_escape(ecat, sizeof ecat, cat ? cat : "loom");
  double dur = t1 > t0 ? (t1 - t0) * 1e6 : 0;
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"%s\",\"pid\":%d,"
                   "\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f%s%s%s},\n",
                   ecat, ename, g_rank, my_tid(), us(t0), dur,
                   args && *args ? ",\"args\":{" : "", args ? args : "",
                   args && *args ? "}" : "");
  if (n > 0 && (size_t)n < sizeof line)
    put_line(line, (size_t)n);
}

void loom_trace_counter(const char *name, double t, const char *args) {
  if (!loom_trace_enabled() || !args || !*args)
    return;
  char ename[NAME_MAX_], line[512];
  json_escape(ename, sizeof ename, name);
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"C\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,"
                   "\"ts\":%.3f,\"args\":{%s}},\n",
                   ename, g_rank, my_tid(), us(t), args);
  if (n > 0 && (size_t)n < sizeof line)
    put_line(line, (size_t)n);
}

void loom_trace_begin(const char *name) {
  if (!loom_trace_enabled())
    return;
  if (t_depth < STACK_MAX) {
    snprintf(t_stack[t_depth].name, sizeof t_stack[t_depth].name, "%s",
             name ? name : "");
    t_stack[t_depth].t0 = loom_time_now();
  }
  t_depth++;
}

void loom_trace_end(void) {
  if (t_depth == 0)
    return; /* an end without its begin */
  t_depth--;
  if (t_depth < STACK_MAX && loom_trace_enabled())
    loom_trace_span("user", t_stack[t_depth].name, t_stack[t_depth].t0,
                    loom_time_now(), NULL);
}
