/* oai_ops.cu - the CUDA backend's ops for gpt-oss (the CPU's are backend_cpu_oai.c, which
 * these follow): causal attention with a per-head sink logit and an optional sliding window,
 * rope with a frequency per pair (yarn; deepseek2's rope table too), and the clamped SwiGLU.
 *
 * The attention runs a warp per (query token, head) with an online softmax over the token's
 * window, 32 kv positions a step (a lane scores one position; the lanes then split head_dim to
 * add the values), so it needs no score buffer however long the context: correct and simple,
 * not tuned (gpt-oss's decode runs op by op anyway). Without sinks and window it is the plain
 * causal attention, which deepseek2's MLA takes for its 576-wide rows (attention.cu stops at
 * head_dim 256). */
#include "engine/cuda/common.cuh"

#include <math.h>

#define SINK_WARPS 4   /* (token, head) pairs a CTA */
#define SINK_MAX_HD 576 /* head_dim / 32 values a lane: up to deepseek2's MLA rows (512 + 64) */
#define ROPE_MAX_PAIRS 256

/* A warp per (token t, head h): t at position pos + t attends to t0..p. The softmax's maximum
 * starts at the sink's logit and its denominator at exp(sink - max) (the sink adds no value
 * row), as cpu_attention_sinks does. */
__global__ void __launch_bounds__(SINK_WARPS * 32)
attention_sinks_kernel(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
                       float *__restrict__ out, int n, int pos, int n_head, int n_head_kv, int hd,
                       const float *__restrict__ sinks, int window)
{
    extern __shared__ float sq[]; /* SINK_WARPS query heads */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gw = blockIdx.x * SINK_WARPS + warp;
    if (gw >= n * n_head)
        return;
    int t = gw / n_head, h = gw % n_head, p = pos + t;
    int t0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    int kvd = n_head_kv * hd, kvh = h / (n_head / n_head_kv), per = hd / 32;
    float scale = 1.0f / sqrtf((float)hd);
    float *qs = sq + (size_t)warp * hd;
    const float *qh = q + ((size_t)t * n_head + h) * hd;
    for (int i = lane; i < hd; i += 32)
        qs[i] = qh[i];
    __syncwarp();
    float mx = sinks ? sinks[h] : -INFINITY, sum = sinks ? 1.0f : 0.0f;
    float o[SINK_MAX_HD / 32];
#pragma unroll
    for (int k = 0; k < SINK_MAX_HD / 32; k++)
        o[k] = 0.0f;
    for (int c0 = t0; c0 <= p; c0 += 32) {
        int tt = c0 + lane;
        float s = -INFINITY;
        if (tt <= p) {
            const float4 *kr = (const float4 *)(kc + (size_t)tt * kvd + (size_t)kvh * hd);
            const float4 *q4 = (const float4 *)qs;
            float d = 0.0f;
            for (int i = 0; i < hd / 4; i++) {
                float4 a = __ldg(kr + i), b = q4[i];
                d += b.x * a.x + b.y * a.y + b.z * a.z + b.w * a.w;
            }
            s = d * scale;
        }
        float m_new = fmaxf(mx, warp_max(s));
        float corr = expf(mx - m_new); /* mx -inf (no sink, first step): 0 */
        float e = tt <= p ? expf(s - m_new) : 0.0f;
        sum = sum * corr + warp_sum(e);
#pragma unroll
        for (int k = 0; k < SINK_MAX_HD / 32; k++)
            o[k] *= corr;
        int cnt = p - c0 + 1 < 32 ? p - c0 + 1 : 32;
        for (int j = 0; j < cnt; j++) {
            float pj = __shfl_sync(0xffffffffu, e, j);
            const float *vr = vc + (size_t)(c0 + j) * kvd + (size_t)kvh * hd;
#pragma unroll
            for (int k = 0; k < SINK_MAX_HD / 32; k++)
                if (k < per)
                    o[k] = fmaf(pj, __ldg(vr + lane + 32 * k), o[k]);
        }
        mx = m_new;
    }
    float inv = 1.0f / sum;
    float *oh = out + ((size_t)t * n_head + h) * hd;
#pragma unroll
    for (int k = 0; k < SINK_MAX_HD / 32; k++)
        if (k < per)
            oh[lane + 32 * k] = o[k] * inv;
}

void cuda_attention_sinks(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                          int n_head_kv, int head_dim, const float *sinks, int window)
{
    (void)att;
    (void)block_rows;
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0)
        return;
    if (f16 || blocks) { /* attention_sinks_any_cache is false here: the forward keeps f32 slots */
        cuda_fail(c, cudaErrorInvalidValue, "attention_sinks: f32 contiguous caches only", __FILE__, __LINE__);
        return;
    }
    if (head_dim % 32 || head_dim > SINK_MAX_HD || n_head_kv <= 0 || n_head % n_head_kv) {
        cuda_fail(c, cudaErrorInvalidValue, "attention_sinks: head_dim not a multiple of 32 up to 576", __FILE__,
                  __LINE__);
        return;
    }
    unsigned grid = (unsigned)(((size_t)n * n_head + SINK_WARPS - 1) / SINK_WARPS);
    size_t sm = sizeof(float) * SINK_WARPS * (size_t)head_dim;
    attention_sinks_kernel<<<grid, SINK_WARPS * 32, sm, c->st>>>(q, (const float *)k_cache, (const float *)v_cache,
                                                                 out, n, pos, n_head, n_head_kv, head_dim, sinks,
                                                                 window);
    CU_LAUNCH(c, "attention_sinks_kernel");
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
