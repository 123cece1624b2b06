/* test_dynres.c - the Qwen-VL resize rules (src/vision/dynres.c) against a Python reference
 * written here, from llama.cpp's calc_size_preserved_ratio (tools/mtmd/mtmd-image.cpp) and
 * tide's budget rule (docs/VISION.md "Dynamic resolution"): python3 computes the sizes of a
 * table of images and rules, the C code must give the same. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "vision/dynres.h"

static const char reference_py[] =
    "import math, sys\n"
    "def size(w, h, patch, merge, min_px, max_px, max_tok):\n"
    "    a = patch * merge\n"
    "    if max_tok > 0 and (max_px == 0 or max_tok * a * a < max_px):\n"
    "        max_px = max_tok * a * a\n"
    "    if max_px > 0 and min_px > max_px:\n"
    "        min_px = max_px\n"
    "    rnd = lambda x: math.floor(x / a + 0.5) * a   # half away from zero (x > 0)\n"
    "    wb, hb = max(a, rnd(w)), max(a, rnd(h))\n"
    "    if max_px > 0 and wb * hb > max_px:\n"
    "        beta = math.sqrt(h * w / max_px)\n"
    "        hb = max(a, math.floor(h / beta / a) * a)\n"
    "        wb = max(a, math.floor(w / beta / a) * a)\n"
    "    elif min_px > 0 and wb * hb < min_px:\n"
    "        beta = math.sqrt(min_px / (h * w))\n"
    "        hb = math.ceil(h * beta / a) * a\n"
    "        wb = math.ceil(w * beta / a) * a\n"
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
};
#define N_CASES (sizeof cases / sizeof cases[0])

Test(dynres, matches_the_python_reference)
{
    char in[] = "/tmp/tide-dynres-XXXXXX";
    int fd = mkstemp(in);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    for (size_t i = 0; i < N_CASES; i++)
        fprintf(f, "%ld %ld %ld %ld %ld %ld %ld\n", cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4],
                cases[i][5], cases[i][6]);
    fclose(f);
    char py[] = "/tmp/tide-dynres-py-XXXXXX";
    int pfd = mkstemp(py);
    cr_assert_geq(pfd, 0);
    FILE *pf = fdopen(pfd, "w");
    fputs(reference_py, pf);
    fclose(pf);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "python3 %s < %s", py, in);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "python3 runs");
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
