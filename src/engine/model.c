/* model.c - load a GGUF text model: tensor views, shape checks (the hyper-parameters they are
 * checked against: model_config.c).
 *
 * Every tensor is checked against the config here, once, so the forward pass can trust
 * shapes and never bounds-check. Weights are views into the mapping, never copies. */
#include "model.h"
#include "model_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *model_arch_name(enum model_arch a)
{
    switch (a) {
    case ARCH_LLAMA: return "llama";
    case ARCH_QWEN3: return "qwen3";
    case ARCH_QWEN3MOE: return "qwen3moe";
    case ARCH_QWEN2MOE: return "qwen2moe";
    case ARCH_GPTOSS: return "gpt-oss";
    case ARCH_OLMOE: return "olmoe";
    case ARCH_GRANITEMOE: return "granitemoe";
    case ARCH_QWEN3VLMOE: return "qwen3vlmoe";
    case ARCH_QWEN2VL: return "qwen2vl";
    case ARCH_DEEPSEEK2: return "deepseek2";
    }
    return "?";
}

static bool type_ok(uint32_t t)
{
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16 ||
           t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q5_1 ||
           t == GGML_TYPE_MXFP4 || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K ||
           t == GGML_TYPE_IQ4_XS;
}

/* Find NAME and check it is (ne0, ne1) (ne1 = 1 for vectors). required=false lets an
 * absent tensor through as data == NULL. */
static int get_tensor(const struct gguf_file *g, const char *name, uint64_t ne0,
                      uint64_t ne1, bool required, struct tensor *out, char *err,
                      size_t errlen)
{
    memset(out, 0, sizeof(*out));
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        if (!required)
            return 0;
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing tensor %s (expected [%llu, %llu])",
                         name, (unsigned long long)ne0, (unsigned long long)ne1);
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return tide_fail(TIDE_EFORMAT, err, errlen,
                         "tensor %s has shape [%llu, %llu, %llu], expected [%llu, %llu]", name,
                         (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                         (unsigned long long)t->ne[2], (unsigned long long)ne0,
                         (unsigned long long)ne1);
    if (!type_ok(t->type) || ggml_row_size(t->type, ne0) == 0)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "tensor %s has unsupported type %s",
                         name, ggml_type_name(t->type));
    out->type = t->type;
    out->ne[0] = ne0;
    out->ne[1] = ne1;
    out->data = t->data;
    out->row_bytes = ggml_row_size(t->type, ne0);
    if (out->row_bytes * ne1 > t->nbytes)
        return tide_fail(TIDE_EFORMAT, err, errlen, "tensor %s is truncated", name);
    return 0;
}

static int get_exps(const struct gguf_file *g, const char *name, uint64_t ne0, uint64_t ne1,
                    uint64_t ne2, const struct gguf_tensor **out, char *err, size_t errlen)
{
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return tide_fail(TIDE_EFORMAT, err, errlen,
                         "missing tensor %s (expected [%llu, %llu, %llu])", name,
                         (unsigned long long)ne0, (unsigned long long)ne1,
                         (unsigned long long)ne2);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
        return tide_fail(TIDE_EFORMAT, err, errlen,
                         "tensor %s has shape [%llu, %llu, %llu], expected [%llu, %llu, %llu]",
                         name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                         (unsigned long long)t->ne[2], (unsigned long long)ne0,
                         (unsigned long long)ne1, (unsigned long long)ne2);
    if (!type_ok(t->type) || ggml_row_size(t->type, ne0) == 0)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "tensor %s has unsupported type %s",
                         name, ggml_type_name(t->type));
    if (ggml_row_size(t->type, ne0) * ne1 * ne2 > t->nbytes)
        return tide_fail(TIDE_EFORMAT, err, errlen, "tensor %s is truncated", name);
    *out = t;
    return 0;
}

/* A 3-D per-head tensor (ne0, ne1, n_head) as one (ne0, ne1 * n_head) matrix: head h is rows
 * [h ne1, (h + 1) ne1). */
static int get_heads(const struct gguf_file *g, const char *name, uint64_t ne0, uint64_t ne1, uint64_t heads,
                     struct tensor *out, char *err, size_t errlen)
{
    const struct gguf_tensor *t;
    int rc = get_exps(g, name, ne0, ne1, heads, &t, err, errlen);
    if (rc)
        return rc;
    memset(out, 0, sizeof(*out));
    out->type = t->type;
    out->ne[0] = ne0;
    out->ne[1] = ne1 * heads;
    out->data = t->data;
    out->row_bytes = ggml_row_size(t->type, ne0);
    return 0;
}

/* deepseek2's attention tensors of layer l (MLA, V2-Lite's q without a LoRA). */
static int load_mla_tensors(const struct gguf_file *g, const struct model_config *c, uint32_t l,
                            struct model_layer *L, char *err, size_t errlen)
{
    uint64_t E = c->n_embd, H = c->n_head, kvl = c->kv_lora_rank, nope = c->mla_k - c->n_rot;
    char n[96];
    int rc;
    snprintf(n, sizeof n, "blk.%u.attn_q.weight", l);
    if (!gguf_find_tensor(g, n))
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "deepseek2: %s missing: q through a LoRA (attn_q_a/attn_q_b, "
                         "DeepSeek-V2, V3) is not supported, only V2-Lite's form", n);
    if ((rc = get_tensor(g, n, E, H * c->mla_k, true, &L->wq, err, errlen)))
        return rc;
    snprintf(n, sizeof n, "blk.%u.attn_kv_a_mqa.weight", l);
    if ((rc = get_tensor(g, n, E, kvl + c->n_rot, true, &L->wkv_a_mqa, err, errlen)))
        return rc;
    snprintf(n, sizeof n, "blk.%u.attn_kv_a_norm.weight", l);
    if ((rc = get_tensor(g, n, kvl, 1, true, &L->kv_a_norm, err, errlen)))
        return rc;
    snprintf(n, sizeof n, "blk.%u.attn_k_b.weight", l);
    if (!gguf_find_tensor(g, n))
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                         "deepseek2: %s missing: files with the unsplit attn_kv_b (older "
                         "converters) are not supported", n);
    if ((rc = get_heads(g, n, nope, kvl, H, &L->wk_b, err, errlen)))
        return rc;
    snprintf(n, sizeof n, "blk.%u.attn_v_b.weight", l);
    if ((rc = get_heads(g, n, kvl, c->mla_v, H, &L->wv_b, err, errlen)))
        return rc;
    snprintf(n, sizeof n, "blk.%u.attn_output.weight", l);
    return get_tensor(g, n, H * c->mla_v, E, true, &L->wo, err, errlen);
}

static int load_tensors(struct model *m, char *err, size_t errlen)
{
    const struct gguf_file *g = &m->gguf;
    const struct model_config *c = &m->cfg;
    uint64_t E = c->n_embd, qd = (uint64_t)c->n_head * c->head_dim;
    uint64_t kvd = (uint64_t)c->n_head_kv * c->head_dim;
    int rc;
    if ((rc = get_tensor(g, "token_embd.weight", E, c->n_vocab, true, &m->tok_embd, err,
                         errlen)) ||
        (rc = get_tensor(g, "output_norm.weight", E, 1, true, &m->output_norm, err,
                         errlen)) ||
        (rc = get_tensor(g, "output.weight", E, c->n_vocab, false, &m->output, err,
                         errlen)))
        return rc;
    if (!m->output.data)
        m->output = m->tok_embd; /* tied embeddings */
    m->layers = calloc(c->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return TIDE_ENOMEM;
    bool qk = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3MOE || c->arch == ARCH_QWEN3VLMOE, oss = c->arch == ARCH_GPTOSS;
    bool olmoe = c->arch == ARCH_OLMOE;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        struct model_layer *L = &m->layers[l];
        char n[96];
#define T(field, nm, a, b, req)                                                      \
    do {                                                                             \
        snprintf(n, sizeof(n), "blk.%u." nm ".weight", l);                           \
        if ((rc = get_tensor(g, n, a, b, req, &L->field, err, errlen)))              \
            return rc;                                                               \
    } while (0)
        T(attn_norm, "attn_norm", E, 1, true);
        if (c->arch == ARCH_DEEPSEEK2) {
            if ((rc = load_mla_tensors(g, c, l, L, err, errlen)))
                return rc;
        } else {
            T(wq, "attn_q", E, qd, true);
            T(wk, "attn_k", E, kvd, true);
            T(wv, "attn_v", E, kvd, true);
            T(wo, "attn_output", qd, E, true);
        }
        /* q/k/v biases: qwen2moe's files have them; optional for every architecture, as in
         * llama.cpp. Added by the f32 add_bias op, so they must be f32. */
#define BIAS(field, nm, len, rows, req)                                               \
    do {                                                                             \
        snprintf(n, sizeof(n), "blk.%u." nm ".bias", l);                             \
        if ((rc = get_tensor(g, n, len, rows, req, &L->field, err, errlen)))         \
            return rc;                                                               \
        if (L->field.data && L->field.type != GGML_TYPE_F32)                         \
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "tensor %s has type %s, expected f32", n, \
                             ggml_type_name(L->field.type));                              \
    } while (0)
        BIAS(bq, "attn_q", qd, 1, oss);
        BIAS(bk, "attn_k", kvd, 1, oss);
        BIAS(bv, "attn_v", kvd, 1, oss);
        if (olmoe) { /* one norm over all of q, one over all of k */
            T(q_norm, "attn_q_norm", qd, 1, true);
            T(k_norm, "attn_k_norm", kvd, 1, true);
        } else {
            T(q_norm, "attn_q_norm", c->head_dim, 1, qk);
            T(k_norm, "attn_k_norm", c->head_dim, 1, qk);
        }
        if (c->arch == ARCH_GRANITEMOE) /* granite's optional output bias (attention_bias) */
            BIAS(bo, "attn_output", E, 1, false);
        /* gpt-oss names its FFN input norm post_attention_norm */
        if (oss)
            T(ffn_norm, "post_attention_norm", E, 1, true);
        else
            T(ffn_norm, "ffn_norm", E, 1, true);
        if (oss) { /* gpt-oss: the wo, router and expert biases and the sinks, all required */
            BIAS(bo, "attn_output", E, 1, true);
            BIAS(ffn_gate_inp_b, "ffn_gate_inp", c->n_expert, 1, true);
            BIAS(gate_exps_b, "ffn_gate_exps", c->n_ff_exp, c->n_expert, true);
            BIAS(up_exps_b, "ffn_up_exps", c->n_ff_exp, c->n_expert, true);
            BIAS(down_exps_b, "ffn_down_exps", E, c->n_expert, true);
            snprintf(n, sizeof(n), "blk.%u.attn_sinks.weight", l);
            if ((rc = get_tensor(g, n, c->n_head, 1, true, &L->attn_sinks, err, errlen)))
                return rc;
            if (L->attn_sinks.type != GGML_TYPE_F32)
                return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "tensor %s has type %s, expected f32", n,
                                 ggml_type_name(L->attn_sinks.type));
        }
#undef BIAS
        if (c->n_expert == 0 || l < c->n_dense_lead) { /* deepseek2's leading dense layers too */
            T(ffn_gate, "ffn_gate", E, c->n_ff, true);
            T(ffn_up, "ffn_up", E, c->n_ff, true);
            T(ffn_down, "ffn_down", c->n_ff, E, true);
        } else {
            T(ffn_gate_inp, "ffn_gate_inp", E, c->n_expert, true);
            snprintf(n, sizeof(n), "blk.%u.ffn_gate_exps.weight", l);
            if ((rc = get_exps(g, n, E, c->n_ff_exp, c->n_expert, &L->gate_exps, err,
                               errlen)))
                return rc;
            snprintf(n, sizeof(n), "blk.%u.ffn_up_exps.weight", l);
            if ((rc = get_exps(g, n, E, c->n_ff_exp, c->n_expert, &L->up_exps, err,
                               errlen)))
                return rc;
            snprintf(n, sizeof(n), "blk.%u.ffn_down_exps.weight", l);
            if ((rc = get_exps(g, n, c->n_ff_exp, E, c->n_expert, &L->down_exps, err,
                               errlen)))
                return rc;
            if (c->n_ff_shexp) { /* resident weights of the layer, not cached experts */
                T(ffn_gate_inp_shexp, "ffn_gate_inp_shexp", E, 1, c->arch == ARCH_QWEN2MOE); /* granite's: none */
                T(ffn_gate_shexp, "ffn_gate_shexp", E, c->n_ff_shexp, true);
                T(ffn_up_shexp, "ffn_up_shexp", E, c->n_ff_shexp, true);
                T(ffn_down_shexp, "ffn_down_shexp", c->n_ff_shexp, E, true);
            }
        }
#undef T
    }
    return 0;
}

/* granitemoe's logits are the output product's divided by logit_scale: as the product is
 * linear, output_norm's weights divided by it give the same logits (up to rounding) with no op
 * of its own. The divided weights are an owned f32 copy. */
static int fold_logit_scale(struct model *m)
{
    if (m->cfg.logit_scale == 1.0f)
        return 0;
    uint64_t E = m->cfg.n_embd;
    m->output_norm_owned = malloc(sizeof(float) * E);
    if (!m->output_norm_owned)
        return TIDE_ENOMEM;
    ggml_dequantize(m->output_norm.type, m->output_norm.data, m->output_norm_owned, E);
    float inv = 1.0f / m->cfg.logit_scale; /* llama.cpp scales the logits by 1 / logit_scale */
    for (uint64_t i = 0; i < E; i++)
        m->output_norm_owned[i] *= inv;
    m->output_norm.type = GGML_TYPE_F32;
    m->output_norm.data = m->output_norm_owned;
    m->output_norm.row_bytes = sizeof(float) * E;
    return 0;
}

int model_load(struct model *m, const char *path, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    int rc = gguf_open(&m->gguf, path, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = model_load_config(m, err, errlen)) < 0 ||
        (m->cfg.arch == ARCH_GPTOSS && (rc = model_load_rope_scaling(m, "gpt-oss", err, errlen)) < 0) ||
        (m->cfg.arch == ARCH_DEEPSEEK2 && (rc = model_load_rope_scaling(m, "deepseek2", err, errlen)) < 0) ||
        (rc = load_tensors(m, err, errlen)) < 0 || (rc = fold_logit_scale(m)) < 0) {
        if (rc == TIDE_ENOMEM)
            tide_fail(rc, err, errlen, "out of memory loading %s", path);
        model_free(m);
        return rc;
    }
    m->name = gguf_dup_str(&m->gguf, "general.name");
    if (!m->name) {
        const char *b = strrchr(path, '/');
        m->name = strdup(b ? b + 1 : path);
    }
    return 0;
}

void model_free(struct model *m)
{
    free(m->layers);
    free(m->name);
    free(m->rope_freqs);
    free(m->output_norm_owned);
    gguf_close(&m->gguf);
    memset(m, 0, sizeof(*m));
}

static void slice(const struct gguf_tensor *t, const void *pinned, uint32_t e, struct tensor *out)
{
    out->type = t->type;
    out->ne[0] = t->ne[0];
    out->ne[1] = t->ne[1];
    out->row_bytes = ggml_row_size(t->type, t->ne[0]);
    out->data = (const uint8_t *)(pinned ? pinned : t->data) + (size_t)e * out->row_bytes * t->ne[1];
}

void model_expert_host(const struct model *m, uint32_t l, uint32_t e,
                       struct expert_weights *out)
{
    const struct model_layer *L = &m->layers[l];
    if (!L->gate_exps) { /* a dense layer (deepseek2's leading ones): no experts */
        memset(out, 0, sizeof(*out));
        return;
    }
    slice(L->gate_exps, L->exps_pinned[0], e, &out->gate);
    slice(L->up_exps, L->exps_pinned[1], e, &out->up);
    slice(L->down_exps, L->exps_pinned[2], e, &out->down);
}

uint32_t model_first_type_of(const struct model *m, uint32_t a, uint32_t b)
{
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        if (m->gguf.tensors[i].type == a || m->gguf.tensors[i].type == b)
            return m->gguf.tensors[i].type;
    return UINT32_MAX;
}

/* Pinning reads every expert once from the mapped file: on a 30B-class model that is tens of
 * GiB from disk, so a long one logs its progress every 10%. */
#define PIN_PROGRESS_MIN ((size_t)1 << 30)

int model_pin_experts(struct model *m, void *(*alloc)(size_t), void (*release)(void *))
{
    size_t total = 0, done = 0;
    for (uint32_t l = 0; l < m->cfg.n_layer; l++)
        total += model_expert_bytes(m, l) * m->cfg.n_expert;
    double t0 = tide_now();
    int next_pct = 10;
    for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
        struct model_layer *L = &m->layers[l];
        const struct gguf_tensor *t[3] = {L->gate_exps, L->up_exps, L->down_exps};
        for (int i = 0; i < 3; i++) {
            if (!t[i] || L->exps_pinned[i])
                continue;
            size_t b = ggml_row_size(t[i]->type, t[i]->ne[0]) * t[i]->ne[1] * t[i]->ne[2];
            void *p = alloc(b);
            if (!p) {
                model_unpin_experts(m, release);
                return TIDE_ENOMEM;
            }
            memcpy(p, t[i]->data, b);
            L->exps_pinned[i] = p;
            done += b;
        }
        int pct = total ? (int)(100 * done / total) : 100;
        if (total >= PIN_PROGRESS_MIN && pct >= next_pct) {
            tide_log("pinning experts in host RAM: %.1f / %.1f GiB (%d%%, %.1f s)", done / 1073741824.0,
                     total / 1073741824.0, pct, tide_now() - t0);
            next_pct = pct / 10 * 10 + 10;
        }
    }
    return 0;
}

void model_unpin_experts(struct model *m, void (*release)(void *))
{
    for (uint32_t l = 0; m->layers && l < m->cfg.n_layer; l++)
        for (int i = 0; i < 3; i++)
            if (m->layers[l].exps_pinned[i]) {
                release(m->layers[l].exps_pinned[i]);
                m->layers[l].exps_pinned[i] = NULL;
            }
}

size_t model_expert_bytes(const struct model *m, uint32_t l)
{
    const struct model_layer *L = &m->layers[l];
    if (!L->gate_exps)
        return 0;
    return ggml_row_size(L->gate_exps->type, L->gate_exps->ne[0]) * L->gate_exps->ne[1] +
           ggml_row_size(L->up_exps->type, L->up_exps->ne[0]) * L->up_exps->ne[1] +
           ggml_row_size(L->down_exps->type, L->down_exps->ne[0]) * L->down_exps->ne[1];
}

/* Whether a CUDA device takes weights of type t: the types with CUDA kernels that have passed
 * their test-gpu runs on a GPU (q5_0, q5_1, iq4_xs and MXFP4: cuda/qblock.cu, matmul_q5_0,
 * matmul_q5_1, matmul_iq4_xs, matmul_mxfp4, get_rows_qb and the e2e runs, H200, 2026-12-05). A
 * new type's kernels stay refused at start-up until theirs have: one line here. */
static bool cuda_runs_type(uint32_t t)
{
    switch (t) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: /* k-quants: cuda/kquant.cu */
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_IQ4_XS: case GGML_TYPE_MXFP4: /* cuda/qblock.cu */
        return true;
    default: return false;
    }
}

uint32_t model_first_cpu_only_type(const struct model *m)
{
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        if (!cuda_runs_type(m->gguf.tensors[i].type))
            return m->gguf.tensors[i].type;
    return UINT32_MAX;
}
