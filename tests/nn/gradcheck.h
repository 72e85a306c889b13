/* Shared by the nn tests: finite-difference gradient checks of a model
 * against its backward, with either a random projection of the output or the
 * cross-entropy loss as the objective (summed in double). */
#ifndef LOOM_TESTS_NN_GRADCHECK_H
#define LOOM_TESTS_NN_GRADCHECK_H

#include "loom/nn.h"
#include "tt.h"

typedef struct gc {
  loom_model *m;
  loom_tensor in;         /* the input (f32 or i32) */
  const int32_t *targets; /* cross-entropy targets, or NULL */
  loom_xent *xent;
  float *r;      /* (out numel) projection weights when no targets */
  int64_t out_n; /* output elements */
  double h;      /* finite-difference step */
  double atol, rtol;
  /* Piecewise-linear models (ReLU, max pooling): a coordinate whose step
   * crosses a kink has one-sided slopes that disagree; such coordinates are
   * skipped, at most max_skip of each view (or 2). */
  bool kinked;
  double max_skip;
  double l0; /* the objective at the unperturbed point */
} gc;

__attribute__((unused)) static void gc_fill_normal(float *x, int64_t n,
                                                   uint64_t seed, float std) {
  loom_rng r = loom_rng_init(seed, 77);
  loom_rng_fill_normal(&r, x, (size_t)n, 0.0f, std);
}

/* Sets up the objective after one forward (to learn the output size). */
__attribute__((unused)) static loom_status
gc_init(gc *g, loom_model *m, loom_tensor in, const int32_t *targets) {
  memset(g, 0, sizeof *g);
  g->m = m;
  g->in = in;
  g->targets = targets;
  g->h = 1e-2;
  g->atol = 1e-3;
  g->rtol = 1e-2;
  g->max_skip = 0.25;
  loom_tensor out;
  LOOM_TRY(loom_model_forward(m, &in, &out));
  g->out_n = loom_tensor_numel(&out);
  if (targets)
    return loom_xent_new(&g->xent);
  g->r = loom_malloc((size_t)g->out_n * sizeof(float));
  if (!g->r)
    return LOOM_ERR_NOMEM;
  gc_fill_normal(g->r, g->out_n, 4242, 1.0f);
  return LOOM_OK;
}

__attribute__((unused)) static void gc_release(gc *g) {
  loom_free(g->r);
  loom_xent_free(g->xent);
  g->r = NULL;
  g->xent = NULL;
}

__attribute__((unused)) static double gc_loss(gc *g) {
  loom_tensor out;
  if (loom_model_forward(g->m, &g->in, &out) != LOOM_OK)
    return NAN;
  if (g->targets) {
    loom_xent_stats s;
    if (loom_xent_forward(g->xent, &out, g->targets, &s) != LOOM_OK)
      return NAN;
    return s.loss;
  }
  const float *y = out.data;
  double L = 0.0;
  for (int64_t i = 0; i < g->out_n; i++)
    L += (double)g->r[i] * (double)y[i];
  return L;
}

/* Analytic gradients: parameters into dparams (numel), input into dinput
 * (f32 inputs only; may be NULL). */
__attribute__((unused)) static loom_status gc_backward(gc *g, float *dparams,
                                                       float *dinput) {
  loom_tensor out, dout, din;
  loom_model_zero_grad(g->m);
  LOOM_TRY(loom_model_forward(g->m, &g->in, &out));
  if (dinput)
    din = loom_tensor_view(dinput, LOOM_F32, g->in.ndim, g->in.shape);
  if (g->targets) {
    LOOM_TRY(loom_xent_forward(g->xent, &out, g->targets, NULL));
    LOOM_TRY(loom_model_output_grad(g->m, &dout));
    LOOM_TRY(loom_xent_backward(g->xent, &dout, 1.0f));
    LOOM_TRY(loom_model_backward(g->m, NULL, dinput ? &din : NULL));
  } else {
    dout = loom_tensor_view(g->r, LOOM_F32, out.ndim, out.shape);
    LOOM_TRY(loom_model_backward(g->m, &dout, dinput ? &din : NULL));
  }
  memcpy(dparams, loom_model_grads(g->m),
         (size_t)loom_model_num_params(g->m) * sizeof(float));
  return LOOM_OK;
}

/* Central difference of the objective in x[i]: the step actually taken in
 * float is used as the denominator. *kink is set when the one-sided slopes
 * disagree beyond the tolerance (only with g->kinked). */
__attribute__((unused)) static double gc_fd(gc *g, float *x, double h,
                                            bool *kink) {
  float orig = *x;
  *x = (float)(orig + h);
  float up = *x;
  double lp = gc_loss(g);
  *x = (float)(orig - h);
  float dn = *x;
  double lm = gc_loss(g);
  *x = orig;
  double central = (lp - lm) / ((double)up - (double)dn);
  *kink = false;
  if (g->kinked) {
    double right = (lp - g->l0) / ((double)up - (double)orig);
    double left = (g->l0 - lm) / ((double)orig - (double)dn);
    *kink = fabs(right - left) > g->atol + g->rtol * fabs(central);
  }
  return central;
}

/* Fills fd[0..n) with finite differences over x[0..n); kinked coordinates
 * take the analytic value (excluded) and are counted. */
__attribute__((unused)) static int64_t
gc_fd_range(gc *g, float *x, const float *analytic, float *fd, int64_t n) {
  int64_t skipped = 0;
  for (int64_t i = 0; i < n; i++) {
    bool kink;
    fd[i] = (float)gc_fd(g, x + i, g->h, &kink);
    if (kink) {
      fd[i] = analytic[i];
      skipped++;
    }
  }
  return skipped;
}

__attribute__((unused)) static bool gc_skips_ok(gc *g, const char *what,
                                                const char *name,
                                                int64_t skipped, int64_t n) {
  if (skipped == 0)
    return true;
  double cap = g->max_skip * (double)n;
  bool ok = (double)skipped <= (cap > 2.0 ? cap : 2.0);
  fprintf(ok ? stdout : stderr,
          "    %s: %s: %lld of %lld coordinates skipped (a kink within h "
          "%g)%s\n",
          what, name, (long long)skipped, (long long)n, g->h,
          ok ? "" : ": too many");
  return ok;
}

/* Checks every parameter (view by view) and, for f32 inputs, every input
 * element. Returns the number of failed views. */
__attribute__((unused)) static int gc_check(gc *g, const char *what) {
  int64_t n = loom_model_num_params(g->m);
  int64_t ni = loom_tensor_numel(&g->in);
  bool with_input = g->in.dtype == LOOM_F32;
  float *ga = loom_malloc((size_t)(n + 1) * sizeof(float));
  float *fd = loom_malloc((size_t)(n + 1) * sizeof(float));
  float *gi = loom_malloc((size_t)(ni + 1) * sizeof(float));
  float *fi = loom_malloc((size_t)(ni + 1) * sizeof(float));
  int failed = 0;
  loom_status st = LOOM_ERR_NOMEM;
  TT_CHECK(ga && fd && gi && fi);
  if (!(ga && fd && gi && fi)) {
    failed++;
    goto done;
  }
  st = gc_backward(g, ga, with_input ? gi : NULL);
  TT_CHECK_OK(st);
  if (st != LOOM_OK) {
    failed++;
    goto done;
  }
  float *p = loom_model_params(g->m);
  g->l0 = gc_loss(g);
  for (int v = 0; v < loom_model_num_views(g->m); v++) {
    const loom_param *pv = loom_model_view(g->m, v);
    int64_t skipped = gc_fd_range(g, p + pv->offset, ga + pv->offset,
                                  fd + pv->offset, pv->numel);
    if (!gc_skips_ok(g, what, pv->name, skipped, pv->numel)) {
      TT_CHECK(!"too many kinked coordinates");
      failed++;
    }
    if (!TT_CHECK_CLOSE(ga + pv->offset, fd + pv->offset, (size_t)pv->numel,
                        g->atol, g->rtol)) {
      fprintf(stderr,
              "    %s: parameter %s (analytic vs finite difference, "
              "h %g)\n",
              what, pv->name, g->h);
      failed++;
    }
  }
  if (with_input) {
    int64_t skipped = gc_fd_range(g, g->in.data, gi, fi, ni);
    if (!gc_skips_ok(g, what, "input", skipped, ni)) {
      TT_CHECK(!"too many kinked coordinates");
      failed++;
    }
    if (!TT_CHECK_CLOSE(gi, fi, (size_t)ni, g->atol, g->rtol)) {
      fprintf(stderr, "    %s: input gradient (h %g)\n", what, g->h);
      failed++;
    }
  }
done:
  loom_free(ga);
  loom_free(fd);
  loom_free(gi);
  loom_free(fi);
  return failed;
}

#endif
