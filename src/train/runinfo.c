/* What a run was: RUN/config.yaml (the whole resolved configuration, every
 * key) and RUN/env.json (loom's version and commit, the host, the CPU and
 * the kernels chosen, ranks and threads, when it started), written by rank
 * 0 as training starts, for loom report and MLflow. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/kernels.h"
#include "trainer.h"

#ifndef LOOM_GIT_COMMIT
#define LOOM_GIT_COMMIT ""
#endif

/* /proc/cpuinfo's first "model name" ("" when there is none). */
static void cpu_model(char *out, size_t n) {
  out[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    const char *v = strchr(line, ':');
    if (v) {
      v++;
      while (*v == ' ' || *v == '\t')
        v++;
      snprintf(out, n, "%s", v);
      out[strcspn(out, "\n")] = '\0';
    }
    break;
  }
  fclose(f);
}

const char *loom_train_git_commit(void) { return LOOM_GIT_COMMIT; }

const char *loom_train_strategy_name(const loom_trainer *t) {
  if (t->nranks <= 1)
    return "single";
  /* the data-parallel part first: ddp, or ZeRO's stage over the
   * replicas */
  const char *dp = t->zero == 1   ? "zero1+"
                   : t->zero == 2 ? "zero2+"
                   : t->zero == 3 ? "zero3+"
                                  : "ddp+";
  static char name[48];
  if (t->pipe || t->tps > 1) {
    snprintf(name, sizeof name, "%s%s%s%s", t->replicas > 1 ? dp : "",
             t->tps > 1 ? "tensor" : "", t->pipe && t->tps > 1 ? "+" : "",
             t->pipe ? "pipeline" : "");
    return name;
  }
  switch (t->zero) {
  case 1:
    return "zero1";
  case 2:
    return "zero2";
  case 3:
    return "zero3";
  default:
    return "ddp";
  }
}

static loom_status env_json(const loom_trainer *t, char **out) {
  cJSON *o = cJSON_CreateObject();
  if (!o)
    return LOOM_ERR_NOMEM;
  char host[256] = "", model[256], when[64];
  gethostname(host, sizeof host - 1);
  cpu_model(model, sizeof model);
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const loom_cpu_features *f = loom_cpu_get_features();
  char onednn[16]; /* the oneDNN loom runs on ("2.6"; "none") */
  if (loom_dnnl_version() > 0)
    snprintf(onednn, sizeof onednn, "%d.%d", loom_dnnl_version() / 100,
             loom_dnnl_version() % 100);
  else
    snprintf(onednn, sizeof onednn, "none");
  char flags[160];
  snprintf(flags, sizeof flags, "%s%s%s%s%s%s%s", f->avx2 ? "avx2 " : "",
           f->fma ? "fma " : "", f->avx512f ? "avx512f " : "",
           f->avx512_bf16 ? "avx512_bf16 " : "",
           f->avx512_fp16 ? "avx512_fp16 " : "", f->amx_tile ? "amx_tile " : "",
           f->amx_bf16 ? "amx_bf16 " : "");
  size_t fl = strlen(flags);
  if (fl && flags[fl - 1] == ' ')
    flags[fl - 1] = '\0';
  bool ok =
      cJSON_AddStringToObject(o, "loom_version", loom_version()) &&
      cJSON_AddStringToObject(o, "git_commit", LOOM_GIT_COMMIT) &&
      cJSON_AddStringToObject(o, "started", when) &&
      cJSON_AddNumberToObject(o, "start_step", (double)t->step) &&
      cJSON_AddStringToObject(o, "host", host) &&
      cJSON_AddNumberToObject(o, "ranks", t->nranks) &&
      cJSON_AddNumberToObject(o, "threads_per_rank", loom_threads()) &&
      cJSON_AddStringToObject(o, "strategy", loom_train_strategy_name(t)) &&
      cJSON_AddStringToObject(o, "cpu", model) &&
      cJSON_AddStringToObject(o, "cpu_flags", flags) &&
      cJSON_AddStringToObject(o, "kernels", loom_isa_name(loom_cpu_isa())) &&
      cJSON_AddStringToObject(
          o, "gemm", loom_gemm_backend_name(loom_gemm_get_backend())) &&
      cJSON_AddStringToObject(o, "onednn", onednn) &&
      /* the whole model's (a tensor-parallel rank holds a part) */
      cJSON_AddNumberToObject(
          o, "parameters",
          (double)loom_model_num_params(t->whole ? t->whole : t->model)) &&
      cJSON_AddNumberToObject(o, "total_steps", (double)t->total_steps);
  char *s = ok ? cJSON_Print(o) : NULL;
  cJSON_Delete(o);
  if (!s)
    return LOOM_ERR_NOMEM;
  *out = s;
  return LOOM_OK;
}

loom_status loom_train_write_run_info(const loom_trainer *t) {
  const char *dir = t->cfg.log.run_dir;
  char *yaml = NULL, *env = NULL;
  loom_status s = loom_config_to_yaml(&t->cfg, &yaml);
  if (s == LOOM_OK)
    s = loom_fs_write_atomic(dir, "config.yaml", yaml, strlen(yaml));
  if (s == LOOM_OK)
    s = env_json(t, &env);
  if (s == LOOM_OK)
    s = loom_fs_write_atomic(dir, "env.json", env, strlen(env));
  loom_free(yaml);
  cJSON_free(env);
  return s;
}
