/* The pipeline's arithmetic without ranks: the stage partition and the
 * bubble's theory, for equal and for unequal stages (docs/parallel.md);
 * the wire conversions of parallel.compress that DDP and the pipeline's
 * dp sum share. */
#include <math.h>

#include "loom/parallel.h"
#include "parallel/internal.h"
#include "tt.h"

TT_TEST(bubble_theory) {
  TT_CHECK_NEAR(loom_pipe_bubble_theory(2, 8), 1.0 / 9, 1e-15);
  TT_CHECK_NEAR(loom_pipe_bubble_theory(4, 4), 3.0 / 7, 1e-15);
  TT_CHECK_NEAR(loom_pipe_bubble_theory(1, 8), 0, 0);
  TT_CHECK_NEAR(loom_pipe_bubble_theory(0, 8), 0, 0);
  TT_CHECK_NEAR(loom_pipe_bubble_theory(2, 0), 0, 0);
}

/* Equal stages: the theory, whatever their time. */
TT_TEST(bubble_expected_equal) {
  const double busy[4] = {0.3, 0.3, 0.3, 0.3};
  for (int P = 1; P <= 4; P++)
    for (int M = 1; M <= 16; M *= 2)
      TT_CHECK_NEAR(loom_pipe_bubble_expected(P, M, busy),
                    loom_pipe_bubble_theory(P, M), 1e-12);
}

/* Stage 1 20% slower, M 8: t = 0.125, 0.15; the step 7 x 0.15 + 0.275 =
 * 1.325 s; idle 1 - 1 / 1.325 and 1 - 1.2 / 1.325, mean 0.1698 against the
 * theory's 0.1111. */
TT_TEST(bubble_expected_unequal) {
  const double busy[2] = {1.0, 1.2};
  const double want = ((1 - 1.0 / 1.325) + (1 - 1.2 / 1.325)) / 2;
  TT_CHECK_NEAR(loom_pipe_bubble_expected(2, 8, busy), want, 1e-12);
  TT_CHECK(loom_pipe_bubble_expected(2, 8, busy) >
           loom_pipe_bubble_theory(2, 8) + 0.05);
  /* the order of the stages does not matter */
  const double rev[2] = {1.2, 1.0};
  TT_CHECK_NEAR(loom_pipe_bubble_expected(2, 8, rev), want, 1e-12);
  /* nothing measured */
  const double zero[2] = {0, 0};
  TT_CHECK_NEAR(loom_pipe_bubble_expected(2, 8, zero), 0, 0);
  TT_CHECK_NEAR(loom_pipe_bubble_expected(2, 8, NULL), 0, 0);
  TT_CHECK_NEAR(loom_pipe_bubble_expected(0, 8, busy), 0, 0);
}

/* The cost-balanced cut minimises the largest stage. */
TT_TEST(partition) {
  int first[5];
  const double even[4] = {1, 1, 1, 1};
  TT_CHECK_OK(loom_pipe_partition(4, 2, NULL, even, first));
  TT_CHECK_EQ(first[0], 0);
  TT_CHECK_EQ(first[1], 2);
  TT_CHECK_EQ(first[2], 4);
  /* embedding, 4 blocks, norm, head: [emb b0 b1] [b2 b3 norm head] */
  const double gpt[7] = {0.01, 1, 1, 1, 1, 0.01, 0.2};
  TT_CHECK_OK(loom_pipe_partition(7, 2, NULL, gpt, first));
  TT_CHECK_EQ(first[1], 3);
  const int split[2] = {1, 6};
  TT_CHECK_OK(loom_pipe_partition(7, 2, split, NULL, first));
  TT_CHECK_EQ(first[1], 1);
  TT_CHECK(loom_pipe_partition(3, 4, NULL, even, first) ==
           LOOM_ERR_INVALID_ARG);
}

/* The pipeline's dp sum puts a replica's share of the sum times D on the
 * wire: with scale 1 the bits of core's scalar conversions (DDP's), with
 * scale 2 twice them where that is exact; f16 overflows to inf (then
 * seen by f16 training's check), NaN stays NaN. */
TT_TEST(wire_pack) {
  const float x[6] = {1.0f, -3.14159f, 1e-6f, 40000.0f, NAN, 0.1f};
  uint16_t h[6];
  float back[6];
  TT_CHECK(loom_pipe_opts_default().compress == LOOM_F32);
  loom_wire_pack(h, x, 6, LOOM_BF16, 1.0f);
  for (int i = 0; i < 6; i++)
    TT_CHECK_EQ(h[i], loom_f32_to_bf16(x[i]));
  loom_wire_pack(h, x, 6, LOOM_F16, 1.0f);
  for (int i = 0; i < 6; i++)
    TT_CHECK_EQ(h[i], loom_f32_to_f16(x[i]));
  loom_wire_pack(h, x, 6, LOOM_BF16, 2.0f);
  loom_wire_unpack(back, h, 6, LOOM_BF16);
  for (int i = 0; i < 4; i++)
    TT_CHECK_EQ(back[i], 2.0f * loom_bf16_to_f32(loom_f32_to_bf16(x[i])));
  TT_CHECK(isnan(back[4]));
  loom_wire_pack(h, x, 6, LOOM_F16, 2.0f);
  loom_wire_unpack(back, h, 6, LOOM_F16);
  TT_CHECK_EQ(back[0], 2.0f);
  TT_CHECK(isinf(back[3]) && back[3] > 0); /* 80000 > 65504 */
  TT_CHECK(isnan(back[4]));
  TT_CHECK_EQ(back[5], loom_f16_to_f32(loom_f32_to_f16(0.2f)));
}

int main(void) {
  TT_RUN(bubble_theory);
  TT_RUN(bubble_expected_equal);
  TT_RUN(bubble_expected_unequal);
  TT_RUN(partition);
  TT_RUN(wire_pack);
  return tt_finish();
}
