/* The module protocol: shapes, the activation plan, parameter listing and the
 * generic calls that wrap every module type's table. */
#include "internal.h"

#include <stdio.h>

/* ---------------------------------------------------------------- names */

static const char *const role_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_PARAM_ROLE_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof role_names / sizeof role_names[0] ==
                   LOOM_PARAM_ROLE_COUNT,
               "role name table");

const char *loom_param_role_name(loom_param_role r) {
  return (unsigned)r < LOOM_PARAM_ROLE_COUNT ? role_names[r] : "unknown";
}

static const char *const scheme_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_INIT_SCHEME_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof scheme_names / sizeof scheme_names[0] ==
                   LOOM_INIT_SCHEME_COUNT,
               "init scheme name table");

const char *loom_init_scheme_name(loom_init_scheme s) {
  return (unsigned)s < LOOM_INIT_SCHEME_COUNT ? scheme_names[s] : "unknown";
}

loom_status loom_init_scheme_parse(const char *name, loom_init_scheme *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_init_scheme_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(name, scheme_names, LOOM_INIT_SCHEME_COUNT,
                           "init scheme", &i));
  *out = (loom_init_scheme)i;
  return LOOM_OK;
}

/* --------------------------------------------------------------- shapes */

loom_shape loom_shape_make(loom_dtype dtype, int ndim, const int64_t *dim) {
  loom_shape s;
  memset(&s, 0, sizeof s);
  s.dtype = dtype;
  s.ndim = ndim < 0 ? 0 : (ndim > LOOM_MAX_DIMS ? LOOM_MAX_DIMS : ndim);
  for (int i = 0; i < s.ndim; i++)
    s.dim[i] = dim[i];
  return s;
}

int64_t loom_shape_numel(const loom_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++)
    n *= s->dim[i];
  return n;
}

bool loom_shape_equal(const loom_shape *a, const loom_shape *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim)
    return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dim[i] != b->dim[i])
      return false;
  return true;
}

char *loom_shape_str(const loom_shape *s, char *buf, size_t size) {
  if (!buf || size == 0)
    return buf;
  size_t n = (size_t)snprintf(buf, size, "%s(", loom_dtype_name(s->dtype));
  for (int i = 0; i < s->ndim && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld",
                          (long long)s->dim[i]);
  if (n < size)
    snprintf(buf + n, size - n, ")");
  return buf;
}

/* ----------------------------------------------------------------- plan */

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

void *loom_nn_plan_act(loom_nn_plan *p, size_t bytes) {
  if (p->recompute) {
    size_t off = p->rc_used;
    p->rc_used += align64(bytes);
    if (p->rc_used > p->rc_peak)
      p->rc_peak = p->rc_used;
    if (!p->base || p->rc_used > p->rc_total)
      return NULL;
    return p->base + p->act_total + off;
  }
  size_t off = p->act_used;
  p->act_used += align64(bytes);
  if (!p->base || p->act_used > p->act_total)
    return NULL;
  return p->base + off;
}

void *loom_nn_plan_scratch(loom_nn_plan *p, size_t bytes) {
  size_t off = p->scratch_top;
  p->scratch_top += align64(bytes);
  if (p->scratch_top > p->scratch_peak)
    p->scratch_peak = p->scratch_top;
  if (!p->base || p->scratch_top > p->scratch_cap)
    return NULL;
  return p->base + p->act_total + p->rc_total + off;
}

size_t loom_nn_plan_scratch_mark(const loom_nn_plan *p) {
  return p->scratch_top;
}

void loom_nn_plan_scratch_release(loom_nn_plan *p, size_t mark) {
  p->scratch_top = mark;
}

bool loom_nn_plan_binding(const loom_nn_plan *p) { return p->base != NULL; }

loom_status loom_nn_plan_dry(loom_module *m, const loom_shape *in,
                             loom_shape *out) {
  loom_nn_plan dry;
  memset(&dry, 0, sizeof dry);
  /* A half input (a mixed-precision composite's child that takes half)
   * is what a run in that precision plans: every output stays f32. */
  if (in->dtype == LOOM_BF16 || in->dtype == LOOM_F16)
    dry.half = in->dtype;
  return loom_module_plan(m, &dry, in, out);
}

/* ------------------------------------------------------ generic calls */

void loom_module_init_base(loom_module *m, const loom_module_ops *ops) {
  memset(m, 0, sizeof *m);
  m->ops = ops;
  m->param_first = -1;
}

loom_status loom_module_plan(loom_module *m, loom_nn_plan *p,
                             const loom_shape *in, loom_shape *out) {
  if (in->ndim < 0 || in->ndim > LOOM_MAX_DIMS)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG, "%d input dimensions",
                             in->ndim);
  for (int i = 0; i < in->ndim; i++)
    if (in->dim[i] <= 0)
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "input dimension %d has size %lld", i,
                               (long long)in->dim[i]);
  loom_shape o;
  memset(&o, 0, sizeof o);
  m->out_half = p->half != LOOM_F32 && p->out_half;
  p->out_half = false;
  LOOM_TRY(m->ops->plan(m, p, in, &o));
  m->in = *in;
  m->out = o;
  *out = o;
  return LOOM_OK;
}

loom_status loom_module_forward(loom_module *m, loom_nn_ctx *ctx,
                                const void *in, const float **out) {
  return m->ops->forward(m, ctx, in, out);
}

/* Reports m's own parameters to the hook, last first. */
static loom_status report_params(loom_module *m, loom_nn_ctx *ctx) {
  if (ctx->hook)
    for (int k = m->param_count - 1; k >= 0; k--) {
      int i = m->param_first + k;
      LOOM_TRY(ctx->hook(ctx->hook_user, i, ctx->views[i].offset,
                         ctx->views[i].numel));
    }
  return LOOM_OK;
}

loom_status loom_module_backward(loom_module *m, loom_nn_ctx *ctx,
                                 const float *dout, float *dinp) {
  LOOM_TRY(m->ops->backward(m, ctx, dout, dinp));
  return report_params(m, ctx);
}

loom_status loom_module_backward_to(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp) {
  if (dinp && m->ops->backward_to) {
    LOOM_TRY(m->ops->backward_to(m, ctx, dout, dinp));
  } else {
    if (dinp)
      memset(dinp, 0, (size_t)loom_shape_numel(&m->in) * sizeof(float));
    LOOM_TRY(m->ops->backward(m, ctx, dout, dinp));
  }
  return report_params(m, ctx);
}

void loom_module_free(loom_module *m) {
  if (m)
    m->ops->free(m);
}

const char *loom_module_type(const loom_module *m) {
  return m ? m->ops->name : "(null)";
}

loom_status loom_module_act_bytes(loom_module *m, const loom_shape *in,
                                  size_t *act, size_t *scratch) {
  /* A counting pass overwrites the buffer addresses a model bound. */
  if (m->attached)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "is part of a model or a parent module: ask "
                             "loom_model_act_bytes");
  loom_nn_plan p;
  memset(&p, 0, sizeof p);
  p.touched = true;
  loom_shape out;
  LOOM_TRY(loom_module_plan(m, &p, in, &out));
  if (act)
    *act = p.act_used + p.rc_peak;
  if (scratch)
    *scratch = p.scratch_peak;
  return LOOM_OK;
}

loom_status loom_module_error(const loom_module *m, loom_status s,
                              const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return loom_error(s, "%s (%s): %s", m->path[0] ? m->path : "model",
                    m->ops->name, msg);
}

loom_status loom_nn_check_f32(const loom_module *m, const loom_shape *in,
                              int min_ndim, int64_t C) {
  char buf[96];
  if (in->dtype != LOOM_F32)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects an f32 input, got %s",
                             loom_shape_str(in, buf, sizeof buf));
  if (in->ndim < min_ndim)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects at least %d dimensions, got %s", min_ndim,
                             loom_shape_str(in, buf, sizeof buf));
  if (C > 0 && in->dim[in->ndim - 1] != C)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "input %s: last dimension must be %lld",
                             loom_shape_str(in, buf, sizeof buf), (long long)C);
  return LOOM_OK;
}

loom_status loom_nn_check_float(const loom_module *m, const loom_nn_plan *p,
                                const loom_shape *in, int min_ndim, int64_t C) {
  if (p->half != LOOM_F32 && in->dtype == p->half) {
    loom_shape f = *in;
    f.dtype = LOOM_F32;
    return loom_nn_check_f32(m, &f, min_ndim, C);
  }
  return loom_nn_check_f32(m, in, min_ndim, C);
}

bool loom_nn_takes_half(const loom_module *m, const loom_nn_plan *p) {
  if (p->half == LOOM_F32 || !m)
    return false;
  if (loom_nn_is_sequential(m))
    return loom_sequential_count(m) > 0 &&
           loom_nn_takes_half(loom_sequential_child(m, 0), p);
  return m->ops->half_in;
}

void *loom_nn_plan_out(loom_nn_plan *p, const loom_module *m, int64_t n,
                       loom_shape *out) {
  out->dtype = m->out_half ? p->half : LOOM_F32;
  return loom_nn_plan_act(p, (size_t)n * loom_dtype_size(out->dtype));
}

loom_status loom_nn_check_int(const loom_module *m, const char *what,
                              int64_t n) {
  if (n > INT32_MAX)
    return loom_module_error(m, LOOM_ERR_UNSUPPORTED,
                             "%s of %lld elements exceeds the kernels' int "
                             "range",
                             what, (long long)n);
  return LOOM_OK;
}

/* ------------------------------------------------------------- visitor */

void loom_nn_visit_init(loom_nn_visit *v) { memset(v, 0, sizeof *v); }

void loom_nn_visit_release(loom_nn_visit *v) {
  loom_free(v->entries);
  loom_free(v->urefs);
  memset(v, 0, sizeof *v);
}

static loom_status join_name(char *dst, const char *a, const char *b) {
  int n;
  if (!a[0])
    n = snprintf(dst, LOOM_PARAM_NAME_MAX, "%s", b);
  else if (!b[0])
    n = snprintf(dst, LOOM_PARAM_NAME_MAX, "%s", a);
  else
    n = snprintf(dst, LOOM_PARAM_NAME_MAX, "%s.%s", a, b);
  if (n < 0 || n >= LOOM_PARAM_NAME_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "name '%s.%s' longer than %d characters", a, b,
                      LOOM_PARAM_NAME_MAX - 1);
  return LOOM_OK;
}

/* Unit v->unit (or 0 for the root's own) uses view `view`. */
static loom_status add_uref(loom_nn_visit *v, int view) {
  if (v->nurefs == v->cap_urefs) {
    int cap = v->cap_urefs ? 2 * v->cap_urefs : 32;
    struct loom_nn_uref *r = loom_malloc((size_t)cap * sizeof *r);
    if (!r)
      return LOOM_ERR_NOMEM;
    if (v->nurefs)
      memcpy(r, v->urefs, (size_t)v->nurefs * sizeof *r);
    loom_free(v->urefs);
    v->urefs = r;
    v->cap_urefs = cap;
  }
  v->urefs[v->nurefs].unit = v->depth > 0 ? v->unit : -1;
  v->urefs[v->nurefs].view = view;
  v->nurefs++;
  return LOOM_OK;
}

static void reset_module(loom_module *m) {
  m->param_first = -1;
  m->param_count = 0;
}

loom_status loom_nn_visit_root(loom_nn_visit *v, loom_module *root) {
  v->prefix[0] = '\0';
  root->path[0] = '\0';
  reset_module(root);
  if (root->ops->f32_only)
    v->f32_only = root;
  return root->ops->params(root, v);
}

loom_status loom_nn_visit_child(loom_nn_visit *v, const char *name,
                                loom_module *child) {
  char saved[LOOM_PARAM_NAME_MAX];
  memcpy(saved, v->prefix, sizeof saved);
  LOOM_TRY(join_name(child->path, saved, name ? name : ""));
  memcpy(v->prefix, child->path, sizeof v->prefix);
  reset_module(child);
  if (child->ops->f32_only && !v->f32_only)
    v->f32_only = child;
  if (v->depth == 0)
    v->unit = v->nunits++;
  v->depth++;
  loom_status st = child->ops->params(child, v);
  v->depth--;
  memcpy(v->prefix, saved, sizeof saved);
  return st;
}

loom_status loom_nn_visit_param(loom_nn_visit *v, loom_module *m,
                                const loom_param_spec *spec) {
  if (m->param_count > 0 && v->last_owner != m)
    return loom_module_error(m, LOOM_ERR_INTERNAL,
                             "parameters of one module must be listed "
                             "together (at '%s')",
                             spec->name);
  if (spec->ndim < 1 || spec->ndim > LOOM_MAX_DIMS)
    return loom_module_error(m, LOOM_ERR_INTERNAL,
                             "parameter '%s' has %d dimensions", spec->name,
                             spec->ndim);
  if (v->count == v->cap) {
    int cap = v->cap ? 2 * v->cap : 32;
    loom_nn_entry *e = loom_malloc((size_t)cap * sizeof *e);
    if (!e)
      return LOOM_ERR_NOMEM;
    if (v->count)
      memcpy(e, v->entries, (size_t)v->count * sizeof *e);
    loom_free(v->entries);
    v->entries = e;
    v->cap = cap;
  }
  LOOM_TRY(add_uref(v, v->count));
  loom_nn_entry *e = &v->entries[v->count];
  memset(e, 0, sizeof *e);
  LOOM_TRY(join_name(e->view.name, m->path, spec->name));
  int64_t numel = 1;
  for (int i = 0; i < spec->ndim; i++) {
    if (spec->shape[i] <= 0)
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "parameter '%s' has size %lld in dimension "
                               "%d",
                               spec->name, (long long)spec->shape[i], i);
    e->view.shape[i] = spec->shape[i];
    numel *= spec->shape[i];
  }
  e->view.ndim = spec->ndim;
  e->view.numel = numel;
  e->view.offset = v->numel;
  e->view.decay =
      spec->role == LOOM_ROLE_WEIGHT || spec->role == LOOM_ROLE_EMBEDDING;
  e->role = spec->role;
  e->fan_in = spec->fan_in > 0 ? spec->fan_in : 1;
  e->resid_proj = spec->resid_proj;
  e->tp_split = spec->tp_split;
  e->tp_blocks = spec->tp_blocks > 0 ? spec->tp_blocks : 1;
  if (m->param_count == 0)
    m->param_first = v->count;
  m->param_count++;
  v->last_owner = m;
  v->count++;
  v->refs++;
  v->numel += numel;
  return LOOM_OK;
}

loom_status loom_nn_visit_view(loom_nn_visit *v, const loom_module *owner,
                               int k, const loom_param **view) {
  if (!owner || owner->param_first < 0 || k < 0 || k >= owner->param_count ||
      owner->param_first + k >= v->count)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tied weight: its owner must be part of the model and "
                      "come earlier in forward order");
  LOOM_TRY(add_uref(v, owner->param_first + k));
  *view = &v->entries[owner->param_first + k].view;
  v->refs++;
  return LOOM_OK;
}

uint64_t loom_nn_visit_rng_id(loom_nn_visit *v) { return v->rng_ids++; }
