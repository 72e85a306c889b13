/* The comm layer's front: world and split groups, posting operations to the
 * one communication thread of the process, requests, and that thread's loop
 * with its watchdog. */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const backend_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_COMM_BACKEND_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof backend_names / sizeof backend_names[0] ==
                   LOOM_COMM_BACKEND_COUNT,
               "backend name table");

/* The process context: one communication thread for all groups. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_comm_ctx *g_ctx;
static bool g_atexit_set;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* ------------------------------------------------------------- options */

/* Environment variables: unset or empty gives the default; a value that
 * does not parse is named in a warning and the default is used, never read
 * as 0. */

/* A finite number >= 0, with nothing after it. */
static double env_number(const char *name, double dflt) {
  const char *v = getenv(name);
  if (!v || !*v)
    return dflt;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end != '\0' || errno == ERANGE || !isfinite(x) || x < 0) {
    LOOM_WARN("%s='%s' is not a finite number >= 0; using %g", name, v, dflt);
    return dflt;
  }
  return x;
}

/* Bytes: a number >= 0 with an optional K, M or G suffix (powers of 1024). */
static size_t env_bytes(const char *name, size_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v)
    return dflt;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  bool ok = end != v && errno != ERANGE && isfinite(x) && x >= 0;
  switch (ok ? *end : '\0') {
  case 'k':
  case 'K':
    x *= 1024;
    end++;
    break;
  case 'm':
  case 'M':
    x *= 1024 * 1024;
    end++;
    break;
  case 'g':
  case 'G':
    x *= 1024.0 * 1024 * 1024;
    end++;
    break;
  default:
    break;
  }
  /* 2^62: far above any chunk, and the cast below stays defined. */
  if (!ok || *end != '\0' || x >= 0x1p62) {
    LOOM_WARN("%s='%s' is not a size in bytes (a number with an optional K, "
              "M or G); using %zu",
              name, v, dflt);
    return dflt;
  }
  return (size_t)x;
}

static bool env_flag(const char *name, bool dflt) {
  const char *v = getenv(name);
  if (!v || !*v)
    return dflt;
  return !(strcmp(v, "0") == 0 || strcmp(v, "off") == 0 ||
           strcmp(v, "false") == 0 || strcmp(v, "no") == 0);
}

loom_comm_opts loom_comm_opts_default(void) {
  loom_comm_opts o = {.backend = LOOM_COMM_AUTO,
                      .timeout_s = 600,
                      .check = false,
                      .abort_on_timeout = true,
                      .shm = true,
                      .chunk_bytes = 256 * 1024,
                      .hier = true};
  const char *v = getenv("LOOM_COMM_BACKEND");
  if (v && *v) {
    int i = 0;
    while (i < LOOM_COMM_BACKEND_COUNT && strcmp(v, backend_names[i]) != 0)
      i++;
    if (i < LOOM_COMM_BACKEND_COUNT)
      o.backend = (loom_comm_backend)i;
    else
      LOOM_WARN("LOOM_COMM_BACKEND='%s' is not auto, self or mpi; using %s", v,
                backend_names[o.backend]);
  }
  o.timeout_s = env_number("LOOM_COMM_TIMEOUT", o.timeout_s);
  o.check = env_flag("LOOM_COMM_CHECK", o.check);
  o.abort_on_timeout = env_flag("LOOM_COMM_ABORT", o.abort_on_timeout);
  o.shm = env_flag("LOOM_COMM_SHM", o.shm);
  o.hier = env_flag("LOOM_COMM_HIER", o.hier);
  o.chunk_bytes = env_bytes("LOOM_COMM_CHUNK", o.chunk_bytes);
  return o;
}

/* Started by mpirun / mpiexec / srun with an MPI plugin? */
static bool launched_by_mpi(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                     "PMI_RANK", "PMIX_RANK",
                                     "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i]))
      return true;
  return false;
}

loom_status loom_comm_check_srun_alone(const char *mpi_lib) {
  /* mpirun and mpiexec inside an allocation say the world's size
   * themselves; their ranks keep the variables of the srun step that
   * started the daemons (SLURM_PROCID is 0 for every rank), which say
   * nothing about the world. */
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE"))
    return LOOM_OK;
  const char *v = getenv("SLURM_STEP_NUM_TASKS");
  if (!v || !*v)
    return LOOM_OK;
  char *end = NULL;
  long n = strtol(v, &end, 10);
  if (*end != '\0' || n <= 1)
    return LOOM_OK;
  if (strcmp(mpi_lib, "none") == 0)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "srun started %ld tasks (SLURM_STEP_NUM_TASKS=%s) but "
                      "this loom was built without MPI: they would train as "
                      "%ld separate one-rank jobs; rebuild with "
                      "-DLOOM_MPI=openmpi or mpich",
                      n, v, n);
  const bool mpich = strcmp(mpi_lib, "mpich") == 0;
  return loom_error(LOOM_ERR_MISMATCH,
                    "srun started %ld tasks (SLURM_STEP_NUM_TASKS=%s) but "
                    "this one is alone in its world: srun gave it no process "
                    "management interface that %s speaks, and %ld separate "
                    "one-rank jobs would train side by side; start it with "
                    "srun --mpi=%s, or with `loom run`",
                    n, v, mpich ? "MPICH" : "Open MPI", n,
                    mpich ? "pmi2" : "pmix");
}

/* ------------------------------------------------------ the thread loop */

/* After op's DONE store (op itself is not touched: only its address is
 * compared). A lone waiter names the operation it sleeps on, so finishing a
 * batch of operations wakes it once, not once per operation. */
static void wake_waiters(loom_comm_ctx *ctx, const loom_op *op) {
  int n = atomic_load(&ctx->waiters);
  if (n > 1 || (n == 1 && atomic_load(&ctx->wait_op) == op)) {
    pthread_mutex_lock(&ctx->done_mu);
    pthread_cond_broadcast(&ctx->done_cv);
    pthread_mutex_unlock(&ctx->done_mu);
  }
}

/* The op hook (the trace): read by the communication thread. */
static _Atomic(loom_comm_op_hook) g_op_fn;
static void *_Atomic g_op_user;

/* Publishes the result; the caller may reuse the request at once, so
 * nothing touches op afterwards. */
static void finish(loom_comm_ctx *ctx, loom_op *op) {
  loom_group *g = op->group;
  g->inflight--;
  if (g->active == op)
    g->active = NULL;
  op->t_end = loom_time_now();
  loom_comm_op_hook hook = atomic_load(&g_op_fn);
  if (hook) {
    bool data = op->kind != LOOM_COMM_CALL && op->kind != LOOM_COMM_SPLIT &&
                op->kind != LOOM_COMM_FREE;
    hook(atomic_load(&g_op_user), loom_comm_op_name(op->kind), g->label,
         data ? op->count * loom_dtype_size(op->dtype) : 0, op->t_start,
         op->t_end);
  }
  atomic_store(&op->state, LOOM_REQ_DONE);
  wake_waiters(ctx, op);
}

static void mark_broken(loom_group *g, loom_status s, const char *msg) {
  if (atomic_load(&g->broken))
    return;
  g->broken_status = s;
  snprintf(g->broken_msg, sizeof g->broken_msg, "%s", msg);
  atomic_store(&g->broken, 1);
}

static bool can_start(const loom_op *op) {
  const loom_group *g = op->group;
  if (op->kind == LOOM_COMM_FREE)
    return g->inflight == 0;
  if (op->collective)
    return g->active == NULL;
  return true;
}

/* Returns 1 when op completed at once. */
static int start_op(loom_comm_ctx *ctx, loom_op *op, double now) {
  loom_group *g = op->group;
  op->started = true;
  op->t_start = now;
  op->deadline = now + ctx->opts.timeout_s;
  op->phase = 0;
  memset(op->bstate, 0, sizeof op->bstate);
  atomic_store_explicit(&op->state, LOOM_REQ_ACTIVE, memory_order_relaxed);
  g->inflight++;
  if (op->collective) {
    g->active = op;
    if (op->kind != LOOM_COMM_CALL) /* calls are not checked */
      op->seq = ++g->next_seq;
  }
  if (atomic_load(&g->broken) && op->kind != LOOM_COMM_FREE) {
    loom_comm_op_fail(op, LOOM_ERR_REMOTE, "group %s is broken: %s", g->label,
                      g->broken_msg);
    return 1;
  }
  return ctx->be->start(g, op);
}

/* The abort hook: set by the trainer, read by the communication thread. */
static _Atomic(loom_comm_abort_hook) g_abort_fn;
static void *_Atomic g_abort_ctx;

void loom_comm_set_abort_hook(loom_comm_abort_hook fn, void *ctx) {
  atomic_store(&g_abort_ctx, ctx);
  atomic_store(&g_abort_fn, fn);
}

void loom_comm_set_op_hook(loom_comm_op_hook fn, void *user) {
  atomic_store(&g_op_user, user);
  atomic_store(&g_op_fn, fn);
}

static void abort_hook_call(const char *why, int code) {
  loom_comm_abort_hook fn = atomic_load(&g_abort_fn);
  if (fn)
    fn(atomic_load(&g_abort_ctx), why, code);
}

static void watchdog_fire(loom_comm_ctx *ctx, loom_op *op) {
  loom_group *g = op->group;
  char who[200], what[160];
  loom_comm_desc d;
  if (op->collective) {
    loom_comm_desc_of(op, g->size, &d);
    loom_comm_desc_str(&d, what, sizeof what);
  } else {
    snprintf(what, sizeof what, "%s (peer %d, tag %d, count %zu)",
             loom_comm_op_name(op->kind), op->root, op->tag, op->count);
  }
  ctx->be->stuck(g, op, who, sizeof who);
  loom_comm_op_fail(op, LOOM_ERR_TIMEOUT,
                    "watchdog: %s on group %s (rank %d of %d) did not "
                    "complete in %g s: %s",
                    what, g->label, g->rank, g->size, ctx->opts.timeout_s, who);
  LOOM_LOG_ERROR("%s", op->err);
  mark_broken(g, LOOM_ERR_TIMEOUT, op->err);
  if (ctx->opts.abort_on_timeout && g->size > 1) {
    /* Told to loom run before the abort, which takes this process down. */
    abort_hook_call(op->err, LOOM_COMM_EXIT_TIMEOUT);
    LOOM_LOG_ERROR("comm: aborting the job (exit code %d) so that it can be "
                   "restarted; LOOM_COMM_ABORT=0 keeps it alive",
                   LOOM_COMM_EXIT_TIMEOUT);
    ctx->be->abort(ctx, LOOM_COMM_EXIT_TIMEOUT);
  }
}

/* One pass over the operations in flight: start the next ones in program
 * order, advance the others, fire the watchdog. Returns whether anything
 * visible happened. */
static bool step_all(loom_comm_ctx *ctx, bool *poll) {
  bool moved = false;
  double now = loom_time_now();
  bool timeouts = ctx->opts.timeout_s > 0;
  loom_op *prev = NULL, *op = ctx->fl_head;
  while (op) {
    loom_op *next = op->next;
    int done;
    if (!op->started) {
      if (!can_start(op))
        break; /* later operations start after this one */
      done = start_op(ctx, op, now);
      moved = true;
    } else {
      bool m = false;
      done = ctx->be->progress(op->group, op, &m, poll);
      if (m)
        moved = true;
      if (!done && timeouts && now > op->deadline) {
        watchdog_fire(ctx, op);
        done = 1;
      }
    }
    if (done) {
      if (prev)
        prev->next = next;
      else
        ctx->fl_head = next;
      if (ctx->fl_tail == op)
        ctx->fl_tail = prev;
      finish(ctx, op);
      moved = true;
    } else {
      prev = op;
    }
    op = next;
  }
  return moved;
}

static void handle_abort(loom_comm_ctx *ctx) {
  int code = atomic_exchange(&ctx->abort_code, -1);
  if (code < 0)
    return;
  LOOM_LOG_ERROR("comm: aborting the job with exit code %d", code);
  ctx->be->abort(ctx, code); /* returns only for backends without a job */
  char msg[64];
  snprintf(msg, sizeof msg, "aborted with code %d", code);
  if (ctx->world)
    mark_broken(ctx->world, LOOM_ERR_REMOTE, msg);
  atomic_store(&ctx->abort_done, 1);
}

static void nap(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* Wakes the thread wherever it waits: on its condition variable (nothing
 * in flight) or on a shared-memory bell (peers late). */
static void kick(loom_comm_ctx *ctx) {
  atomic_uint *b = atomic_load(&ctx->sleep_bell);
  if (b)
    loom_shm_ring(b);
}

/* Pause instructions before yielding while waiting for peers. */
#define SPIN_RELAX 64

/* CLOCK_MONOTONIC now + seconds (>= 0), for the timed waits on cv and
 * done_cv (both on that clock). */
static struct timespec deadline_in(double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double whole = seconds > 0 ? floor(seconds) : 0;
  ts.tv_sec += (time_t)(whole < 1e9 ? whole : 1e9);
  ts.tv_nsec += seconds > 0 ? (long)((seconds - whole) * 1e9) : 0;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* MPI requests in flight that no thread waits for yet (a pipeline's
 * receive posted before its compute, a send the peer has not matched): they
 * move only through MPI_Test, but yielding in a loop for the whole compute
 * takes a third of a core from the compute threads (measured: the two
 * comm threads of a 2-rank pipeline on 2 cores, 25% of all samples). So
 * nap on cv, an eighth of the time nothing has moved (a transfer in flight
 * loses at most an eighth of its pace), at most doze_s; a new operation, a
 * new waiter, an abort or a stop wakes the thread at once. */
static void doze(loom_comm_ctx *ctx, double seconds) {
  pthread_mutex_lock(&ctx->mu);
  atomic_store(&ctx->dozing, 1);
  /* Either the waiter sees dozing and signals under mu, or this sees its
   * count (both sequentially consistent). */
  if (atomic_load(&ctx->waiters) == 0 && !ctx->q_head && !ctx->stop &&
      atomic_load(&ctx->abort_code) < 0) {
    struct timespec ts = deadline_in(seconds);
    ctx->sleeping = true;
    pthread_cond_timedwait(&ctx->cv, &ctx->mu, &ts);
    ctx->sleeping = false;
  }
  atomic_store(&ctx->dozing, 0);
  pthread_mutex_unlock(&ctx->mu);
}

/* Whether every operation in flight is point to point: the doze is kept
 * to those (a pipeline's activations and gradients). A collective over MPI
 * that nobody waits for yet keeps the yielding loop: under load the doze
 * made the two ranks of a DDP step over MPI read less even (obs_report's
 * communication-bound run: busy_skew up to 1.27 against 1.19). */
static bool only_p2p(const loom_comm_ctx *ctx) {
  for (const loom_op *op = ctx->fl_head; op; op = op->next)
    if (op->collective)
      return false;
  return true;
}

static void run_loop(loom_comm_ctx *ctx) {
  long idle = 0;
  double idle_since = 0;
  bool dozed = false; /* the last pass dozed: look at the clock again */
  for (;;) {
    pthread_mutex_lock(&ctx->mu);
    ctx->q_seen = atomic_load(&ctx->queued);
    if (ctx->q_head) {
      if (ctx->fl_tail)
        ctx->fl_tail->next = ctx->q_head;
      else
        ctx->fl_head = ctx->q_head;
      ctx->fl_tail = ctx->q_tail;
      ctx->q_head = ctx->q_tail = NULL;
    }
    if (ctx->stop_now || (ctx->stop && !ctx->fl_head)) {
      pthread_mutex_unlock(&ctx->mu);
      break;
    }
    if (!ctx->fl_head && atomic_load(&ctx->abort_code) < 0) {
      /* Idle: linger a little first, since a training loop or a benchmark
       * posts the next operation right away and waking a sleeping thread
       * costs tens of microseconds (more in a VM). */
      if (ctx->spin_s > 0 && idle >= 0) {
        pthread_mutex_unlock(&ctx->mu);
        double until = loom_time_now() + ctx->spin_s;
        unsigned seen = ctx->q_seen;
        bool more = false;
        for (int i = 0; !more; i++) {
          cpu_relax();
          more = atomic_load(&ctx->queued) != seen;
          if ((i & 63) == 63 && loom_time_now() > until)
            break;
        }
        idle = more ? 0 : -1; /* -1: lingered in vain, sleep next time */
        continue;
      }
      ctx->sleeping = true;
      pthread_cond_wait(&ctx->cv, &ctx->mu);
      ctx->sleeping = false;
      pthread_mutex_unlock(&ctx->mu);
      idle = 0;
      continue;
    }
    pthread_mutex_unlock(&ctx->mu);
    handle_abort(ctx);
    bool poll = false;
    if (step_all(ctx, &poll)) {
      idle = 0;
      dozed = false;
      continue;
    }
    /* Nothing moved: spin briefly, then give the core away (at once when
     * ranks outnumber cores), then sleep until a peer publishes (or nap
     * when the backend cannot sleep that way). MPI requests in flight
     * (poll) need MPI_Test calls to move: yield, or doze while nobody
     * waits for them. */
    idle++;
    bool timed = idle == 1 || (idle & 15) == 0 || dozed; /* the clock costs */
    double now = timed ? loom_time_now() : 0;
    if (idle == 1)
      idle_since = now;
    loom_op *first = ctx->fl_head;
    bool oversub = ctx->oversubscribed;
    if (!poll && first && first->started && ctx->be->sleep &&
        (oversub ? idle > 4 : timed && now - idle_since > ctx->spin_s)) {
      double left = ctx->opts.timeout_s > 0 ? first->deadline - now : 0.05;
      if (left > 0.05)
        left = 0.05;
      if (left < 0)
        left = 0;
      if (ctx->be->sleep(first->group, first, left))
        continue;
    }
    if (poll && timed && ctx->doze_s > 0 && now - idle_since > ctx->spin_s &&
        atomic_load(&ctx->waiters) == 0 && only_p2p(ctx)) {
      double d = (now - idle_since) / 8;
      doze(ctx, d < ctx->doze_s ? d : ctx->doze_s);
      dozed = true;
      continue;
    }
    dozed = false;
    if (oversub || idle > SPIN_RELAX)
      sched_yield();
    else
      cpu_relax();
    if (!poll && idle > 4000)
      nap(idle > 40000 ? 200000 : 20000);
  }
}

static void *comm_main(void *arg) {
  loom_comm_ctx *ctx = arg;
  loom_status s = ctx->be->init(ctx, ctx->world);
  if (ctx->oversubscribed)
    ctx->spin_s = 0; /* a spinning thread takes a core another rank needs */
  pthread_mutex_lock(&ctx->done_mu);
  ctx->init_status = s;
  if (s != LOOM_OK)
    snprintf(ctx->init_msg, sizeof ctx->init_msg, "%s", loom_last_error());
  ctx->init_done = s == LOOM_OK ? 1 : -1;
  pthread_cond_broadcast(&ctx->done_cv);
  pthread_mutex_unlock(&ctx->done_mu);
  if (s != LOOM_OK)
    return NULL;
  run_loop(ctx);
  ctx->be->finalize(ctx);
  return NULL;
}

/* -------------------------------------------------------- context life */

static void ctx_destroy(loom_comm_ctx *ctx) {
  pthread_mutex_destroy(&ctx->mu);
  pthread_cond_destroy(&ctx->cv);
  pthread_mutex_destroy(&ctx->done_mu);
  pthread_cond_destroy(&ctx->done_cv);
  loom_free(ctx);
}

static void stop_thread(loom_comm_ctx *ctx, bool now) {
  pthread_mutex_lock(&ctx->mu);
  ctx->stop = true;
  ctx->stop_now = now;
  atomic_fetch_add(&ctx->queued, 1);
  pthread_cond_signal(&ctx->cv);
  pthread_mutex_unlock(&ctx->mu);
  kick(ctx);
  pthread_join(ctx->thread, NULL);
}

/* A program that returns from main without freeing the world still
 * finalises MPI, so mpirun does not report it as failed. */
static void comm_atexit(void) {
  pthread_mutex_lock(&g_lock);
  loom_comm_ctx *ctx = g_ctx;
  g_ctx = NULL;
  pthread_mutex_unlock(&g_lock);
  if (ctx && ctx->owner_pid == (int)getpid())
    stop_thread(ctx, true);
}

loom_status loom_group_world(const loom_comm_opts *opts, loom_group **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_group_world: out is NULL");
  *out = NULL;
  pthread_mutex_lock(&g_lock);
  if (g_ctx && g_ctx->world) {
    g_ctx->world->refs++;
    *out = g_ctx->world;
    pthread_mutex_unlock(&g_lock);
    return LOOM_OK;
  }
  if (g_ctx) {
    pthread_mutex_unlock(&g_lock);
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_group_world: the world group was freed while "
                      "sub-groups are alive; keep it until they are freed");
  }
  loom_comm_opts o = opts ? *opts : loom_comm_opts_default();
  const loom_backend *be = &loom_backend_self;
  bool env_init = false;
  if (loom_envinit_wanted() && !launched_by_mpi()) {
    /* LOOM_INIT=env://: torchrun's variables say the world. */
    int er = 0, es = 1;
    loom_status s = loom_envinit_read(&er, &es);
    if (s != LOOM_OK) {
      pthread_mutex_unlock(&g_lock);
      return s;
    }
    env_init = es > 1;
    if (env_init && strcmp(loom_comm_mpi_impl(), "openmpi") != 0) {
      pthread_mutex_unlock(&g_lock);
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "LOOM_INIT=env:// needs Open MPI (its ompi-server "
                        "and MPI_Comm_accept/connect); this loom is built "
                        "with %s: start the ranks with its launcher",
                        loom_comm_mpi_impl());
    }
  }
  if (env_init) {
#ifdef LOOM_HAVE_MPI
    be = &loom_backend_mpi;
#else
    pthread_mutex_unlock(&g_lock);
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "LOOM_INIT=env:// with WORLD_SIZE > 1, but this loom "
                      "was built without MPI; rebuild with "
                      "-DLOOM_MPI=openmpi");
#endif
  } else if (o.backend == LOOM_COMM_MPI ||
             (o.backend == LOOM_COMM_AUTO && launched_by_mpi())) {
#ifdef LOOM_HAVE_MPI
    be = &loom_backend_mpi;
#else
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n)
      n = getenv("PMI_SIZE");
    /* A size that does not parse counts as several ranks: running alone
     * while others also run alone would be the silent failure. */
    char *end = NULL;
    long size = n ? strtol(n, &end, 10) : 1;
    if (n && (end == n || *end != '\0'))
      size = 2;
    if (o.backend == LOOM_COMM_MPI || size > 1) {
      pthread_mutex_unlock(&g_lock);
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "this loom was built without MPI, but the process "
                        "was started as one of several MPI ranks; rebuild "
                        "with -DLOOM_MPI=openmpi or mpich");
    }
#endif
  } else if (o.backend == LOOM_COMM_AUTO) {
    loom_status ss = loom_comm_check_srun_alone(loom_comm_mpi_impl());
    if (ss != LOOM_OK) {
      pthread_mutex_unlock(&g_lock);
      return ss;
    }
  }
  if (o.chunk_bytes < 4096)
    o.chunk_bytes = 4096;
  o.chunk_bytes &= ~(size_t)4095;
  loom_comm_ctx *ctx = loom_calloc(1, sizeof *ctx);
  loom_group *w = loom_calloc(1, sizeof *w);
  if (!ctx || !w) {
    loom_free(ctx);
    loom_free(w);
    pthread_mutex_unlock(&g_lock);
    return LOOM_ERR_NOMEM;
  }
  ctx->opts = o;
  ctx->env_init = env_init;
  ctx->be = be;
  ctx->spin_s = env_number("LOOM_COMM_SPIN_US", 50) * 1e-6;
  ctx->doze_s = env_number("LOOM_COMM_DOZE_US", 500) * 1e-6;
  ctx->world = w;
  ctx->groups = 1;
  ctx->owner_pid = (int)getpid();
  atomic_init(&ctx->abort_code, -1);
  atomic_init(&ctx->abort_done, 0);
  atomic_init(&ctx->waiters, 0);
  atomic_init(&ctx->dozing, 0);
  atomic_init(&ctx->wait_op, NULL);
  atomic_init(&ctx->queued, 0);
  atomic_init(&ctx->sleep_bell, NULL);
  pthread_mutex_init(&ctx->mu, NULL);
  /* both on CLOCK_MONOTONIC: the doze's and loom_wait_for's deadlines */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ctx->cv, &ca);
  pthread_mutex_init(&ctx->done_mu, NULL);
  pthread_cond_init(&ctx->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  w->ctx = ctx;
  w->is_world = true;
  w->refs = 1;
  atomic_init(&w->broken, 0);
  snprintf(w->label, sizeof w->label, "world");
  if (pthread_create(&ctx->thread, NULL, comm_main, ctx) != 0) {
    ctx_destroy(ctx);
    loom_free(w);
    pthread_mutex_unlock(&g_lock);
    return loom_error(LOOM_ERR_INTERNAL,
                      "cannot start the communication thread");
  }
  pthread_mutex_lock(&ctx->done_mu);
  while (ctx->init_done == 0)
    pthread_cond_wait(&ctx->done_cv, &ctx->done_mu);
  pthread_mutex_unlock(&ctx->done_mu);
  if (ctx->init_done < 0) {
    pthread_join(ctx->thread, NULL);
    loom_status s = ctx->init_status;
    loom_error(s, "starting the %s backend: %s", be->name, ctx->init_msg);
    ctx_destroy(ctx);
    loom_free(w);
    pthread_mutex_unlock(&g_lock);
    return s;
  }
  g_ctx = ctx;
  if (!g_atexit_set) {
    g_atexit_set = true;
    atexit(comm_atexit);
  }
  pthread_mutex_unlock(&g_lock);
  if (w->size > 1)
    loom_log_set_rank(w->rank);
  /* Ranks started without binding (mpiexec alone) share the host's cores. */
  loom_threads_share(w->local_rank, w->local_size);
  *out = w;
  return LOOM_OK;
}

/* --------------------------------------------------------------- posting */

static loom_op *op_of(loom_req *req) { return (loom_op *)(void *)req; }

static bool in_flight(const loom_op *op) {
  if (op->magic != LOOM_OP_MAGIC)
    return false;
  int st = atomic_load(&op->state);
  return st == LOOM_REQ_QUEUED || st == LOOM_REQ_ACTIVE;
}

/* Records a failure to post as the request's result too, so that waiting
 * on it returns the same error. */
static loom_status post_fail(loom_op *op, loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static loom_status post_fail(loom_op *op, loom_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  loom_verror(s, fmt, ap);
  va_end(ap);
  if (op) {
    op->magic = LOOM_OP_MAGIC;
    op->status = s;
    snprintf(op->err, sizeof op->err, "%s", loom_last_error());
    atomic_store(&op->state, LOOM_REQ_DONE);
  }
  return s;
}

static loom_status enqueue(loom_op *op) {
  loom_comm_ctx *ctx = op->group->ctx;
  op->magic = LOOM_OP_MAGIC;
  op->status = LOOM_OK;
  op->err[0] = '\0';
  op->started = false;
  op->next = NULL;
  op->seq = 0;
  op->t_post = loom_time_now();
  op->t_start = op->t_end = 0;
  op->collective = op->kind != LOOM_COMM_SEND && op->kind != LOOM_COMM_RECV;
  atomic_store_explicit(&op->state, LOOM_REQ_QUEUED, memory_order_relaxed);
  pthread_mutex_lock(&ctx->mu);
  if (ctx->q_tail)
    ctx->q_tail->next = op;
  else
    ctx->q_head = op;
  ctx->q_tail = op;
  atomic_fetch_add(&ctx->queued, 1);
  if (ctx->sleeping)
    pthread_cond_signal(&ctx->cv);
  pthread_mutex_unlock(&ctx->mu);
  kick(ctx);
  return LOOM_OK;
}

/* Common checks; fills the fields every operation has. */
static loom_status prepare(loom_req *req, loom_group *g, loom_comm_op kind,
                           loom_op **out) {
  *out = NULL;
  /* The error as a constant, not loom_error's result: the analyzer does not
   * see into error.c, and would let callers go on with LOOM_OK and *out
   * NULL. */
  if (!req) {
    loom_error(LOOM_ERR_INVALID_ARG, "%s: req is NULL",
               loom_comm_op_name(kind));
    return LOOM_ERR_INVALID_ARG;
  }
  loom_op *op = op_of(req);
  if (in_flight(op)) {
    loom_error(LOOM_ERR_INVALID_ARG,
               "%s: the request is still in flight; wait for it first",
               loom_comm_op_name(kind));
    return LOOM_ERR_INVALID_ARG;
  }
  memset(op, 0, offsetof(loom_op, bstate));
  op->kind = kind;
  op->group = g;
  op->root = -1;
  *out = op;
  if (!g)
    return post_fail(op, LOOM_ERR_INVALID_ARG, "%s: group is NULL",
                     loom_comm_op_name(kind));
  return LOOM_OK;
}

static loom_status check_data(loom_op *op, loom_dtype dt, size_t count,
                              const void *send, const void *recv,
                              bool need_send, bool need_recv) {
  const char *name = loom_comm_op_name(op->kind);
  if ((unsigned)dt >= LOOM_DTYPE_COUNT)
    return post_fail(op, LOOM_ERR_INVALID_ARG, "%s: invalid dtype %d", name,
                     (int)dt);
  if (count > 0 && ((need_send && !send) || (need_recv && !recv)))
    return post_fail(op, LOOM_ERR_INVALID_ARG,
                     "%s: NULL buffer for %zu elements", name, count);
  return LOOM_OK;
}

static loom_status check_redop(loom_op *op, loom_redop r) {
  if ((unsigned)r >= LOOM_REDOP_COUNT)
    return post_fail(op, LOOM_ERR_INVALID_ARG, "%s: invalid reduction %d",
                     loom_comm_op_name(op->kind), (int)r);
  return LOOM_OK;
}

static loom_status check_root(loom_op *op, int root) {
  if (root < 0 || root >= op->group->size)
    return post_fail(op, LOOM_ERR_INVALID_ARG,
                     "%s: root %d is not a rank of group %s (size %d)",
                     loom_comm_op_name(op->kind), root, op->group->label,
                     op->group->size);
  return LOOM_OK;
}

loom_status loom_allreduce(const void *send, void *recv, size_t count,
                           loom_dtype dt, loom_redop op, loom_group *g,
                           loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_ALLREDUCE, &o));
  LOOM_TRY(check_data(o, dt, count, send, recv, true, true));
  LOOM_TRY(check_redop(o, op));
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->dtype = dt;
  o->redop = op;
  return enqueue(o);
}

loom_status loom_reduce(const void *send, void *recv, size_t count,
                        loom_dtype dt, loom_redop op, int root, loom_group *g,
                        loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_REDUCE, &o));
  LOOM_TRY(check_root(o, root));
  LOOM_TRY(check_data(o, dt, count, send, recv, true, g->rank == root));
  LOOM_TRY(check_redop(o, op));
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->dtype = dt;
  o->redop = op;
  o->root = root;
  return enqueue(o);
}

loom_status loom_broadcast(const void *send, void *recv, size_t count,
                           loom_dtype dt, int root, loom_group *g,
                           loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_BROADCAST, &o));
  LOOM_TRY(check_root(o, root));
  bool is_root = g->rank == root;
  LOOM_TRY(check_data(o, dt, count, send, recv, is_root, !is_root));
  o->send = send;
  o->recv = recv ? recv : (void *)(uintptr_t)send;
  o->count = count;
  o->dtype = dt;
  o->root = root;
  return enqueue(o);
}

loom_status loom_allgather(const void *send, void *recv, size_t count,
                           loom_dtype dt, loom_group *g, loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_ALLGATHER, &o));
  LOOM_TRY(check_data(o, dt, count, send, recv, true, true));
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->dtype = dt;
  return enqueue(o);
}

loom_status loom_allgatherv(const void *send, void *recv, const size_t *counts,
                            loom_dtype dt, loom_group *g, loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_ALLGATHERV, &o));
  if (!counts)
    return post_fail(o, LOOM_ERR_INVALID_ARG, "allgatherv: counts is NULL");
  size_t total = 0;
  for (int r = 0; r < g->size; r++)
    total += counts[r];
  LOOM_TRY(check_data(o, dt, total, send, recv, counts[g->rank] > 0, true));
  o->send = send;
  o->recv = recv;
  o->counts = counts;
  o->count = counts[g->rank];
  o->dtype = dt;
  return enqueue(o);
}

loom_status loom_reduce_scatter(const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_redop op, loom_group *g,
                                loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_REDUCE_SCATTER, &o));
  LOOM_TRY(check_data(o, dt, count, send, recv, true, true));
  LOOM_TRY(check_redop(o, op));
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->dtype = dt;
  o->redop = op;
  return enqueue(o);
}

loom_status loom_alltoall(const void *send, void *recv, size_t count,
                          loom_dtype dt, loom_group *g, loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_ALLTOALL, &o));
  LOOM_TRY(check_data(o, dt, count, send, recv, true, true));
  o->send = send;
  o->recv = recv;
  o->count = count;
  o->dtype = dt;
  return enqueue(o);
}

loom_status loom_barrier(loom_group *g, loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_BARRIER, &o));
  o->dtype = LOOM_U8;
  return enqueue(o);
}

static loom_status p2p(loom_comm_op kind, const void *buf, size_t count,
                       loom_dtype dt, int peer, int tag, loom_group *g,
                       loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, kind, &o));
  LOOM_TRY(check_data(o, dt, count, buf, buf, true, true));
  if (peer < 0 || peer >= g->size)
    return post_fail(o, LOOM_ERR_INVALID_ARG,
                     "%s: peer %d is not a rank of group %s (size %d)",
                     loom_comm_op_name(kind), peer, g->label, g->size);
  if (tag < 0 || tag > 32767)
    return post_fail(o, LOOM_ERR_INVALID_ARG, "%s: tag %d not in [0, 32767]",
                     loom_comm_op_name(kind), tag);
  o->send = buf;
  o->recv = (void *)(uintptr_t)buf;
  o->count = count;
  o->dtype = dt;
  o->root = peer;
  o->tag = tag;
  return enqueue(o);
}

loom_status loom_send(const void *buf, size_t count, loom_dtype dt, int peer,
                      int tag, loom_group *g, loom_req *req) {
  return p2p(LOOM_COMM_SEND, buf, count, dt, peer, tag, g, req);
}

loom_status loom_recv(void *buf, size_t count, loom_dtype dt, int peer, int tag,
                      loom_group *g, loom_req *req) {
  return p2p(LOOM_COMM_RECV, buf, count, dt, peer, tag, g, req);
}

loom_status loom_group_mem_alloc(loom_group *g, size_t bytes, void **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_group_mem_alloc: out NULL");
  *out = NULL;
  loom_req req = LOOM_REQ_INIT;
  loom_op *o;
  LOOM_TRY(prepare(&req, g, LOOM_COMM_MEM_ALLOC, &o));
  o->count = bytes;
  o->dtype = LOOM_U8;
  enqueue(o);
  LOOM_TRY(loom_wait(&req));
  *out = o->recv;
  return LOOM_OK;
}

void loom_group_mem_free(loom_group *g, void *p) {
  if (!p || !g)
    return;
  loom_req req = LOOM_REQ_INIT;
  loom_op *o;
  if (prepare(&req, g, LOOM_COMM_MEM_FREE, &o) != LOOM_OK)
    return;
  o->send = p;
  o->dtype = LOOM_U8;
  enqueue(o);
  if (loom_wait(&req) != LOOM_OK)
    LOOM_WARN("comm: loom_group_mem_free: %s", loom_last_error());
}

loom_status loom_group_call(loom_comm_fn fn, void *ctx, loom_group *g,
                            loom_req *req) {
  loom_op *o;
  LOOM_TRY(prepare(req, g, LOOM_COMM_CALL, &o));
  if (!fn)
    return post_fail(o, LOOM_ERR_INVALID_ARG, "call: fn is NULL");
  o->fn = fn;
  o->fn_ctx = ctx;
  o->dtype = LOOM_U8;
  return enqueue(o);
}

/* -------------------------------------------------------------- requests */

static loom_status op_result(const loom_op *op) {
  if (op->status != LOOM_OK)
    return loom_error(op->status, "%s", op->err);
  return LOOM_OK;
}

/* Waits for op until `deadline` (CLOCK_MONOTONIC; NULL: for ever); returns
 * whether it completed. */
static bool wait_op_until(loom_op *op, const struct timespec *deadline) {
  loom_comm_ctx *ctx = op->group->ctx;
  int st = atomic_load_explicit(&op->state, memory_order_acquire);
  double until = 0;
  /* Spin only where latency matters: a large operation takes longer than
   * the spin, and the spinning thread would take a core from the ranks. */
  bool spin = loom_comm_op_bytes(op, op->group->size) <= (64u << 10);
  for (int i = 0; spin && st != LOOM_REQ_DONE; i++) {
    cpu_relax();
    st = atomic_load_explicit(&op->state, memory_order_acquire);
    if ((i & 63) == 63) {
      double now = loom_time_now();
      if (until == 0)
        until = now + ctx->spin_s;
      else if (now > until)
        break;
    }
  }
  if (st == LOOM_REQ_DONE)
    return true;
  /* Counted before the lock: the thread's doze checks the count. */
  atomic_fetch_add(&ctx->waiters, 1);
  if (atomic_load(&ctx->dozing)) {
    pthread_mutex_lock(&ctx->mu);
    pthread_cond_signal(&ctx->cv);
    pthread_mutex_unlock(&ctx->mu);
  }
  pthread_mutex_lock(&ctx->done_mu);
  bool done = false;
  while (!(done = atomic_load(&op->state) == LOOM_REQ_DONE)) {
    atomic_store(&ctx->wait_op, op);
    if ((done = atomic_load(&op->state) == LOOM_REQ_DONE))
      break;
    if (!deadline)
      pthread_cond_wait(&ctx->done_cv, &ctx->done_mu);
    else if (pthread_cond_timedwait(&ctx->done_cv, &ctx->done_mu, deadline) ==
             ETIMEDOUT) {
      done = atomic_load(&op->state) == LOOM_REQ_DONE;
      break;
    }
  }
  /* Another waiter may have named its own operation meanwhile: wake the
   * others so that they name theirs again. */
  if (atomic_fetch_sub(&ctx->waiters, 1) > 1)
    pthread_cond_broadcast(&ctx->done_cv);
  pthread_mutex_unlock(&ctx->done_mu);
  return done;
}

/* The operation a request holds, or NULL for nothing to wait for (NULL,
 * zeroed or never posted: done). */
static loom_op *posted_op(loom_req *req) {
  loom_op *op = req ? op_of(req) : NULL;
  if (!op || op->magic != LOOM_OP_MAGIC ||
      atomic_load_explicit(&op->state, memory_order_acquire) == LOOM_REQ_EMPTY)
    return NULL;
  return op;
}

loom_status loom_wait(loom_req *req) {
  loom_op *op = posted_op(req);
  if (!op)
    return LOOM_OK;
  wait_op_until(op, NULL);
  return op_result(op);
}

loom_status loom_wait_for(loom_req *req, double seconds, bool *done) {
  bool d = true;
  loom_status s = LOOM_OK;
  loom_op *op = posted_op(req);
  if (op) {
    struct timespec dl = deadline_in(seconds);
    d = wait_op_until(op, &dl);
    if (d)
      s = op_result(op);
  }
  if (done)
    *done = d;
  return s;
}

loom_status loom_test(loom_req *req, bool *done) {
  bool d = true;
  loom_status s = LOOM_OK;
  if (req) {
    loom_op *op = op_of(req);
    if (op->magic == LOOM_OP_MAGIC) {
      int st = atomic_load_explicit(&op->state, memory_order_acquire);
      d = st == LOOM_REQ_DONE || st == LOOM_REQ_EMPTY;
      if (st == LOOM_REQ_DONE)
        s = op_result(op);
    }
  }
  if (done)
    *done = d;
  return s;
}

loom_status loom_wait_all(loom_req *reqs, size_t n) {
  loom_status first = LOOM_OK;
  char msg[LOOM_OP_ERR_MAX] = "";
  /* Last first: operations complete roughly in posting order, so this
   * sleeps once for a batch. */
  for (size_t i = n; i-- > 0;) {
    loom_status s = loom_wait(&reqs[i]);
    if (s != LOOM_OK) { /* keeps the error of the lowest index */
      first = s;
      snprintf(msg, sizeof msg, "%s", loom_last_error());
    }
  }
  if (first != LOOM_OK)
    return loom_error(first, "%s", msg);
  return LOOM_OK;
}

loom_status loom_start(loom_req *req) {
  if (!req)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_start: req is NULL");
  loom_op *op = op_of(req);
  if (op->magic != LOOM_OP_MAGIC || !op->group)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_start: the request holds no operation");
  if (in_flight(op))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_start: the request is still in flight");
  if (op->kind == LOOM_COMM_SPLIT || op->kind == LOOM_COMM_FREE)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_start: %s cannot be "
                      "restarted",
                      loom_comm_op_name(op->kind));
  return enqueue(op);
}

void loom_req_times(const loom_req *req, double *posted, double *started,
                    double *finished) {
  const loom_op *op = (const loom_op *)(const void *)req;
  bool ok = req && op->magic == LOOM_OP_MAGIC;
  bool done = ok && atomic_load_explicit(&((loom_op *)(uintptr_t)op)->state,
                                         memory_order_acquire) == LOOM_REQ_DONE;
  if (posted)
    *posted = ok ? op->t_post : 0;
  if (started)
    *started = done ? op->t_start : 0;
  if (finished)
    *finished = done ? op->t_end : 0;
}

/* ---------------------------------------------------------------- groups */

loom_status loom_group_split(loom_group *parent, int color, int key,
                             loom_group **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_group_split: out is NULL");
  *out = NULL;
  if (!parent)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_group_split: parent is NULL");
  loom_group *child = loom_calloc(1, sizeof *child);
  if (!child)
    return LOOM_ERR_NOMEM;
  atomic_init(&child->broken, 0);
  child->ctx = parent->ctx;
  loom_req req = LOOM_REQ_INIT;
  loom_op *o;
  loom_status s = prepare(&req, parent, LOOM_COMM_SPLIT, &o);
  if (s == LOOM_OK) {
    o->color = color < 0 ? -1 : color;
    o->key = key;
    o->child = child;
    o->dtype = LOOM_U8;
    enqueue(o);
    s = loom_wait(&req);
  }
  if (s != LOOM_OK || color < 0 || !o->child) {
    loom_free(child);
    return s;
  }
  pthread_mutex_lock(&g_lock);
  parent->ctx->groups++;
  pthread_mutex_unlock(&g_lock);
  *out = child;
  return LOOM_OK;
}

void loom_group_free(loom_group *g) {
  if (!g)
    return;
  loom_comm_ctx *ctx = g->ctx;
  pthread_mutex_lock(&g_lock);
  if (g->is_world && --g->refs > 0) {
    pthread_mutex_unlock(&g_lock);
    return;
  }
  pthread_mutex_unlock(&g_lock);
  loom_req req = LOOM_REQ_INIT;
  loom_op *o;
  if (prepare(&req, g, LOOM_COMM_FREE, &o) == LOOM_OK) {
    o->dtype = LOOM_U8;
    enqueue(o);
    if (loom_wait(&req) != LOOM_OK)
      LOOM_WARN("comm: freeing group %s: %s", g->label, loom_last_error());
  }
  pthread_mutex_lock(&g_lock);
  bool last = --ctx->groups == 0;
  if (g->is_world)
    ctx->world = NULL;
  if (last && g_ctx == ctx)
    g_ctx = NULL;
  pthread_mutex_unlock(&g_lock);
  loom_free(g);
  if (last) {
    stop_thread(ctx, false);
    ctx_destroy(ctx);
  }
}

int loom_group_rank(const loom_group *g) { return g ? g->rank : -1; }
int loom_group_size(const loom_group *g) { return g ? g->size : 0; }
int loom_group_local_rank(const loom_group *g) {
  return g ? g->local_rank : -1;
}
int loom_group_local_size(const loom_group *g) { return g ? g->local_size : 0; }
const char *loom_group_backend(const loom_group *g) {
  return g ? g->ctx->be->name : "none";
}
bool loom_group_shm(const loom_group *g) { return g && g->shm; }
bool loom_group_hier(const loom_group *g) { return g && g->hier; }

bool loom_group_hier_gather(const loom_group *g) { return g && g->hier_gather; }

loom_status loom_group_error(loom_group *g) {
  if (!g || !atomic_load(&g->broken))
    return LOOM_OK;
  return loom_error(g->broken_status, "%s", g->broken_msg);
}

void loom_group_abort(loom_group *g, int code) {
  if (!g)
    return;
  loom_comm_ctx *ctx = g->ctx;
  atomic_store(&ctx->abort_done, 0);
  atomic_store(&ctx->abort_code, code < 0 ? 1 : code);
  pthread_mutex_lock(&ctx->mu);
  atomic_fetch_add(&ctx->queued, 1);
  pthread_cond_signal(&ctx->cv);
  pthread_mutex_unlock(&ctx->mu);
  kick(ctx);
  /* With a job to kill this never returns; the self backend only marks the
   * world broken. */
  while (!atomic_load(&ctx->abort_done))
    nap(1000000);
}
