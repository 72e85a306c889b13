/* Hierarchical all-reduce for a group whose ranks span hosts, the same
 * number L on each: a reduce-scatter inside each host over the
 * shared-memory path leaves local rank i with the host's sum of piece i; the
 * L ranks holding piece i, one a host, all-reduce it over MPI; an all-gather
 * inside each host puts the pieces back together. Between hosts every rank
 * sends 1/L of the buffer, the host's L ranks in parallel, where the flat
 * algorithm runs one ring or tree of all ranks across the links.
 *
 * Between hosts the piece goes around a ring of the H ranks that hold it
 * (reduce-scatter, then all-gather, H-1 steps each, MPI_Isend/MPI_Irecv):
 * every rank sends and receives 2(H-1)/H of its piece, both directions of
 * every link busy at once. MPI's own nonblocking all-reduce (Open MPI's
 * libnbc) reduces to a root and broadcasts for fewer than 4 ranks, which
 * uses one direction at a time: half the link.
 *
 * Every rank ends with the same bits: each piece is reduced inside a host by
 * one rank, each segment of it between hosts along the ring in a fixed
 * order, then copied. The order of the sum differs from the flat
 * algorithm's (as MPI's own algorithms differ by size), so results agree to
 * rounding; deterministic DDP never depends on it (its tree reduces pairs).
 *
 * Reduce-scatter and all-gather(v) take the same two levels where each
 * host's ranks are consecutive in the group (rank = host * L + local rank,
 * as launchers place them): a reduce-scatter reduces, inside the host, the
 * blocks of each host's ranks in turn (local rank i gets the host's sum of
 * the block of rank (h, i)), then the H ranks of local rank i reduce-scatter
 * those H partial blocks around a ring; an all-gather first passes each
 * rank's piece around the ring of its local rank, then gathers each host's
 * pieces inside the host. Between hosts every rank sends (H-1)/H of what
 * the flat ring would send across all P ranks; the host's steps overlap the
 * ring's. Other placements keep MPI's flat algorithms. */
#include "internal.h"

#ifdef LOOM_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

/* The buffer goes in blocks, pipelined: while MPI carries blocks k..k+3
 * between hosts, the host reduces the next and gathers the oldest. Each
 * local rank's piece of a block is LOOM_COMM_CHUNK bytes (256 KiB): on
 * 2 emulated hosts x 2 ranks at 200 Mbit/s and 1 Gbit/s, 1 MiB pieces kept
 * the links 10-20% less busy (a ring step waits for its whole segment), and
 * fewer blocks ahead left them idle between steps. The host's steps run in
 * one fixed order on every rank (RS 0..3, AG 0, RS 4, AG 1, ...), whatever
 * the timing. */
#define HIER_AHEAD 4 /* blocks reduced ahead of the gather (MPI in flight) */

struct loom_hier {
  loom_shm *shm;  /* this host's ranks */
  MPI_Comm cross; /* the ranks of this local rank, one a host */
  int lrank, L, H;
  size_t chunk_bytes;
  uint64_t seq;        /* sub-operations entered on shm */
  uint64_t n_ops;      /* all-reduces taken (tests) */
  uint64_t n_rs, n_ag; /* reduce-scatters and all-gathers taken */
  int hrank;           /* this host's place among the hosts (cross rank) */
  loom_comm_op kind;   /* the operation in flight */
  bool host_major;     /* group rank = hrank * L + lrank on every rank */
  size_t *gcounts;     /* [L*H] every rank's count (all-gather) */
  size_t *displs;      /* [L*H] where each rank's piece starts */
  char *acc;           /* [H * count] reduce-scatter: the host's partial
                          block for each host */
  size_t acc_bytes;
  int ring_s, sub_j; /* reduce-scatter/all-gather: ring steps and host
                        steps done */
  bool broken;       /* an all-reduce failed midway: its peers and requests
                        are out of step, so every later one fails at once */
  /* The operation in flight (one collective a group at a time). */
  loom_op sub;    /* the host's step in flight */
  bool sub_on;    /* sub is running */
  bool sub_rs;    /* it is a reduce-scatter (else an all-gather) */
  size_t *counts; /* [L] the local ranks' pieces of sub's block */
  size_t block;   /* elements a block */
  size_t nblocks, next_rs, next_ag; /* blocks; next of each step */
  /* Blocks between hosts, block k in flight[k % HIER_AHEAD]. */
  struct flight {
    int step;          /* ring steps done: H-1 reduce, H-1 gather */
    bool posted;       /* this step's send and receive are posted */
    MPI_Request rq[2]; /* send, receive */
    char *tmp;         /* a segment received to be reduced */
    size_t tmp_bytes;
  } flight[HIER_AHEAD];
};

loom_status loom_hier_open(loom_hier **out, loom_shm *shm, void *cross,
                           int lrank, int local_size, int hosts,
                           bool host_major, size_t chunk_bytes) {
  loom_hier *h = loom_calloc(1, sizeof *h);
  size_t *counts = loom_calloc((size_t)local_size, sizeof *counts);
  size_t P = (size_t)local_size * (size_t)hosts;
  size_t *gcounts = loom_calloc(P, sizeof *gcounts);
  size_t *displs = loom_calloc(P, sizeof *displs);
  if (!h || !counts || !gcounts || !displs) {
    loom_free(h);
    loom_free(counts);
    loom_free(gcounts);
    loom_free(displs);
    return LOOM_ERR_NOMEM;
  }
  h->gcounts = gcounts;
  h->displs = displs;
  h->host_major = host_major;
  h->shm = shm;
  h->cross = *(MPI_Comm *)cross;
  h->lrank = lrank;
  h->L = local_size;
  h->H = hosts;
  h->chunk_bytes = chunk_bytes;
  h->counts = counts;
  MPI_Comm_rank(h->cross, &h->hrank);
  for (int w = 0; w < HIER_AHEAD; w++)
    h->flight[w].rq[0] = h->flight[w].rq[1] = MPI_REQUEST_NULL;
  *out = h;
  return LOOM_OK;
}

void loom_hier_close(loom_hier *h) {
  if (!h)
    return;
  LOOM_DEBUG("comm: hierarchical path: %llu all-reduces, %llu "
             "reduce-scatters, %llu all-gathers",
             (unsigned long long)h->n_ops, (unsigned long long)h->n_rs,
             (unsigned long long)h->n_ag);
  for (int w = 0; w < HIER_AHEAD; w++) {
    /* A failed or abandoned all-reduce may have left receives posted into
     * tmp: cancelled before it (and the communicator) goes. */
    for (int q = 0; q < 2; q++)
      if (h->flight[w].rq[q] != MPI_REQUEST_NULL) {
        MPI_Cancel(&h->flight[w].rq[q]);
        MPI_Request_free(&h->flight[w].rq[q]);
      }
    loom_free(h->flight[w].tmp);
    loom_mem_sub(LOOM_MEM_COMM, h->flight[w].tmp_bytes);
  }
  loom_shm_close(h->shm);
  if (h->cross != MPI_COMM_NULL)
    MPI_Comm_free(&h->cross);
  loom_free(h->counts);
  loom_free(h->gcounts);
  loom_free(h->displs);
  loom_free(h->acc);
  loom_mem_sub(LOOM_MEM_COMM, h->acc_bytes);
  loom_free(h);
}

bool loom_hier_takes(const loom_hier *h, const loom_op *op) {
  if (!h)
    return false;
  /* Every rank decides alike: on the kind, the count (the same on every
   * rank but all-gather-v's own) and the counts (the same array). */
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
    return op->count > 0;
  case LOOM_COMM_REDUCE_SCATTER:
  case LOOM_COMM_ALLGATHER:
    return h->host_major && op->count > 0 && op->count <= (size_t)INT_MAX;
  case LOOM_COMM_ALLGATHERV:
    if (!h->host_major)
      return false;
    size_t total = 0;
    for (int q = 0; q < h->L * h->H; q++) {
      if (op->counts[q] > (size_t)INT_MAX)
        return false;
      total += op->counts[q];
    }
    return total > 0;
  default:
    return false;
  }
}

uint64_t loom_hier_count(const loom_hier *h) { return h ? h->n_ops : 0; }

void loom_hier_counts(const loom_hier *h, uint64_t *allreduce,
                      uint64_t *reduce_scatter, uint64_t *allgather) {
  *allreduce = h ? h->n_ops : 0;
  *reduce_scatter = h ? h->n_rs : 0;
  *allgather = h ? h->n_ag : 0;
}

static loom_redop summed(loom_redop op) {
  return op == LOOM_AVG ? LOOM_SUM : op;
}

static int fail(loom_op *op, int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  loom_comm_op_fail(op, LOOM_ERR_REMOTE, "%s between hosts: %s: %s",
                    loom_comm_op_name(op->kind), what, msg);
  return 1;
}

/* Block k of op: its first element and length; this rank's piece of it. */
static void block_of(const loom_hier *h, const loom_op *op, size_t k,
                     size_t *lo, size_t *len) {
  *lo = k * h->block;
  *len = op->count - *lo < h->block ? op->count - *lo : h->block;
}

/* Local rank i's piece of block k (on cache lines; the last ones may be
 * short or empty): its first element in the buffer and its length. */
static void piece_of(const loom_hier *h, const loom_op *op, size_t k, int i,
                     size_t *at, size_t *n) {
  size_t e = loom_dtype_size(op->dtype), lo, len;
  block_of(h, op, k, &lo, &len);
  size_t align = 64 / e ? 64 / e : 1;
  size_t seg = (len + (size_t)h->L - 1) / (size_t)h->L;
  seg = (seg + align - 1) / align * align;
  size_t from = (size_t)i * seg < len ? (size_t)i * seg : len;
  *at = lo + from;
  *n = len - from < seg ? len - from : seg;
}

/* Fills counts with the local ranks' pieces of block k (for the host's
 * step about to start; never while one runs); returns this rank's offset. */
static size_t pieces(loom_hier *h, const loom_op *op, size_t k) {
  size_t mine = 0, at;
  for (int i = 0; i < h->L; i++) {
    piece_of(h, op, k, i, &at, &h->counts[i]);
    if (i == h->lrank)
      mine = at;
  }
  return mine;
}

/* Starts the host's step on block k: its reduce-scatter (rs) or its
 * all-gather. */
static void enter_sub(loom_hier *h, const loom_op *op, size_t k, bool rs) {
  size_t e = loom_dtype_size(op->dtype), lo, len;
  block_of(h, op, k, &lo, &len);
  size_t mine = pieces(h, op, k);
  char *piece = (char *)op->recv + mine * e;
  loom_op *s = &h->sub;
  memset(s, 0, sizeof *s);
  s->kind = rs ? LOOM_COMM_REDUCE_SCATTER : LOOM_COMM_ALLGATHERV;
  s->dtype = op->dtype;
  s->redop = summed(op->redop);
  s->root = -1;
  s->counts = h->counts;
  s->count = h->counts[h->lrank];
  s->send = rs ? (const char *)op->send + lo * e : piece;
  s->recv = rs ? (void *)piece : (char *)op->recv + lo * e;
  s->group = op->group;
  s->collective = true;
  s->seq = ++h->seq;
  s->started = true;
  loom_comm_desc d;
  loom_comm_desc_of(s, h->L, &d);
  loom_shm_enter(h->shm, s, &d);
  h->sub_on = true;
  h->sub_rs = rs;
}

/* Segment j of H of a piece of n elements. */
static void segment(size_t n, int H, int j, size_t *lo, size_t *len) {
  size_t seg = (n + (size_t)H - 1) / (size_t)H;
  *lo = (size_t)j * seg < n ? (size_t)j * seg : n;
  *len = n - *lo < seg ? n - *lo : seg;
}

/* Tests a ring step's two requests: 1 once both ends are done, 0 while
 * they run, -1 on an error (op failed). One MPI_Test each (MPICH's
 * MPI_Testall with MPI_STATUSES_IGNORE trips gcc's -Wstringop-overflow). */
static int flight_test(struct flight *f, loom_op *op) {
  bool all = true;
  for (int q = 0; q < 2; q++) {
    if (f->rq[q] == MPI_REQUEST_NULL)
      continue;
    int flag = 0;
    int rc = MPI_Test(&f->rq[q], &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      fail(op, rc, "ring step");
      return -1;
    }
    all = all && flag;
  }
  return all;
}

/* Grows *buf (*have bytes, counted as communication memory) to at least
 * bytes; false when out of memory (*buf is then NULL). */
static bool grow_buf(char **buf, size_t *have, size_t bytes) {
  if (*have >= bytes)
    return true;
  loom_free(*buf);
  loom_mem_sub(LOOM_MEM_COMM, *have);
  *buf = loom_malloc(bytes);
  *have = *buf ? bytes : 0;
  loom_mem_add(LOOM_MEM_COMM, *have);
  return *buf != NULL;
}

/* Room for a received segment of `bytes` in f->tmp; false (op failed) when
 * out of memory. */
static bool flight_tmp(struct flight *f, size_t bytes, loom_op *op) {
  if (grow_buf(&f->tmp, &f->tmp_bytes, bytes))
    return true;
  loom_comm_op_fail(op, LOOM_ERR_NOMEM,
                    "%s between hosts: no memory for a received segment",
                    loom_comm_op_name(op->kind));
  return false;
}

/* Posts ring step f->step of block k: reduce-scatter steps send segment
 * (r - s) and receive (r - s - 1) into tmp; all-gather steps send
 * (r + 1 - t) and receive (r - t) in place. */
static int post_step(loom_hier *h, loom_op *op, size_t k) {
  struct flight *f = &h->flight[k % HIER_AHEAD];
  size_t e = loom_dtype_size(op->dtype), mine, n;
  piece_of(h, op, k, h->lrank, &mine, &n);
  char *piece = (char *)op->recv + mine * e;
  int H = h->H, r = 0;
  MPI_Comm_rank(h->cross, &r);
  bool rs = f->step < H - 1;
  int t = rs ? f->step : f->step - (H - 1);
  int sj = rs ? r - t : r + 1 - t, rj = rs ? r - t - 1 : r - t;
  sj = ((sj % H) + H) % H;
  rj = ((rj % H) + H) % H;
  size_t slo, slen, rlo, rlen;
  segment(n, H, sj, &slo, &slen);
  segment(n, H, rj, &rlo, &rlen);
  if (rs && !flight_tmp(f, rlen * e, op))
    return 1;
  MPI_Datatype dt;
  if (loom_comm_mpi_types(op->dtype, LOOM_SUM, &dt, NULL) != LOOM_OK) {
    loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED, "%s", loom_last_error());
    return 1;
  }
  /* One tag a block slot and step: both ends post them in the same order. */
  int tag = 1000 +
            (int)((k % HIER_AHEAD) * (size_t)(2 * H) + (size_t)f->step) % 30000;
  int rc = MPI_Irecv(rs ? (void *)f->tmp : piece + rlo * e, (int)rlen, dt,
                     (r - 1 + H) % H, tag, h->cross, &f->rq[1]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Isend(piece + slo * e, (int)slen, dt, (r + 1) % H, tag, h->cross,
                   &f->rq[0]);
  if (rc != MPI_SUCCESS)
    return fail(op, rc, "ring step");
  f->posted = true;
  return 0;
}

/* Starts block k between hosts (nothing to do for an empty piece). */
static int post_cross(loom_hier *h, loom_op *op, size_t k) {
  struct flight *f = &h->flight[k % HIER_AHEAD];
  f->step = 0;
  f->posted = false;
  f->rq[0] = f->rq[1] = MPI_REQUEST_NULL;
  size_t mine, n;
  piece_of(h, op, k, h->lrank, &mine, &n);
  if (h->H < 2 || n == 0) {
    f->step = 2 * (h->H - 1);
    return 0;
  }
  return post_step(h, op, k);
}

/* Advances block k's ring; 1 once it is over, 0 while it runs, -1 on an
 * error (op failed). */
static int cross_done(loom_hier *h, loom_op *op, size_t k, bool *moved) {
  struct flight *f = &h->flight[k % HIER_AHEAD];
  int H = h->H;
  while (f->step < 2 * (H - 1)) {
    int all = flight_test(f, op);
    if (all <= 0)
      return all;
    *moved = true;
    if (f->step < H - 1) { /* add the received segment to ours */
      size_t e = loom_dtype_size(op->dtype);
      size_t mine, n, lo, len;
      piece_of(h, op, k, h->lrank, &mine, &n);
      int r = 0;
      MPI_Comm_rank(h->cross, &r);
      segment(n, H, (((r - f->step - 1) % H) + H) % H, &lo, &len);
      char *at = (char *)op->recv + (mine + lo) * e;
      const void *in[2] = {at, f->tmp};
      loom_comm_reduce(at, in, 2, len, op->dtype, summed(op->redop), 1);
    }
    f->step++;
    f->posted = false;
    if (f->step < 2 * (H - 1) && post_step(h, op, k))
      return -1;
  }
  return 1;
}

static bool cross_in_flight(const loom_hier *h) {
  for (int w = 0; w < HIER_AHEAD; w++)
    if (h->flight[w].posted)
      return true;
  return false;
}

static int progress(loom_hier *h, loom_op *op, bool *moved, bool *poll);
static int rsag_progress(loom_hier *h, loom_op *op, bool *moved, bool *poll);

int loom_hier_progress(loom_hier *h, loom_op *op, bool *moved, bool *poll) {
  int done = op->kind == LOOM_COMM_ALLREDUCE
                 ? progress(h, op, moved, poll)
                 : rsag_progress(h, op, moved, poll);
  if (done && op->status != LOOM_OK)
    h->broken = true;
  return done;
}

static int progress(loom_hier *h, loom_op *op, bool *moved, bool *poll) {
  /* MPI moves its messages only inside MPI calls: test what is in flight
   * on every pass, so blocks cross while the host reduces and gathers. */
  if (cross_in_flight(h)) {
    *poll = true;
    for (size_t k = h->next_ag; k < h->next_rs; k++)
      if (cross_done(h, op, k, moved) < 0)
        return 1;
  }
  for (;;) {
    if (h->sub_on) {
      if (!loom_shm_run(h->shm, &h->sub, moved))
        return 0;
      h->sub_on = false;
      *moved = true;
      if (h->sub_rs) {
        if (post_cross(h, op, h->next_rs))
          return 1;
        h->next_rs++;
      } else {
        h->next_ag++;
      }
    }
    if (h->next_ag == h->nblocks)
      break;
    /* The fixed order: reduce ahead while fewer than HIER_AHEAD blocks
     * wait for MPI, else gather the oldest once MPI has it. */
    if (h->next_rs < h->nblocks && h->next_rs < h->next_ag + HIER_AHEAD) {
      enter_sub(h, op, h->next_rs, true);
      continue;
    }
    *poll = true;
    int done = cross_done(h, op, h->next_ag, moved);
    if (done < 0)
      return 1;
    if (!done)
      return 0;
    enter_sub(h, op, h->next_ag, false);
  }
  if (op->redop == LOOM_AVG)
    loom_comm_divide(op->recv, op->count, op->dtype, h->L * h->H);
  h->n_ops++;
  return 1;
}

/* ------------------------------------ reduce-scatter and all-gather(v) */

/* The host step j of a reduce-scatter or all-gather: the hosts in the order
 * the ring needs them (one before this one's first, this one's last for a
 * reduce-scatter; this one's first for an all-gather). */
static int rsag_host(const loom_hier *h, const loom_op *op, int j) {
  int off = op->kind == LOOM_COMM_REDUCE_SCATTER ? -1 - j : -j;
  return ((h->hrank + off) % h->H + h->H) % h->H;
}

/* Starts host step j: reduce-scatter the blocks of host x's ranks into
 * partial block x, or all-gather the pieces of host x's ranks. */
static void rsag_enter_sub(loom_hier *h, const loom_op *op, int j) {
  int x = rsag_host(h, op, j), L = h->L;
  size_t e = loom_dtype_size(op->dtype);
  bool rs = op->kind == LOOM_COMM_REDUCE_SCATTER;
  loom_op *s = &h->sub;
  memset(s, 0, sizeof *s);
  s->kind = rs ? LOOM_COMM_REDUCE_SCATTER : LOOM_COMM_ALLGATHERV;
  s->dtype = op->dtype;
  s->redop = summed(op->redop);
  s->root = -1;
  if (rs) {
    for (int i = 0; i < L; i++)
      h->counts[i] = op->count;
    s->counts = h->counts;
    s->count = op->count;
    s->send = (const char *)op->send + (size_t)x * (size_t)L * op->count * e;
    s->recv = h->acc + (size_t)x * op->count * e;
  } else {
    int q0 = x * L;
    s->counts = h->gcounts + q0;
    s->count = h->gcounts[q0 + h->lrank];
    s->recv = (char *)op->recv + h->displs[q0] * e;
    s->send = (char *)op->recv + h->displs[q0 + h->lrank] * e;
  }
  s->group = op->group;
  s->collective = true;
  s->seq = ++h->seq;
  s->started = true;
  loom_comm_desc d;
  loom_comm_desc_of(s, L, &d);
  loom_shm_enter(h->shm, s, &d);
  h->sub_on = true;
  h->sub_rs = rs;
}

/* Posts ring step t. Reduce-scatter: send partial block (r-t-1), receive
 * the previous host's (r-t-2) into tmp. All-gather: pass on the piece of
 * host (r-t), receive host (r-t-1)'s in place. */
static int rsag_post(loom_hier *h, loom_op *op) {
  struct flight *f = &h->flight[0];
  int H = h->H, r = h->hrank, t = h->ring_s;
  size_t e = loom_dtype_size(op->dtype);
  MPI_Datatype dt;
  if (loom_comm_mpi_types(op->dtype, LOOM_SUM, &dt, NULL) != LOOM_OK) {
    loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED, "%s", loom_last_error());
    return 1;
  }
  const void *sb;
  void *rb;
  size_t sn, rn;
  if (op->kind == LOOM_COMM_REDUCE_SCATTER) {
    int sj = ((r - t - 1) % H + H) % H;
    sn = rn = op->count;
    if (!flight_tmp(f, rn * e, op))
      return 1;
    sb = h->acc + (size_t)sj * op->count * e;
    rb = f->tmp;
  } else {
    int qs = (((r - t) % H + H) % H) * h->L + h->lrank;
    int qr = (((r - t - 1) % H + H) % H) * h->L + h->lrank;
    sn = h->gcounts[qs];
    rn = h->gcounts[qr];
    sb = (const char *)op->recv + h->displs[qs] * e;
    rb = (char *)op->recv + h->displs[qr] * e;
  }
  int tag = 900 + t % 30000;
  int rc =
      MPI_Irecv(rb, (int)rn, dt, (r - 1 + H) % H, tag, h->cross, &f->rq[1]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Isend(sb, (int)sn, dt, (r + 1) % H, tag, h->cross, &f->rq[0]);
  if (rc != MPI_SUCCESS)
    return fail(op, rc, "ring step");
  f->posted = true;
  return 0;
}

/* Reduce-scatter: ring step t may start once partial block (r-t-1) is
 * reduced inside the host (host step t), and its received block is added
 * once block (r-t-2) is (host step t+1). All-gather: the host gathers host
 * j's pieces once ring step j-1 brought them; the ring runs freely. */
static int rsag_progress(loom_hier *h, loom_op *op, bool *moved, bool *poll) {
  struct flight *f = &h->flight[0];
  int H = h->H;
  bool rs = op->kind == LOOM_COMM_REDUCE_SCATTER;
  size_t e = loom_dtype_size(op->dtype);
  for (;;) {
    bool step = false;
    if (f->posted) {
      *poll = true;
      int done = flight_test(f, op);
      if (done < 0)
        return 1;
      if (done && (!rs || h->sub_j >= h->ring_s + 2)) {
        if (rs) {
          int x = ((h->hrank - h->ring_s - 2) % H + H) % H;
          char *at = h->acc + (size_t)x * op->count * e;
          const void *in[2] = {at, f->tmp};
          loom_comm_reduce(at, in, 2, op->count, op->dtype, summed(op->redop),
                           1);
        }
        f->posted = false;
        h->ring_s++;
        step = true;
      }
    }
    if (!f->posted && h->ring_s < H - 1 && (!rs || h->sub_j > h->ring_s)) {
      if (rsag_post(h, op))
        return 1;
      step = true;
    }
    if (h->sub_on) {
      if (loom_shm_run(h->shm, &h->sub, moved)) {
        h->sub_on = false;
        h->sub_j++;
        step = true;
      }
    }
    if (!h->sub_on && h->sub_j < H && (rs || h->ring_s >= h->sub_j)) {
      rsag_enter_sub(h, op, h->sub_j);
      step = true;
    }
    if (h->sub_j == H && h->ring_s == H - 1 && !h->sub_on && !f->posted)
      break;
    if (!step)
      return 0;
    *moved = true;
  }
  if (rs) {
    memcpy(op->recv, h->acc + (size_t)h->hrank * op->count * e, op->count * e);
    if (op->redop == LOOM_AVG)
      loom_comm_divide(op->recv, op->count, op->dtype, h->L * h->H);
    h->n_rs++;
  } else {
    h->n_ag++;
  }
  return 1;
}

static int rsag_start(loom_hier *h, loom_op *op) {
  size_t e = loom_dtype_size(op->dtype);
  int P = h->L * h->H;
  h->ring_s = h->sub_j = 0;
  h->sub_on = false;
  h->flight[0].posted = false;
  h->flight[0].rq[0] = h->flight[0].rq[1] = MPI_REQUEST_NULL;
  if (op->kind == LOOM_COMM_REDUCE_SCATTER) {
    if (!grow_buf(&h->acc, &h->acc_bytes, (size_t)h->H * op->count * e)) {
      loom_comm_op_fail(op, LOOM_ERR_NOMEM,
                        "reducescatter between hosts: no memory for %d "
                        "partial blocks of %zu elements",
                        h->H, op->count);
      return 1;
    }
  } else {
    size_t d = 0;
    for (int q = 0; q < P; q++) {
      h->gcounts[q] =
          op->kind == LOOM_COMM_ALLGATHERV ? op->counts[q] : op->count;
      h->displs[q] = d;
      d += h->gcounts[q];
    }
    int me = h->hrank * h->L + h->lrank;
    char *mine = (char *)op->recv + h->displs[me] * e;
    if (op->send != mine && h->gcounts[me])
      memcpy(mine, op->send, h->gcounts[me] * e);
  }
  bool moved = false, poll = false;
  return loom_hier_progress(h, op, &moved, &poll);
}

int loom_hier_start(loom_hier *h, loom_op *op) {
  if (h->broken) {
    loom_comm_op_fail(op, LOOM_ERR_REMOTE,
                      "an earlier collective between hosts failed midway; "
                      "this group's hierarchical path is out of step");
    return 1;
  }
  h->kind = op->kind;
  if (op->kind != LOOM_COMM_ALLREDUCE)
    return rsag_start(h, op);
  size_t e = loom_dtype_size(op->dtype);
  size_t piece = h->chunk_bytes / e;
  if (piece > (size_t)INT_MAX / 2)
    piece = (size_t)INT_MAX / 2;
  if (piece < 64)
    piece = 64;
  h->block = piece * (size_t)h->L;
  h->nblocks = (op->count + h->block - 1) / h->block;
  h->next_rs = h->next_ag = 0;
  h->sub_on = false;
  for (int w = 0; w < HIER_AHEAD; w++)
    h->flight[w].posted = false;
  bool moved = false, poll = false;
  return loom_hier_progress(h, op, &moved, &poll);
}

loom_shm *loom_hier_waiting_shm(const loom_hier *h) {
  return h && h->sub_on && !cross_in_flight(h) ? h->shm : NULL;
}

void loom_hier_stuck(loom_hier *h, char *buf, size_t n) {
  char inner[LOOM_OP_ERR_MAX];
  if (h->kind != LOOM_COMM_ALLREDUCE) {
    const char *what = loom_comm_op_name(h->kind);
    if (!h->sub_on) {
      snprintf(buf, n,
               "stalled in the %s between hosts (ring step %d of %d, local "
               "rank %d's ring, MPI); which hosts have not arrived is "
               "unknown",
               what, h->ring_s + 1, h->H - 1, h->lrank);
      return;
    }
    loom_shm_stuck(h->shm, &h->sub, inner, sizeof inner);
    snprintf(buf, n, "inside the host (%s, host step %d of %d), local %s", what,
             h->sub_j + 1, h->H, inner);
    return;
  }
  if (!h->sub_on) {
    snprintf(buf, n,
             "stalled in the all-reduce between hosts (block %zu of %zu, "
             "local rank %d's piece, MPI); which hosts have not arrived is "
             "unknown",
             h->next_ag + 1, h->nblocks, h->lrank);
    return;
  }
  loom_shm_stuck(h->shm, &h->sub, inner, sizeof inner);
  snprintf(buf, n, "inside the host (%s of block %zu of %zu), local %s",
           h->sub_rs ? "reduce-scatter" : "all-gather",
           (h->sub_rs ? h->next_rs : h->next_ag) + 1, h->nblocks, inner);
}

#endif /* LOOM_HAVE_MPI */
