/* model_config.c - a GGUF text model's hyper-parameters: the keys every architecture shares,
 * each architecture's own (gpt-oss's sliding window, granitemoe's scales, the M-RoPE sections,
 * deepseek2's MLA widths), the rope scaling table, all checked here so that what tide does not
 * compute is refused by name rather than run wrong. model.c calls it before it binds the
 * tensors (model_config.h). */
#include "model_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        return tide_fail(TIDE_EFORMAT, err, errlen, "%s key %s", rc == TIDE_ENOTFOUND ?
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
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing %s.expert_count", arch);
    if ((rc = arch_u32(g, arch, "attention.sliding_window", 0, true, &c->n_swa, err, errlen)))
        return rc;
    const struct gguf_kv *pat = gguf_find_kv(g, "gpt-oss.attention.sliding_window_pattern");
    if (pat && pat->type != GGUF_TYPE_UINT32)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                         "%s.attention.sliding_window_pattern: only a number is supported",
                         arch);
    if ((rc = arch_u32(g, arch, "attention.sliding_window_pattern", 2, false, &c->swa_period, err, errlen)))
        return rc;
    if (c->n_swa == 0)
        return tide_fail(TIDE_EFORMAT, err, errlen, "bad %s.attention.sliding_window 0", arch);
    float base_swa;
    arch_f32(g, arch, "rope.freq_base_swa", c->rope_theta, &base_swa);
    if (base_swa != c->rope_theta)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "%s.rope.freq_base_swa %g differs from rope.freq_base %g: not "
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
int model_load_rope_scaling(struct model *m, const char *arch, char *err, size_t errlen)
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
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "%s %.*s: rope scaling type not supported", key,
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
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "%s.rope.scaling: factor %g, yarn_log_multiplier %g, "
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
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing %s.logit_scale", arch);
    arch_f32(g, arch, "residual_scale", 0.0f, &c->residual_scale);
    arch_f32(g, arch, "embedding_scale", 0.0f, &c->embedding_scale);
    arch_f32(g, arch, "attention.scale", 0.0f, &c->attention_scale);
    if (c->residual_scale == 0.0f)
        c->residual_scale = 1.0f;
    if (c->embedding_scale == 0.0f)
        c->embedding_scale = 1.0f;
    if (!isfinite(c->logit_scale) || c->logit_scale == 0.0f || !isfinite(c->residual_scale) ||
        !isfinite(c->embedding_scale) || !isfinite(c->attention_scale))
        return tide_fail(TIDE_EFORMAT, err, errlen,
                         "bad %s scales (logit %g, residual %g, embedding %g, attention %g)", arch,
                         c->logit_scale, c->residual_scale, c->embedding_scale, c->attention_scale);
    c->n_ff_shexp = n_ff_shexp; /* GraniteMoeShared: an ungated shared expert (absent: none) */
    if (c->residual_scale != 1.0f && (uint64_t)c->n_head * c->head_dim < c->n_embd)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                         "%s with n_head * head_dim (%u) < n_embd (%u) is not supported",
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
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing key %s", key);
    if (kv->type != GGUF_TYPE_ARRAY || (kv->v.arr.type != GGUF_TYPE_INT32 && kv->v.arr.type != GGUF_TYPE_UINT32) ||
        kv->v.arr.n == 0 || kv->v.arr.n > 4)
        return tide_fail(TIDE_EFORMAT, err, errlen, "%s: expected 1 to 4 integers", key);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < kv->v.arr.n; i++) {
        int32_t v;
        memcpy(&v, kv->v.arr.data + 4 * i, 4);
        if (v < 0)
            return tide_fail(TIDE_EFORMAT, err, errlen, "%s[%llu] = %d is negative", key, (unsigned long long)i, v);
        c->rope_sections[i] = (uint32_t)v;
        sum += (uint32_t)v;
    }
    if (sum == 0 || sum > c->head_dim / 2)
        return tide_fail(TIDE_EFORMAT, err, errlen, "%s sum to %llu pairs (1 to head_dim/2 = %u)", key,
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
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing qwen3vlmoe.expert_count");
    if ((rc = load_rope_sections(g, "qwen3vlmoe", c, err, errlen)))
        return rc;
    if ((rc = arch_u32(g, "qwen3vlmoe", "n_deepstack_layers", 0, false, &c->n_deepstack, err, errlen)))
        return rc;
    if (c->n_deepstack > c->n_layer)
        return tide_fail(TIDE_EFORMAT, err, errlen,
                         "qwen3vlmoe.n_deepstack_layers %u exceeds block_count %u", c->n_deepstack,
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
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                         "deepseek2.attention.q_lora_rank %u: q through a LoRA (DeepSeek-V2, "
                         "V3) is not supported, only V2-Lite's form", q_lora);
    if (gating != 1)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "deepseek2.expert_gating_func %u: only softmax routing (1) is "
                         "supported", gating);
    float scale = 1.0f;
    arch_f32(g, a, "expert_weights_scale", 1.0f, &scale);
    if (scale != 1.0f)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                         "deepseek2.expert_weights_scale %g: only 1 is supported", scale);
    if (!c->n_expert)
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing deepseek2.expert_count (only the MoE form is supported)");
    if (c->n_head_kv != 1 || c->n_rot == 0 || c->n_rot % 2 || c->mla_k <= c->n_rot ||
        c->head_dim != c->kv_lora_rank + c->n_rot || c->mla_k - c->n_rot > c->kv_lora_rank ||
        c->mla_v > c->head_dim)
        return tide_fail(TIDE_EFORMAT, err, errlen,
                         "deepseek2: MLA widths (head_count_kv %u, key_length %u, kv_lora_rank "
                         "%u, rope.dimension_count %u, key_length_mla %u, value_length_mla %u) are not the converter's "
                         "MLA form", c->n_head_kv, c->head_dim, c->kv_lora_rank, c->n_rot, c->mla_k, c->mla_v);
    if (c->n_dense_lead > c->n_layer || (c->n_dense_lead && !n_ff))
        return tide_fail(TIDE_EFORMAT, err, errlen, "deepseek2: %u leading dense layers need feed_forward_length",
                         c->n_dense_lead);
    c->n_ff = c->n_dense_lead ? n_ff : 0;
    c->n_ff_shexp = c->n_ff_exp * n_shared;
    c->mla_kq_mscale = 1.0f;
    return 0;
}

int model_load_config(struct model *m, char *err, size_t errlen)
{
    const struct gguf_file *g = &m->gguf;
    struct model_config *c = &m->cfg;
    struct gguf_str a;
    if (gguf_get_str(g, "general.architecture", &a) < 0)
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing general.architecture");
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
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "unsupported architecture %.*s",
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
        return tide_fail(TIDE_EFORMAT, err, errlen, "bad head/embedding counts");
    if ((rc = arch_u32(g, arch, "attention.key_length", c->n_embd / c->n_head, false,
                       &c->head_dim, err, errlen)))
        return rc;
    if (c->head_dim == 0 || c->head_dim % 2)
        return tide_fail(TIDE_EFORMAT, err, errlen, "head_dim %u must be even", c->head_dim);
    arch_f32(g, arch, "rope.freq_base", 10000.0f, &c->rope_theta);
    c->rope_mscale = 1.0f;
    arch_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &c->rms_eps);
    c->rope = c->arch == ARCH_LLAMA || c->arch == ARCH_GRANITEMOE || c->arch == ARCH_DEEPSEEK2 ? ROPE_NORM : ROPE_NEOX;
    c->n_rot = c->head_dim;
    c->embedding_scale = c->residual_scale = c->logit_scale = 1.0f;
    c->attention_scale = 0.0f;
    if ((c->arch == ARCH_OLMOE || c->arch == ARCH_GRANITEMOE) && c->n_expert == 0)
        return tide_fail(TIDE_EFORMAT, err, errlen, "missing %s.expert_count (only the MoE form is supported)", arch);

    if (c->n_expert > 0) {
        if (c->n_expert_used == 0 || c->n_expert_used > c->n_expert)
            return tide_fail(TIDE_EFORMAT, err, errlen, "bad expert_used_count %u",
                             c->n_expert_used);
        c->n_ff_exp = n_ff_exp ? n_ff_exp : n_ff;
        if (c->arch == ARCH_QWEN2MOE) {
            /* llama.cpp's defaults when the widths are absent: the routed experts share
             * feed_forward_length between the k used, the shared expert has all of it */
            c->n_ff_exp = n_ff_exp ? n_ff_exp : n_ff / c->n_expert_used;
            c->n_ff_shexp = n_ff_shexp ? n_ff_shexp : n_ff;
            if (c->n_ff_shexp == 0)
                return tide_fail(TIDE_EFORMAT, err, errlen, "missing %s.expert_shared_feed_forward_length", arch);
        }
        c->n_ff = 0;
        if (c->n_ff_exp == 0)
            return tide_fail(TIDE_EFORMAT, err, errlen, "missing expert FFN width");
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
            return tide_fail(TIDE_EFORMAT, err, errlen, "missing %s.feed_forward_length", arch);
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
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen, "qwen2vl with experts is not a model llama.cpp knows");
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
        return tide_fail(TIDE_EFORMAT, err, errlen, "empty vocabulary");
    return 0;
}
