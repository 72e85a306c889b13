/* log.mlflow: rank 0's MLflow run. Opened with the metrics: the
 * configuration as parameters, tags for the job, every number of
 * metrics.jsonl through the metrics sink; at the end (finished, stopped or
 * failed) the report is written and config.yaml, env.json and report.html
 * go up as artifacts. A resumed
 * run goes on with the same MLflow run (RUN/mlflow_run_id), and metrics.jsonl's
 * lines up to the resume step are sent again for what the server lacks. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "trainer.h"

/* The run id an earlier attempt wrote ("" when none, or when the file
 * holds none: said, and a new run started). */
static void read_run_id(const char *dir, char *out, size_t n) {
  if (loom_mlflow_read_run_id(dir, out, n) != LOOM_OK)
    LOOM_WARN("%s: starting a new run", loom_last_error());
}

static void log_params(loom_trainer *t) {
  size_t n;
  const loom_config_key *keys = loom_config_keys(&n);
  char value[LOOM_CONFIG_STR_MAX * 2];
  for (size_t i = 0; i < n; i++)
    if (loom_config_format(&t->cfg, &keys[i], value, sizeof value) == LOOM_OK)
      loom_mlflow_param(t->mlflow, keys[i].path, value);
}

static void log_tags(loom_trainer *t) {
  char v[256];
  snprintf(v, sizeof v, "%d", t->nranks);
  loom_mlflow_tag(t->mlflow, "loom.ranks", v);
  loom_mlflow_tag(t->mlflow, "loom.strategy", loom_train_strategy_name(t));
  gethostname(v, sizeof v - 1);
  v[sizeof v - 1] = '\0';
  loom_mlflow_tag(t->mlflow, "loom.host", v);
  loom_mlflow_tag(t->mlflow, "loom.version", loom_version());
  if (loom_train_git_commit()[0])
    loom_mlflow_tag(t->mlflow, "mlflow.source.git.commit",
                    loom_train_git_commit());
  loom_mlflow_tag(t->mlflow, "loom.run_dir", t->cfg.log.run_dir);
}

/* On the MLflow sender thread, once the server made the run: its id into
 * the run directory, where a restarted or resumed job finds it. The run
 * directory's path is the trainer's config, unchanged while it runs. */
static void note_run(const char *id, void *ctx) {
  const loom_trainer *t = ctx;
  if (loom_fs_write_atomic(t->cfg.log.run_dir, LOOM_MLFLOW_RUN_ID_FILE, id,
                           strlen(id)) != LOOM_OK)
    LOOM_WARN("mlflow: %s (a resumed run will start a new MLflow run)",
              loom_last_error());
}

loom_status loom_train_mlflow_open(loom_trainer *t) {
  const loom_config_log *lc = &t->cfg.log;
  if (!lc->mlflow_uri[0] || t->mlflow)
    return LOOM_OK;
  char resume[128] = "";
  if (t->step > 0)
    read_run_id(lc->run_dir, resume, sizeof resume);
  const char *name = lc->mlflow_run_name;
  if (!name[0]) { /* the run directory's last part */
    const char *d = lc->run_dir, *slash = strrchr(d, '/');
    name = slash && slash[1] ? slash + 1 : d;
  }
  loom_mlflow_opts o = loom_mlflow_opts_default();
  o.uri = lc->mlflow_uri;
  o.experiment = lc->mlflow_experiment;
  o.run_name = name;
  o.run_id = resume;
  o.on_run = note_run;
  o.on_run_ctx = t;
  /* What the earlier attempt logged up to the resume step, sent again for
   * what the server lacks: a crash loses what was queued. */
  char jsonl[LOOM_CONFIG_STR_MAX + 32];
  snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", lc->run_dir);
  if (t->step > 0 && lc->metrics) {
    o.replay_jsonl = jsonl;
    o.replay_to_step = t->step;
  }
  LOOM_TRY(loom_mlflow_open(&t->mlflow, &o));
  snprintf(t->mlflow_status, sizeof t->mlflow_status, "FAILED");
  if (!resume[0])
    log_params(t);
  log_tags(t);
  return LOOM_OK;
}

/* RUN/report.html written, then config.yaml, env.json and report.html
 * queued as artifacts. A failed run's files may be missing (it failed
 * before writing them): said, not warned. */
static void upload_artifacts(loom_trainer *t, bool failed) {
  const char *dir = t->cfg.log.run_dir;
  char path[LOOM_CONFIG_STR_MAX + 32];
  snprintf(path, sizeof path, "%s/report.html", dir);
  if (loom_report_write(dir, path, NULL, NULL) != LOOM_OK) {
    if (failed)
      LOOM_INFO("mlflow: the report for the artifacts: %s", loom_last_error());
    else
      LOOM_WARN("mlflow: the report for the artifacts: %s", loom_last_error());
  }
  static const char *const files[] = {"config.yaml", "env.json", "report.html"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (loom_mlflow_artifact(t->mlflow, path, files[i]) == LOOM_OK)
      continue;
    if (failed)
      LOOM_INFO("mlflow: artifact %s: %s", files[i], loom_last_error());
    else
      LOOM_WARN("mlflow: artifact %s: %s", files[i], loom_last_error());
  }
}

void loom_train_mlflow_finish(loom_trainer *t, bool finished) {
  if (!t->mlflow)
    return;
  upload_artifacts(t, false);
  snprintf(t->mlflow_status, sizeof t->mlflow_status, "%s",
           finished ? "FINISHED" : "KILLED");
}

void loom_train_mlflow_close(loom_trainer *t) {
  if (!t->mlflow)
    return;
  /* A failed run (finish never came: a diverged loss, an error) uploads
   * what someone debugging it wants too: its config, env and report. */
  if (!strcmp(t->mlflow_status, "FAILED"))
    upload_artifacts(t, true);
  /* What is still queued has this long to reach the server. */
  loom_mlflow_close(t->mlflow, t->mlflow_status, 30);
  t->mlflow = NULL;
}
