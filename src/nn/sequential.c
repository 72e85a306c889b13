/* Sequential: children run in order; backward in reverse through two
 * ping-pong gradient buffers in scratch. A ReLU followed by max pooling
 * runs as one pass each way (the ReLU's output is never written). */
#include "internal.h"

#include <stdio.h>

typedef struct seq_child {
  loom_module *m;
  char name[LOOM_PARAM_NAME_MAX];
  bool fuse_next; /* a ReLU run together with the max pooling after it */
} seq_child;

typedef struct sequential {
  loom_module base;
  seq_child *kids; /* (n) */
  int n, cap;
  float *buf[2]; /* (max_mid) each: gradients between children */
  /* Leading children that use no parameter (found when the model lists
   * them; 0 before). Without an input gradient asked for, the gradient
   * flowing into them is never used, so it is not computed: fashion-mlp's
   * fc1 would otherwise spend a fifth of the step's GEMM work on the
   * gradient of the images. */
  int lead;
  /* The children that run: [lo, hi) (all of them unless a model runs a
   * range of its units, loom_model_set_unit_range: a pipeline stage). */
  int lo, hi;
} sequential;

/* The end of the range that runs (hi 0: every child). */
static int seq_hi(const sequential *s) { return s->hi > 0 ? s->hi : s->n; }

static loom_status sequential_params(loom_module *m, loom_nn_visit *v) {
  sequential *s = (sequential *)m;
  s->lead = 0;
  bool any = false;
  for (int i = 0; i < s->n; i++) {
    int before = v->refs;
    LOOM_TRY(loom_nn_visit_child(v, s->kids[i].name, s->kids[i].m));
    any = any || v->refs != before;
    if (!any)
      s->lead = i + 1;
  }
  return LOOM_OK;
}

static loom_status sequential_plan(loom_module *m, loom_nn_plan *p,
                                   const loom_shape *in, loom_shape *out) {
  sequential *s = (sequential *)m;
  if (s->n == 0)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG, "has no modules");
  const int lo = s->lo, hi = seq_hi(s);
  /* A dry run gives the children's shapes, so the gradient buffers can be
   * taken below the children's scratch on the stack. */
  loom_shape x = *in;
  for (int i = lo; i < hi; i++)
    LOOM_TRY(loom_nn_plan_dry(s->kids[i].m, &x, &x));
  /* A ReLU fused with the pooling after it writes neither its output nor
   * that output's gradient: neither is planned. */
  for (int i = lo; i < hi; i++)
    s->kids[i].fuse_next =
        i + 1 < hi && (i == lo || !s->kids[i - 1].fuse_next) &&
        loom_nn_relu_pool_fusable(s->kids[i].m, s->kids[i + 1].m);
  int64_t max_mid = 0;
  for (int i = lo; i + 1 < hi; i++) {
    int64_t numel = loom_shape_numel(&s->kids[i].m->out);
    if (!s->kids[i].fuse_next && numel > max_mid)
      max_mid = numel;
  }
  size_t mark = loom_nn_plan_scratch_mark(p);
  s->buf[0] = s->buf[1] = NULL;
  if (hi - lo > 1) {
    s->buf[0] = loom_nn_plan_scratch_floats(p, max_mid);
    s->buf[1] = loom_nn_plan_scratch_floats(p, max_mid);
  }
  x = *in;
  for (int i = lo; i < hi; i++) {
    size_t kid_mark = loom_nn_plan_scratch_mark(p);
    p->no_out = s->kids[i].fuse_next;
    /* half out when the next child (or, for the last that runs, our
     * parent) takes it: a pipeline stage's last child hands its output
     * to the stage's caller, never to the child after it */
    p->out_half = s->kids[i].fuse_next ? false
                  : i + 1 < hi         ? loom_nn_takes_half(s->kids[i + 1].m, p)
                                       : m->out_half;
    loom_status st = loom_module_plan(s->kids[i].m, p, &x, &x);
    p->no_out = false;
    LOOM_TRY(st);
    loom_nn_plan_scratch_release(p, kid_mark);
  }
  loom_nn_plan_scratch_release(p, mark);
  *out = x;
  return LOOM_OK;
}

/* The unit hook for children [a, b] when m is the model's root. */
static loom_status units(loom_module *m, loom_nn_ctx *ctx, int a, int b,
                         loom_unit_event ev) {
  if (!ctx->unit_hook || ctx->unit_root != m)
    return LOOM_OK;
  for (int i = a; i <= b; i++)
    LOOM_TRY(ctx->unit_hook(ctx->unit_user, i, ev));
  return LOOM_OK;
}

static loom_status sequential_forward(loom_module *m, loom_nn_ctx *ctx,
                                      const void *in, const float **out) {
  sequential *s = (sequential *)m;
  const void *x = in;
  for (int i = s->lo; i < seq_hi(s); i++) {
    const float *y;
    int a = i;
    if (s->kids[i].fuse_next) {
      LOOM_TRY(units(m, ctx, i, i + 1, LOOM_UNIT_PRE_FORWARD));
      LOOM_TRY(
          loom_nn_relu_pool_forward(s->kids[i].m, s->kids[i + 1].m, x, &y));
      i++;
    } else {
      LOOM_TRY(units(m, ctx, i, i, LOOM_UNIT_PRE_FORWARD));
      LOOM_TRY(loom_module_forward(s->kids[i].m, ctx, x, &y));
    }
    LOOM_TRY(units(m, ctx, a, i, LOOM_UNIT_POST_FORWARD));
    x = y;
  }
  *out = x;
  return LOOM_OK;
}

static loom_status sequential_backward(loom_module *m, loom_nn_ctx *ctx,
                                       const float *dout, float *dinp) {
  sequential *s = (sequential *)m;
  const float *g = dout;
  int cur = -1; /* the buffer g is in; the next fresh one is the other */
  for (int i = seq_hi(s) - 1; i >= s->lo; i--) {
    loom_module *kid = s->kids[i].m;
    float *dst = dinp;
    /* the ReLU of a fused pair (i - 1, i) writing its input gradient */
    int first = i > s->lo && s->kids[i - 1].fuse_next ? i - 1 : i;
    const int hi = i, lo = first;
    LOOM_TRY(units(m, ctx, lo, hi, LOOM_UNIT_PRE_BACKWARD));
    if (first > s->lo && (dinp || first > s->lead)) {
      /* a fresh buffer: written by the child, or cleared for it */
      cur = cur == 0 ? 1 : 0;
      dst = s->buf[cur];
      if (first < i) {
        LOOM_TRY(loom_nn_relu_pool_backward_to(s->kids[first].m, kid, g, dst));
        i = first;
      } else {
        LOOM_TRY(loom_module_backward_to(kid, ctx, g, dst));
      }
    } else if (first < i && !dinp) {
      /* a ReLU and a pool first, nothing below needs a gradient */
      return units(m, ctx, lo, hi, LOOM_UNIT_POST_BACKWARD);
    } else {
      /* into the caller's dinp (adding) or the pair's pool first, apart */
      if (first < i) {
        cur = cur == 0 ? 1 : 0;
        dst = s->buf[cur];
        LOOM_TRY(loom_module_backward_to(kid, ctx, g, dst));
        g = dst;
        i = first;
        kid = s->kids[i].m;
        dst = dinp;
      }
      LOOM_TRY(loom_module_backward(kid, ctx, g, dst));
    }
    LOOM_TRY(units(m, ctx, lo, hi, LOOM_UNIT_POST_BACKWARD));
    if (!dst)
      break; /* nothing below needs a gradient */
    g = dst;
  }
  return LOOM_OK;
}

static void sequential_free(loom_module *m) {
  sequential *s = (sequential *)m;
  for (int i = 0; i < s->n; i++)
    loom_module_free(s->kids[i].m);
  loom_free(s->kids);
  loom_free(s);
}

static const loom_module_ops sequential_ops = {
    .name = "sequential",
    .params = sequential_params,
    .plan = sequential_plan,
    .forward = sequential_forward,
    .backward = sequential_backward,
    .free = sequential_free,
};

loom_status loom_sequential_new(loom_module **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_sequential_new: NULL out");
  *out = NULL;
  sequential *s = loom_calloc(1, sizeof *s);
  if (!s)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&s->base, &sequential_ops);
  *out = &s->base;
  return LOOM_OK;
}

loom_status loom_sequential_add(loom_module *seq, const char *name,
                                loom_module *child) {
  if (!child)
    return loom_error(LOOM_ERR_INVALID_ARG, "sequential: no module to add");
  if (child->attached)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sequential: module '%s' (%s) already has a parent",
                      name ? name : "", child->ops->name);
  loom_status st = LOOM_OK;
  if (!seq || seq->ops != &sequential_ops) {
    st = loom_error(LOOM_ERR_INVALID_ARG,
                    "sequential_add: target is not a sequential module");
    goto fail;
  }
  /* Walk up to the top of seq's tree: a child that is seq or its top
   * would hold itself; a top owned by a model has its layout fixed. */
  const loom_module *top = seq;
  while (top->parent)
    top = top->parent;
  if (top == child || seq == child)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sequential_add: module '%s' (%s) is or holds the "
                      "sequential it is added to (a cycle)",
                      name ? name : "", child->ops->name);
  if (top->model_root) {
    st = loom_error(LOOM_ERR_INVALID_ARG,
                    "sequential_add: the sequential%s%s is part of a model; "
                    "add modules before loom_model_new",
                    seq->path[0] ? " " : "", seq->path);
    goto fail;
  }
  sequential *s = (sequential *)seq;
  if (!name)
    name = "";
  if (strlen(name) >= LOOM_PARAM_NAME_MAX) {
    st = loom_error(LOOM_ERR_INVALID_ARG, "sequential: name '%s' too long",
                    name);
    goto fail;
  }
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 8;
    seq_child *k = loom_malloc((size_t)cap * sizeof *k);
    if (!k) {
      st = LOOM_ERR_NOMEM;
      goto fail;
    }
    if (s->n)
      memcpy(k, s->kids, (size_t)s->n * sizeof *k);
    loom_free(s->kids);
    s->kids = k;
    s->cap = cap;
  }
  s->kids[s->n].m = child;
  snprintf(s->kids[s->n].name, LOOM_PARAM_NAME_MAX, "%s", name);
  s->n++;
  child->attached = true;
  child->parent = seq;
  return LOOM_OK;
fail:
  loom_module_free(child);
  return st;
}

int loom_sequential_count(const loom_module *seq) {
  return seq && seq->ops == &sequential_ops ? ((const sequential *)seq)->n : 0;
}

loom_status loom_nn_sequential_set_range(loom_module *seq, int lo, int hi) {
  if (!loom_nn_is_sequential(seq))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sequential: a range of children needs a sequential");
  sequential *s = (sequential *)seq;
  if (lo < 0 || hi > s->n || lo >= hi)
    return loom_module_error(seq, LOOM_ERR_INVALID_ARG,
                             "children [%d, %d) out of range (it has %d)", lo,
                             hi, s->n);
  s->lo = lo;
  s->hi = hi == s->n ? 0 : hi;
  return LOOM_OK;
}

bool loom_nn_is_sequential(const loom_module *m) {
  return m && m->ops == &sequential_ops;
}

const loom_module *loom_sequential_child(const loom_module *seq, int i) {
  if (!seq || seq->ops != &sequential_ops)
    return NULL;
  const sequential *s = (const sequential *)seq;
  return i >= 0 && i < s->n ? s->kids[i].m : NULL;
}
