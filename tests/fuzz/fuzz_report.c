/* Fuzzes loom report's reader and page (loom_report_write over
 * src/obs/report_data.c's rp_read): the input is metrics.jsonl, then a NUL
 * byte, env.json, a NUL byte and config.yaml (a part left out: no such
 * file). A first byte 0x80 asks for the PNG files too (the raster path,
 * some 40 times slower than the page: only the inputs that start so) and
 * is not part of the file. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "loom/core.h"
#include "loom/obs.h"

static const char *const names[] = {"run/metrics.jsonl", "run/env.json",
                                    "run/config.yaml"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20)
    return 0;
  bool png = size > 0 && data[0] == 0x80;
  if (png) {
    data++;
    size--;
  }
  const uint8_t *part[3];
  size_t len[3];
  int n = fuzz_split(data, size, part, len, 3);
  char run[1024], out[1100], pngs[1100];
  snprintf(run, sizeof run, "%s/run", fuzz_dir());
  snprintf(out, sizeof out, "%s/report.html", fuzz_dir());
  snprintf(pngs, sizeof pngs, "%s/png", fuzz_dir());
  mkdir(run, 0700);
  for (int i = 0; i < 3; i++) {
    if (i < n)
      fuzz_write(names[i], part[i], len[i]);
    else
      fuzz_remove(names[i]);
  }
  loom_report_info info;
  memset(&info, 0, sizeof info);
  loom_status st = loom_report_write(run, out, png ? pngs : NULL, &info);
  /* metrics.jsonl is there and readable: whatever it holds, the page is
   * written (bad lines counted, a torn tail left out); only memory may run
   * out, and that error names the file or the run. */
  if (st != LOOM_OK && st != LOOM_ERR_NOMEM)
    abort();
  if (st == LOOM_ERR_NOMEM && !strstr(loom_last_error(), run))
    abort();
  if (st == LOOM_OK &&
      (info.lines < 0 || info.plots < 0 || info.pngs < 0 ||
       info.last_step < 0 || info.total_steps < 0 || (!png && info.pngs != 0) ||
       !memchr(info.verdict, '\0', sizeof info.verdict) ||
       info.verdict[0] == '\0'))
    abort();
  return 0;
}
