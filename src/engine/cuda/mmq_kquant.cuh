/* mmq_kquant.cuh - the k-quant int8 tensor-core products (mmq_kquant.cu) as kquant.cu's
 * cuda_matmul_kq and moe_prefill.cu's grouped experts call them, and the mmq_mma.cu knobs
 * they share (so that cuda_set_mmq_tile / cuda_set_mmq_split steer both kinds of tile). */
#ifndef TIDE_CUDA_MMQ_KQUANT_CUH
#define TIDE_CUDA_MMQ_KQUANT_CUH

#include "engine/cuda/mma_kq_tile.cuh"

/* on unless TIDE_KQ_MMA=0 (read once) or cuda_set_kq_mma(0) */
bool cuda_kq_mma_on(void);
/* Whether cuda_matmul_kq sends this product here: the switch on, n >= cuda_mmq_min_n() (and
 * n > 2), a k-quant type whose rows kqt_shape_ok takes. */
bool cuda_kq_mma_wants(uint32_t type, const void *W, size_t row_bytes, int cols, int n);
/* y (=, or += with add) W x for such a product: x quantised into the scratch (with the
 * mins' block sums), then the tile kernel, split-K as mmq_mma.cu plans it. */
void cuda_kq_mma_matmul(struct cuda_ctx *c, uint32_t type, const uint8_t *W, size_t row_bytes, int rows, int cols,
                        const float *x, int n, float *y, bool add);
/* xs[b] = xd[b] * (sum of block b's codes), nblocks blocks (the tiles' q4_K / q5_K min term) */
bool cuda_kq_xsum(struct cuda_ctx *c, const int8_t *xq, const float *xd, int nblocks, float *xs);
/* mmq_mma.cu's tile-width and split-K knobs (cuda_set_mmq_tile, cuda_set_mmq_split) */
int cuda_mmq_forced_tile(void);
int cuda_mmq_max_split(void);

#endif
