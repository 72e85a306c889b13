/* loom train --find-batch-size: the largest train.batch_size that trains
 * within a memory budget. The estimate (loom estimate) gives an upper
 * bound; then real training steps, each in a fresh `loom train` process
 * (its peak resident set is its own, and running out of memory kills only
 * it), at 1, 2, 4, ... (times parallel.micro_batches) up to the bound,
 * then bisecting between the last
 * size that fit and the first that did not. */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "loom/train.h"

extern char **environ;

/* What one trial measured. */
typedef struct trial {
  int64_t batch;
  bool ran;          /* the process trained and wrote its metrics */
  bool stopped;      /* a stop signal ended it (or the search) */
  bool refused;      /* loom train refused its config or data (exit 2) */
  double peak_mib;   /* its peak resident set */
  double throughput; /* samples/s or tokens/s of its last steps */
  char why[800];     /* when it did not run */
} trial;

/* A line of /proc/meminfo ("MemAvailable:") in bytes (0 when unknown). */
static double meminfo(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  double kib = 0;
  size_t k = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, k) == 0) {
      char *end = NULL;
      kib = strtod(line + k, &end);
      if (end == line + k || !(kib > 0))
        kib = 0;
      break;
    }
  fclose(f);
  return kib * 1024.0;
}

static double mem_available(void) { return meminfo("MemAvailable:"); }
double loom_cli_mem_total(void) { return meminfo("MemTotal:"); }

/* The last metrics line's number for key, or -1. */
static double last_number(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  char line[4096], pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  double v = -1;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, pat);
    if (p)
      v = strtod(p + strlen(pat), NULL);
  }
  fclose(f);
  return v;
}

/* The last non-empty line of a file, without its newline, in out. */
static void last_line(const char *path, char *out, size_t cap) {
  snprintf(out, cap, "(no message; %s is empty)", path);
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  char line[800];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (line[0])
      snprintf(out, cap, "%s", line);
  }
  fclose(f);
}

/* Set once stdout is a pipe whose reader is gone (`... | head -2`): the
 * search ends as a stop does, its trial stopped and its directory removed
 * (SIGPIPE is ignored meanwhile, so the write fails with EPIPE instead of
 * killing the finder before it can clean up). */
static bool out_gone;

/* Whether stdout's reader is gone: a write would fail (EPIPE). A pipe
 * without a reader polls POLLERR; a file or terminal never does. */
static bool stdout_closed(void) {
  if (!out_gone) {
    struct pollfd p = {.fd = STDOUT_FILENO, .events = 0};
    out_gone = poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
  }
  return out_gone;
}

/* fflush(stdout), noting a reader that is gone. */
static void flush_out(void) {
  if (fflush(stdout) != 0 && errno == EPIPE)
    out_gone = true;
}

/* Starts argv (loom train) from this binary with stdout and stderr in
 * log_path. The trial dies with the finder (PR_SET_PDEATHSIG: SIGKILL,
 * its result being of no use to anyone then; before, a finder killed with
 * SIGKILL left its trial training on for minutes). Only async-signal-safe
 * calls between fork and exec: the stop-signal thread runs here. Returns
 * the pid, or -1 with errno (the child's, when its exec failed). */
static pid_t spawn_trial(const char *const *argv, const char *log_path) {
  int ep[2]; /* the child's errno when it cannot exec; closed by the exec */
  if (pipe2(ep, O_CLOEXEC) != 0)
    return -1;
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    close(ep[0]);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, NULL); /* ignored here; an exec keeps that */
    sigset_t none; /* the stop signals are blocked here; not in the trial */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* The signal comes when the thread that forked ends: this one, the
     * finder's main thread, which ends only with the process. A finder
     * gone before the prctl is seen by getppid. */
    int e = 0;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
      e = errno;
    else if (getppid() != parent)
      _exit(127);
    int fd =
        e ? -1
          : open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (fd < 0 && !e)
      e = errno;
    if (!e && ((fd != STDOUT_FILENO && dup2(fd, STDOUT_FILENO) < 0) ||
               dup2(STDOUT_FILENO, STDERR_FILENO) < 0))
      e = errno;
    if (!e && fd > STDERR_FILENO)
      close(fd);
    if (!e) {
      execve("/proc/self/exe", (char *const *)argv, environ);
      e = errno;
    }
    ssize_t w = write(ep[1], &e, sizeof e);
    (void)w;
    _exit(127);
  }
  int fe = errno;
  close(ep[1]);
  if (pid < 0) {
    close(ep[0]);
    errno = fe;
    return -1;
  }
  int ce = 0;
  ssize_t r;
  do
    r = read(ep[0], &ce, sizeof ce);
  while (r < 0 && errno == EINTR);
  close(ep[0]);
  if (r == (ssize_t)sizeof ce) { /* it did not exec */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    errno = ce;
    return -1;
  }
  return pid;
}

/* Runs `loom train` for a few steps at batch b in dir/b<b>. */
static void run_trial(const char *config_path, const char *const *sets,
                      int n_sets, const char *dir, trial *t) {
  char run_dir[600], bs[64], rd[640], log_path[700], metrics[700];
  snprintf(run_dir, sizeof run_dir, "%s/b%lld", dir, (long long)t->batch);
  snprintf(bs, sizeof bs, "train.batch_size=%lld", (long long)t->batch);
  snprintf(rd, sizeof rd, "log.run_dir=%s", run_dir);
  snprintf(log_path, sizeof log_path, "%s.log", run_dir);
  const char *fixed[] = {"train.steps=4",
                         "train.epochs=0",
                         "train.eval_every=0",
                         "log.every=2",
                         "log.progress=off",
                         "log.metrics=true",
                         "log.tensorboard=false",
                         "checkpoint.enabled=false",
                         bs,
                         rd};
  const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
  const char **argv =
      loom_calloc(2 * ((size_t)n_sets + (size_t)nfixed) + 8, sizeof *argv);
  if (!argv) {
    snprintf(t->why, sizeof t->why, "out of memory");
    return;
  }
  int n = 0;
  argv[n++] = "loom";
  argv[n++] = "train";
  argv[n++] = config_path;
  for (int i = 0; i < n_sets; i++) {
    argv[n++] = "--set";
    argv[n++] = sets[i];
  }
  for (int i = 0; i < nfixed; i++) {
    argv[n++] = "--set";
    argv[n++] = fixed[i];
  }
  argv[n++] = "--resume";
  argv[n++] = "never";
  argv[n++] = "--quiet";
  argv[n] = NULL;
  pid_t pid = spawn_trial(argv, log_path);
  int err = errno;
  loom_free(argv);
  if (pid < 0) {
    snprintf(t->why, sizeof t->why, "cannot start loom train: %s",
             strerror(err));
    return;
  }
  /* Waits, passing a stop (Ctrl-C, SIGTERM to this process, or stdout's
   * reader gone) on to the trial, which then stops at its next step. */
  int status = 0;
  bool told = false;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR))
      break;
    if (!told && (loom_trainer_stop_requested() || stdout_closed())) {
      kill(pid, SIGTERM);
      told = true;
    }
    struct timespec ts = {0, 20 * 1000000};
    nanosleep(&ts, NULL);
  }
  if (told || loom_trainer_stop_requested() || out_gone ||
      (WIFSIGNALED(status) &&
       (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM ||
        WTERMSIG(status) == SIGHUP)) ||
      (WIFEXITED(status) && (WEXITSTATUS(status) == 128 + SIGINT ||
                             WEXITSTATUS(status) == 128 + SIGTERM ||
                             WEXITSTATUS(status) == 128 + SIGHUP))) {
    t->stopped = true;
    snprintf(t->why, sizeof t->why, "stopped");
    return;
  }
  if (WIFSIGNALED(status)) {
    snprintf(t->why, sizeof t->why, "killed by signal %d%s", WTERMSIG(status),
             WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "");
    return;
  }
  if (WEXITSTATUS(status) == LOOM_EXIT_USAGE) {
    /* Its config or data, not its memory: the log (removed with the
     * trials) holds the reason, its last line. */
    t->refused = true;
    last_line(log_path, t->why, sizeof t->why);
    return;
  }
  if (WEXITSTATUS(status) != 0) {
    snprintf(t->why, sizeof t->why, "loom train failed (exit %d; see %s)",
             WEXITSTATUS(status), log_path);
    return;
  }
  snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
  t->peak_mib = last_number(metrics, "peak_rss_mb");
  t->throughput = last_number(metrics, "samples_per_s");
  if (t->throughput < 0)
    t->throughput = last_number(metrics, "tokens_per_s");
  t->ran = t->peak_mib > 0;
  if (!t->ran)
    snprintf(t->why, sizeof t->why, "no metrics in %s", metrics);
}

/* The trials' directory: TMPDIR/loom-find-batch-XXXXXX, locked (flock on
 * the directory itself) by its finder for the whole search before its
 * `owner` file (the finder's pid) is made. So a directory with an owner
 * that can be locked is one whose finder is gone (killed with SIGKILL),
 * and the next finder removes it; one without an owner (an older loom's,
 * or one being made) is never touched. */
#define TRIAL_DIR_PREFIX "loom-find-batch-"
#define TRIAL_DIR_OWNER "owner"

/* What the trials wrote: the directory, its owner file, b<N> run
 * directories holding metrics.jsonl, config.yaml, env.json and the run's
 * .lock, and b<N>.log. Nothing else is removed (nor followed). */
static bool trial_name(const char *name, bool is_dir, int depth, void *ctx) {
  (void)ctx;
  if (depth == 0)
    return is_dir && strncmp(name, TRIAL_DIR_PREFIX, 16) == 0;
  if (depth == 1 && !is_dir && strcmp(name, TRIAL_DIR_OWNER) == 0)
    return true;
  if (depth == 2)
    return !is_dir &&
           (strcmp(name, "metrics.jsonl") == 0 ||
            strcmp(name, "config.yaml") == 0 || strcmp(name, "env.json") == 0 ||
            strcmp(name, ".lock") == 0);
  if (depth != 1 || name[0] != 'b')
    return false;
  const char *p = name + 1;
  if (*p < '0' || *p > '9')
    return false;
  while (*p >= '0' && *p <= '9')
    p++;
  return is_dir ? *p == '\0' : strcmp(p, ".log") == 0;
}

/* The lock on this finder's directory (-1: none). */
static int trial_lock = -1;

static void remove_trials(const char *dir) {
  const char *slash = strrchr(dir, '/');
  char parent[512];
  snprintf(parent, sizeof parent, "%.*s", (int)(slash - dir), dir);
  int fd = open(parent[0] ? parent : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)loom_fs_remove_own(fd, slash + 1, dir, trial_name, NULL, NULL);
    close(fd);
  }
  if (trial_lock >= 0) /* held until its directory is gone */
    close(trial_lock);
  trial_lock = -1;
}

typedef struct stale_scan {
  int tfd;         /* TMPDIR */
  const char *tmp; /* its path, for messages */
} stale_scan;

/* One entry of TMPDIR: removed when it is a trials' directory of this
 * user with an owner file and no finder holding its lock. */
static bool remove_if_stale(const char *name, void *ctx) {
  const stale_scan *sc = ctx;
  if (strncmp(name, TRIAL_DIR_PREFIX, 16) != 0 || strlen(name) != 16 + 6)
    return true;
  struct stat st;
  if (fstatat(sc->tfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return true;
  int dfd =
      openat(sc->tfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return true;
  struct stat ost;
  /* held through the removal: a live finder cannot have it */
  if (fstatat(dfd, TRIAL_DIR_OWNER, &ost, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISREG(ost.st_mode) && flock(dfd, LOCK_EX | LOCK_NB) == 0) {
    char shown[1100];
    snprintf(shown, sizeof shown, "%s/%s", sc->tmp, name);
    int left = 0;
    if (loom_fs_remove_own(sc->tfd, name, shown, trial_name, NULL, &left) ==
            LOOM_OK &&
        left == 0)
      LOOM_INFO("removed %s, the trials of a --find-batch-size that is gone",
                shown);
  }
  close(dfd);
  return true;
}

/* The trials' directories of finders that died without removing theirs
 * (SIGKILL): their trials died with them (PR_SET_PDEATHSIG). */
static void remove_stale_trials(const char *tmp) {
  stale_scan sc = {open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC), tmp};
  if (sc.tfd < 0)
    return;
  (void)loom_fs_each_entry(sc.tfd, ".", false, remove_if_stale, &sc);
  close(sc.tfd);
}

/* Makes dir (a mkdtemp template), takes its lock and then writes its
 * owner file; false with errno on failure (the directory removed). */
static bool make_trial_dir(char *dir) {
  if (!mkdtemp(dir))
    return false;
  int e = 0;
  trial_lock = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (trial_lock < 0 || flock(trial_lock, LOCK_EX | LOCK_NB) != 0)
    e = errno;
  int fd =
      e ? -1
        : openat(trial_lock, TRIAL_DIR_OWNER,
                 O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (!e && fd < 0)
    e = errno;
  if (fd >= 0) {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (loom_fs_write_all(fd, pid, (size_t)n) != 0)
      e = errno;
    close(fd);
  }
  if (e) {
    remove_trials(dir);
    errno = e;
    return false;
  }
  return true;
}

/* A stop ends the search without an answer, its exit code as loom
 * train's: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM, 129 for
 * SIGHUP). A stdout whose reader is gone (`| head`) ends it as SIGPIPE
 * would have, 141, silently, but with its trial stopped and its directory
 * removed. */
static int stopped(const char *dir) {
  remove_trials(dir);
  const bool gone = out_gone || stdout_closed();
  if (!gone) {
    printf("stopped: no answer\n");
    flush_out();
  }
  /* a signal first: Ctrl-C on `loom train ... | head` closes the pipe too */
  const int sig = loom_trainer_stop_signal();
  if (sig > 0)
    return 128 + sig;
  return 128 + (gone ? SIGPIPE : SIGINT);
}

/* A trial whose config or data loom train refused (exit 2) ends the
 * search with its reason: it says nothing about memory, and every other
 * size would be refused alike. */
static int refused(const char *dir, const trial *t) {
  remove_trials(dir);
  fprintf(stderr,
          "loom train: --find-batch-size: the trial at train.batch_size "
          "%lld was refused: %s\n",
          (long long)t->batch, t->why);
  return LOOM_EXIT_USAGE;
}

/* bytes as "512 MiB", "1 KiB", "1.5 KiB", "100 bytes": MiB from 1 MiB
 * (the table's unit), below it KiB or bytes. */
static const char *size_str(double bytes, char *buf, size_t cap) {
  if (bytes >= 1024.0 * 1024.0)
    snprintf(buf, cap, "%.0f MiB", bytes / (1024.0 * 1024.0));
  else if (bytes >= 1024.0)
    snprintf(buf, cap, "%.4g KiB", bytes / 1024.0);
  else
    snprintf(buf, cap, "%.0f bytes", bytes);
  return buf;
}

/* A trial fits when it ran and its peak is within the budget. */
static bool fits(const trial *t, double budget_mib) {
  return t->ran && t->peak_mib <= budget_mib;
}

/* The estimate's total at batch b, in MiB (0 when it fails). */
static double estimate_mib(loom_config *cfg, int64_t b) {
  loom_train_estimate e;
  cfg->train.batch_size = b;
  if (loom_train_estimate_memory(cfg, 1, cfg->parallel.strategy, &e) != LOOM_OK)
    return 0;
  return e.total_bytes / (1024.0 * 1024.0);
}

static void print_trial(const trial *t, double est_mib, double budget_mib,
                        const char *unit) {
  if (t->ran)
    printf("%10lld %12.1f %12.1f %14.1f %s  %s\n", (long long)t->batch, est_mib,
           t->peak_mib, t->throughput, unit,
           fits(t, budget_mib) ? "fits" : "too big");
  else
    printf("%10lld %12.1f %12s %14s %s  %s\n", (long long)t->batch, est_mib,
           "-", "-", unit,
           t->refused ? "refused by loom train (exit 2): its reason below"
                      : t->why);
  flush_out();
}

/* The variable that says this process was started by loom run or an MPI
 * launcher, or NULL. */
static const char *launcher(void) {
  static const char *const launched[] = {"LOOM_RUN_DIR", "OMPI_COMM_WORLD_SIZE",
                                         "PMI_SIZE", "PMI_RANK"};
  for (size_t i = 0; i < sizeof launched / sizeof launched[0]; i++)
    if (getenv(launched[i]))
      return launched[i];
  return NULL;
}

/* An integer from the first of the variables that is set, else dflt. */
static int env_int(const char *const *names, int n, int dflt) {
  for (int i = 0; i < n; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) {
      char *end = NULL;
      long x = strtol(v, &end, 10);
      if (*end == '\0' && x >= 0 && x < 1 << 20)
        return (int)x;
    }
  }
  return dflt;
}

int loom_cli_auto_batch(const char *config_path, const char *const *sets,
                        int n_sets, const char *memory, loom_config *cfg) {
  double given = 0;
  if (memory && !loom_cli_parse_bytes(memory, &given)) {
    fprintf(stderr, "loom train: --memory %s: expected bytes, as 8G or 512M\n",
            memory);
    return LOOM_EXIT_USAGE;
  }
  if (!launcher()) {
    /* On its own: the finder's real steps, their table on stdout. */
    int64_t b = 0;
    int rc = loom_cli_find_batch_run(config_path, sets, n_sets, memory, &b);
    if (rc != LOOM_EXIT_OK)
      return rc;
    cfg->train.batch_size = b;
    printf("train.batch_size auto: %lld (the finder's trials above)\n",
           (long long)b);
    return LOOM_EXIT_OK;
  }
  /* Under a launcher every rank must come to the same answer without
   * talking: the estimate, for 80% of the host's memory (MemTotal, which
   * does not move) shared by the host's ranks. */
  static const char *const world_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "MPI_LOCALNRANKS"};
  static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK"};
  int world = env_int(world_vars, 2, 1);
  int local = env_int(local_vars, 2, world);
  int rank = env_int(rank_vars, 2, 0);
  double total = meminfo("MemTotal:");
  if (world < 1 || local < 1 || !(total > 0)) {
    fprintf(stderr, "loom train: train.batch_size auto: cannot tell the "
                    "host's memory or its ranks\n");
    return LOOM_EXIT_FAIL;
  }
  /* The rules loom train would refuse the job by at start-up: exit 2
   * now, not a batch sized for a job that cannot start. */
  if (loom_train_check_world(cfg, world) != LOOM_OK) {
    fprintf(stderr, "loom train: %s\n", loom_last_error());
    return LOOM_EXIT_USAGE;
  }
  double budget = memory ? given : 0.8 * total / local;
  if (budget > total / local) { /* as the finder: not beyond the host */
    if (rank == 0)
      printf("train.batch_size auto: --memory %s is more than this host's "
             "memory over its %d rank(s): the budget is MemTotal / %d\n",
             memory, local, local);
    budget = total / local;
  }
  int64_t b = 0;
  loom_status st = loom_cli_largest_batch(cfg, world, cfg->parallel.strategy,
                                          budget, &b, NULL, NULL);
  if (st != LOOM_OK || b < 1) {
    fprintf(stderr, "loom train: train.batch_size auto: %s\n",
            st != LOOM_OK ? loom_last_error()
                          : "not even 1 row fits by loom estimate");
    return LOOM_EXIT_FAIL;
  }
  cfg->train.batch_size = b;
  if (rank == 0)
    printf("train.batch_size auto: %lld (loom estimate for %d rank(s), "
           "%.0f MiB each: %s)\n",
           (long long)b, world, budget / (1024.0 * 1024.0),
           memory ? "--memory" : "80% of MemTotal over the host's ranks");
  return LOOM_EXIT_OK;
}

int loom_cli_find_batch(const char *config_path, const char *const *sets,
                        int n_sets, const char *memory) {
  int64_t b = 0;
  return loom_cli_find_batch_run(config_path, sets, n_sets, memory, &b);
}

static int find_batch_search(const char *config_path, const char *const *sets,
                             int n_sets, const char *memory, int64_t *answer);

int loom_cli_find_batch_run(const char *config_path, const char *const *sets,
                            int n_sets, const char *memory, int64_t *answer) {
  /* A closed stdout is an EPIPE to notice (out_gone), not a SIGPIPE that
   * ends the finder before it stops its trial and removes its directory. */
  struct sigaction ign, old;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  bool restore = sigaction(SIGPIPE, &ign, &old) == 0;
  out_gone = false;
  int rc = find_batch_search(config_path, sets, n_sets, memory, answer);
  if (restore)
    sigaction(SIGPIPE, &old, NULL);
  return rc;
}

static int find_batch_search(const char *config_path, const char *const *sets,
                             int n_sets, const char *memory, int64_t *answer) {
  *answer = 0;
  /* One rank, on its own: under a launcher the trials would take the
   * rank's identity (its MPI world, its status file). */
  const char *l = launcher();
  if (l) {
    fprintf(stderr,
            "loom train: --find-batch-size runs on its own, not under "
            "loom run or an MPI launcher (%s is set)\n",
            l);
    return LOOM_EXIT_USAGE;
  }
  double budget = 0;
  if (memory && !loom_cli_parse_bytes(memory, &budget)) {
    fprintf(stderr, "loom train: --memory %s: expected bytes, as 8G or 512M\n",
            memory);
    return LOOM_EXIT_USAGE;
  }
  if (!memory)
    budget = 0.9 * mem_available();
  if (!(budget > 0)) {
    fprintf(stderr, "loom train: --find-batch-size: no --memory given and "
                    "/proc/meminfo has no MemAvailable\n");
    return LOOM_EXIT_USAGE;
  }
  loom_config cfg;
  loom_status st = loom_config_load(&cfg, config_path, sets, n_sets);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom: %s\n", loom_last_error());
    return st == LOOM_ERR_CONFIG ? LOOM_EXIT_USAGE : LOOM_EXIT_FAIL;
  }
  /* The trials run one rank; a pipeline or a tp group needs several. */
  if (cfg.parallel.pp > 1 || cfg.parallel.tp > 1) {
    const bool pp = cfg.parallel.pp > 1;
    fprintf(
        stderr,
        "loom train: --find-batch-size is refused with parallel.%s "
        "%lld: its trials run one rank (loom estimate -n N --set "
        "parallel.%s=%lld --memory BYTES gives the largest "
        "train.batch_size the estimate fits)\n",
        pp ? "pp" : "tp", (long long)(pp ? cfg.parallel.pp : cfg.parallel.tp),
        pp ? "pp" : "tp", (long long)(pp ? cfg.parallel.pp : cfg.parallel.tp));
    return LOOM_EXIT_USAGE;
  }
  /* The trials run one rank: what loom train refuses on one. */
  st = loom_train_check_world(&cfg, 1);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom train: --find-batch-size: %s\n", loom_last_error());
    return LOOM_EXIT_USAGE;
  }
  /* No budget beyond the machine: a trial sized for it would only meet
   * the OOM killer (or swap). */
  const double total = loom_cli_mem_total();
  if (total > 0 && budget > total) {
    char total_s[32];
    printf("# --memory %s is more than this machine's memory: the budget is "
           "MemTotal, %s\n",
           memory, size_str(total, total_s, sizeof total_s));
    budget = total;
  }
  const double mib = 1024.0 * 1024.0, budget_mib = budget / mib;
  /* No trial the estimate puts above twice the budget, nor above the
   * machine's memory. */
  const double limit_mib =
      total > 0 && total / mib < 2 * budget_mib ? total / mib : 2 * budget_mib;
  const char *limit_why = limit_mib < 2 * budget_mib
                              ? "the machine's memory (MemTotal)"
                              : "twice the budget";
  char budget_s[32];
  size_str(budget, budget_s, sizeof budget_s);
  int64_t bound = 0;
  st = loom_cli_largest_batch(&cfg, 1, cfg.parallel.strategy, budget, &bound,
                              NULL, NULL);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom train: --find-batch-size: %s\n", loom_last_error());
    return st == LOOM_ERR_CONFIG ? LOOM_EXIT_USAGE : LOOM_EXIT_FAIL;
  }
  const bool text = cfg.model.name == LOOM_CFG_MODEL_GPT;
  const char *unit = text ? "tokens/s" : "samples/s";
  printf("# %s: largest train.batch_size within %s (%s), one rank\n",
         config_path, budget_s,
         !memory                        ? "90% of MemAvailable"
         : total > 0 && budget == total ? "--memory, capped at MemTotal"
                                        : "--memory");
  printf("# the estimate allows %lld; trying real steps (4 each, in their "
         "own process)\n",
         (long long)bound);
  printf("%10s %12s %12s %14s\n", "batch", "estimate MiB", "peak MiB",
         "throughput");
  if (bound == 0) {
    printf("nothing fits: even %lld row%s need%s more than %s by the "
           "estimate\n",
           (long long)(cfg.parallel.micro_batches > 1
                           ? cfg.parallel.micro_batches
                           : 1),
           cfg.parallel.micro_batches > 1 ? "s" : "",
           cfg.parallel.micro_batches > 1 ? "" : "s", budget_s);
    return LOOM_EXIT_FAIL;
  }
  const char *tmpdir = getenv("TMPDIR");
  char dir[512];
  snprintf(dir, sizeof dir, "%s/loom-find-batch-XXXXXX",
           tmpdir && *tmpdir ? tmpdir : "/tmp");
  remove_stale_trials(tmpdir && *tmpdir ? tmpdir : "/tmp");
  if (!make_trial_dir(dir)) {
    fprintf(stderr, "loom train: cannot make a temporary directory %s: %s\n",
            dir, strerror(errno));
    return LOOM_EXIT_FAIL;
  }
  int64_t good = 0, bad = 0; /* largest that fit, smallest that did not */
  int tried = 0;
  /* Every size a multiple of parallel.micro_batches (the micro-batches
   * have the same rows), as loom estimate --memory answers. */
  const int64_t m =
      cfg.parallel.micro_batches > 1 ? cfg.parallel.micro_batches : 1;
  /* Doubling on real steps. The estimate counts address space a run may
   * never touch (an input gradient nobody reads), so it can say no where
   * a real step fits: it only stops sizes it puts above twice the budget
   * (or the machine's memory), which no trial should be allowed to
   * reach. */
  for (int64_t b = m; b <= (1 << 24); b *= 2) {
    double est = estimate_mib(&cfg, b);
    if (b > m && (est > limit_mib || est == 0)) {
      printf("%10lld %12.1f %12s %14s %s  not tried: the estimate is over "
             "%s\n",
             (long long)b, est, "-", "-", unit, limit_why);
      bad = b;
      break;
    }
    trial t = {.batch = b};
    run_trial(config_path, sets, n_sets, dir, &t);
    if (t.stopped)
      return stopped(dir);
    print_trial(&t, est, budget_mib, unit);
    if (out_gone)
      return stopped(dir);
    if (t.refused)
      return refused(dir, &t);
    tried++;
    if (!fits(&t, budget_mib)) {
      bad = b;
      break;
    }
    good = b;
  }
  /* Bisect on real steps, to within 1/32 of the answer. */
  while (bad && bad - good > m && (bad - good) * 32 > good && tried < 24) {
    trial t = {.batch = good + (bad - good) / m / 2 * m};
    double est = estimate_mib(&cfg, t.batch);
    if (est > limit_mib || est == 0) { /* not tried, as above */
      printf("%10lld %12.1f %12s %14s %s  not tried: the estimate is over "
             "%s\n",
             (long long)t.batch, est, "-", "-", unit, limit_why);
      bad = t.batch;
      continue;
    }
    run_trial(config_path, sets, n_sets, dir, &t);
    if (t.stopped)
      return stopped(dir);
    print_trial(&t, est, budget_mib, unit);
    if (out_gone)
      return stopped(dir);
    if (t.refused)
      return refused(dir, &t);
    tried++;
    if (fits(&t, budget_mib))
      good = t.batch;
    else
      bad = t.batch;
  }
  remove_trials(dir);
  if (good == 0) {
    printf("nothing fits: batch %lld did not train within %s\n", (long long)m,
           budget_s);
    return LOOM_EXIT_FAIL;
  }
  printf("largest train.batch_size that fits: %lld\n", (long long)good);
  *answer = good;
  return LOOM_EXIT_OK;
}
