/* loom ckpt: checkpoints as a directory per step (manifest.json + one shard
 * file per rank, every block CRC32C-checked), written atomically by any
 * number of ranks, read back at any world size by slicing (docs/
 * checkpoints.md has the format, byte by byte).
 *
 *   ROOT/latest                 "step_00000500\n", replaced last
 *   ROOT/step_00000500/         a complete checkpoint
 *     manifest.json             what is where, and the training state
 *     shard_00000.bin           rank 0's part of every flat buffer
 *   ROOT/.step_00000600.tmp/    a checkpoint being written
 *
 * Saving, on every rank r of W (single-process training is W = 1):
 *
 *   loom_ckpt_writer_new(&w, root, step, &opts);   opts.rank, opts.world
 *   loom_ckpt_writer_add(w, "params", LOOM_F32, N, begin, end, p + begin);
 *   ...                                            each buffer's [begin, end)
 *   loom_ckpt_writer_set_meta(w, &meta);           rank 0 (others may too)
 *   st = loom_ckpt_writer_write(w);                or _start + _wait (async)
 *   -- all ranks agree that every write succeeded (an all-reduce of st) --
 *   rank 0: ok ? loom_ckpt_writer_commit(w) : loom_ckpt_writer_abort(w);
 *   loom_ckpt_writer_free(w);
 *
 * Across ranks, the ranges of one buffer must tile [0, N) exactly (a DDP
 * run splits its replicated buffers; a ZeRO run writes what each rank
 * owns). Loading on any number of ranks: each reads any element range it
 * needs with loom_ckpt_read_range, which slices across the shard files. */
#ifndef LOOM_CKPT_H
#define LOOM_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

#define LOOM_CKPT_FORMAT_VERSION 1
/* Bytes of the short names (buffers, strategy, optimizer, schedule, RNG
 * streams), NUL included. Buffer names: letters, digits, '.', '_', '-'. */
#define LOOM_CKPT_NAME_MAX 32

/* --------------------------------------------------------- training state */

/* A named RNG stream (seed, stream id, counter) to restore exactly. */
typedef struct loom_ckpt_rng {
  char name[LOOM_CKPT_NAME_MAX];
  loom_rng state;
} loom_ckpt_rng;

/* Where the data loader stands. `sample` counts the samples of the epoch
 * consumed over all ranks, so a run resumed on another world size goes on
 * from the same sample with none skipped or repeated. */
typedef struct loom_ckpt_data_pos {
  int64_t epoch;  /* the epoch in progress, from 0 */
  int64_t batch;  /* global batches of it completed */
  int64_t sample; /* samples of it consumed, all ranks together */
} loom_ckpt_data_pos;

/* How the ranks that wrote a checkpoint held the model: the names a
 * manifest's "strategy" may hold (or "", not recorded). The reader refuses
 * any other as damage, the writer as a bad argument. */
#define LOOM_CKPT_STRATEGY_LIST(X)                                             \
  X(LOOM_CKPT_STRATEGY_NONE, "none")                                           \
  X(LOOM_CKPT_STRATEGY_DDP, "ddp")                                             \
  X(LOOM_CKPT_STRATEGY_ZERO1, "zero1")                                         \
  X(LOOM_CKPT_STRATEGY_ZERO2, "zero2")                                         \
  X(LOOM_CKPT_STRATEGY_ZERO3, "zero3")                                         \
  X(LOOM_CKPT_STRATEGY_PIPELINE, "pipeline")                                   \
  X(LOOM_CKPT_STRATEGY_TENSOR, "tensor")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_CKPT_STRATEGY_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_CKPT_STRATEGY_COUNT
} loom_ckpt_strategy;

const char *loom_ckpt_strategy_name(loom_ckpt_strategy s);
/* LOOM_ERR_INVALID_ARG naming s and the known names when s is none of
 * them. */
loom_status loom_ckpt_strategy_parse(const char *s, loom_ckpt_strategy *out);

/* Everything but the buffers. When writing, the caller's arrays are copied
 * by loom_ckpt_writer_set_meta; when reading, they belong to the loom_ckpt. */
typedef struct loom_ckpt_meta {
  int64_t step;   /* optimizer steps completed (read; set by the writer) */
  int world_size; /* ranks that wrote it (read; set by the writer) */
  char strategy[LOOM_CKPT_NAME_MAX]; /* a loom_ckpt_strategy name, or "" */
  uint64_t config_hash;              /* loom_config_hash of the run */
  uint64_t layout_hash;              /* 0 when writing: from the views */
  const loom_param *views;           /* the layout of the flat buffers */
  int n_views;
  char optimizer[LOOM_CKPT_NAME_MAX]; /* "sgd", "adamw" */
  int64_t optimizer_step;
  char schedule[LOOM_CKPT_NAME_MAX]; /* "constant", "cosine", ... */
  int64_t schedule_step;
  double lr;         /* the rate of the last step taken (for people) */
  double loss_scale; /* 1 when unused */
  const loom_ckpt_rng *rngs;
  int n_rngs;
  loom_ckpt_data_pos data;
  const char *extra_json; /* a JSON object, the trainer's own; NULL = {} */
} loom_ckpt_meta;

/* Zeros, names empty, loss_scale 1. */
loom_ckpt_meta loom_ckpt_meta_default(void);

/* FNV-1a 64 over each view's name, offset, ndim and shape: two models with
 * the same hash lay out their flat buffers the same way. NULL views: the
 * hash of none. */
uint64_t loom_ckpt_layout_hash(const loom_param *views, int n_views);

/* ---------------------------------------------------------------- saving */

typedef struct loom_ckpt_writer loom_ckpt_writer;

typedef struct loom_ckpt_writer_opts {
  int rank, world;    /* this rank and the number of ranks: 0, 1 */
  int keep;           /* commit keeps the newest `keep`; 0 = all. 3 */
  bool copy;          /* add() copies the data, so the caller may go on
                         changing it (async saves). false */
  size_t block_bytes; /* largest checksummed block. 16 MiB */
} loom_ckpt_writer_opts;

loom_ckpt_writer_opts loom_ckpt_writer_opts_default(void);

/* Starts the checkpoint of `step` under directory `root` (created when
 * missing): every rank creates ROOT/.step_<step>.tmp/ if no other rank has. */
loom_status loom_ckpt_writer_new(loom_ckpt_writer **out, const char *root,
                                 int64_t step,
                                 const loom_ckpt_writer_opts *opts);
/* This rank's elements [begin, end) of buffer `name`, which has `total`
 * elements of dtype in all; data points at element `begin`. One range per
 * buffer per rank; an empty range is allowed. Borrowed until the write
 * completes unless opts.copy. */
loom_status loom_ckpt_writer_add(loom_ckpt_writer *w, const char *name,
                                 loom_dtype dtype, int64_t total, int64_t begin,
                                 int64_t end, const void *data);
/* The state written to the manifest at commit (deep copy). */
loom_status loom_ckpt_writer_set_meta(loom_ckpt_writer *w,
                                      const loom_ckpt_meta *meta);
/* Writes this rank's shard file and fsyncs it. On failure the file is
 * removed and the message names it (e.g. "No space left on device"). */
loom_status loom_ckpt_writer_write(loom_ckpt_writer *w);
/* The same on a background thread. With `commit` (single-rank runs: world
 * must be 1) the thread also commits. The caller must not touch borrowed
 * data until _wait returns (opts.copy avoids that). */
loom_status loom_ckpt_writer_start(loom_ckpt_writer *w, bool commit);
/* *done = true once a started write has finished (then _wait is quick). */
loom_status loom_ckpt_writer_test(loom_ckpt_writer *w, bool *done);
/* Waits for a started write; returns its status and message. */
loom_status loom_ckpt_writer_wait(loom_ckpt_writer *w);
/* Rank 0, once every rank's write has succeeded: checks that the shards
 * tile each buffer, writes manifest.json, reads it back as loom_ckpt_open
 * at LOOM_CKPT_VERIFY_META does (what a resume would refuse, such as views
 * beyond the 'params' buffer, is never committed: the reader's status and
 * reason), fsyncs, renames the directory to
 * ROOT/step_<step> (replacing one of the same step atomically), then
 * replaces ROOT/latest, then deletes checkpoints beyond opts.keep and stale
 * temporary directories. A failure before `latest` is replaced leaves the
 * previous checkpoint as it was. */
loom_status loom_ckpt_writer_commit(loom_ckpt_writer *w);
/* The same commit on a background thread (multi-rank async saves: rank 0
 * need not hold up training for the manifest and its fsyncs); _test and
 * _wait as for a write, which returns the commit's status. */
loom_status loom_ckpt_writer_commit_start(loom_ckpt_writer *w);
/* Rank 0 after a failed write anywhere: removes the temporary directory. */
void loom_ckpt_writer_abort(loom_ckpt_writer *w);
/* Waits for a started write, then frees; removes nothing. NULL is a no-op. */
void loom_ckpt_writer_free(loom_ckpt_writer *w);
/* ROOT/step_<step>, where the checkpoint will be once committed. */
const char *loom_ckpt_writer_path(const loom_ckpt_writer *w);

/* A whole buffer, for loom_ckpt_save. */
typedef struct loom_ckpt_buffer {
  const char *name;
  loom_dtype dtype;
  int64_t count;
  const void *data;
} loom_ckpt_buffer;

/* Single-rank save in one call: new, add each buffer, set_meta, write,
 * commit; on failure the temporary directory is removed. */
loom_status loom_ckpt_save(const char *root, int64_t step,
                           const loom_ckpt_meta *meta,
                           const loom_ckpt_buffer *bufs, int n_bufs, int keep);

/* --------------------------------------------------------------- loading */

#define LOOM_CKPT_VERIFY_LIST(X)                                               \
  X(LOOM_CKPT_VERIFY_NONE, "none") /* the manifest alone (self-checked) */     \
  X(LOOM_CKPT_VERIFY_META, "meta") /* and file sizes, headers, indexes */      \
  X(LOOM_CKPT_VERIFY_FULL, "full") /* and every checksum of every byte */

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_CKPT_VERIFY_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_CKPT_VERIFY_COUNT
} loom_ckpt_verify_level;

typedef struct loom_ckpt_open_opts {
  loom_ckpt_verify_level verify; /* FULL */
  uint64_t layout_hash;          /* non-zero: a manifest of another layout is
                                    LOOM_ERR_MISMATCH. 0 */
  int64_t before_step; /* latest/find: only steps below this. INT64_MAX */
} loom_ckpt_open_opts;

loom_ckpt_open_opts loom_ckpt_open_opts_default(void);

typedef struct loom_ckpt loom_ckpt;

/* Opens the checkpoint in directory `dir` and checks it to opts.verify
 * (NULL opts: defaults). Damage is LOOM_ERR_CORRUPT with a message naming
 * the file: a missing or altered manifest, a missing, truncated or altered
 * shard. Reads later check each block they touch, whatever the level. */
loom_status loom_ckpt_open(loom_ckpt **out, const char *dir,
                           const loom_ckpt_open_opts *opts);
void loom_ckpt_close(loom_ckpt *c);

/* The newest valid checkpoint under `root`: the one `latest` names, or,
 * when `latest` is missing or names a damaged one, the newest older one
 * that opens; each one passed over is reported with LOOM_WARN naming the
 * file and why. *out = NULL with LOOM_OK when root holds no checkpoint at
 * all (or does not exist); LOOM_ERR_CORRUPT when it holds only damaged
 * ones; LOOM_ERR_CONFIG when none usable is left and some were written for
 * another model (opts->layout_hash differs): starting afresh among them
 * would reuse their names and prune them, so the caller decides. Multi-rank:
 * rank 0 calls it and broadcasts the step; the others open ROOT/step_<step> at
 * LOOM_CKPT_VERIFY_META. */
loom_status loom_ckpt_open_latest_valid(loom_ckpt **out, const char *root,
                                        const loom_ckpt_open_opts *opts);
/* The same, giving the directory (dir_n bytes at most) and step instead;
 * *step = -1 and dir "" when there is none. */
loom_status loom_ckpt_find_latest_valid(const char *root,
                                        const loom_ckpt_open_opts *opts,
                                        char *dir, size_t dir_n, int64_t *step);

const loom_ckpt_meta *loom_ckpt_get_meta(const loom_ckpt *c);
const char *loom_ckpt_path(const loom_ckpt *c);
/* Its manifest file (DIR/manifest.json), for messages about its fields. */
const char *loom_ckpt_manifest_path(const loom_ckpt *c);
/* manifest.json as stored. */
const char *loom_ckpt_manifest_text(const loom_ckpt *c);

typedef struct loom_ckpt_buffer_info {
  const char *name;
  loom_dtype dtype;
  int64_t count;
  int n_shards; /* ranks holding part of it */
  int n_blocks;
} loom_ckpt_buffer_info;

int loom_ckpt_buffer_count(const loom_ckpt *c);
loom_status loom_ckpt_buffer_get(const loom_ckpt *c, int i,
                                 loom_ckpt_buffer_info *out);
/* LOOM_ERR_MISMATCH when the checkpoint has no buffer of that name. */
loom_status loom_ckpt_buffer_find(const loom_ckpt *c, const char *name,
                                  loom_ckpt_buffer_info *out);
/* Elements [begin, end) of a buffer into dst ((end - begin) elements of its
 * dtype), whichever shard files hold them; every block touched is read
 * whole and its checksum checked. Safe to call from several threads. */
loom_status loom_ckpt_read_range(const loom_ckpt *c, const char *name,
                                 int64_t begin, int64_t end, void *dst);

typedef struct loom_ckpt_file_info {
  const char *name; /* "shard_00000.bin" */
  int rank;
  int64_t bytes;
  uint32_t index_crc; /* CRC32C of the file's block index */
  int n_blocks;
} loom_ckpt_file_info;

int loom_ckpt_file_count(const loom_ckpt *c);
loom_status loom_ckpt_file_get(const loom_ckpt *c, int i,
                               loom_ckpt_file_info *out);
/* Checks shard file i against the manifest: its size, header, footer and
 * index (META), and with FULL every checksum and padding byte. */
loom_status loom_ckpt_verify_file(const loom_ckpt *c, int i,
                                  loom_ckpt_verify_level level);
/* Every file; the first damage found. */
loom_status loom_ckpt_verify(const loom_ckpt *c);

/* ------------------------------------------------------- the directory */

/* ROOT/step_<step> with the step in at least 8 digits. */
loom_status loom_ckpt_dir_name(const char *root, int64_t step, char *buf,
                               size_t n);
/* Steps of the complete checkpoint directories under root, ascending;
 * *steps is freed with loom_free (NULL when *n = 0). A missing root is an
 * empty list. */
loom_status loom_ckpt_list(const char *root, int64_t **steps, int *n);
/* Whether root holds anything named step_* (a checkpoint, a damaged one, a
 * temporary of one): a directory some run saved into. */
bool loom_ckpt_has_step_dirs(const char *root);
/* The step `latest` names: LOOM_ERR_IO when it is missing (message naming
 * it), LOOM_ERR_CORRUPT when it is not a checkpoint name. */
loom_status loom_ckpt_read_latest(const char *root, int64_t *step);

/* ------------------------------------------------- faults, for testing */

/* The n-th checkpoint file-system call from now (open for writing, write,
 * fsync, close, mkdir, rename) fails with errno err (e.g. ENOSPC, EIO);
 * n = 0 disables. Calls are counted across threads. */
void loom_ckpt_fail_io_after(long n, int err);
/* Checkpoint file-system calls made so far (to walk every failure point). */
long loom_ckpt_io_count(void);

#define LOOM_CKPT_DAMAGE_LIST(X)                                               \
  X(LOOM_CKPT_DAMAGE_FLIP, "flip")         /* one payload byte of a shard */   \
  X(LOOM_CKPT_DAMAGE_TRUNCATE, "truncate") /* a shard loses its last half */   \
  X(LOOM_CKPT_DAMAGE_MANIFEST, "manifest") /* manifest.json deleted */         \
  X(LOOM_CKPT_DAMAGE_LATEST, "latest")     /* ROOT/latest deleted */

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_CKPT_DAMAGE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_CKPT_DAMAGE_COUNT
} loom_ckpt_damage_kind;

const char *loom_ckpt_damage_name(loom_ckpt_damage_kind k);
loom_status loom_ckpt_damage_parse(const char *s, loom_ckpt_damage_kind *out);
/* Damages the checkpoint in `dir` as fault injection does (LOOM_FAULT
 * kind `corrupt`): flip and truncate hit shard file `rank`; `latest` is
 * deleted from dir's parent. */
loom_status loom_ckpt_damage(const char *dir, loom_ckpt_damage_kind kind,
                             int rank);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_CKPT_H */
