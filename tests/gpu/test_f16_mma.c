/* test_f16_mma.c - the big-tile f16 / bf16 tensor-core GEMM (src/engine/cuda/gemm_f16_mma.cu,
 * TIDE_F16_MMA=1) against the CPU backend and against the wmma kernel it replaces, and its
 * timings against that kernel (bench_f16_mma).
 *
 * Both GPU kernels round x to W's type and accumulate in f32, so they may differ only in the
 * order of the f32 sums: the check against the wmma kernel is 2e-5 (norm-wise). Against the
 * CPU's f32 product the difference is x's rounding, the f16-x class: ~3e-4 for f16 (limit
 * 1e-3, as matmul_f16), ~2e-3 for bf16 (limit 1e-2, as matmul_bf16). Shapes: the Qwen3-VL
 * tower's products at 3072 tokens (a 1024x768 image) and at 777 (token edges), the text
 * prefill shapes 2048 x 4096 both ways at 64 and 512 tokens, and small edges: K not a multiple
 * of the 32-wide stage, one row, rows and tokens past whole tiles, W rows padded with NaN past
 * cols, x at an address that is not 16-byte aligned; plus two shapes it must decline (cols %
 * 8, n < 64) that the wmma kernel then runs. Each with add off and on (y0 + W x), and the
 * result twice, bit for bit (split-K's fixed-order reduce). TIDE_TEST_QUICK=1 (compute-sanitizer
 * runs: scripts/test-gpu.sh's `--only matmul_f16` takes matmul_f16_mma too) keeps the small shapes. */
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA

/* cols, rows, n, W row pad (elements past cols, NaN), x misaligned by one float */
static const int fm_shapes[][5] = {
    {1152, 1152, 3072, 0, 0}, {1152, 3456, 3072, 0, 0}, {1152, 4304, 3072, 0, 0}, {4304, 1152, 3072, 0, 0},
    {1152, 1152, 777, 0, 0},  {1152, 4304, 777, 0, 0},  {4304, 1152, 777, 0, 0},  {2048, 4096, 64, 0, 0},
    {4096, 2048, 64, 0, 0},   {2048, 4096, 512, 0, 0},  {4096, 2048, 512, 0, 0},  {40, 70, 65, 8, 0},
    {136, 129, 130, 0, 1},    {24, 1, 64, 0, 0},        {1000, 300, 200, 24, 1},  {520, 257, 129, 0, 0},
    {100, 90, 70, 0, 0}, /* cols % 8: declined */
    {256, 200, 63, 0, 0}, /* n < 64: declined */
};

/* y = W x (add: y0 + W x) on the GPU with the big-tile kernel on or off; malloc'ed */
static float *fm_gpu(const struct tensor *td, const float *xd, float *yd, const float *y0, int rows, int n, bool add,
                     bool on)
{
    size_t ny = (size_t)n * rows;
    int old = cuda_set_f16_mma(on);
    if (add)
        gpu.i->upload(gpu.ctx, yd, y0, ny * sizeof(float));
    else
        dev_poison(yd, ny * sizeof(float));
    if (add)
        gpu.i->matmul_add(gpu.ctx, td, xd, yd, n);
    else
        gpu.i->matmul(gpu.ctx, td, xd, yd, n);
    float *y = dev_get(yd, ny);
    cuda_set_f16_mma(old);
    return y;
}

/* W of type (rows, cols) on the device with rows ldw = cols + pad elements apart, the pad NaN */
static struct tensor fm_padded(const struct tensor *th, int pad)
{
    int cols = (int)th->ne[0], rows = (int)th->ne[1];
    size_t ldw = (size_t)cols + pad;
    uint16_t nan16 = th->type == GGML_TYPE_F16 ? 0x7E00 : 0x7FC0;
    uint16_t *h = malloc(ldw * rows * sizeof(uint16_t));
    for (int r = 0; r < rows; r++) {
        memcpy(h + r * ldw, (const uint8_t *)th->data + (size_t)r * th->row_bytes, (size_t)cols * 2);
        for (int k = cols; k < (int)ldw; k++)
            h[r * ldw + k] = nan16;
    }
    struct tensor t = *th;
    t.row_bytes = ldw * 2;
    t.data = dev_put(h, ldw * rows * sizeof(uint16_t));
    free(h);
    return t;
}

static void test_one_type(const char *name, uint32_t type)
{
    double lim = type == GGML_TYPE_F16 ? 1e-3 : 1e-2, worst_cpu = 0, worst_old = 0;
    bool quick = getenv("TIDE_TEST_QUICK") != NULL; /* small shapes only (under compute-sanitizer) */
    bool ok = true;
    for (size_t s = 0; s < sizeof(fm_shapes) / sizeof(fm_shapes[0]); s++) {
        int cols = fm_shapes[s][0], rows = fm_shapes[s][1], n = fm_shapes[s][2], pad = fm_shapes[s][3];
        int mis = fm_shapes[s][4];
        if (quick && (double)cols * rows * n > 2e7) /* the edges stay, split-K (520 x 257 x 129) too */
            continue;
        size_t ny = (size_t)n * rows;
        float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
        float *x = rand_vec((size_t)n * cols, 1.0f);
        float *y0 = rand_vec(ny, 1.0f);
        struct tensor th = make_tensor(type, cols, rows, wf);
        struct tensor td = fm_padded(&th, pad);
        float *yc = malloc(ny * sizeof(float));
        cpu.i->matmul(cpu.ctx, &th, x, yc, n);
        float *xbuf = dev_put(NULL, ((size_t)n * cols + 1) * sizeof(float));
        float *xd = xbuf + mis;
        gpu.i->upload(gpu.ctx, xd, x, (size_t)n * cols * sizeof(float));
        float *yd = dev_put(NULL, ny * sizeof(float));
        for (int add = 0; add < 2; add++) {
            float *y_old = fm_gpu(&td, xd, yd, y0, rows, n, add, false);
            float *y_new = fm_gpu(&td, xd, yd, y0, rows, n, add, true);
            float *y_again = fm_gpu(&td, xd, yd, y0, rows, n, add, true);
            if (add) /* the product alone, against the CPU's */
                for (size_t i = 0; i < ny; i++)
                    y_again[i] -= y0[i];
            double e_old = relerr(y_new, y_old, ny);
            double e_cpu = add ? relerr(y_again, yc, ny) : relerr(y_new, yc, ny);
            bool same = add || !memcmp(y_new, y_again, ny * sizeof(float));
            if (add) { /* the bit-for-bit rerun, with add: y0 + p twice */
                float *y3 = fm_gpu(&td, xd, yd, y0, rows, n, add, true);
                same = !memcmp(y_new, y3, ny * sizeof(float));
                free(y3);
            }
            if (!(e_old < 2e-5) || !(e_cpu < lim) || !same) {
                ok = false;
                printf("  %s cols %d rows %d n %d pad %d misaligned %d add %d: rel err %.3g vs wmma, %.3g vs cpu%s\n",
                       name, cols, rows, n, pad, mis, add, e_old, e_cpu, same ? "" : ", NOT deterministic");
            }
            if (e_old > worst_old) worst_old = e_old;
            if (e_cpu > worst_cpu) worst_cpu = e_cpu;
            free(y_old); free(y_new); free(y_again);
        }
        gpu.i->free(gpu.ctx, xbuf); gpu.i->free(gpu.ctx, yd); gpu.i->free(gpu.ctx, (void *)td.data);
        free(wf); free(x); free(y0); free(yc); free((void *)th.data);
    }
    printf("  %s: max rel err %.3g vs the wmma kernel (limit 2e-5), %.3g vs the CPU (limit %.0e)\n", name, worst_old,
           worst_cpu, lim);
    verdict(name, ok, "max rel err vs cpu %.3g", worst_cpu);
}

void test_f16_mma(const char *only)
{
    if (!only || strstr("matmul_f16_mma", only))
        test_one_type("matmul_f16_mma", GGML_TYPE_F16);
    if (!only || strstr("matmul_bf16_mma", only))
        test_one_type("matmul_bf16_mma", GGML_TYPE_BF16);
}

/* The same shapes (no edges): wmma kernel vs the big-tile one, us and TFLOP/s, then the big
 * tile forced to 64 / 128 tokens and without split-K. W rotated through ~1 GiB of copies. */
void bench_f16_mma(void)
{
    static const int shapes[][3] = {{1152, 1152, 3072}, {1152, 3456, 3072}, {1152, 4304, 3072}, {4304, 1152, 3072},
                                    {1152, 4304, 777},  {4304, 1152, 777},  {2048, 4096, 64},   {4096, 2048, 64},
                                    {2048, 4096, 512},  {4096, 2048, 512}};
    uint32_t types[] = {GGML_TYPE_F16, GGML_TYPE_BF16};
    bool ok = true;
    printf("  f16_mma (cols x rows, n): wmma us, mma us (auto), speed-up, TFLOP/s of each; then mma us with "
           "tile 64 / 128, and without split-K\n");
    for (int ti = 0; ti < 2; ti++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2];
            struct bench_product bp;
            if (!bench_product_make(&bp, types[ti], cols, rows, n)) { bench_product_free(&bp); ok = false; continue; }
            double flop = 2.0 * cols * rows * n;
            int om = cuda_set_f16_mma(0);
            double t_old = time_product(&bp, n);
            cuda_set_f16_mma(1);
            double t_new = time_product(&bp, n);
            printf("  %-4s %5d x %5d n %4d: %8.1f us %8.1f us  x%5.2f  %6.1f %6.1f TFLOP/s",
                   ggml_type_name(types[ti]), cols, rows, n, t_old * 1e6, t_new * 1e6, t_old / t_new,
                   flop / t_old / 1e12, flop / t_new / 1e12);
            for (int bn = 64; bn <= 128; bn *= 2) {
                cuda_set_f16_mma_tile(bn, 8);
                printf(" %8.1f", time_product(&bp, n) * 1e6);
            }
            cuda_set_f16_mma_tile(0, 1);
            printf("  nosplit %8.1f\n", time_product(&bp, n) * 1e6);
            cuda_set_f16_mma_tile(0, 8);
            fflush(stdout);
            cuda_set_f16_mma(om);
            bench_product_free(&bp);
        }
    verdict("bench_f16_mma", ok, "%g shapes", 10.0);
}

#else
void test_f16_mma(const char *only) { (void)only; }
void bench_f16_mma(void) {}
#endif
