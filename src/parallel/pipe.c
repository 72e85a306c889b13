/* Pipeline parallelism: a model's units cut into stages over the ranks of a
 * group, micro-batches through them under GPipe or 1F1B, borrowed (tied)
 * weights, and the data-parallel sum of a stage's gradient. */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "loom/parallel.h"

/* One tag per kind of message: messages between two ranks with the same
 * tag match in the order they were posted, and both sides post them in
 * micro-batch order. */
enum {
  TAG_ACT = 101,       /* activations, stage s -> s + 1 */
  TAG_GRAD = 102,      /* their gradients, s + 1 -> s */
  TAG_TIED_GRAD = 103, /* a borrowed weight's gradient, borrower -> owner */
  TAG_TIED_VAL = 104   /* its new values, owner -> borrower */
};

#define LOOM_X_NAME(name, text) text,
static const char *const schedule_names[] = {
    LOOM_PIPE_SCHEDULE_LIST(LOOM_X_NAME)};
#undef LOOM_X_NAME
_Static_assert(sizeof schedule_names / sizeof schedule_names[0] ==
                   LOOM_PIPE_SCHEDULE_COUNT,
               "a name per schedule");

const char *loom_pipe_schedule_name(loom_pipe_schedule s) {
  return (unsigned)s < LOOM_PIPE_SCHEDULE_COUNT ? schedule_names[s] : "?";
}

/* A range of the flat buffers that stage `borrower` reads and stage
 * `owner` steps. */
typedef struct borrow {
  loom_range r;
  int owner, borrower;
  float *tmp; /* (r.numel) on the owner: the borrower's gradient */
  loom_req req;
} borrow;

/* One instance of the stage and what travels with its micro-batch. */
typedef struct slot {
  loom_model *m;
  float *in;         /* (rows, ...) stage > 0: the received activations */
  float *din;        /* (rows, ...) stage > 0: their gradient, sent back */
  loom_req in_req;   /* the receive into in */
  loom_req out_req;  /* the send of the instance's output */
  loom_req dout_req; /* the receive into the instance's output gradient */
  loom_req din_req;  /* the send of din */
} slot;

struct loom_pipe {
  loom_model *model;
  loom_group *pp, *dp;
  int stage, P, M, K;
  loom_pipe_schedule schedule;
  int u0, u1;      /* units [u0, u1) */
  int64_t lo, hi;  /* owned range of the flat buffers */
  int64_t *bounds; /* (P + 1) every stage's owned range */
  loom_range *ranges;
  int nranges; /* every range read: owned and borrowed, merged */
  borrow *bor;
  int nbor;    /* every stage's borrowed ranges (the same list on every rank) */
  slot *slots; /* (K) */
  int *active; /* (max(M, ...)) micro-batches with rows, in order */
  int active_cap;
  loom_shape in_shape; /* a micro-batch's input at this stage, most rows */
  int64_t in_row;      /* floats per row of it (stage > 0) */
  int64_t chunk;
  loom_req *dp_reqs; /* (ndp x nd) */
  int ndp;
  /* ZeRO-2: the replicas' cuts of the owned range, (nd + 1) entries; NULL:
   * every chunk summed on every replica */
  int64_t *cuts;
  int nd, me;        /* replicas (1 without cuts), this one */
  int64_t *dp_final; /* (ndp) elements of each chunk final (overlap) */
  /* Compression: the dp sum in wire_dt through wire, a 16-bit copy of the
   * owned range [lo, hi) (NULL: in f32, in place in the gradient) */
  loom_dtype wire_dt;
  float wire_scale; /* D: the replicas' mean gradient on the wire, as DDP */
  void *wire;
  size_t wire_bytes;
  int dp_held; /* chunks [0, dp_held) wait for a borrowed gradient */
  int dp_next; /* chunks [dp_next, ndp) are summing; -1: none yet */
  loom_pipe_stats st;
  double wait_now; /* waits of the step under way */
  /* the timeline's observer, called while stepping (in loom_pipe_step) */
  loom_pipe_observer obs;
  void *obs_user;
  bool stepping;
  /* bf16/f16: one half copy of the parameters for every instance, of the
   * ranges the stage reads only (reserved like the flat buffers) */
  uint16_t *half;
  size_t half_bytes;
  bool half_stale;
};

loom_pipe_opts loom_pipe_opts_default(void) {
  loom_pipe_opts o;
  memset(&o, 0, sizeof o);
  o.micro_batches = 1;
  o.schedule = LOOM_PIPE_1F1B;
  o.compress = LOOM_F32;
  return o;
}

double loom_pipe_bubble_theory(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1)
    return 0;
  return (double)(stages - 1) / (double)(micro_batches + stages - 1);
}

double loom_pipe_bubble_expected(int stages, int micro_batches,
                                 const double *busy) {
  if (stages < 1 || micro_batches < 1 || !busy)
    return 0;
  double mx = 0, sum = 0;
  for (int s = 0; s < stages; s++) {
    double t = busy[s] > 0 ? busy[s] / micro_batches : 0;
    mx = t > mx ? t : mx;
    sum += t;
  }
  const double step = (micro_batches - 1) * mx + sum;
  if (step <= 0)
    return 0;
  double idle = 0;
  for (int s = 0; s < stages; s++)
    idle += 1 - (busy[s] > 0 ? busy[s] : 0) / step;
  return idle / stages;
}

/* --------------------------------------------------------- partitioning */

loom_status loom_pipe_partition(int n, int P, const int *split,
                                const double *cost, int *first) {
  if (P < 1 || n < P)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "pipeline: %d stages for %d units (at least one unit a "
                      "stage)",
                      P, n);
  first[0] = 0;
  if (split) {
    for (int s = 0; s < P; s++) {
      if (split[s] < 1)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "pipeline: stage %d of the split has %d units", s,
                          split[s]);
      first[s + 1] = first[s] + split[s];
    }
    if (first[P] != n)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "pipeline: the split has %d units, the model %d",
                        first[P], n);
    return LOOM_OK;
  }
  /* best[s][j]: the least largest stage cost of units [0, j) in s + 1
   * stages; cut[s][j] where its last stage begins (the linear partition
   * problem, dynamic programming in O(P n^2)). */
  double *pre = loom_calloc((size_t)n + 1, sizeof *pre);
  double *best = loom_calloc((size_t)P * (size_t)(n + 1), sizeof *best);
  int *cut = loom_calloc((size_t)P * (size_t)(n + 1), sizeof *cut);
  if (!pre || !best || !cut) {
    loom_free(pre);
    loom_free(best);
    loom_free(cut);
    return LOOM_ERR_NOMEM;
  }
  for (int j = 0; j < n; j++)
    pre[j + 1] = pre[j] + (cost ? cost[j] : 1.0);
#define B(s, j) best[(size_t)(s) * (size_t)(n + 1) + (size_t)(j)]
#define C(s, j) cut[(size_t)(s) * (size_t)(n + 1) + (size_t)(j)]
  for (int j = 1; j <= n; j++)
    B(0, j) = pre[j];
  for (int s = 1; s < P; s++)
    for (int j = s + 1; j <= n; j++) {
      B(s, j) = INFINITY;
      /* the last stage is [i, j), at least one unit; s stages before */
      for (int i = s; i < j; i++) {
        double last = pre[j] - pre[i];
        double v = B(s - 1, i) > last ? B(s - 1, i) : last;
        if (v < B(s, j)) { /* strict: the earliest cut of equal cost */
          B(s, j) = v;
          C(s, j) = i;
        }
      }
    }
  int j = n;
  first[P] = n;
  for (int s = P - 1; s >= 1; s--) {
    j = C(s, j);
    first[s] = j;
  }
#undef B
#undef C
  loom_free(pre);
  loom_free(best);
  loom_free(cut);
  return LOOM_OK;
}

/* ----------------------------------------------------------------- setup */

/* Units own contiguous, ascending ranges in forward order. */
loom_status loom_pipe_own_bounds(const loom_model *m, int64_t *cum) {
  int n = loom_model_num_units(m);
  cum[0] = 0;
  for (int u = 0; u < n; u++) {
    int nr;
    const loom_range *r = loom_model_unit_ranges(m, u, &nr);
    cum[u + 1] = cum[u];
    for (int k = 0; k < nr; k++) {
      if (r[k].offset + r[k].numel <= cum[u])
        continue; /* borrowed */
      if (r[k].offset != cum[u + 1])
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "pipeline: unit %d (%s) has parameters at %lld, "
                          "expected %lld: the units' parameters must follow "
                          "each other in forward order",
                          u, loom_model_unit_name(m, u), (long long)r[k].offset,
                          (long long)cum[u + 1]);
      cum[u + 1] = r[k].offset + r[k].numel;
    }
  }
  if (cum[n] != loom_model_num_params(m))
    return loom_error(LOOM_ERR_INTERNAL,
                      "pipeline: the units own %lld of %lld parameters",
                      (long long)cum[n], (long long)loom_model_num_params(m));
  return LOOM_OK;
}

/* The borrowed ranges of every stage, and this stage's ranges. */
static loom_status find_borrows(loom_pipe *p, const int *first,
                                const int64_t *cum) {
  const loom_model *m = p->model;
  int n = loom_model_num_units(m), total = 0;
  for (int u = 0; u < n; u++) {
    int nr;
    (void)loom_model_unit_ranges(m, u, &nr);
    total += nr;
  }
  p->bor = loom_calloc((size_t)(total ? total : 1), sizeof *p->bor);
  p->ranges = loom_calloc((size_t)total + 1, sizeof *p->ranges);
  loom_range *tmp = loom_calloc((size_t)(total ? total : 1), sizeof *tmp);
  if (!p->bor || !p->ranges || !tmp) {
    loom_free(tmp);
    return LOOM_ERR_NOMEM;
  }
  for (int s = 0; s < p->P; s++) {
    int64_t lo = cum[first[s]], hi = cum[first[s + 1]];
    int nt = 0;
    for (int u = first[s]; u < first[s + 1]; u++) {
      int nr;
      const loom_range *r = loom_model_unit_ranges(m, u, &nr);
      for (int k = 0; k < nr; k++)
        if (r[k].offset < lo || r[k].offset + r[k].numel > hi)
          tmp[nt++] = r[k];
    }
    nt = loom_ranges_merge(tmp, nt);
    for (int k = 0; k < nt; k++) {
      int owner = -1;
      for (int o = 0; o < p->P; o++)
        if (tmp[k].offset >= cum[first[o]] &&
            tmp[k].offset + tmp[k].numel <= cum[first[o + 1]])
          owner = o;
      if (owner < 0 || owner == s) {
        loom_free(tmp);
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "pipeline: stage %d reads parameters [%lld, %lld) "
                          "that span several stages",
                          s, (long long)tmp[k].offset,
                          (long long)(tmp[k].offset + tmp[k].numel));
      }
      p->bor[p->nbor++] = (borrow){.r = tmp[k], .owner = owner, .borrower = s};
    }
    if (s == p->stage) {
      p->ranges[0] = (loom_range){lo, hi - lo};
      memcpy(p->ranges + 1, tmp, (size_t)nt * sizeof *tmp);
      p->nranges = loom_ranges_merge(p->ranges, nt + 1);
    }
  }
  loom_free(tmp);
  for (int i = 0; i < p->nbor; i++)
    if (p->bor[i].owner == p->stage) {
      p->bor[i].tmp = loom_malloc((size_t)p->bor[i].r.numel * sizeof(float));
      if (!p->bor[i].tmp)
        return LOOM_ERR_NOMEM;
    }
  return LOOM_OK;
}

/* This stage's input shape for the micro-batch input `in` of stage 0: the
 * units before it, dry-run on the model's root. */
static loom_status stage_shapes(loom_pipe *p, const loom_shape *in) {
  loom_module *root = loom_model_root(p->model);
  loom_shape x = *in;
  for (int u = 0; u < p->u0; u++)
    LOOM_TRY(loom_nn_plan_dry((loom_module *)loom_sequential_child(root, u), &x,
                              &x));
  p->in_shape = x;
  p->in_row = x.ndim > 0 && x.dim[0] > 0 ? loom_shape_numel(&x) / x.dim[0] : 0;
  if (p->stage > 0 && x.dtype != LOOM_F32)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "pipeline: stage %d's input is %s, not f32", p->stage,
                      loom_dtype_name(x.dtype));
  return LOOM_OK;
}

static loom_status make_slots(loom_pipe *p, loom_pipe_model_fn make,
                              void *user) {
  p->slots = loom_calloc((size_t)p->K, sizeof *p->slots);
  if (!p->slots)
    return LOOM_ERR_NOMEM;
  float *params = loom_model_params(p->model);
  float *grads = loom_model_grads(p->model);
  if (!params || !grads)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "pipeline: the model has no parameter or gradient "
                      "buffer to share");
  size_t bytes = (size_t)(p->in_shape.dim[0] * p->in_row) * sizeof(float);
  for (int k = 0; k < p->K; k++) {
    slot *sl = &p->slots[k];
    LOOM_TRY(make(user, &sl->m));
    if (loom_model_layout_hash(sl->m) != loom_model_layout_hash(p->model))
      return loom_error(LOOM_ERR_MISMATCH,
                        "pipeline: an instance's layout differs from the "
                        "model's");
    loom_model_bind_params(sl->m, params);
    loom_model_bind_grads(sl->m, grads);
    LOOM_TRY(loom_model_set_unit_range(sl->m, p->u0, p->u1));
    if (p->stage > 0) {
      sl->in = loom_malloc(bytes ? bytes : 1);
      sl->din = loom_malloc(bytes ? bytes : 1);
      if (!sl->in || !sl->din)
        return loom_error_context(LOOM_ERR_NOMEM,
                                  "pipeline: activation buffers");
    }
    /* plan now for the largest micro-batch: no allocation in the steps */
    loom_shape s = p->in_shape;
    LOOM_TRY(loom_model_plan(sl->m, &s));
  }
  return LOOM_OK;
}

loom_status loom_pipe_new(loom_pipe **out, loom_model *model, loom_group *pp,
                          loom_group *dp, loom_pipe_model_fn make, void *user,
                          const loom_pipe_opts *opts) {
  *out = NULL;
  loom_pipe_opts o = opts ? *opts : loom_pipe_opts_default();
  if (o.micro_batches < 1 || (unsigned)o.schedule >= LOOM_PIPE_SCHEDULE_COUNT ||
      !make || o.input.ndim < 1 || o.input.dim[0] < 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "pipeline: bad options (micro-batches %d, schedule %d, "
                      "an input shape and a function that makes instances "
                      "are needed)",
                      o.micro_batches, (int)o.schedule);
  if (o.compress != LOOM_F32 && o.compress != LOOM_BF16 &&
      o.compress != LOOM_F16)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "pipeline: compression to %s is not supported (f32, "
                      "bf16 or f16)",
                      loom_dtype_name(o.compress));
  int n = loom_model_num_units(model);
  loom_pipe *p = loom_calloc(1, sizeof *p);
  int *first = NULL;
  int64_t *cum = NULL;
  if (!p)
    return LOOM_ERR_NOMEM;
  loom_status s = LOOM_OK;
  p->model = model;
  p->pp = pp;
  p->dp = dp && loom_group_size(dp) > 1 ? dp : NULL;
  p->stage = loom_group_rank(pp);
  p->P = loom_group_size(pp);
  p->M = o.micro_batches;
  p->schedule = o.schedule;
  /* GPipe keeps every micro-batch's activations until its backward; 1F1B
   * at most P - s on stage s (its warm-up forwards and one more). */
  p->K = o.schedule == LOOM_PIPE_GPIPE ? p->M
         : p->M < p->P - p->stage      ? p->M
                                       : p->P - p->stage;
  first = loom_calloc((size_t)p->P + 1, sizeof *first);
  cum = loom_calloc((size_t)n + 1, sizeof *cum);
  p->active_cap = p->M;
  p->active = loom_calloc((size_t)p->active_cap, sizeof *p->active);
  if (!first || !cum || !p->active) {
    s = LOOM_ERR_NOMEM;
    goto fail;
  }
  LOOM_TRY_GOTO(s, loom_pipe_partition(n, p->P, o.split, o.unit_cost, first),
                fail);
  LOOM_TRY_GOTO(s, loom_pipe_own_bounds(model, cum), fail);
  p->u0 = first[p->stage];
  p->u1 = first[p->stage + 1];
  p->lo = cum[p->u0];
  p->hi = cum[p->u1];
  p->bounds = loom_calloc((size_t)p->P + 1, sizeof *p->bounds);
  if (!p->bounds) {
    s = LOOM_ERR_NOMEM;
    goto fail;
  }
  for (int k = 0; k <= p->P; k++)
    p->bounds[k] = cum[first[k]];
  LOOM_TRY_GOTO(s, find_borrows(p, first, cum), fail);
  LOOM_TRY_GOTO(s, stage_shapes(p, &o.input), fail);
  LOOM_TRY_GOTO(s, make_slots(p, make, user), fail);
  if (loom_model_precision(p->slots[0].m) != LOOM_F32) {
    size_t np = (size_t)loom_model_num_params(model);
    p->half_bytes = (np ? np : 1) * sizeof(uint16_t);
    p->half = loom_vmem_new(p->half_bytes);
    if (!p->half) {
      s = loom_error_context(LOOM_ERR_NOMEM, "pipeline: the half copy");
      goto fail;
    }
    for (int k = 0; k < p->K; k++)
      loom_model_bind_half(p->slots[k].m, p->half);
    p->half_stale = true;
  }
  if (p->dp) {
    int64_t len = p->hi - p->lo;
    p->chunk = o.chunk > 0 ? o.chunk : (len > 0 ? len : 1);
    p->ndp = len > 0 ? (int)((len + p->chunk - 1) / p->chunk) : 0;
    p->dp_reqs = loom_calloc((size_t)(p->ndp ? p->ndp : 1), sizeof(loom_req));
    p->dp_final = loom_calloc((size_t)(p->ndp ? p->ndp : 1), sizeof(int64_t));
    if (!p->dp_reqs || !p->dp_final) {
      s = LOOM_ERR_NOMEM;
      goto fail;
    }
    /* A chunk holding a range another stage borrows gets that stage's
     * gradient added in loom_pipe_finish_grads: it and the chunks below
     * it (the sums start from the top) wait for it. */
    for (int i = 0; i < p->nbor; i++)
      if (p->bor[i].owner == p->stage) {
        int64_t e = p->bor[i].r.offset + p->bor[i].r.numel - p->lo;
        int c = (int)((e + p->chunk - 1) / p->chunk);
        if (c > p->dp_held)
          p->dp_held = c;
      }
    p->dp_next = -1;
    p->wire_dt = o.compress;
    p->wire_scale = (float)loom_group_size(p->dp);
    if (o.compress != LOOM_F32 && len > 0) {
      /* one copy of the whole range: every chunk may be in flight at once
       * (posted from the last backward, waited for together) */
      p->wire_bytes = (size_t)len * loom_dtype_size(o.compress);
      p->wire = loom_vmem_new(p->wire_bytes);
      if (!p->wire) {
        s = loom_error_context(LOOM_ERR_NOMEM, "pipeline: the wire copy");
        goto fail;
      }
      loom_mem_add(LOOM_MEM_COMM, p->wire_bytes);
    }
  }
  p->nd = 1;
  loom_free(first);
  loom_free(cum);
  *out = p;
  return LOOM_OK;
fail:
  loom_free(first);
  loom_free(cum);
  loom_pipe_free(p);
  return s;
}

void loom_pipe_free(loom_pipe *p) {
  if (!p)
    return;
  for (int k = 0; p->slots && k < p->K; k++) {
    slot *sl = &p->slots[k];
    /* nothing may still write into the buffers */
    (void)loom_wait(&sl->in_req);
    (void)loom_wait(&sl->out_req);
    (void)loom_wait(&sl->dout_req);
    (void)loom_wait(&sl->din_req);
    loom_model_free(sl->m);
    loom_free(sl->in);
    loom_free(sl->din);
  }
  for (int i = 0; p->bor && i < p->nbor; i++) {
    (void)loom_wait(&p->bor[i].req);
    loom_free(p->bor[i].tmp);
  }
  if (p->dp_reqs)
    (void)loom_wait_all(p->dp_reqs, (size_t)p->ndp * (size_t)p->nd);
  if (p->wire) {
    loom_mem_sub(LOOM_MEM_COMM, p->wire_bytes);
    loom_vmem_free(p->wire, p->wire_bytes);
  }
  loom_free(p->slots);
  loom_free(p->bor);
  loom_free(p->ranges);
  loom_free(p->bounds);
  loom_free(p->active);
  loom_free(p->dp_reqs);
  loom_free(p->dp_final);
  loom_free(p->cuts);
  loom_vmem_free(p->half, p->half_bytes);
  loom_free(p);
}

void loom_pipe_params_updated(loom_pipe *p) { p->half_stale = true; }

size_t loom_pipe_half_bytes(const loom_pipe *p) {
  if (!p->half)
    return 0;
  size_t n = 0;
  for (int k = 0; k < p->nranges; k++)
    n += (size_t)p->ranges[k].numel;
  return n * sizeof(uint16_t);
}

/* The instances' half copy, made again after a change of the parameters:
 * the stage's own ranges and those it borrows. */
static loom_status refresh_half(loom_pipe *p) {
  if (!p->half || !p->half_stale)
    return LOOM_OK;
  LOOM_TRY(loom_model_refresh_half(p->slots[0].m, p->ranges, p->nranges));
  p->half_stale = false;
  return LOOM_OK;
}

int loom_pipe_stage(const loom_pipe *p) { return p->stage; }
int loom_pipe_stages(const loom_pipe *p) { return p->P; }
int loom_pipe_instances(const loom_pipe *p) { return p->K; }

void loom_pipe_units(const loom_pipe *p, int *first, int *end) {
  *first = p->u0;
  *end = p->u1;
}

void loom_pipe_owned(const loom_pipe *p, int64_t *lo, int64_t *hi) {
  *lo = p->lo;
  *hi = p->hi;
}

void loom_pipe_bounds(const loom_pipe *p, int64_t *bounds) {
  memcpy(bounds, p->bounds, (size_t)(p->P + 1) * sizeof *bounds);
}

size_t loom_pipe_act_bytes(const loom_pipe *p) {
  size_t b = 0;
  for (int k = 0; k < p->K; k++) {
    b += loom_model_arena_bytes(p->slots[k].m);
    if (p->slots[k].in)
      b += 2 * (size_t)(p->in_shape.dim[0] * p->in_row) * sizeof(float);
  }
  return b;
}

const loom_range *loom_pipe_ranges(const loom_pipe *p, int *n) {
  *n = p->nranges;
  return p->ranges;
}

void loom_pipe_set_training(loom_pipe *p, bool training) {
  for (int k = 0; k < p->K; k++)
    loom_model_set_training(p->slots[k].m, training);
}

void loom_pipe_zero_grad(loom_pipe *p) {
  float *g = loom_model_grads(p->model);
  for (int i = 0; i < p->nranges; i++)
    memset(g + p->ranges[i].offset, 0,
           (size_t)p->ranges[i].numel * sizeof(float));
}

/* ------------------------------------------------------------ schedules */

void loom_pipe_set_observer(loom_pipe *p, loom_pipe_observer fn, void *user) {
  p->obs = fn;
  p->obs_user = user;
}

/* A span of the step for the observer, if any. */
static void observe(const loom_pipe *p, loom_pipe_event ev, int mb, double t0,
                    double t1) {
  if (p->obs && p->stepping)
    p->obs(p->obs_user, ev, mb, t0, t1);
}

/* Waits for a request; the time blocked counts as waiting for neighbours
 * (for micro-batch mb; -1: the drain). */
static loom_status wait_timed(loom_pipe *p, loom_req *r, int mb) {
  bool done;
  loom_status s = loom_test(r, &done);
  if (done)
    return s;
  double t0 = loom_time_now();
  s = loom_wait(r);
  double t1 = loom_time_now();
  p->wait_now += t1 - t0;
  observe(p, LOOM_PIPE_EV_WAIT, mb, t0, t1);
  return s;
}

static loom_shape rows_shape(const loom_shape *s, int64_t rows) {
  loom_shape x = *s;
  x.dim[0] = rows;
  return x;
}

/* Posts the receive of the activations of active micro-batch i (stage >
 * 0) into its slot's input buffer. */
static loom_status post_recv(loom_pipe *p, const int64_t *rows, int n, int i) {
  if (p->stage == 0 || i >= n)
    return LOOM_OK;
  slot *sl = &p->slots[i % p->K];
  size_t count = (size_t)(rows[p->active[i]] * p->in_row);
  return loom_recv(sl->in, count, LOOM_F32, p->stage - 1, TAG_ACT, p->pp,
                   &sl->in_req);
}

/* Forward of active micro-batch i; in training the receive of its output
 * gradient is posted (stage < P - 1) or the loss writes it (last). */
static loom_status fwd(loom_pipe *p, const int64_t *rows, int n, int i,
                       const loom_pipe_io *io, bool train) {
  int mb = p->active[i];
  slot *sl = &p->slots[i % p->K];
  bool last = p->stage == p->P - 1;
  loom_tensor x;
  memset(&x, 0, sizeof x);
  if (p->stage > 0) {
    LOOM_TRY(wait_timed(p, &sl->in_req, mb));
    loom_shape s = rows_shape(&p->in_shape, rows[mb]);
    x = loom_tensor_view(sl->in, LOOM_F32, s.ndim, s.dim);
  }
  /* the instance's output is about to be overwritten */
  LOOM_TRY(wait_timed(p, &sl->out_req, mb));
  double t0 = loom_time_now();
  LOOM_TRY(io->prepare(io->user, mb, sl->m, p->stage == 0 ? &x : NULL));
  loom_tensor y;
  LOOM_TRY(loom_model_forward(sl->m, &x, &y));
  size_t ny = (size_t)loom_tensor_numel(&y);
  if (last) {
    loom_tensor dy;
    if (train)
      LOOM_TRY(loom_model_output_grad(sl->m, &dy));
    LOOM_TRY(io->loss(io->user, mb, &y, train ? &dy : NULL));
  }
  double t1 = loom_time_now();
  p->st.forward_s += t1 - t0;
  observe(p, LOOM_PIPE_EV_FORWARD, mb, t0, t1);
  if (!last) {
    LOOM_TRY(loom_send(y.data, ny, LOOM_F32, p->stage + 1, TAG_ACT, p->pp,
                       &sl->out_req));
    if (train) {
      loom_tensor dy;
      LOOM_TRY(loom_model_output_grad(sl->m, &dy));
      LOOM_TRY(loom_recv(dy.data, ny, LOOM_F32, p->stage + 1, TAG_GRAD, p->pp,
                         &sl->dout_req));
    }
  }
  if (train || p->stage == 0)
    return LOOM_OK;
  /* Forward only: the input is free for the next micro-batch of the slot,
   * unless the output being sent is a view of it (a module may give one). */
  const float *yd = y.data;
  if (yd >= sl->in && yd < sl->in + p->in_shape.dim[0] * p->in_row)
    LOOM_TRY(wait_timed(p, &sl->out_req, mb));
  return post_recv(p, rows, n, i + p->K);
}

loom_status loom_pipe_set_cuts(loom_pipe *p, const int64_t *cuts) {
  if (!p->dp)
    return LOOM_OK;
  int nd = loom_group_size(p->dp);
  if (cuts[0] != p->lo || cuts[nd] != p->hi)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "pipeline: the replicas' cuts [%lld, %lld) are not the "
                      "stage's range [%lld, %lld)",
                      (long long)cuts[0], (long long)cuts[nd], (long long)p->lo,
                      (long long)p->hi);
  for (int d = 0; d < nd; d++)
    if (cuts[d + 1] < cuts[d])
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "pipeline: cut %d of the stage's range ends before "
                        "it begins",
                        d);
  int64_t *c = loom_calloc((size_t)nd + 1, sizeof *c);
  loom_req *r =
      loom_calloc((size_t)(p->ndp ? p->ndp : 1) * (size_t)nd, sizeof *r);
  if (!c || !r) {
    loom_free(c);
    loom_free(r);
    return LOOM_ERR_NOMEM;
  }
  memcpy(c, cuts, ((size_t)nd + 1) * sizeof *c);
  loom_free(p->cuts);
  loom_free(p->dp_reqs);
  p->cuts = c;
  p->dp_reqs = r;
  p->nd = nd;
  p->me = loom_group_rank(p->dp);
  return LOOM_OK;
}

/* Starts the dp sum of chunk c (chunks start from the top, in the same
 * order on every replica of the stage). With cuts, each piece of the chunk
 * is reduced to the replica whose cut holds it: a reduce-scatter's volume,
 * half an all-reduce's. Compressed, the chunk is converted into the wire
 * copy here, when it is final (from final_hook, or after the borrowed
 * gradients were added), times D and averaged: the replica's own mean
 * gradient on the wire and the same sum, as DDP's buckets. */
static loom_status post_chunk(loom_pipe *p, int c) {
  int64_t a = p->lo + (int64_t)c * p->chunk;
  int64_t e = a + p->chunk < p->hi ? a + p->chunk : p->hi;
  /* buf holds element x of the flat layout at buf + (x - base) * es */
  char *buf = (char *)loom_model_grads(p->model);
  int64_t base = 0;
  loom_dtype dt = LOOM_F32;
  loom_redop op = LOOM_SUM;
  if (p->wire) {
    dt = p->wire_dt;
    op = LOOM_AVG;
    buf = p->wire;
    base = p->lo;
    loom_wire_pack(buf + (size_t)(a - base) * loom_dtype_size(dt),
                   loom_model_grads(p->model) + a, e - a, dt, p->wire_scale);
  }
  size_t es = loom_dtype_size(dt);
  p->dp_next = c;
  p->st.dp_chunks++;
  p->st.dp_wire_bytes += (e - a) * (int64_t)es;
  if (!p->cuts) {
    char *at = buf + (size_t)(a - base) * es;
    return loom_allreduce(at, at, (size_t)(e - a), dt, op, p->dp,
                          &p->dp_reqs[c]);
  }
  for (int d = 0; d < p->nd; d++) {
    int64_t x = a > p->cuts[d] ? a : p->cuts[d];
    int64_t y = e < p->cuts[d + 1] ? e : p->cuts[d + 1];
    if (x >= y)
      continue;
    char *at = buf + (size_t)(x - base) * es;
    LOOM_TRY(loom_reduce(at, d == p->me ? at : NULL, (size_t)(y - x), dt, op, d,
                         p->dp,
                         &p->dp_reqs[(size_t)c * (size_t)p->nd + (size_t)d]));
  }
  return LOOM_OK;
}

/* The last backward's gradient hook: a parameter's gradient is final;
 * every chunk above the held ones whose elements all are starts its sum. */
static loom_status final_hook(void *user, int index, int64_t offset,
                              int64_t numel) {
  (void)index;
  loom_pipe *p = user;
  int64_t a = offset > p->lo ? offset : p->lo;
  int64_t e = offset + numel < p->hi ? offset + numel : p->hi;
  for (int64_t x = a; x < e;) {
    int c = (int)((x - p->lo) / p->chunk);
    int64_t ce = p->lo + (int64_t)(c + 1) * p->chunk;
    int64_t y = ce < e ? ce : e;
    p->dp_final[c] += y - x;
    x = y;
  }
  int c = p->dp_next < 0 ? p->ndp - 1 : p->dp_next - 1;
  for (; c >= p->dp_held; c--) {
    int64_t len =
        (c == p->ndp - 1 ? p->hi : p->lo + (int64_t)(c + 1) * p->chunk) -
        (p->lo + (int64_t)c * p->chunk);
    if (p->dp_final[c] < len)
      break;
    LOOM_TRY(post_chunk(p, c));
    p->st.dp_chunks_early++;
  }
  return LOOM_OK;
}

/* Backward of active micro-batch i: its input gradient goes back to the
 * stage before, whose next activations can then come into the slot. */
static loom_status bwd(loom_pipe *p, const int64_t *rows, int n, int i,
                       bool last) {
  int mb = p->active[i];
  slot *sl = &p->slots[i % p->K];
  if (p->stage < p->P - 1)
    LOOM_TRY(wait_timed(p, &sl->dout_req, mb));
  loom_tensor din;
  if (p->stage > 0) {
    LOOM_TRY(wait_timed(p, &sl->din_req, mb));
    loom_shape s = rows_shape(&p->in_shape, rows[mb]);
    din = loom_tensor_view(sl->din, LOOM_F32, s.ndim, s.dim);
  }
  double t0 = loom_time_now();
  /* stage 0's last backward of the step: the dp sums start in it */
  bool early = last && p->dp && p->stage == 0 && i == n - 1 && p->ndp > 0;
  if (early) {
    memset(p->dp_final, 0, (size_t)p->ndp * sizeof *p->dp_final);
    loom_model_set_grad_hook(sl->m, final_hook, p);
  }
  loom_status s = loom_model_backward(sl->m, NULL, p->stage > 0 ? &din : NULL);
  if (early)
    loom_model_set_grad_hook(sl->m, NULL, NULL);
  LOOM_TRY(s);
  double t1 = loom_time_now();
  p->st.backward_s += t1 - t0;
  observe(p, LOOM_PIPE_EV_BACKWARD, mb, t0, t1);
  if (p->stage == 0)
    return LOOM_OK;
  LOOM_TRY(loom_send(sl->din, (size_t)(rows[mb] * p->in_row), LOOM_F32,
                     p->stage - 1, TAG_GRAD, p->pp, &sl->din_req));
  return post_recv(p, rows, n, i + p->K);
}

/* The micro-batches with rows, in order, into p->active; their number in
 * *n, or the error of a micro-batch larger than planned. */
static loom_status list_active(loom_pipe *p, int m, const int64_t *rows,
                               int *n) {
  *n = 0;
  for (int mb = 0; mb < m; mb++) {
    if (rows[mb] > p->in_shape.dim[0] || rows[mb] < 0)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "pipeline: a micro-batch has more rows than planned "
                        "(%lld)",
                        (long long)p->in_shape.dim[0]);
    if (rows[mb] > 0)
      p->active[(*n)++] = mb;
  }
  return LOOM_OK;
}

/* Every send and receive of the slots complete. */
static loom_status drain(loom_pipe *p) {
  loom_status first = LOOM_OK;
  for (int k = 0; k < p->K; k++) {
    slot *sl = &p->slots[k];
    loom_req *r[] = {&sl->in_req, &sl->out_req, &sl->dout_req, &sl->din_req};
    for (size_t j = 0; j < sizeof r / sizeof r[0]; j++) {
      loom_status s = wait_timed(p, r[j], -1);
      if (first == LOOM_OK)
        first = s;
    }
  }
  return first;
}

/* A training step's schedule over the n active micro-batches. */
static loom_status run_schedule(loom_pipe *p, const int64_t *rows, int n,
                                const loom_pipe_io *io) {
  for (int i = 0; i < p->K && i < n; i++)
    LOOM_TRY(post_recv(p, rows, n, i));
  if (p->schedule == LOOM_PIPE_GPIPE) {
    /* GPipe: every forward, then every backward (in micro-batch order,
     * as 1F1B, so that both add the same gradients in the same order). */
    for (int i = 0; i < n; i++)
      LOOM_TRY(fwd(p, rows, n, i, io, true));
    for (int i = 0; i < n; i++)
      LOOM_TRY(bwd(p, rows, n, i, io->last));
  } else {
    /* 1F1B (PipeDream-Flush, Narayanan et al. 2021, fig. 4): P - s - 1
     * warm-up forwards, then one forward and one backward in turn, then
     * the remaining backwards. */
    int w = p->P - p->stage - 1;
    if (w > n)
      w = n;
    for (int i = 0; i < w; i++)
      LOOM_TRY(fwd(p, rows, n, i, io, true));
    for (int i = 0; i + w < n; i++) {
      LOOM_TRY(fwd(p, rows, n, i + w, io, true));
      LOOM_TRY(bwd(p, rows, n, i, io->last));
    }
    for (int i = n - w; i < n; i++)
      LOOM_TRY(bwd(p, rows, n, i, io->last));
  }
  return drain(p);
}

loom_status loom_pipe_step(loom_pipe *p, const int64_t *rows,
                           const loom_pipe_io *io) {
  int n;
  LOOM_TRY(list_active(p, p->M, rows, &n));
  LOOM_TRY(refresh_half(p));
  double t0 = loom_time_now();
  p->wait_now = 0;
  p->stepping = true; /* the observer sees this step's spans */
  loom_status s = run_schedule(p, rows, n, io);
  p->stepping = false;
  LOOM_TRY(s);
  double el = loom_time_now() - t0;
  p->st.steps++;
  p->st.step_s += el;
  p->st.wait_s += p->wait_now;
  p->st.last_step_s = el;
  p->st.last_wait_s = p->wait_now;
  return LOOM_OK;
}

loom_status loom_pipe_forward(loom_pipe *p, int n, const int64_t *rows,
                              const loom_pipe_io *io) {
  if (n > p->active_cap) {
    int *a = loom_calloc((size_t)n, sizeof *a);
    if (!a)
      return LOOM_ERR_NOMEM;
    loom_free(p->active);
    p->active = a;
    p->active_cap = n;
  }
  int na;
  LOOM_TRY(list_active(p, n, rows, &na));
  LOOM_TRY(refresh_half(p));
  for (int i = 0; i < p->K && i < na; i++)
    LOOM_TRY(post_recv(p, rows, na, i));
  for (int i = 0; i < na; i++)
    LOOM_TRY(fwd(p, rows, na, i, io, false));
  return drain(p);
}

/* ------------------------------------------------- gradients, weights */

loom_status loom_pipe_finish_grads(loom_pipe *p) {
  float *g = loom_model_grads(p->model);
  double t0 = loom_time_now();
  for (int i = 0; i < p->nbor; i++) {
    borrow *b = &p->bor[i];
    if (b->borrower == p->stage)
      LOOM_TRY(loom_send(g + b->r.offset, (size_t)b->r.numel, LOOM_F32,
                         b->owner, TAG_TIED_GRAD, p->pp, &b->req));
    else if (b->owner == p->stage)
      LOOM_TRY(loom_recv(b->tmp, (size_t)b->r.numel, LOOM_F32, b->borrower,
                         TAG_TIED_GRAD, p->pp, &b->req));
  }
  for (int i = 0; i < p->nbor; i++) {
    borrow *b = &p->bor[i];
    if (b->borrower != p->stage && b->owner != p->stage)
      continue;
    LOOM_TRY(loom_wait(&b->req));
    if (b->owner == p->stage) {
      float *d = g + b->r.offset;
      for (int64_t j = 0; j < b->r.numel; j++)
        d[j] += b->tmp[j];
    }
  }
  if (p->dp) {
    /* the chunks not started during the last backward, from the top */
    int c = p->dp_next < 0 ? p->ndp - 1 : p->dp_next - 1;
    loom_status s = LOOM_OK;
    for (; c >= 0 && s == LOOM_OK; c--)
      s = post_chunk(p, c);
    loom_status w = loom_wait_all(p->dp_reqs, (size_t)p->ndp * (size_t)p->nd);
    p->dp_next = -1;
    LOOM_TRY(s);
    LOOM_TRY(w);
    if (p->wire) {
      /* the sum back into the f32 gradient: the whole range, or with cuts
       * the rank's cut (the rest of the copy holds other replicas'
       * pieces, unreduced here), then the copy's pages given back */
      int64_t x = p->cuts ? p->cuts[p->me] : p->lo;
      int64_t y = p->cuts ? p->cuts[p->me + 1] : p->hi;
      size_t es = loom_dtype_size(p->wire_dt);
      loom_wire_unpack(g + x, (const char *)p->wire + (size_t)(x - p->lo) * es,
                       y - x, p->wire_dt);
      if (p->cuts)
        loom_vmem_release(p->wire, 0, p->wire_bytes);
    }
  }
  p->st.sync_s += loom_time_now() - t0;
  return LOOM_OK;
}

loom_status loom_pipe_grad_sumsq(loom_pipe *p, double *out) {
  const float *g = loom_model_grads(p->model);
  double mine = loom_grad_sumsq(g + p->lo, p->hi - p->lo);
  loom_req r = LOOM_REQ_INIT;
  LOOM_TRY(loom_allreduce(&mine, out, 1, LOOM_F64, LOOM_SUM, p->pp, &r));
  return loom_wait(&r);
}

loom_status loom_pipe_sync_params(loom_pipe *p) {
  float *w = loom_model_params(p->model);
  double t0 = loom_time_now();
  for (int i = 0; i < p->nbor; i++) {
    borrow *b = &p->bor[i];
    if (b->owner == p->stage)
      LOOM_TRY(loom_send(w + b->r.offset, (size_t)b->r.numel, LOOM_F32,
                         b->borrower, TAG_TIED_VAL, p->pp, &b->req));
    else if (b->borrower == p->stage)
      LOOM_TRY(loom_recv(w + b->r.offset, (size_t)b->r.numel, LOOM_F32,
                         b->owner, TAG_TIED_VAL, p->pp, &b->req));
  }
  for (int i = 0; i < p->nbor; i++)
    if (p->bor[i].owner == p->stage || p->bor[i].borrower == p->stage)
      LOOM_TRY(loom_wait(&p->bor[i].req));
  p->st.sync_s += loom_time_now() - t0;
  return LOOM_OK;
}

/* ------------------------------------------------------------ statistics */

void loom_pipe_get_stats(const loom_pipe *p, loom_pipe_stats *out) {
  *out = p->st;
}

void loom_pipe_reset_stats(loom_pipe *p) { memset(&p->st, 0, sizeof p->st); }
