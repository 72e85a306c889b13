/* loom report: one self-contained HTML page of a run (inline SVG plots, no
 * script, nothing fetched when viewed): a verdict in words with its
 * evidence, the curves, where a step's time and the memory go, each rank's
 * step, the configuration and the environment. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "report.h"

void rp_printf(rp_buf *b, const char *fmt, ...) {
  if (b->failed)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = true;
      return;
    }
    if (b->p && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap - b->len <= (size_t)n)
      cap *= 2;
    char *p = loom_malloc(cap);
    if (!p) {
      b->failed = true;
      return;
    }
    if (b->p && b->len)
      memcpy(p, b->p, b->len);
    loom_free(b->p);
    b->p = p;
    b->cap = cap;
  }
}

void rp_escape(rp_buf *b, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '&':
      rp_printf(b, "&amp;");
      break;
    case '<':
      rp_printf(b, "&lt;");
      break;
    case '>':
      rp_printf(b, "&gt;");
      break;
    case '"':
      rp_printf(b, "&quot;");
      break;
    default:
      rp_printf(b, "%c", *s);
    }
  }
}

/* ------------------------------------------------------------ SVG pen */

static void svg_line(void *c, double x0, double y0, double x1, double y1,
                     uint32_t rgb, double w) {
  if (!isfinite(x0 + y0 + x1 + y1))
    return;
  rp_printf(c,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#%06x\" stroke-width=\"%g\"/>\n",
            x0, y0, x1, y1, rgb, w);
}

static void svg_rect(void *c, double x, double y, double w, double h,
                     uint32_t rgb, double alpha) {
  if (!isfinite(x + y + w + h) || w <= 0 || h <= 0)
    return;
  rp_printf(c,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
            "fill=\"#%06x\"%s/>\n",
            x, y, w, h, rgb, alpha < 1 ? " fill-opacity=\"0.5\"" : "");
}

static void svg_dot(void *c, double x, double y, double r, uint32_t rgb) {
  if (!isfinite(x + y))
    return;
  rp_printf(c, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%g\" fill=\"#%06x\"/>\n", x,
            y, r, rgb);
}

static void svg_text(void *c, double x, double y, const char *s, uint32_t rgb,
                     int px, int anchor, bool vertical) {
  static const char *const anchors[] = {"start", "middle", "end"};
  rp_printf(c,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" fill=\"#%06x\" "
            "text-anchor=\"%s\" dominant-baseline=\"central\"",
            x, y, px, rgb, anchors[anchor + 1]);
  if (vertical)
    rp_printf(c, " transform=\"rotate(-90 %.1f %.1f)\"", x, y);
  rp_printf(c, ">");
  rp_escape(c, s);
  rp_printf(c, "</text>\n");
}

static void svg_plot(rp_buf *b, const rp_run *r, const rp_plot_desc *d) {
  rp_printf(b,
            "<figure><svg class=\"plot\" id=\"plot-%s\" "
            "xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n",
            d->id, RP_PLOT_W, RP_PLOT_H, RP_PLOT_W, RP_PLOT_H);
  rp_pen pen = {b, svg_line, svg_rect, svg_dot, svg_text};
  rp_thinned t;
  rp_plot_draw(r, d->id, &pen, &t);
  rp_printf(b, "</svg>");
  /* Say what a thinned curve leaves out, so that no one reads it as every
   * point (the note in the plot's corner says it in short). */
  if (t.n > 0)
    rp_printf(b,
              "<figcaption class=\"note\" id=\"thin-%s\">Thinned to the "
              "plot's width, so that spikes stay:",
              d->id);
  for (int i = 0; i < t.n; i++) {
    char run[32];
    if (t.curve[i].run_lo == t.curve[i].run_hi)
      snprintf(run, sizeof run, "%d", t.curve[i].run_hi);
    else
      snprintf(run, sizeof run, "%d or %d", t.curve[i].run_lo,
               t.curve[i].run_hi);
    rp_printf(b,
              "%s %s is drawn through %d of its %d points (about 1 in "
              "%.0f): the lowest and the highest of each %s consecutive "
              "points, in step order",
              i ? ";" : "", t.curve[i].name, t.curve[i].shown,
              t.curve[i].points,
              (double)t.curve[i].points /
                  (double)(t.curve[i].shown > 0 ? t.curve[i].shown : 1),
              run);
  }
  if (t.n > 0)
    rp_printf(b, ".</figcaption>");
  rp_printf(b, "</figure>\n");
}

/* ----------------------------------------------------------------- page */

static const char *const style =
    "body{font-family:sans-serif;margin:24px auto;max-width:920px;"
    "color:#222}h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
    ".verdict{border-left:6px solid #d62728;background:#fbeaea;padding:10px "
    "14px}.verdict.ok{border-color:#2ca02c;background:#eaf6ea}"
    "table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;"
    "border-bottom:1px solid #ddd}td.n{text-align:right}"
    "figure{margin:12px 0}pre{background:#f6f6f6;padding:10px;"
    "overflow:auto;font-size:12px}.note{color:#666;font-size:13px}";

static void part_row(rp_buf *b, const char *name, double s, double step) {
  rp_printf(b,
            "<tr><td>%s</td><td class=n>%.3f ms</td><td class=n>%.1f%%</td>"
            "</tr>\n",
            name, 1e3 * s, step > 0 ? 100 * s / step : 0);
}

static void page(rp_buf *b, const rp_run *r, const rp_verdict *v,
                 const rp_plot_desc *plots, int np) {
  rp_printf(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta "
               "charset=\"utf-8\"><title>loom report: ");
  rp_escape(b, r->dir);
  rp_printf(b, "</title><style>%s</style></head><body>\n", style);
  rp_printf(b, "<h1>loom report: ");
  rp_escape(b, r->dir);
  rp_printf(b, "</h1>\n<p id=\"status\">");
  if (r->finished)
    rp_printf(b, "Finished: %lld steps.", (long long)r->last_step);
  else {
    time_t m = (time_t)r->mtime;
    char when[64] = "?";
    struct tm tm;
    if (gmtime_r(&m, &tm))
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    rp_printf(b, "In progress or stopped: step %lld", (long long)r->last_step);
    if (r->total_steps > 0)
      rp_printf(b, " of %lld", (long long)r->total_steps);
    rp_printf(b,
              "; metrics last written %s. Run <code>loom report</code> "
              "again to see more.",
              when);
  }
  rp_printf(b, " %d metrics lines", r->lines);
  if (r->bad_lines)
    rp_printf(b, " (%d unreadable lines skipped, the first at line %d)",
              r->bad_lines, r->first_bad);
  rp_printf(b, ".</p>\n");

  const rp_parts *p = &v->parts;
  bool compute = v->n > 0 && !strncmp(v->headline, "Compute bound", 13);
  rp_printf(b,
            "<h2>Verdict</h2>\n<div class=\"verdict%s\" id=\"verdict\">"
            "<p><b>",
            compute || v->n == 0 ? " ok" : "");
  rp_escape(b, v->headline);
  rp_printf(b, "</b></p>");
  for (int i = 1; i < v->n; i++) {
    rp_printf(b, "<p>Also: ");
    rp_escape(b, v->text[i]);
    rp_printf(b, "</p>");
  }
  rp_printf(b, "</div>\n");
  if (p->step > 0) {
    rp_printf(b,
              "<p>The evidence: rank 0's mean step over the training "
              "windows%s.</p>\n<table id=\"evidence\"><tr><th>part</th>"
              "<th>time a step</th><th>share</th></tr>\n",
              r->train_lines >= 3 ? " after the first (warm-up)" : "");
    part_row(b, "data wait", p->data, p->step);
    part_row(b, "forward", p->forward, p->step);
    part_row(b, "backward", p->backward, p->step);
    if (p->tp > 0) /* inside forward and backward: not added again */
      part_row(b, "&nbsp;&nbsp;of which tensor-parallel wait", p->tp, p->step);
    if (p->stages > 1)
      part_row(b, "pipeline wait", p->pipe, p->step);
    part_row(b, "communication wait", p->comm, p->step);
    part_row(b, "optimizer", p->optim, p->step);
    if (p->ckpt > 0)
      part_row(b, "checkpoint saves", p->ckpt, p->step);
    double rest = p->step - p->data - p->forward - p->backward - p->pipe -
                  p->comm - p->optim - p->ckpt;
    part_row(b, "other", rest > 0 ? rest : 0, p->step);
    part_row(b, "<b>step</b>", p->step, p->step);
    rp_printf(b, "</table>\n<p>");
    if (isfinite(p->hidden))
      rp_printf(b, "Reduction time hidden behind backward: %.0f%%. ",
                100 * p->hidden);
    if (isfinite(p->bubble))
      rp_printf(b,
                "Pipeline bubble (pp_bubble): %.0f%% of the schedule; %.0f%% "
                "expected for these stages, %.0f%% in theory. ",
                100 * p->bubble, 100 * p->bubble_expected,
                100 * p->bubble_theory);
    if (r->nranks > 1)
      rp_printf(b,
                "Busy time of the slowest rank (%d) against the mean: "
                "%+.0f%% (busy_skew %.2f). ",
                p->slowest, 100 * (p->skew - 1), p->skew);
    if (p->ckpt_share > 0)
      rp_printf(b, "Checkpoints: %.1f%% of the training steps' time.",
                100 * p->ckpt_share);
    rp_printf(b, "</p>\n");
  }

  rp_printf(b, "<h2>Plots</h2>\n");
  for (int i = 0; i < np; i++)
    svg_plot(b, r, &plots[i]);

  rp_printf(b, "<h2>Environment</h2>\n<table id=\"env\">\n");
  if (r->env) {
    const cJSON *it;
    cJSON_ArrayForEach(it, r->env) {
      rp_printf(b, "<tr><td>");
      rp_escape(b, it->string);
      rp_printf(b, "</td><td>");
      if (cJSON_IsString(it))
        rp_escape(b, it->valuestring);
      else if (cJSON_IsNumber(it))
        rp_printf(b, "%.15g", it->valuedouble);
      rp_printf(b, "</td></tr>\n");
    }
  } else {
    rp_printf(b, "<tr><td>env.json not found</td></tr>\n");
  }
  rp_printf(b, "</table>\n<h2>Configuration</h2>\n<pre id=\"config\">");
  rp_escape(b, r->config ? r->config : "config.yaml not found");
  rp_printf(b, "</pre>\n<p class=\"note\">Written by loom %s from ",
            loom_version());
  rp_escape(b, r->dir);
  rp_printf(b, "/metrics.jsonl, env.json and config.yaml.</p>\n"
               "</body></html>\n");
}

loom_status loom_report_write(const char *run_dir, const char *out_path,
                              const char *png_dir, loom_report_info *info) {
  if (!run_dir || !out_path)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_report_write: a run directory and an output path");
  rp_run *r = loom_calloc(1, sizeof *r);
  if (!r)
    return LOOM_ERR_NOMEM;
  loom_status s = rp_read(r, run_dir);
  rp_verdict v;
  rp_plot_desc plots[16];
  int np = 0;
  rp_buf b = {0};
  if (s == LOOM_OK) {
    rp_verdict_make(r, &v);
    np = rp_plots(r, plots, 16);
    page(&b, r, &v, plots, np);
    if (b.failed)
      s = loom_error(LOOM_ERR_NOMEM, "building the report of %s", run_dir);
  }
  if (s == LOOM_OK) {
    /* dir/name from out_path, written in one step (never through a link). */
    char dir[4096];
    const char *slash = strrchr(out_path, '/');
    const char *name = slash ? slash + 1 : out_path;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out_path) : 1,
             slash ? out_path : ".");
    if (slash == out_path)
      snprintf(dir, sizeof dir, "/");
    struct stat lst;
    if (!*name)
      s = loom_error(LOOM_ERR_INVALID_ARG, "%s: names a directory, not a file",
                     out_path);
    else if (lstat(out_path, &lst) == 0 && S_ISLNK(lst.st_mode))
      /* as --trace -o: the user named a file, not where a link points */
      s = loom_error(LOOM_ERR_IO, "%s: %s", out_path, loom_fs_strerror(ELOOP));
    else
      s = loom_fs_write_atomic(dir, name, b.p, b.len);
  }
  int npng = 0;
  if (s == LOOM_OK && png_dir) {
    s = loom_fs_mkdirs(png_dir, 0755);
    if (s == LOOM_OK)
      s = rp_write_pngs(r, png_dir, &npng);
  }
  if (s == LOOM_OK && info) {
    memset(info, 0, sizeof *info);
    info->lines = r->lines;
    info->last_step = r->last_step;
    info->total_steps = r->total_steps;
    info->finished = r->finished;
    info->plots = np;
    info->pngs = npng;
    snprintf(info->verdict, sizeof info->verdict, "%s", v.headline);
  }
  loom_free(b.p);
  rp_free(r);
  loom_free(r);
  return s;
}
