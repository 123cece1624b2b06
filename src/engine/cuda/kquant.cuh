/* kquant.cuh - dp4a dot products of k-quant weight rows (q4_K, q5_K, q6_K: super-blocks of
 * 256 values) with x quantised to int8 blocks of 32 (quantize_q8_kernel's format), shared by
 * kquant.cu (matmul) and moe.cu (the fused expert kernels).
 *
 * A lane takes one "unit" of 64 values: two 32-value sub-blocks that share their weight bytes
 * (q4_K/q5_K: the low and high nibbles of one 32-byte run; q6_K: sub-blocks k and k + 2 of a
 * 128-value half, which share their low-bit bytes), so each weight byte is loaded once. Each
 * sub-block's integer dot with its x block is scaled as the block layout says:
 *   q4_K/q5_K: w = d*sc*q - dmin*m      -> xd * (d*sc*(q.xq) - dmin*m*sum(xq))
 *   q6_K:      w = d*sc16*(q - 32)      -> xd * d * (sc_a*(q-32).xq[0..16) + sc_b*(q-32).xq[16..32))
 * so the only rounding besides the f32 sums is x's int8 quantisation, as for q8_0 / q4_0.
 * Byte layouts (ggml's, see gguf.c): q4_K 144 bytes = f16 d, f16 dmin, 12 bytes of 6-bit
 * scales/mins, 128 bytes of nibbles; q5_K 176 bytes = the same, then 32 bytes of fifth bits
 * before the nibbles; q6_K 210 bytes = 128 low-nibble bytes, 64 bytes of 2-bit pairs, 16 int8
 * scales, f16 d (so its blocks are only 2-byte aligned). */
#ifndef TIDE_CUDA_KQUANT_CUH
#define TIDE_CUDA_KQUANT_CUH

#include "engine/cuda/mmq.cuh"

#define KQ_Q4_K 12
#define KQ_Q5_K 13
#define KQ_Q6_K 14
#define KQ_UNIT 64 /* values a lane takes at a time */

__host__ __device__ constexpr int kq_block_bytes(int T) { return T == KQ_Q4_K ? 144 : T == KQ_Q5_K ? 176 : 210; }
__host__ __device__ constexpr bool kq_type(uint32_t T) { return T == KQ_Q4_K || T == KQ_Q5_K || T == KQ_Q6_K; }

/* 8 words of 4 bytes from p, only 2-byte aligned: 9 aligned loads and funnel shifts (the
 * ninth word never passes the end of a q6_K block for the runs read below). */
__device__ __forceinline__ void kq_load8_a2(const uint8_t *p, uint32_t w[8])
{
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    uint32_t sh = ((uint32_t)(uintptr_t)p & 2u) * 8u, u[9];
#pragma unroll
    for (int i = 0; i < 9; i++)
        u[i] = __ldg(a + i);
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i] = __funnelshift_r(u[i], u[i + 1], sh);
}

/* A unit's weights, unpacked: q[h] the 32 values of sub-block h as int8x4 words, and how to
 * scale them. For q4_K/q5_K sc[h][0] == sc[h][1]; for q6_K mn and dmin are 0. */
struct kq_unit {
    int q[2][8];
    int sc[2][2];
    int mn[2];
    float d, dmin;
};

/* 6-bit scale and min of sub-block j of a q4_K/q5_K block from its 12 scale bytes (as words) */
__device__ __forceinline__ void kq_scale_min(const uint32_t s[3], int j, int *sc, int *mn)
{
    auto byte = [&](int i) { return (int)((s[i >> 2] >> (8 * (i & 3))) & 0xFFu); };
    if (j < 4) {
        *sc = byte(j) & 63;
        *mn = byte(j + 4) & 63;
    } else {
        *sc = (byte(j + 4) & 0x0F) | ((byte(j - 4) >> 6) << 4);
        *mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
}

/* Unit u (values 64u .. 64u + 63 of the row in storage order of sub-blocks, see kq_unit_blocks)
 * of row wr. q4_K/q5_K need wr 4-byte aligned (row_bytes is a multiple of 16); q6_K 2-byte. */
template <int T>
__device__ __forceinline__ void kq_load_unit(const uint8_t *__restrict__ wr, int u, kq_unit &k)
{
    const uint8_t *B = wr + (size_t)(u >> 2) * kq_block_bytes(T);
    int c = u & 3;
    if (T == KQ_Q4_K || T == KQ_Q5_K) {
        const uint32_t *b32 = (const uint32_t *)B;
        uint32_t dd = __ldg(b32), s[3] = {__ldg(b32 + 1), __ldg(b32 + 2), __ldg(b32 + 3)};
        uint32_t qs[8], qh[8];
        const uint32_t *qp = b32 + (T == KQ_Q4_K ? 4 : 12) + 8 * c;
#pragma unroll
        for (int i = 0; i < 8; i++)
            qs[i] = __ldg(qp + i);
        if (T == KQ_Q5_K) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                qh[i] = __ldg(b32 + 4 + i);
        }
        k.d = f16_bits_to_f32((uint16_t)(dd & 0xFFFFu));
        k.dmin = f16_bits_to_f32((uint16_t)(dd >> 16));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int sc, mn;
            kq_scale_min(s, 2 * c + h, &sc, &mn);
            k.sc[h][0] = k.sc[h][1] = sc;
            k.mn[h] = mn;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t v = (qs[i] >> (4 * h)) & 0x0F0F0F0Fu;
                if (T == KQ_Q5_K) /* the fifth bit of sub-block 2c + h is bit 2c + h of qh */
                    v |= ((qh[i] >> (2 * c + h)) & 0x01010101u) << 4;
                k.q[h][i] = (int)v;
            }
        }
    } else {
        /* half hh = c >> 1 of the block, sub-blocks kk and kk + 2 (kk = c & 1) */
        int hh = c >> 1, kk = c & 1;
        uint32_t ql[8], qh[8];
        kq_load8_a2(B + 64 * hh + 32 * kk, ql);
        kq_load8_a2(B + 128 + 32 * hh, qh);
        const int8_t *sc = (const int8_t *)(B + 192 + 8 * hh);
        k.d = f16_bits_to_f32(__ldg((const uint16_t *)(B + 208)));
        k.dmin = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) { /* h = 0: sub-block kk (low nibbles), 1: kk + 2 (high) */
            int sub = kk + 2 * h;
            k.sc[h][0] = __ldg(sc + 2 * sub);
            k.sc[h][1] = __ldg(sc + 2 * sub + 1);
            k.mn[h] = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t v = ((ql[i] >> (4 * h)) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * sub)) & 0x03030303u) << 4);
                k.q[h][i] = (int)__vsubss4(v, 0x20202020u); /* q - 32, in -32..31 */
            }
        }
    }
}

/* The two 32-value x blocks unit u's sub-blocks pair with (as 32-block indices of the row):
 * q4_K/q5_K 2u and 2u + 1; q6_K sub-blocks kk and kk + 2 of half hh of super-block u / 4. */
template <int T>
__device__ __forceinline__ int kq_unit_block(int u, int h)
{
    if (T == KQ_Q6_K)
        return (u >> 2) * 8 + ((u & 3) >> 1) * 4 + (u & 1) + 2 * h;
    return 2 * u + h;
}

/* s[t] += unit k . x[t] for the unit's two blocks b0, b1 (32-block indices), nt vectors. */
template <int T, bool SMEM>
__device__ __forceinline__ void kq_dot_unit(const kq_unit &k, int u, const int8_t *xq, const float *xd, int nb,
                                            int nt, float s[MM_NT])
{
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            float acc = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int b = kq_unit_block<T>(u, h);
                const int4 *xp = (const int4 *)(xq + ((size_t)t * nb + b) * QK);
                int4 a = SMEM ? xp[0] : __ldg(xp), c = SMEM ? xp[1] : __ldg(xp + 1);
                int lo = dp4a_dot4(k.q[h], a, 0), hi = dp4a_dot4(k.q[h] + 4, c, 0);
                float xs = SMEM ? xd[(size_t)t * nb + b] : __ldg(xd + (size_t)t * nb + b);
                float v = k.d * (float)(k.sc[h][0] * lo + k.sc[h][1] * hi);
                if (T != KQ_Q6_K) {
                    int sx = dp4a_sum32(a, c);
                    v -= k.dmin * (float)(k.mn[h] * sx);
                }
                acc = fmaf(xs, v, acc);
            }
            s[t] += acc;
        }
    }
}

/* One warp's dot of k-quant row wr (nu = cols / 64 units) with nt quantised vectors. */
template <int T, bool SMEM>
__device__ __forceinline__ void row_dot_kq(const uint8_t *__restrict__ wr, int nu, const int8_t *xq, const float *xd,
                                           int nt, float s[MM_NT], int lane)
{
    int nb = nu * 2;
#pragma unroll 2
    for (int u = lane; u < nu; u += 32) {
        kq_unit k;
        kq_load_unit<T>(wr, u, k);
        kq_dot_unit<T, SMEM>(k, u, xq, xd, nb, nt, s);
    }
}

#endif
