/* test_cpu_f16.c - the CPU backend's f16 register tiles (cpu_f16.c): each (row, vector)
 * product against a double-precision reference, and the same bits whether the vector came
 * alone (decode: f16 read directly), in a batch (widened rows, 4x3 tiles or AVX-512's 8x4, a
 * 64-vector block and the edges past them; 2-4 vectors read directly on AVX-512), in another row range (a thread's share) or with
 * the other instruction set's tiles (AVX2 and AVX-512: TIDE_CPU_ISA, or the CPU, picks). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu_f16.h"
#include "engine/gguf.h"
#define TEST_RAND_SEED 0x2545f4914f6cdd1dULL
#include "test_rand.h"

/* rows past a multiple of 4 and 8, columns past 8 and over two of the AVX-512 tiles' 512-column
 * blocks, vectors past 64 */
enum { ROWS = 23, COLS = 1107, N = 70 };

/* One ISA's run: the batch in two shares, every vector alone, a batch of 5; returns y (N x ROWS). */
static void check_isa(const uint16_t *w, const float *x, float *y, enum cpu_isa isa)
{
    float *y1 = malloc(sizeof(float) * ROWS), *buf = malloc(sizeof(float) * 8 * COLS);
    const char *name = isa == CPU_ISA_AVX512VNNI ? "avx512" : "avx2";
    /* the batch as two threads' shares would split it: rows 0-9 and 10-22 (an 8-row tile and
     * 2 rows left, one tile and 5 left) */
    cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 0, 10, x, N, COLS, y, ROWS, buf, isa);
    cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 10, ROWS, x, N, COLS, y, ROWS, buf, isa);
    for (int t = 0; t < N; t++) {
        cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 0, ROWS, x + (size_t)t * COLS, 1, COLS, y1, ROWS, buf, isa);
        for (int r = 0; r < ROWS; r++) {
            float got = y[(size_t)t * ROWS + r];
            cr_assert(memcmp(&got, &y1[r], 4) == 0, "%s row %d vector %d: batch %a alone %a", name, r, t, got, y1[r]);
            double ref = 0, mag = 0;
            for (int i = 0; i < COLS; i++) {
                double p = (double)tide_f16_to_f32(w[r * COLS + i]) * x[(size_t)t * COLS + i];
                ref += p;
                mag += fabs(p);
            }
            cr_assert_leq(fabs(got - ref), 1e-6 * mag + 1e-7, "%s row %d vector %d: %g vs %g", name, r, t, got, ref);
        }
    }
    /* a batch of 5: a full tile and an edge (4x3 and 4x2; 8x4 and 8x1), the bits again */
    float *y5 = malloc(sizeof(float) * 5 * ROWS);
    cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 0, ROWS, x + 7 * COLS, 5, COLS, y5, ROWS, buf, isa);
    cr_assert(memcmp(y5, y + (size_t)7 * ROWS, sizeof(float) * 5 * ROWS) == 0, "%s: batch of 5", name);
    /* batches of 2, 3 and 4 (a decode step of a few sequences, an expert's few tokens: AVX-512
     * reads the rows directly, tile_direct), whole and in two shares, the bits again */
    for (int nb = 2; nb <= 4; nb++) {
        memset(y5, 0, sizeof(float) * 5 * ROWS);
        cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 0, ROWS, x + 11 * COLS, nb, COLS, y5, ROWS, buf, isa);
        cr_assert(memcmp(y5, y + (size_t)11 * ROWS, sizeof(float) * nb * ROWS) == 0, "%s: batch of %d", name, nb);
        memset(y5, 0, sizeof(float) * 5 * ROWS);
        cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 0, 10, x + 11 * COLS, nb, COLS, y5, ROWS, buf, isa);
        cpu_f16_rows_isa((const uint8_t *)w, COLS * 2, 10, ROWS, x + 11 * COLS, nb, COLS, y5, ROWS, buf, isa);
        cr_assert(memcmp(y5, y + (size_t)11 * ROWS, sizeof(float) * nb * ROWS) == 0, "%s: batch of %d in shares",
                  name, nb);
    }
    free(y1); free(buf); free(y5);
}

Test(cpu_f16, tiles_match_double_reference_and_give_a_vectors_bits_in_any_batch_and_isa)
{
    if (!cpu_f16_fast())
        cr_skip_test("this CPU has no AVX2/F16C/FMA");
    if (!cpu_f16_wide_cpu())
        cr_log_warn("no AVX-512 here: only the AVX2 tiles are checked");
    uint16_t *w = malloc(sizeof(uint16_t) * ROWS * COLS);
    float *x = malloc(sizeof(float) * N * COLS), *y2 = malloc(sizeof(float) * N * ROWS);
    float *y5 = malloc(sizeof(float) * N * ROWS), *yd = malloc(sizeof(float) * N * ROWS);
    float *buf = malloc(sizeof(float) * 8 * COLS);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = tide_f32_to_f16(frand());
    for (int i = 0; i < N * COLS; i++) x[i] = 4.0f * frand();
    check_isa(w, x, y2, CPU_ISA_AVX2);
    if (cpu_f16_wide_cpu()) {
        check_isa(w, x, y5, CPU_ISA_AVX512VNNI);
        cr_assert(memcmp(y2, y5, sizeof(float) * N * ROWS) == 0, "avx2 and avx512 tiles differ");
    }
    /* the default dispatch (what TIDE_CPU_ISA and the CPU pick) gives the same bits too */
    cpu_f16_rows((const uint8_t *)w, COLS * 2, 0, ROWS, x, N, COLS, yd, ROWS, buf);
    cr_assert(memcmp(y2, yd, sizeof(float) * N * ROWS) == 0, "default dispatch (%s) differs", cpu_quant_isa_name());
    free(w); free(x); free(y2); free(y5); free(yd); free(buf);
}
