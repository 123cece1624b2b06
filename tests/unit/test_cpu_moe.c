/* test_cpu_moe.c - the CPU backend's grouped MoE (backend_i.moe_ffn_batch, backend_cpu_moe.c)
 * gives the bits of the per-expert ops it replaces (gather, gate, up, swiglu, down, scatter in
 * ascending expert order, then y += the sum), in one call or in several runs of groups (an
 * expert cache with few live slots), for a decode step's few tokens and a prefill's many; and
 * says TIDE_EUNSUPPORTED for the types it does not group. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu_f16.h"
#include "engine/gguf.h"
#include "test_rand.h"

enum { NE = 6, K = 3 }; /* 3 choices: a sum of three depends on its order */ /* F past a multiple of 64 and 8: the row blocks' edges */

/* A (cols -> rows) weight of type: f16 values, or random codes under small scales */
static struct tensor weight(uint32_t type, int cols, int rows)
{
    size_t rb = ggml_row_size(type, (uint64_t)cols), bs = ggml_block_size(type), bb = ggml_row_size(type, bs);
    uint8_t *d = malloc(rb * (size_t)rows);
    for (size_t i = 0; i < rb * (size_t)rows; i++)
        d[i] = (uint8_t)(test_rand_next() >> 24);
    for (size_t at = 0; at < rb * (size_t)rows; at += bb) {
        uint16_t h = tide_f32_to_f16(0.004f * (1.5f + frand()));
        if (type == GGML_TYPE_F16) {
            for (size_t i = 0; i < bb; i += 2)
                *(uint16_t *)(d + at + i) = tide_f32_to_f16(0.2f * frand());
        } else if (type == GGML_TYPE_Q6_K) {
            memcpy(d + at + 208, &h, 2);
        } else { /* q8_0, q4_0: d first; q4_K, q5_K: d, then dmin */
            memcpy(d + at, &h, 2);
            if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K)
                memcpy(d + at + 2, &h, 2);
        }
    }
    return (struct tensor){.type = type, .ne = {(uint64_t)cols, (uint64_t)rows}, .data = d, .row_bytes = rb};
}

/* n tokens routed to K distinct experts each, grouped by expert; gate and up of type tg, down
 * of type td, E -> F -> E */
static void check_tokens(int n, uint32_t tg, uint32_t td, int E, int F)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    const struct backend_i *B = be.i;
    struct expert_weights ex[NE];
    for (int e = 0; e < NE; e++)
        ex[e] = (struct expert_weights){weight(tg, E, F), weight(tg, E, F), weight(td, F, E)};
    float *x = malloc(sizeof(float) * n * E), *y0 = malloc(sizeof(float) * n * E);
    for (int i = 0; i < n * E; i++)
        x[i] = frand();
    for (int i = 0; i < n * E; i++)
        y0[i] = frand(); /* the residual the sum is added to */
    /* pairs sorted by expert (ascending), tokens ascending within one: as forward_moe.c's counting sort */
    int sel[64 * K];
    float wsel[64 * K];
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            sel[t * K + j] = (t + 2 * j + t / 3) % NE; /* three distinct experts a token */
            wsel[t * K + j] = 0.25f + 0.5f * (float)j + 0.01f * (float)t;
        }
    int off[NE + 1] = {0}, tok[64 * K], ng = 0, goff[NE + 1];
    float wt[64 * K];
    for (int i = 0; i < n * K; i++)
        off[sel[i] + 1]++;
    for (int e = 0; e < NE; e++)
        off[e + 1] += off[e];
    int fill[NE];
    memcpy(fill, off, sizeof fill);
    for (int i = 0; i < n * K; i++) {
        int p = fill[sel[i]]++;
        tok[p] = i / K;
        wt[p] = wsel[i];
    }
    struct expert_weights gex[NE];
    for (int e = 0; e < NE; e++)
        if (off[e + 1] > off[e]) {
            goff[ng] = off[e];
            gex[ng++] = ex[e];
        }
    goff[ng] = n * K;
    /* the per-expert ops */
    float *want = malloc(sizeof(float) * n * E), *sum = calloc((size_t)n * E, sizeof(float));
    float *xin = malloc(sizeof(float) * n * E), *hb = malloc(sizeof(float) * n * F), *hb2 = malloc(sizeof(float) * n * F);
    float *out = malloc(sizeof(float) * n * E);
    for (int g = 0; g < ng; g++) {
        int cnt = goff[g + 1] - goff[g];
        B->gather_rows(be.ctx, xin, x, tok + goff[g], cnt, E);
        B->matmul(be.ctx, &gex[g].gate, xin, hb, cnt);
        B->matmul(be.ctx, &gex[g].up, xin, hb2, cnt);
        B->swiglu(be.ctx, hb, hb2, cnt * F);
        B->matmul(be.ctx, &gex[g].down, hb, out, cnt);
        B->scatter_axpy(be.ctx, sum, out, tok + goff[g], wt + goff[g], cnt, E);
    }
    memcpy(want, y0, sizeof(float) * n * E);
    B->axpy(be.ctx, want, sum, 1.0f, n * E);
    /* one call, then runs of 2 groups, then of 1 */
    for (int run = 0; run < 3; run++) {
        int step = run == 0 ? ng : run == 1 ? 2 : 1;
        float *y = malloc(sizeof(float) * n * E);
        memcpy(y, y0, sizeof(float) * n * E);
        struct moe_batch mb = {.n = n, .k = K, .n_group = ng, .off = goff, .tok = tok, .w = wt, .ex = gex};
        cr_assert_eq(B->moe_ffn_batch(be.ctx, &mb, NULL, NULL, false), 0, "the probe takes types %u/%u", tg, td);
        for (int g0 = 0; g0 < ng; g0 += step) {
            mb.g0 = g0;
            mb.g1 = g0 + step < ng ? g0 + step : ng;
            cr_assert_eq(B->moe_ffn_batch(be.ctx, &mb, x, y, true), 0);
        }
        cr_assert(memcmp(y, want, sizeof(float) * n * E) == 0,
                  "types %u/%u, %d tokens, runs of %d groups: not the per-expert bits", tg, td, n, step);
        free(y);
    }
    /* gate and up of different types are not grouped here: the caller runs the per-expert ops */
    struct expert_weights q = gex[0];
    q.up.type = tg == GGML_TYPE_F16 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    struct moe_batch mq = {.n = n, .k = K, .n_group = 1, .off = goff, .tok = tok, .w = wt, .ex = &q, .g1 = 1};
    cr_assert_eq(B->moe_ffn_batch(be.ctx, &mq, NULL, NULL, false), TIDE_EUNSUPPORTED);
    for (int e = 0; e < NE; e++) {
        free((void *)ex[e].gate.data);
        free((void *)ex[e].up.data);
        free((void *)ex[e].down.data);
    }
    free(x); free(y0); free(want); free(sum); free(xin); free(hb); free(hb2); free(out);
    backend_cpu_free(&be);
}

/* F past a multiple of 64 and 8: the row blocks' and the tiles' edges */
Test(cpu_moe, grouped_f16_experts_give_the_per_expert_bits)
{
    if (!cpu_f16_fast())
        cr_skip_test("this CPU has no AVX2/F16C/FMA: the grouped op is not used");
    check_tokens(4, GGML_TYPE_F16, GGML_TYPE_F16, 96, 136); /* a decode step of 4 sequences: groups of 1-2 tokens */
    check_tokens(37, GGML_TYPE_F16, GGML_TYPE_F16, 96, 136); /* a prefill chunk */
}

/* the int8 products: q8_0 throughout, and a Q4_K_M-like expert (q4_K gate and up, q6_K down) */
Test(cpu_moe, grouped_quantised_experts_give_the_per_expert_bits)
{
    check_tokens(4, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 96, 160);
    check_tokens(37, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 96, 160);
    check_tokens(4, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 256, 512);
    check_tokens(21, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 256, 512);
}
