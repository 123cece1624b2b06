/* test_mmq.c - the q8_0 / q4_0 tensor-core matmul (src/engine/cuda/mmq_mma.cu) against the
 * dp4a kernels it replaces at prefill sizes, and its timings against them.
 *
 * Both paths quantise x the same way and form the same integer block dots, so they may
 * differ only in the order of the f32 sum over blocks: the check is ||mma - dp4a|| /
 * ||dp4a|| < 1e-5 (and the usual 1e-2 against the CPU backend), over every tile width, row
 * and token tails, K of one stage, split-K with a short last slice; shapes the tensor-core
 * kernel does not take (K not a multiple of 128) must come out the same through dp4a. */
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "gpu_test.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef TIDE_CUDA

static void run_gpu(const struct tensor *td, const float *xd, float *yd, int rows, int n, int min_n, float **out)
{
    int old = cuda_set_mmq_min_n(min_n);
    dev_poison(yd, (size_t)n * rows * sizeof(float));
    gpu.i->matmul(gpu.ctx, td, xd, yd, n);
    *out = dev_get(yd, (size_t)n * rows);
    cuda_set_mmq_min_n(old);
}

void test_mmq(void)
{
    /* cols, rows, n, forced tile width (0: the dispatcher's choice) */
    static const int shapes[][4] = {
        {2048, 1000, 16, 0}, {2048, 1000, 33, 0}, {2048, 1000, 64, 0}, {2048, 768, 512, 0},
        {768, 2048, 64, 0},  {768, 2048, 40, 16}, {768, 2048, 40, 32}, {768, 2048, 40, 64},
        {64, 70, 40, 0},     {64, 70, 9, 64},     {64, 65, 3, 16},     {4096, 130, 17, 32},
        {1024, 1, 20, 0},    {192, 129, 100, 64}, {2112, 130, 24, 0}, {2112, 130, 24, 16},
        {640, 200, 24, 0},   {896, 300, 70, 0}, /* 5 and 7 stages: split-K with a short last slice */
        {128, 40, 33, 32},   /* K of one stage */
        {96, 70, 40, 0}, /* an odd block count: rows not 4-byte multiples, the dp4a path */
    };
    uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    bool quick = getenv("TIDE_TEST_QUICK") != NULL; /* small shapes only (under compute-sanitizer) */
    double worst_old = 0, worst_cpu = 0;
    bool ok = true;
    for (int ti = 0; ti < 2; ti++) {
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2];
            if (quick && (double)cols * rows * n > 1e7)
                continue;
            float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
            float *x = rand_vec((size_t)n * cols, 1.0f);
            struct tensor th = make_tensor(types[ti], cols, rows, wf);
            struct tensor td = to_dev(&th);
            float *yc = malloc((size_t)n * rows * sizeof(float));
            cpu.i->matmul(cpu.ctx, &th, x, yc, n);
            float *xd = dev_put(x, (size_t)n * cols * sizeof(float));
            float *yd = dev_put(NULL, (size_t)n * rows * sizeof(float));
            float *y_old, *y_new;
            run_gpu(&td, xd, yd, rows, n, INT_MAX, &y_old);
            int otile = cuda_set_mmq_tile(shapes[s][3]);
            run_gpu(&td, xd, yd, rows, n, 1, &y_new);
            cuda_set_mmq_tile(otile);
            double e_old = relerr(y_new, y_old, (size_t)n * rows), e_cpu = relerr(y_new, yc, (size_t)n * rows);
            if (!(e_old < 1e-5) || !(e_cpu < 1e-2)) {
                ok = false;
                printf("  %s cols %d rows %d n %d tile %d: rel err %.3g vs dp4a, %.3g vs cpu\n",
                       ggml_type_name(types[ti]), cols, rows, n, shapes[s][3], e_old, e_cpu);
            }
            if (e_old > worst_old) worst_old = e_old;
            if (e_cpu > worst_cpu) worst_cpu = e_cpu;
            gpu.i->free(gpu.ctx, xd); gpu.i->free(gpu.ctx, yd); gpu.i->free(gpu.ctx, (void *)td.data);
            free(wf); free(x); free(yc); free(y_old); free(y_new); free((void *)th.data);
        }
    }
    printf("  mmq: max rel err %.3g vs the dp4a kernels, %.3g vs the CPU backend\n", worst_old, worst_cpu);
    verdict("matmul_mmq", ok, "max rel err vs dp4a %.3g", worst_old);
}

/* Seconds per call of y = W x, W rotated through ~1 GiB of copies (no L2 reuse between calls). */
double time_product(struct bench_product *b, int n)
{
    struct tensor *td = &b->td;
    for (int i = 0; i < 3; i++) { td->data = b->buf + (size_t)i % b->nm * b->mbytes; gpu.i->matmul(gpu.ctx, td, b->x, b->y, n); }
    gpu.i->sync(gpu.ctx);
    double t0 = now_s();
    td->data = b->buf;
    gpu.i->matmul(gpu.ctx, td, b->x, b->y, n);
    gpu.i->sync(gpu.ctx);
    double one = now_s() - t0;
    int iters = (int)(0.02 / (one > 1e-6 ? one : 1e-6));
    iters = iters < 5 ? 5 : iters > 400 ? 400 : iters;
    t0 = now_s();
    for (int i = 0; i < iters; i++) {
        td->data = b->buf + (size_t)(i % b->nm) * b->mbytes;
        gpu.i->matmul(gpu.ctx, td, b->x, b->y, n);
    }
    gpu.i->sync(gpu.ctx);
    return (now_s() - t0) / iters;
}

/* The Qwen3-30B-A3B shapes a prefill runs (attention q/k/v/o, expert gate/up and down):
 * dp4a path vs tensor cores, and at larger n each forced tile width. */
void bench_mmq(void)
{
    static const int shapes[][2] = {{2048, 4096}, {2048, 512}, {4096, 2048}, {2048, 768}, {768, 2048}};
    static const int ns[] = {8, 16, 32, 64, 512};
    uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    bool ok = true;
    printf("  mmq (cols x rows, n): dp4a us, mma us (auto), speed-up, int8 TOP/s of each; then mma us "
           "without split-K, and (n >= 32) with tile 16/32/64\n");
    for (int ti = 0; ti < 2; ti++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int cols = shapes[s][0], rows = shapes[s][1], nmax = ns[sizeof(ns) / sizeof(ns[0]) - 1];
            struct bench_product bp;
            if (!bench_product_make(&bp, types[ti], cols, rows, nmax)) { bench_product_free(&bp); ok = false; continue; }
            for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
                int n = ns[k];
                if (types[ti] == GGML_TYPE_Q4_0 && (n == 8 || n == 32))
                    continue;
                double ops = 2.0 * cols * rows * n;
                int om = cuda_set_mmq_min_n(INT_MAX);
                double t_old = time_product(&bp, n);
                cuda_set_mmq_min_n(1);
                double t_new = time_product(&bp, n);
                printf("  %-5s %5d x %5d n %3d: %8.2f us %8.2f us  x%5.2f  %6.1f %6.1f TOP/s", ggml_type_name(types[ti]),
                       cols, rows, n, t_old * 1e6, t_new * 1e6, t_old / t_new, ops / t_old / 1e12, ops / t_new / 1e12);
                int osp = cuda_set_mmq_split(1);
                printf("  nosplit %7.2f", time_product(&bp, n) * 1e6);
                cuda_set_mmq_split(osp);
                if (n >= 32) {
                    for (int bn = 16; bn <= 64; bn *= 2) {
                        int ot = cuda_set_mmq_tile(bn);
                        printf(" %7.2f", time_product(&bp, n) * 1e6);
                        cuda_set_mmq_tile(ot);
                    }
                }
                printf("\n");
                fflush(stdout);
                cuda_set_mmq_min_n(om);
            }
            bench_product_free(&bp);
        }
    verdict("bench_mmq", ok, "%g shapes", 5.0);
}

#else
void test_mmq(void) {}
void bench_mmq(void) {}
#endif
