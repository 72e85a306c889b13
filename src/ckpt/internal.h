/* Private to the checkpoint code: the shard file format, its encoders, and
 * the file-system helpers (every write-side call goes through the fault
 * hook of loom_ckpt_fail_io_after; deletion is link-safe, own names only). */
#ifndef LOOM_TRAIN_CKPT_INTERNAL_H
#define LOOM_TRAIN_CKPT_INTERNAL_H

#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "loom/ckpt.h"

/* Shard file, little-endian (docs/checkpoints.md):
 *   header  64 B   "LOOMSHRD", version, rank, world, n_blocks, step,
 *                  index_offset, zeros, crc32c of bytes [0, 60)
 *   blocks         each payload at a 64-byte aligned offset, zero padding
 *   index   80 B   per block: name[32], dtype[8], crc32c, 0, total, begin,
 *                  count, offset
 *   footer  32 B   "LOOMIDX1", index_offset, n_blocks, crc32c of the
 *                  index, 0, crc32c of bytes [0, 28) */
#define CKPT_SHARD_MAGIC "LOOMSHRD"
#define CKPT_FOOTER_MAGIC "LOOMIDX1"
#define CKPT_HEADER_BYTES 64
#define CKPT_ENTRY_BYTES 80
#define CKPT_FOOTER_BYTES 32
#define CKPT_ALIGN 64
#define CKPT_MANIFEST "manifest.json"
#define CKPT_LATEST "latest"
#define CKPT_PATH_MAX 4096
#define CKPT_DEFAULT_BLOCK_BYTES ((size_t)16 << 20)

typedef struct ckpt_header {
  uint32_t version, rank, world, n_blocks;
  int64_t step;
  int64_t index_offset;
} ckpt_header;

typedef struct ckpt_entry {
  char name[LOOM_CKPT_NAME_MAX];
  loom_dtype dtype;
  uint32_t crc;
  int64_t total, begin, count, offset;
} ckpt_entry;

typedef struct ckpt_footer {
  int64_t index_offset;
  uint32_t n_blocks, index_crc;
} ckpt_footer;

void loom_ckpt_header_encode(unsigned char out[CKPT_HEADER_BYTES],
                             const ckpt_header *h);
/* LOOM_ERR_CORRUPT (message without the file name) when damaged. */
loom_status loom_ckpt_header_decode(const unsigned char in[CKPT_HEADER_BYTES],
                                    ckpt_header *h);
void loom_ckpt_entry_encode(unsigned char out[CKPT_ENTRY_BYTES],
                            const ckpt_entry *e);
loom_status loom_ckpt_entry_decode(const unsigned char in[CKPT_ENTRY_BYTES],
                                   ckpt_entry *e);
void loom_ckpt_footer_encode(unsigned char out[CKPT_FOOTER_BYTES],
                             const ckpt_footer *f);
loom_status loom_ckpt_footer_decode(const unsigned char in[CKPT_FOOTER_BYTES],
                                    ckpt_footer *f);

/* A loss scale a manifest may hold: f32's normal range, whose reciprocal
 * the unscaling takes (written and read alike). */
static inline bool ckpt_loss_scale_ok(double s) {
  return s >= FLT_MIN && s <= FLT_MAX;
}

static inline int64_t ckpt_align(int64_t x) {
  return (x + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN;
}

/* A valid buffer name: 1..31 of [A-Za-z0-9._-]. */
bool loom_ckpt_name_ok(const char *name);
/* "step_<digits>" -> step; false for any other name. */
bool loom_ckpt_parse_step_name(const char *name, int64_t *step);

/* ---- file-system calls through the fault hook (errno set on failure) */
/* dirfd/name, created or truncated, never through a link (ELOOP) or into
 * a file with other hard links (EMLINK). */
int loom_ckpt_io_open_write_at(int dirfd, const char *name);
int loom_ckpt_io_pwrite_all(int fd, const void *buf, size_t n, int64_t off);
int loom_ckpt_io_fsync(int fd);
int loom_ckpt_io_close(int fd);
int loom_ckpt_io_mkdir(const char *path);
int loom_ckpt_io_rename(const char *from, const char *to);
/* Swaps two paths atomically (renameat2 RENAME_EXCHANGE). */
int loom_ckpt_io_exchange(const char *a, const char *b);

/* ---- helpers; each records a message naming the path on failure */
loom_status loom_ckpt_mkdirs(const char *path);
loom_status loom_ckpt_fsync_dir(const char *path);
/* Whether `name` is a directory name loom writes in a checkpoint root,
 * exactly: step_NNNNNNNN (*kind 0), .step_NNNNNNNN.tmp (1), .old (2). */
bool loom_ckpt_own_dir_name(const char *name, int64_t *step, int *kind);
/* A temporary of `latest` left by a commit that crashed (another process's
 * .latest.tmp.<pid>, or the .latest.tmp of older versions). */
bool loom_ckpt_stale_latest_tmp(const char *name);
/* Opens the checkpoint root for deletions in it, refusing a root that is a
 * symbolic link (a warning says so); -1 when it cannot be opened. */
int loom_ckpt_open_root(const char *root);
/* Removes ROOT/name, one of loom's step or temporary directories (or a
 * stale temporary of `latest`), and
 * loom's files in it (manifest, its temporary, shards), never following a
 * link; anything else is left in place with a warning naming it, and the
 * directory then stays. */
int loom_ckpt_remove_at(int rootfd, const char *root, const char *name);
/* The same, named `as` (a name under root) in its messages; returns the
 * entries left in place (0: all of it removed). */
int loom_ckpt_remove_as(int rootfd, const char *root, const char *name,
                        const char *as);
void loom_ckpt_remove(const char *root, const char *name);
/* loom_fs_write_atomic through the fault hook: DIR/.NAME.tmp.<pid>, fsync,
 * rename, fsync of DIR. */
loom_status loom_ckpt_write_file_atomic(const char *dir, const char *name,
                                        const void *data, size_t n);
loom_status loom_ckpt_write_file_atomic_at(int dfd, const char *dir,
                                           const char *name, const void *data,
                                           size_t n);
/* Opens a checkpoint file (manifest or shard) for reading; *fd is -1 on an
 * error. Anything but a regular file is refused (LOOM_ERR_CORRUPT, "not a
 * regular file"): the open does not wait for a FIFO's writer. */
loom_status loom_ckpt_open_read(const char *path, int *fd);
/* Reads exactly n bytes at off; LOOM_ERR_CORRUPT on a short file. */
loom_status loom_ckpt_pread_all(int fd, void *buf, size_t n, int64_t off,
                                const char *path);
/* Reads a whole small file (at most max bytes) NUL-terminated. */
loom_status loom_ckpt_read_file(const char *path, size_t max, char **out,
                                size_t *len);

/* Whether s[0..n) is one JSON object (syntax only; allocates nothing). */
bool loom_ckpt_json_object_ok(const char *s, size_t n);

/* cJSON allocates through loom_malloc (set once, process-wide). */
void loom_ckpt_json_init(void);

#endif
