/* backend_cpu_moe.c - the CPU backend's grouped MoE (backend_i.moe_ffn_batch) for f16 experts.
 *
 * A step of several tokens (a decode step of several sequences, a prefill chunk) has its (token,
 * expert) pairs grouped by expert (struct moe_batch). Run as per-expert ops (gather, gate, up,
 * swiglu, down, scatter) that is six ops an expert, five of them waking the thread pool: at 4
 * sequences of an 8-layer model with ~6 experts a layer, ~300 pool jobs a decode step, each of a
 * few microseconds of work, with a wake-up, a tail where one thread waits, and a join. Here a
 * call is two pool jobs: every group's gate and up rows with their swiglu, claimed a group's block
 * of rows at a time, then every group's down rows; the gathers and the scatter run on the calling
 * thread (or the rows ops' pool split, for a prefill).
 *
 * The bits are the per-expert ops': each (row, vector) product is cpu_f16_rows' (whose result does
 * not depend on the rows or vectors beside it), each swiglu element the same expression
 * (cpu_silu_mul), and the scatter is cpu_rows_scatter_axpy group by group in ascending group
 * order, into a sum that the last call of a layer adds to y as an axpy with a = 1. So a reply is
 * the same with this op or without, batched or alone (the unit tests batch/...). */
#include "backend_cpu_moe.h"
#include "backend_cpu_rows.h"
#include "backend_cpu_attention.h" /* cpu_claim, cpu_pool_run */
#include "cpu_f16.h"
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
    struct moe_item *items;
    int items_cap;
};

struct moe_job {
    void *ctx;
    const struct moe_batch *b;
    struct moe_state *st;
    int E, F, n_items, next;
    bool down;
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

static int state_fit(struct moe_state *st, const struct moe_batch *b, int E, int F, int n_items)
{
    size_t pairs = (size_t)(b->off[b->g1] - b->off[b->g0]), sum = (size_t)b->n * E;
    if (grow((void **)&st->sum, &st->sum_n, sum, sizeof(float)))
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
    size_t icap = (size_t)st->items_cap;
    if (grow((void **)&st->items, &icap, (size_t)n_items, sizeof(struct moe_item)))
        return TIDE_ENOMEM;
    st->items_cap = (int)icap;
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
    free(st->items);
    free(st);
}

/* The items of one phase: each group's rows [0, rows) in blocks of MOE_ROW_BLOCK. */
static int make_items(struct moe_state *st, const struct moe_batch *b, int rows)
{
    int n = 0;
    for (int g = b->g0; g < b->g1; g++)
        for (int r = 0; r < rows; r += MOE_ROW_BLOCK)
            st->items[n++] = (struct moe_item){g, r, r + MOE_ROW_BLOCK < rows ? r + MOE_ROW_BLOCK : rows};
    return n;
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
        const struct moe_item *it = &st->items[i];
        const struct expert_weights *ex = &b->ex[it->g];
        int cnt = b->off[it->g + 1] - b->off[it->g];
        size_t at = (size_t)(b->off[it->g] - b->off[b->g0]); /* the group's first pair in the buffers */
        if (!j->down) {
            float *gate = st->hb + at * F, *up = st->hb2 + at * F;
            const float *x = st->xin + at * E;
            cpu_f16_rows(ex->gate.data, ex->gate.row_bytes, it->r0, it->r1, x, cnt, E, gate, (size_t)F, tbuf);
            cpu_f16_rows(ex->up.data, ex->up.row_bytes, it->r0, it->r1, x, cnt, E, up, (size_t)F, tbuf);
            for (int t = 0; t < cnt; t++)
                for (int r = it->r0; r < it->r1; r++)
                    gate[(size_t)t * F + r] = cpu_silu_mul(gate[(size_t)t * F + r], up[(size_t)t * F + r]);
        } else {
            cpu_f16_rows(ex->down.data, ex->down.row_bytes, it->r0, it->r1, st->hb + at * F, cnt, F,
                         st->out + at * E, (size_t)E, tbuf);
        }
    }
}

int cpu_moe_ffn_batch(void *ctx, const struct moe_batch *b, const float *x, float *y, bool add)
{
    const struct expert_weights *e0 = &b->ex[b->g0];
    if (!cpu_f16_fast() || e0->gate.type != GGML_TYPE_F16 || e0->up.type != GGML_TYPE_F16 ||
        e0->down.type != GGML_TYPE_F16)
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0; /* a probe */
    int E = (int)e0->gate.ne[0], F = (int)e0->gate.ne[1];
    void **slot = cpu_moe_state(ctx);
    if (!*slot && !(*slot = calloc(1, sizeof(struct moe_state))))
        return TIDE_ENOMEM;
    struct moe_state *st = *slot;
    int per_group = (E > F ? E : F) / MOE_ROW_BLOCK + 2;
    if (state_fit(st, b, E, F, (b->g1 - b->g0) * per_group) || cpu_thread_scratch_all(ctx, 8 * (size_t)(E > F ? E : F)))
        return TIDE_ENOMEM;
    if (b->g0 == 0)
        memset(st->sum, 0, sizeof(float) * (size_t)b->n * E);
    for (int g = b->g0; g < b->g1; g++) { /* each group's tokens, together */
        int p0 = b->off[g], cnt = b->off[g + 1] - p0;
        cpu_rows_gather(ctx, st->xin + (size_t)(p0 - b->off[b->g0]) * E, x, b->tok + p0, cnt, E);
    }
    struct moe_job j = {.ctx = ctx, .b = b, .st = st, .E = E, .F = F};
    j.n_items = make_items(st, b, F);
    cpu_pool_run(ctx, moe_worker, &j);
    j.next = 0;
    j.down = true;
    j.n_items = make_items(st, b, E);
    cpu_pool_run(ctx, moe_worker, &j);
    for (int g = b->g0; g < b->g1; g++) { /* in ascending group order, as the per-expert scatters */
        int p0 = b->off[g], cnt = b->off[g + 1] - p0;
        cpu_rows_scatter_axpy(ctx, st->sum, st->out + (size_t)(p0 - b->off[b->g0]) * E, b->tok + p0, b->w + p0,
                              cnt, E);
    }
    if (b->g1 == b->n_group) {
        if (add)
            cpu_rows_axpy(ctx, y, st->sum, 1.0f, b->n * E);
        else
            memcpy(y, st->sum, sizeof(float) * (size_t)b->n * E);
    }
    return 0;
}
