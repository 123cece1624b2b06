/* qwen3vl_internal.h - what qwen3vl.c (the header, the walk over the tensors, the computation)
 * and qwen3vl_weights.c (how the weights are kept and uploaded) share: the tower's layout.
 * Shapes: D = n_embd, F = n_ff, M = 4 D (a merged token's four patches), T = n_embd_text,
 * K = 3 p^2 (a patch's pixels); a product's weight is (in -> out), rows of `in` elements. */
#ifndef TIDE_VISION_QWEN3VL_INTERNAL_H
#define TIDE_VISION_QWEN3VL_INTERNAL_H

#include <stdbool.h>

#include "../engine/gguf.h"
#include "../engine/model.h"
#include "qwen3vl.h"

struct q3v_layer {
    float *ln1_w, *ln1_b;   /* (D); the biases NULL for qwen25vl's RMSNorms */
    struct tensor q, k, v;  /* (D -> D); qwen3vl: row views of its fused attn_qkv (D -> 3D) */
    float *q_b, *k_b, *v_b; /* (D) */
    struct tensor o;        /* (D -> D) */
    float *o_b;             /* (D) */
    float *ln2_w, *ln2_b;   /* (D) */
    struct tensor gate, up; /* (D -> F); gate: qwen25vl's gated MLP, .data NULL elsewhere */
    float *gate_b, *up_b;   /* (F) */
    struct tensor down;     /* (F -> D) */
    float *down_b;          /* (D) */
    int deepstack;          /* index of its deepstack merger, or -1 */
};

struct q3v_merger {
    float *norm_w, *norm_b; /* (M); NULL in the main merger (post_ln is per patch) */
    struct tensor fc1;      /* (M -> M) */
    float *fc1_b;           /* (M) */
    struct tensor fc2;      /* (M -> T) */
    float *fc2_b;           /* (T) */
};

struct qwen3vl_tower {
    struct qwen3vl_hparams hp;
    struct tensor patch;    /* (K -> D): the temporal pair's two kernels summed, columns (c, ky, kx) */
    float *patch_b;         /* (D) or NULL */
    float *pos;             /* (pos_side^2, D) or NULL; read on the host (interpolated per image) */
    float *post_w, *post_b; /* (D) */
    struct q3v_layer *layers; /* (n_layer) */
    struct q3v_merger deepstack[QWEN3VL_MAX_DEEPSTACK];
    struct q3v_merger main; /* fc1 = mm.0, fc2 = mm.2 */
    /* every weight in one block, carved in file order: all f32 (hp.weight_floats), or with tc
     * the device layout (hp.tc_bytes: products in qwen3vl_tc_type, 256-byte aligned) */
    uint8_t *block;
    size_t block_bytes;
    size_t used;            /* bytes of block carved so far (while loading) */
    bool tc;
    struct clip_alloc a;    /* where block (and ws) came from; free NULL: malloc */
    /* an uploaded tower (qwen3vl_upload): its backend, its workspace for up to ws_patches
     * patches, and the host tower it came from (the position table is interpolated there) */
    const struct backend *be;
    float *ws;
    long ws_patches;
    const struct qwen3vl_tower *host;
};

/* One tensor of the file, of n elements, into t's block as f32 (vectors, the position table,
 * the patch kernels); counted in both layouts' sizes in hp. NULL when t is NULL (a count). */
float *q3v_take_f32(struct qwen3vl_hparams *hp, struct qwen3vl_tower *t, const struct gguf_tensor *x, size_t n);
/* A product's weight (in -> out) into *w: f32, or in a tc tower its qwen3vl_tc_type; counted in
 * both layouts' sizes. w untouched when t is NULL. */
void q3v_take_matrix(struct qwen3vl_hparams *hp, struct qwen3vl_tower *t, const struct gguf_tensor *x, uint64_t in,
                     uint64_t out, struct tensor *w);
/* The patch kernel (K -> D) from its f32 sum at p: f32 as it is, or in a tc tower rounded to
 * f16 in place (the f16 rows take the first half of the f32 ones' bytes). */
struct tensor q3v_patch_tensor(const struct qwen3vl_tower *t, float *p, uint64_t K, uint64_t D);

#endif
