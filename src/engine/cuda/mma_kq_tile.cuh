/* mma_kq_tile.cuh - the K walk of the int8 tensor-core products for k-quant weights (q4_K,
 * q5_K, q6_K): mmq_kquant.cu's dense product and moe_prefill.cu's grouped experts share it,
 * as mma_tile.cuh's tile_mainloop is shared for q8_0 / q4_0 (same CTA shape: TILE_THREADS,
 * 128 weight rows x BN columns, the same tile_acc, tile_row and tile_col).
 *
 * What differs from tile_mainloop:
 *   - a stage is one 256-value super-block (8 x blocks of 32), not 4 blocks: a k-quant
 *     block's header (scales, mins, d) covers the whole super-block, so each is copied once.
 *     Two stages (not three) keep a CTA under ~104 KB, so 2 CTAs still share an SM; the one
 *     stage in flight is as many bytes as tile_mainloop's two;
 *   - the weights stay raw in shared memory and each thread builds its m16n8k32 A fragments
 *     from the codes (q4_K: 4-bit, 0..15; q5_K: + a fifth bit, 0..31; q6_K: 4 + 2 bits, minus
 *     32: -32..31: all int8), so the integer MMA sees exactly the codes the CPU backend dots;
 *   - the per-32 epilogue: q4_K / q5_K: acc += (d*sc * dx) * (q.xq) - dmin*m * (dx*sum(xq)),
 *     the sum term from xs (mmq_kquant.cu's kq_xsum_kernel: dx * the sum of the block's
 *     codes, made once where x is quantised); q6_K has a scale per 16 values, so a 32-block is two m16n8k16 MMAs and
 *     acc += dx * (d*sc_lo * lo + d*sc_hi * hi). Each (row, column) adds its blocks in K
 *     order, so a tile's result depends neither on BN nor on the other tiles, as in
 *     tile_mainloop; the dense and the grouped kernels give the same bits.
 * x is quantize_q8_kernel<true>'s (fragment-order words, f16-rounded scale per 32), so the
 * only difference from the CPU's int8 k-quant dot is x's blocks (32 here, 256 there) and the
 * order of the float sums.
 *
 * Alignment: q4_K / q5_K super-blocks are 144 / 176 bytes, multiples of 8, so with W 8-byte
 * aligned every block is too and a stage is 18 / 22 8-byte granules. q6_K's 210-byte blocks
 * are only 2-byte aligned (rows of 768 values are 630 bytes): a stage copies the 27 aligned
 * granules (216 bytes) that cover the block, which start 0, 2, 4 or 6 bytes before it, and
 * the fragment loads read words at that offset (two loads and a funnel shift). An aligned
 * granule that holds a byte of W never crosses a page, so the few bytes read outside W are
 * harmless and never used. */
#ifndef TIDE_CUDA_MMA_KQ_TILE_CUH
#define TIDE_CUDA_MMA_KQ_TILE_CUH

#include "engine/cuda/mma_tile.cuh"
#include "engine/cuda/kquant.cuh"

#define KQT_KB 8                      /* 32-blocks per stage: one super-block */
#define KQT_STAGES 2                  /* cp.async ring depth */
#define KQT_XLD (KQT_KB * 8 + 8)      /* words per column's stage: 72 = 8 mod 32, as TILE_XLD */

template <int T>
struct kqt_fmt {
    static constexpr int BLK = kq_block_bytes(T);            /* 144 / 176 / 210 */
    static constexpr int G8 = T == KQ_Q6_K ? 27 : BLK / 8;   /* 8-byte granules a row's stage copies */
    /* shared-memory row stride: word count 4 mod 8, so the A loads of a warp (8 rows x 4
     * consecutive words) hit 32 distinct banks: 36, 44, 60 words */
    static constexpr int RS = T == KQ_Q4_K ? 144 : T == KQ_Q5_K ? 176 : 240;
    static constexpr bool MINS = T != KQ_Q6_K;
};

template <int T, int BN>
struct kqt_smem {
    uint8_t w[KQT_STAGES][TILE_BM * kqt_fmt<T>::RS]; /* [stage][row][RS]: the row's super-block, raw
                                                      * (q6_K: from the 8-byte boundary below it) */
    uint32_t x[KQT_STAGES][BN * KQT_XLD];           /* [stage][column][8 blocks x 8 words + 8 pad],
                                                      * quantised x in fragment order */
    float xd[KQT_STAGES][KQT_KB * BN];              /* [stage][block][column]: x's scales */
    float xs[kqt_fmt<T>::MINS ? KQT_STAGES : 1][KQT_KB * BN]; /* [stage][block][column]: dx * sum(xq)
                                                               * (the mins' term; q6_K: unused) */
    const uint8_t *wrow[TILE_BM];                   /* the caller's: weight rows (NULL: pad) */
    int xrow[BN];                                   /* the caller's: x rows (-1: pad) */
};

/* Whether W's rows can take the k-quant tiles: whole super-blocks (nb % 8), 8-byte aligned
 * rows for q4_K / q5_K (their stages are whole granules), 2-byte for q6_K. */
__host__ __device__ inline bool kqt_shape_ok(int T, const void *W, size_t row_bytes, int nb)
{
    if (nb <= 0 || nb % KQT_KB || row_bytes != (size_t)(nb / KQT_KB) * kq_block_bytes(T))
        return false;
    size_t mask = T == KQ_Q6_K ? 1 : 7;
    return (((uintptr_t)W | row_bytes) & mask) == 0;
}

/* c = A(16x16) B(16x8), int8 in, int32 out, from zero: half a 32-block (q6_K's 16-value scales) */
__device__ __forceinline__ void mma_s8_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

/* byte k of w as a float, for bytes 0..255: the byte into the mantissa of 2^23, then 2^23 off
 * (a PRMT and a FADD instead of a BFE and a quarter-rate I2F) */
__device__ __forceinline__ float u8_to_f(uint32_t w, int k)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)k)) - 8388608.0f;
}

/* the 4 bytes at byte off (only 2-byte aligned) of the 16-byte aligned shared buffer base;
 * the rounding is done on the offset, so that the loads stay shared-memory loads */
__device__ __forceinline__ uint32_t lds_word2(const uint8_t *base, int off)
{
    const uint32_t *a = (const uint32_t *)(base + (off & ~3));
    return __funnelshift_r(a[0], a[1], ((uint32_t)off & 2u) * 8u);
}

/* One row's q4_K / q5_K super-block header, as the epilogue reads it: the 6-bit scales and
 * mins packed four a word (sub-blocks 0-3, 4-7), d and dmin. quants.c's q4k_scale_min for all
 * eight at once. */
struct kqt_head {
    uint32_t sc[2], mn[2];
    float d, dmin;
};

__device__ __forceinline__ void kqt_load_head(const uint8_t *p, kqt_head &h)
{
    const uint32_t *w = (const uint32_t *)p;
    uint32_t dd = w[0], s0 = w[1], s1 = w[2], s2 = w[3];
    h.d = f16_bits_to_f32((uint16_t)(dd & 0xFFFFu));
    h.dmin = f16_bits_to_f32((uint16_t)(dd >> 16));
    h.sc[0] = s0 & 0x3F3F3F3Fu;
    h.mn[0] = s1 & 0x3F3F3F3Fu;
    h.sc[1] = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    h.mn[1] = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
}

/* Super-blocks kt0 .. kt0 + nkt - 1 of K into acc (zeroed here). x rows are nb * 32 bytes
 * (xq) and nb floats (xd, xs) apart; xs is read for q4_K / q5_K only. Ends with no copy in
 * flight. */
template <int T, int BN>
__device__ __forceinline__ void kqt_mainloop(kqt_smem<T, BN> &sm, int nb, const int8_t *__restrict__ xq,
                                             const float *__restrict__ xd, const float *__restrict__ xs, int kt0,
                                             int nkt, tile_acc<BN> &acc)
{
    using F = kqt_fmt<T>;
    constexpr int MI = tile_acc<BN>::MI, NJ = tile_acc<BN>::NJ;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int wm = warp % TILE_WM, wn = warp / TILE_WM;
    size_t cols = (size_t)nb * QK;

    auto issue = [&](int kt, int s) {
        if (kt < nkt) {
            int sb = kt0 + kt, b0 = sb * KQT_KB;
            for (int e = tid; e < TILE_BM * F::G8; e += TILE_THREADS) {
                int rr = e / F::G8, j = e - rr * F::G8;
                const uint8_t *wr = sm.wrow[rr];
                const uint8_t *src = (const uint8_t *)xq;
                if (wr) {
                    uintptr_t a = (uintptr_t)(wr + (size_t)sb * F::BLK);
                    src = (const uint8_t *)((T == KQ_Q6_K ? a & ~(uintptr_t)7 : a) + 8 * j);
                }
                cp_async8(&sm.w[s][rr * F::RS + 8 * j], src, wr ? 8 : 0);
            }
            for (int e = tid; e < BN * 16; e += TILE_THREADS) {
                int c = e >> 4, h = e & 15, xr = sm.xrow[c];
                cp_async16(&sm.x[s][c * KQT_XLD + h * 4],
                           xr >= 0 ? xq + (size_t)xr * cols + (size_t)b0 * QK + h * 16 : xq, xr >= 0 ? 16 : 0);
            }
            for (int e = tid; e < BN * KQT_KB; e += TILE_THREADS) {
                int c = e / KQT_KB, kb = e % KQT_KB, xr = sm.xrow[c];
                cp_async4(&sm.xd[s][kb * BN + c], xr >= 0 ? xd + (size_t)xr * nb + b0 + kb : xd, xr >= 0 ? 4 : 0);
                if constexpr (F::MINS)
                    cp_async4(&sm.xs[s][kb * BN + c], xr >= 0 ? xs + (size_t)xr * nb + b0 + kb : xs, xr >= 0 ? 4 : 0);
            }
        }
        cp_async_commit();
    };

#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc.v[i][j][k] = 0.0f;

    issue(0, 0);
    for (int kt = 0; kt < nkt; kt++) {
        int slot = kt % KQT_STAGES;
        cp_async_wait<0>(); /* this thread's copies of stage kt have landed */
        __syncthreads();    /* everyone's have; stage kt - 1 is fully consumed */
        issue(kt + 1, (kt + 1) % KQT_STAGES);
        const uint8_t *ws = sm.w[slot];
        const uint32_t *xsm = sm.x[slot];
        const float *xds = sm.xd[slot];
        const float *xss = sm.xs[F::MINS ? slot : 0];
        /* this thread's rows, as byte offsets in ws: po[i][0] row g of MMA tile i, po[i][1]
         * row g + 8 (offsets, not pointers: 32-bit registers, and shared-memory loads) */
        int po[MI][2];
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int lr = wm * (MI * 16) + i * 16 + g + 8 * h;
                po[i][h] = lr * F::RS;
                if (T == KQ_Q6_K) { /* where the block starts in its copied granules */
                    const uint8_t *wr = sm.wrow[lr];
                    po[i][h] += wr ? (int)((uintptr_t)(wr + (size_t)(kt0 + kt) * F::BLK) & 7) : 0;
                }
            }

        if constexpr (T == KQ_Q4_K || T == KQ_Q5_K) {
            constexpr int QS = T == KQ_Q4_K ? 16 : 48; /* the nibbles' offset in the block */
            kqt_head hd[MI][2];
            uint32_t qh[MI][2][2]; /* q5_K: the fifth bits of words t and t + 4 */
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    kqt_load_head(ws + po[i][h], hd[i][h]);
                    if (T == KQ_Q5_K) {
                        qh[i][h][0] = *(const uint32_t *)(ws + po[i][h] + 16 + 4 * t);
                        qh[i][h][1] = *(const uint32_t *)(ws + po[i][h] + 32 + 4 * t);
                    }
                }
#pragma unroll
            for (int cp = 0; cp < 4; cp++) { /* sub-blocks 2cp (low nibbles) and 2cp + 1 (high) */
                uint32_t u[MI][2][2];
#pragma unroll
                for (int i = 0; i < MI; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        u[i][h][0] = *(const uint32_t *)(ws + po[i][h] + QS + 32 * cp + 4 * t);
                        u[i][h][1] = *(const uint32_t *)(ws + po[i][h] + QS + 32 * cp + 16 + 4 * t);
                    }
#pragma unroll
                for (int nib = 0; nib < 2; nib++) {
                    const int kb = 2 * cp + nib;
                    uint32_t a[MI][4];
                    float dw[MI][2], mw[MI][2];
#pragma unroll
                    for (int i = 0; i < MI; i++) {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
#pragma unroll
                            for (int wd = 0; wd < 2; wd++) { /* a[h + 2 wd]: row g + 8h, words t + 4 wd */
                                uint32_t v = (u[i][h][wd] >> (4 * nib)) & 0x0F0F0F0Fu;
                                if (T == KQ_Q5_K) /* the fifth bit of sub-block kb is bit kb of qh */
                                    v |= ((qh[i][h][wd] >> kb) & 0x01010101u) << 4;
                                a[i][h + 2 * wd] = v;
                            }
                            dw[i][h] = hd[i][h].d * u8_to_f(hd[i][h].sc[kb >> 2], kb & 3);
                            mw[i][h] = hd[i][h].dmin * u8_to_f(hd[i][h].mn[kb >> 2], kb & 3);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NJ; j++) {
                        int cb = wn * (NJ * 8) + j * 8;
                        uint2 b = *(const uint2 *)&xsm[(cb + g) * KQT_XLD + kb * 8 + 2 * t];
                        float2 dx = *(const float2 *)&xds[kb * BN + cb + 2 * t];
                        float2 sx = *(const float2 *)&xss[kb * BN + cb + 2 * t];
#pragma unroll
                        for (int i = 0; i < MI; i++) {
                            int c[4];
                            mma_s8(c, a[i], b);
                            acc.v[i][j][0] = fmaf(-mw[i][0], sx.x, fmaf(dw[i][0] * dx.x, i2f_small(c[0]), acc.v[i][j][0]));
                            acc.v[i][j][1] = fmaf(-mw[i][0], sx.y, fmaf(dw[i][0] * dx.y, i2f_small(c[1]), acc.v[i][j][1]));
                            acc.v[i][j][2] = fmaf(-mw[i][1], sx.x, fmaf(dw[i][1] * dx.x, i2f_small(c[2]), acc.v[i][j][2]));
                            acc.v[i][j][3] = fmaf(-mw[i][1], sx.y, fmaf(dw[i][1] * dx.y, i2f_small(c[3]), acc.v[i][j][3]));
                        }
                    }
                }
            }
        } else { /* q6_K: 128 low-nibble bytes, 64 bytes of 2-bit pairs, 16 int8 scales, f16 d */
            float d[MI][2];
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    d[i][h] = f16_bits_to_f32(*(const uint16_t *)(ws + po[i][h] + 208));
#pragma unroll 1 /* (unrolled, the two halves' loads are hoisted together and spill at BN 64) */
            for (int hh = 0; hh < 2; hh++) { /* the block's halves of 128 values */
                uint32_t qh[MI][2][2], scw[MI][2][2]; /* scw: the half's 8 scales, four a word */
#pragma unroll
                for (int i = 0; i < MI; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        scw[i][h][0] = lds_word2(ws, po[i][h] + 192 + 8 * hh);
                        scw[i][h][1] = lds_word2(ws, po[i][h] + 196 + 8 * hh);
                        qh[i][h][0] = lds_word2(ws, po[i][h] + 128 + 32 * hh + 4 * t);
                        qh[i][h][1] = lds_word2(ws, po[i][h] + 128 + 32 * hh + 16 + 4 * t);
                    }
#pragma unroll
                for (int s1 = 0; s1 < 2; s1++) { /* low-nibble run 64hh + 32s1: sub-blocks s1, s1 + 2 */
                    uint32_t u[MI][2][2];
#pragma unroll
                    for (int i = 0; i < MI; i++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            u[i][h][0] = lds_word2(ws, po[i][h] + 64 * hh + 32 * s1 + 4 * t);
                            u[i][h][1] = lds_word2(ws, po[i][h] + 64 * hh + 32 * s1 + 16 + 4 * t);
                        }
#pragma unroll
                    for (int nib = 0; nib < 2; nib++) {
                        const int s = s1 + 2 * nib, kb = 4 * hh + s;
                        uint32_t a[MI][4];
                        float dlo[MI][2], dhi[MI][2];
#pragma unroll
                        for (int i = 0; i < MI; i++)
#pragma unroll
                            for (int h = 0; h < 2; h++) {
#pragma unroll
                                for (int wd = 0; wd < 2; wd++) {
                                    uint32_t v = ((u[i][h][wd] >> (4 * nib)) & 0x0F0F0F0Fu) |
                                                 (((qh[i][h][wd] >> (2 * s)) & 0x03030303u) << 4);
                                    a[i][h + 2 * wd] = __vsub4(v, 0x20202020u); /* q - 32 */
                                }
                                /* scales 2kb (values 0..15 of the 32-block) and 2kb + 1 */
                                uint32_t sw = scw[i][h][s >> 1];
                                dlo[i][h] = d[i][h] * (float)(int8_t)(sw >> (16 * (kb & 1)));
                                dhi[i][h] = d[i][h] * (float)(int8_t)(sw >> (16 * (kb & 1) + 8));
                            }
#pragma unroll
                        for (int j = 0; j < NJ; j++) {
                            int cb = wn * (NJ * 8) + j * 8;
                            uint2 b = *(const uint2 *)&xsm[(cb + g) * KQT_XLD + kb * 8 + 2 * t];
                            float2 dx = *(const float2 *)&xds[kb * BN + cb + 2 * t];
#pragma unroll
                            for (int i = 0; i < MI; i++) {
                                int lo[4], hi[4];
                                mma_s8_k16(lo, a[i][0], a[i][1], b.x); /* values 0..15: words t */
                                mma_s8_k16(hi, a[i][2], a[i][3], b.y); /* 16..31: words t + 4 */
#pragma unroll
                                for (int e = 0; e < 4; e++) {
                                    int h = e >> 1;
                                    float v = fmaf(dhi[i][h], i2f_small(hi[e]), dlo[i][h] * i2f_small(lo[e]));
                                    acc.v[i][j][e] = fmaf(e & 1 ? dx.y : dx.x, v, acc.v[i][j][e]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>(); /* nothing may land in shared memory after the CTA exits */
}

#endif
