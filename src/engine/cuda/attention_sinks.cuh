/* attention_sinks.cuh - the device code of oai_ops.cu's attention with sinks and a sliding window
 * (backend_i.attention_sinks: gpt-oss, and deepseek2's 576-wide MLA rows), kept in a header so
 * that the host emulation (tests/gpu/emu/sinks_attn_emu.cpp, `make sinks-attn-emu`) compiles this
 * very code with g++.
 *
 * A warp per (query token, head) with an online softmax over the token's window, 32 kv positions
 * a step (a lane scores one position; the lanes then split head_dim to add the values), so it
 * needs no score buffer however long the context: correct and simple, not tuned (gpt-oss's
 * decode runs op by op anyway). The cache is f32 or f16 (T), contiguous or paged (PAGED: row p
 * through the sequence's block table, attention.cuh's kv_page_row); the arithmetic is f32 and the
 * same for every form, so a paged cache gives the contiguous one's bits over the same rows. */
#ifndef TIDE_CUDA_ATTENTION_SINKS_CUH
#define TIDE_CUDA_ATTENTION_SINKS_CUH

#include "engine/cuda/attention.cuh" /* kv_page_row */

#define SINK_WARPS 4    /* (token, head) pairs a CTA */
#define SINK_MAX_HD 576 /* head_dim / 32 values a lane: up to deepseek2's MLA rows (512 + 64) */

/* four cache elements at p (16-byte aligned for f32, 8 for f16: head_dim a multiple of 32) */
__device__ __forceinline__ float4 sink_load4(const float *p)
{
    return __ldg((const float4 *)p);
}
__device__ __forceinline__ float4 sink_load4(const __half *p)
{
    float2 a = __half22float2(__ldg((const __half2 *)p)), b = __half22float2(__ldg((const __half2 *)p + 1));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float sink_load1(const float *p)
{
    return __ldg(p);
}
__device__ __forceinline__ float sink_load1(const __half *p)
{
    return __half2float(__ldg(p));
}

/* A warp per (token t, head h): t at position pos + t attends to t0..p. The softmax's maximum
 * starts at the sink's logit and its denominator at exp(sink - max) (the sink adds no value
 * row), as cpu_attention_sinks does. kc, vc: the layer's cache (n_ctx, n_head_kv * hd) or, PAGED,
 * its block pool, row p found through tab (block_rows = 2^shift). */
template <typename T, bool PAGED>
__global__ void __launch_bounds__(SINK_WARPS * 32)
attention_sinks_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                       float *__restrict__ out, int n, int pos, int n_head, int n_head_kv, int hd,
                       const float *__restrict__ sinks, int window, const int32_t *__restrict__ tab, int shift)
{
    extern __shared__ float sq[]; /* SINK_WARPS query heads */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gw = blockIdx.x * SINK_WARPS + warp;
    if (gw >= n * n_head)
        return;
    int t = gw / n_head, h = gw % n_head, p = pos + t;
    int t0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    int kvd = n_head_kv * hd, kvh = h / (n_head / n_head_kv), per = hd / 32;
    float scale = 1.0f / sqrtf((float)hd);
    float *qs = sq + (size_t)warp * hd;
    const float *qh = q + ((size_t)t * n_head + h) * hd;
    for (int i = lane; i < hd; i += 32)
        qs[i] = qh[i];
    __syncwarp();
    float mx = sinks ? sinks[h] : -INFINITY, sum = sinks ? 1.0f : 0.0f;
    float o[SINK_MAX_HD / 32];
#pragma unroll
    for (int k = 0; k < SINK_MAX_HD / 32; k++)
        o[k] = 0.0f;
    for (int c0 = t0; c0 <= p; c0 += 32) {
        int tt = c0 + lane;
        float s = -INFINITY;
        if (tt <= p) {
            size_t row = PAGED ? kv_page_row(tab, shift, tt) : (size_t)tt;
            const T *kr = kc + row * kvd + (size_t)kvh * hd;
            const float4 *q4 = (const float4 *)qs;
            float d = 0.0f;
            for (int i = 0; i < hd / 4; i++) {
                float4 a = sink_load4(kr + 4 * i), b = q4[i];
                d += b.x * a.x + b.y * a.y + b.z * a.z + b.w * a.w;
            }
            s = d * scale;
        }
        float m_new = fmaxf(mx, warp_max(s));
        float corr = expf(mx - m_new); /* mx -inf (no sink, first step): 0 */
        float e = tt <= p ? expf(s - m_new) : 0.0f;
        sum = sum * corr + warp_sum(e);
#pragma unroll
        for (int k = 0; k < SINK_MAX_HD / 32; k++)
            o[k] *= corr;
        int cnt = p - c0 + 1 < 32 ? p - c0 + 1 : 32;
        for (int j = 0; j < cnt; j++) {
            float pj = __shfl_sync(0xffffffffu, e, j);
            size_t row = PAGED ? kv_page_row(tab, shift, c0 + j) : (size_t)(c0 + j);
            const T *vr = vc + row * kvd + (size_t)kvh * hd;
#pragma unroll
            for (int k = 0; k < SINK_MAX_HD / 32; k++)
                if (k < per)
                    o[k] = fmaf(pj, sink_load1(vr + lane + 32 * k), o[k]);
        }
        mx = m_new;
    }
    float inv = 1.0f / sum;
    float *oh = out + ((size_t)t * n_head + h) * hd;
#pragma unroll
    for (int k = 0; k < SINK_MAX_HD / 32; k++)
        if (k < per)
            oh[lane + 32 * k] = o[k] * inv;
}

#endif
