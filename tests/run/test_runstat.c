/* Run status files (LOOM_RUN_DIR): layout read back, rank from the launch
 * environment, no-op without a directory, fatal signals recorded. Each case
 * runs in a child process, since the status is set up once per process. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/core.h"
#include "loom/run.h"
#include "tt.h"

static char dir[256];

static void clear_env(void) {
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("PMIX_RANK");
  unsetenv("PMI_RANK");
  unsetenv("SLURM_PROCID");
  setenv("LOOM_RUN_DIR", dir, 1);
}

static void empty_dir(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d)
    closedir(d);
}

static int count_files(void) {
  int n = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

/* Runs fn in a child; returns its wait status. */
static int in_child(void (*fn)(void), pid_t *pid_out) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (pid_out)
    *pid_out = pid;
  return st;
}

static void child_full(void) {
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("SLURM_PROCID", "9", 1); /* Open MPI's variable wins */
  loom_runstat_init();
  loom_runstat_init();
  loom_runstat_phase(LOOM_RUNSTAT_COMM_READY);
  loom_runstat_phase(LOOM_RUNSTAT_LOADED);
  loom_runstat_phase(LOOM_RUNSTAT_TRAINING);
  for (int64_t s = 21; s <= 120; s++)
    loom_runstat_step(s);
  loom_runstat_note("fault injected: exit at step 120\nsecond line");
  loom_runstat_phase(LOOM_RUNSTAT_DONE);
  loom_runstat_exit(7);
}

TT_TEST(full_record) {
  empty_dir();
  double t0 = loom_time_wall();
  pid_t pid;
  int st = in_child(child_full, &pid);
  double t1 = loom_time_wall();
  TT_REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  loom_runstat_record r;
  TT_REQUIRE_OK(loom_runstat_read(dir, 3, &r));
  TT_CHECK_EQ(r.rank, 3);
  TT_CHECK_EQ(r.pid, pid);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  TT_CHECK_STR(r.host, host);
  TT_CHECK_EQ(r.phase, LOOM_RUNSTAT_DONE);
  TT_CHECK(r.t_phase[LOOM_RUNSTAT_START] >= t0 - 0.001);
  for (int p = 1; p < LOOM_RUNSTAT_PHASE_COUNT; p++)
    TT_CHECK(r.t_phase[p] >= r.t_phase[p - 1]);
  TT_CHECK(r.t_phase[LOOM_RUNSTAT_DONE] <= t1 + 0.001);
  TT_CHECK_EQ(r.step, 120);
  TT_CHECK_EQ(r.first_step, 21);
  TT_CHECK(r.t_first_step >= r.t_phase[LOOM_RUNSTAT_TRAINING]);
  TT_CHECK(r.t_step >= r.t_first_step);
  TT_CHECK(r.t_step <= r.t_phase[LOOM_RUNSTAT_DONE]);
  TT_CHECK_EQ(r.exit_code, 7);
  TT_CHECK_EQ(r.signal, 0);
  TT_CHECK(r.t_exit >= r.t_phase[LOOM_RUNSTAT_DONE] && r.t_exit <= t1 + 0.001);
  /* Newlines are flattened: the record stays one line per field. */
  TT_CHECK_STR(r.note, "fault injected: exit at step 120 second line");
  TT_CHECK_EQ(count_files(), 1); /* no temporary file left */
  TT_CHECK_STR(loom_runstat_phase_name(LOOM_RUNSTAT_COMM_READY), "comm_ready");
  TT_CHECK_STR(loom_runstat_phase_name(LOOM_RUNSTAT_PHASE_COUNT), "?");
}

static void child_fresh(void) {
  clear_env();
  setenv("PMI_RANK", "1", 1);
  loom_runstat_init();
}

/* A new process of the same rank (a restart) starts a clean record. */
TT_TEST(fresh_after_restart) {
  empty_dir();
  TT_REQUIRE(in_child(child_full, NULL) == 0);
  TT_REQUIRE(in_child(child_fresh, NULL) == 0);
  loom_runstat_record r;
  TT_REQUIRE_OK(loom_runstat_read(dir, 1, &r));
  TT_CHECK_EQ(r.rank, 1);
  TT_CHECK_EQ(r.phase, LOOM_RUNSTAT_START);
  TT_CHECK_EQ(r.step, -1);
  TT_CHECK_EQ(r.exit_code, -1);
  TT_CHECK(r.t_first_step == 0 && r.t_step == 0 && r.t_exit == 0);
  TT_CHECK_STR(r.note, "");
}

static void child_pmix(void) {
  clear_env();
  setenv("PMIX_RANK", "4", 1);
  setenv("PMI_RANK", "6", 1);
  loom_runstat_step(1); /* without init: sets itself up */
}
static void child_slurm(void) {
  clear_env();
  setenv("SLURM_PROCID", "2", 1);
  loom_runstat_init();
}
static void child_none(void) {
  clear_env();
  loom_runstat_init();
}

TT_TEST(rank_from_environment) {
  empty_dir();
  TT_CHECK(in_child(child_pmix, NULL) == 0);
  TT_CHECK(in_child(child_slurm, NULL) == 0);
  TT_CHECK(in_child(child_none, NULL) == 0);
  loom_runstat_record r;
  TT_CHECK_OK(loom_runstat_read(dir, 4, &r));
  TT_CHECK_EQ(r.step, 1);
  TT_CHECK_OK(loom_runstat_read(dir, 2, &r));
  TT_CHECK_OK(loom_runstat_read(dir, 0, &r));
  TT_CHECK_EQ(count_files(), 3);
}

static void child_exit_unsaid(void) {
  clear_env();
  loom_runstat_init();
  exit(0);
}
static void child_exit_said(void) {
  clear_env();
  loom_runstat_init();
  loom_runstat_exit(0);
  exit(0);
}

/* exit() without a recorded code leaves "?", told apart from a process
 * that vanished without a word (-1) and from a recorded code. */
TT_TEST(exit_without_code) {
  empty_dir();
  loom_runstat_record r;
  TT_REQUIRE(in_child(child_exit_unsaid, NULL) == 0);
  TT_REQUIRE_OK(loom_runstat_read(dir, 0, &r));
  TT_CHECK_EQ(r.exit_code, -2);
  TT_CHECK(r.t_exit > 0);
  TT_REQUIRE(in_child(child_exit_said, NULL) == 0);
  TT_REQUIRE_OK(loom_runstat_read(dir, 0, &r));
  TT_CHECK_EQ(r.exit_code, 0);
}

static char gate[300];

static void child_gate(void) {
  clear_env();
  setenv("LOOM_RUN_GATE", gate, 1);
  loom_runstat_phase(LOOM_RUNSTAT_COMM_READY); /* waits for the gate */
  if (getenv("LOOM_RUN_GATE"))
    _exit(4); /* not for this process's children */
  loom_runstat_phase(LOOM_RUNSTAT_LOADED);
}

/* A standby rank waits in COMM_READY until the gate file appears, then
 * records the phase with the time it went on. */
TT_TEST(standby_gate) {
  empty_dir();
  snprintf(gate, sizeof gate, "%s/go", dir);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    child_gate();
    _exit(0);
  }
  loom_runstat_record r;
  double until = loom_time_now() + 10;
  bool waiting = false;
  while (!waiting && loom_time_now() < until) {
    waiting = loom_runstat_read(dir, 0, &r) == LOOM_OK &&
              r.phase == LOOM_RUNSTAT_COMM_READY;
    usleep(2000);
  }
  TT_CHECK(waiting);
  usleep(100 * 1000);
  TT_CHECK_OK(loom_runstat_read(dir, 0, &r));
  TT_CHECK_EQ(r.phase, LOOM_RUNSTAT_COMM_READY); /* still at the gate */
  double t_open = loom_time_wall();
  FILE *f = fopen(gate, "w");
  TT_REQUIRE(f != NULL);
  fclose(f);
  int st = 0;
  waitpid(pid, &st, 0);
  TT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  TT_REQUIRE_OK(loom_runstat_read(dir, 0, &r));
  TT_CHECK_EQ(r.phase, LOOM_RUNSTAT_LOADED);
  TT_CHECK(r.t_phase[LOOM_RUNSTAT_COMM_READY] >= t_open - 0.001);
  TT_CHECK(r.t_phase[LOOM_RUNSTAT_COMM_READY] < t_open + 5);
  unlink(gate);
}

static void child_off(void) {
  clear_env();
  unsetenv("LOOM_RUN_DIR");
  loom_runstat_init();
  loom_runstat_fatal_signals();
  loom_runstat_phase(LOOM_RUNSTAT_TRAINING);
  loom_runstat_step(3);
  loom_runstat_note("x");
  loom_runstat_exit(1);
  /* Not installed: SIGABRT keeps whatever it had. */
  struct sigaction sa;
  sigaction(SIGABRT, NULL, &sa);
  if (sa.sa_handler != SIG_DFL)
    _exit(3);
}

TT_TEST(off_without_dir) {
  empty_dir();
  int st = in_child(child_off, NULL);
  TT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  TT_CHECK_EQ(count_files(), 0);
}

static void child_bad_dir(void) {
  clear_env();
  setenv("LOOM_RUN_DIR", "/nonexistent/loom-run-dir", 1);
  loom_runstat_init();
  loom_runstat_step(3);
  loom_runstat_exit(1);
}

TT_TEST(missing_dir_is_harmless) {
  int st = in_child(child_bad_dir, NULL);
  TT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static int fault_kind;

static void child_fault(void) {
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  /* A sanitizer may own SIGSEGV; this test wants the plain default. */
  signal(SIGSEGV, SIG_DFL);
  signal(SIGFPE, SIG_DFL);
  loom_runstat_fatal_signals();
  loom_runstat_phase(LOOM_RUNSTAT_TRAINING);
  loom_runstat_step(37);
  if (fault_kind == 0) {
    /* A real fault: a store to a page with no access. */
    volatile int *p =
        mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    *p = 1;
  } else if (fault_kind == 1) {
    abort();
  } else {
    raise(SIGFPE);
  }
  _exit(9);
}

TT_TEST(fatal_signals) {
  static const int want[] = {SIGSEGV, SIGABRT, SIGFPE};
  for (int k = 0; k < 3; k++) {
    empty_dir();
    fault_kind = k;
    double t0 = loom_time_wall();
    int st = in_child(child_fault, NULL);
    double t1 = loom_time_wall();
    TT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == want[k]);
    loom_runstat_record r;
    TT_REQUIRE_OK(loom_runstat_read(dir, 1, &r));
    TT_CHECK_EQ(r.signal, want[k]);
    TT_CHECK_EQ(r.exit_code, -1);
    TT_CHECK_EQ(r.step, 37);
    TT_CHECK(r.t_exit >= t0 && r.t_exit <= t1 + 0.001);
  }
}

TT_TEST(read_errors) {
  empty_dir();
  loom_runstat_record r;
  TT_CHECK(loom_runstat_read(dir, 0, &r) == LOOM_ERR_IO);
  TT_REQUIRE(in_child(child_none, NULL) == 0);
  char p[600];
  snprintf(p, sizeof p, "%s/rank-0", dir);
  TT_REQUIRE_OK(loom_runstat_read(dir, 0, &r));
  /* A record cut short (read while being replaced) is refused, not half
   * read; so is one with a line missing. */
  TT_REQUIRE(truncate(p, 200) == 0);
  TT_CHECK(loom_runstat_read(dir, 0, &r) == LOOM_ERR_CORRUPT);
  FILE *f = fopen(p, "w");
  fputs("loom-runstat 1\nrank 0\nend\n", f);
  fclose(f);
  TT_CHECK(loom_runstat_read(dir, 0, &r) == LOOM_ERR_CORRUPT);
  TT_CHECK(strstr(loom_last_error(), "no 'pid' line") != NULL);
}

static void child_many_steps(void) {
  clear_env();
  loom_runstat_init();
  double t0 = loom_time_now();
  for (int64_t s = 0; s < 20000; s++)
    loom_runstat_step(s);
  double dt = loom_time_now() - t0;
  printf("runstat_step: %.2f us per step\n", 1e6 * dt / 20000);
  fflush(stdout);
}

/* The per-step cost is printed (no assertion on time); the last step is
 * what is read back. */
TT_TEST(many_steps) {
  empty_dir();
  TT_REQUIRE(in_child(child_many_steps, NULL) == 0);
  loom_runstat_record r;
  TT_REQUIRE_OK(loom_runstat_read(dir, 0, &r));
  TT_CHECK_EQ(r.step, 19999);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/loom_runstat_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  TT_RUN(full_record);
  TT_RUN(fresh_after_restart);
  TT_RUN(rank_from_environment);
  TT_RUN(exit_without_code);
  TT_RUN(standby_gate);
  TT_RUN(off_without_dir);
  TT_RUN(missing_dir_is_harmless);
  TT_RUN(fatal_signals);
  TT_RUN(read_errors);
  TT_RUN(many_steps);
  empty_dir();
  rmdir(dir);
  return tt_finish();
}
