/* cpu_quant_isums.h - the integer step of cpu_quant.c's two-step dot products (cpu_quant_isums.c):
 * for each block of a weight row, the exact integer sum of its codes times the activation
 * codes, weighted by the block's integer sub-block scales. Scalar kernels, and AVX2 ones that
 * give the same integers; cpu_quant.c combines them with the blocks' float scales. */
#ifndef TIDE_CPU_QUANT_ISUMS_H
#define TIDE_CPU_QUANT_ISUMS_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu_kquant.h"
#include "cpu_quant_vnni.h"

#define QB 32         /* values per 32-value block */
#define ISUM_CHUNK 64 /* blocks whose integer sums are made before they are combined: the most a call takes */

/* A super-block unpacked once for many activation vectors (prefill): its 256 codes as bytes
 * (unsigned, or signed for iq4_xs) and each 16 values' integer scale, repeated as the int16
 * lanes a 32-value product is weighted with. The integers it gives are the kernels' above. */
struct unpacked256 {
    uint8_t codes[QK_K];
    int16_t scalev[8][16]; /* [k][lane]: lanes 0-7 scale values 32k..32k+15, lanes 8-15 the rest */
    int16_t offw[16];      /* weights of the activations' 16-value sums: q4_K/q5_K mins, q6_K scales */
    float d, dmin;         /* the block's float scales, as combine() reads them */
    bool is_signed;
};

/* The integer sums of nb blocks (at most ISUM_CHUNK) of a row w of type with activations act
 * (struct act32 for 32-value blocks, act256 for super-blocks): out[b], and for q5_1, q4_K and
 * q5_K a second one (out[2b], out[2b + 1]: the codes' sum, then the offset's). */
void quant_isums_scalar(uint32_t type, const uint8_t *w, const void *act, int nb, int32_t *out);

#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_QUANT_AVX2 1
/* The AVX2 forms, only where the CPU has AVX2: quant_isums_scalar's integers; cpu_quant_act's
 * bytes for nb 32-value blocks of x; and one activation vector against an unpacked
 * super-block, the codes' sum (returned) and the 16-value sums weighted by offw (*off). */
__attribute__((target("avx2"))) void quant_isums_avx2(uint32_t type, const uint8_t *w, const void *act, int nb,
                                                      int32_t *out);
__attribute__((target("avx2"))) void quant_act32_avx2(const float *x, int nb, struct act32 *o);
__attribute__((target("avx2"))) int32_t quant_dot_unpacked_avx2(const struct unpacked256 *u,
                                                                const struct act256 *xa, int32_t *off);
#else
#define CPU_QUANT_AVX2 0
#endif

#endif
