/* NULL arguments to the public entry points of core, nn, data, parallel,
 * optim, ckpt and obs: each
 * status-returning call says LOOM_ERR_INVALID_ARG naming itself, getters
 * return 0 or NULL, setters do nothing; nothing crashes. One row a call. */
#include <stdint.h>
#include <string.h>

#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/kernels.h"
#include "loom/nn.h"
#include "loom/obs.h"
#include "loom/optim.h"
#include "loom/parallel.h"
#include "loom/train.h"
#include "tt.h"

static loom_module *lin(void) {
  loom_module *m = NULL;
  if (loom_linear_new(&m, 2, 2, true) != LOOM_OK)
    abort();
  return m;
}

static loom_status c_model_new(void) {
  return loom_model_new(NULL, lin(), NULL); /* root freed on failure */
}
static loom_status c_model_new_root(void) {
  loom_model *m = (loom_model *)1;
  return loom_model_new(&m, NULL, NULL);
}
static loom_status c_fashion_mlp(void) {
  return loom_fashion_mlp_new(NULL, NULL, NULL);
}
static loom_status c_fashion_cnn(void) {
  return loom_fashion_cnn_new(NULL, NULL, NULL);
}
static loom_status c_gpt(void) { return loom_gpt_new(NULL, NULL, NULL); }
static loom_status c_xent_new(void) { return loom_xent_new(NULL); }
static loom_status c_linear(void) { return loom_linear_new(NULL, 2, 2, true); }
static loom_status c_linear_tied(void) {
  return loom_linear_tied_new(NULL, NULL, 0);
}
static loom_status c_conv2d(void) {
  return loom_conv2d_new(NULL, 1, 1, 3, 1, 0, true);
}
static loom_status c_maxpool(void) { return loom_maxpool2d_new(NULL, 2, 2); }
static loom_status c_relu(void) { return loom_relu_new(NULL); }
static loom_status c_gelu(void) { return loom_gelu_new(NULL); }
static loom_status c_layernorm(void) {
  return loom_layernorm_new(NULL, 4, true);
}
static loom_status c_embedding(void) {
  return loom_embedding_new(NULL, 5, 4, 0);
}
static loom_status c_attention(void) {
  return loom_attention_new(NULL, 8, 2, true);
}
static loom_status c_mlp(void) { return loom_mlp_new(NULL, 8, 16, true, 0); }
static loom_status c_block(void) {
  return loom_transformer_block_new(NULL, 8, 2, 4, true, 0);
}
static loom_status c_dropout(void) { return loom_dropout_new(NULL, 0.1f); }
static loom_status c_flatten(void) { return loom_flatten_new(NULL); }
static loom_status c_act(void) { return loom_act_new(NULL, LOOM_ACT_RELU); }
static loom_status c_sequential(void) { return loom_sequential_new(NULL); }
static loom_status c_residual(void) { return loom_residual_new(NULL, lin()); }
static loom_status c_checkpoint(void) {
  return loom_checkpoint_new(NULL, lin());
}
static loom_status c_seq_add(void) {
  return loom_sequential_add(NULL, "x", lin());
}
static loom_status c_xent_forward(void) {
  return loom_xent_forward(NULL, NULL, NULL, NULL);
}
static loom_status c_xent_backward(void) {
  return loom_xent_backward(NULL, NULL, 1.0f);
}
static loom_status c_forward(void) {
  return loom_model_forward(NULL, NULL, NULL);
}
static loom_status c_backward(void) {
  return loom_model_backward(NULL, NULL, NULL);
}
static loom_status c_output_grad(void) {
  loom_tensor t;
  return loom_model_output_grad(NULL, &t);
}
static loom_status c_find(void) {
  int i;
  return loom_model_find(NULL, "w", &i);
}
static loom_status c_plan(void) {
  loom_shape s = loom_shape_make(LOOM_F32, 1, (int64_t[]){2});
  return loom_model_plan(NULL, &s);
}
static loom_status c_act_bytes(void) {
  loom_shape s = loom_shape_make(LOOM_F32, 1, (int64_t[]){2});
  size_t a, b;
  return loom_model_act_bytes(NULL, &s, &a, &b);
}
static loom_status c_init_params(void) {
  return loom_model_init_params(NULL, NULL);
}
static loom_status c_init_view(void) { return loom_model_init_view(NULL, 0); }
static loom_status c_draw_view(void) {
  float f[4];
  return loom_model_draw_view(NULL, 0, f);
}
static loom_status c_set_precision(void) {
  return loom_model_set_precision(NULL, LOOM_BF16);
}
static loom_status c_refresh_half(void) {
  return loom_model_refresh_half(NULL, NULL, 0);
}
static loom_status c_unit_range(void) {
  return loom_model_set_unit_range(NULL, 0, 1);
}
static loom_status c_tensor_new(void) {
  return loom_tensor_new(NULL, LOOM_F32, 1, (int64_t[]){2});
}
static loom_status c_tensor_shape(void) {
  loom_tensor t;
  return loom_tensor_new(&t, LOOM_F32, 1, NULL);
}
static loom_status c_tensor_reshape(void) {
  loom_tensor t;
  return loom_tensor_reshape(NULL, 1, (int64_t[]){2}, &t);
}
static loom_status c_tail_parse(void) { return loom_tail_parse("drop", NULL); }
static loom_status c_split_parse(void) {
  return loom_split_parse("train", NULL);
}
/* Every enum's *_parse: a NULL out is an error naming it (it wrote through
 * NULL in eight of them), a NULL name an unknown one. */
static loom_status c_redop_parse(void) { return loom_redop_parse("sum", NULL); }
static loom_status c_dtype_parse(void) { return loom_dtype_parse("f32", NULL); }
/* parallel: a NULL ddp (loom_ddp_step and loom_ddp_zero_grad crashed). */
static loom_status c_ddp_step(void) { return loom_ddp_step(NULL, NULL, 0.1f); }
static loom_status c_ddp_zero_grad(void) { return loom_ddp_zero_grad(NULL); }
static loom_status c_ddp_wait(void) { return loom_ddp_wait(NULL); }
static loom_status c_ddp_wait_bucket(void) {
  return loom_ddp_wait_bucket(NULL, 0);
}
static loom_status c_ddp_finish(void) { return loom_ddp_finish_backward(NULL); }
static loom_status c_ddp_bucket(void) {
  return loom_ddp_bucket(NULL, 0, NULL, NULL, NULL);
}
static loom_status c_ddp_shard_begin(void) {
  return loom_ddp_shard_begin(NULL, 0);
}
static loom_status c_ddp_join(void) {
  bool done;
  return loom_ddp_join(NULL, &done);
}
static loom_status c_ddp_sum_post(void) {
  double v = 1;
  return loom_ddp_sum_post(NULL, &v, 1);
}
static loom_status c_ddp_sum_wait(void) {
  double v;
  return loom_ddp_sum_wait(NULL, &v);
}
static loom_status c_ddp_grad_sumsq(void) {
  double v;
  return loom_ddp_grad_sumsq(NULL, &v);
}
/* optim: a NULL optimizer was named as a negative step. */
static loom_status c_optim_set_step(void) {
  return loom_optim_set_step(NULL, 3);
}
static loom_status c_optim_new(void) {
  return loom_optim_new(NULL, NULL, NULL, 0, 4);
}
/* ckpt: read_latest formatted "(null)/latest" and said LOOM_ERR_IO. */
static loom_status c_ckpt_read_latest(void) {
  int64_t st;
  return loom_ckpt_read_latest(NULL, &st);
}
static loom_status c_optim_parse(void) {
  return loom_optim_kind_parse("sgd", NULL);
}
static loom_status c_sched_parse(void) {
  return loom_sched_kind_parse("step", NULL);
}
static loom_status c_lr_rule_parse(void) {
  return loom_lr_rule_parse("none", NULL);
}
static loom_status c_init_parse(void) {
  return loom_init_scheme_parse("torch", NULL);
}
static loom_status c_damage_parse(void) {
  return loom_ckpt_damage_parse("flip", NULL);
}
static loom_status c_progress_parse(void) {
  return loom_progress_mode_parse("bar", NULL);
}
static loom_status c_gemm_parse(void) {
  return loom_gemm_backend_parse("naive", NULL);
}
static loom_status c_progress_null_name(void) {
  loom_progress_mode m;
  return loom_progress_mode_parse(NULL, &m);
}
static loom_status c_sampler_epoch(void) {
  return loom_sampler_set_epoch(NULL, 0);
}
static loom_status c_loader_seek(void) { return loom_loader_seek(NULL, 0, 0); }
static loom_status c_loader_state(void) {
  loom_loader_state st = {0, 0, 0};
  return loom_loader_set_state(NULL, &st);
}

static loom_status c_find_null_name(void) {
  loom_module *r = NULL;
  loom_model *m = NULL;
  loom_status st = loom_relu_new(&r);
  if (st == LOOM_OK)
    st = loom_model_new(&m, r, NULL);
  if (st != LOOM_OK)
    return LOOM_ERR_INTERNAL; /* not the error under test */
  int i;
  st = loom_model_find(m, NULL, &i);
  loom_model_free(m);
  return st;
}
static loom_status c_sampler_negative(void) {
  loom_sampler *s;
  return loom_sampler_new(&s, -5, NULL);
}
static loom_status c_trainer_null_cfg(void) {
  loom_trainer *t;
  return loom_trainer_new(&t, NULL, NULL);
}
static loom_status c_ckpt_open_null(void) {
  loom_ckpt *c;
  return loom_ckpt_open(&c, NULL, NULL);
}
static loom_status c_ckpt_open_empty(void) {
  loom_ckpt *c;
  return loom_ckpt_open(&c, "", NULL);
}
static loom_status c_trace_rank(void) {
  return loom_trace_start("/nonexistent-dir/rank-3.json", 3, 2);
}

static const struct {
  const char *name;
  loom_status (*call)(void);
  const char *says; /* in loom_last_error() */
} calls[] = {
    {"model_new", c_model_new, "loom_model_new"},
    {"model_new root", c_model_new_root, "no root"},
    {"fashion_mlp_new", c_fashion_mlp, "loom_fashion_mlp_new"},
    {"fashion_cnn_new", c_fashion_cnn, "loom_fashion_cnn_new"},
    {"gpt_new", c_gpt, "loom_gpt_new"},
    {"xent_new", c_xent_new, "loom_xent_new"},
    {"linear_new", c_linear, "loom_linear_new"},
    {"linear_tied_new", c_linear_tied, "loom_linear_tied_new"},
    {"conv2d_new", c_conv2d, "loom_conv2d_new"},
    {"maxpool2d_new", c_maxpool, "loom_maxpool2d_new"},
    {"relu_new", c_relu, "loom_relu_new"},
    {"gelu_new", c_gelu, "loom_gelu_new"},
    {"layernorm_new", c_layernorm, "loom_layernorm_new"},
    {"embedding_new", c_embedding, "loom_embedding_new"},
    {"attention_new", c_attention, "loom_attention_new"},
    {"mlp_new", c_mlp, "loom_mlp_new"},
    {"transformer_block_new", c_block, "loom_transformer_block_new"},
    {"dropout_new", c_dropout, "loom_dropout_new"},
    {"flatten_new", c_flatten, "loom_flatten_new"},
    {"act_new", c_act, "loom_act_new"},
    {"sequential_new", c_sequential, "loom_sequential_new"},
    {"residual_new", c_residual, "loom_residual_new"},
    {"checkpoint_new", c_checkpoint, "loom_checkpoint_new"},
    {"sequential_add", c_seq_add, "not a sequential"},
    {"xent_forward", c_xent_forward, "loom_xent_forward"},
    {"xent_backward", c_xent_backward, "loom_xent_backward"},
    {"model_forward", c_forward, "loom_model_forward"},
    {"model_backward", c_backward, "loom_model_backward"},
    {"model_output_grad", c_output_grad, "loom_model_output_grad"},
    {"model_find", c_find, "loom_model_find"},
    {"model_find NULL name", c_find_null_name, "loom_model_find: name is NULL"},
    {"sampler_new -5", c_sampler_negative, "a negative number of samples (-5)"},
    {"trainer_new NULL cfg", c_trainer_null_cfg,
     "loom_trainer_new: cfg is NULL"},
    {"ckpt_open NULL dir", c_ckpt_open_null, "loom_ckpt_open: dir is NULL"},
    {"ckpt_open empty dir", c_ckpt_open_empty, "loom_ckpt_open: dir is empty"},
    {"trace_start rank 3 of 2", c_trace_rank, "rank 3 of a world of 2"},
    {"model_plan", c_plan, "loom_model_plan"},
    {"model_act_bytes", c_act_bytes, "loom_model_act_bytes"},
    {"model_init_params", c_init_params, "loom_model_init_params"},
    {"model_init_view", c_init_view, "loom_model_init_view"},
    {"model_draw_view", c_draw_view, "loom_model_draw_view"},
    {"model_set_precision", c_set_precision, "loom_model_set_precision"},
    {"model_refresh_half", c_refresh_half, "loom_model_refresh_half"},
    {"model_set_unit_range", c_unit_range, "loom_model_set_unit_range"},
    {"tensor_new", c_tensor_new, "loom_tensor_new"},
    {"tensor_new shape", c_tensor_shape, "NULL shape"},
    {"tensor_reshape", c_tensor_reshape, "loom_tensor_reshape"},
    {"tail_parse", c_tail_parse, "loom_tail_parse"},
    {"split_parse", c_split_parse, "loom_split_parse"},
    {"redop_parse", c_redop_parse, "loom_redop_parse"},
    {"dtype_parse", c_dtype_parse, "loom_dtype_parse"},
    {"optim_kind_parse", c_optim_parse, "loom_optim_kind_parse"},
    {"sched_kind_parse", c_sched_parse, "loom_sched_kind_parse"},
    {"lr_rule_parse", c_lr_rule_parse, "loom_lr_rule_parse"},
    {"init_scheme_parse", c_init_parse, "loom_init_scheme_parse"},
    {"ckpt_damage_parse", c_damage_parse, "loom_ckpt_damage_parse"},
    {"progress_mode_parse", c_progress_parse, "loom_progress_mode_parse"},
    {"gemm_backend_parse", c_gemm_parse, "loom_gemm_backend_parse"},
    {"progress_mode_parse name", c_progress_null_name,
     "unknown progress mode '(null)' (expected auto, bar, lines or off)"},
    {"sampler_set_epoch", c_sampler_epoch, "loom_sampler_set_epoch"},
    {"loader_seek", c_loader_seek, "loom_loader_seek"},
    {"loader_set_state", c_loader_state, "loom_loader_set_state"},
    {"optim_set_step", c_optim_set_step, "loom_optim_set_step"},
    {"optim_new", c_optim_new, "loom_optim_new"},
    {"ckpt_read_latest", c_ckpt_read_latest, "loom_ckpt_read_latest"},
    {"ddp_step", c_ddp_step, "loom_ddp_step"},
    {"ddp_zero_grad", c_ddp_zero_grad, "loom_ddp_zero_grad"},
    {"ddp_wait", c_ddp_wait, "loom_ddp_wait"},
    {"ddp_wait_bucket", c_ddp_wait_bucket, "loom_ddp_wait_bucket"},
    {"ddp_finish_backward", c_ddp_finish, "loom_ddp_finish_backward"},
    {"ddp_bucket", c_ddp_bucket, "loom_ddp_bucket"},
    {"ddp_shard_begin", c_ddp_shard_begin, "loom_ddp_shard_begin"},
    {"ddp_join", c_ddp_join, "loom_ddp_join"},
    {"ddp_sum_post", c_ddp_sum_post, "loom_ddp_sum_post"},
    {"ddp_sum_wait", c_ddp_sum_wait, "loom_ddp_sum_wait"},
    {"ddp_grad_sumsq", c_ddp_grad_sumsq, "loom_ddp_grad_sumsq"},
};

TT_TEST(test_null_status_calls) {
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    loom_clear_error();
    loom_status st = calls[i].call();
    if (st != LOOM_ERR_INVALID_ARG ||
        !strstr(loom_last_error(), calls[i].says)) {
      TT_CHECK_EQ(st, LOOM_ERR_INVALID_ARG);
      fprintf(stderr, "  %s: '%s', expected '%s' in it\n", calls[i].name,
              loom_last_error(), calls[i].says);
      TT_CHECK(false);
    }
  }
}

TT_TEST(test_null_getters) {
  const loom_model *m = NULL;
  TT_CHECK(loom_model_params(NULL) == NULL);
  TT_CHECK(loom_model_grads(NULL) == NULL);
  TT_CHECK_EQ(loom_model_num_params(m), 0);
  TT_CHECK_EQ(loom_model_num_views(m), 0);
  TT_CHECK(loom_model_view(m, 0) == NULL);
  TT_CHECK_EQ(loom_model_view_role(m, 0), LOOM_ROLE_WEIGHT);
  TT_CHECK_EQ(loom_model_layout_hash(m), 0);
  TT_CHECK(loom_model_root(NULL) == NULL);
  TT_CHECK(loom_model_get_opts(m) == NULL);
  int blocks = 0, n = 5;
  TT_CHECK_EQ(loom_model_view_tp(m, 0, &blocks), LOOM_TP_WHOLE);
  TT_CHECK_EQ(blocks, 1);
  TT_CHECK_EQ(loom_model_precision(m), LOOM_F32);
  TT_CHECK_EQ(loom_model_half_bytes(m), 0);
  TT_CHECK(loom_model_rounded_copy(NULL) == NULL);
  TT_CHECK(!loom_model_training(m));
  TT_CHECK_EQ(loom_model_arena_bytes(m), 0);
  TT_CHECK_EQ(loom_model_num_units(m), 0);
  TT_CHECK(loom_model_unit_ranges(m, 0, &n) == NULL);
  TT_CHECK_EQ(n, 0);
  TT_CHECK(loom_model_unit_name(m, 0) == NULL);
  loom_model_zero_grad(NULL);
  loom_model_bind_grads(NULL, NULL);
  loom_model_drop_own_grads(NULL);
  loom_model_bind_params(NULL, NULL);
  loom_model_params_updated(NULL);
  loom_model_bind_half(NULL, NULL);
  loom_model_set_training(NULL, false);
  loom_model_set_step(NULL, 1, 0);
  loom_model_set_grad_hook(NULL, NULL, NULL);
  loom_model_set_unit_hook(NULL, NULL, NULL);
  loom_model_set_unit_observer(NULL, NULL, NULL);
  TT_CHECK_EQ(loom_tensor_numel(NULL), 0);
  TT_CHECK_EQ(loom_tensor_bytes(NULL), 0);
  loom_tensor v = loom_tensor_view(NULL, LOOM_F32, 2, NULL);
  TT_CHECK_EQ(v.ndim, 0);
  /* data */
  TT_CHECK_EQ(loom_loader_batches_per_epoch(NULL), 0);
  TT_CHECK_EQ(loom_loader_sample(NULL), 0);
  TT_CHECK_EQ(loom_loader_epoch_batches(NULL, 0), 0);
  TT_CHECK_EQ(loom_loader_batch_first(NULL, 0, 0), 0);
  TT_CHECK_EQ(loom_loader_served(NULL), 0);
  TT_CHECK(loom_loader_wait_total(NULL) == 0.0);
  loom_loader_state st = {3, 4, 5};
  loom_loader_get_state(NULL, &st);
  TT_CHECK_EQ(st.epoch + st.batch + st.global_batch, 0);
  loom_dataset_info info;
  memset(&info, 0xff, sizeof info);
  loom_dataset_get_info(NULL, &info);
  TT_CHECK_EQ(info.len, 0);
  TT_CHECK(info.source == NULL);
  loom_dataset_get_info(NULL, NULL);
  TT_CHECK_EQ(loom_dataset_len(NULL), 0);
  /* optim: NULL options are the defaults; a NULL schedule's rate is 0 (it
   * crashed) */
  loom_optim *o = NULL;
  TT_CHECK_OK(loom_optim_new(&o, NULL, NULL, 0, 4));
  float p[4] = {1, 1, 1, 1}, g[4] = {1, 1, 1, 1};
  TT_CHECK_OK(loom_optim_step(o, p, g, 0.5f));
  TT_CHECK(p[0] == 0.5f && p[3] == 0.5f);
  loom_optim_free(o);
  TT_CHECK(loom_sched_lr(NULL, 3) == 0.0f);
  /* ckpt: NULL views with a count hashed out of bounds (it crashed) */
  TT_CHECK(loom_ckpt_layout_hash(NULL, 3) == loom_ckpt_layout_hash(NULL, 0));
  /* parallel */
  TT_CHECK_EQ(loom_ddp_rank(NULL), 0);
  TT_CHECK_EQ(loom_ddp_world(NULL), 0);
  TT_CHECK(loom_ddp_model(NULL) == NULL);
  TT_CHECK(loom_ddp_get_opts(NULL) == NULL);
  TT_CHECK_EQ(loom_ddp_num_buckets(NULL), 0);
  TT_CHECK(!loom_ddp_get_sync(NULL));
  loom_ddp_set_sync(NULL, true);
  int first = 7, count = 7;
  loom_ddp_shards(NULL, &first, &count);
  TT_CHECK_EQ(first + count, 0);
  loom_ddp_stats ds;
  memset(&ds, 0xff, sizeof ds);
  loom_ddp_get_stats(NULL, &ds);
  TT_CHECK_EQ(ds.buckets, 0);
  loom_ddp_reset_stats(NULL);
  size_t now = 1, peak = 1;
  loom_ddp_grad_resident(NULL, &now, &peak);
  TT_CHECK_EQ(now + peak, 0);
  TT_CHECK(loom_ddp_hidden_share(NULL) == 1.0);
}

int main(void) {
  TT_RUN(test_null_status_calls);
  TT_RUN(test_null_getters);
  return tt_finish();
}
