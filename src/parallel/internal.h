/* Private helpers shared by the files of the parallel layer. */
#ifndef LOOM_PARALLEL_INTERNAL_H
#define LOOM_PARALLEL_INTERNAL_H

#include <stdint.h>

#include "loom/core.h"

/* Gradient compression (parallel.compress): n f32 values, times scale, to
 * the 16-bit wire type dt (LOOM_BF16 or LOOM_F16), and back, for DDP's
 * buckets and the pipeline's dp sum alike. Round to nearest even; NaN
 * stays NaN; f16 keeps subnormals and gives inf from |x| >= 65520 (the bits
 * of core's loom_f32_to_bf16 / loom_f32_to_f16), so an overflow on the
 * wire reaches the f32 gradient as inf, where f16 training's check skips
 * the step. scale: 1 for DDP, whose ranks put their own mean gradient on
 * the wire and average; a pipeline replica, whose gradient is already its
 * share of the sum (1/D of its mean), scales by D and averages too, so
 * that the wire carries DDP's values (f16's range: the same underflow and
 * overflow). */
void loom_wire_pack(void *out, const float *in, int64_t n, loom_dtype dt,
                    float scale);
void loom_wire_unpack(float *out, const void *in, int64_t n, loom_dtype dt);

#endif
