/* Tests of the training loop: exact resume (bitwise), gradient accumulation
 * equal to a larger batch, clear errors for data that is missing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/loom.h"
#include "tt.h"

static char tmp_root[64];

/* A small MLP on Fashion-MNIST (real data from Debian's package). */
static const char *mlp_yaml = "model:\n"
                              "  name: mlp\n"
                              "  hidden: [32, 32]\n"
                              "data:\n"
                              "  dataset: fashion-mnist\n"
                              "optim:\n"
                              "  name: sgd\n"
                              "  lr: 0.05\n"
                              "  momentum: 0.9\n"
                              "schedule:\n"
                              "  name: cosine\n"
                              "  warmup_steps: 3\n"
                              "train:\n"
                              "  steps: 14\n"
                              "  batch_size: 16\n"
                              "  eval_every: 0\n"
                              "  eval_batches: 2\n"
                              "  seed: 5\n"
                              "log:\n"
                              "  progress: off\n";

/* A small GPT on a text file the test writes. */
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
                              "  grad_clip: 1.0\n"
                              "train:\n"
                              "  steps: 10\n"
                              "  batch_size: 4\n"
                              "  eval_every: 0\n"
                              "  eval_batches: 2\n"
                              "  seed: 7\n"
                              "log:\n"
                              "  progress: off\n";

static loom_status load(loom_config *cfg, const char *yaml, const char *run,
                        const char *extra) {
  char set_run[256], set_ckpt[256], set_data[256];
  snprintf(set_run, sizeof set_run, "log.run_dir=%s/%s", tmp_root, run);
  snprintf(set_ckpt, sizeof set_ckpt, "checkpoint.dir=%s/%s/ckpt", tmp_root,
           run);
  snprintf(set_data, sizeof set_data, "data.path=%s/text.txt", tmp_root);
  const char *sets[4] = {set_run, set_ckpt, extra ? extra : set_run, set_data};
  bool text = strstr(yaml, "kjv") != NULL;
  return loom_config_load_string(cfg, yaml, strlen(yaml), "test.yaml", sets,
                                 text ? 4 : 3);
}

/* Trains to the end, optionally stopping at stop_at first and resuming;
 * copies the final parameters into *out (malloc'd). */
static void train(const char *yaml, const char *run, int64_t stop_at,
                  const char *extra, float **out, int64_t *n) {
  loom_config cfg;
  *out = NULL;
  TT_REQUIRE_OK(load(&cfg, yaml, run, extra));
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  loom_trainer *t;
  loom_train_result r;
  if (stop_at > 0) {
    o.stop_at = stop_at;
    TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
    TT_CHECK_OK(loom_trainer_run(t, &r));
    TT_CHECK(r.interrupted);
    TT_CHECK_EQ(r.steps, stop_at);
    loom_trainer_free(t);
    o.stop_at = 0;
    o.resume = "auto";
  }
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  TT_CHECK_OK(loom_trainer_run(t, &r));
  TT_CHECK(!r.interrupted);
  TT_CHECK_EQ(r.start_step, stop_at);
  TT_CHECK_EQ(r.steps, cfg.train.steps);
  loom_model *m = loom_trainer_model(t);
  *n = loom_model_num_params(m);
  *out = malloc((size_t)*n * sizeof(float));
  memcpy(*out, loom_model_params(m), (size_t)*n * sizeof(float));
  loom_trainer_free(t);
}

static void check_resume(const char *yaml, const char *name, int64_t stop) {
  float *full, *resumed;
  int64_t n1 = 0, n2 = 0;
  char run_a[64], run_b[64];
  snprintf(run_a, sizeof run_a, "%s_full", name);
  snprintf(run_b, sizeof run_b, "%s_resumed", name);
  train(yaml, run_a, 0, NULL, &full, &n1);
  train(yaml, run_b, stop, NULL, &resumed, &n2);
  TT_REQUIRE(full && resumed);
  TT_CHECK_EQ(n1, n2);
  TT_CHECK(memcmp(full, resumed, (size_t)n1 * sizeof(float)) == 0);
  free(full);
  free(resumed);
}

TT_TEST(test_resume_mlp_bitwise) { check_resume(mlp_yaml, "mlp", 6); }

TT_TEST(test_resume_gpt_bitwise) { check_resume(gpt_yaml, "gpt", 4); }

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *buf = calloc(1, 1 << 20);
  if (buf && fread(buf, 1, (1 << 20) - 1, f) == 0)
    buf[0] = '\0';
  fclose(f);
  return buf;
}

/* checkpoint.enabled=false governs writing: --resume auto still goes on
 * from the checkpoint there (it trained afresh over it and began
 * metrics.jsonl anew), ends with the uninterrupted run's bits, and writes
 * no checkpoint. */
TT_TEST(test_resume_with_checkpoints_disabled) {
  float *full = NULL;
  int64_t n = 0;
  train(mlp_yaml, "off_full", 0, "log.every=1", &full, &n);
  TT_REQUIRE(full != NULL);
  loom_config cfg;
  TT_REQUIRE_OK(load(&cfg, mlp_yaml, "off", "log.every=1"));
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  o.stop_at = 6;
  loom_trainer *t;
  loom_train_result r;
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  TT_CHECK_OK(loom_trainer_run(t, &r));
  loom_trainer_free(t);
  char mpath[256], ckpt[256];
  snprintf(mpath, sizeof mpath, "%s/off/metrics.jsonl", tmp_root);
  snprintf(ckpt, sizeof ckpt, "%s/off/ckpt", tmp_root);
  char *before = slurp(mpath);
  TT_REQUIRE(before != NULL && strstr(before, "\"step\":6") != NULL);
  cfg.checkpoint.enabled = false;
  o.stop_at = 0;
  o.resume = "auto";
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  TT_CHECK_OK(loom_trainer_run(t, &r));
  TT_CHECK_EQ(r.start_step, 6);
  TT_CHECK_EQ(r.steps, cfg.train.steps);
  TT_CHECK(!r.saved);
  loom_model *m = loom_trainer_model(t);
  TT_CHECK_EQ(loom_model_num_params(m), n);
  TT_CHECK(memcmp(loom_model_params(m), full, (size_t)n * sizeof(float)) == 0);
  loom_trainer_free(t);
  char *after = slurp(mpath);
  TT_REQUIRE(after != NULL);
  TT_CHECK(strncmp(after, before, strlen(before)) == 0); /* appended */
  TT_CHECK(strstr(after, "\"step\":14") != NULL);
  int64_t latest = -1;
  TT_CHECK_OK(loom_ckpt_read_latest(ckpt, &latest));
  TT_CHECK_EQ(latest, 6);
  free(before);
  free(after);
  free(full);
}

TT_TEST(test_accumulation_equals_big_batch) {
  float *big, *acc;
  int64_t n1 = 0, n2 = 0;
  train(mlp_yaml, "big", 0, "train.batch_size=32", &big, &n1);
  /* Two micro-batches of 16 = one batch of 32 (same samples: the sampler's
   * global batches do not depend on how they are split). */
  loom_config cfg;
  TT_REQUIRE_OK(load(&cfg, mlp_yaml, "acc", "train.accumulate=2"));
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  loom_trainer *t;
  loom_train_result r;
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  TT_CHECK_OK(loom_trainer_run(t, &r));
  /* results left out: evaluated all the same (and a second run of a
   * finished trainer reports nothing, with res NULL) */
  TT_CHECK_OK(loom_trainer_evaluate(t, NULL, NULL));
  double vl = NAN;
  TT_CHECK_OK(loom_trainer_evaluate(t, &vl, NULL));
  TT_CHECK(isfinite(vl));
  TT_CHECK_OK(loom_trainer_run(t, NULL));
  loom_model *m = loom_trainer_model(t);
  n2 = loom_model_num_params(m);
  acc = loom_model_params(m);
  TT_REQUIRE(big != NULL);
  TT_CHECK_EQ(n1, n2);
  TT_CHECK_CLOSE(acc, big, (size_t)n1, 1e-5, 1e-4);
  loom_trainer_free(t);
  free(big);
}

/* Runs mlp_yaml with `sets` (batches of 3000: 20 steps an epoch) and
 * returns how many steps it trained. */
static int64_t steps_run(const char *run, const char *const *sets, int n) {
  loom_config cfg;
  char set_run[256];
  snprintf(set_run, sizeof set_run, "log.run_dir=%s/%s", tmp_root, run);
  const char *all[8] = {set_run, "train.batch_size=3000",
                        "train.eval_batches=1", "checkpoint.enabled=false",
                        "schedule.name=constant"};
  for (int i = 0; i < n; i++)
    all[5 + i] = sets[i];
  if (loom_config_load_string(&cfg, mlp_yaml, strlen(mlp_yaml), "test.yaml",
                              all, 5 + n) != LOOM_OK)
    return -1;
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  loom_trainer *t;
  loom_train_result r = {0};
  if (loom_trainer_new(&t, &cfg, &o) != LOOM_OK)
    return -2;
  loom_status st = loom_trainer_run(t, &r);
  loom_trainer_free(t);
  return st == LOOM_OK ? r.steps : -3;
}

/* train.steps and train.epochs: the first limit reached; train.steps
 * alone is the length (the epoch limit's default, 1, does not cut it). */
TT_TEST(test_step_and_epoch_limits) {
  loom_config cfg;
  TT_REQUIRE_OK(loom_config_load_string(&cfg, mlp_yaml, strlen(mlp_yaml),
                                        "t.yaml", NULL, 0));
  TT_CHECK_EQ(cfg.train.epochs, 0); /* steps: 14 alone */
  const char *ep1[] = {"train.epochs=1", "train.steps=30"};
  TT_CHECK_EQ(steps_run("lim_a", ep1, 2), 20);
  const char *ep2[] = {"train.epochs=2", "train.steps=30"};
  TT_CHECK_EQ(steps_run("lim_b", ep2, 2), 30);
  const char *alone[] = {"train.steps=30"};
  TT_CHECK_EQ(steps_run("lim_c", alone, 1), 30);
  const char *by_epoch[] = {"train.steps=0", "train.epochs=1"};
  TT_CHECK_EQ(steps_run("lim_d", by_epoch, 2), 20);
}

/* NULL trainers are errors, never a crash */
TT_TEST(test_null_trainer) {
  loom_train_result r;
  double l, a;
  loom_config cfg;
  loom_config_defaults(&cfg);
  TT_CHECK_EQ(loom_trainer_new(NULL, &cfg, NULL), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_trainer_run(NULL, &r), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_trainer_evaluate(NULL, &l, &a), LOOM_ERR_INVALID_ARG);
  TT_CHECK(loom_trainer_model(NULL) == NULL);
  loom_trainer_free(NULL);
  /* options out of range are refused, not taken as something else */
  loom_trainer *t = NULL;
  loom_train_opts o = loom_train_opts_default();
  o.stop_at = -5;
  TT_CHECK_EQ(loom_trainer_new(&t, &cfg, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "opts.stop_at -5");
  o = loom_train_opts_default();
  o.warm_up = 7;
  TT_CHECK_EQ(loom_trainer_new(&t, &cfg, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK_HAS(loom_last_error(), "opts.warm_up 7");
  TT_CHECK(t == NULL);
}

TT_TEST(test_missing_data_is_clear_error) {
  loom_config cfg;
  TT_REQUIRE_OK(load(&cfg, mlp_yaml, "missing", "data.path=/no/such/dir"));
  loom_trainer *t = NULL;
  loom_status s = loom_trainer_new(&t, &cfg, NULL);
  TT_CHECK(s != LOOM_OK);
  TT_CHECK(t == NULL);
  TT_CHECK(strstr(loom_last_error(), "/no/such/dir") != NULL);
}

int main(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/loom_trainer_XXXXXX");
  if (!mkdtemp(tmp_root))
    return 1;
  /* Text for the GPT: a repetitive but not trivial byte sequence. */
  char path[128];
  snprintf(path, sizeof path, "%s/text.txt", tmp_root);
  FILE *f = fopen(path, "w");
  if (!f)
    return 1;
  loom_rng r = loom_rng_init(3, 0);
  for (int i = 0; i < 20000; i++)
    fputc("abcdefgh ij\n"[loom_rng_below(&r, 12)], f);
  fclose(f);
  TT_RUN(test_resume_mlp_bitwise);
  TT_RUN(test_resume_gpt_bitwise);
  TT_RUN(test_resume_with_checkpoints_disabled);
  TT_RUN(test_accumulation_equals_big_batch);
  TT_RUN(test_missing_data_is_clear_error);
  TT_RUN(test_step_and_epoch_limits);
  TT_RUN(test_null_trainer);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmp_root);
  return tt_finish();
}
