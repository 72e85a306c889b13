/* The KJV preparation step: the real text when `bible` is installed (counts,
 * checksum, cache), and its errors with stand-in programs. */
#include <sys/stat.h>

#include "loom/data.h"
#include "tt.h"
#include "util.h"

static int have_bible(void) {
  const char *path = getenv("PATH");
  char buf[4096];
  while (path && *path) {
    const char *end = strchr(path, ':');
    size_t n = end ? (size_t)(end - path) : strlen(path);
    snprintf(buf, sizeof buf, "%.*s/bible", (int)n, path);
    if (access(buf, X_OK) == 0 && access("/usr/lib/bible.data", R_OK) == 0)
      return 1;
    path = end ? end + 1 : NULL;
  }
  return 0;
}

static char *slurp(const char *p, long *n) {
  FILE *f = fopen(p, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  *n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)*n + 1);
  if (fread(b, 1, (size_t)*n, f) != (size_t)*n)
    *n = -1;
  b[*n > 0 ? *n : 0] = '\0';
  fclose(f);
  return b;
}

TT_TEST(test_real_kjv) {
  if (!have_bible()) {
    printf("SKIP test_real_kjv: the bible program or its text is missing "
           "(apt-get install %s)\n",
           LOOM_KJV_PACKAGES);
    return;
  }
  const char *p = tu_path("d/kjv.txt");
  loom_kjv_info info;
  TT_REQUIRE_OK(loom_kjv_prepare(p, NULL, &info));
  TT_CHECK(!info.cached);
  TT_CHECK_EQ(info.verses, 31102);
  TT_CHECK_EQ(info.bytes, 4137850);
  TT_CHECK_EQ(info.crc32c, LOOM_KJV_CRC32C);
  long n = 0;
  char *t = slurp(p, &n);
  TT_REQUIRE(t != NULL);
  TT_CHECK_EQ(n, 4137850);
  const char *first = "In the beginning God created the heaven and the "
                      "earth.\nAnd the earth was without form, and void;";
  TT_CHECK(strncmp(t, first, strlen(first)) == 0);
  const char *last = "\nThe grace of our Lord Jesus Christ be with you all. "
                     "Amen.\n";
  TT_CHECK(n > 100 && strcmp(t + n - strlen(last), last) == 0);
  long lines = 0, high = 0;
  for (long i = 0; i < n; i++) {
    lines += t[i] == '\n';
    high += (unsigned char)t[i] >= 0x80;
  }
  TT_CHECK_EQ(lines, 31102);
  TT_CHECK_EQ(high, 0);
  free(t);

  /* reused when valid */
  TT_REQUIRE_OK(loom_kjv_prepare(p, NULL, &info));
  TT_CHECK(info.cached);
  TT_CHECK_EQ(info.bytes, 4137850);
  /* redone when damaged, or when forced */
  FILE *f = fopen(p, "ab");
  fputs("x", f);
  fclose(f);
  TT_REQUIRE_OK(loom_kjv_prepare(p, NULL, &info));
  TT_CHECK(!info.cached);
  TT_CHECK_EQ(info.bytes, 4137850);
  loom_kjv_opts o = loom_kjv_opts_default();
  o.force = true;
  TT_REQUIRE_OK(loom_kjv_prepare(p, &o, &info));
  TT_CHECK(!info.cached);

  /* the byte-level data set on it: 90% / 10% */
  loom_dataset *tr = NULL, *va = NULL;
  TT_REQUIRE_OK(loom_dataset_open_text(&tr, p, LOOM_SPLIT_TRAIN, NULL));
  TT_REQUIRE_OK(loom_dataset_open_text(&va, p, LOOM_SPLIT_VAL, NULL));
  loom_dataset_info it, iv;
  loom_dataset_get_info(tr, &it);
  loom_dataset_get_info(va, &iv);
  TT_CHECK_EQ(it.tokens, 3724065);
  TT_CHECK_EQ(iv.tokens, 413785);
  TT_CHECK_EQ(it.len, 3724065 / 128 - 1);
  TT_CHECK_EQ(iv.len, (413785 - 1) / 128);
  TT_CHECK(it.classes <= 128);
  loom_dataset_free(tr);
  loom_dataset_free(va);
}

/* A stand-in for `bible` printing `body` and exiting with `rc`. */
static const char *fake_bible(const char *name, const char *body, int rc) {
  const char *p = tu_path(name);
  char script[4096];
  snprintf(script, sizeof script, "#!/bin/sh\nprintf '%s'\nexit %d\n", body,
           rc);
  tu_write(p, script, strlen(script));
  chmod(p, 0755);
  return p;
}

TT_TEST(test_errors) {
  loom_kjv_opts o = loom_kjv_opts_default();
  loom_kjv_info info;
  const char *out = tu_path("e/kjv.txt");
  struct stat sb;

  o.program = "/nonexistent/bible";
  TT_CHECK_EQ(loom_kjv_prepare(out, &o, &info), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("not found"));
  TT_CHECK(tu_msg_has("apt-get install bible-kjv bible-kjv-text"));

  o.program = "loom-no-such-program-anywhere";
  TT_CHECK_EQ(loom_kjv_prepare(out, &o, &info), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("bible-kjv"));

  /* bible without its text exits 255 and prints nothing */
  o.program = fake_bible("notext", "", 255);
  TT_CHECK_EQ(loom_kjv_prepare(out, &o, &info), LOOM_ERR_IO);
  TT_CHECK(tu_msg_has("exit status 255"));
  TT_CHECK(tu_msg_has("bible-kjv-text"));

  /* wrapped lines are refused rather than joined */
  o.program = fake_bible("wrap", "Ge1:1 In the\\nbeginning\\n", 0);
  TT_CHECK_EQ(loom_kjv_prepare(out, &o, &info), LOOM_ERR_CORRUPT);
  TT_CHECK(tu_msg_has("line 2"));

  /* a program that never stops printing: stopped at a bound, not given
   * all the memory there is */
  {
    const char *p = tu_path("endless");
    const char *script = "#!/bin/sh\nexec yes 'Ge1:1 In the beginning'\n";
    tu_write(p, script, strlen(script));
    chmod(p, 0755);
    o.program = p;
    TT_CHECK_EQ(loom_kjv_prepare(out, &o, &info), LOOM_ERR_IO);
    TT_CHECK(tu_msg_has("printed more than"));
    TT_CHECK(stat(out, &sb) != 0);
  }

  /* a FIFO or a directory where the cached text would be: an error naming
   * it, never a wait for a writer (the alarm fails the test instead) */
  {
    const char *fifo = tu_path("fifo-kjv.txt"), *dir = tu_path("dir-kjv.txt");
    TT_REQUIRE(mkfifo(fifo, 0600) == 0);
    TT_REQUIRE(mkdir(dir, 0700) == 0);
    o.program = fake_bible("unused", "", 0);
    alarm(20);
    TT_CHECK_EQ(loom_kjv_prepare(fifo, &o, &info), LOOM_ERR_IO);
    alarm(0);
    TT_CHECK(tu_msg_has("fifo-kjv.txt: not a regular file"));
    TT_CHECK_EQ(loom_kjv_prepare(dir, &o, &info), LOOM_ERR_IO);
    TT_CHECK(tu_msg_has("dir-kjv.txt: not a regular file"));
  }

  /* another text: refused unless verification is off */
  o.program =
      fake_bible("short", "Ge1:1 Alpha.\\n\\n1Sm2:10 Beta gamma.\\n", 0);
  TT_CHECK_EQ(loom_kjv_prepare(out, &o, &info), LOOM_ERR_CORRUPT);
  TT_CHECK(tu_msg_has("2 verses"));
  TT_CHECK(stat(out, &sb) != 0); /* nothing written */
  o.verify = false;
  TT_REQUIRE_OK(loom_kjv_prepare(out, &o, &info));
  TT_CHECK_EQ(info.verses, 2);
  long n = 0;
  char *t = slurp(out, &n);
  TT_REQUIRE(t != NULL);
  TT_CHECK_STR(t, "Alpha.\nBeta gamma.\n");
  free(t);
}

TT_TEST(test_default_path) {
  char buf[4096];
  setenv("LOOM_DATA_DIR", "/some/where", 1);
  TT_CHECK_OK(loom_kjv_default_path(buf, sizeof buf));
  TT_CHECK_STR(buf, "/some/where/kjv.txt");
  unsetenv("LOOM_DATA_DIR");
  TT_CHECK_OK(loom_data_dir(buf, sizeof buf));
  TT_CHECK_STR(buf, "data");
  TT_CHECK_EQ(loom_kjv_default_path(buf, 8), LOOM_ERR_INVALID_ARG);
}

int main(void) {
  tu_tmpdir();
  TT_RUN(test_real_kjv);
  TT_RUN(test_errors);
  TT_RUN(test_default_path);
  tu_cleanup();
  return tt_finish();
}
