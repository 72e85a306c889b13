/* Every key of the config schema is honoured or rejected (issue 10): for
 * each key and each documented value (every enum and bool value, a
 * representative in-range number, lists of one and of several unequal
 * items, [] where allowed), a config that sets it either trains for 2 steps
 * or is rejected by `loom config check` with exit status 2 and a message
 * naming the key. The test walks loom_config_keys(), so a key added to the
 * schema is covered without a word here; it fails the suite when the key is
 * accepted and then fails at training start.
 *
 * Argument: the loom executable. Tiny data sets written by the test (64
 * Fashion-MNIST-shaped images, 4 KiB of text, two token shards) keep each
 * training case to milliseconds. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/loom.h"
#include "tt.h"

static const char *loom_bin = "loom";
static char tmp[64];
static int n_trained, n_rejected;

/* ------------------------------------------------------------- tiny data */

static void put_be32(FILE *f, uint32_t v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 8), (unsigned char)v};
  fwrite(b, 1, 4, f);
}

static void write_idx(const char *dir, const char *pre, uint32_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, pre);
  FILE *f = fopen(path, "wb");
  TT_REQUIRE(f != NULL);
  put_be32(f, 0x00000803);
  put_be32(f, n);
  put_be32(f, 28);
  put_be32(f, 28);
  for (uint32_t i = 0; i < n * 28 * 28; i++)
    fputc((int)((i * 2654435761u) >> 24), f);
  TT_REQUIRE(fclose(f) == 0);
  snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, pre);
  f = fopen(path, "wb");
  TT_REQUIRE(f != NULL);
  put_be32(f, 0x00000801);
  put_be32(f, n);
  for (uint32_t i = 0; i < n; i++)
    fputc((int)(i % 10), f);
  TT_REQUIRE(fclose(f) == 0);
}

static void write_shard(const char *path, int ntok) {
  FILE *f = fopen(path, "wb");
  TT_REQUIRE(f != NULL);
  int32_t hdr[256] = {LOOM_SHARD_MAGIC_U16, LOOM_SHARD_VERSION_U16, ntok};
  fwrite(hdr, sizeof hdr, 1, f);
  for (int i = 0; i < ntok; i++) {
    uint16_t t = (uint16_t)((i * 7) % 200);
    fwrite(&t, sizeof t, 1, f);
  }
  TT_REQUIRE(fclose(f) == 0);
}

static void make_data(void) {
  char p[256];
  snprintf(p, sizeof p, "%s/fashion", tmp);
  TT_REQUIRE(mkdir(p, 0700) == 0);
  write_idx(p, "train", 64);
  write_idx(p, "t10k", 16);
  snprintf(p, sizeof p, "%s/text.txt", tmp);
  FILE *f = fopen(p, "wb");
  TT_REQUIRE(f != NULL);
  for (int i = 0; i < 4096; i++)
    fputc("In the beginning God created the heaven and the earth.\n"[i % 55],
          f);
  TT_REQUIRE(fclose(f) == 0);
  snprintf(p, sizeof p, "%s/train.bin", tmp);
  write_shard(p, 2048);
  snprintf(p, sizeof p, "%s/val.bin", tmp);
  write_shard(p, 512);
}

/* ------------------------------------------------------------ base configs */

enum { BASE_MLP, BASE_CNN, BASE_GPT, BASE_BIN, BASE_COUNT };
static const char *const base_names[] = {"mlp", "cnn", "gpt", "gpt on bin"};

/* Small and quick; the walked key is applied last, by --set, so it wins. */
static void base_text(int base, bool ckpt, char *buf, size_t n) {
  static const char *const model[] = {
      "model:\n  name: mlp\n  hidden: [8]\n",
      "model:\n  name: cnn\n  channels: [2, 3]\n",
      "model:\n  name: gpt\n  context: 8\n  layers: 1\n  d_model: 8\n"
      "  heads: 2\n",
      "model:\n  name: gpt\n  context: 8\n  layers: 1\n  d_model: 8\n"
      "  heads: 2\n"};
  /* data section, with the test's paths */
  size_t o = (size_t)snprintf(buf, n, "%s", model[base]);
  if (base == BASE_BIN)
    o += (size_t)snprintf(buf + o, n - o,
                          "data:\n  dataset: bin\n  path: %s/train.bin\n"
                          "  val_path: %s/val.bin\n",
                          tmp, tmp);
  else if (base == BASE_GPT)
    o += (size_t)snprintf(buf + o, n - o,
                          "data:\n  dataset: kjv\n  path: %s/text.txt\n", tmp);
  else
    o += (size_t)snprintf(buf + o, n - o,
                          "data:\n  dataset: fashion-mnist\n"
                          "  path: %s/fashion\n",
                          tmp);
  o += (size_t)snprintf(buf + o, n - o,
                        "train:\n  epochs: 0\n  steps: 2\n  batch_size: 4\n"
                        "  eval_batches: 1\nlog:\n  progress: off\n");
  /* Checkpoints (fsync'd) only for the checkpoint keys: seconds saved. */
  if (!ckpt)
    snprintf(buf + o, n - o, "checkpoint:\n  enabled: false\n");
}

/* Which model and data a key is for: the key's help names them ("gpt:",
 * "cnn:", "kjv:", "bin:"); model.name and data.dataset by their value. */
static int bases_for(const loom_config_key *k, const char *value, int *out) {
  const char *h = k->help;
  if (!strcmp(k->path, "model.name")) {
    out[0] = !strcmp(value, "mlp")   ? BASE_MLP
             : !strcmp(value, "cnn") ? BASE_CNN
                                     : BASE_GPT;
    return 1;
  }
  if (!strcmp(k->path, "data.dataset")) {
    out[0] = !strcmp(value, "fashion-mnist") ? BASE_MLP
             : !strcmp(value, "kjv")         ? BASE_GPT
                                             : BASE_BIN;
    return 1;
  }
  if (!strncmp(h, "mlp, cnn:", 9)) {
    out[0] = BASE_MLP;
    out[1] = BASE_CNN;
    return 2;
  }
  if (!strncmp(h, "cnn:", 4)) {
    out[0] = BASE_CNN;
    return 1;
  }
  if (!strncmp(h, "gpt:", 4) || !strncmp(h, "kjv", 3)) {
    out[0] = BASE_GPT;
    return 1;
  }
  if (!strncmp(h, "bin:", 4)) {
    out[0] = BASE_BIN;
    return 1;
  }
  out[0] = BASE_MLP;
  return 1;
}

/* Values a rule ties to the walked one: without them the case would only
 * show that rule, not the key. */
static const char *companion(const char *key, const char *value) {
  if (!strcmp(key, "optim.nesterov") && !strcmp(value, "true"))
    return "optim.momentum=0.9";
  return NULL;
}

/* ------------------------------------------------------------ the values */

typedef struct values {
  int n;
  char v[8][64];
} values;

static void add(values *vs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void add(values *vs, const char *fmt, ...) {
  if (vs->n == 8)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(vs->v[vs->n], sizeof vs->v[0], fmt, ap);
  va_end(ap);
  for (int i = 0; i < vs->n; i++)
    if (!strcmp(vs->v[i], vs->v[vs->n]))
      return;
  vs->n++;
}

static bool in_range(const loom_config_key *k, double x) {
  bool lo = (k->flags & LOOM_CFG_MIN_OPEN) ? x > k->min : x >= k->min;
  bool hi = (k->flags & LOOM_CFG_MAX_OPEN) ? x < k->max : x <= k->max;
  return lo && hi;
}

/* A representative number in range other than the default: the low end
 * when it is allowed, else half or one more than the default, else the
 * middle of the range. */
static double representative(const loom_config_key *k, bool integer) {
  double def = strtod(k->def, NULL);
  double cands[5] = {k->min, def / 2, def + 1, def - 1,
                     (k->min + (isinf(k->max) ? k->min + 2 : k->max)) / 2};
  for (int i = 0; i < 5; i++) {
    double x = integer ? floor(cands[i]) : cands[i];
    if (in_range(k, x) && x != def)
      return x;
  }
  return def;
}

static void values_of(const loom_config_key *k, values *vs) {
  vs->n = 0;
  switch (k->type) {
  case LOOM_CFG_ENUM:
    for (int i = 0; i < k->n_values; i++)
      add(vs, "%s", k->values[i]);
    break;
  case LOOM_CFG_BOOL:
    add(vs, "true");
    add(vs, "false");
    break;
  case LOOM_CFG_INT:
    add(vs, "%lld", (long long)representative(k, true));
    break;
  case LOOM_CFG_FLOAT:
    add(vs, "%.17g", representative(k, false));
    break;
  case LOOM_CFG_INT_LIST: {
    long long lo = (long long)k->min;
    if (k->list_min == 0)
      add(vs, "[]");
    add(vs, "[%lld]", lo + 2);
    add(vs, "[%lld, %lld, %lld]", lo + 2, lo + 4, lo + 1);
    add(vs, "[%lld, %lld]", lo + 2, lo + 4);
    break;
  }
  case LOOM_CFG_STRING:
    /* Paths: a place of the test's own (the data paths come with the
     * base). */
    if (!strcmp(k->path, "data.path") || !strcmp(k->path, "data.val_path"))
      add(vs, "%s", "");
    else
      add(vs, "%s/elsewhere/%s", tmp, k->path);
    break;
  default:
    TT_CHECK(!"a key type this test does not know: decide its values");
  }
}

/* ------------------------------------------------------------ one case */

/* `loom config check FILE --set...`: exit status and the first line. */
static int cli_check(const char *file, const char *const *sets, int n,
                     char *line, size_t cap) {
  char cmd[4096];
  size_t o = (size_t)snprintf(cmd, sizeof cmd, "'%s' config check '%s'",
                              loom_bin, file);
  for (int i = 0; i < n; i++)
    o += (size_t)snprintf(cmd + o, sizeof cmd - o, " --set '%s'", sets[i]);
  snprintf(cmd + o, sizeof cmd - o, " 2>&1");
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  line[0] = '\0';
  if (!fgets(line, (int)cap, p))
    line[0] = '\0';
  char rest[512];
  while (fgets(rest, sizeof rest, p))
    ;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void run_case(const loom_config_key *k, int base, const char *value,
                     int idx, const char *extra) {
  char text[1024], file[128], set[600], run[600], ckpt[600];
  base_text(base, !strncmp(k->path, "checkpoint.", 11), text, sizeof text);
  snprintf(file, sizeof file, "%s/case.yaml", tmp);
  FILE *f = fopen(file, "w");
  TT_REQUIRE(f != NULL);
  fputs(text, f);
  TT_REQUIRE(fclose(f) == 0);
  /* Each case its own run directory: nothing resumes from another. */
  snprintf(run, sizeof run, "log.run_dir=%s/run%d", tmp, idx);
  snprintf(ckpt, sizeof ckpt, "checkpoint.dir=%s/run%d/ckpt", tmp, idx);
  snprintf(set, sizeof set, "%s=%s", k->path, value);
  int n = 0;
  const char *all[5];
  all[n++] = run;
  all[n++] = ckpt;
  const char *comp = companion(k->path, value);
  if (comp)
    all[n++] = comp;
  if (extra)
    all[n++] = extra;
  all[n++] = set; /* last: the walked key wins over the run paths */
  loom_config cfg;
  loom_status s =
      loom_config_load_string(&cfg, text, strlen(text), file, all, n);
  char what[800];
  snprintf(what, sizeof what, "%s=%s (%s)", k->path, value, base_names[base]);
  if (s != LOOM_OK) {
    /* Rejected: by `loom config check` too, exit 2, naming the key. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    char line[1024];
    int rc = cli_check(file, all, n, line, sizeof line);
    if (s != LOOM_ERR_CONFIG || rc != 2 || !strstr(line, k->path)) {
      tt_fail_prefix(__FILE__, __LINE__);
      fprintf(stderr,
              "%s: rejected, but not as a config error naming the key:\n"
              "  status %s, 'loom config check' exit %d: %s",
              what, loom_status_name(s), rc, line);
      tt_fail_done();
    }
    printf("rejected %s: %s\n", what, msg);
    n_rejected++;
    return;
  }
  /* Accepted: trains for 2 steps (the key's own limits may say fewer). */
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  loom_trainer *t = NULL;
  loom_train_result res;
  memset(&res, 0, sizeof res);
  s = loom_trainer_new(&t, &cfg, &o);
  if (s == LOOM_OK)
    s = loom_trainer_run(t, &res);
  loom_trainer_free(t);
  if (s != LOOM_OK || res.steps < 1) {
    tt_fail_prefix(__FILE__, __LINE__);
    fprintf(stderr,
            "%s: accepted by the config check, then failed at training "
            "start: %s: %s\n",
            what, loom_status_name(s), loom_last_error());
    tt_fail_done();
    return;
  }
  n_trained++;
}

TT_TEST(every_key_honoured_or_rejected) {
  size_t nk;
  const loom_config_key *keys = loom_config_keys(&nk);
  int idx = 0;
  for (size_t i = 0; i < nk; i++) {
    values vs;
    values_of(&keys[i], &vs);
    TT_CHECK(vs.n > 0);
    for (int j = 0; j < vs.n; j++) {
      int bases[BASE_COUNT];
      int nb = bases_for(&keys[i], vs.v[j], bases);
      for (int b = 0; b < nb; b++)
        run_case(&keys[i], bases[b], vs.v[j], idx++, NULL);
    }
  }
  printf("%zu keys, %d cases: %d trained, %d rejected by the check\n", nk, idx,
         n_trained, n_rejected);
  TT_CHECK(n_trained > 0 && n_rejected > 0);
}

/* The defects of issue 10 by name, each either working now or rejected. */
TT_TEST(issue10_regressions) {
  static const struct {
    const char *set;
    int base;
    const char *extra;
    bool trains;
  } cases[] = {
      {"train.precision=bf16", BASE_MLP, NULL, true},
      {"train.precision=bf16", BASE_CNN, NULL, true},
      {"train.precision=f16", BASE_MLP, NULL, true},
      {"train.precision=f16", BASE_CNN, NULL, true},
      {"train.loss_scale=128", BASE_MLP, "train.precision=f16", true},
      {"train.loss_scale=dynamic", BASE_MLP, "train.precision=f16", true},
      {"train.loss_scale_init=1024", BASE_MLP, "train.precision=f16", true},
      {"train.loss_scale=128", BASE_MLP, NULL, false},
      {"log.profile=true", BASE_MLP, NULL, false},
      {"parallel.zero_stage=2", BASE_MLP, NULL, false},
      {"parallel.strategy=zero", BASE_MLP, NULL, false},
      {"model.activation=tanh", BASE_MLP, NULL, false},
      {"train.batch_size=16777216", BASE_MLP, NULL, false},
      {"parallel.deterministic=true", BASE_MLP, "parallel.strategy=none",
       false},
      {"model.hidden=[16, 8]", BASE_MLP, NULL, true},
      {"model.hidden=[]", BASE_MLP, NULL, true},
      {"model.activation=gelu", BASE_MLP, NULL, true},
      {"model.activation=gelu", BASE_CNN, NULL, true},
      {"model.channels=[3]", BASE_CNN, NULL, true},
      {"model.channels=[2, 3, 4]", BASE_CNN, NULL, false}, /* 5x5: 2 fit */
      {"model.channels=[2, 3, 4]", BASE_CNN, "model.kernel=3", true},
  };
  int idx = 1000;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char key[64];
    const char *eq = strchr(cases[i].set, '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - cases[i].set), cases[i].set);
    const loom_config_key *k = loom_config_key_find(key);
    if (!k) { /* a value outside the grammar: the key is still named */
      TT_CHECK(!cases[i].trains);
      continue;
    }
    int before_t = n_trained, before_r = n_rejected;
    run_case(k, cases[i].base, eq + 1, idx++, cases[i].extra);
    if (cases[i].trains)
      TT_CHECK_EQ(n_trained, before_t + 1);
    else
      TT_CHECK_EQ(n_rejected, before_r + 1);
  }
}

/* Trains a base config with extra --set values for 2 steps; the model's
 * parameter count and the final training loss. */
static void train_with(int base, const char *a, const char *b, int64_t *params,
                       double *loss) {
  char text[1024];
  base_text(base, false, text, sizeof text);
  const char *sets[2] = {a, b};
  loom_config cfg;
  *params = -1;
  *loss = NAN;
  TT_REQUIRE_OK(loom_config_load_string(&cfg, text, strlen(text), "m.yaml",
                                        sets, b ? 2 : 1));
  snprintf(cfg.log.run_dir, sizeof cfg.log.run_dir, "%s/honoured", tmp);
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  loom_trainer *t = NULL;
  loom_train_result res;
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  *params = loom_model_num_params(loom_trainer_model(t));
  TT_CHECK_OK(loom_trainer_run(t, &res));
  loom_trainer_free(t);
  *loss = res.train_loss;
}

/* The model options change the model: widths and layers by the parameter
 * count, the activation by the loss (same seed, same data). */
TT_TEST(model_options_are_honoured) {
  int64_t p;
  double relu, gelu;
  train_with(BASE_MLP, "model.hidden=[16, 8]", NULL, &p, &relu);
  TT_CHECK_EQ(p, (784 * 16 + 16) + (16 * 8 + 8) + (8 * 10 + 10));
  train_with(BASE_MLP, "model.hidden=[]", NULL, &p, &relu);
  TT_CHECK_EQ(p, 784 * 10 + 10);
  train_with(BASE_MLP, "model.activation=relu", NULL, &p, &relu);
  train_with(BASE_MLP, "model.activation=gelu", NULL, &p, &gelu);
  TT_CHECK(isfinite(relu) && isfinite(gelu) && relu != gelu);
  /* 28 -> conv3 26 -> pool 13 -> conv3 11 -> pool 5 -> conv3 3 -> pool 1 */
  train_with(BASE_CNN, "model.channels=[2, 3, 4]", "model.kernel=3", &p, &relu);
  TT_CHECK_EQ(p, (2 * 9 + 2) + (3 * 2 * 9 + 3) + (4 * 3 * 9 + 4) +
                     (4 * 1 * 1 * 10 + 10));
  train_with(BASE_CNN, "model.activation=relu", NULL, &p, &relu);
  train_with(BASE_CNN, "model.activation=gelu", NULL, &p, &gelu);
  TT_CHECK(isfinite(relu) && isfinite(gelu) && relu != gelu);
}

/* train.eval_every 0 evaluates at the end of each epoch, as the schema
 * says (issue 10: only at the end). 64 images, batches of 16: 4 steps an
 * epoch, 3 epochs, 3 evaluations. */
TT_TEST(eval_every_zero_is_each_epoch) {
  char text[1024], run[256], ckpt[256];
  base_text(BASE_MLP, false, text, sizeof text);
  snprintf(run, sizeof run, "log.run_dir=%s/epochs", tmp);
  snprintf(ckpt, sizeof ckpt, "checkpoint.enabled=false");
  const char *sets[] = {run,
                        ckpt,
                        "train.epochs=3",
                        "train.steps=0",
                        "train.batch_size=16",
                        "train.eval_every=0",
                        "log.every=1"};
  loom_config cfg;
  TT_REQUIRE_OK(
      loom_config_load_string(&cfg, text, strlen(text), "e.yaml", sets, 7));
  loom_train_opts o = loom_train_opts_default();
  o.quiet = true;
  o.resume = "never";
  loom_trainer *t = NULL;
  loom_train_result res;
  TT_REQUIRE_OK(loom_trainer_new(&t, &cfg, &o));
  TT_CHECK_OK(loom_trainer_run(t, &res));
  loom_trainer_free(t);
  TT_CHECK_EQ(res.steps, 12);
  char path[300], line[4096];
  snprintf(path, sizeof path, "%s/epochs/metrics.jsonl", tmp);
  FILE *f = fopen(path, "r");
  TT_REQUIRE(f != NULL);
  int evals = 0, at[8] = {0};
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"val_loss\""))
      continue;
    const char *st = strstr(line, "\"step\":");
    if (evals < 8 && st)
      at[evals] = atoi(st + 7);
    evals++;
  }
  fclose(f);
  TT_CHECK_EQ(evals, 3);
  TT_CHECK_EQ(at[0], 4);
  TT_CHECK_EQ(at[1], 8);
  TT_CHECK_EQ(at[2], 12);
}

int main(int argc, char **argv) {
  if (argc > 1)
    loom_bin = argv[1];
  snprintf(tmp, sizeof tmp, "/tmp/loom_config_keys.XXXXXX");
  if (!mkdtemp(tmp)) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  make_data();
  TT_RUN(every_key_honoured_or_rejected);
  TT_RUN(issue10_regressions);
  TT_RUN(model_options_are_honoured);
  TT_RUN(eval_every_zero_is_each_epoch);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmp);
  return tt_finish();
}
