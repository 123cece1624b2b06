/* forward_arch.c - the few ops by which olmoe and granitemoe differ from the llama-style layer,
 * called from forward_eval.c's stage_layers at fixed points.
 *
 * Everything here is made of backend ops every backend has (rmsnorm, zero, axpy, matmul,
 * add_bias), so the CUDA backend runs these architectures with no kernel of their own and a
 * decode step stays recordable. A multiplication by a scalar is written zero(dst) then
 * axpy(dst, src, a): 0 + a * x is a * x exactly, so it has the bits of a scale op. It needs a
 * second buffer, and each buffer used as scratch here is one the layer has no live values in
 * at that point (said at each function).
 *
 * olmoe: q and k are each rmsnormed over their whole width (one norm over all heads, weights
 * n_head * head_dim and n_head_kv * head_dim wide), after the products and before the rope.
 * granitemoe: four scalars from the file (model_config): the embeddings times embedding_scale,
 * q.k times attention_scale instead of 1/sqrt(head_dim) (q is multiplied by attention_scale *
 * sqrt(head_dim) before the rope, which is linear), each block's output times residual_scale
 * before its residual add, and the logits over logit_scale (folded into output_norm at load,
 * model.c). */
#include "forward.h"
#include "forward_internal.h"

#include <math.h>

/* dst[0..n) = a * src[0..n) with existing ops (dst and src distinct). */
static void scale_into(const struct backend_i *B, void *bc, float *dst, const float *src, float a, int n)
{
    B->zero(bc, dst, n);
    B->axpy(bc, dst, src, a, n);
}

void forward_arch_embed(const struct model_config *c, struct forward_stage *st, int n)
{
    if (c->embedding_scale == 1.0f)
        return;
    /* xb: the layer's normed input, not computed yet */
    int len = n * (int)c->n_embd;
    scale_into(st->be.i, st->be.ctx, st->xb, st->x, c->embedding_scale, len);
    scale_into(st->be.i, st->be.ctx, st->x, st->xb, 1.0f, len);
}

void forward_arch_qk(const struct model_config *c, struct forward_stage *st, const struct model_layer *L, float *k,
                     int n)
{
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int qd = (int)(c->n_head * c->head_dim), kvd = (int)(c->n_head_kv * c->head_dim);
    if (c->arch == ARCH_OLMOE) { /* in place, as qwen3's per-head norms are */
        B->rmsnorm(bc, st->q, &L->q_norm, st->q, qd, n, c->rms_eps);
        B->rmsnorm(bc, k, &L->k_norm, k, kvd, n, c->rms_eps);
    }
    if (c->attention_scale != 0.0f) {
        /* the attention divides q.k by sqrt(head_dim): q times scale * sqrt(head_dim) gives
         * q.k times scale. att_out: the attention's output, not written yet */
        float a = c->attention_scale * sqrtf((float)c->head_dim);
        scale_into(B, bc, st->att_out, st->q, a, n * qd);
        scale_into(B, bc, st->q, st->att_out, 1.0f, n * qd);
    }
}

void forward_arch_attn_residual(const struct model_config *c, struct forward_stage *st, const struct model_layer *L,
                                int n)
{
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int E = (int)c->n_embd;
    B->matmul(bc, &L->wo, st->att_out, st->xb2, n); /* (n, E); xb2 is free scratch here */
    if (L->bo.data)
        B->add_bias(bc, st->xb2, L->bo.data, n, E);
    B->axpy(bc, st->x, st->xb2, c->residual_scale, n * E);
}

void forward_arch_ffn_begin(const struct model_config *c, struct forward_stage *st, int n)
{
    if (c->residual_scale == 1.0f)
        return;
    /* the FFN adds into x (the fused MoE forms add there themselves): keep the residual in
     * att_out (consumed by wo already; n_head * head_dim >= n_embd, checked at load) and
     * let the FFN add into zeros */
    int len = n * (int)c->n_embd;
    scale_into(st->be.i, st->be.ctx, st->att_out, st->x, 1.0f, len);
    st->be.i->zero(st->be.ctx, st->x, len);
}

void forward_arch_ffn_end(const struct model_config *c, struct forward_stage *st, int n)
{
    if (c->residual_scale == 1.0f)
        return;
    int len = n * (int)c->n_embd;
    st->be.i->axpy(st->be.ctx, st->att_out, st->x, c->residual_scale, len); /* residual + scale * FFN */
    scale_into(st->be.i, st->be.ctx, st->x, st->att_out, 1.0f, len);
}
