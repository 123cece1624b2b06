/* matmul_decode.cu - decode-size q8_0 / q4_0 products with x quantised once (issue 21; behind
 * TIDE_DECODE_QONCE, off by default until measured).
 *
 * matmul.cu's decode kernels (mmvq_fused_kernel, mmvq_fused3_kernel) quantise x - and for
 * matmul3 rmsnorm it - inside every CTA, which saved a launch when launches cost ~5 us. Inside a
 * recorded step a launch costs ~1 us, and the 640 CTAs of matmul3 each redo the norm and the
 * quantisation of 2048 values before their first weight load. Here:
 *   1. qonce_quantize_kernel: a CTA for each 256 elements of each token norms (optionally)
 *      and quantises them into the scratch: xq (n, cols) int8, xd (n, cols / 32) scales; with
 *      a norm it also writes the normed x (the ops after read it);
 *   2. mmvq_qonce_kernel: each warp takes R consecutive rows and issues all its weight loads
 *      for R x PU pairs of blocks a lane (4 x 68 bytes for q8_0 by default: R = 4 rows of one
 *      pair a lane at 2048 columns, R = 2 rows of two pairs at 4096) before any arithmetic;
 *      the quantised x is read from L2 once per block and dotted with the R rows. Up to three
 *      matrices (wq, wk, wv) in one grid, as matmul3 does. NT: 1 (decode) or MM_NT tokens of
 *      sums in registers.
 * Each row's lanes take the same pairs of blocks in the same order as row_dot_q (pair p by lane
 * p % 32, ascending), with the same per-block formula and the same warp sum, and the
 * quantisation is quantize_q8_elem's after rms_scale_held's scale: every output has the bits of
 * today's cuda_matmul / cuda_matmul3 (test-gpu decode_qonce checks it). Shapes outside it (odd
 * block counts, rows not 4-byte aligned, cols > 4096, k-quants) keep the old kernels. */
#include "engine/cuda/mmq.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#include <stdlib.h>

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

/* Rows a warp and pairs a lane a row: 4 x 68 bytes of q8_0 in flight a lane, as 4 rows of one
 * pair at up to 2048 columns (matmul3: 1280 warps, 320 CTAs, one wave at 3 CTAs an SM) or 2 rows
 * of two pairs above (wo at 4096 columns: 1024 warps). TIDE_DECODE_QONCE_RPW=1|2|4 forces the
 * rows a warp for the benchmark (then 2 pairs a lane at 1 row). Any choice gives the same bits. */
static void qonce_shape(int np, int *R, int *PU)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("TIDE_DECODE_QONCE_RPW");
        int r = e ? atoi(e) : 0;
        env = r == 1 || r == 2 || r == 4 ? r : 0;
    }
    *PU = np > 32 ? 2 : 1;
    *R = env ? env : 4 / *PU;
    if (*R == 4)
        *PU = 1;
    else if (*R == 1)
        *PU = 2;
}

template <int QT, int NT, int MODE>
static void qonce_launch(struct cuda_ctx *c, int R, int PU, unsigned grid, size_t smem, const qo_args &a, int nb,
                         const int8_t *xq, const float *xd, int n, bool add, const qo_x &px)
{
    constexpr int T = MODE ? QO_THREADS : QO_WARPS * 32;
    if (R == 4)
        mmvq_qonce_kernel<QT, 4, 1, NT, MODE><<<grid, T, smem, c->st>>>(a, nb, xq, xd, n, add, px);
    else if (R == 2 && PU == 2)
        mmvq_qonce_kernel<QT, 2, 2, NT, MODE><<<grid, T, smem, c->st>>>(a, nb, xq, xd, n, add, px);
    else if (R == 2)
        mmvq_qonce_kernel<QT, 2, 1, NT, MODE><<<grid, T, smem, c->st>>>(a, nb, xq, xd, n, add, px);
    else
        mmvq_qonce_kernel<QT, 1, 2, NT, MODE><<<grid, T, smem, c->st>>>(a, nb, xq, xd, n, add, px);
}

template <int QT, int MODE>
static void qonce_launch_n(struct cuda_ctx *c, int R, int PU, unsigned grid, size_t smem, const qo_args &a, int nb,
                           const int8_t *xq, const float *xd, int n, bool add, const qo_x &px)
{
    if (n == 1)
        qonce_launch<QT, 1, MODE>(c, R, PU, grid, smem, a, nb, xq, xd, n, add, px);
    else
        qonce_launch<QT, MM_NT, MODE>(c, R, PU, grid, smem, a, nb, xq, xd, n, add, px);
}

bool cuda_matmul_qonce(struct cuda_ctx *c, int nm, const struct tensor *const *w, const float *x, float *const *y,
                       int n, bool add, const struct tensor *norm, float eps, float *xn)
{
    int mode = cuda_set_decode_opt(CUDA_DECODE_QONCE, -1); /* 1: quantise once, 2: in-CTA, loads first */
    if (!mode || c->err || n < 1 || n > MM_NT || nm < 1 || nm > 3)
        return false;
    /* n >= the tensor-core threshold: cuda_matmul's mma kernel (other bits); keep it */
    if (n > 2 && n >= cuda_mmq_min_n())
        return false;
    uint32_t type = w[0]->type;
    int cols = (int)w[0]->ne[0], nb = cols / QK;
    if ((type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q4_0) || cols % (2 * QK) || cols > QO_PER_THREAD * QO_THREADS)
        return false;
    /* the norm must reduce with 256 threads, as rmsnorm_kernel does at this width */
    if (norm && (norm_block(cols) != QO_THREADS || !xn))
        return false;
    qo_args a;
    a.start[0] = 0;
    int R, PU;
    qonce_shape(nb / 2, &R, &PU);
    int warps = mode == 2 ? QO_THREADS / 32 : QO_WARPS;
    for (int m = 0; m < 3; m++) {
        int mm = m < nm ? m : nm - 1; /* unused slots repeat the last matrix with no CTAs */
        int rows = (int)w[mm]->ne[1];
        if (w[mm]->type != type || (int)w[mm]->ne[0] != cols || rows <= 0 ||
            (((uintptr_t)w[mm]->data | w[mm]->row_bytes) & 3))
            return false;
        a.W[m] = (const uint8_t *)w[mm]->data;
        a.row_bytes[m] = w[mm]->row_bytes;
        a.y[m] = y[mm];
        a.rows[m] = rows;
        a.start[m + 1] = a.start[m] + (m < nm ? (rows + warps * R - 1) / (warps * R) : 0);
    }
    unsigned grid = (unsigned)a.start[3];
    if (mode == 2 && norm && norm->type != GGML_TYPE_F32) /* its in-CTA norm reads f32 weights only */
        mode = 1;
    qo_x px = {x, cols, norm ? (const uint8_t *)norm->data : NULL, norm ? norm->type : 0, eps, norm ? xn : NULL};
    if (mode == 2) { /* x (nt, cols) int8 and its scales in each CTA's shared memory: <= 36 KB */
        size_t smem = (((size_t)n * cols + 15) & ~(size_t)15) + (size_t)n * nb * sizeof(float);
        if (type == GGML_TYPE_Q8_0 && norm)
            qonce_launch_n<8, 2>(c, R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        else if (type == GGML_TYPE_Q8_0)
            qonce_launch_n<8, 1>(c, R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        else if (norm)
            qonce_launch_n<2, 2>(c, R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        else
            qonce_launch_n<2, 1>(c, R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        CU_LAUNCH(c, "mmvq_qonce_kernel (in-CTA x)");
        return true;
    }
    size_t qbytes = ((size_t)n * cols + 255) & ~(size_t)255;
    uint8_t *ws = (uint8_t *)cuda_scratch(c, qbytes + (size_t)n * nb * sizeof(float));
    if (!ws)
        return true; /* the error (or the failed recording) is kept in c */
    int8_t *xq = (int8_t *)ws;          /* (n, cols) */
    float *xd = (float *)(ws + qbytes); /* (n, nb) */
    dim3 qgrid((unsigned)((cols + QO_THREADS - 1) / QO_THREADS), (unsigned)n);
    if (norm)
        qonce_quantize_kernel<true><<<qgrid, QO_THREADS, 0, c->st>>>(x, cols, xq, xd, norm->type,
                                                                     (const uint8_t *)norm->data, eps, xn);
    else
        qonce_quantize_kernel<false><<<qgrid, QO_THREADS, 0, c->st>>>(x, cols, xq, xd, 0, NULL, 0.0f, NULL);
    if (!CU_LAUNCH(c, "qonce_quantize_kernel"))
        return true;
    if (type == GGML_TYPE_Q8_0)
        qonce_launch_n<8, 0>(c, R, PU, grid, 0, a, nb, xq, xd, n, add, px);
    else
        qonce_launch_n<2, 0>(c, R, PU, grid, 0, a, nb, xq, xd, n, add, px);
    CU_LAUNCH(c, "mmvq_qonce_kernel");
    return true;
}
