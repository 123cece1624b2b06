/* cpu_quant_isums.c - the integer step of cpu_quant.c's dot products (cpu_quant_isums.h):
 * per block, the exact integers (codes times activation codes, weighted by the integer
 * sub-block scales) that cpu_quant.c's combine turns into the float result. The scalar kernels
 * define the integers; the AVX2 ones give the same integers, 32 codes an instruction, and
 * AVX2's cpu_quant_act for 32-value blocks lives here too. Integer sums are exact, so which
 * kernel ran never changes a result's bits. */
#include "cpu_quant_isums.h"
#include "gguf.h"
#include "quants.h"

#include <string.h>

/* no fused multiply-adds (quant_act32_avx2's scale must round as cpu_quant_act's does; gcc
 * keeps fp-contract off under -std=c11; clang needs telling) */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A q4_K/q5_K block's eight 6-bit scales and mins (the layout q4k_scale_min reads one by
 * one), all at once and without branches: the kernels' hot path. */
static inline void k_scales_mins(const uint8_t *sc, int16_t s[8], int16_t m[8])
{
    for (int j = 0; j < 4; j++) {
        s[j] = sc[j] & 63;
        m[j] = sc[j + 4] & 63;
        s[j + 4] = (int16_t)((sc[j + 8] & 0x0f) | ((sc[j] >> 6) << 4));
        m[j + 4] = (int16_t)((sc[j + 8] >> 4) | ((sc[j + 4] >> 6) << 4));
    }
}

/* ---------------- scalar integer kernels: one (or two) int32 per block ---------------- */

static void isum_q8_0(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    for (int b = 0; b < nb; b++, w += 34) {
        int32_t a = 0;
        for (int j = 0; j < QB; j++)
            a += (int8_t)w[2 + j] * x[b].q[j];
        out[b] = a;
    }
}

static void isum_q4_0(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    for (int b = 0; b < nb; b++, w += 18) {
        int32_t a = 0;
        for (int j = 0; j < 16; j++)
            a += ((w[2 + j] & 0x0f) - 8) * x[b].q[j] + ((w[2 + j] >> 4) - 8) * x[b].q[j + 16];
        out[b] = a;
    }
}

/* q5_0 (out: sum of (q - 16) x) and q5_1 (out: sum of q x, then sum of x). */
static void isum_q5(const uint8_t *w, const struct act32 *x, int nb, int32_t *out, bool with_min)
{
    size_t bb = with_min ? Q5_1_BYTES : Q5_0_BYTES;
    int off = with_min ? 4 : 2, bias = with_min ? 0 : 16;
    for (int b = 0; b < nb; b++, w += bb) {
        uint32_t qh = rd32(w + off);
        const uint8_t *q = w + off + 4;
        int32_t a = 0, s = 0;
        for (int j = 0; j < 16; j++) {
            int v0 = ((q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4)) - bias;
            int v1 = ((q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - bias;
            a += v0 * x[b].q[j] + v1 * x[b].q[j + 16];
            s += x[b].q[j] + x[b].q[j + 16];
        }
        if (with_min) {
            out[2 * b] = a;
            out[2 * b + 1] = s;
        } else {
            out[b] = a;
        }
    }
}

static void isum_mxfp4(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    for (int b = 0; b < nb; b++, w += MXFP4_BYTES) {
        int32_t a = 0;
        for (int j = 0; j < 16; j++)
            a += mxfp4_values[w[1 + j] & 0x0f] * x[b].q[j] + mxfp4_values[w[1 + j] >> 4] * x[b].q[j + 16];
        out[b] = a;
    }
}

/* q4_K / q5_K: out[2b] the sum over sub-blocks of scale * (codes . x), out[2b + 1] that of
 * min * (sum of x). */
static void isum_q45_k(const uint8_t *w, const struct act256 *x, int nb, int32_t *out, bool five)
{
    size_t bb = five ? Q5_K_BYTES : Q4_K_BYTES;
    for (int b = 0; b < nb; b++, w += bb) {
        const uint8_t *qh = w + 16, *q = w + (five ? 48 : 16);
        const int8_t *y = x[b].q;
        int32_t a = 0, mins = 0;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            int s0, m0, s1, m1;
            q4k_scale_min(w + 4, 2 * c, &s0, &m0);
            q4k_scale_min(w + 4, 2 * c + 1, &s1, &m1);
            mins += m0 * (x[b].bsum[4 * c] + x[b].bsum[4 * c + 1]) + m1 * (x[b].bsum[4 * c + 2] + x[b].bsum[4 * c + 3]);
            int32_t a0 = 0, a1 = 0;
            for (int l = 0; l < 32; l++) {
                int v0 = q[l] & 0x0f, v1 = q[l] >> 4;
                if (five) {
                    v0 |= ((qh[l] >> (2 * c)) & 1) << 4;
                    v1 |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                a0 += v0 * y[l];
                a1 += v1 * y[l + 32];
            }
            a += s0 * a0 + s1 * a1;
        }
        out[2 * b] = a;
        out[2 * b + 1] = mins;
    }
}

/* q6_K: sum over the 16 sub-blocks of scale * (unsigned 6-bit codes . x); the -32 offset is
 * the combine's. */
static void isum_q6_k(const uint8_t *w, const struct act256 *x, int nb, int32_t *out)
{
    for (int b = 0; b < nb; b++, w += Q6_K_BYTES) {
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t a = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            const int8_t *y = x[b].q + 128 * h;
            for (int k = 0; k < 4; k++) {
                for (int half = 0; half < 2; half++) {
                    int32_t s = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int lo = k & 1 ? ql[l + 32] : ql[l];
                        int v = (k & 2 ? lo >> 4 : lo & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4);
                        s += v * y[32 * k + l];
                    }
                    a += sc[8 * h + 2 * k + half] * s;
                }
            }
        }
        out[b] = a;
    }
}

static void isum_iq4_xs(const uint8_t *w, const struct act256 *x, int nb, int32_t *out)
{
    for (int b = 0; b < nb; b++, w += IQ4_XS_BYTES) {
        int32_t a = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = w + 8 + 16 * j;
            const int8_t *y = x[b].q + 32 * j;
            int32_t s = 0;
            for (int l = 0; l < 16; l++)
                s += iq4nl_values[q[l] & 0x0f] * y[l] + iq4nl_values[q[l] >> 4] * y[l + 16];
            a += iq4xs_scale(w, j) * s;
        }
        out[b] = a;
    }
}

void quant_isums_scalar(uint32_t type, const uint8_t *w, const void *act, int nb, int32_t *out)
{
    if (nb < 1 || nb > ISUM_CHUNK) /* the contract; it lets the compiler size the loops */
        __builtin_unreachable();
    switch (type) {
    case GGML_TYPE_Q8_0: isum_q8_0(w, act, nb, out); break;
    case GGML_TYPE_Q4_0: isum_q4_0(w, act, nb, out); break;
    case GGML_TYPE_Q5_0: isum_q5(w, act, nb, out, false); break;
    case GGML_TYPE_Q5_1: isum_q5(w, act, nb, out, true); break;
    case GGML_TYPE_MXFP4: isum_mxfp4(w, act, nb, out); break;
    case GGML_TYPE_Q4_K: isum_q45_k(w, act, nb, out, false); break;
    case GGML_TYPE_Q5_K: isum_q45_k(w, act, nb, out, true); break;
    case GGML_TYPE_Q6_K: isum_q6_k(w, act, nb, out); break;
    case GGML_TYPE_IQ4_XS: isum_iq4_xs(w, act, nb, out); break;
    }
}

/* ---------------- AVX2 integer kernels: the same integers, 32 codes an instruction ----------------
 * Products are byte pairs summed to int16 (_mm256_maddubs_epi16, unsigned x signed): the
 * weights' codes are made unsigned, or for signed codes the sign is moved onto the
 * activation (|w| * sign(w) x), which is exact because activations are within +-127. No int16
 * sum can saturate: at most 2 * 127 * 127. */
#if CPU_QUANT_AVX2
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))

/* sum of unsigned u times signed s, as eight int32 */
AVX2 static inline __m256i dot_us(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* sum of signed w times signed x */
AVX2 static inline __m256i dot_ss(__m256i w, __m256i x)
{
    return dot_us(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}
/* the same, each 16-value half weighted by its int16 scale */
AVX2 static inline __m256i dot_us_scaled(__m256i u, __m256i s, __m256i scale16)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}
AVX2 static inline int32_t hsum8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* the lane sums of eight vectors, as one vector (v[k]'s sum in lane k) */
AVX2 static inline __m256i hsum8x8(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
/* 16 bytes of nibbles as 32 bytes: the low nibbles (values 0-15), then the high ones */
AVX2 static inline __m256i nibbles32(const uint8_t *q)
{
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}
/* bit k of a 32-bit word as byte k: 0x10 where set, 0 where not */
AVX2 static inline __m256i fifth_bits(uint32_t qh)
{
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

/* 32-value blocks, eight at a time; fn makes block b's eight partial int32 sums */
#define BLOCKS8(nb, out, expr)                                           \
    do {                                                                 \
        int b_ = 0;                                                      \
        for (; b_ + 8 <= (nb); b_ += 8) {                                \
            __m256i v_[8];                                               \
            for (int k_ = 0; k_ < 8; k_++) {                             \
                int b = b_ + k_;                                         \
                v_[k_] = (expr);                                         \
            }                                                            \
            _mm256_storeu_si256((__m256i *)((out) + b_), hsum8x8(v_));   \
        }                                                                \
        for (; b_ < (nb); b_++) {                                        \
            int b = b_;                                                  \
            (out)[b_] = hsum8(expr);                                     \
        }                                                                \
    } while (0)

#define XQ(b) _mm256_loadu_si256((const __m256i *)x[b].q)

AVX2 static void avx2_q8_0(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    BLOCKS8(nb, out, dot_ss(_mm256_loadu_si256((const __m256i *)(w + 34 * (size_t)b + 2)), XQ(b)));
}

AVX2 static void avx2_q4_0(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    const __m256i eight = _mm256_set1_epi8(8);
    BLOCKS8(nb, out, dot_ss(_mm256_sub_epi8(nibbles32(w + 18 * (size_t)b + 2), eight), XQ(b)));
}

AVX2 static inline __m256i q5_codes(const uint8_t *blk, int off)
{
    return _mm256_or_si256(nibbles32(blk + off + 4), fifth_bits(rd32(blk + off)));
}

AVX2 static void avx2_q5_0(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    const __m256i sixteen = _mm256_set1_epi8(16);
    BLOCKS8(nb, out, dot_ss(_mm256_sub_epi8(q5_codes(w + Q5_0_BYTES * (size_t)b, 2), sixteen), XQ(b)));
}

AVX2 static void avx2_q5_1(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    int32_t a[ISUM_CHUNK], s[ISUM_CHUNK];
    const __m256i ones = _mm256_set1_epi8(1);
    BLOCKS8(nb, a, dot_us(q5_codes(w + Q5_1_BYTES * (size_t)b, 4), XQ(b)));
    BLOCKS8(nb, s, dot_us(ones, XQ(b)));
    for (int b = 0; b < nb; b++) {
        out[2 * b] = a[b];
        out[2 * b + 1] = s[b];
    }
}

AVX2 static inline __m256i table16(const int8_t *t, __m256i idx)
{
    __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
    return _mm256_shuffle_epi8(tab, idx);
}

AVX2 static void avx2_mxfp4(const uint8_t *w, const struct act32 *x, int nb, int32_t *out)
{
    BLOCKS8(nb, out, dot_ss(table16(mxfp4_values, nibbles32(w + MXFP4_BYTES * (size_t)b + 1)), XQ(b)));
}

AVX2 static void avx2_q45_k(const uint8_t *w, const struct act256 *x, int nb, int32_t *out, bool five)
{
    const __m256i low = _mm256_set1_epi8(0x0f);
    size_t bb = five ? Q5_K_BYTES : Q4_K_BYTES;
    for (int b = 0; b < nb; b++, w += bb) {
        const uint8_t *q = w + (five ? 48 : 16);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        __m256i acc = _mm256_setzero_si256();
        int16_t sc[8], mn[8], mn16[16];
        k_scales_mins(w + 4, sc, mn);
        for (int j = 0; j < 16; j++) mn16[j] = mn[j / 2];
        out[2 * b + 1] = hsum8(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[b].bsum),
                                                 _mm256_loadu_si256((const __m256i *)mn16)));
        for (int c = 0; c < 4; c++) {
            int s0 = sc[2 * c], s1 = sc[2 * c + 1];
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (five) {
                __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(2 << (2 * c)));
                __m256i h16 = _mm256_set1_epi8(0x10);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), h16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), h16));
            }
            const __m256i *y = (const __m256i *)(x[b].q + 64 * c);
            acc = _mm256_add_epi32(acc, dot_us_scaled(lo, _mm256_loadu_si256(y), _mm256_set1_epi16((short)s0)));
            acc = _mm256_add_epi32(acc, dot_us_scaled(hi, _mm256_loadu_si256(y + 1), _mm256_set1_epi16((short)s1)));
        }
        out[2 * b] = hsum8(acc);
    }
}

AVX2 static void avx2_q6_k(const uint8_t *w, const struct act256 *x, int nb, int32_t *out)
{
    const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    for (int b = 0; b < nb; b++, w += Q6_K_BYTES) {
        const int8_t *sc = (const int8_t *)(w + 192);
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i v[4];
            v[0] = _mm256_and_si256(l0, low);
            v[1] = _mm256_and_si256(l1, low);
            v[2] = _mm256_and_si256(_mm256_srli_epi16(l0, 4), low);
            v[3] = _mm256_and_si256(_mm256_srli_epi16(l1, 4), low);
            for (int k = 0; k < 4; k++) {
                __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two);
                __m256i codes = _mm256_or_si256(v[k], _mm256_slli_epi16(hb, 4));
                __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[8 * h + 2 * k + 1]),
                                                 _mm_set1_epi16(sc[8 * h + 2 * k]));
                __m256i y = _mm256_loadu_si256((const __m256i *)(x[b].q + 128 * h + 32 * k));
                acc = _mm256_add_epi32(acc, dot_us_scaled(codes, y, scale));
            }
        }
        out[b] = hsum8(acc);
    }
}

AVX2 static void avx2_iq4_xs(const uint8_t *w, const struct act256 *x, int nb, int32_t *out)
{
    for (int b = 0; b < nb; b++, w += IQ4_XS_BYTES) {
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i wv = table16(iq4nl_values, nibbles32(w + 8 + 16 * j));
            __m256i y = _mm256_loadu_si256((const __m256i *)(x[b].q + 32 * j));
            __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(y, wv));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)iq4xs_scale(w, j))));
        }
        out[b] = hsum8(acc);
    }
}

/* One activation vector against an unpacked super-block: the codes' sum (returned) and the
 * 16-value sums weighted by offw (*off). */
AVX2 int32_t quant_dot_unpacked_avx2(const struct unpacked256 *u, const struct act256 *xa, int32_t *off)
{
    const int8_t *x = xa->q;
    *off = hsum8(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xa->bsum),
                                   _mm256_loadu_si256((const __m256i *)u->offw)));
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(u->codes + 32 * k));
        __m256i y = _mm256_loadu_si256((const __m256i *)(x + 32 * k));
        __m256i p = u->is_signed ? _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(y, w))
                                 : _mm256_maddubs_epi16(w, y);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_loadu_si256((const __m256i *)u->scalev[k])));
    }
    return hsum8(acc);
}

/* cpu_quant_act's 32-value form, 32 values an iteration: the same bytes (the max of |v| is
 * exact; v * id is one rounded product either way; vcvtps2dq rounds to nearest even as lrintf
 * does in the default mode; |v * id| < 127.5, so the saturating packs never clip). */
AVX2 void quant_act32_avx2(const float *x, int nb, struct act32 *o)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < nb; b++) {
        const float *v = x + b * QB;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
               v3 = _mm256_loadu_ps(v + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        o[b].d = tide_f32_to_f16(d);
        __m256 s = _mm256_set1_ps(id);
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, s)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, s));
        __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, s)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, s));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
        /* packs interleave the 128-bit lanes: put the bytes back in order */
        __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)o[b].q, q);
        o[b].sum = (int16_t)hsum8(sum);
    }
}

AVX2 void quant_isums_avx2(uint32_t type, const uint8_t *w, const void *act, int nb, int32_t *out)
{
    if (nb < 1 || nb > ISUM_CHUNK) /* the contract; it lets the compiler size the loops */
        __builtin_unreachable();
    switch (type) {
    case GGML_TYPE_Q8_0: avx2_q8_0(w, act, nb, out); break;
    case GGML_TYPE_Q4_0: avx2_q4_0(w, act, nb, out); break;
    case GGML_TYPE_Q5_0: avx2_q5_0(w, act, nb, out); break;
    case GGML_TYPE_Q5_1: avx2_q5_1(w, act, nb, out); break;
    case GGML_TYPE_MXFP4: avx2_mxfp4(w, act, nb, out); break;
    case GGML_TYPE_Q4_K: avx2_q45_k(w, act, nb, out, false); break;
    case GGML_TYPE_Q5_K: avx2_q45_k(w, act, nb, out, true); break;
    case GGML_TYPE_Q6_K: avx2_q6_k(w, act, nb, out); break;
    case GGML_TYPE_IQ4_XS: avx2_iq4_xs(w, act, nb, out); break;
    }
}
#endif
