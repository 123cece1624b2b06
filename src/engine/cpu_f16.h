/* cpu_f16.h - f16 weight rows times f32 vectors as register tiles, for the CPU backend's
 * matmul on CPUs with AVX2, F16C and FMA (cpu_f16.c). Each (row, vector) result has the same
 * bits whatever the batch, tile or thread. */
#ifndef TIDE_CPU_F16_H
#define TIDE_CPU_F16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this CPU runs cpu_f16_rows. */
bool cpu_f16_fast(void);
/* y[t * y_stride + r] = row r . x_t for rows r0 <= r < r1 of an f16 matrix (row_bytes apart
 * from w) and n vectors of cols floats (x_t at x + t * cols); buf: 4 * cols floats of scratch. */
void cpu_f16_rows(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                  size_t y_stride, float *buf);

#endif
