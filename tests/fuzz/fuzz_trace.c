/* Fuzzes the merge of the ranks' trace files (loom_trace_merge, loom
 * report --trace): the input's NUL bytes split it into rank-0.json,
 * rank-1.json, ... (up to 8). Files cut short, damaged, of other attempts
 * or of other ranks are left out with a warning; the merge either writes a
 * whole JSON array or fails with LOOM_ERR_IO / LOOM_ERR_CORRUPT naming the
 * directory. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "loom/core.h"
#include "loom/obs.h"

enum { MAX_FILES = 8 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20)
    return 0;
  const uint8_t *part[MAX_FILES];
  size_t len[MAX_FILES];
  int n = fuzz_split(data, size, part, len, MAX_FILES);
  for (int i = 0; i < MAX_FILES; i++) {
    char name[64];
    snprintf(name, sizeof name, "trace/rank-%d.json", i);
    if (i == 0) {
      char d[1100];
      snprintf(d, sizeof d, "%s/trace", fuzz_dir());
      mkdir(d, 0700);
    }
    if (i < n)
      fuzz_write(name, part[i], len[i]);
    else
      fuzz_remove(name);
  }
  char dir[1100], out[1100];
  snprintf(dir, sizeof dir, "%s/trace", fuzz_dir());
  snprintf(out, sizeof out, "%s/merged.json", fuzz_dir());
  loom_trace_merge_info info;
  loom_status st = loom_trace_merge(dir, out, &info);
  if (st != LOOM_OK && st != LOOM_ERR_IO && st != LOOM_ERR_CORRUPT &&
      st != LOOM_ERR_NOMEM)
    abort();
  if (st != LOOM_OK) {
    if (!strstr(loom_last_error(), dir))
      abort();
    return 0;
  }
  if (info.ranks < 1 || info.ranks + info.left_out != n || info.missing < 0 ||
      info.capped < 0 || info.capped > info.ranks)
    abort();
  /* The merged file is one JSON array: what Perfetto and chrome://tracing
   * load. */
  FILE *f = fopen(out, "rb");
  if (!f)
    abort();
  fseek(f, 0, SEEK_END);
  long m = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)m + 1);
  if (!text || fread(text, 1, (size_t)m, f) != (size_t)m)
    abort();
  fclose(f);
  text[m] = '\0';
  cJSON *j = cJSON_Parse(text);
  if (!cJSON_IsArray(j))
    abort();
  cJSON_Delete(j);
  free(text);
  return 0;
}
