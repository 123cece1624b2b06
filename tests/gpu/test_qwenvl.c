/* test_qwenvl.c - the Qwen-VL models on the GPU: M-RoPE (backend_i.rope_multi, interleaved as
 * qwen3vlmoe's and in sections as qwen2vl's) and the ViT's 2-D rope (backend_i.rope_2d) against
 * the CPU backend's; the qwen3vlmoe and qwen2vl presets end to end with M-RoPE ids
 * (e2e_parity.c's run with gpu_e2e_mrope); the three towers (qwen3vl_merger, qwen2vl_merger,
 * qwen2.5vl_merger) uploaded to the GPU against the same tower on the CPU, image embeddings
 * (deepstack features included) within 1e-3 relative RMS; with --bench the
 * Qwen3-VL-30B-A3B-sized tower on a 1024x768 image. */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/mrope.h"
#include "vision/mmprojgen.h"
#include "vision/qwen3vl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpu_e2e(struct backend cpu, struct backend gpu, const char *name, const char *preset, int type, double lim);
extern int gpu_e2e_mrope;

static bool wanted(const char *only, const char *name) { return !only || strstr(name, only); }

/* ---- the ropes ---- */

/* n tokens of n_heads heads of hd, their ids those of a prompt with a w x h image at token 3
 * (distinct ids in every section); the GPU's rotation against the CPU's */
static void check_rope_multi(const char *name, int n, int n_heads, int hd, const uint32_t sec[4], bool interleaved)
{
    int32_t *pos = malloc(sizeof(int32_t) * 4 * (size_t)n);
    struct mrope_image im = {.at = 3, .nx = 6, .ny = (uint32_t)(n - 8) / 6};
    mrope_positions((uint32_t)n, 100, &im, 1, pos);
    size_t len = (size_t)n * n_heads * hd;
    float *v = rand_vec(len, 1.0f), *dv = dev_put(v, sizeof(float) * len);
    cpu.i->rope_multi(cpu.ctx, v, n, n_heads, hd, pos, 1e6f, sec, interleaved);
    gpu.i->rope_multi(gpu.ctx, dv, n, n_heads, hd, pos, 1e6f, sec, interleaved);
    float *got = dev_get(dv, len);
    double e = relerr(got, v, len);
    verdict(name, e < 1e-6, "relerr %.2e", e);
    gpu.i->free(gpu.ctx, dv);
    free(v), free(got), free(pos);
}

static void check_rope_2d(const char *name, int n, int n_heads, int hd)
{
    int32_t *pos = malloc(sizeof(int32_t) * 2 * (size_t)n);
    for (int i = 0; i < n; i++) /* a 2x2-block order over a grid 32 patches wide */
        pos[2 * i] = (i / 4) / 16 * 2 + (i % 4) / 2, pos[2 * i + 1] = (i / 4) % 16 * 2 + i % 2;
    size_t len = (size_t)n * n_heads * hd;
    float *v = rand_vec(len, 1.0f), *dv = dev_put(v, sizeof(float) * len);
    cpu.i->rope_2d(cpu.ctx, v, n, n_heads, hd, pos, 10000.0f);
    gpu.i->rope_2d(gpu.ctx, dv, n, n_heads, hd, pos, 10000.0f);
    float *got = dev_get(dv, len);
    double e = relerr(got, v, len);
    verdict(name, e < 1e-6, "relerr %.2e", e);
    gpu.i->free(gpu.ctx, dv);
    free(v), free(got), free(pos);
}

/* ---- the towers ---- */

/* an 8-bit RGB test picture: gradients, a bright square and a little noise */
static uint8_t *picture(int w, int h)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    uint32_t s = 7;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            s = s * 1664525u + 1013904223u;
            bool sq = x > w / 4 && x < w / 2 && y > h / 3 && y < 2 * h / 3;
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(sq ? 230 : 255 * x / w);
            p[1] = (uint8_t)(sq ? 40 : 255 * y / h);
            p[2] = (uint8_t)((x * 7 + y * 3 + (s >> 28)) & 255);
        }
    return rgb;
}

/* Encode a w x h picture with the tower in `file` on the CPU (qwen3vl_load, the CPU backend's
 * ops) and uploaded to the GPU; relative RMS < lim over every output float (deepstack
 * features included); the device memory is exactly the estimate and comes back. reps > 0:
 * also the warm encode time. vs_cpu false (the benchmark): the GPU's times only. */
static void encode_tower(const char *name, const char *file, int w, int h, double lim, int reps, bool vs_cpu)
{
    char err[300] = "";
    struct qwen3vl_tower *tc = NULL, *host = NULL, *tg = NULL;
    struct clip_alloc pa = {pinned_alloc, pinned_free, NULL};
    double t0 = now_s();
    int rc = qwen3vl_load_with(file, &pa, &host, err, sizeof err);
    double t_load = now_s() - t0;
    if (!rc && vs_cpu)
        rc = qwen3vl_load(file, &tc, err, sizeof err);
    if (rc) {
        printf("FAIL %s (load: %s)\n", name, err);
        n_fail++;
        qwen3vl_free(tc);
        return;
    }
    const struct qwen3vl_hparams *hp = qwen3vl_hparams_of(host);
    int a = hp->patch * hp->merge, n_patch = (w / hp->patch) * (h / hp->patch), n_tok = (w / a) * (h / a);
    int row = hp->n_embd_text * (1 + hp->n_deepstack);
    struct dev_count cnt = {0};
    struct clip_alloc da = {dev_count_alloc, dev_count_free, &cnt};
    t0 = now_s();
    rc = qwen3vl_upload(&tg, host, &da, &gpu, n_patch, err, sizeof err);
    gpu.i->sync(gpu.ctx);
    double t_up = now_s() - t0;
    if (rc) {
        printf("FAIL %s (upload: %s)\n", name, err);
        n_fail++;
        qwen3vl_free(tc), qwen3vl_free(host);
        return;
    }
    bool sizes = cnt.live == qwen3vl_weight_bytes(hp) + qwen3vl_workspace_bytes(hp, n_patch);
    uint8_t *rgb = picture(w, h);
    size_t nout = (size_t)n_tok * row;
    float *oc = malloc(sizeof(float) * nout), *og = malloc(sizeof(float) * nout), *og2 = malloc(sizeof(float) * nout);
    t0 = now_s();
    int rcc = vs_cpu ? qwen3vl_encode(tc, &cpu, rgb, w, h, oc, err, sizeof err) : 0;
    double t_cpu = now_s() - t0;
    t0 = now_s();
    int rcg = qwen3vl_encode(tg, &cpu, rgb, w, h, og, err, sizeof err); /* the uploaded tower takes its own */
    double t_cold = now_s() - t0, t_warm = 0;
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        qwen3vl_encode(tg, NULL, rgb, w, h, og2, err, sizeof err);
        double t = now_s() - t0;
        t_warm = r == 0 || t < t_warm ? t : t_warm;
    }
    /* a larger image than the workspace was made for is refused, nothing written */
    uint8_t *big = picture(w + a, h);
    int rcb = qwen3vl_encode(tg, NULL, big, w + a, h, og2, err, sizeof err);
    double e = rcc || rcg ? INFINITY : vs_cpu ? relerr(og, oc, nout) : 0, ed = 0;
    if (hp->n_deepstack && vs_cpu) { /* the deepstack columns alone */
        double num = 0, den = 0;
        for (int k = 0; k < n_tok; k++)
            for (int c = hp->n_embd_text; c < row; c++) {
                double d = (double)og[(size_t)k * row + c] - oc[(size_t)k * row + c];
                num += d * d, den += (double)oc[(size_t)k * row + c] * oc[(size_t)k * row + c];
            }
        ed = den > 0 ? sqrt(num / den) : INFINITY;
    }
    qwen3vl_free(tg);
    printf("  %s: %dx%d image, %d patches, %d tokens x %d floats; weights %.1f MiB, workspace %.1f MiB; host load "
           "(f32, pinned) %.1f ms, upload %.1f ms; encode cpu %.1f ms, gpu cold %.1f ms%s",
           name, w, h, n_patch, n_tok, row, qwen3vl_weight_bytes(hp) / 1048576.0,
           qwen3vl_workspace_bytes(hp, n_patch) / 1048576.0, t_load * 1e3, t_up * 1e3, t_cpu * 1e3, t_cold * 1e3,
           reps ? "" : "\n");
    if (reps)
        printf(", warm %.1f ms\n", t_warm * 1e3);
    if (hp->n_deepstack && vs_cpu)
        printf("  %s: deepstack features alone relerr %.2e\n", name, ed);
    if (!sizes)
        printf("  %s: allocated %zu bytes, estimated %zu + %zu\n", name, cnt.peak, qwen3vl_weight_bytes(hp),
               qwen3vl_workspace_bytes(hp, n_patch));
    if (rcb != TIDE_ERANGE)
        printf("  %s: an image over the workspace gave %d, not TIDE_ERANGE\n", name, rcb);
    verdict(name, e < lim && ed < lim && sizes && cnt.live == 0 && rcb == TIDE_ERANGE, "relerr %.2e", e);
    free(rgb), free(big), free(oc), free(og), free(og2);
    qwen3vl_free(host);
    qwen3vl_free(tc);
}

static void test_towers(void)
{
    char err[200];
    struct { const char *name, *file; int kind, w, h, type; } v[] = {
        /* 64x48 on the 8x8 table: the table interpolated (rows squeezed); deepstack after 1, 2 */
        {"qwenvl_encode qwen3vl", "/tmp/tide-gpu-q3v.gguf", 3, 96, 48, -1},
        {"qwenvl_encode qwen3vl f32", "/tmp/tide-gpu-q3v-f32.gguf", 3, 64, 80, GGML_TYPE_F32},
        {"qwenvl_encode qwen3vl q8_0", "/tmp/tide-gpu-q3v-q8.gguf", 3, 64, 64, GGML_TYPE_Q8_0},
        {"qwenvl_encode qwen2vl", "/tmp/tide-gpu-q2v.gguf", 2, 80, 64, -1},
        /* 224x168: 8x6 merged tokens, 112-pixel windows of 4x4: four windows, two of them cut */
        {"qwenvl_encode qwen25vl", "/tmp/tide-gpu-q25v.gguf", 25, 224, 168, -1},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        struct mmprojgen_options o = {.out = v[i].file, .seed = 3, .type = v[i].type};
        int rc = v[i].kind == 3 ? mmprojgen_write_qwen3vl(&o, 2, err, sizeof err)
                                : mmprojgen_write_qwen2vl(&o, v[i].kind == 25, err, sizeof err);
        if (rc) {
            printf("FAIL %s (mmprojgen: %s)\n", v[i].name, err);
            n_fail++;
            continue;
        }
        encode_tower(v[i].name, v[i].file, v[i].w, v[i].h, 1e-3, 3, true);
        remove(v[i].file);
    }
}

/* Qwen3-VL-30B-A3B's tower (27 blocks of 1152, q8_0 in the file, f32 on the device) on a
 * 1024x768 image (the dynres size of it: 1024x768, 3072 patches, 768 tokens): the GPU's load,
 * upload and encode times (the CPU would take minutes; qwenvl_encode checks the numbers) */
static void bench_tower(void)
{
    const char *file = "/tmp/tide-gpu-q3v-30b.gguf";
    struct mmprojgen_options o = {.out = file, .seed = 5, .type = GGML_TYPE_Q8_0};
    char err[200];
    double t0 = now_s();
    if (mmprojgen_write_qwen3vl_30b(&o, err, sizeof err)) {
        printf("FAIL bench_qwenvl (mmprojgen: %s)\n", err);
        n_fail++;
        return;
    }
    printf("  bench_qwenvl: the Qwen3-VL-30B-A3B-sized tower written in %.1f s\n", now_s() - t0);
    encode_tower("bench_qwenvl qwen3vl-30b 1024x768", file, 1024, 768, 1e-3, 3, false);
    remove(file);
}

void test_qwenvl(const char *only, bool bench)
{
    static const uint32_t q3[4] = {24, 20, 20, 0}, q2[4] = {16, 24, 24, 0}, small[4] = {6, 5, 5, 0};
    if (wanted(only, "qwenvl_rope_multi")) {
        check_rope_multi("qwenvl_rope_multi interleaved 24,20,20 hd 128", 70, 8, 128, q3, true);
        check_rope_multi("qwenvl_rope_multi sections 16,24,24 hd 128", 70, 4, 128, q2, false);
        /* sections over fewer pairs than a head has: they repeat (llama.cpp's sector) */
        check_rope_multi("qwenvl_rope_multi interleaved 6,5,5 hd 64", 33, 3, 64, small, true);
        check_rope_multi("qwenvl_rope_multi sections 6,5,5 hd 64", 33, 3, 64, small, false);
    }
    if (wanted(only, "qwenvl_rope_2d")) {
        check_rope_2d("qwenvl_rope_2d hd 72 (Qwen3-VL)", 3072, 16, 72);
        check_rope_2d("qwenvl_rope_2d hd 80 (Qwen2.5-VL)", 100, 16, 80);
    }
    /* the text models with M-RoPE ids: greedy tokens and logits, GPU against CPU */
    gpu_e2e_mrope = 1;
    if (wanted(only, "e2e_mrope_qwen3vlmoe") && !gpu_e2e(cpu, gpu, "e2e_mrope_qwen3vlmoe", "qwen3vlmoe", -1, 1e-3))
        n_fail++;
    if (wanted(only, "e2e_mrope_qwen2vl") && !gpu_e2e(cpu, gpu, "e2e_mrope_qwen2vl", "qwen2vl", -1, 1e-3))
        n_fail++;
    gpu_e2e_mrope = 0;
    if (wanted(only, "qwenvl_encode"))
        test_towers();
    if (bench && wanted(only, "bench_qwenvl"))
        bench_tower();
}
