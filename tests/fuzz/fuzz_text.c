/* Fuzzes the byte-level text data set (loom_dataset_open_text, both
 * splits) with every window filled; the first input byte picks the context
 * and the validation fraction. */
#include "fuzz.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const char *path = fuzz_write("in.txt", data + 1, size - 1);
  loom_text_opts o = loom_text_opts_default();
  o.context = 1 + data[0] % 32;
  o.val_fraction = (data[0] >> 5) / 8.0;
  o.random_offset = data[0] & 0x10;
  for (int split = 0; split < 2; split++) {
    loom_dataset *ds = NULL;
    if (loom_dataset_open_text(&ds, path,
                               split ? LOOM_SPLIT_VAL : LOOM_SPLIT_TRAIN,
                               &o) != LOOM_OK)
      continue;
    (void)loom_dataset_check_vocab(ds, 128);
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
  }
  return 0;
}
