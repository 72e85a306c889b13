/* Image data sets from IDX files (Fashion-MNIST): bytes in memory, batches
 * normalised to f32. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

loom_image_opts loom_image_opts_default(void) {
  loom_image_opts o = {LOOM_FASHION_MEAN, LOOM_FASHION_STD};
  return o;
}

loom_status loom_dataset_open_idx(loom_dataset **out, const char *images,
                                  const char *labels,
                                  const loom_image_opts *opts) {
  if (!out || !images || !labels)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_open_idx: NULL argument");
  *out = NULL;
  /* Errors found here return a constant (or a status set to one), not
   * loom_error's result: the analyzer does not see into error.c, and would
   * let callers go on with LOOM_OK and *out NULL. */
  loom_image_opts o = opts ? *opts : loom_image_opts_default();
  if (!(o.std > 0.0f) || o.mean != o.mean) {
    loom_error(LOOM_ERR_INVALID_ARG,
               "image normalisation needs std > 0 (got mean %g, std %g)",
               (double)o.mean, (double)o.std);
    return LOOM_ERR_INVALID_ARG;
  }
  loom_idx im = {0}, lb = {0};
  loom_dataset *ds = NULL;
  loom_status st = LOOM_OK;
  LOOM_TRY_GOTO(st, loom_idx_read(images, &im), fail);
  LOOM_TRY_GOTO(st, loom_idx_read(labels, &lb), fail);
  if (im.ndim != 3 && im.ndim != 4) {
    st = LOOM_ERR_CORRUPT;
    loom_error(st,
               "%s: images need 3 dimensions (N, H, W) or 4 (N, C, H, W), the "
               "file has %d",
               images, im.ndim);
    goto fail;
  }
  if (lb.ndim != 1) {
    st = LOOM_ERR_CORRUPT;
    loom_error(st, "%s: labels need 1 dimension (N), the file has %d", labels,
               lb.ndim);
    goto fail;
  }
  if (im.dims[0] != lb.dims[0]) {
    st = LOOM_ERR_CORRUPT;
    loom_error(st, "%s holds %lld images but %s holds %lld labels", images,
               (long long)im.dims[0], labels, (long long)lb.dims[0]);
    goto fail;
  }
  ds = loom_calloc(1, sizeof *ds);
  if (!ds || !(ds->source = loom_data_strdup(images))) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  ds->kind = LOOM_DATASET_IMAGES;
  ds->len = im.dims[0];
  ds->C = im.ndim == 4 ? im.dims[1] : 1;
  ds->H = im.dims[im.ndim - 2];
  ds->W = im.dims[im.ndim - 1];
  uint8_t maxl = 0;
  for (size_t i = 0; i < lb.bytes; i++)
    if (lb.data[i] > maxl)
      maxl = lb.data[i];
  ds->classes = (int64_t)maxl + 1;
  /* The same float operations as ToTensor (x/255) then Normalize
   * ((v - mean)/std), so a batch equals PyTorch's bit for bit. */
  for (int v = 0; v < 256; v++)
    ds->lut[v] = ((float)v / 255.0f - o.mean) / o.std;
  ds->pixels = im.data;
  ds->labels = lb.data;
  ds->held = im.bytes + lb.bytes;
  loom_mem_add(LOOM_MEM_DATA, ds->held);
  *out = ds;
  return LOOM_OK;

fail:
  loom_dataset_free(ds);
  loom_idx_free(&im);
  loom_idx_free(&lb);
  return st;
}

/* dir/stem.gz if present, else dir/stem; *found false when neither is.
 * A name that is there but cannot be opened as a file (a symbolic link in
 * a loop, or to nothing) counts as found, so that reading it names it and
 * says why. */
static loom_status find_idx(const char *dir, const char *stem, char *buf,
                            size_t cap, bool *found) {
  struct stat sb;
  int n = snprintf(buf, cap, "%s/%s.gz", dir, stem);
  if (n < 0 || (size_t)n >= cap)
    return loom_error(LOOM_ERR_INVALID_ARG, "path too long: %s/%s", dir, stem);
  *found = true;
  if (stat(buf, &sb) == 0)
    return LOOM_OK;
  snprintf(buf, cap, "%s/%s", dir, stem);
  if (stat(buf, &sb) == 0 || lstat(buf, &sb) == 0)
    return LOOM_OK;
  snprintf(buf, cap, "%s/%s.gz", dir, stem);
  if (lstat(buf, &sb) == 0)
    return LOOM_OK;
  snprintf(buf, cap, "%s/%s.gz", dir, stem); /* name the usual file */
  *found = false;
  return LOOM_OK;
}

/* The split's two IDX files in dir (NULL: Debian's), or an error naming
 * the one missing. images and labels hold 4096 bytes. */
static loom_status fashion_paths(const char *dir, loom_split split,
                                 char *images, char *labels) {
  const char *d = dir && dir[0] ? dir : LOOM_FASHION_MNIST_DIR;
  const char *pre = split == LOOM_SPLIT_TRAIN ? "train" : "t10k";
  char stem[64];
  bool fi = false, fl = false;
  snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
  LOOM_TRY(find_idx(d, stem, images, 4096, &fi));
  snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
  LOOM_TRY(find_idx(d, stem, labels, 4096, &fl));
  if (!fi || !fl) {
    const char *missing = !fi ? images : labels;
    if (dir && dir[0])
      return loom_error(LOOM_ERR_IO,
                        "Fashion-MNIST not found: %s is missing (data.path "
                        "is %s; leave it unset to use Debian's %s in %s)",
                        missing, dir, LOOM_FASHION_MNIST_PACKAGE,
                        LOOM_FASHION_MNIST_DIR);
    return loom_error(LOOM_ERR_IO,
                      "Fashion-MNIST not found: %s is missing; install it "
                      "with 'apt-get install %s' (or 'make deps'), or set "
                      "data.path to a directory holding the IDX files",
                      missing, LOOM_FASHION_MNIST_PACKAGE);
  }
  return LOOM_OK;
}

loom_status loom_fashion_bytes(const char *dir, loom_split split,
                               int64_t *bytes, int64_t *n) {
  if (!bytes || (unsigned)split >= LOOM_SPLIT_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_fashion_bytes: bad argument");
  char images[4096], labels[4096];
  LOOM_TRY(fashion_paths(dir, split, images, labels));
  loom_idx im, lb;
  LOOM_TRY(loom_idx_read_header(images, &im));
  LOOM_TRY(loom_idx_read_header(labels, &lb));
  *bytes = (int64_t)(im.bytes + lb.bytes);
  if (n)
    *n = im.dims[0];
  return LOOM_OK;
}

loom_status loom_dataset_open_fashion(loom_dataset **out, const char *dir,
                                      loom_split split,
                                      const loom_image_opts *opts) {
  if (!out || (unsigned)split >= LOOM_SPLIT_COUNT)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_open_fashion: bad argument");
  *out = NULL;
  char images[4096], labels[4096];
  LOOM_TRY(fashion_paths(dir, split, images, labels));
  loom_dataset *ds = NULL;
  LOOM_TRY(loom_dataset_open_idx(&ds, images, labels, opts));
  if (ds->C != 1 || ds->H != 28 || ds->W != 28) {
    loom_status st = loom_error(
        LOOM_ERR_CORRUPT,
        "%s: not Fashion-MNIST: images are %lldx%lldx%lld (expected 1x28x28)",
        images, (long long)ds->C, (long long)ds->H, (long long)ds->W);
    loom_dataset_free(ds);
    return st;
  }
  if (ds->classes > 10) {
    loom_status st = loom_error(
        LOOM_ERR_CORRUPT,
        "%s: not Fashion-MNIST: a label is %lld (expected 10 classes, labels "
        "0 to 9)",
        labels, (long long)ds->classes - 1);
    loom_dataset_free(ds);
    return st;
  }
  ds->classes = 10;
  *out = ds;
  return LOOM_OK;
}

loom_status loom_images_fill(const loom_dataset *ds, const int64_t *idx,
                             int64_t n, loom_batch *b) {
  const size_t S = (size_t)(ds->C * ds->H * ds->W);
  float *x = b->x.data;   /* (B, C, H, W) */
  int32_t *y = b->y.data; /* (B) */
  if (ds->values) {       /* loom_dataset_from_arrays: the values as given */
    for (int64_t i = 0; i < n; i++) {
      memcpy(x + (size_t)i * S, ds->values + (size_t)idx[i] * S, S * sizeof *x);
      y[i] = ds->ilabels[idx[i]];
    }
    return LOOM_OK;
  }
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *src = ds->pixels + (size_t)idx[i] * S;
    float *dst = x + (size_t)i * S;
    for (size_t p = 0; p < S; p++)
      dst[p] = ds->lut[src[p]];
    y[i] = ds->labels[idx[i]];
  }
  return LOOM_OK;
}

loom_array_opts loom_array_opts_default(void) {
  loom_array_opts o = {.classes = 0, .name = "arrays"};
  return o;
}

loom_status loom_dataset_from_arrays(loom_dataset **out, const float *x,
                                     const int32_t *y, int64_t n, int64_t C,
                                     int64_t H, int64_t W,
                                     const loom_array_opts *opts) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_from_arrays: out is NULL");
  *out = NULL;
  loom_array_opts o = opts ? *opts : loom_array_opts_default();
  const char *name = o.name && *o.name ? o.name : "arrays";
  if (!x || !y)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_from_arrays: %s: %s is NULL", name,
                      !x ? "x (the samples)" : "y (the labels)");
  /* Each size at most 2^31 and the whole at most 2^40 values: no product
   * below overflows, and a typo (a count of bytes for one of samples) is
   * named, not allocated. */
  const int64_t lim = (int64_t)1 << 31;
  if (n < 1 || C < 1 || H < 1 || W < 1 || n > lim || C > lim || H > lim ||
      W > lim || (double)n * (double)C * (double)H * (double)W > 0x1p40)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_from_arrays: %s: %lld samples of (%lld, "
                      "%lld, %lld): each size must be at least 1 (tabular "
                      "data: C = H = 1, W features), at most 2^40 values",
                      name, (long long)n, (long long)C, (long long)H,
                      (long long)W);
  if (o.classes < 0 || o.classes > lim)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_dataset_from_arrays: %s: classes %lld (0: the "
                      "largest label + 1)",
                      name, (long long)o.classes);
  const int64_t S = C * H * W;
  for (int64_t i = 0; i < n; i++) {
    if (y[i] < 0 || (o.classes > 0 && y[i] >= o.classes))
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "loom_dataset_from_arrays: %s: label %d of sample "
                        "%lld is outside [0, %lld)",
                        name, (int)y[i], (long long)i,
                        (long long)(o.classes > 0 ? o.classes : lim));
    for (int64_t j = 0; j < S; j++)
      if (!isfinite(x[i * S + j]))
        return loom_error(
            LOOM_ERR_INVALID_ARG,
            "loom_dataset_from_arrays: %s: sample %lld, value %lld is %g: "
            "training on it would make the loss NaN",
            name, (long long)i, (long long)j, (double)x[i * S + j]);
  }
  loom_dataset *ds = loom_calloc(1, sizeof *ds);
  if (!ds)
    return LOOM_ERR_NOMEM;
  ds->kind = LOOM_DATASET_IMAGES;
  ds->len = n;
  ds->C = C;
  ds->H = H;
  ds->W = W;
  ds->source = loom_data_strdup(name);
  ds->values = loom_malloc((size_t)(n * S) * sizeof(float));
  ds->ilabels = loom_malloc((size_t)n * sizeof(int32_t));
  if (!ds->source || !ds->values || !ds->ilabels) {
    loom_dataset_free(ds);
    return loom_error(LOOM_ERR_NOMEM,
                      "loom_dataset_from_arrays: %s: no memory for %lld "
                      "samples of %lld values",
                      name, (long long)n, (long long)S);
  }
  memcpy(ds->values, x, (size_t)(n * S) * sizeof(float));
  memcpy(ds->ilabels, y, (size_t)n * sizeof(int32_t));
  int32_t maxl = 0;
  for (int64_t i = 0; i < n; i++)
    if (y[i] > maxl)
      maxl = y[i];
  ds->classes = o.classes > 0 ? o.classes : (int64_t)maxl + 1;
  ds->held = (size_t)(n * S) * sizeof(float) + (size_t)n * sizeof(int32_t);
  loom_mem_add(LOOM_MEM_DATA, ds->held);
  *out = ds;
  return LOOM_OK;
}
