/* loom obs: what training shows of itself. Metric sinks: RUN/metrics.jsonl
 * (one JSON object per line), TensorBoard event files (RUN/tb/) and an
 * MLflow tracking server (its REST API); the timeline trace (RUN/trace/).
 * Later: memory by category, the report (docs/observe.md).
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
  bool jsonl;           /* RUN_DIR/metrics.jsonl (default true) */
  bool tensorboard;     /* RUN_DIR/tb/events.out.tfevents.* (default false) */
  bool append;          /* metrics.jsonl: append (a resumed run), else start it
                           anew; an event file is always a new one */
  int64_t keep_to_step; /* with append, >= 0: lines of a later step are cut
                           off first (a run resumed from an older checkpoint
                           logs those steps again), and so is a last line
                           left unfinished; default -1: all kept */
  struct loom_mlflow *mlflow; /* every number of a line also as an MLflow
                                 metric at its step (borrowed; NULL: none) */
} loom_metrics_opts;
loom_metrics_opts loom_metrics_opts_default(void);
loom_status loom_metrics_open_opts(loom_metrics **out, const char *run_dir,
                                   const loom_metrics_opts *opts);
/* metrics.jsonl only. */
loom_status loom_metrics_open(loom_metrics **out, const char *run_dir,
                              bool append);
/* metrics.jsonl's path ("" without it). */
const char *loom_metrics_path(const loom_metrics *m);
/* Opened with append and keep_to_step >= 0: whether the lines kept hold an
 * evaluation (a "val_loss") at step keep_to_step; false otherwise (and
 * without metrics.jsonl, or m NULL). A resumed trainer runs the evaluation
 * of its first step when it is due there and missing. */
bool loom_metrics_kept_eval(const loom_metrics *m);
/* The event file's path ("" without one). */
const char *loom_metrics_tb_path(const loom_metrics *m);
/* One line: begin, members, end. A NULL m: the calls do nothing and end
 * is LOOM_ERR_INVALID_ARG (so is open with a NULL out or run_dir; the
 * paths of a NULL m are ""). A NULL key, a NULL array with n > 0 (or
 * n < 0), or a member added outside begin .. end spoils the line: end
 * writes none of it and returns LOOM_ERR_INVALID_ARG naming the misuse, as
 * it does without a begin. A NULL string value is JSON null; keys and
 * strings are escaped. */
void loom_metrics_begin(loom_metrics *m);
void loom_metrics_int(loom_metrics *m, const char *key, int64_t v);
void loom_metrics_num(loom_metrics *m, const char *key, double v);
void loom_metrics_str(loom_metrics *m, const char *key, const char *v);
/* An array of n numbers (one per rank, say): in metrics.jsonl only, not a
 * TensorBoard scalar. */
void loom_metrics_nums(loom_metrics *m, const char *key, const double *v,
                       int n);
loom_status loom_metrics_end(loom_metrics *m);
void loom_metrics_close(loom_metrics *m);

/* ---------------------------------------------------------- TensorBoard */

/* An event file as TensorBoard reads it: TFRecord framing (length, masked
 * CRC32C of the length, the record, masked CRC32C of the record), each
 * record a serialized tensorflow.Event; the first one names the format
 * version, the others carry a Summary of scalars (simple_value). The file
 * is DIR/events.out.tfevents.<unix time>.<host>.<pid>.loom (the time one
 * past the newest file of DIR when that is not older, so that the names'
 * order is the files'), made new (never through a link), flushed after
 * every event. */
typedef struct loom_tb loom_tb;
loom_status loom_tb_open(loom_tb **out, const char *dir);
const char *loom_tb_path(const loom_tb *w);
/* A restart at step (a run resumed from a checkpoint, logging from step on
 * again): an event with SessionLog status START, as PyTorch's
 * SummaryWriter(purge_step=step) writes, which makes TensorBoard drop the
 * events of earlier files at step or later (the abandoned timeline's).
 * Written right after open, before the file's scalars. */
loom_status loom_tb_restart(loom_tb *w, int64_t step, double wall_time);
/* One event with n scalars tags[i] = values[i] at step. */
loom_status loom_tb_scalars(loom_tb *w, int64_t step, double wall_time,
                            const char *const *tags, const float *values,
                            int n);
void loom_tb_close(loom_tb *w);
/* TFRecord's checksum of a record: CRC32C rotated right by 15 bits plus
 * 0xa282ead8. */
uint32_t loom_tb_masked_crc(const void *data, size_t n);

/* ---------------------------------------------------------------- trace */
/* The timeline: Chrome/Perfetto trace events (JSON), one file per process
 * (rank), written by a process-wide tracer that every thread may call.
 * Complete events ("X": a name, a category, a start and a duration in
 * microseconds since the trace began) on the calling thread's track;
 * counters ("C"); thread names. Time is loom_time_now() (the host's
 * monotonic clock); the file records that clock at ts 0 (metadata
 * "loom_clock") so that loom report --trace puts the ranks of a host on
 * one time line. Nothing is done (one atomic load) while no trace is open,
 * or while it records nothing (outside its step window, or past its cap).
 *
 *   loom_fs_mkdirs("run/trace", 0755);           the directory must exist
 *   loom_trace_start("run/trace/rank-0.json", 0, 1);      rank 0 of 1
 *   loom_trace_begin("my region"); ... loom_trace_end();    user regions
 *   loom_trace_span("train", "forward", t0, t1, "\"step\":3");
 *   loom_trace_stop(NULL);
 *
 * A window of steps and a size cap (as PyTorch's profiler schedule):
 *
 *   loom_trace_opts o = loom_trace_opts_default();
 *   o.start = 100; o.steps = 10; o.every = 1000;   steps 100-109, 1100-1109..
 *   o.max_bytes = 256u << 20;                      at most 256 MiB
 *   loom_trace_start_opts(path, rank, world, &o);
 *   for (step = 0; ...; step++) { loom_trace_step(step); ... }
 */
/* What a trace records. The window: steps start .. start + steps - 1
 * (steps 0: from start to the end), again every `every` steps from start
 * when every > 0 (every > steps > 0 then), by the numbers given to
 * loom_trace_step; before the first loom_trace_step it records when start
 * is 0. Outside the window nothing is recorded by any thread; a span is
 * recorded only when it began after the window opened (a collective that
 * started before is left out) and was handed over before it closed.
 * Markers "loom_window_open" and "loom_window_close" (instant events, args
 * step) say where recording resumed and paused. max_bytes: the file's
 * cap; when the next event would take the file past it (what is buffered
 * counts), recording stops for good: a "loom_capped" instant event (args
 * max_bytes, bytes, step, raise) ends the events, the file is closed as
 * usual at loom_trace_stop (never past the cap, as long as the cap holds
 * the header and 512 bytes), and one warning names the file, the cap, the
 * step and max_name (what to raise). 0: no cap. */
typedef struct loom_trace_opts {
  int64_t start;        /* the first step recorded */
  int64_t steps;        /* steps recorded from there; 0: to the end */
  int64_t every;        /* the window again every `every` steps; 0: once */
  uint64_t max_bytes;   /* the file's cap; 0: none */
  const char *max_name; /* named in the cap's warning (NULL: "max_bytes") */
} loom_trace_opts;
/* Every step recorded, no cap. */
loom_trace_opts loom_trace_opts_default(void);
/* A new file at path (never through a link; its directory must exist, and
 * is not made) for rank `rank` of `world`;
 * LOOM_ERR_INVALID_ARG when a trace is open already. A loom trace already
 * at path (a previous attempt's: a restart, a resume) is kept, moved to
 * attempt-STAMP/ beside it (STAMP: that attempt's start, UTC); another
 * file there is refused and left alone. */
loom_status loom_trace_start(const char *path, int rank, int world);
/* The same with a window and a cap (opts NULL: the defaults);
 * LOOM_ERR_INVALID_ARG for a negative number, or every > 0 without
 * 0 < steps < every. */
loom_status loom_trace_start_opts(const char *path, int rank, int world,
                                  const loom_trace_opts *opts);
/* Step `step` begins (the caller's numbering, the trainer's global step):
 * recording starts or stops as the window says. Nothing when no trace is
 * open; call it from the thread that runs the steps. */
void loom_trace_step(int64_t step);
/* Writes what is buffered, closes the array, closes the file; *events (or
 * NULL) gets the number of events written. */
void loom_trace_stop(uint64_t *events);
/* Writes what is buffered (the trainer calls it with each metrics line). */
void loom_trace_flush(void);
/* Whether events are recorded now: a trace is open, inside its window and
 * not capped. */
bool loom_trace_enabled(void);
/* Whether a trace is open (recording or not). */
bool loom_trace_is_open(void);
/* Whether the open (or the last) trace reached its cap. */
bool loom_trace_capped(void);
/* The open trace's path ("" when none was opened). */
const char *loom_trace_path(void);
/* Names the calling thread's track ("main", "comm", "loader"). */
void loom_trace_thread_name(const char *name);
/* A complete event from t0 to t1 (loom_time_now() seconds) on the calling
 * thread's track. args: NULL, or the members of the event's args object in
 * JSON ("\"bytes\":1024,\"group\":\"world\""). */
void loom_trace_span(const char *cat, const char *name, double t0, double t1,
                     const char *args);
/* A counter sample at t: args holds its series ("\"params_mb\":12.5"). */
void loom_trace_counter(const char *name, double t, const char *args);
/* User regions (like a profiler's named ranges): begin opens one on the
 * calling thread, end closes the innermost and records it (category
 * "user"). Nest up to 32 deep; an end without a begin does nothing. */
void loom_trace_begin(const char *name);
void loom_trace_end(void);
/* The wall clock (Unix seconds) as the trace records it. */
double loom_trace_wall(void);
/* Records this rank's wall clock less rank 0's, measured by the caller
 * (the trainer: a barrier then both clocks read, the median of `rounds`,
 * spread_s the range of those rounds): loom report --trace puts ranks of
 * several hosts on rank 0's clock with it. attempt: a number every rank of
 * this attempt records alike (the trainer: rank 0's wall clock as it
 * measured), which tells the attempts' files apart. */
void loom_trace_clock_sync(double offset_s, double spread_s, int rounds,
                           double attempt);

/* Merges the rank-K.json files of dir into one trace at out_path (a new
 * file): every rank a process (pid K, sorted by rank), all on one time
 * line (the ranks' monotonic clock on one host, their wall clock when the
 * files come from several hosts). Only the files of the latest attempt
 * are merged: a file of an earlier one (another start, another world
 * size) is left out with a warning naming it; so are a file that is not a
 * trace (empty, damaged, not a regular file) and one whose content is
 * another rank's; a rank missing from the attempt is named. A file cut
 * short (a crash, a full disk) merges up to its last whole line, with a
 * warning; one that reached its cap (loom_capped) is named in a warning
 * with its step. LOOM_ERR_IO or LOOM_ERR_CORRUPT when no file can be merged. */
typedef struct loom_trace_merge_info {
  int ranks;
  uint64_t events;
  bool one_host; /* aligned by the monotonic clock */
  bool synced;   /* several hosts, their wall clocks brought to rank 0's by
                    the offsets measured at the start (loom_clock_sync) */
  int left_out;  /* rank files not merged (each named in a warning) */
  int missing;   /* ranks of the attempt without a file */
  int capped;    /* rank files that reached their cap (each named in a
                    warning) */
} loom_trace_merge_info;
loom_status loom_trace_merge(const char *dir, const char *out_path,
                             loom_trace_merge_info *info);

/* --------------------------------------------------------------- report */
/* One self-contained HTML page of a run directory (its metrics.jsonl,
 * env.json and config.yaml): a verdict in words with its evidence (data
 * loading, communication, imbalanced ranks, checkpoints, else compute),
 * plots as inline SVG (loss and validation, accuracy, learning rate,
 * throughput, a step's parts, memory by category with the peak RSS, each
 * rank's busy and waiting time, gradient norm), the environment and the
 * configuration. A run still being written is shown up to its last whole
 * line. out_path is written in one step, never through a link; png_dir
 * (NULL: none) also gets every plot as PNG-ID.png. */
typedef struct loom_report_info {
  int lines; /* metrics lines read */
  int64_t last_step, total_steps;
  bool finished; /* the final evaluation is there */
  int plots, pngs;
  char verdict[512]; /* the headline */
} loom_report_info;
loom_status loom_report_write(const char *run_dir, const char *out_path,
                              const char *png_dir, loom_report_info *info);

/* --------------------------------------------------------------- MLflow */
/* A run on an MLflow tracking server, over its REST API (libcurl). The
 * calls below never wait for the network: they append to a queue in
 * memory (a mutex, a condition variable) and return; a sender thread of
 * the handle does every HTTP request. It finds the experiment by name (or
 * creates it), creates the run, then sends what is queued in batches
 * (runs/log-batch, within MLflow's limits per call) and artifacts
 * (mlflow-artifacts PUT, the server's artifact proxy, on by default in
 * `mlflow server`).
 *
 * The server may be away at any time: a request that fails (no
 * connection, a timeout, HTTP 5xx or 429) is tried again with backoff
 * (0.5 s, doubling to 10 s) and nothing is lost while the queue has room;
 * the first failure is one warning, the reconnection one info line. A
 * batch the server refuses (HTTP 4xx: a bad name, a param logged twice
 * with two values) is a warning with the server's message and is dropped.
 * Keys are checked as MLflow checks them (letters, digits and _ - . / :
 * space, at most 250 bytes, a path without empty, "." or ".." parts): one
 * that is not is dropped with one warning. NaN and infinities are sent as
 * MLflow's JSON has them ("NaN", "Infinity"); MLflow stores an infinity as
 * +-DBL_MAX.
 *
 *   loom_mlflow_opts o = loom_mlflow_opts_default();
 *   o.uri = "http://127.0.0.1:5000";
 *   o.experiment = "kjv-gpt";
 *   loom_mlflow_open(&m, &o);
 *   loom_mlflow_param(m, "optim.lr", "3e-4");
 *   loom_mlflow_metric(m, "loss", 2.5, step, loom_time_wall());
 *   loom_mlflow_artifact(m, "config.yaml", "config.yaml");
 *   loom_mlflow_close(m, "FINISHED", 30);
 */
typedef struct loom_mlflow loom_mlflow;
typedef struct loom_mlflow_opts {
  const char *uri;        /* http://HOST:PORT (or https://) of a server */
  const char *experiment; /* experiment name; made when missing (default
                             "Default") */
  const char *run_name;   /* NULL: the server's default */
  const char *run_id;     /* NULL or "": a new run; else go on with this
                             run (a resumed training run), or a new one
                             when the server does not know it */
  /* Called on the sender thread as soon as the server made the run (NULL:
   * not called): where a resumed job will find its id. */
  void (*on_run)(const char *run_id, void *ctx);
  void *on_run_ctx;
  double timeout_s;    /* one HTTP request's limit (default 5) */
  size_t max_buffered; /* metric values kept while the server is away
                          (default 100000); beyond it the oldest are
                          dropped and counted */
  /* A resumed training run (NULL or replay_to_step < 0: none): once the
   * run is there, the lines of this metrics.jsonl up to replay_to_step
   * are sent again, with their steps and times, for the values the server
   * lacks (after its latest step of each key; all for a new run): what an
   * earlier attempt queued and a crash or SIGKILL lost. */
  const char *replay_jsonl;
  int64_t replay_to_step;
} loom_mlflow_opts;
loom_mlflow_opts loom_mlflow_opts_default(void);
/* Starts the sender thread; it finds or creates the experiment and creates
 * the run. Never fails because the server is unreachable (that is retried,
 * a warning once); fails only on bad arguments (uri not http://..., an
 * empty experiment name: LOOM_ERR_INVALID_ARG) or no memory. */
loom_status loom_mlflow_open(loom_mlflow **out, const loom_mlflow_opts *o);
/* A run's parameter. MLflow's params are immutable: a key logged again
 * with the same value is nothing, with another value a warning (the first
 * stays). Values longer than MLflow's 6000 characters are cut, warned. */
void loom_mlflow_param(loom_mlflow *m, const char *key, const char *value);
/* A run's tag (the last value logged wins); values cut at 8000 bytes. */
void loom_mlflow_tag(loom_mlflow *m, const char *key, const char *value);
/* One value of a metric at step; wall_time_s: Unix seconds (<= 0: now),
 * sent in milliseconds as MLflow keeps it. */
void loom_mlflow_metric(loom_mlflow *m, const char *key, double value,
                        int64_t step, double wall_time_s);
/* An artifact: the file's bytes (read when called) uploaded as
 * artifact_path (e.g. "config.yaml", "ckpt/manifest.json"; relative,
 * without "." or ".." parts). LOOM_ERR_IO when the file cannot be read,
 * LOOM_ERR_INVALID_ARG for a bad path. */
loom_status loom_mlflow_artifact(loom_mlflow *m, const char *local_path,
                                 const char *artifact_path);
/* The run's id ("" until the server answered). */
const char *loom_mlflow_run_id(const loom_mlflow *m);
typedef struct loom_mlflow_stats {
  uint64_t sent;     /* values (metrics, params, tags, artifacts) the
                        server took */
  uint64_t dropped;  /* values given up: the buffer full, refused by the
                        server (4xx), bad keys */
  uint64_t pending;  /* values queued or being sent */
  uint64_t failures; /* requests that failed and are retried */
  bool connected;    /* the last request got an answer */
} loom_mlflow_stats;
void loom_mlflow_get_stats(const loom_mlflow *m, loom_mlflow_stats *s);
/* Sends what is buffered (waits at most deadline_s), ends the run with
 * status "FINISHED" / "FAILED" / "KILLED" (NULL: "FINISHED"), stops the
 * thread and frees m. What could not be sent is a warning naming how many
 * values were lost. Returns within about deadline_s + timeout_s. NULL is
 * a no-op. */
void loom_mlflow_close(loom_mlflow *m, const char *status, double deadline_s);
/* Ends run_id at the server uri with status ("FINISHED", "FAILED",
 * "KILLED") if, and only if, the server says it is still RUNNING: what a
 * supervisor does for a run whose process died without closing it (loom
 * run, when a job of loom train ends failed: SIGKILL, a crashed rank).
 * *ended (may be NULL): whether it was ended here. Two requests, each
 * within timeout_s (<= 0: 5 s); LOOM_ERR_IO naming the server and the run
 * when one fails, LOOM_ERR_INVALID_ARG for a bad uri, run id or status. */
/* RUN/mlflow_run_id: where a training run keeps its MLflow run's id, for a
 * resumed or restarted job (and loom run) to find it. */
#define LOOM_MLFLOW_RUN_ID_FILE "mlflow_run_id"
/* Reads run_dir's LOOM_MLFLOW_RUN_ID_FILE into out (n bytes): "" when
 * there is none (or it is not a regular file: never followed through a
 * link, never waited on); LOOM_ERR_CORRUPT naming the file when it holds
 * anything but an id (hexadecimal digits and dashes), out "" then. */
loom_status loom_mlflow_read_run_id(const char *run_dir, char *out, size_t n);
loom_status loom_mlflow_end_stale(const char *uri, const char *run_id,
                                  const char *status, double timeout_s,
                                  bool *ended);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif
