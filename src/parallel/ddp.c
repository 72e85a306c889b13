/* Data-parallel training: buckets of the flat gradient buffer reduced on the
 * communication thread as backward finalises them, no_sync, compression,
 * uneven inputs (join), the deterministic tree over virtual shards, and
 * sharded gradients (ZeRO-2/3: each bucket reduced to its owners only). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "loom/optim.h"
#include "loom/parallel.h"

/* One bucket: elements [begin, end) of the flat layout, reduced by one
 * persistent request (deterministic mode: one request per tree level, used
 * one after the other). */
typedef struct ddp_bucket {
  int64_t begin, end;
  int nparams;
  int remaining; /* parameters not yet final in this step's backward */
  bool launched; /* its reduction was started this step */
  bool done;     /* waited for (and converted back) this step */
  int level;     /* deterministic: tree level of the posted request */
  loom_req req;
  const void *posted_buf; /* buffer the persistent request was made for */
  void *wire;             /* its part of the compressed copy, or NULL */
  int part_first, nparts; /* sharded: its owners' parts in d->parts */
} ddp_bucket;

/* Sharded gradients: the piece [a, b) of a bucket that rank `root` owns,
 * reduced to it. */
typedef struct ddp_part {
  int root;
  int64_t a, b;
  loom_req req;
} ddp_part;

struct loom_ddp {
  loom_ddp_opts opts;
  loom_model *model;
  loom_group *group;
  int rank, world;
  int64_t n;           /* N */
  float *grads;        /* (N) the buffer the model's gradients are bound to: the
                          result; memory shared by the host's ranks when there are
                          several, so that the all-reduce reads it directly */
  void *shared;        /* grads when made by loom_group_mem_alloc */
  size_t wire_counted; /* the wire buffer's bytes in LOOM_MEM_COMM */
  void *wire;          /* (N) 16-bit copy of the gradients when compressing */
  int nbuckets;
  ddp_bucket *buckets;
  int *param_bucket; /* (nviews) bucket of each parameter */
  int next_launch;   /* buckets [0, next_launch) started this step */
  bool sync;
  bool active; /* a reducing step is under way (some bucket started) */

  /* Deterministic mode. */
  int shard_first, shard_count; /* S local shards */
  int cur_shard;
  float **shard;     /* (S) buffers (N); shard[0] == grads */
  int levels;        /* log2(P): tree levels between ranks */
  loom_group **pair; /* (levels) groups of two ranks 2^l apart */
  int *up;           /* (levels) next bucket to post at each level */

  /* Uneven inputs: number of ranks still training, summed each step. */
  loom_req ctl_req;
  int32_t ctl_send, ctl_recv;
  bool ctl_posted;

  /* loom_ddp_sum_post / _wait. */
  loom_req sum_req;
  int sum_k;
  bool sum_posted;
  double *sum_send; /* (S * k) */
  double *sum_recv; /* (V * k) or (k) */

  /* Sharded gradients (opts.shard_bounds): grads and wire are this DDP's
   * reserved memory (loom_vmem_new), this rank owns [lo, hi). */
  bool sharded;
  int64_t lo, hi;
  ddp_part *parts; /* (nparts) */
  int nparts;
  size_t *chunk_counts; /* (world) gradient chunks of each rank's slice */
  size_t grad_peak;     /* resident bytes of grads, the most seen */
  double *chunk_sums;   /* (chunks of N) */

  loom_ddp_stats stats;
  double step_reduce, step_wait;
};

loom_ddp_opts loom_ddp_opts_default(void) {
  loom_ddp_opts o = {.bucket_mb = 25,
                     .first_bucket_mb = 1,
                     .min_buckets = 8,
                     .compress = LOOM_F32,
                     .deterministic = false,
                     .virtual_shards = 8,
                     .check_config = false,
                     .config_hash = 0,
                     .broadcast = true,
                     .uneven = false};
  return o;
}

/* A NULL ddp: calls that return a status say LOOM_ERR_INVALID_ARG naming
 * themselves, getters give 0, NULL or false, the others do nothing. */
#define DDP_NEED(d, call)                                                      \
  do {                                                                         \
    if (!(d))                                                                  \
      return loom_error(LOOM_ERR_INVALID_ARG, call ": ddp is NULL");           \
  } while (0)

int loom_ddp_rank(const loom_ddp *d) { return d ? d->rank : 0; }
int loom_ddp_world(const loom_ddp *d) { return d ? d->world : 0; }
loom_model *loom_ddp_model(loom_ddp *d) { return d ? d->model : NULL; }
const loom_ddp_opts *loom_ddp_get_opts(const loom_ddp *d) {
  return d ? &d->opts : NULL;
}
int loom_ddp_num_buckets(const loom_ddp *d) { return d ? d->nbuckets : 0; }
bool loom_ddp_get_sync(const loom_ddp *d) { return d && d->sync; }

loom_status loom_ddp_bucket(const loom_ddp *d, int i, int64_t *begin,
                            int64_t *end, int *nparams) {
  DDP_NEED(d, "loom_ddp_bucket");
  if (i < 0 || i >= d->nbuckets)
    return loom_error(LOOM_ERR_INVALID_ARG, "ddp: no bucket %d (of %d)", i,
                      d->nbuckets);
  if (begin)
    *begin = d->buckets[i].begin;
  if (end)
    *end = d->buckets[i].end;
  if (nparams)
    *nparams = d->buckets[i].nparams;
  return LOOM_OK;
}

void loom_ddp_shards(const loom_ddp *d, int *first, int *count) {
  if (first)
    *first = d ? d->shard_first : 0;
  if (count)
    *count = d ? d->shard_count : 0;
}

static bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/* ------------------------------------------------------------- launching */

/* Deterministic mode: the local subtree of bucket b, over the S shard
 * buffers, into shard[0]: level h averages buffer j with buffer j + 2^h. */
static void local_tree(loom_ddp *d, const ddp_bucket *b) {
  int64_t lo = b->begin, n = b->end - b->begin;
  for (int h = 1; h < d->shard_count; h *= 2)
    for (int j = 0; j + h < d->shard_count; j += 2 * h) {
      float *x = d->shard[j] + lo;
      const float *y = d->shard[j + h] + lo;
      for (int64_t i = 0; i < n; i++)
        x[i] = (x[i] + y[i]) * 0.5f;
    }
}

static loom_status post_ctl(loom_ddp *d, int32_t active) {
  d->ctl_send = active;
  d->ctl_posted = true;
  return loom_allreduce(&d->ctl_send, &d->ctl_recv, 1, LOOM_I32, LOOM_SUM,
                        d->group, &d->ctl_req);
}

/* Posts level `level` of bucket b's reduction. */
static loom_status post_bucket(loom_ddp *d, ddp_bucket *b, int level) {
  size_t cnt = (size_t)(b->end - b->begin);
  float *g = d->grads + b->begin;
  if (d->opts.deterministic) {
    b->level = level;
    d->stats.wire_bytes += (int64_t)(cnt * sizeof(float));
    return loom_allreduce(g, g, cnt, LOOM_F32, LOOM_AVG, d->pair[level],
                          &b->req);
  }
  void *buf = g;
  loom_dtype dt = LOOM_F32;
  if (b->wire) {
    dt = d->opts.compress;
    loom_wire_pack(b->wire, g, (int64_t)cnt, dt, 1.0f);
    buf = b->wire;
  }
  d->stats.wire_bytes += (int64_t)(cnt * loom_dtype_size(dt));
  if (d->sharded) {
    /* To each owner its piece: the volume of a reduce-scatter. */
    size_t e = loom_dtype_size(dt);
    for (int k = 0; k < b->nparts; k++) {
      ddp_part *q = &d->parts[b->part_first + k];
      char *at = (char *)buf + (size_t)(q->a - b->begin) * e;
      LOOM_TRY(loom_reduce(at, q->root == d->rank ? at : NULL,
                           (size_t)(q->b - q->a), dt, LOOM_AVG, q->root,
                           d->group, &q->req));
    }
    return LOOM_OK;
  }
  if (b->posted_buf == buf)
    return loom_start(&b->req);
  b->posted_buf = buf;
  return loom_allreduce(buf, buf, cnt, dt, LOOM_AVG, d->group, &b->req);
}

static loom_status launch(loom_ddp *d, int i) {
  ddp_bucket *b = &d->buckets[i];
  if (!d->active) {
    d->active = true;
    if (d->opts.uneven && d->world > 1 && !d->ctl_posted)
      LOOM_TRY(post_ctl(d, 1));
  }
  b->launched = true;
  b->done = false;
  if (d->opts.deterministic) {
    local_tree(d, b);
    if (d->levels == 0)
      return LOOM_OK;
    return post_bucket(d, b, 0);
  }
  if (d->world == 1)
    return LOOM_OK;
  return post_bucket(d, b, 0);
}

/* Starts the ready buckets in index order: every rank posts the same
 * collectives in the same order, whatever order the hook reported in. */
static loom_status launch_ready(loom_ddp *d) {
  while (d->next_launch < d->nbuckets &&
         d->buckets[d->next_launch].remaining == 0) {
    LOOM_TRY(launch(d, d->next_launch));
    d->next_launch++;
    /* Sharded: at most two buckets in flight, the older ones waited for
     * and given back, so backward never holds the whole gradient. */
    if (d->sharded) {
      size_t r = loom_vmem_resident(d->grads, 0, (size_t)d->n * sizeof(float));
      if (r > d->grad_peak)
        d->grad_peak = r;
    }
    if (d->sharded && !d->opts.deterministic && d->world > 1 &&
        d->next_launch > 2)
      LOOM_TRY(loom_ddp_wait_bucket(d, d->next_launch - 3));
  }
  return LOOM_OK;
}

static loom_status grad_hook(void *user, int index, int64_t offset,
                             int64_t numel) {
  (void)offset;
  (void)numel;
  loom_ddp *d = user;
  if (!d->sync)
    return LOOM_OK;
  if (d->opts.deterministic && d->cur_shard != d->shard_count - 1)
    return LOOM_OK;
  ddp_bucket *b = &d->buckets[d->param_bucket[index]];
  if (b->launched || b->remaining <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: parameter %d got a second final gradient before "
                      "the step's reductions were waited for (two reducing "
                      "backward passes in one step? use loom_ddp_set_sync "
                      "false for all but the last)",
                      index);
  b->remaining--;
  if (b->remaining == 0)
    return launch_ready(d);
  return LOOM_OK;
}

loom_status loom_ddp_finish_backward(loom_ddp *d) {
  DDP_NEED(d, "loom_ddp_finish_backward");
  for (int i = d->next_launch; i < d->nbuckets; i++) {
    d->buckets[i].remaining = 0;
  }
  loom_status s = launch_ready(d);
  if (d->opts.deterministic)
    loom_model_bind_grads(d->model, d->grads);
  return s;
}

/* ---------------------------------------------------------------- waiting */

static loom_status wait_req(loom_ddp *d, loom_req *r) {
  bool done = false;
  loom_status s = loom_test(r, &done);
  if (done)
    return s;
  double t0 = loom_time_now();
  s = loom_wait(r);
  d->step_wait += loom_time_now() - t0;
  return s;
}

static void account(loom_ddp *d, const loom_req *r) {
  double st = 0, fin = 0;
  loom_req_times(r, NULL, &st, &fin);
  if (st > 0 && fin >= st)
    d->step_reduce += fin - st;
}

/* Deterministic mode with several tree levels: posts level l of every
 * bucket whose level l - 1 has completed, in bucket order at each level (the
 * order every rank uses on that level's group), so the levels of different
 * buckets pipeline on the communication thread. */
static loom_status advance(loom_ddp *d) {
  for (int l = 1; l < d->levels; l++)
    while (d->up[l] < d->next_launch) {
      ddp_bucket *b = &d->buckets[d->up[l]];
      bool done = false;
      if (b->level != l - 1)
        break;
      loom_status s = loom_test(&b->req, &done);
      if (!done)
        break;
      if (s != LOOM_OK)
        return loom_error_context(s, "ddp: bucket %d, tree level %d", d->up[l],
                                  l - 1);
      account(d, &b->req);
      LOOM_TRY(post_bucket(d, b, l));
      d->up[l]++;
    }
  return LOOM_OK;
}

/* Sharded: [a, b) of the gradient (and its wire copy) outside this rank's
 * slice is no longer needed: zero, its pages back to the system. */
static void give_back(loom_ddp *d, int64_t a, int64_t b) {
  int64_t m1 = b < d->lo ? b : d->lo, m2 = a > d->hi ? a : d->hi;
  if (a < m1)
    loom_vmem_release(d->grads, (size_t)a * sizeof(float),
                      (size_t)m1 * sizeof(float));
  if (m2 < b)
    loom_vmem_release(d->grads, (size_t)m2 * sizeof(float),
                      (size_t)b * sizeof(float));
  if (d->wire) {
    size_t e = loom_dtype_size(d->opts.compress);
    loom_vmem_release(d->wire, (size_t)a * e, (size_t)b * e);
  }
}

/* Sharded, not deterministic: bucket i's reduces, then this rank's piece
 * converted back from the wire. */
static loom_status wait_parts(loom_ddp *d, int i) {
  ddp_bucket *b = &d->buckets[i];
  loom_status first = LOOM_OK;
  for (int k = 0; k < b->nparts; k++) {
    ddp_part *q = &d->parts[b->part_first + k];
    loom_status s = wait_req(d, &q->req);
    if (s != LOOM_OK && first == LOOM_OK)
      first = loom_error_context(s, "ddp: bucket %d [%lld, %lld) to rank %d", i,
                                 (long long)q->a, (long long)q->b, q->root);
    account(d, &q->req);
    if (s == LOOM_OK && q->root == d->rank && b->wire) {
      size_t e = loom_dtype_size(d->opts.compress);
      loom_wire_unpack(d->grads + q->a,
                       (const char *)b->wire + (size_t)(q->a - b->begin) * e,
                       q->b - q->a, d->opts.compress);
    }
  }
  return first;
}

loom_status loom_ddp_wait_bucket(loom_ddp *d, int i) {
  DDP_NEED(d, "loom_ddp_wait_bucket");
  if (i < 0 || i >= d->nbuckets)
    return loom_error(LOOM_ERR_INVALID_ARG, "ddp: no bucket %d (of %d)", i,
                      d->nbuckets);
  ddp_bucket *b = &d->buckets[i];
  if (!b->launched)
    LOOM_TRY(loom_ddp_finish_backward(d));
  if (b->done)
    return LOOM_OK;
  bool comm = d->opts.deterministic ? d->levels > 0 : d->world > 1;
  /* Several tree levels climb in bucket order (advance): the buckets before
   * this one go first. */
  for (int j = 0; d->levels > 1 && j < i; j++)
    LOOM_TRY(loom_ddp_wait_bucket(d, j));
  if (comm && d->sharded && !d->opts.deterministic) {
    LOOM_TRY(wait_parts(d, i));
  } else if (comm) {
    for (;;) {
      if (d->levels > 1)
        LOOM_TRY(advance(d));
      bool last = !d->opts.deterministic || b->level + 1 >= d->levels;
      loom_status s = wait_req(d, &b->req);
      if (s != LOOM_OK)
        return loom_error_context(s, "ddp: bucket %d [%lld, %lld)", i,
                                  (long long)b->begin, (long long)b->end);
      if (last) {
        account(d, &b->req);
        break;
      }
      /* Its level is done: advance() posts the next one (the buckets
       * before it are complete, so it is next in line at every level). */
    }
    if (b->wire)
      loom_wire_unpack(d->grads + b->begin, b->wire, b->end - b->begin,
                       d->opts.compress);
  }
  if (comm) {
    if (d->opts.uneven) {
      loom_status s = wait_req(d, &d->ctl_req);
      if (s != LOOM_OK)
        return loom_error_context(s, "ddp: active-rank count");
      /* Joined ranks gave zeros: rescale the average over all P to one
       * over the A ranks that trained. */
      if (d->ctl_recv > 0 && d->ctl_recv < d->world) {
        float f = (float)d->world / (float)d->ctl_recv;
        float *g = d->grads + b->begin;
        for (int64_t k = 0; k < b->end - b->begin; k++)
          g[k] *= f;
      }
    }
    if (d->sharded)
      give_back(d, b->begin, b->end);
  }
  b->done = true;
  return LOOM_OK;
}

/* After the last bucket of a step: statistics, and the step state reset. */
static void end_step(loom_ddp *d) {
  d->stats.steps++;
  d->stats.last_reduce_s = d->step_reduce;
  d->stats.last_wait_s = d->step_wait;
  d->stats.reduce_s += d->step_reduce;
  d->stats.wait_s += d->step_wait;
  d->step_reduce = d->step_wait = 0;
  for (int i = 0; i < d->nbuckets; i++) {
    ddp_bucket *b = &d->buckets[i];
    b->remaining = b->nparams;
    b->launched = false;
    b->done = false;
  }
  d->next_launch = 0;
  for (int l = 0; l < d->levels; l++)
    d->up[l] = 0;
  d->active = false;
  d->ctl_posted = false;
}

loom_status loom_ddp_wait(loom_ddp *d) {
  DDP_NEED(d, "loom_ddp_wait");
  LOOM_TRY(loom_ddp_finish_backward(d));
  loom_status first = LOOM_OK;
  for (int i = 0; i < d->nbuckets; i++) {
    loom_status s = loom_ddp_wait_bucket(d, i);
    if (s != LOOM_OK && first == LOOM_OK)
      first = s;
  }
  if (first == LOOM_OK)
    end_step(d);
  return first;
}

loom_status loom_ddp_step(loom_ddp *d, loom_optim *o, float lr) {
  DDP_NEED(d, "loom_ddp_step");
  if (!o)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ddp_step: optimizer is NULL");
  LOOM_TRY(loom_ddp_finish_backward(d));
  float *p = loom_model_params(d->model);
  /* A sharded optimizer (ZeRO-1) steps only what its shard holds. */
  const loom_optim_opts *oo = loom_optim_get_opts(o);
  const int64_t s0 = oo->shard_begin,
                s1 = oo->shard_end < 0 ? d->n : oo->shard_end;
  for (int i = 0; i < d->nbuckets; i++) {
    LOOM_TRY(loom_ddp_wait_bucket(d, i));
    int64_t b = d->buckets[i].begin > s0 ? d->buckets[i].begin : s0;
    int64_t e = d->buckets[i].end < s1 ? d->buckets[i].end : s1;
    if (b < e)
      LOOM_TRY(loom_optim_step_range(o, p, d->grads, lr, b, e));
  }
  loom_optim_finish_step(o);
  end_step(d);
  return LOOM_OK;
}

/* Waits for everything in flight without failing (zero_grad, free). */
static loom_status drain(loom_ddp *d) {
  loom_status first = LOOM_OK;
  for (int i = 0; i < d->nbuckets; i++) {
    loom_status s = loom_wait(&d->buckets[i].req);
    if (s != LOOM_OK && first == LOOM_OK)
      first = s;
  }
  for (int k = 0; k < d->nparts; k++) {
    loom_status s = loom_wait(&d->parts[k].req);
    if (s != LOOM_OK && first == LOOM_OK)
      first = s;
  }
  loom_status s = loom_wait(&d->ctl_req);
  if (s != LOOM_OK && first == LOOM_OK)
    first = s;
  return first;
}

loom_status loom_ddp_zero_grad(loom_ddp *d) {
  DDP_NEED(d, "loom_ddp_zero_grad");
  loom_status s = LOOM_OK;
  if (d->active) {
    /* A step left unfinished: complete its collectives (the other ranks
     * posted them too) before the buffer is touched. */
    s = loom_ddp_wait(d);
    if (s != LOOM_OK)
      return s;
  }
  if (d->sharded) {
    /* Only this rank's slice is written; the rest goes back (a no-op for
     * pages already given back). */
    memset(d->grads + d->lo, 0, (size_t)(d->hi - d->lo) * sizeof(float));
    give_back(d, 0, d->n);
  } else {
    memset(d->grads, 0, (size_t)d->n * sizeof(float));
  }
  for (int j = 1; j < d->shard_count; j++)
    memset(d->shard[j], 0, (size_t)d->n * sizeof(float));
  d->cur_shard = 0;
  loom_model_bind_grads(d->model, d->grads);
  return s;
}

void loom_ddp_set_sync(loom_ddp *d, bool sync) {
  if (d)
    d->sync = sync;
}

loom_status loom_ddp_shard_begin(loom_ddp *d, int j) {
  DDP_NEED(d, "loom_ddp_shard_begin");
  if (!d->opts.deterministic)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: shards exist in deterministic mode only");
  if (j < 0 || j >= d->shard_count)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: local shard %d out of range (this rank has %d)", j,
                      d->shard_count);
  d->cur_shard = j;
  loom_model_bind_grads(d->model, d->shard[j]);
  return LOOM_OK;
}

loom_status loom_ddp_join(loom_ddp *d, bool *done) {
  DDP_NEED(d, "loom_ddp_join");
  if (!done)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ddp_join: done is NULL");
  *done = false;
  if (!d->opts.uneven)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: join needs opts.uneven (every rank must count the "
                      "active ranks each step)");
  if (d->active)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: join in the middle of a step");
  LOOM_TRY(loom_ddp_zero_grad(d));
  LOOM_TRY(post_ctl(d, 0));
  loom_status s = loom_wait(&d->ctl_req);
  if (s != LOOM_OK)
    return loom_error_context(s, "ddp: join");
  if (d->ctl_recv == 0) {
    /* Everybody has joined: no bucket follows on any rank. */
    d->ctl_posted = false;
    *done = true;
    return LOOM_OK;
  }
  d->active = true;
  return loom_ddp_finish_backward(d);
}

/* ---------------------------------------------------------------- sums */

loom_status loom_ddp_sum_post(loom_ddp *d, const double *local, int k) {
  DDP_NEED(d, "loom_ddp_sum_post");
  if (!local)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ddp_sum_post: local is NULL");
  if (k < 1 || k > LOOM_DDP_SUM_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG, "ddp: %d sums (1 to %d)", k,
                      LOOM_DDP_SUM_MAX);
  if (d->sum_posted)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: loom_ddp_sum_post twice without a wait");
  int rows = d->opts.deterministic ? d->shard_count : 1;
  memcpy(d->sum_send, local, (size_t)rows * (size_t)k * sizeof(double));
  d->sum_k = k;
  d->sum_posted = true;
  if (d->world == 1) {
    memcpy(d->sum_recv, local, (size_t)rows * (size_t)k * sizeof(double));
    return LOOM_OK;
  }
  if (d->opts.deterministic)
    return loom_allgather(d->sum_send, d->sum_recv, (size_t)rows * (size_t)k,
                          LOOM_F64, d->group, &d->sum_req);
  return loom_allreduce(d->sum_send, d->sum_recv, (size_t)k, LOOM_F64, LOOM_SUM,
                        d->group, &d->sum_req);
}

loom_status loom_ddp_sum_wait(loom_ddp *d, double *out) {
  DDP_NEED(d, "loom_ddp_sum_wait");
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ddp_sum_wait: out is NULL");
  if (!d->sum_posted)
    return loom_error(LOOM_ERR_INVALID_ARG, "ddp: no sum posted");
  d->sum_posted = false;
  LOOM_TRY(loom_wait(&d->sum_req));
  int k = d->sum_k;
  if (!d->opts.deterministic) {
    memcpy(out, d->sum_recv, (size_t)k * sizeof(double));
    return LOOM_OK;
  }
  /* Shard order 0..V-1, whatever P. */
  int v = d->opts.virtual_shards;
  for (int c = 0; c < k; c++) {
    double s = 0;
    for (int j = 0; j < v; j++)
      s += d->sum_recv[j * k + c];
    out[c] = s;
  }
  return LOOM_OK;
}

/* ---------------------------------------------------------------- stats */

void loom_ddp_get_stats(const loom_ddp *d, loom_ddp_stats *out) {
  if (!out)
    return;
  if (!d) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = d->stats;
  out->buckets = d->nbuckets;
  if (d->stats.steps > 0)
    out->wire_bytes = d->stats.wire_bytes / d->stats.steps;
}

void loom_ddp_reset_stats(loom_ddp *d) {
  if (!d)
    return;
  memset(&d->stats, 0, sizeof d->stats);
}

double loom_ddp_hidden_share(const loom_ddp_stats *s) {
  if (!s || !(s->reduce_s > 0))
    return 1.0;
  double h = 1.0 - s->wait_s / s->reduce_s;
  return h < 0 ? 0 : h > 1 ? 1 : h;
}

/* ------------------------------------------------------------- building */

static loom_status make_buckets(loom_ddp *d) {
  loom_model *m = d->model;
  int nv = loom_model_num_views(m);
  if (nv < 1)
    return loom_error(LOOM_ERR_INVALID_ARG, "ddp: the model has no parameter");
  d->param_bucket = loom_calloc((size_t)nv, sizeof(int));
  d->buckets = loom_calloc((size_t)nv, sizeof(ddp_bucket));
  if (!d->param_bucket || !d->buckets)
    return LOOM_ERR_NOMEM;
  const double mib = 1024.0 * 1024.0 / sizeof(float);
  double cap = d->opts.bucket_mb > 0 ? d->opts.bucket_mb * mib : INFINITY;
  double first =
      d->opts.first_bucket_mb > 0 ? d->opts.first_bucket_mb * mib : cap;
  if (d->opts.min_buckets > 1) {
    double most = (double)d->n / d->opts.min_buckets;
    cap = cap < most ? cap : most;
    first = first < cap ? first : cap;
  }
  int nb = 0;
  int64_t size = 0;
  /* Reverse parameter order: the order in which backward finalises them. A
   * bucket closes once it reaches its size (PyTorch's rule). */
  for (int i = nv - 1; i >= 0; i--) {
    const loom_param *p = loom_model_view(m, i);
    ddp_bucket *b = &d->buckets[nb];
    if (size == 0)
      b->end = p->offset + p->numel;
    b->begin = p->offset;
    b->nparams++;
    d->param_bucket[i] = nb;
    size += p->numel;
    if ((double)size >= (nb == 0 ? first : cap) || i == 0) {
      nb++;
      size = 0;
    }
  }
  d->nbuckets = nb;
  for (int i = 0; i < nb; i++) {
    ddp_bucket *b = &d->buckets[i];
    b->remaining = b->nparams;
    if (i > 0 && b->end != d->buckets[i - 1].begin)
      return loom_error(LOOM_ERR_INTERNAL,
                        "ddp: the model's views are not contiguous");
  }
  if (d->buckets[0].end != d->n || d->buckets[nb - 1].begin != 0)
    return loom_error(LOOM_ERR_INTERNAL,
                      "ddp: the model's views do not cover its %lld elements",
                      (long long)d->n);
  return LOOM_OK;
}

static uint64_t opts_hash(const loom_ddp_opts *o) {
  struct {
    double bucket_mb, first_bucket_mb;
    int32_t compress, deterministic, virtual_shards, uneven, broadcast,
        min_buckets;
  } h;
  memset(&h, 0, sizeof h);
  h.bucket_mb = o->bucket_mb;
  h.first_bucket_mb = o->first_bucket_mb;
  h.compress = (int32_t)o->compress;
  h.deterministic = o->deterministic;
  h.virtual_shards = o->deterministic ? o->virtual_shards : 0;
  h.uneven = o->uneven;
  h.broadcast = o->broadcast;
  h.min_buckets = o->min_buckets;
  return loom_hash64(LOOM_HASH64_INIT, &h, sizeof h);
}

/* Words each rank contributes to the start-up check. */
enum { CK_CONFIG, CK_LAYOUT, CK_OPTS, CK_NUMEL, CK_STATUS, CK_WORDS };

/* Writes the ranks whose word w differs from rank 0's as "1, 3-5". */
static int differing(const uint64_t *all, int world, int w, char *buf,
                     size_t n) {
  int count = 0;
  size_t len = 0;
  buf[0] = '\0';
  for (int r = 1; r < world; r++) {
    if (all[r * CK_WORDS + w] == all[w])
      continue;
    int e = r;
    while (e + 1 < world && all[(e + 1) * CK_WORDS + w] != all[w])
      e++;
    if (len < n)
      len += (size_t)snprintf(buf + len, n - len, "%s%d", count ? ", " : "", r);
    if (e > r && len < n)
      len += (size_t)snprintf(buf + len, n - len, "-%d", e);
    count += e - r + 1;
    r = e;
  }
  return count;
}

/* Every rank gathers every rank's (config, layout, options, N, status of
 * its own setup) and checks them against rank 0's; all ranks see the same
 * table, so all fail alike and none is left waiting in a later collective.
 * `mine` is this rank's setup status, its message in loom_last_error(). */
static loom_status check_ranks(loom_ddp *d, loom_status mine) {
  char own[400];
  snprintf(own, sizeof own, "%s", mine != LOOM_OK ? loom_last_error() : "");
  uint64_t me[CK_WORDS] = {[CK_CONFIG] =
                               d->opts.check_config ? d->opts.config_hash : 0,
                           [CK_LAYOUT] = loom_model_layout_hash(d->model),
                           [CK_OPTS] = opts_hash(&d->opts),
                           [CK_NUMEL] = (uint64_t)d->n,
                           [CK_STATUS] = (uint64_t)(int64_t)mine};
  uint64_t *all = loom_calloc((size_t)d->world * CK_WORDS, sizeof(uint64_t));
  if (!all)
    return LOOM_ERR_NOMEM;
  loom_req req = LOOM_REQ_INIT;
  loom_status s = loom_allgather(me, all, CK_WORDS, LOOM_I64, d->group, &req);
  if (s == LOOM_OK)
    s = loom_wait(&req);
  if (s != LOOM_OK) {
    loom_free(all);
    return loom_error_context(s, "ddp: exchanging hashes at start");
  }
  static const char *const what[CK_STATUS] = {
      [CK_CONFIG] = "config (loom_config_hash)",
      [CK_LAYOUT] = "model layout (parameter names, shapes, offsets)",
      [CK_OPTS] = ("data-parallel options (bucket sizes, compression, "
                   "deterministic mode)"),
      [CK_NUMEL] = "number of parameters"};
  char ranks[160];
  for (int w = 0; w < CK_STATUS && s == LOOM_OK; w++) {
    int c = differing(all, d->world, w, ranks, sizeof ranks);
    if (c > 0) {
      int r0 = -1;
      for (int r = 1; r < d->world && r0 < 0; r++)
        if (all[r * CK_WORDS + w] != all[w])
          r0 = r;
      s = loom_error(LOOM_ERR_MISMATCH,
                     "ddp: the %s of rank%s %s differs from rank 0's "
                     "(%016llx vs %016llx): every rank must run the same "
                     "config and model",
                     what[w], c > 1 ? "s" : "", ranks,
                     (unsigned long long)all[r0 * CK_WORDS + w],
                     (unsigned long long)all[w]);
    }
  }
  if (s == LOOM_OK && mine != LOOM_OK)
    s = loom_error(mine, "%s", own);
  for (int r = 0; r < d->world && s == LOOM_OK; r++) {
    loom_status rs = (loom_status)(int64_t)all[r * CK_WORDS + CK_STATUS];
    if (rs != LOOM_OK)
      s = loom_error(LOOM_ERR_REMOTE,
                     "ddp: rank %d could not set up (%s); its message says "
                     "why",
                     r, loom_status_str(rs));
  }
  loom_free(all);
  return s;
}

static loom_status check_opts(const loom_ddp_opts *o, int world) {
  if (!(o->bucket_mb >= 0) || !(o->first_bucket_mb >= 0) || o->min_buckets < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: bucket sizes must be >= 0 MiB and min_buckets "
                      ">= 0");
  if (o->compress != LOOM_F32 && o->compress != LOOM_BF16 &&
      o->compress != LOOM_F16)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: compression to %s is not supported (f32, bf16 "
                      "or f16)",
                      loom_dtype_name(o->compress));
  if (!o->deterministic)
    return LOOM_OK;
  if (o->compress != LOOM_F32)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: deterministic mode reduces in f32; turn "
                      "compression off");
  if (o->uneven)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: deterministic mode needs every rank at every step "
                      "(no uneven inputs)");
  if (!is_pow2(o->virtual_shards) || !is_pow2(world) ||
      o->virtual_shards % world != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: deterministic mode needs a power-of-two number of "
                      "ranks dividing parallel.virtual_shards, itself a power "
                      "of two (got %d ranks, %d shards)",
                      world, o->virtual_shards);
  return LOOM_OK;
}

static loom_status make_deterministic(loom_ddp *d) {
  int v = d->opts.virtual_shards;
  d->shard_count = v / d->world;
  d->shard_first = d->rank * d->shard_count;
  d->shard = loom_calloc((size_t)d->shard_count, sizeof(float *));
  if (!d->shard)
    return LOOM_ERR_NOMEM;
  d->shard[0] = d->grads;
  for (int j = 1; j < d->shard_count; j++) {
    d->shard[j] = loom_calloc((size_t)d->n, sizeof(float));
    if (!d->shard[j])
      return loom_error_context(LOOM_ERR_NOMEM,
                                "ddp: %d virtual-shard gradient buffers",
                                d->shard_count);
  }
  while ((1 << d->levels) < d->world)
    d->levels++;
  if (d->levels > 0) {
    d->pair = loom_calloc((size_t)d->levels, sizeof(loom_group *));
    d->up = loom_calloc((size_t)d->levels, sizeof(int));
    if (!d->pair || !d->up)
      return LOOM_ERR_NOMEM;
  }
  return LOOM_OK;
}

/* Collective: the groups of two of each tree level. */
static loom_status make_pairs(loom_ddp *d) {
  /* Level l joins subtrees 2^l ranks apart: ranks r and r ^ 2^l, the lower
   * one first (the left subtree). */
  for (int l = 0; l < d->levels; l++) {
    int bit = 1 << l;
    LOOM_TRY(loom_group_split(d->group, d->rank & ~bit, d->rank, &d->pair[l]));
    if (!d->pair[l] || loom_group_size(d->pair[l]) != 2)
      return loom_error(LOOM_ERR_INTERNAL, "ddp: tree level %d group", l);
  }
  return LOOM_OK;
}

/* All ranks learn whether every rank got LOOM_OK; the first failing rank
 * is named. */
static loom_status agree(loom_ddp *d, loom_status mine, const char *what) {
  char label[160];
  snprintf(label, sizeof label, "ddp: %s", what);
  return loom_comm_agree(d->world == 1 ? NULL : d->group, mine, label);
}

/* Collective: the gradient buffer (and the compressed copy) in memory that
 * the host's ranks share, the model's gradients bound to it. */
static loom_status make_shared(loom_ddp *d) {
  if (d->world == 1 || d->sharded)
    return LOOM_OK;
  size_t bytes = (size_t)d->n * sizeof(float);
  loom_status s = loom_group_mem_alloc(d->group, bytes, &d->shared);
  if (s == LOOM_OK) {
    memcpy(d->shared, d->grads, bytes);
    d->grads = d->shared;
    if (d->shard)
      d->shard[0] = d->grads;
    loom_model_bind_grads(d->model, d->grads);
    loom_model_drop_own_grads(d->model);
  }
  if (s == LOOM_OK && d->opts.compress != LOOM_F32) {
    size_t e = loom_dtype_size(d->opts.compress);
    s = loom_group_mem_alloc(d->group, (size_t)d->n * e, &d->wire);
    if (s == LOOM_OK) {
      d->wire_counted = (size_t)d->n * e;
      loom_mem_add(LOOM_MEM_COMM, d->wire_counted);
    }
    for (int i = 0; s == LOOM_OK && i < d->nbuckets; i++)
      d->buckets[i].wire = (char *)d->wire + (size_t)d->buckets[i].begin * e;
  }
  return agree(d, s, "allocating the shared gradient buffer");
}

/* Sharded gradients: the DDP's own reserved buffers, each bucket's pieces
 * by owner, and the chunk counts of loom_ddp_grad_sumsq. */
static loom_status make_sharded(loom_ddp *d) {
  const int64_t *B = d->opts.shard_bounds;
  if (B[0] != 0 || B[d->world] != d->n)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: shard_bounds must run from 0 to the %lld "
                      "parameters",
                      (long long)d->n);
  for (int r = 0; r < d->world; r++)
    if (B[r] > B[r + 1])
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "ddp: shard_bounds not ascending at rank %d", r);
  d->sharded = true;
  d->lo = B[d->rank];
  d->hi = B[d->rank + 1];
  d->grads = loom_vmem_new((size_t)d->n * sizeof(float));
  if (!d->grads)
    return loom_error_context(LOOM_ERR_NOMEM, "ddp: the gradient buffer");
  if (d->opts.compress != LOOM_F32) {
    d->wire = loom_vmem_new((size_t)d->n * loom_dtype_size(d->opts.compress));
    if (!d->wire)
      return loom_error_context(LOOM_ERR_NOMEM, "ddp: the wire buffer");
    /* Between steps only this rank's slice stays resident. */
    d->wire_counted =
        (size_t)(d->hi - d->lo) * loom_dtype_size(d->opts.compress);
    loom_mem_add(LOOM_MEM_COMM, d->wire_counted);
    for (int i = 0; i < d->nbuckets; i++)
      d->buckets[i].wire =
          (char *)d->wire +
          (size_t)d->buckets[i].begin * loom_dtype_size(d->opts.compress);
  }
  int np = 0;
  for (int i = 0; i < d->nbuckets; i++)
    for (int r = 0; r < d->world; r++)
      np += B[r] < B[r + 1] && B[r] < d->buckets[i].end &&
            B[r + 1] > d->buckets[i].begin;
  d->parts = loom_calloc((size_t)(np ? np : 1), sizeof *d->parts);
  d->chunk_counts = loom_calloc((size_t)d->world, sizeof(size_t));
  int64_t nchunks = (d->n + LOOM_GRAD_CHUNK - 1) / LOOM_GRAD_CHUNK;
  d->chunk_sums =
      loom_calloc((size_t)(nchunks > 0 ? nchunks : 1), sizeof(double));
  if (!d->parts || !d->chunk_counts || !d->chunk_sums)
    return LOOM_ERR_NOMEM;
  for (int i = 0; i < d->nbuckets; i++) {
    ddp_bucket *b = &d->buckets[i];
    b->part_first = d->nparts;
    for (int r = 0; r < d->world; r++) {
      int64_t a = B[r] > b->begin ? B[r] : b->begin;
      int64_t e = B[r + 1] < b->end ? B[r + 1] : b->end;
      if (a < e)
        d->parts[d->nparts++] = (ddp_part){.root = r, .a = a, .b = e};
    }
    b->nparts = d->nparts - b->part_first;
  }
  /* A chunk belongs to the rank whose slice holds its first element. */
  for (int64_t c = 0; c < nchunks; c++) {
    int r = 0;
    while (r + 1 < d->world && B[r + 1] <= c * LOOM_GRAD_CHUNK)
      r++;
    d->chunk_counts[r]++;
  }
  loom_model_bind_grads(d->model, d->grads);
  /* A model with buffers of its own (tensor parallelism's part under
   * ZeRO-2): its gradient buffer is never used while the DDP lives. */
  loom_model_drop_own_grads(d->model);
  return LOOM_OK;
}

void loom_ddp_grad_resident(const loom_ddp *d, size_t *now, size_t *peak) {
  if (!d) {
    if (now)
      *now = 0;
    if (peak)
      *peak = 0;
    return;
  }
  size_t all = (size_t)d->n * sizeof(float);
  size_t r = d->sharded ? loom_vmem_resident(d->grads, 0, all) : all;
  if (now)
    *now = r;
  if (peak)
    *peak = d->grad_peak > r ? d->grad_peak : r;
}

loom_status loom_ddp_grad_sumsq(loom_ddp *d, double *out) {
  DDP_NEED(d, "loom_ddp_grad_sumsq");
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ddp_grad_sumsq: out is NULL");
  *out = 0;
  if (!d->sharded) {
    *out = loom_grad_sumsq(d->grads, d->n);
    return LOOM_OK;
  }
  /* This rank's chunks, each summed as loom_grad_sumsq sums one; every
   * rank gets all of them and adds them in index order, so the result
   * does not depend on the number of ranks when slices are chunk-aligned
   * (a chunk across two slices is summed by its first rank with the other
   * rank's part as zeros: not the single-rank bits then, still the sum). */
  int64_t c0 = 0;
  for (int r = 0; r < d->rank; r++)
    c0 += (int64_t)d->chunk_counts[r];
  int64_t nc = (int64_t)d->chunk_counts[d->rank];
  for (int64_t c = c0; c < c0 + nc; c++) {
    int64_t a = c * LOOM_GRAD_CHUNK, b = a + LOOM_GRAD_CHUNK;
    b = b < d->n ? b : d->n;
    int64_t x = a > d->lo ? a : d->lo, y = b < d->hi ? b : d->hi;
    d->chunk_sums[c] = x < y ? loom_grad_sumsq(d->grads + x, y - x) : 0.0;
  }
  /* The parts of chunks that straddle into this slice from the rank before
   * are added by all-reducing their sums below. */
  double extra = 0;
  int64_t first_own = c0 * LOOM_GRAD_CHUNK;
  if (d->lo < first_own && d->lo < d->hi) {
    int64_t y = first_own < d->hi ? first_own : d->hi;
    extra = loom_grad_sumsq(d->grads + d->lo, y - d->lo);
  }
  if (d->world > 1) {
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_allgatherv(d->chunk_sums + c0, d->chunk_sums, d->chunk_counts,
                             LOOM_F64, d->group, &r));
    LOOM_TRY(loom_wait(&r));
    double ex = extra;
    LOOM_TRY(loom_allreduce(&ex, &extra, 1, LOOM_F64, LOOM_SUM, d->group, &r));
    LOOM_TRY(loom_wait(&r));
  }
  double total = 0;
  int64_t nchunks = (d->n + LOOM_GRAD_CHUNK - 1) / LOOM_GRAD_CHUNK;
  for (int64_t c = 0; c < nchunks; c++)
    total += d->chunk_sums[c];
  *out = total + extra;
  return LOOM_OK;
}

/* Options, buckets and buffers: no communication. */
static loom_status setup_local(loom_ddp *d) {
  LOOM_TRY(check_opts(&d->opts, d->world));
  LOOM_TRY(make_buckets(d));
  if (d->opts.shard_bounds)
    LOOM_TRY(make_sharded(d));
  else if (!d->grads)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "ddp: the model has no gradient buffer (shape_only) "
                      "and the gradients are not sharded");
  if (d->opts.deterministic)
    LOOM_TRY(make_deterministic(d));
  int rows = d->opts.deterministic ? d->opts.virtual_shards : 1;
  d->sum_send = loom_calloc((size_t)rows * LOOM_DDP_SUM_MAX, sizeof(double));
  d->sum_recv = loom_calloc((size_t)rows * LOOM_DDP_SUM_MAX, sizeof(double));
  if (!d->sum_send || !d->sum_recv)
    return LOOM_ERR_NOMEM;
  return LOOM_OK;
}

loom_status loom_ddp_new(loom_ddp **out, loom_model *model, loom_group *g,
                         const loom_ddp_opts *opts) {
  *out = NULL;
  if (!model || !g)
    return loom_error(LOOM_ERR_INVALID_ARG, "ddp: a model and a group needed");
  loom_ddp *d = loom_calloc(1, sizeof *d);
  if (!d)
    return LOOM_ERR_NOMEM;
  d->opts = opts ? *opts : loom_ddp_opts_default();
  d->model = model;
  d->group = g;
  d->rank = loom_group_rank(g);
  d->world = loom_group_size(g);
  d->n = loom_model_num_params(model);
  loom_model_bind_grads(model, NULL);
  d->grads = loom_model_grads(model);
  d->sync = true;
  d->shard_count = 1;
  d->shard_first = 0;
  loom_status s;
  /* Everything local first; the ranks then agree on the outcome before
   * any other collective, so a failure on one rank stops them all. */
  LOOM_TRY_GOTO(s, check_ranks(d, setup_local(d)), fail);
  LOOM_TRY_GOTO(s, make_shared(d), fail);
  if (d->opts.deterministic)
    LOOM_TRY_GOTO(s, make_pairs(d), fail);
  if (d->opts.broadcast && d->world > 1) {
    float *p = loom_model_params(model);
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY_GOTO(s, loom_broadcast(p, p, (size_t)d->n, LOOM_F32, 0, g, &r),
                  fail);
    s = loom_wait(&r);
    if (s != LOOM_OK) {
      loom_error_context(s, "ddp: broadcasting rank 0's parameters");
      goto fail;
    }
  }
  loom_model_set_grad_hook(model, grad_hook, d);
  *out = d;
  return LOOM_OK;
fail:
  loom_ddp_free(d);
  return s;
}

void loom_ddp_free(loom_ddp *d) {
  if (!d)
    return;
  drain(d);
  if (d->sum_posted)
    loom_wait(&d->sum_req);
  loom_model_set_grad_hook(d->model, NULL, NULL);
  loom_model_bind_grads(d->model, NULL);
  for (int l = 0; l < d->levels && d->pair; l++)
    loom_group_free(d->pair[l]);
  loom_free(d->pair);
  loom_free(d->up);
  if (d->shard)
    for (int j = 1; j < d->shard_count; j++)
      loom_free(d->shard[j]);
  loom_free(d->shard);
  loom_mem_sub(LOOM_MEM_COMM, d->wire_counted);
  if (d->sharded) {
    loom_vmem_free(d->grads, (size_t)d->n * sizeof(float));
    if (d->wire)
      loom_vmem_free(d->wire, (size_t)d->n * loom_dtype_size(d->opts.compress));
  } else if (d->shared || d->wire) {
    /* Collective: every rank frees its DDP alike. */
    loom_group_mem_free(d->group, d->wire);
    loom_group_mem_free(d->group, d->shared);
  }
  loom_free(d->parts);
  loom_free(d->chunk_counts);
  loom_free(d->chunk_sums);
  loom_free(d->buckets);
  loom_free(d->param_bucket);
  loom_free(d->sum_send);
  loom_free(d->sum_recv);
  loom_free(d);
}
