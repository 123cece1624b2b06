/* test_oai.c - gpt-oss's ops on the GPU (cuda/oai_ops.cu) against the CPU backend's
 * (backend_cpu_oai.c): attention with per-head sinks and a sliding window (decode rows and a
 * prefill chunk, with and without sinks, GQA, MLA's 576-wide rows; f16 and paged caches), rope with a frequency per pair (NEOX and NORM
 * pairs, a magnitude), and the clamped SwiGLU. Every GPU output is poisoned with NaN first.
 * Limits: 1e-5 for the attention (both f32, the sums in another order), 1e-6 for the rope and
 * the SwiGLU (the same f32 formula; angles in double on both sides). */
#include "engine/backend.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* n query tokens at positions pos.. of n_head heads (n_head_kv KV heads) of hd; window w */
static double sinks_case(int n, int pos, int n_head, int n_head_kv, int hd, bool with_sinks, int window)
{
    int n_ctx = pos + n, qd = n_head * hd, kvd = n_head_kv * hd;
    float *q = rand_vec((size_t)n * qd, 1.0f), *k = rand_vec((size_t)n_ctx * kvd, 1.0f);
    float *v = rand_vec((size_t)n_ctx * kvd, 1.0f), *sinks = with_sinks ? rand_vec((size_t)n_head, 2.0f) : NULL;
    float *oc = malloc(sizeof(float) * (size_t)n * qd), *att = malloc(sizeof(float) * (size_t)n_head * n_ctx);
    cpu.i->attention_sinks(cpu.ctx, q, k, v, false, NULL, 0, oc, att, n, pos, n_head, n_head_kv, hd, sinks, window);
    float *qd_ = dev_put(q, sizeof(float) * (size_t)n * qd), *kd = dev_put(k, sizeof(float) * (size_t)n_ctx * kvd);
    float *vd = dev_put(v, sizeof(float) * (size_t)n_ctx * kvd), *od = dev_put(NULL, sizeof(float) * (size_t)n * qd);
    float *sd = sinks ? dev_put(sinks, sizeof(float) * (size_t)n_head) : NULL;
    float *attd = dev_put(NULL, sizeof(float) * (size_t)n_head * n_ctx);
    dev_poison(od, sizeof(float) * (size_t)n * qd);
    gpu.i->attention_sinks(gpu.ctx, qd_, kd, vd, false, NULL, 0, od, attd, n, pos, n_head, n_head_kv, hd, sd, window);
    float *og = dev_get(od, (size_t)n * qd);
    double e = relerr(og, oc, (size_t)n * qd);
    gpu.i->free(gpu.ctx, qd_); gpu.i->free(gpu.ctx, kd); gpu.i->free(gpu.ctx, vd); gpu.i->free(gpu.ctx, od);
    gpu.i->free(gpu.ctx, attd);
    if (sd)
        gpu.i->free(gpu.ctx, sd);
    free(q); free(k); free(v); free(sinks); free(oc); free(att); free(og);
    return e;
}

static void test_attention_sinks(void)
{
    /* n, pos, heads, kv heads, head_dim, sinks, window: gpt-oss-20b's heads (64 of 64, 8 KV,
     * window 128), a decode row and a prefill chunk, windows shorter and longer than the
     * context, more than 32 positions (several steps of the online softmax), and deepseek2's MLA
 * rows (one KV head of 576, no sinks, no window: forward_mla.c's wide attention) */
    static const int cases[][7] = {
        {1, 0, 64, 8, 64, 1, 128},  {1, 300, 64, 8, 64, 1, 128}, {1, 300, 64, 8, 64, 1, 0}, {64, 0, 64, 8, 64, 1, 128},
        {64, 200, 64, 8, 64, 1, 128}, {37, 90, 4, 2, 64, 1, 4},  {5, 7, 4, 2, 32, 0, 3},    {9, 40, 8, 8, 128, 0, 0},
        {3, 1000, 16, 2, 256, 1, 0}, {1, 77, 16, 1, 576, 0, 0},   {40, 10, 16, 1, 576, 0, 0}, /* MLA's rows */
    };
    bool ok = true;
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *c = cases[i];
        double e = sinks_case(c[0], c[1], c[2], c[3], c[4], c[5], c[6]);
        if (!(e < 1e-5)) {
            ok = false;
            printf("  attention_sinks n %d pos %d heads %d/%d hd %d%s window %d: rel err %.3g\n", c[0], c[1], c[2], c[3],
                   c[4], c[5] ? " sinks" : "", c[6], e);
        }
        if (e > worst) worst = e;
    }
    verdict("attention_sinks", ok, "max rel err %.3g", worst);
}

/* The cache's other forms (TIDE_CUDA_PAGED): f16 rows, and rows found through a block table in a
 * pool whose other blocks are NaN (test_paged.c's fixtures). GPU and CPU read the same f16 values
 * through the same table, so the limit stays 1e-5. */
static double sinks_forms_case(int n, int pos, int n_head, int n_head_kv, int hd, int window, bool f16,
                               int block_rows)
{
    int n_ctx = pos + n, qd = n_head * hd, nbs = 0;
    size_t kvd = (size_t)n_head_kv * hd, es = f16 ? 2 : 4, bytes = (size_t)n_ctx * kvd * es;
    float *q = rand_vec((size_t)n * qd, 1.0f), *sinks = rand_vec((size_t)n_head, 2.0f);
    float *kr = rand_vec((size_t)n_ctx * kvd, 1.0f), *vr = rand_vec((size_t)n_ctx * kvd, 1.0f);
    void *k = host_cache(kr, (size_t)n_ctx * kvd, f16), *v = host_cache(vr, (size_t)n_ctx * kvd, f16);
    int32_t *tab = NULL;
    if (block_rows) { /* the rows at scrambled blocks of a pool with room to spare */
        nbs = 2 * ((n_ctx - 1) / block_rows + 1) + 3;
        tab = malloc(sizeof(int32_t) * (size_t)nbs);
        scramble(tab, nbs);
        uint8_t *kp = nan_pool(nbs, block_rows, kvd, es), *vp = nan_pool(nbs, block_rows, kvd, es);
        scatter_rows(kp, k, tab, block_rows, n_ctx, kvd, es);
        scatter_rows(vp, v, tab, block_rows, n_ctx, kvd, es);
        free(k);
        free(v);
        k = kp, v = vp, bytes = (size_t)nbs * block_rows * kvd * es;
    }
    float *oc = malloc(sizeof(float) * (size_t)n * qd), *att = malloc(sizeof(float) * (size_t)n_head * n_ctx);
    cpu.i->attention_sinks(cpu.ctx, q, k, v, f16, tab, block_rows, oc, att, n, pos, n_head, n_head_kv, hd, sinks,
                           window);
    float *qd_ = dev_put(q, sizeof(float) * (size_t)n * qd), *od = dev_put(NULL, sizeof(float) * (size_t)n * qd);
    void *kd = dev_put(k, bytes), *vd = dev_put(v, bytes);
    float *sd = dev_put(sinks, sizeof(float) * (size_t)n_head);
    int32_t *td = tab ? dev_put(tab, sizeof(int32_t) * (size_t)nbs) : NULL;
    float *attd = dev_put(NULL, sizeof(float) * (size_t)n_head * n_ctx);
    dev_poison(od, sizeof(float) * (size_t)n * qd);
    gpu.i->attention_sinks(gpu.ctx, qd_, kd, vd, f16, td, block_rows, od, attd, n, pos, n_head, n_head_kv, hd, sd,
                           window);
    float *og = dev_get(od, (size_t)n * qd);
    double e = relerr(og, oc, (size_t)n * qd);
    gpu.i->free(gpu.ctx, qd_); gpu.i->free(gpu.ctx, kd); gpu.i->free(gpu.ctx, vd); gpu.i->free(gpu.ctx, od);
    gpu.i->free(gpu.ctx, attd); gpu.i->free(gpu.ctx, sd);
    if (td)
        gpu.i->free(gpu.ctx, td);
    free(q); free(sinks); free(k); free(v); free(tab); free(kr); free(vr); free(oc); free(att); free(og);
    return e;
}

static void test_attention_sinks_f16_paged(void)
{
    /* n, pos, heads, kv heads, head_dim, window, f16, block_rows (0: contiguous) */
    static const int cases[][8] = {
        {1, 300, 64, 8, 64, 128, 1, 0}, {1, 300, 64, 8, 64, 128, 1, 16}, {1, 300, 64, 8, 64, 0, 0, 16},
        {64, 200, 64, 8, 64, 128, 1, 16}, {37, 90, 4, 2, 64, 4, 1, 64}, {3, 1000, 16, 2, 256, 0, 1, 32},
        {1, 77, 16, 1, 576, 0, 1, 16},
    };
    bool ok = true;
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *c = cases[i];
        double e = sinks_forms_case(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
        if (!(e < 1e-5)) {
            ok = false;
            printf("  attention_sinks_f16_paged n %d pos %d heads %d/%d hd %d window %d %s block %d: rel err %.3g\n",
                   c[0], c[1], c[2], c[3], c[4], c[5], c[6] ? "f16" : "f32", c[7], e);
        }
        if (e > worst) worst = e;
    }
    verdict("attention_sinks_f16_paged", ok, "max rel err %.3g", worst);
}

static void test_rope_freqs(void)
{
    static const int cases[][5] = {/* n, pos, heads, head_dim, NEOX */
                                   {1, 4000, 64, 64, 1}, {64, 0, 8, 64, 1}, {7, 123, 1, 64, 0}, {3, 70000, 16, 128, 0}};
    bool ok = true;
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = cases[i][0], pos = cases[i][1], nh = cases[i][2], hd = cases[i][3];
        enum rope_kind kind = cases[i][4] ? ROPE_NEOX : ROPE_NORM;
        size_t len = (size_t)n * nh * hd;
        float *v = rand_vec(len, 1.0f), *f = malloc(sizeof(float) * (size_t)hd / 2);
        for (int j = 0; j < hd / 2; j++) /* yarn-like: unscaled low pairs, scaled high ones */
            f[j] = powf(150000.0f, -2.0f * j / hd) * (j < hd / 4 ? 1.0f : 1.0f / 32);
        float *vd = dev_put(v, sizeof(float) * len);
        cpu.i->rope_freqs(cpu.ctx, v, n, nh, hd, pos, f, 1.3466f, kind);
        gpu.i->rope_freqs(gpu.ctx, vd, n, nh, hd, pos, f, 1.3466f, kind);
        float *vg = dev_get(vd, len);
        double e = relerr(vg, v, len);
        if (!(e < 1e-6)) {
            ok = false;
            printf("  rope_freqs n %d pos %d heads %d hd %d %s: rel err %.3g\n", n, pos, nh, hd,
                   kind == ROPE_NEOX ? "neox" : "norm", e);
        }
        if (e > worst) worst = e;
        gpu.i->free(gpu.ctx, vd);
        free(v); free(f); free(vg);
    }
    verdict("rope_freqs", ok, "max rel err %.3g", worst);
}

static void test_swiglu_oai(void)
{
    int n = 100003;
    float *g = rand_vec((size_t)n, 6.0f), *u = rand_vec((size_t)n, 6.0f); /* many past the clamp of 7 */
    float *gd = dev_put(g, sizeof(float) * n), *ud = dev_put(u, sizeof(float) * n);
    cpu.i->swiglu_oai(cpu.ctx, g, u, n, 1.702f, 7.0f);
    gpu.i->swiglu_oai(gpu.ctx, gd, ud, n, 1.702f, 7.0f);
    float *gg = dev_get(gd, (size_t)n);
    double e = relerr(gg, g, (size_t)n);
    verdict("swiglu_oai", e < 1e-6, "rel err %.3g", e);
    gpu.i->free(gpu.ctx, gd); gpu.i->free(gpu.ctx, ud);
    free(g); free(u); free(gg);
}

void test_oai(const char *only)
{
    static const char *names[] = {"attention_sinks", "attention_sinks_f16_paged", "rope_freqs", "swiglu_oai"};
    void (*const fn[])(void) = {test_attention_sinks, test_attention_sinks_f16_paged, test_rope_freqs,
                                test_swiglu_oai};
    const void *slot[] = {(const void *)gpu.i->attention_sinks, (const void *)gpu.i->attention_sinks,
                          (const void *)gpu.i->rope_freqs, (const void *)gpu.i->swiglu_oai};
    for (int i = 0; i < 4; i++) {
        if (only && !strstr(names[i], only))
            continue;
        if (slot[i])
            fn[i]();
        else
            verdict(names[i], false, "the CUDA backend has no such op%.0f", 0);
    }
}
