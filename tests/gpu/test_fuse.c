/* test_fuse.c - the fused decode ops (backend_i.qk_norm_rope, matmul_add, matmul3) on both backends.
 *
 * Each fused slot claims the bits of the ops it stands for, so besides CUDA vs CPU on random
 * inputs every case checks, bit for bit:
 *   - the CPU slot against the CPU's separate ops (the forward's CPU results must not move);
 *   - the CUDA slot against the CUDA's separate ops on the same device inputs.
 * The MoE's add form is checked the same way in test_moe.c. */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return false;
    return true;
}

/* q (n, nh*hd), k (n, nkv*hd) in place; norm: 0 none (llama), 1 both (qwen3, f32 weights),
 * 2 q only with f16 weights (a shape no model has, to check that each side is independent) */
static bool qknr_case(int nh, int nkv, int hd, int pos, int n, int norm, enum rope_kind kind, double *worst)
{
    size_t lq = (size_t)n * nh * hd, lk = (size_t)n * nkv * hd;
    float *q = rand_vec(lq, 2.0f), *k = rand_vec(lk, 2.0f);
    float *wq = rand_vec(hd, 1.0f), *wk = rand_vec(hd, 1.0f);
    uint32_t wt = norm == 2 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    struct tensor qh = make_tensor(wt, hd, 1, wq), kh = make_tensor(wt, hd, 1, wk);
    struct tensor qd = to_dev(&qh), kd = to_dev(&kh);
    const struct tensor *qnh = norm ? &qh : NULL, *knh = norm == 1 ? &kh : NULL;
    const struct tensor *qnd = norm ? &qd : NULL, *knd = norm == 1 ? &kd : NULL;
    const float eps = 1e-6f, theta = 1e6f;

    /* CPU: fused slot vs the separate ops */
    float *q1 = malloc(lq * 4), *k1 = malloc(lk * 4), *q2 = malloc(lq * 4), *k2 = malloc(lk * 4);
    memcpy(q1, q, lq * 4); memcpy(k1, k, lk * 4); memcpy(q2, q, lq * 4); memcpy(k2, k, lk * 4);
    cpu.i->qk_norm_rope(cpu.ctx, q1, k1, qnh, knh, n, nh, nkv, hd, pos, theta, kind, eps);
    if (qnh) cpu.i->rmsnorm(cpu.ctx, q2, qnh, q2, hd, n * nh, eps);
    if (knh) cpu.i->rmsnorm(cpu.ctx, k2, knh, k2, hd, n * nkv, eps);
    cpu.i->rope(cpu.ctx, q2, n, nh, hd, pos, theta, kind);
    cpu.i->rope(cpu.ctx, k2, n, nkv, hd, pos, theta, kind);
    bool cpu_same = !memcmp(q1, q2, lq * 4) && !memcmp(k1, k2, lk * 4);

    /* CUDA: fused slot vs the separate kernels on the same inputs */
    float *qa = dev_put(q, lq * 4), *ka = dev_put(k, lk * 4), *qb = dev_put(q, lq * 4), *kb = dev_put(k, lk * 4);
    gpu.i->qk_norm_rope(gpu.ctx, qa, ka, qnd, knd, n, nh, nkv, hd, pos, theta, kind, eps);
    if (qnd) gpu.i->rmsnorm(gpu.ctx, qb, qnd, qb, hd, n * nh, eps);
    if (knd) gpu.i->rmsnorm(gpu.ctx, kb, knd, kb, hd, n * nkv, eps);
    gpu.i->rope(gpu.ctx, qb, n, nh, hd, pos, theta, kind);
    gpu.i->rope(gpu.ctx, kb, n, nkv, hd, pos, theta, kind);
    float *ga = dev_get(qa, lq), *gka = dev_get(ka, lk), *gb = dev_get(qb, lq), *gkb = dev_get(kb, lk);
    bool gpu_same = !memcmp(ga, gb, lq * 4) && !memcmp(gka, gkb, lk * 4);
    double e = relerr(ga, q1, lq), ek = relerr(gka, k1, lk);
    if (ek > e) e = ek;
    if (e > *worst) *worst = e;
    bool ok = cpu_same && gpu_same && e < 1e-5 && all_finite(ga, lq) && all_finite(gka, lk);
    if (!ok)
        printf("  qk_norm_rope nh %d nkv %d hd %d pos %d n %d norm %d kind %d: cpu %s, cuda %s the separate "
               "kernels, rel err vs cpu %.3g\n", nh, nkv, hd, pos, n, norm, (int)kind, cpu_same ? "==" : "!=",
               gpu_same ? "==" : "!=", e);
    gpu.i->free(gpu.ctx, qa); gpu.i->free(gpu.ctx, ka); gpu.i->free(gpu.ctx, qb); gpu.i->free(gpu.ctx, kb);
    gpu.i->free(gpu.ctx, (void *)qd.data); gpu.i->free(gpu.ctx, (void *)kd.data);
    free(q); free(k); free(wq); free(wk); free(q1); free(k1); free(q2); free(k2);
    free(ga); free(gka); free(gb); free(gkb);
    free((void *)qh.data); free((void *)kh.data);
    return ok;
}

void test_qk_norm_rope(void)
{
    /* n_head, n_head_kv, head_dim, pos, n: Qwen3-30B-A3B decode and prefill, small heads
     * (rmsnorm's 32-thread block), head_dim 256 (its 256 block), far positions */
    static const int cfg[][5] = {{32, 4, 128, 512, 1}, {32, 4, 128, 0, 1},  {32, 4, 128, 100, 77},
                                 {8, 8, 64, 131000, 3}, {4, 2, 16, 40000, 1}, {6, 2, 96, 5, 200},
                                 {2, 1, 256, 7, 5},     {16, 16, 128, 3000, 512}};
    bool ok = cpu.i->qk_norm_rope && gpu.i->qk_norm_rope;
    double worst = 0;
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++)
        for (int norm = 0; norm < 3; norm++)
            for (int kind = 0; kind < 2; kind++)
                ok = qknr_case(cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], norm,
                               kind ? ROPE_NEOX : ROPE_NORM, &worst) && ok;
    verdict("qk_norm_rope", ok, "bit for bit the separate ops on both backends; max rel err cuda vs cpu %.3g", worst);
}

/* y += W x: CUDA vs CPU, and each bit for bit its own matmul then axpy(y, t, 1.0f); decode
 * sizes (the fused-quantisation and gemv kernels add in place) and prefill sizes (the
 * tensor-core paths add through a buffer). */
void test_matmul_add(void)
{
    static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    static const int shapes[][3] = {{4096, 2048, 1}, {2048, 512, 2}, {256, 96, 5}, {96, 64, 17},
                                    {2048, 1000, 33}, {768, 2048, 64}, {100, 50, 3}};
    bool ok = cpu.i->matmul_add && gpu.i->matmul_add;
    double worst = 0;
    for (size_t ti = 0; ok && ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t T = types[ti];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2];
            if (cols % 32 && (T == GGML_TYPE_Q8_0 || T == GGML_TYPE_Q4_0))
                continue;
            size_t ly = (size_t)n * rows;
            float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
            float *x = rand_vec((size_t)n * cols, 1.0f), *y0 = rand_vec(ly, 1.0f);
            struct tensor th = make_tensor(T, cols, rows, wf), td = to_dev(&th);
            /* CPU: the slot vs matmul + axpy */
            float *y1 = malloc(ly * 4), *y2 = malloc(ly * 4), *t = malloc(ly * 4);
            memcpy(y1, y0, ly * 4);
            memcpy(y2, y0, ly * 4);
            cpu.i->matmul_add(cpu.ctx, &th, x, y1, n);
            cpu.i->matmul(cpu.ctx, &th, x, t, n);
            cpu.i->axpy(cpu.ctx, y2, t, 1.0f, (int)ly);
            bool cpu_same = !memcmp(y1, y2, ly * 4);
            /* CUDA: the slot vs matmul into a poisoned buffer + axpy */
            float *xd = dev_put(x, (size_t)n * cols * 4), *ya = dev_put(y0, ly * 4), *yb = dev_put(y0, ly * 4);
            float *td2 = dev_put(NULL, ly * 4);
            dev_poison(td2, ly * 4);
            gpu.i->matmul_add(gpu.ctx, &td, xd, ya, n);
            gpu.i->matmul(gpu.ctx, &td, xd, td2, n);
            gpu.i->axpy(gpu.ctx, yb, td2, 1.0f, (int)ly);
            float *ga = dev_get(ya, ly), *gb = dev_get(yb, ly);
            bool gpu_same = !memcmp(ga, gb, ly * 4);
            /* the product's error, not hidden by the residual: (y - y0) on both sides */
            for (size_t i = 0; i < ly; i++) {
                t[i] = y1[i] - y0[i];
                y2[i] = ga[i] - y0[i];
            }
            double e = relerr(y2, t, ly), lim = T == GGML_TYPE_F32 || T == GGML_TYPE_F16 ? 1e-3 : 1e-2;
            if (e > worst) worst = e;
            bool c_ok = cpu_same && gpu_same && e < lim && all_finite(ga, ly);
            if (!c_ok)
                printf("  matmul_add %s cols %d rows %d n %d: cpu %s, cuda %s matmul + axpy, rel err %.3g\n",
                       ggml_type_name(T), cols, rows, n, cpu_same ? "==" : "!=", gpu_same ? "==" : "!=", e);
            ok = ok && c_ok;
            gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, ya); gpu.i->free(gpu.ctx, yb);
            gpu.i->free(gpu.ctx, td2); gpu.i->free(gpu.ctx, (void *)td.data);
            free(wf); free(x); free(y0); free(y1); free(y2); free(t); free(ga); free(gb);
            free((void *)th.data);
        }
    }
    verdict("matmul_add", ok, "bit for bit matmul + axpy on both backends; max rel err of the product %.3g", worst);
}

/* matmul3 (wq, wk, wv of one x, normed on the way or not): each output, and the normed x, bit
 * for bit the separate rmsnorm and matmuls on the same backend, and CUDA vs CPU; decode sizes
 * (one launch for q8_0/q4_0 with widths over 128) and others (the separate kernels). */
static bool mm3_case(uint32_t T, const int *shp, bool norm, double *worst)
{
    int cols = shp[0], n = shp[4];
    size_t lx = (size_t)n * cols;
    float *x = rand_vec(lx, 1.0f), *xd = dev_put(x, lx * 4), *nv = rand_vec(cols, 1.0f);
    struct tensor nh = {.type = GGML_TYPE_F32, .ne = {(uint64_t)cols, 1}, .data = nv, .row_bytes = (size_t)cols * 4};
    struct tensor nd = to_dev(&nh);
    float *xn_c = malloc(lx * 4), *xn_c2 = malloc(lx * 4), *xn_a = dev_put(NULL, lx * 4), *xn_b = dev_put(NULL, lx * 4);
    dev_poison(xn_a, lx * 4);
    struct tensor th[3], td[3];
    float *wf[3], *yc[3], *yc2[3], *ya[3], *yb[3];
    size_t ly[3];
    for (int m = 0; m < 3; m++) {
        int rows = shp[1 + m];
        ly[m] = (size_t)n * rows;
        wf[m] = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
        th[m] = make_tensor(T, cols, rows, wf[m]);
        td[m] = to_dev(&th[m]);
        yc[m] = malloc(ly[m] * 4);
        yc2[m] = malloc(ly[m] * 4);
        ya[m] = dev_put(NULL, ly[m] * 4);
        yb[m] = dev_put(NULL, ly[m] * 4);
        dev_poison(ya[m], ly[m] * 4);
        dev_poison(yb[m], ly[m] * 4);
    }
    const struct tensor *const wh[3] = {&th[0], &th[1], &th[2]}, *const wd[3] = {&td[0], &td[1], &td[2]};
    float *const yh3[3] = {yc[0], yc[1], yc[2]}, *const yd3[3] = {ya[0], ya[1], ya[2]};
    cpu.i->matmul3(cpu.ctx, wh, x, yh3, n, norm ? &nh : NULL, 1e-6f, xn_c);
    gpu.i->matmul3(gpu.ctx, wd, xd, yd3, n, norm ? &nd : NULL, 1e-6f, xn_a);
    /* the separate ops */
    const float *in_c = x, *in_g = xd;
    if (norm) {
        cpu.i->rmsnorm(cpu.ctx, x, &nh, xn_c2, cols, n, 1e-6f);
        gpu.i->rmsnorm(gpu.ctx, xd, &nd, xn_b, cols, n, 1e-6f);
        in_c = xn_c2, in_g = xn_b;
    }
    bool ok = true;
    if (norm) {
        float *ga = dev_get(xn_a, lx), *gb = dev_get(xn_b, lx);
        bool same = !memcmp(xn_c, xn_c2, lx * 4) && !memcmp(ga, gb, lx * 4);
        if (!same) {
            printf("  matmul3 %s cols %d n %d: the normed x differs from rmsnorm's\n", ggml_type_name(T), cols, n);
            ok = false;
        }
        free(ga); free(gb);
    }
    for (int m = 0; m < 3; m++) {
        cpu.i->matmul(cpu.ctx, &th[m], in_c, yc2[m], n);
        gpu.i->matmul(gpu.ctx, &td[m], in_g, yb[m], n);
        float *ga = dev_get(ya[m], ly[m]), *gb = dev_get(yb[m], ly[m]);
        bool cpu_same = !memcmp(yc[m], yc2[m], ly[m] * 4), gpu_same = !memcmp(ga, gb, ly[m] * 4);
        double e = relerr(ga, yc[m], ly[m]), lim = T == GGML_TYPE_F16 ? 1e-3 : 1e-2;
        if (e > *worst) *worst = e;
        if (!cpu_same || !gpu_same || !(e < lim)) {
            printf("  matmul3 %s cols %d [%d] rows %d n %d norm %d: cpu %s, cuda %s the separate ops, rel err %.3g\n",
                   ggml_type_name(T), cols, m, shp[1 + m], n, (int)norm, cpu_same ? "==" : "!=", gpu_same ? "==" : "!=",
                   e);
            ok = false;
        }
        free(ga); free(gb);
    }
    for (int m = 0; m < 3; m++) {
        gpu.i->free(gpu.ctx, ya[m]); gpu.i->free(gpu.ctx, yb[m]); gpu.i->free(gpu.ctx, (void *)td[m].data);
        free(wf[m]); free(yc[m]); free(yc2[m]); free((void *)th[m].data);
    }
    gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, xn_a); gpu.i->free(gpu.ctx, xn_b);
    gpu.i->free(gpu.ctx, (void *)nd.data);
    free(x); free(nv); free(xn_c); free(xn_c2);
    return ok;
}

void test_matmul3(void)
{
    static const uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F16};
    /* cols, rows of wq, wk, wv, n */
    static const int shapes[][5] = {{2048, 4096, 512, 512, 1}, {2048, 4096, 512, 512, 2}, {96, 64, 32, 32, 1},
                                    {256, 100, 37, 37, 2},     {2048, 4096, 512, 512, 5}, {4096, 4096, 1024, 1024, 1},
                                    {128, 64, 64, 64, 33},     {160, 33, 8, 8, 1}};
    bool ok = cpu.i->matmul3 && gpu.i->matmul3;
    double worst = 0;
    for (size_t ti = 0; ok && ti < sizeof types / sizeof types[0]; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int norm = 0; norm < 2; norm++)
                ok = mm3_case(types[ti], shapes[s], norm, &worst) && ok;
    verdict("matmul3", ok, "outputs and normed x bit for bit the separate ops on both backends; max rel err %.3g",
            worst);
}

/* The decode-step ops that read their position from device memory (what a recorded step
 * replays): bit for bit the ops they stand for, at positions across the chunking regimes of
 * the split-K attention (one chunk, several, chunks capped), with and without head norms. */
static bool step_at_case(int nh, int nkv, int hd, int n_ctx, int pos, bool norm)
{
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd, cb = (size_t)n_ctx * kvd * 4;
    float *q = rand_vec(qd, 1.0f), *kv = rand_vec(2 * kvd, 1.0f), *kc = rand_vec((size_t)n_ctx * kvd, 1.0f),
          *vc = rand_vec((size_t)n_ctx * kvd, 1.0f), *nw = rand_vec(hd, 1.0f);
    struct tensor nh_t = make_tensor(GGML_TYPE_F32, hd, 1, nw), nd = to_dev(&nh_t);
    const struct tensor *qn = norm ? &nd : NULL, *kn = norm ? &nd : NULL;
    /* reference: the new rows written at pos, then qk_norm_rope and attention at pos */
    float *qa = dev_put(q, qd * 4), *kca = dev_put(kc, cb), *vca = dev_put(vc, cb), *oa = dev_put(NULL, qd * 4);
    dev_poison(oa, qd * 4);
    gpu.i->upload(gpu.ctx, kca + pos * kvd, kv, kvd * 4);
    gpu.i->upload(gpu.ctx, vca + pos * kvd, kv + kvd, kvd * 4);
    gpu.i->qk_norm_rope(gpu.ctx, qa, kca + pos * kvd, qn, kn, 1, nh, nkv, hd, pos, 1e6f, ROPE_NEOX, 1e-6f);
    gpu.i->attention(gpu.ctx, qa, kca, vca, oa, NULL, 1, pos, nh, nkv, hd);
    /* the _at forms */
    int32_t at = pos;
    int32_t *atd = dev_put(&at, sizeof at);
    float *qb = dev_put(q, qd * 4), *kvb = dev_put(kv, 2 * kvd * 4), *kcb = dev_put(kc, cb), *vcb = dev_put(vc, cb),
          *ob = dev_put(NULL, qd * 4);
    dev_poison(ob, qd * 4); /* every output element must be written */
    gpu.i->qk_norm_rope_at(gpu.ctx, qb, kvb, kvb + kvd, kcb, vcb, 1, atd, NULL, 0, qn, kn, nh, nkv, hd, 1e6f, ROPE_NEOX,
                           1e-6f);
    gpu.i->attention_at(gpu.ctx, qb, kcb, vcb, ob, 1, atd, NULL, 0, n_ctx, nh, nkv, hd);
    float *r[4] = {dev_get(qa, qd), dev_get(kca, (size_t)n_ctx * kvd), dev_get(vca, (size_t)n_ctx * kvd), dev_get(oa, qd)};
    float *g[4] = {dev_get(qb, qd), dev_get(kcb, (size_t)n_ctx * kvd), dev_get(vcb, (size_t)n_ctx * kvd), dev_get(ob, qd)};
    size_t len[4] = {qd, (size_t)n_ctx * kvd, (size_t)n_ctx * kvd, qd};
    bool same = true;
    for (int i = 0; i < 4; i++) {
        same = same && !memcmp(r[i], g[i], len[i] * 4) && relerr(g[i], r[i], len[i]) == 0.0;
        free(r[i]);
        free(g[i]);
    }
    if (!same)
        printf("  %d/%d heads of %d, n_ctx %d, pos %d, norm %d: the _at ops differ\n", nh, nkv, hd, n_ctx, pos, norm);
    void *dv[] = {qa, kca, vca, oa, atd, qb, kvb, kcb, vcb, ob, (void *)nd.data};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(q); free(kv); free(kc); free(vc); free(nw); free((void *)nh_t.data);
    return same;
}

void test_step_at(void)
{
    static const int cfg[][4] = {{32, 4, 128, 2048}, {8, 8, 64, 300}, {4, 2, 16, 40000}};
    bool ok = gpu.i->qk_norm_rope_at && gpu.i->attention_at && gpu.i->get_row_at;
    int n_cases = 0;
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++) {
        int n_ctx = cfg[c][3];
        int pos[] = {0, 1, 31, 32, 33, 200, 513, 4000, 39999};
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++)
            if (pos[p] < n_ctx)
                for (int norm = 0; norm < 2; norm++, n_cases++)
                    ok = step_at_case(cfg[c][0], cfg[c][1], cfg[c][2], n_ctx, pos[p], norm) && ok;
    }
    /* get_row_at: a q8_0 table */
    float *wf = rand_vec(256 * 50, 1.0f);
    struct tensor th = make_tensor(GGML_TYPE_Q8_0, 256, 50, wf), td = to_dev(&th);
    for (int id = 0; ok && id < 50; id += 7) {
        int32_t at = id;
        int32_t *atd = dev_put(&at, sizeof at);
        float *a = dev_put(NULL, 256 * 4), *b = dev_put(NULL, 256 * 4);
        gpu.i->get_row(gpu.ctx, &td, id, a);
        gpu.i->get_row_at(gpu.ctx, &td, atd, b);
        float *ha = dev_get(a, 256), *hb = dev_get(b, 256);
        ok = !memcmp(ha, hb, 256 * 4) && ok;
        free(ha); free(hb);
        gpu.i->free(gpu.ctx, a); gpu.i->free(gpu.ctx, b); gpu.i->free(gpu.ctx, atd);
    }
    gpu.i->free(gpu.ctx, (void *)td.data);
    free(wf); free((void *)th.data);
    verdict("step_at", ok && !backend_cuda_error(&gpu, NULL, 0), "qk_norm_rope_at, attention_at, get_row_at bit for bit the plain ops (%.0f cases)", n_cases);
}

/* rmsnorm + the f32 router product in one op: the normed x bit for bit the rmsnorm op's, the
 * product within rounding of the matmul's (another summation order). */
void test_norm_matmul(void)
{
    static const int shapes[][2] = {{2048, 128}, {4096, 64}, {256, 8}, {1000, 7}, {768, 129}};
    bool ok = gpu.i->norm_matmul != NULL;
    double worst = 0;
    for (size_t i = 0; ok && i < sizeof shapes / sizeof shapes[0]; i++) {
        int cols = shapes[i][0], rows = shapes[i][1];
        float *wf = rand_vec((size_t)rows * cols, 0.05f), *x = rand_vec(cols, 2.0f), *nw = rand_vec(cols, 1.0f);
        struct tensor th = make_tensor(GGML_TYPE_F32, cols, rows, wf), td = to_dev(&th);
        struct tensor nh = make_tensor(GGML_TYPE_F32, cols, 1, nw), nd = to_dev(&nh);
        float *xd = dev_put(x, cols * 4), *xa = dev_put(NULL, cols * 4), *xb = dev_put(NULL, cols * 4);
        float *ya = dev_put(NULL, rows * 4), *yb = dev_put(NULL, rows * 4);
        dev_poison(xb, cols * 4);
        dev_poison(yb, rows * 4);
        gpu.i->rmsnorm(gpu.ctx, xd, &nd, xa, cols, 1, 1e-6f);
        gpu.i->matmul(gpu.ctx, &td, xa, ya, 1);
        int rc = gpu.i->norm_matmul(gpu.ctx, &td, xd, yb, &nd, 1e-6f, xb);
        float *ha = dev_get(xa, cols), *hb = dev_get(xb, cols), *ga = dev_get(ya, rows), *gb = dev_get(yb, rows);
        double e = relerr(gb, ga, rows);
        if (e > worst) worst = e;
        bool same = !memcmp(ha, hb, cols * 4);
        /* sizes it does not take must say so, not half-run */
        bool fits = cols <= 4096 && cols > 128;
        if (fits ? rc != 0 || !same || !(e < 1e-6) : rc != TIDE_EUNSUPPORTED) {
            ok = false;
            printf("  norm_matmul %d x %d: rc %d, normed x %s, product rel err %.3g\n", cols, rows, rc,
                   same ? "same" : "DIFFERENT", e);
        }
        free(ha); free(hb); free(ga); free(gb);
        void *dv[] = {xd, xa, xb, ya, yb, (void *)td.data, (void *)nd.data};
        for (size_t j = 0; j < sizeof dv / sizeof dv[0]; j++)
            gpu.i->free(gpu.ctx, dv[j]);
        free(wf); free(x); free(nw); free((void *)th.data); free((void *)nh.data);
    }
    verdict("norm_matmul", ok && !backend_cuda_error(&gpu, NULL, 0), "normed x bit for bit rmsnorm; product max rel err %.3g", worst);
}
