/* An MLflow tracking client over MLflow's REST API (libcurl, cJSON). The
 * caller's thread only queues (a mutex, a condition variable); one sender
 * thread per handle does all HTTP: experiments/get-by-name (or create),
 * runs/create, runs/log-batch, the artifact proxy's PUT, runs/update.
 *
 * The queue: metric values in a ring (bounded by max_buffered, the oldest
 * dropped), params (kept for the handle's life: MLflow's params are
 * immutable, so a key is sent once and a second value is refused here),
 * tags and artifacts in lists. The sender takes a batch out of the queue
 * and keeps it until the server has it: a network failure or HTTP 5xx
 * retries the same batch after a backoff, HTTP 4xx drops it with the
 * server's message. Retrying is safe: MLflow's SQL store ignores a metric
 * value it has already (same key, step, time and value) and a param
 * logged again with its value. */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "loom/obs.h"

/* MLflow's limits (mlflow/utils/validation.py): per log-batch call at most
 * 1000 metrics, 100 params, 100 tags, 1000 entities in all and 1 MB of
 * JSON; keys of 250 characters, param values of 6000, tag values of 8000. */
enum {
  BATCH_METRICS = 1000,
  BATCH_PARAMS_TAGS = 100,
  BATCH_ENTITIES = 1000,
  BATCH_BYTES = 900 * 1000, /* below the 1 MB limit with room for JSON */
  KEY_MAX = 250,
  PARAM_VALUE_MAX = 6000,
  TAG_VALUE_MAX = 8000,
  RESPONSE_MAX = 1 << 20, /* bytes of an answer kept */
  ID_MAX = 64,
};
static const double BACKOFF_FIRST = 0.5, BACKOFF_MAX = 10.0;

typedef struct {
  const char *key; /* interned: lives as long as the handle */
  double value;
  int64_t step, ts_ms;
} metric;

typedef struct {
  char *key, *value;
} kv;

typedef struct artifact {
  char *path;          /* artifact_path */
  unsigned char *data; /* the file's bytes */
  size_t len;
  struct artifact *next;
} artifact;

/* What the sender took out of the queue: values for one log-batch call, or
 * one artifact. Kept, and sent again, until the server has answered. */
typedef struct {
  metric m[BATCH_METRICS];
  size_t nm;
  kv p[BATCH_PARAMS_TAGS]; /* borrowed from the handle's params */
  size_t np;
  kv t[BATCH_PARAMS_TAGS]; /* owned */
  size_t nt;
  artifact *art; /* owned */
  char *body;    /* the request's JSON, made once */
} batch;

typedef struct {
  long code; /* HTTP status, 0 without an answer */
  char *body;
  size_t len, cap;
} response;

/* How a request ended. */
typedef enum { REQ_OK, REQ_RETRY, REQ_REFUSED } req_result;

struct loom_mlflow {
  /* Set by open, read-only afterwards. */
  char *uri; /* without trailing slashes */
  char *experiment;
  char *run_name; /* NULL: the server's choice */
  long timeout_ms;
  size_t max_buffered;
  pthread_t thread;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* Under mu: the queue. */
  metric *ring; /* (cap) metric values, count of them from head */
  size_t cap, head, count;
  kv *params; /* every param logged; [params_taken, nparams) not yet sent */
  size_t nparams, params_cap, params_taken;
  kv *tags; /* tags not yet sent */
  size_t ntags, tags_cap;
  artifact *art_head, *art_tail;
  size_t nart;
  char *
      *keys; /* interned metric keys: open addressing, keys_cap a power of 2 */
  size_t nkeys, keys_cap;
  size_t inflight;   /* values in the sender's batch */
  size_t inflight_m; /* metrics among them */
  bool sender_waiting, stop, disabled;
  double deadline; /* loom_time_now() by which close gives up */
  uint64_t sent, dropped, failures;
  bool connected, ever_failed;
  bool warned_overflow, warned_key;

  /* Written once by the sender before have_run is set. */
  char run_id[ID_MAX];
  char experiment_id[ID_MAX];
  char *artifact_dir; /* the run's artifacts below the proxy's root, or NULL */
  atomic_bool have_run;
  char *resume_id; /* a run to go on with (opts.run_id), or NULL */
  char *replay;    /* metrics.jsonl to send again (opts.replay_jsonl), or
                      NULL once done */
  int64_t replay_to;
  kv *latest; /* the resumed run's metrics: key, its latest step */
  size_t nlatest;
  void (*on_run)(const char *run_id, void *ctx);
  void *on_run_ctx;

  /* The sender's own. */
  CURL *curl;
  char errbuf[CURL_ERROR_SIZE];
  response resp;
  char *user;
};

/* ------------------------------------------------------------- helpers */

static char *dup_n(const char *s, size_t n) {
  char *d = loom_malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

static char *dup_str(const char *s) { return dup_n(s, strlen(s)); }

/* The length of s cut to at most max bytes, at a UTF-8 character boundary
 * (a cut sequence would be invalid JSON text). */
static size_t cut_utf8(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n <= max)
    return n;
  n = max;
  while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
    n--;
  return n;
}

/* A name as MLflow accepts for metrics, params and tags: letters, digits,
 * _ - . / : and space (bytes >= 0x80 pass: Python's \w takes Unicode
 * letters), at most 250 bytes, and a path that normalizes to itself (no
 * leading or trailing '/', no empty, "." or ".." parts). */
static bool valid_key(const char *k) {
  size_t n = k ? strlen(k) : 0;
  if (n == 0 || n > KEY_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)k[i];
    if (!(c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || strchr("_-./: ", c)))
      return false;
  }
  const char *p = k;
  for (;;) {
    const char *e = strchr(p, '/');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == 0 || (len == 1 && p[0] == '.') ||
        (len == 2 && p[0] == '.' && p[1] == '.'))
      return false;
    if (!e)
      return true;
    p = e + 1;
  }
}

/* at (loom_time_now() seconds, CLOCK_MONOTONIC, the clock of the handle's
 * condition variable) as a timespec for pthread_cond_timedwait. */
static void to_timespec(struct timespec *ts, double at) {
  if (at < 0)
    at = 0;
  ts->tv_sec = (time_t)at;
  ts->tv_nsec = (long)((at - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static uint64_t pending_locked(const loom_mlflow *m) {
  return m->count + m->inflight + (m->nparams - m->params_taken) + m->ntags +
         m->nart;
}

/* Wakes the sender (under mu), only when it waits. */
static void wake_locked(loom_mlflow *m) {
  if (m->sender_waiting)
    pthread_cond_signal(&m->cv);
}

/* ------------------------------------------------- the queue (under mu) */

/* The interned copy of key, made on first use; NULL without memory. */
static const char *intern_locked(loom_mlflow *m, const char *key) {
  if (m->nkeys * 2 >= m->keys_cap) {
    size_t cap = m->keys_cap ? m->keys_cap * 2 : 64;
    char **t = loom_calloc(cap, sizeof *t);
    if (!t)
      return NULL;
    for (size_t i = 0; i < m->keys_cap; i++) {
      if (!m->keys[i])
        continue;
      size_t h =
          (size_t)loom_hash64(LOOM_HASH64_INIT, m->keys[i], strlen(m->keys[i]));
      while (t[h & (cap - 1)])
        h++;
      t[h & (cap - 1)] = m->keys[i];
    }
    loom_free(m->keys);
    m->keys = t;
    m->keys_cap = cap;
  }
  size_t n = strlen(key);
  size_t h = (size_t)loom_hash64(LOOM_HASH64_INIT, key, n);
  for (;; h++) {
    char **slot = &m->keys[h & (m->keys_cap - 1)];
    if (!*slot) {
      *slot = dup_n(key, n);
      if (*slot)
        m->nkeys++;
      return *slot;
    }
    if (strcmp(*slot, key) == 0)
      return *slot;
  }
}

/* Room for one more metric value: the oldest queued one goes when the
 * buffer is full. False when there is none (no memory, or everything is
 * in the sender's batch). */
static bool ring_room_locked(loom_mlflow *m) {
  if (m->count + m->inflight_m >= m->max_buffered) {
    if (m->count == 0)
      return false;
    m->head = (m->head + 1) % m->cap;
    m->count--;
    m->dropped++;
  }
  if (m->count == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    if (cap > m->max_buffered)
      cap = m->max_buffered;
    if (cap <= m->count)
      return false;
    metric *r = loom_malloc(cap * sizeof *r);
    if (!r)
      return false;
    for (size_t i = 0; i < m->count; i++)
      r[i] = m->ring[(m->head + i) % m->cap];
    loom_free(m->ring);
    m->ring = r;
    m->cap = cap;
    m->head = 0;
  }
  return true;
}

static bool grow_kv(kv **a, size_t n, size_t *cap) {
  if (n < *cap)
    return true;
  size_t c = *cap ? *cap * 2 : 16;
  kv *b = loom_malloc(c * sizeof *b);
  if (!b)
    return false;
  if (n)
    memcpy(b, *a, n * sizeof *b);
  loom_free(*a);
  *a = b;
  *cap = c;
  return true;
}

static void free_kv(kv *p) {
  loom_free(p->key);
  loom_free(p->value);
}

static void free_artifact(artifact *a) {
  if (!a)
    return;
  loom_free(a->path);
  loom_free(a->data);
  loom_free(a);
}

/* Moves what is queued into b (empty): params, tags and metric values up
 * to MLflow's limits per call, or, when none is queued, one artifact. */
static void take_batch_locked(loom_mlflow *m, batch *b) {
  size_t bytes = 256;
  while (m->params_taken < m->nparams && b->np < BATCH_PARAMS_TAGS) {
    kv *p = &m->params[m->params_taken];
    size_t n = strlen(p->key) + strlen(p->value) * 6 + 32;
    if (b->np > 0 && bytes + n > BATCH_BYTES)
      break;
    bytes += n;
    b->p[b->np++] = *p;
    m->params_taken++;
  }
  size_t nt = 0;
  while (nt < m->ntags && b->nt < BATCH_PARAMS_TAGS) {
    kv *t = &m->tags[nt];
    size_t n = strlen(t->key) + strlen(t->value) * 6 + 32;
    if (b->np + b->nt > 0 && bytes + n > BATCH_BYTES)
      break;
    bytes += n;
    b->t[b->nt++] = *t;
    nt++;
  }
  if (nt) {
    memmove(m->tags, m->tags + nt, (m->ntags - nt) * sizeof *m->tags);
    m->ntags -= nt;
  }
  /* A metric value is under 350 bytes of JSON (a 250-byte key). */
  while (m->count > 0 && b->nm < BATCH_METRICS &&
         b->nm + b->np + b->nt < BATCH_ENTITIES && bytes + 350 <= BATCH_BYTES) {
    b->m[b->nm++] = m->ring[m->head];
    m->head = (m->head + 1) % m->cap;
    m->count--;
    bytes += 350;
  }
  if (b->nm + b->np + b->nt == 0 && m->art_head) {
    b->art = m->art_head;
    m->art_head = b->art->next;
    if (!m->art_head)
      m->art_tail = NULL;
    b->art->next = NULL;
    m->nart--;
  }
  m->inflight_m = b->nm;
  m->inflight = b->nm + b->np + b->nt + (b->art ? 1 : 0);
}

static size_t batch_size(const batch *b) {
  return b->nm + b->np + b->nt + (b->art ? 1 : 0);
}

static void batch_clear(batch *b) {
  for (size_t i = 0; i < b->nt; i++)
    free_kv(&b->t[i]);
  free_artifact(b->art);
  cJSON_free(b->body);
  b->nm = b->np = b->nt = 0;
  b->art = NULL;
  b->body = NULL;
}

/* ---------------------------------------------------------------- HTTP */

static size_t on_data(char *p, size_t size, size_t n, void *ctx) {
  response *r = ctx;
  size_t len = size * n;
  size_t keep = len;
  if (r->len + keep > RESPONSE_MAX)
    keep = RESPONSE_MAX - r->len;
  if (keep && r->len + keep + 1 > r->cap) {
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < r->len + keep + 1)
      cap *= 2;
    char *b = loom_malloc(cap);
    if (!b)
      return 0; /* curl fails the transfer: retried */
    if (r->len)
      memcpy(b, r->body, r->len);
    loom_free(r->body);
    r->body = b;
    r->cap = cap;
  }
  if (keep) {
    memcpy(r->body + r->len, p, keep);
    r->len += keep;
    r->body[r->len] = '\0';
  }
  return len;
}

/* The server's message in an error answer: "ERROR_CODE: message" from
 * MLflow's JSON, else the start of the body. */
static void server_message(const response *r, char *msg, size_t cap) {
  cJSON *j = r->len ? cJSON_ParseWithLength(r->body, r->len) : NULL;
  const cJSON *code = cJSON_GetObjectItemCaseSensitive(j, "error_code");
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "message");
  if (cJSON_IsString(text))
    snprintf(msg, cap, "HTTP %ld %s: %.400s", r->code,
             cJSON_IsString(code) ? code->valuestring : "", text->valuestring);
  else
    snprintf(msg, cap, "HTTP %ld: %.200s", r->code, r->len ? r->body : "");
  cJSON_Delete(j);
}

/* One request: method ("GET", "POST", "PUT") to the server's path, with
 * body (n bytes, of content type ctype) or none. msg gets what went wrong.
 * During close the request's time is cut to what is left before the
 * deadline (deadline 0: the whole timeout). */
static req_result http(loom_mlflow *m, const char *method, const char *path,
                       const void *body, size_t n, const char *ctype,
                       double deadline, char *msg, size_t msg_cap) {
  size_t ulen = strlen(m->uri) + strlen(path) + 1;
  char *url = loom_malloc(ulen);
  if (!url) {
    snprintf(msg, msg_cap, "out of memory");
    return REQ_RETRY;
  }
  snprintf(url, ulen, "%s%s", m->uri, path);
  long timeout = m->timeout_ms;
  if (deadline > 0) {
    long left = (long)((deadline - loom_time_now()) * 1000);
    if (left < 100)
      left = 100;
    if (left < timeout)
      timeout = left;
  }
  CURL *c = m->curl;
  curl_easy_reset(c); /* keeps the open connection */
  struct curl_slist *h = NULL, *h2;
  char ct[64];
  snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "text/plain");
  if ((h2 = curl_slist_append(h, ct)))
    h = h2;
  if ((h2 = curl_slist_append(h, "Expect:"))) /* no 100-continue round */
    h = h2;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, m->errbuf);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &m->resp);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "loom");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  if (strcmp(method, "GET") == 0) {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n);
    if (strcmp(method, "POST") != 0)
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  }
  m->errbuf[0] = '\0';
  m->resp.len = 0;
  m->resp.code = 0;
  if (m->resp.body)
    m->resp.body[0] = '\0';
  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(h);
  loom_free(url);
  if (rc != CURLE_OK) {
    snprintf(msg, msg_cap, "%s",
             m->errbuf[0] ? m->errbuf : curl_easy_strerror(rc));
    return REQ_RETRY;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &m->resp.code);
  if (m->resp.code >= 200 && m->resp.code < 300)
    return REQ_OK;
  server_message(&m->resp, msg, msg_cap);
  /* 429 (too many requests) and 408 (request timeout) pass with time. */
  if (m->resp.code >= 500 || m->resp.code == 429 || m->resp.code == 408)
    return REQ_RETRY;
  return REQ_REFUSED;
}

static req_result post_json(loom_mlflow *m, const char *path, cJSON *j,
                            double deadline, char *msg, size_t cap) {
  char *body = j ? cJSON_PrintUnformatted(j) : NULL;
  if (!body) {
    snprintf(msg, cap, "out of memory");
    return REQ_RETRY;
  }
  req_result r = http(m, "POST", path, body, strlen(body), "application/json",
                      deadline, msg, cap);
  cJSON_free(body);
  return r;
}

/* The answer's JSON; NULL when it is none. */
static cJSON *answer(loom_mlflow *m) {
  return m->resp.len ? cJSON_ParseWithLength(m->resp.body, m->resp.len) : NULL;
}

static void add_i64(cJSON *o, const char *name, int64_t v) {
  char b[32];
  snprintf(b, sizeof b, "%lld", (long long)v);
  cJSON_AddRawToObject(o, name, b);
}

/* A double as JSON text that reads back as the same double: the shortest
 * of 15, 16 or 17 significant digits that does (cJSON's own printing
 * accepts a relative error of DBL_EPSILON: 1/11 came back 1 ulp off). */
static void add_f64(cJSON *o, const char *name, double v) {
  char b[40];
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(b, sizeof b, "%.*g", digits, v);
    for (char *c = b; *c; c++)
      if (*c == ',') /* a locale's decimal comma */
        *c = '.';
    if (strtod(b, NULL) == v)
      break;
  }
  cJSON_AddRawToObject(o, name, b);
}

static void add_kv(cJSON *arr, const char *key, const char *value) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "key", key);
  cJSON_AddStringToObject(o, "value", value);
  cJSON_AddItemToArray(arr, o);
}

/* ----------------------------------------------------- the run's setup */

/* The experiment's id into m->experiment_id: found by name, else made;
 * made by someone else meanwhile (RESOURCE_ALREADY_EXISTS): found again. */
static req_result find_experiment(loom_mlflow *m, double deadline, char *msg,
                                  size_t cap) {
  for (int attempt = 0; attempt < 3; attempt++) {
    char *name = curl_easy_escape(m->curl, m->experiment, 0);
    if (!name) {
      snprintf(msg, cap, "out of memory");
      return REQ_RETRY;
    }
    size_t plen = strlen(name) + 80;
    char *path = loom_malloc(plen);
    if (!path) {
      curl_free(name);
      snprintf(msg, cap, "out of memory");
      return REQ_RETRY;
    }
    snprintf(path, plen,
             "/api/2.0/mlflow/experiments/get-by-name?experiment_name=%s",
             name);
    curl_free(name);
    req_result r = http(m, "GET", path, NULL, 0, NULL, deadline, msg, cap);
    loom_free(path);
    if (r == REQ_OK) {
      cJSON *j = answer(m);
      const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "experiment");
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "experiment_id");
      const cJSON *stage =
          cJSON_GetObjectItemCaseSensitive(e, "lifecycle_stage");
      if (!cJSON_IsString(id) || strlen(id->valuestring) >= ID_MAX) {
        snprintf(msg, cap, "experiments/get-by-name: an answer without an id");
        r = REQ_REFUSED;
      } else if (cJSON_IsString(stage) &&
                 strcmp(stage->valuestring, "deleted") == 0) {
        snprintf(msg, cap,
                 "experiment '%s' is deleted (restore it, or name another)",
                 m->experiment);
        r = REQ_REFUSED;
      } else {
        snprintf(m->experiment_id, sizeof m->experiment_id, "%s",
                 id->valuestring);
      }
      cJSON_Delete(j);
      return r;
    }
    if (r == REQ_RETRY || m->resp.code != 404)
      return r;
    /* Not there: made here. */
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "name", m->experiment);
    r = post_json(m, "/api/2.0/mlflow/experiments/create", req, deadline, msg,
                  cap);
    cJSON_Delete(req);
    if (r == REQ_OK) {
      cJSON *j = answer(m);
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "experiment_id");
      if (cJSON_IsString(id) && strlen(id->valuestring) < ID_MAX) {
        snprintf(m->experiment_id, sizeof m->experiment_id, "%s",
                 id->valuestring);
        LOOM_INFO("mlflow: made experiment '%s' (id %s)", m->experiment,
                  m->experiment_id);
      } else {
        snprintf(msg, cap, "experiments/create: an answer without an id");
        r = REQ_REFUSED;
      }
      cJSON_Delete(j);
      return r;
    }
    if (r == REQ_RETRY || !strstr(msg, "RESOURCE_ALREADY_EXISTS"))
      return r;
  }
  return REQ_REFUSED;
}

/* Where the run's artifacts lie below the artifact proxy's root: its
 * artifact_uri "mlflow-artifacts:/1/<run>/artifacts" (or with the
 * server's address, "mlflow-artifacts://host:port/...") without the
 * scheme. NULL for a run whose artifacts the server does not serve. */
static char *artifact_dir(const char *uri) {
  static const char scheme[] = "mlflow-artifacts:";
  if (strncmp(uri, scheme, sizeof scheme - 1) != 0)
    return NULL;
  const char *p = uri + sizeof scheme - 1;
  if (p[0] == '/' && p[1] == '/') {
    p = strchr(p + 2, '/');
    if (!p)
      return NULL;
  }
  while (*p == '/')
    p++;
  size_t n = strlen(p);
  while (n > 0 && p[n - 1] == '/')
    n--;
  return dup_n(p, n);
}

static req_result create_run(loom_mlflow *m, double deadline, char *msg,
                             size_t cap) {
  cJSON *req = cJSON_CreateObject();
  cJSON_AddStringToObject(req, "experiment_id", m->experiment_id);
  cJSON_AddStringToObject(req, "user_id", m->user);
  add_i64(req, "start_time", (int64_t)llround(loom_time_wall() * 1000));
  if (m->run_name)
    cJSON_AddStringToObject(req, "run_name", m->run_name);
  cJSON *tags = cJSON_AddArrayToObject(req, "tags");
  add_kv(tags, "mlflow.user", m->user);
  add_kv(tags, "mlflow.source.name", "loom");
  add_kv(tags, "mlflow.source.type", "LOCAL");
  req_result r =
      post_json(m, "/api/2.0/mlflow/runs/create", req, deadline, msg, cap);
  cJSON_Delete(req);
  if (r != REQ_OK)
    return r;
  cJSON *j = answer(m);
  const cJSON *info = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(j, "run"), "info");
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(info, "run_id");
  const cJSON *uri = cJSON_GetObjectItemCaseSensitive(info, "artifact_uri");
  if (!cJSON_IsString(id) || strlen(id->valuestring) >= ID_MAX) {
    snprintf(msg, cap, "runs/create: an answer without a run id");
    r = REQ_REFUSED;
  } else {
    snprintf(m->run_id, sizeof m->run_id, "%s", id->valuestring);
    if (cJSON_IsString(uri)) {
      m->artifact_dir = artifact_dir(uri->valuestring);
      if (!m->artifact_dir)
        LOOM_WARN("mlflow: run %s keeps its artifacts at '%s', which the "
                  "server does not serve (mlflow server --serve-artifacts): "
                  "artifacts will not be uploaded",
                  m->run_id, uri->valuestring);
    }
    atomic_store(&m->have_run, true);
    LOOM_INFO("mlflow: run %s in experiment '%s' at %s", m->run_id,
              m->experiment, m->uri);
    if (m->on_run)
      m->on_run(m->run_id, m->on_run_ctx);
  }
  cJSON_Delete(j);
  return r;
}

/* What the server holds of each metric of a run going on: run.data.metrics
 * of runs/get, each key with its latest step (MLflow's latest_metrics, the
 * largest step). The sender sends a run's values in order, so the server
 * has every value of a key up to that step. */
static void note_latest(loom_mlflow *m, const cJSON *data) {
  const cJSON *ms = cJSON_GetObjectItemCaseSensitive(data, "metrics");
  int n = cJSON_GetArraySize(ms);
  for (size_t i = 0; i < m->nlatest; i++)
    free_kv(&m->latest[i]);
  loom_free(m->latest);
  m->nlatest = 0;
  m->latest = n > 0 ? loom_calloc((size_t)n, sizeof *m->latest) : NULL;
  const cJSON *x;
  cJSON_ArrayForEach(x, ms) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "key");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(x, "step");
    if (!m->latest || !cJSON_IsString(k))
      continue;
    /* int64 in protobuf's JSON: a string, or a number from some servers */
    long long step = cJSON_IsString(st)   ? strtoll(st->valuestring, NULL, 10)
                     : cJSON_IsNumber(st) ? (long long)st->valuedouble
                                          : 0;
    char num[24];
    snprintf(num, sizeof num, "%lld", step);
    kv *e = &m->latest[m->nlatest];
    e->key = dup_str(k->valuestring);
    e->value = dup_str(num);
    if (!e->key || !e->value)
      free_kv(e);
    else
      m->nlatest++;
  }
}

/* The latest step the server holds of key (INT64_MIN: none). */
static int64_t latest_step(const loom_mlflow *m, const char *key) {
  for (size_t i = 0; i < m->nlatest; i++)
    if (!strcmp(m->latest[i].key, key))
      return strtoll(m->latest[i].value, NULL, 10);
  return INT64_MIN;
}

/* A resumed training run: the metrics.jsonl lines up to the step it resumes
 * from are queued again, with their steps and times, for the values the
 * server lacks (those after its latest step of the key; all of them for a
 * new run). They were queued by the earlier attempt, which a crash or
 * loom run's SIGKILL may have ended before they were sent. */
static void replay_lines(loom_mlflow *m) {
  FILE *f = fopen(m->replay, "r");
  if (!f) {
    if (errno != ENOENT)
      LOOM_WARN("mlflow: cannot read %s to send its values again: %s",
                m->replay, strerror(errno));
    return;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  uint64_t queued = 0;
  while ((len = getline(&line, &cap, f)) > 0 && line[len - 1] == '\n') {
    cJSON *j = cJSON_Parse(line);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "time");
    if (!cJSON_IsNumber(st)) {
      cJSON_Delete(j);
      continue;
    }
    int64_t step = (int64_t)st->valuedouble;
    if (step > m->replay_to) { /* the abandoned timeline, or this attempt */
      cJSON_Delete(j);
      break;
    }
    double time = cJSON_IsNumber(tm) ? tm->valuedouble : 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, j) {
      /* what loom_metrics_end sends: numbers, not the line's coordinates;
       * null (a NaN or an infinity in the file) is not known again */
      if (!cJSON_IsNumber(x) || !strcmp(x->string, "step") ||
          !strcmp(x->string, "time") || !strcmp(x->string, "epoch") ||
          !strcmp(x->string, "ranks") || step <= latest_step(m, x->string))
        continue;
      loom_mlflow_metric(m, x->string, x->valuedouble, step, time);
      queued++;
    }
    cJSON_Delete(j);
  }
  free(line);
  fclose(f);
  if (queued)
    LOOM_INFO("mlflow: %llu values of %s up to step %lld that run %s lacked "
              "queued again",
              (unsigned long long)queued, m->replay, (long long)m->replay_to,
              m->run_id);
}

/* Goes on with an earlier run (a resumed training run): its experiment and
 * artifact place from runs/get, its status back to RUNNING. REQ_REFUSED
 * when the server does not know it (the caller then makes a new run). */
static req_result resume_run(loom_mlflow *m, double deadline, char *msg,
                             size_t cap) {
  char *id = curl_easy_escape(m->curl, m->resume_id, 0);
  if (!id) {
    snprintf(msg, cap, "out of memory");
    return REQ_RETRY;
  }
  char path[ID_MAX * 3 + 64];
  snprintf(path, sizeof path, "/api/2.0/mlflow/runs/get?run_id=%s", id);
  curl_free(id);
  req_result r = http(m, "GET", path, NULL, 0, NULL, deadline, msg, cap);
  if (r != REQ_OK)
    return r;
  cJSON *j = answer(m);
  const cJSON *info = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(j, "run"), "info");
  const cJSON *rid = cJSON_GetObjectItemCaseSensitive(info, "run_id");
  const cJSON *eid = cJSON_GetObjectItemCaseSensitive(info, "experiment_id");
  const cJSON *uri = cJSON_GetObjectItemCaseSensitive(info, "artifact_uri");
  if (!cJSON_IsString(rid) || !cJSON_IsString(eid) ||
      strlen(rid->valuestring) >= ID_MAX ||
      strlen(eid->valuestring) >= ID_MAX) {
    snprintf(msg, cap, "runs/get: an answer without a run");
    cJSON_Delete(j);
    return REQ_REFUSED;
  }
  snprintf(m->run_id, sizeof m->run_id, "%s", rid->valuestring);
  snprintf(m->experiment_id, sizeof m->experiment_id, "%s", eid->valuestring);
  if (cJSON_IsString(uri))
    m->artifact_dir = artifact_dir(uri->valuestring);
  note_latest(m, cJSON_GetObjectItemCaseSensitive(
                     cJSON_GetObjectItemCaseSensitive(j, "run"), "data"));
  cJSON_Delete(j);
  cJSON *req = cJSON_CreateObject();
  cJSON_AddStringToObject(req, "run_id", m->run_id);
  cJSON_AddStringToObject(req, "status", "RUNNING");
  r = post_json(m, "/api/2.0/mlflow/runs/update", req, deadline, msg, cap);
  cJSON_Delete(req);
  if (r == REQ_OK) {
    atomic_store(&m->have_run, true);
    LOOM_INFO("mlflow: going on with run %s at %s", m->run_id, m->uri);
  }
  return r;
}

/* ------------------------------------------------------------- sending */

static cJSON *batch_json(const loom_mlflow *m, const batch *b) {
  cJSON *req = cJSON_CreateObject();
  cJSON_AddStringToObject(req, "run_id", m->run_id);
  cJSON *ms = cJSON_AddArrayToObject(req, "metrics");
  for (size_t i = 0; i < b->nm; i++) {
    const metric *x = &b->m[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", x->key);
    /* Protobuf's JSON: NaN and the infinities are strings. */
    if (isnan(x->value))
      cJSON_AddStringToObject(o, "value", "NaN");
    else if (isinf(x->value))
      cJSON_AddStringToObject(o, "value",
                              x->value > 0 ? "Infinity" : "-Infinity");
    else
      add_f64(o, "value", x->value);
    add_i64(o, "timestamp", x->ts_ms);
    add_i64(o, "step", x->step);
    cJSON_AddItemToArray(ms, o);
  }
  cJSON *ps = cJSON_AddArrayToObject(req, "params");
  for (size_t i = 0; i < b->np; i++)
    add_kv(ps, b->p[i].key, b->p[i].value);
  cJSON *ts = cJSON_AddArrayToObject(req, "tags");
  for (size_t i = 0; i < b->nt; i++)
    add_kv(ts, b->t[i].key, b->t[i].value);
  return req;
}

/* PUT of one artifact to the server's proxy:
 * /api/2.0/mlflow-artifacts/artifacts/<run's artifact dir>/<path>, each
 * part of the path escaped. */
static req_result send_artifact(loom_mlflow *m, const artifact *a,
                                double deadline, char *msg, size_t cap) {
  if (!m->artifact_dir) {
    snprintf(msg, cap, "artifact '%s': the run's artifacts are not served",
             a->path);
    return REQ_REFUSED;
  }
  static const char root[] = "/api/2.0/mlflow-artifacts/artifacts/";
  size_t plen = sizeof root + strlen(m->artifact_dir) + 3 * strlen(a->path) + 2;
  char *path = loom_malloc(plen);
  if (!path) {
    snprintf(msg, cap, "out of memory");
    return REQ_RETRY;
  }
  size_t k = (size_t)snprintf(path, plen, "%s%s", root, m->artifact_dir);
  for (const char *p = a->path; *p;) {
    const char *e = strchr(p, '/');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char *part = curl_easy_escape(m->curl, p, (int)len);
    if (!part) {
      loom_free(path);
      snprintf(msg, cap, "out of memory");
      return REQ_RETRY;
    }
    k += (size_t)snprintf(path + k, plen - k, "/%s", part);
    curl_free(part);
    p = e ? e + 1 : p + len;
  }
  req_result r = http(m, "PUT", path, a->data, a->len,
                      "application/octet-stream", deadline, msg, cap);
  loom_free(path);
  return r;
}

static req_result send_batch(loom_mlflow *m, batch *b, double deadline,
                             char *msg, size_t cap) {
  if (b->art)
    return send_artifact(m, b->art, deadline, msg, cap);
  if (!b->body) {
    cJSON *j = batch_json(m, b);
    b->body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!b->body) {
      snprintf(msg, cap, "out of memory");
      return REQ_RETRY;
    }
  }
  return http(m, "POST", "/api/2.0/mlflow/runs/log-batch", b->body,
              strlen(b->body), "application/json", deadline, msg, cap);
}

/* The sender: sets the run up, then sends batches until close, retrying
 * with backoff while the server is away; then ends the run. */
static void *sender_main(void *arg) {
  loom_mlflow *m = arg;
  batch *b = loom_calloc(1, sizeof *b); /* ~40 KB: not on the stack */
  double backoff = 0, retry_at = 0;
  bool ready = false; /* the run exists */
  int refusals = 0;
  char msg[600];
  if (!b) {
    LOOM_WARN("mlflow: out of memory: nothing will be sent to %s", m->uri);
    pthread_mutex_lock(&m->mu);
    m->disabled = true;
    pthread_mutex_unlock(&m->mu);
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&m->mu);
    bool stopping, past;
    for (;;) {
      double now = loom_time_now();
      stopping = m->stop;
      past = stopping && now >= m->deadline;
      bool work = !ready || batch_size(b) > 0 || pending_locked(m) > 0;
      if (past || (stopping && !work) || m->disabled)
        break;
      if (work && now >= retry_at)
        break;
      if (work || stopping) {
        /* A backoff: only close wakes it early. */
        struct timespec ts;
        double until = retry_at;
        if (stopping && m->deadline < until)
          until = m->deadline;
        to_timespec(&ts, until);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
      } else {
        m->sender_waiting = true;
        pthread_cond_wait(&m->cv, &m->mu);
        m->sender_waiting = false;
      }
    }
    if (m->disabled || past ||
        (stopping && ready && batch_size(b) == 0 && pending_locked(m) == 0)) {
      pthread_mutex_unlock(&m->mu);
      break;
    }
    if (ready && batch_size(b) == 0)
      take_batch_locked(m, b);
    double deadline = stopping ? m->deadline : 0;
    pthread_mutex_unlock(&m->mu);

    req_result r;
    size_t n = 0;
    if (!ready && m->resume_id) {
      r = resume_run(m, deadline, msg, sizeof msg);
      if (r == REQ_REFUSED) {
        LOOM_WARN("mlflow: cannot go on with run %s (%s): starting a new run",
                  m->resume_id, msg);
        loom_free(m->resume_id);
        m->resume_id = NULL;
        m->experiment_id[0] = '\0';
        r = REQ_OK; /* on to a new run at once */
      } else if (r == REQ_OK) {
        ready = true;
      }
    } else if (!ready) {
      r = m->experiment_id[0] ? REQ_OK
                              : find_experiment(m, deadline, msg, sizeof msg);
      if (r == REQ_OK)
        r = create_run(m, deadline, msg, sizeof msg);
      if (r == REQ_OK)
        ready = true;
    } else {
      n = batch_size(b);
      r = send_batch(m, b, deadline, msg, sizeof msg);
    }

    pthread_mutex_lock(&m->mu);
    bool reconnected = false, first_failure = false;
    if (r == REQ_RETRY) {
      m->failures++;
      first_failure = !m->ever_failed;
      m->ever_failed = true;
      m->connected = false;
    } else {
      reconnected = !m->connected && m->ever_failed;
      m->connected = true;
      if (r == REQ_OK)
        m->sent += n;
      else
        m->dropped += n;
      m->inflight = m->inflight_m = 0;
    }
    if (r == REQ_REFUSED && !ready) {
      /* Without a run nothing can be sent: drop what is queued, and what
       * comes later. */
      m->disabled = true;
      m->dropped += pending_locked(m);
    }
    uint64_t held = pending_locked(m);
    pthread_mutex_unlock(&m->mu);

    if (r == REQ_RETRY) {
      backoff = backoff > 0 ? backoff * 2 : BACKOFF_FIRST;
      if (backoff > BACKOFF_MAX)
        backoff = BACKOFF_MAX;
      retry_at = loom_time_now() + backoff;
      if (first_failure)
        LOOM_WARN("mlflow: cannot reach %s (%s); retrying, values are kept "
                  "(up to %zu metric values)",
                  m->uri, msg, m->max_buffered);
      continue;
    }
    backoff = 0;
    retry_at = 0;
    if (reconnected)
      LOOM_INFO("mlflow: reached %s again; sending %llu values held", m->uri,
                (unsigned long long)held);
    if (r == REQ_REFUSED) {
      if (!ready)
        LOOM_WARN("mlflow: %s refused the run (%s); nothing will be sent "
                  "to MLflow",
                  m->uri, msg);
      else if (++refusals <= 5)
        LOOM_WARN("mlflow: %s refused %zu values (%s); they are dropped%s",
                  m->uri, n, msg,
                  refusals == 5 ? " (later refusals: counted in dropped)" : "");
    }
    if (ready)
      batch_clear(b);
    if (ready && m->replay) {
      replay_lines(m);
      loom_free(m->replay);
      m->replay = NULL;
    }
  }
  /* What b still holds stays counted in m->inflight: close reports it. */
  if (b) {
    batch_clear(b);
    loom_free(b);
  }
  return NULL;
}

/* -------------------------------------------------------------- the API */

loom_mlflow_opts loom_mlflow_opts_default(void) {
  loom_mlflow_opts o = {.uri = NULL,
                        .experiment = "Default",
                        .run_name = NULL,
                        .timeout_s = 5,
                        .max_buffered = 100000,
                        .replay_jsonl = NULL,
                        .replay_to_step = -1};
  return o;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
  curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void free_handle(loom_mlflow *m) {
  for (size_t i = 0; i < m->nparams; i++)
    free_kv(&m->params[i]);
  for (size_t i = 0; i < m->ntags; i++)
    free_kv(&m->tags[i]);
  while (m->art_head) {
    artifact *a = m->art_head;
    m->art_head = a->next;
    free_artifact(a);
  }
  for (size_t i = 0; i < m->keys_cap; i++)
    loom_free(m->keys[i]);
  loom_free(m->keys);
  loom_free(m->params);
  loom_free(m->tags);
  loom_free(m->ring);
  loom_free(m->uri);
  loom_free(m->experiment);
  loom_free(m->run_name);
  loom_free(m->resume_id);
  loom_free(m->replay);
  for (size_t i = 0; i < m->nlatest; i++)
    free_kv(&m->latest[i]);
  loom_free(m->latest);
  loom_free(m->artifact_dir);
  loom_free(m->resp.body);
  loom_free(m->user);
  if (m->curl)
    curl_easy_cleanup(m->curl);
  loom_free(m);
}

static char *user_name(void) {
  const char *u = getenv("USER");
  if (!u || !*u) {
    struct passwd *pw = getpwuid(getuid());
    u = pw && pw->pw_name ? pw->pw_name : "unknown";
  }
  return dup_str(u);
}

/* A handle for the server uri (its trailing slashes cut) with its curl
 * handle and request timeout; no thread yet. */
static loom_status new_handle(const char *uri, double timeout_s,
                              loom_mlflow **out) {
  *out = NULL;
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK)
    return loom_error(LOOM_ERR_INTERNAL, "mlflow: curl_global_init: %s",
                      curl_easy_strerror(curl_init_rc));
  loom_mlflow *m = loom_calloc(1, sizeof *m);
  if (!m)
    return LOOM_ERR_NOMEM;
  size_t n = strlen(uri);
  while (n > 7 && uri[n - 1] == '/')
    n--;
  m->uri = dup_n(uri, n);
  m->timeout_ms = (long)ceil((timeout_s > 0 ? timeout_s : 5) * 1000);
  m->curl = curl_easy_init();
  if (!m->uri || !m->curl) {
    free_handle(m);
    return loom_error(LOOM_ERR_NOMEM, "mlflow: out of memory opening '%s'",
                      uri);
  }
  *out = m;
  return LOOM_OK;
}

loom_status loom_mlflow_open(loom_mlflow **out, const loom_mlflow_opts *opts) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "mlflow: out is NULL");
  *out = NULL;
  loom_mlflow_opts o = opts ? *opts : loom_mlflow_opts_default();
  const char *uri = o.uri ? o.uri : "";
  size_t scheme = !strncmp(uri, "http://", 7)    ? 7
                  : !strncmp(uri, "https://", 8) ? 8
                                                 : 0;
  if (!scheme || !uri[scheme])
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "mlflow: uri '%s' is not a tracking server's "
                      "http://HOST:PORT or https://HOST[:PORT]",
                      uri);
  if (!o.experiment || !*o.experiment)
    return loom_error(LOOM_ERR_INVALID_ARG, "mlflow: no experiment name");
  if (!(o.timeout_s > 0))
    o.timeout_s = 5;
  if (o.max_buffered == 0)
    o.max_buffered = 100000;
  loom_mlflow *m;
  LOOM_TRY(new_handle(uri, o.timeout_s, &m));
  m->experiment = dup_str(o.experiment);
  m->run_name = o.run_name ? dup_str(o.run_name) : NULL;
  m->on_run = o.on_run;
  m->on_run_ctx = o.on_run_ctx;
  m->resume_id = o.run_id && o.run_id[0] ? dup_str(o.run_id) : NULL;
  m->replay = o.replay_jsonl && o.replay_jsonl[0] && o.replay_to_step >= 0
                  ? dup_str(o.replay_jsonl)
                  : NULL;
  m->replay_to = o.replay_to_step;
  m->user = user_name();
  m->max_buffered = o.max_buffered;
  if (!m->experiment || (o.run_name && !m->run_name) || !m->user ||
      (o.replay_jsonl && o.replay_jsonl[0] && o.replay_to_step >= 0 &&
       !m->replay)) {
    free_handle(m);
    return loom_error(LOOM_ERR_NOMEM, "mlflow: out of memory opening '%s'",
                      uri);
  }
  if (pthread_mutex_init(&m->mu, NULL) != 0) {
    free_handle(m);
    return loom_error(LOOM_ERR_INTERNAL, "mlflow: pthread_mutex_init failed");
  }
  pthread_condattr_t ca;
  bool cv_ok = pthread_condattr_init(&ca) == 0;
  if (cv_ok) {
    /* Backoff and deadline waits on loom_time_now()'s clock. */
    cv_ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
            pthread_cond_init(&m->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
  }
  if (!cv_ok) {
    pthread_mutex_destroy(&m->mu);
    free_handle(m);
    return loom_error(LOOM_ERR_INTERNAL, "mlflow: pthread_cond_init failed");
  }
  int e = pthread_create(&m->thread, NULL, sender_main, m);
  if (e != 0) {
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free_handle(m);
    return loom_error(LOOM_ERR_INTERNAL, "mlflow: cannot start its thread: %s",
                      strerror(e));
  }
  *out = m;
  return LOOM_OK;
}

/* A bad key: dropped, counted, one warning per handle. */
static void bad_key(loom_mlflow *m, const char *what, const char *key) {
  pthread_mutex_lock(&m->mu);
  m->dropped++;
  bool warn = !m->warned_key;
  m->warned_key = true;
  pthread_mutex_unlock(&m->mu);
  if (warn)
    LOOM_WARN("mlflow: %s '%.300s' is not a name MLflow takes (letters, "
              "digits, _ - . / : and space, at most %d bytes, no empty, . or "
              ".. parts): dropped, and so are later ones (counted)",
              what, key ? key : "(null)", KEY_MAX);
}

void loom_mlflow_metric(loom_mlflow *m, const char *key, double value,
                        int64_t step, double wall_time_s) {
  if (!m)
    return;
  if (!valid_key(key)) {
    bad_key(m, "metric", key);
    return;
  }
  if (!(wall_time_s > 0) || !isfinite(wall_time_s))
    wall_time_s = loom_time_wall();
  metric x = {NULL, value, step, (int64_t)llround(wall_time_s * 1000)};
  pthread_mutex_lock(&m->mu);
  uint64_t dropped = m->dropped;
  /* ring_room_locked counts the oldest value it drops. */
  if (!m->disabled && (x.key = intern_locked(m, key)) && ring_room_locked(m)) {
    m->ring[(m->head + m->count) % m->cap] = x;
    m->count++;
    wake_locked(m);
  } else {
    m->dropped++;
  }
  bool warn = m->dropped > dropped && !m->disabled && !m->warned_overflow;
  if (warn)
    m->warned_overflow = true;
  pthread_mutex_unlock(&m->mu);
  if (warn)
    LOOM_WARN("mlflow: %zu metric values wait for %s: the oldest are dropped "
              "from now on (counted)",
              m->max_buffered, m->uri);
}

void loom_mlflow_param(loom_mlflow *m, const char *key, const char *value) {
  if (!m)
    return;
  if (!valid_key(key)) {
    bad_key(m, "param", key);
    return;
  }
  if (!value)
    value = "";
  size_t vn = cut_utf8(value, PARAM_VALUE_MAX);
  if (value[vn])
    LOOM_WARN("mlflow: param '%s' is %zu bytes, cut to MLflow's %d", key,
              strlen(value), PARAM_VALUE_MAX);
  pthread_mutex_lock(&m->mu);
  const kv *had = NULL;
  for (size_t i = 0; i < m->nparams && !had; i++)
    if (strcmp(m->params[i].key, key) == 0)
      had = &m->params[i];
  bool differs =
      had && (strlen(had->value) != vn || memcmp(had->value, value, vn) != 0);
  char first[64] = "";
  if (differs)
    snprintf(first, sizeof first, "%s", had->value);
  if (m->disabled) {
    m->dropped++;
  } else if (!had) {
    kv p = {dup_str(key), dup_n(value, vn)};
    if (p.key && p.value && grow_kv(&m->params, m->nparams, &m->params_cap)) {
      m->params[m->nparams++] = p;
      wake_locked(m);
    } else {
      free_kv(&p);
      m->dropped++;
    }
  }
  pthread_mutex_unlock(&m->mu);
  if (differs)
    LOOM_WARN("mlflow: param '%s' was logged already as '%s'; MLflow's "
              "params cannot change: the first value stays",
              key, first);
}

void loom_mlflow_tag(loom_mlflow *m, const char *key, const char *value) {
  if (!m)
    return;
  if (!valid_key(key)) {
    bad_key(m, "tag", key);
    return;
  }
  if (!value)
    value = "";
  size_t vn = cut_utf8(value, TAG_VALUE_MAX);
  char *v = dup_n(value, vn);
  pthread_mutex_lock(&m->mu);
  kv *had = NULL;
  for (size_t i = 0; i < m->ntags && !had; i++)
    if (strcmp(m->tags[i].key, key) == 0)
      had = &m->tags[i];
  if (m->disabled || !v) {
    m->dropped++;
  } else if (had) { /* not sent yet: the new value replaces it */
    loom_free(had->value);
    had->value = v;
    v = NULL;
  } else {
    kv t = {dup_str(key), v};
    if (t.key && grow_kv(&m->tags, m->ntags, &m->tags_cap)) {
      m->tags[m->ntags++] = t;
      wake_locked(m);
    } else {
      loom_free(t.key);
      m->dropped++;
    }
    v = NULL;
  }
  pthread_mutex_unlock(&m->mu);
  loom_free(v);
}

/* A relative path of names without empty, "." or ".." parts. */
static bool valid_artifact_path(const char *p) {
  if (!p || !*p)
    return false;
  for (;;) {
    const char *e = strchr(p, '/');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == 0 || (len == 1 && p[0] == '.') ||
        (len == 2 && p[0] == '.' && p[1] == '.'))
      return false;
    if (!e)
      return true;
    p = e + 1;
  }
}

loom_status loom_mlflow_artifact(loom_mlflow *m, const char *local_path,
                                 const char *artifact_path) {
  if (!m || !local_path)
    return loom_error(LOOM_ERR_INVALID_ARG, "mlflow: artifact: bad arguments");
  if (!valid_artifact_path(artifact_path))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "mlflow: artifact path '%s' is not a relative path "
                      "without empty, . or .. parts",
                      artifact_path ? artifact_path : "(null)");
  artifact *a = loom_calloc(1, sizeof *a);
  if (!a)
    return LOOM_ERR_NOMEM;
  char *bytes = NULL;
  loom_status st = loom_obs_read_file(local_path, &bytes, &a->len);
  if (st != LOOM_OK)
    st = loom_error_context(st, "mlflow: artifact");
  a->data = (unsigned char *)bytes;
  if (st == LOOM_OK && !(a->path = dup_str(artifact_path)))
    st = LOOM_ERR_NOMEM;
  if (st != LOOM_OK) {
    free_artifact(a);
    return st;
  }
  pthread_mutex_lock(&m->mu);
  bool disabled = m->disabled;
  if (disabled) {
    m->dropped++;
  } else {
    if (m->art_tail)
      m->art_tail->next = a;
    else
      m->art_head = a;
    m->art_tail = a;
    m->nart++;
    wake_locked(m);
  }
  pthread_mutex_unlock(&m->mu);
  if (disabled)
    free_artifact(a);
  return LOOM_OK;
}

const char *loom_mlflow_run_id(const loom_mlflow *m) {
  if (!m || !atomic_load(&((loom_mlflow *)m)->have_run))
    return "";
  return m->run_id;
}

void loom_mlflow_get_stats(const loom_mlflow *m, loom_mlflow_stats *s) {
  memset(s, 0, sizeof *s);
  if (!m)
    return;
  loom_mlflow *w = (loom_mlflow *)m; /* the mutex, not the values */
  pthread_mutex_lock(&w->mu);
  s->sent = m->sent;
  s->dropped = m->dropped;
  s->pending = pending_locked(m);
  s->failures = m->failures;
  s->connected = m->connected;
  pthread_mutex_unlock(&w->mu);
}

/* runs/update: the run's end, with one request (the thread has stopped). */
static void end_run(loom_mlflow *m, const char *status) {
  cJSON *req = cJSON_CreateObject();
  cJSON_AddStringToObject(req, "run_id", m->run_id);
  cJSON_AddStringToObject(req, "status", status);
  add_i64(req, "end_time", (int64_t)llround(loom_time_wall() * 1000));
  char msg[600];
  req_result r =
      post_json(m, "/api/2.0/mlflow/runs/update", req, 0, msg, sizeof msg);
  cJSON_Delete(req);
  if (r != REQ_OK)
    LOOM_WARN("mlflow: could not end run %s as %s (%s); it stays RUNNING",
              m->run_id, status, msg);
}

loom_status loom_mlflow_read_run_id(const char *run_dir, char *out, size_t n) {
  if (!out || n == 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_mlflow_read_run_id: no room for the id");
  out[0] = '\0';
  if (!run_dir)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_mlflow_read_run_id: run_dir is NULL");
  int dfd = open(run_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int fd = dfd < 0 ? -1
                   : loom_fs_open_read_at(dfd, LOOM_MLFLOW_RUN_ID_FILE,
                                          O_NOFOLLOW, NULL);
  if (dfd >= 0)
    close(dfd);
  if (fd < 0)
    return LOOM_OK;
  ssize_t got = read(fd, out, n - 1);
  close(fd);
  out[got > 0 ? got : 0] = '\0';
  out[strcspn(out, "\r\n")] = '\0';
  for (const char *c = out; *c; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') ||
          (*c >= 'A' && *c <= 'F') || *c == '-')) {
      loom_status st = loom_error(LOOM_ERR_CORRUPT,
                                  "%s/" LOOM_MLFLOW_RUN_ID_FILE
                                  ": not an MLflow run id ('%s')",
                                  run_dir, out);
      out[0] = '\0';
      return st;
    }
  return LOOM_OK;
}

loom_status loom_mlflow_end_stale(const char *uri, const char *run_id,
                                  const char *status, double timeout_s,
                                  bool *ended) {
  if (ended)
    *ended = false;
  const char *u = uri ? uri : "";
  if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "mlflow: uri '%s' is not a tracking server's "
                      "http://HOST:PORT or https://HOST[:PORT]",
                      u);
  if (!run_id || !*run_id || strlen(run_id) >= ID_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG, "mlflow: no run id to end");
  if (!status ||
      (strcmp(status, "FINISHED") != 0 && strcmp(status, "FAILED") != 0 &&
       strcmp(status, "KILLED") != 0))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "mlflow: run status '%s' is none of FINISHED, FAILED, "
                      "KILLED",
                      status ? status : "(null)");
  /* A handle without its thread: two requests, made here. */
  loom_mlflow *m;
  LOOM_TRY(new_handle(u, timeout_s, &m));
  char *id = curl_easy_escape(m->curl, run_id, 0);
  if (!id) {
    free_handle(m);
    return loom_error(LOOM_ERR_NOMEM, "mlflow: out of memory");
  }
  char path[ID_MAX * 3 + 64], msg[600];
  snprintf(path, sizeof path, "/api/2.0/mlflow/runs/get?run_id=%s", id);
  curl_free(id);
  loom_status st = LOOM_OK;
  if (http(m, "GET", path, NULL, 0, NULL, 0, msg, sizeof msg) != REQ_OK) {
    st = loom_error(LOOM_ERR_IO, "mlflow: %s: run %s: %s", m->uri, run_id, msg);
  } else {
    cJSON *j = answer(m);
    const cJSON *now = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "run"), "info"),
        "status");
    bool running = cJSON_IsString(now) && !strcmp(now->valuestring, "RUNNING");
    cJSON_Delete(j);
    if (running) {
      snprintf(m->run_id, sizeof m->run_id, "%s", run_id);
      cJSON *req = cJSON_CreateObject();
      cJSON_AddStringToObject(req, "run_id", m->run_id);
      cJSON_AddStringToObject(req, "status", status);
      add_i64(req, "end_time", (int64_t)llround(loom_time_wall() * 1000));
      req_result r =
          post_json(m, "/api/2.0/mlflow/runs/update", req, 0, msg, sizeof msg);
      cJSON_Delete(req);
      if (r != REQ_OK)
        st = loom_error(LOOM_ERR_IO, "mlflow: %s: ending run %s as %s: %s",
                        m->uri, run_id, status, msg);
      else if (ended)
        *ended = true;
    }
  }
  free_handle(m);
  return st;
}

void loom_mlflow_close(loom_mlflow *m, const char *status, double deadline_s) {
  if (!m)
    return;
  if (!status ||
      (strcmp(status, "FINISHED") != 0 && strcmp(status, "FAILED") != 0 &&
       strcmp(status, "KILLED") != 0)) {
    if (status)
      LOOM_WARN("mlflow: run status '%s' is none of FINISHED, FAILED, "
                "KILLED: FINISHED",
                status);
    status = "FINISHED";
  }
  if (!(deadline_s >= 0))
    deadline_s = 0;
  pthread_mutex_lock(&m->mu);
  m->stop = true;
  m->deadline = loom_time_now() + deadline_s;
  pthread_cond_signal(&m->cv);
  pthread_mutex_unlock(&m->mu);
  pthread_join(m->thread, NULL);

  /* The thread is gone: what it left is read without the lock. */
  uint64_t lost = pending_locked(m);
  bool ran = atomic_load(&m->have_run);
  /* A server that answered the last request gets the run's end (one
   * request, at most the timeout past the deadline); one that did not is
   * not waited for again. */
  if (ran && m->connected && !m->disabled)
    end_run(m, status);
  else if (ran)
    LOOM_WARN("mlflow: %s did not answer before the deadline (%.1f s): run "
              "%s stays RUNNING",
              m->uri, deadline_s, m->run_id);
  if (lost)
    LOOM_WARN("mlflow: %llu values were not sent to %s before the close "
              "deadline (%.1f s): lost",
              (unsigned long long)lost, m->uri, deadline_s);
  if (m->dropped)
    LOOM_WARN("mlflow: %llu values were dropped (buffer full, refused by the "
              "server or bad names)",
              (unsigned long long)m->dropped);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free_handle(m);
}
