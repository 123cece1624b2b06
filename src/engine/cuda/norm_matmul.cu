/* norm_matmul.cu - backend_i.norm_matmul: a decode token's rmsnorm and the small f32 product
 * that reads it (the MoE router: 128 rows of n_embd f32) in one launch.
 *
 * Unfused these are two of the shortest kernels of a decode layer, each bound by its launch
 * and a few dependent trips to memory, and the router product ran on 16 CTAs. Here every CTA
 * loads all of x and its two weight rows at once (one round trip), reduces the sum of squares
 * in rmsnorm_kernel's order (thread i holds elements i, i + 256, ...: the order of rms_scale
 * with a 256-thread block), so the normed values are bit for bit rmsnorm's, and CTA 0 writes
 * them out for the ops after. The product sums in another order than gemv_kernel's. */
#include "engine/cuda/common.cuh"

#define NM_THREADS 256
#define NM_PER_THREAD 16 /* cols <= 4096 */
#define NM_ROWS 2        /* rows a CTA */

__global__ void __launch_bounds__(NM_THREADS)
norm_matmul_kernel(const float *__restrict__ W, size_t row_floats, int rows, int cols, const float *__restrict__ x,
                   uint32_t ntype, const uint8_t *__restrict__ nw, float eps, float *__restrict__ xn,
                   float *__restrict__ y)
{
    __shared__ float red[32], part[NM_ROWS][NM_THREADS / 32];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int r0 = blockIdx.x * NM_ROWS;
    float v[NM_PER_THREAD], w[NM_ROWS][NM_PER_THREAD];
#pragma unroll
    for (int k = 0; k < NM_PER_THREAD; k++) {
        int e = k * NM_THREADS + tid;
        v[k] = e < cols ? __ldg(x + e) : 0.0f;
#pragma unroll
        for (int r = 0; r < NM_ROWS; r++)
            w[r][k] = e < cols && r0 + r < rows ? __ldg(W + (size_t)(r0 + r) * row_floats + e) : 0.0f;
    }
    float sc = rms_scale_held(v, cols, NM_THREADS, eps, red);
    float acc[NM_ROWS] = {0.0f};
#pragma unroll
    for (int k = 0; k < NM_PER_THREAD; k++) {
        int e = k * NM_THREADS + tid;
        if (e < cols) {
            float o = v[k] * sc * row_elem(ntype, nw, e); /* rmsnorm_kernel's expression */
            if (blockIdx.x == 0)
                xn[e] = o;
#pragma unroll
            for (int r = 0; r < NM_ROWS; r++)
                acc[r] = fmaf(w[r][k], o, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < NM_ROWS; r++) {
        float a = warp_sum(acc[r]);
        if (lane == 0)
            part[r][warp] = a;
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < NM_ROWS; r++) {
            float a = lane < NM_THREADS / 32 ? part[r][lane] : 0.0f;
            a = warp_sum(a);
            if (lane == 0 && r0 + r < rows)
                y[r0 + r] = a;
        }
    }
}

bool cuda_norm_matmul(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, const struct tensor *norm,
                      float eps, float *xn)
{
    int cols = (int)w->ne[0], rows = (int)w->ne[1];
    /* the norm's own kernel must reduce with 256 threads for the same bits (norm_block) */
    if (w->type != GGML_TYPE_F32 || cols > NM_PER_THREAD * NM_THREADS || norm_block(cols) != NM_THREADS ||
        rows <= 0 || w->row_bytes % sizeof(float) || ((uintptr_t)w->data & 3))
        return false;
    norm_matmul_kernel<<<(unsigned)((rows + NM_ROWS - 1) / NM_ROWS), NM_THREADS, 0, c->st>>>(
        (const float *)w->data, w->row_bytes / sizeof(float), rows, cols, x, norm->type, (const uint8_t *)norm->data,
        eps, xn, y);
    CU_LAUNCH(c, "norm_matmul_kernel");
    return true;
}
