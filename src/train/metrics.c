/* Metric sinks: one JSON object per line in RUN_DIR/metrics.jsonl. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/train.h"

struct loom_metrics {
  FILE *f;
  char path[1024];
  char line[4096];
  size_t len;
  bool overflow;
};

/* mkdir -p */
loom_status loom_mkdirs(const char *path) {
  char buf[1024];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf)
    return loom_error(LOOM_ERR_INVALID_ARG, "bad directory path '%s'", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return loom_error(LOOM_ERR_IO, "cannot create directory '%s': %s",
                          buf, strerror(errno));
      buf[i] = c;
    }
  }
  return LOOM_OK;
}

loom_status loom_metrics_open(loom_metrics **out, const char *run_dir,
                              bool append) {
  *out = NULL;
  LOOM_TRY(loom_mkdirs(run_dir));
  loom_metrics *m = loom_calloc(1, sizeof *m);
  if (!m)
    return LOOM_ERR_NOMEM;
  snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", run_dir);
  m->f = fopen(m->path, append ? "a" : "w");
  if (!m->f) {
    loom_status s = loom_error(LOOM_ERR_IO, "cannot open '%s': %s", m->path,
                               strerror(errno));
    loom_free(m);
    return s;
  }
  *out = m;
  return LOOM_OK;
}

const char *loom_metrics_path(const loom_metrics *m) { return m->path; }

static void append(loom_metrics *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void append(loom_metrics *m, const char *fmt, ...) {
  if (m->overflow)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(m->line + m->len, sizeof m->line - m->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof m->line - m->len)
    m->overflow = true;
  else
    m->len += (size_t)n;
}

void loom_metrics_begin(loom_metrics *m) {
  m->len = 0;
  m->overflow = false;
  append(m, "{");
}

static void key(loom_metrics *m, const char *k) {
  append(m, "%s\"%s\":", m->len > 1 ? "," : "", k);
}

void loom_metrics_int(loom_metrics *m, const char *k, int64_t v) {
  key(m, k);
  append(m, "%lld", (long long)v);
}

void loom_metrics_num(loom_metrics *m, const char *k, double v) {
  key(m, k);
  if (isfinite(v) && fabs(v) >= 1e6 && fabs(v) < 1e15)
    append(m, "%.3f", v); /* times in Unix seconds keep their milliseconds */
  else if (isfinite(v))
    append(m, "%.9g", v);
  else
    append(m, "null"); /* JSON has no NaN or infinity */
}

void loom_metrics_str(loom_metrics *m, const char *k, const char *v) {
  key(m, k);
  append(m, "\"");
  for (const char *c = v; *c; c++) {
    if (*c == '"' || *c == '\\')
      append(m, "\\%c", *c);
    else if ((unsigned char)*c < 0x20)
      append(m, "\\u%04x", (unsigned)*c);
    else
      append(m, "%c", *c);
  }
  append(m, "\"");
}

loom_status loom_metrics_end(loom_metrics *m) {
  append(m, "}\n");
  if (m->overflow)
    return loom_error(LOOM_ERR_INTERNAL, "metrics line too long for '%s'",
                      m->path);
  if (fwrite(m->line, 1, m->len, m->f) != m->len || fflush(m->f) != 0)
    return loom_error(LOOM_ERR_IO, "cannot write '%s': %s", m->path,
                      strerror(errno));
  return LOOM_OK;
}

void loom_metrics_close(loom_metrics *m) {
  if (!m)
    return;
  if (m->f)
    fclose(m->f);
  loom_free(m);
}
