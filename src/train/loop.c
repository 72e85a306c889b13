/* The training loop: model, data, optimizer, schedule, evaluation, metrics,
 * progress and checkpoints from one config. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "loom/config.h"
#include "loom/data.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/train.h"
#include "train/trainer.h"


static volatile sig_atomic_t stop_requested;

void loom_trainer_request_stop(void) { stop_requested = 1; }

loom_train_opts loom_train_opts_default(void) {
  loom_train_opts o = {"auto", 0, false};
  return o;
}

loom_model *loom_trainer_model(loom_trainer *t) { return t->model; }

/* ------------------------------------------------------------- building */

static loom_status build_model(loom_trainer *t) {
  const loom_config_model *mc = &t->cfg.model;
  loom_model_opts mo = loom_model_opts_default();
  mo.seed = (uint64_t)t->cfg.train.seed;
  switch (mc->name) {
  case LOOM_CFG_MODEL_MLP: {
    loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
    if (mc->hidden.n < 1)
      return loom_error(LOOM_ERR_CONFIG, "model.hidden: at least one layer");
    for (int i = 1; i < mc->hidden.n; i++)
      if (mc->hidden.v[i] != mc->hidden.v[0])
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "model.hidden: layers of different widths are not "
                          "supported yet (got %lld and %lld)",
                          (long long)mc->hidden.v[0],
                          (long long)mc->hidden.v[i]);
    if (mc->activation != LOOM_CFG_ACT_RELU)
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "model.activation: the mlp supports relu only");
    o.hidden = (int)mc->hidden.v[0];
    o.n_hidden = mc->hidden.n;
    return loom_fashion_mlp_new(&t->model, &o, &mo);
  }
  case LOOM_CFG_MODEL_CNN: {
    loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
    if (mc->channels.n != 2)
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "model.channels: the cnn has exactly two conv layers "
                        "(got %d)",
                        mc->channels.n);
    o.c1 = (int)mc->channels.v[0];
    o.c2 = (int)mc->channels.v[1];
    o.kernel = (int)mc->kernel;
    o.pool = (int)mc->pool;
    return loom_fashion_cnn_new(&t->model, &o, &mo);
  }
  case LOOM_CFG_MODEL_GPT: {
    loom_gpt_opts o = loom_gpt_opts_default();
    o.vocab = (int)mc->vocab;
    o.context = (int)mc->context;
    o.n_layer = (int)mc->layers;
    o.d_model = (int)mc->d_model;
    o.n_head = (int)mc->heads;
    o.mlp_ratio = (int)mc->mlp_ratio;
    o.dropout = (float)mc->dropout;
    mo.init = LOOM_INIT_GPT2;
    mo.init_std = (float)mc->init_std;
    mo.init_n_layer = o.n_layer;
    return loom_gpt_new(&t->model, &o, &mo);
  }
  default:
    return loom_error(LOOM_ERR_UNSUPPORTED, "model.name: unknown model");
  }
}

static loom_status open_data(loom_trainer *t) {
  const loom_config_data *dc = &t->cfg.data;
  const char *path = dc->path[0] ? dc->path : NULL;
  loom_text_opts to = loom_text_opts_default();
  to.context = t->cfg.model.context;
  to.val_fraction = dc->val_fraction;
  to.seed = (uint64_t)t->cfg.train.seed;
  switch (dc->dataset) {
  case LOOM_CFG_DATASET_FASHION_MNIST: {
    loom_image_opts io = loom_image_opts_default();
    LOOM_TRY(loom_dataset_open_fashion(&t->train_ds, path, LOOM_SPLIT_TRAIN,
                                       &io));
    LOOM_TRY(
        loom_dataset_open_fashion(&t->val_ds, path, LOOM_SPLIT_VAL, &io));
    break;
  }
  case LOOM_CFG_DATASET_KJV: {
    char kjv[LOOM_CONFIG_STR_MAX];
    if (path) {
      snprintf(kjv, sizeof kjv, "%s", path);
    } else {
      LOOM_TRY(loom_kjv_default_path(kjv, sizeof kjv));
    }
    /* data.path may name any byte-level text; the KJV is prepared (once,
     * cached) only where no file exists yet. */
    if (!path || access(kjv, R_OK) != 0) {
      loom_kjv_opts ko = loom_kjv_opts_default();
      loom_kjv_info info;
      LOOM_TRY(loom_kjv_prepare(kjv, &ko, &info));
    }
    LOOM_TRY(loom_dataset_open_text(&t->train_ds, kjv, LOOM_SPLIT_TRAIN, &to));
    to.random_offset = false;
    LOOM_TRY(loom_dataset_open_text(&t->val_ds, kjv, LOOM_SPLIT_VAL, &to));
    t->is_text = true;
    break;
  }
  case LOOM_CFG_DATASET_BIN: {
    if (!path || !dc->val_path[0])
      return loom_error(LOOM_ERR_CONFIG,
                        "data.dataset 'bin' needs data.path and "
                        "data.val_path (llm.c token shards)");
    LOOM_TRY(loom_dataset_open_shards(&t->train_ds, path, &to));
    to.random_offset = false;
    LOOM_TRY(loom_dataset_open_shards(&t->val_ds, dc->val_path, &to));
    t->is_text = true;
    break;
  }
  default:
    return loom_error(LOOM_ERR_UNSUPPORTED, "data.dataset: unknown data set");
  }
  /* The data must fit the model. */
  loom_dataset_info info;
  loom_dataset_get_info(t->train_ds, &info);
  if (t->is_text && t->cfg.model.name != LOOM_CFG_MODEL_GPT)
    return loom_error(LOOM_ERR_CONFIG,
                      "data.dataset: text data needs model.name gpt");
  if (!t->is_text && t->cfg.model.name == LOOM_CFG_MODEL_GPT)
    return loom_error(LOOM_ERR_CONFIG,
                      "data.dataset: the gpt model needs text data");
  if (t->is_text && info.classes > t->cfg.model.vocab)
    return loom_error(LOOM_ERR_CONFIG,
                      "model.vocab %lld is smaller than the data's largest "
                      "token id + 1 (%lld)",
                      (long long)t->cfg.model.vocab, (long long)info.classes);
  return LOOM_OK;
}

static loom_status make_loader(loom_trainer *t) {
  loom_loader_opts lo = loom_loader_opts_default();
  lo.sampler.seed = (uint64_t)t->cfg.train.seed;
  lo.sampler.shuffle = t->cfg.data.shuffle;
  lo.sampler.tail = (loom_tail)t->cfg.data.tail;
  lo.sampler.batch = t->batch;
  lo.sampler.rank = 0;
  lo.sampler.world = 1;
  lo.prefetch = (int)t->cfg.data.prefetch;
  LOOM_TRY(loom_loader_new(&t->train_loader, t->train_ds, &lo));
  int64_t nb = loom_loader_batches_per_epoch(t->train_loader);
  t->steps_per_epoch = nb / t->accumulate;
  if (t->steps_per_epoch < 1)
    return loom_error(LOOM_ERR_CONFIG,
                      "train.batch_size %lld x train.accumulate %lld is more "
                      "than one epoch of the data (%lld batches)",
                      (long long)t->batch, (long long)t->accumulate,
                      (long long)nb);
  return LOOM_OK;
}

static loom_status make_optim(loom_trainer *t) {
  const loom_config_optim *oc = &t->cfg.optim;
  loom_optim_opts oo = loom_optim_opts_default();
  oo.kind = oc->name == LOOM_CFG_OPTIM_ADAMW ? LOOM_OPTIM_ADAMW : LOOM_OPTIM_SGD;
  oo.momentum = oc->momentum;
  oo.nesterov = oc->nesterov;
  oo.beta1 = oc->beta1;
  oo.beta2 = oc->beta2;
  oo.eps = oc->eps;
  oo.weight_decay = oc->weight_decay;
  int nv = loom_model_num_views(t->model);
  loom_param *views = loom_calloc((size_t)nv, sizeof *views);
  if (!views)
    return LOOM_ERR_NOMEM;
  for (int i = 0; i < nv; i++)
    views[i] = *loom_model_view(t->model, i);
  loom_status s = loom_optim_new(&t->optim, &oo, views, nv,
                                 loom_model_num_params(t->model));
  loom_free(views);
  if (s != LOOM_OK)
    return loom_error_context(s, "optim");

  const loom_config_schedule *sc = &t->cfg.schedule;
  loom_sched sd = loom_sched_default();
  static const loom_sched_kind kinds[] = {
      [LOOM_CFG_SCHED_CONSTANT] = LOOM_SCHED_CONSTANT,
      [LOOM_CFG_SCHED_STEP] = LOOM_SCHED_STEP,
      [LOOM_CFG_SCHED_COSINE] = LOOM_SCHED_COSINE,
      [LOOM_CFG_SCHED_LINEAR] = LOOM_SCHED_LINEAR,
  };
  sd.kind = kinds[sc->name];
  sd.lr = (float)oc->lr;
  static const loom_lr_rule rules[] = {
      [LOOM_CFG_SCALING_NONE] = LOOM_LR_RULE_NONE,
      [LOOM_CFG_SCALING_LINEAR] = LOOM_LR_RULE_LINEAR,
      [LOOM_CFG_SCALING_SQRT] = LOOM_LR_RULE_SQRT,
  };
  /* The scaling rule's base is the batch of one rank without accumulation:
   * the config's lr is what that batch trains well with. */
  int64_t global_batch = t->batch * t->accumulate * loom_train_world();
  LOOM_TRY(loom_lr_scale(rules[sc->scaling], sd.lr, global_batch, t->batch,
                         &sd.lr));
  sd.warmup_steps = sc->warmup_steps;
  sd.total_steps = t->total_steps;
  sd.min_lr = (float)sc->min_lr;
  sd.step_size = sc->step_size;
  sd.gamma = (float)sc->gamma;
  s = loom_sched_check(&sd);
  if (s != LOOM_OK)
    return loom_error_context(LOOM_ERR_CONFIG, "schedule");
  t->sched = sd;
  return LOOM_OK;
}

loom_status loom_trainer_new(loom_trainer **out, const loom_config *cfg,
                             const loom_train_opts *opts) {
  *out = NULL;
  loom_status s = loom_config_validate(cfg);
  if (s != LOOM_OK)
    return s;
  loom_trainer *t = loom_calloc(1, sizeof *t);
  if (!t)
    return LOOM_ERR_NOMEM;
  t->cfg = *cfg;
  t->opts = opts ? *opts : loom_train_opts_default();
  snprintf(t->resume, sizeof t->resume, "%s",
           t->opts.resume ? t->opts.resume : "auto");
  t->opts.resume = t->resume;
  t->batch = cfg->train.batch_size;
  t->accumulate = cfg->train.accumulate;
  if (cfg->train.threads > 0)
    loom_set_threads((int)cfg->train.threads);

  LOOM_TRY_GOTO(s, open_data(t), fail);
  LOOM_TRY_GOTO(s, build_model(t), fail);
  LOOM_TRY_GOTO(s, loom_xent_new(&t->xent), fail);
  LOOM_TRY_GOTO(s, make_loader(t), fail);
  t->total_steps = cfg->train.steps > 0
                       ? cfg->train.steps
                       : cfg->train.epochs * t->steps_per_epoch;
  LOOM_TRY_GOTO(s, make_optim(t), fail);
  /* Plan the largest batch now so the loop never allocates. */
  {
    loom_dataset_info info;
    loom_dataset_get_info(t->train_ds, &info);
    loom_shape in;
    if (t->is_text) {
      int64_t d[2] = {t->batch, info.T};
      in = loom_shape_make(LOOM_I32, 2, d);
    } else {
      int64_t d[4] = {t->batch, info.C, info.H, info.W};
      in = loom_shape_make(LOOM_F32, 4, d);
    }
    LOOM_TRY_GOTO(s, loom_model_plan(t->model, &in), fail);
  }
  LOOM_TRY_GOTO(s, loom_train_ckpt_resume(t), fail);
  *out = t;
  return LOOM_OK;
fail:
  loom_trainer_free(t);
  return s;
}

void loom_trainer_free(loom_trainer *t) {
  if (!t)
    return;
  if (t->pending) {
    loom_ckpt_writer_wait(t->pending);
    loom_ckpt_writer_free(t->pending);
  }
  loom_progress_free(t->progress);
  loom_metrics_close(t->metrics);
  loom_optim_free(t->optim);
  loom_loader_free(t->train_loader);
  loom_dataset_free(t->train_ds);
  loom_dataset_free(t->val_ds);
  loom_xent_free(t->xent);
  loom_model_free(t->model);
  loom_free(t);
}

/* ------------------------------------------------------------- the loop */

/* Forward, loss and backward of one micro-batch; adds into the gradients. */
static loom_status micro_step(loom_trainer *t, const loom_batch *b,
                              loom_xent_stats *st, loom_step_times *tm) {
  double t0 = loom_time_now();
  /* Dropout keys: the global index of this rank's first sample, the same
   * at any world size. */
  int64_t nb = loom_loader_batches_per_epoch(t->train_loader);
  int64_t gb = b->capacity * loom_train_world();
  uint64_t base = (uint64_t)((b->epoch * nb + b->index) * gb +
                             loom_train_rank() * b->capacity);
  loom_model_set_step(t->model, (uint64_t)t->step, base);
  loom_tensor logits;
  LOOM_TRY(loom_model_forward(t->model, &b->x, &logits));
  LOOM_TRY(loom_xent_forward(t->xent, &logits, (const int32_t *)b->y.data,
                             st));
  double t1 = loom_time_now();
  loom_tensor dlogits;
  LOOM_TRY(loom_model_output_grad(t->model, &dlogits));
  LOOM_TRY(loom_xent_backward(t->xent, &dlogits, 1.0f / (float)t->accumulate));
  LOOM_TRY(loom_model_backward(t->model, NULL, NULL));
  double t2 = loom_time_now();
  tm->forward += t1 - t0;
  tm->backward += t2 - t1;
  return LOOM_OK;
}

/* Evaluates on at most max_batches batches of the validation split (0 or
 * less: all of it). */
static loom_status evaluate(loom_trainer *t, int64_t max_batches, double *loss,
                            double *accuracy) {
  loom_loader_opts lo = loom_loader_opts_default();
  lo.sampler.shuffle = false;
  lo.sampler.tail = LOOM_TAIL_PARTIAL;
  lo.sampler.batch = t->batch;
  lo.prefetch = 0;
  loom_loader *ld = NULL;
  LOOM_TRY(loom_loader_new(&ld, t->val_ds, &lo));
  int64_t nb = loom_loader_batches_per_epoch(ld);
  if (max_batches > 0 && max_batches < nb)
    nb = max_batches;
  loom_model_set_training(t->model, false);
  double loss_sum = 0;
  int64_t count = 0, correct = 0;
  loom_status s = LOOM_OK;
  for (int64_t i = 0; i < nb; i++) {
    const loom_batch *b;
    LOOM_TRY_GOTO(s, loom_loader_next(ld, &b), done);
    if (b->size == 0)
      continue;
    loom_tensor logits;
    loom_xent_stats st;
    LOOM_TRY_GOTO(s, loom_model_forward(t->model, &b->x, &logits), done);
    LOOM_TRY_GOTO(s,
                  loom_xent_forward(t->xent, &logits,
                                    (const int32_t *)b->y.data, &st),
                  done);
    loss_sum += st.loss_sum;
    count += st.count;
    correct += st.correct;
  }
  *loss = count ? loss_sum / (double)count : NAN;
  *accuracy = count ? (double)correct / (double)count : NAN;
done:
  loom_model_set_training(t->model, true);
  loom_loader_free(ld);
  return s;
}

loom_status loom_trainer_evaluate(loom_trainer *t, double *loss,
                                  double *accuracy) {
  return evaluate(t, t->cfg.train.eval_batches, loss, accuracy);
}

static bool is_rank0(void) { return loom_train_rank() == 0; }

/* The last evaluation of a run covers the whole validation split. */
static loom_status log_eval(loom_trainer *t, loom_train_result *res,
                            bool last) {
  double vl, va;
  LOOM_TRY(evaluate(t, last ? 0 : t->cfg.train.eval_batches, &vl, &va));
  res->val_loss = vl;
  res->val_accuracy = t->is_text ? NAN : va;
  if (!is_rank0())
    return LOOM_OK;
  char line[256];
  if (t->is_text)
    snprintf(line, sizeof line, "eval step %lld: val_loss %.4f (%.3f bits/byte)",
             (long long)t->step, vl, vl / log(2.0));
  else
    snprintf(line, sizeof line,
             "eval step %lld: val_loss %.4f val_accuracy %.2f%%",
             (long long)t->step, vl, 100.0 * va);
  if (!t->opts.quiet)
    loom_progress_print(t->progress, line);
  if (t->metrics) {
    loom_metrics_begin(t->metrics);
    loom_metrics_int(t->metrics, "step", t->step);
    loom_metrics_num(t->metrics, "time", loom_time_wall());
    loom_metrics_num(t->metrics, "val_loss", vl);
    if (!t->is_text)
      loom_metrics_num(t->metrics, "val_accuracy", va);
    LOOM_TRY(loom_metrics_end(t->metrics));
  }
  return LOOM_OK;
}

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

loom_status loom_trainer_run(loom_trainer *t, loom_train_result *res) {
  memset(res, 0, sizeof *res);
  res->val_loss = NAN;
  res->val_accuracy = NAN;
  res->start_step = t->step;
  const loom_config *cfg = &t->cfg;
  loom_status s = LOOM_OK;
  stop_requested = 0;
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  if (is_rank0()) {
    if (cfg->log.metrics && cfg->log.run_dir[0])
      LOOM_TRY_GOTO(s,
                    loom_metrics_open(&t->metrics, cfg->log.run_dir,
                                      t->step > 0),
                    out);
    loom_progress_mode pm = (loom_progress_mode)cfg->log.progress;
    if (t->opts.quiet)
      pm = LOOM_PROGRESS_OFF;
    LOOM_TRY_GOTO(s,
                  loom_progress_new(&t->progress, pm, stderr, t->step,
                                    t->total_steps, (int)cfg->log.every,
                                    t->is_text ? "tokens" : "samples"),
                  out);
  }
  loom_dataset_info info;
  loom_dataset_get_info(t->train_ds, &info);
  double units_per_row = t->is_text ? (double)info.T : 1.0;
  double units_per_step = units_per_row * (double)(t->batch * t->accumulate) *
                          (double)loom_train_world();
  float *params = loom_model_params(t->model);
  float *grads = loom_model_grads(t->model);
  int64_t n = loom_model_num_params(t->model);
  double t_start = loom_time_now();
  int64_t window_steps = 0;
  loom_step_times win = {0};
  int64_t stop_at = t->opts.stop_at;

  while (t->step < t->total_steps) {
    loom_step_times tm = {0};
    double ts = loom_time_now();
    loom_model_zero_grad(t->model);
    double loss_sum = 0;
    int64_t epoch = 0;
    for (int64_t k = 0; k < t->accumulate; k++) {
      const loom_batch *b;
      LOOM_TRY_GOTO(s, loom_loader_next(t->train_loader, &b), out);
      tm.data += b->wait_s;
      epoch = b->epoch;
      loom_xent_stats st;
      LOOM_TRY_GOTO(s, micro_step(t, b, &st, &tm), out);
      loss_sum += st.loss;
    }
    double to = loom_time_now();
    double gnorm = NAN;
    if (cfg->optim.grad_clip > 0)
      LOOM_TRY_GOTO(s, loom_grad_clip(grads, n, (float)cfg->optim.grad_clip,
                                      &gnorm),
                    out);
    float lr = loom_sched_lr(&t->sched, t->step);
    LOOM_TRY_GOTO(s, loom_optim_step(t->optim, params, grads, lr), out);
    t->step++;
    tm.optim = loom_time_now() - to;
    tm.total = loom_time_now() - ts;
    double loss = loss_sum / (double)t->accumulate;
    if (!isfinite(loss)) {
      s = loom_error(LOOM_ERR_INTERNAL,
                     "the loss is %f at step %lld: training diverged (lower "
                     "optim.lr or set optim.grad_clip)",
                     loss, (long long)t->step);
      goto out;
    }
    t->loss_window_sum += loss;
    t->loss_window_n++;
    window_steps++;
    win.forward += tm.forward;
    win.backward += tm.backward;
    win.optim += tm.optim;
    win.data += tm.data;

    /* Throughput over the steps of the window only: evaluation and
     * checkpoints between them do not count. */
    win.total += tm.total;
    double rate = units_per_step * (double)window_steps / win.total;
    if (is_rank0()) {
      loom_progress_info pi = {t->step, (int)epoch, (float)loss, lr, rate};
      loom_progress_update(t->progress, &pi);
    }
    bool last = t->step == t->total_steps;
    if (t->step % cfg->log.every == 0 || last) {
      res->train_loss = t->loss_window_sum / (double)t->loss_window_n;
      if (t->metrics) {
        double w = (double)window_steps;
        loom_metrics_begin(t->metrics);
        loom_metrics_int(t->metrics, "step", t->step);
        loom_metrics_int(t->metrics, "epoch", epoch);
        loom_metrics_num(t->metrics, "time", loom_time_wall());
        loom_metrics_num(t->metrics, "loss", res->train_loss);
        loom_metrics_num(t->metrics, "lr", lr);
        loom_metrics_num(t->metrics,
                         t->is_text ? "tokens_per_s" : "samples_per_s", rate);
        loom_metrics_num(t->metrics, "step_s", win.total / w);
        loom_metrics_num(t->metrics, "data_wait_s", win.data / w);
        loom_metrics_num(t->metrics, "forward_s", win.forward / w);
        loom_metrics_num(t->metrics, "backward_s", win.backward / w);
        loom_metrics_num(t->metrics, "optim_s", win.optim / w);
        if (cfg->optim.grad_clip > 0)
          loom_metrics_num(t->metrics, "grad_norm", gnorm);
        LOOM_TRY_GOTO(s, loom_metrics_end(t->metrics), out);
      }
      t->loss_window_sum = 0;
      t->loss_window_n = 0;
      window_steps = 0;
      memset(&win, 0, sizeof win);
    }
    if ((cfg->train.eval_every > 0 && t->step % cfg->train.eval_every == 0) ||
        last)
      LOOM_TRY_GOTO(s, log_eval(t, res, last), out);
    bool stop = stop_requested || (stop_at > 0 && t->step >= stop_at);
    if ((cfg->checkpoint.enabled && cfg->checkpoint.every > 0 &&
         t->step % cfg->checkpoint.every == 0) ||
        last || stop)
      LOOM_TRY_GOTO(s, loom_train_ckpt_save(t), out);
    if (stop && !last) {
      res->interrupted = true;
      break;
    }
  }
  LOOM_TRY_GOTO(s, loom_train_ckpt_finish(t), out);
  res->steps = t->step;
  res->seconds = loom_time_now() - t_start;
  res->throughput = res->seconds > 0
                        ? units_per_step * (double)(t->step - res->start_step) /
                              res->seconds
                        : 0;
out:
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  loom_progress_free(t->progress);
  t->progress = NULL;
  return s;
}
