/* mma_tile.cuh - the K walk of the int8 tensor-core products (mmq_mma.cu: one dense product;
 * moe_prefill.cu: a chunk's experts grouped), shared so that both do the same arithmetic.
 *
 * A CTA of TILE_THREADS computes a BM-row x BN-column tile of y = W x. W is q8_0 or q4_0
 * (rows of nb blocks), x is already quantised to int8 blocks (quantize_q8_kernel<true>: each
 * block's words in fragment order 0,4,1,5,2,6,3,7) with an f32 scale per block. The caller
 * fills tile_smem.wrow (the CTA's weight rows; NULL pads) and .xrow (the quantised x row of
 * each column; -1 pads), then tile_mainloop walks K in stages of TILE_KB blocks:
 *
 *   - a ring of TILE_STAGES stages is filled by cp.async, TILE_STAGES - 1 ahead of the MMAs:
 *     weight rows as 8-byte granules (a stage of 4 blocks is 136 / 72 bytes at an 8-byte
 *     aligned address when nb % 4 == 0 and rows and W are 8-byte aligned: tile_shape_ok),
 *     activations as 16-byte pieces, their scales transposed to [block][column];
 *   - each thread reads its m16n8k32 A fragments straight from the raw blocks in shared
 *     memory: block kb of a stage starts 2 * kb bytes past a 4-byte boundary, so the quants
 *     of odd blocks are word-aligned loads and those of even blocks two loads and a funnel
 *     shift (the old kernels unpacked every stage into a second buffer: twice the barriers
 *     and twice the instructions, ncu on the H200: 69 instructions an MMA, now 33);
 *   - a block's int32 dot is scaled by dw(row, block) * dx(column, block) and added to an f32
 *     accumulator in K order: the CPU backend's per-block term, so only the order of the
 *     float sum differs from it, and a tile's result does not depend on BN, on the other
 *     tiles, or on which launch it is in.
 *
 * Fragment layout of m16n8k32 .s8 (PTX ISA, "Matrix Fragments for mma.m16n8k32"), with
 * g = lane / 4, t = lane % 4: A a0/a2 = row g, k words t / t+4, a1/a3 = the same for row g+8;
 * B b0/b1 = column g, k words t / t+4; C c0,c1 = row g, columns 2t, 2t+1; c2,c3 = row g+8.
 * q4_0's block holds elements i and i+16 in the low and high nibble of byte i, so one word t
 * of nibbles gives both a0 (low) and a2 (high). */
#ifndef TIDE_CUDA_MMA_TILE_CUH
#define TIDE_CUDA_MMA_TILE_CUH

#include "engine/cuda/mma_q.cuh"

#define TILE_KB 4         /* 32-blocks per stage */
#define TILE_STAGES 3     /* cp.async ring depth (2 CTAs of ~90 KB fit an SM) */
#define TILE_THREADS 256  /* 8 warps: 4 along the rows x 2 along the columns */
#define TILE_WM 4
#define TILE_WN 2
#define TILE_BM 128       /* weight rows per CTA: 4 warps x 32 */
#define TILE_XLD (TILE_KB * 8 + 8) /* words per column's stage: 40 = 8 mod 32, so the 8-byte
                                       B loads of a half-warp (4 columns x 4 t) hit 32 banks */

template <int QT>
struct tile_fmt {
    static constexpr int BLK = QT == 8 ? 34 : 18;      /* bytes per block */
    static constexpr int STAGE = TILE_KB * BLK;        /* bytes of a row's stage: 136 / 72 */
    static constexpr int G8 = STAGE / 8;               /* its 8-byte granules: 17 / 9 */
    /* shared-memory row stride: a multiple of 16 whose word count is 4 mod 8, so the A loads
     * of a warp (8 rows x 4 consecutive words) hit 32 distinct banks: 144 (36 words), 80 (20) */
    static constexpr int RS = QT == 8 ? 144 : 80;
};

template <int QT, int BN>
struct tile_smem {
    uint8_t w[TILE_STAGES][TILE_BM * tile_fmt<QT>::RS]; /* weight rows' stages, raw */
    uint32_t x[TILE_STAGES][BN * TILE_XLD];            /* quantised columns, fragment order */
    float xd[TILE_STAGES][TILE_KB * BN];               /* their scales, [block][column] */
    const uint8_t *wrow[TILE_BM];                      /* the caller's: weight rows (NULL: pad) */
    int xrow[BN];                                      /* the caller's: x rows (-1: pad) */
};

/* Whether a product with these rows can take the tile kernels: whole stages of K (nb % 4,
 * which also makes q8_0 / q4_0 rows multiples of 8 bytes) and 8-byte aligned weights. */
__host__ __device__ inline bool tile_shape_ok(const void *W, size_t row_bytes, int nb)
{
    return nb > 0 && nb % TILE_KB == 0 && row_bytes % 8 == 0 && ((uintptr_t)W & 7) == 0;
}

/* the 4 bytes at shared address p, which is 2 mod 4 (ALIGNED false) or 0 mod 4 */
template <bool ALIGNED>
__device__ __forceinline__ uint32_t lds_word(const uint8_t *p)
{
    if (ALIGNED)
        return *(const uint32_t *)p;
    const uint32_t *a = (const uint32_t *)(p - 2);
    return __funnelshift_r(a[0], a[1], 16);
}

/* A fragment of rows r (p0: its block in shared memory) and r + 8 (p1), and their scales */
template <int QT, bool ODD>
__device__ __forceinline__ void load_a(const uint8_t *p0, const uint8_t *p1, int t, uint32_t a[4], float dw[2])
{
    dw[0] = f16_bits_to_f32(*(const uint16_t *)p0);
    dw[1] = f16_bits_to_f32(*(const uint16_t *)p1);
    if (QT == 8) {
        a[0] = lds_word<ODD>(p0 + 2 + 4 * t);
        a[2] = lds_word<ODD>(p0 + 18 + 4 * t);
        a[1] = lds_word<ODD>(p1 + 2 + 4 * t);
        a[3] = lds_word<ODD>(p1 + 18 + 4 * t);
    } else {
        uint32_t u0 = lds_word<ODD>(p0 + 2 + 4 * t), u1 = lds_word<ODD>(p1 + 2 + 4 * t);
        a[0] = __vsub4(u0 & 0x0F0F0F0Fu, 0x08080808u);
        a[2] = __vsub4((u0 >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        a[1] = __vsub4(u1 & 0x0F0F0F0Fu, 0x08080808u);
        a[3] = __vsub4((u1 >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
}

template <int BN>
struct tile_acc {
    static constexpr int MI = TILE_BM / TILE_WM / 16; /* 16-row MMA tiles per warp: 2 */
    static constexpr int NJ = BN / TILE_WN / 8;        /* 8-column MMA tiles per warp */
    float v[MI][NJ][4];
};

/* Stages kt0 .. kt0 + nkt - 1 of K into acc (zeroed here). x rows are nb * 32 bytes (xq) and
 * nb floats (xd) apart. Ends with no copy in flight. */
template <int QT, int BN>
__device__ __forceinline__ void tile_mainloop(tile_smem<QT, BN> &sm, int nb, const int8_t *__restrict__ xq,
                                              const float *__restrict__ xd, int kt0, int nkt, tile_acc<BN> &acc)
{
    using F = tile_fmt<QT>;
    constexpr int MI = tile_acc<BN>::MI, NJ = tile_acc<BN>::NJ;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int wm = warp % TILE_WM, wn = warp / TILE_WM;
    size_t cols = (size_t)nb * QK;

    auto issue = [&](int kt, int s) {
        if (kt < nkt) {
            int b0 = (kt0 + kt) * TILE_KB;
            for (int e = tid; e < TILE_BM * F::G8; e += TILE_THREADS) {
                int rr = e / F::G8, j = e - rr * F::G8;
                const uint8_t *wr = sm.wrow[rr];
                cp_async8(&sm.w[s][rr * F::RS + 8 * j], wr ? wr + (size_t)b0 * F::BLK + 8 * j : (const uint8_t *)xq,
                          wr ? 8 : 0);
            }
            for (int e = tid; e < BN * 8; e += TILE_THREADS) {
                int c = e >> 3, h = e & 7, xr = sm.xrow[c];
                cp_async16(&sm.x[s][c * TILE_XLD + h * 4],
                           xr >= 0 ? xq + (size_t)xr * cols + (size_t)b0 * QK + h * 16 : xq, xr >= 0 ? 16 : 0);
            }
            for (int e = tid; e < BN * TILE_KB; e += TILE_THREADS) {
                int c = e / TILE_KB, kb = e % TILE_KB, xr = sm.xrow[c];
                cp_async4(&sm.xd[s][kb * BN + c], xr >= 0 ? xd + (size_t)xr * nb + b0 + kb : xd, xr >= 0 ? 4 : 0);
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

#pragma unroll
    for (int s = 0; s < TILE_STAGES - 1; s++)
        issue(s, s);
    for (int kt = 0; kt < nkt; kt++) {
        int slot = kt % TILE_STAGES;
        cp_async_wait<TILE_STAGES - 2>(); /* this thread's copies of stage kt have landed */
        __syncthreads();                  /* everyone's have; stage kt - 1 is fully consumed */
        issue(kt + TILE_STAGES - 1, (kt + TILE_STAGES - 1) % TILE_STAGES);
        const uint8_t *ws = sm.w[slot];
        const uint32_t *xs = sm.x[slot];
        const float *xds = sm.xd[slot];
#pragma unroll
        for (int kb = 0; kb < TILE_KB; kb++) {
            uint32_t a[MI][4];
            float dw[MI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                const uint8_t *p0 = ws + (wm * (MI * 16) + i * 16 + g) * F::RS + kb * F::BLK;
                if (kb & 1)
                    load_a<QT, true>(p0, p0 + 8 * F::RS, t, a[i], dw[i]);
                else
                    load_a<QT, false>(p0, p0 + 8 * F::RS, t, a[i], dw[i]);
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                int cb = wn * (NJ * 8) + j * 8;
                uint2 b = *(const uint2 *)&xs[(cb + g) * TILE_XLD + kb * 8 + 2 * t];
                float2 dx = *(const float2 *)&xds[kb * BN + cb + 2 * t];
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    int c[4];
                    mma_s8(c, a[i], b);
                    acc.v[i][j][0] += (dw[i][0] * dx.x) * i2f_small(c[0]);
                    acc.v[i][j][1] += (dw[i][0] * dx.y) * i2f_small(c[1]);
                    acc.v[i][j][2] += (dw[i][1] * dx.x) * i2f_small(c[2]);
                    acc.v[i][j][3] += (dw[i][1] * dx.y) * i2f_small(c[3]);
                }
            }
        }
    }
    cp_async_wait<0>(); /* nothing may land in shared memory after the CTA exits */
}

/* Where a thread's accumulators sit in the tile: acc.v[i][j][e] is local row
 * tile_row(i, e) and column tile_col(j, e). */
__device__ __forceinline__ int tile_row(int i, int e)
{
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    return (warp % TILE_WM) * (TILE_BM / TILE_WM) + i * 16 + g + (e >> 1) * 8;
}

template <int BN>
__device__ __forceinline__ int tile_col(int j, int e)
{
    int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
    return (warp / TILE_WM) * (tile_acc<BN>::NJ * 8) + j * 8 + 2 * t + (e & 1);
}

#endif
