/* matmul.cu - y(rows, n) = W x(cols, n) for f32, f16, bf16, q8_0 and q4_0 weights.
 *
 * Decode (and the few-token products of MoE experts) is bound by reading W once, so those
 * kernels give one warp to one weight row, dequantise in registers and dot the row with up
 * to 8 input vectors while it is loaded (a chunk of 8 tokens per launch beyond that):
 *   - f32/f16/bf16: 16-byte loads of W (8 halves, or 2x4 floats) per lane, f32 FMA;
 *   - q8_0/q4_0: x is first quantised to int8 blocks with an f16-rounded scale, exactly as the
 *     CPU backend does, and rows are dp4a integer dot products per 32-block, so the CUDA
 *     result matches the CPU one up to float summation order.
 * Prefill with f16/bf16 weights (n > 8) runs a tensor-core (WMMA, f32 accumulate) tiled GEMM
 * that converts x to the weight's type while staging it in shared memory. cuBLAS is not
 * used: the toolkit here has no static cuBLAS and the shared one is ~600 MB, which the
 * "one binary that starts without a driver" rule and the device tool's carry limit exclude. */
#include "engine/cuda/common.cuh"

#include <mma.h>

#define MM_WARPS 4   /* rows per CTA in the row-per-warp kernels */
#define MM_NT 8      /* tokens per launch of the row-per-warp kernels */

/* ---- x -> int8 blocks (for q8_0 / q4_0 weights) ---- */

/* xq (n, cols) int8, xd (n, cols/32) f32 scale already rounded through f16. One warp per
 * block of 32: d = amax/127, q = round-to-nearest-even(v / d), as backend_cpu.c does. */
__global__ void quantize_q8_kernel(const float *__restrict__ x, int nblocks, int8_t *__restrict__ xq,
                                   float *__restrict__ xd)
{
    int gb = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (gb >= nblocks)
        return;
    float v = x[(size_t)gb * QK + lane];
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    xq[(size_t)gb * QK + lane] = (int8_t)__float2int_rn(v * id);
    if (lane == 0)
        xd[gb] = __half2float(__float2half_rn(d));
}

/* ---- quantised rows: dp4a ---- */

/* QT = 8 (q8_0, 34-byte blocks) or 2 (q4_0, 18-byte blocks). Blocks are only 2-byte aligned
 * (34 = 2 mod 4), so each lane assembles its 8 ints from 16-bit loads; a warp still reads
 * 32 consecutive blocks, i.e. one contiguous stretch of the row. */
template <int QT>
__global__ void __launch_bounds__(MM_WARPS * 32)
mmvq_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb,
            const int8_t *__restrict__ xq, const float *__restrict__ xd, int nt,
            float *__restrict__ y)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const uint8_t *wr = W + (size_t)r * row_bytes;
    float s[MM_NT];
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        s[t] = 0.0f;
#pragma unroll 2
    for (int b = lane; b < nb; b += 32) {
        const uint16_t *bp = (const uint16_t *)(wr + (size_t)b * BLK);
        float dw = f16_bits_to_f32(__ldg(bp));
        int wq[8];
        if (QT == 8) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                wq[i] = (int)((uint32_t)__ldg(bp + 1 + 2 * i) | ((uint32_t)__ldg(bp + 2 + 2 * i) << 16));
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t u = (uint32_t)__ldg(bp + 1 + 2 * i) | ((uint32_t)__ldg(bp + 2 + 2 * i) << 16);
                /* byte j holds element j (low nibble) and j + 16 (high), both offset by 8 */
                wq[i] = (int)__vsub4(u & 0x0F0F0F0Fu, 0x08080808u);
                wq[4 + i] = (int)__vsub4((u >> 4) & 0x0F0F0F0Fu, 0x08080808u);
            }
        }
#pragma unroll
        for (int t = 0; t < MM_NT; t++) {
            if (t < nt) {
                const int4 *xp = (const int4 *)(xq + ((size_t)t * nb + b) * QK);
                int4 a = __ldg(xp), c = __ldg(xp + 1);
                int acc = __dp4a(wq[0], a.x, 0);
                acc = __dp4a(wq[1], a.y, acc);
                acc = __dp4a(wq[2], a.z, acc);
                acc = __dp4a(wq[3], a.w, acc);
                acc = __dp4a(wq[4], c.x, acc);
                acc = __dp4a(wq[5], c.y, acc);
                acc = __dp4a(wq[6], c.z, acc);
                acc = __dp4a(wq[7], c.w, acc);
                s[t] += (dw * __ldg(xd + (size_t)t * nb + b)) * (float)acc;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            float v = warp_sum(s[t]);
            if (lane == 0)
                y[(size_t)t * rows + r] = v;
        }
    }
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

/* Needs cols % 8 == 0 and W, row_bytes, x 16-byte aligned (checked by the caller). */
template <typename WT>
__global__ void __launch_bounds__(MM_WARPS * 32)
gemv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
            const float *__restrict__ x, int nt, float *__restrict__ y)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const WT *wr = (const WT *)(W + (size_t)r * row_bytes);
    float s[MM_NT];
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        s[t] = 0.0f;
#pragma unroll 2
    for (int c = lane * 8; c < cols; c += 256) {
        float w[8];
        load8(wr + c, w);
#pragma unroll
        for (int t = 0; t < MM_NT; t++) {
            if (t < nt) {
                float xv[8];
                load8(x + (size_t)t * cols + c, xv);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    s[t] = fmaf(w[i], xv[i], s[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            float v = warp_sum(s[t]);
            if (lane == 0)
                y[(size_t)t * rows + r] = v;
        }
    }
}

/* Any type, any alignment: one element per lane per step (the slow, always-right path). */
__global__ void __launch_bounds__(MM_WARPS * 32)
gemv_any_kernel(uint32_t type, const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
                const float *__restrict__ x, int nt, float *__restrict__ y)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const uint8_t *wr = W + (size_t)r * row_bytes;
    float s[MM_NT];
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        s[t] = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        float w = row_elem(type, wr, c);
#pragma unroll
        for (int t = 0; t < MM_NT; t++)
            if (t < nt)
                s[t] = fmaf(w, x[(size_t)t * cols + c], s[t]);
    }
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            float v = warp_sum(s[t]);
            if (lane == 0)
                y[(size_t)t * rows + r] = v;
        }
    }
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

/* ---- dispatch ---- */

void cuda_matmul(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n)
{
    if (c->err || n <= 0)
        return;
    int cols = (int)w->ne[0], rows = (int)w->ne[1] ? (int)w->ne[1] : 1;
    const uint8_t *W = (const uint8_t *)w->data;
    dim3 rgrid((unsigned)((rows + MM_WARPS - 1) / MM_WARPS)), rblock(MM_WARPS * 32);
    uint32_t type = w->type;

    if ((type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0) && cols % QK == 0) {
        int nb = cols / QK;
        size_t qbytes = ((size_t)n * cols + 255) & ~(size_t)255;
        uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + (size_t)n * nb * sizeof(float));
        if (!ws)
            return;
        int8_t *xq = (int8_t *)ws;                 /* (n, cols) */
        float *xd = (float *)(ws + qbytes);         /* (n, nb) */
        int nblocks = n * nb;
        quantize_q8_kernel<<<(nblocks + 7) / 8, 256, 0, c->st>>>(x, nblocks, xq, xd);
        if (!CU_LAUNCH(c, "quantize_q8_kernel"))
            return;
        for (int t0 = 0; t0 < n; t0 += MM_NT) {
            int nt = n - t0 < MM_NT ? n - t0 : MM_NT;
            if (type == GGML_TYPE_Q8_0)
                mmvq_kernel<8><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, nb, xq + (size_t)t0 * cols,
                                                             xd + (size_t)t0 * nb, nt, y + (size_t)t0 * rows);
            else
                mmvq_kernel<2><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, nb, xq + (size_t)t0 * cols,
                                                             xd + (size_t)t0 * nb, nt, y + (size_t)t0 * rows);
            if (!CU_LAUNCH(c, "mmvq_kernel"))
                return;
        }
        return;
    }

    bool floaty = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    size_t esz = type == GGML_TYPE_F32 ? 4 : 2;
    if (floaty && n > MM_NT && type != GGML_TYPE_F32 && w->row_bytes % esz == 0) {
        dim3 grid((unsigned)((rows + GM_BN - 1) / GM_BN), (unsigned)((n + GM_BM - 1) / GM_BM));
        size_t ldw = w->row_bytes / esz;
        if (type == GGML_TYPE_F16)
            wmma_gemm_kernel<__half><<<grid, 128, 0, c->st>>>((const __half *)W, ldw, rows, cols, x, n, y);
        else
            wmma_gemm_kernel<__nv_bfloat16><<<grid, 128, 0, c->st>>>((const __nv_bfloat16 *)W, ldw, rows,
                                                                     cols, x, n, y);
        CU_LAUNCH(c, "wmma_gemm_kernel");
        return;
    }
    bool vec = floaty && cols % 8 == 0 && (((uintptr_t)W | (uintptr_t)x | w->row_bytes) & 15) == 0;
    for (int t0 = 0; t0 < n; t0 += MM_NT) {
        int nt = n - t0 < MM_NT ? n - t0 : MM_NT;
        const float *xt = x + (size_t)t0 * cols;
        float *yt = y + (size_t)t0 * rows;
        if (vec && type == GGML_TYPE_F32)
            gemv_kernel<float><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, cols, xt, nt, yt);
        else if (vec && type == GGML_TYPE_F16)
            gemv_kernel<__half><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, cols, xt, nt, yt);
        else if (vec && type == GGML_TYPE_BF16)
            gemv_kernel<__nv_bfloat16><<<rgrid, rblock, 0, c->st>>>(W, w->row_bytes, rows, cols, xt, nt, yt);
        else
            gemv_any_kernel<<<rgrid, rblock, 0, c->st>>>(type, W, w->row_bytes, rows, cols, xt, nt, yt);
        if (!CU_LAUNCH(c, "gemv_kernel"))
            return;
    }
}
