/* loom: the command-line tool. Dispatches to one subcommand per file. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "loom/core.h"
#include "loom/kernels.h"

static const loom_cli_cmd commands[] = {
#define LOOM_X_CMD(name, fn, help) {name, fn, help},
    LOOM_CLI_COMMANDS(LOOM_X_CMD)
#undef LOOM_X_CMD
};

static void discard_and_die(int sig) {
  loom_fs_discard_pending();
  signal(sig, SIG_DFL);
  raise(sig);
}

void loom_cli_discard_on_stop(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = discard_and_die;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

static void usage(FILE *f) {
  fprintf(f,
          "loom %s: train neural networks across cores, processes and "
          "machines\n\nusage: loom <command> [options]\n\ncommands:\n",
          loom_version());
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "  %-10s %s\n", "help CMD",
          "what CMD does and its options "
          "(the same as loom CMD --help)");
  fprintf(f, "\noptions:\n  --version  print loom's version\n  --help     "
             "this text\n\n'loom help <command>' describes each command; "
             "man loom-<command> (after make install) too.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      (strcmp(argv[1], "help") == 0 && argc == 2)) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "help") == 0) { /* loom help CMD: CMD --help */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
      if (strcmp(argv[2], commands[i].name) == 0) {
        char *hv[] = {argv[2], "--help", NULL};
        return commands[i].fn(2, hv);
      }
    fprintf(stderr, "loom help: unknown command '%s'\n", argv[2]);
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("loom %s\n", loom_version());
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) {
      if (loom_cpu_check() != LOOM_OK) { /* LOOM_ISA asks for the impossible: */
        fprintf(stderr, "loom: %s\n", loom_last_error()); /* not retried */
        return LOOM_EXIT_USAGE;
      }
      return commands[i].fn(argc - 1, argv + 1);
    }
  fprintf(stderr, "loom: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return LOOM_EXIT_USAGE;
}
