/* loom optim: SGD and AdamW over flat buffers, learning-rate schedules,
 * gradient clipping by global norm, and the dynamic loss scaler.
 *
 * Letters: N elements of the flat parameter layout; S elements of the
 * optimizer's shard (S = N when unsharded). Every state buffer (momentum,
 * Adam m and v) has the parameter layout: global element i of the model is
 * element i - shard_begin of each state buffer. */
#ifndef LOOM_OPTIM_H
#define LOOM_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ------------------------------------------------------------ optimizers */

#define LOOM_OPTIM_KIND_LIST(X)                                                \
  X(LOOM_OPTIM_SGD, "sgd")                                                     \
  X(LOOM_OPTIM_ADAMW, "adamw")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_OPTIM_KIND_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_OPTIM_KIND_COUNT
} loom_optim_kind;

const char *loom_optim_kind_name(loom_optim_kind k);
/* The names, indexed by value: what configs and checkpoints hold (the
 * config schema reads this table, so a value has one spelling). */
extern const char *const loom_optim_kind_names[LOOM_OPTIM_KIND_COUNT];
/* Parses "sgd" or "adamw"; LOOM_ERR_INVALID_ARG for anything else. */
loom_status loom_optim_kind_parse(const char *name, loom_optim_kind *out);

typedef struct loom_optim_opts {
  loom_optim_kind kind; /* default sgd */
  /* Hyperparameters are double, as PyTorch's Python floats: 1 - beta2 from
   * a float 0.999f would be off by 5e-5 relative. */
  /* SGD (PyTorch torch.optim.SGD with dampening 0). */
  double momentum; /* 0 = plain SGD, no state */
  bool nesterov;   /* needs momentum > 0 */
  /* AdamW (PyTorch torch.optim.AdamW, amsgrad off). */
  double beta1, beta2; /* 0.9, 0.999 */
  double eps;          /* 1e-8, added outside the square root */
  /* Coupled (SGD: g += wd*p) or decoupled (AdamW: p -= lr*wd*p). Applied to
   * parameters whose view has decay=true, or to all when decay_all. */
  double weight_decay; /* 0 */
  bool decay_all;
  /* The optimizer owns state only for elements [shard_begin, shard_end) of
   * the layout (ZeRO: one contiguous shard per rank); shard_end = -1 means
   * the end of the layout. Default: the whole layout. */
  int64_t shard_begin, shard_end;
} loom_optim_opts;

loom_optim_opts loom_optim_opts_default(void);
/* Number of fp32 state buffers the options need (0, 1 or 2): the memory of
 * an optimizer is that many times 4 bytes per element of its shard. */
int loom_optim_opts_state_count(const loom_optim_opts *opts);

typedef struct loom_optim loom_optim;

/* Makes an optimizer for a layout of n elements described by views (sorted
 * by offset, not overlapping, inside [0, n); elements no view covers get no
 * weight decay). views may be NULL with nviews 0: then every element decays.
 * opts NULL: loom_optim_opts_default() (plain SGD, the whole layout; a
 * zeroed struct instead owns the empty shard [0, 0) and updates nothing).
 * The views are read here only; state starts at zero and the step at 0.
 * LOOM_ERR_INVALID_ARG names the bad option; LOOM_ERR_NOMEM. */
loom_status loom_optim_new(loom_optim **out, const loom_optim_opts *opts,
                           const loom_param *views, int nviews, int64_t n);
void loom_optim_free(loom_optim *o);

/* One full optimizer step over the whole shard with learning rate lr:
 * params and grads are the model's flat buffers, (N) each, addressed by
 * global offset. Advances the step count. */
loom_status loom_optim_step(loom_optim *o, float *params, const float *grads,
                            float lr);
/* The same for ZeRO-3/ZeRO-2 style local buffers: params and grads hold only
 * the shard, (S) each, element 0 being global element shard_begin. */
loom_status loom_optim_step_shard(loom_optim *o, float *params,
                                  const float *grads, float lr);
/* Part of a step: updates only global elements [begin, end), which must lie
 * in the shard; params and grads are the full (N) buffers. Several disjoint
 * ranges (say, one per gradient bucket as it becomes ready) make one step;
 * all see step number get_step() + 1 until loom_optim_finish_step. Calls on
 * disjoint ranges only read the optimizer, so threads may make them at once. */
loom_status loom_optim_step_range(loom_optim *o, float *params,
                                  const float *grads, float lr, int64_t begin,
                                  int64_t end);
/* Mixed precision on the conversion path: while out is set, every step
 * (of the three above) also writes each parameter it updates, rounded to
 * half type dt (LOOM_BF16 or LOOM_F16, loom_round_half's bits), into out,
 * addressed as params is (out[i - shard_begin] for loom_optim_step_shard),
 * block by block while the values are in cache: the model's copy
 * (loom_model_rounded_copy) kept current with no refresh pass of its own.
 * out NULL: none (the default). LOOM_ERR_INVALID_ARG for another type. */
loom_status loom_optim_set_rounded(loom_optim *o, loom_dtype dt, float *out);
/* Ends a step made of loom_optim_step_range calls: the step count + 1. */
void loom_optim_finish_step(loom_optim *o);

/* Steps completed (what AdamW's bias correction counts). */
int64_t loom_optim_get_step(const loom_optim *o);
/* For restoring a checkpoint; LOOM_ERR_INVALID_ARG when step < 0. */
loom_status loom_optim_set_step(loom_optim *o, int64_t step);
const loom_optim_opts *loom_optim_get_opts(const loom_optim *o);

/* A state buffer, for checkpoints: save data[0..count) and write it back to
 * restore. Names are stable: "sgd.momentum", "adamw.m", "adamw.v". */
typedef struct loom_optim_state {
  const char *name;
  float *data;   /* (count), owned by the optimizer */
  int64_t begin; /* global offset of data[0] (shard_begin) */
  int64_t count; /* shard_end - shard_begin */
} loom_optim_state;

/* Number of state buffers (0 for plain SGD, 1 for SGD with momentum, 2 for
 * AdamW), and buffer i of them, 0 <= i < count. */
int loom_optim_state_count(const loom_optim *o);
loom_status loom_optim_state_get(const loom_optim *o, int i,
                                 loom_optim_state *out);

/* ------------------------------------------------------------- schedules */

#define LOOM_SCHED_KIND_LIST(X)                                                \
  X(LOOM_SCHED_CONSTANT, "constant")                                           \
  X(LOOM_SCHED_STEP, "step")                                                   \
  X(LOOM_SCHED_COSINE, "cosine")                                               \
  X(LOOM_SCHED_LINEAR, "linear")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_SCHED_KIND_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_SCHED_KIND_COUNT
} loom_sched_kind;

const char *loom_sched_kind_name(loom_sched_kind k);
/* The names, indexed by value: what configs and checkpoints hold (the
 * config schema reads this table, so a value has one spelling). */
extern const char *const loom_sched_kind_names[LOOM_SCHED_KIND_COUNT];
loom_status loom_sched_kind_parse(const char *name, loom_sched_kind *out);

/* The learning rate of step `step` (0 for the first optimizer step):
 *   warmup (every kind): step < warmup_steps: lr * (step + 1) / warmup_steps
 *   then, with s = step - warmup_steps,
 *   constant: lr
 *   step:     lr * gamma^floor(s / step_size)           (PyTorch StepLR)
 *   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * s / D)) / 2
 *   linear:   min_lr + (lr - min_lr) * (1 - s / D)
 * with D = total_steps - warmup_steps; min_lr from step total_steps on. */
typedef struct loom_sched {
  loom_sched_kind kind;
  float lr;             /* the peak rate, reached at the end of warmup */
  int64_t warmup_steps; /* 0 = none */
  int64_t total_steps;  /* cosine, linear: where the decay reaches min_lr */
  float min_lr;         /* cosine, linear: the floor */
  int64_t step_size;    /* step: steps between decays */
  float gamma;          /* step: factor per decay */
} loom_sched;

/* constant, lr 1e-3, no warmup, step_size 1, gamma 0.1, min_lr 0. */
loom_sched loom_sched_default(void);
/* LOOM_ERR_INVALID_ARG with the field named when the schedule is unusable. */
loom_status loom_sched_check(const loom_sched *s);
/* Pure; computed in double. Meaningful for schedules that pass the check
 * (0 for a NULL s). */
float loom_sched_lr(const loom_sched *s, int64_t step);

/* Scaling rules of the learning rate with the global batch: linear (Goyal et
 * al. 2017, "Accurate, Large Minibatch SGD") or square root (Krizhevsky
 * 2014, "One weird trick"). */
#define LOOM_LR_RULE_LIST(X)                                                   \
  X(LOOM_LR_RULE_NONE, "none")                                                 \
  X(LOOM_LR_RULE_LINEAR, "linear")                                             \
  X(LOOM_LR_RULE_SQRT, "sqrt")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_LR_RULE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_LR_RULE_COUNT
} loom_lr_rule;

const char *loom_lr_rule_name(loom_lr_rule r);
/* The names, indexed by value: what configs and checkpoints hold (the
 * config schema reads this table, so a value has one spelling). */
extern const char *const loom_lr_rule_names[LOOM_LR_RULE_COUNT];
loom_status loom_lr_rule_parse(const char *name, loom_lr_rule *out);
/* *out = lr * k (linear) or lr * sqrt(k) (sqrt) with k = global_batch /
 * base_batch; both batches must be >= 1. */
loom_status loom_lr_scale(loom_lr_rule rule, float lr, int64_t global_batch,
                          int64_t base_batch, float *out);

/* ------------------------------------------------------ gradient clipping */

/* Elements per partial sum of loom_grad_sumsq. */
#define LOOM_GRAD_CHUNK 8192

/* Sum of squares of g (n), accumulated in double in a fixed order: each
 * chunk of LOOM_GRAD_CHUNK elements in 16 interleaved lanes, the chunks added
 * in index order. Bitwise the same for any thread count. */
double loom_grad_sumsq(const float *g, int64_t n);
/* g *= s, elementwise. */
void loom_grad_scale(float *g, int64_t n, float s);
/* Clips by global L2 norm as PyTorch's clip_grad_norm_: when norm + 1e-6 >
 * max_norm, g *= max_norm / (norm + 1e-6). Sets *norm (may be NULL) to the
 * norm before clipping. A non-finite norm leaves g untouched (the loss
 * scaler skips such steps). max_norm must be > 0. */
loom_status loom_grad_clip(float *g, int64_t n, float max_norm, double *norm);
/* The same with the global sum of squares given: each rank passes its part
 * of the gradients and the all-reduced sum of loom_grad_sumsq of the parts. */
loom_status loom_grad_clip_sumsq(float *g, int64_t n, double sumsq,
                                 float max_norm, double *norm);
/* True when some element of g is an infinity or a NaN. */
bool loom_grad_has_nonfinite(const float *g, int64_t n);

/* ----------------------------------------------------------- loss scaler */

/* Dynamic loss scaling for f16 (PyTorch GradScaler): the loss is multiplied
 * by `scale` before backward; gradients are unscaled before the optimizer;
 * a step whose gradients hold an inf or NaN is skipped and the scale backs
 * off; after growth_interval good steps in a row it grows. Save the whole
 * struct in checkpoints. */
typedef struct loom_scaler {
  float scale;             /* 65536 */
  float growth_factor;     /* 2 */
  float backoff_factor;    /* 0.5 */
  int64_t growth_interval; /* 2000 */
  int64_t good_steps;      /* steps since the last inf/NaN or growth */
} loom_scaler;

loom_scaler loom_scaler_default(void);
/* LOOM_ERR_INVALID_ARG unless scale is finite and at least FLT_MIN (the
 * smallest normal f32: the unscaling multiplies by its reciprocal, which
 * overflows below), growth_factor > 1, 0 < backoff_factor < 1,
 * growth_interval >= 1, good_steps >= 0. */
loom_status loom_scaler_check(const loom_scaler *s);
/* g *= 1/scale (the reciprocal rounded to f32 once, as PyTorch); returns
 * true when some element of the result is an inf or NaN. Ranks OR their
 * results (an all-reduce) before loom_scaler_update. */
bool loom_scaler_unscale(const loom_scaler *s, float *g, int64_t n);
/* After each step: on found_inf scale *= backoff_factor and the count
 * restarts; else after growth_interval good steps scale *= growth_factor
 * (kept only if finite). LOOM_ERR_INVALID_ARG, *s unchanged, for a scaler
 * loom_scaler_check refuses (NULL among them), and when a backoff
 * would take the scale below FLT_MIN: every step since the scale was
 * normal overflowed, so the gradients are inf or NaN at any scale (a
 * diverged model; PyTorch's GradScaler would skip every step from then
 * on). */
loom_status loom_scaler_update(loom_scaler *s, bool found_inf);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_OPTIM_H */
