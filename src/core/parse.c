/* Strict decimal integers: what atoi and sscanf("%d") do without their
 * silent 0 for garbage and their undefined behaviour on overflow. */
#include <errno.h>
#include <stdlib.h>

#include "loom/core.h"

bool loom_parse_i64_at(const char *s, const char **end, int64_t *out) {
  if (!s)
    return false;
  char *e;
  errno = 0;
  long long v = strtoll(s, &e, 10);
  if (e == s || errno == ERANGE)
    return false;
  if (end)
    *end = e;
  *out = (int64_t)v;
  return true;
}

bool loom_parse_i64(const char *s, int64_t *out) {
  const char *end;
  return loom_parse_i64_at(s, &end, out) && *end == '\0';
}

bool loom_parse_int(const char *s, int *out) {
  int64_t v;
  if (!loom_parse_i64(s, &v) || v < -2147483647 - 1 || v > 2147483647)
    return false;
  *out = (int)v;
  return true;
}
