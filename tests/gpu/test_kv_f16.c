/* test_kv_f16.c - the f16 KV cache's ops on the GPU against the CPU backend's (test-gpu kv_f16_*):
 * store_f16's rounding bit for bit (nearest even on both); attention_f16 of a decode token and of
 * prompt chunks over the same f16 rows (the f32 kernels to 1e-4 as the f32 cache's test, the
 * tensor-core prefill kernel to 3e-3); qk_norm_rope_at_f16 / attention_at_f16 of n rows in
 * their own slots (and of one row without slots, a recorded step's form): the stored rows are
 * the f32 op's rows rounded, bit for bit, and the outputs match the CPU's attention_f16 over the
 * cache the GPU wrote. */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/cpu_f16.h"
#include "engine/quants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint16_t *to_f16(const float *x, size_t n)
{
    uint16_t *h = malloc(n * sizeof(uint16_t));
    cpu.i->store_f16(cpu.ctx, h, x, n);
    return h;
}

void test_kv_f16_store(void)
{
    bool ok = gpu.i->store_f16 && cpu.i->store_f16;
    size_t n = 100003; /* not a multiple of anything */
    float *x = rand_vec(n, 3000.0f);
    /* edges: ties (1 + 2^-11, 1 + 3 * 2^-11), subnormals, the largest f16, overflow, signed zero */
    static const float edge[] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0x1p-25f, 0x1.8p-24f, 0x1p-24f, 65504.0f,
                                 65519.0f, 65520.0f, 1e30f, -1e30f, -0.0f, 0x1.ffcp-15f, 6.1e-5f};
    memcpy(x, edge, sizeof edge);
    for (size_t i = sizeof edge / sizeof edge[0]; i < 200; i++)
        x[i] *= 1e-6f; /* small values: subnormal f16 */
    size_t diff = 0;
    if (ok) {
        uint16_t *want = to_f16(x, n), *got = malloc(n * sizeof(uint16_t));
        float *xd = dev_put(x, n * sizeof(float));
        uint16_t *hd = dev_put(NULL, n * sizeof(uint16_t));
        gpu.i->store_f16(gpu.ctx, hd, xd, n);
        gpu.i->download(gpu.ctx, got, hd, n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++)
            if (got[i] != want[i] && diff++ < 5)
                printf("  store_f16 %a: gpu 0x%04x cpu 0x%04x\n", x[i], got[i], want[i]);
        ok = diff == 0;
        gpu.i->free(gpu.ctx, xd);
        gpu.i->free(gpu.ctx, hd);
        free(want);
        free(got);
    }
    free(x);
    verdict("kv_f16_store", ok, "%.0f values differ from the CPU's rounding", (double)diff);
}

void test_kv_f16_attention(void)
{
    /* n_head, n_head_kv, head_dim, pos, n: decode tokens, then chunks (the tiled kernels, and
     * decode-kernel loops where the cost model picks them) */
    static const int cfg[][5] = {{4, 2, 16, 0, 1},     {32, 4, 128, 700, 1},  {32, 4, 128, 5000, 1},
                                 {16, 16, 64, 2047, 1}, {8, 1, 256, 999, 1},   {6, 2, 96, 77, 1},
                                 {12, 4, 40, 33, 1},   {32, 4, 128, 0, 512},  {32, 4, 128, 1000, 512},
                                 {32, 4, 128, 37, 64}, {16, 16, 64, 200, 130}, {6, 2, 96, 77, 45},
                                 {8, 1, 256, 10, 40},  {12, 4, 40, 3, 99},    {32, 4, 128, 6000, 20},
                                 {4, 2, 18, 20, 1},    {4, 2, 18, 5, 30}}; /* hd % 4 != 0: element copies */
    bool ok = gpu.i->attention_f16 && cpu.i->attention_f16;
    double worst = 0, worst16 = 0;
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++) {
        int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], pos = cfg[c][3], n = cfg[c][4];
        size_t kvd = (size_t)nkv * hd, nk = (size_t)pos + n, ctx = nk + 40, qd = (size_t)nh * hd;
        float *q = rand_vec(n * qd, 1.0f), *k = rand_vec(nk * kvd, 1.0f), *v = rand_vec(nk * kvd, 1.0f);
        uint16_t *kh = to_f16(k, nk * kvd), *vh = to_f16(v, nk * kvd);
        float *oc = malloc(n * qd * 4), *att = malloc((size_t)nh * ctx * 4);
        cpu.i->attention_f16(cpu.ctx, q, kh, vh, oc, att, n, pos, nh, nkv, hd);
        float *qg = dev_put(q, n * qd * 4);
        uint16_t *kd = dev_put(NULL, ctx * kvd * 2), *vd = dev_put(NULL, ctx * kvd * 2);
        dev_poison(kd, ctx * kvd * 2); /* rows past the last key: NaN f16 (0xffff) */
        dev_poison(vd, ctx * kvd * 2);
        gpu.i->upload(gpu.ctx, kd, kh, nk * kvd * 2);
        gpu.i->upload(gpu.ctx, vd, vh, nk * kvd * 2);
        float *od = dev_put(NULL, n * qd * 4);
        /* a chunk the tensor cores take runs twice: as configured, then on the f32 kernel */
        bool chunk_tc = n > 1 && (hd == 64 || hd == 128);
        for (int pass = 0; pass < (chunk_tc ? 2 : 1); pass++) {
            int old = cuda_set_attn_mma(-1);
            if (pass == 1)
                cuda_set_attn_mma(0);
            bool tc = chunk_tc && pass == 0 && old;
            dev_poison(od, n * qd * 4);
            gpu.i->attention_f16(gpu.ctx, qg, kd, vd, od, NULL, n, pos, nh, nkv, hd);
            cuda_set_attn_mma(old);
            float *og = dev_get(od, n * qd);
            double e = relerr(og, oc, n * qd);
            if (!(e < (tc ? 3e-3 : 1e-4))) {
                ok = false;
                printf("  kv_f16_attention nh %d nkv %d hd %d pos %d n %d%s: %.3g\n", nh, nkv, hd, pos, n,
                       tc ? " (f16 mma)" : "", e);
            }
            if (e > (tc ? worst16 : worst))
                *(tc ? &worst16 : &worst) = e;
            free(og);
        }
        gpu.i->free(gpu.ctx, qg); gpu.i->free(gpu.ctx, kd); gpu.i->free(gpu.ctx, vd); gpu.i->free(gpu.ctx, od);
        free(q); free(k); free(v); free(kh); free(vh); free(oc); free(att);
    }
    printf("  kv_f16_attention: f16 tensor-core prefill max rel err %.3g (limit 3e-3)\n", worst16);
    verdict("kv_f16_attention", ok, "f32 kernels over f16 rows: max rel err vs the CPU %.3g (limit 1e-4)", worst);
}

/* n rows in slots sl[r] (NULL: one row, slot 0, no slot array) at positions ps[r]; nh/nkv heads of hd */
static bool rows_case(int n, const int *sl, const int *ps, int n_slot, int n_ctx, int nh, int nkv, int hd)
{
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd, sf = (size_t)n_ctx * kvd, cf = sf * n_slot;
    float *q = rand_vec(qd * n, 1.0f), *kn = rand_vec(kvd * n, 1.0f), *vn = rand_vec(kvd * n, 1.0f);
    float *c0 = rand_vec(cf, 1.0f), *c1 = rand_vec(cf, 1.0f), *nw = rand_vec(hd, 1.0f);
    uint16_t *kh = to_f16(c0, cf), *vh = to_f16(c1, cf);
    float *kw = malloc(cf * 4), *vw = malloc(cf * 4); /* the same cache widened: the f32 op's */
    cpu_f16_to_f32(kw, kh, cf);
    cpu_f16_to_f32(vw, vh, cf);
    struct tensor nt = make_tensor(GGML_TYPE_F32, hd, 1, nw), nd = to_dev(&nt);
    int32_t *atd = dev_put(ps, sizeof(int32_t) * n), *sld = sl ? dev_put(sl, sizeof(int32_t) * n) : NULL;
    size_t stride = sl ? sf : 0;
    /* f32 cache */
    float *qa = dev_put(q, qd * n * 4), *kna = dev_put(kn, kvd * n * 4), *vna = dev_put(vn, kvd * n * 4);
    float *kca = dev_put(kw, cf * 4), *vca = dev_put(vw, cf * 4), *oa = dev_put(NULL, qd * n * 4);
    gpu.i->qk_norm_rope_at(gpu.ctx, qa, kna, vna, kca, vca, n, atd, sld, stride, &nd, &nd, nh, nkv, hd, 1e6f,
                           ROPE_NEOX, 1e-6f);
    /* f16 cache */
    float *qb = dev_put(q, qd * n * 4), *knb = dev_put(kn, kvd * n * 4), *vnb = dev_put(vn, kvd * n * 4);
    uint16_t *kcb = dev_put(kh, cf * 2), *vcb = dev_put(vh, cf * 2);
    float *ob = dev_put(NULL, qd * n * 4);
    dev_poison(ob, qd * n * 4);
    gpu.i->qk_norm_rope_at_f16(gpu.ctx, qb, knb, vnb, kcb, vcb, n, atd, sld, stride, &nd, &nd, nh, nkv, hd, 1e6f,
                               ROPE_NEOX, 1e-6f);
    gpu.i->attention_at_f16(gpu.ctx, qb, kcb, vcb, ob, n, atd, sld, stride, n_ctx, nh, nkv, hd);
    float *qa_h = dev_get(qa, qd * n), *qb_h = dev_get(qb, qd * n), *k32 = dev_get(kca, cf), *v32 = dev_get(vca, cf);
    uint16_t *k16 = malloc(cf * 2), *v16 = malloc(cf * 2);
    gpu.i->download(gpu.ctx, k16, kcb, cf * 2);
    gpu.i->download(gpu.ctx, v16, vcb, cf * 2);
    uint16_t *k32r = to_f16(k32, cf), *v32r = to_f16(v32, cf);
    bool same = !memcmp(qa_h, qb_h, qd * n * 4) && !memcmp(k16, k32r, cf * 2) && !memcmp(v16, v32r, cf * 2);
    /* the CPU's attention_f16 over the f16 cache the GPU wrote, row by row */
    float *oc = malloc(qd * n * 4), *att = malloc(sizeof(float) * nh * n_ctx), *og = dev_get(ob, qd * n);
    for (int r = 0; r < n; r++) {
        size_t base = sl ? (size_t)sl[r] * sf : 0;
        cpu.i->attention_f16(cpu.ctx, qb_h + r * qd, k16 + base, v16 + base, oc + r * qd, att, 1, ps[r], nh, nkv, hd);
    }
    double e = relerr(og, oc, qd * n);
    bool ok = same && e < 1e-4;
    printf("  kv_f16_rows: %d rows%s, n_ctx %d, hd %d: stored rows %s the f32 op's rounded, out rel err %.3g vs the "
           "CPU\n", n, sl ? "" : " (no slots)", n_ctx, hd, same ? "=" : "DIFFER from", e);
    void *dv[] = {atd, sld, qa, kna, vna, kca, vca, oa, qb, knb, vnb, kcb, vcb, ob, (void *)nd.data};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        if (dv[i])
            gpu.i->free(gpu.ctx, dv[i]);
    free(q); free(kn); free(vn); free(c0); free(c1); free(nw); free(kh); free(vh); free(kw); free(vw);
    free((void *)nt.data); free(qa_h); free(qb_h); free(k32); free(v32); free(k16); free(v16); free(k32r);
    free(v32r); free(oc); free(att); free(og);
    return ok;
}

void test_kv_f16_rows(void)
{
    bool ok = gpu.i->qk_norm_rope_at_f16 && gpu.i->attention_at_f16 && gpu.i->qk_norm_rope_at;
    int cases = 0;
    if (ok) {
        int sl[] = {3, 0, 5, 1, 6, 2, 4}, ps[] = {0, 31, 32, 599, 300, 1, 100};
        ok = rows_case(7, sl, ps, 7, 600, 32, 4, 128) && ok;
        int sl2[] = {1, 0}, ps2[] = {4000, 17};
        ok = rows_case(2, sl2, ps2, 2, 4096, 16, 2, 64) && ok;
        int ps3[] = {257};
        ok = rows_case(1, NULL, ps3, 1, 300, 8, 2, 96) && ok; /* a recorded step's form */
        cases = 3;
    }
    verdict("kv_f16_rows", ok, "qk_norm_rope_at_f16 + attention_at_f16 = f32 rows rounded, CPU attention (%.0f cases)",
            cases);
}
