/* quants.c - the ggml block formats: dequantise every weight type tide reads, and quantise
 * f32 into them (for the model tool and tests).
 *
 * The byte layouts are GGUF's, so files from other tools load as they are. The formats are
 * described where each is decoded; the order of the float operations in each dequantiser is
 * the one the format's reference uses (tests/quant/ref_dequant.py checks the bits). The
 * quantisers are plain (no error search): good enough for test models; files made by other
 * tools keep their own, better, choices. The int8 dot products over these blocks are
 * cpu_quant.c. */
#include "gguf.h"
#include "quants.h"

#include <math.h>
#include <string.h>

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- k-quants: super-blocks of 256 values ----
 * q4_K (144 bytes): f16 d, f16 dmin, 12 bytes holding eight 6-bit scales and eight 6-bit mins
 * (one pair per 32 values), 128 bytes of 4-bit values; x = d*scale*q - dmin*min.
 * q6_K (210 bytes): 128 bytes of low 4 bits, 64 bytes of high 2 bits, sixteen int8 scales (one
 * per 16 values), f16 d; x = d*scale*(q - 32). The byte layout is the GGUF one, so files from
 * other tools load as they are. */

/* Sub-block j's 6-bit scale and min of a q4_K block: the first four pairs sit in the low six
 * bits of bytes 0-7; the last four are split over bytes 8-11 and the top bits of bytes 0-7. */
void q4k_scale_min(const uint8_t *sc, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

static void dequant_q4_k(const uint8_t *b, float *y)
{
    float d = tide_f16_to_f32(rd16(b)), dmin = tide_f16_to_f32(rd16(b + 2));
    const uint8_t *sc = b + 4, *q = b + 16;
    for (int c = 0; c < 4; c++, q += 32, y += 64) { /* 64 values: low nibbles, then high */
        int s0, m0, s1, m1;
        q4k_scale_min(sc, 2 * c, &s0, &m0);
        q4k_scale_min(sc, 2 * c + 1, &s1, &m1);
        for (int l = 0; l < 32; l++) {
            y[l] = d * (float)s0 * (float)(q[l] & 0x0f) - dmin * (float)m0;
            y[l + 32] = d * (float)s1 * (float)(q[l] >> 4) - dmin * (float)m1;
        }
    }
}

static void dequant_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = tide_f16_to_f32(rd16(b + 208));
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

static void wr16(uint8_t *p, uint16_t v) { p[0] = v & 0xff; p[1] = v >> 8; }

/* A plain (not error-searching) q4_K quantiser: per 32 values min and range, then the scales
 * and mins themselves quantised to 6 bits against the block's largest. Good enough for test
 * models; files made by other tools keep their own, better, choices. */
static void quant_q4_k(const float *x, uint8_t *b)
{
    float scale[8], mn[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (lo > 0) lo = 0;
        scale[j] = (hi - lo) / 15.0f;
        mn[j] = -lo;
        smax = fmaxf(smax, scale[j]);
        mmax = fmaxf(mmax, mn[j]);
    }
    float d = smax / 63.0f, dmin = mmax / 63.0f;
    wr16(b, tide_f32_to_f16(d));
    wr16(b + 2, tide_f32_to_f16(dmin));
    d = tide_f16_to_f32(rd16(b));
    dmin = tide_f16_to_f32(rd16(b + 2));
    uint8_t *sc = b + 4, *q = b + 16;
    int is[8], im[8];
    for (int j = 0; j < 8; j++) {
        is[j] = d > 0 ? (int)lroundf(scale[j] / d) : 0;
        im[j] = dmin > 0 ? (int)lroundf(mn[j] / dmin) : 0;
        is[j] = is[j] > 63 ? 63 : is[j];
        im[j] = im[j] > 63 ? 63 : im[j];
    }
    memset(sc, 0, 12);
    for (int j = 0; j < 4; j++) {
        sc[j] = (uint8_t)(is[j] | ((is[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)(im[j] | ((im[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((is[j + 4] & 0x0f) | ((im[j + 4] & 0x0f) << 4));
    }
    for (int c = 0; c < 4; c++) {
        for (int h = 0; h < 2; h++) {
            int j = 2 * c + h;
            float ds = d * (float)is[j], dm = dmin * (float)im[j];
            for (int l = 0; l < 32; l++) {
                int v = ds > 0 ? (int)lroundf((x[32 * j + l] + dm) / ds) : 0;
                v = v < 0 ? 0 : v > 15 ? 15 : v;
                if (h == 0) q[32 * c + l] = (uint8_t)v;
                else q[32 * c + l] |= (uint8_t)(v << 4);
            }
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *b)
{
    float scale[16], amax_all = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
        scale[j] = amax / 31.0f;
        amax_all = fmaxf(amax_all, scale[j]);
    }
    float d = amax_all / 127.0f;
    wr16(b + 208, tide_f32_to_f16(d));
    d = tide_f16_to_f32(rd16(b + 208));
    int8_t *sc = (int8_t *)(b + 192);
    for (int j = 0; j < 16; j++) {
        int v = d > 0 ? (int)lroundf(scale[j] / d) : 0;
        sc[j] = (int8_t)(v > 127 ? 127 : v);
    }
    uint8_t qv[256];
    for (int i = 0; i < 256; i++) {
        float ds = d * (float)sc[i / 16];
        int v = ds > 0 ? (int)lroundf(x[i] / ds) : 0;
        v = v < -32 ? -32 : v > 31 ? 31 : v;
        qv[i] = (uint8_t)(v + 32);
    }
    uint8_t *ql = b, *qh = b + 128;
    memset(qh, 0, 64);
    for (int h = 0; h < 2; h++) {
        const uint8_t *v = qv + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[64 * h + l] = (uint8_t)((v[l] & 0x0f) | ((v[l + 64] & 0x0f) << 4));
            ql[64 * h + l + 32] = (uint8_t)((v[l + 32] & 0x0f) | ((v[l + 96] & 0x0f) << 4));
            qh[32 * h + l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                                       ((v[l + 96] >> 4) << 6));
        }
    }
}


/* ---- q5_K (176 bytes): q4_K's d, dmin and packed scales, then qh[32] (bit 2c of qh[l] is the
 * fifth bit of value 64c + l, bit 2c+1 that of value 64c + 32 + l), then the 128 nibble bytes. */
static void dequant_q5_k(const uint8_t *b, float *y)
{
    float d = tide_f16_to_f32(rd16(b)), dmin = tide_f16_to_f32(rd16(b + 2));
    const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
    for (int c = 0; c < 4; c++, q += 32, y += 64) {
        int s0, m0, s1, m1;
        q4k_scale_min(sc, 2 * c, &s0, &m0);
        q4k_scale_min(sc, 2 * c + 1, &s1, &m1);
        float d0 = d * (float)s0, dm0 = dmin * (float)m0, d1 = d * (float)s1, dm1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            y[l] = d0 * (float)((q[l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4)) - dm0;
            y[l + 32] = d1 * (float)((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - dm1;
        }
    }
}

/* ---- iq4_xs (136 bytes): f16 d, u16 scales_h (two high bits per sub-block), scales_l[4] (a
 * nibble per sub-block), then 16 nibble bytes per sub-block of 32; a nibble indexes a fixed
 * non-linear table; x = d * (scale - 32) * table[nibble]. */
const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int iq4xs_scale(const uint8_t *b, int j)
{
    int sh = rd16(b + 2);
    return (((b[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sh >> (2 * j)) & 3) << 4)) - 32;
}

static void dequant_iq4_xs(const uint8_t *b, float *y)
{
    float d = tide_f16_to_f32(rd16(b));
    const uint8_t *q = b + 8;
    for (int j = 0; j < 8; j++, q += 16, y += 32) {
        float dl = d * (float)iq4xs_scale(b, j);
        for (int l = 0; l < 16; l++) {
            y[l] = dl * (float)iq4nl_values[q[l] & 0x0f];
            y[l + 16] = dl * (float)iq4nl_values[q[l] >> 4];
        }
    }
}

/* ---- 32-value blocks: q5_0 (22 bytes) f16 d, u32 qh, 16 nibble bytes; value j < 16 is the low
 * nibble of byte j, value j + 16 the high one; bit j of qh is value j's fifth bit;
 * x = d * (q - 16). q5_1 (24 bytes) has f16 d, f16 m first and x = d * q + m. MXFP4 (17 bytes):
 * an e8m0 exponent e, then nibbles as q4_0 holding fp4 (e2m1) codes; x = fp4 * 2^(e - 127),
 * computed as the doubled table times 2^(e - 128), exactly. */
const int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float mxfp4_scale(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23; /* 2^(e-128), e < 2 subnormal */
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void dequant_q5(const uint8_t *b, float *y, bool with_min)
{
    float d = tide_f16_to_f32(rd16(b)), m = with_min ? tide_f16_to_f32(rd16(b + 2)) : 0;
    const uint8_t *p = b + (with_min ? 4 : 2);
    uint32_t qh = rd32(p);
    const uint8_t *q = p + 4;
    for (int j = 0; j < 16; j++) {
        int x0 = (q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int x1 = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        if (with_min) {
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        } else {
            y[j] = (float)(x0 - 16) * d;
            y[j + 16] = (float)(x1 - 16) * d;
        }
    }
}

static void dequant_mxfp4(const uint8_t *b, float *y)
{
    float d = mxfp4_scale(b[0]);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)mxfp4_values[b[1 + j] & 0x0f] * d;
        y[j + 16] = (float)mxfp4_values[b[1 + j] >> 4] * d;
    }
}

/* ---- quantisers for the new types ---- */

/* q5_K: q4_K's scheme with 31 levels. */
static void quant_q5_k(const float *x, uint8_t *b)
{
    float scale[8], mn[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (lo > 0) lo = 0;
        scale[j] = (hi - lo) / 31.0f;
        mn[j] = -lo;
        smax = fmaxf(smax, scale[j]);
        mmax = fmaxf(mmax, mn[j]);
    }
    wr16(b, tide_f32_to_f16(smax / 63.0f));
    wr16(b + 2, tide_f32_to_f16(mmax / 63.0f));
    float d = tide_f16_to_f32(rd16(b)), dmin = tide_f16_to_f32(rd16(b + 2));
    int is[8], im[8];
    for (int j = 0; j < 8; j++) {
        is[j] = d > 0 ? (int)lroundf(scale[j] / d) : 0;
        im[j] = dmin > 0 ? (int)lroundf(mn[j] / dmin) : 0;
        is[j] = is[j] > 63 ? 63 : is[j];
        im[j] = im[j] > 63 ? 63 : im[j];
    }
    uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
    for (int j = 0; j < 4; j++) {
        sc[j] = (uint8_t)(is[j] | ((is[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)(im[j] | ((im[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((is[j + 4] & 0x0f) | ((im[j + 4] & 0x0f) << 4));
    }
    memset(qh, 0, 32);
    memset(q, 0, 128);
    for (int j = 0; j < 8; j++) {
        float ds = d * (float)is[j], dm = dmin * (float)im[j];
        for (int l = 0; l < 32; l++) {
            int v = ds > 0 ? (int)lroundf((x[32 * j + l] + dm) / ds) : 0;
            v = v < 0 ? 0 : v > 31 ? 31 : v;
            q[32 * (j / 2) + l] |= (uint8_t)((v & 0x0f) << (4 * (j % 2)));
            qh[l] |= (uint8_t)((v >> 4) << j);
        }
    }
}

/* Nearest entry of a 16-value table to v. */
static int nearest16(const int8_t *table, float v)
{
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(v - (float)table[k]) < fabsf(v - (float)table[best]))
            best = k;
    return best;
}

static void quant_iq4_xs(const float *x, uint8_t *b)
{
    float s[8], smax = 0;
    for (int j = 0; j < 8; j++) {
        float amax = 0;
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[32 * j + l]));
        s[j] = amax / 127.0f;
        smax = fmaxf(smax, s[j]);
    }
    wr16(b, tide_f32_to_f16(smax / 31.0f));
    float d = tide_f16_to_f32(rd16(b));
    uint16_t sh = 0;
    memset(b + 4, 0, 4);
    for (int j = 0; j < 8; j++) {
        int ls = d > 0 ? (int)lroundf(s[j] / d) + 32 : 32;
        ls = ls > 63 ? 63 : ls;
        b[4 + j / 2] |= (uint8_t)((ls & 0x0f) << (4 * (j % 2)));
        sh |= (uint16_t)((ls >> 4) << (2 * j));
        float dl = d * (float)(ls - 32);
        uint8_t *q = b + 8 + 16 * j;
        for (int l = 0; l < 16; l++) {
            int lo = dl > 0 ? nearest16(iq4nl_values, x[32 * j + l] / dl) : 8;
            int hi = dl > 0 ? nearest16(iq4nl_values, x[32 * j + 16 + l] / dl) : 8;
            q[l] = (uint8_t)(lo | hi << 4);
        }
    }
    wr16(b + 2, sh);
}

/* q4_0 / q5_0: the value of largest magnitude maps to the most negative level. */
static void quant_q4_q5_0(const float *x, uint8_t *b, int bits)
{
    float mx = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > fabsf(mx)) mx = x[j];
    int half = 1 << (bits - 1), top = (1 << bits) - 1;
    float d = mx / (float)-half, id = d ? 1.0f / d : 0.0f;
    wr16(b, tide_f32_to_f16(d));
    int v[32];
    for (int j = 0; j < 32; j++) {
        v[j] = (int)lroundf(x[j] * id) + half;
        v[j] = v[j] < 0 ? 0 : v[j] > top ? top : v[j];
    }
    uint8_t *q = b + (bits == 5 ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((v[j] & 0x0f) | ((v[j + 16] & 0x0f) << 4));
        qh |= (uint32_t)(v[j] >> 4) << j | (uint32_t)(v[j + 16] >> 4) << (j + 16);
    }
    if (bits == 5)
        for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
}

static void quant_q5_1(const float *x, uint8_t *b)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) { lo = fminf(lo, x[j]); hi = fmaxf(hi, x[j]); }
    float d = (hi - lo) / 31.0f, id = d ? 1.0f / d : 0.0f;
    wr16(b, tide_f32_to_f16(d));
    wr16(b + 2, tide_f32_to_f16(lo));
    uint32_t qh = 0;
    uint8_t *q = b + 8;
    for (int j = 0; j < 16; j++) {
        int v0 = (int)lroundf((x[j] - lo) * id), v1 = (int)lroundf((x[j + 16] - lo) * id);
        v0 = v0 < 0 ? 0 : v0 > 31 ? 31 : v0;
        v1 = v1 < 0 ? 0 : v1 > 31 ? 31 : v1;
        q[j] = (uint8_t)((v0 & 0x0f) | ((v1 & 0x0f) << 4));
        qh |= (uint32_t)(v0 >> 4) << j | (uint32_t)(v1 >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++) b[4 + k] = (uint8_t)(qh >> (8 * k));
}

static void quant_mxfp4(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    /* the smallest exponent whose largest code (12 in the doubled table) covers amax */
    int e = amax > 0 ? 128 + (int)ceilf(log2f(amax / 12.0f)) : 0;
    e = e < 0 ? 0 : e > 254 ? 254 : e;
    b[0] = (uint8_t)e;
    float d = mxfp4_scale((uint8_t)e);
    for (int j = 0; j < 16; j++)
        b[1 + j] = (uint8_t)(nearest16(mxfp4_values, x[j] / d) | nearest16(mxfp4_values, x[j + 16] / d) << 4);
}


void ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n)
{
    const uint8_t *s = src;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, src, n * 4); break;
    case GGML_TYPE_F16: for (uint64_t i = 0; i < n; i++) dst[i] = tide_f16_to_f32(rd16(s + 2 * i)); break;
    case GGML_TYPE_BF16: for (uint64_t i = 0; i < n; i++) dst[i] = tide_bf16_to_f32(rd16(s + 2 * i)); break;
    case GGML_TYPE_Q8_0:
        for (uint64_t b = 0; b < n / 32; b++, s += 34) {
            float d = tide_f16_to_f32(rd16(s));
            for (int j = 0; j < 32; j++) dst[b * 32 + j] = d * (float)(int8_t)s[2 + j];
        }
        break;
    case GGML_TYPE_Q4_0:
        for (uint64_t b = 0; b < n / 32; b++, s += 18) {
            float d = tide_f16_to_f32(rd16(s));
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)((s[2 + j] & 0x0f) - 8);
                dst[b * 32 + 16 + j] = d * (float)((s[2 + j] >> 4) - 8);
            }
        }
        break;
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: {
        size_t bb = type == GGML_TYPE_Q5_0 ? Q5_0_BYTES : Q5_1_BYTES;
        for (uint64_t b = 0; b < n / 32; b++) dequant_q5(s + b * bb, dst + b * 32, type == GGML_TYPE_Q5_1);
        break;
    }
    case GGML_TYPE_MXFP4:
        for (uint64_t b = 0; b < n / 32; b++) dequant_mxfp4(s + b * MXFP4_BYTES, dst + b * 32);
        break;
    case GGML_TYPE_Q4_K:
        for (uint64_t b = 0; b < n / QK_K; b++) dequant_q4_k(s + b * Q4_K_BYTES, dst + b * QK_K);
        break;
    case GGML_TYPE_Q5_K:
        for (uint64_t b = 0; b < n / QK_K; b++) dequant_q5_k(s + b * Q5_K_BYTES, dst + b * QK_K);
        break;
    case GGML_TYPE_Q6_K:
        for (uint64_t b = 0; b < n / QK_K; b++) dequant_q6_k(s + b * Q6_K_BYTES, dst + b * QK_K);
        break;
    case GGML_TYPE_IQ4_XS:
        for (uint64_t b = 0; b < n / QK_K; b++) dequant_iq4_xs(s + b * IQ4_XS_BYTES, dst + b * QK_K);
        break;
    default: memset(dst, 0, n * 4); break;
    }
}

size_t ggml_quantize(uint32_t type, const float *src, void *dst, uint64_t n)
{
    uint8_t *d8 = dst;
    uint32_t bs = ggml_block_size(type);
    size_t bb = bs ? ggml_row_size(type, bs) : 0;
    if (!bs || n % bs)
        return 0;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, src, n * 4); return n * 4;
    case GGML_TYPE_F16: case GGML_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++)
            wr16(d8 + 2 * i, type == GGML_TYPE_F16 ? tide_f32_to_f16(src[i]) : tide_f32_to_bf16(src[i]));
        return n * 2;
    case GGML_TYPE_Q8_0:
        for (uint64_t b = 0; b < n / 32; b++, d8 += 34) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(src[b * 32 + j]));
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            wr16(d8, tide_f32_to_f16(d));
            for (int j = 0; j < 32; j++) d8[2 + j] = (uint8_t)(int8_t)lroundf(src[b * 32 + j] * id);
        }
        return n / 32 * 34;
    default: break;
    }
    for (uint64_t b = 0; b < n / bs; b++) {
        const float *x = src + b * bs;
        uint8_t *o = d8 + b * bb;
        switch (type) {
        case GGML_TYPE_Q4_0: quant_q4_q5_0(x, o, 4); break;
        case GGML_TYPE_Q5_0: quant_q4_q5_0(x, o, 5); break;
        case GGML_TYPE_Q5_1: quant_q5_1(x, o); break;
        case GGML_TYPE_MXFP4: quant_mxfp4(x, o); break;
        case GGML_TYPE_Q4_K: quant_q4_k(x, o); break;
        case GGML_TYPE_Q5_K: quant_q5_k(x, o); break;
        case GGML_TYPE_Q6_K: quant_q6_k(x, o); break;
        case GGML_TYPE_IQ4_XS: quant_iq4_xs(x, o); break;
        default: return 0;
        }
    }
    return (size_t)(n / bs) * bb;
}
