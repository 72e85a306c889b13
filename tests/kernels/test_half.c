/* Half kernels (bf16 and f16): the conversions against the scalar ones of
 * core (special values, ties, subnormals, overflow, NaN, odd lengths; for
 * f16 every f16 value and a sweep of f32 bit patterns, and the F16C copy
 * against the portable one), the half GEMM, linear layer and convolution
 * against the f32 kernels on rounded operands (bitwise on the conversion
 * path) and against the double reference with a tolerance that follows
 * from the format, and thread-count invariance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kt.h"

/* Unit roundoff of a half type: bf16 keeps 8 significant bits, so
 * rounding to nearest moves a value by at most half an ulp, a relative
 * 2^-8 at the bottom of a binade; f16 keeps 11, 2^-11 (for normal values;
 * the tests' operands are far above f16's subnormals, 2^-14). */
static double unit_u(loom_dtype dt) {
  return dt == LOOM_BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;
}

static const loom_dtype halves[] = {LOOM_BF16, LOOM_F16};
#define N_HALVES 2

static float bits_f(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static uint32_t f_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Special values, ties (even and odd kept bit), denormals, the largest
 * floats (which round to infinity), then random bits. */
static float *special_values(int n) {
  float *x = loom_malloc((size_t)n * sizeof(float));
  static const uint32_t sp[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
      0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0x00000001u, 0x807fffffu,
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu,
      0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x3f800000u, 0x00008000u};
  const int ns = (int)(sizeof sp / sizeof sp[0]);
  loom_rng r = loom_rng_init(5, 1);
  for (int i = 0; i < n; i++)
    x[i] = i < ns ? bits_f(sp[i]) : bits_f(loom_rng_u32(&r));
  return x;
}

TT_TEST(cvt_matches_scalar) {
  const int n = 4099; /* not a multiple of 8 or 16 */
  float *x = special_values(n);
  loom_bf16 *h = loom_malloc((size_t)n * sizeof(loom_bf16));
  float *w = kt_zeros((size_t)n), *rd = kt_zeros((size_t)n);
  float *rs = kt_zeros((size_t)n);
  TT_REQUIRE(x && h && w && rd && rs);
  for (int off = 0; off < 3; off++) { /* unaligned starts */
    const int m = n - off;
    loom_cvt_f32_to_bf16(h + off, x + off, m);
    loom_cvt_bf16_to_f32(w + off, h + off, m);
    loom_round_bf16(rd + off, x + off, m);
    TT_CHECK_OK(loom_round_half_serial(LOOM_BF16, rs + off, x + off, m));
    int bad = 0;
    for (int i = off; i < n; i++) {
      const loom_bf16 want = loom_f32_to_bf16(x[i]);
      if (h[i] != want || f_bits(w[i]) != f_bits(loom_bf16_to_f32(want)) ||
          f_bits(rd[i]) != f_bits(loom_bf16_to_f32(want)) ||
          f_bits(rs[i]) != f_bits(rd[i])) {
        if (bad++ < 3)
          fprintf(stderr, "  [%d] %08x: got %04x/%08x/%08x want %04x\n", i,
                  f_bits(x[i]), h[i], f_bits(w[i]), f_bits(rd[i]), want);
      }
    }
    TT_CHECK_EQ(bad, 0);
  }
  /* what the rounding is: ties to even, NaN kept, overflow to infinity */
  TT_CHECK_EQ(h[10], 0x3f80); /* 1 + 2^-8 exactly halfway: even (down) */
  TT_CHECK_EQ(h[11], 0x3f82); /* odd kept bit: up */
  TT_CHECK_EQ(h[12], 0x3f80);
  TT_CHECK_EQ(h[13], 0x3f81);
  TT_CHECK(isnan(w[4]) && isnan(w[5]) && isnan(w[6]) && isnan(w[7]));
  TT_CHECK(isinf(w[14]) && w[14] > 0 && isinf(w[15]) && w[15] < 0);
  TT_CHECK(isinf(w[16]) && !isinf(w[17]));
  /* f16's serial rounding: loom_round_half's bits */
  TT_CHECK_OK(loom_round_half(LOOM_F16, rd, x, n));
  TT_CHECK_OK(loom_round_half_serial(LOOM_F16, rs, x, n));
  TT_CHECK(memcmp(rd, rs, (size_t)n * sizeof(float)) == 0);
  TT_CHECK(loom_round_half_serial(LOOM_F32, rs, x, n) == LOOM_ERR_UNSUPPORTED);
  loom_clear_error();
  loom_free(x);
  loom_free(h);
  loom_free(w);
  loom_free(rd);
  loom_free(rs);
}

/* f16: F16C in the avx2 copy, core's scalar in the base copy (run by the
 * _base test); both against core on special values at unaligned starts,
 * then every f16 value, then f32 bit patterns in steps of 4099 (every
 * exponent, subnormal results, ties, overflow, NaN payloads). */
static int f16_check(const float *x, int64_t n, uint16_t *h, float *w,
                     float *rd) {
  loom_cvt_f32_to_f16(h, x, n);
  loom_cvt_f16_to_f32(w, h, n);
  loom_round_f16(rd, x, n);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const loom_f16 want = loom_f32_to_f16(x[i]);
    const uint32_t wf = f_bits(loom_f16_to_f32(want));
    if ((h[i] != want || f_bits(w[i]) != wf || f_bits(rd[i]) != wf) &&
        bad++ < 3)
      fprintf(stderr, "  [%lld] %08x: got %04x/%08x/%08x want %04x\n",
              (long long)i, f_bits(x[i]), h[i], f_bits(w[i]), f_bits(rd[i]),
              want);
  }
  return bad;
}

TT_TEST(cvt_f16_matches_scalar) {
  const int n = 4099;
  float *x = special_values(n);
  loom_f16 *h = loom_malloc((size_t)n * sizeof(loom_f16));
  float *w = kt_zeros((size_t)n), *rd = kt_zeros((size_t)n);
  TT_REQUIRE(x && h && w && rd);
  for (int off = 0; off < 3; off++)
    TT_CHECK_EQ(f16_check(x + off, n - off, h + off, w + off, rd + off), 0);
  /* f16's rounding, on values chosen for it */
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000u, 0x3c00}, /* 1 */
      {0x3f801000u, 0x3c00}, /* 1 + 2^-11: halfway, even (down) */
      {0x3f803000u, 0x3c02}, /* 1 + 3 2^-11: halfway, even (up) */
      {0x3f801001u, 0x3c01}, /* just above halfway: up */
      {0x477fe000u, 0x7bff}, /* 65504, the largest f16 */
      {0x477fefffu, 0x7bff}, /* just below 65520: down */
      {0x477ff000u, 0x7c00}, /* 65520: rounds to infinity */
      {0xc7800000u, 0xfc00}, /* -65536: -infinity */
      {0x38800000u, 0x0400}, /* 2^-14, the smallest normal */
      {0x387fc000u, 0x03ff}, /* the largest subnormal */
      {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal */
      {0x33000000u, 0x0000}, /* 2^-25: halfway to 0, even (0) */
      {0x33000001u, 0x0001}, /* above it: up */
      {0x33c00000u, 0x0002}, /* 1.5 2^-24: halfway, even (2) */
      {0x80000000u, 0x8000}, /* -0 */
      {0x7f800000u, 0x7c00}, /* infinity */
      {0x7fc00000u, 0x7e00}, /* quiet NaN */
      {0x7f812345u, 0x7e09}, /* signalling NaN: quiet, top payload bits */
      {0xffbfffffu, 0xffff}, /* negative NaN, all payload bits */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float f = bits_f(cases[i].in);
    loom_f16 got;
    loom_cvt_f32_to_f16(&got, &f, 1);
    if (got != cases[i].out)
      fprintf(stderr, "  %08x: got %04x want %04x\n", cases[i].in, got,
              cases[i].out);
    TT_CHECK_EQ(got, cases[i].out);
    TT_CHECK_EQ(loom_f32_to_f16(f), cases[i].out);
  }
  /* a NaN read back is a quiet NaN (F16C's), an f16 subnormal exact */
  loom_f16 snan = 0x7c01, sub = 0x0003;
  float back;
  loom_cvt_f16_to_f32(&back, &snan, 1);
  TT_CHECK_EQ(f_bits(back), 0x7fc02000u);
  loom_cvt_f16_to_f32(&back, &sub, 1);
  TT_CHECK(back == 3.0f * ldexpf(1.0f, -24));
  loom_free(x);
  loom_free(h);
  loom_free(w);
  loom_free(rd);
}

TT_TEST(cvt_f16_sweep) {
  /* every f16 value, widened and narrowed again */
  const int64_t nh = 65536;
  loom_f16 *all = loom_malloc((size_t)nh * sizeof(loom_f16));
  loom_f16 *h = loom_malloc((size_t)nh * sizeof(loom_f16));
  float *w = kt_zeros((size_t)nh), *rd = kt_zeros((size_t)nh);
  TT_REQUIRE(all && h && w && rd);
  for (int64_t i = 0; i < nh; i++)
    all[i] = (loom_f16)i;
  loom_cvt_f16_to_f32(w, all, nh);
  int bad = 0;
  for (int64_t i = 0; i < nh; i++)
    if (f_bits(w[i]) != f_bits(loom_f16_to_f32(all[i])) && bad++ < 3)
      fprintf(stderr, "  f16 %04llx: %08x\n", (long long)i, f_bits(w[i]));
  TT_CHECK_EQ(bad, 0);
  loom_cvt_f32_to_f16(h, w, nh);
  bad = 0;
  for (int64_t i = 0; i < nh; i++) {
    const bool nan = (all[i] & 0x7c00) == 0x7c00 && (all[i] & 0x3ff);
    /* every value comes back; a NaN comes back quiet */
    const loom_f16 want = nan ? (loom_f16)(all[i] | 0x200) : all[i];
    if (h[i] != want && bad++ < 3)
      fprintf(stderr, "  f16 %04llx came back as %04x\n", (long long)i, h[i]);
  }
  TT_CHECK_EQ(bad, 0);
  loom_free(all);
  loom_free(h);
  loom_free(w);
  loom_free(rd);
  /* f32 bit patterns in steps of a prime: ~1M values over every exponent */
  const int64_t nf = 1048576;
  float *x = loom_malloc((size_t)nf * sizeof(float));
  h = loom_malloc((size_t)nf * sizeof(loom_f16));
  w = kt_zeros((size_t)nf);
  rd = kt_zeros((size_t)nf);
  TT_REQUIRE(x && h && w && rd);
  for (int64_t i = 0; i < nf; i++)
    x[i] = bits_f((uint32_t)(i * 4099));
  TT_CHECK_EQ(f16_check(x, nf, h, w, rd), 0);
  loom_free(x);
  loom_free(h);
  loom_free(w);
  loom_free(rd);
}

/* A half matrix of rows x ld (cols used) and its values in f32. */
static void rand_half(loom_dtype dt, uint16_t *h, float *f, int64_t n,
                      uint64_t seed) {
  float *x = kt_rand((size_t)n, seed, -1.0f, 1.0f);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, h, x, n));
  TT_CHECK_OK(loom_cvt_half_to_f32(dt, f, h, n));
  loom_free(x);
}

/* |C - ref| <= bound per element: ref the double GEMM, bound the f32
 * accumulation (K + 2 roundings of at most 2^-24 relative each, on the
 * sum of |products|); the operands are already half values here, so
 * their rounding does not enter. */
static int within(const float *C, const float *ref, const double *mag,
                  int64_t n, int K) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double b = (K + 2) * ldexp(1.0, -24) * mag[i] + 1e-30;
    if (!(fabs((double)C[i] - (double)ref[i]) <= b) && bad++ < 3)
      fprintf(stderr, "  [%lld] %.9g vs %.9g (bound %.3g)\n", (long long)i,
              (double)C[i], (double)ref[i], b);
  }
  return bad;
}

static void gemm_half_shapes(loom_dtype dt) {
  static const int shapes[][3] = {
      {1, 1, 1}, {7, 5, 3}, {17, 33, 65}, {64, 31, 9}, {130, 70, 300}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++) {
      const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
      const bool ta = t & 1, tb = t & 2;
      const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
      const int64_t na = (int64_t)(ta ? K : M) * lda;
      const int64_t nb = (int64_t)(tb ? N : K) * ldb;
      const int64_t nc = (int64_t)M * ldc;
      uint16_t *A = loom_malloc((size_t)na * 2),
               *B = loom_malloc((size_t)nb * 2);
      float *Af = kt_zeros((size_t)na), *Bf = kt_zeros((size_t)nb);
      float *C = kt_rand((size_t)nc, 9, -1, 1), *C0 = kt_copy(C, (size_t)nc);
      float *Cf = kt_copy(C, (size_t)nc), *R = kt_copy(C, (size_t)nc);
      float *S = kt_zeros((size_t)loom_gemm_half_scratch_floats(M, N, K));
      double *mag = calloc((size_t)nc, sizeof(double));
      TT_REQUIRE(A && B && Af && Bf && C && C0 && Cf && R && S && mag);
      rand_half(dt, A, Af, na, 100 + s);
      rand_half(dt, B, Bf, nb, 200 + s);
      const float alpha = 0.75f, beta = 0.5f;
      TT_CHECK_OK(loom_gemm_half(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb,
                                 beta, C, ldc, S));
      /* conversion path: the f32 GEMM of the half values, to the bit (a
       * bf16 unit sums in its own order: the bound below only) */
      TT_CHECK_OK(
          loom_gemm(ta, tb, M, N, K, alpha, Af, lda, Bf, ldb, beta, Cf, ldc));
      if (!loom_half_on_unit(dt))
        KT_CHECK_SAME_BITS(C, Cf, (size_t)nc);
      /* and the double reference of the same values, within f32 sums */
      loom_gemm_ref(ta, tb, M, N, K, alpha, Af, lda, Bf, ldb, beta, R, ldc);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double m = fabs(beta * C0[(int64_t)i * ldc + j]);
          for (int p = 0; p < K; p++)
            m += fabs(
                alpha *
                (ta ? Af[(int64_t)p * lda + i] : Af[(int64_t)i * lda + p]) *
                (tb ? Bf[(int64_t)j * ldb + p] : Bf[(int64_t)p * ldb + j]));
          mag[(int64_t)i * ldc + j] = m;
        }
      TT_CHECK_EQ(within(C, R, mag, nc, K), 0);
      loom_free(A);
      loom_free(B);
      loom_free(Af);
      loom_free(Bf);
      loom_free(C);
      loom_free(C0);
      loom_free(Cf);
      loom_free(R);
      loom_free(S);
      free(mag);
    }
}

TT_TEST(gemm_half_shapes_all) {
  for (int i = 0; i < N_HALVES; i++)
    gemm_half_shapes(halves[i]);
}

TT_TEST(gemm_half_args) {
  float c = 0;
  uint16_t a = 0;
  for (int i = 0; i < N_HALVES; i++) {
    const loom_dtype dt = halves[i];
    TT_CHECK(loom_gemm_half(dt, false, false, -1, 1, 1, 1, &a, 1, &a, 1, 0, &c,
                            1, &c) == LOOM_ERR_INVALID_ARG);
    TT_CHECK(loom_gemm_half(dt, false, false, 2, 2, 2, 1, &a, 1, &a, 2, 0, &c,
                            2, &c) == LOOM_ERR_INVALID_ARG);
    TT_CHECK(loom_gemm_half(dt, false, false, 1, 1, 1, 1, &a, 1, &a, 1, 0, &c,
                            1, NULL) == LOOM_ERR_INVALID_ARG);
    /* K = 0 with beta 0 clears C, NaN included */
    c = NAN;
    TT_CHECK_OK(loom_gemm_half(dt, false, false, 1, 1, 0, 1, NULL, 1, NULL, 1,
                               0, &c, 1, NULL));
    TT_CHECK(c == 0.0f);
  }
  /* a type that is not a half one */
  TT_CHECK(loom_gemm_half(LOOM_F32, false, false, 1, 1, 1, 1, &a, 1, &a, 1, 0,
                          &c, 1, &c) == LOOM_ERR_UNSUPPORTED);
  TT_CHECK(loom_cvt_f32_to_half(LOOM_F64, &a, &c, 1) == LOOM_ERR_UNSUPPORTED);
}

/* The linear layer in half: against the f32 layer on rounded operands
 * (bitwise on the conversion path), against the f32 layer on the f32
 * operands within the format's bound, with an f32 and a half input. */
static void linear_half_one(loom_dtype dt, int N, int C, int OC) {
  float *x = kt_rand((size_t)N * C, 1, -2, 2);
  float *w = kt_rand((size_t)OC * C, 2, -0.5f, 0.5f);
  float *b = kt_rand((size_t)OC, 3, -1, 1);
  float *dout = kt_rand((size_t)N * OC, 4, -1, 1);
  uint16_t *wh = loom_malloc((size_t)OC * C * 2);
  uint16_t *xh = loom_malloc((size_t)N * C * 2);
  float *xr = kt_zeros((size_t)N * C), *wr = kt_zeros((size_t)OC * C);
  float *dr = kt_zeros((size_t)N * OC);
  float *S = kt_zeros((size_t)loom_linear_half_scratch_floats(N, C, OC));
  float *y = kt_zeros((size_t)N * OC), *y2 = kt_zeros((size_t)N * OC);
  float *yr = kt_zeros((size_t)N * OC), *yf = kt_zeros((size_t)N * OC);
  TT_REQUIRE(x && w && b && dout && wh && xh && xr && wr && dr && S && y &&
             y2 && yr && yf);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, wh, w, (int64_t)OC * C));
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, xh, x, (int64_t)N * C));
  TT_CHECK_OK(loom_round_half(dt, xr, x, (int64_t)N * C));
  TT_CHECK_OK(loom_round_half(dt, wr, w, (int64_t)OC * C));
  TT_CHECK_OK(loom_round_half(dt, dr, dout, (int64_t)N * OC));
  TT_CHECK_OK(
      loom_linear_forward_half(y, x, LOOM_F32, dt, wh, dt, b, N, C, OC, S));
  TT_CHECK_OK(loom_linear_forward_half(y2, xh, dt, dt, wh, dt, b, N, C, OC, S));
  TT_CHECK_OK(loom_linear_forward(yr, xr, wr, b, N, C, OC));
  TT_CHECK_OK(loom_linear_forward(yf, x, w, b, N, C, OC));
  KT_CHECK_SAME_BITS(y, yr, (size_t)N * OC);
  KT_CHECK_SAME_BITS(y2, yr, (size_t)N * OC);
  /* the weight as a model's copy on the conversion path holds it (f32
   * values of dt, read as they are): the same bits */
  float *y3 = kt_zeros((size_t)N * OC);
  TT_REQUIRE(y3);
  TT_CHECK_OK(loom_linear_forward_half(y3, x, LOOM_F32, dt, wr, LOOM_F32, b, N,
                                       C, OC, S));
  KT_CHECK_SAME_BITS(y3, yr, (size_t)N * OC);
  /* against f32 arithmetic: |x| < 2, |w| < 0.5, so each product moves by
   * at most (2u + u^2) |x w| and a row by that times C * 1 */
  const double u = unit_u(dt);
  const double fmt = (2 * u + u * u) * C * 1.0 + 1e-5;
  TT_CHECK_CLOSE(y, yf, (size_t)N * OC, fmt, 0);

  /* backward: rounded dout for the matmuls, f32 dout for the bias */
  float *dx = kt_rand((size_t)N * C, 5, -1, 1),
        *dw = kt_rand((size_t)OC * C, 6, -1, 1);
  float *db = kt_rand((size_t)OC, 7, -1, 1);
  float *dxr = kt_copy(dx, (size_t)N * C), *dwr = kt_copy(dw, (size_t)OC * C);
  float *dbr = kt_copy(db, (size_t)OC);
  float *dx2 = kt_copy(dx, (size_t)N * C), *dw2 = kt_copy(dw, (size_t)OC * C);
  float *db2 = kt_copy(db, (size_t)OC);
  float *dx3 = kt_copy(dx, (size_t)N * C), *dw3 = kt_copy(dw, (size_t)OC * C);
  float *db3 = kt_copy(db, (size_t)OC);
  TT_REQUIRE(dx && dw && db && dxr && dwr && dbr && dx2 && dw2 && db2 && dx3 &&
             dw3 && db3);
  TT_CHECK_OK(loom_linear_backward_half(dx, dw, db, dout, x, LOOM_F32, dt, wh,
                                        dt, N, C, OC, S));
  TT_CHECK_OK(loom_linear_backward_half(dx3, dw3, db3, dout, x, LOOM_F32, dt,
                                        wr, LOOM_F32, N, C, OC, S));
  TT_CHECK_OK(loom_linear_backward_half(dx2, dw2, db2, dout, xh, dt, dt, wh, dt,
                                        N, C, OC, S));
  TT_CHECK_OK(loom_linear_backward(dxr, dwr, NULL, dr, xr, wr, N, C, OC));
  TT_CHECK_OK(
      loom_linear_backward(NULL, NULL, dbr, dout, NULL, NULL, N, C, OC));
  KT_CHECK_SAME_BITS(dx, dxr, (size_t)N * C);
  KT_CHECK_SAME_BITS(dw, dwr, (size_t)OC * C);
  KT_CHECK_SAME_BITS(db, dbr, (size_t)OC);
  KT_CHECK_SAME_BITS(dx2, dxr, (size_t)N * C);
  KT_CHECK_SAME_BITS(dw2, dwr, (size_t)OC * C);
  KT_CHECK_SAME_BITS(db2, dbr, (size_t)OC);
  KT_CHECK_SAME_BITS(dx3, dxr, (size_t)N * C);
  KT_CHECK_SAME_BITS(dw3, dwr, (size_t)OC * C);
  KT_CHECK_SAME_BITS(db3, dbr, (size_t)OC);
  /* an input or weight type the layer does not take (the other half
   * type's weight included) */
  TT_CHECK(loom_linear_forward_half(y, x, LOOM_I32, dt, wh, dt, b, N, C, OC,
                                    S) == LOOM_ERR_UNSUPPORTED);
  const loom_dtype other = dt == LOOM_BF16 ? LOOM_F16 : LOOM_BF16;
  TT_CHECK(loom_linear_forward_half(y, x, LOOM_F32, dt, wh, other, b, N, C, OC,
                                    S) == LOOM_ERR_UNSUPPORTED);
  TT_CHECK(loom_linear_backward_half(dx, dw, db, dout, x, LOOM_F32, dt, wh,
                                     LOOM_I32, N, C, OC,
                                     S) == LOOM_ERR_UNSUPPORTED);
  loom_clear_error();
  float *all[] = {x,  w,  b,   dout, xr,  wr,  dr,  S,   y,  y2,  yr,  yf, dx,
                  dw, db, dxr, dwr,  dbr, dx2, dw2, db2, y3, dx3, dw3, db3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  loom_free(wh);
  loom_free(xh);
}

/* A layer through a GELU: given the gradient at GELU(y) and y, the bits of
 * the GELU's backward then the layer's (on whichever path runs: the
 * conversion or the bf16 unit), with and without the matmuls (the bias sum
 * alone). */
static void linear_gelu_one(loom_dtype dt, int N, int C, int OC) {
  const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
  float *x = kt_rand(nx, 41, -2, 2), *w = kt_rand(nw, 42, -0.5f, 0.5f);
  float *y = kt_rand(ny, 43, -4, 4), *dout = kt_rand(ny, 44, -1, 1);
  float *g = kt_zeros(ny);
  float *S = kt_zeros((size_t)loom_linear_half_scratch_floats(N, C, OC));
  float *gx = kt_rand(nx, 45, -1, 1), *gw = kt_rand(nw, 46, -1, 1);
  float *gb = kt_rand((size_t)OC, 47, -1, 1);
  float *rx = kt_copy(gx, nx), *rw = kt_copy(gw, nw), *rb = kt_copy(gb, OC);
  float *gb2 = kt_copy(gb, OC), *rb2 = kt_copy(gb, OC);
  uint16_t *wh = loom_malloc(nw * 2);
  TT_REQUIRE(x && w && y && dout && g && S && gx && gw && gb && rx && rw &&
             rb && gb2 && rb2 && wh);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, wh, w, (int64_t)nw));
  loom_gelu_backward_to(g, y, dout, (int64_t)ny);
  TT_CHECK_OK(loom_linear_backward_half(rx, rw, rb, g, x, LOOM_F32, dt, wh, dt,
                                        N, C, OC, S));
  TT_CHECK_OK(loom_linear_backward_half_gelu(gx, gw, gb, dout, y, x, LOOM_F32,
                                             dt, wh, dt, N, C, OC, S));
  KT_CHECK_SAME_BITS(gx, rx, nx);
  KT_CHECK_SAME_BITS(gw, rw, nw);
  KT_CHECK_SAME_BITS(gb, rb, (size_t)OC);
  TT_CHECK_OK(loom_linear_backward_half(NULL, NULL, rb2, g, x, LOOM_F32, dt, wh,
                                        dt, N, C, OC, S));
  TT_CHECK_OK(loom_linear_backward_half_gelu(
      NULL, NULL, gb2, dout, y, x, LOOM_F32, dt, wh, dt, N, C, OC, S));
  KT_CHECK_SAME_BITS(gb2, rb2, (size_t)OC);
  TT_CHECK(loom_linear_backward_half_gelu(gx, gw, gb, dout, NULL, x, LOOM_F32,
                                          dt, wh, dt, N, C, OC,
                                          S) == LOOM_ERR_INVALID_ARG);
  loom_clear_error();
  float *fr[] = {x, w, y, dout, g, S, gx, gw, gb, rx, rw, rb, gb2, rb2};
  for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
    loom_free(fr[i]);
  loom_free(wh);
}

static void linear_gelu(loom_dtype dt) {
  linear_gelu_one(dt, 37, 45, 19);
  loom_set_threads(2);
  linear_gelu_one(dt, 131, 40, 300); /* three 64-row chunks on two threads */
  loom_set_threads(0);
}

/* One small shape on one thread; at 2 threads, two whose bias gradient and
 * conversions run on both (the half layer's bias pass in 64-row chunks,
 * checked against the f32 layer's column walk: three chunks, and 47). */
static void linear_half(loom_dtype dt) {
  linear_half_one(dt, 37, 45, 19);
  loom_set_threads(2);
  linear_half_one(dt, 131, 40, 300);
  linear_half_one(dt, 3001, 8, 12);
  loom_set_threads(0);
  linear_gelu(dt);
}

/* The convolution the same way, bitwise, on a shape oneDNN's engine takes
 * (C >= 4, with the dnnl GEMM backend) and one only im2col takes (C = 1,
 * stride 2, padding). */
static void conv_half_one(loom_dtype dt, const loom_conv2d_dims d) {
  const int OH = loom_conv2d_out_h(&d), OW = loom_conv2d_out_w(&d);
  const size_t nx = (size_t)d.N * d.C * d.H * d.W;
  const size_t nw = (size_t)d.OC * d.C * d.KH * d.KW;
  const size_t ny = (size_t)d.N * d.OC * OH * OW;
  float *x = kt_rand(nx, 21, -2, 2), *w = kt_rand(nw, 22, -0.5f, 0.5f);
  float *b = kt_rand((size_t)d.OC, 23, -1, 1), *dout = kt_rand(ny, 24, -1, 1);
  uint16_t *wh = loom_malloc(nw * 2), *xh = loom_malloc(nx * 2);
  float *xr = kt_zeros(nx), *wr = kt_zeros(nw), *dr = kt_zeros(ny);
  float *col = kt_zeros((size_t)loom_conv2d_col_floats(&d));
  float *S = kt_zeros((size_t)loom_conv2d_half_scratch_floats(&d));
  float *y = kt_zeros(ny), *y2 = kt_zeros(ny), *yr = kt_zeros(ny);
  TT_REQUIRE(x && w && b && dout && wh && xh && xr && wr && dr && col && S &&
             y && y2 && yr);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, wh, w, (int64_t)nw));
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, xh, x, (int64_t)nx));
  TT_CHECK_OK(loom_round_half(dt, xr, x, (int64_t)nx));
  TT_CHECK_OK(loom_round_half(dt, wr, w, (int64_t)nw));
  TT_CHECK_OK(loom_round_half(dt, dr, dout, (int64_t)ny));
  TT_CHECK_OK(
      loom_conv2d_forward_half(y, col, x, LOOM_F32, dt, wh, dt, b, &d, S));
  TT_CHECK_OK(loom_conv2d_forward_half(y2, col, xh, dt, dt, wh, dt, b, &d, S));
  TT_CHECK_OK(loom_conv2d_forward(yr, col, xr, wr, b, &d));
  KT_CHECK_SAME_BITS(y, yr, ny);
  KT_CHECK_SAME_BITS(y2, yr, ny);
  float *y3 = kt_zeros(ny); /* the weight in f32 values of dt */
  TT_REQUIRE(y3);
  TT_CHECK_OK(loom_conv2d_forward_half(y3, col, x, LOOM_F32, dt, wr, LOOM_F32,
                                       b, &d, S));
  KT_CHECK_SAME_BITS(y3, yr, ny);

  float *dx = kt_rand(nx, 25, -1, 1), *dw = kt_rand(nw, 26, -1, 1);
  float *db = kt_rand((size_t)d.OC, 27, -1, 1);
  float *dxr = kt_copy(dx, nx), *dwr = kt_copy(dw, nw);
  float *dbr = kt_copy(db, (size_t)d.OC);
  float *dx2 = kt_copy(dx, nx), *dw2 = kt_copy(dw, nw);
  float *db2 = kt_copy(db, (size_t)d.OC);
  float *dx3 = kt_copy(dx, nx), *dw3 = kt_copy(dw, nw);
  float *db3 = kt_copy(db, (size_t)d.OC);
  TT_REQUIRE(dx && dw && db && dxr && dwr && dbr && dx2 && dw2 && db2 && dx3 &&
             dw3 && db3);
  TT_CHECK_OK(loom_conv2d_backward_half(dx, dw, db, col, dout, x, LOOM_F32, dt,
                                        wh, dt, &d, S));
  TT_CHECK_OK(loom_conv2d_backward_half(dx3, dw3, db3, col, dout, x, LOOM_F32,
                                        dt, wr, LOOM_F32, &d, S));
  TT_CHECK_OK(loom_conv2d_backward_half(dx2, dw2, db2, col, dout, xh, dt, dt,
                                        wh, dt, &d, S));
  TT_CHECK_OK(loom_conv2d_backward(dxr, dwr, NULL, col, dr, xr, wr, &d));
  TT_CHECK_OK(loom_conv2d_backward(NULL, NULL, dbr, col, dout, NULL, NULL, &d));
  KT_CHECK_SAME_BITS(dx, dxr, nx);
  KT_CHECK_SAME_BITS(dw, dwr, nw);
  KT_CHECK_SAME_BITS(db, dbr, (size_t)d.OC);
  KT_CHECK_SAME_BITS(dx2, dxr, nx);
  KT_CHECK_SAME_BITS(dw2, dwr, nw);
  KT_CHECK_SAME_BITS(db2, dbr, (size_t)d.OC);
  KT_CHECK_SAME_BITS(dx3, dxr, nx);
  KT_CHECK_SAME_BITS(dw3, dwr, nw);
  KT_CHECK_SAME_BITS(db3, dbr, (size_t)d.OC);
  TT_CHECK(loom_conv2d_forward_half(y, col, x, LOOM_I32, dt, wh, dt, b, &d,
                                    S) == LOOM_ERR_UNSUPPORTED);
  TT_CHECK(loom_conv2d_forward_half(y, col, x, LOOM_F32, dt, wh, LOOM_I32, b,
                                    &d, S) == LOOM_ERR_UNSUPPORTED);
  loom_clear_error();
  float *all[] = {x,  w,  b,   dout, xr,  wr,  dr,  col, S,  y,   y2,  yr, dx,
                  dw, db, dxr, dwr,  dbr, dx2, dw2, db2, y3, dx3, dw3, db3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  loom_free(wh);
  loom_free(xh);
}

static void conv2d_half(loom_dtype dt) {
  conv_half_one(dt, (loom_conv2d_dims){.N = 5,
                                       .C = 6,
                                       .H = 12,
                                       .W = 11,
                                       .OC = 8,
                                       .KH = 3,
                                       .KW = 3,
                                       .stride = 1,
                                       .pad = 1});
  conv_half_one(dt, (loom_conv2d_dims){.N = 3,
                                       .C = 1,
                                       .H = 13,
                                       .W = 10,
                                       .OC = 4,
                                       .KH = 5,
                                       .KW = 5,
                                       .stride = 2,
                                       .pad = 2});
}

/* Same bits at 1, 2 and 3 threads, on shapes where the GEMM grid tiles
 * and the conversions run in parallel. */
static void half_thread_invariance(loom_dtype dt) {
  const int N = 300, C = 520, OC = 260;
  float *x = kt_rand((size_t)N * C, 11, -1, 1);
  float *w = kt_rand((size_t)OC * C, 12, -1, 1);
  float *dout = kt_rand((size_t)N * OC, 13, -1, 1);
  uint16_t *wh = loom_malloc((size_t)OC * C * 2);
  float *S = kt_zeros((size_t)loom_linear_half_scratch_floats(N, C, OC));
  float *b = kt_rand((size_t)OC, 14, -1, 1);
  float *y[3], *dx[3], *dw[3], *yb[3];
  TT_REQUIRE(x && w && dout && wh && S && b);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, wh, w, (int64_t)OC * C));
  for (int t = 0; t < 3; t++) {
    y[t] = kt_zeros((size_t)N * OC);
    yb[t] = kt_zeros((size_t)N * OC);
    dx[t] = kt_zeros((size_t)N * C);
    dw[t] = kt_zeros((size_t)OC * C);
    TT_REQUIRE(y[t] && yb[t] && dx[t] && dw[t]);
    loom_set_threads(t + 1);
    TT_CHECK_OK(loom_linear_forward_half(y[t], x, LOOM_F32, dt, wh, dt, NULL, N,
                                         C, OC, S));
    /* with a bias (on the unit: added by oneDNN as it stores the rows) */
    TT_CHECK_OK(loom_linear_forward_half(yb[t], x, LOOM_F32, dt, wh, dt, b, N,
                                         C, OC, S));
    TT_CHECK_OK(loom_linear_backward_half(dx[t], dw[t], NULL, dout, x, LOOM_F32,
                                          dt, wh, dt, N, C, OC, S));
  }
  loom_set_threads(0);
  for (int t = 1; t < 3; t++) {
    KT_CHECK_SAME_BITS(y[0], y[t], (size_t)N * OC);
    KT_CHECK_SAME_BITS(yb[0], yb[t], (size_t)N * OC);
    KT_CHECK_SAME_BITS(dx[0], dx[t], (size_t)N * C);
    KT_CHECK_SAME_BITS(dw[0], dw[t], (size_t)OC * C);
  }
  /* the bias added: y + b up to the order of the f32 additions (on the
   * unit oneDNN adds it as it stores the rows; where its kernel sums K in
   * blocks the bias may join before the last block) */
  for (int n = 0; n < N; n++)
    for (int j = 0; j < OC; j++)
      y[1][(size_t)n * OC + j] = y[0][(size_t)n * OC + j] + b[j];
  TT_CHECK_CLOSE(yb[0], y[1], (size_t)N * OC, 1e-5, 1e-5);
  loom_free(b);
  for (int t = 0; t < 3; t++) {
    loom_free(yb[t]);
    loom_free(y[t]);
    loom_free(dx[t]);
    loom_free(dw[t]);
  }
  loom_free(x);
  loom_free(w);
  loom_free(dout);
  loom_free(wh);
  loom_free(S);
}

/* The bf16 convolution on the unit (oneDNN's bf16 primitives where the
 * f32 convolution takes oneDNN's, the conversion path elsewhere): forward,
 * input and weight gradients against a double reference of the same bf16
 * values. bf16 x bf16 products are exact in f32 (8 + 8 significant bits), so
 * only the f32 sums round: |got - ref| <= (K + 2) 2^-24 sum|terms| with K
 * the terms summed (C KH KW forward, OC KH KW input gradient, N OH OW
 * weight gradient), the +2 for the bias or the gradient added to. And the
 * same bits at 1, 2 and 3 threads. */
static void conv_unit_one(loom_dtype dt, const loom_conv2d_dims d) {
  const int OH = loom_conv2d_out_h(&d), OW = loom_conv2d_out_w(&d);
  const size_t nx = (size_t)d.N * d.C * d.H * d.W;
  const size_t nw = (size_t)d.OC * d.C * d.KH * d.KW;
  const size_t ny = (size_t)d.N * d.OC * OH * OW;
  uint16_t *xh = loom_malloc(nx * 2), *wh = loom_malloc(nw * 2);
  float *xr = kt_zeros(nx), *wr = kt_zeros(nw);
  float *b = kt_rand((size_t)d.OC, 33, -1, 1), *g = kt_rand(ny, 34, -1, 1);
  float *gr = kt_zeros(ny);
  float *col = kt_zeros((size_t)loom_conv2d_col_floats(&d));
  float *S = kt_zeros((size_t)loom_conv2d_half_scratch_floats(&d));
  double *ry = calloc(ny, sizeof(double)), *my = calloc(ny, sizeof(double));
  double *rx = calloc(nx, sizeof(double)), *mx = calloc(nx, sizeof(double));
  double *rw = calloc(nw, sizeof(double)), *mw = calloc(nw, sizeof(double));
  float *y[3], *dx[3], *dw[3];
  TT_REQUIRE(xh && wh && xr && wr && b && g && gr && col && S && ry && my &&
             rx && mx && rw && mw);
  rand_half(dt, xh, xr, (int64_t)nx, 35);
  rand_half(dt, wh, wr, (int64_t)nw, 36);
  TT_CHECK_OK(loom_round_half(dt, gr, g, (int64_t)ny));
  /* the reference: dx and dw start at 0.5, y at the bias */
  for (size_t i = 0; i < nx; i++)
    rx[i] = mx[i] = 0.5;
  for (size_t i = 0; i < nw; i++)
    rw[i] = mw[i] = 0.5;
  for (int n = 0; n < d.N; n++)
    for (int oc = 0; oc < d.OC; oc++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          const size_t yi = (((size_t)n * d.OC + oc) * OH + oh) * OW + ow;
          double acc = b[oc], mag = fabs(b[oc]);
          for (int c = 0; c < d.C; c++)
            for (int kh = 0; kh < d.KH; kh++)
              for (int kw = 0; kw < d.KW; kw++) {
                const int ih = oh * d.stride - d.pad + kh;
                const int iw = ow * d.stride - d.pad + kw;
                if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W)
                  continue;
                const size_t xi = (((size_t)n * d.C + c) * d.H + ih) * d.W + iw;
                const size_t wi =
                    (((size_t)oc * d.C + c) * d.KH + kh) * d.KW + kw;
                acc += (double)xr[xi] * wr[wi];
                mag += fabs((double)xr[xi] * wr[wi]);
                rx[xi] += (double)gr[yi] * wr[wi];
                mx[xi] += fabs((double)gr[yi] * wr[wi]);
                rw[wi] += (double)gr[yi] * xr[xi];
                mw[wi] += fabs((double)gr[yi] * xr[xi]);
              }
          ry[yi] = acc;
          my[yi] = mag;
        }
  const double u = ldexp(1.0, -24);
  const double ky = d.C * d.KH * d.KW + 2, kx = d.OC * d.KH * d.KW + 2;
  const double kw = (double)d.N * OH * OW + 2;
  for (int t = 0; t < 3; t++) {
    y[t] = kt_zeros(ny);
    dx[t] = kt_zeros(nx);
    dw[t] = kt_zeros(nw);
    TT_REQUIRE(y[t] && dx[t] && dw[t]);
    for (size_t i = 0; i < nx; i++)
      dx[t][i] = 0.5f;
    for (size_t i = 0; i < nw; i++)
      dw[t][i] = 0.5f;
    loom_set_threads(t + 1);
    TT_CHECK_OK(
        loom_conv2d_forward_half(y[t], col, xh, dt, dt, wh, dt, b, &d, S));
    TT_CHECK_OK(loom_conv2d_backward_half(dx[t], dw[t], NULL, col, g, xh, dt,
                                          dt, wh, dt, &d, S));
  }
  loom_set_threads(0);
  int bad = 0;
  for (size_t i = 0; i < ny; i++)
    bad += !(fabs(y[0][i] - ry[i]) <= ky * u * my[i]);
  for (size_t i = 0; i < nx; i++)
    bad += !(fabs(dx[0][i] - rx[i]) <= kx * u * mx[i]);
  for (size_t i = 0; i < nw; i++)
    bad += !(fabs(dw[0][i] - rw[i]) <= kw * u * mw[i]);
  if (bad)
    fprintf(stderr, "  conv N=%d C=%d %dx%d OC=%d: %d outside the bound\n", d.N,
            d.C, d.H, d.W, d.OC, bad);
  TT_CHECK_EQ(bad, 0);
  for (int t = 1; t < 3; t++) {
    KT_CHECK_SAME_BITS(y[0], y[t], ny);
    KT_CHECK_SAME_BITS(dx[0], dx[t], nx);
    KT_CHECK_SAME_BITS(dw[0], dw[t], nw);
  }
  for (int t = 0; t < 3; t++) {
    loom_free(y[t]);
    loom_free(dx[t]);
    loom_free(dw[t]);
  }
  void *all[] = {xh, wh, xr, wr, b, g, gr, col, S};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  double *dall[] = {ry, my, rx, mx, rw, mw};
  for (size_t i = 0; i < sizeof dall / sizeof dall[0]; i++)
    free(dall[i]);
}

static void conv_unit_shapes(loom_dtype dt) {
  static const int shapes[][9] = {
      /* N C H W OC KH KW stride pad */
      {5, 6, 12, 11, 8, 3, 3, 1, 1},
      {33, 8, 5, 5, 4, 2, 2, 1, 0},    /* 11 chunks of 3 */
      {17, 5, 9, 9, 7, 5, 5, 2, 2},    /* the last chunk of 1 image */
      {3, 32, 12, 12, 64, 5, 5, 1, 0}, /* the CNN's second layer */
      {3, 1, 13, 10, 4, 5, 5, 2, 2},   /* C = 1: converts */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int *s = shapes[i];
    conv_unit_one(dt, (loom_conv2d_dims){s[0], s[1], s[2], s[3], s[4], s[5],
                                         s[6], s[7], s[8]});
  }
}

/* The half attention (loom_attention_*_half) against a double reference
 * of the same rounded q, k, v and dout. The kernel rounds P (forward) and
 * dS (backward) to the half type, each a relative error of at most u (2^-8
 * bf16, 2^-11 f16); products of half values are exact in f32 and the f32
 * sums add far less than u at these sizes. So, with D_t = sum_w P_tw
 * |dP_tw| and m_tu = P_tu (|dP_tu| + D_t) >= |dS_tu| bounding dS's error
 * by 3u m_tu: |out - ref| <= 4u sum_u P_tu |v_u|, |dv - ref| <= 4u sum_t
 * P_tu |dO_t|, |dq - ref| <= 4u scale sum_u m_tu |k_u| and |dk - ref| <=
 * 4u scale sum_t m_tu |q_t|, plus 1e-6. And the same bits at 1, 2 and 3
 * threads. */
static void att_half_one(loom_dtype dt, int B, int T, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const size_t nq = (size_t)B * T * C3, no = (size_t)B * T * C;
  const size_t na = (size_t)B * NH * T * T;
  const double u = dt == LOOM_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
  const double scale = 1.0 / sqrt((double)HS);
  float *qkv = kt_rand(nq, 41, -2, 2), *dout = kt_rand(no, 42, -1, 1);
  float *qr = kt_zeros(nq), *dr = kt_zeros(no);
  float *S = kt_zeros((size_t)loom_attention_half_scratch_floats(B, T, C, NH));
  uint16_t *att = loom_malloc(na * 2);
  double *ro = calloc(no, sizeof(double)), *mo = calloc(no, sizeof(double));
  double *rg = calloc(nq, sizeof(double)), *mg = calloc(nq, sizeof(double));
  double *P = calloc((size_t)T, sizeof(double)),
         *dP = calloc((size_t)T, sizeof(double));
  float *out[3], *dq[3];
  TT_REQUIRE(qkv && dout && qr && dr && S && att && ro && mo && rg && mg && P &&
             dP);
  TT_CHECK_OK(loom_round_half(dt, qr, qkv, (int64_t)nq));
  TT_CHECK_OK(loom_round_half(dt, dr, dout, (int64_t)no));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *q = qr + ((size_t)b * T + t) * C3 + h * HS;
        const float *d = dr + ((size_t)b * T + t) * C + h * HS;
        double m = -INFINITY, sum = 0, dot = 0, D = 0;
        for (int w = 0; w <= t; w++) {
          const float *k = qr + ((size_t)b * T + w) * C3 + C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; i++)
            s += (double)q[i] * k[i];
          P[w] = s * scale;
          m = P[w] > m ? P[w] : m;
        }
        for (int w = 0; w <= t; w++)
          sum += (P[w] = exp(P[w] - m));
        for (int w = 0; w <= t; w++) {
          P[w] /= sum;
          const float *v = qr + ((size_t)b * T + w) * C3 + 2 * C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; i++)
            s += (double)d[i] * v[i];
          dP[w] = s;
          dot += P[w] * s;
          D += P[w] * fabs(s);
        }
        for (int w = 0; w <= t; w++) {
          const size_t qi = ((size_t)b * T + t) * C3 + h * HS;
          const size_t ki = ((size_t)b * T + w) * C3 + C + h * HS;
          const double ds = P[w] * (dP[w] - dot) * scale;
          const double ms = P[w] * (fabs(dP[w]) + D) * scale;
          for (int i = 0; i < HS; i++) {
            const size_t oi = ((size_t)b * T + t) * C + h * HS + i;
            const double v = qr[ki + C + i];
            ro[oi] += P[w] * v;
            mo[oi] += P[w] * fabs(v);
            rg[ki + C + i] += P[w] * d[i]; /* dv */
            mg[ki + C + i] += P[w] * fabs(d[i]);
            rg[qi + i] += ds * qr[ki + i];
            mg[qi + i] += ms * fabs(qr[ki + i]);
            rg[ki + i] += ds * qr[qi + i];
            mg[ki + i] += ms * fabs(qr[qi + i]);
          }
        }
      }
  for (int t = 0; t < 3; t++) {
    out[t] = kt_zeros(no);
    dq[t] = kt_zeros(nq);
    TT_REQUIRE(out[t] && dq[t]);
    loom_set_threads(t + 1);
    TT_CHECK_OK(loom_attention_forward_half(dt, out[t], NULL, att, qkv, NULL, B,
                                            T, C, NH, S));
    TT_CHECK_OK(loom_attention_backward_half(dt, dq[t], dout, qkv, NULL, att, B,
                                             T, C, NH, S));
  }
  /* with the half output and the kept half qkv: the same bits, the output
   * rounded, and backward reading the kept qkv (qkv itself not passed) */
  {
    float *o2 = kt_zeros(no), *d2 = kt_zeros(nq);
    uint16_t *oh = loom_malloc(no * 2), *ow = loom_malloc(no * 2);
    uint16_t *qh = loom_malloc(nq * 2), *qw = loom_malloc(nq * 2);
    TT_REQUIRE(o2 && d2 && oh && ow && qh && qw);
    loom_set_threads(2);
    TT_CHECK_OK(
        loom_attention_forward_half(dt, o2, oh, att, qkv, qh, B, T, C, NH, S));
    TT_CHECK_OK(loom_attention_backward_half(dt, d2, dout, NULL, qh, att, B, T,
                                             C, NH, S));
    KT_CHECK_SAME_BITS(o2, out[0], no);
    KT_CHECK_SAME_BITS(d2, dq[0], nq);
    TT_CHECK_OK(loom_cvt_f32_to_half(dt, ow, out[0], (int64_t)no));
    TT_CHECK_OK(loom_cvt_f32_to_half(dt, qw, qkv, (int64_t)nq));
    TT_CHECK(memcmp(oh, ow, no * 2) == 0);
    TT_CHECK(memcmp(qh, qw, nq * 2) == 0);
    loom_free(o2);
    loom_free(d2);
    loom_free(oh);
    loom_free(ow);
    loom_free(qh);
    loom_free(qw);
  }
  loom_set_threads(0);
  int bad = 0;
  for (size_t i = 0; i < no; i++)
    if (!(fabs(out[0][i] - ro[i]) <= 4 * u * mo[i] + 1e-6) && bad++ < 3)
      fprintf(stderr, "  out[%zu] %.7g vs %.7g\n", i, out[0][i], ro[i]);
  for (size_t i = 0; i < nq; i++)
    if (!(fabs(dq[0][i] - rg[i]) <= 4 * u * mg[i] + 1e-6) && bad++ < 6)
      fprintf(stderr, "  dqkv[%zu] %.7g vs %.7g (bound %.3g)\n", i, dq[0][i],
              rg[i], 4 * u * mg[i] + 1e-6);
  if (bad)
    fprintf(stderr, "  %s attention B=%d T=%d C=%d NH=%d: %d outside\n",
            loom_dtype_name(dt), B, T, C, NH, bad);
  TT_CHECK_EQ(bad, 0);
  for (int t = 1; t < 3; t++) {
    KT_CHECK_SAME_BITS(out[0], out[t], no);
    KT_CHECK_SAME_BITS(dq[0], dq[t], nq);
  }
  for (int t = 0; t < 3; t++) {
    loom_free(out[t]);
    loom_free(dq[t]);
  }
  void *all[] = {qkv, dout, qr, dr, S, att};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  double *dall[] = {ro, mo, rg, mg, P, dP};
  for (size_t i = 0; i < sizeof dall / sizeof dall[0]; i++)
    free(dall[i]);
}

static void att_half_shapes(loom_dtype dt) {
  static const int shapes[][4] = {/* B T C NH */
                                  {1, 1, 4, 2},   {2, 7, 12, 2},
                                  {3, 17, 30, 5}, {2, 130, 24, 3},
                                  {1, 67, 64, 2}, {4, 128, 128, 4},
                                  {5, 33, 16, 4}}; /* 20 tasks > 16 slots */
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    att_half_one(dt, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
  TT_CHECK(loom_attention_forward_half(LOOM_F32, NULL, NULL, NULL, NULL, NULL,
                                       1, 1, 4, 2,
                                       NULL) == LOOM_ERR_UNSUPPORTED);
  loom_clear_error();
}

TT_TEST(half_layers) {
  for (int i = 0; i < N_HALVES; i++) {
    linear_half(halves[i]);
    conv2d_half(halves[i]);
    half_thread_invariance(halves[i]);
    att_half_shapes(halves[i]);
  }
}

/* A weight in f32 values of dt (a model's copy on the conversion path)
 * takes the conversion path even with the unit on: the f32 layer on the
 * rounded operands, bit for bit. */
static void f32_weight_converts(loom_dtype dt) {
  const int N = 37, C = 45, OC = 19;
  float *x = kt_rand((size_t)N * C, 51, -2, 2);
  float *w = kt_rand((size_t)OC * C, 52, -0.5f, 0.5f);
  float *xr = kt_zeros((size_t)N * C), *wr = kt_zeros((size_t)OC * C);
  float *S = kt_zeros((size_t)loom_linear_half_scratch_floats(N, C, OC));
  float *y = kt_zeros((size_t)N * OC), *yr = kt_zeros((size_t)N * OC);
  TT_REQUIRE(x && w && xr && wr && S && y && yr);
  TT_CHECK_OK(loom_round_half(dt, xr, x, (int64_t)N * C));
  TT_CHECK_OK(loom_round_half(dt, wr, w, (int64_t)OC * C));
  TT_CHECK_OK(loom_linear_forward_half(y, x, LOOM_F32, dt, wr, LOOM_F32, NULL,
                                       N, C, OC, S));
  TT_CHECK_OK(loom_linear_forward(yr, xr, wr, NULL, N, C, OC));
  KT_CHECK_SAME_BITS(y, yr, (size_t)N * OC);
  float *all[] = {x, w, xr, wr, S, y, yr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
}

/* The bf16 unit (oneDNN's matmul on AVX512-BF16 or AMX), where this CPU
 * has one: the GEMM within the f32-sum bound of the double reference on
 * every shape and transpose, and the same bits at 1, 2 and 3 threads. */
TT_TEST(bf16_unit) {
  loom_bf16_path unit = LOOM_BF16_PATH_AMX;
  if (loom_bf16_set_path(unit) != LOOM_OK) {
    loom_clear_error();
    unit = LOOM_BF16_PATH_AVX512_BF16;
    if (loom_bf16_set_path(unit) != LOOM_OK) {
      loom_clear_error();
      printf("  (no bf16 unit here: skipped)\n");
      return;
    }
  }
  printf("  bf16 unit: %s\n", loom_half_path_describe(LOOM_BF16));
  TT_CHECK(strstr(loom_half_path_describe(LOOM_BF16), "oneDNN matmul") != NULL);
  gemm_half_shapes(LOOM_BF16);
  half_thread_invariance(LOOM_BF16);
  conv_unit_shapes(LOOM_BF16);
  att_half_shapes(LOOM_BF16);
  linear_gelu(LOOM_BF16);
  f32_weight_converts(LOOM_BF16);
  TT_CHECK_OK(loom_bf16_set_path(LOOM_BF16_PATH_CONVERT));
  /* the conversion path meets the same bound (and is bitwise the f32
   * convolution of the rounded values: half_layers) */
  conv_unit_shapes(LOOM_BF16);
}

/* The f16 unit (oneDNN 3.x's f16 matmul and convolution on AVX512-FP16),
 * where this CPU and build have it: the same checks as bf16's. Elsewhere
 * the path is refused with a message naming what is missing, and f16
 * keeps converting. */
TT_TEST(f16_unit) {
  const loom_status st = loom_f16_set_path(LOOM_F16_PATH_AVX512_FP16);
  if (st != LOOM_OK) {
    TT_CHECK_EQ(st, LOOM_ERR_UNSUPPORTED);
    TT_CHECK(strstr(loom_last_error(), "f16 path avx512_fp16: ") != NULL);
    TT_CHECK_EQ(loom_f16_get_path(), LOOM_F16_PATH_CONVERT);
    TT_CHECK(!loom_half_on_unit(LOOM_F16));
    printf("  (no f16 unit here: skipped; %s)\n", loom_last_error());
    loom_clear_error();
    return;
  }
  printf("  f16 unit: %s\n", loom_half_path_describe(LOOM_F16));
  TT_CHECK(loom_half_on_unit(LOOM_F16));
  TT_CHECK(strstr(loom_half_path_describe(LOOM_F16), "AVX512-FP16") != NULL);
  gemm_half_shapes(LOOM_F16);
  half_thread_invariance(LOOM_F16);
  conv_unit_shapes(LOOM_F16);
  att_half_shapes(LOOM_F16);
  linear_gelu(LOOM_F16);
  TT_CHECK_OK(loom_f16_set_path(LOOM_F16_PATH_CONVERT));
  conv_unit_shapes(LOOM_F16);
}

/* The kernels that write a half output as they compute (ReLU, GELU, layer
 * norm):
 * bit for bit the f32 kernel then the conversion, for bf16 and f16, on
 * lengths and rows that are not multiples of their blocks, at 1 and 2
 * threads. */
static void fused_half_one(loom_dtype dt) {
  const int64_t n = 3 * 16384 + 1027; /* three parallel chunks and a tail */
  float *x = kt_rand((size_t)n, 31, -6, 6), *g = kt_zeros((size_t)n);
  uint16_t *h = loom_malloc((size_t)n * 2), *hw = loom_malloc((size_t)n * 2);
  TT_REQUIRE(x && g && h && hw);
  loom_gelu_forward(g, x, n);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, hw, g, n));
  loom_gelu_forward_half(dt, h, x, n);
  TT_CHECK(memcmp(h, hw, (size_t)n * 2) == 0);
  loom_relu_forward(g, x, n);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, hw, g, n));
  loom_relu_forward_half(dt, h, x, n);
  TT_CHECK(memcmp(h, hw, (size_t)n * 2) == 0);
  const int N = 97, C = 300; /* a row longer than the 256-wide block */
  float *w = kt_rand(C, 32, -1, 1), *b = kt_rand(C, 33, -1, 1);
  float *m1 = kt_zeros(N), *r1 = kt_zeros(N), *m2 = kt_zeros(N),
        *r2 = kt_zeros(N);
  TT_REQUIRE(w && b && m1 && r1 && m2 && r2);
  loom_layernorm_forward(g, m1, r1, x, w, b, N, C);
  TT_CHECK_OK(loom_cvt_f32_to_half(dt, hw, g, (int64_t)N * C));
  loom_layernorm_forward_half(dt, h, m2, r2, x, w, b, N, C);
  TT_CHECK(memcmp(h, hw, (size_t)N * C * 2) == 0);
  KT_CHECK_SAME_BITS(m1, m2, (size_t)N);
  KT_CHECK_SAME_BITS(r1, r2, (size_t)N);
  float *all[] = {x, g, w, b, m1, r1, m2, r2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  loom_free(h);
  loom_free(hw);
}

TT_TEST(fused_half_outputs) {
  for (int t = 1; t <= 2; t++) {
    loom_set_threads(t);
    fused_half_one(LOOM_BF16);
    fused_half_one(LOOM_F16);
  }
  loom_set_threads(0);
}

TT_TEST(half_path_named) {
  TT_CHECK_EQ(loom_bf16_get_path(), LOOM_BF16_PATH_CONVERT);
  TT_CHECK_STR(loom_bf16_path_name(LOOM_BF16_PATH_AMX), "amx");
  TT_CHECK_EQ(loom_f16_get_path(), LOOM_F16_PATH_CONVERT);
  TT_CHECK_STR(loom_f16_path_name(LOOM_F16_PATH_AVX512_FP16), "avx512_fp16");
  TT_CHECK_STR(loom_f16_path_name((loom_f16_path)7), "unknown");
  TT_CHECK_EQ(loom_f16_set_path((loom_f16_path)-1), LOOM_ERR_INVALID_ARG);
  loom_clear_error();
  TT_CHECK(strstr(loom_half_path_describe(LOOM_BF16), "bf16 storage") != NULL);
  /* the avx2 and avx512 copies convert f16 with F16C, and say so */
  const char *f16 = loom_half_path_describe(LOOM_F16);
  TT_CHECK(strstr(f16, "f16 storage") != NULL);
  TT_CHECK((strstr(f16, "F16C") != NULL) == (loom_cpu_isa() >= LOOM_ISA_AVX2));
  TT_CHECK_STR(loom_half_path_describe(LOOM_F32), "?");
}

int main(void) {
  /* the conversion path first (bitwise against the f32 kernels), then the
   * bf16 unit where there is one */
  TT_CHECK_OK(loom_bf16_set_path(LOOM_BF16_PATH_CONVERT));
  TT_CHECK_OK(loom_f16_set_path(LOOM_F16_PATH_CONVERT));
  TT_RUN(cvt_matches_scalar);
  TT_RUN(cvt_f16_matches_scalar);
  TT_RUN(cvt_f16_sweep);
  TT_RUN(gemm_half_shapes_all);
  TT_RUN(gemm_half_args);
  TT_RUN(half_layers);
  TT_RUN(fused_half_outputs);
  TT_RUN(half_path_named);
  TT_RUN(bf16_unit);
  TT_RUN(f16_unit);
  return tt_finish();
}
