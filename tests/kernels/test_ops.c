/* Kernels other than GEMM, attention and convolution, against plain
 * references in double over many shapes (size 1, odd sizes, sizes that are
 * no multiple of the vector width): elementwise ops, dropout, softmax,
 * log-softmax, cross-entropy, layernorm, linear, embedding, max pooling;
 * the vectorised exp and tanh; CPU features. */
#include <stdlib.h>

#include "kernels/internal.h"
#include "kt.h"

static const int sizes[] = {1, 2, 7, 15, 16, 17, 33, 100, 257, 1000};
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

/* ------------------------------------------------------------ exp, tanh */

TT_TEST(expf_accuracy) {
  double worst = 0;
  for (int i = 0; i <= 400000; i++) {
    const float x = -87.0f + 175.0f * (float)i / 400000.0f;
    const double want = exp((double)x);
    const double got = loom_kern_expf(x);
    const double rel = fabs(got - want) / want;
    if (rel > worst)
      worst = rel;
  }
  TT_CHECK(worst < 2.5e-7); /* about 2 ulp */
  if (worst >= 2.5e-7)
    fprintf(stderr, "    worst relative error %.3g\n", worst);
  TT_CHECK(loom_kern_expf(0.0f) == 1.0f);
  TT_CHECK(loom_kern_expf(-100.0f) == 0.0f);
  TT_CHECK(loom_kern_expf(-INFINITY) == 0.0f);
  TT_CHECK(isnan(loom_kern_expf(NAN)));
  TT_CHECK(isfinite(loom_kern_expf(1000.0f)));
  double tw = 0;
  for (int i = 0; i <= 100000; i++) {
    const float x = -12.0f + 24.0f * (float)i / 100000.0f;
    const double d = fabs((double)loom_kern_tanhf(x) - tanh((double)x));
    if (d > tw)
      tw = d;
  }
  TT_CHECK(tw < 3e-7);
  TT_CHECK(loom_kern_tanhf(0.0f) == 0.0f);
  TT_CHECK(loom_kern_tanhf(-30.0f) == -1.0f);
}

/* The documented order of the fixed-order sums, written plainly: 16 lane
 * sums, the tree j += j+8, j += j+4, j += j+2, j += j+1, then the tail.
 * The kernels' AVX2 code must give exactly these bits (so a build without
 * AVX2, which runs this very loop, agrees with one with). */
static float lanes_sum(const float *x, const float *y, float c, int kind,
                       int n) {
  float acc[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) {
      const float d = x[i + j] - c;
      acc[j] = kind == 0   ? acc[j] + x[i + j]
               : kind == 1 ? fmaf(x[i + j], y[i + j], acc[j])
                           : fmaf(d, d, acc[j]);
    }
  for (int w = 8; w > 0; w /= 2)
    for (int j = 0; j < w; j++)
      acc[j] += acc[j + w];
  float s = acc[0];
  for (; i < n; i++) {
    const float d = x[i] - c;
    s = kind == 0 ? s + x[i] : kind == 1 ? fmaf(x[i], y[i], s) : fmaf(d, d, s);
  }
  return s;
}

TT_TEST(fixed_order_reductions) {
  for (int s = 0; s < NSIZES; s++) {
    const int n = sizes[s];
    float *x = kt_rand(n, 3 + s, -2, 2), *y = kt_rand(n, 4 + s, -2, 2);
    TT_REQUIRE(x && y);
    double sum = 0, dot = 0, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
      sum += x[i];
      dot += (double)x[i] * y[i];
      mx = x[i] > mx ? x[i] : mx;
    }
    TT_CHECK_NEAR(loom_kern_sum(x, n), sum, 1e-5 * n);
    TT_CHECK_NEAR(loom_kern_dot(x, y, n), dot, 1e-5 * n);
    TT_CHECK(loom_kern_max(x, n) == (float)mx);
    const float s0 = loom_kern_sum(x, n), s1 = loom_kern_dot(x, y, n);
    const float s2 = loom_kern_sqdev(x, 0.3f, n);
    const float r0 = lanes_sum(x, y, 0, 0, n), r1 = lanes_sum(x, y, 0, 1, n);
    const float r2 = lanes_sum(x, y, 0.3f, 2, n);
    TT_CHECK(memcmp(&s0, &r0, 4) == 0);
    TT_CHECK(memcmp(&s1, &r1, 4) == 0);
    TT_CHECK(memcmp(&s2, &r2, 4) == 0);
    loom_free(x);
    loom_free(y);
  }
}

/* ---------------------------------------------------------- elementwise */

static double gelu_d(double x) {
  const double s = sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + tanh(s * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_d(double x) {
  const double s = sqrt(2.0 / M_PI);
  const double u = s * (x + 0.044715 * x * x * x);
  const double th = tanh(u);
  return 0.5 * (1.0 + th) +
         0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

TT_TEST(elementwise_ops) {
  for (int si = 0; si < NSIZES; si++) {
    const int n = sizes[si];
    float *a = kt_rand(n, 10 + si, -4, 4), *b = kt_rand(n, 20 + si, -4, 4);
    float *out = kt_zeros(n), *ref = kt_zeros(n), *g0 = kt_rand(n, 30, -1, 1);
    float *g = kt_zeros(n);
    TT_REQUIRE(a && b && out && ref && g0 && g);
    loom_add_forward(out, a, b, n);
    for (int i = 0; i < n; i++)
      ref[i] = a[i] + b[i];
    TT_CHECK(kt_same_bits(out, ref, n));
    memcpy(out, a, n * sizeof(float));
    loom_accumulate(out, b, n);
    TT_CHECK(kt_same_bits(out, ref, n));
    memcpy(out, a, n * sizeof(float));
    loom_scale(out, -0.5f, n);
    for (int i = 0; i < n; i++)
      ref[i] = a[i] * -0.5f;
    TT_CHECK(kt_same_bits(out, ref, n));
    /* ReLU: forward, and backward adds into what was there */
    loom_relu_forward(out, a, n);
    for (int i = 0; i < n; i++)
      ref[i] = a[i] > 0 ? a[i] : 0;
    TT_CHECK(kt_same_bits(out, ref, n));
    memcpy(g, g0, n * sizeof(float));
    loom_relu_backward(g, a, b, n);
    for (int i = 0; i < n; i++)
      ref[i] = g0[i] + (a[i] > 0 ? b[i] : 0);
    TT_CHECK(kt_same_bits(g, ref, n));
    /* GELU against the formula in double */
    loom_gelu_forward(out, a, n);
    for (int i = 0; i < n; i++)
      ref[i] = (float)gelu_d(a[i]);
    TT_CHECK_CLOSE(out, ref, n, 1e-6, 1e-6);
    memcpy(g, g0, n * sizeof(float));
    loom_gelu_backward(g, a, b, n);
    for (int i = 0; i < n; i++)
      ref[i] = (float)(g0[i] + gelu_grad_d(a[i]) * b[i]);
    TT_CHECK_CLOSE(g, ref, n, 2e-6, 1e-5);
    loom_free(a);
    loom_free(b);
    loom_free(out);
    loom_free(ref);
    loom_free(g0);
    loom_free(g);
  }
}

TT_TEST(dropout_masks) {
  const int n = 100003;
  const float p = 0.3f;
  float *x = kt_rand(n, 5, -1, 1), *out = kt_zeros(n),
        *g = kt_rand(n, 6, -1, 1);
  float *g0 = kt_copy(g, n), *d = kt_rand(n, 7, -1, 1);
  uint8_t *mask = loom_malloc(n);
  TT_REQUIRE(x && out && g && g0 && d && mask);
  loom_rng r = loom_rng_init(1234, 5);
  loom_rng_seek(&r, 3); /* a counter not on a block boundary */
  loom_dropout_forward(out, mask, x, p, &r, n);
  TT_CHECK_EQ(r.counter, 3 + (uint64_t)n);
  loom_rng check = loom_rng_init(1234, 5);
  loom_rng_seek(&check, 3);
  int kept = 0, wrong = 0;
  const float scale = 1.0f / (1.0f - p);
  for (int i = 0; i < n; i++) {
    const int keep = loom_rng_uniform(&check) >= p;
    kept += keep;
    if (mask[i] != keep || out[i] != (keep ? x[i] * scale : 0.0f))
      wrong++;
  }
  TT_CHECK_EQ(wrong, 0);
  TT_CHECK(fabs((double)kept / n - (1.0 - p)) < 0.01);
  loom_dropout_backward(g, mask, d, p, n);
  wrong = 0;
  for (int i = 0; i < n; i++)
    if (g[i] != (mask[i] ? fmaf(scale, d[i], g0[i]) : g0[i]))
      wrong++;
  TT_CHECK_EQ(wrong, 0);
  /* p = 0 keeps everything and still advances the counter */
  loom_dropout_forward(out, mask, x, 0.0f, &r, 10);
  TT_CHECK(out[9] == x[9] && mask[0] == 1);
  TT_CHECK_EQ(r.counter, 13 + (uint64_t)n);
  /* the same counter gives the same mask at any thread count */
  uint8_t *mask2 = loom_malloc(n);
  float *out2 = kt_zeros(n);
  TT_REQUIRE(mask2 && out2);
  for (int t = 1; t <= 3; t += 2) {
    loom_set_threads(t);
    loom_rng a = loom_rng_init(9, 9);
    loom_dropout_forward(t == 1 ? out : out2, t == 1 ? mask : mask2, x, 0.5f,
                         &a, n);
  }
  loom_set_threads(0);
  TT_CHECK(memcmp(mask, mask2, n) == 0);
  TT_CHECK(kt_same_bits(out, out2, n));
  loom_free(x);
  loom_free(out);
  loom_free(out2);
  loom_free(g);
  loom_free(g0);
  loom_free(d);
  loom_free(mask);
  loom_free(mask2);
}

/* --------------------------------------------------- softmax family */

static const int rowshapes[][2] = {{1, 1},  {1, 5},   {3, 1},    {4, 16},
                                   {5, 17}, {2, 257}, {7, 1000}, {40, 33}};
#define NROWSHAPES (int)(sizeof rowshapes / sizeof rowshapes[0])

TT_TEST(softmax_and_log_softmax) {
  for (int s = 0; s < NROWSHAPES; s++) {
    const int N = rowshapes[s][0], C = rowshapes[s][1];
    const size_t nc = (size_t)N * C;
    /* large logits: a naive exp would overflow */
    float *x = kt_rand(nc, 40 + s, -30, 30), *y = kt_zeros(nc),
          *r = kt_zeros(nc);
    float *d = kt_rand(nc, 50 + s, -1, 1), *g0 = kt_rand(nc, 60, -1, 1);
    float *g = kt_copy(g0, nc);
    TT_REQUIRE(x && y && r && d && g0 && g);
    for (size_t i = 0; i < nc; i++)
      x[i] += 80.0f;
    loom_softmax_forward(y, x, N, C);
    for (int n = 0; n < N; n++) {
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < C; j++)
        m = fmax(m, x[n * C + j]);
      for (int j = 0; j < C; j++)
        sum += exp((double)x[n * C + j] - m);
      for (int j = 0; j < C; j++)
        r[n * C + j] = (float)(exp((double)x[n * C + j] - m) / sum);
    }
    TT_CHECK_CLOSE(y, r, nc, 1e-7, 1e-5);
    loom_softmax_backward(g, y, d, N, C);
    for (int n = 0; n < N; n++) {
      double dot = 0;
      for (int j = 0; j < C; j++)
        dot += (double)y[n * C + j] * d[n * C + j];
      for (int j = 0; j < C; j++)
        r[n * C + j] =
            (float)(g0[n * C + j] + y[n * C + j] * (d[n * C + j] - dot));
    }
    TT_CHECK_CLOSE(g, r, nc, 1e-6, 1e-5);
    /* log-softmax */
    loom_log_softmax_forward(y, x, N, C);
    for (int n = 0; n < N; n++) {
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < C; j++)
        m = fmax(m, x[n * C + j]);
      for (int j = 0; j < C; j++)
        sum += exp((double)x[n * C + j] - m);
      for (int j = 0; j < C; j++)
        r[n * C + j] = (float)((double)x[n * C + j] - m - log(sum));
    }
    TT_CHECK_CLOSE(y, r, nc, 2e-5, 1e-5);
    memcpy(g, g0, nc * sizeof(float));
    loom_log_softmax_backward(g, y, d, N, C);
    for (int n = 0; n < N; n++) {
      double sd = 0;
      for (int j = 0; j < C; j++)
        sd += d[n * C + j];
      for (int j = 0; j < C; j++)
        r[n * C + j] = (float)(g0[n * C + j] + d[n * C + j] -
                               exp((double)y[n * C + j]) * sd);
    }
    TT_CHECK_CLOSE(g, r, nc, 1e-5, 1e-5);
    loom_free(x);
    loom_free(y);
    loom_free(r);
    loom_free(d);
    loom_free(g0);
    loom_free(g);
  }
}

TT_TEST(softmax_propagates_nan) {
  float x[5] = {1, NAN, 3, 4, 5}, y[5];
  loom_softmax_forward(y, x, 1, 5);
  TT_CHECK(isnan(y[0]) && isnan(y[4]));
}

TT_TEST(crossentropy) {
  for (int s = 0; s < NROWSHAPES; s++) {
    const int N = rowshapes[s][0], V = rowshapes[s][1];
    const size_t nv = (size_t)N * V;
    float *x = kt_rand(nv, 70 + s, -20, 20), *probs = kt_zeros(nv);
    float *loss = kt_zeros(N), *dl = kt_rand(N, 80, 0.1f, 1);
    float *g0 = kt_rand(nv, 90, -1, 1), *g = kt_copy(g0, nv), *r = kt_zeros(nv);
    int32_t *t = loom_malloc(N * sizeof(int32_t));
    TT_REQUIRE(x && probs && loss && dl && g0 && g && r && t);
    for (int n = 0; n < N; n++)
      t[n] = n % 4 == 3 ? -1 : (n * 7 + 3) % V; /* every 4th row ignored */
    loom_crossentropy_forward(loss, probs, x, t, N, V);
    for (int n = 0; n < N; n++) {
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < V; j++)
        m = fmax(m, x[n * V + j]);
      for (int j = 0; j < V; j++)
        sum += exp((double)x[n * V + j] - m);
      const double want = t[n] < 0 ? 0 : m + log(sum) - x[n * V + t[n]];
      TT_CHECK_NEAR(loss[n], want, 1e-5 + 1e-6 * fabs(want));
      for (int j = 0; j < V; j++) {
        const double p = exp((double)x[n * V + j] - m) / sum;
        r[n * V + j] = t[n] < 0
                           ? g0[n * V + j]
                           : (float)(g0[n * V + j] + (p - (j == t[n])) * dl[n]);
      }
    }
    loom_crossentropy_backward(g, probs, t, dl, N, V);
    TT_CHECK_CLOSE(g, r, nv, 1e-6, 1e-5);
    loom_free(x);
    loom_free(probs);
    loom_free(loss);
    loom_free(dl);
    loom_free(g0);
    loom_free(g);
    loom_free(r);
    loom_free(t);
  }
  /* a confident wrong answer costs its true loss, not inf */
  float x[3] = {0, 200, -200}, p[3], l;
  int32_t t = 2;
  loom_crossentropy_forward(&l, p, x, &t, 1, 3);
  TT_CHECK_NEAR(l, 400.0, 1e-3);
  /* a target out of range shows as NaN and gives no gradient */
  t = 3;
  float g[3] = {0, 0, 0}, one = 1;
  loom_crossentropy_forward(&l, p, x, &t, 1, 3);
  TT_CHECK(isnan(l));
  loom_crossentropy_backward(g, p, &t, &one, 1, 3);
  TT_CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0);
}

/* ------------------------------------------------------------ layernorm */

TT_TEST(layernorm) {
  for (int s = 0; s < NROWSHAPES; s++) {
    const int N = rowshapes[s][0], C = rowshapes[s][1];
    const size_t nc = (size_t)N * C;
    float *x = kt_rand(nc, 100 + s, -3, 5), *w = kt_rand(C, 101, 0.5f, 1.5f);
    float *b = kt_rand(C, 102, -1, 1), *y = kt_zeros(nc), *r = kt_zeros(nc);
    float *mean = kt_zeros(N), *rstd = kt_zeros(N),
          *d = kt_rand(nc, 103, -1, 1);
    float *gx0 = kt_rand(nc, 104, -1, 1), *gx = kt_copy(gx0, nc);
    float *gw0 = kt_rand(C, 105, -1, 1), *gw = kt_copy(gw0, C);
    float *gb0 = kt_rand(C, 106, -1, 1), *gb = kt_copy(gb0, C);
    float *rw = kt_zeros(C), *rb = kt_zeros(C);
    TT_REQUIRE(x && w && b && y && r && mean && rstd && d && gx && gw && gb &&
               rw && rb);
    for (size_t i = 0; i < nc; i += 3)
      x[i] += 100.0f; /* a large mean: the variance must not cancel */
    loom_layernorm_forward(y, mean, rstd, x, w, b, N, C);
    double *dm = calloc(N, sizeof(double)), *dr = calloc(N, sizeof(double));
    double *sw = calloc(C, sizeof(double)), *sb = calloc(C, sizeof(double));
    TT_REQUIRE(dm && dr && sw && sb);
    for (int n = 0; n < N; n++) {
      double m = 0, v = 0;
      for (int j = 0; j < C; j++)
        m += x[n * C + j];
      m /= C;
      for (int j = 0; j < C; j++)
        v += (x[n * C + j] - m) * (x[n * C + j] - m);
      v /= C;
      dm[n] = m;
      dr[n] = 1.0 / sqrt(v + 1e-5);
      TT_CHECK_NEAR(mean[n], m, 1e-5 * (1 + fabs(m)));
      TT_CHECK_NEAR(rstd[n], dr[n], 1e-4 * dr[n]);
      for (int j = 0; j < C; j++) {
        const double nrm = (x[n * C + j] - m) * dr[n];
        r[n * C + j] = (float)(nrm * w[j] + b[j]);
        sw[j] += nrm * d[n * C + j];
        sb[j] += d[n * C + j];
      }
    }
    TT_CHECK_CLOSE(y, r, nc, 1e-4, 1e-4);
    loom_layernorm_backward(gx, gw, gb, d, x, w, mean, rstd, N, C);
    for (int n = 0; n < N; n++) {
      double a = 0, bb = 0;
      for (int j = 0; j < C; j++) {
        const double nrm = (x[n * C + j] - dm[n]) * dr[n];
        a += d[n * C + j] * w[j];
        bb += d[n * C + j] * w[j] * nrm;
      }
      a /= C;
      bb /= C;
      for (int j = 0; j < C; j++) {
        const double nrm = (x[n * C + j] - dm[n]) * dr[n];
        r[n * C + j] = (float)(gx0[n * C + j] +
                               dr[n] * (d[n * C + j] * w[j] - a - nrm * bb));
      }
    }
    for (int j = 0; j < C; j++) {
      rw[j] = (float)(gw0[j] + sw[j]);
      rb[j] = (float)(gb0[j] + sb[j]);
    }
    TT_CHECK_CLOSE(gx, r, nc, 2e-4, 1e-3);
    TT_CHECK_CLOSE(gw, rw, C, 1e-4 * N, 1e-4);
    TT_CHECK_CLOSE(gb, rb, C, 1e-5 * N, 1e-5);
    /* NULL parameter gradients are allowed */
    loom_layernorm_backward(gx, NULL, NULL, d, x, w, mean, rstd, N, C);
    free(dm);
    free(dr);
    free(sw);
    free(sb);
    float *bufs[] = {x,   w,  b,   y,  r,   mean, rstd, d,
                     gx0, gx, gw0, gw, gb0, gb,   rw,   rb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      loom_free(bufs[i]);
  }
}

/* --------------------------------------------------------------- linear */

TT_TEST(linear) {
  static const int sh[][3] = {
      {1, 1, 1}, {3, 5, 7}, {17, 33, 10}, {128, 64, 130}};
  for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
    const int N = sh[s][0], C = sh[s][1], OC = sh[s][2];
    float *x = kt_rand((size_t)N * C, 200 + s, -1, 1);
    float *w = kt_rand((size_t)OC * C, 201, -1, 1),
          *b = kt_rand(OC, 202, -1, 1);
    float *y = kt_zeros((size_t)N * OC), *r = kt_zeros((size_t)N * OC);
    float *d = kt_rand((size_t)N * OC, 203, -1, 1);
    float *gx = kt_rand((size_t)N * C, 204, -1, 1),
          *rx = kt_copy(gx, (size_t)N * C);
    float *gw = kt_rand((size_t)OC * C, 205, -1, 1),
          *rw = kt_copy(gw, (size_t)OC * C);
    float *gb = kt_rand(OC, 206, -1, 1), *rb = kt_copy(gb, OC);
    TT_REQUIRE(x && w && b && y && r && d && gx && rx && gw && rw && gb && rb);
    TT_CHECK_OK(loom_linear_forward(y, x, w, b, N, C, OC));
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++)
        r[n * OC + o] = b[o];
    loom_gemm_ref(false, true, N, OC, C, 1, x, C, w, C, 1, r, OC);
    TT_CHECK_CLOSE(y, r, (size_t)N * OC, 1e-5 * C, 1e-5);
    TT_CHECK_OK(loom_linear_forward(y, x, w, NULL, N, C, OC));
    loom_gemm_ref(false, true, N, OC, C, 1, x, C, w, C, 0, r, OC);
    TT_CHECK_CLOSE(y, r, (size_t)N * OC, 1e-5 * C, 1e-5);
    TT_CHECK_OK(loom_linear_backward(gx, gw, gb, d, x, w, N, C, OC));
    loom_gemm_ref(false, false, N, C, OC, 1, d, OC, w, C, 1, rx, C);
    loom_gemm_ref(true, false, OC, C, N, 1, d, OC, x, C, 1, rw, C);
    for (int o = 0; o < OC; o++) {
      double sum = rb[o];
      for (int n = 0; n < N; n++)
        sum += d[n * OC + o];
      rb[o] = (float)sum;
    }
    TT_CHECK_CLOSE(gx, rx, (size_t)N * C, 1e-5 * OC, 1e-5);
    TT_CHECK_CLOSE(gw, rw, (size_t)OC * C, 1e-5 * N, 1e-5);
    TT_CHECK_CLOSE(gb, rb, OC, 1e-5 * N, 1e-5);
    TT_CHECK_OK(loom_linear_backward(NULL, NULL, NULL, d, x, w, N, C, OC));
    float *bufs[] = {x, w, b, y, r, d, gx, rx, gw, rw, gb, rb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      loom_free(bufs[i]);
  }
  TT_CHECK_EQ(loom_linear_forward(NULL, NULL, NULL, NULL, -1, 2, 2),
              LOOM_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------ embedding */

TT_TEST(embedding) {
  const int V = 11, C = 37, N = 50;
  float *table = kt_rand((size_t)V * C, 300, -1, 1),
        *out = kt_zeros((size_t)N * C);
  float *d = kt_rand((size_t)N * C, 301, -1, 1);
  float *g = kt_rand((size_t)V * C, 302, -1, 1), *r = kt_copy(g, (size_t)V * C);
  int32_t ids[50];
  TT_REQUIRE(table && out && d && g && r);
  for (int n = 0; n < N; n++)
    ids[n] = (n * n + 3) % V; /* repeats: the scatter must add */
  loom_embedding_forward(out, ids, table, N, C);
  int wrong = 0;
  for (int n = 0; n < N; n++)
    wrong += memcmp(out + n * C, table + ids[n] * C, C * sizeof(float)) != 0;
  TT_CHECK_EQ(wrong, 0);
  loom_embedding_backward(g, d, ids, N, C);
  for (int n = 0; n < N; n++) /* the same order: bitwise equal */
    for (int j = 0; j < C; j++)
      r[ids[n] * C + j] += d[n * C + j];
  TT_CHECK(kt_same_bits(g, r, (size_t)V * C));
  loom_free(table);
  loom_free(out);
  loom_free(d);
  loom_free(g);
  loom_free(r);
}

/* -------------------------------------------------------------- maxpool */

TT_TEST(maxpool) {
  static const int sh[][6] = {/* N C H W K S */
                              {1, 1, 1, 1, 1, 1}, {2, 3, 4, 4, 2, 2},
                              {1, 2, 5, 7, 2, 2}, {2, 1, 7, 6, 3, 2},
                              {1, 2, 6, 6, 3, 1}, {3, 4, 24, 24, 2, 2}};
  for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
    const int N = sh[s][0], C = sh[s][1], H = sh[s][2], W = sh[s][3];
    const int K = sh[s][4], S = sh[s][5];
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * OH * OW;
    float *x = kt_rand(ni, 400 + s, -1, 1), *y = kt_zeros(no),
          *r = kt_zeros(no);
    float *d = kt_rand(no, 401, -1, 1), *g = kt_rand(ni, 402, -1, 1);
    float *rg = kt_copy(g, ni);
    int32_t *am = loom_malloc(no * sizeof(int32_t));
    TT_REQUIRE(x && y && r && d && g && rg && am);
    for (size_t i = 0; i < ni; i += 5)
      x[i] = 0.5f; /* ties: the first maximum wins */
    loom_maxpool2d_forward(y, am, x, N, C, H, W, K, S);
    int wrong = 0;
    for (int p = 0; p < N * C; p++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          float m = -INFINITY;
          int best = -1;
          for (int kh = 0; kh < K; kh++)
            for (int kw = 0; kw < K; kw++) {
              const int i = (oh * S + kh) * W + ow * S + kw;
              if (x[(size_t)p * H * W + i] > m) {
                m = x[(size_t)p * H * W + i];
                best = i;
              }
            }
          const size_t o = ((size_t)p * OH + oh) * OW + ow;
          wrong += y[o] != m || am[o] != best;
          rg[(size_t)p * H * W + best] += d[o];
        }
    TT_CHECK_EQ(wrong, 0);
    loom_maxpool2d_backward(g, d, am, N, C, H, W, K, S);
    TT_CHECK(kt_same_bits(g, rg, ni));
    loom_free(x);
    loom_free(y);
    loom_free(r);
    loom_free(d);
    loom_free(g);
    loom_free(rg);
    loom_free(am);
  }
}

/* ---------------------------------------------------------- CPU features */

TT_TEST(cpu_features) {
  const loom_cpu_features *f = loom_cpu_get_features();
  TT_REQUIRE(f != NULL);
  TT_CHECK(f == loom_cpu_get_features());
#if defined(__x86_64__)
  __builtin_cpu_init();
  TT_CHECK_EQ(f->avx2, __builtin_cpu_supports("avx2") != 0);
  TT_CHECK_EQ(f->fma, __builtin_cpu_supports("fma") != 0);
  TT_CHECK_EQ(f->avx512f, __builtin_cpu_supports("avx512f") != 0);
  TT_CHECK_EQ(f->avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  TT_CHECK_EQ(f->avx512vl, __builtin_cpu_supports("avx512vl") != 0);
  TT_CHECK_EQ(f->avx512dq, __builtin_cpu_supports("avx512dq") != 0);
#endif
  TT_CHECK(!f->avx512_bf16 || f->avx512f);
  TT_CHECK(!f->amx_bf16 || f->amx_tile);
  printf("cpu: avx2 %d fma %d avx512f %d avx512_bf16 %d amx_tile %d amx_bf16 "
         "%d\n",
         f->avx2, f->fma, f->avx512f, f->avx512_bf16, f->amx_tile, f->amx_bf16);
}

/* The copy in use: the one LOOM_ISA names (the _base and _avx2 tests),
 * else the best this CPU runs; never one it lacks. A LOOM_ISA naming a copy
 * this CPU lacks (the _avx2 tests on a CPU without AVX2) is refused by
 * loom_cpu_check, and the kernels run the best copy. */
TT_TEST(isa_choice) {
  const loom_isa isa = loom_cpu_isa();
  TT_CHECK(loom_isa_available(isa));
  TT_CHECK(loom_isa_available(LOOM_ISA_BASE));
  const char *env = getenv("LOOM_ISA");
  const bool lacked =
      env && strcmp(env, "avx2") == 0 && !loom_isa_available(LOOM_ISA_AVX2);
  TT_CHECK_EQ(loom_cpu_check(), lacked ? LOOM_ERR_UNSUPPORTED : LOOM_OK);
  if (env && strcmp(env, "base") == 0) {
    TT_CHECK_EQ(isa, LOOM_ISA_BASE);
  } else if (env && strcmp(env, "avx2") == 0 && !lacked) {
    TT_CHECK_EQ(isa, LOOM_ISA_AVX2);
  } else {
    for (int i = isa + 1; i < LOOM_ISA_COUNT; i++)
      TT_CHECK(!loom_isa_available((loom_isa)i));
  }
  const loom_cpu_features *f = loom_cpu_get_features();
  if (!(f->avx2 && f->fma))
    TT_CHECK(!loom_isa_available(LOOM_ISA_AVX2));
  /* each copy's instructions include the one before it's */
  if (loom_isa_available(LOOM_ISA_AVX512))
    TT_CHECK(loom_isa_available(LOOM_ISA_AVX2) && f->avx512f && f->avx512bw &&
             f->avx512vl && f->avx512dq);
  TT_CHECK(strcmp(loom_isa_name(LOOM_ISA_AVX2), "avx2") == 0);
  TT_CHECK(strcmp(loom_isa_name(LOOM_ISA_AVX512), "avx512") == 0);
  TT_CHECK(strcmp(loom_isa_name(LOOM_ISA_COUNT), "unknown") == 0);
  printf("isa: %s\n", loom_isa_name(isa));
}

int main(void) {
  TT_RUN(expf_accuracy);
  TT_RUN(isa_choice);
  TT_RUN(fixed_order_reductions);
  TT_RUN(elementwise_ops);
  TT_RUN(dropout_masks);
  TT_RUN(softmax_and_log_softmax);
  TT_RUN(softmax_propagates_nan);
  TT_RUN(crossentropy);
  TT_RUN(layernorm);
  TT_RUN(linear);
  TT_RUN(embedding);
  TT_RUN(maxpool);
  TT_RUN(cpu_features);
  return tt_finish();
}
