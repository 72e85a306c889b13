/* The `mpi` backend: MPI initialised, called and finalised by the
 * communication thread only (MPI_THREAD_FUNNELED). Collectives of groups
 * that live on one host take the shared-memory path (shm.c); the others are
 * nonblocking MPI collectives, large all-reduces cut into pipelined chunks.
 * Check headers travel point to point on a duplicate communicator, so a
 * rank that never arrives is visible by name. */
#include "internal.h"

#ifdef LOOM_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TAG_CHECK 7
#define MPI_WINDOW 2 /* chunks of a large all-reduce in flight */

typedef struct mpi_ctx {
  bool started;         /* types and operations below exist */
  bool we_init;         /* loom called MPI_Init_thread, so it finalises */
  MPI_Datatype half[2]; /* bf16, f16 */
  MPI_Op half_op[LOOM_REDOP_COUNT];
  uint64_t shm_made; /* segments created by this process (unique names) */
  int fake_host;     /* LOOM_COMM_FAKE_HOSTS: this rank's host, else -1 */
  unsigned nonce;    /* in segment names: a killed job's leftover of the
                        same pid (recycled) is not in the way */
  bool env_init;     /* LOOM_INIT=env://: the world was grown (envinit.c);
                        a host's ranks are found by host name */
} mpi_ctx;
static mpi_ctx G; /* one per process; touched only by the comm thread */

typedef struct mpi_group {
  MPI_Comm comm;   /* data */
  MPI_Comm ctl;    /* check headers */
  loom_shm *shm;   /* NULL when the group spans hosts (or LOOM_COMM_SHM=0) */
  loom_hier *hier; /* spans hosts, L ranks on each: the all-reduce path */
  loom_comm_desc mine;
  loom_comm_desc *descs; /* [P] headers received */
  MPI_Request *creqs;    /* [2P] header sends and receives */
  int *ibuf;             /* [2P] split (color, key) of every rank */
  int *counts, *displs;  /* [P] all-gather-v */
  int pair[2];
  void *tmp; /* in-place reduce-scatter and all-to-all */
  size_t tmp_bytes;
  /* loom_group_mem_alloc: every rank's object name and size. */
  struct mem_rec {
    char name[56];
    uint64_t bytes;
  } mine_rec, *recs; /* recs: [P] */
  int mem_allocs;    /* allocations made, the same count on every rank */
} mpi_group;

enum { PH_START, PH_CHECK_SHM, PH_CHECK_MPI, PH_DATA, PH_SHM, PH_HIER };

typedef struct mpi_state {
  MPI_Request req[MPI_WINDOW];
  size_t next; /* chunked all-reduce: next element to post */
  size_t chunk;
} mpi_state;
_Static_assert(sizeof(mpi_state) <= sizeof(((loom_op *)0)->bstate),
               "mpi state fits the request");

static mpi_state *ms_of(loom_op *op) { return (mpi_state *)(void *)op->bstate; }

static int split_local(MPI_Comm comm, int key, MPI_Comm *out);

/* --------------------------------------------------------------- types */

static void half_reduce(void *in, void *inout, int *len, MPI_Datatype *dt,
                        loom_redop op) {
  /* Widened to f32, combined, rounded once per application: across ranks
   * the wire keeps 2 bytes per element. */
  const void *src[2] = {inout, in};
  loom_comm_reduce(inout, src, 2, (size_t)*len,
                   *dt == G.half[0] ? LOOM_BF16 : LOOM_F16, op, 0);
}
static void half_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
  half_reduce(in, inout, len, dt, LOOM_SUM);
}
static void half_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
  half_reduce(in, inout, len, dt, LOOM_MAX);
}
static void half_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
  half_reduce(in, inout, len, dt, LOOM_MIN);
}
static void half_prod(void *in, void *inout, int *len, MPI_Datatype *dt) {
  half_reduce(in, inout, len, dt, LOOM_PROD);
}

static MPI_Datatype mpi_type(loom_dtype dt) {
  switch (dt) {
  case LOOM_F32:
    return MPI_FLOAT;
  case LOOM_F64:
    return MPI_DOUBLE;
  case LOOM_I32:
    return MPI_INT32_T;
  case LOOM_I64:
    return MPI_INT64_T;
  case LOOM_U8:
    return MPI_UINT8_T;
  case LOOM_BF16:
    return G.half[0];
  case LOOM_F16:
    return G.half[1];
  default:
    return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(loom_dtype dt, loom_redop op) {
  if (dt == LOOM_BF16 || dt == LOOM_F16)
    return G.half_op[op == LOOM_AVG ? LOOM_SUM : op];
  switch (op) {
  case LOOM_SUM:
  case LOOM_AVG:
    return MPI_SUM;
  case LOOM_MAX:
    return MPI_MAX;
  case LOOM_MIN:
    return MPI_MIN;
  case LOOM_PROD:
    return MPI_PROD;
  default:
    return MPI_OP_NULL;
  }
}

loom_status loom_comm_mpi_types(loom_dtype dt, loom_redop op, void *mpi_dtype,
                                void *mpi_op_out) {
  if ((unsigned)dt >= LOOM_DTYPE_COUNT || (unsigned)op >= LOOM_REDOP_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_comm_mpi_types: bad args");
  if (!G.started)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_comm_mpi_types: MPI is not started");
  if (mpi_dtype)
    *(MPI_Datatype *)mpi_dtype = mpi_type(dt);
  if (mpi_op_out)
    *(MPI_Op *)mpi_op_out = mpi_op(dt, op);
  return LOOM_OK;
}

static int fail_mpi(loom_op *op, int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  loom_comm_op_fail(op, LOOM_ERR_REMOTE, "%s: %s", what, msg);
  return 1;
}

static loom_status mpi_status(int rc, const char *what) {
  if (rc == MPI_SUCCESS)
    return LOOM_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  return loom_error(LOOM_ERR_REMOTE, "%s: %s", what, msg);
}

/* --------------------------------------------------------------- groups */

static void group_release(mpi_group *mg) {
  if (!mg)
    return;
  loom_shm_close(mg->shm);
  loom_hier_close(mg->hier);
  if (mg->ctl != MPI_COMM_NULL)
    MPI_Comm_free(&mg->ctl);
  if (mg->comm != MPI_COMM_NULL)
    MPI_Comm_free(&mg->comm);
  loom_free(mg->descs);
  loom_free(mg->creqs);
  loom_free(mg->ibuf);
  loom_free(mg->counts);
  loom_free(mg->displs);
  loom_free(mg->tmp);
  loom_mem_sub(LOOM_MEM_COMM, mg->tmp_bytes);
  loom_free(mg->recs);
  loom_free(mg);
}

/* Maps one segment shared by the ranks of comm (all on one host); every
 * rank learns whether all succeeded, so they agree on the path. */
static loom_shm *open_shm(loom_comm_ctx *ctx, MPI_Comm comm, int rank, int size,
                          const char *label) {
  char name[64] = "";
  int ok = 1;
  loom_shm *shm = NULL;
  if (rank == 0) {
    snprintf(name, sizeof name, "/loom-%d-%08x-%llu", (int)getpid(), G.nonce,
             (unsigned long long)G.shm_made++);
    if (loom_shm_open(&shm, name, true, 0, size, ctx->opts.chunk_bytes,
                      ctx->oversubscribed) != LOOM_OK) {
      LOOM_WARN("comm: no shared-memory path for group %s: %s", label,
                loom_last_error());
      name[0] = '\0';
    }
  }
  if (MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm) != MPI_SUCCESS)
    name[0] = '\0';
  if (!name[0])
    ok = 0;
  else if (rank != 0 &&
           loom_shm_open(&shm, name, false, rank, size, ctx->opts.chunk_bytes,
                         ctx->oversubscribed) != LOOM_OK) {
    LOOM_WARN("comm: cannot map the shared memory of group %s: %s", label,
              loom_last_error());
    ok = 0;
  }
  int all = 0;
  if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
    all = 0;
  /* Everyone has mapped it (or given up): the name can go, so nothing is
   * left in /dev/shm even if the job is killed. */
  if (rank == 0 && name[0])
    loom_shm_unlink(name);
  if (!all) {
    loom_shm_close(shm);
    shm = NULL;
  }
  return shm;
}

/* A group across hosts with the same number of ranks L > 1 on each gets
 * the hierarchical all-reduce: the host's segment (local, the ranks of
 * this host in group order) and the communicator of this local rank across
 * hosts. All ranks agree, or none takes it. */
static void setup_hier(loom_comm_ctx *ctx, loom_group *g, mpi_group *mg,
                       MPI_Comm local) {
  int lmin = 0, lmax = 0;
  if (MPI_Allreduce(&g->local_size, &lmin, 1, MPI_INT, MPI_MIN, mg->comm) !=
          MPI_SUCCESS ||
      MPI_Allreduce(&g->local_size, &lmax, 1, MPI_INT, MPI_MAX, mg->comm) !=
          MPI_SUCCESS)
    return;
  if (lmin != lmax || lmin < 2 || lmin == g->size ||
      lmax > LOOM_SHM_MAX_RANKS) {
    if (lmin != lmax)
      LOOM_DEBUG("comm: group %s has %d to %d ranks a host: the flat "
                 "all-reduce",
                 g->label, lmin, lmax);
    return;
  }
  char label[128];
  snprintf(label, sizeof label, "%s (this host's ranks)", g->label);
  loom_shm *shm = open_shm(ctx, local, g->local_rank, g->local_size, label);
  MPI_Comm cross = MPI_COMM_NULL;
  int ok = shm != NULL;
  if (MPI_Comm_split(mg->comm, g->local_rank, g->rank, &cross) != MPI_SUCCESS)
    ok = 0;
  loom_hier *h = NULL;
  /* Reduce-scatter and all-gather go hierarchical only where each host's
   * ranks are consecutive in the group, in host order. */
  int host_major = 0, hrank = -1;
  if (ok && MPI_Comm_rank(cross, &hrank) == MPI_SUCCESS)
    host_major = g->rank == hrank * g->local_size + g->local_rank;
  int all_major = 0;
  if (MPI_Allreduce(&host_major, &all_major, 1, MPI_INT, MPI_MIN, mg->comm) !=
      MPI_SUCCESS)
    all_major = 0;
  if (ok) {
    MPI_Comm_set_errhandler(cross, MPI_ERRORS_RETURN);
    if (loom_hier_open(&h, shm, &cross, g->local_rank, g->local_size,
                       g->size / g->local_size, all_major != 0,
                       ctx->opts.chunk_bytes) != LOOM_OK)
      ok = 0;
  }
  int all = 0;
  if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mg->comm) != MPI_SUCCESS)
    all = 0;
  if (all) {
    mg->hier = h;
    g->hier = true;
    g->hier_gather = all_major != 0;
    return;
  }
  if (h) {
    loom_hier_close(h); /* owns shm and cross */
    return;
  }
  loom_shm_close(shm);
  if (cross != MPI_COMM_NULL)
    MPI_Comm_free(&cross);
}

/* Fills g from a communicator it now owns (blocking MPI calls: every member
 * is known to be here). */
static loom_status setup_group(loom_comm_ctx *ctx, loom_group *g,
                               MPI_Comm comm) {
  mpi_group *mg = loom_calloc(1, sizeof *mg);
  if (!mg) {
    MPI_Comm_free(&comm);
    return LOOM_ERR_NOMEM;
  }
  mg->comm = comm;
  mg->ctl = MPI_COMM_NULL;
  g->bg = mg;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &g->rank);
  MPI_Comm_size(comm, &g->size);
  loom_status s = mpi_status(MPI_Comm_dup(comm, &mg->ctl), "MPI_Comm_dup");
  if (s != LOOM_OK) {
    mg->ctl = MPI_COMM_NULL;
    goto fail;
  }
  MPI_Comm_set_errhandler(mg->ctl, MPI_ERRORS_RETURN);
  MPI_Comm local;
  s = mpi_status(split_local(comm, g->rank, &local), "MPI_Comm_split_type");
  if (s != LOOM_OK)
    goto fail;
  MPI_Comm_rank(local, &g->local_rank);
  MPI_Comm_size(local, &g->local_size);
  size_t p = (size_t)g->size;
  mg->descs = loom_calloc(p, sizeof(loom_comm_desc));
  mg->creqs = loom_calloc(2 * p, sizeof(MPI_Request));
  mg->ibuf = loom_calloc(2 * p, sizeof *mg->ibuf);
  mg->counts = loom_calloc(p, sizeof *mg->counts);
  mg->displs = loom_calloc(p, sizeof *mg->displs);
  mg->recs = loom_calloc(p, sizeof *mg->recs);
  if (!mg->descs || !mg->creqs || !mg->ibuf || !mg->counts || !mg->displs ||
      !mg->recs) {
    MPI_Comm_free(&local);
    s = LOOM_ERR_NOMEM;
    goto fail;
  }
  for (size_t i = 0; i < 2 * p; i++)
    mg->creqs[i] = MPI_REQUEST_NULL;
  if (ctx->opts.shm && g->size > 1 && g->local_size == g->size &&
      g->size <= LOOM_SHM_MAX_RANKS) {
    mg->shm = open_shm(ctx, mg->comm, g->rank, g->size, g->label);
    g->shm = mg->shm != NULL;
  } else if (ctx->opts.shm && ctx->opts.hier && g->local_size < g->size) {
    setup_hier(ctx, g, mg, local);
  }
  MPI_Comm_free(&local);
  return LOOM_OK;
fail:
  group_release(mg);
  g->bg = NULL;
  return s;
}

/* The number of ranks the launcher announced in the environment, against
 * the size MPI reports. They differ when the program was started by the
 * launcher of another MPI (Debian ships Open MPI and MPICH side by side):
 * each rank then comes up as a singleton and N one-rank jobs would train
 * side by side into the same run directory. */
static loom_status check_launcher_size(void) {
  static const char *const vars[] = {
      "OMPI_COMM_WORLD_SIZE", /* Open MPI's mpirun (ORTE/PRRTE) */
      "PMI_SIZE",             /* MPICH's hydra (PMI-1/2), also Slurm's pmi2 */
  };
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (!v || !v[0])
      continue;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n == size)
      continue;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, "\n,")] = '\0';
    for (char *c = lib; *c; c++) /* "MPICH Version:\t4.0.2" */
      if (*c == '\t')
        *c = ' ';
    return loom_error(LOOM_ERR_MISMATCH,
                      "the launcher started %ld ranks (%s=%s) but MPI sees a "
                      "world of %d: this loom is built with %s and was "
                      "started by another MPI's launcher; start it with the "
                      "mpirun of that MPI, or with `loom run`",
                      n, vars[i], v, size, lib[0] ? lib : "another MPI");
  }
  if (size == 1)
    return loom_comm_check_srun_alone(loom_comm_mpi_impl());
  return LOOM_OK;
}

/* LOOM_COMM_FAKE_HOSTS=K (tests, benchmarks): the world's ranks count as K
 * hosts of consecutive ranks, so one machine exercises the paths of groups
 * that span hosts. Returns this rank's host, or -1. */
static int fake_host(MPI_Comm world) {
  const char *v = getenv("LOOM_COMM_FAKE_HOSTS");
  if (!v || !*v)
    return -1;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  char *end = NULL;
  long k = strtol(v, &end, 10);
  if (*end != '\0' || k < 1 || k > size || size % k != 0) {
    LOOM_WARN("LOOM_COMM_FAKE_HOSTS='%s' is not a number of hosts dividing "
              "the %d ranks; ignored",
              v, size);
    return -1;
  }
  return rank / (size / (int)k);
}

/* The ranks of comm on this host, ordered by key: MPI's view, or the
 * hosts of LOOM_COMM_FAKE_HOSTS (tests), or, for a world grown from
 * env://, the ranks with this host name (Open MPI counts processes that
 * joined by connect/accept as remote even on one host). */
static int split_local(MPI_Comm comm, int key, MPI_Comm *out) {
  if (G.fake_host >= 0)
    return MPI_Comm_split(comm, G.fake_host, key, out);
  if (!G.env_init)
    return MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL,
                               out);
  int size = 0, rank = 0, len = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  char me[MPI_MAX_PROCESSOR_NAME] = "";
  MPI_Get_processor_name(me, &len);
  char *all = loom_calloc((size_t)size, MPI_MAX_PROCESSOR_NAME);
  if (!all)
    return MPI_ERR_NO_MEM;
  int rc = MPI_Allgather(me, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all,
                         MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm);
  int color = rank;
  for (int i = 0; rc == MPI_SUCCESS && i < size; i++)
    if (strcmp(all + (size_t)i * MPI_MAX_PROCESSOR_NAME, me) == 0) {
      color = i; /* the first rank of this host */
      break;
    }
  loom_free(all);
  return rc == MPI_SUCCESS ? MPI_Comm_split(comm, color, key, out) : rc;
}

static loom_status mpi_init(loom_comm_ctx *ctx, loom_group *world) {
  int inited = 0, finalized = 0, provided = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "MPI was already finalised; keep the world group for "
                      "the life of the process");
  memset(&G, 0, sizeof G);
  G.env_init = ctx->env_init;
  if (G.env_init) {
    if (inited)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "LOOM_INIT=env://: MPI was already initialised; "
                        "let loom initialise it");
    loom_status es = loom_envinit_before_mpi();
    if (es != LOOM_OK) {
      loom_envinit_finish(); /* rank 0's server and its files */
      return es;
    }
  }
  if (!inited) {
    /* This thread makes every MPI call, so FUNNELED is enough and keeps
     * MPI's own locking out of the data path. */
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
      return mpi_status(rc, "MPI_Init_thread");
    G.we_init = true;
    if (provided < MPI_THREAD_FUNNELED)
      LOOM_WARN("comm: MPI provides thread level %d only; loom calls MPI "
                "from one thread, which MPI_THREAD_FUNNELED permits",
                provided);
  } else {
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "MPI was initialised by the application with thread "
                        "level %d; loom's communication thread needs "
                        "MPI_THREAD_SERIALIZED or higher (or let loom "
                        "initialise MPI)",
                        provided);
  }
  loom_status ls = G.env_init ? LOOM_OK : check_launcher_size();
  if (ls != LOOM_OK) {
    if (G.we_init)
      MPI_Finalize();
    G.we_init = false;
    return ls;
  }
  MPI_Type_contiguous(2, MPI_BYTE, &G.half[0]);
  MPI_Type_commit(&G.half[0]);
  MPI_Type_contiguous(2, MPI_BYTE, &G.half[1]);
  MPI_Type_commit(&G.half[1]);
  MPI_Op_create(half_sum, 1, &G.half_op[LOOM_SUM]);
  G.half_op[LOOM_AVG] = G.half_op[LOOM_SUM];
  MPI_Op_create(half_max, 1, &G.half_op[LOOM_MAX]);
  MPI_Op_create(half_min, 1, &G.half_op[LOOM_MIN]);
  MPI_Op_create(half_prod, 1, &G.half_op[LOOM_PROD]);
  G.started = true;

  MPI_Comm comm;
  loom_status s = G.env_init ? loom_envinit_world(&comm)
                             : mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &comm),
                                          "MPI_Comm_dup(MPI_COMM_WORLD)");
  if (s != LOOM_OK) {
    if (G.env_init)
      loom_envinit_finish();
    return s;
  }
  G.fake_host = fake_host(comm);
  /* Oversubscription is decided before the segment is made: the shared
   * path yields at once when ranks outnumber cores. */
  MPI_Comm local;
  int lsize = 1;
  if (split_local(comm, 0, &local) == MPI_SUCCESS) {
    MPI_Comm_size(local, &lsize);
    MPI_Comm_free(&local);
  }
  ctx->oversubscribed = lsize > loom_cores();
  ctx->bctx = &G;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  G.nonce = (unsigned)ts.tv_nsec ^ ((unsigned)ts.tv_sec << 20);
  return setup_group(ctx, world, comm);
}

static void mpi_finalize(loom_comm_ctx *ctx) {
  if (ctx->world && ctx->world->bg) {
    group_release(ctx->world->bg);
    ctx->world->bg = NULL;
  }
  if (G.started) {
    for (int i = 0; i < LOOM_REDOP_COUNT; i++)
      if (i != LOOM_AVG)
        MPI_Op_free(&G.half_op[i]);
    MPI_Type_free(&G.half[0]);
    MPI_Type_free(&G.half[1]);
    G.started = false;
  }
  if (G.we_init)
    MPI_Finalize();
  if (G.env_init)
    loom_envinit_finish();
}

/* ----------------------------------------------------------- operations */

static bool fits_int(size_t n) { return n <= (size_t)INT_MAX; }

static void *tmp_buf(mpi_group *mg, size_t bytes) {
  if (mg->tmp_bytes < bytes) {
    loom_free(mg->tmp);
    loom_mem_sub(LOOM_MEM_COMM, mg->tmp_bytes);
    mg->tmp = loom_malloc(bytes);
    mg->tmp_bytes = mg->tmp ? bytes : 0;
    loom_mem_add(LOOM_MEM_COMM, mg->tmp_bytes);
  }
  return mg->tmp;
}

/* Posts chunks of a large all-reduce until the window is full. */
static int post_chunks(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  mpi_state *ms = ms_of(op);
  size_t e = loom_dtype_size(op->dtype);
  for (int w = 0; w < MPI_WINDOW && ms->next < op->count; w++) {
    if (ms->req[w] != MPI_REQUEST_NULL)
      continue;
    size_t n =
        op->count - ms->next < ms->chunk ? op->count - ms->next : ms->chunk;
    const char *sb = (const char *)op->send + ms->next * e;
    char *rb = (char *)op->recv + ms->next * e;
    int rc =
        MPI_Iallreduce(op->send == op->recv ? MPI_IN_PLACE : sb, rb, (int)n,
                       mpi_type(op->dtype), mpi_op(op->dtype, op->redop),
                       mg->comm, &ms->req[w]);
    if (rc != MPI_SUCCESS)
      return fail_mpi(op, rc, "MPI_Iallreduce");
    ms->next += n;
  }
  return 0;
}

static int do_split(loom_comm_ctx *ctx, loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  MPI_Comm nc = MPI_COMM_NULL;
  int rc = MPI_Comm_split(mg->comm, op->color < 0 ? MPI_UNDEFINED : op->color,
                          op->key, &nc);
  int idx = ++g->splits;
  if (rc != MPI_SUCCESS)
    return fail_mpi(op, rc, "MPI_Comm_split");
  if (op->color < 0 || nc == MPI_COMM_NULL) {
    op->child = NULL;
    return 1;
  }
  loom_group *c = op->child;
  c->ctx = ctx;
  snprintf(c->label, sizeof c->label, "%.30s/split%d(color %d)", g->label, idx,
           op->color);
  loom_status s = setup_group(ctx, c, nc);
  if (s != LOOM_OK)
    loom_comm_op_fail(op, s, "split: %s", loom_last_error());
  return 1;
}

/* loom_group_mem_alloc, first half: this rank's object, then everyone's
 * name and size (nonblocking, under the watchdog). */
static int mem_alloc_start(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  mpi_state *ms = ms_of(op);
  size_t bytes = (op->count + 4095) / 4096 * 4096;
  if (!bytes)
    bytes = 4096;
  op->recv = NULL;
  if (!mg->shm) {
    op->recv = loom_calloc(1, bytes);
    if (!op->recv)
      loom_comm_op_fail(op, LOOM_ERR_NOMEM, "mem_alloc of %zu bytes",
                        op->count);
    return 1;
  }
  memset(&mg->mine_rec, 0, sizeof mg->mine_rec);
  snprintf(mg->mine_rec.name, sizeof mg->mine_rec.name, "/loom-%d-%08x-m%llu",
           (int)getpid(), G.nonce, (unsigned long long)G.shm_made++);
  mg->mine_rec.bytes = bytes;
  if (loom_shm_map(mg->mine_rec.name, bytes, true, &op->recv) != LOOM_OK) {
    LOOM_WARN("comm: no shared memory for mem_alloc on group %s: %s", g->label,
              loom_last_error());
    mg->mine_rec.name[0] = '\0';
  }
  int rc = MPI_Iallgather(&mg->mine_rec, (int)sizeof mg->mine_rec, MPI_BYTE,
                          mg->recs, (int)sizeof mg->mine_rec, MPI_BYTE,
                          mg->comm, &ms->req[0]);
  if (rc != MPI_SUCCESS) {
    if (op->recv) {
      loom_shm_unmap(op->recv, bytes);
      loom_shm_unlink(mg->mine_rec.name);
      op->recv = NULL;
    }
    return fail_mpi(op, rc, "mem_alloc");
  }
  return 0;
}

/* Second half: map every rank's object; all agree, or all fall back to
 * private memory. */
static int mem_alloc_finish(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  int p = g->size, me = g->rank;
  int id = mg->mem_allocs++;
  void **base = loom_calloc((size_t)p, sizeof *base);
  size_t *bytes = loom_calloc((size_t)p, sizeof *bytes);
  int ok = base && bytes && op->recv;
  for (int j = 0; ok && j < p; j++) {
    bytes[j] = mg->recs[j].bytes;
    if (j == me)
      base[j] = op->recv;
    else if (!mg->recs[j].name[0] || loom_shm_map(mg->recs[j].name, bytes[j],
                                                  false, &base[j]) != LOOM_OK)
      ok = 0;
  }
  bool added = ok && loom_shm_region_add(mg->shm, id, base, bytes) >= 0;
  ok = added;
  int all = 0;
  if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mg->comm) != MPI_SUCCESS)
    all = 0;
  if (mg->mine_rec.name[0])
    loom_shm_unlink(mg->mine_rec.name); /* everyone mapped it, or gave up */
  if (!all) {
    if (added) {
      loom_shm_region_remove(mg->shm, op->recv);
    } else {
      for (int j = 0; base && bytes && j < p; j++)
        loom_shm_unmap(base[j], bytes[j]);
    }
    op->recv = loom_calloc(1, op->count ? op->count : 1);
    if (!op->recv)
      loom_comm_op_fail(op, LOOM_ERR_NOMEM, "mem_alloc of %zu bytes",
                        op->count);
  }
  loom_free(base);
  loom_free(bytes);
  return 1;
}

/* The data phase: everything is known to match (or is not checked). */
static int data_start(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  mpi_state *ms = ms_of(op);
  loom_comm_ctx *ctx = g->ctx;
  for (int w = 0; w < MPI_WINDOW; w++)
    ms->req[w] = MPI_REQUEST_NULL;
  op->phase = PH_DATA;
  if (loom_hier_takes(mg->hier, op)) {
    op->phase = PH_HIER;
    return loom_hier_start(mg->hier, op);
  }
  if (mg->shm && loom_shm_supports(op->kind)) {
    op->phase = PH_SHM;
    bool moved = false;
    return loom_shm_run(mg->shm, op, &moved);
  }
  size_t e = loom_dtype_size(op->dtype);
  MPI_Datatype t = mpi_type(op->dtype);
  int rc = MPI_SUCCESS;
  const char *what = loom_comm_op_name(op->kind);
  bool inplace = op->send == op->recv;
  if (op->kind != LOOM_COMM_ALLREDUCE && op->kind != LOOM_COMM_ALLGATHERV &&
      op->kind != LOOM_COMM_MEM_ALLOC && !fits_int(op->count)) {
    loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED,
                      "%s of %zu elements: more than MPI's int counts allow "
                      "between hosts; split it",
                      what, op->count);
    return 1;
  }
  int n = (int)op->count;
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
    ms->chunk = ctx->opts.chunk_bytes * 4 / e;
    if (ms->chunk > (size_t)INT_MAX)
      ms->chunk = (size_t)INT_MAX;
    ms->next = 0;
    if (op->count == 0)
      return 1;
    return post_chunks(g, op);
  case LOOM_COMM_REDUCE:
    rc = MPI_Ireduce(inplace && g->rank == op->root ? MPI_IN_PLACE : op->send,
                     op->recv, n, t, mpi_op(op->dtype, op->redop), op->root,
                     mg->comm, &ms->req[0]);
    break;
  case LOOM_COMM_BROADCAST:
    if (g->rank == op->root && !inplace && n)
      memcpy(op->recv, op->send, op->count * e);
    rc = MPI_Ibcast(op->recv, n, t, op->root, mg->comm, &ms->req[0]);
    break;
  case LOOM_COMM_ALLGATHER:
    rc = MPI_Iallgather(op->send == (const char *)op->recv +
                                        (size_t)g->rank * op->count * e
                            ? MPI_IN_PLACE
                            : op->send,
                        n, t, op->recv, n, t, mg->comm, &ms->req[0]);
    break;
  case LOOM_COMM_ALLGATHERV: {
    size_t d = 0;
    for (int r = 0; r < g->size; r++) {
      if (!fits_int(op->counts[r]) || !fits_int(d)) {
        loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED,
                          "allgatherv: counts beyond MPI's int range");
        return 1;
      }
      mg->counts[r] = (int)op->counts[r];
      mg->displs[r] = (int)d;
      d += op->counts[r];
    }
    const void *sb =
        op->send == (const char *)op->recv + (size_t)mg->displs[g->rank] * e
            ? MPI_IN_PLACE
            : op->send;
    rc = MPI_Iallgatherv(sb, mg->counts[g->rank], t, op->recv, mg->counts,
                         mg->displs, t, mg->comm, &ms->req[0]);
    break;
  }
  case LOOM_COMM_REDUCE_SCATTER: {
    void *rb = op->recv;
    if ((const char *)op->send + (size_t)g->rank * op->count * e ==
        (const char *)op->recv) {
      rb = tmp_buf(mg, op->count * e);
      if (!rb && op->count) {
        loom_comm_op_fail(op, LOOM_ERR_NOMEM, "reducescatter: no memory");
        return 1;
      }
    }
    rc = MPI_Ireduce_scatter_block(op->send, rb, n, t,
                                   mpi_op(op->dtype, op->redop), mg->comm,
                                   &ms->req[0]);
    break;
  }
  case LOOM_COMM_ALLTOALL: {
    const void *sb = op->send;
    if (inplace && n) {
      void *tb = tmp_buf(mg, op->count * (size_t)g->size * e);
      if (!tb) {
        loom_comm_op_fail(op, LOOM_ERR_NOMEM, "alltoall: no memory");
        return 1;
      }
      memcpy(tb, op->send, op->count * (size_t)g->size * e);
      sb = tb;
    }
    rc = MPI_Ialltoall(sb, n, t, op->recv, n, t, mg->comm, &ms->req[0]);
    break;
  }
  case LOOM_COMM_BARRIER:
    rc = MPI_Ibarrier(mg->comm, &ms->req[0]);
    break;
  case LOOM_COMM_SPLIT:
    /* Everyone's (color, key), nonblocking: once it completes every rank is
     * known to be here and the blocking MPI_Comm_split cannot hang. */
    mg->pair[0] = op->color;
    mg->pair[1] = op->key;
    rc = MPI_Iallgather(mg->pair, 2, MPI_INT, mg->ibuf, 2, MPI_INT, mg->comm,
                        &ms->req[0]);
    break;
  case LOOM_COMM_FREE:
    group_release(mg);
    g->bg = NULL;
    return 1;
  case LOOM_COMM_MEM_ALLOC:
    return mem_alloc_start(g, op);
  case LOOM_COMM_MEM_FREE:
    if (!mg->shm || !loom_shm_region_remove(mg->shm, (void *)op->send))
      loom_free((void *)(uintptr_t)op->send);
    return 1;
  default:
    loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED, "mpi: unsupported op %s", what);
    return 1;
  }
  if (rc != MPI_SUCCESS)
    return fail_mpi(op, rc, what);
  return 0;
}

/* After the MPI requests of the data phase completed. */
static int data_finish(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  size_t e = loom_dtype_size(op->dtype);
  switch (op->kind) {
  case LOOM_COMM_ALLREDUCE:
    if (op->redop == LOOM_AVG)
      loom_comm_divide(op->recv, op->count, op->dtype, g->size);
    break;
  case LOOM_COMM_REDUCE:
    if (op->redop == LOOM_AVG && g->rank == op->root)
      loom_comm_divide(op->recv, op->count, op->dtype, g->size);
    break;
  case LOOM_COMM_REDUCE_SCATTER:
    if ((const char *)op->send + (size_t)g->rank * op->count * e ==
            (const char *)op->recv &&
        op->count)
      memcpy(op->recv, mg->tmp, op->count * e);
    if (op->redop == LOOM_AVG)
      loom_comm_divide(op->recv, op->count, op->dtype, g->size);
    break;
  case LOOM_COMM_SPLIT:
    return do_split(g->ctx, g, op);
  case LOOM_COMM_MEM_ALLOC:
    return mem_alloc_finish(g, op);
  default:
    break;
  }
  return 1;
}

static int post_check(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  int p = g->size, me = g->rank;
  for (int j = 0; j < p; j++) {
    MPI_Request *rr = &mg->creqs[2 * j], *sr = &mg->creqs[2 * j + 1];
    *rr = *sr = MPI_REQUEST_NULL;
    if (j == me)
      continue;
    int rc = MPI_Irecv(&mg->descs[j], (int)sizeof mg->descs[j], MPI_BYTE, j,
                       TAG_CHECK, mg->ctl, rr);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(&mg->mine, (int)sizeof mg->mine, MPI_BYTE, j, TAG_CHECK,
                     mg->ctl, sr);
    if (rc != MPI_SUCCESS)
      return fail_mpi(op, rc, "check header");
  }
  op->phase = PH_CHECK_MPI;
  return 0;
}

static int mpi_progress(loom_group *g, loom_op *op, bool *moved, bool *poll);

static int mpi_start(loom_group *g, loom_op *op) {
  mpi_group *mg = g->bg;
  mpi_state *ms = ms_of(op);
  for (int w = 0; w < MPI_WINDOW; w++)
    ms->req[w] = MPI_REQUEST_NULL;
  if (!mg) {
    loom_comm_op_fail(op, LOOM_ERR_INVALID_ARG, "group was freed");
    return 1;
  }
  switch (op->kind) {
  case LOOM_COMM_SEND:
  case LOOM_COMM_RECV: {
    if (!fits_int(op->count)) {
      loom_comm_op_fail(op, LOOM_ERR_UNSUPPORTED,
                        "%s of %zu elements exceeds MPI's int counts",
                        loom_comm_op_name(op->kind), op->count);
      return 1;
    }
    int rc = op->kind == LOOM_COMM_SEND
                 ? MPI_Isend(op->send, (int)op->count, mpi_type(op->dtype),
                             op->root, op->tag, mg->comm, &ms->req[0])
                 : MPI_Irecv(op->recv, (int)op->count, mpi_type(op->dtype),
                             op->root, op->tag, mg->comm, &ms->req[0]);
    if (rc != MPI_SUCCESS)
      return fail_mpi(op, rc, loom_comm_op_name(op->kind));
    op->phase = PH_DATA;
    return 0;
  }
  case LOOM_COMM_CALL:
    op->status = op->fn(op->fn_ctx, g, &mg->comm);
    if (op->status != LOOM_OK)
      snprintf(op->err, sizeof op->err, "%s", loom_last_error());
    return 1;
  default:
    break;
  }
  loom_comm_desc_of(op, g->size, &mg->mine);
  if (mg->shm)
    loom_shm_enter(mg->shm, op, &mg->mine);
  if (g->ctx->opts.check && g->size > 1) {
    if (mg->shm) {
      op->phase = PH_CHECK_SHM;
    } else if (post_check(g, op)) {
      return 1;
    }
    bool moved = false, poll = false;
    return mpi_progress(g, op, &moved, &poll);
  }
  return data_start(g, op);
}

static int mpi_progress(loom_group *g, loom_op *op, bool *moved, bool *poll) {
  mpi_group *mg = g->bg;
  mpi_state *ms = ms_of(op);
  switch (op->phase) {
  case PH_CHECK_SHM:
    if (!loom_shm_check(mg->shm, g, op))
      return 0;
    *moved = true;
    if (op->status != LOOM_OK)
      return 1;
    return data_start(g, op);
  case PH_CHECK_MPI: {
    /* One MPI_Test each (not MPI_Testall): completed receives become
     * MPI_REQUEST_NULL, which tells the watchdog who has arrived. */
    bool all = true;
    *poll = true;
    for (int i = 0; i < 2 * g->size; i++) {
      if (mg->creqs[i] == MPI_REQUEST_NULL)
        continue;
      int flag = 0;
      int rc = MPI_Test(&mg->creqs[i], &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail_mpi(op, rc, "check header");
      if (!flag)
        all = false;
    }
    if (!all)
      return 0;
    *moved = true;
    mg->descs[g->rank] = mg->mine;
    if (loom_comm_check_descs(g, op, mg->descs, g->size) != LOOM_OK)
      return 1;
    return data_start(g, op);
  }
  case PH_SHM:
    return loom_shm_run(mg->shm, op, moved);
  case PH_HIER:
    return loom_hier_progress(mg->hier, op, moved, poll);
  case PH_DATA: {
    *poll = true;
    bool all = true;
    for (int w = 0; w < MPI_WINDOW; w++) {
      if (ms->req[w] == MPI_REQUEST_NULL)
        continue;
      int flag = 0;
      int rc = MPI_Test(&ms->req[w], &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail_mpi(op, rc, loom_comm_op_name(op->kind));
      if (flag) {
        ms->req[w] = MPI_REQUEST_NULL;
        *moved = true;
      } else {
        all = false;
      }
    }
    if (op->kind == LOOM_COMM_ALLREDUCE && ms->next < op->count) {
      if (post_chunks(g, op))
        return 1;
      return 0;
    }
    if (!all)
      return 0;
    return data_finish(g, op);
  }
  default:
    return 1;
  }
}

static void mpi_stuck(loom_group *g, loom_op *op, char *buf, size_t n) {
  mpi_group *mg = g->bg;
  if (!mg) {
    snprintf(buf, n, "the group was freed");
    return;
  }
  if (op->kind == LOOM_COMM_SEND || op->kind == LOOM_COMM_RECV) {
    snprintf(buf, n, "rank %d has not posted the matching %s", op->root,
             op->kind == LOOM_COMM_SEND ? "recv" : "send");
    return;
  }
  if (mg->shm) {
    loom_shm_stuck(mg->shm, op, buf, n);
    return;
  }
  if (op->phase == PH_HIER) {
    loom_hier_stuck(mg->hier, buf, n);
    return;
  }
  if (op->phase == PH_CHECK_MPI) {
    bool *flag = loom_calloc((size_t)g->size, sizeof *flag);
    if (flag) {
      for (int j = 0; j < g->size; j++) {
        if (j == g->rank)
          continue;
        flag[j] = mg->creqs[2 * j] != MPI_REQUEST_NULL;
      }
      char list[160];
      loom_comm_rank_list(flag, g->size, list, sizeof list);
      snprintf(buf, n, "ranks not arrived: %s", list);
      loom_free(flag);
      return;
    }
  }
  if (op->phase == PH_DATA) {
    snprintf(buf, n,
             "stalled inside MPI; which ranks have not arrived is unknown "
             "(LOOM_COMM_CHECK=1 names them)");
    return;
  }
  snprintf(buf, n, "stalled");
}

static bool mpi_sleep(loom_group *g, loom_op *op, double seconds) {
  mpi_group *mg = g->bg;
  loom_shm *shm = !mg                    ? NULL
                  : op->phase == PH_HIER ? loom_hier_waiting_shm(mg->hier)
                  : op->phase == PH_SHM || op->phase == PH_CHECK_SHM ? mg->shm
                                                                     : NULL;
  if (!shm)
    return false;
  loom_comm_ctx *ctx = g->ctx;
  atomic_store(&ctx->sleep_bell, loom_shm_bell(shm));
  loom_shm_sleep(shm, seconds, &ctx->queued, ctx->q_seen);
  atomic_store(&ctx->sleep_bell, NULL);
  return true;
}

/* Bytes written to fd that its reader has not taken yet: a pipe's content,
 * a socket's unsent or unread queue; -1 for anything else. */
static long fd_unread(int fd) {
  struct stat st;
  int n = 0;
  if (fstat(fd, &st) != 0)
    return -1;
  if (S_ISFIFO(st.st_mode) && ioctl(fd, FIONREAD, &n) == 0)
    return n;
  if (S_ISSOCK(st.st_mode) && ioctl(fd, TIOCOUTQ, &n) == 0)
    return n;
  return -1;
}

/* Waits (up to max_s) until the launcher has read what this rank wrote to
 * stdout and stderr. MPI_Abort makes the launcher kill every process of the
 * job, its own forwarders included: under MPICH's hydra a proxy killed
 * before it read the pipe loses the rank's last lines, which are the ones
 * that say why the job ends. Polls the pipes' fill, so it costs nothing when
 * the reader keeps up. */
static void drain_stdio(double max_s) {
  double end = loom_time_now() + max_s;
  for (;;) {
    long a = fd_unread(STDOUT_FILENO), b = fd_unread(STDERR_FILENO);
    if (a <= 0 && b <= 0)
      return;
    if (loom_time_now() > end)
      return;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

static void mpi_abort(loom_comm_ctx *ctx, int code) {
  fflush(stdout);
  fflush(stderr);
  drain_stdio(2.0);
  /* A world grown from env:// is not MPI_COMM_WORLD (that is this process
   * alone): abort the grown one, so the other ranks go down too. */
  mpi_group *w = G.env_init && ctx->world ? ctx->world->bg : NULL;
  MPI_Abort(w ? w->comm : MPI_COMM_WORLD, code);
}

static void *mpi_native(loom_group *g) {
  mpi_group *mg = g->bg;
  return mg ? &mg->comm : NULL;
}

const loom_backend loom_backend_mpi = {
    .name = "mpi",
    .version = 1,
    .init = mpi_init,
    .finalize = mpi_finalize,
    .start = mpi_start,
    .progress = mpi_progress,
    .stuck = mpi_stuck,
    .abort = mpi_abort,
    .native = mpi_native,
    .sleep = mpi_sleep,
};

void loom_comm_path_counts(loom_group *g, uint64_t *direct, uint64_t *staged) {
  mpi_group *mg = g && g->ctx->be == &loom_backend_mpi ? g->bg : NULL;
  loom_shm_counts(mg ? mg->shm : NULL, direct, staged);
}

uint64_t loom_comm_hier_count(loom_group *g) {
  mpi_group *mg = g && g->ctx->be == &loom_backend_mpi ? g->bg : NULL;
  return loom_hier_count(mg ? mg->hier : NULL);
}

void loom_comm_hier_counts(loom_group *g, uint64_t *allreduce,
                           uint64_t *reduce_scatter, uint64_t *allgather) {
  mpi_group *mg = g && g->ctx->be == &loom_backend_mpi ? g->bg : NULL;
  loom_hier_counts(mg ? mg->hier : NULL, allreduce, reduce_scatter, allgather);
}

#else /* !LOOM_HAVE_MPI */

void loom_comm_path_counts(loom_group *g, uint64_t *direct, uint64_t *staged) {
  (void)g;
  *direct = *staged = 0;
}

uint64_t loom_comm_hier_count(loom_group *g) {
  (void)g;
  return 0;
}

void loom_comm_hier_counts(loom_group *g, uint64_t *allreduce,
                           uint64_t *reduce_scatter, uint64_t *allgather) {
  (void)g;
  *allreduce = *reduce_scatter = *allgather = 0;
}

loom_status loom_comm_mpi_types(loom_dtype dt, loom_redop op, void *mpi_dtype,
                                void *mpi_op) {
  (void)dt;
  (void)op;
  (void)mpi_dtype;
  (void)mpi_op;
  return loom_error(LOOM_ERR_UNSUPPORTED, "this loom was built without MPI");
}

#endif

/* Which MPI the file was compiled against (mpi.h's own macros). */
const char *loom_comm_mpi_impl(void) {
#if defined(LOOM_HAVE_MPI) && defined(OPEN_MPI)
  return "openmpi";
#elif defined(LOOM_HAVE_MPI) && defined(MPICH_VERSION)
  return "mpich";
#elif defined(LOOM_HAVE_MPI)
  return "mpi";
#else
  return "none";
#endif
}
