/* Gradient compression's conversions between f32 and the 16-bit wire type,
 * shared by DDP (ddp.c) and the pipeline's dp sum (pipe.c). */
#include <string.h>

#include "internal.h"

/* Round to nearest even, NaN kept (as loom_f32_to_bf16), inline so the loop
 * vectorises: a bucket is converted on the compute thread at launch. */
static void to_bf16(uint16_t *dst, const float *src, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    float v = src[i] * scale; /* x 1 keeps every bit, NaN's too */
    memcpy(&u, &v, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
  }
}

static void from_bf16(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, 4);
  }
}

void loom_wire_pack(void *out, const float *in, int64_t n, loom_dtype dt,
                    float scale) {
  if (dt == LOOM_BF16) {
    to_bf16(out, in, n, scale);
  } else {
    uint16_t *h = out;
    for (int64_t i = 0; i < n; i++)
      h[i] = loom_f32_to_f16(in[i] * scale);
  }
}

void loom_wire_unpack(float *out, const void *in, int64_t n, loom_dtype dt) {
  if (dt == LOOM_BF16) {
    from_bf16(out, in, n);
  } else {
    const uint16_t *h = in;
    for (int64_t i = 0; i < n; i++)
      out[i] = loom_f16_to_f32(h[i]);
  }
}
