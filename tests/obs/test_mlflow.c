/* Tests of the MLflow client without MLflow: arguments; a server that is
 * not there (calls return at once, values wait in a bounded queue, the
 * failures are counted, close keeps to its deadline and says what was
 * lost); and a small HTTP server written here that answers as MLflow's
 * REST API does, to check the requests: the experiment race, batches
 * within MLflow's limits, a 503 retried, a 400 dropped, the artifact's
 * PUT, the run's end. The real server is tests/obs/mlflow.sh. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loom/obs.h"
#include "tt.h"

/* A listening socket on 127.0.0.1 at a port the system chose. */
static int listen_any(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

/* Polls the stats until cond holds or 30 s pass (the time is a bound, not
 * a measure: under load it is reached long before). */
#define WAIT_FOR(m, s, cond)                                                   \
  do {                                                                         \
    double t_end_ = loom_time_now() + 30;                                      \
    for (;;) {                                                                 \
      loom_mlflow_get_stats((m), &(s));                                        \
      if ((cond) || loom_time_now() > t_end_)                                  \
        break;                                                                 \
      usleep(2000);                                                            \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------ arguments */

TT_TEST(test_bad_args) {
  loom_mlflow *m = (loom_mlflow *)1;
  loom_mlflow_opts o = loom_mlflow_opts_default();
  TT_CHECK(o.timeout_s == 5);
  TT_CHECK_EQ(o.max_buffered, 100000);
  const char *bad[] = {"ftp://x", "", NULL, "http://", "https://"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.uri = bad[i];
    TT_CHECK_EQ(loom_mlflow_open(&m, &o), LOOM_ERR_INVALID_ARG);
    TT_CHECK(m == NULL);
    TT_CHECK(strstr(loom_last_error(), "uri") != NULL);
  }
  o.uri = "http://127.0.0.1:1";
  o.experiment = "";
  TT_CHECK_EQ(loom_mlflow_open(&m, &o), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "experiment") != NULL);
  loom_mlflow_close(NULL, "FINISHED", 1); /* a no-op */
  TT_CHECK_STR(loom_mlflow_run_id(NULL), "");
}

/* ------------------------------------------------------ no server there */

TT_TEST(test_unreachable) {
  /* A port nothing listens on: taken, then let go. */
  int port = 0, fd = listen_any(&port);
  TT_REQUIRE(fd >= 0);
  close(fd);
  char uri[64];
  snprintf(uri, sizeof uri, "http://127.0.0.1:%d", port);
  loom_mlflow_opts o = loom_mlflow_opts_default();
  o.uri = uri;
  o.experiment = "unit";
  o.timeout_s = 0.2;
  o.max_buffered = 500;
  loom_mlflow *m = NULL;
  tt_capture_begin();
  loom_status st = loom_mlflow_open(&m, &o);
  if (st != LOOM_OK) {
    tt_capture_end();
    TT_REQUIRE_OK(st);
  }
  loom_mlflow_param(m, "lr", "0.1");
  loom_mlflow_tag(m, "model", "mlp");
  double t0 = loom_time_now();
  for (int i = 0; i < 10000; i++)
    loom_mlflow_metric(m, "loss", 1.0 / (i + 1), i, 0);
  double t_calls = loom_time_now() - t0;
  loom_mlflow_metric(m, "bad key?", 1, 0, 0); /* dropped, warned */
  loom_mlflow_stats s;
  loom_mlflow_get_stats(m, &s);
  /* Nothing sent: the param, the tag and the newest 500 values wait. */
  TT_CHECK_EQ(s.pending, 502);
  TT_CHECK_EQ(s.dropped, 9500 + 1);
  TT_CHECK_EQ(s.sent, 0);
  WAIT_FOR(m, s, s.failures > 0);
  TT_CHECK(s.failures > 0);
  TT_CHECK(!s.connected);
  TT_CHECK_STR(loom_mlflow_run_id(m), "");
  double deadline = 0.5;
  t0 = loom_time_now();
  loom_mlflow_close(m, "FINISHED", deadline);
  double t_close = loom_time_now() - t0;
  const char *err = tt_capture_end();
  printf("10000 metric calls: %.1f ms; close: %.2f s (deadline %.1f s)\n",
         t_calls * 1e3, t_close, deadline);
  TT_CHECK(t_close < deadline + o.timeout_s + 1);
  TT_CHECK_HAS(err, "cannot reach");
  TT_CHECK_HAS(err, "the oldest are dropped");
  TT_CHECK_HAS(err, "'bad key?' is not a name MLflow takes");
  TT_CHECK_HAS(err, "502 values were not sent");
  /* One warning for the failures, however many there were. */
  const char *first = strstr(err, "cannot reach");
  TT_CHECK(first && !strstr(first + 1, "cannot reach"));
}

/* ------------------------------------------- a server that speaks MLflow */

typedef struct {
  int fd, port;
  pthread_t thread;
  pthread_mutex_t mu;
  bool stop;
  /* What it saw (under mu). */
  int get_by_name, creates, batches, fail_next_batch;
  int max_metrics, max_params, max_tags, max_entities;
  int params, tags, nan_values;
  int steps_seen[3000]; /* times each step of metric "m" arrived */
  bool bad_value;       /* a value of "m" that is not 1/(step + 3) */
  char status[32];
  char art_path[256];
  char art[64];
  size_t art_len;
  char user_agent[64];
  char run_status[16]; /* what runs/get answers (test_end_stale) */
  int gets;            /* runs/get requests */
} fake;

static void reply(int c, int code, const char *body) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   code, strlen(body));
  if (write(c, head, (size_t)n) != n || write(c, body, strlen(body)) < 0)
    return;
}

static void on_batch(fake *f, cJSON *j, int c) {
  const cJSON *ms = cJSON_GetObjectItem(j, "metrics");
  const cJSON *ps = cJSON_GetObjectItem(j, "params");
  const cJSON *ts = cJSON_GetObjectItem(j, "tags");
  int nm = cJSON_GetArraySize(ms), np = cJSON_GetArraySize(ps),
      nt = cJSON_GetArraySize(ts);
  const cJSON *x;
  cJSON_ArrayForEach(x, ps) {
    const char *v = cJSON_GetObjectItem(x, "value")->valuestring;
    if (strcmp(v, "refuse") == 0) {
      reply(c, 400,
            "{\"error_code\": \"INVALID_PARAMETER_VALUE\", \"message\": "
            "\"refused here\"}");
      return;
    }
  }
  pthread_mutex_lock(&f->mu);
  bool fail = f->fail_next_batch > 0;
  if (fail) {
    f->fail_next_batch--;
  } else {
    f->batches++;
    f->max_metrics = nm > f->max_metrics ? nm : f->max_metrics;
    f->max_params = np > f->max_params ? np : f->max_params;
    f->max_tags = nt > f->max_tags ? nt : f->max_tags;
    if (nm + np + nt > f->max_entities)
      f->max_entities = nm + np + nt;
    f->params += np;
    f->tags += nt;
    cJSON_ArrayForEach(x, ms) {
      const char *key = cJSON_GetObjectItem(x, "key")->valuestring;
      const cJSON *v = cJSON_GetObjectItem(x, "value");
      int step = (int)cJSON_GetObjectItem(x, "step")->valuedouble;
      if (strcmp(key, "nan") == 0 && cJSON_IsString(v) &&
          strcmp(v->valuestring, "NaN") == 0)
        f->nan_values++;
      if (strcmp(key, "m") == 0 && step >= 0 && step < 3000) {
        f->steps_seen[step]++;
        if (!cJSON_IsNumber(v) || v->valuedouble != 1.0 / (step + 3))
          f->bad_value = true;
      }
    }
  }
  pthread_mutex_unlock(&f->mu);
  reply(c, fail ? 503 : 200, fail ? "busy" : "{}");
}

/* One request: its line, its headers, its body (Content-Length). */
static void serve_one(fake *f, int c) {
  size_t cap = 1 << 22, n = 0;
  char *buf = malloc(cap + 1);
  char *body = NULL;
  size_t want = 0;
  while (buf && n < cap) {
    ssize_t r = read(c, buf + n, cap - n);
    if (r <= 0)
      break;
    n += (size_t)r;
    buf[n] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (end && !body) {
      body = end + 4;
      const char *cl = strstr(buf, "Content-Length: ");
      want = cl ? (size_t)strtoul(cl + 16, NULL, 10) : 0;
    }
    if (body && (size_t)(buf + n - body) >= want)
      break;
  }
  if (!buf || !body) {
    free(buf);
    return;
  }
  char method[8] = "", path[512] = "";
  sscanf(buf, "%7s %511s", method, path);
  const char *ua = strstr(buf, "User-Agent: ");
  pthread_mutex_lock(&f->mu);
  if (ua)
    sscanf(ua + 12, "%63s", f->user_agent);
  pthread_mutex_unlock(&f->mu);
  cJSON *j = cJSON_ParseWithLength(body, want);
  if (strncmp(path, "/api/2.0/mlflow/experiments/get-by-name?", 40) == 0) {
    pthread_mutex_lock(&f->mu);
    int k = f->get_by_name++;
    pthread_mutex_unlock(&f->mu);
    if (k == 0)
      reply(c, 404,
            "{\"error_code\": \"RESOURCE_DOES_NOT_EXIST\", "
            "\"message\": \"no such experiment\"}");
    else
      reply(c, 200,
            "{\"experiment\": {\"experiment_id\": \"7\", "
            "\"lifecycle_stage\": \"active\"}}");
  } else if (strcmp(path, "/api/2.0/mlflow/experiments/create") == 0) {
    pthread_mutex_lock(&f->mu);
    f->creates++;
    pthread_mutex_unlock(&f->mu);
    /* Someone else made it meanwhile. */
    reply(c, 400,
          "{\"error_code\": \"RESOURCE_ALREADY_EXISTS\", "
          "\"message\": \"Experiment(name=unit) already exists\"}");
  } else if (strcmp(path, "/api/2.0/mlflow/runs/create") == 0) {
    reply(c, 200,
          "{\"run\": {\"info\": {\"run_id\": \"abc\", "
          "\"artifact_uri\": \"mlflow-artifacts:/7/abc/artifacts\"}}}");
  } else if (strcmp(path, "/api/2.0/mlflow/runs/get?run_id=r-1") == 0) {
    char ans[160];
    pthread_mutex_lock(&f->mu);
    f->gets++;
    snprintf(ans, sizeof ans,
             "{\"run\": {\"info\": {\"run_id\": \"r-1\", "
             "\"experiment_id\": \"7\", \"status\": \"%s\"}}}",
             f->run_status);
    pthread_mutex_unlock(&f->mu);
    reply(c, 200, ans);
  } else if (strcmp(path, "/api/2.0/mlflow/runs/log-batch") == 0 && j) {
    on_batch(f, j, c);
  } else if (strcmp(path, "/api/2.0/mlflow/runs/update") == 0 && j) {
    const cJSON *s = cJSON_GetObjectItem(j, "status");
    pthread_mutex_lock(&f->mu);
    snprintf(f->status, sizeof f->status, "%s",
             cJSON_IsString(s) ? s->valuestring : "?");
    pthread_mutex_unlock(&f->mu);
    reply(c, 200, "{}");
  } else if (strcmp(method, "PUT") == 0) {
    pthread_mutex_lock(&f->mu);
    snprintf(f->art_path, sizeof f->art_path, "%s", path);
    f->art_len = want < sizeof f->art ? want : sizeof f->art;
    memcpy(f->art, body, f->art_len);
    pthread_mutex_unlock(&f->mu);
    reply(c, 200, "{}");
  } else {
    reply(c, 404,
          "{\"error_code\": \"ENDPOINT_NOT_FOUND\", \"message\": \"?\"}");
  }
  cJSON_Delete(j);
  free(buf);
}

static void *fake_main(void *arg) {
  fake *f = arg;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    bool stop = f->stop;
    pthread_mutex_unlock(&f->mu);
    if (stop)
      break;
    struct pollfd p = {.fd = f->fd, .events = POLLIN};
    if (poll(&p, 1, 50) <= 0)
      continue;
    int c = accept(f->fd, NULL, NULL);
    if (c < 0)
      continue;
    serve_one(f, c);
    close(c);
  }
  return NULL;
}

TT_TEST(test_fake_server) {
  fake *f = calloc(1, sizeof *f);
  TT_REQUIRE(f);
  f->fd = listen_any(&f->port);
  TT_REQUIRE(f->fd >= 0);
  f->fail_next_batch = 1;
  pthread_mutex_init(&f->mu, NULL);
  pthread_create(&f->thread, NULL, fake_main, f);
  char uri[64], art_file[] = "/tmp/loom_mlflow_XXXXXX";
  snprintf(uri, sizeof uri, "http://127.0.0.1:%d/", f->port);
  int afd = mkstemp(art_file);
  TT_REQUIRE(afd >= 0);
  static const char art[] = "bytes \x01\x02\xff of an artifact";
  TT_REQUIRE(write(afd, art, sizeof art) == (ssize_t)sizeof art);
  close(afd);

  loom_mlflow_opts o = loom_mlflow_opts_default();
  o.uri = uri;
  o.experiment = "unit";
  o.run_name = "r1";
  loom_mlflow *m = NULL;
  loom_log_level level = loom_log_get_level();
  loom_log_set_level(LOOM_LOG_INFO); /* the reconnection's line */
  tt_capture_begin();
  loom_status st = loom_mlflow_open(&m, &o);
  if (st != LOOM_OK) {
    tt_capture_end();
    loom_log_set_level(level);
    TT_REQUIRE_OK(st);
  }
  char k[32];
  for (int i = 0; i < 250; i++) {
    snprintf(k, sizeof k, "p%d", i);
    loom_mlflow_param(m, k, "v");
  }
  loom_mlflow_param(m, "p0", "v"); /* the same again: nothing */
  for (int i = 0; i < 5; i++) {
    snprintf(k, sizeof k, "t/%d", i);
    loom_mlflow_tag(m, k, "x");
  }
  for (int i = 0; i < 2500; i++)
    loom_mlflow_metric(m, "m", 1.0 / (i + 3), i, 1700000000.0 + i);
  loom_mlflow_metric(m, "nan", NAN, 0, 0);
  TT_CHECK_EQ(loom_mlflow_artifact(m, art_file, "dir/a b.bin"), LOOM_OK);
  TT_CHECK_EQ(loom_mlflow_artifact(m, art_file, "../x"), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_mlflow_artifact(m, "/nonexistent/file", "x"), LOOM_ERR_IO);
  loom_mlflow_stats s;
  WAIT_FOR(m, s, s.pending == 0);
  TT_CHECK_EQ(s.pending, 0);
  TT_CHECK_EQ(s.sent, 250 + 5 + 2500 + 1 + 1);
  TT_CHECK_EQ(s.dropped, 0);
  TT_CHECK(s.failures >= 1); /* the 503 */
  TT_CHECK(s.connected);
  TT_CHECK_STR(loom_mlflow_run_id(m), "abc");

  /* A second value of a param: refused here, a warning. */
  loom_mlflow_param(m, "p0", "w");
  /* One the server refuses: dropped, with the server's message. */
  loom_mlflow_param(m, "q", "refuse");
  WAIT_FOR(m, s, s.pending == 0 && s.dropped == 1);
  TT_CHECK_EQ(s.dropped, 1);
  loom_mlflow_metric(m, "m", 1.0 / 2503, 2500, 0); /* goes on after it */
  loom_mlflow_close(m, "KILLED", 10);
  const char *err = tt_capture_end();
  loom_log_set_level(level);
  TT_CHECK_HAS(err, "param 'p0' was logged already as 'v'");
  TT_CHECK_HAS(err, "INVALID_PARAMETER_VALUE: refused here");
  TT_CHECK_HAS(err, "cannot reach");   /* the 503 */
  TT_CHECK_HAS(err, "again; sending"); /* and back */
  TT_CHECK(!strstr(err, "not sent"));  /* nothing lost */

  pthread_mutex_lock(&f->mu);
  f->stop = true;
  pthread_mutex_unlock(&f->mu);
  pthread_join(f->thread, NULL);
  close(f->fd);
  TT_CHECK_EQ(f->get_by_name, 2); /* 404, create: exists, found */
  TT_CHECK_EQ(f->creates, 1);
  TT_CHECK(f->max_metrics <= 1000);
  TT_CHECK(f->max_params <= 100 && f->max_tags <= 100);
  TT_CHECK(f->max_entities <= 1000);
  TT_CHECK(f->batches >= 3); /* 2500 values, 1000 a call at most */
  TT_CHECK_EQ(f->params, 250);
  TT_CHECK_EQ(f->tags, 5);
  TT_CHECK_EQ(f->nan_values, 1);
  int once = 0;
  for (int i = 0; i <= 2500; i++)
    once += f->steps_seen[i] == 1;
  TT_CHECK_EQ(once, 2501);
  TT_CHECK(!f->bad_value);
  TT_CHECK_STR(f->status, "KILLED");
  TT_CHECK_STR(
      f->art_path,
      "/api/2.0/mlflow-artifacts/artifacts/7/abc/artifacts/dir/a%20b.bin");
  TT_CHECK_EQ(f->art_len, sizeof art);
  TT_CHECK(memcmp(f->art, art, sizeof art) == 0);
  TT_CHECK_STR(f->user_agent, "loom");
  pthread_mutex_destroy(&f->mu);
  free(f);
  unlink(art_file);
}

/* loom_mlflow_end_stale: ends a run only while the server says RUNNING
 * (what loom run does for a job whose ranks died). */
TT_TEST(test_end_stale) {
  fake *f = calloc(1, sizeof *f);
  TT_REQUIRE(f);
  f->fd = listen_any(&f->port);
  TT_REQUIRE(f->fd >= 0);
  pthread_mutex_init(&f->mu, NULL);
  pthread_create(&f->thread, NULL, fake_main, f);
  char uri[64];
  snprintf(uri, sizeof uri, "http://127.0.0.1:%d", f->port);
  bool ended = true;
  snprintf(f->run_status, sizeof f->run_status, "FINISHED");
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, "r-1", "FAILED", 5, &ended), LOOM_OK);
  TT_CHECK(!ended);
  pthread_mutex_lock(&f->mu);
  TT_CHECK_STR(f->status, ""); /* no update: the ranks ended it */
  snprintf(f->run_status, sizeof f->run_status, "RUNNING");
  pthread_mutex_unlock(&f->mu);
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, "r-1", "FAILED", 5, &ended), LOOM_OK);
  TT_CHECK(ended);
  pthread_mutex_lock(&f->mu);
  TT_CHECK_STR(f->status, "FAILED");
  TT_CHECK_EQ(f->gets, 2);
  pthread_mutex_unlock(&f->mu);
  /* A run the server does not know: its 404, named. */
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, "r-2", "FAILED", 5, &ended),
              LOOM_ERR_IO);
  TT_CHECK(!ended);
  TT_CHECK_HAS(loom_last_error(), "run r-2");
  TT_CHECK_HAS(loom_last_error(), "ENDPOINT_NOT_FOUND");
  /* Bad arguments. */
  TT_CHECK_EQ(loom_mlflow_end_stale(NULL, "r-1", "FAILED", 5, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_mlflow_end_stale("ftp://x", "r-1", "FAILED", 5, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, NULL, "FAILED", 5, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, "r-1", "DONE", 5, NULL),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, "r-1", NULL, 5, NULL),
              LOOM_ERR_INVALID_ARG);
  pthread_mutex_lock(&f->mu);
  f->stop = true;
  pthread_mutex_unlock(&f->mu);
  pthread_join(f->thread, NULL);
  close(f->fd);
  /* Nobody listening any more: an error naming the server. */
  TT_CHECK_EQ(loom_mlflow_end_stale(uri, "r-1", "FAILED", 1, &ended),
              LOOM_ERR_IO);
  TT_CHECK_HAS(loom_last_error(), uri);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

/* loom_mlflow_read_run_id: the id a run directory keeps; none; a file
 * that holds no id. */
TT_TEST(test_read_run_id) {
  char dir[] = "/tmp/loom_mlflow_id_XXXXXX", path[64], id[128];
  TT_REQUIRE(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/" LOOM_MLFLOW_RUN_ID_FILE, dir);
  TT_CHECK_OK(loom_mlflow_read_run_id(dir, id, sizeof id));
  TT_CHECK_STR(id, "");
  FILE *f = fopen(path, "w");
  TT_REQUIRE(f);
  fputs("0a1B-2c\n", f);
  fclose(f);
  TT_CHECK_OK(loom_mlflow_read_run_id(dir, id, sizeof id));
  TT_CHECK_STR(id, "0a1B-2c");
  f = fopen(path, "w");
  TT_REQUIRE(f);
  fputs("not/an id", f);
  fclose(f);
  TT_CHECK_EQ(loom_mlflow_read_run_id(dir, id, sizeof id), LOOM_ERR_CORRUPT);
  TT_CHECK_STR(id, "");
  TT_CHECK_HAS(loom_last_error(), "not an MLflow run id ('not/an id')");
  unlink(path);
  rmdir(dir);
}

int main(void) {
  TT_RUN(test_read_run_id);
  TT_RUN(test_end_stale);
  TT_RUN(test_bad_args);
  TT_RUN(test_unreachable);
  TT_RUN(test_fake_server);
  return tt_finish();
}
