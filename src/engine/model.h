/* model.h - a text model's hyper-parameters and weights as found in the GGUF.
 *
 * Architectures: llama (dense, or Mixtral-style MoE with ffn_gate_inp + ffn_*_exps),
 * qwen3 (dense, QK-norm), qwen3moe (MoE, QK-norm, normalised top-k weights), qwen2moe (MoE
 * with q/k/v biases, unnormalised top-k weights and a shared expert whose output a sigmoid
 * gate scales; the shared expert is a resident layer weight, not an expert of the cache), gpt-oss
 * (MoE with biases everywhere, attention sinks, sliding-window layers every other layer, the
 * clamped SwiGLU and a softmax over the chosen experts' router logits), olmoe (MoE, q/k rmsnorms
 * over the whole q and k width rather than per head, unnormalised top-k weights), granitemoe
 * (Mixtral-style MoE with four scalars: embedding, residual, attention and logit scales),
 * qwen3vlmoe (Qwen3-VL-MoE's
 * text model: qwen3moe with M-RoPE in rope.dimension_sections and deepstack image features added
 * after its first n_deepstack layers; a text token's M-RoPE is plain NEOX rope, see mrope.h),
 * qwen2vl (Qwen2-VL's and Qwen2.5-VL's text model: Qwen2 dense with q/k/v biases and M-RoPE
 * whose sections lie one after the other rather than interleaved).
 * Weights stay in the mmapped file (host RAM); a struct tensor is a view, never a copy.
 * Experts are reached only through expert_lookup (see forward.h) so that the elastic
 * expert cache can sit in between. */
#ifndef TIDE_MODEL_H
#define TIDE_MODEL_H

#include "gguf.h"

/* A 1-D or 2-D view. For a matrix, ne[0] = columns (input dim, contiguous), ne[1] = rows
 * (output dim); y = W x means y[r] = sum_c W[r][c] x[c]. */
struct tensor {
    uint32_t type;       /* enum ggml_type */
    uint64_t ne[2];
    const void *data;    /* NULL when absent */
    size_t row_bytes;    /* ggml_row_size(type, ne[0]) */
};

enum model_arch { ARCH_LLAMA, ARCH_QWEN3, ARCH_QWEN3MOE, ARCH_QWEN2MOE, ARCH_GPTOSS, ARCH_OLMOE, ARCH_GRANITEMOE,
                  ARCH_QWEN3VLMOE, ARCH_QWEN2VL,
                  ARCH_DEEPSEEK2 };
enum rope_kind { ROPE_NORM, ROPE_NEOX };  /* pairs (2i, 2i+1) vs (i, i + d/2) */
/* qwen3vlmoe and qwen2vl text on CUDA devices: written (text rows take plain rope, image rows
 * cuda/mrope.cu) but not yet run on a GPU (test-gpu e2e_qwen3vlmoe, e2e_qwen2vl,
 * e2e_mrope_*): while 0, session.c refuses a CUDA device for them at start-up. Images on CUDA
 * have their own switch, VISION_QWENVL_ON_CUDA (vision/vision.h). */
#define MODEL_QWENVL_TEXT_ON_CUDA 0

struct model_config {
    enum model_arch arch;
    uint32_t n_vocab;
    uint32_t n_embd;
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;        /* key_length (default n_embd / n_head) */
    uint32_t n_ff;            /* dense FFN width (0 for MoE) */
    uint32_t n_ff_exp;        /* expert FFN width (0 for dense) */
    uint32_t n_ff_shexp;      /* the shared expert's FFN width (qwen2moe; 0: none) */
    uint32_t n_expert;        /* 0 for dense */
    uint32_t n_expert_used;
    bool expert_weights_norm; /* renormalise the top-k softmax weights to sum 1 */
    float rope_theta;
    float rms_eps;
    enum rope_kind rope;
    uint32_t n_ctx_train;
    uint32_t n_swa;           /* gpt-oss: the sliding window (keys a query sees, itself included) */
    uint32_t swa_period;      /* gpt-oss: layer l is windowed when l % period < period - 1 (0: all) */
    float rope_mscale;        /* rope scaling (gpt-oss's yarn): q and k scaled by this after the rotation */
    /* granitemoe's scalars (1 where the file has none, and for every other architecture):
     * the token embeddings are multiplied by embedding_scale; each block's attention output
     * and FFN output by residual_scale before the residual add; the attention's q.k by
     * attention_scale instead of 1/sqrt(head_dim) (0: the usual); the logits divided by
     * logit_scale (folded into output_norm at load: the output product is linear). */
    float embedding_scale, residual_scale, attention_scale, logit_scale;
    /* qwen3vlmoe, qwen2vl: M-RoPE's pairs per section (time, height, width, extra; see
     * mrope.h), interleaved (qwen3vlmoe) or one after the other (qwen2vl); qwen3vlmoe: how many
     * first layers add a deepstack feature of an image token to their output; zeros elsewhere */
    uint32_t rope_sections[4];
    bool rope_sections_interleaved;
    uint32_t n_deepstack;
    /* deepseek2's multi-head latent attention, run as multi-query attention over the
     * compressed KV (forward_mla.c): one KV head of head_dim = kv_lora_rank + n_rot, each q head
     * as wide; q's own heads before the absorption are mla_k wide (mla_k - n_rot unroped, then
     * n_rot roped), v heads mla_v wide. The first n_dense_lead layers have a dense FFN of n_ff.
     * mla_kq_mscale: q.k is multiplied by mla_kq_mscale^2 / sqrt(mla_k) (llama.cpp's yarn
     * attention-scale correction). Zeros for every other architecture (n_rot: head_dim). */
    uint32_t n_rot, kv_lora_rank, mla_k, mla_v, n_dense_lead;
    float mla_kq_mscale;
};

struct model_layer {
    struct tensor attn_norm;     /* (n_embd) */
    struct tensor wq;            /* (n_embd -> n_head*head_dim) */
    struct tensor wk;            /* (n_embd -> n_head_kv*head_dim) */
    struct tensor wv;            /* (n_embd -> n_head_kv*head_dim) */
    struct tensor wo;            /* (n_head*head_dim -> n_embd) */
    struct tensor bq, bk, bv;    /* f32 biases of wq, wk, wv (qwen2moe; data NULL when absent) */
    struct tensor q_norm;        /* (head_dim) qwen3; (n_head*head_dim) olmoe: one norm over all heads */
    struct tensor k_norm;        /* (head_dim) qwen3; (n_head_kv*head_dim) olmoe */
    struct tensor ffn_norm;      /* (n_embd) */
    /* dense */
    struct tensor ffn_gate;      /* (n_embd -> n_ff) */
    struct tensor ffn_up;        /* (n_embd -> n_ff) */
    struct tensor ffn_down;      /* (n_ff -> n_embd) */
    /* MoE */
    struct tensor ffn_gate_inp;  /* router (n_embd -> n_expert) */
    const struct gguf_tensor *gate_exps; /* (n_embd, n_ff_exp, n_expert) in host RAM */
    const struct gguf_tensor *up_exps;   /* (n_embd, n_ff_exp, n_expert) */
    const struct gguf_tensor *down_exps; /* (n_ff_exp, n_embd, n_expert) */
    /* qwen2moe's shared expert: x += sigmoid(gate_inp_shexp . xn) * down(silu(gate xn) * up xn) */
    struct tensor ffn_gate_inp_shexp; /* (n_embd -> 1) */
    struct tensor ffn_gate_shexp;     /* (n_embd -> n_ff_shexp) */
    struct tensor ffn_up_shexp;       /* (n_embd -> n_ff_shexp) */
    struct tensor ffn_down_shexp;     /* (n_ff_shexp -> n_embd) */
    /* gpt-oss: f32 biases of wo, the router and each expert (row e: expert e's), the
     * attention sinks (one logit per head); data NULL when absent */
    struct tensor bo;            /* (n_embd) */
    struct tensor attn_sinks;    /* (n_head) */
    struct tensor ffn_gate_inp_b; /* (n_expert) */
    struct tensor gate_exps_b;   /* (n_ff_exp, n_expert) */
    struct tensor up_exps_b;     /* (n_ff_exp, n_expert) */
    struct tensor down_exps_b;   /* (n_embd, n_expert) */
    /* deepseek2 (MLA): the compressed KV and the roped key part from one product, its norm
     * over the first kv_lora_rank, and the per-head k and v expansions, H heads stacked:
     * wk_b (mla_k - n_rot -> kv_lora_rank) per head, as (mla_k - n_rot, kv_lora_rank * H);
     * wv_b (kv_lora_rank -> mla_v) per head, as (kv_lora_rank, mla_v * H) */
    struct tensor wkv_a_mqa;     /* (n_embd -> kv_lora_rank + n_rot) */
    struct tensor kv_a_norm;     /* (kv_lora_rank) */
    struct tensor wk_b, wv_b;
    void *exps_pinned[3];        /* page-locked copies of gate/up/down_exps, or NULL (the mapping) */
};

/* One expert of one layer: the unit the expert cache moves around. */
struct expert_weights {
    struct tensor gate;  /* (n_embd -> n_ff_exp) */
    struct tensor up;    /* (n_embd -> n_ff_exp) */
    struct tensor down;  /* (n_ff_exp -> n_embd) */
};

struct model {
    struct model_config cfg;
    struct gguf_file gguf;       /* owned: the mapping the tensors point into */
    struct tensor tok_embd;      /* (n_embd, n_vocab): row t is token t's embedding */
    struct tensor output_norm;   /* (n_embd) */
    struct tensor output;        /* (n_embd -> n_vocab); tied to tok_embd when absent */
    struct model_layer *layers;  /* (n_layer) owned */
    char *name;                  /* general.name or the file's base name, owned */
    /* rope scaling (yarn or linear, gpt-oss only): each pair's frequency, head_dim / 2 of them,
     * owned; NULL: plain rope at rope_theta */
    float *rope_freqs;
    float *output_norm_owned;    /* granitemoe: output_norm / logit_scale (f32, output_norm's data), or NULL */
};

int model_load(struct model *m, const char *path, char *err, size_t errlen);
/* The attention window of layer l: 0 for full causal attention, else the number of most
 * recent positions (the query's own included) a query attends to (gpt-oss's sliding layers). */
int model_layer_window(const struct model_config *c, uint32_t l);
void model_free(struct model *m);
const char *model_arch_name(enum model_arch a);
/* Views of expert e of layer l straight in host RAM (the GGUF mapping). */
void model_expert_host(const struct model *m, uint32_t l, uint32_t e, struct expert_weights *out);
/* The type of the first tensor stored as type a or b, or UINT32_MAX when there is none. */
uint32_t model_first_type_of(const struct model *m, uint32_t a, uint32_t b);
/* The type of the first tensor in a type only the CPU backend runs (a k-quant, q5_0, q5_1,
 * iq4_xs, MXFP4: CUDA runs f32, f16, bf16, q8_0 and q4_0), or UINT32_MAX when there is none. */
uint32_t model_first_cpu_only_type(const struct model *m);

/* Copy every layer's experts into page-locked host memory from alloc (CUDA uploads from it
 * asynchronously at full bus speed); model_expert_host then points there. */
int model_pin_experts(struct model *m, void *(*alloc)(size_t), void (*release)(void *));
void model_unpin_experts(struct model *m, void (*release)(void *));
/* Bytes of one expert (gate + up + down) of layer l. */
size_t model_expert_bytes(const struct model *m, uint32_t l);

#endif
