/* bf16 kernels: the conversions against the scalar ones of core (special
 * values, ties, odd lengths), the bf16 GEMM, linear layer and convolution
 * against the
 * f32 kernels on bf16-rounded operands (bitwise on the conversion path)
 * and against the double reference with a tolerance that follows from the
 * format, and thread-count invariance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kt.h"

/* bf16 keeps 8 significant bits: rounding to nearest moves a value by at
 * most half an ulp, a relative 2^-9. */
#define BF16_U (1.0 / 512.0)

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
  TT_REQUIRE(x && h && w && rd);
  for (int off = 0; off < 3; off++) { /* unaligned starts */
    const int m = n - off;
    loom_cvt_f32_to_bf16(h + off, x + off, m);
    loom_cvt_bf16_to_f32(w + off, h + off, m);
    loom_round_bf16(rd + off, x + off, m);
    int bad = 0;
    for (int i = off; i < n; i++) {
      const loom_bf16 want = loom_f32_to_bf16(x[i]);
      if (h[i] != want || f_bits(w[i]) != f_bits(loom_bf16_to_f32(want)) ||
          f_bits(rd[i]) != f_bits(loom_bf16_to_f32(want))) {
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
  loom_free(x);
  loom_free(h);
  loom_free(w);
  loom_free(rd);
}

/* A bf16 matrix of rows x ld (cols used) and its values in f32. */
static void rand_bf16(loom_bf16 *h, float *f, int64_t n, uint64_t seed) {
  float *x = kt_rand((size_t)n, seed, -1.0f, 1.0f);
  loom_cvt_f32_to_bf16(h, x, n);
  loom_cvt_bf16_to_f32(f, h, n);
  loom_free(x);
}

/* |C - ref| <= bound per element: ref the double GEMM, bound the f32
 * accumulation (K + 2 roundings of at most 2^-24 relative each, on the
 * sum of |products|) plus, when `fmt`, the rounding of both operands to
 * bf16 (2u + u^2 relative on each product). */
static int within(const float *C, const float *ref, const double *mag,
                  int64_t n, int K, bool fmt) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double b = (K + 2) * ldexp(1.0, -24) * mag[i] + 1e-30;
    if (fmt)
      b += (2 * BF16_U + BF16_U * BF16_U) * mag[i];
    if (!(fabs((double)C[i] - (double)ref[i]) <= b) && bad++ < 3)
      fprintf(stderr, "  [%lld] %.9g vs %.9g (bound %.3g)\n", (long long)i,
              (double)C[i], (double)ref[i], b);
  }
  return bad;
}

TT_TEST(gemm_bf16_shapes) {
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
      loom_bf16 *A = loom_malloc((size_t)na * 2),
                *B = loom_malloc((size_t)nb * 2);
      float *Af = kt_zeros((size_t)na), *Bf = kt_zeros((size_t)nb);
      float *C = kt_rand((size_t)nc, 9, -1, 1), *C0 = kt_copy(C, (size_t)nc);
      float *Cf = kt_copy(C, (size_t)nc), *R = kt_copy(C, (size_t)nc);
      float *S = kt_zeros((size_t)loom_gemm_bf16_scratch_floats(M, N, K));
      double *mag = calloc((size_t)nc, sizeof(double));
      TT_REQUIRE(A && B && Af && Bf && C && C0 && Cf && R && S && mag);
      rand_bf16(A, Af, na, 100 + s);
      rand_bf16(B, Bf, nb, 200 + s);
      const float alpha = 0.75f, beta = 0.5f;
      TT_CHECK_OK(loom_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta,
                                 C, ldc, S));
      /* conversion path: the f32 GEMM of the bf16 values, to the bit */
      TT_CHECK_OK(
          loom_gemm(ta, tb, M, N, K, alpha, Af, lda, Bf, ldb, beta, Cf, ldc));
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
      TT_CHECK_EQ(within(C, R, mag, nc, K, false), 0);
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

TT_TEST(gemm_bf16_args) {
  float c = 0;
  loom_bf16 a = 0;
  TT_CHECK(loom_gemm_bf16(false, false, -1, 1, 1, 1, &a, 1, &a, 1, 0, &c, 1,
                          &c) == LOOM_ERR_INVALID_ARG);
  TT_CHECK(loom_gemm_bf16(false, false, 2, 2, 2, 1, &a, 1, &a, 2, 0, &c, 2,
                          &c) == LOOM_ERR_INVALID_ARG);
  TT_CHECK(loom_gemm_bf16(false, false, 1, 1, 1, 1, &a, 1, &a, 1, 0, &c, 1,
                          NULL) == LOOM_ERR_INVALID_ARG);
  /* K = 0 with beta 0 clears C, NaN included */
  c = NAN;
  TT_CHECK_OK(loom_gemm_bf16(false, false, 1, 1, 0, 1, NULL, 1, NULL, 1, 0, &c,
                             1, NULL));
  TT_CHECK(c == 0.0f);
}

/* The linear layer in bf16: against the f32 layer on rounded operands
 * (bitwise on the conversion path), against the f32 layer on the f32
 * operands within the format's bound, with an f32 and a bf16 input. */
TT_TEST(linear_bf16) {
  const int N = 37, C = 45, OC = 19;
  float *x = kt_rand((size_t)N * C, 1, -2, 2);
  float *w = kt_rand((size_t)OC * C, 2, -0.5f, 0.5f);
  float *b = kt_rand((size_t)OC, 3, -1, 1);
  float *dout = kt_rand((size_t)N * OC, 4, -1, 1);
  loom_bf16 *wh = loom_malloc((size_t)OC * C * 2);
  loom_bf16 *xh = loom_malloc((size_t)N * C * 2);
  float *xr = kt_zeros((size_t)N * C), *wr = kt_zeros((size_t)OC * C);
  float *dr = kt_zeros((size_t)N * OC);
  float *S = kt_zeros((size_t)loom_linear_bf16_scratch_floats(N, C, OC));
  float *y = kt_zeros((size_t)N * OC), *y2 = kt_zeros((size_t)N * OC);
  float *yr = kt_zeros((size_t)N * OC), *yf = kt_zeros((size_t)N * OC);
  TT_REQUIRE(x && w && b && dout && wh && xh && xr && wr && dr && S && y &&
             y2 && yr && yf);
  loom_cvt_f32_to_bf16(wh, w, (int64_t)OC * C);
  loom_cvt_f32_to_bf16(xh, x, (int64_t)N * C);
  loom_round_bf16(xr, x, (int64_t)N * C);
  loom_round_bf16(wr, w, (int64_t)OC * C);
  loom_round_bf16(dr, dout, (int64_t)N * OC);
  TT_CHECK_OK(loom_linear_forward_bf16(y, x, LOOM_F32, wh, b, N, C, OC, S));
  TT_CHECK_OK(loom_linear_forward_bf16(y2, xh, LOOM_BF16, wh, b, N, C, OC, S));
  TT_CHECK_OK(loom_linear_forward(yr, xr, wr, b, N, C, OC));
  TT_CHECK_OK(loom_linear_forward(yf, x, w, b, N, C, OC));
  KT_CHECK_SAME_BITS(y, yr, (size_t)N * OC);
  KT_CHECK_SAME_BITS(y2, yr, (size_t)N * OC);
  /* against f32 arithmetic: |x| < 2, |w| < 0.5, so each product moves by
   * at most (2u + u^2) |x w| and a row by that times C * 1 */
  const double fmt = (2 * BF16_U + BF16_U * BF16_U) * C * 1.0 + 1e-5;
  TT_CHECK_CLOSE(y, yf, (size_t)N * OC, fmt, 0);

  /* backward: rounded dout for the matmuls, f32 dout for the bias */
  float *dx = kt_rand((size_t)N * C, 5, -1, 1),
        *dw = kt_rand((size_t)OC * C, 6, -1, 1);
  float *db = kt_rand((size_t)OC, 7, -1, 1);
  float *dxr = kt_copy(dx, (size_t)N * C), *dwr = kt_copy(dw, (size_t)OC * C);
  float *dbr = kt_copy(db, (size_t)OC);
  float *dx2 = kt_copy(dx, (size_t)N * C), *dw2 = kt_copy(dw, (size_t)OC * C);
  float *db2 = kt_copy(db, (size_t)OC);
  TT_REQUIRE(dx && dw && db && dxr && dwr && dbr && dx2 && dw2 && db2);
  TT_CHECK_OK(loom_linear_backward_bf16(dx, dw, db, dout, x, LOOM_F32, wh, N, C,
                                        OC, S));
  TT_CHECK_OK(loom_linear_backward_bf16(dx2, dw2, db2, dout, xh, LOOM_BF16, wh,
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
  /* an input type the layer does not take */
  TT_CHECK(loom_linear_forward_bf16(y, x, LOOM_I32, wh, b, N, C, OC, S) ==
           LOOM_ERR_UNSUPPORTED);
  float *all[] = {x,  w,  b,  dout, xr,  wr,  dr,  S,   y,   y2, yr,
                  yf, dx, dw, db,   dxr, dwr, dbr, dx2, dw2, db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  loom_free(wh);
  loom_free(xh);
}

/* The convolution the same way, bitwise, on a shape oneDNN's engine takes
 * (C >= 4, with the dnnl GEMM backend) and one only im2col takes (C = 1,
 * stride 2, padding). */
static void conv_bf16_one(const loom_conv2d_dims d) {
  const int OH = loom_conv2d_out_h(&d), OW = loom_conv2d_out_w(&d);
  const size_t nx = (size_t)d.N * d.C * d.H * d.W;
  const size_t nw = (size_t)d.OC * d.C * d.KH * d.KW;
  const size_t ny = (size_t)d.N * d.OC * OH * OW;
  float *x = kt_rand(nx, 21, -2, 2), *w = kt_rand(nw, 22, -0.5f, 0.5f);
  float *b = kt_rand((size_t)d.OC, 23, -1, 1), *dout = kt_rand(ny, 24, -1, 1);
  loom_bf16 *wh = loom_malloc(nw * 2), *xh = loom_malloc(nx * 2);
  float *xr = kt_zeros(nx), *wr = kt_zeros(nw), *dr = kt_zeros(ny);
  float *col = kt_zeros((size_t)loom_conv2d_col_floats(&d));
  float *S = kt_zeros((size_t)loom_conv2d_bf16_scratch_floats(&d));
  float *y = kt_zeros(ny), *y2 = kt_zeros(ny), *yr = kt_zeros(ny);
  TT_REQUIRE(x && w && b && dout && wh && xh && xr && wr && dr && col && S &&
             y && y2 && yr);
  loom_cvt_f32_to_bf16(wh, w, (int64_t)nw);
  loom_cvt_f32_to_bf16(xh, x, (int64_t)nx);
  loom_round_bf16(xr, x, (int64_t)nx);
  loom_round_bf16(wr, w, (int64_t)nw);
  loom_round_bf16(dr, dout, (int64_t)ny);
  TT_CHECK_OK(loom_conv2d_forward_bf16(y, col, x, LOOM_F32, wh, b, &d, S));
  TT_CHECK_OK(loom_conv2d_forward_bf16(y2, col, xh, LOOM_BF16, wh, b, &d, S));
  TT_CHECK_OK(loom_conv2d_forward(yr, col, xr, wr, b, &d));
  KT_CHECK_SAME_BITS(y, yr, ny);
  KT_CHECK_SAME_BITS(y2, yr, ny);

  float *dx = kt_rand(nx, 25, -1, 1), *dw = kt_rand(nw, 26, -1, 1);
  float *db = kt_rand((size_t)d.OC, 27, -1, 1);
  float *dxr = kt_copy(dx, nx), *dwr = kt_copy(dw, nw);
  float *dbr = kt_copy(db, (size_t)d.OC);
  float *dx2 = kt_copy(dx, nx), *dw2 = kt_copy(dw, nw);
  float *db2 = kt_copy(db, (size_t)d.OC);
  TT_REQUIRE(dx && dw && db && dxr && dwr && dbr && dx2 && dw2 && db2);
  TT_CHECK_OK(
      loom_conv2d_backward_bf16(dx, dw, db, col, dout, x, LOOM_F32, wh, &d, S));
  TT_CHECK_OK(loom_conv2d_backward_bf16(dx2, dw2, db2, col, dout, xh, LOOM_BF16,
                                        wh, &d, S));
  TT_CHECK_OK(loom_conv2d_backward(dxr, dwr, NULL, col, dr, xr, wr, &d));
  TT_CHECK_OK(loom_conv2d_backward(NULL, NULL, dbr, col, dout, NULL, NULL, &d));
  KT_CHECK_SAME_BITS(dx, dxr, nx);
  KT_CHECK_SAME_BITS(dw, dwr, nw);
  KT_CHECK_SAME_BITS(db, dbr, (size_t)d.OC);
  KT_CHECK_SAME_BITS(dx2, dxr, nx);
  KT_CHECK_SAME_BITS(dw2, dwr, nw);
  KT_CHECK_SAME_BITS(db2, dbr, (size_t)d.OC);
  TT_CHECK(loom_conv2d_forward_bf16(y, col, x, LOOM_I32, wh, b, &d, S) ==
           LOOM_ERR_UNSUPPORTED);
  float *all[] = {x,  w,  b,  dout, xr,  wr,  dr,  col, S,   y,  y2,
                  yr, dx, dw, db,   dxr, dwr, dbr, dx2, dw2, db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    loom_free(all[i]);
  loom_free(wh);
  loom_free(xh);
}

TT_TEST(conv2d_bf16) {
  conv_bf16_one((loom_conv2d_dims){.N = 5,
                                   .C = 6,
                                   .H = 12,
                                   .W = 11,
                                   .OC = 8,
                                   .KH = 3,
                                   .KW = 3,
                                   .stride = 1,
                                   .pad = 1});
  conv_bf16_one((loom_conv2d_dims){.N = 3,
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
TT_TEST(bf16_thread_invariance) {
  const int N = 300, C = 520, OC = 260;
  float *x = kt_rand((size_t)N * C, 11, -1, 1);
  float *w = kt_rand((size_t)OC * C, 12, -1, 1);
  float *dout = kt_rand((size_t)N * OC, 13, -1, 1);
  loom_bf16 *wh = loom_malloc((size_t)OC * C * 2);
  float *S = kt_zeros((size_t)loom_linear_bf16_scratch_floats(N, C, OC));
  float *y[3], *dx[3], *dw[3];
  TT_REQUIRE(x && w && dout && wh && S);
  loom_cvt_f32_to_bf16(wh, w, (int64_t)OC * C);
  for (int t = 0; t < 3; t++) {
    y[t] = kt_zeros((size_t)N * OC);
    dx[t] = kt_zeros((size_t)N * C);
    dw[t] = kt_zeros((size_t)OC * C);
    TT_REQUIRE(y[t] && dx[t] && dw[t]);
    loom_set_threads(t + 1);
    TT_CHECK_OK(
        loom_linear_forward_bf16(y[t], x, LOOM_F32, wh, NULL, N, C, OC, S));
    TT_CHECK_OK(loom_linear_backward_bf16(dx[t], dw[t], NULL, dout, x, LOOM_F32,
                                          wh, N, C, OC, S));
  }
  loom_set_threads(0);
  for (int t = 1; t < 3; t++) {
    KT_CHECK_SAME_BITS(y[0], y[t], (size_t)N * OC);
    KT_CHECK_SAME_BITS(dx[0], dx[t], (size_t)N * C);
    KT_CHECK_SAME_BITS(dw[0], dw[t], (size_t)OC * C);
  }
  for (int t = 0; t < 3; t++) {
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

TT_TEST(bf16_path_named) {
  TT_CHECK_EQ(loom_bf16_get_path(), LOOM_BF16_PATH_CONVERT);
  TT_CHECK_STR(loom_bf16_path_name(LOOM_BF16_PATH_AMX), "amx");
  TT_CHECK(strstr(loom_bf16_path_describe(), "bf16 storage") != NULL);
}

int main(void) {
  TT_RUN(cvt_matches_scalar);
  TT_RUN(gemm_bf16_shapes);
  TT_RUN(gemm_bf16_args);
  TT_RUN(linear_bf16);
  TT_RUN(conv2d_bf16);
  TT_RUN(bf16_thread_invariance);
  TT_RUN(bf16_path_named);
  return tt_finish();
}
