/* The run layer's internals: the launch plan and the spawn-and-supervise
 * primitive shared by supervise.c (options, plan, restarts), spawn.c
 * (processes and signals) and watch.c (the ranks' status files). */
#ifndef LOOM_RUN_INTERNAL_H
#define LOOM_RUN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "loom/core.h"
#include "loom/run.h"

/* How one attempt of the job ended. */
typedef struct loom_run_result {
  int code;   /* exit code loom run reports: status, or 128 + signal */
  int signal; /* the launcher died from this signal (0 if it exited) */
  bool launcher_killed; /* ... and not by loom run's hand */
  pid_t launcher_pid;
  int stopped_by; /* loom run itself got this signal and stopped the job */
  bool timed_out; /* --timeout expired */
  double seconds; /* wall time of the attempt */
} loom_run_result;

/* The first failure of an attempt among the local ranks, as their run
 * status files and pidfds tell it (run_watch.c). Times are wall-clock
 * seconds (CLOCK_REALTIME), comparable with the ranks' records. */
typedef struct loom_run_failure {
  bool found; /* a local rank was identified */
  int rank, pid;
  char host[64];
  int code;            /* exit code, -1 when it died from a signal or unknown */
  int signal;          /* 0 when none known */
  bool recorded;       /* the rank (or /proc) said how it ended */
  bool watchdog;       /* the note is the communication watchdog's */
  bool hang;           /* it made no progress within the hang timeout */
  double hang_timeout; /* that timeout (s) */
  double idle_s;       /* seconds since its last step, when found */
  char stalled[128];   /* other ranks that stopped progressing: "0 (step 38)" */
  int64_t last_step;
  char note[LOOM_RUNSTAT_NOTE_MAX + 1];
  double t_fail;    /* its record's time, or when its death was seen */
  double t_detect;  /* when loom run knew */
  double t_stopped; /* every process of the attempt gone */
  int stopped;      /* other local ranks loom run killed */
} loom_run_failure;

/* When the ranks of an attempt reached each phase: the latest local rank's
 * time for each (the group is ready when its last rank is). */
typedef struct loom_run_progress {
  double t_spawn; /* the launcher was started */
  double t_exec;  /* the last rank's process started (runstat init) */
  double t_comm_ready, t_loaded, t_training, t_first_step; /* 0: none */
  int64_t first_step; /* the step number of the first step completed */
  int ranks;
} loom_run_progress;

typedef struct loom_watch_rank loom_watch_rank;

/* How the local ranks ended a stop, from their notes ("stopped by SIGTERM
 * at step N, checkpoint saved"). */
typedef struct loom_run_stop {
  int ranks;    /* local ranks known */
  int stopped;  /* ... that said they stopped at a step */
  int saved;    /* ... and saved it */
  int64_t step; /* the step they stopped at, -1 none */
  bool steps_differ;
  char by[16]; /* "SIGTERM" when a rank named the signal it got */
} loom_run_stop;

/* What loom_run_spawn watches: the attempt's LOOM_RUN_DIR. */
typedef struct loom_run_watch {
  const char *dir;
  int expect_local;    /* local ranks expected, 0 when unknown */
  bool all_local;      /* every rank of the attempt runs on this host */
  bool keeps_status;   /* the program keeps a status file (loom train) */
  double hang_timeout; /* --hang-timeout: no step for this long is a hang;
                          0: max(60 s, 20 x the median step) */
  bool want_progress;  /* call on_first_step when the group completes a step */
  void (*on_first_step)(void *ctx, const loom_run_progress *p);
  void *ctx;
  loom_run_failure fail;  /* out */
  loom_run_progress prog; /* out */
  /* private */
  loom_watch_rank *ranks;
  int n, cap;
  double next_scan;
  bool first_step_told;
  int ino;           /* inotify on dir, -1 not yet, -2 unavailable */
  int64_t end_seq;   /* ends of ranks seen so far, in the kernel's order */
  double t_polled;   /* wall time of the last poll's start */
  bool detected;     /* the failure's candidates are fixed */
  double step_s[32]; /* recent step times seen (a ring), for the median */
  int n_step_s;
} loom_run_watch;

struct pollfd;
void loom_watch_init(loom_run_watch *w);
void loom_watch_free(loom_run_watch *w);
/* The fds to poll for POLLIN: an inotify on dir and the pidfds of the live
 * local ranks. */
int loom_watch_fds(loom_run_watch *w, struct pollfd *fds, int max);
/* Takes in what poll saw (and scans for new rank files every 50 ms);
 * returns 1 when a failure was just identified (w->fail). final: the
 * launcher has exited and every process of the attempt is gone. */
int loom_watch_update(loom_run_watch *w, const struct pollfd *fds, int nfds,
                      double now, bool final);
/* The final verdict, once the launcher is gone: the first among the ends
 * seen when the failure was detected, with the launcher's exit code as
 * evidence where their order is not known otherwise. */
void loom_watch_settle(loom_run_watch *w, int launcher_code);
/* Every local rank still alive is about to be stopped by loom run: what
 * ends from now on is never the cause. */
void loom_watch_mark_stopped(loom_run_watch *w);
/* Sends sig to every live local rank; returns how many. */
int loom_watch_signal_all(loom_run_watch *w, int sig);
/* Every rank runs here and each is known: a stop can be handed to them
 * directly rather than to the launcher (which would kill them at once). */
bool loom_watch_all_known(const loom_run_watch *w);
void loom_watch_stop_summary(const loom_run_watch *w, loom_run_stop *st);
/* Whether new rank files or phases are still awaited (poll often). */
bool loom_watch_scanning(const loom_run_watch *w);
/* SIGKILLs every live local rank (the failing one too, if it said so and
 * is still there); returns how many. */
int loom_watch_stop_others(loom_run_watch *w);
/* Local ranks known and still alive. */
int loom_watch_alive(const loom_run_watch *w);
int loom_watch_local(const loom_run_watch *w);
/* True once, when every local rank has completed its first step (w->prog). */
bool loom_watch_progress(loom_run_watch *w);
/* The hang timeout in force: --hang-timeout, else max(60 s, 20 x the
 * median step time seen so far). */
double loom_watch_hang_timeout(const loom_run_watch *w);
/* "SIGKILL", "SIGSEGV", ...; "signal" for others. */
const char *loom_signal_name(int sig);

/* Starts argv (argv[0] looked up in PATH) in a session of its own, waits
 * for it, forwards SIGINT / SIGTERM / SIGHUP / SIGQUIT to it, stops it after
 * timeout_s (0 = never), and kills whatever is left of its session
 * afterwards, so no rank outlives the job. With a watch, the local ranks'
 * status files are followed: the first rank to fail is identified and the
 * others are stopped at once, without waiting for the launcher's teardown. */
int loom_run_spawn(char *const *argv, double timeout_s, bool verbose,
                   loom_run_watch *watch, loom_run_result *res);
/* The two halves of loom_run_spawn: start argv in a session of its own
 * (its pid, -1 on failure), and supervise a started launcher to its end. */
pid_t loom_run_start(char *const *argv, bool verbose);
int loom_run_wait(pid_t pid, double timeout_s, loom_run_watch *watch,
                  loom_run_result *res);

/* The standby group: a launcher started ahead of a failure whose ranks wait
 * at LOOM_RUN_GATE (run.c). Registered here so that reaping it is noticed
 * and ending it takes its whole session. */
void loom_run_standby_set(pid_t pid);
bool loom_run_standby_alive(void);
/* Hands the standby launcher over (it becomes the job's): its pid, 0 when
 * there is none alive. */
pid_t loom_run_standby_take(void);
void loom_run_standby_kill(void);
/* Seconds the ranks get to finish their step and save after a stop
 * (--stop-grace), before the job is killed. */
void loom_run_set_stop_grace(double seconds);
/* The launcher's own messages go to this file (made when first needed),
 * the ranks' output to stderr; verbose: the launcher's to stderr too. */
void loom_run_set_launcher_log(const char *path, bool verbose);
/* What the launcher wrote to its log in the last attempt: up to
 * LOOM_RUN_SAID_MAX lines that read as errors (into lines), the log's path,
 * and whether anything went there at all. Returns the number of lines. */
#define LOOM_RUN_SAID_MAX 3
int loom_run_launcher_said(const char **lines, const char **path, bool *wrote);
/* A signal asked loom run to stop (then no restart is attempted). */
bool loom_run_stop_requested(void);
/* Sleeps, returning early when a stop signal arrives. */
void loom_run_sleep(double seconds);

#endif
