/* The kernels' faster forms give the bits of the forms they replace: the
 * `_to` backward passes (written, not added) against the adding ones into
 * zeros, the vectorised 2x2 max pooling and the row-streaming bias
 * gradient against plain scalar loops in the documented order, at 1, 2 and
 * 3 threads. */
#include <math.h>
#include <stdlib.h>

#include "kt.h"

enum { NE = 100003 }; /* elementwise: vector body and a tail */

/* Signed zeros, infinities and NaNs among ordinary values. */
static void salt(float *x, size_t n, uint64_t seed) {
  static const float odd[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-42f};
  loom_rng r = loom_rng_init(seed, 3);
  for (size_t k = 0; k < n / 50; k++)
    x[loom_rng_below(&r, n)] = odd[loom_rng_below(&r, 6)];
}

/* A buffer full of NaNs: every element a `_to` kernel forgets shows. */
static float *garbage(size_t n) {
  float *x = loom_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = NAN;
  return x;
}

static const int threads[] = {1, 2, 3};

TT_TEST(relu_gelu_backward_to) {
  float *x = kt_rand(NE, 1, -2, 2), *d = kt_rand(NE, 2, -1, 1);
  salt(x, NE, 3);
  salt(d, NE, 4);
  float *ref = kt_zeros(NE), *gref = kt_zeros(NE);
  loom_set_threads(1);
  loom_relu_backward(ref, x, d, NE);
  loom_gelu_backward(gref, x, d, NE);
  for (int t = 0; t < 3; t++) {
    loom_set_threads(threads[t]);
    float *out = garbage(NE), *gout = garbage(NE);
    loom_relu_backward_to(out, x, d, NE);
    loom_gelu_backward_to(gout, x, d, NE);
    KT_CHECK_SAME_BITS(out, ref, NE);
    KT_CHECK_SAME_BITS(gout, gref, NE);
    loom_free(out);
    loom_free(gout);
  }
  /* -0 in dout where the input is positive: +0 out, as 0 + -0 */
  float xi = 1.0f, di = -0.0f, o = NAN;
  loom_relu_backward_to(&o, &xi, &di, 1);
  TT_CHECK(!signbit(o) && o == 0.0f);
  loom_free(x);
  loom_free(d);
  loom_free(ref);
  loom_free(gref);
}

/* The scalar 2x2/stride-2 pooling of the reference: first maximum wins
 * ties, NaN never beats the current maximum. */
static void pool_ref(float *out, int32_t *am, const float *inp, int planes,
                     int H, int W, int K, int S) {
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  for (int pl = 0; pl < planes; pl++) {
    const float *x = inp + (int64_t)pl * H * W;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        int best = oh * S * W + ow * S;
        float m = x[best];
        for (int kh = 0; kh < K; kh++)
          for (int kw = 0; kw < K; kw++) {
            int at = (oh * S + kh) * W + ow * S + kw;
            if (x[at] > m) {
              m = x[at];
              best = at;
            }
          }
        out[((int64_t)pl * OH + oh) * OW + ow] = m;
        am[((int64_t)pl * OH + oh) * OW + ow] = best;
      }
  }
}

static void pool_case(int N, int C, int H, int W, int K, int S) {
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * OH * OW;
  float *x = kt_rand(ni, 5, -1, 1);
  salt(x, ni, 6);
  /* ties: whole windows of equal values */
  for (size_t i = 0; i < ni; i += 97)
    x[i] = x[i + 1 < ni ? i + 1 : i];
  float *d = kt_rand(no, 7, -1, 1);
  float *ref = loom_malloc(no * sizeof(float));
  int32_t *aref = loom_malloc(no * sizeof(int32_t));
  pool_ref(ref, aref, x, N * C, H, W, K, S);
  float *dref = kt_zeros(ni);
  loom_set_threads(1);
  loom_maxpool2d_backward(dref, d, aref, N, C, H, W, K, S);
  for (int t = 0; t < 3; t++) {
    loom_set_threads(threads[t]);
    float *out = garbage(no), *dx = garbage(ni);
    int32_t *am = loom_malloc(no * sizeof(int32_t));
    loom_maxpool2d_forward(out, am, x, N, C, H, W, K, S);
    KT_CHECK_SAME_BITS(out, ref, no);
    TT_CHECK(memcmp(am, aref, no * sizeof(int32_t)) == 0);
    loom_maxpool2d_backward_to(dx, d, am, N, C, H, W, K, S);
    KT_CHECK_SAME_BITS(dx, dref, ni);
    loom_free(out);
    loom_free(dx);
    loom_free(am);
  }
  loom_free(x);
  loom_free(d);
  loom_free(ref);
  loom_free(aref);
  loom_free(dref);
}

/* ReLU then pooling, fused, against the two kernels one after the other. */
static void relu_pool_case(int N, int C, int H, int W, int K, int S) {
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * OH * OW;
  float *x = kt_rand(ni, 12, -1, 1);
  salt(x, ni, 13);
  float *d = kt_rand(no, 14, -1, 1);
  salt(d, no, 15);
  loom_set_threads(1);
  float *r = garbage(ni), *ref = garbage(no), *pd = garbage(ni);
  float *dref = garbage(ni);
  int32_t *aref = loom_malloc(no * sizeof(int32_t));
  loom_relu_forward(r, x, (int64_t)ni);
  loom_maxpool2d_forward(ref, aref, r, N, C, H, W, K, S);
  loom_maxpool2d_backward_to(pd, d, aref, N, C, H, W, K, S);
  loom_relu_backward_to(dref, x, pd, (int64_t)ni);
  for (int t = 0; t < 3; t++) {
    loom_set_threads(threads[t]);
    float *out = garbage(no), *dx = garbage(ni);
    int32_t *am = loom_malloc(no * sizeof(int32_t));
    loom_relu_maxpool2d_forward(out, am, x, N, C, H, W, K, S);
    KT_CHECK_SAME_BITS(out, ref, no);
    TT_CHECK(memcmp(am, aref, no * sizeof(int32_t)) == 0);
    loom_relu_maxpool2d_backward_to(dx, d, am, x, N, C, H, W, K, S);
    KT_CHECK_SAME_BITS(dx, dref, ni);
    loom_free(out);
    loom_free(dx);
    loom_free(am);
  }
  loom_free(x);
  loom_free(d);
  loom_free(r);
  loom_free(ref);
  loom_free(pd);
  loom_free(dref);
  loom_free(aref);
}

TT_TEST(relu_maxpool_fused) {
  relu_pool_case(4, 5, 24, 24, 2, 2);
  relu_pool_case(2, 3, 9, 11, 2, 2);
  relu_pool_case(2, 3, 13, 15, 3, 2); /* overlapping: the two-pass form */
  relu_pool_case(2, 2, 12, 12, 3, 3);
}

/* 24 wide: one vector of 8 outputs and a tail of 4; 8 wide: tail only; 35:
 * odd width; 3x3 stride 2: overlapping windows. */
TT_TEST(maxpool_forward_backward_to) {
  pool_case(4, 5, 24, 24, 2, 2);
  pool_case(3, 4, 8, 8, 2, 2);
  pool_case(2, 3, 35, 37, 2, 2);
  pool_case(2, 3, 13, 15, 3, 2);
}

/* dbias(OC) = sum over rows in chunks of 64, each from zero, the chunks
 * added from zero, then added to dbias: the documented order. */
static void bias_ref(float *db, const float *d, int N, int OC) {
  for (int c = 0; c < OC; c++) {
    float tot = 0.0f;
    for (int n0 = 0; n0 < N; n0 += 64) {
      float part = 0.0f;
      for (int n = n0; n < N && n < n0 + 64; n++)
        part += d[(int64_t)n * OC + c];
      tot += part;
    }
    db[c] += tot;
  }
}

static void bias_case(int N, int C, int OC) {
  float *d = kt_rand((size_t)N * OC, 8, -1, 1);
  float *x = kt_rand((size_t)N * C, 9, -1, 1);
  float *w = kt_rand((size_t)OC * C, 10, -1, 1);
  float *ref = kt_rand((size_t)OC, 11, -1, 1);
  float *start = kt_copy(ref, (size_t)OC);
  bias_ref(ref, d, N, OC);
  for (int t = 0; t < 3; t++) {
    loom_set_threads(threads[t]);
    float *db = kt_copy(start, (size_t)OC), *dw = kt_zeros((size_t)OC * C);
    TT_CHECK_OK(loom_linear_backward(NULL, dw, db, d, x, w, N, C, OC));
    KT_CHECK_SAME_BITS(db, ref, (size_t)OC);
    loom_free(db);
    loom_free(dw);
  }
  loom_free(d);
  loom_free(x);
  loom_free(w);
  loom_free(ref);
  loom_free(start);
}

/* Column counts under, at and over a block, rows with a partial chunk. */
TT_TEST(bias_gradient_order) {
  bias_case(200, 8, 10);
  bias_case(4096, 8, 384);
  bias_case(130, 4, 600);
}

int main(void) {
  TT_RUN(relu_gelu_backward_to);
  TT_RUN(maxpool_forward_backward_to);
  TT_RUN(relu_maxpool_fused);
  TT_RUN(bias_gradient_order);
  return tt_finish();
}
