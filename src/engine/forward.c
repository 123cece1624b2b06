/* forward.c - the transformer forward pass over the backend vtable, with an f32 KV cache.
 *
 * Prompts are processed in chunks of up to max_batch tokens: every matmul of a layer runs
 * once for the whole chunk, so each weight row is read once per chunk rather than once
 * per token. Attention stays per token (each has its own causal window). MoE tokens are
 * grouped by expert so each chosen expert is fetched and multiplied once per chunk. */
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FWD_MAX_BATCH 64

static int host_lookup(void *ctx, uint32_t layer, uint32_t expert, struct expert_weights *out)
{
    model_expert_host(ctx, layer, expert, out);
    return 0;
}

size_t forward_kv_bytes(const struct model *m, int n_ctx)
{
    size_t kvd = (size_t)m->cfg.n_head_kv * m->cfg.head_dim;
    return 2 * (size_t)m->cfg.n_layer * (size_t)n_ctx * kvd * sizeof(float);
}

int forward_init(struct forward_state *s, const struct model *m, struct backend be, int n_ctx)
{
    memset(s, 0, sizeof(*s));
    if (n_ctx <= 0)
        return TIDE_EINVAL;
    const struct model_config *c = &m->cfg;
    s->m = m;
    s->be = be;
    s->n_ctx = n_ctx;
    s->max_batch = FWD_MAX_BATCH;
    s->expert_lookup = host_lookup;
    s->expert_lookup_ctx = (void *)m;
    size_t B = (size_t)s->max_batch, E = c->n_embd;
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_head_kv * c->head_dim;
    size_t ff = c->n_ff > c->n_ff_exp ? c->n_ff : c->n_ff_exp;
    size_t ne = c->n_expert ? c->n_expert : 1, nu = c->n_expert_used ? c->n_expert_used : 1;
    void *(*al)(void *, size_t) = be.i->alloc;
    size_t kvh = forward_kv_bytes(m, n_ctx) / 2;
    s->k_cache = al(be.ctx, kvh);
    s->v_cache = al(be.ctx, kvh);
    s->x = al(be.ctx, B * E * sizeof(float));
    s->xb = al(be.ctx, B * E * sizeof(float));
    s->xb2 = al(be.ctx, B * E * sizeof(float));
    s->q = al(be.ctx, B * qd * sizeof(float));
    s->k = al(be.ctx, kvd * sizeof(float)); /* unused by the batched path; kept for API */
    s->v = al(be.ctx, kvd * sizeof(float));
    s->att_out = al(be.ctx, B * qd * sizeof(float));
    s->att = al(be.ctx, (size_t)c->n_head * n_ctx * sizeof(float));
    s->hb = al(be.ctx, B * ff * sizeof(float));
    s->hb2 = al(be.ctx, B * ff * sizeof(float));
    s->router = al(be.ctx, B * ne * sizeof(float));
    s->moe_out = al(be.ctx, B * E * sizeof(float));
    s->moe_in = al(be.ctx, B * E * sizeof(float));
    s->logits = al(be.ctx, (size_t)c->n_vocab * sizeof(float));
    s->moe_sel = malloc(B * nu * sizeof(int));
    s->moe_w = malloc(B * nu * sizeof(float));
    if (!s->k_cache || !s->v_cache || !s->x || !s->xb || !s->xb2 || !s->q || !s->k ||
        !s->v || !s->att_out || !s->att || !s->hb || !s->hb2 || !s->router ||
        !s->moe_out || !s->moe_in || !s->logits || !s->moe_sel || !s->moe_w) {
        forward_free(s);
        return TIDE_ENOMEM;
    }
    return 0;
}

void forward_free(struct forward_state *s)
{
    if (!s->be.i)
        return;
    void (*fr)(void *, void *) = s->be.i->free;
    void *ctx = s->be.ctx;
    float *bufs[] = {s->k_cache, s->v_cache, s->x, s->xb, s->xb2, s->q, s->k, s->v,
                     s->att_out, s->att, s->hb, s->hb2, s->router, s->moe_out,
                     s->moe_in, s->logits};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            fr(ctx, bufs[i]);
    free(s->moe_sel);
    free(s->moe_w);
    memset(s, 0, sizeof(*s));
}

/* Pick the top-k experts of one token's router logits (ties -> lower index) and their
 * weights per the arch rule: softmax over all experts, keep the top k, optionally
 * renormalise (which equals Mixtral's softmax over the k selected logits). */
static void route(const struct model_config *c, const float *logits, int *sel, float *w)
{
    int k = (int)c->n_expert_used, ne = (int)c->n_expert;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < ne; e++) {
            bool used = false;
            for (int t = 0; t < j; t++)
                if (sel[t] == e) { used = true; break; }
            if (!used && (best < 0 || logits[e] > logits[best]))
                best = e;
        }
        sel[j] = best;
    }
    float mx = logits[sel[0]]; /* the max of all logits */
    double all = 0.0, top = 0.0;
    for (int e = 0; e < ne; e++)
        all += exp((double)logits[e] - mx);
    for (int j = 0; j < k; j++) {
        w[j] = (float)exp((double)logits[sel[j]] - mx);
        top += w[j];
    }
    double z = c->expert_weights_norm ? top : all;
    for (int j = 0; j < k; j++)
        w[j] = (float)(w[j] / z);
}

/* MoE FFN for n tokens: xb (n, E) normed input -> moe_out (n, E). */
static int moe_ffn(struct forward_state *s, uint32_t l, int n)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = s->be.i;
    void *bc = s->be.ctx;
    int E = (int)c->n_embd, F = (int)c->n_ff_exp, k = (int)c->n_expert_used;
    const struct model_layer *L = &s->m->layers[l];

    B->matmul(bc, &L->ffn_gate_inp, s->xb, s->router, n); /* (n, n_expert) */
    for (int t = 0; t < n; t++)
        route(c, s->router + (size_t)t * c->n_expert, s->moe_sel + t * k, s->moe_w + t * k);
    memset(s->moe_out, 0, sizeof(float) * (size_t)n * E);

    int tok[FWD_MAX_BATCH];   /* tokens routed to expert e */
    float wt[FWD_MAX_BATCH];  /* their weights for e */
    for (uint32_t e = 0; e < c->n_expert; e++) {
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (s->moe_sel[t * k + j] == (int)e) {
                    tok[cnt] = t;
                    wt[cnt] = s->moe_w[t * k + j];
                    cnt++;
                }
        if (!cnt)
            continue;
        struct expert_weights ew;
        int rc = s->expert_lookup(s->expert_lookup_ctx, l, e, &ew);
        if (rc < 0)
            return rc;
        s->n_expert_calls++;
        for (int i = 0; i < cnt; i++) /* gather (cnt, E) */
            memcpy(s->moe_in + (size_t)i * E, s->xb + (size_t)tok[i] * E, sizeof(float) * E);
        B->matmul(bc, &ew.gate, s->moe_in, s->hb, cnt);   /* (cnt, F) */
        B->matmul(bc, &ew.up, s->moe_in, s->hb2, cnt);    /* (cnt, F) */
        B->swiglu(bc, s->hb, s->hb2, cnt * F);
        B->matmul(bc, &ew.down, s->hb, s->xb2, cnt);      /* (cnt, E) */
        for (int i = 0; i < cnt; i++)
            B->axpy(bc, s->moe_out + (size_t)tok[i] * E, s->xb2 + (size_t)i * E, wt[i], E);
    }
    return 0;
}

/* n <= max_batch tokens at positions pos.. */
static int eval_chunk(struct forward_state *s, const int *tokens, int n, int pos, bool last)
{
    const struct model *m = s->m;
    const struct model_config *c = &m->cfg;
    const struct backend_i *B = s->be.i;
    void *bc = s->be.ctx;
    int E = (int)c->n_embd, hd = (int)c->head_dim;
    int qd = (int)c->n_head * hd, kvd = (int)c->n_head_kv * hd;

    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= c->n_vocab)
            return TIDE_EINVAL;
        B->get_row(bc, &m->tok_embd, tokens[t], s->x + (size_t)t * E); /* x (n, E) */
    }
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        /* this layer's cache rows; k/v matmuls write straight into them */
        float *kc = s->k_cache + (size_t)l * s->n_ctx * kvd;
        float *vc = s->v_cache + (size_t)l * s->n_ctx * kvd;
        float *kpos = kc + (size_t)pos * kvd, *vpos = vc + (size_t)pos * kvd;

        B->rmsnorm(bc, s->x, &L->attn_norm, s->xb, E, n, c->rms_eps);
        B->matmul(bc, &L->wq, s->xb, s->q, n);  /* (n, qd) */
        B->matmul(bc, &L->wk, s->xb, kpos, n);  /* (n, kvd) */
        B->matmul(bc, &L->wv, s->xb, vpos, n);  /* (n, kvd) */
        if (L->q_norm.data) /* qwen3: rmsnorm each head before rope */
            B->rmsnorm(bc, s->q, &L->q_norm, s->q, hd, n * (int)c->n_head, c->rms_eps);
        if (L->k_norm.data)
            B->rmsnorm(bc, kpos, &L->k_norm, kpos, hd, n * (int)c->n_head_kv, c->rms_eps);
        for (int t = 0; t < n; t++) {
            B->rope(bc, s->q + (size_t)t * qd, (int)c->n_head, hd, pos + t, c->rope_theta,
                    c->rope);
            B->rope(bc, kpos + (size_t)t * kvd, (int)c->n_head_kv, hd, pos + t,
                    c->rope_theta, c->rope);
        }
        for (int t = 0; t < n; t++)
            B->attention(bc, s->q + (size_t)t * qd, kc, vc, s->att_out + (size_t)t * qd,
                         s->att, pos + t, (int)c->n_head, (int)c->n_head_kv, hd);
        B->matmul(bc, &L->wo, s->att_out, s->xb2, n); /* (n, E) */
        B->axpy(bc, s->x, s->xb2, 1.0f, n * E);

        B->rmsnorm(bc, s->x, &L->ffn_norm, s->xb, E, n, c->rms_eps);
        if (c->n_expert) {
            int rc = moe_ffn(s, l, n);
            if (rc < 0)
                return rc;
            B->axpy(bc, s->x, s->moe_out, 1.0f, n * E);
        } else {
            int F = (int)c->n_ff;
            B->matmul(bc, &L->ffn_gate, s->xb, s->hb, n); /* (n, F) */
            B->matmul(bc, &L->ffn_up, s->xb, s->hb2, n);
            B->swiglu(bc, s->hb, s->hb2, n * F);
            B->matmul(bc, &L->ffn_down, s->hb, s->xb2, n); /* (n, E) */
            B->axpy(bc, s->x, s->xb2, 1.0f, n * E);
        }
    }
    if (last) {
        const float *xl = s->x + (size_t)(n - 1) * E;
        B->rmsnorm(bc, xl, &m->output_norm, s->xb, E, 1, c->rms_eps);
        B->matmul(bc, &m->output, s->xb, s->logits, 1);
    }
    return 0;
}

int forward_eval(struct forward_state *s, const int *tokens, int n, int pos)
{
    if (n <= 0 || pos < 0 || pos + n > s->n_ctx)
        return TIDE_ERANGE;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->max_batch ? n - done : s->max_batch;
        int rc = eval_chunk(s, tokens + done, chunk, pos + done, done + chunk == n);
        if (rc < 0)
            return rc;
        done += chunk;
    }
    return 0;
}
