/* cpu_kquant.h - register tiles of int8 dot products for the k-quants q4_K, q5_K and q6_K, and iq4_xs
 * (cpu_kquant.c), used by cpu_quant.c's cpu_quant_rows: AVX-512 VNNI tiles where the CPU has
 * it, AVX2 ones where it has AVX2.
 *
 * A tile is up to sixteen dot products at once (eight with AVX2): R consecutive weight rows
 * with V activation vectors (4 x 4 for prefill, 16 x 1 for decode; AVX2 2 x 4 and 8 x 1). Each result has exactly the bits
 * cpu_quant_dot gives for its (row, vector): the integer sums per super-block are exact, and
 * the float combine runs in the sixteen lanes of a vector with the scalar combine's
 * operations in its order (no fused multiply-adds). */
#ifndef TIDE_CPU_KQUANT_H
#define TIDE_CPU_KQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* Activations for 256-value super-blocks: f32 scale, the sums of each 16 codes (for the
 * weights' mins and offsets), 256 codes. Made by cpu_quant_act. */
struct act256 { float d; int16_t bsum[16]; int8_t q[QK_K]; };

/* Whether this CPU runs the AVX2 tiles: AVX2 and F16C. */
bool cpu_kquant_avx2_cpu(void);
/* cpu_quant_act for the 256-value blocks with AVX2 (the same bytes): nb blocks of x into o.
 * Only where cpu_kquant_avx2_cpu(). */
void cpu_kquant_act(const float *x, int nb, struct act256 *o);
/* Whether a type has tiles here (q4_K, q5_K, q6_K, iq4_xs). */
bool cpu_kquant_has(uint32_t type);
/* The matmul's share, as cpu_quant_rows: y[t * y_stride + r] for r0 <= r < r1 and t < n,
 * each exactly what cpu_quant_dot gives; rows and vectors the tiles leave over go through
 * cpu_quant_dot. avx512: the AVX-512 tiles (where cpu_quant_vnni_cpu(): AVX-512 F/BW/VL, VNNI, F16C), else the AVX2 ones (where
 * cpu_kquant_avx2_cpu()); only for a type cpu_kquant_has. */
void cpu_kquant_rows(uint32_t type, const uint8_t *w, size_t row_bytes, int r0, int r1, const uint8_t *act,
                     size_t act_stride, int n, int cols, float *y, size_t y_stride, bool avx512);

#endif
