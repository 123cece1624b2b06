/* mmq_kquant.cu - prefill-size q4_K / q5_K / q6_K products on the int8 tensor cores.
 *
 * Without it, kquant.cu widens a k-quant W to f16 in the scratch for every product with
 * n > 8 and runs the f16 WMMA GEMM (a full write and read of 2 bytes a weight, and the f16
 * tensor cores at half the int8 rate); the grouped MoE prefill took no k-quants at all, so a
 * Q4_K_M MoE ran its experts one by one. Here, as mmq_mma.cu does for q8_0 / q4_0, x is
 * quantised once to int8 blocks of 32 (quantize_q8_kernel<true>, the same values) plus each
 * block's dx * sum(codes) for the q4_K / q5_K mins (kq_xsum_kernel), and a CTA owns a
 * 128-row x BN-token tile of y, walking K one super-block a stage with mma_kq_tile.cuh's
 * kqt_mainloop (which moe_prefill.cu's grouped kernels share). Split-K (grid z) when the
 * tiles leave SMs idle, with the slices added in a fixed order, as mmq_mma.cu's plan does.
 *
 * On by default since test-gpu's kqmma tests passed on an H100 (TIDE_KQ_MMA=0 or cuda_set_kq_mma(0)
 * turns it off).
 * Rows kqt_shape_ok refuses (W not 8-byte aligned for q4_K / q5_K) stay on kquant.cu's paths. */
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/mmq_kquant.cuh"
#include "engine/cuda/kq_mma_kernel.cuh" /* kq_xsum_kernel, kq_mma_kernel, kq_reduce_kernel */

extern "C" {
#include "engine/backend_cuda.h"
}

#define KQM_MAX_SPLIT 8

/* -1: not read yet; then on unless TIDE_KQ_MMA=0 in the environment, or cuda_set_kq_mma */
static int kq_mma = -1;

bool cuda_kq_mma_on(void)
{
    if (kq_mma < 0) {
        const char *e = getenv("TIDE_KQ_MMA");
        kq_mma = !(e && !strcmp(e, "0"));
    }
    return kq_mma != 0;
}

extern "C" int cuda_set_kq_mma(int on)
{
    int old = cuda_kq_mma_on();
    if (on >= 0)
        kq_mma = on != 0;
    return old;
}

extern "C" int cuda_kq_mma_takes(uint32_t type, int cols, int n)
{
    return cuda_kq_mma_on() && kq_type(type) && cols > 0 && cols % QK_K == 0 && n > 2 && n >= cuda_mmq_min_n();
}

bool cuda_kq_mma_wants(uint32_t type, const void *W, size_t row_bytes, int cols, int n)
{
    return cuda_kq_mma_takes(type, cols, n) && kqt_shape_ok((int)type, W, row_bytes, cols / QK);
}

bool cuda_kq_xsum(struct cuda_ctx *c, const int8_t *xq, const float *xd, int nblocks, float *xs)
{
    if (nblocks <= 0)
        return true;
    kq_xsum_kernel<<<(unsigned)((nblocks + 255) / 256), 256, 0, c->st>>>(xq, xd, nblocks, xs);
    return CU_LAUNCH(c, "kq_xsum_kernel");
}

struct kq_plan {
    int bn, splits, kps;
};

/* mmq_mma.cu's plan in super-blocks: the narrowest tile that holds n (at most 64); K slices
 * when the tiles alone leave SMs idle, up to ~2 CTAs an SM, at least 2 stages a slice. */
static kq_plan plan(struct cuda_ctx *c, int rows, int nb, int n)
{
    kq_plan p;
    int forced = cuda_mmq_forced_tile();
    p.bn = forced ? forced : n > 32 ? 64 : n > 16 ? 32 : 16;
    int nkt = nb / KQT_KB > 0 ? nb / KQT_KB : 1;
    long ctas = (long)((rows + TILE_BM - 1) / TILE_BM) * ((n + p.bn - 1) / p.bn);
    long want = 2L * c->sm_count;
    int s = ctas >= c->sm_count ? 1 : (int)((want + ctas - 1) / ctas);
    int smax = nkt / 2 > 1 ? nkt / 2 : 1;
    s = s < smax ? s : smax;
    int lim = cuda_mmq_max_split();
    lim = lim < KQM_MAX_SPLIT ? lim : KQM_MAX_SPLIT;
    s = s < lim ? s : lim;
    p.kps = (nkt + s - 1) / s;
    p.splits = (nkt + p.kps - 1) / p.kps;
    return p;
}

template <int T, int BN>
static bool launch(struct cuda_ctx *c, const kq_plan &p, const uint8_t *W, size_t row_bytes, int rows, int nb,
                   const int8_t *xq, const float *xd, const float *xs, int n, float *out, bool add)
{
    static uint64_t opted; /* bit dev: the > 48 KB shared memory opt-in done (engine thread only) */
    size_t smem = sizeof(kqt_smem<T, BN>);
    if (c->dev < 64 && !(opted >> c->dev & 1)) {
        if (!CU(c, cudaFuncSetAttribute(kq_mma_kernel<T, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem)))
            return false;
        opted |= 1ull << c->dev;
    }
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((rows + TILE_BM - 1) / TILE_BM), (unsigned)p.splits);
    kq_mma_kernel<T, BN><<<grid, TILE_THREADS, smem, c->st>>>(W, row_bytes, rows, nb, xq, xd, xs, n, p.kps, out,
                                                              add);
    return CU_LAUNCH(c, "kq_mma_kernel");
}

template <int T>
static bool launch_type(struct cuda_ctx *c, const kq_plan &p, const uint8_t *W, size_t row_bytes, int rows, int nb,
                        const int8_t *xq, const float *xd, const float *xs, int n, float *out, bool add)
{
    return p.bn == 64   ? launch<T, 64>(c, p, W, row_bytes, rows, nb, xq, xd, xs, n, out, add)
           : p.bn == 32 ? launch<T, 32>(c, p, W, row_bytes, rows, nb, xq, xd, xs, n, out, add)
                        : launch<T, 16>(c, p, W, row_bytes, rows, nb, xq, xd, xs, n, out, add);
}

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

void cuda_kq_mma_matmul(struct cuda_ctx *c, uint32_t type, const uint8_t *W, size_t row_bytes, int rows, int cols,
                        const float *x, int n, float *y, bool add)
{
    int nb = cols / QK, nblocks = n * nb;
    kq_plan p = plan(c, rows, nb, n);
    /* scratch: xq (n, cols) int8, xd and xs (n, nb) f32, then the split-K partials */
    size_t qbytes = al256((size_t)n * cols), dbytes = al256((size_t)nblocks * sizeof(float));
    size_t pbytes = p.splits > 1 ? (size_t)p.splits * n * rows * sizeof(float) : 0;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + 2 * dbytes + pbytes);
    if (!ws)
        return; /* the error is kept in c */
    int8_t *xq = (int8_t *)ws;
    float *xd = (float *)(ws + qbytes), *xs = (float *)(ws + qbytes + dbytes);
    float *part = (float *)(ws + qbytes + 2 * dbytes);
    quantize_q8_kernel<true><<<(nblocks + 7) / 8, 256, 0, c->st>>>(x, nblocks, xq, xd);
    if (!CU_LAUNCH(c, "quantize_q8_kernel"))
        return;
    if (type != GGML_TYPE_Q6_K && !cuda_kq_xsum(c, xq, xd, nblocks, xs))
        return;
    float *out = p.splits > 1 ? part : y;
    bool tile_add = add && p.splits == 1;
    bool ok = type == GGML_TYPE_Q4_K   ? launch_type<KQ_Q4_K>(c, p, W, row_bytes, rows, nb, xq, xd, xs, n, out, tile_add)
              : type == GGML_TYPE_Q5_K ? launch_type<KQ_Q5_K>(c, p, W, row_bytes, rows, nb, xq, xd, xs, n, out, tile_add)
                                       : launch_type<KQ_Q6_K>(c, p, W, row_bytes, rows, nb, xq, xd, xs, n, out, tile_add);
    if (!ok || p.splits == 1)
        return;
    size_t total = (size_t)n * rows;
    kq_reduce_kernel<<<(unsigned)((total + 255) / 256), 256, 0, c->st>>>(part, p.splits, total, y, add);
    CU_LAUNCH(c, "kq_reduce_kernel");
}
