/* The subcommands of the loom tool; each lives in its own file. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

/* Exit codes of the tool. */
#define LOOM_EXIT_OK 0
#define LOOM_EXIT_FAIL 1  /* a run failed (I/O, numerical, remote rank) */
#define LOOM_EXIT_USAGE 2 /* bad command line or configuration */
/* A save failed for lack of space (ENOSPC, EDQUOT) or on a read-only file
 * system (EROFS): a restart would fail the same way, so loom run does not
 * restart it (sysexits' EX_IOERR). */
#define LOOM_EXIT_NOSPACE 74

typedef int (*loom_cli_fn)(int argc, char **argv);

typedef struct loom_cli_cmd {
  const char *name;
  loom_cli_fn fn;
  const char *help;
} loom_cli_cmd;

/* One row per subcommand: name, entry point (argv[0] is the command name),
 * one-line help. */
#define LOOM_CLI_COMMANDS(X)                                                   \
  X("train", loom_cmd_train, "train a model from a YAML config")             \
  X("run", loom_cmd_run, "launch N ranks (mpirun or srun) and supervise them") \
  X("data", loom_cmd_data, "prepare data sets (e.g. the KJV text)")           \
  X("ckpt", loom_cmd_ckpt, "inspect checkpoints")                             \
  X("config", loom_cmd_config, "check a config, show it resolved, list keys")  \
  X("bench", loom_cmd_bench, "measure kernels and collectives")

int loom_cmd_train(int argc, char **argv); /* train.c */
int loom_cmd_run(int argc, char **argv);   /* run.c */
int loom_cmd_data(int argc, char **argv);  /* data.c */
int loom_cmd_ckpt(int argc, char **argv);  /* ckpt.c */
int loom_cmd_config(int argc, char **argv); /* config.c */
int loom_cmd_bench(int argc, char **argv); /* bench.c */
int loom_bench_gemm(int argc, char **argv); /* bench_gemm.c */
int loom_bench_comm(int argc, char **argv); /* bench_comm.c */
int loom_bench_train(int argc, char **argv); /* bench_train.c */

#endif
