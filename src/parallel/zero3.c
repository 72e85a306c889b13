/* ZeRO-3: the model's parameters sharded over the ranks, each unit's
 * gathered just before it runs (forward and backward), the next one
 * prefetched, and given back after (Rajbhandari et al., ZeRO, SC'20,
 * stage P_os+g+p: 16Ψ/N bytes per rank for Adam in f32). */
#include <stdlib.h>
#include <string.h>

#include "loom/parallel.h"

/* A unit's parameters: not here, being gathered, or here. */
typedef enum { U_OUT, U_COMING, U_IN } unit_state;

typedef struct z3_range {
  int64_t a, b;   /* [a, b) of the flat buffer */
  size_t *counts; /* (world) elements of each rank's slice in it */
  loom_req req;
} z3_range;

/* A gathered unit: one or more consecutive model units (shard_unit). */
typedef struct z3_unit {
  int first, n;   /* its ranges in z->ranges */
  int head, tail; /* its first and last model unit */
  unit_state state;
} z3_unit;

struct loom_zero3 {
  loom_model *model;
  loom_group *group;
  int rank, world;
  int64_t n;
  const int64_t *bounds;
  int64_t lo, hi;
  float *params; /* (N) reserved: the slice, and the units gathered */
  loom_zero3_opts opts;
  int nunits;
  z3_unit *units;   /* (nunits) */
  int *group_of;    /* (model units) each one's unit here */
  z3_range *ranges; /* all units' ranges */
  int nranges;
  size_t *counts;     /* (nranges * world) */
  int64_t (*keep)[2]; /* (nranges + 1) give_back's ranges to keep */
  size_t peak;
  /* bf16/f16: the model's half copy, made unit by unit as each arrives
   * and given back with it (reserved like params; NULL in f32) */
  uint16_t *half;
};

/* ------------------------------------------------------------ gathering */

static loom_status post_unit(loom_zero3 *z, int u) {
  z3_unit *t = &z->units[u];
  if (t->state != U_OUT)
    return LOOM_OK;
  t->state = U_COMING;
  for (int k = 0; k < t->n; k++) {
    z3_range *r = &z->ranges[t->first + k];
    /* In place: this rank's piece is already where it belongs. */
    size_t before = 0;
    for (int j = 0; j < z->rank; j++)
      before += r->counts[j];
    float *recv = z->params + r->a;
    LOOM_TRY(loom_allgatherv(recv + before, recv, r->counts, LOOM_F32, z->group,
                             &r->req));
  }
  return LOOM_OK;
}

static loom_status wait_unit(loom_zero3 *z, int u) {
  z3_unit *t = &z->units[u];
  if (t->state == U_OUT)
    LOOM_TRY(post_unit(z, u));
  if (t->state == U_IN)
    return LOOM_OK;
  loom_status first = LOOM_OK;
  for (int k = 0; k < t->n; k++) {
    loom_status s = loom_wait(&z->ranges[t->first + k].req);
    if (s != LOOM_OK && first == LOOM_OK)
      first = loom_error_context(s, "zero3: gathering unit %d's parameters", u);
  }
  t->state = U_IN;
  if (first == LOOM_OK && z->half) {
    /* the unit's half copy, from the values just gathered */
    for (int k = 0; k < t->n && first == LOOM_OK; k++) {
      const z3_range *r = &z->ranges[t->first + k];
      loom_range h = {r->a, r->b - r->a};
      first = loom_model_refresh_half(z->model, &h, 1);
    }
  }
  return first;
}

static int cmp_i64(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* [x, y) of the parameters (and of their half copy) released. */
static void release(loom_zero3 *z, int64_t x, int64_t y) {
  loom_vmem_release(z->params, (size_t)x * sizeof(float),
                    (size_t)y * sizeof(float));
  if (z->half)
    loom_vmem_release(z->half, (size_t)x * sizeof(uint16_t),
                      (size_t)y * sizeof(uint16_t));
}

/* Gives back [a, b) minus what must stay: this rank's slice and the ranges
 * of the other units present (GPT's output layer shares the embedding's
 * weight). */
static void give_back(loom_zero3 *z, int self, int64_t a, int64_t b) {
  int64_t(*keep)[2] = z->keep;
  int nk = 0;
  keep[nk][0] = z->lo;
  keep[nk][1] = z->hi;
  nk++;
  for (int u = 0; u < z->nunits; u++) {
    if (u == self || z->units[u].state == U_OUT)
      continue;
    for (int k = 0; k < z->units[u].n; k++, nk++) {
      keep[nk][0] = z->ranges[z->units[u].first + k].a;
      keep[nk][1] = z->ranges[z->units[u].first + k].b;
    }
  }
  qsort(keep, (size_t)nk, sizeof keep[0], cmp_i64);
  int64_t x = a;
  for (int i = 0; i < nk && x < b; i++) {
    if (keep[i][1] <= x)
      continue;
    int64_t y = keep[i][0] < b ? keep[i][0] : b;
    if (x < y)
      release(z, x, y);
    if (keep[i][1] > x)
      x = keep[i][1];
  }
  if (x < b)
    release(z, x, b);
}

/* Resident bytes of the parameters and their half copy. */
static size_t resident(const loom_zero3 *z) {
  size_t r = loom_vmem_resident(z->params, 0, (size_t)z->n * sizeof(float));
  if (z->half)
    r += loom_vmem_resident(z->half, 0, (size_t)z->n * sizeof(uint16_t));
  return r;
}

static loom_status drop_unit(loom_zero3 *z, int u) {
  z3_unit *t = &z->units[u];
  if (t->state == U_OUT)
    return LOOM_OK;
  loom_status s = LOOM_OK;
  if (t->state == U_COMING)
    s = wait_unit(z, u);
  t->state = U_OUT;
  for (int k = 0; k < t->n; k++)
    give_back(z, u, z->ranges[t->first + k].a, z->ranges[t->first + k].b);
  return s;
}

static void note_peak(loom_zero3 *z) {
  size_t now = resident(z);
  if (now > z->peak)
    z->peak = now;
}

/* The next unit with parameters after u in direction dir (+1, -1), or -1. */
static int next_unit(const loom_zero3 *z, int u, int dir) {
  for (int v = u + dir; v >= 0 && v < z->nunits; v += dir)
    if (z->units[v].n > 0)
      return v;
  return -1;
}

static loom_status unit_hook(void *user, int mu, loom_unit_event ev) {
  loom_zero3 *z = user;
  if (mu < 0 || mu >= loom_model_num_units(z->model) || z->world == 1)
    return LOOM_OK;
  /* A unit of several model units begins at its first one's forward and
   * its last one's backward, and ends the other way round. */
  int u = z->group_of[mu];
  const z3_unit *t = &z->units[u];
  bool begins = ev == LOOM_UNIT_PRE_FORWARD    ? mu == t->head
                : ev == LOOM_UNIT_PRE_BACKWARD ? mu == t->tail
                                               : false;
  bool ends = ev == LOOM_UNIT_POST_FORWARD    ? mu == t->tail
              : ev == LOOM_UNIT_POST_BACKWARD ? mu == t->head
                                              : false;
  if (t->n == 0 || (!begins && !ends))
    return LOOM_OK;
  int v;
  switch (ev) {
  case LOOM_UNIT_PRE_FORWARD:
    if (next_unit(z, u, -1) < 0) {
      /* A new pass: what an earlier one left here may be stale. */
      for (int w = 0; w < z->nunits; w++)
        LOOM_TRY(drop_unit(z, w));
    }
    LOOM_TRY(wait_unit(z, u));
    v = next_unit(z, u, +1);
    if (v >= 0)
      LOOM_TRY(post_unit(z, v));
    note_peak(z);
    return LOOM_OK;
  case LOOM_UNIT_POST_FORWARD:
    /* The last unit runs backward next (in training): it stays. */
    if (next_unit(z, u, +1) < 0 && loom_model_training(z->model))
      return LOOM_OK;
    return drop_unit(z, u);
  case LOOM_UNIT_PRE_BACKWARD:
    LOOM_TRY(wait_unit(z, u));
    v = next_unit(z, u, -1);
    if (v >= 0)
      LOOM_TRY(post_unit(z, v));
    note_peak(z);
    return LOOM_OK;
  case LOOM_UNIT_POST_BACKWARD:
    return drop_unit(z, u);
  }
  return LOOM_OK;
}

/* ------------------------------------------------------------- the rest */

loom_status loom_zero3_shard(loom_zero3 *z) {
  loom_status first = LOOM_OK;
  for (int u = 0; u < z->nunits; u++) {
    loom_status s = z->units[u].state == U_COMING ? wait_unit(z, u) : LOOM_OK;
    if (s != LOOM_OK && first == LOOM_OK)
      first = s;
    z->units[u].state = U_OUT;
  }
  if (z->world > 1) {
    release(z, 0, z->lo);
    release(z, z->hi, z->n);
  }
  z->peak = 0;
  return first;
}

loom_status loom_zero3_init_params(loom_zero3 *z) {
  for (int i = 0; i < loom_model_num_views(z->model); i++) {
    const loom_param *v = loom_model_view(z->model, i);
    int64_t a = v->offset, b = v->offset + v->numel;
    if (b <= z->lo || a >= z->hi)
      continue; /* none of it is this rank's */
    LOOM_TRY(loom_model_init_view(z->model, i));
    if (a < z->lo)
      loom_vmem_release(z->params, (size_t)a * sizeof(float),
                        (size_t)z->lo * sizeof(float));
    if (b > z->hi)
      loom_vmem_release(z->params, (size_t)z->hi * sizeof(float),
                        (size_t)b * sizeof(float));
  }
  return LOOM_OK;
}

void loom_zero3_resident(const loom_zero3 *z, size_t *now, size_t *peak) {
  size_t r = resident(z);
  if (now)
    *now = r;
  if (peak)
    *peak = z->peak > r ? z->peak : r;
}

loom_zero3_opts loom_zero3_opts_default(void) {
  return (loom_zero3_opts){.every = 1, .min_params = 0};
}

static int64_t model_unit_numel(const loom_model *m, int u) {
  int n;
  const loom_range *r = loom_model_unit_ranges(m, u, &n);
  int64_t e = 0;
  for (int i = 0; i < n; i++)
    e += r[i].numel;
  return e;
}

int loom_zero3_group_units(const loom_model *m, const loom_zero3_opts *o,
                           int *group_of) {
  loom_zero3_opts d = loom_zero3_opts_default();
  if (!o)
    o = &d;
  int every = o->every > 0 ? o->every : 1;
  int g = 0, in_g = 0;
  int64_t held = 0;
  for (int u = 0; u < loom_model_num_units(m); u++) {
    group_of[u] = g;
    in_g++;
    held += model_unit_numel(m, u);
    bool full = o->min_params > 0 ? held >= o->min_params : in_g >= every;
    if (full) {
      g++;
      in_g = 0;
      held = 0;
    }
  }
  return g + (in_g > 0);
}

/* The ranges of the model units in [head, tail], merged (a weight tied
 * across them is gathered once), into out; returns their number. */
static int merge_ranges(const loom_model *m, int head, int tail,
                        loom_range *out) {
  int n = 0;
  for (int u = head; u <= tail; u++) {
    int k;
    const loom_range *r = loom_model_unit_ranges(m, u, &k);
    for (int i = 0; i < k; i++)
      out[n++] = r[i];
  }
  return loom_ranges_merge(out, n);
}

int64_t loom_zero3_group_numel(const loom_model *m, const int *group_of,
                               int g) {
  int nu = loom_model_num_units(m), head = -1, tail = -1, total = 0;
  for (int u = 0; u < nu; u++) {
    int k;
    loom_model_unit_ranges(m, u, &k);
    if (group_of[u] == g) {
      head = head < 0 ? u : head;
      tail = u;
      total += k;
    }
  }
  if (head < 0 || total == 0)
    return 0;
  loom_range *r = loom_calloc((size_t)total, sizeof *r);
  if (!r)
    return -1;
  int n = merge_ranges(m, head, tail, r);
  int64_t e = 0;
  for (int i = 0; i < n; i++)
    e += r[i].numel;
  loom_free(r);
  return e;
}

static loom_status make_ranges(loom_zero3 *z) {
  int nu = loom_model_num_units(z->model), all = 0;
  z->group_of = loom_calloc((size_t)(nu ? nu : 1), sizeof(int));
  if (!z->group_of)
    return LOOM_ERR_NOMEM;
  z->nunits = loom_zero3_group_units(z->model, &z->opts, z->group_of);
  z->units = loom_calloc((size_t)(z->nunits ? z->nunits : 1), sizeof *z->units);
  for (int u = 0; u < nu; u++) {
    int n;
    loom_model_unit_ranges(z->model, u, &n);
    all += n;
  }
  /* Merging never adds ranges: the model's count bounds them. */
  z->ranges = loom_calloc((size_t)(all ? all : 1), sizeof *z->ranges);
  z->counts =
      loom_calloc((size_t)(all ? all : 1) * (size_t)z->world, sizeof(size_t));
  loom_range *merged = loom_calloc((size_t)(all ? all : 1), sizeof *merged);
  if (!z->units || !z->ranges || !z->counts || !merged) {
    loom_free(merged);
    return LOOM_ERR_NOMEM;
  }
  /* A group's model units are consecutive: one pass finds its ends. */
  for (int g = 0; g < z->nunits; g++)
    z->units[g].head = -1;
  for (int u = 0; u < nu; u++) {
    z3_unit *t = &z->units[z->group_of[u]];
    t->head = t->head < 0 ? u : t->head;
    t->tail = u;
  }
  for (int g = 0; g < z->nunits; g++) {
    z3_unit *t = &z->units[g];
    t->first = z->nranges;
    t->n = merge_ranges(z->model, t->head, t->tail, merged);
    z->nranges += t->n;
    for (int k = 0; k < t->n; k++) {
      z3_range *r = &z->ranges[t->first + k];
      r->a = merged[k].offset;
      r->b = merged[k].offset + merged[k].numel;
      r->counts = z->counts + (size_t)(t->first + k) * z->world;
      for (int j = 0; j < z->world; j++) {
        int64_t x = z->bounds[j] > r->a ? z->bounds[j] : r->a;
        int64_t y = z->bounds[j + 1] < r->b ? z->bounds[j + 1] : r->b;
        r->counts[j] = x < y ? (size_t)(y - x) : 0;
      }
    }
  }
  loom_free(merged);
  z->keep = loom_calloc((size_t)z->nranges + 1, sizeof *z->keep);
  return z->keep ? LOOM_OK : LOOM_ERR_NOMEM;
}

loom_status loom_zero3_new(loom_zero3 **out, loom_model *model, loom_group *g,
                           const int64_t *bounds) {
  return loom_zero3_new_opts(out, model, g, bounds, NULL);
}

loom_status loom_zero3_new_opts(loom_zero3 **out, loom_model *model,
                                loom_group *g, const int64_t *bounds,
                                const loom_zero3_opts *opts) {
  *out = NULL;
  if (!model || !g || !bounds)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "zero3: a model, a group and the slices needed");
  loom_zero3 *z = loom_calloc(1, sizeof *z);
  if (!z)
    return LOOM_ERR_NOMEM;
  z->model = model;
  z->opts = opts ? *opts : loom_zero3_opts_default();
  z->group = g;
  z->rank = loom_group_rank(g);
  z->world = loom_group_size(g);
  z->n = loom_model_num_params(model);
  z->bounds = bounds;
  loom_status s = LOOM_OK;
  if (bounds[0] != 0 || bounds[z->world] != z->n)
    s = loom_error(LOOM_ERR_INVALID_ARG,
                   "zero3: the slices must run from 0 to the %lld parameters",
                   (long long)z->n);
  for (int r = 0; s == LOOM_OK && r < z->world; r++)
    if (bounds[r] > bounds[r + 1])
      s = loom_error(LOOM_ERR_INVALID_ARG,
                     "zero3: the slices are not ascending at rank %d", r);
  z->lo = bounds[z->rank];
  z->hi = bounds[z->rank + 1];
  if (s == LOOM_OK)
    s = make_ranges(z);
  if (s == LOOM_OK) {
    z->params = loom_vmem_new((size_t)z->n * sizeof(float));
    if (!z->params)
      s = loom_error_context(LOOM_ERR_NOMEM, "zero3: the parameter buffer");
  }
  /* bf16/f16 over several ranks: the half copy follows the gathers (on
   * one rank every unit stays and the model makes its copy itself) */
  if (s == LOOM_OK && z->world > 1 && loom_model_precision(model) != LOOM_F32) {
    z->half = loom_vmem_new((size_t)z->n * sizeof(uint16_t));
    if (!z->half)
      s = loom_error_context(LOOM_ERR_NOMEM, "zero3: the half copy");
  }
  /* Every rank learns whether all could set up before any gather. */
  s = loom_comm_agree(z->world > 1 ? g : NULL, s, "zero3: setting up");
  if (s != LOOM_OK) {
    loom_zero3_free(z);
    return s;
  }
  loom_model_bind_params(model, z->params);
  if (z->half)
    loom_model_bind_half(model, z->half);
  loom_model_set_unit_hook(model, unit_hook, z);
  *out = z;
  return LOOM_OK;
}

void loom_zero3_free(loom_zero3 *z) {
  if (!z)
    return;
  for (int k = 0; k < z->nranges; k++)
    loom_wait(&z->ranges[k].req);
  if (z->params) {
    loom_model_set_unit_hook(z->model, NULL, NULL);
    loom_model_bind_params(z->model, NULL);
    loom_vmem_free(z->params, (size_t)z->n * sizeof(float));
  }
  if (z->half) {
    loom_model_bind_half(z->model, NULL);
    loom_vmem_free(z->half, (size_t)z->n * sizeof(uint16_t));
  }
  loom_free(z->units);
  loom_free(z->group_of);
  loom_free(z->keep);
  loom_free(z->ranges);
  loom_free(z->counts);
  loom_free(z);
}
