/* A rank that skips a collective: the others' watchdog must name it, end
 * the job with LOOM_COMM_EXIT_TIMEOUT and leave no process behind (run by
 * test_comm_watchdog.sh with a short LOOM_COMM_TIMEOUT); after a restart
 * by loom run the job completes. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "loom/comm.h"

int main(void) {
  loom_group *world = NULL;
  if (loom_group_world(NULL, &world) != LOOM_OK) {
    fprintf(stderr, "world: %s\n", loom_last_error());
    return 1;
  }
  int rank = loom_group_rank(world);
  float x[16] = {1};
  loom_req r = LOOM_REQ_INIT;
  loom_status s = loom_allreduce(x, x, 16, LOOM_F32, LOOM_SUM, world, &r);
  if (s == LOOM_OK)
    s = loom_wait(&r);
  if (s != LOOM_OK) {
    fprintf(stderr, "[rank %d] first allreduce: %s\n", rank, loom_last_error());
    return 1;
  }
  /* After a restart (loom run --max-restarts), everyone takes part. */
  const char *restart = getenv("LOOM_RESTART_COUNT");
  bool skip = rank == 1 && !(restart && atoi(restart) > 0);
  if (skip) {
    fprintf(stderr, "[rank 1] skipping the second allreduce\n");
    sleep(60); /* the watchdog of the others ends the job first */
    return 0;
  }
  s = loom_allreduce(x, x, 16, LOOM_F32, LOOM_SUM, world, &r);
  if (s == LOOM_OK)
    s = loom_wait(&r);
  /* Reached with LOOM_COMM_ABORT=0, or after a restart. */
  if (s != LOOM_OK)
    fprintf(stderr, "[rank %d] second allreduce: %s: %s\n", rank,
            loom_status_name(s), loom_last_error());
  loom_group_free(world);
  return s == LOOM_OK ? 0 : s == LOOM_ERR_TIMEOUT ? 3 : 1;
}
