/* loom estimate: the memory one rank needs to train a config, by category,
 * for every data-parallel strategy side by side, and the largest batch that
 * fits a budget. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/config.h"
#include "loom/kernels.h"
#include "loom/train.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: loom estimate CONFIG [-n N] [--strategy S] [--memory BYTES]\n"
      "                     [--set KEY=VALUE]...\n\n"
      "Prints the memory one rank needs to train CONFIG on N ranks\n"
      "(default 1): parameters, gradients, optimizer state, activations\n"
      "(one micro-batch of train.batch_size rows), data (the loader's\n"
      "data.prefetch + 1 batches and the data set held in memory, sized\n"
      "from its files), communication buffers, the async checkpoint's\n"
      "copy, and their total with the process itself (code, libraries,\n"
      "threads; MPI's on more than one rank), in MiB, for every strategy\n"
      "(or only S), and what a rank sends per step (sent/step). With\n"
      "parallel.pp > 1, one row per pipeline stage instead. Strategies\n"
      "this build cannot run yet are marked 'forecast'. A training run\n"
      "writes its measured peak (peak_rss_mb) into metrics.jsonl.\n"
      "A job loom train would refuse at start-up on N ranks (parallel.dp\n"
      "x tp x pp not N, deterministic mode on N not a power of two, ...)\n"
      "is refused with training's message, exit 2.\n\n"
      "  -n N              ranks\n"
      "  --strategy S      ddp, zero1, zero2, zero3, fsdp, or none (one\n"
      "                    rank only)\n"
      "  --memory BYTES    also the largest train.batch_size whose total\n"
      "                    fits BYTES (suffix K, M, G or T: powers of 1024),\n"
      "                    under S or the config's strategy\n"
      "  --set KEY=VALUE   override a config key (repeatable)\n");
}

/* "8G", "512M", "1048576": bytes; false for anything else. */
bool loom_cli_parse_bytes(const char *s, double *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || !(v > 0) || !isfinite(v))
    return false;
  double mul = 1;
  if (*end) {
    const char *units = "KMGT";
    const char *u = strchr(units, *end);
    if (!u || end[1] != '\0')
      return false;
    for (const char *c = units; c <= u; c++)
      mul *= 1024;
  }
  *out = v * mul;
  return true;
}

static void row(const loom_train_estimate *e) {
  const double mib = 1024.0 * 1024.0;
  char name[32];
  if (e->stages > 1)
    snprintf(name, sizeof name, "stage%d", e->stage);
  else
    snprintf(name, sizeof name, "%s", loom_cfg_strategy_names[e->strategy]);
  printf("%-8s %-9s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f "
         "%10.1f %10.1f\n",
         name, e->available ? "yes" : "forecast", e->param_bytes / mib,
         e->grad_bytes / mib, e->optim_bytes / mib, e->act_bytes / mib,
         e->data_bytes / mib, e->comm_bytes / mib, e->ckpt_bytes / mib,
         e->total_bytes / mib, e->sent_bytes / mib);
}

/* Whether batch b fits: loom train accepts it and its estimate is within
 * budget. A size training refuses (its size checks: beyond the kernels'
 * int range, a micro-batch's activations beyond their cap) does not fit,
 * and *refused notes the smallest such b; any other error of the estimate
 * is returned (for b = 1 every error is). */
static loom_status batch_fits(loom_config *cfg, int ranks, loom_cfg_strategy s,
                              double budget, int64_t b, bool *fits,
                              loom_train_estimate *e, int64_t *refused) {
  /* b micro-batches' rows: a batch parallel.micro_batches divides */
  cfg->train.batch_size =
      b * (cfg->parallel.micro_batches > 1 ? cfg->parallel.micro_batches : 1);
  loom_status st = loom_config_validate(cfg);
  if (st == LOOM_OK)
    st = loom_train_estimate_memory(cfg, ranks, s, e);
  if ((st == LOOM_ERR_UNSUPPORTED || st == LOOM_ERR_CONFIG) && b > 1) {
    loom_clear_error();
    if (*refused == 0 || cfg->train.batch_size < *refused)
      *refused = cfg->train.batch_size;
    *fits = false;
    return LOOM_OK;
  }
  LOOM_TRY(st);
  *fits = e->total_bytes <= budget;
  return LOOM_OK;
}

loom_status loom_cli_largest_batch(loom_config *cfg, int ranks,
                                   loom_cfg_strategy s, double budget,
                                   int64_t *best, loom_cfg_strategy *resolved,
                                   int64_t *refused) {
  loom_train_estimate e;
  int64_t lo = 0, hi = 1, no = 0;
  const int64_t cap = 1 << 24; /* train.batch_size's own limit */
  bool fits;
  LOOM_TRY(batch_fits(cfg, ranks, s, budget, 1, &fits, &e, &no));
  if (resolved)
    *resolved = e.strategy; /* auto made none or ddp */
  while (fits) {            /* doubling until it no longer fits */
    lo = hi;
    if (hi >= cap)
      break;
    hi *= 2;
    LOOM_TRY(batch_fits(cfg, ranks, s, budget, hi, &fits, &e, &no));
  }
  while (hi - lo > 1) { /* lo fits (or is 0), hi does not */
    int64_t mid = lo + (hi - lo) / 2;
    LOOM_TRY(batch_fits(cfg, ranks, s, budget, mid, &fits, &e, &no));
    if (fits)
      lo = mid;
    else
      hi = mid;
  }
  *best =
      lo * (cfg->parallel.micro_batches > 1 ? cfg->parallel.micro_batches : 1);
  /* training's limit decided it when the next size up was refused */
  if (refused)
    *refused = no > 0 && no <= *best + (cfg->parallel.micro_batches > 1
                                            ? cfg->parallel.micro_batches
                                            : 1)
                   ? no
                   : 0;
  return LOOM_OK;
}

int loom_cmd_estimate(int argc, char **argv) {
  const char *path = NULL, *strategy = NULL, *memory = NULL;
  int ranks = 1;
  const char **sets = loom_calloc((size_t)argc, sizeof *sets);
  int n_sets = 0, rc = LOOM_EXIT_OK;
  if (!sets) {
    fprintf(stderr, "loom: out of memory\n");
    return LOOM_EXIT_FAIL;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      goto done;
    } else if (!strcmp(a, "-n") && i + 1 < argc) {
      if (!loom_parse_int(argv[++i], &ranks) || ranks < 1 || ranks > 65536) {
        fprintf(stderr, "loom estimate: -n %s: expected 1 to 65536 ranks\n",
                argv[i]);
        rc = LOOM_EXIT_USAGE;
        goto done;
      }
    } else if (!strcmp(a, "--strategy") && i + 1 < argc) {
      strategy = argv[++i];
    } else if (!strcmp(a, "--memory") && i + 1 < argc) {
      memory = argv[++i];
    } else if (!strcmp(a, "--set") && i + 1 < argc) {
      sets[n_sets++] = argv[++i];
    } else if (a[0] == '-' || path) {
      fprintf(stderr, "loom estimate: unexpected argument '%s'\n", a);
      usage(stderr);
      rc = LOOM_EXIT_USAGE;
      goto done;
    } else {
      path = a;
    }
  }
  if (!path) {
    usage(stderr);
    rc = LOOM_EXIT_USAGE;
    goto done;
  }
  int only = -1;
  if (strategy) {
    for (int s = 0; s < LOOM_CFG_STRATEGY_COUNT; s++)
      if (!strcmp(strategy, loom_cfg_strategy_names[s]))
        only = s;
    if (only < 0 || only == LOOM_CFG_STRATEGY_AUTO) {
      fprintf(stderr,
              "loom estimate: --strategy %s: expected none, ddp, zero1, "
              "zero2, zero3 or fsdp\n",
              strategy);
      rc = LOOM_EXIT_USAGE;
      goto done;
    }
  }
  double budget = 0;
  if (memory && !loom_cli_parse_bytes(memory, &budget)) {
    fprintf(stderr,
            "loom estimate: --memory %s: expected bytes, as 8G or 512M\n",
            memory);
    rc = LOOM_EXIT_USAGE;
    goto done;
  }
  /* The config as loom train reads it. */
  loom_config cfg;
  loom_status st = loom_config_load(&cfg, path, sets, n_sets);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom: %s\n", loom_last_error());
    rc = st == LOOM_ERR_CONFIG ? LOOM_EXIT_USAGE : LOOM_EXIT_FAIL;
    goto done;
  }
  /* none is one rank's alone (a pipeline or a tp group has several) */
  if (only == LOOM_CFG_STRATEGY_NONE && ranks > 1) {
    fprintf(stderr,
            "loom estimate: --strategy none with -n %d: on more than one "
            "rank (a data-parallel group, parallel.tp %lld, parallel.pp "
            "%lld) supported: ddp, zero1, zero2, zero3, fsdp\n",
            ranks, (long long)cfg.parallel.tp, (long long)cfg.parallel.pp);
    rc = LOOM_EXIT_USAGE;
    goto done;
  }
  /* The world-size rules loom train applies at start-up, with S as the
   * config's strategy: a job it would refuse gets no table. */
  loom_cfg_strategy own = cfg.parallel.strategy;
  if (only >= 0)
    cfg.parallel.strategy = (loom_cfg_strategy)only;
  st = loom_train_check_world(&cfg, ranks);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom estimate: %s\n", loom_last_error());
    rc = st == LOOM_ERR_CONFIG ? LOOM_EXIT_USAGE : LOOM_EXIT_FAIL;
    goto done;
  }
  if (cfg.parallel.pp == 1)
    cfg.parallel.strategy = own;
  if (cfg.train.batch_size == 0) {
    /* auto: what loom train under loom run -n N on one host would take. */
    double share = 0.8 * loom_cli_mem_total() / ranks;
    int64_t b = 0;
    st = loom_cli_largest_batch(&cfg, ranks, cfg.parallel.strategy, share, &b,
                                NULL, NULL);
    if (st != LOOM_OK || b < 1) {
      fprintf(stderr, "loom estimate: train.batch_size auto: %s\n",
              st != LOOM_OK ? loom_last_error()
                            : "not even 1 row fits in 80% of MemTotal");
      rc = LOOM_EXIT_FAIL;
      goto done;
    }
    cfg.train.batch_size = b;
    printf("# train.batch_size auto: %lld (the largest within 80%% of "
           "MemTotal over %d rank(s), %.0f MiB each)\n",
           (long long)b, ranks, share / (1024.0 * 1024.0));
  }
  loom_train_estimate e;
  st = loom_train_estimate_memory(&cfg, ranks, LOOM_CFG_STRATEGY_AUTO, &e);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom estimate: %s\n", loom_last_error());
    rc = st == LOOM_ERR_CONFIG ? LOOM_EXIT_USAGE : LOOM_EXIT_FAIL;
    goto done;
  }
  printf("# %s: %s, %lld parameters, %d rank%s, micro-batch %lld rows, "
         "optimizer %s\n",
         path, loom_cfg_model_names[cfg.model.name], (long long)e.params, ranks,
         ranks == 1 ? "" : "s", (long long)e.batch,
         loom_optim_kind_name(cfg.optim.name));
  printf("# MiB per rank (all ranks on one host); total includes %.0f MiB "
         "for the process itself (code, libraries, threads%s)\n",
         e.process_bytes / (1024.0 * 1024.0), ranks > 1 ? ", MPI" : "");
  if (e.half != LOOM_F32) /* the copy's size follows the path on this CPU */
    printf("# %s: %s; params include the model's copy in %s, %d bytes a "
           "parameter%s\n",
           loom_dtype_name(e.half), loom_half_path_describe(e.half),
           loom_dtype_name(e.half), e.half_copy_bytes,
           e.half_copy_bytes == 4 && ranks > 1
               ? " (2 under zero3, which gathers it)"
               : "");
  if (!e.dataset_known) {
    printf("# data: the loader's batches only; the data set (%s) was not "
           "found, so its memory is not counted\n",
           loom_cfg_dataset_names[cfg.data.dataset]);
    /* A path the config names that is not there (or not of its kind): the
     * estimate still answers (the data may live only on the compute
     * hosts), but loom train would refuse it on this host. */
    if (cfg.data.path[0])
      fprintf(stderr,
              "loom estimate: warning: data.path %s%s%s: not found or not "
              "what data.dataset %s reads on this host, so the data set's "
              "memory is not counted; loom train here would refuse it\n",
              cfg.data.path, cfg.data.val_path[0] ? ", data.val_path " : "",
              cfg.data.val_path, loom_cfg_dataset_names[cfg.data.dataset]);
  } else if (e.mapped_bytes > 0)
    printf("# data: the loader's batches; the token files (%.1f MiB) are "
           "mapped, not counted: their pages count in the RSS once read, "
           "but the kernel can drop them\n",
           e.mapped_bytes / (1024.0 * 1024.0));
  else
    printf("# data: the loader's batches and the data set in memory "
           "(%.1f MiB)\n",
           e.dataset_bytes / (1024.0 * 1024.0));
  if (cfg.parallel.tp > 1 && cfg.parallel.pp == 1)
    printf("# mesh: dp %d x tp %lld x pp 1: each rank holds its tensor-"
           "parallel part of the model (%lld parameters); sent/step counts "
           "the tp group's all-reduces (4 a block per micro-batch)%s%s\n",
           e.dp, (long long)cfg.parallel.tp, (long long)e.stage_params,
           !cfg.parallel.sequence_parallel ? ""
           : cfg.parallel.sequence_parallel_regather
               ? "; sequence parallel: each a reduce-scatter and an "
                 "all-gather, 2 all-gathers more a block in backward, the "
                 "norms' and sums' activations 1/tp"
               : "; sequence parallel: each a reduce-scatter and an "
                 "all-gather (the same bytes), the norms' and sums' "
                 "activations 1/tp",
           cfg.parallel.sequence_parallel &&
                   cfg.train.precision != LOOM_CFG_PRECISION_F32
               ? "; in bf16/f16 the all-gathers carry 2-byte values: fewer "
                 "bytes"
               : "");
  if (cfg.parallel.pp > 1)
    printf("# mesh: dp %d x tp %lld x pp %lld, %lld micro-batch%s of %lld "
           "rows, schedule %s; one row a stage (units [first, end) of the "
           "model)\n",
           e.dp, (long long)cfg.parallel.tp, (long long)cfg.parallel.pp,
           (long long)cfg.parallel.micro_batches,
           cfg.parallel.micro_batches == 1 ? "" : "es", (long long)e.batch,
           loom_cfg_pp_schedule_names[cfg.parallel.pp_schedule]);
  printf("# sent/step: MiB this rank sends per optimizer step (gradient "
         "reduction%s)\n",
         cfg.parallel.pp > 1 ? ", activations and their gradients between "
                               "stages, tied weights"
                             : " and ZeRO's gathers");
  if (cfg.parallel.pp > 1 && cfg.parallel.strategy == LOOM_CFG_STRATEGY_ZERO2)
    printf("# zero2: grads is the peak, the stage's whole gradient summed "
           "over the micro-batches; after its reduce a rank keeps 1/%d of "
           "it (and what it borrows)\n",
           e.dp);
  if (cfg.parallel.pp > 1 &&
      (cfg.parallel.strategy == LOOM_CFG_STRATEGY_ZERO3 ||
       cfg.parallel.strategy == LOOM_CFG_STRATEGY_FSDP))
    printf("# %s: params and grads are the peaks, the stage's whole "
           "parameters gathered for the step's micro-batches and its "
           "gradient summed over them; between steps a rank keeps 1/%d of "
           "each (and what it borrows)\n",
           loom_cfg_strategy_names[cfg.parallel.strategy], e.dp);
  printf("%-8s %-9s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n",
         cfg.parallel.pp > 1 ? "stage" : "strategy", "runs", "params", "grads",
         "optimizer", "activation", "data", "comm", "ckpt", "total",
         "sent/step");
  for (int st2 = 0; cfg.parallel.pp > 1 && st2 < (int)cfg.parallel.pp; st2++) {
    st = loom_train_estimate_stage(&cfg, ranks, st2, &e);
    if (st != LOOM_OK) {
      fprintf(stderr, "loom estimate: %s\n", loom_last_error());
      rc = st == LOOM_ERR_CONFIG ? LOOM_EXIT_USAGE : LOOM_EXIT_FAIL;
      goto done;
    }
    row(&e);
    int u0 = e.unit_first, u1 = e.unit_end;
    printf("#   stage %d: units [%d, %d), %lld parameters, %d micro-batch%s "
           "in flight\n",
           st2, u0, u1, (long long)e.stage_params, e.instances,
           e.instances == 1 ? "" : "es");
  }
  for (int s = 0; cfg.parallel.pp == 1 && s < LOOM_CFG_STRATEGY_COUNT; s++) {
    if (s == LOOM_CFG_STRATEGY_AUTO || s == LOOM_CFG_STRATEGY_FSDP)
      continue; /* auto resolves to one of them; fsdp is zero3 */
    if (only >= 0 && s != only &&
        !(only == LOOM_CFG_STRATEGY_FSDP && s == LOOM_CFG_STRATEGY_ZERO3))
      continue;
    if (s == LOOM_CFG_STRATEGY_NONE && ranks > 1)
      continue;
    st = loom_train_estimate_memory(&cfg, ranks, (loom_cfg_strategy)s, &e);
    if (st != LOOM_OK) {
      fprintf(stderr, "loom estimate: %s\n", loom_last_error());
      rc = LOOM_EXIT_FAIL;
      goto done;
    }
    row(&e);
  }
  if (memory) {
    loom_cfg_strategy s =
        only >= 0 ? (loom_cfg_strategy)only : cfg.parallel.strategy;
    int64_t best = 0, refused = 0;
    st = loom_cli_largest_batch(&cfg, ranks, s, budget, &best, &s, &refused);
    if (st != LOOM_OK) {
      fprintf(stderr, "loom estimate: %s\n", loom_last_error());
      rc = LOOM_EXIT_FAIL;
      goto done;
    }
    if (best == 0)
      printf("largest train.batch_size within %s under %s: none (even 1 row "
             "needs more)\n",
             memory, loom_cfg_strategy_names[s]);
    else if (cfg.parallel.pp > 1)
      printf("largest train.batch_size within %s under pp %lld: %lld (every "
             "stage fits)\n",
             memory, (long long)cfg.parallel.pp, (long long)best);
    else
      printf("largest train.batch_size within %s under %s: %lld\n", memory,
             loom_cfg_strategy_names[s], (long long)best);
    if (refused > 0) {
      /* the memory would take more: say what stopped it */
      cfg.train.batch_size = refused;
      if (loom_config_validate(&cfg) != LOOM_OK)
        printf("# the most loom train accepts, not the memory: at %lld, %s\n",
               (long long)refused, loom_last_error());
      else
        printf("# the most loom train accepts, not the memory: %lld rows are "
               "beyond what the kernels can index\n",
               (long long)refused);
      loom_clear_error();
    }
  }
done:
  loom_free(sets);
  return rc;
}
