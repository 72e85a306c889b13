/* Private helpers shared by the files of the optim layer. */
#ifndef LOOM_OPTIM_INTERNAL_H
#define LOOM_OPTIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

/* Below this many elements per thread a parallel region costs more than the
 * memory traffic it splits. */
#define LOOM_OPTIM_MIN_PER_THREAD 16384

/* Threads worth using for an elementwise pass over n elements: at most
 * loom_threads(), at least 1. */
int loom_optim_threads_for(int64_t n);

/* Part t of nt of the global range [begin, end): interior cuts fall on
 * multiples of 16 elements (64 bytes), so threads never write the same cache
 * line of a 64-byte aligned buffer. Parts are contiguous and in order. */
void loom_optim_part(int64_t begin, int64_t end, int t, int nt, int64_t *lo,
                     int64_t *hi);

/* The scalars of one step, computed once in double and rounded to f32. */
typedef struct step_consts {
  float lr, wd;
  float mu;                 /* sgd */
  float b1, b2, omb1, omb2; /* adamw: beta1, beta2, 1 - beta1, 1 - beta2 */
  float neg_step_size;      /* adamw: -lr / (1 - beta1^t) */
  float bc2_sqrt;           /* adamw: sqrt(1 - beta2^t) */
  float eps;
  float decay_factor; /* adamw: 1 - lr * wd */
} step_consts;

#include "isa.h" /* after step_consts, which it uses */

#endif /* LOOM_OPTIM_INTERNAL_H */
