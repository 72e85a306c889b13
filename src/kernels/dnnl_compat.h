/* The parts of oneDNN's C API that changed between 2.x (Debian's 2.6.3, the
 * default build) and 3.x (PyPI's onednn-cpu-gomp 3.2, LOOM_DNNL_ROOT; the
 * one with AVX512-FP16 kernels): memory descriptors are structs in 2.x
 * and handles to be destroyed in 3.x; operation descriptors are gone in
 * 3.x (primitive descriptors are made in one call); output scales and the
 * sum post-op changed. matmul_dnnl.c and conv_dnnl.c write each call once
 * through these. */
#ifndef LOOM_KERNELS_DNNL_COMPAT_H
#define LOOM_KERNELS_DNNL_COMPAT_H

#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stddef.h>

#if DNNL_VERSION_MAJOR >= 3

/* What a call takes for a descriptor held in a variable v: MD(v). */
typedef const_dnnl_memory_desc_t loom_md_ref;
#define MD(v) (v)
#define MD_NONE NULL /* a descriptor not made yet */

static inline bool md_tag(dnnl_memory_desc_t *m, int nd, const dnnl_dims_t d,
                          dnnl_data_type_t t, dnnl_format_tag_t tag) {
  return dnnl_memory_desc_create_with_tag(m, nd, d, t, tag) == dnnl_success;
}

static inline bool md_strides(dnnl_memory_desc_t *m, int nd,
                              const dnnl_dims_t d, dnnl_data_type_t t,
                              const dnnl_dims_t strides) {
  return dnnl_memory_desc_create_with_strides(m, nd, d, t, strides) ==
         dnnl_success;
}

/* *m = a copy of src (NULL src: false). */
static inline bool md_copy(dnnl_memory_desc_t *m, loom_md_ref src) {
  return src && dnnl_memory_desc_clone(m, src) == dnnl_success;
}

static inline void md_free(dnnl_memory_desc_t *m) {
  if (*m)
    dnnl_memory_desc_destroy(*m);
  *m = NULL;
}

static inline dnnl_status_t pd_matmul(dnnl_primitive_desc_t *pd,
                                      dnnl_engine_t eng, loom_md_ref a,
                                      loom_md_ref b, loom_md_ref bias,
                                      loom_md_ref c,
                                      const_dnnl_primitive_attr_t attr) {
  return dnnl_matmul_primitive_desc_create(pd, eng, a, b, bias, c, attr);
}

static inline dnnl_status_t
pd_conv_fwd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, loom_md_ref src,
            loom_md_ref wei, loom_md_ref bias, loom_md_ref dst,
            const dnnl_dims_t strides, const dnnl_dims_t pad,
            const_dnnl_primitive_attr_t attr) {
  const dnnl_dims_t none = {0, 0};
  return dnnl_convolution_forward_primitive_desc_create(
      pd, eng, dnnl_forward_training, dnnl_convolution_direct, src, wei, bias,
      dst, strides, none, pad, pad, attr);
}

static inline dnnl_status_t
pd_conv_bwd_data(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, loom_md_ref dsrc,
                 loom_md_ref wei, loom_md_ref ddst, const dnnl_dims_t strides,
                 const dnnl_dims_t pad, const_dnnl_primitive_desc_t hint,
                 const_dnnl_primitive_attr_t attr) {
  const dnnl_dims_t none = {0, 0};
  return dnnl_convolution_backward_data_primitive_desc_create(
      pd, eng, dnnl_convolution_direct, dsrc, wei, ddst, strides, none, pad,
      pad, hint, attr);
}

static inline dnnl_status_t
pd_conv_bwd_weights(dnnl_primitive_desc_t *pd, dnnl_engine_t eng,
                    loom_md_ref src, loom_md_ref dwei, loom_md_ref ddst,
                    const dnnl_dims_t strides, const dnnl_dims_t pad,
                    const_dnnl_primitive_desc_t hint,
                    const_dnnl_primitive_attr_t attr) {
  const dnnl_dims_t none = {0, 0};
  return dnnl_convolution_backward_weights_primitive_desc_create(
      pd, eng, dnnl_convolution_direct, src, dwei, NULL, ddst, strides, none,
      pad, pad, hint, attr);
}

/* C = alpha (the product) + beta C. 3.x has no output scales for
 * floating-point types, and its gemm-based matmul (what strided operands
 * get) takes a sum post-op only first in the chain; so the sum scaled by
 * beta / alpha, then a linear eltwise by alpha: alpha (AB + (beta / alpha)
 * C), which rounds beta / alpha once (a relative 2^-24 on C's term). */
static inline bool alpha_beta(dnnl_primitive_attr_t attr, dnnl_post_ops_t po,
                              float alpha, float beta) {
  (void)attr;
  if (alpha == 0.0f)
    return false;
  if (beta != 0.0f &&
      dnnl_post_ops_append_sum(po, alpha == 1.0f ? beta : beta / alpha, 0,
                               dnnl_data_type_undef) != dnnl_success)
    return false;
  return alpha == 1.0f ||
         dnnl_post_ops_append_eltwise(po, dnnl_eltwise_linear, alpha, 0.0f) ==
             dnnl_success;
}

#else /* oneDNN 2.x */

typedef const dnnl_memory_desc_t *loom_md_ref;
#define MD(v) (&(v))
#define MD_NONE                                                                \
  { 0 }

static inline bool md_tag(dnnl_memory_desc_t *m, int nd, const dnnl_dims_t d,
                          dnnl_data_type_t t, dnnl_format_tag_t tag) {
  return dnnl_memory_desc_init_by_tag(m, nd, d, t, tag) == dnnl_success;
}

static inline bool md_strides(dnnl_memory_desc_t *m, int nd,
                              const dnnl_dims_t d, dnnl_data_type_t t,
                              const dnnl_dims_t strides) {
  return dnnl_memory_desc_init_by_strides(m, nd, d, t, strides) == dnnl_success;
}

static inline bool md_copy(dnnl_memory_desc_t *m, loom_md_ref src) {
  if (!src)
    return false;
  *m = *src;
  return true;
}

static inline void md_free(dnnl_memory_desc_t *m) { (void)m; }

static inline dnnl_status_t pd_matmul(dnnl_primitive_desc_t *pd,
                                      dnnl_engine_t eng, loom_md_ref a,
                                      loom_md_ref b, loom_md_ref bias,
                                      loom_md_ref c,
                                      const_dnnl_primitive_attr_t attr) {
  dnnl_matmul_desc_t d;
  dnnl_status_t st = dnnl_matmul_desc_init(&d, a, b, bias, c);
  return st != dnnl_success
             ? st
             : dnnl_primitive_desc_create(pd, &d, attr, eng, NULL);
}

static inline dnnl_status_t
pd_conv_fwd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, loom_md_ref src,
            loom_md_ref wei, loom_md_ref bias, loom_md_ref dst,
            const dnnl_dims_t strides, const dnnl_dims_t pad,
            const_dnnl_primitive_attr_t attr) {
  dnnl_convolution_desc_t cd;
  dnnl_status_t st = dnnl_convolution_forward_desc_init(
      &cd, dnnl_forward_training, dnnl_convolution_direct, src, wei, bias, dst,
      strides, pad, pad);
  return st != dnnl_success
             ? st
             : dnnl_primitive_desc_create(pd, &cd, attr, eng, NULL);
}

static inline dnnl_status_t
pd_conv_bwd_data(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, loom_md_ref dsrc,
                 loom_md_ref wei, loom_md_ref ddst, const dnnl_dims_t strides,
                 const dnnl_dims_t pad, const_dnnl_primitive_desc_t hint,
                 const_dnnl_primitive_attr_t attr) {
  dnnl_convolution_desc_t cd;
  dnnl_status_t st = dnnl_convolution_backward_data_desc_init(
      &cd, dnnl_convolution_direct, dsrc, wei, ddst, strides, pad, pad);
  return st != dnnl_success
             ? st
             : dnnl_primitive_desc_create(pd, &cd, attr, eng, hint);
}

static inline dnnl_status_t
pd_conv_bwd_weights(dnnl_primitive_desc_t *pd, dnnl_engine_t eng,
                    loom_md_ref src, loom_md_ref dwei, loom_md_ref ddst,
                    const dnnl_dims_t strides, const dnnl_dims_t pad,
                    const_dnnl_primitive_desc_t hint,
                    const_dnnl_primitive_attr_t attr) {
  dnnl_convolution_desc_t cd;
  dnnl_status_t st = dnnl_convolution_backward_weights_desc_init(
      &cd, dnnl_convolution_direct, src, dwei, NULL, ddst, strides, pad, pad);
  return st != dnnl_success
             ? st
             : dnnl_primitive_desc_create(pd, &cd, attr, eng, hint);
}

/* 2.x: output scales, then the sum post-op (what the library always did):
 * C = alpha AB + beta C. */
static inline bool alpha_beta(dnnl_primitive_attr_t attr, dnnl_post_ops_t po,
                              float alpha, float beta) {
  if (alpha != 1.0f &&
      dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) != dnnl_success)
    return false;
  return beta == 0.0f || dnnl_post_ops_append_sum(po, beta) == dnnl_success;
}

#endif

#endif
