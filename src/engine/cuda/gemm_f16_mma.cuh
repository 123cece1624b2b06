/* gemm_f16_mma.cuh - one CTA's tile of gemm_f16_mma.cu's product: 128 weight rows x BN tokens
 * of y = W x over K stages kt0 .. kt0 + nkt - 1, from W (f16 / bf16 bits, rows ldw apart) and
 * x16 (x rounded to W's type, rows cols apart). A header so that the host emulation
 * (tests/gpu/emu/f16_tile_emu.cpp, `make f16-tile-emu`) compiles this very code with g++.
 *
 * 8 warps, 4 along the rows x 2 along the tokens, each 32 rows x BN/2 tokens of m16n8k16 MMAs
 * (f32 accumulate). A ring of FM_STAGES stages of FM_BK halves of K is filled by cp.async
 * 16-byte granules FM_STAGES - 1 ahead of the MMAs (as mma_tile.cuh does for int8); granules
 * past cols, rows or n are zero-filled, so edges need no other predication until the stores.
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4): A a0 =
 * (row g, k 2t..2t+1), a1 = (row g+8, same k), a2 / a3 = the same at k + 8; B b0 = (k 2t..2t+1,
 * column g), b1 = at k + 8; C c0, c1 = (row g, columns 2t, 2t+1), c2, c3 = row g+8. W's stage
 * is [row][k] (A, row-major) and x's [token][k] (B, "col": a column of B is a row of the
 * stage), so both are read by plain, untransposed ldmatrix.x4 (mma_f16.cuh). */
#ifndef TIDE_CUDA_GEMM_F16_MMA_CUH
#define TIDE_CUDA_GEMM_F16_MMA_CUH

#include "engine/cuda/mma_f16.cuh"

#define FM_BM 128          /* weight rows per CTA: 4 warps x 32 */
#define FM_BK 32           /* K per stage: two m16n8k16 steps */
#define FM_LD (FM_BK + 8)  /* halves per row of a stage: 80 bytes, so the 8 rows an ldmatrix
                              phase reads (16 bytes each) start 20 words apart: 32 banks */
#define FM_STAGES 4        /* cp.async ring depth: 80 KB at BN 128, two CTAs an SM */
#define FM_THREADS 256
#define FM_WM 4            /* warps along the rows */
#define FM_WN 2            /* warps along the tokens */

template <int BN>
struct fm_smem {
    uint16_t w[FM_STAGES][FM_BM * FM_LD]; /* [stage][row][k]: W's stage, f16 / bf16 bits */
    uint16_t x[FM_STAGES][BN * FM_LD];    /* [stage][token][k]: x's stage, rounded */
};

/* The tile at rows m0.., tokens n0.. into y (n, rows): y = p, or with add y = y + p (the
 * product's f32 value, then the add). Ends with no copy in flight. */
template <typename T, int BN>
__device__ __forceinline__ void fm_tile(fm_smem<BN> &sm, const uint16_t *__restrict__ W, size_t ldw, int rows,
                                        int cols, const uint16_t *__restrict__ x16, int n, int m0, int n0, int kt0,
                                        int nkt, float *__restrict__ y, bool add)
{
    constexpr int MI = FM_BM / FM_WM / 16; /* 16-row MMA tiles a warp: 2 */
    constexpr int NJ = BN / FM_WN / 8;     /* 8-token MMA tiles a warp: 4 or 8 */
    constexpr int GR = FM_BK / 8;          /* 16-byte granules of a row's stage: 4 */
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp % FM_WM, wn = warp / FM_WM;

    auto issue = [&](int kt, int s) {
        if (kt < nkt) {
            int k0 = (kt0 + kt) * FM_BK;
            for (int e = tid; e < FM_BM * GR; e += FM_THREADS) {
                int r = e / GR, k = k0 + (e % GR) * 8;
                bool ok = m0 + r < rows && k < cols;
                cp_async16(&sm.w[s][r * FM_LD + (e % GR) * 8], ok ? W + (size_t)(m0 + r) * ldw + k : W, ok ? 16 : 0);
            }
            for (int e = tid; e < BN * GR; e += FM_THREADS) {
                int c = e / GR, k = k0 + (e % GR) * 8;
                bool ok = n0 + c < n && k < cols;
                cp_async16(&sm.x[s][c * FM_LD + (e % GR) * 8], ok ? x16 + (size_t)(n0 + c) * cols + k : x16,
                           ok ? 16 : 0);
            }
        }
        cp_async_commit(); /* an empty group past the end keeps wait_group's count right */
    };

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.0f;

    /* this lane's ldmatrix rows: A matrices (rows 0-7, 8-15) x (k 0-7, 8-15); B matrices
     * (tokens 0-7: k 0-7, k 8-15), (tokens 8-15: k 0-7, k 8-15) */
    int a_row = wm * (MI * 16) + (lane & 15), a_k = (lane >> 4) * 8;
    int b_tok = wn * (NJ * 8) + (lane & 7) + (lane >> 4) * 8, b_k = ((lane >> 3) & 1) * 8;

#pragma unroll
    for (int s = 0; s < FM_STAGES - 1; s++)
        issue(s, s);
    for (int kt = 0; kt < nkt; kt++) {
        int slot = kt % FM_STAGES;
        cp_async_wait<FM_STAGES - 2>(); /* this thread's copies of stage kt have landed */
        __syncthreads();                /* everyone's have; stage kt - 1 is fully consumed */
        issue(kt + FM_STAGES - 1, (kt + FM_STAGES - 1) % FM_STAGES);
        const uint16_t *ws = sm.w[slot], *xs = sm.x[slot];
#pragma unroll
        for (int ks = 0; ks < FM_BK / 16; ks++) {
            uint32_t a[MI][4];
#pragma unroll
            for (int i = 0; i < MI; i++)
                ldsm_x4(a[i], ws + (a_row + i * 16) * FM_LD + ks * 16 + a_k);
#pragma unroll
            for (int j = 0; j < NJ; j += 2) {
                uint32_t b[4]; /* b0, b1 of token tile j; b0, b1 of tile j + 1 */
                ldsm_x4(b, xs + (b_tok + j * 8) * FM_LD + ks * 16 + b_k);
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    mma_16816<T>(acc[i][j], a[i], b[0], b[1]);
                    mma_16816<T>(acc[i][j + 1], a[i], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>(); /* nothing may land in shared memory after the CTA exits */

    /* c0, c1: row g, tokens 2t, 2t+1; c2, c3: row g + 8. A warp's store of one (i, j, e)
     * writes 8 consecutive rows of 4 tokens: four whole 32-byte sectors. */
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = m0 + wm * (MI * 16) + i * 16 + g + (e >> 1) * 8;
                int tk = n0 + wn * (NJ * 8) + j * 8 + 2 * t + (e & 1);
                if (r < rows && tk < n) {
                    float *p = y + (size_t)tk * rows + r;
                    *p = add ? *p + acc[i][j][e] : acc[i][j][e];
                }
            }
}

#endif
