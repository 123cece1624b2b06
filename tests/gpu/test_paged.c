/* test_paged.c - the paged KV cache's ops on the GPU (test-gpu paged_*), against the CPU backend's
 * attention_paged and against the GPU's own contiguous ops over the same rows:
 *   paged_attention: attention_paged, f32 and f16 pools, decode tokens (n = 1) and prompt chunks
 *     (n > 1, pos > 0, several blocks, a partial last block), through a scrambled block table
 *     whose unused blocks and whose rows past the last key are NaN. The GPU's paged output must be
 *     the bits of its contiguous op (attention / attention_f16) over the same rows laid out in one
 *     piece (same kernels, same order: only the addresses differ), and within the contiguous
 *     tests' limits of the CPU's attention_paged (1e-4; 3e-3 for the f16 tensor-core prefill).
 *   paged_rows: qk_norm_rope_at_paged + attention_at_paged for B sequences at different
 *     positions whose tables interleave one pool's blocks (and one row with no slot array, the
 *     recorded step's form): the rotated q and the rows stored through the tables are the bits
 *     of qk_norm_rope_at(_f16) on a contiguous copy of the slots, the outputs the bits of
 *     attention_at(_f16) there, and within 1e-4 of the CPU's attention_paged of each sequence
 *     over the pool as the GPU wrote it. */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/quants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A pool of nb blocks of br rows of kvd elements (es bytes each) with every byte 0xff (NaN in
 * f32 and f16), and a table of `need` distinct blocks of it in a scrambled order. */
uint8_t *nan_pool(int nb, int br, size_t kvd, size_t es)
{
    size_t bytes = (size_t)nb * br * kvd * es;
    uint8_t *p = malloc(bytes);
    memset(p, 0xff, bytes);
    return p;
}

void scramble(int32_t *perm, int nb)
{
    for (int i = 0; i < nb; i++)
        perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(rnd64() % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* Rows 0..rows-1 of the contiguous (rows, kvd) src into the pool through table tab. */
void scatter_rows(uint8_t *pool, const void *src, const int32_t *tab, int br, int rows, size_t kvd, size_t es)
{
    for (int p = 0; p < rows; p++)
        memcpy(pool + ((size_t)tab[p / br] * br + (size_t)(p % br)) * kvd * es, (const uint8_t *)src + (size_t)p * kvd * es,
               kvd * es);
}

void *host_cache(const float *x, size_t n, bool f16)
{
    if (!f16) {
        void *c = malloc(n * 4);
        memcpy(c, x, n * 4);
        return c;
    }
    uint16_t *h = malloc(n * 2);
    cpu.i->store_f16(cpu.ctx, h, x, n);
    return h;
}

/* One attention_paged case: false on a mismatch (printed). *worst / *worst_tc: the largest rel
 * errors vs the CPU of the f32 kernels and of the tensor-core prefill. */
static bool attn_case(int nh, int nkv, int hd, int pos, int n, int br, bool f16, double *worst, double *worst_tc)
{
    size_t es = f16 ? 2 : 4, kvd = (size_t)nkv * hd, qd = (size_t)nh * hd, nk = (size_t)pos + n;
    int need = (int)((nk - 1) / br + 1), nb = 2 * need + 3;
    float *q = rand_vec(n * qd, 1.0f), *k = rand_vec(nk * kvd, 1.0f), *v = rand_vec(nk * kvd, 1.0f);
    void *kc = host_cache(k, nk * kvd, f16), *vc = host_cache(v, nk * kvd, f16);
    int32_t *perm = malloc(sizeof(int32_t) * nb);
    scramble(perm, nb);
    uint8_t *kp = nan_pool(nb, br, kvd, es), *vp = nan_pool(nb, br, kvd, es);
    scatter_rows(kp, kc, perm, br, (int)nk, kvd, es);
    scatter_rows(vp, vc, perm, br, (int)nk, kvd, es);
    size_t pool = (size_t)nb * br * kvd * es;
    float *oc = malloc(n * qd * 4), *att = malloc(sizeof(float) * nh * (nk + 64));
    cpu.i->attention_paged(cpu.ctx, q, kp, vp, f16, perm, br, oc, att, n, pos, nh, nkv, hd);
    float *qg = dev_put(q, n * qd * 4), *od = dev_put(NULL, n * qd * 4), *oc2 = dev_put(NULL, n * qd * 4);
    void *kpd = dev_put(kp, pool), *vpd = dev_put(vp, pool);
    int32_t *tabd = dev_put(perm, sizeof(int32_t) * need);
    /* the contiguous cache, NaN past the last key as in the pool */
    size_t ctx = nk + 40;
    void *kd = dev_put(NULL, ctx * kvd * es), *vd = dev_put(NULL, ctx * kvd * es);
    dev_poison(kd, ctx * kvd * es);
    dev_poison(vd, ctx * kvd * es);
    gpu.i->upload(gpu.ctx, kd, kc, nk * kvd * es);
    gpu.i->upload(gpu.ctx, vd, vc, nk * kvd * es);
    bool ok = true, chunk_tc = n > 1 && (hd == 64 || hd == 128);
    /* a chunk the tensor cores take runs twice: as configured, then on the f32 kernel */
    for (int pass = 0; pass < (chunk_tc ? 2 : 1); pass++) {
        int old = cuda_set_attn_mma(-1);
        if (pass == 1)
            cuda_set_attn_mma(0);
        bool tc = chunk_tc && pass == 0 && old;
        dev_poison(od, n * qd * 4);
        dev_poison(oc2, n * qd * 4);
        gpu.i->attention_paged(gpu.ctx, qg, kpd, vpd, f16, tabd, br, od, NULL, n, pos, nh, nkv, hd);
        if (f16)
            gpu.i->attention_f16(gpu.ctx, qg, kd, vd, oc2, NULL, n, pos, nh, nkv, hd);
        else
            gpu.i->attention(gpu.ctx, qg, kd, vd, oc2, NULL, n, pos, nh, nkv, hd);
        cuda_set_attn_mma(old);
        float *og = dev_get(od, n * qd), *ogc = dev_get(oc2, n * qd);
        double e = relerr(og, oc, n * qd);
        bool same = !memcmp(og, ogc, n * qd * 4);
        if (!same || !(e < (tc ? 3e-3 : 1e-4))) {
            ok = false;
            printf("  paged_attention %s nh %d nkv %d hd %d pos %d n %d block %d%s: rel err %.3g vs the CPU, %s the "
                   "contiguous op's bits\n", f16 ? "f16" : "f32", nh, nkv, hd, pos, n, br, tc ? " (f16 mma)" : "", e,
                   same ? "=" : "DIFFERS from");
        }
        if (e > (tc ? *worst_tc : *worst))
            *(tc ? worst_tc : worst) = e;
        free(og);
        free(ogc);
    }
    void *dv[] = {qg, od, oc2, kpd, vpd, tabd, kd, vd};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(q); free(k); free(v); free(kc); free(vc); free(perm); free(kp); free(vp); free(oc); free(att);
    return ok;
}

void test_paged_attention(void)
{
    /* n_head, n_head_kv, head_dim, pos, n, block_rows: decode tokens (chunks of 32 keys over
     * blocks of 16, tiles of 16 at head_dim 256, element copies at head_dim 18), then prompt
     * chunks (the tensor-core and f32 tiled kernels, and the decode kernel a token at a time
     * where the cost model picks it), all but the first ending in a partial block */
    static const int cfg[][6] = {{4, 2, 16, 0, 1, 16},      {32, 4, 128, 700, 1, 16},   {32, 4, 128, 5000, 1, 64},
                                 {16, 16, 64, 2047, 1, 32}, {8, 1, 256, 999, 1, 16},    {6, 2, 96, 77, 1, 16},
                                 {12, 4, 40, 33, 1, 16},    {4, 2, 18, 20, 1, 16},      {32, 4, 128, 1000, 512, 16},
                                 {32, 4, 128, 37, 64, 32},  {16, 16, 64, 200, 130, 16}, {6, 2, 96, 77, 45, 16},
                                 {8, 1, 256, 10, 40, 16},   {12, 4, 40, 3, 99, 16},     {32, 4, 128, 6000, 20, 128},
                                 {4, 2, 18, 5, 30, 16}};
    bool ok = gpu.i->attention_paged && cpu.i->attention_paged;
    double worst = 0, worst_tc = 0;
    for (int f16 = 0; f16 < 2 && ok; f16++)
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
            ok = attn_case(cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5], f16, &worst, &worst_tc) &&
                 ok;
    char cerr[300] = "";
    if (backend_cuda_error(&gpu, cerr, sizeof cerr)) {
        printf("  paged_attention: %s\n", cerr);
        ok = false;
    }
    printf("  paged_attention: f16 tensor-core prefill max rel err %.3g (limit 3e-3)\n", worst_tc);
    verdict("paged_attention", ok,
            "= the contiguous op's bits, f32 kernels max rel err vs the CPU's attention_paged %.3g (limit 1e-4)", worst);
}

/* n rows, row r of slot sl[r] (sl NULL: one row, no slot array, slot 0) at position ps[r], over
 * a pool whose blocks the n_slot tables (per_slot entries each, -1 past a slot's blocks) take in
 * turn: slot s's block j is pool block perm[j * n_slot + s]. */
static bool rows_case(int n, const int *sl, const int *ps, int n_slot, int n_ctx, int br, int nh, int nkv, int hd,
                      bool f16)
{
    size_t es = f16 ? 2 : 4, qd = (size_t)nh * hd, kvd = (size_t)nkv * hd, sf = (size_t)n_ctx * kvd;
    int per_slot = (n_ctx + br - 1) / br, nb = per_slot * n_slot + 3;
    int32_t *perm = malloc(sizeof(int32_t) * nb), *tabs = malloc(sizeof(int32_t) * per_slot * n_slot);
    scramble(perm, nb);
    for (int s = 0; s < n_slot; s++)
        for (int j = 0; j < per_slot; j++)
            tabs[s * per_slot + j] = -1;
    /* the rows each slot has: its row's position and the ones before (the row's new one included) */
    int *len = calloc(n_slot, sizeof(int));
    for (int r = 0; r < n; r++)
        len[sl ? sl[r] : 0] = ps[r] + 1;
    for (int s = 0; s < n_slot; s++)
        for (int j = 0; j < (len[s] + br - 1) / br; j++)
            tabs[s * per_slot + j] = perm[j * n_slot + s];
    float *q = rand_vec(qd * n, 1.0f), *kn = rand_vec(kvd * n, 1.0f), *vn = rand_vec(kvd * n, 1.0f);
    float *k0 = rand_vec(sf * n_slot, 1.0f), *v0 = rand_vec(sf * n_slot, 1.0f), *nw = rand_vec(hd, 1.0f);
    void *kc = host_cache(k0, sf * n_slot, f16), *vc = host_cache(v0, sf * n_slot, f16); /* contiguous slots */
    uint8_t *kp = nan_pool(nb, br, kvd, es), *vp = nan_pool(nb, br, kvd, es);
    for (int s = 0; s < n_slot; s++) { /* each slot's rows before its new one, through its table */
        int rows = len[s] ? len[s] - 1 : 0;
        scatter_rows(kp, (uint8_t *)kc + (size_t)s * sf * es, tabs + s * per_slot, br, rows, kvd, es);
        scatter_rows(vp, (uint8_t *)vc + (size_t)s * sf * es, tabs + s * per_slot, br, rows, kvd, es);
    }
    size_t pool = (size_t)nb * br * kvd * es, cache = sf * n_slot * es;
    struct tensor nt = make_tensor(GGML_TYPE_F32, hd, 1, nw), nd = to_dev(&nt);
    int32_t *atd = dev_put(ps, sizeof(int32_t) * n), *sld = sl ? dev_put(sl, sizeof(int32_t) * n) : NULL;
    int32_t *tabd = dev_put(tabs, sizeof(int32_t) * per_slot * n_slot);
    /* paged */
    float *qa = dev_put(q, qd * n * 4), *kna = dev_put(kn, kvd * n * 4), *vna = dev_put(vn, kvd * n * 4);
    void *kpd = dev_put(kp, pool), *vpd = dev_put(vp, pool);
    float *oa = dev_put(NULL, qd * n * 4);
    dev_poison(oa, qd * n * 4);
    gpu.i->qk_norm_rope_at_paged(gpu.ctx, qa, kna, vna, kpd, vpd, f16, n, atd, sld, tabd, per_slot, br, &nd, &nd, nh, nkv,
                                 hd, 1e6f, ROPE_NEOX, 1e-6f);
    gpu.i->attention_at_paged(gpu.ctx, qa, kpd, vpd, f16, oa, n, atd, sld, tabd, per_slot, br, n_ctx, nh, nkv, hd);
    /* contiguous, the same rows */
    float *qb = dev_put(q, qd * n * 4), *knb = dev_put(kn, kvd * n * 4), *vnb = dev_put(vn, kvd * n * 4);
    void *kcd = dev_put(kc, cache), *vcd = dev_put(vc, cache);
    float *ob = dev_put(NULL, qd * n * 4);
    dev_poison(ob, qd * n * 4);
    size_t stride = sl ? sf : 0;
    if (f16) {
        gpu.i->qk_norm_rope_at_f16(gpu.ctx, qb, knb, vnb, kcd, vcd, n, atd, sld, stride, &nd, &nd, nh, nkv, hd, 1e6f,
                                   ROPE_NEOX, 1e-6f);
        gpu.i->attention_at_f16(gpu.ctx, qb, kcd, vcd, ob, n, atd, sld, stride, n_ctx, nh, nkv, hd);
    } else {
        gpu.i->qk_norm_rope_at(gpu.ctx, qb, knb, vnb, kcd, vcd, n, atd, sld, stride, &nd, &nd, nh, nkv, hd, 1e6f,
                               ROPE_NEOX, 1e-6f);
        gpu.i->attention_at(gpu.ctx, qb, kcd, vcd, ob, n, atd, sld, stride, n_ctx, nh, nkv, hd);
    }
    float *qa_h = dev_get(qa, qd * n), *qb_h = dev_get(qb, qd * n), *oa_h = dev_get(oa, qd * n), *ob_h = dev_get(ob, qd * n);
    uint8_t *kp_h = malloc(pool), *vp_h = malloc(pool), *kc_h = malloc(cache), *vc_h = malloc(cache);
    gpu.i->download(gpu.ctx, kp_h, kpd, pool);
    gpu.i->download(gpu.ctx, vp_h, vpd, pool);
    gpu.i->download(gpu.ctx, kc_h, kcd, cache);
    gpu.i->download(gpu.ctx, vc_h, vcd, cache);
    /* the new rows: where the tables put them in the pool, the contiguous op's bits */
    bool stored = true;
    for (int r = 0; r < n; r++) {
        int s = sl ? sl[r] : 0, p = ps[r];
        size_t po = ((size_t)tabs[s * per_slot + p / br] * br + (size_t)(p % br)) * kvd * es;
        size_t co = ((size_t)s * sf + (size_t)p * kvd) * es;
        stored = stored && !memcmp(kp_h + po, kc_h + co, kvd * es) && !memcmp(vp_h + po, vc_h + co, kvd * es);
    }
    bool same_q = !memcmp(qa_h, qb_h, qd * n * 4), same_o = !memcmp(oa_h, ob_h, qd * n * 4);
    /* the CPU's attention_paged of each row over the pool the GPU wrote */
    float *oc = malloc(qd * n * 4), *att = malloc(sizeof(float) * nh * (n_ctx + 64));
    for (int r = 0; r < n; r++) {
        int s = sl ? sl[r] : 0;
        cpu.i->attention_paged(cpu.ctx, qa_h + r * qd, kp_h, vp_h, f16, tabs + s * per_slot, br, oc + r * qd, att, 1,
                               ps[r], nh, nkv, hd);
    }
    double e = relerr(oa_h, oc, qd * n);
    bool ok = stored && same_q && same_o && e < 1e-4;
    printf("  paged_rows %s: %d rows%s, n_ctx %d, block %d, hd %d: q %s, stored rows %s, out %s the contiguous ops', "
           "rel err %.3g vs the CPU\n", f16 ? "f16" : "f32", n, sl ? "" : " (no slots)", n_ctx, br, hd,
           same_q ? "=" : "DIFFERS", stored ? "=" : "DIFFER", same_o ? "=" : "DIFFERS from", e);
    void *dv[] = {atd, sld, tabd, qa, kna, vna, kpd, vpd, oa, qb, knb, vnb, kcd, vcd, ob, (void *)nd.data};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        if (dv[i])
            gpu.i->free(gpu.ctx, dv[i]);
    free(perm); free(tabs); free(len); free(q); free(kn); free(vn); free(k0); free(v0); free(nw); free(kc); free(vc);
    free(kp); free(vp); free((void *)nt.data); free(qa_h); free(qb_h); free(oa_h); free(ob_h); free(kp_h); free(vp_h);
    free(kc_h); free(vc_h); free(oc); free(att);
    return ok;
}

void test_paged_rows(void)
{
    bool ok = gpu.i->qk_norm_rope_at_paged && gpu.i->attention_at_paged && cpu.i->attention_paged;
    int cases = 0;
    for (int f16 = 0; f16 < 2 && ok; f16++) {
        /* positions at a block's first and last rows, the first row, deep ones */
        int sl[] = {3, 0, 5, 1, 6, 2, 4}, ps[] = {0, 31, 32, 599, 300, 15, 100};
        ok = rows_case(7, sl, ps, 7, 600, 16, 32, 4, 128, f16) && ok;
        int sl2[] = {1, 0}, ps2[] = {4000, 17};
        ok = rows_case(2, sl2, ps2, 2, 4096, 64, 16, 2, 64, f16) && ok;
        int sl3[] = {2, 0, 1}, ps3[] = {1000, 511, 64};
        ok = rows_case(3, sl3, ps3, 3, 1024, 32, 8, 1, 256, f16) && ok;
        int ps4[] = {257};
        ok = rows_case(1, NULL, ps4, 1, 300, 16, 8, 2, 96, f16) && ok; /* a recorded step's form */
        cases += 4;
    }
    char cerr[300] = "";
    if (backend_cuda_error(&gpu, cerr, sizeof cerr)) {
        printf("  paged_rows: %s\n", cerr);
        ok = false;
    }
    verdict("paged_rows", ok,
            "qk_norm_rope_at_paged + attention_at_paged = the contiguous ops' bits, CPU attention_paged (%.0f cases)",
            cases);
}
