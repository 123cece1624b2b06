/* test_dynres.c - the Qwen-VL resize rules (src/vision/dynres.c) and resampler
 * (image_resize_fit_bilinear, src/vision/image.c) against Python references written here, from
 * llama.cpp's calc_size_preserved_ratio and bilinear resize with PAD_CEIL
 * (tools/mtmd/mtmd-image.cpp) and tide's budget rule (docs/VISION.md "Dynamic resolution"):
 * python3 computes the sizes of a table of images and rules, and the resized pixels of a table
 * of images, and the C code must give the same (the pixels bit for bit). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "vision/dynres.h"
#include "vision/image.h"

static const char reference_py[] =
    "import math, sys\n"
    "import numpy as np\n"
    "f = np.float32  # llama.cpp computes the sizes in float\n"
    "def size(w, h, patch, merge, min_px, max_px, max_tok):\n"
    "    a = patch * merge\n"
    "    if max_tok > 0 and (max_px == 0 or max_tok * a * a < max_px):\n"
    "        max_px = max_tok * a * a\n"
    "    if max_px > 0 and min_px > max_px:\n"
    "        min_px = max_px\n"
    "    rnd = lambda x: math.floor(float(f(x) / f(a)) + 0.5) * a   # half away from zero (x > 0)\n"
    "    wb, hb = max(a, rnd(w)), max(a, rnd(h))\n"
    "    if max_px > 0 and wb * hb > max_px:\n"
    "        beta = np.sqrt(f(h) * f(w) / f(max_px))\n"
    "        hb = max(a, math.floor(f(h) / beta / f(a)) * a)\n"
    "        wb = max(a, math.floor(f(w) / beta / f(a)) * a)\n"
    "    elif min_px > 0 and wb * hb < min_px:\n"
    "        beta = np.sqrt(f(min_px) / (f(h) * f(w)))\n"
    "        hb = math.ceil(f(h) * beta / f(a)) * a\n"
    "        wb = math.ceil(f(w) * beta / f(a)) * a\n"
    "    while max_px > 0 and wb * hb > max_px and (wb > a or hb > a):\n"
    "        if wb >= hb: wb -= a\n"
    "        else: hb -= a\n"
    "    return wb, hb, (wb // a) * (hb // a)\n"
    "for line in sys.stdin:\n"
    "    print(*size(*map(int, line.split())))\n";

/* w h patch merge min_pixels max_pixels max_tokens */
static const long cases[][7] = {
    /* Qwen3-VL's defaults in llama.cpp: patch 16, merge 2, 8 to 4096 tokens of 32x32 */
    {1024, 768, 16, 2, 8 * 1024, 4096 * 1024, 0},   {1024, 768, 16, 2, 8 * 1024, 4096 * 1024, 256},
    {4000, 3000, 16, 2, 8 * 1024, 4096 * 1024, 0},  {4000, 3000, 16, 2, 8 * 1024, 4096 * 1024, 1024},
    {20, 20, 16, 2, 8 * 1024, 4096 * 1024, 0},      {1, 1, 16, 2, 8 * 1024, 4096 * 1024, 0},
    {640, 480, 16, 2, 8 * 1024, 4096 * 1024, 64},   {333, 777, 16, 2, 8 * 1024, 4096 * 1024, 100},
    {5000, 1, 16, 2, 8 * 1024, 4096 * 1024, 0},     {1, 5000, 16, 2, 8 * 1024, 4096 * 1024, 16},
    {100000, 7, 16, 2, 8 * 1024, 4096 * 1024, 64},  {48, 48, 16, 2, 8 * 1024, 4096 * 1024, 0},
    {512, 512, 16, 2, 8 * 1024, 4096 * 1024, 3},    {1920, 1080, 14, 2, 4 * 784, 16384 * 784, 0},
    {1920, 1080, 14, 2, 4 * 784, 16384 * 784, 500}, {799, 601, 14, 2, 56 * 56, 28 * 28 * 1280, 0},
    {1000, 1000, 16, 2, 0, 0, 0},                   {1000, 1000, 16, 2, 0, 0, 7},
    {48, 16, 16, 2, 8 * 1024, 4096 * 1024, 4},      {81, 47, 8, 2, 8 * 256, 4096 * 256, 0},
    /* where float and double disagree (llama.cpp's answer is float's; checked with libmtmd for
     * the first three by scripts/check-mtmd-parity.sh's sizes) */
    {20, 90, 8, 2, 8 * 256, 4096 * 256, 0},         {31, 62, 14, 2, 8 * 784, 4096 * 784, 0},
    {38, 76, 14, 2, 8 * 784, 4096 * 784, 0},        {3377, 2494, 16, 2, 8 * 1024, 4096 * 1024, 0},
    {2180, 2180, 14, 2, 8 * 784, 4096 * 784, 0},    {921, 3684, 14, 2, 8 * 784, 4096 * 784, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Debian's python3 (python3-numpy) running script on the lines of input (temporary files,
 * named in in and py for the caller to unlink): its standard output. */
static FILE *run_python(const char *script, const char *input, char in[32], char py[32])
{
    strcpy(in, "/tmp/tide-dynres-XXXXXX");
    int fd = mkstemp(in);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(input, f);
    fclose(f);
    strcpy(py, "/tmp/tide-dynres-py-XXXXXX");
    int pfd = mkstemp(py);
    cr_assert_geq(pfd, 0);
    FILE *pf = fdopen(pfd, "w");
    fputs(script, pf);
    fclose(pf);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s < %s", py, in);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "python3 runs");
    return p;
}

Test(dynres, matches_the_python_reference)
{
    char input[4096] = "", in[32], py[32];
    for (size_t i = 0; i < N_CASES; i++)
        snprintf(input + strlen(input), sizeof input - strlen(input), "%ld %ld %ld %ld %ld %ld %ld\n", cases[i][0],
                 cases[i][1], cases[i][2], cases[i][3], cases[i][4], cases[i][5], cases[i][6]);
    FILE *p = run_python(reference_py, input, in, py);
    for (size_t i = 0; i < N_CASES; i++) {
        long rw, rh, rt;
        cr_assert_eq(fscanf(p, "%ld %ld %ld", &rw, &rh, &rt), 3, "python3's answer for case %zu", i);
        struct dynres_rules r = {(int)cases[i][2], (int)cases[i][3], cases[i][4], cases[i][5], (int)cases[i][6]};
        int ow = 0, oh = 0;
        int nt = dynres_size(&r, (int)cases[i][0], (int)cases[i][1], &ow, &oh);
        cr_expect(ow == rw && oh == rh && nt == rt, "%ldx%ld (patch %ld, budget %ld): %dx%d %d tokens, python %ldx%ld %ld",
                  cases[i][0], cases[i][1], cases[i][2], cases[i][6], ow, oh, nt, rw, rh, rt);
        long a = cases[i][2] * cases[i][3];
        cr_expect(ow % a == 0 && oh % a == 0 && ow >= a && oh >= a, "case %zu: multiples of %ld", i, a);
        if (cases[i][6])
            cr_expect_leq(nt, cases[i][6], "case %zu: within the budget", i);
    }
    cr_expect_eq(pclose(p), 0);
    unlink(in);
    unlink(py);
}

/* The worked numbers docs/VISION.md gives, by hand: 1024x768 fits Qwen3-VL's 4096 tokens as
 * it is (32 x 24 tokens); under a 256-token budget it scales to 576x416 (18 x 13 = 234). */
Test(dynres, worked_examples)
{
    struct dynres_rules r = {16, 2, 8 * 1024, 4096 * 1024, 0};
    int w, h;
    cr_assert_eq(dynres_size(&r, 1024, 768, &w, &h), 768);
    cr_assert(w == 1024 && h == 768);
    r.max_tokens = 256;
    cr_assert_eq(dynres_size(&r, 1024, 768, &w, &h), 234);
    cr_assert(w == 576 && h == 416, "%dx%d", w, h);
    /* a tiny image grows to the minimum of 8 tokens */
    r.max_tokens = 0;
    cr_assert_geq(dynres_size(&r, 20, 20, &w, &h), 8);
    cr_assert_eq(dynres_size(&r, 0, 20, &w, &h), TIDE_EINVAL);
}

/* llama.cpp's resize for the Qwen-VL towers, in numpy float32 (each operation rounded to
 * float as theirs is): the scale that fits, sides ceiled and capped, bilinear with the corners
 * aligned, truncated to 8 bits, centred on a canvas of the pad colour. Input lines: source
 * w h, target w h, pad r g b; output: the resized image's bytes in hex, one line each. */
static const char bilinear_py[] =
    "import math, sys\n"
    "import numpy as np\n"
    "f32 = np.float32\n"
    "def pixels(w, h):\n"
    "    y, x = np.mgrid[0:h, 0:w]\n"
    "    c = np.arange(3)\n"
    "    v = x[..., None] * 37 + y[..., None] * 91 + c * 53 + (x * y % 17)[..., None]\n"
    "    return (v & 255).astype(np.uint8)\n"
    "def bilinear(src, w, h):\n"
    "    sh, sw = src.shape[:2]\n"
    "    rx = f32(sw - 1) / f32(w - 1) if w > 1 else f32(0)\n"
    "    ry = f32(sh - 1) / f32(h - 1) if h > 1 else f32(0)\n"
    "    px = np.arange(w).astype(f32) * rx\n"
    "    py = np.arange(h).astype(f32) * ry\n"
    "    x0 = np.minimum(px.astype(np.int64), sw - 1); x1 = np.minimum(x0 + 1, sw - 1)\n"
    "    y0 = np.minimum(py.astype(np.int64), sh - 1); y1 = np.minimum(y0 + 1, sh - 1)\n"
    "    fx = (px - x0.astype(f32))[None, :, None]\n"
    "    fy = (py - y0.astype(f32))[:, None, None]\n"
    "    s = src.astype(f32)\n"
    "    p00, p10 = s[y0][:, x0], s[y0][:, x1]\n"
    "    p01, p11 = s[y1][:, x0], s[y1][:, x1]\n"
    "    top = p00 + (p10 - p00) * fx\n"
    "    bottom = p01 + (p11 - p01) * fx\n"
    "    v = top + (bottom - top) * fy\n"
    "    return np.clip(v, 0, 255).astype(np.uint8)  # truncation\n"
    "def fit(src, w, h, pad):\n"
    "    sh, sw = src.shape[:2]\n"
    "    if (sw, sh) == (w, h): return src.copy()\n"
    "    scale = min(f32(w) / f32(sw), f32(h) / f32(sh))\n"
    "    nw = min(math.ceil(f32(sw) * scale), w); nh = min(math.ceil(f32(sh) * scale), h)\n"
    "    out = np.empty((h, w, 3), np.uint8); out[:, :] = pad\n"
    "    ox, oy = (w - nw) // 2, (h - nh) // 2\n"
    "    out[oy:oy + nh, ox:ox + nw] = bilinear(src, nw, nh)\n"
    "    return out\n"
    "for line in sys.stdin:\n"
    "    sw, sh, w, h, r, g, b = map(int, line.split())\n"
    "    print(fit(pixels(sw, sh), w, h, [r, g, b]).tobytes().hex())\n";

/* source w h -> target w h: shrinking and growing, aspect kept and not (bars on either axis),
 * a one-pixel source and a one-pixel target, the sizes the Qwen-VL rules give to odd images */
static const int resample_cases[][4] = {
    {100, 50, 96, 48}, {70, 45, 64, 48}, {20, 10, 64, 32},  {333, 777, 96, 224}, {1, 1, 16, 16},
    {5, 3, 1, 1},      {64, 48, 64, 48}, {200, 150, 128, 96}, {31, 17, 48, 16},  {1000, 7, 256, 16},
    {257, 129, 80, 48}, {45, 70, 48, 64}, {3, 2, 32, 32},
};
#define N_RESAMPLE (sizeof resample_cases / sizeof resample_cases[0])

static void synthetic(struct image_u8 *img, int w, int h)
{
    img->w = w;
    img->h = h;
    img->rgb = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                img->rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)((x * 37 + y * 91 + c * 53 + (x * y) % 17) & 255);
}

Test(dynres, bilinear_resize_matches_the_python_reference)
{
    const uint8_t pad[3] = {7, 200, 33};
    char input[2048] = "", in[32], py[32];
    for (size_t i = 0; i < N_RESAMPLE; i++)
        snprintf(input + strlen(input), sizeof input - strlen(input), "%d %d %d %d %d %d %d\n", resample_cases[i][0],
                 resample_cases[i][1], resample_cases[i][2], resample_cases[i][3], pad[0], pad[1], pad[2]);
    FILE *p = run_python(bilinear_py, input, in, py);
    char *line = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < N_RESAMPLE; i++) {
        const int *k = resample_cases[i];
        cr_assert_gt(getline(&line, &cap, p), 0, "python3's answer for case %zu", i);
        cr_assert_eq(strlen(line), (size_t)k[2] * k[3] * 6 + 1, "case %zu: python3's bytes", i);
        struct image_u8 src, out;
        synthetic(&src, k[0], k[1]);
        cr_assert_eq(image_resize_fit_bilinear(&src, k[2], k[3], pad, &out), 0);
        cr_assert(out.w == k[2] && out.h == k[3]);
        size_t n = (size_t)k[2] * k[3] * 3, differ = 0, first = n;
        for (size_t b = 0; b < n; b++) {
            unsigned v;
            sscanf(line + 2 * b, "%2x", &v);
            if (v != out.rgb[b]) {
                differ++;
                if (first == n) first = b;
            }
        }
        cr_expect_eq(differ, 0, "%dx%d -> %dx%d: %zu of %zu bytes differ from python's, the first at pixel %zu", k[0],
                     k[1], k[2], k[3], differ, n, first == n ? 0 : first / 3);
        image_u8_free(&src);
        image_u8_free(&out);
    }
    free(line);
    cr_expect_eq(pclose(p), 0);
    unlink(in);
    unlink(py);
}

/* What the reference's rules mean for an image, checked by hand: an image already of the size
 * is copied; 70x45 into 64x48 keeps its aspect ratio (64x42, ceil(45 * 64/70)) between bars of
 * the pad colour 3 rows high above and below; a 2x2 image grown to 3x3 takes the midpoint
 * (truncated) in the middle; 1x1 fills everything. */
Test(dynres, bilinear_resize_by_hand)
{
    const uint8_t pad[3] = {1, 2, 3};
    struct image_u8 src, out;
    synthetic(&src, 64, 48);
    cr_assert_eq(image_resize_fit_bilinear(&src, 64, 48, pad, &out), 0);
    cr_expect_eq(memcmp(out.rgb, src.rgb, 64 * 48 * 3), 0, "copied");
    image_u8_free(&out);
    image_u8_free(&src);

    synthetic(&src, 70, 45);
    cr_assert_eq(image_resize_fit_bilinear(&src, 64, 48, pad, &out), 0);
    for (int y = 0; y < 48; y++) {
        const uint8_t *px = out.rgb + (size_t)y * 64 * 3 + 10 * 3;
        int is_pad = !memcmp(px, pad, 3);
        cr_expect_eq(is_pad, y < 3 || y >= 45, "row %d: %s", y, is_pad ? "pad" : "image");
    }
    cr_expect_eq(memcmp(out.rgb + (3 * 64) * 3, src.rgb, 3), 0, "the corner pixel lands on the corner");
    image_u8_free(&out);
    image_u8_free(&src);

    uint8_t two[12] = {0, 100, 255, 11, 200, 0, 0, 100, 255, 11, 200, 0}; /* two equal rows */
    src = (struct image_u8){2, 2, two};
    cr_assert_eq(image_resize_fit_bilinear(&src, 3, 3, pad, &out), 0);
    const uint8_t want[9] = {0, 100, 255, 5, 150, 127, 11, 200, 0};
    cr_expect_eq(memcmp(out.rgb, want, 9), 0, "middle %d %d %d", out.rgb[3], out.rgb[4], out.rgb[5]);
    image_u8_free(&out);

    uint8_t one[3] = {9, 8, 7};
    src = (struct image_u8){1, 1, one};
    cr_assert_eq(image_resize_fit_bilinear(&src, 4, 4, pad, &out), 0);
    for (int i = 0; i < 16; i++) cr_expect_eq(memcmp(out.rgb + i * 3, one, 3), 0, "pixel %d", i);
    image_u8_free(&out);
    cr_expect_eq(image_resize_fit_bilinear(&src, 0, 4, pad, &out), TIDE_EINVAL);
}
