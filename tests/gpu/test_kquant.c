/* test_kquant.c - k-quant weights (q4_K, q5_K, q6_K) on the GPU against the CPU backend:
 * matmul at decode and prefill sizes (n = 1, 2, 7, 64, 512; with the residual add; rows only
 * 2-byte aligned, which take the element-wise kernel), get_rows (embeddings), the fused MoE
 * op and its table form with Q4_K_M's mix (q4_K gate/up, q6_K down); and with --bench the
 * products' timings (bench_kquant).
 *
 * The CUDA kernels see x in int8 blocks (n <= 8) or f16 (prefill sizes), and the CPU backend
 * quantises x its own way (cpu_quant.c's q8_K blocks of 256): against f32 x either is 0.5-1.3e-2
 * (measured on the H200), too close to a 1e-2 limit to tell a bug from it. So each product is
 * checked against kq_ref_product: the weights as the CPU backend's get_row decodes them, dotted in
 * double with x as the kernel sees it (kq_view_of_x): ||gpu - ref|| / ||ref|| < 1e-3 (the f16
 * GEMM rounds W to f16 too), and its distance from the CPU's own product is reported. */
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* x (n, cols) as kquant.cu's products see it: quantize_q8_kernel's int8 blocks of 32 (scale
 * amax / 127 rounded to f16, values rounded to nearest even) for n <= 8, f16 beyond; int8
 * forces the blocks (the k-quant tensor-core path, mmq_kquant.cu, quantises x at any n). */
void kq_view_as(const float *x, float *out, int n, int cols, bool int8)
{
    size_t len = (size_t)n * cols;
    for (size_t b = 0; b < len / 32; b++) {
        const float *v = x + b * 32;
        float *o = out + b * 32;
        if (!int8) {
            for (int l = 0; l < 32; l++)
                o[l] = tide_f16_to_f32(tide_f32_to_f16(v[l]));
            continue;
        }
        float amax = 0.0f;
        for (int l = 0; l < 32; l++)
            amax = fmaxf(amax, fabsf(v[l]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f, ds = tide_f16_to_f32(tide_f32_to_f16(d));
        for (int l = 0; l < 32; l++)
            o[l] = (float)(int)rintf(v[l] * id) * ds;
    }
}

void kq_view_of_x(const float *x, float *out, int n, int cols)
{
    kq_view_as(x, out, n, cols, n <= 8);
}

/* y (n, rows) (+)= W xv for a host tensor: for a k-quant W, the rows as be's get_row decodes them
 * dotted in double with xv (the products' reference, whatever be does to x); else be's matmul. */
void kq_ref_product(struct backend be, const struct tensor *w, const float *xv, float *y, int n, bool add)
{
    uint32_t t = w->type; /* the types whose CUDA products quantise x (kquant.cu, qblock.cu) */
    bool kq = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K || t == GGML_TYPE_Q5_0 ||
              t == GGML_TYPE_Q5_1 || t == GGML_TYPE_IQ4_XS || t == GGML_TYPE_MXFP4;
    if (!kq) {
        if (add)
            be.i->matmul_add(be.ctx, w, xv, y, n);
        else
            be.i->matmul(be.ctx, w, xv, y, n);
        return;
    }
    int cols = (int)w->ne[0], rows = (int)(w->ne[1] ? w->ne[1] : 1);
    float *row = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) {
        be.i->get_row(be.ctx, w, r, row);
        for (int t = 0; t < n; t++) {
            const float *xt = xv + (size_t)t * cols;
            double s = 0.0;
            for (int c = 0; c < cols; c++)
                s += (double)row[c] * xt[c];
            float *yo = y + (size_t)t * rows + r;
            *yo = add ? *yo + (float)s : (float)s;
        }
    }
    free(row);
}

/* The fused op's arithmetic: x and each expert's h = silu(gate x) * (up x) seen as int8 blocks
 * (kq_view_of_x, n = 1), as moe_gate_up_kernel quantises them; y = sum w_j down_j h_j, the
 * products by kq_ref_product. */
void kq_moe_ref(struct backend be, const struct expert_weights *eh, const float *w, int k, const float *x, float *y)
{
    int E = (int)eh[0].gate.ne[0], F = (int)eh[0].gate.ne[1];
    float *xv = malloc(sizeof(float) * E), *g = malloc(sizeof(float) * F), *u = malloc(sizeof(float) * F);
    float *hv = malloc(sizeof(float) * F), *d = malloc(sizeof(float) * E);
    kq_view_of_x(x, xv, 1, E);
    memset(y, 0, sizeof(float) * E);
    for (int j = 0; j < k; j++) {
        kq_ref_product(be, &eh[j].gate, xv, g, 1, false);
        kq_ref_product(be, &eh[j].up, xv, u, 1, false);
        for (int i = 0; i < F; i++)
            g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        kq_view_of_x(g, hv, 1, F);
        kq_ref_product(be, &eh[j].down, hv, d, 1, false);
        for (int i = 0; i < E; i++)
            y[i] += w[j] * d[i];
    }
    free(xv); free(g); free(u); free(hv); free(d);
}

#ifdef TIDE_CUDA

static const uint32_t kq_types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};

/* y = W x (or y0 + W x) on the GPU from a device copy of th at byte offset off (misaligned
 * rows, when off is odd, or 2 mod 4 for 4-byte loads, go to the element-wise kernel, which reads
 * x in f32), against kq_ref_product on x as the kernel sees it; the rel err, and in *e_f32 the one
 * against the CPU's product of f32 x. */
double kq_product(const struct tensor *th, const float *x, int n, bool add, size_t off, double *e_f32)
{
    int cols = (int)th->ne[0], rows = (int)th->ne[1];
    size_t wb = th->row_bytes * rows, ylen = (size_t)n * rows;
    uint8_t *wd = dev_put(NULL, wb + 16);
    gpu.i->upload(gpu.ctx, wd + off, th->data, wb);
    struct tensor td = *th;
    td.data = wd + off;
    float *yc = rand_vec(ylen, 1.0f), *y0 = malloc(ylen * sizeof(float)), *yf = malloc(ylen * sizeof(float));
    memcpy(y0, yc, ylen * sizeof(float));
    uint32_t T = th->type; /* the row alignment the word-loading kernels need */
    size_t align = T == GGML_TYPE_Q6_K || T == GGML_TYPE_Q5_0 ? 2 : T == GGML_TYPE_MXFP4 ? 1 : 4;
    bool fast = off % align == 0;
    /* the k-quant tensor-core tiles (when on) take q4_K / q5_K rows 8-byte aligned, q6_K 2 */
    bool tiles = cuda_kq_mma_takes(T, cols, n) && off % (T == GGML_TYPE_Q6_K ? 2 : 8) == 0;
    float *xv = malloc((size_t)n * cols * sizeof(float));
    if (fast)
        kq_view_as(x, xv, n, cols, n <= 8 || tiles);
    else
        memcpy(xv, x, (size_t)n * cols * sizeof(float));
    cpu.i->matmul(cpu.ctx, th, x, yf, n);
    kq_ref_product(cpu, th, xv, yc, n, add);
    float *xd = dev_put(x, (size_t)n * cols * sizeof(float));
    float *yd = dev_put(NULL, ylen * sizeof(float));
    if (add)
        gpu.i->upload(gpu.ctx, yd, y0, ylen * sizeof(float));
    else
        dev_poison(yd, ylen * sizeof(float));
    if (add)
        gpu.i->matmul_add(gpu.ctx, &td, xd, yd, n);
    else
        gpu.i->matmul(gpu.ctx, &td, xd, yd, n);
    float *yg = dev_get(yd, ylen);
    double e = relerr(yg, yc, ylen);
    if (add) { /* the product alone, so that the added y0 does not hide its error */
        for (size_t i = 0; i < ylen; i++) {
            yg[i] -= y0[i];
            yc[i] -= y0[i];
        }
        double ep = relerr(yg, yc, ylen);
        e = ep > e ? ep : e;
    }
    *e_f32 = relerr(yg, yf, ylen);
    gpu.i->free(gpu.ctx, wd); gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, yd);
    free(yc); free(y0); free(yg); free(yf); free(xv);
    return e;
}

void test_matmul_kq(void)
{
    /* cols, rows, n, add, byte offset of W: Qwen3-30B-A3B's expert and attention shapes at
     * decode (1, 2), few-token (7, 9) and prefill (64, 512) sizes, and odd row counts */
    static const int shapes[][5] = {
        {2048, 768, 1, 0, 0},  {2048, 768, 2, 0, 0},  {2048, 768, 7, 0, 0}, {2048, 768, 64, 0, 0},
        {2048, 768, 512, 0, 0}, {768, 2048, 1, 0, 0}, {768, 2048, 7, 0, 0}, {768, 2048, 64, 0, 0},
        {4096, 300, 9, 0, 0},  {256, 1, 1, 0, 0},    {512, 33, 3, 0, 0},   {2048, 1001, 130, 0, 0},
        {2048, 768, 1, 1, 0},  {768, 2048, 7, 1, 0},  {2048, 768, 64, 1, 0},
        {512, 70, 1, 0, 2},    {512, 70, 9, 0, 1}, /* rows 2-byte / 1-byte aligned: element-wise kernel */
    };
    bool quick = getenv("TIDE_TEST_QUICK") != NULL;
    for (int ti = 0; ti < 3; ti++) {
        uint32_t T = kq_types[ti];
        char name[32];
        snprintf(name, sizeof name, "matmul_%s", ggml_type_name(T));
        double worst = 0, worst_f32 = 0;
        bool ok = true;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2];
            if (quick && (double)cols * rows * n > 2e7)
                continue;
            float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
            float *x = rand_vec((size_t)n * cols, 1.0f);
            struct tensor th = make_tensor(T, cols, rows, wf);
            double ef;
            double e = kq_product(&th, x, n, shapes[s][3], (size_t)shapes[s][4], &ef);
            if (!(e < 1e-3)) {
                ok = false;
                printf("  %s cols %d rows %d n %d%s offset %d: rel err %.3g (%.3g against the CPU backend)\n", name, cols,
                       rows, n, shapes[s][3] ? " add" : "", shapes[s][4], e, ef);
            }
            if (e > worst) worst = e;
            if (ef > worst_f32) worst_f32 = ef;
            free(wf); free(x); free((void *)th.data);
        }
        printf("  %s: max rel err %.3g against the reference on x as the kernels see it, %.3g against the CPU backend\n", name, worst,
               worst_f32);
        verdict(name, ok, "max rel err %.3g", worst);
    }
}

/* get_rows of a k-quant table (token embeddings): the values gguf.c's dequantisation gives */
void test_get_rows_kq(void)
{
    bool ok = true;
    double worst = 0;
    for (int ti = 0; ti < 3; ti++) {
        int cols = 512, rows = 300, ids[5] = {0, 299, 7, 7, 150};
        float *wf = rand_vec((size_t)rows * cols, 0.7f);
        struct tensor th = make_tensor(kq_types[ti], cols, rows, wf), td = to_dev(&th);
        float *rc = malloc(sizeof(float) * 5 * cols), *rd = dev_put(NULL, sizeof(float) * 5 * cols);
        dev_poison(rd, sizeof(float) * 5 * cols);
        cpu.i->get_rows(cpu.ctx, &th, ids, 5, rc);
        gpu.i->get_rows(gpu.ctx, &td, ids, 5, rd);
        float *rg = dev_get(rd, (size_t)5 * cols);
        double e = relerr(rg, rc, (size_t)5 * cols);
        if (!(e < 1e-6)) {
            ok = false;
            printf("  get_rows %s: rel err %.3g\n", ggml_type_name(kq_types[ti]), e);
        }
        if (e > worst) worst = e;
        gpu.i->free(gpu.ctx, (void *)td.data); gpu.i->free(gpu.ctx, rd);
        free(wf); free((void *)th.data); free(rc); free(rg);
    }
    verdict("get_rows_kq", ok, "max rel err %.3g", worst);
}

/* k experts, gate/up in TG and down in TD: moe_ffn (pointers) against kq_moe_ref (1e-3: an int8
 * rounding of h may flip on a float sum taken in another order) and, reported, the CPU
 * backend's op; the table form (moe_ffn_table, experts from a device table) bit for bit the
 * pointer form. */
static bool moe_kq_case(uint32_t TG, uint32_t TD, int E, int F, int k, double *worst)
{
    struct tensor th[16][3], td[16][3];
    struct expert_weights eh[16], ed[16];
    float w[16];
    const void *tab[48];
    for (int j = 0; j < k; j++) {
        int shp[3][2] = {{E, F}, {E, F}, {F, E}};
        for (int m = 0; m < 3; m++) {
            float *wf = rand_vec((size_t)shp[m][0] * shp[m][1], 1.0f / sqrtf((float)shp[m][0]));
            th[j][m] = make_tensor(m == 2 ? TD : TG, shp[m][0], shp[m][1], wf);
            td[j][m] = to_dev(&th[j][m]);
            tab[3 * j + m] = td[j][m].data;
            free(wf);
        }
        eh[j] = (struct expert_weights){th[j][0], th[j][1], th[j][2]};
        ed[j] = (struct expert_weights){td[j][0], td[j][1], td[j][2]};
        w[j] = 0.05f + 0.9f / (float)(j + 1);
    }
    float *x = rand_vec(E, 1.0f), *yc = malloc(E * sizeof(float));
    float *hb = malloc(F * sizeof(float)), *hb2 = malloc(F * sizeof(float)), *tmp = malloc(E * sizeof(float));
    int rc_c = cpu.i->moe_ffn(cpu.ctx, eh, w, k, x, yc, hb, hb2, tmp, false);
    float *yr = malloc(E * sizeof(float));
    kq_moe_ref(cpu, eh, w, k, x, yr);
    float *xd = dev_put(x, E * sizeof(float)), *yd = dev_put(NULL, E * sizeof(float));
    float *s1 = dev_put(NULL, F * sizeof(float)), *s2 = dev_put(NULL, F * sizeof(float));
    float *s3 = dev_put(NULL, E * sizeof(float)), *yt = dev_put(NULL, E * sizeof(float));
    dev_poison(yd, E * sizeof(float));
    dev_poison(yt, E * sizeof(float));
    int rc_probe = gpu.i->moe_ffn(gpu.ctx, eh, w, k, NULL, NULL, NULL, NULL, NULL, false);
    int rc_g = gpu.i->moe_ffn(gpu.ctx, ed, w, k, xd, yd, s1, s2, s3, false);
    /* the table: every expert's three slots; routed = ids 0..k-1, then the weights' bits */
    int32_t routed[32];
    for (int j = 0; j < k; j++) {
        routed[j] = j;
        memcpy(&routed[k + j], &w[j], sizeof(float));
    }
    void *tabd = dev_put(tab, sizeof(void *) * 3 * (size_t)k), *rd = dev_put(routed, sizeof(int32_t) * 2 * (size_t)k);
    int rc_t = gpu.i->moe_ffn_table(gpu.ctx, &ed[0], (const void *const *)tabd, rd, k, xd, yt, false);
    float *yg = dev_get(yd, E), *ytg = dev_get(yt, E);
    double e = relerr(yg, yr, E), e_cpu = relerr(yg, yc, E);
    bool same = !memcmp(yg, ytg, E * sizeof(float));
    bool ok = rc_c == 0 && rc_probe == 0 && rc_g == 0 && rc_t == 0 && e < 1e-3 && same;
    printf("  moe_ffn %s/%s E %d F %d k %d: rel err %.3g (%.3g against the CPU op on f32 x)%s\n", ggml_type_name(TG),
           ggml_type_name(TD), E, F, k, e, e_cpu, same ? "" : ", table form: DIFFERENT bits");
    if (!(rc_c == 0 && rc_probe == 0 && rc_g == 0 && rc_t == 0))
        printf("  rc cpu %d probe %d cuda %d table %d\n", rc_c, rc_probe, rc_g, rc_t);
    if (e > *worst) *worst = e;
    for (int j = 0; j < k; j++)
        for (int m = 0; m < 3; m++) {
            gpu.i->free(gpu.ctx, (void *)td[j][m].data);
            free((void *)th[j][m].data);
        }
    gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, yd); gpu.i->free(gpu.ctx, yt);
    gpu.i->free(gpu.ctx, s1); gpu.i->free(gpu.ctx, s2); gpu.i->free(gpu.ctx, s3);
    gpu.i->free(gpu.ctx, tabd); gpu.i->free(gpu.ctx, rd);
    free(x); free(yc); free(yr); free(hb); free(hb2); free(tmp); free(yg); free(ytg);
    return ok;
}

void test_moe_kq(void)
{
    static const int cfg[][5] = {
        {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 2048, 768, 8}, /* Qwen3-30B-A3B's expert in Q4_K_M */
        {GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 2048, 768, 8}, {GGML_TYPE_Q5_K, GGML_TYPE_Q5_K, 512, 256, 4},
        {GGML_TYPE_Q6_K, GGML_TYPE_Q6_K, 256, 512, 1},  {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, 256, 256, 16},
    };
    bool ok = cpu.i->moe_ffn && gpu.i->moe_ffn && gpu.i->moe_ffn_table;
    double worst = 0;
    for (size_t i = 0; ok && i < sizeof cfg / sizeof cfg[0]; i++)
        ok = moe_kq_case((uint32_t)cfg[i][0], (uint32_t)cfg[i][1], cfg[i][2], cfg[i][3], cfg[i][4], &worst) && ok;
    verdict("moe_ffn_kq", ok, "max rel err %.3g", worst);
}

/* Decode and prefill timings of k-quant products (q8_0 alongside), W rotated through ~1 GiB of
 * copies so that no call finds it in L2: us a call, and GB/s of W read at n = 1. */
void bench_kquant(void)
{
    static const int shapes[][2] = {{2048, 768}, {768, 2048}, {2048, 4096}, {4096, 2048}};
    static const int ns[] = {1, 8, 64, 512};
    uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0};
    bool ok = true;
    printf("  k-quant products (cols x rows): us a call at n = 1 (GB/s of W), 8, 64, 512 (TOP/s)\n");
    for (int ti = 0; ti < 4; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int cols = shapes[s][0], rows = shapes[s][1], nmax = 512;
            struct bench_product bp;
            if (!bench_product_make(&bp, types[ti], cols, rows, nmax)) { bench_product_free(&bp); ok = false; continue; }
            printf("  %-5s %5d x %5d:", ggml_type_name(types[ti]), cols, rows);
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                int n = ns[k];
                double t = time_product(&bp, n);
                if (n == 1)
                    printf(" n 1 %7.2f us (%5.0f GB/s)", t * 1e6, (double)bp.mbytes / t / 1e9);
                else
                    printf("  n %d %8.2f us (%5.1f TOP/s)", n, t * 1e6, 2.0 * cols * rows * n / t / 1e12);
            }
            printf("\n");
            fflush(stdout);
            bench_product_free(&bp);
        }
    verdict("bench_kquant", ok, "%g shapes", 16.0);
}

#else
void test_matmul_kq(void) {}
void test_get_rows_kq(void) {}
void test_moe_kq(void) {}
void bench_kquant(void) {}
#endif
