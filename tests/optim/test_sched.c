/* Tests of learning-rate schedules and batch-size scaling rules. */
#include <math.h>
#include <string.h>

#include "loom/optim.h"
#include "tt.h"

TT_TEST(test_names) {
  loom_sched_kind k;
  for (int i = 0; i < LOOM_SCHED_KIND_COUNT; i++) {
    TT_CHECK_OK(loom_sched_kind_parse(loom_sched_kind_name(i), &k));
    TT_CHECK_EQ(k, i);
  }
  TT_CHECK_OK(loom_sched_kind_parse("cosine", &k));
  TT_CHECK_EQ(k, LOOM_SCHED_COSINE);
  TT_CHECK_EQ(loom_sched_kind_parse("exp", &k), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "'exp'") != NULL);
  loom_lr_rule r;
  for (int i = 0; i < LOOM_LR_RULE_COUNT; i++) {
    TT_CHECK_OK(loom_lr_rule_parse(loom_lr_rule_name(i), &r));
    TT_CHECK_EQ(r, i);
  }
  TT_CHECK_STR(loom_lr_rule_name(LOOM_LR_RULE_SQRT), "sqrt");
  TT_CHECK_EQ(loom_lr_rule_parse("square", &r), LOOM_ERR_INVALID_ARG);
  TT_CHECK_STR(loom_sched_kind_name(LOOM_SCHED_KIND_COUNT), "?");
}

TT_TEST(test_constant_and_warmup) {
  loom_sched s = loom_sched_default();
  TT_CHECK_OK(loom_sched_check(&s));
  TT_CHECK(loom_sched_lr(&s, 0) == 1e-3f);
  TT_CHECK(loom_sched_lr(&s, 123456) == 1e-3f);
  s.lr = 1.0f;
  s.warmup_steps = 10;
  TT_CHECK_NEAR(loom_sched_lr(&s, 0), 0.1, 1e-7); /* warmup start */
  TT_CHECK_NEAR(loom_sched_lr(&s, 4), 0.5, 1e-7);
  TT_CHECK(loom_sched_lr(&s, 9) == 1.0f); /* warmup end */
  TT_CHECK(loom_sched_lr(&s, 10) == 1.0f);
}

TT_TEST(test_step_decay) {
  loom_sched s = loom_sched_default();
  s.kind = LOOM_SCHED_STEP;
  s.lr = 0.8f;
  s.step_size = 3;
  s.gamma = 0.5f;
  TT_CHECK_OK(loom_sched_check(&s));
  TT_CHECK(loom_sched_lr(&s, 0) == 0.8f);
  TT_CHECK(loom_sched_lr(&s, 2) == 0.8f);
  TT_CHECK(loom_sched_lr(&s, 3) == 0.4f);
  TT_CHECK(loom_sched_lr(&s, 6) == 0.2f);
  TT_CHECK(loom_sched_lr(&s, 8) == 0.2f);
  s.warmup_steps = 2; /* decays count from the end of warmup */
  TT_CHECK(loom_sched_lr(&s, 0) == 0.4f);
  TT_CHECK(loom_sched_lr(&s, 4) == 0.8f);
  TT_CHECK(loom_sched_lr(&s, 5) == 0.4f);
}

TT_TEST(test_cosine) {
  loom_sched s = loom_sched_default();
  s.kind = LOOM_SCHED_COSINE;
  s.lr = 1.0f;
  s.min_lr = 0.1f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  TT_CHECK_OK(loom_sched_check(&s));
  TT_CHECK_NEAR(loom_sched_lr(&s, 0), 0.1, 1e-7);
  TT_CHECK(loom_sched_lr(&s, 10) == 1.0f);          /* peak after warmup */
  TT_CHECK_NEAR(loom_sched_lr(&s, 60), 0.55, 1e-7); /* midpoint */
  /* a quarter: 0.1 + 0.9 * (1 + cos(pi/4)) / 2 */
  TT_CHECK_NEAR(loom_sched_lr(&s, 35), 0.868198052, 1e-7);
  TT_CHECK(loom_sched_lr(&s, 110) == 0.1f); /* floor */
  TT_CHECK(loom_sched_lr(&s, 100000) == 0.1f);
  float prev = loom_sched_lr(&s, 10);
  int rises = 0;
  for (int64_t t = 11; t <= 120; t++) {
    float lr = loom_sched_lr(&s, t);
    rises += lr > prev;
    prev = lr;
  }
  TT_CHECK_EQ(rises, 0);
}

TT_TEST(test_linear) {
  loom_sched s = loom_sched_default();
  s.kind = LOOM_SCHED_LINEAR;
  s.lr = 1.0f;
  s.total_steps = 100;
  TT_CHECK_OK(loom_sched_check(&s));
  TT_CHECK(loom_sched_lr(&s, 0) == 1.0f);
  TT_CHECK(loom_sched_lr(&s, 50) == 0.5f);
  TT_CHECK_NEAR(loom_sched_lr(&s, 99), 0.01, 1e-8);
  TT_CHECK(loom_sched_lr(&s, 100) == 0.0f);
  TT_CHECK(loom_sched_lr(&s, 200) == 0.0f);
  s.warmup_steps = 20;
  s.min_lr = 0.2f;
  TT_CHECK_NEAR(loom_sched_lr(&s, 9), 0.5, 1e-7);
  TT_CHECK_NEAR(loom_sched_lr(&s, 60), 0.6, 1e-7);
  TT_CHECK(loom_sched_lr(&s, 100) == 0.2f);
}

TT_TEST(test_check) {
  const loom_sched d = loom_sched_default();
  loom_sched s;
  struct {
    loom_sched_kind kind;
    int field; /* which field to spoil */
    const char *word;
  } bad[] = {
      {LOOM_SCHED_CONSTANT, 0, "lr"},     {LOOM_SCHED_CONSTANT, 1, "lr"},
      {LOOM_SCHED_CONSTANT, 2, "warmup"}, {LOOM_SCHED_STEP, 3, "step_size"},
      {LOOM_SCHED_STEP, 4, "gamma"},      {LOOM_SCHED_COSINE, 5, "total"},
      {LOOM_SCHED_LINEAR, 6, "min_lr"},   {(loom_sched_kind)9, -1, "kind"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    s = d;
    s.kind = bad[i].kind;
    s.total_steps = 100;
    switch (bad[i].field) {
    case 0:
      s.lr = -1.0f;
      break;
    case 1:
      s.lr = NAN;
      break;
    case 2:
      s.warmup_steps = -1;
      break;
    case 3:
      s.step_size = 0;
      break;
    case 4:
      s.gamma = 0.0f;
      break;
    case 5:
      s.warmup_steps = 100;
      break;
    case 6:
      s.min_lr = 1.0f;
      break;
    default:
      break;
    }
    loom_clear_error();
    loom_status st = loom_sched_check(&s);
    TT_CHECK_EQ(st, LOOM_ERR_INVALID_ARG);
    if (!strstr(loom_last_error(), bad[i].word)) {
      tt_fail_prefix(__FILE__, __LINE__);
      fprintf(stderr, "case %zu: '%s' lacks '%s'\n", i, loom_last_error(),
              bad[i].word);
      tt_fail_done();
    }
  }
  TT_CHECK_EQ(loom_sched_check(NULL), LOOM_ERR_INVALID_ARG);
}

TT_TEST(test_lr_scale) {
  float out = 0;
  TT_CHECK_OK(loom_lr_scale(LOOM_LR_RULE_LINEAR, 0.1f, 1024, 256, &out));
  TT_CHECK(out == 0.4f);
  TT_CHECK_OK(loom_lr_scale(LOOM_LR_RULE_SQRT, 0.1f, 1024, 256, &out));
  TT_CHECK(out == 0.2f);
  TT_CHECK_OK(loom_lr_scale(LOOM_LR_RULE_SQRT, 0.1f, 128, 256, &out));
  TT_CHECK_NEAR(out, 0.0707106781, 1e-8);
  TT_CHECK_OK(loom_lr_scale(LOOM_LR_RULE_NONE, 0.1f, 1024, 256, &out));
  TT_CHECK(out == 0.1f);
  TT_CHECK_EQ(loom_lr_scale(LOOM_LR_RULE_LINEAR, 0.1f, 0, 256, &out),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "batch") != NULL);
  TT_CHECK_EQ(loom_lr_scale((loom_lr_rule)7, 0.1f, 1, 1, &out),
              LOOM_ERR_INVALID_ARG);
}

int main(void) {
  TT_RUN(test_names);
  TT_RUN(test_constant_and_warmup);
  TT_RUN(test_step_decay);
  TT_RUN(test_cosine);
  TT_RUN(test_linear);
  TT_RUN(test_check);
  TT_RUN(test_lr_scale);
  return tt_finish();
}
