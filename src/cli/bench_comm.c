/* loom bench comm: collective bandwidth in the layout of nccl-tests (size,
 * count, type, redop, time, algbw, busbw, #wrong), loom's asynchronous
 * operations beside the same operation through plain MPI called directly,
 * measured in the same run on the same buffers. Run it under loom run:
 *   loom run -n 2 loom bench comm --op allreduce --min 1M --max 256M */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/core.h"

#ifdef LOOM_HAVE_MPI
#include <mpi.h>
#endif

typedef struct bench_args {
  loom_comm_op op;
  bool all_ops;
  loom_dtype dtype;
  loom_redop redop;
  size_t min, max;
  double factor;
  const char *sizes; /* explicit list, overrides min/max */
  int iters, warmup;
  bool mpi;    /* measure plain MPI too */
  bool shared; /* buffers from loom_group_mem_alloc */
  bool sync;   /* wait for each operation before posting the next */
} bench_args;

static void usage(FILE *f) {
  fprintf(f,
          "usage: loom run -n N loom bench comm [options]\n\n"
          "  --op OP        allreduce, allgather, reducescatter, broadcast, "
          "alltoall or all\n"
          "                 (default allreduce)\n"
          "  --dtype T      f32, bf16, f16, f64, i32, i64 or u8 (default f32)\n"
          "  --redop R      sum, avg, max, min or prod (default sum)\n"
          "  --min SIZE     smallest buffer (default 4K; K, M, G suffixes)\n"
          "  --max SIZE     largest buffer (default 256M)\n"
          "  --factor F     size step (default 2)\n"
          "  --sizes LIST   exact sizes instead, e.g. 1M,16M,64M,256M\n"
          "  --iters K      timed iterations per size (default 20, fewer for "
          "large sizes)\n"
          "  --warmup W     untimed iterations first (default 5)\n"
          "  --shared       buffers from loom_group_mem_alloc (memory shared "
          "by the ranks\n"
          "                 of a host: loom's direct path; MPI gets the same "
          "buffers)\n"
          "  --sync         wait for each operation before posting the next "
          "(default:\n"
          "                 post the iterations back to back, wait once, as "
          "nccl-tests)\n"
          "  --no-mpi       skip the plain-MPI columns\n\n"
          "Sizes are those of nccl-tests: the full buffer (all-gather: the "
          "gathered\nbuffer; reduce-scatter and all-to-all: the send buffer). "
          "busbw = algbw x\n2(n-1)/n for all-reduce, (n-1)/n for all-gather, "
          "reduce-scatter and all-to-all,\n1 for broadcast. #wrong counts "
          "mismatching elements on all ranks.\n");
}

/* A size in bytes: a number with an optional K, M or G (powers of 1024)
 * and an optional B; -1 when s is anything else. */
static int parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno == ERANGE || !isfinite(v) || v < 0)
    return -1;
  if (*end == 'k' || *end == 'K')
    v *= 1024, end++;
  else if (*end == 'm' || *end == 'M')
    v *= 1024.0 * 1024, end++;
  else if (*end == 'g' || *end == 'G')
    v *= 1024.0 * 1024 * 1024, end++;
  if (*end == 'B' || *end == 'b')
    end++;
  /* 2^62 bytes: beyond any buffer, and the cast stays defined. */
  if (*end || v >= 0x1p62)
    return -1;
  *out = (size_t)v;
  return 0;
}

/* The next item of a --sizes list (comma-separated sizes); advances *p past
 * it and its comma. -1 when the item is empty, too long or not a size. */
static int next_size(const char **p, size_t *bytes) {
  char item[32];
  size_t len = strcspn(*p, ",");
  if (len == 0 || len >= sizeof item)
    return -1;
  memcpy(item, *p, len);
  item[len] = '\0';
  if (parse_size(item, bytes))
    return -1;
  *p += len;
  if (**p == ',')
    (*p)++;
  return 0;
}

/* A whole number in [lo, 2^20], nothing after it; -1 otherwise. */
static int parse_count(const char *s, int lo, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > 1 << 20)
    return -1;
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
  *a = (bench_args){.op = LOOM_COMM_ALLREDUCE,
                    .dtype = LOOM_F32,
                    .redop = LOOM_SUM,
                    .min = 4096,
                    .max = 256u << 20,
                    .factor = 2,
                    .iters = 20,
                    .warmup = 5,
                    .mpi = true};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(k, "-h") == 0 || strcmp(k, "--help") == 0) {
      usage(stdout);
      return 1;
    }
    if (strcmp(k, "--no-mpi") == 0) {
      a->mpi = false;
      continue;
    }
    if (strcmp(k, "--shared") == 0) {
      a->shared = true;
      continue;
    }
    if (strcmp(k, "--sync") == 0) {
      a->sync = true;
      continue;
    }
    if (!v) {
      fprintf(stderr, "loom bench comm: %s needs a value\n", k);
      return -1;
    }
    i++;
    if (strcmp(k, "--op") == 0) {
      static const struct {
        const char *name;
        loom_comm_op op;
      } ops[] = {{"allreduce", LOOM_COMM_ALLREDUCE},
                 {"allgather", LOOM_COMM_ALLGATHER},
                 {"reducescatter", LOOM_COMM_REDUCE_SCATTER},
                 {"broadcast", LOOM_COMM_BROADCAST},
                 {"alltoall", LOOM_COMM_ALLTOALL}};
      bool found = strcmp(v, "all") == 0;
      a->all_ops = found;
      for (size_t j = 0; j < sizeof ops / sizeof ops[0]; j++)
        if (strcmp(v, ops[j].name) == 0) {
          a->op = ops[j].op;
          found = true;
        }
      if (!found) {
        fprintf(stderr, "loom bench comm: unknown op '%s'\n", v);
        return -1;
      }
    } else if (strcmp(k, "--dtype") == 0) {
      if (loom_dtype_parse(v, &a->dtype) != LOOM_OK) {
        fprintf(stderr, "loom bench comm: %s\n", loom_last_error());
        return -1;
      }
    } else if (strcmp(k, "--redop") == 0) {
      if (loom_redop_parse(v, &a->redop) != LOOM_OK) {
        fprintf(stderr, "loom bench comm: %s\n", loom_last_error());
        return -1;
      }
    } else if (strcmp(k, "--min") == 0 || strcmp(k, "--max") == 0) {
      bool is_min = strcmp(k, "--min") == 0;
      size_t bytes;
      /* --min 0 would never grow by --factor: the sizes would not end. */
      if (parse_size(v, &bytes) || (is_min && bytes == 0)) {
        fprintf(stderr,
                "loom bench comm: %s wants a size in bytes%s (K, M, G "
                "suffixes), not '%s'\n",
                k, is_min ? " > 0" : "", v);
        return -1;
      }
      *(is_min ? &a->min : &a->max) = bytes;
    } else if (strcmp(k, "--factor") == 0) {
      char *end;
      errno = 0;
      double f = strtod(v, &end);
      if (end == v || *end != '\0' || errno == ERANGE || !isfinite(f) ||
          !(f > 1)) {
        fprintf(stderr,
                "loom bench comm: --factor wants a number > 1, not '%s'\n", v);
        return -1;
      }
      a->factor = f;
    } else if (strcmp(k, "--sizes") == 0) {
      const char *p = v;
      do {
        size_t bytes;
        if (next_size(&p, &bytes)) {
          fprintf(stderr,
                  "loom bench comm: --sizes wants sizes in bytes separated "
                  "by commas (e.g. 1M,16M), not '%s'\n",
                  v);
          return -1;
        }
      } while (*p);
      a->sizes = v;
    } else if (strcmp(k, "--iters") == 0 || strcmp(k, "--warmup") == 0) {
      bool iters = strcmp(k, "--iters") == 0;
      if (parse_count(v, iters ? 1 : 0, iters ? &a->iters : &a->warmup)) {
        fprintf(stderr, "loom bench comm: %s wants a count >= %d, not '%s'\n",
                k, iters ? 1 : 0, v);
        return -1;
      }
    } else {
      fprintf(stderr, "loom bench comm: unknown option '%s'\n", k);
      return -1;
    }
  }
  return 0;
}

/* ------------------------------------------------------------ one size */

typedef struct sizes_of {
  size_t send_elems, recv_elems, count; /* count as the API takes it */
  double busbw_factor;
} sizes_of;

static sizes_of layout(loom_comm_op op, size_t bytes, size_t e, int p) {
  sizes_of s = {0};
  size_t n = bytes / e;
  switch (op) {
  case LOOM_COMM_ALLREDUCE:
    s = (sizes_of){n, n, n, 2.0 * (p - 1) / p};
    break;
  case LOOM_COMM_BROADCAST:
    s = (sizes_of){n, n, n, 1};
    break;
  case LOOM_COMM_ALLGATHER:
    s = (sizes_of){n / (size_t)p, n / (size_t)p * (size_t)p, n / (size_t)p,
                   (double)(p - 1) / p};
    break;
  case LOOM_COMM_REDUCE_SCATTER:
    s = (sizes_of){n / (size_t)p * (size_t)p, n / (size_t)p, n / (size_t)p,
                   (double)(p - 1) / p};
    break;
  case LOOM_COMM_ALLTOALL:
    s = (sizes_of){n / (size_t)p * (size_t)p, n / (size_t)p * (size_t)p,
                   n / (size_t)p, (double)(p - 1) / p};
    break;
  default:
    break;
  }
  return s;
}

static void put(void *buf, loom_dtype dt, size_t i, int v) {
  switch (dt) {
  case LOOM_F32:
    ((float *)buf)[i] = (float)v;
    break;
  case LOOM_F64:
    ((double *)buf)[i] = v;
    break;
  case LOOM_BF16:
    ((uint16_t *)buf)[i] = loom_f32_to_bf16((float)v);
    break;
  case LOOM_F16:
    ((uint16_t *)buf)[i] = loom_f32_to_f16((float)v);
    break;
  case LOOM_I32:
    ((int32_t *)buf)[i] = v;
    break;
  case LOOM_I64:
    ((int64_t *)buf)[i] = v;
    break;
  case LOOM_U8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  default:
    break;
  }
}

static double get(const void *buf, loom_dtype dt, size_t i) {
  switch (dt) {
  case LOOM_F32:
    return ((const float *)buf)[i];
  case LOOM_F64:
    return ((const double *)buf)[i];
  case LOOM_BF16:
    return loom_bf16_to_f32(((const uint16_t *)buf)[i]);
  case LOOM_F16:
    return loom_f16_to_f32(((const uint16_t *)buf)[i]);
  case LOOM_I32:
    return ((const int32_t *)buf)[i];
  case LOOM_I64:
    return (double)((const int64_t *)buf)[i];
  case LOOM_U8:
    return ((const uint8_t *)buf)[i];
  default:
    return 0;
  }
}

/* Element i of rank r's input: small integers, exact in every dtype. */
static int input(int r, size_t i) { return (int)((i % 7) + 1) + r % 3; }

static double expected_reduce(loom_redop op, size_t i, int p, loom_dtype dt) {
  double acc = input(0, i);
  for (int r = 1; r < p; r++) {
    double v = input(r, i);
    if (op == LOOM_SUM || op == LOOM_AVG)
      acc += v;
    else if (op == LOOM_PROD)
      acc *= v;
    else if (op == LOOM_MAX)
      acc = v > acc ? v : acc;
    else
      acc = v < acc ? v : acc;
  }
  if (op == LOOM_AVG) {
    if (dt == LOOM_I32 || dt == LOOM_I64 || dt == LOOM_U8)
      return (double)((long long)acc / p);
    if (dt == LOOM_F64)
      return acc / p;
    float f = (float)acc / (float)p;
    if (dt == LOOM_BF16)
      return loom_bf16_to_f32(loom_f32_to_bf16(f));
    if (dt == LOOM_F16)
      return loom_f16_to_f32(loom_f32_to_f16(f));
    return f;
  }
  return acc;
}

static void fill_input(const bench_args *a, void *send, const sizes_of *s,
                       int rank) {
  if (a->op == LOOM_COMM_ALLTOALL || a->op == LOOM_COMM_REDUCE_SCATTER ||
      a->op == LOOM_COMM_ALLREDUCE || a->op == LOOM_COMM_BROADCAST) {
    for (size_t i = 0; i < s->send_elems; i++)
      put(send, a->dtype, i, input(rank, i));
  } else { /* all-gather: this rank's block of the gathered buffer */
    for (size_t i = 0; i < s->send_elems; i++)
      put(send, a->dtype, i, input(rank, (size_t)rank * s->count + i));
  }
}

static long count_wrong(const bench_args *a, const void *recv,
                        const sizes_of *s, int rank, int p) {
  long wrong = 0;
  for (size_t i = 0; i < s->recv_elems; i++) {
    double want;
    switch (a->op) {
    case LOOM_COMM_ALLREDUCE:
      want = expected_reduce(a->redop, i, p, a->dtype);
      break;
    case LOOM_COMM_REDUCE_SCATTER:
      want =
          expected_reduce(a->redop, (size_t)rank * s->count + i, p, a->dtype);
      break;
    case LOOM_COMM_BROADCAST:
      want = input(0, i);
      break;
    case LOOM_COMM_ALLGATHER:
      want = input((int)(i / s->count), i);
      break;
    case LOOM_COMM_ALLTOALL: /* block j came from rank j's block `rank` */
      want = input((int)(i / s->count), (size_t)rank * s->count + i % s->count);
      break;
    default:
      want = 0;
    }
    if (get(recv, a->dtype, i) != want)
      wrong++;
  }
  return wrong;
}

static loom_status post(const bench_args *a, const void *send, void *recv,
                        const sizes_of *s, loom_group *g, loom_req *r) {
  switch (a->op) {
  case LOOM_COMM_ALLREDUCE:
    return loom_allreduce(send, recv, s->count, a->dtype, a->redop, g, r);
  case LOOM_COMM_BROADCAST:
    return loom_broadcast(send, recv, s->count, a->dtype, 0, g, r);
  case LOOM_COMM_ALLGATHER:
    return loom_allgather(send, recv, s->count, a->dtype, g, r);
  case LOOM_COMM_REDUCE_SCATTER:
    return loom_reduce_scatter(send, recv, s->count, a->dtype, a->redop, g, r);
  case LOOM_COMM_ALLTOALL:
    return loom_alltoall(send, recv, s->count, a->dtype, g, r);
  default:
    return LOOM_ERR_UNSUPPORTED;
  }
}

/* Seconds for `iters` loom operations, the slowest rank's. As nccl-tests
 * launches its iterations on a stream and then synchronises once, they are
 * posted back to back and waited for together (the way training posts its
 * buckets); with --sync each is waited for before the next is posted. */
static loom_status time_loom(const bench_args *a, const void *send, void *recv,
                             const sizes_of *s, loom_group *g, int iters,
                             double *secs) {
  loom_req r = LOOM_REQ_INIT;
  loom_req *reqs = loom_calloc((size_t)(iters > 0 ? iters : 1), sizeof *reqs);
  if (!reqs)
    return LOOM_ERR_NOMEM;
  loom_status st = LOOM_OK;
  LOOM_TRY_GOTO(st, loom_barrier(g, &r), out);
  LOOM_TRY_GOTO(st, loom_wait(&r), out);
  double t0 = loom_time_now();
  for (int i = 0; i < iters; i++) {
    LOOM_TRY_GOTO(st, post(a, send, recv, s, g, &reqs[i]), out);
    if (a->sync)
      LOOM_TRY_GOTO(st, loom_wait(&reqs[i]), out);
  }
  LOOM_TRY_GOTO(st, loom_wait_all(reqs, (size_t)iters), out);
  double t = loom_time_now() - t0;
  LOOM_TRY_GOTO(st, loom_allreduce(&t, secs, 1, LOOM_F64, LOOM_MAX, g, &r),
                out);
  st = loom_wait(&r);
out:
  loom_wait_all(reqs, (size_t)iters); /* nothing may stay in flight */
  loom_free(reqs);
  return st;
}

#ifdef LOOM_HAVE_MPI
/* The same operation through plain blocking MPI on the communication
 * thread (the only thread that may call MPI). */
typedef struct mpi_run {
  const bench_args *a;
  const void *send;
  void *recv;
  const sizes_of *s;
  int iters;
  double secs;
} mpi_run;

static loom_status mpi_body(void *ctx, loom_group *g, void *native) {
  mpi_run *m = ctx;
  MPI_Comm comm = *(MPI_Comm *)native;
  MPI_Datatype t;
  MPI_Op op;
  (void)g;
  LOOM_TRY(loom_comm_mpi_types(m->a->dtype, m->a->redop, &t, &op));
  int n = (int)m->s->count, rc = MPI_SUCCESS;
  MPI_Barrier(comm);
  double t0 = MPI_Wtime();
  for (int i = 0; i < m->iters && rc == MPI_SUCCESS; i++) {
    switch (m->a->op) {
    case LOOM_COMM_ALLREDUCE:
      rc = MPI_Allreduce(m->send, m->recv, n, t, op, comm);
      break;
    case LOOM_COMM_BROADCAST:
      rc = MPI_Bcast(m->recv, n, t, 0, comm);
      break;
    case LOOM_COMM_ALLGATHER:
      rc = MPI_Allgather(m->send, n, t, m->recv, n, t, comm);
      break;
    case LOOM_COMM_REDUCE_SCATTER:
      rc = MPI_Reduce_scatter_block(m->send, m->recv, n, t, op, comm);
      break;
    case LOOM_COMM_ALLTOALL:
      rc = MPI_Alltoall(m->send, n, t, m->recv, n, t, comm);
      break;
    default:
      break;
    }
  }
  double dt = MPI_Wtime() - t0;
  if (rc != MPI_SUCCESS)
    return loom_error(LOOM_ERR_REMOTE, "plain MPI %s failed",
                      loom_comm_op_name(m->a->op));
  MPI_Allreduce(&dt, &m->secs, 1, MPI_DOUBLE, MPI_MAX, comm);
  return LOOM_OK;
}

static loom_status time_mpi(const bench_args *a, const void *send, void *recv,
                            const sizes_of *s, loom_group *g, int iters,
                            double *secs) {
  mpi_run m = {a, send, recv, s, iters, 0};
  loom_req r = LOOM_REQ_INIT;
  LOOM_TRY(loom_group_call(mpi_body, &m, g, &r));
  LOOM_TRY(loom_wait(&r));
  *secs = m.secs;
  return LOOM_OK;
}
#endif

/* Total wrong elements over all ranks after one operation. */
static loom_status check(const bench_args *a, void *send, void *recv,
                         const sizes_of *s, loom_group *g, bool use_mpi,
                         long *wrong) {
  int rank = loom_group_rank(g), p = loom_group_size(g);
  fill_input(a, send, s, rank);
  size_t rbytes = s->recv_elems * loom_dtype_size(a->dtype);
  memset(recv, 0xff, rbytes);
  if (a->op == LOOM_COMM_BROADCAST && rank == 0)
    memcpy(recv, send, rbytes);
  double t;
#ifdef LOOM_HAVE_MPI
  if (use_mpi)
    LOOM_TRY(time_mpi(a, send, recv, s, g, 1, &t));
  else
#endif
    LOOM_TRY(time_loom(a, send, recv, s, g, 1, &t));
  (void)use_mpi;
  long mine = count_wrong(a, recv, s, rank, p);
  loom_req r = LOOM_REQ_INIT;
  LOOM_TRY(loom_allreduce(&mine, wrong, 1, LOOM_I64, LOOM_SUM, g, &r));
  return loom_wait(&r);
}

/* The reduction column: "-" for an operation that reduces nothing
 * (all-gather, broadcast, all-to-all), as in nccl-tests' tables. */
static const char *redop_of(const bench_args *a) {
  bool reduces =
      a->op == LOOM_COMM_ALLREDUCE || a->op == LOOM_COMM_REDUCE_SCATTER;
  return reduces ? loom_redop_name(a->redop) : "-";
}

/* The MPI library as loaded, the first line of MPI_Get_library_version
 * (which MPI allows before MPI_Init and from any thread): the plain-MPI
 * columns, and loom's mpi backend, are that library's. */
static void print_mpi_library(loom_group *g) {
  if (loom_group_rank(g) != 0)
    return;
#ifdef LOOM_HAVE_MPI
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int n = 0;
  if (MPI_Get_library_version(v, &n) != MPI_SUCCESS)
    n = 0;
  v[n < (int)sizeof v ? n : (int)sizeof v - 1] = '\0';
  size_t len = strcspn(v, "\r\n");
  while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
    len--;
  printf("# mpi: %.*s\n", (int)len, len ? v : "unknown");
#else
  printf("# mpi: not built in\n");
#endif
  fflush(stdout);
}

static void print_header(const bench_args *a, loom_group *g, bool mpi) {
  if (loom_group_rank(g) != 0)
    return;
  printf("# loom bench comm: %s, %s, %s, %d ranks (backend %s, shared "
         "memory %s%s%s)\n",
         loom_comm_op_name(a->op), loom_dtype_name(a->dtype), redop_of(a),
         loom_group_size(g), loom_group_backend(g),
         loom_group_shm(g) ? "on" : "off",
         loom_group_hier_gather(g)
             ? ", hierarchical all-reduce, reduce-scatter, all-gather"
         : loom_group_hier(g) ? ", hierarchical all-reduce"
                              : "",
         a->shared ? ", buffers from loom_group_mem_alloc" : "");
  printf("# %11s %12s %5s %5s | %10s %8s %8s %6s", "size(B)", "count", "type",
         "redop", "loom(us)", "algbw", "busbw", "#wrong");
  if (mpi)
    printf(" | %10s %8s %8s %6s | %6s", "mpi(us)", "algbw", "busbw", "#wrong",
           "busbw x");
  printf("\n");
  fflush(stdout);
}

static loom_status bench_size(const bench_args *a, size_t bytes, loom_group *g,
                              bool mpi) {
  int p = loom_group_size(g), rank = loom_group_rank(g);
  size_t e = loom_dtype_size(a->dtype);
  sizes_of s = layout(a->op, bytes, e, p);
  if (s.count == 0)
    return LOOM_OK;
  size_t nbytes = s.recv_elems * e; /* the size nccl-tests reports */
  if (a->op == LOOM_COMM_REDUCE_SCATTER || a->op == LOOM_COMM_ALLTOALL)
    nbytes = s.send_elems * e;
  void *send = NULL, *recv = NULL;
  if (a->shared) {
    LOOM_TRY(loom_group_mem_alloc(g, s.send_elems * e + 64, &send));
    LOOM_TRY(loom_group_mem_alloc(g, s.recv_elems * e + 64, &recv));
  } else {
    send = loom_malloc(s.send_elems * e + 64);
    recv = loom_malloc(s.recv_elems * e + 64);
  }
  if (!send || !recv) {
    loom_free(send);
    loom_free(recv);
    return LOOM_ERR_NOMEM;
  }
  fill_input(a, send, &s, rank);
  memset(recv, 0, s.recv_elems * e);
  /* Fewer iterations for large buffers: about 1 GB moved per size. */
  int iters = a->iters;
  size_t cap = ((size_t)1 << 30) / (bytes ? bytes : 1);
  if ((size_t)iters > cap)
    iters = cap < 3 ? 3 : (int)cap;
  int warm = a->warmup < iters ? a->warmup : iters;
  loom_status st = LOOM_OK;
  double tl = 0, tm = 0, t;
  long wl = 0, wm = 0;
  /* Warm-up, then up to four alternating rounds of each, so drift on a
   * busy machine hits both columns alike. */
  LOOM_TRY_GOTO(st, time_loom(a, send, recv, &s, g, warm, &t), done);
#ifdef LOOM_HAVE_MPI
  if (mpi)
    LOOM_TRY_GOTO(st, time_mpi(a, send, recv, &s, g, warm, &t), done);
#endif
  int rounds = iters < 4 ? iters : 4, done_iters = 0;
  for (int round = 0; round < rounds; round++) {
    int k = (iters - done_iters) / (rounds - round);
    done_iters += k;
    if (k <= 0)
      continue;
    LOOM_TRY_GOTO(st, time_loom(a, send, recv, &s, g, k, &t), done);
    tl += t;
#ifdef LOOM_HAVE_MPI
    if (mpi) {
      LOOM_TRY_GOTO(st, time_mpi(a, send, recv, &s, g, k, &t), done);
      tm += t;
    }
#endif
  }
  LOOM_TRY_GOTO(st, check(a, send, recv, &s, g, false, &wl), done);
  if (mpi)
    LOOM_TRY_GOTO(st, check(a, send, recv, &s, g, true, &wm), done);
  if (rank == 0) {
    double us = tl / iters * 1e6, algbw = (double)nbytes / (tl / iters) / 1e9;
    printf("  %11zu %12zu %5s %5s | %10.1f %8.2f %8.2f %6ld", nbytes,
           s.recv_elems, loom_dtype_name(a->dtype), redop_of(a), us, algbw,
           algbw * s.busbw_factor, wl);
    if (mpi) {
      double mus = tm / iters * 1e6;
      double malg = (double)nbytes / (tm / iters) / 1e9;
      printf(" | %10.1f %8.2f %8.2f %6ld | %6.2f", mus, malg,
             malg * s.busbw_factor, wm, tm / tl);
    }
    printf("\n");
    fflush(stdout);
  }
done:
  if (a->shared) {
    loom_group_mem_free(g, send);
    loom_group_mem_free(g, recv);
  } else {
    loom_free(send);
    loom_free(recv);
  }
  return st;
}

static loom_status bench_op(const bench_args *a, loom_group *g, bool mpi) {
  print_header(a, g, mpi);
  if (a->sizes) {
    for (const char *p = a->sizes; *p;) {
      size_t bytes;
      if (next_size(&p, &bytes)) /* parse_args checked the list */
        return loom_error(LOOM_ERR_INVALID_ARG, "bad --sizes '%s'", a->sizes);
      LOOM_TRY(bench_size(a, bytes, g, mpi));
    }
    return LOOM_OK;
  }
  /* min, min*factor, min*factor^2, ... up to max (with a margin for the
   * rounding of the products). The size is kept in a double, as the
   * product of the factors; the loop ends because min >= 1 and factor > 1
   * (parse_args). */
  double b = (double)a->min;
  while (b <= (double)a->max * 1.0001) {
    LOOM_TRY(bench_size(a, (size_t)b, g, mpi));
    b *= a->factor;
  }
  return LOOM_OK;
}

int loom_bench_comm(int argc, char **argv) {
  bench_args a;
  int pr = parse_args(argc, argv, &a);
  if (pr != 0)
    return pr > 0 ? LOOM_EXIT_OK : LOOM_EXIT_USAGE;
  loom_group *g = NULL;
  if (loom_group_world(NULL, &g) != LOOM_OK) {
    fprintf(stderr, "loom bench comm: %s\n", loom_last_error());
    return LOOM_EXIT_FAIL;
  }
  bool mpi = a.mpi && strcmp(loom_group_backend(g), "mpi") == 0;
  print_mpi_library(g);
  loom_status st = LOOM_OK;
  if (a.all_ops) {
    static const loom_comm_op ops[] = {
        LOOM_COMM_ALLREDUCE, LOOM_COMM_REDUCE_SCATTER, LOOM_COMM_ALLGATHER,
        LOOM_COMM_BROADCAST, LOOM_COMM_ALLTOALL};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && st == LOOM_OK; i++) {
      a.op = ops[i];
      st = bench_op(&a, g, mpi);
    }
  } else {
    st = bench_op(&a, g, mpi);
  }
  if (st != LOOM_OK)
    fprintf(stderr, "loom bench comm: %s\n", loom_last_error());
  loom_group_free(g);
  return st == LOOM_OK ? LOOM_EXIT_OK : LOOM_EXIT_FAIL;
}
