/* matmul.cu - y(rows, n) = W x(cols, n) for f32, f16, bf16, q8_0 and q4_0 weights (k-quants:
 * kquant.cu, through cuda_matmul).
 *
 * Decode (and the few-token products of MoE experts) is bound by reading W once, so those
 * kernels give one warp to one weight row, dequantise in registers and dot the row with up
 * to 8 input vectors while it is loaded (a chunk of 8 tokens per launch beyond that):
 *   - f32/f16/bf16: 16-byte loads of W (8 halves, or 2x4 floats) per lane, f32 FMA;
 *   - q8_0/q4_0: x is first quantised to int8 blocks with an f16-rounded scale, exactly as the
 *     CPU backend does, and rows are dp4a integer dot products per 32-block, so the CUDA
 *     result matches the CPU one up to float summation order.
 * Prefill with f16/bf16 weights (n > 8) runs a tensor-core (WMMA, f32 accumulate) tiled GEMM
 * that converts x to the weight's type while staging it in shared memory; with q8_0/q4_0
 * weights (n >= 16) an int8 tensor-core kernel on the same quantised x (mmq_mma.cu). cuBLAS is not
 * used: the toolkit here has no static cuBLAS and the shared one is ~600 MB, which the
 * "one binary that starts without a driver" rule and the device tool's carry limit exclude. */
#include "engine/cuda/mmq.cuh"

#include <mma.h>


/* y += t, n elements: matmul_add for the tensor-core paths, which write through tiles. */
__global__ void add_kernel(float *y, const float *__restrict__ t, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += t[i];
}

/* ---- quantised rows: dp4a (quantize_q8_kernel, which feeds them, is in mmq.cuh) ---- */

/* QT = 8 (q8_0, 34-byte blocks) or 2 (q4_0, 18-byte blocks). Blocks are only 2-byte aligned
 * (34 = 2 mod 4), so each lane assembles its 8 ints from 16-bit loads; a warp still reads
 * 32 consecutive blocks, i.e. one contiguous stretch of the row. */
template <int QT>
__global__ void __launch_bounds__(MM_WARPS * 32)
mmvq_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb, bool pairs,
            const int8_t *__restrict__ xq, const float *__restrict__ xd, int nt, float *__restrict__ y, bool add);


#include "engine/cuda/mmvq_fused.cuh"


/* Rows a warp of a decode product takes (and so its CTA 8x that): each CTA quantises (for
 * matmul3 also norms) x before its rows, so more rows a CTA means fewer repeats of that
 * prologue but fewer bytes in flight a warp. Measured on the H200 (bench_decode_ops, rows a
 * warp 1 / 2 / 4): matmul3 (5120 rows) 18.0 / 14.0 / 15.5 us, wo (2048 rows) 11.5 / 12.7 /
 * 16.9 us; so 2 for matmul3 and 1 below 8192 rows otherwise. TIDE_DECODE_RPW (1, 2 or 4)
 * sets both, for that benchmark; any value gives the same bits. */
static int decode_rpw(int dflt)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TIDE_DECODE_RPW");
        int r = e ? atoi(e) : 0;
        v = r == 1 || r == 2 || r == 4 ? r : 0;
    }
    return v ? v : dflt;
}


/* Prefill-size inputs whose int8 copy would not fit in shared memory: x quantised once by
 * quantize_q8_kernel into global scratch, then one warp per row. */
template <int QT>
__global__ void __launch_bounds__(MM_WARPS * 32)
mmvq_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb, bool pairs,
            const int8_t *__restrict__ xq, const float *__restrict__ xd, int nt, float *__restrict__ y, bool add)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    float s[MM_NT];
    mm_sums_clear(s);
    row_dot_q<QT, false>(W + (size_t)r * row_bytes, nb, pairs, xq, xd, nt, s, lane);
    mm_sums_store(s, nt, y, rows, r, add, lane);
}

/* ---- float rows: 16-byte loads ---- */

__device__ __forceinline__ void load8(const float *p, float w[8])
{
    float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

__device__ __forceinline__ void load8(const __half *p, float w[8])
{
    uint4 u = __ldg((const uint4 *)p);
    uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(*(const __half2 *)&v[i]);
        w[2 * i] = f.x;
        w[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float w[8])
{
    uint4 u = __ldg((const uint4 *)p);
    uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[2 * i] = __uint_as_float(v[i] << 16);
        w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
    }
}

/* Needs cols % 8 == 0 and W, row_bytes, x 16-byte aligned (checked by the caller). Each
 * warp takes two adjacent rows, so every x load feeds two rows and four 16-byte weight
 * loads are in flight per lane before the FMAs (decode is bound by bytes in flight). */
#define GV_ROWS 2
template <typename WT>
__global__ void __launch_bounds__(MM_WARPS * 32)
gemv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
            const float *__restrict__ x, int nt, float *__restrict__ y, bool add)
{
    int lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * GV_ROWS;
    if (r0 >= rows)
        return;
    bool two = r0 + 1 < rows; /* warp-uniform */
    const WT *wr0 = (const WT *)(W + (size_t)r0 * row_bytes);
    const WT *wr1 = (const WT *)(W + (size_t)(two ? r0 + 1 : r0) * row_bytes);
    float s0[MM_NT], s1[MM_NT];
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        s0[t] = s1[t] = 0.0f;
    int c = lane * 8;
    for (; c + 256 < cols; c += 512) {
        float a0[8], a1[8], b0[8], b1[8];
        load8(wr0 + c, a0);
        load8(wr0 + c + 256, a1);
        load8(wr1 + c, b0);
        load8(wr1 + c + 256, b1);
#pragma unroll
        for (int t = 0; t < MM_NT; t++) {
            if (t < nt) {
                float xv[8], xv2[8];
                load8(x + (size_t)t * cols + c, xv);
                load8(x + (size_t)t * cols + c + 256, xv2);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    s0[t] = fmaf(a0[i], xv[i], s0[t]);
                    s1[t] = fmaf(b0[i], xv[i], s1[t]);
                }
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    s0[t] = fmaf(a1[i], xv2[i], s0[t]);
                    s1[t] = fmaf(b1[i], xv2[i], s1[t]);
                }
            }
        }
    }
    if (c < cols) {
        float a0[8], b0[8];
        load8(wr0 + c, a0);
        load8(wr1 + c, b0);
#pragma unroll
        for (int t = 0; t < MM_NT; t++) {
            if (t < nt) {
                float xv[8];
                load8(x + (size_t)t * cols + c, xv);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    s0[t] = fmaf(a0[i], xv[i], s0[t]);
                    s1[t] = fmaf(b0[i], xv[i], s1[t]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            float v0 = warp_sum(s0[t]), v1 = warp_sum(s1[t]);
            if (lane == 0) {
                mm_put(y + (size_t)t * rows + r0, v0, add);
                if (two)
                    mm_put(y + (size_t)t * rows + r0 + 1, v1, add);
            }
        }
    }
}

/* Any type, any alignment: one element per lane per step (the slow, always-right path). */
__global__ void __launch_bounds__(MM_WARPS * 32)
gemv_any_kernel(uint32_t type, const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
                const float *__restrict__ x, int nt, float *__restrict__ y, bool add)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const uint8_t *wr = W + (size_t)r * row_bytes;
    float s[MM_NT];
    mm_sums_clear(s);
    for (int c = lane; c < cols; c += 32) {
        float w = row_elem(type, wr, c);
#pragma unroll
        for (int t = 0; t < MM_NT; t++)
            if (t < nt)
                s[t] = fmaf(w, x[(size_t)t * cols + c], s[t]);
    }
    mm_sums_store(s, nt, y, rows, r, add, lane);
}

/* ---- prefill: tensor cores ---- */

#define GM_BM 64  /* tokens per CTA */
#define GM_BN 64  /* weight rows per CTA */
#define GM_BK 32
#define GM_PAD 8  /* keeps fragment rows 16-byte aligned and off one bank */

__device__ __forceinline__ __half to_t(float v, __half *) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 to_t(float v, __nv_bfloat16 *) { return __float2bfloat16_rn(v); }

/* y (n, rows) = x (n, cols) . W(rows, cols)^T. 4 warps, each a 32x32 tile of 2x2 16x16
 * fragments. W rows staged as Bs[row][k] are exactly a col-major K x N matrix_b. */
template <typename T>
__global__ void __launch_bounds__(128)
wmma_gemm_kernel(const T *__restrict__ W, size_t ldw, int rows, int cols, const float *__restrict__ x,
                 int n, float *__restrict__ y)
{
    using namespace nvcuda;
    __shared__ __align__(128) T As[GM_BM][GM_BK + GM_PAD];
    __shared__ __align__(128) T Bs[GM_BN][GM_BK + GM_PAD];
    __shared__ __align__(128) float Cs[GM_BM][GM_BN + 4];
    int tid = threadIdx.x, warp = tid >> 5;
    int m0 = blockIdx.y * GM_BM, n0 = blockIdx.x * GM_BN;
    int wm = warp >> 1, wn = warp & 1;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < cols; k0 += GM_BK) {
        for (int i = tid; i < GM_BM * GM_BK; i += 128) {
            int r = i / GM_BK, k = i % GM_BK, m = m0 + r, kk = k0 + k;
            As[r][k] = to_t(m < n && kk < cols ? x[(size_t)m * cols + kk] : 0.0f, (T *)0);
        }
        for (int i = tid; i < GM_BN * GM_BK; i += 128) {
            int r = i / GM_BK, k = i % GM_BK, rr = n0 + r, kk = k0 + k;
            Bs[r][k] = rr < rows && kk < cols ? W[(size_t)rr * ldw + kk] : to_t(0.0f, (T *)0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(a[i], &As[wm * 32 + i * 16][kk], GM_BK + GM_PAD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(b[j], &Bs[wn * 32 + j * 16][kk], GM_BK + GM_PAD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], GM_BN + 4,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < GM_BM * GM_BN; i += 128) {
        int r = i / GM_BN, cc = i % GM_BN, m = m0 + r, rr = n0 + cc;
        if (m < n && rr < rows)
            y[(size_t)m * rows + rr] = Cs[r][cc];
    }
}


/* The same product with 16-byte loads, register prefetch of the next K tile and double-
 * buffered shared memory (one barrier per tile); 64 tokens x 32 rows per CTA so that a
 * 64-token prefill chunk still spreads over the SMs. Needs cols % 8 == 0 and W, ldw, x
 * 16-byte aligned. Each of the 4 warps owns 16 tokens x 32 rows (1 x 2 fragments). */
#define GV_BN 32
template <typename T>
__global__ void __launch_bounds__(128)
wmma_gemm_vec_kernel(const T *__restrict__ W, size_t ldw, int rows, int cols, const float *__restrict__ x,
                     int n, float *__restrict__ y)
{
    using namespace nvcuda;
    __shared__ __align__(128) T As[2][GM_BM][GM_BK + GM_PAD];
    __shared__ __align__(128) T Bs[2][GV_BN][GM_BK + GM_PAD];
    __shared__ __align__(128) float Cs[GM_BM][GV_BN + 4];
    int tid = threadIdx.x, warp = tid >> 5;
    int m0 = blockIdx.y * GM_BM, n0 = blockIdx.x * GV_BN;
    /* this thread's 8-element chunks: two of the 64x32 x tile, one of the 32x32 W tile */
    int ar0 = tid >> 2, ar1 = (tid + 128) >> 2, ac = (tid & 3) * 8;
    int br = tid >> 2, bc = (tid & 3) * 8;
    float4 a[2][2];
    uint4 b;
    auto load = [&](int k0) {
        int kk = k0 + ac;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int m = m0 + (i ? ar1 : ar0);
            if (m < n && kk < cols) {
                const float4 *p = (const float4 *)(x + (size_t)m * cols + kk);
                a[i][0] = __ldg(p);
                a[i][1] = __ldg(p + 1);
            } else {
                a[i][0] = a[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        int rr = n0 + br;
        kk = k0 + bc;
        b = rr < rows && kk < cols ? __ldg((const uint4 *)(W + (size_t)rr * ldw + kk)) : make_uint4(0, 0, 0, 0);
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            T v[8];
            v[0] = to_t(a[i][0].x, (T *)0); v[1] = to_t(a[i][0].y, (T *)0);
            v[2] = to_t(a[i][0].z, (T *)0); v[3] = to_t(a[i][0].w, (T *)0);
            v[4] = to_t(a[i][1].x, (T *)0); v[5] = to_t(a[i][1].y, (T *)0);
            v[6] = to_t(a[i][1].z, (T *)0); v[7] = to_t(a[i][1].w, (T *)0);
            *(uint4 *)&As[buf][i ? ar1 : ar0][ac] = *(const uint4 *)v;
        }
        *(uint4 *)&Bs[buf][br][bc] = b;
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    load(0);
    store(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < cols; k0 += GM_BK) {
        bool more = k0 + GM_BK < cols;
        if (more)
            load(k0 + GM_BK); /* in flight during the MMAs below */
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
            wmma::load_matrix_sync(fa, &As[buf][warp * 16][kk], GM_BK + GM_PAD);
            wmma::load_matrix_sync(fb[0], &Bs[buf][0][kk], GM_BK + GM_PAD);
            wmma::load_matrix_sync(fb[1], &Bs[buf][16][kk], GM_BK + GM_PAD);
            wmma::mma_sync(acc[0], fa, fb[0], acc[0]);
            wmma::mma_sync(acc[1], fa, fb[1], acc[1]);
        }
        if (more)
            store(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }
    wmma::store_matrix_sync(&Cs[warp * 16][0], acc[0], GV_BN + 4, wmma::mem_row_major);
    wmma::store_matrix_sync(&Cs[warp * 16][16], acc[1], GV_BN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < GM_BM * GV_BN; i += 128) {
        int r = i / GV_BN, cc = i % GV_BN, m = m0 + r, rr = n0 + cc;
        if (m < n && rr < rows)
            y[(size_t)m * rows + rr] = Cs[r][cc];
    }
}

/* ---- dispatch ---- */

/* x (n, cols) quantised into the backend's scratch: *xq (n, cols) int8, *xd (n, cols / 32)
 * scales, and pbytes more after them for split-K partials (*part, NULL when pbytes is 0).
 * perm: each block's words in the tensor-core fragment order (quantize_q8_kernel<true>).
 * false: no scratch or the launch failed (the error is kept in c). cu_matmul_scratch
 * (vision_ops.cu) sizes the same layout. */
static bool quantize_to_scratch(struct cuda_ctx *c, const float *x, int n, int cols, size_t pbytes, bool perm,
                                int8_t **xq, float **xd, float **part)
{
    int nb = cols / QK, nblocks = n * nb;
    size_t qbytes = ((size_t)n * cols + 255) & ~(size_t)255;
    size_t dbytes = ((size_t)nblocks * sizeof(float) + 255) & ~(size_t)255;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + dbytes + pbytes);
    if (!ws)
        return false;
    *xq = (int8_t *)ws;
    *xd = (float *)(ws + qbytes);
    *part = pbytes ? (float *)(ws + qbytes + dbytes) : NULL;
    if (perm)
        quantize_q8_kernel<true><<<(nblocks + 7) / 8, 256, 0, c->st>>>(x, nblocks, *xq, *xd);
    else
        quantize_q8_kernel<false><<<(nblocks + 7) / 8, 256, 0, c->st>>>(x, nblocks, *xq, *xd);
    return CU_LAUNCH(c, "quantize_q8_kernel");
}

/* matmul_add where the product is written through tiles (tensor cores): into a buffer of its
 * own (the product uses the scratch), then one add. */
static void matmul_add_via_buf(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n)
{
    size_t len = (size_t)n * (w->ne[1] ? w->ne[1] : 1);
    float *t = (float *)cuda_sum_buf(c, len * sizeof(float));
    if (!t)
        return;
    cuda_matmul(c, w, x, t, n, false);
    if (c->err)
        return;
    size_t g = (len + 255) / 256;
    add_kernel<<<(unsigned)(g < 65536 ? g : 65536), 256, 0, c->st>>>(y, t, len);
    CU_LAUNCH(c, "add_kernel");
}

void cuda_matmul(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n, bool add)
{
    if (c->err || n <= 0)
        return;
    int cols = (int)w->ne[0], rows = (int)w->ne[1] ? (int)w->ne[1] : 1;
    const uint8_t *W = (const uint8_t *)w->data;
    dim3 rgrid((unsigned)((rows + MM_WARPS - 1) / MM_WARPS)), rblock(MM_WARPS * 32);
    uint32_t type = w->type;

    if (cuda_matmul_kq(c, w, x, y, n, add)) /* q4_K / q5_K / q6_K (kquant.cu) */
        return;
    if ((type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0) && cols % QK == 0) {
        if (cuda_matmul_qonce(c, 1, &w, x, &y, n, add, NULL, 0.0f, NULL)) /* TIDE_DECODE_QONCE */
            return;
        int nb = cols / QK;
        bool pairs = nb % 2 == 0 && (((uintptr_t)W | w->row_bytes) & 3) == 0;
        int nt0 = n < MM_NT ? n : MM_NT;
        size_t smem = (((size_t)nt0 * cols + 15) & ~(size_t)15) + (size_t)nt0 * nb * sizeof(float);
        /* in-CTA quantisation pays for decode (n <= 2: one launch instead of two) but each
         * CTA redoing 8 tokens' worth cost more than the launch it saves (measured: n = 8,
         * 2048 x 4096 q8_0, 36 us fused vs 21 us in two kernels) */
        if (n <= 2 && smem <= 48 * 1024) {
            /* more rows per CTA on big matrices amortise the in-CTA quantisation of x */
            int rpw = rows >= 32768 ? 4 : rows >= 8192 ? 2 : decode_rpw(1);
            dim3 grid((unsigned)((rows + MMQ_WARPS * rpw - 1) / (MMQ_WARPS * rpw)));
            for (int t0 = 0; t0 < n; t0 += MM_NT) {
                int nt = n - t0 < MM_NT ? n - t0 : MM_NT;
                size_t sm = (((size_t)nt * cols + 15) & ~(size_t)15) + (size_t)nt * nb * sizeof(float);
                if (type == GGML_TYPE_Q8_0)
                    mmvq_fused_kernel<8><<<grid, MMQ_WARPS * 32, sm, c->st>>>(W, w->row_bytes, rows, cols, pairs,
                                                                             x + (size_t)t0 * cols, nt,
                                                                             y + (size_t)t0 * rows, rpw, add);
                else
                    mmvq_fused_kernel<2><<<grid, MMQ_WARPS * 32, sm, c->st>>>(W, w->row_bytes, rows, cols, pairs,
                                                                             x + (size_t)t0 * cols, nt,
                                                                             y + (size_t)t0 * rows, rpw, add);
                if (!CU_LAUNCH(c, "mmvq_fused_kernel"))
                    return;
            }
            return;
        }
        /* prefill sizes: the tensor-core kernel, where its whole-stage copies fit the shape
         * (K a multiple of 128 and 8-byte aligned rows: every common model shape) */
        bool mma = n >= cuda_mmq_min_n() && cuda_mmq_ok(W, w->row_bytes, nb);
        if (mma && add) {
            matmul_add_via_buf(c, w, x, y, n);
            return;
        }
        int8_t *xq;
        float *xd, *part;
        if (mma) {
            if (quantize_to_scratch(c, x, n, cols, cuda_mmq_scratch(c, rows, nb, n), true, &xq, &xd, &part))
                cuda_mmq_mma(c, type, W, w->row_bytes, rows, nb, xq, xd, n, y, part);
            return;
        }
        if (!quantize_to_scratch(c, x, n, cols, 0, false, &xq, &xd, &part))
            return;
        for (int t0 = 0; t0 < n; t0 += MM_NT) {
            int nt = n - t0 < MM_NT ? n - t0 : MM_NT;
            if (type == GGML_TYPE_Q8_0)
                mmvq_kernel<8><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, nb, pairs, xq + (size_t)t0 * cols,
                                                             xd + (size_t)t0 * nb, nt, y + (size_t)t0 * rows, add);
            else
                mmvq_kernel<2><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, nb, pairs, xq + (size_t)t0 * cols,
                                                             xd + (size_t)t0 * nb, nt, y + (size_t)t0 * rows, add);
            if (!CU_LAUNCH(c, "mmvq_kernel"))
                return;
        }
        return;
    }

    bool floaty = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    size_t esz = type == GGML_TYPE_F32 ? 4 : 2;
    if (floaty && n > MM_NT && type != GGML_TYPE_F32 && w->row_bytes % esz == 0) {
        /* TIDE_F16_MMA=1: the big-tile kernel (gemm_f16_mma.cu) from n = 64; it does the add */
        if (cuda_f16_mma(c, type, W, w->row_bytes / esz, rows, cols, x, n, y, add))
            return;
        if (add) {
            matmul_add_via_buf(c, w, x, y, n);
            return;
        }
        size_t ldw = w->row_bytes / esz;
        if (cols % 8 == 0 && (((uintptr_t)W | (uintptr_t)x | w->row_bytes) & 15) == 0) {
            dim3 grid((unsigned)((rows + GV_BN - 1) / GV_BN), (unsigned)((n + GM_BM - 1) / GM_BM));
            if (type == GGML_TYPE_F16)
                wmma_gemm_vec_kernel<__half><<<grid, 128, 0, c->st>>>((const __half *)W, ldw, rows, cols, x, n, y);
            else
                wmma_gemm_vec_kernel<__nv_bfloat16><<<grid, 128, 0, c->st>>>((const __nv_bfloat16 *)W, ldw, rows,
                                                                             cols, x, n, y);
            CU_LAUNCH(c, "wmma_gemm_vec_kernel");
            return;
        }
        dim3 grid((unsigned)((rows + GM_BN - 1) / GM_BN), (unsigned)((n + GM_BM - 1) / GM_BM));
        if (type == GGML_TYPE_F16)
            wmma_gemm_kernel<__half><<<grid, 128, 0, c->st>>>((const __half *)W, ldw, rows, cols, x, n, y);
        else
            wmma_gemm_kernel<__nv_bfloat16><<<grid, 128, 0, c->st>>>((const __nv_bfloat16 *)W, ldw, rows,
                                                                     cols, x, n, y);
        CU_LAUNCH(c, "wmma_gemm_kernel");
        return;
    }
    if (type == GGML_TYPE_F32 && n > MM_NT && w->row_bytes % 4 == 0) { /* prefill: one tiled launch */
        cuda_sgemm(c, (const float *)W, w->row_bytes / 4, rows, cols, x, n, y, add);
        return;
    }
    bool vec = floaty && cols % 8 == 0 && (((uintptr_t)W | (uintptr_t)x | w->row_bytes) & 15) == 0;
    dim3 vgrid((unsigned)((rows + MM_WARPS * GV_ROWS - 1) / (MM_WARPS * GV_ROWS)));
    for (int t0 = 0; t0 < n; t0 += MM_NT) {
        int nt = n - t0 < MM_NT ? n - t0 : MM_NT;
        const float *xt = x + (size_t)t0 * cols;
        float *yt = y + (size_t)t0 * rows;
        if (vec && type == GGML_TYPE_F32)
            gemv_kernel<float><<<vgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, cols, xt, nt, yt, add);
        else if (vec && type == GGML_TYPE_F16)
            gemv_kernel<__half><<<vgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, cols, xt, nt, yt, add);
        else if (vec && type == GGML_TYPE_BF16)
            gemv_kernel<__nv_bfloat16><<<vgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, cols, xt, nt, yt, add);
        else
            gemv_any_kernel<<<rgrid, rblock, 0, c->st>>>(type, W, w->row_bytes, rows, cols, xt, nt, yt, add);
        if (!CU_LAUNCH(c, "gemv_kernel"))
            return;
    }
}

/* Prefill form of matmul3 (q/k/v of a chunk): x quantised once for the three tensor-core
 * products instead of once each; each y[m] the bits of its own cuda_matmul (same quantised
 * x, same kernel and plan). false: not this form (nothing queued). */
static bool matmul3_mma(struct cuda_ctx *c, const struct tensor *const w[3], const float *x, float *const y[3],
                        int n)
{
    uint32_t type = w[0]->type;
    int cols = (int)w[0]->ne[0], nb = cols / QK;
    if ((type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q4_0) || cols % QK || n < cuda_mmq_min_n() || n <= 2)
        return false;
    size_t pbytes = 0;
    for (int m = 0; m < 3; m++) {
        if (w[m]->type != type || (int)w[m]->ne[0] != cols || !cuda_mmq_ok(w[m]->data, w[m]->row_bytes, nb))
            return false;
        size_t p = cuda_mmq_scratch(c, (int)w[m]->ne[1], nb, n);
        pbytes = p > pbytes ? p : pbytes;
    }
    int8_t *xq;
    float *xd, *part;
    if (!quantize_to_scratch(c, x, n, cols, pbytes, true, &xq, &xd, &part))
        return true; /* the error is kept in c */
    /* the products run in stream order, so they can share one split-K buffer */
    for (int m = 0; m < 3; m++)
        if (!cuda_mmq_mma(c, type, (const uint8_t *)w[m]->data, w[m]->row_bytes, (int)w[m]->ne[1], nb, xq, xd, n,
                          y[m], part))
            break;
    return true;
}

/* backend_i.matmul3: y[m] = w[m] x for m = 0..2. Decode (n <= 2) with q8_0 / q4_0 weights of
 * one type and width runs in one launch (mmvq_fused3_kernel), the rmsnorm included; anything
 * else as three products, and with a norm not at all (false: the caller norms first). Either
 * way each output has the bits of its own cuda_matmul. */
bool cuda_matmul3(struct cuda_ctx *c, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                  const struct tensor *norm, float eps, float *xn)
{
    if (c->err || n <= 0)
        return true;
    if (cuda_matmul_qonce(c, 3, w, x, y, n, false, norm, eps, xn)) /* TIDE_DECODE_QONCE: the same bits */
        return true;
    uint32_t type = w[0]->type;
    int cols = (int)w[0]->ne[0], nb = cols / QK;
    bool one = n <= 2 && (type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0) && cols % QK == 0;
    size_t sm = (((size_t)n * cols + 15) & ~(size_t)15) + (size_t)n * nb * sizeof(float);
    one = one && sm <= 48 * 1024 && (!norm || norm_block(cols) == MMQ_WARPS * 32);
    mm3_args a;
    a.start[0] = 0;
    a.nw = norm ? (const uint8_t *)norm->data : NULL;
    a.ntype = norm ? norm->type : 0;
    a.eps = eps;
    a.xn = xn;
    a.rpw = decode_rpw(2);
    for (int m = 0; m < 3 && one; m++) {
        int rows = (int)w[m]->ne[1];
        one = w[m]->type == type && (int)w[m]->ne[0] == cols && rows > 0;
        a.W[m] = (const uint8_t *)w[m]->data;
        a.row_bytes[m] = w[m]->row_bytes;
        a.y[m] = y[m];
        a.rows[m] = rows;
        a.pairs[m] = nb % 2 == 0 && (((uintptr_t)a.W[m] | a.row_bytes[m]) & 3) == 0;
        a.start[m + 1] = a.start[m] + (rows + MMQ_WARPS * a.rpw - 1) / (MMQ_WARPS * a.rpw);
    }
    if (!one && norm)
        return false;
    if (!one && matmul3_mma(c, w, x, y, n))
        return true;
    if (!one) {
        for (int m = 0; m < 3; m++)
            cuda_matmul(c, w[m], x, y[m], n);
        return true;
    }
    if (type == GGML_TYPE_Q8_0)
        mmvq_fused3_kernel<8><<<a.start[3], MMQ_WARPS * 32, sm, c->st>>>(a, cols, x, n);
    else
        mmvq_fused3_kernel<2><<<a.start[3], MMQ_WARPS * 32, sm, c->st>>>(a, cols, x, n);
    CU_LAUNCH(c, "mmvq_fused3_kernel");
    return true;
}
