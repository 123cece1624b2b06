/* test_moe_archs.c - tide-mkmodel's olmoe and granitemoe presets as llama.cpp names and shapes
 * them (src/models/olmoe.cpp and granite-moe.cpp there), and what the loader makes of them:
 * olmoe's whole-width q/k norms and unnormalised top-k, granitemoe's four scales (the logit
 * scale folded into output_norm), and the experts' bytes for the expert cache. The forward's
 * arithmetic for both is checked against a double reference in test_forward.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/modelgen.h"

struct want_tensor { const char *name; uint32_t nd; uint64_t a, b, c; };

static void write_preset(const char *preset, char *path, size_t len)
{
    snprintf(path, len, "/tmp/tide-test-mga-%d-%s.gguf", (int)getpid(), preset);
    struct modelgen_options o = {.preset = preset, .out = path, .seed = 1, .type = -1, .threads = 1};
    char err[200] = "";
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
}

static void check_tensors(const struct gguf_file *g, const struct want_tensor *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(g, want[i].name);
        cr_assert(t, "%s missing", want[i].name);
        cr_assert(t->n_dims == want[i].nd && t->ne[0] == want[i].a && t->ne[1] == want[i].b && t->ne[2] == want[i].c,
                  "%s: %u dims [%llu, %llu, %llu]", want[i].name, t->n_dims, (unsigned long long)t->ne[0],
                  (unsigned long long)t->ne[1], (unsigned long long)t->ne[2]);
    }
}

Test(moe_archs, modelgen_olmoe_preset)
{
    char path[80];
    write_preset("olmoe", path, sizeof path);
    struct gguf_file g;
    char err[200] = "";
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    uint32_t v;
    /* llama.cpp sizes olmoe's experts by feed_forward_length */
    cr_assert_eq(gguf_get_u32(&g, "olmoe.feed_forward_length", &v), 0);
    cr_assert_eq(v, 64);
    cr_assert_eq(gguf_get_u32(&g, "olmoe.attention.head_count_kv", &v), 0);
    cr_assert_eq(v, 4);
    const struct want_tensor want[] = {
        {"blk.0.attn_q_norm.weight", 1, 128, 1, 1}, {"blk.0.attn_k_norm.weight", 1, 128, 1, 1},
        {"blk.3.attn_q.weight", 2, 128, 128, 1},    {"blk.3.ffn_gate_inp.weight", 2, 128, 8, 1},
        {"blk.3.ffn_gate_exps.weight", 3, 128, 64, 8}, {"blk.3.ffn_down_exps.weight", 3, 64, 128, 8},
        {"output.weight", 2, 128, 771, 1},
    };
    check_tensors(&g, want, sizeof want / sizeof want[0]);
    cr_assert_null(gguf_find_tensor(&g, "blk.0.attn_q.bias"));
    cr_assert_null(gguf_find_tensor(&g, "blk.0.ffn_gate_shexp.weight"));
    gguf_close(&g);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.arch, ARCH_OLMOE);
    cr_assert_str_eq(model_arch_name(m.cfg.arch), "olmoe");
    cr_assert_eq(m.cfg.rope, ROPE_NEOX);
    cr_assert(!m.cfg.expert_weights_norm, "olmoe's top-k softmax weights are not renormalised");
    cr_assert_eq(m.layers[2].q_norm.ne[0], 128, "one q norm over all heads");
    cr_assert_eq(m.cfg.n_ff_exp, 64);
    cr_assert_eq(m.cfg.n_ff_shexp, 0);
    cr_assert(m.cfg.embedding_scale == 1.0f && m.cfg.residual_scale == 1.0f && m.cfg.logit_scale == 1.0f &&
              m.cfg.attention_scale == 0.0f);
    cr_assert_eq(model_expert_bytes(&m, 0), 3 * 128 * 64 * 2); /* gate + up + down, f16 */
    model_free(&m);
    unlink(path);
}

Test(moe_archs, modelgen_granitemoe_preset)
{
    char path[80];
    write_preset("granitemoe", path, sizeof path);
    struct gguf_file g;
    char err[200] = "";
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    float f;
    cr_assert_eq(gguf_get_f32(&g, "granitemoe.embedding_scale", &f), 0);
    cr_assert_float_eq(f, 12.0f, 0);
    cr_assert_eq(gguf_get_f32(&g, "granitemoe.residual_scale", &f), 0);
    cr_assert_float_eq(f, 0.22f, 0);
    cr_assert_eq(gguf_get_f32(&g, "granitemoe.attention.scale", &f), 0);
    cr_assert_float_eq(f, 0.015625f, 0);
    cr_assert_eq(gguf_get_f32(&g, "granitemoe.logit_scale", &f), 0);
    cr_assert_float_eq(f, 6.0f, 0);
    const struct want_tensor want[] = {
        {"blk.0.attn_q.weight", 2, 128, 128, 1},       {"blk.0.attn_k.weight", 2, 128, 64, 1},
        {"blk.3.ffn_gate_exps.weight", 3, 128, 128, 8}, {"blk.3.ffn_up_exps.weight", 3, 128, 128, 8},
        {"blk.3.ffn_down_exps.weight", 3, 128, 128, 8}, {"blk.3.ffn_norm.weight", 1, 128, 1, 1},
    };
    check_tensors(&g, want, sizeof want / sizeof want[0]);
    cr_assert_null(gguf_find_tensor(&g, "blk.0.attn_q_norm.weight"));
    const float *onorm = gguf_find_tensor(&g, "output_norm.weight")->data;
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.arch, ARCH_GRANITEMOE);
    cr_assert_str_eq(model_arch_name(m.cfg.arch), "granitemoe");
    cr_assert_eq(m.cfg.rope, ROPE_NORM, "granite rotates pairs (2i, 2i+1), as llama");
    cr_assert(m.cfg.expert_weights_norm, "granitemoe renormalises its top-k weights");
    cr_assert(m.cfg.embedding_scale == 12.0f && m.cfg.residual_scale == 0.22f && m.cfg.attention_scale == 0.015625f &&
              m.cfg.logit_scale == 6.0f);
    /* the logits' 1 / logit_scale lives in output_norm's weights now (an owned f32 copy) */
    cr_assert_eq(m.output_norm.type, GGML_TYPE_F32);
    cr_assert_neq(m.output_norm.data, (const void *)onorm);
    const float *folded = m.output_norm.data;
    for (int i = 0; i < 128; i++)
        cr_assert_float_eq(folded[i], onorm[i] * (1.0f / 6.0f), 0, "output_norm[%d]", i);
    cr_assert_eq(model_expert_bytes(&m, 0), 3 * 128 * 128 * 2);
    model_free(&m);
    unlink(path);
}

/* GraniteMoeShared as llama.cpp reads it (granite-moe.cpp's n_ff_shexp branch): the experts keep
 * feed_forward_length, the shared expert has its own width and no gate or biases; it is a
 * resident layer weight (a stage counts it), not an expert of the cache. */
Test(moe_archs, modelgen_granitemoe_shared_preset)
{
    char path[80];
    write_preset("granitemoe-shared", path, sizeof path);
    struct gguf_file g;
    char err[200] = "";
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    uint32_t v;
    cr_assert_eq(gguf_get_u32(&g, "granitemoe.feed_forward_length", &v), 0);
    cr_assert_eq(v, 128);
    cr_assert_eq(gguf_get_u32(&g, "granitemoe.expert_shared_feed_forward_length", &v), 0);
    cr_assert_eq(v, 128);
    const struct want_tensor want[] = {
        {"blk.3.ffn_gate_shexp.weight", 2, 128, 128, 1}, {"blk.3.ffn_up_shexp.weight", 2, 128, 128, 1},
        {"blk.3.ffn_down_shexp.weight", 2, 128, 128, 1}, {"blk.3.ffn_gate_exps.weight", 3, 128, 128, 8},
    };
    check_tensors(&g, want, sizeof want / sizeof want[0]);
    cr_assert_null(gguf_find_tensor(&g, "blk.0.ffn_gate_inp_shexp.weight"));
    cr_assert_null(gguf_find_tensor(&g, "blk.0.attn_q.bias"));
    gguf_close(&g);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.n_ff_shexp, 128);
    cr_assert(m.layers[3].ffn_down_shexp.data && !m.layers[3].ffn_gate_inp_shexp.data);
    cr_assert_eq(model_expert_bytes(&m, 0), 3 * 128 * 128 * 2);
    /* a stage of layer 3 alone: f16 wq, wo 128x128, wk, wv 128x64, the shared expert 3 x
     * 128x128; f32 the 2 norms of 128 and the router 128x8 */
    struct forward_stage_bytes sb;
    forward_stage_size(&m, 64, 1, 8, 3, 4, false, false, KV_F32, &sb);
    size_t want_bytes = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 128) + 4 * (2 * 128 + 128 * 8);
    cr_assert_eq(sb.weights, want_bytes, "stage weights %zu, want %zu", sb.weights, want_bytes);
    model_free(&m);
    unlink(path);
}

/* deepseek2 in DeepSeek-V2-Lite's layout (27 layers: llama.cpp tells the Lite form, q without a
 * LoRA, by the layer count) with narrow MLA widths, as llama.cpp's loader names and shapes it
 * (src/models/deepseek2.cpp; llama-simple loads and runs it, checked by hand: no llama.cpp in
 * CI), and what tide's loader makes of it: MLA as one KV head of kv_lora_rank + n_rot, the
 * leading dense layer (no experts for the cache), the shared experts' width, NORM rope through
 * the yarn table, llama.cpp's q.k scale correction, unnormalised softmax top-k. */
Test(moe_archs, modelgen_deepseek2_preset_and_its_config)
{
    char path[80];
    write_preset("deepseek2", path, sizeof path);
    struct gguf_file g;
    char err[200] = "";
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    struct { const char *key; uint32_t v; } keys[] = {
        {"deepseek2.block_count", 27},          {"deepseek2.attention.head_count_kv", 1},
        {"deepseek2.attention.kv_lora_rank", 64}, {"deepseek2.attention.key_length", 80},
        {"deepseek2.attention.value_length", 64}, {"deepseek2.attention.key_length_mla", 48},
        {"deepseek2.attention.value_length_mla", 32}, {"deepseek2.rope.dimension_count", 16},
        {"deepseek2.leading_dense_block_count", 1}, {"deepseek2.expert_shared_count", 2},
        {"deepseek2.expert_feed_forward_length", 64}, {"deepseek2.feed_forward_length", 256},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        uint32_t v = 0;
        cr_assert_eq(gguf_get_u32(&g, keys[i].key, &v), 0, "%s missing", keys[i].key);
        cr_assert_eq(v, keys[i].v, "%s = %u", keys[i].key, v);
    }
    const struct want_tensor want[] = {
        {"blk.0.attn_q.weight", 2, 128, 4 * 48, 1},   {"blk.0.attn_kv_a_mqa.weight", 2, 128, 80, 1},
        {"blk.0.attn_kv_a_norm.weight", 1, 64, 1, 1}, {"blk.0.attn_k_b.weight", 3, 32, 64, 4},
        {"blk.0.attn_v_b.weight", 3, 64, 32, 4},      {"blk.0.attn_output.weight", 2, 4 * 32, 128, 1},
        {"blk.0.ffn_gate.weight", 2, 128, 256, 1},    {"blk.26.ffn_gate_exps.weight", 3, 128, 64, 8},
        {"blk.26.ffn_down_exps.weight", 3, 64, 128, 8}, {"blk.26.ffn_gate_shexp.weight", 2, 128, 128, 1},
        {"blk.26.ffn_down_shexp.weight", 2, 128, 128, 1},
    };
    check_tensors(&g, want, sizeof want / sizeof want[0]);
    cr_assert_null(gguf_find_tensor(&g, "blk.1.ffn_gate.weight"), "only layer 0 is dense");
    gguf_close(&g);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    const struct model_config *c = &m.cfg;
    cr_assert_eq(c->arch, ARCH_DEEPSEEK2);
    cr_assert(c->n_head_kv == 1 && c->head_dim == 80 && c->kv_lora_rank == 64 && c->n_rot == 16 && c->mla_k == 48 &&
              c->mla_v == 32, "MLA widths");
    cr_assert(c->n_dense_lead == 1 && c->n_ff == 256 && c->n_ff_exp == 64 && c->n_ff_shexp == 128, "FFN widths");
    cr_assert(c->rope == ROPE_NORM && !c->expert_weights_norm);
    /* yarn_log_multiplier 0.0707 is 0.707 (the converter's 0.1 cancelled): the rope's magnitude
     * 1, q.k times (1 + 0.1 * 0.707 * ln 40)^2 / sqrt(48) */
    cr_assert_float_eq(c->rope_mscale, 1.0f, 1e-6f);
    cr_assert_float_eq(c->mla_kq_mscale, 1.0f + 0.0707f * logf(40.0f), 1e-5f);
    cr_assert_not_null(m.rope_freqs);
    cr_assert_float_eq(m.rope_freqs[0], 1.0f, 1e-6f);                      /* below the ramp: unscaled */
    cr_assert_float_eq(m.rope_freqs[7], powf(10000.0f, -14.0f / 16) / 40, 1e-9f); /* above it: over 40 */
    cr_assert_not_null(m.layers[0].ffn_gate.data);
    cr_assert_eq(model_expert_bytes(&m, 0), 0, "the dense layer has no experts");
    cr_assert_gt(model_expert_bytes(&m, 1), 0);
    cr_assert(m.layers[1].wk_b.ne[0] == 32 && m.layers[1].wk_b.ne[1] == 64 * 4, "wk_b as one matrix of 4 heads");
    cr_assert(m.layers[1].wv_b.ne[0] == 64 && m.layers[1].wv_b.ne[1] == 32 * 4, "wv_b as one matrix of 4 heads");
    model_free(&m);
    unlink(path);
}
