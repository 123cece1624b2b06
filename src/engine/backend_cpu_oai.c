/* backend_cpu_oai.c - the CPU backend's ops for gpt-oss: rope with a frequency per pair (yarn)
 * and the clamped SwiGLU (the CUDA twins are engine/cuda/oai_ops.cu). Its attention, with a
 * learned per-head sink logit and an optional sliding window, is the plain attention's code
 * (backend_cpu_attention.c, cpu_attention_sinks). */
#include "engine/backend_cpu_oai.h"

#include <math.h>

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
