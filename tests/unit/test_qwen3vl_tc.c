/* test_qwen3vl_tc.c - the Qwen-VL towers' tensor-core layout (qwen3vl_load_tc, TIDE_VISION_TC=1;
 * src/vision/qwen3vl_weights.c): which type each product keeps, the block's size (the GPU
 * reserve's weights) against what is allocated, and the layout run through the CPU backend's
 * products (which take f16 and q8_0 weights too) against the f32 tower: the same image
 * embeddings up to the rounding of those types. The GPU's own run of it is test-gpu
 * qwenvl_encode_tc. */
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
#include "vision/qwen3vl_internal.h"

/* kind 3: Qwen3-VL with 2 deepstack mergers; 2 / 25: Qwen2-VL / Qwen2.5-VL */
static void write_tower(char *p, size_t len, int kind, int type, uint32_t D, uint32_t F)
{
    snprintf(p, len, "/tmp/tide-test-q3vtc-%d-%d-%d.gguf", (int)getpid(), kind, type);
    struct mmprojgen_options o = {.out = p, .seed = 11, .type = type, .n_embd = D, .n_ff = F};
    char err[200] = "";
    int rc = kind == 3 ? mmprojgen_write_qwen3vl(&o, 2, err, sizeof err)
                       : mmprojgen_write_qwen2vl(&o, kind == 25, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
}

Test(qwen3vl_tc, type_rules)
{
    qwen3vl_set_tc(1); /* TIDE_VISION_TC=1 (the default is f16, below) */
    /* q8_0 / q4_0 stay where the int8 mma path takes the rows (whole 128-element stages) */
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_Q8_0, 1152), GGML_TYPE_Q8_0);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_Q4_0, 4608), GGML_TYPE_Q4_0);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_Q8_0, 96), GGML_TYPE_F16);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_F16, 4304), GGML_TYPE_F16);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_BF16, 1280), GGML_TYPE_BF16);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_F32, 1152), GGML_TYPE_F16);
    /* TIDE_VISION_TC=f16: every product f16 */
    qwen3vl_set_tc(2);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_Q8_0, 1152), GGML_TYPE_F16);
    cr_assert_eq(qwen3vl_tc_type(GGML_TYPE_BF16, 1280), GGML_TYPE_BF16);
}

Test(qwen3vl_tc, switch_defaults_to_f16)
{
    unsetenv("TIDE_VISION_TC");
    cr_assert_eq(qwen3vl_set_tc(-1), 2);
    cr_assert_eq(qwen3vl_set_tc(1), 2, "returns the previous value");
    cr_assert_eq(qwen3vl_set_tc(-1), 1);
}

Test(qwen3vl_tc, switch_turns_off_with_0)
{
    setenv("TIDE_VISION_TC", "0", 1);
    cr_assert_eq(qwen3vl_set_tc(-1), 0);
}

Test(qwen3vl_tc, switch_reads_the_environment)
{
    setenv("TIDE_VISION_TC", "1", 1);
    cr_assert_eq(qwen3vl_set_tc(-1), 1);
}

Test(qwen3vl_tc, switch_reads_f16)
{
    setenv("TIDE_VISION_TC", "f16", 1);
    cr_assert_eq(qwen3vl_set_tc(-1), 2);
}

/* A q8_0 file 128 wide: every product stays q8_0 (the fused q/k/v as three row views of one
 * tensor), the patch kernel is f16, vectors f32; the block is hp.tc_bytes and well under the
 * f32 one. */
Test(qwen3vl_tc, layout_keeps_q8_0)
{
    qwen3vl_set_tc(1); /* TIDE_VISION_TC=1 */
    char p[96], err[200] = "";
    write_tower(p, sizeof p, 3, GGML_TYPE_Q8_0, 128, 256);
    struct qwen3vl_hparams hp;
    cr_assert_eq(qwen3vl_read_hparams(p, &hp, err, sizeof err), 0, "%s", err);
    struct qwen3vl_tower *t;
    cr_assert_eq(qwen3vl_load_tc(p, NULL, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t->block_bytes, qwen3vl_weight_bytes_tc(&hp));
    cr_assert_eq(t->used <= t->block_bytes, true);
    cr_assert_lt(qwen3vl_weight_bytes_tc(&hp), qwen3vl_weight_bytes(&hp) / 2);
    const struct q3v_layer *L = &t->layers[1];
    cr_assert_eq(L->q.type, GGML_TYPE_Q8_0);
    cr_assert_eq(L->q.ne[0], 128);
    cr_assert_eq(L->q.ne[1], 128);
    cr_assert_eq((const uint8_t *)L->k.data, (const uint8_t *)L->q.data + 128 * L->q.row_bytes);
    cr_assert_eq((const uint8_t *)L->v.data, (const uint8_t *)L->q.data + 256 * L->q.row_bytes);
    cr_assert_eq(L->down.type, GGML_TYPE_Q8_0);
    cr_assert_eq(t->main.fc1.type, GGML_TYPE_Q8_0);
    cr_assert_eq(t->deepstack[0].fc2.type, GGML_TYPE_Q8_0);
    cr_assert_eq(t->patch.type, GGML_TYPE_F16);
    cr_assert_eq(t->patch.ne[0], 3 * 8 * 8);
    cr_assert_eq(((uintptr_t)L->up.data - (uintptr_t)t->block) % 256, 0, "256-byte aligned");
    /* the plain loops read f32 weights: without a backend this layout is refused, not misread */
    static uint8_t rgb[32 * 32 * 3];
    static float out[4 * 96 * 3];
    cr_assert_eq(qwen3vl_encode(t, NULL, rgb, 32, 32, out, err, sizeof err), TIDE_EINVAL);
    cr_assert(strstr(err, "backend"), "%s", err);
    qwen3vl_free(t);
    unlink(p);
}

static size_t counted;
static void *count_alloc(void *ud, size_t n) { (void)ud; counted += n; return malloc(n); }
static void count_free(void *ud, void *p) { (void)ud; free(p); }

static void pattern(uint8_t *rgb, int w, int h)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)((x * 37 + y * 91 + c * 53 + 7 * (x ^ y)) & 255);
}

/* The tc tower uploaded to the CPU backend (allocations exactly the tc weights + workspace)
 * against the f32 tower on the same backend: relative RMS over every output float under lim. */
static double tc_vs_f32(int kind, int type, uint32_t D, uint32_t F, int w, int h, int *expect_type)
{
    char p[96], err[200] = "";
    write_tower(p, sizeof p, kind, type, D, F);
    struct qwen3vl_tower *t32, *host, *up;
    cr_assert_eq(qwen3vl_load(p, &t32, err, sizeof err), 0, "%s", err);
    cr_assert_eq(qwen3vl_load_tc(p, NULL, &host, err, sizeof err), 0, "%s", err);
    if (expect_type)
        *expect_type = (int)host->layers[0].up.type;
    const struct qwen3vl_hparams *hp = qwen3vl_hparams_of(host);
    int a = hp->patch * hp->merge, n_tok = (w / a) * (h / a), row = hp->n_embd_text * (1 + hp->n_deepstack);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    struct clip_alloc ca = {count_alloc, count_free, NULL};
    counted = 0;
    cr_assert_eq(qwen3vl_upload(&up, host, &ca, &be, 4L * n_tok, err, sizeof err), 0, "%s", err);
    cr_assert_eq(counted, qwen3vl_weight_bytes_tc(hp) + qwen3vl_workspace_bytes(hp, 4L * n_tok));
    uint8_t *rgb = malloc((size_t)w * h * 3);
    pattern(rgb, w, h);
    size_t n = (size_t)n_tok * row;
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    cr_assert_eq(qwen3vl_encode(t32, &be, rgb, w, h, ref, err, sizeof err), 0, "%s", err);
    cr_assert_eq(qwen3vl_encode(up, NULL, rgb, w, h, got, err, sizeof err), 0, "%s", err);
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(got[i]));
        d += (got[i] - ref[i]) * (double)(got[i] - ref[i]);
        r += ref[i] * (double)ref[i];
    }
    free(rgb), free(ref), free(got);
    qwen3vl_free(up), qwen3vl_free(host), qwen3vl_free(t32);
    backend_cpu_free(&be);
    unlink(p);
    return sqrt(d / r);
}

/* f32 in the file: every product f16 (the weights rounded; the CPU keeps x in f32) */
Test(qwen3vl_tc, qwen3vl_f16_products_on_cpu)
{
    int ty;
    double e = tc_vs_f32(3, GGML_TYPE_F32, 64, 128, 96, 64, &ty);
    cr_assert_eq(ty, GGML_TYPE_F16);
    cr_log_info("qwen3vl f32 file, f16 products: relative RMS %.2e", e);
    cr_assert(e > 0 && e < 2e-3, "relative RMS %g", e);
}

/* q8_0 in the file, 128 wide: the q8_0 products (x quantised to int8 blocks, as on the GPU) */
Test(qwen3vl_tc, qwen3vl_q8_0_products_on_cpu)
{
    qwen3vl_set_tc(1); /* TIDE_VISION_TC=1 */
    int ty;
    double e = tc_vs_f32(3, GGML_TYPE_Q8_0, 128, 256, 96, 64, &ty);
    cr_assert_eq(ty, GGML_TYPE_Q8_0);
    cr_log_info("qwen3vl q8_0 file, q8_0 products: relative RMS %.2e", e);
    cr_assert(e > 0 && e < 2e-2, "relative RMS %g", e);
}

/* the same file with TIDE_VISION_TC=f16: q8_0 widened to f16, x stays f32 on the CPU */
Test(qwen3vl_tc, qwen3vl_q8_0_widened_to_f16_on_cpu)
{
    qwen3vl_set_tc(2);
    int ty;
    double e = tc_vs_f32(3, GGML_TYPE_Q8_0, 128, 256, 96, 64, &ty);
    cr_assert_eq(ty, GGML_TYPE_F16);
    cr_log_info("qwen3vl q8_0 file, f16 products: relative RMS %.2e", e);
    cr_assert(e > 0 && e < 2e-3, "relative RMS %g", e);
}

Test(qwen3vl_tc, qwen2vl_on_cpu)
{
    double e = tc_vs_f32(2, GGML_TYPE_F16, 64, 128, 80, 64, NULL);
    cr_log_info("qwen2vl f16 file: relative RMS %.2e", e);
    cr_assert(e < 2e-3, "relative RMS %g", e);
}

/* 224x168: four 112-pixel windows, two cut (the windowed blocks' attention calls) */
Test(qwen3vl_tc, qwen25vl_windows_on_cpu)
{
    double e = tc_vs_f32(25, GGML_TYPE_F16, 64, 128, 224, 168, NULL);
    cr_log_info("qwen25vl f16 file: relative RMS %.2e", e);
    cr_assert(e < 2e-3, "relative RMS %g", e);
}
