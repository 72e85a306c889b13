/* Learning-rate schedules (warmup, constant, step, cosine, linear) and the
 * batch-size scaling rules. */
#include "loom/optim.h"

#include <math.h>
#include <string.h>

const char *const loom_sched_kind_names[] = {
#define LOOM_X_ROW(name, text) text,
    LOOM_SCHED_KIND_LIST(LOOM_X_ROW)
#undef LOOM_X_ROW
};
_Static_assert(sizeof loom_sched_kind_names / sizeof loom_sched_kind_names[0] ==
                   LOOM_SCHED_KIND_COUNT,
               "schedule kind table size");

const char *const loom_lr_rule_names[] = {
#define LOOM_X_ROW(name, text) text,
    LOOM_LR_RULE_LIST(LOOM_X_ROW)
#undef LOOM_X_ROW
};
_Static_assert(sizeof loom_lr_rule_names / sizeof loom_lr_rule_names[0] ==
                   LOOM_LR_RULE_COUNT,
               "lr rule table size");

const char *loom_sched_kind_name(loom_sched_kind k) {
  return (unsigned)k < LOOM_SCHED_KIND_COUNT ? loom_sched_kind_names[k] : "?";
}

loom_status loom_sched_kind_parse(const char *name, loom_sched_kind *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_kind_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(name, loom_sched_kind_names, LOOM_SCHED_KIND_COUNT,
                           "schedule", &i));
  *out = (loom_sched_kind)i;
  return LOOM_OK;
}

const char *loom_lr_rule_name(loom_lr_rule r) {
  return (unsigned)r < LOOM_LR_RULE_COUNT ? loom_lr_rule_names[r] : "?";
}

loom_status loom_lr_rule_parse(const char *name, loom_lr_rule *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_lr_rule_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(name, loom_lr_rule_names, LOOM_LR_RULE_COUNT,
                           "lr scaling rule", &i));
  *out = (loom_lr_rule)i;
  return LOOM_OK;
}

loom_sched loom_sched_default(void) {
  loom_sched s;
  memset(&s, 0, sizeof s);
  s.kind = LOOM_SCHED_CONSTANT;
  s.lr = 1e-3f;
  s.warmup_steps = 0;
  s.total_steps = 0;
  s.min_lr = 0.0f;
  s.step_size = 1;
  s.gamma = 0.1f;
  return s;
}

loom_status loom_sched_check(const loom_sched *s) {
  if (!s)
    return loom_error(LOOM_ERR_INVALID_ARG, "schedule: NULL");
  if ((unsigned)s->kind >= LOOM_SCHED_KIND_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "schedule: unknown kind %d",
                      (int)s->kind);
  if (!(s->lr >= 0.0f) || isinf(s->lr))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "schedule: lr must be finite and >= 0 (got %g)",
                      (double)s->lr);
  if (s->warmup_steps < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "schedule: warmup_steps must be >= 0 (got %lld)",
                      (long long)s->warmup_steps);
  switch (s->kind) {
  case LOOM_SCHED_CONSTANT:
    return LOOM_OK;
  case LOOM_SCHED_STEP:
    if (s->step_size < 1)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "schedule: step_size must be >= 1 (got %lld)",
                        (long long)s->step_size);
    if (!(s->gamma > 0.0f) || isinf(s->gamma))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "schedule: gamma must be finite and > 0 (got %g)",
                        (double)s->gamma);
    return LOOM_OK;
  case LOOM_SCHED_COSINE:
  case LOOM_SCHED_LINEAR:
    if (s->total_steps <= s->warmup_steps)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "schedule: %s needs total_steps (%lld) > "
                        "warmup_steps (%lld)",
                        loom_sched_kind_names[s->kind],
                        (long long)s->total_steps, (long long)s->warmup_steps);
    if (!(s->min_lr >= 0.0f && s->min_lr <= s->lr))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "schedule: min_lr must be in [0, lr = %g] (got %g)",
                        (double)s->lr, (double)s->min_lr);
    return LOOM_OK;
  default:
    return loom_error(LOOM_ERR_UNSUPPORTED, "schedule: kind %d", (int)s->kind);
  }
}

float loom_sched_lr(const loom_sched *s, int64_t step) {
  if (!s)
    return 0.0f;
  double lr = s->lr;
  if (step < 0)
    step = 0;
  /* (step + 1): the first step already moves the weights (as llm.c). */
  if (step < s->warmup_steps)
    return (float)(lr * (double)(step + 1) / (double)s->warmup_steps);
  int64_t t = step - s->warmup_steps;
  switch (s->kind) {
  case LOOM_SCHED_STEP: {
    int64_t k = s->step_size > 0 ? t / s->step_size : 0;
    return (float)(lr * pow((double)s->gamma, (double)k));
  }
  case LOOM_SCHED_COSINE:
  case LOOM_SCHED_LINEAR: {
    int64_t d = s->total_steps - s->warmup_steps;
    double lo = s->min_lr;
    if (d <= 0 || t >= d)
      return s->min_lr;
    double r = (double)t / (double)d;
    double c =
        s->kind == LOOM_SCHED_COSINE ? 0.5 * (1.0 + cos(M_PI * r)) : 1.0 - r;
    return (float)(lo + (lr - lo) * c);
  }
  case LOOM_SCHED_CONSTANT:
  default:
    return s->lr;
  }
}

loom_status loom_lr_scale(loom_lr_rule rule, float lr, int64_t global_batch,
                          int64_t base_batch, float *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "lr scaling: out is NULL");
  if (global_batch < 1 || base_batch < 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "lr scaling: batches must be >= 1 (global %lld, base "
                      "%lld)",
                      (long long)global_batch, (long long)base_batch);
  double k = (double)global_batch / (double)base_batch;
  switch (rule) {
  case LOOM_LR_RULE_NONE:
    *out = lr;
    return LOOM_OK;
  case LOOM_LR_RULE_LINEAR:
    *out = (float)((double)lr * k);
    return LOOM_OK;
  case LOOM_LR_RULE_SQRT:
    *out = (float)((double)lr * sqrt(k));
    return LOOM_OK;
  default:
    return loom_error(LOOM_ERR_INVALID_ARG, "lr scaling: unknown rule %d",
                      (int)rule);
  }
}
