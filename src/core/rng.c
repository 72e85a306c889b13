/* Philox4x32-10 counter-based random numbers (Salmon et al., SC'11). */
#include "loom/core.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void loom_philox4x32(const uint32_t ctr[4], const uint32_t key[2],
                     uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

loom_rng loom_rng_init(uint64_t seed, uint64_t stream) {
  loom_rng r = {seed, stream, 0, 0, 0, 0, {0, 0, 0, 0}};
  return r;
}

void loom_rng_seek(loom_rng *r, uint64_t counter) { r->counter = counter; }

uint32_t loom_rng_u32(loom_rng *r) {
  uint64_t block = r->counter >> 2;
  if (r->cache_key != block + 1 || r->cache_seed != r->seed ||
      r->cache_stream != r->stream) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32),
                       (uint32_t)r->stream, (uint32_t)(r->stream >> 32)};
    uint32_t key[2] = {(uint32_t)r->seed, (uint32_t)(r->seed >> 32)};
    loom_philox4x32(ctr, key, r->cache);
    r->cache_key = block + 1;
    r->cache_seed = r->seed;
    r->cache_stream = r->stream;
  }
  uint32_t v = r->cache[r->counter & 3];
  r->counter++;
  return v;
}

float loom_rng_uniform(loom_rng *r) {
  return (float)(loom_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
}

uint64_t loom_rng_below(loom_rng *r, uint64_t n) {
  if (n <= 1)
    return 0;
  /* Rejection sampling on 64-bit draws: no modulo bias. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t x = ((uint64_t)loom_rng_u32(r) << 32) | loom_rng_u32(r);
    if (x < limit)
      return x % n;
  }
}

float loom_rng_normal(loom_rng *r) {
  /* u1 in (0, 1] so log(u1) is finite. */
  double u1 = ((double)(loom_rng_u32(r) >> 8) + 1.0) / 16777216.0;
  double u2 = (double)(loom_rng_u32(r) >> 8) / 16777216.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Value i of a fill takes the draws at counter + per * i (per: 1 uniform,
 * 2 normal), whoever computes it: threads take chunks of FILL_CHUNK values,
 * each from its own copy of r seeked there, and the values are those of
 * the draws made one by one (a model's initial weights: 85M normals took
 * 4.1 s of libm's log and cos on one core of an AMD EPYC). */
#define FILL_CHUNK 65536

static void fill(loom_rng *r, float *out, size_t n, float a, float b, int per) {
  const uint64_t c0 = r->counter;
  const int64_t chunks = (int64_t)((n + FILL_CHUNK - 1) / FILL_CHUNK);
  int nt = chunks > 1 ? loom_threads() : 1;
  nt = nt > chunks ? (int)chunks : nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t c = 0; c < chunks; c++) {
    loom_rng x = *r;
    const size_t i0 = (size_t)c * FILL_CHUNK;
    const size_t i1 = i0 + FILL_CHUNK < n ? i0 + FILL_CHUNK : n;
    x.counter = c0 + (uint64_t)per * i0;
    if (per == 1)
      for (size_t i = i0; i < i1; i++)
        out[i] = a + (b - a) * loom_rng_uniform(&x);
    else
      for (size_t i = i0; i < i1; i++)
        out[i] = a + b * loom_rng_normal(&x);
  }
  r->counter = c0 + (uint64_t)per * n;
}

void loom_rng_fill_uniform(loom_rng *r, float *out, size_t n, float lo,
                           float hi) {
  fill(r, out, n, lo, hi, 1);
}

void loom_rng_fill_normal(loom_rng *r, float *out, size_t n, float mean,
                          float std) {
  fill(r, out, n, mean, std, 2);
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t loom_rng_stream_id(uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}
