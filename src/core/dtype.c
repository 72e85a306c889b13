/* Data types: sizes, names and bf16/f16 conversions. */
#include "loom/core.h"

#include <math.h>
#include <string.h>

static const struct {
  const char *name;
  size_t size;
} dtype_table[] = {
#define LOOM_X_ROW(name, text, size) {text, size},
    LOOM_DTYPE_LIST(LOOM_X_ROW)
#undef LOOM_X_ROW
};
_Static_assert(sizeof dtype_table / sizeof dtype_table[0] == LOOM_DTYPE_COUNT,
               "dtype table size");

size_t loom_dtype_size(loom_dtype dt) {
  return (unsigned)dt < LOOM_DTYPE_COUNT ? dtype_table[dt].size : 0;
}

const char *loom_dtype_name(loom_dtype dt) {
  return (unsigned)dt < LOOM_DTYPE_COUNT ? dtype_table[dt].name : "?";
}

loom_status loom_dtype_parse(const char *name, loom_dtype *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_dtype_parse: NULL out");
  for (int i = 0; i < LOOM_DTYPE_COUNT; i++)
    if (name && strcmp(name, dtype_table[i].name) == 0) {
      *out = (loom_dtype)i;
      return LOOM_OK;
    }
  return loom_error(LOOM_ERR_INVALID_ARG,
                    "unknown dtype '%s' (expected f32, bf16, f16, f64, i32, "
                    "i64 or u8)",
                    name ? name : "(null)");
}

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

loom_bf16 loom_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
    return (loom_bf16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (loom_bf16)(u >> 16);
}

float loom_bf16_to_f32(loom_bf16 x) { return bits_f32((uint32_t)x << 16); }

loom_f16 loom_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) /* NaN: quiet, top payload bits kept (F16C's) */
    return (loom_f16)(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
  if (absu >= 0x477ff000u) /* rounds to >= 65520: infinity */
    return (loom_f16)(sign | 0x7c00u);
  if (absu < 0x38800000u) { /* below 2^-14: subnormal or zero */
    /* Scale into the subnormal range; float addition rounds to even. */
    float f = bits_f32(absu) + 0.5f; /* 0.5 = 2^-1: ulp becomes 2^-24 */
    return (loom_f16)(sign | (f32_bits(f) - 0x3f000000u));
  }
  uint32_t mant_odd = (absu >> 13) & 1u;
  absu += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23), round */
  return (loom_f16)(sign | (absu >> 13));
}

float loom_f16_to_f32(loom_f16 h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t mant = (uint32_t)h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
    float f = (float)mant * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (exp == 31) /* infinity, or a NaN made quiet (F16C's) */
    return bits_f32(sign | 0x7f800000u | (mant << 13) |
                    (mant ? 0x00400000u : 0u));
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}
