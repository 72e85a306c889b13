/* loom train: train a model from a YAML config. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/run.h"
#include "loom/train.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: loom train CONFIG [options]\n"
      "\n"
      "Trains the model CONFIG describes (see docs/config.md), printing\n"
      "progress, writing RUN_DIR/metrics.jsonl and checkpoints.\n"
      "\n"
      "options:\n"
      "  --set SECTION.KEY=VALUE  override a config key (repeatable)\n"
      "  --resume auto|never|DIR  auto (default): continue from the newest\n"
      "                           valid checkpoint of checkpoint.dir if any;\n"
      "                           never: start fresh; DIR: that checkpoint,\n"
      "                           or the newest valid one of a checkpoint\n"
      "                           directory (or its latest file, or a run\n"
      "                           directory's ckpt/)\n"
      "  --steps N                train for N optimizer steps in total\n"
      "                           (same as --set train.steps=N; an epoch\n"
      "                           limit the config gives still applies)\n"
      "  --stop-at N              stop after step N as if interrupted,\n"
      "                           saving a checkpoint (the schedule still\n"
      "                           runs to the configured end)\n"
      "  --quiet                  no progress or eval lines\n"
      "  --print-config           print the resolved config and exit\n"
      "  --find-batch-size        find the largest train.batch_size that\n"
      "                           trains within --memory (default 90%% of\n"
      "                           MemAvailable): the estimate, then 4 real\n"
      "                           steps per size, each in its own process;\n"
      "                           prints each size's peak memory and\n"
      "                           throughput, then exits (sizes a\n"
      "                           multiple of parallel.micro_batches; a\n"
      "                           trial refused, exit 2, ends it: exit 2)\n"
      "  --memory BYTES           the budget (suffix K, M, G, T) of\n"
      "                           --find-batch-size, or of a rank when\n"
      "                           train.batch_size is auto (default: alone\n"
      "                           90%% of MemAvailable and the finder's\n"
      "                           trials; under loom run the estimate for\n"
      "                           80%% of MemTotal over the host's ranks;\n"
      "                           capped at MemTotal, over the host's\n"
      "                           ranks under loom run)\n"
      "  -h, --help               this text\n"
      "\n"
      "Ctrl-C (SIGINT), SIGTERM or SIGHUP stops at the next step boundary\n"
      "after saving a checkpoint. Exit codes: 0 done, 1 failed, 2 bad\n"
      "config, data or command line, 128 + the signal when stopped by one\n"
      "(130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).\n");
}

static int parse_i64(const char *s, int64_t *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 0)
    return -1;
  *out = v;
  return 0;
}

/* Whether a failure came from a file system that is full or read-only:
 * the message carries strerror's text for the errno of the failed call. */
static bool no_space(const char *msg) {
  static const int codes[] = {ENOSPC, EDQUOT, EROFS};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (msg && strstr(msg, strerror(codes[i])))
      return true;
  return false;
}

/* A stop by a signal, in the rank's status file for loom run: "stopped by
 * SIGTERM at step N, checkpoint saved" (every rank stops at the same
 * step; a rank that got no signal itself stopped with the others). */
static void note_stop(const loom_train_result *res) {
  char note[LOOM_RUNSTAT_NOTE_MAX + 1];
  const char *name = res->stop_signal == SIGINT    ? "SIGINT"
                     : res->stop_signal == SIGTERM ? "SIGTERM"
                     : res->stop_signal == SIGHUP  ? "SIGHUP"
                                                   : NULL;
  snprintf(note, sizeof note, "stopped %s%s at step %lld, %s",
           name ? "by " : "with the other ranks", name ? name : "",
           (long long)res->steps,
           res->saved ? "checkpoint saved" : "no checkpoint");
  loom_runstat_note(note);
}

/* Rank 0's last words: how far, how fast, how good. */
static void print_summary(const loom_config *cfg, const loom_train_result *res,
                          int nranks) {
  const char *unit = cfg->data.dataset == LOOM_CFG_DATASET_FASHION_MNIST
                         ? "samples"
                         : "tokens";
  fprintf(stderr, "%s at step %lld: %.1f s, %.0f %s/s",
          res->interrupted ? "stopped" : "done", (long long)res->steps,
          res->seconds, res->throughput, unit);
  if (nranks > 1)
    fprintf(stderr, " (%d ranks)", nranks);
  /* The result lines are the final evaluation's, over the whole validation
   * split; a run stopped before it has only an earlier, periodic one (maybe
   * of a few batches), said as such and not as the result. */
  bool final =
      !isnan(res->val_loss) && res->val_step == res->steps && res->val_whole;
  if (!isnan(res->val_loss) && final)
    fprintf(stderr, ", val_loss %.4f", res->val_loss);
  else if (!isnan(res->val_loss))
    fprintf(stderr, "; last evaluation at step %lld%s: val_loss %.4f",
            (long long)res->val_step,
            res->val_whole ? "" : " (train.eval_batches batches)",
            res->val_loss);
  fputc('\n', stderr);
  if (!final)
    return;
  if (!isnan(res->val_accuracy))
    printf("test accuracy: %.2f%%\n", 100.0 * res->val_accuracy);
  else
    printf("validation loss: %.4f nats/byte\n", res->val_loss);
}

static int train_main(int argc, char **argv) {
  const char *config_path = NULL;
  const char *sets[64];
  char steps_set[64];
  int n_sets = 0;
  bool print_config = false, find_batch = false;
  const char *memory = NULL;
  loom_train_opts opts = loom_train_opts_default();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_next = i + 1 < argc;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return LOOM_EXIT_OK;
    } else if (strcmp(a, "--set") == 0 && has_next) {
      if (n_sets == (int)(sizeof sets / sizeof sets[0])) {
        fprintf(stderr, "loom train: too many --set options\n");
        return LOOM_EXIT_USAGE;
      }
      sets[n_sets++] = argv[++i];
    } else if (strcmp(a, "--resume") == 0 && has_next) {
      opts.resume = argv[++i];
    } else if (strcmp(a, "--steps") == 0 && has_next) {
      int64_t v;
      if (parse_i64(argv[++i], &v) != 0 || v < 1) {
        fprintf(stderr,
                "loom train: --steps needs a positive integer, got "
                "'%s'\n",
                argv[i]);
        return LOOM_EXIT_USAGE;
      }
      snprintf(steps_set, sizeof steps_set, "train.steps=%lld", (long long)v);
      if (n_sets == (int)(sizeof sets / sizeof sets[0]))
        return LOOM_EXIT_USAGE;
      sets[n_sets++] = steps_set;
    } else if (strcmp(a, "--stop-at") == 0 && has_next) {
      if (parse_i64(argv[++i], &opts.stop_at) != 0 || opts.stop_at < 1) {
        fprintf(stderr,
                "loom train: --stop-at needs a positive integer, "
                "got '%s'\n",
                argv[i]);
        return LOOM_EXIT_USAGE;
      }
    } else if (strcmp(a, "--find-batch-size") == 0) {
      find_batch = true;
    } else if (strcmp(a, "--memory") == 0 && has_next) {
      memory = argv[++i];
    } else if (strcmp(a, "--quiet") == 0) {
      opts.quiet = true;
    } else if (strcmp(a, "--print-config") == 0) {
      print_config = true;
    } else if (a[0] == '-') {
      fprintf(stderr,
              "loom train: unknown or incomplete option '%s' (see "
              "'loom train --help')\n",
              a);
      return LOOM_EXIT_USAGE;
    } else if (!config_path) {
      config_path = a;
    } else {
      fprintf(stderr, "loom train: one config only (got '%s' and '%s')\n",
              config_path, a);
      return LOOM_EXIT_USAGE;
    }
  }
  if (!config_path) {
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }

  if (find_batch)
    return loom_cli_find_batch(config_path, sets, n_sets, memory);

  loom_config cfg;
  if (loom_config_load(&cfg, config_path, sets, n_sets) != LOOM_OK) {
    fprintf(stderr, "loom train: %s\n", loom_last_error());
    return LOOM_EXIT_USAGE;
  }
  if (memory && cfg.train.batch_size != 0) {
    fprintf(stderr, "loom train: --memory goes with --find-batch-size or "
                    "train.batch_size: auto\n");
    return LOOM_EXIT_USAGE;
  }
  if (cfg.train.batch_size == 0) { /* auto */
    int rc = loom_cli_auto_batch(config_path, sets, n_sets, memory, &cfg);
    if (rc != LOOM_EXIT_OK)
      return rc;
    opts.batch_auto = true;
    fflush(stdout);
  }
  if (print_config) {
    char *yaml = NULL;
    if (loom_config_to_yaml(&cfg, &yaml) != LOOM_OK) {
      fprintf(stderr, "loom train: %s\n", loom_last_error());
      return LOOM_EXIT_FAIL;
    }
    fputs(yaml, stdout);
    loom_free(yaml);
    return LOOM_EXIT_OK;
  }

  /* Under `loom run -n N` every rank runs this; only rank 0 reports. The
   * trainer holds the world group too: this reference only reads the rank. */
  loom_group *world = NULL;
  if (loom_group_world(NULL, &world) != LOOM_OK) {
    fprintf(stderr, "loom train: %s\n", loom_last_error());
    return LOOM_EXIT_FAIL;
  }
  int rank = loom_group_rank(world), nranks = loom_group_size(world);
  char who[32] = "";
  if (nranks > 1)
    snprintf(who, sizeof who, "[rank %d] ", rank);
  loom_trainer *t = NULL;
  loom_status s = loom_trainer_new(&t, &cfg, &opts);
  if (s != LOOM_OK) {
    fprintf(stderr, "loom train: %s%s\n", who, loom_last_error());
    loom_group_free(world);
    /* a config the data or the checkpoint disagrees with (another
     * optimizer, a data set shorter than the saved position) fails the
     * same way on every start: not restartable */
    return s == LOOM_ERR_CONFIG || s == LOOM_ERR_MISMATCH ? LOOM_EXIT_USAGE
                                                          : LOOM_EXIT_FAIL;
  }
  loom_train_result res;
  s = loom_trainer_run(t, &res);
  /* All said before the world group goes (MPI_Finalize waits for every
   * rank): once one rank exits non-zero the launcher takes the others
   * down, so each rank's note and rank 0's summary come first. */
  int rc = LOOM_EXIT_OK;
  if (s != LOOM_OK) {
    fprintf(stderr, "loom train: %s%s\n", who, loom_last_error());
    rc = LOOM_EXIT_FAIL;
    if (no_space(loom_last_error())) {
      loom_runstat_note("no space left for the checkpoint (not restartable)");
      rc = LOOM_EXIT_NOSPACE;
    }
  } else {
    if (res.interrupted && opts.stop_at == 0)
      note_stop(&res);
    if (!opts.quiet && rank == 0)
      print_summary(&cfg, &res, nranks);
  }
  fflush(stdout);
  fflush(stderr);
  loom_trainer_free(t);
  loom_group_free(world);
  if (rc != LOOM_EXIT_OK)
    return rc;
  if (res.interrupted && opts.stop_at == 0)
    return res.stop_signal > 0 ? 128 + res.stop_signal : 130;
  return LOOM_EXIT_OK;
}

/* Under loom run, the rank's status file records how it ended: an exit code
 * here, a fatal signal from the handler. */
int loom_cmd_train(int argc, char **argv) {
  /* From the start: a stop while MPI starts or data loads is not lost. */
  loom_trainer_catch_stop_signals();
  loom_runstat_init();
  loom_runstat_fatal_signals();
  int rc = train_main(argc, argv);
  loom_runstat_exit(rc);
  return rc;
}
