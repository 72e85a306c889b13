/* The trainer's checkpoints: what state is saved, and resuming from it so a
 * run continues bitwise as if never stopped. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/ckpt.h"
#include "loom/run.h"
#include "trainer.h"

static int g_rank = 0, g_world = 1;

int loom_train_rank(void) { return g_rank; }
int loom_train_world(void) { return g_world; }
void loom_train_set_world(int rank, int world) {
  g_rank = rank;
  g_world = world;
}

/* Buffer names in the checkpoint: "params" and "optim.<state name>". */
static void state_buffer_name(char *buf, size_t n, const char *state) {
  snprintf(buf, n, "optim.%s", state);
}

static const char *sched_name(const loom_trainer *t) {
  return loom_sched_kind_name(t->cfg.schedule.name);
}

/* Calls fn(path, value, default, ctx) for every key of the config hash
 * (LOOM_CFG_LOCAL unset), its value in cfg and its default as canonical
 * text, until fn returns false; false then. */
typedef bool (*hashed_key_fn)(const char *path, const char *value,
                              const char *dflt, void *ctx);
static bool each_hashed_key(const loom_config *cfg, hashed_key_fn fn,
                            void *ctx) {
  loom_config def;
  loom_config_defaults(&def);
  size_t nk;
  const loom_config_key *keys = loom_config_keys(&nk);
  for (size_t i = 0; i < nk; i++) {
    char v[LOOM_CONFIG_STR_MAX * 4 + 8], d[sizeof v];
    if ((keys[i].flags & LOOM_CFG_LOCAL) ||
        loom_config_format(cfg, &keys[i], v, sizeof v) != LOOM_OK ||
        loom_config_format(&def, &keys[i], d, sizeof d) != LOOM_OK)
      continue;
    if (!fn(keys[i].path, v, d, ctx))
      return false;
  }
  return true;
}

static bool add_if_changed(const char *path, const char *value,
                           const char *dflt, void *ctx) {
  return strcmp(value, dflt) == 0 ||
         cJSON_AddStringToObject(ctx, path, value) != NULL;
}

/* extra.config: {"key": "value"} for every key of the config hash whose
 * value is not its default (a few hundred bytes for a usual config). */
static bool add_config(cJSON *x, const loom_config *cfg) {
  cJSON *o = cJSON_AddObjectToObject(x, "config");
  return o && each_hashed_key(cfg, add_if_changed, o);
}

static loom_status fill_meta(loom_trainer *t, loom_ckpt_meta *meta) {
  *meta = loom_ckpt_meta_default();
  snprintf(meta->strategy, sizeof meta->strategy, "%s",
           loom_ckpt_strategy_name(t->zero == 1   ? LOOM_CKPT_STRATEGY_ZERO1
                                   : t->zero == 2 ? LOOM_CKPT_STRATEGY_ZERO2
                                   : t->zero == 3 ? LOOM_CKPT_STRATEGY_ZERO3
                                   : t->pipe      ? LOOM_CKPT_STRATEGY_PIPELINE
                                   : t->tp_map    ? LOOM_CKPT_STRATEGY_TENSOR
                                   : t->ddp       ? LOOM_CKPT_STRATEGY_DDP
                                                  : LOOM_CKPT_STRATEGY_NONE));
  meta->config_hash = loom_config_hash(&t->cfg);
  /* the whole model's layout, whatever the mesh */
  const loom_model *layout = t->whole ? t->whole : t->model;
  meta->n_views = loom_model_num_views(layout);
  meta->views = loom_model_view(layout, 0);
  snprintf(meta->optimizer, sizeof meta->optimizer, "%s",
           loom_optim_kind_name(t->cfg.optim.name));
  meta->optimizer_step = loom_optim_get_step(t->optim);
  snprintf(meta->schedule, sizeof meta->schedule, "%s", sched_name(t));
  meta->schedule_step = t->step;
  meta->lr = t->step > 0 ? loom_sched_lr(&t->sched, t->step - 1) : 0;
  loom_loader_state ls;
  loom_loader_get_state(t->train_loader, &ls);
  meta->data.epoch = ls.epoch;
  meta->data.batch = ls.batch;
  meta->data.sample = loom_loader_sample(t->train_loader);
  loom_train_scale_meta(t, meta);
  {
    /* extra.job: whose checkpoint this is (a restart of the job goes on
     * from it, never from another run's in the same directory);
     * extra.loss_window: the steps since the last metrics line (loss sum,
     * accuracy sum, count), so that a run resumed between two lines logs
     * the next one as the uninterrupted run does; extra.data: the samples
     * of the training and validation splits (the config hash leaves
     * data.path out, so that moved data resumes: a resume on other data
     * is told by its size); extra.config: the hashed keys that differ from
     * their defaults, so that a resume with another config names what
     * changed */
    cJSON *x = cJSON_Parse(meta->extra_json ? meta->extra_json : "{}");
    bool ok = x != NULL;
    if (ok) {
      cJSON *d = cJSON_AddObjectToObject(x, "data");
      ok = d &&
           cJSON_AddNumberToObject(d, "train_samples",
                                   (double)loom_dataset_len(t->train_ds)) &&
           cJSON_AddNumberToObject(d, "val_samples",
                                   (double)loom_dataset_len(t->val_ds));
    }
    if (ok)
      ok = add_config(x, &t->cfg);
    if (ok && t->job[0])
      ok = cJSON_AddStringToObject(x, "job", t->job) != NULL;
    if (ok && t->loss_window_n > 0) {
      cJSON *a = cJSON_AddArrayToObject(x, "loss_window");
      ok =
          a &&
          cJSON_AddItemToArray(a, cJSON_CreateNumber(t->loss_window_sum)) &&
          cJSON_AddItemToArray(a, cJSON_CreateNumber(t->acc_window_sum)) &&
          cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t->loss_window_n));
    }
    ok = ok && cJSON_PrintPreallocated(x, t->ckpt_extra,
                                       (int)sizeof t->ckpt_extra, false);
    cJSON_Delete(x);
    if (!ok)
      return loom_error(LOOM_ERR_NOMEM, "checkpoint meta: recording job %s",
                        t->job);
    meta->extra_json = t->ckpt_extra;
  }
  return LOOM_OK;
}

/* The loss window a checkpoint recorded (extra.loss_window), if whole:
 * the sums of the steps after the last metrics line before it. */
static void restore_loss_window(loom_trainer *t, const loom_ckpt_meta *meta,
                                const cJSON *x) {
  t->loss_window_sum = 0;
  t->acc_window_sum = 0;
  t->loss_window_n = 0;
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(x, "loss_window");
  const cJSON *l = cJSON_GetArrayItem(a, 0), *c = cJSON_GetArrayItem(a, 1),
              *n = cJSON_GetArrayItem(a, 2);
  if (cJSON_GetArraySize(a) == 3 && cJSON_IsNumber(l) && cJSON_IsNumber(c) &&
      cJSON_IsNumber(n) && isfinite(l->valuedouble) &&
      isfinite(c->valuedouble) && n->valuedouble >= 1 &&
      n->valuedouble <= (double)meta->step &&
      n->valuedouble == floor(n->valuedouble)) {
    t->loss_window_sum = l->valuedouble;
    t->acc_window_sum = c->valuedouble;
    t->loss_window_n = (int64_t)n->valuedouble;
  }
}

/* A resume on data of another size than the checkpoint's (extra.data):
 * said, not refused (fine-tuning on new data is a use), since the saved
 * position then falls on other samples. Older checkpoints have no
 * extra.data and say nothing. */
static void warn_other_data(const loom_trainer *t, const loom_ckpt *c,
                            const cJSON *x) {
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(x, "data");
  const cJSON *tr = cJSON_GetObjectItemCaseSensitive(d, "train_samples");
  const cJSON *va = cJSON_GetObjectItemCaseSensitive(d, "val_samples");
  int64_t ntr = loom_dataset_len(t->train_ds),
          nva = loom_dataset_len(t->val_ds);
  if (cJSON_IsNumber(tr) && cJSON_IsNumber(va) &&
      (tr->valuedouble != (double)ntr || va->valuedouble != (double)nva))
    LOOM_WARN("%s was saved training on other data: %.0f training and %.0f "
              "validation samples, where this run's data (data.path '%s') "
              "has %lld and %lld; resuming at its position (epoch %lld, "
              "sample %lld) in this data",
              loom_ckpt_path(c), tr->valuedouble, va->valuedouble,
              t->cfg.data.path, (long long)ntr, (long long)nva,
              (long long)loom_ckpt_get_meta(c)->data.epoch,
              (long long)loom_ckpt_get_meta(c)->data.sample);
}

/* The keys that differ from a checkpoint's extra.config (a key it does not
 * list held its default), up to 6 written out. */
typedef struct config_diff {
  const cJSON *saved;
  char text[1024];
  size_t used;
  int n;
} config_diff;

static bool note_if_other(const char *path, const char *value, const char *dflt,
                          void *ctx) {
  config_diff *d = ctx;
  const char *was =
      cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d->saved, path));
  if (!was)
    was = dflt;
  if (strcmp(was, value) != 0 && ++d->n <= 6 && d->used < sizeof d->text)
    d->used += (size_t)snprintf(d->text + d->used, sizeof d->text - d->used,
                                "%s%s %s, now %s", d->n > 1 ? "; " : "", path,
                                was, value);
  return true;
}

/* A resume with a config of another hash: names the keys that differ from
 * the checkpoint's (extra.config; up to 6, then how many more). An older
 * checkpoint without extra.config is told without them. */
static void warn_other_config(const loom_trainer *t, const loom_ckpt *c,
                              const cJSON *x) {
  config_diff d = {cJSON_GetObjectItemCaseSensitive(x, "config"), "", 0, 0};
  if (cJSON_IsObject(d.saved))
    (void)each_hashed_key(&t->cfg, note_if_other, &d);
  if (d.n > 6 && d.used < sizeof d.text)
    snprintf(d.text + d.used, sizeof d.text - d.used, "; and %d more", d.n - 6);
  if (d.n > 0)
    LOOM_WARN("%s was saved with a different config (%s); resuming with the "
              "current one",
              loom_ckpt_path(c), d.text);
  else
    LOOM_WARN("%s was saved with a different config; resuming with the "
              "current one",
              loom_ckpt_path(c));
}

/* After every rank's write (st): all agree, rank 0 commits (or removes the
 * temporary directory), and every rank learns rank 0's outcome. */
static loom_status conclude(loom_trainer *t, loom_ckpt_writer *w,
                            loom_status st) {
  st = loom_train_agree(t, st, "writing the checkpoint");
  if (t->rank == 0 && w) {
    if (st == LOOM_OK)
      st = loom_ckpt_writer_commit(w);
    else
      loom_ckpt_writer_abort(w);
  }
  if (t->nranks > 1)
    st = loom_train_agree(t, st, "committing the checkpoint");
  loom_ckpt_writer_free(w);
  return st;
}

/* checkpoint.on_error: stop, or warn and go on (the same on every rank:
 * they all have the same outcome). */
static loom_status outcome(loom_trainer *t, loom_status st, int64_t step) {
  t->ckpt_last_step = step;
  t->ckpt_last_failed = st != LOOM_OK;
  if (st == LOOM_OK)
    return LOOM_OK;
  snprintf(t->ckpt_last_error, sizeof t->ckpt_last_error, "%s",
           loom_last_error());
  if (t->cfg.checkpoint.on_error == LOOM_CFG_ON_ERROR_CONTINUE) {
    if (t->rank == 0)
      LOOM_WARN("checkpoint of step %lld not saved, training goes on: %s",
                (long long)step, loom_last_error());
    return LOOM_OK;
  }
  return loom_error_context(st, "saving the checkpoint of step %lld",
                            (long long)step);
}

/* A save of `step` concluded with st on every rank. */
static loom_status saved(loom_trainer *t, loom_status st, int64_t step) {
  if (st == LOOM_OK && t->n_faults > 0)
    loom_train_fault_after_save(t, step);
  return outcome(t, st, step);
}

/* ------------------------------------------------------- async saves
 *
 * Multi-rank: at save k every rank copies its share and writes it on a
 * thread. Each step, every rank adds to the step's sums whether its write
 * has finished (and failed); the step at which all have, every rank knows
 * it at once: on success rank 0 commits on a thread of its own, whose end
 * the sums announce in turn. So in the usual case a save costs the training
 * thread the copy alone. What is still open at the next save (or at the
 * end) is concluded there with collectives, the commit before the next
 * write starts, so the two never compete for the disk. */

/* A background job's outcome (this rank's write, rank 0's commit); waits
 * for its thread the first time. */
static loom_status bg_status(loom_ckpt_bg *bg) {
  if (!bg->done) {
    loom_status st = bg->status;
    if (st == LOOM_OK && bg->w)
      st = loom_ckpt_writer_wait(bg->w);
    if (st != LOOM_OK)
      snprintf(bg->msg, sizeof bg->msg, "%s", loom_last_error());
    bg->status = st;
    bg->done = true;
  }
  if (bg->status != LOOM_OK)
    return loom_error(bg->status, "%s", bg->msg);
  return LOOM_OK;
}

static bool thread_done(loom_ckpt_writer *w) {
  bool done = true;
  if (w)
    loom_ckpt_writer_test(w, &done);
  return done;
}

/* Every rank, with the same st: the commit of commit.step is over. */
static loom_status conclude_commit(loom_trainer *t, loom_status st) {
  loom_ckpt_writer_free(t->commit.w);
  t->commit.w = NULL;
  t->commit.active = false;
  return saved(t, st, t->commit.step);
}

/* Every rank, with the same st: every write of save.step is over. On
 * success rank 0 starts the commit. */
static loom_status conclude_write(loom_trainer *t, loom_status st) {
  loom_ckpt_writer *w = t->save.w;
  int64_t step = t->save.step;
  t->save.w = NULL;
  t->save.active = false;
  t->save.done = false;
  if (st != LOOM_OK) {
    if (t->rank == 0 && w)
      loom_ckpt_writer_abort(w);
    loom_ckpt_writer_free(w);
    return outcome(t, st, step);
  }
  t->commit.status = LOOM_OK;
  t->commit.done = false;
  if (t->rank == 0 && loom_ckpt_writer_commit_start(w) != LOOM_OK) {
    t->commit.status = loom_ckpt_writer_commit(w); /* no thread: here */
    if (t->commit.status != LOOM_OK)
      snprintf(t->commit.msg, sizeof t->commit.msg, "%s", loom_last_error());
    t->commit.done = true;
  }
  if (t->rank != 0) {
    loom_ckpt_writer_free(w);
    w = NULL;
  }
  t->commit.w = w;
  t->commit.step = step;
  t->commit.active = true;
  return LOOM_OK;
}

/* Concludes an open commit now: rank 0 waits for it; all agree. */
static loom_status finish_commit(loom_trainer *t) {
  if (!t->commit.active)
    return LOOM_OK;
  loom_status st = t->rank == 0 ? bg_status(&t->commit) : LOOM_OK;
  return conclude_commit(t,
                         loom_train_agree(t, st, "committing the checkpoint"));
}

/* Concludes an open async save now: on one rank the writer's thread
 * commits; on several, every rank waits for its write, they agree, and
 * rank 0 commits (waited for by the finish_commit that follows). */
static loom_status finish_pending(loom_trainer *t) {
  if (!t->save.active)
    return LOOM_OK;
  if (t->nranks == 1) {
    loom_status st = bg_status(&t->save);
    int64_t step = t->save.step;
    loom_ckpt_writer_free(t->save.w);
    t->save.w = NULL;
    t->save.active = false;
    t->save.done = false;
    return saved(t, st, step);
  }
  return conclude_write(
      t, loom_train_agree(t, bg_status(&t->save), "writing the checkpoint"));
}

void loom_train_ckpt_flags(loom_trainer *t, double *sums) {
  if (t->nranks == 1)
    return;
  if (t->save.active &&
      (t->save.done || t->save.status != LOOM_OK || thread_done(t->save.w))) {
    sums[SUM_WRITTEN] = 1;
    sums[SUM_WRITE_FAILED] = bg_status(&t->save) != LOOM_OK;
  }
  if (t->rank == 0 && t->commit.active &&
      (t->commit.done || thread_done(t->commit.w)))
    sums[SUM_COMMITTED] = bg_status(&t->commit) == LOOM_OK ? 1 : 2;
}

loom_status loom_train_ckpt_poll(loom_trainer *t, const double *g) {
  if (t->nranks == 1)
    return LOOM_OK;
  /* The commit first: one started below was not in these sums. */
  if (t->commit.active && g[SUM_COMMITTED] != 0) {
    loom_status st = LOOM_OK;
    if (g[SUM_COMMITTED] != 1)
      st = t->rank == 0
               ? bg_status(&t->commit)
               : loom_error(LOOM_ERR_REMOTE,
                            "committing the checkpoint failed on rank 0; its "
                            "message says why");
    LOOM_TRY(conclude_commit(t, st));
  }
  if (t->save.active && g[SUM_WRITTEN] == (double)t->nranks) {
    loom_status st = LOOM_OK;
    if (g[SUM_WRITE_FAILED] > 0) {
      st = bg_status(&t->save);
      if (st == LOOM_OK)
        st = loom_error(LOOM_ERR_REMOTE,
                        "writing the checkpoint failed on %.0f rank(s); "
                        "their messages say why",
                        g[SUM_WRITE_FAILED]);
    }
    LOOM_TRY(conclude_write(t, st));
  }
  return LOOM_OK;
}

static void my_slice(const loom_trainer *t, int64_t *lo, int64_t *hi) {
  loom_train_slice(t, t->rank, lo, hi);
}

loom_status loom_train_ckpt_prepare(loom_trainer *t) {
  const loom_config_checkpoint *cc = &t->cfg.checkpoint;
  /* Tensor parallelism puts the slice together here, async or not. */
  if (!cc->enabled || !cc->dir[0] || (!cc->async && !t->tp_map) || t->snap)
    return LOOM_OK;
  int64_t lo, hi;
  my_slice(t, &lo, &hi);
  int64_t n = (hi - lo) * (1 + loom_optim_state_count(t->optim));
  /* zero1/2 with tensor parallelism: and room for one optimizer state of
   * the stepped range, gathered from the replicas' cuts (tp_state; zero3
   * makes it for the save only: it would hold as much as the parameters
   * it shards) */
  if (t->tp_map && t->zero && !t->z3) {
    int64_t a, b;
    loom_train_tp_stepped(t, &a, &b);
    n += b - a;
  }
  t->snap = loom_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!t->snap)
    return loom_error_context(LOOM_ERR_NOMEM,
                              "checkpoint.async: a copy of the state");
  /* Fault the pages in now, not at the first save. */
  memset(t->snap, 0, (size_t)n * sizeof(float));
  t->snap_n = n;
  return LOOM_OK;
}

/* What a save hands the writer: the live buffer, or with async saves its
 * copy in the snapshot at `*off` (the write thread reads it until the save
 * is concluded, which comes before the next save overwrites it). */
static const float *stage(loom_trainer *t, const float *src, int64_t count,
                          int64_t *off);

/* Tensor parallelism: the slice of a buffer in the rank's layout, put
 * together from the tp group in the snapshot at `*off` (NULL on failure,
 * with the message recorded). Collective over the tp group. */
static const float *tp_stage(loom_trainer *t, const float *local, int64_t base,
                             int64_t count, int64_t *off) {
  float *dst = t->snap + *off;
  if (loom_train_tp_slice(t, local, base, dst) != LOOM_OK)
    return NULL;
  *off += count;
  return dst;
}

/* A buffer of the replica's cut (an optimizer state; zero3's parameters)
 * through tp_stage: the replicas' cuts first gathered into range, room
 * for the stepped range (collective over the dp group, then the tp
 * group). */
static const float *tp_cut_stage(loom_trainer *t, const float *cut,
                                 float *range, int64_t count, int64_t *off) {
  int64_t a, b;
  loom_train_tp_stepped(t, &a, &b);
  if (loom_train_tp_gather_cuts(t, cut, range) != LOOM_OK)
    return NULL;
  return tp_stage(t, range, a, count, off);
}

static const float *stage(loom_trainer *t, const float *src, int64_t count,
                          int64_t *off) {
  /* No snapshot without async saves (with them, the save fails earlier
   * when it could not be allocated). */
  if (!t->cfg.checkpoint.async || !t->snap)
    return src;
  float *dst = t->snap + *off;
  memcpy(dst, src, (size_t)count * sizeof(float));
  *off += count;
  return dst;
}

loom_status loom_train_ckpt_save(loom_trainer *t) {
  const loom_config_checkpoint *cc = &t->cfg.checkpoint;
  if (!cc->enabled || !cc->dir[0])
    return LOOM_OK;
  /* The previous async save must be complete before the next starts. */
  LOOM_TRY(loom_train_ckpt_finish(t));
  loom_runstat_beat(); /* waiting for it was not a hang */
  double t0 = loom_time_now();
  loom_ckpt_writer_opts wo = loom_ckpt_writer_opts_default();
  wo.rank = t->rank;
  wo.world = t->nranks;
  wo.keep = (int)cc->keep;
  loom_ckpt_writer *w = NULL;
  loom_ckpt_meta meta;
  int64_t n = loom_model_num_params(t->whole ? t->whole : t->model);
  int64_t lo, hi, off = 0;
  my_slice(t, &lo, &hi);
  loom_status s;
  /* zero3 with a pipeline keeps the slice; with tensor parallelism the
   * slice is put together from the rank's whole part (below) */
  if (t->tp_map)
    LOOM_TRY_GOTO(s, loom_train_pipe_whole(t), done);
  if ((cc->async || t->tp_map) && !t->snap)
    LOOM_TRY_GOTO(s, loom_train_ckpt_prepare(t), done);
  /* Tensor parallelism: the slice is put together from the group's ranks
   * (collective: every rank of the group gets here, even when the writer
   * could not start; a failure is concluded with the others' below). */
  const float *data = NULL;
  if (t->tp_map) {
    /* zero1-3: the room the replicas' cuts are gathered into (zero3's for
     * this save only; every rank makes it, or agrees it could not) */
    float *range = NULL;
    int64_t a, b;
    loom_train_tp_stepped(t, &a, &b);
    if (t->z3) {
      range = loom_malloc((size_t)(b > a ? b - a : 1) * sizeof(float));
      s = loom_train_agree(t, range ? LOOM_OK : LOOM_ERR_NOMEM,
                           "checkpoint: room for the replicas' cuts");
      if (s != LOOM_OK) {
        loom_free(range);
        goto done;
      }
    } else if (t->zero) {
      range = t->snap + (t->snap_n - (b - a));
    }
    float *params = loom_model_params(t->model);
    int64_t clo, chi;
    loom_train_tp_cut(t, t->replica, &clo, &chi);
    data = t->z3 ? tp_cut_stage(t, params + clo, range, hi - lo, &off)
                 : tp_stage(t, params, 0, hi - lo, &off);
    s = data ? LOOM_OK : LOOM_ERR_INTERNAL;
    for (int i = 0; i < loom_optim_state_count(t->optim) && s == LOOM_OK; i++) {
      loom_optim_state st;
      s = loom_optim_state_get(t->optim, i, &st);
      if (s == LOOM_OK &&
          !(t->zero ? tp_cut_stage(t, st.data, range, hi - lo, &off)
                    : tp_stage(t, st.data, st.begin, hi - lo, &off)))
        s = LOOM_ERR_INTERNAL;
    }
    if (t->z3)
      loom_free(range);
    if (s != LOOM_OK)
      goto done;
    off = 0;
  }
  LOOM_TRY_GOTO(s, loom_ckpt_writer_new(&w, cc->dir, t->step, &wo), done);
  LOOM_TRY_GOTO(s,
                loom_ckpt_writer_add(
                    w, "params", LOOM_F32, n, lo, hi,
                    t->tp_map ? data
                              : stage(t, loom_model_params(t->model) + lo,
                                      hi - lo, &off)),
                done);
  for (int i = 0; i < loom_optim_state_count(t->optim); i++) {
    loom_optim_state st;
    char name[LOOM_CKPT_NAME_MAX];
    LOOM_TRY_GOTO(s, loom_optim_state_get(t->optim, i, &st), done);
    state_buffer_name(name, sizeof name, st.name);
    const float *sd = t->tp_map
                          ? data + (int64_t)(i + 1) * (hi - lo)
                          : stage(t, st.data + (lo - st.begin), hi - lo, &off);
    LOOM_TRY_GOTO(s, loom_ckpt_writer_add(w, name, LOOM_F32, n, lo, hi, sd),
                  done);
  }
  LOOM_TRY_GOTO(s, fill_meta(t, &meta), done);
  LOOM_TRY_GOTO(s, loom_ckpt_writer_set_meta(w, &meta), done);
  if (cc->async) {
    s = loom_ckpt_writer_start(w, t->nranks == 1);
    goto done;
  }
  s = loom_ckpt_writer_write(w);
done:
  if (cc->async) {
    /* Concluded later on every rank, even when this one failed already
     * (the others must not wait for it alone). */
    t->ckpt_seconds += loom_time_now() - t0;
    t->save.w = w;
    t->save.status = s;
    if (s != LOOM_OK)
      snprintf(t->save.msg, sizeof t->save.msg, "%s", loom_last_error());
    t->save.done = false;
    t->save.step = t->step;
    t->save.active = true;
    return LOOM_OK;
  }
  s = saved(t, conclude(t, w, s), t->step);
  t->ckpt_seconds += loom_time_now() - t0;
  return s;
}

loom_status loom_train_ckpt_finish(loom_trainer *t) {
  LOOM_TRY(finish_commit(t));
  LOOM_TRY(finish_pending(t));
  return finish_commit(t);
}

loom_status loom_train_ckpt_final(loom_trainer *t) {
  LOOM_TRY(loom_train_ckpt_finish(t));
  const loom_config_checkpoint *cc = &t->cfg.checkpoint;
  if (!cc->enabled || !cc->dir[0] || !t->ckpt_last_failed ||
      t->ckpt_last_step != t->step)
    return LOOM_OK;
  /* checkpoint.on_error: continue lets training go on past a failed save;
   * past the end there is nothing to go on to, and the state is lost. */
  return loom_error(LOOM_ERR_IO,
                    "the final checkpoint (step %lld) was not saved, so the "
                    "trained state is lost: %s",
                    (long long)t->step, t->ckpt_last_error);
}

/* zero1 with tensor parallelism: the state of the replica's cut, read
 * through a scratch buffer of the stepped range. */
static loom_status tp_read_cut(loom_trainer *t, const loom_ckpt *c,
                               const char *name, const loom_optim_state *st) {
  int64_t a, b;
  loom_train_tp_stepped(t, &a, &b);
  float *range = loom_malloc((size_t)(b > a ? b - a : 1) * sizeof(float));
  if (!range)
    return loom_error_context(LOOM_ERR_NOMEM, "reading %s", name);
  loom_status s = loom_train_tp_read_cut(t, c, name, range, st->data);
  loom_free(range);
  return s;
}

static loom_status restore(loom_trainer *t, const loom_ckpt *c) {
  const loom_ckpt_meta *meta = loom_ckpt_get_meta(c);
  int64_t n = loom_model_num_params(t->whole ? t->whole : t->model);
  loom_ckpt_buffer_info bi;
  LOOM_TRY(loom_ckpt_buffer_find(c, "params", &bi));
  if (bi.count != n || bi.dtype != LOOM_F32)
    return loom_error(LOOM_ERR_MISMATCH,
                      "%s: params hold %lld %s values, the model has %lld "
                      "f32",
                      loom_ckpt_path(c), (long long)bi.count,
                      loom_dtype_name(bi.dtype), (long long)n);
  if (t->tp_map && t->z3) { /* the replica's cut of this rank's part */
    LOOM_TRY(loom_train_tp_fill_cut(t, c));
  } else if (t->tp_map) { /* this rank's part of the whole model */
    LOOM_TRY(
        loom_train_tp_read(t, c, "params", loom_model_params(t->model), 0, -1));
  } else if (t->z3) { /* this rank's slice only: the rest is never resident */
    int64_t lo, hi;
    loom_train_slice(t, t->rank, &lo, &hi);
    LOOM_TRY(loom_ckpt_read_range(c, "params", lo, hi,
                                  loom_model_params(t->model) + lo));
  } else if (t->pipe) { /* what the stage reads: its own and borrowed */
    int nr;
    const loom_range *r = loom_pipe_ranges(t->pipe, &nr);
    for (int k = 0; k < nr; k++)
      LOOM_TRY(loom_ckpt_read_range(c, "params", r[k].offset,
                                    r[k].offset + r[k].numel,
                                    loom_model_params(t->model) + r[k].offset));
  } else {
    LOOM_TRY(
        loom_ckpt_read_range(c, "params", 0, n, loom_model_params(t->model)));
  }
  if (strcmp(meta->optimizer, loom_optim_kind_name(t->cfg.optim.name)) != 0)
    return loom_error(LOOM_ERR_MISMATCH,
                      "%s: saved with optimizer '%s', the config says '%s'",
                      loom_ckpt_path(c), meta->optimizer,
                      loom_optim_kind_name(t->cfg.optim.name));
  for (int i = 0; i < loom_optim_state_count(t->optim); i++) {
    loom_optim_state st;
    char name[LOOM_CKPT_NAME_MAX];
    LOOM_TRY(loom_optim_state_get(t->optim, i, &st));
    state_buffer_name(name, sizeof name, st.name);
    if (t->tp_map && t->zero)
      LOOM_TRY(tp_read_cut(t, c, name, &st));
    else if (t->tp_map)
      LOOM_TRY(loom_train_tp_read(t, c, name, st.data, st.begin, st.count));
    else
      LOOM_TRY(loom_ckpt_read_range(c, name, st.begin, st.begin + st.count,
                                    st.data));
  }
  LOOM_TRY(loom_optim_set_step(t->optim, meta->optimizer_step));
  loom_train_scale_restore(t, meta);
  t->step = meta->step;
  /* The data position in samples: exact at any world size. */
  LOOM_TRY(
      loom_loader_seek(t->train_loader, meta->data.epoch, meta->data.sample));
  cJSON *extra = meta->extra_json ? cJSON_Parse(meta->extra_json) : NULL;
  restore_loss_window(t, meta, extra);
  if (meta->config_hash != loom_config_hash(&t->cfg) && t->rank == 0)
    warn_other_config(t, c, extra);
  if (t->rank == 0)
    warn_other_data(t, c, extra);
  cJSON_Delete(extra);
  return LOOM_OK;
}

loom_status loom_train_job_init(loom_trainer *t) {
  t->job[0] = '\0';
  t->restart = 0;
  const char *rc = getenv("LOOM_RESTART_COUNT");
  if (rc && *rc) {
    char *end;
    long v = strtol(rc, &end, 10);
    t->restart = *end == '\0' && v > 0 ? v : 0;
  }
  const char *job = getenv("LOOM_RUN_JOB");
  if (!job || !*job)
    return LOOM_OK;
  size_t n = strlen(job);
  bool ok = n <= LOOM_TRAIN_JOB_MAX;
  for (size_t i = 0; ok && i < n; i++) {
    char c = job[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  }
  if (!ok)
    return loom_error(LOOM_ERR_CONFIG,
                      "LOOM_RUN_JOB: '%.80s%s': a job id is 1 to %d letters, "
                      "digits, '.', '_' or '-' (loom run sets it; unset it "
                      "otherwise)",
                      job, n > 80 ? "..." : "", LOOM_TRAIN_JOB_MAX);
  memcpy(t->job, job, n + 1);
  return LOOM_OK;
}

bool loom_train_job_restart(const loom_trainer *t) {
  return t->restart > 0 && t->job[0] && t->cfg.checkpoint.dir[0] &&
         strcmp(t->opts.resume, "auto") != 0;
}

/* Whether the manifest of the checkpoint in dir records job `job` (read at
 * LOOM_CKPT_VERIFY_NONE: the manifest alone, self-checked). */
static bool written_by_job(const char *dir, const char *job) {
  loom_ckpt_open_opts o = loom_ckpt_open_opts_default();
  o.verify = LOOM_CKPT_VERIFY_NONE;
  loom_ckpt *c = NULL;
  if (loom_ckpt_open(&c, dir, &o) != LOOM_OK || !c)
    return false; /* unreadable: whose it is cannot be told */
  const char *extra = loom_ckpt_get_meta(c)->extra_json;
  cJSON *x = extra ? cJSON_Parse(extra) : NULL;
  const char *j =
      cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "job"));
  bool mine = j && strcmp(j, job) == 0;
  cJSON_Delete(x);
  loom_ckpt_close(c);
  return mine;
}

/* Rank 0: the newest valid checkpoint under root that job `job` wrote
 * (*step = -1 when none); each of the job's passed over is named with why.
 * Checkpoints of other runs in the same directory are never taken, however
 * new. */
static loom_status find_job_ckpt(const char *root, const char *job,
                                 const loom_ckpt_open_opts *oo, int64_t *step) {
  *step = -1;
  int64_t *steps = NULL;
  int n = 0;
  LOOM_TRY(loom_ckpt_list(root, &steps, &n));
  loom_status s = LOOM_OK;
  for (int i = n - 1; i >= 0 && *step < 0; i--) {
    char dir[LOOM_CONFIG_STR_MAX + 64];
    s = loom_ckpt_dir_name(root, steps[i], dir, sizeof dir);
    if (s != LOOM_OK)
      break;
    if (!written_by_job(dir, job))
      continue;
    loom_ckpt *c = NULL;
    s = loom_ckpt_open(&c, dir, oo);
    if (s == LOOM_OK && c && loom_ckpt_get_meta(c)->step == steps[i]) {
      *step = steps[i];
    } else if (s == LOOM_ERR_NOMEM) {
      loom_ckpt_close(c);
      break;
    } else {
      LOOM_WARN("checkpoint %s of this job is not usable, passing over it: "
                "%s",
                dir,
                s == LOOM_OK ? "its manifest names another step"
                             : loom_last_error());
    }
    s = LOOM_OK;
    loom_ckpt_close(c);
  }
  loom_free(steps);
  return s;
}

/* A restart of a loom run job (LOOM_RESTART_COUNT > 0, LOOM_RUN_JOB set)
 * with --resume never or DIR: the newest valid checkpoint this job wrote
 * in an earlier attempt, so its progress is kept (and a DIR pruned since
 * by checkpoint.keep is not needed). *c = NULL when it wrote none: the
 * attempt then starts as the first did. */
static loom_status
open_job_resume(loom_trainer *t, const loom_ckpt_open_opts *oo, loom_ckpt **c) {
  *c = NULL;
  const char *root = t->cfg.checkpoint.dir;
  int64_t step = -1;
  loom_status s = LOOM_OK;
  if (t->rank == 0)
    s = find_job_ckpt(root, t->job, oo, &step);
  s = loom_train_agree(t, s, "finding this job's latest checkpoint");
  if (s != LOOM_OK)
    return loom_error_context(s, "resuming job %s from %s", t->job, root);
  if (t->nranks > 1) {
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_broadcast(&step, &step, 1, LOOM_I64, 0, t->world, &r));
    LOOM_TRY(loom_wait(&r));
  }
  if (step < 0) {
    if (t->rank == 0 && !t->opts.quiet)
      LOOM_INFO("restart %ld of job %s: no checkpoint of this job in %s yet; "
                "starting as the first attempt did (--resume %s)",
                t->restart, t->job, root, t->opts.resume);
    return LOOM_OK;
  }
  char dir[LOOM_CONFIG_STR_MAX + 64];
  loom_ckpt_open_opts light = *oo;
  light.verify = LOOM_CKPT_VERIFY_META;
  s = loom_ckpt_dir_name(root, step, dir, sizeof dir);
  if (s == LOOM_OK)
    s = loom_ckpt_open(c, dir, t->rank == 0 ? oo : &light);
  s = loom_train_agree(t, s, "opening this job's checkpoint to resume from");
  if (s != LOOM_OK) { /* opened here, failed elsewhere */
    loom_ckpt_close(*c);
    *c = NULL;
    return s;
  }
  if (t->rank == 0 && !t->opts.quiet)
    LOOM_INFO("restart %ld of job %s: going on from the job's newest "
              "checkpoint, not --resume %s",
              t->restart, t->job, t->opts.resume);
  return s;
}

/* Opens the checkpoint to resume from, the same on every rank: rank 0
 * finds it (checking it fully), the others open that step with the light
 * checks. *c = NULL when there is none. */
/* --resume PATH that names checkpoints rather than one, as loom ckpt takes
 * them: a checkpoint directory's root (its `latest` or step directories),
 * that root's `latest` file, or a run directory (its ckpt/). The root into
 * buf; false when PATH is none of these (one checkpoint, or nothing). */
static bool resume_root(const char *path, char *buf, size_t n) {
  struct stat st;
  char probe[LOOM_CONFIG_STR_MAX + 64];
  snprintf(probe, sizeof probe, "%s/manifest.json", path);
  if (lstat(probe, &st) == 0)
    return false; /* a checkpoint */
  size_t len = strlen(path);
  if (len >= 7 && strcmp(path + len - 7, "/latest") == 0 &&
      lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
    snprintf(buf, n, "%.*s", (int)(len - 7), path);
    return true;
  }
  snprintf(probe, sizeof probe, "%s/latest", path);
  if (lstat(probe, &st) == 0 || loom_ckpt_has_step_dirs(path)) {
    snprintf(buf, n, "%s", path);
    return true;
  }
  snprintf(probe, sizeof probe, "%s/ckpt", path);
  if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(buf, n, "%s", probe);
    return true;
  }
  /* A directory that is not a checkpoint (no manifest.json, not named
   * step_N): an empty checkpoint directory, searched as one (and found
   * empty) rather than opened as a checkpoint without its manifest. */
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
      strncmp(base, "step_", 5) != 0) {
    snprintf(buf, n, "%s", path);
    return true;
  }
  return false;
}

/* An explicit --resume PATH that gives no checkpoint (none there, all
 * damaged, not a checkpoint at all) is the command line's error: exit 2,
 * which loom run does not restart (a restart would fail the same way). */
static loom_status named_resume(loom_status s, const char *how) {
  if (s == LOOM_OK || s == LOOM_ERR_NOMEM || s == LOOM_ERR_CONFIG)
    return s;
  return loom_error_context(LOOM_ERR_CONFIG, "--resume %s", how);
}

static loom_status open_resume(loom_trainer *t, const loom_ckpt_open_opts *oo,
                               loom_ckpt **c) {
  const char *how = t->opts.resume;
  const char *root = t->cfg.checkpoint.dir;
  char named[LOOM_CONFIG_STR_MAX + 64];
  loom_ckpt_open_opts light = *oo;
  light.verify = LOOM_CKPT_VERIFY_META;
  *c = NULL;
  if (strcmp(how, "auto") != 0) {
    if (!resume_root(how, named, sizeof named)) {
      loom_status s = loom_ckpt_open(c, how, t->rank == 0 ? oo : &light);
      return named_resume(
          loom_train_agree(t, s, "opening the checkpoint to resume from"), how);
    }
    root = named; /* its newest valid checkpoint, as auto in its own */
  }
  char dir[LOOM_CONFIG_STR_MAX + 64];
  int64_t step = -1;
  loom_status s = LOOM_OK;
  if (t->rank == 0)
    s = loom_ckpt_find_latest_valid(root, oo, dir, sizeof dir, &step);
  s = loom_train_agree(t, s, "finding the latest checkpoint");
  if (s != LOOM_OK && root == named)
    return named_resume(s, how);
  if (s != LOOM_OK)
    return loom_error_context(s, "resuming from %s", root);
  if (t->nranks > 1) {
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_broadcast(&step, &step, 1, LOOM_I64, 0, t->world, &r));
    LOOM_TRY(loom_wait(&r));
  }
  if (step < 0 && root == named)
    return loom_ckpt_has_step_dirs(root)
               ? loom_error(LOOM_ERR_CONFIG,
                            "--resume %s: no valid checkpoint in %s (each "
                            "one passed over is named above with the reason)",
                            how, root)
               : loom_error(LOOM_ERR_CONFIG,
                            "--resume %s: no checkpoint in %s (it holds "
                            "none)",
                            how, root);
  if (step < 0) {
    /* Nothing usable: a fresh start. When something was passed over (each
     * named above, with why), say what happens now. */
    if (t->rank == 0 && loom_ckpt_has_step_dirs(root))
      LOOM_WARN("no usable checkpoint in %s (each one passed over is named "
                "above with the reason); starting from scratch; use --resume "
                "never to silence this",
                root);
    return LOOM_OK;
  }
  s = loom_ckpt_dir_name(root, step, dir, sizeof dir);
  if (s == LOOM_OK)
    s = loom_ckpt_open(c, dir, &light);
  return loom_train_agree(t, s, "opening the checkpoint to resume from");
}

loom_status loom_train_ckpt_resume(loom_trainer *t) {
  const char *how = t->opts.resume;
  const bool job_restart = loom_train_job_restart(t);
  if (strcmp(how, "never") == 0 && !job_restart)
    return LOOM_OK;
  /* checkpoint.enabled says whether this run writes checkpoints; those
   * already there are still its state to go on from (training afresh over
   * them, with metrics.jsonl begun anew, threw that away without a word). */
  if (strcmp(how, "auto") == 0 && !t->cfg.checkpoint.dir[0])
    return LOOM_OK;
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  const loom_model *layout = t->whole ? t->whole : t->model;
  oo.layout_hash = loom_ckpt_layout_hash(loom_model_view(layout, 0),
                                         loom_model_num_views(layout));
  loom_ckpt *c = NULL;
  if (job_restart)
    LOOM_TRY(open_job_resume(t, &oo, &c));
  if (!c && strcmp(how, "never") != 0)
    LOOM_TRY(open_resume(t, &oo, &c));
  if (!c)
    return LOOM_OK;
  loom_status s = restore(t, c);
  s = loom_train_agree(t, s, "resuming");
  t->resumed = s == LOOM_OK;
  if (s == LOOM_OK && t->rank == 0 && !t->opts.quiet)
    LOOM_INFO("resuming from %s (step %lld, written by %d rank%s; data: "
              "epoch %lld from sample %lld)",
              loom_ckpt_path(c), (long long)t->step,
              loom_ckpt_get_meta(c)->world_size,
              loom_ckpt_get_meta(c)->world_size == 1 ? "" : "s",
              (long long)loom_ckpt_get_meta(c)->data.epoch,
              (long long)loom_ckpt_get_meta(c)->data.sample);
  if (s == LOOM_OK && t->rank == 0 && !t->opts.quiet &&
      !t->cfg.checkpoint.enabled)
    LOOM_INFO("checkpoint.enabled is false: resumed all the same (it "
              "governs writing); this run writes no checkpoint, so %s stays "
              "the newest (--resume never starts afresh)",
              loom_ckpt_path(c));
  loom_ckpt_close(c);
  if (s != LOOM_OK)
    return loom_error_context(s, "resuming");
  return LOOM_OK;
}
