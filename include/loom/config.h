/* loom config: the typed training configuration, its schema (one table that
 * drives YAML parsing, validation, --set overrides, docs and the hash), the
 * canonical serialisation and the cross-rank config hash. */
#ifndef LOOM_CONFIG_H
#define LOOM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/core.h"
#include "loom/data.h"  /* loom_tail */
#include "loom/nn.h"    /* loom_act */
#include "loom/optim.h" /* loom_optim_kind, loom_sched_kind, loom_lr_rule */

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ----------------------------------------------------------- value enums */

/* An enum-valued key takes its values from the layer that owns the
 * concept: model.activation is nn's loom_act, data.tail data's loom_tail,
 * optim.name, schedule.name and schedule.scaling optim's loom_optim_kind,
 * loom_sched_kind and loom_lr_rule; the schema reads those layers' name
 * tables (loom_act_names, ...), so a value has one spelling and the config
 * struct holds the layer's own enum, with no conversion between parallel
 * enums. The lists below are the config's own: choices that belong to
 * training as a whole (which model, data set, strategy, precision, what to
 * do when a save fails, wire compression) and the progress display, whose
 * enum the train layer uses from here. */
#define LOOM_CFG_MODEL_LIST(X)                                                 \
  X(LOOM_CFG_MODEL_MLP, "mlp")                                                 \
  X(LOOM_CFG_MODEL_CNN, "cnn")                                                 \
  X(LOOM_CFG_MODEL_GPT, "gpt")
#define LOOM_CFG_DATASET_LIST(X)                                               \
  X(LOOM_CFG_DATASET_FASHION_MNIST, "fashion-mnist")                           \
  X(LOOM_CFG_DATASET_KJV, "kjv")                                               \
  X(LOOM_CFG_DATASET_BIN, "bin")
#define LOOM_CFG_PRECISION_LIST(X)                                             \
  X(LOOM_CFG_PRECISION_F32, "f32")                                             \
  X(LOOM_CFG_PRECISION_BF16, "bf16")                                           \
  X(LOOM_CFG_PRECISION_F16, "f16")
#define LOOM_CFG_ON_ERROR_LIST(X)                                              \
  X(LOOM_CFG_ON_ERROR_STOP, "stop")                                            \
  X(LOOM_CFG_ON_ERROR_CONTINUE, "continue")
/* The progress display of loom train (log.progress); train's progress
 * printer takes this enum. */
#define LOOM_PROGRESS_MODE_LIST(X)                                             \
  X(LOOM_PROGRESS_AUTO, "auto")                                                \
  X(LOOM_PROGRESS_BAR, "bar")                                                  \
  X(LOOM_PROGRESS_LINES, "lines")                                              \
  X(LOOM_PROGRESS_OFF, "off")
#define LOOM_CFG_STRATEGY_LIST(X)                                              \
  X(LOOM_CFG_STRATEGY_AUTO, "auto")                                            \
  X(LOOM_CFG_STRATEGY_NONE, "none")                                            \
  X(LOOM_CFG_STRATEGY_DDP, "ddp")                                              \
  X(LOOM_CFG_STRATEGY_ZERO1, "zero1")                                          \
  X(LOOM_CFG_STRATEGY_ZERO2, "zero2")                                          \
  X(LOOM_CFG_STRATEGY_ZERO3, "zero3")                                          \
  X(LOOM_CFG_STRATEGY_FSDP, "fsdp")
#define LOOM_CFG_COMPRESS_LIST(X)                                              \
  X(LOOM_CFG_COMPRESS_NONE, "none")                                            \
  X(LOOM_CFG_COMPRESS_BF16, "bf16")                                            \
  X(LOOM_CFG_COMPRESS_F16, "f16")
/* parallel.pp_schedule: the same values, in the same order, as the
 * parallel layer's loom_pipe_schedule (checked where the trainer passes
 * it on; config does not link the parallel layer). */
#define LOOM_CFG_PP_SCHEDULE_LIST(X)                                           \
  X(LOOM_CFG_PP_GPIPE, "gpipe")                                                \
  X(LOOM_CFG_PP_1F1B, "1f1b")

#define LOOM_X_ENUM(name, text) name,
typedef enum {
  LOOM_CFG_MODEL_LIST(LOOM_X_ENUM) LOOM_CFG_MODEL_COUNT
} loom_cfg_model;
typedef enum {
  LOOM_CFG_DATASET_LIST(LOOM_X_ENUM) LOOM_CFG_DATASET_COUNT
} loom_cfg_dataset;
typedef enum {
  LOOM_CFG_PRECISION_LIST(LOOM_X_ENUM) LOOM_CFG_PRECISION_COUNT
} loom_cfg_precision;
typedef enum {
  LOOM_CFG_ON_ERROR_LIST(LOOM_X_ENUM) LOOM_CFG_ON_ERROR_COUNT
} loom_cfg_on_error;
typedef enum {
  LOOM_CFG_PP_SCHEDULE_LIST(LOOM_X_ENUM) LOOM_CFG_PP_SCHEDULE_COUNT
} loom_cfg_pp_schedule;
typedef enum {
  LOOM_CFG_STRATEGY_LIST(LOOM_X_ENUM) LOOM_CFG_STRATEGY_COUNT
} loom_cfg_strategy;
typedef enum {
  LOOM_CFG_COMPRESS_LIST(LOOM_X_ENUM) LOOM_CFG_COMPRESS_COUNT
} loom_cfg_compress;
typedef enum {
  LOOM_PROGRESS_MODE_LIST(LOOM_X_ENUM) LOOM_PROGRESS_MODE_COUNT
} loom_progress_mode;
#undef LOOM_X_ENUM

/* Name tables, indexed by the enum value ("cnn" = loom_cfg_model_names
 * [LOOM_CFG_MODEL_CNN]). */
extern const char *const loom_progress_mode_names[LOOM_PROGRESS_MODE_COUNT];
extern const char *const loom_cfg_model_names[LOOM_CFG_MODEL_COUNT];
extern const char *const loom_cfg_dataset_names[LOOM_CFG_DATASET_COUNT];
extern const char *const loom_cfg_precision_names[LOOM_CFG_PRECISION_COUNT];
extern const char *const loom_cfg_on_error_names[LOOM_CFG_ON_ERROR_COUNT];
extern const char *const loom_cfg_strategy_names[LOOM_CFG_STRATEGY_COUNT];
extern const char *const loom_cfg_compress_names[LOOM_CFG_COMPRESS_COUNT];
extern const char *const loom_cfg_pp_schedule_names[LOOM_CFG_PP_SCHEDULE_COUNT];

/* ---------------------------------------------------------- the config */

#define LOOM_CONFIG_STR_MAX 512 /* bytes of a string value, NUL included */
#define LOOM_CONFIG_LIST_MAX 16 /* items of an integer list */

typedef struct loom_config_ints {
  int n;
  int64_t v[LOOM_CONFIG_LIST_MAX];
} loom_config_ints;

/* The meaning, default and range of every field is in the schema table
 * (src/train/config.c) and docs/config.md, generated from it. */
typedef struct loom_config_model {
  loom_cfg_model name;
  loom_config_ints hidden;   /* mlp: hidden layer widths */
  loom_act activation;       /* mlp, cnn */
  loom_config_ints channels; /* cnn: output channels of each conv */
  int64_t kernel, pool;      /* cnn */
  int64_t context, layers, d_model, heads, vocab, mlp_ratio; /* gpt */
  double dropout, init_std;                                  /* gpt */
} loom_config_model;

typedef struct loom_config_data {
  loom_cfg_dataset dataset;
  char path[LOOM_CONFIG_STR_MAX];
  char val_path[LOOM_CONFIG_STR_MAX];
  double val_fraction;
  bool shuffle;
  loom_tail tail;
  int64_t prefetch;
} loom_config_data;

typedef struct loom_config_optim {
  loom_optim_kind name;
  double lr, momentum, weight_decay, beta1, beta2, eps, grad_clip;
  bool nesterov;
} loom_config_optim;

typedef struct loom_config_schedule {
  loom_sched_kind name;
  int64_t warmup_steps, step_size;
  double min_lr, gamma;
  loom_lr_rule scaling;
} loom_config_schedule;

typedef struct loom_config_train {
  int64_t epochs, steps, batch_size, accumulate;
  int64_t eval_every, eval_batches, seed, threads;
  loom_cfg_precision precision;
  /* auto, dynamic, or a number (loom_config_loss_scale) */
  char loss_scale[LOOM_CONFIG_STR_MAX];
  double loss_scale_init;             /* dynamic: the first scale */
  int64_t loss_scale_growth_interval; /* dynamic: good steps to grow */
  /* none, blocks or every:K (loom_config_checkpoint_every) */
  char activation_checkpointing[LOOM_CONFIG_STR_MAX];
} loom_config_train;

typedef struct loom_config_checkpoint {
  bool enabled;
  char dir[LOOM_CONFIG_STR_MAX];
  int64_t every, keep;
  bool async;
  loom_cfg_on_error on_error;
} loom_config_checkpoint;

typedef struct loom_config_log {
  char run_dir[LOOM_CONFIG_STR_MAX];
  int64_t every;
  loom_progress_mode progress;
  bool metrics, tensorboard, trace, profile, per_rank;
  /* The trace's window of steps (loom_trace_opts) and its cap in MiB. */
  int64_t trace_start, trace_steps, trace_every;
  double trace_max_mb;
  /* MLflow tracking: uri "" is off. */
  char mlflow_uri[LOOM_CONFIG_STR_MAX];
  char mlflow_experiment[LOOM_CONFIG_STR_MAX];
  char mlflow_run_name[LOOM_CONFIG_STR_MAX];
} loom_config_log;

typedef struct loom_config_parallel {
  loom_cfg_strategy strategy;
  double bucket_mb, first_bucket_mb;
  bool deterministic;
  int64_t virtual_shards;
  loom_cfg_compress compress;
  char shard_unit[LOOM_CONFIG_STR_MAX];
  /* The mesh: dp x tp x pp ranks (dp 0 = auto: the world size / (tp pp)). */
  int64_t dp, tp, pp;
  int64_t micro_batches;            /* M: micro-batches of a pipeline step */
  loom_cfg_pp_schedule pp_schedule; /* gpipe or 1f1b */
  loom_config_ints pp_split;        /* units per stage ([]: balanced) */
  /* Sequence parallelism over the tp group (tp > 1, model gpt, tp
   * dividing model.context): the norms', dropouts' and residual sums'
   * activations cut over the group along the tokens
   * (loom_gpt_opts.sequence_parallel). */
  bool sequence_parallel;
  /* ... gathering the column-parallel layers' inputs again in backward
   * (loom_gpt_opts.sp_regather). */
  bool sequence_parallel_regather;
} loom_config_parallel;

/* A plain value: copy it with `=`, nothing to free. */
typedef struct loom_config {
  loom_config_model model;
  loom_config_data data;
  loom_config_optim optim;
  loom_config_schedule schedule;
  loom_config_train train;
  loom_config_checkpoint checkpoint;
  loom_config_log log;
  loom_config_parallel parallel;
} loom_config;

/* ------------------------------------------------------------- loading */

/* Every key at its default. Paths left empty are resolved by
 * loom_config_load (log.run_dir = runs/<file stem>, checkpoint.dir =
 * <log.run_dir>/ckpt). */
void loom_config_defaults(loom_config *cfg);

/* defaults -> the YAML file -> each "section.key=value" of sets, in order
 * -> paths resolved -> cross-key checks. On any error returns
 * LOOM_ERR_CONFIG (LOOM_ERR_NOMEM when out of memory) with one line in
 * loom_last_error():
 *   FILE:LINE:COLUMN: key 'optim.lrr': unknown key (did you mean 'optim.lr'?)
 *   --set optim.lr=abc: key 'optim.lr': expected a number, got 'abc'
 * and leaves *cfg untouched. sets may be NULL when n_sets is 0. */
loom_status loom_config_load(loom_config *cfg, const char *path,
                             const char *const *sets, int n_sets);
/* The same from text in memory; `name` stands for the file in messages. */
loom_status loom_config_load_string(loom_config *cfg, const char *text,
                                    size_t len, const char *name,
                                    const char *const *sets, int n_sets);
/* One override, "section.key=value", the value read with YAML's rules
 * ("[64, 32]" is a list); no cross-key checks. */
loom_status loom_config_set(loom_config *cfg, const char *assignment);
/* Ranges of every key and the rules between keys (e.g. model.heads divides
 * model.d_model); the message names the key. */
loom_status loom_config_validate(const loom_config *cfg);

/* ------------------------------------------------- output and identity */

/* Canonical YAML: every key, in schema order, one section after another,
 * strings double-quoted, floats in the shortest form that reads back
 * exactly. Loading it gives an equal config. *out is freed with loom_free. */
loom_status loom_config_to_yaml(const loom_config *cfg, char **out);
/* FNV-1a 64 of "key=value\n" for every key that must agree across ranks
 * (schema flag LOOM_CFG_LOCAL unset). Local keys: where files go, what is
 * printed, per-host performance knobs. */
uint64_t loom_config_hash(const loom_config *cfg);
/* train.activation_checkpointing as blocks per checkpointed segment: none
 * 0, blocks 1, every:K K. LOOM_ERR_CONFIG for anything else. */
loom_status loom_config_checkpoint_every(const char *value, int *every);
/* Loss scaling (docs/precision.md): train.loss_scale resolved against
 * train.precision. NONE (auto with f32 or bf16, or 0), STATIC (a number
 * > 0: *scale), DYNAMIC (dynamic, or auto with f16: *scale is
 * train.loss_scale_init, then loom_scaler's rules). *scale is 1 for NONE.
 * LOOM_ERR_CONFIG for a value that is none of auto, dynamic or a finite
 * number in [0, 1e38]; combinations are loom_config_validate's. */
typedef enum {
  LOOM_LOSS_SCALE_NONE,
  LOOM_LOSS_SCALE_STATIC,
  LOOM_LOSS_SCALE_DYNAMIC
} loom_loss_scale_mode;
loom_status loom_config_loss_scale(const loom_config *cfg,
                                   loom_loss_scale_mode *mode, double *scale);
/* parallel.shard_unit: blocks (every 1, min_params 0), every:K (K, 0) or
 * params:N (1, N; N may end in K, M or G for 1e3, 1e6, 1e9).
 * LOOM_ERR_CONFIG for anything else. */
loom_status loom_config_shard_unit(const char *value, int *every,
                                   int64_t *min_params);
/* Every key equal (strings by content, lists by items). */
bool loom_config_equal(const loom_config *a, const loom_config *b);

/* -------------------------------------------------------------- schema */

#define LOOM_CFG_TYPE_LIST(X)                                                  \
  X(LOOM_CFG_INT, "int")                                                       \
  X(LOOM_CFG_FLOAT, "float")                                                   \
  X(LOOM_CFG_BOOL, "bool")                                                     \
  X(LOOM_CFG_STRING, "string")                                                 \
  X(LOOM_CFG_ENUM, "enum")                                                     \
  X(LOOM_CFG_INT_LIST, "int list")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_CFG_TYPE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_CFG_TYPE_COUNT
} loom_cfg_type;
const char *loom_cfg_type_name(loom_cfg_type t);

/* Flags of a key. */
#define LOOM_CFG_MIN_OPEN 1u /* range excludes min: (min, ... */
#define LOOM_CFG_MAX_OPEN 2u /* range excludes max: ..., max) */
#define LOOM_CFG_LOCAL 4u    /* left out of the config hash */
/* Not implemented in this build: the key takes its default value only; any
 * other value is an error naming what is supported (todo says why). */
#define LOOM_CFG_TODO 8u
/* An integer key that also takes the word auto, stored as 0 (outside its
 * range): train.batch_size. */
#define LOOM_CFG_AUTO 16u

typedef struct loom_config_key {
  const char *path; /* "optim.lr" */
  loom_cfg_type type;
  size_t offset;             /* of the field in loom_config */
  const char *def;           /* default, as YAML text: "0.01", "[512, 512]" */
  double min, max;           /* INT, FLOAT, INT_LIST items */
  int list_min;              /* INT_LIST: fewest items */
  const char *const *values; /* ENUM: names, indexed by value */
  int n_values;
  unsigned flags;
  const char *help; /* one line */
  /* ENUM: bit i set = value i is accepted by the grammar but not
   * implemented in this build, an error at check time ("train.precision:
   * bf16 is not implemented yet; supported: f32"). */
  unsigned todo_values;
  const char *todo; /* with todo_values or LOOM_CFG_TODO: what comes later */
} loom_config_key;

/* The schema: every key, in order. */
const loom_config_key *loom_config_keys(size_t *count);
/* NULL when no key has this path. */
const loom_config_key *loom_config_key_find(const char *path);
/* The value of a key in canonical text (as loom_config_to_yaml writes it);
 * LOOM_ERR_INVALID_ARG if it does not fit in n bytes. */
loom_status loom_config_format(const loom_config *cfg,
                               const loom_config_key *key, char *buf, size_t n);
/* The reference table of docs/config.md (Markdown), generated from the
 * schema; *out is freed with loom_free. */
loom_status loom_config_schema_markdown(char **out);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_CONFIG_H */
