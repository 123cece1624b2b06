/* forward_moe.c - a layer's mixture-of-experts FFN (the forward's part that meets the expert
 * cache): the router, top-k, then the chosen experts, in the fastest form the backend and the
 * cache allow: a decode step's experts from the cache's device table (no host round trip), a
 * decode token's k experts in one fused op, a prefill chunk's tokens grouped by expert, or
 * expert by expert through cache lookups. Every form sums a token's experts in ascending
 * expert order, so they agree with each other. And the resident shared expert (qwen2moe,
 * GraniteMoeShared). Called from forward_eval.c's stage_layers. */
#include "forward.h"
#include "forward_internal.h"
#include "memory/expert_cache.h"

#include <stdlib.h>
#include <string.h>

/* Decode: token i's k experts in the backend's fused op, in ascending expert order (the
 * order route() gives them and the per-expert loop below visits them, so the sum is the
 * same). Every view must stay valid until the op is queued: with fewer live cache slots than
 * k a lookup could evict an earlier one, so then (and for types the backend does not fuse)
 * TIDE_EUNSUPPORTED sends the caller to the per-expert path. A later token's lookups may
 * evict this one's experts: the refill is an upload, ordered after this op. */
static int moe_ffn_fused(struct forward_state *s, struct forward_stage *st, uint32_t l, int i)
{
    const struct model_config *c = &s->m->cfg;
    int k = (int)c->n_expert_used;
    struct expert_cache *ec = st->cache;
    if (k < 1 || k > MOE_FUSED_MAX_K || (ec && (ec->n_seg - ec->n_borrowed) * ec->slots_per_seg < k))
        return TIDE_EUNSUPPORTED;
    struct expert_weights ew[MOE_FUSED_MAX_K];
    /* ask first with the host views (same types and shapes), so that an unfused type is
     * looked up in the cache once, by the per-expert path, and the hit counts stay true */
    const int *sel = s->moe_sel + (size_t)i * k;
    const float *w = s->moe_w + (size_t)i * k;
    size_t E = c->n_embd;
    for (int j = 0; j < k; j++)
        model_expert_host(s->m, l, (uint32_t)sel[j], &ew[j]);
    int rc = st->be.i->moe_ffn(st->be.ctx, ew, w, k, NULL, NULL, NULL, NULL, NULL, false);
    if (rc < 0)
        return rc;
    for (int j = 0; j < k; j++) {
        if (ec) {
            rc = expert_cache_lookup(ec, l, (uint32_t)sel[j], &ew[j]);
            if (rc < 0)
                return rc;
        } else {
            model_expert_host(s->m, l, (uint32_t)sel[j], &ew[j]);
        }
    }
    /* the residual add fused in: x += the experts' sum */
    rc = st->be.i->moe_ffn(st->be.ctx, ew, w, k, st->xb + i * E, st->x + i * E, st->hb, st->hb2, st->xb2, true);
    if (rc == 0)
        s->n_expert_calls += k;
    return rc;
}

/* Prefill: the chunk's experts through the backend's grouped op (backend_i.moe_ffn_batch),
 * after moe_ffn's counting sort; the residual add fused in. A call needs all of its groups'
 * views valid at once, so the layer's used experts go in runs of at most as many as the
 * cache has live slots: within a run, LRU never evicts a slot that the same run looked up
 * (each lookup makes its slot the most recent; with at most `live` lookups some other slot
 * is always older), and a later run's misses are uploaded after the earlier runs' kernels
 * (upload is ordered after every op already queued). The grouped op's result does not
 * depend on how the groups are split into runs, so it does not depend on the cache size.
 * TIDE_EUNSUPPORTED (types the backend does not group, probed with host views before any
 * lookup, so the per-expert path's hit counts stay true): nothing done. */
static int moe_ffn_grouped(struct forward_state *s, struct forward_stage *st, uint32_t l, int n)
{
    const struct model_config *c = &s->m->cfg;
    struct expert_cache *ec = st->cache;
    int ne = (int)c->n_expert, k = (int)c->n_expert_used;
    int *goff = malloc(sizeof(int) * (size_t)(ne + 1)), *gexp = malloc(sizeof(int) * (size_t)ne);
    struct expert_weights *ew = malloc(sizeof *ew * (size_t)ne);
    int rc = goff && gexp && ew ? 0 : TIDE_ENOMEM;
    int ng = 0;
    for (int e = 0; e < ne && !rc; e++) /* the experts with tokens, ascending: one group each */
        if (s->moe_off[e + 1] > s->moe_off[e]) {
            goff[ng] = s->moe_off[e];
            gexp[ng++] = e;
        }
    if (!rc && !ng)
        rc = TIDE_EINTERNAL; /* n >= 1 tokens route somewhere */
    if (!rc) {
        goff[ng] = n * k;
        struct moe_batch mb = {.n = n, .k = k, .n_group = ng, .off = goff, .tok = s->moe_tok, .w = s->moe_tokw,
                               .ex = ew, .g0 = 0, .g1 = ng};
        model_expert_host(s->m, l, (uint32_t)gexp[0], &ew[0]);
        rc = st->be.i->moe_ffn_batch(st->be.ctx, &mb, NULL, NULL, false);
        int live = ec ? (ec->n_seg - ec->n_borrowed) * ec->slots_per_seg : ng;
        if (live < 1)
            live = 1; /* no live slot: the staging slot carries one expert at a time */
        for (int g0 = 0; g0 < ng && !rc; g0 = mb.g1) {
            mb.g0 = g0;
            mb.g1 = ng - g0 < live ? ng : g0 + live;
            for (int g = g0; g < mb.g1 && !rc; g++) {
                if (ec)
                    rc = expert_cache_lookup(ec, l, (uint32_t)gexp[g], &ew[g]);
                else
                    model_expert_host(s->m, l, (uint32_t)gexp[g], &ew[g]);
                s->n_expert_calls++;
            }
            if (!rc)
                rc = st->be.i->moe_ffn_batch(st->be.ctx, &mb, st->xb, st->x, true);
            if (rc == TIDE_EUNSUPPORTED && g0 > 0)
                rc = TIDE_EINTERNAL; /* the probe said yes: only a broken view gets here */
        }
    }
    free(goff);
    free(gexp);
    free(ew);
    return rc;
}

/* A decode step's route() row for layer l and token i (i < n_seq). */
int32_t *forward_layer_route(const struct forward_state *s, const struct forward_stage *st, uint32_t l, int i)
{
    size_t row = 2 * (size_t)s->m->cfg.n_expert_used;
    return st->route + ((size_t)s->max_batch + (size_t)(l - st->l0) * s->n_seq + i) * row;
}

/* MoE FFN for n tokens: xb (n, E) normed input -> moe_out (n, E), returning 0; or, returning
 * 1, already added into x (the fused decode forms: one launch fewer than an axpy after). */
int forward_moe_ffn(struct forward_state *s, struct forward_stage *st, uint32_t l, int n, bool have_logits)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int E = (int)c->n_embd, F = (int)c->n_ff_exp, k = (int)c->n_expert_used;
    const struct model_layer *L = &st->layers[l - st->l0];

    if (!have_logits)
        B->matmul(bc, &L->ffn_gate_inp, st->xb, st->router, n); /* (n, n_expert) */
    /* One token: the fused op. Several (a decode step of several sequences too) are grouped by
     * expert below, so each expert's weights are read once a step, not once a token (the fused
     * op per token was measured 1.6x slower at 32 sequences on the H200: docs/BENCHMARKS.md). */
    bool per_token = n == 1;
    if (st->from_table) { /* every expert resident: no lookups, nothing waits for the device */
        struct expert_weights shape;
        model_expert_host(s->m, l, 0, &shape);
        const void *const *tab = expert_cache_table(st->cache, l);
        size_t ne = c->n_expert, E2 = (size_t)E;
        if (n > 1) { /* a step's tokens grouped by expert on the device: each expert read once */
            int rc = B->moe_ffn_table_route(bc, &shape, tab, st->router, n, (int)c->n_expert,
                                            c->expert_weights_norm, forward_layer_route(s, st, l, 0), k, st->xb, st->x, true);
            if (rc == 0)
                s->n_expert_calls += (uint64_t)n * k;
            if (rc != TIDE_EUNSUPPORTED)
                return rc < 0 ? rc : 1;
        }
        for (int i = 0; i < n; i++) {
            int32_t *routed = forward_layer_route(s, st, l, i);
            const float *rl = st->router + i * ne, *xi = st->xb + i * E2;
            float *yi = st->x + i * E2;
            int rc = TIDE_EUNSUPPORTED;
            if (B->moe_ffn_table_route) /* the routing inside the MoE's first launch */
                rc = B->moe_ffn_table_route(bc, &shape, tab, rl, 1, (int)c->n_expert, c->expert_weights_norm, routed,
                                            k, xi, yi, true);
            if (rc == TIDE_EUNSUPPORTED) {
                B->route(bc, rl, 1, (int)c->n_expert, k, c->expert_weights_norm, routed);
                rc = B->moe_ffn_table(bc, &shape, tab, routed, k, xi, yi, true);
            }
            if (rc < 0)
                return rc;
            s->n_expert_calls += k;
        }
        return 1;
    }
    int32_t *routed = n == 1 ? forward_layer_route(s, st, l, 0) : st->route;
    B->route(bc, st->router, n, (int)c->n_expert, k, c->expert_weights_norm, routed);
    B->download(bc, s->host_route, routed, sizeof(int32_t) * 2 * (size_t)n * k);
    memcpy(s->moe_sel, s->host_route, sizeof(int32_t) * (size_t)n * k);
    memcpy(s->moe_w, s->host_route + (size_t)n * k, sizeof(float) * (size_t)n * k);
    if (per_token && B->moe_ffn) {
        int rc = 0;
        for (int i = 0; i < n && rc == 0; i++)
            rc = moe_ffn_fused(s, st, l, i);
        if (rc != TIDE_EUNSUPPORTED)
            return rc < 0 ? rc : 1;
        if (n > 1)
            return TIDE_EINTERNAL; /* the probe said yes for the first token: only a broken view gets here */
    }
    /* The tokens routed to each expert in ascending order, by one counting sort over the
     * (token, choice) pairs: expert e's are moe_tok[off[e]..off[e+1]), weights in moe_tokw. */
    int *off = s->moe_off; /* (n_expert + 1) */
    memset(off, 0, sizeof(int) * (c->n_expert + 1));
    for (int i = 0; i < n * k; i++)
        off[s->moe_sel[i] + 1]++;
    for (uint32_t e = 0; e < c->n_expert; e++)
        off[e + 1] += off[e];
    for (int i = 0; i < n * k; i++) { /* off[e] walks from e's start to e+1's */
        int p = off[s->moe_sel[i]]++;
        s->moe_tok[p] = i / k;
        s->moe_tokw[p] = s->moe_w[i];
    }
    for (uint32_t e = c->n_expert; e > 0; e--)
        off[e] = off[e - 1];
    off[0] = 0;
    if (B->moe_ffn_batch) { /* prefill's experts in a few launches, added into x */
        int rc = moe_ffn_grouped(s, st, l, n);
        if (rc != TIDE_EUNSUPPORTED)
            return rc < 0 ? rc : 1;
    }
    B->zero(bc, st->moe_out, n * E);
    for (uint32_t e = 0; e < c->n_expert; e++) {
        int cnt = off[e + 1] - off[e];
        int *tok = s->moe_tok + off[e];    /* tokens routed to expert e */
        float *wt = s->moe_tokw + off[e];  /* their weights for e */
        if (!cnt)
            continue;
        struct expert_weights ew;
        int rc;
        if (st->cache)
            rc = expert_cache_lookup(st->cache, l, e, &ew);
        else
            model_expert_host(s->m, l, e, &ew), rc = 0;
        if (rc < 0)
            return rc;
        s->n_expert_calls++;
        B->gather_rows(bc, st->moe_in, st->xb, tok, cnt, E); /* (cnt, E) */
        B->matmul(bc, &ew.gate, st->moe_in, st->hb, cnt);   /* (cnt, F) */
        B->matmul(bc, &ew.up, st->moe_in, st->hb2, cnt);    /* (cnt, F) */
        B->swiglu(bc, st->hb, st->hb2, cnt * F);
        B->matmul(bc, &ew.down, st->hb, st->xb2, cnt);      /* (cnt, E) */
        B->scatter_axpy(bc, st->moe_out, st->xb2, tok, wt, cnt, E); /* moe_out[tok[i]] += wt[i] xb2[i] */
    }
    return 0;
}

/* The shared expert for n tokens, after the routed experts: x (n, E) += sigmoid(g . xb) *
 * down(silu(gate xb) * up xb), xb the FFN-normed input (qwen2moe), or without the sigmoid gate
 * where the layer has none (GraniteMoeShared). Its weights are the layer's resident tensors
 * (never the expert cache). Scratch: hb, hb2 (n, n_ff_shexp), xb2 (n, E) and router (the n gate
 * values; the routing is done with it by now). */
void forward_shared_expert_ffn(const struct backend_i *B, void *bc, const struct forward_stage *st,
                                      const struct model_layer *L, int n)
{
    int F = (int)L->ffn_gate_shexp.ne[1], E = (int)L->ffn_down_shexp.ne[1];
    B->matmul(bc, &L->ffn_gate_shexp, st->xb, st->hb, n);  /* (n, F) */
    B->matmul(bc, &L->ffn_up_shexp, st->xb, st->hb2, n);   /* (n, F) */
    B->swiglu(bc, st->hb, st->hb2, n * F);
    B->matmul(bc, &L->ffn_down_shexp, st->hb, st->xb2, n); /* (n, E) */
    if (!L->ffn_gate_inp_shexp.data) { /* ungated */
        B->axpy(bc, st->x, st->xb2, 1.0f, n * E);
        return;
    }
    B->matmul(bc, &L->ffn_gate_inp_shexp, st->xb, st->router, n); /* (n, 1) */
    B->axpy_sigmoid(bc, st->x, st->xb2, st->router, n, E);
}

