/* loom report --png: the report's plots drawn on a raster (raster.c) with
 * the same layout as the page's SVG, one PNG file each. */
#include <math.h>
#include <stdio.h>

#include "raster.h"
#include "report.h"

static void r_line(void *c, double x0, double y0, double x1, double y1,
                   uint32_t rgb, double w) {
  /* Axes and grid lines through pixel centres, so that they are sharp. */
  if (y0 == y1)
    y0 = y1 = floor(y0) + 0.5;
  if (x0 == x1)
    x0 = x1 = floor(x0) + 0.5;
  loom_raster_line(c, x0, y0, x1, y1, rgb, w);
}

static void r_rect(void *c, double x, double y, double w, double h,
                   uint32_t rgb, double alpha) {
  loom_raster_rect(c, x, y, w, h, rgb, alpha);
}

static void r_dot(void *c, double x, double y, double r, uint32_t rgb) {
  loom_raster_dot(c, x, y, r, rgb);
}

/* The bitmap font's 9-pixel cell at scale 1 stands for the page's 12 px
 * text; titles (14 px) get scale 2. */
static void r_text(void *c, double x, double y, const char *s, uint32_t rgb,
                   int px, int anchor, bool vertical) {
  loom_raster_text(c, x, y, s, rgb, px >= 14 ? 2 : 1, anchor, vertical);
}

loom_status rp_write_pngs(const rp_run *r, const char *dir, int *n) {
  *n = 0;
  rp_plot_desc plots[16];
  int np = rp_plots(r, plots, 16);
  for (int i = 0; i < np; i++) {
    loom_raster *img = loom_raster_new(RP_PLOT_W, RP_PLOT_H, 0xffffff);
    if (!img)
      return LOOM_ERR_NOMEM;
    rp_pen pen = {img, r_line, r_rect, r_dot, r_text};
    rp_plot_draw(r, plots[i].id, &pen, NULL);
    char name[64];
    snprintf(name, sizeof name, "%s.png", plots[i].id);
    loom_status s = loom_raster_write_png(img, dir, name);
    loom_raster_free(img);
    LOOM_TRY(s);
    (*n)++;
  }
  return LOOM_OK;
}
