/* loom run internals: the launch plan and the spawn-and-supervise primitive
 * shared by run.c (options, plan, restarts) and run_spawn.c (processes and
 * signals). */
#ifndef LOOM_CLI_RUN_SPAWN_H
#define LOOM_CLI_RUN_SPAWN_H

#include <stdbool.h>

/* How one attempt of the job ended. */
typedef struct loom_run_result {
  int code;       /* exit code loom run reports: status, or 128 + signal */
  int signal;     /* the launcher died from this signal (0 if it exited) */
  int stopped_by; /* loom run itself got this signal and stopped the job */
  bool timed_out; /* --timeout expired */
  double seconds; /* wall time of the attempt */
} loom_run_result;

/* Starts argv (argv[0] looked up in PATH) in a session of its own, waits
 * for it, forwards SIGINT / SIGTERM / SIGHUP / SIGQUIT to it, stops it after
 * timeout_s (0 = never), and kills whatever is left of its session
 * afterwards, so no rank outlives the job. */
int loom_run_spawn(char *const *argv, double timeout_s, bool verbose,
                   loom_run_result *res);
/* A signal asked loom run to stop (then no restart is attempted). */
bool loom_run_stop_requested(void);
/* Sleeps, returning early when a stop signal arrives. */
void loom_run_sleep(double seconds);

#endif
