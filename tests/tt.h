/* tt: loom's tiny test runner. Header-only; one test program per file.
 *
 *   TT_TEST(name) { TT_CHECK(x == 1); TT_CHECK_OK(loom_fn()); }
 *   int main(void) { TT_RUN(name); return tt_finish(); }
 *
 * A failing check prints "[rank r] file:line: ..." and the test goes on to
 * the next check; TT_REQUIRE stops the current test. Every program ends with
 * the line "N passed, N failed". Multi-rank tests set tt_rank and a hook that
 * aborts the group on failure (so no rank waits forever in a collective). */
#ifndef LOOM_TT_H
#define LOOM_TT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/core.h"

static int tt_rank = -1;
static int tt_passed, tt_failed, tt_cur_failed;
static const char *tt_cur_name = "";
/* Called on the first failure when set (multi-rank tests abort the group). */
static void (*tt_on_fail)(void);

__attribute__((unused)) static void tt_fail_prefix(const char *file, int line) {
  if (tt_rank >= 0)
    fprintf(stderr, "[rank %d] ", tt_rank);
  fprintf(stderr, "%s:%d: [%s] ", file, line, tt_cur_name);
  tt_cur_failed = 1;
}

__attribute__((unused)) static void tt_fail_done(void) {
  fflush(stderr);
  if (tt_on_fail)
    tt_on_fail();
}

#define TT_TEST(name) static void name(void)

#define TT_RUN(name)                                                           \
  do {                                                                         \
    tt_cur_name = #name;                                                       \
    tt_cur_failed = 0;                                                         \
    name();                                                                    \
    if (tt_cur_failed)                                                         \
      tt_failed++;                                                             \
    else                                                                       \
      tt_passed++;                                                             \
  } while (0)

#define TT_CHECK(cond)                                                         \
  do {                                                                         \
    if (!(cond)) {                                                             \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "check failed: %s\n", #cond);                            \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

#define TT_REQUIRE(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "requirement failed: %s\n", #cond);                      \
      tt_fail_done();                                                          \
      return;                                                                  \
    }                                                                          \
  } while (0)

#define TT_CHECK_EQ(a, b)                                                      \
  do {                                                                         \
    long long tt_a_ = (long long)(a), tt_b_ = (long long)(b);                  \
    if (tt_a_ != tt_b_) {                                                      \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "%s == %s: %lld != %lld\n", #a, #b, tt_a_, tt_b_);       \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

#define TT_CHECK_STR(a, b)                                                     \
  do {                                                                         \
    const char *tt_a_ = (a), *tt_b_ = (b);                                     \
    if (!tt_a_ || !tt_b_ || strcmp(tt_a_, tt_b_) != 0) {                       \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "%s == %s:\n  got      '%s'\n  expected '%s'\n", #a, #b, \
              tt_a_ ? tt_a_ : "(null)", tt_b_ ? tt_b_ : "(null)");             \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

/* Checks a loom_status is LOOM_OK; prints loom_last_error() otherwise. */
#define TT_CHECK_OK(expr)                                                      \
  do {                                                                         \
    loom_status tt_s_ = (expr);                                                \
    if (tt_s_ != LOOM_OK) {                                                    \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "%s -> %s: %s\n", #expr, loom_status_name(tt_s_),        \
              loom_last_error());                                              \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

#define TT_REQUIRE_OK(expr)                                                    \
  do {                                                                         \
    loom_status tt_s_ = (expr);                                                \
    if (tt_s_ != LOOM_OK) {                                                    \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "%s -> %s: %s\n", #expr, loom_status_name(tt_s_),        \
              loom_last_error());                                              \
      tt_fail_done();                                                          \
      return;                                                                  \
    }                                                                          \
  } while (0)

/* Compares two float arrays: |a-b| <= atol + rtol*|b| elementwise. Prints the
 * max abs and rel diff and the first mismatches. Returns 1 when close. */
__attribute__((unused)) static int
tt_close_impl(const char *file, int line, const char *what, const float *a,
              const float *b, size_t n, double atol, double rtol) {
  double max_abs = 0, max_rel = 0;
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    double r = d / (fabs((double)b[i]) + 1e-30);
    if (d > max_abs || isnan(d))
      max_abs = isnan(d) ? INFINITY : d;
    if (r > max_rel && fabs((double)b[i]) > atol)
      max_rel = r;
    if (!(d <= atol + rtol * fabs((double)b[i])))
      bad++;
  }
  if (bad == 0)
    return 1;
  tt_fail_prefix(file, line);
  fprintf(stderr, "%s: %zu of %zu differ (max abs %.3g, max rel %.3g)\n", what,
          bad, n, max_abs, max_rel);
  size_t shown = 0;
  for (size_t i = 0; i < n && shown < 5; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= atol + rtol * fabs((double)b[i]))) {
      fprintf(stderr, "    [%zu] got %.9g expected %.9g\n", i, (double)a[i],
              (double)b[i]);
      shown++;
    }
  }
  tt_fail_done();
  return 0;
}

#define TT_CHECK_CLOSE(a, b, n, atol, rtol)                                    \
  tt_close_impl(__FILE__, __LINE__, #a " vs " #b, (a), (b), (n), (atol), (rtol))

#define TT_CHECK_NEAR(a, b, tol)                                               \
  do {                                                                         \
    double tt_a_ = (double)(a), tt_b_ = (double)(b);                           \
    if (!(fabs(tt_a_ - tt_b_) <= (tol))) {                                     \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "%s ~ %s: %.9g vs %.9g (tol %.3g)\n", #a, #b, tt_a_,     \
              tt_b_, (double)(tol));                                           \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

/* Prints the closing line and returns the process exit code. */
__attribute__((unused)) static int tt_finish(void) {
  if (tt_rank >= 0)
    printf("[rank %d] ", tt_rank);
  printf("%d passed, %d failed\n", tt_passed, tt_failed);
  fflush(stdout);
  return tt_failed ? 1 : 0;
}

/* stderr into a buffer (up to 64 KiB), to check what was warned:
 *   tt_capture_begin(); ...; TT_CHECK_HAS(tt_capture_end(), "warning"); */
static char tt_captured[65536];
static FILE *tt_cap_file;
static int tt_cap_saved = -1;

__attribute__((unused)) static void tt_capture_begin(void) {
  fflush(stderr);
  tt_cap_file = tmpfile();
  tt_cap_saved = dup(2);
  dup2(fileno(tt_cap_file), 2);
}

__attribute__((unused)) static const char *tt_capture_end(void) {
  fflush(stderr);
  dup2(tt_cap_saved, 2);
  close(tt_cap_saved);
  rewind(tt_cap_file);
  size_t n = fread(tt_captured, 1, sizeof tt_captured - 1, tt_cap_file);
  tt_captured[n] = '\0';
  fclose(tt_cap_file);
  return tt_captured;
}

#define TT_CHECK_HAS(hay, needle)                                              \
  do {                                                                         \
    const char *h_ = (hay), *n_ = (needle);                                    \
    if (!h_ || !strstr(h_, n_)) {                                              \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr, "'%s' not in:\n  %s\n", n_, h_ ? h_ : "(null)");         \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

#endif /* LOOM_TT_H */
