/* LOOM_FAULT values: lists, defaults, arguments, and each malformed item an
 * error that names it. */
#include <string.h>

#include "loom/train.h"
#include "tt.h"

TT_TEST(test_lists) {
  loom_fault f[LOOM_FAULT_MAX];
  int n = -1;
  TT_CHECK_OK(loom_fault_parse("", f, LOOM_FAULT_MAX, &n));
  TT_CHECK_EQ(n, 0);
  TT_CHECK_OK(loom_fault_parse(NULL, f, LOOM_FAULT_MAX, &n));
  TT_CHECK_EQ(n, 0);
  TT_REQUIRE_OK(loom_fault_parse("1:37:segv,0:5:exit:3,2:9:slow,3:1:slow:1.5,"
                                 "0:12:hang,1:20:corrupt,4:2:exit",
                                 f, LOOM_FAULT_MAX, &n));
  TT_REQUIRE(n == 7);
  TT_CHECK(f[0].rank == 1 && f[0].step == 37 && f[0].kind == LOOM_FAULT_SEGV);
  TT_CHECK(f[1].rank == 0 && f[1].step == 5 && f[1].kind == LOOM_FAULT_EXIT &&
           f[1].arg == 3);
  TT_CHECK(f[2].kind == LOOM_FAULT_SLOW && f[2].arg == 0.2);
  TT_CHECK(f[3].kind == LOOM_FAULT_SLOW && f[3].arg == 1.5);
  TT_CHECK(f[4].kind == LOOM_FAULT_HANG && f[4].arg == 0);
  TT_CHECK(f[5].kind == LOOM_FAULT_CORRUPT && f[5].step == 20);
  TT_CHECK(f[6].rank == 4 && f[6].kind == LOOM_FAULT_EXIT && f[6].arg == 1);
  TT_CHECK(strcmp(loom_fault_kind_name(LOOM_FAULT_CORRUPT), "corrupt") == 0);
  TT_CHECK(strcmp(loom_fault_kind_name(LOOM_FAULT_KIND_COUNT), "?") == 0);
  /* No room: an error, not a silent cut. */
  TT_CHECK_EQ(loom_fault_parse("0:1:exit,0:2:exit", f, 1, &n), LOOM_ERR_CONFIG);
}

TT_TEST(test_errors) {
  static const char *const bad[][2] = {
      {"1:5", "'1:5': expected RANK:STEP:KIND"},
      {"1:5:exit:2:3", "'1:5:exit:2:3': expected"},
      {"x:5:exit", "rank 'x' is not a rank number"},
      {"-1:5:exit", "rank '-1'"},
      {"1:0:exit", "step '0' is not a step number >= 1"},
      {"1::exit", "step ''"},
      {"1:5:Exit", "unknown kind 'Exit'"},
      {"1:5:exit:256", "exit code '256' is not in 1..255"},
      {"1:5:exit:x", "exit code 'x'"},
      {"1:5:slow:0", "'0' is not a number of seconds"},
      {"1:5:slow:nan", "'nan' is not a number of seconds"},
      {"1:5:hang:1", "kind 'hang' takes no argument"},
      {"1:5:corrupt:1", "kind 'corrupt' takes no argument"},
      {"1:5:exit,", "'': expected"},
      {"1:5:exit,,1:6:exit", "'': expected"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    loom_fault f[4];
    int n = 0;
    TT_CHECK_EQ(loom_fault_parse(bad[i][0], f, 4, &n), LOOM_ERR_CONFIG);
    if (!strstr(loom_last_error(), bad[i][1]) ||
        strncmp(loom_last_error(), "LOOM_FAULT: ", 12) != 0) {
      TT_CHECK(!"message");
      fprintf(stderr, "  '%s': got '%s', want '%s'\n", bad[i][0],
              loom_last_error(), bad[i][1]);
    }
  }
}

int main(void) {
  TT_RUN(test_lists);
  TT_RUN(test_errors);
  return tt_finish();
}
