/* Tests of the raster canvas behind `loom report --png`: where lines, rects,
 * dots and text put their pixels, clipping of any coordinates, and the PNG
 * bytes read back by a decoder written here from the PNG specification
 * (chunks, CRCs, zlib stream, filter bytes). With LOOM_RASTER_DEMO=path set
 * it also writes a demo image to that path, to look at. */
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "obs/raster.h"
#include "tt.h"

#define WHITE 0xffffffu
#define BLACK 0x000000u

static int chan(uint32_t c, int k) { return (int)(c >> (16 - 8 * k)) & 0xff; }

/* Whether each channel of a is within tol of b's. */
static bool near_rgb(uint32_t a, uint32_t b, int tol) {
  for (int k = 0; k < 3; k++)
    if (abs(chan(a, k) - chan(b, k)) > tol)
      return false;
  return true;
}

/* A checksum of every pixel, to see that a call changed nothing. */
static uint32_t image_crc(const loom_raster *r) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int y = 0; y < loom_raster_height(r); y++)
    for (int x = 0; x < loom_raster_width(r); x++) {
      uint32_t p = loom_raster_get(r, x, y);
      crc = crc32(crc, (const Bytef *)&p, sizeof p);
    }
  return (uint32_t)crc;
}

/* The bounding box of the pixels that are not bg; false when there are
 * none. */
typedef struct {
  int x0, y0, x1, y1; /* inclusive */
  long n;
} ink_box;

static bool ink(const loom_raster *r, uint32_t bg, ink_box *b) {
  *b = (ink_box){INT32_MAX, INT32_MAX, -1, -1, 0};
  for (int y = 0; y < loom_raster_height(r); y++)
    for (int x = 0; x < loom_raster_width(r); x++)
      if (loom_raster_get(r, x, y) != bg) {
        b->x0 = x < b->x0 ? x : b->x0;
        b->y0 = y < b->y0 ? y : b->y0;
        b->x1 = x > b->x1 ? x : b->x1;
        b->y1 = y > b->y1 ? y : b->y1;
        b->n++;
      }
  return b->n > 0;
}

static void clear(loom_raster *r, uint32_t bg) {
  loom_raster_rect(r, 0, 0, loom_raster_width(r), loom_raster_height(r), bg, 1);
}

/* ------------------------------------------------------------- canvas */

TT_TEST(test_new_and_get) {
  loom_raster *r = loom_raster_new(7, 5, 0x123456);
  TT_REQUIRE(r != NULL);
  TT_CHECK_EQ(loom_raster_width(r), 7);
  TT_CHECK_EQ(loom_raster_height(r), 5);
  TT_CHECK_EQ(loom_raster_get(r, 0, 0), 0x123456);
  TT_CHECK_EQ(loom_raster_get(r, 6, 4), 0x123456);
  TT_CHECK_EQ(loom_raster_get(r, 7, 0), 0); /* outside */
  TT_CHECK_EQ(loom_raster_get(r, -1, 0), 0);
  loom_raster_free(r);
  loom_raster_free(NULL);
  TT_CHECK(loom_raster_new(0, 5, 0) == NULL);
  TT_CHECK(loom_raster_new(5, -1, 0) == NULL);
  TT_CHECK(loom_raster_new(LOOM_RASTER_MAX_SIDE + 1, 1, 0) == NULL);
  /* Every allocation failing in turn: NULL with NOMEM, nothing leaked. */
  for (long k = 1; k <= 2; k++) {
    loom_alloc_fail_after(k);
    loom_raster *f = loom_raster_new(8, 8, 0);
    loom_alloc_fail_after(0);
    TT_CHECK(f == NULL);
    TT_CHECK(strstr(loom_last_error(), "memory") != NULL ||
             strstr(loom_last_error(), "alloc") != NULL);
  }
}

TT_TEST(test_lines) {
  loom_raster *r = loom_raster_new(40, 40, WHITE);
  TT_REQUIRE(r != NULL);
  /* Through pixel centres: exactly row 20, nothing above or below. */
  loom_raster_line(r, 5, 20.5, 35, 20.5, BLACK, 1);
  for (int x = 5; x < 35; x++) /* centres 5.5 .. 34.5 */
    TT_CHECK_EQ(loom_raster_get(r, x, 20), BLACK);
  for (int x = 0; x < 40; x++) {
    TT_CHECK_EQ(loom_raster_get(r, x, 18), WHITE);
    TT_CHECK_EQ(loom_raster_get(r, x, 19), WHITE);
    TT_CHECK_EQ(loom_raster_get(r, x, 21), WHITE);
    TT_CHECK_EQ(loom_raster_get(r, x, 22), WHITE);
  }
  /* Round ends reach half a width past the end points, no further. */
  TT_CHECK(near_rgb(loom_raster_get(r, 4, 20), 0x808080, 1));
  TT_CHECK_EQ(loom_raster_get(r, 3, 20), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 37, 20), WHITE);

  /* On a pixel edge: the two rows it splits, half each. */
  clear(r, WHITE);
  loom_raster_line(r, 5, 10, 35, 10, BLACK, 1);
  TT_CHECK(near_rgb(loom_raster_get(r, 20, 9), 0x808080, 1));
  TT_CHECK(near_rgb(loom_raster_get(r, 20, 10), 0x808080, 1));
  TT_CHECK_EQ(loom_raster_get(r, 20, 8), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 20, 11), WHITE);

  /* Width 3 covers three rows; vertical lines likewise in columns. */
  clear(r, WHITE);
  loom_raster_line(r, 5, 30.5, 35, 30.5, 0xff0000, 3);
  loom_raster_line(r, 10.5, 2, 10.5, 25, 0x0000ff, 2);
  for (int y = 29; y <= 31; y++)
    TT_CHECK_EQ(loom_raster_get(r, 20, y), 0xff0000);
  TT_CHECK_EQ(loom_raster_get(r, 20, 28), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 20, 32), WHITE);
  TT_CHECK(near_rgb(loom_raster_get(r, 9, 12), 0x8080ff, 1));
  TT_CHECK_EQ(loom_raster_get(r, 10, 12), 0x0000ff);
  TT_CHECK(near_rgb(loom_raster_get(r, 11, 12), 0x8080ff, 1));
  TT_CHECK_EQ(loom_raster_get(r, 8, 12), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 12, 12), WHITE);

  /* A diagonal: its midpoint is the colour, far off it nothing. */
  clear(r, WHITE);
  loom_raster_line(r, 5.5, 5.5, 35.5, 35.5, BLACK, 1);
  TT_CHECK_EQ(loom_raster_get(r, 20, 20), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 10, 10), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 20, 23), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 23, 20), WHITE);
  /* The other direction and a shallow slope: coloured where they pass. */
  clear(r, WHITE);
  loom_raster_line(r, 35, 5, 5, 35, BLACK, 2);
  TT_CHECK(near_rgb(loom_raster_get(r, 19, 19), BLACK, 40) ||
           near_rgb(loom_raster_get(r, 20, 19), BLACK, 40));
  clear(r, WHITE);
  loom_raster_line(r, 0.5, 10.5, 39.5, 20.5, BLACK, 1);
  /* At x = 20.5 the line is at y = 10.5 + 10 * 20 / 39 = 15.63. */
  TT_CHECK(chan(loom_raster_get(r, 20, 15), 0) < 100);
  TT_CHECK_EQ(loom_raster_get(r, 20, 13), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 20, 18), WHITE);
  /* A zero-length line is a round dot of its width. */
  clear(r, WHITE);
  loom_raster_line(r, 20.5, 20.5, 20.5, 20.5, BLACK, 3);
  TT_CHECK_EQ(loom_raster_get(r, 20, 20), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 21, 20), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 23, 20), WHITE);
  loom_raster_free(r);
}

TT_TEST(test_clipping) {
  loom_raster *r = loom_raster_new(31, 17, WHITE);
  TT_REQUIRE(r != NULL);
  uint32_t blank = image_crc(r);
  const double bad[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 3; i++) {
    double b = bad[i];
    loom_raster_line(r, b, 1, 5, 5, BLACK, 1);
    loom_raster_line(r, 1, b, 5, 5, BLACK, 1);
    loom_raster_line(r, 1, 1, b, 5, BLACK, 1);
    loom_raster_line(r, 1, 1, 5, b, BLACK, 1);
    loom_raster_rect(r, b, 0, 5, 5, BLACK, 1);
    loom_raster_rect(r, 0, b, 5, 5, BLACK, 1);
    loom_raster_rect(r, 0, 0, b, 5, BLACK, 1);
    loom_raster_rect(r, 0, 0, 5, b, BLACK, 1);
    loom_raster_rect(r, 0, 0, 5, 5, BLACK, NAN);
    loom_raster_dot(r, b, 5, 3, BLACK);
    loom_raster_dot(r, 5, b, 3, BLACK);
    loom_raster_dot(r, 5, 5, b, BLACK);
    loom_raster_text(r, b, 5, "NaN", BLACK, 1, 0, false);
    loom_raster_text(r, 5, b, "NaN", BLACK, 1, 0, true);
  }
  /* Nothing, and things entirely outside. */
  loom_raster_rect(r, 0, 0, 0, 5, BLACK, 1);
  loom_raster_rect(r, 0, 0, 5, -1, BLACK, 1);
  loom_raster_rect(r, 0, 0, 5, 5, BLACK, 0);
  loom_raster_rect(r, 1e300, 1e300, 1e300, 1e300, BLACK, 1);
  loom_raster_rect(r, -1e300, 0, 1e299, 5, BLACK, 1);
  loom_raster_dot(r, 5, 5, 0, BLACK);
  loom_raster_dot(r, 5, 5, -2, BLACK);
  loom_raster_dot(r, 1e300, -1e300, 1e10, BLACK);
  loom_raster_line(r, -1e300, -1e300, -1e300, 1e300, BLACK, 5);
  loom_raster_line(r, 100, 100, 1e308, 1e308, BLACK, 5);
  loom_raster_line(r, -DBL_MAX, 40, DBL_MAX, 40, BLACK, 1);
  loom_raster_text(r, 1e300, 5, "far", BLACK, 4, -1, false);
  loom_raster_text(r, -1e18, 5, "far", BLACK, 4, 1, false);
  loom_raster_text(r, 5, -1e300, "far", BLACK, 4, 0, true);
  loom_raster_text(r, 5, 5, NULL, BLACK, 1, 0, false);
  loom_raster_text(r, 5, 5, "", BLACK, 1, 0, false);
  loom_raster_line(NULL, 0, 0, 1, 1, BLACK, 1);
  loom_raster_rect(NULL, 0, 0, 1, 1, BLACK, 1);
  loom_raster_dot(NULL, 0, 0, 1, BLACK);
  loom_raster_text(NULL, 0, 0, "x", BLACK, 1, 0, false);
  TT_CHECK_EQ(image_crc(r), blank);

  /* Far-out ends of lines that cross the image: drawn where they cross. */
  loom_raster_line(r, -1e9, 8.5, 1e9, 8.5, BLACK, 1);
  for (int x = 0; x < 31; x++)
    TT_CHECK_EQ(loom_raster_get(r, x, 8), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 10, 7), WHITE);
  clear(r, WHITE);
  loom_raster_line(r, 12.5, -1e12, 12.5, 1e15, BLACK, 1);
  for (int y = 0; y < 17; y++)
    TT_CHECK_EQ(loom_raster_get(r, 12, y), BLACK);
  clear(r, WHITE);
  loom_raster_line(r, -1e6 + 0.5, -1e6 + 0.5, 1e6 + 0.5, 1e6 + 0.5, BLACK, 1);
  TT_CHECK_EQ(loom_raster_get(r, 8, 8), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 8, 12), WHITE);
  /* Ends as far as doubles go, and widths out of range: safe. */
  loom_raster_line(r, -DBL_MAX, -DBL_MAX, DBL_MAX, DBL_MAX, BLACK, 1);
  loom_raster_line(r, -DBL_MAX, DBL_MAX, DBL_MAX, -DBL_MAX, BLACK, 1e300);
  loom_raster_line(r, 0, 0, 30, 16, BLACK, NAN);
  loom_raster_line(r, 0, 0, 30, 16, BLACK, -3);
  loom_raster_line(r, 0, 0, 30, 16, BLACK, INFINITY);
  loom_raster_dot(r, 5, 5, 1e300, BLACK);
  loom_raster_dot(r, 5, 5, DBL_MAX, BLACK);
  /* Rects half outside fill what is inside, to the pixel. */
  clear(r, WHITE);
  loom_raster_rect(r, -5, -5, 10, 10, BLACK, 1);
  TT_CHECK_EQ(loom_raster_get(r, 0, 0), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 4, 4), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 5, 4), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 4, 5), WHITE);
  loom_raster_rect(r, 25, 10, 1e300, 1e300, BLACK, 1);
  TT_CHECK_EQ(loom_raster_get(r, 30, 16), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 24, 16), WHITE);
  loom_raster_rect(r, -DBL_MAX, -DBL_MAX, DBL_MAX, DBL_MAX, 0x00ff00, 1);
  loom_raster_rect(r, -1e308, -1e308, DBL_MAX, DBL_MAX, 0x00ff00, 1);
  TT_CHECK_EQ(loom_raster_get(r, 15, 8), 0x00ff00);
  loom_raster_free(r);
}

TT_TEST(test_rect_and_dot) {
  loom_raster *r = loom_raster_new(20, 20, WHITE);
  TT_REQUIRE(r != NULL);
  loom_raster_rect(r, 2, 3, 5, 4, BLACK, 0.5);
  ink_box b;
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.x0, 2);
  TT_CHECK_EQ(b.x1, 6);
  TT_CHECK_EQ(b.y0, 3);
  TT_CHECK_EQ(b.y1, 6);
  TT_CHECK_EQ(b.n, 20);
  TT_CHECK(near_rgb(loom_raster_get(r, 4, 4), 0x808080, 1));
  /* Not only grey: each channel at its midpoint. */
  loom_raster *c = loom_raster_new(4, 4, 0x204060);
  TT_REQUIRE(c != NULL);
  loom_raster_rect(c, 0, 0, 4, 4, 0xa0c0e0, 0.5);
  TT_CHECK(near_rgb(loom_raster_get(c, 2, 2), 0x6080a0, 1));
  /* alpha above 1 is opaque. */
  loom_raster_rect(c, 0, 0, 4, 4, 0x010203, 7);
  TT_CHECK_EQ(loom_raster_get(c, 3, 3), 0x010203);
  loom_raster_free(c);
  /* A fractional edge: the pixel it halves is half blended. */
  clear(r, WHITE);
  loom_raster_rect(r, 10.5, 10, 3, 2, BLACK, 1);
  TT_CHECK(near_rgb(loom_raster_get(r, 10, 10), 0x808080, 1));
  TT_CHECK_EQ(loom_raster_get(r, 11, 10), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, 12, 11), BLACK);
  TT_CHECK(near_rgb(loom_raster_get(r, 13, 11), 0x808080, 1));
  TT_CHECK_EQ(loom_raster_get(r, 14, 11), WHITE);
  /* A dot: solid inside, nothing past radius + 1, symmetric. */
  clear(r, WHITE);
  loom_raster_dot(r, 10, 10, 3, 0x0000ff);
  TT_CHECK_EQ(loom_raster_get(r, 9, 9), 0x0000ff);
  TT_CHECK_EQ(loom_raster_get(r, 10, 10), 0x0000ff);
  TT_CHECK_EQ(loom_raster_get(r, 10, 8), 0x0000ff);
  TT_CHECK_EQ(loom_raster_get(r, 5, 10), WHITE);
  TT_CHECK_EQ(loom_raster_get(r, 14, 10), WHITE);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.x0, 20 - 1 - b.x1);
  TT_CHECK_EQ(b.y0, 20 - 1 - b.y1);
  TT_CHECK_EQ(b.x1 - b.x0, 5); /* centres within radius + 0.5 */
  loom_raster_free(r);
}

/* --------------------------------------------------------------- text */

TT_TEST(test_text_glyphs) {
  loom_raster *r = loom_raster_new(80, 40, WHITE);
  TT_REQUIRE(r != NULL);
  ink_box b;
  /* '?' as the reference for bytes outside printable ASCII. */
  loom_raster_text(r, 10, 20, "?", BLACK, 2, -1, false);
  TT_REQUIRE(ink(r, WHITE, &b));
  uint32_t q_crc = image_crc(r);
  for (int c = 32; c <= 126; c++) {
    char s[2] = {(char)c, 0};
    for (int scale = 1; scale <= 2; scale++) {
      clear(r, WHITE);
      loom_raster_text(r, 10, 20, s, BLACK, scale, -1, false);
      bool any = ink(r, WHITE, &b);
      if (c == ' ') {
        TT_CHECK(!any);
        continue;
      }
      if (!any) {
        fprintf(stderr, "glyph '%c' (%d) draws nothing\n", c, c);
        TT_CHECK(any);
        continue;
      }
      /* Inside its cell: 5 columns from x, 9 rows from the capitals' top
       * (3.5 rows above y). */
      int top = (int)(20 - 3.5 * scale + 0.5);
      if (b.x0 < 10 || b.x1 >= 10 + 5 * scale || b.y0 < top ||
          b.y1 >= top + 9 * scale) {
        fprintf(stderr, "glyph '%c' outside its cell: %d..%d x %d..%d\n", c,
                b.x0, b.x1, b.y0, b.y1);
        TT_CHECK(false);
      }
    }
  }
  /* Digits and capitals stand on one baseline, 7 rows from the top. */
  const char *caps = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (const char *p = caps; *p; p++) {
    char s[2] = {*p, 0};
    clear(r, WHITE);
    loom_raster_text(r, 10, 20, s, BLACK, 1, -1, false);
    TT_REQUIRE(ink(r, WHITE, &b));
    TT_CHECK_EQ(b.y0, 17);
    TT_CHECK_EQ(b.y1, 23);
  }
  /* Descenders go below it. */
  clear(r, WHITE);
  loom_raster_text(r, 10, 20, "g", BLACK, 1, -1, false);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK(b.y1 > 23);
  /* Anything else is '?'. */
  const char odd[] = {'\n', '\t', 1, (char)127, (char)0xc3, (char)0xff};
  for (size_t i = 0; i < sizeof odd; i++) {
    char s[2] = {odd[i], 0};
    clear(r, WHITE);
    loom_raster_text(r, 10, 20, s, BLACK, 2, -1, false);
    TT_CHECK_EQ(image_crc(r), q_crc);
  }
  loom_raster_free(r);
}

TT_TEST(test_text_width_and_anchors) {
  loom_raster *r = loom_raster_new(300, 60, WHITE);
  TT_REQUIRE(r != NULL);
  TT_CHECK_EQ(loom_raster_text_width("", 1), 0);
  TT_CHECK_EQ(loom_raster_text_width(NULL, 1), 0);
  TT_CHECK_EQ(loom_raster_text_width("A", 1), 5);
  TT_CHECK_EQ(loom_raster_text_width("AB", 2), 22);
  TT_CHECK_EQ(loom_raster_text_width("AB", 0), 11);  /* scale 1 */
  TT_CHECK_EQ(loom_raster_text_width("AB", 99), 44); /* scale 4 */
  TT_CHECK_EQ(loom_raster_text_height(2), 18);
  /* Strings whose first glyph has ink in its left column and last in its
   * right one: the ink spans exactly the width. */
  const char *strs[] = {"H", "E=mc2", "Both axes W", "Loss 0.25 M", "5e-3 N"};
  ink_box b;
  for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
    for (int scale = 1; scale <= 4; scale++) {
      int w = loom_raster_text_width(strs[i], scale);
      if (w > 280)
        continue;
      clear(r, WHITE);
      loom_raster_text(r, 10, 30, strs[i], BLACK, scale, -1, false);
      TT_REQUIRE(ink(r, WHITE, &b));
      TT_CHECK_EQ(b.x0, 10);
      TT_CHECK_EQ(b.x1 - b.x0 + 1, w);
      /* Right anchor: the right edge at x (the last column x - 1). */
      clear(r, WHITE);
      loom_raster_text(r, 290, 30, strs[i], BLACK, scale, 1, false);
      TT_REQUIRE(ink(r, WHITE, &b));
      TT_CHECK_EQ(b.x1, 289);
      TT_CHECK_EQ(b.x1 - b.x0 + 1, w);
      /* Centre anchor: the ink's centre at x. */
      clear(r, WHITE);
      loom_raster_text(r, 150, 30, strs[i], BLACK, scale, 0, false);
      TT_REQUIRE(ink(r, WHITE, &b));
      TT_CHECK(fabs((b.x0 + b.x1 + 1) / 2.0 - 150) <= 3);
      /* Vertically: capitals centred on y. */
      TT_CHECK(fabs((b.y0 + b.y1 + 1) / 2.0 - 30) <= 3);
    }
  /* Each glyph between two H: the width still matches the ink. */
  for (int c = 32; c <= 126; c++) {
    char s[4] = {'H', (char)c, 'H', 0};
    clear(r, WHITE);
    loom_raster_text(r, 20, 30, s, BLACK, 3, -1, false);
    TT_REQUIRE(ink(r, WHITE, &b));
    TT_CHECK_EQ(b.x1 - b.x0 + 1, loom_raster_text_width(s, 3));
  }
  /* Clipped at the image's edges: what fits is drawn. */
  clear(r, WHITE);
  loom_raster_text(r, -7, 30, "HHHH", BLACK, 2, -1, false);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.x0, 0);
  TT_CHECK_EQ(b.x1, -7 + loom_raster_text_width("HHHH", 2) - 1);
  loom_raster_free(r);
}

TT_TEST(test_text_vertical) {
  loom_raster *r = loom_raster_new(60, 200, WHITE);
  TT_REQUIRE(r != NULL);
  ink_box b;
  const char *s = "Validation loss";
  int w = loom_raster_text_width(s, 1);
  loom_raster_text(r, 30, 100, s, BLACK, 1, 0, true);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK(b.y1 - b.y0 > b.x1 - b.x0);
  TT_CHECK(fabs((b.y0 + b.y1 + 1) / 2.0 - 100) <= 3);
  TT_CHECK(fabs((b.x0 + b.x1 + 1) / 2.0 - 30) <= 3);
  /* "Validation loss" starts and ends in glyph columns with ink ('V' and
   * 's' both reach columns 0 and 4), so the ink's height is the width. */
  TT_CHECK_EQ(b.y1 - b.y0 + 1, w);
  /* anchor -1: starts at y (the bottom end); 1: ends at y (the top). */
  clear(r, WHITE);
  loom_raster_text(r, 30, 195, s, BLACK, 2, -1, true);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.y1, 194);
  TT_CHECK_EQ(b.y1 - b.y0 + 1, loom_raster_text_width(s, 2));
  clear(r, WHITE);
  loom_raster_text(r, 30, 20, "Loss", BLACK, 2, 1, true);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.y0, 20);
  /* Counter-clockwise: an 'L' lies with its stem along the bottom and its
   * foot pointing up at the right end (reading bottom to top). */
  clear(r, WHITE);
  loom_raster_text(r, 30, 100, "L", BLACK, 1, -1, true);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.x1 - b.x0 + 1, 7);
  TT_CHECK_EQ(b.y1 - b.y0 + 1, 5);
  for (int x = b.x0; x <= b.x1; x++)
    TT_CHECK_EQ(loom_raster_get(r, x, b.y1), BLACK);
  for (int y = b.y0; y <= b.y1; y++)
    TT_CHECK_EQ(loom_raster_get(r, b.x1, y), BLACK);
  TT_CHECK_EQ(loom_raster_get(r, b.x0, b.y0), WHITE);
  /* The first character at the bottom: "L." has its dot above the L. */
  clear(r, WHITE);
  loom_raster_text(r, 30, 100, "L.", BLACK, 1, -1, true);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK_EQ(b.y1, 99);
  TT_CHECK_EQ(loom_raster_get(r, b.x0, b.y1), BLACK); /* L's stem */
  /* Clipped at the top and bottom: safe, and what fits is drawn. */
  clear(r, WHITE);
  loom_raster_text(r, 30, 100, "a long label that does not fit in 200 px",
                   BLACK, 2, 0, true);
  TT_REQUIRE(ink(r, WHITE, &b));
  TT_CHECK(b.y0 <= 12);
  TT_CHECK(b.y1 >= 187);
  loom_raster_free(r);
}

/* ---------------------------------------------------------------- PNG */

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

/* Decodes an 8-bit RGB PNG without interlace (the kind the writer makes)
 * and checks it pixel by pixel against r. Every chunk's CRC is checked;
 * the rows may use any of the five filter types. */
static void check_png(const unsigned char *p, size_t n, const loom_raster *r) {
  static const unsigned char sig[8] = {0x89, 'P',  'N',  'G',
                                       '\r', '\n', 0x1a, '\n'};
  TT_REQUIRE(n >= 8 && memcmp(p, sig, 8) == 0);
  size_t off = 8, zn = 0;
  unsigned char *z = malloc(n); /* the IDAT data, concatenated */
  TT_REQUIRE(z != NULL);
  uint32_t w = 0, h = 0;
  int chunks = 0;
  bool end = false;
  while (off + 12 <= n && !end) {
    uint32_t len = be32(p + off);
    const unsigned char *type = p + off + 4, *data = p + off + 8;
    if (len > n - off - 12) {
      TT_CHECK(!"chunk longer than the file");
      break;
    }
    uLong crc = crc32(crc32(0L, Z_NULL, 0), type, 4 + len);
    TT_CHECK_EQ(be32(data + len), (uint32_t)crc);
    if (chunks == 0) {
      TT_CHECK(memcmp(type, "IHDR", 4) == 0);
      TT_CHECK_EQ(len, 13);
      w = be32(data);
      h = be32(data + 4);
      TT_CHECK_EQ(data[8], 8);  /* bit depth */
      TT_CHECK_EQ(data[9], 2);  /* RGB */
      TT_CHECK_EQ(data[10], 0); /* deflate */
      TT_CHECK_EQ(data[11], 0); /* filter method */
      TT_CHECK_EQ(data[12], 0); /* no interlace */
    } else if (memcmp(type, "IDAT", 4) == 0) {
      memcpy(z + zn, data, len);
      zn += len;
    } else if (memcmp(type, "IEND", 4) == 0) {
      TT_CHECK_EQ(len, 0);
      end = true;
    } else {
      TT_CHECK(!"unexpected chunk");
    }
    chunks++;
    off += 12 + len;
  }
  TT_CHECK(end);
  TT_CHECK_EQ(off, n); /* nothing after IEND */
  TT_CHECK_EQ(w, loom_raster_width(r));
  TT_CHECK_EQ(h, loom_raster_height(r));
  size_t row = 1 + 3 * (size_t)w;
  uLongf raw_n = row * h + 1; /* one spare: a longer stream is an error */
  unsigned char *raw = malloc(raw_n);
  unsigned char *prev = calloc(row, 1);
  if (!raw || !prev || w != (uint32_t)loom_raster_width(r) ||
      h != (uint32_t)loom_raster_height(r)) {
    TT_CHECK(raw && prev);
    free(raw);
    free(prev);
    free(z);
    return;
  }
  TT_CHECK_EQ(uncompress(raw, &raw_n, z, zn), Z_OK);
  TT_CHECK_EQ(raw_n, row * h);
  long wrong = 0;
  for (uint32_t y = 0; y < h && raw_n == row * h; y++) {
    unsigned char *cur = raw + row * y;
    int filter = cur[0];
    TT_CHECK(filter <= 4);
    /* Undo the filter in place (PNG spec, section 9); bpp = 3. */
    for (size_t i = 1; i < row; i++) {
      int a = i > 3 ? cur[i - 3] : 0, b = prev[i], c = i > 3 ? prev[i - 3] : 0;
      int pred = 0;
      if (filter == 1)
        pred = a;
      else if (filter == 2)
        pred = b;
      else if (filter == 3)
        pred = (a + b) / 2;
      else if (filter == 4) {
        int pa = abs(b - c), pb = abs(a - c), pc = abs(a + b - 2 * c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      cur[i] = (unsigned char)(cur[i] + pred);
    }
    for (uint32_t x = 0; x < w; x++) {
      const unsigned char *q = cur + 1 + 3 * x;
      uint32_t v = (uint32_t)q[0] << 16 | (uint32_t)q[1] << 8 | q[2];
      if (v != loom_raster_get(r, (int)x, (int)y) && wrong++ < 5)
        fprintf(stderr, "pixel (%u, %u): png %06x raster %06x\n", x, y, v,
                loom_raster_get(r, (int)x, (int)y));
    }
    memcpy(prev, cur, row);
  }
  TT_CHECK_EQ(wrong, 0);
  free(raw);
  free(prev);
  free(z);
}

/* A small picture with a bit of everything, odd sizes. */
static loom_raster *sample(int w, int h) {
  loom_raster *r = loom_raster_new(w, h, 0xfafafa);
  if (!r)
    return NULL;
  for (int i = 0; i < w; i += 3)
    loom_raster_rect(r, i, 0, 3, h, (uint32_t)(i * 0x010305) & 0xffffff, 0.3);
  loom_raster_line(r, 0, 0, w, h, 0x1f77b4, 2);
  loom_raster_line(r, 0, h, w, 0, 0xd62728, 1);
  loom_raster_dot(r, w / 2.0, h / 2.0, 4, 0x2ca02c);
  loom_raster_text(r, 2, h / 2.0, "PNG ok", 0x000000, 1, -1, false);
  return r;
}

TT_TEST(test_png_bytes) {
  const int sizes[][2] = {{1, 1}, {37, 23}, {64, 48}, {3, 100}};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    loom_raster *r = sample(sizes[k][0], sizes[k][1]);
    TT_REQUIRE(r != NULL);
    void *png = NULL;
    size_t n = 0;
    TT_CHECK_OK(loom_raster_png(r, &png, &n));
    TT_REQUIRE(png != NULL);
    check_png(png, n, r);
    loom_free(png);
    loom_raster_free(r);
  }
  /* Allocation failures: NOMEM, no output, nothing leaked. */
  loom_raster *r = sample(16, 16);
  TT_REQUIRE(r != NULL);
  for (long k = 1; k <= 2; k++) {
    void *png = (void *)1;
    size_t n = 1;
    loom_alloc_fail_after(k);
    loom_status st = loom_raster_png(r, &png, &n);
    loom_alloc_fail_after(0);
    TT_CHECK_EQ(st, LOOM_ERR_NOMEM);
    TT_CHECK(png == NULL);
    TT_CHECK_EQ(n, 0);
  }
  void *png;
  size_t n;
  TT_CHECK_EQ(loom_raster_png(NULL, &png, &n), LOOM_ERR_INVALID_ARG);
  loom_raster_free(r);
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  unsigned char *b = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0) {
      b = malloc((size_t)len + 1);
      if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
      }
      *n = (size_t)len;
    }
  }
  fclose(f);
  return b;
}

TT_TEST(test_png_file) {
  char dir[] = "/tmp/loom_raster_XXXXXX";
  TT_REQUIRE(mkdtemp(dir) != NULL);
  char path[256], target[256], link[256];
  snprintf(path, sizeof path, "%s/plot.png", dir);
  snprintf(target, sizeof target, "%s/target.txt", dir);
  snprintf(link, sizeof link, "%s/link.png", dir);
  loom_raster *r = sample(37, 23);
  TT_REQUIRE(r != NULL);
  TT_CHECK_OK(loom_raster_write_png(r, dir, "plot.png"));
  size_t n = 0;
  unsigned char *b = read_all(path, &n);
  TT_REQUIRE(b != NULL);
  check_png(b, n, r);
  free(b);
  /* file(1), when present, knows it for what it is. */
  char cmd[512], line[256] = "";
  snprintf(cmd, sizeof cmd, "file -b '%s' 2>/dev/null", path);
  FILE *f = popen(cmd, "r");
  if (f) {
    if (!fgets(line, sizeof line, f))
      line[0] = '\0';
    pclose(f);
  }
  if (strncmp(line, "PNG", 3) == 0)
    TT_CHECK(strstr(line, "37 x 23, 8-bit/color RGB, non-interlaced") != NULL);
  else
    printf("file(1) not available or silent: '%s'\n", line);

  /* A symbolic link at the name: replaced, its target untouched. */
  FILE *t = fopen(target, "w");
  TT_REQUIRE(t != NULL);
  fputs("keep", t);
  fclose(t);
  TT_REQUIRE(symlink(target, link) == 0);
  TT_CHECK_OK(loom_raster_write_png(r, dir, "link.png"));
  struct stat st;
  TT_CHECK(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
  b = read_all(target, &n);
  TT_CHECK(b != NULL && n == 4 && memcmp(b, "keep", 4) == 0);
  free(b);

  /* Errors name the path. */
  char missing[300];
  snprintf(missing, sizeof missing, "%s/no/such/dir", dir);
  TT_CHECK_EQ(loom_raster_write_png(r, missing, "x.png"), LOOM_ERR_IO);
  TT_CHECK(strstr(loom_last_error(), missing) != NULL);
  TT_CHECK(strstr(loom_last_error(), "x.png") != NULL);
  TT_CHECK_EQ(loom_raster_write_png(r, dir, "a/b.png"), LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_raster_write_png(r, NULL, "x.png"), LOOM_ERR_INVALID_ARG);

  unlink(path);
  unlink(link);
  unlink(target);
  rmdir(dir);
  loom_raster_free(r);
}

/* ---------------------------------------------------------------- demo */

/* LOOM_RASTER_DEMO=path: the font at scales 1 and 2, lines of widths 1, 2
 * and 3 at several angles, rects, dots and vertical text, for a person to
 * look at. */
static void write_demo(const char *path) {
  loom_raster *r = loom_raster_new(640, 480, WHITE);
  if (!r)
    return;
  char all[96];
  for (int c = 32; c <= 126; c++)
    all[c - 32] = (char)c;
  all[95] = '\0';
  for (int scale = 1; scale <= 2; scale++) {
    int per = scale == 1 ? 95 : 48;
    for (int k = 0; k * per < 95; k++) {
      char part[96];
      snprintf(part, sizeof part, "%.*s", per, all + k * per);
      double y = scale == 1 ? 14 : 44 + 24 * k;
      loom_raster_text(r, 10, y, part, BLACK, scale, -1, false);
    }
  }
  loom_raster_text(r, 10, 110, "Training loss: 0.2531 (step 1,200) jpg qy",
                   0x333333, 2, -1, false);
  loom_raster_text(r, 630, 140, "right anchored, scale 3", 0xd62728, 3, 1,
                   false);
  /* Lines fanning out from a centre, widths 1, 2, 3. */
  const uint32_t col[3] = {0x1f77b4, 0xff7f0e, 0x2ca02c};
  for (int wdt = 1; wdt <= 3; wdt++) {
    double cx = 80 + (wdt - 1) * 150.0, cy = 260;
    for (int a = 0; a < 16; a++) {
      double t = a * 3.14159265358979 / 16;
      loom_raster_line(r, cx, cy, cx + 60 * cos(t), cy - 60 * sin(t),
                       col[wdt - 1], wdt);
    }
    char label[32];
    snprintf(label, sizeof label, "width %d", wdt);
    loom_raster_text(r, cx, cy + 12, label, BLACK, 1, 0, false);
  }
  /* A plot-like polyline with markers, over a grid. */
  loom_raster_rect(r, 60, 300, 400, 150, 0xf0f0f0, 1);
  for (int i = 0; i <= 8; i++)
    loom_raster_line(r, 60 + 50 * i + 0.5, 300, 60 + 50 * i + 0.5, 450,
                     0xcccccc, 1);
  double px = 0, py = 0;
  for (int i = 0; i <= 40; i++) {
    double x = 60 + i * 10;
    double y = 320 + 110 * (1 - exp(-i / 10.0)) - 4 * sin(i);
    if (i)
      loom_raster_line(r, px, py, x, y, 0xd62728, 2);
    loom_raster_dot(r, x, y, 2.5, 0x1f77b4);
    px = x;
    py = y;
  }
  loom_raster_rect(r, 480, 300, 60, 60, 0x1f77b4, 1);
  loom_raster_rect(r, 510, 330, 60, 60, 0xff7f0e, 0.5);
  loom_raster_dot(r, 600, 420, 12, 0x9467bd);
  loom_raster_text(r, 30, 375, "Loss (vertical)", BLACK, 1, 0, true);
  loom_raster_text(r, 12, 375, "Scale 2", BLACK, 2, 0, true);
  const char *slash = strrchr(path, '/');
  char dir[512];
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1,
           slash ? path : ".");
  if (slash && slash == path)
    snprintf(dir, sizeof dir, "/");
  loom_status st = loom_raster_write_png(r, dir, slash ? slash + 1 : path);
  printf("demo %s: %s\n", path, st == LOOM_OK ? "written" : loom_last_error());
  loom_raster_free(r);
}

int main(void) {
  TT_RUN(test_new_and_get);
  TT_RUN(test_lines);
  TT_RUN(test_clipping);
  TT_RUN(test_rect_and_dot);
  TT_RUN(test_text_glyphs);
  TT_RUN(test_text_width_and_anchors);
  TT_RUN(test_text_vertical);
  TT_RUN(test_png_bytes);
  TT_RUN(test_png_file);
  const char *demo = getenv("LOOM_RASTER_DEMO");
  if (demo && demo[0])
    write_demo(demo);
  return tt_finish();
}
