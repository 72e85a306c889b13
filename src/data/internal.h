/* Private to the data layer: the data set object and helpers shared by its
 * files. */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include "loom/data.h"

/* Purposes mixed into the Philox stream ids of the data layer, so the
 * shuffle and the window offsets never share draws with each other or with
 * other layers. Keyed by (seed, purpose, epoch), never by rank. */
#define LOOM_DATA_RNG_SHUFFLE 0x6c6f6f6d53687566ULL /* "loomShuf" */
#define LOOM_DATA_RNG_OFFSET 0x6c6f6f6d4f666673ULL  /* "loomOffs" */

/* A run of tokens in which windows are cut; windows never cross segments. */
typedef struct loom_segment {
  const uint8_t *base; /* (ntok * width) little-endian tokens */
  int width;           /* 1 (text bytes), 2 or 4 */
  int64_t ntok;
  int64_t first; /* index of this segment's first window in the data set */
  int64_t nwin;
} loom_segment;

struct loom_dataset {
  loom_dataset_kind kind;
  char *source;
  int64_t len; /* N */
  int64_t classes;

  /* images */
  int64_t C, H, W;
  uint8_t *pixels; /* (N, C*H*W) raw bytes; owned */
  uint8_t *labels; /* (N); owned */
  float lut[256];  /* byte -> normalised f32 */
  /* loom_dataset_from_arrays: the samples as given, instead of the bytes */
  float *values;    /* (N, C*H*W) f32; owned */
  int32_t *ilabels; /* (N); owned */

  /* tokens */
  int64_t T;
  bool random_offset;
  uint64_t seed;
  int64_t tokens;
  int nseg;
  loom_segment *segs; /* (nseg) */
  uint8_t *text;      /* the whole text file (text sets); owned */
  int nshards;
  loom_shard *shards; /* (nshards) (shard sets); owned */
  char **shard_paths; /* (nshards) the file of each shard; owned */
  size_t held;        /* bytes in memory, counted in LOOM_MEM_DATA */
};

loom_status loom_images_fill(const loom_dataset *ds, const int64_t *idx,
                             int64_t n, loom_batch *b);
loom_status loom_tokens_fill(const loom_dataset *ds, int64_t epoch,
                             const int64_t *idx, int64_t n, loom_batch *b);
/* The window offset of `epoch` for a token set, in [0, T). */
int64_t loom_tokens_epoch_offset(const loom_dataset *ds, int64_t epoch);
/* An epoch entered mid-batch (loom_loader_seek): global batches of GB cut
 * from entry `start` of the epoch list, the last following the tail rule.
 * Their number, and this rank's rows of batch b. */
int64_t loom_sampler_batches_from(const loom_sampler *s, int64_t start);
loom_status loom_sampler_batch_from(const loom_sampler *s, int64_t start,
                                    int64_t b, int64_t *idx, int64_t *count);
/* A copy of s made with loom_malloc (NULL + LOOM_ERR_NOMEM on failure). */
char *loom_data_strdup(const char *s);
/* mkdir -p of the directory part of `path` (nothing when it has none). */
loom_status loom_data_mkdirs_for(const char *path);
/* path's directory made if missing, then loom_fs_write_atomic (a temporary
 * per process: ranks may fill the same cache at once; never written
 * through a symbolic link, never into a device, pipe or directory). */
loom_status loom_data_write_atomic(const char *path, const void *data,
                                   size_t n);
/* The same with the bytes written by fill (loom_fs_write_atomic_with). */
loom_status loom_data_write_atomic_with(const char *path, loom_fs_fill_fn fill,
                                        void *ctx);

#endif /* LOOM_DATA_INTERNAL_H */
