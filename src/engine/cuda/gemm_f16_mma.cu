/* gemm_f16_mma.cu - prefill-size f16 / bf16 weight products on the tensor cores, big tiles.
 *
 * y(rows, n) = W(rows, cols) x(cols, n) (add: y +=) for W of f16 or bf16 rows ldw elements
 * apart and x f32 (n, cols), under TIDE_F16_MMA=1 (cuda_set_f16_mma) from n = FM_MIN_N. The
 * wmma kernels of matmul.cu take 64 x 32 / 64 x 64 tiles: every W element is read from L2
 * once per 64 tokens and every x element once per 32-64 rows, far too often for H100/H200
 * tensor throughput (the vision tower's 2.7 TFLOP encode wants ~100 TFLOP/s sustained). Here:
 *
 *   - x is rounded to W's type once per product (fm_convert_kernel, into the backend's sum
 *     buffer: cuda_scratch may hold the caller's W, k-quant.cu widens into it), exactly as the
 *     wmma kernels round it while staging, so both paths see the same operands;
 *   - a CTA of 8 warps owns a 128-row x BN-token tile (BN = 64 or 128; warps 4 along the rows
 *     x 2 along the tokens, each 32 rows x BN/2 tokens of m16n8k16 MMAs, f32 accumulate) and
 *     walks K in stages of FM_BK: a ring of FM_STAGES stages filled by cp.async 16-byte
 *     granules FM_STAGES - 1 ahead of the MMAs (as mma_tile.cuh does for int8), fragments
 *     read with ldmatrix. Granules past cols, rows or n are zero-filled, so edges need no
 *     other predication until the stores; cols need only be a multiple of 8 (whole granules);
 *   - split-K, as mmq_mma.cu: when the tiles alone leave SMs idle, grid z cuts K into slices
 *     whose partial y go to scratch, and fm_reduce_kernel adds them in slice order (fixed
 *     order: the result does not depend on timing) and applies add;
 *   - add is y = y + p with p the product's f32 value, the bits of the product then an add,
 *     as cuda_matmul promises, without the extra buffer matmul_add_via_buf takes.
 *
 * The tile itself is gemm_f16_mma.cuh's fm_tile (shared with its host emulation, `make
 * f16-tile-emu`); scripts/emu-gemm-f16-mma.py emulates the same index math in numpy. */
#include <stdlib.h>
#include <string.h>
#include "engine/cuda/gemm_f16_mma.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#define FM_MAX_SPLIT 8
#define FM_MIN_N 64        /* below this the wmma kernel stays (few token tiles to share W) */

static int f16_mma = -1; /* -1: TIDE_F16_MMA not read yet */
static int fm_bn = 0;    /* 0: chosen per product; 64 / 128 forced (benchmarks) */
static int fm_split = FM_MAX_SPLIT;

extern "C" int cuda_set_f16_mma(int on)
{
    if (f16_mma < 0) {
        const char *e = getenv("TIDE_F16_MMA");
        f16_mma = !(e && !strcmp(e, "0"));
    }
    int old = f16_mma;
    if (on >= 0)
        f16_mma = on != 0;
    return old;
}

extern "C" int cuda_set_f16_mma_tile(int bn, int max_splits)
{
    int old = fm_bn;
    fm_bn = bn == 64 || bn == 128 ? bn : 0;
    fm_split = max_splits >= 1 && max_splits <= FM_MAX_SPLIT ? max_splits : FM_MAX_SPLIT;
    return old;
}

__device__ __forceinline__ uint16_t fm_round(float v, __half *) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint16_t fm_round(float v, __nv_bfloat16 *)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* out[i] = x[i] rounded to T, total elements; VEC: 4 at a time (x 16-byte aligned, total % 4 == 0) */
template <typename T, bool VEC>
__global__ void fm_convert_kernel(const float *__restrict__ x, size_t total, uint16_t *__restrict__ out)
{
    size_t step = (size_t)gridDim.x * blockDim.x;
    if (VEC) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total / 4; i += step) {
            float4 v = __ldg((const float4 *)x + i);
            ushort4 h = make_ushort4(fm_round(v.x, (T *)0), fm_round(v.y, (T *)0), fm_round(v.z, (T *)0),
                                     fm_round(v.w, (T *)0));
            ((ushort4 *)out)[i] = h;
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step)
            out[i] = fm_round(__ldg(x + i), (T *)0);
    }
}

/* grid (token tiles, row tiles, K slices of kps stages). x16 is (n, cols) rounded, rows cols
 * apart. out is y (one slice: add applies) or the partials (slice, n, rows). */
template <typename T, int BN>
__global__ void __launch_bounds__(FM_THREADS, 2)
gemm_f16_mma_kernel(const uint16_t *__restrict__ W, size_t ldw, int rows, int cols,
                    const uint16_t *__restrict__ x16, int n, int kps, float *__restrict__ out, bool add)
{
    extern __shared__ __align__(16) uint8_t fm_raw[];
    int nkt_all = (cols + FM_BK - 1) / FM_BK, kt0 = blockIdx.z * kps;
    fm_tile<T, BN>(*(fm_smem<BN> *)fm_raw, W, ldw, rows, cols, x16, n, blockIdx.y * FM_BM, blockIdx.x * BN, kt0,
                   min(kps, nkt_all - kt0), out + (size_t)blockIdx.z * n * rows, add);
}

/* y[i] (+)= the sum of part[slice][i] over the slices, in slice order */
__global__ void fm_reduce_kernel(const float *__restrict__ part, int splits, size_t total, float *__restrict__ y,
                                 bool add)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int z = 1; z < splits; z++)
            s += part[(size_t)z * total + i];
        y[i] = add ? y[i] + s : s;
    }
}

struct fm_plan {
    int bn, splits, kps;
};

/* Tile width: 128 tokens where that still gives every SM a CTA, else 64. Slices of K when
 * the tiles leave SMs idle, as many as keep the CTAs within one wave of 2 an SM, each slice at
 * least FM_STAGES stages (the ring's depth: shorter slices spend their time filling it). */
static fm_plan fm_plan_for(int sm_count, int rows, int cols, int n)
{
    fm_plan p;
    long rt = (rows + FM_BM - 1) / FM_BM;
    p.bn = fm_bn ? fm_bn : n > 64 && rt * ((n + 127) / 128) >= sm_count ? 128 : 64;
    long ctas = rt * ((n + p.bn - 1) / p.bn);
    int nkt = (cols + FM_BK - 1) / FM_BK;
    int s = ctas >= sm_count ? 1 : (int)(2L * sm_count / ctas); /* rounded down: no ragged second wave */
    int smax = nkt / FM_STAGES > 1 ? nkt / FM_STAGES : 1;
    s = s < smax ? s : smax;
    s = s < fm_split ? s : fm_split;
    p.kps = (nkt + s - 1) / s;
    p.splits = (nkt + p.kps - 1) / p.kps;
    return p;
}

template <typename T, int BN>
static bool fm_launch(struct cuda_ctx *c, const fm_plan &p, const uint16_t *W, size_t ldw, int rows, int cols,
                      const uint16_t *x16, int n, float *out, bool add)
{
    static uint64_t opted; /* bit dev: the >48 KB opt-in done (only the engine thread launches) */
    size_t smem = sizeof(fm_smem<BN>);
    if (c->dev < 64 && !(opted >> c->dev & 1)) {
        if (!CU(c, cudaFuncSetAttribute(gemm_f16_mma_kernel<T, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem)))
            return false;
        opted |= 1ull << c->dev;
    }
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((rows + FM_BM - 1) / FM_BM), (unsigned)p.splits);
    gemm_f16_mma_kernel<T, BN><<<grid, FM_THREADS, smem, c->st>>>(W, ldw, rows, cols, x16, n, p.kps, out, add);
    return CU_LAUNCH(c, "gemm_f16_mma_kernel");
}

template <typename T>
static bool fm_run(struct cuda_ctx *c, const fm_plan &p, const uint16_t *W, size_t ldw, int rows, int cols,
                   const float *x, int n, float *y, bool add, uint8_t *ws, size_t xbytes)
{
    uint16_t *x16 = (uint16_t *)ws;
    float *part = p.splits > 1 ? (float *)(ws + xbytes) : y;
    size_t total = (size_t)n * cols;
    bool vec = ((uintptr_t)x & 15) == 0 && total % 4 == 0;
    unsigned g = cuda_grid(vec ? total / 4 : total, 256);
    if (vec)
        fm_convert_kernel<T, true><<<g, 256, 0, c->st>>>(x, total, x16);
    else
        fm_convert_kernel<T, false><<<g, 256, 0, c->st>>>(x, total, x16);
    if (!CU_LAUNCH(c, "fm_convert_kernel"))
        return false;
    bool one = p.splits == 1;
    bool ok = p.bn == 128 ? fm_launch<T, 128>(c, p, W, ldw, rows, cols, x16, n, part, add && one)
                          : fm_launch<T, 64>(c, p, W, ldw, rows, cols, x16, n, part, add && one);
    if (!ok || one)
        return ok;
    size_t ny = (size_t)n * rows;
    fm_reduce_kernel<<<cuda_grid(ny, 256), 256, 0, c->st>>>(part, p.splits, ny, y, add);
    return CU_LAUNCH(c, "fm_reduce_kernel");
}

/* Whether cuda_f16_mma takes this product, and the workspace it then takes from the sum buffer. */
static bool fm_takes(struct cuda_ctx *c, uint32_t type, const void *W, size_t ldw, int rows, int cols, int n,
                     const float *x, const float *y, size_t *xbytes, size_t *need)
{
    if (!cuda_set_f16_mma(-1) || (type != GGML_TYPE_F16 && type != GGML_TYPE_BF16) || n < FM_MIN_N || rows <= 0 ||
        cols <= 0 || cols % 8 || ldw % 8 || ((uintptr_t)W & 15))
        return false;
    /* the sum buffer is the workspace: an x or y inside it (matmul_add_via_buf's product) declines */
    const uint8_t *sb = (const uint8_t *)c->sum;
    if (sb && (((const uint8_t *)x >= sb && (const uint8_t *)x < sb + c->sum_n) ||
               ((const uint8_t *)y >= sb && (const uint8_t *)y < sb + c->sum_n)))
        return false;
    fm_plan p = fm_plan_for(c->sm_count, rows, cols, n);
    *xbytes = ((size_t)n * cols * sizeof(uint16_t) + 255) & ~(size_t)255;
    *need = *xbytes + (p.splits > 1 ? (size_t)p.splits * n * rows * sizeof(float) : 0);
    return true;
}

size_t cuda_f16_mma_workspace(struct cuda_ctx *c, uint32_t type, const void *W, size_t ldw, int rows, int cols,
                              int n)
{
    size_t xbytes, need;
    return fm_takes(c, type, W, ldw, rows, cols, n, nullptr, nullptr, &xbytes, &need) ? need : 0;
}

bool cuda_f16_mma(struct cuda_ctx *c, uint32_t type, const void *W, size_t ldw, int rows, int cols,
                  const float *x, int n, float *y, bool add)
{
    size_t xbytes, need;
    if (!fm_takes(c, type, W, ldw, rows, cols, n, x, y, &xbytes, &need))
        return false;
    fm_plan p = fm_plan_for(c->sm_count, rows, cols, n);
    uint8_t *ws = (uint8_t *)cuda_sum_buf(c, need);
    if (!ws)
        return true; /* the error is kept in c */
    if (type == GGML_TYPE_F16)
        fm_run<__half>(c, p, (const uint16_t *)W, ldw, rows, cols, x, n, y, add, ws, xbytes);
    else
        fm_run<__nv_bfloat16>(c, p, (const uint16_t *)W, ldw, rows, cols, x, n, y, add, ws, xbytes);
    return true;
}
