/* The intra-host data path: one POSIX shared-memory segment per group whose
 * ranks all share a host. Each rank owns two slots (double buffering) of
 * `chunk` bytes; large buffers go through them in pipelined chunks that
 * stay in cache, with one or two step barriers per chunk. Reductions read
 * every rank's slot in rank order, so all ranks get bitwise equal results.
 *
 * Why not MPI here: Debian's Open MPI 4.1 reaches ~1.2 GB/s bus bandwidth on
 * a 64 MB all-reduce between two ranks of one host while this path reaches
 * ~2.4 GB/s; MPI stays the path between hosts and the reference. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_RING 4 /* descriptions kept per rank (check mode) */

/* The board: what each rank publishes. Steps and arrivals on their own
 * cache lines so spinning readers do not disturb the writer's other data. */
typedef struct shm_rank {
  _Alignas(64) _Atomic uint64_t step;    /* pipeline barrier counter */
  _Alignas(64) _Atomic uint64_t entered; /* last collective sequence begun */
  loom_comm_desc desc[SHM_RING];         /* desc[seq % SHM_RING] */
  /* Where the operation's buffers lie in registered memory (-1: not). */
  struct shm_reg {
    int32_t ok; /* this rank's buffers allow the direct path */
    int32_t send_id, recv_id;
    uint64_t send_off, recv_off;
  } reg[SHM_RING];
  /* A rank whose peers are late sleeps in the kernel on its bell (a futex
   * word) instead of spinning on a core that its own compute thread needs;
   * whoever publishes rings the bells of the sleepers. */
  _Alignas(64) _Atomic uint32_t bell;
  _Atomic uint32_t sleeping;
} shm_rank;

/* Memory from loom_group_mem_alloc: rank j's part mapped at base[j]. */
typedef struct shm_region {
  int id;        /* the same on every rank: allocations are collective */
  char **base;   /* [P] */
  size_t *bytes; /* [P] */
  struct shm_region *next;
} shm_region;

struct loom_shm {
  void *base;
  size_t bytes;
  shm_rank *hdr; /* [P] */
  char *slots;   /* [P][2][slot] */
  size_t slot;   /* bytes per slot */
  int rank, size;
  uint64_t step;         /* last step this rank published */
  uint64_t parity;       /* chunks done: selects the slot of the next one */
  loom_comm_desc *descs; /* [P] scratch for the check */
  /* What this rank waits for when an operation returns unfinished. */
  enum { WAIT_NONE, WAIT_STEP, WAIT_ENTERED } wait_kind;
  uint64_t wait_value;
  shm_region *regions;
  char **psend, **precv;       /* [P] the direct path's view of every buffer */
  uint64_t n_direct, n_staged; /* collectives by path (tests, profiles) */
};

/* Progress of one operation, kept in op->bstate. */
typedef struct shm_state {
  uint64_t base;   /* this rank's step when the op began */
  uint64_t parity; /* s->parity when the op began */
  uint64_t c, K;   /* chunk and number of chunks */
  uint64_t wait;   /* the step being waited for (watchdog) */
  size_t cm;       /* elements per chunk (per piece for blocked layouts) */
  size_t maxc;     /* all-gather-v: largest count */
  int phase;
  int mode; /* MODE_*: staged through the slots, or direct */
} shm_state;

enum { MODE_SLOTS = 0, MODE_DECIDE, MODE_DIRECT };
_Static_assert(sizeof(shm_state) <= sizeof(((loom_op *)0)->bstate),
               "shm state fits the request");

static shm_state *st_of(loom_op *op) { return (shm_state *)(void *)op->bstate; }

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

loom_status loom_shm_map(const char *name, size_t bytes, bool create,
                         void **out) {
  *out = NULL;
  /* Failures return LOOM_ERR_IO as a constant, not loom_error's result: the
   * analyzer does not see into error.c, and would let callers go on with
   * LOOM_OK and *out NULL. */
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) {
    loom_error(LOOM_ERR_IO, "shm_open(%s): %s", name, strerror(errno));
    return LOOM_ERR_IO;
  }
  if (create) {
    /* Reserve the pages now: a full /dev/shm must fail here, not raise
     * SIGBUS in the middle of a collective. */
    int e = ftruncate(fd, (off_t)bytes) == 0
                ? posix_fallocate(fd, 0, (off_t)bytes)
                : errno;
    if (e != 0) {
      close(fd);
      shm_unlink(name);
      loom_error(LOOM_ERR_IO, "cannot size shared memory %s to %zu bytes: %s",
                 name, bytes, strerror(e));
      return LOOM_ERR_IO;
    }
  }
  void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_errno = errno; /* before close and shm_unlink can change it */
  close(fd);
  if (base == MAP_FAILED) {
    if (create)
      shm_unlink(name);
    loom_error(LOOM_ERR_IO, "mmap of %s (%zu bytes): %s", name, bytes,
               strerror(map_errno));
    return LOOM_ERR_IO;
  }
  *out = base;
  return LOOM_OK;
}

void loom_shm_unmap(void *p, size_t bytes) {
  if (p)
    munmap(p, bytes);
}

loom_status loom_shm_open(loom_shm **out, const char *name, bool create,
                          int rank, int size, size_t chunk, bool yield) {
  (void)yield;
  *out = NULL;
  size_t hdr = round_up((size_t)size * sizeof(shm_rank), 4096);
  size_t slot =
      round_up(chunk > (size_t)size * 64 ? chunk : (size_t)size * 64, 4096);
  size_t bytes = hdr + (size_t)size * 2 * slot;
  void *base;
  LOOM_TRY(loom_shm_map(name, bytes, create, &base));
  loom_shm *s = loom_calloc(1, sizeof *s);
  loom_comm_desc *descs = loom_calloc((size_t)size, sizeof *descs);
  char **ps = loom_calloc((size_t)size, sizeof *ps);
  char **pr = loom_calloc((size_t)size, sizeof *pr);
  if (!s || !descs || !ps || !pr) {
    munmap(base, bytes);
    if (create) /* as loom_shm_map does: the caller never learns the name */
      shm_unlink(name);
    loom_free(s);
    loom_free(descs);
    loom_free(ps);
    loom_free(pr);
    return LOOM_ERR_NOMEM;
  }
  s->base = base;
  s->bytes = bytes;
  s->hdr = base;
  s->slots = (char *)base + hdr;
  s->slot = slot;
  s->rank = rank;
  s->size = size;
  s->descs = descs;
  s->psend = ps;
  s->precv = pr;
  /* Fault our own slots in now rather than in the first collective. */
  memset(s->slots + (size_t)rank * 2 * slot, 0, 2 * slot);
  loom_mem_add(LOOM_MEM_COMM, bytes);
  *out = s;
  return LOOM_OK;
}

void loom_shm_unlink(const char *name) { shm_unlink(name); }

static void region_release(shm_region *r, int p) {
  for (int j = 0; j < p; j++)
    loom_shm_unmap(r->base[j], r->bytes[j]);
  loom_free(r->base);
  loom_free(r->bytes);
  loom_free(r);
}

void loom_shm_close(loom_shm *s) {
  if (!s)
    return;
  while (s->regions) {
    shm_region *r = s->regions;
    s->regions = r->next;
    region_release(r, s->size);
  }
  munmap(s->base, s->bytes);
  loom_mem_sub(LOOM_MEM_COMM, s->bytes);
  loom_free(s->descs);
  loom_free(s->psend);
  loom_free(s->precv);
  loom_free(s);
}

int loom_shm_region_add(loom_shm *s, int id, void *const *base,
                        const size_t *bytes) {
  shm_region *r = loom_calloc(1, sizeof *r);
  char **b = loom_calloc((size_t)s->size, sizeof *b);
  size_t *n = loom_calloc((size_t)s->size, sizeof *n);
  if (!r || !b || !n) {
    loom_free(r);
    loom_free(b);
    loom_free(n);
    return -1;
  }
  for (int j = 0; j < s->size; j++) {
    b[j] = base[j];
    n[j] = bytes[j];
  }
  r->id = id;
  r->base = b;
  r->bytes = n;
  r->next = s->regions;
  s->regions = r;
  return r->id;
}

bool loom_shm_region_remove(loom_shm *s, void *local) {
  for (shm_region **pp = &s->regions; *pp; pp = &(*pp)->next) {
    shm_region *r = *pp;
    if (r->base[s->rank] == local) {
      *pp = r->next;
      region_release(r, s->size);
      return true;
    }
  }
  return false;
}

/* Which registered region holds [p, p + len) of this rank, and where. */
static bool find_region(loom_shm *s, const void *p, size_t len, int32_t *id,
                        uint64_t *off) {
  uintptr_t a = (uintptr_t)p;
  for (shm_region *r = s->regions; r && p; r = r->next) {
    uintptr_t b = (uintptr_t)r->base[s->rank];
    if (a >= b && len <= r->bytes[s->rank] &&
        a - b <= r->bytes[s->rank] - len) {
      *id = r->id;
      *off = a - b;
      return true;
    }
  }
  return false;
}

static char *region_ptr(loom_shm *s, int32_t id, int rank, uint64_t off) {
  for (shm_region *r = s->regions; r; r = r->next)
    if (r->id == id)
      return r->base[rank] + off;
  return NULL;
}

/* Can this rank's buffers take the direct path? Fills the board entry. */
static void reg_info(loom_shm *s, const loom_op *op, struct shm_reg *r) {
  size_t e = loom_dtype_size(op->dtype), p = (size_t)s->size;
  size_t send_len = 0, recv_len = 0;
  memset(r, 0, sizeof *r);
  r->send_id = r->recv_id = -1;
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
    send_len = recv_len = op->count * e;
    break;
  case LOOM_COMM_REDUCE_SCATTER:
    send_len = p * op->count * e;
    if (op->counts) {
      send_len = 0;
      for (size_t j = 0; j < p; j++)
        send_len += op->counts[j] * e;
    }
    break;
  case LOOM_COMM_ALLGATHER:
    recv_len = p * op->count * e;
    break;
  case LOOM_COMM_ALLGATHERV:
    for (size_t j = 0; j < p; j++)
      recv_len += op->counts[j] * e;
    break;
  case LOOM_COMM_BROADCAST:
    recv_len = op->count * e;
    break;
  case LOOM_COMM_ALLTOALL:
    /* In place, a rank would overwrite blocks its owner has yet to read. */
    if (op->send != op->recv)
      recv_len = p * op->count * e;
    break;
  default:
    return;
  }
  if (!send_len && !recv_len)
    return;
  bool ok = true;
  if (send_len)
    ok = find_region(s, op->send, send_len, &r->send_id, &r->send_off);
  if (ok && recv_len)
    ok = find_region(s, op->recv, recv_len, &r->recv_id, &r->recv_off);
  r->ok = ok;
}

bool loom_shm_supports(loom_comm_op kind) {
  switch (kind) {
  case LOOM_COMM_ALLREDUCE:
  case LOOM_COMM_REDUCE:
  case LOOM_COMM_BROADCAST:
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_ALLGATHERV:
  case LOOM_COMM_REDUCE_SCATTER:
  case LOOM_COMM_ALLTOALL:
  case LOOM_COMM_BARRIER:
    return true;
  default:
    return false;
  }
}

/* ----------------------------------------------------------- the board */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val,
                  const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* After a publication (sequentially consistent store): wake the peers that
 * sleep. Their `sleeping` flag is set before they re-check, so either they
 * see the new value or we see the flag. */
static void ring_sleepers(loom_shm *s) {
  for (int j = 0; j < s->size; j++) {
    shm_rank *h = &s->hdr[j];
    if (j != s->rank && atomic_load(&h->sleeping)) {
      atomic_fetch_add(&h->bell, 1);
      futex(&h->bell, FUTEX_WAKE, INT_MAX, NULL);
    }
  }
}

void loom_shm_enter(loom_shm *s, loom_op *op, const loom_comm_desc *d) {
  shm_rank *me = &s->hdr[s->rank];
  me->desc[op->seq % SHM_RING] = *d;
  struct shm_reg *r = &me->reg[op->seq % SHM_RING];
  reg_info(s, op, r);
  /* Registered buffers: wait for everyone's entry to decide; otherwise the
   * slots, and the others will see why on the board. */
  st_of(op)->mode = r->ok ? MODE_DECIDE : MODE_SLOTS;
  atomic_store(&me->entered, op->seq);
  ring_sleepers(s);
}

int loom_shm_check(loom_shm *s, loom_group *g, loom_op *op) {
  s->wait_kind = WAIT_ENTERED;
  s->wait_value = op->seq;
  for (int j = 0; j < s->size; j++)
    if (atomic_load_explicit(&s->hdr[j].entered, memory_order_acquire) <
        op->seq)
      return 0;
  s->wait_kind = WAIT_NONE;
  for (int j = 0; j < s->size; j++)
    s->descs[j] = s->hdr[j].desc[op->seq % SHM_RING];
  loom_comm_check_descs(g, op, s->descs, s->size);
  return 1;
}

static void publish(loom_shm *s, uint64_t v) {
  s->step = v;
  atomic_store(&s->hdr[s->rank].step, v);
  ring_sleepers(s);
}

static bool all_reached(loom_shm *s, uint64_t v) {
  for (int j = 0; j < s->size; j++)
    if (atomic_load_explicit(&s->hdr[j].step, memory_order_acquire) < v) {
      s->wait_kind = WAIT_STEP;
      s->wait_value = v;
      return false;
    }
  s->wait_kind = WAIT_NONE;
  return true;
}

static bool wait_over(loom_shm *s) {
  switch (s->wait_kind) {
  case WAIT_STEP:
    for (int j = 0; j < s->size; j++)
      if (atomic_load(&s->hdr[j].step) < s->wait_value)
        return false;
    return true;
  case WAIT_ENTERED:
    for (int j = 0; j < s->size; j++)
      if (atomic_load(&s->hdr[j].entered) < s->wait_value)
        return false;
    return true;
  default:
    return true;
  }
}

void loom_shm_ring(atomic_uint *bell) {
  atomic_fetch_add(bell, 1);
  futex((_Atomic uint32_t *)bell, FUTEX_WAKE, INT_MAX, NULL);
}

atomic_uint *loom_shm_bell(loom_shm *s) {
  return (atomic_uint *)&s->hdr[s->rank].bell;
}

bool loom_shm_sleep(loom_shm *s, double seconds, const atomic_uint *queued,
                    unsigned seen) {
  shm_rank *me = &s->hdr[s->rank];
  atomic_store(&me->sleeping, 1);
  /* The bell is read before both checks: a ring after this read changes it
   * and the futex returns at once. */
  uint32_t v = atomic_load(&me->bell);
  bool slept = false;
  if (atomic_load(queued) == seen && !wait_over(s)) {
    struct timespec ts = {(time_t)seconds,
                          (long)((seconds - (double)(time_t)seconds) * 1e9)};
    futex(&me->bell, FUTEX_WAIT, v, &ts);
    slept = true;
  }
  atomic_store(&me->sleeping, 0);
  return slept;
}

void loom_shm_stuck(loom_shm *s, loom_op *op, char *buf, size_t n) {
  bool flag[LOOM_SHM_MAX_RANKS] = {false};
  int p = s->size;
  bool any = false;
  for (int j = 0; j < p; j++) {
    flag[j] = atomic_load(&s->hdr[j].entered) < op->seq;
    any = any || flag[j];
  }
  char list[160];
  if (any) {
    loom_comm_rank_list(flag, p, list, sizeof list);
    snprintf(buf, n, "ranks not arrived: %s", list);
    return;
  }
  shm_state *st = st_of(op);
  for (int j = 0; j < p; j++) {
    flag[j] = atomic_load(&s->hdr[j].step) < st->wait;
    any = any || flag[j];
  }
  loom_comm_rank_list(flag, p, list, sizeof list);
  snprintf(buf, n, "all ranks arrived; stalled in the data phase on ranks %s",
           any ? list : "(none)");
}

/* -------------------------------------------------------- data movement */

static char *slot_of(loom_shm *s, int r, uint64_t parity) {
  return s->slots + ((size_t)r * 2 + (size_t)(parity & 1)) * s->slot;
}

static void copy(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    memcpy(dst, src, bytes);
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Elements per piece when a slot holds one piece per rank: a multiple of
 * 64 bytes so pieces start on cache lines. */
static size_t piece_elems(loom_shm *s, size_t e) {
  size_t align = 64 / e;
  size_t cm = s->slot / ((size_t)s->size * e);
  cm -= cm % align;
  return cm ? cm : align;
}

static size_t displ_of(const loom_op *op, int r) {
  size_t d = 0;
  for (int j = 0; j < r; j++)
    d += op->counts[j];
  return d;
}

/* Rank r's count: all-gather-v, and the reduce-scatter with counts that
 * the hierarchical all-reduce runs inside a host (hier.c), have one each. */
static size_t count_of(const loom_op *op, int r) {
  return op->counts ? op->counts[r] : op->count;
}

/* Where rank r's block starts in a reduce-scatter's input. */
static size_t block_of(const loom_op *op, int r) {
  return op->counts ? displ_of(op, r) : (size_t)r * op->count;
}

static void setup(loom_shm *s, loom_op *op, shm_state *st) {
  size_t e = loom_dtype_size(op->dtype);
  size_t n = 0;
  st->base = s->step;
  st->parity = s->parity;
  st->c = 0;
  st->phase = 0;
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
  case LOOM_COMM_REDUCE:
  case LOOM_COMM_BROADCAST:
    st->cm = s->slot / e;
    n = op->count;
    break;
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_ALLGATHERV:
    st->cm = s->slot / e;
    st->maxc = 0;
    for (int j = 0; j < s->size; j++)
      if (count_of(op, j) > st->maxc)
        st->maxc = count_of(op, j);
    n = st->maxc;
    break;
  case LOOM_COMM_REDUCE_SCATTER:
  case LOOM_COMM_ALLTOALL:
    st->cm = piece_elems(s, e);
    n = op->count;
    for (int j = 0; op->counts && j < s->size; j++)
      if (op->counts[j] > n)
        n = op->counts[j];
    break;
  default: /* barrier */
    st->cm = 1;
    n = 0;
    break;
  }
  st->K = n ? (n + st->cm - 1) / st->cm : 1;
}

/* All-reduce and reduce: copy in; reduce my segment of the chunk across all
 * slots into my slot; copy every segment out. Two barriers per chunk. */
static int run_allreduce(loom_shm *s, loom_op *op, shm_state *st, bool *moved) {
  size_t e = loom_dtype_size(op->dtype);
  int p = s->size, me = s->rank;
  bool out = op->kind == LOOM_COMM_ALLREDUCE || me == op->root;
  for (int budget = 0; budget < 64 && st->c < st->K; budget++) {
    uint64_t par = st->parity + st->c;
    size_t off = st->c * st->cm;
    size_t m = op->count > off ? min_sz(st->cm, op->count - off) : 0;
    size_t seg = round_up((m + (size_t)p - 1) / (size_t)p, 64 / e);
    if (st->phase == 0) {
      copy(slot_of(s, me, par), (const char *)op->send + off * e, m * e);
      publish(s, st->base + 2 * st->c + 1);
      st->phase = 1;
      *moved = true;
    }
    if (st->phase == 1) {
      st->wait = st->base + 2 * st->c + 1;
      if (!all_reached(s, st->wait))
        return 0;
      size_t lo = min_sz((size_t)me * seg, m), hi = min_sz(lo + seg, m);
      if (hi > lo) {
        const void *in[LOOM_SHM_MAX_RANKS];
        for (int j = 0; j < p; j++)
          in[j] = slot_of(s, j, par) + lo * e;
        loom_comm_reduce(slot_of(s, me, par) + lo * e, in, p, hi - lo,
                         op->dtype, op->redop, p);
      }
      publish(s, st->base + 2 * st->c + 2);
      st->phase = 2;
      *moved = true;
    }
    st->wait = st->base + 2 * st->c + 2;
    if (!all_reached(s, st->wait))
      return 0;
    if (out)
      for (int j = 0; j < p; j++) {
        size_t lo = min_sz((size_t)j * seg, m), hi = min_sz(lo + seg, m);
        copy((char *)op->recv + (off + lo) * e, slot_of(s, j, par) + lo * e,
             (hi - lo) * e);
      }
    st->c++;
    st->phase = 0;
    *moved = true;
  }
  return st->c == st->K;
}

/* Copies this rank's part of chunk c into its slot. */
static void produce(loom_shm *s, loom_op *op, shm_state *st, uint64_t par) {
  size_t e = loom_dtype_size(op->dtype);
  int p = s->size, me = s->rank;
  size_t off = st->c * st->cm;
  char *dst = slot_of(s, me, par);
  const char *src = op->send;
  switch (op->kind) {
  case LOOM_COMM_BROADCAST:
    if (me == op->root) {
      size_t m = op->count > off ? min_sz(st->cm, op->count - off) : 0;
      copy(dst, src + off * e, m * e);
      copy((char *)op->recv + off * e, src + off * e, m * e);
    }
    break;
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_ALLGATHERV: {
    size_t mine = count_of(op, me);
    size_t m = mine > off ? min_sz(st->cm, mine - off) : 0;
    size_t d = op->kind == LOOM_COMM_ALLGATHER ? (size_t)me * op->count
                                               : displ_of(op, me);
    copy(dst, src + off * e, m * e);
    copy((char *)op->recv + (d + off) * e, src + off * e, m * e);
    break;
  }
  case LOOM_COMM_REDUCE_SCATTER:
  case LOOM_COMM_ALLTOALL:
    for (int j = 0; j < p; j++) {
      size_t cj = count_of(op, j);
      size_t m = cj > off ? min_sz(st->cm, cj - off) : 0;
      copy(dst + (size_t)j * st->cm * e, src + (block_of(op, j) + off) * e,
           m * e);
    }
    break;
  default:
    break;
  }
}

/* Reads the other ranks' slots for chunk c into the output. */
static void consume(loom_shm *s, loom_op *op, shm_state *st, uint64_t par) {
  size_t e = loom_dtype_size(op->dtype);
  int p = s->size, me = s->rank;
  size_t off = st->c * st->cm;
  char *out = op->recv;
  switch (op->kind) {
  case LOOM_COMM_BROADCAST:
    if (me != op->root) {
      size_t m = op->count > off ? min_sz(st->cm, op->count - off) : 0;
      copy(out + off * e, slot_of(s, op->root, par), m * e);
    }
    break;
  case LOOM_COMM_ALLGATHER:
  case LOOM_COMM_ALLGATHERV: {
    size_t d = 0;
    for (int j = 0; j < p; j++) {
      size_t cj = count_of(op, j);
      size_t m = cj > off ? min_sz(st->cm, cj - off) : 0;
      if (j != me)
        copy(out + (d + off) * e, slot_of(s, j, par), m * e);
      d += cj;
    }
    break;
  }
  case LOOM_COMM_REDUCE_SCATTER: {
    size_t cm = count_of(op, me);
    size_t m = cm > off ? min_sz(st->cm, cm - off) : 0;
    if (m) {
      const void *in[LOOM_SHM_MAX_RANKS];
      for (int j = 0; j < p; j++)
        in[j] = slot_of(s, j, par) + (size_t)me * st->cm * e;
      loom_comm_reduce(out + off * e, in, p, m, op->dtype, op->redop, p);
    }
    break;
  }
  case LOOM_COMM_ALLTOALL: {
    size_t m = op->count > off ? min_sz(st->cm, op->count - off) : 0;
    for (int j = 0; j < p; j++)
      copy(out + ((size_t)j * op->count + off) * e,
           slot_of(s, j, par) + (size_t)me * st->cm * e, m * e);
    break;
  }
  default:
    break;
  }
}

/* Everything else: produce, one barrier, consume. The next chunk reuses the
 * other slot, and the one after waits behind the barrier of the one in
 * between, so nobody overwrites a slot another rank still reads. */
static int run_blocked(loom_shm *s, loom_op *op, shm_state *st, bool *moved) {
  for (int budget = 0; budget < 64 && st->c < st->K; budget++) {
    uint64_t par = st->parity + st->c;
    if (st->phase == 0) {
      produce(s, op, st, par);
      publish(s, st->base + st->c + 1);
      st->phase = 1;
      *moved = true;
    }
    st->wait = st->base + st->c + 1;
    if (!all_reached(s, st->wait))
      return 0;
    consume(s, op, st, par);
    st->c++;
    st->phase = 0;
    *moved = true;
  }
  return st->c == st->K;
}

/* ------------------------------------------------------ the direct path */

/* Elements handled between two looks at the rest of the world (~256 KiB of
 * f32: a block stays in L2 between the reduction and the copies). */
#define DIRECT_BLOCK (64u << 10)

/* Every rank's registered buffers are known: rank r reduces segment r of
 * every rank's input and writes it into every rank's output, or copies its
 * own block into every rank's output. One pass, no staging. Returns true
 * when this rank's share is done. */
static bool direct_work(loom_shm *s, loom_op *op, shm_state *st) {
  size_t e = loom_dtype_size(op->dtype);
  int p = s->size, me = s->rank;
  const void *in[LOOM_SHM_MAX_RANKS];
  for (int budget = 0; budget < 16; budget++) {
    size_t c = st->c, m;
    switch (op->kind) {
    case LOOM_COMM_ALLREDUCE: {
      size_t n = op->count;
      size_t seg = round_up((n + (size_t)p - 1) / (size_t)p, 64 / e);
      size_t lo = min_sz((size_t)me * seg, n), hi = min_sz(lo + seg, n);
      if (lo + c >= hi)
        return true;
      m = min_sz(DIRECT_BLOCK, hi - lo - c);
      size_t at = (lo + c) * e;
      for (int j = 0; j < p; j++)
        in[j] = s->psend[j] + at;
      loom_comm_reduce(s->precv[me] + at, in, p, m, op->dtype, op->redop, p);
      for (int j = 0; j < p; j++)
        if (j != me)
          memcpy(s->precv[j] + at, s->precv[me] + at, m * e);
      break;
    }
    case LOOM_COMM_REDUCE_SCATTER: {
      size_t mine = count_of(op, me);
      if (c >= mine)
        return true;
      m = min_sz(DIRECT_BLOCK, mine - c);
      for (int j = 0; j < p; j++)
        in[j] = s->psend[j] + (block_of(op, me) + c) * e;
      loom_comm_reduce((char *)op->recv + c * e, in, p, m, op->dtype, op->redop,
                       p);
      break;
    }
    case LOOM_COMM_ALLGATHER:
    case LOOM_COMM_ALLGATHERV: {
      size_t mine = count_of(op, me);
      size_t d = op->kind == LOOM_COMM_ALLGATHER ? (size_t)me * op->count
                                                 : displ_of(op, me);
      if (c >= mine)
        return true;
      m = min_sz(DIRECT_BLOCK, mine - c);
      const char *src = (const char *)op->send + c * e;
      for (int j = 0; j < p; j++)
        copy(s->precv[j] + (d + c) * e, src, m * e);
      break;
    }
    case LOOM_COMM_BROADCAST: {
      if (me != op->root || c >= op->count)
        return true;
      m = min_sz(DIRECT_BLOCK, op->count - c);
      for (int j = 0; j < p; j++)
        copy(s->precv[j] + c * e, (const char *)op->send + c * e, m * e);
      break;
    }
    case LOOM_COMM_ALLTOALL: {
      if (c >= op->count)
        return true;
      m = min_sz(DIRECT_BLOCK, op->count - c);
      for (int j = 0; j < p; j++)
        memcpy(s->precv[j] + ((size_t)me * op->count + c) * e,
               (const char *)op->send + ((size_t)j * op->count + c) * e, m * e);
      break;
    }
    default:
      return true;
    }
    st->c += m;
  }
  return false;
}

/* Which of every rank's buffers direct_work reaches through psend and
 * precv (reg_info registers the same ones). */
static void direct_needs(loom_comm_op kind, bool *send, bool *recv) {
  *send = kind == LOOM_COMM_ALLREDUCE || kind == LOOM_COMM_REDUCE_SCATTER;
  *recv = kind != LOOM_COMM_REDUCE_SCATTER;
}

/* Waits for every rank's board entry, then chooses the direct path when
 * all of them registered their buffers. Returns 0 while waiting. Every rank
 * reads the same board and holds the same regions, so all decide alike. */
static int decide(loom_shm *s, loom_op *op, shm_state *st) {
  s->wait_kind = WAIT_ENTERED;
  s->wait_value = op->seq;
  for (int j = 0; j < s->size; j++)
    if (atomic_load_explicit(&s->hdr[j].entered, memory_order_acquire) <
        op->seq)
      return 0;
  s->wait_kind = WAIT_NONE;
  bool need_send, need_recv;
  direct_needs(op->kind, &need_send, &need_recv);
  st->mode = MODE_DIRECT;
  for (int j = 0; j < s->size; j++) {
    const struct shm_reg *r = &s->hdr[j].reg[op->seq % SHM_RING];
    char *ps = r->ok && r->send_id >= 0
                   ? region_ptr(s, r->send_id, j, r->send_off)
                   : NULL;
    char *pr = r->ok && r->recv_id >= 0
                   ? region_ptr(s, r->recv_id, j, r->recv_off)
                   : NULL;
    /* r->ok means the buffers this kind needs are registered; checking the
     * pointers themselves states it where direct_work relies on it. */
    if (!r->ok || (need_send && !ps) || (need_recv && !pr)) {
      st->mode = MODE_SLOTS;
      return 1;
    }
    s->psend[j] = ps;
    s->precv[j] = pr;
  }
  st->c = 0;
  st->phase = 0;
  return 1;
}

static int run_direct(loom_shm *s, loom_op *op, shm_state *st, bool *moved) {
  if (st->phase == 0) {
    bool finished = direct_work(s, op, st);
    *moved = true;
    if (!finished)
      return 0;
    /* Nobody leaves before everyone has written (and read) its share. */
    publish(s, st->base + 1);
    st->phase = 1;
  }
  st->wait = st->base + 1;
  return all_reached(s, st->wait);
}

int loom_shm_run(loom_shm *s, loom_op *op, bool *moved) {
  shm_state *st = st_of(op);
  if (st->mode == MODE_DECIDE) {
    if (!decide(s, op, st))
      return 0;
    *moved = true;
    if (st->mode == MODE_DIRECT) {
      st->base = s->step;
      st->K = 1;
    }
  }
  if (st->mode == MODE_DIRECT) {
    int done = run_direct(s, op, st, moved);
    s->n_direct += (uint64_t)done;
    return done;
  }
  if (!st->K)
    setup(s, op, st);
  int done = op->kind == LOOM_COMM_ALLREDUCE || op->kind == LOOM_COMM_REDUCE
                 ? run_allreduce(s, op, st, moved)
                 : run_blocked(s, op, st, moved);
  if (done) {
    s->parity = st->parity + st->K;
    s->n_staged++;
  }
  return done;
}

void loom_shm_counts(const loom_shm *s, uint64_t *direct, uint64_t *staged) {
  *direct = s ? s->n_direct : 0;
  *staged = s ? s->n_staged : 0;
}
