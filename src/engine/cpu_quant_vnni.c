/* cpu_quant_vnni.c - AVX-512 VNNI tiles of eight int8 dot products for q8_0 and q4_0 weights
 * (the CPU backend's decode and prefill matmuls on CPUs that have them; cpu_quant_vnni.h).
 *
 * Why tiles: with AVX2 a row's dot product is integer sums per block and then a scalar float
 * combine, block after block, for one (row, vector) at a time; for prefill the row's blocks
 * are decoded again for every vector. Here eight products advance together: the weight codes
 * are decoded once per block for eight vectors (or the activation block loaded once for eight
 * rows), vpdpbusd makes each block's sum in one instruction, and the combine is one vector
 * multiply-multiply-add for the eight.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones, so the weight codes are made unsigned:
 * q8_0 codes + 128 (a sign-bit flip), q4_0's nibbles as they are (its - 8 moved out); the
 * offset times the activation block's sum is subtracted after. All of this is exact integer
 * arithmetic, so each lane's block sum is the integer the scalar kernel makes, and its float
 * combine is the scalar one's: (d_w * d_x) * (float)sum added to the running sum in block
 * order, rounded the same (-std=c11 keeps fp-contract off, and the intrinsics used here are
 * plain multiplies and adds). The results therefore have the bits of cpu_quant_dot. */
#include "cpu_quant_vnni.h"
#include "gguf.h"

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

bool cpu_quant_vnni_has(uint32_t type) { return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0; }

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

/* f16 as f32, exact (the scalar path's table gives the same value) */
VNNI static inline float f16_value(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* eight 32-bit words' low halves, read as f16 */
VNNI static inline __m256 low_f16s(__m256i g) { return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)); }

/* The body shared by both tiles and both types: BB bytes a weight block, SHIFT log2 of the
 * weight codes' unsigned offset, CODES the decoder. */
#define ROWS8(CODES, BB, SHIFT)                                                                        \
    do {                                                                                               \
        const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),             \
                                                _mm256_set1_epi32((int)row_bytes));                    \
        __m256 s = _mm256_setzero_ps();                                                                \
        for (int b = 0; b < nb; b++) {                                                                 \
            const uint8_t *blk = w + (size_t)b * (BB);                                                 \
            __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].q), v[8];                            \
            for (int k = 0; k < 8; k++)                                                                \
                v[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), CODES(blk + (size_t)k * row_bytes), xq); \
            __m256i is = _mm256_sub_epi32(sum8x8(v), _mm256_set1_epi32((int32_t)x[b].sum * (1 << (SHIFT))));  \
            __m256 dw = low_f16s(_mm256_i32gather_epi32((const int *)blk, offs, 1));                   \
            __m256 dx = _mm256_set1_ps(f16_value((const uint8_t *)&x[b].d));                           \
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(is)));         \
        }                                                                                              \
        _mm256_storeu_ps(out, s);                                                                      \
    } while (0)

#define VECS8(CODES, BB, SHIFT)                                                                        \
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
            __m256i is = _mm256_sub_epi32(sum8x8(v), _mm256_slli_epi32(_mm256_srai_epi32(g, 16), (SHIFT))); \
            __m256 dw = _mm256_set1_ps(f16_value(blk));                                                \
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(dw, low_f16s(g)), _mm256_cvtepi32_ps(is))); \
        }                                                                                              \
        _mm256_storeu_ps(out, s);                                                                      \
    } while (0)

VNNI static void rows8_q8_0(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    ROWS8(codes_q8_0, 34, 7);
}
VNNI static void rows8_q4_0(const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb, float *out)
{
    ROWS8(codes_q4_0, 18, 3);
}
VNNI static void vecs8_q8_0(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_q8_0, 34, 7);
}
VNNI static void vecs8_q4_0(const uint8_t *w, const struct act32 *x, size_t act_stride, int nb, float *out)
{
    VECS8(codes_q4_0, 18, 3);
}

void cpu_quant_vnni_rows8(uint32_t type, const uint8_t *w, size_t row_bytes, const struct act32 *x, int nb,
                          float out[8])
{
    if (type == GGML_TYPE_Q8_0)
        rows8_q8_0(w, row_bytes, x, nb, out);
    else
        rows8_q4_0(w, row_bytes, x, nb, out);
}

void cpu_quant_vnni_vecs8(uint32_t type, const uint8_t *w, const struct act32 *x, size_t act_stride, int nb,
                          float out[8])
{
    if (type == GGML_TYPE_Q8_0)
        vecs8_q8_0(w, x, act_stride, nb, out);
    else
        vecs8_q4_0(w, x, act_stride, nb, out);
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
#endif
