/* The subcommands of the loom tool; each lives in its own file. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include "loom/config.h"
#include "loom/run.h" /* loom_run_main: `loom run` */

/* Exit codes of the tool: LOOM_EXIT_* in loom/run.h, the protocol between
 * a rank and loom run. */

typedef int (*loom_cli_fn)(int argc, char **argv);

typedef struct loom_cli_cmd {
  const char *name;
  loom_cli_fn fn;
  const char *help;
} loom_cli_cmd;

/* One row per subcommand: name, entry point (argv[0] is the command name),
 * one-line help. */
#define LOOM_CLI_COMMANDS(X)                                                   \
  X("train", loom_cmd_train, "train a model from a YAML config")               \
  X("run", loom_run_main,                                                      \
    "launch N ranks (mpirun or srun) and supervise them")                      \
  X("data", loom_cmd_data, "prepare data sets (e.g. the KJV text)")            \
  X("ckpt", loom_cmd_ckpt, "inspect checkpoints")                              \
  X("config", loom_cmd_config, "check a config, show it resolved, list keys")  \
  X("estimate", loom_cmd_estimate,                                             \
    "memory per rank of a config, per strategy; largest batch that fits")      \
  X("report", loom_cmd_report,                                                 \
    "a run's HTML report, with a verdict; --trace merges the ranks' "          \
    "timelines")                                                               \
  X("bench", loom_cmd_bench, "measure kernels and collectives")

int loom_cmd_train(int argc, char **argv);    /* train.c */
int loom_cmd_data(int argc, char **argv);     /* data.c */
int loom_cmd_ckpt(int argc, char **argv);     /* ckpt.c */
int loom_cmd_config(int argc, char **argv);   /* config.c */
int loom_cmd_estimate(int argc, char **argv); /* estimate.c */
int loom_cmd_report(int argc, char **argv);   /* report.c */
/* estimate.c: "8G", "512M", "1048576" as bytes (powers of 1024); the
 * largest train.batch_size of cfg that loom train accepts and whose
 * estimate fits budget (0: not even 1 row), cfg's batch_size left at the
 * last one tried; *resolved (may be NULL): the strategy s came to (auto:
 * none or ddp); *refused (may be NULL): the batch just above the answer
 * when training's size checks refused it rather than the budget, else 0. */
bool loom_cli_parse_bytes(const char *s, double *out);
/* For a command that writes a large file atomically (loom data shard, loom
 * report): SIGINT, SIGTERM and SIGHUP remove the temporary it is filling
 * (loom_fs_discard_pending), then end the process by the same signal. */
void loom_cli_discard_on_stop(void);
loom_status loom_cli_largest_batch(loom_config *cfg, int ranks,
                                   loom_cfg_strategy s, double budget,
                                   int64_t *best, loom_cfg_strategy *resolved,
                                   int64_t *refused);
/* find_batch.c: loom train --find-batch-size. */
int loom_cli_find_batch(const char *config_path, const char *const *sets,
                        int n_sets, const char *memory);
/* MemTotal of /proc/meminfo in bytes (0 when unknown). */
double loom_cli_mem_total(void);
/* The same, its answer in *answer (0 when it has none). */
int loom_cli_find_batch_run(const char *config_path, const char *const *sets,
                            int n_sets, const char *memory, int64_t *answer);
/* train.batch_size: auto in cfg becomes a number: alone, the finder's
 * answer (its trials printed); under loom run or an MPI launcher, the
 * estimate's for 80% of MemTotal shared by the host's ranks (the same on
 * every rank, with no communication). memory (or NULL): the budget per
 * rank, as --memory. An exit code. */
int loom_cli_auto_batch(const char *config_path, const char *const *sets,
                        int n_sets, const char *memory, loom_config *cfg);
int loom_cmd_bench(int argc, char **argv);     /* bench.c */
int loom_bench_gemm(int argc, char **argv);    /* bench_gemm.c */
int loom_bench_comm(int argc, char **argv);    /* bench_comm.c */
int loom_bench_train(int argc, char **argv);   /* bench_train.c */
int loom_bench_kernels(int argc, char **argv); /* bench_kernels.c */

#endif
