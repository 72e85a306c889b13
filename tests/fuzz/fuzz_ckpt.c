/* Fuzzes the checkpoint reader: the input is manifest.json, then a NUL
 * byte, then shard_00000.bin. The harness rewrites the manifest's
 * manifest_crc32c and the shard's header and footer checksums to match the
 * input, so the fuzzer gets past them to the fields they protect (a bad
 * manifest with a valid CRC is exactly what issue 10 found accepted). Every
 * buffer is then read back in full and the views are checked against it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "loom/ckpt.h"
#include "loom/core.h"

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* As src/ckpt/read.c checks it: CRC32C of the text with the 8 hex
 * digits of the last "manifest_crc32c" zeroed. */
static void fix_manifest_crc(char *t, size_t n) {
  static const char key[] = "\"manifest_crc32c\"";
  char *p = NULL;
  for (char *q = t; (q = strstr(q, key)) != NULL; q++)
    p = q;
  char *d = p ? strstr(p + sizeof key - 1, "\"0x") : NULL;
  if (!d || (size_t)(d + 12 - t) > n)
    return;
  d += 3;
  size_t at = (size_t)(d - t);
  uint32_t crc = loom_crc32c(0, t, at);
  crc = loom_crc32c(crc, "00000000", 8);
  crc = loom_crc32c(crc, t + at + 8, n - at - 8);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", crc);
  memcpy(d, hex, 8);
}

static void fix_shard(uint8_t *s, size_t n) {
  if (n >= 64)
    put_u32(s + 60, loom_crc32c(0, s, 60));
  if (n >= 64 + 32) {
    uint8_t *f = s + n - 32;
    put_u32(f + 28, loom_crc32c(0, f, 28));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20)
    return 0;
  const uint8_t *nul = memchr(data, 0, size);
  size_t mn = nul ? (size_t)(nul - data) : size;
  char *m = malloc(mn + 1);
  uint8_t *sh = malloc(size - mn + 1);
  if (!m || !sh)
    abort();
  memcpy(m, data, mn);
  m[mn] = '\0';
  fix_manifest_crc(m, mn);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/step_00000001", fuzz_dir());
  mkdir(dir, 0700);
  char name[64];
  snprintf(name, sizeof name, "step_00000001/manifest.json");
  fuzz_write(name, m, mn);
  size_t sn = 0;
  if (nul) {
    sn = size - mn - 1;
    memcpy(sh, nul + 1, sn);
    fix_shard(sh, sn);
    fuzz_write("step_00000001/shard_00000.bin", sh, sn);
  } else {
    char p[1100];
    snprintf(p, sizeof p, "%s/shard_00000.bin", dir);
    remove(p);
  }
  for (int level = 0; level < 2; level++) {
    loom_ckpt_open_opts o = loom_ckpt_open_opts_default();
    o.verify = level ? LOOM_CKPT_VERIFY_FULL : LOOM_CKPT_VERIFY_META;
    loom_ckpt *c = NULL;
    if (loom_ckpt_open(&c, dir, &o) != LOOM_OK)
      continue;
    const loom_ckpt_meta *meta = loom_ckpt_get_meta(c);
    loom_ckpt_buffer_info params = {0};
    bool have_params = loom_ckpt_buffer_find(c, "params", &params) == LOOM_OK;
    for (int v = 0; v < meta->n_views; v++) {
      const loom_param *p = &meta->views[v];
      /* What the reader promises about views it accepted. */
      if (!have_params || p->offset < 0 || p->numel < 0 ||
          p->offset > params.count - p->numel)
        abort();
    }
    for (int i = 0; i < loom_ckpt_buffer_count(c); i++) {
      loom_ckpt_buffer_info bi;
      if (loom_ckpt_buffer_get(c, i, &bi) != LOOM_OK)
        abort();
      size_t es = loom_dtype_size(bi.dtype);
      if (bi.count < 0 || (size_t)bi.count > ((size_t)16 << 20) / es)
        continue;
      void *buf = malloc((size_t)bi.count * es + 1);
      if (!buf)
        abort();
      (void)loom_ckpt_read_range(c, bi.name, 0, bi.count, buf);
      if (bi.count > 2)
        (void)loom_ckpt_read_range(c, bi.name, 1, bi.count - 1, buf);
      free(buf);
    }
    for (int i = 0; i < loom_ckpt_file_count(c); i++)
      (void)loom_ckpt_verify_file(c, i, LOOM_CKPT_VERIFY_FULL);
    loom_ckpt_close(c);
  }
  free(m);
  free(sh);
  return 0;
}
