/* Softmax cross-entropy loss with mean reduction, accuracy counts. */
#include <immintrin.h>
#include <math.h>

#include "internal.h"

struct loom_xent {
  int64_t cap; /* rows the buffers hold */
  int64_t cap_probs;
  float *probs;  /* (N,V) */
  float *losses; /* (N) */
  float *dloss;  /* (N) */
  const int32_t *targets;
  int N, V;
  int64_t count;
  bool have;
  /* Vocabulary-parallel (loom_xent_set_tp): this rank's classes are
   * [v0, v0 + V) of V x tp->size; red holds (4N) the row maxima, the sums
   * of exponentials, the targets' logits and the argmax, reduced over the
   * group. */
  const loom_tp *tp;
  float *red;
  int64_t cap_red;
};

loom_status loom_xent_new(loom_xent **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_xent_new: NULL out");
  *out = loom_calloc(1, sizeof **out);
  return *out ? LOOM_OK : LOOM_ERR_NOMEM;
}

void loom_xent_free(loom_xent *x) {
  if (!x)
    return;
  loom_free(x->probs);
  loom_free(x->losses);
  loom_free(x->dloss);
  loom_free(x->red);
  loom_free(x);
}

void loom_xent_set_tp(loom_xent *x, const loom_tp *tp) {
  x->tp = tp && tp->size > 1 ? tp : NULL;
  x->have = false;
}

/* The softmax of rows cut over the group: each rank's part of the
 * probabilities (normalised by the whole row's sum), the rows' losses and
 * the argmax of the whole row (ties: the first class). */
static loom_status forward_tp(loom_xent *x, const float *z,
                              const int32_t *targets, int64_t N, int V,
                              int64_t *correct) {
  const loom_tp *tp = x->tp;
  const int64_t v0 = (int64_t)tp->rank * V, Vall = (int64_t)V * tp->size;
  if (4 * N > x->cap_red) {
    float *r = loom_malloc((size_t)(4 * N) * sizeof(float));
    if (!r)
      return LOOM_ERR_NOMEM;
    loom_free(x->red);
    x->red = r;
    x->cap_red = 4 * N;
  }
  float *mx = x->red, *sum = mx + N, *zt = sum + N, *arg = zt + N;
  loom_row_max(mx, z, (int)N, V);
  LOOM_TRY(loom_tp_allreduce(tp, mx, N, LOOM_TP_MAX));
  loom_exp_rows(x->probs, sum, z, mx, (int)N, V);
  for (int64_t i = 0; i < N; i++) {
    int64_t k = (int64_t)targets[i] - v0;
    zt[i] = k >= 0 && k < V ? z[i * V + k] : 0.0f;
    /* the first class holding the row's maximum, Vall where none here */
    arg[i] = (float)Vall;
    const float *row = z + i * V;
    for (int j = 0; j < V; j++)
      if (row[j] == mx[i]) {
        arg[i] = (float)(v0 + j);
        break;
      }
  }
  /* the sums and the targets' logits in one reduction, the argmax apart */
  LOOM_TRY(tp->start(tp->user, 0, sum, 2 * N, LOOM_TP_SUM));
  LOOM_TRY(tp->start(tp->user, 1, arg, N, LOOM_TP_MIN));
  loom_status s0 = tp->wait(tp->user, 0), s1 = tp->wait(tp->user, 1);
  LOOM_TRY(s0);
  LOOM_TRY(s1);
  int64_t good = 0;
  for (int64_t i = 0; i < N; i++) {
    const float inv = 1.0f / sum[i];
    float *p = x->probs + i * V;
    for (int j = 0; j < V; j++)
      p[j] *= inv;
    x->losses[i] = targets[i] < 0 ? 0.0f : logf(sum[i]) - (zt[i] - mx[i]);
    good += targets[i] >= 0 && (int64_t)arg[i] == targets[i];
  }
  *correct = good;
  return LOOM_OK;
}

static loom_status check_logits(const loom_tensor *t, int64_t *N, int *V) {
  if (!t || !t->data || t->dtype != LOOM_F32 || t->ndim < 1 ||
      !loom_tensor_is_contiguous(t))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "cross-entropy: logits must be a contiguous f32 tensor");
  int64_t v = t->shape[t->ndim - 1];
  int64_t n = loom_tensor_numel(t);
  if (v <= 0 || n <= 0 || n > INT32_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "cross-entropy: logits of %lld elements, %lld classes",
                      (long long)n, (long long)v);
  *N = n / v;
  *V = (int)v;
  return LOOM_OK;
}

static loom_status grow(loom_xent *x, int64_t N, int64_t NV) {
  if (N > x->cap) {
    float *l = loom_malloc((size_t)N * sizeof(float));
    float *d = loom_malloc((size_t)N * sizeof(float));
    if (!l || !d) {
      loom_free(l);
      loom_free(d);
      return LOOM_ERR_NOMEM;
    }
    loom_free(x->losses);
    loom_free(x->dloss);
    x->losses = l;
    x->dloss = d;
    x->cap = N;
  }
  if (NV > x->cap_probs) {
    float *p = loom_malloc((size_t)NV * sizeof(float));
    if (!p)
      return LOOM_ERR_NOMEM;
    loom_free(x->probs);
    x->probs = p;
    x->cap_probs = NV;
  }
  return LOOM_OK;
}

/* The index of a row's first largest value, as the scan `best = 0; for j:
 * if (row[j] > row[best]) best = j` gives it (a NaN never wins; a NaN in
 * row[0] keeps 0): the max found 4 lanes at a time, then the first index
 * holding it. A row with a NaN takes the scan itself. */
static int row_argmax(const float *row, int V) {
  int j = 0;
  if (V >= 8) {
    __m128 m = _mm_loadu_ps(row), nan = _mm_cmpunord_ps(m, m);
    for (j = 4; j + 4 <= V; j += 4) {
      const __m128 v = _mm_loadu_ps(row + j);
      nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
      m = _mm_max_ps(m, v);
    }
    bool tail_nan = false;
    for (int k = j; k < V; k++)
      tail_nan |= isnan(row[k]);
    if (!_mm_movemask_ps(nan) && !tail_nan) {
      float lane[4];
      _mm_storeu_ps(lane, m);
      float top = lane[0];
      for (int k = 1; k < 4; k++)
        top = lane[k] > top ? lane[k] : top;
      for (int k = j; k < V; k++)
        top = row[k] > top ? row[k] : top;
      for (int k = 0; k < V; k++)
        if (row[k] == top)
          return k;
    }
  }
  int best = 0;
  for (j = 1; j < V; j++)
    if (row[j] > row[best])
      best = j;
  return best;
}

loom_status loom_xent_forward(loom_xent *x, const loom_tensor *logits,
                              const int32_t *targets, loom_xent_stats *stats) {
  int64_t N = 0; /* set: the analyzer cannot see that check_logits fails */
  int V = 0;     /* whenever it leaves them */
  if (!x)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_xent_forward: NULL xent");
  x->have = false;
  LOOM_TRY(check_logits(logits, &N, &V));
  if (!targets)
    return loom_error(LOOM_ERR_INVALID_ARG, "cross-entropy: no targets");
  int64_t Vall = x->tp ? (int64_t)V * x->tp->size : V;
  for (int64_t i = 0; i < N; i++)
    if (targets[i] < -1 || targets[i] >= Vall)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "cross-entropy: target %d of row %lld outside [0, "
                        "%lld) (-1 ignores a row)",
                        targets[i], (long long)i, (long long)Vall);
  LOOM_TRY(grow(x, N, N * V));
  const float *z = logits->data; /* (N,V) */
  int64_t tp_correct = 0;
  if (x->tp)
    LOOM_TRY(forward_tp(x, z, targets, N, V, &tp_correct));
  else
    loom_crossentropy_forward(x->losses, x->probs, z, targets, (int)N, V);
  /* Summed in order in double: the same value at any thread count. */
  double sum = 0.0;
  int64_t count = 0, correct = 0;
  for (int64_t i = 0; i < N; i++) {
    if (targets[i] < 0)
      continue;
    sum += x->losses[i];
    count++;
    if (x->tp)
      continue; /* the argmax spans the ranks: forward_tp counted */
    correct += row_argmax(z + i * V, V) == targets[i];
  }
  correct += tp_correct;
  x->targets = targets;
  x->N = (int)N;
  x->V = V;
  x->count = count;
  x->have = true;
  if (stats) {
    stats->loss_sum = sum;
    stats->count = count;
    stats->correct = correct;
    stats->loss = count ? sum / (double)count : 0.0;
  }
  return LOOM_OK;
}

loom_status loom_xent_backward(loom_xent *x, loom_tensor *dlogits,
                               float scale) {
  if (!x)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_xent_backward: NULL xent");
  if (!x->have)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "cross-entropy: backward needs a forward first");
  int64_t N = 0;
  int V = 0;
  LOOM_TRY(check_logits(dlogits, &N, &V));
  if (N != x->N || V != x->V)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "cross-entropy: gradient of %lld x %d logits, forward "
                      "had %d x %d",
                      (long long)N, V, x->N, x->V);
  float d = x->count ? (float)((double)scale / (double)x->count) : 0.0f;
  for (int i = 0; i < x->N; i++)
    x->dloss[i] = x->targets[i] < 0 ? 0.0f : d;
  memset(dlogits->data, 0, (size_t)N * V * sizeof(float));
  if (x->tp) {
    /* this rank's part of (probs - onehot(target)) * dloss */
    const int64_t v0 = (int64_t)x->tp->rank * x->V;
    float *dz = dlogits->data;
    for (int64_t i = 0; i < x->N; i++) {
      if (x->targets[i] < 0)
        continue;
      const float *p = x->probs + i * x->V;
      float *row = dz + i * x->V;
      const float dl = x->dloss[i];
      for (int j = 0; j < x->V; j++)
        row[j] = p[j] * dl;
      int64_t k = (int64_t)x->targets[i] - v0;
      if (k >= 0 && k < x->V)
        row[k] -= dl;
    }
    return LOOM_OK;
  }
  loom_crossentropy_backward(dlogits->data, x->probs, x->targets, x->dloss,
                             x->N, x->V);
  return LOOM_OK;
}
