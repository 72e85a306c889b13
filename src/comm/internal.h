/* loom comm internals: the operation record behind loom_req, groups, the
 * per-process context with its communication thread, the backend table and
 * the shared-memory data path. */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"

typedef struct loom_comm_ctx loom_comm_ctx;
typedef struct loom_backend loom_backend;
typedef struct loom_shm loom_shm;

/* Life of a request. */
enum {
  LOOM_REQ_EMPTY = 0, /* zeroed: nothing posted */
  LOOM_REQ_QUEUED,    /* posted, waiting for the communication thread */
  LOOM_REQ_ACTIVE,    /* started by the communication thread */
  LOOM_REQ_DONE       /* finished; status and message are final */
};
#define LOOM_OP_MAGIC 0x4c4f4f4du /* "LOOM" */
#define LOOM_OP_ERR_MAX 320

/* What all ranks compare in check mode (and what the watchdog names). */
typedef struct loom_comm_desc {
  uint64_t seq;   /* 1, 2, ... per group */
  uint32_t kind;  /* loom_comm_op */
  uint32_t dtype; /* loom_dtype */
  uint32_t redop; /* loom_redop, 0 when none */
  int32_t root;   /* root, or -1 */
  uint64_t count;
  uint64_t aux; /* hash of the counts of all-gather-v, color of split */
} loom_comm_desc;

/* The operation behind a loom_req (lives inside the caller's storage). */
typedef struct loom_op {
  uint32_t magic;
  atomic_int state;
  loom_status status;
  loom_comm_op kind;
  loom_dtype dtype;
  loom_redop redop;
  int root; /* root, or peer of send / recv */
  int tag;
  size_t count;
  const void *send;
  void *recv;
  const size_t *counts; /* all-gather-v */
  loom_comm_fn fn;      /* call */
  void *fn_ctx;
  loom_group *group;
  loom_group *child; /* split: the new group (filled by the backend) */
  int color, key;    /* split */
  uint64_t seq;      /* collective sequence number on the group */
  double t_post, t_start, t_end, deadline;
  struct loom_op *next; /* queue / in-flight list */
  bool started;
  bool collective; /* serialised with the group's other collectives */
  int phase;       /* backend progress state */
  uint64_t bstate[20];
  char err[LOOM_OP_ERR_MAX];
} loom_op;
_Static_assert(sizeof(loom_op) <= sizeof(loom_req), "loom_req too small");
_Static_assert(_Alignof(loom_op) <= _Alignof(loom_req), "loom_req alignment");

struct loom_group {
  loom_comm_ctx *ctx;
  int rank, size, local_rank, local_size;
  bool is_world;
  bool shm;          /* the shared-memory data path is on */
  bool hier;         /* all-reduces go hierarchically (hier.c) */
  bool hier_gather;  /* reduce-scatters and all-gathers too */
  int refs;          /* world: loom_group_world calls not yet freed */
  char label[96];    /* "world", "world/split2(color 0)" */
  uint64_t next_seq; /* comm thread: sequence of the next collective */
  int splits;        /* comm thread: splits made from this group */
  loom_op *active;   /* comm thread: the collective in flight */
  int inflight;      /* comm thread: started, unfinished operations */
  atomic_int broken; /* set once; then broken_msg is final */
  loom_status broken_status;
  char broken_msg[LOOM_OP_ERR_MAX];
  void *bg; /* backend state */
};

/* A backend: a private table of functions over a context pointer. Every
 * entry runs on the communication thread. */
struct loom_backend {
  const char *name;
  int version;
  /* Starts the backend (MPI on this thread) and fills the world group. */
  loom_status (*init)(loom_comm_ctx *ctx, loom_group *world);
  void (*finalize)(loom_comm_ctx *ctx);
  /* Starts op (op->started is set by the caller). Returns 1 when it already
   * completed (op->status set), else 0. */
  int (*start)(loom_group *g, loom_op *op);
  /* Advances op; 1 when it completed. Sets *moved when visible progress
   * was made, *poll when only polling can advance it (MPI requests in
   * flight: the thread may yield but not nap). */
  int (*progress)(loom_group *g, loom_op *op, bool *moved, bool *poll);
  /* The watchdog's description of who is missing from op. */
  void (*stuck)(loom_group *g, loom_op *op, char *buf, size_t n);
  /* Kills the whole job; may return (self). */
  void (*abort)(loom_comm_ctx *ctx, int code);
  void *(*native)(loom_group *g);
  /* Optional: blocks up to `seconds` until op can move, publishing in
   * ctx->sleep_bell the word that wakes it. Returns false when it cannot
   * wait that way (then the thread naps). */
  bool (*sleep)(loom_group *g, loom_op *op, double seconds);
};

extern const loom_backend loom_backend_self;
#ifdef LOOM_HAVE_MPI
extern const loom_backend loom_backend_mpi;
#endif

struct loom_comm_ctx {
  loom_comm_opts opts;
  const loom_backend *be;
  void *bctx; /* backend process state */
  loom_group *world;
  int groups;          /* live groups (guarded by the global lock) */
  bool oversubscribed; /* more ranks on this host than cores: yield at once */
  bool env_init;       /* LOOM_INIT=env:// with WORLD_SIZE > 1 */
  double spin_s;       /* how long waiting threads spin before sleeping */
  double doze_s; /* longest nap while MPI requests wait and nobody waits */
  pthread_t thread;
  int owner_pid;

  /* Queue from posting threads to the communication thread. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  loom_op *q_head, *q_tail;
  bool sleeping; /* the thread waits on cv */
  bool stop;     /* finish and exit once nothing is queued */
  bool stop_now; /* exit at once (process exit) */
  int init_done; /* 0 running, 1 ok, -1 failed (under mu) */
  loom_status init_status;
  char init_msg[LOOM_OP_ERR_MAX];

  /* Completion wake-ups. */
  pthread_mutex_t done_mu;
  pthread_cond_t done_cv;
  atomic_int waiters;
  atomic_int dozing; /* the thread naps on cv: a new waiter signals it */
  _Atomic(const loom_op *) wait_op; /* what a lone waiter sleeps on */

  _Atomic(atomic_uint *) sleep_bell; /* set while the thread sleeps there */
  atomic_uint queued;                /* kicks: operations queued, stops */
  unsigned q_seen; /* comm thread: `queued` when it last looked */

  atomic_int abort_code; /* -1: none requested */
  atomic_int abort_done;

  /* Communication thread only. */
  loom_op *fl_head, *fl_tail; /* taken from the queue, not finished */
};

/* ---- comm.c */
/* A process that srun started as one of N > 1 tasks, yet alone in its
 * world (no launcher variables of an MPI: srun gave it no PMI, or one its
 * MPI does not speak): LOOM_ERR_MISMATCH naming the fix; else LOOM_OK. */
loom_status loom_comm_check_srun_alone(const char *mpi_lib);

/* ---- envinit.c: LOOM_INIT=env:// (mpi backend) */
bool loom_envinit_wanted(void); /* LOOM_INIT is set */
/* Reads LOOM_INIT, RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOOM_RDZV_TIMEOUT;
 * errors name the variable. */
loom_status loom_envinit_read(int *rank, int *size);
#ifdef LOOM_HAVE_MPI
/* Before MPI_Init: the rendezvous (and rank 0's ompi-server). */
loom_status loom_envinit_before_mpi(void);
/* After MPI_Init: *(MPI_Comm *)out = the world of WORLD_SIZE ranks. */
loom_status loom_envinit_world(void *out);
/* After MPI_Finalize: rank 0's server stopped, its files removed. */
void loom_envinit_finish(void);
#endif

/* ---- reduce.c */
/* out = in[0] op in[1] op ... in[k-1] elementwise, in that order; avg
 * divides by div. out may alias any input. bf16/f16 accumulate in f32. */
void loom_comm_reduce(void *out, const void *const *in, int k, size_t n,
                      loom_dtype dt, loom_redop op, int div);
void loom_comm_divide(void *buf, size_t n, loom_dtype dt, int div);

/* ---- check.c */
void loom_comm_desc_of(const loom_op *op, int size, loom_comm_desc *d);
/* "allreduce #5 (count 1024, f32, sum)" */
void loom_comm_desc_str(const loom_comm_desc *d, char *buf, size_t n);
/* Compares the descriptions of all ranks (descs[r] of rank r, NULL when
 * unknown); on a mismatch fills op->err and returns LOOM_ERR_MISMATCH. */
loom_status loom_comm_check_descs(loom_group *g, loom_op *op,
                                  const loom_comm_desc *descs, int n);
/* Writes "1, 3-5, 9" for the ranks r < n with flag[r] set. */
void loom_comm_rank_list(const bool *flag, int n, char *buf, size_t len);
/* Sets op->status and op->err (printf style). */
void loom_comm_op_fail(loom_op *op, loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
size_t loom_comm_op_bytes(const loom_op *op, int size);

/* ---- shm.c: the intra-host data path over one shared segment per group */
#define LOOM_SHM_MAX_RANKS 256 /* ranks of one host on the shared path */
/* Maps (creating when `create`) the segment `name` for `size` ranks. */
/* Creates (create) or maps the POSIX shared-memory object `name`. */
loom_status loom_shm_map(const char *name, size_t bytes, bool create,
                         void **out);
void loom_shm_unmap(void *p, size_t bytes);
/* Registers memory of loom_group_mem_alloc: rank j's part is mapped here at
 * base[j]. The region owns the mappings. Returns id, or -1 (no memory). */
int loom_shm_region_add(loom_shm *s, int id, void *const *base,
                        const size_t *bytes);
/* Unmaps the region whose local part starts at `local`; false if none. */
bool loom_shm_region_remove(loom_shm *s, void *local);
loom_status loom_shm_open(loom_shm **out, const char *name, bool create,
                          int rank, int size, size_t chunk, bool yield);
void loom_shm_unlink(const char *name);
void loom_shm_close(loom_shm *s);
bool loom_shm_supports(loom_comm_op kind);
/* Check mode: publish the description, wait for all, compare (1 = done,
 * op->status says whether they matched). Without check only publishes. */
void loom_shm_enter(loom_shm *s, loom_op *op, const loom_comm_desc *d);
int loom_shm_check(loom_shm *s, loom_group *g, loom_op *op);
int loom_shm_run(loom_shm *s, loom_op *op, bool *moved);
/* Sleeps in the kernel until a peer publishes what the last unfinished
 * operation waits for, the bell is rung, or `seconds` pass; not at all when
 * *queued moved past `seen` (new work). */
bool loom_shm_sleep(loom_shm *s, double seconds, const atomic_uint *queued,
                    unsigned seen);
/* This rank's bell: ringing it wakes loom_shm_sleep (new work queued). */
atomic_uint *loom_shm_bell(loom_shm *s);
void loom_shm_ring(atomic_uint *bell);
void loom_shm_stuck(loom_shm *s, loom_op *op, char *buf, size_t n);
void loom_shm_counts(const loom_shm *s, uint64_t *direct, uint64_t *staged);

/* ---- hier.c: the all-reduce of a group spanning hosts (mpi backend) */
typedef struct loom_hier loom_hier;
/* Takes ownership of shm (the host's ranks) and of *cross (an MPI_Comm of
 * the ranks with this local rank, one a host). */
loom_status loom_hier_open(loom_hier **out, loom_shm *shm, void *cross,
                           int lrank, int local_size, int hosts,
                           bool host_major, size_t chunk_bytes);
void loom_hier_close(loom_hier *h);
bool loom_hier_takes(const loom_hier *h, const loom_op *op);
/* 1 when op completed (op->status says how), 0 while it runs. */
int loom_hier_start(loom_hier *h, loom_op *op);
int loom_hier_progress(loom_hier *h, loom_op *op, bool *moved, bool *poll);
/* The segment the operation waits on, NULL while MPI has it. */
loom_shm *loom_hier_waiting_shm(const loom_hier *h);
void loom_hier_stuck(loom_hier *h, char *buf, size_t n);
uint64_t loom_hier_count(const loom_hier *h);
void loom_hier_counts(const loom_hier *h, uint64_t *allreduce,
                      uint64_t *reduce_scatter, uint64_t *allgather);

/* All-reduces of g so far on the hierarchical path (0 without it). */
uint64_t loom_comm_hier_count(loom_group *g);
/* The same for reduce-scatters and all-gathers (all-gather-v too). */
void loom_comm_hier_counts(loom_group *g, uint64_t *allreduce,
                           uint64_t *reduce_scatter, uint64_t *allgather);

/* Collectives of g so far on the shared-memory path, direct and staged
 * (0, 0 without it). Read it on the communication thread or when the
 * group is idle (tests). */
void loom_comm_path_counts(loom_group *g, uint64_t *direct, uint64_t *staged);

#endif /* LOOM_COMM_INTERNAL_H */
