/* test_moe.c - the fused MoE op (backend_i.moe_ffn) on the GPU against the CPU, and the
 * decode-step benchmark of a Qwen3-30B-A3B-shaped model with the experts op by op (the
 * per-expert path) and through moe_ffn, side by side in one run. */
#include "gpu_test.h"
#include "engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA
#include <cuda_runtime_api.h>
#endif

/* k experts of (E -> F -> E) in type T on both backends; CUDA must match the CPU slot (the
 * per-expert ops) to the q8_0 limit, or say TIDE_EUNSUPPORTED for types it does not fuse. */
static bool moe_case(uint32_t T, int E, int F, int k, double *worst)
{
    struct tensor th[16][3], td[16][3];
    struct expert_weights eh[16], ed[16];
    float w[16];
    for (int j = 0; j < k; j++) {
        int shp[3][2] = {{E, F}, {E, F}, {F, E}};
        for (int m = 0; m < 3; m++) {
            float *wf = rand_vec((size_t)shp[m][0] * shp[m][1], 1.0f / sqrtf((float)shp[m][0]));
            th[j][m] = make_tensor(T, shp[m][0], shp[m][1], wf);
            td[j][m] = to_dev(&th[j][m]);
            free(wf);
        }
        eh[j] = (struct expert_weights){th[j][0], th[j][1], th[j][2]};
        ed[j] = (struct expert_weights){td[j][0], td[j][1], td[j][2]};
        w[j] = 0.05f + 0.9f / (float)(j + 1);
    }
    float *x = rand_vec(E, 1.0f), *yc = malloc(E * sizeof(float));
    float *hb = malloc(F * sizeof(float)), *hb2 = malloc(F * sizeof(float)), *tmp = malloc(E * sizeof(float));
    int rc_c = cpu.i->moe_ffn(cpu.ctx, eh, w, k, x, yc, hb, hb2, tmp);
    float *xd = dev_put(x, E * sizeof(float)), *yd = dev_put(NULL, E * sizeof(float));
    float *s1 = dev_put(NULL, F * sizeof(float)), *s2 = dev_put(NULL, F * sizeof(float));
    float *s3 = dev_put(NULL, E * sizeof(float));
    dev_poison(yd, E * sizeof(float));
    int rc_g = gpu.i->moe_ffn(gpu.ctx, ed, w, k, xd, yd, s1, s2, s3);
    int rc_probe = gpu.i->moe_ffn(gpu.ctx, eh, w, k, NULL, NULL, NULL, NULL, NULL); /* host views */
    bool fuses = T == GGML_TYPE_Q8_0 || T == GGML_TYPE_Q4_0, ok;
    if (!fuses) {
        ok = rc_c == 0 && rc_g == TIDE_EUNSUPPORTED && rc_probe == rc_g;
        if (!ok)
            printf("  moe_ffn %s: cpu rc %d, cuda rc %d (want TIDE_EUNSUPPORTED)\n", ggml_type_name(T), rc_c, rc_g);
    } else {
        float *yg = dev_get(yd, E);
        double e = relerr(yg, yc, E);
        ok = rc_c == 0 && rc_g == 0 && rc_probe == 0 && e < 1e-2;
        if (!ok)
            printf("  moe_ffn %s E %d F %d k %d: rc %d/%d rel err %.3g\n", ggml_type_name(T), E, F, k, rc_c, rc_g, e);
        if (e > *worst) *worst = e;
        free(yg);
    }
    for (int j = 0; j < k; j++)
        for (int m = 0; m < 3; m++) {
            gpu.i->free(gpu.ctx, (void *)td[j][m].data);
            free((void *)th[j][m].data);
        }
    gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, yd);
    gpu.i->free(gpu.ctx, s1); gpu.i->free(gpu.ctx, s2); gpu.i->free(gpu.ctx, s3);
    free(x); free(yc); free(hb); free(hb2); free(tmp);
    return ok;
}

void test_moe_ffn(void)
{
    /* Qwen3-30B-A3B's expert shape; odd block counts (no paired loads); k = 1 and 16 */
    static const int cfg[][4] = {{GGML_TYPE_Q8_0, 2048, 768, 8}, {GGML_TYPE_Q8_0, 96, 64, 3},
                                 {GGML_TYPE_Q8_0, 64, 96, 1},    {GGML_TYPE_Q8_0, 128, 64, 16},
                                 {GGML_TYPE_Q4_0, 256, 96, 4},   {GGML_TYPE_Q4_0, 2048, 768, 8},
                                 {GGML_TYPE_F16, 64, 64, 2},     {GGML_TYPE_BF16, 64, 64, 2}};
    bool ok = cpu.i->moe_ffn && gpu.i->moe_ffn;
    double worst = 0;
    for (size_t i = 0; ok && i < sizeof cfg / sizeof cfg[0]; i++)
        ok = moe_case((uint32_t)cfg[i][0], cfg[i][1], cfg[i][2], cfg[i][3], &worst) && ok;
    verdict("moe_ffn", ok, "max rel err %.3g (f16/bf16: not fused, per-expert path)", worst);
}

#ifdef TIDE_CUDA
void bench_decode(double d2d, bool fused)
{
    const char *name = fused ? "bench_decode_fused" : "bench_decode";
    const int L = 48, E = 2048, H = 32, KV = 4, HD = 128, NE = 128, K = 8, F = 768, V = 151936, P = 512;
    const int QD = H * HD, KVD = KV * HD;
    uint32_t T = GGML_TYPE_Q8_0;
    size_t rb_e = ggml_row_size(T, E), rb_q = ggml_row_size(T, QD), rb_f = ggml_row_size(T, F);
    size_t per_layer_attn = rb_e * (QD + 2 * KVD) + rb_q * E;
    size_t per_expert = rb_e * F * 2 + rb_f * E;
    size_t total = (per_layer_attn + per_expert * NE) * L + rb_e * (size_t)V * 2;
    uint8_t *w = gpu.i->alloc(gpu.ctx, total);
    float *kc = gpu.i->alloc(gpu.ctx, (size_t)L * (P + 1) * KVD * 4 * 2);
    float *act = gpu.i->alloc(gpu.ctx, (size_t)(8 * E + 4 * QD + 2 * F + NE + V) * 4);
    float *routf = gpu.i->alloc(gpu.ctx, (size_t)E * NE * 4 * L);
    float *normw = gpu.i->alloc(gpu.ctx, (size_t)E * 4);
    if (!w || !kc || !act || !routf || !normw) {
        verdict(name, false, "alloc of %.1f GB failed", total / 1e9);
        return;
    }
    /* fill: a random q8_0 block repeated (D2D, fast) */
    float *wf = rand_vec((size_t)E * 64, 0.03f);
    struct tensor th = make_tensor(T, E, 64, wf);
    size_t blk = th.row_bytes * 64;
    fill_repeat(w, total, th.data, blk);
    float *rf = rand_vec((size_t)E * NE, 0.05f);
    for (int l = 0; l < L; l++)
        gpu.i->upload(gpu.ctx, routf + (size_t)l * E * NE, rf, (size_t)E * NE * 4);
    float *ones = malloc(E * 4);
    for (int i = 0; i < E; i++) ones[i] = 1.0f;
    gpu.i->upload(gpu.ctx, normw, ones, E * 4);
    gpu.i->zero(gpu.ctx, kc, (int)((size_t)L * (P + 1) * KVD * 2));
    float *x = act, *xb = x + E, *xb2 = xb + E, *mo = xb2 + E, *q = mo + E * 4, *ao = q + QD, *hb = ao + QD * 3,
          *hb2 = hb + F, *rt = hb2 + F, *lg = rt + NE;
    float *xv = rand_vec(E, 1.0f);
    gpu.i->upload(gpu.ctx, x, xv, E * 4);
    struct tensor nw = {.type = GGML_TYPE_F32, .ne = {E, 1}, .data = normw, .row_bytes = E * 4};
    struct tensor hn = {.type = GGML_TYPE_F32, .ne = {HD, 1}, .data = normw, .row_bytes = HD * 4};
    float host_rt[128], host_lg_dummy[4];
    uint64_t active = 0;
    double best = 1e9;
    for (int rep = 0; rep < 6; rep++) {
        gpu.i->sync(gpu.ctx);
        double t0 = now_s();
        active = 0;
        uint8_t *p = w;
        for (int l = 0; l < L; l++) {
            struct tensor wq = {T, {E, QD}, p, rb_e}; p += rb_e * QD;
            struct tensor wk = {T, {E, KVD}, p, rb_e}; p += rb_e * KVD;
            struct tensor wv = {T, {E, KVD}, p, rb_e}; p += rb_e * KVD;
            struct tensor wo = {T, {QD, E}, p, rb_q}; p += rb_q * E;
            float *kl = kc + (size_t)l * (P + 1) * KVD, *vl = kc + (size_t)(L + l) * (P + 1) * KVD;
            gpu.i->rmsnorm(gpu.ctx, x, &nw, xb, E, 1, 1e-6f);
            gpu.i->matmul(gpu.ctx, &wq, xb, q, 1);
            gpu.i->matmul(gpu.ctx, &wk, xb, kl + (size_t)P * KVD, 1);
            gpu.i->matmul(gpu.ctx, &wv, xb, vl + (size_t)P * KVD, 1);
            gpu.i->rmsnorm(gpu.ctx, q, &hn, q, HD, H, 1e-6f);
            gpu.i->rmsnorm(gpu.ctx, kl + (size_t)P * KVD, &hn, kl + (size_t)P * KVD, HD, KV, 1e-6f);
            gpu.i->rope(gpu.ctx, q, 1, H, HD, P, 1e6f, ROPE_NEOX);
            gpu.i->rope(gpu.ctx, kl + (size_t)P * KVD, 1, KV, HD, P, 1e6f, ROPE_NEOX);
            gpu.i->attention(gpu.ctx, q, kl, vl, ao, NULL, 1, P, H, KV, HD);
            gpu.i->matmul(gpu.ctx, &wo, ao, xb2, 1);
            gpu.i->axpy(gpu.ctx, x, xb2, 1.0f, E);
            gpu.i->rmsnorm(gpu.ctx, x, &nw, xb, E, 1, 1e-6f);
            struct tensor wr = {GGML_TYPE_F32, {E, NE}, routf + (size_t)l * E * NE, (size_t)E * 4};
            gpu.i->matmul(gpu.ctx, &wr, xb, rt, 1);
            gpu.i->download(gpu.ctx, host_rt, rt, NE * 4);
            active += per_layer_attn + (size_t)E * NE * 4 + (size_t)(P + 1) * KVD * 8;
            struct expert_weights ew[K];
            float ewt[K];
            if (!fused)
                gpu.i->zero(gpu.ctx, mo, E);
            for (int j = 0; j < K; j++) {
                int e = (int)((unsigned)(host_rt[j] * 1e6f + l * 131 + j * 17 + rep) % NE); /* any 8 distinct-ish */
                e = (e + j * 16) % NE;
                uint8_t *ep = p + (size_t)e * per_expert;
                struct tensor g = {T, {E, F}, ep, rb_e}, u = {T, {E, F}, ep + rb_e * F, rb_e};
                struct tensor d = {T, {F, E}, ep + 2 * rb_e * F, rb_f};
                active += per_expert;
                if (fused) { /* the forward's decode path: one op for the k experts */
                    ew[j] = (struct expert_weights){g, u, d};
                    ewt[j] = 0.125f;
                    continue;
                }
                gpu.i->matmul(gpu.ctx, &g, xb, hb, 1);
                gpu.i->matmul(gpu.ctx, &u, xb, hb2, 1);
                gpu.i->swiglu(gpu.ctx, hb, hb2, F);
                gpu.i->matmul(gpu.ctx, &d, hb, xb2, 1);
                gpu.i->axpy(gpu.ctx, mo, xb2, 0.125f, E);
            }
            if (fused)
                gpu.i->moe_ffn(gpu.ctx, ew, ewt, K, xb, mo, hb, hb2, xb2);
            p += per_expert * NE;
            gpu.i->axpy(gpu.ctx, x, mo, 1.0f, E);
        }
        struct tensor out = {T, {E, V}, p, rb_e};
        gpu.i->rmsnorm(gpu.ctx, x, &nw, xb, E, 1, 1e-6f);
        gpu.i->matmul(gpu.ctx, &out, xb, lg, 1);
        active += rb_e * (size_t)V;
        gpu.i->download(gpu.ctx, host_lg_dummy, lg, sizeof host_lg_dummy);
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) best = dt;
        gpu.i->upload(gpu.ctx, x, xv, E * 4); /* keep activations bounded */
    }
    double roof = active / (d2d * 1e9);
    printf("  decode step (Qwen3-30B-A3B shape, q8_0, pos %d, %s):\n"
           "    %.3f ms/token = %.1f tok/s; active bytes %.2f GB/token; roofline at d2d %.0f GB/s: %.3f ms "
           "(%.0f tok/s) -> %.0f%% of roofline\n",
           P, fused ? "experts through the fused moe_ffn op" : "every expert op by op", best * 1e3, 1.0 / best, active / 1e9, d2d, roof * 1e3, 1.0 / roof, 100.0 * roof / best);
    gpu.i->free(gpu.ctx, w); gpu.i->free(gpu.ctx, kc); gpu.i->free(gpu.ctx, act);
    gpu.i->free(gpu.ctx, routf); gpu.i->free(gpu.ctx, normw);
    free(wf); free(rf); free(ones); free(xv); free((void *)th.data);
    verdict(name, isfinite(host_rt[0]), "%.1f tok/s", 1.0 / best);
}
#endif
