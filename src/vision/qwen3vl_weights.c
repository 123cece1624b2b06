/* qwen3vl_weights.c - how a Qwen-VL tower's weights are kept (qwen3vl_internal.h): the f32
 * layout every tower had (the CPU's, and the GPU's by default), the tensor-core layout a GPU
 * takes with TIDE_VISION_TC=1, and the upload of either block to a GPU.
 *
 * Why a second layout: over f32 weights every product of the GPU encoder runs gemm_f32.cu (f32
 * on the CUDA cores); a Qwen3-VL-30B-A3B tower on a 1024x768 image is ~2.7 TFLOP of products,
 * which took most of the 720 ms the encode measured (docs/BENCHMARKS.md, ninth session). Kept in
 * the file's q8_0 (cuda_matmul's int8 mma path, mmq_mma.cu) or in f16 / bf16 (the wmma GEMM of
 * matmul.cu), the same products run on the tensor cores, and the block is a quarter to a half
 * of the f32 one (a smaller reserve, a faster cold upload). The CPU keeps f32: its numerics,
 * and the tests that hold the towers to its plain loops, stay as they are. */
#include "qwen3vl_internal.h"

#include <stdlib.h>
#include <string.h>

#include "../common.h"
#include "../engine/backend.h"
#include "../engine/cpu_f16.h"

#define TC_ALIGN 256 /* each tensor of the tc layout: the wmma path wants 16 bytes, mmq 8 */

static size_t tc_align(size_t n) { return (n + TC_ALIGN - 1) / TC_ALIGN * TC_ALIGN; }

static int tc_on = -1; /* -1: TIDE_VISION_TC not read yet; 0 off, 1 on, 2 on with f16 products only (the default) */

int qwen3vl_set_tc(int on)
{
    if (tc_on < 0) {
        const char *e = getenv("TIDE_VISION_TC");
        tc_on = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : 2;
    }
    int old = tc_on;
    if (on >= 0)
        tc_on = on > 2 ? 1 : on;
    return old;
}

uint32_t qwen3vl_tc_type(uint32_t file_type, uint64_t in)
{
    if (file_type == GGML_TYPE_F16 || file_type == GGML_TYPE_BF16)
        return file_type;
    /* the int8 mma path takes K in whole 128-element stages (tile_shape_ok, mmq_mma.cu);
     * shorter rows would fall to the dp4a kernels, so those go f16. Its x is quantised to int8
     * blocks (~1e-2 relative RMS on the embeddings against f32 products, as llama.cpp's q8_0
     * products; f16 ones: ~5e-4), so TIDE_VISION_TC=f16 widens q8_0 / q4_0 to f16 instead. */
    if ((file_type == GGML_TYPE_Q8_0 || file_type == GGML_TYPE_Q4_0) && in % 128 == 0 && qwen3vl_set_tc(-1) != 2)
        return file_type;
    return GGML_TYPE_F16;
}

size_t qwen3vl_weight_bytes(const struct qwen3vl_hparams *hp) { return hp->weight_floats * sizeof(float); }

size_t qwen3vl_weight_bytes_tc(const struct qwen3vl_hparams *hp) { return hp->tc_bytes; }

float *q3v_take_f32(struct qwen3vl_hparams *hp, struct qwen3vl_tower *t, const struct gguf_tensor *x, size_t n)
{
    hp->weight_floats += n;
    hp->tc_bytes += tc_align(n * sizeof(float));
    if (!t)
        return NULL;
    if (t->tc)
        t->used = tc_align(t->used);
    float *dst = (float *)(void *)(t->block + t->used);
    ggml_dequantize(x->type, x->data, dst, n);
    t->used += n * sizeof(float);
    return dst;
}

void q3v_take_matrix(struct qwen3vl_hparams *hp, struct qwen3vl_tower *t, const struct gguf_tensor *x, uint64_t in,
                     uint64_t out, struct tensor *w)
{
    uint32_t ty = qwen3vl_tc_type(x->type, in);
    size_t rb = ggml_row_size(ty, in);
    hp->weight_floats += in * out;
    hp->tc_bytes += tc_align(rb * out);
    if (!t)
        return;
    if (!t->tc) {
        float *dst = (float *)(void *)(t->block + t->used);
        ggml_dequantize(x->type, x->data, dst, in * out);
        t->used += in * out * sizeof(float);
        *w = (struct tensor){.type = GGML_TYPE_F32, .ne = {in, out}, .data = dst, .row_bytes = sizeof(float) * in};
        return;
    }
    t->used = tc_align(t->used);
    uint8_t *dst = t->block + t->used;
    if (ty == x->type) {
        memcpy(dst, x->data, rb * out);
    } else { /* to f16, 1024 elements at a time (whole blocks of a quantised row, k-quants' too),
              * rounded by the vectorised cpu_f16_from_f32 (nearest even, the bits of tide_f32_to_f16):
              * 2.2x faster than 32 elements a call rounded one by one, which took 5 s for
              * Qwen3-VL-30B-A3B's tower on an H100 machine */
        size_t srb = ggml_row_size(x->type, in);
        uint16_t *h = (uint16_t *)(void *)dst;
        float tmp[1024];
        for (uint64_t r = 0; r < out; r++)
            for (uint64_t c0 = 0; c0 < in; c0 += 1024) {
                uint64_t len = in - c0 < 1024 ? in - c0 : 1024;
                ggml_dequantize(x->type, (const uint8_t *)x->data + r * srb + ggml_row_size(x->type, c0), tmp, len);
                cpu_f16_from_f32(h + r * in + c0, tmp, len);
            }
    }
    t->used += rb * out;
    *w = (struct tensor){.type = ty, .ne = {in, out}, .data = dst, .row_bytes = rb};
}

struct tensor q3v_patch_tensor(const struct qwen3vl_tower *t, float *p, uint64_t K, uint64_t D)
{
    if (!t->tc)
        return (struct tensor){.type = GGML_TYPE_F32, .ne = {K, D}, .data = p, .row_bytes = sizeof(float) * K};
    /* in place, forward: half i lands on bytes 2i..2i+1, which belong to floats already read;
     * through memcpy, since the bytes change type */
    uint8_t *b = (uint8_t *)p;
    for (size_t i = 0; i < K * D; i++) {
        float v;
        memcpy(&v, b + 4 * i, sizeof v);
        uint16_t h = tide_f32_to_f16(v);
        memcpy(b + 2 * i, &h, sizeof h);
    }
    return (struct tensor){.type = GGML_TYPE_F16, .ne = {K, D}, .data = p, .row_bytes = 2 * K};
}

size_t qwen3vl_tc_scratch(const struct qwen3vl_tower *t, const struct backend *be, long max_patches)
{
    if (!be || !be->i->matmul_scratch || max_patches <= 0)
        return 0;
    const struct qwen3vl_hparams *hp = &t->hp;
    /* two pools: the CUDA backend's quantised products take its scratch, its f16 / bf16 ones
     * (TIDE_F16_MMA) its sum buffer, and both stay allocated: the largest of each, added */
    size_t most = 0, most16 = 0;
#define S(w, n)                                                                                                  \
    do {                                                                                                         \
        if ((w).data) {                                                                                          \
            size_t b_ = be->i->matmul_scratch(be->ctx, &(w), (int)(n));                                         \
            size_t *m_ = (w).type == GGML_TYPE_F16 || (w).type == GGML_TYPE_BF16 ? &most16 : &most;             \
            *m_ = b_ > *m_ ? b_ : *m_;                                                                           \
        }                                                                                                        \
    } while (0)
    S(t->patch, max_patches);
    for (int l = 0; l < hp->n_layer; l++) {
        const struct q3v_layer *L = &t->layers[l];
        S(L->q, max_patches);
        S(L->k, max_patches);
        S(L->v, max_patches);
        S(L->o, max_patches);
        S(L->gate, max_patches);
        S(L->up, max_patches);
        S(L->down, max_patches);
    }
    for (int k = 0; k <= hp->n_deepstack; k++) { /* the mergers see the merged tokens */
        const struct q3v_merger *m = k < hp->n_deepstack ? &t->deepstack[k] : &t->main;
        S(m->fc1, max_patches / 4);
        S(m->fc2, max_patches / 4);
    }
#undef S
    return most + most16;
}

static void block_free(const struct qwen3vl_tower *t, void *p)
{
    if (p && t->a.free)
        t->a.free(t->a.ud, p);
    else
        free(p);
}

void qwen3vl_free(struct qwen3vl_tower *t)
{
    if (!t)
        return;
    block_free(t, t->block);
    block_free(t, t->ws);
    free(t->layers);
    free(t);
}

int qwen3vl_upload(struct qwen3vl_tower **out, const struct qwen3vl_tower *host, const struct clip_alloc *a,
                   const struct backend *be, long max_patches, char *err, size_t errlen)
{
    *out = NULL;
    const struct qwen3vl_hparams *hp = &host->hp;
    struct qwen3vl_tower *t = calloc(1, sizeof *t);
    if (!t)
        return tide_fail(TIDE_ENOMEM, err, errlen, "qwen3vl: out of memory");
    *t = *host;
    t->a = *a;
    t->block = NULL;
    t->be = be;
    t->host = host;
    t->ws_patches = max_patches;
    t->layers = calloc((size_t)hp->n_layer, sizeof *t->layers);
    size_t wb = host->block_bytes, wsb = qwen3vl_workspace_bytes(hp, max_patches);
    if (t->layers) {
        t->block = a->alloc(a->ud, wb ? wb : 1);
        t->ws = t->block ? a->alloc(a->ud, wsb) : NULL;
    }
    if (!t->layers || !t->block || !t->ws) {
        qwen3vl_free(t);
        return tide_fail(TIDE_ENOMEM, err, errlen, "qwen3vl: no room for the encoder (%.1f MiB of weights, %.1f MiB of "
                         "workspace)", (double)wb / (1 << 20), (double)wsb / (1 << 20));
    }
    be->i->upload(be->ctx, t->block, host->block, wb);
    /* every weight at the same offset in the device block as in the host one */
#define RBF(p) ((p) = (p) ? (float *)(void *)(t->block + ((const uint8_t *)(p) - host->block)) : NULL)
#define RBT(w) ((w).data = (w).data ? t->block + ((const uint8_t *)(w).data - host->block) : NULL)
    RBT(t->patch), RBF(t->patch_b), RBF(t->pos), RBF(t->post_w), RBF(t->post_b);
    for (int l = 0; l < hp->n_layer; l++) {
        struct q3v_layer *L = &t->layers[l];
        *L = host->layers[l];
        RBF(L->ln1_w), RBF(L->ln1_b), RBT(L->o), RBF(L->o_b), RBF(L->ln2_w), RBF(L->ln2_b), RBT(L->up);
        RBF(L->up_b), RBT(L->down), RBF(L->down_b), RBT(L->q), RBT(L->k), RBT(L->v), RBF(L->q_b), RBF(L->k_b);
        RBF(L->v_b), RBT(L->gate), RBF(L->gate_b);
    }
    for (int k = 0; k <= hp->n_deepstack; k++) {
        struct q3v_merger *m = k < hp->n_deepstack ? &t->deepstack[k] : &t->main;
        RBF(m->norm_w), RBF(m->norm_b), RBT(m->fc1), RBF(m->fc1_b), RBT(m->fc2), RBF(m->fc2_b);
    }
#undef RBF
#undef RBT
    *out = t;
    return 0;
}
