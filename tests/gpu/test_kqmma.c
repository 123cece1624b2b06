/* test_kqmma.c - the k-quant int8 tensor-core products (src/engine/cuda/mmq_kquant.cu, on with
 * TIDE_KQ_MMA=1 or cuda_set_kq_mma) against the CPU backend, and (--bench) their timings
 * against the path they replace (W widened to f16, then the f16 tensor-core GEMM).
 *
 * The tiles quantise x to int8 blocks of 32 and dot the weights' codes exactly, so against the
 * weights as the CPU backend's get_row decodes them, dotted in double with x as the tiles see
 * it (kq_product: kq_ref_product on kq_view_as), only float summation differs: < 1e-3, the
 * class of the other k-quant products (test_kquant.c). Against the CPU backend's own product
 * (its x in q8_K blocks of 256, another rounding of x) the q8_0 tiles' class, 1e-2: with
 * rand_vec's normal inputs the CPU backend's product and that reference differ by 8.0-8.1e-3
 * for each type (measured on the CPU for widths 768, 2048 and 4096; q8_0, whose CPU product
 * sees x as the tiles do, 1e-7), the tight 1e-3 check is the one that catches a kernel error
 * (a wrong scale on one sub-block in eight is ~1e-1). Shapes: the Qwen3-30B-A3B
 * products at prefill sizes (n 16, 64, 512; K 2048, 4096 and 768, where q6_K rows are 630
 * bytes, only 2-byte aligned), row and token tails, the residual add (also through split-K's
 * reduction), every forced tile width, no split-K, and a q6_K W at an odd 2-byte offset. */
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "gpu_test.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA

void test_matmul_kqmma(const char *only)
{
    /* cols, rows, n, add, byte offset of W, forced tile width (0: the plan's), 1: no split-K */
    static const int shapes[][7] = {
        {2048, 4096, 16, 0, 0, 0, 0},  {2048, 512, 64, 0, 0, 0, 0},  {4096, 2048, 512, 0, 0, 0, 0},
        {2048, 768, 512, 0, 0, 0, 0},  {768, 2048, 64, 0, 0, 0, 0},  {768, 2048, 16, 0, 0, 0, 0},
        {2048, 1001, 130, 0, 0, 0, 0}, {2048, 768, 64, 1, 0, 0, 0},  {4096, 300, 33, 1, 0, 0, 0},
        {256, 70, 40, 0, 0, 16, 0},    {256, 70, 40, 0, 0, 32, 0},   {256, 70, 40, 0, 0, 64, 0},
        {2048, 512, 64, 0, 0, 0, 1},   {768, 130, 24, 0, 2, 0, 0}, /* q6_K only: W 2 bytes past 8 */
    };
    static const uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    bool quick = getenv("TIDE_TEST_QUICK") != NULL;
    int old_on = cuda_set_kq_mma(1);
    for (int ti = 0; ti < 3; ti++) {
        uint32_t T = types[ti];
        char name[40];
        snprintf(name, sizeof name, "matmul_kqmma_%s", ggml_type_name(T));
        if (only && !strstr(name, only))
            continue;
        double worst = 0, worst_cpu = 0;
        bool ok = true;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2], off = shapes[s][4];
            if (off && T != GGML_TYPE_Q6_K)
                continue; /* q4_K / q5_K need 8-byte aligned rows: kquant.cu's paths take the rest */
            if (quick && (double)cols * rows * n > 2e7)
                continue;
            if (!cuda_kq_mma_takes(T, cols, n)) {
                printf("  %s cols %d n %d: not taken by the tiles\n", name, cols, n);
                ok = false;
                continue;
            }
            float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
            float *x = rand_vec((size_t)n * cols, 1.0f);
            struct tensor th = make_tensor(T, cols, rows, wf);
            int otile = cuda_set_mmq_tile(shapes[s][5]);
            int osplit = shapes[s][6] ? cuda_set_mmq_split(1) : cuda_set_mmq_split(8);
            double ecpu;
            double e = kq_product(&th, x, n, shapes[s][3], (size_t)off, &ecpu);
            cuda_set_mmq_tile(otile);
            cuda_set_mmq_split(osplit);
            if (!(e < 1e-3) || !(ecpu < 1e-2)) {
                ok = false;
                printf("  %s cols %d rows %d n %d%s offset %d tile %d%s: rel err %.3g (%.3g against the CPU backend)\n",
                       name, cols, rows, n, shapes[s][3] ? " add" : "", off, shapes[s][5],
                       shapes[s][6] ? " no split-K" : "", e, ecpu);
            }
            if (e > worst) worst = e;
            if (ecpu > worst_cpu) worst_cpu = ecpu;
            free(wf); free(x); free((void *)th.data);
        }
        char err[300] = "";
        if (backend_cuda_error(&gpu, err, sizeof err)) {
            printf("  CUDA: %s\n", err);
            ok = false;
        }
        printf("  %s: max rel err %.3g against the reference on x as the tiles see it, %.3g against the CPU "
               "backend\n", name, worst, worst_cpu);
        verdict(name, ok, "max rel err %.3g", worst);
    }
    cuda_set_kq_mma(old_on);
}

/* The five Qwen3-30B-A3B product shapes at n = 512 (and 64): the widen + f16 GEMM path (switch
 * off) against the tiles (on), W rotated through ~1 GiB of copies (time_product). */
void bench_kqmma(void)
{
    static const int shapes[][2] = {{2048, 4096}, {2048, 512}, {4096, 2048}, {2048, 768}, {768, 2048}};
    static const int ns[] = {64, 512};
    static const uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    bool ok = true;
    int old_on = cuda_set_kq_mma(0);
    printf("  k-quant prefill products (cols x rows, n): widen+f16 GEMM us, int8 tiles us, speed-up, TOP/s of "
           "each; then the tiles without split-K\n");
    for (int ti = 0; ti < 3; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int cols = shapes[s][0], rows = shapes[s][1], nmax = 512;
            struct bench_product bp;
            if (!bench_product_make(&bp, types[ti], cols, rows, nmax)) { bench_product_free(&bp); ok = false; continue; }
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                int n = ns[k];
                double ops = 2.0 * cols * rows * n;
                cuda_set_kq_mma(0);
                double t_old = time_product(&bp, n);
                cuda_set_kq_mma(1);
                double t_new = time_product(&bp, n);
                int osp = cuda_set_mmq_split(1);
                double t_ns = time_product(&bp, n);
                cuda_set_mmq_split(osp);
                cuda_set_kq_mma(0);
                printf("  %-5s %5d x %5d n %3d: %8.2f us %8.2f us  x%5.2f  %6.1f %6.1f TOP/s  nosplit %8.2f us\n",
                       ggml_type_name(types[ti]), cols, rows, n, t_old * 1e6, t_new * 1e6, t_old / t_new,
                       ops / t_old / 1e12, ops / t_new / 1e12, t_ns * 1e6);
                fflush(stdout);
            }
            bench_product_free(&bp);
        }
    char err[300] = "";
    if (backend_cuda_error(&gpu, err, sizeof err)) {
        printf("  CUDA: %s\n", err);
        ok = false;
    }
    cuda_set_kq_mma(old_on);
    verdict("bench_kqmma", ok, "%g shapes", 15.0);
}

#else
void test_matmul_kqmma(const char *only) { (void)only; }
void bench_kqmma(void) {}
#endif
