/* kquant.cuh and mma_tile.cuh's tile geometry, host form (see mma_tile.cuh here): the
 * constants and helpers mma_kq_tile.cuh uses, copied from the CUDA headers (keep in step). */
#pragma once
#define QK_K 256
#define KQ_Q4_K 12
#define KQ_Q5_K 13
#define KQ_Q6_K 14
constexpr int kq_block_bytes(int T) { return T == KQ_Q4_K ? 144 : T == KQ_Q5_K ? 176 : 210; }
constexpr bool kq_type(uint32_t T) { return T == KQ_Q4_K || T == KQ_Q5_K || T == KQ_Q6_K; }
template <int BN>
struct tile_acc {
    static constexpr int MI = TILE_BM / TILE_WM / 16;
    static constexpr int NJ = BN / TILE_WN / 8;
    float v[MI][NJ][4];
};
inline int tile_row(int i, int e)
{
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    return (warp % TILE_WM) * (TILE_BM / TILE_WM) + i * 16 + g + (e >> 1) * 8;
}
template <int BN>
inline int tile_col(int j, int e)
{
    int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
    return (warp / TILE_WM) * (tile_acc<BN>::NJ * 8) + j * 8 + 2 * t + (e & 1);
}
