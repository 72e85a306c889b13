/* Private to the nn layer: the plan and visitor structs and small helpers
 * shared by the module files. */
#ifndef LOOM_NN_INTERNAL_H
#define LOOM_NN_INTERNAL_H

#include <string.h>

#include "loom/kernels.h"
#include "loom/nn.h"

/* Activations are carved from one arena: [act region | scratch region].
 * In the counting pass base is NULL and only the sizes move. */
struct loom_nn_plan {
  char *base;          /* NULL while counting */
  size_t act_used;     /* bytes of act handed out */
  size_t act_total;    /* size of the act region (binding pass) */
  size_t scratch_top;  /* current top of the scratch stack */
  size_t scratch_peak; /* highest top seen */
  size_t scratch_cap;  /* size of the scratch region (binding pass) */
  bool no_out;         /* the module planned next never writes its output
                          (a ReLU fused with the pooling after it) */
  bool touched;        /* counting what is written (loom_model_act_bytes):
                          room never written is left out */
  /* Activation checkpointing (checkpoint.c): while recompute is set, act
   * requests go to the recompute region, which every checkpointed segment
   * reuses from its start (its forward runs again in backward). Arena:
   * [act | recompute | scratch]. */
  bool recompute;
  size_t rc_used;  /* bytes of the current segment */
  size_t rc_peak;  /* the largest segment */
  size_t rc_total; /* size of the recompute region (binding pass) */
  /* Mixed precision (docs/precision.md): the half type the model runs in
   * (LOOM_BF16 or LOOM_F16; LOOM_F32: none), and whether the module
   * planned next may hand its output on in it (its consumer takes half
   * input: loom_nn_takes_half). loom_module_plan moves out_half into the
   * module (loom_module.out_half) and clears it, so it never reaches the
   * module's own children by accident. */
  loom_dtype half;
  bool out_half;
};

/* One parameter as listed, before the flat buffers exist. */
typedef struct loom_nn_entry {
  loom_param view;
  loom_param_role role;
  int64_t fan_in;
  bool resid_proj;
  loom_tp_split tp_split; /* tensor parallelism: how it is cut */
  int tp_blocks;
} loom_nn_entry;

struct loom_nn_visit {
  loom_nn_entry *entries; /* (count) */
  int count, cap;
  int64_t numel;                    /* elements listed so far */
  char prefix[LOOM_PARAM_NAME_MAX]; /* path of the module being listed */
  uint64_t rng_ids;
  const loom_module *last_owner; /* module whose params came last */
  int refs; /* parameters listed or tied so far (a tied view counts) */
  /* Units: which root child (depth 0) listed or tied which view. */
  int depth, unit, nunits;
  struct loom_nn_uref {
    int unit, view;
  } * urefs; /* (nurefs) */
  int nurefs, cap_urefs;
  /* The first module listed that cannot run in half (ops->f32_only). */
  const loom_module *f32_only;
};

void loom_nn_visit_init(loom_nn_visit *v);
void loom_nn_visit_release(loom_nn_visit *v);
/* Lists root's parameters (root's path becomes ""). */
loom_status loom_nn_visit_root(loom_nn_visit *v, loom_module *root);

/* Checks a float input whose last dimension must be C (C <= 0: any). */
loom_status loom_nn_check_f32(const loom_module *m, const loom_shape *in,
                              int min_ndim, int64_t C);
/* The same, also taking an input of the plan's half type (modules whose
 * first operation is a half matmul: linear, attention, mlp, conv2d). */
loom_status loom_nn_check_float(const loom_module *m, const loom_nn_plan *p,
                                const loom_shape *in, int min_ndim, int64_t C);
/* Whether m takes a half input in a half plan (ops->half_in, or a
 * sequential whose first child does). */
bool loom_nn_takes_half(const loom_module *m, const loom_nn_plan *p);
/* An output of n elements for a module: of the plan's half type (2 bytes
 * each) when m->out_half, else f32; sets out->dtype to match. */
void *loom_nn_plan_out(loom_nn_plan *p, const loom_module *m, int64_t n,
                       loom_shape *out);
/* The k-th own parameter of m as a half matmul takes it (a half model
 * only): the copy in the half type (*dt = c->half), or on the conversion
 * path the copy in f32 of values rounded to it (*dt = LOOM_F32); NULL
 * when the model has neither. */
static inline const void *loom_nn_param_half(const loom_nn_ctx *c,
                                             const loom_module *m, int k,
                                             loom_dtype *dt) {
  const int64_t at = c->views[m->param_first + k].offset;
  *dt = c->params_rounded ? LOOM_F32 : c->half;
  if (c->params_rounded)
    return c->params_rounded + at;
  return c->params_half ? c->params_half + at : NULL;
}

/* numel fits the int dimensions of the kernels. */
loom_status loom_nn_check_int(const loom_module *m, const char *what,
                              int64_t n);

/* Rows of a (..., C) shape: the product of all but the last dimension. */
static inline int64_t loom_nn_rows(const loom_shape *s) {
  int64_t n = 1;
  for (int i = 0; i + 1 < s->ndim; i++)
    n *= s->dim[i];
  return n;
}

static inline float *loom_nn_plan_floats(loom_nn_plan *p, int64_t n) {
  return (float *)loom_nn_plan_act(p, (size_t)n * sizeof(float));
}
static inline float *loom_nn_plan_scratch_floats(loom_nn_plan *p, int64_t n) {
  return (float *)loom_nn_plan_scratch(p, (size_t)n * sizeof(float));
}

/* A ReLU followed by max pooling, run as one (sequential does it): the
 * pooling reads relu(x) from the ReLU's input as it goes and the ReLU's
 * output is never written; the ReLU keeps its input for backward. Both
 * modules planned, the pool on the ReLU's output shape. */
bool loom_nn_relu_pool_fusable(const loom_module *relu,
                               const loom_module *pool);
loom_status loom_nn_relu_pool_forward(loom_module *relu, loom_module *pool,
                                      const float *in, const float **out);
/* The pair's backward into the ReLU's input gradient, written. */
loom_status loom_nn_relu_pool_backward_to(loom_module *relu, loom_module *pool,
                                          const float *dout, float *dinp);
/* Is m a sequential (its children are the model's units)? */
bool loom_nn_is_sequential(const loom_module *m);
/* Only children [lo, hi) run in plan, forward and backward (a pipeline
 * stage: loom_model_set_unit_range). */
loom_status loom_nn_sequential_set_range(loom_module *seq, int lo, int hi);
/* The ReLU's side of it. */
bool loom_nn_is_relu(const loom_module *m);
void loom_nn_relu_set_input(loom_module *m, const float *in);
const float *loom_nn_relu_input(const loom_module *m);

/* The `sp` argument of the tensor-parallel constructors below: sequence
 * parallelism off; on, the column-parallel layers keeping their gathered
 * input for backward (the bytes of plain tensor parallelism); on, gathering
 * it again in backward (Megatron-LM's way: the region's activations all
 * 1/T, one more all-gather a column-parallel layer). */
enum { LOOM_NN_SP_OFF = 0, LOOM_NN_SP_KEEP = 1, LOOM_NN_SP_REGATHER = 2 };

/* Tensor parallelism (docs/parallel.md; tp NULL or of one rank: a plain
 * layer). Column-parallel linear: this rank's OC outputs of the whole
 * layer (weight and bias cut by rows, dimension 0 in `blocks` blocks);
 * backward all-reduces the input gradient. Row-parallel: this rank's C
 * inputs of the whole layer (the weight cut by columns); forward
 * all-reduces the output, then adds the whole bias. With `sp` (sequence
 * parallelism, loom_gpt_opts.sequence_parallel) the column-parallel
 * layer takes this rank's rows and all-gathers them (its input gradient
 * reduce-scattered), the row-parallel one reduce-scatters its output to
 * this rank's rows (its output gradient all-gathered). */
loom_status loom_linear_col_new(loom_module **out, int C, int OC, bool bias,
                                int blocks, const loom_tp *tp, int sp);
loom_status loom_linear_row_new(loom_module **out, int C, int OC, bool bias,
                                const loom_tp *tp, int sp);
/* A tied linear layer made column-parallel (the GPT's output layer over a
 * vocabulary-parallel token embedding). */
void loom_linear_set_tp_col(loom_module *linear, const loom_tp *tp, int sp);
/* A linear layer whose output feeds a GELU (an MLP's first layer): asked
 * to, its backward in a half model takes the gradient at the GELU's output
 * and runs the GELU's backward itself, fused with the rounding of the
 * gradient and the bias sum (loom_linear_backward_half_gelu).
 * loom_linear_gelu_fused says whether it does in a model of type half (a
 * half model, no tensor or sequence parallelism); if not, the caller runs
 * the GELU's backward and hands the layer its result as before. */
void loom_linear_set_gelu_after(loom_module *linear, bool on);
bool loom_linear_gelu_fused(const loom_module *linear, loom_dtype half);
/* The layer's output planned in scratch, not as an activation: its
 * consumer (the parent) reads it within its own forward call only and
 * keeps what backward needs itself (attention's half qkv). Read at plan. */
void loom_linear_set_out_scratch(loom_module *linear, bool on);
/* tp can run sequence parallelism (more than one rank, gather and scatter
 * offered). */
bool loom_tp_sp_ok(const loom_tp *tp);
/* Dropout over this rank's rows of sequence parallelism: its masks are
 * those of the whole micro-batch's element at the same place (rank
 * tp->rank of tp->size contiguous parts), so they do not depend on size. */
void loom_dropout_set_sp(loom_module *dropout, const loom_tp *tp);
/* The tensor-parallel forms of the GPT's modules: the token embedding cut
 * over the vocabulary (each rank looks up its ids, the rows are summed over
 * the group, then the whole position embedding is added); attention with
 * NH / size heads a rank; the MLP with hidden / size units a rank; the
 * block of them. `sp`: sequence parallelism (the embedding reduce-scatters
 * and outputs this rank's rows; attention and the MLP take and give this
 * rank's rows; the block's norms, dropouts and sums run on them). */
loom_status loom_embedding_tp_new(loom_module **out, int V, int C, int T_max,
                                  const loom_tp *tp, int sp);
loom_status loom_attention_tp_new(loom_module **out, int C, int NH, bool bias,
                                  const loom_tp *tp, int sp);
loom_status loom_mlp_tp_new(loom_module **out, int C, int hidden, bool bias,
                            float dropout, const loom_tp *tp, int sp);
loom_status loom_transformer_block_tp_new(loom_module **out, int C, int NH,
                                          int mlp_ratio, bool bias,
                                          float dropout, const loom_tp *tp,
                                          int sp);

#endif /* LOOM_NN_INTERNAL_H */
