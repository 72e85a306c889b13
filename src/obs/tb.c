/* TensorBoard event files, written by hand: TFRecord framing around
 * serialized tensorflow.Event messages (protobuf wire format). Only what
 * scalars need:
 *   Event   { double wall_time = 1; int64 step = 2;
 *             string file_version = 3; Summary summary = 5;
 *             SessionLog session_log = 7; }
 *   SessionLog { SessionStatus status = 1; }   START = 1
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * A record: uint64 length, uint32 masked CRC32C of those 8 bytes, the
 * bytes, uint32 masked CRC32C of the bytes, all little-endian. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/obs.h"

struct loom_tb {
  FILE *f;
  char path[1024];
  unsigned char *buf; /* one event being encoded */
  size_t len, cap;
  bool overflow;
};

uint32_t loom_tb_masked_crc(const void *data, size_t n) {
  uint32_t c = loom_crc32c(0, data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ------------------------------------------------------------- encoding */

static void put(loom_tb *w, const void *p, size_t n) {
  if (w->overflow)
    return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n)
      cap *= 2;
    unsigned char *b = loom_malloc(cap);
    if (!b) {
      w->overflow = true;
      return;
    }
    if (w->len)
      memcpy(b, w->buf, w->len);
    loom_free(w->buf);
    w->buf = b;
    w->cap = cap;
  }
  memcpy(w->buf + w->len, p, n);
  w->len += n;
}

static void put_varint(loom_tb *w, uint64_t v) {
  unsigned char b[10];
  size_t n = 0;
  do {
    b[n] = (unsigned char)(v & 0x7f);
    v >>= 7;
    if (v)
      b[n] |= 0x80;
    n++;
  } while (v);
  put(w, b, n);
}

static void store_le(unsigned char *b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    b[i] = (unsigned char)(v >> (8 * i));
}

static void put_le(loom_tb *w, uint64_t v, int bytes) {
  unsigned char b[8];
  store_le(b, v, bytes);
  put(w, b, (size_t)bytes);
}

/* Field `field` of wire type `type` (0 varint, 1 64-bit, 2 bytes, 5 32-bit). */
static void put_key(loom_tb *w, int field, int type) {
  put_varint(w, (uint64_t)field << 3 | (uint64_t)type);
}

static void put_double(loom_tb *w, int field, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  put_key(w, field, 1);
  put_le(w, u, 8);
}

static void put_bytes(loom_tb *w, int field, const void *p, size_t n) {
  put_key(w, field, 2);
  put_varint(w, n);
  put(w, p, n);
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* Bytes of a Summary.Value with a tag of t bytes: the tag's key, length
 * and bytes, the float's key and 4 bytes. */
static size_t value_len(size_t t) { return 1 + varint_len(t) + t + 1 + 4; }

/* Frames the event in w->buf as one record and writes it. */
static loom_status write_record(loom_tb *w) {
  if (w->overflow)
    return loom_error(LOOM_ERR_NOMEM, "tensorboard: encoding an event for '%s'",
                      w->path);
  unsigned char head[12], tail[4];
  store_le(head, w->len, 8);
  store_le(head + 8, loom_tb_masked_crc(head, 8), 4);
  store_le(tail, loom_tb_masked_crc(w->buf, w->len), 4);
  if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
      fwrite(w->buf, 1, w->len, w->f) != w->len ||
      fwrite(tail, 1, sizeof tail, w->f) != sizeof tail || fflush(w->f) != 0)
    return loom_error(LOOM_ERR_IO, "cannot write '%s': %s", w->path,
                      strerror(errno));
  return LOOM_OK;
}

/* -------------------------------------------------------------- the API */

/* loom_fs_each_entry's visitor for file_stamp: the newest file's seconds. */
static bool stamp_entry(const char *name, void *ctx) {
  static const char prefix[] = "events.out.tfevents.";
  long long *stamp = ctx;
  if (strncmp(name, prefix, sizeof prefix - 1) != 0)
    return true;
  char *end;
  long long t = strtoll(name + sizeof prefix - 1, &end, 10);
  if (*end == '.' && t >= *stamp)
    *stamp = t + 1;
  return true;
}

/* The seconds in a new file's name: now, or one past the newest file of dir
 * when that is not older. TensorBoard reads a directory's files in the
 * order of their names, and a restart's purge (loom_tb_restart) works only
 * when its file comes after the files it purges: a restart within the
 * same second (its pid maybe smaller) would otherwise sort first. */
static long long file_stamp(const char *dir, long long now) {
  long long stamp = now;
  /* (the directory the user named: it may be a link) */
  (void)loom_fs_each_entry(AT_FDCWD, dir, true, stamp_entry, &stamp);
  return stamp;
}

loom_status loom_tb_open(loom_tb **out, const char *dir) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_tb_open: out is NULL");
  *out = NULL;
  if (!dir)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_tb_open: dir is NULL");
  LOOM_TRY(loom_fs_mkdirs(dir, 0755));
  loom_tb *w = loom_calloc(1, sizeof *w);
  if (!w)
    return LOOM_ERR_NOMEM;
  char host[64] = "localhost";
  if (gethostname(host, sizeof host) != 0)
    snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  for (char *c = host; *c; c++)
    if (*c == '/')
      *c = '_';
  double now = loom_time_wall();
  int n = snprintf(w->path, sizeof w->path,
                   "%s/events.out.tfevents.%lld.%s.%d.loom", dir,
                   file_stamp(dir, (long long)now), host, (int)getpid());
  if (n < 0 || (size_t)n >= sizeof w->path) {
    loom_free(w);
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "tensorboard: directory name too long: '%s'", dir);
  }
  /* A new file; a link planted in its place is refused. */
  loom_status s = loom_fs_open_append(w->path, true, &w->f);
  if (s == LOOM_OK) {
    w->len = 0;
    put_double(w, 1, now);
    static const char version[] = "brain.Event:2";
    put_bytes(w, 3, version, sizeof version - 1);
    s = write_record(w);
  }
  if (s != LOOM_OK) {
    loom_tb_close(w);
    return s;
  }
  *out = w;
  return LOOM_OK;
}

const char *loom_tb_path(const loom_tb *w) { return w ? w->path : ""; }

loom_status loom_tb_restart(loom_tb *w, int64_t step, double wall_time) {
  if (!w || step < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "tensorboard: bad arguments");
  static const unsigned char start[] = {0x08, 0x01}; /* status = START */
  w->len = 0;
  w->overflow = false;
  put_double(w, 1, wall_time);
  put_key(w, 2, 0);
  put_varint(w, (uint64_t)step);
  put_bytes(w, 7, start, sizeof start);
  return write_record(w);
}

loom_status loom_tb_scalars(loom_tb *w, int64_t step, double wall_time,
                            const char *const *tags, const float *values,
                            int n) {
  if (!w || n < 0 || (n > 0 && (!tags || !values)))
    return loom_error(LOOM_ERR_INVALID_ARG, "tensorboard: bad arguments");
  /* Sizes first: the summary's length comes before it. */
  size_t summary = 0;
  for (int i = 0; i < n; i++) {
    size_t value = value_len(strlen(tags[i]));
    summary += 1 + varint_len(value) + value;
  }
  w->len = 0;
  w->overflow = false;
  put_double(w, 1, wall_time);
  put_key(w, 2, 0);
  put_varint(w, (uint64_t)step);
  put_key(w, 5, 2);
  put_varint(w, summary);
  for (int i = 0; i < n; i++) {
    size_t t = strlen(tags[i]);
    put_key(w, 1, 2);
    put_varint(w, value_len(t));
    put_bytes(w, 1, tags[i], t);
    uint32_t u;
    memcpy(&u, &values[i], sizeof u);
    put_key(w, 2, 5);
    put_le(w, u, 4);
  }
  return write_record(w);
}

void loom_tb_close(loom_tb *w) {
  if (!w)
    return;
  if (w->f)
    fclose(w->f);
  loom_free(w->buf);
  loom_free(w);
}
