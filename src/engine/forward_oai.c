/* forward_oai.c - gpt-oss's MoE FFN for the forward pass (forward_eval.c calls it in place of
 * its moe_ffn for that architecture).
 *
 * gpt-oss differs from the Mixtral-style MoE in three ways, none of which the fused MoE ops
 * know, so its experts always run op by op here: the router has a bias; each expert's gate,
 * up and down products have a bias (row e of the layer's resident bias tensors: they are small,
 * so they stay with the layer, not in the expert cache); and the activation is the clamped
 * SwiGLU (backend_i.swiglu_oai). The weights are the softmax over the chosen experts' logits,
 * which is route()'s renormalised top-k. Experts are still looked up in the expert cache, one
 * lookup per expert a chunk. */
#include "forward.h"
#include "forward_internal.h"
#include "memory/expert_cache.h"

#include <string.h>

/* gpt-oss's SwiGLU constants (the same in every released model; llama.cpp fixes them too) */
#define OAI_SWIGLU_ALPHA 1.702f
#define OAI_SWIGLU_LIMIT 7.0f

/* Row e of a per-expert bias tensor (n, n_expert) in the stage's memory. */
static const float *bias_row(const struct tensor *b, uint32_t e)
{
    return (const float *)((const char *)b->data + (size_t)e * b->row_bytes);
}

int forward_oai_moe_ffn(struct forward_state *s, struct forward_stage *st, uint32_t l, int n, bool have_logits)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int E = (int)c->n_embd, F = (int)c->n_ff_exp, k = (int)c->n_expert_used, ne = (int)c->n_expert;
    const struct model_layer *L = &st->layers[l - st->l0];
    if (!B->swiglu_oai)
        return TIDE_EUNSUPPORTED;
    if (!have_logits)
        B->matmul(bc, &L->ffn_gate_inp, st->xb, st->router, n); /* (n, n_expert) */
    B->add_bias(bc, st->router, L->ffn_gate_inp_b.data, n, ne);
    B->route(bc, st->router, n, ne, k, true, st->route);
    B->download(bc, s->host_route, st->route, sizeof(int32_t) * 2 * (size_t)n * k);
    const int32_t *sel = s->host_route;
    const float *w = (const float *)(s->host_route + (size_t)n * k);
    /* each expert's (token, weight) pairs, experts ascending (a counting sort) */
    int *off = s->moe_off;
    memset(off, 0, sizeof(int) * (size_t)(ne + 1));
    for (int i = 0; i < n * k; i++)
        off[sel[i] + 1]++;
    for (int e = 0; e < ne; e++)
        off[e + 1] += off[e];
    for (int i = 0; i < n * k; i++) {
        int p = off[sel[i]]++;
        s->moe_tok[p] = i / k;
        s->moe_tokw[p] = w[i];
    }
    for (int e = ne; e > 0; e--)
        off[e] = off[e - 1];
    off[0] = 0;
    B->zero(bc, st->moe_out, n * E);
    for (int e = 0; e < ne; e++) {
        int cnt = off[e + 1] - off[e];
        if (!cnt)
            continue;
        struct expert_weights ew;
        int rc = 0;
        if (st->cache)
            rc = expert_cache_lookup(st->cache, l, (uint32_t)e, &ew);
        else
            model_expert_host(s->m, l, (uint32_t)e, &ew);
        if (rc < 0)
            return rc;
        s->n_expert_calls++;
        const int *tok = s->moe_tok + off[e];
        B->gather_rows(bc, st->moe_in, st->xb, tok, cnt, E); /* (cnt, E) */
        B->matmul(bc, &ew.gate, st->moe_in, st->hb, cnt);   /* (cnt, F) */
        B->add_bias(bc, st->hb, bias_row(&L->gate_exps_b, (uint32_t)e), cnt, F);
        B->matmul(bc, &ew.up, st->moe_in, st->hb2, cnt);    /* (cnt, F) */
        B->add_bias(bc, st->hb2, bias_row(&L->up_exps_b, (uint32_t)e), cnt, F);
        B->swiglu_oai(bc, st->hb, st->hb2, cnt * F, OAI_SWIGLU_ALPHA, OAI_SWIGLU_LIMIT);
        B->matmul(bc, &ew.down, st->hb, st->xb2, cnt);      /* (cnt, E) */
        B->add_bias(bc, st->xb2, bias_row(&L->down_exps_b, (uint32_t)e), cnt, E);
        B->scatter_axpy(bc, st->moe_out, st->xb2, tok, s->moe_tokw + off[e], cnt, E);
    }
    return 0;
}
