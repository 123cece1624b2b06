/* mmq_mma.cu - prefill-size q8_0 / q4_0 products on the int8 tensor cores.
 *
 * y(rows, n) = W(rows, cols) x(cols, n) with x already quantised to q8_0-style int8 blocks
 * (quantize_q8_kernel in mmq.cuh: the CPU backend's formula). The dp4a path (mmq.cuh)
 * handles 8 tokens per launch, so at prefill sizes it re-reads W n/8 times and does all the
 * integer work on the CUDA cores; here a CTA owns a 128-row x BN-token tile of y and walks K
 * (or a slice of K, see split-K below) with mma_tile.cuh's tile_mainloop, which the grouped
 * expert products share. Shapes it cannot take (tile_shape_ok: K not a multiple of 128, rows
 * not 8-byte aligned) stay on the dp4a path.
 *
 * Split-K: a 64-token prefill chunk of a 2048-row product is only 16 CTAs of 128 x 64, an
 * eighth of the SMs. When the tiles alone give fewer CTAs than SMs, K is cut into slices
 * (grid z); each slice writes its partial y to scratch and mmq_reduce_kernel adds the slices
 * in a fixed order (deterministic, unlike atomics). */
#include <stdlib.h>
#include "engine/cuda/mma_tile.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#define MQ_MAX_SPLIT 8

/* Smallest n sent here. Measured (H200, q8_0, the five Qwen3-30B-A3B shapes of bench_mmq):
 * at n = 16 this kernel beat the dp4a path on all five (1.04x on 768 x 2048 to 2.4x on
 * 2048 x 4096); at n = 8 (one dp4a launch) it lost on the three smaller ones (0.47-0.70x).
 * n = 9..15 was not measured (dp4a needs 2 launches there, as at 16). */
static int mmq_min_n = 16;
static int mmq_bn = 0;     /* 0: choose per launch; 16/32/64 forced (benchmarks) */
static int mmq_split = MQ_MAX_SPLIT; /* most K slices (benchmarks: 1 = no split-K) */

extern "C" int cuda_set_mmq_min_n(int n)
{
    int old = mmq_min_n;
    mmq_min_n = n;
    return old;
}

extern "C" int cuda_set_mmq_tile(int bn)
{
    int old = mmq_bn;
    mmq_bn = bn == 16 || bn == 32 || bn == 64 ? bn : 0;
    return old;
}

extern "C" int cuda_set_mmq_split(int max_splits)
{
    int old = mmq_split;
    mmq_split = max_splits >= 1 && max_splits <= MQ_MAX_SPLIT ? max_splits : MQ_MAX_SPLIT;
    return old;
}

/* the knobs above as mmq_kquant.cu's plan reads them (mmq_kquant.cuh) */
int cuda_mmq_forced_tile(void) { return mmq_bn; }
int cuda_mmq_max_split(void) { return mmq_split; }

/* TIDE_MMQ_MIN_N=N in the environment moves the tensor-core threshold (diagnostics: a large N
 * keeps every product on the dp4a kernels). */
int cuda_mmq_min_n(void)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("TIDE_MMQ_MIN_N");
        env = e && atoi(e) > 0 ? atoi(e) : 0;
    }
    return env ? env : mmq_min_n;
}

bool cuda_mmq_ok(const void *W, size_t row_bytes, int nb) { return tile_shape_ok(W, row_bytes, nb); }

/* grid (token tiles, row tiles, K slices of kps stages): consecutive CTAs share a weight
 * tile, so W comes from DRAM about once and the (small) quantised x stays in L2. out is y,
 * or with several slices the partials (slice, n, rows). BN = 16, 32 or 64 tokens. */
template <int QT, int BN>
__global__ void __launch_bounds__(TILE_THREADS, 2)
mmq_mma_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb, const int8_t *__restrict__ xq,
               const float *__restrict__ xd, int n, int kps, float *__restrict__ out)
{
    extern __shared__ __align__(16) uint8_t smem_raw[];
    tile_smem<QT, BN> &sm = *(tile_smem<QT, BN> *)smem_raw;
    int n0 = blockIdx.x * BN, m0 = blockIdx.y * TILE_BM;
    for (int rr = threadIdx.x; rr < TILE_BM; rr += TILE_THREADS)
        sm.wrow[rr] = m0 + rr < rows ? W + (size_t)(m0 + rr) * row_bytes : nullptr;
    for (int c = threadIdx.x; c < BN; c += TILE_THREADS)
        sm.xrow[c] = n0 + c < n ? n0 + c : -1;
    __syncthreads();
    int kt0 = blockIdx.z * kps;
    tile_acc<BN> acc;
    tile_mainloop<QT, BN>(sm, nb, xq, xd, kt0, min(kps, nb / TILE_KB - kt0), acc);

    float *y = out + (size_t)blockIdx.z * n * rows;
#pragma unroll
    for (int i = 0; i < tile_acc<BN>::MI; i++)
#pragma unroll
        for (int j = 0; j < tile_acc<BN>::NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = m0 + tile_row(i, e), tk = n0 + tile_col<BN>(j, e);
                if (r < rows && tk < n)
                    y[(size_t)tk * rows + r] = acc.v[i][j][e];
            }
}

/* y[i] = sum over the slices of part[slice][i], slices in order */
__global__ void mmq_reduce_kernel(const float *__restrict__ part, int splits, size_t total, float *__restrict__ y)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    float s = part[i];
    for (int z = 1; z < splits; z++)
        s += part[(size_t)z * total + i];
    y[i] = s;
}

struct mq_plan {
    int bn, splits, kps;
};

/* Tile width: the narrowest that holds n (at most 64). Slices of K when the tiles leave SMs
 * idle, up to ~2 CTAs an SM (2 of the 50-90 KB CTAs fit on one), at least 2 stages each.
 * Measured on the H200 with the old 64-row tiles (q8_0, 2048-768 cols): split-K took
 * 32-96-CTA products 1.4-3.4x faster, but made 256-CTA ones 4-20% slower, the partial sums'
 * traffic outweighing the second CTA an SM. */
static mq_plan plan(struct cuda_ctx *c, int rows, int nb, int n)
{
    mq_plan p;
    p.bn = mmq_bn ? mmq_bn : n > 32 ? 64 : n > 16 ? 32 : 16;
    int nkt = nb / TILE_KB > 0 ? nb / TILE_KB : 1; /* (a scratch query may ask of any shape) */
    long ctas = (long)((rows + TILE_BM - 1) / TILE_BM) * ((n + p.bn - 1) / p.bn);
    long want = 2L * c->sm_count;
    int s = ctas >= c->sm_count ? 1 : (int)((want + ctas - 1) / ctas);
    int smax = nkt / 2 > 1 ? nkt / 2 : 1;
    s = s < smax ? s : smax;
    s = s < mmq_split ? s : mmq_split;
    p.kps = (nkt + s - 1) / s;
    p.splits = (nkt + p.kps - 1) / p.kps;
    return p;
}

size_t cuda_mmq_scratch(struct cuda_ctx *c, int rows, int nb, int n)
{
    mq_plan p = plan(c, rows, nb, n);
    return p.splits > 1 ? (size_t)p.splits * n * rows * sizeof(float) : 0;
}

template <int QT, int BN>
static bool launch(struct cuda_ctx *c, const mq_plan &p, const uint8_t *W, size_t row_bytes, int rows, int nb,
                   const int8_t *xq, const float *xd, int n, float *out)
{
    /* over 48 KB of dynamic shared memory needs the opt-in, once per device */
    static uint64_t opted; /* bit dev: done (only the engine thread launches) */
    size_t smem = sizeof(tile_smem<QT, BN>);
    if (c->dev < 64 && !(opted >> c->dev & 1)) {
        if (!CU(c, cudaFuncSetAttribute(mmq_mma_kernel<QT, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem)))
            return false;
        opted |= 1ull << c->dev;
    }
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((rows + TILE_BM - 1) / TILE_BM), (unsigned)p.splits);
    mmq_mma_kernel<QT, BN><<<grid, TILE_THREADS, smem, c->st>>>(W, row_bytes, rows, nb, xq, xd, n, p.kps, out);
    return CU_LAUNCH(c, "mmq_mma_kernel");
}

bool cuda_mmq_mma(struct cuda_ctx *c, uint32_t type, const uint8_t *W, size_t row_bytes, int rows, int nb,
                  const int8_t *xq, const float *xd, int n, float *y, float *part)
{
    mq_plan p = plan(c, rows, nb, n);
    float *out = p.splits > 1 ? part : y;
    bool ok;
    if (type == GGML_TYPE_Q8_0)
        ok = p.bn == 64   ? launch<8, 64>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
             : p.bn == 32 ? launch<8, 32>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
                          : launch<8, 16>(c, p, W, row_bytes, rows, nb, xq, xd, n, out);
    else
        ok = p.bn == 64   ? launch<2, 64>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
             : p.bn == 32 ? launch<2, 32>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
                          : launch<2, 16>(c, p, W, row_bytes, rows, nb, xq, xd, n, out);
    if (!ok || p.splits == 1)
        return ok;
    size_t total = (size_t)n * rows;
    mmq_reduce_kernel<<<(unsigned)((total + 255) / 256), 256, 0, c->st>>>(part, p.splits, total, y);
    return CU_LAUNCH(c, "mmq_reduce_kernel");
}
