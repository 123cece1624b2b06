/* kquant.cu - y(rows, n) = W x for k-quant weights (q4_K, q5_K, q6_K), cuda_matmul's branch
 * for those types (and the way to qblock.cu's q5_0 / q5_1 / iq4_xs / MXFP4 products).
 *
 *   - decode (n <= 2): one launch; each CTA quantises x into shared memory (the int8 blocks
 *     of 32 that quantize_q8_kernel writes) and each warp dots one row (kquant.cuh: dp4a,
 *     a lane per 64-value unit);
 *   - few tokens (n <= MM_NT, or W too big to widen): x quantised once into the scratch, then
 *     the same row dots, up to MM_NT vectors a launch;
 *   - prefill (n > MM_NT): W widened to f16 into the scratch (one pass, 0.5-0.6x the bytes of
 *     the product's own reads of x), then the f16 tensor-core GEMM of matmul.cu. The int8
 *     tensor-core kernel (mmq_mma.cu) takes q8_0/q4_0 blocks only, and a k-quant block's
 *     per-16/32 scales and mins do not fit its one-scale-a-block tiles;
 *   - unless TIDE_KQ_MMA=0 (on by default since it passed test-gpu on an H100), n >= cuda_mmq_min_n() goes
 *     to mmq_kquant.cu's int8 tensor-core tiles instead, which read the super-blocks as they are.
 * Rows need 4-byte alignment for q4_K/q5_K (every row is a multiple of 16 bytes), 2 for q6_K;
 * anything else returns false and matmul.cu's element-wise kernel runs. */
#include "engine/cuda/kquant.cuh"
#include "engine/cuda/mmq_kquant.cuh"

#define KQ_WARPS 8                          /* rows a CTA (one a warp) */
#define KQ_F16_MAX ((size_t)512 << 20)      /* largest widened W (bytes of f16) */

/* Decode: x (nt <= 2 vectors) quantised into shared memory by each CTA, one row a warp. */
template <int T>
__global__ void __launch_bounds__(KQ_WARPS * 32)
kq_mmv_fused_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
                    const float *__restrict__ x, int nt, float *__restrict__ y, bool add)
{
    extern __shared__ __align__(16) uint8_t smk[];
    int nb = cols / QK, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int8_t *xq = (int8_t *)smk;
    float *xd = (float *)(smk + (((size_t)nt * cols + 15) & ~(size_t)15));
    for (int b = warp; b < nt * nb; b += KQ_WARPS) /* quantize_q8_kernel's formula */
        quantize_q8_elem(__ldg(x + (size_t)b * QK + lane), b * QK + lane, xq, xd);
    __syncthreads();
    int r = blockIdx.x * KQ_WARPS + warp;
    if (r >= rows)
        return;
    float s[MM_NT];
    mm_sums_clear(s);
    row_dot_kq<T, true>(W + (size_t)r * row_bytes, cols / KQ_UNIT, xq, xd, nt, s, lane);
    mm_sums_store<2>(s, nt, y, rows, r, add, lane);
}

/* Up to MM_NT vectors already quantised (global memory), one row a warp. */
template <int T>
__global__ void __launch_bounds__(KQ_WARPS * 32)
kq_mmv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols, const int8_t *__restrict__ xq,
              const float *__restrict__ xd, int nt, float *__restrict__ y, bool add)
{
    int lane = threadIdx.x & 31, r = blockIdx.x * KQ_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    float s[MM_NT];
    mm_sums_clear(s);
    row_dot_kq<T, false>(W + (size_t)r * row_bytes, cols / KQ_UNIT, xq, xd, nt, s, lane);
    mm_sums_store(s, nt, y, rows, r, add, lane);
}

/* W (rows, cols) widened to f16, one 64-value unit a thread (the values kq_elem gives, in f32,
 * rounded once to f16). */
template <int T>
__global__ void kq_widen_f16_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
                                    __half *__restrict__ out)
{
    int nu = cols / KQ_UNIT;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nu)
        return;
    int r = (int)(i / nu), u = (int)(i % nu);
    kq_unit k;
    kq_load_unit<T>(W + (size_t)r * row_bytes, u, k);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        __half *o = out + (size_t)r * cols + (size_t)kq_unit_block<T>(u, h) * QK;
        float m = k.dmin * (float)k.mn[h];
#pragma unroll
        for (int w = 0; w < 8; w++) {
            __half v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int q = (int)(int8_t)(k.q[h][w] >> (8 * e));
                v[e] = __float2half_rn(k.d * (float)k.sc[h][w >> 2] * (float)q - m);
            }
            *(uint2 *)(o + 4 * w) = *(const uint2 *)v;
        }
    }
}

/* Rows the row dots can read with their word loads */
static bool kq_aligned(uint32_t type, const void *W, size_t row_bytes)
{
    size_t mask = type == GGML_TYPE_Q6_K ? 1 : 3;
    return (((uintptr_t)W | row_bytes) & mask) == 0;
}

template <int T>
static void kq_launch_decode(struct cuda_ctx *c, const uint8_t *W, size_t rb, int rows, int cols, const float *x,
                             int nt, float *y, bool add, size_t sm)
{
    kq_mmv_fused_kernel<T><<<(rows + KQ_WARPS - 1) / KQ_WARPS, KQ_WARPS * 32, sm, c->st>>>(W, rb, rows, cols, x, nt,
                                                                                           y, add);
}

template <int T>
static void kq_launch_rows(struct cuda_ctx *c, const uint8_t *W, size_t rb, int rows, int cols, const int8_t *xq,
                           const float *xd, int nt, float *y, bool add)
{
    kq_mmv_kernel<T><<<(rows + KQ_WARPS - 1) / KQ_WARPS, KQ_WARPS * 32, 0, c->st>>>(W, rb, rows, cols, xq, xd, nt,
                                                                                    y, add);
}

template <int T>
static void kq_launch_widen(struct cuda_ctx *c, const uint8_t *W, size_t rb, int rows, int cols, __half *out)
{
    size_t units = (size_t)rows * (cols / KQ_UNIT);
    kq_widen_f16_kernel<T><<<(unsigned)((units + 255) / 256), 256, 0, c->st>>>(W, rb, rows, cols, out);
}

#define KQ_DISPATCH(type, fn, ...)                                                                                     \
    do {                                                                                                               \
        if ((type) == GGML_TYPE_Q4_K) fn<KQ_Q4_K>(__VA_ARGS__);                                                       \
        else if ((type) == GGML_TYPE_Q5_K) fn<KQ_Q5_K>(__VA_ARGS__);                                                  \
        else fn<KQ_Q6_K>(__VA_ARGS__);                                                                                 \
    } while (0)

bool cuda_matmul_kq(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n, bool add)
{
    uint32_t type = w->type;
    int cols = (int)w->ne[0], rows = (int)w->ne[1] ? (int)w->ne[1] : 1;
    const uint8_t *W = (const uint8_t *)w->data;
    if (!kq_type(type)) /* q5_0, q5_1, iq4_xs, MXFP4: qblock.cu (cuda_matmul's one branch for both) */
        return cuda_matmul_qb(c, w, x, y, n, add);
    if (cols % QK_K || !kq_aligned(type, W, w->row_bytes))
        return false;
    if (cuda_kq_mma_wants(type, W, w->row_bytes, cols, n)) {
        cuda_kq_mma_matmul(c, type, W, w->row_bytes, rows, cols, x, n, y, add);
        return true;
    }
    int nb = cols / QK;
    size_t wide = (size_t)rows * cols * sizeof(__half);
    if (n > MM_NT && wide <= KQ_F16_MAX) {
        __half *w16 = (__half *)cuda_scratch(c, wide);
        if (!w16)
            return true; /* the error is kept in c */
        KQ_DISPATCH(type, kq_launch_widen, c, W, w->row_bytes, rows, cols, w16);
        if (!CU_LAUNCH(c, "kq_widen_f16_kernel"))
            return true;
        struct tensor t = *w;
        t.type = GGML_TYPE_F16;
        t.data = w16;
        t.row_bytes = (size_t)cols * sizeof(__half);
        cuda_matmul(c, &t, x, y, n, add); /* the tensor-core GEMM; it does not use the scratch */
        return true;
    }
    size_t sm = (((size_t)n * cols + 15) & ~(size_t)15) + (size_t)n * nb * sizeof(float);
    if (n <= 2 && sm <= 48 * 1024) {
        KQ_DISPATCH(type, kq_launch_decode, c, W, w->row_bytes, rows, cols, x, n, y, add, sm);
        CU_LAUNCH(c, "kq_mmv_fused_kernel");
        return true;
    }
    size_t qbytes = ((size_t)n * cols + 255) & ~(size_t)255;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + (size_t)n * nb * sizeof(float));
    if (!ws)
        return true;
    int8_t *xq = (int8_t *)ws;
    float *xd = (float *)(ws + qbytes);
    int nblocks = n * nb;
    quantize_q8_kernel<false><<<(nblocks + 7) / 8, 256, 0, c->st>>>(x, nblocks, xq, xd);
    if (!CU_LAUNCH(c, "quantize_q8_kernel"))
        return true;
    for (int t0 = 0; t0 < n; t0 += MM_NT) {
        int nt = n - t0 < MM_NT ? n - t0 : MM_NT;
        KQ_DISPATCH(type, kq_launch_rows, c, W, w->row_bytes, rows, cols, xq + (size_t)t0 * cols,
                    xd + (size_t)t0 * nb, nt, y + (size_t)t0 * rows, add);
        if (!CU_LAUNCH(c, "kq_mmv_kernel"))
            return true;
    }
    return true;
}
