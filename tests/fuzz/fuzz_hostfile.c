/* Fuzzes the hostfile parser of loom run (src/run/hostfile.c). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "run/hostfile.h"

typedef struct sum {
  int hosts;
  long slots;
} sum;

static int add(void *ctx, const char *name, size_t len, int slots) {
  sum *s = ctx;
  /* What the parser promises for every host it reports. */
  if (len == 0 || len > LOOM_HOSTFILE_NAME_MAX || slots < 1 ||
      slots > LOOM_HOSTFILE_MAX_SLOTS || memchr(name, ' ', len) ||
      memchr(name, ':', len))
    abort();
  s->hosts++;
  s->slots += slots;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sum s = {0, 0};
  loom_status st =
      loom_hostfile_parse("fuzz.hosts", (const char *)data, size, add, &s);
  if (st == LOOM_OK && (s.hosts < 1 || s.hosts > LOOM_HOSTFILE_MAX_HOSTS))
    abort();
  if (st != LOOM_OK && st != LOOM_ERR_CONFIG)
    abort();
  /* Every refusal names the file, and the line or that it has no host. */
  if (st == LOOM_ERR_CONFIG &&
      (strncmp(loom_last_error(), "fuzz.hosts: ", 12) != 0 ||
       (!strstr(loom_last_error(), ": line ") &&
        !strstr(loom_last_error(), "names no host"))))
    abort();
  return 0;
}
