/* cpu_quant_vnni.c - AVX-512 VNNI tiles of eight int8 dot products for the 32-value block types
 * with one scale a block (q8_0, q4_0, q5_0 and MXFP4) or a scale and a minimum (q5_1),
 * and a GEMM over repacked rows for prefill (the CPU backend's decode and prefill matmuls on
 * CPUs that have them; cpu_quant_vnni.h).
 *
 * Why tiles: with AVX2 a row's dot product is integer sums per block and then a scalar float
 * combine, block after block, for one (row, vector) at a time; for prefill the row's blocks
 * are decoded again for every vector. Here eight products advance together: the weight codes
 * are decoded once per block for eight vectors (or the activation block loaded once for eight
 * rows), vpdpbusd makes each block's sum in one instruction, and the combine is one vector
 * multiply-multiply-add for the eight.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones, so the weight codes are made unsigned:
 * q8_0 codes + 128 (a sign-bit flip), q4_0's nibbles and q5_0's and q5_1's five-bit codes as
 * they are (q4_0's - 8 and q5_0's - 16 moved out), MXFP4's doubled e2m1 values (mxfp4_values,
 * -12..12) + 12, looked up from the nibbles by a byte shuffle; the offset times the activation
 * block's sum is subtracted after. The block scale is the f16 d, or MXFP4's 2^(e - 128) made
 * from its exponent byte with mxfp4_scale's bits. All of this is exact integer
 * arithmetic, so each lane's block sum is the integer the scalar kernel makes, and its float
 * combine is the scalar one's: (d_w * d_x) * (float)sum added to the running sum in block
 * order, for q5_1 with its minimum's (m_w * d_x) * (float)(the activation codes' sum) added to
 * that first, rounded the same (-std=c11 keeps fp-contract off, and the intrinsics used here are
 * plain multiplies and adds). The results therefore have the bits of cpu_quant_dot. */
#include "cpu_quant_vnni.h"
#include "gguf.h"
#include "quants.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

bool cpu_quant_vnni_cpu(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}

bool cpu_quant_vnni_has(uint32_t type)
{
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1 ||
           type == GGML_TYPE_MXFP4;
}

/* What the unsigned weight codes exceed the signed ones by (w . x = u . x - offset * sum x). */
static int code_offset(uint32_t type)
{
    return type == GGML_TYPE_Q8_0 ? 128 : type == GGML_TYPE_Q4_0 ? 8 : type == GGML_TYPE_Q5_0 ? 16
           : type == GGML_TYPE_Q5_1 ? 0 : 12;
}

/* the lane sums of eight vectors, as one vector (v[k]'s sum in lane k) */
VNNI static inline __m256i sum8x8(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* A block's 32 weight codes as unsigned bytes: q8_0's + 128, q4_0's nibbles (low ones for
 * values 0-15, high ones for 16-31: the order of the activation codes). */
VNNI static inline __m256i codes_q8_0(const uint8_t *blk)
{
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
}
VNNI static inline __m256i codes_q4_0(const uint8_t *blk)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}
/* q5_0 and q5_1: the nibbles (after qh) as q4_0's, and value j's fifth bit, bit j of qh (q5_0:
 * bytes 2-5; q5_1: 4-7), as 16: byte j of the vector takes qh's byte j / 8 and tests its bit j % 8 */
VNNI static inline __m256i codes_q5(const uint8_t *blk, int qh_at)
{
    uint32_t qh;
    memcpy(&qh, blk + qh_at, 4);
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + qh_at + 4));
    __m256i lo = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
    __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                    _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
    return _mm256_or_si256(lo, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
}
VNNI static inline __m256i codes_q5_0(const uint8_t *blk) { return codes_q5(blk, 2); }
VNNI static inline __m256i codes_q5_1(const uint8_t *blk) { return codes_q5(blk, 4); }
/* MXFP4's 16 code values + 12, for a byte shuffle */
VNNI static inline __m128i mxfp4_table(void)
{
    return _mm_add_epi8(_mm_loadu_si128((const __m128i *)mxfp4_values), _mm_set1_epi8(12));
}
/* MXFP4: the nibbles (at byte 1) in q4_0's order, each looked up as its value + 12 */
VNNI static inline __m256i codes_mxfp4(const uint8_t *blk)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + 1));
    __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(mxfp4_table()), n);
}

/* f16 as f32, exact (the scalar path's table gives the same value) */
VNNI static inline float f16_value(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* eight 32-bit words' low halves, read as f16 */
VNNI static inline __m256 low_f16s(__m256i g) { return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)); }

/* eight 32-bit words' low bytes, read as MXFP4 exponents: 2^(e - 128), mxfp4_scale's bits */
VNNI static inline __m256 mxfp4_scales(__m256i g)
{
    __m256i e = _mm256_and_si256(g, _mm256_set1_epi32(0xff));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e); /* e < 2 */
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}
VNNI static inline float f16_scale(const uint8_t *blk) { return f16_value(blk); }
VNNI static inline float mxfp4_scale1(const uint8_t *blk) { return mxfp4_scale(blk[0]); }

/* A block's term, t = (d_w * d_x) * sum, and for q5_1 the minimum's added to it (as combine()
 * adds them): eight rows' (g: the words at their blocks' starts, f16 d | f16 m << 16) with one
 * vector's d_x and code sum xs, or one row's (blk) with eight vectors' dx8 and xs8. */
VNNI static inline __m256 no_min8(__m256 t, __m256i g, __m256 dx, int xs)
{
    (void)g; (void)dx; (void)xs;
    return t;
}
VNNI static inline __m256 q5_1_min8(__m256 t, __m256i g, __m256 dx, int xs)
{
    __m256 m = low_f16s(_mm256_srli_epi32(g, 16));
    return _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(m, dx), _mm256_set1_ps((float)xs)));
}
VNNI static inline __m256 no_min1(__m256 t, const uint8_t *blk, __m256 dx8, __m256i xs8)
{
    (void)blk; (void)dx8; (void)xs8;
    return t;
}
VNNI static inline __m256 q5_1_min1(__m256 t, const uint8_t *blk, __m256 dx8, __m256i xs8)
{
    __m256 m = _mm256_set1_ps(f16_value(blk + 2));
    return _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(m, dx8), _mm256_cvtepi32_ps(xs8)));
}

/* Eight rows with one vector (decode) for the nibble types (q4_0: LOOKUP the identity; MXFP4: its
 * table; q5_0 and q5_1: FIFTH adds their fifth bits, the others' FIFTH does nothing): four rows'
 * 16 code bytes share a 512-bit register (row 4p + l in 128-bit lane l), their low and high
 * nibbles meet the vector's codes 0-15 and 16-31 broadcast to every lane, so one decode and two
 * vpdpbusd make four rows' four partial sums each, and two 64-bit unpacks, a pair swap and a
 * permute gather the eight rows' block sums (eight rows one at a time took six horizontal adds;
 * two rows a 256-bit register measured 12-17% slower). Same integers, same combine, same bits.
 * AT: where a block's nibble bytes start; BB: a block's bytes; OFF: the codes' unsigned offset;
 * SCALES8: the eight rows' block scales from the 32-bit words at their blocks' starts; MIN8:
 * q5_1's minimum term (no_min8 for the others). */
#define ROWS8_NIBBLES(AT, BB, OFF, LOOKUP, FIFTH, SCALES8, MIN8)                                        \
    do {                                                                                               \
        const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),             \
                                                _mm256_set1_epi32((int)row_bytes));                    \
        const __m512i nib = _mm512_set1_epi8(0x0f);                                                    \
        const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);     \
        __m256 s = _mm256_setzero_ps();                                                                \
        for (int b = 0; b < nb; b++) {                                                                 \
            const uint8_t *blk = w + (size_t)b * (BB);                                                 \
            if (!(b & 1))                                                                              \
                for (int k = 8; k < 16; k++)                                                           \
                    _mm_prefetch((const char *)(blk + (size_t)k * row_bytes), _MM_HINT_T0);          \
            __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)x[b].q));            \
            __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x[b].q + 16)));     \
            __m512i t[2];                                                                              \
            for (int p = 0; p < 2; p++) {                                                              \
                const uint8_t *r0 = blk + (size_t)(4 * p) * row_bytes + (AT);                          \
                __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)r0));              \
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r0 + row_bytes)), 1);     \
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r0 + 2 * row_bytes)), 2); \
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r0 + 3 * row_bytes)), 3); \
                __m512i lo = LOOKUP(_mm512_and_si512(v, nib));                                         \
                __m512i hi = LOOKUP(_mm512_and_si512(_mm512_srli_epi16(v, 4), nib));                   \
                FIFTH(&lo, &hi, r0 - (AT), row_bytes);                                                 \
                t[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh); \
            }                                                                                          \
            __m512i s1 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1])); \
            __m512i s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32(s1, (_MM_PERM_ENUM)0xB1));          \
            __m256i sums = _mm512_castsi512_si256(_mm512_permutexvar_epi32(pick, s2));                 \
            __m256i is = _mm256_sub_epi32(sums, _mm256_set1_epi32((int32_t)x[b].sum * (OFF)));         \
            __m256i g = _mm256_i32gather_epi32((const int *)blk, offs, 1);                             \
            __m256 dx = _mm256_set1_ps(f16_value((const uint8_t *)&x[b].d));                           \
            s = _mm256_add_ps(s, MIN8(_mm256_mul_ps(_mm256_mul_ps(SCALES8(g), dx), _mm256_cvtepi32_ps(is)), \
                                      g, dx, x[b].sum));                                               \
        }                                                                                              \
        _mm256_storeu_ps(out, s);                                                                      \
    } while (0)

VNNI static inline __m512i nibbles_as_they_are(__m512i n) { return n; }
VNNI static inline __m512i nibbles_mxfp4(__m512i n)
{
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(mxfp4_table()), n);
}
VNNI static inline void no_fifth_bits(__m512i *lo, __m512i *hi, const uint8_t *b0, size_t row_bytes)
{
    (void)lo; (void)hi; (void)b0; (void)row_bytes;
}
/* q5_0's (QH_AT 2) and q5_1's (4) fifth bits for four rows' blocks (b0, row_bytes apart), row l in
 * lane l: values 0-15 (lo) take bits 0-15 of the block's qh, values 16-31 (hi) bits 16-31, as 16 */
VNNI static inline void q5_fifth_bits(__m512i *lo, __m512i *hi, const uint8_t *b0, size_t row_bytes, int qh_at)
{
    int32_t q0, q1, q2, q3;
    memcpy(&q0, b0 + qh_at, 4);
    memcpy(&q1, b0 + row_bytes + qh_at, 4);
    memcpy(&q2, b0 + 2 * row_bytes + qh_at, 4);
    memcpy(&q3, b0 + 3 * row_bytes + qh_at, 4);
    __m512i qh = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                          _mm512_castsi128_si512(_mm_setr_epi32(q0, q1, q2, q3)));
    const __m512i bit = _mm512_set1_epi64((long long)0x8040201008040201ULL), f = _mm512_set1_epi8(0x10);
    const __m512i sel_lo = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m512i sel_hi = _mm512_add_epi8(sel_lo, _mm512_set1_epi8(2));
    *lo = _mm512_mask_add_epi8(*lo, _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, sel_lo), bit), *lo, f);
    *hi = _mm512_mask_add_epi8(*hi, _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, sel_hi), bit), *hi, f);
}
VNNI static inline void q5_0_fifth_bits(__m512i *lo, __m512i *hi, const uint8_t *b0, size_t row_bytes)
{
    q5_fifth_bits(lo, hi, b0, row_bytes, 2);
}
VNNI static inline void q5_1_fifth_bits(__m512i *lo, __m512i *hi, const uint8_t *b0, size_t row_bytes)
{
    q5_fifth_bits(lo, hi, b0, row_bytes, 4);
}

/* One row with eight vectors (prefill rows the GEMM leaves): CODES decodes the row's block once
 * for the eight; SCALE1 is its block scale, MIN1 q5_1's minimum term (no_min1 for the others). */
#define VECS8(CODES, BB, OFF, SCALE1, MIN1)                                                        \
    do {                                                                                               \
        const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),             \
                                                _mm256_set1_epi32((int)act_stride));                   \
        const uint8_t *xb = (const uint8_t *)x;                                                        \
        __m256 s = _mm256_setzero_ps();                                                                \
        for (int b = 0; b < nb; b++, xb += sizeof(struct act32)) {                                     \
            const uint8_t *blk = w + (size_t)b * (BB);                                                 \
            __m256i wc = CODES(blk), v[8];                                                             \
            for (int k = 0; k < 8; k++)                                                                \
                v[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wc,                                 \
                    _mm256_loadu_si256((const __m256i *)(xb + (size_t)k * act_stride + 4)));           \
            __m256i g = _mm256_i32gather_epi32((const int *)xb, offs, 1); /* d | sum << 16 */          \
            __m256i xs = _mm256_srai_epi32(g, 16);                                                     \
            __m256i is = _mm256_sub_epi32(sum8x8(v), _mm256_mullo_epi32(xs, _mm256_set1_epi32(OFF)));    \
            __m256 dw = _mm256_set1_ps(SCALE1(blk)), dx = low_f16s(g);                                 \
            s = _mm256_add_ps(s, MIN1(_mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(is)), blk, dx, xs)); \
        }                                                                                              \
        _mm256_storeu_ps(out, s);                                                                      \
    } while (0)

/* q8_0's eight rows with one vector, two rows' 32 codes (+ 128) a 512-bit register: four vpdpbusd
 * for the eight rows (a row a 256-bit register took eight, 10-14% slower), and their block sums
 * gathered by unpacks, pair and lane swaps, a blend and a permute instead of six horizontal adds.
 * The combine is ROWS8_NIBBLES' above, with q8_0's f16 scales: same integers, same bits. */
VNNI static void rows8_q8_0(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)row_bytes));
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    /* after the reduction below, row r's sum is in dword pick[r] */
    const __m512i pick = _mm512_setr_epi32(0, 8, 2, 10, 1, 9, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    __m256 s = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 34;
        if (!(b & 1)) /* the next 8 rows' lines as these stream by (see cpu_f16.c tile_direct) */
            for (int k = 8; k < 16; k++)
                _mm_prefetch((const char *)(blk + (size_t)k * row_bytes), _MM_HINT_T0);
        __m512i xq = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[b].q)), t[4];
        for (int p = 0; p < 4; p++) { /* rows 2p (lanes 0-1) and 2p + 1 (lanes 2-3) */
            const uint8_t *r0 = blk + (size_t)(2 * p) * row_bytes + 2;
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0)),
                                           _mm256_loadu_si256((const __m256i *)(r0 + row_bytes)), 1);
            t[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(v, flip), xq);
        }
        /* each 128-bit lane L's four dwords to one: u (t0, t1) and v (t2, t3) hold lane sums at
         * dwords 0 and 2; w = [t0 L, t2 L, t1 L, t3 L] in lane L; lanes 0 + 1 and 2 + 3 added */
        __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
        __m512i v = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]), _mm512_unpackhi_epi64(t[2], t[3]));
        u = _mm512_add_epi32(u, _mm512_shuffle_epi32(u, (_MM_PERM_ENUM)0xB1));
        v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0xB1));
        __m512i wl = _mm512_mask_blend_epi32(0xAAAA, u, _mm512_bslli_epi128(v, 4));
        wl = _mm512_add_epi32(wl, _mm512_shuffle_i32x4(wl, wl, _MM_SHUFFLE(2, 3, 0, 1)));
        __m256i sums = _mm512_castsi512_si256(_mm512_permutexvar_epi32(pick, wl));
        __m256i is = _mm256_sub_epi32(sums, _mm256_set1_epi32((int32_t)x[b].sum * 128));
        __m256 dw = low_f16s(_mm256_i32gather_epi32((const int *)blk, offs, 1));
        __m256 dx = _mm256_set1_ps(f16_value((const uint8_t *)&x[b].d));
        s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(is)));
    }
    _mm256_storeu_ps(out, s);
}
VNNI static void rows8_q4_0(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    ROWS8_NIBBLES(2, 18, 8, nibbles_as_they_are, no_fifth_bits, low_f16s, no_min8);
}
VNNI static void rows8_q5_0(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    ROWS8_NIBBLES(6, Q5_0_BYTES, 16, nibbles_as_they_are, q5_0_fifth_bits, low_f16s, no_min8);
}
VNNI static void rows8_q5_1(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    ROWS8_NIBBLES(8, Q5_1_BYTES, 0, nibbles_as_they_are, q5_1_fifth_bits, low_f16s, q5_1_min8);
}
VNNI static void rows8_mxfp4(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    ROWS8_NIBBLES(1, MXFP4_BYTES, 12, nibbles_mxfp4, no_fifth_bits, mxfp4_scales, no_min8);
}
VNNI static void vecs8_q8_0(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_q8_0, 34, 128, f16_scale, no_min1);
}
VNNI static void vecs8_q4_0(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_q4_0, 18, 8, f16_scale, no_min1);
}
VNNI static void vecs8_q5_0(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_q5_0, Q5_0_BYTES, 16, f16_scale, no_min1);
}
VNNI static void vecs8_q5_1(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_q5_1, Q5_1_BYTES, 0, f16_scale, q5_1_min1);
}
VNNI static void vecs8_mxfp4(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_mxfp4, MXFP4_BYTES, 12, mxfp4_scale1, no_min1);
}

void cpu_quant_vnni_rows8(uint32_t type, const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb,
                          float out[8])
{
    switch (type) {
    case GGML_TYPE_Q8_0: rows8_q8_0(w, row_bytes, x, nb, out); break;
    case GGML_TYPE_Q4_0: rows8_q4_0(w, row_bytes, x, nb, out); break;
    case GGML_TYPE_Q5_0: rows8_q5_0(w, row_bytes, x, nb, out); break;
    case GGML_TYPE_Q5_1: rows8_q5_1(w, row_bytes, x, nb, out); break;
    default: rows8_mxfp4(w, row_bytes, x, nb, out); break;
    }
}

void cpu_quant_vnni_vecs8(uint32_t type, const uint8_t *w, const struct act32 *x, size_t act_stride, int nb,
                          float out[8])
{
    switch (type) {
    case GGML_TYPE_Q8_0: vecs8_q8_0(w, x, act_stride, nb, out); break;
    case GGML_TYPE_Q4_0: vecs8_q4_0(w, x, act_stride, nb, out); break;
    case GGML_TYPE_Q5_0: vecs8_q5_0(w, x, act_stride, nb, out); break;
    case GGML_TYPE_Q5_1: vecs8_q5_1(w, x, act_stride, nb, out); break;
    default: vecs8_mxfp4(w, x, act_stride, nb, out); break;
    }
}

/* ---- prefill: a GEMM over weights repacked per 16 rows ----
 * The tiles above make each block's integer sum in eight lanes and then add the lanes (a
 * horizontal sum per block and product). Here the weight codes of 16 rows are repacked, a
 * block at a time, so that one 512-bit register holds four codes of each of the 16 rows (lane
 * r: row r's codes 4k..4k+3 of the block); vpdpbusd with the vector's four codes 4k..4k+3
 * broadcast to every lane then adds four products to each row's sum, and after the block's
 * eight such steps lane r holds row r's block sum, complete: no horizontal sum. The repacking
 * is paid once per 16 rows and GEMM_BLOCKS blocks for all the vectors, which is why it is for
 * prefill (at least 8 vectors). The sums start from -offset * (the vector block's code sum), so
 * they end as the exact signed sums; the float combine is the scalar one, (d_w * d_x) * sum
 * added in block order, in 16 lanes: the bits of cpu_quant_dot again. */
#define GEMM_ROWS 16
#define GEMM_BLOCKS 64 /* blocks repacked at once: 32 KB of codes */
#ifndef GEMM_VECS
#define GEMM_VECS 8    /* vectors a tile */
#endif

struct packed16 {
    uint8_t codes[GEMM_BLOCKS][8][64]; /* [block][k][4 * row + j]: the row's code 4k + j, unsigned */
    float dw[GEMM_BLOCKS][GEMM_ROWS];  /* the rows' block scales */
    float mw[GEMM_BLOCKS][GEMM_ROWS];  /* q5_1: the rows' block minimums */
};

/* 16 rows' blocks b0..b0+nc repacked (q8_0: codes + 128; q4_0: the nibbles; q5_0 and q5_1: the
 * nibbles and fifth bits; MXFP4: the values + 12), with their scales (and q5_1's minimums) */
VNNI static void repack16(uint32_t type, const uint8_t *w, size_t row_bytes, int b0, int nc, struct packed16 *pk)
{
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)row_bytes));
    const __m512i nib = _mm512_set1_epi8(0x0f), fp4 = _mm512_broadcast_i32x4(mxfp4_table());
    size_t bb = ggml_row_size(type, 32);
    /* where the codes start: the 16 nibble bytes (codes 4k..4k+3 of a row: the low nibbles of
     * bytes 4k.. for k < 4, the high ones of bytes 4(k - 4).. after), or q8_0's 32 bytes */
    bool q5 = type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1;
    int qh_at = type == GGML_TYPE_Q5_1 ? 4 : 2;
    int at = q5 ? qh_at + 4 : type == GGML_TYPE_MXFP4 ? 1 : 2;
    for (int b = 0; b < nc; b++) {
        const uint8_t *blk = w + (size_t)(b0 + b) * bb;
        __m512i d = _mm512_i32gather_epi32(rows, (const void *)blk, 1);
        if (type == GGML_TYPE_MXFP4) { /* 2^(e - 128) from the exponent byte, as mxfp4_scales */
            __m512i e = _mm512_and_si512(d, _mm512_set1_epi32(0xff));
            __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            d = _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)), normal, sub);
            _mm512_storeu_ps(pk->dw[b], _mm512_castsi512_ps(d));
        } else {
            _mm512_storeu_ps(pk->dw[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
            if (type == GGML_TYPE_Q5_1)
                _mm512_storeu_ps(pk->mw[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16))));
        }
        __m512i qh = q5 ? _mm512_i32gather_epi32(rows, (const void *)(blk + qh_at), 1) : _mm512_setzero_si512();
        for (int k = 0; k < 8; k++) {
            __m512i v;
            if (type == GGML_TYPE_Q8_0) {
                v = _mm512_xor_si512(_mm512_i32gather_epi32(rows, (const void *)(blk + at + 4 * k), 1),
                                     _mm512_set1_epi8((char)0x80));
            } else {
                v = _mm512_and_si512(_mm512_srli_epi32(_mm512_i32gather_epi32(rows, (const void *)(blk + at + 4 * (k & 3)), 1),
                                                       k < 4 ? 0 : 4),
                                     nib);
                if (type == GGML_TYPE_MXFP4)
                    v = _mm512_shuffle_epi8(fp4, v);
                if (q5) { /* code 4k + j's fifth bit (qh bit 4k + j) to bit 4 of byte j */
                    __m512i t = _mm512_srli_epi32(qh, 4 * k);
                    __m512i h = _mm512_or_si512(
                        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(t, _mm512_set1_epi32(1)), 4),
                                        _mm512_slli_epi32(_mm512_and_si512(t, _mm512_set1_epi32(2)), 11)),
                        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(t, _mm512_set1_epi32(4)), 18),
                                        _mm512_slli_epi32(_mm512_and_si512(t, _mm512_set1_epi32(8)), 25)));
                    v = _mm512_or_si512(v, h);
                }
            }
            _mm512_storeu_si512(pk->codes[b][k], v);
        }
    }
}

/* T <= GEMM_VECS vectors (x: their block b0, act_stride bytes apart) against the packed rows'
 * nc blocks: y[t * y_stride + row] for the 16 rows, continuing y's sums past block 0; with_min:
 * the rows' minimums' terms too (q5_1). */
VNNI static inline __attribute__((always_inline)) void gemm_tile(const struct packed16 *pk, int nc, const uint8_t *x,
                                                                 size_t act_stride, int off, bool with_min, bool first,
                                                                 float *y, size_t y_stride, const int T)
{
    __m512 s[GEMM_VECS];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        s[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + (size_t)t * y_stride);
    for (int b = 0; b < nc; b++) {
        __m512i acc[GEMM_VECS];
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const struct act32 *a = (const struct act32 *)(x + (size_t)t * act_stride) + b;
            acc[t] = _mm512_set1_epi32(-((int32_t)a->sum * off));
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i wk = _mm512_loadu_si512(pk->codes[b][k]);
#pragma GCC unroll 12
            for (int t = 0; t < T; t++) {
                const struct act32 *a = (const struct act32 *)(x + (size_t)t * act_stride) + b;
                int32_t q4;
                memcpy(&q4, a->q + 4 * k, 4);
                acc[t] = _mm512_dpbusd_epi32(acc[t], wk, _mm512_set1_epi32(q4));
            }
        }
        __m512 dw = _mm512_loadu_ps(pk->dw[b]), mw = with_min ? _mm512_loadu_ps(pk->mw[b]) : dw;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const struct act32 *a = (const struct act32 *)(x + (size_t)t * act_stride) + b;
            __m512 dx = _mm512_set1_ps(f16_value((const uint8_t *)&a->d));
            __m512 term = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(acc[t]));
            if (with_min)
                term = _mm512_add_ps(term, _mm512_mul_ps(_mm512_mul_ps(mw, dx), _mm512_set1_ps((float)a->sum)));
            s[t] = _mm512_add_ps(s[t], term);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(y + (size_t)t * y_stride, s[t]);
}

/* every vector against one packed chunk: tiles of GEMM_VECS, then the ones left (inlined twice,
 * with_min a constant each time, so q8_0's tiles carry no q5_1 branch) */
VNNI static inline __attribute__((always_inline)) void gemm_chunk(const struct packed16 *pk, int nc, const uint8_t *xc,
                                                                  size_t act_stride, int n, int off, const bool with_min,
                                                                  bool first, float *y, size_t y_stride)
{
    int t = 0;
    for (; t + GEMM_VECS <= n; t += GEMM_VECS)
        gemm_tile(pk, nc, xc + (size_t)t * act_stride, act_stride, off, with_min, first, y + (size_t)t * y_stride,
                  y_stride, GEMM_VECS);
    const uint8_t *xt = xc + (size_t)t * act_stride;
    float *yt = y + (size_t)t * y_stride;
    switch (n - t) {
#define CASE(k) case k: if (k < GEMM_VECS) gemm_tile(pk, nc, xt, act_stride, off, with_min, first, yt, y_stride, k); break;
    CASE(11) CASE(10) CASE(9) CASE(8) CASE(7) CASE(6) CASE(5) CASE(4) CASE(3) CASE(2) CASE(1)
#undef CASE
    }
}

VNNI void cpu_quant_vnni_gemm(uint32_t type, const uint8_t *w, size_t row_bytes, int rows, const struct act32 *x,
                              size_t act_stride, int n, int nb, float *y, size_t y_stride)
{
    static _Thread_local struct packed16 pk; /* 40 KB: not the stack */
    int off = code_offset(type);
    const uint8_t *xb = (const uint8_t *)x;
    for (int r = 0; r + GEMM_ROWS <= rows; r += GEMM_ROWS)
        for (int b0 = 0; b0 < nb; b0 += GEMM_BLOCKS) {
            int nc = nb - b0 < GEMM_BLOCKS ? nb - b0 : GEMM_BLOCKS;
            repack16(type, w + (size_t)r * row_bytes, row_bytes, b0, nc, &pk);
            const uint8_t *xc = xb + (size_t)b0 * sizeof(struct act32);
            if (type == GGML_TYPE_Q5_1)
                gemm_chunk(&pk, nc, xc, act_stride, n, off, true, b0 == 0, y + r, y_stride);
            else
                gemm_chunk(&pk, nc, xc, act_stride, n, off, false, b0 == 0, y + r, y_stride);
        }
}

#else /* not x86-64: never chosen */
bool cpu_quant_vnni_cpu(void) { return false; }
bool cpu_quant_vnni_has(uint32_t type) { (void)type; return false; }
void cpu_quant_vnni_rows8(uint32_t type, const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb,
                          float out[8])
{
    (void)type; (void)w; (void)row_bytes; (void)x; (void)nb; (void)out;
}
void cpu_quant_vnni_vecs8(uint32_t type, const uint8_t *w, const struct act32 *x, size_t act_stride, int nb,
                          float out[8])
{
    (void)type; (void)w; (void)act_stride; (void)x; (void)nb; (void)out;
}
void cpu_quant_vnni_gemm(uint32_t type, const uint8_t *w, size_t row_bytes, int rows, const struct act32 *x,
                         size_t act_stride, int n, int nb, float *y, size_t y_stride)
{
    (void)type; (void)w; (void)row_bytes; (void)rows; (void)x; (void)act_stride; (void)n; (void)nb; (void)y;
    (void)y_stride;
}
#endif
