/* quant_mix.c - llama-quantize's Q4_K_M, Q5_K_M and Q6_K recipes as a rule table.
 *
 * Read from llama.cpp's src/llama-quant.cpp (llama_tensor_get_type), for the architectures
 * tide runs (llama, qwen3, qwen3moe, qwen2moe: not Falcon, not a 70B): the mix's base type for
 * every 2-D/3-D weight, except
 *   - output.weight: q6_K (q8_0 when its rows are not whole 256-value super-blocks);
 *   - attn_v: q6_K in Q4_K_M / Q5_K_M on "more bits" layers (the first and last eighth of
 *     the layers, and every third between); q8_0 in any mix when the model has 8 experts;
 *   - attn_k: q8_0 when the model has 8 experts;
 *   - ffn_down (and ffn_down_exps, ffn_down_shexp): q6_K in Q4_K_M / Q5_K_M on "more bits" layers;
 *   - attn_output: q5_K in Q4_K_M when the model has 8 experts;
 * and not quantised at all: vectors, *_norm.weight, ffn_gate_inp.weight (the router).
 * A type whose block does not divide the row falls back as llama-quantize does: q4_K to q5_0,
 * q5_K to q5_1, q6_K to q8_0, and f16 when even 32 does not divide it. */
#include "quant_mix.h"
#include "gguf.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

int quant_mix_parse(const char *name)
{
    if (!name) return -1;
    if (!strcasecmp(name, "Q4_K_M")) return QUANT_MIX_Q4_K_M;
    if (!strcasecmp(name, "Q5_K_M")) return QUANT_MIX_Q5_K_M;
    if (!strcasecmp(name, "Q6_K")) return QUANT_MIX_Q6_K;
    return -1;
}

const char *quant_mix_name(enum quant_mix mix)
{
    switch (mix) {
    case QUANT_MIX_Q4_K_M: return "Q4_K_M";
    case QUANT_MIX_Q5_K_M: return "Q5_K_M";
    case QUANT_MIX_Q6_K: return "Q6_K";
    default: return "none";
    }
}

/* llama-quantize's use_more_bits: the first and last eighth, and every third layer between. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int has(const char *name, const char *part) { return strstr(name, part) != NULL; }

static uint32_t fallback(uint32_t type, uint64_t ne0)
{
    if (ne0 % ggml_block_size(type) == 0) return type;
    uint32_t t = type == GGML_TYPE_Q4_K ? GGML_TYPE_Q5_0 : type == GGML_TYPE_Q5_K ? GGML_TYPE_Q5_1 : GGML_TYPE_Q8_0;
    return ne0 % 32 == 0 ? t : GGML_TYPE_F16;
}

uint32_t quant_mix_type(enum quant_mix mix, const char *name, uint32_t n_dims, uint64_t ne0,
                        uint32_t n_layer, uint32_t n_expert, uint32_t keep)
{
    if (mix == QUANT_MIX_NONE || n_dims < 2 || has(name, "_norm.weight") || has(name, "ffn_gate_inp.weight"))
        return keep;
    uint32_t t = mix == QUANT_MIX_Q4_K_M ? GGML_TYPE_Q4_K : mix == QUANT_MIX_Q5_K_M ? GGML_TYPE_Q5_K : GGML_TYPE_Q6_K;
    bool km = mix == QUANT_MIX_Q4_K_M || mix == QUANT_MIX_Q5_K_M;
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1) layer = -1;
    if (!strcmp(name, "output.weight")) {
        t = ne0 % QK_K ? GGML_TYPE_Q8_0 : GGML_TYPE_Q6_K;
    } else if (has(name, "attn_v.weight")) {
        if (km && layer >= 0 && more_bits(layer, (int)n_layer)) t = GGML_TYPE_Q6_K;
        if (n_expert == 8) t = GGML_TYPE_Q8_0;
    } else if (has(name, "attn_k.weight")) {
        if (n_expert == 8) t = GGML_TYPE_Q8_0;
    } else if (has(name, "ffn_down")) {
        if (km && layer >= 0 && more_bits(layer, (int)n_layer)) t = GGML_TYPE_Q6_K;
    } else if (has(name, "attn_output.weight")) {
        if (mix == QUANT_MIX_Q4_K_M && n_expert == 8) t = GGML_TYPE_Q5_K;
    }
    return fallback(t, ne0);
}
