/* mmprojgen.c - a small random-weight mmproj in llama.cpp's clip layout. The keys and
 * tensor names are the ones clip.c reads (docs/VISION.md); shapes follow ggml (ne[0] is
 * the input dimension of a matrix). */
#include "mmprojgen.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/gguf.h"


/* splitmix64 + Box-Muller: deterministic on every platform */
struct rng { uint64_t s; };
static uint64_t rnext(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double runif(struct rng *r) { return ((rnext(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float rnorm(struct rng *r)
{
    double u = runif(r), v = runif(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

struct gen {
    struct gguf_writer *w;
    struct rng r;
    float *buf;
    size_t cap;
    bool oom;
};

/* base + std * N(0,1) for every element; vectors (biases, norms) are always f32, as
 * llama.cpp's converters store them. */
static void tensor(struct gen *g, const char *name, uint32_t type, uint32_t n_dims,
                   const uint64_t *ne, float base, float std)
{
    size_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) n *= ne[i];
    if (n > g->cap) {
        float *b = realloc(g->buf, n * sizeof(float));
        if (!b) { g->oom = true; return; }
        g->buf = b;
        g->cap = n;
    }
    for (size_t i = 0; i < n; i++) g->buf[i] = base + std * rnorm(&g->r);
    gguf_w_tensor(g->w, name, n_dims == 1 ? GGML_TYPE_F32 : type, n_dims, ne, g->buf);
}

static void vec(struct gen *g, const char *name, uint64_t n, float base, float std)
{
    tensor(g, name, GGML_TYPE_F32, 1, &n, base, std);
}

static void mat(struct gen *g, const char *name, uint32_t type, uint64_t in, uint64_t out,
                float gain)
{
    uint64_t ne[2] = {in, out};
    tensor(g, name, type, 2, ne, 0.0f, gain / sqrtf((float)in));
}

/* The tail every tower shares: the post-LN (D wide, with a bias unless post_bias is false), the
 * projector mm.0 (in -> hid) and mm.2 (hid -> T), then the file written and the generator's
 * memory freed. The output's scale is near the text model's token embeddings (std 0.7 in
 * modelgen) so image tokens are neither drowned nor dominant. */
static int finish(struct gen *g, const char *out, uint32_t type, uint32_t D, bool post_bias, uint32_t in, uint32_t hid,
                  uint32_t T, char *err, size_t errlen)
{
    vec(g, "v.post_ln.weight", D, 1.0f, 0.05f);
    if (post_bias)
        vec(g, "v.post_ln.bias", D, 0.0f, 0.02f);
    mat(g, "mm.0.weight", type, in, hid, 1.0f);
    vec(g, "mm.0.bias", hid, 0.0f, 0.02f);
    mat(g, "mm.2.weight", type, hid, T, 1.2f);
    vec(g, "mm.2.bias", T, 0.0f, 0.02f);
    free(g->buf);
    int rc = g->oom ? TIDE_ENOMEM : gguf_writer_write(g->w, out);
    gguf_writer_free(g->w);
    if (rc == TIDE_ENOMEM) return tide_fail(rc, err, errlen, "mmprojgen: out of memory");
    if (rc) return tide_fail(rc, err, errlen, "mmprojgen: cannot write %s: %s", out, tide_strerror(rc));
    return 0;
}

int mmprojgen_write(const struct mmprojgen_options *o, char *err, size_t errlen)
{
    if (!o->out) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: no output path");
    const uint32_t T = o->n_embd_text ? o->n_embd_text : 128;
    const uint32_t S = o->image_size ? o->image_size : 64;
    const uint32_t p = o->patch_size ? o->patch_size : 8;
    const uint32_t D = o->n_embd ? o->n_embd : 64;
    const uint32_t F = o->n_ff ? o->n_ff : 256;
    const uint32_t H = o->n_head ? o->n_head : 4;
    const uint32_t L = o->n_layer ? o->n_layer : 2;
    const uint32_t type = o->type < 0 ? GGML_TYPE_F16 : (uint32_t)o->type;
    if (S % p) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: image size %u is not a "
                           "multiple of patch size %u", S, p);
    if (D % H) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: width %u is not a multiple "
                           "of %u heads", D, H);
    if (F == D) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: n_ff must differ from "
                            "n_embd (readers tell fc1 from fc2 by shape)");
    if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && type != GGML_TYPE_BF16 &&
        type != GGML_TYPE_Q8_0)
        return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: type %s is not supported",
                    ggml_type_name(type));
    if (type == GGML_TYPE_Q8_0 && (D % 32 || F % 32 || T % 32))
        return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: q8_0 needs widths divisible by 32");
    const uint32_t n_patch = (S / p) * (S / p), n_pos = n_patch + (o->class_token ? 1 : 0);

    struct gen g = {.w = gguf_writer_new(), .r = {o->seed ? o->seed : 1}};
    if (!g.w) return tide_fail(TIDE_ENOMEM, err, errlen, "mmprojgen: out of memory");
    struct gguf_writer *w = g.w;
    gguf_w_str(w, "general.architecture", "clip");
    gguf_w_str(w, "general.name", "tide-mmproj");
    gguf_w_str(w, "general.description", "tide random-weight LLaVA-style vision tower (tests)");
    gguf_w_u32(w, "general.file_type", type == GGML_TYPE_F32 ? 0 : type == GGML_TYPE_F16 ? 1 :
                                       type == GGML_TYPE_Q8_0 ? 7 : 32);
    gguf_w_bool(w, "clip.has_text_encoder", false);
    gguf_w_bool(w, "clip.has_vision_encoder", true);
    gguf_w_bool(w, "clip.has_llava_projector", true);
    gguf_w_str(w, "clip.projector_type", "mlp");
    gguf_w_bool(w, "clip.use_gelu", !o->quick_gelu);
    gguf_w_u32(w, "clip.vision.image_size", S);
    gguf_w_u32(w, "clip.vision.patch_size", p);
    gguf_w_u32(w, "clip.vision.embedding_length", D);
    gguf_w_u32(w, "clip.vision.feed_forward_length", F);
    gguf_w_u32(w, "clip.vision.projection_dim", T);
    gguf_w_u32(w, "clip.vision.block_count", L);
    gguf_w_u32(w, "clip.vision.attention.head_count", H);
    gguf_w_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-5f);
    /* Every block runs: the projector reads the output of block L (0 = embeddings). */
    int32_t feat = (int32_t)L;
    gguf_w_arr_i32(w, "clip.vision.feature_layer", &feat, 1);
    /* The CLIP (OpenAI) normalisation, so the letterbox colour is llama.cpp's too. */
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    const float stdv[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    gguf_w_arr_f32(w, "clip.vision.image_mean", mean, 3);
    gguf_w_arr_f32(w, "clip.vision.image_std", stdv, 3);

    uint64_t pe[4] = {p, p, 3, D};
    tensor(&g, "v.patch_embd.weight", type == GGML_TYPE_Q8_0 ? GGML_TYPE_F16 : type, 4, pe,
           0.0f, 1.0f / sqrtf(3.0f * p * p));
    vec(&g, "v.patch_embd.bias", D, 0.0f, 0.02f);
    if (o->class_token) vec(&g, "v.class_embd", D, 0.0f, 0.5f);
    uint64_t pos[2] = {D, n_pos};
    tensor(&g, "v.position_embd.weight", type == GGML_TYPE_Q8_0 ? GGML_TYPE_F16 : type, 2, pos,
           0.0f, 0.2f);
    vec(&g, "v.pre_ln.weight", D, 1.0f, 0.05f);
    vec(&g, "v.pre_ln.bias", D, 0.0f, 0.02f);
    char nm[64];
    for (uint32_t l = 0; l < L; l++) {
#define N(s) (snprintf(nm, sizeof nm, "v.blk.%u.%s", l, s), nm)
        vec(&g, N("ln1.weight"), D, 1.0f, 0.05f);
        vec(&g, N("ln1.bias"), D, 0.0f, 0.02f);
        mat(&g, N("attn_q.weight"), type, D, D, 1.0f);
        vec(&g, N("attn_q.bias"), D, 0.0f, 0.02f);
        mat(&g, N("attn_k.weight"), type, D, D, 1.0f);
        vec(&g, N("attn_k.bias"), D, 0.0f, 0.02f);
        mat(&g, N("attn_v.weight"), type, D, D, 1.0f);
        vec(&g, N("attn_v.bias"), D, 0.0f, 0.02f);
        mat(&g, N("attn_out.weight"), type, D, D, 0.5f);
        vec(&g, N("attn_out.bias"), D, 0.0f, 0.02f);
        vec(&g, N("ln2.weight"), D, 1.0f, 0.05f);
        vec(&g, N("ln2.bias"), D, 0.0f, 0.02f);
        mat(&g, N("ffn_up.weight"), type, D, F, 1.0f);
        vec(&g, N("ffn_up.bias"), F, 0.0f, 0.02f);
        mat(&g, N("ffn_down.weight"), type, F, D, 0.5f);
        vec(&g, N("ffn_down.bias"), D, 0.0f, 0.02f);
#undef N
    }
    /* Projector D -> T -> T */
    return finish(&g, o->out, type, D, true, D, T, T, err, errlen);
}

/* Qwen3-VL's vision tower as llama.cpp's converter writes it: the temporal patch pair
 * (v.patch_embd.weight and .weight.1, each [p, p, 3, D]) with a bias, a learned position table
 * of (image_size / patch)^2 rows, blocks with a fused attn_qkv, deepstack mergers
 * (v.deepstack.N.{norm,fc1,fc2}, N the block they follow) and the 2x2 merger (post_ln, mm.0,
 * mm.2). No pre-LN, as the real model. */
/* kind 3: Qwen3-VL; 2: Qwen2-VL (no patch bias, no position table, no deepstack, attn_q/k/v
 * split as the converter writes them, quick-GELU MLP: neither use_gelu nor use_silu); 25:
 * Qwen2.5-VL (that with weight-only RMSNorms, a gated SiLU MLP with ffn_gate, use_silu and
 * n_wa_pattern 2: blocks 1, 3, ... attend fully, the others in windows). */
static int write_qwenvl(const struct mmprojgen_options *o, int kind, uint32_t n_deepstack, const uint32_t *ds_layers,
                        char *err, size_t errlen)
{
    bool q3 = kind == 3, q25 = kind == 25;
    if (!o->out) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: no output path");
    const uint32_t T = o->n_embd_text ? o->n_embd_text : 96;
    const uint32_t S = o->image_size ? o->image_size : q25 ? 112 : 64;
    const uint32_t p = o->patch_size ? o->patch_size : q25 ? 14 : 8; /* q25: 112-pixel windows of 4x4 merged tokens */
    const uint32_t D = o->n_embd ? o->n_embd : 64;
    const uint32_t F = o->n_ff ? o->n_ff : 128;
    const uint32_t H = o->n_head ? o->n_head : 4;
    const uint32_t L = o->n_layer ? o->n_layer : 4;
    const uint32_t type = o->type < 0 ? GGML_TYPE_F16 : (uint32_t)o->type;
    const uint32_t M = 4 * D; /* the merged width: 2x2 patches */
    if (S % p) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: image size %u is not a multiple of patch size %u", S, p);
    if (D % H || (D / H) % 4)
        return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: width %u must be %u heads of a multiple of 4", D, H);
    if (F == D) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: n_ff must differ from n_embd");
    if (!q3 && n_deepstack) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: only Qwen3-VL has deepstack layers");
    if (n_deepstack >= L) return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: %u deepstack layers of %u", n_deepstack, L);
    if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && type != GGML_TYPE_BF16 && type != GGML_TYPE_Q8_0)
        return tide_fail(TIDE_EINVAL, err, errlen, "mmprojgen: type %s is not supported", ggml_type_name(type));
    const uint32_t side = S / p;

    struct gen g = {.w = gguf_writer_new(), .r = {o->seed ? o->seed : 1}};
    if (!g.w) return tide_fail(TIDE_ENOMEM, err, errlen, "mmprojgen: out of memory");
    struct gguf_writer *w = g.w;
    gguf_w_str(w, "general.architecture", "clip");
    gguf_w_str(w, "general.name", q3 ? "tide-mmproj-qwen3vl" : q25 ? "tide-mmproj-qwen25vl" : "tide-mmproj-qwen2vl");
    gguf_w_str(w, "general.description", q3 ? "tide random-weight Qwen3-VL vision tower (tests)"
                                         : q25 ? "tide random-weight Qwen2.5-VL vision tower (tests)"
                                               : "tide random-weight Qwen2-VL vision tower (tests)");
    gguf_w_u32(w, "general.file_type", type == GGML_TYPE_F32 ? 0 : type == GGML_TYPE_F16 ? 1 :
                                       type == GGML_TYPE_Q8_0 ? 7 : 32);
    gguf_w_bool(w, "clip.has_vision_encoder", true);
    gguf_w_str(w, "clip.projector_type", q3 ? "qwen3vl_merger" : q25 ? "qwen2.5vl_merger" : "qwen2vl_merger");
    if (q3)
        gguf_w_bool(w, "clip.use_gelu", true);
    if (q25) {
        gguf_w_bool(w, "clip.use_silu", true);
        gguf_w_u32(w, "clip.vision.n_wa_pattern", 2);
    }
    gguf_w_u32(w, "clip.vision.image_size", S);
    gguf_w_u32(w, "clip.vision.patch_size", p);
    gguf_w_u32(w, "clip.vision.embedding_length", D);
    gguf_w_u32(w, "clip.vision.feed_forward_length", F);
    gguf_w_u32(w, "clip.vision.projection_dim", T);
    gguf_w_u32(w, "clip.vision.block_count", L);
    gguf_w_u32(w, "clip.vision.attention.head_count", H);
    gguf_w_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
    gguf_w_u32(w, "clip.vision.spatial_merge_size", 2);
    const float half[3] = {0.5f, 0.5f, 0.5f};
    /* Qwen2-VL's and Qwen2.5-VL's preprocessors normalise with CLIP's mean and std */
    const float clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    const float clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    gguf_w_arr_f32(w, "clip.vision.image_mean", q3 ? half : clip_mean, 3);
    gguf_w_arr_f32(w, "clip.vision.image_std", q3 ? half : clip_std, 3);

    uint64_t pe[4] = {p, p, 3, D};
    uint32_t pt = type == GGML_TYPE_Q8_0 ? GGML_TYPE_F16 : type;
    tensor(&g, "v.patch_embd.weight", pt, 4, pe, 0.0f, 0.7f / sqrtf(3.0f * p * p));
    tensor(&g, "v.patch_embd.weight.1", pt, 4, pe, 0.0f, 0.7f / sqrtf(3.0f * p * p));
    if (q3) {
        vec(&g, "v.patch_embd.bias", D, 0.0f, 0.02f);
        uint64_t pos[2] = {D, (uint64_t)side * side};
        tensor(&g, "v.position_embd.weight", pt, 2, pos, 0.0f, 0.5f);
    }
    char nm[64];
    for (uint32_t l = 0; l < L; l++) {
#define N(s) (snprintf(nm, sizeof nm, "v.blk.%u.%s", l, s), nm)
        vec(&g, N("ln1.weight"), D, 1.0f, 0.05f);
        if (!q25)
            vec(&g, N("ln1.bias"), D, 0.0f, 0.02f);
        if (q3) {
            mat(&g, N("attn_qkv.weight"), type, D, 3 * D, 1.0f);
            vec(&g, N("attn_qkv.bias"), 3 * D, 0.0f, 0.02f);
        } else {
            mat(&g, N("attn_q.weight"), type, D, D, 1.0f);
            vec(&g, N("attn_q.bias"), D, 0.0f, 0.02f);
            mat(&g, N("attn_k.weight"), type, D, D, 1.0f);
            vec(&g, N("attn_k.bias"), D, 0.0f, 0.02f);
            mat(&g, N("attn_v.weight"), type, D, D, 1.0f);
            vec(&g, N("attn_v.bias"), D, 0.0f, 0.02f);
        }
        mat(&g, N("attn_out.weight"), type, D, D, 0.5f);
        vec(&g, N("attn_out.bias"), D, 0.0f, 0.02f);
        vec(&g, N("ln2.weight"), D, 1.0f, 0.05f);
        if (!q25)
            vec(&g, N("ln2.bias"), D, 0.0f, 0.02f);
        if (q25) {
            mat(&g, N("ffn_gate.weight"), type, D, F, 1.0f);
            vec(&g, N("ffn_gate.bias"), F, 0.0f, 0.02f);
        }
        mat(&g, N("ffn_up.weight"), type, D, F, 1.0f);
        vec(&g, N("ffn_up.bias"), F, 0.0f, 0.02f);
        mat(&g, N("ffn_down.weight"), F % 32 && type == GGML_TYPE_Q8_0 ? GGML_TYPE_F16 : type, F, D, 0.5f);
        vec(&g, N("ffn_down.bias"), D, 0.0f, 0.02f);
#undef N
        for (uint32_t k = 1; k <= n_deepstack; k++) {
            if (l != (ds_layers ? ds_layers[k - 1] : k * L / (n_deepstack + 1)))
                continue;
#define N(s) (snprintf(nm, sizeof nm, "v.deepstack.%u.%s", l, s), nm)
            vec(&g, N("norm.weight"), M, 1.0f, 0.05f);
            vec(&g, N("norm.bias"), M, 0.0f, 0.02f);
            mat(&g, N("fc1.weight"), type, M, M, 1.0f);
            vec(&g, N("fc1.bias"), M, 0.0f, 0.02f);
            mat(&g, N("fc2.weight"), type, M, T, 1.2f);
            vec(&g, N("fc2.bias"), T, 0.0f, 0.02f);
#undef N
        }
    }
    /* the 2x2 merger M -> M -> T (Qwen2.5-VL's post-norm is an RMSNorm: no bias) */
    return finish(&g, o->out, type, D, !q25, M, M, T, err, errlen);
}

int mmprojgen_write_qwen3vl(const struct mmprojgen_options *o, uint32_t n_deepstack, char *err, size_t errlen)
{
    return write_qwenvl(o, 3, n_deepstack, NULL, err, errlen);
}

int mmprojgen_write_qwen2vl(const struct mmprojgen_options *o, bool qwen25, char *err, size_t errlen)
{
    struct mmprojgen_options r = *o;
    if (!r.n_embd_text)
        r.n_embd_text = 128; /* the qwen2vl text preset's width */
    return write_qwenvl(&r, qwen25 ? 25 : 2, 0, NULL, err, errlen);
}

int mmprojgen_write_qwen3vl_30b(const struct mmprojgen_options *o, char *err, size_t errlen)
{
    struct mmprojgen_options r = {.out = o->out, .seed = o->seed, .type = o->type, .n_embd_text = 2048,
                                  .image_size = 768, .patch_size = 16, .n_embd = 1152, .n_ff = 4304, .n_head = 16,
                                  .n_layer = 27};
    static const uint32_t ds[3] = {8, 16, 24};
    return write_qwenvl(&r, 3, 3, ds, err, errlen);
}
