/* gemm_f32.cu - f32 weight products at prefill sizes (the MoE router, f32 dense models).
 *
 * Without it an f32 matmul of n tokens was n/8 launches of the row-per-warp GEMV (8 tokens
 * each): a 512-token chunk's router product (128 x 2048 f32) took 64 launches of 32 CTAs,
 * ~0.8 ms a layer, about a third of a Qwen3-30B-A3B prefill once the experts were grouped.
 * Here one launch: a CTA owns a 32-row x 16-token tile of y, walks K in steps of 32 through
 * shared memory in SG_G groups of 64 threads, each thread keeping 4 x 2 f32 accumulators
 * (fmaf over its K steps in order). The sum order differs from the GEMV's (f32 rounding
 * only); each element's result does not depend on n or on the tile it falls in. */
#include "engine/cuda/common.cuh"

#define SG_T 32  /* rows per CTA */
#define SG_TN 16 /* tokens per CTA */
#define SG_K 32  /* K per shared-memory step and group */
#define SG_G 4   /* K groups per CTA: each walks every SG_G-th step of K */

/* y(rows, n) = W x, or y += W x with add (y + sum: the bits of the product, then axpy with
 * a = 1). W rows ldw floats apart; x (n, cols). grid (row tiles, token tiles).
 * A 512-token router product in 32 x 32 tiles with one group of 64 threads each left 68 SMs
 * idle and the rest at two warps (295 us a layer on the H200); here tiles of 16 tokens and
 * SG_G groups of 64 threads a tile, group g taking K steps g, g + SG_G, ..., and group 0 adds
 * the groups' sums in order 0..SG_G-1 at the end, so each element's bits still depend only
 * on cols. */
__global__ void __launch_bounds__(64 * SG_G)
sgemm_kernel(const float *__restrict__ W, size_t ldw, int rows, int cols, const float *__restrict__ x, int n,
             float *y, bool add)
{
    /* [group][k][row or token]: +1 keeps the transposing stores conflict-free */
    __shared__ float ws[SG_G][SG_K][SG_T + 1];
    __shared__ float xs[SG_G][SG_K][SG_TN + 1];
    int tid = threadIdx.x, kg = tid >> 6, lt = tid & 63, tm = lt & 7, tt = lt >> 3;
    int m0 = blockIdx.x * SG_T, n0 = blockIdx.y * SG_TN;
    float acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++)
        acc[i][0] = acc[i][1] = 0.0f;
    /* register prefetch: step k0 + SG_K * SG_G is loaded while step k0 is multiplied, so a
     * step waits on its loads' latency once, not once per load */
    constexpr int WPT = SG_G * SG_T * SG_K / (64 * SG_G), XPT = SG_G * SG_TN * SG_K / (64 * SG_G);
    float wv[WPT], xv[XPT];
    auto load = [&](int k0) {
#pragma unroll
        for (int u = 0; u < WPT; u++) { /* a warp reads 32 consecutive k of one row */
            int i = tid + u * 64 * SG_G;
            int grp = i / (SG_T * SG_K), rem = i % (SG_T * SG_K), r = rem / SG_K, kk = rem % SG_K;
            int gk = k0 + grp * SG_K + kk, gr = m0 + r;
            wv[u] = gr < rows && gk < cols ? __ldg(W + (size_t)gr * ldw + gk) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < XPT; u++) {
            int i = tid + u * 64 * SG_G;
            int grp = i / (SG_TN * SG_K), rem = i % (SG_TN * SG_K), r = rem / SG_K, kk = rem % SG_K;
            int gk = k0 + grp * SG_K + kk, gt = n0 + r;
            xv[u] = gt < n && gk < cols ? __ldg(x + (size_t)gt * cols + gk) : 0.0f;
        }
    };
    load(0);
    for (int k0 = 0; k0 < cols; k0 += SG_K * SG_G) {
#pragma unroll
        for (int u = 0; u < WPT; u++) {
            int i = tid + u * 64 * SG_G, rem = i % (SG_T * SG_K);
            ws[i / (SG_T * SG_K)][rem % SG_K][rem / SG_K] = wv[u];
        }
#pragma unroll
        for (int u = 0; u < XPT; u++) {
            int i = tid + u * 64 * SG_G, rem = i % (SG_TN * SG_K);
            xs[i / (SG_TN * SG_K)][rem % SG_K][rem / SG_K] = xv[u];
        }
        __syncthreads();
        if (k0 + SG_K * SG_G < cols)
            load(k0 + SG_K * SG_G);
#pragma unroll 8
        for (int kk = 0; kk < SG_K; kk++) {
            float a[4], b0 = xs[kg][kk][tt * 2], b1 = xs[kg][kk][tt * 2 + 1];
#pragma unroll
            for (int i = 0; i < 4; i++)
                a[i] = ws[kg][kk][tm * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[i][0] = fmaf(a[i], b0, acc[i][0]);
                acc[i][1] = fmaf(a[i], b1, acc[i][1]);
            }
        }
        __syncthreads();
    }
    /* the groups' sums through shared memory (free after the loop's last barrier),
     * [group - 1][element][thread] so that each store and load is conflict-free */
    float *red = &ws[0][0][0];
    if (kg > 0)
#pragma unroll
        for (int e = 0; e < 8; e++)
            red[((kg - 1) * 8 + e) * 64 + lt] = acc[e >> 1][e & 1];
    __syncthreads();
    if (kg > 0)
        return;
#pragma unroll
    for (int g = 1; g < SG_G; g++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[e >> 1][e & 1] += red[((g - 1) * 8 + e) * 64 + lt];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int t = n0 + tt * 2 + j;
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
    dim3 grid((unsigned)((rows + SG_T - 1) / SG_T), (unsigned)((n + SG_TN - 1) / SG_TN));
    sgemm_kernel<<<grid, 64 * SG_G, 0, c->st>>>(W, ldw, rows, cols, x, n, y, add);
    CU_LAUNCH(c, "sgemm_kernel");
}
