/* test_small_ops.c - the GPU test program's checks of the CUDA backend's small ops
 * (small_ops.cu: rmsnorm, rope, swiglu, axpy, scatter_axpy, axpy_sigmoid, get_row(s),
 * gather_rows) and its copies and zero (backend_cuda.cu: upload, download, copy ordered
 * against the ops) against the CPU backend. test_cuda_ops.c lists and runs them. */
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void test_rmsnorm(void)
{
    static const int cfg[][2] = {{16, 24}, {128, 5}, {2048, 3}, {96, 40}};
    double worst = 0;
    bool ok = true;
    for (int c = 0; c < 4; c++) {
        int dim = cfg[c][0], n = cfg[c][1];
        for (int inplace = 0; inplace < 2; inplace++) {
            float *x = rand_vec((size_t)dim * n, 2.0f), *wv = rand_vec(dim, 1.0f);
            struct tensor wh = {.type = GGML_TYPE_F32, .ne = {(uint64_t)dim, 1}, .data = wv, .row_bytes = dim * 4};
            struct tensor wd = to_dev(&wh);
            float *yc = malloc((size_t)dim * n * sizeof(float));
            cpu.i->rmsnorm(cpu.ctx, x, &wh, yc, dim, n, 1e-6f);
            float *xd = dev_put(x, (size_t)dim * n * 4), *yd = xd;
            if (!inplace) {
                yd = dev_put(NULL, (size_t)dim * n * 4);
                dev_poison(yd, (size_t)dim * n * 4);
            }
            gpu.i->rmsnorm(gpu.ctx, xd, &wd, yd, dim, n, 1e-6f);
            float *yg = dev_get(yd, (size_t)dim * n);
            double e = relerr(yg, yc, (size_t)dim * n);
            if (!(e < 1e-5)) { ok = false; printf("  rmsnorm dim %d n %d inplace %d: %.3g\n", dim, n, inplace, e); }
            if (e > worst) worst = e;
            if (!inplace) gpu.i->free(gpu.ctx, yd);
            gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, (void *)wd.data);
            free(x); free(wv); free(yc); free(yg);
        }
    }
    verdict("rmsnorm", ok, "max rel err %.3g", worst);
}

/* n tokens at positions pos..pos+n-1 in one call; the GPU must give the CPU's result for each
 * token (the same double-precision angles), so the limit is tight. */
void test_rope(void)
{
    /* n_heads, head_dim, pos, n */
    static const int cfg[][4] = {{8, 128, 0, 1},  {8, 128, 7, 1},    {4, 16, 40000, 1}, {32, 64, 131000, 1},
                                 {2, 32, 3, 1},   {32, 128, 0, 512}, {4, 128, 300, 77}, {8, 64, 130000, 33},
                                 {6, 96, 5, 200}};
    double worst = 0;
    bool ok = true;
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++)
        for (int kind = 0; kind < 2; kind++) {
            int nh = cfg[c][0], hd = cfg[c][1], pos = cfg[c][2], n = cfg[c][3];
            size_t len = (size_t)n * nh * hd;
            float *v = rand_vec(len, 1.0f);
            float *vd = dev_put(v, len * 4);
            cpu.i->rope(cpu.ctx, v, n, nh, hd, pos, 1e6f, kind ? ROPE_NEOX : ROPE_NORM);
            gpu.i->rope(gpu.ctx, vd, n, nh, hd, pos, 1e6f, kind ? ROPE_NEOX : ROPE_NORM);
            float *g = dev_get(vd, len);
            double e = relerr(g, v, len);
            if (!(e < 1e-6)) { ok = false; printf("  rope nh %d hd %d pos %d n %d kind %d: %.3g\n", nh, hd, pos, n, kind, e); }
            if (e > worst) worst = e;
            gpu.i->free(gpu.ctx, vd);
            free(v); free(g);
        }
    verdict("rope", ok, "max rel err %.3g", worst);
}

void test_elementwise(void)
{
    int n = 1000003;
    float *g = rand_vec(n, 3.0f), *u = rand_vec(n, 1.0f);
    float *gd = dev_put(g, (size_t)n * 4), *ud = dev_put(u, (size_t)n * 4);
    cpu.i->swiglu(cpu.ctx, g, u, n);
    gpu.i->swiglu(gpu.ctx, gd, ud, n);
    float *r = dev_get(gd, n);
    double e = relerr(r, g, n);
    verdict("swiglu", e < 1e-6, "rel err %.3g", e);
    free(r);
    cpu.i->axpy(cpu.ctx, g, u, -0.37f, n);
    gpu.i->axpy(gpu.ctx, gd, ud, -0.37f, n);
    r = dev_get(gd, n);
    e = relerr(r, g, n);
    verdict("axpy", e < 1e-6, "rel err %.3g", e);
    float last = r[n - 1]; /* the GPU's own value (the CPU's axpy may round the last bit apart) */
    free(r);
    gpu.i->zero(gpu.ctx, gd, n - 1);
    r = dev_get(gd, n);
    size_t bad = 0;
    for (int i = 0; i < n - 1; i++)
        bad += r[i] != 0.0f;
    bad += r[n - 1] != last; /* one past the end untouched */
    verdict("zero", bad == 0, "%g wrong elements", (double)bad);
    free(r);
    gpu.i->free(gpu.ctx, gd); gpu.i->free(gpu.ctx, ud);
    free(g); free(u);
}

/* scatter_axpy: 300 distinct rows of 1000 (over two launches' worth), bitwise as axpy per row */
void test_scatter(void)
{
    int ns = 300, dim = 2048, ny = 1000;
    float *y = rand_vec((size_t)ny * dim, 1.0f), *x = rand_vec((size_t)ns * dim, 1.0f), *w = rand_vec(ns, 1.0f);
    int *rows = malloc(ns * sizeof(int)), *perm = malloc(ny * sizeof(int));
    for (int i = 0; i < ny; i++) perm[i] = i;
    for (int i = ny - 1; i > 0; i--) { int j = (int)(rnd64() % (uint64_t)(i + 1)), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int i = 0; i < ns; i++) rows[i] = perm[i];
    float *yd = dev_put(y, (size_t)ny * dim * 4), *xd = dev_put(x, (size_t)ns * dim * 4);
    float *ref = dev_put(y, (size_t)ny * dim * 4);
    cpu.i->scatter_axpy(cpu.ctx, y, x, rows, w, ns, dim);
    gpu.i->scatter_axpy(gpu.ctx, yd, xd, rows, w, ns, dim);
    for (int i = 0; i < ns; i++) /* the GPU's own axpy, row by row */
        gpu.i->axpy(gpu.ctx, ref + (size_t)rows[i] * dim, xd + (size_t)i * dim, w[i], dim);
    float *yg = dev_get(yd, (size_t)ny * dim), *rg = dev_get(ref, (size_t)ny * dim);
    double es = relerr(yg, y, (size_t)ny * dim);
    bool same = memcmp(yg, rg, (size_t)ny * dim * 4) == 0;
    verdict("scatter_axpy", es < 1e-6 && same, "rel err %.3g vs cpu, bitwise as per-row axpy", es);
    gpu.i->free(gpu.ctx, yd); gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, ref);
    free(y); free(x); free(w); free(rows); free(perm); free(yg); free(rg);
}

/* axpy_sigmoid (qwen2moe's gated shared expert): 300 rows of 2048, each scaled by the sigmoid of
 * its own device-side gate, against the CPU op */
void test_axpy_sigmoid(void)
{
    int n = 300, dim = 2048;
    float *y = rand_vec((size_t)n * dim, 1.0f), *x = rand_vec((size_t)n * dim, 1.0f), *g = rand_vec(n, 4.0f);
    float *yd = dev_put(y, (size_t)n * dim * 4), *xd = dev_put(x, (size_t)n * dim * 4), *gd = dev_put(g, (size_t)n * 4);
    cpu.i->axpy_sigmoid(cpu.ctx, y, x, g, n, dim);
    gpu.i->axpy_sigmoid(gpu.ctx, yd, xd, gd, n, dim);
    float *yg = dev_get(yd, (size_t)n * dim);
    double e = relerr(yg, y, (size_t)n * dim);
    verdict("axpy_sigmoid", e < 1e-6, "rel err %.3g vs cpu", e);
    gpu.i->free(gpu.ctx, yd); gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, gd);
    free(y); free(x); free(g); free(yg);
}

void test_get_row(void)
{
    uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    double worst = 0;
    bool ok = true;
    for (int t = 0; t < 5; t++) {
        int cols = 256, rows = 50;
        float *wf = rand_vec((size_t)cols * rows, 1.0f);
        struct tensor th = make_tensor(types[t], cols, rows, wf), td = to_dev(&th);
        float oc[256];
        if (types[t] == GGML_TYPE_Q4_0) /* the CPU get_row dequantises q4_0 through ggml_dequantize */
            ggml_dequantize(types[t], (const uint8_t *)th.data + 37 * th.row_bytes, oc, cols);
        else
            cpu.i->get_row(cpu.ctx, &th, 37, oc);
        float *od = dev_put(NULL, cols * 4);
        dev_poison(od, cols * 4);
        gpu.i->get_row(gpu.ctx, &td, 37, od);
        float *og = dev_get(od, cols);
        double e = relerr(og, oc, cols);
        if (!(e < 1e-6)) { ok = false; printf("  get_row type %s: %.3g\n", ggml_type_name(types[t]), e); }
        if (e > worst) worst = e;
        /* get_rows: 300 ids (more than one launch's 128), repeats included, each row the bits
         * of get_row's on the same backend; the CPU's the same as its get_row */
        enum { NI = 300 };
        int ids[NI];
        for (int i = 0; i < NI; i++)
            ids[i] = (i * 7 + 3) % rows;
        float *rd = dev_put(NULL, (size_t)NI * cols * 4), *rc = malloc((size_t)NI * cols * 4);
        dev_poison(rd, (size_t)NI * cols * 4);
        gpu.i->get_rows(gpu.ctx, &td, ids, NI, rd);
        cpu.i->get_rows(cpu.ctx, &th, ids, NI, rc);
        float *rg = dev_get(rd, (size_t)NI * cols);
        for (int i = 0; i < NI && ok; i++) {
            float one[256];
            gpu.i->get_row(gpu.ctx, &td, ids[i], od);
            float *o1 = dev_get(od, cols);
            cpu.i->get_row(cpu.ctx, &th, ids[i], one);
            if (memcmp(rg + (size_t)i * cols, o1, sizeof(float) * cols) ||
                memcmp(rc + (size_t)i * cols, one, sizeof(float) * cols)) {
                ok = false;
                printf("  get_rows type %s: row %d (id %d) differs from get_row\n", ggml_type_name(types[t]), i, ids[i]);
            }
            free(o1);
        }
        gpu.i->free(gpu.ctx, rd); free(rg); free(rc);
        gpu.i->free(gpu.ctx, od); gpu.i->free(gpu.ctx, (void *)td.data);
        free(wf); free(og); free((void *)th.data);
    }
    verdict("get_row", ok, "max rel err %.3g; get_rows = get_row per id", worst);
}

void test_gather_upload(void)
{
    int n_src = 500, n = 300, dim = 96;
    float *src = rand_vec((size_t)n_src * dim, 1.0f);
    int *rows = malloc(n * sizeof(int));
    for (int i = 0; i < n; i++)
        rows[i] = (int)(rnd64() % n_src);
    float *dc = malloc((size_t)n * dim * 4);
    cpu.i->gather_rows(cpu.ctx, dc, src, rows, n, dim);
    float *sd = dev_put(src, (size_t)n_src * dim * 4), *dd = dev_put(NULL, (size_t)n * dim * 4);
    dev_poison(dd, (size_t)n * dim * 4);
    gpu.i->gather_rows(gpu.ctx, dd, sd, rows, n, dim);
    float *dg = dev_get(dd, (size_t)n * dim);
    verdict("gather_rows", memcmp(dg, dc, (size_t)n * dim * 4) == 0, "%g rows", (double)n);
    gpu.i->free(gpu.ctx, sd); gpu.i->free(gpu.ctx, dd);
    free(src); free(rows); free(dc); free(dg);

    /* upload then an op then download, with no sync between: the copy stream must be
     * ordered before the op, and a second upload into the same buffer after it */
    size_t m = 10 << 20;
    float *a = rand_vec(m, 1.0f), *b = rand_vec(m, 1.0f), *ref = malloc(m * 4);
    for (size_t i = 0; i < m; i++)
        ref[i] = a[i] + 2.0f * b[i];
    float *ad = dev_put(NULL, m * 4), *bd = dev_put(NULL, m * 4);
    gpu.i->upload(gpu.ctx, ad, a, m * 4);
    gpu.i->upload(gpu.ctx, bd, b, m * 4);
    gpu.i->axpy(gpu.ctx, ad, bd, 2.0f, (int)m);
    gpu.i->upload(gpu.ctx, bd, a, m * 4); /* must not overtake the axpy reading bd */
    float *r = dev_get(ad, m), *r2 = dev_get(bd, m);
    bool ok = memcmp(r, ref, m * 4) == 0 && memcmp(r2, a, m * 4) == 0;
    gpu.i->sync(gpu.ctx);
    verdict("upload_download", ok, "%g MiB, ordered against ops", (double)(m * 4 >> 20));
    /* a device copy (KV rows between slots) ordered between two ops: ad + ad is exactly 2 ad */
    gpu.i->axpy(gpu.ctx, ad, bd, 0.0f, (int)m);
    gpu.i->copy(gpu.ctx, bd, ad, m * 4);
    gpu.i->axpy(gpu.ctx, ad, bd, 1.0f, (int)m);
    float *r3 = dev_get(ad, m);
    for (size_t i = 0; i < m && ok; i++)
        ok = r3[i] == 2.0f * r[i];
    verdict("gather_copy_d2d", ok, "%g MiB, ordered against ops", (double)(m * 4 >> 20));
    gpu.i->free(gpu.ctx, ad); gpu.i->free(gpu.ctx, bd);
    free(a); free(b); free(ref); free(r); free(r2); free(r3);
}
