/* The fuzz harnesses' temporary directory: one per process, emptied and
 * removed at exit, so a harness leaves nothing outside it. */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[512];

/* Removes what the harness made under path (files and directories; links
 * are removed, never followed), then path itself. */
static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
      remove_tree(p);
    else
      unlink(p);
  }
  if (d)
    closedir(d);
  rmdir(path);
}

static void remove_dir(void) { remove_tree(dir); }

const char *fuzz_dir(void) {
  if (!dir[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/loom_fuzz_XXXXXX", t && t[0] ? t : "/tmp");
    if (!mkdtemp(dir)) {
      perror("mkdtemp");
      abort();
    }
    atexit(remove_dir);
  }
  return dir;
}

const char *fuzz_write(const char *name, const void *data, size_t size) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
    perror(path);
    abort();
  }
  return path;
}

void fuzz_remove(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  struct stat sb;
  if (lstat(path, &sb) == 0 && !S_ISDIR(sb.st_mode))
    unlink(path);
}

int fuzz_split(const uint8_t *data, size_t size, const uint8_t **part,
               size_t *len, int max) {
  int n = 0;
  while (n < max) {
    const uint8_t *nul = n + 1 < max ? memchr(data, 0, size) : NULL;
    part[n] = data;
    len[n] = nul ? (size_t)(nul - data) : size;
    n++;
    if (!nul)
      break;
    size -= len[n - 1] + 1;
    data = nul + 1;
  }
  return n;
}
