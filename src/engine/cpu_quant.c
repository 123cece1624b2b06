/* cpu_quant.c - int8 dot products of quantised weight rows with quantised activations (the
 * CPU backend's matmul for q8_0, q4_0, q5_0, q5_1, MXFP4, q4_K, q5_K, q6_K and iq4_xs).
 *
 * Why int8: a k-quant row dequantised to f32 and dotted costs a float multiply-add per weight
 * plus the unpacking; with the activations quantised to int8 once per matmul, a 32-value
 * product is one or two byte-multiply instructions. The block formats are in quants.c.
 *
 * How the bits stay fixed: a row's product is done in two steps. First a kernel (scalar, or
 * AVX2 where the CPU has it: cpu_quant_isums.c) computes exact integers per block: the weight
 * codes times the activation codes, weighted by the block's integer sub-block scales. Then one portable
 * function combines those integers with the float scales in block order. Integer sums are
 * exact, so every kernel gives the same integers and the result has the same bits on every
 * path; and since each row is one such call, it does not depend on the batch or thread split.
 * The combine step is compiled for the baseline ISA (no FMA contraction: -std=c11 keeps
 * fp-contract off) and never inlined into a SIMD function. */
#include "cpu_quant.h"
#include "cpu_kquant.h"
#include "cpu_quant_isums.h"
#include "cpu_quant_vnni.h"
#include "gguf.h"
#include "quants.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* no fused multiply-adds: every path must round the float combine the same way (gcc keeps
 * fp-contract off under -std=c11; clang needs telling) */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define UNPACK_CHUNK 64 /* super-blocks unpacked at once for many vectors */

/* Activations: struct act32 (cpu_quant_vnni.h) for 32-value weight blocks, ggml's q8_0 block
 * and the codes' sum; struct act256 (cpu_kquant.h) for 256-value super-blocks. */

static float f16_table[65536];
static bool have_avx2, have_vnni, have_kquant_avx2;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* TIDE_CPU_ISA=avx2 or scalar caps what CPU_ISA_BEST picks (to compare paths, or to rule one
 * out); the results are the same bits on every path. */
static void cpu_quant_init(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = tide_f16_to_f32((uint16_t)i);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
    have_vnni = have_avx2 && cpu_quant_vnni_cpu();
    have_kquant_avx2 = have_avx2 && cpu_kquant_avx2_cpu();
#endif
}

static enum cpu_isa best_isa(void)
{
    static _Atomic int cap = -1; /* the env's cap, read once */
    int c = cap;
    if (c < 0) {
        const char *e = getenv("TIDE_CPU_ISA");
        c = e && !strcmp(e, "scalar") ? CPU_ISA_SCALAR : e && !strcmp(e, "avx2") ? CPU_ISA_AVX2
                                                                                : CPU_ISA_AVX512VNNI;
        cap = c;
    }
    if (have_vnni && c >= CPU_ISA_AVX512VNNI)
        return CPU_ISA_AVX512VNNI;
    if (have_avx2 && c >= CPU_ISA_AVX2)
        return CPU_ISA_AVX2;
    return CPU_ISA_SCALAR;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
bool cpu_quant_has(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_MXFP4: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

static bool super_block(uint32_t type) { return ggml_block_size(type) == QK_K; }

bool cpu_quant_isa_available(enum cpu_isa isa)
{
    pthread_once(&init_once, cpu_quant_init);
    return isa == CPU_ISA_AVX512VNNI ? have_vnni : isa == CPU_ISA_AVX2 ? have_avx2 : true;
}

enum cpu_isa cpu_quant_isa_best(void)
{
    pthread_once(&init_once, cpu_quant_init);
    return best_isa();
}

const char *cpu_quant_isa_name(void)
{
    pthread_once(&init_once, cpu_quant_init);
    enum cpu_isa b = best_isa();
    return b == CPU_ISA_AVX512VNNI ? "avx512vnni" : b == CPU_ISA_AVX2 ? "avx2" : "scalar";
}

size_t cpu_quant_act_bytes(uint32_t type, int cols)
{
    return super_block(type) ? (size_t)(cols / QK_K) * sizeof(struct act256)
                             : (size_t)(cols / QB) * sizeof(struct act32);
}

void cpu_quant_act(uint32_t type, const float *x, int cols, void *out)
{
    cpu_quant_act_isa(type, x, cols, out, CPU_ISA_BEST);
}

void cpu_quant_act_isa(uint32_t type, const float *x, int cols, void *out, enum cpu_isa isa)
{
    pthread_once(&init_once, cpu_quant_init);
    if (isa == CPU_ISA_BEST)
        isa = best_isa();
    if (!super_block(type)) {
        struct act32 *o = out; /* the q8_0 scheme the CPU backend has always used */
#if CPU_QUANT_AVX2
        if (have_avx2 && isa >= CPU_ISA_AVX2) {
            quant_act32_avx2(x, cols / QB, o);
            return;
        }
#endif
        for (int b = 0; b < cols / QB; b++) {
            const float *v = x + b * QB;
            float amax = 0;
            for (int j = 0; j < QB; j++)
                amax = fmaxf(amax, fabsf(v[j]));
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            o[b].d = tide_f32_to_f16(d);
            int sum = 0;
            for (int j = 0; j < QB; j++) {
                o[b].q[j] = (int8_t)lrintf(v[j] * id);
                sum += o[b].q[j];
            }
            o[b].sum = (int16_t)sum;
        }
        return;
    }
    struct act256 *o = out;
    if (have_kquant_avx2 && isa >= CPU_ISA_AVX2) { /* cpu_kquant.c */
        cpu_kquant_act(x, cols / QK_K, o);
        return;
    }
    for (int b = 0; b < cols / QK_K; b++) {
        const float *v = x + b * QK_K;
        float amax = 0;
        for (int j = 0; j < QK_K; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        o[b].d = d;
        for (int j = 0; j < QK_K; j++) {
            long q = lrintf(v[j] * id);
            o[b].q[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += o[b].q[16 * g + j];
            o[b].bsum[g] = (int16_t)s;
        }
    }
}

static void unpack256(uint32_t type, const uint8_t *w, struct unpacked256 *u)
{
    int16_t sc16[16];
    u->is_signed = type == GGML_TYPE_IQ4_XS;
    if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) {
        bool five = type == GGML_TYPE_Q5_K;
        const uint8_t *qh = w + 16, *q = w + (five ? 48 : 16);
        for (int c = 0; c < 4; c++) {
            for (int h = 0; h < 2; h++) {
                int sc, m;
                q4k_scale_min(w + 4, 2 * c + h, &sc, &m);
                sc16[2 * (2 * c + h)] = sc16[2 * (2 * c + h) + 1] = (int16_t)sc;
                u->offw[2 * (2 * c + h)] = u->offw[2 * (2 * c + h) + 1] = (int16_t)m;
            }
            for (int l = 0; l < 32; l++) {
                int v0 = q[32 * c + l] & 0x0f, v1 = q[32 * c + l] >> 4;
                if (five) {
                    v0 |= ((qh[l] >> (2 * c)) & 1) << 4;
                    v1 |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                u->codes[64 * c + l] = (uint8_t)v0;
                u->codes[64 * c + 32 + l] = (uint8_t)v1;
            }
        }
    } else if (type == GGML_TYPE_Q6_K) {
        for (int j = 0; j < 16; j++) sc16[j] = u->offw[j] = ((const int8_t *)(w + 192))[j];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    int lo = k & 1 ? ql[l + 32] : ql[l];
                    u->codes[128 * h + 32 * k + l] =
                        (uint8_t)((k & 2 ? lo >> 4 : lo & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4));
                }
        }
    } else { /* iq4_xs */
        for (int j = 0; j < 8; j++) {
            sc16[2 * j] = sc16[2 * j + 1] = (int16_t)iq4xs_scale(w, j);
            const uint8_t *q = w + 8 + 16 * j;
            for (int l = 0; l < 16; l++) {
                u->codes[32 * j + l] = (uint8_t)iq4nl_values[q[l] & 0x0f];
                u->codes[32 * j + 16 + l] = (uint8_t)iq4nl_values[q[l] >> 4];
            }
        }
    }
    if (type == GGML_TYPE_IQ4_XS)
        memset(u->offw, 0, sizeof u->offw);
    for (int k = 0; k < 8; k++)
        for (int lane = 0; lane < 16; lane++)
            u->scalev[k][lane] = sc16[2 * k + lane / 8];
    u->d = f16_table[rd16(type == GGML_TYPE_Q6_K ? w + 208 : w)];
    u->dmin = f16_table[rd16(w + 2)];
}

/* ---------------- combine: the float part, one order for every path ---------------- */

__attribute__((noinline)) static float combine(uint32_t type, const uint8_t *w, size_t bb, const void *act,
                                               int nb, const int32_t *is, float s)
{
    const struct act32 *x32 = act;
    const struct act256 *x256 = act;
    for (int b = 0; b < nb; b++, w += bb) {
        switch (type) {
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0:
            s += f16_table[rd16(w)] * f16_table[x32[b].d] * (float)is[b];
            break;
        case GGML_TYPE_Q5_1: {
            float dx = f16_table[x32[b].d];
            s += f16_table[rd16(w)] * dx * (float)is[2 * b] + f16_table[rd16(w + 2)] * dx * (float)is[2 * b + 1];
            break;
        }
        case GGML_TYPE_MXFP4:
            s += mxfp4_scale(w[0]) * f16_table[x32[b].d] * (float)is[b];
            break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
            s += x256[b].d * (f16_table[rd16(w)] * (float)is[2 * b] - f16_table[rd16(w + 2)] * (float)is[2 * b + 1]);
            break;
        case GGML_TYPE_Q6_K: {
            const int8_t *sc = (const int8_t *)(w + 192);
            int32_t off = 0;
            for (int j = 0; j < 16; j++)
                off += sc[j] * x256[b].bsum[j];
            s += x256[b].d * f16_table[rd16(w + 208)] * (float)(is[b] - 32 * off);
            break;
        }
        case GGML_TYPE_IQ4_XS:
            s += x256[b].d * f16_table[rd16(w)] * (float)is[b];
            break;
        }
    }
    return s;
}

float cpu_quant_dot(uint32_t type, const void *row, const void *act, int cols, enum cpu_isa isa)
{
    pthread_once(&init_once, cpu_quant_init);
    if (isa == CPU_ISA_BEST)
        isa = best_isa();
    uint32_t bs = ggml_block_size(type);
    size_t bb = ggml_row_size(type, bs);
    size_t ab = super_block(type) ? sizeof(struct act256) : sizeof(struct act32);
    int nb = cols / (int)bs;
    int32_t is[2 * ISUM_CHUNK];
    const uint8_t *w = row, *x = act;
    float s = 0;
    for (int b0 = 0; b0 < nb; b0 += ISUM_CHUNK) {
        int n = nb - b0 < ISUM_CHUNK ? nb - b0 : ISUM_CHUNK;
        const uint8_t *wc = w + (size_t)b0 * bb;
        const void *xc = x + (size_t)b0 * ab;
#if CPU_QUANT_AVX2
        if (isa >= CPU_ISA_AVX2 && have_avx2) /* a single dot: VNNI has no tile for one */
            quant_isums_avx2(type, wc, xc, n, is);
        else
#endif
            quant_isums_scalar(type, wc, xc, n, is);
        s = combine(type, wc, bb, xc, n, is, s);
    }
    return s;
}

void cpu_quant_dot_many(uint32_t type, const void *row, const void *act, size_t act_stride, int n, int cols,
                        float *y, size_t y_stride, enum cpu_isa isa)
{
    pthread_once(&init_once, cpu_quant_init);
    if (isa == CPU_ISA_BEST)
        isa = best_isa();
#if CPU_QUANT_AVX2
    if (n > 1 && isa >= CPU_ISA_AVX2 && have_avx2 && super_block(type)) {
        size_t bb = ggml_row_size(type, QK_K);
        int nb = cols / QK_K;
        static _Thread_local struct unpacked256 u[UNPACK_CHUNK]; /* ~37 KB: not the stack */
        const uint8_t *w = row, *x = act;
        for (int b0 = 0; b0 < nb; b0 += UNPACK_CHUNK) {
            int nc = nb - b0 < UNPACK_CHUNK ? nb - b0 : UNPACK_CHUNK;
            for (int b = 0; b < nc; b++)
                unpack256(type, w + (size_t)(b0 + b) * bb, &u[b]);
            /* vector by vector, so each sum stays in a register over the chunk's blocks */
            for (int t = 0; t < n; t++) {
                const struct act256 *xa = (const struct act256 *)(x + (size_t)t * act_stride) + b0;
                float s = b0 ? y[(size_t)t * y_stride] : 0.0f;
                for (int b = 0; b < nc; b++) {
                    int32_t off, a = quant_dot_unpacked_avx2(&u[b], &xa[b], &off);
                    /* combine()'s float expression for this block, on the same integers */
                    if (type == GGML_TYPE_Q6_K)
                        s += xa[b].d * u[b].d * (float)(a - 32 * off);
                    else if (type == GGML_TYPE_IQ4_XS)
                        s += xa[b].d * u[b].d * (float)a;
                    else
                        s += xa[b].d * (u[b].d * (float)a - u[b].dmin * (float)off);
                }
                y[(size_t)t * y_stride] = s;
            }
        }
        return;
    }
#endif
    for (int t = 0; t < n; t++)
        y[(size_t)t * y_stride] = cpu_quant_dot(type, row, (const uint8_t *)act + (size_t)t * act_stride, cols, isa);
}

void cpu_quant_rows(uint32_t type, const void *w, size_t row_bytes, int r0, int r1, const void *act,
                    size_t act_stride, int n, int cols, float *y, size_t y_stride, enum cpu_isa isa)
{
    pthread_once(&init_once, cpu_quant_init);
    if (isa == CPU_ISA_BEST)
        isa = best_isa();
    const uint8_t *wb = w, *xb = act;
    if (isa >= CPU_ISA_AVX2 && have_kquant_avx2 && cpu_kquant_has(type)) { /* k-quant tiles (cpu_kquant.c) */
        cpu_kquant_rows(type, wb, row_bytes, r0, r1, xb, act_stride, n, cols, y, y_stride,
                        isa == CPU_ISA_AVX512VNNI && have_vnni);
        return;
    }
    /* the tiles address eight rows or vectors with 32-bit offsets */
    if (isa == CPU_ISA_AVX512VNNI && have_vnni && cpu_quant_vnni_has(type) && row_bytes <= (1u << 27) &&
        act_stride <= (1u << 27)) {
        int nb = cols / QB, n8 = n / 8 * 8;
        float o[8];
        /* prefill: 16 rows at a time by GEMM, the rest a row with eight vectors at a time */
        if (n >= 8) {
            int r16 = r0 + (r1 - r0) / 16 * 16;
            cpu_quant_vnni_gemm(type, wb + (size_t)r0 * row_bytes, row_bytes, r16 - r0, act, act_stride, n, nb,
                                y + r0, y_stride);
            r0 = r16;
        }
        for (int r = r0; r < r1; r++)
            for (int t = 0; t < n8; t += 8) {
                cpu_quant_vnni_vecs8(type, wb + (size_t)r * row_bytes, (const struct act32 *)(xb + t * act_stride),
                                     act_stride, nb, o);
                for (int k = 0; k < 8; k++)
                    y[(size_t)(t + k) * y_stride + r] = o[k];
            }
        /* decode, and the vectors left over: eight rows with one vector */
        for (int t = n8; t < n; t++) {
            const struct act32 *x = (const struct act32 *)(xb + t * act_stride);
            int r = r0;
            for (; r + 8 <= r1; r += 8) {
                cpu_quant_vnni_rows8(type, wb + (size_t)r * row_bytes, row_bytes, x, nb, o);
                for (int k = 0; k < 8; k++)
                    y[(size_t)t * y_stride + r + k] = o[k];
            }
            for (; r < r1; r++)
                y[(size_t)t * y_stride + r] = cpu_quant_dot(type, wb + (size_t)r * row_bytes, x, cols, CPU_ISA_AVX2);
        }
        return;
    }
    for (int r = r0; r < r1; r++)
        cpu_quant_dot_many(type, wb + (size_t)r * row_bytes, act, act_stride, n, cols, y + r, y_stride, isa);
}
