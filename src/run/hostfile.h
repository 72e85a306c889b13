/* Hostfiles of `loom run --hostfile`, parsed strictly from a buffer (so the
 * parser is tested and fuzzed without files). */
#ifndef LOOM_CLI_HOSTFILE_H
#define LOOM_CLI_HOSTFILE_H

#include <stddef.h>

#include "loom/core.h"

/* Slots one host may offer (slots= and max_slots=): more than any machine
 * has cores, few enough that a typo (slots=2147483647) is an error, not a
 * launch of that many ranks. */
#define LOOM_HOSTFILE_MAX_SLOTS 4096
/* Hosts in one file, lines in one file, bytes in one line. */
#define LOOM_HOSTFILE_MAX_HOSTS 4096
#define LOOM_HOSTFILE_MAX_LINE 1024
/* A host name: RFC 1123 labels, at most 253 characters. */
#define LOOM_HOSTFILE_NAME_MAX 253
/* Bytes in one hostfile. */
#define LOOM_HOSTFILE_MAX_BYTES ((size_t)1 << 20)

/* Called once per host line, in order: name (not NUL-terminated) and its
 * slots (1 when not given). A non-zero return stops the parse with
 * LOOM_ERR_NOMEM. */
typedef int (*loom_hostfile_add_fn)(void *ctx, const char *name, size_t len,
                                    int slots);

/* Parses an Open MPI hostfile held in buf[0..n):
 *   # a comment, and blank lines
 *   node1                        one slot
 *   node2 slots=4                4 slots
 *   node3 slots=4 max_slots=8    max_slots >= slots, otherwise unused
 *   node4:2                      MPICH's form: 2 slots
 * Names are RFC 1123 host names or IPv4 addresses. Anything else (a NUL or
 * other control byte, an unknown key, a bad or out-of-range count, a second
 * host on a line, a host on two lines (names compared without regard to
 * case), a line over LOOM_HOSTFILE_MAX_LINE bytes, no host at all) is
 * LOOM_ERR_CONFIG naming `path`, the line and the reason. */
loom_status loom_hostfile_parse(const char *path, const char *buf, size_t n,
                                loom_hostfile_add_fn add, void *ctx);

/* Reads the file (a regular file of at most LOOM_HOSTFILE_MAX_BYTES) and
 * parses it; LOOM_ERR_IO when it cannot be read. */
loom_status loom_hostfile_read(const char *path, loom_hostfile_add_fn add,
                               void *ctx);

#endif
