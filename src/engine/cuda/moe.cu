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
 *      loop in another summation order).
 * q8_0 and q4_0 weights (dp4a, mmq.cuh); other types report TIDE_EUNSUPPORTED and the
 * forward uses the per-expert ops. */
#include "engine/cuda/mmq.cuh"

#include <string.h>

#define MOE_MAX_K 16
#define MOE_GU_WARPS 16 /* kernel 1: 16 warps x 2 rows = one 32-row block of h */
#define MOE_DN_WARPS 8  /* kernel 2: one output row a warp */

struct moe_args {
    const uint8_t *gate[MOE_MAX_K], *up[MOE_MAX_K], *down[MOE_MAX_K];
    float w[MOE_MAX_K];
    size_t rb_gu, rb_d; /* row bytes of gate/up (E columns) and down (F columns) */
    int k, E, F;
    bool pairs_gu;
};

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
    for (int b = warp; b < nb; b += MOE_GU_WARPS) {
        float v = __ldg(x + (size_t)b * QK + lane);
        float amax = warp_max(fabsf(v));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        xq[b * QK + lane] = (int8_t)__float2int_rn(v * id);
        if (lane == 0)
            xd[b] = __half2float(__float2half_rn(d));
    }
    __syncthreads();
    int j = blockIdx.y, r0 = blockIdx.x * QK;
    for (int i = 0; i < QK / MOE_GU_WARPS; i++) {
        int rr = warp + i * MOE_GU_WARPS, r = r0 + rr;
        float g[MM_NT], u[MM_NT];
#pragma unroll
        for (int t = 0; t < MM_NT; t++)
            g[t] = u[t] = 0.0f;
        row_dot_q<QT, true>(a.gate[j] + (size_t)r * a.rb_gu, nb, a.pairs_gu, xq, xd, 1, g, lane);
        row_dot_q<QT, true>(a.up[j] + (size_t)r * a.rb_gu, nb, a.pairs_gu, xq, xd, 1, u, lane);
        float gv = warp_sum(g[0]), uv = warp_sum(u[0]);
        if (lane == 0)
            hs[rr] = gv / (1.0f + expf(-gv)) * uv; /* as swiglu_kernel / cpu_swiglu */
    }
    __syncthreads();
    if (warp == 0) {
        float v = hs[lane];
        float amax = warp_max(fabsf(v));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        size_t o = (size_t)j * a.F + r0;
        hq[o + lane] = (int8_t)__float2int_rn(v * id);
        if (lane == 0)
            hd[o / QK] = __half2float(__float2half_rn(d));
    }
}

/* One output row a warp. The lanes share out all k * F/32 blocks of the row's k expert
 * rows (F = 768 is only 24 blocks: one expert a time would leave most lanes idle), each
 * block's dot scaled by its expert's weight, then one warp sum. */
template <int QT>
__global__ void __launch_bounds__(MOE_DN_WARPS * 32)
moe_down_kernel(const moe_args a, const int8_t *__restrict__ hq, const float *__restrict__ hd, float *__restrict__ y)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MOE_DN_WARPS + (threadIdx.x >> 5);
    if (r >= a.E)
        return;
    int nb = a.F / QK, total = a.k * nb;
    float acc = 0.0f;
    for (int idx = lane; idx < total; idx += 32) {
        int j = idx / nb, b = idx - j * nb;
        const uint16_t *bp = (const uint16_t *)(a.down[j] + (size_t)r * a.rb_d + (size_t)b * BLK);
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
        acc += a.w[j] * s[0];
    }
    acc = warp_sum(acc);
    if (lane == 0)
        y[r] = acc;
}

static bool aligned4(const void *p) { return ((uintptr_t)p & 3) == 0; }

int cuda_moe_ffn(struct cuda_ctx *c, const struct expert_weights *ex, const float *w, int k, const float *x,
                 float *y)
{
    if (c->err)
        return c->err;
    if (k < 1 || k > MOE_MAX_K)
        return TIDE_EUNSUPPORTED;
    uint32_t T = ex[0].gate.type;
    if (T != GGML_TYPE_Q8_0 && T != GGML_TYPE_Q4_0)
        return TIDE_EUNSUPPORTED;
    moe_args a;
    memset(&a, 0, sizeof a);
    a.k = k;
    a.E = (int)ex[0].gate.ne[0];
    a.F = (int)ex[0].gate.ne[1];
    a.rb_gu = ex[0].gate.row_bytes;
    a.rb_d = ex[0].down.row_bytes;
    if (a.E <= 0 || a.F <= 0 || a.E % QK || a.F % QK)
        return TIDE_EUNSUPPORTED;
    a.pairs_gu = (a.E / QK) % 2 == 0 && (a.rb_gu & 3) == 0;
    for (int j = 0; j < k; j++) {
        const struct expert_weights *e = &ex[j];
        if (e->gate.type != T || e->up.type != T || e->down.type != T || (int)e->gate.ne[0] != a.E ||
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
    }
    size_t sm = (((size_t)a.E + 15) & ~(size_t)15) + (size_t)(a.E / QK) * sizeof(float);
    if (sm > 40 * 1024)
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0; /* a probe: these would run fused */
    size_t qbytes = ((size_t)k * a.F + 255) & ~(size_t)255;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + (size_t)k * (a.F / QK) * sizeof(float));
    if (!ws)
        return c->err ? c->err : TIDE_ENOMEM;
    int8_t *hq = (int8_t *)ws;
    float *hd = (float *)(ws + qbytes);
    dim3 g1((unsigned)(a.F / QK), (unsigned)k), g2((unsigned)((a.E + MOE_DN_WARPS - 1) / MOE_DN_WARPS));
    if (T == GGML_TYPE_Q8_0) {
        moe_gate_up_kernel<8><<<g1, MOE_GU_WARPS * 32, sm, c->st>>>(a, x, hq, hd);
        if (!CU_LAUNCH(c, "moe_gate_up_kernel"))
            return c->err;
        moe_down_kernel<8><<<g2, MOE_DN_WARPS * 32, 0, c->st>>>(a, hq, hd, y);
    } else {
        moe_gate_up_kernel<2><<<g1, MOE_GU_WARPS * 32, sm, c->st>>>(a, x, hq, hd);
        if (!CU_LAUNCH(c, "moe_gate_up_kernel"))
            return c->err;
        moe_down_kernel<2><<<g2, MOE_DN_WARPS * 32, 0, c->st>>>(a, hq, hd, y);
    }
    return CU_LAUNCH(c, "moe_down_kernel") ? 0 : c->err;
}
