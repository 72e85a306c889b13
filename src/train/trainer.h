/* Private to the train layer: the trainer's state, shared by the loop
 * (loop.c) and its checkpoint glue (loop_ckpt.c). */
#ifndef LOOM_TRAIN_TRAINER_H
#define LOOM_TRAIN_TRAINER_H

#include "loom/ckpt.h"
#include "loom/config.h"
#include "loom/data.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/train.h"

/* Seconds of one step (or a window of steps) by phase. */
typedef struct loom_step_times {
  double data, forward, backward, optim, total;
} loom_step_times;

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
  bool is_text;       /* tokens: throughput in tokens, no accuracy */
  int64_t batch;      /* B: rows per micro-batch per rank */
  int64_t accumulate; /* micro-batches per optimizer step */
  int64_t steps_per_epoch;
  int64_t total_steps;
  int64_t step; /* optimizer steps done */
  loom_ckpt_writer *pending; /* an async save in flight */
  double ckpt_seconds;        /* step time spent saving, in total */
  double loss_window_sum;
  int64_t loss_window_n;
};

/* This process's rank and the world size (1 until data parallel lands). */
int loom_train_rank(void);
int loom_train_world(void);

/* Restores the state from a checkpoint as opts.resume says (a no-op for
 * "never" or when "auto" finds none). */
loom_status loom_train_ckpt_resume(loom_trainer *t);
/* Saves the state after step t->step into checkpoint.dir. */
loom_status loom_train_ckpt_save(loom_trainer *t);
/* Waits for an async save in flight; its status. */
loom_status loom_train_ckpt_finish(loom_trainer *t);

#endif
