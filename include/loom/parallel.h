/* loom parallel: data-parallel training (DDP) of a model over a group:
 * start-up broadcast and consistency check, gradient buckets reduced on the
 * communication thread as backward finalises them, no_sync accumulation,
 * compressed reduction, uneven inputs (join) and the world-size-invariant
 * deterministic reduction over virtual shards. */
#ifndef LOOM_PARALLEL_H
#define LOOM_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/core.h"
#include "loom/nn.h"
#include "loom/optim.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ------------------------------------------------------------- concepts
 *
 * Letters: N elements of the model's flat layout, P ranks of the group,
 * V virtual shards (deterministic mode), S = V / P shards per rank.
 *
 * A step on every rank (B rows of its own data each):
 *
 *   loom_ddp_zero_grad(d);
 *   for (m = 0; m < k; m++) {                 accumulation over k batches
 *     loom_ddp_set_sync(d, m == k - 1);       reduce on the last one only
 *     forward; loss backward with scale 1/k; loom_model_backward(...);
 *   }
 *   loom_ddp_step(d, optim, lr);              or loom_ddp_wait + own step
 *
 * Buckets: the flat gradient buffer is cut into contiguous slices in reverse
 * parameter order (backward finalises the last parameters first): the first
 * of first_bucket_mb, then of bucket_mb. The model's gradient hook counts
 * the parameters of each bucket; when the last one is final the bucket's
 * persistent all-reduce (average, in place) is started on the communication
 * thread while backward goes on. Buckets are started in index order on every
 * rank, which keeps the collectives in the same order everywhere.
 * loom_ddp_step waits for the buckets one by one and steps each bucket's
 * range as soon as it is reduced, so the optimizer overlaps the reduction of
 * the later buckets.
 *
 * Deterministic mode (opts.deterministic): the global batch of every micro-
 * batch is V shards of equal size; rank r holds shards [r*S, (r+1)*S).
 * Each shard's gradient is computed apart (loom_ddp_shard_begin binds the
 * model's gradient to the shard's buffer), then the V shard gradients are
 * averaged in one fixed binary tree: pairs of neighbours (a+b)/2, then pairs
 * of pairs, and so on. A rank averages its own subtree; ranks combine
 * subtrees level by level with partners 2^l apart (an all-reduce of two
 * ranks per level, whose sum of two numbers is the same bits in either
 * order). The tree does not depend on P, so P = 1, 2, 4, ... give bitwise
 * equal gradients, hence equal weights. P and V must be powers of two with
 * P dividing V; the kernels must give the same bits for the same shard on
 * every rank (same thread count per rank). */

typedef struct loom_ddp loom_ddp;

typedef struct loom_ddp_opts {
  double bucket_mb;       /* MiB per bucket (25, as PyTorch); 0 = one bucket */
  double first_bucket_mb; /* MiB of the first bucket (1); 0 = bucket_mb */
  /* Buckets close once they reach 1/min_buckets of the model when that is
   * less than bucket_mb (8): about that many buckets, so that a small
   * model's reduction overlaps backward too (25 MiB buckets are made for
   * models of gigabytes). 0 or 1: bucket_mb alone decides. */
  int min_buckets;
  /* Element type on the wire: LOOM_F32 (no compression), LOOM_BF16 or
   * LOOM_F16 (buckets converted before and after the all-reduce). */
  loom_dtype compress;
  bool deterministic; /* false */
  int virtual_shards; /* V (8); deterministic only */
  /* Every rank's config hash and the model's layout hash are compared with
   * rank 0's at start; a difference is LOOM_ERR_MISMATCH naming the ranks.
   * check_config false skips the config (the layout is always checked). */
  bool check_config;    /* false */
  uint64_t config_hash; /* loom_config_hash() of this rank's config */
  bool broadcast;       /* rank 0's parameters replace the others' (true) */
  /* Ranks may run out of data at different steps: each sync step adds a
   * small all-reduce of the number of active ranks, and a rank without data
   * calls loom_ddp_join instead of training (false). */
  bool uneven;
  /* ZeRO-2 and ZeRO-3: sharded gradients. Rank r keeps only elements
   * [shard_bounds[r], shard_bounds[r + 1]) of the reduced gradient: each
   * bucket is reduced to the ranks whose slices it covers (one reduce per
   * owner, the volume of a reduce-scatter) as backward finalises it, and
   * the rest of the bucket's memory goes back to the system once that is
   * done, so no rank holds the whole gradient after backward. The gradient
   * buffer is then the DDP's own (a model made with shape_only works).
   * Deterministic mode reduces by the same tree as without sharding (the
   * same bits) and then gives back what is not owned. (world + 1) entries,
   * ascending, from 0 to the number of parameters; borrowed for d's life.
   * NULL: every rank gets the whole gradient (DDP, ZeRO-1). */
  const int64_t *shard_bounds;
} loom_ddp_opts;

loom_ddp_opts loom_ddp_opts_default(void);

/* Collective over g: checks the layout (and config) hashes against rank 0's,
 * broadcasts rank 0's parameters, cuts the buckets and installs the model's
 * gradient hook (the model and g are borrowed and must outlive d). Errors:
 * LOOM_ERR_MISMATCH (different config or model between ranks, on every
 * rank), LOOM_ERR_INVALID_ARG (bad options: deterministic with P or V not a
 * power of two, or V not a multiple of P), LOOM_ERR_NOMEM. */
loom_status loom_ddp_new(loom_ddp **out, loom_model *model, loom_group *g,
                         const loom_ddp_opts *opts);
/* Waits for reductions in flight, removes the hook, gives the model back
 * its own gradient buffer; NULL is a no-op. */
void loom_ddp_free(loom_ddp *d);

int loom_ddp_rank(const loom_ddp *d);
int loom_ddp_world(const loom_ddp *d);
loom_model *loom_ddp_model(loom_ddp *d);
const loom_ddp_opts *loom_ddp_get_opts(const loom_ddp *d);

/* Buckets, in the order they are reduced: elements [*begin, *end) of the
 * flat layout, and the number of parameters in each. */
int loom_ddp_num_buckets(const loom_ddp *d);
loom_status loom_ddp_bucket(const loom_ddp *d, int i, int64_t *begin,
                            int64_t *end, int *nparams);

/* Zeroes the gradients for a new step (every shard buffer in deterministic
 * mode). Waits for reductions still in flight first. */
loom_status loom_ddp_zero_grad(loom_ddp *d);
/* Whether the next backward passes reduce (true, the default) or only
 * accumulate locally (false: PyTorch's no_sync). It stays as set. */
void loom_ddp_set_sync(loom_ddp *d, bool sync);
bool loom_ddp_get_sync(const loom_ddp *d);

/* Starts every bucket that backward did not start (parameters that got no
 * gradient, a rank with an empty batch), so that all ranks reduce every
 * bucket. loom_ddp_wait and loom_ddp_step call it. */
loom_status loom_ddp_finish_backward(loom_ddp *d);
/* Waits until bucket i is reduced (and converted back from the wire type). */
loom_status loom_ddp_wait_bucket(loom_ddp *d, int i);
/* Waits until every bucket is reduced: the model's gradient buffer then holds
 * the gradient averaged over ranks (over shards in deterministic mode). */
loom_status loom_ddp_wait(loom_ddp *d);
/* One optimizer step: each bucket's range is stepped with
 * loom_optim_step_range as soon as it is reduced, then
 * loom_optim_finish_step. A sharded optimizer (opts shard_begin/shard_end:
 * ZeRO-1) steps only the part of each bucket in its shard; gathering the
 * other ranks' parameters afterwards is the caller's (loom_allgatherv). */
loom_status loom_ddp_step(loom_ddp *d, loom_optim *o, float lr);

/* Uneven inputs (opts.uneven): a rank that has no batch for this step calls
 * this instead of forward and backward. It contributes a zero gradient and
 * takes part in the reductions so that the other ranks never wait for it;
 * the average is over the ranks that still train. *done = true when every
 * rank has joined (nothing was reduced: leave the loop); else finish the
 * step as the others do (loom_ddp_step), which keeps the replicas equal. */
loom_status loom_ddp_join(loom_ddp *d, bool *done);

/* Sharded gradients (opts.shard_bounds): the global sum of squares of the
 * reduced gradient, each rank adding its slice (collective; call after
 * loom_ddp_wait). With slices that start at multiples of LOOM_GRAD_CHUNK
 * it has the bits of loom_grad_sumsq over the whole gradient. */
loom_status loom_ddp_grad_sumsq(loom_ddp *d, double *out);
/* Bytes of the gradient buffer in memory now, and the most seen as buckets
 * were started (sharded: page granularity; else the whole buffer). */
void loom_ddp_grad_resident(const loom_ddp *d, size_t *now, size_t *peak);

/* Deterministic mode: this rank's virtual shards are [*first, *first +
 * *count) of the V of every micro-batch (rows [j*R, (j+1)*R) of the global
 * batch for shard j, R = global rows / V). */
void loom_ddp_shards(const loom_ddp *d, int *first, int *count);
/* Makes the next backward add into local shard j's buffer (0 <= j < count).
 * Run forward and backward of each local shard in order j = 0, 1, ...; the
 * last shard's backward of a sync micro-batch starts the reductions. */
loom_status loom_ddp_shard_begin(loom_ddp *d, int j);

/* Sums of k small values (loss, counts) over the data of all ranks, posted
 * without blocking (say, after forward, so they travel before the buckets).
 * local holds k values per local virtual shard in deterministic mode,
 * (S, k), summed over the V shards in shard order (so the result does not
 * depend on P); else (k), summed over ranks. k <= LOOM_DDP_SUM_MAX. */
#define LOOM_DDP_SUM_MAX 8
loom_status loom_ddp_sum_post(loom_ddp *d, const double *local, int k);
loom_status loom_ddp_sum_wait(loom_ddp *d, double *out);

/* What communication cost, for profiles. */
typedef struct loom_ddp_stats {
  int64_t steps;      /* reducing steps so far */
  int64_t buckets;    /* buckets per step */
  int64_t wire_bytes; /* bytes per rank per step given to all-reduces */
  double reduce_s;    /* communication-thread time of the reductions */
  double wait_s;      /* time the caller was blocked waiting for them */
  double last_reduce_s, last_wait_s; /* the same for the last step */
} loom_ddp_stats;

void loom_ddp_get_stats(const loom_ddp *d, loom_ddp_stats *out);
void loom_ddp_reset_stats(loom_ddp *d);
/* Share of the reduction time hidden behind computation:
 * 1 - wait_s / reduce_s, clamped to [0, 1] (1 when nothing was reduced). */
double loom_ddp_hidden_share(const loom_ddp_stats *s);

/* ============================================================== ZeRO-3 */

/* Sharded parameters (ZeRO-3, PyTorch's FSDP FULL_SHARD): rank r keeps
 * elements [bounds[r], bounds[r + 1]) of the flat parameters (its slice,
 * which its sharded optimizer steps; use it with a DDP whose gradients are
 * sharded by the same bounds). The model's parameter buffer becomes
 * reserved memory of which only the slice stays: each unit's parameters
 * (loom_model_unit_ranges) are all-gathered just before its forward and
 * again before its backward, and given back after; the next unit's gather
 * is posted while the current one computes, in both directions. So no rank
 * holds all parameters at once: at most two or three units and its slice.
 *
 *   loom_zero3_new(&z, model, g, bounds);    binds the parameter buffer
 *   (write the parameters: init or a checkpoint) loom_zero3_shard(z);
 *   each step: forward, backward, optimizer on the slice, nothing else.
 *
 * Every rank must run the same passes (the gathers are collectives on g,
 * in order with g's other operations). */
typedef struct loom_zero3 loom_zero3;

/* Collective over g (nothing is sent yet). bounds: (size of g + 1)
 * entries from 0 to the number of parameters, ascending, borrowed for z's
 * life. The model (borrowed, must outlive z) reads its parameters from z's
 * buffer from now on; that buffer starts as zeros: write every parameter
 * (loom_model_init_params, a checkpoint) and call loom_zero3_shard. */
loom_status loom_zero3_new(loom_zero3 **out, loom_model *model, loom_group *g,
                           const int64_t *bounds);

/* What ZeRO-3 gathers at once (config parallel.shard_unit): the model's
 * units (loom_model_num_units: a transformer block, a layer) one by one
 * (every 1, the default), `every` consecutive ones together, or, when
 * min_params > 0, consecutive ones together until each group holds at
 * least min_params parameters (the last group may hold fewer; PyTorch's
 * size-based wrap policy). Fewer, larger units: fewer and longer gathers
 * (better on slow links, or units too small to overlap), more memory. */
typedef struct loom_zero3_opts {
  int every;          /* >= 1 */
  int64_t min_params; /* > 0: group by size instead */
} loom_zero3_opts;
loom_zero3_opts loom_zero3_opts_default(void);
/* loom_zero3_new with opts (NULL: the defaults). */
loom_status loom_zero3_new_opts(loom_zero3 **out, loom_model *model,
                                loom_group *g, const int64_t *bounds,
                                const loom_zero3_opts *opts);
/* The grouping of opts (NULL: defaults) for m: writes each model unit's
 * group into group_of (loom_model_num_units entries) and returns the
 * number of groups. No allocation, no communication (a shape-only model
 * works: loom estimate sizes the groups with it). */
int loom_zero3_group_units(const loom_model *m, const loom_zero3_opts *o,
                           int *group_of);
/* Parameters that group g gathers (its units' ranges merged: a tied weight
 * counts once); -1 when out of memory. */
int64_t loom_zero3_group_numel(const loom_model *m, const int *group_of, int g);
/* Waits for gathers in flight, gives the model back its own buffer. */
void loom_zero3_free(loom_zero3 *z);
/* Draws this rank's slice of the initial parameters (the values of
 * loom_model_init_params), one view at a time: no more than the slice and
 * the largest view are ever in memory. No communication. */
loom_status loom_zero3_init_params(loom_zero3 *z);
/* Keeps this rank's slice of the parameters and gives back the rest (after
 * the whole buffer was written). Also drops any unit still gathered: call
 * it after the optimizer changed the slices, before the next forward. */
loom_status loom_zero3_shard(loom_zero3 *z);
/* Bytes of the parameter buffer resident now, and the most seen at a unit
 * boundary since the last loom_zero3_shard (page granularity). */
void loom_zero3_resident(const loom_zero3 *z, size_t *now, size_t *peak);

/* ============================================================ pipeline */

/* Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B, Narayanan et al.
 * 2019, PipeDream-Flush): the model's units (loom_model_num_units: the
 * children of its root sequential) are cut into P contiguous stages, one
 * per rank of a pipeline group; a stage's own parameters are then one
 * contiguous range of the flat buffers. Each rank's batch is cut into M
 * micro-batches; activations go forward and their gradients backward
 * between neighbouring stages by loom_send / loom_recv on the
 * communication thread, receives posted ahead.
 *
 * A stage runs K copies of its part of the model (instances made by the
 * caller's function, buffers bound to the model's): one per micro-batch in
 * flight, each with its own activation arena; backward adds into the one
 * gradient buffer, so micro-batches accumulate. GPipe keeps all M in
 * flight (K = M); 1F1B keeps at most P - s on stage s (K = min(M, P - s)).
 * Both run the backward passes in micro-batch order 0, 1, ..., M-1, so they
 * add the same gradients in the same order: the same bits.
 *
 * Weights read by a stage that does not own them (GPT's output layer reads
 * the token embedding, owned by stage 0) are borrowed: after backward the
 * borrower sends its gradient of them to the owner, which adds it
 * (loom_pipe_finish_grads); after the optimizer the owner sends the new
 * values back (loom_pipe_sync_params). With a data-parallel group the
 * owned range's gradient is then summed over it (in chunks, in place, or
 * through a 16-bit copy with loom_pipe_opts.compress). */

#define LOOM_PIPE_SCHEDULE_LIST(X)                                             \
  X(LOOM_PIPE_GPIPE, "gpipe")                                                  \
  X(LOOM_PIPE_1F1B, "1f1b")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_PIPE_SCHEDULE_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_PIPE_SCHEDULE_COUNT
} loom_pipe_schedule;
const char *loom_pipe_schedule_name(loom_pipe_schedule s);

typedef struct loom_pipe loom_pipe;

/* Makes one more copy of the model, same layout, without buffers of its
 * own (loom_model_opts.shape_only): the pipeline binds them. */
typedef loom_status (*loom_pipe_model_fn)(void *user, loom_model **out);

typedef struct loom_pipe_opts {
  int micro_batches;           /* M (1) */
  loom_pipe_schedule schedule; /* LOOM_PIPE_1F1B */
  /* Units of each stage ((P) entries adding up to the model's units), or
   * NULL: balanced, contiguous stages minimising the largest sum of
   * unit_cost (the units' parameter counts when unit_cost is NULL). */
  const int *split;
  const double *unit_cost; /* (units) estimated compute of each unit */
  /* The micro-batch's input shape at stage 0 (rows = dim[0] the most of a
   * micro-batch); each stage's input shape follows from it. */
  loom_shape input;
  /* Elements per chunk of the data-parallel sum of the gradients (0: one
   * chunk). */
  int64_t chunk;
  /* Element type of that sum on the wire: LOOM_F32 (no compression, the
   * default), LOOM_BF16 or LOOM_F16 (as loom_ddp_opts.compress): each
   * chunk (with cuts, each piece) is converted into a 16-bit copy of the
   * stage's range when its sum is posted, times the dp size D so that
   * each replica's own mean gradient is on the wire as under DDP (its
   * share of the sum is 1/D of it), averaged in that type (the comm layer
   * adds in f32 and rounds once per combination), and widened back
   * into the f32 gradient by loom_pipe_finish_grads (with cuts, the
   * rank's cut only). The copy, 2 bytes an element of the owned range, is
   * counted in LOOM_MEM_COMM; with cuts its pages are given back after
   * each sum. */
  loom_dtype compress;
} loom_pipe_opts;
loom_pipe_opts loom_pipe_opts_default(void);

/* Stage boundaries for P stages of n units: writes first (P + 1 entries:
 * stage s runs units [first[s], first[s + 1])) from split (P units counts)
 * or, when split is NULL, from cost (n) minimising the most expensive
 * stage (every stage gets one unit at least). LOOM_ERR_INVALID_ARG when
 * P > n or split does not add up to n. */
loom_status loom_pipe_partition(int n, int P, const int *split,
                                const double *cost, int *first);
/* cum (n + 1 entries, n = the model's units): where unit u's own
 * parameters begin, cum[n] the model's size; stage s of a partition owns
 * [cum[first[s]], cum[first[s + 1]]). A unit's range below cum[u] is
 * borrowed (tied) from an earlier unit. LOOM_ERR_INVALID_ARG when the
 * units' own parameters do not follow each other in forward order. */
loom_status loom_pipe_own_bounds(const loom_model *m, int64_t *cum);

/* Collective over pp (each rank is the stage of its rank in pp) and dp
 * (NULL or one rank: no data parallelism; otherwise the ranks holding the
 * same stage of other replicas). model (borrowed) gives the layout and the
 * buffers: the stage reads and writes only its ranges of them
 * (loom_pipe_ranges). make is called K times. */
loom_status loom_pipe_new(loom_pipe **out, loom_model *model, loom_group *pp,
                          loom_group *dp, loom_pipe_model_fn make, void *user,
                          const loom_pipe_opts *opts);
void loom_pipe_free(loom_pipe *p);

int loom_pipe_stage(const loom_pipe *p);
int loom_pipe_stages(const loom_pipe *p);
/* Instances this stage keeps (activations of K micro-batches). */
int loom_pipe_instances(const loom_pipe *p);
/* This stage's units [*first, *end) and owned range of the flat buffers
 * [*lo, *hi) (what its optimizer steps and its checkpoint slice holds). */
void loom_pipe_units(const loom_pipe *p, int *first, int *end);
void loom_pipe_owned(const loom_pipe *p, int64_t *lo, int64_t *hi);
/* Every stage's owned range: bounds (P + 1 entries), stage s owning
 * [bounds[s], bounds[s + 1]). */
void loom_pipe_bounds(const loom_pipe *p, int64_t *bounds);
/* Bytes of the instances' activation arenas and the stage's buffers of
 * received activations and their gradients. */
size_t loom_pipe_act_bytes(const loom_pipe *p);
/* Every range the stage reads: owned and borrowed, merged; *n entries. */
const loom_range *loom_pipe_ranges(const loom_pipe *p, int *n);

/* What a step needs from its caller. prepare: before micro-batch mb's
 * forward on every stage (set the instance's dropout keys with
 * loom_model_set_step); on stage 0 it also points *x at mb's input (rows
 * rows). loss: on the last stage, after mb's forward: the output y; in a
 * training step write the gradient of the step's loss with respect to y
 * into dy (its shape); dy is NULL in a forward-only pass. */
typedef struct loom_pipe_io {
  loom_status (*prepare)(void *user, int mb, loom_model *inst, loom_tensor *x);
  loom_status (*loss)(void *user, int mb, const loom_tensor *y,
                      loom_tensor *dy);
  void *user;
  /* The step's last pass (of train.accumulate): on stage 0, whose
   * backward ends the step, each chunk of its range starts its sum over
   * dp as soon as the last micro-batch's backward made it final, so the
   * sum overlaps that backward. (Other stages finish earlier and their
   * sums run while stage 0 computes; overlapping theirs would hold back
   * the input gradients they send, queued behind the sums.) */
  bool last;
} loom_pipe_io;

/* One training pass of the schedule over micro-batches 0..M-1, rows[mb]
 * rows each (the same on every stage; 0 skips a micro-batch). Gradients
 * add into the model's gradient buffer (clear the stage's ranges with
 * loom_pipe_zero_grad first). */
loom_status loom_pipe_step(loom_pipe *p, const int64_t *rows,
                           const loom_pipe_io *io);
/* Forward only (evaluation): the micro-batches through the stages, in
 * order; loss gets dy NULL. n micro-batches. */
loom_status loom_pipe_forward(loom_pipe *p, int n, const int64_t *rows,
                              const loom_pipe_io *io);
/* Clears the gradients of every range the stage reads. */
void loom_pipe_zero_grad(loom_pipe *p);
/* bf16/f16 instances share one half copy of the ranges the stage reads,
 * made again at the next pass after this is called (after each optimizer
 * step and loom_pipe_sync_params; a new pipeline makes it at its first
 * pass). loom_pipe_half_bytes: its bytes (0 in f32). */
void loom_pipe_params_updated(loom_pipe *p);
size_t loom_pipe_half_bytes(const loom_pipe *p);
/* After loom_pipe_step: borrowed gradients added into their owners', then
 * the owned range summed over dp. */
loom_status loom_pipe_finish_grads(loom_pipe *p);
/* ZeRO-2 (call once, after loom_pipe_new; a no-op without dp): the owned
 * range's gradient is reduced to the replica whose cut holds each piece
 * instead of summed on every replica. cuts (dp size + 1 entries, copied):
 * replica d of the stage keeps [cuts[d], cuts[d + 1]); cuts[0] and
 * cuts[dp size] are the owned range's bounds. After loom_pipe_finish_grads
 * only the rank's cut of the owned range holds the replicas' sum. */
loom_status loom_pipe_set_cuts(loom_pipe *p, const int64_t *cuts);
/* The global sum of squares of the gradient (each stage its owned range,
 * summed over pp; collective over pp). */
loom_status loom_pipe_grad_sumsq(loom_pipe *p, double *out);
/* After the optimizer stepped the owned ranges: owners send borrowed
 * weights' new values to their borrowers (collective over pp). */
loom_status loom_pipe_sync_params(loom_pipe *p);
void loom_pipe_set_training(loom_pipe *p, bool training);

/* What a training step's schedule did, for a timeline: micro-batch mb's
 * forward (with the loss on the last stage) or backward, or a time the
 * stage was blocked on a neighbour (mb: the micro-batch it was about to
 * compute; -1 in the step's final drain of sends and receives). t0 and t1
 * are the readings of loom_time_now that loom_pipe_stats adds up, so a
 * step's events sum to its forward_s, backward_s and wait_s. */
typedef enum {
  LOOM_PIPE_EV_FORWARD,
  LOOM_PIPE_EV_BACKWARD,
  LOOM_PIPE_EV_WAIT,
  LOOM_PIPE_EV_COUNT
} loom_pipe_event;
typedef void (*loom_pipe_observer)(void *user, loom_pipe_event ev, int mb,
                                   double t0, double t1);
/* Calls fn during loom_pipe_step (not loom_pipe_forward); NULL: none. */
void loom_pipe_set_observer(loom_pipe *p, loom_pipe_observer fn, void *user);

/* Per-step times: the last step's and the sums since the last reset. */
typedef struct loom_pipe_stats {
  int64_t steps;
  double step_s;     /* from the first forward to the last wait of a step */
  double wait_s;     /* blocked on neighbours (activations, gradients,
                        borrowed weights) within it */
  double forward_s;  /* forward of the instances (and the loss) */
  double backward_s; /* their backward */
  double sync_s;     /* borrowed weights' exchanges and the dp sum */
  double last_step_s, last_wait_s;
  int64_t dp_chunks;       /* chunks of the range summed over dp */
  int64_t dp_chunks_early; /* of them, started during the last backward */
  /* bytes handed to the dp sum: elements x the wire type's size (as
   * loom_ddp_stats.wire_bytes) */
  int64_t dp_wire_bytes;
} loom_pipe_stats;
void loom_pipe_get_stats(const loom_pipe *p, loom_pipe_stats *out);
void loom_pipe_reset_stats(loom_pipe *p);
/* The ideal idle share of a stage, (P - 1) / (M + P - 1). */
double loom_pipe_bubble_theory(int stages, int micro_batches);
/* The idle share a fill-drain schedule (GPipe, 1F1B) gives stages of
 * unequal compute: stage s computes busy[s] seconds a step (M
 * micro-batches of busy[s] / M each), nothing is lost between stages, so
 * the step lasts (M - 1) max_s t_s + sum_s t_s (t_s = busy[s] / M) and
 * stage s idles 1 - busy[s] / step; the mean over the stages. Equal stages
 * give loom_pipe_bubble_theory; the difference is what the stages'
 * imbalance costs. 0 when nothing was measured. */
double loom_pipe_bubble_expected(int stages, int micro_batches,
                                 const double *busy);

/* ------------------------------------------------- tensor parallelism
 *
 * A GPT built with loom_gpt_opts.tp is one rank's part of the whole model
 * (docs/parallel.md "Tensor parallelism"); its modules reduce over the
 * group through a loom_tp. Its flat buffers hold its part of each cut
 * parameter and the whole of the others, in the whole model's order; the
 * map below says where each piece lies in the whole model's canonical
 * layout, which checkpoints keep whatever the mesh. */

/* The loom_tp of group g (borrowed): its reductions are loom_allreduce
 * requests on g, LOOM_TP_SLOTS of them at a time. */
typedef struct loom_tp_group loom_tp_group;
loom_status loom_tp_group_new(loom_tp_group **out, loom_group *g);
const loom_tp *loom_tp_group_tp(const loom_tp_group *t);
void loom_tp_group_free(loom_tp_group *t);
/* Since the group's loom_tp was made: all-reductions posted and the
 * bytes of their buffers; sequence parallelism's all-gathers and
 * reduce-scatters and the bytes of their whole (size x part) buffers;
 * the bytes a rank sends for all of them by the ring algorithms' count
 * (an all-reduce of b bytes 2 (T-1)/T b, an all-gather or reduce-scatter
 * (T-1)/T b: sequence parallelism sends what plain tensor parallelism
 * does); and the time the caller was blocked waiting for them (the
 * collectives' cost that compute did not hide). */
typedef struct loom_tp_stats {
  uint64_t reductions, bytes;
  uint64_t gathers, scatters, seq_bytes;
  double wire_bytes;
  double wait_s;
} loom_tp_stats;
void loom_tp_group_stats(const loom_tp_group *t, loom_tp_stats *out);

/* A piece of a rank's flat buffers: numel elements at `local` that are
 * elements [whole, whole + numel) of the whole model's; of view `view`;
 * shared: a parameter every rank holds whole. */
typedef struct loom_tp_seg {
  int64_t local, whole, numel;
  int view;
  bool shared;
} loom_tp_seg;
typedef struct loom_tp_map loom_tp_map;
/* local: any rank's model of a group of `size` (their shapes are the
 * same), whole: the model without tensor parallelism (shape_only does). */
loom_status loom_tp_map_new(loom_tp_map **out, const loom_model *local,
                            const loom_model *whole, int size);
void loom_tp_map_free(loom_tp_map *m);
/* Rank r's pieces, ascending in both layouts; *n their number. */
const loom_tp_seg *loom_tp_map_segs(const loom_tp_map *m, int rank, int *n);
int64_t loom_tp_map_whole_numel(const loom_tp_map *m);
/* Rank r's buffer from the whole layout: fetch gives elements [begin, end)
 * of the whole buffer (within view `view`: the whole view, or a shared
 * view's elements) into dst. Only the views that lie within one of the
 * ranges of the rank's layout (a pipeline stage's: loom_pipe_ranges);
 * ranges NULL: every view. local holds the rank's layout from element
 * `base` on (0; a stage's optimizer state: its first element's). */
typedef loom_status (*loom_tp_fetch_fn)(void *user, int view, int64_t begin,
                                        int64_t end, float *dst);
loom_status loom_tp_map_fill(const loom_tp_map *m, int rank,
                             const loom_range *ranges, int nranges,
                             loom_tp_fetch_fn fetch, void *user, float *local,
                             int64_t base);
/* Rank r's part of the whole model's initial values (loom_model_draw_view
 * of `whole`), for the views within ranges as above: the values one
 * rank's run starts from. */
loom_status loom_tp_map_init(const loom_tp_map *m, int rank,
                             const loom_model *whole, const loom_range *ranges,
                             int nranges, float *local);
/* The sum of squares of the whole gradient's elements in [lo, hi) of the
 * rank's layout (of a view that the range splits, its piece within): the
 * cut views' squares summed over g, the shared ones (the same on every
 * rank) once. Collective over g. */
loom_status loom_tp_map_sumsq(const loom_tp_map *m, loom_group *g,
                              const float *grads, int64_t lo, int64_t hi,
                              double *out);
/* Collective over g (its ranks are the map's): rank t gets elements
 * [lo[t], hi[t]) of the whole layout into dst, put together from every
 * rank's buffer `local` (each piece from the rank that holds it; shared
 * ones from its own; local holds the rank's layout from element `base`
 * on, as above). lo and hi: every rank's, the same on all. */
loom_status loom_tp_map_gather(const loom_tp_map *m, loom_group *g,
                               const float *local, int64_t base,
                               const int64_t *lo, const int64_t *hi,
                               float *dst);

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_PARALLEL_H */
