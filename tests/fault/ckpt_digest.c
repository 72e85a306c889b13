/* Prints "step S sample E:X buffers H" for a checkpoint (a step directory,
 * or a checkpoint root whose newest valid one is taken): H is FNV-1a 64 over
 * every buffer (parameters and optimizer state, in manifest order), so two
 * runs can be compared bit for bit whatever world size wrote them. */
#include <stdio.h>
#include <string.h>

#include "loom/ckpt.h"

static int fail(const char *what) {
  fprintf(stderr, "ckpt_digest: %s: %s\n", what, loom_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ckpt_digest CHECKPOINT_DIR\n");
    return 2;
  }
  loom_ckpt *c = NULL;
  if (loom_ckpt_open(&c, argv[1], NULL) != LOOM_OK &&
      (loom_ckpt_open_latest_valid(&c, argv[1], NULL) != LOOM_OK || !c))
    return fail(argv[1]);
  uint64_t h = LOOM_HASH64_INIT;
  int64_t total = 0;
  int rc = 0;
  for (int i = 0; i < loom_ckpt_buffer_count(c) && rc == 0; i++) {
    loom_ckpt_buffer_info bi;
    if (loom_ckpt_buffer_get(c, i, &bi) != LOOM_OK) {
      rc = fail("buffer");
      break;
    }
    size_t bytes = (size_t)bi.count * loom_dtype_size(bi.dtype);
    void *p = loom_malloc(bytes ? bytes : 1);
    if (!p || loom_ckpt_read_range(c, bi.name, 0, bi.count, p) != LOOM_OK)
      rc = fail(bi.name);
    else
      h = loom_hash64(loom_hash64(h, bi.name, strlen(bi.name)), p, bytes);
    total += bi.count;
    loom_free(p);
  }
  if (rc == 0) {
    const loom_ckpt_meta *m = loom_ckpt_get_meta(c);
    printf("step %lld sample %lld:%lld buffers %016llx (%lld values)\n",
           (long long)m->step, (long long)m->data.epoch,
           (long long)m->data.sample, (unsigned long long)h, (long long)total);
  }
  loom_ckpt_close(c);
  return rc;
}
