/* test_vision.c - src/vision: base64 and data URLs, image decoding (PNG and BMP written
 * byte by byte here, a JPEG from stb_image_write with an Exif segment spliced in), EXIF
 * orientation, fit-and-scale, resize and letterboxing (the clip encoder: test_clip.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vision/image.h"

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

/* ---- base64 / URLs ---- */

static int b64(const char *s, uint8_t **out, size_t *n)
{
    char err[128];
    return image_base64_decode(s, strlen(s), out, n, err, sizeof err);
}

Test(vision, base64_valid)
{
    const char *in[] = {"aGVsbG8=", "aGk=", "YWJj", "AAECAwQF/w=="};
    const char *want[] = {"hello", "hi", "abc", "\x00\x01\x02\x03\x04\x05\xff"};
    size_t wl[] = {5, 2, 3, 7};
    for (int i = 0; i < 4; i++) {
        uint8_t *o;
        size_t n;
        cr_assert_eq(b64(in[i], &o, &n), 0, "%s", in[i]);
        cr_assert_eq(n, wl[i]);
        cr_assert(!memcmp(o, want[i], n));
        free(o);
    }
}

Test(vision, base64_invalid)
{
    const char *bad[] = {"aGV*bG8=", "aGVsbG8", "aG=sbG8=", "aGVsbG8=aGk=", "aGl=", "aGVsbG9=",
                         "aGVs bG8=", "", "====", "a==="};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t *o = (uint8_t *)1;
        size_t n;
        char err[128] = "";
        int rc = image_base64_decode(bad[i], strlen(bad[i]), &o, &n, err, sizeof err);
        cr_assert_eq(rc, TIDE_EFORMAT, "'%s' gave %d", bad[i], rc);
        cr_assert_null(o);
        cr_assert(err[0], "no message for '%s'", bad[i]);
    }
}

Test(vision, data_url_errors)
{
    struct { const char *url; int rc; const char *msg; } c[] = {
        {"http://example.com/a.png", TIDE_EUNSUPPORTED, "allow-list"},
        {"HTTPS://example.com/a.png", TIDE_EUNSUPPORTED, "refused"},
        {"file:///etc/passwd", TIDE_EUNSUPPORTED, "refused"},
        {"ftp://x/y.png", TIDE_EINVAL, "data: URL"},
        {"data:text/plain;base64,aGk=", TIDE_EINVAL, "image/"},
        {"data:image/;base64,aGk=", TIDE_EINVAL, "image/"},
        {"data:image/png,aGk=", TIDE_EINVAL, "base64"},
        {"data:image/png;base64", TIDE_EINVAL, "','"},
        {"data:image/png;base64,", TIDE_EFORMAT, "empty"},
        {"data:image/png;base64,aG!=", TIDE_EFORMAT, "invalid base64"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        uint8_t *b;
        size_t n;
        char err[200] = "";
        int rc = image_parse_url(c[i].url, strlen(c[i].url), 0, &b, &n, err, sizeof err);
        cr_assert_eq(rc, c[i].rc, "%s: rc %d (%s)", c[i].url, rc, err);
        cr_assert(strstr(err, c[i].msg), "%s: message '%s' lacks '%s'", c[i].url, err, c[i].msg);
    }
    uint8_t *b;
    size_t n;
    char err[200];
    const char *ok = "data:image/jpeg;name=x.jpg;base64,aGVsbG8=";
    cr_assert_eq(image_parse_url(ok, strlen(ok), 0, &b, &n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 5);
    free(b);
    cr_assert_eq(image_parse_url(ok, strlen(ok), 4, &b, &n, err, sizeof err), TIDE_ERANGE);
    cr_assert(strstr(err, "limit"));
}

/* ---- tiny images built here ---- */

struct bytes { uint8_t *p; size_t n, cap; };
static void put(struct bytes *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void be32(struct bytes *b, uint32_t v)
{
    uint8_t x[4] = {v >> 24, v >> 16, v >> 8, v};
    put(b, x, 4);
}
static void le32(struct bytes *b, uint32_t v)
{
    uint8_t x[4] = {v, v >> 8, v >> 16, v >> 24};
    put(b, x, 4);
}
static void le16(struct bytes *b, uint32_t v)
{
    uint8_t x[2] = {v, v >> 8};
    put(b, x, 2);
}

static uint32_t crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

static void png_chunk(struct bytes *b, const char *type, const uint8_t *d, size_t n)
{
    be32(b, (uint32_t)n);
    struct bytes t = {0};
    put(&t, type, 4);
    if (n) put(&t, d, n);
    put(b, t.p, t.n);
    be32(b, crc32(t.p, t.n));
    free(t.p);
}

/* RGB8 PNG with one stored (uncompressed) deflate block. */
static struct bytes make_png(int w, int h, const uint8_t *rgb)
{
    struct bytes b = {0};
    put(&b, "\x89PNG\r\n\x1a\n", 8);
    struct bytes ih = {0};
    be32(&ih, (uint32_t)w);
    be32(&ih, (uint32_t)h);
    uint8_t rest[5] = {8, 2, 0, 0, 0};
    put(&ih, rest, 5);
    png_chunk(&b, "IHDR", ih.p, ih.n);
    free(ih.p);
    struct bytes raw = {0};
    for (int y = 0; y < h; y++) {
        uint8_t f = 0;
        put(&raw, &f, 1);
        put(&raw, rgb + (size_t)y * w * 3, (size_t)w * 3);
    }
    struct bytes z = {0};
    uint8_t hdr[2] = {0x78, 0x01}, blk = 1;
    put(&z, hdr, 2);
    put(&z, &blk, 1);
    le16(&z, (uint32_t)raw.n);
    le16(&z, (uint32_t)~raw.n & 0xffff);
    put(&z, raw.p, raw.n);
    uint32_t a = 1, s = 0;
    for (size_t i = 0; i < raw.n; i++) { a = (a + raw.p[i]) % 65521; s = (s + a) % 65521; }
    be32(&z, s << 16 | a);
    png_chunk(&b, "IDAT", z.p, z.n);
    png_chunk(&b, "IEND", NULL, 0);
    free(raw.p);
    free(z.p);
    return b;
}

/* 24-bit bottom-up BMP. */
static struct bytes make_bmp(int w, int h, const uint8_t *rgb)
{
    struct bytes b = {0};
    int stride = (w * 3 + 3) / 4 * 4;
    put(&b, "BM", 2);
    le32(&b, (uint32_t)(54 + stride * h));
    le32(&b, 0);
    le32(&b, 54);
    le32(&b, 40);
    le32(&b, (uint32_t)w);
    le32(&b, (uint32_t)h);
    le16(&b, 1);
    le16(&b, 24);
    for (int i = 0; i < 6; i++) le32(&b, 0);
    for (int y = h - 1; y >= 0; y--) {
        for (int x = 0; x < w; x++) {
            const uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            uint8_t bgr[3] = {p[2], p[1], p[0]};
            put(&b, bgr, 3);
        }
        uint8_t pad[3] = {0};
        put(&b, pad, (size_t)(stride - w * 3));
    }
    return b;
}

static void pattern(uint8_t *rgb, int w, int h)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 40 + 10);
            p[1] = (uint8_t)(y * 50 + 20);
            p[2] = (uint8_t)(x * y * 7 + 3);
        }
}

Test(vision, decode_png_bmp)
{
    uint8_t rgb[5 * 3 * 3];
    pattern(rgb, 5, 3);
    struct bytes imgs[2] = {make_png(5, 3, rgb), make_bmp(5, 3, rgb)};
    for (int i = 0; i < 2; i++) {
        struct image_u8 im;
        char err[200];
        cr_assert_eq(image_decode(imgs[i].p, imgs[i].n, NULL, &im, err, sizeof err), 0, "%s", err);
        cr_assert_eq(im.w, 5);
        cr_assert_eq(im.h, 3);
        cr_assert(!memcmp(im.rgb, rgb, sizeof rgb), "pixels differ (%s)", i ? "bmp" : "png");
        image_u8_free(&im);
        /* limits: checked before the pixels exist */
        struct image_limits lp = {.max_pixels = 14}, lb = {.max_bytes = imgs[i].n - 1};
        cr_assert_eq(image_decode(imgs[i].p, imgs[i].n, &lp, &im, err, sizeof err), TIDE_ERANGE);
        cr_assert(strstr(err, "pixels"), "%s", err);
        cr_assert_eq(image_decode(imgs[i].p, imgs[i].n, &lb, &im, err, sizeof err), TIDE_ERANGE);
        free(imgs[i].p);
    }
}

Test(vision, decode_failures)
{
    uint8_t rgb[8 * 8 * 3];
    pattern(rgb, 8, 8);
    struct bytes png = make_png(8, 8, rgb);
    struct image_u8 im;
    char err[200] = "";
    for (size_t cut = 8; cut < png.n - 12; cut += 7) {
        cr_assert_lt(image_decode(png.p, cut, NULL, &im, err, sizeof err), 0, "cut %zu", cut);
        cr_assert_null(im.rgb);
    }
    cr_assert_eq(image_decode(png.p, png.n / 2, NULL, &im, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "PNG"), "%s", err);
    free(png.p);
    const char *text = "hello, this is not an image at all";
    cr_assert_eq(image_decode((const uint8_t *)text, strlen(text), NULL, &im, err, sizeof err),
                 TIDE_EUNSUPPORTED);
    cr_assert(strstr(err, "not a PNG"), "%s", err);
    uint8_t gif_hdr[] = "GIF89a\x01";
    cr_assert_eq(image_decode(gif_hdr, 7, NULL, &im, err, sizeof err), TIDE_EFORMAT);
}

/* ---- EXIF ---- */

static void jpg_sink(void *ctx, void *data, int size) { put(ctx, data, (size_t)size); }

/* A JPEG of rgb with an APP1 Exif segment (orientation o, byte order le) after SOI. */
static struct bytes make_jpeg(int w, int h, const uint8_t *rgb, int o, bool le)
{
    struct bytes j = {0};
    cr_assert(stbi_write_jpg_to_func(jpg_sink, &j, w, h, 3, rgb, 95));
    struct bytes t = {0};
    put(&t, le ? "II" : "MM", 2);
    uint8_t hdr[6];
    uint8_t ent[12];
#define W16(p, v) (le ? ((p)[0] = (v) & 0xff, (p)[1] = (v) >> 8) : ((p)[0] = (v) >> 8, (p)[1] = (v) & 0xff))
#define W32(p, v) (W16((p) + (le ? 0 : 2), (v) & 0xffff), W16((p) + (le ? 2 : 0), (v) >> 16))
    W16(hdr, 42);
    W32(hdr + 2, 8);
    put(&t, hdr, 6);
    uint8_t cnt[2];
    W16(cnt, 2);
    put(&t, cnt, 2);
    /* an unrelated tag first (ImageWidth, LONG) so the walk is exercised */
    W16(ent, 0x0100); W16(ent + 2, 4); W32(ent + 4, 1); W32(ent + 8, (uint32_t)w);
    put(&t, ent, 12);
    memset(ent, 0, 12);
    W16(ent, 0x0112); W16(ent + 2, 3); W32(ent + 4, 1); W16(ent + 8, (uint32_t)o);
    put(&t, ent, 12);
    uint8_t next[4] = {0};
    put(&t, next, 4);
#undef W16
#undef W32
    struct bytes out = {0};
    put(&out, j.p, 2);  /* SOI */
    uint8_t app1[4] = {0xFF, 0xE1, (uint8_t)((t.n + 8) >> 8), (uint8_t)(t.n + 8)};
    put(&out, app1, 4);
    put(&out, "Exif\0\0", 6);
    put(&out, t.p, t.n);
    put(&out, j.p + 2, j.n - 2);
    free(j.p);
    free(t.p);
    return out;
}

Test(vision, exif_orientation_jpeg)
{
    /* 32x16: left half red, right half blue. Orientation 6 = rotate 90 degrees clockwise
     * to view: the result is 16x32 with red on top. */
    int w = 32, h = 16;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = x < w / 2 ? 230 : 10;
            p[1] = 10;
            p[2] = x < w / 2 ? 10 : 230;
        }
    for (int le = 0; le < 2; le++) {
        struct bytes j = make_jpeg(w, h, rgb, 6, le);
        cr_assert_eq(image_exif_orientation(j.p, j.n), 6);
        struct image_u8 im;
        char err[200];
        cr_assert_eq(image_decode(j.p, j.n, NULL, &im, err, sizeof err), 0, "%s", err);
        cr_assert_eq(im.w, 16);
        cr_assert_eq(im.h, 32);
        const uint8_t *top = im.rgb + ((size_t)4 * im.w + 8) * 3;
        const uint8_t *bot = im.rgb + ((size_t)28 * im.w + 8) * 3;
        cr_assert(top[0] > 180 && top[2] < 60, "top %d,%d,%d", top[0], top[1], top[2]);
        cr_assert(bot[2] > 180 && bot[0] < 60, "bottom %d,%d,%d", bot[0], bot[1], bot[2]);
        image_u8_free(&im);
        free(j.p);
    }
    struct bytes j = make_jpeg(w, h, rgb, 1, true);
    struct image_u8 im;
    char err[200];
    cr_assert_eq(image_decode(j.p, j.n, NULL, &im, err, sizeof err), 0, "%s", err);
    cr_assert_eq(im.w, 32);
    image_u8_free(&im);
    /* a broken Exif segment (length past the end) falls back to 1, never reads past n */
    cr_assert_eq(image_exif_orientation(j.p, 20), 1);
    free(j.p);
    free(rgb);
}

/* Pixel value v(x, y) = x + 10 y on a 3x2 grid; the eight EXIF transforms. */
Test(vision, orientation_transforms)
{
    /* expected upright grids, row by row (values are source x + 10 y) */
    const int want[9][6] = {
        {0}, {0, 1, 2, 10, 11, 12},     /* 1 */
        {2, 1, 0, 12, 11, 10},          /* 2 mirror */
        {12, 11, 10, 2, 1, 0},          /* 3 rotate 180 */
        {10, 11, 12, 0, 1, 2},          /* 4 flip */
        {0, 10, 1, 11, 2, 12},          /* 5 transpose (2x3) */
        {10, 0, 11, 1, 12, 2},          /* 6 rotate 90 cw */
        {12, 2, 11, 1, 10, 0},          /* 7 transverse */
        {2, 12, 1, 11, 0, 10},          /* 8 rotate 90 ccw */
    };
    for (int o = 1; o <= 8; o++) {
        struct image_u8 im = {3, 2, malloc(18)};
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 3; x++) memset(im.rgb + (y * 3 + x) * 3, x + 10 * y, 3);
        cr_assert_eq(image_apply_orientation(&im, o), 0);
        cr_assert_eq(im.w * im.h, 6);
        cr_assert_eq(im.w, o >= 5 ? 2 : 3, "o=%d", o);
        for (int i = 0; i < 6; i++)
            cr_assert_eq(im.rgb[i * 3], want[o][i], "o=%d pixel %d: %d want %d", o, i,
                         im.rgb[i * 3], want[o][i]);
        image_u8_free(&im);
    }
    struct image_u8 im = {3, 2, malloc(18)};
    cr_assert_eq(image_apply_orientation(&im, 9), TIDE_EINVAL);
    image_u8_free(&im);
}

/* ---- fit-and-scale, resize, letterbox ---- */

Test(vision, fit_budget)
{
    int w, h;
    /* 10x over: a 32x32-patch square against a budget of 100 -> exactly 10x10 */
    cr_assert_eq(image_fit_budget(32 * 14, 32 * 14, 14, 100, &w, &h), 100);
    cr_assert_eq(w, 140);
    cr_assert_eq(h, 140);
    /* 2:1 photo far over 256: 23x11 = 253 is the most that keeps the shape within a patch */
    int n = image_fit_budget(4480, 2240, 14, 256, &w, &h);
    cr_assert_eq(n, 253);
    cr_assert_eq(w / 14 * (h / 14), n);
    /* many shapes: never over the budget, uses most of it, aspect within one patch */
    for (int a = 1; a <= 40; a++) {
        int iw = 300 * a + 17, ih = 12000 / a + 5, budget = 576;
        n = image_fit_budget(iw, ih, 16, budget, &w, &h);
        int gx = (iw + 15) / 16, gy = (ih + 15) / 16;
        cr_assert_leq(n, budget);
        cr_assert_eq(n, (w / 16) * (h / 16));
        if (gx * gy > budget && gx < budget && gy < budget) {
            cr_assert_geq(n, budget * 8 / 10, "%dx%d -> %d tokens", iw, ih, n);
            /* some scale s puts both sides within one patch of (gx s, gy s) */
            int bx = w / 16, by = h / 16;
            double lo = fmax((bx - 1.0) / gx, (by - 1.0) / gy);
            double hi = fmin((bx + 1.0) / gx, (by + 1.0) / gy);
            cr_assert_lt(lo, hi, "%dx%d -> %dx%d", iw, ih, w, h);
        }
    }
    /* within budget: only rounded up to whole patches */
    cr_assert_eq(image_fit_budget(100, 50, 16, 1024, &w, &h), 7 * 4);
    cr_assert_eq(w, 112);
    cr_assert_eq(image_fit_budget(0, 5, 16, 10, &w, &h), TIDE_EINVAL);
}

Test(vision, resize_and_letterbox)
{
    /* constant stays constant; a fine checkerboard shrinks to its average (no aliasing) */
    struct image_u8 c = {40, 30, malloc(40 * 30 * 3)}, d;
    for (int i = 0; i < 40 * 30; i++) {
        int x = i % 40, y = i / 40;
        c.rgb[i * 3] = 77;
        c.rgb[i * 3 + 1] = ((x + y) & 1) ? 255 : 0;
        c.rgb[i * 3 + 2] = 200;
    }
    cr_assert_eq(image_resize(&c, 10, 5, &d), 0);
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(d.rgb[i * 3], 77);
        cr_assert_eq(d.rgb[i * 3 + 2], 200);
        cr_assert(abs(d.rgb[i * 3 + 1] - 128) <= 12, "checker -> %d", d.rgb[i * 3 + 1]);
    }
    image_u8_free(&d);
    cr_assert_eq(image_resize(&c, 80, 60, &d), 0);
    cr_assert_eq(d.rgb[(5 * 80 + 5) * 3], 77);
    image_u8_free(&d);
    image_u8_free(&c);

    /* 2:1 white image into 8x8: rows 2..5 are the image, the rest the pad colour */
    struct image_u8 wimg = {16, 8, malloc(16 * 8 * 3)};
    memset(wimg.rgb, 255, 16 * 8 * 3);
    const uint8_t pad[3] = {122, 116, 104};
    const float mean[3] = {0.5f, 0.25f, 0.0f}, sd[3] = {0.5f, 0.25f, 1.0f};
    struct image_f32 f;
    cr_assert_eq(image_preprocess_square(&wimg, 8, pad, mean, sd, &f), 0);
    cr_assert_eq(f.w, 8);
    cr_assert_eq(f.h, 8);
    for (int y = 0; y < 8; y++)
        for (int c2 = 0; c2 < 3; c2++) {
            float v = f.data[c2 * 64 + y * 8 + 3];
            float want = y >= 2 && y < 6 ? (1.0f - mean[c2]) / sd[c2]
                                         : (pad[c2] / 255.0f - mean[c2]) / sd[c2];
            cr_assert_float_eq(v, want, 1e-5, "y=%d c=%d: %f want %f", y, c2, v, want);
        }
    image_f32_free(&f);
    image_u8_free(&wimg);
}
