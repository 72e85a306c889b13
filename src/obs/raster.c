/* The raster canvas of raster.h: an RGB image in memory, anti-aliased
 * lines, rectangles and dots, a 5x7 bitmap font, and the PNG encoding
 * (signature, IHDR, one zlib-compressed IDAT, IEND; PNG specification,
 * 2nd edition, sections 5 and 11). */
#include <limits.h>
#include <math.h>
#include <string.h>
#include <zlib.h>

#include "raster.h"

struct loom_raster {
  int w, h;
  unsigned char *px; /* (h, w, 3) RGB, rows top to bottom */
};

/* ------------------------------------------------------------ the image */

loom_raster *loom_raster_new(int w, int h, uint32_t bg) {
  if (w < 1 || h < 1 || w > LOOM_RASTER_MAX_SIDE || h > LOOM_RASTER_MAX_SIDE) {
    loom_error(LOOM_ERR_INVALID_ARG,
               "raster: size %d x %d outside 1..%d on each side", w, h,
               LOOM_RASTER_MAX_SIDE);
    return NULL;
  }
  loom_raster *r = loom_calloc(1, sizeof *r);
  if (!r)
    return NULL;
  size_t n = (size_t)w * (size_t)h;
  r->px = loom_malloc(n * 3);
  if (!r->px) {
    loom_free(r);
    return NULL;
  }
  r->w = w;
  r->h = h;
  unsigned char c[3] = {(unsigned char)(bg >> 16), (unsigned char)(bg >> 8),
                        (unsigned char)bg};
  for (size_t i = 0; i < n; i++)
    memcpy(r->px + 3 * i, c, 3);
  return r;
}

void loom_raster_free(loom_raster *r) {
  if (!r)
    return;
  loom_free(r->px);
  loom_free(r);
}

int loom_raster_width(const loom_raster *r) { return r ? r->w : 0; }
int loom_raster_height(const loom_raster *r) { return r ? r->h : 0; }

uint32_t loom_raster_get(const loom_raster *r, int x, int y) {
  if (!r || x < 0 || y < 0 || x >= r->w || y >= r->h)
    return 0;
  const unsigned char *p = r->px + 3 * ((size_t)y * (size_t)r->w + (size_t)x);
  return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | (uint32_t)p[2];
}

/* Mixes rgb into pixel (x, y), which must be inside, with weight a: the
 * pixel becomes old + (new - old) * a per channel, rounded. */
static void blend(loom_raster *r, int x, int y, uint32_t rgb, double a) {
  if (!(a > 0))
    return;
  unsigned char *p = r->px + 3 * ((size_t)y * (size_t)r->w + (size_t)x);
  for (int c = 0; c < 3; c++) {
    int nv = (int)(rgb >> (16 - 8 * c)) & 0xff;
    if (a >= 1) {
      p[c] = (unsigned char)nv;
    } else {
      double v = p[c] + (nv - p[c]) * a;
      p[c] = (unsigned char)(int)(v + 0.5);
    }
  }
}

static double clampd(double v, double lo, double hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* -------------------------------------------------------------- lines */

enum { OUT_LEFT = 1, OUT_RIGHT = 2, OUT_TOP = 4, OUT_BOTTOM = 8 };

static int outcode(double x, double y, double x0, double y0, double x1,
                   double y1) {
  int c = 0;
  if (x < x0)
    c |= OUT_LEFT;
  else if (x > x1)
    c |= OUT_RIGHT;
  if (y < y0)
    c |= OUT_TOP;
  else if (y > y1)
    c |= OUT_BOTTOM;
  return c;
}

/* Cohen-Sutherland: cuts the segment to the box [bx0, bx1] x [by0, by1].
 * Each cut computes the new point from the near end and a ratio in [0, 1],
 * so the result stays accurate for ends far outside. False when nothing of
 * the segment is inside. */
static bool clip_segment(double *x0, double *y0, double *x1, double *y1,
                         double bx0, double by0, double bx1, double by1) {
  for (int iter = 0; iter < 8; iter++) {
    int c0 = outcode(*x0, *y0, bx0, by0, bx1, by1);
    int c1 = outcode(*x1, *y1, bx0, by0, bx1, by1);
    if (!(c0 | c1))
      return true;
    if (c0 & c1)
      return false;
    int c = c0 ? c0 : c1;
    double dx = *x1 - *x0, dy = *y1 - *y0, x, y;
    if (c & OUT_TOP) {
      x = *x0 + dx * ((by0 - *y0) / dy);
      y = by0;
    } else if (c & OUT_BOTTOM) {
      x = *x0 + dx * ((by1 - *y0) / dy);
      y = by1;
    } else if (c & OUT_LEFT) {
      y = *y0 + dy * ((bx0 - *x0) / dx);
      x = bx0;
    } else {
      y = *y0 + dy * ((bx1 - *x0) / dx);
      x = bx1;
    }
    if (c == c0) {
      *x0 = x;
      *y0 = y;
    } else {
      *x1 = x;
      *y1 = y;
    }
  }
  /* Rounding kept a point a hair outside: close enough to pin it. */
  *x0 = clampd(*x0, bx0, bx1);
  *x1 = clampd(*x1, bx0, bx1);
  *y0 = clampd(*y0, by0, by1);
  *y1 = clampd(*y1, by0, by1);
  return true;
}

/* Draws the stroke of half-width hw around the segment: a pixel's coverage
 * is hw + 0.5 - d, clamped to [0, 1], with d the distance of its centre from
 * the segment (exact for a stroke crossing a row or column squarely, a
 * close estimate at other angles). */
static void stroke(loom_raster *r, double ax, double ay, double bx, double by,
                   uint32_t rgb, double hw) {
  double dx = bx - ax, dy = by - ay;
  if (!isfinite(dx) || !isfinite(dy)) {
    /* Ends more than DBL_MAX apart: two halves, each within range. */
    double mx = ax * 0.5 + bx * 0.5, my = ay * 0.5 + by * 0.5;
    stroke(r, ax, ay, mx, my, rgb, hw);
    stroke(r, mx, my, bx, by, rgb, hw);
    return;
  }
  double R = hw + 0.5, m = R + 1;
  if (!clip_segment(&ax, &ay, &bx, &by, -m, -m, r->w + m, r->h + m))
    return;
  dx = bx - ax;
  dy = by - ay;
  double len2 = dx * dx + dy * dy, len = sqrt(len2);
  double bxlo = clampd(floor(fmin(ax, bx) - R), 0, r->w - 1);
  double bxhi = clampd(ceil(fmax(ax, bx) + R), 0, r->w - 1);
  int ylo = (int)clampd(floor(fmin(ay, by) - R), 0, r->h - 1);
  int yhi = (int)clampd(ceil(fmax(ay, by) + R), 0, r->h - 1);
  for (int j = ylo; j <= yhi; j++) {
    double py = j + 0.5;
    double lo = bxlo, hi = bxhi;
    /* Within the row, only the band |cross| <= R * len around the line's
     * direction can be reached: px - ax in ((py - ay) dx -+ R len) / dy. */
    if (fabs(dy) > 1e-9 * len) {
      double e0 = ax + ((py - ay) * dx - R * len) / dy;
      double e1 = ax + ((py - ay) * dx + R * len) / dy;
      lo = fmax(lo, floor(fmin(e0, e1)) - 1);
      hi = fmin(hi, ceil(fmax(e0, e1)) + 1);
    }
    if (lo > hi)
      continue;
    for (int i = (int)lo; i <= (int)hi; i++) {
      double px = i + 0.5;
      double t = len2 > 0 ? ((px - ax) * dx + (py - ay) * dy) / len2 : 0;
      t = clampd(t, 0, 1);
      double ex = px - (ax + t * dx), ey = py - (ay + t * dy);
      double d = sqrt(ex * ex + ey * ey); /* all within the clip box */
      blend(r, i, j, rgb, clampd(R - d, 0, 1));
    }
  }
}

void loom_raster_line(loom_raster *r, double x0, double y0, double x1,
                      double y1, uint32_t rgb, double width) {
  if (!r || !isfinite(x0) || !isfinite(y0) || !isfinite(x1) || !isfinite(y1))
    return;
  /* NaN reads as 1; wider than the image cannot cover more. */
  width = clampd(width >= 1 ? width : 1, 1, 4.0 * LOOM_RASTER_MAX_SIDE);
  stroke(r, x0, y0, x1, y1, rgb, width / 2);
}

/* ------------------------------------------------- rectangles and dots */

void loom_raster_rect(loom_raster *r, double x, double y, double w, double h,
                      uint32_t rgb, double alpha) {
  if (!r || !isfinite(x) || !isfinite(y) || !isfinite(w) || !isfinite(h) ||
      !(w > 0) || !(h > 0) || !(alpha > 0))
    return;
  alpha = fmin(alpha, 1);
  double xa = fmax(x, 0), xb = fmin(x + w, r->w);
  double ya = fmax(y, 0), yb = fmin(y + h, r->h);
  if (!(xb > xa) || !(yb > ya))
    return;
  int i0 = (int)floor(xa), i1 = (int)ceil(xb) - 1;
  int j0 = (int)floor(ya), j1 = (int)ceil(yb) - 1;
  for (int j = j0; j <= j1; j++) {
    double cy = fmin(j + 1, yb) - fmax(j, ya);
    for (int i = i0; i <= i1; i++) {
      double cx = fmin(i + 1, xb) - fmax(i, xa);
      blend(r, i, j, rgb, cx * cy * alpha);
    }
  }
}

void loom_raster_dot(loom_raster *r, double cx, double cy, double radius,
                     uint32_t rgb) {
  if (!r || !isfinite(cx) || !isfinite(cy) || !isfinite(radius) ||
      !(radius > 0))
    return;
  double R = fmin(radius, 4.0 * LOOM_RASTER_MAX_SIDE) + 0.5;
  double xlo = fmax(floor(cx - R), 0), xhi = fmin(ceil(cx + R), r->w - 1);
  double ylo = fmax(floor(cy - R), 0), yhi = fmin(ceil(cy + R), r->h - 1);
  if (xlo > xhi || ylo > yhi)
    return;
  /* Here the box meets the image, so every offset is below R + 1. */
  for (int j = (int)ylo; j <= (int)yhi; j++)
    for (int i = (int)xlo; i <= (int)xhi; i++) {
      double ex = i + 0.5 - cx, ey = j + 0.5 - cy;
      blend(r, i, j, rgb, clampd(R - sqrt(ex * ex + ey * ey), 0, 1));
    }
}

/* --------------------------------------------------------------- text */

/* The font: printable ASCII 32..126, eight glyphs side by side per block,
 * each 5 columns wide with a blank column between, 7 rows. Capitals and
 * digits fill rows 0-6 (the baseline under row 6); lower case has its
 * x-height in rows 2-6. The glyphs listed in font_descends are drawn two
 * rows lower: their rows 0-4 sit on rows 2-6 of the others and their rows
 * 5-6 hang below the baseline into the cell's two spare rows. */
#define FONT_COLS 5
#define FONT_ROWS 7
#define CELL_W 6
#define CELL_H 9
#define FONT_FIRST 32
#define FONT_LAST 126
/* clang-format off */
static const char font[12][FONT_ROWS][8 * CELL_W] = {
  { /* space ! " # $ % & ' */
    "..... ..#.. .#.#. .#.#. ..#.. ##... .##.. ..#..",
    "..... ..#.. .#.#. .#.#. .#### ##..# #..#. ..#..",
    "..... ..#.. .#.#. ##### #.#.. ...#. #.#.. ..#..",
    "..... ..#.. ..... .#.#. .###. ..#.. .#... .....",
    "..... ..#.. ..... ##### ..#.# .#... #.#.# .....",
    "..... ..... ..... .#.#. ####. #..## #..#. .....",
    "..... ..#.. ..... .#.#. ..#.. ...## .##.# .....",
  },
  { /* ( ) * + , - . / */
    "...#. .#... ..... ..... ..... ..... ..... ....#",
    "..#.. ..#.. ..#.. ..#.. ..... ..... ..... ....#",
    ".#... ...#. #.#.# ..#.. ..... ..... ..... ...#.",
    ".#... ...#. .###. ##### .##.. ##### ..... ..#..",
    ".#... ...#. #.#.# ..#.. .##.. ..... ..... .#...",
    "..#.. ..#.. ..#.. ..#.. ..#.. ..... .##.. #....",
    "...#. .#... ..... ..... .#... ..... .##.. #....",
  },
  { /* 0 1 2 3 4 5 6 7 */
    ".###. ..#.. .###. ##### ...#. ##### ..##. #####",
    "#...# .##.. #...# ...#. ..##. #.... .#... ....#",
    "#..## ..#.. ....# ..#.. .#.#. ####. #.... ...#.",
    "#.#.# ..#.. ...#. ...#. #..#. ....# ####. ..#..",
    "##..# ..#.. ..#.. ....# ##### ....# #...# .#...",
    "#...# ..#.. .#... #...# ...#. #...# #...# .#...",
    ".###. .###. ##### .###. ...#. .###. .###. .#...",
  },
  { /* 8 9 : ; < = > ? */
    ".###. .###. ..... .##.. ...#. ..... .#... .###.",
    "#...# #...# ..... .##.. ..#.. ..... ..#.. #...#",
    "#...# #...# .##.. ..... .#... ##### ...#. ....#",
    ".###. .#### .##.. .##.. #.... ..... ....# ...#.",
    "#...# ....# ..... .##.. .#... ##### ...#. ..#..",
    "#...# ...#. .##.. ..#.. ..#.. ..... ..#.. .....",
    ".###. .##.. .##.. .#... ...#. ..... .#... ..#..",
  },
  { /* @ A B C D E F G */
    ".###. .###. ####. .###. ###.. ##### ##### .###.",
    "#...# #...# #...# #...# #..#. #.... #.... #...#",
    "#.### #...# #...# #.... #...# #.... #.... #....",
    "#.#.# ##### ####. #.... #...# ####. ####. #.###",
    "#.### #...# #...# #.... #...# #.... #.... #...#",
    "#.... #...# #...# #...# #..#. #.... #.... #...#",
    ".###. #...# ####. .###. ###.. ##### #.... .####",
  },
  { /* H I J K L M N O */
    "#...# .###. ..### #...# #.... #...# #...# .###.",
    "#...# ..#.. ...#. #..#. #.... ##.## #...# #...#",
    "#...# ..#.. ...#. #.#.. #.... #.#.# ##..# #...#",
    "##### ..#.. ...#. ##... #.... #.#.# #.#.# #...#",
    "#...# ..#.. ...#. #.#.. #.... #...# #..## #...#",
    "#...# ..#.. #..#. #..#. #.... #...# #...# #...#",
    "#...# .###. .##.. #...# ##### #...# #...# .###.",
  },
  { /* P Q R S T U V W */
    "####. .###. ####. .#### ##### #...# #...# #...#",
    "#...# #...# #...# #.... ..#.. #...# #...# #...#",
    "#...# #...# #...# #.... ..#.. #...# #...# #...#",
    "####. #...# ####. .###. ..#.. #...# #...# #.#.#",
    "#.... #.#.# #.#.. ....# ..#.. #...# #...# #.#.#",
    "#.... #..#. #..#. ....# ..#.. #...# .#.#. #.#.#",
    "#.... .##.# #...# ####. ..#.. .###. ..#.. .#.#.",
  },
  { /* X Y Z [ \ ] ^ _ */
    "#...# #...# ##### .###. #.... .###. ..#.. .....",
    "#...# #...# ....# .#... #.... ...#. .#.#. .....",
    ".#.#. .#.#. ...#. .#... .#... ...#. #...# .....",
    "..#.. ..#.. ..#.. .#... ..#.. ...#. ..... .....",
    ".#.#. ..#.. .#... .#... ...#. ...#. ..... .....",
    "#...# ..#.. #.... .#... ....# ...#. ..... .....",
    "#...# ..#.. ##### .###. ....# .###. ..... #####",
  },
  { /* ` a b c d e f g */
    ".#... ..... #.... ..... ....# ..... ..##. .####",
    "..#.. ..... #.... ..... ....# ..... .#..# #...#",
    "...#. .###. #.##. .###. .##.# .###. .#... #...#",
    "..... ....# ##..# #.... #..## #...# ###.. #...#",
    "..... .#### #...# #.... #...# ##### .#... .####",
    "..... #...# #...# #...# #...# #.... .#... ....#",
    "..... .#### ####. .###. .#### .###. .#... .###.",
  },
  { /* h i j k l m n o */
    "#.... ..#.. ...#. #.... .##.. ..... ..... .....",
    "#.... ..... ..... #.... ..#.. ..... ..... .....",
    "#.##. .##.. ..##. #..#. ..#.. ##.#. #.##. .###.",
    "##..# ..#.. ...#. #.#.. ..#.. #.#.# ##..# #...#",
    "#...# ..#.. ...#. ##... ..#.. #.#.# #...# #...#",
    "#...# ..#.. #..#. #.#.. ..#.. #.#.# #...# #...#",
    "#...# .###. .##.. #..#. .###. #...# #...# .###.",
  },
  { /* p q r s t u v w */
    "####. .#### ..... ..... .#... ..... ..... .....",
    "#...# #...# ..... ..... .#... ..... ..... .....",
    "#...# #...# #.##. .#### ###.. #...# #...# #...#",
    "#...# #...# ##..# #.... .#... #...# #...# #...#",
    "####. .#### #.... .###. .#... #...# #...# #.#.#",
    "#.... ....# #.... ....# .#..# #..## .#.#. #.#.#",
    "#.... ....# #.... ####. ..##. .##.# ..#.. .#.#.",
  },
  { /* x y z { | } ~ */
    "..... #...# ..... ...## ..#.. ##... .....",
    "..... #...# ..... ..#.. ..#.. ..#.. .....",
    "#...# #...# ##### ..#.. ..#.. ..#.. .#...",
    ".#.#. #...# ...#. .#... ..#.. ...#. #.#.#",
    "..#.. .#### ..#.. ..#.. ..#.. ..#.. ...#.",
    ".#.#. ....# .#... ..#.. ..#.. ..#.. .....",
    "#...# .###. ##### ...## ..#.. ##... .....",
  },
};
/* clang-format on */
_Static_assert(sizeof font / sizeof font[0] * 8 >= FONT_LAST - FONT_FIRST + 1,
               "the font covers printable ASCII");

static const char font_descends[] = "gpqy,;";

static int glyph_index(unsigned char c) {
  return (c >= FONT_FIRST && c <= FONT_LAST ? c : '?') - FONT_FIRST;
}

static bool glyph_ink(int g, int row, int col) {
  return font[g / 8][row][(g % 8) * CELL_W + col] == '#';
}

static int glyph_shift(int g) {
  return strchr(font_descends, g + FONT_FIRST) ? 2 : 0;
}

static int clamp_scale(int scale) {
  return scale < 1 ? 1 : scale > 4 ? 4 : scale;
}

int loom_raster_text_width(const char *s, int scale) {
  if (!s || !s[0])
    return 0;
  scale = clamp_scale(scale);
  size_t n = strlen(s);
  if (n > (size_t)(INT_MAX / (CELL_W * scale)))
    return INT_MAX;
  return (int)n * CELL_W * scale - scale;
}

int loom_raster_text_height(int scale) { return CELL_H * clamp_scale(scale); }

/* Sets the pixel at text coordinates (u along the text, v down across it)
 * from the origin (ox, oy): the text's top-left corner when horizontal, its
 * bottom-left corner (the glyphs' tops facing left) when vertical. */
static void text_pixel(loom_raster *r, long long ox, long long oy, long long u,
                       long long v, bool vertical, uint32_t rgb) {
  long long x = vertical ? ox + v : ox + u;
  long long y = vertical ? oy - 1 - u : oy + v;
  if (x >= 0 && y >= 0 && x < r->w && y < r->h)
    blend(r, (int)x, (int)y, rgb, 1);
}

void loom_raster_text(loom_raster *r, double x, double y, const char *s,
                      uint32_t rgb, int scale, int anchor, bool vertical) {
  if (!r || !s || !s[0] || !isfinite(x) || !isfinite(y))
    return;
  scale = clamp_scale(scale);
  double f = anchor < 0 ? 0 : anchor > 0 ? 1 : 0.5;
  double along = loom_raster_text_width(s, scale);
  double lim = 2.0 * LOOM_RASTER_MAX_SIDE + along;
  /* Horizontal: the left edge and the top of the capitals. Vertical: the
   * bottom edge (where the text starts) and the left side (the glyphs'
   * tops). Capitals are 7 rows high, so their centre is 3.5 rows down. */
  double ou =
      vertical ? floor(y + f * along + 0.5) : floor(x - f * along + 0.5);
  double ov =
      vertical ? floor(x - 3.5 * scale + 0.5) : floor(y - 3.5 * scale + 0.5);
  if (fabs(ou) > lim || fabs(ov) > lim)
    return; /* nothing of it can reach the image */
  long long ox = vertical ? (long long)ov : (long long)ou;
  long long oy = vertical ? (long long)ou : (long long)ov;
  long long n_along = vertical ? r->h : r->w;
  long long start = vertical ? oy - r->h : -ox; /* u of the image's edge */
  for (size_t k = 0; s[k]; k++) {
    long long u0 = (long long)k * CELL_W * scale;
    if (u0 - start >= n_along)
      break; /* past the far edge of the image */
    if (u0 + FONT_COLS * scale <= start)
      continue;
    int g = glyph_index((unsigned char)s[k]);
    int shift = glyph_shift(g);
    for (int row = 0; row < FONT_ROWS; row++)
      for (int col = 0; col < FONT_COLS; col++) {
        if (!glyph_ink(g, row, col))
          continue;
        for (int a = 0; a < scale; a++)
          for (int b = 0; b < scale; b++)
            text_pixel(r, ox, oy, u0 + col * scale + a,
                       (long long)(row + shift) * scale + b, vertical, rgb);
      }
  }
}

/* ---------------------------------------------------------------- PNG */

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

/* Frames the n data bytes already at p + 8 as a chunk of the given type:
 * length, type, data, CRC-32 of type and data. Returns the chunk's size. */
static size_t chunk(unsigned char *p, const char type[4], size_t n) {
  put_be32(p, (uint32_t)n);
  memcpy(p + 4, type, 4);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, p + 4, (uInt)(4 + n));
  put_be32(p + 8 + n, (uint32_t)crc);
  return 12 + n;
}

loom_status loom_raster_png(const loom_raster *r, void **out, size_t *len) {
  if (!out || !len)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_raster_png: NULL output");
  *out = NULL;
  *len = 0;
  if (!r)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_raster_png: NULL raster");
  /* Each row: filter type 0 (None), then its w RGB triples. */
  size_t row = 1 + 3 * (size_t)r->w;
  size_t raw_n = row * (size_t)r->h;
  unsigned char *raw = loom_malloc(raw_n); /* (h, 1 + 3w) */
  if (!raw)
    return loom_error_context(LOOM_ERR_NOMEM, "PNG rows");
  for (int y = 0; y < r->h; y++) {
    raw[row * (size_t)y] = 0;
    memcpy(raw + row * (size_t)y + 1, r->px + (row - 1) * (size_t)y, row - 1);
  }
  uLong bound = compressBound((uLong)raw_n);
  static const unsigned char sig[8] = {0x89, 'P',  'N',  'G',
                                       '\r', '\n', 0x1a, '\n'};
  size_t cap = sizeof sig + (12 + 13) + (12 + (size_t)bound) + 12;
  unsigned char *png = loom_malloc(cap);
  if (!png) {
    loom_free(raw);
    return loom_error_context(LOOM_ERR_NOMEM, "PNG buffer");
  }
  size_t n = 0;
  memcpy(png, sig, sizeof sig);
  n += sizeof sig;
  unsigned char *ihdr = png + n + 8;
  put_be32(ihdr, (uint32_t)r->w);
  put_be32(ihdr + 4, (uint32_t)r->h);
  ihdr[8] = 8;  /* bits per channel */
  ihdr[9] = 2;  /* colour type: RGB */
  ihdr[10] = 0; /* compression: deflate */
  ihdr[11] = 0; /* filter method 0 */
  ihdr[12] = 0; /* no interlace */
  n += chunk(png + n, "IHDR", 13);
  uLongf zn = bound;
  int zs = compress2(png + n + 8, &zn, raw, (uLong)raw_n, 6);
  loom_free(raw);
  if (zs != Z_OK || zn > 0x7fffffffu) {
    loom_free(png);
    return zs == Z_MEM_ERROR
               ? loom_error(LOOM_ERR_NOMEM, "PNG: zlib compress2 out of memory")
               : loom_error(LOOM_ERR_INTERNAL,
                            "PNG: zlib compress2 failed (%d)", zs);
  }
  n += chunk(png + n, "IDAT", (size_t)zn);
  n += chunk(png + n, "IEND", 0);
  *out = png;
  *len = n;
  return LOOM_OK;
}

loom_status loom_raster_write_png(const loom_raster *r, const char *dir,
                                  const char *name) {
  if (!dir || !name)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_raster_write_png: NULL directory or name");
  void *png;
  size_t n;
  loom_status st = loom_raster_png(r, &png, &n);
  if (st == LOOM_OK)
    st = loom_fs_write_atomic(dir, name, png, n);
  loom_free(png);
  if (st != LOOM_OK)
    return loom_error_context(st, "writing PNG %s/%s", dir, name);
  return LOOM_OK;
}
