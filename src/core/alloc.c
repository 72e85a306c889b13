/* The one allocation path of loom, with a hook that fails the n-th call,
 * and reserved address space whose pages are given back as they go idle. */
#include "loom/core.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_long alloc_calls;
static atomic_long fail_at; /* absolute call number to fail; 0 = never */

void loom_alloc_fail_after(long n) {
  atomic_store(&fail_at, n > 0 ? atomic_load(&alloc_calls) + n : 0);
}

long loom_alloc_count(void) { return atomic_load(&alloc_calls); }

void *loom_malloc(size_t bytes) {
  long call = atomic_fetch_add(&alloc_calls, 1) + 1;
  long f = atomic_load(&fail_at);
  if (f != 0 && call == f) {
    loom_error(LOOM_ERR_NOMEM, "allocation of %zu bytes failed (test hook)",
               bytes);
    return NULL;
  }
  void *p = NULL;
  size_t size = bytes ? (bytes + 63) & ~(size_t)63 : 64;
  if (size < bytes || posix_memalign(&p, 64, size) != 0) {
    loom_error(LOOM_ERR_NOMEM, "allocation of %zu bytes failed", bytes);
    return NULL;
  }
  return p;
}

void *loom_calloc(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) {
    loom_error(LOOM_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", count,
               size);
    return NULL;
  }
  void *p = loom_malloc(count * size);
  if (p)
    memset(p, 0, count * size);
  return p;
}

void loom_free(void *p) { free(p); }

/* ------------------------------------------------------ reserved memory */

static size_t page_size(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

void *loom_vmem_new(size_t bytes) {
  long call = atomic_fetch_add(&alloc_calls, 1) + 1;
  long f = atomic_load(&fail_at);
  if (f != 0 && call == f) {
    loom_error(LOOM_ERR_NOMEM, "reserving %zu bytes failed (test hook)", bytes);
    return NULL;
  }
  /* Private anonymous pages: zero on first touch, and MADV_DONTNEED makes
   * them zero again and gives them back. NORESERVE: only what is touched
   * counts against memory. */
  size_t n = bytes ? bytes : 1;
  bool huge = n >= LOOM_VMEM_HUGE_MIN;
  size_t extra = huge ? LOOM_VMEM_HUGE_PAGE : 0;
  char *m = mmap(NULL, n + extra, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    loom_error(LOOM_ERR_NOMEM, "reserving %zu bytes failed: %s", bytes,
               strerror(errno));
    return NULL;
  }
  if (!huge)
    return m;
  /* Large buffers on 2 MiB boundaries, in transparent huge pages where the
   * system allows them (madvise mode): ZeRO gives back and touches again
   * hundreds of MB a step, and a 4 KiB page costs a fault and a clear each
   * time (measured: 0.28 s to touch 340 MB, 0.05 s in huge pages). */
  char *p = (char *)(((uintptr_t)m + LOOM_VMEM_HUGE_PAGE - 1) &
                     ~(uintptr_t)(LOOM_VMEM_HUGE_PAGE - 1));
  if (p > m)
    munmap(m, (size_t)(p - m));
  /* The mapping ends at m + whole pages of n, plus extra (whole pages). */
  size_t ps = page_size(), whole = (n + ps - 1) / ps * ps;
  if (p + whole < m + whole + extra)
    munmap(p + whole, (size_t)(m + whole + extra - (p + whole)));
  madvise(p, n, MADV_HUGEPAGE); /* a hint: refused where THP is off */
  return p;
}

void loom_vmem_release(void *p, size_t from, size_t to) {
  if (!p || to <= from)
    return;
  size_t ps = page_size();
  char *b = p;
  size_t a = (from + ps - 1) / ps * ps, e = to / ps * ps;
  if (a >= e) { /* no whole page inside */
    memset(b + from, 0, to - from);
    return;
  }
  memset(b + from, 0, a - from);
  memset(b + e, 0, to - e);
  if (madvise(b + a, e - a, MADV_DONTNEED) != 0)
    memset(b + a, 0, e - a); /* cannot happen on a mapping of ours */
}

void loom_vmem_free(void *p, size_t bytes) {
  if (p)
    munmap(p, bytes ? bytes : 1);
}

size_t loom_vmem_resident(const void *p, size_t from, size_t to) {
  if (!p || to <= from)
    return 0;
  size_t ps = page_size();
  size_t a = from / ps * ps, e = (to + ps - 1) / ps * ps;
  size_t n = (e - a) / ps, res = 0;
  unsigned char vec[4096];
  for (size_t i = 0; i < n; i += sizeof vec) {
    size_t k = n - i < sizeof vec ? n - i : sizeof vec;
    if (mincore((char *)(uintptr_t)p + a + i * ps, k * ps, vec) != 0)
      return 0;
    for (size_t j = 0; j < k; j++)
      res += (vec[j] & 1) * ps;
  }
  return res;
}

/* ------------------------------------------------- memory by category */

static _Atomic size_t mem_now[LOOM_MEM_CAT_COUNT];
static _Atomic size_t mem_peak[LOOM_MEM_CAT_COUNT];

static const char *mem_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_MEM_CAT_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};

void loom_mem_add(loom_mem_cat c, size_t bytes) {
  if ((unsigned)c >= LOOM_MEM_CAT_COUNT || !bytes)
    return;
  size_t now = atomic_fetch_add(&mem_now[c], bytes) + bytes;
  size_t peak = atomic_load(&mem_peak[c]);
  while (now > peak && !atomic_compare_exchange_weak(&mem_peak[c], &peak, now))
    ;
}

void loom_mem_sub(loom_mem_cat c, size_t bytes) {
  if ((unsigned)c >= LOOM_MEM_CAT_COUNT || !bytes)
    return;
  atomic_fetch_sub(&mem_now[c], bytes);
}

void loom_mem_get(loom_mem_cat c, size_t *now, size_t *peak) {
  bool ok = (unsigned)c < LOOM_MEM_CAT_COUNT;
  if (now)
    *now = ok ? atomic_load(&mem_now[c]) : 0;
  if (peak)
    *peak = ok ? atomic_load(&mem_peak[c]) : 0;
}

const char *loom_mem_cat_name(loom_mem_cat c) {
  return (unsigned)c < LOOM_MEM_CAT_COUNT ? mem_names[c] : "?";
}

void loom_mem_reset_peaks(void) {
  for (int c = 0; c < LOOM_MEM_CAT_COUNT; c++)
    atomic_store(&mem_peak[c], atomic_load(&mem_now[c]));
}
