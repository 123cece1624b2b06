/* mmvq_fused.cuh - matmul.cu's decode kernels (x quantised, for matmul3 also normed, inside
 * each CTA, then one warp a row: mmvq_fused_kernel, mmvq_fused3_kernel), moved here verbatim so
 * that the host emulation (tests/gpu/emu/qonce_emu.cpp, `make decode-qonce-emu`) compiles this
 * very code with g++ as the bits TIDE_DECODE_QONCE must reproduce. */
#ifndef TIDE_CUDA_MMVQ_FUSED_CUH
#define TIDE_CUDA_MMVQ_FUSED_CUH

#include "engine/cuda/mmq.cuh"

#define MMQ_WARPS 8

/* Decode form: the CTA first quantises its nt input vectors into shared memory (the same
 * formula as quantize_q8_kernel), then each warp dots rpw rows. One launch per product
 * instead of two: decode issues thousands of small products per token, and launches, not
 * bytes, bound it. The two halves are device functions so that the three-matrix form below
 * runs the same instructions. NORM: x is first normed, element e of token t as rmsnorm_kernel
 * writes it (x * sc[t] * nw[e % cols]), and CTA 0 writes the normed x to xn. */
template <bool NORM>
__device__ __forceinline__ void quantize_x_smem(const float *__restrict__ x, int total, int8_t *xq, float *xd,
                                                int cols = 0, const float *sc = nullptr, uint32_t ntype = 0,
                                                const uint8_t *nw = nullptr, float *xn = nullptr)
{
    int tid = threadIdx.x, warp = tid >> 5;
    for (int base = 0; base < total; base += MMQ_WARPS * 32 * 4) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) { /* all loads first, then the reductions */
            int e = base + k * MMQ_WARPS * 32 + tid;
            v[k] = e < total ? __ldg(x + e) : 0.0f;
            if (NORM && e < total) {
                int t = e / cols;
                v[k] = v[k] * sc[t] * row_elem(ntype, nw, e - t * cols);
                if (blockIdx.x == 0)
                    xn[e] = v[k];
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int e = base + k * MMQ_WARPS * 32 + tid;
            if (base + k * MMQ_WARPS * 32 + warp * 32 < total) /* warp-uniform: total % 32 == 0 */
                quantize_q8_elem(v[k], e, xq, xd);
        }
    }
    __syncthreads();
}

/* One vector of up to X1_MAX elements (decode): the same quantisation (and with NORM the same
 * rms scale, reduced in rms_scale's order, and normed values) as rms_scale + quantize_x_smem,
 * but x is read once, every load issued before any reduction: the prologue of a decode
 * product costs one round trip to memory instead of three or four. */
#define X1_PER_THREAD 16
#define X1_MAX (X1_PER_THREAD * MMQ_WARPS * 32)
template <bool NORM>
__device__ __forceinline__ void quantize_x1_smem(const float *__restrict__ x, int cols, int8_t *xq, float *xd,
                                                 float eps = 0.0f, uint32_t ntype = 0, const uint8_t *nw = nullptr,
                                                 float *xn = nullptr)
{
    constexpr int B = MMQ_WARPS * 32;
    int tid = threadIdx.x, warp = tid >> 5;
    float v[X1_PER_THREAD];
#pragma unroll
    for (int k = 0; k < X1_PER_THREAD; k++) {
        int e = k * B + tid;
        v[k] = e < cols ? __ldg(x + e) : 0.0f;
    }
    if (NORM) {
        __shared__ float red[32];
        float sc = rms_scale_held(v, cols, B, eps, red);
#pragma unroll
        for (int k = 0; k < X1_PER_THREAD; k++) {
            int e = k * B + tid;
            if (e < cols) {
                v[k] = v[k] * sc * row_elem(ntype, nw, e);
                if (blockIdx.x == 0)
                    xn[e] = v[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < X1_PER_THREAD; k++) {
        int e = k * B + tid;
        if (k * B + warp * 32 < cols) /* warp-uniform: cols % 32 == 0 */
            quantize_q8_elem(v[k], e, xq, xd);
    }
    __syncthreads();
}

/* Rows (blk * rpw + k) * MMQ_WARPS + warp, k < rpw, of W against the quantised x. */
template <int QT>
__device__ __forceinline__ void mmvq_rows(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb,
                                          bool pairs, const int8_t *xq, const float *xd, int nt,
                                          float *__restrict__ y, int rpw, bool add, int blk)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int k = 0; k < rpw; k++) {
        int r = (blk * rpw + k) * MMQ_WARPS + warp;
        if (r >= rows)
            break;
        float s[MM_NT];
        mm_sums_clear(s);
        row_dot_q<QT, true>(W + (size_t)r * row_bytes, nb, pairs, xq, xd, nt, s, lane);
        mm_sums_store(s, nt, y, rows, r, add, lane);
    }
}

template <int QT>
__global__ void __launch_bounds__(MMQ_WARPS * 32)
mmvq_fused_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols, bool pairs,
                  const float *__restrict__ x, int nt, float *__restrict__ y, int rpw, bool add)
{
    extern __shared__ __align__(16) uint8_t smq[];
    int nb = cols / QK, total = nt * cols;
    int8_t *xq = (int8_t *)smq;                                   /* (nt, cols) */
    float *xd = (float *)(smq + (((size_t)total + 15) & ~(size_t)15)); /* (nt, nb) */
    if (nt == 1 && cols <= X1_MAX) /* grid-uniform */
        quantize_x1_smem<false>(x, cols, xq, xd);
    else
        quantize_x_smem<false>(x, total, xq, xd);
    mmvq_rows<QT>(W, row_bytes, rows, nb, pairs, xq, xd, nt, y, rpw, add, blockIdx.x);
}

/* backend_i.matmul3: three products of one x (wq, wk, wv) in one grid. CTAs start[m] ..
 * start[m + 1) - 1 take matrix m, each as mmvq_fused_kernel would with rpw = a.rpw, so every
 * row gets the bits of its own matmul. With nw (the attention norm's weight; needs
 * norm_block(cols) == the CTA size, so that rms_scale reduces as rmsnorm_kernel), every CTA
 * first computes each token's rms scale: the rmsnorm's launch folded into the product's. */
struct mm3_args {
    const uint8_t *W[3];
    size_t row_bytes[3];
    float *y[3];
    int rows[3];
    int start[4];
    bool pairs[3];
    const uint8_t *nw; /* norm weight, or NULL */
    uint32_t ntype;
    float eps;
    float *xn;         /* the normed x (nt, cols), written by CTA 0 */
    int rpw;           /* rows a warp */
};

template <int QT>
__global__ void __launch_bounds__(MMQ_WARPS * 32)
mmvq_fused3_kernel(const mm3_args a, int cols, const float *__restrict__ x, int nt)
{
    extern __shared__ __align__(16) uint8_t smq[];
    int nb = cols / QK, total = nt * cols;
    int8_t *xq = (int8_t *)smq;
    float *xd = (float *)(smq + (((size_t)total + 15) & ~(size_t)15));
    int b = blockIdx.x, m = b >= a.start[2] ? 2 : b >= a.start[1] ? 1 : 0;
    /* picked by selects: an index into the parameter arrays would copy them to local memory */
#define PICK(f) (m == 0 ? a.f[0] : m == 1 ? a.f[1] : a.f[2])
    const uint8_t *W = PICK(W);
    size_t rb = PICK(row_bytes);
    float *y = PICK(y);
    int rows = PICK(rows), first = PICK(start);
    bool pairs = PICK(pairs);
#undef PICK
    if (nt == 1 && cols <= X1_MAX) { /* grid-uniform */
        if (a.nw)
            quantize_x1_smem<true>(x, cols, xq, xd, a.eps, a.ntype, a.nw, a.xn);
        else
            quantize_x1_smem<false>(x, cols, xq, xd);
    } else if (a.nw) {
        __shared__ float red[32], sc[MM_NT];
        for (int t = 0; t < nt; t++) {
            float s = rms_scale(x + (size_t)t * cols, cols, a.eps, red);
            if (threadIdx.x == 0)
                sc[t] = s;
            __syncthreads(); /* sc[t] visible; every thread has read red before the next token */
        }
        quantize_x_smem<true>(x, total, xq, xd, cols, sc, a.ntype, a.nw, a.xn);
    } else {
        quantize_x_smem<false>(x, total, xq, xd);
    }
    mmvq_rows<QT>(W, rb, rows, nb, pairs, xq, xd, nt, y, a.rpw, false, b - first);
}
#endif
