/* loom run's verdict on a failed attempt (src/run/watch.c) when ranks run
 * on other hosts: a local rank that the launcher killed without a record
 * of its own is a casualty, not the cause; a rank on another host whose
 * record can be read (a shared file system) is named; with neither, no
 * rank is named and the launcher's exit code decides. Every rank is a
 * child process that writes its status file as loom train does; the
 * "other host" is its record's host field. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/core.h"
#include "loom/run.h"
#include "run/internal.h"
#include "tt.h"

static char dir[256];

/* A rank that trains to step 15 and then ends as `how` says: "kill"
 * (SIGKILL, no record: what the launcher does to its local ranks), "segv"
 * (recorded by the fatal-signal handler) or "usage" (records exit 2). The
 * local rank is left a zombie (its status in /proc, as before mpirun reaps
 * it) until the case ends; the others are reaped. */
static pid_t start_rank(int rank, const char *how) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    char v[16];
    snprintf(v, sizeof v, "%d", rank);
    setenv("OMPI_COMM_WORLD_RANK", v, 1);
    setenv("LOOM_RUN_DIR", dir, 1);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    loom_runstat_init();
    loom_runstat_fatal_signals();
    loom_runstat_phase(LOOM_RUNSTAT_COMM_READY);
    loom_runstat_phase(LOOM_RUNSTAT_LOADED);
    loom_runstat_phase(LOOM_RUNSTAT_TRAINING);
    for (int s = 1; s <= 15; s++)
      loom_runstat_step(s);
    if (strcmp(how, "usage") == 0) {
      loom_runstat_note("fault injected: exit at step 15");
      loom_runstat_exit(2);
      _exit(2);
    }
    if (strcmp(how, "segv") == 0) {
      loom_runstat_note("fault injected: segv at step 15");
      raise(SIGSEGV);
    }
    raise(SIGKILL);
    _exit(1);
  }
  return pid;
}

/* The rank's process is gone (not reaped): its status file closed. */
static void wait_gone(pid_t pid) {
  siginfo_t si;
  waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT);
}

static void reap(pid_t pid) {
  int st;
  waitpid(pid, &st, 0);
}

/* Moves rank R's record to another host: its host field rewritten (the
 * file renamed into place, as a rank's is). */
static void move_to_other_host(int rank) {
  char path[600], tmp[640], buf[4096];
  snprintf(path, sizeof path, "%s/rank-%d", dir, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(path, "r");
  TT_REQUIRE(f != NULL);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *h = strstr(buf, "\nhost ");
  TT_REQUIRE(h != NULL);
  h += strlen("\nhost ");
  while (*h == ' ')
    h++;
  char *end = strchr(h, '\n');
  TT_REQUIRE(end != NULL && end - h >= 9);
  memset(h, ' ', (size_t)(end - h));
  memcpy(h, "elsewhere", 9);
  f = fopen(tmp, "w");
  TT_REQUIRE(f != NULL);
  fwrite(buf, 1, n, f);
  fclose(f);
  TT_REQUIRE(rename(tmp, path) == 0);
}

/* loom run's verdict once the attempt is over (the launcher gone). */
static loom_run_failure verdict(bool all_local, int expect_local,
                                int launcher_code) {
  loom_run_watch w;
  memset(&w, 0, sizeof w); /* no hang timeout, no progress wanted */
  loom_watch_init(&w);
  w.dir = dir;
  w.all_local = all_local;
  w.expect_local = expect_local;
  /* the ranks learnt from their files, as while the attempt ran */
  loom_watch_update(&w, NULL, 0, loom_time_wall(), false);
  loom_watch_update(&w, NULL, 0, loom_time_wall(), true);
  loom_watch_settle(&w, launcher_code);
  loom_run_failure f = w.fail;
  loom_watch_free(&w);
  return f;
}

static void empty_dir(void) {
  for (int r = 0; r < 4; r++) {
    char p[600];
    snprintf(p, sizeof p, "%s/rank-%d", dir, r);
    unlink(p);
  }
}

/* The tester's case (LOOM_FAULT=1:15:segv, --hosts qnode1:1,qnode2:1):
 * rank 1 on the other host segfaults, mpirun kills rank 0 here. Before,
 * rank 0 was named ("died from signal 9 (SIGKILL)", exit code 137). */
TT_TEST(remote_segv_named_not_the_local_casualty) {
  empty_dir();
  pid_t remote = start_rank(1, "segv");
  reap(remote);
  move_to_other_host(1);
  pid_t local = start_rank(0, "kill");
  wait_gone(local);
  loom_run_failure f = verdict(false, 1, 139);
  TT_CHECK(f.found);
  TT_CHECK_EQ(f.rank, 1);
  TT_CHECK_STR(f.host, "elsewhere");
  TT_CHECK_EQ(f.signal, SIGSEGV);
  TT_CHECK(f.recorded);
  TT_CHECK_EQ(f.last_step, 15);
  TT_CHECK_STR(f.note, "fault injected: segv at step 15");
  reap(local);
}

/* Exit code 2 on the other host: named with its code, so loom run does not
 * restart it (before: rank 0's SIGKILL, 137, restarted). */
TT_TEST(remote_usage_exit_named) {
  empty_dir();
  pid_t remote = start_rank(1, "usage");
  reap(remote);
  move_to_other_host(1);
  pid_t local = start_rank(0, "kill");
  wait_gone(local);
  loom_run_failure f = verdict(false, 1, 2);
  TT_CHECK(f.found);
  TT_CHECK_EQ(f.rank, 1);
  TT_CHECK_EQ(f.code, 2);
  TT_CHECK_EQ(f.signal, 0);
  reap(local);
}

/* The other host's record cannot be read (no shared file system): no rank
 * is named, and the launcher's exit code is the verdict. */
TT_TEST(remote_unseen_no_local_blamed) {
  empty_dir();
  pid_t local = start_rank(0, "kill");
  wait_gone(local);
  loom_run_failure f = verdict(false, 1, 139);
  TT_CHECK(!f.found);
  reap(local);
}

/* A local rank that recorded its failure is still named beside other
 * hosts' ranks. */
TT_TEST(local_recorded_named_beside_remote) {
  empty_dir();
  pid_t local = start_rank(0, "segv");
  wait_gone(local);
  loom_run_failure f = verdict(false, 1, 139);
  TT_CHECK(f.found);
  TT_CHECK_EQ(f.rank, 0);
  TT_CHECK_EQ(f.signal, SIGSEGV);
  reap(local);
}

/* Every rank here (-n N): a rank killed without a record is the failure,
 * as before (a SIGKILL from outside, the OOM killer). */
TT_TEST(all_local_kill_still_named) {
  empty_dir();
  pid_t local = start_rank(0, "kill");
  wait_gone(local);
  loom_run_failure f = verdict(true, 1, 137);
  TT_CHECK(f.found);
  TT_CHECK_EQ(f.rank, 0);
  TT_CHECK_EQ(f.signal, SIGKILL);
  TT_CHECK(!f.recorded);
  reap(local);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/loom_watch_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  TT_RUN(remote_segv_named_not_the_local_casualty);
  TT_RUN(remote_usage_exit_named);
  TT_RUN(remote_unseen_no_local_blamed);
  TT_RUN(local_recorded_named_beside_remote);
  TT_RUN(all_local_kill_still_named);
  empty_dir();
  rmdir(dir);
  return tt_finish();
}
