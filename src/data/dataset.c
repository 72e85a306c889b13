/* Data sets in general: name tables, info, batches, dispatch of fills. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *const split_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_SPLIT_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof split_names / sizeof split_names[0] == LOOM_SPLIT_COUNT,
               "split name table");

static const char *const kind_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_DATASET_KIND_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof kind_names / sizeof kind_names[0] ==
                   LOOM_DATASET_KIND_COUNT,
               "data set kind name table");

const char *loom_split_name(loom_split s) {
  return (unsigned)s < LOOM_SPLIT_COUNT ? split_names[s] : "?";
}

loom_status loom_split_parse(const char *s, loom_split *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_split_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(s, split_names, LOOM_SPLIT_COUNT, "split", &i));
  *out = (loom_split)i;
  return LOOM_OK;
}

const char *loom_dataset_kind_name(loom_dataset_kind k) {
  return (unsigned)k < LOOM_DATASET_KIND_COUNT ? kind_names[k] : "?";
}

char *loom_data_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = loom_malloc(n);
  if (p)
    memcpy(p, s, n);
  return p;
}

loom_status loom_data_mkdirs_for(const char *path) {
  char buf[4096];
  size_t n = strlen(path);
  if (n >= sizeof buf)
    return loom_error(LOOM_ERR_INVALID_ARG, "path too long: %s", path);
  memcpy(buf, path, n + 1);
  char *slash = strrchr(buf, '/');
  if (!slash || slash == buf)
    return LOOM_OK;
  *slash = '\0';
  return loom_fs_mkdirs(buf, 0777);
}

/* path's directory (made when missing) and file name, for the atomic
 * writers. */
static loom_status split_path(const char *path, char *dir, size_t n,
                              const char **name) {
  int k = snprintf(dir, n, "%s", path);
  if (k < 0 || (size_t)k >= n)
    return loom_error(LOOM_ERR_INVALID_ARG, "path too long: %s", path);
  if (k == 0 || path[k - 1] == '/')
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: names a directory, not a file",
                      path);
  LOOM_TRY(loom_data_mkdirs_for(path));
  char *slash = strrchr(dir, '/');
  *name = path;
  if (slash == dir) {
    *name = path + 1;
    dir[1] = '\0';
  } else if (slash) {
    *slash = '\0';
    *name = slash + 1;
  } else {
    snprintf(dir, n, ".");
  }
  return LOOM_OK;
}

loom_status loom_data_write_atomic(const char *path, const void *data,
                                   size_t n) {
  char dir[4200];
  const char *name;
  LOOM_TRY(split_path(path, dir, sizeof dir, &name));
  return loom_fs_write_atomic(dir, name, data, n);
}

loom_status loom_data_write_atomic_with(const char *path, loom_fs_fill_fn fill,
                                        void *ctx) {
  char dir[4200];
  const char *name;
  LOOM_TRY(split_path(path, dir, sizeof dir, &name));
  return loom_fs_write_atomic_with(dir, name, fill, ctx);
}

void loom_dataset_get_info(const loom_dataset *ds, loom_dataset_info *info) {
  if (!info)
    return;
  memset(info, 0, sizeof *info);
  if (!ds)
    return;
  info->kind = ds->kind;
  info->len = ds->len;
  info->classes = ds->classes;
  info->source = ds->source;
  if (ds->kind == LOOM_DATASET_IMAGES) {
    info->C = ds->C;
    info->H = ds->H;
    info->W = ds->W;
  } else {
    info->T = ds->T;
    info->tokens = ds->tokens;
  }
}

int64_t loom_dataset_len(const loom_dataset *ds) { return ds ? ds->len : 0; }

void loom_dataset_free(loom_dataset *ds) {
  if (!ds)
    return;
  loom_mem_sub(LOOM_MEM_DATA, ds->held);
  loom_free(ds->pixels);
  loom_free(ds->labels);
  loom_free(ds->values);
  loom_free(ds->ilabels);
  loom_free(ds->segs);
  loom_free(ds->text);
  for (int i = 0; i < ds->nshards; i++) {
    loom_shard_close(&ds->shards[i]);
    if (ds->shard_paths)
      loom_free(ds->shard_paths[i]);
  }
  loom_free(ds->shards);
  loom_free(ds->shard_paths);
  loom_free(ds->source);
  loom_free(ds);
}

/* What a batch holds, counted in LOOM_MEM_DATA. */
static size_t batch_bytes(const loom_batch *b) {
  return (size_t)(loom_tensor_numel(&b->x) + loom_tensor_numel(&b->y)) * 4 +
         (size_t)b->capacity * sizeof *b->sample;
}

loom_status loom_batch_alloc(loom_batch *b, const loom_dataset *ds,
                             int64_t capacity) {
  if (!b || !ds || capacity < 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_batch_alloc: need a data set and capacity >= 1");
  memset(b, 0, sizeof *b);
  loom_status st = LOOM_OK;
  if (ds->kind == LOOM_DATASET_IMAGES) {
    int64_t xs[4] = {capacity, ds->C, ds->H, ds->W};
    LOOM_TRY_GOTO(st, loom_tensor_new(&b->x, LOOM_F32, 4, xs), fail);
    LOOM_TRY_GOTO(st, loom_tensor_new(&b->y, LOOM_I32, 1, xs), fail);
  } else {
    int64_t xs[2] = {capacity, ds->T};
    LOOM_TRY_GOTO(st, loom_tensor_new(&b->x, LOOM_I32, 2, xs), fail);
    LOOM_TRY_GOTO(st, loom_tensor_new(&b->y, LOOM_I32, 2, xs), fail);
  }
  b->sample = loom_calloc((size_t)capacity, sizeof *b->sample);
  if (!b->sample) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  b->capacity = capacity;
  loom_mem_add(LOOM_MEM_DATA, batch_bytes(b));
  return LOOM_OK;
fail:
  loom_batch_free(b);
  return st;
}

void loom_batch_free(loom_batch *b) {
  if (!b)
    return;
  if (b->capacity > 0)
    loom_mem_sub(LOOM_MEM_DATA, batch_bytes(b));
  loom_tensor_free(&b->x);
  loom_tensor_free(&b->y);
  loom_free(b->sample);
  memset(b, 0, sizeof *b);
}

/* The batch is one loom_batch_alloc made for a data set of ds's kind and
 * sample shape: rows of ds fit its buffers. */
static loom_status check_batch(const loom_dataset *ds, const loom_batch *b) {
  const bool img = ds->kind == LOOM_DATASET_IMAGES;
  const loom_dtype xt = img ? LOOM_F32 : LOOM_I32;
  const int64_t row[3] = {img ? ds->C : ds->T, ds->H, ds->W}; /* x's */
  const int xnd = img ? 4 : 2, ynd = img ? 1 : 2;
  bool ok = b->x.data && b->y.data && b->sample && b->x.dtype == xt &&
            b->y.dtype == LOOM_I32 && b->x.ndim == xnd && b->y.ndim == ynd &&
            b->x.shape[0] >= 0 && b->y.shape[0] == b->x.shape[0];
  for (int i = 1; ok && i < xnd; i++)
    ok = b->x.shape[i] == row[i - 1];
  if (ok && !img)
    ok = b->y.shape[1] == ds->T;
  if (ok)
    return LOOM_OK;
  char want[64];
  if (img)
    snprintf(want, sizeof want, "f32 (N, %lld, %lld, %lld)", (long long)ds->C,
             (long long)ds->H, (long long)ds->W);
  else
    snprintf(want, sizeof want, "i32 (N, %lld)", (long long)ds->T);
  return loom_error(LOOM_ERR_INVALID_ARG,
                    "loom_dataset_fill: the batch was not allocated for %s "
                    "(%s data, x %s): loom_batch_alloc it for this data set",
                    ds->source, loom_dataset_kind_name(ds->kind), want);
}

loom_status loom_dataset_fill(const loom_dataset *ds, int64_t epoch,
                              const int64_t *idx, int64_t n, loom_batch *b) {
  if (!ds || !b || (n > 0 && !idx))
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_dataset_fill: NULL argument");
  if (n < 0 || n > b->capacity)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_fill: %lld rows for a batch of %lld",
                      (long long)n, (long long)b->capacity);
  LOOM_TRY(check_batch(ds, b));
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= ds->len)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "%s: sample %lld out of range [0, %lld)", ds->source,
                        (long long)idx[i], (long long)ds->len);
  loom_status st = ds->kind == LOOM_DATASET_IMAGES
                       ? loom_images_fill(ds, idx, n, b)
                       : loom_tokens_fill(ds, epoch, idx, n, b);
  if (st != LOOM_OK)
    return st;
  if (n > 0)
    memcpy(b->sample, idx, (size_t)n * sizeof *idx);
  b->size = n;
  b->x.shape[0] = n;
  b->y.shape[0] = n;
  b->epoch = epoch;
  return LOOM_OK;
}
