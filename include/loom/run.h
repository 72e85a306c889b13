/* loom/run.h: the run layer. The supervisor protocol that `loom run` and a
 * training program share (status files, gates, standby), and the `loom run`
 * supervisor itself as a function. A program written against the C API calls
 * the loom_runstat_* functions so that `loom run` can tell its progress,
 * name it when it fails and restart it; all of them are no-ops when the
 * program was not started by `loom run` (LOOM_RUN_DIR unset). */
#ifndef LOOM_RUN_H
#define LOOM_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* Exit codes of the loom tool and of its ranks, as loom run reads them
 * (docs/run.md has the whole table). */
#define LOOM_EXIT_OK 0
/* A run failed (I/O, numerical, a remote rank). */
#define LOOM_EXIT_FAIL 1
/* A bad command line or configuration: not restarted. */
#define LOOM_EXIT_USAGE 2
/* A save failed for lack of space (ENOSPC, EDQUOT) or on a read-only file
 * system (EROFS): a restart would fail the same way, so loom run does not
 * restart it (sysexits' EX_IOERR). */
#define LOOM_EXIT_NOSPACE 74
/* loom run's exit code when local ranks made no progress (no step
 * completed) within the hang timeout; restarted like a crash. */
#define LOOM_EXIT_HANG 76

/* Run status: what a rank tells its supervisor (loom run). When LOOM_RUN_DIR
 * is set each rank keeps a small file there, rewritten in place; otherwise
 * every call is a no-op. */
#define LOOM_RUNSTAT_PHASE_LIST(X)                                             \
  X(LOOM_RUNSTAT_START, "start")                                               \
  X(LOOM_RUNSTAT_COMM_READY, "comm_ready")                                     \
  X(LOOM_RUNSTAT_LOADED, "loaded")                                             \
  X(LOOM_RUNSTAT_TRAINING, "training")                                         \
  X(LOOM_RUNSTAT_DONE, "done")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_RUNSTAT_PHASE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_RUNSTAT_PHASE_COUNT
} loom_run_phase; /* not loom_runstat_phase: C gives a type and a function
                     one name space, and the function keeps that name */

/* Idempotent; reads LOOM_RUN_DIR and the rank. */
void loom_runstat_init(void);
/* Records the phase and its wall-clock time. */
void loom_runstat_phase(loom_run_phase p);
/* A rank of a standby group (loom run sets LOOM_RUN_GATE to a file's path)
 * waits in loom_runstat_phase(LOOM_RUNSTAT_COMM_READY) until that file
 * exists, then records the phase again with that time. A program that can
 * prepare more before it needs the checkpoint (data, model) calls
 * loom_runstat_gate_defer() first and loom_runstat_gate() just before it
 * reads the checkpoint: the wait moves there. Both are no-ops otherwise. */
void loom_runstat_gate_defer(void);
void loom_runstat_gate(void);
/* Whether this rank is a standby one still before its gate. */
bool loom_runstat_standby(void);
/* A completed step (the first one timestamped); one pwrite. */
void loom_runstat_step(int64_t step);
/* Alive between steps (an evaluation batch, a checkpoint being written):
 * loom run's hang detection counts it like a step, without taking it for
 * one in the step time. At most one write a second. */
void loom_runstat_beat(void);
/* A note, e.g. "fault injected: segv at step 37", "watchdog: ...". */
void loom_runstat_note(const char *what);
/* The exit code the process is about to return. */
void loom_runstat_exit(int code);
/* SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGABRT: records the signal and the time
 * (async-signal-safe), then re-raises it with the default action. */
void loom_runstat_fatal_signals(void);

/* The shape of loom_comm_abort_hook (loom/comm.h): records `why` as the
 * note and `exit_code` as the exit code. The trainer registers it with
 * loom_comm_set_abort_hook so a watchdog abort reaches loom run. */
void loom_runstat_on_abort(void *ctx, const char *why, int exit_code);

/* "start", "comm_ready", ...; "?" out of range. */
const char *loom_runstat_phase_name(loom_run_phase p);

/* One rank's file as read back (by loom run and tests). Times are seconds
 * since the Unix epoch (CLOCK_REALTIME), 0 when not recorded. */
#define LOOM_RUNSTAT_NOTE_MAX 200
typedef struct loom_runstat_record {
  int rank;
  int pid;
  char host[64];
  int phase; /* the last phase recorded, -1 none */
  double t_phase[LOOM_RUNSTAT_PHASE_COUNT];
  int64_t step;       /* the last completed step, -1 none */
  int64_t first_step; /* the first step this process completed, -1 none */
  double t_step, t_first_step;
  double t_beat; /* the last loom_runstat_beat (0 none) */
  int exit_code; /* -1: none recorded; -2: left through exit() without
                    loom_runstat_exit (code unknown) */
  int signal;    /* fatal signal caught, 0 none */
  double t_exit; /* when the exit code or signal was recorded */
  char note[LOOM_RUNSTAT_NOTE_MAX + 1];
} loom_runstat_record;

/* Reads the file of `rank` in `dir`. LOOM_ERR_IO when it does not exist (yet),
 * LOOM_ERR_CORRUPT when it is incomplete (read while written: read again). */
loom_status loom_runstat_read(const char *dir, int rank,
                              loom_runstat_record *out);

/* `loom run [options] PROGRAM [ARGS...]`: launches the ranks (mpirun, srun
 * or directly), supervises and restarts them; argv[0] is the command name.
 * Returns the tool's exit code. */
int loom_run_main(int argc, char **argv);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_RUN_H */
