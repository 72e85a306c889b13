/* Hostfiles (Open MPI's syntax, plus MPICH's host:N): a strict parser over a
 * buffer, and the reader of the file. */
#include "hostfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/core.h"

static bool is_blank(char c) { return c == ' ' || c == '\t'; }

static bool is_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9');
}

/* RFC 1123: dot-separated labels of 1..63 letters, digits and hyphens, not
 * beginning or ending with a hyphen; 253 characters in all. IPv4 addresses
 * pass as such names. */
static const char *host_name_error(const char *s, size_t n) {
  if (n == 0)
    return "an empty host name";
  if (n > LOOM_HOSTFILE_NAME_MAX)
    return "a host name longer than 253 characters";
  size_t label = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '.') {
      if (label == 0 || s[i - 1] == '-')
        return "a host name with an empty label or a label ending in '-'";
      label = 0;
      continue;
    }
    if (!is_alnum(c) && c != '-')
      return "a host name with a character other than letters, digits, '-' "
             "and '.'";
    if (c == '-' && label == 0)
      return "a host name with a label starting with '-'";
    if (++label > 63)
      return "a host name with a label longer than 63 characters";
  }
  if (label == 0 || s[n - 1] == '-')
    return "a host name with an empty label or a label ending in '-'";
  /* Digits and dots alone: an IPv4 address, each of its 4 parts 0..255. */
  bool numeric = true;
  int dots = 0;
  for (size_t i = 0; i < n && numeric; i++) {
    numeric = s[i] == '.' || (s[i] >= '0' && s[i] <= '9');
    dots += s[i] == '.';
  }
  if (numeric) {
    if (dots != 3)
      return "an IPv4 address without 4 parts";
    long part = 0;
    for (size_t i = 0; i <= n; i++) {
      if (i == n || s[i] == '.') {
        if (part > 255)
          return "an IPv4 address with a part over 255";
        part = 0;
      } else if ((part = part * 10 + (s[i] - '0')) > 255) {
        return "an IPv4 address with a part over 255";
      }
    }
  }
  return NULL;
}

/* A count in [1, LOOM_HOSTFILE_MAX_SLOTS]: digits only. */
static bool parse_count(const char *s, size_t n, int *out) {
  if (n == 0 || n > 9)
    return false;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (s[i] - '0');
  }
  if (v < 1 || v > LOOM_HOSTFILE_MAX_SLOTS)
    return false;
  *out = (int)v;
  return true;
}

static loom_status bad_line(const char *path, int line, const char *why,
                            const char *tok, size_t tok_n) {
  if (tok_n > 64)
    tok_n = 64;
  if (tok)
    return loom_error(LOOM_ERR_CONFIG, "%s: line %d: %s: '%.*s'", path, line,
                      why, (int)tok_n, tok);
  return loom_error(LOOM_ERR_CONFIG, "%s: line %d: %s", path, line, why);
}

static loom_status bad_count(const char *path, int line, const char *tok,
                             size_t tok_n) {
  if (tok_n > 64)
    tok_n = 64;
  return loom_error(LOOM_ERR_CONFIG,
                    "%s: line %d: '%.*s': slots must be a whole number from 1 "
                    "to %d",
                    path, line, (int)tok_n, tok, LOOM_HOSTFILE_MAX_SLOTS);
}

/* A host named so far: where its name lies in the buffer, and its line. */
typedef struct seen_host {
  const char *name;
  size_t len;
  int line;
} seen_host;

/* Host names compare as DNS compares them: without regard to case. */
static bool same_name(const char *a, size_t an, const char *b, size_t bn) {
  if (an != bn)
    return false;
  for (size_t i = 0; i < an; i++) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z')
      x = (char)(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z')
      y = (char)(y - 'A' + 'a');
    if (x != y)
      return false;
  }
  return true;
}

/* One line without its newline and comment; seen[0..*hosts) holds the
 * hosts of the lines before. */
static loom_status parse_line(const char *path, int line, const char *s,
                              size_t n, loom_hostfile_add_fn add, void *ctx,
                              seen_host *seen, int *hosts) {
  size_t i = 0;
  while (i < n && is_blank(s[i]))
    i++;
  if (i == n)
    return LOOM_OK;
  const char *name = s + i;
  while (i < n && !is_blank(s[i]))
    i++;
  size_t name_n = (size_t)(s + i - name);
  int slots = 0, max_slots = 0;
  const char *colon = memchr(name, ':', name_n);
  if (colon) {
    size_t k = name_n - (size_t)(colon + 1 - name);
    if (memchr(colon + 1, ':', k))
      return bad_line(path, line, "more than one ':' (write host:N)", name,
                      name_n);
    if (!parse_count(colon + 1, k, &slots))
      return bad_count(path, line, name, name_n);
    name_n = (size_t)(colon - name);
  }
  const char *why = host_name_error(name, name_n);
  if (why)
    return bad_line(path, line, why, name, name_n);
  while (i < n) {
    while (i < n && is_blank(s[i]))
      i++;
    if (i == n)
      break;
    /* key=N, with blanks around '=' allowed (as Open MPI allows them) */
    const char *tok = s + i;
    while (i < n && !is_blank(s[i]) && s[i] != '=')
      i++;
    size_t key_n = (size_t)(s + i - tok);
    size_t j = i;
    while (j < n && is_blank(s[j]))
      j++;
    if (j == n || s[j] != '=') {
      while (i < n && !is_blank(s[i]))
        i++;
      return bad_line(path, line,
                      "more than one host on a line (one host per line, then "
                      "slots=N)",
                      tok, (size_t)(s + i - tok));
    }
    j++;
    while (j < n && is_blank(s[j]))
      j++;
    const char *val = s + j;
    while (j < n && !is_blank(s[j]))
      j++;
    size_t val_n = (size_t)(s + j - val);
    i = j;
    size_t tok_n = (size_t)(s + j - tok);
    int *dst = NULL;
    if (key_n == 5 && memcmp(tok, "slots", 5) == 0)
      dst = &slots;
    else if (key_n == 9 && (memcmp(tok, "max_slots", 9) == 0 ||
                            memcmp(tok, "max-slots", 9) == 0))
      dst = &max_slots;
    else
      return bad_line(path, line,
                      "unknown key (a host line takes slots=N and "
                      "max_slots=N)",
                      tok, tok_n);
    if (*dst)
      return bad_line(path, line, "slots given twice", tok, tok_n);
    if (!parse_count(val, val_n, dst))
      return bad_count(path, line, tok, tok_n);
  }
  if (slots == 0)
    slots = 1;
  if (max_slots && max_slots < slots)
    return loom_error(LOOM_ERR_CONFIG,
                      "%s: line %d: max_slots=%d is below slots=%d", path, line,
                      max_slots, slots);
  if (*hosts >= LOOM_HOSTFILE_MAX_HOSTS)
    return loom_error(LOOM_ERR_CONFIG, "%s: line %d: more than %d hosts", path,
                      line, LOOM_HOSTFILE_MAX_HOSTS);
  /* mpirun refuses a host listed twice, and a refusal at launch would be
   * a failed attempt that loom run restarts (the same way each time). The
   * names are compared as written: two names of one machine (localhost and
   * 127.0.0.1) are not caught here. */
  for (int k = 0; k < *hosts; k++)
    if (same_name(seen[k].name, seen[k].len, name, name_n)) {
      if (name_n > 64)
        name_n = 64;
      return loom_error(LOOM_ERR_CONFIG,
                        "%s: line %d: host '%.*s' is already on line %d (one "
                        "line per host, with all its slots: 'host slots=N')",
                        path, line, (int)name_n, name, seen[k].line);
    }
  seen[*hosts] = (seen_host){name, name_n, line};
  if (add && add(ctx, name, name_n, slots) != 0)
    return loom_error(LOOM_ERR_NOMEM, "%s: line %d: out of memory", path, line);
  (*hosts)++;
  return LOOM_OK;
}

loom_status loom_hostfile_parse(const char *path, const char *buf, size_t n,
                                loom_hostfile_add_fn add, void *ctx) {
  if (!path)
    path = "hostfile";
  if (!buf && n)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_hostfile_parse: NULL");
  seen_host *seen = loom_malloc(LOOM_HOSTFILE_MAX_HOSTS * sizeof *seen);
  if (!seen)
    return loom_error(LOOM_ERR_NOMEM, "%s: parsing the hostfile", path);
  loom_status st = LOOM_OK;
  int hosts = 0, line = 0;
  size_t at = 0;
  while (at < n && st == LOOM_OK) {
    line++;
    const char *s = buf + at;
    const char *nl = memchr(s, '\n', n - at);
    size_t len = nl ? (size_t)(nl - s) : n - at;
    at += len + (nl ? 1 : 0);
    if (len > 0 && s[len - 1] == '\r')
      len--;
    if (len > LOOM_HOSTFILE_MAX_LINE) {
      st = loom_error(LOOM_ERR_CONFIG,
                      "%s: line %d: longer than %d bytes (one host per line)",
                      path, line, LOOM_HOSTFILE_MAX_LINE);
      break;
    }
    /* Binary data and control characters, comments included: not a
     * hostfile. Bytes above 127 may appear in comments. */
    size_t body = len;
    for (size_t i = 0; i < len && st == LOOM_OK; i++) {
      unsigned char c = (unsigned char)s[i];
      if ((c < 0x20 && c != '\t') || c == 0x7f)
        st = loom_error(LOOM_ERR_CONFIG,
                        "%s: line %d: control byte 0x%02x at column %zu: "
                        "not a text hostfile",
                        path, line, c, i + 1);
      if (c == '#' && body == len)
        body = i;
    }
    if (st == LOOM_OK)
      st = parse_line(path, line, s, body, add, ctx, seen, &hosts);
  }
  loom_free(seen);
  if (st == LOOM_OK && hosts == 0)
    st = loom_error(LOOM_ERR_CONFIG,
                    "%s: names no host (one per line: 'host', 'host "
                    "slots=N' or 'host:N')",
                    path);
  return st;
}

loom_status loom_hostfile_read(const char *path, loom_hostfile_add_fn add,
                               void *ctx) {
  if (!path)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_hostfile_read: NULL");
  /* O_NONBLOCK: a FIFO in its place must not hang the launcher. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "cannot read hostfile %s: %s", path,
                      strerror(errno));
  loom_status st = LOOM_OK;
  char *buf = NULL;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    st = loom_error(LOOM_ERR_IO, "cannot read hostfile %s: %s", path,
                    strerror(errno));
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    st = loom_error(LOOM_ERR_CONFIG, "hostfile %s: %s, not a file", path,
                    S_ISDIR(sb.st_mode) ? "a directory" : "a special file");
    goto done;
  }
  if ((uint64_t)sb.st_size > LOOM_HOSTFILE_MAX_BYTES) {
    st = loom_error(LOOM_ERR_CONFIG,
                    "hostfile %s: %lld bytes; a hostfile has at most %zu", path,
                    (long long)sb.st_size, LOOM_HOSTFILE_MAX_BYTES);
    goto done;
  }
  size_t cap = (size_t)sb.st_size + 1, n = 0;
  buf = malloc(cap);
  if (!buf) {
    st = loom_error(LOOM_ERR_NOMEM, "reading hostfile %s", path);
    goto done;
  }
  /* Read what is there now, up to the size seen (it may shrink). */
  while (n < cap - 1) {
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      st = loom_error(LOOM_ERR_IO, "cannot read hostfile %s: %s", path,
                      strerror(errno));
      goto done;
    }
    if (r == 0)
      break;
    n += (size_t)r;
  }
  st = loom_hostfile_parse(path, buf, n, add, ctx);
done:
  free(buf);
  close(fd);
  return st;
}
