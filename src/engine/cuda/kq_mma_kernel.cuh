/* kq_mma_kernel.cuh - the device code of mmq_kquant.cu's k-quant tensor-core product: the
 * mins' block sums of x (kq_xsum_kernel), the tile kernel around mma_kq_tile.cuh's
 * kqt_mainloop (kq_mma_kernel: its weight rows and x rows, the K slice of grid z, the store or
 * add of the tile into y or into its split-K slice) and the fixed-order add of the slices
 * (kq_reduce_kernel). Here, not in mmq_kquant.cu, so that tests/gpu/emu/kq_tile_emu.cpp
 * compiles these very kernels with g++ and runs them on the CPU (`make kq-tile-emu`). Included
 * by mmq_kquant.cu only (the launches, the plan and the scratch are there). */
#ifndef TIDE_CUDA_KQ_MMA_KERNEL_CUH
#define TIDE_CUDA_KQ_MMA_KERNEL_CUH

#include "engine/cuda/mma_kq_tile.cuh"

__global__ void __launch_bounds__(256) kq_xsum_kernel(const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                      int nblocks, float *__restrict__ xs)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int4 *p = (const int4 *)(xq + (size_t)b * QK);
    xs[b] = xd[b] * (float)dp4a_sum32(p[0], p[1]);
}

/* grid (token tiles, row tiles, K slices of kps super-blocks), as mmq_mma_kernel: consecutive
 * CTAs share a weight tile. out is y (add: y += the tile), or with several slices the
 * partials (slice, n, rows). BN = 16, 32 or 64 tokens. */
template <int T, int BN>
__global__ void __launch_bounds__(TILE_THREADS, 2)
kq_mma_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb, const int8_t *__restrict__ xq,
              const float *__restrict__ xd, const float *__restrict__ xs, int n, int kps, float *__restrict__ out,
              bool add)
{
    extern __shared__ __align__(16) uint8_t smem_raw[];
    kqt_smem<T, BN> &sm = *(kqt_smem<T, BN> *)smem_raw;
    int n0 = blockIdx.x * BN, m0 = blockIdx.y * TILE_BM;
    for (int rr = threadIdx.x; rr < TILE_BM; rr += TILE_THREADS)
        sm.wrow[rr] = m0 + rr < rows ? W + (size_t)(m0 + rr) * row_bytes : nullptr;
    for (int c = threadIdx.x; c < BN; c += TILE_THREADS)
        sm.xrow[c] = n0 + c < n ? n0 + c : -1;
    __syncthreads();
    int kt0 = blockIdx.z * kps;
    tile_acc<BN> acc;
    kqt_mainloop<T, BN>(sm, nb, xq, xd, xs, kt0, min(kps, nb / KQT_KB - kt0), acc);

    float *y = out + (size_t)blockIdx.z * n * rows;
#pragma unroll
    for (int i = 0; i < tile_acc<BN>::MI; i++)
#pragma unroll
        for (int j = 0; j < tile_acc<BN>::NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = m0 + tile_row(i, e), tk = n0 + tile_col<BN>(j, e);
                if (r < rows && tk < n)
                    mm_put(y + (size_t)tk * rows + r, acc.v[i][j][e], add);
            }
}

/* y[i] (=, or += with add) the sum over the slices of part[slice][i], slices in order */
__global__ void kq_reduce_kernel(const float *__restrict__ part, int splits, size_t total, float *__restrict__ y,
                                 bool add)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    float s = part[i];
    for (int z = 1; z < splits; z++)
        s += part[(size_t)z * total + i];
    mm_put(y + i, s, add);
}

#endif
