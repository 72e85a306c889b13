/* Tensor parallelism: the loom_tp of a group (the reductions a
 * tensor-parallel model's modules post), and the map between a rank's
 * flat buffers and the whole model's canonical layout (initial values,
 * checkpoints, the gradient norm). */
#include <string.h>

#include "loom/parallel.h"

/* ------------------------------------------------------------ the group */

struct loom_tp_group {
  loom_tp tp;
  loom_group *g;
  loom_req req[LOOM_TP_SLOTS];
  loom_tp_stats st;
};

static loom_status tp_start(void *user, int slot, float *buf, int64_t n,
                            loom_tp_op op) {
  loom_tp_group *t = user;
  if (slot < 0 || slot >= LOOM_TP_SLOTS)
    return loom_error(LOOM_ERR_INVALID_ARG, "tensor parallel: no slot %d",
                      slot);
  static const loom_redop ops[] = {[LOOM_TP_SUM] = LOOM_SUM,
                                   [LOOM_TP_MAX] = LOOM_MAX,
                                   [LOOM_TP_MIN] = LOOM_MIN};
  t->st.reductions++;
  t->st.bytes += (uint64_t)n * sizeof(float);
  /* a ring all-reduce sends 2 (T - 1) / T of the buffer */
  t->st.wire_bytes += 2.0 * (t->tp.size - 1) / t->tp.size * (double)n * 4.0;
  return loom_allreduce(buf, buf, (size_t)n, LOOM_F32, ops[op], t->g,
                        &t->req[slot]);
}

static loom_status tp_slot_ok(int slot) {
  if (slot < 0 || slot >= LOOM_TP_SLOTS)
    return loom_error(LOOM_ERR_INVALID_ARG, "tensor parallel: no slot %d",
                      slot);
  return LOOM_OK;
}

/* All-gather and reduce-scatter of sequence parallelism: each sends
 * (T - 1) / T of the whole (T n) buffer, one of them half an all-reduce. */
static loom_status tp_gather(void *user, int slot, const void *send, void *recv,
                             int64_t n, loom_dtype dt) {
  loom_tp_group *t = user;
  LOOM_TRY(tp_slot_ok(slot));
  if (dt != LOOM_F32 && dt != LOOM_BF16 && dt != LOOM_F16)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor parallel: an all-gather of %s (f32, bf16 or "
                      "f16)",
                      loom_dtype_name(dt));
  const size_t es = loom_dtype_size(dt);
  t->st.gathers++;
  t->st.seq_bytes += (uint64_t)n * (uint64_t)t->tp.size * es;
  t->st.wire_bytes += (double)(t->tp.size - 1) * (double)n * (double)es;
  return loom_allgather(send, recv, (size_t)n, dt, t->g, &t->req[slot]);
}

static loom_status tp_scatter(void *user, int slot, const float *send,
                              float *recv, int64_t n) {
  loom_tp_group *t = user;
  LOOM_TRY(tp_slot_ok(slot));
  t->st.scatters++;
  t->st.seq_bytes += (uint64_t)n * (uint64_t)t->tp.size * sizeof(float);
  t->st.wire_bytes += (double)(t->tp.size - 1) * (double)n * 4.0;
  return loom_reduce_scatter(send, recv, (size_t)n, LOOM_F32, LOOM_SUM, t->g,
                             &t->req[slot]);
}

static loom_status tp_wait(void *user, int slot) {
  loom_tp_group *t = user;
  if (slot < 0 || slot >= LOOM_TP_SLOTS)
    return loom_error(LOOM_ERR_INVALID_ARG, "tensor parallel: no slot %d",
                      slot);
  bool done;
  loom_status s = loom_test(&t->req[slot], &done);
  if (done)
    return s;
  double t0 = loom_time_now();
  s = loom_wait(&t->req[slot]);
  t->st.wait_s += loom_time_now() - t0;
  return s;
}

loom_status loom_tp_group_new(loom_tp_group **out, loom_group *g) {
  *out = NULL;
  loom_tp_group *t = loom_calloc(1, sizeof *t);
  if (!t)
    return LOOM_ERR_NOMEM;
  t->g = g;
  t->tp.size = loom_group_size(g);
  t->tp.rank = loom_group_rank(g);
  t->tp.start = tp_start;
  t->tp.wait = tp_wait;
  t->tp.gather = tp_gather;
  t->tp.scatter = tp_scatter;
  t->tp.user = t;
  *out = t;
  return LOOM_OK;
}

const loom_tp *loom_tp_group_tp(const loom_tp_group *t) { return &t->tp; }

void loom_tp_group_stats(const loom_tp_group *t, loom_tp_stats *out) {
  *out = t->st;
}

void loom_tp_group_free(loom_tp_group *t) {
  if (!t)
    return;
  (void)loom_wait_all(t->req, LOOM_TP_SLOTS);
  loom_free(t);
}

/* -------------------------------------------------------------- the map */

/* One view as this layout holds it: its local range and whether it is
 * whole on every rank. */
typedef struct tp_view {
  int64_t local, numel; /* the local view */
  int64_t whole, whole_numel;
  bool shared;
} tp_view;

struct loom_tp_map {
  int size, nviews;
  int64_t local_numel, whole_numel;
  tp_view *views;   /* (nviews) */
  loom_tp_seg *seg; /* every rank's segments, rank after rank */
  int *first;       /* (size + 1) into seg */
};

/* Appends the segments of view i for rank r; *n counts them (seg NULL:
 * counting only). */
static loom_status view_segs(const loom_model *local, const loom_model *whole,
                             int i, int T, int r, loom_tp_seg *seg, int *n) {
  const loom_param *lv = loom_model_view(local, i);
  const loom_param *wv = loom_model_view(whole, i);
  int blocks = 1;
  loom_tp_split split = loom_model_view_tp(local, i, &blocks);
  bool same = lv->ndim == wv->ndim;
  for (int d = 0; same && d < lv->ndim; d++)
    same =
        lv->shape[d] == wv->shape[d] ||
        (d == 0 && split == LOOM_TP_ROWS && lv->shape[0] * T == wv->shape[0]) ||
        (d == 1 && split == LOOM_TP_COLS && lv->shape[1] * T == wv->shape[1]);
  if (strcmp(lv->name, wv->name) != 0 || !same ||
      (split == LOOM_TP_WHOLE && lv->numel != wv->numel) ||
      (split == LOOM_TP_ROWS && wv->shape[0] % ((int64_t)T * blocks) != 0) ||
      (split == LOOM_TP_COLS && lv->ndim != 2))
    return loom_error(LOOM_ERR_MISMATCH,
                      "tensor parallel: view %d is '%s' (%lld elements) in "
                      "the rank's model and '%s' (%lld) in the whole one, "
                      "which %d ranks do not cut that way",
                      i, lv->name, (long long)lv->numel, wv->name,
                      (long long)wv->numel, T);
#define PUT(l, w, k)                                                           \
  do {                                                                         \
    if (seg)                                                                   \
      seg[*n] = (loom_tp_seg){(l), (w), (k), i, split == LOOM_TP_WHOLE};       \
    (*n)++;                                                                    \
  } while (0)
  if (split == LOOM_TP_WHOLE) {
    PUT(lv->offset, wv->offset, lv->numel);
  } else if (split == LOOM_TP_ROWS) {
    int64_t R = wv->shape[0], row = wv->numel / R;
    int64_t rb = R / blocks, lr = rb / T; /* rows a block, a rank's of it */
    for (int b = 0; b < blocks; b++)
      PUT(lv->offset + b * lr * row, wv->offset + (b * rb + r * lr) * row,
          lr * row);
  } else {
    int64_t R = wv->shape[0], K = wv->shape[1], k = K / T;
    for (int64_t j = 0; j < R; j++)
      PUT(lv->offset + j * k, wv->offset + j * K + r * k, k);
  }
#undef PUT
  return LOOM_OK;
}

loom_status loom_tp_map_new(loom_tp_map **out, const loom_model *local,
                            const loom_model *whole, int size) {
  *out = NULL;
  int nv = loom_model_num_views(local);
  if (size < 1 || nv != loom_model_num_views(whole))
    return loom_error(LOOM_ERR_MISMATCH,
                      "tensor parallel: the rank's model has %d parameters, "
                      "the whole one %d (group of %d)",
                      nv, loom_model_num_views(whole), size);
  loom_tp_map *m = loom_calloc(1, sizeof *m);
  if (!m)
    return LOOM_ERR_NOMEM;
  loom_status s = LOOM_OK;
  m->size = size;
  m->nviews = nv;
  m->local_numel = loom_model_num_params(local);
  m->whole_numel = loom_model_num_params(whole);
  m->views = loom_calloc((size_t)(nv ? nv : 1), sizeof *m->views);
  m->first = loom_calloc((size_t)size + 1, sizeof *m->first);
  if (!m->views || !m->first) {
    s = LOOM_ERR_NOMEM;
    goto fail;
  }
  int per = 0;
  for (int i = 0; i < nv; i++) {
    LOOM_TRY_GOTO(s, view_segs(local, whole, i, size, 0, NULL, &per), fail);
    const loom_param *lv = loom_model_view(local, i);
    const loom_param *wv = loom_model_view(whole, i);
    int blocks;
    m->views[i] =
        (tp_view){lv->offset, lv->numel, wv->offset, wv->numel,
                  loom_model_view_tp(local, i, &blocks) == LOOM_TP_WHOLE};
  }
  m->seg = loom_calloc((size_t)per * (size_t)size + 1, sizeof *m->seg);
  if (!m->seg) {
    s = LOOM_ERR_NOMEM;
    goto fail;
  }
  for (int r = 0; r < size; r++) {
    int n = 0;
    for (int i = 0; i < nv; i++)
      LOOM_TRY_GOTO(s,
                    view_segs(local, whole, i, size, r,
                              m->seg + (size_t)r * (size_t)per, &n),
                    fail);
    m->first[r + 1] = m->first[r] + n;
  }
  *out = m;
  return LOOM_OK;
fail:
  loom_tp_map_free(m);
  return s;
}

void loom_tp_map_free(loom_tp_map *m) {
  if (!m)
    return;
  loom_free(m->views);
  loom_free(m->seg);
  loom_free(m->first);
  loom_free(m);
}

const loom_tp_seg *loom_tp_map_segs(const loom_tp_map *m, int rank, int *n) {
  if (rank < 0 || rank >= m->size) {
    *n = 0;
    return NULL;
  }
  *n = m->first[rank + 1] - m->first[rank];
  return m->seg + m->first[rank];
}

int64_t loom_tp_map_whole_numel(const loom_tp_map *m) { return m->whole_numel; }

/* Copies view i's segments of `rank` from `src`, which holds the whole
 * view's elements [base, base + ...) of the whole layout, into local
 * (element lbase of the rank's layout). */
static void copy_view(const loom_tp_map *m, int rank, int i, const float *src,
                      int64_t base, float *local, int64_t lbase) {
  int n;
  const loom_tp_seg *s = loom_tp_map_segs(m, rank, &n);
  for (int k = 0; k < n; k++)
    if (s[k].view == i)
      memcpy(local + (s[k].local - lbase), src + (s[k].whole - base),
             (size_t)s[k].numel * sizeof(float));
}

/* Whether view v lies within one of the ranges (all views without). */
static bool wanted(const tp_view *v, const loom_range *r, int nr) {
  if (!r)
    return true;
  for (int k = 0; k < nr; k++)
    if (v->local >= r[k].offset &&
        v->local + v->numel <= r[k].offset + r[k].numel)
      return true;
  return false;
}

loom_status loom_tp_map_fill(const loom_tp_map *m, int rank,
                             const loom_range *ranges, int nranges,
                             loom_tp_fetch_fn fetch, void *user, float *local,
                             int64_t base) {
  int64_t big = 0;
  for (int i = 0; i < m->nviews; i++)
    if (!m->views[i].shared && m->views[i].whole_numel > big)
      big = m->views[i].whole_numel;
  float *tmp = loom_malloc((size_t)(big ? big : 1) * sizeof(float));
  if (!tmp)
    return LOOM_ERR_NOMEM;
  loom_status s = LOOM_OK;
  for (int i = 0; i < m->nviews && s == LOOM_OK; i++) {
    const tp_view *v = &m->views[i];
    if (!wanted(v, ranges, nranges))
      continue;
    if (v->shared) {
      s = fetch(user, i, v->whole, v->whole + v->numel,
                local + (v->local - base));
      continue;
    }
    s = fetch(user, i, v->whole, v->whole + v->whole_numel, tmp);
    if (s == LOOM_OK)
      copy_view(m, rank, i, tmp, v->whole, local, base);
  }
  loom_free(tmp);
  return s;
}

typedef struct draw_ctx {
  const loom_model *whole;
  const loom_tp_map *m;
  float *view; /* a whole view's draws */
} draw_ctx;

static loom_status draw_fetch(void *user, int i, int64_t begin, int64_t end,
                              float *dst) {
  draw_ctx *c = user;
  const tp_view *v = &c->m->views[i];
  if (begin == v->whole && end == v->whole + v->whole_numel)
    return loom_model_draw_view(c->whole, i, dst);
  LOOM_TRY(loom_model_draw_view(c->whole, i, c->view));
  memcpy(dst, c->view + (begin - v->whole),
         (size_t)(end - begin) * sizeof(float));
  return LOOM_OK;
}

loom_status loom_tp_map_init(const loom_tp_map *m, int rank,
                             const loom_model *whole, const loom_range *ranges,
                             int nranges, float *local) {
  draw_ctx c = {whole, m, NULL};
  int64_t big = 0;
  for (int i = 0; i < m->nviews; i++)
    if (m->views[i].whole_numel > big)
      big = m->views[i].whole_numel;
  c.view = loom_malloc((size_t)(big ? big : 1) * sizeof(float));
  if (!c.view)
    return LOOM_ERR_NOMEM;
  loom_status s =
      loom_tp_map_fill(m, rank, ranges, nranges, draw_fetch, &c, local, 0);
  loom_free(c.view);
  return s;
}

loom_status loom_tp_map_sumsq(const loom_tp_map *m, loom_group *g,
                              const float *grads, int64_t lo, int64_t hi,
                              double *out) {
  /* each cut view's part summed over the group, the whole ones once; a
   * view that [lo, hi) splits (ZeRO-2's cuts) counts its piece within */
  double part[2] = {0, 0};
  for (int i = 0; i < m->nviews; i++) {
    const tp_view *v = &m->views[i];
    int64_t a = v->local > lo ? v->local : lo;
    int64_t b = v->local + v->numel < hi ? v->local + v->numel : hi;
    if (a < b)
      part[v->shared] += loom_grad_sumsq(grads + a, b - a);
  }
  double cut = part[0];
  if (g && loom_group_size(g) > 1) {
    loom_req r = LOOM_REQ_INIT;
    LOOM_TRY(loom_allreduce(&part[0], &cut, 1, LOOM_F64, LOOM_SUM, g, &r));
    LOOM_TRY(loom_wait(&r));
  }
  *out = cut + part[1];
  return LOOM_OK;
}

enum { TAG_TP_GATHER = 121 };

/* Elements of rank s's own (cut) segments within [lo, hi) of the whole
 * layout, in order: with buf, packed from (pack) or unpacked into (dst
 * relative to lo) the local buffer or dst. Returns how many. */
static int64_t walk(const loom_tp_map *m, int s, int64_t lo, int64_t hi,
                    bool cut_only, const float *local, int64_t base,
                    float *packed, const float *unpack, float *dst) {
  int n;
  const loom_tp_seg *sg = loom_tp_map_segs(m, s, &n);
  int64_t count = 0;
  for (int k = 0; k < n; k++) {
    if (cut_only && sg[k].shared)
      continue;
    int64_t a = sg[k].whole > lo ? sg[k].whole : lo;
    int64_t e = sg[k].whole + sg[k].numel < hi ? sg[k].whole + sg[k].numel : hi;
    if (a >= e)
      continue;
    size_t bytes = (size_t)(e - a) * sizeof(float);
    if (packed) /* this rank's elements into a message */
      memcpy(packed + count, local + (sg[k].local - base) + (a - sg[k].whole),
             bytes);
    else if (unpack) /* a message's elements into place */
      memcpy(dst + (a - lo), unpack + count, bytes);
    else if (local) /* this rank's own elements into place */
      memcpy(dst + (a - lo), local + (sg[k].local - base) + (a - sg[k].whole),
             bytes);
    count += e - a;
  }
  return count;
}

loom_status loom_tp_map_gather(const loom_tp_map *m, loom_group *g,
                               const float *local, int64_t base,
                               const int64_t *lo, const int64_t *hi,
                               float *dst) {
  int T = m->size, t = g ? loom_group_rank(g) : 0;
  if (!g || loom_group_size(g) != T)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensor parallel: a gather over a group of %d, the map "
                      "is of %d",
                      g ? loom_group_size(g) : 0, T);
  /* mine, whole and cut, in place */
  (void)walk(m, t, lo[t], hi[t], false, local, base, NULL, NULL, dst);
  if (T == 1)
    return LOOM_OK;
  int64_t nsend = 0, nrecv = 0;
  int64_t *soff = loom_calloc((size_t)T + 1, sizeof *soff);
  int64_t *roff = loom_calloc((size_t)T + 1, sizeof *roff);
  loom_req *req = loom_calloc(2 * (size_t)T, sizeof *req);
  float *sbuf = NULL, *rbuf = NULL;
  loom_status s = LOOM_OK;
  if (!soff || !roff || !req) {
    s = LOOM_ERR_NOMEM;
    goto done;
  }
  for (int p = 0; p < T; p++) {
    soff[p + 1] = soff[p] + (p == t ? 0
                                    : walk(m, t, lo[p], hi[p], true, NULL, 0,
                                           NULL, NULL, NULL));
    roff[p + 1] = roff[p] + (p == t ? 0
                                    : walk(m, p, lo[t], hi[t], true, NULL, 0,
                                           NULL, NULL, NULL));
  }
  nsend = soff[T];
  nrecv = roff[T];
  sbuf = loom_malloc((size_t)(nsend ? nsend : 1) * sizeof(float));
  rbuf = loom_malloc((size_t)(nrecv ? nrecv : 1) * sizeof(float));
  if (!sbuf || !rbuf) {
    s = LOOM_ERR_NOMEM;
    goto done;
  }
  for (int p = 0; p < T && s == LOOM_OK; p++) {
    if (p == t)
      continue;
    if (roff[p + 1] > roff[p])
      s = loom_recv(rbuf + roff[p], (size_t)(roff[p + 1] - roff[p]), LOOM_F32,
                    p, TAG_TP_GATHER, g, &req[2 * p]);
    if (s == LOOM_OK && soff[p + 1] > soff[p]) {
      (void)walk(m, t, lo[p], hi[p], true, local, base, sbuf + soff[p], NULL,
                 NULL);
      s = loom_send(sbuf + soff[p], (size_t)(soff[p + 1] - soff[p]), LOOM_F32,
                    p, TAG_TP_GATHER, g, &req[2 * p + 1]);
    }
  }
  loom_status ws = loom_wait_all(req, 2 * (size_t)T);
  if (s == LOOM_OK)
    s = ws;
  for (int p = 0; p < T && s == LOOM_OK; p++)
    if (p != t)
      (void)walk(m, p, lo[t], hi[t], true, NULL, 0, NULL, rbuf + roff[p], dst);
done:
  loom_free(soff);
  loom_free(roff);
  loom_free(req);
  loom_free(sbuf);
  loom_free(rbuf);
  return s;
}
