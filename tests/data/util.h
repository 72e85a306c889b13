/* Helpers shared by the data layer's tests: a scratch directory, files. */
#ifndef LOOM_TESTS_DATA_UTIL_H
#define LOOM_TESTS_DATA_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tu_dir[512];

/* A fresh directory under $TMPDIR (or /tmp); removed by tu_cleanup. */
__attribute__((unused)) static const char *tu_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tu_dir, sizeof tu_dir, "%s/loom-data-test-XXXXXX",
           base && base[0] ? base : "/tmp");
  if (!mkdtemp(tu_dir)) {
    perror("mkdtemp");
    exit(1);
  }
  return tu_dir;
}

/* tu_dir/name in a static rotating buffer (a few paths alive at once). */
__attribute__((unused)) static const char *tu_path(const char *name) {
  static char bufs[8][600];
  static int k;
  char *b = bufs[k++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", tu_dir, name);
  return b;
}

/* rm -r of a path. */
__attribute__((unused)) static void tu_rm(const char *p) {
  struct stat sb;
  if (lstat(p, &sb) != 0)
    return;
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(p);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
        continue;
      char sub[1024];
      snprintf(sub, sizeof sub, "%s/%s", p, e->d_name);
      tu_rm(sub);
    }
    if (d)
      closedir(d);
  }
  remove(p);
}

__attribute__((unused)) static void tu_cleanup(void) {
  if (tu_dir[0])
    tu_rm(tu_dir);
}

__attribute__((unused)) static void tu_write(const char *path, const void *data,
                                             size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) {
    perror(path);
    exit(1);
  }
  fclose(f);
}

/* The message of the last error contains `part`. */
__attribute__((unused)) static int tu_msg_has(const char *part) {
  if (strstr(loom_last_error(), part))
    return 1;
  fprintf(stderr, "    message '%s' lacks '%s'\n", loom_last_error(), part);
  return 0;
}

#endif
