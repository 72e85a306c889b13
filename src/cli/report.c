/* loom report: what a run did. RUN: one HTML page with plots and a
 * verdict (and PNGs of the plots with --png); --trace RUN: the ranks'
 * timeline files merged into one for Perfetto's UI or chrome://tracing. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/obs.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: loom report RUN [-o FILE] [--png DIR]\n"
      "       loom report --trace RUN [-o FILE]\n\n"
      "  RUN           a run directory (log.run_dir): writes one HTML page\n"
      "                (default RUN/report.html, self-contained: open it in\n"
      "                any browser, offline) with a verdict on what bounds\n"
      "                the run (data loading, communication, an imbalanced\n"
      "                rank, checkpoints, or compute) and its evidence, plots\n"
      "                of loss, accuracy, learning rate, throughput, a step's\n"
      "                parts, memory by category and each rank's step, the\n"
      "                environment and the configuration. A run still\n"
      "                training shows its progress so far; run it again to\n"
      "                refresh.\n"
      "  --png DIR     also write every plot as DIR/ID.png\n"
      "  --trace RUN   merge the timeline of every rank (RUN/trace/\n"
      "                rank-K.json, written with log.trace: true; or a\n"
      "                directory of rank-K.json files, as LOOM_TRACE=DIR\n"
      "                writes them) into one trace: a process per rank, on\n"
      "                one time line (default RUN/trace.json). Open it in\n"
      "                https://ui.perfetto.dev or chrome://tracing.\n"
      "  -o FILE       where the page or the merged trace goes\n");
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int merge_trace(const char *run, const char *out) {
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
         info.one_host ? "host's monotonic"
         : info.synced ? "wall (brought to rank 0's by the offsets measured "
                         "at the start)"
                       : "wall");
  return LOOM_EXIT_OK;
}

int loom_cmd_report(int argc, char **argv) {
  const char *run = NULL, *trace = NULL, *out = NULL, *png = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return LOOM_EXIT_OK;
    }
    if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
      trace = argv[++i];
    } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      out = argv[++i];
    } else if (!strcmp(argv[i], "--png") && i + 1 < argc) {
      png = argv[++i];
    } else if (argv[i][0] != '-' && !run) {
      run = argv[i];
    } else {
      fprintf(stderr, "loom report: unexpected argument '%s'\n", argv[i]);
      usage(stderr);
      return LOOM_EXIT_USAGE;
    }
  }
  if (trace && (run || png)) {
    fprintf(stderr, "loom report: --trace RUN merges the timeline alone; "
                    "give RUN without --trace for the page\n");
    return LOOM_EXIT_USAGE;
  }
  loom_cli_discard_on_stop(); /* Ctrl-C leaves no hidden temporary */
  if (trace)
    return merge_trace(trace, out);
  if (!run) {
    fprintf(stderr, "loom report: which run? (loom report RUN)\n");
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }
  if (!is_dir(run)) {
    fprintf(stderr, "loom report: %s: not a run directory\n", run);
    return LOOM_EXIT_USAGE;
  }
  char dflt[4096];
  if (!out) {
    int n = snprintf(dflt, sizeof dflt, "%s/report.html", run);
    if (n < 0 || (size_t)n >= sizeof dflt) {
      fprintf(stderr, "loom report: path too long: %s\n", run);
      return LOOM_EXIT_USAGE;
    }
    out = dflt;
  }
  loom_report_info info;
  loom_status s = loom_report_write(run, out, png, &info);
  if (s != LOOM_OK) {
    fprintf(stderr, "loom report: %s\n", loom_last_error());
    return LOOM_EXIT_FAIL;
  }
  printf("%s: %d plots from %d metrics lines, %s at step %lld", out, info.plots,
         info.lines, info.finished ? "finished" : "in progress",
         (long long)info.last_step);
  if (info.total_steps > 0 && !info.finished)
    printf(" of %lld", (long long)info.total_steps);
  printf("\n");
  if (png)
    printf("%s: %d PNG files\n", png, info.pngs);
  printf("verdict: %s\n", info.verdict);
  return LOOM_EXIT_OK;
}
