/* mmq.cuh - the dp4a row-dot of q8_0 / q4_0 weight rows with int8-quantised inputs, shared
 * by matmul.cu (one product per launch) and moe.cu (all chosen experts in one launch).
 * The per-block formula is the CPU backend's, so results match it up to summation order. */
#ifndef TIDE_CUDA_MMQ_CUH
#define TIDE_CUDA_MMQ_CUH

#include "engine/cuda/common.cuh"

#define MM_WARPS 4   /* rows per CTA in the row-per-warp kernels */
#define MM_NT 8      /* tokens per launch of the row-per-warp kernels */

/* One output element: y = v, or y += v for matmul_add (the residual add fused into the
 * product; y + v is the bits of axpy_kernel's y + 1.0f * v). */
__device__ __forceinline__ void mm_put(float *y, float v, bool add)
{
    *y = add ? *y + v : v;
}

/* The row-per-warp kernels' frame around a row's dot: mm_sums_clear before it, and after it
 * mm_sums_store, which sums each vector's s[t] over the warp and has lane 0 put it at
 * y[t * rows + r] (NT: a bound on nt the kernel knows, for a shorter unrolled loop). */
__device__ __forceinline__ void mm_sums_clear(float s[MM_NT])
{
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        s[t] = 0.0f;
}

template <int NT = MM_NT>
__device__ __forceinline__ void mm_sums_store(const float s[MM_NT], int nt, float *y, int rows, int r, bool add,
                                              int lane)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < nt) {
            float v = warp_sum(s[t]);
            if (lane == 0)
                mm_put(y + (size_t)t * rows + r, v, add);
        }
    }
}

/* xq (n, cols) int8, xd (n, cols/32) f32 scale already rounded through f16. One warp per
 * block of 32: d = amax/127, q = round-to-nearest-even(v / d), as backend_cpu.c does.
 * PERM stores each block's 4-byte words in the order 0,4,1,5,2,6,3,7, the order the
 * tensor-core kernel (mmq_mma.cu, moe_prefill.cu) reads its fragments in; the values are the same. */
template <bool PERM>
__global__ void quantize_q8_kernel(const float *__restrict__ x, int nblocks, int8_t *__restrict__ xq,
                                   float *__restrict__ xd)
{
    int gb = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (gb >= nblocks)
        return;
    float v = x[(size_t)gb * QK + lane];
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int w = lane >> 2, pos = PERM ? (w < 4 ? 2 * w : 2 * w - 7) * 4 + (lane & 3) : lane;
    xq[(size_t)gb * QK + pos] = (int8_t)__float2int_rn(v * id);
    if (lane == 0)
        xd[gb] = __half2float(__float2half_rn(d));
}

/* s[t] += dw * xd[t] * (wq . xq[t]) for one 32-block: the CPU's exact per-block formula. */
template <bool SMEM>
__device__ __forceinline__ void dot_block(const int wq[8], float dw, const int8_t *xq, const float *xd, int nb, int b,
                                          int nt, float s[MM_NT])
{
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            const int4 *xp = (const int4 *)(xq + ((size_t)t * nb + b) * QK);
            int4 a = SMEM ? xp[0] : __ldg(xp), c = SMEM ? xp[1] : __ldg(xp + 1);
            int acc = dp4a_dot8(wq, a, c);
            float xs = SMEM ? xd[(size_t)t * nb + b] : __ldg(xd + (size_t)t * nb + b);
            s[t] += (dw * xs) * (float)acc;
        }
    }
}

/* q4_0: byte j holds element j (low nibble) and j + 16 (high), both offset by 8 */
__device__ __forceinline__ void unpack_q4(const uint32_t u[4], int wq[8])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        wq[i] = (int)__vsub4(u[i] & 0x0F0F0F0Fu, 0x08080808u);
        wq[4 + i] = (int)__vsub4((u[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
}

/* One warp's dot of weight row wr with nt quantised vectors. When pairs is set (row 4-byte
 * aligned, nb even) each lane takes two adjacent blocks (68 bytes for q8_0, 36 for q4_0,
 * both 4-byte aligned) with 32-bit loads and funnel shifts, half the load instructions of
 * the 16-bit path, and a warp covers 64 blocks per step. */
template <int QT, bool SMEM>
__device__ __forceinline__ void row_dot_q(const uint8_t *__restrict__ wr, int nb, bool pairs, const int8_t *xq,
                                          const float *xd, int nt, float s[MM_NT], int lane)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    constexpr int NU = BLK * 2 / 4; /* u32 per pair: 17 or 9 */
    int b0 = 0;
    if (pairs) {
        int np = nb / 2;
#pragma unroll 2
        for (int p = lane; p < np; p += 32) {
            const uint32_t *pp = (const uint32_t *)(wr + (size_t)p * 2 * BLK);
            uint32_t u[NU];
#pragma unroll
            for (int i = 0; i < NU; i++)
                u[i] = __ldg(pp + i);
            int wq[8];
            float d0 = f16_bits_to_f32((uint16_t)(u[0] & 0xFFFFu));
            if (QT == 8) {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    wq[i] = (int)__funnelshift_r(u[i], u[i + 1], 16);
                dot_block<SMEM>(wq, d0, xq, xd, nb, 2 * p, nt, s);
                float d1 = f16_bits_to_f32((uint16_t)(u[8] >> 16));
#pragma unroll
                for (int i = 0; i < 8; i++)
                    wq[i] = (int)u[9 + i];
                dot_block<SMEM>(wq, d1, xq, xd, nb, 2 * p + 1, nt, s);
            } else {
                uint32_t q[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    q[i] = __funnelshift_r(u[i], u[i + 1], 16);
                unpack_q4(q, wq);
                dot_block<SMEM>(wq, d0, xq, xd, nb, 2 * p, nt, s);
                float d1 = f16_bits_to_f32((uint16_t)(u[4] >> 16));
#pragma unroll
                for (int i = 0; i < 4; i++)
                    q[i] = u[5 + i];
                unpack_q4(q, wq);
                dot_block<SMEM>(wq, d1, xq, xd, nb, 2 * p + 1, nt, s);
            }
        }
        b0 = np * 2;
    }
    for (int b = b0 + lane; b < nb; b += 32) {
        const uint16_t *bp = (const uint16_t *)(wr + (size_t)b * BLK);
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
        dot_block<SMEM>(wq, dw, xq, xd, nb, b, nt, s);
    }
}

/* Two rows against one quantised vector (nt = 1), with the pairs layout: each step loads both
 * rows' pair before any arithmetic, so a warp has twice the bytes in flight of two row_dot_q
 * calls (at decode sizes the latency of those loads, not the bandwidth, bounds the kernels).
 * Per row the same blocks in the same order as row_dot_q, so the same bits. */
template <int QT>
__device__ __forceinline__ void row_dot2_q(const uint8_t *__restrict__ wa, const uint8_t *__restrict__ wb, int nb,
                                           const int8_t *xq, const float *xd, float *sa, float *sb, int lane)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    constexpr int NU = BLK * 2 / 4;
    int np = nb / 2;
#pragma unroll 2
    for (int p = lane; p < np; p += 32) {
        const uint32_t *pa = (const uint32_t *)(wa + (size_t)p * 2 * BLK);
        const uint32_t *pb = (const uint32_t *)(wb + (size_t)p * 2 * BLK);
        uint32_t u[2][NU];
#pragma unroll
        for (int i = 0; i < NU; i++) {
            u[0][i] = __ldg(pa + i);
            u[1][i] = __ldg(pb + i);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float s[MM_NT] = {0.0f};
            s[0] = r ? *sb : *sa;
            int wq[8];
            float d0 = f16_bits_to_f32((uint16_t)(u[r][0] & 0xFFFFu));
            if (QT == 8) {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    wq[i] = (int)__funnelshift_r(u[r][i], u[r][i + 1], 16);
                dot_block<true>(wq, d0, xq, xd, nb, 2 * p, 1, s);
                float d1 = f16_bits_to_f32((uint16_t)(u[r][8] >> 16));
#pragma unroll
                for (int i = 0; i < 8; i++)
                    wq[i] = (int)u[r][9 + i];
                dot_block<true>(wq, d1, xq, xd, nb, 2 * p + 1, 1, s);
            } else {
                uint32_t q[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    q[i] = __funnelshift_r(u[r][i], u[r][i + 1], 16);
                unpack_q4(q, wq);
                dot_block<true>(wq, d0, xq, xd, nb, 2 * p, 1, s);
                float d1 = f16_bits_to_f32((uint16_t)(u[r][4] >> 16));
#pragma unroll
                for (int i = 0; i < 4; i++)
                    q[i] = u[r][5 + i];
                unpack_q4(q, wq);
                dot_block<true>(wq, d1, xq, xd, nb, 2 * p + 1, 1, s);
            }
            if (r) *sb = s[0]; else *sa = s[0];
        }
    }
}

#endif
