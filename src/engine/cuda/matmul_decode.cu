/* matmul_decode.cu - decode-size q8_0 / q4_0 products with x quantised once (issue 21; behind
 * TIDE_DECODE_QONCE: 1 by default, 2 the other form, 0 off).
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

#include "engine/cuda/matmul_decode.cuh"

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
    /* before the CTA starts: mode 1's CTAs have QO_WARPS warps, mode 2's QO_THREADS / 32 (decided
     * after them, the fallback left half of every CTA's rows unwritten: decode-qonce-emu) */
    if (mode == 2 && norm && norm->type != GGML_TYPE_F32) /* its in-CTA norm reads f32 weights only */
        mode = 1;
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
