/* moe.cu - one token's MoE FFN over its k chosen experts in two launches (decode).
 *
 * The per-expert path costs five launches an expert (gate, up, swiglu, down, axpy), ~40 a
 * layer, and at decode sizes launches, not bytes, bound them. Here the k experts' weight
 * pointers travel by value in the kernel arguments:
 *   1. gate + up + SwiGLU for all k experts: a CTA quantises x into shared memory (the
 *      formula of quantize_q8_kernel), computes 32 consecutive rows of gate and up of one
 *      expert, applies silu(g) * u and writes those 32 values already quantised to int8
 *      blocks (the down product's input, quantised exactly as the CPU backend does);
 *   2. down + weighted sum: a warp takes one output row, its lanes share the k experts'
 *      blocks of that row and the warp sums w[j] * (down_j . h_j) (the CPU's zero-then-axpy
 *      loop in another summation order), added to y when the caller fuses the residual in.
 * q8_0 and q4_0 weights (dp4a, mmq.cuh) and q4_K / q5_K / q6_K (dp4a, kquant.cuh; the down
 * projection's type may differ from gate's and up's, as in llama-quantize's Q4_K_M, whose
 * ffn_down is q6_K in some layers); other types report TIDE_EUNSUPPORTED and the forward
 * uses the per-expert ops.
 *
 * The same two kernels also run from a device table (cuda_moe_ffn_table): the expert ids and
 * weights come from route_kernel's output in device memory and the addresses from the expert
 * cache's table, so a decode step with every expert resident never waits for the host. The
 * arithmetic is the same either way, so both forms give the same bits. cuda_moe_ffn_table_route
 * also routes inside kernel 1 (warp 0 of every CTA runs route_kernel's code while the others
 * quantise x), one launch fewer a layer. */
#include "engine/cuda/kquant.cuh"

extern "C" {
#include "engine/backend_cuda.h" /* cuda_set_decode_opt */
}

#include <stdio.h>
#include <string.h>

#define MOE_MAX_K 16
#define MOE_GU_WARPS 16 /* kernel 1: 16 warps x 2 rows = one 32-row block of h */
#define MOE_DN_WARPS 8  /* kernel 2: one output row a warp */
#define MOE_DN_PAIRS 4  /* kernel 2's pair path: up to 4 pairs of blocks a lane (k F / 64 <= 128) */

struct moe_args {
    const uint8_t *gate[MOE_MAX_K], *up[MOE_MAX_K], *down[MOE_MAX_K];
    float w[MOE_MAX_K];
    /* table form: when table is set, expert j is table[3 * routed[j] + 0/1/2] (gate, up,
     * down) and its weight the float at routed[k + j]; gate/up/down/w above are unused */
    const void *const *table;
    const int32_t *routed;
    size_t rb_gu, rb_d; /* row bytes of gate/up (E columns) and down (F columns) */
    /* fused routing (table form): when logits is set, moe_gate_up_kernel routes the token from
     * its n_expert logits itself (route_warp) and CTA (0, 0) writes the result to routed */
    const float *logits;
    int n_expert;
    bool norm;
    int k, E, F;
    uint32_t type_d; /* down's type (gate and up share one) */
    bool pairs_gu;
    bool pairs_d; /* down rows in 4-byte pairs of blocks, at most MOE_DN_PAIRS a lane */
    bool add; /* y += the sum (the residual add fused in) instead of y = the sum */
};

#include "engine/cuda/route.cuh"

__global__ void __launch_bounds__(32) route_kernel(const float *__restrict__ logits, int n, int ne, int k, int norm,
                                                   int32_t *__restrict__ out)
{
    __shared__ int sel[ROUTE_MAX_K];
    int t = blockIdx.x;
    route_warp<ROUTE_MAX_K>(logits + (size_t)t * ne, ne, k, norm, sel, out + (size_t)t * k,
                            (float *)(out + (size_t)n * k) + (size_t)t * k);
}

/* grid (F / 32, k): block b of expert j -> hq[j*F + 32b ..], hd[j*F/32 + b] */
template <int QT>
__global__ void __launch_bounds__(MOE_GU_WARPS * 32)
moe_gate_up_kernel(const moe_args a, const float *__restrict__ x, int8_t *__restrict__ hq, float *__restrict__ hd)
{
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float hs[QK];
    int E = a.E, nb = E / QK, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int8_t *xq = (int8_t *)sm;                              /* (E) */
    float *xd = (float *)(sm + (((size_t)E + 15) & ~(size_t)15)); /* (E / 32) */
    __shared__ int rsel[MOE_MAX_K], rid[MOE_MAX_K];
    __shared__ float rw[MOE_MAX_K];
    /* with fused routing warp 0 routes while the others quantise x (which warp takes a block
     * does not change its bits) */
    int w0 = a.logits ? 1 : 0;
    if (w0 && warp == 0)
        route_warp<MOE_MAX_K>(a.logits, a.n_expert, a.k, a.norm, rsel, rid, rw);
    for (int b = warp - w0; b >= 0 && b < nb; b += MOE_GU_WARPS - w0) {
        quantize_q8_elem(__ldg(x + (size_t)b * QK + lane), b * QK + lane, xq, xd);
    }
    __syncthreads();
    int j = blockIdx.y, r0 = blockIdx.x * QK;
    if (w0 && blockIdx.x == 0 && blockIdx.y == 0 && tid < a.k) { /* route()'s output, for moe_down_kernel */
        ((int32_t *)a.routed)[tid] = rid[tid];
        ((float *)a.routed)[a.k + tid] = rw[tid];
    }
    const uint8_t *G = a.gate[j], *U = a.up[j];
    if (a.table) {
        int e = w0 ? rid[j] : a.routed[j];
        G = (const uint8_t *)a.table[3 * e];
        U = (const uint8_t *)a.table[3 * e + 1];
    }
    for (int i = 0; i < QK / MOE_GU_WARPS; i++) {
        int rr = warp + i * MOE_GU_WARPS, r = r0 + rr;
        float g[MM_NT], u[MM_NT];
#pragma unroll
        for (int t = 0; t < MM_NT; t++)
            g[t] = u[t] = 0.0f;
        if constexpr (kq_type(QT)) {
            row_dot_kq<QT, true>(G + (size_t)r * a.rb_gu, E / KQ_UNIT, xq, xd, 1, g, lane);
            row_dot_kq<QT, true>(U + (size_t)r * a.rb_gu, E / KQ_UNIT, xq, xd, 1, u, lane);
        } else if (a.pairs_gu) { /* gate and up rows loaded together */
            row_dot2_q<QT>(G + (size_t)r * a.rb_gu, U + (size_t)r * a.rb_gu, nb, xq, xd, &g[0], &u[0], lane);
        } else {
            row_dot_q<QT, true>(G + (size_t)r * a.rb_gu, nb, false, xq, xd, 1, g, lane);
            row_dot_q<QT, true>(U + (size_t)r * a.rb_gu, nb, false, xq, xd, 1, u, lane);
        }
        float gv = warp_sum(g[0]), uv = warp_sum(u[0]);
        if (lane == 0)
            hs[rr] = gv / (1.0f + expf(-gv)) * uv; /* as swiglu_kernel / cpu_swiglu */
    }
    __syncthreads();
    if (warp == 0)
        quantize_q8_elem(hs[lane], j * a.F + r0 + lane, hq, hd);
}

/* Route once (TIDE_MOE_ROUTE_ONCE, table form, q8_0 / q4_0 gate and up in 4-byte pairs, at most
 * one pair of blocks a lane: E <= 2048): the routing is already in a.routed (route_kernel ran
 * once before), so a CTA looks its expert up and issues its warps' first gate and up rows (68
 * bytes a lane each for q8_0) before it quantises x: those loads are in flight during the
 * quantisation instead of after it. Only the first of a warp's two rows: both would take ~92
 * registers, one CTA an SM instead of two, and the 192 CTAs of a Qwen3-30B layer two waves.
 * The arithmetic is row_dot2_q's and the rest moe_gate_up_kernel's, so the bits are the same. */
template <int QT>
__device__ __forceinline__ void moe_pf_load(const uint8_t *G, const uint8_t *U, size_t off, uint32_t (*u)[QT == 8 ? 17 : 9])
{
    constexpr int NU = QT == 8 ? 17 : 9;
    const uint32_t *pg = (const uint32_t *)(G + off), *pu = (const uint32_t *)(U + off);
#pragma unroll
    for (int v = 0; v < NU; v++) {
        u[0][v] = __ldg(pg + v);
        u[1][v] = __ldg(pu + v);
    }
}

template <int QT>
__global__ void __launch_bounds__(MOE_GU_WARPS * 32, 2)
moe_gate_up_pf_kernel(const moe_args a, const float *__restrict__ x, int8_t *__restrict__ hq, float *__restrict__ hd)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    constexpr int NU = BLK * 2 / 4;
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float hs[QK];
    int E = a.E, nb = E / QK, np = nb / 2, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int8_t *xq = (int8_t *)sm;                                    /* (E) */
    float *xd = (float *)(sm + (((size_t)E + 15) & ~(size_t)15)); /* (E / 32) */
    int j = blockIdx.y, r0 = blockIdx.x * QK, e = a.routed[j];
    const uint8_t *G = (const uint8_t *)a.table[3 * e], *U = (const uint8_t *)a.table[3 * e + 1];
    uint32_t u[2][NU]; /* (gate / up, the lane's pair) of the row in hand */
    if (lane < np)
        moe_pf_load<QT>(G, U, (size_t)(r0 + warp) * a.rb_gu + (size_t)lane * 2 * BLK, u);
    for (int b = warp; b < nb; b += MOE_GU_WARPS)
        quantize_q8_elem(__ldg(x + (size_t)b * QK + lane), b * QK + lane, xq, xd);
    __syncthreads();
    for (int i = 0; i < QK / MOE_GU_WARPS; i++) {
        int rr = warp + i * MOE_GU_WARPS;
        if (i > 0 && lane < np)
            moe_pf_load<QT>(G, U, (size_t)(r0 + rr) * a.rb_gu + (size_t)lane * 2 * BLK, u);
        float gu[2] = {0.0f, 0.0f};
        if (lane < np) {
#pragma unroll
            for (int r = 0; r < 2; r++) { /* row_dot2_q's steps for pair `lane` */
                float s[MM_NT] = {0.0f};
                int wq[8];
                float d0 = f16_bits_to_f32((uint16_t)(u[r][0] & 0xFFFFu)), d1;
                if (QT == 8) {
#pragma unroll
                    for (int v = 0; v < 8; v++)
                        wq[v] = (int)__funnelshift_r(u[r][v], u[r][v + 1], 16);
                    dot_block<true>(wq, d0, xq, xd, nb, 2 * lane, 1, s);
                    d1 = f16_bits_to_f32((uint16_t)(u[r][8] >> 16));
#pragma unroll
                    for (int v = 0; v < 8; v++)
                        wq[v] = (int)u[r][9 + v];
                } else {
                    uint32_t q[4];
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        q[v] = __funnelshift_r(u[r][v], u[r][v + 1], 16);
                    unpack_q4(q, wq);
                    dot_block<true>(wq, d0, xq, xd, nb, 2 * lane, 1, s);
                    d1 = f16_bits_to_f32((uint16_t)(u[r][4] >> 16));
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        q[v] = u[r][5 + v];
                    unpack_q4(q, wq);
                }
                dot_block<true>(wq, d1, xq, xd, nb, 2 * lane + 1, 1, s);
                gu[r] = s[0];
            }
        }
        float gv = warp_sum(gu[0]), uv = warp_sum(gu[1]);
        if (lane == 0)
            hs[rr] = gv / (1.0f + expf(-gv)) * uv; /* as swiglu_kernel / cpu_swiglu */
    }
    __syncthreads();
    if (warp == 0)
        quantize_q8_elem(hs[lane], j * a.F + r0 + lane, hq, hd);
}

/* One output row a warp. The lanes share out all k * F/32 blocks of the row's k expert
 * rows (F = 768 is only 24 blocks: one expert a time would leave most lanes idle), each
 * block's dot scaled by its expert's weight, then one warp sum. */
template <int QT>
__global__ void __launch_bounds__(MOE_DN_WARPS * 32)
moe_down_kernel(const moe_args a, const int8_t *__restrict__ hq, const float *__restrict__ hd, float *__restrict__ y)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    __shared__ const uint8_t *dn[MOE_MAX_K];
    __shared__ float wt[MOE_MAX_K];
    if (threadIdx.x < a.k) {
        int j = threadIdx.x;
        dn[j] = a.table ? (const uint8_t *)a.table[3 * a.routed[j] + 2] : a.down[j];
        wt[j] = a.table ? __int_as_float(a.routed[a.k + j]) : a.w[j];
    }
    __syncthreads();
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MOE_DN_WARPS + (threadIdx.x >> 5);
    if (r >= a.E)
        return;
    int nb = a.F / QK, total = a.k * nb;
    float acc = 0.0f;
    if constexpr (kq_type(QT)) { /* the lanes share the k experts' 64-value units of the row */
        int nu = a.F / KQ_UNIT;
        for (int idx = lane; idx < a.k * nu; idx += 32) {
            int j = idx / nu, u = idx - j * nu;
            kq_unit ku;
            kq_load_unit<QT>(dn[j] + (size_t)r * a.rb_d, u, ku);
            float sdot[MM_NT] = {0.0f};
            kq_dot_unit<QT, false>(ku, u, hq + (size_t)j * a.F, hd + (size_t)j * nb, nb, 1, sdot);
            acc += wt[j] * sdot[0];
        } /* then the warp sum below (the block loop is empty for k-quants) */
    } else if (a.pairs_d) {
        /* pairs of blocks (4-byte aligned) as 32-bit loads, and all of a lane's pairs loaded
         * before any arithmetic: one round trip to memory instead of one per block. The lanes
         * split the blocks in pairs, so the sum runs in another order than the loop below's;
         * the table and the pointer forms both come here (cache slots are aligned), so they
         * still agree bit for bit. */
        constexpr int NU = BLK * 2 / 4;
        int npr = nb / 2, tp = a.k * npr; /* pairs in the row: k experts x npr */
        uint32_t u[MOE_DN_PAIRS][NU];
#pragma unroll
        for (int i = 0; i < MOE_DN_PAIRS; i++) {
            int idx = lane + 32 * i;
            if (idx < tp) {
                int j = idx / npr, pp = idx - j * npr;
                const uint32_t *bp = (const uint32_t *)(dn[j] + (size_t)r * a.rb_d + (size_t)pp * 2 * BLK);
#pragma unroll
                for (int v = 0; v < NU; v++)
                    u[i][v] = __ldg(bp + v);
            }
        }
#pragma unroll
        for (int i = 0; i < MOE_DN_PAIRS; i++) {
            int idx = lane + 32 * i;
            if (idx >= tp)
                break;
            int j = idx / npr, pp = idx - j * npr;
            for (int h = 0; h < 2; h++) {
                int wq[8];
                float dw;
                if (QT == 8) {
                    dw = f16_bits_to_f32((uint16_t)(h ? u[i][8] >> 16 : u[i][0] & 0xFFFFu));
#pragma unroll
                    for (int v = 0; v < 8; v++)
                        wq[v] = h ? (int)u[i][9 + v] : (int)__funnelshift_r(u[i][v], u[i][v + 1], 16);
                } else {
                    uint32_t q[4];
                    dw = f16_bits_to_f32((uint16_t)(h ? u[i][4] >> 16 : u[i][0] & 0xFFFFu));
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        q[v] = h ? u[i][5 + v] : __funnelshift_r(u[i][v], u[i][v + 1], 16);
                    unpack_q4(q, wq);
                }
                float sdot[MM_NT] = {0.0f};
                dot_block<false>(wq, dw, hq + (size_t)j * a.F, hd + (size_t)j * nb, nb, 2 * pp + h, 1, sdot);
                acc += wt[j] * sdot[0];
            }
        }
        acc = warp_sum(acc);
        if (lane == 0)
            y[r] = a.add ? y[r] + acc : acc;
        return;
    }
    for (int idx = kq_type(QT) ? total : lane; idx < total; idx += 32) {
        int j = idx / nb, b = idx - j * nb;
        const uint16_t *bp = (const uint16_t *)(dn[j] + (size_t)r * a.rb_d + (size_t)b * BLK);
        float dw = f16_bits_to_f32(__ldg(bp));
        int wq[8];
        if (QT == 8) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                wq[i] = (int)((uint32_t)__ldg(bp + 1 + 2 * i) | ((uint32_t)__ldg(bp + 2 + 2 * i) << 16));
        } else {
            uint32_t q[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                q[i] = (uint32_t)__ldg(bp + 1 + 2 * i) | ((uint32_t)__ldg(bp + 2 + 2 * i) << 16);
            unpack_q4(q, wq);
        }
        float s[MM_NT] = {0.0f};
        dot_block<false>(wq, dw, hq + (size_t)j * a.F, hd + (size_t)j * nb, nb, b, 1, s);
        acc += wt[j] * s[0];
    }
    acc = warp_sum(acc);
    if (lane == 0)
        y[r] = a.add ? y[r] + acc : acc; /* y + acc: the bits of axpy_kernel's y + 1.0f * acc */
}

static bool aligned4(const void *p) { return ((uintptr_t)p & 3) == 0; }

/* The shape part of the arguments from expert ex (types, sizes, row bytes); false when the
 * fused kernels do not take it. */
static bool moe_shape(const struct expert_weights *ex, int k, moe_args *a)
{
    memset(a, 0, sizeof *a);
    if (k < 1 || k > MOE_MAX_K)
        return false;
    uint32_t T = ex->gate.type, TD = ex->down.type;
    auto known = [](uint32_t t) { return t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0 || kq_type(t); };
    if (!known(T) || !known(TD))
        return false;
    a->type_d = TD;
    a->k = k;
    a->E = (int)ex->gate.ne[0];
    a->F = (int)ex->gate.ne[1];
    a->rb_gu = ex->gate.row_bytes;
    a->rb_d = ex->down.row_bytes;
    if (a->E <= 0 || a->F <= 0 || a->E % QK || a->F % QK)
        return false;
    if ((kq_type(T) && a->E % QK_K) || (kq_type(TD) && a->F % QK_K))
        return false;
    if (ex->up.type != T || (int)ex->up.ne[0] != a->E || (int)ex->up.ne[1] != a->F ||
        (int)ex->down.ne[0] != a->F || (int)ex->down.ne[1] != a->E || ex->up.row_bytes != a->rb_gu)
        return false;
    a->pairs_gu = !kq_type(T) && (a->E / QK) % 2 == 0 && (a->rb_gu & 3) == 0;
    a->pairs_d = !kq_type(TD) && (a->F / QK) % 2 == 0 && (a->rb_d & 3) == 0 &&
                 k * (a->F / QK) / 2 <= 32 * MOE_DN_PAIRS;
    size_t sm = (((size_t)a->E + 15) & ~(size_t)15) + (size_t)(a->E / QK) * sizeof(float);
    return sm <= 40 * 1024;
}

static int moe_launch(struct cuda_ctx *c, uint32_t T, const moe_args &a, const float *x, float *y,
                      bool route_once = false)
{
    int k = a.k;
    size_t sm = (((size_t)a.E + 15) & ~(size_t)15) + (size_t)(a.E / QK) * sizeof(float);
    size_t qbytes = ((size_t)k * a.F + 255) & ~(size_t)255;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + (size_t)k * (a.F / QK) * sizeof(float));
    if (!ws)
        return c->err ? c->err : TIDE_ENOMEM;
    int8_t *hq = (int8_t *)ws;
    float *hd = (float *)(ws + qbytes);
    dim3 g1((unsigned)(a.F / QK), (unsigned)k), g2((unsigned)((a.E + MOE_DN_WARPS - 1) / MOE_DN_WARPS));
    unsigned b1 = MOE_GU_WARPS * 32, b2 = MOE_DN_WARPS * 32;
    /* routed once already (route_once): the gate and up loads go out before x is quantised */
    bool pf = route_once && a.table && !a.logits && a.pairs_gu && a.E / QK / 2 <= 32 &&
              (T == GGML_TYPE_Q8_0 || T == GGML_TYPE_Q4_0);
    if (pf && T == GGML_TYPE_Q8_0)
        moe_gate_up_pf_kernel<8><<<g1, b1, sm, c->st>>>(a, x, hq, hd);
    else if (pf)
        moe_gate_up_pf_kernel<2><<<g1, b1, sm, c->st>>>(a, x, hq, hd);
    else
    switch (T) { /* gate + up */
    case GGML_TYPE_Q8_0: moe_gate_up_kernel<8><<<g1, b1, sm, c->st>>>(a, x, hq, hd); break;
    case GGML_TYPE_Q4_0: moe_gate_up_kernel<2><<<g1, b1, sm, c->st>>>(a, x, hq, hd); break;
    case GGML_TYPE_Q4_K: moe_gate_up_kernel<KQ_Q4_K><<<g1, b1, sm, c->st>>>(a, x, hq, hd); break;
    case GGML_TYPE_Q5_K: moe_gate_up_kernel<KQ_Q5_K><<<g1, b1, sm, c->st>>>(a, x, hq, hd); break;
    default: moe_gate_up_kernel<KQ_Q6_K><<<g1, b1, sm, c->st>>>(a, x, hq, hd); break;
    }
    if (!CU_LAUNCH(c, "moe_gate_up_kernel"))
        return c->err;
    switch (a.type_d) { /* down + weighted sum */
    case GGML_TYPE_Q8_0: moe_down_kernel<8><<<g2, b2, 0, c->st>>>(a, hq, hd, y); break;
    case GGML_TYPE_Q4_0: moe_down_kernel<2><<<g2, b2, 0, c->st>>>(a, hq, hd, y); break;
    case GGML_TYPE_Q4_K: moe_down_kernel<KQ_Q4_K><<<g2, b2, 0, c->st>>>(a, hq, hd, y); break;
    case GGML_TYPE_Q5_K: moe_down_kernel<KQ_Q5_K><<<g2, b2, 0, c->st>>>(a, hq, hd, y); break;
    default: moe_down_kernel<KQ_Q6_K><<<g2, b2, 0, c->st>>>(a, hq, hd, y); break;
    }
    return CU_LAUNCH(c, "moe_down_kernel") ? 0 : c->err;
}

int cuda_moe_ffn(struct cuda_ctx *c, const struct expert_weights *ex, const float *w, int k, const float *x,
                 float *y, bool add)
{
    if (c->err)
        return c->err;
    moe_args a;
    if (!moe_shape(&ex[0], k, &a))
        return TIDE_EUNSUPPORTED;
    uint32_t T = ex[0].gate.type;
    for (int j = 0; j < k; j++) {
        const struct expert_weights *e = &ex[j];
        if (e->gate.type != T || e->up.type != T || e->down.type != a.type_d || (int)e->gate.ne[0] != a.E ||
            (int)e->up.ne[0] != a.E || (int)e->gate.ne[1] != a.F || (int)e->up.ne[1] != a.F ||
            (int)e->down.ne[0] != a.F || (int)e->down.ne[1] != a.E || e->gate.row_bytes != a.rb_gu ||
            e->up.row_bytes != a.rb_gu || e->down.row_bytes != a.rb_d || !e->gate.data || !e->up.data ||
            !e->down.data)
            return TIDE_EUNSUPPORTED;
        a.gate[j] = (const uint8_t *)e->gate.data;
        a.up[j] = (const uint8_t *)e->up.data;
        a.down[j] = (const uint8_t *)e->down.data;
        a.w[j] = w[j];
        a.pairs_gu = a.pairs_gu && aligned4(a.gate[j]) && aligned4(a.up[j]);
        a.pairs_d = a.pairs_d && aligned4(a.down[j]);
        /* the k-quant units' word loads: 4-byte aligned rows (q6_K: 2) */
        if ((kq_type(T) && !(aligned4(a.gate[j]) && aligned4(a.up[j]))) ||
            (kq_type(a.type_d) && ((uintptr_t)a.down[j] & (a.type_d == GGML_TYPE_Q6_K ? 1 : 3))))
            return TIDE_EUNSUPPORTED;
    }
    if (!x)
        return 0; /* a probe: these would run fused */
    a.add = add;
    return moe_launch(c, T, a, x, y);
}

/* The table form. The table's addresses are the expert cache's slots, 256-byte aligned, so
 * the paired 4-byte loads of moe_shape's pairs_gu and pairs_d are safe without looking at them. */
int cuda_moe_ffn_table(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                       const int32_t *routed, int k, const float *x, float *y, bool add)
{
    if (c->err)
        return c->err;
    moe_args a;
    if (!moe_shape(shape, k, &a))
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0;
    a.table = table;
    a.routed = routed;
    a.add = add;
    return moe_launch(c, shape->gate.type, a, x, y);
}

/* route + moe_ffn_table in one: moe_gate_up_kernel routes the token from its logits (the
 * route_kernel code, so the same bits) and its CTA (0, 0) leaves route()'s output in routed. */
int cuda_moe_ffn_table_route(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                             const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                             const float *x, float *y, bool add)
{
    if (c->err)
        return c->err;
    if (n != 1)
        return cuda_moe_ffn_table_rows(c, shape, table, logits, n, n_expert, norm, routed, k, x, y, add);
    moe_args a;
    if (!moe_shape(shape, k, &a) || k > n_expert || n_expert > ROUTE_MAX_EXPERTS)
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0;
    a.table = table;
    a.routed = routed;
    a.add = add;
    if (cuda_set_decode_opt(CUDA_MOE_ROUTE_ONCE, -1)) {
        /* route once (route()'s kernel, so the same words), then the table form without the
         * routing in every CTA: the bits of route + moe_ffn_table, and of the fused form */
        route_kernel<<<1, 32, 0, c->st>>>(logits, 1, n_expert, k, norm ? 1 : 0, routed);
        if (!CU_LAUNCH(c, "route_kernel"))
            return c->err;
        return moe_launch(c, shape->gate.type, a, x, y, true);
    }
    a.logits = logits;
    a.n_expert = n_expert;
    a.norm = norm;
    return moe_launch(c, shape->gate.type, a, x, y);
}

void cuda_route(struct cuda_ctx *c, const float *logits, int n, int n_expert, int k, bool norm, int32_t *out)
{
    if (n <= 0 || k < 1 || k > ROUTE_MAX_K || k > n_expert || n_expert > ROUTE_MAX_EXPERTS) {
        if (!c->err) {
            c->err = TIDE_EUNSUPPORTED;
            snprintf(c->errmsg, sizeof c->errmsg, "route: %d of %d experts is outside the kernel's limits", k,
                     n_expert);
        }
        return;
    }
    route_kernel<<<n, 32, 0, c->st>>>(logits, n, n_expert, k, norm ? 1 : 0, out);
    CU_LAUNCH(c, "route_kernel");
}
