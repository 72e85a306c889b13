/* Hostfiles: the accepted forms, and an error naming file, line and reason
 * for each loose input the old parser let through (issue 10). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/core.h"
#include "run/hostfile.h"
#include "tt.h"

typedef struct got {
  int n, total;
  char names[8][64];
  int slots[8];
} got;

static int add(void *ctx, const char *name, size_t len, int slots) {
  got *g = ctx;
  if (g->n < 8 && len < 64) {
    memcpy(g->names[g->n], name, len);
    g->names[g->n][len] = '\0';
    g->slots[g->n] = slots;
  }
  g->n++;
  g->total += slots;
  return 0;
}

static loom_status parse(const char *text, got *g) {
  memset(g, 0, sizeof *g);
  return loom_hostfile_parse("hf", text, strlen(text), add, g);
}

/* The text is rejected with a message holding `want`. */
static void rejects(const char *text, const char *want) {
  got g;
  loom_status st = parse(text, &g);
  TT_CHECK_EQ(st, LOOM_ERR_CONFIG);
  if (st != LOOM_ERR_CONFIG || !strstr(loom_last_error(), want)) {
    fprintf(stderr, "  input '%s': message '%s', wanted '%s'\n", text,
            loom_last_error(), want);
    TT_CHECK(0);
  }
}

TT_TEST(accepted_forms) {
  got g;
  TT_REQUIRE_OK(parse("# cluster\n\nnode1\nnode-2.example.org slots=4\n"
                      "  10.0.0.3\tslots=2 max_slots=8  # comment\n"
                      "node4:3\r\nnode5 max-slots=2",
                      &g));
  TT_CHECK_EQ(g.n, 5);
  TT_CHECK_STR(g.names[0], "node1");
  TT_CHECK_EQ(g.slots[0], 1);
  TT_CHECK_STR(g.names[1], "node-2.example.org");
  TT_CHECK_EQ(g.slots[1], 4);
  TT_CHECK_STR(g.names[2], "10.0.0.3");
  TT_CHECK_EQ(g.slots[2], 2);
  TT_CHECK_STR(g.names[3], "node4");
  TT_CHECK_EQ(g.slots[3], 3);
  TT_CHECK_STR(g.names[4], "node5");
  TT_CHECK_EQ(g.slots[4], 1);
  /* blanks around '=' as Open MPI takes them */
  TT_REQUIRE_OK(parse("a slots = 2 max_slots =8\nb slots= 3\n", &g));
  TT_CHECK_EQ(g.n, 2);
  TT_CHECK_EQ(g.slots[0], 2);
  TT_CHECK_EQ(g.slots[1], 3);
  TT_REQUIRE_OK(parse("big slots=4096\n", &g));
  TT_CHECK_EQ(g.total, LOOM_HOSTFILE_MAX_SLOTS);
}

TT_TEST(bad_slots) {
  rejects("a slots=abc\n", "hf: line 1: 'slots=abc': slots must be");
  rejects("a\nb slots=-2\n", "hf: line 2: 'slots=-2'");
  rejects("a slots=0\n", "'slots=0'");
  rejects("a slots=\n", "'slots='");
  rejects("a slots=99999999999999999999\n", "from 1 to 4096");
  rejects("a slots=2147483647\n", "from 1 to 4096");
  rejects("a slots=4097\n", "from 1 to 4096");
  rejects("a slots=2 slots=3\n", "slots given twice");
  rejects("a slots=4 max_slots=2\n", "max_slots=2 is below slots=4");
  rejects("a:0\n", "'a:0'");
  rejects("a:\n", "'a:'");
  rejects("a:2 slots=3\n", "slots given twice");
}

TT_TEST(bad_names) {
  rejects("host:2:3\n", "line 1: more than one ':'");
  rejects("node1 node2\n", "more than one host on a line");
  rejects("node1 node2 slots=2\n", "more than one host on a line");
  rejects("256.1.1.1 slots=1\n",
          "an IPv4 address with a part over 255: '256.1.1.1'");
  rejects("10.0.0.1000\n", "a part over 255");
  rejects("10.0.3\n", "an IPv4 address without 4 parts");
  rejects("a cpus=4\n", "unknown key");
  rejects("no_underscores\n", "a character other than");
  rejects("-lead\n", "starting with '-'");
  rejects("a..b\n", "empty label");
  rejects("trail-\n", "ending in '-'");
  char longname[300];
  memset(longname, 'a', sizeof longname - 2);
  longname[sizeof longname - 2] = '\n';
  longname[sizeof longname - 1] = '\0';
  rejects(longname, "longer than");
}

/* mpirun fails on a host given slots twice, and a failed start is
 * restarted: refused here, before anything starts, with both lines. */
TT_TEST(duplicate_hosts) {
  rejects("localhost slots=1\nlocalhost slots=1\n",
          "hf: line 2: host 'localhost' is already on line 1");
  rejects("a\n# b\n\nb:2\nA.example slots=2\na\n",
          "hf: line 6: host 'a' is already on line 1");
  rejects("node1\nNODE1 slots=4\n", "line 2: host 'NODE1' is already on "
                                    "line 1");
  rejects("h1:2\nh2:3\nh1 slots=1\n", "line 3: host 'h1' is already");
  /* names that only share a prefix are distinct hosts */
  got g;
  TT_REQUIRE_OK(parse("node1\nnode10\nnode1.example\n", &g));
  TT_CHECK_EQ(g.n, 3);
}

TT_TEST(bad_files) {
  rejects("", "hf: names no host");
  rejects("# only a comment\n\n  \n", "names no host");
  rejects("a\n\x01\x02\x03garbage\n", "line 2: control byte 0x01");
  got g;
  memset(&g, 0, sizeof g);
  static const char nul[] = "a\0b\n";
  TT_CHECK_EQ(loom_hostfile_parse("hf", nul, sizeof nul - 1, add, &g),
              LOOM_ERR_CONFIG);
  TT_CHECK(strstr(loom_last_error(), "control byte 0x00") != NULL);
  /* One long line is one error, not hundreds of hosts. */
  size_t n = 100000;
  char *big = malloc(n + 1);
  TT_REQUIRE(big != NULL);
  for (size_t i = 0; i < n; i++)
    big[i] = i % 8 == 7 ? ' ' : 'h';
  big[n] = '\0';
  rejects(big, "line 1: longer than 1024 bytes");
  free(big);
  /* More hosts than the limit (each named once: h0, h1, ...). */
  size_t m = (size_t)(LOOM_HOSTFILE_MAX_HOSTS + 1) * 8;
  char *many = malloc(m + 1);
  TT_REQUIRE(many != NULL);
  size_t at = 0;
  for (int i = 0; i <= LOOM_HOSTFILE_MAX_HOSTS; i++)
    at += (size_t)snprintf(many + at, m + 1 - at, "h%d\n\n", i);
  rejects(many, "more than 4096 hosts");
  free(many);
}

TT_TEST(read_file) {
  char dir[] = "/tmp/loom_hostfile_XXXXXX";
  TT_REQUIRE(mkdtemp(dir) != NULL);
  got g;
  memset(&g, 0, sizeof g);
  TT_CHECK_EQ(loom_hostfile_read(dir, add, &g), LOOM_ERR_CONFIG);
  TT_CHECK(strstr(loom_last_error(), "a directory, not a file") != NULL);
  char path[128];
  snprintf(path, sizeof path, "%s/missing", dir);
  TT_CHECK_EQ(loom_hostfile_read(path, add, &g), LOOM_ERR_IO);
  snprintf(path, sizeof path, "%s/fifo", dir);
  TT_REQUIRE(mkfifo(path, 0600) == 0);
  TT_CHECK_EQ(loom_hostfile_read(path, add, &g), LOOM_ERR_CONFIG);
  TT_CHECK(strstr(loom_last_error(), "a special file") != NULL);
  unlink(path);
  snprintf(path, sizeof path, "%s/hosts", dir);
  FILE *f = fopen(path, "w");
  TT_REQUIRE(f != NULL);
  fputs("n1 slots=2\nn2 slots=x\n", f);
  fclose(f);
  TT_CHECK_EQ(loom_hostfile_read(path, add, &g), LOOM_ERR_CONFIG);
  TT_CHECK(strstr(loom_last_error(), path) != NULL &&
           strstr(loom_last_error(), "line 2") != NULL);
  f = fopen(path, "w");
  TT_REQUIRE(f != NULL);
  fputs("n1 slots=2\nn2 slots=3\n", f);
  fclose(f);
  memset(&g, 0, sizeof g);
  TT_CHECK_OK(loom_hostfile_read(path, add, &g));
  TT_CHECK_EQ(g.total, 5);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  TT_RUN(accepted_forms);
  TT_RUN(bad_slots);
  TT_RUN(bad_names);
  TT_RUN(duplicate_hosts);
  TT_RUN(bad_files);
  TT_RUN(read_file);
  return tt_finish();
}
