/* loom nn: modules with explicit forward and backward, models owning one flat
 * parameter buffer and one flat gradient buffer, losses, reference models. */
#ifndef LOOM_NN_H
#define LOOM_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A parameter is a view into the model's flat buffers: the same offset
 * addresses its values in the parameter buffer, its gradient in the gradient
 * buffer and its state in every optimizer buffer. Views are in forward
 * order and contiguous: views[i+1].offset == views[i].offset + numel. */
#define LOOM_PARAM_NAME_MAX 64
typedef struct loom_param {
  char name[LOOM_PARAM_NAME_MAX]; /* "blocks.0.attn.qkv.weight" */
  int64_t offset;                 /* in elements, into the flat buffers */
  int64_t numel;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  bool decay; /* weight decay applies (false for biases and norms) */
} loom_param;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_NN_H */
