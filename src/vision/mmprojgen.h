/* mmprojgen.h - write small random-weight mmproj GGUFs in llama.cpp's clip layout
 * (projector type `mlp`, LLaVA-1.5 style) for tests and the default daemon config.
 * Used by tools/mkmodel.c (`--preset mmproj`) and the unit tests. Same options give a
 * byte-identical file. */
#ifndef TIDE_VISION_MMPROJGEN_H
#define TIDE_VISION_MMPROJGEN_H

#include "../common.h"

struct mmprojgen_options {
    const char *out;        /* output path */
    uint64_t seed;
    int type;               /* ggml type of the matrices (f32/f16/bf16/q8_0), -1 = f16 */
    /* 0 keeps the default shown */
    uint32_t n_embd_text;   /* projector output = text model n_embd (128) */
    uint32_t image_size;    /* 64 */
    uint32_t patch_size;    /* 8 -> 64 patches */
    uint32_t n_embd;        /* ViT width (64) */
    uint32_t n_ff;          /* ViT MLP width (256); must differ from n_embd, see clip.c */
    uint32_t n_head;        /* 4 */
    uint32_t n_layer;       /* 2, all of them run (clip.vision.feature_layer = [n_layer]) */
    bool class_token;       /* write v.class_embd (off by default, see docs/VISION.md) */
    bool quick_gelu;        /* ViT MLP uses quick-GELU instead of GELU */
};

/* Write the file. Returns 0 or a negative TIDE_E* code with a message in err. */
int mmprojgen_write(const struct mmprojgen_options *o, char *err, size_t errlen);

/* Qwen3-VL's tower (projector `qwen3vl_merger`, llama.cpp's converter layout, docs/VISION.md):
 * the same options, other defaults: text width 96 (the qwen3vlmoe preset), position table
 * image_size / patch_size a side (64 / 8 = 8), width 64, 4 heads, MLP 128, 4 blocks; n_deepstack
 * (default 2) deepstack mergers after blocks k * n_layer / (n_deepstack + 1), k = 1.. */
int mmprojgen_write_qwen3vl(const struct mmprojgen_options *o, uint32_t n_deepstack, char *err, size_t errlen);
/* Qwen2-VL's tower (projector `qwen2vl_merger`) or, qwen25, Qwen2.5-VL's (`qwen2.5vl_merger`),
 * llama.cpp's converter layout (docs/VISION.md): the same options, defaults as
 * mmprojgen_write_qwen3vl's but text width 128 (the qwen2vl preset) and, for Qwen2.5-VL, patch
 * 14 (112-pixel attention windows of 4x4 merged tokens) and image_size 112; no deepstack. */
int mmprojgen_write_qwen2vl(const struct mmprojgen_options *o, bool qwen25, char *err, size_t errlen);
/* Qwen3-VL-30B-A3B's tower at its real size (about 0.6 B parameters, for benchmarks): patch 16,
 * a 48x48 position table, width 1152, 16 heads, MLP 4304, 27 blocks, deepstack after blocks 8,
 * 16 and 24, text width 2048; type f16 unless o->type says otherwise (q8_0 keeps the matrices
 * whose rows are not whole blocks in f16). Only out, seed and type of o are read. */
int mmprojgen_write_qwen3vl_30b(const struct mmprojgen_options *o, char *err, size_t errlen);

#endif
