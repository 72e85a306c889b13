/* Prints "<step> <FNV-1a 64 of the params buffer> <elements>" of a checkpoint
 * (a step directory or a checkpoint root, whose latest is taken), so that
 * runs at different world sizes can be compared bit for bit; with --diff A B
 * the largest difference of the two params buffers relative to A's largest
 * magnitude (max |a - b| / max |a|), for runs equal up to rounding. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/ckpt.h"

/* The params buffer of a checkpoint (a step or a root), or NULL. */
static float *read_params(const char *dir, int64_t *n, int64_t *step) {
  loom_ckpt *c = NULL;
  loom_status s = loom_ckpt_open(&c, dir, NULL);
  if (s != LOOM_OK)
    s = loom_ckpt_open_latest_valid(&c, dir, NULL);
  if (s != LOOM_OK || !c) {
    fprintf(stderr, "ddp_ckpt_hash: %s: %s\n", dir,
            c ? loom_last_error() : "no checkpoint");
    return NULL;
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
    p = NULL;
  }
  *n = bi.count;
  *step = loom_ckpt_get_meta(c)->step;
  loom_ckpt_close(c);
  return p;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--diff") == 0) {
    int64_t na = 0, nb = 0, sa, sb;
    float *a = read_params(argv[2], &na, &sa);
    float *b = a ? read_params(argv[3], &nb, &sb) : NULL;
    if (!a || !b || na != nb) {
      if (a && b)
        fprintf(stderr, "ddp_ckpt_hash: %lld vs %lld parameters\n",
                (long long)na, (long long)nb);
      loom_free(a);
      loom_free(b);
      return 1;
    }
    double big = 0, diff = 0;
    for (int64_t i = 0; i < na; i++) {
      big = fmax(big, fabs((double)a[i]));
      diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
    }
    printf("%.3g\n", big > 0 ? diff / big : diff);
    loom_free(a);
    loom_free(b);
    return 0;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: ddp_ckpt_hash CHECKPOINT_DIR\n"
                    "       ddp_ckpt_hash --diff CHECKPOINT_A CHECKPOINT_B\n");
    return 2;
  }
  int64_t n, step;
  float *p = read_params(argv[1], &n, &step);
  if (!p)
    return 1;
  printf("%lld %016llx %lld\n", (long long)step,
         (unsigned long long)loom_hash64(LOOM_HASH64_INIT, p,
                                         (size_t)n * sizeof(float)),
         (long long)n);
  loom_free(p);
  return 0;
}
