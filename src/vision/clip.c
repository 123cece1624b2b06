/* clip.c - load an mmproj GGUF (llama.cpp clip layout, `mlp` projector) and run it.
 * See clip.h for the contract and docs/VISION.md for the file layout. */
#include "clip.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN 64


static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static void *default_alloc(void *ud, size_t bytes) { (void)ud; return malloc(bytes ? bytes : 1); }
static void default_free(void *ud, void *p) { (void)ud; free(p); }

/* ---- hyper-parameters ---- */

static int get_f32_arr(const struct gguf_file *g, const char *key, float *out, int n,
                       char *err, size_t errlen)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return tide_fail(TIDE_ENOTFOUND, err, errlen, "mmproj: missing key %s", key);
    if (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type != GGUF_TYPE_FLOAT32 ||
        kv->v.arr.n < (uint64_t)n)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: %s must be an array of >= %d floats",
                    key, n);
    memcpy(out, kv->v.arr.data, sizeof(float) * (size_t)n);
    return 0;
}

static int need_u32(const struct gguf_file *g, const char *key, int *out, char *err, size_t errlen)
{
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == TIDE_ENOTFOUND) return tide_fail(rc, err, errlen, "mmproj: missing key %s", key);
    if (rc || v == 0 || v > (1u << 20))
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: %s must be a positive integer", key);
    *out = (int)v;
    return 0;
}

static int read_hparams(const struct gguf_file *g, struct clip_hparams *hp, char *err,
                        size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    struct gguf_str s;
    if (gguf_get_str(g, "clip.projector_type", &s) && gguf_get_str(g, "clip.vision.projector_type", &s))
        return tide_fail(TIDE_ENOTFOUND, err, errlen, "mmproj: missing key clip.projector_type");
    if (!gguf_str_eq(s, "mlp"))
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                    "mmproj: projector type '%.*s' is not supported (only 'mlp', LLaVA-1.5 style)",
                    (int)(s.len > 64 ? 64 : s.len), s.ptr);
    bool b;
    if (!gguf_get_bool(g, "clip.has_vision_encoder", &b) && !b)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "mmproj: file has no vision encoder");
    int rc;
    if ((rc = need_u32(g, "clip.vision.image_size", &hp->image_size, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.patch_size", &hp->patch_size, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.embedding_length", &hp->n_embd, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.feed_forward_length", &hp->n_ff, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.block_count", &hp->n_layer, err, errlen)) ||
        (rc = need_u32(g, "clip.vision.attention.head_count", &hp->n_head, err, errlen)))
        return rc;
    if (gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &hp->eps))
        return tide_fail(TIDE_ENOTFOUND, err, errlen,
                    "mmproj: missing key clip.vision.attention.layer_norm_epsilon");
    uint32_t u;
    hp->head_dim = hp->n_embd / hp->n_head;
    if (!gguf_get_u32(g, "clip.vision.attention.head_dim", &u) && u) hp->head_dim = (int)u;
    if (!gguf_get_u32(g, "clip.vision.attention.head_count_kv", &u) && (int)u != hp->n_head)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                    "mmproj: grouped-query attention in the vision tower is not supported");
    if (hp->image_size % hp->patch_size)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: image_size %d is not a multiple of "
                    "patch_size %d", hp->image_size, hp->patch_size);
    if ((rc = get_f32_arr(g, "clip.vision.image_mean", hp->mean, 3, err, errlen)) ||
        (rc = get_f32_arr(g, "clip.vision.image_std", hp->std, 3, err, errlen)))
        return rc;
    for (int c = 0; c < 3; c++) {
        if (!(hp->std[c] > 0))
            return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: image_std must be positive");
        float v = hp->mean[c] * 255.0f;  /* truncated, as llama.cpp's {122,116,104} for CLIP */
        hp->pad_rgb[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    bool gelu = false, silu = false;
    gguf_get_bool(g, "clip.use_gelu", &gelu);
    gguf_get_bool(g, "clip.use_silu", &silu);
    if (gelu && silu)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: both clip.use_gelu and clip.use_silu set");
    hp->act = gelu ? CLIP_ACT_GELU : silu ? CLIP_ACT_SILU : CLIP_ACT_GELU_QUICK;
    /* Which block's output feeds the projector. LLaVA takes the penultimate layer: without
     * clip.vision.feature_layer llama.cpp runs n_layer - 1 blocks; with it, max(layers). */
    hp->n_layer_run = hp->n_layer - 1;
    const struct gguf_kv *fl = gguf_find_kv(g, "clip.vision.feature_layer");
    if (fl) {
        if (fl->type != GGUF_TYPE_ARRAY ||
            (fl->v.arr.type != GGUF_TYPE_INT32 && fl->v.arr.type != GGUF_TYPE_UINT32) ||
            fl->v.arr.n == 0)
            return tide_fail(TIDE_EFORMAT, err, errlen,
                        "mmproj: clip.vision.feature_layer must be an array of integers");
        if (fl->v.arr.n > 1)
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                        "mmproj: several feature layers (stacked features) are not supported");
        int32_t v;
        memcpy(&v, fl->v.arr.data, 4);
        hp->n_layer_run = v;
    }
    if (hp->n_layer_run < 0 || hp->n_layer_run > hp->n_layer)
        return tide_fail(TIDE_EFORMAT, err, errlen, "mmproj: feature layer %d outside 0..%d",
                    hp->n_layer_run, hp->n_layer);
    int side = hp->image_size / hp->patch_size;
    hp->n_patches = side * side;
    return 0;
}

/* ---- tensors: one walk that either sizes (base == NULL) or copies ---- */

struct ld {
    const struct gguf_file *g;
    uint8_t *base;      /* NULL: sizing pass */
    size_t off;         /* bytes used so far */
    int rc;
    char *err;
    size_t errlen;
};

static const struct gguf_tensor *find(struct ld *L, const char *name, bool required)
{
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t && required && !L->rc)
        L->rc = tide_fail(TIDE_ENOTFOUND, L->err, L->errlen, "mmproj: missing tensor %s", name);
    return t;
}

static uint64_t nelem(const struct gguf_tensor *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* A vector (or small table) of n elements as f32. Returns whether it is present; *out is
 * set on the copying pass. */
static bool vec(struct ld *L, float **out, const char *name, uint64_t n, bool required)
{
    *out = NULL;
    const struct gguf_tensor *t = find(L, name, required);
    if (!t || L->rc) return false;
    if (nelem(t) != n) {
        L->rc = tide_fail(TIDE_EFORMAT, L->err, L->errlen, "mmproj: %s has %llu elements, want %llu",
                     name, (unsigned long long)nelem(t), (unsigned long long)n);
        return false;
    }
    if (!ggml_row_size(t->type, t->ne[0])) {
        L->rc = tide_fail(TIDE_EUNSUPPORTED, L->err, L->errlen, "mmproj: %s has unsupported type %s",
                     name, ggml_type_name(t->type));
        return false;
    }
    if (L->base) {
        *out = (float *)(L->base + L->off);
        ggml_dequantize(t->type, t->data, *out, n);
    }
    L->off += align_up(sizeof(float) * n);
    return true;
}

/* A matrix (cols -> rows) kept in its file type; ne[2..3] fold into ne[1] only for the
 * patch convolution, which is contiguous (p, p, 3, D) = cols 3*p*p. */
static bool mat(struct ld *L, struct tensor *out, const char *name, uint64_t cols,
                uint64_t rows, bool required)
{
    memset(out, 0, sizeof *out);
    const struct gguf_tensor *t = find(L, name, required);
    if (!t || L->rc) return false;
    if (nelem(t) != cols * rows || t->ne[0] * (t->n_dims == 4 ? t->ne[1] * t->ne[2] : 1) != cols) {
        L->rc = tide_fail(TIDE_EFORMAT, L->err, L->errlen,
                     "mmproj: %s has shape [%llu,%llu,%llu,%llu], want (%llu -> %llu)", name,
                     (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                     (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                     (unsigned long long)cols, (unsigned long long)rows);
        return false;
    }
    size_t rb = ggml_row_size(t->type, cols);
    if (!rb || (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 &&
                t->type != GGML_TYPE_BF16 && t->type != GGML_TYPE_Q8_0 &&
                t->type != GGML_TYPE_Q4_0)) {
        L->rc = tide_fail(TIDE_EUNSUPPORTED, L->err, L->errlen,
                     "mmproj: %s has type %s, not supported here (f32, f16, bf16, q8_0, q4_0)",
                     name, ggml_type_name(t->type));
        return false;
    }
    out->type = t->type;
    out->ne[0] = cols;
    out->ne[1] = rows;
    out->row_bytes = rb;
    if (L->base) {
        memcpy(L->base + L->off, t->data, rb * rows);
        out->data = L->base + L->off;
    }
    L->off += align_up(rb * rows);
    return true;
}

static int walk(struct ld *L, struct clip_model *m)
{
    struct clip_hparams *hp = &m->hp;
    const int D = hp->n_embd, F = hp->n_ff, A = hp->n_head * hp->head_dim, p = hp->patch_size;
    char nm[96];
    /* the class token decides n_pos, which the position table must match */
    const struct gguf_tensor *cls = gguf_find_tensor(L->g, "v.class_embd");
    hp->has_class = cls != NULL;
    hp->n_pos = hp->n_patches + (hp->has_class ? 1 : 0);
    vec(L, &m->cls, "v.class_embd", (uint64_t)D, false);
    mat(L, &m->patch_w, "v.patch_embd.weight", (uint64_t)3 * p * p, (uint64_t)D, true);
    vec(L, &m->patch_b, "v.patch_embd.bias", (uint64_t)D, false);
    vec(L, &m->pos, "v.position_embd.weight", (uint64_t)hp->n_pos * D, true);
    vec(L, &m->pre_w, "v.pre_ln.weight", (uint64_t)D, false);
    vec(L, &m->pre_b, "v.pre_ln.bias", (uint64_t)D, false);
    vec(L, &m->post_w, "v.post_ln.weight", (uint64_t)D, false);
    vec(L, &m->post_b, "v.post_ln.bias", (uint64_t)D, false);
    for (int il = 0; il < hp->n_layer_run && !L->rc; il++) {
        struct clip_layer *ly = &m->layers[il];
#define N(suffix) (snprintf(nm, sizeof nm, "v.blk.%d.%s", il, suffix), nm)
        vec(L, &ly->ln1_w, N("ln1.weight"), (uint64_t)D, false);
        vec(L, &ly->ln1_b, N("ln1.bias"), (uint64_t)D, false);
        mat(L, &ly->q, N("attn_q.weight"), (uint64_t)D, (uint64_t)A, true);
        vec(L, &ly->q_b, N("attn_q.bias"), (uint64_t)A, false);
        mat(L, &ly->k, N("attn_k.weight"), (uint64_t)D, (uint64_t)A, true);
        vec(L, &ly->k_b, N("attn_k.bias"), (uint64_t)A, false);
        mat(L, &ly->v, N("attn_v.weight"), (uint64_t)D, (uint64_t)A, true);
        vec(L, &ly->v_b, N("attn_v.bias"), (uint64_t)A, false);
        mat(L, &ly->o, N("attn_out.weight"), (uint64_t)A, (uint64_t)D, true);
        vec(L, &ly->o_b, N("attn_out.bias"), (uint64_t)D, false);
        vec(L, &ly->ln2_w, N("ln2.weight"), (uint64_t)D, false);
        vec(L, &ly->ln2_b, N("ln2.bias"), (uint64_t)D, false);
        if (gguf_find_tensor(L->g, N("ffn_gate.weight")) && !L->rc)
            L->rc = tide_fail(TIDE_EUNSUPPORTED, L->err, L->errlen,
                         "mmproj: gated vision MLP (%s) is not supported", nm);
        /* Old llava conversions swapped the names of fc1/fc2; llama.cpp recognises them by
         * ffn_down taking D inputs, and so do we. */
        const struct gguf_tensor *dn = gguf_find_tensor(L->g, N("ffn_down.weight"));
        bool swapped = dn && dn->ne[0] == (uint64_t)D;
        const char *up = swapped ? "ffn_down" : "ffn_up", *down = swapped ? "ffn_up" : "ffn_down";
        char w1[32], w2[32];
        snprintf(w1, sizeof w1, "%s.weight", up);
        snprintf(w2, sizeof w2, "%s.bias", up);
        mat(L, &ly->up, N(w1), (uint64_t)D, (uint64_t)F, true);
        vec(L, &ly->up_b, N(w2), (uint64_t)F, false);
        snprintf(w1, sizeof w1, "%s.weight", down);
        snprintf(w2, sizeof w2, "%s.bias", down);
        mat(L, &ly->down, N(w1), (uint64_t)F, (uint64_t)D, true);
        vec(L, &ly->down_b, N(w2), (uint64_t)D, false);
#undef N
    }
    if (L->rc) return L->rc;
    const struct gguf_tensor *t0 = find(L, "mm.0.weight", true);
    if (!t0) return L->rc;
    hp->n_mm_hidden = (int)t0->ne[1];
    mat(L, &m->mm0, "mm.0.weight", (uint64_t)D, (uint64_t)hp->n_mm_hidden, true);
    vec(L, &m->mm0_b, "mm.0.bias", (uint64_t)hp->n_mm_hidden, false);
    const struct gguf_tensor *t2 = gguf_find_tensor(L->g, "mm.2.weight");
    hp->n_embd_out = t2 ? (int)t2->ne[1] : hp->n_mm_hidden;
    if (t2) {
        mat(L, &m->mm2, "mm.2.weight", (uint64_t)hp->n_mm_hidden, (uint64_t)hp->n_embd_out, true);
        vec(L, &m->mm2_b, "mm.2.bias", (uint64_t)hp->n_embd_out, false);
    }
    return L->rc;
}

/* ---- workspace ---- */

struct ws_layout {
    size_t x, hn, q, k, v, att, f, aws, patches, mmh, out, total; /* float offsets */
};

static void layout(const struct clip_hparams *hp, struct ws_layout *w)
{
    size_t P = (size_t)hp->n_pos, D = (size_t)hp->n_embd, A = (size_t)hp->n_head * hp->head_dim;
    size_t F = (size_t)(hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd), d = (size_t)hp->head_dim;
    size_t N = (size_t)hp->n_patches, p = (size_t)hp->patch_size;
    size_t o = 0;
#define R(field, n) (w->field = o, o += ((n) + 15) / 16 * 16)
    R(x, P * D); R(hn, P * D); R(q, P * A); R(k, P * A); R(v, P * A); R(att, P * A);
    R(f, P * F); R(aws, attention_full_ws_floats((int)P, (int)d));
    R(patches, N * 3 * p * p); R(mmh, N * (size_t)hp->n_mm_hidden);
    R(out, N * (size_t)hp->n_embd_out); /* the projector's output, downloaded from here */
#undef R
    w->total = o;
}

/* ---- load / estimate ---- */

static int plan(const char *path, struct gguf_file *g, struct clip_model *m, size_t *wbytes,
                char *err, size_t errlen)
{
    char e2[200] = "";
    int rc = gguf_open(g, path, e2, sizeof e2);
    if (rc) return tide_fail(rc, err, errlen, "mmproj %s: %s", path, e2);
    if ((rc = read_hparams(g, &m->hp, err, errlen))) goto bad;
    m->layers = calloc((size_t)(m->hp.n_layer_run ? m->hp.n_layer_run : 1), sizeof *m->layers);
    if (!m->layers) { rc = tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: out of memory"); goto bad; }
    struct ld L = {.g = g, .err = err, .errlen = errlen};
    if ((rc = walk(&L, m))) goto bad;
    *wbytes = L.off;
    return 0;
bad:
    free(m->layers);
    m->layers = NULL;
    gguf_close(g);
    return rc;
}

int clip_estimate(const char *path, int max_image_tokens, size_t *weights_bytes,
                  size_t *workspace_bytes, char *err, size_t errlen)
{
    return clip_estimate_on(path, NULL, max_image_tokens, weights_bytes, workspace_bytes, err,
                            errlen);
}

int clip_estimate_on(const char *path, struct backend *be, int max_image_tokens,
                     size_t *weights_bytes, size_t *workspace_bytes, char *err, size_t errlen)
{
    struct gguf_file g;
    struct clip_model m;
    memset(&m, 0, sizeof m);
    size_t wb;
    int rc = plan(path, &g, &m, &wb, err, errlen);
    if (rc) return rc;
    /* the sizing pass filled every matrix's type and shape (not its data): enough to ask
     * the backend what its products take */
    size_t scratch = clip_backend_scratch(&m, be);
    free(m.layers);
    gguf_close(&g);
    if (max_image_tokens > 0 && max_image_tokens < m.hp.n_patches)
        return tide_fail(TIDE_ERANGE, err, errlen,
                    "mmproj: the encoder yields %d tokens per image, more than "
                    "max_image_tokens %d", m.hp.n_patches, max_image_tokens);
    struct ws_layout w;
    layout(&m.hp, &w);
    if (weights_bytes) *weights_bytes = wb;
    if (workspace_bytes) *workspace_bytes = w.total * sizeof(float) + scratch;
    return 0;
}

int clip_read_hparams(const char *path, struct clip_hparams *hp, char *err, size_t errlen)
{
    struct gguf_file g;
    struct clip_model m;
    memset(&m, 0, sizeof m);
    size_t wb;
    int rc = plan(path, &g, &m, &wb, err, errlen);
    if (rc) return rc;
    free(m.layers);
    gguf_close(&g);
    *hp = m.hp;
    return 0;
}

/* The host staging buffer of the patch rows (clip_encode builds them on the host and
 * uploads them): plain malloc, not the encoder's allocator, so the ledger sees only what
 * lives in the backend's memory. */
static int alloc_stage(struct clip_model *m, char *err, size_t errlen)
{
    size_t p = (size_t)m->hp.patch_size;
    m->stage_floats = (size_t)m->hp.n_patches * 3 * p * p;
    m->stage = malloc(sizeof(float) * m->stage_floats);
    return m->stage ? 0 : tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: out of memory");
}

static int load_impl(struct clip_model **out, const char *path, const struct clip_alloc *a,
                     struct backend *be, bool runnable, char *err, size_t errlen)
{
    *out = NULL;
    struct clip_model *m = calloc(1, sizeof *m);
    if (!m) return tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: out of memory");
    m->alloc = a ? *a : (struct clip_alloc){default_alloc, default_free, NULL};
    m->be = be;
    struct gguf_file g;
    size_t wb;
    int rc = plan(path, &g, m, &wb, err, errlen);
    if (rc) { free(m); return rc; }
    struct ws_layout w;
    layout(&m->hp, &w);
    size_t wsb = runnable ? w.total * sizeof(float) : 0;
    m->weights = m->alloc.alloc(m->alloc.ud, wb);
    m->ws = m->weights && wsb ? m->alloc.alloc(m->alloc.ud, wsb) : NULL;
    if (!m->weights || (wsb && !m->ws)) {
        rc = tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: cannot allocate %zu bytes of weights + "
                  "%zu bytes of workspace", wb, wsb);
        gguf_close(&g);
        clip_free(m);
        return rc;
    }
    m->weights_bytes = wb;
    m->ws_bytes = wsb;
    struct ld L = {.g = &g, .base = m->weights, .err = err, .errlen = errlen};
    rc = walk(&L, m);
    gguf_close(&g);  /* every weight is a copy now: the mapping can go */
    if (!rc && runnable) rc = alloc_stage(m, err, errlen);
    if (rc) { clip_free(m); return rc; }
    *out = m;
    return 0;
}

int clip_load(struct clip_model **out, const char *path, const struct clip_alloc *a,
              struct backend *be, char *err, size_t errlen)
{
    return load_impl(out, path, a, be, true, err, errlen);
}

int clip_load_host(struct clip_model **out, const char *path, const struct clip_alloc *a,
                   char *err, size_t errlen)
{
    return load_impl(out, path, a, NULL, false, err, errlen);
}

/* Every weight pointer of m moved from the block at `from` to the block at `to` (same
 * layout): the host copy's offsets are the device copy's. */
static void rebase(struct clip_model *m, const uint8_t *from, uint8_t *to)
{
#define RB(p) do { if (p) (p) = (void *)(to + ((const uint8_t *)(p) - from)); } while (0)
    RB(m->patch_w.data); RB(m->patch_b); RB(m->pos); RB(m->cls);
    RB(m->pre_w); RB(m->pre_b); RB(m->post_w); RB(m->post_b);
    RB(m->mm0.data); RB(m->mm0_b); RB(m->mm2.data); RB(m->mm2_b);
    for (int il = 0; il < m->hp.n_layer_run; il++) {
        struct clip_layer *ly = &m->layers[il];
        RB(ly->ln1_w); RB(ly->ln1_b); RB(ly->q.data); RB(ly->q_b); RB(ly->k.data); RB(ly->k_b);
        RB(ly->v.data); RB(ly->v_b); RB(ly->o.data); RB(ly->o_b); RB(ly->ln2_w); RB(ly->ln2_b);
        RB(ly->up.data); RB(ly->up_b); RB(ly->down.data); RB(ly->down_b);
    }
#undef RB
}

int clip_upload(struct clip_model **out, const struct clip_model *host, const struct clip_alloc *a,
                struct backend *be, char *err, size_t errlen)
{
    *out = NULL;
    struct clip_model *m = calloc(1, sizeof *m);
    if (!m) return tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: out of memory");
    *m = *host;
    m->alloc = *a;
    m->be = be;
    m->weights = NULL;
    m->ws = NULL;
    m->stage = NULL;
    m->layers = calloc((size_t)(host->hp.n_layer_run ? host->hp.n_layer_run : 1), sizeof *m->layers);
    if (!m->layers) { free(m); return tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: out of memory"); }
    memcpy(m->layers, host->layers, sizeof *m->layers * (size_t)host->hp.n_layer_run);
    struct ws_layout w;
    layout(&m->hp, &w);
    m->ws_bytes = w.total * sizeof(float);
    m->weights = m->alloc.alloc(m->alloc.ud, m->weights_bytes);
    m->ws = m->weights ? m->alloc.alloc(m->alloc.ud, m->ws_bytes) : NULL;
    if (!m->weights || !m->ws) {
        int rc = tide_fail(TIDE_ENOMEM, err, errlen, "mmproj: cannot allocate %zu bytes of weights + "
                      "%zu bytes of workspace on the %s backend", m->weights_bytes, m->ws_bytes,
                      be->i->name);
        clip_free(m);
        return rc;
    }
    int rc = alloc_stage(m, err, errlen);
    if (rc) { clip_free(m); return rc; }
    /* one copy of the whole block (from pinned memory it runs at the bus's speed), ordered
     * before the first op of clip_encode on this backend */
    be->i->upload(be->ctx, m->weights, host->weights, m->weights_bytes);
    rebase(m, host->weights, m->weights);
    *out = m;
    return 0;
}

void clip_free(struct clip_model *m)
{
    if (!m) return;
    if (m->ws) m->alloc.free(m->alloc.ud, m->ws);
    if (m->weights) m->alloc.free(m->alloc.ud, m->weights);
    free(m->stage);
    free(m->layers);
    free(m);
}

int clip_n_tokens(const struct clip_model *m, int w, int h)
{
    (void)w; (void)h;
    return m->hp.n_patches;
}

int clip_n_embd_out(const struct clip_model *m) { return m->hp.n_embd_out; }

int clip_preprocess(const struct clip_model *m, const struct image_u8 *img,
                    struct image_f32 *out, char *err, size_t errlen)
{
    int rc = image_preprocess_square(img, m->hp.image_size, m->hp.pad_rgb, m->hp.mean,
                                     m->hp.std, out);
    if (rc) return tide_fail(rc, err, errlen, "cannot preprocess a %dx%d image: %s", img->w, img->h,
                        tide_strerror(rc));
    return 0;
}

/* ---- the computation: backend ops only, on buffers in the backend's memory ---- */

/* The CPU backend's matmul streams all n input vectors past each weight row, which suits
 * decode and short prefills; an image is hundreds of tokens (576 for LLaVA-1.5), whose
 * inputs then fall out of cache on every row. Feeding it blocks of MM_BLOCK tokens keeps a
 * block in L2 while the weights stream: a LLaVA-1.5-sized tower (336/14, width 1024, 23
 * blocks, f16) went from 83 s to 30 s per image on 2 threads. 8..64 measure alike; the
 * rest is the backend's row-dot kernel, which a blocked GEMM would beat. A GPU takes the
 * whole image in one product (its tiles want as many tokens as there are). Either way each
 * output is one row's dot, so the blocking changes no bits on the CPU. */
#ifndef MM_BLOCK
#define MM_BLOCK 32
#endif
static int mm_block_override; /* clip_set_matmul_block; 0 = the rule above */

int clip_set_matmul_block(int n)
{
    int old = mm_block_override;
    mm_block_override = n > 0 ? n : 0;
    return old;
}

static int mm_block(const struct backend *be, int n)
{
    if (mm_block_override) return mm_block_override;
    return be && !strcmp(be->i->name, "cpu") ? MM_BLOCK : n;
}

static void matmul(struct clip_model *m, const struct tensor *w, const float *x, float *y, int n)
{
    const size_t cols = w->ne[0], rows = w->ne[1];
    const int blk = mm_block(m->be, n);
    for (int t0 = 0; t0 < n; t0 += blk) {
        int nb = n - t0 < blk ? n - t0 : blk;
        m->be->i->matmul(m->be->ctx, w, x + (size_t)t0 * cols, y + (size_t)t0 * rows, nb);
    }
}

static void add_bias(struct clip_model *m, float *y, const float *b, int n, int dim)
{
    if (b) m->be->i->add_bias(m->be->ctx, y, b, n, dim);
}

static void layernorm(struct clip_model *m, const float *x, float *y, const float *w, const float *b,
                      int n, int D)
{
    m->be->i->layernorm(m->be->ctx, x, y, w, b, n, D, m->hp.eps);
}

static enum act_kind act_of(enum clip_act a)
{
    return a == CLIP_ACT_GELU ? ACT_GELU : a == CLIP_ACT_GELU_QUICK ? ACT_GELU_QUICK : ACT_SILU;
}

/* x += y, n floats (axpy with a = 1 is exact: the sum's bits are x + y's) */
static void add(struct clip_model *m, float *x, const float *y, size_t n)
{
    m->be->i->axpy(m->be->ctx, x, y, 1.0f, (int)n);
}

int clip_run_block(struct clip_model *m, int il, float *x, int P)
{
    const struct clip_hparams *hp = &m->hp;
    if (il < 0 || il >= hp->n_layer_run || P <= 0 || P > hp->n_pos || !m->ws) return TIDE_EINVAL;
    const struct clip_layer *ly = &m->layers[il];
    struct ws_layout w;
    layout(hp, &w);
    const int D = hp->n_embd, A = hp->n_head * hp->head_dim, F = hp->n_ff;
    float *hn = m->ws + w.hn, *q = m->ws + w.q, *k = m->ws + w.k, *v = m->ws + w.v,
          *att = m->ws + w.att, *f = m->ws + w.f;
    layernorm(m, x, hn, ly->ln1_w, ly->ln1_b, P, D);
    matmul(m, &ly->q, hn, q, P); add_bias(m, q, ly->q_b, P, A);
    matmul(m, &ly->k, hn, k, P); add_bias(m, k, ly->k_b, P, A);
    matmul(m, &ly->v, hn, v, P); add_bias(m, v, ly->v_b, P, A);
    m->be->i->attention_full(m->be->ctx, q, k, v, att, P, hp->n_head, hp->head_dim, m->ws + w.aws);
    matmul(m, &ly->o, att, hn, P); add_bias(m, hn, ly->o_b, P, D);
    add(m, x, hn, (size_t)P * D);
    layernorm(m, x, hn, ly->ln2_w, ly->ln2_b, P, D);
    matmul(m, &ly->up, hn, f, P); add_bias(m, f, ly->up_b, P, F);
    m->be->i->activate(m->be->ctx, f, (size_t)P * F, act_of(hp->act));
    matmul(m, &ly->down, f, hn, P); add_bias(m, hn, ly->down_b, P, D);
    add(m, x, hn, (size_t)P * D);
    return 0;
}

int clip_encode(struct clip_model *m, const struct image_f32 *img, float *out, char *err,
                size_t errlen)
{
    const struct clip_hparams *hp = &m->hp;
    if (!img || !img->data || img->w != hp->image_size || img->h != hp->image_size)
        return tide_fail(TIDE_EINVAL, err, errlen, "clip_encode: image must be %dx%d (got %dx%d); "
                    "run clip_preprocess first", hp->image_size, hp->image_size,
                    img ? img->w : 0, img ? img->h : 0);
    if (!m->ws || !m->be)
        return tide_fail(TIDE_EINVAL, err, errlen, "clip_encode: a host copy (clip_load_host) does "
                    "not run; clip_upload it to a backend first");
    struct ws_layout w;
    layout(hp, &w);
    const int D = hp->n_embd, p = hp->patch_size, S = hp->image_size, side = S / p;
    const int N = hp->n_patches, P = hp->n_pos, K = 3 * p * p;
    struct backend *be = m->be;
    float *x = m->ws + w.x, *pt = m->stage;
    /* Patches as rows of (3, p, p), patch index py * side + px, as ggml's conv_2d: built on
     * the host (a few hundred KB) and uploaded in one copy. */
    for (int py = 0; py < side; py++)
        for (int px = 0; px < side; px++) {
            float *r = pt + (size_t)(py * side + px) * K;
            for (int c = 0; c < 3; c++)
                for (int ky = 0; ky < p; ky++)
                    memcpy(r + (size_t)c * p * p + (size_t)ky * p,
                           img->data + (size_t)c * S * S + (size_t)(py * p + ky) * S + px * p,
                           sizeof(float) * p);
        }
    be->i->upload(be->ctx, m->ws + w.patches, pt, sizeof(float) * m->stage_floats);
    /* The class token, when there is one, comes first (position 0), as in CLIP. */
    float *xp = x + (hp->has_class ? D : 0);
    matmul(m, &m->patch_w, m->ws + w.patches, xp, N);
    add_bias(m, xp, m->patch_b, N, D);
    if (hp->has_class) {
        const int row0 = 0;
        be->i->gather_rows(be->ctx, x, m->cls, &row0, 1, D);
    }
    add(m, x, m->pos, (size_t)P * D);
    if (m->pre_w || m->pre_b) layernorm(m, x, x, m->pre_w, m->pre_b, P, D);
    for (int il = 0; il < hp->n_layer_run; il++) clip_run_block(m, il, x, P);
    if (m->post_w || m->post_b) layernorm(m, x, x, m->post_w, m->post_b, P, D);
    /* Projector over the patch tokens only (the class token is dropped). */
    float *mmh = m->ws + w.mmh, *res = mmh;
    matmul(m, &m->mm0, xp, mmh, N);
    add_bias(m, mmh, m->mm0_b, N, hp->n_mm_hidden);
    be->i->activate(be->ctx, mmh, (size_t)N * hp->n_mm_hidden, ACT_GELU);
    if (m->mm2.data) {
        res = m->ws + w.out;
        matmul(m, &m->mm2, mmh, res, N);
        add_bias(m, res, m->mm2_b, N, hp->n_embd_out);
    }
    be->i->download(be->ctx, out, res, sizeof(float) * (size_t)N * hp->n_embd_out);
    return N;
}

size_t clip_backend_scratch(const struct clip_model *m, struct backend *be)
{
    if (!be || !be->i->matmul_scratch) return 0;
    const struct clip_hparams *hp = &m->hp;
    size_t most = 0;
#define S(t, n) do { size_t b_ = be->i->matmul_scratch(be->ctx, &(t), mm_block(be, (n))); \
        if (b_ > most) most = b_; } while (0)
    S(m->patch_w, hp->n_patches);
    for (int il = 0; il < hp->n_layer_run; il++) {
        const struct clip_layer *ly = &m->layers[il];
        S(ly->q, hp->n_pos); S(ly->k, hp->n_pos); S(ly->v, hp->n_pos); S(ly->o, hp->n_pos);
        S(ly->up, hp->n_pos); S(ly->down, hp->n_pos);
    }
    S(m->mm0, hp->n_patches);
    if (m->mm2.ne[0]) S(m->mm2, hp->n_patches);
#undef S
    return most;
}
