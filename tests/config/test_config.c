/* Tests of the config: a table of bad configs with their exact messages,
 * --set overrides, round trips of the canonical text, the hash, the schema
 * (every key has a default in range and help) and the docs generated from
 * it. Argument: the source tree (for examples/ and docs/config.md);
 * `--write-docs SRC` regenerates the table in docs/config.md instead. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/config.h"
#include "tt.h"

static const char *src_dir = ".";

/* Loads text as "t.yaml" with the given --set list; expects
 * LOOM_ERR_CONFIG with exactly `msg`. */
static void expect_err_impl(int line, const char *text, const char *const *sets,
                            int n_sets, const char *msg) {
  loom_config cfg, before;
  loom_config_defaults(&cfg);
  before = cfg;
  loom_status s =
      loom_config_load_string(&cfg, text, strlen(text), "t.yaml", sets, n_sets);
  if (s != LOOM_ERR_CONFIG || strcmp(loom_last_error(), msg) != 0) {
    tt_fail_prefix(__FILE__, line);
    fprintf(stderr, "status %s\n  got      '%s'\n  expected '%s'\n",
            loom_status_name(s), loom_last_error(), msg);
    tt_fail_done();
  }
  /* Nothing is written on error. */
  if (memcmp(&cfg, &before, sizeof cfg) != 0) {
    tt_fail_prefix(__FILE__, line);
    fprintf(stderr, "config changed by a failed load\n");
    tt_fail_done();
  }
}
#define EXPECT_ERR(text, msg) expect_err_impl(__LINE__, text, NULL, 0, msg)
#define EXPECT_SET_ERR(text, set, msg)                                         \
  do {                                                                         \
    const char *sets_[] = {set};                                               \
    expect_err_impl(__LINE__, text, sets_, 1, msg);                            \
  } while (0)

static const char *GPT = "model:\n  name: gpt\ndata:\n  dataset: kjv\n";

TT_TEST(test_bad_configs) {
  /* Unknown keys and sections, with suggestions. */
  EXPECT_ERR("optim:\n  lrr: 0.1\n",
             "t.yaml:2:3: key 'optim.lrr': unknown key (did you mean "
             "'optim.lr'?)");
  EXPECT_ERR("train:\n  lr: 0.1\n",
             "t.yaml:2:3: key 'train.lr': unknown key (did you mean "
             "'optim.lr'?)");
  EXPECT_ERR("optim:\n  lr: 0.1\n  mommentum: 0.9\n",
             "t.yaml:3:3: key 'optim.mommentum': unknown key (did you mean "
             "'optim.momentum'?)");
  EXPECT_ERR("optim:\n  learning_rate_warmup: 3\n",
             "t.yaml:2:3: key 'optim.learning_rate_warmup': unknown key (see "
             "'loom config schema')");
  EXPECT_ERR("optm:\n  lr: 0.1\n",
             "t.yaml:1:1: key 'optm': unknown section (did you mean "
             "'optim'?)");
  EXPECT_ERR("training:\n  steps: 3\n",
             "t.yaml:1:1: key 'training': unknown section (did you mean "
             "'train'?)");
  EXPECT_ERR("model:\n  name: mlp\nzzz: 1\n",
             "t.yaml:3:1: key 'zzz': unknown section (sections: model, data, "
             "optim, schedule, train, checkpoint, log, parallel)");
  EXPECT_ERR("optim.lr: 0.1\n",
             "t.yaml:1:1: key 'optim.lr': dotted keys belong on the command "
             "line (--set); in a file, write the key inside its section");
  /* Wrong types. */
  EXPECT_ERR("train:\n  batch_size: 12.5\n",
             "t.yaml:2:15: key 'train.batch_size': expected an integer or "
             "auto, got '12.5'");
  EXPECT_ERR("train:\n  steps: 1e5\n",
             "t.yaml:2:10: key 'train.steps': expected an integer, got "
             "'1e5'");
  EXPECT_ERR("train:\n  epochs: \"5\"\n",
             "t.yaml:2:11: key 'train.epochs': expected an integer, got the "
             "quoted string \"5\"");
  EXPECT_ERR("optim:\n  lr: fast\n",
             "t.yaml:2:7: key 'optim.lr': expected a number, got 'fast'");
  EXPECT_ERR("optim:\n  lr: .nan\n",
             "t.yaml:2:7: key 'optim.lr': expected a number, got '.nan'");
  EXPECT_ERR("optim:\n  lr: [0.1]\n",
             "t.yaml:2:7: key 'optim.lr': expected a number, got a list");
  EXPECT_ERR("data:\n  shuffle: yes\n",
             "t.yaml:2:12: key 'data.shuffle': expected true or false, got "
             "'yes'");
  EXPECT_ERR("data:\n  path: {a: 1}\n",
             "t.yaml:2:9: key 'data.path': expected a string, got a mapping");
  EXPECT_ERR("optim:\n  name: adam\n",
             "t.yaml:2:9: key 'optim.name': expected one of sgd, adamw, got "
             "'adam' (did you mean 'adamw'?)");
  EXPECT_ERR("log:\n  progress: fancy\n",
             "t.yaml:2:13: key 'log.progress': expected one of auto, bar, "
             "lines, off, got 'fancy'");
  EXPECT_ERR("model:\n  hidden: {a: 1}\n",
             "t.yaml:2:11: key 'model.hidden': expected a list of integers, "
             "got a mapping");
  EXPECT_ERR("model:\n  hidden: [512, [1]]\n",
             "t.yaml:2:17: key 'model.hidden': item 2: expected an integer, "
             "got a list");
  /* Out of range. */
  EXPECT_ERR("optim:\n  momentum: 1.5\n",
             "t.yaml:2:13: key 'optim.momentum': 1.5 is out of range (must be "
             "in [0, 1))");
  EXPECT_ERR("optim:\n  lr: 0\n",
             "t.yaml:2:7: key 'optim.lr': 0 is out of range (must be in (0, "
             "1000])");
  /* Nonzero but below the smallest normal f32: the f32 arithmetic would
   * take it as 0 (1e-46 as optim.eps made a run NaN at step 2). */
  EXPECT_ERR("optim:\n  eps: 1e-46\n",
             "t.yaml:2:8: key 'optim.eps': 1e-46 is too small for the f32 "
             "arithmetic it feeds, which would take it as 0 or a subnormal "
             "(nonzero values must be at least 1.17549e-38)");
  EXPECT_ERR("optim:\n  grad_clip: 1e-40\n",
             "t.yaml:2:14: key 'optim.grad_clip': 1e-40 is too small for the "
             "f32 arithmetic it feeds, which would take it as 0 or a "
             "subnormal (nonzero values must be at least 1.17549e-38)");
  {
    loom_config ok;
    loom_config_defaults(&ok);
    const char *t = "optim:\n  grad_clip: 0\n  lr: 1.2e-38\n";
    TT_CHECK_OK(loom_config_load_string(&ok, t, strlen(t), "t.yaml", NULL, 0));
  }
  EXPECT_ERR("train:\n  steps: -5\n",
             "t.yaml:2:10: key 'train.steps': -5 is out of range (must be >= "
             "0)");
  EXPECT_ERR("train:\n  steps: 99999999999999999999\n",
             "t.yaml:2:10: key 'train.steps': 99999999999999999999 is out of "
             "range (must be >= 0)");
  EXPECT_ERR("model:\n  hidden: [512, 0]\n",
             "t.yaml:2:17: key 'model.hidden': item 2: 0 is out of range "
             "(must be in [1, 1048576])");
  EXPECT_ERR("model:\n  hidden: [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]\n",
             "t.yaml:2:11: key 'model.hidden': at most 16 items, got 17");
  EXPECT_ERR("model:\n  name: cnn\n  channels: []\n",
             "t.yaml:3:13: key 'model.channels': at least 1 item, got 0");
  EXPECT_ERR("optim:\n  lr:\n", "t.yaml:2:6: key 'optim.lr': missing value");
  EXPECT_ERR("optim:\n  lr: ~\n", "t.yaml:2:7: key 'optim.lr': missing value");
  /* Structure. */
  EXPECT_ERR("optim:\n  lr: 0.1\n  lr: 0.2\n",
             "t.yaml:3:3: key 'optim.lr': duplicate key (first at line 2)");
  EXPECT_ERR("optim:\n  lr: 0.1\noptim:\n  lr: 0.2\n",
             "t.yaml:3:1: key 'optim': duplicate section (first at line 1)");
  EXPECT_ERR("optim: 0.1\n",
             "t.yaml:1:8: key 'optim': expected a mapping of keys, got a "
             "scalar");
  EXPECT_ERR("- a\n- b\n",
             "t.yaml:1:1: expected a mapping of sections (model, data, optim, "
             "schedule, train, checkpoint, log, parallel), got a list");
  EXPECT_ERR("optim:\n  lr: 0.1\n---\nx: 1\n",
             "t.yaml:4:1: a second YAML document; a config holds one");
  /* YAML syntax. */
  EXPECT_ERR("optim:\n  lr: [0.1\n",
             "t.yaml:3:1: YAML syntax error: did not find expected ',' or ']' "
             "(while parsing a flow sequence)");
  EXPECT_ERR("optim:\n\tlr: 0.1\n",
             "t.yaml:2:1: YAML syntax error: found character that cannot "
             "start any token (while scanning for the next token)");
  EXPECT_ERR("optim:\n  lr: 0.1\n   momentum: 0.9\n",
             "t.yaml:3:12: YAML syntax error: mapping values are not allowed "
             "in this context");
  EXPECT_ERR("optim:\n  lr: \xff\n",
             "t.yaml:2:7: YAML syntax error: invalid leading UTF-8 octet");
  /* Rules between keys. */
  EXPECT_ERR("model:\n  name: gpt\n",
             "t.yaml:2:3: key 'model.name': model 'gpt' needs a token data "
             "set (data.dataset kjv or bin), but data.dataset is "
             "'fashion-mnist'");
  EXPECT_ERR("data:\n  dataset: kjv\n",
             "t.yaml: key 'model.name': model 'mlp' needs images "
             "(data.dataset fashion-mnist), but data.dataset is 'kjv'");
  EXPECT_ERR("model:\n  name: gpt\n  heads: 5\ndata:\n  dataset: kjv\n",
             "t.yaml:3:3: key 'model.heads': 5 does not divide model.d_model "
             "(128)");
  EXPECT_ERR("model:\n  name: gpt\n  vocab: 100\ndata:\n  dataset: kjv\n",
             "t.yaml:3:3: key 'model.vocab': data set kjv has 256 byte "
             "values, so model.vocab must be at least 256, got 100");
  EXPECT_ERR("model:\n  name: gpt\ndata:\n  dataset: bin\n",
             "t.yaml:4:3: key 'data.dataset': 'bin' needs data.path and "
             "data.val_path (the training and validation .bin files)");
  EXPECT_ERR("train:\n  epochs: 0\n",
             "t.yaml:2:3: key 'train.epochs': train.epochs and train.steps "
             "are both 0: set one of them");
  EXPECT_ERR("optim:\n  nesterov: true\n",
             "t.yaml:2:3: key 'optim.nesterov': needs optim.momentum > 0");
  EXPECT_ERR("optim:\n  lr: 0.1\nschedule:\n  name: cosine\n  min_lr: 0.5\n",
             "t.yaml:5:3: key 'schedule.min_lr': larger than optim.lr");
  /* A string longer than the field. */
  char longtext[1200];
  int n = snprintf(longtext, sizeof longtext, "data:\n  path: ");
  memset(longtext + n, 'a', 600);
  snprintf(longtext + n + 600, sizeof longtext - (size_t)n - 600, "\n");
  EXPECT_ERR(longtext, "t.yaml:2:9: key 'data.path': longer than 511 bytes");
}

TT_TEST(test_set_errors) {
  EXPECT_SET_ERR("", "optim.lrr=0.1",
                 "--set optim.lrr=0.1: key 'optim.lrr': unknown key (did you "
                 "mean 'optim.lr'?)");
  EXPECT_SET_ERR("", "optim.lr", "--set optim.lr: expected section.key=value");
  EXPECT_SET_ERR("", "=3", "--set =3: expected section.key=value");
  EXPECT_SET_ERR("", "optim.lr=abc",
                 "--set optim.lr=abc: key 'optim.lr': expected a number, got "
                 "'abc'");
  EXPECT_SET_ERR("",
                 "optim.lr=", "--set optim.lr=: key 'optim.lr': missing value");
  EXPECT_SET_ERR("", "optim=1",
                 "--set optim=1: key 'optim': a section, not a key: write "
                 "optim.KEY=VALUE");
  EXPECT_SET_ERR("", "train.batch_size=0",
                 "--set train.batch_size=0: key 'train.batch_size': 0 is out "
                 "of range (must be in [1, 16777216])");
  EXPECT_SET_ERR("", "model.hidden=[1,2",
                 "--set model.hidden=[1,2: key 'model.hidden': YAML syntax "
                 "error: did not find expected ',' or ']' (while parsing a "
                 "flow sequence)");
  EXPECT_SET_ERR("", "model.hidden=[1, -2]",
                 "--set model.hidden=[1, -2]: key 'model.hidden': item 2: -2 "
                 "is out of range (must be in [1, 1048576])");
  EXPECT_SET_ERR("", "optim.name=Adam",
                 "--set optim.name=Adam: key 'optim.name': expected one of "
                 "sgd, adamw, got 'Adam' (did you mean 'adamw'?)");
  /* A rule broken by an override is reported against the override. */
  EXPECT_SET_ERR(GPT, "model.heads=5",
                 "--set model.heads=5: key 'model.heads': 5 does not divide "
                 "model.d_model (128)");
  /* A key of another model, data set, optimizer or schedule would change
   * nothing: refused unless it holds its default (which `loom config show`
   * lists for every key, so its output loads). */
  EXPECT_ERR("optim:\n  name: adamw\n  momentum: 0.9\n",
             "t.yaml:3:3: key 'optim.momentum': applies to optim.name sgd "
             "only, and optim.name is 'adamw': 0.9 would change nothing; it "
             "supports only its default (0) here (remove it, or set "
             "optim.name: sgd)");
  EXPECT_SET_ERR(GPT, "schedule.min_lr=1e-5",
                 "--set schedule.min_lr=1e-5: key 'schedule.min_lr': applies "
                 "to schedule.name cosine or linear only, and schedule.name "
                 "is 'constant': 1e-05 would change nothing; it supports only "
                 "its default (0) here (remove it, or set schedule.name: "
                 "cosine or linear)");
  EXPECT_SET_ERR("", "schedule.gamma=0.5",
                 "--set schedule.gamma=0.5: key 'schedule.gamma': applies to "
                 "schedule.name step only, and schedule.name is 'constant': "
                 "0.5 would change nothing; it supports only its default "
                 "(0.1) here (remove it, or set schedule.name: step)");
  EXPECT_SET_ERR("", "model.heads=8",
                 "--set model.heads=8: key 'model.heads': applies to "
                 "model.name gpt only, and model.name is 'mlp': 8 would "
                 "change nothing; it supports only its default (4) here "
                 "(remove it, or set model.name: gpt)");
  EXPECT_SET_ERR(GPT, "model.hidden=[64]",
                 "--set model.hidden=[64]: key 'model.hidden': applies to "
                 "model.name mlp only, and model.name is 'gpt': [64] would "
                 "change nothing; it supports only its default ([512, 512]) "
                 "here (remove it, or set model.name: mlp)");
  EXPECT_SET_ERR("", "data.val_fraction=0.2",
                 "--set data.val_fraction=0.2: key 'data.val_fraction': "
                 "applies to data.dataset kjv only, and data.dataset is "
                 "'fashion-mnist': 0.2 would change nothing; it supports only "
                 "its default (0.1) here (remove it, or set data.dataset: "
                 "kjv)");
  /* MLflow's names without a server: MLflow itself would log to ./mlruns,
   * loom logs nothing. */
  EXPECT_SET_ERR("", "log.mlflow.experiment=exp1",
                 "--set log.mlflow.experiment=exp1: key "
                 "'log.mlflow.experiment': applies to MLflow logging only, "
                 "and log.mlflow.uri is empty: \"exp1\" would change nothing; "
                 "it supports only its default (\"loom\") here (remove it, or "
                 "set log.mlflow.uri to the tracking server)");
  EXPECT_SET_ERR("", "log.mlflow.run_name=r1",
                 "--set log.mlflow.run_name=r1: key 'log.mlflow.run_name': "
                 "applies to MLflow logging only, and log.mlflow.uri is "
                 "empty: \"r1\" would change nothing; it supports only its "
                 "default (\"\") here (remove it, or set log.mlflow.uri to "
                 "the tracking server)");
  /* The trace's window and cap without a trace (LOOM_TRACE=DIR alone
   * traces with their defaults). */
  EXPECT_SET_ERR("", "log.trace_steps=20",
                 "--set log.trace_steps=20: key 'log.trace_steps': applies "
                 "to a trace (log.trace true) only, and log.trace is false: "
                 "20 would change nothing; it supports only its default (0) "
                 "here (remove it, or set log.trace: true, which "
                 "LOOM_TRACE=DIR needs too for this key)");
  EXPECT_SET_ERR("log:\n  trace: true\n  trace_steps: 10\n",
                 "log.trace_every=10",
                 "--set log.trace_every=10: key 'log.trace_every': 10 is not "
                 "more than log.trace_steps (10): the window would never "
                 "close; supported: log.trace_every > log.trace_steps (or 0: "
                 "once)");
  /* A pipeline's cut with a model that has no pipeline. */
  EXPECT_SET_ERR("", "parallel.pp_split=[1, 2]",
                 "--set parallel.pp_split=[1, 2]: key 'parallel.pp_split': "
                 "cuts a pipeline's units (model gpt); model 'mlp' has no "
                 "pipeline: it supports [] (the default)");
  /* The default, and a key of the choice made, pass. */
  {
    loom_config c;
    loom_config_defaults(&c);
    const char *ok[] = {"optim.beta2=0.999", "schedule.name=step",
                        "schedule.gamma=0.5", "optim.momentum=0.9"};
    TT_CHECK_OK(loom_config_load_string(&c, "", 0, "t.yaml", ok, 4));
    TT_CHECK(c.schedule.gamma == 0.5);
  }
  /* An error in the file comes before any --set. */
  EXPECT_SET_ERR("optim:\n  lr: x\n", "optim.lr=0.1",
                 "t.yaml:2:7: key 'optim.lr': expected a number, got 'x'");
}

/* Issue 10: every key is honoured or rejected at check time, never
 * accepted and then ignored or failed at training start. */
TT_TEST(test_not_implemented_and_sizes) {
  /* bf16 for every model (docs/precision.md), an error where parameters
   * are gathered unit by unit */
  {
    const char *cnn = "model:\n  name: cnn\ntrain:\n  precision: bf16\n";
    loom_config cfg;
    loom_config_defaults(&cfg);
    TT_CHECK_OK(
        loom_config_load_string(&cfg, cnn, strlen(cnn), "t.yaml", NULL, 0));
    TT_CHECK_EQ(cfg.train.precision, LOOM_CFG_PRECISION_BF16);
  }
  /* f16 and its loss scaling (docs/precision.md) */
  {
    loom_config cfg;
    loom_loss_scale_mode mode;
    double scale;
    static const struct {
      const char *text;
      loom_loss_scale_mode mode;
      double scale;
    } ls[] = {
        {"train:\n  precision: f16\n", LOOM_LOSS_SCALE_DYNAMIC, 65536},
        {"train:\n  precision: f16\n  loss_scale: dynamic\n  "
         "loss_scale_init: 1024\n  loss_scale_growth_interval: 7\n",
         LOOM_LOSS_SCALE_DYNAMIC, 1024},
        {"train:\n  precision: f16\n  loss_scale: 128\n",
         LOOM_LOSS_SCALE_STATIC, 128},
        {"train:\n  precision: f16\n  loss_scale: 0\n", LOOM_LOSS_SCALE_NONE,
         1},
        {"train:\n  precision: bf16\n", LOOM_LOSS_SCALE_NONE, 1},
        {"train:\n  loss_scale: 0\n", LOOM_LOSS_SCALE_NONE, 1},
    };
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
      TT_CHECK_OK(loom_config_load_string(&cfg, ls[i].text, strlen(ls[i].text),
                                          "t.yaml", NULL, 0));
      TT_CHECK_OK(loom_config_loss_scale(&cfg, &mode, &scale));
      TT_CHECK_EQ(mode, ls[i].mode);
      TT_CHECK(scale == ls[i].scale);
    }
    TT_CHECK_EQ(loom_config_loss_scale(&cfg, NULL, NULL), LOOM_ERR_INVALID_ARG);
    TT_CHECK_EQ(loom_config_loss_scale(NULL, &mode, &scale),
                LOOM_ERR_INVALID_ARG);
    TT_CHECK_EQ(cfg.train.precision, LOOM_CFG_PRECISION_F32);
  }
  EXPECT_ERR("train:\n  loss_scale: 128\n",
             "t.yaml:2:3: key 'train.loss_scale': '128' is for "
             "train.precision f16; precision 'f32' has f32's exponent range "
             "and needs no loss scaling: it supports auto or 0");
  EXPECT_ERR("train:\n  precision: bf16\n  loss_scale: dynamic\n",
             "t.yaml:3:3: key 'train.loss_scale': 'dynamic' is for "
             "train.precision f16; precision 'bf16' has f32's exponent range "
             "and needs no loss scaling: it supports auto or 0");
  EXPECT_ERR("train:\n  precision: f16\n  loss_scale: lots\n",
             "t.yaml:3:3: key 'train.loss_scale': 'lots': expected auto, "
             "dynamic, a number from 1.17549e-38 to 1e38 (a static scale; "
             "the smallest normal f32 at least, whose reciprocal unscales "
             "the gradients) or 0 (none)");
  EXPECT_ERR("train:\n  precision: f16\n  loss_scale: -1\n",
             "t.yaml:3:3: key 'train.loss_scale': '-1': expected auto, "
             "dynamic, a number from 1.17549e-38 to 1e38 (a static scale; "
             "the smallest normal f32 at least, whose reciprocal unscales "
             "the gradients) or 0 (none)");
  EXPECT_ERR("train:\n  precision: f16\n  loss_scale: 64\n  "
             "loss_scale_init: 8\n",
             "t.yaml:4:3: key 'train.loss_scale_init': is for dynamic loss "
             "scaling (train.loss_scale dynamic, or auto with train.precision "
             "f16); here loss scaling is static");
  EXPECT_ERR("train:\n  loss_scale_growth_interval: 10\n",
             "t.yaml:2:3: key 'train.loss_scale_growth_interval': is for "
             "dynamic loss scaling (train.loss_scale dynamic, or auto with "
             "train.precision f16); here loss scaling is off");
  EXPECT_ERR("train:\n  loss_scale_init: 0\n",
             "t.yaml:2:20: key 'train.loss_scale_init': 0 is out of range "
             "(must be in [1.1754943508222875e-38, 1e+38])");
  /* below the smallest normal f32 (it would unscale by an inf, or be
   * stored as 0): refused here, not at the first step */
  EXPECT_ERR("train:\n  precision: f16\n  loss_scale_init: 1e-45\n",
             "t.yaml:3:20: key 'train.loss_scale_init': 1e-45 is out of "
             "range (must be in [1.1754943508222875e-38, 1e+38])");
  EXPECT_ERR("train:\n  precision: f16\n  loss_scale: 1e-50\n",
             "t.yaml:3:3: key 'train.loss_scale': '1e-50': expected auto, "
             "dynamic, a number from 1.17549e-38 to 1e38 (a static scale; "
             "the smallest normal f32 at least, whose reciprocal unscales "
             "the gradients) or 0 (none)");
  /* a pipeline schedule without a pipeline; the default stays accepted
   * (a run's resolved config.yaml lists every key) */
  EXPECT_ERR("parallel:\n  pp_schedule: gpipe\n",
             "t.yaml:2:3: key 'parallel.pp_schedule': 'gpipe' orders the "
             "micro-batches of a pipeline; with parallel.pp 1 there is none "
             "(micro-batches on one stage run one after another, each "
             "forward then its backward): supported here: 1f1b (the "
             "default), or parallel.pp > 1");
  {
    static const char ok_text[] =
        "train:\n  batch_size: 8\nparallel:\n  pp_schedule: 1f1b\n  "
        "micro_batches: 2\n";
    loom_config ok_cfg;
    loom_config_defaults(&ok_cfg);
    TT_CHECK_OK(loom_config_load_string(&ok_cfg, ok_text, strlen(ok_text),
                                        "t.yaml", NULL, 0));
  }
  EXPECT_ERR("log:\n  profile: true\n",
             "t.yaml:2:3: key 'log.profile': true is not implemented yet; "
             "supported: false (it is called log.trace: set log.trace: "
             "true)");
  EXPECT_ERR("parallel:\n  strategy: zero\n",
             "t.yaml:2:13: key 'parallel.strategy': expected one of auto, "
             "none, ddp, zero1, zero2, zero3, fsdp, got 'zero' (did you mean "
             "'zero1'?)");
  EXPECT_ERR("parallel:\n  zero_stage: 1\n",
             "t.yaml:2:3: key 'parallel.zero_stage': unknown key (see 'loom "
             "config schema')");
  EXPECT_ERR("model:\n  activation: tanh\n",
             "t.yaml:2:15: key 'model.activation': expected one of relu, gelu, "
             "got 'tanh'");
  /* The defaults of those keys are fine written out. */
  loom_config cfg;
  const char *defaults = "train:\n  precision: f32\n  loss_scale: 0\nlog:\n"
                         "  profile: false\nparallel:\n  strategy: zero1\n";
  TT_CHECK_OK(loom_config_load_string(&cfg, defaults, strlen(defaults),
                                      "t.yaml", NULL, 0));
  /* The model options that used to fail at training start. */
  const char *mlp = "model:\n  hidden: [64, 16, 8]\n  activation: gelu\n";
  TT_CHECK_OK(
      loom_config_load_string(&cfg, mlp, strlen(mlp), "t.yaml", NULL, 0));
  const char *lin = "model:\n  hidden: []\n";
  TT_CHECK_OK(
      loom_config_load_string(&cfg, lin, strlen(lin), "t.yaml", NULL, 0));
  TT_CHECK_EQ(cfg.model.hidden.n, 0);
  const char *cnn = "model:\n  name: cnn\n  channels: [4, 8, 16]\n"
                    "  kernel: 3\n  activation: gelu\n";
  TT_CHECK_OK(
      loom_config_load_string(&cfg, cnn, strlen(cnn), "t.yaml", NULL, 0));
  EXPECT_ERR("model:\n  name: cnn\n  channels: [4, 8, 16]\n",
             "t.yaml:3:3: key 'model.channels': 3 convs of kernel 5 with "
             "max-pool 2 do not fit a 28x28 image: conv 3 has nothing left to "
             "pool (use fewer convs, a smaller model.kernel or model.pool)");
  /* Sizes beyond a kernel's int range (issue 10: 16777216 allocated 6.8 GB
   * before failing). */
  EXPECT_ERR("train:\n  batch_size: 16777216\n",
             "t.yaml:2:3: key 'train.batch_size': the input batch would hold "
             "13153337344 elements (train.batch_size 16777216), more than a "
             "kernel can index (2^31 - 1); use a smaller size");
  EXPECT_ERR("model:\n  hidden: [1048576, 1048576]\n",
             "t.yaml:2:3: key 'model.hidden': a weight matrix would hold "
             "1099511627776 elements (train.batch_size 32), more than a kernel "
             "can index (2^31 - 1); use a smaller size");
  EXPECT_ERR(
      "model:\n  name: gpt\n  context: 65536\ndata:\n  dataset: kjv\n",
      "t.yaml:3:3: key 'model.context': a block's attention scores "
      "would hold 549755813888 elements (train.batch_size 32, "
      "model.context 65536, model.d_model 128, model.layers 4, model.vocab "
      "256), more "
      "than a kernel can index (2^31 - 1); use a smaller size");
  EXPECT_ERR("model:\n  name: gpt\n  context: 1024\n  d_model: 1024\n"
             "  layers: 64\ndata:\n  dataset: kjv\n",
             "t.yaml:3:3: key 'model.context': a micro-batch needs about 434.4 "
             "GiB of activations (train.batch_size 32, model.context 1024, "
             "model.d_model 1024, model.layers 64, model.vocab 256), more than "
             "the limit of 64 GiB; use a smaller size (or train.accumulate)");
  /* Rules that used to fail only at training start. */
  EXPECT_ERR("parallel:\n  deterministic: true\n  strategy: none\n",
             "t.yaml:2:3: key 'parallel.deterministic': needs a "
             "data-parallel parallel.strategy: auto, ddp, zero1, zero2, zero3 "
             "or fsdp (got 'none')");
  /* strategy none reduces nothing: compression and replicas refused */
  EXPECT_ERR("parallel:\n  strategy: none\n  compress: bf16\n",
             "t.yaml:3:3: key 'parallel.compress': 'bf16' with "
             "parallel.strategy none: no gradient is reduced to compress; it "
             "supports none (or choose a data-parallel strategy)");
  EXPECT_ERR("parallel:\n  strategy: none\n  dp: 2\n",
             "t.yaml:3:3: key 'parallel.dp': 2 replicas with "
             "parallel.strategy none, which has no data parallelism: it "
             "supports auto or 1 (or choose a data-parallel strategy)");
  EXPECT_ERR("parallel:\n  deterministic: true\n  compress: bf16\n",
             "t.yaml:3:3: key 'parallel.compress': 'bf16' with "
             "parallel.deterministic: deterministic mode sums the gradients "
             "in f32 in a fixed tree; it supports none");
  /* keys nothing would read: refused, never ignored */
  EXPECT_ERR("parallel:\n  virtual_shards: 4\n",
             "t.yaml:2:3: key 'parallel.virtual_shards': 4 without "
             "parallel.deterministic: only deterministic mode cuts the batch "
             "into virtual shards; it supports the default 8 here (or set "
             "parallel.deterministic: true)");
  EXPECT_ERR("parallel:\n  strategy: none\n  bucket_mb: 5\n",
             "t.yaml:3:3: key 'parallel.bucket_mb': 5 with parallel.strategy "
             "none: no gradient is reduced, so there are no buckets; it "
             "supports the default (25) (or choose a data-parallel strategy)");
  EXPECT_ERR("parallel:\n  strategy: none\n  first_bucket_mb: 3\n",
             "t.yaml:3:3: key 'parallel.first_bucket_mb': 3 with "
             "parallel.strategy none: no gradient is reduced, so there are no "
             "buckets; it supports the default (1) (or choose a data-parallel "
             "strategy)");
  EXPECT_ERR("parallel:\n  deterministic: true\n  virtual_shards: 6\n",
             "t.yaml:3:3: key 'parallel.virtual_shards': 6 is not a power of "
             "two (parallel.deterministic sums the shards in a binary tree)");
  EXPECT_ERR("train:\n  steps: 10\nschedule:\n  name: cosine\n"
             "  warmup_steps: 10\n",
             "t.yaml:5:3: key 'schedule.warmup_steps': 10 is not below "
             "train.steps (10): schedule cosine has nothing left to decay");
}

/* Issue 10, section 6: 40,000 levels took 12 s in libyaml; the depth is
 * capped before the document is built, in files and in --set values. */
TT_TEST(test_depth_cap) {
  enum { DEEP = 40000 };
  size_t cap = 2 * DEEP + 64;
  char *text = malloc(cap);
  TT_REQUIRE(text != NULL);
  size_t o = (size_t)snprintf(text, cap, "model:\n  hidden: ");
  for (int i = 0; i < DEEP; i++)
    text[o++] = '[';
  for (int i = 0; i < DEEP; i++)
    text[o++] = ']';
  text[o++] = '\n';
  loom_config cfg;
  loom_status s = loom_config_load_string(&cfg, text, o, "t.yaml", NULL, 0);
  TT_CHECK_EQ(s, LOOM_ERR_CONFIG);
  TT_CHECK(strcmp(loom_last_error(),
                  "t.yaml:2:73: key 'model.hidden': nested more than 64 levels "
                  "deep; a config needs 3 (section, key, list)") == 0);
  /* Block mappings nest too. */
  o = (size_t)snprintf(text, cap, "model:\n");
  for (int i = 1; i < 100; i++)
    o += (size_t)snprintf(text + o, cap - o, "%*sk%d:\n", i + 1, "", i);
  s = loom_config_load_string(&cfg, text, o, "t.yaml", NULL, 0);
  TT_CHECK_EQ(s, LOOM_ERR_CONFIG);
  TT_CHECK(strstr(loom_last_error(), "t.yaml:65:") == loom_last_error());
  TT_CHECK(strstr(loom_last_error(), "key 'model.k1': nested more than 64") !=
           NULL);
  free(text);
  char set[256] = "model.hidden=";
  o = strlen(set);
  for (int i = 0; i < 70; i++)
    set[o++] = '[';
  for (int i = 0; i < 70; i++)
    set[o++] = ']';
  set[o] = '\0';
  const char *sets[] = {set};
  s = loom_config_load_string(&cfg, "", 0, "t.yaml", sets, 1);
  TT_CHECK_EQ(s, LOOM_ERR_CONFIG);
  TT_CHECK(strstr(loom_last_error(), "key 'model.hidden': nested more than") !=
           NULL);
}

TT_TEST(test_missing_file) {
  loom_config cfg;
  loom_config_defaults(&cfg);
  TT_CHECK_EQ(loom_config_load(&cfg, "/nonexistent/x.yaml", NULL, 0),
              LOOM_ERR_CONFIG);
  TT_CHECK_STR(loom_last_error(),
               "/nonexistent/x.yaml: cannot open config: No such file or "
               "directory");
  TT_CHECK_EQ(loom_config_load(&cfg, "/", NULL, 0), LOOM_ERR_CONFIG);
  TT_CHECK_STR(loom_last_error(), "/: cannot read config: Is a directory");
}

TT_TEST(test_good_config_and_sets) {
  const char *text = "# a comment\n"
                     "model:\n"
                     "  name: gpt\n"
                     "  context: 64   # T\n"
                     "  heads: 8\n"
                     "data:\n"
                     "  dataset: kjv\n"
                     "  path: \"/data/kjv.txt\"\n"
                     "optim:\n"
                     "  name: adamw\n"
                     "  lr: 3.0e-4\n"
                     "  eps: 1e-8\n"
                     "train:\n"
                     "  epochs: 0\n"
                     "  steps: 1_000\n"
                     "schedule:\n" /* an empty section */
                     "log:\n"
                     "  progress: off\n";
  const char *sets[] = {"optim.lr=0.001",      "model.layers=2",
                        "data.path=/x y/z: w", "optim.lr=0.002",
                        "model.mlp_ratio=2",   "checkpoint.keep=0"};
  loom_config cfg;
  loom_config_defaults(&cfg);
  TT_REQUIRE_OK(loom_config_load_string(&cfg, text, strlen(text),
                                        "runs/../exp/gpt.yml", sets, 6));
  TT_CHECK_EQ(cfg.model.name, LOOM_CFG_MODEL_GPT);
  TT_CHECK_EQ(cfg.model.context, 64);
  TT_CHECK_EQ(cfg.model.heads, 8);
  TT_CHECK_EQ(cfg.model.layers, 2);
  TT_CHECK_EQ(cfg.model.d_model, 128); /* default */
  TT_CHECK_EQ(cfg.model.mlp_ratio, 2);
  TT_CHECK_EQ(cfg.data.dataset, LOOM_CFG_DATASET_KJV);
  TT_CHECK_STR(cfg.data.path, "/x y/z: w"); /* strings from --set verbatim */
  TT_CHECK_EQ(cfg.optim.name, LOOM_OPTIM_ADAMW);
  TT_CHECK(cfg.optim.lr == 0.002); /* the last --set wins */
  TT_CHECK(cfg.optim.eps == 1e-8);
  TT_CHECK_EQ(cfg.train.steps, 1000);
  TT_CHECK_EQ(cfg.train.epochs, 0);
  TT_CHECK_EQ(cfg.log.progress, LOOM_PROGRESS_OFF);
  TT_CHECK_EQ(cfg.checkpoint.keep, 0);
  TT_CHECK_EQ(cfg.schedule.name, LOOM_SCHED_CONSTANT);
  /* Paths left empty are resolved from the file name. */
  TT_CHECK_STR(cfg.log.run_dir, "runs/gpt");
  TT_CHECK_STR(cfg.checkpoint.dir, "runs/gpt/ckpt");
  /* loom_config_set: one override, checked, nothing changed on error. */
  TT_CHECK_OK(loom_config_set(&cfg, "parallel.bucket_mb=0.5"));
  TT_CHECK(cfg.parallel.bucket_mb == 0.5);
  loom_config copy = cfg;
  TT_CHECK_EQ(loom_config_set(&cfg, "parallel.bucket_mb=0"), LOOM_ERR_CONFIG);
  TT_CHECK(memcmp(&copy, &cfg, sizeof cfg) == 0);
  TT_CHECK_OK(loom_config_validate(&cfg));
  /* validate catches what C code sets out of range. */
  cfg.optim.lr = -1;
  TT_CHECK_EQ(loom_config_validate(&cfg), LOOM_ERR_CONFIG);
  TT_CHECK_STR(loom_last_error(),
               "key 'optim.lr': -1 is out of range (must be in (0, 1000])");
  cfg = copy;
  cfg.optim.lr = 1e-50;
  TT_CHECK_EQ(loom_config_validate(&cfg), LOOM_ERR_CONFIG);
  TT_CHECK_STR(loom_last_error(),
               "key 'optim.lr': 1e-50 is too small for the f32 arithmetic it "
               "feeds, which would take it as 0 or a subnormal (nonzero "
               "values must be at least 1.17549e-38)");
  cfg = copy;
  cfg.model.heads = 3;
  TT_CHECK_EQ(loom_config_validate(&cfg), LOOM_ERR_CONFIG);
  TT_CHECK_STR(loom_last_error(),
               "key 'model.heads': 3 does not divide model.d_model (128)");
  /* Empty text: every default (a valid config). */
  TT_CHECK_OK(loom_config_load_string(&cfg, "", 0, "empty.yaml", NULL, 0));
  loom_config def;
  loom_config_defaults(&def);
  TT_CHECK_STR(cfg.log.run_dir, "runs/empty");
  TT_CHECK_EQ(cfg.optim.name, def.optim.name);
  TT_CHECK_OK(loom_config_load_string(&cfg, "# only a comment\n", 17, "c.yaml",
                                      NULL, 0));
}

/* Canonical text reads back to an equal config with the same hash and the
 * same text. */
static void check_round_trip(const loom_config *cfg, const char *what) {
  char *y1 = NULL, *y2 = NULL;
  loom_config back;
  loom_config_defaults(&back);
  TT_CHECK_OK(loom_config_to_yaml(cfg, &y1));
  if (!y1)
    return;
  loom_status s = loom_config_load_string(&back, y1, strlen(y1), what, NULL, 0);
  TT_CHECK_OK(s);
  if (s == LOOM_OK) {
    TT_CHECK(loom_config_equal(cfg, &back));
    TT_CHECK(loom_config_hash(cfg) == loom_config_hash(&back));
    TT_CHECK_OK(loom_config_to_yaml(&back, &y2));
    if (y2)
      TT_CHECK_STR(y2, y1);
  }
  loom_free(y1);
  loom_free(y2);
}

TT_TEST(test_examples_round_trip) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/examples", src_dir);
  DIR *d = opendir(dir);
  TT_REQUIRE(d != NULL);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0)
      continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    loom_config cfg;
    loom_config_defaults(&cfg);
    loom_status s = loom_config_load(&cfg, path, NULL, 0);
    if (s != LOOM_OK)
      fprintf(stderr, "%s: %s\n", path, loom_last_error());
    TT_CHECK_OK(s);
    if (s == LOOM_OK)
      check_round_trip(&cfg, path);
    n++;
  }
  closedir(d);
  TT_CHECK(n >= 6);
  /* The reference workloads as DESIGN.md gives them. */
  loom_config cfg;
  char path[2048];
  snprintf(path, sizeof path, "%s/examples/fashion_mlp.yaml", src_dir);
  TT_REQUIRE_OK(loom_config_load(&cfg, path, NULL, 0));
  TT_CHECK_EQ(cfg.model.name, LOOM_CFG_MODEL_MLP);
  TT_CHECK_EQ(cfg.model.hidden.n, 2);
  TT_CHECK_EQ(cfg.model.hidden.v[0], 512);
  TT_CHECK(cfg.optim.lr == 0.05 && cfg.optim.momentum == 0.9);
  TT_CHECK_EQ(cfg.train.batch_size, 128);
  TT_CHECK_EQ(cfg.train.epochs, 5);
  TT_CHECK_STR(cfg.log.run_dir, "runs/fashion_mlp");
  snprintf(path, sizeof path, "%s/examples/fashion_cnn.yaml", src_dir);
  TT_REQUIRE_OK(loom_config_load(&cfg, path, NULL, 0));
  TT_CHECK_EQ(cfg.model.channels.n, 2);
  TT_CHECK_EQ(cfg.model.channels.v[1], 64);
  TT_CHECK_EQ(cfg.model.kernel, 5);
  snprintf(path, sizeof path, "%s/examples/kjv_gpt.yaml", src_dir);
  TT_REQUIRE_OK(loom_config_load(&cfg, path, NULL, 0));
  TT_CHECK(cfg.optim.lr == 3e-4 && cfg.optim.beta2 == 0.999 &&
           cfg.optim.eps == 1e-8 && cfg.optim.weight_decay == 0.01);
  TT_CHECK_EQ(cfg.model.context, 128);
  TT_CHECK_EQ(cfg.model.layers, 4);
  TT_CHECK_EQ(cfg.train.batch_size, 32);
  TT_CHECK(cfg.train.steps >= 1000); /* 1.65 nats/byte at 1200 measured */
}

TT_TEST(test_round_trip_odd_values) {
  loom_config cfg;
  loom_config_defaults(&cfg);
  const char *sets[] = {"data.path=we\"ird\\path\ttab",
                        "optim.lr=0.1",
                        "model.hidden=[]",
                        "train.seed=9007199254740991",
                        "optim.weight_decay=0.30000000000000004",
                        "log.run_dir=runs/a b",
                        "parallel.deterministic=true"};
  TT_REQUIRE_OK(loom_config_load_string(&cfg, "", 0, "x", sets, 7));
  TT_CHECK_EQ(cfg.model.hidden.n, 0);
  TT_CHECK_EQ(cfg.train.seed, 9007199254740991LL);
  TT_CHECK(cfg.optim.weight_decay == 0.30000000000000004);
  TT_CHECK_STR(cfg.checkpoint.dir, "runs/a b/ckpt");
  check_round_trip(&cfg, "odd");
  char v[64];
  TT_CHECK_OK(
      loom_config_format(&cfg, loom_config_key_find("optim.lr"), v, sizeof v));
  TT_CHECK_STR(v, "0.1");
  TT_CHECK_OK(loom_config_format(&cfg, loom_config_key_find("model.hidden"), v,
                                 sizeof v));
  TT_CHECK_STR(v, "[]");
  TT_CHECK_EQ(loom_config_format(&cfg, loom_config_key_find("data.path"), v, 4),
              LOOM_ERR_INVALID_ARG);
}

TT_TEST(test_hash) {
  loom_config a, b;
  loom_config_defaults(&a);
  b = a;
  uint64_t h = loom_config_hash(&a);
  TT_CHECK(h == loom_config_hash(&b));
  /* Local keys do not count: where files go, what is printed, threads. */
  TT_CHECK_OK(loom_config_set(&b, "log.run_dir=/elsewhere"));
  TT_CHECK_OK(loom_config_set(&b, "checkpoint.dir=/ckpt"));
  TT_CHECK_OK(loom_config_set(&b, "log.progress=off"));
  TT_CHECK_OK(loom_config_set(&b, "train.threads=7"));
  TT_CHECK_OK(loom_config_set(&b, "data.path=/mnt/data"));
  TT_CHECK_OK(loom_config_set(&b, "data.prefetch=0"));
  TT_CHECK_OK(loom_config_set(&b, "checkpoint.keep=9"));
  TT_CHECK(h == loom_config_hash(&b));
  TT_CHECK(!loom_config_equal(&a, &b));
  /* Everything else does, one key at a time. */
  const char *changes[] = {
      "optim.lr=0.02", "train.batch_size=33",   "model.hidden=[512]",
      "train.seed=1",  "parallel.bucket_mb=24", "checkpoint.every=7",
      "log.every=51",  "data.tail=drop",        "parallel.deterministic=true"};
  for (size_t i = 0; i < sizeof changes / sizeof changes[0]; i++) {
    loom_config c = a;
    TT_CHECK_OK(loom_config_set(&c, changes[i]));
    if (loom_config_hash(&c) == h)
      fprintf(stderr, "hash unchanged by %s\n", changes[i]);
    TT_CHECK(loom_config_hash(&c) != h);
  }
}

TT_TEST(test_schema) {
  size_t n;
  const loom_config_key *k = loom_config_keys(&n);
  TT_REQUIRE(k != NULL && n >= 50);
  loom_config def;
  loom_config_defaults(&def);
  TT_CHECK_OK(loom_config_validate(&def));
  const char *secs[] = {"model", "data",       "optim", "schedule",
                        "train", "checkpoint", "log",   "parallel"};
  for (size_t i = 0; i < n; i++) {
    /* section.leaf or section.group.leaf (log.mlflow.uri) with a known
     * section; unique; found by name. */
    const char *dot = strchr(k[i].path, '.');
    const char *dot2 = dot ? strchr(dot + 1, '.') : NULL;
    TT_CHECK(dot && (!dot2 || !strchr(dot2 + 1, '.')));
    bool known = false;
    for (size_t s = 0; s < 8 && dot; s++)
      known |= strlen(secs[s]) == (size_t)(dot - k[i].path) &&
               strncmp(secs[s], k[i].path, strlen(secs[s])) == 0;
    TT_CHECK(known);
    TT_CHECK(loom_config_key_find(k[i].path) == &k[i]);
    /* Help: a sentence, no '|' (it goes into a Markdown table). */
    TT_CHECK(k[i].help && strlen(k[i].help) > 10 && !strchr(k[i].help, '|'));
    TT_CHECK(k[i].def && k[i].def[0]);
    TT_CHECK((unsigned)k[i].type < LOOM_CFG_TYPE_COUNT);
    TT_CHECK((k[i].type == LOOM_CFG_ENUM) == (k[i].values != NULL));
    /* Not implemented yet: enum values only, never the default, with a
     * note of what comes later. */
    bool todo = k[i].todo_values || (k[i].flags & LOOM_CFG_TODO);
    TT_CHECK(todo == (k[i].todo != NULL));
    if (k[i].todo_values) {
      TT_CHECK(k[i].type == LOOM_CFG_ENUM && k[i].n_values <= 32);
      int dv;
      memcpy(&dv, (const char *)&def + k[i].offset, sizeof dv);
      TT_CHECK(!(k[i].todo_values & (1u << dv)));
    }
    /* The default reads back as exactly the text in the table: the docs
     * show what the config holds. */
    char v[600];
    TT_CHECK_OK(loom_config_format(&def, &k[i], v, sizeof v));
    if (strcmp(v, k[i].def) != 0)
      fprintf(stderr, "%s: default '%s' formats as '%s'\n", k[i].path, k[i].def,
              v);
    TT_CHECK_STR(v, k[i].def);
    /* Each key can be set from the command line to its default. */
    char set[700];
    snprintf(set, sizeof set, "%s=%s", k[i].path, v);
    loom_config c = def;
    if (k[i].type != LOOM_CFG_STRING)
      TT_CHECK_OK(loom_config_set(&c, set));
    TT_CHECK(loom_config_equal(&c, &def));
    for (size_t j = 0; j < i; j++)
      TT_CHECK(strcmp(k[i].path, k[j].path) != 0);
  }
  TT_CHECK(loom_config_key_find("optim.nope") == NULL);
  TT_CHECK(loom_config_key_find(NULL) == NULL);
  TT_CHECK_STR(loom_optim_kind_names[LOOM_OPTIM_ADAMW], "adamw");
  TT_CHECK_STR(loom_cfg_dataset_names[LOOM_CFG_DATASET_FASHION_MNIST],
               "fashion-mnist");
  TT_CHECK_STR(loom_cfg_type_name(LOOM_CFG_INT_LIST), "int list");
}

/* docs/config.md holds the generated table between two markers. */
#define DOCS_BEGIN                                                             \
  "<!-- schema:begin (generated by loom config schema --markdown) -->\n"
#define DOCS_END "<!-- schema:end -->\n"

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = loom_malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    loom_free(s);
    s = NULL;
  }
  if (s)
    s[n] = '\0';
  fclose(f);
  return s;
}

TT_TEST(test_docs_match_schema) {
  char path[1024];
  snprintf(path, sizeof path, "%s/docs/config.md", src_dir);
  char *doc = read_all(path);
  TT_REQUIRE(doc != NULL);
  char *md = NULL;
  TT_CHECK_OK(loom_config_schema_markdown(&md));
  char *b = strstr(doc, DOCS_BEGIN), *e = strstr(doc, DOCS_END);
  TT_CHECK(b && e && b < e);
  if (md && b && e && b < e) {
    b += strlen(DOCS_BEGIN);
    size_t len = (size_t)(e - b);
    bool same = len == strlen(md) && memcmp(b, md, len) == 0;
    if (!same)
      fprintf(stderr, "docs/config.md is out of date: run "
                      "'loom config schema --markdown' or this test with "
                      "--write-docs SRC\n");
    TT_CHECK(same);
  }
  /* Every key is in the page. */
  size_t n;
  const loom_config_key *k = loom_config_keys(&n);
  for (size_t i = 0; i < n; i++) {
    char needle[80];
    snprintf(needle, sizeof needle, "`%s`", k[i].path);
    TT_CHECK(strstr(doc, needle) != NULL);
  }
  loom_free(md);
  loom_free(doc);
}

TT_TEST(test_alloc_failures) {
  const char *text = "model:\n  name: mlp\noptim:\n  lr: 0.1\n";
  const char *sets[] = {"optim.momentum=0.5"};
  loom_config cfg;
  loom_config_defaults(&cfg);
  loom_config before = cfg;
  int failures = 0;
  for (long n = 1; n < 50; n++) {
    loom_alloc_fail_after(n);
    loom_status s =
        loom_config_load_string(&cfg, text, strlen(text), "a.yaml", sets, 1);
    loom_alloc_fail_after(0);
    if (s == LOOM_OK)
      break;
    TT_CHECK_EQ(s, LOOM_ERR_NOMEM);
    TT_CHECK(memcmp(&cfg, &before, sizeof cfg) == 0);
    failures++;
  }
  TT_CHECK(failures >= 2);
  TT_CHECK(cfg.optim.momentum == 0.5);
  for (long n = 1; n < 50; n++) {
    char *y = NULL;
    loom_alloc_fail_after(n);
    loom_status s = loom_config_to_yaml(&cfg, &y);
    loom_alloc_fail_after(0);
    loom_free(y);
    if (s == LOOM_OK)
      break;
    TT_CHECK_EQ(s, LOOM_ERR_NOMEM);
    TT_CHECK(y == NULL);
  }
}

/* Mutated configs: every outcome is OK or one clean LOOM_ERR_CONFIG line
 * naming the file; no crash (ASan and UBSan watch the rest). */
TT_TEST(test_fuzz) {
  char path[1024];
  snprintf(path, sizeof path, "%s/examples/kjv_gpt.yaml", src_dir);
  char *orig = read_all(path);
  TT_REQUIRE(orig != NULL);
  size_t len = strlen(orig);
  char *text = loom_malloc(len + 64);
  TT_REQUIRE(text != NULL);
  loom_rng r = loom_rng_init(99, 0);
  int ok = 0, bad = 0;
  const char *repl = "0123456789-.e:[]{}#&*!|>'\" \t\nabz_,";
  for (int it = 0; it < 1500; it++) {
    memcpy(text, orig, len + 1);
    size_t n = len;
    int edits = 1 + (int)loom_rng_below(&r, 4);
    for (int e = 0; e < edits; e++) {
      size_t at = (size_t)loom_rng_below(&r, n);
      uint64_t kind = loom_rng_below(&r, 3);
      char c = repl[loom_rng_below(&r, strlen(repl))];
      if (kind == 0) {
        text[at] = c;
      } else if (kind == 1 && n + 1 < len + 64) {
        memmove(text + at + 1, text + at, n - at + 1);
        text[at] = c;
        n++;
      } else if (n > 1) {
        memmove(text + at, text + at + 1, n - at);
        n--;
      }
    }
    loom_config cfg;
    loom_config_defaults(&cfg);
    loom_status s = loom_config_load_string(&cfg, text, n, "f.yaml", NULL, 0);
    if (s == LOOM_OK) {
      ok++;
      TT_CHECK_OK(loom_config_validate(&cfg));
      check_round_trip(&cfg, "fuzz");
    } else {
      bad++;
      TT_CHECK_EQ(s, LOOM_ERR_CONFIG);
      const char *m = loom_last_error();
      TT_CHECK(strncmp(m, "f.yaml", 6) == 0 && !strchr(m, '\n'));
    }
  }
  TT_CHECK(ok > 100 && bad > 100);
  loom_free(text);
  loom_free(orig);
}

static int write_docs(const char *src) {
  char path[1024];
  snprintf(path, sizeof path, "%s/docs/config.md", src);
  char *doc = read_all(path);
  char *md = NULL;
  if (!doc || loom_config_schema_markdown(&md) != LOOM_OK) {
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  char *b = strstr(doc, DOCS_BEGIN), *e = strstr(doc, DOCS_END);
  if (!b || !e || e < b) {
    fprintf(stderr, "%s: markers missing\n", path);
    return 1;
  }
  FILE *f = fopen(path, "wb");
  if (!f)
    return 1;
  fwrite(doc, 1, (size_t)(b - doc) + strlen(DOCS_BEGIN), f);
  fputs(md, f);
  fputs(e, f);
  fclose(f);
  loom_free(md);
  loom_free(doc);
  printf("wrote %s\n", path);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--write-docs") == 0)
    return write_docs(argv[2]);
  if (argc > 1)
    src_dir = argv[1];
  TT_RUN(test_bad_configs);
  TT_RUN(test_set_errors);
  TT_RUN(test_not_implemented_and_sizes);
  TT_RUN(test_depth_cap);
  TT_RUN(test_missing_file);
  TT_RUN(test_good_config_and_sets);
  TT_RUN(test_examples_round_trip);
  TT_RUN(test_round_trip_odd_values);
  TT_RUN(test_hash);
  TT_RUN(test_schema);
  TT_RUN(test_docs_match_schema);
  TT_RUN(test_alloc_failures);
  TT_RUN(test_fuzz);
  return tt_finish();
}
