/* The `self` backend: a world of one rank, no MPI. Collectives are copies;
 * send and recv to oneself match by tag. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

typedef struct self_group {
  loom_op *sends, *recvs; /* unmatched point-to-point, in posting order */
} self_group;

/* The pending-list link of a point-to-point op lives in its bstate. */
static loom_op **plink(loom_op *op) { return (loom_op **)(void *)op->bstate; }

static loom_status self_group_init(loom_group *g, const char *label) {
  self_group *sg = loom_calloc(1, sizeof *sg);
  if (!sg)
    return LOOM_ERR_NOMEM;
  g->bg = sg;
  g->rank = 0;
  g->size = 1;
  g->local_rank = 0;
  g->local_size = 1;
  snprintf(g->label, sizeof g->label, "%s", label);
  return LOOM_OK;
}

static loom_status self_init(loom_comm_ctx *ctx, loom_group *world) {
  ctx->oversubscribed = false;
  return self_group_init(world, "world");
}

static void self_finalize(loom_comm_ctx *ctx) { (void)ctx; }

static void copy(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    memmove(dst, src, bytes);
}

/* Matches op with the first pending op of the other direction and tag. */
static int self_p2p(self_group *sg, loom_op *op) {
  bool is_send = op->kind == LOOM_COMM_SEND;
  loom_op **other = is_send ? &sg->recvs : &sg->sends;
  for (loom_op **pp = other; *pp; pp = plink(*pp)) {
    loom_op *m = *pp;
    if (m->tag != op->tag)
      continue;
    loom_op *s = is_send ? op : m, *r = is_send ? m : op;
    size_t sb = s->count * loom_dtype_size(s->dtype);
    size_t rb = r->count * loom_dtype_size(r->dtype);
    *pp = *plink(m);
    if (sb > rb) {
      loom_comm_op_fail(r, LOOM_ERR_INVALID_ARG,
                        "recv (tag %d): message of %zu bytes does not fit "
                        "the %zu-byte buffer",
                        r->tag, sb, rb);
      loom_comm_op_fail(s, LOOM_ERR_INVALID_ARG,
                        "send (tag %d): the matching recv is too small",
                        s->tag);
    } else {
      copy(r->recv, s->send, sb);
    }
    m->phase = 1; /* completes on its next progress */
    return 1;
  }
  loom_op **tail = is_send ? &sg->sends : &sg->recvs;
  while (*tail)
    tail = plink(*tail);
  *plink(op) = NULL;
  *tail = op;
  return 0;
}

static int self_start(loom_group *g, loom_op *op) {
  self_group *sg = g->bg;
  size_t bytes = loom_comm_op_bytes(op, 1);
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
  case LOOM_COMM_REDUCE:
  case LOOM_COMM_BROADCAST:
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_REDUCE_SCATTER:
  case LOOM_COMM_ALLTOALL:
  case LOOM_COMM_ALLGATHERV:
    copy(op->recv, op->send, bytes);
    return 1;
  case LOOM_COMM_BARRIER:
    return 1;
  case LOOM_COMM_SEND:
  case LOOM_COMM_RECV:
    return self_p2p(sg, op);
  case LOOM_COMM_CALL:
    op->status = op->fn(op->fn_ctx, g, NULL);
    if (op->status != LOOM_OK)
      snprintf(op->err, sizeof op->err, "%s", loom_last_error());
    return 1;
  case LOOM_COMM_SPLIT:
    if (op->color < 0) {
      op->child = NULL;
      return 1;
    }
    op->status = self_group_init(op->child, "split of self");
    op->child->ctx = g->ctx;
    if (op->status != LOOM_OK)
      snprintf(op->err, sizeof op->err, "out of memory");
    return 1;
  case LOOM_COMM_MEM_ALLOC:
    op->recv = loom_calloc(1, op->count ? op->count : 1);
    if (!op->recv)
      loom_comm_op_fail(op, LOOM_ERR_NOMEM, "mem_alloc of %zu bytes",
                        op->count);
    return 1;
  case LOOM_COMM_MEM_FREE:
    loom_free((void *)(uintptr_t)op->send);
    return 1;
  case LOOM_COMM_FREE:
    loom_free(sg);
    g->bg = NULL;
    return 1;
  default:
    loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED, "self: unsupported op %s",
                      loom_comm_op_name(op->kind));
    return 1;
  }
}

static int self_progress(loom_group *g, loom_op *op, bool *moved, bool *poll) {
  (void)g;
  (void)moved;
  (void)poll;
  return op->phase == 1;
}

static void self_stuck(loom_group *g, loom_op *op, char *buf, size_t n) {
  self_group *sg = g->bg;
  /* A stuck point-to-point op must leave the pending list: its request is
   * about to be handed back. */
  loom_op **head = op->kind == LOOM_COMM_SEND ? &sg->sends : &sg->recvs;
  for (loom_op **pp = head; *pp; pp = plink(*pp))
    if (*pp == op) {
      *pp = *plink(op);
      break;
    }
  snprintf(buf, n, "no matching %s with tag %d was posted on this rank",
           op->kind == LOOM_COMM_SEND ? "recv" : "send", op->tag);
}

static void self_abort(loom_comm_ctx *ctx, int code) {
  (void)ctx;
  (void)code;
}

static void *self_native(loom_group *g) {
  (void)g;
  return NULL;
}

const loom_backend loom_backend_self = {
    .name = "self",
    .version = 1,
    .init = self_init,
    .finalize = self_finalize,
    .start = self_start,
    .progress = self_progress,
    .stuck = self_stuck,
    .abort = self_abort,
    .native = self_native,
};
