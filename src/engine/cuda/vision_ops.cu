/* vision_ops.cu - the vision encoder's ops on the GPU: LayerNorm with bias, bias add, the
 * ViT activations and full (unmasked) attention over one image's tokens, plus the size of
 * the scratch cuda_matmul takes (for the hand-back reserve). Semantics follow
 * backend_cpu_vision.c; sums are f32 here (the CPU's LayerNorm sums in double), so results
 * agree to rounding, not bit for bit. */
#include "engine/cuda/vision_ops.cuh"
#include "engine/cuda/mmq.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

/* The CTA's maximum of each thread's v (block_sum's pattern, common.cuh): every thread calls
 * it and gets the result; red (32 shared floats) is free again when it returns. */
__device__ __forceinline__ float block_max(float v, float *red)
{
    v = warp_max(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : -INFINITY;
    __syncthreads(); /* everyone has read red before it is written again */
    return warp_max(t);
}

/* One CTA a row; two passes (mean, then the centred variance) as the CPU does. In place is
 * fine: every element is read for both sums before the barrier inside the second sum. */
__global__ void layernorm_kernel(const float *x, float *y, const float *__restrict__ w, const float *__restrict__ b,
                                 int dim, float eps)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        s += xr[i];
    float mean = block_sum(s, red) / (float)dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float d = xr[i] - mean;
        ss = fmaf(d, d, ss);
    }
    float inv = rsqrtf(block_sum(ss, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = (xr[i] - mean) * inv;
        if (w)
            v *= w[i];
        if (b)
            v += b[i];
        yr[i] = v;
    }
}

__global__ void add_bias_kernel(float *y, const float *__restrict__ b, size_t total, int dim)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % dim];
}

__global__ void activate_kernel(float *x, size_t n, int act)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        if (act == ACT_GELU)
            x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * v * (1.0f + 0.044715f * v * v)));
        else if (act == ACT_GELU_QUICK)
            x[i] = v / (1.0f + expf(-1.702f * v));
        else
            x[i] = v / (1.0f + expf(-v));
    }
}

/* grid (P queries, n_head), 128 threads. The query's head sits in shared memory, then its
 * P scores (one warp a key, lanes across head_dim), the softmax as the CPU's (scale, max,
 * exp, sum, divide), then out = scores . V with threads across head_dim. An image is at
 * most a few thousand tokens, so the scores fit in shared memory (see cu_attention_full). */
#define ATT_THREADS 128
__global__ void __launch_bounds__(ATT_THREADS)
attention_full_kernel(const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,
                      float *__restrict__ out, int P, int n_head, int d, float scale)
{
    extern __shared__ float sm[]; /* qh (d), then scores (P) */
    __shared__ float red[32];
    float *qh = sm, *sc = sm + d;
    int t = blockIdx.x, h = blockIdx.y, A = n_head * d;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = ATT_THREADS / 32;
    for (int i = threadIdx.x; i < d; i += ATT_THREADS)
        qh[i] = q[(size_t)t * A + (size_t)h * d + i];
    __syncthreads();
    for (int j = warp; j < P; j += nw) {
        const float *kr = k + (size_t)j * A + (size_t)h * d;
        float s = 0.0f;
        for (int i = lane; i < d; i += 32)
            s = fmaf(qh[i], kr[i], s);
        s = warp_sum(s);
        if (lane == 0)
            sc[j] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < P; j += ATT_THREADS)
        mx = fmaxf(mx, sc[j]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < P; j += ATT_THREADS) {
        float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red); /* its barriers also publish sc (common.cuh) */
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < d; i += ATT_THREADS) {
        const float *vc = v + (size_t)h * d + i;
        float o = 0.0f;
        for (int j = 0; j < P; j++)
            o = fmaf(sc[j] * inv, vc[(size_t)j * A], o);
        out[(size_t)t * A + (size_t)h * d + i] = o;
    }
}

void cu_layernorm(void *ctx, const float *x, float *y, const float *w, const float *b, int n, int dim, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0 || dim <= 0)
        return;
    layernorm_kernel<<<n, dim >= 1024 ? 512 : dim >= 256 ? 256 : 128, 0, c->st>>>(x, y, w, b, dim, eps);
    CU_LAUNCH(c, "layernorm_kernel");
}

void cu_add_bias(void *ctx, float *y, const float *b, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!b || !cuda_enter(c) || n <= 0 || dim <= 0)
        return;
    size_t total = (size_t)n * dim;
    add_bias_kernel<<<cuda_grid(total, 256), 256, 0, c->st>>>(y, b, total, dim);
    CU_LAUNCH(c, "add_bias_kernel");
}

void cu_activate(void *ctx, float *x, size_t n, enum act_kind act)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || !n)
        return;
    activate_kernel<<<cuda_grid(n, 256), 256, 0, c->st>>>(x, n, (int)act);
    CU_LAUNCH(c, "activate_kernel");
}

void cu_attention_full(void *ctx, const float *q, const float *k, const float *v, float *out, int P, int n_head,
                       int d, float *ws)
{
    (void)ws; /* the scores live in shared memory */
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || P <= 0 || n_head <= 0 || d <= 0)
        return;
    /* TIDE_VISION_TC=1: the tensor-core kernel where it takes the head width */
    if (cuda_set_vision_tc(-1) && cuda_attention_full_mma(c, q, k, v, out, P, n_head, d))
        return;
    size_t smem = sizeof(float) * ((size_t)d + P);
    if (smem > 48 * 1024 || n_head > 65535) {
        /* 12k tokens: far past any fixed-resolution encoder; refuse rather than misbehave */
        cuda_fail(c, cudaErrorInvalidValue, "attention_full (too many tokens for shared memory)", __FILE__,
                  __LINE__);
        return;
    }
    dim3 grid((unsigned)P, (unsigned)n_head);
    attention_full_kernel<<<grid, ATT_THREADS, smem, c->st>>>(q, k, v, out, P, n_head, d, 1.0f / sqrtf((float)d));
    CU_LAUNCH(c, "attention_full_kernel");
}

/* What cuda_matmul (matmul.cu) takes from cuda_scratch for this product: the q8_0 / q4_0
 * paths quantise x there (and the tensor-core path keeps split-K partials), the float paths
 * take none, except f16 / bf16 under TIDE_F16_MMA (from the sum buffer, counted here too).
 * cuda_scratch grows to 1.25x what is asked. Keep in step with cuda_matmul. */
size_t cu_matmul_scratch(void *ctx, const struct tensor *w, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int cols = (int)w->ne[0], rows = (int)w->ne[1] ? (int)w->ne[1] : 1;
    if (n > MM_NT && (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16) && w->row_bytes % 2 == 0) {
        /* TIDE_F16_MMA's kernel: x rounded and split-K partials, in the sum buffer (grown as
         * cuda_scratch grows) */
        size_t b = cuda_f16_mma_workspace(c, w->type, w->data, w->row_bytes / 2, rows, cols, n);
        return b + b / 4;
    }
    if (n <= 0 || (w->type != GGML_TYPE_Q8_0 && w->type != GGML_TYPE_Q4_0) || cols % QK)
        return 0;
    int nb = cols / QK;
    int nt0 = n < MM_NT ? n : MM_NT;
    size_t fsm = (((size_t)nt0 * cols + 15) & ~(size_t)15) + (size_t)nt0 * nb * sizeof(float);
    if (n <= 2 && fsm <= 48 * 1024)
        return 0; /* quantised inside the kernel */
    bool mma = n >= cuda_mmq_min_n() && cuda_mmq_ok(w->data, w->row_bytes, nb);
    size_t qbytes = ((size_t)n * cols + 255) & ~(size_t)255;
    size_t dbytes = ((size_t)n * nb * sizeof(float) + 255) & ~(size_t)255;
    size_t pbytes = mma ? cuda_mmq_scratch(c, rows, nb, n) : 0;
    size_t need = qbytes + dbytes + pbytes;
    return need + need / 4;
}
