/* loom_comm_agree: every rank of a group learns whether all of them
 * succeeded at a step, and which rank failed first. */
#include <stdio.h>

#include "internal.h"

loom_status loom_comm_agree(loom_group *g, loom_status mine, const char *what) {
  const int n = g ? loom_group_size(g) : 1;
  if (n <= 1)
    return mine;
  /* The own message survives the collective, which may set another. */
  char own[512];
  snprintf(own, sizeof own, "%s", mine != LOOM_OK ? loom_last_error() : "");
  int32_t *all = loom_calloc((size_t)n, sizeof *all); /* (n) statuses */
  if (!all)
    return loom_error(LOOM_ERR_NOMEM, "%s: agreeing on the outcome", what);
  int32_t me = (int32_t)mine;
  loom_req r = LOOM_REQ_INIT;
  loom_status s = loom_allgather(&me, all, 1, LOOM_I32, g, &r);
  if (s == LOOM_OK)
    s = loom_wait(&r);
  if (s != LOOM_OK) {
    loom_free(all);
    return loom_error_context(s, "%s: agreeing on the outcome", what);
  }
  int first = -1;
  for (int q = 0; q < n && first < 0; q++)
    if (all[q] != LOOM_OK)
      first = q;
  const loom_status other = first >= 0 ? (loom_status)all[first] : LOOM_OK;
  loom_free(all);
  if (mine != LOOM_OK)
    return loom_error(mine, "%s", own);
  if (first < 0)
    return LOOM_OK;
  /* A configuration error stays one on every rank: loom run does not
   * restart it. */
  return loom_error(other == LOOM_ERR_CONFIG ? LOOM_ERR_CONFIG
                                             : LOOM_ERR_REMOTE,
                    "%s failed on rank %d (%s); its message says why", what,
                    first, loom_status_str(other));
}
