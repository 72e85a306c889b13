/* The optimizer object: SGD (momentum, Nesterov, coupled weight decay) and
 * AdamW over flat buffers, whole, by ranges, or by shard. */
#include "loom/optim.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

const char *const loom_optim_kind_names[] = {
#define LOOM_X_ROW(name, text) text,
    LOOM_OPTIM_KIND_LIST(LOOM_X_ROW)
#undef LOOM_X_ROW
};
_Static_assert(sizeof loom_optim_kind_names / sizeof loom_optim_kind_names[0] ==
                   LOOM_OPTIM_KIND_COUNT,
               "optim kind table size");

const char *loom_optim_kind_name(loom_optim_kind k) {
  return (unsigned)k < LOOM_OPTIM_KIND_COUNT ? loom_optim_kind_names[k] : "?";
}

loom_status loom_optim_kind_parse(const char *name, loom_optim_kind *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_optim_kind_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(name, loom_optim_kind_names, LOOM_OPTIM_KIND_COUNT,
                           "optimizer", &i));
  *out = (loom_optim_kind)i;
  return LOOM_OK;
}

int loom_optim_threads_for(int64_t n) {
  int64_t want = n / LOOM_OPTIM_MIN_PER_THREAD;
  int have = loom_threads();
  if (want < 1)
    return 1;
  return want < have ? (int)want : have;
}

/* Cut t of nt: the even split rounded up to a multiple of 16 elements. */
static int64_t part_cut(int64_t begin, int64_t end, int t, int nt) {
  if (t <= 0)
    return begin;
  if (t >= nt)
    return end;
  int64_t c = (begin + (end - begin) * t / nt + 15) & ~(int64_t)15;
  return c < begin ? begin : c > end ? end : c;
}

void loom_optim_part(int64_t begin, int64_t end, int t, int nt, int64_t *lo,
                     int64_t *hi) {
  *lo = part_cut(begin, end, t, nt);
  *hi = part_cut(begin, end, t + 1, nt);
}

loom_optim_opts loom_optim_opts_default(void) {
  loom_optim_opts o;
  memset(&o, 0, sizeof o);
  o.kind = LOOM_OPTIM_SGD;
  o.momentum = 0.0;
  o.nesterov = false;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.weight_decay = 0.0;
  o.decay_all = false;
  o.shard_begin = 0;
  o.shard_end = -1;
  return o;
}

int loom_optim_opts_state_count(const loom_optim_opts *opts) {
  if (!opts)
    return 0;
  switch (opts->kind) {
  case LOOM_OPTIM_SGD:
    return opts->momentum != 0.0 ? 1 : 0;
  case LOOM_OPTIM_ADAMW:
    return 2;
  default:
    return 0;
  }
}

/* A run of elements with one weight-decay decision; the runs tile [0, N). */
typedef struct optim_seg {
  int64_t begin, end;
  bool decay;
} optim_seg;

#define OPTIM_MAX_STATE 2

struct loom_optim {
  loom_optim_opts opts;
  int64_t n;          /* N: elements of the layout */
  int64_t begin, end; /* the shard, [begin, end) of the layout */
  int64_t step;       /* completed steps */
  int nseg;
  optim_seg *segs; /* (nseg) */
  int nstate;
  const char *state_names[OPTIM_MAX_STATE];
  float *state[OPTIM_MAX_STATE]; /* (S) each, S = end - begin */
  /* loom_optim_set_rounded: where each updated element's rounding to
   * round_dt goes (addressed as params), or NULL */
  float *round_out;
  loom_dtype round_dt;
};

static bool finite_nonneg(double x) { return x >= 0.0 && isfinite(x); }

static loom_status check_opts(const loom_optim_opts *o, int64_t n) {
  if ((unsigned)o->kind >= LOOM_OPTIM_KIND_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "optim: unknown kind %d",
                      (int)o->kind);
  if (!finite_nonneg(o->weight_decay))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: weight_decay must be finite and >= 0 (got %g)",
                      o->weight_decay);
  if (o->kind == LOOM_OPTIM_SGD) {
    if (!finite_nonneg(o->momentum))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "optim: sgd momentum must be finite and >= 0 (got %g)",
                        o->momentum);
    if (o->nesterov && o->momentum == 0.0)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "optim: sgd nesterov needs momentum > 0");
  } else {
    if (!(o->beta1 >= 0.0 && o->beta1 < 1.0))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "optim: adamw beta1 must be in [0, 1) (got %g)",
                        o->beta1);
    if (!(o->beta2 >= 0.0 && o->beta2 < 1.0))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "optim: adamw beta2 must be in [0, 1) (got %g)",
                        o->beta2);
    if (!finite_nonneg(o->eps))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "optim: adamw eps must be finite and >= 0 (got %g)",
                        o->eps);
  }
  int64_t end = o->shard_end == -1 ? n : o->shard_end;
  if (o->shard_begin < 0 || end < o->shard_begin || end > n)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: shard [%lld, %lld) is not inside the layout "
                      "[0, %lld)",
                      (long long)o->shard_begin, (long long)o->shard_end,
                      (long long)n);
  return LOOM_OK;
}

/* Turns the views into runs that tile [0, N): each view decays when its flag
 * (or decay_all) says so, gaps only under decay_all; equal neighbours merge
 * so the element loops run as long as they can. */
static loom_status build_segs(loom_optim *o, const loom_param *views,
                              int nviews) {
  int64_t n = o->n;
  if (nviews == 0) {
    o->segs = loom_malloc(sizeof(optim_seg));
    if (!o->segs)
      return LOOM_ERR_NOMEM;
    o->nseg = 0;
    if (n > 0)
      o->segs[o->nseg++] = (optim_seg){0, n, true};
    return LOOM_OK;
  }
  int64_t prev = 0;
  for (int i = 0; i < nviews; i++) {
    const loom_param *v = &views[i];
    if (v->offset < prev || v->numel < 0 || v->numel > n - v->offset)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "optim: view %d '%.*s' [%lld, +%lld) overlaps the one "
                        "before or lies outside the layout [0, %lld)",
                        i, LOOM_PARAM_NAME_MAX, v->name, (long long)v->offset,
                        (long long)v->numel, (long long)n);
    prev = v->offset + v->numel;
  }
  /* At most a view and a gap before it each, plus the tail. */
  o->segs = loom_malloc(sizeof(optim_seg) * (2 * (size_t)nviews + 1));
  if (!o->segs)
    return LOOM_ERR_NOMEM;
  int k = 0;
  int64_t at = 0;
  for (int i = 0; i <= nviews; i++) {
    int64_t vb = i < nviews ? views[i].offset : n;
    int64_t ve = i < nviews ? vb + views[i].numel : n;
    bool vd = i < nviews && (o->opts.decay_all || views[i].decay);
    optim_seg add[2] = {{at, vb, o->opts.decay_all}, {vb, ve, vd}};
    for (int j = 0; j < 2; j++) {
      if (add[j].end == add[j].begin)
        continue;
      if (k > 0 && o->segs[k - 1].decay == add[j].decay &&
          o->segs[k - 1].end == add[j].begin)
        o->segs[k - 1].end = add[j].end;
      else
        o->segs[k++] = add[j];
    }
    at = ve;
  }
  o->nseg = k;
  return LOOM_OK;
}

/* Zeroes a state buffer with the threads and partition the updates use, so
 * on a NUMA machine each page lands near the thread that will touch it. */
static void zero_state(float *buf, int64_t begin, int64_t end) {
  int nt = loom_optim_threads_for(end - begin);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t lo, hi;
    loom_optim_part(begin, end, omp_get_thread_num(), omp_get_num_threads(),
                    &lo, &hi);
    if (hi > lo)
      memset(buf + (lo - begin), 0, sizeof(float) * (size_t)(hi - lo));
  }
}

loom_status loom_optim_new(loom_optim **out, const loom_optim_opts *opts,
                           const loom_param *views, int nviews, int64_t n) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_optim_new: out is NULL");
  *out = NULL;
  /* NULL: the defaults, as every other constructor takes it. */
  const loom_optim_opts defaults = loom_optim_opts_default();
  if (!opts)
    opts = &defaults;
  if (n < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: layout size must be >= 0 (got %lld)",
                      (long long)n);
  if (nviews < 0 || (nviews > 0 && !views))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: %d views given but the array is %s", nviews,
                      views ? "set" : "NULL");
  LOOM_TRY(check_opts(opts, n));

  loom_status st = LOOM_OK;
  loom_optim *o = loom_calloc(1, sizeof *o);
  if (!o)
    return LOOM_ERR_NOMEM;
  o->opts = *opts;
  o->n = n;
  o->begin = opts->shard_begin;
  o->end = opts->shard_end == -1 ? n : opts->shard_end;
  o->opts.shard_end = o->end;
  LOOM_TRY_GOTO(st, build_segs(o, views, nviews), fail);

  if (opts->kind == LOOM_OPTIM_SGD) {
    if (opts->momentum != 0.0)
      o->state_names[o->nstate++] = "sgd.momentum";
  } else {
    o->state_names[o->nstate++] = "adamw.m";
    o->state_names[o->nstate++] = "adamw.v";
  }
  for (int i = 0; i < o->nstate; i++) {
    o->state[i] = loom_malloc(sizeof(float) * (size_t)(o->end - o->begin));
    if (!o->state[i]) {
      st = LOOM_ERR_NOMEM;
      goto fail;
    }
    zero_state(o->state[i], o->begin, o->end);
  }
  *out = o;
  return LOOM_OK;
fail:
  loom_optim_free(o);
  return st;
}

void loom_optim_free(loom_optim *o) {
  if (!o)
    return;
  for (int i = 0; i < OPTIM_MAX_STATE; i++)
    loom_free(o->state[i]);
  loom_free(o->segs);
  loom_free(o);
}

/* --------------------------------------------------------------- kernels */

/* The update of cnt elements of one segment: p, g from its first, state
 * index so. */
static void update_seg(const loom_optim *o, const step_consts *k, float *pp,
                       const float *gg, int64_t so, int64_t cnt, bool decay) {
  if (o->opts.kind == LOOM_OPTIM_ADAMW) {
    loom_optim_adamw(pp, gg, o->state[0] + so, o->state[1] + so, cnt, k, decay);
  } else if (o->nstate == 1) {
    loom_optim_sgd_momentum(pp, gg, o->state[0] + so, cnt, k->lr,
                            decay ? k->wd : 0.0f, k->mu, o->opts.nesterov);
  } else {
    loom_optim_sgd_plain(pp, gg, cnt, k->lr, decay ? k->wd : 0.0f);
  }
}

/* Elements a block of the update when the rounded copy is written too:
 * each block rounded while its parameters are still in L1 (p, g, two
 * state buffers and the copy: 40 KB). A multiple of 32, so the vector
 * loops' tails fall on the same elements as in one call (the same bits;
 * the updates are elementwise anyway). */
#define ROUND_BLOCK 2048

/* Updates global elements [lo, hi); p and g hold global element i at index
 * i - pbase, each state buffer at i - o->begin. */
static void update_part(const loom_optim *o, const step_consts *k, float *p,
                        const float *g, int64_t pbase, int64_t lo, int64_t hi) {
  if (hi <= lo)
    return;
  int a = 0, b = o->nseg; /* first run ending after lo */
  while (a < b) {
    int mid = a + (b - a) / 2;
    if (o->segs[mid].end <= lo)
      a = mid + 1;
    else
      b = mid;
  }
  for (int s = a; s < o->nseg && o->segs[s].begin < hi; s++) {
    int64_t x = o->segs[s].begin > lo ? o->segs[s].begin : lo;
    int64_t y = o->segs[s].end < hi ? o->segs[s].end : hi;
    bool decay = o->segs[s].decay && k->wd != 0.0f;
    float *pp = p + (x - pbase);
    const float *gg = g + (x - pbase);
    int64_t cnt = y - x, so = x - o->begin;
    if (!o->round_out) {
      update_seg(o, k, pp, gg, so, cnt, decay);
      continue;
    }
    float *rr = o->round_out + (x - pbase);
    for (int64_t at = 0; at < cnt; at += ROUND_BLOCK) {
      const int64_t bn = cnt - at < ROUND_BLOCK ? cnt - at : ROUND_BLOCK;
      update_seg(o, k, pp + at, gg + at, so + at, bn, decay);
      /* the type was checked by loom_optim_set_rounded */
      (void)loom_round_half_serial(o->round_dt, rr + at, pp + at, bn);
    }
  }
}

static loom_status step_impl(loom_optim *o, float *params, const float *grads,
                             int64_t pbase, float lr, int64_t begin,
                             int64_t end) {
  if (!o)
    return loom_error(LOOM_ERR_INVALID_ARG, "optim: optimizer is NULL");
  if (!(lr >= 0.0f) || isinf(lr))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: learning rate must be finite and >= 0 (got %g)",
                      (double)lr);
  if (begin < o->begin || end < begin || end > o->end)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: range [%lld, %lld) is not inside the shard "
                      "[%lld, %lld)",
                      (long long)begin, (long long)end, (long long)o->begin,
                      (long long)o->end);
  if (end == begin)
    return LOOM_OK;
  if (!params || !grads)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: params and grads must be set");

  const loom_optim_opts *op = &o->opts;
  step_consts k;
  memset(&k, 0, sizeof k);
  k.lr = lr;
  k.wd = (float)op->weight_decay;
  k.mu = (float)op->momentum;
  if (op->kind == LOOM_OPTIM_ADAMW) {
    double t = (double)(o->step + 1);
    double bc1 = 1.0 - pow(op->beta1, t);
    double bc2 = 1.0 - pow(op->beta2, t);
    k.b1 = (float)op->beta1;
    k.b2 = (float)op->beta2;
    k.omb1 = (float)(1.0 - op->beta1);
    k.omb2 = (float)(1.0 - op->beta2);
    k.neg_step_size = (float)(-(double)lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)op->eps;
    k.decay_factor = (float)(1.0 - (double)lr * op->weight_decay);
  }

  int nt = loom_optim_threads_for(end - begin);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t lo, hi;
    loom_optim_part(begin, end, omp_get_thread_num(), omp_get_num_threads(),
                    &lo, &hi);
    update_part(o, &k, params, grads, pbase, lo, hi);
  }
  return LOOM_OK;
}

loom_status loom_optim_step(loom_optim *o, float *params, const float *grads,
                            float lr) {
  if (!o)
    return loom_error(LOOM_ERR_INVALID_ARG, "optim: optimizer is NULL");
  LOOM_TRY(step_impl(o, params, grads, 0, lr, o->begin, o->end));
  o->step++;
  return LOOM_OK;
}

loom_status loom_optim_step_shard(loom_optim *o, float *params,
                                  const float *grads, float lr) {
  if (!o)
    return loom_error(LOOM_ERR_INVALID_ARG, "optim: optimizer is NULL");
  LOOM_TRY(step_impl(o, params, grads, o->begin, lr, o->begin, o->end));
  o->step++;
  return LOOM_OK;
}

loom_status loom_optim_step_range(loom_optim *o, float *params,
                                  const float *grads, float lr, int64_t begin,
                                  int64_t end) {
  return step_impl(o, params, grads, 0, lr, begin, end);
}

loom_status loom_optim_set_rounded(loom_optim *o, loom_dtype dt, float *out) {
  if (!o)
    return loom_error(LOOM_ERR_INVALID_ARG, "optim: optimizer is NULL");
  if (out && dt != LOOM_BF16 && dt != LOOM_F16)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: a rounded copy in %s (bf16 or f16)",
                      loom_dtype_name(dt));
  o->round_out = out;
  o->round_dt = dt;
  return LOOM_OK;
}

void loom_optim_finish_step(loom_optim *o) {
  if (o)
    o->step++;
}

int64_t loom_optim_get_step(const loom_optim *o) { return o ? o->step : 0; }

loom_status loom_optim_set_step(loom_optim *o, int64_t step) {
  if (!o)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_optim_set_step: optimizer is NULL");
  if (step < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: step must be >= 0 (got %lld)", (long long)step);
  o->step = step;
  return LOOM_OK;
}

const loom_optim_opts *loom_optim_get_opts(const loom_optim *o) {
  return o ? &o->opts : NULL;
}

int loom_optim_state_count(const loom_optim *o) { return o ? o->nstate : 0; }

loom_status loom_optim_state_get(const loom_optim *o, int i,
                                 loom_optim_state *out) {
  if (!o || !out || i < 0 || i >= o->nstate)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "optim: no state buffer %d (this optimizer has %d)", i,
                      o ? o->nstate : 0);
  out->name = o->state_names[i];
  out->data = o->state[i];
  out->begin = o->begin;
  out->count = o->end - o->begin;
  return LOOM_OK;
}
