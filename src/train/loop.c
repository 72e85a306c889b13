/* The training loop: model, data, optimizer, schedule, evaluation, metrics,
 * progress and checkpoints from one config. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "loom/config.h"
#include "loom/data.h"
#include "loom/kernels.h"
#include "loom/nn.h"
#include "loom/obs.h"
#include "loom/optim.h"
#include "loom/run.h"
#include "loom/train.h"
#include "trainer.h"

loom_train_opts loom_train_opts_default(void) {
  loom_train_opts o = {"auto", 0, false, -1, false};
  return o;
}

loom_model *loom_trainer_model(loom_trainer *t) { return t ? t->model : NULL; }

/* ------------------------------------------------------------- building */

loom_status loom_train_model_new(const loom_config *cfg, bool defer_init,
                                 loom_model **out) {
  loom_model_opts mo = loom_model_opts_default();
  mo.defer_init = defer_init;
  return loom_train_model_make(cfg, &mo, out);
}

static loom_status model_build(const loom_config *cfg,
                               const loom_model_opts *base, const loom_tp *tp,
                               loom_model **out);

loom_status loom_train_model_make(const loom_config *cfg,
                                  const loom_model_opts *base,
                                  loom_model **out) {
  return loom_train_model_make_tp(cfg, base, NULL, out);
}

/* The precision is the model's (docs/precision.md); configs whose
 * precision a model cannot honour were refused by loom_config_validate. */
loom_status loom_train_model_make_tp(const loom_config *cfg,
                                     const loom_model_opts *base,
                                     const loom_tp *tp, loom_model **out) {
  LOOM_TRY(model_build(cfg, base, tp, out));
  if (cfg->train.precision == LOOM_CFG_PRECISION_F32)
    return LOOM_OK;
  loom_status s =
      loom_model_set_precision(*out, loom_train_precision_dtype(cfg));
  if (s != LOOM_OK) {
    loom_model_free(*out);
    *out = NULL;
    return loom_error_context(s, "train.precision %s",
                              loom_cfg_precision_names[cfg->train.precision]);
  }
  return LOOM_OK;
}

static loom_status model_build(const loom_config *cfg,
                               const loom_model_opts *base, const loom_tp *tp,
                               loom_model **out) {
  const loom_config_model *mc = &cfg->model;
  loom_model_opts mo = *base;
  mo.seed = (uint64_t)cfg->train.seed;
  const loom_act act = mc->activation;
  switch (mc->name) {
  case LOOM_CFG_MODEL_MLP: {
    /* The config's checks bound every width and count (loom config). */
    loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
    int widths[LOOM_CONFIG_LIST_MAX];
    for (int i = 0; i < mc->hidden.n; i++)
      widths[i] = (int)mc->hidden.v[i];
    o.widths = widths;
    o.n_hidden = mc->hidden.n;
    o.act = act;
    return loom_fashion_mlp_new(out, &o, &mo);
  }
  case LOOM_CFG_MODEL_CNN: {
    loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
    int channels[LOOM_CONFIG_LIST_MAX];
    for (int i = 0; i < mc->channels.n; i++)
      channels[i] = (int)mc->channels.v[i];
    o.channels = channels;
    o.n_conv = mc->channels.n;
    o.kernel = (int)mc->kernel;
    o.pool = (int)mc->pool;
    o.act = act;
    return loom_fashion_cnn_new(out, &o, &mo);
  }
  case LOOM_CFG_MODEL_GPT: {
    loom_gpt_opts o = loom_gpt_opts_default();
    o.vocab = (int)mc->vocab;
    o.context = (int)mc->context;
    o.n_layer = (int)mc->layers;
    o.d_model = (int)mc->d_model;
    o.n_head = (int)mc->heads;
    o.mlp_ratio = (int)mc->mlp_ratio;
    LOOM_TRY(loom_config_checkpoint_every(cfg->train.activation_checkpointing,
                                          &o.checkpoint_every));
    o.dropout = (float)mc->dropout;
    o.tp = tp;
    o.sequence_parallel = tp && tp->size > 1 && cfg->parallel.sequence_parallel;
    o.sp_regather = cfg->parallel.sequence_parallel_regather;
    mo.init = LOOM_INIT_GPT2;
    mo.init_std = (float)mc->init_std;
    mo.init_n_layer = o.n_layer;
    return loom_gpt_new(out, &o, &mo);
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
    struct stat sb;
    if (path && stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode))
      return loom_error(LOOM_ERR_CONFIG,
                        "data.path: %s is not a directory (fashion-mnist "
                        "reads the directory of its four IDX files)",
                        path);
    if (path && access(path, R_OK | X_OK) != 0)
      return loom_error(LOOM_ERR_CONFIG,
                        "data.path: cannot read the directory %s: %s", path,
                        strerror(errno));
    LOOM_TRY(
        loom_dataset_open_fashion(&t->train_ds, path, LOOM_SPLIT_TRAIN, &io));
    LOOM_TRY(loom_dataset_open_fashion(&t->val_ds, path, LOOM_SPLIT_VAL, &io));
    break;
  }
  case LOOM_CFG_DATASET_KJV: {
    char kjv[LOOM_CONFIG_STR_MAX];
    if (path) {
      snprintf(kjv, sizeof kjv, "%s", path);
    } else {
      LOOM_TRY(loom_kjv_default_path(kjv, sizeof kjv));
    }
    /* data.path names any byte-level text, which must exist: loom writes
     * only in the run directory and its data cache, so the KJV is prepared
     * (once) only at its default place ($LOOM_DATA_DIR/kjv.txt). */
    if (path && access(kjv, R_OK) != 0)
      return loom_error(LOOM_ERR_CONFIG,
                        "data.path: cannot read %s: %s (leave data.path empty "
                        "to use the King James Bible prepared by loom)",
                        kjv, strerror(errno));
    struct stat sb;
    if (path && stat(kjv, &sb) == 0 && !S_ISREG(sb.st_mode))
      return loom_error(LOOM_ERR_CONFIG,
                        "data.path: %s is not a regular file (dataset kjv "
                        "reads one text file)",
                        kjv);
    if (!path) {
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
  if (t->is_text && t->cfg.model.name != LOOM_CFG_MODEL_GPT)
    return loom_error(LOOM_ERR_CONFIG,
                      "data.dataset: text data needs model.name gpt");
  if (!t->is_text && t->cfg.model.name == LOOM_CFG_MODEL_GPT)
    return loom_error(LOOM_ERR_CONFIG,
                      "data.dataset: the gpt model needs text data");
  /* Both sets, so a bad id in the validation data is an error now, naming
   * the file and position, not at the first evaluation. */
  if (t->is_text) {
    LOOM_TRY(loom_dataset_check_vocab(t->train_ds, t->cfg.model.vocab));
    LOOM_TRY(loom_dataset_check_vocab(t->val_ds, t->cfg.model.vocab));
  }
  return LOOM_OK;
}

static loom_status make_loader(loom_trainer *t) {
  loom_loader_opts lo = loom_loader_opts_default();
  lo.sampler.seed = (uint64_t)t->cfg.train.seed;
  lo.sampler.shuffle = t->cfg.data.shuffle;
  lo.sampler.tail = (loom_tail)t->cfg.data.tail;
  lo.sampler.batch = t->batch;
  lo.sampler.rank = t->replica;
  lo.sampler.world = t->replicas;
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
  oo.kind = oc->name;
  oo.momentum = oc->momentum;
  oo.nesterov = oc->nesterov;
  oo.beta1 = oc->beta1;
  oo.beta2 = oc->beta2;
  oo.eps = oc->eps;
  oo.weight_decay = oc->weight_decay;
  if (t->zero && t->tps > 1) /* its replica's cut of the rank's part */
    loom_train_tp_cut(t, t->replica, &oo.shard_begin, &oo.shard_end);
  else if (t->zero) /* the state of this rank's slice only (with a
                       pipeline, its cut of the stage's range) */
    loom_train_slice(t, t->rank, &oo.shard_begin, &oo.shard_end);
  else if (t->pipe) /* the state of this stage's parameters only */
    loom_pipe_owned(t->pipe, &oo.shard_begin, &oo.shard_end);
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
  sd.kind = sc->name;
  sd.lr = (float)oc->lr;
  /* The scaling rule's base is the batch of one rank without accumulation
   * (one virtual shard in deterministic mode): the config's lr is what that
   * batch trains well with. */
  int64_t base = t->cfg.train.batch_size;
  int64_t global_batch = t->batch * t->accumulate * t->replicas;
  LOOM_TRY(loom_lr_scale(sc->scaling, sd.lr, global_batch, base, &sd.lr));
  sd.warmup_steps = sc->warmup_steps;
  sd.total_steps = t->total_steps;
  sd.min_lr = (float)sc->min_lr;
  if (sd.min_lr > 0)
    LOOM_TRY(
        loom_lr_scale(sc->scaling, sd.min_lr, global_batch, base, &sd.min_lr));
  sd.step_size = sc->step_size;
  sd.gamma = (float)sc->gamma;
  if ((sd.kind == LOOM_SCHED_COSINE || sd.kind == LOOM_SCHED_LINEAR) &&
      sd.warmup_steps >= sd.total_steps)
    /* config check sees only train.steps; an epoch-limited length is known
     * once the data is */
    return loom_error(
        LOOM_ERR_CONFIG,
        "schedule.warmup_steps (%lld) is not below the run's %lld steps "
        "(train.epochs %lld x %lld steps an epoch, train.steps %lld): "
        "schedule %s decays after its warm-up; lower schedule.warmup_steps "
        "or train longer",
        (long long)sd.warmup_steps, (long long)sd.total_steps,
        (long long)t->cfg.train.epochs, (long long)t->steps_per_epoch,
        (long long)t->cfg.train.steps, loom_sched_kind_names[sd.kind]);
  s = loom_sched_check(&sd);
  if (s != LOOM_OK)
    return loom_error_context(LOOM_ERR_CONFIG, "schedule");
  t->sched = sd;
  return LOOM_OK;
}

/* ------------------------------------------------------ data parallelism */

loom_status loom_mkdirs(const char *path) { return loom_fs_mkdirs(path, 0755); }

loom_status loom_train_agree(loom_trainer *t, loom_status mine,
                             const char *what) {
  if (!t->world || t->nranks == 1)
    return mine;
  return loom_comm_agree(t->world, mine, what);
}

void loom_train_slice(const loom_trainer *t, int r, int64_t *lo, int64_t *hi) {
  if (t->stage_bounds) {
    /* A pipeline: the replicas of a stage share its range, in order (with
     * tensor parallelism the range in the whole model's layout, shared by
     * the replicas' tp ranks: part d x tp + t of it). */
    int T = t->tps, s = r / T % t->stages;
    int d = (r / T / t->stages) * T + r % T, D = t->replicas * T;
    int64_t a = t->whole_bounds[s], n = t->whole_bounds[s + 1] - a;
    if (t->zero >= 2 && T == 1) {
      /* ZeRO-2/3: cuts at whole chunks of the norm's sum of squares
       * (LOOM_GRAD_CHUNK from the stage's start), so that the replicas'
       * chunk sums add up to the stage's as ddp computes it, bit for bit
       * (the last cut ends with the stage; a cut may be empty) */
      int64_t nc = (n + LOOM_GRAD_CHUNK - 1) / LOOM_GRAD_CHUNK;
      int64_t x = nc * d / D * LOOM_GRAD_CHUNK;
      int64_t y = nc * (d + 1) / D * LOOM_GRAD_CHUNK;
      *lo = a + (x < n ? x : n);
      *hi = a + (y < n ? y : n);
      return;
    }
    *lo = a + n * d / D;
    *hi = a + n * (d + 1) / D;
    return;
  }
  if (t->bounds) {
    *lo = t->bounds[r];
    *hi = t->bounds[r + 1];
    return;
  }
  /* the whole model's layout: with tensor parallelism, not the rank's */
  int64_t n = loom_model_num_params(t->whole ? t->whole : t->model);
  *lo = n * r / t->nranks;
  *hi = n * (r + 1) / t->nranks;
}

void loom_train_mem_get(const loom_trainer *t, loom_train_mem *out) {
  size_t all = (size_t)loom_model_num_params(t->model) * sizeof(float);
  memset(out, 0, sizeof *out);
  out->params = out->params_peak = all;
  if (t->z3)
    loom_zero3_resident(t->z3, &out->params, &out->params_peak);
  /* bf16/f16: the weight copy the matmuls read (docs/precision.md) */
  out->params += loom_model_half_bytes(t->model);
  out->params_peak += loom_model_half_bytes(t->model);
  out->grads = out->grads_peak = all;
  if (t->ddp)
    loom_ddp_grad_resident(t->ddp, &out->grads, &out->grads_peak);
  for (int i = 0; i < loom_optim_state_count(t->optim); i++) {
    loom_optim_state st;
    if (loom_optim_state_get(t->optim, i, &st) == LOOM_OK)
      out->optim += (size_t)st.count * sizeof(float);
  }
  out->act = loom_model_arena_bytes(t->model);
  if (t->pipe) { /* the stage's pages of the reserved buffers */
    out->params = out->params_peak = loom_vmem_resident(t->pbuf, 0, all);
    out->grads = out->grads_peak = loom_vmem_resident(t->gbuf, 0, all);
    /* zero2/3: the whole stage's before the reduce; zero3: the whole
     * stage's parameters from the gather to the step */
    if (t->z2_grad_peak > out->grads_peak)
      out->grads_peak = t->z2_grad_peak;
    if (t->z3p_param_peak > out->params_peak)
      out->params_peak = t->z3p_param_peak;
    out->act = loom_pipe_act_bytes(t->pipe);
    out->params += loom_pipe_half_bytes(t->pipe);
    out->params_peak += loom_pipe_half_bytes(t->pipe);
  }
  loom_mem_get(LOOM_MEM_COMM, &out->comm, &out->comm_peak);
  loom_mem_get(LOOM_MEM_DATA, &out->data, &out->data_peak);
}

/* ZeRO-2/3: slices that start at whole pages (1024 floats; 2 MiB for large
 * models, below), so that the memory given back is exactly what is not
 * owned; in deterministic mode at
 * multiples of LOOM_GRAD_CHUNK, so the global gradient norm adds the same
 * chunk sums in the same order as on one rank (bitwise clipping). The last
 * may be shorter; a slice of a small model may be empty. */
static loom_status make_bounds(loom_trainer *t) {
  int64_t n = loom_model_num_params(t->model);
  int64_t c = t->cfg.parallel.deterministic ? LOOM_GRAD_CHUNK : 1024;
  /* Large slices on huge-page boundaries (loom_vmem_new): giving back what
   * lies outside the slice then never splits a huge page. 2 MiB of floats
   * is a multiple of LOOM_GRAD_CHUNK; only where a slice holds 16 of them,
   * so the slices stay within 1/16 of even. */
  const int64_t huge = (int64_t)(LOOM_VMEM_HUGE_PAGE / sizeof(float));
  if ((size_t)n * sizeof(float) >= LOOM_VMEM_HUGE_MIN &&
      n / t->nranks >= 16 * huge)
    c = huge;
  t->bounds = loom_calloc((size_t)t->nranks + 1, sizeof(int64_t));
  if (!t->bounds)
    return LOOM_ERR_NOMEM;
  for (int r = 1; r < t->nranks; r++) {
    int64_t x = (n * r / t->nranks + c / 2) / c * c;
    t->bounds[r] = x < n ? x : n;
  }
  t->bounds[t->nranks] = n;
  return LOOM_OK;
}

loom_status loom_train_check_world(const loom_config *cfg, int ranks) {
  if (!cfg || ranks < 1)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_train_check_world: bad "
                                            "arguments");
  const loom_config_parallel *pc = &cfg->parallel;
  const int64_t P = pc->pp, T = pc->tp;
  if (pc->dp > 0 && pc->dp * T * P != ranks)
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.dp %lld x parallel.tp %lld x parallel.pp "
                      "%lld = %lld ranks, but the job has %d (start %lld, or "
                      "set parallel.dp auto)",
                      (long long)pc->dp, (long long)T, (long long)P,
                      (long long)(pc->dp * T * P), ranks,
                      (long long)(pc->dp * T * P));
  if (ranks % (T * P) != 0)
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.tp %lld x parallel.pp %lld does not divide "
                      "the job's %d ranks (parallel.dp auto takes ranks / "
                      "(tp x pp) replicas)",
                      (long long)T, (long long)P, ranks);
  if (P > 1 || T > 1)
    return LOOM_OK; /* the config refuses none and deterministic there */
  if (pc->strategy == LOOM_CFG_STRATEGY_NONE) {
    if (ranks > 1)
      return loom_error(LOOM_ERR_CONFIG,
                        "parallel.strategy 'none' with %d ranks: each would "
                        "train alone; use 'ddp' or 'auto'",
                        ranks);
    if (pc->deterministic)
      return loom_error(LOOM_ERR_CONFIG,
                        "parallel.deterministic needs parallel.strategy "
                        "'auto', 'ddp', 'zero1', 'zero2', 'zero3' or "
                        "'fsdp'");
    return LOOM_OK;
  }
  const int64_t v = pc->virtual_shards;
  if (pc->deterministic &&
      ((v & (v - 1)) != 0 || v % ranks != 0 || (ranks & (ranks - 1)) != 0))
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.deterministic: %d ranks and "
                      "parallel.virtual_shards %lld; both must be powers "
                      "of two and the ranks must divide the shards",
                      ranks, (long long)v);
  return LOOM_OK;
}

/* The world group, the strategy and the shape of a rank's batch. */
static loom_status open_world(loom_trainer *t) {
  const loom_config_parallel *pc = &t->cfg.parallel;
  LOOM_TRY(loom_group_world(NULL, &t->world));
  t->rank = loom_group_rank(t->world);
  t->nranks = loom_group_size(t->world);
  loom_train_set_world(t->rank, t->nranks);
  if (t->nranks > 1)
    loom_log_set_rank(t->rank);
  t->shards = 1;
  t->batch = t->cfg.train.batch_size;
  t->shard_rows = t->batch;
  t->units = 1;
  t->micro = (int)pc->micro_batches;
  LOOM_TRY(loom_train_mesh(t));
  /* ZeRO's stage: 1 the optimizer state, 2 the gradient too, 3 (zero3,
   * fsdp) the parameters too, over the replicas */
  t->zero = pc->strategy == LOOM_CFG_STRATEGY_ZERO1   ? 1
            : pc->strategy == LOOM_CFG_STRATEGY_ZERO2 ? 2
            : pc->strategy == LOOM_CFG_STRATEGY_ZERO3 ||
                    pc->strategy == LOOM_CFG_STRATEGY_FSDP
                ? 3
                : 0;
  if (t->stages > 1) {
    /* Each stage's gradient is summed over the replicas by the pipeline
     * (the loss weighs each row by 1/rows of the step): units 1. zero1:
     * each replica steps its cut of the stage's range (loom_train_slice)
     * and the cuts are gathered; zero2: and the pipeline reduces each
     * piece of the stage's gradient to the replica whose cut holds it
     * (loom_pipe_set_cuts); zero3/fsdp: and after the step each replica
     * keeps only its cut of the stage's parameters, gathered whole again
     * before the next forward (loom_train_pipe_whole: once a step, not
     * per unit) */
    if (t->rank == 0 && pc->strategy == LOOM_CFG_STRATEGY_DDP &&
        t->replicas == 1 && !t->opts.quiet)
      LOOM_INFO("parallel.strategy ddp with one replica: nothing to reduce");
    return LOOM_OK;
  }
  if (t->tps > 1) {
    /* DDP over the replicas of each tensor-parallel rank (parallel.dp),
     * when there are several or parallel.strategy is ddp; zero1: each
     * replica keeps and steps the optimizer state of its cut of the
     * rank's part (loom_train_tp_cut), the cuts all-gathered after;
     * zero2: and the DDP keeps the reduced gradient of the cut; zero3:
     * and the replicas hold only their cut's parameters, each unit
     * gathered over the dp group as it runs */
    t->units = t->replicas;
    return LOOM_OK;
  }
  /* loom_train_check_world (in loom_train_mesh) held the world-size
   * rules: none is one rank's, deterministic's sizes powers of two */
  if (pc->strategy == LOOM_CFG_STRATEGY_NONE)
    return LOOM_OK;
  bool ddp = pc->strategy == LOOM_CFG_STRATEGY_DDP || t->zero ||
             t->nranks > 1 || pc->deterministic;
  if (!ddp)
    return LOOM_OK;
  t->units = t->nranks;
  if (pc->deterministic) {
    int64_t v = pc->virtual_shards;
    /* batch_size is one shard's rows: the batch per rank when there are
     * as many ranks as shards. */
    t->shards = (int)(v / t->nranks);
    t->batch = t->cfg.train.batch_size * t->shards;
    t->units = (int)v;
  }
  return LOOM_OK;
}

/* What the start-up line calls the strategy. */
static const char *stage_name(const loom_trainer *t) {
  static const char *const names[] = {
      "ddp", "zero1: optimizer state sharded",
      "zero2: optimizer state and gradients sharded",
      "zero3: optimizer state, gradients and parameters sharded"};
  return names[t->zero >= 0 && t->zero <= 3 ? t->zero : 0];
}

loom_dtype loom_train_compress_dtype(const loom_config *cfg) {
  static const loom_dtype wire[] = {[LOOM_CFG_COMPRESS_NONE] = LOOM_F32,
                                    [LOOM_CFG_COMPRESS_BF16] = LOOM_BF16,
                                    [LOOM_CFG_COMPRESS_F16] = LOOM_F16};
  _Static_assert(sizeof wire / sizeof wire[0] == LOOM_CFG_COMPRESS_COUNT,
                 "a wire type per compression");
  return wire[cfg->parallel.compress];
}

loom_dtype loom_train_precision_dtype(const loom_config *cfg) {
  static const loom_dtype type[] = {[LOOM_CFG_PRECISION_F32] = LOOM_F32,
                                    [LOOM_CFG_PRECISION_BF16] = LOOM_BF16,
                                    [LOOM_CFG_PRECISION_F16] = LOOM_F16};
  _Static_assert(sizeof type / sizeof type[0] == LOOM_CFG_PRECISION_COUNT,
                 "a type per precision");
  return type[cfg->train.precision];
}

static loom_status make_ddp(loom_trainer *t) {
  const loom_config_parallel *pc = &t->cfg.parallel;
  loom_ddp_opts o = loom_ddp_opts_default();
  o.bucket_mb = pc->bucket_mb;
  o.first_bucket_mb = pc->first_bucket_mb;
  o.compress = loom_train_compress_dtype(&t->cfg);
  o.deterministic = pc->deterministic;
  o.virtual_shards = (int)pc->virtual_shards;
  o.check_config = true;
  o.config_hash = loom_config_hash(&t->cfg);
  if (t->zero >= 2) {
    /* Every rank draws the same initial values (or reads them): no
     * broadcast of a buffer that stage 3 does not have. With tensor
     * parallelism the cuts of the rank's part over its replicas. */
    o.shard_bounds = t->tps > 1 ? t->tp_bounds : t->bounds;
    o.broadcast = false;
  }
  /* with tensor parallelism, each rank's part over its replicas */
  LOOM_TRY(
      loom_ddp_new(&t->ddp, t->model, t->tps > 1 ? t->dp_group : t->world, &o));
  if (t->rank == 0 && !t->opts.quiet) {
    int nb = loom_ddp_num_buckets(t->ddp);
    if (pc->deterministic)
      LOOM_INFO("data parallel (%s): %d ranks x %d thread(s), %d gradient "
                "buckets, deterministic over %lld virtual shards (%d per "
                "rank, %lld rows each)",
                stage_name(t), t->nranks, loom_threads(), nb,
                (long long)pc->virtual_shards, t->shards,
                (long long)t->cfg.train.batch_size);
    else
      LOOM_INFO("data parallel (%s): %d ranks x %d thread(s), %d gradient "
                "buckets (first %g MiB, then %g MiB), %s on the wire",
                stage_name(t), t->tps > 1 ? t->replicas : t->nranks,
                loom_threads(), nb, pc->first_bucket_mb, pc->bucket_mb,
                loom_cfg_compress_names[pc->compress]);
  }
  return LOOM_OK;
}

/* Collective, stage 2 on several ranks: the full parameter buffer in
 * memory that the host's ranks share, so that the all-gather after each
 * step writes every slice straight into every rank's buffer (one copy, not
 * three through the staging slots). */
static loom_status zero2_params(loom_trainer *t) {
  size_t n = (size_t)loom_model_num_params(t->model);
  loom_status s = loom_group_mem_alloc(t->world, (n ? n : 1) * sizeof(float),
                                       (void **)&t->zparams);
  if (s == LOOM_OK)
    loom_model_bind_params(t->model, t->zparams);
  return loom_train_agree(t, s, "the parameter buffer");
}

/* Everything a rank builds on its own (no collective). */
static loom_status setup_local(loom_trainer *t) {
  LOOM_TRY(loom_train_fault_init(t));
  loom_status ds = open_data(t);
  if (ds != LOOM_OK && ds != LOOM_ERR_NOMEM && ds != LOOM_ERR_CONFIG) {
    /* a missing, unreadable or malformed data file fails the same way on
     * every start: a configuration error (exit 2, not restarted), its
     * message kept */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    return loom_error(LOOM_ERR_CONFIG, "%s", msg);
  }
  LOOM_TRY(ds);
  if (t->opts.batch_auto) {
    /* Memory allows the batch; the data may not: one step of the whole
     * world must fit in an epoch. */
    int64_t len = loom_dataset_len(t->train_ds);
    int64_t per = (int64_t)t->replicas * t->shards * t->accumulate;
    int64_t most = len / (per > 0 ? per : 1);
    if (most < 1)
      most = 1;
    if (t->cfg.train.batch_size > most) {
      if (t->rank == 0 && !t->opts.quiet)
        LOOM_INFO("train.batch_size auto: %lld rows fit in memory, one "
                  "epoch of %lld samples allows %lld: taking %lld",
                  (long long)t->cfg.train.batch_size, (long long)len,
                  (long long)most, (long long)most);
      t->cfg.train.batch_size = most;
      t->batch = most * t->shards;
      t->shard_rows = most;
    }
  }
  if (t->zero >= 2 && t->tps > 1 && t->stages == 1) {
    /* ZeRO-2/3 over a tensor-parallel rank's replicas: its part, and the
     * cuts the DDP keeps (loom_train_tp_cut); at 3 the part has no
     * buffers of its own (loom_train_tp_new), the cuts are also what
     * ZeRO-3 keeps of the parameters. With a pipeline (zero2 only), the
     * pipeline's own set-up (loop_pipe.c) */
    LOOM_TRY(loom_train_tp_new(t));
    t->tp_bounds = loom_calloc((size_t)t->replicas + 1, sizeof(int64_t));
    if (!t->tp_bounds)
      return LOOM_ERR_NOMEM;
    for (int d = 0; d < t->replicas; d++)
      loom_train_tp_cut(t, d, &t->tp_bounds[d], &t->tp_bounds[d + 1]);
  } else if (t->zero >= 2 && t->stages == 1) {
    /* No buffers of the model's own: the DDP's sharded gradients, and
     * stage 2's full parameters here or stage 3's shards later. */
    loom_model_opts mo = loom_model_opts_default();
    mo.shape_only = true;
    LOOM_TRY(loom_train_model_make(&t->cfg, &mo, &t->model));
    LOOM_TRY(make_bounds(t));
    if (t->zero == 2 && t->nranks == 1) { /* else zero2_params */
      size_t n = (size_t)loom_model_num_params(t->model);
      t->zparams = loom_calloc(n ? n : 1, sizeof(float));
      if (!t->zparams)
        return loom_error_context(LOOM_ERR_NOMEM, "the parameter buffer");
      loom_model_bind_params(t->model, t->zparams);
    }
  } else if (t->tps > 1) {
    /* this rank's part (a stage's layout with a pipeline too) */
    LOOM_TRY(loom_train_tp_new(t));
  } else if (t->stages > 1) {
    /* The stage's instances run the model; this copy holds the layout and
     * the buffers (reserved: only the stage's ranges are touched). */
    loom_model_opts mo = loom_model_opts_default();
    mo.shape_only = true;
    LOOM_TRY(loom_train_model_make(&t->cfg, &mo, &t->model));
  } else {
    LOOM_TRY(loom_train_model_new(&t->cfg, t->init_deferred, &t->model));
  }
  LOOM_TRY(loom_xent_new(&t->xent));
  if (t->tpg) /* the logits are the rank's part of the vocabulary */
    loom_xent_set_tp(t->xent, loom_tp_group_tp(t->tpg));
  LOOM_TRY(make_loader(t));
  t->train_len = loom_dataset_len(t->train_ds);
  /* the first limit reached: train.steps or train.epochs (0: none) */
  const int64_t by_epochs = t->cfg.train.epochs * t->steps_per_epoch;
  t->total_steps = t->cfg.train.steps > 0 && (t->cfg.train.epochs == 0 ||
                                              t->cfg.train.steps < by_epochs)
                       ? t->cfg.train.steps
                       : by_epochs;
  /* Plan the largest forward now so the loop never allocates: a rank's
   * batch, one virtual shard or one micro-batch of it. */
  loom_dataset_info info;
  loom_dataset_get_info(t->train_ds, &info);
  int64_t rows = t->shards > 1 ? t->cfg.train.batch_size : t->batch / t->micro;
  loom_shape in;
  if (t->is_text) {
    int64_t d[2] = {rows, info.T};
    in = loom_shape_make(LOOM_I32, 2, d);
  } else {
    int64_t d[4] = {rows, info.C, info.H, info.W};
    in = loom_shape_make(LOOM_F32, 4, d);
  }
  if (t->stages > 1)
    LOOM_TRY(loom_train_pipe_new(t, &in));
  if (t->zero && t->tps > 1)
    LOOM_TRY(loom_train_tp_cuts_new(t));
  LOOM_TRY(make_optim(t));
  if (!t->pipe)
    LOOM_TRY(loom_model_plan(t->model, &in));
  if (t->rank == 0 && !t->opts.quiet)
    LOOM_INFO("kernels: %s (LOOM_ISA chooses among the copies this CPU runs), "
              "GEMM %s, %d thread(s)",
              loom_isa_name(loom_cpu_isa()),
              loom_gemm_backend_name(loom_gemm_get_backend()), loom_threads());
  if (t->rank == 0 && !t->opts.quiet &&
      loom_model_precision(t->model) != LOOM_F32)
    LOOM_INFO("%s: %s; master weights, optimizer and reductions f32",
              loom_dtype_name(loom_model_precision(t->model)),
              loom_half_path_describe(loom_model_precision(t->model)));
  LOOM_TRY(loom_train_scale_init(t));
  return loom_train_ckpt_prepare(t);
}

/* Whether loom_train_ckpt_resume may load a checkpoint (its early returns
 * aside, it depends on what is on disk after the gate). checkpoint.enabled
 * is about writing: a run that writes none still resumes. */
static bool may_resume(const loom_trainer *t) {
  if (loom_train_job_restart(t))
    return true;
  if (strcmp(t->resume, "never") == 0)
    return false;
  if (strcmp(t->resume, "auto") == 0)
    return t->cfg.checkpoint.dir[0] != '\0';
  return true;
}

/* No checkpoint was loaded after all: the draws that loom_model_new skipped,
 * the same values by construction (each parameter's stream is keyed by the
 * seed and its index), and rank 0's replace the others' as DDP's set-up
 * broadcast did. */
static loom_status init_fresh(loom_trainer *t) {
  if (t->init_deferred) /* else drawn when the model was made */
    LOOM_TRY(loom_model_init_params(t->model, NULL));
  if (t->nranks > 1) {
    float *p = loom_model_params(t->model);
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_broadcast(p, p, (size_t)loom_model_num_params(t->model),
                            LOOM_F32, 0, t->world, &r));
    LOOM_TRY(loom_wait(&r));
  }
  return LOOM_OK;
}

/* Rows [lo, lo + n) of a batch of `size` rows that virtual shard j takes
 * (train.batch_size each; a short last batch leaves later shards empty); the
 * whole batch without virtual shards. */
static void shard_rows(const loom_trainer *t, int64_t size, int j, int64_t *lo,
                       int64_t *n) {
  if (t->shards <= 1 && t->micro <= 1) {
    *lo = 0;
    *n = size;
    return;
  }
  /* a virtual shard, or one of parallel.micro_batches on one stage */
  int64_t R = t->shards > 1 ? t->cfg.train.batch_size : t->batch / t->micro;
  *lo = j * R;
  int64_t left = size - *lo;
  *n = left < 0 ? 0 : left > R ? R : left;
}

static loom_status forward_rows(loom_trainer *t, const loom_batch *b,
                                int64_t lo, int64_t n, loom_xent_stats *st,
                                loom_step_times *tm);
static loom_status backward_rows(loom_trainer *t, float scale,
                                 loom_step_times *tm);

/* The pieces of a rank's batch that run forward and backward apart:
 * virtual shards (deterministic), micro-batches, or the whole batch. */
static int batch_pieces(const loom_trainer *t) {
  return t->shards > 1 ? t->shards : t->micro;
}

static bool wants_warm_up(const loom_trainer *t) {
  if (t->pipe) /* its passes are the pipeline's, with its neighbours */
    return false;
  if (t->opts.warm_up >= 0)
    return t->opts.warm_up > 0;
  return loom_runstat_standby(); /* loom_runstat_gate is about to wait */
}

/* One micro-batch through forward and backward, as the loop runs it (the
 * same shapes, shards and gradient reductions), then the state put back:
 * gradients zero, DDP's sync flag and statistics, the model's dropout keys.
 * The loader is not used (the batch is filled directly) and the optimizer
 * does not step, so nothing else changed. The reductions are collectives:
 * every rank of the group warms up, or none. */
static loom_status warm_up(loom_trainer *t) {
  loom_batch b;
  memset(&b, 0, sizeof b);
  int64_t rows = t->batch < t->train_len ? t->batch : t->train_len;
  int64_t *idx = loom_malloc((size_t)rows * sizeof *idx);
  if (!idx)
    return LOOM_ERR_NOMEM;
  for (int64_t i = 0; i < rows; i++)
    idx[i] = i;
  loom_step_times tm = {0};
  bool sync = t->ddp ? loom_ddp_get_sync(t->ddp) : true;
  int S = batch_pieces(t);
  loom_status s = LOOM_OK;
  LOOM_TRY_GOTO(s, loom_batch_alloc(&b, t->train_ds, t->batch), done);
  LOOM_TRY_GOTO(s, loom_dataset_fill(t->train_ds, 0, idx, rows, &b), done);
  b.epoch = 0;
  b.index = 0;
  if (t->ddp) {
    LOOM_TRY_GOTO(s, loom_ddp_zero_grad(t->ddp), done);
    loom_ddp_set_sync(t->ddp, true);
  } else {
    loom_model_zero_grad(t->model);
  }
  for (int j = 0; j < S; j++) {
    int64_t lo, n;
    shard_rows(t, b.size, j, &lo, &n);
    if (t->shards > 1)
      LOOM_TRY_GOTO(s, loom_ddp_shard_begin(t->ddp, j), done);
    else if (t->ddp)
      loom_ddp_set_sync(t->ddp, j == S - 1);
    if (n == 0)
      continue;
    loom_xent_stats st;
    LOOM_TRY_GOTO(s, forward_rows(t, &b, lo, n, &st, &tm), done);
    LOOM_TRY_GOTO(s, backward_rows(t, 1.0f, &tm), done);
  }
  if (t->ddp) {
    LOOM_TRY_GOTO(s, loom_ddp_wait(t->ddp), done);
    LOOM_TRY_GOTO(s, loom_ddp_zero_grad(t->ddp), done);
    loom_ddp_set_sync(t->ddp, sync);
    loom_ddp_reset_stats(t->ddp);
  } else {
    loom_model_zero_grad(t->model);
  }
  loom_model_set_step(t->model, 0, 0);
done:
  loom_batch_free(&b);
  loom_free(idx);
  return s == LOOM_OK ? s : loom_error_context(s, "warming up");
}

/* log.per_rank: RUN/logs/rank-K.log, every rank's messages with time
 * stamps from the moment its rank is known. Always appended to: a restart
 * (loom run) or a resume keeps the earlier attempts' lines, and each
 * attempt begins with its own header line. */
static loom_status open_rank_log(loom_trainer *t) {
  const loom_config *cfg = &t->cfg;
  if (!cfg->log.per_rank || !cfg->log.run_dir[0] || t->rank_log)
    return LOOM_OK;
  char dir[LOOM_CONFIG_STR_MAX + 16], path[LOOM_CONFIG_STR_MAX + 48];
  snprintf(dir, sizeof dir, "%s/logs", cfg->log.run_dir);
  snprintf(path, sizeof path, "%s/rank-%d.log", dir, t->rank);
  LOOM_TRY(loom_fs_mkdirs(dir, 0755));
  LOOM_TRY(loom_fs_open_append(path, false, &t->rank_log));
  loom_log_set_file(t->rank_log, t->rank != 0);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  loom_log_file("---- rank %d of %d on %s, pid %ld: a new attempt", t->rank,
                t->nranks, host, (long)getpid());
  if (t->world)
    loom_log_file("comm: backend %s, %d of the %d ranks on this host; %s",
                  loom_group_backend(t->world), loom_group_local_size(t->world),
                  t->nranks,
                  loom_group_hier_gather(t->world)
                      ? "all-reduce, reduce-scatter and all-gather "
                        "hierarchical (shared memory inside the host, MPI "
                        "between hosts)"
                  : loom_group_hier(t->world)
                      ? "all-reduce hierarchical (shared memory inside the "
                        "host, MPI between hosts)"
                  : loom_group_shm(t->world) ? "shared memory between the ranks"
                                             : "MPI between the ranks");
  return LOOM_OK;
}

/* Rank 0 holds log.run_dir/.lock (an exclusive flock, its pid and host
 * written in it) while it trains: a second run in the same directory would
 * overwrite the first's checkpoints and metrics, and prune its
 * checkpoints. The lock goes with the process, however it ends. */
static loom_status lock_run_dir(loom_trainer *t) {
  const char *dir = t->cfg.log.run_dir;
  if (t->rank != 0 || !dir[0])
    return LOOM_OK;
  LOOM_TRY(loom_fs_mkdirs(dir, 0755));
  char path[LOOM_CONFIG_STR_MAX + 16];
  snprintf(path, sizeof path, "%s/.lock", dir);
  int fd = loom_fs_open_write_at(AT_FDCWD, path, 0, 0644);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot open: %s", path,
                      loom_fs_strerror(errno));
  const int lk = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
  if (lk != 0 && lk != EWOULDBLOCK) {
    /* a file system without locks (ENOLCK on some NFS mounts): train, as
     * before the lock existed, and say so */
    LOOM_WARN("%s: cannot lock (%s): a second run in %s would not be "
              "stopped",
              path, strerror(lk), dir);
    close(fd);
    return LOOM_OK;
  }
  if (lk == EWOULDBLOCK) {
    close(fd);
    char who[128] = "";
    ssize_t n = 0;
    int rfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (rfd >= 0) {
      n = pread(rfd, who, sizeof who - 1, 0);
      close(rfd);
    }
    who[n > 0 ? n : 0] = '\0';
    who[strcspn(who, "\n")] = '\0';
    return loom_error(LOOM_ERR_CONFIG,
                      "log.run_dir %s is in use by another run (%s): two runs "
                      "in one directory would overwrite each other's "
                      "checkpoints and metrics; wait for it to end or set "
                      "another log.run_dir",
                      dir, who[0] ? who : "its pid unknown");
  }
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char line[160];
  int len =
      snprintf(line, sizeof line, "pid %ld on %s\n", (long)getpid(), host);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
    LOOM_WARN("%s: cannot write the owner: %s", path, strerror(errno));
  t->run_lock = fd;
  return LOOM_OK;
}

static void close_rank_log(loom_trainer *t) {
  if (!t->rank_log)
    return;
  loom_log_set_file(NULL, false);
  fclose(t->rank_log);
  t->rank_log = NULL;
}

loom_status loom_trainer_new(loom_trainer **out, const loom_config *cfg,
                             const loom_train_opts *opts) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_trainer_new: out is NULL");
  *out = NULL;
  if (!cfg)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_trainer_new: cfg is NULL");
  loom_status s = loom_config_validate(cfg);
  if (s != LOOM_OK)
    return s;
  if (cfg->train.batch_size == 0)
    return loom_error(LOOM_ERR_CONFIG,
                      "train.batch_size is auto: loom train resolves it "
                      "before training; through the C API give a number "
                      "(loom estimate --memory or loom train "
                      "--find-batch-size find one)");
  if (opts && (opts->stop_at < 0 || opts->warm_up < -1 || opts->warm_up > 1))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trainer_new: opts.stop_at %lld (0: none, or a "
                      "step) or opts.warm_up %d (-1, 0 or 1) out of range",
                      (long long)opts->stop_at, opts->warm_up);
  LOOM_TRY(loom_cpu_check());
  loom_trainer *t = loom_calloc(1, sizeof *t);
  if (!t)
    return LOOM_ERR_NOMEM;
  t->eval_logged_step = -1;
  t->cfg = *cfg;
  t->run_lock = -1;
  t->opts = opts ? *opts : loom_train_opts_default();
  snprintf(t->resume, sizeof t->resume, "%s",
           t->opts.resume ? t->opts.resume : "auto");
  t->opts.resume = t->resume;
  t->accumulate = cfg->train.accumulate;
  s = loom_train_job_init(t);
  if (s != LOOM_OK) {
    loom_free(t);
    return s;
  }
  t->init_deferred = may_resume(t);
  bool deferred_any = t->init_deferred; /* on any rank (below) */
  if (cfg->train.threads > 0)
    loom_set_threads((int)cfg->train.threads);

  /* Every rank gets through its own setup (a rank without the data fails
   * here) before the first collective, and all learn whether all did. A
   * standby rank (loom run) prepares all of this ahead and waits only
   * before it reads the checkpoint, which must be the newest. */
  loom_runstat_gate_defer();
  /* A watchdog abort is told to loom run before it takes the process down. */
  loom_comm_set_abort_hook(loom_runstat_on_abort, NULL);
  s = open_world(t);
  if (s == LOOM_OK)
    s = open_rank_log(t);
  if (s == LOOM_OK) {
    loom_runstat_phase(LOOM_RUNSTAT_COMM_READY);
    s = setup_local(t);
  }
  if (s == LOOM_OK)
    s = loom_train_trace_open(t);
  LOOM_TRY_GOTO(s, loom_train_agree(t, s, "setting up"), fail);
  if (t->rank == 0 && t->replicas <= 1 &&
      cfg->parallel.compress != LOOM_CFG_COMPRESS_NONE)
    LOOM_WARN("parallel.compress %s: one replica (parallel.dp 1 of %d "
              "rank(s)), so no gradient is reduced across replicas to "
              "compress; it takes effect with parallel.dp > 1",
              loom_cfg_compress_names[cfg->parallel.compress], t->nranks);
  if (t->nranks > 1) {
    /* Whether this is a restart of the job (and so where to resume from)
     * is rank 0's to say: under loom run --nnodes each host's loom run
     * counts its own restarts, and ranks that disagreed would take
     * different paths to the checkpoint and stall in each other's
     * collectives. */
    int64_t rc = t->restart;
    loom_req r = LOOM_REQ_INIT;
    s = loom_broadcast(&rc, &rc, 1, LOOM_I64, 0, t->world, &r);
    if (s == LOOM_OK)
      s = loom_wait(&r);
    LOOM_TRY_GOTO(s, s, fail);
    t->restart = rc;
    /* A rank that deferred its draws for a resume that rank 0 then does
     * not make draws them below, and the fresh start's broadcast of rank
     * 0's values must then be every rank's. */
    int64_t d = t->init_deferred;
    r = (loom_req)LOOM_REQ_INIT;
    s = loom_allreduce(&d, &d, 1, LOOM_I64, LOOM_MAX, t->world, &r);
    if (s == LOOM_OK)
      s = loom_wait(&r);
    LOOM_TRY_GOTO(s, s, fail);
    deferred_any = d > 0;
  }
  LOOM_TRY_GOTO(s, loom_train_trace_sync(t), fail);
  if (t->zero == 2 && t->nranks > 1 && t->tps == 1 && !t->pipe)
    LOOM_TRY_GOTO(s, zero2_params(t), fail);
  if (!t->pipe && (t->units > 1 || cfg->parallel.deterministic || t->zero ||
                   cfg->parallel.strategy == LOOM_CFG_STRATEGY_DDP))
    LOOM_TRY_GOTO(s, make_ddp(t), fail);
  if (t->zero == 3 && !t->pipe) {
    loom_zero3_opts zo = loom_zero3_opts_default();
    LOOM_TRY_GOTO(s,
                  loom_config_shard_unit(cfg->parallel.shard_unit, &zo.every,
                                         &zo.min_params),
                  fail);
    /* with tensor parallelism, the rank's part over its replicas (the dp
     * group), cut as the optimizer and the DDP cut it */
    LOOM_TRY_GOTO(
        s,
        t->tps > 1
            ? loom_zero3_new_opts(&t->z3, t->model, t->dp_group, t->tp_bounds,
                                  &zo)
            : loom_zero3_new_opts(&t->z3, t->model, t->world, t->bounds, &zo),
        fail);
  }
  if (wants_warm_up(t)) {
    double t0 = loom_time_now();
    t->warming_up = true;
    s = warm_up(t);
    t->warming_up = false;
    if (t->tracing)
      loom_trace_span("train", "warm-up", t0, loom_time_now(), NULL);
    LOOM_TRY_GOTO(s, loom_train_agree(t, s, "warming up"), fail);
    if (t->rank == 0 && !t->opts.quiet)
      LOOM_INFO("warmed up before the checkpoint read (one forward and "
                "backward, state restored): %.2f s",
                loom_time_now() - t0);
  }
  /* After the gate: a standby group passes it once the live group is gone,
   * and with it the live group's lock (taken before, every standby's rank 0
   * found the directory in use and the restart fell back to a cold
   * launch). */
  loom_runstat_gate();
  LOOM_TRY_GOTO(
      s, loom_train_agree(t, lock_run_dir(t), "locking the run directory"),
      fail);
  LOOM_TRY_GOTO(s, loom_train_ckpt_resume(t), fail);
  if (t->tp_map && t->z3 && !t->resumed) {
    /* The replica's cut of this rank's part of the draws, a view at a
     * time. */
    LOOM_TRY_GOTO(s, loom_train_tp_fill_cut(t, NULL), fail);
  } else if (t->tp_map && !t->resumed) {
    /* This rank's part of the whole model's draws (a stage's: its views
     * and the borrowed ones): every replica draws the same, nothing to
     * broadcast. */
    LOOM_TRY_GOTO(s, loom_train_tp_init_params(t), fail);
  } else if (t->pipe && !t->resumed) {
    /* This stage's draws (and its borrowed weights': the same values as
     * their owner's, each view having its own stream). */
    LOOM_TRY_GOTO(s, loom_train_pipe_init_params(t), fail);
  } else if (t->z3 && !t->resumed) {
    /* This rank's slice of the draws, a view at a time. */
    LOOM_TRY_GOTO(s, loom_zero3_init_params(t->z3), fail);
  } else if (t->zero >= 2 && !t->resumed) {
    /* The same draws on every rank. */
    LOOM_TRY_GOTO(s, loom_model_init_params(t->model, NULL), fail);
  } else if (deferred_any && !t->resumed) {
    LOOM_TRY_GOTO(s, init_fresh(t), fail);
  }
  if (t->z3)
    LOOM_TRY_GOTO(s, loom_zero3_shard(t->z3), fail);
  loom_model_params_updated(t->model); /* loaded or drawn: a new half copy */
  loom_runstat_phase(LOOM_RUNSTAT_LOADED);
  *out = t;
  return LOOM_OK;
fail:
  loom_trainer_free(t);
  return s;
}

void loom_trainer_free(loom_trainer *t) {
  if (!t)
    return;
  loom_train_trace_close(t);
  close_rank_log(t);
  if (t->run_lock >= 0)
    close(t->run_lock); /* the flock goes with it */
  if (t->save.w) {
    loom_ckpt_writer_wait(t->save.w);
    loom_ckpt_writer_free(t->save.w);
  }
  loom_ckpt_writer_free(t->commit.w); /* joins its thread */
  loom_free(t->snap); /* the write thread read it until the wait above */
  loom_zero3_free(t->z3);
  loom_ddp_free(t->ddp);
  loom_train_pipe_free(t);
  loom_free(t->zero_counts);
  loom_free(t->bounds);
  loom_free(t->tp_bounds);
  loom_progress_free(t->progress);
  loom_metrics_close(t->metrics);
  loom_train_mlflow_close(t); /* after the metrics, which feed it */
  loom_optim_free(t->optim);
  loom_loader_free(t->train_loader);
  loom_dataset_free(t->train_ds);
  loom_dataset_free(t->val_ds);
  loom_xent_free(t->xent);
  loom_model_free(t->model);
  loom_train_tp_free(t);
  loom_tp_group_free(t->tpg); /* after the model, which borrowed it */
  loom_group_free(t->tp_group);
  if (t->nranks > 1)
    loom_group_mem_free(t->world, t->zparams); /* collective */
  else
    loom_free(t->zparams);
  loom_group_free(t->world);
  loom_free(t);
}

/* ------------------------------------------------------------- the loop */

/* Rows of global micro-batch `batch` of `epoch`, every rank's together. */
int64_t loom_train_global_rows(const loom_trainer *t, int64_t epoch,
                               int64_t batch) {
  int64_t gb = t->batch * t->replicas;
  if (t->cfg.data.tail == LOOM_TAIL_PARTIAL) {
    int64_t left =
        t->train_len - loom_loader_batch_first(t->train_loader, epoch, batch);
    return left < gb ? left : gb;
  }
  return gb;
}

int64_t loom_train_step_rows(const loom_trainer *t) {
  loom_loader_state ls;
  loom_loader_get_state(t->train_loader, &ls);
  int64_t total = 0;
  for (int64_t m = 0; m < t->accumulate; m++) {
    total += loom_train_global_rows(t, ls.epoch, ls.batch);
    if (++ls.batch >= loom_loader_epoch_batches(t->train_loader, ls.epoch)) {
      ls.epoch++;
      ls.batch = 0;
    }
  }
  return total;
}

/* Forward and loss of rows [lo, lo + n) of batch b. */
static loom_status forward_rows(loom_trainer *t, const loom_batch *b,
                                int64_t lo, int64_t n, loom_xent_stats *st,
                                loom_step_times *tm) {
  double t0 = loom_time_now();
  /* Dropout keys: the global index of the first row, the same at any world
   * size. */
  int64_t nb = loom_loader_batches_per_epoch(t->train_loader);
  int64_t gb = b->capacity * t->replicas;
  int64_t first = loom_loader_batch_first(t->train_loader, b->epoch, b->index);
  uint64_t base =
      (uint64_t)(b->epoch * nb * gb + first + t->replica * b->capacity + lo);
  loom_model_set_step(t->model, (uint64_t)t->step, base);
  loom_tensor x = b->x;
  const int32_t *y = (const int32_t *)b->y.data;
  if (lo != 0 || n != b->size) {
    LOOM_TRY(loom_tensor_slice0(&b->x, lo, n, &x));
    y += lo * (t->is_text ? b->y.shape[1] : 1);
  }
  loom_tensor logits;
  LOOM_TRY(loom_model_forward(t->model, &x, &logits));
  LOOM_TRY(loom_xent_forward(t->xent, &logits, y, st));
  double t1 = loom_time_now();
  tm->forward += t1 - t0;
  loom_train_trace_step(t, "forward", t0, t1, NULL);
  return LOOM_OK;
}

/* Backward of the last forward; scale weighs its mean loss in the step's
 * (units x rows / rows of the whole step: 1/k for full batches). */
/* ZeRO-3, a rank without rows: forward on the first row of the batch's
 * buffer (earlier data or zeros: valid input either way), for its gathers;
 * backward then runs with weight 0. */
static loom_status forward_empty(loom_trainer *t, const loom_batch *b,
                                 loom_xent_stats *st, loom_step_times *tm) {
  double t0 = loom_time_now();
  loom_tensor x = b->x;
  x.shape[0] = 1;
  loom_tensor logits;
  LOOM_TRY(loom_model_forward(t->model, &x, &logits));
  LOOM_TRY(loom_xent_forward(t->xent, &logits, (const int32_t *)b->y.data, st));
  double t1 = loom_time_now();
  tm->forward += t1 - t0;
  loom_train_trace_step(t, "forward", t0, t1, NULL);
  return LOOM_OK;
}

static loom_status backward_rows(loom_trainer *t, float scale,
                                 loom_step_times *tm) {
  double t0 = loom_time_now();
  loom_tensor dlogits;
  LOOM_TRY(loom_model_output_grad(t->model, &dlogits));
  /* f16: the loss weighed by the loss scale (1 without) */
  LOOM_TRY(
      loom_xent_backward(t->xent, &dlogits, scale * loom_train_loss_scale(t)));
  LOOM_TRY(loom_model_backward(t->model, NULL, NULL));
  double t1 = loom_time_now();
  tm->backward += t1 - t0;
  loom_train_trace_step(t, "backward", t0, t1, NULL);
  return LOOM_OK;
}

/* Set by the stop-signal thread, by note_stop in a handler on whichever
 * thread took the signal (libopenblas's threads start before main, with
 * the signals unblocked), or by a program's thread through
 * loom_trainer_request_stop; read by the training thread. So atomics, not
 * volatile sig_atomic_t (which orders nothing between threads: TSan found
 * the race); lock-free, as C11 7.14.1.1 asks of a handler's objects. */
static atomic_int stop_requested;
static atomic_int stop_signal; /* the first stop signal */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "stop flags: lock-free atomics");

/* The step's sums travel with the DDP's (over its group, the world): not
 * with a pipeline or tensor parallelism, whose DDP spans the replicas
 * only; train_step sums them over the world then. */
static bool ddp_sums(const loom_trainer *t) { return t->ddp && t->tps <= 1; }

/* The micro-batches of one optimizer step, forward and backward; sums
 * (SUM_N per local unit, S x SUM_N in deterministic mode) get the loss
 * statistics. With data parallelism the sums are posted (before the last
 * backward, so they travel ahead of the gradient buckets). */
static loom_status step_micro(loom_trainer *t, double *sums,
                              loom_step_times *tm, int64_t *epoch) {
  int S = batch_pieces(t);
  int64_t total = loom_train_step_rows(t);
  bool posted = false;
  for (int64_t m = 0; m < t->accumulate; m++) {
    const loom_batch *b;
    /* An injected slow loader (LOOM_FAULT slow_data) waits here too. */
    double late = t->n_faults > 0 ? loom_train_fault_data_delay(t) : 0;
    LOOM_TRY(loom_loader_next(t->train_loader, &b));
    tm->data += b->wait_s + late;
    if (t->tracing) {
      double now = loom_time_now();
      loom_train_trace_step(t, "data wait", now - b->wait_s - late, now, NULL);
    }
    *epoch = b->epoch;
    bool last = m == t->accumulate - 1;
    if (t->ddp)
      loom_ddp_set_sync(t->ddp, last);
    for (int j = 0; j < S; j++) {
      int64_t lo, n;
      shard_rows(t, b->size, j, &lo, &n);
      if (t->shards > 1)
        LOOM_TRY(loom_ddp_shard_begin(t->ddp, j));
      else if (t->ddp) /* micro-batches: the last one reduces */
        loom_ddp_set_sync(t->ddp, last && j == S - 1);
      /* An empty share of a short last batch adds nothing. Under ZeRO-3 the
       * passes gather parameters from every rank, so it runs them anyway,
       * on one row of whatever the buffer holds, with weight 0. */
      bool empty = n == 0;
      if (empty && !t->z3)
        continue;
      loom_xent_stats st;
      if (empty)
        LOOM_TRY(forward_empty(t, b, &st, tm));
      else
        LOOM_TRY(forward_rows(t, b, lo, n, &st, tm));
      if (empty)
        memset(&st, 0, sizeof st);
      double *u = sums + (t->shards > 1 ? j : 0) * SUM_N;
      u[SUM_LOSS] += st.loss_sum;
      u[SUM_COUNT] += (double)st.count;
      u[SUM_CORRECT] += (double)st.correct;
      if (ddp_sums(t) && last && j == S - 1) {
        sums[SUM_STOP] = loom_trainer_stop_requested() ? 1 : 0;
        loom_train_ckpt_flags(t, sums);
        LOOM_TRY(loom_ddp_sum_post(t->ddp, sums, SUM_N));
        posted = true;
      }
      float scale = (float)((double)t->units * (double)n) / (float)total;
      LOOM_TRY(backward_rows(t, empty ? 0.0f : scale, tm));
    }
  }
  if (ddp_sums(t) && !posted) {
    sums[SUM_STOP] = loom_trainer_stop_requested() ? 1 : 0;
    loom_train_ckpt_flags(t, sums);
    LOOM_TRY(loom_ddp_sum_post(t->ddp, sums, SUM_N));
  }
  return LOOM_OK;
}

/* Waits for an operation that waits for a slower rank, beating (loom run's
 * sign of life) while it does: waiting for a rank that is still busy is not
 * a hang. That rank beats on its own; one that stops is still found. */
static loom_status wait_alive(loom_req *r) {
  for (;;) {
    bool done = false;
    loom_status s = loom_wait_for(r, 0.25, &done);
    if (done)
      return s;
    loom_runstat_beat();
  }
}

/* Whether `mine` holds on any rank: one MAX reduction over the world,
 * which every rank calls at the same point. agree_stop asks it of a stop
 * request, at the same point of an evaluation whose ranks run each batch
 * together (a pipeline's stages, a tensor group, ZeRO-3's gathers), so
 * that all leave it before the same batch: one small reduction per batch,
 * beside the batch's own collectives. */
static loom_status agree_any(loom_trainer *t, bool mine, bool *any) {
  int64_t v = mine ? 1 : 0;
  if (t->world && t->nranks > 1) {
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_allreduce(&v, &v, 1, LOOM_I64, LOOM_MAX, t->world, &r));
    LOOM_TRY(wait_alive(&r));
  }
  *any = v > 0;
  return LOOM_OK;
}

static loom_status agree_stop(loom_trainer *t, bool *stop) {
  return agree_any(t, loom_trainer_stop_requested(), stop);
}

/* Evaluation is shared: rank r takes batches r, r + P, ... of a fixed batch
 * size, and the per-batch sums are added in batch order, so the result does
 * not depend on the number of ranks. */
static loom_status evaluate(loom_trainer *t, int64_t max_batches, double *loss,
                            double *accuracy, bool *stopped) {
  loom_sampler_opts so = loom_sampler_opts_default();
  so.shuffle = false;
  so.tail = LOOM_TAIL_PARTIAL;
  so.batch = t->cfg.train.batch_size;
  loom_sampler *sp = NULL;
  LOOM_TRY(loom_sampler_new(&sp, loom_dataset_len(t->val_ds), &so));
  int64_t nb = loom_sampler_num_batches(sp);
  if (max_batches > 0 && max_batches < nb)
    nb = max_batches;
  loom_batch b;
  memset(&b, 0, sizeof b);
  /* (nb, 3) and the ranks' stop count after them */
  const size_t rows = (size_t)nb + 1;
  double *part = loom_calloc(rows * 3, sizeof(double));
  double *all = loom_calloc(rows * 3, sizeof(double));
  int64_t *idx = loom_malloc((size_t)so.batch * sizeof(int64_t));
  loom_status s = LOOM_OK;
  if (!part || !all || !idx) {
    s = LOOM_ERR_NOMEM;
    goto done;
  }
  LOOM_TRY_GOTO(s, loom_batch_alloc(&b, t->val_ds, so.batch), done);
  loom_model_set_training(t->model, false);
  if (t->pipe || t->tps > 1) {
    /* Replica d takes batches d, d + D, ...; all its stages run each one
     * (the last adds the sums), or all ranks of its tp group together
     * (their reductions; the first keeps the sums). */
    if (t->pipe)
      loom_pipe_set_training(t->pipe, false);
    /* ZeRO-3 gathers over the replicas: each runs as many forwards (one
     * past the last batch runs the last again, its sums in a scratch
     * row). A stop is agreed before each round of batches, so every
     * replica runs the same number of rounds (one with no batch left
     * skips it). */
    int64_t end =
        nb > 0 ? (nb + t->replicas - 1) / t->replicas * t->replicas : 0;
    for (int64_t i = t->replica; i < end + t->replica; i += t->replicas) {
      if (stopped) {
        bool stop;
        LOOM_TRY_GOTO(s, agree_stop(t, &stop), done);
        if (stop) {
          part[nb * 3] = 1;
          break;
        }
      }
      if (i >= nb && !t->z3)
        continue;
      int64_t count;
      LOOM_TRY_GOTO(s, loom_sampler_batch(sp, i < nb ? i : nb - 1, idx, &count),
                    done);
      if (count == 0)
        continue;
      if (t->n_faults > 0) /* LOOM_FAULT slow_data: evaluation reads too */
        loom_train_fault_data_delay(t);
      LOOM_TRY_GOTO(s, loom_dataset_fill(t->val_ds, 0, idx, count, &b), done);
      double scratch[3] = {0, 0, 0};
      double *into = i < nb ? part + i * 3 : scratch;
      LOOM_TRY_GOTO(s,
                    t->pipe ? loom_train_pipe_eval(t, &b, into)
                            : loom_train_tp_eval(t, &b, into),
                    done);
      loom_runstat_beat();
    }
    goto done;
  }
  /* ZeRO-3 gathers each unit's parameters from all ranks as forward goes:
   * every rank runs as many forwards (a rank past the last batch runs the
   * last one again and keeps nothing of it). */
  int64_t end = nb;
  if (t->z3 && nb > 0)
    end = (nb + t->nranks - 1) / t->nranks * t->nranks;
  for (int64_t i = t->rank; i < end; i += t->nranks) {
    /* A stop (a signal) ends this rank's share at once; the ranks learn
     * it in the sums below. ZeRO-3's forwards gather from every rank, so
     * there the ranks agree on it before each round of batches. */
    if (stopped) {
      bool stop = loom_trainer_stop_requested();
      if (t->z3)
        LOOM_TRY_GOTO(s, agree_stop(t, &stop), done);
      if (stop) {
        part[nb * 3] = 1;
        break;
      }
    }
    int64_t count;
    LOOM_TRY_GOTO(s, loom_sampler_batch(sp, i < nb ? i : nb - 1, idx, &count),
                  done);
    if (count == 0)
      continue;
    if (t->n_faults > 0) /* LOOM_FAULT slow_data: evaluation reads too */
      loom_train_fault_data_delay(t);
    LOOM_TRY_GOTO(s, loom_dataset_fill(t->val_ds, 0, idx, count, &b), done);
    loom_tensor logits;
    loom_xent_stats st;
    LOOM_TRY_GOTO(s, loom_model_forward(t->model, &b.x, &logits), done);
    /* A long evaluation (the final one covers the whole split) is not a
     * hang: loom run sees this rank alive. */
    loom_runstat_beat();
    LOOM_TRY_GOTO(
        s, loom_xent_forward(t->xent, &logits, (const int32_t *)b.y.data, &st),
        done);
    if (i >= nb)
      continue;
    part[i * 3 + 0] = st.loss_sum;
    part[i * 3 + 1] = (double)st.count;
    part[i * 3 + 2] = (double)st.correct;
  }
done:
  loom_model_set_training(t->model, true);
  if (t->pipe)
    loom_pipe_set_training(t->pipe, true);
  if (t->world && t->nranks > 1) {
    /* The ranks' shares end at different times (uneven shares, a loaded
     * machine): the first to finish waits for the others, alive. */
    loom_req r = LOOM_REQ_INIT;
    loom_status bs = loom_barrier(t->world, &r);
    if (bs == LOOM_OK)
      bs = wait_alive(&r);
    if (s == LOOM_OK)
      s = bs;
  }
  /* Agree even on failure: the other ranks are about to add the sums. */
  s = loom_train_agree(t, s, "evaluation");
  if (s == LOOM_OK && (!part || !all))
    s = LOOM_ERR_NOMEM; /* (agree returns this rank's own failure) */
  if (s == LOOM_OK && t->nranks > 1) {
    /* Each batch has one rank's value and zeros: the sum is exact. */
    loom_req r = LOOM_REQ_INIT;
    s = loom_allreduce(part, all, (size_t)nb * 3 + 1, LOOM_F64, LOOM_SUM,
                       t->world, &r);
    if (s == LOOM_OK)
      s = loom_wait(&r);
  } else if (s == LOOM_OK) {
    memcpy(all, part, ((size_t)nb * 3 + 1) * sizeof(double));
  }
  if (stopped)
    *stopped = s == LOOM_OK && all[nb * 3] > 0;
  if (s == LOOM_OK && stopped && *stopped) {
    *loss = NAN;
    *accuracy = NAN;
  } else if (s == LOOM_OK) {
    double loss_sum = 0, count = 0, correct = 0;
    for (int64_t i = 0; i < nb; i++) {
      loss_sum += all[i * 3 + 0];
      count += all[i * 3 + 1];
      correct += all[i * 3 + 2];
    }
    *loss = count > 0 ? loss_sum / count : NAN;
    *accuracy = count > 0 ? correct / count : NAN;
  }
  loom_batch_free(&b);
  loom_free(idx);
  loom_free(part);
  loom_free(all);
  loom_sampler_free(sp);
  return s;
}

loom_status loom_trainer_evaluate(loom_trainer *t, double *loss,
                                  double *accuracy) {
  if (!t)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trainer_evaluate: trainer is NULL");
  double l, a; /* either result may be left out */
  return evaluate(t, t->cfg.train.eval_batches, loss ? loss : &l,
                  accuracy ? accuracy : &a, NULL);
}

static bool is_rank0(const loom_trainer *t) { return t->rank == 0; }

/* The stop signal the ranks stop on: the largest any rank caught (a rank
 * that only learned of the stop from the others caught none). Every rank
 * calls it at the same point: the stop is agreed. */
static int agreed_signal(loom_trainer *t) {
  int64_t sig = atomic_load(&stop_signal);
  if (t->world && t->nranks > 1) {
    loom_req r = LOOM_REQ_INIT;
    if (loom_allreduce(&sig, &sig, 1, LOOM_I64, LOOM_MAX, t->world, &r) !=
            LOOM_OK ||
        loom_wait(&r) != LOOM_OK)
      sig = atomic_load(&stop_signal);
  }
  return (int)sig;
}

/* Periodic evaluations take train.eval_batches batches; the last one of a
 * run covers the whole validation split. */
static loom_status log_eval(loom_trainer *t, loom_train_result *res,
                            bool last) {
  double vl, va;
  bool stopped = false;
  LOOM_TRY(
      evaluate(t, last ? 0 : t->cfg.train.eval_batches, &vl, &va, &stopped));
  if (!stopped) { /* a cut evaluation is neither logged nor reported */
    res->val_loss = vl;
    res->val_accuracy = t->is_text ? NAN : va;
    res->val_step = t->step;
    res->val_whole = last || t->cfg.train.eval_batches == 0;
  }
  if (stopped && last) { /* the steps are done; the run was stopped */
    res->interrupted = true;
    res->stop_signal = agreed_signal(t);
  }
  if (!is_rank0(t))
    return LOOM_OK;
  char line[256];
  if (stopped)
    snprintf(line, sizeof line,
             "eval step %lld: stopped (a stop was requested); not logged",
             (long long)t->step);
  else if (t->is_text)
    snprintf(line, sizeof line,
             "eval step %lld: val_loss %.4f (%.3f bits/byte)",
             (long long)t->step, vl, vl / log(2.0));
  else
    snprintf(line, sizeof line,
             "eval step %lld: val_loss %.4f val_accuracy %.2f%%",
             (long long)t->step, vl, 100.0 * va);
  if (!t->opts.quiet)
    loom_progress_print(t->progress, line);
  loom_log_file("%s", line);
  if (t->metrics && !stopped) {
    t->eval_logged_step = t->step;
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

/* The stop signals' handler, and what the signal thread calls. */
static void note_stop(int sig) {
  int none = 0; /* the first signal stays, whichever thread saw it */
  atomic_compare_exchange_strong(&stop_signal, &none, sig);
  atomic_store(&stop_requested, 1);
}

void loom_trainer_request_stop(void) { atomic_store(&stop_requested, 1); }

bool loom_trainer_stop_requested(void) {
  return atomic_load(&stop_requested) != 0;
}

int loom_trainer_stop_signal(void) { return atomic_load(&stop_signal); }

static bool stop_caught_early;

/* The stop signals: never delivered to a thread that computes.
 *
 * oneDNN's JIT GEMM kernels (libdnnl 2.x; fixed upstream in oneDNN PR 4855
 * for issue 4845) point rsp at a workspace on the heap while they run. A
 * signal whose handler runs on such a thread makes the kernel push its
 * signal frame (about 3 KB with the AVX-512 state) below that rsp, over
 * the heap chunk in front of the workspace: glibc then aborts in a later
 * free ("corrupted size vs. prev_size while consolidating", "free():
 * invalid pointer") or a thread hangs on a clobbered lock. That is what a
 * SIGINT/SIGTERM from loom run did to a rank now and then (a core showed
 * the frame, FP_XSTATE_MAGIC1 and the zmm registers, written at rsp - 128
 * of a dnnl sgemm kernel whose rsp was a heap address). The handler itself
 * only sets flags; where it runs is the problem.
 *
 * So the stop signals are blocked in the thread that catches them, before
 * anything else starts: every thread created afterwards (the compute
 * threads of OpenMP and oneDNN, the communication and loader threads, MPI's
 * own) inherits the mask, and one thread of our own, which never computes,
 * takes them with sigwait. */
static const int stop_sigs[] = {SIGINT, SIGTERM, SIGHUP};

static void stop_sigset(sigset_t *set) {
  sigemptyset(set);
  for (size_t i = 0; i < sizeof stop_sigs / sizeof stop_sigs[0]; i++)
    sigaddset(set, stop_sigs[i]);
}

static void *stop_signal_thread(void *arg) {
  (void)arg;
  sigset_t set;
  stop_sigset(&set);
  for (;;) {
    int sig;
    if (sigwait(&set, &sig) != 0)
      continue;
    /* Whoever set the default action back (the hang fault) wants the
     * signal to end the process: let it through, here, where nothing
     * computes. An ignored one stays ignored. */
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO)) {
      if (cur.sa_handler == SIG_IGN)
        continue;
      if (cur.sa_handler == SIG_DFL) {
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL);
        raise(sig);
        pthread_sigmask(SIG_BLOCK, &one, NULL);
        continue;
      }
    }
    note_stop(sig);
  }
  return NULL;
}

void loom_trainer_catch_stop_signals(void) {
  if (stop_caught_early)
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = note_stop; /* for a thread that unblocks them anyway */
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof stop_sigs / sizeof stop_sigs[0]; i++)
    sigaction(stop_sigs[i], &sa, NULL);
  sigset_t set;
  stop_sigset(&set);
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &set, &old);
  pthread_attr_t attr;
  pthread_t th;
  bool started = pthread_attr_init(&attr) == 0;
  if (started) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&th, &attr, stop_signal_thread, NULL) == 0;
    pthread_attr_destroy(&attr);
  }
  if (!started) {
    /* No thread to take them: the handler, as before (the risk above). */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    LOOM_WARN("cannot start the stop-signal thread; stop signals are "
              "handled on the computing threads");
  }
  stop_caught_early = true;
}

/* ZeRO-1: each rank stepped its slice of the parameters; every rank gets
 * all of them (in place: this rank's slice is already where it belongs). */
static loom_status zero1_gather(loom_trainer *t, float *params) {
  if (t->tps > 1) { /* over the replicas of the rank's part */
    if (t->replicas == 1)
      return LOOM_OK;
    int64_t lo, hi;
    loom_train_tp_cut(t, t->replica, &lo, &hi);
    return loom_train_tp_gather_cuts(t, params + lo, params); /* a = 0 */
  }
  if (t->nranks == 1)
    return LOOM_OK;
  if (!t->zero_counts) {
    t->zero_counts = loom_calloc((size_t)t->nranks, sizeof *t->zero_counts);
    if (!t->zero_counts)
      return LOOM_ERR_NOMEM;
    for (int r = 0; r < t->nranks; r++) {
      int64_t lo, hi;
      loom_train_slice(t, r, &lo, &hi);
      t->zero_counts[r] = (size_t)(hi - lo);
    }
  }
  int64_t lo, hi;
  loom_train_slice(t, t->rank, &lo, &hi);
  loom_req req = LOOM_REQ_INIT;
  LOOM_TRY(loom_allgatherv(params + lo, params, t->zero_counts, LOOM_F32,
                           t->world, &req));
  return loom_wait(&req);
}

/* The optimizer step after backward: the reduced gradient, clipped by its
 * global norm when asked (which needs all of it first), else stepped bucket
 * by bucket as the reductions complete. */
static loom_status optim_step(loom_trainer *t, float lr, double *gnorm,
                              loom_step_times *tm) {
  if (t->pipe)
    return loom_train_pipe_optim(t, lr, gnorm, tm);
  double t0 = loom_time_now();
  float *params = loom_model_params(t->model);
  int64_t n = loom_model_num_params(t->model);
  double clip = t->cfg.optim.grad_clip;
  loom_ddp_stats ds;
  /* Loss scaling: the whole reduced gradient is checked before any of it
   * steps (no stepping bucket by bucket); skip: all ranks skip. */
  const bool scaled = t->ls_mode != LOOM_LOSS_SCALE_NONE;
  bool skip = false;
  /* bf16/f16 on the conversion path: the optimizer writes each parameter's
   * rounding into the model's copy as it updates it, when it updates them
   * all here (not a ZeRO shard, whose others arrive by gather) */
  const loom_optim_opts *oo = loom_optim_get_opts(t->optim);
  float *rounded = t->zero == 0 && oo->shard_begin == 0 &&
                           (oo->shard_end < 0 || oo->shard_end == n)
                       ? loom_model_rounded_copy(t->model)
                       : NULL;
  LOOM_TRY(loom_optim_set_rounded(t->optim, loom_model_precision(t->model),
                                  rounded));
  if (t->ddp && clip <= 0 && !scaled && !t->sp) {
    LOOM_TRY(loom_ddp_step(t->ddp, t->optim, lr));
  } else if (t->zero >= 2) {
    /* This rank holds only its slice of the gradient: the norm is summed
     * over the slices (with tensor parallelism, its replica's cut of the
     * rank's part: summed over the tp group, then the replicas). */
    LOOM_TRY(loom_ddp_wait(t->ddp));
    float *grads = loom_model_grads(t->model);
    int64_t lo, hi;
    if (t->tps > 1)
      loom_train_tp_cut(t, t->replica, &lo, &hi);
    else
      loom_train_slice(t, t->rank, &lo, &hi);
    /* sequence parallelism: the whole views' parts in the cut summed over
     * the tp group (the replicas' sum is in) */
    LOOM_TRY(loom_train_tp_sp_grads(t, lo, hi));
    LOOM_TRY(loom_train_scale_unscale(t, grads + lo, hi - lo, &skip));
    double ss;
    if (!skip && clip > 0) {
      if (t->tps > 1)
        LOOM_TRY(loom_train_tp_cut_sumsq(t, lo, hi, &ss));
      else
        LOOM_TRY(loom_ddp_grad_sumsq(t->ddp, &ss));
      LOOM_TRY(
          loom_grad_clip_sumsq(grads + lo, hi - lo, ss, (float)clip, gnorm));
    }
    if (!skip)
      LOOM_TRY(loom_optim_step(t->optim, params, grads, lr));
  } else if (t->tp_map && (clip > 0 || t->sp)) {
    /* The rank's part of the gradient: the norm of the whole one (the cut
     * parameters' squares summed over the tp group, the whole ones once);
     * f16: unscaled first, an inf or NaN on any rank skipping everywhere.
     * Sequence parallelism: the whole ones' parts summed before all. */
    if (t->ddp)
      LOOM_TRY(loom_ddp_wait(t->ddp));
    float *grads = loom_model_grads(t->model);
    LOOM_TRY(loom_train_tp_sp_grads(t, 0, n));
    LOOM_TRY(loom_train_scale_unscale(t, grads, n, &skip));
    if (!skip) {
      if (clip > 0) {
        double ss;
        LOOM_TRY(loom_train_tp_grad_sumsq(t, 0, n, &ss));
        LOOM_TRY(loom_grad_clip_sumsq(grads, n, ss, (float)clip, gnorm));
      }
      LOOM_TRY(loom_optim_step(t->optim, params, grads, lr));
    }
  } else {
    if (t->ddp)
      LOOM_TRY(loom_ddp_wait(t->ddp));
    float *grads = loom_model_grads(t->model);
    LOOM_TRY(loom_train_scale_unscale(t, grads, n, &skip));
    if (!skip && clip > 0)
      LOOM_TRY(loom_grad_clip(grads, n, (float)clip, gnorm));
    if (!skip)
      LOOM_TRY(loom_optim_step(t->optim, params, grads, lr));
  }
  if (!skip && (t->zero == 1 || t->zero == 2))
    LOOM_TRY(zero1_gather(t, params));
  /* bf16/f16: the weight copy is made again once, on the next forward,
   * unless the optimizer kept it current (a skipped step changed nothing) */
  if (!rounded)
    loom_model_params_updated(t->model);
  double el = loom_time_now() - t0;
  if (t->ddp) {
    loom_ddp_get_stats(t->ddp, &ds);
    tm->comm_wait += ds.last_wait_s;
    tm->reduce += ds.last_reduce_s;
    el -= ds.last_wait_s;
  }
  tm->optim += el;
  if (t->tracing) {
    /* The optimizer's span holds the waits for the reductions it needs:
     * optim_s in metrics.jsonl is its length less comm_wait_s. */
    char args[96];
    snprintf(args, sizeof args, "\"step\":%lld,\"comm_wait_s\":%.6f",
             (long long)t->step, t->ddp ? ds.last_wait_s : 0.0);
    loom_trace_span("train", "optimizer", t0, loom_time_now(), args);
  }
  return LOOM_OK;
}

/* Rank 0's outputs of a run: metrics.jsonl (appended to on a resume) and
 * the progress display. */
static loom_status open_outputs(loom_trainer *t) {
  const loom_config *cfg = &t->cfg;
  loom_status s = LOOM_OK;
  if (t->outputs_open) /* a second loom_trainer_run: they stay open */
    return LOOM_OK;
  t->outputs_open = true;
  loom_log_file("training from step %lld to %lld", (long long)t->step,
                (long long)t->total_steps);
  if (!is_rank0(t))
    return LOOM_OK;
  if (cfg->log.mlflow_uri[0] && cfg->log.run_dir[0])
    LOOM_TRY(loom_train_mlflow_open(t));
  if ((cfg->log.metrics || cfg->log.tensorboard || t->mlflow) &&
      cfg->log.run_dir[0]) {
    loom_metrics_opts mo = loom_metrics_opts_default();
    mo.mlflow = t->mlflow;
    mo.jsonl = cfg->log.metrics;
    mo.tensorboard = cfg->log.tensorboard;
    mo.append = t->step > 0;
    mo.keep_to_step = t->step > 0 ? t->step : -1;
    s = loom_metrics_open_opts(&t->metrics, cfg->log.run_dir, &mo);
    if (s == LOOM_OK && loom_metrics_kept_eval(t->metrics))
      t->eval_logged_step = t->step;
    if (s == LOOM_OK)
      s = loom_train_write_run_info(t);
  }
  loom_progress_mode pm = cfg->log.progress;
  if (t->opts.quiet)
    pm = LOOM_PROGRESS_OFF;
  if (s == LOOM_OK)
    s = loom_progress_new(&t->progress, pm, stderr, t->step, t->total_steps,
                          cfg->log.every > INT_MAX ? INT_MAX
                                                   : (int)cfg->log.every,
                          t->is_text ? "tokens" : "samples");
  return s;
}

/* log_eval, a span of the trace. */
static loom_status eval_traced(loom_trainer *t, loom_train_result *res,
                               bool last) {
  double t0 = loom_time_now();
  LOOM_TRY(log_eval(t, res, last));
  if (t->tracing)
    loom_trace_span("train", "evaluation", t0, loom_time_now(), NULL);
  return LOOM_OK;
}

/* A run resumed at step N where a periodic evaluation is due, and whose
 * metrics.jsonl lacks it, runs it before step N + 1: the checkpoint of a step
 * is saved before its evaluation, so a run stopped (or killed) during that
 * evaluation left none. Rank 0 keeps metrics.jsonl and decides; the world
 * agrees (one reduction, at such steps only). *stop: a stop came during it. */
static loom_status resume_eval(loom_trainer *t, loom_train_result *res,
                               int64_t every, bool *stop) {
  *stop = false;
  if (t->step <= 0 || t->step >= t->total_steps || t->step % every != 0)
    return LOOM_OK;
  bool missing;
  LOOM_TRY(agree_any(t,
                     is_rank0(t) && t->metrics &&
                         loom_metrics_path(t->metrics)[0] &&
                         t->eval_logged_step != t->step,
                     &missing));
  if (!missing)
    return LOOM_OK;
  if (is_rank0(t))
    LOOM_INFO("step %lld's evaluation is missing from %s (the run that saved "
              "step %lld stopped before it finished): running it now",
              (long long)t->step, loom_metrics_path(t->metrics),
              (long long)t->step);
  LOOM_TRY(eval_traced(t, res, false));
  return agree_stop(t, stop);
}

/* The steps since the last metrics line: their count, when they began, and
 * their summed times. */
typedef struct run_window {
  double t0;
  int64_t steps;
  loom_step_times times;
} run_window;

static void window_add(run_window *w, const loom_step_times *tm) {
  w->steps++;
  w->times.forward += tm->forward;
  w->times.backward += tm->backward;
  w->times.comm_wait += tm->comm_wait;
  w->times.reduce += tm->reduce;
  w->times.optim += tm->optim;
  w->times.data += tm->data;
  w->times.pipe_step += tm->pipe_step;
  w->times.pipe_wait += tm->pipe_wait;
  w->times.tp_wait += tm->tp_wait;
  w->times.tp_bytes += tm->tp_bytes;
  w->times.tp_seq_bytes += tm->tp_seq_bytes;
  w->times.tp_wire_bytes += tm->tp_wire_bytes;
  w->times.pp_dp_bytes += tm->pp_dp_bytes;
}

/* One training step: gradients cleared, the micro-batches' forward and
 * backward, the optimizer, and every rank's sums (*g: loss, rows, correct,
 * stop). Counts the step; fails when the loss is not finite. */
static loom_status train_step(loom_trainer *t, double *sums, double g[SUM_N],
                              loom_step_times *tm, int64_t *epoch, float *lr,
                              double *gnorm) {
  /* The trace's window: this step and what follows it (its metrics line,
   * checkpoint, evaluation) are recorded or not by its number. */
  loom_trace_step(t->step);
  double ts = loom_time_now();
  loom_tp_stats tp0 = {0};
  if (t->tpg)
    loom_tp_group_stats(t->tpg, &tp0);
  if (t->ddp)
    LOOM_TRY(loom_ddp_zero_grad(t->ddp));
  else if (t->pipe)
    loom_pipe_zero_grad(t->pipe);
  else
    loom_model_zero_grad(t->model);
  memset(sums, 0, (size_t)t->shards * SUM_N * sizeof(double));
  if (t->pipe)
    LOOM_TRY(loom_train_pipe_micro(t, sums, tm, epoch));
  else
    LOOM_TRY(step_micro(t, sums, tm, epoch));
  *gnorm = NAN;
  *lr = loom_sched_lr(&t->sched, t->step);
  loom_req sums_req = LOOM_REQ_INIT;
  memset(g, 0, SUM_N * sizeof(double)); /* written by the reduction */
  bool world_sums = t->pipe || t->tps > 1;
  if (world_sums) {
    /* The loss is on the last stages; the stop and checkpoint flags on
     * every rank: summed over the world while the optimizer runs. A
     * tensor-parallel group's ranks all have their replica's loss: the
     * first one counts it. */
    if (t->tp_rank > 0)
      sums[SUM_LOSS] = sums[SUM_COUNT] = sums[SUM_CORRECT] = 0;
    sums[SUM_STOP] = loom_trainer_stop_requested() ? 1 : 0;
    loom_train_ckpt_flags(t, sums);
    LOOM_TRY(loom_allreduce(sums, g, SUM_N, LOOM_F64, LOOM_SUM, t->world,
                            &sums_req));
  }
  loom_status os = optim_step(t, *lr, gnorm, tm);
  if (world_sums) {
    /* Waited for even after a failure: the request lives on this stack. */
    loom_status ws = loom_wait(&sums_req);
    LOOM_TRY(os);
    LOOM_TRY(ws);
    LOOM_TRY(loom_train_ckpt_poll(t, g));
  } else if (t->ddp) {
    LOOM_TRY(os);
    LOOM_TRY(loom_ddp_sum_wait(t->ddp, g));
    LOOM_TRY(loom_train_ckpt_poll(t, g));
  } else {
    LOOM_TRY(os);
    memcpy(g, sums, SUM_N * sizeof(double));
    g[SUM_STOP] = loom_trainer_stop_requested() ? 1 : 0;
  }
  if (t->tpg) {
    loom_tp_stats tp1;
    loom_tp_group_stats(t->tpg, &tp1);
    tm->tp_wait = tp1.wait_s - tp0.wait_s;
    tm->tp_bytes = (double)(tp1.bytes - tp0.bytes);
    tm->tp_seq_bytes = (double)(tp1.seq_bytes - tp0.seq_bytes);
    tm->tp_wire_bytes = tp1.wire_bytes - tp0.wire_bytes;
  }
  t->step++;
  loom_runstat_step(t->step);
  tm->total = loom_time_now() - ts;
  double loss = g[SUM_COUNT] > 0 ? g[SUM_LOSS] / g[SUM_COUNT] : 0;
  if (!isfinite(loss))
    return loom_error(LOOM_ERR_INTERNAL,
                      "the loss is %f at step %lld: training diverged (lower "
                      "optim.lr or set optim.grad_clip)",
                      loss, (long long)t->step);
  return LOOM_OK;
}

/* What each rank says of its own steps at a metrics line: the time it
 * computed (the step less every wait: for data, for the reductions, on its
 * pipeline neighbours and on its tensor-parallel group's collectives), and
 * those waits; per step, over the window. A rank slower than its group
 * makes the others wait at the next collective: without their tp waits
 * left out, every rank of a tp group would look as busy as the slowest. */
enum {
  RANK_BUSY,
  RANK_DATA,
  RANK_COMM,
  RANK_PP_STEP,
  RANK_PP_WAIT,
  RANK_TP_WAIT,
  RANK_N
};

static void rank_parts(const run_window *w, double now, double out[RANK_N]) {
  const double n = (double)w->steps;
  double step = (now - w->t0) / n;
  out[RANK_DATA] = w->times.data / n;
  out[RANK_COMM] = w->times.comm_wait / n;
  out[RANK_PP_STEP] = w->times.pipe_step / n;
  out[RANK_PP_WAIT] = w->times.pipe_wait / n;
  out[RANK_TP_WAIT] = w->times.tp_wait / n;
  out[RANK_BUSY] = step - out[RANK_DATA] - out[RANK_COMM] - out[RANK_PP_WAIT] -
                   out[RANK_TP_WAIT];
}

/* Every rank's parts on rank 0 ((nranks, RANK_N) into *all, made here; NULL
 * on one rank). Collective over the world: every rank calls it at the same
 * steps. */
static loom_status gather_ranks(loom_trainer *t, const double mine[RANK_N],
                                double **all) {
  *all = NULL;
  if (!t->world || t->nranks == 1)
    return LOOM_OK;
  double *v = loom_calloc((size_t)t->nranks * RANK_N, sizeof *v);
  if (!v)
    return LOOM_ERR_NOMEM;
  loom_req r = LOOM_REQ_INIT;
  loom_status s = loom_allgather(mine, v, RANK_N, LOOM_F64, t->world, &r);
  if (s == LOOM_OK)
    s = loom_wait(&r);
  if (s != LOOM_OK) {
    loom_free(v);
    return loom_error_context(s, "gathering every rank's step times");
  }
  *all = v;
  return LOOM_OK;
}

/* log.per_rank: this rank's own line for the window. */
static void rank_log_window(const loom_trainer *t, const run_window *w,
                            double now, double loss) {
  const double n = (double)w->steps;
  const loom_step_times *x = &w->times;
  loom_log_file("step %lld: %.6f s a step over %lld (data wait %.6f, forward "
                "%.6f, backward %.6f, comm wait %.6f, optimizer %.6f), loss "
                "%.6f, peak rss %.1f MiB",
                (long long)t->step, (now - w->t0) / n, (long long)w->steps,
                x->data / n, x->forward / n, x->backward / n, x->comm_wait / n,
                x->optim / n, loss, loom_train_peak_rss() / (1024.0 * 1024.0));
}

/* One metrics line for the window: the mean loss (and accuracy) of its
 * steps, the rate, and where a step's time went. */
static loom_status write_metrics(loom_trainer *t, const run_window *w,
                                 int64_t epoch, float lr, double rate,
                                 double gnorm, double now, double loss,
                                 const loom_train_mem *mem,
                                 const double *ranks) {
  loom_metrics *m = t->metrics;
  const double n = (double)w->steps;
  const loom_step_times *win = &w->times;
  loom_metrics_begin(m);
  loom_metrics_int(m, "step", t->step);
  loom_metrics_int(m, "epoch", epoch);
  loom_metrics_num(m, "time", loom_time_wall());
  loom_metrics_num(m, "loss", loss);
  if (!t->is_text)
    loom_metrics_num(m, "accuracy",
                     t->acc_window_sum / (double)t->loss_window_n);
  loom_metrics_num(m, "lr", lr);
  loom_metrics_num(m, t->is_text ? "tokens_per_s" : "samples_per_s", rate);
  loom_metrics_int(m, "ranks", t->nranks);
  loom_metrics_num(m, "step_s", (now - w->t0) / n);
  loom_metrics_num(m, "data_wait_s", win->data / n);
  loom_metrics_num(m, "forward_s", win->forward / n);
  loom_metrics_num(m, "backward_s", win->backward / n);
  if (t->ddp) {
    loom_ddp_stats ds = {.reduce_s = win->reduce, .wait_s = win->comm_wait};
    loom_metrics_num(m, "comm_wait_s", win->comm_wait / n);
    loom_metrics_num(m, "reduce_s", win->reduce / n);
    loom_metrics_num(m, "comm_hidden", loom_ddp_hidden_share(&ds));
  } else if (t->pipe) {
    /* a pipeline without ddp: the exchanges outside its schedule (the
     * tied weights', the replicas' sum, zero3's gather) */
    loom_metrics_num(m, "comm_wait_s", win->comm_wait / n);
  }
  loom_metrics_num(m, "optim_s", win->optim / n);
  /* Rank 0's peak resident set so far (what loom estimate predicts, plus
   * code, libraries and data). */
  loom_metrics_num(m, "peak_rss_mb", loom_train_peak_rss() / (1024.0 * 1024.0));
  /* Rank 0's parameters, gradients and optimizer state in memory between
   * steps (the ZeRO formulas), and the most seen within a step. */
  const double mib = 1024.0 * 1024.0;
  loom_metrics_num(m, "mem_params_mb", (double)mem->params / mib);
  loom_metrics_num(m, "mem_grads_mb", (double)mem->grads / mib);
  loom_metrics_num(m, "mem_optim_mb", (double)mem->optim / mib);
  loom_metrics_num(m, "mem_params_peak_mb", (double)mem->params_peak / mib);
  loom_metrics_num(m, "mem_grads_peak_mb", (double)mem->grads_peak / mib);
  loom_metrics_num(m, "mem_act_mb", (double)mem->act / mib);
  loom_metrics_num(m, "mem_comm_mb", (double)mem->comm / mib);
  loom_metrics_num(m, "mem_data_mb", (double)mem->data / mib);
  loom_metrics_num(m, "mem_comm_peak_mb", (double)mem->comm_peak / mib);
  loom_metrics_num(m, "mem_data_peak_mb", (double)mem->data_peak / mib);
  /* Not per step: what the saves since the last line took, whole. */
  if (win->ckpt > 0)
    loom_metrics_num(m, "ckpt_s", win->ckpt);
  if (t->cfg.optim.grad_clip > 0)
    loom_metrics_num(m, "grad_norm", gnorm);
  loom_train_scale_metrics(t, m);
  if (ranks) { /* (nranks, RANK_N): each rank's own parts of a step */
    double *v = loom_calloc((size_t)t->nranks, sizeof *v);
    if (!v)
      return LOOM_ERR_NOMEM;
    static const char *const keys[RANK_N] = {
        "rank_busy_s",    "rank_data_wait_s", "rank_comm_wait_s",
        "rank_pp_step_s", "rank_pp_wait_s",   "rank_tp_wait_s"};
    for (int k = 0; k < RANK_N; k++) {
      if ((k == RANK_PP_STEP || k == RANK_PP_WAIT) && !t->pipe)
        continue;
      if (k == RANK_TP_WAIT && t->tps <= 1)
        continue;
      for (int r = 0; r < t->nranks; r++)
        v[r] = ranks[r * RANK_N + k];
      loom_metrics_nums(m, keys[k], v, t->nranks);
    }
    /* The slowest rank's busy time against the mean: 1 when even. */
    double mx = 0, sum = 0;
    for (int r = 0; r < t->nranks; r++) {
      double b = ranks[r * RANK_N + RANK_BUSY];
      mx = b > mx ? b : mx;
      sum += b;
    }
    loom_metrics_num(m, "busy_skew", sum > 0 ? mx * t->nranks / sum : 1);
    if (t->pipe) {
      /* The bubble: each rank's share of the pipeline's schedule (the
       * longest rank's: the first stage ends last) in which it did not
       * compute: blocked on its neighbours, or done early (a later stage
       * ends its last backward before the earlier ones, the drain), as the
       * theory counts it; averaged over the ranks. */
      double b = 0, span = 0;
      double *busy = loom_calloc((size_t)t->stages, sizeof *busy);
      if (!busy) {
        loom_free(v);
        return LOOM_ERR_NOMEM;
      }
      for (int r = 0; r < t->nranks; r++) {
        double st = ranks[r * RANK_N + RANK_PP_STEP];
        span = st > span ? st : span;
      }
      /* busy: each stage's measured compute (its ranks' schedule time
       * less their waits, summed: every stage has as many ranks) */
      for (int r = 0; r < t->nranks; r++) {
        double br =
            ranks[r * RANK_N + RANK_PP_STEP] - ranks[r * RANK_N + RANK_PP_WAIT];
        v[r] = span > 0 && br < span ? 1 - (br > 0 ? br : 0) / span : 0;
        b += v[r];
        busy[r / t->tps % t->stages] += br;
      }
      loom_metrics_nums(m, "rank_pp_bubble", v, t->nranks);
      loom_metrics_num(m, "pp_bubble", b / t->nranks);
      /* What that compute would give with no delay between stages: the
       * theory for unequal stages. */
      loom_metrics_num(m, "pp_bubble_expected",
                       loom_pipe_bubble_expected(t->stages, t->micro, busy));
      loom_free(busy);
    }
    loom_free(v);
  }
  if (t->tps > 1) {
    /* rank 0's seconds a step blocked on the tensor-parallel reductions
     * (inside forward_s and backward_s), and their MiB a step */
    loom_metrics_int(m, "tp_size", t->tps);
    if (!t->pipe) /* else below */
      loom_metrics_int(m, "dp_replicas", t->replicas);
    loom_metrics_num(m, "tp_wait_s", win->tp_wait / n);
    loom_metrics_num(m, "tp_reduce_mb", win->tp_bytes / n / (1024.0 * 1024.0));
    /* sequence parallelism's all-gathers and reduce-scatters (their whole
     * buffers), and the MiB a rank sent for all of them by the ring
     * algorithms' count: the same with and without it */
    if (t->sp)
      loom_metrics_num(m, "tp_seq_mb",
                       win->tp_seq_bytes / n / (1024.0 * 1024.0));
    loom_metrics_num(m, "tp_sent_mb",
                     win->tp_wire_bytes / n / (1024.0 * 1024.0));
  }
  if (t->pipe) {
    loom_metrics_int(m, "pp_stages", t->stages);
    loom_metrics_int(m, "dp_replicas", t->replicas);
    loom_metrics_int(m, "pp_micro_batches", t->micro);
    loom_metrics_num(m, "pp_bubble_theory",
                     loom_pipe_bubble_theory(t->stages, t->micro));
    loom_metrics_num(m, "pp_wait_s", win->pipe_wait / n);
    /* rank 0 (stage 0): the share of its range's dp sum (chunks) that
     * started during its last backward, since the start */
    loom_pipe_stats ps;
    loom_pipe_get_stats(t->pipe, &ps);
    if (ps.dp_chunks > 0)
      loom_metrics_num(m, "pp_dp_overlap",
                       (double)ps.dp_chunks_early / (double)ps.dp_chunks);
    /* rank 0's MiB a step handed to that sum: its range in the wire type
     * (parallel.compress halves it) */
    if (t->replicas > 1)
      loom_metrics_num(m, "pp_dp_mb", win->pp_dp_bytes / n / (1024.0 * 1024.0));
  }
  return loom_metrics_end(m);
}

/* SIGINT, SIGTERM and SIGHUP (a closed terminal, or loom run passing any of
 * them on) stop every rank at one agreed step, which is saved. */
typedef struct stop_handlers {
  struct sigaction old_int, old_term, old_hup;
  sigset_t old_mask;
} stop_handlers;

static void stop_handlers_install(stop_handlers *h) {
  if (!stop_caught_early) { /* else a stop while loading counts too */
    atomic_store(&stop_requested, 0);
    atomic_store(&stop_signal, 0);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = note_stop;
  sigaction(SIGINT, &sa, &h->old_int);
  sigaction(SIGTERM, &sa, &h->old_term);
  sigaction(SIGHUP, &sa, &h->old_hup);
  /* Without loom_trainer_catch_stop_signals (a program using the library):
   * at least this thread, which runs the kernels, does not take them while
   * it runs (see loom_trainer_catch_stop_signals); the threads started
   * before it (communication, loader) run the handler instead. */
  sigset_t stop_set;
  stop_sigset(&stop_set);
  pthread_sigmask(SIG_BLOCK, &stop_set, &h->old_mask);
}

static void stop_handlers_restore(const stop_handlers *h) {
  /* The mask first: a stop still pending goes to note_stop, not to a
   * default action restored below. */
  pthread_sigmask(SIG_SETMASK, &h->old_mask, NULL);
  sigaction(SIGINT, &h->old_int, NULL);
  sigaction(SIGTERM, &h->old_term, NULL);
  sigaction(SIGHUP, &h->old_hup, NULL);
}

loom_status loom_trainer_run(loom_trainer *t, loom_train_result *res) {
  if (!t)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_trainer_run: trainer is NULL");
  loom_train_result unused; /* res may be NULL: nothing reported */
  if (!res)
    res = &unused;
  memset(res, 0, sizeof *res);
  res->val_loss = NAN;
  res->val_accuracy = NAN;
  res->val_step = -1;
  res->start_step = t->step;
  const loom_config *cfg = &t->cfg;
  double *sums = NULL; /* (S, SUM_N) this step's loss statistics */
  stop_handlers sh;
  stop_handlers_install(&sh);
  loom_status s = open_outputs(t);
  LOOM_TRY_GOTO(s, loom_train_agree(t, s, "opening the run directory"), out);
  loom_dataset_info info;
  loom_dataset_get_info(t->train_ds, &info);
  double units_per_row = t->is_text ? (double)info.T : 1.0;
  /* Every rank's rows: the throughput is the job's. */
  double units_per_step =
      units_per_row * (double)(t->batch * t->accumulate) * (double)t->replicas;
  double t_start = loom_time_now();
  run_window w = {.t0 = t_start};
  int64_t stop_at = t->opts.stop_at;
  sums = loom_calloc((size_t)t->shards * SUM_N, sizeof(double));
  if (!sums) {
    s = LOOM_ERR_NOMEM;
    goto out;
  }
  if (t->ddp)
    loom_ddp_reset_stats(t->ddp);
  loom_runstat_phase(LOOM_RUNSTAT_TRAINING);
  /* eval_every 0: at the end of each epoch (steps_per_epoch >= 1). */
  const int64_t every =
      cfg->train.eval_every > 0 ? cfg->train.eval_every : t->steps_per_epoch;
  bool stopped_first = false;
  LOOM_TRY_GOTO(s, resume_eval(t, res, every, &stopped_first), out);
  if (stopped_first) {
    res->interrupted = true;
    res->stop_signal = agreed_signal(t);
  }

  while (!stopped_first && t->step < t->total_steps) {
    loom_step_times tm = {0};
    int64_t epoch = 0;
    float lr;
    double gnorm, g[SUM_N];
    LOOM_TRY_GOTO(s, train_step(t, sums, g, &tm, &epoch, &lr, &gnorm), out);
    double loss = g[SUM_COUNT] > 0 ? g[SUM_LOSS] / g[SUM_COUNT] : 0;
    double acc = g[SUM_COUNT] > 0 ? g[SUM_CORRECT] / g[SUM_COUNT] : 0;
    t->loss_window_sum += loss;
    t->acc_window_sum += acc;
    t->loss_window_n++;
    window_add(&w, &tm);

    double now = loom_time_now();
    double rate = units_per_step * (double)w.steps / (now - w.t0);
    if (is_rank0(t)) {
      /* The console shows the quantity metrics.jsonl logs: the mean loss
       * of the window (the steps since the last metrics line), so a line
       * printed every log.every steps carries the same number. */
      double wloss = t->loss_window_sum / (double)t->loss_window_n;
      loom_progress_info pi = {t->step, (int)epoch, (float)wloss, lr, rate};
      loom_progress_update(t->progress, &pi);
    }
    bool last = t->step == t->total_steps;
    if (t->step % cfg->log.every == 0 || last) {
      /* Memory by category, for the metrics line and the trace's
       * counters: measured once. */
      loom_train_mem mem = {0};
      if (t->metrics || t->tracing)
        loom_train_mem_get(t, &mem);
      if (t->tracing)
        loom_train_trace_mem(&mem);
      res->train_loss = t->loss_window_sum / (double)t->loss_window_n;
      if (t->rank_log)
        rank_log_window(t, &w, now, res->train_loss);
      /* Every rank's own parts, for the skew between ranks: gathered where
       * any metrics are written (the same on every rank). */
      double mine[RANK_N], *ranks = NULL;
      rank_parts(&w, now, mine);
      if ((cfg->log.metrics || cfg->log.tensorboard ||
           cfg->log.mlflow_uri[0]) &&
          cfg->log.run_dir[0])
        LOOM_TRY_GOTO(s, gather_ranks(t, mine, &ranks), out);
      if (t->metrics)
        s = write_metrics(t, &w, epoch, lr, rate, gnorm, now, res->train_loss,
                          &mem, ranks);
      loom_free(ranks);
      if (s != LOOM_OK)
        goto out;
      t->loss_window_sum = 0;
      t->acc_window_sum = 0;
      t->loss_window_n = 0;
      w = (run_window){.t0 = now};
    }
    /* Injected faults land after the step, before its checkpoint. */
    if (t->n_faults > 0)
      loom_train_fault_after_step(t);
    /* A stop seen by any rank stops all at this same step. */
    bool stop = g[SUM_STOP] > 0 || (stop_at > 0 && t->step >= stop_at);
    /* The checkpoint before the evaluation: the last one covers the whole
     * validation split, and a stop (SLURM's SIGTERM, then SIGKILL after its
     * grace period) that comes while it runs must not cost the run. */
    bool saved = (cfg->checkpoint.enabled && cfg->checkpoint.every > 0 &&
                  t->step % cfg->checkpoint.every == 0) ||
                 last || stop;
    if (saved) {
      double t0 = loom_time_now();
      LOOM_TRY_GOTO(s, loom_train_ckpt_save(t), out);
      double t1 = loom_time_now();
      w.times.ckpt += t1 - t0;
      if (t->tracing)
        loom_trace_span("train", "checkpoint", t0, t1, NULL);
    }
    if (t->step % every == 0 || last) {
      LOOM_TRY_GOTO(s, eval_traced(t, res, last), out);
      /* A stop that came during a periodic evaluation stops the run at
       * this step, as one during the step does (before, it trained one
       * more step first): agreed over the world, since a rank's share may
       * have ended before the signal reached it. */
      if (!last && !stop) {
        LOOM_TRY_GOTO(s, agree_stop(t, &stop), out);
        if (stop && !saved) {
          double t1 = loom_time_now();
          LOOM_TRY_GOTO(s, loom_train_ckpt_save(t), out);
          if (t->tracing)
            loom_trace_span("train", "checkpoint", t1, loom_time_now(), NULL);
        }
      }
    }
    if (stop && !last) {
      res->interrupted = true;
      res->stop_signal = agreed_signal(t);
      break;
    }
  }
  /* zero3 with a pipeline: the stage's parameters whole at the end */
  LOOM_TRY_GOTO(s, loom_train_pipe_whole(t), out);
  LOOM_TRY_GOTO(s, loom_train_ckpt_final(t), out);
  res->saved = t->cfg.checkpoint.enabled && t->cfg.checkpoint.dir[0] &&
               t->ckpt_last_step == t->step && !t->ckpt_last_failed;
  loom_runstat_phase(LOOM_RUNSTAT_DONE);
  res->steps = t->step;
  res->seconds = loom_time_now() - t_start;
  res->throughput =
      res->seconds > 0
          ? units_per_step * (double)(t->step - res->start_step) / res->seconds
          : 0;
  /* The report and the artifacts; a run stopped early is KILLED (a
   * restart goes on with it). */
  loom_train_mlflow_finish(t, t->step == t->total_steps);
out:
  loom_free(sums);
  stop_handlers_restore(&sh);
  loom_progress_free(t->progress);
  t->progress = NULL;
  return s;
}
