/* Levelled logging to stderr with an optional "[rank r]" prefix. */
#include "loom/core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void loom_log(loom_log_level level, const char *fmt, ...) {
  if (level < loom_log_get_level() || level >= LOOM_LOG_OFF)
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
  fprintf(stderr, "%s\n", msg);
}
