/* backend_cpu_vision.c - the CPU backend's ops for the vision encoder (see backend.h's
 * "vision encoder" slots). These are the loops src/vision/clip.c ran itself before the
 * encoder went through the backend table, unchanged, so CPU embeddings keep their bits. */
#include "engine/backend_cpu_vision.h"
#include "engine/mrope.h"

#include <math.h>
#include <string.h>

/* ggml_norm then * w + b: (x - mean) / sqrt(var + eps), per row of D; mean and variance in
 * double. In place is fine: a row's sums are done before any of it is written. */
void cpu_layernorm(void *ctx, const float *x, float *y, const float *w, const float *b, int n, int D, float eps)
{
    (void)ctx;
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * D;
        float *yr = y + (size_t)t * D;
        double mean = 0, var = 0;
        for (int i = 0; i < D; i++) mean += xr[i];
        mean /= D;
        for (int i = 0; i < D; i++) var += (xr[i] - mean) * (xr[i] - mean);
        var /= D;
        float inv = (float)(1.0 / sqrt(var + eps));
        for (int i = 0; i < D; i++) {
            float v = (float)(xr[i] - mean) * inv;
            if (w) v *= w[i];
            if (b) v += b[i];
            yr[i] = v;
        }
    }
}

void cpu_add_bias(void *ctx, float *y, const float *b, int n, int dim)
{
    (void)ctx;
    if (!b) return;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

void cpu_rope_2d(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta)
{
    (void)ctx;
    rope2d_rotate(vec, n, n_heads, head_dim, pos, theta);
}

void cpu_activate(void *ctx, float *x, size_t n, enum act_kind act)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        switch (act) {
        case ACT_GELU:
            x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * v * (1.0f + 0.044715f * v * v)));
            break;
        case ACT_GELU_QUICK: x[i] = v / (1.0f + expf(-1.702f * v)); break;
        case ACT_SILU: x[i] = v / (1.0f + expf(-v)); break;
        }
    }
}

/* The matmul streams all n inputs past each weight row; blocks of 32 tokens keep a block in
 * L2 while the row streams (an image is hundreds of tokens; see clip.c). Each output is one
 * row dot either way, so the blocking changes no bits. */
#define ATT_BLOCK 32

static void matmul_blocked(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    const size_t cols = w->ne[0], rows = w->ne[1];
    for (int t0 = 0; t0 < n; t0 += ATT_BLOCK) {
        int nb = n - t0 < ATT_BLOCK ? n - t0 : ATT_BLOCK;
        backend_cpu_matmul(ctx, w, x + (size_t)t0 * cols, y + (size_t)t0 * rows, nb);
    }
}

/* One head at a time: the head's K and V^T are packed so that both products are the
 * backend's matmul over f32 views. */
void cpu_attention_full(void *ctx, const float *q, const float *k, const float *v, float *out, int P, int n_head,
                        int d, float *ws)
{
    const int A = n_head * d;
    const size_t hd = ((size_t)P * d + 15) / 16 * 16; /* as attention_full_ws_floats */
    float *kh = ws, *vt = ws + hd, *qh = ws + 2 * hd, *oh = ws + 3 * hd, *sc = ws + 4 * hd;
    float scale = 1.0f / sqrtf((float)d);
    for (int h = 0; h < n_head; h++) {
        for (int t = 0; t < P; t++) {
            memcpy(kh + (size_t)t * d, k + (size_t)t * A + (size_t)h * d, sizeof(float) * d);
            memcpy(qh + (size_t)t * d, q + (size_t)t * A + (size_t)h * d, sizeof(float) * d);
            for (int i = 0; i < d; i++) vt[(size_t)i * P + t] = v[(size_t)t * A + (size_t)h * d + i];
        }
        struct tensor K = {GGML_TYPE_F32, {(uint64_t)d, (uint64_t)P}, kh, sizeof(float) * d};
        struct tensor VT = {GGML_TYPE_F32, {(uint64_t)P, (uint64_t)d}, vt, sizeof(float) * P};
        matmul_blocked(ctx, &K, qh, sc, P);    /* sc (P queries, P keys) */
        for (int t = 0; t < P; t++) {
            float *r = sc + (size_t)t * P, mx = -INFINITY, sum = 0;
            for (int j = 0; j < P; j++) { r[j] *= scale; if (r[j] > mx) mx = r[j]; }
            for (int j = 0; j < P; j++) { r[j] = expf(r[j] - mx); sum += r[j]; }
            for (int j = 0; j < P; j++) r[j] /= sum;
        }
        matmul_blocked(ctx, &VT, sc, oh, P);   /* oh (P, d) */
        for (int t = 0; t < P; t++)
            memcpy(out + (size_t)t * A + (size_t)h * d, oh + (size_t)t * d, sizeof(float) * d);
    }
}
