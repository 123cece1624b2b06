/* matmul_decode.cuh - the device code of matmul_decode.cu (TIDE_DECODE_QONCE: the quantise
 * kernel, the in-CTA quantiser and the weight-streaming product; see that file for the design),
 * moved here verbatim so that the host emulation (tests/gpu/emu/qonce_emu.cpp, `make
 * decode-qonce-emu`) compiles this very code with g++. */
#ifndef TIDE_CUDA_MATMUL_DECODE_CUH
#define TIDE_CUDA_MATMUL_DECODE_CUH

#include "engine/cuda/mmq.cuh"

#define QO_WARPS 4       /* warps a CTA of the product */
#define QO_THREADS 256   /* the quantise kernel: rms_scale_held must reduce as rmsnorm_kernel */
#define QO_PER_THREAD 16 /* cols <= 4096 */

/* One token of x (cols) by the CTA's QO_THREADS threads: normed when NORM (x * scale * nw[e],
 * rmsnorm_kernel's expression and reduction order; written to xn too unless xn is NULL), then
 * quantised to int8 blocks of 32 into xq (cols) and xd (cols / 32), global or shared memory.
 * red: 32 shared floats. */
template <bool NORM, bool F32W = false>
__device__ __forceinline__ void qonce_token(const float *__restrict__ x, int cols, int8_t *xq, float *xd,
                                            uint32_t ntype, const uint8_t *__restrict__ nw, float eps, float *xn,
                                            float *red)
{
    int tid = threadIdx.x, warp = tid >> 5;
    float v[QO_PER_THREAD];
#pragma unroll
    for (int k = 0; k < QO_PER_THREAD; k++) { /* every load before any reduction */
        int e = k * QO_THREADS + tid;
        v[k] = e < cols ? __ldg(x + e) : 0.0f;
    }
    if (NORM) {
        float sc = rms_scale_held(v, cols, QO_THREADS, eps, red);
#pragma unroll
        for (int k = 0; k < QO_PER_THREAD; k++) {
            int e = k * QO_THREADS + tid;
            if (e < cols) {
                /* F32W: an f32 norm weight read directly (row_elem's F32 case, the same value):
                 * row_elem's switch over every type would spill the prefetched weights */
                v[k] = v[k] * sc * (F32W ? __ldg((const float *)nw + e) : row_elem(ntype, nw, e));
                if (xn)
                    xn[e] = v[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < QO_PER_THREAD; k++) {
        int e = k * QO_THREADS + tid;
        if (k * QO_THREADS + warp * 32 < cols) /* warp-uniform: cols % 32 == 0 */
            quantize_q8_elem(v[k], e, xq, xd);
    }
}

/* x (n, cols) into xq (n, cols), xd (n, cols / 32), normed (and the normed x written to xn)
 * when NORM. Grid (cols / QO_THREADS rounded up, n): CTA (b, t) quantises elements b * 256 ..
 * b * 256 + 255 of token t, so the SMs share the work instead of one CTA a token; with the norm
 * each CTA sums all of the token's squares itself, in rms_scale_held's order, so every CTA has
 * the same scale and the values are qonce_token's (and rmsnorm's). */
template <bool NORM>
__global__ void __launch_bounds__(QO_THREADS)
qonce_quantize_kernel(const float *__restrict__ x, int cols, int8_t *__restrict__ xq, float *__restrict__ xd,
                      uint32_t ntype, const uint8_t *__restrict__ nw, float eps, float *__restrict__ xn)
{
    size_t t = blockIdx.y;
    int tid = threadIdx.x, warp = tid >> 5, e = blockIdx.x * QO_THREADS + tid;
    x += t * cols;
    float mine = e < cols ? __ldg(x + e) : 0.0f;
    if (NORM) {
        __shared__ float red[32];
        float v[QO_PER_THREAD];
#pragma unroll
        for (int k = 0; k < QO_PER_THREAD; k++) {
            int i = k * QO_THREADS + tid;
            v[k] = i < cols ? __ldg(x + i) : 0.0f;
        }
        float sc = rms_scale_held(v, cols, QO_THREADS, eps, red);
        if (e < cols) {
            mine = mine * sc * row_elem(ntype, nw, e);
            xn[t * cols + e] = mine;
        }
    }
    if ((int)blockIdx.x * QO_THREADS + warp * 32 < cols) /* warp-uniform: cols % 32 == 0 */
        quantize_q8_elem(mine, e, xq + t * cols, xd + t * (cols / QK));
}

/* Up to three products of one quantised x: CTAs start[m] .. start[m + 1) - 1 take matrix m. */
struct qo_args {
    const uint8_t *W[3];
    size_t row_bytes[3];
    float *y[3];
    int rows[3];
    int start[4];
};

/* The 8 int8x4 words and the scale of block h (0 or 1) of a pair held as NU u32 (q8_0: 17, the
 * first block 2 bytes into the pair; q4_0: 9), as row_dot_q unpacks them. */
template <int QT>
__device__ __forceinline__ float qo_unpack(const uint32_t *u, int h, int wq[8])
{
    if constexpr (QT == 8) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            wq[i] = h ? (int)u[9 + i] : (int)__funnelshift_r(u[i], u[i + 1], 16);
        return f16_bits_to_f32((uint16_t)(h ? u[8] >> 16 : u[0] & 0xFFFFu));
    } else {
        uint32_t q[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = h ? u[5 + i] : __funnelshift_r(u[i], u[i + 1], 16);
        unpack_q4(q, wq);
        return f16_bits_to_f32((uint16_t)(h ? u[4] >> 16 : u[0] & 0xFFFFu));
    }
}

/* The x a prefetching CTA quantises itself (MODE 1, 2): x (nt, cols), normed by nw (MODE 2). */
struct qo_x {
    const float *x;
    int cols;
    const uint8_t *nw;
    uint32_t ntype;
    float eps;
    float *xn; /* the normed x (nt, cols), written by CTA 0 */
};

/* Rows r0 .. r0 + R - 1 of matrix m a warp (r0 = (CTA in m * warps + warp) * R), PU pairs of
 * blocks a lane a row per step. nb even, rows 4-byte aligned (the pairs layout); nt <= NT.
 * MODE 0 (TIDE_DECODE_QONCE=1): x already quantised by qonce_quantize_kernel, xq (nt, cols) and
 * xd (nt, nb) read from global memory (L2); QO_WARPS warps a CTA.
 * MODE 1, 2 (TIDE_DECODE_QONCE=2): no kernel before; the CTA (QO_THREADS threads, the norm's
 * reduction width) issues its warps' first step of weight loads, then quantises x itself (MODE
 * 2: norms it first) into shared memory while those loads are in flight: the prologue of
 * matmul.cu's fused kernels without its wait, and no extra launch. */
template <int QT, int R, int PU, int NT, int MODE>
__global__ void __launch_bounds__(MODE ? QO_THREADS : QO_WARPS * 32, MODE ? 2 : 1)
mmvq_qonce_kernel(const qo_args a, int nb, const int8_t *__restrict__ xq_g, const float *__restrict__ xd_g, int nt,
                  bool add, const qo_x px)
{
    constexpr int BLK = QT == 8 ? 34 : 18;
    constexpr int NU = BLK * 2 / 4;
    constexpr int WARPS = MODE ? QO_THREADS / 32 : QO_WARPS;
    int b = blockIdx.x, m = b >= a.start[2] ? 2 : b >= a.start[1] ? 1 : 0;
    /* picked by selects: an index into the parameter arrays would copy them to local memory */
#define PICK(f) (m == 0 ? a.f[0] : m == 1 ? a.f[1] : a.f[2])
    const uint8_t *W = PICK(W);
    size_t rb = PICK(row_bytes);
    float *y = PICK(y);
    int rows = PICK(rows), first = PICK(start);
#undef PICK
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r0 = ((b - first) * WARPS + warp) * R;
    bool live = r0 < rows; /* warp-uniform */
    if (!MODE && !live)
        return;
    int np = nb / 2;
    uint32_t u[R][PU][NU];
    auto load_step = [&](int p0) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < PU; i++) {
                int p = p0 + 32 * i;
                if (p < np && r0 + r < rows) {
                    const uint32_t *pp = (const uint32_t *)(W + (size_t)(r0 + r) * rb + (size_t)p * 2 * BLK);
#pragma unroll
                    for (int v = 0; v < NU; v++)
                        u[r][i][v] = __ldg(pp + v);
                }
            }
    };
    if (live)
        load_step(lane); /* every load of the first step before anything else */
    extern __shared__ __align__(16) uint8_t smq[];
    const int8_t *xq = xq_g;
    const float *xd = xd_g;
    if (MODE) { /* CTA-uniform: every thread quantises, dead warps included */
        __shared__ float red[32];
        int8_t *sq = (int8_t *)smq;                                                  /* (nt, cols) */
        float *sd = (float *)(smq + (((size_t)nt * px.cols + 15) & ~(size_t)15)); /* (nt, nb) */
        for (int t = 0; t < nt; t++) {
            const float *xt = px.x + (size_t)t * px.cols;
            float *xn = px.xn && blockIdx.x == 0 ? px.xn + (size_t)t * px.cols : NULL;
            if (MODE == 2)
                qonce_token<true, true>(xt, px.cols, sq + (size_t)t * px.cols, sd + (size_t)t * nb, px.ntype, px.nw,
                                  px.eps, xn, red);
            else
                qonce_token<false>(xt, px.cols, sq + (size_t)t * px.cols, sd + (size_t)t * nb, 0, NULL, 0.0f, NULL,
                                   red);
        }
        __syncthreads();
        xq = sq;
        xd = sd;
        if (!live)
            return;
    }
    float s[R][MM_NT];
#pragma unroll
    for (int r = 0; r < R; r++)
        mm_sums_clear(s[r]);
    for (int p0 = lane; p0 < np; p0 += 32 * PU) {
        if (p0 != lane)
            load_step(p0);
#pragma unroll
        for (int i = 0; i < PU; i++) {
            int p = p0 + 32 * i;
            if (p >= np)
                break;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int blk = 2 * p + h;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
                        const int4 *xp = (const int4 *)(xq + ((size_t)t * nb + blk) * QK);
                        int4 xa = MODE ? xp[0] : __ldg(xp), xc = MODE ? xp[1] : __ldg(xp + 1);
                        float xs = MODE ? xd[(size_t)t * nb + blk] : __ldg(xd + (size_t)t * nb + blk);
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            if (r0 + r < rows) {
                                int wq[8];
                                float dw = qo_unpack<QT>(u[r][i], h, wq);
                                int acc = dp4a_dot8(wq, xa, xc);
                                s[r][t] += (dw * xs) * (float)acc; /* dot_block's formula */
                            }
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        if (r0 + r < rows)
            mm_sums_store<NT>(s[r], nt, y, rows, r0 + r, add, lane);
}
#endif
