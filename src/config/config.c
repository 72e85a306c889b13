/* The training configuration: the schema table and everything it drives
 * (YAML loading, --set overrides, validation, canonical text, hash, docs). */
#include "loom/config.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* ------------------------------------------------------------ name tables */

#define LOOM_X_NAME(name, text) text,
const char *const loom_cfg_model_names[] = {LOOM_CFG_MODEL_LIST(LOOM_X_NAME)};
const char *const loom_cfg_dataset_names[] = {
    LOOM_CFG_DATASET_LIST(LOOM_X_NAME)};
const char *const loom_cfg_precision_names[] = {
    LOOM_CFG_PRECISION_LIST(LOOM_X_NAME)};
const char *const loom_cfg_on_error_names[] = {
    LOOM_CFG_ON_ERROR_LIST(LOOM_X_NAME)};
const char *const loom_progress_mode_names[] = {
    LOOM_PROGRESS_MODE_LIST(LOOM_X_NAME)};
const char *const loom_cfg_strategy_names[] = {
    LOOM_CFG_STRATEGY_LIST(LOOM_X_NAME)};
const char *const loom_cfg_compress_names[] = {
    LOOM_CFG_COMPRESS_LIST(LOOM_X_NAME)};
const char *const loom_cfg_pp_schedule_names[] = {
    LOOM_CFG_PP_SCHEDULE_LIST(LOOM_X_NAME)};
static const char *const type_names[] = {LOOM_CFG_TYPE_LIST(LOOM_X_NAME)};
#undef LOOM_X_NAME

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(COUNT_OF(loom_cfg_model_names) == LOOM_CFG_MODEL_COUNT, "");
_Static_assert(COUNT_OF(loom_cfg_dataset_names) == LOOM_CFG_DATASET_COUNT, "");
_Static_assert(COUNT_OF(loom_cfg_precision_names) == LOOM_CFG_PRECISION_COUNT,
               "");
_Static_assert(COUNT_OF(loom_cfg_on_error_names) == LOOM_CFG_ON_ERROR_COUNT,
               "");
_Static_assert(COUNT_OF(loom_progress_mode_names) == LOOM_PROGRESS_MODE_COUNT,
               "");
_Static_assert(COUNT_OF(loom_cfg_strategy_names) == LOOM_CFG_STRATEGY_COUNT,
               "");
_Static_assert(COUNT_OF(loom_cfg_compress_names) == LOOM_CFG_COMPRESS_COUNT,
               "");
_Static_assert(COUNT_OF(loom_cfg_pp_schedule_names) ==
                   LOOM_CFG_PP_SCHEDULE_COUNT,
               "");
_Static_assert(COUNT_OF(type_names) == LOOM_CFG_TYPE_COUNT, "");
/* Enum fields are read and written as int. */
_Static_assert(sizeof(loom_cfg_model) == sizeof(int) &&
                   sizeof(loom_cfg_strategy) == sizeof(int) &&
                   sizeof(loom_cfg_pp_schedule) == sizeof(int) &&
                   sizeof(loom_progress_mode) == sizeof(int) &&
                   sizeof(loom_act) == sizeof(int) &&
                   sizeof(loom_tail) == sizeof(int) &&
                   sizeof(loom_optim_kind) == sizeof(int) &&
                   sizeof(loom_sched_kind) == sizeof(int) &&
                   sizeof(loom_lr_rule) == sizeof(int),
               "enum fields must be int-sized");

const char *loom_cfg_type_name(loom_cfg_type t) {
  return (unsigned)t < LOOM_CFG_TYPE_COUNT ? type_names[t] : "?";
}

/* ----------------------------------------------------------------- schema */

#define OFF(field) offsetof(loom_config, field)
#define NOMAX INFINITY
#define MAX_SEED 9007199254740991.0 /* 2^53 - 1: exact in JSON and doubles */
#define ENUMV(tab) tab, (int)COUNT_OF(tab)

#define KINT(p, f, d, lo, hi, fl, h)                                           \
  { p, LOOM_CFG_INT, OFF(f), d, lo, hi, 0, NULL, 0, fl, h, 0, NULL }
#define KFLOAT(p, f, d, lo, hi, fl, h)                                         \
  { p, LOOM_CFG_FLOAT, OFF(f), d, lo, hi, 0, NULL, 0, fl, h, 0, NULL }
#define KBOOL(p, f, d, fl, h)                                                  \
  { p, LOOM_CFG_BOOL, OFF(f), d, 0, 0, 0, NULL, 0, fl, h, 0, NULL }
#define KSTR(p, f, d, fl, h)                                                   \
  { p, LOOM_CFG_STRING, OFF(f), d, 0, 0, 0, NULL, 0, fl, h, 0, NULL }
#define KENUM(p, f, d, tab, fl, h)                                             \
  { p, LOOM_CFG_ENUM, OFF(f), d, 0, 0, 0, ENUMV(tab), fl, h, 0, NULL }
#define KLIST(p, f, d, lo, hi, lmin, fl, h)                                    \
  { p, LOOM_CFG_INT_LIST, OFF(f), d, lo, hi, lmin, NULL, 0, fl, h, 0, NULL }
/* Enum values (a mask) or whole keys (flag TD: the default only) that this
 * build does not implement yet: errors at check time, named in the docs.
 * Their issues turn them into working options. */
#define BIT(v) (1u << (v))
#define KENUM_TODO(p, f, d, tab, fl, h, mask, why)                             \
  { p, LOOM_CFG_ENUM, OFF(f), d, 0, 0, 0, ENUMV(tab), fl, h, mask, why }
#define KINT_TODO(p, f, d, lo, hi, fl, h, why)                                 \
  { p, LOOM_CFG_INT, OFF(f), d, lo, hi, 0, NULL, 0, (fl) | TD, h, 0, why }
#define KFLOAT_TODO(p, f, d, lo, hi, fl, h, why)                               \
  { p, LOOM_CFG_FLOAT, OFF(f), d, lo, hi, 0, NULL, 0, (fl) | TD, h, 0, why }
#define KBOOL_TODO(p, f, d, fl, h, why)                                        \
  { p, LOOM_CFG_BOOL, OFF(f), d, 0, 0, 0, NULL, 0, (fl) | TD, h, 0, why }

enum {
  MO = LOOM_CFG_MAX_OPEN,
  MI = LOOM_CFG_MIN_OPEN,
  LO = LOOM_CFG_LOCAL,
  TD = LOOM_CFG_TODO,
  AU = LOOM_CFG_AUTO
};

static const loom_config_key keys[] = {
    /* model */
    KENUM("model.name", model.name, "mlp", loom_cfg_model_names, 0,
          "architecture: mlp (fully connected), cnn (conv + max-pool stages, "
          "then one linear layer) or gpt (decoder-only transformer)"),
    KLIST("model.hidden", model.hidden, "[512, 512]", 1, 1048576, 0, 0,
          "mlp: widths of the hidden layers, in order ([] = one linear layer)"),
    KENUM("model.activation", model.activation, "relu", loom_act_names, 0,
          "mlp, cnn: activation after each hidden layer or conv"),
    KLIST("model.channels", model.channels, "[32, 64]", 1, 65536, 1, 0,
          "cnn: output channels of each conv; each conv is followed by the "
          "activation and a max-pool; as many convs as the 28x28 image "
          "holds"),
    KINT("model.kernel", model.kernel, "5", 1, 15, 0,
         "cnn: conv kernel size (square, stride 1, no padding)"),
    KINT("model.pool", model.pool, "2", 1, 8, 0,
         "cnn: max-pool window and stride"),
    KINT("model.context", model.context, "128", 1, 1048576, 0,
         "gpt: context length T, tokens per sequence"),
    KINT("model.layers", model.layers, "4", 1, 1024, 0,
         "gpt: transformer blocks L"),
    KINT("model.d_model", model.d_model, "128", 1, 1048576, 0,
         "gpt: channels C"),
    KINT("model.heads", model.heads, "4", 1, 4096, 0,
         "gpt: attention heads NH; must divide model.d_model"),
    KINT("model.vocab", model.vocab, "256", 2, 16777216, 0,
         "gpt: vocabulary size V (256 for bytes); the output layer is tied to "
         "the token embedding"),
    KINT("model.mlp_ratio", model.mlp_ratio, "4", 1, 64, 0,
         "gpt: width of the MLP in multiples of model.d_model"),
    KFLOAT("model.dropout", model.dropout, "0", 0, 1, MO,
           "gpt: dropout probability (0 = none)"),
    KFLOAT("model.init_std", model.init_std, "0.02", 0, 1, MI,
           "gpt: standard deviation of the N(0, std) weight initialisation"),
    /* data */
    KENUM("data.dataset", data.dataset, "fashion-mnist", loom_cfg_dataset_names,
          0,
          "fashion-mnist (images, Debian package dataset-fashion-mnist), kjv "
          "(bytes of the King James Bible, prepared by 'loom data') or bin "
          "(token shard in llm.c's .bin layout)"),
    KSTR("data.path", data.path, "\"\"", LO,
         "fashion-mnist: its directory; kjv: a text file (any bytes; it must "
         "exist); bin: the training .bin file. Empty: where the data set is "
         "installed (fashion-mnist) or prepared by 'loom data' (kjv, "
         "$LOOM_DATA_DIR/kjv.txt, made on first use)"),
    KSTR("data.val_path", data.val_path, "\"\"", LO,
         "bin: the validation .bin file (required with bin)"),
    KFLOAT("data.val_fraction", data.val_fraction, "0.1", 0, 1, MI | MO,
           "kjv: share of the bytes held out at the end for validation "
           "(fashion-mnist uses its test set, bin data.val_path)"),
    KBOOL("data.shuffle", data.shuffle, "true", 0,
          "shuffle the training samples every epoch (counter-based: the same "
          "order at any world size)"),
    KENUM("data.tail", data.tail, "partial", loom_tail_names, 0,
          "samples that do not fill the last batch of an epoch: drop (left "
          "out), pad (completed from the epoch's start) or partial (a short "
          "batch)"),
    KINT("data.prefetch", data.prefetch, "2", 0, 64, LO,
         "batches the loader thread prepares ahead; 0 = load in the training "
         "thread"),
    /* optim */
    KENUM("optim.name", optim.name, "sgd", loom_optim_kind_names, 0,
          "optimizer: sgd or adamw"),
    KFLOAT("optim.lr", optim.lr, "0.01", 0, 1000, MI,
           "learning rate (the peak, reached at the end of warmup)"),
    KFLOAT("optim.momentum", optim.momentum, "0", 0, 1, MO,
           "sgd: momentum (0 = none)"),
    KBOOL("optim.nesterov", optim.nesterov, "false", 0,
          "sgd: Nesterov momentum (needs optim.momentum > 0)"),
    KFLOAT("optim.weight_decay", optim.weight_decay, "0", 0, 1000, 0,
           "sgd: L2 term added to the gradient; adamw: decoupled decay. Not "
           "applied to biases and norm weights"),
    KFLOAT("optim.beta1", optim.beta1, "0.9", 0, 1, MO,
           "adamw: decay rate of the first moment"),
    KFLOAT("optim.beta2", optim.beta2, "0.999", 0, 1, MO,
           "adamw: decay rate of the second moment"),
    KFLOAT("optim.eps", optim.eps, "1e-08", 0, 1, MI,
           "adamw: added to the square root of the second moment"),
    KFLOAT("optim.grad_clip", optim.grad_clip, "0", 0, NOMAX, 0,
           "clip gradients to this global L2 norm; 0 = no clipping"),
    /* schedule */
    KENUM("schedule.name", schedule.name, "constant", loom_sched_kind_names, 0,
          "learning-rate schedule after warmup: constant, step (x gamma every "
          "step_size steps), cosine or linear (down to min_lr at the end of "
          "the run)"),
    KINT("schedule.warmup_steps", schedule.warmup_steps, "0", 0, NOMAX, 0,
         "steps of linear warmup, from lr/warmup_steps up to lr"),
    KFLOAT("schedule.min_lr", schedule.min_lr, "0", 0, 1000, 0,
           "cosine, linear: the rate reached at the end of the run, one step "
           "after the last (as PyTorch's CosineAnnealingLR with T_max = the "
           "run's steps)"),
    KINT("schedule.step_size", schedule.step_size, "1000", 1, NOMAX, 0,
         "step: optimizer steps between decays"),
    KFLOAT("schedule.gamma", schedule.gamma, "0.1", 0, 1, MI,
           "step: factor applied at each decay"),
    KENUM("schedule.scaling", schedule.scaling, "none", loom_lr_rule_names, 0,
          "scale optim.lr and schedule.min_lr with the global batch: none, "
          "linear (x global batch / train.batch_size: ranks x accumulate, or "
          "virtual_shards x accumulate with parallel.deterministic, on 1 "
          "rank too) or sqrt (x its square root)"),
    /* train */
    KINT("train.epochs", train.epochs, "1", 0, 1000000000, 0,
         "passes over the training set; 0 = no limit (train.steps must then "
         "be set). Not given while train.steps is: 0"),
    KINT("train.steps", train.steps, "0", 0, NOMAX, 0,
         "optimizer steps; 0 = no limit. With both limits set, training "
         "stops at the first one reached"),
    KINT("train.batch_size", train.batch_size, "32", 1, 16777216, AU,
         "samples per micro-batch on each rank (the global batch is "
         "batch_size x accumulate x world size; with "
         "parallel.deterministic, the rows of one virtual shard and the "
         "global batch batch_size x accumulate x parallel.virtual_shards), "
         "or auto: the largest that "
         "fits in memory, found by loom train before it starts (alone: "
         "real trial steps as --find-batch-size; under loom run or MPI: "
         "loom estimate's answer for 80% of the host's memory shared by its "
         "ranks)"),
    KINT("train.accumulate", train.accumulate, "1", 1, 65536, 0,
         "micro-batches per optimizer step (gradient accumulation)"),
    KINT("train.eval_every", train.eval_every, "0", 0, NOMAX, 0,
         "evaluate every N optimizer steps; 0 = at the end of each epoch. "
         "Training always ends with an evaluation"),
    KINT("train.eval_batches", train.eval_batches, "0", 0, NOMAX, 0,
         "batches per periodic evaluation; 0 = the whole validation set (the "
         "final evaluation always uses all of it)"),
    KINT("train.seed", train.seed, "1234", 0, MAX_SEED, 0,
         "seed of every random draw: initialisation, shuffling, dropout"),
    KINT("train.threads", train.threads, "0", 0, 4096, LO,
         "compute threads per rank; 0 = LOOM_THREADS, else the cores this "
         "process may use"),
    KSTR("train.activation_checkpointing", train.activation_checkpointing,
         "\"none\"", LO,
         "gpt: keep only each segment's input from forward to backward and "
         "recompute the rest in backward (same gradients, bit for bit; "
         "less activation memory, about one more forward of time): none, "
         "blocks (every transformer block a segment) or every:K (K blocks "
         "a segment)"),
    KENUM("train.precision", train.precision, "f32", loom_cfg_precision_names,
          0,
          "arithmetic of forward and backward: f32, bf16 or f16 (models mlp, "
          "cnn and gpt: matmuls and convolutions of bf16 or f16 operands "
          "summed in f32, activations kept for them in that type; norms, "
          "softmax, the loss, gradients, reductions, master weights and "
          "optimizer f32; f16 with loss scaling, train.loss_scale; "
          "docs/precision.md)"),
    KSTR("train.loss_scale", train.loss_scale, "\"auto\"", 0,
         "loss scaling, for train.precision f16 (whose range ends at 65504): "
         "auto (dynamic with f16, none otherwise), dynamic (start at "
         "train.loss_scale_init, halve it and skip the step when a gradient "
         "holds an inf or NaN on any rank, double it after "
         "train.loss_scale_growth_interval good steps; a run whose scale "
         "would fall below the smallest normal f32 stops: diverged), a "
         "number from 1.2e-38 (that f32) to 1e38 (a static scale), or 0 "
         "(none); f32 and bf16 take auto or 0"),
    KFLOAT("train.loss_scale_init", train.loss_scale_init, "65536", FLT_MIN,
           1e38, 0,
           "dynamic loss scaling: the first scale (at least the smallest "
           "normal f32, whose reciprocal unscales the gradients)"),
    KINT("train.loss_scale_growth_interval", train.loss_scale_growth_interval,
         "2000", 1, 1000000000, 0,
         "dynamic loss scaling: good steps in a row (no inf or NaN) before "
         "the scale doubles"),
    /* checkpoint */
    KBOOL("checkpoint.enabled", checkpoint.enabled, "true", 0,
          "write checkpoints (false still resumes from those there: see "
          "--resume)"),
    KSTR("checkpoint.dir", checkpoint.dir, "\"\"", LO,
         "directory of the checkpoints; empty: <log.run_dir>/ckpt"),
    KINT("checkpoint.every", checkpoint.every, "0", 0, NOMAX, 0,
         "save every N optimizer steps; 0 = only at the end (a run always "
         "saves at its end when checkpoints are enabled)"),
    KINT("checkpoint.keep", checkpoint.keep, "3", 0, 1000000, LO,
         "checkpoints kept, the newest; older ones are deleted only after a "
         "new one is complete. 0 = keep all"),
    KBOOL("checkpoint.async", checkpoint.async, "false", 0,
          "copy the state to memory at the step and write it from a "
          "background thread while training goes on"),
    KENUM("checkpoint.on_error", checkpoint.on_error, "stop",
          loom_cfg_on_error_names, 0,
          "when a save fails (disk full, ...): stop training with the error, "
          "or continue with a warning (the previous checkpoint stays intact "
          "either way)"),
    /* log */
    KSTR("log.run_dir", log.run_dir, "\"\"", LO,
         "directory of the run: metrics.jsonl, checkpoints. Empty: "
         "runs/<config file name without .yaml>"),
    KINT("log.every", log.every, "50", 1, NOMAX, 0,
         "optimizer steps between console lines and metric records"),
    KENUM("log.progress", log.progress, "auto", loom_progress_mode_names, LO,
          "console output: auto (a bar on a terminal, lines otherwise), bar, "
          "lines or off"),
    KBOOL("log.metrics", log.metrics, "true", LO,
          "write <log.run_dir>/metrics.jsonl (one JSON object per line)"),
    KBOOL("log.tensorboard", log.tensorboard, "false", LO,
          "also write every number of metrics.jsonl as a TensorBoard scalar "
          "into <log.run_dir>/tb/ (event files; tensorboard --logdir "
          "<log.run_dir>/tb)"),
    KBOOL("log.trace", log.trace, "false", LO,
          "write a timeline of every rank (Chrome/Perfetto trace events) "
          "into <log.run_dir>/trace/rank-K.json: data wait, forward and "
          "backward per top-level module, each collective on the "
          "communication thread with its bytes, the optimizer, evaluation, "
          "checkpoints, memory counters; loom report --trace RUN merges "
          "the ranks into one file (LOOM_TRACE=DIR does the same into DIR)"),
    KINT("log.trace_start", log.trace_start, "0", 0, NOMAX, LO,
         "the trace's first step (as the spans' step: the step that starts "
         "with that many done, metrics.jsonl's step - 1; a resumed run "
         "counts on from its checkpoint); before it nothing is recorded"),
    KINT("log.trace_steps", log.trace_steps, "0", 0, NOMAX, LO,
         "steps traced from log.trace_start (with the evaluation and "
         "checkpoint after each); 0 = to the end"),
    KINT("log.trace_every", log.trace_every, "0", 0, NOMAX, LO,
         "trace log.trace_steps steps again every N steps from "
         "log.trace_start (N > log.trace_steps); 0 = once"),
    KFLOAT("log.trace_max_mb", log.trace_max_mb, "1024", 0, NOMAX, LO,
           "each rank's trace file stops at this size (MiB): recording ends "
           "there with a loom_capped record and one warning, training goes "
           "on; 0 = no cap"),
    KBOOL("log.per_rank", log.per_rank, "false", LO,
          "every rank writes <log.run_dir>/logs/rank-K.log: its messages "
          "with time stamps (UTC, ms) and, every log.every steps, its own "
          "step time and its parts; the console keeps rank 0's messages "
          "and every rank's warnings and errors"),
    KSTR("log.mlflow.uri", log.mlflow_uri, "\"\"", LO,
         "an MLflow tracking server (http://HOST:PORT or https://...): rank "
         "0 logs the configuration as parameters, every number of "
         "metrics.jsonl as metrics by step, tags (ranks, strategy, host, git "
         "commit) and, at the end, config.yaml, env.json and report.html as "
         "artifacts; a server away never stops training (values are kept "
         "and sent again); empty: off"),
    KSTR("log.mlflow.experiment", log.mlflow_experiment, "\"loom\"", LO,
         "the MLflow experiment (made when missing)"),
    KSTR("log.mlflow.run_name", log.mlflow_run_name, "\"\"", LO,
         "the MLflow run's name; empty: the run directory's last part"),
    KBOOL_TODO("log.profile", log.profile, "false", 0,
               "an earlier name: the trace is log.trace",
               "it is called log.trace: set log.trace: true"),
    /* parallel */
    KENUM("parallel.strategy", parallel.strategy, "auto",
          loom_cfg_strategy_names, 0,
          "auto (none on one rank, ddp on more), none, ddp (data parallel), "
          "zero1 (ddp with the optimizer state sharded over the ranks), "
          "zero2 (also the gradients: each bucket reduced to the ranks "
          "that own it; PyTorch's SHARD_GRAD_OP), zero3 or fsdp (also the "
          "parameters, gathered unit by unit as forward and backward reach "
          "them; FULL_SHARD); with parallel.tp each runs over the replicas "
          "of a tensor-parallel rank's part (parallel.dp)"),
    KFLOAT("parallel.bucket_mb", parallel.bucket_mb, "25", 0, 4096, MI,
           "ddp: size of a gradient bucket in MiB"),
    KFLOAT("parallel.first_bucket_mb", parallel.first_bucket_mb, "1", 0, 4096,
           0,
           "ddp: size of the first bucket (the last gradients of "
           "backward) in MiB, so reduction starts early; 0 = bucket_mb"),
    KBOOL("parallel.deterministic", parallel.deterministic, "false", 0,
          "bitwise identical results at any world size: gradients summed "
          "over parallel.virtual_shards in one fixed tree"),
    KINT("parallel.virtual_shards", parallel.virtual_shards, "8", 1, 65536, 0,
         "deterministic: fixed shards of the global batch, a power of two; "
         "the world size (a power of two) must divide it"),
    KSTR("parallel.shard_unit", parallel.shard_unit, "\"blocks\"", 0,
         "zero3/fsdp without a pipeline: what is gathered at once: blocks "
         "(each unit of the model by itself: a transformer block, a layer; "
         "with activation "
         "checkpointing a checkpointed segment), every:K (K consecutive "
         "units together) or params:N (consecutive units together until "
         "each group holds N parameters; N may end in K, M or G for 1e3, "
         "1e6, 1e9). Larger units: fewer, longer gathers, more memory"),
    KENUM("parallel.compress", parallel.compress, "none",
          loom_cfg_compress_names, 0,
          "ddp: dtype of gradients in communication: none (f32), bf16 or "
          "f16; with parallel.pp, of each stage's sum over its replicas"),
    KINT("parallel.dp", parallel.dp, "auto", 1, 1048576, AU,
         "data-parallel replicas of the mesh dp x tp x pp (which must be "
         "the world size), or auto: the world size / (tp x pp)"),
    KINT("parallel.tp", parallel.tp, "1", 1, 4096, 0,
         "tensor-parallel ranks of the mesh (Megatron-style, model gpt): "
         "each rank of a group holds 1/tp of the token embedding and tied "
         "output layer (cut over the vocabulary, with a vocabulary-parallel "
         "cross-entropy), of each block's attention heads and of its MLP's "
         "hidden units; layer norms, the position embedding and the output "
         "projections' biases whole on every rank. tp must divide "
         "model.heads and model.vocab; one all-reduce a block forward and "
         "one backward for the attention, the same for the MLP. Ranks "
         "r..r+tp-1 form one group (the closest ranks), then pipeline "
         "stages (parallel.pp), then replicas (parallel.dp); "
         "parallel.strategy auto, ddp, zero1, zero2, zero3 or fsdp; any "
         "train.precision"),
    KBOOL("parallel.sequence_parallel", parallel.sequence_parallel, "false", 0,
          "with parallel.tp > 1 (model gpt): sequence parallelism "
          "(Korthikanti et al. 2022): between the tensor-parallel layers "
          "(the embedding's output, layer norms, dropout, residual sums) "
          "each rank of a group holds 1/tp of the micro-batch's tokens, so "
          "those activations take 1/tp of the memory; the output "
          "projections reduce-scatter and the qkv, first MLP and output "
          "layers all-gather instead of all-reducing (the same bytes; in "
          "bf16 and f16 the all-gathers carry the half values the matmuls "
          "take, half the bytes). tp must divide model.context; any "
          "train.precision; dropout masks do not depend on tp"),
    KBOOL("parallel.sequence_parallel_regather",
          parallel.sequence_parallel_regather, "false", 0,
          "with parallel.sequence_parallel: the qkv, first MLP and output "
          "layers all-gather their input again in backward instead of "
          "keeping the gathered copy (Megatron-LM's way): every activation "
          "of the sequence-parallel region takes 1/tp of the memory, for "
          "one more all-gather of a layer's input in backward; false sends "
          "the bytes of plain tp"),
    KINT("parallel.pp", parallel.pp, "1", 1, 4096, 0,
         "pipeline stages of the mesh: the model (gpt) cut into pp "
         "contiguous runs of its units (the embedding, each transformer "
         "block, the final norm, the output layer), one per rank; ranks "
         "r..r+pp-1 form one pipeline. With pp > 1, parallel.strategy "
         "auto or ddp sums each stage's gradient over its replicas, zero1 "
         "also shards its optimizer state over them, zero2 also keeps on "
         "each replica only the reduced gradient of its cut, zero3 or fsdp "
         "also only its cut of the parameters between steps (gathered "
         "whole once a step; docs/parallel.md)"),
    KINT("parallel.micro_batches", parallel.micro_batches, "1", 1, 65536, 0,
         "M: each rank's batch (train.batch_size rows, which M must divide) "
         "is cut into M micro-batches that flow through the pipeline one "
         "after another; the idle share of a stage is (pp-1)/(M+pp-1). On "
         "one stage: M micro-batches accumulated, the same arithmetic"),
    KENUM("parallel.pp_schedule", parallel.pp_schedule, "1f1b",
          loom_cfg_pp_schedule_names, 0,
          "pipeline schedule: gpipe (all forwards, then all backwards: "
          "activations of M micro-batches kept) or 1f1b (one forward, one "
          "backward in turn after a warm-up: at most pp - stage kept). The "
          "same results, bit for bit. With parallel.pp 1 (no pipeline) only "
          "1f1b"),
    KLIST("parallel.pp_split", parallel.pp_split, "[]", 1, 1048576, 0, 0,
          "units of each pipeline stage, in order (pp numbers that add up to "
          "the model's units: 1 embedding + the blocks, or checkpointed "
          "segments, + 1 final norm + 1 output layer, + 1 dropout when "
          "model.dropout > 0); [] = balanced by the estimated compute of "
          "each unit"),
};
#define NKEYS COUNT_OF(keys)

static const char *const sections[] = {"model",    "data",    "optim",
                                       "schedule", "train",   "checkpoint",
                                       "log",      "parallel"};
#define NSECTIONS COUNT_OF(sections)

const loom_config_key *loom_config_keys(size_t *count) {
  if (count)
    *count = NKEYS;
  return keys;
}

static int key_index(const char *path, size_t len) {
  for (size_t i = 0; i < NKEYS; i++)
    if (strlen(keys[i].path) == len && memcmp(keys[i].path, path, len) == 0)
      return (int)i;
  return -1;
}

const loom_config_key *loom_config_key_find(const char *path) {
  int i = path ? key_index(path, strlen(path)) : -1;
  return i < 0 ? NULL : &keys[i];
}

static int section_index(const char *name) {
  for (size_t i = 0; i < NSECTIONS; i++)
    if (strcmp(sections[i], name) == 0)
      return (int)i;
  return -1;
}

/* ------------------------------------------------------ closest key name */

static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 127 || lb > 127)
    return (size_t)-1 / 2;
  size_t prev[128], cur[128];
  for (size_t j = 0; j <= lb; j++)
    prev[j] = j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
      size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
  }
  return prev[lb];
}

static const char *leaf(const char *path) {
  const char *dot = strrchr(path, '.');
  return dot ? dot + 1 : path;
}

/* The known name nearest to `name`, or NULL when none is near enough. A key
 * put in the wrong section ("train.lr") finds its section by the leaf. */
static const char *closest(const char *name, const char *const *cands, size_t n,
                           size_t stride) {
  const char *best = NULL;
  size_t best_d = (size_t)-1;
  for (size_t i = 0; i < n; i++) {
    const char *c = *(const char *const *)((const char *)cands + i * stride);
    size_t d = edit_distance(name, c);
    size_t ln = strlen(name), lc = strlen(c);
    /* "training" for "train", "optim.lrr" for "optim.lr" */
    if ((ln < lc ? ln : lc) >= 3 && d > 1 &&
        strncmp(name, c, ln < lc ? ln : lc) == 0)
      d = 2;
    if (strchr(name, '.') && strcmp(leaf(name), leaf(c)) == 0 && d > 1)
      d = 1 + (d > 2); /* same key, other section: near, after typos */
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  size_t len = strlen(name);
  size_t limit = len / 4 > 2 ? len / 4 : 2;
  return best_d <= limit ? best : NULL;
}

/* -------------------------------------------------------------- messages */

/* Where a value came from: a file position, a --set argument, or the
 * defaults. Every message starts with it. */
typedef struct cfg_loc {
  const char *file;        /* config name, for file positions and defaults */
  const char *set;         /* the --set argument, when it came from one */
  unsigned long line, col; /* 1-based; 0 = no position */
} cfg_loc;

static loom_status cfg_err(const cfg_loc *loc, const char *key, const char *fmt,
                           ...) __attribute__((format(printf, 3, 4)));

static loom_status cfg_err(const cfg_loc *loc, const char *key, const char *fmt,
                           ...) {
  char prefix[1024] = "";
  size_t n = 0;
  if (loc && loc->set)
    n = (size_t)snprintf(prefix, sizeof prefix, "--set %s: ", loc->set);
  else if (loc && loc->file && loc->line)
    n = (size_t)snprintf(prefix, sizeof prefix, "%s:%lu:%lu: ", loc->file,
                         loc->line, loc->col);
  else if (loc && loc->file)
    n = (size_t)snprintf(prefix, sizeof prefix, "%s: ", loc->file);
  if (key && n < sizeof prefix)
    snprintf(prefix + n, sizeof prefix - n, "key '%s': ", key);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return loom_error(LOOM_ERR_CONFIG, "%s%s", prefix, msg);
}

/* Shortest decimal text that reads back as exactly v. */
static void fmt_double(char *buf, size_t n, double v) {
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(buf, n, "%.0f", v);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      return;
  }
}

/* "(must be in [0, 1))", "(must be >= 1)" */
static void fmt_range(char *buf, size_t n, const loom_config_key *k) {
  char lo[40], hi[40];
  fmt_double(lo, sizeof lo, k->min);
  if (isinf(k->max)) {
    snprintf(buf, n, "%s %s", (k->flags & LOOM_CFG_MIN_OPEN) ? ">" : ">=", lo);
    return;
  }
  fmt_double(hi, sizeof hi, k->max);
  snprintf(buf, n, "%s%s, %s%s", (k->flags & LOOM_CFG_MIN_OPEN) ? "(" : "[", lo,
           hi, (k->flags & LOOM_CFG_MAX_OPEN) ? ")" : "]");
}

static bool in_range(const loom_config_key *k, double v) {
  bool lo_ok = (k->flags & LOOM_CFG_MIN_OPEN) ? v > k->min : v >= k->min;
  bool hi_ok = (k->flags & LOOM_CFG_MAX_OPEN) ? v < k->max : v <= k->max;
  return lo_ok && hi_ok;
}

/* A nonzero value smaller than the smallest normal f32: the keys feed f32
 * arithmetic (the optimizer, the schedule, the kernels), where it acts as 0
 * (1e-46 as optim.eps made a run NaN; as optim.lr it trained nothing), so
 * it is refused like a value out of range. */
static bool below_f32(double v) { return v != 0 && fabs(v) < FLT_MIN; }
#define BELOW_F32_FMT                                                          \
  "%s is too small for the f32 arithmetic it feeds, which would take it as "   \
  "0 or a subnormal (nonzero values must be at least %g)"

/* ------------------------------------------------------ scalar conversion */

/* A scalar as the parser saw it: text, and whether it was quoted (a quoted
 * scalar is a string in YAML, never a number or a bool). */
typedef struct cfg_scalar {
  const char *s;
  size_t len;
  bool quoted;
  cfg_loc loc;
} cfg_scalar;

static bool scalar_is_null(const cfg_scalar *v) {
  if (v->quoted)
    return false;
  return v->len == 0 || strcmp(v->s, "~") == 0 || strcmp(v->s, "null") == 0 ||
         strcmp(v->s, "Null") == 0 || strcmp(v->s, "NULL") == 0;
}

/* Decimal integer with optional sign and '_' between digits. Values beyond
 * int64 set *overflow. */
static bool parse_int(const char *s, int64_t *out, bool *overflow) {
  const char *p = s;
  bool neg = false;
  if (*p == '+' || *p == '-')
    neg = *p++ == '-';
  if (*p < '0' || *p > '9')
    return false;
  uint64_t v = 0;
  *overflow = false;
  for (; *p; p++) {
    if (*p == '_' && p[1] >= '0' && p[1] <= '9' && p[-1] >= '0' && p[-1] <= '9')
      continue;
    if (*p < '0' || *p > '9')
      return false;
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      *overflow = true;
    else
      v = v * 10 + d;
  }
  if (v > (uint64_t)INT64_MAX)
    *overflow = true;
  *out = *overflow ? 0 : (neg ? -(int64_t)v : (int64_t)v);
  return true;
}

static bool parse_float(const char *s, double *out) {
  if (!*s || strchr(" \t\n", *s))
    return false;
  /* strtod also reads "nan", "inf" and hex; only finite decimals pass. */
  for (const char *p = s; *p; p++)
    if (!strchr("0123456789+-.eE", *p))
      return false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (*end || !isfinite(v))
    return false;
  *out = v;
  return true;
}

static int parse_enum(const loom_config_key *k, const char *s) {
  for (int i = 0; i < k->n_values; i++)
    if (strcmp(k->values[i], s) == 0)
      return i;
  return -1;
}

static void enum_list(const loom_config_key *k, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < k->n_values && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "",
                             k->values[i]);
}

/* Writes one scalar into the field of key k in cfg; for lists, `item` >= 0
 * stores it as item `item` of the list. */
static loom_status set_scalar(loom_config *cfg, const loom_config_key *k,
                              const cfg_scalar *v, int item) {
  char *field = (char *)cfg + k->offset;
  if (scalar_is_null(v) && k->type != LOOM_CFG_STRING)
    return cfg_err(&v->loc, k->path, "missing value");
  char itemtxt[32] = "";
  if (item >= 0)
    snprintf(itemtxt, sizeof itemtxt, "item %d: ", item + 1);
  switch (k->type) {
  case LOOM_CFG_INT:
  case LOOM_CFG_INT_LIST: {
    int64_t x;
    bool overflow;
    if ((k->flags & LOOM_CFG_AUTO) && k->type == LOOM_CFG_INT &&
        strcmp(v->s, "auto") == 0) {
      x = 0;
      memcpy(field, &x, sizeof x);
      return LOOM_OK;
    }
    if (v->quoted)
      return cfg_err(&v->loc, k->path,
                     "%sexpected an integer, got the quoted string \"%s\"",
                     itemtxt, v->s);
    if (!parse_int(v->s, &x, &overflow))
      return cfg_err(&v->loc, k->path, "%sexpected an integer%s, got '%s'",
                     itemtxt, k->flags & LOOM_CFG_AUTO ? " or auto" : "", v->s);
    if (overflow || !in_range(k, (double)x)) {
      char r[96];
      fmt_range(r, sizeof r, k);
      return cfg_err(&v->loc, k->path, "%s%s is out of range (must be %s%s)",
                     itemtxt, v->s, isinf(k->max) ? "" : "in ", r);
    }
    if (k->type == LOOM_CFG_INT) {
      memcpy(field, &x, sizeof x);
    } else {
      loom_config_ints *l = (loom_config_ints *)(void *)field;
      l->v[item] = x;
    }
    return LOOM_OK;
  }
  case LOOM_CFG_FLOAT: {
    double x;
    if (v->quoted)
      return cfg_err(&v->loc, k->path,
                     "expected a number, got the quoted string \"%s\"", v->s);
    if (!parse_float(v->s, &x))
      return cfg_err(&v->loc, k->path, "expected a number, got '%s'", v->s);
    if (!in_range(k, x)) {
      char r[96];
      fmt_range(r, sizeof r, k);
      return cfg_err(&v->loc, k->path, "%s is out of range (must be %s%s)",
                     v->s, isinf(k->max) ? "" : "in ", r);
    }
    if (below_f32(x))
      return cfg_err(&v->loc, k->path, BELOW_F32_FMT, v->s, (double)FLT_MIN);
    memcpy(field, &x, sizeof x);
    return LOOM_OK;
  }
  case LOOM_CFG_BOOL: {
    bool x;
    if (!v->quoted && (!strcmp(v->s, "true") || !strcmp(v->s, "True") ||
                       !strcmp(v->s, "TRUE")))
      x = true;
    else if (!v->quoted && (!strcmp(v->s, "false") || !strcmp(v->s, "False") ||
                            !strcmp(v->s, "FALSE")))
      x = false;
    else
      return cfg_err(&v->loc, k->path, "expected true or false, got %s%s%s",
                     v->quoted ? "\"" : "'", v->s, v->quoted ? "\"" : "'");
    memcpy(field, &x, sizeof x);
    return LOOM_OK;
  }
  case LOOM_CFG_STRING: {
    const char *s = scalar_is_null(v) ? "" : v->s;
    size_t len = scalar_is_null(v) ? 0 : v->len;
    if (len >= LOOM_CONFIG_STR_MAX)
      return cfg_err(&v->loc, k->path, "longer than %d bytes",
                     LOOM_CONFIG_STR_MAX - 1);
    if (memchr(s, '\0', len))
      return cfg_err(&v->loc, k->path, "contains a NUL byte");
    memset(field, 0, LOOM_CONFIG_STR_MAX);
    memcpy(field, s, len);
    return LOOM_OK;
  }
  case LOOM_CFG_ENUM: {
    int x = parse_enum(k, v->s);
    if (x < 0) {
      char list[256];
      enum_list(k, list, sizeof list);
      const char *sug =
          closest(v->s, k->values, (size_t)k->n_values, sizeof(const char *));
      if (sug)
        return cfg_err(&v->loc, k->path,
                       "expected one of %s, got '%s' (did you mean '%s'?)",
                       list, v->s, sug);
      return cfg_err(&v->loc, k->path, "expected one of %s, got '%s'", list,
                     v->s);
    }
    memcpy(field, &x, sizeof x);
    return LOOM_OK;
  }
  default:
    return loom_error(LOOM_ERR_INTERNAL, "config: key type %d", (int)k->type);
  }
}

/* A list value from scalars (a YAML sequence, or one scalar as a list of
 * one). */
static loom_status set_list(loom_config *cfg, const loom_config_key *k,
                            const cfg_scalar *items, int n,
                            const cfg_loc *loc) {
  if (n > LOOM_CONFIG_LIST_MAX)
    return cfg_err(loc, k->path, "at most %d items, got %d",
                   LOOM_CONFIG_LIST_MAX, n);
  if (n < k->list_min)
    return cfg_err(loc, k->path, "at least %d item%s, got %d", k->list_min,
                   k->list_min == 1 ? "" : "s", n);
  loom_config_ints *l = (loom_config_ints *)(void *)((char *)cfg + k->offset);
  loom_config_ints saved = *l;
  for (int i = 0; i < n; i++) {
    loom_status s = set_scalar(cfg, k, &items[i], i);
    if (s != LOOM_OK) {
      *l = saved;
      return s;
    }
  }
  l->n = n;
  for (int i = n; i < LOOM_CONFIG_LIST_MAX; i++)
    l->v[i] = 0;
  return LOOM_OK;
}

/* Defaults are YAML text too, read by the same rules; lists are written
 * "[a, b]" in the table. A bad default is a bug the schema test catches. */
static loom_status set_default(loom_config *cfg, const loom_config_key *k) {
  cfg_loc loc = {"(default)", NULL, 0, 0};
  if (k->type == LOOM_CFG_INT_LIST) {
    cfg_scalar items[LOOM_CONFIG_LIST_MAX];
    char buf[LOOM_CONFIG_LIST_MAX][24];
    int n = 0;
    const char *p = k->def;
    if (*p != '[')
      return cfg_err(&loc, k->path, "default '%s' is not a list", k->def);
    p++;
    while (*p && *p != ']') {
      while (*p == ' ' || *p == ',')
        p++;
      if (*p == ']')
        break;
      size_t len = strcspn(p, ", ]");
      if (n >= LOOM_CONFIG_LIST_MAX || len >= sizeof buf[0])
        return cfg_err(&loc, k->path, "default '%s' is too long", k->def);
      memcpy(buf[n], p, len);
      buf[n][len] = '\0';
      items[n] = (cfg_scalar){buf[n], len, false, loc};
      n++;
      p += len;
    }
    return set_list(cfg, k, items, n, &loc);
  }
  const char *s = k->def;
  size_t len = strlen(s);
  bool quoted = false;
  char buf[LOOM_CONFIG_STR_MAX];
  if (len >= 2 && s[0] == '"' && s[len - 1] == '"') {
    quoted = true;
    len -= 2;
    memcpy(buf, s + 1, len);
    buf[len] = '\0';
    s = buf;
  }
  cfg_scalar v = {s, len, quoted, loc};
  return set_scalar(cfg, k, &v, -1);
}

void loom_config_defaults(loom_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < NKEYS; i++)
    (void)set_default(cfg, &keys[i]);
}

/* --------------------------------------------------------- YAML documents */

/* Where each key was last set, for the messages of the cross-key checks. */
typedef struct cfg_origins {
  cfg_loc at[COUNT_OF(keys)];
  bool set[COUNT_OF(keys)];
} cfg_origins;

static cfg_loc node_loc(const char *file, const yaml_node_t *node) {
  cfg_loc l = {file, NULL, (unsigned long)node->start_mark.line + 1,
               (unsigned long)node->start_mark.column + 1};
  return l;
}

static cfg_scalar node_scalar(const char *file, const yaml_node_t *node) {
  cfg_scalar v;
  v.s = (const char *)node->data.scalar.value;
  v.len = node->data.scalar.length;
  v.quoted = node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
  v.loc = node_loc(file, node);
  return v;
}

static const char *node_kind(const yaml_node_t *node) {
  switch (node->type) {
  case YAML_SCALAR_NODE:
    return "a scalar";
  case YAML_SEQUENCE_NODE:
    return "a list";
  case YAML_MAPPING_NODE:
    return "a mapping";
  default:
    return "nothing";
  }
}

static const char *type_expect(const loom_config_key *k) {
  switch (k->type) {
  case LOOM_CFG_INT:
    return "an integer";
  case LOOM_CFG_FLOAT:
    return "a number";
  case LOOM_CFG_BOOL:
    return "true or false";
  case LOOM_CFG_STRING:
    return "a string";
  case LOOM_CFG_ENUM:
    return "a name";
  case LOOM_CFG_INT_LIST:
    return "a list of integers";
  default:
    return "a value";
  }
}

/* Stores a YAML node as the value of key k. */
static loom_status set_node(loom_config *cfg, const loom_config_key *k,
                            yaml_document_t *doc, yaml_node_t *node,
                            const char *file, const char *set) {
  cfg_loc loc = node_loc(file, node);
  loc.set = set;
  if (k->type == LOOM_CFG_INT_LIST && node->type == YAML_SEQUENCE_NODE) {
    cfg_scalar items[LOOM_CONFIG_LIST_MAX];
    int n =
        (int)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n > LOOM_CONFIG_LIST_MAX)
      return cfg_err(&loc, k->path, "at most %d items, got %d",
                     LOOM_CONFIG_LIST_MAX, n);
    for (int i = 0; i < n; i++) {
      yaml_node_t *it =
          yaml_document_get_node(doc, node->data.sequence.items.start[i]);
      if (!it || it->type != YAML_SCALAR_NODE) {
        cfg_loc il = it ? node_loc(file, it) : loc;
        il.set = set;
        return cfg_err(&il, k->path, "item %d: expected an integer, got %s",
                       i + 1, it ? node_kind(it) : "nothing");
      }
      items[i] = node_scalar(file, it);
      items[i].loc.set = set;
    }
    return set_list(cfg, k, items, n, &loc);
  }
  if (node->type != YAML_SCALAR_NODE)
    return cfg_err(&loc, k->path, "expected %s, got %s", type_expect(k),
                   node_kind(node));
  cfg_scalar v = node_scalar(file, node);
  v.loc.set = set;
  if (k->type == LOOM_CFG_INT_LIST)
    return set_list(cfg, k, &v, 1, &loc);
  return set_scalar(cfg, k, &v, -1);
}

static bool node_is_null(const yaml_node_t *node) {
  if (node->type != YAML_SCALAR_NODE)
    return false;
  cfg_scalar v = {(const char *)node->data.scalar.value,
                  node->data.scalar.length,
                  node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE,
                  {0}};
  return scalar_is_null(&v);
}

/* Checks a mapping key node and returns its text (NULL after an error). */
static const char *key_text(const char *file, const yaml_node_t *knode,
                            const char *section) {
  if (knode->type != YAML_SCALAR_NODE) {
    cfg_loc l = node_loc(file, knode);
    if (section)
      cfg_err(&l, NULL, "in section '%s': expected a key name, got %s", section,
              node_kind(knode));
    else
      cfg_err(&l, NULL, "expected a section name, got %s", node_kind(knode));
    return NULL;
  }
  return (const char *)knode->data.scalar.value;
}

/* Whether some key's path begins with "prefix." */
static bool has_children(const char *prefix) {
  size_t n = strlen(prefix);
  for (size_t i = 0; i < NKEYS; i++)
    if (!strncmp(keys[i].path, prefix, n) && keys[i].path[n] == '.')
      return true;
  return false;
}

static loom_status apply_section(loom_config *cfg, cfg_origins *org,
                                 yaml_document_t *doc, const char *file,
                                 const char *section, yaml_node_t *map) {
  unsigned long first_line[COUNT_OF(keys)] = {0};
  for (yaml_node_pair_t *pr = map->data.mapping.pairs.start;
       pr < map->data.mapping.pairs.top; pr++) {
    yaml_node_t *kn = yaml_document_get_node(doc, pr->key);
    yaml_node_t *vn = yaml_document_get_node(doc, pr->value);
    const char *name = key_text(file, kn, section);
    if (!name)
      return LOOM_ERR_CONFIG;
    char path[256];
    snprintf(path, sizeof path, "%s.%s", section, name);
    cfg_loc kl = node_loc(file, kn);
    int ki = key_index(path, strlen(path));
    if (ki < 0 && vn->type == YAML_MAPPING_NODE && has_children(path)) {
      /* A group of keys inside the section (log.mlflow: {uri: ...}). */
      LOOM_TRY(apply_section(cfg, org, doc, file, path, vn));
      continue;
    }
    if (ki < 0) {
      const char *sug = closest(path, &keys[0].path, NKEYS, sizeof keys[0]);
      if (sug)
        return cfg_err(&kl, path, "unknown key (did you mean '%s'?)", sug);
      return cfg_err(&kl, path, "unknown key (see 'loom config schema')");
    }
    if (first_line[ki])
      return cfg_err(&kl, path, "duplicate key (first at line %lu)",
                     first_line[ki]);
    first_line[ki] = kl.line;
    LOOM_TRY(set_node(cfg, &keys[ki], doc, vn, file, NULL));
    org->at[ki] = kl;
    org->set[ki] = true;
  }
  return LOOM_OK;
}

static loom_status apply_document(loom_config *cfg, cfg_origins *org,
                                  yaml_document_t *doc, const char *file) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  if (!root || node_is_null(root))
    return LOOM_OK; /* an empty file: every key at its default */
  if (root->type != YAML_MAPPING_NODE) {
    cfg_loc l = node_loc(file, root);
    return cfg_err(&l, NULL,
                   "expected a mapping of sections (model, data, optim, "
                   "schedule, train, checkpoint, log, parallel), got %s",
                   node_kind(root));
  }
  unsigned long first_line[COUNT_OF(sections)] = {0};
  for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
       pr < root->data.mapping.pairs.top; pr++) {
    yaml_node_t *kn = yaml_document_get_node(doc, pr->key);
    yaml_node_t *vn = yaml_document_get_node(doc, pr->value);
    const char *name = key_text(file, kn, NULL);
    if (!name)
      return LOOM_ERR_CONFIG;
    cfg_loc kl = node_loc(file, kn);
    int si = section_index(name);
    if (si < 0) {
      /* "optim.lr: 0.1" at the top level, or a misspelt section. */
      if (strchr(name, '.') && key_index(name, strlen(name)) >= 0)
        return cfg_err(&kl, name,
                       "dotted keys belong on the command line (--set); in a "
                       "file, write the key inside its section");
      const char *sug = closest(name, sections, NSECTIONS, sizeof sections[0]);
      if (sug)
        return cfg_err(&kl, name, "unknown section (did you mean '%s'?)", sug);
      return cfg_err(&kl, name,
                     "unknown section (sections: model, data, optim, "
                     "schedule, train, checkpoint, log, parallel)");
    }
    if (first_line[si])
      return cfg_err(&kl, name, "duplicate section (first at line %lu)",
                     first_line[si]);
    first_line[si] = kl.line;
    if (node_is_null(vn))
      continue; /* a section with every key commented out */
    if (vn->type != YAML_MAPPING_NODE) {
      cfg_loc vl = node_loc(file, vn);
      return cfg_err(&vl, name, "expected a mapping of keys, got %s",
                     node_kind(vn));
    }
    LOOM_TRY(apply_section(cfg, org, doc, file, name, vn));
  }
  return LOOM_OK;
}

/* Line and column (1-based) of a byte offset in text. */
static void offset_pos(const char *text, size_t len, size_t off,
                       unsigned long *line, unsigned long *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off && i < len; i++) {
    if (text[i] == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

static loom_status parser_error(const yaml_parser_t *p, const char *text,
                                size_t len, const cfg_loc *where,
                                const char *key) {
  if (p->error == YAML_MEMORY_ERROR)
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory reading YAML",
                      where->set ? where->set : where->file);
  cfg_loc l = *where;
  if (!l.set) {
    if (p->error == YAML_READER_ERROR) {
      offset_pos(text, len, p->problem_offset, &l.line, &l.col);
    } else {
      l.line = (unsigned long)p->problem_mark.line + 1;
      l.col = (unsigned long)p->problem_mark.column + 1;
    }
  }
  const char *prob = p->problem ? p->problem : "unknown error";
  if (p->context)
    return cfg_err(&l, key, "YAML syntax error: %s (%s)", prob, p->context);
  return cfg_err(&l, key, "YAML syntax error: %s", prob);
}

/* Nesting deeper than any config needs (sections, keys, a list: 3) is an
 * error before the document is built: libyaml's time grows with the square
 * of the depth (40,000 levels: 12 s). One pass over the events, stopping at
 * the first too deep. */
#define CONFIG_DEPTH_MAX 64

static loom_status check_depth(const char *text, size_t len,
                               const cfg_loc *where, const char *key) {
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p))
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory",
                      where->set ? where->set : where->file);
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  loom_status st = LOOM_OK;
  int depth = 0;
  /* The section and key being read, for the message: a mapping's nodes
   * alternate key, value (depth 1: sections, 2: keys). */
  char section[64] = "", name[192] = "";
  bool is_map[3] = {false, false, false};
  long nodes[3] = {0, 0, 0};
  for (;;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&p, &ev)) {
      st = parser_error(&p, text, len, where, key);
      break;
    }
    yaml_event_type_t type = ev.type;
    bool node = type == YAML_SCALAR_EVENT || type == YAML_ALIAS_EVENT ||
                type == YAML_SEQUENCE_START_EVENT ||
                type == YAML_MAPPING_START_EVENT;
    if (node && depth >= 1 && depth <= 2) {
      if (is_map[depth] && nodes[depth] % 2 == 0 && type == YAML_SCALAR_EVENT) {
        const char *v = (const char *)ev.data.scalar.value;
        if (depth == 1)
          snprintf(section, sizeof section, "%s", v);
        else
          snprintf(name, sizeof name, "%s.%s", section, v);
      }
      nodes[depth]++;
    }
    if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
      depth++;
      if (depth <= 2) {
        is_map[depth] = type == YAML_MAPPING_START_EVENT;
        nodes[depth] = 0;
        if (depth == 2)
          name[0] = '\0';
      }
    } else if (type == YAML_SEQUENCE_END_EVENT ||
               type == YAML_MAPPING_END_EVENT) {
      depth--;
    }
    if (depth > CONFIG_DEPTH_MAX) {
      if (!key && depth > 2)
        key = name[0] ? name : (section[0] ? section : NULL);
      cfg_loc l = *where;
      if (!l.set) {
        l.line = (unsigned long)ev.start_mark.line + 1;
        l.col = (unsigned long)ev.start_mark.column + 1;
      }
      st = cfg_err(&l, key,
                   "nested more than %d levels deep; a config needs 3 "
                   "(section, key, list)",
                   CONFIG_DEPTH_MAX);
    }
    yaml_event_delete(&ev);
    if (st != LOOM_OK || type == YAML_STREAM_END_EVENT)
      break;
  }
  yaml_parser_delete(&p);
  return st;
}

/* -------------------------------------------------------------- overrides */

static loom_status apply_set(loom_config *cfg, cfg_origins *org,
                             const char *arg) {
  cfg_loc loc = {NULL, arg, 0, 0};
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg)
    return cfg_err(&loc, NULL, "expected section.key=value");
  size_t klen = (size_t)(eq - arg);
  char path[256];
  if (klen >= sizeof path)
    return cfg_err(&loc, NULL, "key name too long");
  memcpy(path, arg, klen);
  path[klen] = '\0';
  int ki = key_index(path, klen);
  if (ki < 0) {
    if (section_index(path) >= 0)
      return cfg_err(&loc, path, "a section, not a key: write %s.KEY=VALUE",
                     path);
    const char *sug = closest(path, &keys[0].path, NKEYS, sizeof keys[0]);
    if (sug)
      return cfg_err(&loc, path, "unknown key (did you mean '%s'?)", sug);
    return cfg_err(&loc, path, "unknown key (see 'loom config schema')");
  }
  const loom_config_key *k = &keys[ki];
  const char *val = eq + 1;
  loom_status s;
  if (k->type == LOOM_CFG_STRING) {
    /* Paths on a command line are taken as written, without YAML quoting. */
    cfg_scalar v = {val, strlen(val), true, loc};
    s = set_scalar(cfg, k, &v, -1);
  } else {
    yaml_parser_t p;
    yaml_document_t doc;
    LOOM_TRY(check_depth(val, strlen(val), &loc, path));
    if (!yaml_parser_initialize(&p))
      return loom_error(LOOM_ERR_NOMEM, "--set %s: out of memory", arg);
    yaml_parser_set_input_string(&p, (const unsigned char *)val, strlen(val));
    if (!yaml_parser_load(&p, &doc)) {
      s = parser_error(&p, val, strlen(val), &loc, path);
      yaml_parser_delete(&p);
      return s;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
      cfg_scalar v = {"", 0, false, loc};
      s = set_scalar(cfg, k, &v, -1);
    } else {
      s = set_node(cfg, k, &doc, root, NULL, loc.set);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&p);
  }
  if (s == LOOM_OK && org) {
    org->at[ki] = loc;
    org->set[ki] = true;
  }
  return s;
}

loom_status loom_config_set(loom_config *cfg, const char *assignment) {
  if (!cfg || !assignment)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_set: NULL argument");
  loom_config work = *cfg;
  LOOM_TRY(apply_set(&work, NULL, assignment));
  *cfg = work;
  return LOOM_OK;
}

/* ------------------------------------------------------- cross-key rules */

static const cfg_loc *origin_of(const cfg_origins *org, const char *path,
                                cfg_loc *fallback) {
  int ki = key_index(path, strlen(path));
  if (org && ki >= 0 && org->set[ki])
    return &org->at[ki];
  return fallback;
}

/* Key k's default as canonical text (what loom config show writes). */
static bool default_text(const loom_config_key *k, char *buf, size_t n) {
  loom_config d;
  memset(&d, 0, sizeof d);
  return set_default(&d, k) == LOOM_OK &&
         loom_config_format(&d, k, buf, n) == LOOM_OK;
}

/* Values and keys this build does not implement (the schema's todo). */
static loom_status check_todo(const loom_config *cfg, const cfg_origins *org,
                              cfg_loc *none) {
  for (size_t i = 0; i < NKEYS; i++) {
    const loom_config_key *k = &keys[i];
    if (!k->todo_values && !(k->flags & LOOM_CFG_TODO))
      continue;
    const cfg_loc *l = origin_of(org, k->path, none);
    char val[64], ok[256];
    if (loom_config_format(cfg, k, val, sizeof val) != LOOM_OK)
      snprintf(val, sizeof val, "?");
    if (k->type == LOOM_CFG_ENUM) {
      int x;
      memcpy(&x, (const char *)cfg + k->offset, sizeof x);
      if (x < 0 || x >= k->n_values || !(k->todo_values & (1u << x)))
        continue;
      size_t o = 0;
      ok[0] = '\0';
      for (int j = 0; j < k->n_values && o < sizeof ok; j++)
        if (!(k->todo_values & (1u << j)))
          o += (size_t)snprintf(ok + o, sizeof ok - o, "%s%s", o ? ", " : "",
                                k->values[j]);
    } else {
      /* A key not implemented at all: its default changes nothing. */
      if (!default_text(k, ok, sizeof ok) || strcmp(ok, val) == 0)
        continue;
    }
    return cfg_err(l, k->path, "%s is not implemented yet; supported: %s (%s)",
                   val, ok, k->todo ? k->todo : "a later release");
  }
  return LOOM_OK;
}

/* Keys that belong to one choice of another key (a model, a data set, an
 * optimizer, a schedule): a value other than the default while that choice is
 * not made would be accepted and change nothing, so it is refused (a default
 * changes nothing either way, which keeps `loom config show`'s full listing
 * loadable). */
static const struct {
  const char *key, *selector;
  unsigned values; /* the selector's values (a mask) the key applies to */
} scoped[] = {
    {"model.hidden", "model.name", BIT(LOOM_CFG_MODEL_MLP)},
    {"model.activation", "model.name",
     BIT(LOOM_CFG_MODEL_MLP) | BIT(LOOM_CFG_MODEL_CNN)},
    {"model.channels", "model.name", BIT(LOOM_CFG_MODEL_CNN)},
    {"model.kernel", "model.name", BIT(LOOM_CFG_MODEL_CNN)},
    {"model.pool", "model.name", BIT(LOOM_CFG_MODEL_CNN)},
    {"model.context", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.layers", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.d_model", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.heads", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.vocab", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.mlp_ratio", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.dropout", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"model.init_std", "model.name", BIT(LOOM_CFG_MODEL_GPT)},
    {"data.val_path", "data.dataset", BIT(LOOM_CFG_DATASET_BIN)},
    {"data.val_fraction", "data.dataset", BIT(LOOM_CFG_DATASET_KJV)},
    {"optim.momentum", "optim.name", BIT(LOOM_OPTIM_SGD)},
    {"optim.nesterov", "optim.name", BIT(LOOM_OPTIM_SGD)},
    {"optim.beta1", "optim.name", BIT(LOOM_OPTIM_ADAMW)},
    {"optim.beta2", "optim.name", BIT(LOOM_OPTIM_ADAMW)},
    {"optim.eps", "optim.name", BIT(LOOM_OPTIM_ADAMW)},
    {"schedule.min_lr", "schedule.name",
     BIT(LOOM_SCHED_COSINE) | BIT(LOOM_SCHED_LINEAR)},
    {"schedule.step_size", "schedule.name", BIT(LOOM_SCHED_STEP)},
    {"schedule.gamma", "schedule.name", BIT(LOOM_SCHED_STEP)},
};

/* Refuses key k when it holds another value than its default while it
 * changes nothing: it applies to `scope` only, and `now` says why that is
 * not the case; `fix` is the other way out than removing it. */
static loom_status only_default(const loom_config *cfg, const cfg_origins *org,
                                cfg_loc *none, const loom_config_key *k,
                                const char *scope, const char *now,
                                const char *fix) {
  char val[LOOM_CONFIG_STR_MAX * 4 + 8], def[sizeof val];
  if (!default_text(k, def, sizeof def) ||
      loom_config_format(cfg, k, val, sizeof val) != LOOM_OK)
    return loom_error(LOOM_ERR_INTERNAL, "config: cannot format %s", k->path);
  if (strcmp(val, def) == 0)
    return LOOM_OK;
  return cfg_err(origin_of(org, k->path, none), k->path,
                 "applies to %s only, and %s: %s would change nothing; it "
                 "supports only its default (%s) here (remove it, or %s)",
                 scope, now, val, def, fix);
}

static loom_status check_scoped(const loom_config *cfg, const cfg_origins *org,
                                cfg_loc *none) {
  for (size_t i = 0; i < COUNT_OF(scoped); i++) {
    const loom_config_key *k = loom_config_key_find(scoped[i].key);
    const loom_config_key *sel = loom_config_key_find(scoped[i].selector);
    if (!k || !sel || sel->type != LOOM_CFG_ENUM)
      return loom_error(LOOM_ERR_INTERNAL, "config: bad scoped key %s",
                        scoped[i].key);
    int x;
    memcpy(&x, (const char *)cfg + sel->offset, sizeof x);
    if (x < 0 || x >= sel->n_values || (scoped[i].values & BIT(x)))
      continue;
    char names[96], scope[160], now[160], fix[160];
    size_t o = 0;
    names[0] = '\0';
    for (int j = 0; j < sel->n_values && o < sizeof names; j++)
      if (scoped[i].values & BIT(j))
        o += (size_t)snprintf(names + o, sizeof names - o, "%s%s",
                              o ? " or " : "", sel->values[j]);
    snprintf(scope, sizeof scope, "%s %s", sel->path, names);
    snprintf(now, sizeof now, "%s is '%s'", sel->path, sel->values[x]);
    snprintf(fix, sizeof fix, "set %s: %s", sel->path, names);
    LOOM_TRY(only_default(cfg, org, none, k, scope, now, fix));
  }
  /* The trace's window and cap with no trace written: log.trace is what
   * they hang on (LOOM_TRACE=DIR alone traces with their defaults; with
   * log.trace true it only chooses the directory). */
  if (!cfg->log.trace) {
    static const char *const trace_keys[] = {
        "log.trace_start", "log.trace_steps", "log.trace_every",
        "log.trace_max_mb"};
    for (size_t i = 0; i < COUNT_OF(trace_keys); i++)
      LOOM_TRY(only_default(cfg, org, none, loom_config_key_find(trace_keys[i]),
                            "a trace (log.trace true)", "log.trace is false",
                            "set log.trace: true, which LOOM_TRACE=DIR "
                            "needs too for this key"));
  }
  /* MLflow's own default (a local ./mlruns) is not loom's: without a
   * server, nothing is logged, and an experiment or run name says that
   * something would be. */
  if (!cfg->log.mlflow_uri[0]) {
    LOOM_TRY(only_default(cfg, org, none,
                          loom_config_key_find("log.mlflow.experiment"),
                          "MLflow logging", "log.mlflow.uri is empty",
                          "set log.mlflow.uri to the tracking server"));
    LOOM_TRY(only_default(cfg, org, none,
                          loom_config_key_find("log.mlflow.run_name"),
                          "MLflow logging", "log.mlflow.uri is empty",
                          "set log.mlflow.uri to the tracking server"));
  }
  return LOOM_OK;
}

/* parallel.tp against the model and the rest of the mesh. */
static loom_status check_tp(const loom_config *cfg, const cfg_origins *org,
                            cfg_loc *none) {
  const loom_config_parallel *pc = &cfg->parallel;
  const loom_config_model *m = &cfg->model;
  const int64_t T = pc->tp;
  if (pc->sequence_parallel_regather && !pc->sequence_parallel)
    return cfg_err(
        origin_of(org, "parallel.sequence_parallel_regather", none),
        "parallel.sequence_parallel_regather",
        "true without parallel.sequence_parallel: it chooses how sequence "
        "parallelism keeps the gathered inputs; supported: with "
        "parallel.sequence_parallel true (or false)");
  if (pc->sequence_parallel) {
    const cfg_loc *sl = origin_of(org, "parallel.sequence_parallel", none);
    if (T == 1)
      return cfg_err(sl, "parallel.sequence_parallel",
                     "true with parallel.tp 1: sequence parallelism cuts the "
                     "tokens over a tensor-parallel group; supported: "
                     "parallel.tp > 1 with model gpt (or false)");
    if (m->name != LOOM_CFG_MODEL_GPT)
      return cfg_err(sl, "parallel.sequence_parallel",
                     "true with model '%s': supported with model gpt only",
                     loom_cfg_model_names[m->name]);
    if (m->context % T != 0)
      return cfg_err(sl, "parallel.sequence_parallel",
                     "true with model.context %lld and parallel.tp %lld: "
                     "each rank takes an equal share of every micro-batch's "
                     "tokens; supported: a tp that divides model.context",
                     (long long)m->context, (long long)T);
  }
  if (T == 1)
    return LOOM_OK;
  const cfg_loc *l = origin_of(org, "parallel.tp", none);
  if (m->name != LOOM_CFG_MODEL_GPT)
    return cfg_err(l, "parallel.tp",
                   "%lld: tensor parallelism supports model gpt (its "
                   "attention, MLP, embedding and output layer cut over the "
                   "ranks); model '%s' supports 1 (use data parallelism: "
                   "parallel.dp)",
                   (long long)T, loom_cfg_model_names[m->name]);
  if (m->heads % T != 0 || m->vocab % T != 0)
    return cfg_err(l, "parallel.tp",
                   "%lld does not divide model.heads (%lld) and model.vocab "
                   "(%lld): each rank takes an equal share of the heads and "
                   "of the vocabulary",
                   (long long)T, (long long)m->heads, (long long)m->vocab);
  if (pc->strategy != LOOM_CFG_STRATEGY_AUTO &&
      pc->strategy != LOOM_CFG_STRATEGY_DDP &&
      pc->strategy != LOOM_CFG_STRATEGY_ZERO1 &&
      pc->strategy != LOOM_CFG_STRATEGY_ZERO2 &&
      pc->strategy != LOOM_CFG_STRATEGY_ZERO3 &&
      pc->strategy != LOOM_CFG_STRATEGY_FSDP)
    return cfg_err(origin_of(org, "parallel.strategy", none),
                   "parallel.strategy",
                   "'%s' with parallel.tp %lld: tensor parallelism supports "
                   "auto, ddp, zero1, zero2, zero3 or fsdp (data parallel "
                   "over parallel.dp, zero1 sharding the optimizer state "
                   "over it, zero2 the gradients too, zero3/fsdp the "
                   "parameters too)",
                   loom_cfg_strategy_names[pc->strategy], (long long)T);
  if (pc->deterministic)
    return cfg_err(origin_of(org, "parallel.deterministic", none),
                   "parallel.deterministic",
                   "true with parallel.tp %lld: tensor parallelism supports "
                   "false",
                   (long long)T);
  if (cfg->train.batch_size == 0)
    return cfg_err(origin_of(org, "train.batch_size", none), "train.batch_size",
                   "auto with parallel.tp %lld: give a number (the "
                   "finder's trials run one rank; loom estimate -n N --set "
                   "parallel.tp=%lld --memory BYTES gives the largest that "
                   "fits)",
                   (long long)T, (long long)T);
  return LOOM_OK;
}

/* The mesh keys (parallel.dp, pp, micro_batches, pp_split) against the
 * rest; the world size itself is known only at start-up. */
static loom_status check_mesh(const loom_config *cfg, const cfg_origins *org,
                              cfg_loc *none, int ac_every) {
  const loom_config_parallel *pc = &cfg->parallel;
  const loom_config_model *m = &cfg->model;
  const int64_t M = pc->micro_batches, P = pc->pp;
  if (M > 1 && cfg->train.batch_size == 0)
    return cfg_err(origin_of(org, "parallel.micro_batches", none),
                   "parallel.micro_batches",
                   "%lld micro-batches need a train.batch_size they divide, "
                   "not auto",
                   (long long)M);
  if (cfg->train.batch_size > 0 && cfg->train.batch_size % M != 0)
    return cfg_err(origin_of(org, "parallel.micro_batches", none),
                   "parallel.micro_batches",
                   "%lld does not divide train.batch_size (%lld): every "
                   "micro-batch has the same rows",
                   (long long)M, (long long)cfg->train.batch_size);
  if (M > 1 && pc->deterministic)
    return cfg_err(origin_of(org, "parallel.micro_batches", none),
                   "parallel.micro_batches",
                   "%lld: parallel.deterministic supports 1 (its virtual "
                   "shards already cut the batch)",
                   (long long)M);
  /* A GPT's units: the embedding, a dropout when on, the blocks (or
   * checkpointed segments), the final norm and the output layer. */
  int64_t units = 0;
  if (m->name == LOOM_CFG_MODEL_GPT)
    units = 3 + (m->dropout > 0) +
            (ac_every > 0 ? (m->layers + ac_every - 1) / ac_every : m->layers);
  if (pc->pp_split.n > 0 && m->name != LOOM_CFG_MODEL_GPT)
    return cfg_err(origin_of(org, "parallel.pp_split", none),
                   "parallel.pp_split",
                   "cuts a pipeline's units (model gpt); model '%s' has no "
                   "pipeline: it supports [] (the default)",
                   loom_cfg_model_names[m->name]);
  if (pc->pp_split.n > 0) {
    int64_t sum = 0;
    for (int i = 0; i < pc->pp_split.n; i++)
      sum += pc->pp_split.v[i];
    if (pc->pp_split.n != P || (units > 0 && sum != units))
      return cfg_err(origin_of(org, "parallel.pp_split", none),
                     "parallel.pp_split",
                     "%d stages of %lld units in all; parallel.pp is %lld and "
                     "the model has %lld units (1 embedding%s + %lld %s + 1 "
                     "final norm + 1 output layer)",
                     pc->pp_split.n, (long long)sum, (long long)P,
                     (long long)units, m->dropout > 0 ? " + 1 dropout" : "",
                     (long long)(units - 3 - (m->dropout > 0)),
                     ac_every > 0 ? "checkpointed segments" : "blocks");
  }
  LOOM_TRY(check_tp(cfg, org, none));
  /* The schedule orders a pipeline's stages; on one stage the micro-batches
   * run one after another, each forward then its backward, whatever it
   * says: only the default (what such a run does) is taken there. */
  if (P == 1 && pc->pp_schedule != LOOM_CFG_PP_1F1B)
    return cfg_err(origin_of(org, "parallel.pp_schedule", none),
                   "parallel.pp_schedule",
                   "'%s' orders the micro-batches of a pipeline; with "
                   "parallel.pp 1 there is none (micro-batches on one stage "
                   "run one after another, each forward then its backward): "
                   "supported here: 1f1b (the default), or parallel.pp > 1",
                   loom_cfg_pp_schedule_names[pc->pp_schedule]);
  if (P == 1)
    return LOOM_OK;
  const cfg_loc *l = origin_of(org, "parallel.pp", none);
  if (cfg->train.batch_size == 0)
    return cfg_err(origin_of(org, "train.batch_size", none), "train.batch_size",
                   "auto with parallel.pp %lld: give a number (loom estimate "
                   "and --find-batch-size size one replica of the whole "
                   "model, not a stage)",
                   (long long)P);
  if (m->name != LOOM_CFG_MODEL_GPT)
    return cfg_err(l, "parallel.pp",
                   "%lld stages: pipeline parallelism supports model gpt "
                   "(its units: embedding, blocks, norm, output layer); "
                   "model '%s' supports 1",
                   (long long)P, loom_cfg_model_names[m->name]);
  if (P > units)
    return cfg_err(l, "parallel.pp",
                   "%lld stages but the model has %lld units (1 embedding%s "
                   "+ %lld %s + 1 final norm + 1 output layer): at most one "
                   "stage a unit",
                   (long long)P, (long long)units,
                   m->dropout > 0 ? " + 1 dropout" : "",
                   (long long)(units - 3 - (m->dropout > 0)),
                   ac_every > 0 ? "checkpointed segments" : "blocks");
  if (pc->strategy == LOOM_CFG_STRATEGY_NONE)
    return cfg_err(origin_of(org, "parallel.strategy", none),
                   "parallel.strategy",
                   "'none' with parallel.pp %lld: the pipeline supports auto "
                   "or ddp (data parallel over parallel.dp), zero1 (the "
                   "optimizer state of each stage sharded over its "
                   "replicas), zero2 (also the reduced gradient), zero3 or "
                   "fsdp (also the parameters between steps)",
                   (long long)P);
  int su_every = 1;
  int64_t su_params = 0;
  if (loom_config_shard_unit(pc->shard_unit, &su_every, &su_params) ==
          LOOM_OK &&
      (su_every != 1 || su_params != 0))
    return cfg_err(origin_of(org, "parallel.shard_unit", none),
                   "parallel.shard_unit",
                   "'%s' with parallel.pp %lld: zero3/fsdp with a pipeline "
                   "gathers the stage's parameters whole once a step (every "
                   "micro-batch's forward and backward reads them); it "
                   "supports blocks (the default) only",
                   pc->shard_unit, (long long)P);
  if (pc->deterministic)
    return cfg_err(origin_of(org, "parallel.deterministic", none),
                   "parallel.deterministic",
                   "true with parallel.pp %lld: the pipeline supports false",
                   (long long)P);
  if (pc->first_bucket_mb != 1.0)
    return cfg_err(origin_of(org, "parallel.first_bucket_mb", none),
                   "parallel.first_bucket_mb",
                   "is for ddp without a pipeline: with parallel.pp %lld "
                   "each stage's gradient is reduced over parallel.dp in "
                   "chunks of parallel.bucket_mb after its last backward",
                   (long long)P);
  return LOOM_OK;
}

/* Fashion-MNIST images: what the mlp and cnn read. */
#define IMAGE_C 1
#define IMAGE_HW 28
#define IMAGE_CLASSES 10
/* Kernels index tensors with int; and a micro-batch's activations (an
 * estimate: each tensor of forward, once more for its gradient) must stay
 * below this, so that a size that cannot work fails here, not after
 * allocating gigabytes. */
#define TENSOR_MAX 2147483647.0
#define ACT_BYTES_MAX (64.0 * 1024 * 1024 * 1024)

typedef struct size_acc {
  double act; /* floats of activations */
  const char *big;
  double big_n;
} size_acc;

/* Adds one tensor of n elements, noting the first that breaks int range. */
static void acc_tensor(size_acc *a, double n, const char *what) {
  a->act += n;
  if (n > TENSOR_MAX && !a->big) {
    a->big = what;
    a->big_n = n;
  }
}

/* Sizes that no kernel can take: products beyond int, or a micro-batch's
 * activations beyond ACT_BYTES_MAX. Names the key that sets the size. */
static loom_status check_sizes(const loom_config *cfg, const cfg_origins *org,
                               cfg_loc *none) {
  const loom_config_model *m = &cfg->model;
  double B = (double)cfg->train.batch_size;
  size_acc a = {0, NULL, 0};
  const char *key = "train.batch_size";
  if (m->name == LOOM_CFG_MODEL_MLP) {
    double w = IMAGE_C * IMAGE_HW * IMAGE_HW;
    acc_tensor(&a, B * w, "the input batch");
    for (int i = 0; i < m->hidden.n; i++) {
      double next = (double)m->hidden.v[i];
      if (w * next > TENSOR_MAX) {
        key = "model.hidden";
        acc_tensor(&a, w * next, "a weight matrix");
      }
      acc_tensor(&a, B * next, "a hidden layer's output");
      acc_tensor(&a, B * next, "a hidden layer's activation");
      w = next;
    }
    acc_tensor(&a, B * IMAGE_CLASSES, "the logits");
  } else if (m->name == LOOM_CFG_MODEL_CNN) {
    double c = IMAGE_C, h = IMAGE_HW, w = IMAGE_HW, k = (double)m->kernel;
    double p = (double)m->pool;
    acc_tensor(&a, B * c * h * w, "the input batch");
    for (int i = 0; i < m->channels.n; i++) {
      double oc = (double)m->channels.v[i];
      h -= k - 1;
      w -= k - 1;
      if (h < 1 || w < 1 || h < p || w < p)
        return cfg_err(origin_of(org, "model.channels", none), "model.channels",
                       "%d convs of kernel %lld with max-pool %lld do not "
                       "fit a %dx%d image: conv %d has nothing left to pool "
                       "(use fewer convs, a smaller model.kernel or "
                       "model.pool)",
                       m->channels.n, (long long)m->kernel, (long long)m->pool,
                       IMAGE_HW, IMAGE_HW, i + 1);
      acc_tensor(&a, c * k * k * h * w, "a conv's im2col buffer");
      acc_tensor(&a, B * oc * h * w, "a conv's output");
      acc_tensor(&a, B * oc * h * w, "a conv's activation");
      h = floor((h - p) / p) + 1;
      w = floor((w - p) / p) + 1;
      acc_tensor(&a, B * oc * h * w, "a max-pool's output");
      c = oc;
    }
    acc_tensor(&a, c * h * w * IMAGE_CLASSES, "the linear layer's weight");
    acc_tensor(&a, B * IMAGE_CLASSES, "the logits");
  } else {
    double T = (double)m->context, C = (double)m->d_model;
    double V = (double)m->vocab;
    double NH = (double)m->heads, R = (double)m->mlp_ratio;
    acc_tensor(&a, V * C, "the token embedding");
    acc_tensor(&a, B * T * C, "the embedding output");
    for (int64_t l = 0; l < m->layers && !a.big; l++) {
      acc_tensor(&a, 4 * B * T * C, "a block's layer norms and residuals");
      acc_tensor(&a, B * T * 3 * C, "a block's q, k, v");
      acc_tensor(&a, B * NH * T * T, "a block's attention scores");
      acc_tensor(&a, B * NH * T * T, "a block's attention weights");
      acc_tensor(&a, 3 * B * T * R * C, "a block's MLP");
      acc_tensor(&a, C * R * C, "a block's MLP weight");
    }
    acc_tensor(&a, B * T * V, "the logits");
    acc_tensor(&a, B * T * V, "the logits' gradient");
  }
  /* Name the size the file set: the batch, else a model size. */
  static const char *const gpt_keys[] = {"model.context",   "model.d_model",
                                         "model.vocab",     "model.layers",
                                         "model.mlp_ratio", "model.heads"};
  int ki = key_index(key, strlen(key));
  for (size_t i = 0; m->name == LOOM_CFG_MODEL_GPT && i < COUNT_OF(gpt_keys) &&
                     !(org && org->set[ki]);
       i++) {
    int kj = key_index(gpt_keys[i], strlen(gpt_keys[i]));
    if (org && org->set[kj]) {
      key = gpt_keys[i];
      ki = kj;
    }
  }
  char sizes[160];
  if (m->name == LOOM_CFG_MODEL_GPT)
    snprintf(sizes, sizeof sizes,
             "train.batch_size %lld, model.context %lld, model.d_model %lld, "
             "model.layers %lld, model.vocab %lld",
             (long long)cfg->train.batch_size, (long long)m->context,
             (long long)m->d_model, (long long)m->layers, (long long)m->vocab);
  else
    snprintf(sizes, sizeof sizes, "train.batch_size %lld",
             (long long)cfg->train.batch_size);
  if (a.big)
    return cfg_err(origin_of(org, key, none), key,
                   "%s would hold %.0f elements (%s), more than a kernel can "
                   "index (2^31 - 1); use a smaller size",
                   a.big, a.big_n, sizes);
  a.act *= 2; /* and the gradient of each */
  if (a.act * 4 > ACT_BYTES_MAX)
    return cfg_err(origin_of(org, key, none), key,
                   "a micro-batch needs about %.1f GiB of activations (%s), "
                   "more than the limit of %.0f GiB; use a smaller size (or "
                   "train.accumulate)",
                   a.act * 4 / (1024.0 * 1024 * 1024), sizes,
                   ACT_BYTES_MAX / (1024.0 * 1024 * 1024));
  return LOOM_OK;
}

/* What train.loss_scale takes, for both of its errors (the API's and
 * config check's). */
#define LOSS_SCALE_VALUES                                                      \
  "expected auto, dynamic, a number from %g to 1e38 (a static scale; the "     \
  "smallest normal f32 at least, whose reciprocal unscales the gradients) "    \
  "or 0 (none)"

/* Range of every key (for configs filled in from C) and the rules that tie
 * keys together. `where` names the source for keys left at their default. */
loom_status loom_config_loss_scale(const loom_config *cfg,
                                   loom_loss_scale_mode *mode, double *scale) {
  if (!cfg || !mode || !scale)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_loss_scale: NULL "
                                            "argument");
  const char *v = cfg->train.loss_scale;
  const bool f16 = cfg->train.precision == LOOM_CFG_PRECISION_F16;
  if (strcmp(v, "auto") == 0 || strcmp(v, "dynamic") == 0) {
    const bool dyn = strcmp(v, "dynamic") == 0 || f16;
    *mode = dyn ? LOOM_LOSS_SCALE_DYNAMIC : LOOM_LOSS_SCALE_NONE;
    *scale = dyn ? cfg->train.loss_scale_init : 1.0;
    return LOOM_OK;
  }
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (!*v || end == v || *end != '\0' || errno != 0 || !isfinite(x) || x < 0 ||
      (x > 0 && x < FLT_MIN) || x > 1e38)
    return loom_error(LOOM_ERR_CONFIG,
                      "train.loss_scale '%s': " LOSS_SCALE_VALUES, v,
                      (double)FLT_MIN);
  *mode = x > 0 ? LOOM_LOSS_SCALE_STATIC : LOOM_LOSS_SCALE_NONE;
  *scale = x > 0 ? x : 1.0;
  return LOOM_OK;
}

/* Loss scaling is for f16, whose range ends at 65504: f32 and bf16 share
 * f32's exponent range and need none (so it is refused there rather than
 * accepted for nothing); the dynamic scaler's keys only with it. */
static loom_status check_loss_scale(const loom_config *cfg,
                                    const cfg_origins *org, cfg_loc *none) {
  loom_loss_scale_mode mode;
  double scale;
  const cfg_loc *l = origin_of(org, "train.loss_scale", none);
  if (loom_config_loss_scale(cfg, &mode, &scale) != LOOM_OK)
    return cfg_err(l, "train.loss_scale", "'%s': " LOSS_SCALE_VALUES,
                   cfg->train.loss_scale, (double)FLT_MIN);
  const bool f16 = cfg->train.precision == LOOM_CFG_PRECISION_F16;
  if (!f16 && mode != LOOM_LOSS_SCALE_NONE)
    return cfg_err(l, "train.loss_scale",
                   "'%s' is for train.precision f16; precision '%s' has "
                   "f32's exponent range and needs no loss scaling: it "
                   "supports auto or 0",
                   cfg->train.loss_scale,
                   loom_cfg_precision_names[cfg->train.precision]);
  /* the dynamic scaler's keys, set away from their defaults */
  static const char *const dyn_keys[] = {"train.loss_scale_init",
                                         "train.loss_scale_growth_interval"};
  const bool dyn_set[] = {cfg->train.loss_scale_init != 65536.0,
                          cfg->train.loss_scale_growth_interval != 2000};
  for (int i = 0; i < 2 && mode != LOOM_LOSS_SCALE_DYNAMIC; i++)
    if (dyn_set[i])
      return cfg_err(origin_of(org, dyn_keys[i], none), dyn_keys[i],
                     "is for dynamic loss scaling (train.loss_scale dynamic, "
                     "or auto with train.precision f16); here loss scaling "
                     "is %s",
                     mode == LOOM_LOSS_SCALE_STATIC ? "static" : "off");
  return LOOM_OK;
}

/* log.mlflow.uri: what libcurl would take and could ever reach, refused at
 * config check rather than after a run's 30 s of retries at its end: http
 * or https, no space or control character anywhere, a host (a name or an
 * [IPv6] address, after an optional user@), a port (when given) of
 * 1-65535. *why says what is wrong. */
static bool mlflow_uri_ok(const char *u, char *why, size_t n) {
  size_t k = !strncmp(u, "http://", 7) ? 7 : !strncmp(u, "https://", 8) ? 8 : 0;
  if (!k) {
    snprintf(why, n, "the scheme is not http:// or https://");
    return false;
  }
  for (const char *c = u; *c; c++)
    if ((unsigned char)*c <= 0x20 || *c == 0x7f) {
      snprintf(why, n, "a %s at byte %d",
               *c == ' ' ? "space" : "control character", (int)(c - u) + 1);
      return false;
    }
  const char *host = u + k, *end = host + strcspn(host, "/?#");
  const char *at = memchr(host, '@', (size_t)(end - host));
  if (at)
    host = at + 1;
  const char *colon = NULL;
  if (*host == '[') {
    const char *close = memchr(host, ']', (size_t)(end - host));
    if (!close || close == host + 1) {
      snprintf(why, n, "an IPv6 host without its ']' or empty");
      return false;
    }
    if (close + 1 < end && close[1] != ':') {
      snprintf(why, n, "'%c' after the IPv6 host", close[1]);
      return false;
    }
    colon = close + 1 < end ? close + 1 : NULL;
  } else {
    colon = memchr(host, ':', (size_t)(end - host));
    if ((colon ? colon : end) == host) {
      snprintf(why, n, "no host");
      return false;
    }
  }
  if (colon) {
    long port = 0;
    const char *p = colon + 1;
    for (; p < end && *p >= '0' && *p <= '9' && port <= 65535; p++)
      port = port * 10 + (*p - '0');
    if (p != end || port < 1 || port > 65535) {
      snprintf(why, n, "port '%.*s' is not a number of 1-65535",
               (int)(end - colon - 1 > 20 ? 20 : end - colon - 1), colon + 1);
      return false;
    }
  }
  return true;
}

static loom_status check_config(const loom_config *cfg, const cfg_origins *org,
                                const char *file) {
  cfg_loc none = {file, NULL, 0, 0};
  for (size_t i = 0; i < NKEYS; i++) {
    const loom_config_key *k = &keys[i];
    const char *field = (const char *)cfg + k->offset;
    const cfg_loc *l = origin_of(org, k->path, &none);
    char r[96];
    fmt_range(r, sizeof r, k);
    const char *in = isinf(k->max) ? "" : "in ";
    if (k->type == LOOM_CFG_INT) {
      int64_t x;
      memcpy(&x, field, sizeof x);
      if (!in_range(k, (double)x) && !(x == 0 && (k->flags & LOOM_CFG_AUTO)))
        return cfg_err(l, k->path, "%lld is out of range (must be %s%s%s)",
                       (long long)x, in, r,
                       k->flags & LOOM_CFG_AUTO ? ", or auto" : "");
    } else if (k->type == LOOM_CFG_FLOAT) {
      double x;
      char t[40];
      memcpy(&x, field, sizeof x);
      fmt_double(t, sizeof t, x);
      if (!isfinite(x) || !in_range(k, x))
        return cfg_err(l, k->path, "%s is out of range (must be %s%s)", t, in,
                       r);
      if (below_f32(x))
        return cfg_err(l, k->path, BELOW_F32_FMT, t, (double)FLT_MIN);
    } else if (k->type == LOOM_CFG_ENUM) {
      int x;
      memcpy(&x, field, sizeof x);
      if (x < 0 || x >= k->n_values)
        return cfg_err(l, k->path, "enum value %d out of range", x);
    } else if (k->type == LOOM_CFG_STRING) {
      if (!memchr(field, '\0', LOOM_CONFIG_STR_MAX))
        return cfg_err(l, k->path, "string not terminated");
    } else if (k->type == LOOM_CFG_INT_LIST) {
      const loom_config_ints *li =
          (const loom_config_ints *)(const void *)field;
      if (li->n < k->list_min || li->n > LOOM_CONFIG_LIST_MAX)
        return cfg_err(l, k->path, "%d items (must be %d to %d)", li->n,
                       k->list_min, LOOM_CONFIG_LIST_MAX);
      for (int j = 0; j < li->n; j++)
        if (!in_range(k, (double)li->v[j]))
          return cfg_err(l, k->path,
                         "item %d: %lld is out of range (must be "
                         "%s%s)",
                         j + 1, (long long)li->v[j], in, r);
    }
  }
  LOOM_TRY(check_todo(cfg, org, &none));
  const loom_config_model *m = &cfg->model;
  bool tokens = cfg->data.dataset != LOOM_CFG_DATASET_FASHION_MNIST;
  if (cfg->train.epochs == 0 && cfg->train.steps == 0)
    return cfg_err(origin_of(org, "train.epochs", &none), "train.epochs",
                   "train.epochs and train.steps are both 0: set one of them");
  if (m->name == LOOM_CFG_MODEL_GPT && !tokens)
    return cfg_err(origin_of(org, "model.name", &none), "model.name",
                   "model 'gpt' needs a token data set (data.dataset kjv or "
                   "bin), but data.dataset is 'fashion-mnist'");
  if (m->name != LOOM_CFG_MODEL_GPT && tokens)
    return cfg_err(origin_of(org, "model.name", &none), "model.name",
                   "model '%s' needs images (data.dataset fashion-mnist), "
                   "but data.dataset is '%s'",
                   loom_cfg_model_names[m->name],
                   loom_cfg_dataset_names[cfg->data.dataset]);
  int ac_every = 0;
  if (loom_config_checkpoint_every(cfg->train.activation_checkpointing,
                                   &ac_every) != LOOM_OK)
    return cfg_err(origin_of(org, "train.activation_checkpointing", &none),
                   "train.activation_checkpointing",
                   "'%s': expected none, blocks or every:K (K >= 1 blocks a "
                   "segment)",
                   cfg->train.activation_checkpointing);
  const char *mu = cfg->log.mlflow_uri;
  char why[96];
  if (mu[0] && !mlflow_uri_ok(mu, why, sizeof why))
    return cfg_err(origin_of(org, "log.mlflow.uri", &none), "log.mlflow.uri",
                   "'%s': %s: expected the tracking server as "
                   "http://HOST:PORT or https://HOST[:PORT] (or empty for no "
                   "MLflow)",
                   mu, why);
  if (mu[0] && !cfg->log.mlflow_experiment[0])
    return cfg_err(origin_of(org, "log.mlflow.experiment", &none),
                   "log.mlflow.experiment",
                   "empty: MLflow needs an experiment name");
  int su_every = 1;
  int64_t su_params = 0;
  if (loom_config_shard_unit(cfg->parallel.shard_unit, &su_every, &su_params) !=
      LOOM_OK)
    return cfg_err(origin_of(org, "parallel.shard_unit", &none),
                   "parallel.shard_unit",
                   "'%s': expected blocks, every:K (K >= 1 units gathered "
                   "together) or params:N (units together until N "
                   "parameters; N may end in K, M or G)",
                   cfg->parallel.shard_unit);
  if ((su_every != 1 || su_params != 0) &&
      cfg->parallel.strategy != LOOM_CFG_STRATEGY_ZERO3 &&
      cfg->parallel.strategy != LOOM_CFG_STRATEGY_FSDP)
    return cfg_err(origin_of(org, "parallel.shard_unit", &none),
                   "parallel.shard_unit",
                   "'%s' is for parallel.strategy zero3 or fsdp (which "
                   "gather parameters unit by unit); strategy '%s' supports "
                   "blocks only",
                   cfg->parallel.shard_unit,
                   loom_cfg_strategy_names[cfg->parallel.strategy]);
  LOOM_TRY(check_loss_scale(cfg, org, &none));
  const loom_config_log *lg = &cfg->log;
  if (lg->trace_every > 0 && lg->trace_steps == 0)
    return cfg_err(origin_of(org, "log.trace_every", &none), "log.trace_every",
                   "%lld repeats a window of log.trace_steps steps, and "
                   "log.trace_steps is 0 (to the end); supported: "
                   "log.trace_steps > 0 with it (or log.trace_every 0: once)",
                   (long long)lg->trace_every);
  if (lg->trace_every > 0 && lg->trace_every <= lg->trace_steps)
    return cfg_err(origin_of(org, "log.trace_every", &none), "log.trace_every",
                   "%lld is not more than log.trace_steps (%lld): the window "
                   "would never close; supported: log.trace_every > "
                   "log.trace_steps (or 0: once)",
                   (long long)lg->trace_every, (long long)lg->trace_steps);
  if (ac_every > 0 && m->name != LOOM_CFG_MODEL_GPT)
    return cfg_err(origin_of(org, "train.activation_checkpointing", &none),
                   "train.activation_checkpointing",
                   "'%s' is for model gpt (its transformer blocks); model "
                   "'%s' supports none",
                   cfg->train.activation_checkpointing,
                   loom_cfg_model_names[m->name]);
  if (m->name == LOOM_CFG_MODEL_GPT && m->d_model % m->heads != 0)
    return cfg_err(origin_of(org, "model.heads", &none), "model.heads",
                   "%lld does not divide model.d_model (%lld)",
                   (long long)m->heads, (long long)m->d_model);
  if (cfg->data.dataset == LOOM_CFG_DATASET_KJV && m->vocab < 256)
    return cfg_err(origin_of(org, "model.vocab", &none), "model.vocab",
                   "data set kjv has 256 byte values, so model.vocab must be "
                   "at least 256, got %lld",
                   (long long)m->vocab);
  if (cfg->data.dataset == LOOM_CFG_DATASET_BIN &&
      (!cfg->data.path[0] || !cfg->data.val_path[0]))
    return cfg_err(origin_of(org, "data.dataset", &none), "data.dataset",
                   "'bin' needs data.path and data.val_path (the training and "
                   "validation .bin files)");
  int64_t vs = cfg->parallel.virtual_shards;
  if (cfg->parallel.deterministic && (vs & (vs - 1)) != 0)
    return cfg_err(origin_of(org, "parallel.virtual_shards", &none),
                   "parallel.virtual_shards",
                   "%lld is not a power of two (parallel.deterministic sums "
                   "the shards in a binary tree)",
                   (long long)vs);
  if (!cfg->parallel.deterministic && vs != 8)
    return cfg_err(origin_of(org, "parallel.virtual_shards", &none),
                   "parallel.virtual_shards",
                   "%lld without parallel.deterministic: only deterministic "
                   "mode cuts the batch into virtual shards; it supports the "
                   "default 8 here (or set parallel.deterministic: true)",
                   (long long)vs);
  if (cfg->parallel.deterministic &&
      cfg->parallel.strategy == LOOM_CFG_STRATEGY_NONE)
    return cfg_err(origin_of(org, "parallel.deterministic", &none),
                   "parallel.deterministic",
                   "needs a data-parallel parallel.strategy: auto, ddp, "
                   "zero1, zero2, zero3 or fsdp (got 'none')");
  /* strategy none: each rank trains alone, nothing is reduced */
  if (cfg->parallel.strategy == LOOM_CFG_STRATEGY_NONE &&
      cfg->parallel.compress != LOOM_CFG_COMPRESS_NONE)
    return cfg_err(origin_of(org, "parallel.compress", &none),
                   "parallel.compress",
                   "'%s' with parallel.strategy none: no gradient is reduced "
                   "to compress; it supports none (or choose a data-parallel "
                   "strategy)",
                   loom_cfg_compress_names[cfg->parallel.compress]);
  if (cfg->parallel.strategy == LOOM_CFG_STRATEGY_NONE &&
      (cfg->parallel.bucket_mb != 25.0 || cfg->parallel.first_bucket_mb != 1.0))
    return cfg_err(
        origin_of(org,
                  cfg->parallel.bucket_mb != 25.0 ? "parallel.bucket_mb"
                                                  : "parallel.first_bucket_mb",
                  &none),
        cfg->parallel.bucket_mb != 25.0 ? "parallel.bucket_mb"
                                        : "parallel.first_bucket_mb",
        "%g with parallel.strategy none: no gradient is reduced, so there "
        "are no buckets; it supports the default (%g) (or choose a "
        "data-parallel strategy)",
        cfg->parallel.bucket_mb != 25.0 ? cfg->parallel.bucket_mb
                                        : cfg->parallel.first_bucket_mb,
        cfg->parallel.bucket_mb != 25.0 ? 25.0 : 1.0);
  if (cfg->parallel.strategy == LOOM_CFG_STRATEGY_NONE && cfg->parallel.dp > 1)
    return cfg_err(origin_of(org, "parallel.dp", &none), "parallel.dp",
                   "%lld replicas with parallel.strategy none, which has no "
                   "data parallelism: it supports auto or 1 (or choose a "
                   "data-parallel strategy)",
                   (long long)cfg->parallel.dp);
  LOOM_TRY(check_mesh(cfg, org, &none, ac_every));
  if (cfg->parallel.deterministic &&
      cfg->parallel.compress != LOOM_CFG_COMPRESS_NONE)
    return cfg_err(origin_of(org, "parallel.compress", &none),
                   "parallel.compress",
                   "'%s' with parallel.deterministic: deterministic mode "
                   "sums the gradients in f32 in a fixed tree; it supports "
                   "none",
                   loom_cfg_compress_names[cfg->parallel.compress]);
  if ((cfg->schedule.name == LOOM_SCHED_COSINE ||
       cfg->schedule.name == LOOM_SCHED_LINEAR) &&
      cfg->train.steps > 0 && cfg->schedule.warmup_steps >= cfg->train.steps)
    return cfg_err(
        origin_of(org, "schedule.warmup_steps", &none), "schedule.warmup_steps",
        "%lld is not below train.steps (%lld): schedule %s has "
        "nothing left to decay",
        (long long)cfg->schedule.warmup_steps, (long long)cfg->train.steps,
        loom_sched_kind_names[cfg->schedule.name]);
  LOOM_TRY(check_sizes(cfg, org, &none));
  if (cfg->optim.name == LOOM_OPTIM_SGD && cfg->optim.nesterov &&
      cfg->optim.momentum == 0)
    return cfg_err(origin_of(org, "optim.nesterov", &none), "optim.nesterov",
                   "needs optim.momentum > 0");
  if (cfg->schedule.min_lr > cfg->optim.lr &&
      (cfg->schedule.name == LOOM_SCHED_COSINE ||
       cfg->schedule.name == LOOM_SCHED_LINEAR))
    return cfg_err(origin_of(org, "schedule.min_lr", &none), "schedule.min_lr",
                   "larger than optim.lr");
  /* Last: a rule about what the run does says more than this one. */
  return check_scoped(cfg, org, &none);
}

loom_status loom_config_checkpoint_every(const char *value, int *every) {
  int k = 0;
  if (!strcmp(value, "none"))
    k = 0;
  else if (!strcmp(value, "blocks"))
    k = 1;
  else if (strncmp(value, "every:", 6) != 0 || !loom_parse_int(value + 6, &k) ||
           k < 1 || value[6] == ' ' || value[6] == '+' || value[6] == '-')
    return loom_error(LOOM_ERR_CONFIG,
                      "train.activation_checkpointing: '%s': expected none, "
                      "blocks or every:K",
                      value);
  *every = k;
  return LOOM_OK;
}

loom_status loom_config_shard_unit(const char *value, int *every,
                                   int64_t *min_params) {
  int k = 1;
  int64_t n = 0;
  const char *v = value;
  bool ok = true;
  if (!strcmp(v, "blocks")) {
    k = 1;
  } else if (!strncmp(v, "every:", 6)) {
    ok = v[6] >= '0' && v[6] <= '9' && loom_parse_int(v + 6, &k) && k >= 1;
  } else if (!strncmp(v, "params:", 7)) {
    const char *end = NULL;
    ok = v[7] >= '0' && v[7] <= '9' && loom_parse_i64_at(v + 7, &end, &n);
    int64_t mult = 1;
    if (ok && *end) {
      mult = !strcmp(end, "K") || !strcmp(end, "k") ? 1000
             : !strcmp(end, "M")                    ? 1000000
             : !strcmp(end, "G")                    ? 1000000000
                                                    : 0;
      ok = mult > 0;
    }
    ok = ok && n >= 1 && n <= INT64_MAX / mult;
    n *= ok ? mult : 1;
  } else {
    ok = false;
  }
  if (!ok)
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.shard_unit: '%s': expected blocks, every:K "
                      "(K >= 1 units) or params:N (N >= 1 parameters, K/M/G "
                      "suffix allowed)",
                      value);
  *every = k;
  *min_params = n;
  return LOOM_OK;
}

loom_status loom_config_validate(const loom_config *cfg) {
  if (!cfg)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_validate: NULL");
  return check_config(cfg, NULL, NULL);
}

/* --------------------------------------------------------------- loading */

/* "runs/<stem>" and "<run_dir>/ckpt" for the paths left empty. */
static loom_status resolve_paths(loom_config *cfg, const cfg_origins *org,
                                 const char *name) {
  cfg_loc none = {name, NULL, 0, 0};
  if (!cfg->log.run_dir[0]) {
    const char *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : (name ? name : "config");
    size_t len = strlen(base);
    if (len > 5 && strcmp(base + len - 5, ".yaml") == 0)
      len -= 5;
    else if (len > 4 && strcmp(base + len - 4, ".yml") == 0)
      len -= 4;
    if (len == 0) {
      base = "config";
      len = 6;
    }
    int n = snprintf(cfg->log.run_dir, LOOM_CONFIG_STR_MAX, "runs/%.*s",
                     (int)len, base);
    if (n < 0 || n >= LOOM_CONFIG_STR_MAX)
      return cfg_err(&none, "log.run_dir", "longer than %d bytes",
                     LOOM_CONFIG_STR_MAX - 1);
  }
  if (!cfg->checkpoint.dir[0]) {
    int n = snprintf(cfg->checkpoint.dir, LOOM_CONFIG_STR_MAX, "%s/ckpt",
                     cfg->log.run_dir);
    if (n < 0 || n >= LOOM_CONFIG_STR_MAX)
      return cfg_err(origin_of(org, "log.run_dir", &none), "checkpoint.dir",
                     "<log.run_dir>/ckpt is longer than %d bytes",
                     LOOM_CONFIG_STR_MAX - 1);
  }
  return LOOM_OK;
}

loom_status loom_config_load_string(loom_config *cfg, const char *text,
                                    size_t len, const char *name,
                                    const char *const *sets, int n_sets) {
  if (!cfg || (!text && len) || n_sets < 0 || (n_sets && !sets))
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_load: bad argument");
  if (!name)
    name = "config";
  loom_config *work = loom_malloc(sizeof *work);
  cfg_origins *org = loom_calloc(1, sizeof *org);
  loom_status st = LOOM_OK;
  if (!work || !org) {
    st = loom_error(LOOM_ERR_NOMEM, "%s: out of memory", name);
    goto done;
  }
  loom_config_defaults(work);
  if (text) {
    yaml_parser_t p;
    yaml_document_t doc;
    cfg_loc where = {name, NULL, 0, 0};
    LOOM_TRY_GOTO(st, check_depth(text, len, &where, NULL), done);
    if (!yaml_parser_initialize(&p)) {
      st = loom_error(LOOM_ERR_NOMEM, "%s: out of memory", name);
      goto done;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    if (!yaml_parser_load(&p, &doc)) {
      st = parser_error(&p, text, len, &where, NULL);
      yaml_parser_delete(&p);
      goto done;
    }
    st = apply_document(work, org, &doc, name);
    yaml_document_delete(&doc);
    if (st == LOOM_OK) {
      /* A second document is almost always a stray '---'. */
      if (!yaml_parser_load(&p, &doc)) {
        st = parser_error(&p, text, len, &where, NULL);
      } else {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        if (root) {
          cfg_loc l = node_loc(name, root);
          st = cfg_err(&l, NULL, "a second YAML document; a config holds one");
        }
        yaml_document_delete(&doc);
      }
    }
    yaml_parser_delete(&p);
    if (st != LOOM_OK)
      goto done;
  }
  for (int i = 0; i < n_sets; i++) {
    if (!sets[i]) {
      st = loom_error(LOOM_ERR_INVALID_ARG, "--set: NULL argument");
      goto done;
    }
    LOOM_TRY_GOTO(st, apply_set(work, org, sets[i]), done);
  }
  /* train.steps alone sets the length: the default epoch limit (1) would
   * cut a run the config sized in steps. The resolved config says so. */
  if (work->train.steps > 0 && !origin_of(org, "train.epochs", NULL))
    work->train.epochs = 0;
  LOOM_TRY_GOTO(st, resolve_paths(work, org, name), done);
  LOOM_TRY_GOTO(st, check_config(work, org, name), done);
  *cfg = *work;
done:
  loom_free(work);
  loom_free(org);
  return st;
}

#define CONFIG_FILE_MAX (16 << 20)

loom_status loom_config_load(loom_config *cfg, const char *path,
                             const char *const *sets, int n_sets) {
  if (!cfg || !path)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_load: NULL argument");
  FILE *f = fopen(path, "rb");
  if (!f)
    return loom_error(LOOM_ERR_CONFIG, "%s: cannot open config: %s", path,
                      strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    int err = S_ISDIR(sb.st_mode) ? EISDIR : errno;
    fclose(f);
    return loom_error(LOOM_ERR_CONFIG, "%s: cannot read config: %s", path,
                      strerror(err ? err : EINVAL));
  }
  if (sb.st_size > CONFIG_FILE_MAX) {
    fclose(f);
    return loom_error(LOOM_ERR_CONFIG, "%s: larger than %d MiB; not a config",
                      path, CONFIG_FILE_MAX >> 20);
  }
  size_t cap = (size_t)sb.st_size;
  char *text = loom_malloc(cap + 1);
  if (!text) {
    fclose(f);
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory", path);
  }
  size_t len = fread(text, 1, cap, f);
  int err = ferror(f) ? errno : 0;
  fclose(f);
  loom_status st;
  if (err)
    st = loom_error(LOOM_ERR_CONFIG, "%s: cannot read config: %s", path,
                    strerror(err));
  else
    st = loom_config_load_string(cfg, text, len, path, sets, n_sets);
  loom_free(text);
  return st;
}

/* ---------------------------------------------------------------- output */

static void fmt_yaml_string(char *buf, size_t n, const char *s) {
  size_t o = 0;
  if (n < 3) {
    if (n)
      buf[0] = '\0';
    return;
  }
  buf[o++] = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p && o + 5 < n;
       p++) {
    if (*p == '"' || *p == '\\') {
      buf[o++] = '\\';
      buf[o++] = (char)*p;
    } else if (*p < 0x20 || *p == 0x7f) {
      o += (size_t)snprintf(buf + o, n - o, "\\x%02x", *p);
    } else {
      buf[o++] = (char)*p;
    }
  }
  buf[o++] = '"';
  buf[o] = '\0';
}

loom_status loom_config_format(const loom_config *cfg, const loom_config_key *k,
                               char *buf, size_t n) {
  if (!cfg || !k || !buf || n == 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_format: bad argument");
  const char *field = (const char *)cfg + k->offset;
  char tmp[LOOM_CONFIG_STR_MAX * 4 + 8];
  switch (k->type) {
  case LOOM_CFG_INT: {
    int64_t x;
    memcpy(&x, field, sizeof x);
    if (x == 0 && (k->flags & LOOM_CFG_AUTO))
      snprintf(tmp, sizeof tmp, "auto");
    else
      snprintf(tmp, sizeof tmp, "%lld", (long long)x);
    break;
  }
  case LOOM_CFG_FLOAT: {
    double x;
    memcpy(&x, field, sizeof x);
    fmt_double(tmp, sizeof tmp, x);
    break;
  }
  case LOOM_CFG_BOOL: {
    bool x;
    memcpy(&x, field, sizeof x);
    snprintf(tmp, sizeof tmp, "%s", x ? "true" : "false");
    break;
  }
  case LOOM_CFG_STRING: {
    char s[LOOM_CONFIG_STR_MAX];
    memcpy(s, field, sizeof s);
    s[sizeof s - 1] = '\0';
    fmt_yaml_string(tmp, sizeof tmp, s);
    break;
  }
  case LOOM_CFG_ENUM: {
    int x;
    memcpy(&x, field, sizeof x);
    snprintf(tmp, sizeof tmp, "%s",
             x >= 0 && x < k->n_values ? k->values[x] : "?");
    break;
  }
  case LOOM_CFG_INT_LIST: {
    const loom_config_ints *l = (const loom_config_ints *)(const void *)field;
    size_t o = (size_t)snprintf(tmp, sizeof tmp, "[");
    for (int i = 0; i < l->n && i < LOOM_CONFIG_LIST_MAX; i++)
      o += (size_t)snprintf(tmp + o, sizeof tmp - o, "%s%lld", i ? ", " : "",
                            (long long)l->v[i]);
    snprintf(tmp + o, sizeof tmp - o, "]");
    break;
  }
  default:
    return loom_error(LOOM_ERR_INTERNAL, "config: key type %d", (int)k->type);
  }
  if (strlen(tmp) >= n)
    return loom_error(LOOM_ERR_INVALID_ARG, "value of %s longer than %zu",
                      k->path, n);
  memcpy(buf, tmp, strlen(tmp) + 1);
  return LOOM_OK;
}

/* A growing text buffer over loom_malloc. */
typedef struct strbuf {
  char *p;
  size_t len, cap;
  bool failed;
} strbuf;

static void sb_add(strbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_add(strbuf *b, const char *fmt, ...) {
  if (b->failed)
    return;
  va_list ap;
  va_start(ap, fmt);
  int need = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (need < 0) {
    b->failed = true;
    return;
  }
  if (b->len + (size_t)need + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + (size_t)need + 1)
      cap *= 2;
    char *q = loom_malloc(cap);
    if (!q) {
      b->failed = true;
      return;
    }
    if (b->p)
      memcpy(q, b->p, b->len + 1);
    loom_free(b->p);
    b->p = q;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)need;
}

static loom_status sb_finish(strbuf *b, char **out, const char *what) {
  if (b->failed || !b->p) {
    loom_free(b->p);
    *out = NULL;
    return loom_error(LOOM_ERR_NOMEM, "%s: out of memory", what);
  }
  *out = b->p;
  return LOOM_OK;
}

loom_status loom_config_to_yaml(const loom_config *cfg, char **out) {
  if (!cfg || !out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_to_yaml: NULL");
  strbuf b = {0};
  char val[LOOM_CONFIG_STR_MAX * 4 + 8];
  const char *cur = NULL;
  size_t curlen = 0;
  for (size_t i = 0; i < NKEYS; i++) {
    const char *dot = strchr(keys[i].path, '.');
    size_t slen = (size_t)(dot - keys[i].path);
    if (!cur || slen != curlen || memcmp(cur, keys[i].path, slen) != 0) {
      sb_add(&b, "%s%.*s:\n", cur ? "\n" : "", (int)slen, keys[i].path);
      cur = keys[i].path;
      curlen = slen;
    }
    LOOM_TRY(loom_config_format(cfg, &keys[i], val, sizeof val));
    sb_add(&b, "  %s: %s\n", dot + 1, val);
  }
  return sb_finish(&b, out, "loom_config_to_yaml");
}

uint64_t loom_config_hash(const loom_config *cfg) {
  uint64_t h = LOOM_HASH64_INIT;
  char val[LOOM_CONFIG_STR_MAX * 4 + 8];
  for (size_t i = 0; i < NKEYS; i++) {
    if (keys[i].flags & LOOM_CFG_LOCAL)
      continue;
    if (loom_config_format(cfg, &keys[i], val, sizeof val) != LOOM_OK)
      val[0] = '\0';
    h = loom_hash64(h, keys[i].path, strlen(keys[i].path));
    h = loom_hash64(h, "=", 1);
    h = loom_hash64(h, val, strlen(val));
    h = loom_hash64(h, "\n", 1);
  }
  return h;
}

bool loom_config_equal(const loom_config *a, const loom_config *b) {
  char va[LOOM_CONFIG_STR_MAX * 4 + 8], vb[LOOM_CONFIG_STR_MAX * 4 + 8];
  for (size_t i = 0; i < NKEYS; i++) {
    if (loom_config_format(a, &keys[i], va, sizeof va) != LOOM_OK ||
        loom_config_format(b, &keys[i], vb, sizeof vb) != LOOM_OK ||
        strcmp(va, vb) != 0)
      return false;
  }
  return true;
}

static void md_range(char *buf, size_t n, const loom_config_key *k) {
  if (k->type == LOOM_CFG_ENUM) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < k->n_values && o < n; i++)
      o += (size_t)snprintf(buf + o, n - o, "%s`%s`%s", i ? ", " : "",
                            k->values[i],
                            (k->todo_values & (1u << i)) ? " (not yet)" : "");
  } else if (k->type == LOOM_CFG_INT || k->type == LOOM_CFG_FLOAT) {
    fmt_range(buf, n, k);
  } else if (k->type == LOOM_CFG_INT_LIST) {
    char r[96];
    fmt_range(r, sizeof r, k);
    snprintf(buf, n, "%d to %d items, each %s", k->list_min,
             LOOM_CONFIG_LIST_MAX, r);
  } else if (k->type == LOOM_CFG_STRING) {
    snprintf(buf, n, "up to %d bytes", LOOM_CONFIG_STR_MAX - 1);
  } else {
    snprintf(buf, n, "`true`, `false`");
  }
}

loom_status loom_config_schema_markdown(char **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_config_schema_markdown");
  strbuf b = {0};
  const char *cur = NULL;
  size_t curlen = 0;
  for (size_t i = 0; i < NKEYS; i++) {
    const loom_config_key *k = &keys[i];
    const char *dot = strchr(k->path, '.');
    size_t slen = (size_t)(dot - k->path);
    if (!cur || slen != curlen || memcmp(cur, k->path, slen) != 0) {
      sb_add(&b, "%s### %.*s\n\n", cur ? "\n" : "", (int)slen, k->path);
      sb_add(&b, "| key | type | default | allowed | description |\n");
      sb_add(&b, "|---|---|---|---|---|\n");
      cur = k->path;
      curlen = slen;
    }
    char range[512], todo[256] = "";
    md_range(range, sizeof range, k);
    if (k->flags & LOOM_CFG_TODO) {
      snprintf(range, sizeof range, "`%s` only (not yet)", k->def);
      snprintf(todo, sizeof todo,
               ". **Not implemented yet**: only the default; %s", k->todo);
    } else if (k->todo_values) {
      snprintf(todo, sizeof todo,
               ". **Values marked (not yet) are errors**: %s", k->todo);
    }
    sb_add(&b, "| `%s` | %s | `%s` | %s | %s%s%s |\n", k->path,
           type_names[k->type], k->def, range, k->help, todo,
           (k->flags & LOOM_CFG_LOCAL) ? " *(local: not in the config hash)*"
                                       : "");
  }
  return sb_finish(&b, out, "loom_config_schema_markdown");
}
