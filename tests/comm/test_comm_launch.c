/* Launch environment checks of the mpi backend (issue 10, section 5):
 *   test_comm_launch mismatch VAR   one rank told by VAR (PMI_SIZE or
 *                               OMPI_COMM_WORLD_SIZE: the other MPI's) that
 *                               the launcher started 3: the world fails to
 *                               start, naming both sizes
 *   test_comm_launch threads    under `LOOM_THREADS= loom run -n N` (no
 *                               binding, no thread count): the ranks of a
 *                               host divide its cores */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/core.h"
#include "tt.h"

static loom_comm_opts mpi_opts(void) {
  loom_comm_opts o = loom_comm_opts_default();
  o.backend = LOOM_COMM_MPI;
  return o;
}

static const char *fake_var = "PMI_SIZE";

TT_TEST(launcher_size_mismatch) {
  /* A singleton that the environment says is one of 3: another MPI's
   * launcher started it. Each MPI would read its own launcher's variables
   * as a real launch, so the script fakes the other MPI's. */
  setenv(fake_var, "3", 1);
  loom_comm_opts o = mpi_opts();
  loom_group *w = NULL;
  loom_status st = loom_group_world(&o, &w);
  TT_CHECK_EQ(st, LOOM_ERR_MISMATCH);
  TT_CHECK(w == NULL);
  const char *m = loom_last_error();
  printf("message: %s\n", m);
  char want[96];
  snprintf(want, sizeof want, "the launcher started 3 ranks (%s=3)", fake_var);
  TT_CHECK(strstr(m, want) != NULL);
  TT_CHECK(strstr(m, "MPI sees a world of 1") != NULL);
  TT_CHECK(strstr(m, "another MPI's launcher") != NULL);
}

TT_TEST(threads_divided) {
  const char *lt = getenv("LOOM_THREADS");
  TT_REQUIRE(!lt || !lt[0] || atoi(lt) <= 0);
  loom_comm_opts o = mpi_opts();
  loom_group *w = NULL;
  TT_REQUIRE_OK(loom_group_world(&o, &w));
  int lr = loom_group_local_rank(w), ls = loom_group_local_size(w);
  int cores = loom_cores();
  int want = cores / ls + (lr < cores % ls ? 1 : 0);
  if (want < 1)
    want = 1;
  printf("rank %d of %d on this host: %d thread(s) of %d core(s)\n", lr, ls,
         loom_threads(), cores);
  TT_CHECK_EQ(loom_threads(), want);
  loom_group_free(w);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "mismatch") == 0) {
    fake_var = argv[2];
    TT_RUN(launcher_size_mismatch);
  } else if (argc == 2 && strcmp(argv[1], "threads") == 0)
    TT_RUN(threads_divided);
  else {
    fprintf(stderr, "usage: test_comm_launch mismatch VAR | threads\n");
    return 2;
  }
  return tt_finish();
}
