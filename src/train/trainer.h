/* Private to the train layer: the trainer's state, shared by the loop
 * (loop.c) and its checkpoint glue (loop_ckpt.c). */
#ifndef LOOM_TRAIN_TRAINER_H
#define LOOM_TRAIN_TRAINER_H

#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/data.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/parallel.h"
#include "loom/train.h"

/* Characters of a job id (LOOM_RUN_JOB). */
#define LOOM_TRAIN_JOB_MAX 64

/* Seconds of one step (or a window of steps) by phase. comm_wait is the
 * time blocked on gradient reductions after backward; reduce the
 * communication thread's time on them (hidden = reduce - comm_wait). */
typedef struct loom_step_times {
  double data, forward, backward, comm_wait, optim, reduce, total;
  double ckpt; /* saving checkpoints at step boundaries */
  /* A pipeline stage: its schedule's length and the time it waited for
   * its neighbours within it (the bubble). */
  double pipe_step, pipe_wait;
  /* Tensor parallelism: blocked on the group's reductions (within forward
   * and backward), and the bytes they reduced. */
  double tp_wait, tp_bytes;
  double tp_seq_bytes, tp_wire_bytes; /* sequence parallelism; sent */
  /* A pipeline stage's dp sum: bytes handed to it (loom_pipe_stats) */
  double pp_dp_bytes;
} loom_step_times;

/* What every rank sums each step: loss, rows, correct rows, stop request,
 * and where async saves stand (ranks whose write finished, of them failed;
 * rank 0's commit: 1 done, 2 failed), so all conclude them at the same step
 * without a collective of their own. */
enum {
  SUM_LOSS,
  SUM_COUNT,
  SUM_CORRECT,
  SUM_STOP,
  SUM_WRITTEN,
  SUM_WRITE_FAILED,
  SUM_COMMITTED,
  SUM_N
};

/* A checkpoint write or commit that runs on a thread and is concluded by
 * all ranks at one step boundary. */
typedef struct loom_ckpt_bg {
  loom_ckpt_writer *w; /* its writer, NULL when none started */
  bool active;         /* it (maybe failed) waits to be concluded */
  bool done;           /* its outcome on this rank is known */
  loom_status status;  /* that outcome (or how its start went) */
  char msg[512];       /* and its message */
  int64_t step;
} loom_ckpt_bg;

/* Rank r's slice [lo, hi) of the flat buffers: P contiguous slices, the
 * last ones one element longer when P does not divide the size. Each rank
 * writes its slice of a checkpoint; ZeRO-1 shards the optimizer by them. */
void loom_train_slice(const loom_trainer *t, int r, int64_t *lo, int64_t *hi);
/* Bytes of this rank's parameters, gradients and optimizer state in memory
 * (reserved buffers: the pages resident), now and the most seen. */
typedef struct loom_train_mem {
  size_t params, grads, optim, params_peak, grads_peak;
  size_t act; /* the model's activation arena (saved, recomputed, scratch) */
  /* LOOM_MEM_COMM (shared-memory segments, staging, compression buffers)
   * and LOOM_MEM_DATA (data sets in memory, sampler order, batches): now
   * and the most held since the start. */
  size_t comm, comm_peak, data, data_peak;
} loom_train_mem;
void loom_train_mem_get(const loom_trainer *t, loom_train_mem *out);

/* loom_train_model_new with the model options given (shape_only for the
 * estimate); the seed and initialisation come from the config. */
loom_status loom_train_model_make(const loom_config *cfg,
                                  const loom_model_opts *base,
                                  loom_model **out);
/* The same, a tensor-parallel rank's part of the GPT (tp NULL: whole). */
loom_status loom_train_model_make_tp(const loom_config *cfg,
                                     const loom_model_opts *base,
                                     const loom_tp *tp, loom_model **out);

struct loom_trainer {
  loom_config cfg;
  loom_train_opts opts;
  char resume[LOOM_CONFIG_STR_MAX];
  loom_model *model;
  loom_xent *xent;
  loom_dataset *train_ds, *val_ds;
  loom_loader *train_loader;
  loom_optim *optim;
  loom_sched sched;
  loom_metrics *metrics;
  loom_progress *progress;
  bool tracing;      /* this trainer opened the process's trace */
  bool warming_up;   /* the warm-up pass runs (its spans carry no step) */
  FILE *rank_log;    /* log.per_rank: RUN/logs/rank-K.log */
  int run_lock;      /* rank 0: RUN/.lock, held (flock) while training; -1 */
  bool outputs_open; /* open_outputs ran (metrics, progress, MLflow) */
  /* The step of the last evaluation metrics.jsonl holds (rank 0; -1: none
   * known): a resumed run redoes its first step's when it is missing. */
  int64_t eval_logged_step;
  loom_mlflow *mlflow; /* log.mlflow (rank 0) */
  char mlflow_status[16];
  double *unit_t0;    /* (2 x units) trace: when each unit's forward and
                         backward began */
  bool is_text;       /* tokens: throughput in tokens, no accuracy */
  int64_t batch;      /* B: rows per micro-batch per rank */
  int64_t accumulate; /* micro-batches per optimizer step */
  int64_t steps_per_epoch;
  int64_t total_steps;
  int64_t step; /* optimizer steps done */
  /* Async saves. A write in flight, then (multi-rank) rank 0's commit on
   * a thread; each concluded by all ranks at one step boundary. */
  loom_ckpt_bg save;   /* the write in flight */
  loom_ckpt_bg commit; /* rank 0: the commit thread */
  double ckpt_seconds; /* step time spent saving, in total */
  /* Async saves copy this rank's share of the state here, (K, hi - lo) for
   * params and each optimizer state: one allocation, touched once, reused,
   * so a save costs a memcpy and no page faults. */
  float *snap;
  int64_t snap_n;
  double loss_window_sum;
  int64_t loss_window_n;
  double acc_window_sum; /* train accuracy (classification) */

  /* Data parallelism. */
  loom_group *world;
  int rank, nranks;
  loom_ddp *ddp; /* NULL: plain training on one rank */
  /* ZeRO stage (0: DDP or none). From 1 the optimizer holds and steps only
   * this rank's slice of the flat parameters (the checkpoint's slice,
   * loom_train_slice; with tensor parallelism, stages 1 and 2, its
   * replica's cut of the rank's own part, loom_train_tp_cut); from 2 the DDP
   * keeps only the slice of the reduced gradient; at 3 the parameters too (z3).
   * At 1 and 2 the slices are all-gathered after each step (zero_counts: every
   * rank's count). */
  int zero;
  size_t *zero_counts;
  int64_t *bounds;    /* (nranks + 1) stage 2 and 3: the slices' bounds */
  int64_t *tp_bounds; /* (replicas + 1) stage 2 with tensor parallelism:
                         the cuts of the rank's part (loom_train_tp_cut) */
  float *zparams;     /* stage 2: the parameter buffer (model shape_only);
                         loom_group_mem_alloc memory on several ranks */
  loom_zero3 *z3;     /* stage 3 */
  /* stage 2 with a pipeline (tp 1): the stage's chunk sums of the
   * gradient's squares (its chunks of LOOM_GRAD_CHUNK) and each replica's
   * count of them */
  double *z2_sums;
  size_t *z2_counts;
  size_t z2_grad_peak; /* resident bytes of the gradient before the
                          release, the most seen */
  /* stage 3 with a pipeline: the stage's parameters outside the replica's
   * cut given back after the step (gathered again before the next use:
   * loom_train_pipe_whole), and the most resident before that */
  bool z3p_released;
  size_t z3p_param_peak;
  int shards;         /* S: virtual shards per rank (1 unless deterministic) */
  int64_t shard_rows; /* rows of a virtual shard (deterministic) */
  int units;          /* reduction units: ranks, or virtual shards */
  int64_t train_len;  /* samples in the training set */

  /* The mesh: replicas x stages = nranks, rank = replica x stages + stage
   * (a pipeline's stages on neighbouring ranks). Without a pipeline every
   * rank is a replica of its own (replica = rank, stages 1). */
  int replica, replicas, stage, stages;
  int micro; /* M: micro-batches of each batch (parallel) */
  loom_group *pp_group, *dp_group; /* NULL without a pipeline */
  loom_pipe *pipe;                 /* parallel.pp > 1 */
  float *pbuf, *gbuf;    /* the pipeline's parameter and gradient buffers:
                            reserved, only the stage's ranges touched */
  int64_t *stage_bounds; /* (stages + 1) every stage's owned range */
  int64_t *whole_bounds; /* the same in the whole model's layout (with
                            tensor parallelism; else stage_bounds) */

  /* Tensor parallelism (parallel.tp > 1; loop_tp.c): rank = (replica x
   * stages + stage) x tps + tp_rank, a group's ranks neighbours. t->model
   * is this rank's part of the GPT; whole the whole model's layout
   * (shape_only), which checkpoints keep; tp_map between the two. tps 1
   * and the rest NULL without. */
  int tp_rank, tps;
  loom_group *tp_group;
  loom_tp_group *tpg;
  loom_model *whole;
  loom_tp_map *tp_map;
  bool sp; /* parallel.sequence_parallel: whole views' gradients summed */

  /* Recovery. With a checkpoint to load, the model is built without its
   * random draws; they are made only when none was loaded after all. */
  bool init_deferred;
  bool resumed; /* the state came from a checkpoint */
  /* The loom run job this process belongs to (LOOM_RUN_JOB; "" without),
   * recorded in each checkpoint's manifest, and whether this is a restart
   * of it (LOOM_RESTART_COUNT > 0): a restart goes on from the job's own
   * newest checkpoint, whatever --resume says. */
  char job[LOOM_TRAIN_JOB_MAX + 1];
  long restart;
  char ckpt_extra[16384]; /* the manifest's extra JSON: the scaler's, the
                             job, the loss window, the data's sizes, the
                             config's keys other than their defaults */

  /* Fault injection (LOOM_FAULT): this rank's faults, armed in a job's
   * first attempt only. */
  loom_fault faults[LOOM_FAULT_MAX];
  int n_faults;
  /* The last save concluded: its step and whether it failed (under
   * checkpoint.on_error: continue a failure is only a warning, but the
   * final save's must not go unnoticed). */
  int64_t ckpt_last_step;
  bool ckpt_last_failed;
  char ckpt_last_error[256];
  bool slow_noted; /* the slow fault was announced */
  bool slow_data_noted;

  /* Loss scaling (train.loss_scale; loop_scale.c, docs/precision.md). */
  loom_loss_scale_mode ls_mode;
  loom_scaler scaler; /* STATIC: its scale is the fixed one, never updated */
  int64_t ls_skipped; /* steps skipped for inf/NaN gradients, whole run */
  char ls_extra[160]; /* the checkpoint's extra JSON (the scaler's state) */
};

/* This process's rank and the world size (0 and 1 before a trainer is
 * made, or without MPI). */
int loom_train_rank(void);
int loom_train_world(void);
void loom_train_set_world(int rank, int world);

/* Every rank passes its status; all get LOOM_OK only when every rank had
 * LOOM_OK, else the first failing rank's status (its own message when it is
 * this rank, else one naming that rank). No rank is left in a collective
 * that another skipped. */
loom_status loom_train_agree(loom_trainer *t, loom_status mine,
                             const char *what);

/* Reads LOOM_RUN_JOB and LOOM_RESTART_COUNT into t->job and t->restart;
 * LOOM_ERR_CONFIG for a job id that is not 1 to 64 letters, digits, '.',
 * '_' or '-'. */
loom_status loom_train_job_init(loom_trainer *t);
/* Whether this is a restart of a loom run job that may go on from the
 * job's own checkpoint, whatever opts.resume says. */
bool loom_train_job_restart(const loom_trainer *t);
/* Restores the state from a checkpoint as opts.resume says (a no-op for
 * "never" or when "auto" finds none; a restart of a job first looks for
 * the job's own newest checkpoint). Collective. */
loom_status loom_train_ckpt_resume(loom_trainer *t);
/* Makes what saves need before the loop (the async snapshot). */
loom_status loom_train_ckpt_prepare(loom_trainer *t);
/* Saves the state after step t->step into checkpoint.dir. Collective. */
loom_status loom_train_ckpt_save(loom_trainer *t);
/* Waits for an async save in flight; its status. Collective. */
loom_status loom_train_ckpt_finish(loom_trainer *t);
/* The end of a run: loom_train_ckpt_finish, and an error when the save of
 * the last step failed (even under checkpoint.on_error: continue). */
loom_status loom_train_ckpt_final(loom_trainer *t);
/* Each step, multi-rank async saves: this rank's part of the SUM_WRITTEN..
 * SUM_COMMITTED entries before the sums are posted, and, once summed (g),
 * the conclusions every rank draws from them at this same step. */
void loom_train_ckpt_flags(loom_trainer *t, double *sums);
loom_status loom_train_ckpt_poll(loom_trainer *t, const double *g);

/* Reads LOOM_FAULT and LOOM_RESTART_COUNT: keeps this rank's faults when
 * armed; LOOM_ERR_CONFIG on a value that does not parse. */
loom_status loom_train_fault_init(loom_trainer *t);
/* slow_data: sleeps before a batch is taken, as a loader that cannot keep
 * up; returns the seconds slept (0 when no such fault is armed). */
double loom_train_fault_data_delay(loom_trainer *t);
/* After step t->step: exit, segv, hang or slow as asked. */
void loom_train_fault_after_step(loom_trainer *t);

/* loop_scale.c: loss scaling. init from the config (and the start-up
 * line); the factor backward weighs the loss by (1 without scaling). */
loom_status loom_train_scale_init(loom_trainer *t);
float loom_train_loss_scale(const loom_trainer *t);
/* The reduced gradient g(n) this rank steps (its slice under ZeRO-2),
 * before clipping and the optimizer: unscaled; *skip when it holds an inf
 * or NaN on any rank (all ranks agree: a collective over the world when
 * scaling is on and there are several ranks), then the dynamic scale is
 * updated and a skip logged. *skip false and nothing done without
 * scaling. */
loom_status loom_train_scale_unscale(loom_trainer *t, float *g, int64_t n,
                                     bool *skip);
/* The scaler's state into a checkpoint's meta (loss_scale, extra_json),
 * and back from one (a checkpoint without it, older or of a run without
 * dynamic scaling, leaves the configured start); the checkpoint's reader
 * has refused fields that are not what a run writes. */
void loom_train_scale_meta(loom_trainer *t, loom_ckpt_meta *meta);
void loom_train_scale_restore(loom_trainer *t, const loom_ckpt_meta *meta);
/* metrics.jsonl: loss_scale and skipped_steps when scaling is on. */
void loom_train_scale_metrics(const loom_trainer *t, loom_metrics *m);

/* loop_pipe.c: the mesh (replicas, stages, tensor-parallel ranks, their
 * groups; collective over the world when there is a pipeline or tensor
 * parallelism) from parallel.dp, tp and pp. */
loom_status loom_train_mesh(loom_trainer *t);
/* The wire type of parallel.compress (LOOM_F32 for none): DDP's buckets
 * and a pipeline's dp sum. */
loom_dtype loom_train_compress_dtype(const loom_config *cfg);
/* The model's type for train.precision: LOOM_F32, LOOM_BF16 or LOOM_F16. */
loom_dtype loom_train_precision_dtype(const loom_config *cfg);

/* loop_tp.c: tensor parallelism. The rank's part of the model (t->model,
 * its parameters drawn later), the whole model's layout and the map. */
loom_status loom_train_tp_new(loom_trainer *t);
void loom_train_tp_free(loom_trainer *t);
/* A fresh start: this rank's part of the whole model's draws. */
loom_status loom_train_tp_init_params(loom_trainer *t);
/* The sum of squares of the whole gradient's parameters in [lo, hi) of the
 * rank's layout (collective over the tp group). */
loom_status loom_train_tp_sp_grads(loom_trainer *t, int64_t lo, int64_t hi);
loom_status loom_train_tp_grad_sumsq(loom_trainer *t, int64_t lo, int64_t hi,
                                     double *out);
/* Elements [lo, hi) of the whole layout (this rank's checkpoint slice,
 * loom_train_slice) of a buffer in the rank's layout from element base on
 * (the parameters, or an optimizer state), put together from the tp group
 * into dst. Collective over the tp group. */
loom_status loom_train_tp_slice(loom_trainer *t, const float *local,
                                int64_t base, float *dst);
/* zero2 with tensor parallelism: the sum of squares of the whole
 * gradient's parameters, from each replica's cut [lo, hi) of its part
 * (collective over the tp group, then the dp group). */
loom_status loom_train_tp_cut_sumsq(loom_trainer *t, int64_t lo, int64_t hi,
                                    double *out);
/* The part [a, b) of the rank's layout whose optimizer state its tp rank
 * steps: all of it, or a pipeline stage's own range. */
void loom_train_tp_stepped(const loom_trainer *t, int64_t *a, int64_t *b);
/* zero1 with tensor parallelism: replica d's cut [lo, hi) of the rank's
 * own layout (its part of the model, or of a pipeline stage's range: the
 * same on every replica of its tp rank and stage), whose optimizer state
 * replica d keeps and steps. */
void loom_train_tp_cut(const loom_trainer *t, int d, int64_t *lo, int64_t *hi);
/* zero1/zero2 with tensor parallelism: every replica's cut's count
 * (zero_counts), made at set-up (after the pipeline, if any), before any
 * collective needs them. */
loom_status loom_train_tp_cuts_new(loom_trainer *t);
/* zero1 with tensor parallelism: every replica's cut of a buffer in the
 * rank's layout (cut: this replica's part, from its cut's first element)
 * put together into range (the rank's layout over loom_train_tp_stepped's
 * [a, b), from element a). Collective over the dp group. */
loom_status loom_train_tp_gather_cuts(loom_trainer *t, const float *cut,
                                      float *range);
/* zero1 with tensor parallelism: checkpoint buffer `name`'s values of the
 * replica's cut into cut, read through range (room for the stepped range
 * [a, b), from element a: the map fills whole views, and a cut may split
 * one). */
loom_status loom_train_tp_read_cut(loom_trainer *t, const loom_ckpt *c,
                                   const char *name, float *range, float *cut);
/* ZeRO-3: the replica's cut of the rank's part of the parameters (into
 * ZeRO-3's buffer, the rest never resident), drawn (c NULL) or read from
 * checkpoint c. */
loom_status loom_train_tp_fill_cut(loom_trainer *t, const loom_ckpt *c);
/* This rank's part of checkpoint buffer `name` into local, which holds its
 * layout from element base on: the parameters (base 0, count -1: what the
 * rank holds, a stage's own and borrowed views) or an optimizer state
 * (count elements: the views within them). */
loom_status loom_train_tp_read(loom_trainer *t, const loom_ckpt *c,
                               const char *name, float *local, int64_t base,
                               int64_t count);
/* Evaluation batch i's sums (loss, rows, correct) into part on the tp
 * group's first rank; every rank of the group runs it. */
loom_status loom_train_tp_eval(loom_trainer *t, const loom_batch *b,
                               double *part);
/* The pipeline of this stage (model, buffers, instances): after the model
 * was made shape_only, before the optimizer. No communication. */
loom_status loom_train_pipe_new(loom_trainer *t, const loom_shape *input);
/* Forward FLOPs per token of each unit of the GPT m built from cfg (cost:
 * one entry a unit): what the stages are balanced by (and loom estimate
 * cuts them by). */
void loom_train_unit_costs(const loom_config *cfg, const loom_model *m,
                           double *cost);
void loom_train_pipe_free(loom_trainer *t);
/* A fresh start: this stage's parameters drawn, view by view. */
loom_status loom_train_pipe_init_params(loom_trainer *t);
/* zero1/zero2 with a pipeline: replica d's cut of the stage's owned range
 * in the rank's layout (what its optimizer steps; zero2: where it keeps the
 * replicas' sum of the gradient). */
void loom_train_pipe_cut(const loom_trainer *t, int d, int64_t *lo,
                         int64_t *hi);
/* One step's micro-batches through the pipeline (sums as step_micro's). */
loom_status loom_train_pipe_micro(loom_trainer *t, double *sums,
                                  loom_step_times *tm, int64_t *epoch);
/* The step after it: borrowed gradients, the dp sum, clipping, the
 * optimizer on the stage's range, borrowed weights back. */
loom_status loom_train_pipe_optim(loom_trainer *t, float lr, double *gnorm,
                                  loom_step_times *tm);
/* Evaluation batch i's sums (loss, rows, correct) added into part, on the
 * last stage; every stage of the replica runs it. */
/* zero3 with a pipeline: the stage's whole parameters back (all-gathered
 * over its replicas, the tied weights sent on), if the last step gave them
 * back; every rank of the world calls it at the same points (the start of
 * a step, evaluation, a checkpoint save, the end). */
loom_status loom_train_pipe_whole(loom_trainer *t);
loom_status loom_train_pipe_eval(loom_trainer *t, const loom_batch *b,
                                 double *part);
/* Rows of global batch (epoch, batch), every replica's together. */
int64_t loom_train_global_rows(const loom_trainer *t, int64_t epoch,
                               int64_t batch);
/* Rows of the optimizer step about to run: its t->accumulate global
 * batches from the loader's position on. */
int64_t loom_train_step_rows(const loom_trainer *t);

/* trace.c: the timeline (log.trace or LOOM_TRACE=DIR): opens this rank's
 * file and hooks the model's units and the communication thread into it;
 * close unhooks and closes. mem adds the memory counters (mem measured by
 * loom_train_mem_get) and writes what is buffered. */
loom_status loom_train_trace_open(loom_trainer *t);
void loom_train_trace_close(loom_trainer *t);
/* A phase of the step (category train, its number in args, then extra:
 * JSON members or NULL); nothing when this trainer does not trace. */
void loom_train_trace_step(const loom_trainer *t, const char *name, double t0,
                           double t1, const char *extra);
/* Several ranks, any tracing: every rank's wall clock against rank 0's,
 * recorded in its trace (collective over the world). */
loom_status loom_train_trace_sync(loom_trainer *t);

/* RUN/config.yaml (the resolved configuration) and RUN/env.json (version,
 * commit, host, CPU, kernels, ranks, threads, start), rank 0. */
loom_status loom_train_write_run_info(const loom_trainer *t);
/* The git commit loom was built from ("" when unknown). */
const char *loom_train_git_commit(void);
/* The strategy the trainer runs: single, ddp, zero1, zero2, zero3, and
 * with a pipeline or tensor parallelism pipeline, tensor, ddp+tensor, ... */
const char *loom_train_strategy_name(const loom_trainer *t);

/* log.mlflow (src/train/mlflow.c), rank 0: the run opened with its
 * parameters and tags (going on with RUN/mlflow_run_id when resumed; the
 * id is written there as soon as the server made the run); at the end the
 * report written and the artifacts sent; closed with its status. */
loom_status loom_train_mlflow_open(loom_trainer *t);
void loom_train_mlflow_finish(loom_trainer *t, bool finished);
void loom_train_mlflow_close(loom_trainer *t);
void loom_train_trace_mem(const loom_train_mem *mem);
/* After the checkpoint of `step` was committed: the corrupt fault. */
void loom_train_fault_after_save(loom_trainer *t, int64_t step);

#endif
