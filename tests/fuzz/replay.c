/* Replays every file of the given corpus directories (or files) through a
 * harness's LLVMFuzzerTestOneInput: the corpus as a regression test in the
 * normal build, where libFuzzer is not linked. A crash is the failure. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  size_t r;
  while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      uint8_t *b = realloc(buf, cap *= 2);
      if (!b)
        free(buf);
      buf = b;
    }
  }
  fclose(f);
  if (!buf)
    return -1;
  /* An exact-size copy, so a read past the input is caught by ASan. */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) {
      perror(argv[i]);
      failed++;
      continue;
    }
    if (!S_ISDIR(sb.st_mode)) {
      run_file(argv[i]) == 0 ? passed++ : failed++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.')
        continue;
      names = realloc(names, (n + 1) * sizeof *names);
      names[n++] = strdup(e->d_name);
    }
    if (d)
      closedir(d);
    qsort(names, n, sizeof *names, cmp);
    for (size_t k = 0; k < n; k++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[i], names[k]);
      run_file(p) == 0 ? passed++ : failed++;
      free(names[k]);
    }
    free(names);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
