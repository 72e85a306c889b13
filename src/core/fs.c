/* Link-safe file-system helpers: mkdir -p, atomic small-file writes,
 * opening for write or append without following a planted link, and the
 * removal of a directory tree restricted to the caller's own names. */
#define _GNU_SOURCE
#include "loom/core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FS_PATH_MAX 4096
/* Below this depth nothing is entered: loom writes at most two levels. */
#define FS_REMOVE_DEPTH_MAX 8

static bool fault_now(loom_fs_fault_fn fault) { return fault && fault(); }

/* The mount id of dirfd/name (not followed), 0 when the kernel does not
 * say: a bind mount of the same file system has the same st_dev, only its
 * mount id tells it apart. */
static uint64_t mount_id(int dirfd, const char *name) {
#ifdef STATX_MNT_ID
  struct statx sx;
  if (statx(dirfd, name, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) == 0 &&
      (sx.stx_mask & STATX_MNT_ID))
    return sx.stx_mnt_id;
#else
  (void)dirfd;
  (void)name;
#endif
  return 0;
}

const char *loom_fs_strerror(int e) {
  switch (e) {
  case ELOOP:
    return "a symbolic link is in its place (loom does not write through "
           "links)";
  case EMLINK:
    return "it has other hard links (loom does not overwrite it)";
  case LOOM_FS_ENOTREG:
    return "it is not a regular file (a device, pipe, socket or directory: "
           "loom writes only regular files)";
  default:
    return strerror(e);
  }
}

/* ---------------------------------------------------------- directories */

loom_status loom_fs_mkdirs_hooked(const char *path, unsigned mode,
                                  loom_fs_fault_fn fault) {
  char buf[FS_PATH_MAX];
  size_t n = path ? strlen(path) : 0;
  if (n == 0 || n >= sizeof buf)
    return loom_error(LOOM_ERR_INVALID_ARG, "directory '%s': bad path",
                      path ? path : "(null)");
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0')
      continue;
    char c = buf[i];
    buf[i] = '\0';
    struct stat st;
    /* stat, not lstat: the components are the caller's path. */
    if (stat(buf, &st) != 0) {
      if (fault_now(fault) ||
          (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST))
        return loom_error(LOOM_ERR_IO, "%s: cannot create directory: %s", buf,
                          strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
      return loom_error(LOOM_ERR_IO, "%s: not a directory", buf);
    }
    buf[i] = c;
  }
  return LOOM_OK;
}

loom_status loom_fs_mkdirs(const char *path, unsigned mode) {
  return loom_fs_mkdirs_hooked(path, mode, NULL);
}

int loom_fs_open_dir(const char *path) {
  return open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static loom_status fsync_fd_dir(int fd, const char *path,
                                loom_fs_fault_fn fault) {
  if (fault_now(fault) || fsync(fd) != 0)
    return loom_error(LOOM_ERR_IO, "%s: fsync of directory failed: %s", path,
                      strerror(errno));
  return LOOM_OK;
}

loom_status loom_fs_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot open directory: %s", path,
                      strerror(errno));
  loom_status st = fsync_fd_dir(fd, path, NULL);
  close(fd);
  return st;
}

/* ---------------------------------------------------------------- write */

/* fd, opened non-blocking: 0 when it is a regular file (its stat in *st),
 * else the errno to report. */
static int regular_or_errno(int fd, struct stat *st) {
  if (fstat(fd, st) != 0)
    return errno;
  return S_ISREG(st->st_mode) ? 0 : LOOM_FS_ENOTREG;
}

/* fd made blocking again when e is 0 (its checks passed); else closed and
 * -1 with errno e. */
static int settle(int fd, int e) {
  if (!e && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
    e = errno;
  if (e) {
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int loom_fs_open_write_at(int dirfd, const char *name, int flags,
                          unsigned mode) {
  /* O_TRUNC would cut a file before we could look at it (a hard link to
   * someone else's file): truncate only after the checks. */
  bool trunc = (flags & O_TRUNC) != 0;
  /* O_NONBLOCK: a pipe with no reader would block the open forever (with
   * it, ENXIO); cleared again once the file is known to be regular. */
  int f = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
          (flags & O_APPEND);
  int fd = openat(dirfd, name, f, (mode_t)mode);
  if (fd < 0) {
    struct stat lst;
    if (errno == ENXIO &&
        fstatat(dirfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
        !S_ISREG(lst.st_mode))
      errno = LOOM_FS_ENOTREG;
    else if (errno == EISDIR)
      errno = LOOM_FS_ENOTREG;
    return -1;
  }
  struct stat st;
  int e = regular_or_errno(fd, &st);
  if (!e && st.st_nlink > 1)
    e = EMLINK;
  else if (!e && trunc && st.st_size > 0 && ftruncate(fd, 0) != 0)
    e = errno;
  return settle(fd, e);
}

int loom_fs_open_read_at(int dirfd, const char *name, int flags,
                         int64_t *size) {
  int fd = openat(dirfd, name,
                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | (flags & O_NOFOLLOW));
  if (fd < 0)
    return -1;
  struct stat st;
  int e = regular_or_errno(fd, &st);
  if (!e && size)
    *size = (int64_t)st.st_size;
  return settle(fd, e);
}

loom_status loom_fs_open_append(const char *path, bool truncate, FILE **out) {
  *out = NULL;
  int fd = loom_fs_open_write_at(AT_FDCWD, path,
                                 O_APPEND | (truncate ? O_TRUNC : 0), 0644);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot open for writing: %s", path,
                      loom_fs_strerror(errno));
  FILE *f = fdopen(fd, "a");
  if (!f) {
    int e = errno;
    close(fd);
    return loom_error(LOOM_ERR_IO, "%s: %s", path, strerror(e));
  }
  *out = f;
  return LOOM_OK;
}

int loom_fs_write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
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
    n -= (size_t)w;
  }
  return 0;
}

void loom_fs_discard(int dirfd, const char *name) {
  int e = errno;
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISREG(st.st_mode))
    (void)unlinkat(dirfd, name, 0);
  errno = e;
}

typedef struct fill_buf {
  const void *data;
  size_t len;
} fill_buf;

static int fill_from_buf(int fd, void *ctx) {
  const fill_buf *b = ctx;
  return loom_fs_write_all(fd, b->data, b->len);
}

static loom_status write_atomic_impl(int dfd, const char *dir, const char *name,
                                     loom_fs_fill_fn fill, void *ctx,
                                     loom_fs_fault_fn fault);

/* The temporary being filled, for loom_fs_discard_pending (a signal
 * handler): its directory and name, valid while pending_on is 1. Per
 * thread: a checkpoint's writer thread and the training thread each have
 * theirs (a handler runs in one of them; the commands that install one,
 * loom data shard and loom report, write from their main thread).
 * pending_on is a lock-free atomic (C11 7.14.1.1 allows those in a
 * handler): its release store and the handler's acquire exchange keep the
 * name's writes before the flag, which volatile alone did not promise (a
 * compiler may move plain stores past a volatile one). */
static _Thread_local atomic_int pending_on;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "pending_on: lock-free atomic");
static _Thread_local int pending_dfd = -1;
static _Thread_local char pending_name[512];

void loom_fs_discard_pending(void) {
  /* An exchange: a second stop signal's handler nested in this one finds
   * the flag off. */
  if (atomic_exchange_explicit(&pending_on, 0, memory_order_acquire))
    (void)unlinkat(pending_dfd, pending_name, 0);
}

static void pending_set(int dfd, const char *tname) {
  atomic_store_explicit(&pending_on, 0, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst); /* off before the name changes */
  pending_dfd = dfd;
  snprintf(pending_name, sizeof pending_name, "%s", tname);
  atomic_store_explicit(&pending_on, 1, memory_order_release);
}

/* The impl, with the pending temporary forgotten however it ends. */
static loom_status write_atomic_tracked(int dfd, const char *dir,
                                        const char *name, loom_fs_fill_fn fill,
                                        void *ctx, loom_fs_fault_fn fault) {
  loom_status st = write_atomic_impl(dfd, dir, name, fill, ctx, fault);
  atomic_store_explicit(&pending_on, 0, memory_order_relaxed);
  return st;
}

loom_status loom_fs_write_atomic_at(int dfd, const char *dir, const char *name,
                                    const void *data, size_t len,
                                    loom_fs_fault_fn fault) {
  fill_buf b = {data, len};
  return write_atomic_tracked(dfd, dir, name, fill_from_buf, &b, fault);
}

static loom_status write_atomic_impl(int dfd, const char *dir, const char *name,
                                     loom_fs_fill_fn fill, void *ctx,
                                     loom_fs_fault_fn fault) {
  char tmp[FS_PATH_MAX], tname[512];
  if (!dir || !name || !name[0] || strchr(name, '/'))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_fs_write_atomic: bad name '%s'",
                      name ? name : "(null)");
  /* The pid keeps processes that write the same file (ranks filling one
   * cache) from writing into each other's temporary. */
  int a = snprintf(tname, sizeof tname, ".%s.tmp.%ld", name, (long)getpid());
  int b = snprintf(tmp, sizeof tmp, "%s/%s", dir, tname);
  if (a < 0 || b < 0 || (size_t)a >= sizeof tname || (size_t)b >= sizeof tmp)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", dir);
  /* Named before it exists: a signal between its creation and this would
   * leave it (the name holds our pid, so it can only be ours). */
  pending_set(dfd, tname);
  int fd =
      fault_now(fault) ? -1 : loom_fs_open_write_at(dfd, tname, O_TRUNC, 0644);
  if (fd < 0)
    return loom_error(LOOM_ERR_IO, "%s/%s: cannot create its temporary %s: %s",
                      dir, name, tmp, loom_fs_strerror(errno));
  const char *what = NULL;
  int filled = fault_now(fault) ? -1 : fill(fd, ctx);
  if (filled == -2) { /* the producer's own error, already said */
    close(fd);
    loom_fs_discard(dfd, tname);
    return loom_error_context(LOOM_ERR_IO, "%s/%s: not written", dir, name);
  }
  if (filled != 0)
    what = "write";
  else if (fault_now(fault) || fsync(fd) != 0)
    what = "fsync";
  int e = errno;
  bool close_failed;
  if (fault_now(fault)) {
    int ce = errno;
    close(fd); /* the descriptor is gone either way */
    errno = ce;
    close_failed = true;
  } else {
    close_failed = close(fd) != 0;
  }
  if (close_failed && !what) {
    what = "close";
    e = errno;
  }
  if (what) {
    loom_fs_discard(dfd, tname);
    return loom_error(LOOM_ERR_IO, "%s/%s: %s of its temporary %s failed: %s",
                      dir, name, what, tmp, strerror(e));
  }
  struct stat lst;
  bool there = fstatat(dfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0;
  bool was_link = there && S_ISLNK(lst.st_mode);
  if (there && !was_link && !S_ISREG(lst.st_mode)) {
    /* a device, pipe, socket or directory: never replaced (as root, a
     * report written to /dev/null would have removed the device) */
    loom_fs_discard(dfd, tname);
    return loom_error(LOOM_ERR_IO, "%s/%s: %s", dir, name,
                      loom_fs_strerror(LOOM_FS_ENOTREG));
  }
  /* rename replaces a link at `name` itself, never what it points to. */
  if (fault_now(fault) || renameat(dfd, tname, dfd, name) != 0) {
    e = errno;
    loom_fs_discard(dfd, tname);
    return loom_error(LOOM_ERR_IO,
                      "%s/%s: cannot rename its temporary %s to it: %s", dir,
                      name, tmp, strerror(e));
  }
  if (was_link)
    LOOM_WARN("%s/%s was a symbolic link: replaced by a file, what it "
              "pointed to was not touched",
              dir, name);
  return fsync_fd_dir(dfd, dir, fault);
}

/* The atomic write into the directory at path dir (the caller's path,
 * followed as given). */
static loom_status write_atomic_in(const char *dir, const char *name,
                                   loom_fs_fill_fn fill, void *ctx,
                                   loom_fs_fault_fn fault) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot open directory: %s", dir,
                      strerror(errno));
  loom_status st = write_atomic_tracked(dfd, dir, name, fill, ctx, fault);
  close(dfd);
  return st;
}

loom_status loom_fs_write_atomic_hooked(const char *dir, const char *name,
                                        const void *data, size_t len,
                                        loom_fs_fault_fn fault) {
  if (!dir)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_fs_write_atomic: NULL dir");
  fill_buf b = {data, len};
  return write_atomic_in(dir, name, fill_from_buf, &b, fault);
}

loom_status loom_fs_write_atomic(const char *dir, const char *name,
                                 const void *data, size_t len) {
  return loom_fs_write_atomic_hooked(dir, name, data, len, NULL);
}

loom_status loom_fs_write_atomic_with(const char *dir, const char *name,
                                      loom_fs_fill_fn fill, void *ctx) {
  if (!dir || !fill)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_fs_write_atomic_with: NULL argument");
  return write_atomic_in(dir, name, fill, ctx, NULL);
}

typedef struct dead_tmp_scan {
  int dfd;
  const char *dir, *prefix; /* prefix: ".NAME.tmp." */
  size_t plen;
  int removed;
} dead_tmp_scan;

/* One entry: removed when it is write_atomic_impl's temporary of the name
 * (".NAME.tmp.<pid>", the pid as getpid() prints it), of a process that is
 * gone, a regular file of this user (never a link). */
static bool remove_if_dead_tmp(const char *ent, void *ctx) {
  dead_tmp_scan *sc = ctx;
  if (strncmp(ent, sc->prefix, sc->plen) != 0)
    return true;
  const char *p = ent + sc->plen;
  if (*p < '1' || *p > '9' || strlen(p) > 10)
    return true;
  long long pid = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9')
      return true;
    pid = pid * 10 + (*p - '0');
  }
  /* kill(pid, 0): ESRCH only when no process has that pid (EPERM: one of
   * another user, alive) */
  if (pid > 0x7fffffffLL || pid == (long long)getpid() ||
      kill((pid_t)pid, 0) == 0 || errno != ESRCH)
    return true;
  struct stat st;
  if (fstatat(sc->dfd, ent, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISREG(st.st_mode) || st.st_uid != geteuid())
    return true;
  if (unlinkat(sc->dfd, ent, 0) == 0) {
    sc->removed++;
    LOOM_INFO("%s/%s: removed, the temporary of a process that is gone "
              "(pid %lld)",
              sc->dir, ent, pid);
  }
  return true;
}

int loom_fs_remove_dead_tmps(const char *dir, const char *name) {
  char prefix[512];
  if (!dir || !name || !name[0] || strchr(name, '/'))
    return 0;
  int n = snprintf(prefix, sizeof prefix, ".%s.tmp.", name);
  if (n < 0 || (size_t)n >= sizeof prefix)
    return 0;
  /* The directory is the caller's path, followed as given; below it
   * nothing is followed. */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return 0;
  dead_tmp_scan sc = {dfd, dir, prefix, (size_t)n, 0};
  (void)loom_fs_each_entry(dfd, ".", false, remove_if_dead_tmp, &sc);
  close(dfd);
  return sc.removed;
}

/* --------------------------------------------------------------- remove */

typedef struct remove_walk {
  loom_fs_own_fn own;
  void *ctx;
  int left;
  bool dry; /* the first pass: look, report, remove nothing */
} remove_walk;

static void left_in_place(remove_walk *rw, const char *shown, const char *why) {
  rw->left++;
  LOOM_WARN("%s: %s; left in place", shown, why);
}

/* Removes dirfd/name (already looked at: *st) and returns whether it is
 * gone. Every decision is made on what fstatat says of the entry itself. */
static bool remove_entry(remove_walk *rw, int dirfd, const char *name,
                         const char *shown, const struct stat *st,
                         dev_t parent_dev, uint64_t parent_mnt, int depth) {
  if (S_ISLNK(st->st_mode)) {
    left_in_place(rw, shown, "a symbolic link, not followed");
    return false;
  }
  bool is_dir = S_ISDIR(st->st_mode);
  if (!rw->own(name, is_dir, depth, rw->ctx)) {
    left_in_place(rw, shown,
                  is_dir ? "a directory loom did not write"
                         : (S_ISREG(st->st_mode) ? "a file loom did not write"
                                                 : "not a file loom wrote"));
    return false;
  }
  if (!is_dir) {
    if (!S_ISREG(st->st_mode)) {
      left_in_place(rw, shown, "not a regular file");
      return false;
    }
    if (rw->dry)
      return true;
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT) {
      char why[256];
      snprintf(why, sizeof why, "cannot remove: %s", strerror(errno));
      left_in_place(rw, shown, why);
      return false;
    }
    return true;
  }
  uint64_t mnt = mount_id(dirfd, name);
  if (st->st_dev != parent_dev || (mnt && parent_mnt && mnt != parent_mnt)) {
    left_in_place(rw, shown, "another file system is mounted there");
    return false;
  }
  /* A directory without write permission was made read-only on purpose
   * (root could empty it anyway): it is kept, whoever runs loom. */
  if ((st->st_mode & 0222) == 0) {
    left_in_place(rw, shown, "a read-only directory");
    return false;
  }
  if (depth >= FS_REMOVE_DEPTH_MAX) {
    left_in_place(rw, shown, "nested too deep");
    return false;
  }
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat now;
  if (fd < 0 || fstat(fd, &now) != 0 || now.st_dev != st->st_dev ||
      now.st_ino != st->st_ino) {
    /* Replaced between the look and the open (a link swapped in). */
    if (fd >= 0)
      close(fd);
    else if (errno == ENOENT)
      return true;
    left_in_place(rw, shown, "changed while being removed");
    return false;
  }
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    left_in_place(rw, shown, "cannot be listed");
    return false;
  }
  bool all = true;
  struct dirent *e;
  char sub[FS_PATH_MAX];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    snprintf(sub, sizeof sub, "%s/%s", shown, e->d_name);
    struct stat es;
    if (fstatat(fd, e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) {
        left_in_place(rw, sub, strerror(errno));
        all = false;
      }
      continue;
    }
    if (!remove_entry(rw, fd, e->d_name, sub, &es, st->st_dev, mnt, depth + 1))
      all = false;
  }
  closedir(d);
  if (!all) {
    LOOM_WARN("%s: kept whole, as it holds what loom did not write or "
              "cannot remove",
              shown);
    return false;
  }
  if (rw->dry)
    return true;
  if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
    char why[256];
    snprintf(why, sizeof why, "cannot remove directory: %s", strerror(errno));
    left_in_place(rw, shown, why);
    return false;
  }
  return true;
}

int loom_fs_each_entry(int dirfd, const char *path, bool follow,
                       loom_fs_entry_fn fn, void *ctx) {
  if (!path || !fn) {
    errno = EINVAL;
    return -1;
  }
  int fd =
      openat(dirfd, path,
             O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0)
    return -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    if (!fn(e->d_name, ctx))
      break;
  }
  closedir(d);
  return 0;
}

int loom_fs_remove_empty_dir(int dirfd, const char *name) {
  if (!name || !name[0] || strchr(name, '/') || !strcmp(name, ".") ||
      !strcmp(name, "..")) {
    errno = EINVAL;
    return -1;
  }
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return unlinkat(dirfd, name, AT_REMOVEDIR);
}

loom_status loom_fs_remove_own(int dirfd, const char *name, const char *shown,
                               loom_fs_own_fn own, void *ctx, int *left) {
  if (left)
    *left = 0;
  if (!name || !name[0] || strchr(name, '/') || !strcmp(name, ".") ||
      !strcmp(name, "..") || !own)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_fs_remove_own: '%s' is not one entry",
                      name ? name : "(null)");
  remove_walk rw = {own, ctx, 0, true};
  struct stat st, parent;
  if (fstatat(dirfd, ".", &parent, 0) != 0)
    return loom_error(LOOM_ERR_IO, "%s: cannot look at its directory: %s",
                      shown ? shown : name, strerror(errno));
  uint64_t pmnt = mount_id(dirfd, ".");
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) {
      left_in_place(&rw, shown ? shown : name, strerror(errno));
      if (left)
        *left = rw.left;
    }
    return LOOM_OK;
  }
  /* Two passes: a tree holding anything that is not the caller's is left
   * whole (a checkpoint with a stranger's file in it stays loadable), not
   * half removed. The second pass checks every entry again as it goes. */
  remove_entry(&rw, dirfd, name, shown ? shown : name, &st, parent.st_dev, pmnt,
               0);
  if (rw.left == 0) {
    rw.dry = false;
    remove_entry(&rw, dirfd, name, shown ? shown : name, &st, parent.st_dev,
                 pmnt, 0);
  }
  if (left)
    *left = rw.left;
  return LOOM_OK;
}
