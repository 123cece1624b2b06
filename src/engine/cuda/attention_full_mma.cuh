/* attention_full_mma.cuh - the device code of attention_full_mma.cu (the vision encoder's full
 * attention on the f16 tensor cores; the why, the layout and the numerics are there): a header so
 * that the host emulation (tests/gpu/emu/full_mma_emu.cpp, `make full-mma-emu`) compiles this very
 * code with g++. The mma goes through mma_16816.cuh, which the emulator's stand-in replaces. */
#ifndef TIDE_CUDA_ATTENTION_FULL_MMA_CUH
#define TIDE_CUDA_ATTENTION_FULL_MMA_CUH

#include "engine/cuda/common.cuh"
#include "engine/cuda/mma_16816.cuh"

#define VA_ROWS 64    /* queries per CTA: 4 warps of 16 rows */
#define VA_BK 64      /* keys per tile */
#define VA_THREADS 128

__device__ __forceinline__ uint32_t va_half2(float a, float b)
{
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

/* d += A(16x16) B(16x8), f16 in, f32 accumulate */
__device__ __forceinline__ void va_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    mma_16816<__half>(d, a, b0, b1);
}

/* grid (ceil(P / 64), n_head). q, k, v, out (P, A = n_head * HD); scale2 = log2(e) / sqrt(HD).
 * Fragment layout as attn_prefill_mma_kernel's (g = lane / 4, t = lane % 4): a thread's rows
 * are g and g + 8 of its warp's 16, its score columns 2t, 2t+1 of each 8-key tile. */
template <int HD>
__global__ void __launch_bounds__(VA_THREADS)
attn_full_mma_kernel(const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,
                     float *__restrict__ out, int P, int A, float scale2)
{
    constexpr int HP = (HD + 15) / 16 * 16; /* the head padded to whole k steps */
    constexpr int KS = HP / 16;             /* k steps of Q K^T */
    constexpr int DT = HD / 8;              /* 8-wide output column tiles */
    constexpr int NT = VA_BK / 8;           /* 8-key score tiles */
    constexpr int KLD = HP + 8;             /* halves a key row: 36 or 44 words, 4 mod 8: a B fragment's 8 rows start in distinct bank quads */
    constexpr int VLD = VA_BK + 8;          /* halves a d row of V^T: 36 words */
    static_assert(HD % 8 == 0 && HD <= 128, "head width");
    __shared__ __align__(16) __half ks[VA_BK * KLD]; /* (64 keys, HP) */
    __shared__ __align__(16) __half vt[HD * VLD];    /* (HD, 64 keys): V transposed */
    int t0 = blockIdx.x * VA_ROWS;
    const float *qh = q + (size_t)blockIdx.y * HD, *kh = k + (size_t)blockIdx.y * HD, *vh = v + (size_t)blockIdx.y * HD;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    constexpr int PAD = HP > HD ? HP - HD : 1; /* (1: a divisor only; no padding is written then) */
    if (HP > HD)
        for (int i = tid; i < VA_BK * PAD; i += VA_THREADS)
            ks[(i / PAD) * KLD + HD + i % PAD] = __float2half_rn(0.0f);
    int rr[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8}; /* c0/c1's row and c2/c3's */
    uint32_t qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++)
#pragma unroll
        for (int f = 0; f < 4; f++) { /* a0: row 0, d; a1: row 1, d; a2 / a3: d + 8 */
            int row = rr[f & 1], d = s * 16 + 2 * t + (f >> 1) * 8;
            float2 x = row < P && d < HD ? *(const float2 *)(qh + (size_t)row * A + d) : make_float2(0.0f, 0.0f);
            qa[s][f] = va_half2(x.x, x.y);
        }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this thread's share of the row sum */
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    for (int k0 = 0; k0 < P; k0 += VA_BK) {
        __syncthreads(); /* the last tile's P V is done with ks and vt (and the padding is written) */
        /* K: a warp reads whole key rows; V: consecutive keys of one d quad, so the transposed
         * stores of a warp fill consecutive halves. Keys past the last are zero (their scores
         * are masked, but a NaN from memory times p = 0 would still be NaN). */
        for (int i = tid; i < VA_BK * HD / 4; i += VA_THREADS) {
            int j = i / (HD / 4), d4 = (i % (HD / 4)) * 4;
            float4 kv = k0 + j < P ? __ldg((const float4 *)(kh + (size_t)(k0 + j) * A + d4))
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(uint2 *)&ks[j * KLD + d4] = make_uint2(va_half2(kv.x, kv.y), va_half2(kv.z, kv.w));
            int jv = i % VA_BK, dv = (i / VA_BK) * 4;
            float4 vv = k0 + jv < P ? __ldg((const float4 *)(vh + (size_t)(k0 + jv) * A + dv))
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            vt[(dv + 0) * VLD + jv] = __float2half_rn(vv.x);
            vt[(dv + 1) * VLD + jv] = __float2half_rn(vv.y);
            vt[(dv + 2) * VLD + jv] = __float2half_rn(vv.z);
            vt[(dv + 3) * VLD + jv] = __float2half_rn(vv.w);
        }
        __syncthreads();

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const uint32_t *kr = (const uint32_t *)&ks[(j * 8 + g) * KLD];
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                va_mma(s[j], qa[kk], kr[kk * 8 + t], kr[kk * 8 + 4 + t]);
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1);
                s[j][e] = key < P ? s[j][e] * scale2 : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float alpha[2], mn[2];
#pragma unroll
        for (int h = 0; h < 2; h++) { /* the 4 lanes of a row are adjacent */
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            mn[h] = fmaxf(m[h], mx[h]);
            /* every tile has a live key (k0 < P), so mn is finite from the first tile on; the
             * guard keeps exp(-inf - -inf) out all the same */
            alpha[h] = mn[h] == -INFINITY ? 1.0f : exp2f(m[h] - mn[h]);
            m[h] = mn[h];
            l[h] *= alpha[h];
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = mn[e >> 1] == -INFINITY ? 0.0f : exp2f(s[j][e] - mn[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int d = 0; d < DT; d++) {
            o[d][0] *= alpha[0], o[d][1] *= alpha[0];
            o[d][2] *= alpha[1], o[d][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < VA_BK / 16; kk++) {
            uint32_t pa[4] = {va_half2(s[2 * kk][0], s[2 * kk][1]), va_half2(s[2 * kk][2], s[2 * kk][3]),
                              va_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              va_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int d = 0; d < DT; d++) {
                const uint32_t *vr = (const uint32_t *)&vt[(d * 8 + g) * VLD];
                va_mma(o[d], pa, vr[kk * 8 + t], vr[kk * 8 + 4 + t]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        if (rr[h] >= P)
            continue;
        float inv = 1.0f / l[h];
        float *orow = out + (size_t)rr[h] * A + (size_t)blockIdx.y * HD;
#pragma unroll
        for (int d = 0; d < DT; d++)
            *(float2 *)(orow + d * 8 + 2 * t) = make_float2(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
    }
}

#endif
