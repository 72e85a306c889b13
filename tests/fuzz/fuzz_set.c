/* Fuzzes --set overrides: the input's lines are assignments
 * ("section.key=value"), applied one by one to the defaults and then
 * through loom_config_load_string over an empty file. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "loom/config.h"

#define MAX_SETS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16)
    return 0;
  char *text = malloc(size + 1);
  if (!text)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  const char *sets[MAX_SETS];
  int n = 0;
  char *p = text;
  while (n < MAX_SETS) {
    sets[n++] = p;
    char *nl = strchr(p, '\n');
    if (!nl)
      break;
    *nl = '\0';
    p = nl + 1;
  }
  static loom_config cfg;
  loom_config_defaults(&cfg);
  for (int i = 0; i < n; i++)
    (void)loom_config_set(&cfg, sets[i]);
  (void)loom_config_validate(&cfg);
  loom_config_defaults(&cfg);
  (void)loom_config_load_string(&cfg, "", 0, "empty.yaml", sets, n);
  free(text);
  return 0;
}
