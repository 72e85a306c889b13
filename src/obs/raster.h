/* A small RGB raster canvas (anti-aliased lines, rectangles, dots, a
 * built-in 5x7 bitmap font) and its PNG encoding, for the plots of
 * `loom report --png`. Internal to the obs layer.
 *
 * Coordinates are pixels, doubles, x to the right and y downward. Pixel
 * (x, y) is the unit square [x, x+1) x [y, y+1), its centre at
 * (x + 0.5, y + 0.5): a rectangle from (10, 20) of size 5 x 3 covers pixels
 * 10..14 x 20..22 exactly, and a 1-pixel line is sharp when it runs through
 * pixel centres (y = 20.5 fills row 20; y = 20.0 half-fills rows 19 and
 * 20). Every drawing call clips to the image; non-finite coordinates draw
 * nothing. Colours are 0xRRGGBB. */
#ifndef LOOM_OBS_RASTER_H
#define LOOM_OBS_RASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/core.h"

typedef struct loom_raster loom_raster;

/* The largest width or height loom_raster_new accepts. */
#define LOOM_RASTER_MAX_SIDE 16384

/* A w x h RGB image filled with bg (0xRRGGBB). NULL on no memory (loom
 * error set), or when w or h is outside 1..LOOM_RASTER_MAX_SIDE. */
loom_raster *loom_raster_new(int w, int h, uint32_t bg);
void loom_raster_free(loom_raster *r);
int loom_raster_width(const loom_raster *r);
int loom_raster_height(const loom_raster *r);
/* The pixel at (x, y) as 0xRRGGBB (tests); 0 outside the image. */
uint32_t loom_raster_get(const loom_raster *r, int x, int y);

/* A line from (x0,y0) to (x1,y1), `width` pixels wide (>= 1; less is drawn
 * as 1), anti-aliased: each pixel is blended with the colour by how much of
 * it the stroke covers, judged by the distance of its centre from the
 * segment. The ends are round (half the width past each end point), so the
 * segments of a polyline join without gaps. Clipped to the image: any
 * coordinates, also far outside, are safe; NaN or infinite ones draw
 * nothing. */
void loom_raster_line(loom_raster *r, double x0, double y0, double x1,
                      double y1, uint32_t rgb, double width);
/* A filled axis-aligned rectangle (x, y top-left, w, h; clipped; w or h <= 0
 * draws nothing). alpha in [0,1]: 1 opaque, less blends. Pixels the edges
 * cut are blended by the part covered. */
void loom_raster_rect(loom_raster *r, double x, double y, double w, double h,
                      uint32_t rgb, double alpha);
/* A filled circle, anti-aliased at its edge (dots of a scatter, a line's
 * markers). radius <= 0 draws nothing. */
void loom_raster_dot(loom_raster *r, double cx, double cy, double radius,
                     uint32_t rgb);

/* Text in a built-in bitmap font: each glyph 5x7 pixels in a 6x9 cell (one
 * column of space after each glyph; two rows below the baseline for the
 * descenders of g, p, q, y and of , ;), times `scale` (1..4, clamped), for
 * printable ASCII 32..126 (any other byte is drawn as '?'). One line: a
 * newline is drawn as '?' too. Opaque, not anti-aliased.
 * (x, y): the anchor point. anchor -1: x is the left edge, 0: the centre,
 * 1: the right edge. y is the vertical centre of the text's capital height
 * (digits and capitals are centred on y, descenders hang below).
 * vertical: rotated 90 degrees counter-clockwise (reading bottom to top, for
 * a y axis label), anchored likewise along its own direction (-1: y is the
 * bottom end, 0: the centre, 1: the top end) with x the centre across. */
void loom_raster_text(loom_raster *r, double x, double y, const char *s,
                      uint32_t rgb, int scale, int anchor, bool vertical);
/* Width in pixels that loom_raster_text would use (horizontal): from the
 * left edge of the first glyph to the right edge of the last one's 5
 * columns (no trailing space), so 6 * scale * n - scale for n > 0
 * characters and 0 for none. */
int loom_raster_text_width(const char *s, int scale);
/* Height in pixels of a line of text from the top of the capitals to the
 * bottom of the descenders: 9 * scale. */
int loom_raster_text_height(int scale);

/* The image as a PNG file dir/name (8-bit RGB, colour type 2, no interlace;
 * IHDR, one IDAT compressed with zlib, IEND) written with
 * loom_fs_write_atomic (so a symbolic link at the path is never written
 * through). Errors name the path. */
loom_status loom_raster_write_png(const loom_raster *r, const char *dir,
                                  const char *name);
/* The PNG bytes in memory (caller frees with loom_free), for tests. */
loom_status loom_raster_png(const loom_raster *r, void **out, size_t *len);

#endif /* LOOM_OBS_RASTER_H */
