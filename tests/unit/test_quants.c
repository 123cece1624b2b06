/* test_quants.c - the weight block formats (quants.c) and the CPU's int8 dot products over
 * them (cpu_quant.c): dequantisation bit for bit against tests/quant/ref_dequant.py (our
 * numpy reference, written from the format spec), each dot product against a double-precision
 * reference within the error the activation quantisation allows, the SIMD kernels against the
 * scalar one bit for bit, and a matmul row's bits independent of the batch and thread count. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cpu_quant.h"
#include "engine/gguf.h"

static const uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                 GGML_TYPE_MXFP4, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                                 GGML_TYPE_IQ4_XS};
#define N_TYPES (sizeof types / sizeof types[0])

static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = tide_f32_to_f16(f);
    p[0] = h & 0xff;
    p[1] = h >> 8;
}

/* n values of random blocks of type: every code bit random, the float scales finite and of
 * both signs (file scales need not be positive). wide_exp: MXFP4 exponents over all 256. */
static void random_blocks(uint32_t type, uint8_t *dst, uint64_t n, bool wide_exp)
{
    uint32_t bs = ggml_block_size(type);
    size_t bb = ggml_row_size(type, bs);
    for (uint64_t b = 0; b < n / bs; b++) {
        uint8_t *p = dst + b * bb;
        for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)rnd();
        switch (type) {
        case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
            put_f16(p + 2, frand() * 0.01f);
            /* fall through */
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_IQ4_XS:
            put_f16(p, frand() * 0.01f);
            break;
        case GGML_TYPE_Q6_K: put_f16(p + 208, frand() * 0.01f); break;
        case GGML_TYPE_MXFP4: p[0] = wide_exp ? p[0] : (uint8_t)(118 + rnd() % 8); break;
        }
    }
}

Test(quants, dequantise_matches_the_numpy_reference)
{
    if (access("/usr/bin/python3", X_OK) != 0 || access("tests/quant/ref_dequant.py", R_OK) != 0)
        cr_skip_test("needs /usr/bin/python3 and the repository root as the working directory");
    char path[] = "/tmp/tide-quants-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    cr_assert(f);
    for (size_t t = 0; t < N_TYPES; t++) {
        for (int pass = 0; pass < 2; pass++) { /* random codes, then a quantised ramp */
            uint32_t n = 256 * 12;
            size_t nbytes = ggml_row_size(types[t], n);
            uint8_t *raw = malloc(nbytes);
            float *out = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float));
            if (pass == 0) {
                random_blocks(types[t], raw, n, true);
            } else {
                for (uint32_t i = 0; i < n; i++) x[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i % 97));
                cr_assert_eq(ggml_quantize(types[t], x, raw, n), nbytes, "%s", ggml_type_name(types[t]));
            }
            ggml_dequantize(types[t], raw, out, n);
            uint64_t nb64 = nbytes;
            fwrite(&types[t], 4, 1, f);
            fwrite(&n, 4, 1, f);
            fwrite(&nb64, 8, 1, f);
            fwrite(raw, 1, nbytes, f);
            fwrite(out, 4, n, f);
            free(raw);
            free(out);
            free(x);
        }
    }
    cr_assert_eq(fclose(f), 0);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/quant/ref_dequant.py %s", path);
    int rc = system(cmd);
    unlink(path);
    cr_assert_eq(rc, 0, "ref_dequant.py found differences (its output is above)");
}

/* Quantising then dequantising keeps each value near the original: the writer's quantisers
 * are what the test models are made with. */
Test(quants, quantise_round_trip_is_close)
{
    enum { N = 1024 };
    float x[N], y[N];
    uint8_t q[N * 2];
    for (int i = 0; i < N; i++) x[i] = frand();
    for (size_t t = 0; t < N_TYPES; t++) {
        cr_assert_gt(ggml_quantize(types[t], x, q, N), 0);
        ggml_dequantize(types[t], q, y, N);
        double err = 0, ref = 0;
        for (int i = 0; i < N; i++) {
            err += (double)(x[i] - y[i]) * (x[i] - y[i]);
            ref += (double)x[i] * x[i];
        }
        double rel = sqrt(err / ref);
        /* 8-bit: ~1%; 4-bit non-linear and fp4: ~10-15% */
        cr_assert_lt(rel, types[t] == GGML_TYPE_Q8_0 ? 0.01 : 0.2, "%s: relative rms error %g",
                     ggml_type_name(types[t]), rel);
    }
}

/* cols for a type: a block count past one integer-sum chunk (64) with a tail past a multiple
 * of eight, so every loop of the kernels runs. */
static int test_cols(uint32_t type) { return ggml_block_size(type) == QK_K ? 256 * 70 : 32 * 75; }

Test(quants, dot_products_match_a_double_reference)
{
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = types[t];
        int cols = test_cols(type);
        size_t rb = ggml_row_size(type, (uint64_t)cols);
        uint8_t *row = malloc(rb), *act = malloc(cpu_quant_act_bytes(type, cols));
        float *w = malloc(cols * sizeof(float)), *x = malloc(cols * sizeof(float));
        for (int trial = 0; trial < 4; trial++) {
            random_blocks(type, row, (uint64_t)cols, false);
            ggml_dequantize(type, row, w, (uint64_t)cols);
            for (int i = 0; i < cols; i++) x[i] = frand() * (trial == 3 ? 100.0f : 1.0f) * (i % 7 ? 1.0f : 5.0f);
            cpu_quant_act(type, x, cols, act);
            float got = cpu_quant_dot(type, row, act, cols, CPU_ISA_SCALAR);
            /* the activations are rounded to steps of amax/127 per block (the 32-value form
             * also rounds that step to f16): each product errs by at most |w| * 0.57 step */
            int ab = ggml_block_size(type) == QK_K ? QK_K : 32;
            double ref = 0, bound = 0, mag = 0;
            for (int b = 0; b < cols / ab; b++) {
                double amax = 0;
                for (int i = b * ab; i < (b + 1) * ab; i++) amax = fmax(amax, fabs(x[i]));
                for (int i = b * ab; i < (b + 1) * ab; i++) {
                    ref += (double)w[i] * x[i];
                    bound += fabs(w[i]) * 0.57 * amax / 127.0;
                    mag += fabs((double)w[i] * x[i]);
                }
            }
            cr_assert_leq(fabs(got - ref), bound + 1e-5 * mag, "%s trial %d: %g vs %g (bound %g)",
                          ggml_type_name(type), trial, got, ref, bound);
            cr_assert_gt(fabs(ref), 0);
        }
        free(row); free(act); free(w); free(x);
    }
}

Test(quants, simd_kernels_equal_the_scalar_one_bit_for_bit)
{
    if (!cpu_quant_isa_available(CPU_ISA_AVX2))
        cr_skip_test("this CPU has no AVX2");
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = types[t];
        int cols = test_cols(type);
        uint8_t *row = malloc(ggml_row_size(type, (uint64_t)cols)), *act = malloc(cpu_quant_act_bytes(type, cols));
        float *x = malloc(cols * sizeof(float));
        for (int trial = 0; trial < 8; trial++) {
            random_blocks(type, row, (uint64_t)cols, trial & 1);
            for (int i = 0; i < cols; i++) x[i] = frand() * (float)(1 + trial);
            cpu_quant_act(type, x, cols, act);
            float a = cpu_quant_dot(type, row, act, cols, CPU_ISA_SCALAR);
            float b = cpu_quant_dot(type, row, act, cols, CPU_ISA_AVX2);
            cr_assert(memcmp(&a, &b, 4) == 0, "%s trial %d: scalar %a avx2 %a", ggml_type_name(type), trial, a, b);
        }
        free(row); free(act); free(x);
    }
}

/* Continuous batching runs a sequence's row in whatever batch it lands in: the bits of a
 * row's product must not depend on n or on the thread split. */
Test(quants, matmul_rows_do_not_depend_on_the_batch_or_threads)
{
    enum { ROWS = 37, N = 5 };
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = types[t];
        int cols = ggml_block_size(type) == QK_K ? 512 : 96;
        size_t rb = ggml_row_size(type, (uint64_t)cols);
        uint8_t *data = malloc(rb * ROWS);
        random_blocks(type, data, (uint64_t)cols * ROWS, false);
        struct tensor w = {.type = type, .ne = {(uint64_t)cols, ROWS}, .data = data, .row_bytes = rb};
        float *x = malloc(sizeof(float) * cols * N), *y1 = malloc(sizeof(float) * ROWS), *yn = malloc(sizeof(float) * ROWS * N);
        for (int i = 0; i < cols * N; i++) x[i] = frand();
        for (int threads = 1; threads <= 3; threads++) {
            struct backend be;
            cr_assert_eq(backend_cpu_init(&be, threads), 0);
            be.i->matmul(be.ctx, &w, x, yn, N);
            for (int k = 0; k < N; k++) {
                be.i->matmul(be.ctx, &w, x + (size_t)k * cols, y1, 1);
                cr_assert(memcmp(y1, yn + (size_t)k * ROWS, sizeof(float) * ROWS) == 0,
                          "%s, %d threads: vector %d alone differs from it in a batch of %d",
                          ggml_type_name(type), threads, k, N);
                for (int r = 0; r < ROWS; r++) { /* and it is the kernel's own result */
                    uint8_t act[8192];
                    cpu_quant_act(type, x + (size_t)k * cols, cols, act);
                    float d = cpu_quant_dot(type, data + r * rb, act, cols, CPU_ISA_SCALAR);
                    cr_assert(memcmp(&d, &y1[r], 4) == 0);
                }
            }
            backend_cpu_free(&be);
        }
        free(data); free(x); free(y1); free(yn);
    }
}
