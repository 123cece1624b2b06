/* forward.h - one model's forward pass over the backend, with its KV cache.
 *
 * forward_eval() runs n tokens at positions pos..pos+n-1 (prefill, or n = 1 for decode)
 * and writes the logits of the last one. Experts are fetched through the lookup hook, so
 * the expert cache decides where an expert's weights come from; by default they come
 * straight from host RAM. */
#ifndef TIDE_FORWARD_H
#define TIDE_FORWARD_H

#include "backend.h"

typedef int (*expert_lookup_fn)(void *ctx, uint32_t layer, uint32_t expert,
                                struct expert_weights *out);

struct forward_state {
    const struct model *m;
    struct backend be;
    int n_ctx;
    float *k_cache;     /* (n_layer, n_ctx, n_head_kv*head_dim) */
    float *v_cache;     /* (n_layer, n_ctx, n_head_kv*head_dim) */
    float *x, *xb, *xb2;            /* (n_embd) activations */
    float *q, *k, *v, *att_out;     /* (n_head*head_dim), (kv_dim), (kv_dim), (n_head*head_dim) */
    float *att;         /* (n_head, n_ctx) */
    float *hb, *hb2;    /* (max(n_ff, n_ff_exp)) */
    float *router;      /* (n_expert) */
    float *moe_out;     /* (n_embd) */
    /* batch buffers: x, xb, xb2, q, att_out, hb, hb2, router and moe_out above hold
     * max_batch vectors each (one after another) so prefill runs batched matmuls */
    int max_batch;
    float *moe_in;      /* (max_batch, n_embd) tokens routed to one expert, gathered */
    int *moe_sel;       /* (max_batch, n_expert_used) chosen experts per token */
    float *moe_w;       /* (max_batch, n_expert_used) their weights */
    float *logits;      /* (n_vocab) */
    expert_lookup_fn expert_lookup;
    void *expert_lookup_ctx;
    /* counters */
    uint64_t n_expert_calls;
};

int forward_init(struct forward_state *s, const struct model *m, struct backend be, int n_ctx);
void forward_free(struct forward_state *s);
/* Returns 0 and s->logits filled for the last token, or a negative code.
 * pos + n must be <= n_ctx. */
int forward_eval(struct forward_state *s, const int *tokens, int n, int pos);
/* KV bytes for n_ctx positions. */
size_t forward_kv_bytes(const struct model *m, int n_ctx);

#endif
