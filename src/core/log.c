/* Levelled logging to stderr with an optional "[rank r]" prefix, and a
 * second sink: a rank's log file with time stamps. */
#include "loom/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static const char *level_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_LOG_LEVEL_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof level_names / sizeof level_names[0] ==
                   LOOM_LOG_LEVEL_COUNT,
               "log level table size");

static atomic_int log_level = -1; /* -1: not read from LOOM_LOG yet */
static atomic_int log_rank = -1;
/* The file sink: set and cleared by the trainer, written by any thread. */
static pthread_mutex_t file_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;
static atomic_bool file_on; /* log_file is set: read without the lock */
static atomic_bool console_quiet;

static loom_log_level level_from_env(void) {
  const char *v = getenv("LOOM_LOG");
  if (v)
    for (int i = 0; i < LOOM_LOG_LEVEL_COUNT; i++)
      if (strcmp(v, level_names[i]) == 0)
        return (loom_log_level)i;
  return LOOM_LOG_INFO;
}

loom_log_level loom_log_get_level(void) {
  int l = atomic_load(&log_level);
  if (l < 0) {
    l = (int)level_from_env();
    atomic_store(&log_level, l);
  }
  return (loom_log_level)l;
}

void loom_log_set_level(loom_log_level level) {
  atomic_store(&log_level, (int)level);
}

void loom_log_set_rank(int rank) { atomic_store(&log_rank, rank); }

void loom_log_set_file(FILE *f, bool quiet) {
  pthread_mutex_lock(&file_mu);
  log_file = f;
  atomic_store(&file_on, f != NULL);
  atomic_store(&console_quiet, f && quiet);
  pthread_mutex_unlock(&file_mu);
}

/* "2026-11-26T12:06:36.123Z " */
static void stamp(char *buf, size_t n) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + k, n - k, ".%03dZ ", (int)(tv.tv_usec / 1000));
}

static void file_write(const char *msg) {
  pthread_mutex_lock(&file_mu);
  if (log_file) {
    char ts[40];
    stamp(ts, sizeof ts);
    fprintf(log_file, "%s%s\n", ts, msg);
    fflush(log_file);
  }
  pthread_mutex_unlock(&file_mu);
}

void loom_log_file(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  file_write(msg);
}

void loom_log(loom_log_level level, const char *fmt, ...) {
  if (level >= LOOM_LOG_OFF)
    return;
  loom_log_level shown = loom_log_get_level();
  bool to_console = level >= shown;
  if (atomic_load(&console_quiet) && level < LOOM_LOG_WARN)
    to_console = false;
  /* The file keeps info and above whatever the console shows. */
  bool to_file = atomic_load(&file_on) &&
                 level >= (shown < LOOM_LOG_INFO ? shown : LOOM_LOG_INFO);
  if (!to_console && !to_file)
    return;
  char msg[2048];
  int n = 0;
  int rank = atomic_load(&log_rank);
  if (rank >= 0)
    n = snprintf(msg, sizeof msg, "[rank %d] ", rank);
  if (level != LOOM_LOG_INFO)
    n += snprintf(msg + n, sizeof msg - (size_t)n, "%s: ", level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  /* One write per line so lines from several threads do not interleave. */
  if (to_console)
    fprintf(stderr, "%s\n", msg);
  if (to_file)
    file_write(msg);
}
