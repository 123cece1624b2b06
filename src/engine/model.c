/* model.c - load a GGUF text model: hyper-parameters, tensor views, shape checks.
 *
 * Every tensor is checked against the config here, once, so the forward pass can trust
 * shapes and never bounds-check. Weights are views into the mapping, never copies. */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

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
        return fail(err, errlen, TIDE_EFORMAT, "missing tensor %s (expected [%llu, %llu])",
                    name, (unsigned long long)ne0, (unsigned long long)ne1);
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return fail(err, errlen, TIDE_EFORMAT,
                    "tensor %s has shape [%llu, %llu, %llu], expected [%llu, %llu]", name,
                    (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                    (unsigned long long)t->ne[2], (unsigned long long)ne0,
                    (unsigned long long)ne1);
    if (!type_ok(t->type) || ggml_row_size(t->type, ne0) == 0)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "tensor %s has unsupported type %s",
                    name, ggml_type_name(t->type));
    out->type = t->type;
    out->ne[0] = ne0;
    out->ne[1] = ne1;
    out->data = t->data;
    out->row_bytes = ggml_row_size(t->type, ne0);
    if (out->row_bytes * ne1 > t->nbytes)
        return fail(err, errlen, TIDE_EFORMAT, "tensor %s is truncated", name);
    return 0;
}

static int get_exps(const struct gguf_file *g, const char *name, uint64_t ne0, uint64_t ne1,
                    uint64_t ne2, const struct gguf_tensor **out, char *err, size_t errlen)
{
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return fail(err, errlen, TIDE_EFORMAT,
                    "missing tensor %s (expected [%llu, %llu, %llu])", name,
                    (unsigned long long)ne0, (unsigned long long)ne1,
                    (unsigned long long)ne2);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
        return fail(err, errlen, TIDE_EFORMAT,
                    "tensor %s has shape [%llu, %llu, %llu], expected [%llu, %llu, %llu]",
                    name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                    (unsigned long long)t->ne[2], (unsigned long long)ne0,
                    (unsigned long long)ne1, (unsigned long long)ne2);
    if (!type_ok(t->type) || ggml_row_size(t->type, ne0) == 0)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "tensor %s has unsupported type %s",
                    name, ggml_type_name(t->type));
    if (ggml_row_size(t->type, ne0) * ne1 * ne2 > t->nbytes)
        return fail(err, errlen, TIDE_EFORMAT, "tensor %s is truncated", name);
    *out = t;
    return 0;
}

/* "<arch>.<suffix>" as u32; absent -> def (or an error when required). */
static int arch_u32(const struct gguf_file *g, const char *arch, const char *suffix,
                    uint32_t def, bool required, uint32_t *out, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = gguf_get_u32(g, key, out);
    if (rc == TIDE_ENOTFOUND && !required) {
        *out = def;
        return 0;
    }
    if (rc < 0)
        return fail(err, errlen, TIDE_EFORMAT, "%s key %s", rc == TIDE_ENOTFOUND ?
                    "missing" : "bad", key);
    return 0;
}

static int arch_f32(const struct gguf_file *g, const char *arch, const char *suffix,
                    float def, float *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    if (gguf_get_f32(g, key, out) < 0)
        *out = def;
    return 0;
}

/* gpt-oss's keys beyond the common ones: the sliding window (required, as in llama.cpp) and its
 * layer pattern (default 2: even layers windowed, odd ones full). What tide does not compute
 * is refused here, by name, rather than run wrong. */
static int load_gptoss_config(const struct gguf_file *g, struct model_config *c, char *err, size_t errlen)
{
    const char *arch = "gpt-oss";
    int rc;
    if (c->n_expert == 0)
        return fail(err, errlen, TIDE_EFORMAT, "missing %s.expert_count", arch);
    if ((rc = arch_u32(g, arch, "attention.sliding_window", 0, true, &c->n_swa, err, errlen)))
        return rc;
    const struct gguf_kv *pat = gguf_find_kv(g, "gpt-oss.attention.sliding_window_pattern");
    if (pat && pat->type != GGUF_TYPE_UINT32)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "%s.attention.sliding_window_pattern: only a number is supported",
                    arch);
    if ((rc = arch_u32(g, arch, "attention.sliding_window_pattern", 2, false, &c->swa_period, err, errlen)))
        return rc;
    if (c->n_swa == 0)
        return fail(err, errlen, TIDE_EFORMAT, "bad %s.attention.sliding_window 0", arch);
    float base_swa;
    arch_f32(g, arch, "rope.freq_base_swa", c->rope_theta, &base_swa);
    if (base_swa != c->rope_theta)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "%s.rope.freq_base_swa %g differs from rope.freq_base %g: not "
                    "supported", arch, base_swa, c->rope_theta);
    return 0;
}

/* Rope scaling as llama.cpp reads it (type default linear, factor 0 or absent: none) into a
 * frequency a rotated pair and one magnitude for q and k. YaRN: pair i of base frequency
 * f = base^(-2i/d) turns at f * (s (1 - r) + r), s = 1 / factor and r the ramp between the
 * correction dims (1 below, 0 above; llama.cpp's ggml_rope_yarn_corr_dims with beta_fast and
 * beta_slow over original_context_length), and the magnitude is 1 + 0.1 ln(factor) (llama.cpp's
 * attn_factor comes to 1 for it; yarn_log_multiplier only for deepseek2, said below). Linear:
 * f * s, magnitude 1. gpt-oss and deepseek2 read these keys here (d: the roped width). */
static int load_rope_scaling(struct model *m, const char *arch, char *err, size_t errlen)
{
    const struct gguf_file *g = &m->gguf;
    struct model_config *c = &m->cfg;
    c->rope_mscale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    struct gguf_str st;
    bool yarn = false, linear = true;
    if (gguf_get_str(g, key, &st) == 0) {
        yarn = gguf_str_eq(st, "yarn");
        linear = gguf_str_eq(st, "linear");
        if (!yarn && !linear && !gguf_str_eq(st, "none"))
            return fail(err, errlen, TIDE_EUNSUPPORTED, "%s %.*s: rope scaling type not supported", key,
                        (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    float factor = 0, log_mul = 0, attn_factor = 1, ext = 1, beta_fast = 32, beta_slow = 1;
    arch_f32(g, arch, "rope.scaling.factor", 0.0f, &factor);
    arch_f32(g, arch, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul);
    arch_f32(g, arch, "rope.scaling.attn_factor", 1.0f, &attn_factor);
    arch_f32(g, arch, "rope.scaling.yarn_ext_factor", 1.0f, &ext);
    arch_f32(g, arch, "rope.scaling.yarn_beta_fast", 32.0f, &beta_fast);
    arch_f32(g, arch, "rope.scaling.yarn_beta_slow", 1.0f, &beta_slow);
    bool ds2 = c->arch == ARCH_DEEPSEEK2; /* rope through the table always (its NORM pairs, n_rot wide) */
    bool none = (!yarn && !linear) || factor == 0.0f || (linear && factor == 1.0f);
    if (none && !ds2)
        return 0;
    if (ds2)
        log_mul /= 0.1f; /* llama.cpp cancels the converter's 0.1 */
    if (!none && (!(factor > 0) || (yarn && ((log_mul != 0.0f && !ds2) || ext != 1.0f))))
        return fail(err, errlen, TIDE_EUNSUPPORTED, "%s.rope.scaling: factor %g, yarn_log_multiplier %g, "
                    "yarn_ext_factor %g not supported", arch, factor, log_mul, ext);
    uint32_t orig = c->n_ctx_train;
    int rc = arch_u32(g, arch, "rope.scaling.original_context_length", c->n_ctx_train, false, &orig, err, errlen);
    if (rc)
        return rc;
    int d = (int)c->n_rot, half = d / 2;
    m->rope_freqs = malloc(sizeof(float) * (size_t)half);
    if (!m->rope_freqs)
        return TIDE_ENOMEM;
    float s = none ? 1.0f : 1.0f / factor, lo = 0, hi = 0;
    yarn = yarn && !none;
    if (yarn) { /* the correction dims, in float as llama.cpp computes them */
        const float pi = 3.14159265358979f;
        lo = floorf(d * logf(orig / (beta_fast * 2 * pi)) / (2 * logf(c->rope_theta)));
        hi = ceilf(d * logf(orig / (beta_slow * 2 * pi)) / (2 * logf(c->rope_theta)));
        lo = lo > 0 ? lo : 0;
        hi = hi < d - 1 ? hi : (float)(d - 1);
        c->rope_mscale = (1.0f + 0.1f * logf(factor)) * attn_factor;
        /* deepseek2 with yarn_log_multiplier: llama.cpp's rope magnitude comes to attn_factor
         * (mscale = mscale_all_dim cancels), and q.k is scaled by the square of that times
         * 1 + 0.1 log_mul ln(factor) */
        if (ds2 && log_mul != 0.0f)
            c->rope_mscale = attn_factor;
        if (ds2)
            c->mla_kq_mscale = c->rope_mscale * (1.0f + 0.1f * log_mul * logf(factor));
    }
    for (int i = 0; i < half; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / d), r = 0;
        if (yarn) {
            float y = (i - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
            r = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
        }
        m->rope_freqs[i] = (float)(f * (s * (1 - r) + r));
    }
    return 0;
}

int model_layer_window(const struct model_config *c, uint32_t l)
{
    if (c->arch != ARCH_GPTOSS || !c->n_swa)
        return 0;
    uint32_t p = c->swa_period;
    return p == 0 || l % p < p - 1 ? (int)c->n_swa : 0;
}

/* granitemoe's scalars, read as llama.cpp reads them: logit_scale required, the others optional
 * (0 or absent: none; attention.scale 0: 1/sqrt(head_dim)). A residual scale is applied with
 * the attention output's buffer as scratch (forward_arch.c), so that buffer must hold a row
 * of n_embd. GraniteMoeShared's shared expert: expert_shared_feed_forward_length wide, no gate. */
static int load_granite_config(const struct gguf_file *g, struct model_config *c, uint32_t n_ff_shexp, char *err,
                               size_t errlen)
{
    const char *arch = "granitemoe";
    if (gguf_get_f32(g, "granitemoe.logit_scale", &c->logit_scale) < 0)
        return fail(err, errlen, TIDE_EFORMAT, "missing %s.logit_scale", arch);
    arch_f32(g, arch, "residual_scale", 0.0f, &c->residual_scale);
    arch_f32(g, arch, "embedding_scale", 0.0f, &c->embedding_scale);
    arch_f32(g, arch, "attention.scale", 0.0f, &c->attention_scale);
    if (c->residual_scale == 0.0f)
        c->residual_scale = 1.0f;
    if (c->embedding_scale == 0.0f)
        c->embedding_scale = 1.0f;
    if (!isfinite(c->logit_scale) || c->logit_scale == 0.0f || !isfinite(c->residual_scale) ||
        !isfinite(c->embedding_scale) || !isfinite(c->attention_scale))
        return fail(err, errlen, TIDE_EFORMAT, "bad %s scales (logit %g, residual %g, embedding %g, attention %g)", arch,
                    c->logit_scale, c->residual_scale, c->embedding_scale, c->attention_scale);
    c->n_ff_shexp = n_ff_shexp; /* GraniteMoeShared: an ungated shared expert (absent: none) */
    if (c->residual_scale != 1.0f && (uint64_t)c->n_head * c->head_dim < c->n_embd)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "%s with n_head * head_dim (%u) < n_embd (%u) is not supported",
                    arch, c->n_head * c->head_dim, c->n_embd);
    return 0;
}

/* M-RoPE's rope.dimension_sections (required, as llama.cpp has it: an array of up to 4
 * integers, pairs per section, at most head_dim / 2 in all); qwen3vlmoe interleaves them. */
static int load_rope_sections(const struct gguf_file *g, const char *arch, struct model_config *c, char *err,
                              size_t errlen)
{
    char key[96];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return fail(err, errlen, TIDE_EFORMAT, "missing key %s", key);
    if (kv->type != GGUF_TYPE_ARRAY || (kv->v.arr.type != GGUF_TYPE_INT32 && kv->v.arr.type != GGUF_TYPE_UINT32) ||
        kv->v.arr.n == 0 || kv->v.arr.n > 4)
        return fail(err, errlen, TIDE_EFORMAT, "%s: expected 1 to 4 integers", key);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < kv->v.arr.n; i++) {
        int32_t v;
        memcpy(&v, kv->v.arr.data + 4 * i, 4);
        if (v < 0)
            return fail(err, errlen, TIDE_EFORMAT, "%s[%llu] = %d is negative", key, (unsigned long long)i, v);
        c->rope_sections[i] = (uint32_t)v;
        sum += (uint32_t)v;
    }
    if (sum == 0 || sum > c->head_dim / 2)
        return fail(err, errlen, TIDE_EFORMAT, "%s sum to %llu pairs (1 to head_dim/2 = %u)", key,
                    (unsigned long long)sum, c->head_dim / 2);
    c->rope_sections_interleaved = c->arch == ARCH_QWEN3VLMOE;
    return 0;
}

/* qwen3vlmoe: the sections and n_deepstack_layers (default 0). A MoE model: llama.cpp refuses
 * it without experts. */
static int load_qwen3vl_config(const struct gguf_file *g, struct model_config *c, char *err, size_t errlen)
{
    int rc;
    if (c->n_expert == 0)
        return fail(err, errlen, TIDE_EFORMAT, "missing qwen3vlmoe.expert_count");
    if ((rc = load_rope_sections(g, "qwen3vlmoe", c, err, errlen)))
        return rc;
    if ((rc = arch_u32(g, "qwen3vlmoe", "n_deepstack_layers", 0, false, &c->n_deepstack, err, errlen)))
        return rc;
    if (c->n_deepstack > c->n_layer)
        return fail(err, errlen, TIDE_EFORMAT, "qwen3vlmoe.n_deepstack_layers %u exceeds block_count %u", c->n_deepstack,
                    c->n_layer);
    return 0;
}

/* deepseek2 in DeepSeek-V2-Lite's form: MLA as the converter writes it (attn_kv_a_mqa, the
 * per-head attn_k_b / attn_v_b), q without a LoRA, leading dense layers, ungated shared experts
 * (expert_shared_count of the experts' width), softmax routing. What V2 (q's LoRA), V3
 * (sigmoid routing, expert bias, a routed scale) add is refused by name. */
static int load_deepseek2_config(const struct gguf_file *g, struct model_config *c, uint32_t n_ff, char *err,
                                 size_t errlen)
{
    const char *a = "deepseek2";
    uint32_t q_lora = 0, n_shared = 0, gating = 1;
    int rc;
    if ((rc = arch_u32(g, a, "attention.kv_lora_rank", 0, true, &c->kv_lora_rank, err, errlen)) ||
        (rc = arch_u32(g, a, "attention.key_length_mla", 0, true, &c->mla_k, err, errlen)) ||
        (rc = arch_u32(g, a, "attention.value_length_mla", 0, true, &c->mla_v, err, errlen)) ||
        (rc = arch_u32(g, a, "rope.dimension_count", 0, true, &c->n_rot, err, errlen)) ||
        (rc = arch_u32(g, a, "leading_dense_block_count", 0, false, &c->n_dense_lead, err, errlen)) ||
        (rc = arch_u32(g, a, "expert_shared_count", 0, false, &n_shared, err, errlen)) ||
        (rc = arch_u32(g, a, "expert_gating_func", 1, false, &gating, err, errlen)) ||
        (rc = arch_u32(g, a, "attention.q_lora_rank", 0, false, &q_lora, err, errlen)))
        return rc;
    if (q_lora)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "deepseek2.attention.q_lora_rank %u: q through a LoRA (DeepSeek-V2, "
                    "V3) is not supported, only V2-Lite's form", q_lora);
    if (gating != 1)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "deepseek2.expert_gating_func %u: only softmax routing (1) is "
                    "supported", gating);
    float scale = 1.0f;
    arch_f32(g, a, "expert_weights_scale", 1.0f, &scale);
    if (scale != 1.0f)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "deepseek2.expert_weights_scale %g: only 1 is supported", scale);
    if (!c->n_expert)
        return fail(err, errlen, TIDE_EFORMAT, "missing deepseek2.expert_count (only the MoE form is supported)");
    if (c->n_head_kv != 1 || c->n_rot == 0 || c->n_rot % 2 || c->mla_k <= c->n_rot ||
        c->head_dim != c->kv_lora_rank + c->n_rot || c->mla_k - c->n_rot > c->kv_lora_rank ||
        c->mla_v > c->head_dim)
        return fail(err, errlen, TIDE_EFORMAT, "deepseek2: MLA widths (head_count_kv %u, key_length %u, kv_lora_rank "
                    "%u, rope.dimension_count %u, key_length_mla %u, value_length_mla %u) are not the converter's "
                    "MLA form", c->n_head_kv, c->head_dim, c->kv_lora_rank, c->n_rot, c->mla_k, c->mla_v);
    if (c->n_dense_lead > c->n_layer || (c->n_dense_lead && !n_ff))
        return fail(err, errlen, TIDE_EFORMAT, "deepseek2: %u leading dense layers need feed_forward_length",
                    c->n_dense_lead);
    c->n_ff = c->n_dense_lead ? n_ff : 0;
    c->n_ff_shexp = c->n_ff_exp * n_shared;
    c->mla_kq_mscale = 1.0f;
    return 0;
}

static int load_config(struct model *m, char *err, size_t errlen)
{
    const struct gguf_file *g = &m->gguf;
    struct model_config *c = &m->cfg;
    struct gguf_str a;
    if (gguf_get_str(g, "general.architecture", &a) < 0)
        return fail(err, errlen, TIDE_EFORMAT, "missing general.architecture");
    const char *arch;
    if (gguf_str_eq(a, "llama")) { c->arch = ARCH_LLAMA; arch = "llama"; }
    else if (gguf_str_eq(a, "qwen3")) { c->arch = ARCH_QWEN3; arch = "qwen3"; }
    else if (gguf_str_eq(a, "qwen3moe")) { c->arch = ARCH_QWEN3MOE; arch = "qwen3moe"; }
    else if (gguf_str_eq(a, "qwen2moe")) { c->arch = ARCH_QWEN2MOE; arch = "qwen2moe"; }
    else if (gguf_str_eq(a, "gpt-oss")) { c->arch = ARCH_GPTOSS; arch = "gpt-oss"; }
    else if (gguf_str_eq(a, "olmoe")) { c->arch = ARCH_OLMOE; arch = "olmoe"; }
    else if (gguf_str_eq(a, "granitemoe")) { c->arch = ARCH_GRANITEMOE; arch = "granitemoe"; }
    else if (gguf_str_eq(a, "qwen3vlmoe")) { c->arch = ARCH_QWEN3VLMOE; arch = "qwen3vlmoe"; }
    else if (gguf_str_eq(a, "qwen2vl")) { c->arch = ARCH_QWEN2VL; arch = "qwen2vl"; }
    else if (gguf_str_eq(a, "deepseek2")) { c->arch = ARCH_DEEPSEEK2; arch = "deepseek2"; }
    else
        return fail(err, errlen, TIDE_EUNSUPPORTED, "unsupported architecture %.*s",
                    (int)(a.len > 64 ? 64 : a.len), a.ptr);
    int rc;
    uint32_t n_ff = 0, n_ff_exp = 0, n_ff_shexp = 0;
    if ((rc = arch_u32(g, arch, "embedding_length", 0, true, &c->n_embd, err, errlen)) ||
        (rc = arch_u32(g, arch, "block_count", 0, true, &c->n_layer, err, errlen)) ||
        (rc = arch_u32(g, arch, "attention.head_count", 0, true, &c->n_head, err, errlen)) ||
        (rc = arch_u32(g, arch, "attention.head_count_kv", c->n_head, false, &c->n_head_kv,
                       err, errlen)) ||
        (rc = arch_u32(g, arch, "feed_forward_length", 0, false, &n_ff, err, errlen)) ||
        (rc = arch_u32(g, arch, "expert_count", 0, false, &c->n_expert, err, errlen)) ||
        (rc = arch_u32(g, arch, "expert_used_count", 0, false, &c->n_expert_used, err,
                       errlen)) ||
        (rc = arch_u32(g, arch, "expert_feed_forward_length", 0, false, &n_ff_exp, err,
                       errlen)) ||
        (rc = arch_u32(g, arch, "expert_shared_feed_forward_length", 0, false, &n_ff_shexp, err,
                       errlen)) ||
        (rc = arch_u32(g, arch, "context_length", 2048, false, &c->n_ctx_train, err,
                       errlen)))
        return rc;
    if (c->n_embd == 0 || c->n_layer == 0 || c->n_head == 0 || c->n_head_kv == 0 ||
        c->n_head % c->n_head_kv != 0)
        return fail(err, errlen, TIDE_EFORMAT, "bad head/embedding counts");
    if ((rc = arch_u32(g, arch, "attention.key_length", c->n_embd / c->n_head, false,
                       &c->head_dim, err, errlen)))
        return rc;
    if (c->head_dim == 0 || c->head_dim % 2)
        return fail(err, errlen, TIDE_EFORMAT, "head_dim %u must be even", c->head_dim);
    arch_f32(g, arch, "rope.freq_base", 10000.0f, &c->rope_theta);
    c->rope_mscale = 1.0f;
    arch_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &c->rms_eps);
    c->rope = c->arch == ARCH_LLAMA || c->arch == ARCH_GRANITEMOE || c->arch == ARCH_DEEPSEEK2 ? ROPE_NORM : ROPE_NEOX;
    c->n_rot = c->head_dim;
    c->embedding_scale = c->residual_scale = c->logit_scale = 1.0f;
    c->attention_scale = 0.0f;
    if ((c->arch == ARCH_OLMOE || c->arch == ARCH_GRANITEMOE) && c->n_expert == 0)
        return fail(err, errlen, TIDE_EFORMAT, "missing %s.expert_count (only the MoE form is supported)", arch);

    if (c->n_expert > 0) {
        if (c->n_expert_used == 0 || c->n_expert_used > c->n_expert)
            return fail(err, errlen, TIDE_EFORMAT, "bad expert_used_count %u",
                        c->n_expert_used);
        c->n_ff_exp = n_ff_exp ? n_ff_exp : n_ff;
        if (c->arch == ARCH_QWEN2MOE) {
            /* llama.cpp's defaults when the widths are absent: the routed experts share
             * feed_forward_length between the k used, the shared expert has all of it */
            c->n_ff_exp = n_ff_exp ? n_ff_exp : n_ff / c->n_expert_used;
            c->n_ff_shexp = n_ff_shexp ? n_ff_shexp : n_ff;
            if (c->n_ff_shexp == 0)
                return fail(err, errlen, TIDE_EFORMAT, "missing %s.expert_shared_feed_forward_length", arch);
        }
        c->n_ff = 0;
        if (c->n_ff_exp == 0)
            return fail(err, errlen, TIDE_EFORMAT, "missing expert FFN width");
        /* Mixtral's softmax over the top-k logits equals softmax-all then renormalise */
        c->expert_weights_norm = true;
        char key[128];
        snprintf(key, sizeof(key), "%s.expert_weights_norm", arch);
        bool b;
        if (gguf_get_bool(g, key, &b) == 0)
            c->expert_weights_norm = b;
        /* qwen2moe weighs the chosen experts by their softmax over all experts, not
         * renormalised (llama.cpp reads no key for it) */
        if (c->arch == ARCH_QWEN2MOE || c->arch == ARCH_OLMOE)
            c->expert_weights_norm = false; /* olmoe too: its softmax weights as they are */
        if (c->arch == ARCH_GRANITEMOE)
            c->expert_weights_norm = true;  /* llama.cpp renormalises granite's, reading no key */
        /* gpt-oss: a softmax over the chosen experts' logits, which is the softmax over all
         * renormalised over the chosen */
        if (c->arch == ARCH_GPTOSS)
            c->expert_weights_norm = true;
        /* qwen3vlmoe: llama.cpp renormalises the top-k weights whatever the key says */
        if (c->arch == ARCH_QWEN3VLMOE)
            c->expert_weights_norm = true;
        if (c->arch == ARCH_DEEPSEEK2) /* llama.cpp's default for it: off, unless the key says */
            c->expert_weights_norm = gguf_get_bool(g, key, &b) == 0 && b;
    } else {
        if (n_ff == 0)
            return fail(err, errlen, TIDE_EFORMAT, "missing %s.feed_forward_length", arch);
        c->n_ff = n_ff;
    }

    if (c->arch == ARCH_GPTOSS && (rc = load_gptoss_config(g, c, err, errlen)))
        return rc;
    if (c->arch == ARCH_GRANITEMOE && (rc = load_granite_config(g, c, n_ff_shexp, err, errlen)))
        return rc;
    if (c->arch == ARCH_QWEN3VLMOE && (rc = load_qwen3vl_config(g, c, err, errlen)))
        return rc;
    /* qwen2vl: dense only (llama.cpp reads no experts for it), sections one after the other */
    if (c->arch == ARCH_QWEN2VL && c->n_expert)
        return fail(err, errlen, TIDE_EUNSUPPORTED, "qwen2vl with experts is not a model llama.cpp knows");
    if (c->arch == ARCH_QWEN2VL && (rc = load_rope_sections(g, "qwen2vl", c, err, errlen)))
        return rc;
    if (c->arch == ARCH_DEEPSEEK2 && (rc = load_deepseek2_config(g, c, n_ff, err, errlen)))
        return rc;

    const struct gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (kv && kv->type == GGUF_TYPE_ARRAY)
        c->n_vocab = (uint32_t)kv->v.arr.n;
    else if ((rc = arch_u32(g, arch, "vocab_size", 0, true, &c->n_vocab, err, errlen)))
        return rc;
    if (c->n_vocab == 0)
        return fail(err, errlen, TIDE_EFORMAT, "empty vocabulary");
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
        return fail(err, errlen, TIDE_EUNSUPPORTED, "deepseek2: %s missing: q through a LoRA (attn_q_a/attn_q_b, "
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
        return fail(err, errlen, TIDE_EUNSUPPORTED, "deepseek2: %s missing: files with the unsplit attn_kv_b (older "
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
            return fail(err, errlen, TIDE_EUNSUPPORTED, "tensor %s has type %s, expected f32", n, \
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
                return fail(err, errlen, TIDE_EUNSUPPORTED, "tensor %s has type %s, expected f32", n,
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
    if ((rc = load_config(m, err, errlen)) < 0 ||
        (m->cfg.arch == ARCH_GPTOSS && (rc = load_rope_scaling(m, "gpt-oss", err, errlen)) < 0) ||
        (m->cfg.arch == ARCH_DEEPSEEK2 && (rc = load_rope_scaling(m, "deepseek2", err, errlen)) < 0) ||
        (rc = load_tensors(m, err, errlen)) < 0 || (rc = fold_logit_scale(m)) < 0) {
        if (rc == TIDE_ENOMEM)
            fail(err, errlen, rc, "out of memory loading %s", path);
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

/* Whether a CUDA device takes weights of type t. A type whose CUDA kernels exist but have not
 * yet passed their test-gpu tests on a GPU stays refused at start-up: each is one line here,
 * and lifting its refusal is turning that line's false into true. */
static bool cuda_runs_type(uint32_t t)
{
    switch (t) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: /* k-quants: cuda/kquant.cu */
        return true;
    case GGML_TYPE_Q5_0: return false;   /* cuda/qblock.cu; test-gpu matmul_q5_0, get_rows_qb */
    case GGML_TYPE_Q5_1: return false;   /* cuda/qblock.cu; test-gpu matmul_q5_1, get_rows_qb */
    case GGML_TYPE_IQ4_XS: return false; /* cuda/qblock.cu; test-gpu matmul_iq4_xs, get_rows_qb */
    case GGML_TYPE_MXFP4: return false;  /* cuda/qblock.cu; test-gpu matmul_mxfp4, e2e_gptoss_mxfp4 */
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
