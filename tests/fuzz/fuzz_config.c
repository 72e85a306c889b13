/* Fuzzes the YAML config loader (loom_config_load_string): any text gives a
 * config or LOOM_ERR_CONFIG, and a loaded config survives its canonical YAML
 * round trip. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "loom/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20)
    return 0;
  static loom_config cfg, back;
  loom_config_defaults(&cfg);
  if (loom_config_load_string(&cfg, (const char *)data, size, "fuzz.yaml", NULL,
                              0) != LOOM_OK)
    return 0;
  char *yaml = NULL;
  if (loom_config_to_yaml(&cfg, &yaml) == LOOM_OK) {
    loom_config_defaults(&back);
    if (loom_config_load_string(&back, yaml, strlen(yaml), "canonical.yaml",
                                NULL, 0) != LOOM_OK ||
        !loom_config_equal(&cfg, &back))
      abort(); /* the canonical text must load back to the same config */
    loom_free(yaml);
  }
  (void)loom_config_hash(&cfg);
  return 0;
}
