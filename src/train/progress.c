/* Console progress: a redrawn bar on a terminal, plain periodic lines
 * elsewhere (logs, CI), nothing when off. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "loom/train.h"

struct loom_progress {
  loom_progress_mode mode;
  FILE *out;
  int64_t total;
  int64_t first_step; /* step the run (or resume) started from */
  int every;          /* LINES mode: print every this many steps */
  const char *unit;
  double t_start;
  double t_last_draw;
  bool bar_drawn;
};

const char *loom_progress_mode_name(loom_progress_mode m) {
  return (unsigned)m < LOOM_PROGRESS_MODE_COUNT ? loom_progress_mode_names[m]
                                                : "?";
}

loom_status loom_progress_mode_parse(const char *s, loom_progress_mode *out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_progress_mode_parse: NULL out");
  int i = 0;
  LOOM_TRY(loom_name_parse(s, loom_progress_mode_names,
                           LOOM_PROGRESS_MODE_COUNT, "progress mode", &i));
  *out = (loom_progress_mode)i;
  return LOOM_OK;
}

loom_status loom_progress_new(loom_progress **out, loom_progress_mode mode,
                              FILE *stream, int64_t first_step, int64_t total,
                              int every, const char *unit) {
  *out = NULL;
  loom_progress *p = loom_calloc(1, sizeof *p);
  if (!p)
    return LOOM_ERR_NOMEM;
  p->out = stream ? stream : stderr;
  if (mode == LOOM_PROGRESS_AUTO)
    mode = isatty(fileno(p->out)) ? LOOM_PROGRESS_BAR : LOOM_PROGRESS_LINES;
  p->mode = mode;
  p->total = total;
  p->first_step = first_step;
  p->every = every > 0 ? every : 50;
  p->unit = unit ? unit : "samples";
  p->t_start = loom_time_now();
  *out = p;
  return LOOM_OK;
}

/* "1h02m", "3m20s", "45s" */
static void format_duration(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) {
    snprintf(buf, n, "?");
    return;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60)
    snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
  else
    snprintf(buf, n, "%lds", t);
}

/* "12.3k" */
static void format_rate(char *buf, size_t n, double r) {
  if (r >= 1e6)
    snprintf(buf, n, "%.2fM", r / 1e6);
  else if (r >= 1e3)
    snprintf(buf, n, "%.1fk", r / 1e3);
  else
    snprintf(buf, n, "%.0f", r);
}

void loom_progress_update(loom_progress *p, const loom_progress_info *info) {
  if (!p || p->mode == LOOM_PROGRESS_OFF)
    return;
  double now = loom_time_now();
  bool last = info->step >= p->total;
  if (p->mode == LOOM_PROGRESS_BAR && !last && now - p->t_last_draw < 0.1)
    return;
  if (p->mode == LOOM_PROGRESS_LINES && !last && info->step % p->every != 0)
    return;
  p->t_last_draw = now;

  double done = (double)(info->step - p->first_step);
  double left = (double)(p->total - info->step);
  double eta = done > 0 ? (now - p->t_start) / done * left : NAN;
  char eta_s[32], rate_s[32];
  format_duration(eta_s, sizeof eta_s, eta);
  format_rate(rate_s, sizeof rate_s, info->throughput);
  char stats[256];
  snprintf(stats, sizeof stats,
           "step %lld/%lld | epoch %d | loss %.4f | lr %.3g | %s %s/s | ETA %s",
           (long long)info->step, (long long)p->total, info->epoch,
           (double)info->loss, (double)info->lr, rate_s, p->unit, eta_s);

  if (p->mode == LOOM_PROGRESS_LINES) {
    fprintf(p->out, "%s\n", stats);
    fflush(p->out);
    return;
  }
  enum { WIDTH = 24 };
  double frac = p->total > 0 ? (double)info->step / (double)p->total : 1.0;
  if (frac > 1)
    frac = 1;
  int fill = (int)(frac * WIDTH);
  char bar[WIDTH + 1];
  for (int i = 0; i < WIDTH; i++)
    bar[i] = i < fill ? '#' : '.';
  bar[WIDTH] = '\0';
  fprintf(p->out, "\r\033[K[%s] %3.0f%% %s", bar, frac * 100, stats);
  fflush(p->out);
  p->bar_drawn = true;
}

void loom_progress_print(loom_progress *p, const char *line) {
  FILE *out = p ? p->out : stderr;
  if (p && p->mode == LOOM_PROGRESS_BAR && p->bar_drawn) {
    fprintf(out, "\r\033[K%s\n", line);
    p->t_last_draw = 0; /* redraw the bar at the next update */
  } else {
    fprintf(out, "%s\n", line);
  }
  fflush(out);
}

void loom_progress_free(loom_progress *p) {
  if (!p)
    return;
  if (p->mode == LOOM_PROGRESS_BAR && p->bar_drawn) {
    fputc('\n', p->out);
    fflush(p->out);
  }
  loom_free(p);
}
