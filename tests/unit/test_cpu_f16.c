/* test_cpu_f16.c - the CPU backend's f16 register tiles (cpu_f16.c): each (row, vector)
 * product against a double-precision reference, and the same bits whether the vector came
 * alone (decode: f16 read directly), in a batch (widened rows, 4x3 tiles, a 64-vector block
 * and the edges past them) or in another row range (a thread's share). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu_f16.h"
#include "engine/gguf.h"

enum { ROWS = 23, COLS = 203, N = 70 }; /* rows past a multiple of 4, columns past 8, vectors past 64 */

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 16) % 2000001) / 1000000.0f - 1.0f;
}

Test(cpu_f16, tiles_match_double_reference_and_give_a_vectors_bits_in_any_batch)
{
    if (!cpu_f16_fast())
        cr_skip_test("this CPU has no AVX2/F16C/FMA");
    uint16_t *w = malloc(sizeof(uint16_t) * ROWS * COLS);
    float *x = malloc(sizeof(float) * N * COLS), *y = malloc(sizeof(float) * N * ROWS);
    float *y1 = malloc(sizeof(float) * ROWS), *buf = malloc(sizeof(float) * 4 * COLS);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = tide_f32_to_f16(frand());
    for (int i = 0; i < N * COLS; i++) x[i] = 4.0f * frand();
    /* the batch as two threads' shares would split it: rows 0-9 and 10-22 */
    cpu_f16_rows((const uint8_t *)w, COLS * 2, 0, 10, x, N, COLS, y, ROWS, buf);
    cpu_f16_rows((const uint8_t *)w, COLS * 2, 10, ROWS, x, N, COLS, y, ROWS, buf);
    for (int t = 0; t < N; t++) {
        cpu_f16_rows((const uint8_t *)w, COLS * 2, 0, ROWS, x + (size_t)t * COLS, 1, COLS, y1, ROWS, buf);
        for (int r = 0; r < ROWS; r++) {
            float got = y[(size_t)t * ROWS + r];
            cr_assert(memcmp(&got, &y1[r], 4) == 0, "row %d vector %d: batch %a alone %a", r, t, got, y1[r]);
            double ref = 0, mag = 0;
            for (int i = 0; i < COLS; i++) {
                double p = (double)tide_f16_to_f32(w[r * COLS + i]) * x[(size_t)t * COLS + i];
                ref += p;
                mag += fabs(p);
            }
            cr_assert_leq(fabs(got - ref), 1e-6 * mag + 1e-7, "row %d vector %d: %g vs %g", r, t, got, ref);
        }
    }
    /* a batch of 5: one 4x3 tile and a 4x2 edge, the other vectors' bits again */
    cpu_f16_rows((const uint8_t *)w, COLS * 2, 0, ROWS, x + 7 * COLS, 5, COLS, y, ROWS, buf);
    for (int t = 0; t < 5; t++) {
        cpu_f16_rows((const uint8_t *)w, COLS * 2, 0, ROWS, x + (size_t)(7 + t) * COLS, 1, COLS, y1, ROWS, buf);
        cr_assert(memcmp(y + (size_t)t * ROWS, y1, sizeof(float) * ROWS) == 0, "batch of 5, vector %d", t);
    }
    free(w); free(x); free(y); free(y1); free(buf);
}
