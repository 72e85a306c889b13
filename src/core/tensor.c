/* Tensors: shaped, typed views into buffers. */
#include "loom/core.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* a * b for sizes >= 0; false when it does not fit int64_t. */
static bool mul_size(int64_t a, int64_t b, int64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}

/* Strides of a shape too large to address are meaningless; they saturate
 * at INT64_MAX instead of wrapping (loom_tensor_new refuses the shape). */
static void set_contiguous_strides(loom_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->stride[i] = s;
    if (!mul_size(s, t->shape[i] < 0 ? 0 : t->shape[i], &s))
      s = INT64_MAX;
  }
}

loom_tensor loom_tensor_view(void *data, loom_dtype dtype, int ndim,
                             const int64_t *shape) {
  loom_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim =
      ndim < 0 || !shape ? 0 : (ndim > LOOM_MAX_DIMS ? LOOM_MAX_DIMS : ndim);
  for (int i = 0; i < t.ndim; i++)
    t.shape[i] = shape[i];
  set_contiguous_strides(&t);
  return t;
}

static loom_status check_shape(loom_dtype dtype, int ndim,
                               const int64_t *shape) {
  if ((unsigned)dtype >= LOOM_DTYPE_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "tensor: invalid dtype %d",
                      (int)dtype);
  if (ndim < 0 || ndim > LOOM_MAX_DIMS)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor: %d dimensions (at most %d)", ndim,
                      LOOM_MAX_DIMS);
  if (ndim > 0 && !shape)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor: NULL shape of %d "
                      "dimensions",
                      ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "tensor: negative size %lld in dimension %d",
                        (long long)shape[i], i);
  loom_tensor t = loom_tensor_view(NULL, dtype, ndim, shape);
  if (loom_tensor_bytes(&t) == SIZE_MAX) {
    char dims[LOOM_MAX_DIMS * 22 + 2] = "";
    size_t at = 0;
    for (int i = 0; i < ndim; i++)
      at += (size_t)snprintf(dims + at, sizeof dims - at, "%s%lld",
                             i ? ", " : "", (long long)shape[i]);
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor: shape (%s) of %s too large (its size "
                      "overflows)",
                      dims, loom_dtype_name(dtype));
  }
  return LOOM_OK;
}

loom_status loom_tensor_new(loom_tensor *t, loom_dtype dtype, int ndim,
                            const int64_t *shape) {
  if (!t)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_tensor_new: NULL tensor");
  LOOM_TRY(check_shape(dtype, ndim, shape));
  *t = loom_tensor_view(NULL, dtype, ndim, shape);
  size_t bytes = loom_tensor_bytes(t);
  t->data = loom_calloc(1, bytes);
  if (!t->data)
    return LOOM_ERR_NOMEM;
  t->owns = true;
  return LOOM_OK;
}

void loom_tensor_free(loom_tensor *t) {
  if (!t)
    return;
  if (t->owns)
    loom_free(t->data);
  t->data = NULL;
  t->owns = false;
}

int64_t loom_tensor_numel(const loom_tensor *t) {
  if (!t)
    return 0;
  /* a zero dimension makes the product 0 whatever the others are */
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] == 0)
      return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0 || !mul_size(n, t->shape[i], &n))
      return -1;
  return n;
}

size_t loom_tensor_bytes(const loom_tensor *t) {
  if (!t)
    return 0;
  int64_t n = loom_tensor_numel(t), bytes;
  if (n < 0 || !mul_size(n, (int64_t)loom_dtype_size(t->dtype), &bytes) ||
      (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
    return SIZE_MAX;
  return (size_t)bytes;
}

bool loom_tensor_is_contiguous(const loom_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s)
      return false;
    s *= t->shape[i];
  }
  return true;
}

loom_status loom_tensor_reshape(const loom_tensor *t, int ndim,
                                const int64_t *shape, loom_tensor *out) {
  if (!t || !out)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_tensor_reshape: NULL argument");
  LOOM_TRY(check_shape(t->dtype, ndim, shape));
  if (!loom_tensor_is_contiguous(t))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor reshape: the tensor is not contiguous");
  loom_tensor r = loom_tensor_view(t->data, t->dtype, ndim, shape);
  if (loom_tensor_numel(&r) != loom_tensor_numel(t))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor reshape: %lld elements cannot take a shape of "
                      "%lld",
                      (long long)loom_tensor_numel(t),
                      (long long)loom_tensor_numel(&r));
  *out = r;
  return LOOM_OK;
}

loom_status loom_tensor_slice0(const loom_tensor *t, int64_t start,
                               int64_t count, loom_tensor *out) {
  /* count > shape[0] - start, not start + count > shape[0]: the sum can
   * overflow. */
  if (t->ndim < 1 || start < 0 || count < 0 || start > t->shape[0] ||
      count > t->shape[0] - start)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor slice: %lld rows from row %lld out of range "
                      "(%lld rows)",
                      (long long)count, (long long)start,
                      t->ndim < 1 ? 0LL : (long long)t->shape[0]);
  loom_tensor r = *t;
  r.owns = false;
  r.shape[0] = count;
  r.data = (char *)t->data +
           (size_t)(start * t->stride[0]) * loom_dtype_size(t->dtype);
  *out = r;
  return LOOM_OK;
}
