/* A stand-in for a training rank under loom run: it records its phases and
 * steps in the run status file like loom train does and fails on request,
 * so the launcher's supervision is tested in a fraction of a second.
 *
 *   run_fake_rank [--comm] [--steps N] [--step-ms M] [--load-ms M]
 *                 [--late-gate] [--resume S] [--fault RANK:STEP:KIND]
 *                 [--pids DIR]
 *
 * KIND: exit (code 3), usage (code 2), segv, abort, kill (SIGKILL to
 * itself: no exit record), hang (stops taking part; with --comm the
 * others' watchdog fires), stuck-exit (records exit code 3, then never
 * leaves, as a process stuck in its exit handlers). The fault strikes after
 * step STEP completes, on the first start only (LOOM_RESTART_COUNT 0); a
 * restart resumes at S.
 * --comm: an all-reduce per step through loom's comm layer. --pids: each
 * rank writes its pid to DIR/rank-R.pid (for kills from outside).
 * --late-gate: a standby rank waits after its --load-ms of preparation, not
 * at COMM_READY (loom_runstat_gate_defer / loom_runstat_gate). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/core.h"
#include "loom/run.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

int main(int argc, char **argv) {
  loom_runstat_init();
  loom_runstat_fatal_signals();
  loom_comm_set_abort_hook(loom_runstat_on_abort, NULL); /* as the trainer */
  bool comm = false, late_gate = false;
  int steps = 20, step_ms = 5, load_ms = 0, resume = 0;
  int f_rank = -1, f_step = -1;
  char f_kind[16] = "";
  const char *pids = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(a, "--comm") == 0)
      comm = true;
    else if (strcmp(a, "--late-gate") == 0)
      late_gate = true;
    else if (strcmp(a, "--steps") == 0 && ++i)
      steps = atoi(v);
    else if (strcmp(a, "--step-ms") == 0 && ++i)
      step_ms = atoi(v);
    else if (strcmp(a, "--load-ms") == 0 && ++i)
      load_ms = atoi(v);
    else if (strcmp(a, "--resume") == 0 && ++i)
      resume = atoi(v);
    else if (strcmp(a, "--fault") == 0 && ++i) {
      if (sscanf(v, "%d:%d:%15s", &f_rank, &f_step, f_kind) != 3) {
        fprintf(stderr, "fake_rank: bad --fault '%s'\n", v);
        return 2;
      }
    } else if (strcmp(a, "--pids") == 0 && ++i)
      pids = v;
    /* anything else: a marker for pgrep */
  }
  if (late_gate)
    loom_runstat_gate_defer();
  loom_group *world = NULL;
  int rank = 0;
  if (comm) {
    if (loom_group_world(NULL, &world) != LOOM_OK) {
      fprintf(stderr, "fake_rank: %s\n", loom_last_error());
      loom_runstat_exit(1);
      return 1;
    }
    rank = loom_group_rank(world);
  } else {
    /* (RANK: loom run --nnodes, as loom_runstat reads it) */
    rank = env_int(
        "OMPI_COMM_WORLD_RANK",
        env_int("PMI_RANK", getenv("LOOM_INIT") ? env_int("RANK", 0) : 0));
  }
  loom_runstat_phase(LOOM_RUNSTAT_COMM_READY);
  if (pids) {
    char p[4096];
    snprintf(p, sizeof p, "%s/rank-%d.pid", pids, rank);
    FILE *f = fopen(p, "w");
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
  }
  bool restarted = env_int("LOOM_RESTART_COUNT", 0) > 0;
  int step = restarted ? resume : 0;
  sleep_ms(load_ms);
  loom_runstat_gate(); /* with --late-gate: a standby rank waits here */
  loom_runstat_phase(LOOM_RUNSTAT_LOADED);
  loom_runstat_phase(LOOM_RUNSTAT_TRAINING);
  bool fault_here = !restarted && rank == f_rank;
  while (step < steps) {
    sleep_ms(step_ms);
    if (world) {
      float x[4] = {1, 2, 3, 4};
      loom_req r = LOOM_REQ_INIT;
      loom_status s = loom_allreduce(x, x, 4, LOOM_F32, LOOM_SUM, world, &r);
      if (s == LOOM_OK)
        s = loom_wait(&r);
      if (s != LOOM_OK) {
        fprintf(stderr, "fake_rank %d: %s\n", rank, loom_last_error());
        loom_runstat_exit(1);
        return 1;
      }
    }
    step++;
    loom_runstat_step(step);
    if (fault_here && step == f_step) {
      char note[64];
      snprintf(note, sizeof note, "fault injected: %s at step %d", f_kind,
               step);
      loom_runstat_note(note);
      if (strcmp(f_kind, "exit") == 0) {
        loom_runstat_exit(3);
        return 3;
      } else if (strcmp(f_kind, "usage") == 0) {
        loom_runstat_exit(2);
        return 2;
      } else if (strcmp(f_kind, "segv") == 0) {
        volatile int *p =
            mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        *p = 1;
      } else if (strcmp(f_kind, "abort") == 0) {
        abort();
      } else if (strcmp(f_kind, "kill") == 0) {
        raise(SIGKILL);
      } else if (strcmp(f_kind, "stuck-exit") == 0) {
        loom_runstat_exit(3);
        for (;;)
          sleep_ms(1000);
      } else if (strcmp(f_kind, "hang") == 0) {
        for (;;)
          sleep_ms(1000);
      }
    }
  }
  loom_runstat_phase(LOOM_RUNSTAT_DONE);
  loom_group_free(world);
  loom_runstat_exit(0);
  return 0;
}
