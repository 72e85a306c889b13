/* Checkpoint deletion never follows a link and removes only loom's own
 * names: pruning (checkpoint.keep), a save over a step of an earlier run
 * (restart from scratch), and the clean-up after a failed save, each met
 * with a link to a victim directory, a link to a victim file inside a step
 * directory, a file in place of a step directory, a stranger's file in a
 * step directory, `latest` pointing outside, a read-only step directory and
 * a checkpoint root that is itself a link. The victims live in the test's
 * own temporary directory and are compared by checksum afterwards. */
#include "safety.h"

#include "loom/ckpt.h"

#define N 256
static float params[N];

static loom_status save(const char *root, int64_t step, int keep) {
  for (int i = 0; i < N; i++)
    params[i] = (float)(step * 1000 + i);
  loom_ckpt_buffer b = {"params", LOOM_F32, N, params};
  return loom_ckpt_save(root, step, NULL, &b, 1, keep);
}

static bool loads(const char *root, int64_t step) {
  char d[1200];
  snprintf(d, sizeof d, "%s/step_%08lld", root, (long long)step);
  loom_ckpt *c = NULL;
  loom_status s = loom_ckpt_open(&c, d, NULL);
  loom_ckpt_close(c);
  return s == LOOM_OK;
}

/* A fresh checkpoint root under base_dir. */
static const char *new_root(char *buf, size_t n, const char *tag) {
  at(buf, n, "%s", tag);
  mkdir(buf, 0755);
  return buf;
}

TT_TEST(test_prune) {
  char root[1200], v[1200], vf[1200], p[1200];
  new_root(root, sizeof root, "prune");
  make_victim_dir(at(v, sizeof v, "victim_prune"));
  put_file(at(vf, sizeof vf, "victim_prune_file"), "step_00000009\n");
  uint32_t cv = crc_tree(v), cf = crc_tree(vf);
  TT_REQUIRE_OK(save(root, 2, 0));
  TT_REQUIRE_OK(save(root, 3, 0));
  TT_REQUIRE_OK(save(root, 4, 0));
  /* step 1: a link to the victim directory (whose names are loom's). */
  TT_REQUIRE(symlink(v, at(p, sizeof p, "prune/step_00000001")) == 0);
  /* step 2: loom's, plus a link to the victim file and a stranger's file. */
  TT_REQUIRE(
      symlink(vf, at(p, sizeof p, "prune/step_00000002/shard_00001.bin")) == 0);
  /* step 3: loom's, made read-only by its owner. */
  chmod(at(p, sizeof p, "prune/step_00000003"), 0555);
  /* step 4: loom's, with a stranger's file. */
  put_file(at(p, sizeof p, "prune/step_00000004/notes.txt"),
           "mine, not loom's");
  /* step 5: a file in place of a directory; step_6: not loom's spelling. */
  put_file(at(p, sizeof p, "prune/step_00000005"), "a file");
  mkdir(at(p, sizeof p, "prune/step_6"), 0755);
  put_file(at(p, sizeof p, "prune/step_6/manifest.json"), "{}");
  /* A crashed commit's temporary of latest (loom's: removed), and one
   * that is a link (not loom's: reported). */
  put_file(at(p, sizeof p, "prune/.latest.tmp.999999999"), "step_00000001\n");
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "prune/.latest.tmp.999999998")) == 0);
  /* latest: a link out of the root. */
  unlink(at(p, sizeof p, "prune/latest"));
  TT_REQUIRE(symlink(vf, p) == 0);

  capture_begin();
  TT_CHECK_OK(save(root, 10, 1));
  const char *out = capture_end();
  TT_CHECK(loads(root, 10));
  int64_t latest = -1;
  TT_CHECK_OK(loom_ckpt_read_latest(root, &latest));
  TT_CHECK_EQ(latest, 10);
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
  CHECK_HAS(out, "prune/step_00000001: a symbolic link, not followed; left "
                 "in place");
  CHECK_HAS(out, "prune/step_00000002/shard_00001.bin: a symbolic link, not "
                 "followed");
  CHECK_HAS(out, "prune/step_00000002: kept whole");
  CHECK_HAS(out, "prune/step_00000003: a read-only directory; left in place");
  CHECK_HAS(out, "prune/step_00000004/notes.txt: a file loom did not write");
  CHECK_HAS(out, "prune/step_00000005: a file loom did not write");
  CHECK_HAS(out, "prune/step_6: a directory loom did not write");
  CHECK_HAS(out, "prune/latest was a symbolic link: replaced by a file");
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "prune/.latest.tmp.999999999")));
  CHECK_HAS(out, "prune/.latest.tmp.999999998: a symbolic link, not followed");
  /* What was kept is whole: the checkpoints still load. */
  TT_CHECK(is_link(at(p, sizeof p, "prune/step_00000001")));
  TT_CHECK(loads(root, 2));
  TT_CHECK(loads(root, 3));
  TT_CHECK(loads(root, 4));
  TT_CHECK(exists_nofollow(at(p, sizeof p, "prune/step_6/manifest.json")));

  /* Once the strangers are gone, pruning takes what is loom's. */
  unlink(at(p, sizeof p, "prune/step_00000002/shard_00001.bin"));
  unlink(at(p, sizeof p, "prune/step_00000004/notes.txt"));
  chmod(at(p, sizeof p, "prune/step_00000003"), 0755);
  capture_begin();
  TT_CHECK_OK(save(root, 11, 1));
  out = capture_end();
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "prune/step_00000002")));
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "prune/step_00000003")));
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "prune/step_00000004")));
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "prune/step_00000010")));
  TT_CHECK(loads(root, 11));
  TT_CHECK(is_link(at(p, sizeof p, "prune/step_00000001")));
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
}

/* A checkpoint being pruned is renamed to its hidden .step_N.old first: a
 * process killed while removing it leaves that name (loading and listing
 * pass over it, the next prune removes it), never a step_N without its
 * manifest that `loom ckpt verify` would call damaged. */
TT_TEST(test_prune_killed) {
  char root[1200], p[1200];
  new_root(root, sizeof root, "prune_killed");
  TT_REQUIRE_OK(save(root, 2, 0));
  TT_REQUIRE_OK(save(root, 3, 0));
  /* what a kill in the middle of pruning step 1 leaves */
  TT_REQUIRE(mkdir(at(p, sizeof p, "prune_killed/.step_00000001.old"), 0755) ==
             0);
  put_file(at(p, sizeof p, "prune_killed/.step_00000001.old/shard_00000.bin"),
           "half");
  int64_t *steps = NULL;
  int n = 0;
  TT_REQUIRE_OK(loom_ckpt_list(root, &steps, &n));
  TT_CHECK_EQ(n, 2);
  loom_free(steps);
  TT_CHECK_OK(save(root, 10, 2)); /* keeps 3 and 10 */
  TT_CHECK(loads(root, 3));
  TT_CHECK(loads(root, 10));
  TT_CHECK(
      !exists_nofollow(at(p, sizeof p, "prune_killed/.step_00000001.old")));
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "prune_killed/step_00000002")));
  TT_CHECK(
      !exists_nofollow(at(p, sizeof p, "prune_killed/.step_00000002.old")));
}

TT_TEST(test_root_is_link) {
  char real[1200], link_[1200], v[1200];
  new_root(real, sizeof real, "real_root");
  at(link_, sizeof link_, "linked_root");
  TT_REQUIRE(symlink(real, link_) == 0);
  make_victim_dir(at(v, sizeof v, "real_root/step_00000001"));
  uint32_t cv = crc_tree(v);
  capture_begin();
  TT_CHECK_OK(save(link_, 5, 1));
  const char *out = capture_end();
  /* Saved through the path the user named, but nothing deleted through a
   * root that is a link. */
  TT_CHECK(loads(link_, 5));
  CHECK_HAS(out, "linked_root: a symbolic link or not a directory; loom "
                 "deletes nothing in it");
  TT_CHECK_EQ(crc_tree(v), cv);
}

TT_TEST(test_restart_from_scratch) {
  /* A run that starts over (--resume never) saves steps that an earlier
   * run saved: the old step is swapped out and removed, never followed. */
  char root[1200], v[1200], vf[1200], p[1200];
  new_root(root, sizeof root, "restart");
  make_victim_dir(at(v, sizeof v, "victim_restart"));
  put_file(at(vf, sizeof vf, "victim_restart_file"), "precious\n");
  uint32_t cv = crc_tree(v), cf = crc_tree(vf);
  TT_REQUIRE(symlink(v, at(p, sizeof p, "restart/step_00000002")) == 0);
  put_file(at(p, sizeof p, "restart/step_00000004"), "a file");
  TT_REQUIRE_OK(save(root, 6, 0));
  TT_REQUIRE(symlink(vf, at(p, sizeof p,
                            "restart/step_00000006/shard_00003.bin")) == 0);
  TT_REQUIRE_OK(save(root, 8, 0));
  chmod(at(p, sizeof p, "restart/step_00000008"), 0555);
  capture_begin();
  TT_CHECK_OK(save(root, 2, 0));
  TT_CHECK_OK(save(root, 4, 0));
  TT_CHECK_OK(save(root, 6, 0));
  TT_CHECK_OK(save(root, 8, 0));
  const char *out = capture_end();
  for (int s = 2; s <= 8; s += 2)
    TT_CHECK(loads(root, s));
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
  /* The old entries, now under the temporary names, are reported. */
  CHECK_HAS(out, "restart/.step_00000002.tmp: a symbolic link, not followed");
  CHECK_HAS(out, "restart/.step_00000004.tmp: a file loom did not write");
  CHECK_HAS(out, "restart/.step_00000006.tmp/shard_00003.bin: a symbolic "
                 "link, not followed");
  CHECK_HAS(out, "restart/.step_00000008.tmp: a read-only directory");
  TT_CHECK(is_link(at(p, sizeof p, "restart/.step_00000002.tmp")));
  chmod(at(p, sizeof p, "restart/.step_00000008.tmp"), 0755);
}

TT_TEST(test_failed_save_cleanup) {
  char root[1200], v[1200], vf[1200], p[1200];
  new_root(root, sizeof root, "failed");
  make_victim_dir(at(v, sizeof v, "victim_failed"));
  put_file(at(vf, sizeof vf, "victim_failed_file"), "precious\n");
  uint32_t cv = crc_tree(v), cf = crc_tree(vf);
  TT_REQUIRE_OK(save(root, 1, 0));

  /* Rank 1's shard name planted as a link, and a stranger's file, in the
   * temporary directory; rank 0's write fails; abort cleans up. */
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.world = 2;
  loom_ckpt_writer *w = NULL;
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 2, &o));
  TT_REQUIRE(symlink(vf, at(p, sizeof p,
                            "failed/.step_00000002.tmp/"
                            "shard_00001.bin")) == 0);
  put_file(at(p, sizeof p, "failed/.step_00000002.tmp/notes.txt"), "x");
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N / 2, params));
  loom_ckpt_fail_io_after(2, ENOSPC);
  TT_CHECK_EQ(loom_ckpt_writer_write(w), LOOM_ERR_IO);
  loom_ckpt_fail_io_after(0, 0);
  capture_begin();
  loom_ckpt_writer_abort(w);
  const char *out = capture_end();
  loom_ckpt_writer_free(w);
  CHECK_HAS(out, "failed/.step_00000002.tmp/shard_00001.bin: a symbolic link");
  CHECK_HAS(out, "failed/.step_00000002.tmp/notes.txt: a file loom did not "
                 "write");
  TT_CHECK_EQ(crc_tree(vf), cf);
  TT_CHECK(loads(root, 1));

  /* The temporary directory swapped for a link to the victim (whose
   * names are loom's) after it was made: the shard still goes into the
   * directory loom made, the commit refuses to make the link a checkpoint,
   * and abort leaves the link. */
  TT_REQUIRE_OK(loom_ckpt_writer_new(&w, root, 3, NULL));
  at(p, sizeof p, "failed/.step_00000003.tmp");
  char moved[1200];
  TT_REQUIRE(rename(p, at(moved, sizeof moved, "moved_tmp")) == 0);
  TT_REQUIRE(symlink(v, p) == 0);
  TT_CHECK_OK(loom_ckpt_writer_add(w, "params", LOOM_F32, N, 0, N, params));
  TT_CHECK_OK(loom_ckpt_writer_write(w));
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(loom_ckpt_writer_commit(w), LOOM_ERR_IO);
  CHECK_HAS(loom_last_error(), "failed/.step_00000003.tmp: no longer the "
                               "directory the shards were written to");
  capture_begin();
  loom_ckpt_writer_abort(w);
  out = capture_end();
  loom_ckpt_writer_free(w);
  CHECK_HAS(out, "failed/.step_00000003.tmp: a symbolic link, not followed");
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "failed/step_00000003")));
  TT_CHECK_EQ(crc_tree(v), cv);

  /* A link in the place of the temporary directory before the save: the
   * writer refuses it with a message naming it. */
  TT_REQUIRE(symlink(v, at(p, sizeof p, "failed/.step_00000004.tmp")) == 0);
  TT_CHECK_EQ(save(root, 4, 0), LOOM_ERR_IO);
  CHECK_HAS(loom_last_error(), "failed/.step_00000004.tmp: a symbolic link in "
                               "the place of loom's temporary directory");
  /* Rank 0's own shard name a link to the victim file. */
  TT_REQUIRE(mkdir(at(p, sizeof p, "failed/.step_00000005.tmp"), 0755) == 0);
  TT_REQUIRE(symlink(vf, at(p, sizeof p,
                            "failed/.step_00000005.tmp/"
                            "shard_00000.bin")) == 0);
  capture_begin();
  TT_CHECK_EQ(save(root, 5, 0), LOOM_ERR_IO);
  out = capture_end();
  CHECK_HAS(out, "failed/.step_00000005.tmp/shard_00000.bin: a symbolic link");
  TT_CHECK(is_link(at(p, sizeof p,
                      "failed/.step_00000005.tmp/"
                      "shard_00000.bin")));
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
  /* A read-only temporary of an earlier attempt, met by a later commit's
   * clean-up of stale temporaries: kept. */
  TT_REQUIRE(mkdir(at(p, sizeof p, "failed/.step_00000006.tmp"), 0555) == 0);
  capture_begin();
  TT_CHECK_OK(save(root, 7, 0));
  out = capture_end();
  CHECK_HAS(out, "failed/.step_00000006.tmp: a read-only directory");
  TT_CHECK(loads(root, 1));
  TT_CHECK(loads(root, 7));
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
}

TT_TEST(test_latest_link_not_read) {
  char root[1200], vf[1200], p[1200];
  new_root(root, sizeof root, "latest");
  TT_REQUIRE_OK(save(root, 1, 0));
  TT_REQUIRE_OK(save(root, 2, 0));
  put_file(at(vf, sizeof vf, "victim_latest"), "step_00000001\n");
  uint32_t cf = crc_tree(vf);
  unlink(at(p, sizeof p, "latest/latest"));
  TT_REQUIRE(symlink(vf, p) == 0);
  int64_t s = -1;
  TT_CHECK_EQ(loom_ckpt_read_latest(root, &s), LOOM_ERR_IO);
  CHECK_HAS(loom_last_error(), "latest/latest: a symbolic link, not followed");
  /* Loading falls back to the newest valid one, saying why. */
  loom_ckpt *c = NULL;
  capture_begin();
  TT_CHECK_OK(loom_ckpt_open_latest_valid(&c, root, NULL));
  const char *out = capture_end();
  TT_CHECK(c != NULL);
  if (c)
    TT_CHECK_EQ(loom_ckpt_get_meta(c)->step, 2);
  loom_ckpt_close(c);
  CHECK_HAS(out, "a symbolic link, not followed; using the newest valid");
  TT_CHECK_EQ(crc_tree(vf), cf);
}

int main(void) {
  loom_log_set_level(LOOM_LOG_WARN);
  safety_mkbase("ckpt");
  TT_RUN(test_prune);
  TT_RUN(test_prune_killed);
  TT_RUN(test_root_is_link);
  TT_RUN(test_restart_from_scratch);
  TT_RUN(test_failed_save_cleanup);
  TT_RUN(test_latest_link_not_read);
  safety_rmbase();
  return tt_finish();
}
