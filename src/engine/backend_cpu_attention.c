/* backend_cpu_attention.c - the CPU backend's causal attention (backend_i.attention) over
 * the f32 KV cache, its f16 twin (backend_i.attention_f16), and the paged form of either
 * (backend_i.attention_paged), shared by the pool's threads.
 *
 * How the work is split: a decode step (one query token) is claimed by the threads a KV
 * head's group of query heads at a time (GQA: the heads that read the same K and V rows stay
 * on one core). A prefill chunk of n tokens is one pool job for all its (token, head) pairs,
 * claimed a KV head's group for a block of tokens at a time (prefill_worker says why). Each
 * (token, head) is computed by the same function whichever thread runs it, so the result does
 * not depend on the split, and a token's output in a prefill is the bits it gets when decoded
 * alone at that position.
 *
 * The f16 cache: the same code reads each K or V row widened to f32 (F16C; exact), so the f16
 * form is bit for bit the f32 form over the widened cache, and a row's result still does not
 * depend on what shares its step.
 *
 * On a CPU with AVX-512 (and TIDE_CPU_ISA not capping it), head_dim 64 runs two heads of a GQA
 * group at once, each with AVX2's bits (attend_pair_avx512 says how and why), over either cache.
 *
 * The paged cache: the sequence's KV row p is row p % block_rows of block blocks[p /
 * block_rows] of a pool (docs/DESIGN.md "KV blocks"). Every loop over rows goes a run of rows
 * at a time (run_end: the rest of a block, or all rows when contiguous), each run's first row
 * found through the table (row_at), and the rows within a run one stride apart as before; the
 * 16-row tiles of the AVX-512 scores start at multiples of 16 and block_rows is a multiple of
 * 16, so no tile crosses a block. The arithmetic and its order are the contiguous op's, so the
 * paged op gives its bits over the same rows, and the contiguous op (blocks NULL: one run) runs
 * the loops it ran before. */
#include "backend_cpu_attention.h"
#include "cpu_f16.h"
#include "cpu_lanes512.h"
#include "cpu_quant.h" /* the ISA choice */

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* not under ThreadSanitizer (make tsan): the clones' ifunc resolvers run before its runtime is up and crash */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KERNEL
#endif

struct att_job {
    const float *q;
    const void *k_cache, *v_cache; /* float, or uint16_t (f16) */
    float *out, *att;
    int n, pos, n_head, n_head_kv, head_dim;
    int next; /* the first head (decode) or token (prefill) no thread has claimed */
    bool fast; /* attend_one_avx2 runs it */
    bool f16;  /* the caches hold f16 */
    bool wide; /* and its head_dim 64 scores are AVX-512's (scores16_avx512) */
    bool pairs; /* and heads go two at a time (attend_pair_avx512) */
    const int32_t *blocks; /* the block table, or NULL: the caches are contiguous */
    int shift;             /* log2 of block_rows */
    const float *sinks;    /* [n_head]: a logit per head in each softmax's denominator, with no
                            * value row (gpt-oss), or NULL */
    int window;            /* > 0: the query at position p sees p - window + 1..p only */
};

/* The first KV row the query at position last sees: 0, or the window's first. */
static inline int first_row(const struct att_job *j, int last)
{
    return j->window > 0 && last - j->window + 1 > 0 ? last - j->window + 1 : 0;
}

/* head h's sink logit, or NULL */
static inline const float *sink_of(const struct att_job *j, int h) { return j->sinks ? j->sinks + h : NULL; }

/* The element where the sequence's KV row p starts: p * kv_dim in a contiguous cache, else
 * row p % block_rows of block blocks[p / block_rows]. */
static inline __attribute__((always_inline)) size_t row_at(const struct att_job *j, int p, int kv_dim)
{
    if (!j->blocks)
        return (size_t)p * kv_dim;
    size_t row = (size_t)j->blocks[p >> j->shift] << j->shift | (size_t)(p & ((1 << j->shift) - 1));
    return row * kv_dim;
}

/* The end of the run of rows p.. (before end) that lie kv_dim elements apart in the cache: the
 * end of p's block, or end when the cache is contiguous. */
static inline __attribute__((always_inline)) int run_end(const struct att_job *j, int p, int end)
{
    if (!j->blocks)
        return end;
    int block_end = (p | ((1 << j->shift) - 1)) + 1;
    return block_end < end ? block_end : end;
}

/* o = sum over rows lo..rows-1 of wgt[t] / sum * v_t: the weighted value rows (v_t at element
 * head of the job's row t of v), element by element in row order (vectorised across the head's
 * elements, which leaves each element's sum as is). */
KERNEL static void weighted_rows(float *o, const struct att_job *j, const float *v, size_t head, int kv_dim,
                                 const float *a, int lo, int rows, float sum, int hd)
{
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (int t = lo; t < rows; t++) {
        const float *vt = v + head + row_at(j, t, kv_dim);
        float wgt = a[t] / sum;
        for (int i = 0; i < hd; i++)
            o[i] += wgt * vt[i];
    }
}

/* weighted_rows over f16 value rows: each row widened (exact), then the same sums. hd <=
 * CPU_ATT_F16_MAX_HD. */
KERNEL static void weighted_rows_f16(float *o, const struct att_job *j, const uint16_t *v, size_t head,
                                     int kv_dim, const float *a, int lo, int rows, float sum, int hd)
{
    float vt[CPU_ATT_F16_MAX_HD];
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (int t = lo; t < rows; t++) {
        cpu_f16_to_f32(vt, v + head + row_at(j, t, kv_dim), (size_t)hd);
        float wgt = a[t] / sum;
        for (int i = 0; i < hd; i++)
            o[i] += wgt * vt[i];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATT_AVX2 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
static int have_avx2 = -1, have_avx512; /* -1 until asked */

AVX2 static inline float hsum8f(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* e^x for x <= 0, eight lanes: x = k ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial
 * (Cephes' expf coefficients, relative error ~1e-7 against libm's), 2^k into the exponent.
 * Below -87 it gives 2^-126 times e^r: a weight of ~1e-38 after the max's 1, as good as 0. */
AVX2 static inline __m256 exp8_nonpos(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* The softmax of a[0..n) in place, eight lanes at a time: the max (exact in any order), e^(a -
 * max) by exp8_nonpos, the sum in eight lanes then hsum8f, each weight divided by it. The
 * scalar form (expf and a running sum, one position at a time) was about half of a prefill's
 * attention: its sum and max were chains of dependent adds. sink (or NULL): one more logit,
 * in the max and the sum, whose weight is dropped (it has no value row). */
AVX2 static void softmax8(float *a, int n, const float *sink)
{
    int n8 = n / 8 * 8;
    __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - n8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (int p = 0; p < n8; p += 8)
        m8 = _mm256_max_ps(m8, _mm256_loadu_ps(a + p));
    if (n8 < n)
        m8 = _mm256_max_ps(m8, _mm256_blendv_ps(m8, _mm256_maskload_ps(a + n8, tail), _mm256_castsi256_ps(tail)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float m = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    if (sink && *sink > m)
        m = *sink;
    __m256 mx = _mm256_set1_ps(m);
    __m256 s8 = _mm256_setzero_ps();
    for (int p = 0; p < n8; p += 8) {
        __m256 e = exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(a + p), mx));
        _mm256_storeu_ps(a + p, e);
        s8 = _mm256_add_ps(s8, e);
    }
    if (n8 < n) {
        __m256 e = exp8_nonpos(_mm256_sub_ps(_mm256_maskload_ps(a + n8, tail), mx));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
        _mm256_maskstore_ps(a + n8, tail, e);
        s8 = _mm256_add_ps(s8, e);
    }
    float total = hsum8f(s8);
    if (sink)
        total += expf(*sink - m);
    __m256 sum = _mm256_set1_ps(total);
    for (int p = 0; p < n8; p += 8)
        _mm256_storeu_ps(a + p, _mm256_div_ps(_mm256_loadu_ps(a + p), sum));
    if (n8 < n)
        _mm256_maskstore_ps(a + n8, tail, _mm256_div_ps(_mm256_maskload_ps(a + n8, tail), sum));
}

/* Eight cache elements from element i of base: f32, or f16 widened (exact). */
AVX2 static inline __attribute__((always_inline)) __m256 load8(const void *base, size_t i, bool f16)
{
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)))
               : _mm256_loadu_ps((const float *)base + i);
}

#define ATT_AVX512 1
#define W512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq")))

/* Sixteen cache elements from element i of base: f32, or f16 widened (exact). */
W512 static inline __attribute__((always_inline)) __m512 load16(const void *base, size_t i, bool f16)
{
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)))
               : _mm512_loadu_ps((const float *)base + i);
}

/* The head_dim 64 scores of positions 0 to n rounded down to 16 (a[p] = q . k_p * scale, k_p
 * the row at element head + p * kv_dim), 16 positions at a time; returns how many. The AVX2
 * loop's arithmetic exactly: its two 8-lane accumulators (q's even and odd 8-float blocks) are
 * one register's halves, since blocks 2i and 2i + 1 are 16 contiguous elements; its odd half
 * starts as fma(q1, k1, 0), which is the product + 0 (the masked add); the lanes' sums are
 * hsum8f's order (cpu_lanes512.h). Half the multiply-adds, and no horizontal sum per position.
 * f16 is a constant in each caller (scores16_avx512_f32 / _f16). */
W512 static inline __attribute__((always_inline)) int scores16_body(const float *qh, const void *k, size_t head,
                                                                    int kv_dim, int n, float scale, float *a,
                                                                    const bool f16)
{
    __m512 q01 = _mm512_loadu_ps(qh), q23 = _mm512_loadu_ps(qh + 16), q45 = _mm512_loadu_ps(qh + 32);
    __m512 q67 = _mm512_loadu_ps(qh + 48), zero = _mm512_setzero_ps(), sc = _mm512_set1_ps(scale);
    int p = 0;
    for (; p + 16 <= n; p += 16) {
        __m512 acc[16], s[8];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            size_t kp = head + (size_t)(p + i) * kv_dim;
            __m512 x = _mm512_mul_ps(q01, load16(k, kp, f16));
            x = _mm512_mask_add_ps(x, 0xff00, x, zero);
            x = _mm512_fmadd_ps(q23, load16(k, kp + 16, f16), x);
            x = _mm512_fmadd_ps(q45, load16(k, kp + 32, f16), x);
            acc[i] = _mm512_fmadd_ps(q67, load16(k, kp + 48, f16), x);
        }
        /* acc0 + acc1 of each position, two positions a register */
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                                 _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xee));
        __m512 r = lane_sums16(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
        _mm512_storeu_ps(a + p, _mm512_mul_ps(r, sc));
    }
    return p;
}

W512 static int scores16_avx512_f32(const float *qh, const void *k, size_t head, int kv_dim, int n, float scale,
                                    float *a)
{
    return scores16_body(qh, k, head, kv_dim, n, scale, a, false);
}

W512 static int scores16_avx512_f16(const float *qh, const void *k, size_t head, int kv_dim, int n, float scale,
                                    float *a)
{
    return scores16_body(qh, k, head, kv_dim, n, scale, a, true);
}

/* One head_dim 64 score in AVX2, k_p at element kp: attend_avx2's loop body. */
AVX2 static inline __attribute__((always_inline)) float score64_avx2(const float *qh, const void *k, size_t kp,
                                                                     float scale, const bool f16)
{
    __m256 acc0 = _mm256_mul_ps(_mm256_loadu_ps(qh), load8(k, kp, f16));
    __m256 acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8), load8(k, kp + 8, f16), _mm256_setzero_ps());
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 16), load8(k, kp + 16, f16), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 24), load8(k, kp + 24, f16), acc1);
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 32), load8(k, kp + 32, f16), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 40), load8(k, kp + 40, f16), acc1);
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 48), load8(k, kp + 48, f16), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 56), load8(k, kp + 56, f16), acc1);
    return hsum8f(_mm256_add_ps(acc0, acc1)) * scale;
}

/* A paged cache's rows from element at (rows of them, one head of 64 elements each) into L1
 * ahead of their loads: a jump to another block loses the hardware's stride prefetch. Decode
 * over scattered 16-row blocks measured ~7-12% faster with it (the commit says how). */
AVX2 static inline __attribute__((always_inline)) void prefetch_rows(const void *base, size_t at, int kv_dim,
                                                                     int rows, const bool f16)
{
    const char *c = (const char *)base + at * (f16 ? 2 : 4);
    size_t stride = (size_t)kv_dim * (f16 ? 2 : 4);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < (f16 ? 128 : 256); b += 64)
            _mm_prefetch(c + r * stride + b, _MM_HINT_T0);
}

/* Heads h and h + 1 of query token t, which read the same K and V rows (GQA), head_dim 64,
 * scores in a0 and a1: each head's bits are attend_avx2's (the same score per position, the
 * same softmax, and each output element's sum over the positions in order; 512-bit registers
 * hold 16 of them where AVX2's held 8, which changes no element's arithmetic). Why two:
 * attention was bound by reading K and V from L2 (a KV head's 512 positions are 256 KB in
 * f32), not by arithmetic; a block of 16 K rows is read once from L2 for both heads' scores,
 * and each V row once for both heads' sums, whose 8 accumulators also hide the multiply-adds'
 * latency that 4 would not. f16 is a constant in each caller. */
W512 static inline __attribute__((always_inline)) void attend_pair_body(const struct att_job *j, int t, int h,
                                                                        float *a0, float *a1, const bool f16)
{
    int kv_dim = j->n_head_kv * 64, n = j->pos + t + 1, kvh = h / (j->n_head / j->n_head_kv);
    int lo = first_row(j, n - 1);
    float scale = 1.0f / sqrtf(64.0f);
    const float *qa = j->q + ((size_t)t * j->n_head + h) * 64, *qb = qa + 64;
    const void *k = j->k_cache, *v = j->v_cache;
    size_t head = (size_t)kvh * 64; /* the KV head's first element in a row */
    int p = lo;
    for (; j->blocks && p < n && (p & 15); p++) { /* a window's rows up to a tile's start */
        a0[p] = score64_avx2(qa, k, head + row_at(j, p, kv_dim), scale, f16);
        a1[p] = score64_avx2(qb, k, head + row_at(j, p, kv_dim), scale, f16);
    }
    for (; p + 16 <= n; p += 16) {
        size_t kb = head + row_at(j, p, kv_dim); /* 16 rows from a multiple of 16: one block's */
        if (j->blocks && p + 16 < n && !((p + 16) & ((1 << j->shift) - 1)))
            prefetch_rows(k, head + row_at(j, p + 16, kv_dim), kv_dim, 16, f16);
        scores16_body(qa, k, kb, kv_dim, 16, scale, a0 + p, f16);
        scores16_body(qb, k, kb, kv_dim, 16, scale, a1 + p, f16);
    }
    for (; p < n; p++) {
        a0[p] = score64_avx2(qa, k, head + row_at(j, p, kv_dim), scale, f16);
        a1[p] = score64_avx2(qb, k, head + row_at(j, p, kv_dim), scale, f16);
    }
    softmax8(a0 + lo, n - lo, sink_of(j, h));
    softmax8(a1 + lo, n - lo, sink_of(j, h + 1));
    __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
    for (p = lo; p < n;) { /* a run of rows at a time: its rows kv_dim elements apart */
        int e = run_end(j, p, n);
        if (e < n)
            prefetch_rows(v, head + row_at(j, e, kv_dim), kv_dim, 8, f16);
        for (size_t vp = head + row_at(j, p, kv_dim); p < e; p++, vp += kv_dim) {
            __m512 v0 = load16(v, vp, f16), v1 = load16(v, vp + 16, f16), v2 = load16(v, vp + 32, f16);
            __m512 v3 = load16(v, vp + 48, f16), wa = _mm512_set1_ps(a0[p]), wb = _mm512_set1_ps(a1[p]);
            o0 = _mm512_fmadd_ps(wa, v0, o0);
            o1 = _mm512_fmadd_ps(wa, v1, o1);
            o2 = _mm512_fmadd_ps(wa, v2, o2);
            o3 = _mm512_fmadd_ps(wa, v3, o3);
            o4 = _mm512_fmadd_ps(wb, v0, o4);
            o5 = _mm512_fmadd_ps(wb, v1, o5);
            o6 = _mm512_fmadd_ps(wb, v2, o6);
            o7 = _mm512_fmadd_ps(wb, v3, o7);
        }
    }
    float *oa = j->out + ((size_t)t * j->n_head + h) * 64, *ob = oa + 64;
    _mm512_storeu_ps(oa, o0);
    _mm512_storeu_ps(oa + 16, o1);
    _mm512_storeu_ps(oa + 32, o2);
    _mm512_storeu_ps(oa + 48, o3);
    _mm512_storeu_ps(ob, o4);
    _mm512_storeu_ps(ob + 16, o5);
    _mm512_storeu_ps(ob + 32, o6);
    _mm512_storeu_ps(ob + 48, o7);
}

W512 static void attend_pair_avx512(const struct att_job *j, int t, int h, float *a0, float *a1)
{
    if (j->f16)
        attend_pair_body(j, t, h, a0, a1, true);
    else
        attend_pair_body(j, t, h, a0, a1, false);
}

/* attend_one for head_dim a multiple of 8 up to 256, in AVX2 registers: the query stays in
 * registers over the positions, and the output in 64-wide chunks over the positions (where the
 * portable form loads and stores the whole output row for every position). Every (token, head)
 * of a process runs this same code, so prefill and decode still give the same bits. f16 is a
 * constant in each caller below, so each form is compiled without the test. */
AVX2 static inline __attribute__((always_inline)) void attend_avx2(const struct att_job *j, int t, int h, float *a,
                                                                   const bool f16)
{
    int kv_dim = j->n_head_kv * j->head_dim, hd = j->head_dim, nv = hd / 8, last = j->pos + t;
    int kvh = h / (j->n_head / j->n_head_kv), lo = first_row(j, last);
    float scale = 1.0f / sqrtf((float)hd);
    const float *qh = j->q + ((size_t)t * j->n_head + h) * hd;
    const void *k = j->k_cache, *v = j->v_cache;
    size_t head = (size_t)kvh * hd; /* the KV head's first element in a row */
    __m256 q[32];
    for (int i = 0; i < nv; i++)
        q[i] = _mm256_loadu_ps(qh + 8 * i);
    if (nv == 8) { /* head_dim 64: the loop below with its count known, the query in registers */
        __m256 q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3], q4 = q[4], q5 = q[5], q6 = q[6], q7 = q[7];
        int p = lo;
        if (j->wide && j->blocks) /* a window's rows up to a tile's start (then runs are whole blocks) */
            for (; p <= last && (p & 15); p++)
                a[p] = score64_avx2(qh, k, head + row_at(j, p, kv_dim), scale, f16);
        /* the 16-row tiles a run at a time; only the last run (the only one not whole blocks,
         * which are multiples of 16 rows) leaves rows to the loop below */
        while (j->wide && p <= last) {
            int e = run_end(j, p, last + 1);
            size_t kb = head + row_at(j, p, kv_dim);
            p += f16 ? scores16_avx512_f16(qh, k, kb, kv_dim, e - p, scale, a + p)
                     : scores16_avx512_f32(qh, k, kb, kv_dim, e - p, scale, a + p);
            if (p < e)
                break;
        }
        while (p <= last) { /* a run of rows at a time: its rows kv_dim elements apart */
            int e = run_end(j, p, last + 1);
            for (size_t kp = head + row_at(j, p, kv_dim); p < e; p++, kp += kv_dim) {
                __m256 acc0 = _mm256_mul_ps(q0, load8(k, kp, f16));
                __m256 acc1 = _mm256_fmadd_ps(q1, load8(k, kp + 8, f16), _mm256_setzero_ps());
                acc0 = _mm256_fmadd_ps(q2, load8(k, kp + 16, f16), acc0);
                acc1 = _mm256_fmadd_ps(q3, load8(k, kp + 24, f16), acc1);
                acc0 = _mm256_fmadd_ps(q4, load8(k, kp + 32, f16), acc0);
                acc1 = _mm256_fmadd_ps(q5, load8(k, kp + 40, f16), acc1);
                acc0 = _mm256_fmadd_ps(q6, load8(k, kp + 48, f16), acc0);
                acc1 = _mm256_fmadd_ps(q7, load8(k, kp + 56, f16), acc1);
                a[p] = hsum8f(_mm256_add_ps(acc0, acc1)) * scale;
            }
        }
    }
    for (int p = lo; p <= last && nv != 8;) {
        int e = run_end(j, p, last + 1);
        for (size_t kp = head + row_at(j, p, kv_dim); p < e; p++, kp += kv_dim) {
            __m256 acc0 = _mm256_mul_ps(q[0], load8(k, kp, f16)), acc1 = _mm256_setzero_ps();
            for (int i = 1; i + 1 < nv; i += 2) {
                acc1 = _mm256_fmadd_ps(q[i], load8(k, kp + 8 * i, f16), acc1);
                acc0 = _mm256_fmadd_ps(q[i + 1], load8(k, kp + 8 * i + 8, f16), acc0);
            }
            if (!(nv & 1))
                acc1 = _mm256_fmadd_ps(q[nv - 1], load8(k, kp + 8 * (nv - 1), f16), acc1);
            a[p] = hsum8f(_mm256_add_ps(acc0, acc1)) * scale;
        }
    }
    softmax8(a + lo, last + 1 - lo, sink_of(j, h));
    float *o = j->out + ((size_t)t * j->n_head + h) * hd;
    for (int c = 0; c < nv; c += 8) {
        int m = nv - c < 8 ? nv - c : 8;
        if (m == 8) { /* a constant count, so the eight sums stay in registers (with m they
                       * went through the stack: a store and a load per product) */
            __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
            for (int p = lo; p <= last;) {
                int e = run_end(j, p, last + 1);
                for (size_t vp = head + row_at(j, p, kv_dim) + 8 * c; p < e; p++, vp += kv_dim) {
                    __m256 wgt = _mm256_set1_ps(a[p]);
                    o0 = _mm256_fmadd_ps(wgt, load8(v, vp, f16), o0);
                    o1 = _mm256_fmadd_ps(wgt, load8(v, vp + 8, f16), o1);
                    o2 = _mm256_fmadd_ps(wgt, load8(v, vp + 16, f16), o2);
                    o3 = _mm256_fmadd_ps(wgt, load8(v, vp + 24, f16), o3);
                    o4 = _mm256_fmadd_ps(wgt, load8(v, vp + 32, f16), o4);
                    o5 = _mm256_fmadd_ps(wgt, load8(v, vp + 40, f16), o5);
                    o6 = _mm256_fmadd_ps(wgt, load8(v, vp + 48, f16), o6);
                    o7 = _mm256_fmadd_ps(wgt, load8(v, vp + 56, f16), o7);
                }
            }
            float *oc = o + 8 * c;
            _mm256_storeu_ps(oc, o0);
            _mm256_storeu_ps(oc + 8, o1);
            _mm256_storeu_ps(oc + 16, o2);
            _mm256_storeu_ps(oc + 24, o3);
            _mm256_storeu_ps(oc + 32, o4);
            _mm256_storeu_ps(oc + 40, o5);
            _mm256_storeu_ps(oc + 48, o6);
            _mm256_storeu_ps(oc + 56, o7);
            continue;
        }
        __m256 acc[8];
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_setzero_ps();
        for (int p = lo; p <= last;) {
            int e = run_end(j, p, last + 1);
            for (size_t vp = head + row_at(j, p, kv_dim) + 8 * c; p < e; p++, vp += kv_dim) {
                __m256 wgt = _mm256_set1_ps(a[p]);
                for (int i = 0; i < m; i++)
                    acc[i] = _mm256_fmadd_ps(wgt, load8(v, vp + 8 * i, f16), acc[i]);
            }
        }
        for (int i = 0; i < m; i++)
            _mm256_storeu_ps(o + 8 * (c + i), acc[i]);
    }
}

AVX2 static void attend_one_avx2(const struct att_job *j, int t, int h, float *a) { attend_avx2(j, t, h, a, false); }
AVX2 static void attend_one_avx2_f16(const struct att_job *j, int t, int h, float *a) { attend_avx2(j, t, h, a, true); }
#else
#define ATT_AVX2 0
#define ATT_AVX512 0
#endif

/* Head h of query token t (at position pos + t), its scores in a (pos + t + 1 floats). */
static void attend_one(const struct att_job *j, int t, int h, float *a)
{
#if ATT_AVX2
    if (j->fast) {
        if (j->f16)
            attend_one_avx2_f16(j, t, h, a);
        else
            attend_one_avx2(j, t, h, a);
        return;
    }
#endif
    int kv_dim = j->n_head_kv * j->head_dim, hd = j->head_dim, last = j->pos + t;
    int kvh = h / (j->n_head / j->n_head_kv), lo = first_row(j, last);
    float scale = 1.0f / sqrtf((float)hd);
    const float *qh = j->q + ((size_t)t * j->n_head + h) * hd;
    float mx = j->sinks ? j->sinks[h] : -INFINITY, kt[CPU_ATT_F16_MAX_HD];
    for (int p = lo; p <= last; p++) {
        size_t at = row_at(j, p, kv_dim) + (size_t)kvh * hd;
        const float *kp = kt;
        if (j->f16) /* widened a row at a time (exact): the f32 form's bits over those values */
            cpu_f16_to_f32(kt, (const uint16_t *)j->k_cache + at, (size_t)hd);
        else
            kp = (const float *)j->k_cache + at;
        a[p] = cpu_dot_f32(qh, kp, hd) * scale;
        if (a[p] > mx)
            mx = a[p];
    }
    float sum = j->sinks ? expf(j->sinks[h] - mx) : 0.0f; /* the sink: no value row */
    for (int p = lo; p <= last; p++) {
        a[p] = expf(a[p] - mx);
        sum += a[p];
    }
    float *o = j->out + ((size_t)t * j->n_head + h) * hd;
    if (j->f16)
        weighted_rows_f16(o, j, j->v_cache, (size_t)kvh * hd, kv_dim, a, lo, last + 1, sum, hd);
    else
        weighted_rows(o, j, j->v_cache, (size_t)kvh * hd, kv_dim, a, lo, last + 1, sum, hd);
}

/* Head h of query token t, or heads h and h + 1 where the job goes in pairs (j->pairs: the
 * same bits), scores in a and a1. */
static void attend_heads(const struct att_job *j, int t, int h, float *a, float *a1)
{
#if ATT_AVX512
    if (j->pairs) {
        attend_pair_avx512(j, t, h, a, a1);
        return;
    }
#endif
    (void)a1;
    attend_one(j, t, h, a);
}

/* One decode token: the heads this thread claims, scores at att + h * (pos + 1). */
static void decode_worker(void *p, int ith, int nth)
{
    struct att_job *j = p;
    int group = j->n_head / j->n_head_kv;
    (void)ith; (void)nth;
    for (int h0; (h0 = cpu_claim(&j->next, group, j->n_head)) >= 0;)
        for (int h = h0; h < h0 + group; h += j->pairs ? 2 : 1)
            attend_heads(j, 0, h, j->att + (size_t)h * (j->pos + 1), j->att + (size_t)(h + 1) * (j->pos + 1));
}

/* Query tokens a prefill claim takes, for one KV head's group of query heads. */
#define PREFILL_TOKENS 16

/* A prefill chunk: the (KV head, block of PREFILL_TOKENS tokens) units this thread claims,
 * KV head by KV head, each for the query heads that read it; scores in its own row of att
 * (the (n_head, n_ctx) scratch holds nth rows of pos + n floats while nth <= n_head).
 * Why this order: one KV head's K and V rows (pos + n rows of head_dim floats each) stay in
 * the core's L2 over many tokens, where token by token over all heads (the old order) reads all
 * of a layer's K and V for every token. At 512 positions (2 MB a layer at n_embd 1024) that
 * measured no different on a core with 2 MB of L2; it is for contexts whose K and V do not fit. */
static void prefill_worker(void *p, int ith, int nth)
{
    struct att_job *j = p;
    /* a row of att for each head at once (2 in pairs: run_capped leaves enough) */
    float *a = j->att + (size_t)ith * (j->pairs ? 2 : 1) * (j->pos + j->n), *a1 = a + (j->pos + j->n);
    int group = j->n_head / j->n_head_kv, blocks = (j->n + PREFILL_TOKENS - 1) / PREFILL_TOKENS;
    (void)nth;
    for (int u; (u = cpu_claim(&j->next, 1, j->n_head_kv * blocks)) >= 0;) {
        int kvh = u / blocks, t0 = (u % blocks) * PREFILL_TOKENS;
        int t1 = t0 + PREFILL_TOKENS < j->n ? t0 + PREFILL_TOKENS : j->n;
        for (int t = t0; t < t1; t++)
            for (int h = kvh * group; h < (kvh + 1) * group; h += j->pairs ? 2 : 1)
                attend_heads(j, t, h, a, a1);
    }
}

/* The threads that share one job: at most n_head (n_head / 2 in pairs), so each has its att
 * rows. */
struct capped { cpu_job_fn fn; struct att_job *j; };

static void capped_worker(void *p, int ith, int nth)
{
    const struct capped *c = p;
    int rows = c->j->pairs && c->j->n > 1 ? c->j->n_head / 2 : c->j->n_head; /* prefill: att rows a thread */
    int use = nth < rows ? nth : rows;
    if (ith < use)
        c->fn((void *)c->j, ith, use);
}

static void run_capped(void *ctx, cpu_job_fn fn, struct att_job *j)
{
    struct capped c = {fn, j};
    cpu_pool_run(ctx, capped_worker, &c);
}

/* blocks NULL: the caches are contiguous (block_rows unused) */
static void attention_run(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                          int n_head_kv, int head_dim, const float *sinks, int window, enum cpu_isa isa)
{
    struct att_job j = {.q = q, .k_cache = k_cache, .v_cache = v_cache, .out = out, .att = att, .n = n, .pos = pos,
                        .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = head_dim, .f16 = f16,
                        .blocks = blocks, .shift = blocks ? __builtin_ctz((unsigned)block_rows) : 0,
                        .sinks = sinks, .window = window};
#if ATT_AVX2
    if (__atomic_load_n(&have_avx2, __ATOMIC_RELAXED) < 0) {
        __builtin_cpu_init();
        __atomic_store_n(&have_avx2, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                         __builtin_cpu_supports("f16c"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&have_avx512, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"),
                         __ATOMIC_RELAXED);
    }
    j.fast = have_avx2 && head_dim % 8 == 0 && head_dim <= 256;
    if (isa == CPU_ISA_BEST)
        isa = cpu_quant_isa_best();
    j.wide = j.fast && have_avx512 && isa == CPU_ISA_AVX512VNNI && head_dim == 64;
    j.pairs = j.wide && (n_head / n_head_kv) % 2 == 0;
#else
    (void)isa;
#endif
    /* rows of K and V the whole call reads, times the head width: short contexts are cheaper
     * than waking the pool */
    size_t work = (size_t)n * (size_t)(pos + n) * (size_t)n_head * (size_t)head_dim;
    if (work < 32768) {
        if (n == 1)
            decode_worker(&j, 0, 1);
        else
            prefill_worker(&j, 0, 1);
        return;
    }
    run_capped(ctx, n == 1 ? decode_worker : prefill_worker, &j);
}

void cpu_attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out, float *att,
                   int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    attention_run(ctx, q, k_cache, v_cache, false, NULL, 0, out, att, n, pos, n_head, n_head_kv, head_dim, NULL, 0,
                  CPU_ISA_BEST);
}

void cpu_attention_isa(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16, float *out,
                       float *att, int n, int pos, int n_head, int n_head_kv, int head_dim, enum cpu_isa isa)
{
    attention_run(ctx, q, k_cache, v_cache, f16, NULL, 0, out, att, n, pos, n_head, n_head_kv, head_dim, NULL, 0, isa);
}

void cpu_attention_f16(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache, float *out,
                       float *att, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    attention_run(ctx, q, k_cache, v_cache, true, NULL, 0, out, att, n, pos, n_head, n_head_kv, head_dim, NULL, 0, CPU_ISA_BEST);
}

void cpu_attention_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                         const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                         int n_head_kv, int head_dim)
{
    attention_run(ctx, q, k_pool, v_pool, f16, blocks, block_rows, out, att, n, pos, n_head, n_head_kv, head_dim,
                  NULL, 0, CPU_ISA_BEST);
}

void cpu_attention_paged_isa(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                             const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos,
                             int n_head, int n_head_kv, int head_dim, enum cpu_isa isa)
{
    attention_run(ctx, q, k_pool, v_pool, f16, blocks, block_rows, out, att, n, pos, n_head, n_head_kv, head_dim,
                  NULL, 0, isa);
}

void cpu_attention_sinks(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                         const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                         int n_head_kv, int head_dim, const float *sinks, int window)
{
    attention_run(ctx, q, k_cache, v_cache, f16, blocks, block_rows, out, att, n, pos, n_head, n_head_kv, head_dim,
                  sinks, window, CPU_ISA_BEST);
}
