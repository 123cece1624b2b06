/* qwen3vl.h - the Qwen-VL vision towers, over f32 copies of the weights (on the CPU, or uploaded
 * to a GPU: qwen3vl_upload), or on a GPU with TIDE_VISION_TC=1 over the tensor-core layout
 * (qwen3vl_load_tc: products in the file's type or f16): Qwen3-VL's
 * (mmproj projector `qwen3vl_merger`, described here), and Qwen2-VL's and Qwen2.5-VL's
 * (`qwen2vl_merger`, `qwen2.5vl_merger`: see enum qwenvl_kind), in the layout llama.cpp's
 * converter writes.
 *
 * An image whose sides are multiples of patch * merge (dynres.h gives the size) becomes
 * (w / patch) x (h / patch) patches, taken in merge order (each 2x2 block's four patches
 * together, blocks row-major); the temporal patch pair of a still image is one frame twice,
 * so the patch embedding is the sum of the two kernels; the learned position table is
 * interpolated bilinearly (corners aligned) to the patch grid; the ViT's blocks rotate q and k
 * with 2-D rope (a head's first quarter of pairs by the patch's row, the second by its column);
 * the outputs of the deepstack blocks and of the last one are merged 2x2 (four patches' widths
 * side by side) and projected to the text width. A merged token's output row is the main
 * embedding followed by one deepstack feature per deepstack block, in block order:
 * n_embd_text * (1 + n_deepstack) floats (llama.cpp's layout, n_embd_inp of the text model). */
#ifndef TIDE_VISION_QWEN3VL_H
#define TIDE_VISION_QWEN3VL_H

#include <stddef.h>
#include <stdint.h>

#include "clip.h"
#include "dynres.h"

#define QWEN3VL_MAX_DEEPSTACK 8

/* The Qwen-VL towers this module runs: the same ViT with the same 2-D rope and 2x2 merger.
 * Qwen2-VL (qwen2vl_merger) has no patch bias, no position table, no deepstack, q/k/v as three
 * tensors, LayerNorms and a quick-GELU MLP; Qwen2.5-VL (qwen2.5vl_merger) is that with RMSNorms,
 * a gated SiLU MLP (ffn_gate, ffn_up, ffn_down) and window attention: every n_wa_pattern-th
 * block attends to the whole image, the others within windows of 112 / (patch * merge) merged
 * tokens a side (llama.cpp's default window of 112 pixels). */
enum qwenvl_kind { QWENVL_3, QWENVL_2, QWENVL_25 };

struct qwen3vl_hparams {
    enum qwenvl_kind kind;
    int act;                /* the MLP's activation, enum act_kind: gelu, quick gelu or silu */
    int n_wa_pattern;       /* qwen25vl: blocks l with (l + 1) % n_wa_pattern == 0 attend fully */
    int window;             /* qwen25vl: a window's side in merged tokens */
    size_t weight_floats;   /* every tensor's elements (what qwen3vl_load keeps, as f32) */
    size_t tc_bytes;        /* the block qwen3vl_load_tc keeps (the tensor-core layout, in the
                             * qwen3vl_set_tc mode of the read) */
    int n_embd, n_ff, n_head, n_layer;
    int patch, merge;
    int pos_side;           /* the position table is pos_side x pos_side */
    int n_embd_text;        /* the merger's output width (mm.2's rows) */
    int n_deepstack;
    int deepstack_layer[QWEN3VL_MAX_DEEPSTACK]; /* the blocks they follow, ascending */
    float eps;
    float mean[3], std[3];
    long min_pixels, max_pixels; /* llama.cpp's: 8 and 4096 merged tokens */
};

struct qwen3vl_tower;

/* The header's hyper-parameters and the tensors' shapes, checked; no weight is read. */
int qwen3vl_read_hparams(const char *path, struct qwen3vl_hparams *hp, char *err, size_t errlen);
int qwen3vl_load(const char *path, struct qwen3vl_tower **out, char *err, size_t errlen);
/* The same with the weights' one block (hp.weight_floats f32) from a (host memory; pinned for
 * a GPU's uploads), freed through it. */
int qwen3vl_load_with(const char *path, const struct clip_alloc *a, struct qwen3vl_tower **out, char *err,
                      size_t errlen);
/* The host copy for a GPU in the tensor-core layout (TIDE_VISION_TC=1): every product's weight
 * (the patch kernel, q/k/v, out, the MLP, the mergers' fc1 / fc2) in a type the CUDA backend's
 * products run on the tensor cores - the file's own where it is f16, bf16, or q8_0 / q4_0 with
 * rows of a multiple of 128 (the int8 mma path), else f16 (qwen3vl_tc_type) - each tensor
 * 256-byte aligned; vectors and the position table f32. hp.tc_bytes from a, freed through it.
 * Only qwen3vl_upload takes it (the plain loops and the CPU backend run f32 towers). */
int qwen3vl_load_tc(const char *path, const struct clip_alloc *a, struct qwen3vl_tower **out, char *err,
                    size_t errlen);
/* TIDE_VISION_TC (read once): whether the GPU encoder takes the tensor-core layout - unset or
 * "0": no (0); "1": yes (1); "f16": yes, with q8_0 / q4_0 products widened to f16 too (2: more
 * accurate, twice the bytes). qwen3vl_set_tc(0 / 1 / 2) sets it (tests), -1 reads it; returns
 * the previous value. The CUDA backend's attention_full reads the same variable
 * (cuda_set_vision_tc). */
int qwen3vl_set_tc(int on);
/* A product's weight type in the tensor-core layout, from its type in the file and its row
 * length (in), under the current qwen3vl_set_tc mode (hp.tc_bytes is counted under it too). */
uint32_t qwen3vl_tc_type(uint32_t file_type, uint64_t in);
/* The most scratch be's products of the tower take from be's own pools (matmul_scratch: the
 * quantised input of a q8_0 / q4_0 product; under TIDE_F16_MMA the rounded input of an f16 /
 * bf16 one, from a second pool: the two maxima added) for an image of up to max_patches patches. */
struct backend;
size_t qwen3vl_tc_scratch(const struct qwen3vl_tower *t, const struct backend *be, long max_patches);
/* A tower on be (a GPU) from a host tower (either layout): the weights' block and the workspace
 * of an image of up to max_patches patches from a (be's memory: qwen3vl_weight_bytes, or
 * qwen3vl_weight_bytes_tc for a tc tower, and qwen3vl_workspace_bytes exactly), the weights
 * uploaded in one copy. Its qwen3vl_encode runs
 * on be whatever backend it is given; host must outlive it (the position table is
 * interpolated from the host copy). */
int qwen3vl_upload(struct qwen3vl_tower **out, const struct qwen3vl_tower *host, const struct clip_alloc *a,
                   const struct backend *be, long max_patches, char *err, size_t errlen);
void qwen3vl_free(struct qwen3vl_tower *t);
const struct qwen3vl_hparams *qwen3vl_hparams_of(const struct qwen3vl_tower *t);
/* The resize rules of this tower under a budget of max_tokens merged tokens (0: none). */
struct dynres_rules qwen3vl_rules(const struct qwen3vl_hparams *hp, int max_tokens);
/* Bytes of the f32 weights qwen3vl_load keeps, and of the activations of an image of
 * n_patches patches, from the header alone. */
size_t qwen3vl_weight_bytes(const struct qwen3vl_hparams *hp);
size_t qwen3vl_weight_bytes_tc(const struct qwen3vl_hparams *hp); /* qwen3vl_load_tc's block */
size_t qwen3vl_workspace_bytes(const struct qwen3vl_hparams *hp, long n_patches);
/* Patches of the largest image the budget (max_tokens merged tokens, 0: none) and the tower's
 * max_pixels allow. */
long qwen3vl_max_patches(const struct qwen3vl_hparams *hp, int max_tokens);
/* The encoder's two reserves from the header alone, as the lazy lifecycle's hand-back needs
 * them: the weights as qwen3vl_load keeps them, and the workspace of the largest image the
 * budget allows (max_tokens merged tokens, capped by the tower's max_pixels; 0: that cap). */
int qwen3vl_estimate(const char *path, int max_tokens, size_t *weights, size_t *workspace, char *err, size_t errlen);
/* Normalise 8-bit RGB (w x h, row-major, 3 bytes a pixel) and encode it; w and h multiples of
 * patch * merge. out (host): (w / (patch merge)) * (h / (patch merge)) rows of
 * n_embd_text * (1 + n_deepstack) floats. be: a CPU backend whose ops (matmul, add_bias,
 * layernorm / rmsnorm, activate, swiglu, rope_2d, attention_full, axpy) compute every step but
 * the host's share (each patch's pixels cut out and normalised, the position table
 * interpolated, the outputs put in image order), threaded; NULL: plain loops. An uploaded
 * tower runs those ops on its own backend, its memory, and the image must fit its workspace. */
int qwen3vl_encode(const struct qwen3vl_tower *t, const struct backend *be, const uint8_t *rgb, int w, int h,
                   float *out, char *err, size_t errlen);

#endif
