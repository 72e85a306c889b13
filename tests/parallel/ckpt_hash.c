/* Prints "<step> <FNV-1a 64 of the params buffer> <elements>" of a checkpoint
 * (a step directory or a checkpoint root, whose latest is taken), so that
 * runs at different world sizes can be compared bit for bit. */
#include <stdio.h>

#include "loom/ckpt.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ddp_ckpt_hash CHECKPOINT_DIR\n");
    return 2;
  }
  loom_ckpt *c = NULL;
  loom_status s = loom_ckpt_open(&c, argv[1], NULL);
  if (s != LOOM_OK)
    s = loom_ckpt_open_latest_valid(&c, argv[1], NULL);
  if (s != LOOM_OK || !c) {
    fprintf(stderr, "ddp_ckpt_hash: %s: %s\n", argv[1],
            c ? loom_last_error() : "no checkpoint");
    return 1;
  }
  loom_ckpt_buffer_info bi;
  float *p = NULL;
  s = loom_ckpt_buffer_find(c, "params", &bi);
  if (s == LOOM_OK && !(p = loom_malloc((size_t)bi.count * sizeof(float))))
    s = LOOM_ERR_NOMEM;
  if (s == LOOM_OK)
    s = loom_ckpt_read_range(c, "params", 0, bi.count, p);
  if (s != LOOM_OK) {
    fprintf(stderr, "ddp_ckpt_hash: %s\n", loom_last_error());
    loom_free(p);
    loom_ckpt_close(c);
    return 1;
  }
  printf("%lld %016llx %lld\n", (long long)loom_ckpt_get_meta(c)->step,
         (unsigned long long)loom_hash64(LOOM_HASH64_INIT, p,
                                         (size_t)bi.count * sizeof(float)),
         (long long)bi.count);
  loom_free(p);
  loom_ckpt_close(c);
  return 0;
}
