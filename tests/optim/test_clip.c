/* Tests of gradient clipping by global norm, the inf/NaN check and the
 * dynamic loss scaler. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "loom/optim.h"
#include "tt.h"

TT_TEST(test_clip_small) {
  float g[2] = {3.0f, 4.0f};
  double norm = 0;
  TT_CHECK(loom_grad_sumsq(g, 2) == 25.0);
  TT_CHECK_OK(loom_grad_clip(g, 2, 1.0f, &norm));
  TT_CHECK(norm == 5.0);
  /* PyTorch: g * max_norm / (norm + 1e-6) */
  TT_CHECK(g[0] == (float)(3.0f * (float)(1.0 / (5.0 + 1e-6))));
  TT_CHECK_NEAR(g[0], 0.6, 1e-6);
  TT_CHECK_NEAR(g[1], 0.8, 1e-6);
  TT_CHECK_NEAR(sqrt(loom_grad_sumsq(g, 2)), 1.0, 1e-6);
  /* Below the threshold: untouched. */
  float h[3] = {0.3f, 0.4f, 0.0f};
  TT_CHECK_OK(loom_grad_clip(h, 3, 1.0f, &norm));
  TT_CHECK_NEAR(norm, 0.5, 1e-7);
  TT_CHECK(h[0] == 0.3f && h[1] == 0.4f && h[2] == 0.0f);
  /* Empty gradients have norm 0. */
  TT_CHECK_OK(loom_grad_clip(NULL, 0, 1.0f, &norm));
  TT_CHECK(norm == 0.0);
  loom_grad_scale(h, 2, 2.0f);
  TT_CHECK(h[0] == 0.6f && h[1] == 0.8f);
}

#define BIG_N 1000003 /* not a multiple of LOOM_GRAD_CHUNK */

/* The documented order, in plain C: chunks of LOOM_GRAD_CHUNK, element i of
 * a chunk in lane i % 16, lanes added pairwise (l + w for w = 8, 4, 2, 1),
 * chunk sums added in order. A build without AVX runs this order too. */
static double sumsq_documented(const float *g, int64_t n) {
  double total = 0;
  for (int64_t c = 0; c < n; c += LOOM_GRAD_CHUNK) {
    double acc[16] = {0};
    for (int64_t i = c; i < n && i < c + LOOM_GRAD_CHUNK; i++)
      acc[(i - c) % 16] += (double)g[i] * (double)g[i];
    for (int w = 8; w >= 1; w /= 2)
      for (int l = 0; l < w; l++)
        acc[l] += acc[l + w];
    total += acc[0];
  }
  return total;
}

TT_TEST(test_sumsq_deterministic) {
  float *g = loom_malloc(sizeof(float) * BIG_N);
  float *h = loom_malloc(sizeof(float) * BIG_N);
  TT_REQUIRE(g && h);
  loom_rng r = loom_rng_init(7, 1);
  loom_rng_fill_normal(&r, g, BIG_N, 0.0f, 1.0f);
  double ref = 0; /* plain sequential sum */
  for (int64_t i = 0; i < BIG_N; i++)
    ref += (double)g[i] * (double)g[i];
  int saved = loom_threads();
  loom_set_threads(1);
  double s1 = loom_grad_sumsq(g, BIG_N);
  TT_CHECK_NEAR(s1 / ref, 1.0, 1e-12);
  double doc = sumsq_documented(g, BIG_N);
  TT_CHECK(memcmp(&s1, &doc, sizeof s1) == 0);
  TT_CHECK(memcmp(&s1, &ref, sizeof s1) != 0); /* the order does matter */
  for (int nt = 2; nt <= 3; nt++) {
    loom_set_threads(nt);
    double s = loom_grad_sumsq(g, BIG_N);
    TT_CHECK(memcmp(&s, &s1, sizeof s) == 0);
  }
  /* Clipping gives the same bits with 1 and 2 threads. */
  memcpy(h, g, sizeof(float) * BIG_N);
  double n1 = 0, n2 = 0;
  loom_set_threads(1);
  TT_CHECK_OK(loom_grad_clip(g, BIG_N, 10.0f, &n1));
  loom_set_threads(2);
  TT_CHECK_OK(loom_grad_clip(h, BIG_N, 10.0f, &n2));
  TT_CHECK(n1 == n2);
  TT_CHECK_NEAR(n1, sqrt(ref), 1e-9);
  TT_CHECK(memcmp(g, h, sizeof(float) * BIG_N) == 0);
  TT_CHECK_NEAR(sqrt(loom_grad_sumsq(g, BIG_N)), 10.0, 1e-4);
  loom_set_threads(saved);
  loom_free(g);
  loom_free(h);
}

TT_TEST(test_clip_split) {
  /* Two "ranks" each hold half the gradients; they add their partial sums
   * of squares (the all-reduce) and clip their halves with the total. */
  const int64_t n = 50000, half = 3 * LOOM_GRAD_CHUNK + 5;
  float *g = loom_malloc(sizeof(float) * n);
  float *h = loom_malloc(sizeof(float) * n);
  TT_REQUIRE(g && h);
  loom_rng r = loom_rng_init(8, 2);
  loom_rng_fill_normal(&r, g, n, 0.0f, 0.1f);
  memcpy(h, g, sizeof(float) * n);
  double whole = 0, a = 0, b = 0;
  TT_CHECK_OK(loom_grad_clip(g, n, 1.0f, &whole));
  double sumsq = loom_grad_sumsq(h, half) + loom_grad_sumsq(h + half, n - half);
  TT_CHECK_OK(loom_grad_clip_sumsq(h, half, sumsq, 1.0f, &a));
  TT_CHECK_OK(loom_grad_clip_sumsq(h + half, n - half, sumsq, 1.0f, &b));
  TT_CHECK(a == b);
  TT_CHECK_NEAR(a / whole, 1.0, 1e-12);
  TT_CHECK(whole > 1.0);
  TT_CHECK_CLOSE(h, g, (size_t)n, 0.0, 1e-6);
  loom_free(g);
  loom_free(h);
}

TT_TEST(test_nonfinite) {
  float g[1000];
  for (int i = 0; i < 1000; i++)
    g[i] = (float)(i - 500) * 1e30f;
  TT_CHECK(!loom_grad_has_nonfinite(g, 1000));
  g[0] = -INFINITY;
  TT_CHECK(loom_grad_has_nonfinite(g, 1000));
  g[0] = 0.0f;
  g[999] = NAN;
  TT_CHECK(loom_grad_has_nonfinite(g, 1000));
  TT_CHECK(!loom_grad_has_nonfinite(g, 999));
  TT_CHECK(!loom_grad_has_nonfinite(NULL, 0));
  /* A NaN norm leaves the gradients alone. */
  float h[3] = {1.0f, NAN, 2.0f};
  double norm = 0;
  TT_CHECK_OK(loom_grad_clip(h, 3, 1.0f, &norm));
  TT_CHECK(isnan(norm));
  TT_CHECK(h[0] == 1.0f && h[2] == 2.0f);
  /* Large threaded arrays find one bad element anywhere. */
  const int64_t n = 300000;
  float *x = loom_calloc((size_t)n, sizeof(float));
  TT_REQUIRE(x);
  int saved = loom_threads();
  loom_set_threads(2);
  TT_CHECK(!loom_grad_has_nonfinite(x, n));
  x[n - 17] = INFINITY;
  TT_CHECK(loom_grad_has_nonfinite(x, n));
  loom_set_threads(saved);
  loom_free(x);
}

TT_TEST(test_clip_invalid) {
  float g[2] = {1.0f, 2.0f};
  double norm;
  TT_CHECK_EQ(loom_grad_clip(g, 2, 0.0f, &norm), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "max_norm") != NULL);
  TT_CHECK_EQ(loom_grad_clip(g, 2, -1.0f, &norm), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_grad_clip(g, 2, NAN, &norm), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_grad_clip(NULL, 2, 1.0f, &norm), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_grad_clip(g, -1, 1.0f, &norm), LOOM_ERR_INVALID_ARG);
  TT_CHECK(g[0] == 1.0f && g[1] == 2.0f);
}

TT_TEST(test_scaler_sequence) {
  loom_scaler s = loom_scaler_default();
  TT_CHECK_OK(loom_scaler_check(&s));
  TT_CHECK(s.scale == 65536.0f);
  TT_CHECK_EQ(s.growth_interval, 2000);
  for (int i = 0; i < 1999; i++)
    loom_scaler_update(&s, false);
  TT_CHECK(s.scale == 65536.0f);
  TT_CHECK_EQ(s.good_steps, 1999);
  loom_scaler_update(&s, false); /* the 2000th good step */
  TT_CHECK(s.scale == 131072.0f);
  TT_CHECK_EQ(s.good_steps, 0);

  s.growth_interval = 3;
  loom_scaler_update(&s, false);
  loom_scaler_update(&s, false);
  loom_scaler_update(&s, true); /* backoff resets the count */
  TT_CHECK(s.scale == 65536.0f);
  TT_CHECK_EQ(s.good_steps, 0);
  loom_scaler_update(&s, true);
  TT_CHECK(s.scale == 32768.0f);
  loom_scaler_update(&s, false);
  loom_scaler_update(&s, false);
  TT_CHECK(s.scale == 32768.0f);
  loom_scaler_update(&s, false);
  TT_CHECK(s.scale == 65536.0f);
  /* Growth that would overflow keeps the scale. */
  s.scale = FLT_MAX / 1.5f;
  s.good_steps = 2;
  TT_CHECK_OK(loom_scaler_update(&s, false));
  TT_CHECK(s.scale == FLT_MAX / 1.5f);
  TT_CHECK_EQ(s.good_steps, 0);
  /* The floor: a backoff may reach FLT_MIN (whose reciprocal unscales)
   * but not go under it: then an error and the state as it was. */
  s.scale = 2.0f * FLT_MIN;
  s.good_steps = 1;
  TT_CHECK_OK(loom_scaler_update(&s, true));
  TT_CHECK(s.scale == FLT_MIN);
  TT_CHECK_OK(loom_scaler_check(&s));
  s.good_steps = 1;
  TT_CHECK_EQ(loom_scaler_update(&s, true), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "cannot back off further") != NULL);
  TT_CHECK(s.scale == FLT_MIN);
  TT_CHECK_EQ(s.good_steps, 1);
  /* a subnormal or zero scale is refused by the check */
  s.scale = FLT_MIN / 2.0f;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  s.scale = 0.0f;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  /* update steps only on a scaler the check takes: NULL, a NaN scale or
   * an interval of 0 are errors and the state stays */
  TT_CHECK_EQ(loom_scaler_update(NULL, false), LOOM_ERR_INVALID_ARG);
  s = loom_scaler_default();
  s.scale = NAN;
  TT_CHECK_EQ(loom_scaler_update(&s, false), LOOM_ERR_INVALID_ARG);
  TT_CHECK(isnan(s.scale) && s.good_steps == 0);
  s = loom_scaler_default();
  s.growth_interval = 0;
  TT_CHECK_EQ(loom_scaler_update(&s, false), LOOM_ERR_INVALID_ARG);
  TT_CHECK(s.scale == 65536.0f && s.good_steps == 0);
}

TT_TEST(test_scaler_unscale) {
  loom_scaler s = loom_scaler_default();
  s.scale = 1024.0f;
  float g[3] = {1024.0f, 2048.0f, -512.0f};
  TT_CHECK(!loom_scaler_unscale(&s, g, 3));
  TT_CHECK(g[0] == 1.0f && g[1] == 2.0f && g[2] == -0.5f);
  g[1] = INFINITY;
  TT_CHECK(loom_scaler_unscale(&s, g, 3));
  /* A scale below 1 can overflow while unscaling: caught too. */
  s.scale = 0.5f;
  float h[2] = {FLT_MAX, 1.0f};
  TT_CHECK(loom_scaler_unscale(&s, h, 2));
  TT_CHECK(h[1] == 2.0f);
  /* The usual loop: found_inf skips the step and backs off. */
  s = loom_scaler_default();
  float k[2] = {NAN, 1.0f};
  bool found = loom_scaler_unscale(&s, k, 2);
  loom_scaler_update(&s, found);
  TT_CHECK(s.scale == 32768.0f);
}

TT_TEST(test_scaler_check) {
  const loom_scaler d = loom_scaler_default();
  loom_scaler s = d;
  s.scale = 0.0f;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "scale") != NULL);
  s = d;
  s.scale = INFINITY;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  s = d;
  s.growth_factor = 1.0f;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "growth_factor") != NULL);
  s = d;
  s.backoff_factor = 1.0f;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "backoff_factor") != NULL);
  s = d;
  s.growth_interval = 0;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "growth_interval") != NULL);
  s = d;
  s.good_steps = -1;
  TT_CHECK_EQ(loom_scaler_check(&s), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_scaler_check(NULL), LOOM_ERR_INVALID_ARG);
}

int main(void) {
  TT_RUN(test_clip_small);
  TT_RUN(test_sumsq_deterministic);
  TT_RUN(test_clip_split);
  TT_RUN(test_nonfinite);
  TT_RUN(test_clip_invalid);
  TT_RUN(test_scaler_sequence);
  TT_RUN(test_scaler_unscale);
  TT_RUN(test_scaler_check);
  return tt_finish();
}
