/* backend_cpu_moe.c - the CPU backend's grouped MoE (backend_i.moe_ffn_batch): f16 experts and
 * the quantised types the CPU's int8 products take (cpu_quant_has).
 *
 * A step of several tokens (a decode step of several sequences, a prefill chunk) has its (token,
 * expert) pairs grouped by expert (struct moe_batch). Run as per-expert ops (gather, gate, up,
 * swiglu, down, scatter) that is six ops an expert, most of them waking the thread pool: at 4
 * sequences of an 8-layer model with ~6 experts a layer, ~300 pool jobs a decode step, each of a
 * few microseconds of work, with a wake-up, a tail where one thread waits, and a join. Here a
 * call is a few pool jobs: (quantised types) every pair's input quantised; every group's gate and
 * up rows with their swiglu, claimed a group's block of rows at a time; (quantised) every pair's
 * hidden row quantised; every group's down rows. The gathers and the scatter run on the calling
 * thread (or the rows ops' pool split, for a prefill).
 *
 * The bits are the per-expert ops': each (row, vector) product is cpu_f16_rows' or
 * cpu_quant_rows' on cpu_quant_act's bytes (whose result does not depend on the rows or vectors
 * beside it), each swiglu element the same expression (cpu_silu_mul), and the scatter is
 * cpu_rows_scatter_axpy group by group in ascending group order, into a sum that the last call
 * of a layer adds to y as an axpy with a = 1. So a reply is the same with this op or without,
 * batched or alone (the unit tests cpu_moe/... and batch/...). */
#include "backend_cpu_moe.h"
#include "backend_cpu_rows.h"
#include "backend_cpu_attention.h" /* cpu_claim, cpu_pool_run */
#include "cpu_f16.h"
#include "cpu_quant.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

#define MOE_ROW_BLOCK 64 /* rows of one product a claim takes (a multiple of the tiles' 16) */

struct moe_item {
    int g, r0, r1;
};

/* What a layer's calls keep between them: the sum of its groups so far, and the buffers. */
struct moe_state {
    float *sum;            /* (n, E) the weighted down rows of the groups so far */
    size_t sum_n;
    float *xin, *hb, *hb2, *out; /* (pairs, E), (pairs, F) twice, (pairs, E) */
    size_t pairs_cap, E, F;
    uint8_t *xq, *hq;      /* the pairs' inputs and hidden rows quantised (quantised types) */
    size_t xq_n, hq_n;
    struct moe_item *items;
    size_t items_cap;
};

enum moe_phase { PH_QUANT_X, PH_GATE_UP, PH_QUANT_H, PH_DOWN };

struct moe_job {
    void *ctx;
    const struct moe_batch *b;
    struct moe_state *st;
    int E, F, n_items, next, p0; /* p0: the call's first pair */
    size_t xq_per, hq_per;       /* bytes of a quantised input / hidden row (0: f16) */
    enum moe_phase phase;
};

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (*cap >= want)
        return 0;
    void *q = realloc(*p, want * elem);
    if (!q)
        return TIDE_ENOMEM;
    *p = q;
    *cap = want;
    return 0;
}

static int state_fit(struct moe_state *st, const struct moe_batch *b, int E, int F, size_t n_items, size_t xq_per,
                     size_t hq_per)
{
    size_t pairs = (size_t)(b->off[b->g1] - b->off[b->g0]), sum = (size_t)b->n * E;
    if (grow((void **)&st->sum, &st->sum_n, sum, sizeof(float)) ||
        grow((void **)&st->items, &st->items_cap, n_items, sizeof(struct moe_item)) ||
        grow((void **)&st->xq, &st->xq_n, pairs * xq_per, 1) || grow((void **)&st->hq, &st->hq_n, pairs * hq_per, 1))
        return TIDE_ENOMEM;
    if (st->pairs_cap < pairs || st->E != (size_t)E || st->F != (size_t)F) {
        free(st->xin);
        free(st->hb);
        free(st->hb2);
        free(st->out);
        st->xin = malloc(sizeof(float) * pairs * E);
        st->out = malloc(sizeof(float) * pairs * E);
        st->hb = malloc(sizeof(float) * pairs * F);
        st->hb2 = malloc(sizeof(float) * pairs * F);
        st->pairs_cap = st->xin && st->out && st->hb && st->hb2 ? pairs : 0;
        st->E = (size_t)E;
        st->F = (size_t)F;
        if (!st->pairs_cap)
            return TIDE_ENOMEM;
    }
    return 0;
}

void cpu_moe_free(void *state)
{
    struct moe_state *st = state;
    if (!st)
        return;
    free(st->sum);
    free(st->xin);
    free(st->hb);
    free(st->hb2);
    free(st->out);
    free(st->xq);
    free(st->hq);
    free(st->items);
    free(st);
}

/* The items of a product phase: each group's rows [0, rows) in blocks of MOE_ROW_BLOCK. */
static int make_items(struct moe_state *st, const struct moe_batch *b, int rows)
{
    int n = 0;
    for (int g = b->g0; g < b->g1; g++)
        for (int r = 0; r < rows; r += MOE_ROW_BLOCK)
            st->items[n++] = (struct moe_item){g, r, r + MOE_ROW_BLOCK < rows ? r + MOE_ROW_BLOCK : rows};
    return n;
}

/* y[t * y_stride + r] for rows r0..r1 of w and cnt vectors: x (f16 weights) or their quantised
 * bytes q (per bytes a vector), as the CPU's matmul computes them */
static void rows_of(const struct tensor *w, int r0, int r1, const float *x, const uint8_t *q, size_t per, int cnt,
                    int cols, float *y, size_t y_stride, float *tbuf)
{
    if (w->type == GGML_TYPE_F16)
        cpu_f16_rows(w->data, w->row_bytes, r0, r1, x, cnt, cols, y, y_stride, tbuf);
    else
        cpu_quant_rows(w->type, w->data, w->row_bytes, r0, r1, q, per, cnt, cols, y, y_stride, CPU_ISA_BEST);
}

static void moe_worker(void *p, int ith, int nth)
{
    struct moe_job *j = p;
    const struct moe_batch *b = j->b;
    struct moe_state *st = j->st;
    int E = j->E, F = j->F;
    (void)nth;
    float *tbuf = cpu_thread_scratch(j->ctx, ith, 8 * (size_t)(E > F ? E : F)); /* grown before the job */
    for (int i; (i = cpu_claim(&j->next, 1, j->n_items)) >= 0;) {
        if (j->phase == PH_QUANT_X) { /* pair i's input, for the gate and up rows' type */
            cpu_quant_act(b->ex[b->g0].gate.type, st->xin + (size_t)i * E, E, st->xq + (size_t)i * j->xq_per);
            continue;
        }
        if (j->phase == PH_QUANT_H) {
            cpu_quant_act(b->ex[b->g0].down.type, st->hb + (size_t)i * F, F, st->hq + (size_t)i * j->hq_per);
            continue;
        }
        const struct moe_item *it = &st->items[i];
        const struct expert_weights *ex = &b->ex[it->g];
        int cnt = b->off[it->g + 1] - b->off[it->g];
        size_t at = (size_t)(b->off[it->g] - j->p0); /* the group's first pair in the buffers */
        if (j->phase == PH_GATE_UP) {
            float *gate = st->hb + at * F, *up = st->hb2 + at * F;
            const float *x = st->xin + at * E;
            const uint8_t *xq = st->xq + at * j->xq_per;
            rows_of(&ex->gate, it->r0, it->r1, x, xq, j->xq_per, cnt, E, gate, (size_t)F, tbuf);
            rows_of(&ex->up, it->r0, it->r1, x, xq, j->xq_per, cnt, E, up, (size_t)F, tbuf);
            for (int t = 0; t < cnt; t++)
                for (int r = it->r0; r < it->r1; r++)
                    gate[(size_t)t * F + r] = cpu_silu_mul(gate[(size_t)t * F + r], up[(size_t)t * F + r]);
        } else {
            rows_of(&ex->down, it->r0, it->r1, st->hb + at * F, st->hq + at * j->hq_per, j->hq_per, cnt, F,
                    st->out + at * E, (size_t)E, tbuf);
        }
    }
}

/* One phase of the call: its n_items claimed by the pool's threads. */
static void run_phase(void *ctx, struct moe_job *j, enum moe_phase phase, int n_items)
{
    j->phase = phase;
    j->n_items = n_items;
    j->next = 0;
    cpu_pool_run(ctx, moe_worker, j);
}

/* Whether this op computes products of w: f16 (where the CPU has the f16 tiles) or a type of
 * the int8 products. */
static bool grouped_type(const struct tensor *w)
{
    return w->type == GGML_TYPE_F16 ? cpu_f16_fast() : cpu_quant_has(w->type);
}

int cpu_moe_ffn_batch(void *ctx, const struct moe_batch *b, const float *x, float *y, bool add)
{
    const struct expert_weights *e0 = &b->ex[b->g0];
    if (!grouped_type(&e0->gate) || e0->up.type != e0->gate.type || !grouped_type(&e0->down))
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0; /* a probe */
    int E = (int)e0->gate.ne[0], F = (int)e0->gate.ne[1];
    bool qx = e0->gate.type != GGML_TYPE_F16, qh = e0->down.type != GGML_TYPE_F16;
    struct moe_job j = {.ctx = ctx, .b = b, .E = E, .F = F, .p0 = b->off[b->g0],
                        .xq_per = qx ? cpu_quant_act_bytes(e0->gate.type, E) : 0,
                        .hq_per = qh ? cpu_quant_act_bytes(e0->down.type, F) : 0};
    void **slot = cpu_moe_state(ctx);
    if (!*slot && !(*slot = calloc(1, sizeof(struct moe_state))))
        return TIDE_ENOMEM;
    struct moe_state *st = j.st = *slot;
    size_t per_group = (size_t)(E > F ? E : F) / MOE_ROW_BLOCK + 2;
    if (state_fit(st, b, E, F, (size_t)(b->g1 - b->g0) * per_group, j.xq_per, j.hq_per) ||
        cpu_thread_scratch_all(ctx, 8 * (size_t)(E > F ? E : F)))
        return TIDE_ENOMEM;
    if (b->g0 == 0)
        memset(st->sum, 0, sizeof(float) * (size_t)b->n * E);
    int pairs = b->off[b->g1] - j.p0;
    for (int g = b->g0; g < b->g1; g++) { /* each group's tokens, together */
        int p = b->off[g], cnt = b->off[g + 1] - p;
        cpu_rows_gather(ctx, st->xin + (size_t)(p - j.p0) * E, x, b->tok + p, cnt, E);
    }
    if (qx)
        run_phase(ctx, &j, PH_QUANT_X, pairs);
    run_phase(ctx, &j, PH_GATE_UP, make_items(st, b, F));
    if (qh)
        run_phase(ctx, &j, PH_QUANT_H, pairs);
    run_phase(ctx, &j, PH_DOWN, make_items(st, b, E));
    for (int g = b->g0; g < b->g1; g++) { /* in ascending group order, as the per-expert scatters */
        int p = b->off[g], cnt = b->off[g + 1] - p;
        cpu_rows_scatter_axpy(ctx, st->sum, st->out + (size_t)(p - j.p0) * E, b->tok + p, b->w + p, cnt, E);
    }
    if (b->g1 == b->n_group) {
        if (add)
            cpu_rows_axpy(ctx, y, st->sum, 1.0f, b->n * E);
        else
            memcpy(y, st->sum, sizeof(float) * (size_t)b->n * E);
    }
    return 0;
}
