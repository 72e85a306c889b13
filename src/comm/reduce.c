/* Reduction kernels of the comm layer: k inputs combined in a fixed order,
 * bf16 and f16 accumulated in f32 and rounded once. */
#include "internal.h"

#include <string.h>

/* Elements per block: the accumulator lives on the stack (in L1), so the
 * output may alias any input and bf16/f16 are rounded only once. */
#define RBLK 512

static const char *const redop_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_REDOP_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof redop_names / sizeof redop_names[0] == LOOM_REDOP_COUNT,
               "redop name table");

const char *loom_redop_name(loom_redop op) {
  return (unsigned)op < LOOM_REDOP_COUNT ? redop_names[op] : "?";
}

loom_status loom_redop_parse(const char *name, loom_redop *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_redop_parse: NULL out");
  int i = 0;
  LOOM_TRY(
      loom_name_parse(name, redop_names, LOOM_REDOP_COUNT, "reduction", &i));
  if (out)
    *out = (loom_redop)i;
  return LOOM_OK;
}

static inline float bf16_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Same rounding as loom_f32_to_bf16 (nearest even, NaN stays NaN), inline
 * so the loops vectorise. */
static inline uint16_t f32_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t q = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* acc = op(acc, x) over m elements; T is the accumulator type. */
#define COMBINE(T, acc, x, m, op)                                              \
  do {                                                                         \
    switch (op) {                                                              \
    case LOOM_SUM:                                                             \
    case LOOM_AVG:                                                             \
      for (size_t i_ = 0; i_ < (m); i_++)                                      \
        (acc)[i_] = (T)((acc)[i_] + (x)[i_]);                                  \
      break;                                                                   \
    case LOOM_PROD:                                                            \
      for (size_t i_ = 0; i_ < (m); i_++)                                      \
        (acc)[i_] = (T)((acc)[i_] * (x)[i_]);                                  \
      break;                                                                   \
    case LOOM_MAX:                                                             \
      for (size_t i_ = 0; i_ < (m); i_++)                                      \
        (acc)[i_] = (x)[i_] > (acc)[i_] ? (T)(x)[i_] : (acc)[i_];              \
      break;                                                                   \
    case LOOM_MIN:                                                             \
      for (size_t i_ = 0; i_ < (m); i_++)                                      \
        (acc)[i_] = (x)[i_] < (acc)[i_] ? (T)(x)[i_] : (acc)[i_];              \
      break;                                                                   \
    default:                                                                   \
      break;                                                                   \
    }                                                                          \
  } while (0)

/* Floating point types reduced in their own precision. */
#define DEFINE_FLOAT(NAME, T)                                                  \
  static void NAME(T *out, const void *const *in, int k, size_t n,             \
                   loom_redop op, int div) {                                   \
    T acc[RBLK];                                                               \
    for (size_t b = 0; b < n; b += RBLK) {                                     \
      size_t m = n - b < RBLK ? n - b : RBLK;                                  \
      memcpy(acc, (const T *)in[0] + b, m * sizeof(T));                        \
      for (int j = 1; j < k; j++) {                                            \
        const T *x = (const T *)in[j] + b;                                     \
        COMBINE(T, acc, x, m, op);                                             \
      }                                                                        \
      if (div > 1)                                                             \
        for (size_t i = 0; i < m; i++)                                         \
          acc[i] = acc[i] / (T)div;                                            \
      memcpy(out + b, acc, m * sizeof(T));                                     \
    }                                                                          \
  }
DEFINE_FLOAT(red_f32, float)
DEFINE_FLOAT(red_f64, double)

/* Integers: sums and products wrap (computed unsigned, as MPI does in
 * practice); the average sums in 64 bits and truncates toward zero. */
#define DEFINE_INT(NAME, T, U)                                                 \
  static void NAME(T *out, const void *const *in, int k, size_t n,             \
                   loom_redop op, int div) {                                   \
    if (op == LOOM_AVG) {                                                      \
      int64_t acc[RBLK];                                                       \
      for (size_t b = 0; b < n; b += RBLK) {                                   \
        size_t m = n - b < RBLK ? n - b : RBLK;                                \
        for (size_t i = 0; i < m; i++)                                         \
          acc[i] = 0;                                                          \
        for (int j = 0; j < k; j++) {                                          \
          const T *x = (const T *)in[j] + b;                                   \
          for (size_t i = 0; i < m; i++)                                       \
            acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)(int64_t)x[i]);    \
        }                                                                      \
        for (size_t i = 0; i < m; i++)                                         \
          out[b + i] = (T)(div > 1 ? acc[i] / div : acc[i]);                   \
      }                                                                        \
      return;                                                                  \
    }                                                                          \
    U acc[RBLK];                                                               \
    for (size_t b = 0; b < n; b += RBLK) {                                     \
      size_t m = n - b < RBLK ? n - b : RBLK;                                  \
      memcpy(acc, (const T *)in[0] + b, m * sizeof(T));                        \
      for (int j = 1; j < k; j++) {                                            \
        const T *x = (const T *)in[j] + b;                                     \
        switch (op) {                                                          \
        case LOOM_SUM:                                                         \
          for (size_t i = 0; i < m; i++)                                       \
            acc[i] = (U)(acc[i] + (U)x[i]);                                    \
          break;                                                               \
        case LOOM_PROD:                                                        \
          for (size_t i = 0; i < m; i++)                                       \
            acc[i] = (U)(acc[i] * (U)x[i]);                                    \
          break;                                                               \
        case LOOM_MAX:                                                         \
          for (size_t i = 0; i < m; i++)                                       \
            acc[i] = x[i] > (T)acc[i] ? (U)x[i] : acc[i];                      \
          break;                                                               \
        case LOOM_MIN:                                                         \
          for (size_t i = 0; i < m; i++)                                       \
            acc[i] = x[i] < (T)acc[i] ? (U)x[i] : acc[i];                      \
          break;                                                               \
        default:                                                               \
          break;                                                               \
        }                                                                      \
      }                                                                        \
      memcpy(out + b, acc, m * sizeof(T));                                     \
    }                                                                          \
  }
DEFINE_INT(red_i32, int32_t, uint32_t)
DEFINE_INT(red_i64, int64_t, uint64_t)
DEFINE_INT(red_u8, uint8_t, uint8_t)

/* bf16 / f16: widen each input block to f32, combine in f32 in rank order,
 * round once. */
static void red_half(uint16_t *out, const void *const *in, int k, size_t n,
                     loom_redop op, int div, bool bf16) {
  float acc[RBLK], x[RBLK];
  for (size_t b = 0; b < n; b += RBLK) {
    size_t m = n - b < RBLK ? n - b : RBLK;
    for (int j = 0; j < k; j++) {
      const uint16_t *h = (const uint16_t *)in[j] + b;
      float *dst = j == 0 ? acc : x;
      if (bf16)
        for (size_t i = 0; i < m; i++)
          dst[i] = bf16_f32(h[i]);
      else
        for (size_t i = 0; i < m; i++)
          dst[i] = loom_f16_to_f32(h[i]);
      if (j > 0)
        COMBINE(float, acc, x, m, op);
    }
    if (div > 1)
      for (size_t i = 0; i < m; i++)
        acc[i] = acc[i] / (float)div;
    if (bf16)
      for (size_t i = 0; i < m; i++)
        out[b + i] = f32_bf16(acc[i]);
    else
      for (size_t i = 0; i < m; i++)
        out[b + i] = loom_f32_to_f16(acc[i]);
  }
}

void loom_comm_reduce(void *out, const void *const *in, int k, size_t n,
                      loom_dtype dt, loom_redop op, int div) {
  if (k <= 0 || n == 0)
    return;
  if (op != LOOM_AVG)
    div = 0;
  switch (dt) {
  case LOOM_F32:
    red_f32(out, in, k, n, op, div);
    break;
  case LOOM_F64:
    red_f64(out, in, k, n, op, div);
    break;
  case LOOM_I32:
    red_i32(out, in, k, n, op, div);
    break;
  case LOOM_I64:
    red_i64(out, in, k, n, op, div);
    break;
  case LOOM_U8:
    red_u8(out, in, k, n, op, div);
    break;
  case LOOM_BF16:
    red_half(out, in, k, n, op, div, true);
    break;
  case LOOM_F16:
    red_half(out, in, k, n, op, div, false);
    break;
  default:
    break;
  }
}

void loom_comm_divide(void *buf, size_t n, loom_dtype dt, int div) {
  if (div <= 1 || n == 0)
    return;
  const void *in[1] = {buf};
  /* One input reduced with avg is a division. */
  loom_comm_reduce(buf, in, 1, n, dt, LOOM_AVG, div);
}
