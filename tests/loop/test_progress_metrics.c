/* Tests of the console progress and the JSONL metric sink. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/train.h"
#include "tt.h"

static char *slurp(FILE *f) {
  fflush(f);
  long n = ftell(f);
  rewind(f);
  char *buf = calloc(1, (size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n)
    buf[0] = '\0';
  return buf;
}

TT_TEST(test_progress_lines) {
  FILE *f = tmpfile();
  TT_REQUIRE(f != NULL);
  loom_progress *p;
  /* tmpfile is no terminal: AUTO means lines. */
  TT_REQUIRE_OK(
      loom_progress_new(&p, LOOM_PROGRESS_AUTO, f, 0, 10, 5, "samples"));
  for (int s = 1; s <= 10; s++) {
    loom_progress_info info = {s, 1, 2.5f, 0.05f, 1234.0};
    loom_progress_update(p, &info);
  }
  loom_progress_print(p, "eval: accuracy 0.5");
  loom_progress_free(p);
  char *out = slurp(f);
  TT_CHECK(strstr(out, "step 5/10 | epoch 1 | loss 2.5000 | lr 0.05 | "
                       "1.2k samples/s") != NULL);
  TT_CHECK(strstr(out, "step 10/10") != NULL);
  TT_CHECK(strstr(out, "step 3/10") == NULL);
  TT_CHECK(strstr(out, "eval: accuracy 0.5\n") != NULL);
  TT_CHECK(strchr(out, '\r') == NULL);
  free(out);
  fclose(f);
}

TT_TEST(test_progress_bar) {
  FILE *f = tmpfile();
  TT_REQUIRE(f != NULL);
  loom_progress *p;
  TT_REQUIRE_OK(loom_progress_new(&p, LOOM_PROGRESS_BAR, f, 0, 4, 1, "tokens"));
  loom_progress_info info = {4, 0, 1.0f, 3e-4f, 5e4};
  loom_progress_update(p, &info);
  loom_progress_free(p);
  char *out = slurp(f);
  TT_CHECK(strstr(out, "[########################] 100%") != NULL);
  TT_CHECK(strstr(out, "50.0k tokens/s") != NULL);
  free(out);
  fclose(f);
  loom_progress_mode m;
  TT_CHECK_OK(loom_progress_mode_parse("off", &m));
  TT_CHECK_EQ(m, LOOM_PROGRESS_OFF);
  TT_CHECK_EQ(loom_progress_mode_parse("fancy", &m), LOOM_ERR_INVALID_ARG);
}

TT_TEST(test_metrics_jsonl) {
  char dir[] = "/tmp/loom_metrics_XXXXXX";
  TT_REQUIRE(mkdtemp(dir) != NULL);
  char sub[256];
  snprintf(sub, sizeof sub, "%s/run/a", dir);
  loom_metrics *m;
  TT_REQUIRE_OK(loom_metrics_open(&m, sub, false));
  loom_metrics_begin(m);
  loom_metrics_int(m, "step", 3);
  loom_metrics_num(m, "loss", 0.5);
  loom_metrics_num(m, "bad", 0.0 / 0.0);
  loom_metrics_str(m, "note", "a\"b\n");
  TT_CHECK_OK(loom_metrics_end(m));
  loom_metrics_close(m);
  /* Append mode keeps the first line. */
  TT_REQUIRE_OK(loom_metrics_open(&m, sub, true));
  loom_metrics_begin(m);
  loom_metrics_int(m, "step", 4);
  TT_CHECK_OK(loom_metrics_end(m));
  char path[300];
  snprintf(path, sizeof path, "%s", loom_metrics_path(m));
  loom_metrics_close(m);
  FILE *f = fopen(path, "r");
  TT_REQUIRE(f != NULL);
  fseek(f, 0, SEEK_END);
  char *out = slurp(f);
  fclose(f);
  TT_CHECK_STR(out, "{\"step\":3,\"loss\":0.5,\"bad\":null,"
                    "\"note\":\"a\\\"b\\u000a\"}\n{\"step\":4}\n");
  free(out);
  /* Leave nothing in /tmp: the file, then run/a, run and the directory. */
  TT_CHECK(unlink(path) == 0);
  TT_CHECK(rmdir(sub) == 0);
  snprintf(sub, sizeof sub, "%s/run", dir);
  TT_CHECK(rmdir(sub) == 0);
  TT_CHECK(rmdir(dir) == 0);
  TT_CHECK_EQ(loom_metrics_open(&m, "/proc/no/such", false), LOOM_ERR_IO);
}

int main(void) {
  TT_RUN(test_progress_lines);
  TT_RUN(test_progress_bar);
  TT_RUN(test_metrics_jsonl);
  return tt_finish();
}
