/* test_quants.c - the weight block formats (quants.c) and the CPU's int8 dot products over
 * them (cpu_quant.c): dequantisation bit for bit against tests/quant/ref_dequant.py (our
 * numpy reference, written from the format spec), each dot product against a double-precision
 * reference within the error the activation quantisation allows, the SIMD kernels (AVX2, and
 * the AVX-512 VNNI tiles, and cpu_kquant.c's k-quant tiles in each shape) against the scalar one bit for
 * bit, and a matmul row's bits independent of the batch and thread count. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cpu_quant.h"
#include "engine/gguf.h"
#define TEST_RAND_SEED 88172645463325252ULL
#include "test_rand.h"

static const uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                 GGML_TYPE_MXFP4, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                                 GGML_TYPE_IQ4_XS};
#define N_TYPES (sizeof types / sizeof types[0])

static uint32_t rnd(void) { return (uint32_t)(test_rand_next() >> 16); }

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

/* w . x in double, and how far a product of the quantised forms may be from it: the
 * activations are rounded to steps of amax/127 per block (the 32-value form also rounds that
 * step to f16), so each product errs by at most |w| * 0.57 step (plus float rounding). */
static double reference_dot(uint32_t type, const float *w, const float *x, int cols, double *bound)
{
    int ab = ggml_block_size(type) == QK_K ? QK_K : 32;
    double ref = 0, err = 0, mag = 0;
    for (int b = 0; b < cols / ab; b++) {
        double amax = 0;
        for (int i = b * ab; i < (b + 1) * ab; i++) amax = fmax(amax, fabs(x[i]));
        for (int i = b * ab; i < (b + 1) * ab; i++) {
            ref += (double)w[i] * x[i];
            err += fabs(w[i]) * 0.57 * amax / 127.0;
            mag += fabs((double)w[i] * x[i]);
        }
    }
    *bound = err + 1e-5 * mag;
    return ref;
}

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
            double bound, ref = reference_dot(type, w, x, cols, &bound);
            cr_assert_leq(fabs(got - ref), bound, "%s trial %d: %g vs %g (bound %g)",
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
        /* the many-vector form (prefill: blocks unpacked once) gives each vector's bits */
        enum { NV = 18 };
        size_t ab = cpu_quant_act_bytes(type, cols);
        uint8_t *acts = malloc(ab * NV);
        float many[NV];
        for (int v = 0; v < NV; v++) {
            for (int i = 0; i < cols; i++) x[i] = frand() * (float)(1 + v);
            cpu_quant_act(type, x, cols, acts + v * ab);
        }
        cpu_quant_dot_many(type, row, acts, ab, NV, cols, many, 1, CPU_ISA_AVX2);
        for (int v = 0; v < NV; v++) {
            float one = cpu_quant_dot(type, row, acts + v * ab, cols, CPU_ISA_SCALAR);
            cr_assert(memcmp(&one, &many[v], 4) == 0, "%s vector %d: many %a one %a", ggml_type_name(type), v,
                      many[v], one);
        }
        free(acts);
        free(row); free(act); free(x);
    }
}

/* cpu_quant_rows, the matmul's share, on each ISA: the AVX-512 VNNI tiles (q8_0, q4_0, q5_0,
 * q5_1 and MXFP4: a row with eight vectors and eight rows with one; the other types fall back to
 * AVX2 there),
 * AVX2 (what a CPU without VNNI, or TIDE_CPU_ISA=avx2, runs) and scalar give the same bits,
 * and each result is within the double reference's bound. */
Test(quants, matmul_tiles_equal_on_every_isa_and_match_the_reference)
{
    enum { ROWS = 21, N = 11 }; /* a vector tile of eight and three left over; row tiles and a tail */
    enum cpu_isa isas[] = {CPU_ISA_AVX512VNNI, CPU_ISA_AVX2, CPU_ISA_SCALAR};
    if (!cpu_quant_isa_available(CPU_ISA_AVX2))
        cr_skip_test("this CPU has no AVX2");
    bool vnni = cpu_quant_isa_available(CPU_ISA_AVX512VNNI);
    if (!vnni)
        cr_log_warn("no AVX-512 VNNI here: only AVX2 and scalar are compared");
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = types[t];
        int cols = test_cols(type);
        size_t rb = ggml_row_size(type, (uint64_t)cols), ab = cpu_quant_act_bytes(type, cols);
        uint8_t *data = malloc(rb * ROWS), *acts = malloc(ab * N);
        float *w = malloc(sizeof(float) * cols * ROWS), *x = malloc(sizeof(float) * cols * N);
        float *y[3];
        random_blocks(type, data, (uint64_t)cols * ROWS, false);
        ggml_dequantize(type, data, w, (uint64_t)cols * ROWS);
        for (int v = 0; v < N; v++) {
            for (int i = 0; i < cols; i++) x[v * cols + i] = frand() * (float)(1 + v) * (i % 5 ? 1.0f : 7.0f);
            cpu_quant_act(type, x + (size_t)v * cols, cols, acts + v * ab);
        }
        for (int i = 0; i < 3; i++) {
            y[i] = calloc((size_t)ROWS * N, sizeof(float));
            if (i == 0 && !vnni)
                continue;
            /* two shares, as two threads would run them: 0-2 (no tile of rows) and 3-20 (the
             * VNNI GEMM's 16 rows, then two rows of eight-vector tiles) */
            cpu_quant_rows(type, data, rb, 0, 3, acts, ab, N, cols, y[i], ROWS, isas[i]);
            cpu_quant_rows(type, data, rb, 3, ROWS, acts, ab, N, cols, y[i], ROWS, isas[i]);
        }
        for (int v = 0; v < N; v++)
            for (int r = 0; r < ROWS; r++) {
                size_t k = (size_t)v * ROWS + r;
                if (vnni)
                    cr_assert(memcmp(&y[0][k], &y[1][k], 4) == 0, "%s row %d vector %d: vnni %a avx2 %a",
                              ggml_type_name(type), r, v, y[0][k], y[1][k]);
                cr_assert(memcmp(&y[1][k], &y[2][k], 4) == 0, "%s row %d vector %d: avx2 %a scalar %a",
                          ggml_type_name(type), r, v, y[1][k], y[2][k]);
                double bound, ref = reference_dot(type, w + (size_t)r * cols, x + (size_t)v * cols, cols, &bound);
                cr_assert_leq(fabs(y[1][k] - ref), bound, "%s row %d vector %d: %g vs %g (bound %g)",
                              ggml_type_name(type), r, v, y[1][k], ref, bound);
            }
        for (int i = 0; i < 3; i++) free(y[i]);
        free(data); free(acts); free(w); free(x);
    }
}

/* MXFP4's scale 2^(e - 128) in the VNNI tiles, built from the exponent byte in vector lanes,
 * at the exponents where mxfp4_scale's bits change form: e = 0 and 1 (subnormal floats), 2 (the
 * smallest normal) and around 127: every tile (GEMM, eight vectors, eight rows) gives the bits
 * of the AVX2 and scalar products. */
Test(quants, mxfp4_tiles_take_subnormal_and_normal_scales_bit_for_bit)
{
    enum { ROWS = 19, N = 9, COLS = 32 * 70 };
    if (!cpu_quant_isa_available(CPU_ISA_AVX512VNNI))
        cr_skip_test("no AVX-512 VNNI here: no MXFP4 tiles to test");
    static const uint8_t exps[] = {0, 1, 2, 3, 126, 127, 128, 129};
    size_t rb = ggml_row_size(GGML_TYPE_MXFP4, COLS), ab = cpu_quant_act_bytes(GGML_TYPE_MXFP4, COLS);
    uint8_t *data = malloc(rb * ROWS), *acts = malloc(ab * N);
    float *x = malloc(sizeof(float) * COLS), *y[2];
    random_blocks(GGML_TYPE_MXFP4, data, (uint64_t)COLS * ROWS, false);
    /* every third row only tiny exponents (its sum stays where they show), the rest mixed */
    for (int b = 0; b < ROWS * COLS / 32; b++)
        data[(size_t)b * MXFP4_BYTES] = exps[(b * 7 + b / 5) % ((b / (COLS / 32)) % 3 ? 8 : 4)];
    for (int v = 0; v < N; v++) {
        for (int i = 0; i < COLS; i++) x[i] = frand() * (float)(1 + v);
        cpu_quant_act(GGML_TYPE_MXFP4, x, COLS, acts + v * ab);
    }
    enum cpu_isa isas[] = {CPU_ISA_AVX512VNNI, CPU_ISA_AVX2};
    for (int i = 0; i < 2; i++) {
        y[i] = calloc((size_t)ROWS * N, sizeof(float));
        cpu_quant_rows(GGML_TYPE_MXFP4, data, rb, 0, ROWS, acts, ab, N, COLS, y[i], ROWS, isas[i]); /* GEMM + vecs8 + rows8 */
    }
    float one[ROWS]; /* eight rows with one vector (decode) */
    cpu_quant_rows(GGML_TYPE_MXFP4, data, rb, 0, ROWS, acts, ab, 1, COLS, one, 1, CPU_ISA_AVX512VNNI);
    for (int v = 0; v < N; v++)
        for (int r = 0; r < ROWS; r++) {
            size_t k = (size_t)v * ROWS + r;
            cr_assert(memcmp(&y[0][k], &y[1][k], 4) == 0, "row %d vector %d: vnni %a avx2 %a", r, v, y[0][k], y[1][k]);
            if (v == 0)
                cr_assert(memcmp(&one[r], &y[1][k], 4) == 0, "row %d alone: vnni %a avx2 %a", r, one[r], y[1][k]);
        }
    free(y[0]); free(y[1]); free(data); free(acts); free(x);
}

/* The k-quant and iq4_xs tiles (cpu_kquant.c) in every shape: AVX-512 4 rows x 4 vectors, and 16, 8 and
 * 4 rows with one vector (decode, and the vectors a group of four leaves over); AVX2 2 x 4, and
 * 8, 4 and 2 rows with one; with the rows and
 * vectors that no tile covers; each result has the bits of the 1-vector scalar product, and
 * is within the double reference's bound. Activations up to +-127 codes on blocks of 100x
 * the others, so the int16 products and the int32 sums run near their ranges. */
Test(quants, kquant_tiles_equal_the_one_vector_product_in_every_shape)
{
    /* shares 0-36 (AVX-512 16+16+4+1, AVX2 8x4+4+1) and 37-46 (8+2) */
    enum { ROWS = 47, N = 13, SPLIT = 37 };
    static const uint32_t ktypes[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS};
    static const enum cpu_isa isas[] = {CPU_ISA_AVX512VNNI, CPU_ISA_AVX2};
    if (!cpu_quant_isa_available(CPU_ISA_AVX2))
        cr_skip_test("this CPU has no AVX2: no k-quant tiles to test");
    if (!cpu_quant_isa_available(CPU_ISA_AVX512VNNI))
        cr_log_warn("no AVX-512 VNNI here: only the AVX2 tiles are tested");
    for (size_t t = 0; t < sizeof ktypes / sizeof ktypes[0]; t++) {
        uint32_t type = ktypes[t];
        int cols = 256 * 5;
        size_t rb = ggml_row_size(type, (uint64_t)cols), ab = cpu_quant_act_bytes(type, cols);
        uint8_t *data = malloc(rb * ROWS), *acts = malloc(ab * N);
        float *w = malloc(sizeof(float) * cols * ROWS), *x = malloc(sizeof(float) * cols * N);
        float *y = calloc((size_t)ROWS * N, sizeof(float)), *y1 = calloc(ROWS, sizeof(float));
        random_blocks(type, data, (uint64_t)cols * ROWS, false);
        ggml_dequantize(type, data, w, (uint64_t)cols * ROWS);
        for (int v = 0; v < N; v++) {
            for (int i = 0; i < cols; i++)
                x[v * cols + i] = frand() * (float)(1 + v) * ((i / 256 + v) % 3 ? 1.0f : 100.0f);
            cpu_quant_act(type, x + (size_t)v * cols, cols, acts + v * ab);
        }
        for (int i = 0; i < 2; i++) {
            enum cpu_isa isa = isas[i];
            if (!cpu_quant_isa_available(isa))
                continue;
            memset(y, 0, sizeof(float) * ROWS * N);
            cpu_quant_rows(type, data, rb, 0, SPLIT, acts, ab, N, cols, y, ROWS, isa);
            cpu_quant_rows(type, data, rb, SPLIT, ROWS, acts, ab, N, cols, y, ROWS, isa);
            for (int v = 0; v < N; v++) {
                /* the same vector alone (decode): the one-vector tiles */
                cpu_quant_rows(type, data, rb, 0, SPLIT, acts + v * ab, ab, 1, cols, y1, ROWS, isa);
                cpu_quant_rows(type, data, rb, SPLIT, ROWS, acts + v * ab, ab, 1, cols, y1, ROWS, isa);
                for (int r = 0; r < ROWS; r++) {
                    size_t k = (size_t)v * ROWS + r;
                    float one = cpu_quant_dot(type, data + r * rb, acts + v * ab, cols, CPU_ISA_SCALAR);
                    cr_assert(memcmp(&y[k], &one, 4) == 0, "%s isa %d row %d vector %d: tile %a scalar %a",
                              ggml_type_name(type), isa, r, v, y[k], one);
                    cr_assert(memcmp(&y1[r], &one, 4) == 0, "%s isa %d row %d vector %d alone: tile %a scalar %a",
                              ggml_type_name(type), isa, r, v, y1[r], one);
                    double bound, ref = reference_dot(type, w + (size_t)r * cols, x + (size_t)v * cols, cols, &bound);
                    cr_assert_leq(fabs(y[k] - ref), bound, "%s row %d vector %d: %g vs %g (bound %g)",
                                  ggml_type_name(type), r, v, y[k], ref, bound);
                }
            }
        }
        free(data); free(acts); free(w); free(x); free(y); free(y1);
    }
}

/* The prefill GEMM (cpu_quant_vnni_gemm: q8_0, q4_0, q5_0, q5_1 and MXFP4 rows repacked 16 at a time) through
 * cpu_quant_rows: shares of 20 and 17 rows (a 16-row group and rows left for the 8-vector
 * tiles), 19 vectors (two 8-vector tiles and 3 left), 75 blocks (two repacked chunks). Every
 * result has AVX2's bits and a lone vector's (decode: 8-row tiles), within the reference's
 * bound. */
Test(quants, prefill_gemm_gives_avx2s_and_a_lone_vectors_bits)
{
    enum { ROWS = 37, N = 19 };
    if (!cpu_quant_isa_available(CPU_ISA_AVX512VNNI))
        cr_skip_test("this CPU has no AVX-512 VNNI");
    const uint32_t gemm_types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_MXFP4};
    for (size_t ti = 0; ti < sizeof gemm_types / sizeof gemm_types[0]; ti++) {
        uint32_t type = gemm_types[ti];
        int cols = test_cols(type);
        size_t rb = ggml_row_size(type, (uint64_t)cols), ab = cpu_quant_act_bytes(type, cols);
        uint8_t *data = malloc(rb * ROWS), *acts = malloc(ab * N);
        float *w = malloc(sizeof(float) * cols * ROWS), *x = malloc(sizeof(float) * cols * N);
        float *yv = calloc((size_t)ROWS * N, sizeof(float)), *ya = calloc((size_t)ROWS * N, sizeof(float));
        float *y1 = calloc(ROWS, sizeof(float));
        random_blocks(type, data, (uint64_t)cols * ROWS, false);
        ggml_dequantize(type, data, w, (uint64_t)cols * ROWS);
        for (int v = 0; v < N; v++) {
            for (int i = 0; i < cols; i++) x[v * cols + i] = frand() * (float)(1 + v) * (i % 5 ? 1.0f : 7.0f);
            cpu_quant_act(type, x + (size_t)v * cols, cols, acts + v * ab);
        }
        cpu_quant_rows(type, data, rb, 0, 20, acts, ab, N, cols, yv, ROWS, CPU_ISA_AVX512VNNI);
        cpu_quant_rows(type, data, rb, 20, ROWS, acts, ab, N, cols, yv, ROWS, CPU_ISA_AVX512VNNI);
        cpu_quant_rows(type, data, rb, 0, ROWS, acts, ab, N, cols, ya, ROWS, CPU_ISA_AVX2);
        for (int v = 0; v < N; v++) {
            cpu_quant_rows(type, data, rb, 0, ROWS, acts + v * ab, ab, 1, cols, y1, ROWS, CPU_ISA_AVX512VNNI);
            for (int r = 0; r < ROWS; r++) {
                size_t k = (size_t)v * ROWS + r;
                cr_assert(memcmp(&yv[k], &ya[k], 4) == 0, "%s row %d vector %d: gemm %a avx2 %a",
                          ggml_type_name(type), r, v, yv[k], ya[k]);
                cr_assert(memcmp(&yv[k], &y1[r], 4) == 0, "%s row %d vector %d: gemm %a alone %a",
                          ggml_type_name(type), r, v, yv[k], y1[r]);
                double bound, ref = reference_dot(type, w + (size_t)r * cols, x + (size_t)v * cols, cols, &bound);
                cr_assert_leq(fabs(yv[k] - ref), bound, "%s row %d vector %d: %g vs %g (bound %g)",
                              ggml_type_name(type), r, v, yv[k], ref, bound);
            }
        }
        free(data); free(acts); free(w); free(x); free(yv); free(ya); free(y1);
    }
}

/* The activations' quantisation gives the same bytes with AVX2 as in C (the 256-value form:
 * cpu_kquant.c): random blocks,
 * blocks of zeros, and blocks whose codes land on halves (amax 127: v * id = v), where
 * rounding to nearest even must agree. */
Test(quants, activation_quantisation_is_the_same_bytes_on_every_isa)
{
    if (!cpu_quant_isa_available(CPU_ISA_AVX2))
        cr_skip_test("this CPU has no AVX2");
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = types[t];
        int cols = test_cols(type);
        size_t ab = cpu_quant_act_bytes(type, cols);
        uint8_t *a = malloc(ab), *b = malloc(ab);
        float *x = malloc(sizeof(float) * cols);
        for (int i = 0; i < cols; i++) {
            int blk = i / 32;
            x[i] = blk % 3 == 0 ? frand() * 50.0f : blk % 3 == 1 ? 0.0f : (float)((int)(rnd() % 255) - 127) + 0.5f;
            if (blk % 3 == 2 && i % 32 == 0) x[i] = 127.0f;
        }
        cpu_quant_act_isa(type, x, cols, a, CPU_ISA_SCALAR);
        cpu_quant_act_isa(type, x, cols, b, CPU_ISA_AVX2);
        cr_assert(memcmp(a, b, ab) == 0, "%s: the quantised activations differ", ggml_type_name(type));
        free(a); free(b); free(x);
    }
}

/* Continuous batching runs a sequence's row in whatever batch it lands in: the bits of a
 * row's product must not depend on n or on the thread split. */
Test(quants, matmul_rows_do_not_depend_on_the_batch_or_threads)
{
    enum { ROWS = 37, N = 19 }; /* past one 16-vector group of cpu_quant_dot_many */
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

/* ---- whole models: a llama-quantize mix against the same weights in f32 ---- */
#include "engine/forward.h"
#include "engine/modelgen.h"
#include "engine/quant_mix.h"

static void make_model(const char *path, int type, int mix, bool as_f32)
{
    /* 256 wide everywhere, so the k-quants (not their 32-value fallbacks) are what runs */
    struct modelgen_options o = {.preset = "moe", .out = path, .seed = 5, .type = type, .mix = mix,
                                 .n_embd = 256, .n_ff = 256, .n_layer = 4, .n_head = 4, .n_head_kv = 2,
                                 .mix_as_f32 = as_f32};
    char err[256] = "";
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy tokens and step-0 logits of each mix against the same weights as f32 (the mix's
 * values dequantised at write time): what differs is tide's int8 compute. (Against the
 * unquantised f32 model this random 8-expert model is chaotic: q8_0 weights alone move the
 * logits 2.7%, and 4-5 bit weights flip the top-2 routing, 35%.) Relative error is the
 * largest logit difference over the largest logit. */
Test(quants, mixed_models_follow_the_f32_model)
{
    char ref_path[64], mix_path[64];
    snprintf(ref_path, sizeof ref_path, "/tmp/tide-mix-f32-%d.gguf", (int)getpid());
    snprintf(mix_path, sizeof mix_path, "/tmp/tide-mix-q-%d.gguf", (int)getpid());
    const int mixes[] = {QUANT_MIX_Q4_K_M, QUANT_MIX_Q5_K_M, QUANT_MIX_Q6_K};
    for (int mi = 0; mi < 3; mi++) {
        make_model(ref_path, GGML_TYPE_F32, mixes[mi], true);
        make_model(mix_path, GGML_TYPE_F32, mixes[mi], false);
        struct model m[2];
        char err[256];
        cr_assert_eq(model_load(&m[0], ref_path, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_load(&m[1], mix_path, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_first_type_of(&m[1], GGML_TYPE_Q6_K, GGML_TYPE_Q6_K), GGML_TYPE_Q6_K);
        struct backend be;
        cr_assert_eq(backend_cpu_init(&be, 2), 0);
        struct forward_state f[2];
        int V = (int)m[0].cfg.n_vocab, prompt[5] = {11, 250, 37, 400, 99}, tok[2];
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(forward_init(&f[k], &m[k], be, 64), 0);
            cr_assert_eq(forward_eval(&f[k], prompt, 5, 0), 0);
        }
        double md = 0, mx = 0;
        for (int i = 0; i < V; i++) {
            md = fmax(md, fabs(f[0].logits[i] - f[1].logits[i]));
            mx = fmax(mx, fabs(f[0].logits[i]));
        }
        cr_log_info("%s: step-0 logits rel err %g", quant_mix_name(mixes[mi]), md / mx);
        cr_assert_lt(md / mx, 0.05, "%s: step-0 logits rel err %g", quant_mix_name(mixes[mi]), md / mx);
        for (int step = 0; step < 6; step++) {
            for (int k = 0; k < 2; k++) tok[k] = argmax(f[k].logits, V);
            cr_assert_eq(tok[0], tok[1], "%s: greedy token %d differs", quant_mix_name(mixes[mi]), step);
            for (int k = 0; k < 2; k++) cr_assert_eq(forward_eval(&f[k], &tok[k], 1, 5 + step), 0);
        }
        for (int k = 0; k < 2; k++) {
            forward_free(&f[k]);
            model_free(&m[k]);
        }
        backend_cpu_free(&be);
    }
    unlink(ref_path);
    unlink(mix_path);
}

/* llama-quantize's choices (src/llama-quant.cpp) for a dense 32-layer model and an 8-expert one */
Test(quants, mix_rules_follow_llama_quantize)
{
    const uint32_t K4 = GGML_TYPE_Q4_K, K5 = GGML_TYPE_Q5_K, K6 = GGML_TYPE_Q6_K, Q8 = GGML_TYPE_Q8_0;
    enum quant_mix m4 = QUANT_MIX_Q4_K_M, m5 = QUANT_MIX_Q5_K_M, m6 = QUANT_MIX_Q6_K;
    /* dense, 32 layers: more bits on layers 0-3, 28-31 and 6, 9, ... */
    cr_assert_eq(quant_mix_type(m4, "token_embd.weight", 2, 4096, 32, 0, 0), K4);
    cr_assert_eq(quant_mix_type(m4, "output.weight", 2, 4096, 32, 0, 0), K6);
    cr_assert_eq(quant_mix_type(m4, "blk.0.attn_v.weight", 2, 4096, 32, 0, 0), K6);
    cr_assert_eq(quant_mix_type(m4, "blk.5.attn_v.weight", 2, 4096, 32, 0, 0), K4);
    cr_assert_eq(quant_mix_type(m4, "blk.6.attn_v.weight", 2, 4096, 32, 0, 0), K6);
    cr_assert_eq(quant_mix_type(m4, "blk.29.ffn_down.weight", 2, 14336, 32, 0, 0), K6);
    cr_assert_eq(quant_mix_type(m4, "blk.10.ffn_down.weight", 2, 14336, 32, 0, 0), K4);
    cr_assert_eq(quant_mix_type(m4, "blk.10.attn_output.weight", 2, 4096, 32, 0, 0), K4);
    cr_assert_eq(quant_mix_type(m5, "blk.10.attn_q.weight", 2, 4096, 32, 0, 0), K5);
    cr_assert_eq(quant_mix_type(m5, "blk.9.ffn_down.weight", 2, 14336, 32, 0, 0), K6);
    cr_assert_eq(quant_mix_type(m6, "blk.9.ffn_up.weight", 2, 4096, 32, 0, 0), K6);
    /* not quantised */
    cr_assert_eq(quant_mix_type(m4, "blk.1.attn_norm.weight", 1, 4096, 32, 0, GGML_TYPE_F32), GGML_TYPE_F32);
    cr_assert_eq(quant_mix_type(m4, "blk.1.ffn_gate_inp.weight", 2, 4096, 32, 8, GGML_TYPE_F32), GGML_TYPE_F32);
    /* 8 experts: k and v q8_0 in every mix, attn_output q5_K in Q4_K_M */
    cr_assert_eq(quant_mix_type(m4, "blk.7.attn_k.weight", 2, 4096, 32, 8, 0), Q8);
    cr_assert_eq(quant_mix_type(m6, "blk.7.attn_v.weight", 2, 4096, 32, 8, 0), Q8);
    cr_assert_eq(quant_mix_type(m4, "blk.7.attn_output.weight", 2, 4096, 32, 8, 0), K5);
    cr_assert_eq(quant_mix_type(m5, "blk.7.attn_output.weight", 2, 4096, 32, 8, 0), K5);
    cr_assert_eq(quant_mix_type(m4, "blk.8.ffn_down_exps.weight", 3, 14336, 32, 8, 0), K4);
    cr_assert_eq(quant_mix_type(m4, "blk.9.ffn_down_exps.weight", 3, 14336, 32, 8, 0), K6);
    /* rows not whole super-blocks fall back */
    cr_assert_eq(quant_mix_type(m4, "blk.1.attn_q.weight", 2, 128, 4, 0, 0), GGML_TYPE_Q5_0);
    cr_assert_eq(quant_mix_type(m5, "blk.1.attn_q.weight", 2, 128, 4, 0, 0), GGML_TYPE_Q5_1);
    cr_assert_eq(quant_mix_type(m6, "blk.1.attn_q.weight", 2, 128, 4, 0, 0), Q8);
    cr_assert_eq(quant_mix_type(m4, "output.weight", 2, 128, 4, 0, 0), Q8);
    cr_assert_eq(quant_mix_type(m4, "blk.1.attn_q.weight", 2, 48, 4, 0, 0), GGML_TYPE_F16);
    cr_assert_eq(quant_mix_parse("q4_k_m"), QUANT_MIX_Q4_K_M);
    cr_assert_eq(quant_mix_parse("Q3_K_M"), -1);
}
