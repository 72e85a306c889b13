/* loom report's parts inside the obs layer: the run as read (report_data.c),
 * the plots drawn through a pen (report_plot.c: SVG for the page, a raster
 * for PNG files) and the page (report.c). */
#ifndef LOOM_OBS_REPORT_H
#define LOOM_OBS_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/obs.h"

struct cJSON;

enum { RP_MAX_SERIES = 96, RP_MAX_RANKS = 1024, RP_MAX_FINDINGS = 6 };
enum { RP_RANK_BUSY, RP_RANK_DATA, RP_RANK_COMM, RP_RANK_N };

/* One number of metrics.jsonl over its lines: (step, value). */
typedef struct rp_series {
  char key[48];
  int n, cap;
  double *x, *y;
} rp_series;

/* A window's parts: a step's seconds (step_s, data_wait_s, forward_s,
 * backward_s, comm_wait_s, optim_s, pp_wait_s, tp_wait_s) and the
 * window's whole checkpoint seconds (ckpt_s), in that order. */
enum { RP_WIN_N = 9 };

typedef struct rp_run {
  char dir[4096];
  rp_series series[RP_MAX_SERIES];
  int nseries;
  int lines, train_lines, bad_lines, first_bad;
  bool partial_tail; /* a line still being written was left out */
  int64_t last_step, total_steps;
  bool finished;
  double mtime; /* metrics.jsonl's last change (Unix seconds) */
  /* Each rank's busy, data-wait and comm-wait seconds a step, summed over
   * the training lines after the first (rank_lines of them). */
  int nranks, rank_lines;
  double rank_sum[RP_RANK_N][RP_MAX_RANKS];
  /* Over the same lines: each rank's busy time over the line's ranks'
   * mean, summed, and busy_skew (the slowest's), summed over skew_lines. */
  double rank_rel[RP_MAX_RANKS];
  double skew_sum;
  int skew_lines;
  /* The training lines (windows of log.every steps) in file order: each
   * one's step and its RP_WIN_N parts (0 where the line lacks one), so
   * that every part is averaged over the same windows. */
  int nwin, win_cap;
  double *win_step;
  double (*win)[RP_WIN_N];
  struct cJSON *env; /* env.json, or NULL */
  char *config;      /* config.yaml's text, or NULL */
} rp_run;

loom_status rp_read(rp_run *r, const char *dir);
void rp_free(rp_run *r);
const rp_series *rp_find(const rp_run *r, const char *key);
/* env.json's string / number (NULL / NaN when absent). */
const char *rp_env(const rp_run *r, const char *key);
double rp_env_num(const rp_run *r, const char *key);

/* Where a step's time went (means over the training lines but the first). */
typedef struct rp_parts {
  double step, data, forward, backward, comm, optim;
  double pipe;   /* pp_wait_s: blocked on pipeline neighbours (0: none) */
  double tp;     /* tp_wait_s: on tp collectives, inside forward/backward */
  double hidden; /* comm_hidden's mean (NaN: one rank) */
  /* busy_skew's mean over the lines of rank_sum (1: one rank): how much
   * longer the slowest rank computes than the mean, the one figure the
   * imbalance finding and the evidence give */
  double skew;
  /* pp_bubble, pp_bubble_expected, pp_bubble_theory (NaN: no pipeline) */
  double bubble, bubble_expected, bubble_theory;
  int stages, micro; /* pp_stages, pp_micro_batches (0: no pipeline) */
  /* a step's share of the checkpoint saves (they are inside step_s), and
   * the saves' seconds over the training steps' (the evaluations, outside
   * step_s, left out) */
  double ckpt, ckpt_share;
  /* the rank with the highest busy time over the mean, averaged over the
   * lines of rank_sum (-1: none) */
  int slowest;
} rp_parts;

typedef struct rp_verdict {
  char headline[512];
  int n;
  char text[RP_MAX_FINDINGS][512]; /* the heaviest first */
  double weight[RP_MAX_FINDINGS];
  rp_parts parts;
} rp_verdict;
void rp_verdict_make(const rp_run *r, rp_verdict *v);

/* ------------------------------------------------------------------ pen */

typedef struct rp_pen {
  void *ctx;
  void (*line)(void *c, double x0, double y0, double x1, double y1,
               uint32_t rgb, double width);
  void (*rect)(void *c, double x, double y, double w, double h, uint32_t rgb,
               double alpha);
  void (*dot)(void *c, double x, double y, double r, uint32_t rgb);
  /* y: the text's vertical centre; anchor -1 left, 0 middle, 1 right. */
  void (*text)(void *c, double x, double y, const char *s, uint32_t rgb, int px,
               int anchor, bool vertical);
} rp_pen;

/* The plots of a report, in order; each drawn on a w x h canvas. */
enum { RP_PLOT_W = 880, RP_PLOT_H = 290 };
typedef struct rp_plot_desc {
  const char *id;    /* "loss": the SVG's id and the PNG's name */
  const char *title; /* shown above it */
} rp_plot_desc;
/* The plots this run has data for, into out (up to max); their count. */
int rp_plots(const rp_run *r, rp_plot_desc *out, int max);

/* A curve of more points than two a pixel column of the plot area is drawn
 * thinned: the lowest and the highest point of each run of consecutive
 * points (one run a column), so that a one-step spike is still drawn.
 * What rp_plot_draw thinned, for the page to say so. */
enum { RP_MAX_THINNED = 4 };
typedef struct rp_thinned {
  int n;
  struct {
    const char *name;   /* "train loss" (static) */
    int points;         /* the series' points */
    int shown;          /* those drawn */
    int run_lo, run_hi; /* points a run, the fewest and the most */
  } curve[RP_MAX_THINNED];
} rp_thinned;
/* Draws plot `id`; what it thinned into *thinned (NULL: not wanted). */
void rp_plot_draw(const rp_run *r, const char *id, const rp_pen *pen,
                  rp_thinned *thinned);

/* A growing text buffer. */
typedef struct rp_buf {
  char *p;
  size_t len, cap;
  bool failed;
} rp_buf;
void rp_printf(rp_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* s with & < > " escaped for HTML and XML. */
void rp_escape(rp_buf *b, const char *s);

/* The plots as PNG files in dir (report_png.c); their count in *n. */
loom_status rp_write_pngs(const rp_run *r, const char *dir, int *n);

#endif
