/* Status codes, their names and texts, and the thread-local last error. */
#include "loom/core.h"

#include <stdio.h>
#include <string.h>

_Static_assert(LOOM_ERR_IN_PROGRESS == -(LOOM_STATUS_COUNT - 1),
               "LOOM_STATUS_COUNT must match LOOM_STATUS_LIST");

static const struct {
  loom_status s;
  const char *name;
  const char *text;
} status_table[] = {
#define LOOM_X_ROW(name, value, text) {name, #name, text},
    LOOM_STATUS_LIST(LOOM_X_ROW)
#undef LOOM_X_ROW
};
_Static_assert(sizeof status_table / sizeof status_table[0] ==
                   LOOM_STATUS_COUNT,
               "status table size");

const char *loom_status_str(loom_status s) {
  for (size_t i = 0; i < LOOM_STATUS_COUNT; i++)
    if (status_table[i].s == s)
      return status_table[i].text;
  return "unknown status";
}

const char *loom_status_name(loom_status s) {
  for (size_t i = 0; i < LOOM_STATUS_COUNT; i++)
    if (status_table[i].s == s)
      return status_table[i].name;
  return "LOOM_ERR_UNKNOWN";
}

#define LOOM_ERRMSG_MAX 1024
static _Thread_local char last_error[LOOM_ERRMSG_MAX];

const char *loom_last_error(void) { return last_error; }

void loom_clear_error(void) { last_error[0] = '\0'; }

loom_status loom_verror(loom_status s, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  return s;
}

/* The name in parentheses: not expanded by the static analyzer's macro
 * (loom/core.h). */
loom_status(loom_error)(loom_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  loom_verror(s, fmt, ap);
  va_end(ap);
  return s;
}

loom_status loom_error_context(loom_status s, const char *fmt, ...) {
  char prefix[LOOM_ERRMSG_MAX];
  char old[LOOM_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  /* Truncation is fine: the message is for people. */
  size_t n = strlen(prefix);
  if (n >= sizeof last_error)
    n = sizeof last_error - 1;
  memcpy(last_error, prefix, n);
  last_error[n] = '\0';
  if (old[0] && n + 2 < sizeof last_error) {
    memcpy(last_error + n, ": ", 3);
    n += 2;
    size_t m = strlen(old);
    if (m > sizeof last_error - 1 - n)
      m = sizeof last_error - 1 - n;
    memcpy(last_error + n, old, m);
    last_error[n + m] = '\0';
  }
  return s;
}

const char *loom_version(void) { return "0.1.0"; }
