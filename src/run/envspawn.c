/* `loom run --nnodes`: on each host, loom run supervises this launcher,
 * which starts the host's L ranks with torchrun's variables (LOOM_INIT=
 * env://, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE) and behaves as mpirun does for loom run: it passes
 * stop signals on, ends the others when one rank fails, and exits with the
 * first failing rank's code (128 + its signal for one killed).
 *   loom run --env-ranks L FIRST WORLD ADDR PORT -- PROGRAM [ARGS...] */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/core.h"
#include "loom/run.h"

#define MAX_LOCAL 1024

static pid_t kids[MAX_LOCAL]; /* -1 once reaped */
static pid_t pids[MAX_LOCAL];
static int nkids;
static volatile sig_atomic_t got_sig;

static void pass_on(int sig) {
  got_sig = sig;
  for (int i = 0; i < nkids; i++)
    if (kids[i] > 0)
      kill(kids[i], sig);
}

/* The failure a rank recorded in its status file (LOOM_RUN_DIR) before it
 * ended: its code (128 + a fatal signal) and when; 0 when none. */
static int recorded_failure(int rank, pid_t pid, double *t) {
  const char *dir = getenv("LOOM_RUN_DIR");
  loom_runstat_record rec;
  if (!dir || !*dir || loom_runstat_read(dir, rank, &rec) != LOOM_OK ||
      rec.pid != (int)pid)
    return 0;
  *t = rec.t_exit;
  if (rec.signal > 0)
    return 128 + rec.signal;
  return rec.exit_code > 0 ? rec.exit_code : 0;
}

/* The first failure among this host's ranks when local rank i is the
 * first seen to fail with code *c: a rank killed from outside (loom run
 * SIGKILLs every rank here once one says it failed, in case that one hangs
 * on its way out) gives way to the rank whose record says it failed first,
 * with that rank's own code. Returns the local index. */
static int first_failure(int i, bool signalled, int first, int *c) {
  double t = 0;
  int rc = recorded_failure(first + i, pids[i], &t);
  if (rc) {
    *c = rc;
    return i;
  }
  if (!signalled)
    return i;
  int who = i;
  double best = 0;
  for (int k = 0; k < nkids; k++) {
    double tk = 0;
    int ck = recorded_failure(first + k, pids[k], &tk);
    if (ck && (who == i || tk < best)) {
      who = k;
      best = tk;
      *c = ck;
    }
  }
  return who;
}

static int num(const char *s, int lo, int hi) {
  char *end = NULL;
  long v = s ? strtol(s, &end, 10) : -1;
  return s && *s && !*end && v >= lo && v <= hi ? (int)v : -1;
}

int loom_run_env_ranks(int argc, char **argv);
int loom_run_env_ranks(int argc, char **argv) {
  if (argc < 8 || strcmp(argv[6], "--") != 0) {
    fprintf(stderr, "loom run --env-ranks: L FIRST WORLD ADDR PORT -- "
                    "PROGRAM...\n");
    return 2;
  }
  int L = num(argv[1], 1, MAX_LOCAL), first = num(argv[2], 0, 1 << 24);
  int world = num(argv[3], 1, 1 << 24), port = num(argv[5], 1, 65535);
  if (L < 0 || first < 0 || world < 0 || port < 0 || first + L > world) {
    fprintf(stderr, "loom run --env-ranks: bad numbers\n");
    return 2;
  }
  char **prog = argv + 7;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = pass_on;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    sigaction(sigs[i], &sa, NULL);
  char v[64];
  snprintf(v, sizeof v, "%d", world);
  setenv("WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", L);
  setenv("LOCAL_WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
  setenv("MASTER_ADDR", argv[4], 1);
  setenv("LOOM_INIT", "env://", 1);
  pid_t me = getpid();
  /* Signals wait while a rank is forked, so each one reaches every rank
   * started; the child takes the defaults back before it runs. */
  sigset_t block, old;
  sigemptyset(&block);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    sigaddset(&block, sigs[i]);
  for (int i = 0; i < L && !got_sig; i++) {
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t p = fork();
    if (p == 0) {
      for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
        signal(sigs[k], SIG_DFL);
      sigprocmask(SIG_SETMASK, &old, NULL);
      prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the launcher */
      if (getppid() != me)
        _exit(1);
      snprintf(v, sizeof v, "%d", first + i);
      setenv("RANK", v, 1);
      snprintf(v, sizeof v, "%d", i);
      setenv("LOCAL_RANK", v, 1);
      execvp(prog[0], prog);
      fprintf(stderr, "loom run: cannot start %s: %s\n", prog[0],
              strerror(errno));
      _exit(127);
    }
    if (p > 0) {
      pids[nkids] = p;
      kids[nkids++] = p;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (p < 0) {
      fprintf(stderr, "loom run: fork: %s\n", strerror(errno));
      pass_on(SIGTERM);
      break;
    }
  }
  int code = 0, left = nkids;
  bool failed = nkids < L;
  if (failed)
    code = 1;
  while (left > 0) {
    int st = 0;
    pid_t w = waitpid(-1, &st, 0);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    int i = 0;
    while (i < nkids && kids[i] != w)
      i++;
    if (i == nkids)
      continue;
    kids[i] = -1;
    left--;
    int c = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (c != 0 && !failed) {
      /* The first failure is the job's: the others are ended at once, as
       * mpirun does (their collectives would wait for the dead rank). */
      int who = first_failure(i, WIFSIGNALED(st), first, &c);
      failed = true;
      code = c;
      fprintf(stderr,
              "loom run: rank %d (local %d) exited with code %d; ending "
              "this host's other ranks\n",
              first + who, who, c);
      for (int k = 0; k < nkids; k++)
        if (kids[k] > 0)
          kill(kids[k], SIGKILL);
    }
  }
  return code;
}
