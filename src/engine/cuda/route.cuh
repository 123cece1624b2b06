/* route.cuh - top-k routing of one token by one warp (backend_i.route's arithmetic), shared
 * by moe.cu (route_kernel, the fused one-token MoE) and moe_rows.cu (a decode step's tokens). */
#ifndef TIDE_CUDA_ROUTE_CUH
#define TIDE_CUDA_ROUTE_CUH

#include "engine/cuda/common.cuh"

/* ---- top-k routing (backend_i.route), one warp a token ----
 * The steps of cpu_route: k rounds of arg-max over the experts not yet chosen (ties: the
 * lower index), exponentials in double, the chosen sorted by index. Only the sum over all
 * experts (norm off) is added in another order, a warp reduction. */
#define ROUTE_MAX_EXPERTS 1024 /* 32 per lane: one bit each in a lane's chosen mask */
#define ROUTE_MAX_K 64

__device__ __forceinline__ bool route_better(float v, int e, float bv, int be)
{
    return be < 0 || v > bv || (v == bv && e < be);
}

/* One token's routing by one warp (every lane calls it): the experts, in ascending index
 * order, to o_sel[0..k) and their weights to o_w[0..k) (written by lane 0; global or shared
 * memory). sel: MAXK ints of shared scratch. route_kernel and moe_gate_up_kernel (the fused
 * table form) both run this, so their routings are the same bits. */
template <int MAXK>
__device__ __forceinline__ void route_warp(const float *__restrict__ lg, int ne, int k, int norm, int *sel,
                                           int32_t *o_sel, float *o_w)
{
    int lane = threadIdx.x & 31;
    uint32_t chosen = 0; /* bit i: expert lane + 32 i is taken */
    for (int j = 0; j < k; j++) {
        float bv = 0.0f;
        int be = -1;
        for (int i = 0, e = lane; e < ne; i++, e += 32)
            if (!(chosen >> i & 1u)) {
                float v = lg[e];
                if (route_better(v, e, bv, be))
                    bv = v, be = e;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && route_better(ov, oe, bv, be))
                bv = ov, be = oe;
        }
        if (be >= 0 && (be & 31) == lane)
            chosen |= 1u << (be >> 5);
        if (lane == 0)
            sel[j] = be;
    }
    __syncwarp();
    float mx = lg[sel[0]];
    double all = 0.0;
    if (!norm) {
        for (int e = lane; e < ne; e += 32)
            all += exp((double)lg[e] - mx);
        for (int o = 16; o > 0; o >>= 1)
            all += __shfl_xor_sync(0xffffffffu, all, o);
    }
    if (lane == 0) {
        double w[MAXK], top = 0.0;
        int s[MAXK];
        for (int j = 0; j < k; j++) {
            s[j] = sel[j];
            w[j] = (double)(float)exp((double)lg[s[j]] - mx);
            top += w[j];
        }
        double z = norm ? top : all;
        for (int j = 1; j < k; j++) {
            int e = s[j], i = j;
            double wj = w[j];
            for (; i > 0 && s[i - 1] > e; i--)
                s[i] = s[i - 1], w[i] = w[i - 1];
            s[i] = e, w[i] = wj;
        }
        for (int j = 0; j < k; j++) {
            o_sel[j] = s[j];
            o_w[j] = (float)(w[j] / z);
        }
    }
    __syncwarp();
}

#endif
