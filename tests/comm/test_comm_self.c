/* comm in one process: the self backend (every operation, requests,
 * point to point, split, calls on the communication thread, the watchdog)
 * and the reduction kernels (f32 accumulation of bf16 and f16). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/internal.h"
#include "loom/comm.h"
#include "tt.h"

static loom_group *world;

static void fill(void *buf, loom_dtype dt, size_t n, int seed) {
  for (size_t i = 0; i < n; i++) {
    int v = (int)((i * 7 + (size_t)seed * 3) % 13) - 6;
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
      ((uint8_t *)buf)[i] = (uint8_t)(v + 6);
      break;
    default:
      break;
    }
  }
}

TT_TEST(test_world) {
  TT_REQUIRE(world != NULL);
  TT_CHECK_STR(loom_group_backend(world), "self");
  TT_CHECK_EQ(loom_group_rank(world), 0);
  TT_CHECK_EQ(loom_group_size(world), 1);
  TT_CHECK_EQ(loom_group_local_rank(world), 0);
  TT_CHECK_EQ(loom_group_local_size(world), 1);
  TT_CHECK(!loom_group_shm(world));
  loom_group *again = NULL;
  TT_CHECK_OK(loom_group_world(NULL, &again));
  TT_CHECK(again == world);
  loom_group_free(again); /* drops the extra reference only */
  TT_CHECK_OK(loom_group_error(world));
}

/* Every collective of one rank is a copy; in place is a no-op. */
TT_TEST(test_ops_copy) {
  static const size_t counts[] = {0, 1, 7, 1000};
  for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      size_t n = counts[c], bytes = n * loom_dtype_size((loom_dtype)dt);
      unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
      fill(a, (loom_dtype)dt, n, 1);
      loom_req r[8] = {LOOM_REQ_INIT};
      for (int inplace = 0; inplace < 2; inplace++) {
        void *out = inplace ? a : b;
        memset(b, 0xab, bytes + 1);
        TT_CHECK_OK(
            loom_allreduce(a, out, n, (loom_dtype)dt, LOOM_AVG, world, &r[0]));
        TT_CHECK_OK(loom_wait(&r[0]));
        TT_CHECK(memcmp(a, out, bytes) == 0);
        TT_CHECK_OK(
            loom_reduce(a, out, n, (loom_dtype)dt, LOOM_MAX, 0, world, &r[1]));
        TT_CHECK_OK(loom_broadcast(a, out, n, (loom_dtype)dt, 0, world, &r[2]));
        TT_CHECK_OK(loom_allgather(a, out, n, (loom_dtype)dt, world, &r[3]));
        TT_CHECK_OK(loom_reduce_scatter(a, out, n, (loom_dtype)dt, LOOM_SUM,
                                        world, &r[4]));
        TT_CHECK_OK(loom_alltoall(a, out, n, (loom_dtype)dt, world, &r[5]));
        TT_CHECK_OK(loom_allgatherv(a, out, &n, (loom_dtype)dt, world, &r[6]));
        TT_CHECK_OK(loom_barrier(world, &r[7]));
        TT_CHECK_OK(loom_wait_all(r, 8));
        TT_CHECK(memcmp(a, out, bytes) == 0);
        if (!inplace)
          TT_CHECK(b[bytes] == 0xab); /* nothing written past the end */
      }
      free(a);
      free(b);
    }
}

TT_TEST(test_requests) {
  loom_req zero = LOOM_REQ_INIT;
  bool done = false;
  TT_CHECK_OK(loom_wait(&zero));
  TT_CHECK_OK(loom_test(&zero, &done));
  TT_CHECK(done);

  /* Errors at posting come back from wait too. */
  loom_req r = LOOM_REQ_INIT;
  float x[4] = {1, 2, 3, 4};
  TT_CHECK_EQ(loom_allreduce(x, x, 4, LOOM_F32, (loom_redop)99, world, &r),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_wait(&r), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "reduction") != NULL);
  TT_CHECK_EQ(loom_broadcast(x, x, 4, LOOM_F32, 1, world, &r),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "root 1") != NULL);
  TT_CHECK_EQ(loom_allreduce(NULL, x, 4, LOOM_F32, LOOM_SUM, world, &r),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_allreduce(x, x, 4, LOOM_F32, LOOM_SUM, NULL, &r),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_send(x, 4, LOOM_F32, 0, 40000, world, &r),
              LOOM_ERR_INVALID_ARG);

  /* A persistent request: the same operation started again. */
  float y[4] = {0};
  TT_CHECK_OK(loom_allreduce(x, y, 4, LOOM_F32, LOOM_SUM, world, &r));
  for (int i = 0; i < 5; i++) {
    TT_CHECK_OK(loom_wait(&r));
    TT_CHECK(y[3] == 4.0f + (float)i);
    x[3] += 1;
    TT_CHECK_OK(loom_start(&r));
  }
  TT_CHECK_OK(loom_wait(&r));
  double posted, started, finished;
  loom_req_times(&r, &posted, &started, &finished);
  TT_CHECK(posted > 0 && started >= posted && finished >= started);
  TT_CHECK_OK(loom_test(&r, &done));
  TT_CHECK(done);
}

TT_TEST(test_p2p) {
  int a[5] = {1, 2, 3, 4, 5}, b[5] = {0}, c[5] = {0};
  loom_req s1 = LOOM_REQ_INIT, s2 = LOOM_REQ_INIT, r1 = LOOM_REQ_INIT,
           r2 = LOOM_REQ_INIT;
  /* Receives posted first, matched by tag, not by order. */
  TT_CHECK_OK(loom_recv(b, 5, LOOM_I32, 0, 1, world, &r1));
  TT_CHECK_OK(loom_recv(c, 5, LOOM_I32, 0, 2, world, &r2));
  TT_CHECK_OK(loom_send(a, 5, LOOM_I32, 0, 2, world, &s2));
  TT_CHECK_OK(loom_send(a + 1, 4, LOOM_I32, 0, 1, world, &s1));
  TT_CHECK_OK(loom_wait(&s1));
  TT_CHECK_OK(loom_wait(&s2));
  TT_CHECK_OK(loom_wait(&r1));
  TT_CHECK_OK(loom_wait(&r2));
  TT_CHECK(c[0] == 1 && c[4] == 5);
  TT_CHECK(b[0] == 2 && b[3] == 5);
  /* A message larger than the receive buffer is an error on both sides. */
  TT_CHECK_OK(loom_send(a, 5, LOOM_I32, 0, 3, world, &s1));
  TT_CHECK_OK(loom_recv(b, 2, LOOM_I32, 0, 3, world, &r1));
  TT_CHECK_EQ(loom_wait(&r1), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_wait(&s1), LOOM_ERR_INVALID_ARG);
}

TT_TEST(test_split) {
  loom_group *sub = NULL, *none = (loom_group *)1;
  TT_REQUIRE_OK(loom_group_split(world, 3, 0, &sub));
  TT_REQUIRE(sub != NULL);
  TT_CHECK_EQ(loom_group_size(sub), 1);
  TT_CHECK_EQ(loom_group_rank(sub), 0);
  float x = 2, y = 0;
  loom_req r = LOOM_REQ_INIT;
  TT_CHECK_OK(loom_allreduce(&x, &y, 1, LOOM_F32, LOOM_SUM, sub, &r));
  TT_CHECK_OK(loom_wait(&r));
  TT_CHECK(y == 2);
  TT_CHECK_OK(loom_group_split(world, -1, 0, &none));
  TT_CHECK(none == NULL);
  loom_group_free(sub);
}

typedef struct call_ctx {
  pthread_t caller;
  int ran;
  bool other_thread;
  void *native;
} call_ctx;

static loom_status on_comm_thread(void *p, loom_group *g, void *native) {
  call_ctx *c = p;
  c->ran++;
  c->other_thread = !pthread_equal(pthread_self(), c->caller);
  c->native = native;
  return g == world ? LOOM_OK : LOOM_ERR_INTERNAL;
}

static loom_status failing_call(void *p, loom_group *g, void *native) {
  (void)p;
  (void)g;
  (void)native;
  return loom_error(LOOM_ERR_IO, "failing call %d", 42);
}

TT_TEST(test_call) {
  call_ctx c = {.caller = pthread_self(), .native = (void *)1};
  loom_req r = LOOM_REQ_INIT;
  TT_CHECK_OK(loom_group_call(on_comm_thread, &c, world, &r));
  TT_CHECK_OK(loom_wait(&r));
  TT_CHECK_EQ(c.ran, 1);
  TT_CHECK(c.other_thread);
  TT_CHECK(c.native == NULL);
  TT_CHECK_EQ(loom_group_call(failing_call, NULL, world, &r), LOOM_OK);
  TT_CHECK_EQ(loom_wait(&r), LOOM_ERR_IO);
  TT_CHECK(strstr(loom_last_error(), "failing call 42") != NULL);
}

/* The communication thread runs the operation while this thread computes;
 * results arrive without this thread entering the library. */
TT_TEST(test_overlap) {
  enum { N = 1 << 20 };
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  for (int i = 0; i < N; i++)
    a[i] = (float)(i % 5);
  loom_req r = LOOM_REQ_INIT;
  TT_REQUIRE_OK(loom_allreduce(a, b, N, LOOM_F32, LOOM_SUM, world, &r));
  bool done = false;
  double acc = 0;
  long iters = 0;
  while (!done) {
    for (int k = 0; k < 1000; k++)
      acc += (double)k * 0.5;
    iters++;
    TT_CHECK_OK(loom_test(&r, &done));
  }
  TT_CHECK(iters >= 1 && acc > 0);
  TT_CHECK(b[N - 1] == (float)((N - 1) % 5));
  free(a);
  free(b);
}

/* Several threads post and wait at once; each must wake for its own
 * operation whatever the order of completion. */
typedef struct waiter {
  int tag, got;
  loom_status st;
} waiter;

static void *wait_recv(void *p) {
  waiter *w = p;
  loom_req r = LOOM_REQ_INIT;
  w->st = loom_recv(&w->got, 1, LOOM_I32, 0, w->tag, world, &r);
  if (w->st == LOOM_OK)
    w->st = loom_wait(&r);
  return NULL;
}

TT_TEST(test_threads) {
  enum { T = 4 };
  for (int round = 0; round < 20; round++) {
    waiter w[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
      w[i] = (waiter){.tag = 100 + i, .got = -1};
      pthread_create(&th[i], NULL, wait_recv, &w[i]);
    }
    int vals[T];
    loom_req s[T];
    for (int i = T - 1; i >= 0; i--) { /* reverse order of the waiters */
      vals[i] = round * 10 + i;
      s[i] = (loom_req)LOOM_REQ_INIT;
      TT_CHECK_OK(loom_send(&vals[i], 1, LOOM_I32, 0, 100 + i, world, &s[i]));
    }
    TT_CHECK_OK(loom_wait_all(s, T));
    for (int i = 0; i < T; i++) {
      pthread_join(th[i], NULL);
      TT_CHECK_OK(w[i].st);
      TT_CHECK_EQ(w[i].got, round * 10 + i);
    }
  }
}

/* ------------------------------------------------------ reduce kernels */

TT_TEST(test_reduce_kernels) {
  /* k inputs, all dtypes and ops, against a double reference. */
  enum { N = 1100 };
  for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++)
    for (int op = 0; op < LOOM_REDOP_COUNT; op++)
      for (int k = 1; k <= 5; k++) {
        size_t e = loom_dtype_size((loom_dtype)dt);
        unsigned char *in[5], *out = malloc(N * e);
        const void *inp[5];
        for (int j = 0; j < k; j++) {
          in[j] = malloc(N * e);
          fill(in[j], (loom_dtype)dt, N, j + 1);
          if (op == LOOM_PROD) /* keep products exact: values 1 or 2 */
            for (size_t i = 0; i < N; i++) {
              int v = 1 + (int)((i + (size_t)j) % 2);
              if (dt == LOOM_F32)
                ((float *)in[j])[i] = (float)v;
              else if (dt == LOOM_F64)
                ((double *)in[j])[i] = v;
              else if (dt == LOOM_BF16)
                ((uint16_t *)in[j])[i] = loom_f32_to_bf16((float)v);
              else if (dt == LOOM_F16)
                ((uint16_t *)in[j])[i] = loom_f32_to_f16((float)v);
              else if (dt == LOOM_I32)
                ((int32_t *)in[j])[i] = v;
              else if (dt == LOOM_I64)
                ((int64_t *)in[j])[i] = v;
              else
                ((uint8_t *)in[j])[i] = (uint8_t)v;
            }
          inp[j] = in[j];
        }
        loom_comm_reduce(out, inp, k, N, (loom_dtype)dt, (loom_redop)op, k);
        int bad = 0;
        for (size_t i = 0; i < N; i++) {
          double ref = 0, got = 0;
          for (int j = 0; j < k; j++) {
            double v;
            switch (dt) {
            case LOOM_F32:
              v = ((float *)in[j])[i];
              break;
            case LOOM_F64:
              v = ((double *)in[j])[i];
              break;
            case LOOM_BF16:
              v = loom_bf16_to_f32(((uint16_t *)in[j])[i]);
              break;
            case LOOM_F16:
              v = loom_f16_to_f32(((uint16_t *)in[j])[i]);
              break;
            case LOOM_I32:
              v = ((int32_t *)in[j])[i];
              break;
            case LOOM_I64:
              v = (double)((int64_t *)in[j])[i];
              break;
            default:
              v = ((uint8_t *)in[j])[i];
              break;
            }
            if (j == 0)
              ref = v;
            else if (op == LOOM_SUM || op == LOOM_AVG)
              ref += v;
            else if (op == LOOM_PROD)
              ref *= v;
            else if (op == LOOM_MAX)
              ref = v > ref ? v : ref;
            else
              ref = v < ref ? v : ref;
          }
          if (op == LOOM_AVG) {
            bool integer = dt == LOOM_I32 || dt == LOOM_I64 || dt == LOOM_U8;
            ref = integer ? (double)(long long)(ref / k) : ref / k;
          }
          switch (dt) {
          case LOOM_F32:
            got = ((float *)out)[i];
            ref = (float)ref;
            break;
          case LOOM_F64:
            got = ((double *)out)[i];
            break;
          case LOOM_BF16:
            got = loom_bf16_to_f32(((uint16_t *)out)[i]);
            ref = loom_bf16_to_f32(loom_f32_to_bf16((float)ref));
            break;
          case LOOM_F16:
            got = loom_f16_to_f32(((uint16_t *)out)[i]);
            ref = loom_f16_to_f32(loom_f32_to_f16((float)ref));
            break;
          case LOOM_I32:
            got = ((int32_t *)out)[i];
            break;
          case LOOM_I64:
            got = (double)((int64_t *)out)[i];
            break;
          default:
            got = ((uint8_t *)out)[i];
            break;
          }
          if (got != ref && bad++ < 3)
            fprintf(stderr, "dt %s op %s k %d [%zu]: got %g want %g\n",
                    loom_dtype_name((loom_dtype)dt),
                    loom_redop_name((loom_redop)op), k, i, got, ref);
        }
        TT_CHECK_EQ(bad, 0);
        for (int j = 0; j < k; j++)
          free(in[j]);
        free(out);
      }

  /* bf16 accumulates in f32 and rounds once: 1 + 4 * 2^-9 = 1 + 2^-7 is a
   * bf16 value, but pairwise bf16 rounding would stay at 1. */
  uint16_t x[5], r;
  x[0] = loom_f32_to_bf16(1.0f);
  for (int j = 1; j < 5; j++)
    x[j] = loom_f32_to_bf16(1.0f / 512);
  const void *in[5] = {&x[0], &x[1], &x[2], &x[3], &x[4]};
  loom_comm_reduce(&r, in, 5, 1, LOOM_BF16, LOOM_SUM, 0);
  TT_CHECK(loom_bf16_to_f32(r) == 1.0f + 1.0f / 128);
  uint16_t h[3], hr;
  h[0] = loom_f32_to_f16(1.0f);
  h[1] = h[2] = loom_f32_to_f16(1.0f / 2048); /* half an f16 ulp each */
  const void *hin[3] = {&h[0], &h[1], &h[2]};
  loom_comm_reduce(&hr, hin, 3, 1, LOOM_F16, LOOM_SUM, 0);
  TT_CHECK(loom_f16_to_f32(hr) == 1.0f + 1.0f / 1024);
  /* Output aliasing an input (in place). */
  float a[600], b[600];
  for (int i = 0; i < 600; i++)
    a[i] = (float)i, b[i] = 1;
  const void *ab[2] = {b, a};
  loom_comm_reduce(a, ab, 2, 600, LOOM_F32, LOOM_SUM, 0);
  TT_CHECK(a[0] == 1 && a[599] == 600);
}

TT_TEST(test_names) {
  loom_redop op;
  TT_CHECK_OK(loom_redop_parse("avg", &op));
  TT_CHECK_EQ(op, LOOM_AVG);
  TT_CHECK_EQ(loom_redop_parse("mean", &op), LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_redop_name(LOOM_PROD), "prod");
  TT_CHECK_STR(loom_comm_op_name(LOOM_COMM_REDUCE_SCATTER), "reducescatter");
  bool flag[10] = {0, 1, 1, 1, 0, 1, 0, 0, 1, 1};
  char buf[64];
  loom_comm_rank_list(flag, 10, buf, sizeof buf);
  TT_CHECK_STR(buf, "1-3, 5, 8-9");
}

/* Last: it breaks the group. A receive nobody sends to times out with a
 * message naming the operation. */
TT_TEST(test_watchdog) {
  int v = 0;
  loom_req r = LOOM_REQ_INIT;
  TT_REQUIRE_OK(loom_recv(&v, 1, LOOM_I32, 0, 9, world, &r));
  double t0 = loom_time_now();
  TT_CHECK_EQ(loom_wait(&r), LOOM_ERR_TIMEOUT);
  TT_CHECK(strstr(loom_last_error(), "watchdog: recv") != NULL);
  TT_CHECK(strstr(loom_last_error(), "tag 9") != NULL);
  TT_CHECK(loom_time_now() - t0 < 30); /* bounded, not a hang */
  TT_CHECK_EQ(loom_group_error(world), LOOM_ERR_TIMEOUT);
  /* The broken group refuses further work instead of hanging. */
  float x = 1;
  TT_CHECK_OK(loom_allreduce(&x, &x, 1, LOOM_F32, LOOM_SUM, world, &r));
  TT_CHECK_EQ(loom_wait(&r), LOOM_ERR_REMOTE);
}

int main(void) {
  loom_comm_opts o = loom_comm_opts_default();
  o.backend = LOOM_COMM_SELF;
  o.timeout_s = 0.5;
  if (loom_group_world(&o, &world) != LOOM_OK) {
    fprintf(stderr, "world: %s\n", loom_last_error());
    return 1;
  }
  TT_RUN(test_world);
  TT_RUN(test_ops_copy);
  TT_RUN(test_requests);
  TT_RUN(test_p2p);
  TT_RUN(test_split);
  TT_RUN(test_call);
  TT_RUN(test_overlap);
  TT_RUN(test_threads);
  TT_RUN(test_reduce_kernels);
  TT_RUN(test_names);
  TT_RUN(test_watchdog);
  loom_group_free(world);
  return tt_finish();
}
