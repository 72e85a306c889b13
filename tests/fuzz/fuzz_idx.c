/* Fuzzes the IDX reader (plain or gzip) through a file in the harness's own
 * directory. */
#include "fuzz.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("in.idx", data, size);
  loom_idx idx;
  if (loom_idx_read(path, &idx) == LOOM_OK) {
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < idx.bytes; i++)
      sink ^= idx.data[i];
    (void)sink;
    loom_idx_free(&idx);
  }
  return 0;
}
