/* Causal multi-head self-attention, forward and backward. Each (b, h) pair
 * is one task for one thread: its score matrix is built block by block of
 * query rows with serial GEMMs that skip the keys a block cannot see (the
 * causal mask), so about 3/4 of the full T x T work is done for T = 2 RB.
 * Tasks write disjoint outputs, so threading never changes a result.
 * (A hand-written 4x16 AVX2 micro-kernel that visits only the causal half
 * measured no faster forward and 25% slower backward than these packed
 * GEMMs at the GPT shape, so it is not here.) */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

/* Query rows per block: block r sees keys [0, (r+1) RB). Smaller blocks skip
 * more masked work but make smaller, less efficient GEMMs. */
#define ATT_RB 64

static loom_status att_check(const char *what, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "attention %s: bad shape B=%d T=%d C=%d NH=%d (C must "
                      "be a multiple of NH)",
                      what, B, T, C, NH);
  return LOOM_OK;
}

/* Keys [0, L) of row t are worked on whole: L = t+1 rounded up to 16
 * (at most T), so the vector loops have no scalar tails (most rows are
 * short). Callers have computed scores for all of [0, L). */
static int row_span(int t, int T) {
  const int L = (t + 16) / 16 * 16;
  return L < T ? L : T;
}

/* Row t of the scores: softmax over keys [0, t], zeros after. The masked
 * keys in (t, L) are set to -inf first: exp makes them exactly 0. */
static void causal_softmax_row(float *row, int t, int T) {
  const int L = row_span(t, T);
  for (int j = t + 1; j < L; j++)
    row[j] = -INFINITY;
  const float m = loom_kern_max(row, L);
  for (int j = 0; j < L; j++)
    row[j] = loom_kern_expf(row[j] - m);
  const float inv = 1.0f / loom_kern_sum(row, L);
  for (int j = 0; j < L; j++)
    row[j] *= inv;
  if (L < T)
    memset(row + L, 0, (size_t)(T - L) * sizeof(float));
}

/* Row t of dS = P * (dP - sum(P * dP)), from dP in d; P is 0 past t, so
 * the span [0, L) needs no mask; zeros after L. */
static void softmax_grad_row(float *d, const float *pr, int t, int T) {
  const int L = row_span(t, T);
  const float dot = loom_kern_dot(pr, d, L);
  for (int j = 0; j < L; j++)
    d[j] = pr[j] * (d[j] - dot);
  if (L < T)
    memset(d + L, 0, (size_t)(T - L) * sizeof(float));
}

/* ------------------------------------------------------------ kernels */

/* Floating-point operations of a causal attention over B sequences of T
 * tokens of width C (all heads): QK^T and PV, each 2 T^2/2 C, forward; the
 * backward's four products twice that. */
static double att_flops(int B, int T, int C, bool backward) {
  return (backward ? 4.0 : 2.0) * B * (double)T * T * C;
}

loom_status LOOM_ISA(loom_attention_forward)(float *out, float *att,
                                             const float *qkv, int B, int T,
                                             int C, int NH) {
  LOOM_TRY(att_check("forward", B, T, C, NH));
  if (B == 0 || T == 0)
    return LOOM_OK;
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)HS);
  const int tasks = B * NH;
  const int nt = loom_kern_nthreads_flops(tasks, att_flops(B, T, C, false));
  loom_kern_gemm_serial_begin();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int bh = 0; bh < tasks; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float *q =
        qkv + (int64_t)b * T * C3 + h * HS; /* (T, HS), stride 3C */
    const float *k = q + C, *v = q + 2 * C;
    float *a = att + (int64_t)bh * T * T;         /* (T, T) */
    float *o = out + (int64_t)b * T * C + h * HS; /* (T, HS), stride C */
    for (int r0 = 0; r0 < T; r0 += ATT_RB) {
      const int rows = T - r0 < ATT_RB ? T - r0 : ATT_RB, kend = r0 + rows;
      loom_kern_gemm_serial(false, true, rows, kend, HS, scale,
                            q + (int64_t)r0 * C3, C3, k, C3, 0.0f,
                            a + (int64_t)r0 * T, T);
      for (int t = r0; t < kend; t++)
        causal_softmax_row(a + (int64_t)t * T, t, T);
      loom_kern_gemm_serial(false, false, rows, HS, kend, 1.0f,
                            a + (int64_t)r0 * T, T, v, C3, 0.0f,
                            o + (int64_t)r0 * C, C);
    }
  }
  return LOOM_OK;
}

/* With S = scale Q K^T, P = softmax(S) (causal), O = P V:
 *   dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
 *   dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. */
loom_status LOOM_ISA(loom_attention_backward)(float *dqkv, float *scratch,
                                              const float *dout,
                                              const float *qkv,
                                              const float *att, int B, int T,
                                              int C, int NH) {
  LOOM_TRY(att_check("backward", B, T, C, NH));
  if (B == 0 || T == 0)
    return LOOM_OK;
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)HS);
  const int tasks = B * NH;
  const int nt = loom_kern_nthreads_flops(tasks, att_flops(B, T, C, true));
  loom_kern_gemm_serial_begin();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int bh = 0; bh < tasks; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t tok = (int64_t)b * T;
    const float *q = qkv + tok * C3 + h * HS, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + tok * C3 + h * HS, *dk = dq + C, *dv = dq + 2 * C;
    const float *dO = dout + tok * C + h * HS;  /* (T, HS), stride C */
    const float *p = att + (int64_t)bh * T * T; /* (T, T) */
    float *ds = scratch + (int64_t)bh * T * T;  /* (T, T) */
    for (int r0 = 0; r0 < T; r0 += ATT_RB) {
      const int rows = T - r0 < ATT_RB ? T - r0 : ATT_RB, kend = r0 + rows;
      float *dsb = ds + (int64_t)r0 * T;
      const float *pb = p + (int64_t)r0 * T;
      loom_kern_gemm_serial(false, true, rows, kend, HS, 1.0f,
                            dO + (int64_t)r0 * C, C, v, C3, 0.0f, dsb, T);
      for (int t = r0; t < kend; t++) /* masked keys: zero, for the GEMMs */
        softmax_grad_row(ds + (int64_t)t * T, p + (int64_t)t * T, t, T);
      loom_kern_gemm_serial(false, false, rows, HS, kend, scale, dsb, T, k, C3,
                            1.0f, dq + (int64_t)r0 * C3, C3);
      loom_kern_gemm_serial(true, false, kend, HS, rows, scale, dsb, T,
                            q + (int64_t)r0 * C3, C3, 1.0f, dk, C3);
      loom_kern_gemm_serial(true, false, kend, HS, rows, 1.0f, pb, T,
                            dO + (int64_t)r0 * C, C, 1.0f, dv, C3);
    }
  }
  return LOOM_OK;
}

/* ------------------------------------------------------------ half */

/* In a half model (bf16, f16) the attention's matmuls take half operands
 * with f32 sums, as under PyTorch's autocast: Q, K, V and dO rounded to the
 * half type, the probabilities P saved in it (half the activation memory)
 * and dS rounded to it; softmax and its gradient in f32. On the type's
 * unit (loom_half_on_unit: oneDNN's matmul, one primitive per block shape,
 * built for and run on one thread) the operands are half values; elsewhere
 * (a CPU or build without the unit, LOOM_BF16_PATH / LOOM_F16_PATH
 * convert) they are the rounded values in f32 and the f32 GEMMs run: the
 * same products, summed in another order. Each (b, h) task
 * runs on one thread over the f32 kernel's row blocks, so the bits do not
 * depend on the thread count. */

/* Query rows per block on the unit. Blocks skip the masked keys but make
 * smaller matmuls, and each matmul call costs a few microseconds besides
 * its arithmetic; 128 rows measured faster than 64 on AMX at the GPT's
 * T 128 and within noise of 64 on AVX512-BF16 (docs/precision.md). */
#define ATT_RB_HALF 128

static int half_rb(int T) {
  (void)T;
  /* LOOM_ATTENTION_RB (a multiple of 16, for measuring): a row's span
   * (row_span) must not pass its block's last key */
  const char *e = getenv("LOOM_ATTENTION_RB");
  int rb = 0;
  if (e && !loom_parse_int(e, &rb))
    rb = 0; /* not a number: the default */
  return rb > 0 ? (rb + 15) / 16 * 16 : ATT_RB_HALF;
}

/* Threads at most, each with its own (T,T) work space (a slot): the
 * scratch does not grow with the batch. A task overwrites what it reads
 * of its slot, so which slot runs it does not change a bit. */
#define ATT_SLOTS 16

static int half_slots(int B, int NH) {
  const int64_t tasks = (int64_t)B * NH;
  return tasks < ATT_SLOTS ? (int)tasks : ATT_SLOTS;
}

int64_t LOOM_ISA(loom_attention_half_scratch_floats)(int B, int T, int C,
                                                     int NH) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0)
    return 0;
  const int64_t BTC = (int64_t)B * T * C;
  /* qkv and dO (f32 at most); per slot: S or dS (f32), P (f32, or dS in
   * half), a widened row of P */
  return 4 * BTC + half_slots(B, NH) * (2 * (int64_t)T * T + T);
}

typedef struct half_att {
  loom_dtype dt;
  bool unit;
  size_t es; /* operand element bytes: 2 on the unit, 4 converting */
  int B, T, C, NH, HS, rb;
  bool backward; /* set up for the backward pass (its flops: twice) */
  float scale;
} half_att;

static void *at(const void *p, int64_t i, size_t es) {
  return (char *)p + i * (int64_t)es;
}

/* C(f32) = alpha op(A) op(B) + beta C on the calling thread; 0 or -1. */
static int half_mm(const half_att *h, bool ta, bool tb, int M, int N, int K,
                   float alpha, const void *A, int lda, const void *B, int ldb,
                   float beta, float *C, int ldc) {
  if (h->unit)
    return loom_kern_half_matmul_serial(h->dt, ta, tb, M, N, K, alpha, A, lda,
                                        B, ldb, beta, C, ldc);
  loom_kern_gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  return 0;
}

/* Every block shape the unit will run has a fast primitive (built here,
 * before the parallel loop). */
static bool half_unit_ok(const half_att *h, bool backward) {
  const int T = h->T, HS = h->HS, C = h->C, C3 = 3 * h->C;
  const float sc = h->scale;
  for (int r0 = 0; r0 < T; r0 += h->rb) {
    const int rows = T - r0 < h->rb ? T - r0 : h->rb, kend = r0 + rows;
    bool ok;
    if (!backward)
      ok = loom_kern_half_matmul_serial_ok(h->dt, false, true, rows, kend, HS,
                                           sc, C3, C3, 0.0f, T) &&
           loom_kern_half_matmul_serial_ok(h->dt, false, false, rows, HS, kend,
                                           1.0f, T, C3, 0.0f, C);
    else
      ok = loom_kern_half_matmul_serial_ok(h->dt, false, true, rows, kend, HS,
                                           1.0f, C, C3, 0.0f, T) &&
           loom_kern_half_matmul_serial_ok(h->dt, false, false, rows, HS, kend,
                                           sc, T, C3, 1.0f, C3) &&
           loom_kern_half_matmul_serial_ok(h->dt, true, false, kend, HS, rows,
                                           sc, T, C3, 1.0f, C3) &&
           loom_kern_half_matmul_serial_ok(h->dt, true, false, kend, HS, rows,
                                           1.0f, T, C, 1.0f, C3);
    if (!ok)
      return false;
  }
  return true;
}

static loom_status half_setup(half_att *h, loom_dtype dt, int B, int T, int C,
                              int NH, bool backward) {
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "half attention: %s is not a half type (bf16 or f16)",
                      loom_dtype_name(dt));
  h->dt = dt;
  h->B = B, h->T = T, h->C = C, h->NH = NH, h->HS = C / NH;
  h->backward = backward;
  h->scale = 1.0f / sqrtf((float)h->HS);
  h->rb = half_rb(T);
  h->unit = loom_half_on_unit(dt);
  if (h->unit && !half_unit_ok(h, backward))
    h->unit = false;
  h->es = h->unit ? sizeof(uint16_t) : sizeof(float);
  return LOOM_OK;
}

/* The operands' buffer ops: qkv(B,T,3C) then dout(B,T,C), half (unit) or
 * rounded f32. qkv is rounded from the f32 qkv, or taken from qkvh, the
 * forward's half copy (unit: used in place, *q set to it; converting:
 * widened, which gives the rounded values exactly); with keep (forward)
 * the half copy is written into it. One parallel pass each (elementwise:
 * the bits do not depend on the threads). The matmuls read the heads in
 * place, strided. */
static void operands(const half_att *h, void *ops, const void **q,
                     const float *qkv, const uint16_t *qkvh, uint16_t *keep,
                     const float *dout) {
  const int64_t BTC = (int64_t)h->B * h->T * h->C;
  void *d = at(ops, 3 * BTC, h->es);
  *q = ops;
  if (h->unit) {
    if (qkvh) {
      *q = qkvh;
    } else {
      void *dst = keep ? (void *)keep : ops;
      (void)LOOM_ISA(loom_cvt_f32_to_half)(h->dt, dst, qkv, 3 * BTC);
      *q = dst;
    }
    if (dout)
      (void)LOOM_ISA(loom_cvt_f32_to_half)(h->dt, d, dout, BTC);
  } else {
    if (qkvh)
      (void)LOOM_ISA(loom_cvt_half_to_f32)(h->dt, ops, qkvh, 3 * BTC);
    else
      (void)LOOM_ISA(loom_round_half)(h->dt, ops, qkv, 3 * BTC);
    if (keep)
      (void)LOOM_ISA(loom_cvt_f32_to_half)(h->dt, keep, qkv, 3 * BTC);
    if (dout)
      (void)LOOM_ISA(loom_round_half)(h->dt, d, dout, BTC);
  }
}

/* Runs body for every (b, h) task bh on one thread, which owns scratch
 * slot `slot`; oneDNN and the vendor GEMM held to the calling thread. rc:
 * the last nonzero matmul code. */
/* clang-format off */
#define HALF_TASKS(h, rc, ...)                                                 \
  do {                                                                         \
    const int ht_tasks = (h)->B * (h)->NH;                                     \
    const int ht_nt1 = loom_kern_nthreads_flops(                               \
        ht_tasks, att_flops((h)->B, (h)->T, (h)->C, (h)->backward));           \
    const int ht_nt = ht_nt1 < ATT_SLOTS ? ht_nt1 : ATT_SLOTS;                 \
    int ht_save = 0;                                                           \
    if (ht_nt == 1 && !omp_in_parallel() &&                                    \
        (ht_save = omp_get_max_threads()) > 1)                                 \
      omp_set_num_threads(1);                                                  \
    loom_kern_gemm_serial_begin();                                             \
    _Pragma("omp parallel num_threads(ht_nt) if (ht_nt > 1)")                  \
    {                                                                          \
      const int slot = omp_get_thread_num();                                   \
      _Pragma("omp for schedule(static)")                                      \
      for (int bh = 0; bh < ht_tasks; bh++) {                                  \
        int task_rc = 0;                                                       \
        __VA_ARGS__;                                                           \
        if (task_rc) {                                                         \
          _Pragma("omp atomic write")                                          \
          rc = task_rc;                                                        \
        }                                                                      \
      }                                                                        \
    }                                                                          \
    if (ht_save > 1)                                                           \
      omp_set_num_threads(ht_save);                                            \
  } while (0)
/* clang-format on */

loom_status LOOM_ISA(loom_attention_forward_half)(
    loom_dtype dt, float *out, uint16_t *outh, uint16_t *att, const float *qkv,
    uint16_t *qkvh, int B, int T, int C, int NH, float *scratch) {
  LOOM_TRY(att_check("forward", B, T, C, NH));
  if (B == 0 || T == 0)
    return LOOM_OK;
  half_att h;
  LOOM_TRY(half_setup(&h, dt, B, T, C, NH, false));
  const int HS = h.HS, C3 = 3 * C;
  const int64_t BTC = (int64_t)B * T * C, TT = (int64_t)T * T;
  void *ops = scratch;          /* (B,T,3C) qkv, half or rounded */
  float *S = scratch + 4 * BTC; /* (slots,T,T) scores, then P */
  const void *qs;
  operands(&h, ops, &qs, qkv, NULL, qkvh, NULL);
  int rc = 0;
  HALF_TASKS(&h, rc, {
    const int b = bh / NH, hd = bh % NH;
    const void *q = at(qs, (int64_t)b * T * C3 + hd * HS, h.es);
    const void *k = at(q, C, h.es), *v = at(q, 2 * C, h.es);
    float *s = S + slot * TT;
    uint16_t *p = att + bh * TT;
    float *o = out + (int64_t)b * T * C + hd * HS; /* (T, HS), stride C */
    for (int r0 = 0; r0 < T && !task_rc; r0 += h.rb) {
      const int rows = T - r0 < h.rb ? T - r0 : h.rb, kend = r0 + rows;
      float *sb = s + (int64_t)r0 * T;
      task_rc = half_mm(&h, false, true, rows, kend, HS, h.scale,
                        at(q, (int64_t)r0 * C3, h.es), C3, k, C3, 0.0f, sb, T);
      /* P saved in half: keys [0, kend) of a row, the rest never read */
      for (int t = r0; t < kend; t++) {
        float *st = s + (int64_t)t * T;
        causal_softmax_row(st, t, T);
        LOOM_ISA(loom_kern_narrow)(dt, p + (int64_t)t * T, st, kend);
        if (!h.unit) /* P rounded, in f32, for the f32 GEMM */
          LOOM_ISA(loom_kern_round)(dt, st, st, kend);
      }
      const void *pb = h.unit ? (const void *)(p + (int64_t)r0 * T) : sb;
      task_rc |= half_mm(&h, false, false, rows, HS, kend, 1.0f, pb, T, v, C3,
                         0.0f, o + (int64_t)r0 * C, C);
      if (outh) /* the block's rows rounded while they are in cache */
        for (int t = r0; t < kend; t++) {
          const int64_t oi = ((int64_t)b * T + t) * C + hd * HS;
          LOOM_ISA(loom_kern_narrow)(dt, outh + oi, out + oi, HS);
        }
    }
  });
  if (rc)
    return loom_error(LOOM_ERR_INTERNAL,
                      "attention forward: oneDNN matmul failed (%d)", rc);
  return LOOM_OK;
}

loom_status LOOM_ISA(loom_attention_backward_half)(
    loom_dtype dt, float *dqkv, const float *dout, const float *qkv,
    const uint16_t *qkvh, const uint16_t *att, int B, int T, int C, int NH,
    float *scratch) {
  LOOM_TRY(att_check("backward", B, T, C, NH));
  if (B == 0 || T == 0)
    return LOOM_OK;
  half_att h;
  LOOM_TRY(half_setup(&h, dt, B, T, C, NH, true));
  const int HS = h.HS, C3 = 3 * C;
  const int64_t BTC = (int64_t)B * T * C, TT = (int64_t)T * T;
  const int64_t SL = half_slots(B, NH);
  void *ops = scratch;          /* (B,T,3C) qkv, (B,T,C) dout: half/rounded */
  float *S = scratch + 4 * BTC; /* (slots,T,T) dP, then dS */
  float *R = S + SL * TT;       /* (slots,T,T) P in f32, or dS in half */
  float *PR = R + SL * TT;      /* (slots,T) a row of P */
  const void *qs;
  operands(&h, ops, &qs, qkv, qkvh, NULL, dout);
  int rc = 0;
  HALF_TASKS(&h, rc, {
    const int b = bh / NH, hd = bh % NH;
    const void *q = at(qs, (int64_t)b * T * C3 + hd * HS, h.es);
    const void *k = at(q, C, h.es), *v = at(q, 2 * C, h.es);
    const void *dO = at(ops, 3 * BTC + (int64_t)b * T * C + hd * HS, h.es);
    float *dq = dqkv + (int64_t)b * T * C3 + hd * HS, *dk = dq + C,
          *dv = dq + 2 * C;
    const uint16_t *p = att + bh * TT;
    float *ds = S + slot * TT, *r = R + slot * TT, *prow = PR + slot * T;
    uint16_t *d16 = (uint16_t *)(void *)r; /* (T,T) dS in half (unit) */
    for (int r0 = 0; r0 < T && !task_rc; r0 += h.rb) {
      const int rows = T - r0 < h.rb ? T - r0 : h.rb, kend = r0 + rows;
      float *dsb = ds + (int64_t)r0 * T;
      task_rc = half_mm(&h, false, true, rows, kend, HS, 1.0f,
                        at(dO, (int64_t)r0 * C, h.es), C, v, C3, 0.0f, dsb, T);
      for (int t = r0; t < kend; t++) {
        /* P's row t in f32: the span the softmax gradient reads (unit), or
         * keys [0, kend), the f32 GEMM's operand (converting) */
        float *pr = h.unit ? prow : r + (int64_t)t * T;
        LOOM_ISA(loom_kern_widen)
        (dt, pr, p + (int64_t)t * T, h.unit ? row_span(t, T) : kend);
        float *dt_row = ds + (int64_t)t * T;
        softmax_grad_row(dt_row, pr, t, T);
        if (h.unit)
          LOOM_ISA(loom_kern_narrow)(dt, d16 + (int64_t)t * T, dt_row, kend);
        else
          LOOM_ISA(loom_kern_round)(dt, dt_row, dt_row, kend);
      }
      const void *dS = h.unit ? (const void *)(d16 + (int64_t)r0 * T) : dsb;
      const void *pb = h.unit ? (const void *)(p + (int64_t)r0 * T)
                              : (const void *)(r + (int64_t)r0 * T);
      task_rc |= half_mm(&h, false, false, rows, HS, kend, h.scale, dS, T, k,
                         C3, 1.0f, dq + (int64_t)r0 * C3, C3);
      task_rc |= half_mm(&h, true, false, kend, HS, rows, h.scale, dS, T,
                         at(q, (int64_t)r0 * C3, h.es), C3, 1.0f, dk, C3);
      task_rc |= half_mm(&h, true, false, kend, HS, rows, 1.0f, pb, T,
                         at(dO, (int64_t)r0 * C, h.es), C, 1.0f, dv, C3);
    }
  });
  if (rc)
    return loom_error(LOOM_ERR_INTERNAL,
                      "attention backward: oneDNN matmul failed (%d)", rc);
  return LOOM_OK;
}
