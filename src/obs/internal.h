/* What the obs layer's files share and keep to themselves. */
#ifndef LOOM_OBS_INTERNAL_H
#define LOOM_OBS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "loom/core.h"

/* A whole file into memory (loom_malloc, NUL-terminated; *len, if not
 * NULL, the bytes without the NUL). LOOM_ERR_IO naming the file and the
 * reason; LOOM_ERR_NOMEM. */
loom_status loom_obs_read_file(const char *path, char **data, size_t *len);

/* path opened for reading, a regular file only: a FIFO, device, socket or
 * directory is refused at once (never waited on). NULL with
 * loom_last_error() naming the file and the reason. */
FILE *loom_obs_open_read(const char *path);

/* A JSON value that is a whole number in [lo, hi]: what a step, rank or
 * count read from a file must be before a cast to an integer (a cast of
 * 1e400 or -3 is undefined, or no step). */
struct cJSON;
bool loom_obs_json_whole(const struct cJSON *v, double lo, double hi);

/* The attempt a trace file belongs to (trace_merge.c): the number its
 * ranks share (loom_clock_sync's attempt; a 1-rank trace's own start);
 * *world (may be NULL) its world size, 0 when it does not say.
 * LOOM_ERR_CORRUPT when it is not a loom trace. */
loom_status loom_trace_file_attempt(const char *path, double *attempt,
                                    int *world);

#endif
