/* ref_attention.h - the decode emulators' reference: one head's causal attention in double over
 * an f32 or f16 KV cache (attn_decode_emu.cpp and paged_attn_emu.cpp check the kernels against
 * it). Include after engine/cuda/common.cuh's stand-in (its __half) and tide's f16 conversion. */
#ifndef TIDE_EMU_REF_ATTENTION_H
#define TIDE_EMU_REF_ATTENTION_H

#include <math.h>
#include <vector>

static inline double from_cache(float v) { return v; }
static inline double from_cache(__half h) { return tide_f16_to_f32(h.bits); }

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
