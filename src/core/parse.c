/* Strict decimal integers: what atoi and sscanf("%d") do without their
 * silent 0 for garbage and their undefined behaviour on overflow; and the
 * one lookup of a name in an enum's name table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

loom_status loom_name_parse(const char *s, const char *const *names, int n,
                            const char *what, int *out) {
  for (int i = 0; s && names && i < n; i++)
    if (names[i] && strcmp(s, names[i]) == 0) {
      if (out)
        *out = i;
      return LOOM_OK;
    }
  char list[512];
  size_t o = 0;
  list[0] = '\0';
  for (int i = 0; names && i < n && o < sizeof list; i++)
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s",
                          i == 0       ? ""
                          : i == n - 1 ? " or "
                                       : ", ",
                          names[i] ? names[i] : "?");
  return loom_error(LOOM_ERR_INVALID_ARG, "unknown %s '%s' (expected %s)",
                    what ? what : "name", s ? s : "(null)", list);
}
