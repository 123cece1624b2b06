/* test_qblock.c - q5_0, q5_1, iq4_xs and MXFP4 weights on the GPU (cuda/qblock.cu) against the
 * CPU backend: matmul at decode, few-token and prefill sizes (with the residual add; rows only
 * 1- or 2-byte aligned, which take the element-wise kernel), and get_rows (embeddings).
 *
 * As for the k-quants (test_kquant.c), the kernels see x in int8 blocks (n <= 8) or f16 (prefill
 * sizes, W widened to f16) and the CPU quantises x its own way, so each product is checked
 * against kq_ref_product: the weights as the CPU backend's get_row decodes them, dotted in
 * double with x as the kernel sees it, ||gpu - ref|| / ||ref|| < 1e-3; the distance from the
 * CPU backend's own product is reported. */
#include "engine/gguf.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA

static void test_matmul_qb(uint32_t T)
{
    /* cols, rows, n, add, byte offset of W: gpt-oss-20b's expert shape (2880), Qwen1.5-MoE's
     * 1408-wide down (q5_0 in its Q4_K_M), decode (1, 2), few-token (7, 9), prefill (64, 130,
     * 512) sizes, odd row counts, and offsets the word loads cannot take */
    static const int shapes[][5] = {
        {2048, 768, 1, 0, 0},   {2048, 768, 2, 0, 0},  {2048, 768, 7, 0, 0},  {2048, 768, 64, 0, 0},
        {2048, 768, 512, 0, 0}, {2880, 720, 1, 0, 0},  {2880, 720, 9, 0, 0},  {2880, 720, 130, 0, 0},
        {1408, 512, 1, 0, 0},   {1408, 512, 64, 0, 0}, {96, 33, 3, 0, 0},     {64, 1, 1, 0, 0},
        {256, 1001, 11, 0, 0},  {2048, 768, 1, 1, 0},  {1408, 512, 7, 1, 0}, {2048, 300, 64, 1, 0},
        {512, 70, 1, 0, 2},     {512, 70, 9, 0, 1},
    };
    char name[32];
    snprintf(name, sizeof name, "matmul_%s", ggml_type_name(T));
    double worst = 0, worst_f32 = 0;
    bool ok = true;
    int run = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2];
        if (cols % (T == GGML_TYPE_IQ4_XS ? 256 : 32))
            continue; /* not a whole block a row */
        float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
        float *x = rand_vec((size_t)n * cols, 1.0f);
        struct tensor th = make_tensor(T, cols, rows, wf);
        double ef;
        double e = kq_product(&th, x, n, shapes[s][3], (size_t)shapes[s][4], &ef);
        run++;
        if (!(e < 1e-3)) {
            ok = false;
            printf("  %s cols %d rows %d n %d%s offset %d: rel err %.3g (%.3g against the CPU backend)\n", name, cols,
                   rows, n, shapes[s][3] ? " add" : "", shapes[s][4], e, ef);
        }
        if (e > worst) worst = e;
        if (ef > worst_f32) worst_f32 = ef;
        free(wf); free(x); free((void *)th.data);
    }
    printf("  %s: %d shapes, max rel err %.3g against the reference on x as the kernels see it, %.3g against the CPU "
           "backend\n", name, run, worst, worst_f32);
    verdict(name, ok, "max rel err %.3g", worst);
}

/* get_rows of a table of each type (token embeddings): the values gguf.c's dequantisation gives */
static void test_get_rows_qb(const uint32_t *types, int nt)
{
    bool ok = true;
    double worst = 0;
    for (int ti = 0; ti < nt; ti++) {
        int cols = 512, rows = 300, ids[5] = {0, 299, 7, 7, 150};
        float *wf = rand_vec((size_t)rows * cols, 0.7f);
        struct tensor th = make_tensor(types[ti], cols, rows, wf), td = to_dev(&th);
        float *rc = malloc(sizeof(float) * 5 * cols), *rd = dev_put(NULL, sizeof(float) * 5 * cols);
        dev_poison(rd, sizeof(float) * 5 * cols);
        cpu.i->get_rows(cpu.ctx, &th, ids, 5, rc);
        gpu.i->get_rows(gpu.ctx, &td, ids, 5, rd);
        float *rg = dev_get(rd, (size_t)5 * cols);
        double e = relerr(rg, rc, (size_t)5 * cols);
        if (!(e < 1e-6)) {
            ok = false;
            printf("  get_rows %s: rel err %.3g\n", ggml_type_name(types[ti]), e);
        }
        if (e > worst) worst = e;
        gpu.i->free(gpu.ctx, (void *)td.data); gpu.i->free(gpu.ctx, rd);
        free(wf); free((void *)th.data); free(rc); free(rg);
    }
    verdict("get_rows_qb", ok, "max rel err %.3g", worst);
}

void test_qblock(const char *only)
{
    static const uint32_t types[] = {GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "matmul_%s", ggml_type_name(types[i]));
        if (!only || strstr(name, only))
            test_matmul_qb(types[i]);
    }
    if (!only || strstr("get_rows_qb", only))
        test_get_rows_qb(types, 4);
}

#else
void test_qblock(const char *only) { (void)only; }
#endif
