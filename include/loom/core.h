/* loom core: status codes and errors, logging, allocation, dtypes, tensors,
 * arenas, the counter-based RNG, timers, thread settings, link-safe file
 * helpers and the run status files. */
#ifndef LOOM_CORE_H
#define LOOM_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Symbol visibility. libloom is built with -fvisibility=hidden; everything
 * declared between LOOM_API_BEGIN and LOOM_API_END in a public header (each
 * header under include/loom/ wraps its declarations in them) is exported
 * from the shared library, nothing else is: internal.h declarations stay
 * private. A function added to a public header is exported without another
 * marker to forget; LOOM_API marks a single declaration elsewhere.
 * tests/arch/symbols.sh compares the exports with the headers. */
#if defined(__GNUC__) || defined(__clang__)
#define LOOM_API __attribute__((visibility("default")))
#define LOOM_API_BEGIN _Pragma("GCC visibility push(default)")
#define LOOM_API_END _Pragma("GCC visibility pop")
#else
#define LOOM_API
#define LOOM_API_BEGIN
#define LOOM_API_END
#endif

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ---------------------------------------------------------------- status */

/* Every function that can fail returns a loom_status; 0 is success and every
 * error is negative. The detail lives in loom_last_error() (thread-local). */
#define LOOM_STATUS_LIST(X)                                                    \
  X(LOOM_OK, 0, "ok")                                                          \
  X(LOOM_ERR_INVALID_ARG, -1, "invalid argument")                              \
  X(LOOM_ERR_NOMEM, -2, "out of memory")                                       \
  X(LOOM_ERR_IO, -3, "I/O error")                                              \
  X(LOOM_ERR_CORRUPT, -4, "corrupt data")                                      \
  X(LOOM_ERR_CONFIG, -5, "configuration error")                                \
  X(LOOM_ERR_TIMEOUT, -6, "timed out")                                         \
  X(LOOM_ERR_REMOTE, -7, "error on a remote rank")                             \
  X(LOOM_ERR_MISMATCH, -8, "mismatch between ranks")                           \
  X(LOOM_ERR_UNSUPPORTED, -9, "unsupported")                                   \
  X(LOOM_ERR_INTERNAL, -10, "internal error")                                  \
  X(LOOM_ERR_IN_PROGRESS, -11, "operation in progress")

typedef enum {
#define LOOM_X_ENUM(name, value, text) name = value,
  LOOM_STATUS_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
} loom_status;
#define LOOM_STATUS_COUNT 12

/* Static text of a status ("out of memory"); never NULL. */
const char *loom_status_str(loom_status s);
/* Symbolic name of a status ("LOOM_ERR_NOMEM"); never NULL. */
const char *loom_status_name(loom_status s);

/* The detailed message of the last error recorded on this thread, e.g.
 * "config.yaml:3:5: unknown key 'optim.lrr'". Empty string when none. */
const char *loom_last_error(void);
/* Records a message for status s on this thread and returns s, so that
 * `return loom_error(LOOM_ERR_IO, "cannot open %s", path);` reads well. */
loom_status loom_error(loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
loom_status loom_verror(loom_status s, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
#ifdef __clang_analyzer__
/* loom_error returns its first argument; told to clang's static analyzer
 * (make lint), which cannot see into error.c and would otherwise assume an
 * error path may return LOOM_OK. */
#define loom_error(s, ...) (loom_error((s), __VA_ARGS__), (s))
#endif
/* Prepends context ("loading checkpoint: ") to the current message. */
loom_status loom_error_context(loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void loom_clear_error(void);

/* Return early on failure. */
#define LOOM_TRY(expr)                                                         \
  do {                                                                         \
    loom_status loom_try_s_ = (expr);                                          \
    if (loom_try_s_ != LOOM_OK)                                                \
      return loom_try_s_;                                                      \
  } while (0)
/* Store the status in `st` and jump to `label` on failure (one cleanup label
 * per function). */
#define LOOM_TRY_GOTO(st, expr, label)                                         \
  do {                                                                         \
    (st) = (expr);                                                             \
    if ((st) != LOOM_OK)                                                       \
      goto label;                                                              \
  } while (0)

/* --------------------------------------------------------------- logging */

#define LOOM_LOG_LEVEL_LIST(X)                                                 \
  X(LOOM_LOG_DEBUG, "debug")                                                   \
  X(LOOM_LOG_INFO, "info")                                                     \
  X(LOOM_LOG_WARN, "warn")                                                     \
  X(LOOM_LOG_ERROR, "error")                                                   \
  X(LOOM_LOG_OFF, "off")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_LOG_LEVEL_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_LOG_LEVEL_COUNT
} loom_log_level;

/* The level comes from LOOM_LOG (debug|info|warn|error|off, default info)
 * on first use; loom_log_set_level overrides it. */
void loom_log_set_level(loom_log_level level);
loom_log_level loom_log_get_level(void);
/* Messages carry a "[rank r]" prefix once a rank is set (r >= 0). */
void loom_log_set_rank(int rank);
void loom_log(loom_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A second sink: a file (a rank's log, log.per_rank) that gets every
 * message at info or above (or the level, if lower), each line stamped
 * with the wall clock (UTC, ms) and flushed. With console_quiet the console
 * keeps only warnings and errors (ranks other than 0). NULL stops it; the
 * caller owns and closes the file after that. */
void loom_log_set_file(FILE *f, bool console_quiet);
/* A line for the file sink only (nothing when none is set). */
void loom_log_file(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define LOOM_DEBUG(...) loom_log(LOOM_LOG_DEBUG, __VA_ARGS__)
#define LOOM_INFO(...) loom_log(LOOM_LOG_INFO, __VA_ARGS__)
#define LOOM_WARN(...) loom_log(LOOM_LOG_WARN, __VA_ARGS__)
#define LOOM_LOG_ERROR(...) loom_log(LOOM_LOG_ERROR, __VA_ARGS__)

/* ------------------------------------------------------------ allocation */

/* All allocation in loom goes through these. Memory is 64-byte aligned and
 * released with loom_free (loom_free(NULL) is a no-op). On failure they
 * return NULL and record LOOM_ERR_NOMEM with the size asked for. */
void *loom_malloc(size_t bytes);
void *loom_calloc(size_t count, size_t size);
void loom_free(void *p);
/* Test hook: make the n-th allocation from now fail (n >= 1); 0 disables. */
void loom_alloc_fail_after(long n);
/* Number of allocations made so far (for tests that walk every failure). */
long loom_alloc_count(void);

/* Address space for a large buffer whose pages come and go (ZeRO-2/3's
 * full-size parameter and gradient buffers, of which a rank holds only the
 * parts in use): reserved, not committed; a page is zero until first
 * written. Counts as an allocation for the test hook. */
void *loom_vmem_new(size_t bytes);
/* From this size on, loom_vmem_new aligns the buffer to 2 MiB and asks for
 * transparent huge pages (MADV_HUGEPAGE): resident memory then comes in
 * 2 MiB steps. */
#define LOOM_VMEM_HUGE_MIN ((size_t)32 << 20)
/* The huge page those buffers are aligned to. */
#define LOOM_VMEM_HUGE_PAGE ((size_t)2 << 20)
/* Bytes [from, to) of a loom_vmem_new buffer become zero: the whole pages
 * among them go back to the system (no longer resident), the partial pages
 * at either end are cleared. */
void loom_vmem_release(void *p, size_t from, size_t to);
/* NULL is a no-op; bytes as given to loom_vmem_new. */
void loom_vmem_free(void *p, size_t bytes);
/* Bytes of p's range [from, to) resident in memory now (mincore): what the
 * tests of ZeRO's memory compare with the formula. */
size_t loom_vmem_resident(const void *p, size_t from, size_t to);

/* Memory by category: the buffers that are neither the model's state nor
 * its activations (which the trainer counts from their owners) report what
 * they hold as they are made and freed: communication (shared-memory
 * segments, staging and compression buffers) and data (data sets held in
 * memory, the sampler's order, batches). Process-wide, atomic; the peak is
 * the most held at once since the start (or the last reset). */
#define LOOM_MEM_CAT_LIST(X)                                                   \
  X(LOOM_MEM_COMM, "comm")                                                     \
  X(LOOM_MEM_DATA, "data")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_MEM_CAT_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_MEM_CAT_COUNT
} loom_mem_cat;

void loom_mem_add(loom_mem_cat c, size_t bytes);
void loom_mem_sub(loom_mem_cat c, size_t bytes);
/* Bytes held now and the peak (either may be NULL). */
void loom_mem_get(loom_mem_cat c, size_t *now, size_t *peak);
const char *loom_mem_cat_name(loom_mem_cat c);
/* The peak of every category back to what is held now (tests). */
void loom_mem_reset_peaks(void);

/* ---------------------------------------------------------------- dtypes */

#define LOOM_DTYPE_LIST(X)                                                     \
  X(LOOM_F32, "f32", 4)                                                        \
  X(LOOM_BF16, "bf16", 2)                                                      \
  X(LOOM_F16, "f16", 2)                                                        \
  X(LOOM_F64, "f64", 8)                                                        \
  X(LOOM_I32, "i32", 4)                                                        \
  X(LOOM_I64, "i64", 8)                                                        \
  X(LOOM_U8, "u8", 1)

typedef enum {
#define LOOM_X_ENUM(name, text, size) name,
  LOOM_DTYPE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_DTYPE_COUNT
} loom_dtype;

size_t loom_dtype_size(loom_dtype dt);
const char *loom_dtype_name(loom_dtype dt);
/* Parses "f32", "bf16", ...; LOOM_ERR_INVALID_ARG for an unknown name. */
loom_status loom_dtype_parse(const char *name, loom_dtype *out);

/* bf16 and f16 storage. Conversions round to nearest even; NaN stays NaN
 * (f32 -> half: made quiet, top payload bits kept; f16 -> f32: made quiet,
 * as F16C does); f16 subnormals are kept, |x| >= 65520 becomes inf. */
typedef uint16_t loom_bf16;
typedef uint16_t loom_f16;
loom_bf16 loom_f32_to_bf16(float x);
float loom_bf16_to_f32(loom_bf16 x);
loom_f16 loom_f32_to_f16(float x);
float loom_f16_to_f32(loom_f16 x);

/* --------------------------------------------------------------- tensors */

#define LOOM_MAX_DIMS 4

/* A tensor is a view: it never owns `data` unless made by loom_tensor_new. */
typedef struct loom_tensor {
  void *data;
  loom_dtype dtype;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  int64_t stride[LOOM_MAX_DIMS]; /* in elements, row-major when contiguous */
  bool owns;
} loom_tensor;

/* A contiguous view of `data` with the given shape (ndim 0..4; a NULL
 * shape gives ndim 0). */
loom_tensor loom_tensor_view(void *data, loom_dtype dtype, int ndim,
                             const int64_t *shape);
/* Allocates a zeroed contiguous tensor; free with loom_tensor_free.
 * LOOM_ERR_INVALID_ARG for a NULL t, a NULL shape with ndim > 0, a bad dtype,
 * ndim outside 0..4, a negative size, or a shape whose element count or byte
 * size overflows (more than PTRDIFF_MAX bytes); LOOM_ERR_NOMEM when the
 * allocation fails. */
loom_status loom_tensor_new(loom_tensor *t, loom_dtype dtype, int ndim,
                            const int64_t *shape);
void loom_tensor_free(loom_tensor *t);
/* The element count; -1 when it overflows int64_t (or a size is
 * negative), 0 for a NULL t. */
int64_t loom_tensor_numel(const loom_tensor *t);
/* The byte size; SIZE_MAX when it exceeds PTRDIFF_MAX (no allocation can
 * hold it) or numel is -1, 0 for a NULL t. */
size_t loom_tensor_bytes(const loom_tensor *t);
bool loom_tensor_is_contiguous(const loom_tensor *t);
/* A view with a new shape over the same contiguous data (numel must match). */
loom_status loom_tensor_reshape(const loom_tensor *t, int ndim,
                                const int64_t *shape, loom_tensor *out);
/* A view of rows [start, start+count) along dimension 0. */
loom_status loom_tensor_slice0(const loom_tensor *t, int64_t start,
                               int64_t count, loom_tensor *out);

/* ------------------------------------------------------------ parameters */

/* A parameter is a view into the model's flat buffers: the same offset
 * addresses its values in the parameter buffer, its gradient in the gradient
 * buffer and its state in every optimizer buffer. Views are in forward
 * order and contiguous: views[i+1].offset == views[i].offset + numel. */
#define LOOM_PARAM_NAME_MAX 64
typedef struct loom_param {
  char name[LOOM_PARAM_NAME_MAX]; /* "blocks.0.attn.qkv.weight" */
  int64_t offset;                 /* in elements, into the flat buffers */
  int64_t numel;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  bool decay; /* weight decay applies (false for biases and norms) */
} loom_param;

/* ---------------------------------------------------------------- arenas */

/* A bump allocator over one block: many buffers, one allocation, one free. */
typedef struct loom_arena loom_arena;
/* capacity is rounded up to a multiple of 64; LOOM_ERR_NOMEM when it is
 * larger than PTRDIFF_MAX - 63 or the block cannot be allocated. */
loom_status loom_arena_new(loom_arena **out, size_t capacity);
void loom_arena_free(loom_arena *a);
/* 64-byte aligned; NULL with LOOM_ERR_NOMEM when the arena is full. */
void *loom_arena_alloc(loom_arena *a, size_t bytes);
void loom_arena_reset(loom_arena *a);
size_t loom_arena_used(const loom_arena *a);
size_t loom_arena_capacity(const loom_arena *a);

/* ------------------------------------------------------------------- RNG */

/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11): a bijection of a 128-bit counter under a 64-bit key. */
void loom_philox4x32(const uint32_t ctr[4], const uint32_t key[2],
                     uint32_t out[4]);

/* A stream of random numbers keyed by (seed, stream); `counter` counts
 * 32-bit draws, so any position can be reached without drawing the ones
 * before it (loom_rng_seek). Value i of stream (seed, s) is word i%4 of
 * philox(ctr = {i/4 lo, i/4 hi, s lo, s hi}, key = {seed lo, seed hi}). */
typedef struct loom_rng {
  uint64_t seed;
  uint64_t stream;
  uint64_t counter;
  /* The last Philox block computed (4 draws), so sequential draws cost one
   * block per 4 values. Valid only for the (seed, stream, block + 1) it was
   * made for: a zeroed struct or a changed seed or stream misses it. */
  uint64_t cache_seed, cache_stream, cache_key;
  uint32_t cache[4];
} loom_rng;

loom_rng loom_rng_init(uint64_t seed, uint64_t stream);
void loom_rng_seek(loom_rng *r, uint64_t counter);
uint32_t loom_rng_u32(loom_rng *r);
/* Uniform in [0, 1) with 24 bits of precision. */
float loom_rng_uniform(loom_rng *r);
/* Uniform integer in [0, n) without modulo bias; n >= 1. */
uint64_t loom_rng_below(loom_rng *r, uint64_t n);
/* Standard normal by Box-Muller; consumes exactly two draws per value. */
float loom_rng_normal(loom_rng *r);
/* n values lo + (hi - lo) * uniform, or mean + std * normal, exactly those
 * of as many loom_rng_uniform / loom_rng_normal calls (r advances as far),
 * computed on loom_threads() threads when n is large. */
void loom_rng_fill_uniform(loom_rng *r, float *out, size_t n, float lo,
                           float hi);
void loom_rng_fill_normal(loom_rng *r, float *out, size_t n, float mean,
                          float std);
/* Mixes several 64-bit words into one stream id (purpose, step, index...). */
uint64_t loom_rng_stream_id(uint64_t a, uint64_t b, uint64_t c);

/* ---------------------------------------------------------------- timers */

/* Seconds on a monotonic clock. */
double loom_time_now(void);
/* Seconds since the Unix epoch (for metrics). */
double loom_time_wall(void);

/* --------------------------------------------------------------- threads */

/* Threads for loom's kernels: LOOM_THREADS if set, else the number of cores
 * this process may run on. loom_set_threads also sets OpenMP's count. An
 * empty OMP_NUM_THREADS is removed from the environment at the first of
 * these calls (it means "not set"; LLVM's libomp aborts on it). */
int loom_threads(void);
void loom_set_threads(int n);
/* The largest thread count loom takes (LOOM_THREADS, train.threads, the
 * benches' --threads). */
#define LOOM_THREADS_MAX 4096
/* Rank local_rank of local_size ranks on one host: when the thread count
 * was not chosen (neither LOOM_THREADS nor loom_set_threads) and the ranks
 * were not bound to disjoint cores, they divide this host's cores among
 * them instead of each taking all (2 ranks x 2 threads on 2 cores ran 4x
 * slower). Called by the communication layer once the world is known, on
 * the calling thread (OpenMP's count is per thread). Returns the count. */
int loom_threads_share(int local_rank, int local_size);
/* Number of cores this process may run on (sched affinity). */
int loom_cores(void);

/* Decimal integers, strictly: loom_parse_i64 and loom_parse_int take the
 * whole string (an optional sign and digits, leading spaces allowed) and
 * fail on anything else or out of range, leaving *out as it was;
 * loom_parse_i64_at reads one at s and sets *end past it. Instead of atoi
 * and sscanf("%d"), which read garbage as 0 and overflow undefined. */
bool loom_parse_i64(const char *s, int64_t *out);
bool loom_parse_int(const char *s, int *out);
bool loom_parse_i64_at(const char *s, const char **end, int64_t *out);
/* A name among names[0..n) (an enum's names, indexed by value): its index
 * into *out (when out is not NULL: else only checked). Unknown or NULL:
 * LOOM_ERR_INVALID_ARG "unknown WHAT 'S' (expected a, b or c)", the
 * names listed from the table. What each enum's *_parse function uses. */
loom_status loom_name_parse(const char *s, const char *const *names, int n,
                            const char *what, int *out);

/* ------------------------------------------------------------- checksums */

/* CRC32C (Castagnoli), as used for checkpoint blocks. Pass crc = 0 to start;
 * feed the result back to continue over several buffers. */
uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n);
/* 64-bit FNV-1a, for config and layout hashes. */
uint64_t loom_hash64(uint64_t h, const void *data, size_t n);
#define LOOM_HASH64_INIT 0xcbf29ce484222325ULL

/* ----------------------------------------------------------- file system */

/* Link-safe file-system helpers (src/core/fs.c). A path the caller gives is
 * resolved as usual (it is the user's choice); what loom finds below it is
 * never followed: a symbolic link is never entered, written through or
 * deleted, and only names the caller owns are removed. Messages name the
 * path; what is left in place is reported with a warning. */

/* Tests: called before each write-side call (create, write, fsync, close,
 * mkdir, rename); returning true makes that call fail with errno set. */
typedef bool (*loom_fs_fault_fn)(void);

/* mkdir -p with `mode` for what it creates. An existing component must be a
 * directory (or a link to one the caller's path goes through). */
loom_status loom_fs_mkdirs(const char *path, unsigned mode);
loom_status loom_fs_mkdirs_hooked(const char *path, unsigned mode,
                                  loom_fs_fault_fn fault);

/* Opens a directory for *at() calls: O_DIRECTORY, and O_NOFOLLOW, so a
 * directory replaced by a symbolic link is refused (errno ELOOP/ENOTDIR).
 * Returns the descriptor or -1 with errno set. */
int loom_fs_open_dir(const char *path);
/* fsync of a directory (renames in it made durable). */
loom_status loom_fs_fsync_dir(const char *path);

/* Opens dirfd/name for writing without following a symbolic link in its
 * place (-1, errno ELOOP) and without writing into a file that has other
 * hard links (-1, errno EMLINK) or is not a regular file (-1, errno
 * LOOM_FS_ENOTREG; a pipe without a reader is refused too, never waited
 * for). flags: O_TRUNC and/or O_APPEND (O_WRONLY|O_CREAT|O_CLOEXEC|
 * O_NOFOLLOW are added); dirfd may be AT_FDCWD. */
int loom_fs_open_write_at(int dirfd, const char *name, int flags,
                          unsigned mode);
/* The errno of loom_fs_open_write_at for a file that is not regular
 * (ENOTBLK, which no open of a path otherwise gives); loom_fs_strerror says
 * it plainly. */
#define LOOM_FS_ENOTREG ENOTBLK
/* Opens dirfd/name for reading a regular file: the open is non-blocking (a
 * FIFO without a writer would hold it forever), then anything but a regular
 * file is refused (-1, errno LOOM_FS_ENOTREG) and the descriptor is made
 * blocking again. flags: O_NOFOLLOW refuses a symbolic link (-1, errno
 * ELOOP); O_RDONLY|O_CLOEXEC are added. *size (when not NULL): the file's
 * size in bytes. Returns the descriptor or -1 with errno set; dirfd may be
 * AT_FDCWD. */
int loom_fs_open_read_at(int dirfd, const char *name, int flags, int64_t *size);
/* Removes dirfd/name, a temporary file the caller created there itself,
 * after a failed write: only a regular file (never a directory; a symbolic
 * link is not followed). errno is left as it was, for the caller's message.
 * dirfd may be AT_FDCWD. */
void loom_fs_discard(int dirfd, const char *name);
/* strerror(e), with the refusals above said plainly. */
const char *loom_fs_strerror(int e);

/* Opens path for appending (truncated first when `truncate`), refusing a
 * symbolic link or hard link planted in its place with an error naming
 * the file. */
loom_status loom_fs_open_append(const char *path, bool truncate, FILE **out);

/* Writes dir/name in one step: dir/.name.tmp.<pid>, write, fsync, rename
 * over dir/name, fsync of dir. A symbolic link at dir/name is replaced as a
 * link (its target untouched) and reported; a device, pipe, socket or
 * directory there is an error (LOOM_ERR_IO), and left as it is. */
loom_status loom_fs_write_atomic(const char *dir, const char *name,
                                 const void *data, size_t len);
loom_status loom_fs_write_atomic_hooked(const char *dir, const char *name,
                                        const void *data, size_t len,
                                        loom_fs_fault_fn fault);
/* The same in the directory open as dfd (`dir`: its path, for messages). */
loom_status loom_fs_write_atomic_at(int dfd, const char *dir, const char *name,
                                    const void *data, size_t len,
                                    loom_fs_fault_fn fault);
/* The same with the bytes written by fill(fd, ctx) into the temporary, for
 * a file too large to hold in memory. fill returns 0, or -1 with errno set
 * (a failed write: reported as the write's), or -2 after setting loom's
 * error itself (its input failed: reported with the file's name); the
 * temporary is removed on any failure. */
typedef int (*loom_fs_fill_fn)(int fd, void *ctx);
loom_status loom_fs_write_atomic_with(const char *dir, const char *name,
                                      loom_fs_fill_fn fill, void *ctx);
/* Removes the temporaries of dir/name that the writers above left when
 * they were killed (SIGKILL, a crash): dir/.name.tmp.<pid> whose process
 * is gone (kill(pid, 0): ESRCH), regular files of this user only, never
 * a link; another name, or a temporary of a live process (this one, or
 * one writing the same file now) is left alone. Only for a file written
 * on this host: a process of another host (a shared file system) is not
 * seen here. Returns how many were removed (each said at info level). */
int loom_fs_remove_dead_tmps(const char *dir, const char *name);
/* write(2) of all n bytes (EINTR retried): 0, or -1 with errno. */
int loom_fs_write_all(int fd, const void *buf, size_t n);
/* Removes the temporary that an atomic write of the calling thread is
 * filling now, if any: for a signal handler (async-signal-safe: one
 * unlinkat), so that a command stopped by Ctrl-C or SIGTERM leaves no
 * hidden .NAME.tmp.<pid> behind. */
void loom_fs_discard_pending(void);

/* One entry of a directory, for loom_fs_each_entry; false stops the walk. */
typedef bool (*loom_fs_entry_fn)(const char *name, void *ctx);

/* Calls fn(name, ctx) for each entry of the directory dirfd/path ("." and
 * ".." left out) until fn returns false; it reads, and removes nothing
 * (loom_fs_remove_own does that). dirfd may be AT_FDCWD; path "." walks
 * dirfd itself through a descriptor of its own. follow: whether path may be
 * a symbolic link to a directory (a directory the user named; never for a
 * walk that leads to a removal). Returns 0, or -1 with errno set (ENOENT:
 * no such directory; ELOOP: a link, with follow false). */
int loom_fs_each_entry(int dirfd, const char *path, bool follow,
                       loom_fs_entry_fn fn, void *ctx);

/* Removes the empty directory dirfd/name (one component), never through a
 * symbolic link: fstatat(AT_SYMLINK_NOFOLLOW) must see a directory, then
 * unlinkat(AT_REMOVEDIR), which removes nothing that is not empty.
 * Returns 0, or -1 with errno set (ENOTEMPTY while something is in it,
 * ENOTDIR for anything but a directory, EINVAL for a name that is not one
 * component). Only async-signal-safe calls: usable in a child forked from
 * a process with threads. */
int loom_fs_remove_empty_dir(int dirfd, const char *name);

/* Whether an entry may be removed: its name, whether it is a directory,
 * its depth (0: the entry named to loom_fs_remove_own, 1: inside it, ...). */
typedef bool (*loom_fs_own_fn)(const char *name, bool is_dir, int depth,
                               void *ctx);

/* Removes dirfd/name and what is below it, never following a symbolic
 * link: each entry is looked at with fstatat(AT_SYMLINK_NOFOLLOW) and
 * removed with unlinkat only when `own` says it is the caller's. A link,
 * an entry `own` refuses, a directory without write permission, another
 * file system mounted there, or an entry that cannot be removed is left in
 * place with a warning naming it (`shown`: the path to name in messages),
 * and then nothing of the tree is removed (a first pass looks, a second
 * removes, checking each entry again). *left (may be NULL) counts those
 * entries; a missing entry is nothing to do. LOOM_ERR_INVALID_ARG only for
 * a name that is not one component. */
loom_status loom_fs_remove_own(int dirfd, const char *name, const char *shown,
                               loom_fs_own_fn own, void *ctx, int *left);

/* ------------------------------------------------- CPU and instruction sets */

typedef struct loom_cpu_features {
  bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16,
      avx512_fp16, amx_bf16, amx_tile;
} loom_cpu_features;
/* Read once from CPUID (and, for AMX, whether the OS granted tile state). */
const loom_cpu_features *loom_cpu_get_features(void);

/* The instruction sets loom's own vector code (kernels, optimizer updates,
 * gradient clipping) is built for, each a complete copy chosen at run time:
 * base is x86-64-v2 (SSE4.2), avx2 adds AVX2, FMA and F16C (x86-64-v3),
 * avx512 adds AVX-512 F, BW, VL and DQ (x86-64-v4) with the compiler's loops
 * 512 bits wide. Each copy's instructions include the one before it. Every
 * copy computes the same bits; only the speed differs. */
#define LOOM_ISA_LIST(X)                                                       \
  X(LOOM_ISA_BASE, "base")                                                     \
  X(LOOM_ISA_AVX2, "avx2")                                                     \
  X(LOOM_ISA_AVX512, "avx512")
typedef enum loom_isa {
#define LOOM_X_ENUM(name, text) name,
  LOOM_ISA_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_ISA_COUNT
} loom_isa;
/* A copy's name for a function: LOOM_ISA_NAME(loom_gemm, avx2) is
 * loom_gemm_avx2 (internal symbols of libloom, never exported). */
#define LOOM_ISA_NAME_(name, isa) name##_##isa
#define LOOM_ISA_NAME(name, isa) LOOM_ISA_NAME_(name, isa)
#if defined(LOOM_ISA_SUFFIX)
/* Inside the copy being compiled (the build defines LOOM_ISA_SUFFIX). */
#define LOOM_ISA(name) LOOM_ISA_NAME(name, LOOM_ISA_SUFFIX)
#endif
/* From a list of R(ret, name, (params), (args)) and V(name, (params),
 * (args)) (src/kernels/isa.h, src/optim/isa.h): the copies' declarations,
 * and the dispatchers, which call the copy loom_cpu_isa() chose. */
#define LOOM_ISA_DECL_R(ret, name, params, args)                               \
  ret LOOM_ISA_NAME(name, base) params;                                        \
  ret LOOM_ISA_NAME(name, avx2) params;                                        \
  ret LOOM_ISA_NAME(name, avx512) params;
#define LOOM_ISA_DECL_V(name, params, args)                                    \
  LOOM_ISA_DECL_R(void, name, params, args)
#if defined(LOOM_BUILDING_LIBRARY)
#if defined(LOOM_BUILT_ISA_AVX2)
#define LOOM_ISA_PICK_AVX2_(name, other)                                       \
  (loom_cpu_isa() == LOOM_ISA_AVX2 ? LOOM_ISA_NAME(name, avx2) : other)
#else
#define LOOM_ISA_PICK_AVX2_(name, other) other
#endif
#if defined(LOOM_BUILT_ISA_AVX512)
#define LOOM_ISA_PICK_AVX512_(name, other)                                     \
  (loom_cpu_isa() == LOOM_ISA_AVX512 ? LOOM_ISA_NAME(name, avx512) : other)
#else
#define LOOM_ISA_PICK_AVX512_(name, other) other
#endif
#define LOOM_ISA_PICK(name)                                                    \
  LOOM_ISA_PICK_AVX512_(name,                                                  \
                        LOOM_ISA_PICK_AVX2_(name, LOOM_ISA_NAME(name, base)))
#define LOOM_ISA_DISPATCH_R(ret, name, params, args)                           \
  ret name params { return LOOM_ISA_PICK(name) args; }
#define LOOM_ISA_DISPATCH_V(name, params, args)                                \
  void name params { LOOM_ISA_PICK(name) args; }
#endif
const char *loom_isa_name(loom_isa isa);
/* Whether this build holds the copy for isa and this CPU can run it. */
bool loom_isa_available(loom_isa isa);
/* The copy in use, decided on first call: LOOM_ISA=base|avx2|avx512 if set
 * to one that is available, else the best available. Never one this CPU
 * lacks. */
loom_isa loom_cpu_isa(void);
/* LOOM_OK when the kernels can run as asked: LOOM_ERR_CONFIG for a LOOM_ISA
 * that names no instruction set (the message lists them), LOOM_ERR_UNSUPPORTED
 * for one this CPU or build lacks. loom_trainer_new and the loom tool call it
 * before any kernel runs. */
loom_status loom_cpu_check(void);

/* ------------------------------------------------------------ run status */

/* Library version string ("0.1.0"). */
const char *loom_version(void);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_CORE_H */
