/* quant_mix.h - which tensor gets which weight type in llama-quantize's mixes (Q4_K_M,
 * Q5_K_M, Q6_K), so the model tool can write files shaped like the ones people download
 * (quant_mix.c). */
#ifndef TIDE_QUANT_MIX_H
#define TIDE_QUANT_MIX_H

#include <stdint.h>

enum quant_mix { QUANT_MIX_NONE = 0, QUANT_MIX_Q4_K_M, QUANT_MIX_Q5_K_M, QUANT_MIX_Q6_K };

/* "Q4_K_M", "Q5_K_M", "Q6_K" (any case) -> the mix; -1 for anything else. */
int quant_mix_parse(const char *name);
const char *quant_mix_name(enum quant_mix mix);
/* The type tensor NAME (n_dims dims, ne0 values a row) gets in mix, for a model of n_layer
 * layers and n_expert experts (0: dense). keep: its type when the mix does not quantise it
 * (norms, the router, vectors). */
uint32_t quant_mix_type(enum quant_mix mix, const char *name, uint32_t n_dims, uint64_t ne0,
                        uint32_t n_layer, uint32_t n_expert, uint32_t keep);

#endif
