/* Reading checkpoints: the manifest (self-checked, then every field
 * checked), verification of shard files, element ranges sliced across
 * shards, and the search for the newest valid checkpoint. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"

#define JSON_INT_MAX 9007199254740992LL /* 2^53 */
#define MANIFEST_MAX ((size_t)1 << 30)
#define VERIFY_CHUNK ((size_t)4 << 20)

typedef struct rblock {
  int64_t begin, count, offset;
  uint32_t crc;
  int file;
} rblock;

typedef struct rbuffer {
  char name[LOOM_CKPT_NAME_MAX];
  loom_dtype dtype;
  int64_t count;
  int n_shards;
  int first, n; /* its blocks in c->blocks, by element */
} rbuffer;

typedef struct rfile {
  char name[LOOM_CKPT_NAME_MAX];
  int rank;
  int64_t bytes;
  uint32_t index_crc;
  int n_blocks;
} rfile;

struct loom_ckpt {
  char dir[CKPT_PATH_MAX];
  char mpath[CKPT_PATH_MAX]; /* DIR/manifest.json */
  char *text;
  loom_ckpt_meta meta;
  loom_param *views;
  loom_ckpt_rng *rngs;
  char *extra; /* cJSON-allocated */
  rbuffer *bufs;
  int n_bufs;
  rblock *blocks;
  int n_blocks;
  rfile *files;
  int n_files;
};

loom_ckpt_open_opts loom_ckpt_open_opts_default(void) {
  loom_ckpt_open_opts o = {LOOM_CKPT_VERIFY_FULL, 0, INT64_MAX};
  return o;
}

void loom_ckpt_close(loom_ckpt *c) {
  if (!c)
    return;
  loom_free(c->text);
  loom_free(c->views);
  loom_free(c->rngs);
  if (c->extra)
    cJSON_free(c->extra);
  loom_free(c->bufs);
  loom_free(c->blocks);
  loom_free(c->files);
  loom_free(c);
}

/* ------------------------------------------------------- manifest fields */

/* Every manifest problem is LOOM_ERR_CORRUPT naming the file and the field
 * ("buffers[1].shards[0].end"). */
static loom_status bad(const loom_ckpt *c, const char *where, const char *key,
                       const char *what) {
  return loom_error(LOOM_ERR_CORRUPT, "%s: %s%s%s: %s", c->mpath, where,
                    where[0] ? "." : "", key, what);
}

static const cJSON *field(const cJSON *o, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(o, key);
}

static loom_status j_int(const loom_ckpt *c, const cJSON *o, const char *where,
                         const char *key, int64_t lo, int64_t hi,
                         int64_t *out) {
  const cJSON *x = field(o, key);
  if (!cJSON_IsNumber(x))
    return bad(c, where, key, "missing or not a number");
  double v = x->valuedouble;
  if (!(v == floor(v)) || v < (double)lo || v > (double)hi)
    return bad(c, where, key, "not an integer in range");
  *out = (int64_t)v;
  return LOOM_OK;
}

static loom_status j_num(const loom_ckpt *c, const cJSON *o, const char *where,
                         const char *key, double *out) {
  const cJSON *x = field(o, key);
  if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
    return bad(c, where, key, "missing or not a number");
  *out = x->valuedouble;
  return LOOM_OK;
}

static loom_status j_str(const loom_ckpt *c, const cJSON *o, const char *where,
                         const char *key, char *buf, size_t n) {
  const cJSON *x = field(o, key);
  if (!cJSON_IsString(x) || strlen(x->valuestring) >= n)
    return bad(c, where, key, "missing, not a string, or too long");
  memcpy(buf, x->valuestring, strlen(x->valuestring) + 1);
  return LOOM_OK;
}

/* extra.loss_scaler, the f16 loss scaler's state (docs/checkpoints.md),
 * when present: mode dynamic or static, good_steps and skipped whole
 * numbers of steps from 0 to the checkpoint's step. */
static loom_status check_loss_scaler(const loom_ckpt *c, const cJSON *ls,
                                     int64_t step) {
  if (!ls)
    return LOOM_OK;
  const char *w = "extra.loss_scaler";
  if (!cJSON_IsObject(ls))
    return bad(c, "extra", "loss_scaler", "not an object");
  const char *mode = cJSON_GetStringValue(field(ls, "mode"));
  char what[160];
  if (!mode || (strcmp(mode, "dynamic") != 0 && strcmp(mode, "static") != 0)) {
    snprintf(what, sizeof what, "%s%.40s%s: expected dynamic or static",
             mode ? "'" : "not a string", mode ? mode : "", mode ? "'" : "");
    return bad(c, w, "mode", what);
  }
  static const char *const counts[] = {"good_steps", "skipped"};
  for (int i = 0; i < 2; i++) {
    const cJSON *x = field(ls, counts[i]);
    const double v = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    if (!(v >= 0 && v <= (double)step && v == floor(v))) {
      snprintf(what, sizeof what,
               "%s%.17g: expected a whole number of steps from 0 to the "
               "checkpoint's step, %lld",
               cJSON_IsNumber(x) ? "" : "not a number, ",
               cJSON_IsNumber(x) ? v : 0.0, (long long)step);
      return bad(c, w, counts[i], what);
    }
  }
  return LOOM_OK;
}

static loom_status j_hex(const loom_ckpt *c, const cJSON *o, const char *where,
                         const char *key, int digits, uint64_t *out) {
  const cJSON *x = field(o, key);
  if (!cJSON_IsString(x))
    return bad(c, where, key, "missing or not a hex string");
  const char *s = x->valuestring;
  if (strncmp(s, "0x", 2) != 0 || strlen(s) != (size_t)digits + 2)
    return bad(c, where, key, "not a hex string of the right length");
  uint64_t v = 0;
  for (const char *p = s + 2; *p; p++) {
    int d = (*p >= '0' && *p <= '9')   ? *p - '0'
            : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
            : (*p >= 'A' && *p <= 'F') ? *p - 'A' + 10
                                       : -1;
    if (d < 0)
      return bad(c, where, key, "not a hex string");
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return LOOM_OK;
}

static const cJSON *j_arr(const loom_ckpt *c, const cJSON *o, const char *where,
                          const char *key, loom_status *st) {
  const cJSON *x = field(o, key);
  if (!cJSON_IsArray(x)) {
    *st = bad(c, where, key, "missing or not a list");
    return NULL;
  }
  return x;
}

static const cJSON *j_obj(const loom_ckpt *c, const cJSON *o, const char *where,
                          const char *key, loom_status *st) {
  const cJSON *x = field(o, key);
  if (!cJSON_IsObject(x)) {
    *st = bad(c, where, key, "missing or not an object");
    return NULL;
  }
  return x;
}

/* The manifest's own checksum: the 8 hex digits of its last member,
 * "manifest_crc32c", are the CRC32C of the text with those digits zeroed. */
static loom_status check_manifest_crc(const loom_ckpt *c, size_t len) {
  static const char key[] = "\"manifest_crc32c\"";
  const char *p = NULL, *q = c->text;
  while ((q = strstr(q, key)) != NULL)
    p = q++;
  const char *d = p ? strstr(p + sizeof key - 1, "\"0x") : NULL;
  if (!d || (size_t)(d + 12 - c->text) > len || d[11] != '"')
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: no manifest_crc32c at its end (cut short, or not "
                      "written by loom)",
                      c->mpath);
  d += 3;
  uint32_t stored = 0;
  for (int i = 0; i < 8; i++) {
    char ch = d[i];
    int v = (ch >= '0' && ch <= '9')   ? ch - '0'
            : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
                                       : -1;
    if (v < 0)
      return loom_error(LOOM_ERR_CORRUPT, "%s: manifest_crc32c is not hex",
                        c->mpath);
    stored = stored << 4 | (uint32_t)v;
  }
  size_t at = (size_t)(d - c->text);
  uint32_t crc = loom_crc32c(0, c->text, at);
  crc = loom_crc32c(crc, "00000000", 8);
  crc = loom_crc32c(crc, c->text + at + 8, len - at - 8);
  if (crc != stored)
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: checksum mismatch (stored 0x%08x, computed 0x%08x): "
                      "the manifest was altered",
                      c->mpath, stored, crc);
  return LOOM_OK;
}

static loom_status parse_meta(loom_ckpt *c, const cJSON *root) {
  loom_status st = LOOM_OK;
  loom_ckpt_meta *m = &c->meta;
  int64_t v;
  char where[64];
  LOOM_TRY(j_int(c, root, "", "step", 0, JSON_INT_MAX - 1, &m->step));
  LOOM_TRY(j_int(c, root, "", "world_size", 1, 1000000, &v));
  m->world_size = (int)v;
  LOOM_TRY(j_str(c, root, "", "strategy", m->strategy, sizeof m->strategy));
  if (m->strategy[0] &&
      loom_ckpt_strategy_parse(m->strategy, NULL) != LOOM_OK) {
    snprintf(where, sizeof where, "unknown strategy '%s'", m->strategy);
    return bad(c, "", "strategy", where);
  }
  LOOM_TRY(j_hex(c, root, "", "config_hash", 16, &m->config_hash));
  LOOM_TRY(j_hex(c, root, "", "layout_hash", 16, &m->layout_hash));
  const cJSON *o = j_obj(c, root, "", "optimizer", &st);
  if (!o)
    return st;
  LOOM_TRY(j_str(c, o, "optimizer", "name", m->optimizer, sizeof m->optimizer));
  LOOM_TRY(j_int(c, o, "optimizer", "step", 0, JSON_INT_MAX - 1,
                 &m->optimizer_step));
  if (!(o = j_obj(c, root, "", "schedule", &st)))
    return st;
  LOOM_TRY(j_str(c, o, "schedule", "name", m->schedule, sizeof m->schedule));
  LOOM_TRY(
      j_int(c, o, "schedule", "step", 0, JSON_INT_MAX - 1, &m->schedule_step));
  LOOM_TRY(j_num(c, o, "schedule", "lr", &m->lr));
  LOOM_TRY(j_num(c, root, "", "loss_scale", &m->loss_scale));
  if (!ckpt_loss_scale_ok(m->loss_scale)) {
    snprintf(where, sizeof where, "%g is outside f32's normal range",
             m->loss_scale);
    return bad(c, "", "loss_scale", where);
  }
  if (!(o = j_obj(c, root, "", "data", &st)))
    return st;
  LOOM_TRY(j_int(c, o, "data", "epoch", 0, JSON_INT_MAX - 1, &m->data.epoch));
  LOOM_TRY(j_int(c, o, "data", "batch", 0, JSON_INT_MAX - 1, &m->data.batch));
  LOOM_TRY(j_int(c, o, "data", "sample", 0, JSON_INT_MAX - 1, &m->data.sample));

  const cJSON *a = j_arr(c, root, "", "rng", &st);
  if (!a)
    return st;
  int n = cJSON_GetArraySize(a);
  if (n > 0) {
    c->rngs = loom_calloc((size_t)n, sizeof *c->rngs);
    if (!c->rngs)
      return loom_error_context(LOOM_ERR_NOMEM, "%s", c->mpath);
  }
  int i = 0;
  const cJSON *x;
  cJSON_ArrayForEach(x, a) {
    loom_ckpt_rng *r = &c->rngs[i];
    snprintf(where, sizeof where, "rng[%d]", i);
    LOOM_TRY(j_str(c, x, where, "name", r->name, sizeof r->name));
    LOOM_TRY(j_hex(c, x, where, "seed", 16, &r->state.seed));
    LOOM_TRY(j_hex(c, x, where, "stream", 16, &r->state.stream));
    LOOM_TRY(j_hex(c, x, where, "counter", 16, &r->state.counter));
    i++;
  }
  m->rngs = c->rngs;
  m->n_rngs = n;

  if (!(a = j_arr(c, root, "", "views", &st)))
    return st;
  n = cJSON_GetArraySize(a);
  if (n > 0) {
    c->views = loom_calloc((size_t)n, sizeof *c->views);
    if (!c->views)
      return loom_error_context(LOOM_ERR_NOMEM, "%s", c->mpath);
  }
  i = 0;
  cJSON_ArrayForEach(x, a) {
    loom_param *p = &c->views[i];
    snprintf(where, sizeof where, "views[%d]", i);
    LOOM_TRY(j_str(c, x, where, "name", p->name, sizeof p->name));
    LOOM_TRY(j_int(c, x, where, "offset", 0, JSON_INT_MAX - 1, &p->offset));
    LOOM_TRY(j_int(c, x, where, "numel", 0, JSON_INT_MAX - 1, &p->numel));
    const cJSON *shape = j_arr(c, x, where, "shape", &st);
    if (!shape)
      return st;
    int nd = cJSON_GetArraySize(shape);
    if (nd > LOOM_MAX_DIMS)
      return bad(c, where, "shape", "more than 4 dimensions");
    p->ndim = nd;
    for (int d = 0; d < nd; d++) {
      const cJSON *e = cJSON_GetArrayItem(shape, d);
      if (!cJSON_IsNumber(e) || e->valuedouble < 0 ||
          e->valuedouble != floor(e->valuedouble) ||
          e->valuedouble >= (double)JSON_INT_MAX)
        return bad(c, where, "shape", "not a list of sizes");
      p->shape[d] = (int64_t)e->valuedouble;
    }
    const cJSON *dec = field(x, "decay");
    if (!cJSON_IsBool(dec))
      return bad(c, where, "decay", "missing or not true/false");
    p->decay = cJSON_IsTrue(dec);
    i++;
  }
  m->views = c->views;
  m->n_views = n;

  if (!(o = j_obj(c, root, "", "extra", &st)))
    return st;
  LOOM_TRY(check_loss_scaler(c, field(o, "loss_scaler"), m->step));
  c->extra = cJSON_PrintUnformatted(o);
  if (!c->extra)
    return loom_error_context(LOOM_ERR_NOMEM, "%s", c->mpath);
  m->extra_json = c->extra;
  return LOOM_OK;
}

static loom_status parse_files(loom_ckpt *c, const cJSON *root) {
  loom_status st = LOOM_OK;
  const cJSON *a = j_arr(c, root, "", "files", &st);
  if (!a)
    return st;
  int n = cJSON_GetArraySize(a);
  if (n != c->meta.world_size)
    return bad(c, "", "files", "not one file per rank");
  c->files = loom_calloc((size_t)n, sizeof *c->files);
  if (!c->files)
    return loom_error_context(LOOM_ERR_NOMEM, "%s", c->mpath);
  c->n_files = n;
  int i = 0;
  const cJSON *x;
  char where[64], want[32];
  cJSON_ArrayForEach(x, a) {
    rfile *f = &c->files[i];
    int64_t v;
    uint64_t h;
    snprintf(where, sizeof where, "files[%d]", i);
    LOOM_TRY(j_str(c, x, where, "name", f->name, sizeof f->name));
    snprintf(want, sizeof want, "shard_%05d.bin", i);
    if (strcmp(f->name, want) != 0)
      return bad(c, where, "name", "not the shard file name of its rank");
    LOOM_TRY(j_int(c, x, where, "rank", i, i, &v));
    f->rank = i;
    LOOM_TRY(j_int(c, x, where, "bytes", CKPT_HEADER_BYTES + CKPT_FOOTER_BYTES,
                   JSON_INT_MAX - 1, &f->bytes));
    LOOM_TRY(j_int(c, x, where, "blocks", 0, 100000000, &v));
    f->n_blocks = (int)v;
    LOOM_TRY(j_hex(c, x, where, "index_crc32c", 8, &h));
    f->index_crc = (uint32_t)h;
    if (f->bytes < CKPT_HEADER_BYTES + (int64_t)f->n_blocks * CKPT_ENTRY_BYTES +
                       CKPT_FOOTER_BYTES)
      return bad(c, where, "bytes", "too small for its blocks");
    i++;
  }
  return LOOM_OK;
}

static loom_status parse_buffers(loom_ckpt *c, const cJSON *root) {
  loom_status st = LOOM_OK;
  const cJSON *a = j_arr(c, root, "", "buffers", &st);
  if (!a)
    return st;
  int nb = cJSON_GetArraySize(a);
  /* Count the blocks first: one allocation for all. */
  int64_t total_blocks = 0;
  const cJSON *x, *s;
  cJSON_ArrayForEach(x, a) {
    const cJSON *sh = field(x, "shards");
    if (cJSON_IsArray(sh))
      cJSON_ArrayForEach(s, sh) {
        const cJSON *bl = field(s, "blocks");
        if (cJSON_IsArray(bl))
          total_blocks += cJSON_GetArraySize(bl);
      }
  }
  if (total_blocks > 100000000)
    return bad(c, "", "buffers", "too many blocks");
  c->bufs = loom_calloc((size_t)nb + 1, sizeof *c->bufs);
  c->blocks = loom_calloc((size_t)total_blocks + 1, sizeof *c->blocks);
  int *per_file = loom_calloc((size_t)c->n_files, sizeof *per_file);
  if (!c->bufs || !c->blocks || !per_file) {
    loom_free(per_file);
    return loom_error_context(LOOM_ERR_NOMEM, "%s", c->mpath);
  }
  char where[96], dtype[16];
  int bi = 0, k = 0;
  cJSON_ArrayForEach(x, a) {
    rbuffer *b = &c->bufs[bi];
    snprintf(where, sizeof where, "buffers[%d]", bi);
    LOOM_TRY_GOTO(st, j_str(c, x, where, "name", b->name, sizeof b->name),
                  done);
    if (!loom_ckpt_name_ok(b->name)) {
      st = bad(c, where, "name", "not a valid buffer name");
      goto done;
    }
    for (int j = 0; j < bi; j++)
      if (strcmp(c->bufs[j].name, b->name) == 0) {
        st = bad(c, where, "name", "a second buffer of that name");
        goto done;
      }
    LOOM_TRY_GOTO(st, j_str(c, x, where, "dtype", dtype, sizeof dtype), done);
    if (loom_dtype_parse(dtype, &b->dtype) != LOOM_OK) {
      st = bad(c, where, "dtype", "unknown dtype");
      goto done;
    }
    int64_t es = (int64_t)loom_dtype_size(b->dtype);
    LOOM_TRY_GOTO(
        st, j_int(c, x, where, "count", 0, JSON_INT_MAX - 1, &b->count), done);
    const cJSON *sh = j_arr(c, x, where, "shards", &st);
    if (!sh)
      goto done;
    b->first = k;
    int64_t at = 0;
    int si = 0;
    cJSON_ArrayForEach(s, sh) {
      char sw[128];
      int64_t rank, sb, se;
      snprintf(sw, sizeof sw, "%s.shards[%d]", where, si);
      LOOM_TRY_GOTO(st, j_int(c, s, sw, "rank", 0, c->n_files - 1, &rank),
                    done);
      char file[LOOM_CKPT_NAME_MAX];
      LOOM_TRY_GOTO(st, j_str(c, s, sw, "file", file, sizeof file), done);
      if (strcmp(file, c->files[rank].name) != 0) {
        st = bad(c, sw, "file", "not the file of its rank");
        goto done;
      }
      /* Shards in element order, each starting where the last ended. */
      LOOM_TRY_GOTO(st, j_int(c, s, sw, "begin", at, at, &sb), done);
      LOOM_TRY_GOTO(st, j_int(c, s, sw, "end", sb + 1, b->count, &se), done);
      const cJSON *bl = j_arr(c, s, sw, "blocks", &st);
      if (!bl)
        goto done;
      const cJSON *y;
      int64_t bat = sb;
      const rfile *f = &c->files[rank];
      int64_t data_end = f->bytes - CKPT_FOOTER_BYTES -
                         (int64_t)f->n_blocks * CKPT_ENTRY_BYTES;
      int bj = 0;
      cJSON_ArrayForEach(y, bl) {
        char bw[160];
        uint64_t crc;
        rblock *r = &c->blocks[k];
        snprintf(bw, sizeof bw, "%s.blocks[%d]", sw, bj);
        LOOM_TRY_GOTO(st, j_int(c, y, bw, "begin", bat, bat, &r->begin), done);
        LOOM_TRY_GOTO(st, j_int(c, y, bw, "count", 1, se - bat, &r->count),
                      done);
        LOOM_TRY_GOTO(st,
                      j_int(c, y, bw, "offset", CKPT_HEADER_BYTES,
                            data_end - r->count * es, &r->offset),
                      done);
        LOOM_TRY_GOTO(st, j_hex(c, y, bw, "crc32c", 8, &crc), done);
        r->crc = (uint32_t)crc;
        r->file = (int)rank;
        per_file[rank]++;
        bat += r->count;
        k++;
        bj++;
      }
      if (bat != se) {
        st = bad(c, sw, "blocks", "do not cover the shard's range");
        goto done;
      }
      at = se;
      si++;
    }
    if (at != b->count) {
      st = bad(c, where, "shards", "do not cover the buffer");
      goto done;
    }
    b->n_shards = si;
    b->n = k - b->first;
    bi++;
  }
  c->n_bufs = nb;
  c->n_blocks = k;
  for (int r = 0; r < c->n_files; r++)
    if (per_file[r] > c->files[r].n_blocks) {
      snprintf(where, sizeof where, "files[%d]", r);
      st = bad(c, where, "blocks", "does not match the buffers' blocks");
      goto done;
    }
done:
  loom_free(per_file);
  return st;
}

/* The views against the buffers: each one inside "params" (the buffer they
 * index), its numel the product of its shape, none overlapping another.
 * Checked after the CRC, since a manifest can be consistent with its own
 * checksum and still wrong. */
static loom_status check_views(const loom_ckpt *c) {
  const loom_ckpt_meta *m = &c->meta;
  if (m->n_views == 0)
    return LOOM_OK;
  const rbuffer *params = NULL;
  for (int i = 0; i < c->n_bufs; i++)
    if (strcmp(c->bufs[i].name, "params") == 0)
      params = &c->bufs[i];
  if (!params)
    return bad(c, "", "views", "views but no 'params' buffer for them");
  char where[64];
  int64_t end = 0; /* views are in buffer order (forward order) */
  for (int i = 0; i < m->n_views; i++) {
    const loom_param *v = &m->views[i];
    snprintf(where, sizeof where, "views[%d]", i);
    if (v->offset > params->count || v->numel > params->count - v->offset) {
      char why[160];
      snprintf(why, sizeof why,
               "[%lld, %lld) lies beyond the 'params' buffer (%lld elements)",
               (long long)v->offset, (long long)v->offset + v->numel,
               (long long)params->count);
      return bad(c, where, "offset", why);
    }
    if (v->offset < end)
      return bad(c, where, "offset", "overlaps the view before it");
    end = v->offset + v->numel;
    if (v->ndim > 0) {
      int64_t n = 1;
      for (int d = 0; d < v->ndim; d++) {
        if (v->shape[d] != 0 && n > params->count / v->shape[d]) {
          n = -1;
          break;
        }
        n *= v->shape[d];
      }
      if (n != v->numel)
        return bad(c, where, "numel", "not the product of its shape");
    } else if (v->numel != 1) {
      return bad(c, where, "numel", "not 1 for a scalar (no shape)");
    }
  }
  return LOOM_OK;
}

/* ------------------------------------------------------------ shard files */

static loom_status file_path(const loom_ckpt *c, int i, char *buf, size_t n) {
  int w = snprintf(buf, n, "%s/%s", c->dir, c->files[i].name);
  if (w < 0 || (size_t)w >= n)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", c->dir);
  return LOOM_OK;
}

static int cmp_entry_offset(const void *a, const void *b) {
  const ckpt_entry *x = a, *y = b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The shard's own block index against the manifest: every block the
 * manifest places in file i must be the entry at that offset, with the same
 * buffer, dtype, range and checksum. The manifest's checksum covers only
 * the manifest, so without this a manifest rewritten with a fresh checksum
 * (two blocks' offsets and CRCs swapped, say) would load one buffer's bytes
 * as another's. */
static loom_status check_index(const loom_ckpt *c, int i, int fd,
                               const char *path, int64_t index_at) {
  const rfile *f = &c->files[i];
  size_t ib = (size_t)f->n_blocks * CKPT_ENTRY_BYTES;
  unsigned char *index = loom_malloc(ib + 1);
  ckpt_entry *ents = loom_calloc((size_t)f->n_blocks + 1, sizeof *ents);
  loom_status st = LOOM_OK;
  if (!index || !ents) {
    st = loom_error_context(LOOM_ERR_NOMEM, "%s", path);
    goto done;
  }
  LOOM_TRY_GOTO(st, loom_ckpt_pread_all(fd, index, ib, index_at, path), done);
  uint32_t icrc = loom_crc32c(0, index, ib);
  if (icrc != f->index_crc) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: block index checksum mismatch (manifest 0x%08x, data "
                    "0x%08x)",
                    path, f->index_crc, icrc);
    goto done;
  }
  for (int e = 0; e < f->n_blocks; e++)
    if ((st = loom_ckpt_entry_decode(index + (size_t)e * CKPT_ENTRY_BYTES,
                                     &ents[e])) != LOOM_OK) {
      loom_error_context(st, "%s: block index entry %d", path, e);
      goto done;
    }
  qsort(ents, (size_t)f->n_blocks, sizeof *ents, cmp_entry_offset);
  for (int bi = 0; bi < c->n_bufs; bi++) {
    const rbuffer *b = &c->bufs[bi];
    for (int k = b->first; k < b->first + b->n; k++) {
      const rblock *r = &c->blocks[k];
      if (r->file != i)
        continue;
      ckpt_entry key = {.offset = r->offset};
      const ckpt_entry *e = bsearch(&key, ents, (size_t)f->n_blocks,
                                    sizeof *ents, cmp_entry_offset);
      if (!e || strcmp(e->name, b->name) != 0 || e->dtype != b->dtype ||
          e->total != b->count || e->begin != r->begin ||
          e->count != r->count || e->crc != r->crc) {
        st = loom_error(
            LOOM_ERR_CORRUPT,
            "%s: the manifest's block of '%s' [%lld, %lld) at byte %lld is "
            "not in the shard's block index (%s)",
            path, b->name, (long long)r->begin,
            (long long)(r->begin + r->count), (long long)r->offset,
            !e                              ? "no block starts there"
            : strcmp(e->name, b->name) != 0 ? "another buffer's block"
                                            : "its range, dtype or "
                                              "checksum differ");
        goto done;
      }
    }
  }
done:
  loom_free(index);
  loom_free(ents);
  return st;
}

/* Size, header and footer of shard file i against the manifest. On success
 * *fd_out holds the open file when fd_out is given. */
static loom_status check_file_meta(const loom_ckpt *c, int i, int *fd_out) {
  const rfile *f = &c->files[i];
  char path[CKPT_PATH_MAX];
  LOOM_TRY(file_path(c, i, path, sizeof path));
  int fd;
  LOOM_TRY(loom_ckpt_open_read(path, &fd));
  loom_status st = LOOM_OK;
  struct stat sb;
  unsigned char head[CKPT_HEADER_BYTES], foot[CKPT_FOOTER_BYTES];
  ckpt_header h;
  ckpt_footer ft;
  if (fstat(fd, &sb) != 0) {
    st = loom_error(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
    goto done;
  }
  if ((int64_t)sb.st_size != f->bytes) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: %s: %lld bytes, the manifest says "
                    "%lld",
                    path, (int64_t)sb.st_size < f->bytes ? "truncated" : "size",
                    (long long)sb.st_size, (long long)f->bytes);
    goto done;
  }
  LOOM_TRY_GOTO(st, loom_ckpt_pread_all(fd, head, sizeof head, 0, path), done);
  LOOM_TRY_GOTO(st,
                loom_ckpt_pread_all(fd, foot, sizeof foot,
                                    f->bytes - CKPT_FOOTER_BYTES, path),
                done);
  if ((st = loom_ckpt_header_decode(head, &h)) != LOOM_OK ||
      (st = loom_ckpt_footer_decode(foot, &ft)) != LOOM_OK) {
    loom_error_context(st, "%s", path);
    goto done;
  }
  int64_t index_at =
      f->bytes - CKPT_FOOTER_BYTES - (int64_t)f->n_blocks * CKPT_ENTRY_BYTES;
  if ((int)h.rank != i || (int)h.world != c->meta.world_size ||
      h.step != c->meta.step || (int)h.n_blocks != f->n_blocks ||
      h.index_offset != index_at || ft.index_offset != index_at ||
      (int)ft.n_blocks != f->n_blocks) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: header says rank %u of %u, step %lld, %u blocks; the "
                    "manifest says rank %d of %d, step %lld, %d blocks",
                    path, h.rank, h.world, (long long)h.step, h.n_blocks, i,
                    c->meta.world_size, (long long)c->meta.step, f->n_blocks);
    goto done;
  }
  if (ft.index_crc != f->index_crc) {
    st = loom_error(LOOM_ERR_CORRUPT,
                    "%s: block index checksum 0x%08x, the manifest says "
                    "0x%08x",
                    path, ft.index_crc, f->index_crc);
    goto done;
  }
  st = check_index(c, i, fd, path, index_at);
done:
  if (st == LOOM_OK && fd_out)
    *fd_out = fd;
  else
    close(fd);
  return st;
}

static int cmp_block_offset(const void *a, const void *b) {
  const rblock *x = *(const rblock *const *)a, *y = *(const rblock *const *)b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The buffer a block belongs to (for messages). */
static const rbuffer *block_buffer(const loom_ckpt *c, const rblock *r) {
  int k = (int)(r - c->blocks);
  for (int i = 0; i < c->n_bufs; i++)
    if (k >= c->bufs[i].first && k < c->bufs[i].first + c->bufs[i].n)
      return &c->bufs[i];
  return &c->bufs[0];
}

/* Streams [off, off + n) through buf: CRC32C, or a check that it is all
 * zero (padding) when crc is NULL. */
static loom_status scan(int fd, const char *path, unsigned char *buf,
                        int64_t off, int64_t n, uint32_t *crc) {
  while (n > 0) {
    size_t chunk = (size_t)n < VERIFY_CHUNK ? (size_t)n : VERIFY_CHUNK;
    LOOM_TRY(loom_ckpt_pread_all(fd, buf, chunk, off, path));
    if (crc) {
      *crc = loom_crc32c(*crc, buf, chunk);
    } else {
      for (size_t i = 0; i < chunk; i++)
        if (buf[i])
          return loom_error(LOOM_ERR_CORRUPT,
                            "%s: byte %lld should be padding (zero)", path,
                            (long long)(off + (int64_t)i));
    }
    off += (int64_t)chunk;
    n -= (int64_t)chunk;
  }
  return LOOM_OK;
}

loom_status loom_ckpt_verify_file(const loom_ckpt *c, int i,
                                  loom_ckpt_verify_level level) {
  if (!c || i < 0 || i >= c->n_files)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_ckpt_verify_file: no file "
                      "%d",
                      i);
  if (level != LOOM_CKPT_VERIFY_NONE && level != LOOM_CKPT_VERIFY_META &&
      level != LOOM_CKPT_VERIFY_FULL)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_ckpt_verify_file: unknown level %d", (int)level);
  if (level == LOOM_CKPT_VERIFY_NONE)
    return LOOM_OK;
  if (level == LOOM_CKPT_VERIFY_META)
    return check_file_meta(c, i, NULL);
  const rfile *f = &c->files[i];
  char path[CKPT_PATH_MAX];
  LOOM_TRY(file_path(c, i, path, sizeof path));
  int fd = -1;
  LOOM_TRY(check_file_meta(c, i, &fd));
  loom_status st = LOOM_OK;
  const rblock **order =
      loom_calloc((size_t)f->n_blocks + 1, sizeof(const rblock *));
  unsigned char *buf = loom_malloc(VERIFY_CHUNK);
  if (!order || !buf) {
    st = loom_error_context(LOOM_ERR_NOMEM, "verifying %s", path);
    goto done;
  }
  int n = 0;
  for (int k = 0; k < c->n_blocks; k++)
    if (c->blocks[k].file == i)
      order[n++] = &c->blocks[k];
  qsort(order, (size_t)n, sizeof(const rblock *), cmp_block_offset);
  int64_t pos = CKPT_HEADER_BYTES;
  for (int k = 0; k < n; k++) {
    const rblock *r = order[k];
    const rbuffer *b = block_buffer(c, r);
    int64_t bytes = r->count * (int64_t)loom_dtype_size(b->dtype);
    if (r->offset < pos) {
      st = loom_error(LOOM_ERR_CORRUPT, "%s: blocks overlap at byte %lld", path,
                      (long long)r->offset);
      goto done;
    }
    LOOM_TRY_GOTO(st, scan(fd, path, buf, pos, r->offset - pos, NULL), done);
    uint32_t crc = 0;
    LOOM_TRY_GOTO(st, scan(fd, path, buf, r->offset, bytes, &crc), done);
    if (crc != r->crc) {
      st = loom_error(LOOM_ERR_CORRUPT,
                      "%s: block of '%s' [%lld, %lld) at byte %lld: checksum "
                      "mismatch (manifest 0x%08x, data 0x%08x)",
                      path, b->name, (long long)r->begin,
                      (long long)(r->begin + r->count), (long long)r->offset,
                      r->crc, crc);
      goto done;
    }
    pos = r->offset + bytes;
  }
  int64_t index_at =
      f->bytes - CKPT_FOOTER_BYTES - (int64_t)f->n_blocks * CKPT_ENTRY_BYTES;
  /* (the index itself: checked against the manifest by check_file_meta) */
  LOOM_TRY_GOTO(st, scan(fd, path, buf, pos, index_at - pos, NULL), done);
done:
  loom_free(order);
  loom_free(buf);
  close(fd);
  return st;
}

loom_status loom_ckpt_verify(const loom_ckpt *c) {
  if (!c)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_verify: NULL");
  for (int i = 0; i < c->n_files; i++)
    LOOM_TRY(loom_ckpt_verify_file(c, i, LOOM_CKPT_VERIFY_FULL));
  return LOOM_OK;
}

/* ------------------------------------------------------------------ open */

loom_status loom_ckpt_open(loom_ckpt **out, const char *dir,
                           const loom_ckpt_open_opts *opts) {
  if (!out || !dir || !dir[0])
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_open: %s",
                      !out   ? "out is NULL"
                      : !dir ? "dir is NULL"
                             : "dir is empty (a checkpoint directory's path)");
  *out = NULL;
  loom_ckpt_open_opts o = opts ? *opts : loom_ckpt_open_opts_default();
  loom_ckpt_json_init();
  loom_ckpt *c = loom_calloc(1, sizeof *c);
  if (!c)
    return loom_error_context(LOOM_ERR_NOMEM, "opening checkpoint %s", dir);
  loom_status st = LOOM_OK;
  cJSON *root = NULL;
  size_t dl = strlen(dir);
  while (dl > 1 && dir[dl - 1] == '/')
    dl--;
  if (dl + sizeof "/" CKPT_MANIFEST >= sizeof c->dir) {
    st = loom_error(LOOM_ERR_INVALID_ARG, "%s: path too long", dir);
    goto fail;
  }
  memcpy(c->dir, dir, dl);
  c->dir[dl] = '\0';
  memcpy(c->mpath, c->dir, dl);
  memcpy(c->mpath + dl, "/" CKPT_MANIFEST, sizeof "/" CKPT_MANIFEST);
  struct stat sb;
  if (stat(c->dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    st = loom_error(LOOM_ERR_IO, "%s: no such checkpoint directory", c->dir);
    goto fail;
  }
  size_t len = 0;
  LOOM_TRY_GOTO(st, loom_ckpt_read_file(c->mpath, MANIFEST_MAX, &c->text, &len),
                fail);
  if (strlen(c->text) != len) {
    st = loom_error(LOOM_ERR_CORRUPT, "%s: holds a NUL byte", c->mpath);
    goto fail;
  }
  LOOM_TRY_GOTO(st, check_manifest_crc(c, len), fail);
  if (!loom_ckpt_json_object_ok(c->text, len)) {
    st = loom_error(LOOM_ERR_CORRUPT, "%s: not a JSON object", c->mpath);
    goto fail;
  }
  root = cJSON_ParseWithLength(c->text, len);
  if (!root) { /* the syntax is fine, so: */
    st = loom_error(LOOM_ERR_NOMEM, "%s: out of memory parsing it", c->mpath);
    goto fail;
  }
  {
    char fmt[32];
    int64_t version = 0;
    if (j_str(c, root, "", "format", fmt, sizeof fmt) != LOOM_OK ||
        strcmp(fmt, "loom-checkpoint") != 0) {
      st = loom_error(LOOM_ERR_CORRUPT, "%s: not a loom checkpoint manifest",
                      c->mpath);
      goto fail;
    }
    LOOM_TRY_GOTO(st, j_int(c, root, "", "version", 1, 1000000, &version),
                  fail);
    if (version > LOOM_CKPT_FORMAT_VERSION) {
      st = loom_error(LOOM_ERR_UNSUPPORTED,
                      "%s: format version %lld; this loom reads version %d",
                      c->mpath, (long long)version, LOOM_CKPT_FORMAT_VERSION);
      goto fail;
    }
  }
  LOOM_TRY_GOTO(st, parse_meta(c, root), fail);
  if (o.layout_hash && o.layout_hash != c->meta.layout_hash) {
    st = loom_error(LOOM_ERR_MISMATCH,
                    "%s: written for another model (layout hash 0x%016llx, "
                    "this model's is 0x%016llx)",
                    c->mpath, (unsigned long long)c->meta.layout_hash,
                    (unsigned long long)o.layout_hash);
    goto fail;
  }
  LOOM_TRY_GOTO(st, parse_files(c, root), fail);
  LOOM_TRY_GOTO(st, parse_buffers(c, root), fail);
  LOOM_TRY_GOTO(st, check_views(c), fail);
  cJSON_Delete(root);
  root = NULL;
  for (int i = 0; i < c->n_files; i++)
    LOOM_TRY_GOTO(st, loom_ckpt_verify_file(c, i, o.verify), fail);
  *out = c;
  return LOOM_OK;
fail:
  cJSON_Delete(root);
  loom_ckpt_close(c);
  return st;
}

const loom_ckpt_meta *loom_ckpt_get_meta(const loom_ckpt *c) {
  return c ? &c->meta : NULL;
}

const char *loom_ckpt_path(const loom_ckpt *c) { return c ? c->dir : ""; }
const char *loom_ckpt_manifest_path(const loom_ckpt *c) {
  return c ? c->mpath : "";
}

const char *loom_ckpt_manifest_text(const loom_ckpt *c) {
  return c ? c->text : "";
}

int loom_ckpt_buffer_count(const loom_ckpt *c) { return c ? c->n_bufs : 0; }

static void buffer_info(const rbuffer *b, loom_ckpt_buffer_info *out) {
  out->name = b->name;
  out->dtype = b->dtype;
  out->count = b->count;
  out->n_shards = b->n_shards;
  out->n_blocks = b->n;
}

loom_status loom_ckpt_buffer_get(const loom_ckpt *c, int i,
                                 loom_ckpt_buffer_info *out) {
  if (!c || !out || i < 0 || i >= c->n_bufs)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_ckpt_buffer_get: no buffer "
                      "%d",
                      i);
  buffer_info(&c->bufs[i], out);
  return LOOM_OK;
}

static const rbuffer *find_buffer(const loom_ckpt *c, const char *name) {
  for (int i = 0; i < c->n_bufs; i++)
    if (strcmp(c->bufs[i].name, name) == 0)
      return &c->bufs[i];
  return NULL;
}

loom_status loom_ckpt_buffer_find(const loom_ckpt *c, const char *name,
                                  loom_ckpt_buffer_info *out) {
  if (!c || !name || !out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_buffer_find: NULL");
  const rbuffer *b = find_buffer(c, name);
  if (!b)
    return loom_error(LOOM_ERR_MISMATCH, "%s: no buffer '%s'", c->mpath, name);
  buffer_info(b, out);
  return LOOM_OK;
}

int loom_ckpt_file_count(const loom_ckpt *c) { return c ? c->n_files : 0; }

loom_status loom_ckpt_file_get(const loom_ckpt *c, int i,
                               loom_ckpt_file_info *out) {
  if (!c || !out || i < 0 || i >= c->n_files)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_file_get: no file %d",
                      i);
  out->name = c->files[i].name;
  out->rank = c->files[i].rank;
  out->bytes = c->files[i].bytes;
  out->index_crc = c->files[i].index_crc;
  out->n_blocks = c->files[i].n_blocks;
  return LOOM_OK;
}

/* ------------------------------------------------------------ reading */

loom_status loom_ckpt_read_range(const loom_ckpt *c, const char *name,
                                 int64_t begin, int64_t end, void *dst) {
  if (!c || !name || (!dst && end > begin))
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_read_range: NULL");
  const rbuffer *b = find_buffer(c, name);
  if (!b)
    return loom_error(LOOM_ERR_MISMATCH, "%s: no buffer '%s'", c->mpath, name);
  if (begin < 0 || end < begin || end > b->count)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "%s: buffer '%s' has %lld elements; asked for [%lld, "
                      "%lld)",
                      c->mpath, name, (long long)b->count, (long long)begin,
                      (long long)end);
  if (begin == end)
    return LOOM_OK;
  size_t es = loom_dtype_size(b->dtype);
  const rblock *blk = c->blocks + b->first;
  /* The first block ending after `begin`. */
  int lo = 0, hi = b->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (blk[mid].begin + blk[mid].count <= begin)
      lo = mid + 1;
    else
      hi = mid;
  }
  loom_status st = LOOM_OK;
  unsigned char *scratch = NULL;
  size_t scratch_n = 0;
  int fd = -1, fd_file = -1;
  char path[CKPT_PATH_MAX];
  for (int k = lo; k < b->n && blk[k].begin < end; k++) {
    const rblock *r = &blk[k];
    if (r->file != fd_file) {
      if (fd >= 0)
        close(fd);
      fd_file = r->file;
      LOOM_TRY_GOTO(st, file_path(c, r->file, path, sizeof path), done);
      LOOM_TRY_GOTO(st, loom_ckpt_open_read(path, &fd), done);
    }
    int64_t a = r->begin > begin ? r->begin : begin;
    int64_t z = r->begin + r->count < end ? r->begin + r->count : end;
    size_t bytes = (size_t)r->count * es;
    unsigned char *into;
    bool whole = a == r->begin && z == r->begin + r->count;
    if (whole) {
      into = (unsigned char *)dst + (size_t)(a - begin) * es;
    } else {
      if (scratch_n < bytes || !scratch) { /* (a 0-byte block too) */
        loom_free(scratch);
        scratch = loom_malloc(bytes ? bytes : 1);
        scratch_n = scratch ? bytes : 0;
        if (!scratch) {
          st = loom_error_context(LOOM_ERR_NOMEM, "reading %s", path);
          goto done;
        }
      }
      into = scratch;
    }
    LOOM_TRY_GOTO(st, loom_ckpt_pread_all(fd, into, bytes, r->offset, path),
                  done);
    uint32_t crc = loom_crc32c(0, into, bytes);
    if (crc != r->crc) {
      st = loom_error(LOOM_ERR_CORRUPT,
                      "%s: block of '%s' [%lld, %lld) at byte %lld: checksum "
                      "mismatch (manifest 0x%08x, data 0x%08x)",
                      path, name, (long long)r->begin,
                      (long long)(r->begin + r->count), (long long)r->offset,
                      r->crc, crc);
      goto done;
    }
    if (!whole)
      memcpy((unsigned char *)dst + (size_t)(a - begin) * es,
             scratch + (size_t)(a - r->begin) * es, (size_t)(z - a) * es);
  }
done:
  if (fd >= 0)
    close(fd);
  loom_free(scratch);
  return st;
}

/* ------------------------------------------------- newest valid checkpoint */

static loom_status try_open(loom_ckpt **out, const char *root, int64_t step,
                            const loom_ckpt_open_opts *o) {
  char dir[CKPT_PATH_MAX];
  LOOM_TRY(loom_ckpt_dir_name(root, step, dir, sizeof dir));
  loom_status st = loom_ckpt_open(out, dir, o);
  if (st == LOOM_OK && *out && (*out)->meta.step != step) {
    st = loom_error(LOOM_ERR_CORRUPT, "%s: says step %lld, not %lld",
                    (*out)->mpath, (long long)(*out)->meta.step,
                    (long long)step);
    loom_ckpt_close(*out);
    *out = NULL;
  }
  if (st != LOOM_OK && st != LOOM_ERR_NOMEM)
    LOOM_WARN("checkpoint %s is not usable, passing over it: %s", dir,
              loom_last_error());
  return st;
}

loom_status loom_ckpt_open_latest_valid(loom_ckpt **out, const char *root,
                                        const loom_ckpt_open_opts *opts) {
  if (!out || !root)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_open_latest_valid: "
                                            "NULL");
  *out = NULL;
  loom_ckpt_open_opts o = opts ? *opts : loom_ckpt_open_opts_default();
  int64_t *steps = NULL;
  int n = 0;
  LOOM_TRY(loom_ckpt_list(root, &steps, &n));
  int64_t latest = -1, limit = o.before_step;
  loom_status st = loom_ckpt_read_latest(root, &latest);
  int damaged = 0, other_model = 0;
  if (st == LOOM_OK && latest < o.before_step) {
    st = try_open(out, root, latest, &o);
    if (st == LOOM_OK || st == LOOM_ERR_NOMEM) {
      loom_free(steps);
      return st;
    }
    st == LOOM_ERR_MISMATCH ? other_model++ : damaged++;
    /* `latest` heads the run's history: steps above it were never
     * committed (an abandoned run), so only older ones may stand in. */
    limit = latest;
  } else if (st != LOOM_OK && n > 0) {
    LOOM_WARN("%s; using the newest valid checkpoint instead",
              loom_last_error());
  }
  for (int i = n - 1; i >= 0; i--) {
    if (steps[i] >= limit)
      continue;
    st = try_open(out, root, steps[i], &o);
    if (st == LOOM_OK || st == LOOM_ERR_NOMEM) {
      if (st == LOOM_OK && (damaged || other_model))
        LOOM_WARN("using the older checkpoint %s", loom_ckpt_path(*out));
      loom_free(steps);
      return st;
    }
    st == LOOM_ERR_MISMATCH ? other_model++ : damaged++;
  }
  loom_free(steps);
  /* Checkpoints of another model are never a reason to start afresh in
   * their directory: the new run's saves would take their names and its
   * pruning would remove them. The user chooses. */
  if (other_model)
    return loom_error(LOOM_ERR_CONFIG,
                      "%s: no checkpoint of this model (%d written for another "
                      "model%s%.0d%s; each named above): to start this model "
                      "from scratch here use --resume never (its checkpoints "
                      "then head this directory: its saves replace theirs at "
                      "the same steps and checkpoint.keep prunes older ones) "
                      "or another checkpoint.dir",
                      root, other_model, damaged ? ", " : "", damaged,
                      damaged ? " damaged" : "");
  if (damaged)
    return loom_error(LOOM_ERR_CORRUPT,
                      "%s: no valid checkpoint (%d damaged; see the warnings "
                      "above)",
                      root, damaged);
  return LOOM_OK;
}

loom_status loom_ckpt_find_latest_valid(const char *root,
                                        const loom_ckpt_open_opts *opts,
                                        char *dir, size_t dir_n,
                                        int64_t *step) {
  if (!dir || dir_n == 0 || !step)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_ckpt_find_latest_valid: "
                                            "NULL");
  dir[0] = '\0';
  *step = -1;
  loom_ckpt *c = NULL;
  LOOM_TRY(loom_ckpt_open_latest_valid(&c, root, opts));
  if (!c)
    return LOOM_OK;
  loom_status st = LOOM_OK;
  if (strlen(c->dir) >= dir_n)
    st = loom_error(LOOM_ERR_INVALID_ARG, "%s: longer than %zu bytes", c->dir,
                    dir_n);
  else {
    memcpy(dir, c->dir, strlen(c->dir) + 1);
    *step = c->meta.step;
  }
  loom_ckpt_close(c);
  return st;
}
