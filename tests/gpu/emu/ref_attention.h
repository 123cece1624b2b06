/* ref_attention.h - the attention emulators' inputs and reference: a seeded xorshift (frand,
 * rnd), cache elements of either type (to_cache, from_cache), aligned buffers (alloc), and one
 * head's causal attention in double over an f32 or f16 KV cache (attn_decode_emu.cpp and
 * paged_attn_emu.cpp check the kernels against it; sinks_attn_emu.cpp adds sinks and windows).
 * Include after engine/cuda/common.cuh's stand-in (its __half) and tide's f16 conversion, once
 * per program (the generator's state is a static). */
#ifndef TIDE_EMU_REF_ATTENTION_H
#define TIDE_EMU_REF_ATTENTION_H

#include <math.h>
#include <vector>

static uint64_t rs = 88172645463325252ull;
static inline double frand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) / 9007199254740992.0 * 2 - 1; }
static inline uint64_t rnd(uint64_t n) { frand(); return (rs >> 7) % n; }

template <typename T> static T to_cache(float v);
template <> inline float to_cache<float>(float v) { return v; }
template <> inline __half to_cache<__half>(float v) { return {tide_f32_to_f16(v)}; }
static inline double from_cache(float v) { return v; }
static inline double from_cache(__half h) { return tide_f16_to_f32(h.bits); }

template <typename T> static T *alloc(size_t n) { return (T *)aligned_alloc(64, (n * sizeof(T) + 63) & ~(size_t)63); }

enum { REF_MAX_HD = 512 }; /* the widest head the emulators test (callers size o by it) */

/* o[i] for i < hd (<= REF_MAX_HD): softmax(q . k_t * scale) . v_t over rows t < nk of K and V, KV head kvh of
 * kvd elements a row */
template <typename T>
static void ref_attention_head(const float *qh, const T *K, const T *V, int nk, size_t kvd, int kvh, int hd,
                               double scale, double *o)
{
    std::vector<double> s(nk);
    double m = -INFINITY, l = 0;
    for (int t = 0; t < nk; t++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)qh[i] * from_cache(K[t * kvd + (size_t)kvh * hd + i]);
        s[t] = d * scale;
        m = fmax(m, s[t]);
    }
    for (int t = 0; t < nk; t++) l += s[t] = exp(s[t] - m);
    for (int i = 0; i < hd; i++) {
        o[i] = 0;
        for (int t = 0; t < nk; t++) o[i] += s[t] * from_cache(V[t * kvd + (size_t)kvh * hd + i]);
        o[i] /= l;
    }
}

#endif
