/* mrope.c - M-RoPE: the section each rotation pair takes its position from, the rotation,
 * and the position ids of a prompt with images (see mrope.h for the rules). */
#include "mrope.h"

#include "../common.h"

#include <math.h>

int mrope_section_of(const uint32_t sections[MROPE_N], bool interleaved, int pair)
{
    uint32_t total = sections[0] + sections[1] + sections[2] + sections[3];
    if (total == 0)
        return MROPE_T;
    /* the sections repeat when they cover fewer pairs than the head has (llama.cpp's sector) */
    uint32_t s = (uint32_t)pair % total;
    if (interleaved) { /* Qwen3-VL: t h w t h w ... while each section's count lasts */
        if (s % 3 == 1 && s < 3 * sections[1]) return MROPE_H;
        if (s % 3 == 2 && s < 3 * sections[2]) return MROPE_W;
        if (s % 3 == 0 && s < 3 * sections[0]) return MROPE_T;
        return MROPE_E;
    }
    if (s < sections[0]) return MROPE_T;
    if (s < sections[0] + sections[1]) return MROPE_H;
    if (s < sections[0] + sections[1] + sections[2]) return MROPE_W;
    return MROPE_E;
}

/* Pair (i, i + head_dim/2) of each of a token's n_heads heads (at vec) turned by the angle whose
 * cosine and sine are cs, sn (the NEOX pairs both rotations here use). */
static void rotate_heads_pair(float *vec, int n_heads, int head_dim, int i, float cs, float sn)
{
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs - x1 * sn;
        v[i + half] = x0 * sn + x1 * cs;
    }
}

void mrope_rotate(float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta,
                  const uint32_t sections[MROPE_N], bool interleaved)
{
    int half = head_dim / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double freq = pow((double)theta, -2.0 * i / head_dim);
            double a = pos[(size_t)t * MROPE_N + mrope_section_of(sections, interleaved, i)] * freq;
            float cs = (float)cos(a), sn = (float)sin(a);
            rotate_heads_pair(vec + (size_t)t * n_heads * head_dim, n_heads, head_dim, i, cs, sn);
        }
}

void rope2d_rotate(float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta)
{
    int half = head_dim / 2, quarter = head_dim / 4;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            int j = i < quarter ? i : i - quarter;
            double a = pos[2 * t + (i < quarter ? 0 : 1)] * pow((double)theta, -4.0 * j / head_dim);
            float cs = (float)cos(a), sn = (float)sin(a);
            rotate_heads_pair(vec + (size_t)t * n_heads * head_dim, n_heads, head_dim, i, cs, sn);
        }
}

int64_t mrope_positions(uint32_t n_tokens, int64_t p0, const struct mrope_image *images, size_t n_images,
                        int32_t *pos)
{
    int64_t p = p0;
    uint32_t t = 0;
    for (size_t k = 0; k <= n_images; k++) {
        uint32_t end = k < n_images ? images[k].at : n_tokens;
        if (end < t || end > n_tokens)
            return TIDE_EINVAL;
        for (; t < end; t++, p++) /* text: the same id in every section */
            for (int s = 0; s < MROPE_N; s++)
                pos[(size_t)t * MROPE_N + s] = (int32_t)p;
        if (k == n_images)
            break;
        const struct mrope_image *im = &images[k];
        uint64_t cnt = (uint64_t)im->nx * im->ny;
        if (cnt == 0 || cnt > n_tokens - t)
            return TIDE_EINVAL;
        for (uint32_t r = 0; r < im->ny; r++)
            for (uint32_t c = 0; c < im->nx; c++, t++) {
                int32_t *q = pos + (size_t)t * MROPE_N;
                q[MROPE_T] = (int32_t)p;
                q[MROPE_H] = (int32_t)(p + r);
                q[MROPE_W] = (int32_t)(p + c);
                q[MROPE_E] = 0;
            }
        p += im->nx > im->ny ? im->nx : im->ny;
    }
    if (p > INT32_MAX)
        return TIDE_EINVAL;
    return p;
}
