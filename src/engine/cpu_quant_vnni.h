/* cpu_quant_vnni.h - AVX-512 VNNI tiles of int8 dot products for q8_0, q4_0, q5_0 and MXFP4 weights
 * (cpu_quant_vnni.c), used by cpu_quant.c's cpu_quant_rows where the CPU has them.
 *
 * A tile is eight dot products at once: eight consecutive weight rows with one activation
 * vector (decode), or one row with eight activation vectors; prefill's GEMM does 16 rows by 8
 * vectors over weights repacked for it. Each of the eight
 * results has exactly the bits cpu_quant_dot gives for its (row, vector): the integer sums
 * per block are exact, and the float combine runs in the eight lanes of a vector with the
 * scalar combine's operations in its order (no fused multiply-adds). */
#ifndef TIDE_CPU_QUANT_VNNI_H
#define TIDE_CPU_QUANT_VNNI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Activations for 32-value weight blocks: ggml's q8_0 block (f16 scale, 32 codes) plus the
 * codes' sum, which turns a signed weight code into an unsigned one for vpdpbusd (w . x =
 * (w + k) . x - k * sum x). d and sum are the first four bytes: one 32-bit gather reads both. */
struct act32 { uint16_t d; int16_t sum; int8_t q[32]; };

/* Whether this CPU (and the OS) run AVX-512 F/BW/VL with VNNI and F16C. */
bool cpu_quant_vnni_cpu(void);
/* Whether a type has VNNI tiles here (q8_0, q4_0, q5_0, q5_1, MXFP4). */
bool cpu_quant_vnni_has(uint32_t type);
/* out[k] = row (w + k * row_bytes) . x, for k < 8; nb 32-value blocks. */
void cpu_quant_vnni_rows8(uint32_t type, const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb,
                          float out[8]);
/* out[k] = row w . vector (x + k * act_stride bytes), for k < 8. */
void cpu_quant_vnni_vecs8(uint32_t type, const uint8_t *w, const struct act32 *x, size_t act_stride, int nb,
                          float out[8]);
/* Prefill: y[t * y_stride + r] = row r . vector t for rows r < rows rounded down to a multiple
 * of 16 (w + r * row_bytes) and n vectors (x + t * act_stride bytes), nb 32-value blocks: a
 * GEMM over weights repacked 16 rows at a time (worth it from about 8 vectors). */
void cpu_quant_vnni_gemm(uint32_t type, const uint8_t *w, size_t row_bytes, int rows, const struct act32 *x,
                         size_t act_stride, int n, int nb, float *y, size_t y_stride);

#endif
