/* Token data sets: byte-level text files and llm.c `.bin` shards, cut into
 * windows of T+1 tokens. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_HEADER_BYTES (LOOM_SHARD_HEADER_INTS * 4)

loom_text_opts loom_text_opts_default(void) {
  loom_text_opts o = {128, 0.1, true, 0};
  return o;
}

static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) |
                   ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

static void put_le32(uint8_t *p, int32_t v) {
  uint32_t u = (uint32_t)v;
  p[0] = (uint8_t)u;
  p[1] = (uint8_t)(u >> 8);
  p[2] = (uint8_t)(u >> 16);
  p[3] = (uint8_t)(u >> 24);
}

/* ------------------------------------------------------------- shards */

loom_status loom_shard_open(const char *path, loom_shard *out) {
  if (!path || !out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_shard_open: NULL argument");
  memset(out, 0, sizeof *out);
  /* O_NONBLOCK: a FIFO in the data's place must not hang the open. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  loom_status st = LOOM_OK;
  struct stat sb;
  uint8_t hdr[SHARD_HEADER_BYTES];
  if (fstat(fd, &sb) != 0) {
    st = loom_error(LOOM_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    st = loom_error(LOOM_ERR_IO, "%s: not a regular file", path);
    goto done;
  }
  int64_t size = (int64_t)sb.st_size;
  if (size < SHARD_HEADER_BYTES) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: truncated token shard header (%lld of %d bytes)", path,
                    (long long)size, SHARD_HEADER_BYTES);
    goto done;
  }
  ssize_t r = pread(fd, hdr, sizeof hdr, 0);
  if (r != (ssize_t)sizeof hdr) {
    st = loom_error(LOOM_ERR_IO, "%s: cannot read the header: %s", path,
                    r < 0 ? strerror(errno) : "short read");
    goto done;
  }
  out->magic = le32(hdr);
  out->version = le32(hdr + 4);
  int64_t ntok = le32(hdr + 8);
  if (out->magic == LOOM_SHARD_MAGIC_U16) {
    out->width = 2;
    if (out->version != LOOM_SHARD_VERSION_U16) {
      st = loom_error(LOOM_ERR_UNSUPPORTED,
                      "%s: token shard version %d (magic %d shards are "
                      "version %d)",
                      path, out->version, LOOM_SHARD_MAGIC_U16,
                      LOOM_SHARD_VERSION_U16);
      goto done;
    }
  } else if (out->magic == LOOM_SHARD_MAGIC_U32) {
    out->width = 4;
    if (out->version != LOOM_SHARD_VERSION_U32) {
      st = loom_error(LOOM_ERR_UNSUPPORTED,
                      "%s: token shard version %d (magic %d shards are "
                      "version %d)",
                      path, out->version, LOOM_SHARD_MAGIC_U32,
                      LOOM_SHARD_VERSION_U32);
      goto done;
    }
  } else {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: wrong magic %d: not an llm.c token shard (expected "
                    "%d or %d)",
                    path, out->magic, LOOM_SHARD_MAGIC_U16,
                    LOOM_SHARD_MAGIC_U32);
    goto done;
  }
  if (ntok < 0) {
    st = loom_error(LOOM_ERR_CORRUPT, "%s: negative token count %lld", path,
                    (long long)ntok);
    goto done;
  }
  int64_t want = SHARD_HEADER_BYTES + ntok * out->width;
  if (size < want) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: truncated: the header gives %lld tokens (%lld bytes "
                    "with the header), the file has %lld bytes",
                    path, (long long)ntok, (long long)want, (long long)size);
    goto done;
  }
  if (size > want) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: %lld bytes of trailing data after the %lld tokens the "
                    "header gives",
                    path, (long long)(size - want), (long long)ntok);
    goto done;
  }
  out->map_bytes = (size_t)size;
  out->map = mmap(NULL, out->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (out->map == MAP_FAILED) {
    out->map = NULL;
    st = loom_error(LOOM_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    goto done;
  }
  out->tokens = (const uint8_t *)out->map + SHARD_HEADER_BYTES;
  out->ntok = ntok;
  for (int64_t i = 0; i < ntok; i++) {
    uint32_t t = loom_shard_token(out, i);
    if (t > out->max_token)
      out->max_token = t;
  }
done:
  close(fd);
  if (st != LOOM_OK)
    loom_shard_close(out);
  return st;
}

void loom_shard_close(loom_shard *s) {
  if (!s)
    return;
  if (s->map)
    munmap(s->map, s->map_bytes);
  memset(s, 0, sizeof *s);
}

loom_status loom_shard_write(const char *path, const uint16_t *tokens,
                             int64_t ntok) {
  if (!path || (ntok > 0 && !tokens) || ntok < 0 || ntok > INT32_MAX)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_shard_write: bad arguments (%lld tokens; llm.c "
                      "shards hold at most 2^31-1)",
                      (long long)ntok);
  /* One buffer written by loom_fs_write_atomic: a link at `path` is
   * replaced (what it points to untouched), a device, pipe or directory
   * there is refused, never written into or renamed over. */
  size_t len = SHARD_HEADER_BYTES + (size_t)ntok * 2;
  uint8_t *buf = loom_malloc(len);
  if (!buf)
    return loom_error_context(LOOM_ERR_NOMEM, "writing %s", path);
  memset(buf, 0, SHARD_HEADER_BYTES);
  put_le32(buf, LOOM_SHARD_MAGIC_U16);
  put_le32(buf + 4, LOOM_SHARD_VERSION_U16);
  put_le32(buf + 8, (int32_t)ntok);
  uint8_t *p = buf + SHARD_HEADER_BYTES;
  for (int64_t i = 0; i < ntok; i++) {
    p[2 * i] = (uint8_t)tokens[i];
    p[2 * i + 1] = (uint8_t)(tokens[i] >> 8);
  }
  loom_status st = loom_data_write_atomic(path, buf, len);
  loom_free(buf);
  return st;
}

typedef struct bytes_fill {
  const char *in;
  int fd;
  int64_t n; /* the input's size at the start: the token count */
} bytes_fill;

/* The shard's header, then each block of the input's bytes widened to
 * little-endian uint16 tokens. */
static int fill_bytes(int fd, void *ctx) {
  bytes_fill *b = ctx;
  uint8_t head[SHARD_HEADER_BYTES];
  memset(head, 0, sizeof head);
  put_le32(head, LOOM_SHARD_MAGIC_U16);
  put_le32(head + 4, LOOM_SHARD_VERSION_U16);
  put_le32(head + 8, (int32_t)b->n);
  if (loom_fs_write_all(fd, head, sizeof head) != 0)
    return -1;
  enum { BLOCK = 1 << 16 };
  uint8_t *in = loom_malloc(BLOCK), *out = loom_malloc(2 * BLOCK);
  int rc = 0;
  if (!in || !out) {
    loom_error(LOOM_ERR_NOMEM, "%s: a block's buffers", b->in);
    rc = -2;
  }
  int64_t done = 0;
  while (rc == 0) {
    ssize_t r = read(b->fd, in, BLOCK);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      loom_error(LOOM_ERR_IO, "%s: read failed: %s", b->in, strerror(errno));
      rc = -2;
    } else if (done + r > b->n || (r == 0 && done < b->n)) {
      loom_error(LOOM_ERR_IO, "%s: read failed: file %s while read", b->in,
                 r == 0 ? "shrank" : "grew");
      rc = -2;
    } else if (r == 0) {
      break;
    } else {
      for (ssize_t i = 0; i < r; i++) {
        out[2 * i] = in[i];
        out[2 * i + 1] = 0;
      }
      done += r;
      if (loom_fs_write_all(fd, out, 2 * (size_t)r) != 0)
        rc = -1;
    }
  }
  int e = errno;
  loom_free(in);
  loom_free(out);
  errno = e;
  return rc;
}

loom_status loom_shard_write_bytes(const char *path, const char *in,
                                   int64_t *ntok) {
  if (!path || !in)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_shard_write_bytes: NULL argument");
  if (ntok)
    *ntok = 0;
  bytes_fill b = {in, -1, 0};
  /* A FIFO in the input's place is refused, never waited on. */
  b.fd = loom_fs_open_read_at(AT_FDCWD, in, 0, &b.n);
  if (b.fd < 0)
    return errno == LOOM_FS_ENOTREG
               ? loom_error(LOOM_ERR_IO, "%s: not a regular file", in)
               : loom_error(LOOM_ERR_IO, "cannot open %s: %s", in,
                            strerror(errno));
  if (b.n > INT32_MAX) {
    close(b.fd);
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "%s: %lld bytes; an llm.c shard holds at most 2^31-1 "
                      "tokens",
                      in, (long long)b.n);
  }
  loom_status st = loom_data_write_atomic_with(path, fill_bytes, &b);
  close(b.fd);
  if (st == LOOM_OK && ntok)
    *ntok = b.n;
  return st;
}

/* ---------------------------------------------------------- windows */

/* Counts the windows of each segment; LOOM_ERR_INVALID_ARG when there are
 * none at all. */
static loom_status setup_windows(loom_dataset *ds, const char *what) {
  const int64_t T = ds->T;
  int64_t total = 0;
  ds->tokens = 0;
  for (int i = 0; i < ds->nseg; i++) {
    loom_segment *s = &ds->segs[i];
    /* With an offset in [0, T) the last window must still end inside the
     * segment: off + nwin*T + 1 <= ntok for every off. */
    if (ds->random_offset)
      s->nwin = s->ntok >= 2 * T ? (s->ntok - T) / T : 0;
    else
      s->nwin = s->ntok >= T + 1 ? (s->ntok - 1) / T : 0;
    s->first = total;
    total += s->nwin;
    ds->tokens += s->ntok;
  }
  if (total == 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "%s: %s has %lld tokens, too few for one window of "
                      "%lld+1 (context %lld%s)",
                      ds->source, what, (long long)ds->tokens, (long long)T,
                      (long long)T, ds->random_offset ? ", random offset" : "");
  ds->len = total;
  return LOOM_OK;
}

static loom_status check_text_opts(const loom_text_opts *o) {
  if (o->context < 1 || o->context > LOOM_TEXT_MAX_CONTEXT)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "context length %lld out of range [1, 2^24]",
                      (long long)o->context);
  if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "val_fraction %g out of range [0, 1)", o->val_fraction);
  return LOOM_OK;
}

loom_status loom_text_read(const char *path, uint8_t **data, int64_t *n) {
  if (!path || !data || !n)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_text_read: NULL argument");
  *data = NULL;
  *n = 0;
  /* A FIFO in the text's place is refused, never waited on. */
  int64_t size = 0;
  int fd = loom_fs_open_read_at(AT_FDCWD, path, 0, &size);
  if (fd < 0)
    return errno == LOOM_FS_ENOTREG
               ? loom_error(LOOM_ERR_IO, "%s: not a regular file", path)
               : loom_error(LOOM_ERR_IO, "cannot open %s: %s", path,
                            strerror(errno));
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    int err = errno;
    close(fd);
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", path, strerror(err));
  }
  loom_status st = LOOM_OK;
  *n = size;
  *data = loom_malloc((size_t)*n + 1);
  if (!*data) {
    st = LOOM_ERR_NOMEM;
    goto done;
  }
  if (fread(*data, 1, (size_t)*n, f) != (size_t)*n) {
    st = loom_error(LOOM_ERR_IO, "%s: read failed: %s", path,
                    ferror(f) ? strerror(errno) : "file shrank while read");
    goto done;
  }
done:
  fclose(f);
  if (st != LOOM_OK) {
    loom_free(*data);
    *data = NULL;
  }
  return st;
}

loom_status loom_dataset_open_text(loom_dataset **out, const char *path,
                                   loom_split split,
                                   const loom_text_opts *opts) {
  if (!out || !path || (unsigned)split >= LOOM_SPLIT_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_open_text: bad argument");
  *out = NULL;
  loom_text_opts o = opts ? *opts : loom_text_opts_default();
  LOOM_TRY(check_text_opts(&o));
  loom_status st = LOOM_OK;
  loom_dataset *ds = loom_calloc(1, sizeof *ds);
  if (!ds)
    return LOOM_ERR_NOMEM;
  int64_t n = 0;
  if (!(ds->source = loom_data_strdup(path)) ||
      !(ds->segs = loom_calloc(1, sizeof *ds->segs))) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  LOOM_TRY_GOTO(st, loom_text_read(path, &ds->text, &n), fail);
  int64_t nval = (int64_t)llround((double)n * o.val_fraction);
  int64_t ntrain = n - nval;
  ds->kind = LOOM_DATASET_TOKENS;
  ds->T = o.context;
  ds->seed = o.seed;
  ds->random_offset = split == LOOM_SPLIT_TRAIN && o.random_offset;
  ds->nseg = 1;
  ds->segs[0].width = 1;
  ds->segs[0].base = ds->text + (split == LOOM_SPLIT_TRAIN ? 0 : ntrain);
  ds->segs[0].ntok = split == LOOM_SPLIT_TRAIN ? ntrain : nval;
  /* This split's bytes only: the val split's classes are not the file's
   * (loom train checks the model's vocabulary against both splits). */
  uint8_t maxb = 0;
  for (int64_t i = 0; i < ds->segs[0].ntok; i++)
    if (ds->segs[0].base[i] > maxb)
      maxb = ds->segs[0].base[i];
  ds->classes = (int64_t)maxb + 1;
  LOOM_TRY_GOTO(st,
                setup_windows(ds, split == LOOM_SPLIT_TRAIN ? "the train split"
                                                            : "the val split"),
                fail);
  ds->held = (size_t)n + 1;
  loom_mem_add(LOOM_MEM_DATA, ds->held);
  *out = ds;
  return LOOM_OK;
fail:
  loom_dataset_free(ds);
  return st;
}

loom_status loom_dataset_open_shards(loom_dataset **out, const char *pattern,
                                     const loom_text_opts *opts) {
  if (!out || !pattern)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_open_shards: NULL argument");
  *out = NULL;
  loom_text_opts o = opts ? *opts : loom_text_opts_default();
  LOOM_TRY(check_text_opts(&o));
  glob_t g;
  memset(&g, 0, sizeof g);
  int gr = glob(pattern, GLOB_ERR, NULL, &g);
  if (gr == GLOB_NOMATCH)
    return loom_error(LOOM_ERR_IO, "no token shard matches %s", pattern);
  if (gr != 0) {
    globfree(&g);
    return loom_error(LOOM_ERR_IO, "cannot list %s: %s", pattern,
                      gr == GLOB_NOSPACE ? "out of memory" : "read error");
  }
  loom_status st = LOOM_OK;
  loom_dataset *ds = loom_calloc(1, sizeof *ds);
  if (!ds) {
    globfree(&g);
    return LOOM_ERR_NOMEM;
  }
  int count = (int)g.gl_pathc;
  if (!(ds->source = loom_data_strdup(pattern)) ||
      !(ds->shards = loom_calloc((size_t)count, sizeof *ds->shards)) ||
      !(ds->segs = loom_calloc((size_t)count, sizeof *ds->segs)) ||
      !(ds->shard_paths = loom_calloc((size_t)count, sizeof(char *)))) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  ds->kind = LOOM_DATASET_TOKENS;
  ds->T = o.context;
  ds->seed = o.seed;
  ds->random_offset = o.random_offset;
  uint32_t maxt = 0;
  for (int i = 0; i < count; i++) {
    LOOM_TRY_GOTO(st, loom_shard_open(g.gl_pathv[i], &ds->shards[i]), fail);
    ds->nshards = i + 1;
    if (!(ds->shard_paths[i] = loom_data_strdup(g.gl_pathv[i]))) {
      st = LOOM_ERR_NOMEM;
      goto fail;
    }
    ds->segs[i].base = ds->shards[i].tokens;
    ds->segs[i].width = ds->shards[i].width;
    ds->segs[i].ntok = ds->shards[i].ntok;
    if (ds->shards[i].max_token > maxt)
      maxt = ds->shards[i].max_token;
  }
  ds->nseg = count;
  ds->classes = (int64_t)maxt + 1;
  LOOM_TRY_GOTO(st, setup_windows(ds, count == 1 ? "the shard" : "the shards"),
                fail);
  globfree(&g);
  *out = ds;
  return LOOM_OK;
fail:
  globfree(&g);
  loom_dataset_free(ds);
  return st;
}

loom_status loom_dataset_check_vocab(const loom_dataset *ds, int64_t vocab) {
  if (!ds || vocab < 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_check_vocab: bad argument");
  if (ds->kind != LOOM_DATASET_TOKENS || ds->classes <= vocab)
    return LOOM_OK;
  /* Text: the bytes of this split. */
  for (int i = 0; ds->text && i < ds->nseg; i++) {
    const loom_segment *sg = &ds->segs[i];
    for (int64_t k = 0; k < sg->ntok; k++)
      if (sg->base[k] >= vocab)
        return loom_error(LOOM_ERR_CONFIG,
                          "%s: byte %lld is %u, outside the vocabulary "
                          "(model.vocab %lld)",
                          ds->source, (long long)(sg->base + k - ds->text),
                          sg->base[k], (long long)vocab);
  }
  for (int i = 0; i < ds->nshards; i++) {
    const loom_shard *sh = &ds->shards[i];
    if (sh->max_token < vocab)
      continue;
    for (int64_t k = 0; k < sh->ntok; k++) {
      uint32_t t = loom_shard_token(sh, k);
      if (t >= vocab)
        return loom_error(LOOM_ERR_CONFIG,
                          "%s: token %lld (byte %lld) is %u, outside the "
                          "vocabulary (model.vocab %lld)",
                          ds->shard_paths ? ds->shard_paths[i] : ds->source,
                          (long long)k,
                          (long long)(SHARD_HEADER_BYTES + k * sh->width), t,
                          (long long)vocab);
    }
  }
  return LOOM_OK;
}

int64_t loom_tokens_epoch_offset(const loom_dataset *ds, int64_t epoch) {
  if (!ds->random_offset)
    return 0;
  loom_rng r = loom_rng_init(
      ds->seed, loom_rng_stream_id(LOOM_DATA_RNG_OFFSET, (uint64_t)epoch, 0));
  return (int64_t)loom_rng_below(&r, (uint64_t)ds->T);
}

static const loom_segment *find_segment(const loom_dataset *ds, int64_t w) {
  int lo = 0, hi = ds->nseg - 1;
  while (lo < hi) { /* last segment with first <= w */
    int mid = (lo + hi + 1) / 2;
    if (ds->segs[mid].first <= w)
      lo = mid;
    else
      hi = mid - 1;
  }
  return &ds->segs[lo];
}

loom_status loom_tokens_fill(const loom_dataset *ds, int64_t epoch,
                             const int64_t *idx, int64_t n, loom_batch *b) {
  const int64_t T = ds->T;
  const int64_t off = loom_tokens_epoch_offset(ds, epoch);
  int32_t *x = b->x.data; /* (B, T) */
  int32_t *y = b->y.data; /* (B, T) */
  for (int64_t i = 0; i < n; i++) {
    const loom_segment *s = find_segment(ds, idx[i]);
    int64_t start = off + (idx[i] - s->first) * T;
    int32_t *xr = x + i * T, *yr = y + i * T;
    if (s->width == 1) {
      const uint8_t *p = s->base + start;
      for (int64_t t = 0; t < T; t++) {
        xr[t] = p[t];
        yr[t] = p[t + 1];
      }
    } else {
      const uint8_t *p = s->base + (size_t)start * (size_t)s->width;
      const size_t w = (size_t)s->width;
      uint32_t prev = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
      if (w == 4)
        prev |= ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
      for (int64_t t = 0; t < T; t++) {
        const uint8_t *q = p + (size_t)(t + 1) * w;
        uint32_t next = (uint32_t)q[0] | ((uint32_t)q[1] << 8);
        if (w == 4)
          next |= ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
        xr[t] = (int32_t)prev;
        yr[t] = (int32_t)next;
        prev = next;
      }
    }
  }
  return LOOM_OK;
}
