/* gemm_f32.cu - f32 weight products at prefill sizes (the MoE router, f32 dense models).
 *
 * Without it an f32 matmul of n tokens was n/8 launches of the row-per-warp GEMV (8 tokens
 * each): a 512-token chunk's router product (128 x 2048 f32) took 64 launches of 32 CTAs,
 * ~0.8 ms a layer, about a third of a Qwen3-30B-A3B prefill once the experts were grouped.
 * Here one launch: a CTA owns a 32-row x 32-token tile of y, walks K in steps of 32 through
 * shared memory, and each of its 64 threads keeps 4 x 4 f32 accumulators (fmaf over K in
 * order). The sum order differs from the GEMV's (f32 rounding only); each element's result
 * does not depend on n or on the tile it falls in. */
#include "engine/cuda/common.cuh"

#define SG_T 32 /* rows and tokens per CTA */
#define SG_K 32 /* K per shared-memory step */

/* y(rows, n) = W x, or y += W x with add (y + sum: the bits of the product, then axpy with
 * a = 1). W rows ldw floats apart; x (n, cols). grid (row tiles, token tiles). */
__global__ void __launch_bounds__(64)
sgemm_kernel(const float *__restrict__ W, size_t ldw, int rows, int cols, const float *__restrict__ x, int n,
             float *y, bool add)
{
    __shared__ float ws[SG_K][SG_T + 1]; /* [k][row]: +1 keeps the transposing stores conflict-free */
    __shared__ float xs[SG_K][SG_T + 1]; /* [k][token] */
    int tid = threadIdx.x, tm = tid & 7, tt = tid >> 3;
    int m0 = blockIdx.x * SG_T, n0 = blockIdx.y * SG_T;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += SG_K) {
        for (int i = tid; i < SG_T * SG_K; i += 64) { /* a warp reads 32 consecutive k of one row */
            int r = i / SG_K, kk = i % SG_K, gk = k0 + kk;
            int gr = m0 + r, gt = n0 + r;
            ws[kk][r] = gr < rows && gk < cols ? W[(size_t)gr * ldw + gk] : 0.0f;
            xs[kk][r] = gt < n && gk < cols ? x[(size_t)gt * cols + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < SG_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = ws[kk][tm * 4 + i];
                b[i] = xs[kk][tt * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int t = n0 + tt * 4 + j;
        if (t >= n)
            continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = m0 + tm * 4 + i;
            if (r < rows) {
                float *o = y + (size_t)t * rows + r;
                *o = add ? *o + acc[i][j] : acc[i][j];
            }
        }
    }
}

void cuda_sgemm(struct cuda_ctx *c, const float *W, size_t ldw, int rows, int cols, const float *x, int n, float *y,
                bool add)
{
    dim3 grid((unsigned)((rows + SG_T - 1) / SG_T), (unsigned)((n + SG_T - 1) / SG_T));
    sgemm_kernel<<<grid, 64, 0, c->st>>>(W, ldw, rows, cols, x, n, y, add);
    CU_LAUNCH(c, "sgemm_kernel");
}
