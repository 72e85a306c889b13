/* Run status: each rank's small text file under LOOM_RUN_DIR (phases, last
 * step, exit code or fatal signal) that loom run reads to supervise it. */
#include "loom/core.h"
#include "loom/run.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

static const char *const phase_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_RUNSTAT_PHASE_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof phase_names / sizeof phase_names[0] ==
                   LOOM_RUNSTAT_PHASE_COUNT,
               "runstat phase names");

const char *loom_runstat_phase_name(loom_run_phase p) {
  return (unsigned)p < LOOM_RUNSTAT_PHASE_COUNT ? phase_names[p] : "?";
}

/* The record is one block of "key value" lines, each value padded to a fixed
 * width, so any field can be rewritten in place at a known offset and a
 * reader never sees a shorter file. The fields updated together sit next to
 * each other: a step is one pwrite of (first_step .. t_step), a fatal
 * signal one of (exit, signal, t_exit). "end" closes a complete record.
 * exit is "-" while the process runs and "?" once it went through exit()
 * without saying its code (an atexit hook), so loom run can tell a process
 * that ended normally from one killed without a word (SIGKILL, OOM). */
#define FIELD_LIST(X)                                                          \
  X(F_RANK, "rank", 10)                                                        \
  X(F_PID, "pid", 10)                                                          \
  X(F_HOST, "host", 63)                                                        \
  X(F_PHASE, "phase", 12)                                                      \
  X(F_T_START, "t_start", 17)                                                  \
  X(F_T_COMM_READY, "t_comm_ready", 17)                                        \
  X(F_T_LOADED, "t_loaded", 17)                                                \
  X(F_T_TRAINING, "t_training", 17)                                            \
  X(F_T_DONE, "t_done", 17)                                                    \
  X(F_FIRST_STEP, "first_step", 20)                                            \
  X(F_T_FIRST_STEP, "t_first_step", 17)                                        \
  X(F_STEP, "step", 20)                                                        \
  X(F_T_STEP, "t_step", 17)                                                    \
  X(F_T_BEAT, "t_beat", 17)                                                    \
  X(F_EXIT, "exit", 11)                                                        \
  X(F_SIGNAL, "signal", 4)                                                     \
  X(F_T_EXIT, "t_exit", 17)                                                    \
  X(F_NOTE, "note", LOOM_RUNSTAT_NOTE_MAX)

typedef enum {
#define X_ENUM(name, key, width) name,
  FIELD_LIST(X_ENUM)
#undef X_ENUM
      F_COUNT
} field;

static const char *const field_keys[] = {
#define X_KEY(name, key, width) key,
    FIELD_LIST(X_KEY)
#undef X_KEY
};
static const int field_width[] = {
#define X_W(name, key, width) width,
    FIELD_LIST(X_W)
#undef X_W
};
_Static_assert(sizeof field_keys / sizeof field_keys[0] == F_COUNT,
               "runstat fields");
_Static_assert(F_T_COMM_READY - F_T_START == LOOM_RUNSTAT_COMM_READY &&
                   F_T_DONE - F_T_START == LOOM_RUNSTAT_DONE,
               "phase times follow the phase order");

#define MAGIC "loom-runstat 1\n"
#define END "end\n"
#define KEY_W 13 /* "t_first_step " */
#define RECORD_MAX 1024

static struct {
  pthread_once_t once;
  pthread_mutex_t mu;
  int fd; /* -1: off */
  int rank;
  int off[F_COUNT]; /* where each value starts */
  int len;          /* bytes in the record */
  char buf[RECORD_MAX];
  bool first_step_done;
  double last_beat; /* loom_time_now() of the last beat written */
} rs = {
    PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, -1, 0, {0}, 0, "", false, 0};

/* Formatting without stdio: the fatal-signal handler uses it too. */
static int fmt_u64(char *out, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  for (int i = 0; i < n; i++)
    out[i] = tmp[n - 1 - i];
  return n;
}

static int fmt_i64(char *out, int64_t v) {
  if (v < 0) {
    out[0] = '-';
    return 1 + fmt_u64(out + 1, (uint64_t)0 - (uint64_t)v);
  }
  return fmt_u64(out, (uint64_t)v);
}

/* "1700000000.123456": seconds since the epoch to the microsecond. */
static int fmt_now(char *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int n = fmt_u64(out, (uint64_t)ts.tv_sec);
  out[n++] = '.';
  long us = ts.tv_nsec / 1000;
  for (int d = 100000; d >= 1; d /= 10)
    out[n++] = (char)('0' + (us / d) % 10);
  return n;
}

/* Puts `len` bytes of `v` into field f, padded with spaces. */
static void set_field(field f, const char *v, int len) {
  int w = field_width[f];
  if (len > w)
    len = w;
  char *p = rs.buf + rs.off[f];
  for (int i = 0; i < len; i++)
    p[i] = (v[i] == '\n' || v[i] == '\r') ? ' ' : v[i];
  for (int i = len; i < w; i++)
    p[i] = ' ';
}

static void set_str(field f, const char *v) { set_field(f, v, (int)strlen(v)); }

static void set_i64(field f, int64_t v) {
  char t[24];
  set_field(f, t, fmt_i64(t, v));
}

static void set_now(field f) {
  char t[32];
  set_field(f, t, fmt_now(t));
}

static void write_range(field first, field last) {
  int a = rs.off[first] - KEY_W, b = rs.off[last] + field_width[last] + 1;
  ssize_t w = pwrite(rs.fd, rs.buf + a, (size_t)(b - a), a);
  (void)
      w; /* the status file is advice: a failed write must not stop training */
}

static bool exit_recorded;

static void at_exit(void) {
  if (rs.fd < 0)
    return;
  pthread_mutex_lock(&rs.mu);
  if (!exit_recorded) {
    set_str(F_EXIT, "?");
    set_now(F_T_EXIT);
    write_range(F_EXIT, F_T_EXIT);
  }
  pthread_mutex_unlock(&rs.mu);
}

static int env_rank(void) {
  /* RANK first with LOOM_INIT (env://; SLURM_PROCID may be the step's
   * then), never without: elsewhere it may mean anything. */
  const char *init = getenv("LOOM_INIT");
  static const char *const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK",
                                     "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    if (i == 0 && !(init && *init))
      continue;
    const char *v = getenv(vars[i]);
    if (v && *v) {
      char *end;
      long r = strtol(v, &end, 10);
      if (*end == '\0' && r >= 0 && r < (1L << 30))
        return (int)r;
    }
  }
  return 0;
}

static void init_once(void) {
  const char *dir = getenv("LOOM_RUN_DIR");
  if (!dir || !*dir)
    return;
  rs.rank = env_rank();
  char path[4096];
  int pn = snprintf(path, sizeof path, "%s/rank-%d", dir, rs.rank);
  if (pn < 0 || pn >= (int)sizeof path)
    return;
  /* Lay out the record: the key padded to KEY_W, the value, a newline. */
  int n = (int)strlen(MAGIC);
  memcpy(rs.buf, MAGIC, (size_t)n);
  for (int f = 0; f < F_COUNT; f++) {
    int k = (int)strlen(field_keys[f]);
    memcpy(rs.buf + n, field_keys[f], (size_t)k);
    memset(rs.buf + n + k, ' ', (size_t)(KEY_W - k));
    n += KEY_W;
    rs.off[f] = n;
    n += field_width[f];
    rs.buf[n++] = '\n';
  }
  memcpy(rs.buf + n, END, strlen(END));
  n += (int)strlen(END);
  rs.len = n;
  for (int f = 0; f < F_COUNT; f++)
    set_str((field)f, "-");
  set_i64(F_RANK, rs.rank);
  set_i64(F_PID, (int64_t)getpid());
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0)
    strcpy(host, "?");
  set_str(F_HOST, host);
  set_str(F_PHASE, phase_names[LOOM_RUNSTAT_START]);
  set_now(F_T_START);
  /* A temporary name, then rename: loom run never sees a half-made file,
   * and a stale file of an earlier process of this rank is replaced whole. */
  char tmp[4096 + 16];
  snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
  int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    return;
  if (pwrite(fd, rs.buf, (size_t)rs.len, 0) != rs.len ||
      rename(tmp, path) != 0) {
    close(fd);
    loom_fs_discard(AT_FDCWD, tmp);
    return;
  }
  rs.fd = fd;
  atexit(at_exit);
}

void loom_runstat_init(void) { pthread_once(&rs.once, init_once); }

/* A standby rank (LOOM_RUN_GATE names a file) waits here until loom run
 * creates that file: the group is started and its communication set up
 * ahead of a failure, and goes on the moment it is needed. */
static void wait_gate(void) {
  const char *gate = getenv("LOOM_RUN_GATE");
  if (!gate || !*gate)
    return;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", gate);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = '\0';
  else
    strcpy(dir, ".");
  int ino = inotify_init1(IN_CLOEXEC);
  if (ino >= 0 && inotify_add_watch(ino, dir, IN_CREATE | IN_MOVED_TO) < 0) {
    close(ino);
    ino = -1;
  }
  /* Checked after the watch is set, so a gate opened in between is seen. */
  while (access(gate, F_OK) != 0) {
    if (ino >= 0) {
      char buf[4096];
      if (read(ino, buf, sizeof buf) < 0 && errno != EINTR)
        break;
    } else {
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  if (ino >= 0)
    close(ino);
  unsetenv("LOOM_RUN_GATE"); /* once; and not for this rank's children */
}

static bool gate_deferred, gate_passed;

void loom_runstat_gate_defer(void) { gate_deferred = true; }

bool loom_runstat_standby(void) {
  const char *gate = getenv("LOOM_RUN_GATE");
  return !gate_passed && gate && *gate;
}

void loom_runstat_gate(void) {
  loom_runstat_init();
  if (gate_passed || !getenv("LOOM_RUN_GATE"))
    return;
  gate_passed = true;
  wait_gate();
  if (rs.fd < 0)
    return;
  /* Ready when let through: what the recovery's parts measure. */
  pthread_mutex_lock(&rs.mu);
  set_now(F_T_COMM_READY);
  write_range(F_PHASE, F_T_DONE);
  pthread_mutex_unlock(&rs.mu);
}

void loom_runstat_phase(loom_run_phase p) {
  loom_runstat_init();
  if (rs.fd < 0 || (unsigned)p >= LOOM_RUNSTAT_PHASE_COUNT)
    return;
  pthread_mutex_lock(&rs.mu);
  set_str(F_PHASE, phase_names[p]);
  set_now((field)(F_T_START + (int)p));
  write_range(F_PHASE, F_T_DONE);
  pthread_mutex_unlock(&rs.mu);
  if (p == LOOM_RUNSTAT_COMM_READY && !gate_deferred)
    loom_runstat_gate();
}

void loom_runstat_step(int64_t step) {
  loom_runstat_init();
  if (rs.fd < 0)
    return;
  pthread_mutex_lock(&rs.mu);
  set_i64(F_STEP, step);
  set_now(F_T_STEP);
  if (!rs.first_step_done) {
    set_i64(F_FIRST_STEP, step);
    memcpy(rs.buf + rs.off[F_T_FIRST_STEP], rs.buf + rs.off[F_T_STEP],
           (size_t)field_width[F_T_STEP]);
    rs.first_step_done = true;
  }
  write_range(F_FIRST_STEP, F_T_STEP);
  pthread_mutex_unlock(&rs.mu);
}

void loom_runstat_beat(void) {
  loom_runstat_init();
  if (rs.fd < 0)
    return;
  /* At most four writes a second: evaluation calls it every batch; a hang
   * timeout of a second or two must not see a beat over 0.25 s old. */
  double now = loom_time_now();
  pthread_mutex_lock(&rs.mu);
  if (now - rs.last_beat >= 0.25) {
    rs.last_beat = now;
    set_now(F_T_BEAT);
    write_range(F_T_BEAT, F_T_BEAT);
  }
  pthread_mutex_unlock(&rs.mu);
}

void loom_runstat_note(const char *what) {
  loom_runstat_init();
  if (rs.fd < 0 || !what)
    return;
  pthread_mutex_lock(&rs.mu);
  set_str(F_NOTE, what);
  write_range(F_NOTE, F_NOTE);
  pthread_mutex_unlock(&rs.mu);
}

void loom_runstat_exit(int code) {
  loom_runstat_init();
  if (rs.fd < 0)
    return;
  pthread_mutex_lock(&rs.mu);
  set_i64(F_EXIT, code);
  set_now(F_T_EXIT);
  exit_recorded = true;
  write_range(F_EXIT, F_T_EXIT);
  pthread_mutex_unlock(&rs.mu);
}

/* ------------------------------------------------------- fatal signals */

static const int fatal_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_FATAL (sizeof fatal_sigs / sizeof fatal_sigs[0])
static struct sigaction fatal_old[N_FATAL];
/* A stack to run the handler on when the fault is a stack overflow. */
static char alt_stack[1 << 16];

static void on_fatal(int sig) {
  int saved = errno;
  if (rs.fd >= 0) {
    /* No lock and no stdio here: format into a private copy of the range
     * (exit, signal, t_exit) and write it with one pwrite. */
    char line[KEY_W * 3 + 11 + 4 + 17 + 3];
    int a = rs.off[F_EXIT] - KEY_W;
    int b = rs.off[F_T_EXIT] + field_width[F_T_EXIT] + 1;
    if (b - a <= (int)sizeof line) {
      memcpy(line, rs.buf + a, (size_t)(b - a));
      char v[32];
      int n = fmt_i64(v, sig);
      char *p = line + (rs.off[F_SIGNAL] - a);
      for (int i = 0; i < field_width[F_SIGNAL]; i++)
        p[i] = i < n ? v[i] : ' ';
      n = fmt_now(v);
      p = line + (rs.off[F_T_EXIT] - a);
      for (int i = 0; i < field_width[F_T_EXIT]; i++)
        p[i] = i < n ? v[i] : ' ';
      ssize_t w = pwrite(rs.fd, line, (size_t)(b - a), a);
      (void)w;
    }
  }
  /* Hand the signal on: to the handler that was there before us (a
   * sanitizer's, say), else the default action, which ends the process
   * with this signal when raised again. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (size_t i = 0; i < N_FATAL; i++)
    if (fatal_sigs[i] == sig) {
      bool had = (fatal_old[i].sa_flags & SA_SIGINFO) ||
                 (fatal_old[i].sa_handler != SIG_DFL &&
                  fatal_old[i].sa_handler != SIG_IGN);
      sigaction(sig, had ? &fatal_old[i] : &dfl, NULL);
    }
  errno = saved;
  raise(sig);
}

void loom_runstat_fatal_signals(void) {
  loom_runstat_init();
  if (rs.fd < 0)
    return;
  static bool installed;
  if (installed)
    return;
  installed = true;
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK | SA_NODEFER;
  for (size_t i = 0; i < N_FATAL; i++)
    sigaction(fatal_sigs[i], &sa, &fatal_old[i]);
}

/* ------------------------------------------------------------- reading */

/* A value as the writer writes it: "-" (none) or a number of the field's
 * kind in its range. A file half rewritten or of another program (a time of
 * "nan", a signal of 2^31) is corrupt, never taken: loom run adds and
 * compares these numbers (128 + signal, step times for the hang timeout). */
static bool parse_time(const char *v, double *out) {
  if (strcmp(v, "-") == 0) {
    *out = 0;
    return true;
  }
  /* digits and one point only: strtod alone takes "nan", "inf", "0x1p3" */
  if (!*v || strspn(v, "0123456789.") != strlen(v))
    return false;
  char *end;
  errno = 0;
  double t = strtod(v, &end);
  if (*end || errno || !(t >= 0) || t > 1e12)
    return false;
  *out = t;
  return true;
}

static bool parse_ranged(const char *v, int64_t none, int64_t lo, int64_t hi,
                         int64_t *out) {
  if (strcmp(v, "-") == 0) {
    *out = none;
    return true;
  }
  int64_t x;
  if (!loom_parse_i64(v, &x) || x < lo || x > hi)
    return false;
  *out = x;
  return true;
}

loom_status loom_runstat_read(const char *dir, int rank,
                              loom_runstat_record *out) {
  memset(out, 0, sizeof *out);
  out->phase = -1;
  out->step = -1;
  out->first_step = -1;
  out->exit_code = -1;
  char path[4096];
  snprintf(path, sizeof path, "%s/rank-%d", dir, rank);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  char buf[RECORD_MAX + 1];
  ssize_t n = pread(fd, buf, RECORD_MAX, 0);
  close(fd);
  if (n < 0)
    return loom_error(LOOM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
  buf[n] = '\0';
  size_t ml = strlen(MAGIC), el = strlen(END);
  if ((size_t)n < ml + el || memcmp(buf, MAGIC, ml) != 0 ||
      memcmp(buf + n - el, END, el) != 0)
    return loom_error(LOOM_ERR_CORRUPT, "%s: not a complete run status", path);
  bool seen[F_COUNT] = {false};
  int lineno = 1; /* the magic line */
  for (char *line = buf + ml; *line;) {
    char *nl = strchr(line, '\n');
    if (!nl)
      break;
    *nl = '\0';
    lineno++;
    char *sp = strchr(line, ' ');
    if (sp) {
      *sp = '\0';
      char *v = sp + 1;
      while (*v == ' ')
        v++;
      char *e = v + strlen(v);
      while (e > v && e[-1] == ' ')
        *--e = '\0';
      for (int f = 0; f < F_COUNT; f++) {
        if (strcmp(line, field_keys[f]) != 0)
          continue;
        seen[f] = true;
        bool ok = true;
        int64_t x = 0;
        switch ((field)f) {
        case F_RANK:
          ok = parse_ranged(v, -1, 0, INT32_MAX, &x);
          out->rank = (int)x;
          break;
        case F_PID:
          ok = parse_ranged(v, 0, 0, INT32_MAX, &x);
          out->pid = (int)x;
          break;
        case F_HOST:
          snprintf(out->host, sizeof out->host, "%s", v);
          break;
        case F_PHASE:
          /* a phase of a later loom: none known (-1), the record stands */
          for (int p = 0; p < LOOM_RUNSTAT_PHASE_COUNT; p++)
            if (strcmp(v, phase_names[p]) == 0)
              out->phase = p;
          break;
        case F_T_START:
        case F_T_COMM_READY:
        case F_T_LOADED:
        case F_T_TRAINING:
        case F_T_DONE:
          ok = parse_time(v, &out->t_phase[f - F_T_START]);
          break;
        case F_FIRST_STEP:
          ok = parse_ranged(v, -1, 0, INT64_MAX, &out->first_step);
          break;
        case F_T_FIRST_STEP:
          ok = parse_time(v, &out->t_first_step);
          break;
        case F_STEP:
          ok = parse_ranged(v, -1, 0, INT64_MAX, &out->step);
          break;
        case F_T_STEP:
          ok = parse_time(v, &out->t_step);
          break;
        case F_T_BEAT:
          ok = parse_time(v, &out->t_beat);
          break;
        case F_EXIT:
          /* "?": left through exit() without saying its code */
          if (strcmp(v, "?") == 0)
            x = -2;
          else
            ok = parse_ranged(v, -1, 0, 255, &x);
          out->exit_code = (int)x;
          break;
        case F_SIGNAL:
          ok = parse_ranged(v, 0, 1, 64, &x);
          out->signal = (int)x;
          break;
        case F_T_EXIT:
          ok = parse_time(v, &out->t_exit);
          break;
        case F_NOTE:
          snprintf(out->note, sizeof out->note, "%s",
                   strcmp(v, "-") == 0 ? "" : v);
          break;
        default:
          break;
        }
        if (!ok)
          return loom_error(LOOM_ERR_CORRUPT,
                            "%s: line %d: '%s' is not a valid %s (%s)", path,
                            lineno, v, field_keys[f],
                            f == F_EXIT     ? "'-', '?' or 0 to 255"
                            : f == F_SIGNAL ? "'-' or a signal number 1 to 64"
                            : f == F_RANK || f == F_PID ? "'-' or a number >= 0"
                            : f == F_STEP || f == F_FIRST_STEP
                                ? "'-' or a step >= 0"
                                : "'-' or seconds since the epoch");
      }
    }
    line = nl + 1;
  }
  for (int f = 0; f < F_COUNT; f++)
    if (!seen[f])
      return loom_error(LOOM_ERR_CORRUPT, "%s: no '%s' line", path,
                        field_keys[f]);
  return LOOM_OK;
}

void loom_runstat_on_abort(void *ctx, const char *why, int exit_code) {
  (void)ctx;
  loom_runstat_note(why);
  loom_runstat_exit(exit_code);
}
