/* Shared by the safety tests: a temporary directory per test program,
 * victims built inside it, their checksums, and stderr captured to read
 * what loom reported. Nothing here touches a path outside the directory
 * made by mkdtemp. */
#ifndef LOOM_TESTS_SAFETY_H
#define LOOM_TESTS_SAFETY_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tt.h"

static char base_dir[256];

static void safety_mkbase(const char *tag) {
  snprintf(base_dir, sizeof base_dir, "/tmp/loom_safety_%s_XXXXXX", tag);
  if (!mkdtemp(base_dir)) {
    perror("mkdtemp");
    exit(1);
  }
}

/* base_dir/rel (printf-style) into buf. */
__attribute__((format(printf, 3, 4))) static const char *
at(char *buf, size_t n, const char *fmt, ...) {
  char rel[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rel, sizeof rel, fmt, ap);
  va_end(ap);
  snprintf(buf, n, "%s/%s", base_dir, rel);
  return buf;
}

static int put_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f)
    return -1;
  fputs(text, f);
  return fclose(f);
}

/* A checksum of a tree: names, types, link targets and contents, walked
 * without following links. */
static uint32_t tree_crc;
static size_t tree_root_len;
static int crc_one(const char *p, const struct stat *sb, int type,
                   struct FTW *ftw) {
  (void)ftw;
  const char *rel = p + tree_root_len;
  tree_crc = loom_crc32c(tree_crc, rel, strlen(rel) + 1);
  tree_crc = loom_crc32c(tree_crc, &type, sizeof type);
  if (type == FTW_SL) {
    char t[1024];
    ssize_t n = readlink(p, t, sizeof t);
    if (n > 0)
      tree_crc = loom_crc32c(tree_crc, t, (size_t)n);
  } else if (type == FTW_F && S_ISREG(sb->st_mode)) {
    FILE *f = fopen(p, "rb");
    char b[4096];
    size_t n;
    while (f && (n = fread(b, 1, sizeof b, f)) > 0)
      tree_crc = loom_crc32c(tree_crc, b, n);
    if (f)
      fclose(f);
  }
  return 0;
}
static uint32_t crc_tree(const char *path) {
  tree_crc = 0;
  tree_root_len = strlen(path);
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return 0xdeadbeef; /* gone */
  nftw(path, crc_one, 16, FTW_PHYS);
  return tree_crc;
}

/* A victim directory: files named as loom names its own (so a test proves
 * that names alone never decide), a subdirectory, a file of text. */
static void make_victim_dir(const char *path) {
  char p[1200];
  mkdir(path, 0755);
  snprintf(p, sizeof p, "%s/manifest.json", path);
  put_file(p, "{\"victim\": true}\n");
  snprintf(p, sizeof p, "%s/shard_00000.bin", path);
  put_file(p, "precious shard\n");
  snprintf(p, sizeof p, "%s/notes.txt", path);
  put_file(p, "precious notes\n");
  snprintf(p, sizeof p, "%s/sub", path);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/sub/deep.txt", path);
  put_file(p, "deep\n");
}

static bool exists_nofollow(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

static bool is_link(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
}

/* stderr captured: loom's warnings (tests/tt.h), shown in the test's
 * output too, for whoever reads a failure. */
static void capture_begin(void) { tt_capture_begin(); }
static const char *capture_end(void) {
  const char *c = tt_capture_end();
  fputs(c, stderr);
  return c;
}
#define CHECK_HAS TT_CHECK_HAS

/* rm -rf of base_dir, without following links (FTW_PHYS) or crossing into
 * another file system; read-only directories made writable first. */
static int rm_one(const char *p, const struct stat *sb, int type,
                  struct FTW *ftw) {
  (void)sb;
  (void)ftw;
  if (type == FTW_DP)
    return rmdir(p) == 0 ? 0 : 0;
  return unlink(p) == 0 ? 0 : 0;
}
static int chmod_one(const char *p, const struct stat *sb, int type,
                     struct FTW *ftw) {
  (void)ftw;
  if (type == FTW_D || type == FTW_DNR)
    chmod(p, (sb->st_mode & 07777) | 0700);
  return 0;
}
static void safety_rmbase(void) {
  nftw(base_dir, chmod_one, 16, FTW_PHYS | FTW_MOUNT);
  nftw(base_dir, rm_one, 16, FTW_PHYS | FTW_MOUNT | FTW_DEPTH);
}

#endif
