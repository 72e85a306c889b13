/* loom train --find-batch-size: the largest train.batch_size that trains
 * within a memory budget. The estimate (loom estimate) gives an upper
 * bound; then real training steps, each in a fresh `loom train` process
 * (its peak resident set is its own, and running out of memory kills only
 * it), at 1, 2, 4, ... (times parallel.micro_batches) up to the bound,
 * then bisecting between the last
 * size that fit and the first that did not. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_init(&at);
  sigset_t none; /* the stop signals are blocked here; not in the trial */
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
  pid_t pid;
  int err = posix_spawn(&pid, "/proc/self/exe", &fa, &at, (char *const *)argv,
                        environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  loom_free(argv);
  if (err != 0) {
    snprintf(t->why, sizeof t->why, "cannot start loom train: %s",
             strerror(err));
    return;
  }
  /* Waits, passing a stop (Ctrl-C, SIGTERM to this process) on to the
   * trial, which then stops at its next step. */
  int status = 0;
  bool told = false;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR))
      break;
    if (loom_trainer_stop_requested() && !told) {
      kill(pid, SIGTERM);
      told = true;
    }
    struct timespec ts = {0, 20 * 1000000};
    nanosleep(&ts, NULL);
  }
  if (told || loom_trainer_stop_requested() ||
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

/* What the trials wrote: the directory, b<N> run directories holding
 * metrics.jsonl, config.yaml, env.json and the run's .lock, and b<N>.log.
 * Nothing else is removed (nor followed). */
static bool trial_name(const char *name, bool is_dir, int depth, void *ctx) {
  (void)ctx;
  if (depth == 0)
    return is_dir && strncmp(name, "loom-find-batch-", 16) == 0;
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

static void remove_trials(const char *dir) {
  const char *slash = strrchr(dir, '/');
  char parent[512];
  snprintf(parent, sizeof parent, "%.*s", (int)(slash - dir), dir);
  int fd = open(parent[0] ? parent : "/", O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return;
  (void)loom_fs_remove_own(fd, slash + 1, dir, trial_name, NULL, NULL);
  close(fd);
}

/* A stop (Ctrl-C, SIGTERM) ends the search without an answer. */
static int stopped(const char *dir) {
  remove_trials(dir);
  printf("stopped: no answer\n");
  return 128 + SIGINT;
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
  fflush(stdout);
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

int loom_cli_find_batch_run(const char *config_path, const char *const *sets,
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
  if (!mkdtemp(dir)) {
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
