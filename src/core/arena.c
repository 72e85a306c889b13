/* Arenas: one block, many 64-byte aligned buffers, freed together. */
#include "loom/core.h"

#include <stdint.h>

struct loom_arena {
  char *base;
  size_t capacity;
  size_t used;
};

loom_status loom_arena_new(loom_arena **out, size_t capacity) {
  *out = NULL;
  /* capacity + 63 below must not wrap, and no block is larger */
  if (capacity > (size_t)PTRDIFF_MAX - 63)
    return loom_error(LOOM_ERR_NOMEM,
                      "arena: capacity of %zu bytes is too large", capacity);
  loom_arena *a = loom_calloc(1, sizeof *a);
  if (!a)
    return LOOM_ERR_NOMEM;
  a->capacity = (capacity + 63) & ~(size_t)63;
  a->base = loom_malloc(a->capacity);
  if (!a->base) {
    loom_free(a);
    return LOOM_ERR_NOMEM;
  }
  *out = a;
  return LOOM_OK;
}

void loom_arena_free(loom_arena *a) {
  if (!a)
    return;
  loom_free(a->base);
  loom_free(a);
}

void *loom_arena_alloc(loom_arena *a, size_t bytes) {
  size_t size = (bytes + 63) & ~(size_t)63;
  if (size < bytes || size > a->capacity - a->used) {
    loom_error(LOOM_ERR_NOMEM, "arena full: %zu bytes asked, %zu of %zu used",
               bytes, a->used, a->capacity);
    return NULL;
  }
  void *p = a->base + a->used;
  a->used += size;
  return p;
}

void loom_arena_reset(loom_arena *a) { a->used = 0; }
size_t loom_arena_used(const loom_arena *a) { return a->used; }
size_t loom_arena_capacity(const loom_arena *a) { return a->capacity; }
