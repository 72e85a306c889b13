/* loom report: what a run did. This release: --trace, the ranks' timeline
 * files merged into one for Perfetto's UI or chrome://tracing. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/obs.h"

static void usage(FILE *f) {
  fprintf(
      f, "usage: loom report --trace RUN [-o FILE]\n\n"
         "  --trace RUN   merge the timeline of every rank (RUN/trace/\n"
         "                rank-K.json, written with log.trace: true; or a\n"
         "                directory of rank-K.json files, as LOOM_TRACE=DIR\n"
         "                writes them) into one trace: a process per rank, on\n"
         "                one time line. Open it in https://ui.perfetto.dev\n"
         "                or chrome://tracing.\n"
         "  -o FILE       where (default RUN/trace.json)\n\n"
         "The HTML report with plots and a verdict is not in this release.\n");
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int loom_cmd_report(int argc, char **argv) {
  const char *run = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return LOOM_EXIT_OK;
    }
    if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
      run = argv[++i];
    } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      out = argv[++i];
    } else {
      fprintf(stderr, "loom report: unexpected argument '%s'\n", argv[i]);
      usage(stderr);
      return LOOM_EXIT_USAGE;
    }
  }
  if (!run) {
    fprintf(stderr, "loom report: --trace RUN is required (the HTML report "
                    "is not in this release)\n");
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }
  char dir[4096], dflt[4096];
  int n = snprintf(dir, sizeof dir, "%s/trace", run);
  if (n < 0 || (size_t)n >= sizeof dir) {
    fprintf(stderr, "loom report: path too long: %s\n", run);
    return LOOM_EXIT_USAGE;
  }
  if (!is_dir(dir))
    snprintf(dir, sizeof dir, "%s", run); /* the files themselves */
  if (!out) {
    snprintf(dflt, sizeof dflt, "%s/trace.json", run);
    out = dflt;
  }
  loom_trace_merge_info info;
  loom_status s = loom_trace_merge(dir, out, &info);
  if (s != LOOM_OK) {
    fprintf(stderr, "loom report: %s\n", loom_last_error());
    return LOOM_EXIT_FAIL;
  }
  printf("%s: %d rank%s, %llu events, aligned by the %s clock (open it in "
         "https://ui.perfetto.dev or chrome://tracing)\n",
         out, info.ranks, info.ranks == 1 ? "" : "s",
         (unsigned long long)info.events,
         info.one_host ? "host's monotonic" : "wall");
  return LOOM_EXIT_OK;
}
