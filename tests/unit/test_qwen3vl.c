/* test_qwen3vl.c - Qwen3-VL's vision tower (src/vision/qwen3vl.c) on the mmproj the model tool
 * writes (mmprojgen_write_qwen3vl): what the header says, the weight and workspace sizes the
 * hand-back reserve will be made of, the output's shape, and what an image's pixels can and
 * cannot change. Accuracy against llama.cpp is scripts/check-mtmd-parity.sh (relative RMS
 * 4.4e-4 to 4.7e-4, docs/VISION.md). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "engine/backend.h"
#include "engine/gguf.h"
#include "vision/mmprojgen.h"
#include "vision/qwen3vl.h"

#include <stdbool.h>

static char path[64];

static void write_mmproj(void)
{
    snprintf(path, sizeof path, "/tmp/tide-test-q3v-%d.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = path, .seed = 7, .type = GGML_TYPE_F32};
    char err[200] = "";
    cr_assert_eq(mmprojgen_write_qwen3vl(&o, 2, err, sizeof err), 0, "%s", err);
}

static void done(void) { unlink(path); }

Test(qwen3vl, header_and_sizes, .init = write_mmproj, .fini = done)
{
    struct qwen3vl_hparams hp;
    char err[200] = "";
    cr_assert_eq(qwen3vl_read_hparams(path, &hp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hp.n_embd, 64);
    cr_assert_eq(hp.n_head, 4);
    cr_assert_eq(hp.n_layer, 4);
    cr_assert_eq(hp.patch, 8);
    cr_assert_eq(hp.merge, 2);
    cr_assert_eq(hp.pos_side, 8);
    cr_assert_eq(hp.n_embd_text, 96);
    cr_assert_eq(hp.n_deepstack, 2);
    cr_assert(hp.deepstack_layer[0] == 1 && hp.deepstack_layer[1] == 2);
    cr_assert_eq(hp.min_pixels, 8 * 256);
    cr_assert_eq(hp.max_pixels, 4096 * 256);
    /* the f32 weights kept: every tensor's elements (both temporal patch kernels are held,
     * the second summed into the first at load) */
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    size_t elems = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        elems += g.tensors[i].ne[0] * g.tensors[i].ne[1] * g.tensors[i].ne[2] * g.tensors[i].ne[3];
    gguf_close(&g);
    cr_assert_eq(qwen3vl_weight_bytes(&hp), elems * sizeof(float));
    /* the budget's rules: a 1024x768 photo under 64 tokens */
    struct dynres_rules r = qwen3vl_rules(&hp, 64);
    int w, h;
    int nt = dynres_size(&r, 1024, 768, &w, &h);
    cr_assert(nt > 0 && nt <= 64 && w % 16 == 0 && h % 16 == 0, "%d tokens, %dx%d", nt, w, h);
    cr_assert_gt(qwen3vl_workspace_bytes(&hp, 4L * nt), qwen3vl_workspace_bytes(&hp, 4));
    /* the hand-back's two numbers: the budget's largest image, or the tower's 4096 tokens */
    size_t wb, wsb;
    cr_assert_eq(qwen3vl_estimate(path, 64, &wb, &wsb, err, sizeof err), 0, "%s", err);
    cr_assert_eq(wb, elems * sizeof(float));
    cr_assert_eq(wsb, qwen3vl_workspace_bytes(&hp, 4 * 64));
    cr_assert_eq(qwen3vl_estimate(path, 0, &wb, &wsb, err, sizeof err), 0, "%s", err);
    cr_assert_eq(wsb, qwen3vl_workspace_bytes(&hp, 4 * 4096));
    /* the budget's largest image encodes: 128x128, 16x16 patches (the table stretched from 8x8) */
    struct qwen3vl_tower *t;
    cr_assert_eq(qwen3vl_load(path, &t, err, sizeof err), 0, "%s", err);
    static uint8_t rgb[128 * 128 * 3];
    static float out[64 * 96 * 3];
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, 128, 128, out, err, sizeof err), 0, "%s", err);
    qwen3vl_free(t);
}

static void pattern(uint8_t *rgb, int w, int h, int salt)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)((x * 37 + y * 91 + c * 53 + salt * (x ^ y)) & 255);
}

/* A 64x48 image: 8x6 patches, 4x3 merged tokens of 96 * 3 floats (main + 2 deepstack). A pixel
 * of the last merged token's block changes that token's main embedding; through attention it
 * reaches the others too; the output is the same for the same pixels. */
Test(qwen3vl, encode_shapes_and_locality, .init = write_mmproj, .fini = done)
{
    struct qwen3vl_tower *t;
    char err[200] = "";
    cr_assert_eq(qwen3vl_load(path, &t, err, sizeof err), 0, "%s", err);
    enum { W = 64, H = 48, N = 12, E = 96 * 3 };
    uint8_t rgb[W * H * 3];
    pattern(rgb, W, H, 1);
    static float a[N * E], b[N * E], c[N * E];
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "deterministic");
    double norm_main = 0, norm_ds = 0;
    for (int k = 0; k < N; k++)
        for (int i = 0; i < E; i++) {
            cr_assert(isfinite(a[k * E + i]));
            *(i < 96 ? &norm_main : &norm_ds) += a[k * E + i] * a[k * E + i];
        }
    cr_assert_gt(norm_main, 1.0);
    cr_assert_gt(norm_ds, 1.0, "the deepstack features are written");
    rgb[((size_t)(H - 1) * W + (W - 1)) * 3] ^= 0x80; /* the bottom-right pixel */
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, c, err, sizeof err), 0, "%s", err);
    double d_last = 0;
    for (int i = 0; i < 96; i++)
        d_last += fabs(c[(N - 1) * E + i] - a[(N - 1) * E + i]);
    cr_assert_gt(d_last, 1e-3, "the changed pixel's token moved");
    /* sides that are not multiples of patch * merge are the caller's error (dynres sizes them) */
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W - 8, H, c, err, sizeof err), TIDE_EINVAL);
    cr_assert(strstr(err, "multiple of 16"), "%s", err);
    qwen3vl_free(t);
}

/* The daemon's path (the CPU backend's threaded ops) against the plain loops: the same
 * numbers up to summation order, on a 96x64 image (the table stretched to 12x8 patches). */
Test(qwen3vl, backend_ops_match_the_loops, .init = write_mmproj, .fini = done)
{
    struct qwen3vl_tower *t;
    char err[200] = "";
    cr_assert_eq(qwen3vl_load(path, &t, err, sizeof err), 0, "%s", err);
    enum { W = 96, H = 64, N = 24, E = 96 * 3 };
    static uint8_t rgb[W * H * 3];
    pattern(rgb, W, H, 3);
    static float ref[N * E], got[N * E];
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, ref, err, sizeof err), 0, "%s", err);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    cr_assert_eq(qwen3vl_encode(t, &be, rgb, W, H, got, err, sizeof err), 0, "%s", err);
    double d = 0, r = 0;
    for (int i = 0; i < N * E; i++) {
        d += (got[i] - ref[i]) * (double)(got[i] - ref[i]);
        r += ref[i] * (double)ref[i];
    }
    cr_assert_lt(sqrt(d / r), 1e-5, "relative RMS %g", sqrt(d / r));
    backend_cpu_free(&be);
    qwen3vl_free(t);
}

/* qwen3vl_upload (the GPU encoder's load) with the CPU backend as the device: every weight
 * pointer rebased into the one block, the workspace its own, so the uploaded tower gives the
 * host tower's bits; its allocations are exactly the estimate; an image over the workspace it
 * was made for is refused. (On a GPU: build/test-gpu --only qwenvl_encode.) */
static size_t counted;
static void *count_alloc(void *ud, size_t n) { (void)ud; counted += n; return malloc(n); }
static void count_free(void *ud, void *p) { (void)ud; free(p); }

Test(qwen3vl, upload_gives_the_host_towers_bits, .init = write_mmproj, .fini = done)
{
    struct qwen3vl_tower *t, *up;
    char err[200] = "";
    cr_assert_eq(qwen3vl_load(path, &t, err, sizeof err), 0, "%s", err);
    enum { W = 96, H = 64, N = 24, E = 96 * 3 };
    static uint8_t rgb[W * H * 3];
    pattern(rgb, W, H, 5);
    static float ref[N * E], got[N * E];
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    cr_assert_eq(qwen3vl_encode(t, &be, rgb, W, H, ref, err, sizeof err), 0, "%s", err);
    struct clip_alloc a = {count_alloc, count_free, NULL};
    counted = 0;
    cr_assert_eq(qwen3vl_upload(&up, t, &a, &be, 4 * N, err, sizeof err), 0, "%s", err);
    const struct qwen3vl_hparams *hp = qwen3vl_hparams_of(t);
    cr_assert_eq(counted, qwen3vl_weight_bytes(hp) + qwen3vl_workspace_bytes(hp, 4 * N));
    cr_assert_eq(qwen3vl_encode(up, NULL, rgb, W, H, got, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(got, ref, sizeof got), 0, "the uploaded tower's embeddings differ");
    static uint8_t big[(W + 16) * H * 3];
    pattern(big, W + 16, H, 5);
    cr_assert_eq(qwen3vl_encode(up, NULL, big, W + 16, H, got, err, sizeof err), TIDE_ERANGE);
    cr_assert(strstr(err, "workspace"), "%s", err);
    qwen3vl_free(up);
    backend_cpu_free(&be);
    qwen3vl_free(t);
}

/* The LLaVA projector is not this tower: the reader says what it found. */
Test(qwen3vl, refuses_other_projectors)
{
    char p[64], err[200] = "";
    snprintf(p, sizeof p, "/tmp/tide-test-q3v-mlp-%d.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = p, .seed = 1, .type = -1};
    cr_assert_eq(mmprojgen_write(&o, err, sizeof err), 0, "%s", err);
    struct qwen3vl_hparams hp;
    cr_assert_eq(qwen3vl_read_hparams(p, &hp, err, sizeof err), TIDE_EUNSUPPORTED);
    cr_assert(strstr(err, "'mlp'"), "%s", err);
    unlink(p);
}

/* Qwen2-VL's and Qwen2.5-VL's towers (mmprojgen_write_qwen2vl, llama.cpp's converter layout):
 * the header's kind, activation and windows; the weights kept are every tensor's elements
 * (no position table, no patch bias); the daemon's ops equal the plain loops on an image whose
 * grid (9x5 merged tokens for Qwen2.5-VL: windows of 4x4, 4x1, 1x4 and 1x1) has partial windows.
 * Accuracy against llama.cpp: scripts/check-mtmd-parity.sh (PAIRS="qwen2vl qwen25vl"). */
static void qwen2vl_tower_checks(bool qwen25)
{
    char p[64], err[200] = "";
    snprintf(p, sizeof p, "/tmp/tide-test-q2v-%d-%d.gguf", (int)getpid(), qwen25);
    struct mmprojgen_options o = {.out = p, .seed = 9, .type = GGML_TYPE_F32};
    cr_assert_eq(mmprojgen_write_qwen2vl(&o, qwen25, err, sizeof err), 0, "%s", err);
    struct qwen3vl_hparams hp;
    cr_assert_eq(qwen3vl_read_hparams(p, &hp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hp.kind, qwen25 ? QWENVL_25 : QWENVL_2);
    cr_assert_eq(hp.act, qwen25 ? ACT_SILU : ACT_GELU_QUICK);
    cr_assert_eq(hp.patch, qwen25 ? 14 : 8);
    cr_assert_eq(hp.n_embd_text, 128);
    cr_assert_eq(hp.n_deepstack, 0);
    cr_assert_eq(hp.n_wa_pattern, qwen25 ? 2 : 0);
    cr_assert_eq(hp.window, qwen25 ? 4 : 0, "112 pixels: 4 merged tokens of 28");
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, p, err, sizeof err), 0, "%s", err);
    size_t elems = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        elems += g.tensors[i].ne[0] * g.tensors[i].ne[1] * g.tensors[i].ne[2] * g.tensors[i].ne[3];
    cr_assert_null(gguf_find_tensor(&g, "v.position_embd.weight"));
    cr_assert_null(gguf_find_tensor(&g, "v.patch_embd.bias"));
    cr_assert_not_null(gguf_find_tensor(&g, "v.blk.0.attn_q.weight"));
    cr_assert(!gguf_find_tensor(&g, "v.blk.0.ffn_gate.weight") == !qwen25);
    cr_assert(!gguf_find_tensor(&g, "v.blk.0.ln1.bias") == qwen25, "RMSNorms have no bias");
    gguf_close(&g);
    cr_assert_eq(qwen3vl_weight_bytes(&hp), elems * sizeof(float));
    struct qwen3vl_tower *t;
    cr_assert_eq(qwen3vl_load(p, &t, err, sizeof err), 0, "%s", err);
    int W = qwen25 ? 252 : 96, H = qwen25 ? 140 : 64, N = qwen25 ? 45 : 24, E = 128;
    uint8_t *rgb = malloc((size_t)W * H * 3);
    float *ref = malloc(sizeof(float) * N * E), *got = malloc(sizeof(float) * N * E);
    pattern(rgb, W, H, 5);
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, ref, err, sizeof err), 0, "%s", err);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    cr_assert_eq(qwen3vl_encode(t, &be, rgb, W, H, got, err, sizeof err), 0, "%s", err);
    double d = 0, r = 0;
    for (int i = 0; i < N * E; i++) {
        cr_assert(isfinite(ref[i]));
        d += (got[i] - ref[i]) * (double)(got[i] - ref[i]);
        r += ref[i] * (double)ref[i];
    }
    cr_assert_gt(r, 1.0);
    cr_assert_lt(sqrt(d / r), 1e-5, "relative RMS %g", sqrt(d / r));
    backend_cpu_free(&be);
    qwen3vl_free(t);
    free(rgb);
    free(ref);
    free(got);
    unlink(p);
}

Test(qwen3vl, qwen2vl_tower) { qwen2vl_tower_checks(false); }
Test(qwen3vl, qwen25vl_tower) { qwen2vl_tower_checks(true); }

/* Qwen2.5-VL's window attention: with every block windowed (n_wa_pattern larger than the
 * block count), a pixel changes the merged tokens of its own window only; the real pattern's
 * full-attention blocks carry it to the others. */
Test(qwen3vl, qwen25vl_windows_keep_pixels_in_their_window)
{
    char p[64], err[200] = "";
    snprintf(p, sizeof p, "/tmp/tide-test-q25w-%d.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = p, .seed = 4, .type = GGML_TYPE_F32};
    cr_assert_eq(mmprojgen_write_qwen2vl(&o, true, err, sizeof err), 0, "%s", err);
    enum { W = 168, H = 112, N = 24, E = 128 }; /* 6x4 merged tokens: windows x 0..3 and 4..5 */
    static uint8_t rgb[W * H * 3];
    static float a[N * E], b[N * E];
    for (int all_windowed = 0; all_windowed < 2; all_windowed++) {
        struct qwen3vl_tower *t;
        cr_assert_eq(qwen3vl_load(p, &t, err, sizeof err), 0, "%s", err);
        if (all_windowed)
            ((struct qwen3vl_hparams *)qwen3vl_hparams_of(t))->n_wa_pattern = 100;
        pattern(rgb, W, H, 2);
        cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, a, err, sizeof err), 0, "%s", err);
        rgb[(10 * W + 10) * 3] ^= 0x80; /* a pixel of merged token (0, 0): the left window */
        cr_assert_eq(qwen3vl_encode(t, NULL, rgb, W, H, b, err, sizeof err), 0, "%s", err);
        double left = 0, right = 0;
        for (int k = 0; k < N; k++)
            for (int i = 0; i < E; i++)
                *(k % 6 < 4 ? &left : &right) += fabs(a[k * E + i] - b[k * E + i]);
        cr_assert_gt(left, 1e-4, "its own window moved");
        if (all_windowed)
            cr_assert_eq(right, 0.0, "the other window cannot see it");
        else
            cr_assert_gt(right, 1e-6, "full-attention blocks reach the other window");
        qwen3vl_free(t);
    }
    unlink(p);
}
