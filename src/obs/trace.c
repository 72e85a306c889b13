/* The timeline trace: Chrome/Perfetto trace events (JSON array format), one
 * file per rank, one event per line so that loom report --trace can merge
 * the ranks line by line. Events go to a buffer under a mutex (a few dozen
 * a step) and reach the file when it fills, at loom_trace_flush and at
 * loom_trace_stop; a file cut short by a crash still loads (the closing
 * bracket of the array is optional in that format). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "loom/obs.h"

enum { BUF_CAP = 256 * 1024, STACK_MAX = 32, NAME_MAX_ = 96 };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_on;
static FILE *g_f;
static char g_path[1024];
static char *g_buf;
static size_t g_len;
static int g_rank, g_world;
static double g_t0; /* loom_time_now() at start: ts 0 */
static atomic_int g_next_tid;
static uint64_t g_events, g_dropped;
static uint64_t g_buffered; /* events in g_buf */
static int g_werr;          /* errno of the first failed write; 0: none */

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

/* Writes what the buffer holds (under g_mu). After a failed write (a full
 * disk) nothing more is written, so the file stays a prefix of the trace
 * (its last line may be cut; loom report --trace says so) and every event
 * after it counts as lost. */
static void flush_locked(void) {
  if (g_f && g_len) {
    if (g_werr || fwrite(g_buf, 1, g_len, g_f) != g_len || fflush(g_f) != 0) {
      if (!g_werr)
        g_werr = errno ? errno : EIO;
      g_dropped += g_buffered;
    }
  }
  g_len = 0;
  g_buffered = 0;
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
      g_buffered++;
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

void loom_trace_clock_sync(double offset_s, double spread_s, int rounds,
                           double attempt) {
  if (!loom_trace_enabled())
    return;
  char line[320];
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"M\",\"name\":\"loom_clock_sync\",\"pid\":%d,"
                   "\"tid\":0,\"args\":{\"offset_s\":%.9f,\"spread_s\":%.9f,"
                   "\"rounds\":%d,\"attempt\":%.6f}},\n",
                   g_rank, offset_s, spread_s, rounds, attempt);
  if (n > 0 && (size_t)n < sizeof line)
    put_line(line, (size_t)n);
  loom_trace_flush();
}

bool loom_trace_enabled(void) { return atomic_load(&g_on); }

const char *loom_trace_path(void) { return g_path; }

/* The previous attempt's trace at path (a regular file, not a link, with
 * no other name) is kept: moved, never copied or followed, to
 * DIR/attempt-STAMP/NAME beside it (STAMP: that attempt's start, UTC), so
 * that a restart or a resume does not truncate the timeline of the attempt
 * before it. A file there that is not a loom trace is left alone and
 * refused. */
static loom_status keep_previous(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_nlink != 1 ||
      sb.st_size == 0)
    return LOOM_OK; /* nothing to keep, or what the open refuses */
  double key;
  if (loom_trace_file_attempt(path, &key, NULL) != LOOM_OK)
    return loom_error(LOOM_ERR_IO,
                      "trace: %s is there and is not a loom trace: left as "
                      "it is (move it away, or trace into another "
                      "directory)",
                      path);
  char dir[1024], sub[1200];
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1,
           slash ? path : ".");
  if (slash == path)
    snprintf(dir, sizeof dir, "/");
  time_t secs = (time_t)key;
  struct tm tm;
  char ymd[32] = "unknown";
  if (gmtime_r(&secs, &tm) && !strftime(ymd, sizeof ymd, "%Y%m%d-%H%M%S", &tm))
    snprintf(ymd, sizeof ymd, "unknown");
  int ms = (int)((key - (double)secs) * 1000);
  snprintf(sub, sizeof sub, "%s/attempt-%s.%03d", dir, ymd,
           ms < 0 || ms > 999 ? 0 : ms);
  if (mkdir(sub, 0755) != 0 && errno != EEXIST)
    return loom_error(LOOM_ERR_IO,
                      "trace: cannot keep the previous attempt's %s: "
                      "creating %s: %s",
                      path, sub, strerror(errno));
  int from = loom_fs_open_dir(dir), to = loom_fs_open_dir(sub);
  loom_status s = LOOM_OK;
  if (from < 0 || to < 0)
    s = loom_error(LOOM_ERR_IO,
                   "trace: cannot keep the previous attempt's %s in %s: %s",
                   path, sub, loom_fs_strerror(errno));
  /* A link then an unlink: a name already taken there is never replaced. */
  for (int k = 1; s == LOOM_OK; k++) {
    char name[300];
    if (k == 1)
      snprintf(name, sizeof name, "%s", base);
    else
      snprintf(name, sizeof name, "%d-%s", k, base);
    if (linkat(from, base, to, name, 0) == 0) {
      if (unlinkat(from, base, 0) != 0)
        s = loom_error(LOOM_ERR_IO,
                       "trace: removing %s after keeping it as "
                       "%s/%s: %s",
                       path, sub, name, strerror(errno));
      break;
    }
    if (errno != EEXIST || k == 100)
      s = loom_error(LOOM_ERR_IO,
                     "trace: cannot keep the previous attempt's %s as %s/%s: "
                     "%s",
                     path, sub, name, strerror(errno));
  }
  if (from >= 0)
    close(from);
  if (to >= 0)
    close(to);
  return s;
}

loom_status loom_trace_start(const char *path, int rank, int world) {
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
    s = keep_previous(path);
  if (s == LOOM_OK)
    s = loom_fs_open_append(path, true, &g_f);
  if (s != LOOM_OK) {
    loom_free(g_buf);
    g_buf = NULL;
    pthread_mutex_unlock(&g_mu);
    return loom_error_context(s, "trace"); /* its message names the file */
  }
  snprintf(g_path, sizeof g_path, "%s", path);
  g_rank = rank;
  g_world = world > 0 ? world : 1;
  g_t0 = loom_time_now();
  g_len = 0;
  g_events = g_dropped = g_buffered = 0;
  g_werr = 0;
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
          "\"args\":{\"monotonic_s\":%.9f,\"wall_s\":%.6f,\"host\":\"%s\","
          "\"world\":%d}},\n",
          rank, rank, rank, g_t0, loom_trace_wall(), ehost, g_world);
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
    if (!g_werr && fprintf(g_f,
                           "{\"ph\":\"M\",\"name\":\"loom_end\",\"pid\":%d,"
                           "\"tid\":0,\"args\":{}}\n]\n",
                           g_rank) < 0)
      g_werr = errno ? errno : EIO;
    if (fclose(g_f) != 0 && !g_werr)
      g_werr = errno ? errno : EIO;
    g_f = NULL;
    if (g_werr)
      LOOM_WARN("trace: %s could not be written (%s): %llu of %llu events "
                "lost, the file is cut short",
                g_path, strerror(g_werr), (unsigned long long)g_dropped,
                (unsigned long long)g_events);
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
