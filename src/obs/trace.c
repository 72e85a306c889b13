/* The timeline trace: Chrome/Perfetto trace events (JSON array format), one
 * file per rank, one event per line so that loom report --trace can merge
 * the ranks line by line. Events go to a buffer under a mutex (a few dozen
 * a step) and reach the file when it fills, at loom_trace_flush and at
 * loom_trace_stop; a file cut short by a crash still loads (the closing
 * bracket of the array is optional in that format). A window of steps
 * (loom_trace_step) pauses and resumes the recording; a cap on the file's
 * size stops it for good, with a record that says so. */
#include <errno.h>
#include <math.h>
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

/* CAP_RESERVE: room kept under the cap for the loom_capped record and the
 * closing one, so that the file never passes it. */
enum {
  BUF_CAP = 256 * 1024,
  STACK_MAX = 32,
  NAME_MAX_ = 96,
  CAP_RESERVE = 512
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_on;            /* events are recorded: the fast check */
static atomic_bool g_open;          /* a file is open (recording or not) */
static atomic_bool g_capped;        /* the cap was reached: nothing more */
static _Atomic int64_t g_step = -1; /* loom_trace_step's last step */
static loom_trace_opts g_opts;      /* the open trace's window and cap */
static char g_max_name[64];
/* When recording last resumed (-inf: on since the start): a span that
 * began before is left out. Under g_mu. */
static double g_since;
static uint64_t g_bytes; /* the file's bytes, those buffered included */
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
  double t0; /* NAN: begun while nothing was recorded */
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

/* Appends one line (an event object and its comma) under g_mu, counted
 * against the cap. */
static void append_locked(const char *line, size_t n) {
  if (g_len + n > BUF_CAP)
    flush_locked();
  if (n <= BUF_CAP) {
    memcpy(g_buf + g_len, line, n);
    g_len += n;
    g_bytes += n;
    g_events++;
    g_buffered++;
  }
}

static double us(double t);
static void json_escape(char *dst, size_t cap, const char *s);

/* An instant event of the process (a marker across its tracks) with its
 * args, under g_mu. */
static void marker_locked(const char *name, double t, const char *args) {
  char line[320];
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"i\",\"s\":\"p\",\"cat\":\"loom\",\"name\":\"%s\","
                   "\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"args\":{%s}},\n",
                   name, g_rank, my_tid(), us(t), args);
  if (n > 0 && (size_t)n < sizeof line)
    append_locked(line, (size_t)n);
}

/* The cap in MB as a person wrote it (0.05, 1024). */
static double cap_mb(void) { return (double)g_opts.max_bytes / 1048576.0; }

/* Appends one line under g_mu: an event that began at t0 (-INFINITY for
 * one without a time) while recording, or, meta, a record written
 * whatever the window says (thread names, the clock sync). Nothing after
 * the cap: the line that would pass it stops the recording instead, with
 * the loom_capped record, and *capped_now says so (the caller warns, out
 * of the lock). */
static void put_line_at(const char *line, size_t n, double t0, bool meta) {
  bool capped_now = false;
  int64_t step = 0;
  uint64_t bytes = 0;
  pthread_mutex_lock(&g_mu);
  if (g_f && !atomic_load(&g_capped) &&
      (meta || (atomic_load(&g_on) && !(t0 < g_since)))) {
    if (g_opts.max_bytes && g_bytes + n + CAP_RESERVE > g_opts.max_bytes) {
      char args[200], raise[sizeof g_max_name];
      step = atomic_load(&g_step);
      bytes = g_bytes;
      json_escape(raise, sizeof raise, g_max_name);
      snprintf(args, sizeof args,
               "\"max_bytes\":%llu,\"bytes\":%llu,\"step\":%lld,"
               "\"raise\":\"%s\"",
               (unsigned long long)g_opts.max_bytes, (unsigned long long)bytes,
               (long long)step, raise);
      marker_locked("loom_capped", loom_time_now(), args);
      atomic_store(&g_on, false);
      atomic_store(&g_capped, true);
      flush_locked();
      capped_now = true;
    } else {
      append_locked(line, n);
    }
  }
  pthread_mutex_unlock(&g_mu);
  if (capped_now) {
    char at[48];
    if (step >= 0)
      snprintf(at, sizeof at, "at step %lld", (long long)step);
    else
      snprintf(at, sizeof at, "before the first step");
    LOOM_WARN("trace: %s reached its cap of %.4g MB %s: recording stopped "
              "there (%llu bytes; the file ends with a loom_capped record); "
              "training goes on. Raise %s to trace more, or trace fewer "
              "steps",
              g_path, cap_mb(), at, (unsigned long long)bytes, g_max_name);
  }
}

static void put_line(const char *line, size_t n, double t0) {
  put_line_at(line, n, t0, false);
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
  if (!loom_trace_is_open())
    return; /* part of the header: whatever the window says */
  char line[320];
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"M\",\"name\":\"loom_clock_sync\",\"pid\":%d,"
                   "\"tid\":0,\"args\":{\"offset_s\":%.9f,\"spread_s\":%.9f,"
                   "\"rounds\":%d,\"attempt\":%.6f}},\n",
                   g_rank, offset_s, spread_s, rounds, attempt);
  if (n > 0 && (size_t)n < sizeof line)
    put_line_at(line, (size_t)n, -INFINITY, true);
  loom_trace_flush();
}

bool loom_trace_enabled(void) { return atomic_load(&g_on); }

bool loom_trace_is_open(void) { return atomic_load(&g_open); }

bool loom_trace_capped(void) { return atomic_load(&g_capped); }

loom_trace_opts loom_trace_opts_default(void) {
  return (loom_trace_opts){.start = 0, .steps = 0, .every = 0};
}

static bool in_window(const loom_trace_opts *o, int64_t step) {
  if (step < o->start)
    return false;
  if (o->steps == 0)
    return true;
  int64_t k = step - o->start;
  return (o->every > 0 ? k % o->every : k) < o->steps;
}

void loom_trace_step(int64_t step) {
  if (!atomic_load(&g_open))
    return;
  atomic_store(&g_step, step);
  bool in = in_window(&g_opts, step);
  if (in == atomic_load(&g_on) || atomic_load(&g_capped))
    return;
  pthread_mutex_lock(&g_mu);
  if (g_f && !atomic_load(&g_capped) && in != atomic_load(&g_on)) {
    char args[48];
    snprintf(args, sizeof args, "\"step\":%lld", (long long)step);
    double now = loom_time_now();
    if (in) {
      /* what began before this moment is not the window's */
      g_since = now;
      marker_locked("loom_window_open", now, args);
      atomic_store(&g_on, true);
    } else {
      atomic_store(&g_on, false);
      marker_locked("loom_window_close", now, args);
      flush_locked(); /* the window on disk while the run goes on */
    }
  }
  pthread_mutex_unlock(&g_mu);
}

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
  return loom_trace_start_opts(path, rank, world, NULL);
}

loom_status loom_trace_start_opts(const char *path, int rank, int world,
                                  const loom_trace_opts *opts) {
  if (!path || !*path)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_trace_start: no path");
  if (world < 1 || rank < 0 || rank >= world)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trace_start: rank %d of a world of %d (supported: "
                      "0 <= rank < world)",
                      rank, world);
  loom_trace_opts o = opts ? *opts : loom_trace_opts_default();
  if (o.start < 0 || o.steps < 0 || o.every < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trace_start: a negative window (start %lld, "
                      "steps %lld, every %lld)",
                      (long long)o.start, (long long)o.steps,
                      (long long)o.every);
  if (o.every > 0 && (o.steps == 0 || o.every <= o.steps))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trace_start: a window of %lld step(s) every %lld: "
                      "supported: 0 < steps < every (or every 0: once)",
                      (long long)o.steps, (long long)o.every);
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
  g_opts = o;
  snprintf(g_max_name, sizeof g_max_name, "%s",
           o.max_name ? o.max_name : "max_bytes");
  g_opts.max_name = g_max_name;
  g_since = -INFINITY;
  atomic_store(&g_step, -1);
  atomic_store(&g_capped, false);
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
  int hn =
      fprintf(g_f,
              "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
              "\"args\":{\"name\":\"rank %d\"}},\n"
              "{\"ph\":\"M\",\"name\":\"loom_clock\",\"pid\":%d,\"tid\":0,"
              "\"args\":{\"monotonic_s\":%.9f,\"wall_s\":%.6f,\"host\":\"%s\","
              "\"world\":%d}},\n",
              rank, rank, rank, g_t0, loom_trace_wall(), ehost, g_world);
  g_bytes = 2 + (hn > 0 ? (uint64_t)hn : 0);
  atomic_store(&g_open, true);
  /* Before the first step: recorded when the window starts at step 0. */
  atomic_store(&g_on, in_window(&g_opts, 0));
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
  atomic_store(&g_open, false);
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
  if (!loom_trace_is_open())
    return;
  char esc[NAME_MAX_], line[256];
  json_escape(esc, sizeof esc, name);
  int n = snprintf(line, sizeof line,
                   "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,"
                   "\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n",
                   g_rank, my_tid(), esc);
  if (n > 0 && (size_t)n < sizeof line)
    put_line_at(line, (size_t)n, -INFINITY, true);
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
    put_line(line, (size_t)n, t0);
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
    put_line(line, (size_t)n, t);
}

/* A region begun outside the window takes its place on the stack (so that
 * its end closes it, not the one around it) and is not recorded. */
void loom_trace_begin(const char *name) {
  if (!loom_trace_is_open())
    return;
  if (t_depth < STACK_MAX) {
    if (loom_trace_enabled()) {
      snprintf(t_stack[t_depth].name, sizeof t_stack[t_depth].name, "%s",
               name ? name : "");
      t_stack[t_depth].t0 = loom_time_now();
    } else {
      t_stack[t_depth].t0 = NAN;
    }
  }
  t_depth++;
}

void loom_trace_end(void) {
  if (t_depth == 0)
    return; /* an end without its begin */
  t_depth--;
  if (t_depth < STACK_MAX && loom_trace_enabled() &&
      !isnan(t_stack[t_depth].t0))
    loom_trace_span("user", t_stack[t_depth].name, t_stack[t_depth].t0,
                    loom_time_now(), NULL);
}
