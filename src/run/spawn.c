/* loom run: starts the launcher (mpirun, srun or the program itself) in a
 * session of its own, forwards stop signals to it, enforces --timeout, and
 * sweeps the session afterwards so no rank is left behind. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "loom/core.h"

/* Seconds between asking the job to stop and killing the whole session:
 * the ranks finish their step and save (--stop-grace). */
static double stop_grace_s = 30.0;

void loom_run_set_stop_grace(double seconds) { stop_grace_s = seconds; }

/* Asks the job to stop; returns false while it waits. Where every rank
 * runs here, the signal goes to the ranks themselves: each finishes its
 * step, they agree on the step to stop at, and save it (mpirun, given the
 * signal, would kill them at once: nothing saved). Ranks still starting
 * (not all known from their status files yet) are waited for: loom train's
 * for the grace period (it catches the signal from its first instruction
 * and stops after its first step), another program's up to 2 s.
 * Else, and for SIGQUIT, the launcher gets it and stops its ranks its own
 * way. */
#define STOP_WAIT_RANKS_S 2.0
static bool stop_job(pid_t pid, loom_run_watch *watch, int sig, double waited) {
  bool direct =
      watch && sig != SIGQUIT && watch->all_local && watch->expect_local > 0;
  if (direct && loom_watch_all_known(watch) &&
      loom_watch_signal_all(watch, sig) > 0)
    return true;
  /* A program known to keep status files (loom train) is waited for as
   * long as the grace lasts; another only if some rank already has one. */
  double wait = watch && watch->keeps_status           ? stop_grace_s
                : watch && loom_watch_local(watch) > 0 ? STOP_WAIT_RANKS_S
                                                       : 0;
  if (direct && waited < wait)
    return false;
  kill(pid, sig);
  return true;
}

static int wake_pipe[2] = {-1, -1};
static volatile sig_atomic_t stop_sig; /* first stop signal received */
static volatile sig_atomic_t stop_count;

static void on_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD) {
    if (!stop_sig)
      stop_sig = sig;
    stop_count++;
  }
  if (wake_pipe[1] >= 0) {
    char c = 0;
    ssize_t w = write(wake_pipe[1], &c, 1);
    (void)w;
  }
  errno = saved;
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static void install_handlers(void) {
  if (wake_pipe[0] < 0 && pipe(wake_pipe) == 0) {
    for (int i = 0; i < 2; i++) {
      fcntl(wake_pipe[i], F_SETFL, fcntl(wake_pipe[i], F_GETFL) | O_NONBLOCK);
      fcntl(wake_pipe[i], F_SETFD, FD_CLOEXEC);
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
    sigaction(stop_signals[i], &sa, NULL);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  /* A closed stderr (`loom run ... | head`) must not kill loom run while
   * it relays the ranks' output: the write fails with EPIPE instead and the
   * job goes on (the launcher is given the default back). */
  signal(SIGPIPE, SIG_IGN);
}

bool loom_run_stop_requested(void) { return stop_sig != 0; }

static void drain(void) {
  char buf[64];
  while (read(wake_pipe[0], buf, sizeof buf) > 0) {
  }
}

/* Waits up to `seconds` for a signal to arrive. */
static void wait_event(double seconds) {
  struct pollfd p = {.fd = wake_pipe[0], .events = POLLIN};
  int ms = seconds <= 0 ? 0 : (int)(seconds * 1000) + 1;
  if (poll(&p, 1, ms) > 0)
    drain();
}

void loom_run_sleep(double seconds) {
  install_handlers();
  double end = loom_time_now() + seconds;
  while (!stop_sig) {
    double left = end - loom_time_now();
    if (left <= 0)
      break;
    wait_event(left);
  }
}

typedef struct session_scan {
  pid_t sid;
  int sig;
  int found;
} session_scan;

/* One entry of /proc: a process of the session is counted and signalled. */
static bool signal_if_in_session(const char *name, void *ctx) {
  session_scan *sc = ctx;
  int pid;
  if (name[0] < '0' || name[0] > '9' || !loom_parse_int(name, &pid))
    return true;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%.20s/stat", name);
  FILE *f = fopen(path, "r");
  if (!f)
    return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* pid (comm) state ppid pgrp session ...: comm may hold spaces and
   * parentheses, so parse after the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ' || !p[2] || p[3] != ' ')
    return true;
  const char state = p[2];
  const char *q = p + 3;
  int64_t ppid, pgrp, session; /* after the state: ppid pgrp session */
  if (!loom_parse_i64_at(q, &q, &ppid) || !loom_parse_i64_at(q, &q, &pgrp) ||
      !loom_parse_i64_at(q, &q, &session))
    return true;
  if (session != (int64_t)sc->sid || state == 'Z' || state == 'X')
    return true;
  sc->found++;
  if (sc->sig)
    kill((pid_t)pid, sc->sig);
  return true;
}

/* Sends sig to every live process of session sid (the launcher and all it
 * started: Open MPI puts each rank in a process group of its own, but they
 * stay in the launcher's session). Returns how many there were. Zombies do
 * not count: they are dead, and PID 1 may take a while to reap them. */
static int signal_session(pid_t sid, int sig) {
  session_scan sc = {sid, sig, 0};
  if (loom_fs_each_entry(AT_FDCWD, "/proc", true, signal_if_in_session, &sc) !=
      0) {
    kill(-sid, sig);
    return kill(-sid, 0) == 0;
  }
  return sc.found;
}

/* The standby group's launcher (see run.c): started ahead of a failure,
 * in a session of its own, reaped here like any child. */
static pid_t standby_pid;
static bool standby_gone;

static void note_reaped(pid_t w) {
  if (w > 0 && w == standby_pid)
    standby_gone = true;
}

/* Reaps exited children (orphans of the job land here: loom run is their
 * subreaper) and says whether any child is still alive. */
static bool reap_children(void) {
  for (;;) {
    pid_t w = waitpid(-1, NULL, WNOHANG);
    if (w > 0) {
      note_reaped(w);
      continue;
    }
    return w == 0; /* 0: children alive; -1 (ECHILD): none left */
  }
}

/* After the launcher exited: whatever it left behind (ranks that escaped
 * mpirun's clean-up, a program's background children) is stopped. As the
 * subreaper, loom run inherits those orphans, so "none left" is usually one
 * waitpid, not a scan of /proc (with a standby group alive, a scan). */
static void sweep_session(pid_t sid) {
  if (!reap_children() || !signal_session(sid, 0))
    return;
  signal_session(sid, SIGTERM);
  double end = loom_time_now() + 0.5;
  struct timespec ts = {0, 20 * 1000 * 1000};
  while (signal_session(sid, 0) && loom_time_now() < end) {
    reap_children();
    nanosleep(&ts, NULL);
  }
  signal_session(sid, SIGKILL);
  reap_children();
}

void loom_run_standby_set(pid_t pid) {
  standby_pid = pid;
  standby_gone = false;
}

bool loom_run_standby_alive(void) {
  if (standby_pid <= 0 || standby_gone)
    return false;
  if (waitpid(standby_pid, NULL, WNOHANG) == standby_pid)
    standby_gone = true;
  return !standby_gone;
}

pid_t loom_run_standby_take(void) {
  pid_t pid = standby_gone ? 0 : standby_pid;
  standby_pid = 0;
  standby_gone = false;
  return pid;
}

void loom_run_standby_kill(void) {
  if (standby_pid <= 0)
    return;
  pid_t sid = standby_pid;
  if (!standby_gone)
    kill(sid, SIGKILL);
  if (!standby_gone && waitpid(sid, NULL, 0) == sid)
    standby_gone = true;
  /* Its ranks, whose launcher can no longer take them down. */
  double end = loom_time_now() + 2.0;
  struct timespec ts = {0, 5 * 1000 * 1000};
  while (signal_session(sid, SIGKILL) && loom_time_now() < end) {
    reap_children();
    nanosleep(&ts, NULL);
  }
  reap_children();
  standby_pid = 0;
}

/* ------------------------------------------------ the launcher's words
 *
 * With a launcher log (RUN/logs/launcher.log), the launcher's stderr comes
 * through a pipe: what the ranks write passes to our stderr line by line
 * ('\r' ends a line too, for progress bars); the launcher's and transport's
 * own messages go to the log: Open MPI's help messages (framed by lines of
 * dashes: "Primary job terminated normally...", "mpirun noticed that
 * process..."), its "[host:pid] ..." lines (signal reports, backtraces) and
 * UCX's "[time] [host:pid:tid] ..." lines and "==== backtrace" blocks.
 * MPICH's hydra writes its banner to stdout (framed by lines of '=': "BAD
 * TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", then "YOUR APPLICATION
 * TERMINATED WITH THE EXIT STRING: Killed (signal 9)"), so an MPI
 * launcher's stdout comes through a pipe too. With -v they reach the
 * console as well. */
#define RELAY_MAX 4
#define RELAY_LINE 4096

typedef struct relay {
  int fd; /* -1: unused */
  int to; /* where the ranks' lines go: STDOUT_FILENO or STDERR_FILENO */
  pid_t pid;
  size_t len;
  bool in_banner, in_trace;
  bool head;  /* the next line opens a banner: its headline */
  bool blank; /* an empty line held back: the banner's, or the ranks' */
  char buf[RELAY_LINE];
} relay;

static relay relays[RELAY_MAX] = {
    {.fd = -1}, {.fd = -1}, {.fd = -1}, {.fd = -1}};
static char launcher_log_path[4200];
static bool launcher_log_verbose;
static int launcher_log_fd = -1;
/* The signal hydra's banner named ("EXIT STRING: Killed (signal 9)"): hydra
 * exits with that number as its code, the same as a rank's exit(9). */
static int launcher_said_signal;

static void note_exit_string(const char *s, size_t n) {
  static const char key[] = "(signal ";
  for (size_t i = 0; i + sizeof key - 1 < n; i++)
    if (memcmp(s + i, key, sizeof key - 1) == 0) {
      int v = 0;
      size_t j = i + sizeof key - 1;
      while (j < n && s[j] >= '0' && s[j] <= '9' && v < 1000)
        v = v * 10 + (s[j++] - '0');
      if (j < n && s[j] == ')' && v > 0 && v < 65 && !launcher_said_signal)
        launcher_said_signal = v;
      return;
    }
}

void loom_run_set_launcher_log(const char *path, bool verbose) {
  snprintf(launcher_log_path, sizeof launcher_log_path, "%s", path);
  launcher_log_verbose = verbose;
}

/* Opens the log the first time something goes there: its directory made,
 * appended to, never through a link planted in its place. */
static int log_fd(void) {
  if (launcher_log_fd >= 0 || !launcher_log_path[0])
    return launcher_log_fd;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", launcher_log_path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    (void)loom_fs_mkdirs(dir, 0755); /* a failure shows in the open below */
  }
  launcher_log_fd =
      open(launcher_log_path,
           O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (launcher_log_fd < 0)
    launcher_log_path[0] = '\0'; /* cannot: keep it on the console */
  return launcher_log_fd;
}

static bool all_char(const char *s, size_t n, char c, size_t min) {
  if (n < min)
    return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] != c)
      return false;
  return true;
}

/* Whether a line (without its terminator) is the launcher's own. */
static bool launcher_line(relay *r, const char *s, size_t n) {
  if (all_char(s, n, '-', 20)) {
    r->in_banner = !r->in_banner;
    r->head = r->in_banner;
    return true;
  }
  if (r->in_trace) {
    if (all_char(s, n, '=', 10))
      r->in_trace = false;
    return true;
  }
  if (all_char(s, n, '=', 40)) { /* hydra's frame */
    r->in_banner = !r->in_banner;
    r->head = r->in_banner;
    return true;
  }
  if (r->in_banner)
    return true;
  if (n >= 14 && strncmp(s, "==== backtrace", 14) == 0) {
    r->in_trace = true;
    return true;
  }
  static const char exit_string[] =
      "YOUR APPLICATION TERMINATED WITH THE EXIT STRING:";
  if (n >= sizeof exit_string - 1 &&
      memcmp(s, exit_string, sizeof exit_string - 1) == 0) {
    note_exit_string(s, n);
    return true;
  }
  if (n > 1 && s[0] == '[') {
    /* "[host:pid] ..." (Open MPI) or "[1700000000.1] [host:pid:tid]" (UCX) */
    const char *end = memchr(s, ']', n);
    if (end && memchr(s, ':', (size_t)(end - s)))
      return true;
    if (end && (size_t)(end - s) + 2 < n && end[1] == ' ' && end[2] == '[')
      return true;
  }
  static const char *const starts[] = {
      "[mpiexec@",
      "[proxy:", /* hydra's own errors */
      "mpirun noticed",
      "mpirun.openmpi noticed",
      "prterun noticed",
      "Primary job  terminated",
      "Primary job terminated",
      "This typically refers to a problem with your application.",
      "Please see the FAQ page for debugging suggestions"};
  for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
    if (n >= strlen(starts[i]) && strncmp(s, starts[i], strlen(starts[i])) == 0)
      return true;
  return false;
}

/* What the launcher said in this attempt, for loom run's failure line:
 * the first few lines that read as errors (each banner's headline, and
 * outside banners a line naming an error), and whether anything went to
 * the log at all. */
static char said[LOOM_RUN_SAID_MAX][200];
static int n_said;
static bool said_any;

static bool reads_as_error(const char *s, size_t n) {
  static const char *const words[] = {
      "error",     "fail",    "not found", "unable",    "cannot",
      "could not", "abort",   "refused",   "denied",    "no route",
      "killed",    "noticed", "signal",    "terminated"};
  char low[512];
  size_t k = n < sizeof low - 1 ? n : sizeof low - 1;
  for (size_t i = 0; i < k; i++)
    low[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
  low[k] = '\0';
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (strstr(low, words[i]))
      return true;
  return false;
}

/* A line of the launcher's that went to its log (frames excluded). */
static void note_said(relay *r, const char *s, size_t n) {
  said_any = true;
  bool frame = all_char(s, n, '-', 20) || all_char(s, n, '=', 40);
  while (n > 0 && (*s == ' ' || *s == '\t')) {
    s++;
    n--;
  }
  if (frame || n == 0)
    return;
  bool head = r->head;
  r->head = false;
  /* (Open MPI's note that it folded the other ranks' copies away, and its
   * own help system's internal errors, printed under load as it gathers
   * the ranks' messages: they say nothing of why the job failed) */
  static const char *const asides[] = {
      "has sent help message", "orte_base_help_aggregate",
      "ORTE_ERROR_LOG: Data unpack", "show_help.c"};
  char text[512];
  snprintf(text, sizeof text, "%.*s", (int)(n < 511 ? n : 511), s);
  for (size_t i = 0; i < sizeof asides / sizeof asides[0]; i++)
    if (strstr(text, asides[i]))
      return;
  if (n_said >= LOOM_RUN_SAID_MAX || r->in_trace ||
      (!head && (r->in_banner || !reads_as_error(s, n))))
    return;
  size_t k = n < sizeof said[0] - 1 ? n : sizeof said[0] - 1;
  for (int i = 0; i < n_said; i++)
    if (strncmp(said[i], s, k) == 0 && said[i][k] == '\0')
      return; /* the same message from another rank */
  memcpy(said[n_said], s, k);
  said[n_said][k] = '\0';
  n_said++;
}

int loom_run_launcher_said(const char **lines, const char **path, bool *wrote) {
  for (int i = 0; i < n_said; i++)
    lines[i] = said[i];
  *path = launcher_log_path;
  *wrote = said_any && launcher_log_path[0];
  return n_said;
}

static void write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return;
    s += w;
    n -= (size_t)w;
  }
}

/* One line, terminator included (or a piece too long for the buffer). */
static void relay_line(relay *r, const char *s, size_t n) {
  size_t body = n;
  while (body > 0 && (s[body - 1] == '\n' || s[body - 1] == '\r'))
    body--;
  /* An empty line is held until the next one says whose it is: hydra opens
   * its banner with one. */
  if (body == 0 && n == 1 && s[0] == '\n' && !r->in_banner && !r->blank) {
    r->blank = true;
    return;
  }
  /* (without a log, the launcher's lines stay on the console) */
  bool own = launcher_line(r, s, body) && log_fd() >= 0;
  if (r->blank) {
    r->blank = false;
    if (own)
      write_all(launcher_log_fd, "\n", 1);
    if (!own || launcher_log_verbose)
      write_all(r->to, "\n", 1);
  }
  if (own) {
    note_said(r, s, body);
    write_all(launcher_log_fd, s, n);
    if (!launcher_log_verbose)
      return;
  }
  write_all(r->to, s, n);
}

/* Reads what is there (non-blocking); at_end: the rest, even unterminated. */
static void relay_read(relay *r, bool at_end) {
  for (;;) {
    ssize_t got = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
    if (got > 0) {
      r->len += (size_t)got;
      size_t start = 0;
      for (size_t i = 0; i < r->len; i++)
        if (r->buf[i] == '\n' || r->buf[i] == '\r') {
          relay_line(r, r->buf + start, i + 1 - start);
          start = i + 1;
        }
      if (start == 0 && r->len == sizeof r->buf) {
        relay_line(r, r->buf, r->len);
        start = r->len;
      }
      memmove(r->buf, r->buf + start, r->len - start);
      r->len -= start;
      continue;
    }
    if (got < 0 && errno == EINTR)
      continue;
    if (got == 0 || at_end) {
      if (r->len)
        relay_line(r, r->buf, r->len);
      r->len = 0;
      if (r->blank)
        write_all(r->to, "\n", 1);
      r->blank = false;
      if (got == 0) {
        close(r->fd);
        r->fd = -1;
      }
    }
    return;
  }
}

static void relay_all(bool at_end) {
  for (int i = 0; i < RELAY_MAX; i++)
    if (relays[i].fd >= 0)
      relay_read(&relays[i], at_end);
}

/* A pipe for a launcher about to start: its write end, -1 when none.
 * to: where the lines that are not the launcher's go. */
static int relay_open(int *read_end, int to) {
  *read_end = -1;
  int p[2];
  if (pipe(p) != 0)
    return -1;
  for (int i = 0; i < RELAY_MAX; i++)
    if (relays[i].fd < 0) {
      fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
      fcntl(p[0], F_SETFD, FD_CLOEXEC);
      relays[i].fd = p[0];
      relays[i].to = to;
      relays[i].len = 0;
      relays[i].in_banner = relays[i].in_trace = relays[i].blank = false;
      relays[i].head = false;
      *read_end = p[0];
      return p[1];
    }
  close(p[0]);
  close(p[1]);
  return -1;
}

static int relay_fds(struct pollfd *fds, int max) {
  int k = 0;
  for (int i = 0; i < RELAY_MAX && k < max; i++)
    if (relays[i].fd >= 0) {
      fds[k].fd = relays[i].fd;
      fds[k].events = POLLIN;
      fds[k].revents = 0;
      k++;
    }
  return k;
}

/* After loom run stopped the ranks of a failed attempt, the launcher should
 * exit at once; one still there after this long (tearing down remote ranks,
 * say) is killed with its session. */
#define FAIL_GRACE_S 2.0
#define MAX_WATCH_FDS 512

/* Whether argv[0] is an MPI launcher (mpirun, mpiexec and their kin). */
static bool is_mpi_launcher(const char *prog) {
  const char *base = strrchr(prog, '/');
  base = base ? base + 1 : prog;
  return strncmp(base, "mpirun", 6) == 0 || strncmp(base, "mpiexec", 7) == 0;
}

/* If loom run dies (SIGKILL), the kernel sends the launcher SIGTERM
 * (PR_SET_PDEATHSIG) and mpirun stops its ranks. But mpirun sometimes hangs
 * in that teardown for good once its parent is gone (seen here about 1 time
 * in 20 under load), and a program that is no MPI rank does not die with
 * mpirun. So an MPI launcher gets a guard: a small process forked into its
 * session just before the exec, holding pidfds of loom run and of the
 * launcher. When the launcher ends, the guard leaves; when loom run dies
 * first, the guard gives the launcher 3 s and then SIGKILLs whatever is
 * left of the session, itself last. */
static void start_guard(pid_t loom_pid) {
  pid_t launcher = getpid();
  pid_t g = fork();
  if (g != 0)
    return; /* the launcher (or no guard: fork failed) */
  int lfd = (int)syscall(SYS_pidfd_open, loom_pid, 0);
  int mfd = (int)syscall(SYS_pidfd_open, launcher, 0);
  for (int fd = 0; fd < 1024; fd++)
    if (fd != lfd && fd != mfd)
      close(fd);
  if (lfd < 0 || mfd < 0)
    _exit(0);
  struct pollfd p[2] = {{.fd = lfd, .events = POLLIN},
                        {.fd = mfd, .events = POLLIN}};
  while (poll(p, 2, -1) < 0 && errno == EINTR) {
  }
  if (p[1].revents || !p[0].revents)
    _exit(0); /* the launcher ended: nothing to guard */
  p[1].revents = 0;
  poll(&p[1], 1, 3000);
  signal_session(getsid(0), SIGKILL);
  _exit(0);
}

pid_t loom_run_start(char *const *argv, bool verbose) {
  if (!argv || !argv[0]) {
    fprintf(stderr, "loom run: no program to start\n");
    return -1;
  }
  install_handlers();
#ifdef __linux__
  /* Orphans of the job become our children, not PID 1's: they are reaped
   * at once and cannot escape the sweep below. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
  if (verbose) {
    fprintf(stderr, "loom run:");
    for (char *const *a = argv; *a; a++)
      fprintf(stderr, " %s", *a);
    fprintf(stderr, "\n");
  }
  fflush(stdout);
  fflush(stderr);
  int read_end, out_read_end = -1;
  /* An MPI launcher's words are read (hydra's name the signal a rank died
   * from) and, with a log, kept off the console. */
  bool mpi = is_mpi_launcher(argv[0]);
  int err_w =
      mpi || launcher_log_path[0] ? relay_open(&read_end, STDERR_FILENO) : -1;
  int out_w = mpi ? relay_open(&out_read_end, STDOUT_FILENO) : -1;
  launcher_said_signal = 0;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "loom run: fork: %s\n", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    if (err_w >= 0) {
      dup2(err_w, STDERR_FILENO);
      close(err_w);
    }
    if (out_w >= 0) {
      dup2(out_w, STDOUT_FILENO);
      close(out_w);
    }
    /* A session of its own: the terminal's signals reach loom run only
     * (which forwards them once), and every process of the job, whatever
     * its process group, can be found and stopped afterwards. */
    setsid();
#ifdef __linux__
    /* If loom run itself is killed (SIGKILL from a CI timeout), the launcher
     * is told to stop, and takes its ranks down. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      _exit(128 + SIGTERM);
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
      sigaction(stop_signals[i], &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
    /* The job must not compete with the shell for the terminal's input;
     * pipes and files are passed on. */
    if (isatty(STDIN_FILENO)) {
      int fd = open("/dev/null", O_RDONLY);
      if (fd >= 0) {
        dup2(fd, STDIN_FILENO);
        close(fd);
      }
    }
    if (is_mpi_launcher(argv[0]))
      start_guard(parent);
    execvp(argv[0], argv);
    fprintf(stderr, "loom run: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  if (err_w >= 0)
    close(err_w);
  if (out_w >= 0)
    close(out_w);
  (void)read_end;
  (void)out_read_end;
  return pid;
}

int loom_run_spawn(char *const *argv, double timeout_s, bool verbose,
                   loom_run_watch *watch, loom_run_result *res) {
  if (watch)
    watch->prog.t_spawn = loom_time_wall();
  pid_t pid = loom_run_start(argv, verbose);
  if (pid < 0) {
    memset(res, 0, sizeof *res);
    return -1;
  }
  return loom_run_wait(pid, timeout_s, watch, res);
}

/* The launcher is gone: first what the ranks did by themselves (the ends
 * queued so far), then whatever is left is loom run's to stop. */
static void watch_before_sweep(loom_run_watch *watch, struct pollfd *fds) {
  int nfds = loom_watch_fds(watch, fds, MAX_WATCH_FDS);
  poll(fds, (nfds_t)nfds, 0);
  loom_watch_update(watch, fds, nfds, loom_time_wall(), false);
  loom_watch_mark_stopped(watch);
}

/* Everything of the attempt is gone now: the last verdicts, with the
 * launcher's exit status as evidence. */
/* The launcher's exit code as loom run reads it: 128 + signal when a rank
 * died from one, also under hydra, which exits with the signal's number
 * (told apart from a rank's exit(9) by its banner). */
static int launcher_exit_code(int status) {
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  if (!WIFEXITED(status))
    return -1;
  int code = WEXITSTATUS(status);
  if (launcher_said_signal > 0 && code == launcher_said_signal)
    return 128 + code;
  return code;
}

static void watch_after_sweep(loom_run_watch *watch, int status) {
  double wall = loom_time_wall();
  loom_watch_update(watch, NULL, 0, wall, true);
  loom_watch_settle(watch, launcher_exit_code(status));
  if (watch->fail.found)
    watch->fail.t_stopped = wall;
  if (watch->want_progress && watch->on_first_step &&
      loom_watch_progress(watch))
    watch->on_first_step(watch->ctx, &watch->prog);
}

int loom_run_wait(pid_t pid, double timeout_s, loom_run_watch *watch,
                  loom_run_result *res) {
  memset(res, 0, sizeof *res);
  res->launcher_pid = pid;
  n_said = 0;
  said_any = false;
  install_handlers();
  double t0 = loom_time_now();
  int status = 0;
  int forwarded = 0;    /* stop signals forwarded so far */
  double stop_at = 0;   /* when we first asked the job to stop */
  int pending_stop = 0; /* a stop signal not handed on yet */
  bool killed = false;
  double fail_at = 0; /* when a rank's failure was seen */
  static struct pollfd fds[1 + MAX_WATCH_FDS];
  int nfds = 0; /* rank pidfds in fds[1..] */
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid)
      break;
    if (w < 0 && errno != EINTR) {
      status = 0;
      break;
    }
    double now = loom_time_now();
    if (standby_pid > 0 && !standby_gone)
      loom_run_standby_alive(); /* reaps it, if it ended */
    if (watch) {
      /* A job stopping on a signal or its time limit winds down by itself
       * (each rank saving its checkpoint): its exits are no failure. */
      if (loom_watch_update(watch, fds + 1, nfds, loom_time_wall(), false) &&
          fail_at == 0 && !stop_sig && !res->timed_out) {
        /* Stop the rest now rather than wait for the launcher to notice. */
        fail_at = now;
        watch->fail.stopped = loom_watch_stop_others(watch);
      }
      if (watch->want_progress && watch->on_first_step &&
          loom_watch_progress(watch))
        watch->on_first_step(watch->ctx, &watch->prog);
      if (fail_at > 0 && !killed && now - fail_at > FAIL_GRACE_S) {
        signal_session(pid, SIGKILL);
        killed = true;
      }
    }
    if (timeout_s > 0 && !res->timed_out && now - t0 > timeout_s) {
      res->timed_out = true;
      fprintf(stderr,
              "loom run: time limit of %g s reached; stopping the "
              "job\n",
              timeout_s);
      pending_stop = SIGTERM;
      stop_at = now;
    }
    if (stop_sig && forwarded < stop_count) {
      /* The first signal is passed on (mpirun stops its ranks); a second
       * one kills the whole session at once. */
      if (forwarded == 0) {
        if (!pending_stop)
          pending_stop = stop_sig;
        stop_at = now;
      } else if (!killed) {
        signal_session(pid, SIGKILL);
        killed = true;
      }
      forwarded = stop_count;
    }
    if (pending_stop && !killed &&
        stop_job(pid, watch, pending_stop, now - stop_at))
      pending_stop = 0;
    if (stop_at > 0 && !killed && now - stop_at > stop_grace_s) {
      fprintf(stderr,
              "loom run: the job did not stop within %g s (--stop-grace); "
              "killing it\n",
              stop_grace_s);
      signal_session(pid, SIGKILL);
      killed = true;
    }
    /* Sleep until a signal (SIGCHLD: the launcher exited), a rank's death,
     * or the next look at the status files. */
    fds[0].fd = wake_pipe[0];
    fds[0].events = POLLIN;
    fds[0].revents = 0;
    nfds =
        watch ? loom_watch_fds(watch, fds + 1, MAX_WATCH_FDS - RELAY_MAX) : 0;
    int nrel = relay_fds(fds + 1 + nfds, RELAY_MAX);
    double wait_s = 0.2;
    if (watch && loom_watch_scanning(watch))
      wait_s = 0.05;
    if (fail_at > 0)
      wait_s = 0.01;
    if (poll(fds, (nfds_t)1 + (nfds_t)nfds + (nfds_t)nrel,
             (int)(wait_s * 1000)) > 0 &&
        fds[0].revents)
      drain();
    if (nrel)
      relay_all(false);
  }
  if (watch)
    watch_before_sweep(watch, fds + 1);
  /* Ranks that escaped mpirun's own clean-up (or a program's children). */
  sweep_session(pid);
  relay_all(true);
  if (watch)
    watch_after_sweep(watch, status);
  res->seconds = loom_time_now() - t0;
  res->stopped_by = stop_sig;
  if (WIFSIGNALED(status)) {
    res->signal = WTERMSIG(status);
    /* Not the launcher's own death when loom run killed the session or
     * passed a stop on. (Under -n 1 the launcher is the rank, which loom
     * run may kill on its way out after it recorded its exit: the
     * supervisor never blames a launcher there. A rank seen failing first
     * does not clear it: killing MPICH's mpiexec takes its ranks down
     * before loom run sees the launcher go.) */
    res->launcher_killed = !killed && !forwarded && !res->timed_out;
    res->code = 128 + res->signal;
  } else if (WIFEXITED(status)) {
    res->code = launcher_exit_code(status);
  }
  if (res->timed_out)
    res->code = 124;
  else if (stop_sig)
    res->code = 128 + stop_sig;
  return 0;
}
