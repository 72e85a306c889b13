/* loom report --trace: the ranks' trace files of a run merged into one,
 * each rank a process of its own, on one time line. On one host the ranks
 * share its monotonic clock, so each file's ts 0 (its loom_clock record)
 * is placed exactly; across hosts the wall clock places them (as well as
 * the hosts' clocks agree). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/obs.h"

typedef struct rank_file {
  int rank;
  char path[1200];
  double mono, wall; /* its ts 0 */
  char host[256];
  bool have_clock;
  double offset; /* loom_clock_sync: its wall clock less rank 0's */
  bool have_sync;
} rank_file;

static int cmp_rank(const void *a, const void *b) {
  const rank_file *x = a, *y = b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* One line of a trace file as an event (NULL for "[", "]" and a line cut
 * short by a crash). */
static cJSON *parse_line(char *line) {
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' ||
                   line[n - 1] == ' ' || line[n - 1] == ','))
    line[--n] = '\0';
  if (n < 2 || line[0] != '{' || line[n - 1] != '}')
    return NULL;
  cJSON *e = cJSON_Parse(line);
  if (e && !cJSON_IsObject(e)) {
    cJSON_Delete(e);
    e = NULL;
  }
  return e;
}

/* The file's clock record: its host and where its ts 0 is. */
static loom_status read_clock(rank_file *r) {
  FILE *f = fopen(r->path, "r");
  if (!f)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", r->path,
                      strerror(errno));
  char line[4096];
  /* The clock record comes first; the sync record (several ranks) soon
   * after, once the trainer measured it. */
  for (int i = 0; i < 256 && fgets(line, sizeof line, f); i++) {
    if (i >= 16 && !r->have_clock)
      break;
    if (!strstr(line, "\"loom_clock"))
      continue;
    cJSON *e = parse_line(line);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (cJSON_IsString(name) && !strcmp(name->valuestring, "loom_clock_sync") &&
        cJSON_IsObject(args)) {
      const cJSON *o = cJSON_GetObjectItemCaseSensitive(args, "offset_s");
      if (cJSON_IsNumber(o)) {
        r->offset = o->valuedouble;
        r->have_sync = true;
      }
    }
    if (cJSON_IsString(name) && !strcmp(name->valuestring, "loom_clock") &&
        cJSON_IsObject(args)) {
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(args, "monotonic_s");
      const cJSON *w = cJSON_GetObjectItemCaseSensitive(args, "wall_s");
      const cJSON *h = cJSON_GetObjectItemCaseSensitive(args, "host");
      if (cJSON_IsNumber(m) && cJSON_IsNumber(w)) {
        r->mono = m->valuedouble;
        r->wall = w->valuedouble;
        snprintf(r->host, sizeof r->host, "%s",
                 cJSON_IsString(h) ? h->valuestring : "");
        r->have_clock = true;
      }
    }
    cJSON_Delete(e);
    if (r->have_clock && r->have_sync)
      break;
  }
  fclose(f);
  if (!r->have_clock)
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: no loom_clock record in its first lines: not a "
                      "loom trace",
                      r->path);
  return LOOM_OK;
}

/* The rank files found so far (loom_fs_each_entry's context). */
typedef struct rank_list {
  const char *dir;
  rank_file *v;
  int n, cap;
  loom_status s;
} rank_list;

/* One entry: kept when named rank-K.json, K a rank as loom writes it. */
static bool add_rank(const char *name, void *ctx) {
  rank_list *l = ctx;
  size_t len = strlen(name);
  char num[32], want[80];
  int rank = -1;
  if (len <= 10 || len - 10 >= sizeof num || strncmp(name, "rank-", 5) != 0)
    return true;
  memcpy(num, name + 5, len - 10);
  num[len - 10] = '\0';
  if (!loom_parse_int(num, &rank) || rank < 0 ||
      snprintf(want, sizeof want, "rank-%d.json", rank) < 0 ||
      strcmp(want, name) != 0)
    return true;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    rank_file *g = loom_calloc((size_t)cap, sizeof *g);
    if (!g) {
      l->s = LOOM_ERR_NOMEM;
      return false;
    }
    if (l->v)
      memcpy(g, l->v, (size_t)l->n * sizeof *g);
    loom_free(l->v);
    l->v = g;
    l->cap = cap;
  }
  l->v[l->n].rank = rank;
  snprintf(l->v[l->n].path, sizeof l->v[l->n].path, "%s/%s", l->dir, name);
  l->n++;
  return true;
}

/* The rank files of dir (a directory the user named: a link to one is
 * followed; nothing is removed), sorted by rank. */
static loom_status list_ranks(const char *dir, rank_file **out, int *n) {
  *out = NULL;
  *n = 0;
  rank_list l = {.dir = dir, .s = LOOM_OK};
  if (loom_fs_each_entry(AT_FDCWD, dir, true, add_rank, &l) != 0)
    return loom_error(LOOM_ERR_IO, "cannot open the trace directory %s: %s",
                      dir, strerror(errno));
  if (l.s == LOOM_OK && l.n == 0)
    l.s = loom_error(LOOM_ERR_IO, "%s holds no rank-K.json trace file", dir);
  if (l.s != LOOM_OK) {
    loom_free(l.v);
    return l.s;
  }
  qsort(l.v, (size_t)l.n, sizeof *l.v, cmp_rank);
  *out = l.v;
  *n = l.n;
  return LOOM_OK;
}

/* Copies r's events to out, ts moved by shift_us; counts them. */
static loom_status copy_events(const rank_file *r, double shift_us, FILE *out,
                               uint64_t *events) {
  FILE *f = fopen(r->path, "r");
  if (!f)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", r->path,
                      strerror(errno));
  size_t cap = 1 << 16;
  char *line = loom_malloc(cap);
  if (!line) {
    fclose(f);
    return LOOM_ERR_NOMEM;
  }
  loom_status s = LOOM_OK;
  while (fgets(line, (int)cap, f)) {
    cJSON *e = parse_line(line);
    if (!e)
      continue;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    bool end = cJSON_IsString(name) && !strcmp(name->valuestring, "loom_end");
    cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
    if (ts && cJSON_IsNumber(ts))
      cJSON_SetNumberValue(ts, ts->valuedouble + shift_us);
    cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
    if (pid && cJSON_IsNumber(pid))
      cJSON_SetNumberValue(pid, r->rank);
    char *txt = end ? NULL : cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    if (end)
      continue;
    if (!txt) {
      s = LOOM_ERR_NOMEM;
      break;
    }
    fprintf(out, "%s,\n", txt);
    cJSON_free(txt);
    (*events)++;
  }
  loom_free(line);
  fclose(f);
  return s;
}

loom_status loom_trace_merge(const char *dir, const char *out_path,
                             loom_trace_merge_info *info) {
  if (info)
    memset(info, 0, sizeof *info);
  if (!dir || !out_path)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_trace_merge: NULL path");
  rank_file *r = NULL;
  int n = 0;
  LOOM_TRY(list_ranks(dir, &r, &n));
  loom_status s = LOOM_OK;
  bool one_host = true, synced = true;
  for (int i = 0; s == LOOM_OK && i < n; i++) {
    s = read_clock(&r[i]);
    if (s == LOOM_OK && strcmp(r[i].host, r[0].host) != 0)
      one_host = false;
    synced &= r[i].have_sync;
  }
  /* Across hosts: each rank's wall clock brought to rank 0's by the offset
   * measured at the start, when every rank has it; else the wall clocks as
   * they are (as well as the hosts agree). */
  for (int i = 0; s == LOOM_OK && i < n; i++)
    r[i].wall -= synced ? r[i].offset : 0;
  FILE *out = NULL;
  if (s == LOOM_OK)
    s = loom_fs_open_append(out_path, true, &out);
  uint64_t events = 0;
  if (s == LOOM_OK) {
    double base = 0;
    for (int i = 0; i < n; i++) {
      double t = one_host ? r[i].mono : r[i].wall;
      if (i == 0 || t < base)
        base = t;
    }
    fputs("[\n", out);
    for (int i = 0; s == LOOM_OK && i < n; i++) {
      fprintf(out,
              "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,"
              "\"tid\":0,\"args\":{\"sort_index\":%d}},\n",
              r[i].rank, r[i].rank);
      double t = one_host ? r[i].mono : r[i].wall;
      s = copy_events(&r[i], (t - base) * 1e6, out, &events);
    }
    fputs("{\"ph\":\"M\",\"name\":\"loom_end\",\"pid\":0,\"tid\":0,"
          "\"args\":{}}\n]\n",
          out);
    if (fclose(out) != 0 && s == LOOM_OK)
      s = loom_error(LOOM_ERR_IO, "writing %s: %s", out_path, strerror(errno));
  }
  if (s == LOOM_OK && info) {
    info->ranks = n;
    info->events = events;
    info->one_host = one_host;
    info->synced = !one_host && synced;
  }
  loom_free(r);
  return s;
}
