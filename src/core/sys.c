/* Timers, thread settings, checksums: the small services of the platform. */
#define _GNU_SOURCE
#include "loom/core.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double loom_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double loom_time_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int loom_cores(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0)
      return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static atomic_int thread_count;    /* 0: not decided yet */
static atomic_int thread_explicit; /* set by LOOM_THREADS or loom_set_threads */

/* An empty OMP_NUM_THREADS means "not set", as an empty LOOM_THREADS does
 * (loom run passes empty values on): LLVM's libomp aborts on it at its first
 * call (gcc's libgomp warns), so it goes before OpenMP starts. */
static void omp_env_once(void) {
  const char *v = getenv("OMP_NUM_THREADS");
  if (v && !*v)
    unsetenv("OMP_NUM_THREADS");
}

static void set_count(int n) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, omp_env_once);
  atomic_store(&thread_count, n);
  omp_set_num_threads(n);
}

/* LOOM_THREADS: a count in [0, 4096] (0, empty or unset: every core this
 * process may use). Anything else is named in a warning, not taken as 0. */
static int threads_from_env(void) {
  const char *v = getenv("LOOM_THREADS");
  if (!v || !*v)
    return 0;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || n < 0 ||
      n > LOOM_THREADS_MAX) {
    LOOM_WARN("LOOM_THREADS='%s' is not a thread count in [0, %d]; using "
              "all %d cores",
              v, LOOM_THREADS_MAX, loom_cores());
    return 0;
  }
  return (int)n;
}

int loom_threads(void) {
  int n = atomic_load(&thread_count);
  if (n > 0)
    return n;
  n = threads_from_env();
  if (n > 0)
    atomic_store(&thread_explicit, 1);
  else
    n = loom_cores();
  set_count(n);
  return n;
}

void loom_set_threads(int n) {
  if (n <= 0)
    n = loom_cores();
  atomic_store(&thread_explicit, 1);
  set_count(n);
}

int loom_threads_share(int local_rank, int local_size) {
  int n = loom_threads();
  if (atomic_load(&thread_explicit) || local_size <= 1 || local_rank < 0 ||
      local_rank >= local_size)
    return n;
  int cores = loom_cores();
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  /* Ranks that the launcher bound to disjoint cores each see their own
   * share already; ranks that all see the same cores split them. */
  if (online > 0 && (long)cores * local_size <= online && cores < online)
    return n;
  n = cores / local_size + (local_rank < cores % local_size ? 1 : 0);
  if (n < 1)
    n = 1;
  set_count(n);
  return n;
}

/* CRC32C, reflected polynomial 0x82F63B78, slicing by 8 bytes. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc_table[t][i] =
          (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

#if defined(__x86_64__)
/* SSE4.2's crc32 instruction computes CRC32C: 8 bytes per instruction, about
 * 3x the table version (checkpoint saves and loads are bound by it). */
__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (n--)
    c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}
#endif

static uint32_t crc32c_sw(uint32_t crc, const void *data, size_t n);

uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2"))
    return crc32c_hw(crc, data, n);
#endif
  return crc32c_sw(crc, data, n);
}

static uint32_t crc32c_sw(uint32_t crc, const void *data, size_t n) {
  pthread_once(&crc_once, crc_init);
  const unsigned char *p = data;
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                         (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                  (uint32_t)p[7] << 24;
    crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
          crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
          crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
          crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--)
    crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

uint64_t loom_hash64(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}
