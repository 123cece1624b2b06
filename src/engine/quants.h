/* quants.h - pieces of the ggml block formats (quants.c) that the int8 dot products
 * (cpu_quant.c) share with the dequantisers, so both read a block the same way. */
#ifndef TIDE_QUANTS_H
#define TIDE_QUANTS_H

#include <stdint.h>

/* Sub-block j's (0..7) 6-bit scale and min of a q4_K / q5_K block's 12 scale bytes. */
void q4k_scale_min(const uint8_t *sc, int j, int *scale, int *min);
/* Sub-block j's (0..7) signed scale (-32..31) of an iq4_xs block. */
int iq4xs_scale(const uint8_t *block, int j);
/* The iq4_nl / iq4_xs non-linear levels, and MXFP4's fp4 (e2m1) codes doubled. */
extern const int8_t iq4nl_values[16];
extern const int8_t mxfp4_values[16];
/* An MXFP4 block's e8m0 exponent as the factor of the doubled codes: 2^(e - 128). */
float mxfp4_scale(uint8_t e);

#endif
