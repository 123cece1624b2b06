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
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4): A
 * a0 = (row g, k 2t..2t+1), a1 = (row g+8, same k), a2 / a3 = the same at k + 8; B b0 = (k
 * 2t..2t+1, column g), b1 = at k + 8; C c0, c1 = (row g, columns 2t, 2t+1), c2, c3 = row g+8.
 * ldmatrix.x4 gives lane l, in register j, row l / 4 and elements 2(l % 4), +1 of the 8x8
 * matrix whose row addresses lanes 8j..8j+7 supplied. W's stage is [row][k] (A, row-major)
 * and x's is [token][k] (B, "col": a column of B is a row of the stage), so both are plain,
 * untransposed ldmatrix. scripts/emu-gemm-f16-mma.py emulates this index math in numpy. */
#include <stdlib.h>
#include <string.h>
#include "engine/cuda/mma_q.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#define FM_BM 128          /* weight rows per CTA: 4 warps x 32 */
#define FM_BK 32           /* K per stage: two m16n8k16 steps */
#define FM_LD (FM_BK + 8)  /* halves per row of a stage: 80 bytes, so the 8 rows an ldmatrix
                              phase reads (16 bytes each) start 20 words apart: 32 banks */
#define FM_STAGES 4        /* cp.async ring depth: 80 KB at BN 128, two CTAs an SM */
#define FM_THREADS 256
#define FM_WM 4            /* warps along the rows */
#define FM_WN 2            /* warps along the tokens */
#define FM_MAX_SPLIT 8
#define FM_MIN_N 64        /* below this the wmma kernel stays (few token tiles to share W) */

static int f16_mma = -1; /* -1: TIDE_F16_MMA not read yet */
static int fm_bn = 0;    /* 0: chosen per product; 64 / 128 forced (benchmarks) */
static int fm_split = FM_MAX_SPLIT;

extern "C" int cuda_set_f16_mma(int on)
{
    if (f16_mma < 0) {
        const char *e = getenv("TIDE_F16_MMA");
        f16_mma = e && e[0] && strcmp(e, "0") ? 1 : 0;
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

template <int BN>
struct fm_smem {
    uint16_t w[FM_STAGES][FM_BM * FM_LD]; /* [stage][row][k]: W's stage, f16 / bf16 bits */
    uint16_t x[FM_STAGES][BN * FM_LD];    /* [stage][token][k]: x's stage, rounded */
};

/* four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8. volatile and
 * "memory": the reads must stay between the barriers that order them against cp.async. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

/* d += A(16x16) B(16x8), T in, f32 accumulate */
template <typename T>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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
    constexpr int MI = FM_BM / FM_WM / 16; /* 16-row MMA tiles a warp: 2 */
    constexpr int NJ = BN / FM_WN / 8;     /* 8-token MMA tiles a warp: 4 or 8 */
    constexpr int GR = FM_BK / 8;          /* 16-byte granules of a row's stage: 4 */
    extern __shared__ __align__(16) uint8_t fm_raw[];
    fm_smem<BN> &sm = *(fm_smem<BN> *)fm_raw;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp % FM_WM, wn = warp / FM_WM;
    int n0 = blockIdx.x * BN, m0 = blockIdx.y * FM_BM;
    int nkt_all = (cols + FM_BK - 1) / FM_BK, kt0 = blockIdx.z * kps;
    int nkt = min(kps, nkt_all - kt0);

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
    float *y = out + (size_t)blockIdx.z * n * rows;
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
