/* backend_cpu_oai.c - the CPU backend's ops for gpt-oss: causal attention with a learned
 * per-head sink logit and an optional sliding window, rope with a frequency per pair (yarn),
 * and the clamped SwiGLU (the CUDA twins are engine/cuda/oai_ops.cu). The sink attention also
 * serves deepseek2's MLA heads wider than the plain attention takes (forward_mla.c). */
#include "engine/backend_cpu_oai.h"
#include "engine/backend_cpu_attention.h" /* cpu_claim */

#include <math.h>
#include <string.h>

/* sink_heads twice: for AVX2 (x86-64-v3) and for any x86-64, chosen at load time; its loops are
 * lanes the compiler makes vectors of (8 floats in AVX2, 4 without), each lane the same chain
 * of multiplies and adds, so both give the same bits. Not under ThreadSanitizer (make tsan):
 * the clones' ifunc resolvers run before its runtime is up (as backend_cpu_attention.c). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SINK_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SINK_KERNEL
#endif

struct sink_job {
    const float *q, *k_cache, *v_cache, *sinks;
    float *out, *att;
    int p, t0, n_head, n_head_kv, head_dim;
    int next; /* the first head no thread has claimed (cpu_claim) */
};

/* a . b over n floats in eight partial sums (lane l takes elements l, l + 8, ...; a tail past a
 * multiple of 8 goes to its lanes too), added pairwise at the end: the lanes are independent
 * chains the compiler keeps in one vector register (a single running sum was one dependent add
 * per element), and with contraction off (-std=c11) every build gives the same bits. */
static inline float dot_lanes8(const float *a, const float *b, int n)
{
    float s[8] = {0};
    int n8 = n / 8 * 8;
    for (int i = 0; i < n8; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += a[i + l] * b[i + l];
    for (int i = n8; i < n; i++)
        s[i - n8] += a[i] * b[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* o += w v over n floats, eight at a time (restrict: o is the output, v a cache row, never the
 * same memory, which lets the compiler keep the eight in a vector) */
static inline void axpy_lanes8(float *restrict o, const float *restrict v, float w, int n)
{
    int n8 = n / 8 * 8;
    for (int i = 0; i < n8; i += 8)
        for (int l = 0; l < 8; l++)
            o[i + l] += w * v[i + l];
    for (int i = n8; i < n; i++)
        o[i] += w * v[i];
}

/* Heads [h0, h1) of one query token at position p over kv positions t0..p: scores, then a
 * softmax whose maximum and denominator include the head's sink (exp(sink - max)), the sink
 * adding no value row. Head h keeps its scores at att + h * (p + 1), inside the (n_head, n_ctx)
 * scratch, so threads never share a row. */
SINK_KERNEL static void sink_heads(const struct sink_job *j, int h0, int h1)
{
    int hd = j->head_dim, kvd = j->n_head_kv * hd, group = j->n_head / j->n_head_kv, p = j->p, t0 = j->t0;
    float scale = 1.0f / sqrtf((float)hd);
    for (int h = h0; h < h1; h++) {
        const float *qh = j->q + (size_t)h * hd;
        int kvh = h / group;
        float *a = j->att + (size_t)h * (p + 1);
        float mx = j->sinks ? j->sinks[h] : -INFINITY;
        for (int t = t0; t <= p; t++) {
            const float *kt = j->k_cache + (size_t)t * kvd + (size_t)kvh * hd;
            a[t - t0] = dot_lanes8(qh, kt, hd) * scale;
            if (a[t - t0] > mx)
                mx = a[t - t0];
        }
        float sum = j->sinks ? expf(j->sinks[h] - mx) : 0.0f;
        for (int t = t0; t <= p; t++) {
            a[t - t0] = expf(a[t - t0] - mx);
            sum += a[t - t0];
        }
        float *o = j->out + (size_t)h * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int t = t0; t <= p; t++) {
            const float *vt = j->v_cache + (size_t)t * kvd + (size_t)kvh * hd;
            axpy_lanes8(o, vt, a[t - t0] / sum, hd);
        }
    }
}

/* The pool's threads claim heads one at a time: a thread may join late or not at all
 * (backend_cpu.c's pool), so no fixed share is anyone's. */
static void sink_worker(void *arg, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct sink_job *j = arg;
    for (int h; (h = cpu_claim(&j->next, 1, j->n_head)) >= 0;)
        sink_heads(j, h, h + 1);
}

/* Token by token: each has its own window; its heads spread over the threads once the window
 * is long enough to pay for waking them (as the plain attention does). */
void cpu_attention_sinks(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                         float *att, int n, int pos, int n_head, int n_head_kv, int head_dim, const float *sinks,
                         int window)
{
    size_t qd = (size_t)n_head * head_dim;
    for (int t = 0; t < n; t++) {
        int p = pos + t, t0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        struct sink_job j = {q + t * qd, k_cache, v_cache, sinks, out + t * qd, att, p, t0, n_head, n_head_kv, head_dim, 0};
        if ((size_t)(p - t0 + 1) * (size_t)n_head * (size_t)head_dim < 32768)
            sink_heads(&j, 0, n_head);
        else
            backend_cpu_parallel(ctx, sink_worker, &j);
    }
}

/* Angles in double, as the plain rope's (backend_cpu.c): cos and sin scaled by mscale, as
 * llama.cpp's yarn does. Pair i is (i, i + half) for NEOX (gpt-oss), (2i, 2i + 1) for NORM
 * (deepseek2). */
void cpu_rope_freqs(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs, float mscale,
                    enum rope_kind kind)
{
    (void)ctx;
    int half = head_dim / 2, a0 = kind == ROPE_NEOX ? 1 : 2, a1 = kind == ROPE_NEOX ? half : 1;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)(pos + t) * freqs[i];
            float cs = (float)cos(a) * mscale, sn = (float)sin(a) * mscale;
            for (int h = 0; h < n_heads; h++) {
                float *v = vec + ((size_t)t * n_heads + h) * head_dim;
                float *p0 = v + a0 * i, *p1 = p0 + a1, x0 = *p0, x1 = *p1;
                *p0 = x0 * cs - x1 * sn;
                *p1 = x0 * sn + x1 * cs;
            }
        }
}

void cpu_swiglu_oai(void *ctx, float *gate, const float *up, int n, float alpha, float limit)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        float g = gate[i] < limit ? gate[i] : limit;
        float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        gate[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
}
