/* The one allocation path of loom, with a hook that fails the n-th call. */
#include "loom/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
