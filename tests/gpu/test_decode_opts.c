/* test_decode_opts.c - the decode kernels of issue 21, each behind its switch (cuda_set_decode_opt,
 * backend_cuda.h), against the CPU backend and against the same op with the switch off:
 *   decode_attn_split: the short-context split attention (attention_decode.cu), f32 and f16
 *     caches, the plain op and attention_at (one row: bit for bit the plain op with the switch
 *     on; B rows in their own slots: each row against the CPU);
 *   decode_qonce: the weight-streaming products (matmul_decode.cu), x quantised once (=1) or in
 *     each CTA after its weight loads (=2): matmul3 with and without its norm, matmul, matmul_add
 *     at decode sizes, n = 1 .. 8, bit for bit the switch-off op (normed x included) and within
 *     q8_0's limit of the CPU;
 *   decode_route_once: the one-token MoE routed once (moe.cu): routing words and y bit for bit
 *     the fused form;
 *   e2e_decode_opts: the qwen3moe q8_0 model end to end (gpu_e2e_full: recorded steps, experts
 *     from the device table) with all three on.
 * bench_decode_opts (--bench): the attention alone at 100-32768 keys with the split off and on,
 * bench_decode_ops with each switch off, then on one at a time and all on, then the replayed
 * step (bench_decode_graph) all off and all on: one command,
 * `test-gpu --bench --only bench_decode_opts` (by that exact name only: `--only bench` in
 * scripts/test-gpu.sh would otherwise run seven more decode benchmarks). */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpu_e2e_full(struct backend cpu, struct backend gpu, const char *name, const char *preset, int type,
                 double lim);

/* Sets the three switches (-1: leaves one as it is); returns the old ones packed for
 * restore_opts: bit 0 the attention split, bits 1-2 TIDE_DECODE_QONCE (0..2), bit 3 route once. */
static int set_opts(int attn, int qonce, int route)
{
    return cuda_set_decode_opt(CUDA_DECODE_ATTN_SPLIT, attn) | cuda_set_decode_opt(CUDA_DECODE_QONCE, qonce) << 1 |
           cuda_set_decode_opt(CUDA_MOE_ROUTE_ONCE, route) << 3;
}

static void restore_opts(int old)
{
    set_opts(old & 1, old >> 1 & 3, old >> 3 & 1);
}

static uint16_t *to_f16(const float *x, size_t n)
{
    uint16_t *h = malloc(n * sizeof(uint16_t));
    cpu.i->store_f16(cpu.ctx, h, x, n);
    return h;
}

/* ---- attention ---- */

/* One query at pos over f32 or f16 caches: the switch on against the CPU (1e-4, test_attention's
 * limit) and against the switch off (the same maths in other chunks; each within 1e-4 of the
 * CPU, so 2e-4 apart at most); attention_at of one row bit for bit the plain op with the switch
 * on (the same cut), for n_ctx over and well over pos. */
static bool attn_case(int nh, int nkv, int hd, int pos, bool f16, double *worst)
{
    size_t kvd = (size_t)nkv * hd, nk = (size_t)pos + 1, qd = (size_t)nh * hd;
    int n_ctx = pos + 1 + 3 * (pos % 7) + 40;
    size_t cb = (size_t)n_ctx * kvd * (f16 ? 2 : 4);
    float *q = rand_vec(qd, 1.0f), *k = rand_vec(nk * kvd, 1.0f), *v = rand_vec(nk * kvd, 1.0f);
    uint16_t *kh = f16 ? to_f16(k, nk * kvd) : NULL, *vh = f16 ? to_f16(v, nk * kvd) : NULL;
    float *oc = malloc(qd * 4), *att = malloc((size_t)nh * n_ctx * 4);
    if (f16)
        cpu.i->attention_f16(cpu.ctx, q, kh, vh, oc, att, 1, pos, nh, nkv, hd);
    else
        cpu.i->attention(cpu.ctx, q, k, v, oc, att, 1, pos, nh, nkv, hd);
    float *qg = dev_put(q, qd * 4);
    void *kd = dev_put(NULL, cb), *vd = dev_put(NULL, cb);
    dev_poison(kd, cb); /* rows past the last key are NaN: a kernel that reads them fails */
    dev_poison(vd, cb);
    gpu.i->upload(gpu.ctx, kd, f16 ? (void *)kh : (void *)k, nk * kvd * (f16 ? 2 : 4));
    gpu.i->upload(gpu.ctx, vd, f16 ? (void *)vh : (void *)v, nk * kvd * (f16 ? 2 : 4));
    float *o[3];
    for (int pass = 0; pass < 3; pass++) { /* 0: switch off, 1: on, 2: on, attention_at */
        int old = set_opts(pass > 0, -1, -1);
        float *od = dev_put(NULL, qd * 4);
        dev_poison(od, qd * 4);
        if (pass < 2) {
            if (f16)
                gpu.i->attention_f16(gpu.ctx, qg, kd, vd, od, NULL, 1, pos, nh, nkv, hd);
            else
                gpu.i->attention(gpu.ctx, qg, kd, vd, od, NULL, 1, pos, nh, nkv, hd);
        } else {
            int32_t at = pos, *atd = dev_put(&at, sizeof at);
            if (f16)
                gpu.i->attention_at_f16(gpu.ctx, qg, kd, vd, od, 1, atd, NULL, 0, n_ctx, nh, nkv, hd);
            else
                gpu.i->attention_at(gpu.ctx, qg, kd, vd, od, 1, atd, NULL, 0, n_ctx, nh, nkv, hd);
            o[pass] = dev_get(od, qd);
            gpu.i->free(gpu.ctx, atd);
        }
        if (pass < 2)
            o[pass] = dev_get(od, qd);
        restore_opts(old);
        gpu.i->free(gpu.ctx, od);
    }
    double e_cpu = relerr(o[1], oc, qd), e_off = relerr(o[1], o[0], qd);
    bool at_same = !memcmp(o[1], o[2], qd * 4);
    bool ok = e_cpu < 1e-4 && e_off < 2e-4 && at_same;
    if (e_cpu > *worst)
        *worst = e_cpu;
    if (!ok)
        printf("  attn_split %s nh %d nkv %d hd %d pos %d: vs cpu %.3g, vs off %.3g, attention_at %s\n",
               f16 ? "f16" : "f32", nh, nkv, hd, pos, e_cpu, e_off, at_same ? "==" : "!=");
    gpu.i->free(gpu.ctx, qg); gpu.i->free(gpu.ctx, kd); gpu.i->free(gpu.ctx, vd);
    for (int i = 0; i < 3; i++)
        free(o[i]);
    free(q); free(k); free(v); free(kh); free(vh); free(oc); free(att);
    return ok;
}

/* attention_at of B rows, each in its own slot at its own position (the batched decode step),
 * the switch on: every row against the CPU's attention over that slot. */
static bool attn_rows_case(int nh, int nkv, int hd, int n_ctx, bool f16, double *worst)
{
    enum { B = 5 };
    static const int sl[B] = {3, 0, 4, 1, 2}, ps[B] = {0, 15, 513, 100, 1999};
    size_t kvd = (size_t)nkv * hd, qd = (size_t)nh * hd, sf = (size_t)n_ctx * kvd, es = f16 ? 2 : 4;
    float *q = rand_vec(B * qd, 1.0f), *k = rand_vec(B * sf, 1.0f), *v = rand_vec(B * sf, 1.0f);
    uint16_t *kh = f16 ? to_f16(k, B * sf) : NULL, *vh = f16 ? to_f16(v, B * sf) : NULL;
    float *oc = malloc(B * qd * 4), *att = malloc((size_t)nh * n_ctx * 4);
    int32_t at[B], slot[B];
    for (int r = 0; r < B; r++) {
        at[r] = ps[r] < n_ctx ? ps[r] : n_ctx - 1;
        slot[r] = sl[r];
        size_t off = (size_t)slot[r] * sf;
        if (f16)
            cpu.i->attention_f16(cpu.ctx, q + r * qd, kh + off, vh + off, oc + r * qd, att, 1, at[r], nh, nkv, hd);
        else
            cpu.i->attention(cpu.ctx, q + r * qd, k + off, v + off, oc + r * qd, att, 1, at[r], nh, nkv, hd);
    }
    float *qg = dev_put(q, B * qd * 4), *od = dev_put(NULL, B * qd * 4);
    void *kd = dev_put(f16 ? (void *)kh : (void *)k, B * sf * es), *vd = dev_put(f16 ? (void *)vh : (void *)v, B * sf * es);
    int32_t *atd = dev_put(at, sizeof at), *sld = dev_put(slot, sizeof slot);
    dev_poison(od, B * qd * 4);
    int old = set_opts(1, -1, -1);
    if (f16)
        gpu.i->attention_at_f16(gpu.ctx, qg, kd, vd, od, B, atd, sld, sf, n_ctx, nh, nkv, hd);
    else
        gpu.i->attention_at(gpu.ctx, qg, kd, vd, od, B, atd, sld, sf, n_ctx, nh, nkv, hd);
    restore_opts(old);
    float *og = dev_get(od, B * qd);
    bool ok = true;
    for (int r = 0; r < B; r++) {
        double e = relerr(og + r * qd, oc + r * qd, qd);
        if (e > *worst)
            *worst = e;
        if (!(e < 1e-4)) {
            printf("  attn_split rows %s nh %d nkv %d hd %d n_ctx %d row %d (slot %d, pos %d): vs cpu %.3g\n",
                   f16 ? "f16" : "f32", nh, nkv, hd, n_ctx, r, slot[r], at[r], e);
            ok = false;
        }
    }
    void *dv[] = {qg, od, kd, vd, atd, sld};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(q); free(k); free(v); free(kh); free(vh); free(oc); free(att); free(og);
    return ok;
}

static void test_decode_attn_split(void)
{
    /* n_head, n_head_kv, head_dim: Qwen3-30B's, one kv head a query head, a big group (16 CTAs
     * of heads), head_dim 96 / 40 / 16, and 256 (not taken: the old kernels, same checks) */
    static const int shp[][3] = {{32, 4, 128}, {16, 16, 64}, {128, 1, 32}, {6, 2, 96},
                                 {12, 4, 40},  {4, 2, 16},   {8, 1, 256}};
    static const int pos[] = {0, 1, 15, 16, 17, 100, 512, 513, 2000, 5000, 33000};
    bool ok = gpu.i->attention_at && gpu.i->attention_at_f16 && cpu.i->attention_f16;
    double worst = 0;
    int n = 0;
    for (size_t s = 0; ok && s < sizeof shp / sizeof shp[0]; s++)
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++)
            for (int f16 = 0; f16 < 2; f16++, n++) {
                if (pos[p] > 5000 && shp[s][0] != 32) /* the long context on the served shape only */
                    continue;
                ok = attn_case(shp[s][0], shp[s][1], shp[s][2], pos[p], f16, &worst) && ok;
            }
    for (int f16 = 0; f16 < 2; f16++) {
        ok = attn_rows_case(32, 4, 128, 2048, f16, &worst) && ok;
        ok = attn_rows_case(6, 2, 96, 600, f16, &worst) && ok;
    }
    char err[300] = "";
    if (backend_cuda_error(&gpu, err, sizeof err)) {
        ok = false;
        printf("  CUDA: %s\n", err);
    }
    verdict("decode_attn_split", ok, "switch on vs cpu max rel err %.3g; vs off < 2e-4; attention_at == attention",
            worst);
}

/* ---- quantise once ---- */

/* The same op with the switch off, at 1 (quantise once) and at 2 (in-CTA, loads first); true
 * when every output is bit for bit the same. The outputs of the last run (2) stay in dev. */
static bool qonce_same(const char *what, float *const *dev, const size_t *len, int nout,
                       void (*run)(void *arg), void *arg)
{
    float *got[3][4];
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < nout; i++)
            dev_poison(dev[i], len[i] * 4);
        int old = set_opts(-1, pass, -1);
        run(arg);
        restore_opts(old);
        for (int i = 0; i < nout; i++)
            got[pass][i] = dev_get(dev[i], len[i]);
    }
    bool same = true;
    for (int pass = 1; pass < 3; pass++) {
        bool s = true;
        for (int i = 0; i < nout; i++)
            s = s && !memcmp(got[0][i], got[pass][i], len[i] * 4);
        if (!s)
            printf("  decode_qonce %s: TIDE_DECODE_QONCE=%d changes the bits\n", what, pass);
        same = same && s;
    }
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < nout; i++)
            free(got[pass][i]);
    return same;
}

struct mm3_run {
    const struct tensor *const *w;
    const float *x;
    float *const *y;
    int n;
    const struct tensor *norm;
    float *xn;
    float *y0; /* matmul_add: the residual restored before each run */
    size_t ly;
    int kind;  /* 0 matmul3, 1 matmul, 2 matmul_add */
};

static void mm3_go(void *arg)
{
    struct mm3_run *r = arg;
    if (r->kind == 0)
        gpu.i->matmul3(gpu.ctx, r->w, r->x, r->y, r->n, r->norm, 1e-6f, r->xn);
    else if (r->kind == 1)
        gpu.i->matmul(gpu.ctx, r->w[0], r->x, r->y[0], r->n);
    else {
        gpu.i->upload(gpu.ctx, r->y[0], r->y0, r->ly * 4);
        gpu.i->matmul_add(gpu.ctx, r->w[0], r->x, r->y[0], r->n);
    }
}

/* The weights of the last case (host tensors and their device copies), kept for the next case
 * of the same type and shape: the cases walk n and the norm over each shape, and making the
 * weights for each (up to 25 M random values quantised on the host) ran the test past 60 s on
 * an H100. qonce_w_drop frees them at the end. */
static struct {
    uint32_t T;
    int cols, rows[3], n_mats;
    struct tensor th[3], td[3];
} qw;

static void qonce_w_drop(void)
{
    for (int m = 0; m < qw.n_mats; m++) {
        gpu.i->free(gpu.ctx, (void *)qw.td[m].data);
        free((void *)qw.th[m].data);
    }
    memset(&qw, 0, sizeof qw);
}

static void qonce_w_get(uint32_t T, int cols, const int *rows, int n_mats)
{
    if (qw.n_mats == n_mats && qw.T == T && qw.cols == cols && !memcmp(qw.rows, rows, sizeof(int) * n_mats))
        return;
    qonce_w_drop();
    qw.T = T, qw.cols = cols, qw.n_mats = n_mats;
    for (int m = 0; m < n_mats; m++) {
        float *wf = rand_vec((size_t)rows[m] * cols, 1.0f / sqrtf((float)cols));
        qw.rows[m] = rows[m];
        qw.th[m] = make_tensor(T, cols, rows[m], wf);
        qw.td[m] = to_dev(&qw.th[m]);
        free(wf);
    }
}

/* matmul3 of (cols -> r0, r1, r2) at n tokens, normed or not: off == on, and the CPU's. */
/* norm: 0 none, 1 f32 weights, 2 f16 weights (TIDE_DECODE_QONCE=2 then falls back to mode 1) */
static bool qonce_mm3(uint32_t T, int cols, const int rows[3], int n, int norm, double *worst)
{
    size_t lx = (size_t)n * cols;
    float *x = rand_vec(lx, 1.0f), *nv = rand_vec(cols, 1.0f);
    struct tensor nh = {.type = GGML_TYPE_F32, .ne = {(uint64_t)cols, 1}, .data = nv, .row_bytes = (size_t)cols * 4};
    if (norm == 2)
        nh = make_tensor(GGML_TYPE_F16, cols, 1, nv);
    struct tensor nd = to_dev(&nh), *th = qw.th, *td = qw.td;
    float *xd = dev_put(x, lx * 4), *xn = dev_put(NULL, lx * 4), *xn_c = malloc(lx * 4), *yd[4], *yc[3];
    size_t len[4];
    qonce_w_get(T, cols, rows, 3);
    for (int m = 0; m < 3; m++) {
        len[m] = (size_t)n * rows[m];
        yd[m] = dev_put(NULL, len[m] * 4);
        yc[m] = malloc(len[m] * 4);
    }
    yd[3] = xn;
    len[3] = lx;
    const struct tensor *const wd[3] = {&td[0], &td[1], &td[2]}, *const wh[3] = {&th[0], &th[1], &th[2]};
    float *const y3[3] = {yd[0], yd[1], yd[2]}, *const yh3[3] = {yc[0], yc[1], yc[2]};
    struct mm3_run r = {wd, xd, y3, n, norm ? &nd : NULL, xn, NULL, 0, 0};
    char what[96];
    snprintf(what, sizeof what, "matmul3 %s cols %d rows %d/%d/%d n %d norm %s", ggml_type_name(T), cols, rows[0],
             rows[1], rows[2], n, norm == 2 ? "f16" : norm ? "f32" : "none");
    bool ok = qonce_same(what, yd, len, norm ? 4 : 3, mm3_go, &r);
    cpu.i->matmul3(cpu.ctx, wh, x, yh3, n, norm ? &nh : NULL, 1e-6f, xn_c);
    for (int m = 0; m < 3; m++) { /* the last switch-on outputs are still in yd */
        float *g = dev_get(yd[m], len[m]);
        double e = relerr(g, yc[m], len[m]);
        if (e > *worst)
            *worst = e;
        if (!(e < 1e-2)) {
            printf("  decode_qonce %s [%d]: vs cpu %.3g\n", what, m, e);
            ok = false;
        }
        free(g);
        gpu.i->free(gpu.ctx, yd[m]);
        free(yc[m]);
    }
    gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, xn); gpu.i->free(gpu.ctx, (void *)nd.data);
    if (norm == 2)
        free((void *)nh.data);
    free(x); free(nv); free(xn_c);
    return ok;
}

/* matmul (add 0) or matmul_add (add 1) of (cols -> rows) at n tokens: off == on, and the CPU's. */
static bool qonce_mm(uint32_t T, int cols, int rows, int n, int add, double *worst)
{
    size_t lx = (size_t)n * cols, ly = (size_t)n * rows;
    float *x = rand_vec(lx, 1.0f), *y0 = rand_vec(ly, 1.0f), *yc = malloc(ly * 4);
    qonce_w_get(T, cols, &rows, 1);
    struct tensor th = qw.th[0], td = qw.td[0];
    float *xd = dev_put(x, lx * 4), *yd = dev_put(NULL, ly * 4);
    const struct tensor *w1[1] = {&td};
    float *const y1[1] = {yd};
    struct mm3_run r = {w1, xd, y1, n, NULL, NULL, y0, ly, 1 + add};
    char what[96];
    snprintf(what, sizeof what, "%s %s cols %d rows %d n %d", add ? "matmul_add" : "matmul", ggml_type_name(T), cols,
             rows, n);
    bool ok = qonce_same(what, &yd, &ly, 1, mm3_go, &r);
    memcpy(yc, y0, ly * 4);
    if (add)
        cpu.i->matmul_add(cpu.ctx, &th, x, yc, n);
    else
        cpu.i->matmul(cpu.ctx, &th, x, yc, n);
    float *g = dev_get(yd, ly);
    if (add) /* the product's error, not hidden by the residual */
        for (size_t i = 0; i < ly; i++) {
            g[i] -= y0[i];
            yc[i] -= y0[i];
        }
    double e = relerr(g, yc, ly);
    if (e > *worst)
        *worst = e;
    if (!(e < 1e-2)) {
        printf("  decode_qonce %s: vs cpu %.3g\n", what, e);
        ok = false;
    }
    gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, yd);
    free(x); free(y0); free(yc); free(g);
    return ok;
}

static void test_decode_qonce(void)
{
    static const uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    /* cols, rows of wq / wk / wv: Qwen3-30B's, a 4096-wide one, small and odd ones (160: an odd
     * block count, the old kernels; 128: norm_block 128, not fused with the norm) */
    static const int mm3[][4] = {{2048, 4096, 512, 512}, {4096, 4096, 1024, 1024}, {256, 100, 37, 37},
                                 {160, 33, 8, 8},        {128, 64, 64, 64}};
    static const int ns[] = {1, 2, 3, 5, 8};
    /* cols, rows: wo, the router-sized and the output-head-sized products, an expert's down */
    static const int mm[][2] = {{4096, 2048}, {2048, 128}, {2048, 20000}, {768, 2048}, {96, 64}};
    bool ok = gpu.i->matmul3 && gpu.i->matmul_add;
    double worst = 0;
    for (size_t t = 0; ok && t < sizeof types / sizeof types[0]; t++) {
        for (size_t s = 0; s < sizeof mm3 / sizeof mm3[0]; s++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
                for (int norm = 0; norm < 3; norm++) /* 2: an f16 norm (decode-qonce-emu found mode 2's
                                                        fallback leaving rows unwritten) */
                    ok = qonce_mm3(types[t], mm3[s][0], &mm3[s][1], ns[i], norm, &worst) && ok;
        for (size_t s = 0; s < sizeof mm / sizeof mm[0]; s++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
                for (int add = 0; add < 2; add++)
                    ok = qonce_mm(types[t], mm[s][0], mm[s][1], ns[i], add, &worst) && ok;
    }
    qonce_w_drop();
    char err[300] = "";
    if (backend_cuda_error(&gpu, err, sizeof err)) {
        ok = false;
        printf("  CUDA: %s\n", err);
    }
    verdict("decode_qonce", ok, "matmul3 / matmul / matmul_add bit for bit the switch off; max rel err vs cpu %.3g",
            worst);
}

/* ---- route once ---- */

/* moe_ffn_table_route of one token with the switch off (routing inside every CTA) and on (one
 * route kernel): the routing words and y bit for bit, = and +=. */
static bool route_case(uint32_t T, int E, int F, int k, int NE)
{
    struct experts ex;
    experts_make(&ex, T, T, E, F, NE);
    if (!ex.mem)
        return false;
    float *lg = rand_vec(NE, 2.0f), *x = rand_vec(E, 1.0f), *y0 = rand_vec(E, 1.0f);
    lg[NE - 1] = lg[NE / 2] = 9.0f; /* a tie: the lower index wins on both paths */
    float *ld = dev_put(lg, NE * 4), *xd = dev_put(x, E * 4), *yd = dev_put(NULL, E * 4);
    int32_t *rd = dev_put(NULL, sizeof(int32_t) * 2 * k);
    bool ok = true;
    for (int add = 0; add < 2; add++) {
        float *y[2];
        int32_t *rt[2];
        int rc[2];
        for (int pass = 0; pass < 2; pass++) {
            gpu.i->upload(gpu.ctx, yd, y0, E * 4);
            dev_poison(rd, sizeof(int32_t) * 2 * k);
            int old = set_opts(-1, -1, pass);
            rc[pass] = gpu.i->moe_ffn_table_route(gpu.ctx, &ex.shape, ex.tab_d, ld, 1, NE, true, rd, k, xd, yd, add);
            restore_opts(old);
            y[pass] = dev_get(yd, E);
            rt[pass] = (int32_t *)dev_get(rd, 2 * (size_t)k);
        }
        bool same = rc[0] == 0 && rc[1] == 0 && !memcmp(y[0], y[1], E * 4) && !memcmp(rt[0], rt[1], 8 * (size_t)k) &&
                    isfinite(y[1][0]);
        if (!same)
            printf("  decode_route_once %s E %d F %d k %d of %d add %d: rc %d/%d, %s\n", ggml_type_name(T), E, F, k,
                   NE, add, rc[0], rc[1], "routing or outputs differ from the fused form");
        ok = ok && same;
        for (int pass = 0; pass < 2; pass++) {
            free(y[pass]);
            free(rt[pass]);
        }
    }
    void *dv[] = {ex.mem, ex.tab_d, ld, xd, yd, rd};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        gpu.i->free(gpu.ctx, dv[i]);
    free(lg); free(x); free(y0);
    return ok;
}

static void test_decode_route_once(void)
{
    /* Qwen3-30B's experts (the gate/up loads issued before x's quantisation), q4_0, an odd block
     * count (no pairs: the plain gate/up kernel), k 16, E 4096 (two pairs a lane: plain kernel) */
    static const int cfg[][5] = {{GGML_TYPE_Q8_0, 2048, 768, 8, 128}, {GGML_TYPE_Q4_0, 256, 96, 4, 16},
                                 {GGML_TYPE_Q8_0, 96, 64, 3, 7},       {GGML_TYPE_Q8_0, 128, 64, 16, 40},
                                 {GGML_TYPE_Q8_0, 4096, 256, 4, 32},   {GGML_TYPE_Q4_0, 2048, 768, 8, 128}};
    bool ok = gpu.i->moe_ffn_table_route != NULL;
    for (size_t c = 0; ok && c < sizeof cfg / sizeof cfg[0]; c++)
        ok = route_case((uint32_t)cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4]) && ok;
    char err[300] = "";
    if (backend_cuda_error(&gpu, err, sizeof err)) {
        ok = false;
        printf("  CUDA: %s\n", err);
    }
    verdict("decode_route_once", ok, "%.0f cases: routing words and y bit for bit the fused form, = and +=",
            (double)(sizeof cfg / sizeof cfg[0]));
}

static bool want_name(const char *only, const char *name)
{
    return !only || strstr(name, only);
}

void test_decode_opts(const char *only)
{
    if (want_name(only, "decode_attn_split"))
        test_decode_attn_split();
    if (want_name(only, "decode_qonce"))
        test_decode_qonce();
    if (want_name(only, "decode_route_once"))
        test_decode_route_once();
    if (want_name(only, "e2e_decode_opts")) {
        /* qwen3moe q8_0 with every expert cached: recorded steps through attention_at, matmul3,
         * matmul_add and moe_ffn_table_route, all three switches on (only the attention's
         * bits move; the limit is e2e_full_qwen3moe_q8_0's) */
        for (int q = 1; q <= 2; q++) { /* both forms of TIDE_DECODE_QONCE */
            int old = set_opts(1, q, 1);
            printf("  e2e_decode_opts: TIDE_DECODE_ATTN_SPLIT=1 TIDE_DECODE_QONCE=%d TIDE_MOE_ROUTE_ONCE=1\n", q);
            fflush(stdout);
            if (!gpu_e2e_full(cpu, gpu, "e2e_decode_opts", "qwen3moe", GGML_TYPE_Q8_0, 3e-2))
                n_fail++;
            fflush(stdout);
            restore_opts(old);
        }
    }
}

#ifdef TIDE_CUDA
/* The decode attention alone (Qwen3-30B's 32 / 4 heads of 128) from 100 to 32768 keys, f32 and
 * f16 caches, TIDE_DECODE_ATTN_SPLIT off and on: where the split kernels pay and where they stop
 * paying (200 back-to-back calls, as bench_attention times them). */
static void bench_attn_keys(void)
{
    static const int keys[] = {100, 513, 1000, 2000, 4096, 16384, 32768};
    const int nh = 32, nkv = 4, hd = 128;
    printf("bench_decode_opts: attention of one token, 32/4 heads of 128: us a call, split off / on\n");
    for (size_t c = 0; c < sizeof keys / sizeof keys[0]; c++) {
        int pos = keys[c] - 1;
        size_t kvb = (size_t)keys[c] * nkv * hd * 4;
        float *q = dev_put(NULL, (size_t)nh * hd * 4), *o = dev_put(NULL, (size_t)nh * hd * 4);
        float *k = dev_put(NULL, kvb), *v = dev_put(NULL, kvb);
        gpu.i->zero(gpu.ctx, q, nh * hd);
        gpu.i->zero(gpu.ctx, k, (int)(kvb / 4));
        gpu.i->zero(gpu.ctx, v, (int)(kvb / 4));
        for (int f16 = 0; f16 < 2; f16++) {
            double us[2];
            for (int on = 0; on < 2; on++) {
                int old = set_opts(on, -1, -1);
                for (int i = 0; i < 203; i++) {
                    if (i == 3) {
                        gpu.i->sync(gpu.ctx);
                        us[on] = now_s();
                    }
                    if (f16)
                        gpu.i->attention_f16(gpu.ctx, q, (uint16_t *)k, (uint16_t *)v, o, NULL, 1, pos, nh, nkv, hd);
                    else
                        gpu.i->attention(gpu.ctx, q, k, v, o, NULL, 1, pos, nh, nkv, hd);
                }
                gpu.i->sync(gpu.ctx);
                us[on] = (now_s() - us[on]) / 200 * 1e6;
                restore_opts(old);
            }
            printf("  %6d keys %s: %8.2f / %8.2f us\n", keys[c], f16 ? "f16" : "f32", us[0], us[1]);
        }
        gpu.i->free(gpu.ctx, q); gpu.i->free(gpu.ctx, o); gpu.i->free(gpu.ctx, k); gpu.i->free(gpu.ctx, v);
    }
}

void bench_decode_opts(double d2d)
{
    bench_attn_keys();
    static const struct { const char *name; int attn, qonce, route; } cfg[] = {
        {"all switches off", 0, 0, 0},
        {"TIDE_DECODE_ATTN_SPLIT=1", 1, 0, 0},
        {"TIDE_DECODE_QONCE=1", 0, 1, 0},
        {"TIDE_DECODE_QONCE=2", 0, 2, 0},
        {"TIDE_MOE_ROUTE_ONCE=1", 0, 0, 1},
        {"all switches on (QONCE=1)", 1, 1, 1},
        {"all switches on (QONCE=2)", 1, 2, 1},
    };
    int old = set_opts(-1, -1, -1);
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        printf("bench_decode_opts: each op alone, %s\n", cfg[i].name);
        set_opts(cfg[i].attn, cfg[i].qonce, cfg[i].route);
        bench_decode(d2d, 4);
    }
    for (int on = 0; on < 3; on++) {
        printf("bench_decode_opts: the replayed step, %s\n",
               on == 2 ? "all switches on (QONCE=2)" : on ? "all switches on (QONCE=1)" : "all switches off");
        set_opts(on > 0, on, on > 0);
        bench_decode(d2d, 5);
    }
    restore_opts(old);
}
#endif
