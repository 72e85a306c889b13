/* loom report's plots, drawn through a pen so that the page (SVG) and the
 * PNG files (a raster) show the same thing: curves over steps, stacked bars
 * of a step's parts and of memory by category, and each rank's parts. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "report.h"

enum {
  ML = 76, /* margins of the plot area */
  MR = 18,
  MT = 50,
  MB = 46,
  TEXT_PX = 12,
  TITLE_PX = 14,
};
#define INK 0x222222u
#define GRID 0xe2e2e2u
#define AXIS 0x555555u

static const uint32_t palette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728,
                                   0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f,
                                   0xbcbd22, 0x17becf};

/* The data to plot area mapping. */
typedef struct frame {
  double x0, x1, y0, y1;     /* data ranges */
  double px0, px1, py0, py1; /* pixels: left, right, bottom, top */
} frame;

static double fx(const frame *f, double x) {
  return f->px0 + (x - f->x0) / (f->x1 - f->x0) * (f->px1 - f->px0);
}
static double fy(const frame *f, double y) {
  return f->py0 - (y - f->y0) / (f->y1 - f->y0) * (f->py0 - f->py1);
}

/* A step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double range, int want) {
  double raw = range / want;
  double mag = pow(10, floor(log10(raw)));
  double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static void fmt_tick(char *buf, size_t n, double v, double step) {
  if (fabs(v) < step * 1e-6)
    v = 0;
  if (fabs(v) >= 1e5 || (fabs(v) < 1e-3 && v != 0))
    snprintf(buf, n, "%.2g", v);
  else
    snprintf(buf, n, "%.4g", v);
}

/* Pads a range that is a point, then rounds it out to whole ticks. */
static void range_fix(double *lo, double *hi, bool from_zero) {
  if (!isfinite(*lo) || !isfinite(*hi)) {
    *lo = 0;
    *hi = 1;
  }
  if (from_zero && *lo > 0)
    *lo = 0;
  if (*hi - *lo < 1e-12 * (fabs(*hi) + 1)) {
    double d = fabs(*hi) > 0 ? fabs(*hi) * 0.1 : 1;
    *lo -= from_zero && *lo == 0 ? 0 : d;
    *hi += d;
  }
}

static void legend(const rp_pen *p, const char *const *names,
                   const uint32_t *colors, int n) {
  double x = RP_PLOT_W - MR;
  for (int i = n - 1; i >= 0; i--) {
    double w = 0.62 * TEXT_PX * (double)strlen(names[i]);
    p->text(p->ctx, x, MT - 16, names[i], INK, TEXT_PX, 1, false);
    x -= w + 6;
    p->rect(p->ctx, x - 10, MT - 21, 10, 10, colors[i], 1);
    x -= 24;
  }
}

/* Title, grid, axes and their labels; the frame for the data. */
static frame axes(const rp_pen *p, const char *title, const char *xlabel,
                  const char *ylabel, double x0, double x1, double y0,
                  double y1, bool int_x) {
  frame f = {x0, x1, y0, y1, ML, RP_PLOT_W - MR, RP_PLOT_H - MB, MT};
  p->rect(p->ctx, 0, 0, RP_PLOT_W, RP_PLOT_H, 0xffffff, 1);
  p->text(p->ctx, ML, 16, title, INK, TITLE_PX, -1, false);
  double ys = nice_step(y1 - y0, 5);
  double yt = ceil(y0 / ys);
  for (int i = 0; i < 64 && (yt + i) * ys <= y1 + ys * 1e-9; i++) {
    double v = (yt + i) * ys;
    double y = fy(&f, v);
    p->line(p->ctx, f.px0, y, f.px1, y, GRID, 1);
    char b[32];
    fmt_tick(b, sizeof b, v, ys);
    p->text(p->ctx, f.px0 - 6, y, b, INK, TEXT_PX, 1, false);
  }
  double xs = nice_step(x1 - x0, 8);
  if (int_x && xs < 1)
    xs = 1;
  double xt = ceil(x0 / xs);
  for (int i = 0; i < 64 && (xt + i) * xs <= x1 + xs * 1e-9; i++) {
    double v = (xt + i) * xs;
    double x = fx(&f, v);
    p->line(p->ctx, x, f.py0, x, f.py0 + 4, AXIS, 1);
    char b[32];
    fmt_tick(b, sizeof b, v, xs);
    p->text(p->ctx, x, f.py0 + 14, b, INK, TEXT_PX, 0, false);
  }
  p->line(p->ctx, f.px0, f.py0, f.px1, f.py0, AXIS, 1);
  p->line(p->ctx, f.px0, f.py0, f.px0, f.py1, AXIS, 1);
  p->text(p->ctx, (f.px0 + f.px1) / 2, RP_PLOT_H - 10, xlabel, INK, TEXT_PX, 0,
          false);
  p->text(p->ctx, 14, (f.py0 + f.py1) / 2, ylabel, INK, TEXT_PX, 0, true);
  return f;
}

/* -------------------------------------------------------------- thinning */

/* A curve is drawn through at most two points a pixel column of the plot
 * area: more say nothing more and made a 200,000-line run a 95 MB page.
 * A longer series is cut into THIN_RUNS runs of consecutive points (in
 * file order, so a resume that goes back in steps is drawn as before) and
 * each run keeps its lowest and its highest point, in order: min/max
 * decimation, which keeps every spike where a mean would hide it. */
enum {
  THIN_RUNS = RP_PLOT_W - ML - MR, /* the plot area's pixel columns */
  THIN_MAX = 2 * THIN_RUNS,        /* more points than this are thinned */
  /* a run's lowest, highest and a break; the first and last points */
  THIN_OUT = 3 * THIN_RUNS + 2,
};
_Static_assert(THIN_OUT >= THIN_MAX, "a short series' indices fit in idx");

/* A point a run keeps: its index, or a break in the line there. */
typedef struct thin_ev {
  int at;
  bool brk;
} thin_ev;

/* The points of s to draw, as indices into s in order, into idx (-1: a
 * break in the line); their count. A series of THIN_MAX points or fewer
 * gives all of its indices (drawn exactly as they always were). Else each
 * run gives the indices of its lowest and highest finite value (y * scale),
 * and a break where it holds a non-finite one (the line stops there, as it
 * does for every non-finite point of a short series); the series' first and
 * last points are kept too, so that the curve spans its steps. What was
 * thinned goes into *t under name. */
static int thin(const rp_series *s, double scale, const char *name,
                rp_thinned *t, int idx[THIN_OUT]) {
  int n = s->n;
  if (n <= THIN_MAX) {
    for (int k = 0; k < n; k++)
      idx[k] = k;
    return n;
  }
  int m = 0;
  for (int b = 0; b < THIN_RUNS; b++) {
    int lo = (int)((int64_t)b * n / THIN_RUNS),
        hi = (int)((int64_t)(b + 1) * n / THIN_RUNS);
    int imin = -1, imax = -1, ibad = -1;
    for (int k = lo; k < hi; k++) {
      double y = s->y[k] * scale;
      if (!isfinite(y)) {
        if (ibad < 0)
          ibad = k;
        continue;
      }
      if (imin < 0 || y < s->y[imin] * scale)
        imin = k;
      if (imax < 0 || y > s->y[imax] * scale)
        imax = k;
    }
    /* This run's points in order, at most four (brk: a break there). */
    thin_ev ev[4];
    int ne = 0;
    if (b == 0 && isfinite(s->y[0] * scale))
      ev[ne++] = (thin_ev){0, false};
    if (imin >= 0)
      ev[ne++] = (thin_ev){imin, false};
    if (imax >= 0)
      ev[ne++] = (thin_ev){imax, false};
    if (ibad >= 0)
      ev[ne++] = (thin_ev){ibad, true};
    if (b == THIN_RUNS - 1 && isfinite(s->y[n - 1] * scale))
      ev[ne++] = (thin_ev){n - 1, false};
    for (int i = 1; i < ne; i++)
      for (int j = i; j > 0 && ev[j].at < ev[j - 1].at; j--) {
        thin_ev e = ev[j];
        ev[j] = ev[j - 1];
        ev[j - 1] = e;
      }
    for (int i = 0; i < ne; i++)
      if (i == 0 || ev[i].at != ev[i - 1].at)
        idx[m++] = ev[i].brk ? -1 : ev[i].at;
  }
  if (t && t->n < RP_MAX_THINNED) {
    int shown = 0;
    for (int i = 0; i < m; i++)
      shown += idx[i] >= 0;
    t->curve[t->n].name = name;
    t->curve[t->n].points = n;
    t->curve[t->n].shown = shown;
    t->curve[t->n].run_lo = n / THIN_RUNS;
    t->curve[t->n].run_hi = (n + THIN_RUNS - 1) / THIN_RUNS;
    t->n++;
  }
  return m;
}

/* Under a thinned plot, in its corner, how it was thinned: the PNG files
 * have no page around them to say it. */
static void thin_note(const rp_pen *p, const rp_thinned *t, int from) {
  int run = 0;
  for (int i = from; i < t->n; i++)
    run = t->curve[i].run_hi > run ? t->curve[i].run_hi : run;
  if (!run)
    return;
  char b[96];
  snprintf(b, sizeof b, "thinned: min and max of each %d points", run);
  p->text(p->ctx, RP_PLOT_W - MR, RP_PLOT_H - 10, b, AXIS, TEXT_PX, 1, false);
}

/* ---------------------------------------------------------------- curves */

typedef struct curve {
  const rp_series *s;
  const char *name;
  double scale; /* the value shown: y * scale */
  bool dots;
} curve;

static void draw_curves(const rp_pen *p, const char *title, const char *ylabel,
                        const curve *c, int n, bool from_zero, rp_thinned *t) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  const char *names[8];
  uint32_t colors[8];
  int nl = 0;
  for (int i = 0; i < n; i++) {
    if (!c[i].s)
      continue;
    names[nl] = c[i].name;
    colors[nl++] = palette[i % 10];
    for (int k = 0; k < c[i].s->n; k++) {
      double y = c[i].s->y[k] * c[i].scale;
      if (!isfinite(y))
        continue;
      x0 = fmin(x0, c[i].s->x[k]);
      x1 = fmax(x1, c[i].s->x[k]);
      y0 = fmin(y0, y);
      y1 = fmax(y1, y);
    }
  }
  range_fix(&x0, &x1, false);
  range_fix(&y0, &y1, from_zero);
  double pad = (y1 - y0) * 0.05;
  y1 += pad;
  if (!from_zero)
    y0 -= pad;
  frame f = axes(p, title, "step", ylabel, x0, x1, y0, y1, true);
  int from = t->n;
  for (int i = 0; i < n; i++) {
    const rp_series *s = c[i].s;
    if (!s)
      continue;
    uint32_t col = palette[i % 10];
    bool have = false;
    double px = 0, py = 0;
    int idx[THIN_OUT];
    int m = thin(s, c[i].scale, c[i].name, t, idx);
    for (int j = 0; j < m; j++) {
      int k = idx[j];
      double y = k >= 0 ? s->y[k] * c[i].scale : NAN;
      if (!isfinite(y)) {
        have = false;
        continue;
      }
      double qx = fx(&f, s->x[k]), qy = fy(&f, y);
      if (have)
        p->line(p->ctx, px, py, qx, qy, col, 2);
      if (c[i].dots || s->n == 1)
        p->dot(p->ctx, qx, qy, 3, col);
      px = qx;
      py = qy;
      have = true;
    }
  }
  legend(p, names, colors, nl);
  thin_note(p, t, from);
}

/* ------------------------------------------------------------ stacked bars */

typedef struct stack {
  const char *name;
  const rp_series *s; /* by line; NULL: from vals */
  const double *vals; /* per bar */
  double scale;
} stack;

/* Bars at xs (nb of them), each the stack of the parts' values; the line
 * over them (its own series) when given. */
static void draw_stacks(const rp_pen *p, const char *title, const char *xlabel,
                        const char *ylabel, const double *xs, int nb,
                        const stack *parts, int np, const curve *over,
                        bool int_x, rp_thinned *t) {
  double top = 0;
  for (int b = 0; b < nb; b++) {
    double sum = 0;
    for (int k = 0; k < np; k++) {
      double v = parts[k].s ? (b < parts[k].s->n ? parts[k].s->y[b] : 0)
                            : parts[k].vals[b];
      sum += isfinite(v) && v > 0 ? v * parts[k].scale : 0;
    }
    top = fmax(top, sum);
  }
  if (over && over->s)
    for (int k = 0; k < over->s->n; k++)
      if (isfinite(over->s->y[k]))
        top = fmax(top, over->s->y[k] * over->scale);
  double x0 = nb ? xs[0] : 0, x1 = nb ? xs[nb - 1] : 1;
  double gap = 1;
  for (int b = 1; b < nb; b++)
    gap = b == 1 ? xs[1] - xs[0] : fmin(gap, xs[b] - xs[b - 1]);
  if (!(gap > 0))
    gap = 1;
  x0 -= gap * 0.6;
  x1 += gap * 0.6;
  double y0 = 0, y1 = top;
  range_fix(&y0, &y1, true);
  y1 *= 1.05;
  frame f = axes(p, title, xlabel, ylabel, x0, x1, y0, y1, int_x);
  double w = fmax(1, (fx(&f, gap) - fx(&f, 0)) * 0.8);
  for (int b = 0; b < nb; b++) {
    double base = 0;
    for (int k = 0; k < np; k++) {
      double v = parts[k].s ? (b < parts[k].s->n ? parts[k].s->y[b] : 0)
                            : parts[k].vals[b];
      v = isfinite(v) && v > 0 ? v * parts[k].scale : 0;
      if (v <= 0)
        continue;
      double ya = fy(&f, base), yb = fy(&f, base + v);
      p->rect(p->ctx, fx(&f, xs[b]) - w / 2, yb, w, ya - yb, palette[k % 10],
              1);
      base += v;
    }
  }
  const char *names[12];
  uint32_t colors[12];
  int nl = 0;
  for (int k = 0; k < np && nl < 11; k++) {
    names[nl] = parts[k].name;
    colors[nl++] = palette[k % 10];
  }
  int from = t->n;
  if (over && over->s) {
    uint32_t col = INK;
    const rp_series *s = over->s;
    int idx[THIN_OUT];
    int m = thin(s, over->scale, over->name, t, idx);
    for (int j = 1; j < m; j++)
      if (idx[j - 1] >= 0 && idx[j] >= 0)
        p->line(p->ctx, fx(&f, s->x[idx[j - 1]]),
                fy(&f, s->y[idx[j - 1]] * over->scale), fx(&f, s->x[idx[j]]),
                fy(&f, s->y[idx[j]] * over->scale), col, 2);
    for (int j = 0; j < m; j++)
      if (idx[j] >= 0)
        p->dot(p->ctx, fx(&f, s->x[idx[j]]), fy(&f, s->y[idx[j]] * over->scale),
               2.5, col);
    names[nl] = over->name;
    colors[nl++] = col;
  }
  legend(p, names, colors, nl);
  thin_note(p, t, from);
}

/* Bars at most: more lines than this are drawn as bars of consecutive
 * lines, each the mean of its lines (a bar under 2 px says nothing). */
enum { MAX_BARS = 300 };

/* The lines of `lines` (its x) into nb <= MAX_BARS bars: xs[b] the last
 * step of bar b, vals[k][b] the mean of parts[k] over its lines (0 for a
 * NULL part). With `rest`, part n-1 is what lines' y leaves after the other
 * parts (at least 0). Returns nb. */
static int bin_lines(const rp_series *lines, const rp_series *const *parts,
                     int n, bool rest, double xs[MAX_BARS],
                     double vals[][MAX_BARS]) {
  int nl = lines ? lines->n : 0;
  int nb = nl < MAX_BARS ? nl : MAX_BARS;
  for (int b = 0; b < nb; b++) {
    int lo = (int)((int64_t)b * nl / nb),
        hi = (int)((int64_t)(b + 1) * nl / nb);
    xs[b] = lines->x[hi - 1];
    for (int k = 0; k < n; k++)
      vals[k][b] = 0;
    for (int i = lo; i < hi; i++) {
      double sum = 0;
      for (int k = 0; k < n; k++) {
        const rp_series *s = parts[k];
        double v = s && i < s->n && isfinite(s->y[i]) ? s->y[i] : 0;
        if (rest && k == n - 1)
          v = fmax(0, lines->y[i] - sum);
        sum += v;
        vals[k][b] += v / (double)(hi - lo);
      }
    }
  }
  return nb;
}

/* The training lines' steps (the x of step_s). */
static const rp_series *train_x(const rp_run *r) {
  return rp_find(r, "step_s");
}

int rp_plots(const rp_run *r, rp_plot_desc *out, int max) {
  int n = 0;
#define ADD(ID, TITLE)                                                         \
  do {                                                                         \
    if (n < max)                                                               \
      out[n++] = (rp_plot_desc){ID, TITLE};                                    \
  } while (0)
  if (rp_find(r, "loss") || rp_find(r, "val_loss"))
    ADD("loss", "Loss");
  if (rp_find(r, "accuracy") || rp_find(r, "val_accuracy"))
    ADD("accuracy", "Accuracy");
  if (rp_find(r, "lr"))
    ADD("lr", "Learning rate");
  if (rp_find(r, "tokens_per_s") || rp_find(r, "samples_per_s"))
    ADD("throughput", "Throughput");
  if (train_x(r))
    ADD("step_time", "Where a step's time goes");
  if (rp_find(r, "mem_params_mb"))
    ADD("memory", "Memory by category (rank 0)");
  if (r->nranks > 1 && r->rank_lines > 0)
    ADD("ranks", "Each rank's step");
  if (rp_find(r, "grad_norm"))
    ADD("grad_norm", "Gradient norm (before clipping)");
#undef ADD
  return n;
}

void rp_plot_draw(const rp_run *r, const char *id, const rp_pen *p,
                  rp_thinned *thinned) {
  rp_thinned none;
  rp_thinned *t = thinned ? thinned : &none;
  t->n = 0;
  if (!strcmp(id, "loss")) {
    curve c[] = {{rp_find(r, "loss"), "train loss", 1, false},
                 {rp_find(r, "val_loss"), "validation loss", 1, true}};
    draw_curves(p, "Loss", "loss", c, 2, false, t);
  } else if (!strcmp(id, "accuracy")) {
    curve c[] = {
        {rp_find(r, "accuracy"), "train accuracy", 100, false},
        {rp_find(r, "val_accuracy"), "validation accuracy", 100, true}};
    draw_curves(p, "Accuracy", "%", c, 2, false, t);
  } else if (!strcmp(id, "lr")) {
    curve c[] = {{rp_find(r, "lr"), "learning rate", 1, false}};
    draw_curves(p, "Learning rate", "lr", c, 1, true, t);
  } else if (!strcmp(id, "throughput")) {
    const rp_series *tok = rp_find(r, "tokens_per_s");
    curve c[] = {{tok ? tok : rp_find(r, "samples_per_s"),
                  tok ? "tokens/s" : "samples/s", 1, false}};
    draw_curves(p, "Throughput (all ranks)", tok ? "tokens/s" : "samples/s", c,
                1, true, t);
  } else if (!strcmp(id, "step_time")) {
    const rp_series *st = train_x(r);
    const char *keys[] = {"data_wait_s", "forward_s", "backward_s",
                          "comm_wait_s", "optim_s"};
    const char *names[] = {"data wait", "forward", "backward", "comm wait",
                           "optimizer"};
    const rp_series *ps[6] = {NULL};
    for (int k = 0; k < 5; k++)
      ps[k] = rp_find(r, keys[k]);
    /* What the parts leave of the step (loop overhead, the loss's
     * all-reduce, progress) is its sixth part: ps[5] stays NULL. */
    double xs[MAX_BARS], vals[6][MAX_BARS];
    int nb = bin_lines(st, ps, 6, true, xs, vals);
    stack use[6];
    int nu = 0;
    for (int k = 0; k < 6; k++)
      if (k == 5 || ps[k])
        use[nu++] = (stack){k == 5 ? "other" : names[k], NULL, vals[k], 1e3};
    draw_stacks(p,
                st->n > nb ? "Where a step's time goes (rank 0, mean of each "
                             "bar's windows)"
                           : "Where a step's time goes (rank 0, mean of each "
                             "window)",
                "step", "ms a step", xs, nb, use, nu, NULL, true, t);
  } else if (!strcmp(id, "memory")) {
    const char *keys[] = {"mem_params_mb", "mem_grads_mb", "mem_optim_mb",
                          "mem_act_mb",    "mem_comm_mb",  "mem_data_mb"};
    const char *names[] = {"parameters",  "gradients",     "optimizer",
                           "activations", "communication", "data"};
    const rp_series *ps[6];
    for (int k = 0; k < 6; k++)
      ps[k] = rp_find(r, keys[k]);
    double xs[MAX_BARS], vals[6][MAX_BARS];
    int nb = bin_lines(ps[0], ps, 6, false, xs, vals);
    stack use[6];
    int nu = 0;
    for (int k = 0; k < 6; k++)
      if (ps[k])
        use[nu++] = (stack){names[k], NULL, vals[k], 1};
    curve over = {rp_find(r, "peak_rss_mb"), "peak RSS", 1, true};
    draw_stacks(p, "Memory by category (rank 0) and the process's peak RSS",
                "step", "MiB", xs, nb, use, nu, &over, true, t);
  } else if (!strcmp(id, "ranks")) {
    int n = r->nranks;
    double xs[RP_MAX_RANKS] = {0}, v[RP_RANK_N][RP_MAX_RANKS] = {{0}};
    for (int i = 0; i < n; i++) {
      xs[i] = i;
      for (int k = 0; k < RP_RANK_N; k++)
        v[k][i] = r->rank_sum[k][i] / (double)r->rank_lines;
    }
    stack parts[] = {{"busy", NULL, v[RP_RANK_BUSY], 1e3},
                     {"data wait", NULL, v[RP_RANK_DATA], 1e3},
                     {"comm wait", NULL, v[RP_RANK_COMM], 1e3}};
    draw_stacks(p, "Each rank's step: busy and waiting (mean ms a step)",
                "rank", "ms a step", xs, n, parts, 3, NULL, true, t);
  } else if (!strcmp(id, "grad_norm")) {
    curve c[] = {{rp_find(r, "grad_norm"), "gradient norm", 1, false}};
    draw_curves(p, "Gradient norm (before clipping)", "norm", c, 1, true, t);
  }
}
