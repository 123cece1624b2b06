/* oai_ops.cu - the CUDA backend's ops for gpt-oss (the CPU's are backend_cpu_oai.c and
 * backend_cpu_attention.c, which these follow): causal attention with a per-head sink logit and an
 * optional sliding window (its kernel is attention_sinks.cuh's, over f32 or f16 rows, contiguous
 * or paged), rope with a frequency per pair (yarn; deepseek2's rope table too), and the clamped
 * SwiGLU. Without sinks and window the attention is the plain causal one, which deepseek2's MLA
 * takes for its 576-wide rows (attention.cu stops at head_dim 256). */
#include "engine/cuda/attention_sinks.cuh"

#include <math.h>

#define ROPE_MAX_PAIRS 256

template <typename T, bool PAGED>
static void sinks_launch(struct cuda_ctx *c, const float *q, const void *k, const void *v, float *out, int n,
                         int pos, int n_head, int n_head_kv, int head_dim, const float *sinks, int window,
                         const int32_t *tab, int shift)
{
    unsigned grid = (unsigned)(((size_t)n * n_head + SINK_WARPS - 1) / SINK_WARPS);
    size_t sm = sizeof(float) * SINK_WARPS * (size_t)head_dim;
    attention_sinks_kernel<T, PAGED><<<grid, SINK_WARPS * 32, sm, c->st>>>(
        q, (const T *)k, (const T *)v, out, n, pos, n_head, n_head_kv, head_dim, sinks, window, tab, shift);
    CU_LAUNCH(c, "attention_sinks_kernel");
}

void cuda_attention_sinks(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                          int n_head_kv, int head_dim, const float *sinks, int window)
{
    (void)att;
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0)
        return;
    if (head_dim % 32 || head_dim > SINK_MAX_HD || n_head_kv <= 0 || n_head % n_head_kv) {
        cuda_fail(c, cudaErrorInvalidValue, "attention_sinks: head_dim not a multiple of 32 up to 576", __FILE__,
                  __LINE__);
        return;
    }
    int shift = 0;
    if (blocks && (shift = cuda_block_shift(c, block_rows)) < 0)
        return;
    if (f16 && blocks)
        sinks_launch<__half, true>(c, q, k_cache, v_cache, out, n, pos, n_head, n_head_kv, head_dim, sinks, window,
                                   blocks, shift);
    else if (f16)
        sinks_launch<__half, false>(c, q, k_cache, v_cache, out, n, pos, n_head, n_head_kv, head_dim, sinks, window,
                                    NULL, 0);
    else if (blocks)
        sinks_launch<float, true>(c, q, k_cache, v_cache, out, n, pos, n_head, n_head_kv, head_dim, sinks, window,
                                  blocks, shift);
    else
        sinks_launch<float, false>(c, q, k_cache, v_cache, out, n, pos, n_head, n_head_kv, head_dim, sinks, window,
                                   NULL, 0);
}

/* The frequencies travel in the launch's arguments (read from host memory when the op is
 * queued, as the forward holds them: model.rope_freqs) */
struct rope_table {
    float f[ROPE_MAX_PAIRS];
};

/* A thread a (token, head, pair); angles in double as cpu_rope_freqs */
__global__ void rope_freqs_kernel(float *vec, int n, int n_heads, int head_dim, int pos, const rope_table ft,
                                  float mscale, bool neox)
{
    int half = head_dim / 2;
    size_t total = (size_t)n * n_heads * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int pr = (int)(i % half);
        size_t th = i / half;
        int t = (int)(th / n_heads);
        double a = (double)(pos + t) * ft.f[pr];
        float cs = (float)cos(a) * mscale, sn = (float)sin(a) * mscale;
        float *v = vec + th * head_dim;
        float *p0 = v + (neox ? pr : 2 * pr), *p1 = p0 + (neox ? half : 1), x0 = *p0, x1 = *p1;
        *p0 = x0 * cs - x1 * sn;
        *p1 = x0 * sn + x1 * cs;
    }
}

void cuda_rope_freqs(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs,
                     float mscale, enum rope_kind kind)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0)
        return;
    int half = head_dim / 2;
    if (half > ROPE_MAX_PAIRS) {
        cuda_fail(c, cudaErrorInvalidValue, "rope_freqs: more than 256 pairs a head", __FILE__, __LINE__);
        return;
    }
    rope_table ft;
    for (int i = 0; i < half; i++)
        ft.f[i] = freqs[i];
    size_t total = (size_t)n * n_heads * half;
    rope_freqs_kernel<<<cuda_grid(total, 256), 256, 0, c->st>>>(vec, n, n_heads, head_dim, pos, ft, mscale,
                                                           kind == ROPE_NEOX);
    CU_LAUNCH(c, "rope_freqs_kernel");
}

__global__ void swiglu_oai_kernel(float *gate, const float *up, size_t n, float alpha, float limit)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i] < limit ? gate[i] : limit;
        float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        gate[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
}

void cuda_swiglu_oai(void *ctx, float *gate, const float *up, int n, float alpha, float limit)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0)
        return;
    swiglu_oai_kernel<<<cuda_grid((size_t)n, 256), 256, 0, c->st>>>(gate, up, (size_t)n, alpha, limit);
    CU_LAUNCH(c, "swiglu_oai_kernel");
}
