/* Hierarchical all-reduce for a group whose ranks span hosts, the same
 * number L on each: a reduce-scatter inside each host over the
 * shared-memory path leaves local rank i with the host's sum of piece i; the
 * L ranks holding piece i, one a host, all-reduce it over MPI; an all-gather
 * inside each host puts the pieces back together. Between hosts every rank
 * sends 1/L of the buffer, the host's L ranks in parallel, where the flat
 * algorithm runs one ring or tree of all ranks across the links.
 *
 * Every rank ends with the same bits: each piece is reduced inside a host by
 * one rank, between hosts by MPI's all-reduce (the same result on every
 * member), then copied. The order of the sum differs from the flat
 * algorithm's (as MPI's own algorithms differ by size), so results agree to
 * rounding; deterministic DDP never depends on it (its tree reduces pairs). */
#include "internal.h"

#ifdef LOOM_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

/* The buffer goes in blocks, pipelined: while MPI carries block k between
 * hosts, the host reduces block k+1 and gathers block k-1. Each local rank's
 * piece of a block is one MPI all-reduce of LOOM_COMM_CHUNK x 4 bytes, the
 * size the flat path posts. The host's steps run in one fixed order on every
 * rank (RS 0, RS 1, AG 0, RS 2, AG 1, ...), whatever the timing. */
#define HIER_AHEAD 2 /* blocks reduced ahead of the gather (MPI in flight) */

struct loom_hier {
  loom_shm *shm;  /* this host's ranks */
  MPI_Comm cross; /* the ranks of this local rank, one a host */
  int lrank, L, H;
  size_t chunk_bytes;
  uint64_t seq;   /* sub-operations entered on shm */
  uint64_t n_ops; /* all-reduces taken (tests) */
  /* The operation in flight (one collective a group at a time). */
  loom_op sub;    /* the host's step in flight */
  bool sub_on;    /* sub is running */
  bool sub_rs;    /* it is a reduce-scatter (else an all-gather) */
  size_t *counts; /* [L] the local ranks' pieces of sub's block */
  size_t block;   /* elements a block */
  size_t nblocks, next_rs, next_ag; /* blocks; next of each step */
  MPI_Request req[HIER_AHEAD];      /* block k's inter-host all-reduce */
};

loom_status loom_hier_open(loom_hier **out, loom_shm *shm, void *cross,
                           int lrank, int local_size, int hosts,
                           size_t chunk_bytes) {
  loom_hier *h = loom_calloc(1, sizeof *h);
  size_t *counts = loom_calloc((size_t)local_size, sizeof *counts);
  if (!h || !counts) {
    loom_free(h);
    loom_free(counts);
    return LOOM_ERR_NOMEM;
  }
  h->shm = shm;
  h->cross = *(MPI_Comm *)cross;
  h->lrank = lrank;
  h->L = local_size;
  h->H = hosts;
  h->chunk_bytes = chunk_bytes;
  h->counts = counts;
  for (int w = 0; w < HIER_AHEAD; w++)
    h->req[w] = MPI_REQUEST_NULL;
  *out = h;
  return LOOM_OK;
}

void loom_hier_close(loom_hier *h) {
  if (!h)
    return;
  loom_shm_close(h->shm);
  if (h->cross != MPI_COMM_NULL)
    MPI_Comm_free(&h->cross);
  loom_free(h->counts);
  loom_free(h);
}

bool loom_hier_takes(const loom_hier *h, const loom_op *op) {
  return h && op->kind == LOOM_COMM_ALLREDUCE && op->count > 0;
}

uint64_t loom_hier_count(const loom_hier *h) { return h ? h->n_ops : 0; }

static loom_redop summed(loom_redop op) {
  return op == LOOM_AVG ? LOOM_SUM : op;
}

static int fail(loom_op *op, int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  loom_comm_op_fail(op, LOOM_ERR_REMOTE, "allreduce between hosts: %s: %s",
                    what, msg);
  return 1;
}

/* Block k of op: its first element and length; this rank's piece of it. */
static void block_of(const loom_hier *h, const loom_op *op, size_t k,
                     size_t *lo, size_t *len) {
  *lo = k * h->block;
  *len = op->count - *lo < h->block ? op->count - *lo : h->block;
}

/* Fills counts with the local ranks' pieces of block k (on cache lines;
 * the last ones may be short or empty); returns this rank's offset. */
static size_t pieces(loom_hier *h, const loom_op *op, size_t k) {
  size_t e = loom_dtype_size(op->dtype), lo, len;
  block_of(h, op, k, &lo, &len);
  size_t align = 64 / e ? 64 / e : 1;
  size_t seg = (len + (size_t)h->L - 1) / (size_t)h->L;
  seg = (seg + align - 1) / align * align;
  size_t mine = 0;
  for (int i = 0; i < h->L; i++) {
    size_t at = (size_t)i * seg < len ? (size_t)i * seg : len;
    h->counts[i] = len - at < seg ? len - at : seg;
    if (i == h->lrank)
      mine = lo + at;
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

/* Posts block k's piece between hosts (nothing when it is empty). */
static int post_cross(loom_hier *h, loom_op *op, size_t k) {
  MPI_Request *rq = &h->req[k % HIER_AHEAD];
  *rq = MPI_REQUEST_NULL;
  size_t mine = pieces(h, op, k), n = h->counts[h->lrank];
  if (h->H < 2 || n == 0)
    return 0;
  MPI_Datatype t;
  MPI_Op o;
  if (loom_comm_mpi_types(op->dtype, summed(op->redop), &t, &o) != LOOM_OK) {
    loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED, "%s", loom_last_error());
    return 1;
  }
  char *piece = (char *)op->recv + mine * loom_dtype_size(op->dtype);
  int rc = MPI_Iallreduce(MPI_IN_PLACE, piece, (int)n, t, o, h->cross, rq);
  return rc == MPI_SUCCESS ? 0 : fail(op, rc, "MPI_Iallreduce");
}

/* Whether block k's inter-host all-reduce is over; -1 on an error. */
static int cross_done(loom_hier *h, loom_op *op, size_t k, bool *moved) {
  MPI_Request *rq = &h->req[k % HIER_AHEAD];
  if (*rq == MPI_REQUEST_NULL)
    return 1;
  int flag = 0;
  int rc = MPI_Test(rq, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    fail(op, rc, "MPI_Test");
    return -1;
  }
  if (flag) {
    *rq = MPI_REQUEST_NULL;
    *moved = true;
  }
  return flag;
}

static bool cross_in_flight(const loom_hier *h) {
  for (int w = 0; w < HIER_AHEAD; w++)
    if (h->req[w] != MPI_REQUEST_NULL)
      return true;
  return false;
}

int loom_hier_progress(loom_hier *h, loom_op *op, bool *moved, bool *poll) {
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

int loom_hier_start(loom_hier *h, loom_op *op) {
  size_t e = loom_dtype_size(op->dtype);
  size_t piece = h->chunk_bytes * 4 / e;
  if (piece > (size_t)INT_MAX / 2)
    piece = (size_t)INT_MAX / 2;
  if (piece < 64)
    piece = 64;
  h->block = piece * (size_t)h->L;
  h->nblocks = (op->count + h->block - 1) / h->block;
  h->next_rs = h->next_ag = 0;
  h->sub_on = false;
  for (int w = 0; w < HIER_AHEAD; w++)
    h->req[w] = MPI_REQUEST_NULL;
  bool moved = false, poll = false;
  return loom_hier_progress(h, op, &moved, &poll);
}

loom_shm *loom_hier_waiting_shm(const loom_hier *h) {
  return h && h->sub_on && !cross_in_flight(h) ? h->shm : NULL;
}

void loom_hier_stuck(loom_hier *h, char *buf, size_t n) {
  char inner[LOOM_OP_ERR_MAX];
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
