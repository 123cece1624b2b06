/* forward_eval.c - the transformer forward pass over the backend vtable, stage by stage.
 *
 * Prompts are processed in chunks of up to max_batch tokens: every matmul of a layer runs
 * once for the whole chunk, so each weight row is read once per chunk rather than once
 * per token. Rope and causal attention take the whole chunk in one op each. MoE tokens are
 * grouped by expert so each chosen expert is fetched and multiplied once per chunk.
 * Top-k routing runs on the device (backend_i.route); the host downloads the chosen ids to look
 * the experts up in the cache, except in a decode step whose experts are all resident: that
 * step runs its experts from the cache's device table and never waits for the device (and,
 * where the backend records, replays one recording of the whole step). The stages' setup and
 * buffers are forward.c. */
#include "forward.h"
#include "forward_internal.h"
#include "sample.h"
#include "backend_cuda.h"
#include "memory/device.h"
#include "memory/expert_cache.h"

#include <math.h>
#include <stdio.h>
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
static int32_t *layer_route(const struct forward_state *s, const struct forward_stage *st, uint32_t l, int i)
{
    size_t row = 2 * (size_t)s->m->cfg.n_expert_used;
    return st->route + ((size_t)s->max_batch + (size_t)(l - st->l0) * s->n_seq + i) * row;
}

/* MoE FFN for n tokens: xb (n, E) normed input -> moe_out (n, E), returning 0; or, returning
 * 1, already added into x (the fused decode forms: one launch fewer than an axpy after). */
static int moe_ffn(struct forward_state *s, struct forward_stage *st, uint32_t l, int n, bool have_logits)
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
                                            c->expert_weights_norm, layer_route(s, st, l, 0), k, st->xb, st->x, true);
            if (rc == 0)
                s->n_expert_calls += (uint64_t)n * k;
            if (rc != TIDE_EUNSUPPORTED)
                return rc < 0 ? rc : 1;
        }
        for (int i = 0; i < n; i++) {
            int32_t *routed = layer_route(s, st, l, i);
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
    int32_t *routed = n == 1 ? layer_route(s, st, l, 0) : st->route;
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
static void shared_expert_ffn(const struct backend_i *B, void *bc, const struct forward_stage *st,
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

/* x (n, rows) += W in: the fused slot when the backend has one, else the product into tmp
 * and an axpy (the same bits either way). */
static void matmul_residual(const struct backend_i *B, void *bc, const struct tensor *w, const float *in, float *x,
                            float *tmp, int n)
{
    if (B->matmul_add) {
        B->matmul_add(bc, w, in, x, n);
        return;
    }
    B->matmul(bc, w, in, tmp, n);
    B->axpy(bc, x, tmp, 1.0f, n * (int)w->ne[1]);
}

/* A step's rows as runs of one sequence each: run r is rows [t0, t0 + n) of the step, at
 * positions pos.. of KV slot `slot`. */
struct run {
    int slot, pos, t0, n;
    const int *tokens;   /* or NULL: */
    const float *embd;   /* host (n, n_embd), rows embd_stride floats apart */
    int embd_stride;
    const int32_t *mpos; /* host (n, 4) M-RoPE ids, or NULL */
    int out;             /* the forward_seq whose last row this is when its logits are wanted, else -1 */
};

/* Layer l's K (or V) rows of slot `slot`: (n_ctx, kvd). */
static float *slot_rows(const struct forward_state *s, const struct forward_stage *st, float *cache, uint32_t l,
                        int slot)
{
    size_t kvd = (size_t)s->m->cfg.n_head_kv * s->m->cfg.head_dim;
    return cache + ((size_t)(l - st->l0) * s->n_seq + (size_t)slot) * s->n_ctx * kvd;
}

/* The runs of a step (nr of them, n rows in all); or, with at (backend memory, see struct
 * forward_stage), one token of run 0 at position *at, read when the ops run: the recordable
 * decode step. One run writes its K/V rows straight into its slot; several rotate theirs in
 * k_new/v_new, then copy each run's rows to its own slot. */
static int stage_layers(struct forward_state *s, struct forward_stage *st, const struct run *rn, int nr, int n,
                        const int32_t *at)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int E = (int)c->n_embd, hd = (int)c->head_dim;
    int kvd = (int)c->n_head_kv * hd, qd = (int)c->n_head * hd;
    bool one = nr == 1, rows = !at && st->rows;
    size_t slot_floats = (size_t)s->n_ctx * kvd;
    if (st->l0 == 0) /* granitemoe's embedding scale */
        forward_arch_embed(c, st, n);
    for (uint32_t l = st->l0; l < st->l1; l++) {
        const struct model_layer *L = &st->layers[l - st->l0];
        /* with at the new rows go to kv_new and qk_norm_rope_at stores them at *at */
        float *kpos = at ? st->kv_new : one ? slot_rows(s, st, st->k_cache, l, rn[0].slot) + (size_t)rn[0].pos * kvd
                                            : st->k_new;
        float *vpos = at ? st->kv_new + kvd : one ? slot_rows(s, st, st->v_cache, l, rn[0].slot) + (size_t)rn[0].pos * kvd
                                                  : st->v_new;
        if (c->kv_lora_rank) { /* deepseek2's MLA: its own attention block (forward_mla.c), op by op */
            struct mla_run mr[FORWARD_MAX_SEQ];
            for (int r = 0; r < nr; r++)
                mr[r] = (struct mla_run){slot_rows(s, st, st->k_cache, l, rn[r].slot), rn[r].pos, rn[r].t0, rn[r].n};
            int rc = at || rows ? TIDE_EUNSUPPORTED : forward_mla_attention(s, st, L, n, mr, nr);
            if (rc < 0)
                return rc;
            goto ffn;
        }

        if (B->matmul3) { /* one op: the norm and the three products of xb */
            const struct tensor *const w3[3] = {&L->wq, &L->wk, &L->wv};
            float *const y3[3] = {st->q, kpos, vpos};
            B->matmul3(bc, w3, st->x, y3, n, &L->attn_norm, c->rms_eps, st->xb);
        } else {
            B->rmsnorm(bc, st->x, &L->attn_norm, st->xb, E, n, c->rms_eps);
            B->matmul(bc, &L->wq, st->xb, st->q, n);  /* (n, qd) */
            B->matmul(bc, &L->wk, st->xb, kpos, n);   /* (n, kvd) */
            B->matmul(bc, &L->wv, st->xb, vpos, n);   /* (n, kvd) */
        }
        if (L->bq.data) /* q/k/v biases (qwen2moe), before the rope */
            B->add_bias(bc, st->q, L->bq.data, n, qd);
        if (L->bk.data)
            B->add_bias(bc, kpos, L->bk.data, n, kvd);
        if (L->bv.data)
            B->add_bias(bc, vpos, L->bv.data, n, kvd);
        if (c->arch == ARCH_OLMOE || c->attention_scale != 0.0f) /* olmoe's q/k norms, granite's scale */
            forward_arch_qk(c, st, L, kpos, n);
        /* qwen3: rmsnorm each head before rope (olmoe's whole-width norms are done by now) */
        bool per_head = c->arch != ARCH_OLMOE;
        const struct tensor *qn = per_head && L->q_norm.data ? &L->q_norm : NULL;
        const struct tensor *kn = per_head && L->k_norm.data ? &L->k_norm : NULL;
        int window = model_layer_window(c, l);
        if (at) {
            float *kc = slot_rows(s, st, st->k_cache, l, rn[0].slot), *vc = slot_rows(s, st, st->v_cache, l, rn[0].slot);
            B->qk_norm_rope_at(bc, st->q, st->kv_new, st->kv_new + kvd, kc, vc, 1, at, NULL, 0, qn, kn, (int)c->n_head,
                               (int)c->n_head_kv, hd, c->rope_theta, c->rope, c->rms_eps);
            B->attention_at(bc, st->q, kc, vc, st->att_out, 1, at, NULL, 0, s->n_ctx, (int)c->n_head, (int)c->n_head_kv,
                            hd);
        } else if (rows) { /* one token of each of n sequences: every row in one op each */
            float *kc = slot_rows(s, st, st->k_cache, l, 0), *vc = slot_rows(s, st, st->v_cache, l, 0);
            const int32_t *slots = st->rows_at + s->n_seq;
            B->qk_norm_rope_at(bc, st->q, st->k_new, st->v_new, kc, vc, n, st->rows_at, slots, slot_floats, qn, kn,
                               (int)c->n_head, (int)c->n_head_kv, hd, c->rope_theta, c->rope, c->rms_eps);
            B->attention_at(bc, st->q, kc, vc, st->att_out, n, st->rows_at, slots, slot_floats, s->n_ctx,
                            (int)c->n_head, (int)c->n_head_kv, hd);
        }
        for (int r = 0; r < nr && !at && !rows; r++) {
            const struct run *R = &rn[r];
            float *q = st->q + (size_t)R->t0 * qd;
            float *k = kpos + (size_t)(one ? 0 : R->t0) * kvd, *v = vpos + (size_t)(one ? 0 : R->t0) * kvd;
            if (R->mpos) { /* M-RoPE (qwen3vlmoe, qwen2vl with images): head norms, then each row's four ids */
                if (!B->rope_multi)
                    return TIDE_EUNSUPPORTED;
                if (qn)
                    B->rmsnorm(bc, q, qn, q, hd, R->n * (int)c->n_head, c->rms_eps);
                if (kn)
                    B->rmsnorm(bc, k, kn, k, hd, R->n * (int)c->n_head_kv, c->rms_eps);
                B->rope_multi(bc, q, R->n, (int)c->n_head, hd, R->mpos, c->rope_theta, c->rope_sections,
                              c->rope_sections_interleaved);
                B->rope_multi(bc, k, R->n, (int)c->n_head_kv, hd, R->mpos, c->rope_theta, c->rope_sections,
                              c->rope_sections_interleaved);
            } else if (s->m->rope_freqs) { /* rope scaling (gpt-oss's yarn; no head norms there) */
                B->rope_freqs(bc, q, R->n, (int)c->n_head, hd, R->pos, s->m->rope_freqs, c->rope_mscale, c->rope);
                B->rope_freqs(bc, k, R->n, (int)c->n_head_kv, hd, R->pos, s->m->rope_freqs, c->rope_mscale, c->rope);
            } else if (B->qk_norm_rope) {
                B->qk_norm_rope(bc, q, k, qn, kn, R->n, (int)c->n_head, (int)c->n_head_kv, hd, R->pos, c->rope_theta,
                                c->rope, c->rms_eps);
            } else {
                if (qn)
                    B->rmsnorm(bc, q, qn, q, hd, R->n * (int)c->n_head, c->rms_eps);
                if (kn)
                    B->rmsnorm(bc, k, kn, k, hd, R->n * (int)c->n_head_kv, c->rms_eps);
                B->rope(bc, q, R->n, (int)c->n_head, hd, R->pos, c->rope_theta, c->rope);
                B->rope(bc, k, R->n, (int)c->n_head_kv, hd, R->pos, c->rope_theta, c->rope);
            }
            float *kc = slot_rows(s, st, st->k_cache, l, R->slot), *vc = slot_rows(s, st, st->v_cache, l, R->slot);
            if (!one) { /* this run's rows into its slot */
                B->gather_rows(bc, kc + (size_t)R->pos * kvd, k, s->iota, R->n, kvd);
                B->gather_rows(bc, vc + (size_t)R->pos * kvd, v, s->iota, R->n, kvd);
            }
            /* the run's K/V rows are in its slot now: one causal attention for its rows */
            if (L->attn_sinks.data || window) /* gpt-oss: sinks, and every other layer windowed */
                B->attention_sinks(bc, q, kc, vc, st->att_out + (size_t)R->t0 * qd, st->att, R->n, R->pos,
                                   (int)c->n_head, (int)c->n_head_kv, hd, L->attn_sinks.data, window);
            else
                B->attention(bc, q, kc, vc, st->att_out + (size_t)R->t0 * qd, st->att, R->n, R->pos, (int)c->n_head,
                             (int)c->n_head_kv, hd);
        }
        if (c->residual_scale != 1.0f) { /* granitemoe */
            forward_arch_attn_residual(c, st, L, n);
        } else {
            matmul_residual(B, bc, &L->wo, st->att_out, st->x, st->xb2, n); /* x (n, E) += wo att_out */
            if (L->bo.data) /* gpt-oss's output bias */
                B->add_bias(bc, st->x, L->bo.data, n, E);
        }

    ffn:;
        /* deepseek2's leading layers are dense */
        bool moe = c->n_expert && l >= c->n_dense_lead;
        /* a decode token's norm and router product in one op where the backend has it */
        bool routed = n == 1 && moe && B->norm_matmul &&
                      B->norm_matmul(bc, &L->ffn_gate_inp, st->x, st->router, &L->ffn_norm, c->rms_eps, st->xb) == 0;
        if (!routed)
            B->rmsnorm(bc, st->x, &L->ffn_norm, st->xb, E, n, c->rms_eps);
        forward_arch_ffn_begin(c, st, n); /* granitemoe's residual scale */
        if (moe) {
            int rc = c->arch == ARCH_GPTOSS ? forward_oai_moe_ffn(s, st, l, n, routed) : moe_ffn(s, st, l, n, routed);
            if (rc < 0)
                return rc;
            if (rc == 0)
                B->axpy(bc, st->x, st->moe_out, 1.0f, n * E);
            if (L->ffn_gate_shexp.data)
                shared_expert_ffn(B, bc, st, L, n);
        } else {
            int F = (int)c->n_ff;
            B->matmul(bc, &L->ffn_gate, st->xb, st->hb, n); /* (n, F) */
            B->matmul(bc, &L->ffn_up, st->xb, st->hb2, n);
            B->swiglu(bc, st->hb, st->hb2, n * F);
            matmul_residual(B, bc, &L->ffn_down, st->hb, st->x, st->xb2, n); /* x (n, E) += down hb */
        }
        /* qwen3vlmoe: an image row's deepstack feature l (its input row's slice l + 1) joins its
         * hidden state after layer l; text rows have none */
        for (int r = 0; r < nr && !at && !rows && l < c->n_deepstack; r++) {
            const struct run *R = &rn[r];
            if (!R->embd || R->embd_stride < (int)(l + 2) * E)
                continue;
            for (int t = 0; t < R->n; t++)
                B->upload(bc, st->xb + (size_t)(R->t0 + t) * E, R->embd + (size_t)t * R->embd_stride + (l + 1) * E,
                          sizeof(float) * (size_t)E);
            B->axpy(bc, st->x + (size_t)R->t0 * E, st->xb + (size_t)R->t0 * E, 1.0f, R->n * E);
        }
        forward_arch_ffn_end(c, st, n);
    }
    return 0;
}

/* After a decode step that ran from the device table: the experts it chose become the
 * cache's hits and most recent uses, as lookups would have made them (one small download,
 * after the step's work). */
static void count_table_step(struct forward_state *s, struct forward_stage *st, int n)
{
    int k = (int)s->m->cfg.n_expert_used;
    uint32_t nl = st->l1 - st->l0;
    size_t row = 2 * (size_t)k;
    st->be.i->download(st->be.ctx, s->host_route, layer_route(s, st, st->l0, 0),
                       sizeof(int32_t) * row * nl * (size_t)s->n_seq);
    for (uint32_t i = 0; i < nl; i++)
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                expert_cache_touch(st->cache, st->l0 + i,
                                   (uint32_t)s->host_route[((size_t)i * s->n_seq + t) * row + j]);
    st->from_table = false;
}

/* The ops of a stage's decode step from the table, as recorded: the token's embedding (when
 * embed) and the layers, position and token read from step_at. */
static int step_ops(struct forward_state *s, struct forward_stage *st, const struct run *rn, bool embed)
{
    if (embed)
        st->be.i->get_row_at(st->be.ctx, &st->tok_embd, st->step_at + 1, st->x);
    return stage_layers(s, st, rn, 1, 1, st->step_at);
}

/* A decode step of stage st (one sequence, one token) whose experts are all resident: the
 * first runs op by op (sizing every workspace), the next is recorded, and later ones replay
 * the recording: one launch instead of ~10 a layer. A recording holds its slot's KV rows, so a
 * step of another slot records anew. A recording that cannot be made turns recording off for
 * the stage. */
static int stage_step(struct forward_state *s, struct forward_stage *st, const struct run *rn, bool embed)
{
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    uint64_t calls = (uint64_t)s->m->cfg.n_expert_used * (st->l1 - st->l0);
    int32_t at[2] = {rn->pos, embed ? rn->tokens[0] : 0};
    if (st->graph && st->graph_slot != rn->slot) {
        B->graph_free(bc, st->graph);
        st->graph = NULL;
        st->graph_warm = false;
    }
    B->upload(bc, st->step_at, at, sizeof at);
    if (!st->graph && st->graph_warm) {
        uint64_t n0 = s->n_expert_calls; /* recording runs nothing */
        int rc = B->graph_begin(bc);
        if (rc == 0) {
            int rs = step_ops(s, st, rn, embed);
            rc = B->graph_end(bc, &st->graph);
            if (rc == 0 && rs < 0) {
                B->graph_free(bc, st->graph);
                st->graph = NULL;
                rc = rs;
            }
            st->graph_slot = rn->slot;
        }
        s->n_expert_calls = n0;
        if (rc < 0) {
            tide_log("forward: layers %u-%u: decode steps run op by op (recording failed: %s)", st->l0, st->l1 - 1,
                     tide_strerror(rc));
            st->graph_off = true;
        }
    }
    if (st->graph) {
        int rc = B->graph_launch(bc, st->graph);
        if (rc == 0) {
            s->n_expert_calls += calls;
            return 0;
        }
        B->graph_free(bc, st->graph); /* stale: a workspace grew since; record again */
        st->graph = NULL;
        st->graph_warm = false;
        if (rc != TIDE_ESTALE)
            return rc;
    }
    int rc = step_ops(s, st, rn, embed);
    st->graph_warm = rc == 0;
    return rc;
}

/* The logits (or greedy picks, or draws) of the runs that want them: their last rows gathered,
 * normed and multiplied by the output head in one product. A row with a draw is sampled on the
 * backend (backend_i.sample, runs of such rows in one op each) whatever the other rows need, so
 * that its token does not depend on what shares its step; greedy rows pick on the backend when
 * no row needs its logits. Then one int a row comes back, and the logits only if a row needs them. */
static void step_logits(struct forward_state *s, struct forward_stage *st, const struct run *rn, int nr,
                        struct forward_seq *seqs)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int E = (int)c->n_embd, V = (int)c->n_vocab;
    int rows[FORWARD_MAX_SEQ], who[FORWARD_MAX_SEQ], m = 0;
    bool drawn[FORWARD_MAX_SEQ], host = false; /* host: a row needs its logits on the host */
    for (int r = 0; r < nr; r++)
        if (rn[r].out >= 0) {
            const struct forward_seq *q = &seqs[rn[r].out];
            rows[m] = rn[r].t0 + rn[r].n - 1;
            drawn[m] = q->draw && B->sample;
            host = host || !(drawn[m] || (q->pick_only && B->argmax));
            who[m++] = rn[r].out;
        }
    if (!m)
        return;
    const float *xl = st->x + (size_t)rows[0] * E;
    if (m > 1) {
        B->gather_rows(bc, st->xb2, st->x, rows, m, E);
        xl = st->xb2;
    }
    B->rmsnorm(bc, xl, &st->output_norm, st->xb, E, m, c->rms_eps);
    B->matmul(bc, &st->output, st->xb, st->logits, m);
    int32_t *pick = (int32_t *)(st->logits + (size_t)s->n_seq * V), ids[FORWARD_MAX_SEQ];
    struct sample_logprob *lpd = (struct sample_logprob *)(pick + s->n_seq), lps[FORWARD_MAX_SEQ];
    struct sample_row par[FORWARD_MAX_SEQ];
    bool on_device = false, with_lp = false; /* ids[] (lps[]) have something to bring back */
    for (int i = 0; i < m;) {
        if (!drawn[i]) {
            if (!host && seqs[who[i]].pick_only) {
                B->argmax(bc, st->logits + (size_t)i * V, V, pick + i);
                on_device = true;
            }
            i++;
            continue;
        }
        int j = i;
        bool lp_here = false;
        for (; j < m && drawn[j]; j++) {
            par[j] = *seqs[who[j]].draw;
            lp_here = lp_here || par[j].logprobs;
        }
        B->sample(bc, st->logits + (size_t)i * V, j - i, V, par + i, pick + i, lp_here ? lpd + i : NULL);
        with_lp = with_lp || lp_here;
        on_device = true;
        i = j;
    }
    if (on_device)
        B->download(bc, ids, pick, sizeof(int32_t) * (size_t)m);
    if (with_lp)
        B->download(bc, lps, lpd, sizeof(struct sample_logprob) * (size_t)m);
    if (host)
        B->download(bc, s->logits, st->logits, sizeof(float) * (size_t)m * V);
    for (int i = 0; i < m; i++) {
        struct forward_seq *q = &seqs[who[i]];
        q->logits = host && !drawn[i] ? s->logits + (size_t)i * V : NULL;
        q->pick = drawn[i] || (q->pick_only && !host) ? ids[i] : q->pick_only ? sampler_argmax(q->logits, V) : -1;
        if (drawn[i] && q->draw->logprobs && q->logprob)
            *q->logprob = lps[i];
    }
}

/* One bound step: nr runs of n rows in all (n within the bound buffers). */
static int eval_runs(struct forward_state *s, const struct run *rn, int nr, int n, struct forward_seq *seqs)
{
    const struct model_config *c = &s->m->cfg;
    int E = (int)c->n_embd;
    struct forward_stage *st;
    /* rows with M-RoPE ids take the op-by-op path (the recorded step and the rows' ops rotate
     * by the KV position) */
    bool mrope = false;
    for (int r = 0; r < nr; r++)
        mrope = mrope || rn[r].mpos;
    mrope = mrope || c->kv_lora_rank; /* deepseek2's MLA too: forward_mla.c runs op by op */
    bool decode1 = nr == 1 && n == 1 && !mrope;
    /* one token of each of several sequences: the rows' ops (qk_norm_rope_at, attention_at,
     * moe_ffn_table_route of n tokens) run all of them at once (unless TIDE_DECODE_ROWS=0) */
    bool rows = nr > 1 && n == nr && s->decode_rows && !mrope;
    int32_t rows_at[2 * FORWARD_MAX_SEQ] = {0};
    if (rows) {
        for (int r = 0; r < nr; r++) {
            rows_at[r] = rn[r].pos;
            rows_at[s->n_seq + r] = rn[r].slot;
        }
    }
    for (int i = 0; i < s->n_stage; i++) {
        st = &s->stage[i];
        st->from_table = false;
        st->rows = rows && st->be.i->qk_norm_rope_at && st->be.i->attention_at;
        if (st->rows)
            st->be.i->upload(st->be.ctx, st->rows_at, rows_at, sizeof(int32_t) * 2 * (size_t)s->n_seq);
        if ((decode1 || (st->rows && st->be.i->moe_ffn_table_route)) && st->table_ok &&
            expert_cache_complete(st->cache)) {
            int rc = expert_cache_sync_table(st->cache);
            if (rc < 0)
                return rc;
            st->from_table = true;
        }
    }
    st = &s->stage[0];
    /* stage 0's embedding inside its step: a recording either embeds a token or not, so input
     * embeddings (an image's last token) take the op-by-op path */
    bool step0 = decode1 && st->from_table && !st->graph_off && rn[0].tokens;
    /* a decode step's tokens (rows r at row r) in one get_rows */
    int ids[FORWARD_MAX_SEQ], n_ids = 0;
    for (int r = 0; rows && st->be.i->get_rows && r < nr && rn[r].tokens; r++)
        ids[n_ids++] = rn[r].tokens[0];
    bool one_embed = n_ids == nr && rows;
    for (int r = 0; r < nr; r++) {
        const struct run *R = &rn[r];
        float *x = st->x + (size_t)R->t0 * E;
        if (R->tokens) {
            for (int t = 0; t < R->n; t++)
                if (R->tokens[t] < 0 || (uint32_t)R->tokens[t] >= c->n_vocab)
                    return TIDE_EINVAL;
            if (step0 || one_embed)
                continue;
            if (st->be.i->get_rows)
                st->be.i->get_rows(st->be.ctx, &st->tok_embd, R->tokens, R->n, x);
            else
                for (int t = 0; t < R->n; t++)
                    st->be.i->get_row(st->be.ctx, &st->tok_embd, R->tokens[t], x + (size_t)t * E);
        } else {
            if (R->embd_stride == E)
                st->be.i->upload(st->be.ctx, x, R->embd, sizeof(float) * (size_t)R->n * E);
            else
                for (int t = 0; t < R->n; t++)
                    st->be.i->upload(st->be.ctx, x + (size_t)t * E, R->embd + (size_t)t * R->embd_stride,
                                     sizeof(float) * (size_t)E);
        }
    }
    if (one_embed)
        st->be.i->get_rows(st->be.ctx, &st->tok_embd, ids, nr, st->x);
    for (int i = 0; i < s->n_stage; i++) {
        st = &s->stage[i];
        if (i > 0) { /* hand the activations to the next device */
            struct forward_stage *pv = &s->stage[i - 1];
            size_t b = sizeof(float) * (size_t)n * E;
            pv->be.i->download(pv->be.ctx, s->host_x, pv->x, b);
            st->be.i->upload(st->be.ctx, st->x, s->host_x, b);
        }
        bool step = i == 0 ? step0 : decode1 && st->from_table && !st->graph_off;
        int rc = step ? stage_step(s, st, rn, i == 0) : stage_layers(s, st, rn, nr, n, NULL);
        if (rc < 0)
            return rc;
    }
    step_logits(s, st, rn, nr, seqs);
    for (int i = 0; i < s->n_stage; i++)
        if (s->stage[i].from_table)
            count_table_step(s, &s->stage[i], n);
    return 0;
}

/* After a step: has a stage's backend failed (a sticky CUDA error, or the test hook)? The
 * first failure is kept: the step's results are garbage and every later step fails at once. */
static int check_backends(struct forward_state *s)
{
    if (s->fault_backend_steps > 0 && --s->fault_backend_steps == 0) {
        s->backend_failed = true;
        snprintf(s->backend_err, sizeof s->backend_err, "injected backend failure (TIDE_FAULT_BACKEND_ERROR)");
    }
    for (int i = 0; i < s->n_stage && !s->backend_failed; i++) {
        const struct forward_stage *st = &s->stage[i];
        char msg[200] = "";
        if (st->dev && st->dev->kind == DEVICE_KIND_CUDA && backend_cuda_error(&st->be, msg, sizeof msg) != 0) {
            s->backend_failed = true;
            snprintf(s->backend_err, sizeof s->backend_err, "device %d: %s", i, msg[0] ? msg : "CUDA error");
        }
    }
    return s->backend_failed ? TIDE_EINTERNAL : 0;
}

int forward_eval_batch(struct forward_state *s, struct forward_seq *seqs, int n_seq)
{
    if (s->backend_failed)
        return TIDE_EINTERNAL;
    if (n_seq <= 0 || n_seq > s->n_seq || n_seq > FORWARD_MAX_SEQ)
        return TIDE_EINVAL;
    int total = 0;
    for (int i = 0; i < n_seq; i++) {
        struct forward_seq *q = &seqs[i];
        if (q->n <= 0 || q->pos < 0 || q->pos + q->n > s->n_ctx || q->slot < 0 || q->slot >= s->n_seq ||
            (!q->tokens && !q->embd))
            return TIDE_ERANGE;
        if (q->embd_stride && q->embd_stride < (int)s->m->cfg.n_embd)
            return TIDE_EINVAL;
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == q->slot)
                return TIDE_EINVAL;
        q->logits = NULL;
        q->pick = -1;
        total += q->n;
    }
    size_t E = s->m->cfg.n_embd;
    int done[FORWARD_MAX_SEQ] = {0};
    int rc = 0;
    /* Cut into bound steps: each takes the next rows of every sequence, in order, up to what
     * the buffers hold; a sequence's logits come with the step that holds its last row. */
    for (int left = total; left > 0 && rc == 0;) {
        int cap = forward_bind_buffers(s, left);
        struct run rn[FORWARD_MAX_SEQ];
        int nr = 0, n = 0;
        for (int i = 0; i < n_seq && n < cap; i++) {
            struct forward_seq *q = &seqs[i];
            int k = q->n - done[i];
            if (k <= 0)
                continue;
            if (k > cap - n)
                k = cap - n;
            int es = q->embd_stride ? q->embd_stride : (int)E;
            rn[nr] = (struct run){.slot = q->slot, .pos = q->pos + done[i], .t0 = n, .n = k,
                                  .tokens = q->tokens ? q->tokens + done[i] : NULL,
                                  .embd = q->embd ? q->embd + (size_t)done[i] * es : NULL, .embd_stride = es,
                                  .mpos = q->mpos ? q->mpos + (size_t)done[i] * 4 : NULL,
                                  .out = done[i] + k == q->n && q->want_logits ? i : -1};
            done[i] += k;
            n += k;
            nr++;
        }
        rc = eval_runs(s, rn, nr, n, seqs);
        forward_unbind_buffers(s);
        if (rc == 0)
            rc = check_backends(s);
        left -= n;
    }
    return rc;
}

/* The one-sequence forms: slot 0. */
static int eval1(struct forward_state *s, const int *tokens, const float *embd, int n, int pos, bool pick_only,
                 int *pick)
{
    struct forward_seq q = {.slot = 0, .pos = pos, .n = n, .tokens = tokens, .embd = embd, .want_logits = true,
                            .pick_only = pick_only};
    int rc = forward_eval_batch(s, &q, 1);
    if (rc == 0 && q.logits && q.logits != s->logits) /* the row the callers read */
        memmove(s->logits, q.logits, sizeof(float) * s->m->cfg.n_vocab);
    if (pick)
        *pick = q.pick;
    return rc;
}

int forward_eval(struct forward_state *s, const int *tokens, int n, int pos)
{
    return eval1(s, tokens, NULL, n, pos, false, NULL);
}

int forward_eval_embd(struct forward_state *s, const float *embd, int n, int pos)
{
    return eval1(s, NULL, embd, n, pos, false, NULL);
}

int forward_eval_greedy(struct forward_state *s, int token, int pos, int *next)
{
    return eval1(s, &token, NULL, 1, pos, true, next);
}
