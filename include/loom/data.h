/* loom data: readers (IDX images, text bytes, llm.c token shards), the KJV
 * preparation step, the distributed sampler and the prefetching loader. */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* Dimension letters: N samples in a data set, B rows in a (local) batch,
 * GB rows in a global batch (B * world), C channels, H height, W width,
 * T context length (tokens per sequence). */

/* ------------------------------------------------------------ IDX files */

/* IDX (the (Fashion-)MNIST format): magic 0x0000 TT DD (TT = element type,
 * DD = number of dimensions), DD big-endian uint32 sizes, then the elements
 * in row-major order. loom reads unsigned-byte files (TT = 0x08), gzip
 * compressed or plain (zlib reads both). */
#define LOOM_IDX_MAX_DIMS 4
typedef struct loom_idx {
  int ndim;
  int64_t dims[LOOM_IDX_MAX_DIMS];
  uint8_t *data; /* prod(dims) bytes, row-major; owned */
  size_t bytes;
} loom_idx;

/* Reads a whole IDX file. Errors name the file: LOOM_ERR_IO when it cannot
 * be opened or read, LOOM_ERR_CORRUPT for a wrong magic, bad dimensions,
 * truncation or trailing data, LOOM_ERR_UNSUPPORTED for element types other
 * than unsigned bytes. */
loom_status loom_idx_read(const char *path, loom_idx *out);
/* Only the header (ndim, dims, bytes; data NULL): the same checks of the
 * header, a gzip file inflated no further than it. */
loom_status loom_idx_read_header(const char *path, loom_idx *out);
void loom_idx_free(loom_idx *idx);

/* ---------------------------------------------------- llm.c token shards */

/* llm.c's `.bin` layout: a header of 256 little-endian int32 (magic,
 * version, number of tokens, zeros), then the tokens. Two kinds exist:
 * GPT-2 shards (magic 20240520, version 1, uint16 tokens) and Llama-3 shards
 * (magic 20240801, version 7, uint32 tokens); loom reads both, writes the
 * first. */
#define LOOM_SHARD_HEADER_INTS 256
#define LOOM_SHARD_MAGIC_U16 20240520
#define LOOM_SHARD_VERSION_U16 1
#define LOOM_SHARD_MAGIC_U32 20240801
#define LOOM_SHARD_VERSION_U32 7

typedef struct loom_shard {
  int32_t magic;
  int32_t version;
  int width;             /* bytes per token: 2 or 4 */
  int64_t ntok;          /* tokens in the file */
  const uint8_t *tokens; /* (ntok * width) little-endian, mapped read-only */
  uint32_t max_token;    /* largest token id in the file */
  void *map;             /* the mapping (private) */
  size_t map_bytes;
} loom_shard;

/* Maps a shard and checks magic, version and size (a truncated or
 * over-long file is LOOM_ERR_CORRUPT naming the file). */
loom_status loom_shard_open(const char *path, loom_shard *out);
void loom_shard_close(loom_shard *s);
static inline uint32_t loom_shard_token(const loom_shard *s, int64_t i) {
  const uint8_t *p = s->tokens + (size_t)i * (size_t)s->width;
  uint32_t v = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
  if (s->width == 4)
    v |= ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
  return v;
}
/* Writes a GPT-2 style shard (magic 20240520, version 1, uint16 tokens),
 * under a temporary name renamed into place. */
loom_status loom_shard_write(const char *path, const uint16_t *tokens,
                             int64_t ntok);
/* The bytes of the file `in` (any bytes; a regular file of at most 2^31-1
 * of them) as the tokens of a shard at `path`, the same, read and written a
 * block at a time (memory does not grow with the file). *ntok: the tokens
 * written. */
loom_status loom_shard_write_bytes(const char *path, const char *in,
                                   int64_t *ntok);

/* ------------------------------------------------------------ file kinds */

#define LOOM_DATA_FILE_LIST(X)                                                 \
  X(LOOM_DATA_FILE_TEXT, "text")                                               \
  X(LOOM_DATA_FILE_IDX, "IDX")                                                 \
  X(LOOM_DATA_FILE_SHARD, "llm.c token shard")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_DATA_FILE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_DATA_FILE_COUNT
} loom_data_file;
const char *loom_data_file_name(loom_data_file k);

/* What path holds, from its first bytes, never its name: a shard magic
 * (little-endian 20240520 or 20240801) is a shard; an IDX magic (00 00,
 * then a known element type) is IDX; the gzip magic (1f 8b) is IDX when
 * the first inflated bytes are an IDX magic, else LOOM_ERR_UNSUPPORTED
 * (loom reads gzip only as IDX); anything else is text. A file that is not
 * regular is LOOM_ERR_IO; errors name the file. */
loom_status loom_data_file_detect(const char *path, loom_data_file *out);

/* -------------------------------------------------------------- data sets */

#define LOOM_SPLIT_LIST(X)                                                     \
  X(LOOM_SPLIT_TRAIN, "train")                                                 \
  X(LOOM_SPLIT_VAL, "val")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_SPLIT_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_SPLIT_COUNT
} loom_split;
const char *loom_split_name(loom_split s);
/* LOOM_ERR_INVALID_ARG for an unknown name or a NULL s or out. */
loom_status loom_split_parse(const char *s, loom_split *out);

#define LOOM_DATASET_KIND_LIST(X)                                              \
  X(LOOM_DATASET_IMAGES, "images")                                             \
  X(LOOM_DATASET_TOKENS, "tokens")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_DATASET_KIND_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_DATASET_KIND_COUNT
} loom_dataset_kind;
const char *loom_dataset_kind_name(loom_dataset_kind k);

/* A data set is N samples addressed by index; it is read-only once opened,
 * so the loader thread and the caller may use it at the same time. */
typedef struct loom_dataset loom_dataset;

typedef struct loom_dataset_info {
  loom_dataset_kind kind;
  int64_t len;        /* N samples (images, or windows of T+1 tokens) */
  int64_t C, H, W;    /* images: one sample is x (C,H,W) f32, y () i32 */
  int64_t T;          /* tokens: one sample is x (T) i32, y (T) i32 */
  int64_t classes;    /* images: largest label + 1; tokens: largest id + 1 */
  int64_t tokens;     /* tokens: tokens in this split; images: 0 */
  const char *source; /* the path it was read from */
} loom_dataset_info;

/* A NULL ds: info zeroed (kind LOOM_DATASET_IMAGES, source NULL); a NULL
 * info: nothing. loom_dataset_len(NULL) is 0. */
void loom_dataset_get_info(const loom_dataset *ds, loom_dataset_info *info);
int64_t loom_dataset_len(const loom_dataset *ds);
void loom_dataset_free(loom_dataset *ds);

/* Images: uint8 pixels kept as bytes; a batch holds them as f32
 * (x/255 - mean)/std, computed in that order (as torchvision's ToTensor +
 * Normalize do, so the values match PyTorch's bit for bit). */
#define LOOM_FASHION_MEAN 0.2860f
#define LOOM_FASHION_STD 0.3530f
#define LOOM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define LOOM_FASHION_MNIST_PACKAGE "dataset-fashion-mnist"
typedef struct loom_image_opts {
  float mean;
  float std;
} loom_image_opts;
loom_image_opts loom_image_opts_default(void); /* Fashion-MNIST's values */

/* Images (N,H,W) and labels (N) from two IDX files. */
loom_status loom_dataset_open_idx(loom_dataset **out, const char *images,
                                  const char *labels,
                                  const loom_image_opts *opts);
/* Fashion-MNIST from `dir` (NULL: LOOM_FASHION_MNIST_DIR, where Debian's
 * dataset-fashion-mnist installs it; the config key data.path overrides):
 * {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. The val split is the
 * 10,000 test images. A missing file is LOOM_ERR_IO naming the file and the
 * package to install. */
loom_status loom_dataset_open_fashion(loom_dataset **out, const char *dir,
                                      loom_split split,
                                      const loom_image_opts *opts);
/* A data set of the caller's own samples: n samples x of shape (C, H, W)
 * in f32, row-major (sample i at x + i*C*H*W), and a label y[i] each in
 * [0, classes). Tabular data: C = H = 1, W features. Both arrays are
 * copied (the caller may free them on return); batches hold the values as
 * given (no normalisation: scale them first as the model wants). It is an
 * images-kind set: loom_loader, the sampler (shuffle, ranks, tails) and
 * the MLP/CNN builders take it as they take Fashion-MNIST.
 * LOOM_ERR_INVALID_ARG naming the set (opts.name) and, for bad data, the
 * sample: a NULL array, a size below 1 or past 2^40 values, a label
 * outside [0, classes), a NaN or infinite value. */
typedef struct loom_array_opts {
  int64_t classes;  /* labels lie in [0, classes); 0: the largest label + 1 */
  const char *name; /* in messages and info.source (default "arrays") */
} loom_array_opts;
loom_array_opts loom_array_opts_default(void);
loom_status loom_dataset_from_arrays(loom_dataset **out, const float *x,
                                     const int32_t *y, int64_t n, int64_t C,
                                     int64_t H, int64_t W,
                                     const loom_array_opts *opts);
/* Bytes that loom_dataset_open_fashion(dir, split) holds in memory (pixels
 * and labels, one byte each), from the files' headers alone; *n gets the
 * number of images (NULL: not wanted). Errors as the open's. */
loom_status loom_fashion_bytes(const char *dir, loom_split split,
                               int64_t *bytes, int64_t *n);

/* Token windows: sample i of epoch e is the T+1 tokens starting at
 * off(e) + i*T inside one segment (input = first T, target = next T).
 * With random_offset, off(e) is drawn in [0, T) from the RNG keyed by
 * (seed, epoch), so the windows do not overlap within an epoch and their
 * boundaries move between epochs; N = floor(n/T) - 1 for a segment of n
 * tokens. Without it off = 0 and N = floor((n-1)/T) (evaluation). */
#define LOOM_TEXT_MAX_CONTEXT ((int64_t)1 << 24)
typedef struct loom_text_opts {
  int64_t context;     /* T (default 128), in [1, LOOM_TEXT_MAX_CONTEXT] */
  double val_fraction; /* text: the last round(n*f) bytes are val (0.1) */
  bool random_offset;  /* train split only; val is always offset 0 (true) */
  uint64_t seed;       /* keys the epoch offsets (0) */
} loom_text_opts;
loom_text_opts loom_text_opts_default(void);

/* The bytes of a whole file, as the text reader reads them: what is not a
 * regular file (a FIFO, a directory) is refused, never waited on; errors
 * name the file and the reason. *data (*n bytes, one more allocated) is
 * the caller's, freed with loom_free. */
loom_status loom_text_read(const char *path, uint8_t **data, int64_t *n);

/* A byte-level text file (vocabulary 256): the train split is the first
 * n - round(n*val_fraction) bytes, val the rest. */
loom_status loom_dataset_open_text(loom_dataset **out, const char *path,
                                   loom_split split,
                                   const loom_text_opts *opts);
/* One llm.c shard or several (a glob pattern, read in sorted order; each
 * shard is a segment, no window crosses two). Every token belongs to the
 * set: llm.c keeps validation in separate files (open them with
 * random_offset false). */
loom_status loom_dataset_open_shards(loom_dataset **out, const char *pattern,
                                     const loom_text_opts *opts);
/* Every token a token set can serve is below `vocab`; otherwise
 * LOOM_ERR_CONFIG naming the file, the token's position and its id (called
 * on open, for the validation set too, so no bad id waits for evaluation).
 * Image sets: LOOM_OK. */
loom_status loom_dataset_check_vocab(const loom_dataset *ds, int64_t vocab);

/* ------------------------------------------------------------------ batches */

typedef struct loom_batch {
  loom_tensor x;    /* images: f32 (B,C,H,W); tokens: i32 (B,T) */
  loom_tensor y;    /* images: i32 (B); tokens: i32 (B,T) */
  int64_t size;     /* rows filled (x.shape[0]); < capacity only for a
                       partial last batch, and may then be 0 on a rank */
  int64_t capacity; /* B */
  int64_t *sample;  /* (B) data set index of each row */
  int64_t epoch;    /* where the batch sits in the sequence */
  int64_t index;    /* batch index within the epoch */
  bool last_in_epoch;
  double wait_s; /* loom_loader_next: seconds the caller waited for it */
} loom_batch;

/* Allocates buffers for `capacity` rows of samples of `ds`. */
loom_status loom_batch_alloc(loom_batch *b, const loom_dataset *ds,
                             int64_t capacity);
void loom_batch_free(loom_batch *b);
/* Fills rows [0, n) with samples idx[0..n) as they are in `epoch` (token
 * windows move with the epoch); sets size, shapes and sample ids.
 * LOOM_ERR_INVALID_ARG for a NULL argument, n outside [0, capacity], an
 * index outside the data set, or a batch not allocated for a data set of
 * this kind and sample shape (x's dtype and shape, y's). */
loom_status loom_dataset_fill(const loom_dataset *ds, int64_t epoch,
                              const int64_t *idx, int64_t n, loom_batch *b);

/* ------------------------------------------------------------------ sampler */

/* What happens to the samples that do not fill a last global batch. */
#define LOOM_TAIL_LIST(X)                                                      \
  X(LOOM_TAIL_DROP, "drop")       /* left out this epoch */                    \
  X(LOOM_TAIL_PAD, "pad")         /* batch completed from the epoch's start */ \
  X(LOOM_TAIL_PARTIAL, "partial") /* a short last batch (evaluation) */

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_TAIL_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_TAIL_COUNT
} loom_tail;
const char *loom_tail_name(loom_tail t);
/* The names, indexed by value: what configs and checkpoints hold (the
 * config schema reads this table, so a value has one spelling). */
extern const char *const loom_tail_names[LOOM_TAIL_COUNT];
/* LOOM_ERR_INVALID_ARG for an unknown name or a NULL s or out. */
loom_status loom_tail_parse(const char *s, loom_tail *out);

/* The order of epoch e is a permutation perm_e of [0, N) drawn with Philox
 * keyed by (seed, epoch), never by rank (identity when !shuffle). The tail
 * rule turns it into a list L of nb*GB entries (GB = batch * world); global
 * batch b is L[b*GB, (b+1)*GB) and rank r's batch is its contiguous slice
 * [r*B, (r+1)*B). So global batch b is the same samples in the same order at
 * any world size: 1 rank with batch GB and k ranks with batch GB/k see the
 * same data. */
typedef struct loom_sampler_opts {
  uint64_t seed;
  bool shuffle;    /* default true */
  loom_tail tail;  /* default LOOM_TAIL_DROP */
  int64_t batch;   /* B, rows per rank per batch (default 1) */
  int rank, world; /* default 0, 1 */
} loom_sampler_opts;
loom_sampler_opts loom_sampler_opts_default(void);

typedef struct loom_sampler loom_sampler;
loom_status loom_sampler_new(loom_sampler **out, int64_t n,
                             const loom_sampler_opts *opts);
void loom_sampler_free(loom_sampler *s);
/* Draws the order of `epoch` (as PyTorch's DistributedSampler.set_epoch). */
loom_status loom_sampler_set_epoch(loom_sampler *s, int64_t epoch);
int64_t loom_sampler_epoch(const loom_sampler *s);
/* Batches per epoch, the same on every rank. */
int64_t loom_sampler_num_batches(const loom_sampler *s);
/* The sample ids of this rank's batch b: idx (B); *count rows. */
loom_status loom_sampler_batch(const loom_sampler *s, int64_t b, int64_t *idx,
                               int64_t *count);
/* The sample ids of global batch b (all ranks, in rank order): idx (GB). */
loom_status loom_sampler_global_batch(const loom_sampler *s, int64_t b,
                                      int64_t *idx, int64_t *count);

/* ------------------------------------------------------------------- loader */

/* A loader owns a sampler and a thread that fills the next batches into a
 * ring of buffers while the caller computes. The sequence of batches
 * depends only on (data set, options, position), never on thread timing. */
#define LOOM_LOADER_MAX_PREFETCH 64
typedef struct loom_loader_opts {
  loom_sampler_opts sampler;
  int prefetch; /* batches prepared ahead (default 2, at most
                   LOOM_LOADER_MAX_PREFETCH); 0: no thread, each batch is
                   made inside loom_loader_next */
} loom_loader_opts;
loom_loader_opts loom_loader_opts_default(void);

/* Position of the next batch loom_loader_next returns, for checkpoints.
 * global_batch is GB when it was saved: a run resumed with another GB (say
 * another world size at the same batch per rank) continues after the same
 * batch * GB samples of the epoch, which must be a whole number of its own
 * global batches (else LOOM_ERR_MISMATCH). */
typedef struct loom_loader_state {
  int64_t epoch;
  int64_t batch;
  int64_t global_batch;
} loom_loader_state;

typedef struct loom_loader loom_loader;
/* The loader borrows `ds`, which must outlive it. It starts at epoch 0,
 * batch 0. */
loom_status loom_loader_new(loom_loader **out, const loom_dataset *ds,
                            const loom_loader_opts *opts);
/* The next batch, valid until the next call on this loader. Epochs follow
 * each other without end (batch->epoch, batch->index, last_in_epoch tell
 * where it is). batch->wait_s is the time this call blocked. An error in
 * the loader thread is returned here, with its message. */
loom_status loom_loader_next(loom_loader *l, const loom_batch **batch);
/* A NULL l: st zeroed; a NULL st: nothing. */
void loom_loader_get_state(const loom_loader *l, loom_loader_state *st);
/* Continues at `st`: the next batch is exactly the one the saved run would
 * have seen. Batches already returned become invalid. LOOM_ERR_INVALID_ARG
 * (naming the field) for a NULL argument, an epoch outside [0, 2^62), a
 * negative batch or global_batch, or a batch beyond the end of an epoch
 * (batches_per_epoch; with another global_batch GB, ceil(N / GB));
 * LOOM_ERR_MISMATCH when batch * GB is not a whole number of this loader's
 * global batches. */
loom_status loom_loader_set_state(loom_loader *l, const loom_loader_state *st);
/* 0 for a NULL l, as loom_loader_sample, loom_loader_epoch_batches,
 * loom_loader_batch_first, loom_loader_served and loom_loader_wait_total. */
int64_t loom_loader_batches_per_epoch(const loom_loader *l);
/* Continues at sample `sample` of `epoch`: samples of it consumed by all
 * ranks together (as loom_ckpt_data_pos.sample). When that is not a whole
 * number of this loader's global batches (a run resumed with another world
 * size), the rest of that epoch is cut into global batches from there, the
 * last one following the tail rule, so no sample of the epoch is skipped or
 * repeated; later epochs are as usual. LOOM_ERR_INVALID_ARG for a NULL
 * loader, an epoch outside [0, 2^62) or a sample outside [0, N]. */
loom_status loom_loader_seek(loom_loader *l, int64_t epoch, int64_t sample);
/* Samples of its epoch before the next batch (all ranks): what to save. */
int64_t loom_loader_sample(const loom_loader *l);
/* Global batches of `epoch` (batches_per_epoch, except in an epoch a seek
 * entered mid-batch), and where global batch `batch` of it starts in the
 * epoch's order of samples. */
int64_t loom_loader_epoch_batches(const loom_loader *l, int64_t epoch);
int64_t loom_loader_batch_first(const loom_loader *l, int64_t epoch,
                                int64_t batch);
/* Seconds callers of loom_loader_next waited in total, and batches served. */
double loom_loader_wait_total(const loom_loader *l);
int64_t loom_loader_served(const loom_loader *l);
/* Stops the thread and frees the buffers; NULL is a no-op. */
void loom_loader_free(loom_loader *l);

/* --------------------------------------------------------- KJV preparation */

/* The King James Bible as printed by `bible -f -l100000 -m 8192
 * Gen1:1-Rev22:21` (Debian's bible-kjv over bible-kjv-text), one verse per
 * line with the reference ("Ge1:1 ") removed, '\n' after every verse. */
#define LOOM_KJV_VERSES 31102
#define LOOM_KJV_BYTES 4137850
#define LOOM_KJV_CRC32C 0xacd215d7u /* of those bytes (bible-kjv-text 4.38) */
#define LOOM_KJV_PACKAGES "bible-kjv bible-kjv-text"

typedef struct loom_kjv_opts {
  const char *program; /* the bible program (NULL: "bible" on PATH) */
  bool force;          /* regenerate even when a valid cached file exists */
  bool verify;         /* require the known verse count, size and CRC32C
                          (default true) */
} loom_kjv_opts;
loom_kjv_opts loom_kjv_opts_default(void);

typedef struct loom_kjv_info {
  int64_t verses; /* 0 when the cached file was reused */
  int64_t bytes;
  uint32_t crc32c;
  bool cached; /* an existing valid file was reused */
} loom_kjv_info;

/* The data directory: $LOOM_DATA_DIR, else "data" (relative to the working
 * directory). */
loom_status loom_data_dir(char *buf, size_t cap);
/* <data dir>/kjv.txt */
loom_status loom_kjv_default_path(char *buf, size_t cap);
/* Makes sure `path` (NULL: the default path) holds the KJV text: reuses it
 * when its size and CRC32C are the known ones, else runs `bible` and writes
 * it (parent directories created, temporary name renamed into place).
 * LOOM_ERR_IO naming the packages when `bible` or its text is missing. */
loom_status loom_kjv_prepare(const char *path, const loom_kjv_opts *opts,
                             loom_kjv_info *info);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_DATA_H */
