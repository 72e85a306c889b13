/* Builders of the reference models: fashion-mlp, fashion-cnn, kjv-gpt. */
#include "internal.h"

#include <stdbool.h>
#include <stdio.h>

/* Makes a module with `ctor` (which writes kid_) and appends it to seq;
 * jumps to fail on error. */
#define ADD(name, ctor)                                                        \
  do {                                                                         \
    loom_module *kid_ = NULL;                                                  \
    st = (ctor);                                                               \
    if (st == LOOM_OK)                                                         \
      st = loom_sequential_add(seq, (name), kid_);                             \
    if (st != LOOM_OK)                                                         \
      goto fail;                                                               \
  } while (0)

const char *const loom_act_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_ACT_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof loom_act_names / sizeof loom_act_names[0] ==
                   LOOM_ACT_COUNT,
               "one name per activation");

const char *loom_act_name(loom_act a) {
  return (unsigned)a < LOOM_ACT_COUNT ? loom_act_names[a] : "unknown";
}

loom_status loom_act_new(loom_module **out, loom_act a) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_act_new: NULL out");
  *out = NULL;
  switch (a) {
  case LOOM_ACT_RELU:
    return loom_relu_new(out);
  case LOOM_ACT_GELU:
    return loom_gelu_new(out);
  default:
    return loom_error(LOOM_ERR_UNSUPPORTED, "activation %d: unknown", (int)a);
  }
}

loom_fashion_mlp_opts loom_fashion_mlp_opts_default(void) {
  loom_fashion_mlp_opts o = {.in = 784,
                             .hidden = 512,
                             .n_hidden = 2,
                             .classes = 10,
                             .widths = NULL,
                             .act = LOOM_ACT_RELU};
  return o;
}

loom_status loom_fashion_mlp_new(loom_model **out,
                                 const loom_fashion_mlp_opts *o,
                                 const loom_model_opts *mo) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_fashion_mlp_new: NULL out");
  *out = NULL;
  loom_fashion_mlp_opts d = loom_fashion_mlp_opts_default();
  if (!o)
    o = &d;
  bool ok = o->in > 0 && o->n_hidden >= 0 && o->classes > 0 &&
            (unsigned)o->act < LOOM_ACT_COUNT &&
            (o->widths || o->n_hidden == 0 || o->hidden > 0);
  for (int i = 0; ok && o->widths && i < o->n_hidden; i++)
    ok = o->widths[i] > 0;
  if (!ok)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "fashion-mlp: bad sizes (in %d, hidden %d x %d, "
                      "classes %d, activation %d)",
                      o->in, o->hidden, o->n_hidden, o->classes, (int)o->act);
  loom_module *seq;
  LOOM_TRY(loom_sequential_new(&seq));
  loom_status st;
  char name[32];
  ADD("flatten", loom_flatten_new(&kid_));
  int width = o->in;
  for (int i = 0; i < o->n_hidden; i++) {
    int next = o->widths ? o->widths[i] : o->hidden;
    snprintf(name, sizeof name, "fc%d", i + 1);
    ADD(name, loom_linear_new(&kid_, width, next, true));
    snprintf(name, sizeof name, "%s%d", loom_act_names[o->act], i + 1);
    ADD(name, loom_act_new(&kid_, o->act));
    width = next;
  }
  snprintf(name, sizeof name, "fc%d", o->n_hidden + 1);
  ADD(name, loom_linear_new(&kid_, width, o->classes, true));
  return loom_model_new(out, seq, mo);
fail:
  loom_module_free(seq);
  return st;
}

loom_fashion_cnn_opts loom_fashion_cnn_opts_default(void) {
  loom_fashion_cnn_opts o = {.in_c = 1,
                             .in_h = 28,
                             .in_w = 28,
                             .c1 = 32,
                             .c2 = 64,
                             .kernel = 5,
                             .pool = 2,
                             .classes = 10,
                             .n_conv = 0,
                             .channels = NULL,
                             .act = LOOM_ACT_RELU};
  return o;
}

void loom_fashion_cnn_out_hw(const loom_fashion_cnn_opts *o, int *oh, int *ow) {
  int k = o->kernel, p = o->pool;
  int n = o->channels ? o->n_conv : 2;
  int h = 0, w = 0;
  if (k > 0 && p > 0 && n >= 1) {
    h = o->in_h;
    w = o->in_w;
    for (int stage = 0; stage < n && h > 0 && w > 0; stage++) {
      h -= k - 1;
      w -= k - 1;
      h = h >= p ? (h - p) / p + 1 : 0;
      w = w >= p ? (w - p) / p + 1 : 0;
    }
  }
  *oh = h > 0 && w > 0 ? h : 0;
  *ow = h > 0 && w > 0 ? w : 0;
}

loom_status loom_fashion_cnn_new(loom_model **out,
                                 const loom_fashion_cnn_opts *o,
                                 const loom_model_opts *mo) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_fashion_cnn_new: NULL out");
  *out = NULL;
  loom_fashion_cnn_opts d = loom_fashion_cnn_opts_default();
  if (!o)
    o = &d;
  int two[2] = {o->c1, o->c2};
  const int *ch = o->channels ? o->channels : two;
  int n = o->channels ? o->n_conv : 2;
  int k = o->kernel, p = o->pool;
  bool ok = o->in_c > 0 && n >= 1 && o->classes > 0 &&
            (unsigned)o->act < LOOM_ACT_COUNT;
  for (int i = 0; ok && i < n; i++)
    ok = ch[i] > 0;
  int h = 0, w = 0;
  if (ok)
    loom_fashion_cnn_out_hw(o, &h, &w);
  if (h <= 0 || w <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "fashion-cnn: bad sizes (input %dx%dx%d, %d convs, "
                      "first %d channels, kernel %d, pool %d, classes %d): "
                      "the image is too small for the conv stages or a size "
                      "is not positive",
                      o->in_c, o->in_h, o->in_w, n, n > 0 ? ch[0] : 0, k, p,
                      o->classes);
  loom_module *seq;
  LOOM_TRY(loom_sequential_new(&seq));
  loom_status st;
  char name[32];
  int c = o->in_c;
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "conv%d", i + 1);
    ADD(name, loom_conv2d_new(&kid_, c, ch[i], k, 1, 0, true));
    snprintf(name, sizeof name, "%s%d", loom_act_names[o->act], i + 1);
    ADD(name, loom_act_new(&kid_, o->act));
    snprintf(name, sizeof name, "pool%d", i + 1);
    ADD(name, loom_maxpool2d_new(&kid_, p, p));
    c = ch[i];
  }
  ADD("flatten", loom_flatten_new(&kid_));
  ADD("fc", loom_linear_new(&kid_, c * h * w, o->classes, true));
  return loom_model_new(out, seq, mo);
fail:
  loom_module_free(seq);
  return st;
}

loom_gpt_opts loom_gpt_opts_default(void) {
  loom_gpt_opts o = {.vocab = 256,
                     .context = 128,
                     .n_layer = 4,
                     .d_model = 128,
                     .n_head = 4,
                     .mlp_ratio = 4,
                     .bias = true,
                     .dropout = 0.0f,
                     .checkpoint_every = 0};
  return o;
}

static int sp_mode(const loom_gpt_opts *o) {
  if (!o->tp || o->tp->size <= 1 || !o->sequence_parallel)
    return LOOM_NN_SP_OFF;
  return o->sp_regather ? LOOM_NN_SP_REGATHER : LOOM_NN_SP_KEEP;
}

/* Blocks first .. first+K-1 (named blocks.<l> as without checkpointing, so
 * the layout and checkpoints are the same) as one checkpointed segment. */
static loom_status gpt_segment(loom_module **out, const loom_gpt_opts *o,
                               int first) {
  loom_module *seq;
  LOOM_TRY(loom_sequential_new(&seq));
  loom_status st;
  char name[32];
  for (int l = first; l < first + o->checkpoint_every && l < o->n_layer; l++) {
    snprintf(name, sizeof name, "blocks.%d", l);
    ADD(name, loom_transformer_block_tp_new(&kid_, o->d_model, o->n_head,
                                            o->mlp_ratio, o->bias, o->dropout,
                                            o->tp, sp_mode(o)));
  }
  return loom_checkpoint_new(out, seq);
fail:
  loom_module_free(seq);
  return st;
}

loom_status loom_gpt_new(loom_model **out, const loom_gpt_opts *o,
                         const loom_model_opts *mo) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_gpt_new: NULL out");
  *out = NULL;
  loom_gpt_opts d = loom_gpt_opts_default();
  if (!o)
    o = &d;
  if (o->vocab <= 0 || o->context <= 0 || o->n_layer < 0 || o->d_model <= 0 ||
      o->n_head <= 0 || o->d_model % o->n_head != 0 || o->mlp_ratio <= 0 ||
      !(o->dropout >= 0.0f && o->dropout < 1.0f) || o->checkpoint_every < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "gpt: bad sizes (vocab %d, context %d, %d layers, "
                      "d_model %d, %d heads, mlp x%d, dropout %g)",
                      o->vocab, o->context, o->n_layer, o->d_model, o->n_head,
                      o->mlp_ratio, (double)o->dropout);
  const loom_tp *tp = o->tp && o->tp->size > 1 ? o->tp : NULL;
  if (tp && (o->n_head % tp->size != 0 || o->vocab % tp->size != 0 ||
             tp->rank < 0 || tp->rank >= tp->size || !tp->start || !tp->wait))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "gpt: %d tensor-parallel ranks must divide the %d heads "
                      "and the vocabulary of %d (rank %d)",
                      tp->size, o->n_head, o->vocab, tp->rank);
  const int sp = sp_mode(o);
  if (o->sequence_parallel && (!tp || !loom_tp_sp_ok(tp)))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "gpt: sequence parallelism needs tensor parallelism "
                      "over more than one rank, with all-gather and "
                      "reduce-scatter (loom_tp.gather, .scatter)");
  /* the blocks (gpt_segment) read it from the options */
  loom_gpt_opts oo = *o;
  oo.tp = tp;
  oo.sequence_parallel = sp != LOOM_NN_SP_OFF;
  o = &oo;
  loom_model_opts mopts = loom_model_opts_default();
  if (mo)
    mopts = *mo;
  else
    mopts.init = LOOM_INIT_GPT2;
  if (mopts.init == LOOM_INIT_GPT2 && mopts.init_n_layer == 0)
    mopts.init_n_layer = o->n_layer;
  loom_module *seq, *emb = NULL;
  LOOM_TRY(loom_sequential_new(&seq));
  loom_status st;
  char name[32];
  LOOM_TRY_GOTO(
      st, loom_embedding_tp_new(&emb, o->vocab, o->d_model, o->context, tp, sp),
      fail);
  LOOM_TRY_GOTO(st, loom_sequential_add(seq, "emb", emb), fail);
  if (o->dropout > 0.0f) {
    loom_module *drop = NULL;
    LOOM_TRY_GOTO(st, loom_dropout_new(&drop, o->dropout), fail);
    if (sp)
      loom_dropout_set_sp(drop, tp);
    LOOM_TRY_GOTO(st, loom_sequential_add(seq, "drop", drop), fail);
  }
  for (int l = 0; l < o->n_layer;) {
    if (o->checkpoint_every > 0) { /* blocks l .. l+K-1 in one segment */
      ADD("", gpt_segment(&kid_, o, l));
      l += o->checkpoint_every;
      continue;
    }
    snprintf(name, sizeof name, "blocks.%d", l);
    ADD(name, loom_transformer_block_tp_new(&kid_, o->d_model, o->n_head,
                                            o->mlp_ratio, o->bias, o->dropout,
                                            tp, sp));
    l++;
  }
  ADD("ln_f", loom_layernorm_new(&kid_, o->d_model, o->bias));
  /* The output layer reads the token embedding (V,C): logits = x @ tok^T
   * (with tensor parallelism this rank's rows: its part of the logits). */
  loom_module *head = NULL;
  LOOM_TRY_GOTO(st, loom_linear_tied_new(&head, emb, 0), fail);
  loom_linear_set_tp_col(head, tp, sp);
  LOOM_TRY_GOTO(st, loom_sequential_add(seq, "head", head), fail);
  return loom_model_new(out, seq, &mopts);
fail:
  loom_module_free(seq);
  return st;
}
