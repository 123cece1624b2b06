/* cpu_f16.h - f16 weight rows times f32 vectors as register tiles, for the CPU backend's
 * matmul on CPUs with AVX2, F16C and FMA, in AVX-512 registers where the CPU has them
 * (cpu_f16.c). Each (row, vector) result has the same bits whatever the batch, tile, thread or
 * instruction set. And the f16 <-> f32 conversions of the f16 KV cache (F16C where the CPU has
 * it, the same bits without). */
#ifndef TIDE_CPU_F16_H
#define TIDE_CPU_F16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_quant.h" /* enum cpu_isa */

/* Whether this CPU runs cpu_f16_rows. */
bool cpu_f16_fast(void);
/* Whether this CPU runs the AVX-512 tiles (AVX-512 F, VL, DQ besides cpu_f16_fast's). */
bool cpu_f16_wide_cpu(void);
/* y[t * y_stride + r] = row r . x_t for rows r0 <= r < r1 of an f16 matrix (row_bytes apart
 * from w) and n vectors of cols floats (x_t at x + t * cols); buf: 8 * cols floats of scratch.
 * AVX-512 tiles where the CPU has them and TIDE_CPU_ISA does not cap it (cpu_quant.h). */
void cpu_f16_rows(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                  size_t y_stride, float *buf);
/* The same with the tiles of isa: CPU_ISA_AVX512VNNI the AVX-512 ones (where the CPU has
 * them), anything else AVX2's; the bits are the same (for tests). */
void cpu_f16_rows_isa(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                      size_t y_stride, float *buf, enum cpu_isa isa);

/* dst[0..n) = src rounded to f16: to nearest, ties to even (as F16C's cvtps2ph and CUDA's
 * __float2half_rn: every backend stores the same bits); overflow gives inf, NaN stays NaN. */
void cpu_f16_from_f32(uint16_t *dst, const float *src, size_t n);
/* dst[0..n) = src widened to f32 (exact). */
void cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n);
/* One value each way, portable C (the reference the fast forms agree with): gguf.h's
 * tide_f32_to_f16 and tide_f16_to_f32. */
uint16_t cpu_f16_round(float f);
float cpu_f16_widen(uint16_t h);

#endif
