/* forward_mla.c - deepseek2's multi-head latent attention (MLA) for the forward pass, called by
 * forward_eval.c's stage_layers in place of the q/k/v products, rope and attention of the
 * llama-style layer.
 *
 * MLA runs here as multi-query attention over the compressed KV, as llama.cpp's absorbed form
 * does: one KV head of width kv_lora_rank + n_rot per token (head_dim), the first kv_lora_rank
 * the rmsnormed latent, the last n_rot the roped key part shared by every head. V is the same
 * rows: the attention op is given the K cache as its V cache (forward.c allocates no V cache
 * for MLA), and the last n_rot values of each head's output (the roped part's weighted sum) are
 * ignored. Each q head is absorbed into the latent space: q_nope (mla_k
 * - n_rot) times the head's attn_k_b gives kv_lora_rank values, followed by the head's roped
 * q_pe. After the attention, each head's first kv_lora_rank outputs times its attn_v_b give its
 * mla_v values, and attn_output takes the H * mla_v of them.
 *
 * Rope: NORM pairs through the rope table (model.rope_freqs, n_rot / 2 frequencies; yarn where
 * the file has it). The attention op divides q.k by sqrt(head_dim); MLA wants mla_kq_mscale^2 /
 * sqrt(mla_k), so q is multiplied by the ratio first.
 *
 * Everything is made of backend ops, token by token and head by head for the per-head
 * products: correct, not fast. Both backends have them (CUDA: rope_freqs and the wide rows'
 * attention in cuda/oai_ops.cu; test-gpu e2e_deepseek2, batch_deepseek2). */
#include "forward.h"
#include "forward_internal.h"

#include <math.h>

/* Head h's rows of a per-head stack (ne0, rows * H): a (ne0, rows) matrix. */
static struct tensor head_view(const struct tensor *w, int rows, int h)
{
    struct tensor v = *w;
    v.ne[1] = (uint64_t)rows;
    v.data = (const uint8_t *)w->data + (size_t)h * rows * w->row_bytes;
    return v;
}

int forward_mla_attention(struct forward_state *s, struct forward_stage *st, const struct model_layer *L, int n,
                          const struct mla_run *runs, int nr)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    if (!B->rope_freqs || !s->m->rope_freqs)
        return TIDE_EUNSUPPORTED;
    int E = (int)c->n_embd, H = (int)c->n_head, hd = (int)c->head_dim, kvl = (int)c->kv_lora_rank;
    int rot = (int)c->n_rot, mk = (int)c->mla_k, nope = mk - rot, mv = (int)c->mla_v, qd = H * hd;
    float eps = c->rms_eps;
    B->rmsnorm(bc, st->x, &L->attn_norm, st->xb, E, n, eps);
    float *qf = st->att_out; /* q before the absorption (n, H * mla_k): att_out is not written yet */
    B->matmul(bc, &L->wq, st->xb, qf, n);
    for (int r = 0; r < nr; r++) {
        const struct mla_run *R = &runs[r];
        float *k = R->kc + (size_t)R->pos * hd; /* the run's new K rows, straight into its slot */
        B->matmul(bc, &L->wkv_a_mqa, st->xb + (size_t)R->t0 * E, k, R->n);
        for (int t = 0; t < R->n; t++) {
            float *kt = k + (size_t)t * hd;
            B->rmsnorm(bc, kt, &L->kv_a_norm, kt, kvl, 1, eps);
            B->rope_freqs(bc, kt + kvl, 1, 1, rot, R->pos + t, s->m->rope_freqs, c->rope_mscale, ROPE_NORM);
            for (int h = 0; h < H; h++) {
                const float *src = qf + ((size_t)(R->t0 + t) * H + h) * mk;
                float *dst = st->q + ((size_t)(R->t0 + t) * H + h) * hd;
                struct tensor kb = head_view(&L->wk_b, kvl, h);
                B->matmul(bc, &kb, src, dst, 1);                     /* the absorbed q_nope */
                B->gather_rows(bc, dst + kvl, src + nope, s->iota, 1, rot); /* q_pe */
                B->rope_freqs(bc, dst + kvl, 1, 1, rot, R->pos + t, s->m->rope_freqs, c->rope_mscale, ROPE_NORM);
            }
        }
    }
    /* q times mla_kq_mscale^2 * sqrt(head_dim / mla_k) (zero + axpy: a scale op's bits);
     * att_out's q before the absorption is consumed by now */
    float a = c->mla_kq_mscale * c->mla_kq_mscale * sqrtf((float)hd / (float)mk);
    B->zero(bc, st->att_out, n * qd);
    B->axpy(bc, st->att_out, st->q, a, n * qd);
    B->zero(bc, st->q, n * qd);
    B->axpy(bc, st->q, st->att_out, 1.0f, n * qd);
    /* rows wider than 256 (V2-Lite's 576) take the sink attention without sinks or window, the
     * same softmax: CUDA's attention kernel stops at head_dim 256, its sink kernel does not */
    bool wide = hd > 256 && B->attention_sinks;
    for (int r = 0; r < nr; r++) {
        const struct mla_run *R = &runs[r];
        float *q = st->q + (size_t)R->t0 * qd, *o = st->att_out + (size_t)R->t0 * qd;
        if (wide) /* V: the K rows, whose first kv_lora_rank are the latent */
            B->attention_sinks(bc, q, R->kc, R->kc, false, NULL, 0, o, st->att, R->n, R->pos, H, 1, hd, NULL, 0);
        else
            B->attention(bc, q, R->kc, R->kc, o, st->att, R->n, R->pos, H, 1, hd);
    }
    /* each head's latent output through its attn_v_b into q (n, H * mla_v; free now, and
     * mla_v <= head_dim, checked at load), then x += wo of it */
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            struct tensor vb = head_view(&L->wv_b, mv, h);
            B->matmul(bc, &vb, st->att_out + ((size_t)i * H + h) * hd, st->q + ((size_t)i * H + h) * mv, 1);
        }
    B->matmul(bc, &L->wo, st->q, st->xb2, n);
    B->axpy(bc, st->x, st->xb2, 1.0f, n * E);
    return 0;
}
