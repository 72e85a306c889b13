/* Models: one flat parameter buffer and one flat gradient buffer in forward
 * order, parameter views, initialisation, the activation arena, forward and
 * backward with the gradient hook. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* "INIT": the purpose word of initialisation streams. */
#define INIT_PURPOSE 0x494e495400000000ULL

struct loom_model {
  loom_module *root;
  loom_model_opts opts;
  int nviews;
  loom_param *views;      /* (nviews) */
  loom_nn_entry *entries; /* (nviews) roles and fan-ins for init */
  int64_t numel;
  float *params;     /* (numel) own_params or a bound buffer */
  float *own_params; /* (numel) */
  float *own_grads;  /* (numel) */
  float *grads;      /* own_grads or a bound buffer */
  uint64_t layout_hash;
  /* activations */
  char *arena; /* [act | scratch] */
  size_t arena_cap;
  bool planned, have_forward;
  loom_shape in_shape, out_shape;
  float *dout;      /* (out numel) gradient of the output, in the arena */
  const float *out; /* the last forward's output */
  /* step */
  bool training;
  uint64_t step, sample_base;
  loom_grad_hook hook;
  void *hook_user;
  /* units */
  int nunits;
  int *unit_first;         /* (nunits + 1) into unit_ranges */
  loom_range *unit_ranges; /* each unit's merged ranges, ascending */
  bool seq_root;           /* the units are the root's children */
  loom_unit_hook unit_hook;
  void *unit_user;
  loom_unit_hook unit_obs; /* the observer (trace) */
  void *unit_obs_user;
  /* mixed precision (docs/precision.md) */
  loom_dtype precision;  /* LOOM_F32, LOOM_BF16 or LOOM_F16 */
  uint16_t *params_half; /* (numel) the half copy of params, half only */
  /* (numel) the model's own copy on the conversion path instead: the
   * values of the half type in f32 (own_copy) */
  float *params_rounded;
  bool half_stale; /* params changed since the copy was made */
  bool half_bound; /* params_half is the caller's: it fills it */
  char f32_only[LOOM_PARAM_NAME_MAX + 32]; /* "path (type)" of a module
                                              without a half form, or "" */
};

loom_model_opts loom_model_opts_default(void) {
  loom_model_opts o = {.seed = 1337,
                       .init = LOOM_INIT_TORCH,
                       .init_std = 0.02f,
                       .init_n_layer = 0};
  return o;
}

/* ---------------------------------------------------------------- units */

static int cmp_range(const void *a, const void *b) {
  const loom_range *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int loom_ranges_merge(loom_range *r, int n) {
  if (n <= 0)
    return 0;
  qsort(r, (size_t)n, sizeof *r, cmp_range);
  int k = 1;
  for (int i = 1; i < n; i++) {
    loom_range *last = &r[k - 1];
    if (r[i].offset <= last->offset + last->numel) {
      int64_t e = r[i].offset + r[i].numel;
      if (e > last->offset + last->numel)
        last->numel = e - last->offset;
    } else {
      r[k++] = r[i];
    }
  }
  return k;
}

/* Each unit's views (listed or tied by it) as merged ranges. */
static loom_status make_units(loom_model *m, const loom_nn_visit *v) {
  m->seq_root = loom_nn_is_sequential(m->root);
  m->nunits = m->seq_root ? v->nunits : 1;
  m->unit_first = loom_calloc((size_t)m->nunits + 1, sizeof(int));
  m->unit_ranges =
      loom_calloc((size_t)(v->nurefs ? v->nurefs : 1), sizeof(loom_range));
  if (!m->unit_first || !m->unit_ranges)
    return LOOM_ERR_NOMEM;
  int n = 0;
  for (int u = 0; u < m->nunits; u++) {
    int first = n;
    for (int i = 0; i < v->nurefs; i++) {
      int ru = m->seq_root ? v->urefs[i].unit : 0;
      if (ru != u)
        continue;
      const loom_param *p = &m->views[v->urefs[i].view];
      m->unit_ranges[n++] = (loom_range){p->offset, p->numel};
    }
    n = first + loom_ranges_merge(m->unit_ranges + first, n - first);
    m->unit_first[u + 1] = n;
  }
  return LOOM_OK;
}

int loom_model_num_units(const loom_model *m) {
  if (!m)
    return 0;
  return m->nunits;
}

const loom_range *loom_model_unit_ranges(const loom_model *m, int u, int *n) {
  if (!m) {
    if (n)
      *n = 0;
    return NULL;
  }
  if (u < 0 || u >= m->nunits) {
    *n = 0;
    return NULL;
  }
  *n = m->unit_first[u + 1] - m->unit_first[u];
  return m->unit_ranges + m->unit_first[u];
}

loom_status loom_model_set_unit_range(loom_model *m, int first, int end) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_set_unit_range: NULL model");
  if (!m->seq_root)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: a range of units needs a sequential root (its "
                      "root is a %s)",
                      m->root->ops->name);
  LOOM_TRY(loom_nn_sequential_set_range(m->root, first, end));
  m->planned = false;
  m->have_forward = false;
  return LOOM_OK;
}

void loom_model_set_unit_hook(loom_model *m, loom_unit_hook fn, void *user) {
  if (!m)
    return;
  m->unit_hook = fn;
  m->unit_user = user;
}

void loom_model_set_unit_observer(loom_model *m, loom_unit_hook fn,
                                  void *user) {
  if (!m)
    return;
  m->unit_obs = fn;
  m->unit_obs_user = user;
}

const char *loom_model_unit_name(const loom_model *m, int u) {
  if (!m)
    return NULL;
  if (u < 0 || u >= m->nunits)
    return NULL;
  if (!m->seq_root)
    return "model";
  const loom_module *c = loom_sequential_child(m->root, u);
  return c ? c->path : NULL;
}

/* The unit hook, then the observer inside it. */
static loom_status unit_dispatch(void *user, int u, loom_unit_event ev) {
  loom_model *m = user;
  bool pre = ev == LOOM_UNIT_PRE_FORWARD || ev == LOOM_UNIT_PRE_BACKWARD;
  if (pre && m->unit_hook)
    LOOM_TRY(m->unit_hook(m->unit_user, u, ev));
  if (m->unit_obs)
    LOOM_TRY(m->unit_obs(m->unit_obs_user, u, ev));
  if (!pre && m->unit_hook)
    LOOM_TRY(m->unit_hook(m->unit_user, u, ev));
  return LOOM_OK;
}

/* ------------------------------------------------------- initialisation */

static void init_one(float *w, const loom_nn_entry *e, int index,
                     const loom_model_opts *o) {
  int64_t n = e->view.numel;
  loom_rng r = loom_rng_init(
      o->seed, loom_rng_stream_id(INIT_PURPOSE, (uint64_t)index, 0));
  float bound = (float)(1.0 / sqrt((double)e->fan_in));
  switch (e->role) {
  case LOOM_ROLE_NORM_WEIGHT:
    for (int64_t i = 0; i < n; i++)
      w[i] = 1.0f;
    return;
  case LOOM_ROLE_NORM_BIAS:
    memset(w, 0, (size_t)n * sizeof(float));
    return;
  case LOOM_ROLE_EMBEDDING:
    loom_rng_fill_normal(&r, w, (size_t)n, 0.0f,
                         o->init == LOOM_INIT_GPT2 ? o->init_std : 1.0f);
    return;
  case LOOM_ROLE_BIAS:
    if (o->init == LOOM_INIT_TORCH)
      loom_rng_fill_uniform(&r, w, (size_t)n, -bound, bound);
    else
      memset(w, 0, (size_t)n * sizeof(float));
    return;
  case LOOM_ROLE_WEIGHT:
  default:
    if (o->init == LOOM_INIT_TORCH) {
      /* kaiming_uniform(a = sqrt(5)): gain sqrt(2/(1+5)), bound
       * gain*sqrt(3/fan_in) = 1/sqrt(fan_in). */
      loom_rng_fill_uniform(&r, w, (size_t)n, -bound, bound);
    } else if (o->init == LOOM_INIT_HE_NORMAL) {
      loom_rng_fill_normal(&r, w, (size_t)n, 0.0f,
                           (float)sqrt(2.0 / (double)e->fan_in));
    } else {
      float std = o->init_std;
      if (e->resid_proj && o->init_n_layer > 0)
        std = (float)(std / sqrt(2.0 * o->init_n_layer));
      loom_rng_fill_normal(&r, w, (size_t)n, 0.0f, std);
    }
    return;
  }
}

static loom_status check_opts(const loom_model_opts *o) {
  if ((unsigned)o->init >= LOOM_INIT_SCHEME_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: unknown init scheme %d",
                      (int)o->init);
  if (!(o->init_std > 0.0f) || o->init_n_layer < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: init std %g and n_layer %d must be positive",
                      (double)o->init_std, o->init_n_layer);
  return LOOM_OK;
}

loom_status loom_model_init_params(loom_model *m, const loom_model_opts *o) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_init_params: NULL model");
  if (!o)
    o = &m->opts;
  LOOM_TRY(check_opts(o));
  m->opts = *o;
  for (int i = 0; i < m->nviews; i++)
    init_one(m->params + m->views[i].offset, &m->entries[i], i, o);
  m->half_stale = true;
  return LOOM_OK;
}

loom_status loom_model_init_view(loom_model *m, int i) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_model_init_view: NULL model");
  if (i < 0 || i >= m->nviews)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: no view %d (of %d)", i,
                      m->nviews);
  if (!m->params)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: no parameter buffer");
  init_one(m->params + m->views[i].offset, &m->entries[i], i, &m->opts);
  m->half_stale = true;
  return LOOM_OK;
}

loom_status loom_model_draw_view(const loom_model *m, int i, float *dst) {
  if (!m || !dst)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_draw_view: NULL argument");
  if (i < 0 || i >= m->nviews)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: no view %d (of %d)", i,
                      m->nviews);
  init_one(dst, &m->entries[i], i, &m->opts);
  return LOOM_OK;
}

loom_tp_split loom_model_view_tp(const loom_model *m, int i, int *blocks) {
  if (!m) {
    if (blocks)
      *blocks = 1;
    return LOOM_TP_WHOLE;
  }
  if (i < 0 || i >= m->nviews) {
    *blocks = 1;
    return LOOM_TP_WHOLE;
  }
  *blocks = m->entries[i].tp_blocks > 0 ? m->entries[i].tp_blocks : 1;
  return m->entries[i].tp_split;
}

/* ----------------------------------------------------------- creation */

static uint64_t hash_layout(const loom_param *v, int n) {
  uint64_t h = LOOM_HASH64_INIT;
  int32_t count = n;
  h = loom_hash64(h, &count, sizeof count);
  for (int i = 0; i < n; i++) {
    h = loom_hash64(h, v[i].name, strlen(v[i].name) + 1);
    h = loom_hash64(h, &v[i].offset, sizeof v[i].offset);
    h = loom_hash64(h, &v[i].numel, sizeof v[i].numel);
    int32_t nd = v[i].ndim;
    h = loom_hash64(h, &nd, sizeof nd);
    h = loom_hash64(h, v[i].shape, (size_t)v[i].ndim * sizeof(int64_t));
    uint8_t d = v[i].decay;
    h = loom_hash64(h, &d, 1);
  }
  return h;
}

loom_status loom_model_new(loom_model **out, loom_module *root,
                           const loom_model_opts *opts) {
  if (!out) {
    if (root && !root->attached)
      loom_module_free(root); /* taken over, freed on failure too */
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_model_new: NULL out");
  }
  *out = NULL;
  if (!root)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: no root module");
  if (root->attached)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: the root module (%s) already has an owner",
                      root->ops->name);
  loom_model_opts o = opts ? *opts : loom_model_opts_default();
  loom_status st = check_opts(&o);
  loom_nn_visit v;
  loom_nn_visit_init(&v);
  loom_model *m = NULL;
  if (st != LOOM_OK)
    goto fail;
  LOOM_TRY_GOTO(st, loom_nn_visit_root(&v, root), fail);
  for (int i = 0; i < v.count; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(v.entries[i].view.name, v.entries[j].view.name) == 0) {
        st = loom_error(LOOM_ERR_INVALID_ARG,
                        "model: two parameters are named '%s'",
                        v.entries[i].view.name);
        goto fail;
      }
  m = loom_calloc(1, sizeof *m);
  if (!m) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  m->root = root;
  root->attached = true;
  root->model_root = true;
  m->opts = o;
  m->precision = LOOM_F32;
  if (v.f32_only)
    snprintf(m->f32_only, sizeof m->f32_only, "%s (%s)",
             v.f32_only->path[0] ? v.f32_only->path : "model",
             v.f32_only->ops->name);
  m->training = true;
  m->nviews = v.count;
  m->numel = v.numel;
  m->views = loom_malloc((size_t)(v.count ? v.count : 1) * sizeof *m->views);
  if (!o.shape_only) {
    m->own_params = loom_malloc((size_t)m->numel * sizeof(float));
    m->own_grads =
        loom_calloc((size_t)(m->numel ? m->numel : 1), sizeof(float));
  }
  m->params = m->own_params;
  if (!m->views || (!o.shape_only && (!m->own_params || !m->own_grads))) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  m->grads = m->own_grads;
  for (int i = 0; i < v.count; i++)
    m->views[i] = v.entries[i].view;
  m->entries = v.entries; /* taken over */
  v.entries = NULL;
  m->layout_hash = hash_layout(m->views, m->nviews);
  LOOM_TRY_GOTO(st, make_units(m, &v), fail);
  if (o.shape_only)
    ; /* no buffers */
  else if (o.defer_init)
    memset(m->params, 0, (size_t)m->numel * sizeof(float));
  else
    LOOM_TRY_GOTO(st, loom_model_init_params(m, &o), fail);
  loom_nn_visit_release(&v);
  *out = m;
  return LOOM_OK;
fail:
  loom_nn_visit_release(&v);
  if (m)
    loom_model_free(m);
  else
    loom_module_free(root);
  return st;
}

void loom_model_free(loom_model *m) {
  if (!m)
    return;
  loom_module_free(m->root);
  loom_free(m->views);
  loom_free(m->entries);
  loom_free(m->own_params);
  loom_free(m->own_grads);
  if (!m->half_bound)
    loom_free(m->params_half);
  loom_free(m->params_rounded);
  loom_free(m->arena);
  loom_free(m->unit_first);
  loom_free(m->unit_ranges);
  loom_free(m);
}

/* ---------------------------------------------------------- accessors */

float *loom_model_params(loom_model *m) {
  if (!m)
    return NULL;
  return m->params;
}
/* The own gradient buffer, made again after loom_model_drop_own_grads
 * when nothing else is bound (NULL if that fails, or shape_only). */
static float *own_grads(loom_model *m) {
  if (!m->grads && !m->own_grads && !m->opts.shape_only) {
    m->own_grads =
        loom_calloc((size_t)(m->numel ? m->numel : 1), sizeof(float));
    m->grads = m->own_grads;
  }
  return m->grads;
}

float *loom_model_grads(loom_model *m) {
  if (!m)
    return NULL;
  return own_grads(m);
}
int64_t loom_model_num_params(const loom_model *m) {
  if (!m)
    return 0;
  return m->numel;
}
int loom_model_num_views(const loom_model *m) {
  if (!m)
    return 0;
  return m->nviews;
}

const loom_param *loom_model_view(const loom_model *m, int i) {
  if (!m)
    return NULL;
  return i >= 0 && i < m->nviews ? &m->views[i] : NULL;
}

loom_param_role loom_model_view_role(const loom_model *m, int i) {
  if (!m)
    return LOOM_ROLE_WEIGHT;
  return i >= 0 && i < m->nviews ? m->entries[i].role : LOOM_ROLE_WEIGHT;
}

loom_status loom_model_find(const loom_model *m, const char *name, int *index) {
  if (!m || !index || !name)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_model_find: %s is NULL",
                      !m       ? "the model"
                      : !index ? "index"
                               : "name");
  for (int i = 0; i < m->nviews; i++)
    if (name && strcmp(m->views[i].name, name) == 0) {
      *index = i;
      return LOOM_OK;
    }
  return loom_error(LOOM_ERR_INVALID_ARG, "model has no parameter '%s'",
                    name ? name : "(null)");
}

uint64_t loom_model_layout_hash(const loom_model *m) {
  if (!m)
    return 0;
  return m->layout_hash;
}
loom_module *loom_model_root(loom_model *m) {
  if (!m)
    return NULL;
  return m->root;
}
const loom_model_opts *loom_model_get_opts(const loom_model *m) {
  if (!m)
    return NULL;
  return &m->opts;
}

void loom_model_zero_grad(loom_model *m) {
  if (!m)
    return;
  if (m->grads)
    memset(m->grads, 0, (size_t)m->numel * sizeof(float));
}

void loom_model_drop_own_grads(loom_model *m) {
  if (!m)
    return;
  if (m->own_grads && m->grads && m->grads != m->own_grads) {
    loom_free(m->own_grads);
    m->own_grads = NULL;
  }
}

void loom_model_bind_grads(loom_model *m, float *grads) {
  if (!m)
    return;
  /* NULL after loom_model_drop_own_grads: made again when next asked for
   * (own_grads), not here, so a DDP that ends does not allocate it. */
  m->grads = grads ? grads : m->own_grads;
}

void loom_model_bind_params(loom_model *m, float *params) {
  if (!m)
    return;
  m->params = params ? params : m->own_params;
  m->half_stale = true;
}

/* ----------------------------------------------------- mixed precision */

/* Frees the model's own copy (either kind); a bound one stays. */
static void drop_own_copy(loom_model *m) {
  if (!m->half_bound) {
    loom_free(m->params_half);
    m->params_half = NULL;
  }
  loom_free(m->params_rounded);
  m->params_rounded = NULL;
}

/* Makes the model's own copy of its parameters in its half type, of the
 * kind the matmuls' path reads (a bound copy is the caller's): 2-byte
 * values where they run on the CPU's unit (loom_half_on_unit), else the
 * same values in f32, which the conversion path's f32 GEMMs read as they
 * are. That costs 2 more bytes a parameter and saves, each step, the
 * widening of every weight in forward and again in backward (three passes
 * over the weights become one: the refresh). */
static loom_status own_copy(loom_model *m) {
  if (m->half_bound || m->precision == LOOM_F32)
    return LOOM_OK;
  const bool rounded = !loom_half_on_unit(m->precision);
  const size_t n = (size_t)(m->numel ? m->numel : 1);
  if (rounded ? m->params_rounded != NULL : m->params_half != NULL)
    return LOOM_OK;
  drop_own_copy(m); /* the other kind (the path changed) */
  if (rounded)
    m->params_rounded = loom_malloc(n * sizeof(float));
  else
    m->params_half = loom_malloc(n * sizeof(uint16_t));
  if (!m->params_rounded && !m->params_half)
    return loom_error_context(
        LOOM_ERR_NOMEM, "model: the %s copy of %lld parameters",
        loom_dtype_name(m->precision), (long long)m->numel);
  m->half_stale = true;
  return LOOM_OK;
}

loom_status loom_model_set_precision(loom_model *m, loom_dtype precision) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_set_precision: NULL model");
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: NULL");
  const bool half = precision == LOOM_BF16 || precision == LOOM_F16;
  if (precision != LOOM_F32 && !half)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "model: precision %s is not implemented (f32, bf16 or "
                      "f16)",
                      loom_dtype_name(precision));
  if (precision == m->precision)
    return LOOM_OK;
  if (half && m->f32_only[0])
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "model: %s has no %s form yet; this model runs in "
                      "f32 only",
                      m->f32_only, loom_dtype_name(precision));
  /* bf16 <-> f16: the copy is made again (its kind may change: one type
   * may run on the unit and the other convert). A bound copy is the
   * caller's to make. */
  const loom_dtype was = m->precision;
  drop_own_copy(m);
  m->precision = precision;
  if (half && !m->opts.shape_only) {
    loom_status s = own_copy(m);
    if (s != LOOM_OK) {
      m->precision = was;
      return s;
    }
  }
  m->half_stale = true;
  m->planned = false; /* the activations change type: plan again */
  m->have_forward = false;
  return LOOM_OK;
}

loom_dtype loom_model_precision(const loom_model *m) {
  if (!m)
    return LOOM_F32;
  return m ? m->precision : LOOM_F32;
}

void loom_model_params_updated(loom_model *m) {
  if (!m)
    return;
  if (m)
    m->half_stale = true;
}

size_t loom_model_half_bytes(const loom_model *m) {
  if (!m)
    return 0;
  if (!m)
    return 0;
  if (m->params_rounded)
    return (size_t)m->numel * sizeof(float);
  return m->params_half && !m->half_bound ? (size_t)m->numel * sizeof(uint16_t)
                                          : 0;
}

float *loom_model_rounded_copy(loom_model *m) {
  if (!m)
    return NULL;
  /* a change of path since the copy was made: none, the next forward makes
   * the other kind */
  return m && m->params_rounded && !loom_half_on_unit(m->precision)
             ? m->params_rounded
             : NULL;
}

void loom_model_bind_half(loom_model *m, uint16_t *buf) {
  if (!m)
    return;
  if (!m)
    return;
  drop_own_copy(m);
  m->params_half = buf;
  m->half_bound = buf != NULL;
  m->half_stale = true;
}

loom_status loom_model_refresh_half(loom_model *m, const loom_range *r, int n) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_refresh_half: NULL model");
  if (!m || n < 0 || (n > 0 && !r))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: refresh_half: NULL model or ranges, or %d "
                      "ranges",
                      n);
  if (m->precision == LOOM_F32 || (!m->params_half && !m->params_rounded) ||
      !m->params)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: no half copy to refresh (precision %s)",
                      loom_dtype_name(m->precision));
  for (int k = 0; k < n; k++) {
    if (r[k].offset < 0 || r[k].numel < 0 ||
        r[k].offset + r[k].numel > m->numel)
      return loom_error(
          LOOM_ERR_INVALID_ARG, "model: range [%lld, %lld) of %lld parameters",
          (long long)r[k].offset, (long long)(r[k].offset + r[k].numel),
          (long long)m->numel);
    if (m->params_rounded)
      LOOM_TRY(loom_round_half(m->precision, m->params_rounded + r[k].offset,
                               m->params + r[k].offset, r[k].numel));
    else
      LOOM_TRY(loom_cvt_f32_to_half(m->precision, m->params_half + r[k].offset,
                                    m->params + r[k].offset, r[k].numel));
  }
  m->half_stale = false;
  return LOOM_OK;
}

void loom_model_set_training(loom_model *m, bool training) {
  if (!m)
    return;
  m->training = training;
}
bool loom_model_training(const loom_model *m) {
  if (!m)
    return false;
  return m->training;
}

void loom_model_set_step(loom_model *m, uint64_t step, uint64_t sample_base) {
  if (!m)
    return;
  m->step = step;
  m->sample_base = sample_base;
}

void loom_model_set_grad_hook(loom_model *m, loom_grad_hook fn, void *user) {
  if (!m)
    return;
  m->hook = fn;
  m->hook_user = user;
}

/* ------------------------------------------------------------ planning */

loom_status loom_model_plan(loom_model *m, const loom_shape *in) {
  if (!m || !in)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_model_plan: NULL argument");
  if (m->planned && loom_shape_equal(in, &m->in_shape))
    return LOOM_OK;
  m->planned = false;
  m->have_forward = false;
  /* Counting pass: sizes only. */
  loom_nn_plan p;
  memset(&p, 0, sizeof p);
  p.half = m->precision;
  loom_shape out;
  LOOM_TRY(loom_module_plan(m->root, &p, in, &out));
  if (out.dtype != LOOM_F32)
    return loom_error(LOOM_ERR_INTERNAL, "model: output is not f32");
  loom_nn_plan_floats(&p, loom_shape_numel(&out));
  size_t act = p.act_used, rc = p.rc_peak, scratch = p.scratch_peak;
  if (act + rc + scratch > m->arena_cap) {
    char *a = loom_malloc(act + rc + scratch);
    if (!a)
      return loom_error_context(LOOM_ERR_NOMEM,
                                "model: activation arena of %zu bytes",
                                act + rc + scratch);
    loom_free(m->arena);
    m->arena = a;
    m->arena_cap = act + rc + scratch;
  }
  /* Binding pass: the same requests, now with addresses. */
  memset(&p, 0, sizeof p);
  p.half = m->precision;
  p.base = m->arena;
  p.act_total = act;
  p.rc_total = rc;
  p.scratch_cap = scratch;
  LOOM_TRY(loom_module_plan(m->root, &p, in, &out));
  m->dout = loom_nn_plan_floats(&p, loom_shape_numel(&out));
  if (p.act_used != act || p.scratch_peak != scratch || p.rc_peak != rc)
    return loom_error(LOOM_ERR_INTERNAL,
                      "model: a module planned different sizes in its two "
                      "passes (act %zu vs %zu, scratch %zu vs %zu)",
                      p.act_used, act, p.scratch_peak, scratch);
  m->in_shape = *in;
  m->out_shape = out;
  m->planned = true;
  return LOOM_OK;
}

size_t loom_model_arena_bytes(const loom_model *m) {
  if (!m)
    return 0;
  return m->arena_cap;
}

loom_status loom_model_act_bytes(loom_model *m, const loom_shape *input,
                                 size_t *act, size_t *scratch) {
  if (!m || !input)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_act_bytes: NULL argument");
  /* The counting pass clears the modules' addresses: bind again on the
   * next forward (no allocation when the arena is large enough). */
  m->planned = false;
  m->have_forward = false;
  loom_nn_plan p;
  memset(&p, 0, sizeof p);
  p.half = m->precision;
  p.touched = true;
  loom_shape out;
  LOOM_TRY(loom_module_plan(m->root, &p, input, &out));
  if (act)
    *act = p.act_used + p.rc_peak;
  if (scratch)
    *scratch = p.scratch_peak;
  return LOOM_OK;
}

/* ---------------------------------------------------- forward, backward */

static loom_nn_ctx make_ctx(const loom_model *m) {
  loom_nn_ctx c = {.params = m->params,
                   .params_half = m->params_half,
                   .params_rounded = m->params_rounded,
                   .half = m->precision,
                   .grads = m->grads,
                   .views = m->views,
                   .training = m->training,
                   .seed = m->opts.seed,
                   .step = m->step,
                   .sample_base = m->sample_base,
                   .hook = m->hook,
                   .hook_user = m->hook_user,
                   .unit_hook =
                       m->unit_hook || m->unit_obs ? unit_dispatch : NULL,
                   .unit_user = (void *)m,
                   .unit_root = m->seq_root ? m->root : NULL};
  return c;
}

static loom_status check_tensor(const char *what, const loom_tensor *t) {
  if (!t || !t->data)
    return loom_error(LOOM_ERR_INVALID_ARG, "model: no %s tensor", what);
  if (t->ndim < 1 || t->ndim > LOOM_MAX_DIMS || !loom_tensor_is_contiguous(t))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: the %s must be a contiguous tensor of 1 to %d "
                      "dimensions",
                      what, LOOM_MAX_DIMS);
  return LOOM_OK;
}

loom_status loom_model_forward(loom_model *m, const loom_tensor *input,
                               loom_tensor *output) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_model_forward: NULL model");
  LOOM_TRY(check_tensor("input", input));
  if (!m->params)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: made with shape_only, it has no parameters to "
                      "run");
  loom_shape s = loom_shape_make(input->dtype, input->ndim, input->shape);
  LOOM_TRY(loom_model_plan(m, &s));
  m->have_forward = false;
  /* made here when set_precision did not (a shape_only model running on
   * bound parameters: ZeRO-2), or of the other kind when the path changed
   * since (loom_bf16_set_path) */
  LOOM_TRY(own_copy(m));
  if (m->half_stale && !m->half_bound && m->precision != LOOM_F32) {
    /* once per change of the parameters (an optimizer step), not per use */
    if (m->params_rounded)
      LOOM_TRY(loom_round_half(m->precision, m->params_rounded, m->params,
                               m->numel));
    else
      LOOM_TRY(loom_cvt_f32_to_half(m->precision, m->params_half, m->params,
                                    m->numel));
    m->half_stale = false;
  }
  loom_nn_ctx ctx = make_ctx(m);
  const float *y;
  /* A root that is not a sequential is one unit. */
  bool whole = ctx.unit_hook && !m->seq_root;
  if (whole)
    LOOM_TRY(unit_dispatch(m, 0, LOOM_UNIT_PRE_FORWARD));
  LOOM_TRY(loom_module_forward(m->root, &ctx, input->data, &y));
  if (whole)
    LOOM_TRY(unit_dispatch(m, 0, LOOM_UNIT_POST_FORWARD));
  m->out = y;
  m->have_forward = true;
  if (output)
    *output = loom_tensor_view((void *)y, LOOM_F32, m->out_shape.ndim,
                               m->out_shape.dim);
  return LOOM_OK;
}

loom_status loom_model_output_grad(loom_model *m, loom_tensor *doutput) {
  if (!m || !doutput)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_model_output_grad: NULL argument");
  if (!m->planned)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: no output gradient before the first forward");
  *doutput =
      loom_tensor_view(m->dout, LOOM_F32, m->out_shape.ndim, m->out_shape.dim);
  return LOOM_OK;
}

static loom_status check_like(const char *what, const loom_tensor *t,
                              const loom_shape *want) {
  char a[96], b[96];
  LOOM_TRY(check_tensor(what, t));
  loom_shape s = loom_shape_make(t->dtype, t->ndim, t->shape);
  if (!loom_shape_equal(&s, want))
    return loom_error(LOOM_ERR_INVALID_ARG, "model: %s is %s, expected %s",
                      what, loom_shape_str(&s, a, sizeof a),
                      loom_shape_str(want, b, sizeof b));
  return LOOM_OK;
}

loom_status loom_model_backward(loom_model *m, const loom_tensor *doutput,
                                loom_tensor *dinput) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_model_backward: NULL model");
  if (!m->have_forward)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "model: backward needs a forward first");
  if (!own_grads(m))
    return loom_error(LOOM_ERR_NOMEM,
                      "model: no gradient buffer (made shape_only, or its "
                      "own could not be made again after a DDP)");
  const float *g = m->dout;
  if (doutput) {
    LOOM_TRY(check_like("output gradient", doutput, &m->out_shape));
    g = doutput->data;
  }
  float *di = NULL;
  if (dinput) {
    if (m->in_shape.dtype != LOOM_F32)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "model: the input is %s and has no gradient",
                        loom_dtype_name(m->in_shape.dtype));
    LOOM_TRY(check_like("input gradient", dinput, &m->in_shape));
    di = dinput->data;
  }
  loom_nn_ctx ctx = make_ctx(m);
  /* the input gradient is written (or cleared first) */
  if (!ctx.unit_hook || m->seq_root)
    return loom_module_backward_to(m->root, &ctx, g, di);
  LOOM_TRY(unit_dispatch(m, 0, LOOM_UNIT_PRE_BACKWARD));
  LOOM_TRY(loom_module_backward_to(m->root, &ctx, g, di));
  return unit_dispatch(m, 0, LOOM_UNIT_POST_BACKWARD);
}
