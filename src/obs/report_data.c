/* loom report, the reading half: a run directory's metrics.jsonl (every
 * number as a series over steps, each rank's parts), config.yaml and
 * env.json, and the verdict drawn from them. A run still being written is
 * read as far as its last whole line. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "report.h"

static rp_series *series_get(rp_run *r, const char *key, bool make) {
  for (int i = 0; i < r->nseries; i++)
    if (!strcmp(r->series[i].key, key))
      return &r->series[i];
  if (!make || r->nseries == RP_MAX_SERIES)
    return NULL;
  rp_series *s = &r->series[r->nseries++];
  memset(s, 0, sizeof *s);
  snprintf(s->key, sizeof s->key, "%s", key);
  return s;
}

const rp_series *rp_find(const rp_run *r, const char *key) {
  return series_get((rp_run *)r, key, false);
}

/* Two arrays of n items (sizes a_size and b_size) grown to cap items
 * together: both or, on failure, neither. */
static bool grow_pair(void **a, size_t a_size, void **b, size_t b_size, int n,
                      int cap) {
  void *na = loom_malloc((size_t)cap * a_size);
  void *nb = loom_malloc((size_t)cap * b_size);
  if (!na || !nb) {
    loom_free(na);
    loom_free(nb);
    return false;
  }
  if (n) {
    memcpy(na, *a, (size_t)n * a_size);
    memcpy(nb, *b, (size_t)n * b_size);
  }
  loom_free(*a);
  loom_free(*b);
  *a = na;
  *b = nb;
  return true;
}

static bool series_push(rp_series *s, double x, double y) {
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 64;
    void *px = s->x, *py = s->y;
    if (!grow_pair(&px, sizeof *s->x, &py, sizeof *s->y, s->n, cap))
      return false;
    s->x = px;
    s->y = py;
    s->cap = cap;
  }
  s->x[s->n] = x;
  s->y[s->n++] = y;
  return true;
}

/* Each rank's array of one line, summed into r->rank_sum[k]. */
static void add_ranks(rp_run *r, const cJSON *o, int k, const char *key) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsArray(a))
    return;
  int n = cJSON_GetArraySize(a);
  if (n > RP_MAX_RANKS)
    n = RP_MAX_RANKS;
  if (n > r->nranks)
    r->nranks = n;
  for (int i = 0; i < n; i++) {
    const cJSON *v = cJSON_GetArrayItem(a, i);
    if (cJSON_IsNumber(v))
      r->rank_sum[k][i] += v->valuedouble;
  }
}

/* A line's imbalance: each rank's busy time over the ranks' mean into
 * r->rank_rel, and its busy_skew (the trainer's figure; computed the same
 * way, the slowest over the mean, when the line lacks it) into
 * r->skew_sum. */
static void add_skew(rp_run *r, const cJSON *o) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "rank_busy_s");
  int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
  if (n > RP_MAX_RANKS)
    n = RP_MAX_RANKS;
  double sum = 0, mx = 0;
  for (int i = 0; i < n; i++) {
    const cJSON *v = cJSON_GetArrayItem(a, i);
    double b = cJSON_IsNumber(v) ? v->valuedouble : 0;
    sum += b;
    mx = b > mx ? b : mx;
  }
  if (n < 2 || !(sum > 0))
    return;
  for (int i = 0; i < n; i++) {
    const cJSON *v = cJSON_GetArrayItem(a, i);
    if (cJSON_IsNumber(v))
      r->rank_rel[i] += v->valuedouble * n / sum;
  }
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "busy_skew");
  r->skew_sum += cJSON_IsNumber(k) ? k->valuedouble : mx * n / sum;
  r->skew_lines++;
}

/* The keys of a window's parts, in the order of rp_run.win. */
static const char *const win_keys[RP_WIN_N] = {
    "step_s",  "data_wait_s", "forward_s", "backward_s", "comm_wait_s",
    "optim_s", "pp_wait_s",   "tp_wait_s", "ckpt_s"};
enum { W_STEP, W_DATA, W_FWD, W_BWD, W_COMM, W_OPTIM, W_PIPE, W_TP, W_CKPT };

/* A training line's parts, as a window of the table. */
static loom_status add_window(rp_run *r, const cJSON *o, double x,
                              const char *path) {
  if (r->nwin == r->win_cap) {
    int cap = r->win_cap ? 2 * r->win_cap : 64;
    void *ps = r->win_step, *pw = r->win;
    if (!grow_pair(&ps, sizeof *r->win_step, &pw, sizeof *r->win, r->nwin, cap))
      return loom_error(LOOM_ERR_NOMEM, "reading %s", path);
    r->win_step = ps;
    r->win = pw;
    r->win_cap = cap;
  }
  r->win_step[r->nwin] = x;
  for (int k = 0; k < RP_WIN_N; k++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, win_keys[k]);
    r->win[r->nwin][k] =
        cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : 0;
  }
  r->nwin++;
  return LOOM_OK;
}

/* A step as the trainer writes it: a whole number from 0 to 2^53 (exact
 * in a double, and in an int64_t). */
static bool is_step(const cJSON *v) {
  return loom_obs_json_whole(v, 0, 9007199254740992.0);
}

static void bad_line(rp_run *r, int lineno) {
  r->bad_lines++;
  if (!r->first_bad)
    r->first_bad = lineno;
}

static loom_status read_metrics(rp_run *r, const char *path) {
  char *text = NULL;
  size_t len = 0;
  if (loom_obs_read_file(path, &text, &len) != LOOM_OK) {
    char why[600];
    snprintf(why, sizeof why, "%s", loom_last_error());
    return loom_error(LOOM_ERR_IO,
                      "%s (a run directory holds metrics.jsonl once "
                      "training has logged a step)",
                      why);
  }
  loom_status st = LOOM_OK;
  char *line = text;
  int lineno = 0;
  const char *stop = text + len;
  while (line < stop && st == LOOM_OK) {
    char *end = memchr(line, '\n', (size_t)(stop - line));
    lineno++;
    if (!end) { /* a line being written: read up to the last whole one */
      r->partial_tail = true;
      break;
    }
    *end = '\0';
    /* A NUL inside the line (a file damaged on disk) makes it unreadable,
     * not the end of the file. */
    bool nul = memchr(line, '\0', (size_t)(end - line)) != NULL;
    cJSON *o = nul ? NULL : cJSON_Parse(line);
    if (!cJSON_IsObject(o)) {
      bad_line(r, lineno);
      cJSON_Delete(o);
      line = end + 1;
      continue;
    }
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (cJSON_IsNumber(step) && !is_step(step)) {
      /* "step": 1e400, -3 or 2.5 is a damaged line, not a step (a cast
       * of 1e300 to a step is undefined) */
      bad_line(r, lineno);
      cJSON_Delete(o);
      line = end + 1;
      continue;
    }
    double x = cJSON_IsNumber(step) ? step->valuedouble : (double)r->lines;
    bool train = cJSON_GetObjectItemCaseSensitive(o, "step_s") != NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
      if (cJSON_IsNumber(it) && strcmp(it->string, "step") != 0) {
        rp_series *s = series_get(r, it->string, true);
        if (s && !series_push(s, x, it->valuedouble))
          st = loom_error(LOOM_ERR_NOMEM, "reading %s", path);
      }
    }
    if (train && st == LOOM_OK)
      st = add_window(r, o, x, path);
    if (train) {
      r->train_lines++;
      /* The first window holds the warm-up (first-touch pages, plans):
       * the rank means leave it out when there are others. */
      if (r->train_lines == 2) {
        memset(r->rank_sum, 0, sizeof r->rank_sum);
        memset(r->rank_rel, 0, sizeof r->rank_rel);
        r->skew_sum = 0;
        r->rank_lines = r->skew_lines = 0;
      }
      add_ranks(r, o, RP_RANK_BUSY, "rank_busy_s");
      add_ranks(r, o, RP_RANK_DATA, "rank_data_wait_s");
      add_ranks(r, o, RP_RANK_COMM, "rank_comm_wait_s");
      add_skew(r, o);
      r->rank_lines++;
    }
    if (cJSON_IsNumber(step))
      r->last_step = (int64_t)step->valuedouble;
    r->lines++;
    cJSON_Delete(o);
    line = end + 1;
  }
  loom_free(text);
  return st;
}

/* A file that is there but could not be read (a pipe, a device, no
 * permission) is named; a missing one is what an older run looks like. */
static void warn_unreadable(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) == 0)
    LOOM_WARN("report: %s; left out", loom_last_error());
}

static void read_env(rp_run *r, const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/env.json", dir);
  char *text = NULL;
  if (loom_obs_read_file(path, &text, NULL) != LOOM_OK) {
    warn_unreadable(path);
    return; /* an older run, or none written: the page says so */
  }
  r->env = cJSON_Parse(text);
  loom_free(text);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(r->env, "total_steps");
  if (is_step(t))
    r->total_steps = (int64_t)t->valuedouble;
  else if (cJSON_IsNumber(t))
    LOOM_WARN("report: %s: total_steps is not a step count; left out", path);
}

loom_status rp_read(rp_run *r, const char *dir) {
  memset(r, 0, sizeof *r);
  snprintf(r->dir, sizeof r->dir, "%s", dir);
  char path[4096];
  int n = snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  if (n < 0 || (size_t)n >= sizeof path)
    return loom_error(LOOM_ERR_INVALID_ARG, "path too long: %s", dir);
  LOOM_TRY(read_metrics(r, path));
  struct stat sb;
  if (stat(path, &sb) == 0)
    r->mtime = (double)sb.st_mtime;
  read_env(r, dir);
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  if (loom_obs_read_file(path, &r->config, NULL) != LOOM_OK) {
    warn_unreadable(path);
    r->config = NULL; /* the page says it was not found */
  }
  const rp_series *vl = rp_find(r, "val_loss");
  r->finished = r->total_steps > 0 && vl && vl->n > 0 &&
                (int64_t)vl->x[vl->n - 1] >= r->total_steps;
  return LOOM_OK;
}

void rp_free(rp_run *r) {
  for (int i = 0; i < r->nseries; i++) {
    loom_free(r->series[i].x);
    loom_free(r->series[i].y);
  }
  loom_free(r->win_step);
  loom_free(r->win);
  cJSON_Delete(r->env);
  loom_free(r->config);
  memset(r, 0, sizeof *r);
}

const char *rp_env(const rp_run *r, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->env, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

double rp_env_num(const rp_run *r, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->env, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* A value of the resolved config.yaml (SECTION: then "  KEY: value"), as
 * text; "" when absent. */
static void config_value(const rp_run *r, const char *section, const char *key,
                         char *out, size_t n) {
  out[0] = '\0';
  if (!r->config)
    return;
  char head[64], item[64];
  snprintf(head, sizeof head, "%s:", section);
  snprintf(item, sizeof item, "  %s:", key);
  bool in = false;
  for (const char *l = r->config; l && *l;) {
    const char *e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l) : strlen(l);
    if (l[0] != ' ')
      in = len == strlen(head) && !strncmp(l, head, len);
    else if (in && !strncmp(l, item, strlen(item))) {
      const char *v = l + strlen(item);
      while (*v == ' ')
        v++;
      size_t vl = len - (size_t)(v - l);
      snprintf(out, n, "%.*s", (int)vl, v);
      return;
    }
    l = e ? e + 1 : NULL;
  }
}

/* The mean of a series over the training lines, leaving the first (the
 * warm-up) out when there are three or more. */
static double mean_of(const rp_run *r, const char *key) {
  const rp_series *s = rp_find(r, key);
  if (!s || s->n == 0)
    return 0;
  int from = s->n >= 3 ? 1 : 0;
  double sum = 0;
  for (int i = from; i < s->n; i++)
    sum += isfinite(s->y[i]) ? s->y[i] : 0;
  return sum / (double)(s->n - from);
}

/* Steps in window i: back to the window before (the first: from step 0);
 * a step that goes back (a file from before loom cut replayed lines) or
 * repeats counts as one step. */
static double window_steps(const rp_run *r, int i) {
  double d = r->win_step[i] - (i > 0 ? r->win_step[i - 1] : 0);
  return d >= 1 ? d : 1;
}

/* Where a step goes, every part over the same windows: those after the
 * first (the warm-up) when there are three or more. A part a window lacks
 * counts 0 there (after a resume at another world size, comm_wait_s is in
 * some windows only: averaged over its own windows it gave a reduction
 * share the run did not have). The checkpoint saves, inside step_s, as a
 * step's share of its window's ckpt_s. */
static void window_parts(const rp_run *r, rp_parts *p) {
  if (r->nwin == 0)
    return;
  int from = r->nwin >= 3 ? 1 : 0;
  double sum[RP_WIN_N] = {0}, ckpt = 0, ckpt_all = 0, steps_all = 0;
  for (int i = 0; i < r->nwin; i++) {
    double n = window_steps(r, i);
    ckpt_all += r->win[i][W_CKPT];
    steps_all += r->win[i][W_STEP] * n;
    if (i < from)
      continue;
    for (int k = 0; k < RP_WIN_N; k++)
      sum[k] += r->win[i][k];
    ckpt += r->win[i][W_CKPT] / n;
  }
  double m = (double)(r->nwin - from);
  p->step = sum[W_STEP] / m;
  p->data = sum[W_DATA] / m;
  p->forward = sum[W_FWD] / m;
  p->backward = sum[W_BWD] / m;
  p->comm = sum[W_COMM] / m;
  p->optim = sum[W_OPTIM] / m;
  p->pipe = sum[W_PIPE] / m;
  p->tp = sum[W_TP] / m;
  p->ckpt = ckpt / m;
  p->ckpt_share = steps_all > 0 ? ckpt_all / steps_all : 0;
}

static void add_finding(rp_verdict *v, double weight, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_finding(rp_verdict *v, double weight, const char *fmt, ...) {
  if (v->n == RP_MAX_FINDINGS)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->text[v->n], sizeof v->text[0], fmt, ap);
  va_end(ap);
  v->weight[v->n++] = weight;
}

/* mean_of, or NaN when the run has no such number. */
static double mean_or_nan(const rp_run *r, const char *key) {
  return rp_find(r, key) ? mean_of(r, key) : NAN;
}

/* The pipeline's finding: rank 0's wait on its neighbours (pipe: its share
 * of the step) and the bubble, against what these stages would idle with
 * no delay between them and against the theory. */
static void pipe_finding(const rp_run *r, rp_verdict *v, double pipe) {
  const rp_parts *p = &v->parts;
  const double S = p->step;
  double bubble = isfinite(p->bubble) ? p->bubble : 0;
  char theory[96] = "", expect[96] = "", why[160] = "";
  if (isfinite(p->bubble_theory) && p->stages > 1 && p->micro > 0)
    snprintf(theory, sizeof theory,
             " and %.0f%% in theory ((P-1)/(M+P-1), P %d, M %d)",
             100 * p->bubble_theory, p->stages, p->micro);
  if (isfinite(p->bubble_expected))
    snprintf(expect, sizeof expect,
             " against %.0f%% expected for these stages (pp_bubble_expected)",
             100 * p->bubble_expected);
  int w = 0;
  if (isfinite(p->bubble_expected) && bubble - p->bubble_expected >= 0.05)
    w = snprintf(why, sizeof why,
                 " %.0f points are lost between the stages (messages, "
                 "wake-ups).",
                 100 * (bubble - p->bubble_expected));
  if (isfinite(p->bubble_expected) && isfinite(p->bubble_theory) &&
      p->bubble_expected - p->bubble_theory >= 0.05 && w >= 0 &&
      (size_t)w < sizeof why)
    snprintf(why + w, sizeof why - (size_t)w,
             " %.0f come from uneven stages (parallel.pp_split).",
             100 * (p->bubble_expected - p->bubble_theory));
  char micro[32];
  config_value(r, "parallel", "micro_batches", micro, sizeof micro);
  if (!micro[0])
    snprintf(micro, sizeof micro, "%d", p->micro);
  add_finding(v, pipe > bubble ? pipe : bubble,
              "Pipeline bubble bound: rank 0 waits on its pipeline neighbours "
              "for %.0f%% of the step (%.1f of %.1f ms); the ranks idle %.0f%% "
              "of the schedule (pp_bubble)%s%s.%s More "
              "micro-batches (parallel.micro_batches, now %s) shrink the "
              "bubble.",
              100 * pipe, 1e3 * p->pipe, 1e3 * S, 100 * bubble, expect, theory,
              why, micro);
}

void rp_verdict_make(const rp_run *r, rp_verdict *v) {
  memset(v, 0, sizeof *v);
  rp_parts *p = &v->parts;
  window_parts(r, p);
  p->hidden = mean_or_nan(r, "comm_hidden");
  p->skew = r->skew_lines > 0 ? r->skew_sum / r->skew_lines : 1;
  p->bubble = mean_or_nan(r, "pp_bubble");
  p->bubble_expected = mean_or_nan(r, "pp_bubble_expected");
  p->bubble_theory = mean_or_nan(r, "pp_bubble_theory");
  p->stages = (int)lround(mean_of(r, "pp_stages"));
  p->micro = (int)lround(mean_of(r, "pp_micro_batches"));
  /* The slowest rank: the highest busy time over the mean, window by
   * window as busy_skew counts it (not the sums over the windows, which
   * weigh long windows more and gave another figure than busy_skew). */
  p->slowest = -1;
  double worst = 0;
  for (int i = 0; r->skew_lines > 0 && i < r->nranks; i++)
    if (r->rank_rel[i] > worst) {
      worst = r->rank_rel[i];
      p->slowest = i;
    }
  if (r->train_lines == 0 || !(p->step > 0)) {
    snprintf(v->headline, sizeof v->headline,
             "No verdict yet: no training step has been logged.");
    return;
  }
  const double S = p->step;
  /* Every wait the metrics carry: the loader's, the reductions' (and a
   * pipeline's exchanges outside its schedule), the pipeline's inside its
   * schedule, and tensor parallelism's collectives, which forward_s and
   * backward_s hold: compute is what is left of those three. */
  double data = p->data / S, pipe = p->pipe / S;
  double comm = (p->comm + p->tp) / S;
  double compute = (p->forward + p->backward - p->tp + p->optim) / S;
  double ckpt = p->ckpt / S;
  double other = 1 - data - pipe - comm - compute - ckpt;
  char prefetch[32];
  config_value(r, "data", "prefetch", prefetch, sizeof prefetch);
  /* A straggler makes the others wait at the reductions, the tp
   * collectives or the pipeline's exchanges: name it before the waits it
   * shows up as. */
  if (p->skew >= 1.25 && p->slowest >= 0)
    add_finding(v, 2.0 + p->skew,
                "Imbalanced ranks: rank %d computes %.0f%% longer than the "
                "mean of the %d ranks (busy_skew %.2f: the slowest rank's "
                "busy time over the ranks' mean, averaged over %s); the "
                "others wait for it at every %s. Look for a slower or busier "
                "host, or uneven data, on that rank%s.",
                p->slowest, 100 * (p->skew - 1), r->nranks, p->skew,
                r->train_lines >= 2 ? "the windows after the first"
                                    : "the one window",
                p->stages > 1 ? "exchange of the pipeline"
                : p->tp > 0   ? "tensor-parallel collective"
                              : "reduction",
                p->stages > 1 ? ", or uneven stages (parallel.pp_split)" : "");
  if (data >= 0.2)
    add_finding(v, data,
                "Data-loading bound: the loader's wait is %.0f%% of the step "
                "(%.1f of %.1f ms). Raise data.prefetch (now %s) so batches "
                "are ready ahead, or make the data cheaper to read.",
                100 * data, 1e3 * p->data, 1e3 * S,
                prefetch[0] ? prefetch : "?");
  if (p->stages > 1 && (pipe >= 0.2 || p->bubble >= 0.2))
    pipe_finding(r, v, pipe);
  if (comm >= 0.2) {
    char hid[96] = "";
    if (isfinite(p->hidden) && p->comm / S >= 0.05)
      snprintf(hid, sizeof hid,
               "; %.0f%% of reduction time is exposed after "
               "backward",
               100 * (1 - p->hidden));
    char red[64] = "";
    if (p->comm > 0)
      snprintf(red, sizeof red, " and %.1f ms for gradient reductions",
               1e3 * p->comm);
    if (p->tp > p->comm)
      add_finding(v, comm,
                  "Communication bound: %.0f%% of the step waits for "
                  "communication: %.1f ms for the tensor-parallel "
                  "collectives of forward and backward (tp_wait_s)%s, of "
                  "%.1f ms%s. Each block reduces its activations over the tp "
                  "group: a smaller parallel.tp (more data-parallel replicas "
                  "instead), its ranks on one host, or faster links help.",
                  100 * comm, 1e3 * p->tp, red, 1e3 * S, hid);
    else
      add_finding(v, comm,
                  "Communication bound: %.0f%% of the step waits for gradient "
                  "reductions (%.1f of %.1f ms)%s. Fewer bytes a step help: "
                  "parallel.compress: bf16, train.accumulate, or a larger "
                  "batch; so do faster links.",
                  100 * comm, 1e3 * (p->comm + p->tp), 1e3 * S, hid);
  }
  if (p->ckpt_share >= 0.1)
    add_finding(v, p->ckpt_share,
                "Checkpoint bound: saves take %.0f%% of the training steps' "
                "time; raise checkpoint.every, or set checkpoint.async: true.",
                100 * p->ckpt_share);
  char waits[160];
  int wl = snprintf(waits, sizeof waits,
                    "data wait %.0f%%, communication wait %.0f%%", 100 * data,
                    100 * comm);
  if (p->stages > 1 && wl > 0 && (size_t)wl < sizeof waits)
    wl += snprintf(waits + wl, sizeof waits - (size_t)wl,
                   ", pipeline wait %.0f%%", 100 * pipe);
  if (p->ckpt > 0 && wl > 0 && (size_t)wl < sizeof waits)
    snprintf(waits + wl, sizeof waits - (size_t)wl, ", checkpoint saves %.0f%%",
             100 * ckpt);
  if (v->n == 0 && compute >= 0.5)
    add_finding(v, compute,
                "Compute bound: forward, backward and the optimizer are %.0f%% "
                "of the step (%s). Speed comes from the kernels and threads "
                "(train.threads), a larger batch, or more ranks.",
                100 * compute, waits);
  else if (v->n == 0)
    /* No wait reaches its threshold, yet compute is the lesser part: say
     * where the step goes instead of calling it compute bound. */
    add_finding(v, 1 - compute,
                "No single bound: forward, backward and the optimizer are only "
                "%.0f%% of the step; the rest is spread: %s, and %.0f%% "
                "outside the measured parts (the step's sums, logging, the "
                "process waiting for a core).",
                100 * compute, waits, 100 * (other > 0 ? other : 0));
  /* The heaviest first. */
  for (int i = 1; i < v->n; i++)
    for (int j = i; j > 0 && v->weight[j] > v->weight[j - 1]; j--) {
      char tmp[sizeof v->text[0]];
      memcpy(tmp, v->text[j], sizeof tmp);
      memcpy(v->text[j], v->text[j - 1], sizeof tmp);
      memcpy(v->text[j - 1], tmp, sizeof tmp);
      double w = v->weight[j];
      v->weight[j] = v->weight[j - 1];
      v->weight[j - 1] = w;
    }
  snprintf(v->headline, sizeof v->headline, "%s", v->text[0]);
}
