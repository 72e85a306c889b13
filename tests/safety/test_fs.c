/* The link-safe file helpers of core (src/core/fs.c): removal restricted to
 * the caller's names, never through a link; writes that refuse a planted
 * link or hard link; atomic replacement; mkdir -p; the directory walk. */
#include "safety.h"

#include <sys/mount.h>

/* What test trees call their own: a top directory "own*", inside it
 * directories "d*" and files "f*". */
static bool own_names(const char *name, bool is_dir, int depth, void *ctx) {
  (void)ctx;
  if (depth == 0)
    return is_dir && strncmp(name, "own", 3) == 0;
  return strncmp(name, is_dir ? "d" : "f", 1) == 0;
}

static int open_base(void) {
  return open(base_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

TT_TEST(test_remove_own_all) {
  char p[1200];
  mkdir(at(p, sizeof p, "own1"), 0755);
  mkdir(at(p, sizeof p, "own1/d1"), 0755);
  put_file(at(p, sizeof p, "own1/f1"), "x");
  put_file(at(p, sizeof p, "own1/d1/f2"), "y");
  int fd = open_base();
  int left = -1;
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own1", "T/own1", own_names, NULL, &left));
  const char *out = capture_end();
  TT_CHECK_EQ(left, 0);
  TT_CHECK_STR(out, "");
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "own1")));
  /* Missing: nothing to do. */
  TT_CHECK_OK(loom_fs_remove_own(fd, "own1", "T/own1", own_names, NULL, &left));
  TT_CHECK_EQ(left, 0);
  close(fd);
}

TT_TEST(test_remove_own_links_and_strangers) {
  char p[1200], v[1200], vf[1200];
  make_victim_dir(at(v, sizeof v, "victim"));
  put_file(at(vf, sizeof vf, "victim_file"), "precious file\n");
  uint32_t cv = crc_tree(v), cf = crc_tree(vf);
  mkdir(at(p, sizeof p, "own2"), 0755);
  put_file(at(p, sizeof p, "own2/f1"), "mine");
  /* Links under own names: to a directory, to a file, relative through
   * "..", absolute. None is followed; none is removed. */
  TT_REQUIRE(symlink(v, at(p, sizeof p, "own2/d_link")) == 0);
  TT_REQUIRE(symlink("../victim_file", at(p, sizeof p, "own2/f_rel")) == 0);
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "own2/f_abs")) == 0);
  int fd = open_base();
  int left = 0;
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own2", "T/own2", own_names, NULL, &left));
  const char *out = capture_end();
  TT_CHECK_EQ(left, 3);
  CHECK_HAS(out, "T/own2/d_link: a symbolic link, not followed; left in place");
  CHECK_HAS(out, "T/own2/f_rel: a symbolic link, not followed");
  CHECK_HAS(out, "T/own2/f_abs: a symbolic link, not followed");
  CHECK_HAS(out, "T/own2: kept whole");
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
  /* Kept whole: not even the own file went. */
  TT_CHECK(exists_nofollow(at(p, sizeof p, "own2/f1")));
  TT_CHECK(is_link(at(p, sizeof p, "own2/d_link")));

  /* A stranger's file and directory. */
  mkdir(at(p, sizeof p, "own3"), 0755);
  put_file(at(p, sizeof p, "own3/f1"), "mine");
  put_file(at(p, sizeof p, "own3/theirs.txt"), "theirs");
  mkdir(at(p, sizeof p, "own3/x_dir"), 0755);
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own3", "T/own3", own_names, NULL, &left));
  out = capture_end();
  TT_CHECK_EQ(left, 2);
  CHECK_HAS(out, "T/own3/theirs.txt: a file loom did not write; left in place");
  CHECK_HAS(out, "T/own3/x_dir: a directory loom did not write");
  TT_CHECK(exists_nofollow(at(p, sizeof p, "own3/theirs.txt")));
  TT_CHECK(exists_nofollow(at(p, sizeof p, "own3/f1")));

  /* The top itself a link to the victim: left, not entered. */
  TT_REQUIRE(symlink(v, at(p, sizeof p, "own4")) == 0);
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own4", "T/own4", own_names, NULL, &left));
  out = capture_end();
  TT_CHECK_EQ(left, 1);
  CHECK_HAS(out, "T/own4: a symbolic link, not followed");
  TT_CHECK(is_link(at(p, sizeof p, "own4")));
  TT_CHECK_EQ(crc_tree(v), cv);

  /* A file where a directory is expected: not the caller's. */
  put_file(at(p, sizeof p, "own5"), "a file");
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own5", "T/own5", own_names, NULL, &left));
  out = capture_end();
  TT_CHECK_EQ(left, 1);
  CHECK_HAS(out, "T/own5: a file loom did not write");
  TT_CHECK(exists_nofollow(p));

  /* A read-only directory is kept, even for root. */
  mkdir(at(p, sizeof p, "own6"), 0755);
  put_file(at(p, sizeof p, "own6/f1"), "mine");
  chmod(at(p, sizeof p, "own6"), 0555);
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own6", "T/own6", own_names, NULL, &left));
  out = capture_end();
  TT_CHECK_EQ(left, 1);
  CHECK_HAS(out, "T/own6: a read-only directory; left in place");
  TT_CHECK(exists_nofollow(at(p, sizeof p, "own6/f1")));
  chmod(at(p, sizeof p, "own6"), 0755);

  /* Names that are not one entry are refused. */
  TT_CHECK_EQ(loom_fs_remove_own(fd, "..", "..", own_names, NULL, &left),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_fs_remove_own(fd, "own2/f1", "x", own_names, NULL, &left),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_fs_remove_own(fd, "", "x", own_names, NULL, &left),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_CHECK_EQ(crc_tree(vf), cf);
  close(fd);
}

/* A directory mounted inside a tree (a bind mount: same st_dev) is not
 * entered. Needs the right to mount; skipped (said so) without it. */
TT_TEST(test_remove_own_mount) {
  char p[1200], v[1200];
  make_victim_dir(at(v, sizeof v, "victim_mnt"));
  uint32_t cv = crc_tree(v);
  mkdir(at(p, sizeof p, "own7"), 0755);
  put_file(at(p, sizeof p, "own7/f1"), "mine");
  mkdir(at(p, sizeof p, "own7/d_mnt"), 0755);
  if (mount(v, p, NULL, MS_BIND, NULL) != 0) {
    printf("skipped: bind mount: %s\n", strerror(errno));
    return;
  }
  int fd = open_base();
  int left = 0;
  capture_begin();
  TT_CHECK_OK(loom_fs_remove_own(fd, "own7", "T/own7", own_names, NULL, &left));
  const char *out = capture_end();
  close(fd);
  TT_CHECK(umount2(p, MNT_DETACH) == 0);
  TT_CHECK_EQ(left, 1);
  CHECK_HAS(out, "T/own7/d_mnt: another file system is mounted there");
  TT_CHECK_EQ(crc_tree(v), cv);
}

TT_TEST(test_open_write_refuses_links) {
  char p[1200], vf[1200];
  put_file(at(vf, sizeof vf, "victim_w"), "precious file\n");
  uint32_t cf = crc_tree(vf);
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "w_link")) == 0);
  errno = 0;
  TT_CHECK_EQ(loom_fs_open_write_at(AT_FDCWD, p, O_TRUNC, 0644), -1);
  TT_CHECK_EQ(errno, ELOOP);
  CHECK_HAS(loom_fs_strerror(ELOOP), "symbolic link");
  /* A hard link to someone's file is not truncated. */
  TT_REQUIRE(link(vf, at(p, sizeof p, "w_hard")) == 0);
  TT_CHECK_EQ(loom_fs_open_write_at(AT_FDCWD, p, O_TRUNC, 0644), -1);
  TT_CHECK_EQ(errno, EMLINK);
  TT_CHECK_EQ(crc_tree(vf), cf);
  /* A pipe without a reader: refused at once (never waited for), and a
   * directory too. */
  TT_REQUIRE(mkfifo(at(p, sizeof p, "w_fifo"), 0644) == 0);
  TT_CHECK_EQ(loom_fs_open_write_at(AT_FDCWD, p, O_TRUNC, 0644), -1);
  TT_CHECK_EQ(errno, LOOM_FS_ENOTREG);
  CHECK_HAS(loom_fs_strerror(LOOM_FS_ENOTREG), "not a regular file");
  TT_REQUIRE(mkdir(at(p, sizeof p, "w_dir"), 0755) == 0);
  TT_CHECK_EQ(loom_fs_open_write_at(AT_FDCWD, p, O_TRUNC, 0644), -1);
  TT_CHECK_EQ(errno, LOOM_FS_ENOTREG);
  /* A plain file: opened and truncated. */
  put_file(at(p, sizeof p, "w_plain"), "old contents");
  int fd = loom_fs_open_write_at(AT_FDCWD, p, O_TRUNC, 0644);
  TT_CHECK(fd >= 0);
  struct stat sb;
  TT_CHECK(fstat(fd, &sb) == 0 && sb.st_size == 0);
  close(fd);

  /* Append: a planted link is an error naming the file. */
  FILE *f = NULL;
  TT_CHECK_EQ(loom_fs_open_append(at(p, sizeof p, "w_link"), false, &f),
              LOOM_ERR_IO);
  TT_CHECK(f == NULL);
  CHECK_HAS(loom_last_error(), "w_link: cannot open for writing: a symbolic "
                               "link is in its place");
  TT_CHECK_EQ(loom_fs_open_append(at(p, sizeof p, "w_link"), true, &f),
              LOOM_ERR_IO);
  TT_CHECK_EQ(crc_tree(vf), cf);
  put_file(at(p, sizeof p, "w_app"), "line 1\n");
  TT_REQUIRE_OK(loom_fs_open_append(p, false, &f));
  fputs("line 2\n", f);
  fclose(f);
  char buf[64] = "";
  FILE *r = fopen(p, "r");
  size_t n = fread(buf, 1, sizeof buf - 1, r);
  buf[n] = '\0';
  fclose(r);
  TT_CHECK_STR(buf, "line 1\nline 2\n");
  TT_REQUIRE_OK(loom_fs_open_append(p, true, &f));
  fclose(f);
  TT_CHECK(stat(p, &sb) == 0 && sb.st_size == 0);
}

/* loom_fs_open_read_at: a FIFO without a writer is refused at once (never
 * waited for), a directory too; O_NOFOLLOW refuses a link; a regular file
 * opens blocking, with its size. */
TT_TEST(test_open_read_regular) {
  char p[1200], vf[1200];
  put_file(at(vf, sizeof vf, "r_file"), "twelve bytes");
  int64_t size = -1;
  int fd = loom_fs_open_read_at(AT_FDCWD, vf, 0, &size);
  TT_CHECK(fd >= 0);
  TT_CHECK_EQ(size, 12);
  TT_CHECK(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK));
  if (fd >= 0)
    close(fd);
  TT_REQUIRE(mkfifo(at(p, sizeof p, "r_fifo"), 0644) == 0);
  errno = 0;
  TT_CHECK_EQ(loom_fs_open_read_at(AT_FDCWD, p, 0, &size), -1);
  TT_CHECK_EQ(errno, LOOM_FS_ENOTREG);
  TT_REQUIRE(mkdir(at(p, sizeof p, "r_dir"), 0755) == 0);
  TT_CHECK_EQ(loom_fs_open_read_at(AT_FDCWD, p, 0, NULL), -1);
  TT_CHECK_EQ(errno, LOOM_FS_ENOTREG);
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "r_link")) == 0);
  TT_CHECK_EQ(loom_fs_open_read_at(AT_FDCWD, p, O_NOFOLLOW, NULL), -1);
  TT_CHECK_EQ(errno, ELOOP);
  fd = loom_fs_open_read_at(AT_FDCWD, p, 0, NULL); /* followed when asked */
  TT_CHECK(fd >= 0);
  if (fd >= 0)
    close(fd);
  TT_CHECK_EQ(
      loom_fs_open_read_at(AT_FDCWD, at(p, sizeof p, "r_none"), 0, NULL), -1);
  TT_CHECK_EQ(errno, ENOENT);
}

/* loom_fs_remove_empty_dir: an empty directory goes; one with anything
 * in it, a link to a directory, a file and a path are left, saying why. */
TT_TEST(test_remove_empty_dir) {
  char p[1200], v[1200];
  int fd = open_base();
  TT_REQUIRE(mkdir(at(p, sizeof p, "e_empty"), 0700) == 0);
  TT_CHECK_EQ(loom_fs_remove_empty_dir(fd, "e_empty"), 0);
  TT_CHECK(!exists_nofollow(p));
  make_victim_dir(at(v, sizeof v, "e_victim"));
  uint32_t cv = crc_tree(v);
  errno = 0;
  TT_CHECK_EQ(loom_fs_remove_empty_dir(fd, "e_victim"), -1);
  TT_CHECK_EQ(errno, ENOTEMPTY);
  TT_CHECK_EQ(crc_tree(v), cv);
  TT_REQUIRE(mkdir(at(p, sizeof p, "e_target"), 0700) == 0);
  TT_REQUIRE(symlink(p, at(v, sizeof v, "e_link")) == 0);
  errno = 0;
  TT_CHECK_EQ(loom_fs_remove_empty_dir(fd, "e_link"), -1);
  TT_CHECK_EQ(errno, ENOTDIR);
  TT_CHECK(is_link(v));
  TT_CHECK(exists_nofollow(p));
  put_file(at(p, sizeof p, "e_file"), "x");
  errno = 0;
  TT_CHECK_EQ(loom_fs_remove_empty_dir(fd, "e_file"), -1);
  TT_CHECK_EQ(errno, ENOTDIR);
  TT_CHECK(exists_nofollow(p));
  errno = 0;
  TT_CHECK_EQ(loom_fs_remove_empty_dir(fd, "e_target/.."), -1);
  TT_CHECK_EQ(errno, EINVAL);
  errno = 0;
  TT_CHECK_EQ(loom_fs_remove_empty_dir(fd, "e_none"), -1);
  TT_CHECK_EQ(errno, ENOENT);
  close(fd);
}

TT_TEST(test_discard) {
  char p[1200], vf[1200], d[1200];
  /* A file the caller made: removed, errno kept for its message. */
  put_file(at(p, sizeof p, "d_tmp"), "half written");
  errno = ENOSPC;
  loom_fs_discard(AT_FDCWD, p);
  TT_CHECK_EQ(errno, ENOSPC);
  TT_CHECK(!exists_nofollow(p));
  /* A link in its place: left, and its target untouched. */
  put_file(at(vf, sizeof vf, "victim_d"), "precious file\n");
  uint32_t cf = crc_tree(vf);
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "d_link")) == 0);
  loom_fs_discard(AT_FDCWD, p);
  TT_CHECK(is_link(p));
  TT_CHECK_EQ(crc_tree(vf), cf);
  /* A directory in its place: left with what it holds. */
  make_victim_dir(at(d, sizeof d, "d_dir"));
  uint32_t cd = crc_tree(d);
  loom_fs_discard(AT_FDCWD, d);
  TT_CHECK_EQ(crc_tree(d), cd);
  /* Nothing there: nothing to do. */
  loom_fs_discard(AT_FDCWD, at(p, sizeof p, "d_none"));
}

TT_TEST(test_write_atomic) {
  char p[1200], vf[1200], d[1200];
  put_file(at(vf, sizeof vf, "victim_a"), "precious file\n");
  uint32_t cf = crc_tree(vf);
  mkdir(at(d, sizeof d, "wa"), 0755);
  TT_CHECK_OK(loom_fs_write_atomic(d, "plain", "hello\n", 6));
  char buf[64] = "";
  FILE *r = fopen(at(p, sizeof p, "wa/plain"), "r");
  TT_REQUIRE(r != NULL);
  size_t n = fread(buf, 1, sizeof buf - 1, r);
  buf[n] = '\0';
  fclose(r);
  TT_CHECK_STR(buf, "hello\n");
  /* The destination a link to the victim: the link is replaced, the victim
   * untouched, and the replacement reported. */
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "wa/latest")) == 0);
  capture_begin();
  TT_CHECK_OK(loom_fs_write_atomic(d, "latest", "step\n", 5));
  const char *out = capture_end();
  CHECK_HAS(out, "wa/latest was a symbolic link: replaced by a file");
  TT_CHECK(!is_link(p));
  TT_CHECK_EQ(crc_tree(vf), cf);
  /* The temporary name a planted link: refused, victim untouched. */
  char tname[256];
  snprintf(tname, sizeof tname, "wa/.x.tmp.%ld", (long)getpid());
  TT_REQUIRE(symlink(vf, at(p, sizeof p, "%s", tname)) == 0);
  TT_CHECK_EQ(loom_fs_write_atomic(d, "x", "data", 4), LOOM_ERR_IO);
  CHECK_HAS(loom_last_error(), "wa/x: cannot create its temporary ");
  CHECK_HAS(loom_last_error(), "a symbolic link is in its place");
  TT_CHECK_EQ(crc_tree(vf), cf);
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "wa/x")));
  TT_CHECK_EQ(loom_fs_write_atomic(d, "a/b", "data", 4), LOOM_ERR_INVALID_ARG);
  /* A pipe or a directory at the name: refused and left as it is, the
   * temporary removed. */
  TT_REQUIRE(mkfifo(at(p, sizeof p, "wa/pipe"), 0644) == 0);
  TT_CHECK_EQ(loom_fs_write_atomic(d, "pipe", "data", 4), LOOM_ERR_IO);
  CHECK_HAS(loom_last_error(), "wa/pipe: it is not a regular file");
  struct stat sb;
  TT_CHECK(lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode));
  TT_REQUIRE(mkdir(at(p, sizeof p, "wa/sub"), 0755) == 0);
  TT_CHECK_EQ(loom_fs_write_atomic(d, "sub", "data", 4), LOOM_ERR_IO);
  TT_CHECK(lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode));
  snprintf(tname, sizeof tname, "wa/.sub.tmp.%ld", (long)getpid());
  TT_CHECK(!exists_nofollow(at(p, sizeof p, "%s", tname)));
}

TT_TEST(test_mkdirs) {
  char p[1200];
  TT_CHECK_OK(loom_fs_mkdirs(at(p, sizeof p, "m/a/b/c"), 0755));
  struct stat sb;
  TT_CHECK(stat(p, &sb) == 0 && S_ISDIR(sb.st_mode));
  TT_CHECK_OK(loom_fs_mkdirs(p, 0755)); /* exists: fine */
  put_file(at(p, sizeof p, "m/file"), "x");
  TT_CHECK_EQ(loom_fs_mkdirs(at(p, sizeof p, "m/file/sub"), 0755), LOOM_ERR_IO);
  CHECK_HAS(loom_last_error(), "m/file: not a directory");
  TT_CHECK_EQ(loom_fs_mkdirs("", 0755), LOOM_ERR_INVALID_ARG);
  /* The directory opener refuses a link. */
  char target[1200];
  at(target, sizeof target, "m/a");
  TT_REQUIRE(symlink(target, at(p, sizeof p, "m/link")) == 0);
  TT_CHECK_EQ(loom_fs_open_dir(p), -1);
  int fd = loom_fs_open_dir(at(p, sizeof p, "m/a"));
  TT_CHECK(fd >= 0);
  if (fd >= 0)
    close(fd);
}

static bool count_entry(const char *name, void *ctx) {
  (void)name;
  (*(int *)ctx)++;
  return true;
}

static bool stop_at_first(const char *name, void *ctx) {
  (void)name;
  (*(int *)ctx)++;
  return false;
}

/* The one directory walk: every entry but . and .., a stop when asked, a
 * link to a directory walked only with follow, a missing one ENOENT. */
TT_TEST(test_each_entry) {
  char p[1200], v[1200];
  mkdir(at(p, sizeof p, "walk"), 0755);
  put_file(at(p, sizeof p, "walk/f1"), "a");
  put_file(at(p, sizeof p, "walk/f2"), "b");
  mkdir(at(p, sizeof p, "walk/d1"), 0755);
  int n = 0;
  TT_CHECK_EQ(loom_fs_each_entry(AT_FDCWD, at(p, sizeof p, "walk"), false,
                                 count_entry, &n),
              0);
  TT_CHECK_EQ(n, 3);
  n = 0;
  TT_CHECK_EQ(loom_fs_each_entry(AT_FDCWD, at(p, sizeof p, "walk"), false,
                                 stop_at_first, &n),
              0);
  TT_CHECK_EQ(n, 1);
  TT_CHECK(symlink(at(v, sizeof v, "walk"), at(p, sizeof p, "walk_link")) == 0);
  n = 0;
  errno = 0;
  TT_CHECK_EQ(loom_fs_each_entry(AT_FDCWD, p, false, count_entry, &n), -1);
  TT_CHECK(errno == ELOOP || errno == ENOTDIR);
  TT_CHECK_EQ(n, 0);
  TT_CHECK_EQ(loom_fs_each_entry(AT_FDCWD, p, true, count_entry, &n), 0);
  TT_CHECK_EQ(n, 3);
  errno = 0;
  TT_CHECK_EQ(loom_fs_each_entry(AT_FDCWD, at(p, sizeof p, "nowhere"), true,
                                 count_entry, &n),
              -1);
  TT_CHECK_EQ(errno, ENOENT);
}

int main(void) {
  loom_log_set_level(LOOM_LOG_WARN);
  safety_mkbase("fs");
  TT_RUN(test_remove_own_all);
  TT_RUN(test_remove_own_links_and_strangers);
  TT_RUN(test_remove_own_mount);
  TT_RUN(test_open_write_refuses_links);
  TT_RUN(test_open_read_regular);
  TT_RUN(test_remove_empty_dir);
  TT_RUN(test_discard);
  TT_RUN(test_write_atomic);
  TT_RUN(test_mkdirs);
  TT_RUN(test_each_entry);
  safety_rmbase();
  return tt_finish();
}
