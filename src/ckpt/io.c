/* Checkpoint plumbing: the shard file codec, file-system calls behind the
 * fault hook, directory helpers, the `latest` pointer, listing, damage. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"

/* ------------------------------------------------------------ byte codec */

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

void loom_ckpt_header_encode(unsigned char out[CKPT_HEADER_BYTES],
                             const ckpt_header *h) {
  memset(out, 0, CKPT_HEADER_BYTES);
  /* The format holds 8 magic bytes, no NUL. */
  // NOLINTNEXTLINE(bugprone-not-null-terminated-result)
  memcpy(out, CKPT_SHARD_MAGIC, 8);
  put_u32(out + 8, h->version);
  put_u32(out + 12, h->rank);
  put_u32(out + 16, h->world);
  put_u32(out + 20, h->n_blocks);
  put_u64(out + 24, (uint64_t)h->step);
  put_u64(out + 32, (uint64_t)h->index_offset);
  put_u32(out + 60, loom_crc32c(0, out, 60));
}

loom_status loom_ckpt_header_decode(const unsigned char in[CKPT_HEADER_BYTES],
                                    ckpt_header *h) {
  if (memcmp(in, CKPT_SHARD_MAGIC, 8) != 0)
    return loom_error(LOOM_ERR_CORRUPT, "not a loom shard file (bad magic)");
  if (get_u32(in + 60) != loom_crc32c(0, in, 60))
    return loom_error(LOOM_ERR_CORRUPT, "header checksum mismatch");
  h->version = get_u32(in + 8);
  h->rank = get_u32(in + 12);
  h->world = get_u32(in + 16);
  h->n_blocks = get_u32(in + 20);
  h->step = (int64_t)get_u64(in + 24);
  h->index_offset = (int64_t)get_u64(in + 32);
  if (h->version != LOOM_CKPT_FORMAT_VERSION)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "shard format version %u (this loom reads %d)",
                      h->version, LOOM_CKPT_FORMAT_VERSION);
  return LOOM_OK;
}

void loom_ckpt_entry_encode(unsigned char out[CKPT_ENTRY_BYTES],
                            const ckpt_entry *e) {
  memset(out, 0, CKPT_ENTRY_BYTES);
  memcpy(out, e->name, strnlen(e->name, LOOM_CKPT_NAME_MAX - 1));
  const char *dt = loom_dtype_name(e->dtype);
  memcpy(out + 32, dt, strnlen(dt, 7));
  put_u32(out + 40, e->crc);
  put_u64(out + 48, (uint64_t)e->total);
  put_u64(out + 56, (uint64_t)e->begin);
  put_u64(out + 64, (uint64_t)e->count);
  put_u64(out + 72, (uint64_t)e->offset);
}

loom_status loom_ckpt_entry_decode(const unsigned char in[CKPT_ENTRY_BYTES],
                                   ckpt_entry *e) {
  memset(e, 0, sizeof *e);
  memcpy(e->name, in, LOOM_CKPT_NAME_MAX - 1);
  char dt[9] = {0};
  memcpy(dt, in + 32, 8);
  if (!loom_ckpt_name_ok(e->name))
    return loom_error(LOOM_ERR_CORRUPT, "bad buffer name in block index");
  if (loom_dtype_parse(dt, &e->dtype) != LOOM_OK)
    return loom_error(LOOM_ERR_CORRUPT, "unknown dtype in block index");
  e->crc = get_u32(in + 40);
  e->total = (int64_t)get_u64(in + 48);
  e->begin = (int64_t)get_u64(in + 56);
  e->count = (int64_t)get_u64(in + 64);
  e->offset = (int64_t)get_u64(in + 72);
  if (e->total < 0 || e->begin < 0 || e->count < 0 || e->offset < 0 ||
      e->begin > e->total || e->count > e->total - e->begin)
    return loom_error(LOOM_ERR_CORRUPT, "bad range in block index");
  return LOOM_OK;
}

void loom_ckpt_footer_encode(unsigned char out[CKPT_FOOTER_BYTES],
                             const ckpt_footer *f) {
  memset(out, 0, CKPT_FOOTER_BYTES);
  /* The format holds 8 magic bytes, no NUL. */
  // NOLINTNEXTLINE(bugprone-not-null-terminated-result)
  memcpy(out, CKPT_FOOTER_MAGIC, 8);
  put_u64(out + 8, (uint64_t)f->index_offset);
  put_u32(out + 16, f->n_blocks);
  put_u32(out + 20, f->index_crc);
  put_u32(out + 28, loom_crc32c(0, out, 28));
}

loom_status loom_ckpt_footer_decode(const unsigned char in[CKPT_FOOTER_BYTES],
                                    ckpt_footer *f) {
  if (memcmp(in, CKPT_FOOTER_MAGIC, 8) != 0)
    return loom_error(LOOM_ERR_CORRUPT, "no block index at the end (bad "
                                        "footer magic)");
  if (get_u32(in + 28) != loom_crc32c(0, in, 28))
    return loom_error(LOOM_ERR_CORRUPT, "footer checksum mismatch");
  f->index_offset = (int64_t)get_u64(in + 8);
  f->n_blocks = get_u32(in + 16);
  f->index_crc = get_u32(in + 20);
  return LOOM_OK;
}

bool loom_ckpt_name_ok(const char *name) {
  size_t n = strnlen(name, LOOM_CKPT_NAME_MAX);
  if (n == 0 || n >= LOOM_CKPT_NAME_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

bool loom_ckpt_parse_step_name(const char *name, int64_t *step) {
  if (strncmp(name, "step_", 5) != 0)
    return false;
  const char *p = name + 5;
  size_t n = strlen(p);
  if (n == 0 || n > 18)
    return false;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9')
      return false;
    v = v * 10 + (p[i] - '0');
  }
  *step = v;
  return true;
}

/* ------------------------------------------------------------ fault hook */

static atomic_long io_calls;
static atomic_long io_fail_at; /* absolute call number; 0 = never */
static atomic_int io_fail_errno;

void loom_ckpt_fail_io_after(long n, int err) {
  atomic_store(&io_fail_errno, err ? err : EIO);
  atomic_store(&io_fail_at, n > 0 ? atomic_load(&io_calls) + n : 0);
}

long loom_ckpt_io_count(void) { return atomic_load(&io_calls); }

/* True when this call is the one to fail (errno is then set). */
static bool io_fault(void) {
  long call = atomic_fetch_add(&io_calls, 1) + 1;
  long f = atomic_load(&io_fail_at);
  if (f != 0 && call == f) {
    errno = atomic_load(&io_fail_errno);
    return true;
  }
  return false;
}

int loom_ckpt_io_open_write_at(int dirfd, const char *name) {
  if (io_fault())
    return -1;
  /* Never through a link or into a hard-linked file planted in its place. */
  return loom_fs_open_write_at(dirfd, name, O_TRUNC, 0644);
}

int loom_ckpt_io_pwrite_all(int fd, const void *buf, size_t n, int64_t off) {
  if (io_fault())
    return -1;
  const char *p = buf;
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
    ssize_t w = pwrite(fd, p, chunk, (off_t)off);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (w == 0) {
      errno = EIO;
      return -1;
    }
    p += w;
    off += w;
    n -= (size_t)w;
  }
  return 0;
}

int loom_ckpt_io_fsync(int fd) {
  if (io_fault())
    return -1;
  return fsync(fd);
}

int loom_ckpt_io_close(int fd) {
  if (io_fault()) {
    int e = errno;
    close(fd); /* the descriptor is gone either way */
    errno = e;
    return -1;
  }
  return close(fd);
}

int loom_ckpt_io_mkdir(const char *path) {
  if (io_fault())
    return -1;
  return mkdir(path, 0755);
}

int loom_ckpt_io_rename(const char *from, const char *to) {
  if (io_fault())
    return -1;
  return rename(from, to);
}

int loom_ckpt_io_exchange(const char *a, const char *b) {
  if (io_fault())
    return -1;
  return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

/* ----------------------------------------------------------- directories */

loom_status loom_ckpt_mkdirs(const char *path) {
  return loom_fs_mkdirs_hooked(path, 0755, io_fault);
}

loom_status loom_ckpt_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot open directory: %s", path,
                      strerror(errno));
  if (loom_ckpt_io_fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return loom_error(LOOM_ERR_IO, "%s: fsync of directory failed: %s", path,
                      strerror(e));
  }
  close(fd);
  return LOOM_OK;
}

/* "<prefix><digits><suffix>" with at least `min` digits; *v the number. */
static bool digits_between(const char *name, const char *prefix,
                           const char *suffix, size_t min, long long *v) {
  size_t pl = strlen(prefix), sl = strlen(suffix), n = strlen(name);
  if (n < pl + sl + min || strncmp(name, prefix, pl) != 0 ||
      strcmp(name + n - sl, suffix) != 0 || n - pl - sl > 18)
    return false;
  long long x = 0;
  for (size_t i = pl; i < n - sl; i++) {
    if (name[i] < '0' || name[i] > '9')
      return false;
    x = x * 10 + (name[i] - '0');
  }
  if (v)
    *v = x;
  return true;
}

/* The names loom writes, exactly as it writes them: step_%08lld,
 * .step_%08lld.tmp and .step_%08lld.old (so "step_1" or "step_x" are not
 * loom's, whatever loom_ckpt_parse_step_name reads from them). */
bool loom_ckpt_own_dir_name(const char *name, int64_t *step, int *kind) {
  static const char *const suffix[] = {"", ".tmp", ".old"};
  for (int k = 0; k < 3; k++) {
    long long v;
    if (!digits_between(name, k ? ".step_" : "step_", suffix[k], 8, &v))
      continue;
    char canon[64];
    snprintf(canon, sizeof canon, "%sstep_%08lld%s", k ? "." : "", v,
             suffix[k]);
    if (strcmp(canon, name) != 0)
      continue;
    if (step)
      *step = v;
    if (kind)
      *kind = k;
    return true;
  }
  return false;
}

/* Inside a step directory: the manifest, its temporary, the shards. */
static bool own_file_name(const char *name) {
  return strcmp(name, CKPT_MANIFEST) == 0 ||
         strcmp(name, "." CKPT_MANIFEST ".tmp") == 0 ||
         digits_between(name, "." CKPT_MANIFEST ".tmp.", "", 1, NULL) ||
         digits_between(name, "shard_", ".bin", 5, NULL);
}

bool loom_ckpt_stale_latest_tmp(const char *name) {
  long long pid;
  if (strcmp(name, "." CKPT_LATEST ".tmp") == 0)
    return true;
  return digits_between(name, "." CKPT_LATEST ".tmp.", "", 1, &pid) &&
         pid != (long long)getpid();
}

static bool ckpt_own(const char *name, bool is_dir, int depth, void *ctx) {
  (void)ctx;
  if (depth == 0)
    return is_dir ? loom_ckpt_own_dir_name(name, NULL, NULL)
                  : loom_ckpt_stale_latest_tmp(name);
  return depth == 1 && !is_dir && own_file_name(name);
}

int loom_ckpt_open_root(const char *root) {
  int fd = loom_fs_open_dir(root);
  if (fd < 0 && errno != ENOENT)
    LOOM_WARN("checkpoint directory %s: %s; loom deletes nothing in it "
              "(name the directory itself in checkpoint.dir)",
              root,
              errno == ELOOP || errno == ENOTDIR
                  ? "a symbolic link or not a directory"
                  : strerror(errno));
  return fd;
}

int loom_ckpt_remove_as(int rootfd, const char *root, const char *name,
                        const char *as) {
  char shown[CKPT_PATH_MAX];
  snprintf(shown, sizeof shown, "%s/%s", root, as);
  int left = 0;
  loom_fs_remove_own(rootfd, name, shown, ckpt_own, NULL, &left);
  return left;
}

int loom_ckpt_remove_at(int rootfd, const char *root, const char *name) {
  return loom_ckpt_remove_as(rootfd, root, name, name);
}

void loom_ckpt_remove(const char *root, const char *name) {
  int fd = loom_ckpt_open_root(root);
  if (fd < 0)
    return;
  loom_ckpt_remove_at(fd, root, name);
  close(fd);
}

loom_status loom_ckpt_write_file_atomic(const char *dir, const char *name,
                                        const void *data, size_t n) {
  return loom_fs_write_atomic_hooked(dir, name, data, n, io_fault);
}

loom_status loom_ckpt_write_file_atomic_at(int dfd, const char *dir,
                                           const char *name, const void *data,
                                           size_t n) {
  return loom_fs_write_atomic_at(dfd, dir, name, data, n, io_fault);
}

loom_status loom_ckpt_pread_all(int fd, void *buf, size_t n, int64_t off,
                                const char *path) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return loom_error(LOOM_ERR_IO, "%s: read failed at byte %lld: %s", path,
                        (long long)off, strerror(errno));
    }
    if (r == 0)
      return loom_error(LOOM_ERR_CORRUPT,
                        "%s: truncated (ends before byte "
                        "%lld)",
                        path, (long long)off + (long long)n);
    p += r;
    off += r;
    n -= (size_t)r;
  }
  return LOOM_OK;
}

loom_status loom_ckpt_open_read(const char *path, int *fd) {
  /* Never blocks on a FIFO; refuses what is not a regular file. */
  *fd = loom_fs_open_read_at(AT_FDCWD, path, 0, NULL);
  if (*fd >= 0)
    return LOOM_OK;
  int e = errno;
  return loom_error(e == ENOENT || e == LOOM_FS_ENOTREG ? LOOM_ERR_CORRUPT
                                                        : LOOM_ERR_IO,
                    "%s: %s", path,
                    e == ENOENT            ? "missing"
                    : e == LOOM_FS_ENOTREG ? "not a regular file"
                                           : strerror(e));
}

loom_status loom_ckpt_read_file(const char *path, size_t max, char **out,
                                size_t *len) {
  *out = NULL;
  int fd;
  LOOM_TRY(loom_ckpt_open_read(path, &fd));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return loom_error(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
  }
  if ((uint64_t)st.st_size > max) {
    close(fd);
    return loom_error(LOOM_ERR_CORRUPT, "%s: too large (%lld bytes)", path,
                      (long long)st.st_size);
  }
  size_t n = (size_t)st.st_size;
  char *buf = loom_malloc(n + 1);
  if (!buf) {
    close(fd);
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory reading it", path);
  }
  loom_status s = loom_ckpt_pread_all(fd, buf, n, 0, path);
  close(fd);
  if (s != LOOM_OK) {
    loom_free(buf);
    return s;
  }
  buf[n] = '\0';
  *out = buf;
  if (len)
    *len = n;
  return LOOM_OK;
}

/* ------------------------------------------------------- JSON syntax */

/* A JSON syntax check that allocates nothing, so that a cJSON parse that
 * fails on text that passes it is known to be out of memory. */
typedef struct jscan {
  const char *p, *end;
  int depth;
} jscan;

static void js_ws(jscan *j) {
  while (j->p < j->end &&
         (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static bool js_lit(jscan *j, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
    return false;
  j->p += n;
  return true;
}

static bool js_string(jscan *j) {
  if (j->p >= j->end || *j->p != '"')
    return false;
  for (j->p++; j->p < j->end; j->p++) {
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      return true;
    }
    if (c < 0x20)
      return false;
    if (c == '\\') {
      if (++j->p >= j->end)
        return false;
      if (*j->p == 'u') {
        for (int i = 0; i < 4; i++)
          if (++j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p))
            return false;
      } else if (!strchr("\"\\/bfnrt", *j->p)) {
        return false;
      }
    }
  }
  return false;
}

static bool js_digits(jscan *j) {
  const char *start = j->p;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
    j->p++;
  return j->p > start;
}

static bool js_number(jscan *j) {
  if (j->p < j->end && *j->p == '-')
    j->p++;
  if (j->p < j->end && *j->p == '0')
    j->p++;
  else if (!js_digits(j))
    return false;
  if (j->p < j->end && *j->p == '.') {
    j->p++;
    if (!js_digits(j))
      return false;
  }
  if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
      j->p++;
    if (!js_digits(j))
      return false;
  }
  return true;
}

static bool js_value(jscan *j) {
  js_ws(j);
  if (j->p >= j->end || ++j->depth > 1000)
    return false;
  bool ok;
  char c = *j->p;
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->p++;
    js_ws(j);
    if (j->p < j->end && *j->p == close) {
      j->p++;
      ok = true;
    } else {
      for (;;) {
        if (c == '{') {
          js_ws(j);
          if (!js_string(j))
            return false;
          js_ws(j);
          if (j->p >= j->end || *j->p++ != ':')
            return false;
        }
        if (!js_value(j))
          return false;
        js_ws(j);
        if (j->p < j->end && *j->p == ',') {
          j->p++;
          continue;
        }
        ok = j->p < j->end && *j->p++ == close;
        break;
      }
    }
  } else if (c == '"') {
    ok = js_string(j);
  } else if (c == 't') {
    ok = js_lit(j, "true");
  } else if (c == 'f') {
    ok = js_lit(j, "false");
  } else if (c == 'n') {
    ok = js_lit(j, "null");
  } else {
    ok = js_number(j);
  }
  j->depth--;
  return ok;
}

bool loom_ckpt_json_object_ok(const char *s, size_t n) {
  jscan j = {s, s + n, 0};
  js_ws(&j);
  if (j.p >= j.end || *j.p != '{' || !js_value(&j))
    return false;
  js_ws(&j);
  return j.p == j.end;
}

static void *json_malloc(size_t n) { return loom_malloc(n); }
static void json_free(void *p) { loom_free(p); }
static pthread_once_t json_once = PTHREAD_ONCE_INIT;
static void json_hooks(void) {
  cJSON_Hooks h = {json_malloc, json_free};
  cJSON_InitHooks(&h);
}

void loom_ckpt_json_init(void) { pthread_once(&json_once, json_hooks); }

/* ---------------------------------------------------- the directory API */

loom_status loom_ckpt_dir_name(const char *root, int64_t step, char *buf,
                               size_t n) {
  if (!root || !buf || step < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_dir_name: bad argument");
  int w = snprintf(buf, n, "%s/step_%08lld", root, (long long)step);
  if (w < 0 || (size_t)w >= n)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", root);
  return LOOM_OK;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

typedef struct step_list {
  int64_t *v;
  int cnt, cap;
  bool nomem;
} step_list;

static bool list_step(const char *name, void *ctx) {
  step_list *l = ctx;
  int64_t s;
  if (!loom_ckpt_parse_step_name(name, &s))
    return true;
  if (l->cnt == l->cap) {
    int nc = l->cap ? l->cap * 2 : 16;
    int64_t *nv = loom_malloc((size_t)nc * sizeof *nv);
    if (!nv) {
      l->nomem = true;
      return false;
    }
    if (l->v)
      memcpy(nv, l->v, (size_t)l->cnt * sizeof *nv);
    loom_free(l->v);
    l->v = nv;
    l->cap = nc;
  }
  l->v[l->cnt++] = s;
  return true;
}

loom_status loom_ckpt_list(const char *root, int64_t **steps, int *n) {
  if (!root || !steps || !n)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_list: NULL argument");
  *steps = NULL;
  *n = 0;
  /* Reading: a checkpoint.dir that is a link to a directory is listed (it
   * is never deleted through, see loom_ckpt_open_root). */
  step_list l = {0};
  if (loom_fs_each_entry(AT_FDCWD, root, true, list_step, &l) != 0) {
    if (errno == ENOENT)
      return LOOM_OK;
    return loom_error(LOOM_ERR_IO, "%s: cannot list: %s", root,
                      strerror(errno));
  }
  if (l.nomem) {
    loom_free(l.v);
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory listing", root);
  }
  if (l.cnt)
    qsort(l.v, (size_t)l.cnt, sizeof *l.v, cmp_i64);
  *steps = l.v;
  *n = l.cnt;
  return LOOM_OK;
}

static bool no_step_name(const char *name, void *ctx) {
  bool *any = ctx;
  *any = strncmp(name, "step_", 5) == 0;
  return !*any;
}

bool loom_ckpt_has_step_dirs(const char *root) {
  bool any = false;
  if (root)
    loom_fs_each_entry(AT_FDCWD, root, true, no_step_name, &any);
  return any;
}

loom_status loom_ckpt_read_latest(const char *root, int64_t *step) {
  if (!root || !step)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_read_latest: %s is NULL",
                      root ? "step" : "root");
  char path[CKPT_PATH_MAX];
  int w = snprintf(path, sizeof path, "%s/%s", root, CKPT_LATEST);
  if (w < 0 || (size_t)w >= sizeof path)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", root);
  /* Not through a link: `latest` is loom's file in loom's directory (and a
   * FIFO planted there would block the read). */
  int fd = loom_fs_open_read_at(AT_FDCWD, path, O_NOFOLLOW, NULL);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s: %s", path,
                      errno == ENOENT  ? "missing"
                      : errno == ELOOP ? "a symbolic link, not followed"
                      : errno == LOOM_FS_ENOTREG ? "not a regular file"
                                                 : strerror(errno));
  char buf[64];
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r < 0)
    return loom_error(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
  buf[r] = '\0';
  size_t len = (size_t)r;
  if (len > 0 && buf[len - 1] == '\n')
    buf[--len] = '\0';
  if (!loom_ckpt_parse_step_name(buf, step))
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: does not name a checkpoint "
                      "(expected step_NNNNNNNN)",
                      path);
  return LOOM_OK;
}

/* ---------------------------------------------------------------- strategy */

static const char *const strategy_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_CKPT_STRATEGY_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof strategy_names / sizeof strategy_names[0] ==
                   LOOM_CKPT_STRATEGY_COUNT,
               "strategy table size");

const char *loom_ckpt_strategy_name(loom_ckpt_strategy s) {
  return (unsigned)s < LOOM_CKPT_STRATEGY_COUNT ? strategy_names[s] : "?";
}

loom_status loom_ckpt_strategy_parse(const char *s, loom_ckpt_strategy *out) {
  int i = 0;
  LOOM_TRY(loom_name_parse(s, strategy_names, LOOM_CKPT_STRATEGY_COUNT,
                           "strategy", &i));
  if (out)
    *out = (loom_ckpt_strategy)i;
  return LOOM_OK;
}

/* ------------------------------------------------------------------ damage */

static const char *const damage_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_CKPT_DAMAGE_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof damage_names / sizeof damage_names[0] ==
                   LOOM_CKPT_DAMAGE_COUNT,
               "damage table size");

const char *loom_ckpt_damage_name(loom_ckpt_damage_kind k) {
  return (unsigned)k < LOOM_CKPT_DAMAGE_COUNT ? damage_names[k] : "?";
}

loom_status loom_ckpt_damage_parse(const char *s, loom_ckpt_damage_kind *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_damage_parse: NULL out");
  int i = 0;
  LOOM_TRY(
      loom_name_parse(s, damage_names, LOOM_CKPT_DAMAGE_COUNT, "damage", &i));
  if (out)
    *out = (loom_ckpt_damage_kind)i;
  return LOOM_OK;
}

static bool damage_own(const char *name, bool is_dir, int depth, void *ctx) {
  return depth == 0 && !is_dir && strcmp(name, (const char *)ctx) == 0;
}

/* Deletes loom's own file dir/name through the one removal helper: never a
 * link in its place, never through a directory that is a link. */
static loom_status damage_remove(const char *dir, const char *name) {
  char shown[CKPT_PATH_MAX];
  int w = snprintf(shown, sizeof shown, "%s/%s", dir, name);
  if (w < 0 || (size_t)w >= sizeof shown)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", dir);
  int dfd = loom_fs_open_dir(dir);
  if (dfd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot delete: %s", shown,
                      strerror(errno));
  struct stat sb;
  loom_status st = LOOM_OK;
  int left = 0;
  if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
    st = loom_error(LOOM_ERR_IO, "%s: cannot delete: %s", shown,
                    strerror(errno));
  else if ((st = loom_fs_remove_own(dfd, name, shown, damage_own, (void *)name,
                                    &left)) == LOOM_OK &&
           left > 0)
    st = loom_error(LOOM_ERR_IO, "%s: not deleted (see the warning above)",
                    shown);
  close(dfd);
  return st;
}

loom_status loom_ckpt_damage(const char *dir, loom_ckpt_damage_kind kind,
                             int rank) {
  char path[CKPT_PATH_MAX];
  if (!dir)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_damage: NULL dir");
  if (kind == LOOM_CKPT_DAMAGE_MANIFEST)
    return damage_remove(dir, CKPT_MANIFEST);
  if (kind == LOOM_CKPT_DAMAGE_LATEST) {
    char parent[CKPT_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/')
      parent[--n] = '\0';
    char *slash = strrchr(parent, '/');
    if (slash)
      *slash = '\0';
    else
      snprintf(parent, sizeof parent, ".");
    return damage_remove(parent, CKPT_LATEST);
  }
  snprintf(path, sizeof path, "%s/shard_%05d.bin", dir, rank);
  /* Damages loom's own shard, never a file a link there points to. */
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot open: %s", path,
                      strerror(errno));
  struct stat st;
  loom_status s = LOOM_OK;
  if (fstat(fd, &st) != 0) {
    s = loom_error(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
  } else if (kind == LOOM_CKPT_DAMAGE_TRUNCATE) {
    if (ftruncate(fd, st.st_size / 2) != 0)
      s = loom_error(LOOM_ERR_IO, "%s: cannot truncate: %s", path,
                     strerror(errno));
  } else if (kind == LOOM_CKPT_DAMAGE_FLIP) {
    /* The first payload byte: always data, never padding. */
    unsigned char b;
    off_t at = CKPT_HEADER_BYTES;
    if (st.st_size <= CKPT_HEADER_BYTES + CKPT_FOOTER_BYTES ||
        pread(fd, &b, 1, at) != 1) {
      s = loom_error(LOOM_ERR_IO, "%s: nothing to flip", path);
    } else {
      b ^= 0x10;
      if (pwrite(fd, &b, 1, at) != 1)
        s = loom_error(LOOM_ERR_IO, "%s: cannot write: %s", path,
                       strerror(errno));
    }
  } else {
    s = loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_damage: kind %d",
                   (int)kind);
  }
  close(fd);
  return s;
}
