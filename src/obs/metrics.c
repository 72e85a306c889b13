/* Metric sinks: one JSON object per line in RUN_DIR/metrics.jsonl, and the
 * same numbers as TensorBoard scalars in RUN_DIR/tb/. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "loom/obs.h"

enum { TB_MAX = 64 }; /* scalars a line may carry to TensorBoard */

struct loom_metrics {
  FILE *f; /* NULL without metrics.jsonl */
  char path[1024];
  char line[65536]; /* room for per-rank arrays of 1000+ ranks */
  size_t len;
  bool overflow;
  /* Between loom_metrics_begin and loom_metrics_end; the first misuse of
   * the line (a NULL key, a call outside a line), which end reports and
   * for which it writes nothing. */
  bool in_line;
  const char *misuse;
  /* TensorBoard: the line's numbers, its step and time. */
  loom_tb *tb;
  int ntb;
  char tb_tags[TB_MAX][48];
  double values[TB_MAX]; /* MLflow's; TensorBoard gets them as f32 */
  loom_mlflow *mlflow;   /* borrowed, or NULL */
  int64_t step;
  double time;
  /* A resumed metrics.jsonl (append, keep_to_step): whether its kept lines
   * hold an evaluation (a val_loss) at keep_to_step. */
  bool kept_eval;
};

loom_metrics_opts loom_metrics_opts_default(void) {
  loom_metrics_opts o = {
      .jsonl = true, .tensorboard = false, .append = false, .keep_to_step = -1};
  return o;
}

/* The byte at which metrics.jsonl stops holding steps <= keep: the start of
 * its first line of a later step, or of a last line without its newline;
 * and whether a kept line of step keep is an evaluation's (*eval). */
static loom_status cut_offset(FILE *r, const char *path, int64_t keep,
                              off_t *cut, bool *eval) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  off_t at = 0;
  *cut = -1;
  while ((n = getline(&line, &cap, r)) > 0) {
    const char *k = strstr(line, "\"step\":");
    if (line[n - 1] != '\n' ||
        (k && strtoll(k + 7, NULL, 10) > (long long)keep)) {
      *cut = at;
      break;
    }
    if (k && strtoll(k + 7, NULL, 10) == (long long)keep &&
        strstr(line, "\"val_loss\":"))
      *eval = true;
    at += (off_t)n;
  }
  bool err = ferror(r) != 0;
  free(line);
  if (err)
    return loom_error(LOOM_ERR_IO, "%s: cannot read: %s", path,
                      strerror(errno));
  return LOOM_OK;
}

/* A resumed run's metrics.jsonl: the lines of steps after the checkpoint it
 * resumes from belong to the timeline it abandons, and the run logs those
 * steps again; they are cut off so that each step appears once. The file
 * read is the one open for appending (same inode), never a link. */
static loom_status cut_later_steps(const char *path, FILE *w, int64_t keep,
                                   bool *eval) {
  int rfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  struct stat rs, ws;
  if (rfd < 0 || fstat(rfd, &rs) != 0 || fstat(fileno(w), &ws) != 0 ||
      rs.st_dev != ws.st_dev || rs.st_ino != ws.st_ino) {
    int e = errno;
    if (rfd >= 0)
      close(rfd);
    return loom_error(LOOM_ERR_IO, "%s: cannot read it back: %s", path,
                      rfd < 0 ? strerror(e) : "the file was replaced");
  }
  FILE *r = fdopen(rfd, "r");
  if (!r) {
    close(rfd);
    return loom_error(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
  }
  off_t cut = -1;
  loom_status s = cut_offset(r, path, keep, &cut, eval);
  fclose(r);
  if (s == LOOM_OK && cut >= 0) {
    if (ftruncate(fileno(w), cut) != 0)
      return loom_error(LOOM_ERR_IO, "%s: cannot cut it at byte %lld: %s", path,
                        (long long)cut, strerror(errno));
    LOOM_INFO("%s: %lld bytes of steps after %lld cut off (resuming from "
              "step %lld logs them again)",
              path, (long long)(rs.st_size - cut), (long long)keep,
              (long long)keep);
  }
  return s;
}

loom_status loom_metrics_open_opts(loom_metrics **out, const char *run_dir,
                                   const loom_metrics_opts *opts) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_metrics_open: out is NULL");
  *out = NULL;
  if (!run_dir)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_metrics_open: run_dir is NULL");
  loom_metrics_opts o = opts ? *opts : loom_metrics_opts_default();
  LOOM_TRY(loom_fs_mkdirs(run_dir, 0755));
  loom_metrics *m = loom_calloc(1, sizeof *m);
  if (!m)
    return LOOM_ERR_NOMEM;
  loom_status s = LOOM_OK;
  if (o.jsonl) {
    snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", run_dir);
    /* A link planted in its place is refused, never written through (nor
     * a file hard-linked to another's); a fresh run truncates only loom's
     * own file. */
    s = loom_fs_open_append(m->path, !o.append, &m->f);
    if (s == LOOM_OK && o.append && o.keep_to_step >= 0)
      s = cut_later_steps(m->path, m->f, o.keep_to_step, &m->kept_eval);
  }
  if (s == LOOM_OK && o.tensorboard) {
    char dir[1024];
    int n = snprintf(dir, sizeof dir, "%s/tb", run_dir);
    s = n < 0 || (size_t)n >= sizeof dir
            ? loom_error(LOOM_ERR_INVALID_ARG, "run directory too long: '%s'",
                         run_dir)
            : loom_tb_open(&m->tb, dir);
    /* A resumed run logs the steps after keep_to_step again: TensorBoard
     * forgets what earlier files hold of them, as metrics.jsonl is cut. */
    if (s == LOOM_OK && o.append && o.keep_to_step >= 0)
      s = loom_tb_restart(m->tb, o.keep_to_step + 1, loom_time_wall());
  }
  if (s != LOOM_OK) {
    loom_metrics_close(m);
    return s;
  }
  m->mlflow = o.mlflow;
  *out = m;
  return LOOM_OK;
}

loom_status loom_metrics_open(loom_metrics **out, const char *run_dir,
                              bool append) {
  loom_metrics_opts o = loom_metrics_opts_default();
  o.append = append;
  return loom_metrics_open_opts(out, run_dir, &o);
}

const char *loom_metrics_path(const loom_metrics *m) {
  return m ? m->path : "";
}

bool loom_metrics_kept_eval(const loom_metrics *m) { return m && m->kept_eval; }

const char *loom_metrics_tb_path(const loom_metrics *m) {
  return m ? loom_tb_path(m->tb) : "";
}

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
  if (!m)
    return;
  m->in_line = true;
  m->misuse = NULL;
  m->len = 0;
  m->overflow = false;
  m->ntb = 0;
  m->step = 0;
  m->time = loom_time_wall();
  append(m, "{");
}

/* A number for TensorBoard: all but the line's coordinates. */
static void tb_note(loom_metrics *m, const char *k, double v) {
  if (!strcmp(k, "step"))
    m->step = (int64_t)v;
  else if (!strcmp(k, "time"))
    m->time = v;
  else if (strcmp(k, "epoch") != 0 && strcmp(k, "ranks") != 0 &&
           m->ntb < TB_MAX) {
    snprintf(m->tb_tags[m->ntb], sizeof m->tb_tags[0], "%s", k);
    m->values[m->ntb++] = v;
  }
}

/* s as a JSON string, quoted and escaped. */
static void string(loom_metrics *m, const char *s) {
  append(m, "\"");
  while (*s) {
    /* a run that needs no escape, in one append (keys are such runs) */
    size_t n = 0;
    while (s[n] && s[n] != '"' && s[n] != '\\' && (unsigned char)s[n] >= 0x20)
      n++;
    if (n)
      append(m, "%.*s", (int)n, s);
    s += n;
    if (*s == '"' || *s == '\\')
      append(m, "\\%c", *s++);
    else if (*s)
      append(m, "\\u%04x", (unsigned)*s++);
  }
  append(m, "\"");
}

/* Writes the key of the next member; false (the line marked bad, m NULL
 * ignored) when the call cannot add one. */
static bool key(loom_metrics *m, const char *k, const char *call) {
  if (!m)
    return false;
  if (!m->in_line || !k) {
    if (!m->misuse)
      m->misuse = !m->in_line ? call : "a NULL key";
    return false;
  }
  if (m->len > 1)
    append(m, ",");
  string(m, k);
  append(m, ":");
  return true;
}

/* Writes v; returns the number the line holds (v read back), which the
 * other sinks get: a resumed run sends metrics.jsonl's values to MLflow
 * again, and the server skips a value only when it is the same double. */
static double number(loom_metrics *m, double v) {
  char b[64];
  if (isfinite(v) && fabs(v) >= 1e6 && fabs(v) < 1e15)
    snprintf(b, sizeof b, "%.3f", v); /* Unix seconds keep their ms */
  else if (isfinite(v))
    snprintf(b, sizeof b, "%.9g", v);
  else {
    append(m, "null"); /* JSON has no NaN or infinity */
    return v;
  }
  append(m, "%s", b);
  return strtod(b, NULL);
}

void loom_metrics_int(loom_metrics *m, const char *k, int64_t v) {
  if (!key(m, k, "loom_metrics_int outside a line"))
    return;
  append(m, "%lld", (long long)v);
  tb_note(m, k, (double)v);
}

void loom_metrics_num(loom_metrics *m, const char *k, double v) {
  if (!key(m, k, "loom_metrics_num outside a line"))
    return;
  tb_note(m, k, number(m, v));
}

void loom_metrics_nums(loom_metrics *m, const char *k, const double *v, int n) {
  if (m && m->in_line && (n < 0 || (n > 0 && !v))) {
    if (!m->misuse)
      m->misuse = "loom_metrics_nums with a NULL array or a negative count";
    return;
  }
  if (!key(m, k, "loom_metrics_nums outside a line"))
    return;
  append(m, "[");
  for (int i = 0; i < n; i++) {
    if (i)
      append(m, ",");
    number(m, v[i]);
  }
  append(m, "]");
}

void loom_metrics_str(loom_metrics *m, const char *k, const char *v) {
  if (!key(m, k, "loom_metrics_str outside a line"))
    return;
  if (v)
    string(m, v);
  else
    append(m, "null");
}

loom_status loom_metrics_end(loom_metrics *m) {
  if (!m)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_metrics_end: metrics is NULL");
  if (!m->in_line)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_metrics_end: no line begun (loom_metrics_begin)");
  m->in_line = false;
  if (m->misuse)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "metrics line for '%s' not written: %s", m->path,
                      m->misuse);
  append(m, "}\n");
  if (m->overflow)
    return loom_error(LOOM_ERR_INTERNAL, "metrics line too long for '%s'",
                      m->path);
  if (m->f && (fwrite(m->line, 1, m->len, m->f) != m->len || fflush(m->f) != 0))
    return loom_error(LOOM_ERR_IO, "cannot write '%s': %s", m->path,
                      strerror(errno));
  for (int i = 0; m->mlflow && i < m->ntb; i++)
    loom_mlflow_metric(m->mlflow, m->tb_tags[i], m->values[i], m->step,
                       m->time);
  if (m->tb && m->ntb > 0) {
    const char *tags[TB_MAX];
    float values[TB_MAX];
    for (int i = 0; i < m->ntb; i++) {
      tags[i] = m->tb_tags[i];
      values[i] = (float)m->values[i];
    }
    return loom_tb_scalars(m->tb, m->step, m->time, tags, values, m->ntb);
  }
  return LOOM_OK;
}

void loom_metrics_close(loom_metrics *m) {
  if (!m)
    return;
  if (m->f)
    fclose(m->f);
  loom_tb_close(m->tb);
  loom_free(m);
}

bool loom_obs_json_whole(const cJSON *v, double lo, double hi) {
  return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
         v->valuedouble == floor(v->valuedouble);
}

FILE *loom_obs_open_read(const char *path) {
  /* A FIFO without a writer is refused at once, never waited for. */
  int fd = loom_fs_open_read_at(AT_FDCWD, path, 0, NULL);
  if (fd < 0) {
    loom_error(LOOM_ERR_IO, "cannot read %s: %s", path,
               errno == LOOM_FS_ENOTREG ? "not a regular file (a pipe, "
                                          "device, socket or directory)"
                                        : strerror(errno));
    return NULL;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    loom_error(LOOM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    close(fd);
  }
  return f;
}

loom_status loom_obs_read_file(const char *path, char **data, size_t *len) {
  *data = NULL;
  if (len)
    *len = 0;
  FILE *f = loom_obs_open_read(path);
  if (!f)
    return LOOM_ERR_IO;
  loom_status st = LOOM_OK;
  size_t cap = 0, n = 0;
  char *buf = NULL;
  for (;;) {
    if (n == cap) { /* room for the NUL too */
      size_t c = cap ? cap * 2 : 64 * 1024;
      char *b = loom_malloc(c + 1);
      if (!b) {
        st = LOOM_ERR_NOMEM;
        break;
      }
      if (n)
        memcpy(b, buf, n);
      loom_free(buf);
      buf = b;
      cap = c;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) {
      if (ferror(f))
        st = loom_error(LOOM_ERR_IO, "cannot read %s: %s", path,
                        strerror(errno));
      break;
    }
  }
  fclose(f);
  if (st != LOOM_OK) {
    loom_free(buf);
    return st;
  }
  buf[n] = '\0';
  *data = buf;
  if (len)
    *len = n;
  return LOOM_OK;
}
