/* loom obs: what training shows of itself. Metric sinks: RUN/metrics.jsonl
 * (one JSON object per line) and TensorBoard event files (RUN/tb/). Later:
 * the timeline trace, memory by category, the report (docs/observe.md).
 *
 *   loom_metrics_opts o = loom_metrics_opts_default();
 *   o.tensorboard = true;
 *   loom_metrics_open_opts(&m, "runs/x", &o);
 *   loom_metrics_begin(m);
 *   loom_metrics_int(m, "step", 10);           the step of the line
 *   loom_metrics_num(m, "loss", 2.5);          a scalar in both sinks
 *   loom_metrics_end(m);                       written and flushed
 *
 * Every number of a line (but step, epoch, time and ranks) becomes a
 * TensorBoard scalar of the same name at the line's step, with the line's
 * time (Unix seconds) as its wall time. */
#ifndef LOOM_OBS_H
#define LOOM_OBS_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* -------------------------------------------------------------- metrics */

typedef struct loom_metrics loom_metrics;
typedef struct loom_metrics_opts {
  bool jsonl;       /* RUN_DIR/metrics.jsonl (default true) */
  bool tensorboard; /* RUN_DIR/tb/events.out.tfevents.* (default false) */
  bool append;      /* metrics.jsonl: append (a resumed run), else start it
                       anew; an event file is always a new one */
} loom_metrics_opts;
loom_metrics_opts loom_metrics_opts_default(void);
loom_status loom_metrics_open_opts(loom_metrics **out, const char *run_dir,
                                   const loom_metrics_opts *opts);
/* metrics.jsonl only. */
loom_status loom_metrics_open(loom_metrics **out, const char *run_dir,
                              bool append);
/* metrics.jsonl's path ("" without it). */
const char *loom_metrics_path(const loom_metrics *m);
/* The event file's path ("" without one). */
const char *loom_metrics_tb_path(const loom_metrics *m);
void loom_metrics_begin(loom_metrics *m);
void loom_metrics_int(loom_metrics *m, const char *key, int64_t v);
void loom_metrics_num(loom_metrics *m, const char *key, double v);
void loom_metrics_str(loom_metrics *m, const char *key, const char *v);
loom_status loom_metrics_end(loom_metrics *m);
void loom_metrics_close(loom_metrics *m);

/* ---------------------------------------------------------- TensorBoard */

/* An event file as TensorBoard reads it: TFRecord framing (length, masked
 * CRC32C of the length, the record, masked CRC32C of the record), each
 * record a serialized tensorflow.Event; the first one names the format
 * version, the others carry a Summary of scalars (simple_value). The file
 * is DIR/events.out.tfevents.<unix time>.<host>.<pid>.loom, made new
 * (never through a link), flushed after every event. */
typedef struct loom_tb loom_tb;
loom_status loom_tb_open(loom_tb **out, const char *dir);
const char *loom_tb_path(const loom_tb *w);
/* One event with n scalars tags[i] = values[i] at step. */
loom_status loom_tb_scalars(loom_tb *w, int64_t step, double wall_time,
                            const char *const *tags, const float *values,
                            int n);
void loom_tb_close(loom_tb *w);
/* TFRecord's checksum of a record: CRC32C rotated right by 15 bits plus
 * 0xa282ead8. */
uint32_t loom_tb_masked_crc(const void *data, size_t n);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif
