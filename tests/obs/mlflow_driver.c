/* A program for tests/obs/mlflow.sh: logs to a real MLflow server through
 * loom's client, in one of two ways.
 *
 *   mlflow_driver basic URI EXPERIMENT ARTIFACT
 *     params, tags, metrics loss = 1/(s+1), acc = s/50, lr = s*0.25 at
 *     steps s = 0..49 (wall time 1700000000 + s), nan_metric NaN and
 *     inf_metric +inf at step 0, ARTIFACT as config.yaml and
 *     sub/data.bin; closes FINISHED.
 *   mlflow_driver outage URI EXPERIMENT
 *     metric x = 1.5 s at steps 0..99, waits until they are sent, says
 *     "sent" and reads a line (the server is killed meanwhile); steps
 *     100..199, waits until a request failed, says "logged" with the
 *     calls' time, reads a line (the server is back); steps 200..299;
 *     closes FINISHED with a deadline of 30 s.
 *
 * Prints "run_id=ID" and the client's stats; what reached the server is
 * for the script to check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/obs.h"

static void stats_line(const loom_mlflow *m, const char *what) {
  loom_mlflow_stats s;
  loom_mlflow_get_stats(m, &s);
  printf("%s: sent=%llu dropped=%llu pending=%llu failures=%llu connected=%d\n",
         what, (unsigned long long)s.sent, (unsigned long long)s.dropped,
         (unsigned long long)s.pending, (unsigned long long)s.failures,
         s.connected);
  fflush(stdout);
}

/* Polls the stats until pending is 0 (want_failure: until a request
 * failed) or limit seconds pass. */
static bool wait_for(const loom_mlflow *m, bool want_failure, double limit) {
  double end = loom_time_now() + limit;
  loom_mlflow_stats s;
  for (;;) {
    loom_mlflow_get_stats(m, &s);
    if (want_failure ? (s.failures > 0 && !s.connected) : s.pending == 0)
      return true;
    if (loom_time_now() > end)
      return false;
    usleep(10000);
  }
}

static void wait_run_id(const loom_mlflow *m) {
  double end = loom_time_now() + 60;
  while (!loom_mlflow_run_id(m)[0] && loom_time_now() < end)
    usleep(10000);
  printf("run_id=%s\n", loom_mlflow_run_id(m));
  fflush(stdout);
}

static void read_go(void) {
  char line[64];
  if (!fgets(line, sizeof line, stdin))
    fprintf(stderr, "mlflow_driver: no line on stdin\n");
}

/* n calls from step `from`; returns the longest call's time. */
static double log_x(loom_mlflow *m, int from, int n, double *total) {
  double longest = 0, t_all = loom_time_now();
  for (int s = from; s < from + n; s++) {
    double t0 = loom_time_now();
    loom_mlflow_metric(m, "x", 1.5 * s, s, 0);
    double dt = loom_time_now() - t0;
    if (dt > longest)
      longest = dt;
  }
  *total = loom_time_now() - t_all;
  return longest;
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[1], "basic") == 0 && argc < 5)) {
    fprintf(stderr,
            "usage: mlflow_driver basic|outage URI EXPERIMENT [ARTIFACT]\n");
    return 2;
  }
  bool basic = strcmp(argv[1], "basic") == 0;
  loom_mlflow_opts o = loom_mlflow_opts_default();
  o.uri = argv[2];
  o.experiment = argv[3];
  o.run_name = basic ? "driver-basic" : "driver-outage";
  o.timeout_s = 2;
  loom_mlflow *m;
  if (loom_mlflow_open(&m, &o) != LOOM_OK) {
    fprintf(stderr, "mlflow_driver: %s\n", loom_last_error());
    return 1;
  }
  int rc = 0;
  if (basic) {
    loom_mlflow_param(m, "lr", "0.001");
    loom_mlflow_param(m, "batch_size", "32");
    loom_mlflow_param(m, "note",
                      "a \"quoted\" value, a \\ and \xc3\xbcnic\xc3\xb6"
                      "de");
    loom_mlflow_tag(m, "model", "mlp");
    loom_mlflow_tag(m, "loom.version", loom_version());
    for (int s = 0; s < 50; s++) {
      double wall = 1700000000.0 + s;
      loom_mlflow_metric(m, "loss", 1.0 / (s + 1), s, wall);
      loom_mlflow_metric(m, "acc", s / 50.0, s, wall);
      loom_mlflow_metric(m, "lr", s * 0.25, s, wall);
    }
    loom_mlflow_metric(m, "nan_metric", 0.0 / 0.0, 0, 0);
    loom_mlflow_metric(m, "inf_metric", 1.0 / 0.0, 0, 0);
    if (loom_mlflow_artifact(m, argv[4], "config.yaml") != LOOM_OK ||
        loom_mlflow_artifact(m, argv[4], "sub/data.bin") != LOOM_OK) {
      fprintf(stderr, "mlflow_driver: %s\n", loom_last_error());
      rc = 1;
    }
    wait_run_id(m);
  } else {
    double total;
    log_x(m, 0, 100, &total);
    wait_run_id(m);
    if (!wait_for(m, false, 60))
      rc = 1;
    stats_line(m, "sent");
    read_go();
    /* The server is gone: the calls still return at once. */
    double longest = log_x(m, 100, 100, &total);
    bool failed = wait_for(m, true, 60);
    printf("logged: 100 calls in %.3f ms, longest %.3f ms, failure seen %d\n",
           total * 1e3, longest * 1e3, failed);
    stats_line(m, "down");
    read_go();
    log_x(m, 200, 100, &total);
  }
  stats_line(m, "closing");
  double t0 = loom_time_now();
  loom_mlflow_close(m, "FINISHED", 30);
  printf("closed in %.2f s\n", loom_time_now() - t0);
  return rc;
}
