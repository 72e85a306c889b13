/* The trainer's side of the timeline trace (obs/trace.c writes it): which
 * file, and the hooks that feed it from the model's units and from the
 * communication thread, and a pipeline's schedule. The loop's own phases
 * (data wait, forward, backward, optimizer, evaluation, checkpoint) are
 * spans in loop.c and loop_pipe.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/obs.h"
#include "trainer.h"

/* Forward and backward of each top-level module, on the main thread. */
static loom_status unit_observer(void *user, int u, loom_unit_event ev) {
  loom_trainer *t = user;
  int n = loom_model_num_units(t->model);
  if (u < 0 || u >= n || !loom_trace_enabled())
    return LOOM_OK;
  double now = loom_time_now();
  switch (ev) {
  case LOOM_UNIT_PRE_FORWARD:
    t->unit_t0[2 * u] = now;
    break;
  case LOOM_UNIT_PRE_BACKWARD:
    t->unit_t0[2 * u + 1] = now;
    break;
  case LOOM_UNIT_POST_FORWARD:
  case LOOM_UNIT_POST_BACKWARD: {
    bool fwd = ev == LOOM_UNIT_POST_FORWARD;
    const char *name = loom_model_unit_name(t->model, u);
    loom_trace_span(fwd ? "forward" : "backward", name ? name : "?",
                    t->unit_t0[2 * u + (fwd ? 0 : 1)], now, NULL);
    break;
  }
  }
  return LOOM_OK;
}

/* A phase of the step on the main track, with the step's number (the
 * optimizer step it belongs to) and extra args (NULL: none). The warm-up's
 * forward and backward (before a checkpoint is read, so before the step is
 * known) say "warm_up":true instead of a step. */
void loom_train_trace_step(const loom_trainer *t, const char *name, double t0,
                           double t1, const char *extra) {
  if (!t->tracing || !loom_trace_enabled())
    return;
  char args[160];
  if (t->warming_up)
    snprintf(args, sizeof args, "\"warm_up\":true%s%s", extra ? "," : "",
             extra ? extra : "");
  else
    snprintf(args, sizeof args, "\"step\":%lld%s%s", (long long)t->step,
             extra ? "," : "", extra ? extra : "");
  loom_trace_span("train", name, t0, t1, args);
}

/* A pipeline's schedule on the main track: each micro-batch's forward and
 * backward and each wait on a neighbour, as the pipeline times them
 * (forward_s, backward_s and pp_wait_s in metrics.jsonl). */
static void pipe_observer(void *user, loom_pipe_event ev, int mb, double t0,
                          double t1) {
  static const char *const names[] = {"forward", "backward", "pipeline wait"};
  _Static_assert(sizeof names / sizeof names[0] == LOOM_PIPE_EV_COUNT,
                 "a name for each pipeline event");
  if ((unsigned)ev >= LOOM_PIPE_EV_COUNT)
    return;
  char extra[32];
  snprintf(extra, sizeof extra, "\"micro_batch\":%d", mb);
  loom_train_trace_step(user, names[ev], t0, t1, extra);
}

/* Each operation of the communication thread, on its own track. */
static _Thread_local bool comm_named;
static void comm_op(void *user, const char *op, const char *group, size_t bytes,
                    double t0, double t1) {
  (void)user;
  if (!loom_trace_enabled())
    return;
  if (!comm_named) {
    loom_trace_thread_name("comm");
    comm_named = true;
  }
  char args[160];
  snprintf(args, sizeof args, "\"bytes\":%zu,\"group\":\"%s\"", bytes, group);
  loom_trace_span("comm", op, t0, t1, args);
}

loom_status loom_train_trace_open(loom_trainer *t) {
  const char *env = getenv("LOOM_TRACE");
  if (!t->cfg.log.trace && !(env && *env))
    return LOOM_OK;
  char dir[LOOM_CONFIG_STR_MAX + 16], path[LOOM_CONFIG_STR_MAX + 48];
  if (env && *env)
    snprintf(dir, sizeof dir, "%s", env);
  else if (t->cfg.log.run_dir[0])
    snprintf(dir, sizeof dir, "%s/trace", t->cfg.log.run_dir);
  else
    return loom_error(LOOM_ERR_CONFIG,
                      "log.trace: no log.run_dir to write the trace into "
                      "(set log.run_dir, or LOOM_TRACE=DIR)");
  if (loom_trace_is_open()) {
    LOOM_WARN("log.trace: this process already writes a trace (%s); this "
              "trainer adds to it",
              loom_trace_path());
    return LOOM_OK;
  }
  LOOM_TRY(loom_fs_mkdirs(dir, 0755));
  snprintf(path, sizeof path, "%s/rank-%d.json", dir, t->rank);
  int n = loom_model_num_units(t->model);
  t->unit_t0 = loom_calloc((size_t)(n > 0 ? 2 * n : 2), sizeof(double));
  if (!t->unit_t0)
    return LOOM_ERR_NOMEM;
  /* The window and the cap, with LOOM_TRACE=DIR too (at their defaults
   * unless log.trace is true: config check refuses them otherwise). */
  loom_trace_opts o = loom_trace_opts_default();
  o.start = t->cfg.log.trace_start;
  o.steps = t->cfg.log.trace_steps;
  o.every = t->cfg.log.trace_every;
  o.max_bytes = (uint64_t)(t->cfg.log.trace_max_mb * 1048576.0);
  o.max_name = "log.trace_max_mb";
  LOOM_TRY(loom_trace_start_opts(path, t->rank, t->nranks, &o));
  t->tracing = true;
  loom_model_set_unit_observer(t->model, unit_observer, t);
  if (t->pipe)
    loom_pipe_set_observer(t->pipe, pipe_observer, t);
  loom_comm_set_op_hook(comm_op, NULL);
  if (t->rank == 0 && !t->opts.quiet)
    LOOM_INFO("tracing into %s/rank-*.json (merge: loom report --trace %s)",
              dir, env && *env ? dir : t->cfg.log.run_dir);
  return LOOM_OK;
}

/* A blocking collective on the world. */
static loom_status world_wait(loom_status s, loom_req *r) {
  return s == LOOM_OK ? loom_wait(r) : s;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

loom_status loom_train_trace_sync(loom_trainer *t) {
  if (!t->world || t->nranks == 1)
    return LOOM_OK;
  /* Whether any rank traces (LOOM_TRACE may be set on some only): all
   * measure together or none does. */
  int32_t mine = t->tracing, any = 0;
  loom_req r = LOOM_REQ_INIT;
  LOOM_TRY(world_wait(
      loom_allreduce(&mine, &any, 1, LOOM_I32, LOOM_MAX, t->world, &r), &r));
  if (!any)
    return LOOM_OK;
  /* Rounds of: a barrier, every rank reads its wall clock as the barrier
   * lets it go, the readings gathered. The barrier's release reaches the
   * ranks within its latency (microseconds on a host, a network's one-way
   * latency across hosts): the median of the rounds is the offset. */
  enum { ROUNDS = 9 };
  double off[ROUNDS], attempt = 0;
  double *all = loom_calloc((size_t)t->nranks, sizeof *all);
  if (!all)
    return LOOM_ERR_NOMEM;
  loom_status s = LOOM_OK;
  for (int k = 0; s == LOOM_OK && k < ROUNDS; k++) {
    s = world_wait(loom_barrier(t->world, &r), &r);
    double now = loom_trace_wall();
    if (s == LOOM_OK)
      s = world_wait(loom_allgather(&now, all, 1, LOOM_F64, t->world, &r), &r);
    off[k] = all[t->rank] - all[0];
    if (k == 0) /* rank 0's clock, alike on every rank: the attempt's mark */
      attempt = all[0];
  }
  loom_free(all);
  if (s != LOOM_OK)
    return loom_error_context(s, "trace: measuring the ranks' clocks");
  qsort(off, ROUNDS, sizeof off[0], cmp_double);
  loom_trace_clock_sync(off[ROUNDS / 2], off[ROUNDS - 1] - off[0], ROUNDS,
                        attempt);
  return LOOM_OK;
}

void loom_train_trace_mem(const loom_train_mem *mem) {
  if (!loom_trace_enabled())
    return;
  const double mib = 1024.0 * 1024.0;
  char args[256];
  snprintf(args, sizeof args,
           "\"params_mb\":%.3f,\"grads_mb\":%.3f,\"optim_mb\":%.3f,"
           "\"act_mb\":%.3f,\"comm_mb\":%.3f,\"data_mb\":%.3f",
           (double)mem->params / mib, (double)mem->grads / mib,
           (double)mem->optim / mib, (double)mem->act / mib,
           (double)mem->comm / mib, (double)mem->data / mib);
  double now = loom_time_now();
  loom_trace_counter("memory", now, args);
  snprintf(args, sizeof args, "\"peak_rss_mb\":%.3f",
           loom_train_peak_rss() / mib);
  loom_trace_counter("peak rss", now, args);
  loom_trace_flush();
}

void loom_train_trace_close(loom_trainer *t) {
  if (!t || !t->tracing)
    return;
  loom_comm_set_op_hook(NULL, NULL);
  if (t->model)
    loom_model_set_unit_observer(t->model, NULL, NULL);
  if (t->pipe)
    loom_pipe_set_observer(t->pipe, NULL, NULL);
  loom_trace_stop(NULL);
  t->tracing = false;
  loom_free(t->unit_t0);
  t->unit_t0 = NULL;
}
