/* Softmax cross-entropy loss with mean reduction, accuracy counts. */
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
};

loom_status loom_xent_new(loom_xent **out) {
  *out = loom_calloc(1, sizeof **out);
  return *out ? LOOM_OK : LOOM_ERR_NOMEM;
}

void loom_xent_free(loom_xent *x) {
  if (!x)
    return;
  loom_free(x->probs);
  loom_free(x->losses);
  loom_free(x->dloss);
  loom_free(x);
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

loom_status loom_xent_forward(loom_xent *x, const loom_tensor *logits,
                              const int32_t *targets, loom_xent_stats *stats) {
  int64_t N = 0; /* set: the analyzer cannot see that check_logits fails */
  int V = 0;     /* whenever it leaves them */
  x->have = false;
  LOOM_TRY(check_logits(logits, &N, &V));
  if (!targets)
    return loom_error(LOOM_ERR_INVALID_ARG, "cross-entropy: no targets");
  for (int64_t i = 0; i < N; i++)
    if (targets[i] < -1 || targets[i] >= V)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "cross-entropy: target %d of row %lld outside [0, %d) "
                        "(-1 ignores a row)",
                        targets[i], (long long)i, V);
  LOOM_TRY(grow(x, N, N * V));
  const float *z = logits->data; /* (N,V) */
  loom_crossentropy_forward(x->losses, x->probs, z, targets, (int)N, V);
  /* Summed in order in double: the same value at any thread count. */
  double sum = 0.0;
  int64_t count = 0, correct = 0;
  for (int64_t i = 0; i < N; i++) {
    if (targets[i] < 0)
      continue;
    sum += x->losses[i];
    count++;
    const float *row = z + i * V;
    int best = 0;
    for (int j = 1; j < V; j++)
      if (row[j] > row[best])
        best = j;
    correct += best == targets[i];
  }
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
  loom_crossentropy_backward(dlogits->data, x->probs, x->targets, x->dloss,
                             x->N, x->V);
  return LOOM_OK;
}
