/* clip.h - the vision tower of a LLaVA-style model: a CLIP/SigLIP ViT plus the `mlp`
 * projector, loaded from an mmproj GGUF in llama.cpp's clip layout (docs/VISION.md lists
 * the keys and tensors).
 *
 * The encoder is loaded and unloaded repeatedly by the lazy-vision lifecycle, so its weights
 * are COPIED into memory taken from the caller's allocator (which charges a device ledger)
 * and clip_free gives it all back. The activation workspace for the largest image is taken
 * at load too, from the same allocator, so clip_encode allocates nothing.
 *  - CPU: clip_load copies the weights from the file straight into allocator memory.
 *  - GPU: clip_load_host keeps one host copy (pinned, taken once), and each load is
 *    clip_upload: device memory from the allocator, one upload, pointers rebased.
 * clip_estimate(_on) computes both sizes from the file alone, for the hand-back reserve;
 * with a backend it adds the scratch that backend's products take on the device.
 *
 * Computation (as llama.cpp's llava graph): patch conv as a matmul, + position embeddings
 * (class token first when present), pre-LN, pre-norm blocks (LayerNorm with bias, full
 * bidirectional multi-head attention, GELU/quick-GELU/SiLU MLP), post-LN, drop the class
 * token, projector linear -> GELU -> linear to the text model's width. Every step is a
 * backend op (matmul, layernorm, add_bias, activate, attention_full, axpy, gather_rows) on
 * buffers in the backend's memory, so the same code runs on the CPU and on a GPU; only the
 * patch rows are built on the host (and uploaded) and the result downloaded. */
#ifndef TIDE_VISION_CLIP_H
#define TIDE_VISION_CLIP_H

#include "../engine/backend.h"
#include "image.h"

struct clip_alloc {
    void *(*alloc)(void *ud, size_t bytes);  /* NULL on failure */
    void (*free)(void *ud, void *p);
    void *ud;
};

enum clip_act { CLIP_ACT_GELU, CLIP_ACT_GELU_QUICK, CLIP_ACT_SILU };

struct clip_hparams {
    int image_size;      /* square input side, pixels */
    int patch_size;
    int n_embd;          /* ViT width D */
    int n_ff;            /* ViT MLP width F */
    int n_head;
    int head_dim;        /* d (n_embd / n_head unless the file says otherwise) */
    int n_layer;         /* blocks in the file */
    int n_layer_run;     /* blocks run: max(feature_layer) or n_layer - 1 (LLaVA rule) */
    int n_mm_hidden;     /* projector hidden width H (rows of mm.0) */
    int n_embd_out;      /* projector output width T = text model n_embd */
    int n_patches;       /* (image_size / patch_size)^2 = tokens per image */
    int n_pos;           /* n_patches + class token */
    bool has_class;
    float eps;
    enum clip_act act;   /* ViT MLP activation; the projector always uses GELU */
    float mean[3], std[3];
    uint8_t pad_rgb[3];  /* letterbox colour: the mean as 8-bit */
};

/* Per block; vectors are f32 copies (NULL when the file has none), matrices keep the
 * file's type. Matrix shapes as (in -> out). */
struct clip_layer {
    float *ln1_w, *ln1_b;     /* (D) */
    struct tensor q, k, v;    /* (D -> n_head*d) */
    float *q_b, *k_b, *v_b;   /* (n_head*d) */
    struct tensor o;          /* (n_head*d -> D) */
    float *o_b;               /* (D) */
    float *ln2_w, *ln2_b;     /* (D) */
    struct tensor up;         /* (D -> F) */
    float *up_b;              /* (F) */
    struct tensor down;       /* (F -> D) */
    float *down_b;            /* (D) */
};

struct clip_model {
    struct clip_hparams hp;
    struct tensor patch_w;    /* (3*p*p -> D), column c*p*p + ky*p + kx */
    float *patch_b;           /* (D) */
    float *pos;               /* (n_pos, D) */
    float *cls;               /* (D) or NULL */
    float *pre_w, *pre_b;     /* (D) or NULL */
    float *post_w, *post_b;   /* (D) or NULL */
    struct clip_layer *layers;/* (n_layer_run) */
    struct tensor mm0;        /* (D -> H) */
    float *mm0_b;             /* (H) */
    struct tensor mm2;        /* (H -> T), .data NULL when absent (then T = H) */
    float *mm2_b;             /* (T) */
    void *weights;            /* one block from alloc (backend memory): every field above
                               * points into it */
    size_t weights_bytes;
    float *ws;                /* activation workspace from alloc (backend memory); NULL in a
                               * host copy (clip_load_host), which does not run */
    size_t ws_bytes;
    float *stage;             /* host (malloc): the patch rows clip_encode uploads */
    size_t stage_floats;
    struct clip_alloc alloc;
    struct backend *be;       /* not owned */
};

/* Load PATH with weights and workspace from a (NULL: malloc), which must be memory the host
 * can write and be can compute on (the CPU backend's). be runs every op. */
int clip_load(struct clip_model **out, const char *path, const struct clip_alloc *a,
              struct backend *be, char *err, size_t errlen);
/* The weights alone, into host memory from a (pinned, for a GPU): the source of clip_upload.
 * It has no workspace and no backend: clip_encode refuses it. */
int clip_load_host(struct clip_model **out, const char *path, const struct clip_alloc *a,
                   char *err, size_t errlen);
/* A runnable encoder on be from a host copy: weights and workspace from a (be's memory), the
 * weights uploaded in one copy. Exactly clip_estimate_on(path, be)'s sizes less the
 * backend's scratch, which be takes itself on first use. host stays valid and unchanged. */
int clip_upload(struct clip_model **out, const struct clip_model *host, const struct clip_alloc *a,
                struct backend *be, char *err, size_t errlen);
void clip_free(struct clip_model *m);

/* Bytes clip_load will take from its allocator, computed from the file's header only:
 * weights (as copied) and workspace (activations for one image of the encoder's size).
 * max_image_tokens (0 = no check) below the encoder's fixed token count is TIDE_ERANGE. */
int clip_estimate(const char *path, int max_image_tokens, size_t *weights_bytes,
                  size_t *workspace_bytes, char *err, size_t errlen);
/* The same, with the scratch that be's products take from its own pool (a GPU's quantised
 * inputs; none on the CPU) added to the workspace: what a load on be really needs. */
int clip_estimate_on(const char *path, struct backend *be, int max_image_tokens,
                     size_t *weights_bytes, size_t *workspace_bytes, char *err, size_t errlen);
/* The largest scratch be->matmul_scratch reports for the encoder's products (0 without). */
size_t clip_backend_scratch(const struct clip_model *m, struct backend *be);
/* Tokens per matmul call (tests: 8 keeps a GPU on its f32 row-dot path); 0 = the default
 * (32 on the CPU, the whole image elsewhere). Returns the previous value. Process-wide. */
int clip_set_matmul_block(int n);

/* The hyper-parameters (all of struct clip_hparams, output width included) from the file
 * alone, without loading: lets the caller count image tokens while the encoder is unloaded
 * (hp.n_patches for the `mlp` projector). */
int clip_read_hparams(const char *path, struct clip_hparams *hp, char *err, size_t errlen);

/* Tokens an image of w x h yields. The `mlp` projector is fixed-resolution: every image
 * is fitted (downscaled or enlarged, letterboxed) to image_size^2, so always n_patches. */
int clip_n_tokens(const struct clip_model *m, int w, int h);
int clip_n_embd_out(const struct clip_model *m);

/* Fit, letterbox and normalise a decoded image into the encoder's input. */
int clip_preprocess(const struct clip_model *m, const struct image_u8 *img,
                    struct image_f32 *out, char *err, size_t errlen);

/* Encode a preprocessed image (image_size^2, CHW) into out (host memory, (n_tokens,
 * n_embd_out)). Returns n_tokens or a negative code; returns once out is filled. On a GPU a
 * failed CUDA call shows in backend_cuda_error, not here (the ops return void).
 * Deterministic for a given backend (the matmul sums each row in one thread). */
int clip_encode(struct clip_model *m, const struct image_f32 *img, float *out, char *err,
                size_t errlen);

/* One encoder block in place on x (n_pos, D, in the backend's memory), using the model's
 * workspace. Exposed for the unit tests' reference check; n_pos <= hp.n_pos. */
int clip_run_block(struct clip_model *m, int layer, float *x, int n_pos);

#endif
