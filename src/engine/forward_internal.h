/* forward_internal.h - what forward.c (the stages and their buffers) gives forward_eval.c (the
 * pass itself). Not for other modules: they use forward.h. */
#ifndef TIDE_FORWARD_INTERNAL_H
#define TIDE_FORWARD_INTERNAL_H
#include "forward.h"

#define MOE_FUSED_MAX_K 16

/* K and V rows, or K only where V reads K's rows (deepseek2's MLA: forward_mla.c) */
static inline size_t kv_parts(const struct model *m) { return m->cfg.kv_lora_rank ? 1 : 2; }
static inline size_t kv_elem(enum kv_type kv) { return kv == KV_F16 ? sizeof(uint16_t) : sizeof(float); }

/* Bytes of one position of one layer's K (or V) in s's cache. */
static inline size_t kv_pos_bytes(const struct forward_state *s)
{
    return (size_t)s->m->cfg.n_head_kv * s->m->cfg.head_dim * kv_elem(s->kv_f16 ? KV_F16 : KV_F32);
}
/* Layer l's K (or V) cache in stage st: (kv.n_blocks, kv.block_rows, kvd) elements. */
static inline void *kv_layer(const struct forward_state *s, const struct forward_stage *st, void *cache, uint32_t l)
{
    return (uint8_t *)cache + (size_t)(l - st->l0) * s->kv.n_blocks * s->kv.block_rows * kv_pos_bytes(s);
}
/* Where slot's row p of layer l's K (or V) is: row p % block_rows of block table[p / block_rows]. */
static inline void *kv_row(const struct forward_state *s, const struct forward_stage *st, void *cache, uint32_t l,
                           int slot, int p)
{
    int br = s->kv.block_rows;
    size_t at = (size_t)kv_blocks_table(&s->kv, slot)[p / br] * br + (size_t)(p % br);
    return (uint8_t *)kv_layer(s, st, cache, l) + at * kv_pos_bytes(s);
}
/* Rows from p on that lie in one block, at most n. */
static inline int kv_run(const struct forward_state *s, int p, int n)
{
    int left = s->kv.block_rows - p % s->kv.block_rows;
    return n < left ? n : left;
} /* the most experts a token a fused MoE op takes */

/* Point every stage at buffers for a chunk of up to n tokens; returns the chunk size they
 * allow (n, fewer, or 1: see forward.c). forward_unbind_buffers returns to the decode set. */
int forward_bind_buffers(struct forward_state *s, int n);
void forward_unbind_buffers(struct forward_state *s);

/* A layer's MoE FFN for n tokens (forward_moe.c): xb (n, E) normed input -> moe_out (n, E),
 * returning 0; or, returning 1, already added into x (the fused decode forms); or a negative
 * code. have_logits: the router's product is in router already (norm_matmul). */
int forward_moe_ffn(struct forward_state *s, struct forward_stage *st, uint32_t l, int n, bool have_logits);
/* The resident shared expert for n tokens, after the routed ones (forward_moe.c): x (n, E) +=
 * [sigmoid gate] * down(silu(gate xb) * up xb). */
void forward_shared_expert_ffn(const struct backend_i *B, void *bc, const struct forward_stage *st,
                               const struct model_layer *L, int n);
/* A decode step's route() row for layer l and token i (i < n_seq) in st->route. */
int32_t *forward_layer_route(const struct forward_state *s, const struct forward_stage *st, uint32_t l, int i);

/* gpt-oss's MoE FFN for n tokens of layer l (forward_oai.c): xb (n, E) normed input ->
 * moe_out (n, E), router biased, expert biases and the clamped SwiGLU; have_logits: the
 * router's product is in router already. 0, or a negative code (TIDE_EUNSUPPORTED: the
 * backend lacks swiglu_oai). */
int forward_oai_moe_ffn(struct forward_state *s, struct forward_stage *st, uint32_t l, int n, bool have_logits);

/* deepseek2's attention block of one layer for n tokens (forward_mla.c): x (n, E) += the MLA
 * attention's output; the runs' new K rows (V reads them too) written into their slots.
 * TIDE_EUNSUPPORTED where the backend has no rope_freqs. */
struct mla_run {
    float *kc;      /* the run's slot: K rows (n_ctx, head_dim) */
    int pos, t0, n; /* rows t0.. of the step at positions pos.. */
};
int forward_mla_attention(struct forward_state *s, struct forward_stage *st, const struct model_layer *L, int n,
                          const struct mla_run *runs, int nr);

/* olmoe's and granitemoe's own steps (forward_arch.c), called by stage_layers; each does nothing
 * for an architecture without them. forward_arch_embed: x (n, E) times embedding_scale (stage 0,
 * before layer 0). forward_arch_qk: after the q/k/v products of n tokens (q in st->q, k the new
 * K rows), before the rope: olmoe's whole-width q and k norms, granite's attention scale.
 * forward_arch_attn_residual (only with residual_scale != 1): x += residual_scale * (wo att_out
 * + bo). forward_arch_ffn_begin / _end around the FFN (after its norm): x = x + residual_scale *
 * (what the FFN adds to x). */
void forward_arch_embed(const struct model_config *c, struct forward_stage *st, int n);
void forward_arch_qk(const struct model_config *c, struct forward_stage *st, const struct model_layer *L, float *k,
                     int n);
void forward_arch_attn_residual(const struct model_config *c, struct forward_stage *st, const struct model_layer *L,
                                int n);
void forward_arch_ffn_begin(const struct model_config *c, struct forward_stage *st, int n);
void forward_arch_ffn_end(const struct model_config *c, struct forward_stage *st, int n);

#endif
