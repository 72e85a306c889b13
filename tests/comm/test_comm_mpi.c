/* comm across ranks (run with `loom run -n N`, N = 1..4): every operation x
 * dtype x size (0, 1, odd, a few MB) x in/out of place against a serial
 * reference, avg and bf16/f16 included; sub-groups from split; point to
 * point; overlap of a collective with computation; a pending receive that
 * leaves the core to the compute; mismatched collectives
 * reported by name (LOOM_COMM_CHECK=1). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/internal.h"
#include "loom/comm.h"
#include "tt.h"

static loom_group *world;
static int R, P;

static void abort_all(void) { loom_group_abort(world, 1); }

/* A group under test and the world rank of each of its members. */
typedef struct tgroup {
  loom_group *g;
  int rank, size;
  int members[64];
} tgroup;

/* Small integers, so every sum and average is exact in every dtype and in
 * any order; products use 1 and 2 only. */
static int val(int wrank, size_t i, int salt, bool prod) {
  if (prod)
    return 1 + (int)((i + (size_t)wrank + (size_t)salt) % 2);
  return (int)((i * 7 + (size_t)wrank * 3 + (size_t)salt) % 13) - 6;
}

static void put(void *buf, loom_dtype dt, size_t i, double v) {
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
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case LOOM_I64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case LOOM_U8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  default:
    break;
  }
}

static bool is_int(loom_dtype dt) {
  return dt == LOOM_I32 || dt == LOOM_I64 || dt == LOOM_U8;
}

/* Element i of rank wrank's input (u8 shifted to stay non-negative). */
static double input(loom_dtype dt, int wrank, size_t i, int salt, bool prod) {
  int v = val(wrank, i, salt, prod);
  return dt == LOOM_U8 && !prod ? v + 6 : v;
}

/* The reduction over the group's members of element i, as loom defines
 * it: combined in rank order, avg divided in the dtype's arithmetic. */
static double reduced(const tgroup *t, loom_dtype dt, loom_redop op, size_t i,
                      int salt) {
  bool prod = op == LOOM_PROD;
  double acc = 0;
  for (int k = 0; k < t->size; k++) {
    double v = input(dt, t->members[k], i, salt, prod);
    if (k == 0)
      acc = v;
    else if (op == LOOM_SUM || op == LOOM_AVG)
      acc += v;
    else if (op == LOOM_PROD)
      acc *= v;
    else if (op == LOOM_MAX)
      acc = v > acc ? v : acc;
    else
      acc = v < acc ? v : acc;
  }
  if (op == LOOM_AVG) {
    if (is_int(dt))
      acc = (double)((long long)acc / t->size);
    else if (dt == LOOM_F64)
      acc = acc / t->size;
    else
      acc = (double)((float)acc / (float)t->size);
  }
  return acc;
}

/* Inputs and results repeat every 26 elements (val mod 13 and mod 2), so
 * buffers are filled by tiling 26 computed elements: the reference stays
 * cheap for buffers of a few MB. */
#define PERIOD 26

static void tile(char *buf, size_t n, size_t e, const char *tab) {
  size_t done = n < PERIOD ? n : PERIOD;
  memcpy(buf, tab, done * e);
  while (done < n) {
    size_t k = done < n - done ? done : n - done;
    memcpy(buf + done * e, buf, k * e);
    done += k;
  }
}

/* buf[i] = input of world rank wrank at element base + i. */
static void fill_in(void *buf, loom_dtype dt, size_t n, int wrank, int salt,
                    bool prod, size_t base) {
  char tab[PERIOD * 8];
  for (size_t k = 0; k < PERIOD; k++)
    put(tab, dt, k, input(dt, wrank, base + k, salt, prod));
  tile(buf, n, loom_dtype_size(dt), tab);
}

/* buf[i] = the group's reduction at element base + i. */
static void fill_red(void *buf, const tgroup *t, loom_dtype dt, loom_redop op,
                     size_t n, int salt, size_t base) {
  char tab[PERIOD * 8];
  for (size_t k = 0; k < PERIOD; k++)
    put(tab, dt, k, reduced(t, dt, op, base + k, salt));
  tile(buf, n, loom_dtype_size(dt), tab);
}

static int nbad;

/* Buffers of the collectives under test: private memory, memory from
 * loom_group_mem_alloc (the direct path), or registered everywhere but
 * rank 0 (which must make every rank take the staged path). */
enum { MEM_PRIVATE, MEM_SHARED, MEM_MIXED };
static int mem_mode;

typedef struct tbuf {
  char *p;        /* what the test uses */
  void *shared;   /* from loom_group_mem_alloc, if any */
  bool private_p; /* p is malloc'd */
} tbuf;

static tbuf talloc(loom_group *g, size_t bytes) {
  tbuf b = {0};
  if (mem_mode != MEM_PRIVATE) {
    if (loom_group_mem_alloc(g, bytes, &b.shared) != LOOM_OK) {
      tt_fail_prefix(__FILE__, __LINE__);
      fprintf(stderr, "mem_alloc: %s\n", loom_last_error());
      tt_fail_done();
    }
    b.p = b.shared;
  }
  if (mem_mode == MEM_PRIVATE || (mem_mode == MEM_MIXED && R == 0)) {
    b.p = malloc(bytes);
    b.private_p = true;
  }
  return b;
}

static void tfree(loom_group *g, tbuf *b) {
  if (b->private_p)
    free(b->p);
  loom_group_mem_free(g, b->shared);
}

static void expect_equal(const char *what, loom_dtype dt, const void *got,
                         const void *want, size_t n, int line) {
  size_t e = loom_dtype_size(dt);
  if (memcmp(got, want, n * e) == 0)
    return;
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)got + i * e, (const char *)want + i * e, e)) {
      tt_fail_prefix(__FILE__, line);
      fprintf(stderr, "%s %s n=%zu: first difference at element %zu\n", what,
              loom_dtype_name(dt), n, i);
      nbad++;
      tt_fail_done();
      return;
    }
}

/* Runs every collective on t for one dtype and count. */
static void ops_once(const tgroup *t, loom_dtype dt, size_t n, bool big) {
  size_t e = loom_dtype_size(dt);
  int p = t->size, me = t->rank, wme = t->members[me];
  size_t cap = n * (size_t)p + (size_t)p * (size_t)p + 1;
  tbuf sb = talloc(t->g, cap * e), rb = talloc(t->g, cap * e);
  char *send = sb.p, *recv = rb.p, *want = malloc(cap * e);
  loom_req r = LOOM_REQ_INIT;
  int salt = (int)n % 11;
  for (int inplace = 0; inplace < 2; inplace++) {
    /* all-reduce, every reduction */
    for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
      if (big && op != LOOM_SUM && op != LOOM_AVG)
        continue;
      fill_in(send, dt, n, wme, salt, op == LOOM_PROD, 0);
      fill_red(want, t, dt, (loom_redop)op, n, salt, 0);
      char *out = inplace ? send : recv;
      TT_CHECK_OK(loom_allreduce(send, out, n, dt, (loom_redop)op, t->g, &r));
      TT_CHECK_OK(loom_wait(&r));
      expect_equal(loom_redop_name((loom_redop)op), dt, out, want, n, __LINE__);
    }
    /* reduce to the last rank */
    fill_in(send, dt, n, wme, salt, false, 0);
    fill_red(want, t, dt, LOOM_MAX, n, salt, 0);
    int root = p - 1;
    char *out = inplace && me == root ? send : recv;
    TT_CHECK_OK(loom_reduce(send, out, n, dt, LOOM_MAX, root, t->g, &r));
    TT_CHECK_OK(loom_wait(&r));
    if (me == root)
      expect_equal("reduce", dt, out, want, n, __LINE__);
    /* broadcast from rank 1 (0 for one rank) */
    root = 1 % p;
    fill_in(send, dt, n, wme, salt + (me == root ? 0 : 5), false, 0);
    fill_in(want, dt, n, t->members[root], salt, false, 0);
    out = inplace ? send : recv;
    TT_CHECK_OK(loom_broadcast(send, out, n, dt, root, t->g, &r));
    TT_CHECK_OK(loom_wait(&r));
    expect_equal("broadcast", dt, out, want, n, __LINE__);
    /* all-gather */
    for (int k = 0; k < p; k++)
      fill_in(want + (size_t)k * n * e, dt, n, t->members[k], salt, false, 0);
    char *src = inplace ? recv + (size_t)me * n * e : send;
    fill_in(src, dt, n, wme, salt, false, 0);
    TT_CHECK_OK(loom_allgather(src, recv, n, dt, t->g, &r));
    TT_CHECK_OK(loom_wait(&r));
    expect_equal("allgather", dt, recv, want, n * (size_t)p, __LINE__);
    /* reduce-scatter: block `me` of everyone's send */
    for (int op = LOOM_SUM; op <= LOOM_MIN; op++) {
      if (op == LOOM_MAX)
        continue;
      fill_in(send, dt, n * (size_t)p, wme, salt, false, 0);
      fill_red(want, t, dt, (loom_redop)op, n, salt, (size_t)me * n);
      out = inplace ? send + (size_t)me * n * e : recv;
      TT_CHECK_OK(
          loom_reduce_scatter(send, out, n, dt, (loom_redop)op, t->g, &r));
      TT_CHECK_OK(loom_wait(&r));
      expect_equal("reducescatter", dt, out, want, n, __LINE__);
    }
    if (big)
      continue;
    /* all-gather-v: rank k gives n + k elements (n = 0: only odd ranks) */
    size_t counts[64], total = 0, mine_at = 0;
    for (int k = 0; k < p; k++) {
      counts[k] = n ? n + (size_t)k : (size_t)(k % 2);
      if (k == me)
        mine_at = total;
      fill_in(want + total * e, dt, counts[k], t->members[k], salt, false, 0);
      total += counts[k];
    }
    tbuf vb = talloc(t->g, (total + 1) * e);
    char *vrecv = vb.p;
    src = inplace ? vrecv + mine_at * e : send;
    fill_in(src, dt, counts[me], wme, salt, false, 0);
    TT_CHECK_OK(loom_allgatherv(src, vrecv, counts, dt, t->g, &r));
    TT_CHECK_OK(loom_wait(&r));
    expect_equal("allgatherv", dt, vrecv, want, total, __LINE__);
    tfree(t->g, &vb);
    /* all-to-all: block j of rank k's send goes to rank j */
    for (int j = 0; j < p; j++) {
      fill_in(send + (size_t)j * n * e, dt, n, wme * 64 + j, salt, false, 0);
      fill_in(want + (size_t)j * n * e, dt, n, t->members[j] * 64 + me, salt,
              false, 0);
    }
    out = inplace ? send : recv;
    TT_CHECK_OK(loom_alltoall(send, out, n, dt, t->g, &r));
    TT_CHECK_OK(loom_wait(&r));
    expect_equal("alltoall", dt, out, want, n * (size_t)p, __LINE__);
  }
  TT_CHECK_OK(loom_barrier(t->g, &r));
  TT_CHECK_OK(loom_wait(&r));
  tfree(t->g, &sb);
  tfree(t->g, &rb);
  free(want);
}

static void all_ops(const tgroup *t, bool big_too) {
  static const size_t sizes[] = {0, 1, 7, 1000};
  for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++) {
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      ops_once(t, (loom_dtype)dt, sizes[s], false);
    /* A few MB, through many pipeline chunks (1/8 of it in sanitizer
     * builds, still several chunks). */
    size_t big = getenv("LOOM_TEST_SANITIZED") ? 384u << 10 : 3u << 20;
    if (big_too && (dt == LOOM_F32 || dt == LOOM_BF16))
      ops_once(t, (loom_dtype)dt, big / loom_dtype_size((loom_dtype)dt) + 5,
               true);
  }
}

TT_TEST(test_world_ops) {
  tgroup t = {.g = world, .rank = R, .size = P};
  for (int k = 0; k < P; k++)
    t.members[k] = k;
  uint64_t h0 = loom_comm_hier_count(world), a0, rs0, ag0;
  loom_comm_hier_counts(world, &a0, &rs0, &ag0);
  all_ops(&t, true);
  /* LOOM_COMM_FAKE_HOSTS=K with more than one rank a host: the all-reduces
   * took the hierarchical path (and matched the reference above). */
  const char *fake = getenv("LOOM_COMM_FAKE_HOSTS");
  int hosts = fake ? atoi(fake) : 0;
  bool hier = hosts > 1 && P % hosts == 0 && P / hosts > 1 &&
              strcmp(getenv("LOOM_COMM_HIER") ? getenv("LOOM_COMM_HIER") : "1",
                     "0") != 0;
  uint64_t a1, rs1, ag1;
  loom_comm_hier_counts(world, &a1, &rs1, &ag1);
  if (hier) {
    /* Consecutive ranks make the hosts: reduce-scatter, all-gather and
     * all-gather-v took the two levels too. */
    TT_CHECK(loom_comm_hier_count(world) - h0 > 50);
    TT_CHECK(rs1 - rs0 > 50);
    TT_CHECK(ag1 - ag0 > 50);
  } else {
    TT_CHECK_EQ(loom_comm_hier_count(world), 0);
    TT_CHECK_EQ(rs1 + ag1, 0);
  }
  if (R == 0 && hier)
    printf("hierarchical all-reduces: %llu, reduce-scatters: %llu, "
           "all-gathers: %llu\n",
           (unsigned long long)(loom_comm_hier_count(world) - h0),
           (unsigned long long)(rs1 - rs0), (unsigned long long)(ag1 - ag0));
}

/* The same on memory from loom_group_mem_alloc (every rank's buffers
 * registered: direct path), and with rank 0's buffers private (staged). */
TT_TEST(test_shared_memory_ops) {
  tgroup t = {.g = world, .rank = R, .size = P};
  for (int k = 0; k < P; k++)
    t.members[k] = k;
  uint64_t d0, s0, d1, s1, d2, s2;
  loom_comm_path_counts(world, &d0, &s0);
  mem_mode = MEM_SHARED;
  all_ops(&t, true);
  loom_comm_path_counts(world, &d1, &s1);
  mem_mode = MEM_MIXED;
  all_ops(&t, false);
  loom_comm_path_counts(world, &d2, &s2);
  mem_mode = MEM_PRIVATE;
  if (loom_group_shm(world)) {
    TT_CHECK(d1 - d0 > 300); /* registered buffers went direct */
    TT_CHECK_EQ(d2, d1);     /* one private rank: everyone staged */
    TT_CHECK(s2 - s1 > 300);
  }
  /* The memory is shared with the other ranks of the host. */
  void *m = NULL;
  TT_REQUIRE_OK(loom_group_mem_alloc(world, 1000, &m));
  TT_CHECK(m != NULL && ((uintptr_t)m & 63) == 0);
  TT_CHECK(((char *)m)[999] == 0);
  loom_group_mem_free(world, m);
}

/* Non-integer data: results close to a double reference, and bitwise equal
 * on every rank on the shared-memory path. */
TT_TEST(test_random_sum) {
  enum { N = 100003 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
  float *ref = malloc(N * sizeof *ref);
  for (size_t i = 0; i < N; i++) {
    double s = 0;
    for (int k = 0; k < P; k++) {
      loom_rng g = loom_rng_init(42, (uint64_t)k);
      loom_rng_seek(&g, i);
      float v = loom_rng_uniform(&g) * 2 - 1;
      if (k == R)
        x[i] = v;
      s += v;
    }
    ref[i] = (float)s;
  }
  loom_req r = LOOM_REQ_INIT;
  TT_REQUIRE_OK(loom_allreduce(x, y, N, LOOM_F32, LOOM_SUM, world, &r));
  TT_REQUIRE_OK(loom_wait(&r));
  TT_CHECK_CLOSE(y, ref, N, 1e-5, 1e-5);
  /* The shared path and the hierarchical one give every rank the same
   * bits (the flat MPI path is MPI's business). */
  if (loom_group_shm(world) || loom_comm_hier_count(world) > 0) {
    uint32_t crc = loom_crc32c(0, y, N * sizeof *y), all[64];
    TT_CHECK_OK(loom_allgather(&crc, all, 1, LOOM_I32, world, &r));
    TT_CHECK_OK(loom_wait(&r));
    for (int k = 0; k < P; k++)
      TT_CHECK_EQ(all[k], crc);
  }
  free(x);
  free(y);
  free(ref);
}

TT_TEST(test_split) {
  /* Even and odd ranks, each ordered by descending world rank. */
  loom_group *sub = NULL;
  TT_REQUIRE_OK(loom_group_split(world, R % 2, P - R, &sub));
  TT_REQUIRE(sub != NULL);
  tgroup t = {.g = sub};
  for (int k = P - 1; k >= 0; k--)
    if (k % 2 == R % 2)
      t.members[t.size++] = k;
  for (int k = 0; k < t.size; k++)
    if (t.members[k] == R)
      t.rank = k;
  TT_CHECK_EQ(loom_group_size(sub), t.size);
  TT_CHECK_EQ(loom_group_rank(sub), t.rank);
  /* One host here, or the hosts of LOOM_COMM_FAKE_HOSTS. */
  const char *fake = getenv("LOOM_COMM_FAKE_HOSTS");
  int per = fake && atoi(fake) > 0 ? P / atoi(fake) : P, local = 0;
  for (int k = 0; k < t.size; k++)
    local += t.members[k] / per == R / per;
  TT_CHECK_EQ(loom_group_local_size(sub), local);
  all_ops(&t, false);

  /* Nested: the whole sub-group again. */
  loom_group *same = NULL;
  TT_REQUIRE_OK(loom_group_split(sub, 0, 0, &same));
  TT_CHECK_EQ(loom_group_size(same), t.size);
  int one = 1, sum = 0;
  loom_req r = LOOM_REQ_INIT;
  TT_CHECK_OK(loom_allreduce(&one, &sum, 1, LOOM_I32, LOOM_SUM, same, &r));
  TT_CHECK_OK(loom_wait(&r));
  TT_CHECK_EQ(sum, t.size);
  loom_group_free(same);
  loom_group_free(sub);

  /* Rank 0 stays out. */
  loom_group *rest = (loom_group *)1;
  TT_REQUIRE_OK(loom_group_split(world, R == 0 ? -1 : 5, R, &rest));
  if (R == 0) {
    TT_CHECK(rest == NULL);
  } else {
    TT_REQUIRE(rest != NULL);
    TT_CHECK_EQ(loom_group_size(rest), P - 1);
    TT_CHECK_EQ(loom_group_rank(rest), R - 1);
    TT_CHECK_OK(loom_allreduce(&one, &sum, 1, LOOM_I32, LOOM_SUM, rest, &r));
    TT_CHECK_OK(loom_wait(&r));
    TT_CHECK_EQ(sum, P - 1);
    loom_group_free(rest);
  }
}

TT_TEST(test_p2p) {
  /* A ring: send right, receive from the left; half the ranks post the
   * receive first. Small and large messages. */
  static const size_t sizes[] = {1, 1000, 1 << 18};
  for (size_t s = 0; s < 3; s++) {
    size_t n = sizes[s];
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++)
      a[i] = (float)(R * 1000 + (int)(i % 997));
    int right = (R + 1) % P, left = (R + P - 1) % P;
    loom_req rs = LOOM_REQ_INIT, rr = LOOM_REQ_INIT;
    if (R % 2) {
      TT_CHECK_OK(loom_recv(b, n, LOOM_F32, left, 5, world, &rr));
      TT_CHECK_OK(loom_send(a, n, LOOM_F32, right, 5, world, &rs));
    } else {
      TT_CHECK_OK(loom_send(a, n, LOOM_F32, right, 5, world, &rs));
      TT_CHECK_OK(loom_recv(b, n, LOOM_F32, left, 5, world, &rr));
    }
    TT_CHECK_OK(loom_wait(&rs));
    TT_CHECK_OK(loom_wait(&rr));
    TT_CHECK(b[0] == (float)(left * 1000));
    TT_CHECK(b[n - 1] == (float)(left * 1000 + (int)((n - 1) % 997)));
    free(a);
    free(b);
  }
}

static double compute_step(double acc) {
  for (int k = 0; k < 2000; k++)
    acc = acc * 0.999 + (double)k * 1e-6;
  return acc;
}

/* A collective posted before a compute loop completes while the loop runs.
 * Rank 1 joins the collective only after rank 0 has computed with its
 * request pending, so rank 0 provably computed while it was in flight. */
TT_TEST(test_overlap) {
  enum { N = 1 << 18 };
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  for (int i = 0; i < N; i++)
    a[i] = (float)((i + R) % 3);
  loom_req r = LOOM_REQ_INIT, tok = LOOM_REQ_INIT;
  int token = 7;
  bool done = false;
  double acc = 1;
  long steps = 0, pending_steps = 0;
  if (R == 1) {
    TT_CHECK_OK(loom_recv(&token, 1, LOOM_I32, 0, 3, world, &tok));
    TT_CHECK_OK(loom_wait(&tok));
  }
  TT_REQUIRE_OK(loom_allreduce(a, b, N, LOOM_F32, LOOM_SUM, world, &r));
  while (!done) {
    acc = compute_step(acc);
    steps++;
    TT_CHECK_OK(loom_test(&r, &done));
    if (!done)
      pending_steps++;
    if (R == 0 && steps == 10 && P > 1) {
      TT_CHECK(!done); /* rank 1 has not posted yet */
      TT_CHECK_OK(loom_send(&token, 1, LOOM_I32, 1, 3, world, &tok));
    }
  }
  if (R == 0 && P > 1) {
    TT_CHECK_OK(loom_wait(&tok));
    TT_CHECK(pending_steps >= 10);
  }
  TT_CHECK(acc > 0);
  for (int i = 0; i < N; i += 4099) {
    float want = 0;
    for (int k = 0; k < P; k++)
      want += (float)((i + k) % 3);
    TT_CHECK(b[i] == want);
  }
  free(a);
  free(b);
}

/* CPU seconds of this process's threads other than the calling one (the
 * communication thread, MPI's own), from /proc in clock ticks. */
static double other_threads_cpu(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return -1;
  long self = (long)syscall(SYS_gettid), ticks = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    long tid = atol(e->d_name);
    if (tid <= 0 || tid == self)
      continue;
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = '\0';
    /* after "(comm)": state is field 3; utime, stime are 14 and 15 */
    char *p = strrchr(line, ')');
    long ut = 0, st = 0;
    if (p &&
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld",
               &ut, &st) == 2)
      ticks += ut + st;
  }
  closedir(d);
  return (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A receive posted long before anyone waits for it (a pipeline's next
 * input) moves only through MPI's polling; the communication thread must
 * not take the core from the computing thread meanwhile. Rank 1 computes
 * for 0.3 s of its own CPU time with the receive pending; its other threads
 * use at most 15% of a core over that time (1-6% measured; a thread that
 * yields in a loop took 0.25 s of the 0.3). Measured against the wall
 * clock, so a loaded machine (fewer CPU seconds a second) cannot fail it.
 * Then rank 0 sends and the data arrives whole. */
TT_TEST(test_quiet_pending) {
  if (P < 2 || R > 1)
    return;
  enum { N = 1 << 18 };
  float *b = calloc(N, sizeof *b);
  int go = 0;
  loom_req r = LOOM_REQ_INIT, g = LOOM_REQ_INIT;
  if (R == 1) {
    TT_REQUIRE_OK(loom_recv(b, N, LOOM_F32, 0, 11, world, &r));
    double c0 = other_threads_cpu(), t0 = thread_cpu(), w0 = loom_time_now();
    double acc = 1;
    while (thread_cpu() - t0 < 0.3)
      acc = compute_step(acc);
    double wall = loom_time_now() - w0, others = other_threads_cpu() - c0;
    printf("[rank 1] pending receive: %.3f s computing, other threads "
           "%.3f s CPU\n",
           wall, others);
    TT_CHECK(acc > 0);
    TT_CHECK(others >= 0 && others <= 0.15 * wall);
    TT_CHECK_OK(loom_send(&go, 1, LOOM_I32, 0, 12, world, &g));
    TT_CHECK_OK(loom_wait(&g));
    TT_CHECK_OK(loom_wait(&r));
    for (int i = 0; i < N; i += 1021)
      TT_CHECK(b[i] == (float)(i % 977));
  } else {
    for (int i = 0; i < N; i++)
      b[i] = (float)(i % 977);
    TT_CHECK_OK(loom_recv(&go, 1, LOOM_I32, 1, 12, world, &g));
    TT_CHECK_OK(loom_wait(&g));
    TT_CHECK_OK(loom_send(b, N, LOOM_F32, 1, 11, world, &r));
    TT_CHECK_OK(loom_wait(&r));
  }
  free(b);
}

/* loom_wait_for: a receive whose sender has not sent yet is not done after
 * the timeout (and the call took the timeout at least), then completes once
 * rank 0 sends; a zeroed request is done at once. A small message (the
 * waiter spins first) and a large one (it sleeps at once). */
TT_TEST(test_wait_for) {
  loom_req z = LOOM_REQ_INIT;
  bool done = false;
  TT_CHECK_OK(loom_wait_for(&z, 5.0, &done));
  TT_CHECK(done);
  if (P < 2 || R > 1)
    return;
  const size_t sizes[2] = {4, (size_t)1 << 18};
  for (int k = 0; k < 2; k++) {
    size_t n = sizes[k];
    float *b = calloc(n, sizeof *b);
    int go = 0;
    loom_req r = LOOM_REQ_INIT, g = LOOM_REQ_INIT;
    if (R == 1) {
      TT_REQUIRE_OK(loom_recv(b, n, LOOM_F32, 0, 21 + k, world, &r));
      double t0 = loom_time_now();
      done = true;
      TT_CHECK_OK(loom_wait_for(&r, 0.05, &done));
      TT_CHECK(!done);
      TT_CHECK(loom_time_now() - t0 >= 0.05);
      TT_CHECK_OK(loom_send(&go, 1, LOOM_I32, 0, 31 + k, world, &g));
      TT_CHECK_OK(loom_wait(&g));
      int polls = 0;
      done = false;
      while (!done && polls++ < 600)
        TT_CHECK_OK(loom_wait_for(&r, 0.1, &done));
      TT_CHECK(done);
      for (size_t i = 0; i < n; i += 97)
        TT_CHECK(b[i] == (float)(i % 977 + 1));
    } else {
      for (size_t i = 0; i < n; i++)
        b[i] = (float)(i % 977 + 1);
      TT_CHECK_OK(loom_recv(&go, 1, LOOM_I32, 1, 31 + k, world, &g));
      TT_CHECK_OK(loom_wait(&g));
      TT_CHECK_OK(loom_send(b, n, LOOM_F32, 1, 21 + k, world, &r));
      TT_CHECK_OK(loom_wait(&r));
    }
    free(b);
  }
}

/* LOOM_COMM_CHECK=1: a different collective on one rank is an error that
 * names both ranks and both operations on every rank, and the group stays
 * usable. */
TT_TEST(test_mismatch) {
  if (P < 2 || !loom_comm_opts_default().check)
    return;
  float x[11] = {0};
  loom_req r = LOOM_REQ_INIT;
  if (R == 0)
    TT_CHECK_OK(loom_allreduce(x, x, 10, LOOM_F32, LOOM_SUM, world, &r));
  else
    TT_CHECK_OK(loom_broadcast(x, x, 10, LOOM_F32, 0, world, &r));
  TT_CHECK_EQ(loom_wait(&r), LOOM_ERR_MISMATCH);
  TT_CHECK(strstr(loom_last_error(), "rank 0 called allreduce #") != NULL);
  TT_CHECK(strstr(loom_last_error(), "rank 1 called broadcast #") != NULL);
  /* Same operation, different count. */
  TT_CHECK_OK(
      loom_allreduce(x, x, R == 0 ? 10 : 11, LOOM_F32, LOOM_SUM, world, &r));
  TT_CHECK_EQ(loom_wait(&r), LOOM_ERR_MISMATCH);
  TT_CHECK(strstr(loom_last_error(), "count 10") != NULL);
  TT_CHECK(strstr(loom_last_error(), "count 11") != NULL);
  /* Still in step. */
  int one = 1, sum = 0;
  TT_CHECK_OK(loom_allreduce(&one, &sum, 1, LOOM_I32, LOOM_SUM, world, &r));
  TT_CHECK_OK(loom_wait(&r));
  TT_CHECK_EQ(sum, P);
  TT_CHECK_OK(loom_group_error(world));
}

int main(void) {
  if (loom_group_world(NULL, &world) != LOOM_OK) {
    fprintf(stderr, "world: %s\n", loom_last_error());
    return 1;
  }
  R = loom_group_rank(world);
  P = loom_group_size(world);
  tt_rank = R;
  tt_on_fail = abort_all;
  /* A launcher that does not match the library gives N singletons. */
  const char *np = getenv("LOOM_RUN_NP");
  if (np && atoi(np) != P) {
    fprintf(stderr, "[rank %d] world size %d, but loom run started %s\n", R, P,
            np);
    return 1;
  }
  if (P > 64) {
    fprintf(stderr, "at most 64 ranks\n");
    return 1;
  }
  double t0 = loom_time_now();
#define RUN_TIMED(t)                                                           \
  do {                                                                         \
    TT_RUN(t);                                                                 \
    if (R == 0)                                                                \
      printf("%-16s %6.2f s\n", #t, loom_time_now() - t0);                     \
  } while (0)
  RUN_TIMED(test_world_ops);
  RUN_TIMED(test_shared_memory_ops);
  RUN_TIMED(test_random_sum);
  RUN_TIMED(test_split);
  RUN_TIMED(test_p2p);
  RUN_TIMED(test_overlap);
  RUN_TIMED(test_quiet_pending);
  RUN_TIMED(test_wait_for);
  RUN_TIMED(test_mismatch);
  if (R == 0)
    printf("backend %s, shm %d, %d ranks\n", loom_group_backend(world),
           loom_group_shm(world), P);
  loom_group_free(world);
  return tt_finish();
}
