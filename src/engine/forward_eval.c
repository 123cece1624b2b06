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
 * buffers are forward.c; a layer's MoE FFN forward_moe.c. */
#include "forward.h"
#include "forward_internal.h"
#include "phase_clock.h"
#include "sample.h"
#include "backend_cuda.h"
#include "memory/device.h"
#include "memory/expert_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Rows [0, n) of the host array src (rows `stride` floats apart; the first `cols` floats of each)
 * to dst (n, cols) on the backend in one upload, packed through s->host_x ((max_batch, n_embd):
 * free while a stage computes, and n <= max_batch, cols <= n_embd). An image's rows carry their
 * deepstack slices beside the input row, and an upload a row costs a copy-engine round trip
 * each: a Qwen3-VL-30B-A3B prompt's 768 image rows made 4 x 768 of them. upload takes pageable
 * host memory before it returns (backend.h), so host_x is free again after the call. */
static void upload_rows(struct forward_state *s, const struct backend *be, float *dst, const float *src, int n,
                        int cols, int stride)
{
    if (stride != cols) {
        for (int t = 0; t < n; t++)
            memcpy(s->host_x + (size_t)t * cols, src + (size_t)t * stride, sizeof(float) * (size_t)cols);
        src = s->host_x;
    }
    be->i->upload(be->ctx, dst, src, sizeof(float) * (size_t)n * cols);
}

/* Layer l's K (or V) rows of slot `slot` where a slot is one block (not paged): (n_ctx, kvd)
 * elements of the cache's type. */
static void *slot_rows(const struct forward_state *s, const struct forward_stage *st, void *cache, uint32_t l,
                       int slot)
{
    return kv_row(s, st, cache, l, slot, 0);
}

/* Run R's new rows k and v (R->n rows of kvd floats) into its slot's rows R->pos.. of layer l:
 * rounded to f16 (store_f16) or copied, a piece per block they fall in (one piece unpaged). */
static void store_run(const struct forward_state *s, const struct forward_stage *st, uint32_t l, const struct run *R,
                      const float *k, const float *v)
{
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int kvd = (int)(s->m->cfg.n_head_kv * s->m->cfg.head_dim);
    for (int r = 0, n; r < R->n; r += n) {
        n = kv_run(s, R->pos + r, R->n - r);
        void *kc = kv_row(s, st, st->k_cache, l, R->slot, R->pos + r), *vc = kv_row(s, st, st->v_cache, l, R->slot, R->pos + r);
        const float *kr = k + (size_t)r * kvd, *vr = v + (size_t)r * kvd;
        if (s->kv_f16) {
            B->store_f16(bc, kc, kr, (size_t)n * kvd);
            B->store_f16(bc, vc, vr, (size_t)n * kvd);
        } else {
            B->gather_rows(bc, kc, kr, s->iota, n, kvd);
            B->gather_rows(bc, vc, vr, s->iota, n, kvd);
        }
    }
}

/* The runs of a step (nr of them, n rows in all); or, with at (backend memory, see struct
 * forward_stage), one token of run 0 at position *at, read when the ops run: the recordable
 * decode step. One run writes its K/V rows straight into its slot; several rotate theirs in
 * k_new/v_new, then copy each run's rows to its own slot. An f16 cache (s->kv_f16): every run's
 * rows are computed in f32 in k_new/v_new (kv_new) and rounded as they are stored. */
static int stage_layers(struct forward_state *s, struct forward_stage *st, const struct run *rn, int nr, int n,
                        const int32_t *at)
{
    const struct model_config *c = &s->m->cfg;
    const struct backend_i *B = st->be.i;
    void *bc = st->be.ctx;
    int E = (int)c->n_embd, hd = (int)c->head_dim;
    int kvd = (int)c->n_head_kv * hd, qd = (int)c->n_head * hd;
    bool one = nr == 1, rows = !at && st->rows, f16 = s->kv_f16;
    bool pc = !at && phase_clock_on(); /* never inside a recording (at): a mark waits */
    size_t slot_floats = (size_t)s->n_ctx * kvd;
    if (st->l0 == 0) /* granitemoe's embedding scale */
        forward_arch_embed(c, st, n);
    for (uint32_t l = st->l0; l < st->l1; l++) {
        const struct model_layer *L = &st->layers[l - st->l0];
        /* with at the new rows go to kv_new and qk_norm_rope_at stores them at *at */
        bool direct = one && !f16 && s->kv.fixed; /* the products write the slot's f32 rows themselves */
        float *kpos = at       ? st->kv_new
                      : direct ? (float *)slot_rows(s, st, st->k_cache, l, rn[0].slot) + (size_t)rn[0].pos * kvd
                               : st->k_new;
        float *vpos = at       ? st->kv_new + kvd
                      : direct ? (float *)slot_rows(s, st, st->v_cache, l, rn[0].slot) + (size_t)rn[0].pos * kvd
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
        if (pc)
            phase_clock_mark(B, bc, PHASE_QKV);
        if (c->arch == ARCH_OLMOE || c->attention_scale != 0.0f) /* olmoe's q/k norms, granite's scale */
            forward_arch_qk(c, st, L, kpos, n);
        /* qwen3: rmsnorm each head before rope (olmoe's whole-width norms are done by now) */
        bool per_head = c->arch != ARCH_OLMOE;
        const struct tensor *qn = per_head && L->q_norm.data ? &L->q_norm : NULL;
        const struct tensor *kn = per_head && L->k_norm.data ? &L->k_norm : NULL;
        int window = model_layer_window(c, l);
        if (at || rows) { /* at: the recordable step's one row; rows: one token of each of n sequences,
                             every row in one op each */
            int nrow = at ? 1 : n, slot0 = at ? rn[0].slot : 0;
            const int32_t *pos_at = at ? at : st->rows_at, *slots = at ? NULL : st->rows_at + s->n_seq;
            size_t stride = at ? 0 : slot_floats;
            float *kn_new = at ? st->kv_new : st->k_new, *vn_new = at ? st->kv_new + kvd : st->v_new;
            if (!s->kv.fixed) { /* paged: each row's slot's block table, read from device memory as the ops run */
                const int32_t *tabs = st->kv_tables + (size_t)slot0 * s->kv.per_slot;
                void *kp = kv_layer(s, st, st->k_cache, l), *vp = kv_layer(s, st, st->v_cache, l);
                B->qk_norm_rope_at_paged(bc, st->q, kn_new, vn_new, kp, vp, f16, nrow, pos_at, slots, tabs,
                                         s->kv.per_slot, s->kv.block_rows, qn, kn, (int)c->n_head, (int)c->n_head_kv,
                                         hd, c->rope_theta, c->rope, c->rms_eps);
                B->attention_at_paged(bc, st->q, kp, vp, f16, st->att_out, nrow, pos_at, slots, tabs, s->kv.per_slot,
                                      s->kv.block_rows, s->n_ctx, (int)c->n_head, (int)c->n_head_kv, hd);
            } else {
                void *kc = slot_rows(s, st, st->k_cache, l, slot0), *vc = slot_rows(s, st, st->v_cache, l, slot0);
                if (f16) {
                    B->qk_norm_rope_at_f16(bc, st->q, kn_new, vn_new, kc, vc, nrow, pos_at, slots, stride, qn, kn,
                                           (int)c->n_head, (int)c->n_head_kv, hd, c->rope_theta, c->rope, c->rms_eps);
                    B->attention_at_f16(bc, st->q, kc, vc, st->att_out, nrow, pos_at, slots, stride, s->n_ctx,
                                        (int)c->n_head, (int)c->n_head_kv, hd);
                } else {
                    B->qk_norm_rope_at(bc, st->q, kn_new, vn_new, kc, vc, nrow, pos_at, slots, stride, qn, kn,
                                       (int)c->n_head, (int)c->n_head_kv, hd, c->rope_theta, c->rope, c->rms_eps);
                    B->attention_at(bc, st->q, kc, vc, st->att_out, nrow, pos_at, slots, stride, s->n_ctx,
                                    (int)c->n_head, (int)c->n_head_kv, hd);
                }
            }
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
            if (!direct) /* this run's rows into its slot (f16: rounded as stored) */
                store_run(s, st, l, R, k, v);
            /* the run's K/V rows are in its slot now: one causal attention for its rows */
            float *out = st->att_out + (size_t)R->t0 * qd;
            bool sinks = L->attn_sinks.data || window; /* gpt-oss: sinks, and every other layer windowed */
            if (!s->kv.fixed) { /* paged: the attention reads the rows through the slot's block table */
                void *kp = kv_layer(s, st, st->k_cache, l), *vp = kv_layer(s, st, st->v_cache, l);
                const int32_t *tab = st->kv_tables + (size_t)R->slot * s->kv.per_slot;
                if (sinks)
                    B->attention_sinks(bc, q, kp, vp, f16, tab, s->kv.block_rows, out, st->att, R->n, R->pos,
                                       (int)c->n_head, (int)c->n_head_kv, hd, L->attn_sinks.data, window);
                else
                    B->attention_paged(bc, q, kp, vp, f16, tab, s->kv.block_rows, out, st->att, R->n, R->pos,
                                       (int)c->n_head, (int)c->n_head_kv, hd);
                continue;
            }
            void *kc = slot_rows(s, st, st->k_cache, l, R->slot), *vc = slot_rows(s, st, st->v_cache, l, R->slot);
            if (sinks)
                B->attention_sinks(bc, q, kc, vc, f16, NULL, 0, out, st->att, R->n, R->pos, (int)c->n_head,
                                   (int)c->n_head_kv, hd, L->attn_sinks.data, window);
            else if (f16)
                B->attention_f16(bc, q, kc, vc, out, st->att, R->n, R->pos, (int)c->n_head, (int)c->n_head_kv, hd);
            else
                B->attention(bc, q, kc, vc, out, st->att, R->n, R->pos, (int)c->n_head, (int)c->n_head_kv, hd);
        }
        if (pc)
            phase_clock_mark(B, bc, PHASE_ATTN);
        if (c->residual_scale != 1.0f) { /* granitemoe */
            forward_arch_attn_residual(c, st, L, n);
        } else {
            matmul_residual(B, bc, &L->wo, st->att_out, st->x, st->xb2, n); /* x (n, E) += wo att_out */
            if (L->bo.data) /* gpt-oss's output bias */
                B->add_bias(bc, st->x, L->bo.data, n, E);
        }
        if (pc)
            phase_clock_mark(B, bc, PHASE_WO);

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
            int rc = c->arch == ARCH_GPTOSS ? forward_oai_moe_ffn(s, st, l, n, routed) : forward_moe_ffn(s, st, l, n, routed);
            if (rc < 0)
                return rc;
            if (rc == 0)
                B->axpy(bc, st->x, st->moe_out, 1.0f, n * E);
            if (L->ffn_gate_shexp.data)
                forward_shared_expert_ffn(B, bc, st, L, n);
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
            upload_rows(s, &st->be, st->xb + (size_t)R->t0 * E, R->embd + (size_t)(l + 1) * E, R->n, (int)E,
                        R->embd_stride);
            B->axpy(bc, st->x + (size_t)R->t0 * E, st->xb + (size_t)R->t0 * E, 1.0f, R->n * E);
        }
        forward_arch_ffn_end(c, st, n);
        if (pc)
            phase_clock_mark(B, bc, PHASE_FFN);
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
    st->be.i->download(st->be.ctx, s->host_route, forward_layer_route(s, st, st->l0, 0),
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
    mrope = mrope || c->arch == ARCH_GPTOSS || s->m->rope_freqs; /* sinks, windows, rope tables: not in the _at ops */
    bool pc = phase_clock_on();
    if (pc)
        phase_clock_start(s->stage[0].be.i, s->stage[0].be.ctx, n);
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
        const struct backend_i *B = st->be.i; /* the rows' ops of the cache's layout and type */
        st->rows = rows && (s->kv.fixed ? B->qk_norm_rope_at && B->attention_at &&
                                              (!s->kv_f16 || (B->qk_norm_rope_at_f16 && B->attention_at_f16))
                                        : B->qk_norm_rope_at_paged && B->attention_at_paged);
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
            upload_rows(s, &st->be, x, R->embd, R->n, (int)E, R->embd_stride);
        }
    }
    if (one_embed)
        st->be.i->get_rows(st->be.ctx, &st->tok_embd, ids, nr, st->x);
    if (pc)
        phase_clock_mark(st->be.i, st->be.ctx, PHASE_EMBED);
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
    if (pc) /* a recorded decode step's layers count as ffn */
        phase_clock_mark(st->be.i, st->be.ctx, PHASE_FFN);
    step_logits(s, st, rn, nr, seqs);
    if (pc)
        phase_clock_mark(st->be.i, st->be.ctx, PHASE_LOGITS);
    for (int i = 0; i < s->n_stage; i++)
        if (s->stage[i].from_table)
            count_table_step(s, &s->stage[i], n);
    if (pc) {
        phase_clock_mark(st->be.i, st->be.ctx, PHASE_BOOK);
        phase_clock_stop();
    }
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
        /* the blocks its rows go into (the scheduler has taken them already: then a no-op) */
        int rc = forward_kv_reserve(s, q->slot, q->pos, q->pos + q->n);
        if (rc < 0)
            return rc;
        q->logits = NULL;
        q->pick = -1;
        total += q->n;
    }
    /* Paged: the step's slots' block tables (as reserved, shared or copied since the last step)
     * into every stage's memory, where its attention reads them: the entries this step reads,
     * for a slot whose entries changed since they were last sent (a new block every block_rows
     * decode steps, a new prompt), not every slot every step. An upload is ordered before the
     * ops queued after it and after those before it (which may still read the old entries). */
    for (int i = 0; i < n_seq && !s->kv.fixed; i++) {
        const struct forward_seq *q = &seqs[i];
        size_t entries = (size_t)kv_blocks_for(&s->kv, q->pos + q->n), at = (size_t)q->slot * s->kv.per_slot;
        size_t bytes = entries * sizeof(int32_t);
        const int32_t *tab = kv_blocks_table(&s->kv, q->slot);
        if (!memcmp(s->kv_sent + at, tab, bytes))
            continue;
        for (int k = 0; k < s->n_stage; k++) {
            struct forward_stage *st = &s->stage[k];
            st->be.i->upload(st->be.ctx, st->kv_tables + at, tab, bytes);
        }
        memcpy(s->kv_sent + at, tab, bytes);
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
