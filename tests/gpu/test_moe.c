/* test_moe.c - the MoE ops on the GPU against the CPU: top-k routing (backend_i.route), the
 * fused op (backend_i.moe_ffn) and its table form (moe_ffn_table, bit for bit the fused op);
 * and the decode-step benchmark of a Qwen3-30B-A3B-shaped model with the experts op by op
 * (the per-expert path), through moe_ffn (router logits to the host each layer), and from a
 * device table (routing on the device, no host wait in the step), side by side in one run. */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
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
    int rc_c = cpu.i->moe_ffn(cpu.ctx, eh, w, k, x, yc, hb, hb2, tmp, false);
    float *xd = dev_put(x, E * sizeof(float)), *yd = dev_put(NULL, E * sizeof(float));
    float *s1 = dev_put(NULL, F * sizeof(float)), *s2 = dev_put(NULL, F * sizeof(float));
    float *s3 = dev_put(NULL, E * sizeof(float));
    dev_poison(yd, E * sizeof(float));
    int rc_g = gpu.i->moe_ffn(gpu.ctx, ed, w, k, xd, yd, s1, s2, s3, false);
    int rc_probe = gpu.i->moe_ffn(gpu.ctx, eh, w, k, NULL, NULL, NULL, NULL, NULL, false); /* host views */
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
        /* add (the residual fused in): bit for bit the sum, then axpy(y, sum, 1.0f), each side */
        float *y0 = rand_vec(E, 1.0f), *ya = malloc(E * sizeof(float)), *yb = malloc(E * sizeof(float));
        memcpy(ya, y0, E * sizeof(float));
        memcpy(yb, y0, E * sizeof(float));
        int rc_a = cpu.i->moe_ffn(cpu.ctx, eh, w, k, x, ya, hb, hb2, tmp, true);
        cpu.i->axpy(cpu.ctx, yb, yc, 1.0f, E);
        bool cpu_same = rc_a == 0 && !memcmp(ya, yb, E * sizeof(float));
        float *y0d = dev_put(y0, E * sizeof(float));
        int rc_ga = gpu.i->moe_ffn(gpu.ctx, ed, w, k, xd, y0d, s1, s2, s3, true);
        float *gadd = dev_get(y0d, E);
        for (int i = 0; i < E; i++)
            yb[i] = y0[i] + yg[i]; /* the axpy with a = 1 on the host: the same bits */
        bool gpu_same = rc_ga == 0 && !memcmp(gadd, yb, E * sizeof(float));
        if (!cpu_same || !gpu_same) {
            printf("  moe_ffn add %s E %d F %d k %d: cpu %s, cuda %s the sum + axpy\n", ggml_type_name(T), E, F, k,
                   cpu_same ? "==" : "!=", gpu_same ? "==" : "!=");
            ok = false;
        }
        gpu.i->free(gpu.ctx, y0d);
        free(y0); free(ya); free(yb); free(gadd);
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

/* route on both backends: the same experts, in index order, and the same weights (the sum
 * over all experts is a warp reduction on the GPU: 1e-6 apart at most); ties included. */
void test_route(void)
{
    static const int cfg[][3] = {{128, 8, 37}, {8, 2, 64}, {60, 4, 5}, {128, 1, 3}, {1000, 16, 2}};
    bool ok = cpu.i->route && gpu.i->route;
    double worst = 0;
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++) {
        int ne = cfg[c][0], k = cfg[c][1], n = cfg[c][2];
        for (int norm = 0; norm < 2 && ok; norm++) {
            float *lg = rand_vec((size_t)n * ne, 2.0f);
            for (int t = 0; t < n; t += 2) /* ties: the lower index must win */
                lg[(size_t)t * ne + ne - 1] = lg[(size_t)t * ne + ne / 2] = lg[(size_t)t * ne + 1] = 9.0f;
            size_t ob = sizeof(int32_t) * 2 * (size_t)n * k;
            int32_t *oc = malloc(ob), *og;
            cpu.i->route(cpu.ctx, lg, n, ne, k, norm, oc);
            float *ld = dev_put(lg, sizeof(float) * (size_t)n * ne);
            int32_t *od = dev_put(NULL, ob);
            dev_poison(od, ob);
            gpu.i->route(gpu.ctx, ld, n, ne, k, norm, od);
            og = (int32_t *)dev_get(od, 2 * (size_t)n * k);
            bool same_sel = !memcmp(oc, og, sizeof(int32_t) * (size_t)n * k);
            double e = relerr((float *)(og + (size_t)n * k), (float *)(oc + (size_t)n * k), (size_t)n * k);
            if (e > worst) worst = e;
            if (!same_sel || e > 1e-6) {
                printf("  route ne %d k %d n %d norm %d: %s, weights rel err %.3g\n", ne, k, n, norm,
                       same_sel ? "same experts" : "DIFFERENT experts", e);
                ok = false;
            }
            gpu.i->free(gpu.ctx, ld); gpu.i->free(gpu.ctx, od);
            free(lg); free(oc); free(og);
        }
    }
    verdict("route", ok, "weights max rel err %.3g, experts identical", worst);
}

/* moe_ffn_table against moe_ffn on the same experts and the same routed weights: the bits
 * must be equal (the forward switches between the two as the cache fills or shrinks). */
void test_moe_ffn_table(void)
{
    static const int cfg[][5] = {{GGML_TYPE_Q8_0, 2048, 768, 8, 128}, {GGML_TYPE_Q8_0, 96, 64, 3, 7},
                                 {GGML_TYPE_Q4_0, 256, 96, 4, 16}, {GGML_TYPE_Q8_0, 128, 64, 16, 40}};
    bool ok = gpu.i->moe_ffn_table && gpu.i->route && gpu.i->moe_ffn_table_route;
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++) {
        uint32_t T = (uint32_t)cfg[c][0];
        int E = cfg[c][1], F = cfg[c][2], k = cfg[c][3], NE = cfg[c][4];
        size_t rbe = ggml_row_size(T, E), rbf = ggml_row_size(T, F);
        size_t parts[3] = {rbe * F, rbe * F, rbf * E}, slot = 0;
        for (int m = 0; m < 3; m++) slot += (parts[m] + 255) / 256 * 256;
        uint8_t *ex = gpu.i->alloc(gpu.ctx, slot * NE);
        const void **tab = malloc(sizeof(void *) * 3 * NE);
        struct expert_weights *ew = malloc(sizeof *ew * NE);
        for (int e = 0; e < NE; e++) {
            size_t off = 0;
            struct tensor t3[3];
            for (int m = 0; m < 3; m++) {
                int cols = m < 2 ? E : F, rows = m < 2 ? F : E;
                float *wf = rand_vec((size_t)cols * rows, 1.0f / sqrtf((float)cols));
                struct tensor h = make_tensor(T, cols, rows, wf);
                gpu.i->upload(gpu.ctx, ex + (size_t)e * slot + off, h.data, parts[m]);
                t3[m] = h;
                t3[m].data = ex + (size_t)e * slot + off;
                tab[3 * e + m] = t3[m].data;
                off += (parts[m] + 255) / 256 * 256;
                free((void *)h.data);
                free(wf);
            }
            ew[e] = (struct expert_weights){t3[0], t3[1], t3[2]};
        }
        void *tab_d = dev_put(tab, sizeof(void *) * 3 * NE);
        /* a token's routing from random logits, on the device */
        float *lg = rand_vec(NE, 2.0f), *ld = dev_put(lg, sizeof(float) * NE);
        int32_t *rd = dev_put(NULL, sizeof(int32_t) * 2 * k);
        gpu.i->route(gpu.ctx, ld, 1, NE, k, true, rd);
        int32_t *rh = (int32_t *)dev_get(rd, 2 * (size_t)k);
        struct expert_weights sel[16];
        for (int j = 0; j < k; j++) sel[j] = ew[rh[j]];
        float *x = rand_vec(E, 1.0f), *xd = dev_put(x, sizeof(float) * E);
        float *y1 = dev_put(NULL, sizeof(float) * E), *y2 = dev_put(NULL, sizeof(float) * E);
        dev_poison(y1, sizeof(float) * E);
        dev_poison(y2, sizeof(float) * E);
        int rc1 = gpu.i->moe_ffn(gpu.ctx, sel, (float *)(rh + k), k, xd, y1, NULL, NULL, NULL, false);
        int rc2 = gpu.i->moe_ffn_table(gpu.ctx, &ew[0], tab_d, rd, k, xd, y2, false);
        float *h1 = dev_get(y1, E), *h2 = dev_get(y2, E);
        bool same = rc1 == 0 && rc2 == 0 && !memcmp(h1, h2, sizeof(float) * E) && isfinite(h1[0]);
        if (!same)
            printf("  moe_ffn_table %s E %d F %d k %d: rc %d/%d, %s\n", ggml_type_name(T), E, F, k, rc1, rc2,
                   "outputs differ");
        /* the add forms (y += sum) on a residual: equal to each other and to sum + axpy */
        float *r0 = rand_vec(E, 1.0f), *ra = dev_put(r0, sizeof(float) * E), *rb = dev_put(r0, sizeof(float) * E);
        int rc3 = gpu.i->moe_ffn(gpu.ctx, sel, (float *)(rh + k), k, xd, ra, NULL, NULL, NULL, true);
        int rc4 = gpu.i->moe_ffn_table(gpu.ctx, &ew[0], tab_d, rd, k, xd, rb, true);
        float *ha = dev_get(ra, E), *hb = dev_get(rb, E);
        for (int i = 0; i < E; i++)
            r0[i] += h1[i]; /* axpy with a = 1, on the host: the same bits */
        bool same_add = rc3 == 0 && rc4 == 0 && !memcmp(ha, hb, sizeof(float) * E) && !memcmp(ha, r0, sizeof(float) * E);
        if (!same_add)
            printf("  moe_ffn_table add %s E %d F %d k %d: rc %d/%d, %s\n", ggml_type_name(T), E, F, k, rc3, rc4,
                   "outputs differ");
        /* routing fused in (moe_ffn_table_route): the same route() words and the same y */
        int32_t *rd2 = dev_put(NULL, sizeof(int32_t) * 2 * k);
        float *rc0 = rand_vec(E, 1.0f), *rcd = dev_put(rc0, sizeof(float) * E);
        dev_poison(rd2, sizeof(int32_t) * 2 * k);
        int rc5 = gpu.i->moe_ffn_table_route(gpu.ctx, &ew[0], tab_d, ld, 1, NE, true, rd2, k, xd, rcd, false);
        int32_t *rh2 = (int32_t *)dev_get(rd2, 2 * (size_t)k);
        float *hc = dev_get(rcd, E);
        bool same_route = rc5 == 0 && !memcmp(rh, rh2, sizeof(int32_t) * 2 * k) && !memcmp(hc, h1, sizeof(float) * E);
        if (!same_route)
            printf("  moe_ffn_table_route %s E %d F %d k %d: rc %d, %s\n", ggml_type_name(T), E, F, k, rc5,
                   "routing or outputs differ from route + moe_ffn_table");
        ok = ok && same && same_add && same_route;
        gpu.i->free(gpu.ctx, ra); gpu.i->free(gpu.ctx, rb); gpu.i->free(gpu.ctx, rd2); gpu.i->free(gpu.ctx, rcd);
        free(r0); free(ha); free(hb); free(rc0); free(rh2); free(hc);
        gpu.i->free(gpu.ctx, ex); gpu.i->free(gpu.ctx, tab_d); gpu.i->free(gpu.ctx, ld); gpu.i->free(gpu.ctx, rd);
        gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, y1); gpu.i->free(gpu.ctx, y2);
        free(tab); free(ew); free(lg); free(rh); free(x); free(h1); free(h2);
    }
    verdict("moe_ffn_table", ok, "%.0f cases, each bit for bit the moe_ffn result, = and +=, routing fused or not",
            (double)(sizeof cfg / sizeof cfg[0]));
}

#ifdef TIDE_CUDA
/* mode 0: experts op by op; 1: the fused op, routing on the host (a download a layer);
 * 2: routing on the device and the experts from a device table (the resident decode step),
 * with the forward's fused ops: attention norm + wq/wk/wv in one launch, q/k norms + rope in
 * one op, the routing inside the MoE's first launch, the residual adds inside the wo product
 * and the MoE; 3: mode 2 with those as separate ops (the step before the fusion) */
void bench_decode(double d2d, int mode)
{
    static const char *const names[] = {"bench_decode", "bench_decode_fused", "bench_decode_table",
                                        "bench_decode_table_unfused", "bench_decode_ops", "bench_decode_graph"};
    const char *name = names[mode];
    /* mode 4 times each op of the fused table step alone (48 launches, one per layer's
     * weights), mode 5 replays the fused table step as one recorded graph */
    bool fused = mode == 1, table = mode >= 2, fuse_ops = mode == 2 || mode >= 4;
    static const char *const op_names[] = {"matmul3 (norm + wq/wk/wv)", "qk_norm_rope", "attention (pos 512)",
                                           "matmul_add (wo + residual)", "ffn norm + router (norm_matmul)", "router matmul (unfused only)",
                                           "moe_ffn_table_route", "output head (norm + vocab)", "empty launches (zero 1)"};
    int only = mode == 4 ? 0 : -1;
    void *graph = NULL;
#define DO(i) (only < 0 || only == (i))
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
    int32_t *routed = gpu.i->alloc(gpu.ctx, sizeof(int32_t) * 2 * K * L);
    void *tab_d = gpu.i->alloc(gpu.ctx, sizeof(void *) * 3 * NE * L);
    float *normw = gpu.i->alloc(gpu.ctx, (size_t)E * 4);
    if (!w || !kc || !act || !routf || !normw || !routed || !tab_d) {
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
    { /* the device table of every layer's experts, as the expert cache would publish it */
        const void **tab = malloc(sizeof(void *) * 3 * NE * L);
        uint8_t *p = w;
        for (int l = 0; l < L; l++) {
            p += per_layer_attn;
            for (int e = 0; e < NE; e++) {
                uint8_t *ep = p + (size_t)e * per_expert;
                tab[3 * ((size_t)l * NE + e)] = ep;
                tab[3 * ((size_t)l * NE + e) + 1] = ep + rb_e * F;
                tab[3 * ((size_t)l * NE + e) + 2] = ep + 2 * rb_e * F;
            }
            p += per_expert * NE;
        }
        gpu.i->upload(gpu.ctx, tab_d, tab, sizeof(void *) * 3 * NE * L);
        gpu.i->sync(gpu.ctx);
        free(tab);
    }
    host_rt[0] = 0.0f;
    uint64_t active = 0;
    double best = 1e9;
again:
    best = 1e9;
    for (int rep = 0; rep < 6; rep++) {
        gpu.i->sync(gpu.ctx);
        if (mode == 5 && rep == 1 && !graph) { /* record after the warm-up step */
            int rc = gpu.i->graph_begin ? gpu.i->graph_begin(gpu.ctx) : TIDE_EUNSUPPORTED;
            if (rc) {
                verdict(name, false, "graph_begin %.0f", rc);
                return;
            }
        }
        double t0 = now_s();
        if (graph) {
            gpu.i->graph_launch(gpu.ctx, graph);
            gpu.i->download(gpu.ctx, host_lg_dummy, lg, sizeof host_lg_dummy);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
            gpu.i->upload(gpu.ctx, x, xv, E * 4);
            continue;
        }
        active = 0;
        uint8_t *p = w;
        for (int l = 0; l < L; l++) {
            struct tensor wq = {T, {E, QD}, p, rb_e}; p += rb_e * QD;
            struct tensor wk = {T, {E, KVD}, p, rb_e}; p += rb_e * KVD;
            struct tensor wv = {T, {E, KVD}, p, rb_e}; p += rb_e * KVD;
            struct tensor wo = {T, {QD, E}, p, rb_q}; p += rb_q * E;
            float *kl = kc + (size_t)l * (P + 1) * KVD, *vl = kc + (size_t)(L + l) * (P + 1) * KVD;
            if (mode == 4 && only == 8) {
                for (int z = 0; z < 9; z++)
                    gpu.i->zero(gpu.ctx, hb, 1);
            }
            if (fuse_ops) {
                const struct tensor *const w3[3] = {&wq, &wk, &wv};
                float *const y3[3] = {q, kl + (size_t)P * KVD, vl + (size_t)P * KVD};
                if (DO(0))
                    gpu.i->matmul3(gpu.ctx, w3, x, y3, 1, &nw, 1e-6f, xb);
            } else {
                gpu.i->rmsnorm(gpu.ctx, x, &nw, xb, E, 1, 1e-6f);
                gpu.i->matmul(gpu.ctx, &wq, xb, q, 1);
                gpu.i->matmul(gpu.ctx, &wk, xb, kl + (size_t)P * KVD, 1);
                gpu.i->matmul(gpu.ctx, &wv, xb, vl + (size_t)P * KVD, 1);
            }
            if (fuse_ops) {
                if (DO(1))
                    gpu.i->qk_norm_rope(gpu.ctx, q, kl + (size_t)P * KVD, &hn, &hn, 1, H, KV, HD, P, 1e6f, ROPE_NEOX,
                                        1e-6f);
            } else {
                gpu.i->rmsnorm(gpu.ctx, q, &hn, q, HD, H, 1e-6f);
                gpu.i->rmsnorm(gpu.ctx, kl + (size_t)P * KVD, &hn, kl + (size_t)P * KVD, HD, KV, 1e-6f);
                gpu.i->rope(gpu.ctx, q, 1, H, HD, P, 1e6f, ROPE_NEOX);
                gpu.i->rope(gpu.ctx, kl + (size_t)P * KVD, 1, KV, HD, P, 1e6f, ROPE_NEOX);
            }
            if (DO(2))
                gpu.i->attention(gpu.ctx, q, kl, vl, ao, NULL, 1, P, H, KV, HD);
            if (fuse_ops) {
                if (DO(3))
                    gpu.i->matmul_add(gpu.ctx, &wo, ao, x, 1);
            } else {
                gpu.i->matmul(gpu.ctx, &wo, ao, xb2, 1);
                gpu.i->axpy(gpu.ctx, x, xb2, 1.0f, E);
            }
            struct tensor wr = {GGML_TYPE_F32, {E, NE}, routf + (size_t)l * E * NE, (size_t)E * 4};
            if (fuse_ops && gpu.i->norm_matmul) { /* the forward's decode form */
                if (DO(4))
                    gpu.i->norm_matmul(gpu.ctx, &wr, x, rt, &nw, 1e-6f, xb);
            } else {
                if (DO(4))
                    gpu.i->rmsnorm(gpu.ctx, x, &nw, xb, E, 1, 1e-6f);
                if (DO(5))
                    gpu.i->matmul(gpu.ctx, &wr, xb, rt, 1);
            }
            active += per_layer_attn + (size_t)E * NE * 4 + (size_t)(P + 1) * KVD * 8;
            if (table) {
                int32_t *rl = routed + (size_t)l * 2 * K;
                struct tensor g = {T, {E, F}, p, rb_e}, u = {T, {E, F}, p + rb_e * F, rb_e};
                struct tensor d = {T, {F, E}, p + 2 * rb_e * F, rb_f};
                struct expert_weights shape = {g, u, d};
                const void *const *tl = (const void *const *)tab_d + (size_t)l * NE * 3;
                if (fuse_ops) {
                    if (DO(6))
                        gpu.i->moe_ffn_table_route(gpu.ctx, &shape, tl, rt, 1, NE, true, rl, K, xb, x, true);
                } else {
                    gpu.i->route(gpu.ctx, rt, 1, NE, K, true, rl);
                    gpu.i->moe_ffn_table(gpu.ctx, &shape, tl, rl, K, xb, mo, false);
                }
                active += per_expert * K;
                p += per_expert * NE;
                if (!fuse_ops)
                    gpu.i->axpy(gpu.ctx, x, mo, 1.0f, E);
                continue;
            }
            gpu.i->download(gpu.ctx, host_rt, rt, NE * 4);
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
                gpu.i->moe_ffn(gpu.ctx, ew, ewt, K, xb, mo, hb, hb2, xb2, false);
            p += per_expert * NE;
            gpu.i->axpy(gpu.ctx, x, mo, 1.0f, E);
        }
        struct tensor out = {T, {E, V}, p, rb_e};
        if (DO(7)) {
            gpu.i->rmsnorm(gpu.ctx, x, &nw, xb, E, 1, 1e-6f);
            gpu.i->matmul(gpu.ctx, &out, xb, lg, 1);
        }
        active += rb_e * (size_t)V;
        if (mode == 5 && rep == 1) {
            int rc = gpu.i->graph_end(gpu.ctx, &graph);
            if (rc || !graph) {
                verdict(name, false, "graph_end %.0f", rc);
                return;
            }
            rep = 0; /* the timed replays follow */
            continue;
        }
        gpu.i->download(gpu.ctx, host_lg_dummy, lg, sizeof host_lg_dummy);
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) best = dt;
        gpu.i->upload(gpu.ctx, x, xv, E * 4); /* keep activations bounded */
    }
    if (mode == 4) {
        printf("  %-28s %8.1f us a step (%d launches: %.2f us each)\n", op_names[only], best * 1e6,
               only == 7 ? 2 : only == 8 ? 9 * L : L, best * 1e6 / (only == 7 ? 2 : only == 8 ? 9 * L : L));
        if (++only < 9)
            goto again;
    }
#undef DO
    if (graph) {
        printf("  one recorded graph of the whole step, replayed: %.3f ms/token = %.1f tok/s\n", best * 1e3, 1.0 / best);
        gpu.i->graph_free(gpu.ctx, graph);
    }
    double roof = active / (d2d * 1e9);
    printf("  decode step (Qwen3-30B-A3B shape, q8_0, pos %d, %s):\n"
           "    %.3f ms/token = %.1f tok/s; active bytes %.2f GB/token; roofline at d2d %.0f GB/s: %.3f ms "
           "(%.0f tok/s) -> %.0f%% of roofline\n",
           P, fuse_ops ? "routing on the device, experts from the device table, fused norm+qkv, qk norm+rope, route+moe, residual adds" : table ? "routing on the device, experts from the device table" : fused ? "experts through the fused moe_ffn op" : "every expert op by op", best * 1e3, 1.0 / best, active / 1e9, d2d, roof * 1e3, 1.0 / roof, 100.0 * roof / best);
    float xf[4];
    gpu.i->download(gpu.ctx, xf, x, sizeof xf); /* before act is freed */
    gpu.i->free(gpu.ctx, w); gpu.i->free(gpu.ctx, kc); gpu.i->free(gpu.ctx, act);
    gpu.i->free(gpu.ctx, routf); gpu.i->free(gpu.ctx, normw);
    gpu.i->free(gpu.ctx, routed); gpu.i->free(gpu.ctx, tab_d);
    free(wf); free(rf); free(ones); free(xv); free((void *)th.data);
    verdict(name, isfinite(host_rt[0]) && isfinite(xf[0]) && !backend_cuda_error(&gpu, NULL, 0), "%.1f tok/s", 1.0 / best);
}
#endif
