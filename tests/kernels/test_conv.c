/* Convolution against the direct reference (forward) and a per-element
 * reference in double (backward), over strides, paddings, odd sizes, one
 * and many images per chunk and more chunks than slots, for every GEMM
 * backend. CTest runs it three times: LOOM_CONV unset (auto), =im2col and
 * =dnnl, so both engines see every shape. */
#include <stdlib.h>

#include "kt.h"

static const int shapes[][9] = {
    /* N C H W OC KH KW stride pad */
    {1, 1, 1, 1, 1, 1, 1, 1, 0},
    {2, 1, 5, 5, 3, 3, 3, 1, 0},
    {3, 2, 7, 6, 4, 3, 2, 2, 1},
    {2, 3, 8, 8, 5, 5, 5, 1, 2},
    {1, 2, 9, 7, 3, 1, 1, 1, 0},
    {5, 2, 6, 6, 7, 3, 3, 3, 1},
    {4, 3, 10, 9, 2, 4, 3, 2, 2},
    {1, 1, 3, 3, 2, 3, 3, 1, 3},
    {20, 1, 18, 18, 4, 3, 3, 1, 1}, /* one image per chunk, 20 chunks > slots */
    {37, 2, 4, 4, 3, 2, 2, 2, 0},   /* one chunk of every image */
    {70, 2, 6, 6, 3, 3, 3, 1, 0},   /* chunks of 16, the last one short */
    {3, 1, 28, 28, 4, 5, 5, 1, 0},  /* the CNN's first layer, fewer maps */
    /* C >= 4: oneDNN's primitives under the dnnl backend */
    {5, 4, 7, 7, 6, 3, 3, 1, 1},
    {3, 16, 6, 5, 8, 3, 2, 2, 0},
    {33, 8, 5, 5, 4, 2, 2, 1, 0}, /* 11 chunks of 3 */
    {17, 6, 4, 4, 3, 1, 1, 1, 0}, /* 9 chunks, the last of 1 image */
    {18, 5, 9, 9, 7, 5, 5, 2, 2},
    {2, 32, 12, 12, 16, 5, 5, 1, 0},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static loom_conv2d_dims dims_of(const int *s) {
  loom_conv2d_dims d = {s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]};
  return d;
}

/* gradients of sum(out * dout) in double, added to dx, dw, db. */
static void conv_backward_ref(double *dx, double *dw, double *db,
                              const float *dout, const float *x, const float *w,
                              const loom_conv2d_dims *d) {
  const int OH = loom_conv2d_out_h(d), OW = loom_conv2d_out_w(d);
  for (int n = 0; n < d->N; n++)
    for (int oc = 0; oc < d->OC; oc++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          const double g = dout[(((size_t)n * d->OC + oc) * OH + oh) * OW + ow];
          db[oc] += g;
          for (int c = 0; c < d->C; c++)
            for (int kh = 0; kh < d->KH; kh++)
              for (int kw = 0; kw < d->KW; kw++) {
                const int ih = oh * d->stride - d->pad + kh;
                const int iw = ow * d->stride - d->pad + kw;
                if (ih < 0 || ih >= d->H || iw < 0 || iw >= d->W)
                  continue;
                const size_t xi =
                    (((size_t)n * d->C + c) * d->H + ih) * d->W + iw;
                const size_t wi =
                    (((size_t)oc * d->C + c) * d->KH + kh) * d->KW + kw;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
}

static void check_shape(const loom_conv2d_dims *d, uint64_t seed) {
  const int OH = loom_conv2d_out_h(d), OW = loom_conv2d_out_w(d);
  const size_t nx = (size_t)d->N * d->C * d->H * d->W;
  const size_t nw = (size_t)d->OC * d->C * d->KH * d->KW;
  const size_t ny = (size_t)d->N * d->OC * OH * OW;
  const int64_t ncol = loom_conv2d_col_floats(d);
  TT_CHECK(ncol > 0);
  float *x = kt_rand(nx, seed, -1, 1), *w = kt_rand(nw, seed + 1, -1, 1);
  float *b = kt_rand(d->OC, seed + 2, -1, 1), *y = kt_zeros(ny),
        *ry = kt_zeros(ny);
  float *col = kt_rand((size_t)ncol, seed + 3, -1e3f, 1e3f); /* garbage */
  float *dy = kt_rand(ny, seed + 4, -1, 1);
  float *gx = kt_rand(nx, seed + 5, -1, 1), *gw = kt_rand(nw, seed + 6, -1, 1);
  float *gb = kt_rand(d->OC, seed + 7, -1, 1);
  double *rx = calloc(nx, sizeof(double)), *rw = calloc(nw, sizeof(double));
  double *rb = calloc(d->OC, sizeof(double));
  float *fx = kt_zeros(nx), *fw = kt_zeros(nw), *fb = kt_zeros(d->OC);
  if (!x || !w || !b || !y || !ry || !col || !dy || !gx || !gw || !gb || !rx ||
      !rw || !rb || !fx || !fw || !fb) {
    TT_CHECK(0);
    return;
  }
  TT_CHECK_OK(loom_conv2d_forward(y, col, x, w, b, d));
  loom_conv2d_forward_ref(ry, x, w, b, d);
  const int ckk = d->C * d->KH * d->KW;
  int bad = !TT_CHECK_CLOSE(y, ry, ny, 1e-5 * ckk, 1e-5);
  TT_CHECK_OK(loom_conv2d_forward(y, col, x, w, NULL, d));
  loom_conv2d_forward_ref(ry, x, w, NULL, d);
  bad |= !TT_CHECK_CLOSE(y, ry, ny, 1e-5 * ckk, 1e-5);
  for (size_t i = 0; i < nx; i++)
    rx[i] = gx[i];
  for (size_t i = 0; i < nw; i++)
    rw[i] = gw[i];
  for (int i = 0; i < d->OC; i++)
    rb[i] = gb[i];
  TT_CHECK_OK(loom_conv2d_backward(gx, gw, gb, col, dy, x, w, d));
  conv_backward_ref(rx, rw, rb, dy, x, w, d);
  for (size_t i = 0; i < nx; i++)
    fx[i] = (float)rx[i];
  for (size_t i = 0; i < nw; i++)
    fw[i] = (float)rw[i];
  for (int i = 0; i < d->OC; i++)
    fb[i] = (float)rb[i];
  const double per = (double)ny / d->OC; /* terms summed per weight */
  bad |= !TT_CHECK_CLOSE(gx, fx, nx, 1e-5 * d->OC * d->KH * d->KW, 1e-5);
  bad |= !TT_CHECK_CLOSE(gw, fw, nw, 1e-5 * per, 1e-5);
  bad |= !TT_CHECK_CLOSE(gb, fb, d->OC, 1e-5 * per, 1e-5);
  /* any gradient may be NULL; the others come out the same */
  float *gx2 = kt_zeros(nx), *gw2 = kt_zeros(nw);
  TT_CHECK_OK(loom_conv2d_backward(gx2, NULL, NULL, col, dy, x, w, d));
  TT_CHECK_OK(loom_conv2d_backward(NULL, gw2, NULL, col, dy, x, w, d));
  float *gx3 = kt_zeros(nx), *gw3 = kt_zeros(nw), *gb3 = kt_zeros(d->OC);
  TT_CHECK_OK(loom_conv2d_backward(gx3, gw3, gb3, col, dy, x, w, d));
  KT_CHECK_SAME_BITS(gx2, gx3, nx);
  KT_CHECK_SAME_BITS(gw2, gw3, nw);
  if (bad)
    fprintf(stderr,
            "    N=%d C=%d H=%d W=%d OC=%d K=%dx%d stride=%d pad=%d "
            "backend %s\n",
            d->N, d->C, d->H, d->W, d->OC, d->KH, d->KW, d->stride, d->pad,
            loom_gemm_backend_name(loom_gemm_get_backend()));
  float *bufs[] = {x,  w,  b,  y,  ry,  col, dy,  gx,  gw,
                   gb, fx, fw, fb, gx2, gw2, gx3, gw3, gb3};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    loom_free(bufs[i]);
  free(rx);
  free(rw);
  free(rb);
}

TT_TEST(conv_matches_reference) {
  for (int be = 0; be < LOOM_GEMM_BACKEND_COUNT; be++) {
    if (loom_gemm_set_backend((loom_gemm_backend)be) != LOOM_OK)
      continue; /* oneDNN not built in */
    for (int s = 0; s < NSHAPES; s++) {
      loom_conv2d_dims d = dims_of(shapes[s]);
      check_shape(&d, 600 + s);
    }
  }
}

TT_TEST(conv_output_sizes) {
  loom_conv2d_dims d = {1, 1, 28, 28, 32, 5, 5, 1, 0};
  TT_CHECK_EQ(loom_conv2d_out_h(&d), 24);
  d.stride = 2;
  d.pad = 2;
  TT_CHECK_EQ(loom_conv2d_out_w(&d), 14);
  d.W = 27;
  TT_CHECK_EQ(loom_conv2d_out_w(&d), 14);
}

TT_TEST(conv_rejects_bad_dims) {
  float buf[64] = {0};
  const loom_conv2d_dims bad[] = {
      {0, 1, 4, 4, 1, 3, 3, 1, 0}, {1, 1, 4, 4, 1, 3, 3, 0, 0},
      {1, 1, 2, 2, 1, 5, 5, 1, 0}, {1, 1, 4, 4, 1, 3, 3, 1, -1},
      {1, 1, 4, 4, 0, 3, 3, 1, 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    TT_CHECK_EQ(loom_conv2d_col_floats(&bad[i]), 0);
    TT_CHECK_EQ(loom_conv2d_forward(buf, buf, buf, buf, NULL, &bad[i]),
                LOOM_ERR_INVALID_ARG);
    TT_CHECK_EQ(
        loom_conv2d_backward(buf, buf, NULL, buf, buf, buf, buf, &bad[i]),
        LOOM_ERR_INVALID_ARG);
  }
  TT_CHECK_EQ(loom_conv2d_forward(buf, buf, buf, buf, NULL, NULL),
              LOOM_ERR_INVALID_ARG);
}

int main(void) {
  TT_RUN(conv_output_sizes);
  TT_RUN(conv_rejects_bad_dims);
  TT_RUN(conv_matches_reference);
  return tt_finish();
}
