/* 2-D convolution: dispatch (oneDNN's primitives, conv_dnnl.c, when the
 * GEMM backend is dnnl and C >= 4; 1.5-1.7x faster on the CNN's second
 * layer),
 * the im2col + GEMM engine used otherwise, its backward, and the direct
 * reference. Images are processed in chunks of nb whose im2col matrix
 * (CKK, nb*P) makes one GEMM wide enough to run fast; chunks are grouped in
 * a fixed number of slots (each with its own scratch and weight-gradient
 * partial), threads take whole slots, and the partials are added in slot
 * order: the result depends on the shape only, never on the thread count.
 *
 * Letters: CKK = C*KH*KW (rows of the im2col matrix), P = OH*OW (output
 * pixels of one image). */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

/* Columns one chunk's GEMM should reach (nb = ceil(CONV_COLS / P)). */
#define CONV_COLS 256

typedef struct conv_plan {
  int OH, OW, P, CKK;
  int nb;                                    /* images per chunk */
  int nchunks;                               /* ceil(N / nb) */
  int slots;                                 /* min(LOOM_CONV_SLOTS, nchunks) */
  int64_t col_floats, tmp_floats, dw_floats; /* per slot */
} conv_plan;

int LOOM_ISA(loom_conv2d_out_h)(const loom_conv2d_dims *d) {
  if (d->stride < 1)
    return 0;
  return (d->H + 2 * d->pad - d->KH) / d->stride + 1;
}

int LOOM_ISA(loom_conv2d_out_w)(const loom_conv2d_dims *d) {
  if (d->stride < 1)
    return 0;
  return (d->W + 2 * d->pad - d->KW) / d->stride + 1;
}

static bool dims_ok(const loom_conv2d_dims *d) {
  return d->N > 0 && d->C > 0 && d->H > 0 && d->W > 0 && d->OC > 0 &&
         d->KH > 0 && d->KW > 0 && d->stride > 0 && d->pad >= 0 &&
         d->H + 2 * d->pad >= d->KH && d->W + 2 * d->pad >= d->KW;
}

static void conv_plan_make(const loom_conv2d_dims *d, conv_plan *p) {
  p->OH = loom_conv2d_out_h(d);
  p->OW = loom_conv2d_out_w(d);
  p->P = p->OH * p->OW;
  p->CKK = d->C * d->KH * d->KW;
  p->nb = (CONV_COLS + p->P - 1) / p->P;
  if (p->nb > d->N)
    p->nb = d->N;
  p->nchunks = (d->N + p->nb - 1) / p->nb;
  p->slots = p->nchunks < LOOM_CONV_SLOTS ? p->nchunks : LOOM_CONV_SLOTS;
  const int64_t cols = (int64_t)p->nb * p->P;
  p->col_floats = (int64_t)p->CKK * cols;
  p->tmp_floats = p->nb > 1 ? (int64_t)d->OC * cols : 0;
  p->dw_floats = (int64_t)d->OC * p->CKK;
}

static loom_status conv_check(const char *what, const loom_conv2d_dims *d) {
  if (d && dims_ok(d))
    return LOOM_OK;
  /* The error as a constant, not loom_error's result: the analyzer does not
   * see into error.c, and would go on to plan bad dims (a division by
   * P = 0). */
  loom_error(LOOM_ERR_INVALID_ARG,
             "conv2d %s: bad dims (N=%d C=%d H=%d W=%d OC=%d K=%dx%d "
             "stride=%d pad=%d)",
             what, d ? d->N : 0, d ? d->C : 0, d ? d->H : 0, d ? d->W : 0,
             d ? d->OC : 0, d ? d->KH : 0, d ? d->KW : 0, d ? d->stride : 0,
             d ? d->pad : 0);
  return LOOM_ERR_INVALID_ARG;
}

/* col rows (c, kh, kw), columns [off, off + P) with row stride ld: the
 * input pixels each output pixel of image x(C, H, W) sees; 0 in padding. */
static void im2col(float *col, int64_t ld, int64_t off, const float *x,
                   const loom_conv2d_dims *d, int OH, int OW) {
  const int H = d->H, W = d->W, S = d->stride, pad = d->pad;
  for (int c = 0; c < d->C; c++)
    for (int kh = 0; kh < d->KH; kh++)
      for (int kw = 0; kw < d->KW; kw++) {
        const int64_t row = ((int64_t)c * d->KH + kh) * d->KW + kw;
        float *dst = col + row * ld + off;
        /* valid ow: 0 <= ow*S - pad + kw < W */
        int lo = pad - kw > 0 ? (pad - kw + S - 1) / S : 0;
        int hi = (W - 1 + pad - kw) >= 0 ? (W - 1 + pad - kw) / S + 1 : 0;
        lo = lo > OW ? OW : lo;
        hi = hi > OW ? OW : (hi < lo ? lo : hi);
        for (int oh = 0; oh < OH; oh++) {
          float *o = dst + (int64_t)oh * OW;
          const int ih = oh * S - pad + kh;
          if (ih < 0 || ih >= H) {
            memset(o, 0, (size_t)OW * sizeof(float));
            continue;
          }
          const float *xr = x + ((int64_t)c * H + ih) * W;
          for (int ow = 0; ow < lo; ow++)
            o[ow] = 0.0f;
          if (S == 1 && hi > lo)
            memcpy(o + lo, xr + lo - pad + kw,
                   (size_t)(hi - lo) * sizeof(float));
          else
            for (int ow = lo; ow < hi; ow++)
              o[ow] = xr[ow * S - pad + kw];
          for (int ow = hi; ow < OW; ow++)
            o[ow] = 0.0f;
        }
      }
}

/* The adjoint of im2col: dx(C, H, W) += what each column entry saw. */
static void col2im_add(float *dx, const float *col, int64_t ld, int64_t off,
                       const loom_conv2d_dims *d, int OH, int OW) {
  const int H = d->H, W = d->W, S = d->stride, pad = d->pad;
  for (int c = 0; c < d->C; c++)
    for (int kh = 0; kh < d->KH; kh++)
      for (int kw = 0; kw < d->KW; kw++) {
        const int64_t row = ((int64_t)c * d->KH + kh) * d->KW + kw;
        const float *src = col + row * ld + off;
        int lo = pad - kw > 0 ? (pad - kw + S - 1) / S : 0;
        int hi = (W - 1 + pad - kw) >= 0 ? (W - 1 + pad - kw) / S + 1 : 0;
        lo = lo > OW ? OW : lo;
        hi = hi > OW ? OW : (hi < lo ? lo : hi);
        for (int oh = 0; oh < OH; oh++) {
          const int ih = oh * S - pad + kh;
          if (ih < 0 || ih >= H)
            continue;
          float *xr = dx + ((int64_t)c * H + ih) * W;
          const float *s = src + (int64_t)oh * OW;
          for (int ow = lo; ow < hi; ow++)
            xr[ow * S - pad + kw] += s[ow];
        }
      }
}

/* Which engine runs a convolution: LOOM_CONV=im2col|dnnl overrides, else
 * oneDNN's primitives when the GEMM backend is dnnl. */
typedef enum { CONV_AUTO, CONV_IM2COL, CONV_DNNL } conv_engine;

static conv_engine engine_env(void) {
  static atomic_int e = -1;
  int v = atomic_load(&e);
  if (v < 0) {
    const char *s = getenv("LOOM_CONV");
    v = CONV_AUTO;
    if (s && strcmp(s, "im2col") == 0)
      v = CONV_IM2COL;
    else if (s && strcmp(s, "dnnl") == 0)
      v = CONV_DNNL;
    else if (s && *s && strcmp(s, "auto") != 0)
      LOOM_WARN("LOOM_CONV=%s: expected auto, im2col or dnnl; using auto", s);
    atomic_store(&e, v);
  }
  return (conv_engine)v;
}

/* oneDNN's direct kernels want channels to block: with C >= 4 they beat
 * im2col (1.7x forward, 1.5x backward on the CNN's 32-channel layer, one
 * thread); with C = 1 im2col + dnnl_sgemm is ~10% faster, at C = 3 they
 * tie. */
#define CONV_DNNL_MIN_C 4

static bool may_use_dnnl(const loom_conv2d_dims *d) {
  const conv_engine e = engine_env();
  return e == CONV_DNNL || (e == CONV_AUTO && d->C >= CONV_DNNL_MIN_C);
}

static bool use_dnnl(const loom_conv2d_dims *d) {
  return may_use_dnnl(d) && (engine_env() == CONV_DNNL ||
                             loom_gemm_get_backend() == LOOM_GEMM_DNNL);
}

bool LOOM_ISA(loom_kern_conv_use_dnnl)(const loom_conv2d_dims *d) {
  return d && dims_ok(d) && use_dnnl(d);
}

/* Enough for either engine that may run these dims: the GEMM backend (which
 * picks the engine) may change between sizing and use. */
int64_t LOOM_ISA(loom_conv2d_col_floats)(const loom_conv2d_dims *d) {
  if (!d || !dims_ok(d))
    return 0;
  conv_plan p;
  conv_plan_make(d, &p);
  const int64_t im2col =
      (int64_t)p.slots * (p.col_floats + p.tmp_floats + p.dw_floats);
  const int64_t dnnl = may_use_dnnl(d) ? loom_kern_conv_dnnl_floats(d) : 0;
  return im2col > dnnl ? im2col : dnnl;
}

int64_t LOOM_ISA(loom_conv2d_col_floats_used)(const loom_conv2d_dims *d) {
  if (!d || !dims_ok(d))
    return 0;
  if (use_dnnl(d))
    return loom_kern_conv_dnnl_floats(d);
  conv_plan p;
  conv_plan_make(d, &p);
  return (int64_t)p.slots * (p.col_floats + p.tmp_floats + p.dw_floats);
}

/* Slot s owns chunks [first, last): a split of the chunks that depends on
 * nchunks and slots only. */
static void slot_chunks(const conv_plan *p, int s, int *first, int *last) {
  *first = (int)((int64_t)s * p->nchunks / p->slots);
  *last = (int)((int64_t)(s + 1) * p->nchunks / p->slots);
}

loom_status LOOM_ISA(loom_conv2d_forward)(float *out, float *col,
                                          const float *inp, const float *weight,
                                          const float *bias,
                                          const loom_conv2d_dims *d) {
  LOOM_TRY(conv_check("forward", d));
  if (use_dnnl(d)) {
    loom_status st =
        loom_kern_conv_dnnl_forward(out, col, inp, weight, bias, d);
    if (st != LOOM_ERR_UNSUPPORTED)
      return st;
  }
  conv_plan p;
  conv_plan_make(d, &p);
  const int OC = d->OC, P = p.P, CKK = p.CKK;
  const int64_t ld = (int64_t)p.nb * P;
  const int64_t per_slot = p.col_floats + p.tmp_floats + p.dw_floats;
  const int64_t in_img = (int64_t)d->C * d->H * d->W, out_img = (int64_t)OC * P;
  const int nt = loom_kern_nthreads_flops(p.slots, loom_kern_conv_flops(d, 1));
  loom_kern_gemm_serial_begin();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int s = 0; s < p.slots; s++) {
    float *scol = col + s * per_slot, *tmp = scol + p.col_floats;
    int c0, c1;
    slot_chunks(&p, s, &c0, &c1);
    for (int ch = c0; ch < c1; ch++) {
      const int n0 = ch * p.nb, n1 = n0 + p.nb < d->N ? n0 + p.nb : d->N;
      const int cols = (n1 - n0) * P;
      for (int n = n0; n < n1; n++)
        im2col(scol, ld, (int64_t)(n - n0) * P, inp + n * in_img, d, p.OH,
               p.OW);
      if (p.nb == 1) { /* one image: the GEMM writes out(OC, P) in place */
        float *o = out + n0 * out_img;
        if (bias)
          for (int oc = 0; oc < OC; oc++)
            for (int i = 0; i < P; i++)
              o[(int64_t)oc * P + i] = bias[oc];
        loom_kern_gemm_serial(false, false, OC, P, CKK, 1.0f, weight, CKK, scol,
                              (int)ld, bias ? 1.0f : 0.0f, o, P);
        continue;
      }
      loom_kern_gemm_serial(false, false, OC, cols, CKK, 1.0f, weight, CKK,
                            scol, (int)ld, 0.0f, tmp, (int)ld);
      for (int n = n0; n < n1; n++)
        for (int oc = 0; oc < OC; oc++) {
          float *o = out + n * out_img + (int64_t)oc * P;
          const float *t = tmp + (int64_t)oc * ld + (int64_t)(n - n0) * P;
          const float b = bias ? bias[oc] : 0.0f;
          for (int i = 0; i < P; i++)
            o[i] = t[i] + b;
        }
    }
  }
  return LOOM_OK;
}

/* dbias[oc] += sum over images (in order) of the sum over its pixels. */
static void conv_bias_grad(float *dbias, const float *dout,
                           const loom_conv2d_dims *d, int P) {
  const int nt =
      loom_kern_nthreads((int64_t)d->N * d->OC * P, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int oc = 0; oc < d->OC; oc++) {
    float s = 0.0f;
    for (int n = 0; n < d->N; n++)
      s += loom_kern_sum(dout + ((int64_t)n * d->OC + oc) * P, P);
    dbias[oc] += s;
  }
}

loom_status LOOM_ISA(loom_conv2d_backward)(float *dinp, float *dweight,
                                           float *dbias, float *col,
                                           const float *dout, const float *inp,
                                           const float *weight,
                                           const loom_conv2d_dims *d) {
  LOOM_TRY(conv_check("backward", d));
  conv_plan p;
  conv_plan_make(d, &p);
  const int OC = d->OC, P = p.P, CKK = p.CKK;
  const int64_t ld = (int64_t)p.nb * P;
  const int64_t per_slot = p.col_floats + p.tmp_floats + p.dw_floats;
  const int64_t in_img = (int64_t)d->C * d->H * d->W, out_img = (int64_t)OC * P;
  if (dbias)
    conv_bias_grad(dbias, dout, d, P);
  if (!dinp && !dweight)
    return LOOM_OK;
  if (use_dnnl(d)) {
    loom_status st =
        loom_kern_conv_dnnl_backward(dinp, dweight, col, dout, inp, weight, d);
    if (st != LOOM_ERR_UNSUPPORTED)
      return st;
  }
  const int nt = loom_kern_nthreads_flops(
      p.slots, loom_kern_conv_flops(d, (dinp != NULL) + (dweight != NULL)));
  loom_kern_gemm_serial_begin();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int s = 0; s < p.slots; s++) {
    float *scol = col + s * per_slot, *tmp = scol + p.col_floats;
    float *dw = tmp + p.tmp_floats; /* (OC, CKK) partial of this slot */
    int c0, c1;
    slot_chunks(&p, s, &c0, &c1);
    for (int ch = c0; ch < c1; ch++) {
      const int n0 = ch * p.nb, n1 = n0 + p.nb < d->N ? n0 + p.nb : d->N;
      const int cols = (n1 - n0) * P;
      /* dout of the chunk as (OC, cols) */
      const float *g = dout + n0 * out_img;
      int ldg = P;
      if (p.nb > 1) {
        for (int n = n0; n < n1; n++)
          for (int oc = 0; oc < OC; oc++)
            memcpy(tmp + (int64_t)oc * ld + (int64_t)(n - n0) * P,
                   dout + n * out_img + (int64_t)oc * P,
                   (size_t)P * sizeof(float));
        g = tmp;
        ldg = (int)ld;
      }
      if (dweight) {
        for (int n = n0; n < n1; n++)
          im2col(scol, ld, (int64_t)(n - n0) * P, inp + n * in_img, d, p.OH,
                 p.OW);
        /* dw(OC, CKK) (+)= g(OC, cols) @ col(CKK, cols)^T */
        loom_kern_gemm_serial(false, true, OC, CKK, cols, 1.0f, g, ldg, scol,
                              (int)ld, ch == c0 ? 0.0f : 1.0f, dw, CKK);
      }
      if (dinp) {
        /* dcol(CKK, cols) = weight^T @ g, then scattered back */
        loom_kern_gemm_serial(true, false, CKK, cols, OC, 1.0f, weight, CKK, g,
                              ldg, 0.0f, scol, (int)ld);
        for (int n = n0; n < n1; n++)
          col2im_add(dinp + n * in_img, scol, ld, (int64_t)(n - n0) * P, d,
                     p.OH, p.OW);
      }
    }
  }
  if (dweight) {
    const int64_t nw = (int64_t)OC * CKK;
    const int nr = loom_kern_nthreads(nw * p.slots, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nr) schedule(static) if (nr > 1)
    for (int64_t e = 0; e < nw; e++) {
      float sum = 0.0f;
      for (int s = 0; s < p.slots; s++)
        sum += col[s * per_slot + p.col_floats + p.tmp_floats + e];
      dweight[e] += sum;
    }
  }
  return LOOM_OK;
}

void LOOM_ISA(loom_conv2d_forward_ref)(float *out, const float *inp,
                                       const float *weight, const float *bias,
                                       const loom_conv2d_dims *d) {
  const int OH = loom_conv2d_out_h(d), OW = loom_conv2d_out_w(d);
  for (int n = 0; n < d->N; n++)
    for (int oc = 0; oc < d->OC; oc++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double s = bias ? bias[oc] : 0.0;
          for (int c = 0; c < d->C; c++)
            for (int kh = 0; kh < d->KH; kh++)
              for (int kw = 0; kw < d->KW; kw++) {
                const int ih = oh * d->stride - d->pad + kh;
                const int iw = ow * d->stride - d->pad + kw;
                if (ih < 0 || ih >= d->H || iw < 0 || iw >= d->W)
                  continue;
                s +=
                    (double)
                        inp[(((int64_t)n * d->C + c) * d->H + ih) * d->W + iw] *
                    weight[(((int64_t)oc * d->C + c) * d->KH + kh) * d->KW +
                           kw];
              }
          out[(((int64_t)n * d->OC + oc) * OH + oh) * OW + ow] = (float)s;
        }
}
