/* The trainer's recovery cuts leave the bits alone: a warm-up before the
 * checkpoint read (what a standby rank of loom run does) and the random
 * initialisation deferred until no checkpoint was found (an empty
 * checkpoint directory, or one holding only an unfinished save) end in the
 * same parameters as a plain run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/loom.h"
#include "tt.h"

static char tmp_root[64];

/* A small GPT on a text file the test writes; deterministic data parallel
 * on one rank over 2 virtual shards, so the warm-up goes through DDP's
 * shards and reductions. */
static const char *gpt_yaml = "model:\n"
                              "  name: gpt\n"
                              "  context: 16\n"
                              "  layers: 2\n"
                              "  d_model: 32\n"
                              "  heads: 2\n"
                              "data:\n"
                              "  dataset: kjv\n"
                              "optim:\n"
                              "  name: adamw\n"
                              "  lr: 0.001\n"
                              "  weight_decay: 0.01\n"
                              "parallel:\n"
                              "  deterministic: true\n"
                              "  virtual_shards: 2\n"
                              "train:\n"
                              "  steps: 8\n"
                              "  batch_size: 4\n"
                              "  eval_every: 0\n"
                              "  eval_batches: 2\n"
                              "  seed: 7\n"
                              "checkpoint:\n"
                              "  every: 4\n"
                              "log:\n"
                              "  progress: off\n";

/* A small MLP, DDP with bf16 gradients on the wire, SGD with momentum. */
static const char *mlp_yaml = "model:\n"
                              "  name: mlp\n"
                              "  hidden: [32]\n"
                              "data:\n"
                              "  dataset: fashion-mnist\n"
                              "optim:\n"
                              "  name: sgd\n"
                              "  lr: 0.05\n"
                              "  momentum: 0.9\n"
                              "parallel:\n"
                              "  strategy: ddp\n"
                              "  compress: bf16\n"
                              "train:\n"
                              "  steps: 8\n"
                              "  batch_size: 16\n"
                              "  eval_every: 0\n"
                              "  eval_batches: 2\n"
                              "  seed: 5\n"
                              "checkpoint:\n"
                              "  every: 4\n"
                              "log:\n"
                              "  progress: off\n";

static loom_status load(loom_config *cfg, const char *yaml, const char *run) {
  char set_run[256], set_ckpt[256], set_data[256];
  snprintf(set_run, sizeof set_run, "log.run_dir=%s/%s", tmp_root, run);
  snprintf(set_ckpt, sizeof set_ckpt, "checkpoint.dir=%s/%s/ckpt", tmp_root,
           run);
  snprintf(set_data, sizeof set_data, "data.path=%s/text.txt", tmp_root);
  const char *sets[3] = {set_run, set_ckpt, set_data};
  bool text = strstr(yaml, "kjv") != NULL;
  return loom_config_load_string(cfg, yaml, strlen(yaml), "test.yaml", sets,
                                 text ? 3 : 2);
}

/* One trainer from `resume` to stop_at (0: the end) with warm_up; the final
 * parameters into *out (malloc'd) when out is not NULL. */
static void train(const char *yaml, const char *run, const char *resume,
                  int warm_up, int64_t stop_at, float **out, int64_t *n) {
  loom_config cfg;
  TT_REQUIRE_OK(load(&cfg, yaml, run));
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = resume;
  o.warm_up = warm_up;
  o.stop_at = stop_at;
  loom_trainer *t;
  loom_train_result r;
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  TT_CHECK_OK(loom_trainer_run(t, &r));
  TT_CHECK_EQ(r.steps, stop_at > 0 ? stop_at : cfg.train.steps);
  if (out) {
    loom_model *m = loom_trainer_model(t);
    *n = loom_model_num_params(m);
    *out = malloc((size_t)*n * sizeof(float));
    memcpy(*out, loom_model_params(m), (size_t)*n * sizeof(float));
  }
  loom_trainer_free(t);
}

static void check_same(float *a, float *b, int64_t na, int64_t nb) {
  TT_REQUIRE(a && b);
  TT_CHECK_EQ(na, nb);
  TT_CHECK(memcmp(a, b, (size_t)na * sizeof(float)) == 0);
}

/* The reference: no checkpoint can be loaded, so the model is initialised
 * as it is built; no warm-up. */
static void reference(const char *yaml, const char *name, float **out,
                      int64_t *n) {
  char run[64];
  snprintf(run, sizeof run, "%s_ref", name);
  train(yaml, run, "never", 0, 0, out, n);
}

static void check_warm_up(const char *yaml, const char *name) {
  float *ref = NULL, *warm = NULL;
  int64_t n1 = 0, n2 = 0;
  char run[64];
  reference(yaml, name, &ref, &n1);
  snprintf(run, sizeof run, "%s_warm", name);
  train(yaml, run, "never", 1, 0, &warm, &n2);
  check_same(ref, warm, n1, n2);
  free(warm);
  /* Deferred initialisation (an empty checkpoint directory) and a warm-up
   * on the still zero parameters, then a stop and a warmed resume. */
  warm = NULL;
  snprintf(run, sizeof run, "%s_resumed", name);
  train(yaml, run, "auto", 1, 4, NULL, NULL);
  train(yaml, run, "auto", 1, 0, &warm, &n2);
  check_same(ref, warm, n1, n2);
  free(warm);
  free(ref);
}

TT_TEST(test_warm_up_gpt_deterministic) { check_warm_up(gpt_yaml, "gpt"); }

TT_TEST(test_warm_up_mlp_ddp_bf16) { check_warm_up(mlp_yaml, "mlp"); }

/* The only checkpoint is an unfinished one (a save killed before its
 * commit: a temporary directory, no `latest`): "auto" finds nothing and
 * starts fresh, whose deferred draws are the ones a plain start makes. */
TT_TEST(test_deferred_init_unfinished_checkpoint) {
  float *ref = NULL, *fresh = NULL;
  int64_t n1 = 0, n2 = 0;
  reference(gpt_yaml, "unfinished", &ref, &n1);
  train(gpt_yaml, "unfinished", "auto", 0, 4, NULL, NULL);
  char from[256], to[256];
  snprintf(from, sizeof from, "%s/unfinished/ckpt/step_00000004", tmp_root);
  snprintf(to, sizeof to, "%s/unfinished/ckpt/.step_00000004.tmp", tmp_root);
  TT_REQUIRE(rename(from, to) == 0);
  snprintf(from, sizeof from, "%s/unfinished/ckpt/latest", tmp_root);
  TT_REQUIRE(unlink(from) == 0);
  train(gpt_yaml, "unfinished", "auto", 1, 0, &fresh, &n2);
  check_same(ref, fresh, n1, n2);
  free(fresh);
  free(ref);
}

int main(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/loom_warmup_XXXXXX");
  if (!mkdtemp(tmp_root))
    return 1;
  char path[128];
  snprintf(path, sizeof path, "%s/text.txt", tmp_root);
  FILE *f = fopen(path, "w");
  if (!f)
    return 1;
  loom_rng r = loom_rng_init(3, 0);
  for (int i = 0; i < 20000; i++)
    fputc("abcdefgh ij\n"[loom_rng_below(&r, 12)], f);
  fclose(f);
  TT_RUN(test_warm_up_gpt_deterministic);
  TT_RUN(test_warm_up_mlp_ddp_bf16);
  TT_RUN(test_deferred_init_unfinished_checkpoint);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmp_root);
  return tt_finish();
}
