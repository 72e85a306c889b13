/* Fuzzes the reader of the run status records (loom_runstat_read, what
 * loom run's supervisor and the rank launcher read each rank-N file with):
 * the input is the file rank-0. A file cut short, half rewritten or of
 * another program must be refused as corrupt, naming the file, and a
 * record accepted must hold only what the writer can write (the supervisor
 * adds and compares these numbers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "loom/core.h"
#include "loom/run.h"

static bool time_ok(double t) { return isfinite(t) && t >= 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16)
    return 0;
  const char *path = fuzz_write("rank-0", data, size);
  char want[1100];
  snprintf(want, sizeof want, "%s: ", path);
  loom_runstat_record rec;
  loom_status st = loom_runstat_read(fuzz_dir(), 0, &rec);
  if (st != LOOM_OK && st != LOOM_ERR_CORRUPT)
    abort();
  if (st == LOOM_ERR_CORRUPT &&
      strncmp(loom_last_error(), want, strlen(want)) != 0)
    abort();
  if (st != LOOM_OK)
    return 0;
  bool ok = rec.phase >= -1 && rec.phase < LOOM_RUNSTAT_PHASE_COUNT &&
            memchr(rec.host, '\0', sizeof rec.host) &&
            memchr(rec.note, '\0', sizeof rec.note) && rec.step >= -1 &&
            rec.first_step >= -1 && rec.exit_code >= -2 &&
            rec.exit_code <= 255 && rec.signal >= 0 && rec.signal < 128 &&
            rec.pid >= 0 && time_ok(rec.t_step) && time_ok(rec.t_first_step) &&
            time_ok(rec.t_beat) && time_ok(rec.t_exit);
  for (int p = 0; p < LOOM_RUNSTAT_PHASE_COUNT; p++)
    ok &= time_ok(rec.t_phase[p]);
  if (!ok)
    abort();
  return 0;
}
