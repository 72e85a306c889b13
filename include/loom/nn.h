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
LOOM_API_BEGIN

/* loom_param, the view of one parameter in the flat buffers, is in
 * loom/core.h: optim, ckpt and parallel use it without the modules. */

/* ============================================================== shapes */

/* The shape and dtype of what flows between modules (no data). */
typedef struct loom_shape {
  loom_dtype dtype;
  int ndim;
  int64_t dim[LOOM_MAX_DIMS];
} loom_shape;

loom_shape loom_shape_make(loom_dtype dtype, int ndim, const int64_t *dim);
int64_t loom_shape_numel(const loom_shape *s);
bool loom_shape_equal(const loom_shape *a, const loom_shape *b);
/* Writes "f32(4,16,32)" into buf (always NUL-terminated); returns buf. */
char *loom_shape_str(const loom_shape *s, char *buf, size_t size);

/* ===================================================== parameter roles */

/* What a parameter is for: chooses its initialisation and whether weight
 * decay applies (WEIGHT and EMBEDDING decay, as nanoGPT decays every 2-D
 * parameter; biases and norm parameters do not). */
#define LOOM_PARAM_ROLE_LIST(X)                                                \
  X(LOOM_ROLE_WEIGHT, "weight")                                                \
  X(LOOM_ROLE_BIAS, "bias")                                                    \
  X(LOOM_ROLE_NORM_WEIGHT, "norm_weight")                                      \
  X(LOOM_ROLE_NORM_BIAS, "norm_bias")                                          \
  X(LOOM_ROLE_EMBEDDING, "embedding")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_PARAM_ROLE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_PARAM_ROLE_COUNT
} loom_param_role;
const char *loom_param_role_name(loom_param_role r);

/* Weight initialisation schemes. Every parameter draws from its own
 * counter-based stream keyed by (seed, parameter index), so values depend on
 * nothing else (not on threads, ranks or the other parameters).
 *   torch:     PyTorch's defaults. Linear/Conv weights kaiming_uniform with
 *              a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)); biases
 *              U(-1/sqrt(fan_in), 1/sqrt(fan_in)); embeddings N(0, 1); norms
 *              weight 1, bias 0.
 *   he_normal: Kaiming (He) normal for ReLU nets: weights
 *              N(0, sqrt(2/fan_in)), biases 0, embeddings N(0, 1), norms 1/0.
 *   gpt2:      GPT-2 / nanoGPT: weights and embeddings N(0, std) (std 0.02),
 *              residual projections N(0, std/sqrt(2*n_layer)), biases 0,
 *              norms 1/0. */
#define LOOM_INIT_SCHEME_LIST(X)                                               \
  X(LOOM_INIT_TORCH, "torch")                                                  \
  X(LOOM_INIT_HE_NORMAL, "he_normal")                                          \
  X(LOOM_INIT_GPT2, "gpt2")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_INIT_SCHEME_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_INIT_SCHEME_COUNT
} loom_init_scheme;
const char *loom_init_scheme_name(loom_init_scheme s);
loom_status loom_init_scheme_parse(const char *name, loom_init_scheme *out);

/* ================================================ tensor parallelism */

/* A model built for one rank of a tensor-parallel group of `size` ranks
 * (Megatron-LM's layout, docs/parallel.md "Tensor parallelism") holds a
 * part of some parameters and the whole of the others; its modules
 * all-reduce activations and gradients over the group through these
 * functions, which the parallel layer implements over a loom_group (nn
 * knows no communication). `start` posts an in-place reduction of n floats
 * over the group into request `slot` (0 .. LOOM_TP_SLOTS-1, one at a time
 * each); `wait` completes it. Every rank gets the same bits, and every
 * rank of the group runs the same modules in the same order, so the
 * reductions match. */
typedef enum { LOOM_TP_SUM, LOOM_TP_MAX, LOOM_TP_MIN } loom_tp_op;
#define LOOM_TP_SLOTS 2
typedef struct loom_tp {
  int size, rank;
  loom_status (*start)(void *user, int slot, float *buf, int64_t n,
                       loom_tp_op op);
  loom_status (*wait)(void *user, int slot);
  void *user;
  /* Sequence parallelism (loom_gpt_opts.sequence_parallel), posted into
   * `slot` like `start` and completed by `wait`. gather: an all-gather,
   * recv (size * n) = every rank's send (n) in rank order, of type dt
   * (LOOM_F32, or a half model's LOOM_BF16 / LOOM_F16: the values a
   * half GEMM rounds its operand to anyway travel rounded, in half the
   * bytes); in place when send == recv + rank * n. scatter: a
   * reduce-scatter (sum, f32), send (size * n), this rank's recv (n) =
   * the sum over the group of block `rank` of send. NULL where not offered
   * (a model asking for sequence parallelism then fails to build). */
  loom_status (*gather)(void *user, int slot, const void *send, void *recv,
                        int64_t n, loom_dtype dt);
  loom_status (*scatter)(void *user, int slot, const float *send, float *recv,
                         int64_t n);
} loom_tp;
/* start then wait. */
loom_status loom_tp_allreduce(const loom_tp *tp, float *buf, int64_t n,
                              loom_tp_op op);
/* gather / scatter then wait (slot 0). */
loom_status loom_tp_allgather(const loom_tp *tp, const void *send, void *recv,
                              int64_t n, loom_dtype dt);
loom_status loom_tp_reduce_scatter(const loom_tp *tp, const float *send,
                                   float *recv, int64_t n);

/* How a parameter of such a model is cut over the group: whole on every
 * rank (layer norms, the position embedding, a row-parallel layer's bias);
 * dimension 0 cut in `size` equal parts, rank r holding part r (a
 * column-parallel layer's weight and bias, the token embedding's vocabulary
 * rows) -- with `blocks` > 1, dimension 0 is that many equal blocks (the
 * qkv projection's q, k and v), each cut so; or dimension 1 cut (a
 * row-parallel layer's weight: a strided slice of the whole). */
typedef enum { LOOM_TP_WHOLE, LOOM_TP_ROWS, LOOM_TP_COLS } loom_tp_split;

/* ============================================================= modules */

/* A module is a struct whose first member is a loom_module, plus a static
 * const table of operations (one file per module type). Composite modules
 * (sequential, residual, transformer block) hold children and call them
 * through loom_module_plan/forward/backward. The protocol:
 *
 *   params   lists the module's own parameters (loom_nn_visit_param, all
 *            at once) and its children (loom_nn_visit_child), in forward
 *            order. Called once, when a model is made.
 *   plan     for an input shape: checks it (LOOM_ERR_INVALID_ARG with a
 *            message naming the module), gives the output shape and takes
 *            its buffers from the plan: `act` buffers live from forward to
 *            backward (outputs, saved statistics), `scratch` buffers only
 *            during one forward or backward call of this module (they are
 *            shared with other modules). A plan runs twice: a counting pass
 *            (loom_nn_plan_binding false, allocations return NULL) and a
 *            binding pass over the arena; both must ask for the same sizes.
 *   forward  reads `in` (planned shape), sets *out to its output (usually
 *            an act buffer; a view of `in` is allowed) and keeps what
 *            backward needs. `in` must stay unchanged until backward.
 *            In a half model (bf16 or f16) a module planned with
 *            out_half writes its output in the model's half type (out
 *            dtype LOOM_BF16 or LOOM_F16; *out then points to 2-byte
 *            values); gradients are always f32.
 *   backward ADDS the gradient with respect to its input into `dinp`
 *            (NULL when nobody needs it) and adds its parameters'
 *            gradients into ctx->grads. `dout` is the gradient with respect
 *            to its output.
 *   free     frees the module and its children. */
typedef struct loom_module loom_module;
typedef struct loom_module_ops loom_module_ops;
typedef struct loom_nn_plan loom_nn_plan;
typedef struct loom_nn_visit loom_nn_visit;
typedef struct loom_nn_ctx loom_nn_ctx;

struct loom_module {
  const loom_module_ops *ops;
  char path[LOOM_PARAM_NAME_MAX]; /* "blocks.0.attn" once in a model */
  int param_first;                /* index of its first own view; -1 */
  int param_count;                /* its own parameters, not children's */
  bool attached;                  /* has a parent or a model */
  /* The sequential, residual or checkpoint holding it (NULL at the top,
   * and for the parts a composite module makes itself). */
  loom_module *parent;
  bool model_root;    /* the root of a model (loom_model_new) */
  loom_shape in, out; /* the planned shapes */
  bool out_half;      /* planned to hand its output on in half (a half model) */
};

struct loom_module_ops {
  const char *name; /* "linear" */
  loom_status (*params)(loom_module *m, loom_nn_visit *v);
  loom_status (*plan)(loom_module *m, loom_nn_plan *p, const loom_shape *in,
                      loom_shape *out);
  loom_status (*forward)(loom_module *m, loom_nn_ctx *ctx, const void *in,
                         const float **out);
  loom_status (*backward)(loom_module *m, loom_nn_ctx *ctx, const float *dout,
                          float *dinp);
  void (*free)(loom_module *m);
  /* Optional: backward that WRITES every element of dinp (non-NULL)
   * instead of adding, with the bits backward gives into a zeroed dinp.
   * Callers use it through loom_module_backward_to for a buffer they would
   * otherwise clear first: one pass over it instead of three. */
  loom_status (*backward_to)(loom_module *m, loom_nn_ctx *ctx,
                             const float *dout, float *dinp);
  /* Mixed precision (docs/precision.md). half_in: in a half model (bf16
   * or f16) the module takes an input of that type (its first operation is
   * a half matmul or convolution), so the module before it may hand its
   * output on in it. f32_only: the module has no half form yet, and
   * loom_model_set_precision refuses bf16 and f16 for a model holding
   * one. */
  bool half_in;
  bool f32_only;
};

/* Called with a parameter's index in the model's views and its range of the
 * flat gradient buffer once its gradient is final for this backward, in
 * reverse forward order. An error stops backward and is returned by it. */
typedef loom_status (*loom_grad_hook)(void *user, int index, int64_t offset,
                                      int64_t numel);

/* Units (ZeRO-3 gathers a unit's parameters before it runs and frees them
 * after): the root's children when the root is a sequential (a transformer
 * block, a group of checkpointed blocks, a layer), else the whole root. The
 * hook sees each unit's forward and backward begin and end, in the order
 * they run. */
typedef enum {
  LOOM_UNIT_PRE_FORWARD,
  LOOM_UNIT_POST_FORWARD,
  LOOM_UNIT_PRE_BACKWARD,
  LOOM_UNIT_POST_BACKWARD
} loom_unit_event;
typedef loom_status (*loom_unit_hook)(void *user, int unit, loom_unit_event ev);

/* What forward and backward see: the flat buffers and the step's keys. */
struct loom_nn_ctx {
  float *params;               /* the flat parameter buffer */
  const uint16_t *params_half; /* its copy in `half`, else NULL */
  /* On the conversion path (!loom_half_on_unit(half)) the model's own
   * copy holds the values of `half` in f32 instead, here (params_half is
   * then NULL): the matmuls read them with no widening pass. */
  const float *params_rounded;
  loom_dtype half;         /* LOOM_BF16 or LOOM_F16; LOOM_F32: none */
  float *grads;            /* the flat gradient buffer */
  const loom_param *views; /* the model's views */
  bool training;           /* dropout on */
  uint64_t seed;           /* the model's seed (dropout masks) */
  uint64_t step;           /* loom_model_set_step */
  uint64_t sample_base;    /* global index of this batch's first sample */
  loom_grad_hook hook;
  void *hook_user;
  loom_unit_hook unit_hook; /* NULL: none */
  void *unit_user;
  const loom_module *unit_root; /* the sequential whose children are units */
};

/* Values and gradient of the k-th own parameter of m (or of the module that
 * owns a tied weight). */
static inline float *loom_nn_param(const loom_nn_ctx *c, const loom_module *m,
                                   int k) {
  return c->params + c->views[m->param_first + k].offset;
}
static inline float *loom_nn_grad(const loom_nn_ctx *c, const loom_module *m,
                                  int k) {
  return c->grads + c->views[m->param_first + k].offset;
}

/* Calls through the table; plan records in/out on the module, backward then
 * reports the module's own parameters to ctx->hook (reverse order). */
loom_status loom_module_plan(loom_module *m, loom_nn_plan *p,
                             const loom_shape *in, loom_shape *out);
loom_status loom_module_forward(loom_module *m, loom_nn_ctx *ctx,
                                const void *in, const float **out);
loom_status loom_module_backward(loom_module *m, loom_nn_ctx *ctx,
                                 const float *dout, float *dinp);
/* Backward into a dinp whose contents are garbage: the result is that of
 * clearing dinp and calling loom_module_backward (the module's backward_to
 * when it has one, else exactly that). */
loom_status loom_module_backward_to(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp);
/* Frees m and its children; NULL is a no-op. */
void loom_module_free(loom_module *m);
const char *loom_module_type(const loom_module *m);
/* Activation bytes (act, kept from forward to backward) and the peak of
 * scratch bytes m needs for input shape `in`; either pointer may be NULL.
 * Only for a module not yet in a model or a parent (loom_model_act_bytes
 * then). */
loom_status loom_module_act_bytes(loom_module *m, const loom_shape *in,
                                  size_t *act, size_t *scratch);
/* Records "<path> (<type>): <message>" for status s and returns s. */
loom_status loom_module_error(const loom_module *m, loom_status s,
                              const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For module authors: the base fields of a new module. */
void loom_module_init_base(loom_module *m, const loom_module_ops *ops);

/* Plan allocation (64-byte aligned; NULL in the counting pass). */
void *loom_nn_plan_act(loom_nn_plan *p, size_t bytes);
void *loom_nn_plan_scratch(loom_nn_plan *p, size_t bytes);
/* Scratch is a stack: a composite takes its own scratch, then plans its
 * children between mark and release so that siblings share what is above. */
size_t loom_nn_plan_scratch_mark(const loom_nn_plan *p);
void loom_nn_plan_scratch_release(loom_nn_plan *p, size_t mark);
bool loom_nn_plan_binding(const loom_nn_plan *p);
/* Output shape of m for `in` without touching any plan (a dry run); a
 * bf16 or f16 `in` plans as a run in that precision would. */
loom_status loom_nn_plan_dry(loom_module *m, const loom_shape *in,
                             loom_shape *out);

/* Parameter listing. */
typedef struct loom_param_spec {
  const char *name; /* local: "weight" */
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  loom_param_role role;
  int64_t fan_in;  /* for fan-in scaled initialisation */
  bool resid_proj; /* a projection into the residual stream (GPT-2 init) */
  /* Tensor parallelism: how the whole parameter is cut (LOOM_TP_WHOLE, the
   * default zero, when not cut) and dimension 0's blocks (0 means 1). */
  loom_tp_split tp_split;
  int tp_blocks;
} loom_param_spec;
loom_status loom_nn_visit_param(loom_nn_visit *v, loom_module *m,
                                const loom_param_spec *spec);
/* name "" keeps the parent's prefix (a transparent wrapper). */
loom_status loom_nn_visit_child(loom_nn_visit *v, const char *name,
                                loom_module *child);
/* The view of the k-th own parameter of an already listed module (tied
 * weights: the owner must come earlier in forward order). */
loom_status loom_nn_visit_view(loom_nn_visit *v, const loom_module *owner,
                               int k, const loom_param **view);
/* A fresh id per random module (dropout), in forward order. */
uint64_t loom_nn_visit_rng_id(loom_nn_visit *v);

/* ---------------------------------------------------- the module types */

/* Every constructor below returns LOOM_ERR_INVALID_ARG, naming the call,
 * for a NULL out. */

/* Linear: (..., C) -> (..., OC), out = in @ weight(OC,C)^T + bias(OC).
 * Parameters "weight" (OC,C), "bias" (OC). */
loom_status loom_linear_new(loom_module **out, int C, int OC, bool bias);
/* A linear layer without parameters of its own whose weight is the k-th
 * parameter of `owner` (shape (OC,C)), e.g. a GPT's output layer tied to the
 * token embedding (V,C). Its gradient adds into the owner's. No bias. */
loom_status loom_linear_tied_new(loom_module **out, const loom_module *owner,
                                 int k);
/* Marks a linear layer as a residual projection (GPT-2 init scaling). */
void loom_linear_set_resid_proj(loom_module *linear, bool on);

/* Conv2d: (N,C,H,W) -> (N,OC,OH,OW), square kernel K, stride, zero padding.
 * Parameters "weight" (OC,C,K,K), "bias" (OC). */
loom_status loom_conv2d_new(loom_module **out, int C, int OC, int K, int stride,
                            int pad, bool bias);
/* MaxPool2d: (N,C,H,W) -> (N,C,(H-K)/S+1,(W-K)/S+1), no padding. */
loom_status loom_maxpool2d_new(loom_module **out, int K, int S);
/* Elementwise, any shape. GELU is the tanh form (GPT-2). */
loom_status loom_relu_new(loom_module **out);
loom_status loom_gelu_new(loom_module **out);
/* LayerNorm over the last dimension C, eps 1e-5. Parameters "weight" (C)
 * and, when bias, "bias" (C). */
loom_status loom_layernorm_new(loom_module **out, int C, bool bias);
/* Embedding: int32 ids (...) -> (..., C) with "tok.weight" (V,C). With
 * T_max > 0 the input must be (B,T), T <= T_max, and a learned position
 * embedding "pos.weight" (T_max,C) is added: out[b,t] = tok[id] + pos[t]. */
loom_status loom_embedding_new(loom_module **out, int V, int C, int T_max);
/* Causal multi-head self-attention: (B,T,C) -> (B,T,C); children "qkv"
 * (linear C -> 3C) and "proj" (linear C -> C, a residual projection). */
loom_status loom_attention_new(loom_module **out, int C, int NH, bool bias);
/* MLP: (..., C) -> (..., C): children "fc" (C -> hidden), GELU, "proj"
 * (hidden -> C, a residual projection), then dropout p when p > 0. */
loom_status loom_mlp_new(loom_module **out, int C, int hidden, bool bias,
                         float dropout);
/* Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)); children
 * "ln1", "attn", "ln2", "mlp" (hidden = mlp_ratio * C); dropout p after the
 * attention projection and after the MLP when p > 0. */
loom_status loom_transformer_block_new(loom_module **out, int C, int NH,
                                       int mlp_ratio, bool bias, float dropout);
/* Dropout p in [0, 1): in training, out = in * mask / (1-p) with the mask of
 * sample s drawn from Philox keyed by (model seed, module, step, s), so it
 * depends on neither thread count nor rank; in eval, out = in. Dimension 0
 * of the input is the sample. */
loom_status loom_dropout_new(loom_module **out, float p);
/* Flatten: (N, d1, d2, ...) -> (N, d1*d2*...), no copy. */
loom_status loom_flatten_new(loom_module **out);
/* Sequential: children in order. loom_sequential_add takes ownership of
 * child (it is freed on failure too, unless it already had a parent or is,
 * or holds, seq). LOOM_ERR_INVALID_ARG when seq is not a sequential, child
 * is NULL or already has a parent, child is seq or holds it (a cycle), or
 * seq is already part of a model (loom_model_new fixed its layout). */
loom_status loom_sequential_new(loom_module **out);
loom_status loom_sequential_add(loom_module *seq, const char *name,
                                loom_module *child);
int loom_sequential_count(const loom_module *seq);
/* The i-th child (NULL when out of range or seq is not a sequential). */
const loom_module *loom_sequential_child(const loom_module *seq, int i);
/* Residual: out = in + f(in); f's output shape must equal its input's.
 * Takes ownership of f (freed on failure too); f's names are not prefixed. */
loom_status loom_residual_new(loom_module **out, loom_module *f);
/* Activation checkpointing: f keeps only its output from forward to
 * backward; backward runs f's forward again (its activations in a region
 * that every checkpointed segment of the model shares) and then f's
 * backward, so the gradients are the bits of f alone. Takes ownership of f
 * (freed on failure too); f's names are not prefixed; not nestable. */
loom_status loom_checkpoint_new(loom_module **out, loom_module *f);

/* ============================================================== models */

/* A NULL model: every loom_model_* call returning loom_status returns
 * LOOM_ERR_INVALID_ARG naming the call; getters return 0, NULL, false,
 * LOOM_F32 (precision), LOOM_ROLE_WEIGHT (view_role) or LOOM_TP_WHOLE
 * (view_tp); calls returning nothing do nothing. */
typedef struct loom_model loom_model;

typedef struct loom_model_opts {
  uint64_t seed;         /* initialisation and dropout masks */
  loom_init_scheme init; /* default torch */
  float init_std;        /* gpt2: 0.02 */
  int init_n_layer;      /* gpt2: residual projections / sqrt(2 n); 0 off */
  /* Parameters left zero, drawn later (if at all) by loom_model_init_params
   * with the same values: for a model about to be loaded from a checkpoint,
   * whose draws would be thrown away (false). */
  bool defer_init;
  /* No parameter or gradient buffers at all (loom_model_params and
   * loom_model_grads return NULL): the layout and the activation sizes only,
   * for sizing a model larger than this machine (loom estimate). Such a
   * model runs only once buffers are bound (loom_model_bind_params and
   * loom_model_bind_grads: a pipeline stage's copies of the model share
   * one pair of buffers) (false). */
  bool shape_only;
} loom_model_opts;
loom_model_opts loom_model_opts_default(void);

/* Makes a model of `root` (taken over: freed with the model, and on
 * failure): lists the parameters in forward order, allocates the flat
 * parameter and gradient buffers (gradients zeroed) and initialises the
 * parameters. opts NULL means loom_model_opts_default(). */
loom_status loom_model_new(loom_model **out, loom_module *root,
                           const loom_model_opts *opts);
void loom_model_free(loom_model *m);

float *loom_model_params(loom_model *m);
float *loom_model_grads(loom_model *m);
int64_t loom_model_num_params(const loom_model *m);
int loom_model_num_views(const loom_model *m);
const loom_param *loom_model_view(const loom_model *m, int i);
/* Index of the view named `name`, or LOOM_ERR_INVALID_ARG. */
loom_status loom_model_find(const loom_model *m, const char *name, int *index);
loom_param_role loom_model_view_role(const loom_model *m, int i);
/* FNV-1a over every view (name, offset, numel, shape, decay): equal on
 * ranks that built the same model. */
uint64_t loom_model_layout_hash(const loom_model *m);
loom_module *loom_model_root(loom_model *m);
const loom_model_opts *loom_model_get_opts(const loom_model *m);

/* Re-draws every parameter as loom_model_new did, with opts' scheme. */
loom_status loom_model_init_params(loom_model *m, const loom_model_opts *opts);
/* Re-draws view i only, with the model's options: the values
 * loom_model_init_params gives it (each view has its own random stream). */
loom_status loom_model_init_view(loom_model *m, int i);
/* The values loom_model_init_view gives view i, drawn into dst (the view's
 * numel floats) instead of the model's buffer: a shape_only model of the
 * whole GPT draws what a tensor-parallel rank then cuts its part from. */
loom_status loom_model_draw_view(const loom_model *m, int i, float *dst);
/* How view i is cut over a tensor-parallel group (LOOM_TP_WHOLE for a
 * model without one); *blocks gets dimension 0's blocks (1 but for qkv). */
loom_tp_split loom_model_view_tp(const loom_model *m, int i, int *blocks);

/* Sets every gradient to zero (one memset of the flat buffer). */
void loom_model_zero_grad(loom_model *m);
/* Backward adds into `grads` (numel floats, same layout) instead of the
 * model's own buffer from now on; NULL restores the own buffer. */
void loom_model_bind_grads(loom_model *m, float *grads);
/* Frees the model's own gradient buffer while another one is bound (a
 * DDP's shared buffer replaces it for the whole run: 4 bytes a parameter
 * idle otherwise). After binding NULL it is made again, zeroed, when next
 * needed (loom_model_grads, backward); if that fails backward says so. */
void loom_model_drop_own_grads(loom_model *m);
/* Forward and backward read parameters from `params` (numel floats, same
 * layout; e.g. weights gathered by ZeRO-3) instead of the own buffer; NULL
 * restores it. loom_model_params() returns the bound buffer. */
void loom_model_bind_params(loom_model *m, float *params);

/* Mixed precision (docs/precision.md). LOOM_BF16 or LOOM_F16 (the half
 * types): the matmuls of linear layers (attention's projections, the
 * MLP's, the tied output layer) and convolutions take operands of that
 * type and sum in f32; the module before such a layer hands its output on
 * in it (ReLU, GELU, LayerNorm, attention's heads, max pooling), which is
 * also what is kept for backward; everything else (norms, softmax,
 * attention's scores, the loss, gradients, the parameters themselves)
 * stays f32. The model keeps a half copy of its parameters (2 bytes a
 * parameter; on the conversion path, where no unit takes the type
 * (loom_half_on_unit), 4: the same values in f32, which its f32 GEMMs
 * read with no widening pass), made on the first forward after they
 * changed: call
 * loom_model_params_updated after writing them (an optimizer step; the
 * trainer does), not needed after loom_model_init_params,
 * loom_model_init_view or loom_model_bind_params. LOOM_F32 (the default)
 * frees the copy. f16's range ends at 65504: train it with a loss scaler
 * (loom_scaler, include/loom/optim.h), as the trainer does.
 * LOOM_ERR_UNSUPPORTED for another type, or for a half type in a model holding
 * a module without a half form (ops->f32_only; none of loom's own);
 * LOOM_ERR_INVALID_ARG for a NULL model. These precision calls take NULL
 * without harm: loom_model_precision says f32, loom_model_half_bytes 0,
 * loom_model_rounded_copy NULL; params_updated and bind_half do nothing. */
loom_status loom_model_set_precision(loom_model *m, loom_dtype precision);
loom_dtype loom_model_precision(const loom_model *m);
void loom_model_params_updated(loom_model *m);
/* Bytes of the half (bf16 or f16) parameter copy the model owns (0 in
 * f32, or when bound to the caller's; 4 a parameter on the conversion
 * path, 2 on the unit). */
size_t loom_model_half_bytes(const loom_model *m);
/* The model's own copy on the conversion path (numel f32 values of its
 * half type), or NULL (f32, a unit path, a bound copy, or none made yet:
 * the first forward makes it). Whoever changes parameters may write each
 * one's rounding (loom_round_half) there as it goes and leave out
 * loom_model_params_updated: the copy stays current, with no refresh pass
 * at the next forward (the trainer has its optimizer do it:
 * loom_optim_set_rounded). */
float *loom_model_rounded_copy(loom_model *m);
/* Binds the half copy to the caller's buffer buf (numel 2-byte entries,
 * on either path: the conversion path widens them on use; NULL: the
 * model's own again, made on the next forward). Several models
 * bound to one pair of parameter buffers can share one copy (a pipeline
 * stage's instances). A bound copy is never made by the model itself: the
 * caller fills the ranges the model reads with loom_model_refresh_half
 * after each change of the parameters. */
void loom_model_bind_half(loom_model *m, uint16_t *buf);

/* Training mode (default) or eval mode (dropout off). */
void loom_model_set_training(loom_model *m, bool training);
bool loom_model_training(const loom_model *m);
/* Keys of the next forward's random draws: the optimizer step and the
 * global index of the batch's first sample (rank-independent). */
void loom_model_set_step(loom_model *m, uint64_t step, uint64_t sample_base);

/* Sizes the activation arena for an input shape ahead of time (forward does
 * it by itself; the arena only grows, so planning the largest batch first
 * avoids any later allocation). */
loom_status loom_model_plan(loom_model *m, const loom_shape *input);
size_t loom_model_arena_bytes(const loom_model *m);
/* The activation and scratch bytes the model writes for an input shape (the
 * arena holds act + scratch + the output gradient, and room for the other
 * convolution engine, which stays untouched); allocates nothing. */
loom_status loom_model_act_bytes(loom_model *m, const loom_shape *input,
                                 size_t *act, size_t *scratch);

/* Runs forward on a contiguous input; *output becomes a view of the model's
 * output (valid until the next forward). The input must stay unchanged
 * until backward. */
loom_status loom_model_forward(loom_model *m, const loom_tensor *input,
                               loom_tensor *output);
/* A view of the model's own buffer for the gradient of the output (the
 * output's shape), for a loss to write into with no copy. */
loom_status loom_model_output_grad(loom_model *m, loom_tensor *doutput);
/* Backward of the last forward. doutput: the gradient of the output, or
 * NULL for the buffer of loom_model_output_grad. Parameter gradients ADD
 * into the gradient buffer (call zero_grad between steps; accumulation is
 * free); the hook sees each parameter once, in reverse forward order, as
 * soon as its gradient is final. dinput, when not NULL, receives (is
 * overwritten with) the gradient with respect to a float input. */
loom_status loom_model_backward(loom_model *m, const loom_tensor *doutput,
                                loom_tensor *dinput);
void loom_model_set_grad_hook(loom_model *m, loom_grad_hook fn, void *user);

/* A range [offset, offset + numel) of the flat buffers. */
typedef struct loom_range {
  int64_t offset, numel;
} loom_range;
/* The model's units (see loom_unit_event); a unit without parameters has
 * no range. */
int loom_model_num_units(const loom_model *m);
/* The ranges of the flat buffers whose parameters unit u reads (its own and
 * tied ones: GPT's output layer reads the token embedding), ascending and
 * merged; *n gets their number (0 for a unit without parameters). NULL for
 * a unit out of range. */
const loom_range *loom_model_unit_ranges(const loom_model *m, int u, int *n);
/* Sorts r[0..n) by offset and merges overlapping or touching ranges in
 * place; returns how many remain. */
int loom_ranges_merge(loom_range *r, int n);
/* Converts ranges r[0..n) of the parameters into the half copy (the
 * model's own or bound). LOOM_ERR_INVALID_ARG in f32, for a range out of
 * bounds, a NULL model, n < 0, or NULL r with n > 0. */
loom_status loom_model_refresh_half(loom_model *m, const loom_range *r, int n);
/* Only units [first, end) run from now on (a pipeline stage): forward
 * takes what unit `first` takes (the token ids, or the activations of the
 * unit before it) and gives what unit end - 1 gives; backward can give the
 * gradient of a float input. (0, num_units) runs the whole model again.
 * LOOM_ERR_INVALID_ARG for a root that is not a sequential or a range out
 * of bounds. */
loom_status loom_model_set_unit_range(loom_model *m, int first, int end);
/* Called around each unit's forward and backward (NULL: none). An error
 * stops the pass and is returned by it. */
void loom_model_set_unit_hook(loom_model *m, loom_unit_hook fn, void *user);
/* A second hook at the same points, for whoever watches (the trace): told
 * after the unit hook's PRE events and before its POST events, so what it
 * times is the unit's own work, not the unit hook's waits. */
void loom_model_set_unit_observer(loom_model *m, loom_unit_hook fn, void *user);
/* Unit u's module path ("blocks.3"; "model" for a root that is one unit);
 * NULL when out of range. */
const char *loom_model_unit_name(const loom_model *m, int u);

/* ========================================================== the loss */

/* Softmax cross-entropy over logits (..., V) with int32 targets (one per
 * row; -1 is ignored), mean over the rows that are not ignored. */
typedef struct loom_xent loom_xent;
typedef struct loom_xent_stats {
  double loss;     /* mean over counted rows (0 when none) */
  double loss_sum; /* sum over counted rows */
  int64_t count;   /* rows with a target */
  int64_t correct; /* rows whose argmax (first maximum) is the target */
} loom_xent_stats;

/* NULL out, x, logits, targets or dlogits: LOOM_ERR_INVALID_ARG naming the
 * call (stats may be NULL). */
loom_status loom_xent_new(loom_xent **out);
void loom_xent_free(loom_xent *x);
/* Keeps what backward needs (buffers grow only when the rows grow). */
loom_status loom_xent_forward(loom_xent *x, const loom_tensor *logits,
                              const int32_t *targets, loom_xent_stats *stats);
/* Overwrites dlogits (the logits' shape) with scale * d(mean loss)/dlogits;
 * scale 1/k averages k accumulated micro-batches. */
loom_status loom_xent_backward(loom_xent *x, loom_tensor *dlogits, float scale);
/* Vocabulary-parallel: the logits each rank passes are its part of the
 * vocabulary (rank r: classes [r V/T, (r+1) V/T) of V = T x the logits'
 * last dimension), the targets are whole; the row maxima, the sums of
 * exponentials, the targets' logits and the argmax are all-reduced over
 * the group (3 reductions of a few floats a row), never the logits. Every
 * rank gets the whole loss and statistics; backward writes its part of
 * the gradient. NULL (or a group of one) turns it off. tp is borrowed. */
void loom_xent_set_tp(loom_xent *x, const loom_tp *tp);

/* ================================================== reference models */

/* The activation of the reference MLP and CNN after each hidden layer or
 * conv. GELU is the tanh form (GPT-2). */
#define LOOM_ACT_LIST(X)                                                       \
  X(LOOM_ACT_RELU, "relu")                                                     \
  X(LOOM_ACT_GELU, "gelu")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_ACT_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_ACT_COUNT
} loom_act;
const char *loom_act_name(loom_act a);
/* The names, indexed by value: what configs and checkpoints hold (the
 * config schema reads this table, so a value has one spelling). */
extern const char *const loom_act_names[LOOM_ACT_COUNT];
/* A module of that activation ("relu" or "gelu"). */
loom_status loom_act_new(loom_module **out, loom_act a);

/* fashion-mlp: [flatten,] in -> hidden layers (activation) -> classes.
 * Defaults 784, 512, 2, 10, ReLU: 669,706 parameters; torch init. Input
 * (N,784) or (N,1,28,28). Views "fc1.weight", "fc1.bias", ... "fc3.bias".
 * widths, when not NULL, gives the n_hidden widths in order (hidden is then
 * unused); n_hidden 0 is one linear layer (a linear model). */
typedef struct loom_fashion_mlp_opts {
  int in, hidden, n_hidden, classes;
  const int *widths; /* (n_hidden) or NULL: hidden for every layer */
  loom_act act;
} loom_fashion_mlp_opts;
loom_fashion_mlp_opts loom_fashion_mlp_opts_default(void);
loom_status loom_fashion_mlp_new(loom_model **out,
                                 const loom_fashion_mlp_opts *o,
                                 const loom_model_opts *mo);

/* fashion-cnn: n_conv stages of conv K (activation) maxpool P, flatten,
 * linear -> classes; no padding. Defaults (1,28,28), 32, 64, 5, 2, 10, ReLU:
 * 62,346 parameters; torch init. Input (N,C,H,W). channels, when not NULL,
 * gives the output channels of n_conv >= 1 convs (c1, c2 are then unused);
 * NULL: two convs, c1 and c2. */
typedef struct loom_fashion_cnn_opts {
  int in_c, in_h, in_w, c1, c2, kernel, pool, classes;
  int n_conv;          /* convs when channels is set */
  const int *channels; /* (n_conv) or NULL: c1, c2 */
  loom_act act;
} loom_fashion_cnn_opts;
loom_fashion_cnn_opts loom_fashion_cnn_opts_default(void);
/* The side (H, W) after the conv stages, or 0 when an image is too small
 * for them: what the final linear layer sees per channel. */
void loom_fashion_cnn_out_hw(const loom_fashion_cnn_opts *o, int *h, int *w);
loom_status loom_fashion_cnn_new(loom_model **out,
                                 const loom_fashion_cnn_opts *o,
                                 const loom_model_opts *mo);

/* kjv-gpt: a byte-level GPT. Token + learned position embedding, n_layer
 * pre-LN blocks, final LayerNorm, output layer tied to the token embedding.
 * Defaults: vocab 256, context 128, 4 layers, d_model 128, 4 heads, MLP 4x,
 * biases on, dropout 0: 842,496 parameters. Input (B,T) int32 with
 * T <= context; output logits (B,T,vocab). Model opts NULL gives gpt2 init
 * (std 0.02, residual scaling by n_layer). */
typedef struct loom_gpt_opts {
  int vocab, context, n_layer, d_model, n_head, mlp_ratio;
  bool bias;
  float dropout;
  /* Activation checkpointing: 0 none; K > 0: the blocks in segments of K
   * (loom_checkpoint_new), each keeping only its output. */
  int checkpoint_every;
  /* Tensor parallelism (NULL, or a group of one: none): this rank's part of
   * the model (docs/parallel.md): the token embedding and the tied output
   * layer cut over the vocabulary, attention over the heads (qkv
   * column-parallel, the output projection row-parallel), the MLP's first
   * layer column-parallel and its second row-parallel; layer norms, the
   * position embedding and the row-parallel biases whole. The output is
   * the rank's part of the logits (loom_xent_set_tp). size must divide
   * n_head and vocab. Borrowed for the model's life. */
  const loom_tp *tp;
  /* Sequence parallelism (Korthikanti et al. 2022; docs/parallel.md
   * "Sequence parallelism"), with tp of size > 1 only: between the
   * tensor-parallel layers (the embedding's output, dropout, layer norms,
   * residual sums) rank r holds tokens [r N/size, (r+1) N/size) of the
   * N = B x T tokens of its input (batch-major), so those activations are
   * (B, T/size, C) and size must divide T. The row-parallel layers
   * reduce-scatter instead of all-reducing, the column-parallel ones
   * (qkv, the MLP's first layer, the output layer) all-gather their input.
   * The whole parameters (layer norms, row-parallel biases, the position
   * embedding) then get each rank's part of their gradient: the caller
   * sums it over the group before the optimizer (the trainer does). */
  bool sequence_parallel;
  /* With sequence_parallel: the column-parallel layers do not keep their
   * gathered input (N x C floats each) for backward but all-gather it
   * again there (Megatron-LM's choice): all of the region's activations
   * take 1/size of the memory, for one more all-gather of the input a
   * column-parallel layer a backward pass. false: kept, the same bytes
   * sent as plain tensor parallelism. */
  bool sp_regather;
} loom_gpt_opts;
loom_gpt_opts loom_gpt_opts_default(void);
loom_status loom_gpt_new(loom_model **out, const loom_gpt_opts *o,
                         const loom_model_opts *mo);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_NN_H */
