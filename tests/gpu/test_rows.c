/* test_rows.c - a decode step's rows in one op each (qk_norm_rope_at / attention_at over n
 * sequences in their own KV slots, moe_ffn_table_route of n tokens) against the same ops one
 * row at a time: the rotated K/V rows and the routing bit for bit, attention and the MoE up to
 * summation order (they split the work differently). */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/quants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* n rows of 32/4 heads of hd in slots sl[r] at positions ps[r] of n_slot slots of n_ctx */
static bool attn_rows_case(int n, const int *sl, const int *ps, int n_slot, int n_ctx, int nh, int nkv, int hd)
{
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd, sf = (size_t)n_ctx * kvd, cf = sf * n_slot;
    float *q = rand_vec(qd * n, 1.0f), *kn = rand_vec(kvd * n, 1.0f), *vn = rand_vec(kvd * n, 1.0f);
    float *kc = rand_vec(cf, 1.0f), *vc = rand_vec(cf, 1.0f), *nw = rand_vec(hd, 1.0f);
    struct tensor nt = make_tensor(GGML_TYPE_F32, hd, 1, nw), nd = to_dev(&nt);
    /* one row at a time: row r's slot as its own cache base */
    float *qa = dev_put(q, qd * n * 4), *kna = dev_put(kn, kvd * n * 4), *vna = dev_put(vn, kvd * n * 4);
    float *kca = dev_put(kc, cf * 4), *vca = dev_put(vc, cf * 4), *oa = dev_put(NULL, qd * n * 4);
    int32_t *ata = dev_put(ps, sizeof(int32_t) * n);
    for (int r = 0; r < n; r++) {
        float *kcs = kca + sl[r] * sf, *vcs = vca + sl[r] * sf;
        gpu.i->qk_norm_rope_at(gpu.ctx, qa + r * qd, kna + r * kvd, vna + r * kvd, kcs, vcs, 1, ata + r, NULL, 0, &nd,
                               &nd, nh, nkv, hd, 1e6f, ROPE_NEOX, 1e-6f);
        gpu.i->attention_at(gpu.ctx, qa + r * qd, kcs, vcs, oa + r * qd, 1, ata + r, NULL, 0, n_ctx, nh, nkv, hd);
    }
    /* all rows at once */
    float *qb = dev_put(q, qd * n * 4), *knb = dev_put(kn, kvd * n * 4), *vnb = dev_put(vn, kvd * n * 4);
    float *kcb = dev_put(kc, cf * 4), *vcb = dev_put(vc, cf * 4), *ob = dev_put(NULL, qd * n * 4);
    dev_poison(ob, qd * n * 4);
    int32_t *atb = dev_put(ps, sizeof(int32_t) * n), *slb = dev_put(sl, sizeof(int32_t) * n);
    gpu.i->qk_norm_rope_at(gpu.ctx, qb, knb, vnb, kcb, vcb, n, atb, slb, sf, &nd, &nd, nh, nkv, hd, 1e6f, ROPE_NEOX,
                           1e-6f);
    gpu.i->attention_at(gpu.ctx, qb, kcb, vcb, ob, n, atb, slb, sf, n_ctx, nh, nkv, hd);
    float *r4[3] = {dev_get(qa, qd * n), dev_get(kca, cf), dev_get(vca, cf)};
    float *g4[3] = {dev_get(qb, qd * n), dev_get(kcb, cf), dev_get(vcb, cf)};
    size_t len[3] = {qd * n, cf, cf};
    bool same = true;
    for (int i = 0; i < 3; i++)
        same = same && !memcmp(r4[i], g4[i], len[i] * 4);
    float *ro = dev_get(oa, qd * n), *go = dev_get(ob, qd * n);
    double e = relerr(go, ro, qd * n);
    bool ok = same && e <= 1e-5;
    if (!ok)
        printf("  attention rows: %d rows, n_ctx %d: q/k/v %s, out rel err %.3g\n", n, n_ctx,
               same ? "same" : "DIFFER", e);
    for (int i = 0; i < 3; i++) {
        free(r4[i]);
        free(g4[i]);
    }
    free(ro); free(go);
    void *dv[] = {qa, kna, vna, kca, vca, oa, ata, qb, knb, vnb, kcb, vcb, ob, atb, slb, (void *)nd.data};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(q); free(kn); free(vn); free(kc); free(vc); free(nw); free((void *)nt.data);
    return ok;
}

void experts_make_at(struct experts *x, uint32_t T, uint32_t TD, int E, int F, int NE, size_t stride)
{
    size_t parts[3] = {ggml_row_size(T, E) * F, ggml_row_size(T, E) * F, ggml_row_size(TD, F) * E}, slot = 0;
    for (int m = 0; m < 3; m++)
        slot += (parts[m] + 255) / 256 * 256;
    if (stride > slot) /* expert e at e * stride: spread over NE * stride bytes, as in a large cache */
        slot = (stride + 255) / 256 * 256;
    x->mem = gpu.i->alloc(gpu.ctx, slot * NE);
    x->tab_d = NULL;
    if (!x->mem)
        return;
    const void **tab = malloc(sizeof(void *) * 3 * NE);
    for (int e = 0; e < NE; e++) {
        size_t off = 0;
        for (int m = 0; m < 3; m++) {
            int cols = m < 2 ? E : F, rows = m < 2 ? F : E;
            float *wf = rand_vec((size_t)cols * rows, 1.0f / sqrtf((float)cols));
            struct tensor h = make_tensor(m < 2 ? T : TD, cols, rows, wf);
            gpu.i->upload(gpu.ctx, x->mem + (size_t)e * slot + off, h.data, parts[m]);
            tab[3 * e + m] = x->mem + (size_t)e * slot + off;
            if (e == 0) {
                struct tensor *t = m == 0 ? &x->shape.gate : m == 1 ? &x->shape.up : &x->shape.down;
                *t = h;
                t->data = tab[3 * e + m];
            }
            off += (parts[m] + 255) / 256 * 256;
            free((void *)h.data);
            free(wf);
        }
    }
    x->tab_d = dev_put(tab, sizeof(void *) * 3 * NE);
    free(tab);
}

void experts_make(struct experts *x, uint32_t T, uint32_t TD, int E, int F, int NE)
{
    experts_make_at(x, T, TD, E, F, NE, 0);
}

/* lim: the n-token op against n one-token calls (2e-4: the grouped CUDA-core kernels; with
 * TIDE_MOE_ROWS_MMA the tensor-core tiles sum in another order, and an h value on a rounding
 * edge of its int8 quantisation may land on the other side) */
static bool moe_rows_case_lim(uint32_t T, uint32_t TD, int E, int F, int k, int NE, int n, double lim);
static bool moe_rows_case(uint32_t T, uint32_t TD, int E, int F, int k, int NE, int n)
{
    return moe_rows_case_lim(T, TD, E, F, k, NE, n, 2e-4);
}

/* The last cases' experts, kept for the next case of the same types and shape: 128 experts of
 * Qwen3-30B-A3B's shape are 600 MB of random weights quantised on the host, about 15 s a set,
 * and four cases in a row use that set. moe_rows_drop frees it at the end of a test. */
static struct experts rows_x;
static int rows_x_key[5];

static void moe_rows_drop(void)
{
    if (rows_x.mem) {
        gpu.i->free(gpu.ctx, rows_x.mem);
        gpu.i->free(gpu.ctx, rows_x.tab_d);
    }
    memset(&rows_x, 0, sizeof rows_x);
}

static struct experts *moe_rows_experts(uint32_t T, uint32_t TD, int E, int F, int NE)
{
    int key[5] = {(int)T, (int)TD, E, F, NE};
    if (rows_x.mem && !memcmp(key, rows_x_key, sizeof key))
        return &rows_x;
    moe_rows_drop();
    experts_make(&rows_x, T, TD, E, F, NE);
    memcpy(rows_x_key, key, sizeof key);
    return &rows_x;
}

static bool moe_rows_case_lim(uint32_t T, uint32_t TD, int E, int F, int k, int NE, int n, double lim)
{
    struct experts x = *moe_rows_experts(T, TD, E, F, NE);
    float *lg = rand_vec((size_t)n * NE, 2.0f), *xs = rand_vec((size_t)n * E, 1.0f), *y0 = rand_vec((size_t)n * E, 1.0f);
    float *ld = dev_put(lg, sizeof(float) * n * NE), *xd = dev_put(xs, sizeof(float) * n * E);
    float *ya = dev_put(y0, sizeof(float) * n * E), *yb = dev_put(y0, sizeof(float) * n * E);
    int32_t *ra = dev_put(NULL, sizeof(int32_t) * 2 * k * n), *rb = dev_put(NULL, sizeof(int32_t) * 2 * k * n);
    dev_poison(rb, sizeof(int32_t) * 2 * k * n);
    int rc = 0;
    for (int t = 0; t < n && rc == 0; t++) /* one token a call: the fused one-token kernels */
        rc = gpu.i->moe_ffn_table_route(gpu.ctx, &x.shape, x.tab_d, ld + (size_t)t * NE, 1, NE, true,
                                        ra + (size_t)t * 2 * k, k, xd + (size_t)t * E, ya + (size_t)t * E, true);
    int rc2 = gpu.i->moe_ffn_table_route(gpu.ctx, &x.shape, x.tab_d, ld, n, NE, true, rb, k, xd, yb, true);
    float *h_ra = dev_get(ra, 2 * (size_t)k * n), *h_rb = dev_get(rb, 2 * (size_t)k * n);
    float *h_ya = dev_get(ya, (size_t)n * E), *h_yb = dev_get(yb, (size_t)n * E);
    bool same_route = !memcmp(h_ra, h_rb, sizeof(int32_t) * 2 * k * n);
    /* the MoE's part of y: y - the residual, compared */
    for (size_t i = 0; i < (size_t)n * E; i++) {
        h_ya[i] -= y0[i];
        h_yb[i] -= y0[i];
    }
    double e = relerr(h_yb, h_ya, (size_t)n * E);
    bool ok = rc == 0 && rc2 == 0 && same_route && e <= lim;
    printf("  moe rows %s/%s E %d F %d k %d of %d, %d tokens%s: rc %d/%d, routing %s, rel err %.3g (limit %.0e)\n",
           ggml_type_name(T), ggml_type_name(TD), E, F, k, NE, n, cuda_set_moe_rows_mma(-1) ? " (tensor-core tiles)" : "",
           rc, rc2, same_route ? "same" : "DIFFERS", e, lim);
    void *dv[] = {ld, xd, ya, yb, ra, rb};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(lg); free(xs); free(y0); free(h_ra); free(h_rb); free(h_ya); free(h_yb);
    return ok;
}

void test_rows(void)
{
    bool ok = gpu.i->qk_norm_rope_at && gpu.i->attention_at && gpu.i->moe_ffn_table_route;
    int n_cases = 0;
    if (ok) {
        int sl[] = {3, 0, 5, 1, 6, 2, 4}, ps[] = {0, 31, 32, 599, 300, 1, 100};
        ok = attn_rows_case(7, sl, ps, 7, 600, 32, 4, 128) && ok;
        int sl2[] = {1, 0}, ps2[] = {4000, 17};
        ok = attn_rows_case(2, sl2, ps2, 2, 4096, 16, 2, 64) && ok;
        n_cases += 2;
        static const int cfg[][7] = {
            {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2048, 768, 8, 128, 32}, {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2048, 768, 8, 128, 2},
            {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 256, 128, 4, 8, 40},   {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 256, 96, 4, 16, 9},
            {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 512, 256, 4, 16, 12},
        };
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++, n_cases++)
            ok = moe_rows_case((uint32_t)cfg[c][0], (uint32_t)cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5],
                               cfg[c][6]) && ok;
    }
    moe_rows_drop();
    verdict("rows", ok, "a decode step's rows in one op each = one row at a time (%.0f cases)", n_cases);
}

/* --only moe_rows_mma: the same MoE cases with TIDE_MOE_ROWS_MMA's path (cuda_set_moe_rows_mma:
 * the step's routing grouped on the device, the products on moe_ffn_batch's tensor-core tiles)
 * against one token a call; shapes the tiles do not take (q4_0 with F 96, k-quants without
 * TIDE_KQ_MMA) fall back to the CUDA-core kernels and must still pass. Passed on an H100. */
void test_moe_rows_mma(void)
{
    bool ok = gpu.i->moe_ffn_table_route != NULL;
    int n_cases = 0, was = cuda_set_moe_rows_mma(1);
    static const int cfg[][7] = {
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2048, 768, 8, 128, 32}, {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2048, 768, 8, 128, 8},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2048, 768, 8, 128, 2},  {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2048, 768, 8, 128, 64},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 256, 128, 4, 8, 40},    {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 256, 256, 4, 16, 17},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 256, 96, 4, 16, 9},
    };
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++, n_cases++)
        ok = moe_rows_case_lim((uint32_t)cfg[c][0], (uint32_t)cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5],
                               cfg[c][6], 1e-3) && ok;
    cuda_set_moe_rows_mma(was);
    moe_rows_drop();
    verdict("moe_rows_mma", ok, "a decode step's MoE on the tensor-core tiles = one token at a time (%.0f cases)", n_cases);
}

/* --bench --only bench_moe_rows: moe_ffn_table_route of n tokens on Qwen3-30B-A3B's expert shape
 * (q8_0, E 2048, F 768, 128 experts, top 8), random routing: microseconds a call (one layer's
 * MoE) and the distinct experts' bytes over that time, for n = 1 (the fused one-token kernel), 8,
 * 32, 64; n > 1 under each TIDE_MOE_ROWS_CFG (the grouped kernels' warps a CTA). Then the
 * default cfg again with the experts spread 240 MB apart (30 GB, the full model's expert cache
 * on one H200) instead of packed in 0.6 GB: the difference is what scattered addresses cost. */
static void bench_moe_rows_at(double d2d, size_t stride, bool all_cfgs);

void bench_moe_rows(double d2d)
{
    bench_moe_rows_at(d2d, 0, true);
    bench_moe_rows_at(d2d, (size_t)240 << 20, false);
    verdict("bench_moe_rows", true, "%g layouts", 2.0);
}

static void bench_moe_rows_at(double d2d, size_t stride, bool all_cfgs)
{
    const int E = 2048, F = 768, NE = 128, k = 8, ns[] = {1, 8, 32, 64};
    struct experts x;
    experts_make_at(&x, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, E, F, NE, stride);
    if (!x.mem) {
        printf("  bench_moe_rows: no memory for %zu MB a expert\n", stride >> 20);
        return;
    }
    size_t ebytes = 2 * ggml_row_size(GGML_TYPE_Q8_0, E) * F + ggml_row_size(GGML_TYPE_Q8_0, F) * E;
    float *lg = rand_vec((size_t)64 * NE, 2.0f), *xs = rand_vec((size_t)64 * E, 1.0f);
    float *ld = dev_put(lg, sizeof(float) * 64 * NE), *xd = dev_put(xs, sizeof(float) * 64 * E);
    float *yd = dev_put(xs, sizeof(float) * 64 * E);
    int32_t *rd = dev_put(NULL, sizeof(int32_t) * 2 * k * 64);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        for (int cfg = 0; cfg <= 5; cfg++) { /* 5: cfg 3 with TIDE_MOE_ROWS_MMA's tiles */
            int n = ns[i];
            if ((n == 1 && cfg != 3) || (!all_cfgs && cfg != 3 && cfg != 5))
                continue;
            cuda_set_moe_rows_mma(cfg == 5);
            char cs[8];
            snprintf(cs, sizeof cs, "%d", cfg == 5 ? 3 : cfg);
            setenv("TIDE_MOE_ROWS_CFG", cs, 1);
            double t0 = 0;
            int rc = 0;
            for (int it = -3; it < 50 && rc == 0; it++) {
                if (it == 0) {
                    gpu.i->sync(gpu.ctx);
                    t0 = now_s();
                }
                rc = gpu.i->moe_ffn_table_route(gpu.ctx, &x.shape, x.tab_d, ld, n, NE, true, rd, k, xd, yd, false);
            }
            gpu.i->sync(gpu.ctx);
            double us = (now_s() - t0) * 1e6 / 50;
            int32_t *r = (int32_t *)dev_get(rd, 2 * (size_t)k * n);
            bool used[128] = {false};
            int distinct = 0;
            for (int t = 0; t < n; t++)
                for (int j = 0; j < k; j++)
                    if (r[t * 2 * k + j] >= 0 && r[t * 2 * k + j] < NE && !used[r[t * 2 * k + j]])
                        used[r[t * 2 * k + j]] = true, distinct++;
            free(r);
            double gbs = distinct * (double)ebytes / (us * 1e-6) / 1e9;
            printf("  bench_moe_rows: %s n=%2d cfg %s rc %d  %7.1f us a layer, %3d experts, %6.0f GB/s (%.0f%% of d2d)\n",
                   stride ? "spread" : "packed", n, cfg == 5 ? "mma" : cs, rc, us, distinct, gbs,
                   d2d > 0 ? 100.0 * gbs / d2d : 0.0);
        }
    }
    unsetenv("TIDE_MOE_ROWS_CFG");
    cuda_set_moe_rows_mma(0);
    void *dv[] = {ld, xd, yd, rd, x.mem, x.tab_d};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(lg);
    free(xs);
}
