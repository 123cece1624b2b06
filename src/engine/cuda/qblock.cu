/* qblock.cu - y(rows, n) = W x for the weight types whose values come in 32-value blocks of
 * one scale: q5_0, q5_1, iq4_xs (a 256-value super-block of eight such blocks) and MXFP4
 * (gpt-oss's experts). kquant.cu's cuda_matmul_kq hands these types over, so cuda_matmul
 * reaches them without a branch of its own.
 *
 * Each block is unpacked to 32 int8 values q and a scale d (and q5_1's offset m), w = d q + m,
 * and dotted with x quantised to int8 blocks of 32 (quantize_q8_kernel's format) by dp4a:
 *   s += xd * (d * (q . xq) + m * sum(xq))
 * so, as for q8_0 and the k-quants, the only rounding besides the f32 sums is x's int8
 * quantisation. The values: q5_0 q - 16 with its fifth bit; q5_1 q in 0..31; iq4_xs and MXFP4
 * a nibble through a fixed table (iq4nl, and MXFP4's e2m1 codes doubled so that they are
 * integers, its scale halved to match: common.cuh qb_mxfp4_scale).
 *   - decode (n <= 2): one launch; each CTA quantises x into shared memory, a warp a row;
 *   - few tokens (n <= MM_NT, or W too big to widen): x quantised once into the scratch;
 *   - prefill (n > MM_NT): W widened to f16 into the scratch, then matmul.cu's tensor-core GEMM
 *     (as kquant.cu does: the int8 tensor-core kernel takes q8_0/q4_0 tiles only).
 * Loads follow each layout's alignment: q5_1 and iq4_xs 4-byte words, q5_0 (22-byte blocks)
 * half-words, MXFP4 (17) bytes; a row not aligned so returns false (the element-wise kernel). */
#include "engine/cuda/mmq.cuh"

#define QB_WARPS 8                      /* rows a CTA (one a warp) */
#define QB_F16_MAX ((size_t)512 << 20)  /* largest widened W (bytes of f16) */

static __host__ __device__ constexpr bool qb_type(uint32_t t) { return t == 6 || t == 7 || t == 23 || t == 39; }

/* The nibble table of the type (zeros for q5_0/q5_1, which do not use one), for shared memory:
 * a lane's lookups then hit 4 banks without serialising as constant memory would. */
template <int T>
__device__ __forceinline__ void qb_load_table(int8_t *tbl)
{
    if (threadIdx.x < 16)
        tbl[threadIdx.x] = T == 23 ? qb_iq4nl[threadIdx.x] : T == 39 ? qb_mxfp4[threadIdx.x] : 0;
}

__device__ __forceinline__ uint32_t qb_ld16(const uint8_t *p) { return (uint32_t)__ldg((const uint16_t *)p); }

/* 4 bits (b, bit k for value k of a word) to the fifth bit (16) of 4 bytes */
__device__ __forceinline__ uint32_t qb_bits5(uint32_t b)
{
    return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << 4;
}

/* Four bytes of nibble indices (sh 0: the low nibbles, 4: the high) through the table */
__device__ __forceinline__ int qb_lookup(uint32_t u, int sh, const int8_t *tbl)
{
    uint32_t r = 0;
#pragma unroll
    for (int e = 0; e < 4; e++)
        r |= (uint32_t)(uint8_t)tbl[(u >> (8 * e + sh)) & 15u] << (8 * e);
    return (int)r;
}

/* Block b (32 values) of row wr: q[k] holds values 4k..4k+3 as int8; w = d * q + m. */
template <int T>
__device__ __forceinline__ void qb_load(const uint8_t *__restrict__ wr, int b, const int8_t *tbl, int q[8], float &d,
                                        float &m)
{
    uint32_t u[4], qh = 0;
    m = 0.0f;
    if (T == 7) { /* q5_1: 24 bytes, f16 d, f16 m, u32 qh, 16 nibble bytes */
        const uint32_t *p = (const uint32_t *)(wr + (size_t)b * 24);
        uint32_t dm = __ldg(p);
        d = f16_bits_to_f32((uint16_t)dm);
        m = f16_bits_to_f32((uint16_t)(dm >> 16));
        qh = __ldg(p + 1);
#pragma unroll
        for (int k = 0; k < 4; k++)
            u[k] = __ldg(p + 2 + k);
    } else if (T == 6) { /* q5_0: 22 bytes, f16 d, u32 qh, 16 nibble bytes (2-byte aligned) */
        const uint8_t *p = wr + (size_t)b * 22;
        d = f16_bits_to_f32((uint16_t)qb_ld16(p));
        qh = qb_ld16(p + 2) | qb_ld16(p + 4) << 16;
#pragma unroll
        for (int k = 0; k < 4; k++)
            u[k] = qb_ld16(p + 6 + 4 * k) | qb_ld16(p + 8 + 4 * k) << 16;
    } else if (T == 23) { /* iq4_xs: sub-block b & 7 of super-block b >> 3 */
        const uint8_t *p = wr + (size_t)(b >> 3) * 136;
        int j = b & 7;
        uint32_t h = __ldg((const uint32_t *)p), l = __ldg((const uint32_t *)(p + 4));
        int ls = (int)(((l >> (4 * j)) & 15u) | (((h >> (16 + 2 * j)) & 3u) << 4)) - 32;
        d = f16_bits_to_f32((uint16_t)h) * (float)ls;
#pragma unroll
        for (int k = 0; k < 4; k++)
            u[k] = __ldg((const uint32_t *)(p + 8 + 16 * j) + k);
    } else { /* MXFP4: 17 bytes, e8m0 exponent, 16 nibble bytes */
        const uint8_t *p = wr + (size_t)b * 17;
        d = qb_mxfp4_scale(__ldg(p));
#pragma unroll
        for (int k = 0; k < 4; k++)
            u[k] = (uint32_t)__ldg(p + 1 + 4 * k) | (uint32_t)__ldg(p + 2 + 4 * k) << 8 |
                   (uint32_t)__ldg(p + 3 + 4 * k) << 16 | (uint32_t)__ldg(p + 4 + 4 * k) << 24;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (T == 6 || T == 7) {
            uint32_t lo = (u[k] & 0x0F0F0F0Fu) | qb_bits5((qh >> (4 * k)) & 15u);
            uint32_t hi = ((u[k] >> 4) & 0x0F0F0F0Fu) | qb_bits5((qh >> (16 + 4 * k)) & 15u);
            q[k] = (int)(T == 6 ? __vsub4(lo, 0x10101010u) : lo);
            q[4 + k] = (int)(T == 6 ? __vsub4(hi, 0x10101010u) : hi);
        } else {
            q[k] = qb_lookup(u[k], 0, tbl);
            q[4 + k] = qb_lookup(u[k], 4, tbl);
        }
    }
}

/* s[t] += block b of the row . x[t], nt vectors (x blocks in shared memory or global). */
template <int T, bool SMEM>
__device__ __forceinline__ void qb_dot(const int q[8], float d, float m, const int8_t *xq, const float *xd, int nb,
                                       int b, int nt, float s[MM_NT])
{
#pragma unroll
    for (int t = 0; t < MM_NT; t++) {
        if (t < nt) {
            const int4 *xp = (const int4 *)(xq + ((size_t)t * nb + b) * QK);
            int4 a = SMEM ? xp[0] : __ldg(xp), c = SMEM ? xp[1] : __ldg(xp + 1);
            int acc = dp4a_dot8(q, a, c);
            float xs = SMEM ? xd[(size_t)t * nb + b] : __ldg(xd + (size_t)t * nb + b);
            float v = d * (float)acc;
            if (T == 7)
                v = fmaf(m, (float)dp4a_sum32(a, c), v);
            s[t] = fmaf(xs, v, s[t]);
        }
    }
}

/* Up to MM_NT vectors, a row a warp. FUSED: x (nt <= 2 vectors, f32) quantised into shared
 * memory by each CTA first; else xq/xd already hold it (global memory). */
template <int T, bool FUSED>
__global__ void __launch_bounds__(QB_WARPS * 32)
qb_mmv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols, const float *__restrict__ x,
              const int8_t *__restrict__ xqg, const float *__restrict__ xdg, int nt, float *__restrict__ y, bool add)
{
    extern __shared__ __align__(16) uint8_t smb[];
    __shared__ int8_t tbl[16];
    int nb = cols / QK, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    qb_load_table<T>(tbl);
    const int8_t *xq = xqg;
    const float *xd = xdg;
    if (FUSED) {
        int8_t *sq = (int8_t *)smb;
        float *sd = (float *)(smb + (((size_t)nt * cols + 15) & ~(size_t)15));
        for (int b = warp; b < nt * nb; b += QB_WARPS) /* quantize_q8_kernel's formula */
            quantize_q8_elem(__ldg(x + (size_t)b * QK + lane), b * QK + lane, sq, sd);
        xq = sq;
        xd = sd;
    }
    __syncthreads();
    int r = blockIdx.x * QB_WARPS + warp;
    if (r >= rows)
        return;
    const uint8_t *wr = W + (size_t)r * row_bytes;
    float s[MM_NT];
    mm_sums_clear(s);
    for (int b = lane; b < nb; b += 32) {
        int q[8];
        float d, m;
        qb_load<T>(wr, b, tbl, q, d, m);
        qb_dot<T, FUSED>(q, d, m, xq, xd, nb, b, nt, s);
    }
    mm_sums_store(s, nt, y, rows, r, add, lane);
}

/* W (rows, cols) widened to f16, a block a thread: each value d * q + m in f32, rounded once. */
template <int T>
__global__ void qb_widen_f16_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int cols,
                                    __half *__restrict__ out)
{
    __shared__ int8_t tbl[16];
    qb_load_table<T>(tbl);
    __syncthreads();
    int nb = cols / QK;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nb)
        return;
    int r = (int)(i / nb), b = (int)(i % nb);
    int q[8];
    float d, m;
    qb_load<T>(W + (size_t)r * row_bytes, b, tbl, q, d, m);
    __half *o = out + (size_t)r * cols + (size_t)b * QK;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        __half v[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = __float2half_rn(fmaf(d, (float)(int8_t)(q[k] >> (8 * e)), m));
        *(uint2 *)(o + 4 * k) = *(const uint2 *)v;
    }
}

template <int T>
static void qb_launch_rows(struct cuda_ctx *c, const uint8_t *W, size_t rb, int rows, int cols, const float *x,
                           const int8_t *xq, const float *xd, int nt, float *y, bool add, size_t sm)
{
    unsigned grid = (unsigned)((rows + QB_WARPS - 1) / QB_WARPS);
    if (x)
        qb_mmv_kernel<T, true><<<grid, QB_WARPS * 32, sm, c->st>>>(W, rb, rows, cols, x, NULL, NULL, nt, y, add);
    else
        qb_mmv_kernel<T, false><<<grid, QB_WARPS * 32, 0, c->st>>>(W, rb, rows, cols, NULL, xq, xd, nt, y, add);
}

template <int T>
static void qb_launch_widen(struct cuda_ctx *c, const uint8_t *W, size_t rb, int rows, int cols, __half *out)
{
    size_t blocks = (size_t)rows * (cols / QK);
    qb_widen_f16_kernel<T><<<(unsigned)((blocks + 255) / 256), 256, 0, c->st>>>(W, rb, rows, cols, out);
}

#define QB_DISPATCH(type, fn, ...)                                                                                     \
    do {                                                                                                               \
        if ((type) == GGML_TYPE_Q5_0) fn<6>(__VA_ARGS__);                                                             \
        else if ((type) == GGML_TYPE_Q5_1) fn<7>(__VA_ARGS__);                                                        \
        else if ((type) == GGML_TYPE_IQ4_XS) fn<23>(__VA_ARGS__);                                                     \
        else fn<39>(__VA_ARGS__);                                                                                      \
    } while (0)

bool cuda_matmul_qb(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n, bool add)
{
    uint32_t type = w->type;
    if (!qb_type(type))
        return false;
    int cols = (int)w->ne[0], rows = (int)w->ne[1] ? (int)w->ne[1] : 1;
    const uint8_t *W = (const uint8_t *)w->data;
    size_t align = type == GGML_TYPE_Q5_0 ? 1 : type == GGML_TYPE_MXFP4 ? 0 : 3;
    if (cols % (type == GGML_TYPE_IQ4_XS ? QK_K : QK) || (((uintptr_t)W | w->row_bytes) & align))
        return false;
    int nb = cols / QK;
    size_t wide = (size_t)rows * cols * sizeof(__half);
    if (n > MM_NT && wide <= QB_F16_MAX) {
        __half *w16 = (__half *)cuda_scratch(c, wide);
        if (!w16)
            return true; /* the error is kept in c */
        QB_DISPATCH(type, qb_launch_widen, c, W, w->row_bytes, rows, cols, w16);
        if (!CU_LAUNCH(c, "qb_widen_f16_kernel"))
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
        QB_DISPATCH(type, qb_launch_rows, c, W, w->row_bytes, rows, cols, x, NULL, NULL, n, y, add, sm);
        CU_LAUNCH(c, "qb_mmv_kernel");
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
        QB_DISPATCH(type, qb_launch_rows, c, W, w->row_bytes, rows, cols, NULL, xq + (size_t)t0 * cols,
                    xd + (size_t)t0 * nb, nt, y + (size_t)t0 * rows, add, 0);
        if (!CU_LAUNCH(c, "qb_mmv_kernel"))
            return true;
    }
    return true;
}
