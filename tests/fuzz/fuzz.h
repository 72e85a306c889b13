/* Shared by the fuzz harnesses: a private temporary directory per process
 * (removed at exit) and a file written into it from the input. */
#ifndef LOOM_TESTS_FUZZ_H
#define LOOM_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The harness's own directory under $TMPDIR (created on first use). */
const char *fuzz_dir(void);
/* Writes data to fuzz_dir()/name and returns its path (static storage). */
const char *fuzz_write(const char *name, const void *data, size_t size);
/* Removes fuzz_dir()/name if it is there (a link is removed, never
 * followed). */
void fuzz_remove(const char *name);
/* Splits the input at its NUL bytes into up to max parts (the last part
 * keeps any further NULs); their count. */
int fuzz_split(const uint8_t *data, size_t size, const uint8_t **part,
               size_t *len, int max);

#endif
