/* forward.c - the forward pass's stages: what each holds and where (its resident weights,
 * KV cache and activation buffers, sized and charged to its device's ledger), their setup and
 * teardown, and which buffers a chunk runs in (the decode set, or the prefill set, borrowed
 * from the expert cache's tail where that is the plan). The evaluation itself is
 * forward_eval.c. */
#include "forward.h"
#include "forward_internal.h"
#include "memory/device.h"
#include "memory/expert_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t forward_kv_bytes(const struct model *m, int n_ctx, enum kv_type kv)
{
    size_t kvd = (size_t)m->cfg.n_head_kv * m->cfg.head_dim;
    return kv_parts(m) * (size_t)m->cfg.n_layer * (size_t)n_ctx * kvd * kv_elem(kv);
}

size_t forward_kv_pool_bytes(const struct model *m, uint32_t l0, uint32_t l1, size_t rows, enum kv_type kv)
{
    return forward_kv_bytes(m, 1, kv) / m->cfg.n_layer * (l1 - l0) * rows;
}

/* Whether model m's attention has sinks or sliding windows (gpt-oss): attention_sinks' rows. */
static bool has_sink_attention(const struct model *m)
{
    bool sinks = m->cfg.arch == ARCH_GPTOSS;
    for (uint32_t l = 0; l < m->cfg.n_layer && !sinks; l++)
        sinks = m->layers[l].attn_sinks.data || model_layer_window(&m->cfg, l);
    return sinks;
}

static bool is_cuda(const struct backend *be)
{
    return be->i->name && !strcmp(be->i->name, "cuda");
}

static int cuda_paged = -1; /* -1: TIDE_CUDA_PAGED not read yet */

int forward_set_cuda_paged(int on)
{
    if (cuda_paged < 0) {
        const char *e = getenv("TIDE_CUDA_PAGED");
        cuda_paged = !(e && !strcmp(e, "0")); /* on since the paged kernels passed test-gpu on an H100 */
    }
    int old = cuda_paged;
    if (on >= 0)
        cuda_paged = on != 0;
    return old;
}

const char *forward_kv_paged_why(const struct model *m, const struct backend *be, int n)
{
    if (m->cfg.kv_lora_rank)
        return "deepseek2's MLA attention (forward_mla.c) reads a slot's rows in one piece";
    for (int i = 0; i < n && has_sink_attention(m); i++)
        if (!be[i].i->attention_sinks_any_cache)
            return "a device's sink and sliding-window attention (gpt-oss) reads a slot's rows in one piece";
    for (int i = 0; i < n; i++) {
        if (!be[i].i->attention_paged)
            return "a device's backend has no paged attention";
        if (is_cuda(&be[i]) && !forward_set_cuda_paged(-1))
            return "TIDE_CUDA_PAGED=0 keeps CUDA devices on one block of context a slot";
    }
    return NULL;
}

const char *forward_kv_f16_why(const struct model *m, const struct backend *be, int n)
{
    const struct model_config *c = &m->cfg;
    if (c->kv_lora_rank) /* forward_mla.c reads the latent rows as f32 in its own products */
        return "deepseek2's MLA latent cache has no f16 form yet";
    for (int i = 0; i < n && has_sink_attention(m); i++) {
        if (!be[i].i->attention_sinks_any_cache)
            return "a device's sink and sliding-window attention (gpt-oss) reads f32 rows only";
        /* the CUDA sink kernel's f16 and paged forms go with the paged kernels' switch */
        if (is_cuda(&be[i]) && !forward_set_cuda_paged(-1))
            return "TIDE_CUDA_PAGED=0 keeps gpt-oss's CUDA caches f32, one block a slot";
    }
    if (c->head_dim % 8 || c->head_dim > 256)
        return "the f16 attention takes a head_dim that is a multiple of 8 up to 256";
    for (int i = 0; i < n; i++)
        if (!be[i].i->store_f16 || !be[i].i->attention_f16)
            return "a device's backend has no f16 attention";
    return NULL;
}

static size_t tbytes(const struct tensor *t) { return t->data ? t->row_bytes * t->ne[1] : 0; }

/* At most this many resident tensors a layer. */
#define LAYER_MAX_TENSORS 32

/* The resident tensors of layer l, in a fixed order: a shared expert (qwen2moe) is one of
 * them, on the layer's device and counted as weights, never in the expert cache; so are
 * gpt-oss's per-expert biases (small: a row an expert). */
static int layer_tensors(struct model_layer *L, struct tensor **out)
{
    struct tensor *all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->bq, &L->bk, &L->bv,
                            &L->q_norm, &L->k_norm, &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                            &L->ffn_gate_inp, &L->ffn_gate_inp_shexp, &L->ffn_gate_shexp, &L->ffn_up_shexp,
                            &L->ffn_down_shexp, &L->bo, &L->attn_sinks, &L->ffn_gate_inp_b, &L->gate_exps_b,
                            &L->up_exps_b, &L->down_exps_b, &L->wkv_a_mqa, &L->kv_a_norm, &L->wk_b, &L->wv_b};
    _Static_assert(sizeof all / sizeof all[0] <= LAYER_MAX_TENSORS, "layer_tensors' array");
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->data)
            out[n++] = all[i];
    return n;
}

static bool output_tied(const struct model *m) { return m->output.data == m->tok_embd.data; }

struct buf_dims { size_t E, qd, ff, ne, V, att, kvd; };

static struct buf_dims dims(const struct model *m, int n_ctx)
{
    const struct model_config *c = &m->cfg;
    struct buf_dims d;
    d.E = c->n_embd;
    d.qd = (size_t)c->n_head * c->head_dim;
    d.ff = c->n_ff > c->n_ff_exp ? c->n_ff : c->n_ff_exp;
    if (c->n_ff_shexp > d.ff)
        d.ff = c->n_ff_shexp; /* hb, hb2 hold the shared expert's hidden rows too */
    d.ne = c->n_expert ? c->n_expert : 1;
    d.V = c->n_vocab;
    d.att = (size_t)c->n_head * n_ctx;
    d.kvd = (size_t)c->n_head_kv * c->head_dim;
    return d;
}

/* The route() output of a stage: max_batch tokens' rows, then n_seq rows per layer (a decode
 * step's tokens, kept until the step's hits are counted). */
static size_t route_bytes(const struct model *m, int max_batch, int n_seq, uint32_t n_layers)
{
    if (!m->cfg.n_expert)
        return 0;
    return ((size_t)max_batch + (size_t)n_layers * n_seq) * 2 * m->cfg.n_expert_used * sizeof(int32_t);
}

/* kv_new, step_at and rows_at of a stage */
static size_t step_bytes(const struct model *m, int n_seq)
{
    return 2 * sizeof(float) * m->cfg.n_head_kv * m->cfg.head_dim + (2 + 2 * (size_t)n_seq) * sizeof(int32_t);
}

/* A paged stage's copy of the block tables: n_seq tables of per_slot entries; counted by
 * forward_stage_size (which does not know the block size) at the smallest block, 16 rows. */
static size_t kv_tables_bytes(int n_seq, int per_slot) { return (size_t)n_seq * per_slot * sizeof(int32_t); }

/* Batch buffers for B tokens, in the order of struct stage_bufs. */
static void batch_sizes(const struct model *m, int n_ctx, int B, size_t *sizes)
{
    struct buf_dims d = dims(m, n_ctx);
    size_t f = sizeof(float);
    size_t s[FORWARD_N_BATCH_BUFS] = {B * d.E * f,  B * d.E * f,  B * d.E * f,   B * d.qd * f,
                                      B * d.qd * f, B * d.ff * f, B * d.ff * f,  B * d.ne * f,
                                      B * d.E * f,  B * d.E * f,  B * d.kvd * f, B * d.kvd * f};
    memcpy(sizes, s, sizeof s);
}

static float **bufs_of(struct stage_bufs *b, int i)
{
    float **all[FORWARD_N_BATCH_BUFS] = {&b->x,  &b->xb,     &b->xb2,     &b->q,     &b->att_out, &b->hb,
                                         &b->hb2, &b->router, &b->moe_in, &b->moe_out, &b->k_new,  &b->v_new};
    return all[i];
}

static void use_bufs(struct forward_stage *st, const struct stage_bufs *b)
{
    st->x = b->x; st->xb = b->xb; st->xb2 = b->xb2; st->q = b->q; st->att_out = b->att_out;
    st->hb = b->hb; st->hb2 = b->hb2; st->router = b->router; st->moe_in = b->moe_in; st->moe_out = b->moe_out;
    st->k_new = b->k_new; st->v_new = b->v_new;
}

void forward_stage_size(const struct model *m, int n_ctx, int n_seq, int max_batch, uint32_t l0, uint32_t l1,
                        bool first, bool last, enum kv_type kv, struct forward_stage_bytes *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t l = l0; l < l1; l++) {
        struct model_layer L = m->layers[l];
        struct tensor *ts[LAYER_MAX_TENSORS];
        int n = layer_tensors(&L, ts);
        for (int i = 0; i < n; i++)
            out->weights += tbytes(ts[i]);
    }
    if (first)
        out->weights += tbytes(&m->tok_embd);
    if (last) {
        out->weights += tbytes(&m->output_norm);
        if (!(first && output_tied(m)))
            out->weights += tbytes(&m->output);
    }
    if (n_seq < 1)
        n_seq = 1;
    out->kv = forward_kv_bytes(m, n_ctx, kv) / m->cfg.n_layer * (l1 - l0) * (size_t)n_seq;
    struct buf_dims d = dims(m, n_ctx);
    size_t sizes[FORWARD_N_BATCH_BUFS];
    batch_sizes(m, n_ctx, n_seq, sizes);
    for (int i = 0; i < FORWARD_N_BATCH_BUFS; i++)
        out->workspace += sizes[i];
    size_t head_out = (d.V + 1) * sizeof(float) + sizeof(struct sample_logprob); /* logits, pick, logprobs a row */
    out->workspace += d.att * sizeof(float) + (last ? (size_t)n_seq * head_out : 0);
    out->workspace += route_bytes(m, max_batch, n_seq, l1 - l0) + step_bytes(m, n_seq);
    out->workspace += kv_tables_bytes(n_seq, (n_ctx + 15) / 16);
    batch_sizes(m, n_ctx, max_batch, sizes);
    for (int i = 0; i < FORWARD_N_BATCH_BUFS; i++)
        out->prefill += sizes[i];
}

/* Allocation for a stage: through the device ledger when there is one. */
static void *stage_alloc(struct forward_stage *st, enum mem_kind k, size_t bytes)
{
    if (!bytes)
        return NULL;
    void *p = st->dev ? device_alloc(st->dev, k, bytes) : st->be.i->alloc(st->be.ctx, bytes);
    if (!p)
        return NULL;
    if (st->n_owned == st->cap_owned) {
        int cap = st->cap_owned ? st->cap_owned * 2 : 64;
        void **o = realloc(st->owned, cap * sizeof(void *));
        if (o) st->owned = o;
        size_t *ob = realloc(st->owned_bytes, cap * sizeof(size_t));
        if (ob) st->owned_bytes = ob;
        int *ok = realloc(st->owned_kind, cap * sizeof(int));
        if (ok) st->owned_kind = ok;
        if (!o || !ob || !ok) {
            if (st->dev) device_free(st->dev, k, p, bytes); else st->be.i->free(st->be.ctx, p);
            return NULL;
        }
        st->cap_owned = cap;
    }
    st->owned[st->n_owned] = p;
    st->owned_bytes[st->n_owned] = bytes;
    st->owned_kind[st->n_owned++] = (int)k;
    return p;
}

/* Point t at a device copy of its bytes (or leave it in place without a device). */
static int stage_place(struct forward_stage *st, struct tensor *t)
{
    if (!st->dev || !t->data)
        return 0;
    size_t b = tbytes(t);
    void *p = stage_alloc(st, MEM_WEIGHTS, b);
    if (!p)
        return TIDE_ERANGE;
    st->be.i->upload(st->be.ctx, p, t->data, b);
    t->data = p;
    return 0;
}

/* The KV cache written once at start-up (zeros), as llama.cpp clears its own: on a CPU device
 * the cache is fresh anonymous memory in huge pages, and the first write into each page (a
 * slot's first prompt, every layer) made the kernel find, zero and map 2 MiB then: measured on
 * 2 cores, the first prompt in each slot spent 100-400 ms more in attention than the next one
 * did. Paying it here gives every request the same latency, and the memory the plan counted is
 * committed from the start. */
static void kv_clear(struct forward_stage *st, void *cache, size_t bytes)
{
    const size_t chunk = (size_t)1 << 28; /* floats a zero op takes at once (its n is an int) */
    for (size_t f = 0, n = bytes / sizeof(float); f < n; f += chunk)
        st->be.i->zero(st->be.ctx, (float *)cache + f, (int)(n - f < chunk ? n - f : chunk));
}

static int stage_init(struct forward_state *s, struct forward_stage *st, const struct forward_stage_spec *sp)
{
    const struct model *m = s->m;
    st->dev = sp->dev;
    st->be = sp->dev ? sp->dev->be : sp->be;
    st->l0 = sp->l0;
    st->l1 = sp->l1;
    st->cache = sp->cache;
    st->layers = calloc(sp->l1 - sp->l0 ? sp->l1 - sp->l0 : 1, sizeof(struct model_layer));
    if (!st->layers)
        return TIDE_ENOMEM;
    int rc = 0;
    for (uint32_t l = st->l0; l < st->l1 && !rc; l++) {
        struct model_layer *L = &st->layers[l - st->l0];
        *L = m->layers[l];
        struct tensor *ts[LAYER_MAX_TENSORS];
        int n = layer_tensors(L, ts);
        for (int i = 0; i < n && !rc; i++)
            rc = stage_place(st, ts[i]);
    }
    if (st->first) {
        st->tok_embd = m->tok_embd;
        if (!rc) rc = stage_place(st, &st->tok_embd);
    }
    if (st->last) {
        st->output_norm = m->output_norm;
        if (!rc) rc = stage_place(st, &st->output_norm);
        st->output = m->output;
        if (st->first && output_tied(m)) st->output.data = st->tok_embd.data;
        else if (!rc) rc = stage_place(st, &st->output);
    }
    if (rc)
        return rc;
    size_t kvh = forward_kv_pool_bytes(m, st->l0, st->l1, (size_t)s->kv.n_blocks * s->kv.block_rows,
                                       s->kv_f16 ? KV_F16 : KV_F32) / kv_parts(m);
    if (kvh) {
        st->k_cache = stage_alloc(st, MEM_KV, kvh);
        st->v_cache = kv_parts(m) == 1 ? st->k_cache : stage_alloc(st, MEM_KV, kvh); /* MLA: V is K's rows */
        if (!st->k_cache || !st->v_cache)
            return TIDE_ERANGE;
        kv_clear(st, st->k_cache, kvh);
        if (st->v_cache != st->k_cache)
            kv_clear(st, st->v_cache, kvh);
    }
    size_t sizes[FORWARD_N_BATCH_BUFS];
    batch_sizes(m, s->n_ctx, s->n_seq, sizes);
    for (int i = 0; i < FORWARD_N_BATCH_BUFS; i++)
        if (!(*bufs_of(&st->dec, i) = stage_alloc(st, MEM_WORKSPACE, sizes[i])))
            return TIDE_ERANGE;
    struct buf_dims d = dims(m, s->n_ctx);
    st->att = stage_alloc(st, MEM_WORKSPACE, d.att * sizeof(float));
    if (!st->att)
        return TIDE_ERANGE;
    size_t head_out = (d.V + 1) * sizeof(float) + sizeof(struct sample_logprob); /* as forward_stage_size counts it */
    if (st->last && !(st->logits = stage_alloc(st, MEM_WORKSPACE, (size_t)s->n_seq * head_out)))
        return TIDE_ERANGE;
    size_t rb = route_bytes(m, s->max_batch, s->n_seq, st->l1 - st->l0);
    if (rb && !(st->route = stage_alloc(st, MEM_WORKSPACE, rb)))
        return TIDE_ERANGE;
    uint8_t *sb = stage_alloc(st, MEM_WORKSPACE, step_bytes(m, s->n_seq));
    if (!sb)
        return TIDE_ERANGE;
    size_t kvb = 2 * sizeof(float) * m->cfg.n_head_kv * m->cfg.head_dim;
    st->kv_new = (float *)sb; /* first: as aligned as the block */
    st->step_at = (int32_t *)(sb + kvb);
    st->rows_at = st->step_at + 2;
    if (!s->kv.fixed && !(st->kv_tables = stage_alloc(st, MEM_WORKSPACE, kv_tables_bytes(s->n_seq, s->kv.per_slot))))
        return TIDE_ERANGE;
    const struct backend_i *B = st->be.i;
    /* a recording reads positions, slots and (paged) block tables from device memory: the
     * rows' ops of the cache's layout and type must be there */
    bool at_ops = s->kv.fixed ? B->qk_norm_rope_at && B->attention_at &&
                                    (!s->kv_f16 || (B->qk_norm_rope_at_f16 && B->attention_at_f16))
                              : B->qk_norm_rope_at_paged && B->attention_at_paged;
    st->graph_off = !at_ops || !B->graph_begin || (st->first && !B->get_row_at) || getenv("TIDE_NO_GRAPHS");
    /* Can a decode step take its experts from a device table? Asked once per layer with the
     * host views (the same types and shapes as the cached copies). */
    st->table_ok = m->cfg.n_expert && st->cache && st->be.i->moe_ffn_table &&
                   m->cfg.n_expert_used <= MOE_FUSED_MAX_K;
    for (uint32_t l = st->l0; l < st->l1 && st->table_ok; l++) {
        struct expert_weights ew;
        model_expert_host(m, l, 0, &ew);
        st->table_ok = st->be.i->moe_ffn_table(st->be.ctx, &ew, NULL, NULL, (int)m->cfg.n_expert_used, NULL,
                                               NULL, false) == 0;
    }
    use_bufs(st, &st->dec);
    return 0;
}

int forward_setup_prefill(struct forward_state *s, int i, enum prefill_mode mode)
{
    struct forward_stage *st = &s->stage[i];
    if (st->prefill == PREFILL_OWN || mode == PREFILL_NONE)
        return 0;
    if (mode == PREFILL_BORROW && st->cache) {
        st->prefill = PREFILL_BORROW;
        return 0;
    }
    size_t sizes[FORWARD_N_BATCH_BUFS];
    batch_sizes(s->m, s->n_ctx, s->max_batch, sizes);
    for (int k = 0; k < FORWARD_N_BATCH_BUFS; k++)
        if (!(*bufs_of(&st->pre, k) = stage_alloc(st, MEM_WORKSPACE, sizes[k])))
            return TIDE_ERANGE; /* the blocks taken so far are freed with the stage */
    st->prefill = PREFILL_OWN;
    return 0;
}

static void stage_free(struct forward_stage *st)
{
    if (st->graph)
        st->be.i->graph_free(st->be.ctx, st->graph);
    for (int i = st->n_owned - 1; i >= 0; i--) {
        if (st->dev)
            device_free(st->dev, (enum mem_kind)st->owned_kind[i], st->owned[i], st->owned_bytes[i]);
        else
            st->be.i->free(st->be.ctx, st->owned[i]);
    }
    free(st->owned);
    free(st->owned_bytes);
    free(st->owned_kind);
    free(st->layers);
    memset(st, 0, sizeof *st);
}

int forward_init_stages(struct forward_state *s, const struct model *m, int n_ctx, int n_seq, int max_batch,
                        const struct forward_stage_spec *sp, int n_stage)
{
    memset(s, 0, sizeof *s);
    if (n_ctx <= 0 || n_stage <= 0 || n_stage > FORWARD_MAX_STAGES || max_batch <= 0 || n_seq <= 0)
        return TIDE_EINVAL;
    if (max_batch < n_seq)
        max_batch = n_seq; /* a step holds a decode row for every sequence */
    for (int i = 0; i < n_stage; i++) /* contiguous cover of all layers */
        if (sp[i].l0 != (i ? sp[i - 1].l1 : 0) || sp[i].l1 < sp[i].l0)
            return TIDE_EINVAL;
    if (sp[n_stage - 1].l1 != m->cfg.n_layer)
        return TIDE_EINVAL;
    s->m = m;
    s->n_ctx = n_ctx;
    s->n_seq = n_seq;
    s->max_batch = max_batch;
    s->n_stage = n_stage;
    struct backend bes[FORWARD_MAX_STAGES];
    for (int i = 0; i < n_stage; i++)
        bes[i] = sp[i].dev ? sp[i].dev->be : sp[i].be; /* as stage_init */
    s->kv_f16 = sp[0].kv_type == KV_F16 && !forward_kv_f16_why(m, bes, n_stage);
    /* paged where the model and every backend can; else a block of n_ctx per slot */
    int br = sp[0].kv_block_rows > 0 && !forward_kv_paged_why(m, bes, n_stage) ? sp[0].kv_block_rows : 0;
    int per_slot = br ? (n_ctx + br - 1) / br : 1;
    int rc = kv_blocks_init(&s->kv, n_seq, n_ctx, br, br && sp[0].kv_blocks > 0 ? sp[0].kv_blocks : n_seq * per_slot);
    if (rc < 0) {
        forward_free(s);
        return rc;
    }
    /* A decode step's sequences share the rows' ops (docs/DESIGN.md; on one H200 at 32 clients
     * 610 -> 746 tok/s, docs/BENCHMARKS.md). TIDE_DECODE_ROWS=0 runs them one sequence at a
     * time, for A/B runs. */
    const char *dr = getenv("TIDE_DECODE_ROWS");
    s->decode_rows = !(dr && dr[0] == '0');
    struct buf_dims d = dims(m, n_ctx);
    size_t B = (size_t)max_batch, nu = m->cfg.n_expert_used ? m->cfg.n_expert_used : 1;
    s->host_x = malloc(B * d.E * sizeof(float));
    size_t rows = B > (size_t)m->cfg.n_layer * n_seq ? B : (size_t)m->cfg.n_layer * n_seq;
    s->host_route = malloc(rows * 2 * nu * sizeof(int32_t));
    s->moe_sel = malloc(B * nu * sizeof(int));
    s->moe_w = malloc(B * nu * sizeof(float));
    s->moe_tok = malloc(B * nu * sizeof(int));
    s->moe_tokw = malloc(B * nu * sizeof(float));
    s->moe_off = malloc((d.ne + 1) * sizeof(int));
    s->iota = malloc(B * sizeof(int));
    for (size_t i = 0; s->iota && i < B; i++)
        s->iota[i] = (int)i;
    size_t n_ent = s->kv.fixed ? 0 : (size_t)n_seq * s->kv.per_slot;
    s->kv_sent = n_ent ? malloc(n_ent * sizeof(int32_t)) : NULL;
    for (size_t i = 0; s->kv_sent && i < n_ent; i++)
        s->kv_sent[i] = -2; /* no table entry is -2: the first step sends every slot's */
    /* downloaded every token: page-locked when the last stage's backend offers it */
    struct backend lb = sp[n_stage - 1].dev ? sp[n_stage - 1].dev->be : sp[n_stage - 1].be; /* as stage_init */
    size_t lbytes = (size_t)n_seq * d.V * sizeof(float);
    if (lb.i && lb.i->host_alloc && (s->logits = lb.i->host_alloc(lb.ctx, lbytes))) {
        s->logits_free = lb.i->host_free;
        s->logits_ctx = lb.ctx;
    }
    if (!s->logits)
        s->logits = malloc(lbytes);
    if (!s->host_x || !s->host_route || !s->moe_sel || !s->moe_w || !s->moe_tok || !s->moe_tokw || !s->moe_off ||
        !s->logits || !s->iota || (n_ent && !s->kv_sent)) {
        forward_free(s);
        return TIDE_ENOMEM;
    }
    for (int i = 0; i < n_stage; i++) {
        s->stage[i].first = i == 0;
        s->stage[i].last = i == n_stage - 1;
        rc = stage_init(s, &s->stage[i], &sp[i]);
        if (rc < 0) {
            forward_free(s);
            return rc;
        }
    }
    return 0;
}

int forward_init(struct forward_state *s, const struct model *m, struct backend be, int n_ctx)
{
    struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m->cfg.n_layer};
    int rc = forward_init_stages(s, m, n_ctx, 1, FORWARD_DEFAULT_BATCH, &sp, 1);
    if (rc == 0 && (rc = forward_setup_prefill(s, 0, PREFILL_OWN)) < 0)
        forward_free(s);
    return rc;
}

void forward_free(struct forward_state *s)
{
    for (int i = 0; i < FORWARD_MAX_STAGES; i++)
        if (s->stage[i].layers || s->stage[i].n_owned)
            stage_free(&s->stage[i]);
    free(s->host_x);
    free(s->host_route);
    free(s->moe_sel);
    free(s->moe_w);
    free(s->moe_tok);
    free(s->moe_tokw);
    free(s->moe_off);
    free(s->iota);
    free(s->kv_sent);
    kv_blocks_free(&s->kv);
    if (s->logits_free)
        s->logits_free(s->logits_ctx, s->logits);
    else
        free(s->logits);
    memset(s, 0, sizeof *s);
}

/* Point every stage at buffers for a chunk of up to n rows: the decode set for up to n_seq
 * rows (a decode step of every sequence never borrows), else the prefill set (borrowing cache
 * segments where that is the plan). Returns the chunk size the buffers allow: n; fewer when the
 * borrowed segments are too small for max_batch rows' buffers but hold half as many (halving
 * down to FORWARD_DEFAULT_BATCH, so only a CUDA chunk is ever cut: a CPU plan borrows for 64 or
 * runs n_seq rows at a time, as before); n_seq when some stage has no prefill buffer. */
int forward_bind_buffers(struct forward_state *s, int n)
{
    bool ok = false;
    int B = s->max_batch;
    for (;;) {
        ok = n > s->n_seq;
        size_t sizes[FORWARD_N_BATCH_BUFS];
        batch_sizes(s->m, s->n_ctx, B, sizes);
        bool none = false;
        for (int i = 0; i < s->n_stage && ok; i++) {
            struct forward_stage *st = &s->stage[i];
            if (st->prefill == PREFILL_NONE)
                ok = false, none = true;
            else if (st->prefill == PREFILL_BORROW) {
                void *blk[FORWARD_N_BATCH_BUFS];
                ok = expert_cache_borrow(st->cache, sizes, FORWARD_N_BATCH_BUFS, blk) == 0;
                for (int k = 0; ok && k < FORWARD_N_BATCH_BUFS; k++)
                    *bufs_of(&st->pre, k) = blk[k];
            }
        }
        if (ok || n <= 1 || none || B / 2 < FORWARD_DEFAULT_BATCH)
            break;
        for (int i = 0; i < s->n_stage; i++) /* give back what this size took, try half */
            if (s->stage[i].prefill == PREFILL_BORROW && s->stage[i].cache)
                expert_cache_unborrow(s->stage[i].cache);
        B /= 2;
    }
    for (int i = 0; i < s->n_stage; i++) {
        struct forward_stage *st = &s->stage[i];
        if (!ok && st->prefill == PREFILL_BORROW && st->cache)
            expert_cache_unborrow(st->cache);
        use_bufs(st, ok ? &st->pre : &st->dec);
    }
    return ok ? (n < B ? n : B) : (n < s->n_seq ? n : s->n_seq);
}

int forward_step_rows(const struct forward_state *s)
{
    for (int i = 0; i < s->n_stage; i++)
        if (s->stage[i].prefill == PREFILL_NONE)
            return s->n_seq;
    return s->max_batch;
}

void forward_unbind_buffers(struct forward_state *s)
{
    for (int i = 0; i < s->n_stage; i++) {
        struct forward_stage *st = &s->stage[i];
        if (st->prefill == PREFILL_BORROW && st->cache)
            expert_cache_unborrow(st->cache);
        use_bufs(st, &st->dec);
    }
}
