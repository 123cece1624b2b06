/* modelgen.h - generate small deterministic GGUF models (random weights + a real
 * byte-level BPE vocabulary trained on an embedded corpus) for tests, the default
 * daemon model and benchmarks. Used by tools/mkmodel.c and the unit tests. */
#ifndef TIDE_MODELGEN_H
#define TIDE_MODELGEN_H

#include "gguf.h"

struct modelgen_options {
    const char *preset;   /* "dense", "moe", "qwen3moe", "qwen2moe", "gpt-oss", "olmoe", "granitemoe", "granitemoe-shared",
                           * "deepseek2" (llama.cpp only), "qwen3vlmoe", "qwen2vl", "big", "qwen3-30b-a3b", "qwen3-vl-30b-a3b" (benchmarks) */
    const char *out;      /* output path */
    uint64_t seed;        /* PRNG seed; same options -> byte-identical file */
    int type;             /* ggml type of the big matrices, or -1 for the preset's */
    int type_down;        /* > 0: ggml type of ffn_down(_exps) and output.weight instead (a
                           * Q4_K_M-like mix is type q4_K, type_down q6_K); 0: type */
    int mix;              /* enum quant_mix: a llama-quantize recipe over the types (0: none) */
    bool mix_as_f32;      /* store the mix's values (quantised, then dequantised) as f32: the
                           * same weights for a reference run (tests) */
    /* overrides; 0 keeps the preset's value */
    uint32_t n_layer, n_embd, n_expert, n_expert_used, n_ff, n_head, n_head_kv;
    uint32_t head_dim;    /* a head's width (0: the preset's, or n_embd / n_head once either is set) */
    int threads;          /* threads for the write-time matrices (0: all CPUs) */
    const char *chat_template;  /* tokenizer.chat_template (Jinja); NULL: the ChatML one */
};

struct modelgen_summary {
    uint64_t n_params;
    uint64_t n_bytes;     /* file size */
    uint32_t n_vocab;
};

/* Write the model. Returns 0 or a negative TIDE_E* code with a message in err. */
int modelgen_write(const struct modelgen_options *o, struct modelgen_summary *sum,
                   char *err, size_t errlen);

#endif
