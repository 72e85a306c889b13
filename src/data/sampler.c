/* The distributed sampler: one shuffled order per epoch, keyed by (seed,
 * epoch), cut into global batches whose contiguous slices go to the ranks. */
#include "internal.h"

#include <string.h>

const char *const loom_tail_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_TAIL_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof loom_tail_names / sizeof loom_tail_names[0] ==
                   LOOM_TAIL_COUNT,
               "tail name table");

const char *loom_tail_name(loom_tail t) {
  return (unsigned)t < LOOM_TAIL_COUNT ? loom_tail_names[t] : "?";
}

loom_status loom_tail_parse(const char *s, loom_tail *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_tail_parse: NULL out");
  int i = 0;
  LOOM_TRY(
      loom_name_parse(s, loom_tail_names, LOOM_TAIL_COUNT, "tail rule", &i));
  if (out)
    *out = (loom_tail)i;
  return LOOM_OK;
}

struct loom_sampler {
  loom_sampler_opts o;
  int64_t n;     /* N */
  int64_t gb;    /* GB = batch * world */
  int64_t nb;    /* global batches per epoch */
  int64_t limit; /* entries of the epoch list L actually used */
  int64_t epoch;
  int64_t *perm; /* (N) order of the current epoch */
};

loom_sampler_opts loom_sampler_opts_default(void) {
  loom_sampler_opts o = {0, true, LOOM_TAIL_DROP, 1, 0, 1};
  return o;
}

loom_status loom_sampler_new(loom_sampler **out, int64_t n,
                             const loom_sampler_opts *opts) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_sampler_new: NULL out");
  *out = NULL;
  loom_sampler_opts o = opts ? *opts : loom_sampler_opts_default();
  if (n < 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      n == 0 ? "sampler: the data set is empty"
                             : "sampler: a negative number of samples (%lld)",
                      (long long)n);
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sampler: rank %d out of range for world size %d", o.rank,
                      o.world);
  if (o.batch < 1 || o.batch > ((int64_t)1 << 40) / o.world)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sampler: batch size %lld out of range",
                      (long long)o.batch);
  if ((unsigned)o.tail >= LOOM_TAIL_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "sampler: invalid tail rule %d",
                      (int)o.tail);
  int64_t gb = o.batch * o.world;
  int64_t nb = o.tail == LOOM_TAIL_DROP ? n / gb : (n + gb - 1) / gb;
  if (nb == 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sampler: %lld samples do not fill one global batch of "
                      "%lld (batch %lld x %d ranks) with tail 'drop'; use "
                      "'pad' or 'partial'",
                      (long long)n, (long long)gb, (long long)o.batch, o.world);
  loom_sampler *s = loom_calloc(1, sizeof *s);
  if (!s)
    return LOOM_ERR_NOMEM;
  s->perm = loom_malloc((size_t)n * sizeof *s->perm);
  if (!s->perm) {
    loom_free(s);
    return LOOM_ERR_NOMEM;
  }
  loom_mem_add(LOOM_MEM_DATA, (size_t)n * sizeof *s->perm);
  s->o = o;
  s->n = n;
  s->gb = gb;
  s->nb = nb;
  s->limit = o.tail == LOOM_TAIL_PARTIAL ? n : nb * gb;
  s->epoch = -1;
  loom_sampler_set_epoch(s, 0);
  *out = s;
  return LOOM_OK;
}

void loom_sampler_free(loom_sampler *s) {
  if (!s)
    return;
  loom_mem_sub(LOOM_MEM_DATA, (size_t)s->n * sizeof *s->perm);
  loom_free(s->perm);
  loom_free(s);
}

/* The stream of loom_rng (value i = word i%4 of Philox block i/4), with
 * each block computed once instead of once per word. */
typedef struct draws {
  uint32_t key[2], ctr[4], block[4];
  uint64_t i;
} draws;

static uint32_t draw_u32(draws *d) {
  if ((d->i & 3) == 0) {
    uint64_t blk = d->i >> 2;
    d->ctr[0] = (uint32_t)blk;
    d->ctr[1] = (uint32_t)(blk >> 32);
    loom_philox4x32(d->ctr, d->key, d->block);
  }
  return d->block[d->i++ & 3];
}

/* Uniform in [0, n) without modulo bias: 32-bit draws while n fits, else
 * 64-bit ones, rejecting the top partial range. */
static uint64_t draw_below(draws *d, uint64_t n) {
  if (n <= UINT32_MAX) {
    uint32_t limit = UINT32_MAX - (uint32_t)(((uint64_t)UINT32_MAX + 1) % n);
    for (;;) {
      uint32_t x = draw_u32(d);
      if (x <= limit)
        return x % n;
    }
  }
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t x = ((uint64_t)draw_u32(d) << 32) | draw_u32(d);
    if (x < limit)
      return x % n;
  }
}

loom_status loom_sampler_set_epoch(loom_sampler *s, int64_t epoch) {
  if (!s)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_sampler_set_epoch: NULL sampler");
  if (epoch < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "sampler: bad epoch %lld",
                      (long long)epoch);
  if (epoch == s->epoch)
    return LOOM_OK;
  for (int64_t i = 0; i < s->n; i++)
    s->perm[i] = i;
  if (s->o.shuffle) {
    /* Fisher-Yates; the draws depend on (seed, epoch) only, so every rank
     * and every world size computes the same order. */
    uint64_t stream =
        loom_rng_stream_id(LOOM_DATA_RNG_SHUFFLE, (uint64_t)epoch, 0);
    draws d = {{(uint32_t)s->o.seed, (uint32_t)(s->o.seed >> 32)},
               {0, 0, (uint32_t)stream, (uint32_t)(stream >> 32)},
               {0, 0, 0, 0},
               0};
    for (int64_t i = s->n - 1; i > 0; i--) {
      int64_t j = (int64_t)draw_below(&d, (uint64_t)i + 1);
      int64_t t = s->perm[i];
      s->perm[i] = s->perm[j];
      s->perm[j] = t;
    }
  }
  s->epoch = epoch;
  return LOOM_OK;
}

int64_t loom_sampler_epoch(const loom_sampler *s) { return s->epoch; }

int64_t loom_sampler_num_batches(const loom_sampler *s) { return s->nb; }

/* Entries [lo, hi) of the epoch list L, clipped to `limit` (what the tail
 * rule uses); padding repeats the order from its start. */
static int64_t copy_range(const loom_sampler *s, int64_t lo, int64_t hi,
                          int64_t limit, int64_t *idx) {
  if (hi > limit)
    hi = limit;
  int64_t k = 0;
  for (int64_t i = lo; i < hi; i++)
    idx[k++] = s->perm[i < s->n ? i : (i - s->n) % s->n];
  return k;
}

loom_status loom_sampler_batch(const loom_sampler *s, int64_t b, int64_t *idx,
                               int64_t *count) {
  if (!s || !idx || !count || b < 0 || b >= s->nb)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sampler: batch %lld out of range [0, %lld)",
                      (long long)b, s ? (long long)s->nb : 0LL);
  int64_t lo = b * s->gb + (int64_t)s->o.rank * s->o.batch;
  *count =
      lo < s->limit ? copy_range(s, lo, lo + s->o.batch, s->limit, idx) : 0;
  return LOOM_OK;
}

int64_t loom_sampler_batches_from(const loom_sampler *s, int64_t start) {
  int64_t left = s->n - start;
  if (left <= 0)
    return 0;
  return s->o.tail == LOOM_TAIL_DROP ? left / s->gb
                                     : (left + s->gb - 1) / s->gb;
}

loom_status loom_sampler_batch_from(const loom_sampler *s, int64_t start,
                                    int64_t b, int64_t *idx, int64_t *count) {
  int64_t nb = loom_sampler_batches_from(s, start);
  if (b < 0 || b >= nb)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sampler: batch %lld out of range [0, %lld) of an "
                      "epoch entered at sample %lld",
                      (long long)b, (long long)nb, (long long)start);
  int64_t limit = s->o.tail == LOOM_TAIL_PARTIAL ? s->n : start + nb * s->gb;
  int64_t lo = start + b * s->gb + (int64_t)s->o.rank * s->o.batch;
  *count = lo < limit ? copy_range(s, lo, lo + s->o.batch, limit, idx) : 0;
  return LOOM_OK;
}

loom_status loom_sampler_global_batch(const loom_sampler *s, int64_t b,
                                      int64_t *idx, int64_t *count) {
  if (!s || !idx || !count || b < 0 || b >= s->nb)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "sampler: batch %lld out of range [0, %lld)",
                      (long long)b, s ? (long long)s->nb : 0LL);
  *count = copy_range(s, b * s->gb, (b + 1) * s->gb, s->limit, idx);
  return LOOM_OK;
}
