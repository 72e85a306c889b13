/* 2-D convolution through oneDNN's convolution primitives (direct JIT
 * kernels on blocked layouts), used when the GEMM backend is dnnl: about 2x
 * the im2col path on the CNN's second layer. The batch is cut into at most
 * LOOM_CONV_SLOTS chunks of nb images (nb from N alone); each chunk runs the
 * primitives on one thread (oneDNN runs serially inside a parallel region),
 * weight-gradient partials are added in chunk order, and nothing but the
 * shape decides what is summed where: the bits do not depend on the thread
 * count. Primitives are built once per shape and cached. Scratch (blocked
 * copies, partials, oneDNN's scratchpad) lives in the caller's col buffer.
 * The half sets (bf16 on a CPU with a bf16 unit, f16 on one with
 * AVX512-FP16 and oneDNN 3.x) take half input, weights and output gradient
 * and give f32 output, input and weight gradients (f32 sums inside
 * oneDNN's kernels); they chunk the batch as the f32 set does, so they
 * keep the same thread-count invariance. */
#include "internal.h"

#ifdef LOOM_HAVE_DNNL
#include "dnnl_compat.h"
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

/* A tensor as one primitive wants it, and the reorder between that layout
 * and the plain one (into the primitive for inputs, out of it for outputs;
 * NULL when the primitive takes the plain layout). */
typedef struct conv_view {
  dnnl_memory_desc_t md;
  dnnl_primitive_t reorder;
  dnnl_memory_desc_t pad; /* the reorder's scratchpad */
} conv_view;

/* Primitives and layouts for one minibatch size. Each primitive picks its
 * own layouts ("any"): forcing backward onto the forward's layouts sends
 * oneDNN to its slow reference kernels (backward data wants the weights
 * transposed in blocks). */
typedef struct conv_set {
  int mb;
  /* plain (nchw, oihw, x): inputs src_u, wei_u, dst_i of the operand type
   * (f32 or bf16), outputs dst_u, src_o, wei_o and the bias in f32 */
  dnnl_memory_desc_t src_u, dst_u, wei_u, bias;
  dnnl_memory_desc_t dst_i, src_o, wei_o;
  dnnl_primitive_t fwd, bwd_d, bwd_w;
  dnnl_memory_desc_t pad_fwd, pad_bwd_d, pad_bwd_w; /* scratchpads */
  conv_view f_src, f_wei, f_dst;                    /* forward: in, in, out */
  conv_view d_ddst, d_wei, d_dsrc; /* backward data: in, in, out */
  conv_view w_src, w_ddst, w_dwei; /* backward weights: in, in, out */
  size_t pad_bytes;                /* the largest scratchpad */
} conv_set;

typedef struct conv_entry {
  loom_conv2d_dims key; /* N is the minibatch size */
  loom_dtype dt;        /* of the operands: f32, bf16 or f16 */
  conv_set *set;        /* NULL: oneDNN cannot do this shape */
} conv_entry;

/* Shapes (with their minibatch sizes) kept; a model has a few per layer. */
#define CACHE_MAX 256
static conv_entry g_cache[CACHE_MAX];
static int g_ncache;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void) {
  if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success)
    g_engine = NULL;
}

static bool same_key(const loom_conv2d_dims *a, const loom_conv2d_dims *b) {
  return a->N == b->N && a->C == b->C && a->H == b->H && a->W == b->W &&
         a->OC == b->OC && a->KH == b->KH && a->KW == b->KW &&
         a->stride == b->stride && a->pad == b->pad;
}

/* Every primitive takes its scratchpad from us (one per chunk), so chunks
 * can run concurrently and all memory stays in the caller's buffer. */
static dnnl_primitive_attr_t user_pad_attr(void) {
  dnnl_primitive_attr_t attr = NULL;
  if (dnnl_primitive_attr_create(&attr) != dnnl_success)
    return NULL;
  dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  return attr;
}

static bool note_pad(dnnl_primitive_desc_t pd, dnnl_memory_desc_t *pad,
                     size_t *most) {
  loom_md_ref md =
      dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (!md)
    return true;
  size_t sz = dnnl_memory_desc_get_size(md);
  if (sz > *most)
    *most = sz;
  return md_copy(pad, md);
}

/* view->md = what pd wants for `what`; a reorder from/to `plain`. */
static bool make_view(conv_view *v, dnnl_primitive_desc_t pd, dnnl_query_t what,
                      loom_md_ref plain, bool into, size_t *most) {
  v->reorder = NULL;
  if (!md_copy(&v->md, dnnl_primitive_desc_query_md(pd, what, 0)))
    return false;
  if (dnnl_memory_desc_equal(MD(v->md), plain))
    return true;
  dnnl_primitive_attr_t attr = user_pad_attr();
  dnnl_primitive_desc_t rpd = NULL;
  dnnl_status_t st = dnnl_reorder_primitive_desc_create(
      &rpd, into ? plain : MD(v->md), g_engine, into ? MD(v->md) : plain,
      g_engine, attr);
  dnnl_primitive_attr_destroy(attr);
  if (st != dnnl_success)
    return false;
  bool ok = note_pad(rpd, &v->pad, most) &&
            dnnl_primitive_create(&v->reorder, rpd) == dnnl_success;
  dnnl_primitive_desc_destroy(rpd);
  return ok;
}

static const char *impl_name(dnnl_primitive_desc_t pd) {
  const char *s = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) !=
          dnnl_success ||
      !s)
    return "?";
  return s;
}

static void set_free(conv_set *s) {
  if (!s)
    return;
  dnnl_primitive_t p[] = {s->fwd, s->bwd_d, s->bwd_w};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
    if (p[i])
      dnnl_primitive_destroy(p[i]);
  conv_view *v[] = {&s->f_src,  &s->f_wei, &s->f_dst,  &s->d_ddst, &s->d_wei,
                    &s->d_dsrc, &s->w_src, &s->w_ddst, &s->w_dwei};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    if (v[i]->reorder)
      dnnl_primitive_destroy(v[i]->reorder);
    md_free(&v[i]->md);
    md_free(&v[i]->pad);
  }
  dnnl_memory_desc_t *m[] = {
      &s->src_u, &s->dst_u, &s->wei_u,   &s->bias,      &s->dst_i,
      &s->src_o, &s->wei_o, &s->pad_fwd, &s->pad_bwd_d, &s->pad_bwd_w};
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    md_free(m[i]);
  loom_free(s);
}

/* A reference kernel (oneDNN's "ref:any", orders of magnitude slower)
 * means: this shape has no fast kernel. */
static bool is_ref(dnnl_primitive_desc_t pd) {
  return strncmp(impl_name(pd), "ref", 3) == 0;
}

static conv_set *set_build(const loom_conv2d_dims *d, loom_dtype dt) {
  const int OH = loom_conv2d_out_h(d), OW = loom_conv2d_out_w(d);
  conv_set *s = loom_calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->mb = d->N;
  dnnl_dims_t sd = {d->N, d->C, d->H, d->W}, wd = {d->OC, d->C, d->KH, d->KW};
  dnnl_dims_t bd = {d->OC}, dd = {d->N, d->OC, OH, OW};
  dnnl_dims_t strides = {d->stride, d->stride}, pad = {d->pad, d->pad};
  const dnnl_data_type_t t = dt == LOOM_BF16  ? dnnl_bf16
                             : dt == LOOM_F16 ? dnnl_f16
                                              : dnnl_f32;
  const dnnl_format_tag_t any = dnnl_format_tag_any;
  /* sa, wa, da: the operands' layouts (any), of type t; sa_o, wa_o, da_o:
   * the f32 results' (forward output, input and weight gradients) */
  dnnl_memory_desc_t sa = MD_NONE, wa = MD_NONE, da = MD_NONE, sa_o = MD_NONE,
                     wa_o = MD_NONE, da_o = MD_NONE;
  bool ok = md_tag(&s->src_u, 4, sd, t, dnnl_nchw) &&
            md_tag(&s->wei_u, 4, wd, t, dnnl_oihw) &&
            md_tag(&s->dst_i, 4, dd, t, dnnl_nchw) &&
            md_tag(&s->bias, 1, bd, dnnl_f32, dnnl_x) &&
            md_tag(&s->dst_u, 4, dd, dnnl_f32, dnnl_nchw) &&
            md_tag(&s->src_o, 4, sd, dnnl_f32, dnnl_nchw) &&
            md_tag(&s->wei_o, 4, wd, dnnl_f32, dnnl_oihw) &&
            md_tag(&sa, 4, sd, t, any) && md_tag(&wa, 4, wd, t, any) &&
            md_tag(&da, 4, dd, t, any) && md_tag(&sa_o, 4, sd, dnnl_f32, any) &&
            md_tag(&wa_o, 4, wd, dnnl_f32, any) &&
            md_tag(&da_o, 4, dd, dnnl_f32, any);
  dnnl_primitive_attr_t attr = user_pad_attr();
  dnnl_primitive_desc_t fpd = NULL, bdpd = NULL, bwpd = NULL;
  ok = ok && attr &&
       pd_conv_fwd(&fpd, g_engine, MD(sa), MD(wa), MD(s->bias), MD(da_o),
                   strides, pad, attr) == dnnl_success &&
       pd_conv_bwd_data(&bdpd, g_engine, MD(sa_o), MD(wa), MD(da), strides, pad,
                        fpd, attr) == dnnl_success &&
       pd_conv_bwd_weights(&bwpd, g_engine, MD(sa), MD(wa_o), MD(da), strides,
                           pad, fpd, attr) == dnnl_success;
  if (attr)
    dnnl_primitive_attr_destroy(attr);
  dnnl_memory_desc_t *tmp[] = {&sa, &wa, &da, &sa_o, &wa_o, &da_o};
  for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++)
    md_free(tmp[i]);
  size_t most = 0;
  if (ok) {
    LOOM_DEBUG("conv2d %s mb=%d C=%d %dx%d OC=%d K=%dx%d: oneDNN fwd %s, bwd "
               "data %s, bwd weights %s",
               loom_dtype_name(dt), d->N, d->C, d->H, d->W, d->OC, d->KH, d->KW,
               impl_name(fpd), impl_name(bdpd), impl_name(bwpd));
    /* a half type has no use for a reference kernel: converting to f32 is
     * faster */
    if (dt != LOOM_F32 && (is_ref(fpd) || is_ref(bdpd) || is_ref(bwpd)))
      ok = false;
  }
  if (ok) {
    ok = note_pad(fpd, &s->pad_fwd, &most) &&
         note_pad(bdpd, &s->pad_bwd_d, &most) &&
         note_pad(bwpd, &s->pad_bwd_w, &most) &&
         make_view(&s->f_src, fpd, dnnl_query_src_md, MD(s->src_u), true,
                   &most) &&
         make_view(&s->f_wei, fpd, dnnl_query_weights_md, MD(s->wei_u), true,
                   &most) &&
         make_view(&s->f_dst, fpd, dnnl_query_dst_md, MD(s->dst_u), false,
                   &most) &&
         make_view(&s->d_ddst, bdpd, dnnl_query_diff_dst_md, MD(s->dst_i), true,
                   &most) &&
         make_view(&s->d_wei, bdpd, dnnl_query_weights_md, MD(s->wei_u), true,
                   &most) &&
         make_view(&s->d_dsrc, bdpd, dnnl_query_diff_src_md, MD(s->src_o),
                   false, &most) &&
         make_view(&s->w_src, bwpd, dnnl_query_src_md, MD(s->src_u), true,
                   &most) &&
         make_view(&s->w_ddst, bwpd, dnnl_query_diff_dst_md, MD(s->dst_i), true,
                   &most) &&
         make_view(&s->w_dwei, bwpd, dnnl_query_diff_weights_md, MD(s->wei_o),
                   false, &most) &&
         dnnl_primitive_create(&s->fwd, fpd) == dnnl_success &&
         dnnl_primitive_create(&s->bwd_d, bdpd) == dnnl_success &&
         dnnl_primitive_create(&s->bwd_w, bwpd) == dnnl_success;
  }
  if (fpd)
    dnnl_primitive_desc_destroy(fpd);
  if (bdpd)
    dnnl_primitive_desc_destroy(bdpd);
  if (bwpd)
    dnnl_primitive_desc_destroy(bwpd);
  if (!ok) {
    set_free(s);
    return NULL;
  }
  s->pad_bytes = most;
  return s;
}

/* The cached set for these dims with minibatch mb, built on first use. */
static conv_set *set_get(const loom_conv2d_dims *d, int mb, loom_dtype dt) {
  pthread_once(&g_engine_once, engine_init);
  if (!g_engine)
    return NULL;
  loom_conv2d_dims key = *d;
  key.N = mb;
  conv_set *found = NULL;
  pthread_mutex_lock(&g_lock);
  int i = 0;
  for (; i < g_ncache; i++)
    if (g_cache[i].dt == dt && same_key(&g_cache[i].key, &key))
      break;
  if (i < g_ncache) {
    found = g_cache[i].set;
  } else if (g_ncache < CACHE_MAX) { /* full: im2col for new shapes */
    /* Some kernels fix their thread split when built (e.g. a barrier
     * between the threads of a weight-gradient reduction); we always run
     * them on one thread, so build them for one. */
    const int save = omp_get_max_threads();
    omp_set_num_threads(1);
    found = set_build(&key, dt);
    omp_set_num_threads(save);
    g_cache[g_ncache].key = key;
    g_cache[g_ncache].dt = dt;
    g_cache[g_ncache].set = found; /* NULL too: do not try again */
    g_ncache++;
  }
  pthread_mutex_unlock(&g_lock);
  return found;
}

/* ------------------------------------------------------------ the plan */

#define ALIGN16(x) (((x) + 15) / 16 * 16)

/* Where things go in col: shared weights first, then one region per chunk
 * (offsets in floats, 64-byte aligned). */
typedef struct dnnl_plan {
  int nb, nchunks, rem;
  conv_set *full, *last; /* minibatch nb, and the last chunk's */
  int64_t wf_off, wd_off, zb_off, slots_off;
  /* in a chunk's region: input-shaped and output-shaped blocked buffers
   * (a, b, b2), the plain input gradient (xp), the blocked and plain
   * weight-gradient partials (wb, wp), oneDNN's scratchpad */
  int64_t a_off, b_off, b2_off, xp_off, wb_off, wp_off, pad_off, per_slot;
} dnnl_plan;

static int64_t md_floats(loom_md_ref md) {
  return ALIGN16((int64_t)(dnnl_memory_desc_get_size(md) / sizeof(float)));
}

static int64_t max3(int64_t a, int64_t b, int64_t c) {
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

static bool plan_make(const loom_conv2d_dims *d, loom_dtype dt, dnnl_plan *p) {
  p->nb = (d->N + LOOM_CONV_SLOTS - 1) / LOOM_CONV_SLOTS;
  p->nchunks = (d->N + p->nb - 1) / p->nb;
  p->rem = d->N - (p->nchunks - 1) * p->nb;
  p->full = set_get(d, p->nb, dt);
  p->last = p->rem == p->nb ? p->full : set_get(d, p->rem, dt);
  if (!p->full || !p->last)
    return false;
  const conv_set *f = p->full; /* the larger minibatch: its sizes bound */
  p->wf_off = 0;
  p->wd_off = p->wf_off + md_floats(MD(f->f_wei.md));
  p->zb_off = p->wd_off + md_floats(MD(f->d_wei.md));
  p->slots_off = p->zb_off + ALIGN16((int64_t)d->OC);
  p->a_off = 0;
  p->b_off =
      p->a_off + max3(md_floats(MD(f->f_src.md)), md_floats(MD(f->w_src.md)),
                      md_floats(MD(f->d_dsrc.md)));
  p->b2_off = p->b_off +
              max3(md_floats(MD(f->f_dst.md)), md_floats(MD(f->w_ddst.md)), 0);
  p->xp_off = p->b2_off + md_floats(MD(f->d_ddst.md));
  p->wb_off = p->xp_off + md_floats(MD(f->src_o));
  p->wp_off = p->wb_off + md_floats(MD(f->w_dwei.md));
  p->pad_off = p->wp_off + md_floats(MD(f->wei_o));
  size_t pad =
      f->pad_bytes > p->last->pad_bytes ? f->pad_bytes : p->last->pad_bytes;
  p->per_slot = p->pad_off + ALIGN16((int64_t)(pad / sizeof(float)) + 16);
  return true;
}

static int64_t plan_floats(const loom_conv2d_dims *d, loom_dtype dt) {
  dnnl_plan p;
  if (!plan_make(d, dt, &p))
    return 0;
  return p.slots_off + (int64_t)p.nchunks * p.per_slot;
}

/* Enough for the f32 set and, on a CPU with a bf16 or f16 unit, the half
 * ones (a model's precision is not known here). */
int64_t loom_kern_conv_dnnl_floats(const loom_conv2d_dims *d) {
  int64_t most = plan_floats(d, LOOM_F32);
  const loom_cpu_features *cf = loom_cpu_get_features();
  if (most == 0)
    return 0;
  if (cf->avx512_bf16 || cf->amx_bf16) {
    const int64_t b = plan_floats(d, LOOM_BF16);
    most = b > most ? b : most;
  }
  if (cf->avx512_fp16) {
    const int64_t h = plan_floats(d, LOOM_F16);
    most = h > most ? h : most;
  }
  return most;
}

/* ------------------------------------------------------------ execution */

/* One thread's stream, and whether anything failed on it. */
typedef struct exec_ctx {
  dnnl_stream_t stream;
  int failed;
} exec_ctx;

/* An argument of a primitive: its descriptor and where its data is. */
typedef struct exec_arg {
  int arg;
  loom_md_ref md;
  void *ptr;
} exec_arg;

/* Executes p; the memory objects wrap our pointers for this call only. */
static void run(exec_ctx *c, dnnl_primitive_t p, const exec_arg *a, int n) {
  if (c->failed || !p)
    return;
  dnnl_exec_arg_t args[8];
  dnnl_memory_t mem[8];
  int made = 0;
  for (int i = 0; i < n; i++) {
    if (!a[i].md) /* 3.x: no scratchpad */
      continue;
    if (dnnl_memory_create(&mem[made], a[i].md, g_engine, a[i].ptr) !=
        dnnl_success) {
      c->failed = 1;
      break;
    }
    args[made].arg = a[i].arg;
    args[made].memory = mem[made];
    made++;
  }
  if (!c->failed &&
      dnnl_primitive_execute(p, c->stream, made, args) != dnnl_success)
    c->failed = 1;
  for (int i = 0; i < made; i++)
    dnnl_memory_destroy(mem[i]);
}

/* Brings plain data into v's layout at `buf`, or returns the plain data
 * when v takes it as is. */
static void *view_in(exec_ctx *c, const conv_view *v, loom_md_ref plain,
                     const void *data, void *buf, float *pad) {
  if (!v->reorder)
    return (void *)data;
  exec_arg a[3] = {{DNNL_ARG_FROM, plain, (void *)data},
                   {DNNL_ARG_TO, MD(v->md), buf},
                   {DNNL_ARG_SCRATCHPAD, MD(v->pad), pad}};
  run(c, v->reorder, a, 3);
  return buf;
}

/* Takes v-layout data at `from` to plain `to` (nothing when the same). */
static void view_out(exec_ctx *c, const conv_view *v, loom_md_ref plain,
                     const float *from, float *to, float *pad) {
  if (!v->reorder)
    return;
  exec_arg a[3] = {{DNNL_ARG_FROM, MD(v->md), (void *)from},
                   {DNNL_ARG_TO, plain, to},
                   {DNNL_ARG_SCRATCHPAD, MD(v->pad), pad}};
  run(c, v->reorder, a, 3);
}

/* Runs the statement (with slot and ctx) for every chunk on at most
 * min(threads, chunks) threads, fewer when the `flops` of all chunks are few
 * (loom_kern_nthreads_flops), each with its own stream; oneDNN is held to
 * one thread per chunk. */
/* clang-format off */
#define CONV_PARALLEL(plan, flops, failed, ...)                                \
  do {                                                                         \
    const int cp_nt = loom_kern_nthreads_flops((plan).nchunks, (flops));       \
    int cp_save = 0;                                                           \
    if (cp_nt == 1 && !omp_in_parallel() &&                                    \
        (cp_save = omp_get_max_threads()) > 1)                                 \
      omp_set_num_threads(1);                                                  \
    _Pragma("omp parallel num_threads(cp_nt) if (cp_nt > 1)")                  \
    {                                                                          \
      exec_ctx ctx = {NULL, 0};                                                \
      if (dnnl_stream_create(&ctx.stream, g_engine,                            \
                             dnnl_stream_default_flags) != dnnl_success)       \
        ctx.failed = 1;                                                        \
      _Pragma("omp for schedule(static)")                                      \
      for (int slot = 0; slot < (plan).nchunks; slot++) {                      \
        __VA_ARGS__;                                                           \
      }                                                                        \
      if (ctx.stream) {                                                        \
        if (dnnl_stream_wait(ctx.stream) != dnnl_success)                      \
          ctx.failed = 1;                                                      \
        dnnl_stream_destroy(ctx.stream);                                       \
      }                                                                        \
      if (ctx.failed)                                                          \
        atomic_store(&(failed), 1);                                            \
    }                                                                          \
    if (cp_save > 1)                                                           \
      omp_set_num_threads(cp_save);                                            \
  } while (0)
/* clang-format on */

/* Weights in view v's layout, shared read-only by all chunks: reordered
 * once into col at `off`, before the chunks run (so chunk 0's scratchpad is
 * free to use). */
static const void *shared_weights(const dnnl_plan *p, const conv_view *v,
                                  const void *weight, float *col, int64_t off,
                                  int *failed) {
  if (!v->reorder)
    return weight;
  exec_ctx c = {NULL, 0};
  if (dnnl_stream_create(&c.stream, g_engine, dnnl_stream_default_flags) !=
      dnnl_success) {
    *failed = 1;
    return weight;
  }
  float *pad = col + p->slots_off + p->pad_off;
  view_in(&c, v, MD(p->full->wei_u), weight, col + off, pad);
  if (dnnl_stream_wait(c.stream) != dnnl_success)
    c.failed = 1;
  dnnl_stream_destroy(c.stream);
  *failed |= c.failed;
  return col + off;
}

/* inp, weight: of type dt (f32, bf16 or f16) */
static loom_status conv_forward(float *out, float *col, const void *inp,
                                const void *weight, const float *bias,
                                const loom_conv2d_dims *d, loom_dtype dt) {
  dnnl_plan p;
  if (!plan_make(d, dt, &p))
    return LOOM_ERR_UNSUPPORTED;
  const size_t es = dt == LOOM_F32 ? sizeof(float) : sizeof(uint16_t);
  int wfail = 0;
  const void *wf =
      shared_weights(&p, &p.full->f_wei, weight, col, p.wf_off, &wfail);
  if (!bias) { /* one primitive with a bias serves both cases */
    memset(col + p.zb_off, 0, (size_t)d->OC * sizeof(float));
    bias = col + p.zb_off;
  }
  const int64_t in_img = (int64_t)d->C * d->H * d->W;
  const int64_t out_img =
      (int64_t)d->OC * loom_conv2d_out_h(d) * loom_conv2d_out_w(d);
  atomic_int failed = wfail;
  const double flops = loom_kern_conv_flops(d, 1);
  CONV_PARALLEL(p, flops, failed, {
    const conv_set *s = slot == p.nchunks - 1 ? p.last : p.full;
    float *sc = col + p.slots_off + slot * p.per_slot, *pad = sc + p.pad_off;
    const int64_t n0 = (int64_t)slot * p.nb;
    float *y = out + n0 * out_img;
    void *xs = view_in(&ctx, &s->f_src, MD(s->src_u),
                       (const char *)inp + n0 * in_img * es, sc + p.a_off, pad);
    float *ys = s->f_dst.reorder ? sc + p.b_off : y;
    exec_arg a[5] = {{DNNL_ARG_SRC, MD(s->f_src.md), xs},
                     {DNNL_ARG_WEIGHTS, MD(s->f_wei.md), (void *)wf},
                     {DNNL_ARG_BIAS, MD(s->bias), (void *)bias},
                     {DNNL_ARG_DST, MD(s->f_dst.md), ys},
                     {DNNL_ARG_SCRATCHPAD, MD(s->pad_fwd), pad}};
    run(&ctx, s->fwd, a, 5);
    view_out(&ctx, &s->f_dst, MD(s->dst_u), ys, y, pad);
  });
  if (atomic_load(&failed))
    return loom_error(LOOM_ERR_INTERNAL, "conv2d forward: oneDNN failed");
  return LOOM_OK;
}

/* dout, inp, weight: of type dt (f32, bf16 or f16) */
static loom_status conv_backward(float *dinp, float *dweight, float *col,
                                 const void *dout, const void *inp,
                                 const void *weight, const loom_conv2d_dims *d,
                                 loom_dtype dt) {
  dnnl_plan p;
  if (!plan_make(d, dt, &p))
    return LOOM_ERR_UNSUPPORTED;
  const size_t es = dt == LOOM_F32 ? sizeof(float) : sizeof(uint16_t);
  int wfail = 0;
  const void *wd =
      dinp ? shared_weights(&p, &p.full->d_wei, weight, col, p.wd_off, &wfail)
           : weight;
  const int64_t in_img = (int64_t)d->C * d->H * d->W;
  const int64_t out_img =
      (int64_t)d->OC * loom_conv2d_out_h(d) * loom_conv2d_out_w(d);
  atomic_int failed = wfail;
  const double flops =
      loom_kern_conv_flops(d, (dinp != NULL) + (dweight != NULL));
  CONV_PARALLEL(p, flops, failed, {
    const conv_set *s = slot == p.nchunks - 1 ? p.last : p.full;
    float *sc = col + p.slots_off + slot * p.per_slot, *pad = sc + p.pad_off;
    const int64_t n0 = (int64_t)slot * p.nb;
    const void *dy = (const char *)dout + n0 * out_img * es;
    void *dyw = NULL;
    if (dweight) {
      float *wp = sc + p.wp_off; /* (OC, C, KH, KW) partial of this chunk */
      float *wb = s->w_dwei.reorder ? sc + p.wb_off : wp;
      void *xs =
          view_in(&ctx, &s->w_src, MD(s->src_u),
                  (const char *)inp + n0 * in_img * es, sc + p.a_off, pad);
      dyw = view_in(&ctx, &s->w_ddst, MD(s->dst_i), dy, sc + p.b_off, pad);
      exec_arg a[4] = {{DNNL_ARG_SRC, MD(s->w_src.md), xs},
                       {DNNL_ARG_DIFF_DST, MD(s->w_ddst.md), dyw},
                       {DNNL_ARG_DIFF_WEIGHTS, MD(s->w_dwei.md), wb},
                       {DNNL_ARG_SCRATCHPAD, MD(s->pad_bwd_w), pad}};
      run(&ctx, s->bwd_w, a, 4);
      view_out(&ctx, &s->w_dwei, MD(s->wei_o), wb, wp, pad);
    }
    if (dinp) {
      /* oneDNN overwrites its output and our contract adds: the chunk's
       * input gradient goes to plain scratch xp, then is added in (a reorder
       * with a sum post-op would add in place, but oneDNN runs that through
       * a slow reference kernel). */
      void *dyd =
          dyw && dnnl_memory_desc_equal(MD(s->d_ddst.md), MD(s->w_ddst.md))
              ? dyw
              : view_in(&ctx, &s->d_ddst, MD(s->dst_i), dy, sc + p.b2_off, pad);
      float *xp = sc + p.xp_off;                          /* (mb, C, H, W) */
      float *dxs = s->d_dsrc.reorder ? sc + p.a_off : xp; /* a is free now */
      exec_arg a[4] = {{DNNL_ARG_DIFF_DST, MD(s->d_ddst.md), dyd},
                       {DNNL_ARG_WEIGHTS, MD(s->d_wei.md), (void *)wd},
                       {DNNL_ARG_DIFF_SRC, MD(s->d_dsrc.md), dxs},
                       {DNNL_ARG_SCRATCHPAD, MD(s->pad_bwd_d), pad}};
      run(&ctx, s->bwd_d, a, 4);
      view_out(&ctx, &s->d_dsrc, MD(s->src_o), dxs, xp, pad);
      if (dnnl_stream_wait(ctx.stream) != dnnl_success)
        ctx.failed = 1;
      float *dx = dinp + n0 * in_img;
      const int64_t n = (int64_t)s->mb * in_img;
      for (int64_t i = 0; i < n; i++)
        dx[i] += xp[i];
    }
  });
  if (atomic_load(&failed))
    return loom_error(LOOM_ERR_INTERNAL, "conv2d backward: oneDNN failed");
  if (dweight) {
    const float *slots = col + p.slots_off;
    const int64_t nw = (int64_t)d->OC * d->C * d->KH * d->KW;
    const int nr = loom_kern_nthreads(nw * p.nchunks, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nr) schedule(static) if (nr > 1)
    for (int64_t e = 0; e < nw; e++) {
      float sum = 0.0f;
      for (int s = 0; s < p.nchunks; s++)
        sum += slots[s * p.per_slot + p.wp_off + e];
      dweight[e] += sum;
    }
  }
  return LOOM_OK;
}

loom_status loom_kern_conv_dnnl_forward(float *out, float *col,
                                        const float *inp, const float *weight,
                                        const float *bias,
                                        const loom_conv2d_dims *d) {
  return conv_forward(out, col, inp, weight, bias, d, LOOM_F32);
}

loom_status loom_kern_conv_dnnl_backward(float *dinp, float *dweight,
                                         float *col, const float *dout,
                                         const float *inp, const float *weight,
                                         const loom_conv2d_dims *d) {
  return conv_backward(dinp, dweight, col, dout, inp, weight, d, LOOM_F32);
}

loom_status loom_kern_conv_dnnl_forward_half(loom_dtype dt, float *out,
                                             float *col, const uint16_t *inp,
                                             const uint16_t *weight,
                                             const float *bias,
                                             const loom_conv2d_dims *d) {
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return LOOM_ERR_UNSUPPORTED;
  return conv_forward(out, col, inp, weight, bias, d, dt);
}

loom_status loom_kern_conv_dnnl_backward_half(loom_dtype dt, float *dinp,
                                              float *dweight, float *col,
                                              const uint16_t *dout,
                                              const uint16_t *inp,
                                              const uint16_t *weight,
                                              const loom_conv2d_dims *d) {
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return LOOM_ERR_UNSUPPORTED;
  return conv_backward(dinp, dweight, col, dout, inp, weight, d, dt);
}

#else /* !LOOM_HAVE_DNNL */

int64_t loom_kern_conv_dnnl_floats(const loom_conv2d_dims *d) {
  (void)d;
  return 0;
}

loom_status loom_kern_conv_dnnl_forward(float *out, float *col,
                                        const float *inp, const float *weight,
                                        const float *bias,
                                        const loom_conv2d_dims *d) {
  (void)out, (void)col, (void)inp, (void)weight, (void)bias, (void)d;
  return LOOM_ERR_UNSUPPORTED;
}

loom_status loom_kern_conv_dnnl_backward(float *dinp, float *dweight,
                                         float *col, const float *dout,
                                         const float *inp, const float *weight,
                                         const loom_conv2d_dims *d) {
  (void)dinp, (void)dweight, (void)col, (void)dout, (void)inp, (void)weight,
      (void)d;
  return LOOM_ERR_UNSUPPORTED;
}

loom_status loom_kern_conv_dnnl_forward_half(loom_dtype dt, float *out,
                                             float *col, const uint16_t *inp,
                                             const uint16_t *weight,
                                             const float *bias,
                                             const loom_conv2d_dims *d) {
  (void)dt, (void)out, (void)col, (void)inp, (void)weight, (void)bias, (void)d;
  return LOOM_ERR_UNSUPPORTED;
}

loom_status loom_kern_conv_dnnl_backward_half(loom_dtype dt, float *dinp,
                                              float *dweight, float *col,
                                              const uint16_t *dout,
                                              const uint16_t *inp,
                                              const uint16_t *weight,
                                              const loom_conv2d_dims *d) {
  (void)dt, (void)dinp, (void)dweight, (void)col, (void)dout, (void)inp,
      (void)weight, (void)d;
  return LOOM_ERR_UNSUPPORTED;
}

#endif
