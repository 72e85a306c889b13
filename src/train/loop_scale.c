/* Loss scaling for f16 training (train.loss_scale, docs/precision.md): the
 * loss weighed by the scale before backward, the reduced gradient unscaled
 * before clipping and the optimizer, a step with an inf or NaN skipped on
 * every rank, the dynamic scale's updates (loom_scaler: PyTorch
 * GradScaler's rules), its state in checkpoints and metrics. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "trainer.h"

loom_status loom_train_scale_init(loom_trainer *t) {
  double scale = 1.0;
  LOOM_TRY(loom_config_loss_scale(&t->cfg, &t->ls_mode, &scale));
  t->scaler = loom_scaler_default();
  t->scaler.scale = (float)scale;
  t->scaler.growth_interval = t->cfg.train.loss_scale_growth_interval;
  t->ls_skipped = 0;
  if (t->ls_mode == LOOM_LOSS_SCALE_NONE)
    return LOOM_OK;
  LOOM_TRY(loom_scaler_check(&t->scaler));
  if (t->rank == 0 && !t->opts.quiet) {
    if (t->ls_mode == LOOM_LOSS_SCALE_DYNAMIC)
      LOOM_INFO("loss scaling: dynamic from %g (x%g and the step skipped on "
                "an inf or NaN gradient on any rank, x%g after %lld good "
                "steps)",
                (double)t->scaler.scale, (double)t->scaler.backoff_factor,
                (double)t->scaler.growth_factor,
                (long long)t->scaler.growth_interval);
    else
      LOOM_INFO("loss scaling: static %g (a step with an inf or NaN gradient "
                "on any rank is skipped)",
                (double)t->scaler.scale);
  }
  return LOOM_OK;
}

float loom_train_loss_scale(const loom_trainer *t) {
  return t->ls_mode == LOOM_LOSS_SCALE_NONE ? 1.0f : t->scaler.scale;
}

/* LOOM_FAULT grad_inf armed for the step about to be taken on this rank. */
static bool fault_now(const loom_trainer *t) {
  for (int i = 0; i < t->n_faults; i++)
    if (t->faults[i].kind == LOOM_FAULT_GRAD_INF &&
        t->faults[i].step == t->step + 1)
      return true;
  return false;
}

loom_status loom_train_scale_unscale(loom_trainer *t, float *g, int64_t n,
                                     bool *skip) {
  *skip = false;
  if (t->ls_mode == LOOM_LOSS_SCALE_NONE)
    return LOOM_OK;
  if (n > 0 && fault_now(t)) {
    LOOM_WARN("fault injected: an inf in this rank's gradient at step %lld",
              (long long)t->step + 1);
    g[0] = INFINITY;
  }
  int32_t bad = loom_scaler_unscale(&t->scaler, g, n) ? 1 : 0;
  if (t->nranks > 1) {
    /* Each rank may have checked another part of the gradient (ZeRO-2's
     * slices): one flag, the same on every rank, decides. */
    int32_t any = 0;
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_allreduce(&bad, &any, 1, LOOM_I32, LOOM_MAX, t->world, &r));
    LOOM_TRY(loom_wait(&r));
    bad = any;
  }
  *skip = bad != 0;
  const float before = t->scaler.scale;
  if (t->ls_mode == LOOM_LOSS_SCALE_DYNAMIC &&
      loom_scaler_update(&t->scaler, *skip) != LOOM_OK)
    /* every rank got the same flag: all of them stop here, before a
     * checkpoint could hold a scale no run can resume with */
    return loom_error(LOOM_ERR_INTERNAL,
                      "step %lld: f16 loss scaling: a gradient holds an inf "
                      "or NaN even at loss scale %g, which cannot be halved "
                      "again (skipped so far: %lld): training "
                      "diverged (lower optim.lr or set optim.grad_clip; "
                      "bf16 needs no loss scaling)",
                      (long long)t->step + 1, (double)before,
                      (long long)t->ls_skipped + 1);
  if (*skip) {
    t->ls_skipped++;
    if (t->rank == 0 && t->ls_mode == LOOM_LOSS_SCALE_STATIC &&
        (t->ls_skipped & (t->ls_skipped - 1)) == 0)
      /* A static scale does not back off: every step that overflows at it
       * is lost, and a run can end having trained nothing. Said as a
       * warning, at the 1st, 2nd, 4th, ... skip. */
      LOOM_WARN("step %lld skipped: a gradient holds an inf or NaN at the "
                "static loss scale %g (%lld step(s) skipped so far); a "
                "static scale never backs off, so each step that overflows "
                "is lost: use train.loss_scale: dynamic, or a smaller scale",
                (long long)t->step + 1, (double)before,
                (long long)t->ls_skipped);
    else if (t->rank == 0 && !t->opts.quiet)
      LOOM_INFO("step %lld skipped: a gradient holds an inf or NaN (loss "
                "scale %g); loss scale now %g",
                (long long)t->step + 1, (double)before,
                (double)t->scaler.scale);
  }
  return LOOM_OK;
}

void loom_train_scale_meta(loom_trainer *t, loom_ckpt_meta *meta) {
  if (t->ls_mode == LOOM_LOSS_SCALE_NONE)
    return;
  meta->loss_scale = t->scaler.scale;
  snprintf(t->ls_extra, sizeof t->ls_extra,
           "{\"loss_scaler\":{\"mode\":\"%s\",\"good_steps\":%lld,"
           "\"skipped\":%lld}}",
           t->ls_mode == LOOM_LOSS_SCALE_DYNAMIC ? "dynamic" : "static",
           (long long)t->scaler.good_steps, (long long)t->ls_skipped);
  meta->extra_json = t->ls_extra;
}

void loom_train_scale_restore(loom_trainer *t, const loom_ckpt_meta *meta) {
  if (t->ls_mode == LOOM_LOSS_SCALE_NONE || !meta->extra_json)
    return;
  cJSON *root = cJSON_Parse(meta->extra_json);
  const cJSON *ls = cJSON_GetObjectItemCaseSensitive(root, "loss_scaler");
  if (!cJSON_IsObject(ls)) { /* older, or saved without loss scaling */
    cJSON_Delete(root);
    return;
  }
  /* The checkpoint's reader checked every field (mode dynamic or static,
   * the counts whole numbers of steps up to the checkpoint's, loss_scale
   * in f32's normal range), so that `loom ckpt verify` and the search for
   * the newest valid checkpoint refuse what a resume would. */
  const char *mode =
      cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ls, "mode"));
  const bool dyn = mode && strcmp(mode, "dynamic") == 0;
  const cJSON *good = cJSON_GetObjectItemCaseSensitive(ls, "good_steps");
  const cJSON *skipped = cJSON_GetObjectItemCaseSensitive(ls, "skipped");
  /* The saved scale and count carry on when both runs scale dynamically; a
   * static scale is the config's. */
  if (dyn && t->ls_mode == LOOM_LOSS_SCALE_DYNAMIC) {
    t->scaler.scale = (float)meta->loss_scale;
    t->scaler.good_steps = (int64_t)cJSON_GetNumberValue(good);
  }
  t->ls_skipped = (int64_t)cJSON_GetNumberValue(skipped);
  cJSON_Delete(root);
}

void loom_train_scale_metrics(const loom_trainer *t, loom_metrics *m) {
  if (t->ls_mode == LOOM_LOSS_SCALE_NONE)
    return;
  loom_metrics_num(m, "loss_scale", t->scaler.scale);
  loom_metrics_int(m, "skipped_steps", t->ls_skipped);
}
