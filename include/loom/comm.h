/* loom comm: process groups and asynchronous, ordered, checked, watched
 * collectives over a backend (self: one rank, no MPI; mpi; later nccl). */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ------------------------------------------------------------- concepts
 *
 * A group is a set of ranks (processes) that run collectives together. The
 * world group comes from the launch environment: under mpirun / srun the
 * `mpi` backend, run directly the `self` backend (one rank, no MPI at all).
 * loom_group_split makes sub-groups (mesh axes).
 *
 * Every operation is asynchronous: it fills a caller-owned loom_req and
 * returns at once; loom_wait / loom_test / loom_wait_all finish it. One
 * communication thread per process runs every operation of every group in
 * program order, so compute overlaps communication and MPI is only ever
 * entered from that thread. Buffers handed to an operation belong to it until
 * its request completes.
 *
 * All ranks of a group must issue its collectives in the same order (the
 * same rule as MPI and NCCL). With LOOM_COMM_CHECK=1 every collective carries
 * a sequence number and a description (op, count, dtype, root) that all ranks
 * compare: a mismatch fails the request with LOOM_ERR_MISMATCH naming both
 * ranks and both operations. A watchdog (LOOM_COMM_TIMEOUT seconds, default
 * 600, 0 = off) turns an operation that has not completed in time into
 * LOOM_ERR_TIMEOUT naming the operation, its sequence number and the ranks
 * that have not arrived, then aborts the job (exit code
 * LOOM_COMM_EXIT_TIMEOUT) so a supervisor (`loom run --max-restarts`) can
 * start it again; LOOM_COMM_ABORT=0 keeps the process alive and marks the
 * group broken instead.
 *
 * Signature shape of every collective, as in NCCL:
 *   (send, recv, count, dtype, [op,] [root,] group, req)
 * with "in place" when send == recv (for all-gather: send == recv + rank *
 * count; for reduce-scatter: recv == send + rank * count). */

/* Exit status of a job aborted by the watchdog (EX_TEMPFAIL: try again). */
#define LOOM_COMM_EXIT_TIMEOUT 75

/* Told just before the watchdog aborts the job: `why` is the request's
 * error text, `exit_code` LOOM_COMM_EXIT_TIMEOUT. Runs on the communication
 * thread, so it must only record (the trainer passes it on to its
 * supervisor through loom_runstat_note/exit, see loom/run.h); comm itself
 * knows nothing of supervisors. One hook per process; NULL removes it. */
typedef void (*loom_comm_abort_hook)(void *ctx, const char *why, int exit_code);
void loom_comm_set_abort_hook(loom_comm_abort_hook fn, void *ctx);

/* Told as each operation ends, on the communication thread (so it must be
 * quick: the trainer records a trace event): the operation's name
 * ("allreduce"), its group's label, the bytes of its buffer (count x dtype
 * size; 0 for calls and splits), when the thread started it and when it
 * finished (loom_time_now()). One hook per process; NULL removes it. */
typedef void (*loom_comm_op_hook)(void *user, const char *op, const char *group,
                                  size_t bytes, double t_start, double t_end);
void loom_comm_set_op_hook(loom_comm_op_hook fn, void *user);

/* The MPI this library was built against: "openmpi", "mpich", "mpi" (another
 * implementation) or "none"; its launcher must be the one that starts the
 * ranks, or each starts as a one-rank job. */
const char *loom_comm_mpi_impl(void);

/* ------------------------------------------------------------ reductions */

#define LOOM_REDOP_LIST(X)                                                     \
  X(LOOM_SUM, "sum")                                                           \
  X(LOOM_AVG, "avg")                                                           \
  X(LOOM_MAX, "max")                                                           \
  X(LOOM_MIN, "min")                                                           \
  X(LOOM_PROD, "prod")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_REDOP_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_REDOP_COUNT
} loom_redop;

const char *loom_redop_name(loom_redop op);
loom_status loom_redop_parse(const char *name, loom_redop *out);

/* The kinds of operation, for messages, checks and benchmarks. */
#define LOOM_COMM_OP_LIST(X)                                                   \
  X(LOOM_COMM_ALLREDUCE, "allreduce")                                          \
  X(LOOM_COMM_REDUCE, "reduce")                                                \
  X(LOOM_COMM_BROADCAST, "broadcast")                                          \
  X(LOOM_COMM_ALLGATHER, "allgather")                                          \
  X(LOOM_COMM_ALLGATHERV, "allgatherv")                                        \
  X(LOOM_COMM_REDUCE_SCATTER, "reducescatter")                                 \
  X(LOOM_COMM_ALLTOALL, "alltoall")                                            \
  X(LOOM_COMM_BARRIER, "barrier")                                              \
  X(LOOM_COMM_SEND, "send")                                                    \
  X(LOOM_COMM_RECV, "recv")                                                    \
  X(LOOM_COMM_CALL, "call")                                                    \
  X(LOOM_COMM_SPLIT, "split")                                                  \
  X(LOOM_COMM_FREE, "free")                                                    \
  X(LOOM_COMM_MEM_ALLOC, "mem_alloc")                                          \
  X(LOOM_COMM_MEM_FREE, "mem_free")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_COMM_OP_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_COMM_OP_COUNT
} loom_comm_op;

const char *loom_comm_op_name(loom_comm_op op);

/* -------------------------------------------------------------- requests */

/* A request: caller-owned storage for one operation (stack, struct member or
 * array), so posting never allocates. Zero-initialise it (or use
 * LOOM_REQ_INIT) before first use; a zeroed request waits as already done.
 * A completed request may be posted again, or restarted with loom_start (the
 * same operation on the same buffers: a DDP bucket every step). Do not move
 * or reuse a request while it is in flight. */
typedef struct loom_req {
  uint64_t opaque_[96];
} loom_req;
#define LOOM_REQ_INIT                                                          \
  {                                                                            \
    { 0 }                                                                      \
  }

/* Blocks until the operation completes; returns its status (the message is
 * recorded on this thread: loom_last_error()). LOOM_OK for a zeroed req. */
loom_status loom_wait(loom_req *req);
/* Non-blocking: *done says whether it completed; the return value is the
 * operation's status once done, LOOM_OK before. */
loom_status loom_test(loom_req *req, bool *done);
/* Blocks until the operation completes or `seconds` have passed, whichever
 * comes first; *done (may be NULL) says which. Returns the operation's status
 * once done, LOOM_OK before. For a caller that must show signs of life while
 * it waits for a slower rank (see loom_runstat_beat). */
loom_status loom_wait_for(loom_req *req, double seconds, bool *done);
/* Waits for n requests; returns the first error (all are waited for). */
loom_status loom_wait_all(loom_req *reqs, size_t n);
/* Posts the completed (or never-waited) request's operation again. */
loom_status loom_start(loom_req *req);
/* When the operation was posted, started on the communication thread and
 * finished (loom_time_now() clock; 0 when not reached yet). Any may be NULL. */
void loom_req_times(const loom_req *req, double *posted, double *started,
                    double *finished);

/* ---------------------------------------------------------------- groups */

typedef struct loom_group loom_group;

#define LOOM_COMM_BACKEND_LIST(X)                                              \
  X(LOOM_COMM_AUTO, "auto")                                                    \
  X(LOOM_COMM_SELF, "self")                                                    \
  X(LOOM_COMM_MPI, "mpi")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_COMM_BACKEND_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_COMM_BACKEND_COUNT
} loom_comm_backend;

typedef struct loom_comm_opts {
  loom_comm_backend backend; /* LOOM_COMM_BACKEND: auto picks mpi when the
                                process was started by an MPI launcher */
  double timeout_s;          /* LOOM_COMM_TIMEOUT, default 600; 0 = off */
  bool check;                /* LOOM_COMM_CHECK, default off */
  bool abort_on_timeout;     /* LOOM_COMM_ABORT, default on */
  bool shm;                  /* LOOM_COMM_SHM: intra-host shared-memory data
                                path of the mpi backend, default on */
  size_t chunk_bytes;        /* LOOM_COMM_CHUNK: pipeline chunk, default 256K */
  bool hier;                 /* LOOM_COMM_HIER: groups across hosts with the
                                same number of ranks on each (more than one)
                                all-reduce hierarchically: inside each host
                                over shared memory, between hosts 1/L of the
                                data per rank; default on (needs shm) */
} loom_comm_opts;

/* Defaults, overridden by the LOOM_COMM_* environment variables. */
loom_comm_opts loom_comm_opts_default(void);

/* The world group. The first call starts the communication thread (and MPI
 * on it); later calls return the same group with one more reference. opts
 * NULL = loom_comm_opts_default(); opts of later calls are ignored.
 * Free every group with loom_group_free; the last free finalises MPI. */
loom_status loom_group_world(const loom_comm_opts *opts, loom_group **out);
/* Collective over parent: ranks with the same color form a group, ordered by
 * (key, parent rank). color < 0: this rank joins none and *out is NULL. */
loom_status loom_group_split(loom_group *parent, int color, int key,
                             loom_group **out);
/* Waits for the group's pending operations, then releases it (collective
 * for the members). NULL is a no-op. */
void loom_group_free(loom_group *g);

int loom_group_rank(const loom_group *g);
int loom_group_size(const loom_group *g);

/* Collective over g: each rank passes its own outcome of a step (`mine`,
 * with its message in loom_last_error()); all learn whether every rank
 * succeeded. Returns `mine` with its own message on a rank that failed;
 * on the others LOOM_ERR_REMOTE (LOOM_ERR_CONFIG when the first failing
 * rank's error was one) naming `what` and that rank. LOOM_OK only when all
 * passed LOOM_OK. A group of one returns `mine`. */
loom_status loom_comm_agree(loom_group *g, loom_status mine, const char *what);
/* Rank among the members of the group on this host, and their number. */
int loom_group_local_rank(const loom_group *g);
int loom_group_local_size(const loom_group *g);
/* "self" or "mpi"; and whether the intra-host shared-memory path is on. */
const char *loom_group_backend(const loom_group *g);
bool loom_group_shm(const loom_group *g);
/* Whether g's all-reduces are hierarchical: g spans hosts with the same
 * number of ranks (more than one) on each, LOOM_COMM_HIER on. */
bool loom_group_hier(const loom_group *g);
/* Whether its reduce-scatters and all-gathers are too: hierarchical, and
 * each host's ranks consecutive in the group, hosts in order (rank = host
 * * ranks a host + local rank, as launchers place them). */
bool loom_group_hier_gather(const loom_group *g);
/* LOOM_OK, or the error that broke the group (a timeout with
 * LOOM_COMM_ABORT=0), with its message recorded on this thread. */
loom_status loom_group_error(loom_group *g);
/* Aborts every process of the job with `code` (MPI_Abort on the
 * communication thread); for the self backend it only marks the group
 * broken and returns. Used by tests on a failed check so no rank hangs. */
void loom_group_abort(loom_group *g, int code);

/* -------------------------------------------------------- shared memory */

/* Memory that the group's ranks on this host share. A collective whose
 * buffers lie in such memory on every rank moves data directly between the
 * ranks' buffers instead of staging it through loom's segment: all-reduce
 * reads each segment from every rank and writes the result into every
 * rank's buffer, all-gather writes each block straight into every rank's
 * output (one copy instead of three). Registered are: send and recv for
 * all-reduce, send for reduce-scatter, recv for all-gather(-v), broadcast
 * and all-to-all (not in place). Other buffers work as usual.
 * Collective over g (every member calls it, in order with the group's other
 * collectives; sizes may differ). Without a shared-memory path (self backend,
 * a group across hosts, LOOM_COMM_SHM=0) it is plain loom_malloc memory.
 * 64-byte aligned, zeroed. Release with loom_group_mem_free (collective). */
loom_status loom_group_mem_alloc(loom_group *g, size_t bytes, void **out);
void loom_group_mem_free(loom_group *g, void *p);

/* ------------------------------------------------------------ operations */

/* recv = op over ranks of send (count elements). */
loom_status loom_allreduce(const void *send, void *recv, size_t count,
                           loom_dtype dt, loom_redop op, loom_group *g,
                           loom_req *req);
/* Like all-reduce, but only root's recv receives the result. */
loom_status loom_reduce(const void *send, void *recv, size_t count,
                        loom_dtype dt, loom_redop op, int root, loom_group *g,
                        loom_req *req);
/* recv = root's send on every rank (root's recv too, unless in place). */
loom_status loom_broadcast(const void *send, void *recv, size_t count,
                           loom_dtype dt, int root, loom_group *g,
                           loom_req *req);
/* recv (size * count) = the send buffers (count each) in rank order. */
loom_status loom_allgather(const void *send, void *recv, size_t count,
                           loom_dtype dt, loom_group *g, loom_req *req);
/* Variable counts: rank r sends counts[r] elements; recv holds them packed
 * in rank order. counts (size entries, equal on every rank) is borrowed until
 * completion. In place when send == recv + sum(counts[0..rank)). */
loom_status loom_allgatherv(const void *send, void *recv, const size_t *counts,
                            loom_dtype dt, loom_group *g, loom_req *req);
/* send (size * count); rank r's recv (count) = op over ranks of block r. */
loom_status loom_reduce_scatter(const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_redop op, loom_group *g,
                                loom_req *req);
/* send and recv (size * count): block j of send goes to rank j, block i of
 * recv comes from rank i. */
loom_status loom_alltoall(const void *send, void *recv, size_t count,
                          loom_dtype dt, loom_group *g, loom_req *req);
loom_status loom_barrier(loom_group *g, loom_req *req);
/* Point to point, matched by (peer, tag) in order; tag in [0, 32767]. */
loom_status loom_send(const void *buf, size_t count, loom_dtype dt, int peer,
                      int tag, loom_group *g, loom_req *req);
loom_status loom_recv(void *buf, size_t count, loom_dtype dt, int peer, int tag,
                      loom_group *g, loom_req *req);

/* Runs fn on the communication thread, in order with the group's other
 * operations (its own MPI calls, a baseline measurement...). `native` is a
 * pointer to the group's MPI_Comm for the mpi backend, NULL for self. */
typedef loom_status (*loom_comm_fn)(void *ctx, loom_group *g, void *native);
loom_status loom_group_call(loom_comm_fn fn, void *ctx, loom_group *g,
                            loom_req *req);

/* The MPI datatype and operation loom uses for (dt, op), written to
 * *(MPI_Datatype *)mpi_dtype and *(MPI_Op *)mpi_op (bf16 and f16 get loom's
 * own user-defined types and operations; avg maps to sum). Call it on the
 * communication thread (from a loom_group_call function).
 * LOOM_ERR_UNSUPPORTED without MPI. */
loom_status loom_comm_mpi_types(loom_dtype dt, loom_redop op, void *mpi_dtype,
                                void *mpi_op);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_COMM_H */
