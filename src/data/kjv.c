/* The KJV preparation step: runs Debian's `bible`, strips the verse
 * references and caches the text (checked by size and CRC32C). */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define KJV_CRC32C LOOM_KJV_CRC32C

loom_kjv_opts loom_kjv_opts_default(void) {
  loom_kjv_opts o = {NULL, false, true};
  return o;
}

loom_status loom_data_dir(char *buf, size_t cap) {
  const char *d = getenv("LOOM_DATA_DIR");
  if (!d || !d[0])
    d = "data";
  int n = snprintf(buf, cap, "%s", d);
  if (n < 0 || (size_t)n >= cap)
    return loom_error(LOOM_ERR_INVALID_ARG, "data directory path too long: %s",
                      d);
  return LOOM_OK;
}

loom_status loom_kjv_default_path(char *buf, size_t cap) {
  char dir[4096];
  LOOM_TRY(loom_data_dir(dir, sizeof dir));
  int n = snprintf(buf, cap, "%s/kjv.txt", dir);
  if (n < 0 || (size_t)n >= cap)
    return loom_error(LOOM_ERR_INVALID_ARG, "path too long: %s/kjv.txt", dir);
  return LOOM_OK;
}

/* Size and CRC32C of an existing file; *exists false when there is none.
 * Read by the text reader: a FIFO or a directory at the path is an error
 * naming it (fopen waited forever on a FIFO). */
static loom_status file_sum(const char *path, bool *exists, int64_t *bytes,
                            uint32_t *crc) {
  *exists = false;
  *bytes = 0;
  *crc = 0;
  struct stat sb;
  if (stat(path, &sb) != 0 && errno == ENOENT)
    return LOOM_OK;
  uint8_t *data = NULL;
  LOOM_TRY(loom_text_read(path, &data, bytes));
  *exists = true;
  *crc = loom_crc32c(0, data, (size_t)*bytes);
  loom_free(data);
  return LOOM_OK;
}

/* A growing byte buffer on loom_malloc. */
typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static loom_status buf_reserve(buf *b, size_t extra) {
  if (b->n + extra <= b->cap)
    return LOOM_OK;
  size_t cap = b->cap ? b->cap : (size_t)8 << 20;
  while (cap < b->n + extra)
    cap *= 2;
  uint8_t *p = loom_malloc(cap);
  if (!p)
    return LOOM_ERR_NOMEM;
  if (b->n)
    memcpy(p, b->p, b->n);
  loom_free(b->p);
  b->p = p;
  b->cap = cap;
  return LOOM_OK;
}

/* Runs the bible program and collects its standard output. */
static loom_status run_bible(const char *program, buf *out) {
  /* -l100000: no line wrapping whatever COLUMNS says; -m: enough buffer
   * for the whole book in one pass. */
  char *argv[] = {(char *)program,   "-f", "-l100000", "-m", "8192",
                  "Gen1:1-Rev22:21", NULL};
  int fds[2];
  if (pipe(fds) != 0)
    return loom_error(LOOM_ERR_IO, "pipe: %s", strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  /* loom train blocks its stop signals in every thread but one (see
   * loom_trainer_catch_stop_signals): the program starts with none
   * blocked, so a Ctrl-C reaches it as usual. */
  posix_spawnattr_t at;
  posix_spawnattr_t *atp = NULL;
  if (posix_spawnattr_init(&at) == 0) {
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
    atp = &at;
  }
  pid_t pid;
  int e = strchr(program, '/')
              ? posix_spawn(&pid, program, &fa, atp, argv, environ)
              : posix_spawnp(&pid, program, &fa, atp, argv, environ);
  if (atp)
    posix_spawnattr_destroy(atp);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (e != 0) {
    close(fds[0]);
    if (e == ENOENT)
      return loom_error(LOOM_ERR_IO,
                        "the '%s' program was not found: install it with "
                        "'apt-get install %s' (or 'make deps')",
                        program, LOOM_KJV_PACKAGES);
    return loom_error(LOOM_ERR_IO, "cannot run %s: %s", program, strerror(e));
  }
  loom_status st = LOOM_OK;
  for (;;) {
    /* The text is 4 MB: a program that prints 16 times that is not the
     * bible program loom knows, and memory is not given to it. */
    if (out->n > (size_t)16 * LOOM_KJV_BYTES) {
      st = loom_error(LOOM_ERR_IO,
                      "%s printed more than %zu bytes: not the KJV text of "
                      "%s",
                      program, (size_t)16 * LOOM_KJV_BYTES, LOOM_KJV_PACKAGES);
      break;
    }
    if ((st = buf_reserve(out, 65536)) != LOOM_OK)
      break;
    ssize_t r = read(fds[0], out->p + out->n, out->cap - out->n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      st = loom_error(LOOM_ERR_IO, "reading the output of %s: %s", program,
                      strerror(errno));
      break;
    }
    if (r == 0)
      break;
    out->n += (size_t)r;
  }
  close(fds[0]);
  if (st != LOOM_OK)
    kill(pid, SIGTERM);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  if (st != LOOM_OK)
    return st;
  if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127)
    return loom_error(LOOM_ERR_IO,
                      "the '%s' program could not be run: install it with "
                      "'apt-get install %s' (or 'make deps')",
                      program, LOOM_KJV_PACKAGES);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || out->n == 0)
    return loom_error(LOOM_ERR_IO,
                      "'%s' failed (%s %d) and printed %zu bytes: is its text "
                      "installed? 'apt-get install %s' (or 'make deps')",
                      program, WIFEXITED(ws) ? "exit status" : "signal",
                      WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws), out->n,
                      LOOM_KJV_PACKAGES);
  return LOOM_OK;
}

/* Length of a verse reference and its space ("Ge1:1 ", "1Sm3:10 ",
 * "SSol2:1 "), or 0 when the line does not start with one. */
static size_t ref_len(const uint8_t *p, size_t n) {
  size_t i = 0;
  if (i < n && isdigit(p[i]))
    i++;
  size_t a = i;
  while (i < n && isalpha(p[i]))
    i++;
  if (i == a)
    return 0;
  a = i;
  while (i < n && isdigit(p[i]))
    i++;
  if (i == a || i >= n || p[i] != ':')
    return 0;
  a = ++i;
  while (i < n && isdigit(p[i]))
    i++;
  if (i == a || i >= n || p[i] != ' ')
    return 0;
  return i + 1;
}

/* Strips the references in place: raw (bible's output) becomes the text,
 * one verse per line. Blank lines are skipped; any other line without a
 * reference is an error (it would mean wrapped or reformatted output). */
static loom_status strip_refs(buf *raw, int64_t *verses) {
  size_t w = 0, line_no = 0;
  *verses = 0;
  for (size_t i = 0; i < raw->n;) {
    const uint8_t *nl = memchr(raw->p + i, '\n', raw->n - i);
    size_t end = nl ? (size_t)(nl - raw->p) : raw->n;
    size_t len = end - i;
    line_no++;
    if (len > 0) {
      size_t r = ref_len(raw->p + i, len);
      if (r == 0)
        return loom_error(LOOM_ERR_CORRUPT,
                          "bible output line %zu does not start with a verse "
                          "reference: '%.60s'",
                          line_no, (const char *)raw->p + i);
      for (size_t k = i + r; k < end; k++) {
        uint8_t c = raw->p[k];
        if (c >= 0x80 || (c < 0x20 && c != '\t'))
          return loom_error(LOOM_ERR_CORRUPT,
                            "bible output line %zu holds byte 0x%02x (ASCII "
                            "text expected)",
                            line_no, c);
      }
      memmove(raw->p + w, raw->p + i + r, len - r);
      w += len - r;
      raw->p[w++] = '\n';
      (*verses)++;
    }
    i = end + 1;
  }
  raw->n = w;
  return LOOM_OK;
}

loom_status loom_kjv_prepare(const char *path, const loom_kjv_opts *opts,
                             loom_kjv_info *info) {
  loom_kjv_opts o = opts ? *opts : loom_kjv_opts_default();
  loom_kjv_info tmp_info;
  if (!info)
    info = &tmp_info;
  memset(info, 0, sizeof *info);
  char def[4096];
  if (!path || !path[0]) {
    LOOM_TRY(loom_kjv_default_path(def, sizeof def));
    path = def;
  }
  const char *program = o.program && o.program[0] ? o.program : "bible";

  bool exists = false;
  int64_t bytes = 0;
  uint32_t crc = 0;
  if (!o.force) {
    LOOM_TRY(file_sum(path, &exists, &bytes, &crc));
    bool valid =
        o.verify ? bytes == LOOM_KJV_BYTES && crc == KJV_CRC32C : bytes > 0;
    if (exists && valid) {
      info->bytes = bytes;
      info->crc32c = crc;
      info->cached = true;
      return LOOM_OK;
    }
    if (exists)
      LOOM_WARN("%s: %lld bytes, CRC32C %08x: not the KJV text loom expects "
                "(%d bytes, %08x); preparing it again",
                path, (long long)bytes, crc, LOOM_KJV_BYTES, KJV_CRC32C);
  }

  buf raw = {0};
  int64_t verses = 0;
  loom_status st = LOOM_OK;
  LOOM_TRY_GOTO(st, run_bible(program, &raw), done);
  LOOM_TRY_GOTO(st, strip_refs(&raw, &verses), done);
  crc = loom_crc32c(0, raw.p, raw.n);
  info->verses = verses;
  info->bytes = (int64_t)raw.n;
  info->crc32c = crc;
  if (o.verify && (verses != LOOM_KJV_VERSES ||
                   (int64_t)raw.n != LOOM_KJV_BYTES || crc != KJV_CRC32C)) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "'%s' printed %lld verses, %zu bytes of text (CRC32C "
                    "%08x); loom expects %d verses, %d bytes (%08x), as "
                    "bible-kjv-text 4.38 gives. Another version of the text? "
                    "(loom data kjv --no-verify accepts it)",
                    program, (long long)verses, raw.n, crc, LOOM_KJV_VERSES,
                    LOOM_KJV_BYTES, KJV_CRC32C);
    goto done;
  }
  LOOM_TRY_GOTO(st, loom_data_write_atomic(path, raw.p, raw.n), done);
done:
  loom_free(raw.p);
  return st;
}
