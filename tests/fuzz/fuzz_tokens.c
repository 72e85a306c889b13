/* Fuzzes llm.c token shards: loom_shard_open, then a data set over the
 * shard with every window filled (the first input byte picks the
 * context). */
#include <stdlib.h>

#include "fuzz.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  int64_t T = 1 + data[0] % 16;
  const char *path = fuzz_write("in.bin", data + 1, size - 1);
  loom_shard sh;
  if (loom_shard_open(path, &sh) == LOOM_OK) {
    volatile uint32_t sink = 0;
    for (int64_t i = 0; i < sh.ntok; i++)
      sink ^= loom_shard_token(&sh, i);
    (void)sink;
    loom_shard_close(&sh);
  }
  loom_text_opts o = loom_text_opts_default();
  o.context = T;
  o.random_offset = data[0] & 0x80;
  loom_dataset *ds = NULL;
  if (loom_dataset_open_shards(&ds, path, &o) != LOOM_OK)
    return 0;
  (void)loom_dataset_check_vocab(ds, 1 + (int64_t)(data[0] & 0x7f) * 512);
  loom_dataset_info info;
  loom_dataset_get_info(ds, &info);
  loom_batch b;
  if (loom_batch_alloc(&b, ds, 4) == LOOM_OK) {
    int64_t idx[4];
    for (int64_t w = 0; w < info.len && w < 4096; w += 4) {
      int64_t n = 0;
      for (; n < 4 && w + n < info.len; n++)
        idx[n] = w + n;
      for (int64_t e = 0; e < 2; e++)
        (void)loom_dataset_fill(ds, e, idx, n, &b);
    }
    loom_batch_free(&b);
  }
  loom_dataset_free(ds);
  return 0;
}
