/* test_moe_prefill.c - the grouped prefill MoE op (backend_i.moe_ffn_batch) against the
 * per-expert op sequence the forward runs without it (zero, then per expert gather_rows,
 * matmul gate, matmul up, swiglu, matmul down, scatter_axpy; then axpy into the residual),
 * both on the GPU, same inputs. Loads are uneven on purpose: experts with no token, one
 * with a single token, one that every token picks, the rest random.
 *
 * With the tensor-core matmul forced for every n and split-K off (cuda_set_mmq_min_n(1),
 * cuda_set_mmq_split(1)) the two do the same arithmetic: bit for bit, with and without the
 * residual add. With the defaults the per-expert path sums some products in another order
 * (split-K, dp4a for small groups): f32 rounding apart, except that a 1-ulp change in a swiglu
 * value can move its int8 quant (the down product's input) one step, about 1e-4 of the
 * output's norm per such step: norm-wise relative error < 1e-3. The same layer split
 * into several calls of a few groups (what a small expert cache makes the forward do) must
 * give the one-call bits.
 *
 * moe_prefill_kq: the same for k-quant experts on the k-quant tensor-core tiles (TIDE_KQ_MMA,
 * switched on here): q4_K gate/up with q6_K down (Q4_K_M's more-bits layers), and one type
 * throughout for q4_K, q5_K, q6_K; 768-wide down rows are 630-byte q6_K rows, 2-byte aligned.
 * Bit for bit again with mmq everywhere and no split-K (the per-expert matmuls then run the
 * dense k-quant tiles, which share the grouped kernels' K walk). With the defaults, groups of
 * 9..15 tokens go through the f16 GEMM (kquant.cu widens W and sees x in f16, not int8), so
 * the limit there is x's int8 rounding, the k-quant products' 3e-2 class (test_kqmma.c). */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA
#define NE_MAX 32

struct mp_case {
    uint32_t T;
    int E, F, NE, k, n;
    uint32_t TD; /* down's type; 0: T */
};

/* The routing: token t's k experts in ascending order. Expert 0..2 get no token, expert 3
 * every token, expert 5 only token n / 2, the others at random. */
static void route_case(const struct mp_case *c, int *sel, float *w, uint64_t seed)
{
    for (int t = 0; t < c->n; t++) {
        bool used[NE_MAX] = {false};
        int m = 0;
        used[3] = true, m++;
        if (t == c->n / 2)
            used[5] = true, m++;
        while (m < c->k) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int e = 6 + (int)((seed >> 33) % (uint64_t)(c->NE - 6));
            if (!used[e])
                used[e] = true, m++;
        }
        for (int e = 0, j = 0; e < c->NE; e++)
            if (used[e]) {
                sel[t * c->k + j] = e;
                w[t * c->k + j] = 0.05f + 0.9f * (float)((seed >> (5 + j)) & 255) / 255.0f;
                j++;
            }
    }
}

static bool run_case(const struct mp_case *c, double *worst, double lim)
{
    int E = c->E, F = c->F, NE = c->NE, k = c->k, n = c->n, P = n * k;
    struct tensor th[NE_MAX][3], td[NE_MAX][3];
    struct expert_weights ed[NE_MAX];
    for (int e = 0; e < NE; e++) {
        int shp[3][2] = {{E, F}, {E, F}, {F, E}};
        for (int m = 0; m < 3; m++) {
            float *wf = rand_vec((size_t)shp[m][0] * shp[m][1], 1.0f / sqrtf((float)shp[m][0]));
            th[e][m] = make_tensor(m == 2 && c->TD ? c->TD : c->T, shp[m][0], shp[m][1], wf);
            td[e][m] = to_dev(&th[e][m]);
            free(wf);
        }
        ed[e] = (struct expert_weights){td[e][0], td[e][1], td[e][2]};
    }
    int *sel = malloc(sizeof(int) * P), *tok = malloc(sizeof(int) * P), off[NE_MAX + 1] = {0};
    float *w = malloc(sizeof(float) * P), *tokw = malloc(sizeof(float) * P);
    route_case(c, sel, w, 0x5eed + (uint64_t)n);
    /* the forward's counting sort: expert e's pairs tok[off[e]..off[e+1]) in token order */
    for (int i = 0; i < P; i++)
        off[sel[i] + 1]++;
    for (int e = 0; e < NE; e++)
        off[e + 1] += off[e];
    int fill[NE_MAX];
    memcpy(fill, off, sizeof fill);
    for (int i = 0; i < P; i++) {
        int p = fill[sel[i]]++;
        tok[p] = i / k;
        tokw[p] = w[i];
    }
    int goff[NE_MAX + 1], gexp[NE_MAX], ng = 0;
    struct expert_weights gw[NE_MAX];
    for (int e = 0; e < NE; e++)
        if (off[e + 1] > off[e]) {
            goff[ng] = off[e];
            gw[ng] = ed[e];
            gexp[ng++] = e;
        }
    goff[ng] = P;

    size_t xb = sizeof(float) * (size_t)n * E;
    float *xh = rand_vec((size_t)n * E, 1.0f), *rh = rand_vec((size_t)n * E, 1.0f);
    float *x = dev_put(xh, xb), *moe_out = dev_put(NULL, xb), *res = dev_put(rh, xb);
    float *xin = dev_put(NULL, xb), *hb = dev_put(NULL, sizeof(float) * (size_t)n * F),
          *hb2 = dev_put(NULL, sizeof(float) * (size_t)n * F), *tmp = dev_put(NULL, xb);
    float *yg = dev_put(NULL, xb), *ya = dev_put(rh, xb), *ys = dev_put(rh, xb);
    struct moe_batch mb = {.n = n, .k = k, .n_group = ng, .off = goff, .tok = tok, .w = tokw, .ex = gw,
                           .g0 = 0, .g1 = ng};
    bool ok = true;
    for (int exact = 1; exact >= 0 && ok; exact--) {
        int om = 0, osp = 0;
        if (exact)
            om = cuda_set_mmq_min_n(1), osp = cuda_set_mmq_split(1);
        /* the per-expert path */
        gpu.i->zero(gpu.ctx, moe_out, n * E);
        for (int g = 0; g < ng; g++) {
            int cnt = goff[g + 1] - goff[g];
            const struct expert_weights *ew = &ed[gexp[g]];
            /* exact: matmul takes n <= 2 to a fused dp4a kernel whatever the knobs, so a group
             * of 1 or 2 is computed 3 wide, padded with its first token (the tensor-core
             * kernel's columns are independent), and only its own rows are scattered */
            int nc = exact && cnt < 3 ? 3 : cnt, rows[3];
            for (int i = 0; i < nc && nc != cnt; i++)
                rows[i] = tok[goff[g] + (i < cnt ? i : 0)];
            gpu.i->gather_rows(gpu.ctx, xin, x, nc != cnt ? rows : tok + goff[g], nc, E);
            gpu.i->matmul(gpu.ctx, &ew->gate, xin, hb, nc);
            gpu.i->matmul(gpu.ctx, &ew->up, xin, hb2, nc);
            gpu.i->swiglu(gpu.ctx, hb, hb2, nc * F);
            gpu.i->matmul(gpu.ctx, &ew->down, hb, tmp, nc);
            gpu.i->scatter_axpy(gpu.ctx, moe_out, tmp, tok + goff[g], tokw + goff[g], cnt, E);
        }
        float *ref = dev_get(moe_out, (size_t)n * E);
        gpu.i->axpy(gpu.ctx, res, moe_out, 1.0f, n * E);
        float *refa = dev_get(res, (size_t)n * E);
        gpu.i->upload(gpu.ctx, res, rh, xb); /* back to the plain residual */
        /* grouped: one call; with the add; in runs of 3 groups with the add */
        dev_poison(yg, xb);
        gpu.i->upload(gpu.ctx, ya, rh, xb);
        gpu.i->upload(gpu.ctx, ys, rh, xb);
        mb.g0 = 0, mb.g1 = ng;
        int rc1 = gpu.i->moe_ffn_batch(gpu.ctx, &mb, x, yg, false);
        int rc2 = gpu.i->moe_ffn_batch(gpu.ctx, &mb, x, ya, true);
        int rc3 = 0;
        for (int g0 = 0; g0 < ng && !rc3; g0 = mb.g1) {
            mb.g0 = g0, mb.g1 = g0 + 3 < ng ? g0 + 3 : ng;
            rc3 = gpu.i->moe_ffn_batch(gpu.ctx, &mb, x, ys, true);
        }
        float *got = dev_get(yg, (size_t)n * E), *gota = dev_get(ya, (size_t)n * E), *gots = dev_get(ys, (size_t)n * E);
        size_t bytes = sizeof(float) * (size_t)n * E;
        double e1 = relerr(got, ref, (size_t)n * E), e2 = relerr(gota, refa, (size_t)n * E);
        bool split_same = !memcmp(gots, gota, bytes);
        bool good = rc1 == 0 && rc2 == 0 && rc3 == 0 && split_same && !backend_cuda_error(&gpu, NULL, 0);
        if (exact)
            good = good && !memcmp(got, ref, bytes) && !memcmp(gota, refa, bytes);
        else
            good = good && e1 < lim && e2 < lim;
        if (!exact && e1 > *worst)
            *worst = e1;
        if (!good)
            printf("  moe_ffn_batch %s E %d F %d n %d k %d groups %d (%s): rc %d/%d/%d, rel err %.3g / add %.3g, "
                   "%s, runs of 3 %s\n",
                   ggml_type_name(c->TD ? c->TD : c->T), E, F, n, k, ng, exact ? "mmq everywhere, no split-K" : "defaults", rc1, rc2,
                   rc3, e1, e2, exact ? (!memcmp(got, ref, bytes) ? "bit-equal" : "NOT bit-equal") : "-",
                   split_same ? "same bits" : "DIFFERENT bits");
        ok = good;
        free(ref); free(refa); free(got); free(gota); free(gots);
        if (exact)
            cuda_set_mmq_min_n(om), cuda_set_mmq_split(osp);
    }
    for (int e = 0; e < NE; e++)
        for (int m = 0; m < 3; m++) {
            gpu.i->free(gpu.ctx, (void *)td[e][m].data);
            free((void *)th[e][m].data);
        }
    void *bufs[] = {x, moe_out, res, xin, hb, hb2, tmp, yg, ya, ys};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        gpu.i->free(gpu.ctx, bufs[i]);
    free(sel); free(tok); free(w); free(tokw); free(xh); free(rh);
    return ok;
}

/* moe_prefill_kq (see the head of the file) */
static void test_moe_prefill_kq(void)
{
    static const struct mp_case cases[] = {
        {GGML_TYPE_Q4_K, 2048, 768, 24, 8, 96, GGML_TYPE_Q6_K}, /* Qwen3-30B-A3B's expert in Q4_K_M */
        {GGML_TYPE_Q4_K, 512, 256, 16, 4, 40, 0},
        {GGML_TYPE_Q5_K, 256, 512, 12, 2, 3, 0}, /* tiny: one token in most groups */
        {GGML_TYPE_Q6_K, 768, 256, 16, 4, 40, 0},
        {GGML_TYPE_Q5_K, 512, 256, 16, 4, 40, GGML_TYPE_Q4_K},
    };
    int old_on = cuda_set_kq_mma(1);
    bool ok = gpu.i->moe_ffn_batch != NULL;
    double worst = 0;
    /* probe: k-quants grouped with the switch on, sent back to the per-expert path with it off */
    float one = 1.0f;
    for (int on = 1; on >= 0 && ok; on--) {
        cuda_set_kq_mma(on);
        float *wf = rand_vec((size_t)256 * 256, 0.1f);
        struct tensor t = make_tensor(GGML_TYPE_Q4_K, 256, 256, wf), td = make_tensor(GGML_TYPE_Q6_K, 256, 256, wf);
        struct expert_weights ew = {t, t, td};
        int off[2] = {0, 1}, tok = 0;
        struct moe_batch mb = {.n = 1, .k = 1, .n_group = 1, .off = off, .tok = &tok, .w = &one, .ex = &ew, .g1 = 1};
        int rc = gpu.i->moe_ffn_batch(gpu.ctx, &mb, NULL, NULL, false);
        if (rc != (on ? 0 : TIDE_EUNSUPPORTED)) {
            printf("  moe_ffn_batch probe q4_K/q6_K, switch %s: rc %d\n", on ? "on" : "off", rc);
            ok = false;
        }
        free(wf);
        free((void *)t.data);
        free((void *)td.data);
    }
    cuda_set_kq_mma(1);
    for (size_t i = 0; ok && i < sizeof cases / sizeof cases[0]; i++)
        ok = run_case(&cases[i], &worst, 3e-2);
    cuda_set_kq_mma(old_on);
    verdict("moe_prefill_kq", ok, "bit-equal to the per-expert ops with mmq unsplit; defaults max rel err %.3g", worst);
}

void test_moe_prefill(const char *only)
{
    if (!only || strstr("moe_prefill_kq", only))
        test_moe_prefill_kq();
    if (only && !strstr("moe_prefill", only))
        return;
    static const struct mp_case cases[] = {
        {GGML_TYPE_Q8_0, 256, 128, 16, 4, 40, 0},  {GGML_TYPE_Q4_0, 256, 128, 16, 4, 40, 0},
        {GGML_TYPE_Q8_0, 2048, 768, 24, 8, 96, 0}, {GGML_TYPE_Q4_0, 2048, 768, 24, 8, 96, 0},
        {GGML_TYPE_Q8_0, 512, 128, 12, 2, 3, 0},   /* tiny: one token in most groups */
    };
    bool ok = gpu.i->moe_ffn_batch != NULL;
    double worst = 0;
    /* probe: the types and widths it groups, and the ones it sends back to the per-expert
     * path (f16; 96 wide: K of 3 blocks, not whole tile stages of 4) */
    float one = 1.0f;
    for (int ti = 0; ti < 4 && ok; ti++) {
        uint32_t T = ti == 1 ? GGML_TYPE_Q4_0 : ti == 2 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
        int wd = ti == 3 ? 96 : 128;
        float *wf = rand_vec((size_t)wd * wd, 0.1f);
        struct tensor t = make_tensor(T, wd, wd, wf);
        struct expert_weights ew = {t, t, t};
        int off[2] = {0, 1}, tk = 0;
        struct moe_batch mb = {.n = 1, .k = 1, .n_group = 1, .off = off, .tok = &tk, .w = &one, .ex = &ew, .g1 = 1};
        int rc = gpu.i->moe_ffn_batch(gpu.ctx, &mb, NULL, NULL, false);
        if (rc != (ti < 2 ? 0 : TIDE_EUNSUPPORTED)) {
            printf("  moe_ffn_batch probe %s %d wide: rc %d\n", ggml_type_name(T), wd, rc);
            ok = false;
        }
        free(wf);
        free((void *)t.data);
    }
    for (size_t i = 0; ok && i < sizeof cases / sizeof cases[0]; i++)
        ok = run_case(&cases[i], &worst, 1e-3);
    verdict("moe_prefill", ok, "bit-equal to the per-expert ops with mmq unsplit; defaults max rel err %.3g", worst);
}
#else
void test_moe_prefill(const char *only) { (void)only; }
#endif
