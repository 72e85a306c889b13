/* The trainer's checkpoints: what state is saved, and resuming from it so a
 * run continues bitwise as if never stopped. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "loom/ckpt.h"
#include "train/trainer.h"

int loom_train_rank(void) { return 0; }
int loom_train_world(void) { return 1; }

/* Buffer names in the checkpoint: "params" and "optim.<state name>". */
static void state_buffer_name(char *buf, size_t n, const char *state) {
  snprintf(buf, n, "optim.%s", state);
}

static const char *sched_name(const loom_trainer *t) {
  return loom_cfg_sched_names[t->cfg.schedule.name];
}

static loom_status fill_meta(loom_trainer *t, loom_ckpt_meta *meta) {
  *meta = loom_ckpt_meta_default();
  snprintf(meta->strategy, sizeof meta->strategy, "%s", "none");
  meta->config_hash = loom_config_hash(&t->cfg);
  meta->n_views = loom_model_num_views(t->model);
  meta->views = loom_model_view(t->model, 0);
  snprintf(meta->optimizer, sizeof meta->optimizer, "%s",
           loom_cfg_optim_names[t->cfg.optim.name]);
  meta->optimizer_step = loom_optim_get_step(t->optim);
  snprintf(meta->schedule, sizeof meta->schedule, "%s", sched_name(t));
  meta->schedule_step = t->step;
  meta->lr = t->step > 0 ? loom_sched_lr(&t->sched, t->step - 1) : 0;
  loom_loader_state ls;
  loom_loader_get_state(t->train_loader, &ls);
  meta->data.epoch = ls.epoch;
  meta->data.batch = ls.batch;
  meta->data.sample = ls.batch * ls.global_batch;
  return LOOM_OK;
}

loom_status loom_train_ckpt_save(loom_trainer *t) {
  const loom_config_checkpoint *cc = &t->cfg.checkpoint;
  if (!cc->enabled || !cc->dir[0])
    return LOOM_OK;
  /* The previous async save must be complete before the next starts. */
  if (t->pending) {
    loom_status ps = loom_ckpt_writer_wait(t->pending);
    loom_ckpt_writer_free(t->pending);
    t->pending = NULL;
    if (ps != LOOM_OK && cc->on_error == LOOM_CFG_ON_ERROR_STOP)
      return loom_error_context(ps, "saving a checkpoint");
    if (ps != LOOM_OK)
      LOOM_WARN("checkpoint not saved, training goes on: %s",
                loom_last_error());
  }
  double t0 = loom_time_now();
  loom_ckpt_writer_opts wo = loom_ckpt_writer_opts_default();
  wo.rank = loom_train_rank();
  wo.world = loom_train_world();
  wo.keep = (int)cc->keep;
  wo.copy = cc->async;
  loom_ckpt_writer *w = NULL;
  loom_ckpt_meta meta;
  int64_t n = loom_model_num_params(t->model);
  loom_status s;
  LOOM_TRY_GOTO(s, loom_ckpt_writer_new(&w, cc->dir, t->step, &wo), fail);
  LOOM_TRY_GOTO(s,
                loom_ckpt_writer_add(w, "params", LOOM_F32, n, 0, n,
                                     loom_model_params(t->model)),
                fail);
  for (int i = 0; i < loom_optim_state_count(t->optim); i++) {
    loom_optim_state st;
    char name[LOOM_CKPT_NAME_MAX];
    LOOM_TRY_GOTO(s, loom_optim_state_get(t->optim, i, &st), fail);
    state_buffer_name(name, sizeof name, st.name);
    LOOM_TRY_GOTO(s,
                  loom_ckpt_writer_add(w, name, LOOM_F32, n, st.begin,
                                       st.begin + st.count, st.data),
                  fail);
  }
  LOOM_TRY_GOTO(s, fill_meta(t, &meta), fail);
  LOOM_TRY_GOTO(s, loom_ckpt_writer_set_meta(w, &meta), fail);
  if (cc->async) {
    LOOM_TRY_GOTO(s, loom_ckpt_writer_start(w, true), fail);
    t->pending = w;
    t->ckpt_seconds += loom_time_now() - t0;
    return LOOM_OK;
  }
  LOOM_TRY_GOTO(s, loom_ckpt_writer_write(w), fail);
  LOOM_TRY_GOTO(s, loom_ckpt_writer_commit(w), fail);
  loom_ckpt_writer_free(w);
  t->ckpt_seconds += loom_time_now() - t0;
  return LOOM_OK;
fail:
  if (w) {
    loom_ckpt_writer_abort(w);
    loom_ckpt_writer_free(w);
  }
  if (cc->on_error == LOOM_CFG_ON_ERROR_CONTINUE) {
    LOOM_WARN("checkpoint of step %lld not saved, training goes on: %s",
              (long long)t->step, loom_last_error());
    return LOOM_OK;
  }
  return loom_error_context(s, "saving the checkpoint of step %lld",
                            (long long)t->step);
}

loom_status loom_train_ckpt_finish(loom_trainer *t) {
  if (!t->pending)
    return LOOM_OK;
  loom_status s = loom_ckpt_writer_wait(t->pending);
  loom_ckpt_writer_free(t->pending);
  t->pending = NULL;
  if (s != LOOM_OK)
    return loom_error_context(s, "saving a checkpoint");
  return LOOM_OK;
}

static loom_status restore(loom_trainer *t, const loom_ckpt *c) {
  const loom_ckpt_meta *meta = loom_ckpt_get_meta(c);
  int64_t n = loom_model_num_params(t->model);
  loom_ckpt_buffer_info bi;
  LOOM_TRY(loom_ckpt_buffer_find(c, "params", &bi));
  if (bi.count != n || bi.dtype != LOOM_F32)
    return loom_error(LOOM_ERR_MISMATCH,
                      "%s: params hold %lld %s values, the model has %lld "
                      "f32",
                      loom_ckpt_path(c), (long long)bi.count,
                      loom_dtype_name(bi.dtype), (long long)n);
  LOOM_TRY(loom_ckpt_read_range(c, "params", 0, n, loom_model_params(t->model)));
  if (strcmp(meta->optimizer, loom_cfg_optim_names[t->cfg.optim.name]) != 0)
    return loom_error(LOOM_ERR_MISMATCH,
                      "%s: saved with optimizer '%s', the config says '%s'",
                      loom_ckpt_path(c), meta->optimizer,
                      loom_cfg_optim_names[t->cfg.optim.name]);
  for (int i = 0; i < loom_optim_state_count(t->optim); i++) {
    loom_optim_state st;
    char name[LOOM_CKPT_NAME_MAX];
    LOOM_TRY(loom_optim_state_get(t->optim, i, &st));
    state_buffer_name(name, sizeof name, st.name);
    LOOM_TRY(loom_ckpt_read_range(c, name, st.begin, st.begin + st.count,
                                  st.data));
  }
  LOOM_TRY(loom_optim_set_step(t->optim, meta->optimizer_step));
  t->step = meta->step;
  loom_loader_state ls;
  loom_loader_get_state(t->train_loader, &ls);
  int64_t gb = ls.global_batch;
  ls.epoch = meta->data.epoch;
  ls.batch = meta->data.batch;
  ls.global_batch = meta->data.batch > 0 ? meta->data.sample / meta->data.batch
                                         : gb;
  LOOM_TRY(loom_loader_set_state(t->train_loader, &ls));
  if (meta->config_hash != loom_config_hash(&t->cfg))
    LOOM_WARN("%s was saved with a different config; resuming with the "
              "current one",
              loom_ckpt_path(c));
  return LOOM_OK;
}

loom_status loom_train_ckpt_resume(loom_trainer *t) {
  const char *how = t->opts.resume;
  if (strcmp(how, "never") == 0)
    return LOOM_OK;
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.layout_hash = loom_ckpt_layout_hash(loom_model_view(t->model, 0),
                                         loom_model_num_views(t->model));
  loom_ckpt *c = NULL;
  if (strcmp(how, "auto") == 0) {
    if (!t->cfg.checkpoint.enabled || !t->cfg.checkpoint.dir[0])
      return LOOM_OK;
    loom_status s =
        loom_ckpt_open_latest_valid(&c, t->cfg.checkpoint.dir, &oo);
    if (s != LOOM_OK)
      return loom_error_context(s, "resuming from %s", t->cfg.checkpoint.dir);
    if (!c)
      return LOOM_OK; /* nothing saved yet: a fresh start */
  } else {
    LOOM_TRY(loom_ckpt_open(&c, how, &oo));
  }
  loom_status s = restore(t, c);
  if (s == LOOM_OK && loom_train_rank() == 0 && !t->opts.quiet)
    LOOM_INFO("resuming from %s (step %lld)", loom_ckpt_path(c),
              (long long)t->step);
  loom_ckpt_close(c);
  if (s != LOOM_OK)
    return loom_error_context(s, "resuming");
  return LOOM_OK;
}
