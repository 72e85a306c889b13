/* IDX files ((Fashion-)MNIST): gzip or plain through zlib, fully checked. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* No real IDX file comes near this; it stops a corrupt header from asking
 * for an absurd allocation. */
#define IDX_MAX_BYTES ((int64_t)1 << 40)

/* Reads up to n bytes; *got is what arrived. Errors (including a gzip
 * stream cut short, which zlib reports as Z_BUF_ERROR) are returned with a
 * message naming the file; a plain short read is not an error here. */
static loom_status gz_read_all(gzFile gz, const char *path, uint8_t *buf,
                               size_t n, size_t *got) {
  *got = 0;
  while (*got < n) {
    size_t want = n - *got;
    if (want > (size_t)1 << 30)
      want = (size_t)1 << 30;
    int r = gzread(gz, buf + *got, (unsigned)want);
    if (r > 0)
      *got += (size_t)r;
    if (r <= 0 || (size_t)r < want)
      break;
  }
  int errnum = Z_OK;
  const char *msg = gzerror(gz, &errnum);
  if (errnum == Z_ERRNO)
    return loom_error(LOOM_ERR_IO, "%s: read failed: %s", path,
                      strerror(errno));
  if (errnum == Z_BUF_ERROR)
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: truncated gzip stream (%s) after %zu bytes of data",
                      path, msg, *got);
  if (errnum != Z_OK)
    return loom_error(LOOM_ERR_CORRUPT, "%s: bad gzip data: %s", path, msg);
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

/* Opens path and reads its header into out (dims, bytes; no data): *gzp
 * is left open just past it, *sb holds the file's stat. On error nothing
 * stays open. */
static loom_status open_header(const char *path, gzFile *gzp, struct stat *sb,
                               loom_idx *out) {
  if (!path || !out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_idx_read: NULL argument");
  memset(out, 0, sizeof *out);
  /* A FIFO or a directory in the file's place is an error, not a hang. */
  if (stat(path, sb) != 0)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  if (!S_ISREG(sb->st_mode))
    return loom_error(LOOM_ERR_IO, "%s: not a regular file", path);
  errno = 0;
  gzFile gz = gzopen(path, "rb");
  if (!gz)
    return loom_error(LOOM_ERR_IO, "cannot open %s: %s", path,
                      errno ? strerror(errno) : "out of memory");
  loom_status st = LOOM_OK;
  uint8_t hdr[4 + 4 * LOOM_IDX_MAX_DIMS];
  size_t got = 0;

  LOOM_TRY_GOTO(st, gz_read_all(gz, path, hdr, 4, &got), done);
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
  LOOM_TRY_GOTO(st, gz_read_all(gz, path, hdr + 4, 4 * (size_t)ndim, &got),
                done);
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
  *gzp = gz;
  return LOOM_OK;
done:
  gzclose(gz);
  return st;
}

loom_status loom_idx_read_header(const char *path, loom_idx *out) {
  gzFile gz;
  struct stat sb;
  LOOM_TRY(open_header(path, &gz, &sb, out));
  gzclose(gz);
  return LOOM_OK;
}

loom_status loom_idx_read(const char *path, loom_idx *out) {
  gzFile gz;
  struct stat sb;
  LOOM_TRY(open_header(path, &gz, &sb, out));
  loom_status st = LOOM_OK;
  size_t got = 0;
  char dims[96];
  dims_str(out, dims, sizeof dims);
  int64_t total = (int64_t)out->bytes;
  int ndim = out->ndim;
  /* A plain file: the header must describe the file's size exactly, checked
   * before anything is allocated from it. */
  int64_t hdr_bytes = 4 + 4 * (int64_t)ndim;
  if (gzdirect(gz) && (int64_t)sb.st_size != hdr_bytes + total) {
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
    LOOM_TRY_GOTO(st, gz_read_all(gz, path, out->data + got, cap - got, &more),
                  done);
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
  LOOM_TRY_GOTO(st, gz_read_all(gz, path, extra, sizeof extra, &got), done);
  if (got > 0) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: trailing data after the %zu bytes the header (%s) "
                    "describes",
                    path, out->bytes, dims);
    goto done;
  }

done:
  gzclose(gz);
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
