/* IDX files ((Fashion-)MNIST): gzip or plain through zlib, fully checked;
 * and what a data file holds, found from its first bytes (it needs the
 * gzip reader). */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* No real IDX file comes near this; it stops a corrupt header from asking
 * for an absurd allocation. */
#define IDX_MAX_BYTES ((int64_t)1 << 40)

/* The bytes of an IDX file: plain, or gzip inflated here with zlib's
 * inflate rather than gzread, which stops at the first bytes after a gzip
 * member that are not another member and ignores them: a file with
 * garbage or zeros after its stream must be refused, naming the offset. */
#define SRC_IN_BYTES ((size_t)64 << 10)

typedef struct idx_src {
  const char *path;
  int fd;
  bool gz;
  bool z_live;  /* inflateInit2 done */
  bool eof;     /* read() returned 0 */
  bool ended;   /* gzip: the last member ended and nothing follows */
  int64_t pos;  /* file bytes read so far */
  int64_t made; /* gzip: bytes of data inflated so far */
  uint8_t *in;  /* (SRC_IN_BYTES) compressed input */
  z_stream z;
} idx_src;

/* Moves the unread input to the front and reads more after it. */
static loom_status src_refill(idx_src *s) {
  if (s->eof)
    return LOOM_OK;
  if (s->z.avail_in && s->z.next_in != s->in)
    memmove(s->in, s->z.next_in, s->z.avail_in);
  s->z.next_in = s->in;
  ssize_t r;
  do
    r = read(s->fd, s->in + s->z.avail_in, SRC_IN_BYTES - s->z.avail_in);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return loom_error(LOOM_ERR_IO, "%s: read failed: %s", s->path,
                      strerror(errno));
  if (r == 0)
    s->eof = true;
  s->z.avail_in += (uInt)r;
  s->pos += r;
  return LOOM_OK;
}

/* A gzip member ended: another member may follow (gzip's concatenation);
 * anything else after it is an error naming its offset. */
static loom_status src_member_end(idx_src *s) {
  while (s->z.avail_in < 2 && !s->eof)
    LOOM_TRY(src_refill(s));
  if (s->z.avail_in == 0) {
    s->ended = true;
    return LOOM_OK;
  }
  if (s->z.avail_in >= 2 && s->z.next_in[0] == 0x1f &&
      s->z.next_in[1] == 0x8b) {
    if (inflateReset(&s->z) != Z_OK)
      return loom_error(LOOM_ERR_INTERNAL, "%s: inflateReset failed", s->path);
    return LOOM_OK;
  }
  int64_t at = s->pos - (int64_t)s->z.avail_in;
  struct stat sb;
  int64_t size = fstat(s->fd, &sb) == 0 ? (int64_t)sb.st_size : s->pos;
  return loom_error(LOOM_ERR_CORRUPT,
                    "%s: trailing data at byte offset %lld: %lld bytes after "
                    "the gzip stream (%lld bytes of data) that are not gzip",
                    s->path, (long long)at, (long long)(size - at),
                    (long long)s->made);
}

/* Reads up to n bytes; *got is what arrived (short only at the end of the
 * data). Errors name the file: a read failure, a gzip stream cut short,
 * damaged gzip data (checksums included), trailing bytes. */
static loom_status src_read(idx_src *s, uint8_t *buf, size_t n, size_t *got) {
  *got = 0;
  if (!s->gz) {
    while (*got < n) {
      ssize_t r = read(s->fd, buf + *got, n - *got);
      if (r < 0 && errno == EINTR)
        continue;
      if (r < 0)
        return loom_error(LOOM_ERR_IO, "%s: read failed: %s", s->path,
                          strerror(errno));
      if (r == 0)
        break;
      *got += (size_t)r;
    }
    return LOOM_OK;
  }
  while (*got < n && !s->ended) {
    if (s->z.avail_in == 0)
      LOOM_TRY(src_refill(s));
    size_t want = n - *got;
    if (want > (size_t)1 << 30)
      want = (size_t)1 << 30;
    s->z.next_out = buf + *got;
    s->z.avail_out = (uInt)want;
    int r = inflate(&s->z, Z_NO_FLUSH);
    *got += want - s->z.avail_out;
    s->made += (int64_t)(want - s->z.avail_out);
    if (r == Z_STREAM_END) {
      LOOM_TRY(src_member_end(s));
    } else if (r == Z_BUF_ERROR && s->z.avail_in == 0) {
      if (s->eof)
        return loom_error(LOOM_ERR_CORRUPT,
                          "%s: truncated gzip stream after %lld bytes of data",
                          s->path, (long long)s->made);
    } else if (r == Z_MEM_ERROR) {
      return loom_error_context(LOOM_ERR_NOMEM, "inflating %s", s->path);
    } else if (r != Z_OK) {
      return loom_error(LOOM_ERR_CORRUPT,
                        "%s: bad gzip data near byte offset %lld: %s", s->path,
                        (long long)(s->pos - (int64_t)s->z.avail_in),
                        s->z.msg ? s->z.msg : "inflate failed");
    }
  }
  return LOOM_OK;
}

static void src_close(idx_src *s) {
  if (s->z_live)
    inflateEnd(&s->z);
  if (s->fd >= 0)
    close(s->fd);
  loom_free(s->in);
  memset(s, 0, sizeof *s);
  s->fd = -1;
}

/* Opens path (a regular file: a FIFO or a directory in its place is an
 * error, not a hang) and finds whether it is gzip (magic 1f 8b, as gzread
 * decides) or plain. */
static loom_status src_open(idx_src *s, const char *path, struct stat *sb) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  s->path = path;
  s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (s->fd < 0)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  if (fstat(s->fd, sb) != 0)
    return loom_error(LOOM_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  if (!S_ISREG(sb->st_mode))
    return loom_error(LOOM_ERR_IO, "%s: not a regular file", path);
  if (!(s->in = loom_malloc(SRC_IN_BYTES)))
    return loom_error_context(LOOM_ERR_NOMEM, "reading %s", path);
  s->z.next_in = s->in;
  while (s->z.avail_in < 2 && !s->eof)
    LOOM_TRY(src_refill(s));
  s->gz = s->z.avail_in >= 2 && s->in[0] == 0x1f && s->in[1] == 0x8b;
  if (!s->gz) {
    /* plain: read from the start again, past what was looked at */
    if (lseek(s->fd, 0, SEEK_SET) != 0)
      return loom_error(LOOM_ERR_IO, "%s: cannot seek: %s", path,
                        strerror(errno));
    s->pos = 0;
    s->eof = false;
    s->z.avail_in = 0;
    return LOOM_OK;
  }
  int r = inflateInit2(&s->z, 16 + MAX_WBITS); /* gzip wrapper only */
  if (r != Z_OK)
    return r == Z_MEM_ERROR
               ? loom_error_context(LOOM_ERR_NOMEM, "reading %s", path)
               : loom_error(LOOM_ERR_INTERNAL, "%s: inflateInit2 failed", path);
  s->z_live = true;
  return LOOM_OK;
}

static const char *idx_type_name(int t) {
  switch (t) {
  case 0x08:
    return "unsigned byte";
  case 0x09:
    return "signed byte";
  case 0x0B:
    return "int16";
  case 0x0C:
    return "int32";
  case 0x0D:
    return "float32";
  case 0x0E:
    return "float64";
  default:
    return NULL;
  }
}

static void dims_str(const loom_idx *m, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < m->ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "x" : "",
                          (long long)m->dims[i]);
}

/* Opens path and reads its header into out (dims, bytes; no data): *src
 * is left open just past it, *sb holds the file's stat. On error nothing
 * stays open. */
static loom_status open_header(const char *path, idx_src *src, struct stat *sb,
                               loom_idx *out) {
  if (!path || !out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_idx_read: NULL argument");
  memset(out, 0, sizeof *out);
  loom_status st = LOOM_OK;
  uint8_t hdr[4 + 4 * LOOM_IDX_MAX_DIMS];
  size_t got = 0;

  LOOM_TRY_GOTO(st, src_open(src, path, sb), done);
  LOOM_TRY_GOTO(st, src_read(src, hdr, 4, &got), done);
  if (got < 4) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: truncated IDX header (%zu of 4 magic bytes)", path,
                    got);
    goto done;
  }
  uint32_t magic = ((uint32_t)hdr[0] << 24) | ((uint32_t)hdr[1] << 16) |
                   ((uint32_t)hdr[2] << 8) | hdr[3];
  int type = hdr[2], ndim = hdr[3];
  if (hdr[0] != 0 || hdr[1] != 0 || !idx_type_name(type)) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: wrong magic 0x%08x: not an IDX file (expected "
                    "0x000008NN, NN = number of dimensions)",
                    path, magic);
    goto done;
  }
  if (type != 0x08) {
    st = loom_error(LOOM_ERR_UNSUPPORTED,
                    "%s: IDX elements are %s (type 0x%02x); loom reads "
                    "unsigned bytes (0x08)",
                    path, idx_type_name(type), type);
    goto done;
  }
  if (ndim < 1 || ndim > LOOM_IDX_MAX_DIMS) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: IDX header gives %d dimensions (1 to %d supported)",
                    path, ndim, LOOM_IDX_MAX_DIMS);
    goto done;
  }
  LOOM_TRY_GOTO(st, src_read(src, hdr + 4, 4 * (size_t)ndim, &got), done);
  if (got < 4 * (size_t)ndim) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: truncated IDX header (%zu of %d dimension bytes)",
                    path, got, 4 * ndim);
    goto done;
  }
  out->ndim = ndim;
  int64_t total = 1;
  for (int i = 0; i < ndim; i++) {
    const uint8_t *p = hdr + 4 + 4 * i;
    out->dims[i] = ((int64_t)p[0] << 24) | ((int64_t)p[1] << 16) |
                   ((int64_t)p[2] << 8) | p[3];
    if (out->dims[i] == 0) {
      st = loom_error(LOOM_ERR_CORRUPT, "%s: IDX dimension %d is 0", path, i);
      goto done;
    }
    if (out->dims[i] > IDX_MAX_BYTES / total) {
      st = loom_error(LOOM_ERR_CORRUPT,
                      "%s: IDX dimensions give more than %lld bytes", path,
                      (long long)IDX_MAX_BYTES);
      goto done;
    }
    total *= out->dims[i];
  }
  out->bytes = (size_t)total;
  return LOOM_OK;
done:
  src_close(src);
  return st;
}

loom_status loom_idx_read_header(const char *path, loom_idx *out) {
  idx_src src;
  struct stat sb;
  LOOM_TRY(open_header(path, &src, &sb, out));
  src_close(&src);
  return LOOM_OK;
}

loom_status loom_idx_read(const char *path, loom_idx *out) {
  idx_src src;
  struct stat sb;
  LOOM_TRY(open_header(path, &src, &sb, out));
  loom_status st = LOOM_OK;
  size_t got = 0;
  char dims[96];
  dims_str(out, dims, sizeof dims);
  int64_t total = (int64_t)out->bytes;
  int ndim = out->ndim;
  /* A plain file: the header must describe the file's size exactly, checked
   * before anything is allocated from it. */
  int64_t hdr_bytes = 4 + 4 * (int64_t)ndim;
  if (!src.gz && (int64_t)sb.st_size != hdr_bytes + total) {
    st = loom_error(
        LOOM_ERR_CORRUPT,
        "%s: %s: the header (%s) needs %lld bytes of data, the "
        "file has %lld",
        path,
        (int64_t)sb.st_size < hdr_bytes + total ? "truncated" : "trailing data",
        dims, (long long)total, (long long)((int64_t)sb.st_size - hdr_bytes));
    goto done;
  }
  /* gzip: the size is known only by inflating, so the buffer grows with
   * the data that arrives instead of trusting the header's length. */
  size_t cap = out->bytes < ((size_t)64 << 20) ? out->bytes : (size_t)64 << 20;
  got = 0;
  for (;;) {
    uint8_t *grown = loom_malloc(cap);
    if (!grown) {
      st = loom_error_context(LOOM_ERR_NOMEM, "reading %s", path);
      goto done;
    }
    if (got)
      memcpy(grown, out->data, got);
    loom_free(out->data);
    out->data = grown;
    size_t more = 0;
    LOOM_TRY_GOTO(st, src_read(&src, out->data + got, cap - got, &more), done);
    got += more;
    if (got < cap || cap == out->bytes)
      break;
    cap = cap > out->bytes / 2 ? out->bytes : cap * 2;
  }
  if (got < out->bytes) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: truncated: the header (%s) needs %zu bytes of data, "
                    "the file has %zu",
                    path, dims, out->bytes, got);
    goto done;
  }
  uint8_t extra[64];
  LOOM_TRY_GOTO(st, src_read(&src, extra, sizeof extra, &got), done);
  if (got > 0) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: trailing data after the %zu bytes the header (%s) "
                    "describes",
                    path, out->bytes, dims);
    goto done;
  }

done:
  src_close(&src);
  if (st != LOOM_OK)
    loom_idx_free(out);
  return st;
}

void loom_idx_free(loom_idx *idx) {
  if (!idx)
    return;
  loom_free(idx->data);
  memset(idx, 0, sizeof *idx);
}

/* ----------------------------------------------------------- file kinds */

static const char *const data_file_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_DATA_FILE_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof data_file_names / sizeof data_file_names[0] ==
                   LOOM_DATA_FILE_COUNT,
               "data_file_names must list every loom_data_file");

const char *loom_data_file_name(loom_data_file k) {
  return (unsigned)k < LOOM_DATA_FILE_COUNT ? data_file_names[k] : "?";
}

static bool is_idx_magic(const uint8_t *h, size_t n) {
  return n >= 4 && h[0] == 0 && h[1] == 0 && idx_type_name(h[2]) != NULL;
}

loom_status loom_data_file_detect(const char *path, loom_data_file *out) {
  if (!path || !out)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_data_file_detect: NULL argument");
  *out = LOOM_DATA_FILE_TEXT;
  idx_src src;
  struct stat sb;
  uint8_t h[4];
  size_t got = 0;
  loom_status st = src_open(&src, path, &sb);
  if (st == LOOM_OK)
    st = src_read(&src, h, sizeof h, &got);
  bool gz = src.gz;
  src_close(&src);
  LOOM_TRY(st);
  if (gz) {
    if (!is_idx_magic(h, got))
      return loom_error(LOOM_ERR_UNSUPPORTED,
                        "%s: gzip data whose first %zu inflated bytes are not "
                        "an IDX magic (00 00 08 NN); loom reads gzip files "
                        "only as IDX",
                        path, got);
    *out = LOOM_DATA_FILE_IDX;
  } else if (is_idx_magic(h, got)) {
    *out = LOOM_DATA_FILE_IDX;
  } else if (got == 4) {
    uint32_t m = (uint32_t)h[0] | ((uint32_t)h[1] << 8) |
                 ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
    if (m == LOOM_SHARD_MAGIC_U16 || m == LOOM_SHARD_MAGIC_U32)
      *out = LOOM_DATA_FILE_SHARD;
  }
  return LOOM_OK;
}
