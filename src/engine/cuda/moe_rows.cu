/* moe_rows.cu - the MoE FFN of a decode step's n tokens (one a sequence), every expert found
 * through the expert cache's device table: backend_i.moe_ffn_table_route with n > 1.
 *
 * Per token (moe.cu's fused op n times) each token reads its k experts' weights, so a step
 * of 32 sequences reads 256 experts' worth where a step needs the ~120 distinct ones; and
 * grouping on the host (moe_prefill.cu's path) waits for the routing every layer. Here the
 * grouping happens on the device, in five launches a layer and no wait:
 *   1. route: one warp a token, route_warp (route()'s bits) into the token's routed row;
 *   1b. every token's x quantised once (quantize_q8_elem), for kernel 2 to copy;
 *   2. gate + up + SwiGLU: a CTA (W warps, 32 / W rows each) per (32 rows of F, expert); it
 *      finds the tokens that chose its expert in the routed rows (a CTA of an expert nobody
 *      chose returns at once), copies their quantised x into shared memory (quantising it in
 *      each of an expert's 24 CTAs cost as much as reading the weights) and runs the row-dot
 *      of each weight row against up to MOEB_NT tokens at once: each expert row is read once
 *      a step, not once a token. h goes out quantised, one row per (token, choice) pair;
 *   3. down: a CTA per (32 output rows, expert), the same search, the pairs' h rows copied to
 *      shared memory, one unweighted output row per pair;
 *   4. combine: per token, y (+)= the sum over its k choices, in choice order, of w * out.
 * Deterministic: no atomics on values; a token's result does not depend on which other
 * tokens share the step (each (pair, row) dot runs the same blocks in the same order). */
#include "engine/cuda/kquant.cuh"
#include "engine/cuda/route.cuh"

#include <stdlib.h>
#include <string.h>

#define MOEB_NT MM_NT /* tokens a weight row is dotted with at once */
#define MOEB_MAX_N 512 /* tokens a step (one thread a token searches the routed rows) */
#define MOEB_MAX_K 16

struct moe_rows_args {
    const void *const *table; /* per expert: gate, up, down data */
    const int32_t *routed;    /* (n, 2k): k ids, then k weights (float bits) */
    int n, k, E, F, nt;       /* nt: tokens at once in kernel 2 (shared memory bound) */
    size_t rb_gu, rb_d;
    bool pairs_gu, pairs_d, add;
};

/* The pairs (token t, choice j) that chose expert e, as p = t * k + j, into pl; their count. */
__device__ __forceinline__ int expert_pairs(const moe_rows_args &a, int e, int *pl, int *np)
{
    if (threadIdx.x == 0)
        *np = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < a.n; t += blockDim.x)
        for (int j = 0; j < a.k; j++)
            if (a.routed[(size_t)t * 2 * a.k + j] == e)
                pl[atomicAdd(np, 1)] = t * a.k + j; /* the list's order changes no result */
    __syncthreads();
    return *np;
}

__global__ void __launch_bounds__(32) route_rows_kernel(const float *__restrict__ logits, int ne, int k, int norm,
                                                        int32_t *__restrict__ routed)
{
    __shared__ int sel[ROUTE_MAX_K];
    int t = blockIdx.x;
    int32_t *row = routed + (size_t)t * 2 * k;
    route_warp<ROUTE_MAX_K>(logits + (size_t)t * ne, ne, k, norm, sel, row, (float *)(row + k));
}

/* grid (F / 32, n_expert): rows r0..r0+31 of gate and up of expert blockIdx.y -> hq, hd rows of
 * the pairs (pair p: hq[p F ..], hd[p F / 32 ..]) */
/* grid n: every token's x quantised once a step, xq (n, E), xd (n, E / 32): the blocks of
 * quantize_q8_elem, so kernel 2 copies them instead of quantising them again in each CTA */
__global__ void moe_rows_quant_x_kernel(const float *__restrict__ x, int E, int8_t *__restrict__ xq,
                                        float *__restrict__ xd)
{
    const int t = blockIdx.x, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int b = threadIdx.x >> 5; b < E / QK; b += nw) {
        size_t i = (size_t)t * E + (size_t)b * QK + lane;
        quantize_q8_elem(__ldg(x + i), (int)i, xq, xd);
    }
}

template <int QT, int W, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
moe_rows_gate_up_kernel(const moe_rows_args a, const float *__restrict__ x, const int8_t *__restrict__ xqg,
                        const float *__restrict__ xdg, int8_t *__restrict__ hq, float *__restrict__ hd)
{
    __shared__ int pl[MOEB_MAX_N], np;
    __shared__ float hs[MOEB_NT][QK];
    extern __shared__ __align__(16) uint8_t sm[];
    const int e = blockIdx.y, r0 = blockIdx.x * QK, E = a.E, nb = E / QK;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int cnt = expert_pairs(a, e, pl, &np);
    if (!cnt)
        return;
    int8_t *xq = (int8_t *)sm;                  /* (nt, E) */
    float *xd = (float *)(sm + (size_t)a.nt * E); /* (nt, E / 32) */
    const uint8_t *G = (const uint8_t *)a.table[3 * e], *U = (const uint8_t *)a.table[3 * e + 1];
    for (int c0 = 0; c0 < cnt; c0 += a.nt) {
        int nt = cnt - c0 < a.nt ? cnt - c0 : a.nt;
        if (xqg) { /* the tokens' x, quantised by kernel 1b: 16 bytes at a time */
            for (int i4 = tid; i4 < nt * (E / 16); i4 += blockDim.x) {
                int i = i4 / (E / 16), o = i4 - i * (E / 16), t = pl[c0 + i] / a.k;
                ((int4 *)(xq + (size_t)i * E))[o] = ((const int4 *)(xqg + (size_t)t * E))[o];
            }
            for (int i1 = tid; i1 < nt * nb; i1 += blockDim.x) {
                int i = i1 / nb, bb = i1 - i * nb;
                xd[i1] = xdg[(size_t)(pl[c0 + i] / a.k) * nb + bb];
            }
        } else {
            for (int b = warp; b < nt * nb; b += W) { /* the tokens' x, quantised here */
                int i = b / nb, bb = b - i * nb, t = pl[c0 + i] / a.k;
                quantize_q8_elem(__ldg(x + (size_t)t * E + (size_t)bb * QK + lane), i * E + bb * QK + lane, xq, xd);
            }
        }
        __syncthreads();
        for (int h = 0; h < QK / W; h++) {
            int rr = warp + h * W, r = r0 + rr;
            float g[MM_NT], u[MM_NT];
#pragma unroll
            for (int i = 0; i < MM_NT; i++)
                g[i] = u[i] = 0.0f;
            if constexpr (kq_type(QT)) {
                row_dot_kq<QT, true>(G + (size_t)r * a.rb_gu, E / KQ_UNIT, xq, xd, nt, g, lane);
                row_dot_kq<QT, true>(U + (size_t)r * a.rb_gu, E / KQ_UNIT, xq, xd, nt, u, lane);
            } else {
                row_dot_q<QT, true>(G + (size_t)r * a.rb_gu, nb, a.pairs_gu, xq, xd, nt, g, lane);
                row_dot_q<QT, true>(U + (size_t)r * a.rb_gu, nb, a.pairs_gu, xq, xd, nt, u, lane);
            }
#pragma unroll
            for (int i = 0; i < MM_NT; i++) {
                if (i < nt) {
                    float gv = warp_sum(g[i]), uv = warp_sum(u[i]);
                    if (lane == 0)
                        hs[i][rr] = gv / (1.0f + expf(-gv)) * uv; /* as swiglu_kernel */
                }
            }
        }
        __syncthreads();
        for (int i = warp; i < nt; i += W) /* a warp quantises one pair's 32 values */
            quantize_q8_elem(hs[i][lane], pl[c0 + i] * a.F + r0 + lane, hq, hd);
        __syncthreads(); /* before the next tokens overwrite xq and hs */
    }
}

/* grid (E / 32, n_expert): rows r0..r0+31 of down of expert blockIdx.y for each of its pairs:
 * out[p E + r], unweighted */
template <int QT, int W, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
moe_rows_down_kernel(const moe_rows_args a, const int8_t *__restrict__ hq, const float *__restrict__ hd,
                     float *__restrict__ out)
{
    __shared__ int pl[MOEB_MAX_N], np;
    extern __shared__ __align__(16) uint8_t sm[];
    const int e = blockIdx.y, r0 = blockIdx.x * QK, F = a.F, nb = F / QK;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int cnt = expert_pairs(a, e, pl, &np);
    if (!cnt)
        return;
    int8_t *hqs = (int8_t *)sm;                    /* (MOEB_NT, F) */
    float *hds = (float *)(sm + (size_t)MOEB_NT * F); /* (MOEB_NT, F / 32) */
    const uint8_t *D = (const uint8_t *)a.table[3 * e + 2];
    for (int c0 = 0; c0 < cnt; c0 += MOEB_NT) {
        int nt = cnt - c0 < MOEB_NT ? cnt - c0 : MOEB_NT;
        for (int i4 = tid; i4 < nt * (F / 16); i4 += blockDim.x) { /* the pairs' h rows, 16 bytes at a time */
            int i = i4 / (F / 16), o = i4 - i * (F / 16);
            ((int4 *)(hqs + (size_t)i * F))[o] = ((const int4 *)(hq + (size_t)pl[c0 + i] * F))[o];
        }
        for (int i1 = tid; i1 < nt * nb; i1 += blockDim.x) {
            int i = i1 / nb, b = i1 - i * nb;
            hds[i * nb + b] = hd[(size_t)pl[c0 + i] * nb + b];
        }
        __syncthreads();
        for (int h = 0; h < QK / W; h++) {
            int rr = warp + h * W, r = r0 + rr;
            if (r >= a.E)
                break;
            float s[MM_NT];
#pragma unroll
            for (int i = 0; i < MM_NT; i++)
                s[i] = 0.0f;
            if constexpr (kq_type(QT))
                row_dot_kq<QT, true>(D + (size_t)r * a.rb_d, F / KQ_UNIT, hqs, hds, nt, s, lane);
            else
                row_dot_q<QT, true>(D + (size_t)r * a.rb_d, nb, a.pairs_d, hqs, hds, nt, s, lane);
#pragma unroll
            for (int i = 0; i < MM_NT; i++) {
                if (i < nt) {
                    float v = warp_sum(s[i]);
                    if (lane == 0)
                        out[(size_t)pl[c0 + i] * a.E + r] = v;
                }
            }
        }
        __syncthreads();
    }
}

/* grid n: y[t] (+)= sum over j in order of w[t][j] * out[t k + j] */
__global__ void moe_rows_combine_kernel(const moe_rows_args a, const float *__restrict__ out, float *__restrict__ y)
{
    int t = blockIdx.x;
    const int32_t *row = a.routed + (size_t)t * 2 * a.k;
    for (int r = threadIdx.x; r < a.E; r += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < a.k; j++)
            acc = fmaf(__int_as_float(row[a.k + j]), out[((size_t)t * a.k + j) * a.E + r], acc);
        float *yr = y + (size_t)t * a.E + r;
        *yr = a.add ? *yr + acc : acc;
    }
}


int cuda_moe_ffn_table_rows(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                            const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                            const float *x, float *y, bool add)
{
    if (c->err)
        return c->err;
    uint32_t T = shape->gate.type, TD = shape->down.type;
    auto known = [](uint32_t t) { return t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0 || kq_type(t); };
    moe_rows_args a;
    memset(&a, 0, sizeof a);
    a.E = (int)shape->gate.ne[0];
    a.F = (int)shape->gate.ne[1];
    a.rb_gu = shape->gate.row_bytes;
    a.rb_d = shape->down.row_bytes;
    if (n < 1 || n > MOEB_MAX_N || k < 1 || k > MOEB_MAX_K || k > n_expert || n_expert > ROUTE_MAX_EXPERTS ||
        !known(T) || !known(TD) || a.E % QK || a.F % QK || a.E <= 0 || a.F <= 0 || a.F % 16 ||
        (kq_type(T) && a.E % QK_K) || (kq_type(TD) && a.F % QK_K) || shape->up.type != T ||
        shape->up.row_bytes != a.rb_gu || (int)shape->down.ne[0] != a.F || (int)shape->down.ne[1] != a.E)
        return TIDE_EUNSUPPORTED;
    /* kernel 2's tokens at once: their quantised x within 40 KB of shared memory */
    size_t per_tok = (size_t)a.E + (size_t)(a.E / QK) * sizeof(float);
    a.nt = (int)(40 * 1024 / per_tok);
    if (a.nt > MOEB_NT)
        a.nt = MOEB_NT;
    size_t sm_d = (size_t)MOEB_NT * a.F + (size_t)MOEB_NT * (a.F / QK) * sizeof(float);
    if (a.nt < 1 || sm_d > 40 * 1024)
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0; /* a probe */
    /* TIDE_MOE_ROWS_MMA=1: the same routing, the products on the grouped tensor-core tiles */
    if (cuda_moe_rows_grouped(c, shape, table, routed, n, k, n_expert, NULL, NULL, add) == 0) {
        route_rows_kernel<<<n, 32, 0, c->st>>>(logits, n_expert, k, norm ? 1 : 0, routed);
        if (!CU_LAUNCH(c, "route_rows_kernel"))
            return c->err;
        return cuda_moe_rows_grouped(c, shape, table, routed, n, k, n_expert, x, y, add);
    }
    /* the table's addresses are cache slots, 256-byte aligned: pairs of blocks load as words */
    a.pairs_gu = !kq_type(T) && (a.E / QK) % 2 == 0 && (a.rb_gu & 3) == 0;
    a.pairs_d = !kq_type(TD) && (a.F / QK) % 2 == 0 && (a.rb_d & 3) == 0;
    a.table = table;
    a.routed = routed;
    a.n = n;
    a.k = k;
    a.add = add;

    size_t P = (size_t)n * k;
    size_t qbytes = (P * a.F + 255) & ~(size_t)255, dbytes = (P * (a.F / QK) * sizeof(float) + 255) & ~(size_t)255;
    size_t xqbytes = ((size_t)n * a.E + 255) & ~(size_t)255;
    size_t xdbytes = ((size_t)n * (a.E / QK) * sizeof(float) + 255) & ~(size_t)255;
    size_t obytes = (P * a.E * sizeof(float) + 255) & ~(size_t)255;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + dbytes + obytes + xqbytes + xdbytes);
    if (!ws)
        return c->err ? c->err : TIDE_ENOMEM;
    int8_t *hq = (int8_t *)ws;
    float *hd = (float *)(ws + qbytes), *out = (float *)(ws + qbytes + dbytes);
    /* TIDE_MOE_ROWS_PREQ=0: each CTA quantises its tokens' x itself (the first form; A/B runs) */
    const char *pq = getenv("TIDE_MOE_ROWS_PREQ");
    bool preq = !(pq && pq[0] == '0');
    int8_t *xqg = preq ? (int8_t *)(ws + qbytes + dbytes + obytes) : NULL;
    float *xdg = preq ? (float *)(ws + qbytes + dbytes + obytes + xqbytes) : NULL;

    route_rows_kernel<<<n, 32, 0, c->st>>>(logits, n_expert, k, norm ? 1 : 0, routed);
    if (!CU_LAUNCH(c, "route_rows_kernel"))
        return c->err;
    if (preq) {
        moe_rows_quant_x_kernel<<<n, 256, 0, c->st>>>(x, a.E, xqg, xdg);
        if (!CU_LAUNCH(c, "moe_rows_quant_x_kernel"))
            return c->err;
    }
    size_t sm_gu = (size_t)a.nt * per_tok;
    dim3 g1((unsigned)(a.F / QK), (unsigned)n_expert), g2((unsigned)(a.E / QK), (unsigned)n_expert);
    /* q8_0's CTA shape: cfg 3, 4 warps a CTA with registers for 6 CTAs an SM. 16 warps (cfg 0,
     * the first form) took 99-120 registers, so one CTA an SM, whose serial phases (finding
     * its pairs, copying x, quantising h) left the SM's loads idle: on one H200, one layer's
     * MoE (Qwen3-30B-A3B shape) at 8 / 32 / 64 tokens took 263 / 568 / 820 us with cfg 0,
     * 210 / 468 / 693 with 1 (8 warps, 2 CTAs), 196 / 434 / 659 with 2 (4, 4), 170 / 372 / 591
     * with 3 (4, 6) and 170 / 393 / 620 with 4 (2, 12); test-gpu --bench --only bench_moe_rows.
     * TIDE_MOE_ROWS_CFG=0..4 picks another for A/B runs. The other types keep cfg 0's shape
     * (their kernels need more registers; not measured). */
    const char *cf = getenv("TIDE_MOE_ROWS_CFG");
    int cfg = cf ? atoi(cf) : 3;
#define MOEB_LAUNCH(QTV, W, MINB)                                                                          \
    do {                                                                                                   \
        moe_rows_gate_up_kernel<QTV, W, MINB><<<g1, (W) * 32, sm_gu, c->st>>>(a, x, xqg, xdg, hq, hd);    \
        if (!CU_LAUNCH(c, "moe_rows_gate_up_kernel"))                                                      \
            return c->err;                                                                                 \
    } while (0)
#define MOEB_LAUNCH_D(QTV, W, MINB)                                                                        \
    do {                                                                                                   \
        moe_rows_down_kernel<QTV, W, MINB><<<g2, (W) * 32, sm_d, c->st>>>(a, hq, hd, out);                \
        if (!CU_LAUNCH(c, "moe_rows_down_kernel"))                                                         \
            return c->err;                                                                                 \
    } while (0)
    switch (T) {
    case GGML_TYPE_Q8_0:
        switch (cfg) {
        case 1: MOEB_LAUNCH(8, 8, 2); break;
        case 2: MOEB_LAUNCH(8, 4, 4); break;
        case 3: MOEB_LAUNCH(8, 4, 6); break;
        case 4: MOEB_LAUNCH(8, 2, 12); break;
        default: MOEB_LAUNCH(8, 16, 1); break;
        }
        break;
    case GGML_TYPE_Q4_0: MOEB_LAUNCH(2, 16, 1); break;
    case GGML_TYPE_Q4_K: MOEB_LAUNCH(KQ_Q4_K, 16, 1); break;
    case GGML_TYPE_Q5_K: MOEB_LAUNCH(KQ_Q5_K, 16, 1); break;
    default: MOEB_LAUNCH(KQ_Q6_K, 16, 1); break;
    }
    switch (TD) {
    case GGML_TYPE_Q8_0:
        switch (cfg) {
        case 1: MOEB_LAUNCH_D(8, 8, 2); break;
        case 2: MOEB_LAUNCH_D(8, 4, 4); break;
        case 3: MOEB_LAUNCH_D(8, 4, 6); break;
        case 4: MOEB_LAUNCH_D(8, 2, 12); break;
        default: MOEB_LAUNCH_D(8, 16, 1); break;
        }
        break;
    case GGML_TYPE_Q4_0: MOEB_LAUNCH_D(2, 16, 1); break;
    case GGML_TYPE_Q4_K: MOEB_LAUNCH_D(KQ_Q4_K, 16, 1); break;
    case GGML_TYPE_Q5_K: MOEB_LAUNCH_D(KQ_Q5_K, 16, 1); break;
    default: MOEB_LAUNCH_D(KQ_Q6_K, 16, 1); break;
    }
    moe_rows_combine_kernel<<<n, 256, 0, c->st>>>(a, out, y);
    return CU_LAUNCH(c, "moe_rows_combine_kernel") ? 0 : c->err;
}
