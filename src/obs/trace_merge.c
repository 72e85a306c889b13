/* loom report --trace: the ranks' trace files of a run merged into one,
 * each rank a process of its own, on one time line. On one host the ranks
 * share its monotonic clock, so each file's ts 0 (its loom_clock record)
 * is placed exactly; across hosts the wall clock places them (as well as
 * the hosts' clocks agree). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "loom/obs.h"

typedef struct rank_file {
  int rank;
  char path[1200];
  double mono, wall; /* its ts 0 */
  char host[256];
  bool have_clock;
  double offset; /* loom_clock_sync: its wall clock less rank 0's */
  bool have_sync;
  int pid;        /* the rank its loom_clock record names */
  int world;      /* its world size; 0: not recorded (an older loom) */
  double attempt; /* its attempt's mark (see loom_trace_file_attempt) */
  bool have_attempt;
  bool skip; /* left out of the merge (named in a warning) */
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

/* v as a whole number in [lo, hi]: the world and pid of a clock record
 * (a cast of 1e400 or 3.5 to int is no rank). */
static bool whole_in(const cJSON *v, double lo, double hi, int *out) {
  if (!loom_obs_json_whole(v, lo, hi))
    return false;
  *out = (int)v->valuedouble;
  return true;
}

/* A clock's number: finite (1e400 reads as inf, and inf - inf placed every
 * event at NaN). */
static bool finite_num(const cJSON *v) {
  return cJSON_IsNumber(v) && isfinite(v->valuedouble);
}

/* The file's clock record: its host and where its ts 0 is. */
static loom_status read_clock(rank_file *r) {
  FILE *f = loom_obs_open_read(r->path);
  if (!f)
    return LOOM_ERR_IO;
  char line[4096];
  const char *bad = NULL; /* a record's field that is out of range */
  int lineno = 1, bad_line = 0;
  /* The clock record comes first; the sync record (several ranks) soon
   * after, once the trainer measured it. */
  for (int i = 0; i < 256 && !bad && fgets(line, sizeof line, f);
       i++, lineno += strchr(line, '\n') != NULL) {
    if (i >= 16 && !r->have_clock)
      break;
    if (!strstr(line, "\"loom_clock"))
      continue;
    bad_line = lineno;
    cJSON *e = parse_line(line);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (cJSON_IsString(name) && !strcmp(name->valuestring, "loom_clock_sync") &&
        cJSON_IsObject(args)) {
      const cJSON *o = cJSON_GetObjectItemCaseSensitive(args, "offset_s");
      const cJSON *a = cJSON_GetObjectItemCaseSensitive(args, "attempt");
      if ((o && !finite_num(o)) || (a && !finite_num(a)))
        bad = o && !finite_num(o) ? "loom_clock_sync's offset_s"
                                  : "loom_clock_sync's attempt";
      if (!bad && o) {
        r->offset = o->valuedouble;
        r->have_sync = true;
      }
      if (!bad && a) {
        r->attempt = a->valuedouble;
        r->have_attempt = true;
      }
    }
    if (!bad && cJSON_IsString(name) &&
        !strcmp(name->valuestring, "loom_clock") && cJSON_IsObject(args)) {
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(args, "monotonic_s");
      const cJSON *w = cJSON_GetObjectItemCaseSensitive(args, "wall_s");
      const cJSON *h = cJSON_GetObjectItemCaseSensitive(args, "host");
      const cJSON *wo = cJSON_GetObjectItemCaseSensitive(args, "world");
      const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
      r->world = 0; /* not recorded: an older loom */
      r->pid = r->rank;
      if (wo && !whole_in(wo, 1, 1 << 24, &r->world))
        bad = "loom_clock's world (a rank count)";
      else if (pid && !whole_in(pid, 0, 1 << 24, &r->pid))
        bad = "loom_clock's pid (a rank)";
      else if ((m && !finite_num(m)) || (w && !finite_num(w)))
        bad = "loom_clock's monotonic_s or wall_s (seconds)";
      else if (m && w) { /* both finite numbers, by the test above */
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
  if (bad) {
    r->have_clock = false;
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: line %d: %s is invalid: not a loom trace", r->path,
                      bad_line, bad);
  }
  if (!r->have_clock)
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: no loom_clock record in its first lines: not a "
                      "loom trace",
                      r->path);
  /* A 1-rank trace has no sync record: its own start marks its attempt. */
  if (!r->have_attempt && r->world == 1) {
    r->attempt = r->wall;
    r->have_attempt = true;
  }
  return LOOM_OK;
}

loom_status loom_trace_file_attempt(const char *path, double *attempt,
                                    int *world) {
  rank_file r;
  memset(&r, 0, sizeof r);
  snprintf(r.path, sizeof r.path, "%s", path);
  LOOM_TRY(read_clock(&r));
  *attempt = r.have_attempt ? r.attempt : r.wall;
  if (world)
    *world = r.world;
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

/* Copies r's events to out, ts moved by shift_us; counts them. A file
 * without its closing record, or with lines that are not whole events, is
 * named in a warning; so is one that reached its cap (its loom_capped
 * record), counted in *capped. */
static loom_status copy_events(const rank_file *r, double shift_us, FILE *out,
                               uint64_t *events, int *capped) {
  FILE *f = loom_obs_open_read(r->path);
  if (!f)
    return LOOM_ERR_IO;
  bool ended = false, capped_at = false;
  double cap_bytes = 0, cap_step = -1;
  char raise[64] = "";
  int damaged = 0;
  size_t cap = 1 << 16;
  char *line = loom_malloc(cap);
  if (!line) {
    fclose(f);
    return LOOM_ERR_NOMEM;
  }
  loom_status s = LOOM_OK;
  while (fgets(line, (int)cap, f)) {
    cJSON *e = parse_line(line);
    if (!e) {
      /* "[" and "]" and blank lines are the array's; anything else is an
       * event cut short or damaged */
      damaged +=
          line[0] != '\0' && strcmp(line, "[") != 0 && strcmp(line, "]") != 0;
      continue;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    bool end = cJSON_IsString(name) && !strcmp(name->valuestring, "loom_end");
    ended |= end;
    if (cJSON_IsString(name) && !strcmp(name->valuestring, "loom_capped")) {
      const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
      const cJSON *mb = cJSON_GetObjectItemCaseSensitive(a, "max_bytes");
      const cJSON *st = cJSON_GetObjectItemCaseSensitive(a, "step");
      const cJSON *ra = cJSON_GetObjectItemCaseSensitive(a, "raise");
      snprintf(raise, sizeof raise, "%s",
               cJSON_IsString(ra) ? ra->valuestring : "its cap");
      capped_at = true;
      cap_bytes = cJSON_IsNumber(mb) ? mb->valuedouble : 0;
      cap_step = cJSON_IsNumber(st) ? st->valuedouble : -1;
    }
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
      s = loom_error(LOOM_ERR_NOMEM, "%s: out of memory merging its events",
                     r->path);
      break;
    }
    fprintf(out, "%s,\n", txt);
    cJSON_free(txt);
    (*events)++;
  }
  loom_free(line);
  fclose(f);
  if (s == LOOM_OK && (!ended || damaged))
    LOOM_WARN("trace: %s is cut short%s%s%.0d%s: merged up to its last whole "
              "event (the run crashed or is still running, or the file could "
              "not be written: see the rank's log)",
              r->path, ended ? "" : " (no closing record)", damaged ? ", " : "",
              damaged, damaged ? " damaged line(s) left out" : "");
  if (s == LOOM_OK && capped_at) {
    char at[48] = "before the first step";
    if (cap_step >= 0)
      snprintf(at, sizeof at, "at step %.0f", cap_step);
    LOOM_WARN("trace: %s was capped at %.4g MB %s: its timeline ends there "
              "(raise %s to trace further)",
              r->path, cap_bytes / 1048576.0, at, raise);
    (*capped)++;
  }
  return s;
}

/* Which files are merged: those of the latest attempt (the greatest mark;
 * files of an older loom, without one, go along), each checked against its
 * name; the ranks that attempt lacks are counted. */
static void choose_files(rank_file *r, int n, loom_trace_merge_info *info) {
  double latest = 0;
  bool any = false;
  int world = 0;
  for (int i = 0; i < n; i++)
    if (!r[i].skip && r[i].have_attempt && (!any || r[i].attempt > latest)) {
      latest = r[i].attempt;
      any = true;
    }
  for (int i = 0; i < n; i++)
    if (!r[i].skip && any && r[i].have_attempt && r[i].attempt == latest &&
        r[i].world > world)
      world = r[i].world;
  for (int i = 0; i < n; i++) {
    rank_file *f = &r[i];
    if (f->skip)
      continue;
    if (f->pid != f->rank) {
      LOOM_WARN("trace: %s holds rank %d's trace, not rank %d's: left out",
                f->path, f->pid, f->rank);
      f->skip = true;
    } else if (any && f->have_attempt && f->attempt != latest) {
      LOOM_WARN("trace: %s is from an earlier attempt (%d rank(s), started "
                "%.0f s before the latest): left out; an earlier attempt's "
                "files are kept in attempt-*/ beside it",
                f->path, f->world ? f->world : 1, latest - f->attempt);
      f->skip = true;
    } else if (world && f->world && f->world != world) {
      LOOM_WARN("trace: %s is from a run of %d rank(s), the latest attempt "
                "has %d: left out",
                f->path, f->world, world);
      f->skip = true;
    } else if (world && f->rank >= world) {
      LOOM_WARN("trace: %s: rank %d is outside the latest attempt's %d "
                "rank(s): left out",
                f->path, f->rank, world);
      f->skip = true;
    }
    info->left_out += f->skip;
  }
  /* The ranks without a file: up to the world size when the files say it,
   * else the gaps below the highest rank. */
  int top = world;
  for (int i = 0; !world && i < n; i++)
    if (!r[i].skip && r[i].rank + 1 > top)
      top = r[i].rank + 1;
  for (int k = 0; k < top; k++) {
    bool have = false;
    for (int i = 0; i < n && !have; i++)
      have = !r[i].skip && r[i].rank == k;
    if (!have) {
      LOOM_WARN("trace: rank %d's trace (rank-%d.json) is missing from the "
                "merge%s",
                k, k, world ? " (the attempt has that rank)" : "");
      info->missing++;
    }
  }
}

/* What the merged file is written from. */
typedef struct merge_out {
  const rank_file *r;
  int n;
  bool one_host;
  double base; /* the earliest ts 0 of the files merged: ts 0 of the merge */
  uint64_t events;
  int capped;
} merge_out;

/* The merged trace, written into the temporary's descriptor (the
 * loom_fs_fill_fn of loom_fs_write_atomic_with). */
static int fill_merged(int fd, void *ctx) {
  merge_out *mo = ctx;
  int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the writer closes fd itself */
  FILE *out = dfd < 0 ? NULL : fdopen(dfd, "w");
  if (!out) {
    int e = errno;
    if (dfd >= 0)
      close(dfd);
    errno = e;
    return -1;
  }
  loom_status s = LOOM_OK;
  fputs("[\n", out);
  for (int i = 0; s == LOOM_OK && i < mo->n; i++) {
    const rank_file *r = &mo->r[i];
    if (r->skip)
      continue;
    fprintf(out,
            "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,"
            "\"tid\":0,\"args\":{\"sort_index\":%d}},\n",
            r->rank, r->rank);
    double t = mo->one_host ? r->mono : r->wall;
    s = copy_events(r, (t - mo->base) * 1e6, out, &mo->events, &mo->capped);
  }
  fputs("{\"ph\":\"M\",\"name\":\"loom_end\",\"pid\":0,\"tid\":0,"
        "\"args\":{}}\n]\n",
        out);
  /* A write that failed on the way (a full disk) leaves the stream's
   * error flag; its errno may be gone by now. */
  errno = 0;
  bool werr = fflush(out) != 0 || ferror(out);
  int e = errno ? errno : EIO;
  if (fclose(out) != 0 && !werr) {
    werr = true;
    e = errno;
  }
  if (s != LOOM_OK) /* an input failed: copy_events said which */
    return -2;
  errno = e;
  return werr ? -1 : 0;
}

/* out_path written whole or not at all: a temporary beside it renamed
 * over it when complete, so a merge killed half way (Ctrl-C, SIGKILL)
 * leaves the previous file as it was. */
static loom_status write_merged(const char *out_path, merge_out *mo) {
  char dir[4096];
  const char *slash = strrchr(out_path, '/');
  const char *name = slash ? slash + 1 : out_path;
  if (slash == out_path)
    snprintf(dir, sizeof dir, "/");
  else if (slash)
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - out_path), out_path);
  else
    snprintf(dir, sizeof dir, ".");
  if (!*name)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: names a directory, not a file",
                      out_path);
  struct stat lst;
  if (lstat(out_path, &lst) == 0 && S_ISLNK(lst.st_mode))
    /* the user named a file, not where a link points: refused, as
     * before (and as loom report -o) */
    return loom_error(LOOM_ERR_IO, "%s: cannot open for writing: %s", out_path,
                      loom_fs_strerror(ELOOP));
  LOOM_TRY(loom_fs_write_atomic_with(dir, name, fill_merged, mo));
  /* what a merge killed before its rename left (.NAME.tmp.<pid>) */
  (void)loom_fs_remove_dead_tmps(dir, name);
  return LOOM_OK;
}

loom_status loom_trace_merge(const char *dir, const char *out_path,
                             loom_trace_merge_info *info) {
  loom_trace_merge_info mine;
  if (!info)
    info = &mine;
  memset(info, 0, sizeof *info);
  if (!dir || !out_path)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_trace_merge: NULL path");
  rank_file *r = NULL;
  int n = 0;
  LOOM_TRY(list_ranks(dir, &r, &n));
  loom_status s = LOOM_OK;
  char first_err[1400] = "";
  /* A file that is not a trace (empty, damaged, a pipe) is left out and
   * named; the others merge. */
  for (int i = 0; i < n; i++)
    if (read_clock(&r[i]) != LOOM_OK) {
      if (!first_err[0])
        snprintf(first_err, sizeof first_err, "%s", loom_last_error());
      LOOM_WARN("trace: %s; left out", loom_last_error());
      r[i].skip = true;
      info->left_out++;
    }
  choose_files(r, n, info);
  int first = -1, kept = 0;
  bool one_host = true, synced = true;
  for (int i = 0; i < n; i++) {
    if (r[i].skip)
      continue;
    kept++;
    if (first < 0)
      first = i;
    if (strcmp(r[i].host, r[first].host) != 0)
      one_host = false;
    synced &= r[i].have_sync;
  }
  if (kept == 0) {
    s = loom_error(first_err[0] ? LOOM_ERR_CORRUPT : LOOM_ERR_IO,
                   "%s: no rank file to merge%s%s", dir,
                   first_err[0] ? ": " : " (see the warnings)", first_err);
    loom_free(r);
    return s;
  }
  /* Across hosts: each rank's wall clock brought to rank 0's by the offset
   * measured at the start, when every rank has it; else the wall clocks as
   * they are (as well as the hosts agree). */
  for (int i = 0; i < n; i++)
    r[i].wall -= synced ? r[i].offset : 0;
  merge_out mo = {r, n, one_host, 0, 0, 0};
  for (int i = 0; i < n; i++) {
    double t = one_host ? r[i].mono : r[i].wall;
    if (!r[i].skip && (first == i || t < mo.base))
      mo.base = t;
  }
  s = write_merged(out_path, &mo);
  uint64_t events = mo.events;
  if (s == LOOM_OK) {
    info->ranks = kept;
    info->events = events;
    info->one_host = one_host;
    info->synced = !one_host && synced;
    info->capped = mo.capped;
  }
  loom_free(r);
  return s;
}
