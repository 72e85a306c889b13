/* Collective descriptions, their comparison across ranks (LOOM_COMM_CHECK)
 * and the texts of comm errors. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const op_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_COMM_OP_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof op_names / sizeof op_names[0] == LOOM_COMM_OP_COUNT,
               "comm op name table");

const char *loom_comm_op_name(loom_comm_op op) {
  return (unsigned)op < LOOM_COMM_OP_COUNT ? op_names[op] : "?";
}

void loom_comm_op_fail(loom_op *op, loom_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(op->err, sizeof op->err, fmt, ap);
  va_end(ap);
  op->status = s;
}

void loom_comm_desc_of(const loom_op *op, int size, loom_comm_desc *d) {
  memset(d, 0, sizeof *d);
  d->seq = op->seq;
  d->kind = (uint32_t)op->kind;
  d->root = -1;
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
  case LOOM_COMM_REDUCE_SCATTER:
    d->redop = (uint32_t)op->redop;
    /* fall through */
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_ALLTOALL:
    d->dtype = (uint32_t)op->dtype;
    d->count = op->count;
    break;
  case LOOM_COMM_REDUCE:
    d->redop = (uint32_t)op->redop;
    /* fall through */
  case LOOM_COMM_BROADCAST:
    d->dtype = (uint32_t)op->dtype;
    d->count = op->count;
    d->root = op->root;
    break;
  case LOOM_COMM_ALLGATHERV: {
    d->dtype = (uint32_t)op->dtype;
    uint64_t total = 0;
    for (int r = 0; r < size; r++)
      total += op->counts[r];
    d->count = total;
    d->aux = loom_hash64(LOOM_HASH64_INIT, op->counts,
                         (size_t)size * sizeof op->counts[0]);
    break;
  }
  default:
    break;
  }
}

void loom_comm_desc_str(const loom_comm_desc *d, char *buf, size_t n) {
  const char *name = loom_comm_op_name((loom_comm_op)d->kind);
  switch ((loom_comm_op)d->kind) {
  case LOOM_COMM_ALLREDUCE:
  case LOOM_COMM_REDUCE_SCATTER:
    snprintf(buf, n, "%s #%llu (count %llu, %s, %s)", name,
             (unsigned long long)d->seq, (unsigned long long)d->count,
             loom_dtype_name((loom_dtype)d->dtype),
             loom_redop_name((loom_redop)d->redop));
    break;
  case LOOM_COMM_REDUCE:
    snprintf(buf, n, "%s #%llu (count %llu, %s, %s, root %d)", name,
             (unsigned long long)d->seq, (unsigned long long)d->count,
             loom_dtype_name((loom_dtype)d->dtype),
             loom_redop_name((loom_redop)d->redop), d->root);
    break;
  case LOOM_COMM_BROADCAST:
    snprintf(buf, n, "%s #%llu (count %llu, %s, root %d)", name,
             (unsigned long long)d->seq, (unsigned long long)d->count,
             loom_dtype_name((loom_dtype)d->dtype), d->root);
    break;
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_ALLTOALL:
    snprintf(buf, n, "%s #%llu (count %llu, %s)", name,
             (unsigned long long)d->seq, (unsigned long long)d->count,
             loom_dtype_name((loom_dtype)d->dtype));
    break;
  case LOOM_COMM_ALLGATHERV:
    snprintf(buf, n, "%s #%llu (total %llu, %s, counts %016llx)", name,
             (unsigned long long)d->seq, (unsigned long long)d->count,
             loom_dtype_name((loom_dtype)d->dtype), (unsigned long long)d->aux);
    break;
  default:
    snprintf(buf, n, "%s #%llu", name, (unsigned long long)d->seq);
    break;
  }
}

static bool desc_equal(const loom_comm_desc *a, const loom_comm_desc *b) {
  return a->seq == b->seq && a->kind == b->kind && a->dtype == b->dtype &&
         a->redop == b->redop && a->root == b->root && a->count == b->count &&
         a->aux == b->aux;
}

loom_status loom_comm_check_descs(loom_group *g, loom_op *op,
                                  const loom_comm_desc *descs, int n) {
  /* Everyone compares with the lowest rank, so all ranks report the same
   * pair and all skip the collective: the group stays usable. */
  for (int r = 1; r < n; r++) {
    if (desc_equal(&descs[0], &descs[r]))
      continue;
    char a[160], b[160];
    loom_comm_desc_str(&descs[0], a, sizeof a);
    loom_comm_desc_str(&descs[r], b, sizeof b);
    loom_comm_op_fail(op, LOOM_ERR_MISMATCH,
                      "collective mismatch on group %s: rank 0 called %s but "
                      "rank %d called %s",
                      g->label, a, r, b);
    return LOOM_ERR_MISMATCH;
  }
  return LOOM_OK;
}

void loom_comm_rank_list(const bool *flag, int n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int r = 0; r < n; r++) {
    if (!flag[r])
      continue;
    int e = r;
    while (e + 1 < n && flag[e + 1])
      e++;
    int w;
    if (e == r)
      w = snprintf(buf + used, len - used, "%s%d", used ? ", " : "", r);
    else
      w = snprintf(buf + used, len - used, "%s%d-%d", used ? ", " : "", r, e);
    if (w < 0 || (size_t)w >= len - used) {
      if (len > 4)
        memcpy(buf + len - 4, "...", 4);
      return;
    }
    used += (size_t)w;
    r = e;
  }
}

size_t loom_comm_op_bytes(const loom_op *op, int size) {
  size_t e = loom_dtype_size(op->dtype);
  switch (op->kind) {
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_REDUCE_SCATTER:
  case LOOM_COMM_ALLTOALL:
    return op->count * (size_t)size * e;
  default:
    return op->count * e;
  }
}
