/* Writing checkpoints: each rank's shard file, the manifest and the atomic
 * commit (rename, then `latest`, then pruning), synchronous or on a
 * background thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"

#define JSON_INT_MAX 9007199254740992LL /* 2^53: exact in a JSON number */

typedef struct ckpt_part {
  char name[LOOM_CKPT_NAME_MAX];
  loom_dtype dtype;
  int64_t total, begin, end;
  const void *data; /* element `begin` */
  void *owned;      /* opts.copy: our copy, which data points at */
} ckpt_part;

typedef enum {
  W_OPEN,      /* taking buffers */
  W_STARTED,   /* a background write runs */
  W_WRITTEN,   /* this rank's shard is on disk */
  W_FAILED,    /* the write failed */
  W_COMMITTED, /* manifest written, renamed, latest replaced */
  W_ABORTED
} writer_state;

struct loom_ckpt_writer {
  char root[CKPT_PATH_MAX];
  char tmp[CKPT_PATH_MAX];   /* ROOT/.step_N.tmp */
  char final[CKPT_PATH_MAX]; /* ROOT/step_N */
  /* The temporary directory as made (or found) by writer_new: shards and
   * the manifest go into it through this descriptor, so a link swapped in
   * for its name later never takes them elsewhere. */
  int tmp_fd;
  struct stat tmp_st;
  int64_t step;
  loom_ckpt_writer_opts opts;
  ckpt_part *parts;
  int n_parts, cap_parts;
  bool has_meta;
  loom_ckpt_meta meta; /* its arrays point at the copies below */
  loom_param *views;
  loom_ckpt_rng *rngs;
  char *extra;
  writer_state state;
  pthread_t thread;
  bool thread_live, thread_commit;
  atomic_bool done;
  loom_status bg_status;
  char bg_msg[1024];
};

loom_ckpt_writer_opts loom_ckpt_writer_opts_default(void) {
  loom_ckpt_writer_opts o = {0, 1, 3, false, CKPT_DEFAULT_BLOCK_BYTES};
  return o;
}

loom_ckpt_meta loom_ckpt_meta_default(void) {
  loom_ckpt_meta m;
  memset(&m, 0, sizeof m);
  m.loss_scale = 1.0;
  m.world_size = 1;
  return m;
}

uint64_t loom_ckpt_layout_hash(const loom_param *views, int n_views) {
  uint64_t h = LOOM_HASH64_INIT;
  if (!views)
    n_views = 0; /* the hash of no views */
  for (int i = 0; i < n_views; i++) {
    const loom_param *v = &views[i];
    size_t len = strnlen(v->name, LOOM_PARAM_NAME_MAX);
    h = loom_hash64(h, v->name, len);
    unsigned char buf[8 * (2 + LOOM_MAX_DIMS) + 4];
    size_t o = 0;
    int64_t vals[2 + LOOM_MAX_DIMS] = {v->offset, (int64_t)v->ndim};
    int nd =
        v->ndim < 0 ? 0 : (v->ndim > LOOM_MAX_DIMS ? LOOM_MAX_DIMS : v->ndim);
    for (int d = 0; d < nd; d++)
      vals[2 + d] = v->shape[d];
    for (int k = 0; k < 2 + nd; k++)
      for (int b = 0; b < 8; b++)
        buf[o++] = (unsigned char)((uint64_t)vals[k] >> (8 * b));
    h = loom_hash64(h, buf, o);
  }
  return h;
}

/* ------------------------------------------------------------- the writer */

/* DIR/.step_<step>.<kind> (kind "tmp" or "old") or DIR/shard_<rank>.bin. */
static loom_status step_path(char *buf, size_t n, const char *dir, int64_t step,
                             const char *kind) {
  int w = snprintf(buf, n, "%s/.step_%08lld.%s", dir, (long long)step, kind);
  if (w < 0 || (size_t)w >= n)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", dir);
  return LOOM_OK;
}

static loom_status shard_path(char *buf, size_t n, const char *dir, int rank) {
  int w = snprintf(buf, n, "%s/shard_%05d.bin", dir, rank);
  if (w < 0 || (size_t)w >= n)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", dir);
  return LOOM_OK;
}

loom_status loom_ckpt_writer_new(loom_ckpt_writer **out, const char *root,
                                 int64_t step,
                                 const loom_ckpt_writer_opts *opts) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_new: NULL out");
  *out = NULL;
  loom_ckpt_writer_opts o = opts ? *opts : loom_ckpt_writer_opts_default();
  if (!root || !root[0])
    return loom_error(LOOM_ERR_INVALID_ARG, "checkpoint: no directory given");
  if (step < 0 || step >= JSON_INT_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: step %lld out of "
                      "range",
                      (long long)step);
  if (o.world < 1 || o.world > 1000000 || o.rank < 0 || o.rank >= o.world)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: rank %d of world %d is not valid", o.rank,
                      o.world);
  if (o.keep < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "checkpoint: keep %d < 0", o.keep);
  if (o.block_bytes == 0)
    o.block_bytes = CKPT_DEFAULT_BLOCK_BYTES;
  loom_ckpt_writer *w = loom_calloc(1, sizeof *w);
  if (!w)
    return loom_error_context(LOOM_ERR_NOMEM, "checkpoint writer");
  w->opts = o;
  w->step = step;
  w->tmp_fd = -1;
  size_t rl = strlen(root);
  while (rl > 1 && root[rl - 1] == '/')
    rl--;
  loom_status st = LOOM_OK;
  if (rl >= sizeof w->root) {
    st = loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", root);
    goto fail;
  }
  memcpy(w->root, root, rl);
  w->root[rl] = '\0';
  LOOM_TRY_GOTO(st, step_path(w->tmp, sizeof w->tmp, w->root, step, "tmp"),
                fail);
  LOOM_TRY_GOTO(
      st, loom_ckpt_dir_name(w->root, step, w->final, sizeof w->final), fail);
  LOOM_TRY_GOTO(st, loom_ckpt_mkdirs(w->root), fail);
  if (loom_ckpt_io_mkdir(w->tmp) != 0 && errno != EEXIST) {
    st = loom_error(LOOM_ERR_IO, "%s: cannot create directory: %s", w->tmp,
                    strerror(errno));
    goto fail;
  }
  /* Made by another rank, or by an attempt before: it must be a directory,
   * never a link that would take the shards (and, renamed, the checkpoint)
   * somewhere else. */
  struct stat sb;
  if (lstat(w->tmp, &sb) != 0) {
    st = loom_error(LOOM_ERR_IO, "%s: %s", w->tmp, strerror(errno));
    goto fail;
  }
  if (!S_ISDIR(sb.st_mode)) {
    st = loom_error(
        LOOM_ERR_IO,
        "%s: %s in the place of loom's temporary directory; loom "
        "does not write through it (remove it)",
        w->tmp, S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a directory");
    goto fail;
  }
  w->tmp_fd = loom_fs_open_dir(w->tmp);
  if (w->tmp_fd < 0 || fstat(w->tmp_fd, &w->tmp_st) != 0 ||
      w->tmp_st.st_ino != sb.st_ino || w->tmp_st.st_dev != sb.st_dev) {
    st = loom_error(LOOM_ERR_IO, "%s: changed while being opened (%s)", w->tmp,
                    w->tmp_fd < 0 ? strerror(errno) : "another directory");
    goto fail;
  }
  w->meta = loom_ckpt_meta_default();
  *out = w;
  return LOOM_OK;
fail:
  if (w->tmp_fd >= 0)
    close(w->tmp_fd);
  loom_free(w);
  return st;
}

loom_status loom_ckpt_writer_add(loom_ckpt_writer *w, const char *name,
                                 loom_dtype dtype, int64_t total, int64_t begin,
                                 int64_t end, const void *data) {
  if (!w || !name)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_add: NULL");
  /* thread_live first: the write thread owns `state` while it runs. */
  if (w->thread_live || w->state != W_OPEN)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint %s: buffer '%s' added after the write began",
                      w->final, name);
  if (!loom_ckpt_name_ok(name))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: buffer name '%s' (1 to %d of A-Z a-z 0-9 . "
                      "_ -)",
                      name, LOOM_CKPT_NAME_MAX - 1);
  if ((unsigned)dtype >= LOOM_DTYPE_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: buffer '%s': bad "
                      "dtype",
                      name);
  size_t es = loom_dtype_size(dtype);
  if (total < 0 || begin < 0 || end < begin || end > total ||
      total > INT64_MAX / (int64_t)es || total >= JSON_INT_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: buffer '%s': range [%lld, %lld) of %lld "
                      "elements",
                      name, (long long)begin, (long long)end, (long long)total);
  if (end > begin && !data)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: buffer '%s': NULL "
                      "data",
                      name);
  for (int i = 0; i < w->n_parts; i++)
    if (strcmp(w->parts[i].name, name) == 0)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "checkpoint: buffer '%s' added twice on rank %d", name,
                        w->opts.rank);
  if (w->n_parts == w->cap_parts) {
    int nc = w->cap_parts ? 2 * w->cap_parts : 8;
    ckpt_part *np = loom_malloc((size_t)nc * sizeof *np);
    if (!np)
      return loom_error_context(LOOM_ERR_NOMEM, "checkpoint buffer '%s'", name);
    if (w->parts)
      memcpy(np, w->parts, (size_t)w->n_parts * sizeof *np);
    loom_free(w->parts);
    w->parts = np;
    w->cap_parts = nc;
  }
  ckpt_part *p = &w->parts[w->n_parts];
  memset(p, 0, sizeof *p);
  memcpy(p->name, name, strlen(name) + 1);
  p->dtype = dtype;
  p->total = total;
  p->begin = begin;
  p->end = end;
  p->data = data;
  if (w->opts.copy && end > begin) {
    size_t bytes = (size_t)(end - begin) * es;
    p->owned = loom_malloc(bytes);
    if (!p->owned)
      return loom_error_context(LOOM_ERR_NOMEM, "checkpoint copy of '%s'",
                                name);
    memcpy(p->owned, data, bytes);
    p->data = p->owned;
  }
  w->n_parts++;
  return LOOM_OK;
}

static void meta_release(loom_ckpt_writer *w) {
  loom_free(w->views);
  loom_free(w->rngs);
  loom_free(w->extra);
  w->views = NULL;
  w->rngs = NULL;
  w->extra = NULL;
}

loom_status loom_ckpt_writer_set_meta(loom_ckpt_writer *w,
                                      const loom_ckpt_meta *meta) {
  if (!w || !meta)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_set_meta: NULL");
  if (w->thread_live)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint %s: meta set while the write runs", w->final);
  if (meta->n_views < 0 || (meta->n_views && !meta->views) ||
      meta->n_rngs < 0 || (meta->n_rngs && !meta->rngs))
    return loom_error(LOOM_ERR_INVALID_ARG, "checkpoint meta: bad arrays");
  if (!isfinite(meta->lr) || !ckpt_loss_scale_ok(meta->loss_scale))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint meta: lr must be finite and loss_scale in "
                      "f32's normal range (lr %g, loss_scale %g)",
                      meta->lr, meta->loss_scale);
  if (meta->optimizer_step < 0 || meta->optimizer_step >= JSON_INT_MAX ||
      meta->schedule_step < 0 || meta->schedule_step >= JSON_INT_MAX ||
      meta->data.epoch < 0 || meta->data.epoch >= JSON_INT_MAX ||
      meta->data.batch < 0 || meta->data.batch >= JSON_INT_MAX ||
      meta->data.sample < 0 || meta->data.sample >= JSON_INT_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint meta: a step or data position is negative "
                      "or above 2^53");
  if (meta->strategy[0] &&
      (!memchr(meta->strategy, '\0', LOOM_CKPT_NAME_MAX) ||
       loom_ckpt_strategy_parse(meta->strategy, NULL) != LOOM_OK))
    return loom_error_context(LOOM_ERR_INVALID_ARG, "checkpoint meta");
  for (int i = 0; i < meta->n_views; i++) {
    const loom_param *v = &meta->views[i];
    if (v->ndim < 0 || v->ndim > LOOM_MAX_DIMS || v->offset < 0 ||
        v->numel < 0 || v->offset >= JSON_INT_MAX || v->numel >= JSON_INT_MAX ||
        !memchr(v->name, '\0', LOOM_PARAM_NAME_MAX))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "checkpoint meta: view %d is not "
                        "valid",
                        i);
  }
  if (meta->extra_json &&
      !loom_ckpt_json_object_ok(meta->extra_json, strlen(meta->extra_json)))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint meta: extra_json is not a JSON object");
  meta_release(w);
  loom_ckpt_meta m = *meta;
  m.strategy[LOOM_CKPT_NAME_MAX - 1] = '\0';
  m.optimizer[LOOM_CKPT_NAME_MAX - 1] = '\0';
  m.schedule[LOOM_CKPT_NAME_MAX - 1] = '\0';
  if (m.n_views) {
    w->views = loom_malloc((size_t)m.n_views * sizeof *w->views);
    if (!w->views)
      goto nomem;
    memcpy(w->views, m.views, (size_t)m.n_views * sizeof *w->views);
  }
  if (m.n_rngs) {
    w->rngs = loom_malloc((size_t)m.n_rngs * sizeof *w->rngs);
    if (!w->rngs)
      goto nomem;
    memcpy(w->rngs, m.rngs, (size_t)m.n_rngs * sizeof *w->rngs);
    for (int i = 0; i < m.n_rngs; i++)
      w->rngs[i].name[LOOM_CKPT_NAME_MAX - 1] = '\0';
  }
  if (m.extra_json) {
    size_t n = strlen(m.extra_json);
    w->extra = loom_malloc(n + 1);
    if (!w->extra)
      goto nomem;
    memcpy(w->extra, m.extra_json, n + 1);
  }
  m.views = w->views;
  m.rngs = w->rngs;
  m.extra_json = w->extra;
  if (m.layout_hash == 0)
    m.layout_hash = loom_ckpt_layout_hash(m.views, m.n_views);
  w->meta = m;
  w->has_meta = true;
  return LOOM_OK;
nomem:
  meta_release(w);
  w->has_meta = false;
  return loom_error_context(LOOM_ERR_NOMEM, "checkpoint meta");
}

const char *loom_ckpt_writer_path(const loom_ckpt_writer *w) {
  return w ? w->final : "";
}

/* ------------------------------------------------------ the shard file */

/* Elements of one block of a part: block_bytes worth, at least one. */
static int64_t part_block_elems(const loom_ckpt_writer *w, const ckpt_part *p) {
  int64_t per = (int64_t)(w->opts.block_bytes / loom_dtype_size(p->dtype));
  return per < 1 ? 1 : per;
}

/* Blocks of the shard: each part cut into blocks; an empty range still
 * gets an entry, so that the buffer exists. */
static int64_t count_blocks(const loom_ckpt_writer *w) {
  int64_t n_blocks = 0;
  for (int i = 0; i < w->n_parts; i++) {
    const ckpt_part *p = &w->parts[i];
    const int64_t per = part_block_elems(w, p);
    n_blocks += p->end > p->begin ? (p->end - p->begin + per - 1) / per : 1;
  }
  return n_blocks;
}

/* The layout: each block's entry (name, range, aligned offset) and where
 * its bytes come from, so every offset is known before a byte is written.
 * Returns the end of the last payload. */
static int64_t lay_out(const loom_ckpt_writer *w, ckpt_entry *ents,
                       const void **src) {
  int64_t pos = CKPT_HEADER_BYTES, k = 0;
  for (int i = 0; i < w->n_parts; i++) {
    const ckpt_part *p = &w->parts[i];
    const int64_t es = (int64_t)loom_dtype_size(p->dtype);
    const int64_t per = part_block_elems(w, p);
    if (p->end == p->begin) {
      ckpt_entry *e = &ents[k];
      memcpy(e->name, p->name, sizeof e->name);
      e->dtype = p->dtype;
      e->total = p->total;
      e->begin = p->begin;
      e->offset = ckpt_align(pos);
      src[k++] = p->data;
      continue;
    }
    for (int64_t b = p->begin; b < p->end; b += per, k++) {
      ckpt_entry *e = &ents[k];
      memcpy(e->name, p->name, sizeof e->name);
      e->dtype = p->dtype;
      e->total = p->total;
      e->begin = b;
      e->count = p->end - b < per ? p->end - b : per;
      e->offset = ckpt_align(pos);
      pos = e->offset + e->count * es;
      src[k] = (const char *)p->data + (size_t)(b - p->begin) * (size_t)es;
    }
  }
  return pos;
}

static loom_status write_shard(loom_ckpt_writer *w) {
  char path[CKPT_PATH_MAX];
  LOOM_TRY(shard_path(path, sizeof path, w->tmp, w->opts.rank));
  const int64_t n_blocks = count_blocks(w);
  if (n_blocks > 100000000)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "%s: %lld blocks; raise block_bytes", path,
                      (long long)n_blocks);
  ckpt_entry *ents = loom_calloc((size_t)n_blocks + 1, sizeof *ents);
  const void **src = loom_calloc((size_t)n_blocks + 1, sizeof *src);
  size_t index_bytes = (size_t)n_blocks * CKPT_ENTRY_BYTES + CKPT_FOOTER_BYTES;
  unsigned char *index = loom_malloc(index_bytes);
  loom_status st = LOOM_OK;
  int fd = -1;
  if (!ents || !src || !index) {
    st = loom_error_context(LOOM_ERR_NOMEM, "%s", path);
    goto done;
  }
  const int64_t pos = lay_out(w, ents, src);
  ckpt_header h = {LOOM_CKPT_FORMAT_VERSION,
                   (uint32_t)w->opts.rank,
                   (uint32_t)w->opts.world,
                   (uint32_t)n_blocks,
                   w->step,
                   ckpt_align(pos)};
  unsigned char head[CKPT_HEADER_BYTES];
  loom_ckpt_header_encode(head, &h);

  const char *what = "create";
  int err = 0;
  const char *fname = strrchr(path, '/') + 1;
  fd = loom_ckpt_io_open_write_at(w->tmp_fd, fname);
  if (fd < 0)
    goto io_fail;
  what = "write";
  if (loom_ckpt_io_pwrite_all(fd, head, sizeof head, 0) != 0)
    goto io_fail;
  /* Payloads go straight from the caller's buffers; padding between them
   * is left as holes, which read as zeros. */
  for (int64_t i = 0; i < n_blocks; i++) {
    ckpt_entry *e = &ents[i];
    size_t bytes = (size_t)e->count * loom_dtype_size(e->dtype);
    e->crc = loom_crc32c(0, src[i], bytes);
    if (loom_ckpt_io_pwrite_all(fd, src[i], bytes, e->offset) != 0)
      goto io_fail;
  }
  for (int64_t i = 0; i < n_blocks; i++)
    loom_ckpt_entry_encode(index + i * CKPT_ENTRY_BYTES, &ents[i]);
  ckpt_footer f = {h.index_offset, (uint32_t)n_blocks,
                   loom_crc32c(0, index, (size_t)n_blocks * CKPT_ENTRY_BYTES)};
  loom_ckpt_footer_encode(index + n_blocks * CKPT_ENTRY_BYTES, &f);
  if (loom_ckpt_io_pwrite_all(fd, index, index_bytes, h.index_offset) != 0)
    goto io_fail;
  what = "fsync";
  if (loom_ckpt_io_fsync(fd) != 0)
    goto io_fail;
  what = "close";
  {
    int c = fd;
    fd = -1;
    if (loom_ckpt_io_close(c) != 0)
      goto io_fail;
  }
  goto done;
io_fail:
  err = errno;
  if (fd >= 0)
    close(fd);
  /* Only a file this call opened: a link or another's file that refused the
   * open stays as it was. */
  if (strcmp(what, "create") != 0)
    loom_fs_discard(w->tmp_fd, fname);
  st = loom_error(LOOM_ERR_IO, "%s: %s failed: %s", path, what,
                  loom_fs_strerror(err));
done:
  loom_free(ents);
  loom_free(src);
  loom_free(index);
  return st;
}

loom_status loom_ckpt_writer_write(loom_ckpt_writer *w) {
  if (!w)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_write: NULL");
  if (w->thread_live || w->state != W_OPEN)
    return loom_error(LOOM_ERR_INVALID_ARG, "checkpoint %s: written twice",
                      w->final);
  loom_status st = write_shard(w);
  w->state = st == LOOM_OK ? W_WRITTEN : W_FAILED;
  return st;
}

/* --------------------------------------------------------------- commit */

typedef struct shard_summary {
  int64_t bytes;
  uint32_t index_crc;
  uint32_t n;
  ckpt_entry *ents;
} shard_summary;

/* Reads back header, footer and index of one rank's shard. */
static loom_status read_summary(const loom_ckpt_writer *w, int rank,
                                shard_summary *s) {
  char path[CKPT_PATH_MAX];
  LOOM_TRY(shard_path(path, sizeof path, w->tmp, rank));
  /* A FIFO in its place must not hold the commit (never blocks). */
  int fd = loom_fs_open_read_at(w->tmp_fd, strrchr(path, '/') + 1, O_NOFOLLOW,
                                &s->bytes);
  if (fd < 0 && errno == LOOM_FS_ENOTREG)
    return loom_error(LOOM_ERR_CORRUPT, "%s: not a regular file", path);
  if (fd < 0)
    return loom_error(
        LOOM_ERR_IO, "%s: %s (did rank %d write its shard?)", path,
        errno == ELOOP ? "a symbolic link, not followed" : strerror(errno),
        rank);
  loom_status st = LOOM_OK;
  unsigned char head[CKPT_HEADER_BYTES], foot[CKPT_FOOTER_BYTES];
  unsigned char *index = NULL;
  ckpt_header h;
  ckpt_footer f;
  if (s->bytes < CKPT_HEADER_BYTES + CKPT_FOOTER_BYTES) {
    st = loom_error(LOOM_ERR_CORRUPT, "%s: truncated (%lld bytes)", path,
                    (long long)s->bytes);
    goto done;
  }
  LOOM_TRY_GOTO(st, loom_ckpt_pread_all(fd, head, sizeof head, 0, path), done);
  LOOM_TRY_GOTO(st,
                loom_ckpt_pread_all(fd, foot, sizeof foot,
                                    s->bytes - CKPT_FOOTER_BYTES, path),
                done);
  if ((st = loom_ckpt_header_decode(head, &h)) != LOOM_OK ||
      (st = loom_ckpt_footer_decode(foot, &f)) != LOOM_OK) {
    loom_error_context(st, "%s", path);
    goto done;
  }
  if ((int)h.rank != rank || (int)h.world != w->opts.world ||
      h.step != w->step) {
    st = loom_error(LOOM_ERR_MISMATCH,
                    "%s: written by rank %u of %u for step %lld, expected "
                    "rank %d of %d for step %lld (a stale file?)",
                    path, h.rank, h.world, (long long)h.step, rank,
                    w->opts.world, (long long)w->step);
    goto done;
  }
  if (f.n_blocks != h.n_blocks || f.index_offset != h.index_offset ||
      f.index_offset + (int64_t)f.n_blocks * CKPT_ENTRY_BYTES +
              CKPT_FOOTER_BYTES !=
          s->bytes) {
    st = loom_error(LOOM_ERR_CORRUPT, "%s: index does not match the file size",
                    path);
    goto done;
  }
  size_t ib = (size_t)f.n_blocks * CKPT_ENTRY_BYTES;
  index = loom_malloc(ib + 1);
  s->ents = loom_calloc((size_t)f.n_blocks + 1, sizeof *s->ents);
  if (!index || !s->ents) {
    st = loom_error_context(LOOM_ERR_NOMEM, "%s", path);
    goto done;
  }
  LOOM_TRY_GOTO(st, loom_ckpt_pread_all(fd, index, ib, f.index_offset, path),
                done);
  if (loom_crc32c(0, index, ib) != f.index_crc) {
    st =
        loom_error(LOOM_ERR_CORRUPT, "%s: block index checksum mismatch", path);
    goto done;
  }
  for (uint32_t i = 0; i < f.n_blocks; i++) {
    if ((st = loom_ckpt_entry_decode(index + (size_t)i * CKPT_ENTRY_BYTES,
                                     &s->ents[i])) != LOOM_OK) {
      loom_error_context(st, "%s", path);
      goto done;
    }
  }
  s->n = f.n_blocks;
  s->index_crc = f.index_crc;
done:
  loom_free(index);
  close(fd);
  return st;
}

/* One rank's part of one buffer in the manifest. */
typedef struct shard_ref {
  int rank;
  int64_t begin, end;
  uint32_t first, n; /* entries of that rank's summary */
} shard_ref;

static int cmp_ref(const void *a, const void *b) {
  const shard_ref *x = a, *y = b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

static bool add_i64(cJSON *o, const char *k, int64_t v) {
  return cJSON_AddNumberToObject(o, k, (double)v) != NULL;
}

static bool add_hex64(cJSON *o, const char *k, uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "0x%016llx", (unsigned long long)v);
  return cJSON_AddStringToObject(o, k, b) != NULL;
}

static bool add_hex32(cJSON *o, const char *k, uint32_t v) {
  char b[16];
  snprintf(b, sizeof b, "0x%08x", v);
  return cJSON_AddStringToObject(o, k, b) != NULL;
}

/* One buffer of the manifest from every rank's blocks, checked: the ranks'
 * ranges must tile [0, total) exactly, with one dtype and one size. */
static loom_status add_buffer(const loom_ckpt_writer *w, cJSON *arr,
                              const shard_summary *sums, const ckpt_entry *e0,
                              int r0, shard_ref *refs) {
  int W = w->opts.world, nref = 0;
  for (int q = 0; q < W; q++) {
    uint32_t first = UINT32_MAX, n = 0;
    for (uint32_t j = 0; j < sums[q].n; j++) {
      const ckpt_entry *e = &sums[q].ents[j];
      if (strcmp(e->name, e0->name) != 0)
        continue;
      if (e->dtype != e0->dtype || e->total != e0->total)
        return loom_error(LOOM_ERR_MISMATCH,
                          "checkpoint %s: buffer '%s' is %s x %lld on rank %d "
                          "but %s x %lld on rank %d",
                          w->final, e0->name, loom_dtype_name(e0->dtype),
                          (long long)e0->total, r0, loom_dtype_name(e->dtype),
                          (long long)e->total, q);
      if (e->count == 0)
        continue; /* an empty range: the buffer exists, nothing to tile */
      if (first == UINT32_MAX)
        first = j;
      else if (j != first + n || e->begin != sums[q].ents[j - 1].begin +
                                                 sums[q].ents[j - 1].count)
        return loom_error(LOOM_ERR_CORRUPT,
                          "checkpoint %s: rank %d's blocks of '%s' are not "
                          "contiguous",
                          w->final, q, e0->name);
      n++;
    }
    if (n > 0) {
      const ckpt_entry *a = &sums[q].ents[first];
      const ckpt_entry *z = &sums[q].ents[first + n - 1];
      refs[nref++] = (shard_ref){q, a->begin, z->begin + z->count, first, n};
    }
  }
  qsort(refs, (size_t)nref, sizeof *refs, cmp_ref);
  int64_t at = 0;
  for (int k = 0; k < nref; k++) {
    if (refs[k].begin < at)
      return loom_error(LOOM_ERR_MISMATCH,
                        "checkpoint %s: buffer '%s': elements [%lld, %lld) are "
                        "in two shards (ranks overlap)",
                        w->final, e0->name, (long long)refs[k].begin,
                        (long long)at);
    if (refs[k].begin > at)
      break;
    at = refs[k].end;
  }
  if (at != e0->total) {
    int64_t to = e0->total;
    for (int k = 0; k < nref; k++)
      if (refs[k].begin > at && refs[k].begin < to)
        to = refs[k].begin;
    return loom_error(LOOM_ERR_MISMATCH,
                      "checkpoint %s: buffer '%s': elements [%lld, %lld) are "
                      "in no shard",
                      w->final, e0->name, (long long)at, (long long)to);
  }
  bool ok;
  cJSON *b = cJSON_CreateObject();
  ok = b && cJSON_AddItemToArray(arr, b);
  ok = ok && cJSON_AddStringToObject(b, "name", e0->name);
  ok = ok && cJSON_AddStringToObject(b, "dtype", loom_dtype_name(e0->dtype));
  ok = ok && add_i64(b, "count", e0->total);
  cJSON *sh = ok ? cJSON_AddArrayToObject(b, "shards") : NULL;
  ok = ok && sh;
  for (int k = 0; k < nref && ok; k++) {
    char file[32];
    snprintf(file, sizeof file, "shard_%05d.bin", refs[k].rank);
    cJSON *s = cJSON_CreateObject();
    ok = s && cJSON_AddItemToArray(sh, s);
    ok = ok && add_i64(s, "rank", refs[k].rank);
    ok = ok && cJSON_AddStringToObject(s, "file", file);
    ok = ok && add_i64(s, "begin", refs[k].begin);
    ok = ok && add_i64(s, "end", refs[k].end);
    cJSON *bl = ok ? cJSON_AddArrayToObject(s, "blocks") : NULL;
    ok = ok && bl;
    for (uint32_t j = 0; j < refs[k].n && ok; j++) {
      const ckpt_entry *e = &sums[refs[k].rank].ents[refs[k].first + j];
      cJSON *x = cJSON_CreateObject();
      ok = x && cJSON_AddItemToArray(bl, x);
      ok = ok && add_i64(x, "begin", e->begin);
      ok = ok && add_i64(x, "count", e->count);
      ok = ok && add_i64(x, "offset", e->offset);
      ok = ok && add_hex32(x, "crc32c", e->crc);
    }
  }
  return ok ? LOOM_OK : LOOM_ERR_NOMEM;
}

/* The manifest's buffers, in the order rank 0 (then 1, ...) added them. */
static loom_status add_buffers(const loom_ckpt_writer *w, cJSON *root,
                               const shard_summary *sums) {
  int W = w->opts.world;
  cJSON *arr = cJSON_AddArrayToObject(root, "buffers");
  if (!arr)
    return LOOM_ERR_NOMEM;
  /* Unique names: few (params, grads, optimizer states), so a list. */
  int cap = 16, nu = 0;
  const ckpt_entry **uniq =
      loom_malloc((size_t)cap * sizeof(const ckpt_entry *));
  int *owner = loom_malloc((size_t)cap * sizeof *owner);
  shard_ref *refs = loom_calloc((size_t)W, sizeof *refs);
  loom_status st = LOOM_OK;
  if (!uniq || !owner || !refs) {
    st = LOOM_ERR_NOMEM;
    goto done;
  }
  for (int r = 0; r < W; r++) {
    for (uint32_t i = 0; i < sums[r].n; i++) {
      const ckpt_entry *e = &sums[r].ents[i];
      int k = 0;
      while (k < nu && strcmp(uniq[k]->name, e->name) != 0)
        k++;
      if (k < nu)
        continue;
      if (nu == cap) {
        const ckpt_entry **nu2 =
            loom_malloc((size_t)cap * 2 * sizeof(const ckpt_entry *));
        int *no2 = loom_malloc((size_t)cap * 2 * sizeof *no2);
        if (!nu2 || !no2) {
          loom_free(nu2);
          loom_free(no2);
          st = LOOM_ERR_NOMEM;
          goto done;
        }
        memcpy(nu2, uniq, (size_t)nu * sizeof(const ckpt_entry *));
        memcpy(no2, owner, (size_t)nu * sizeof *no2);
        loom_free(uniq);
        loom_free(owner);
        uniq = nu2;
        owner = no2;
        cap *= 2;
      }
      uniq[nu] = e;
      owner[nu++] = r;
    }
  }
  for (int k = 0; k < nu && st == LOOM_OK; k++)
    st = add_buffer(w, arr, sums, uniq[k], owner[k], refs);
done:
  loom_free(uniq);
  loom_free(owner);
  loom_free(refs);
  return st;
}

/* The manifest's header: format, versions, step, world, hashes, optimizer,
 * schedule, loss scale and data position. */
static bool add_header(const loom_ckpt_writer *w, cJSON *root) {
  const loom_ckpt_meta *m = &w->meta;
  char created[32] = "";
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm))
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  bool ok = cJSON_AddStringToObject(root, "format", "loom-checkpoint");
  ok = ok && add_i64(root, "version", LOOM_CKPT_FORMAT_VERSION);
  ok = ok && cJSON_AddStringToObject(root, "loom_version", loom_version());
  ok = ok && cJSON_AddStringToObject(root, "created", created);
  ok = ok && add_i64(root, "step", w->step);
  ok = ok && add_i64(root, "world_size", w->opts.world);
  ok = ok && cJSON_AddStringToObject(root, "strategy", m->strategy);
  ok = ok && add_hex64(root, "config_hash", m->config_hash);
  ok = ok && add_hex64(root, "layout_hash", m->layout_hash);
  cJSON *o = ok ? cJSON_AddObjectToObject(root, "optimizer") : NULL;
  ok = ok && o && cJSON_AddStringToObject(o, "name", m->optimizer) &&
       add_i64(o, "step", m->optimizer_step);
  o = ok ? cJSON_AddObjectToObject(root, "schedule") : NULL;
  ok = ok && o && cJSON_AddStringToObject(o, "name", m->schedule) &&
       add_i64(o, "step", m->schedule_step) &&
       cJSON_AddNumberToObject(o, "lr", m->lr);
  ok = ok && cJSON_AddNumberToObject(root, "loss_scale", m->loss_scale);
  o = ok ? cJSON_AddObjectToObject(root, "data") : NULL;
  return ok && o && add_i64(o, "epoch", m->data.epoch) &&
         add_i64(o, "batch", m->data.batch) &&
         add_i64(o, "sample", m->data.sample);
}

/* "rng": each stream's name, seed, stream and counter. */
static bool add_rngs(const loom_ckpt_meta *m, cJSON *root) {
  cJSON *a = cJSON_AddArrayToObject(root, "rng");
  bool ok = a != NULL;
  for (int i = 0; ok && i < m->n_rngs; i++) {
    cJSON *x = cJSON_CreateObject();
    ok = x && cJSON_AddItemToArray(a, x);
    ok = ok && cJSON_AddStringToObject(x, "name", m->rngs[i].name) &&
         add_hex64(x, "seed", m->rngs[i].state.seed) &&
         add_hex64(x, "stream", m->rngs[i].state.stream) &&
         add_hex64(x, "counter", m->rngs[i].state.counter);
  }
  return ok;
}

/* "views": name, offset, numel, shape and decay of every parameter. */
static bool add_views(const loom_ckpt_meta *m, cJSON *root) {
  cJSON *a = cJSON_AddArrayToObject(root, "views");
  bool ok = a != NULL;
  for (int i = 0; ok && i < m->n_views; i++) {
    const loom_param *v = &m->views[i];
    cJSON *x = cJSON_CreateObject();
    ok = x && cJSON_AddItemToArray(a, x);
    ok = ok && cJSON_AddStringToObject(x, "name", v->name) &&
         add_i64(x, "offset", v->offset) && add_i64(x, "numel", v->numel);
    cJSON *shape = ok ? cJSON_AddArrayToObject(x, "shape") : NULL;
    ok = ok && shape;
    for (int d = 0; ok && d < v->ndim; d++) {
      cJSON *n = cJSON_CreateNumber((double)v->shape[d]);
      ok = n && cJSON_AddItemToArray(shape, n);
    }
    ok = ok && cJSON_AddBoolToObject(x, "decay", v->decay);
  }
  return ok;
}

/* "files": each rank's shard with its size, block count and index CRC. */
static bool add_files(const loom_ckpt_writer *w, const shard_summary *sums,
                      cJSON *root) {
  cJSON *a = cJSON_AddArrayToObject(root, "files");
  bool ok = a != NULL;
  for (int r = 0; ok && r < w->opts.world; r++) {
    char file[32];
    snprintf(file, sizeof file, "shard_%05d.bin", r);
    cJSON *x = cJSON_CreateObject();
    ok = x && cJSON_AddItemToArray(a, x);
    ok = ok && cJSON_AddStringToObject(x, "name", file) &&
         add_i64(x, "rank", r) && add_i64(x, "bytes", sums[r].bytes) &&
         add_i64(x, "blocks", sums[r].n) &&
         add_hex32(x, "index_crc32c", sums[r].index_crc);
  }
  return ok;
}

/* The manifest checks itself: its last member is the CRC32C of the whole
 * text with that member's 8 hex digits read as zeros. Takes `text` (cJSON's
 * printout) and returns the sealed copy in *out. */
static loom_status seal_manifest(const loom_ckpt_writer *w, char *text,
                                 char **out) {
  size_t n = strlen(text);
  while (n > 0 && text[n - 1] != '}')
    n--;
  if (n > 0)
    n--; /* drop the closing brace */
  while (n > 0 &&
         (text[n - 1] == '\n' || text[n - 1] == ' ' || text[n - 1] == '\t'))
    n--;
  static const char tail[] = ",\n\t\"manifest_crc32c\":\t\"0x00000000\"\n}\n";
  char *full = loom_malloc(n + sizeof tail);
  if (!full) {
    cJSON_free(text);
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory building the manifest",
                      w->final);
  }
  memcpy(full, text, n);
  memcpy(full + n, tail, sizeof tail);
  cJSON_free(text);
  size_t len = n + sizeof tail - 1;
  uint32_t crc = loom_crc32c(0, full, len);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", crc);
  memcpy(full + len - 12, hex, 8); /* the digits before "\"\n}\n" */
  *out = full;
  return LOOM_OK;
}

static loom_status build_manifest(const loom_ckpt_writer *w,
                                  const shard_summary *sums, char **out) {
  loom_ckpt_json_init();
  cJSON *root = cJSON_CreateObject();
  bool ok = root && add_header(w, root) && add_rngs(&w->meta, root) &&
            add_views(&w->meta, root);
  loom_status st = LOOM_OK;
  if (ok) {
    st = add_buffers(w, root, sums);
    ok = st == LOOM_OK;
  }
  ok = ok && add_files(w, sums, root);
  if (ok) {
    cJSON *extra = cJSON_Parse(w->extra ? w->extra : "{}");
    ok = extra && cJSON_AddItemToObject(root, "extra", extra);
    if (extra && !ok)
      cJSON_Delete(extra);
  }
  char *text = ok ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) {
    if (st != LOOM_OK && st != LOOM_ERR_NOMEM)
      return st;
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory building the manifest",
                      w->final);
  }
  return seal_manifest(w, text, out);
}

/* The rank of a file named shard_NNNNN.bin (5 digits or more), or -1. */
static int shard_rank_of(const char *name) {
  size_t n = strlen(name);
  if (n < 15 || n > 19 || strncmp(name, "shard_", 6) != 0 ||
      strcmp(name + n - 4, ".bin") != 0)
    return -1;
  int r = 0;
  for (size_t i = 6; i < n - 4; i++) {
    if (name[i] < '0' || name[i] > '9')
      return -1;
    r = r * 10 + (name[i] - '0');
  }
  return r;
}

/* What tidy_tmp may remove: a shard or a manifest temporary, a file. */
static bool tmp_own(const char *name, bool is_dir, int depth, void *ctx) {
  (void)ctx;
  return depth == 0 && !is_dir &&
         (shard_rank_of(name) >= 0 || strncmp(name, "." CKPT_MANIFEST ".tmp",
                                              sizeof CKPT_MANIFEST + 4) == 0);
}

static bool tidy_entry(const char *name, void *ctx) {
  const loom_ckpt_writer *w = ctx;
  int r = shard_rank_of(name);
  if (strcmp(name, CKPT_MANIFEST) == 0 || (r >= 0 && r < w->opts.world))
    return true; /* part of the checkpoint */
  char shown[CKPT_PATH_MAX];
  int k = snprintf(shown, sizeof shown, "%s/%s", w->tmp, name);
  loom_fs_remove_own(w->tmp_fd, name,
                     k > 0 && (size_t)k < sizeof shown ? shown : name, tmp_own,
                     NULL, NULL);
  return true;
}

/* Removes what is not part of the checkpoint from the temporary directory
 * (say, shards of ranks beyond the world size from an abandoned attempt, or
 * a manifest temporary of a crashed commit): loom's own names only, never
 * through a link; anything else stays and is reported. */
static void tidy_tmp(const loom_ckpt_writer *w) {
  loom_fs_each_entry(w->tmp_fd, ".", false, tidy_entry, (void *)w);
}

typedef struct step_ent {
  int64_t step;
  char name[64];
} step_ent;

static int cmp_step_ent(const void *a, const void *b) {
  int64_t x = ((const step_ent *)a)->step, y = ((const step_ent *)b)->step;
  return (x > y) - (x < y);
}

/* The entries prune looks at: step directories, and the temporaries (of
 * steps up to this one, and of `latest`) that may go. */
typedef struct prune_scan {
  const loom_ckpt_writer *w;
  step_ent *steps, *tmps;
  int n, cap, nt, capt;
} prune_scan;

static bool prune_entry(const char *name, void *ctx) {
  prune_scan *ps = ctx;
  int64_t s;
  int kind = 0;
  step_ent **v;
  int *cnt, *cp;
  if (loom_ckpt_parse_step_name(name, &s)) {
    /* Every step_N counts towards `keep`, as loading sees them all; one
     * that is not loom's is reported when its turn to go comes. */
    v = &ps->steps, cnt = &ps->n, cp = &ps->cap;
  } else if (loom_ckpt_own_dir_name(name, &s, &kind) && kind > 0) {
    if (s > ps->w->step || (s == ps->w->step && kind == 1))
      return true;
    v = &ps->tmps, cnt = &ps->nt, cp = &ps->capt;
  } else if (loom_ckpt_stale_latest_tmp(name)) {
    s = 0;
    v = &ps->tmps, cnt = &ps->nt, cp = &ps->capt;
  } else {
    return true;
  }
  if (strlen(name) >= sizeof ps->steps[0].name)
    return true;
  if (*cnt == *cp) {
    int nc = *cp ? *cp * 2 : 16;
    step_ent *nv = loom_malloc((size_t)nc * sizeof *nv);
    if (!nv)
      return false;
    if (*v)
      memcpy(nv, *v, (size_t)*cnt * sizeof *nv);
    loom_free(*v);
    *v = nv;
    *cp = nc;
  }
  (*v)[*cnt].step = s;
  snprintf((*v)[*cnt].name, sizeof(*v)[*cnt].name, "%s", name);
  (*cnt)++;
  return true;
}

/* Deletes one old checkpoint: a directory is first renamed to its hidden
 * .step_N.old (one step), then removed, so a process killed in the middle
 * leaves a name that loading and `loom ckpt verify` pass over and the next
 * prune removes, not a step_N without its manifest that verify calls
 * damaged. Anything else there (a link, a file) goes to the remover, which
 * reports it and keeps it. */
static void prune_step(int rootfd, const char *root, const step_ent *e) {
  char old[64];
  struct stat sb;
  snprintf(old, sizeof old, ".step_%08lld.old", (long long)e->step);
  int kind = -1;
  /* Only loom's own spelling is moved: renamed, a directory of another
   * spelling (step_6) would take a name of loom's and lose its guard. */
  if (!loom_ckpt_own_dir_name(e->name, NULL, &kind) || kind != 0 ||
      fstatat(rootfd, e->name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISDIR(sb.st_mode)) {
    loom_ckpt_remove_at(rootfd, root, e->name);
    return;
  }
  loom_ckpt_remove_at(rootfd, root, old); /* an earlier one, killed */
  if (renameat(rootfd, e->name, rootfd, old) != 0) {
    loom_ckpt_remove_at(rootfd, root, e->name);
    return;
  }
  /* Something in it that is not loom's is reported and the whole directory
   * kept: under its own name again, as it was. */
  if (loom_ckpt_remove_as(rootfd, root, old, e->name) > 0 &&
      fstatat(rootfd, e->name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
    (void)renameat(rootfd, old, rootfd, e->name);
}

/* Deletes checkpoints older than the K - 1 newest before `step`, the
 * temporary directories of earlier steps and stale temporaries of
 * `latest`, through one descriptor of the root: never a link, never
 * outside it, only loom's names (what else is there is reported and kept).
 * Failures only warn: the new checkpoint is committed already. */
static void prune(const loom_ckpt_writer *w) {
  int rootfd = loom_ckpt_open_root(w->root);
  if (rootfd < 0)
    return;
  prune_scan ps = {.w = w};
  if (loom_fs_each_entry(rootfd, ".", false, prune_entry, &ps) == 0 &&
      w->opts.keep > 0 && ps.n > 0) {
    qsort(ps.steps, (size_t)ps.n, sizeof *ps.steps, cmp_step_ent);
    int older = 0;
    for (int i = ps.n - 1; i >= 0; i--) {
      if (ps.steps[i].step >= w->step)
        continue;
      if (++older < w->opts.keep)
        continue;
      prune_step(rootfd, w->root, &ps.steps[i]);
    }
  }
  for (int i = 0; i < ps.nt; i++)
    loom_ckpt_remove_at(rootfd, w->root, ps.tmps[i].name);
  loom_free(ps.steps);
  loom_free(ps.tmps);
  close(rootfd);
}

static loom_status commit_impl(loom_ckpt_writer *w) {
  int W = w->opts.world;
  shard_summary *sums = loom_calloc((size_t)W, sizeof *sums);
  char *manifest = NULL;
  loom_status st = LOOM_OK;
  if (!sums)
    return loom_error_context(LOOM_ERR_NOMEM, "checkpoint %s", w->final);
  for (int r = 0; r < W; r++)
    LOOM_TRY_GOTO(st, read_summary(w, r, &sums[r]), done);
  LOOM_TRY_GOTO(st, build_manifest(w, sums, &manifest), done);
  if (!manifest) { /* build_manifest sets it on success */
    st = loom_error(LOOM_ERR_INTERNAL, "%s: no manifest built", w->final);
    goto done;
  }
  tidy_tmp(w);
  LOOM_TRY_GOTO(st,
                loom_ckpt_write_file_atomic_at(w->tmp_fd, w->tmp, CKPT_MANIFEST,
                                               manifest, strlen(manifest)),
                done);
  /* The name must still be the directory written (not a link swapped in):
   * the rename would make whatever it is the checkpoint. */
  {
    struct stat now;
    if (lstat(w->tmp, &now) != 0 || now.st_ino != w->tmp_st.st_ino ||
        now.st_dev != w->tmp_st.st_dev) {
      st = loom_error(LOOM_ERR_IO,
                      "%s: no longer the directory the shards were written to "
                      "(replaced while saving); not committed",
                      w->tmp);
      goto done;
    }
  }
  /* Read back as a resume will read it (the manifest's every field, the
   * views against the buffers, each shard's header, footer and block
   * index): what the reader would refuse is never committed, so it can
   * neither become `latest` nor let keep prune the last good one. */
  {
    loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
    oo.verify = LOOM_CKPT_VERIFY_META;
    loom_ckpt *back = NULL;
    st = loom_ckpt_open(&back, w->tmp, &oo);
    loom_ckpt_close(back);
    if (st != LOOM_OK) {
      loom_error_context(st,
                         "checkpoint %s would not be read back; not "
                         "committed",
                         w->final);
      goto done;
    }
  }
  /* The directory becomes a checkpoint in one rename. One of the same step
   * (say, written before a restart) is swapped out atomically, so there is
   * always a complete step_N. */
  struct stat sb;
  if (lstat(w->final, &sb) == 0) {
    if (loom_ckpt_io_exchange(w->tmp, w->final) != 0) {
      if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        st = loom_error(LOOM_ERR_IO, "%s: cannot replace %s: %s", w->tmp,
                        w->final, strerror(errno));
        goto done;
      }
      /* No RENAME_EXCHANGE here (some network file systems): move the old
       * one aside first. */
      char old[CKPT_PATH_MAX];
      LOOM_TRY_GOTO(st, step_path(old, sizeof old, w->root, w->step, "old"),
                    done);
      const char *old_name = strrchr(old, '/') + 1;
      loom_ckpt_remove(w->root, old_name);
      if (loom_ckpt_io_rename(w->final, old) != 0 ||
          loom_ckpt_io_rename(w->tmp, w->final) != 0) {
        st = loom_error(LOOM_ERR_IO, "%s: cannot replace %s: %s", w->tmp,
                        w->final, strerror(errno));
        goto done;
      }
      loom_ckpt_remove(w->root, old_name);
    } else {
      /* Now the old one (whatever it was: a link or a file in place of a
       * step directory is reported and kept, never followed). */
      loom_ckpt_remove(w->root, strrchr(w->tmp, '/') + 1);
    }
  } else if (loom_ckpt_io_rename(w->tmp, w->final) != 0) {
    st = loom_error(LOOM_ERR_IO, "%s: cannot rename to %s: %s", w->tmp,
                    w->final, strerror(errno));
    goto done;
  }
  LOOM_TRY_GOTO(st, loom_ckpt_fsync_dir(w->root), done);
  {
    const char *name = strrchr(w->final, '/') + 1;
    char line[64];
    int n = snprintf(line, sizeof line, "%s\n", name);
    LOOM_TRY_GOTO(
        st, loom_ckpt_write_file_atomic(w->root, CKPT_LATEST, line, (size_t)n),
        done);
  }
  w->state = W_COMMITTED;
  prune(w);
done:
  for (int r = 0; r < W; r++)
    loom_free(sums[r].ents);
  loom_free(sums);
  loom_free(manifest);
  return st;
}

loom_status loom_ckpt_writer_commit(loom_ckpt_writer *w) {
  if (!w)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_commit: NULL");
  if (w->opts.rank != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint %s: only rank 0 commits (this is rank %d)",
                      w->final, w->opts.rank);
  if (w->thread_live)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint %s: commit while a write runs (call "
                      "loom_ckpt_writer_wait first)",
                      w->final);
  if (w->state != W_WRITTEN)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint %s: commit needs rank 0's shard written "
                      "first%s",
                      w->final, w->state == W_FAILED ? " (it failed)" : "");
  return commit_impl(w);
}

void loom_ckpt_writer_abort(loom_ckpt_writer *w) {
  if (!w)
    return;
  /* Cleaning up must not replace the message of the failure that led here. */
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", loom_last_error());
  (void)loom_ckpt_writer_wait(w);
  if (w->state != W_COMMITTED) {
    loom_ckpt_remove(w->root, strrchr(w->tmp, '/') + 1);
    w->state = W_ABORTED;
  }
  loom_error(LOOM_OK, "%s", saved);
}

/* ----------------------------------------------------- background writes */

static void *writer_thread(void *arg) {
  loom_ckpt_writer *w = arg;
  loom_status st = write_shard(w);
  w->state = st == LOOM_OK ? W_WRITTEN : W_FAILED;
  if (st == LOOM_OK && w->thread_commit)
    st = commit_impl(w);
  w->bg_status = st;
  if (st != LOOM_OK)
    snprintf(w->bg_msg, sizeof w->bg_msg, "%s", loom_last_error());
  atomic_store(&w->done, true);
  return NULL;
}

loom_status loom_ckpt_writer_start(loom_ckpt_writer *w, bool commit) {
  if (!w)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_start: NULL");
  if (w->thread_live || w->state != W_OPEN)
    return loom_error(LOOM_ERR_INVALID_ARG, "checkpoint %s: written twice",
                      w->final);
  if (commit && w->opts.world != 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint %s: committing from the write thread needs "
                      "world 1 (ranks must agree first)",
                      w->final);
  w->thread_commit = commit;
  w->bg_status = LOOM_OK;
  w->bg_msg[0] = '\0';
  atomic_store(&w->done, false);
  w->state = W_STARTED;
  int e = pthread_create(&w->thread, NULL, writer_thread, w);
  if (e != 0) {
    w->state = W_OPEN;
    return loom_error(LOOM_ERR_INTERNAL,
                      "checkpoint %s: cannot start the "
                      "write thread: %s",
                      w->final, strerror(e));
  }
  w->thread_live = true;
  return LOOM_OK;
}

static void *commit_thread(void *arg) {
  loom_ckpt_writer *w = arg;
  loom_status st = commit_impl(w);
  w->bg_status = st;
  if (st != LOOM_OK)
    snprintf(w->bg_msg, sizeof w->bg_msg, "%s", loom_last_error());
  atomic_store(&w->done, true);
  return NULL;
}

loom_status loom_ckpt_writer_commit_start(loom_ckpt_writer *w) {
  if (!w)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_ckpt_writer_commit_start: NULL");
  if (w->opts.rank != 0 || w->thread_live || w->state != W_WRITTEN)
    return loom_ckpt_writer_commit(w); /* its message says what is wrong */
  w->bg_status = LOOM_OK;
  w->bg_msg[0] = '\0';
  atomic_store(&w->done, false);
  int e = pthread_create(&w->thread, NULL, commit_thread, w);
  if (e != 0)
    return loom_error(LOOM_ERR_INTERNAL,
                      "checkpoint %s: cannot start the commit thread: %s",
                      w->final, strerror(e));
  w->thread_live = true;
  return LOOM_OK;
}

loom_status loom_ckpt_writer_test(loom_ckpt_writer *w, bool *done) {
  if (!w || !done)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_test: NULL");
  *done = !w->thread_live || atomic_load(&w->done);
  return LOOM_OK;
}

loom_status loom_ckpt_writer_wait(loom_ckpt_writer *w) {
  if (!w)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_writer_wait: NULL");
  if (!w->thread_live)
    return w->bg_status;
  pthread_join(w->thread, NULL);
  w->thread_live = false;
  if (w->bg_status != LOOM_OK)
    return loom_error(w->bg_status, "%s", w->bg_msg);
  return LOOM_OK;
}

void loom_ckpt_writer_free(loom_ckpt_writer *w) {
  if (!w)
    return;
  if (w->thread_live) {
    pthread_join(w->thread, NULL);
    w->thread_live = false;
  }
  if (w->tmp_fd >= 0)
    close(w->tmp_fd);
  for (int i = 0; i < w->n_parts; i++)
    loom_free(w->parts[i].owned);
  loom_free(w->parts);
  meta_release(w);
  loom_free(w);
}

/* ------------------------------------------------------ single-rank save */

loom_status loom_ckpt_save(const char *root, int64_t step,
                           const loom_ckpt_meta *meta,
                           const loom_ckpt_buffer *bufs, int n_bufs, int keep) {
  if (n_bufs < 0 || (n_bufs && !bufs))
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_save: bad buffers");
  loom_ckpt_writer_opts o = loom_ckpt_writer_opts_default();
  o.keep = keep;
  loom_ckpt_writer *w = NULL;
  LOOM_TRY(loom_ckpt_writer_new(&w, root, step, &o));
  loom_status st = LOOM_OK;
  for (int i = 0; i < n_bufs; i++)
    LOOM_TRY_GOTO(st,
                  loom_ckpt_writer_add(w, bufs[i].name, bufs[i].dtype,
                                       bufs[i].count, 0, bufs[i].count,
                                       bufs[i].data),
                  fail);
  if (meta)
    LOOM_TRY_GOTO(st, loom_ckpt_writer_set_meta(w, meta), fail);
  LOOM_TRY_GOTO(st, loom_ckpt_writer_write(w), fail);
  LOOM_TRY_GOTO(st, loom_ckpt_writer_commit(w), fail);
  loom_ckpt_writer_free(w);
  return LOOM_OK;
fail:
  loom_ckpt_writer_abort(w);
  loom_ckpt_writer_free(w);
  return st;
}
