/* backend_cpu_oai.c - the CPU backend's ops for gpt-oss: causal attention with a learned
 * per-head sink logit and an optional sliding window, rope with a frequency per pair (yarn),
 * and the clamped SwiGLU. Plain loops on
 * the engine thread: gpt-oss runs on CPU devices only for now (docs/MODELS.md). */
#include "engine/backend_cpu_oai.h"

#include <math.h>
#include <string.h>

/* Token by token, head by head: scores over the token's window, then a softmax whose
 * maximum and denominator include the head's sink (exp(sink - max)), the sink adding no
 * value row. att (n_head, n_ctx) is scratch: head h's scores at att + h * n_ctx would do,
 * but one row is enough here, reused per head. */
void cpu_attention_sinks(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                         float *att, int n, int pos, int n_head, int n_head_kv, int head_dim, const float *sinks,
                         int window)
{
    (void)ctx;
    int kvd = n_head_kv * head_dim, group = n_head / n_head_kv;
    size_t qd = (size_t)n_head * head_dim;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int t = 0; t < n; t++) {
        int p = pos + t, t0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + t * qd + (size_t)h * head_dim;
            int kvh = h / group;
            float mx = sinks ? sinks[h] : -INFINITY;
            for (int j = t0; j <= p; j++) {
                const float *kj = k_cache + (size_t)j * kvd + (size_t)kvh * head_dim;
                float d = 0;
                for (int i = 0; i < head_dim; i++)
                    d += qh[i] * kj[i];
                att[j - t0] = d * scale;
                if (att[j - t0] > mx)
                    mx = att[j - t0];
            }
            float sum = sinks ? expf(sinks[h] - mx) : 0.0f;
            for (int j = t0; j <= p; j++) {
                att[j - t0] = expf(att[j - t0] - mx);
                sum += att[j - t0];
            }
            float *o = out + t * qd + (size_t)h * head_dim;
            memset(o, 0, sizeof(float) * (size_t)head_dim);
            for (int j = t0; j <= p; j++) {
                const float *vj = v_cache + (size_t)j * kvd + (size_t)kvh * head_dim;
                float w = att[j - t0] / sum;
                for (int i = 0; i < head_dim; i++)
                    o[i] += w * vj[i];
            }
        }
    }
}

/* Angles in double, as the plain rope's (backend_cpu.c): cos and sin scaled by mscale, as
 * llama.cpp's yarn does. */
void cpu_rope_freqs(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs, float mscale)
{
    (void)ctx;
    int half = head_dim / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)(pos + t) * freqs[i];
            float cs = (float)cos(a) * mscale, sn = (float)sin(a) * mscale;
            for (int h = 0; h < n_heads; h++) {
                float *v = vec + ((size_t)t * n_heads + h) * head_dim;
                float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * cs - x1 * sn;
                v[i + half] = x0 * sn + x1 * cs;
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
