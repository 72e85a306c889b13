/* loom_ckpt_writer_commit_start: rank 0 commits a multi-rank checkpoint on
 * a background thread (async saves); the outcome, message included, comes
 * back from loom_ckpt_writer_wait, and misuse is refused. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "tt.h"

#define N 4000

static char root[64];
static float data[N];

/* Two ranks write their halves of step `step`; w[0] is rank 0's. */
static loom_status write_two(int64_t step, loom_ckpt_writer *w[2]) {
  for (int r = 0; r < 2; r++) {
    loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
    o.rank = r;
    o.world = 2;
    o.keep = 2;
    LOOM_TRY(loom_ckpt_writer_new(&w[r], root, step, &o));
    int64_t lo = r ? N / 2 : 0, hi = r ? N : N / 2;
    LOOM_TRY(
        loom_ckpt_writer_add(w[r], "params", LOOM_F32, N, lo, hi, data + lo));
    LOOM_TRY(loom_ckpt_writer_write(w[r]));
  }
  return LOOM_OK;
}

TT_TEST(test_commit_in_background) {
  for (int i = 0; i < N; i++)
    data[i] = (float)i * 0.5f;
  loom_ckpt_writer *w[2] = {NULL, NULL};
  TT_REQUIRE_OK(write_two(10, w));
  TT_CHECK_EQ(loom_ckpt_writer_commit_start(w[1]), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "only rank 0 commits") != NULL);
  TT_REQUIRE_OK(loom_ckpt_writer_commit_start(w[0]));
  TT_CHECK_EQ(loom_ckpt_writer_commit_start(w[0]), LOOM_ERR_INVALID_ARG);
  TT_CHECK_OK(loom_ckpt_writer_wait(w[0]));
  bool done = false;
  TT_CHECK_OK(loom_ckpt_writer_test(w[0], &done));
  TT_CHECK(done);
  loom_ckpt_writer_free(w[0]);
  loom_ckpt_writer_free(w[1]);
  int64_t latest = -1;
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 10);
  loom_ckpt *c = NULL;
  TT_REQUIRE_OK(loom_ckpt_open_latest_valid(&c, root, NULL));
  static float got[N];
  TT_CHECK_OK(loom_ckpt_read_range(c, "params", 0, N, got));
  TT_CHECK(memcmp(got, data, sizeof got) == 0);
  loom_ckpt_close(c);

  /* A failure on the commit thread: the message comes back from wait, and
   * the previous checkpoint is still the one `latest` names. */
  TT_REQUIRE_OK(write_two(20, w));
  loom_ckpt_fail_io_after(1, ENOSPC);
  TT_REQUIRE_OK(loom_ckpt_writer_commit_start(w[0]));
  loom_clear_error();
  TT_CHECK_EQ(loom_ckpt_writer_wait(w[0]), LOOM_ERR_IO);
  loom_ckpt_fail_io_after(0, 0);
  TT_CHECK(strstr(loom_last_error(), "No space left on device") != NULL);
  loom_ckpt_writer_free(w[0]);
  loom_ckpt_writer_free(w[1]);
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 10);

  /* Not written yet: refused, as a commit would be. */
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w[0], root, 30, &o));
  TT_CHECK_EQ(loom_ckpt_writer_commit_start(w[0]), LOOM_ERR_INVALID_ARG);
  loom_ckpt_writer_abort(w[0]);
  loom_ckpt_writer_free(w[0]);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/loom_commit_async.%d", (int)getpid());
  TT_RUN(test_commit_in_background);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", root);
  return tt_finish();
}
