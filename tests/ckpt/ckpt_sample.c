/* Writes a small checkpoint for the CLI tests:
 *   ckpt_sample ROOT STEP WORLD
 * a two-layer model (params and AdamW m, v split over WORLD ranks as a
 * sharded run would write them), keeping every checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/ckpt.h"

#define N 4106

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: ckpt_sample ROOT STEP WORLD\n");
    return 2;
  }
  const char *root = argv[1];
  int64_t step = atoll(argv[2]);
  int world = atoi(argv[3]);
  static float params[N], m[N], v[N];
  loom_rng r = loom_rng_init((uint64_t)step, 1);
  loom_rng_fill_normal(&r, params, N, 0, 0.02f);
  loom_rng_fill_uniform(&r, m, N, -1, 1);
  loom_rng_fill_uniform(&r, v, N, 0, 1);
  loom_param views[4] = {
      {.name = "fc1.weight",
       .offset = 0,
       .numel = 4096,
       .ndim = 2,
       .shape = {64, 64},
       .decay = true},
      {.name = "fc1.bias",
       .offset = 4096,
       .numel = 8,
       .ndim = 1,
       .shape = {8},
       .decay = false},
      {.name = "fc2.weight",
       .offset = 4104,
       .numel = 1,
       .ndim = 2,
       .shape = {1, 1},
       .decay = true},
      {.name = "fc2.bias",
       .offset = 4105,
       .numel = 1,
       .ndim = 1,
       .shape = {1},
       .decay = false},
  };
  loom_ckpt_rng rngs[1] = {{.name = "data", .state = loom_rng_init(7, 3)}};
  loom_ckpt_meta meta = loom_ckpt_meta_default();
  snprintf(meta.strategy, sizeof meta.strategy, "%s",
           world > 1 ? "zero1" : "none");
  snprintf(meta.optimizer, sizeof meta.optimizer, "adamw");
  snprintf(meta.schedule, sizeof meta.schedule, "cosine");
  meta.config_hash = 0x1234;
  meta.views = views;
  meta.n_views = 4;
  meta.optimizer_step = step;
  meta.schedule_step = step;
  meta.lr = 3e-4;
  meta.rngs = rngs;
  meta.n_rngs = 1;
  meta.data = (loom_ckpt_data_pos){1, 17, 17 * 32};
  meta.extra_json = "{\"best_val_loss\": 1.93}";
  loom_ckpt_writer *w[64] = {0};
  if (world < 1 || world > 64)
    return 2;
  loom_status st = LOOM_OK;
  for (int k = 0; k < world && st == LOOM_OK; k++) {
    loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
    o.rank = k;
    o.world = world;
    o.keep = 0;
    o.block_bytes = 4096;
    int64_t a = (int64_t)N * k / world, b = (int64_t)N * (k + 1) / world;
    st = loom_ckpt_writer_new(&w[k], root, step, &o);
    if (st == LOOM_OK)
      st = loom_ckpt_writer_add(w[k], "params", LOOM_F32, N, a, b, params + a);
    if (st == LOOM_OK)
      st = loom_ckpt_writer_add(w[k], "adamw.m", LOOM_F32, N, a, b, m + a);
    if (st == LOOM_OK)
      st = loom_ckpt_writer_add(w[k], "adamw.v", LOOM_F32, N, a, b, v + a);
    if (st == LOOM_OK && k == 0)
      st = loom_ckpt_writer_set_meta(w[k], &meta);
    if (st == LOOM_OK)
      st = loom_ckpt_writer_write(w[k]);
  }
  if (st == LOOM_OK)
    st = loom_ckpt_writer_commit(w[0]);
  if (st != LOOM_OK) {
    fprintf(stderr, "ckpt_sample: %s\n", loom_last_error());
    if (w[0])
      loom_ckpt_writer_abort(w[0]);
  }
  for (int k = 0; k < world; k++)
    loom_ckpt_writer_free(w[k]);
  return st == LOOM_OK ? 0 : 1;
}
