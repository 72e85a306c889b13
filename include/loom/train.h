/* loom train: the training loop and its services: console progress, metric
 * sinks, profiler figures. Configuration and checkpoints have their own
 * headers (config.h, ckpt.h). */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/config.h" /* loom_progress_mode, loom_config */
#include "loom/core.h"
#include "loom/nn.h"  /* loom_model */
#include "loom/obs.h" /* loom_metrics */

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ------------------------------------------------------------- progress */

/* loom_progress_mode and its names live in loom/config.h (log.progress). */
const char *loom_progress_mode_name(loom_progress_mode m);
loom_status loom_progress_mode_parse(const char *s, loom_progress_mode *out);

typedef struct loom_progress loom_progress;

typedef struct loom_progress_info {
  int64_t step; /* steps completed */
  int epoch;
  float loss;
  float lr;
  double throughput; /* samples (or tokens) per second */
} loom_progress_info;

/* AUTO draws a bar when `stream` (default stderr) is a terminal and prints a
 * line every `every` steps otherwise. The ETA counts from first_step. */
loom_status loom_progress_new(loom_progress **out, loom_progress_mode mode,
                              FILE *stream, int64_t first_step, int64_t total,
                              int every, const char *unit);
void loom_progress_update(loom_progress *p, const loom_progress_info *info);
/* Prints a whole line (eval results, warnings) without breaking the bar. */
void loom_progress_print(loom_progress *p, const char *line);
void loom_progress_free(loom_progress *p);

/* Metric sinks (loom_metrics_*): loom/obs.h. */

/* -------------------------------------------------------------- trainer */

/* The training loop of `loom train`, usable from C: a model, data, an
 * optimizer, a schedule, evaluation, metrics, progress and checkpoints, all
 * from one loom_config (config.h). */
typedef struct loom_trainer loom_trainer;

typedef struct loom_train_opts {
  /* "auto": continue from the newest valid checkpoint of checkpoint.dir if
   * there is one; "never": start fresh; else the path of a checkpoint. */
  const char *resume;
  /* Stop (saving a checkpoint) once this many optimizer steps are done,
   * as if interrupted; 0 = run to the end. The schedule is unaffected. */
  int64_t stop_at;
  /* Print progress and eval lines (rank 0 only later). */
  bool quiet;
  /* One forward and backward on a real batch before the checkpoint is
   * read, every piece of state it touched restored after (the run's bits do
   * not change): the new process's one-off costs (oneDNN's first calls,
   * first touches of activation and gradient memory, the first
   * collectives) are paid before the time counts. -1 (default): on a
   * standby rank of loom run (LOOM_RUN_GATE set), which does it while it
   * waits for a failure; 0 never; 1 always. */
  int warm_up;
  /* train.batch_size was auto (resolved by the caller from memory): a
   * batch larger than the data allows is lowered to fit one epoch, with a
   * line in the log, instead of being an error (false). */
  bool batch_auto;
} loom_train_opts;

loom_train_opts loom_train_opts_default(void);

typedef struct loom_train_result {
  int64_t steps;       /* optimizer steps completed in total */
  int64_t start_step;  /* where this run started (resumed) */
  double seconds;      /* wall time of the loop */
  double train_loss;   /* mean loss of the last logged window */
  double val_loss;     /* last evaluation (NAN if none) */
  double val_accuracy; /* last evaluation, classification only (NAN) */
  double throughput;   /* samples/s (tokens/s for text) over the run */
  bool interrupted;    /* stopped by stop_at or a signal */
  bool saved;          /* the state of the last step is in a checkpoint */
  int stop_signal;     /* the signal that stopped it (SIGINT, SIGTERM,
                          SIGHUP), 0 for stop_at or loom_trainer_request_stop */
  int64_t val_step;    /* the step of that last evaluation (-1 if none) */
  bool val_whole;      /* it covered the whole validation split (a run's
                          final evaluation; periodic ones take
                          train.eval_batches batches) */
} loom_train_result;

/* The model the config describes, as loom train builds it (defer_init:
 * parameters left for a checkpoint to fill). */
loom_status loom_train_model_new(const loom_config *cfg, bool defer_init,
                                 loom_model **out);

/* ------------------------------------------------------------ estimates */

/* Memory one rank needs to train a config, by category, in bytes. */
typedef struct loom_train_estimate {
  loom_cfg_strategy strategy;
  bool available; /* false: the strategy is not in this build (a forecast) */
  int ranks;
  int64_t params;       /* parameters of the whole model (Psi) */
  int64_t batch;        /* rows of a rank's forward (one micro-batch) */
  double param_bytes;   /* the parameters this rank holds */
  double grad_bytes;    /* gradient buffers (the model's and DDP's) */
  double optim_bytes;   /* optimizer state (moments) */
  double act_bytes;     /* activations kept for backward, scratch and the
                           output gradient, for `batch` rows */
  double data_bytes;    /* the loader's batches (data.prefetch + 1) and
                           dataset_bytes */
  double dataset_bytes; /* the data set in memory: Fashion-MNIST's pixels
                           and labels (from the files' headers), a text
                           file twice (train and val split each read it),
                           the sampler's order (8 bytes a training sample) */
  double mapped_bytes;  /* bin: the token files, mapped (page cache: pages
                           read count in the RSS, but the kernel may drop
                           them); not in total_bytes */
  bool dataset_known;   /* false: the data set was not found (not counted) */
  double comm_bytes;    /* deterministic shard buffers, compression's wire,
                           the staging slots, and the pages of the other
                           ranks' shared buffers this rank writes into (DDP's
                           gradients, zero2's parameters: counted in its RSS) */
  double ckpt_bytes;    /* the async checkpoint's copy of the state */
  loom_dtype half;      /* the model's half type (LOOM_F32: none) */
  int half_copy_bytes;  /* its copy of the parameters, bytes a parameter
                           (in param_bytes): 2, or 4 where the matmuls
                           convert (the model's own copy holds f32 values);
                           2 under zero3 over several ranks and in a
                           pipeline stage (bound copies); 0 in f32 */
  double process_bytes; /* the process itself: code, libraries, threads
                           (LOOM_ESTIMATE_PROCESS_MB, and
                           LOOM_ESTIMATE_MPI_MB on more than one
                           rank; measured) */
  double total_bytes;   /* all of the above */
  /* Bytes this rank sends per optimizer step: the gradient reduction over
   * the data-parallel ranks (and ZeRO's gathers) as bandwidth-optimal
   * algorithms move them (2 (D - 1) / D of the buffer for an all-reduce,
   * (D - 1) / D for a reduce-scatter or an all-gather), and a pipeline
   * stage's activations, their gradients and the tied embedding. */
  double sent_bytes;
  /* Pipeline parallelism (parallel.pp > 1): the estimate is of one stage. */
  int stages;           /* parallel.pp (1: no pipeline) */
  int stage;            /* the stage estimated */
  int dp;               /* data-parallel replicas (ranks / stages) */
  int unit_first;       /* the stage's units [unit_first, unit_end) of the */
  int unit_end;         /* model's root sequential */
  int instances;        /* micro-batches whose activations it keeps */
  int64_t stage_params; /* parameters the stage owns */
} loom_train_estimate;
/* What a `loom train` process holds before its model and data: code,
 * libraries (oneDNN, OpenBLAS), OpenMP and communication threads, and on
 * more than one rank MPI's own (its shared-memory transport's segments).
 * Measured with a GPT of 13,000 parameters: 24.0 MiB alone, 34.2-34.9 MiB
 * a rank of 2 or 4 (AMD EPYC, Debian 12, Open MPI 4.1). Built against
 * oneDNN 3.x (PyPI's 3.2, LOOM_DNNL_ROOT), its library keeps 25 MiB of
 * pages resident where Debian's 2.6.3 keeps 5 (a small GPT's whole
 * process: 57.0 against 36.5 MiB): LOOM_ESTIMATE_DNNL3_MB more. */
#define LOOM_ESTIMATE_PROCESS_MB 22.0
#define LOOM_ESTIMATE_MPI_MB 10.0
#define LOOM_ESTIMATE_DNNL3_MB 20.0

/* Estimates cfg on `ranks` ranks (>= 1) under `strategy` (the config's own
 * when LOOM_CFG_STRATEGY_AUTO: none on one rank, else ddp). Builds the
 * model (deferred init) to size activations; reads no data (only the
 * sizes of its files). */
loom_status loom_train_estimate_memory(const loom_config *cfg, int ranks,
                                       loom_cfg_strategy strategy,
                                       loom_train_estimate *out);
/* With parallel.pp > 1, loom_train_estimate_memory gives the stage with
 * the largest total; this one gives stage `stage` (0 .. pp - 1) of the
 * mesh (ranks / pp data-parallel replicas). */
loom_status loom_train_estimate_stage(const loom_config *cfg, int ranks,
                                      int stage, loom_train_estimate *out);
/* The rules a job of `ranks` ranks must meet before it starts, as the
 * trainer checks them at start-up (the world size is known only then):
 * parallel.dp x tp x pp is the world size (dp > 0), tp x pp divides it,
 * strategy none on one rank only (and without parallel.deterministic),
 * and deterministic mode's world size and virtual shards powers of two,
 * the ranks dividing the shards. LOOM_ERR_CONFIG naming the numbers;
 * loom estimate -n N applies the same. */
loom_status loom_train_check_world(const loom_config *cfg, int ranks);
/* The process's peak resident set so far, in bytes (getrusage). */
double loom_train_peak_rss(void);

/* Builds everything the config describes; a bad data path, a config that
 * does not fit the data, or an unreadable checkpoint is an error here.
 * opts NULL: the defaults; opts.stop_at below 0 or opts.warm_up other than
 * -1, 0 or 1: LOOM_ERR_INVALID_ARG. */
loom_status loom_trainer_new(loom_trainer **out, const loom_config *cfg,
                             const loom_train_opts *opts);
/* Trains to the config's end (or a stop); res (may be NULL) gets the
 * outcome. A NULL trainer is LOOM_ERR_INVALID_ARG. */
loom_status loom_trainer_run(loom_trainer *t, loom_train_result *res);
/* Evaluates on the validation split (eval_batches of them, 0 = all); loss
 * and accuracy may each be NULL. */
loom_status loom_trainer_evaluate(loom_trainer *t, double *loss,
                                  double *accuracy);
/* The trainer's model (NULL for a NULL trainer). */
loom_model *loom_trainer_model(loom_trainer *t);
void loom_trainer_free(loom_trainer *t);
/* Asks a running loop to stop at the next step boundary and save (safe to
 * call from a signal handler). */
void loom_trainer_request_stop(void);
/* Whether a stop was requested (a caught signal or the call above). */
bool loom_trainer_stop_requested(void);
/* The first stop signal caught (SIGINT, SIGTERM, SIGHUP), 0 when none was
 * (or the stop came from loom_trainer_request_stop): a program exits with
 * 128 + it, as loom train does. */
int loom_trainer_stop_signal(void);
/* Catches SIGINT, SIGTERM and SIGHUP from now on (before loom_trainer_new:
 * data, model, checkpoint): a stop that comes while loading is not lost,
 * the run stops after its first step and saves it. loom_trainer_run
 * catches them anyway while it runs. Call it before any thread starts: it
 * blocks them in the calling thread (so in every thread created later) and
 * takes them on a thread of its own, never on a thread that computes
 * (oneDNN's GEMM kernels point the stack pointer at the heap, where a
 * signal frame would land). */
void loom_trainer_catch_stop_signals(void);

/* mkdir -p: loom_fs_mkdirs(path, 0755) (kept for existing callers). */
loom_status loom_mkdirs(const char *path);

/* ------------------------------------------------------ fault injection */

/* LOOM_FAULT=RANK:STEP:KIND[:ARG][,...] makes the trainer of rank RANK
 * misbehave right after completing optimizer step STEP (before that step's
 * checkpoint), for tests and demos of recovery. Armed only in a job's first
 * attempt (LOOM_RESTART_COUNT unset or 0), so a restarted job gets through.
 * docs/training.md, "Faults". */
#define LOOM_FAULT_KIND_LIST(X)                                                \
  X(LOOM_FAULT_EXIT, "exit")       /* exit with code ARG (default 1) */        \
  X(LOOM_FAULT_SEGV, "segv")       /* a real SIGSEGV */                        \
  X(LOOM_FAULT_HANG, "hang")       /* stop participating, forever */           \
  X(LOOM_FAULT_CORRUPT, "corrupt") /* damage own shard of the next             \
                                      checkpoint once saved, then exit 1 */    \
  X(LOOM_FAULT_SLOW, "slow")       /* sleep ARG s (0.2) after every step */    \
  X(LOOM_FAULT_SLOW_DATA, "slow_data") /* every batch ARG s (0.2) late,        \
                                          evaluation's too */                  \
  X(LOOM_FAULT_GRAD_INF, "grad_inf")   /* an inf in the first element of the   \
                                          rank's reduced gradient (its slice   \
                                          under ZeRO-2) at step STEP, with     \
                                          loss scaling on: the step is skipped \
                                          on every rank */

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_FAULT_KIND_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_FAULT_KIND_COUNT
} loom_fault_kind;

const char *loom_fault_kind_name(loom_fault_kind k);

typedef struct loom_fault {
  int rank;
  int64_t step; /* fires after this step (>= 1) */
  loom_fault_kind kind;
  double arg; /* exit code (exit), seconds (slow); 0 for the others */
} loom_fault;

#define LOOM_FAULT_MAX 16

/* Parses a LOOM_FAULT value into at most `max` faults (*n of them);
 * LOOM_ERR_CONFIG naming the bad item. An empty string is no fault. */
loom_status loom_fault_parse(const char *spec, loom_fault *faults, int max,
                             int *n);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_TRAIN_H */
