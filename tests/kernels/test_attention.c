/* Causal attention against a plain per-element reference in double, for
 * every GEMM backend and shapes around the query-block size (T = 1, odd T
 * and head sizes, T across block edges, the GPT head size). */
#include <stdlib.h>

#include "kt.h"

/* out(B,T,C), att(B,NH,T,T) in double: scores, mask, softmax, sum. */
static void att_forward_ref(double *out, double *att, const float *qkv, int B,
                            int T, int C, int NH) {
  const int HS = C / NH;
  const double scale = 1.0 / sqrt((double)HS);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * HS;
        double *a = att + (((size_t)b * NH + h) * T + t) * T;
        double m = -INFINITY;
        for (int u = 0; u < T; u++) {
          a[u] = 0;
          if (u > t)
            continue;
          const float *k = qkv + ((size_t)b * T + u) * 3 * C + C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; i++)
            s += (double)q[i] * k[i];
          a[u] = s * scale;
          m = a[u] > m ? a[u] : m;
        }
        double sum = 0;
        for (int u = 0; u <= t; u++)
          sum += (a[u] = exp(a[u] - m));
        for (int u = 0; u <= t; u++)
          a[u] /= sum;
        double *o = out + ((size_t)b * T + t) * C + h * HS;
        for (int i = 0; i < HS; i++) {
          double s = 0;
          for (int u = 0; u <= t; u++)
            s += a[u] * qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * HS + i];
          o[i] = s;
        }
      }
}

/* dqkv += gradient of sum(out * dout), from att in double. */
static void att_backward_ref(double *dqkv, const float *dout, const float *qkv,
                             const double *att, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const double scale = 1.0 / sqrt((double)HS);
  double *datt = malloc(sizeof(double) * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const double *a = att + (((size_t)b * NH + h) * T + t) * T;
        const float *d = dout + ((size_t)b * T + t) * C + h * HS;
        double dot = 0;
        for (int u = 0; u <= t; u++) {
          const float *v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; i++) {
            s += (double)d[i] * v[i];
            dqkv[((size_t)b * T + u) * 3 * C + 2 * C + h * HS + i] +=
                a[u] * d[i];
          }
          datt[u] = s;
          dot += a[u] * s;
        }
        for (int u = 0; u <= t; u++) {
          const double ds = a[u] * (datt[u] - dot) * scale;
          for (int i = 0; i < HS; i++) {
            const size_t qi = ((size_t)b * T + t) * 3 * C + h * HS + i;
            const size_t ki = ((size_t)b * T + u) * 3 * C + C + h * HS + i;
            dqkv[qi] += ds * qkv[ki];
            dqkv[ki] += ds * qkv[qi];
          }
        }
      }
  free(datt);
}

static const int shapes[][4] = {
    /* B T C NH */
    {1, 1, 1, 1},   {1, 1, 4, 2},   {2, 5, 6, 3},    {2, 7, 12, 2},
    {1, 65, 8, 2},  {3, 17, 30, 5}, {2, 130, 24, 3}, {1, 1, 16, 1},
    {2, 5, 32, 2},  {1, 67, 64, 2}, {2, 130, 96, 3}, {3, 17, 64, 1},
    {1, 33, 128, 4}};

static void check_shape(int B, int T, int C, int NH, uint64_t seed) {
  const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
  const size_t na = (size_t)B * NH * T * T;
  float *qkv = kt_rand(nq, seed, -2, 2), *out = kt_zeros(no),
        *att = kt_zeros(na);
  float *dout = kt_rand(no, seed + 1, -1, 1),
        *dqkv = kt_rand(nq, seed + 2, -1, 1);
  float *scratch = kt_zeros(na), *ro = kt_zeros(no), *ra = kt_zeros(na);
  float *rg = kt_zeros(nq);
  double *dout_d = calloc(no, sizeof(double)),
         *att_d = calloc(na, sizeof(double));
  double *dq_d = calloc(nq, sizeof(double));
  if (!qkv || !out || !att || !dout || !dqkv || !scratch || !ro || !ra || !rg ||
      !dout_d || !att_d || !dq_d) {
    TT_CHECK(0);
    return;
  }
  for (size_t i = 0; i < na; i++)
    att[i] = NAN; /* every entry, masked ones too, must be written */
  for (size_t i = 0; i < nq; i++)
    dq_d[i] = dqkv[i];
  TT_CHECK_OK(loom_attention_forward(out, att, qkv, B, T, C, NH));
  att_forward_ref(dout_d, att_d, qkv, B, T, C, NH);
  for (size_t i = 0; i < no; i++)
    ro[i] = (float)dout_d[i];
  for (size_t i = 0; i < na; i++)
    ra[i] = (float)att_d[i];
  if (!TT_CHECK_CLOSE(att, ra, na, 1e-6, 1e-5) ||
      !TT_CHECK_CLOSE(out, ro, no, 1e-5, 1e-5))
    fprintf(stderr, "    forward B=%d T=%d C=%d NH=%d backend %s\n", B, T, C,
            NH, loom_gemm_backend_name(loom_gemm_get_backend()));
  TT_CHECK_OK(
      loom_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH));
  att_backward_ref(dq_d, dout, qkv, att_d, B, T, C, NH);
  for (size_t i = 0; i < nq; i++)
    rg[i] = (float)dq_d[i];
  if (!TT_CHECK_CLOSE(dqkv, rg, nq, 2e-5, 1e-4))
    fprintf(stderr, "    backward B=%d T=%d C=%d NH=%d backend %s\n", B, T, C,
            NH, loom_gemm_backend_name(loom_gemm_get_backend()));
  float *bufs[] = {qkv, out, att, dout, dqkv, scratch, ro, ra, rg};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
  free(dout_d);
  free(att_d);
  free(dq_d);
}

TT_TEST(attention_matches_reference) {
  for (int be = 0; be < LOOM_GEMM_BACKEND_COUNT; be++) {
    if (loom_gemm_set_backend((loom_gemm_backend)be) != LOOM_OK)
      continue; /* oneDNN not built in */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check_shape(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                  500 + s);
  }
}

TT_TEST(attention_rejects_bad_shapes) {
  float x[12] = {0};
  TT_CHECK_EQ(loom_attention_forward(x, x, x, 1, 1, 3, 2),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_attention_backward(x, x, x, x, x, 1, 1, 4, 0),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_attention_forward(x, x, x, 0, 5, 4, 2));
}

int main(void) {
  TT_RUN(attention_matches_reference);
  TT_RUN(attention_rejects_bad_shapes);
  return tt_finish();
}
