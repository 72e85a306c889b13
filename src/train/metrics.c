/* Metric sinks: one JSON object per line in RUN_DIR/metrics.jsonl. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "loom/train.h"

struct loom_metrics {
  FILE *f;
  char path[1024];
  char line[4096];
  size_t len;
  bool overflow;
};

loom_status loom_mkdirs(const char *path) { return loom_fs_mkdirs(path, 0755); }

loom_status loom_metrics_open(loom_metrics **out, const char *run_dir,
                              bool append) {
  *out = NULL;
  LOOM_TRY(loom_fs_mkdirs(run_dir, 0755));
  loom_metrics *m = loom_calloc(1, sizeof *m);
  if (!m)
    return LOOM_ERR_NOMEM;
  snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", run_dir);
  /* A link planted in its place is refused, never written through (nor a
   * file hard-linked to another's); a fresh run truncates only loom's own
   * file. */
  loom_status s = loom_fs_open_append(m->path, !append, &m->f);
  if (s != LOOM_OK) {
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
