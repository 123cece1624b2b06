/* qwen3vl.c - the Qwen-VL vision towers (see qwen3vl.h for the computation): the header and
 * the walk over the weights (into one block: f32 copies whatever the file stores, or the
 * tensor-core layout of qwen3vl_weights.c, which also uploads the block), then the steps of
 * llama.cpp's graphs (tools/mtmd/models/qwen3vl.cpp and qwen2vl.cpp there) through a backend's
 * ops, or as plain loops (the tests' reference). */
#include "qwen3vl.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common.h"
#include "../engine/backend.h"
#include "../engine/gguf.h"
#include "../engine/mrope.h"
#include "qwen3vl_internal.h"


static int need_u32(const struct gguf_file *g, const char *key, int *out, char *err, size_t errlen)
{
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc || v == 0 || v > (1u << 20))
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: %s must be a positive integer", key);
    *out = (int)v;
    return 0;
}

static int f32_arr3(const struct gguf_file *g, const char *key, float *out, char *err, size_t errlen)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type != GGUF_TYPE_FLOAT32 || kv->v.arr.n != 3)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: %s must be 3 floats", key);
    memcpy(out, kv->v.arr.data, 12);
    return 0;
}

static const struct gguf_tensor *shape(const struct gguf_file *g, const char *name, uint64_t a, uint64_t b,
                                       uint64_t c, uint64_t d, int *rc, char *err, size_t errlen)
{
    if (*rc)
        return NULL;
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        *rc = tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: missing tensor %s", name);
        return NULL;
    }
    if (t->ne[0] != a || t->ne[1] != b || t->ne[2] != c || t->ne[3] != d) {
        *rc = tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: tensor %s is [%llu, %llu, %llu, %llu], expected [%llu, %llu, %llu, %llu]",
                   name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                   (unsigned long long)t->ne[3], (unsigned long long)a, (unsigned long long)b, (unsigned long long)c,
                   (unsigned long long)d);
        return NULL;
    }
    uint32_t ty = t->type;
    if (ty != GGML_TYPE_F32 && ty != GGML_TYPE_F16 && ty != GGML_TYPE_BF16 && ty != GGML_TYPE_Q8_0 && ty != GGML_TYPE_Q4_0) {
        *rc = tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: tensor %s has type %s (f32, f16, bf16, q8_0, q4_0 are read)",
                   name, ggml_type_name(ty));
        return NULL;
    }
    return t;
}

static int read_keys(const struct gguf_file *g, struct qwen3vl_hparams *hp, char *err, size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    struct gguf_str s;
    if (gguf_get_str(g, "clip.projector_type", &s) && gguf_get_str(g, "clip.vision.projector_type", &s))
        return tide_fail(TIDE_ENOTFOUND, err, errlen, "mmproj: missing key clip.projector_type");
    if (gguf_str_eq(s, "qwen3vl_merger"))
        hp->kind = QWENVL_3;
    else if (gguf_str_eq(s, "qwen2vl_merger"))
        hp->kind = QWENVL_2;
    else if (gguf_str_eq(s, "qwen2.5vl_merger"))
        hp->kind = QWENVL_25;
    else
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                    "mmproj: projector type '%.*s' is not qwen3vl_merger, qwen2vl_merger or qwen2.5vl_merger",
                    (int)(s.len > 64 ? 64 : s.len), s.ptr);
    int rc;
    if ((rc = need_u32(g, "clip.vision.patch_size", &hp->patch, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.embedding_length", &hp->n_embd, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.feed_forward_length", &hp->n_ff, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.block_count", &hp->n_layer, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.attention.head_count", &hp->n_head, err, errlen)))
        return rc;
    hp->merge = 2;
    uint32_t u;
    if (!gguf_get_u32(g, "clip.vision.spatial_merge_size", &u) && u != 2)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: spatial_merge_size %u (only 2x2 merging is built)", u);
    if (gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &hp->eps))
        return tide_fail(TIDE_ENOTFOUND, err, errlen, "mmproj: missing key clip.vision.attention.layer_norm_epsilon");
    if ((rc = f32_arr3(g, "clip.vision.image_mean", hp->mean, err, errlen)) ||
        (rc = f32_arr3(g, "clip.vision.image_std", hp->std, err, errlen)))
        return rc;
    for (int c = 0; c < 3; c++)
        if (!(hp->std[c] > 0))
            return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: image_std must be positive");
    /* the MLP's activation as llama.cpp picks it: use_gelu, use_silu, else quick GELU */
    bool gelu = false, silu = false;
    gguf_get_bool(g, "clip.use_gelu", &gelu);
    gguf_get_bool(g, "clip.use_silu", &silu);
    if (gelu && silu)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: both clip.use_gelu and clip.use_silu are set");
    hp->act = gelu ? ACT_GELU : silu ? ACT_SILU : ACT_GELU_QUICK;
    if (hp->kind == QWENVL_25) { /* llama.cpp requires the pattern of Qwen2.5-VL's full-attention blocks */
        if ((rc = need_u32(g, "clip.vision.n_wa_pattern", &hp->n_wa_pattern, err, errlen)))
            return rc;
        if (hp->act != ACT_SILU) /* the gated MLP runs as one swiglu op */
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: a qwen2.5vl_merger tower's MLP must be SiLU (clip.use_silu)");
        hp->window = 112 / (hp->patch * hp->merge);
        if (hp->window == 0)
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: patch %d is too large for 112-pixel windows", hp->patch);
    }
    int hd = hp->n_embd / hp->n_head;
    if (hp->n_embd % hp->n_head || hd % 4)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: width %d is not %d heads of a multiple of 4", hp->n_embd,
                    hp->n_head);
    /* llama.cpp's limits for the Qwen-VL towers: 8 to 4096 merged tokens */
    long area = (long)hp->patch * hp->patch * hp->merge * hp->merge;
    hp->min_pixels = 8 * area;
    hp->max_pixels = 4096 * area;
    return 0;
}

/* Keys and every tensor's shape; with t set, the weights too (as f32). */
static int walk(const struct gguf_file *g, struct qwen3vl_hparams *hp, struct qwen3vl_tower *t, char *err,
                size_t errlen)
{
    int rc = read_keys(g, hp, err, errlen);
    if (rc)
        return rc;
    bool q3 = hp->kind == QWENVL_3, q25 = hp->kind == QWENVL_25;
    const struct gguf_tensor *pos = gguf_find_tensor(g, "v.position_embd.weight"), *mm2 = gguf_find_tensor(g, "mm.2.weight");
    if ((q3 && !pos) || !mm2)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: missing tensor %s", mm2 ? "v.position_embd.weight" : "mm.2.weight");
    if (!q3 && (pos || gguf_find_tensor(g, "v.patch_embd.bias")))
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: a %s tower has no position table or patch bias",
                    q25 ? "qwen2.5vl_merger" : "qwen2vl_merger");
    if (q3) {
        hp->pos_side = (int)sqrt((double)pos->ne[1]);
        if ((uint64_t)hp->pos_side * hp->pos_side != pos->ne[1] || hp->pos_side == 0)
            return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: the position table's %llu rows are not a square",
                        (unsigned long long)pos->ne[1]);
    }
    hp->n_embd_text = (int)mm2->ne[1];
    uint64_t D = hp->n_embd, F = hp->n_ff, p = hp->patch, M = 4 * D, T = hp->n_embd_text;
    char n[96];
    hp->n_deepstack = 0;
    hp->weight_floats = 0;
    hp->tc_bytes = 0;
    for (int l = 0; l < hp->n_layer && q3; l++) {
        snprintf(n, sizeof n, "v.deepstack.%d.fc1.weight", l);
        if (!gguf_find_tensor(g, n))
            continue;
        if (hp->n_deepstack == QWEN3VL_MAX_DEEPSTACK)
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: more than %d deepstack layers", QWEN3VL_MAX_DEEPSTACK);
        hp->deepstack_layer[hp->n_deepstack++] = l;
    }
    /* each tensor into the tower's block (its size is the first walk's count): vectors as f32,
     * products as f32 or in the device layout (qwen3vl_weights.c) */
#define TENSOR(dst, name, a, b, c, d)                                                        \
    do {                                                                                     \
        const struct gguf_tensor *x_ = shape(g, name, a, b, c, d, &rc, err, errlen);         \
        float *p_ = x_ ? q3v_take_f32(hp, t, x_, (size_t)((a) * (b) * (c) * (d))) : NULL;    \
        if (p_)                                                                              \
            (dst) = p_;                                                                      \
    } while (0)
    /* a product's weight and bias: STEM.weight (in -> out) and STEM.bias */
#define LINEAR(w, b, stem, in, out)                                                          \
    do {                                                                                     \
        char s_[128];                                                                        \
        snprintf(s_, sizeof s_, "%s.weight", stem);                                          \
        const struct gguf_tensor *w_ = shape(g, s_, in, out, 1, 1, &rc, err, errlen);        \
        if (w_)                                                                              \
            q3v_take_matrix(hp, t, w_, in, out, &(w));                                       \
        snprintf(s_, sizeof s_, "%s.bias", stem);                                            \
        TENSOR(b, s_, out, 1, 1, 1);                                                         \
    } while (0)
    float *w0 = NULL, *w1 = NULL;
    TENSOR(w0, "v.patch_embd.weight", p, p, 3, D);
    TENSOR(w1, "v.patch_embd.weight.1", p, p, 3, D);
    float *pb = NULL, *pe = NULL, *post_w = NULL, *post_b = NULL;
    if (q3) {
        TENSOR(pb, "v.patch_embd.bias", D, 1, 1, 1);
        TENSOR(pe, "v.position_embd.weight", D, pos->ne[1], 1, 1);
    }
    TENSOR(post_w, "v.post_ln.weight", D, 1, 1, 1);
    if (!q25) /* Qwen2.5-VL's norms are RMSNorms: weights only */
        TENSOR(post_b, "v.post_ln.bias", D, 1, 1, 1);
    if (t) {
        t->patch_b = pb;
        t->pos = pe;
        t->post_w = post_w;
        t->post_b = post_b;
        if (w0 && w1) { /* a still image is one frame twice: the two kernels act as one */
            for (uint64_t i = 0; i < p * p * 3 * D; i++)
                w0[i] += w1[i];
            t->patch = q3v_patch_tensor(t, w0, p * p * 3, D);
        }
    }
    for (int l = 0; l < hp->n_layer && !rc; l++) {
        struct q3v_layer dummy, *L = t ? &t->layers[l] : &dummy;
#define B(s) (snprintf(n, sizeof n, "v.blk.%d.%s", l, s), n)
        TENSOR(L->ln1_w, B("ln1.weight"), D, 1, 1, 1);
        if (!q25)
            TENSOR(L->ln1_b, B("ln1.bias"), D, 1, 1, 1);
        if (q3) { /* attn_qkv's rows: q, then k, then v */
            struct tensor qkv = {0};
            float *qkv_b = NULL;
            LINEAR(qkv, qkv_b, B("attn_qkv"), D, 3 * D);
            if (qkv.data && qkv_b) { /* D rows each, in the file's (or the device's) type */
                L->q = L->k = L->v = qkv;
                L->q.ne[1] = L->k.ne[1] = L->v.ne[1] = D;
                L->k.data = (const uint8_t *)qkv.data + D * qkv.row_bytes;
                L->v.data = (const uint8_t *)qkv.data + 2 * D * qkv.row_bytes;
                L->q_b = qkv_b, L->k_b = qkv_b + D, L->v_b = qkv_b + 2 * D;
            }
        } else { /* the converter splits the checkpoint's qkv */
            LINEAR(L->q, L->q_b, B("attn_q"), D, D);
            LINEAR(L->k, L->k_b, B("attn_k"), D, D);
            LINEAR(L->v, L->v_b, B("attn_v"), D, D);
        }
        LINEAR(L->o, L->o_b, B("attn_out"), D, D);
        TENSOR(L->ln2_w, B("ln2.weight"), D, 1, 1, 1);
        if (!q25)
            TENSOR(L->ln2_b, B("ln2.bias"), D, 1, 1, 1);
        if (q25)
            LINEAR(L->gate, L->gate_b, B("ffn_gate"), D, F);
        LINEAR(L->up, L->up_b, B("ffn_up"), D, F);
        LINEAR(L->down, L->down_b, B("ffn_down"), F, D);
#undef B
        L->deepstack = -1;
        for (int k = 0; k < hp->n_deepstack; k++)
            if (hp->deepstack_layer[k] == l)
                L->deepstack = k;
    }
    for (int k = 0; k < hp->n_deepstack && !rc; k++) {
        struct q3v_merger dummy, *m = t ? &t->deepstack[k] : &dummy;
#define B(s) (snprintf(n, sizeof n, "v.deepstack.%d.%s", hp->deepstack_layer[k], s), n)
        TENSOR(m->norm_w, B("norm.weight"), M, 1, 1, 1);
        TENSOR(m->norm_b, B("norm.bias"), M, 1, 1, 1);
        LINEAR(m->fc1, m->fc1_b, B("fc1"), M, M);
        LINEAR(m->fc2, m->fc2_b, B("fc2"), M, T);
#undef B
    }
    struct q3v_merger dummy, *mm = t ? &t->main : &dummy;
    LINEAR(mm->fc1, mm->fc1_b, "mm.0", M, M);
    LINEAR(mm->fc2, mm->fc2_b, "mm.2", M, T);
#undef LINEAR
#undef TENSOR
    if (!rc && gguf_find_tensor(g, "v.pre_ln.weight"))
        rc = tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: a pre-LN in a qwen3vl_merger tower is not read");
    return rc;
}

int qwen3vl_read_hparams(const char *path, struct qwen3vl_hparams *hp, char *err, size_t errlen)
{
    struct gguf_file g;
    int rc = gguf_open(&g, path, err, errlen);
    if (rc)
        return rc;
    rc = walk(&g, hp, NULL, err, errlen);
    gguf_close(&g);
    return rc;
}

/* The tower of path with its weights' block from a (NULL: malloc): all f32, or with tc the
 * device layout (qwen3vl_load_tc). */
static int load(const char *path, const struct clip_alloc *a, bool tc, struct qwen3vl_tower **out, char *err,
                size_t errlen)
{
    *out = NULL;
    struct gguf_file g;
    int rc = gguf_open(&g, path, err, errlen);
    if (rc)
        return rc;
    struct qwen3vl_hparams hp;
    if ((rc = walk(&g, &hp, NULL, err, errlen))) {
        gguf_close(&g);
        return rc;
    }
    struct qwen3vl_tower *t = calloc(1, sizeof *t);
    if (t) {
        if (a)
            t->a = *a;
        t->tc = tc;
        t->layers = calloc((size_t)hp.n_layer, sizeof *t->layers);
        size_t bytes = tc ? qwen3vl_weight_bytes_tc(&hp) : qwen3vl_weight_bytes(&hp);
        t->block_bytes = bytes;
        t->block = a ? a->alloc(a->ud, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
    }
    if (!t || !t->layers || !t->block)
        rc = TIDE_ENOMEM;
    else
        rc = walk(&g, &t->hp, t, err, errlen);
    gguf_close(&g);
    if (rc) {
        qwen3vl_free(t);
        return rc == TIDE_ENOMEM ? tide_fail(rc, err, errlen, "mmproj: out of memory for the weights") : rc;
    }
    *out = t;
    return 0;
}

int qwen3vl_load_with(const char *path, const struct clip_alloc *a, struct qwen3vl_tower **out, char *err,
                      size_t errlen)
{
    return load(path, a, false, out, err, errlen);
}

int qwen3vl_load_tc(const char *path, const struct clip_alloc *a, struct qwen3vl_tower **out, char *err,
                    size_t errlen)
{
    return load(path, a, true, out, err, errlen);
}

int qwen3vl_load(const char *path, struct qwen3vl_tower **out, char *err, size_t errlen)
{
    return qwen3vl_load_with(path, NULL, out, err, errlen);
}

const struct qwen3vl_hparams *qwen3vl_hparams_of(const struct qwen3vl_tower *t) { return &t->hp; }

struct dynres_rules qwen3vl_rules(const struct qwen3vl_hparams *hp, int max_tokens)
{
    return (struct dynres_rules){hp->patch, hp->merge, hp->min_pixels, hp->max_pixels, max_tokens};
}

size_t qwen3vl_workspace_bytes(const struct qwen3vl_hparams *hp, long n_patches)
{
    size_t n = (size_t)n_patches, D = (size_t)hp->n_embd, F = (size_t)hp->n_ff, T = (size_t)hp->n_embd_text;
    /* x, xn, attention out, q, k, v, ffn (twice for a gated MLP), the mergers' input and hidden
     * (n / 4 rows of 4D each), the attention's scratch (attention_full's; its (n, n) scores),
     * the projections, the patches' pixels (3 p^2 each) */
    size_t gate = hp->kind == QWENVL_25 ? n * F : 0, P = 3 * (size_t)hp->patch * hp->patch;
    return sizeof(float) * (n * (3 * D + 3 * D + F) + gate + 2 * n * D +
                            attention_full_ws_floats((int)n, hp->n_embd / hp->n_head) + (n / 4) * T + n * P);
}

long qwen3vl_max_patches(const struct qwen3vl_hparams *hp, int max_tokens)
{
    long area = (long)hp->patch * hp->patch * hp->merge * hp->merge, most = hp->max_pixels / area;
    if (max_tokens > 0 && max_tokens < most)
        most = max_tokens;
    return most * hp->merge * hp->merge;
}

int qwen3vl_estimate(const char *path, int max_tokens, size_t *weights, size_t *workspace, char *err, size_t errlen)
{
    struct qwen3vl_hparams hp;
    int rc = qwen3vl_read_hparams(path, &hp, err, errlen);
    if (rc)
        return rc;
    *weights = qwen3vl_weight_bytes(&hp);
    *workspace = qwen3vl_workspace_bytes(&hp, qwen3vl_max_patches(&hp, max_tokens));
    return 0;
}

/* ---- the computation ---- */

/* Each step through the backend's op when be is set (the CPU backend: threaded products, the
 * encoder ops clip.c uses), else as plain loops (the reference the unit test holds the ops to). */

/* y[t] = W x[t] + b for n rows (W: in -> out; f32 for the plain loops, which only a tower from
 * qwen3vl_load runs) */
static void linear(const struct backend *be, const struct tensor *W, const float *b, const float *x, float *y, int n)
{
    int in = (int)W->ne[0], out = (int)W->ne[1];
    if (be) {
        be->i->matmul(be->ctx, W, x, y, n);
        if (b)
            be->i->add_bias(be->ctx, y, b, n, out);
        return;
    }
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * in;
        float *yt = y + (size_t)t * out;
        for (int r = 0; r < out; r++) {
            const float *w = (const float *)W->data + (size_t)r * in;
            float s = 0;
            for (int c = 0; c < in; c++)
                s += w[c] * xt[c];
            yt[r] = s + (b ? b[r] : 0.0f);
        }
    }
}

static void layernorm(const struct backend *be, const float *x, float *y, const float *w, const float *b, int n,
                      int dim, float eps)
{
    if (be) {
        be->i->layernorm(be->ctx, x, y, w, b, n, dim, eps);
        return;
    }
    for (int t = 0; t < n; t++) {
        const float *v = x + (size_t)t * dim;
        float *o = y + (size_t)t * dim;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++)
            mean += v[i];
        mean /= dim;
        for (int i = 0; i < dim; i++)
            var += (v[i] - mean) * (v[i] - mean);
        float s = 1.0f / sqrtf((float)(var / dim) + eps);
        for (int i = 0; i < dim; i++)
            o[i] = (float)(v[i] - mean) * s * w[i] + b[i];
    }
}

/* LayerNorm with bias (qwen2vl, qwen3vl) or RMSNorm (qwen25vl), as the tower's blocks have */
static void block_norm(const struct backend *be, const struct qwen3vl_hparams *hp, const float *x, float *y,
                       const float *w, const float *b, int n, int dim)
{
    if (hp->kind != QWENVL_25) {
        layernorm(be, x, y, w, b, n, dim, hp->eps);
        return;
    }
    if (be) {
        struct tensor wt = {.type = GGML_TYPE_F32, .ne = {(uint64_t)dim, 1}, .data = w,
                            .row_bytes = sizeof(float) * (size_t)dim};
        be->i->rmsnorm(be->ctx, x, &wt, y, dim, n, hp->eps);
        return;
    }
    for (int t = 0; t < n; t++) {
        const float *v = x + (size_t)t * dim;
        float *o = y + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)v[i] * v[i];
        float s = 1.0f / sqrtf((float)(ss / dim) + hp->eps);
        for (int i = 0; i < dim; i++)
            o[i] = v[i] * s * w[i];
    }
}

/* GELU the tanh approximation (as ggml_gelu), quick GELU x sigmoid(1.702 x), SiLU */
static void activate(const struct backend *be, int act, float *x, size_t n)
{
    if (be) {
        be->i->activate(be->ctx, x, n, (enum act_kind)act);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (act == ACT_GELU)
            x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
        else
            x[i] = v / (1.0f + expf(act == ACT_SILU ? -v : -1.702f * v));
    }
}

static void gelu(const struct backend *be, float *x, size_t n) { activate(be, ACT_GELU, x, n); }

/* full attention of n tokens, H heads of hd: q, k, v, out (n, H hd) */
static void attention(const struct backend *be, const float *q, const float *k, const float *v, float *out, int n,
                      int H, int hd, float *ws)
{
    if (be) {
        be->i->attention_full(be->ctx, q, k, v, out, n, H, hd, ws);
        return;
    }
    int D = H * hd;
    float scale = 1.0f / sqrtf((float)hd), *sc = ws;
    for (int hh = 0; hh < H; hh++)
        for (int i = 0; i < n; i++) {
            const float *qi = q + (size_t)i * D + hh * hd;
            float mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *kj = k + (size_t)j * D + hh * hd;
                float s = 0;
                for (int e = 0; e < hd; e++)
                    s += qi[e] * kj[e];
                sc[j] = s * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j < n; j++) {
                sc[j] = expf(sc[j] - mx);
                sum += sc[j];
            }
            float *o = out + (size_t)i * D + hh * hd;
            for (int e = 0; e < hd; e++)
                o[e] = 0;
            for (int j = 0; j < n; j++) {
                const float *vj = v + (size_t)j * D + hh * hd;
                float pj = sc[j] / sum;
                for (int e = 0; e < hd; e++)
                    o[e] += pj * vj[e];
            }
        }
}

static void residual(const struct backend *be, float *x, const float *d, size_t n)
{
    if (be) {
        be->i->axpy(be->ctx, x, d, 1.0f, (int)n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* the ViT's 2-D rope of n patches (pos: host (n, 2) rows and columns) */
static void rope(const struct backend *be, float *v, int n, int H, int hd, const int32_t *pos)
{
    if (be)
        be->i->rope_2d(be->ctx, v, n, H, hd, pos, 10000.0f);
    else
        rope2d_rotate(v, n, H, hd, pos, 10000.0f);
}

/* qwen25vl's gated MLP: gate = silu(gate) * up */
static void swiglu(const struct backend *be, float *gate, const float *up, size_t n)
{
    if (be) {
        be->i->swiglu(be->ctx, gate, up, (int)n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* host bytes into the workspace (be's memory, or host memory without a backend) */
static void put(const struct backend *be, float *dst, const float *src, size_t n)
{
    if (be)
        be->i->upload(be->ctx, dst, src, sizeof(float) * n);
    else
        memcpy(dst, src, sizeof(float) * n);
}

/* Patch k of the merge order: its row and column in the patch grid (gw patches wide). */
static void patch_at(int k, int gw, int *py, int *px)
{
    int block = k / 4, in = k % 4, bw = gw / 2;
    *py = (block / bw) * 2 + in / 2;
    *px = (block % bw) * 2 + in % 2;
}

/* The position table (side x side rows of D) at patch (py, px) of a gw x gh grid: bilinear,
 * corners aligned, in float as ggml_interpolate does. */
static void pos_embed_at(const struct qwen3vl_tower *t, int py, int px, int gw, int gh, float *add)
{
    int S = t->hp.pos_side, D = t->hp.n_embd;
    float sfx = gw > 1 && S > 1 ? (float)(gw - 1) / (float)(S - 1) : (float)gw / (float)S;
    float sfy = gh > 1 && S > 1 ? (float)(gh - 1) / (float)(S - 1) : (float)gh / (float)S;
    float fy = (float)py / sfy, fx = (float)px / sfx;
    int y0 = (int)floorf(fy), x0 = (int)floorf(fx), y1 = y0 + 1, x1 = x0 + 1;
    y0 = y0 < 0 ? 0 : y0 > S - 1 ? S - 1 : y0;
    y1 = y1 < 0 ? 0 : y1 > S - 1 ? S - 1 : y1;
    x0 = x0 < 0 ? 0 : x0 > S - 1 ? S - 1 : x0;
    x1 = x1 < 0 ? 0 : x1 > S - 1 ? S - 1 : x1;
    float dy = fy - (float)y0, dx = fx - (float)x0;
    dy = dy < 0 ? 0 : dy > 1 ? 1 : dy;
    dx = dx < 0 ? 0 : dx > 1 ? 1 : dx;
    const float *a = t->pos + ((size_t)y0 * S + x0) * D, *b = t->pos + ((size_t)y0 * S + x1) * D;
    const float *c = t->pos + ((size_t)y1 * S + x0) * D, *d = t->pos + ((size_t)y1 * S + x1) * D;
    for (int i = 0; i < D; i++)
        add[i] += a[i] * (1 - dx) * (1 - dy) + b[i] * dx * (1 - dy) + c[i] * (1 - dx) * dy + d[i] * dx * dy;
}

/* A 2x2 merger: the four patches of each merged token side by side (rows of 4D), an optional
 * LayerNorm, fc1, GELU, fc2, into out's (host) column `col` (rows of ostride floats), merged
 * token k to row dst[k] (the image's row-major order; qwen25vl computes in window order);
 * with a backend the projections come back through hproj (host, n_tok rows of T). */
static void merge_project(const struct backend *be, const struct q3v_merger *m, const float *x, int n_tok, int D,
                          int T, float eps, float *hid, float *hid2, float *proj, float *hproj, float *out,
                          int ostride, int col, const int *dst)
{
    int M = 4 * D;
    if (m->norm_w)
        layernorm(be, x, hid, m->norm_w, m->norm_b, n_tok, M, eps);
    linear(be, &m->fc1, m->fc1_b, m->norm_w ? hid : x, hid2, n_tok);
    gelu(be, hid2, (size_t)n_tok * M);
    linear(be, &m->fc2, m->fc2_b, hid2, proj, n_tok);
    if (be) {
        be->i->download(be->ctx, hproj, proj, sizeof(float) * (size_t)n_tok * T);
        proj = hproj;
    }
    for (int k = 0; k < n_tok; k++)
        memcpy(out + (size_t)dst[k] * ostride + col, proj + (size_t)k * T, sizeof(float) * (size_t)T);
}

/* The merged tokens in the order the blocks see them: row-major, or for qwen25vl window by
 * window (windows of `window` tokens a side, row-major, each window's tokens row-major), as
 * llama.cpp reorders them. win_end[w]: the order's index past window w's last token. */
static int window_order(const struct qwen3vl_hparams *hp, int pw, int ph, int *order, int *win_end)
{
    int n_win = 0, k = 0;
    int G = hp->kind == QWENVL_25 ? hp->window : (pw > ph ? pw : ph);
    for (int y = 0; y < ph; y += G)
        for (int x = 0; x < pw; x += G) {
            for (int dy = 0; dy < G && y + dy < ph; dy++)
                for (int dx = 0; dx < G && x + dx < pw; dx++)
                    order[k++] = (y + dy) * pw + x + dx;
            win_end[n_win++] = k;
        }
    return n_win;
}

int qwen3vl_encode(const struct qwen3vl_tower *t, const struct backend *be, const uint8_t *rgb, int w, int h,
                   float *out, char *err, size_t errlen)
{
    const struct qwen3vl_hparams *hp = &t->hp;
    const struct qwen3vl_tower *src = t->host ? t->host : t; /* the host copy of the position table */
    if (t->be)
        be = t->be; /* an uploaded tower computes on its own backend */
    if (t->tc && !be) /* the plain loops read f32 weights only */
        return tide_fail(TIDE_EINVAL, err, errlen, "qwen3vl: a tensor-core layout tower needs a backend");
    int p = hp->patch, a = p * hp->merge, K = 3 * p * p;
    if (w <= 0 || h <= 0 || w % a || h % a)
        return tide_fail(TIDE_EINVAL, err, errlen, "qwen3vl: image %dx%d is not a multiple of %d a side", w, h, a);
    int gw = w / p, gh = h / p, n = gw * gh, n_tok = n / 4;
    if (t->ws && n > t->ws_patches)
        return tide_fail(TIDE_ERANGE, err, errlen, "qwen3vl: image %dx%d has %d patches, the encoder's workspace "
                         "holds %ld", w, h, n, t->ws_patches);
    int D = hp->n_embd, F = hp->n_ff, H = hp->n_head, hd = D / H, T = hp->n_embd_text;
    int ostride = T * (1 + hp->n_deepstack);
    float *ws = t->ws ? t->ws : malloc(qwen3vl_workspace_bytes(hp, n));
    /* host: the window order, each patch's row and column, its pixels, the position table's
     * share and the projections on their way back */
    int *order = malloc(sizeof(int) * 2 * (size_t)n_tok), *win_end = order ? order + n_tok : NULL;
    int32_t *pos = malloc(sizeof(int32_t) * 2 * (size_t)n);
    float *hpix = malloc(sizeof(float) * (size_t)n * K), *hpos = src->pos ? malloc(sizeof(float) * (size_t)n * D) : NULL;
    float *hproj = malloc(sizeof(float) * (size_t)n_tok * T);
    if (!ws || !order || !pos || !hpix || (src->pos && !hpos) || !hproj) {
        if (!t->ws)
            free(ws);
        free(order), free(pos), free(hpix), free(hpos), free(hproj);
        return tide_fail(TIDE_ENOMEM, err, errlen, "qwen3vl: out of memory for a %dx%d image", w, h);
    }
    int n_win = window_order(hp, gw / 2, gh / 2, order, win_end);
    size_t nD = (size_t)n * D;
    float *x = ws, *xn = x + nD, *ao = xn + nD, *q = ao + nD, *k = q + nD, *v = k + nD;
    float *ff = v + nD, *hid = ff + (size_t)n * F, *hid2 = hid + nD, *att = hid2 + nD;
    float *proj = att + attention_full_ws_floats(n, hd); /* n_tok rows of T */
    float *pix = proj + (size_t)n_tok * T;                /* n rows of 3 p^2 */
    float *ff2 = pix + (size_t)n * K;                     /* the gate's (n, F): qwen25vl */
    /* the patches in merge order (each 2x2 block's four together, the blocks in `order`):
     * normalised pixels in the kernel's (channel, row, column) order, the interpolated
     * position table (qwen3vl) */
    for (int i = 0; i < n; i++) {
        int py, px;
        patch_at(order[i / 4] * 4 + i % 4, gw, &py, &px);
        pos[2 * i] = py, pos[2 * i + 1] = px;
        float *row = hpix + (size_t)i * K;
        for (int c = 0; c < 3; c++)
            for (int ky = 0; ky < p; ky++)
                for (int kx = 0; kx < p; kx++) {
                    uint8_t u = rgb[((size_t)(py * p + ky) * w + (px * p + kx)) * 3 + c];
                    row[(c * p + ky) * p + kx] = ((float)u / 255.0f - hp->mean[c]) / hp->std[c];
                }
        if (hpos) {
            memset(hpos + (size_t)i * D, 0, sizeof(float) * (size_t)D);
            pos_embed_at(src, py, px, gw, gh, hpos + (size_t)i * D);
        }
    }
    /* patch embedding: the conv of both temporal kernels as one product, + bias + positions */
    put(be, pix, hpix, (size_t)n * K);
    linear(be, &t->patch, t->patch_b, pix, x, n);
    if (hpos) {
        put(be, xn, hpos, nD);
        residual(be, x, xn, nD);
    }
    for (int l = 0; l < hp->n_layer; l++) {
        const struct q3v_layer *L = &t->layers[l];
        block_norm(be, hp, x, xn, L->ln1_w, L->ln1_b, n, D);
        linear(be, &L->q, L->q_b, xn, q, n);
        linear(be, &L->k, L->k_b, xn, k, n);
        linear(be, &L->v, L->v_b, xn, v, n);
        rope(be, q, n, H, hd, pos);
        rope(be, k, n, H, hd, pos);
        bool full = hp->kind != QWENVL_25 || (l + 1) % hp->n_wa_pattern == 0;
        if (full)
            attention(be, q, k, v, ao, n, H, hd, att);
        else /* a window's patches are a contiguous range in this order: attention within it */
            for (int wi = 0, s0 = 0; wi < n_win; s0 = win_end[wi++]) {
                size_t o = (size_t)s0 * 4 * D;
                attention(be, q + o, k + o, v + o, ao + o, (win_end[wi] - s0) * 4, H, hd, att);
            }
        linear(be, &L->o, L->o_b, ao, xn, n);
        residual(be, x, xn, nD);
        block_norm(be, hp, x, xn, L->ln2_w, L->ln2_b, n, D);
        linear(be, &L->up, L->up_b, xn, ff, n);
        float *act = ff;
        if (L->gate.data) { /* silu(gate x) * up x */
            linear(be, &L->gate, L->gate_b, xn, ff2, n);
            swiglu(be, ff2, ff, (size_t)n * F);
            act = ff2;
        } else {
            activate(be, hp->act, ff, (size_t)n * F);
        }
        linear(be, &L->down, L->down_b, act, xn, n);
        residual(be, x, xn, nD);
        if (L->deepstack >= 0) /* this block's output, merged, is deepstack feature k */
            merge_project(be, &t->deepstack[L->deepstack], x, n_tok, D, T, hp->eps, hid, hid2, proj, hproj, out,
                          ostride, T * (1 + L->deepstack), order);
    }
    block_norm(be, hp, x, xn, t->post_w, t->post_b, n, D);
    merge_project(be, &t->main, xn, n_tok, D, T, hp->eps, hid, hid2, proj, hproj, out, ostride, 0, order);
    if (!t->ws)
        free(ws);
    free(order), free(pos), free(hpix), free(hpos), free(hproj);
    return 0;
}
