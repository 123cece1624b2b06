/* cpu_kquant.c - AVX-512 register tiles of int8 dot products for q4_K, q5_K, q6_K and iq4_xs weights
 * (the CPU backend's decode and prefill matmuls on CPUs with AVX-512 VNNI; cpu_kquant.h).
 *
 * Why tiles: cpu_quant.c's AVX2 kernels (in cpu_quant_isums.c) make one (row, vector) product
 * at a time: a super-block's scales are unpacked and its codes decoded again for every vector, the
 * activations loaded again for every row, and each block's integers are combined in scalar
 * float code, block after block. Here a tile of R rows and V vectors (R * V <= 16) advances
 * one super-block at a time: each row's codes are decoded once per 64 values for all V
 * vectors, each vector's 64 activation codes loaded once for all R rows (register blocking),
 * and the float combine is one 16-lane vector expression for the whole tile.
 *
 * The bits: for each (row, vector) and super-block the tile makes the same two integers as
 * cpu_quant.c's kernels (the codes times the activation codes weighted by the integer
 * sub-block scales; and the activations' 16-value sums weighted by the mins, or by q6_K's
 * scales), exactly: byte products summed in int16 (vpmaddubsw: at most 2 * 63 * 127, no
 * saturation) then weighted by the scale and summed in int32 (vpdpwssd). Then each lane runs
 * cpu_quant.c's combine expression for that block, with the same operations in the same order
 * (-std=c11 keeps fp-contract off: the multiplies and adds are not fused), blocks in order.
 * iq4_xs's codes are signed (its non-linear values, -127..113), so its products take the codes'
 * magnitudes and the activation codes with the weight's sign (|w| * (sign(w) x) = w x; at most
 * 2 * 127 * 127 a pair, no saturation), its signed 6-bit scales weight them as the others'
 * scales do, and it has no second integer (no mins: its offw is 0), so its combine is q6_K's.
 * So a row's result is the same bits in a tile of 16, of 4 x 4, or alone in cpu_quant_dot,
 * and does not depend on how many vectors share the matmul (docs/DESIGN.md, "One scheduler
 * step"). */
#include "cpu_kquant.h"
#include "cpu_quant.h"
#include "quants.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define KQ __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define KQ_INLINE KQ static inline __attribute__((always_inline))
/* The AVX2 tiles' ISA (below); its helpers inline into the AVX-512 tiles as well (a subset),
 * so the two kinds of tile share them. */
#define KQ2 __attribute__((target("avx2,f16c")))
#define KQ2_INLINE KQ2 static inline __attribute__((always_inline))

bool cpu_kquant_has(uint32_t type)
{
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K || type == GGML_TYPE_IQ4_XS;
}

/* a type's super-block bytes */
static inline size_t kq_block_bytes(const int type)
{
    return type == GGML_TYPE_Q4_K ? Q4_K_BYTES : type == GGML_TYPE_Q5_K ? Q5_K_BYTES
         : type == GGML_TYPE_Q6_K ? Q6_K_BYTES : IQ4_XS_BYTES;
}

static inline uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4); /* x86: little-endian, as the file */
    return v;
}

/* One row's super-block as the tile's inner loop reads it. */
struct row_block {
    int16_t sc[32];   /* the integer sub-block scales (q4_K/q5_K: 8, q6_K: 16), a vpermw table */
    int16_t offw[16]; /* weights of the activations' 16-value sums: each min twice (q4_K/q5_K),
                       * or q6_K's scales */
};

/* A q4_K/q5_K block's eight 6-bit scales and mins, four at a time in 32-bit words: bytes
 * 0-3 of the field hold scales 0-3 (low 6 bits) and the top bits of scales 4-7, bytes 4-7
 * the same for the mins, bytes 8-11 the low nibbles of scales 4-7 and the mins' 4-7 above
 * them (quants.c's q4k_scale_min, one at a time). SSE4.1 only: the AVX2 tiles use it too. */
KQ2_INLINE void unpack_q45k_scales(const uint8_t *blk, struct row_block *rb)
{
    uint32_t w0 = rd32(blk + 4), w1 = rd32(blk + 8), w2 = rd32(blk + 12);
    uint64_t s = (uint64_t)(w0 & 0x3f3f3f3fu) | (uint64_t)((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u)) << 32;
    uint64_t m = (uint64_t)(w1 & 0x3f3f3f3fu) |
                 (uint64_t)(((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u)) << 32;
    _mm_storeu_si128((__m128i *)rb->sc, _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)s)));
    __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m));
    _mm_storeu_si128((__m128i *)rb->offw, _mm_unpacklo_epi16(m16, m16));
    _mm_storeu_si128((__m128i *)(rb->offw + 8), _mm_unpackhi_epi16(m16, m16));
}

KQ2_INLINE void unpack_q6k_scales(const uint8_t *blk, struct row_block *rb)
{
    __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    _mm256_storeu_si256((__m256i *)rb->sc, s16);
    _mm256_storeu_si256((__m256i *)rb->offw, s16);
}

/* iq4_xs: its eight signed 6-bit scales (quants.c's iq4xs_scale: scale j's low 4 bits are
 * nibble j of the 4 bytes at 4, its high 2 bits bits 2j, 2j + 1 of the u16 at 2; less 32), in
 * eight lanes; no mins */
KQ2_INLINE void unpack_iq4xs_scales(const uint8_t *blk, struct row_block *rb)
{
    const __m256i j4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), j2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)rd32(blk + 4)), j4), _mm256_set1_epi32(0x0f));
    __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(blk[2] | blk[3] << 8), j2), _mm256_set1_epi32(3));
    __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    _mm_storeu_si128((__m128i *)rb->sc, _mm_packs_epi32(_mm256_castsi256_si128(sc), _mm256_extracti128_si256(sc, 1)));
    memset(rb->offw, 0, sizeof rb->offw);
}

/* A row's super-block set-up, the same in every tile: its scales into rb */
KQ2_INLINE void unpack_row_scales(const int type, const uint8_t *blk, struct row_block *rb)
{
    if (type == GGML_TYPE_Q6_K)
        unpack_q6k_scales(blk, rb);
    else if (type == GGML_TYPE_IQ4_XS)
        unpack_iq4xs_scales(blk, rb);
    else
        unpack_q45k_scales(blk, rb);
}

/* iq4_xs: whether a type's codes are signed (the products then take |w| and sign(w) x) */
#define SIGNED_CODES(type) ((type) == GGML_TYPE_IQ4_XS)

/* 64 weight codes (values 64c .. 64c + 63 of the block) as unsigned bytes. q4_K/q5_K: chunk
 * c's 32 bytes of nibbles hold values 64c.. in the low nibbles, 64c + 32.. in the high ones
 * (q5_K: bit 2c, 2c + 1 of the 32 high-bit bytes above them). q6_K: chunk c = 2h + p is
 * ql[64h..64h+63]'s low (p = 0) or high (p = 1) nibbles, with 2-bit pairs 2p, 2p + 1 of
 * qh[32h..32h+31] on top. */
KQ_INLINE __m512i codes64(const int type, const uint8_t *blk, const int c)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    if (type == GGML_TYPE_IQ4_XS) { /* signed: sub-blocks 2c, 2c + 1, 16 nibble bytes each at 8 + 16j,
                                     * low nibbles its values 0-15, high ones 16-31 */
        __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 8 + 32 * c));
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, _mm256_set1_epi8(0x0f))),
                                       _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)), 1);
        z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* lo 0-15, hi 0-15, lo 16-31, hi 16-31 */
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)iq4nl_values)), z);
    }
    if (type == GGML_TYPE_Q6_K) {
        const int h = c >> 1, p = c & 1;
        __m512i l = _mm512_loadu_si512((const void *)(blk + 64 * h));
        __m512i lo = _mm512_and_si512(p ? _mm512_srli_epi16(l, 4) : l, low4);
        __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
        const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * p)), _mm256_set1_epi16((short)(4 * p + 2)), 1);
        hb = _mm512_and_si512(_mm512_srlv_epi16(hb, shift), _mm512_set1_epi8(3));
        return _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
    }
    const uint8_t *qs = blk + (type == GGML_TYPE_Q5_K ? 48 : 16) + 32 * c;
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(v, shift), low4);
    if (type == GGML_TYPE_Q5_K) {
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                               _mm256_set1_epi8((char)(2 << (2 * c))), 1);
        codes = _mm512_mask_add_epi8(codes, _mm512_test_epi8_mask(qh, bit), codes, _mm512_set1_epi8(16));
    }
    return codes;
}

/* The vpermw index that spreads chunk c's scales over the int16 products of its 64 values:
 * q4_K/q5_K 32 values a scale (2c, 2c + 1), q6_K 16 (4c .. 4c + 3). */
KQ_INLINE __m512i scale_index(const int type, const int c)
{
    if (type == GGML_TYPE_Q6_K)
        return _mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)),
                                _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15,
                                                                   14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3));
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
}

/* the lane sums of eight vectors, as one vector (v[k]'s sum in lane k) */
KQ2_INLINE __m256i sum8x8(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* sixteen 8-lane vectors' sums, v[k]'s in lane k */
KQ_INLINE __m512i sum16x8(const __m256i v[16])
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(sum8x8(v)), sum8x8(v + 8), 1);
}

/* The tile: out[r * V + v] = row (w + r * row_bytes) . vector (act + v * act_stride), for
 * r < R, v < V; nb super-blocks. */
KQ_INLINE void tile(const int type, const int R, const int V, const uint8_t *w, size_t row_bytes,
                    const uint8_t *act, size_t act_stride, int nb, float out[16])
{
    const size_t bb = kq_block_bytes(type);
    struct row_block rb[16];
    uint32_t dd[16] = {0}; /* each row's f16 d (| dmin << 16) */
    float xd[16] = {0};    /* each vector's scale */
    int32_t lane_row[16], lane_vec[16];
    for (int k = 0; k < 16; k++) {
        lane_row[k] = k / V < R ? k / V : 0;
        lane_vec[k] = k % V;
    }
    const __m512i row_of = _mm512_loadu_si512((const void *)lane_row), vec_of = _mm512_loadu_si512((const void *)lane_vec);
    __m512 s = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk[16];
        const struct act256 *x[16];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            blk[r] = w + (size_t)r * row_bytes + (size_t)b * bb;
            unpack_row_scales(type, blk[r], &rb[r]);
            dd[r] = type == GGML_TYPE_Q6_K ? (uint32_t)blk[r][208] | (uint32_t)blk[r][209] << 8 : rd32(blk[r]);
        }
#pragma GCC unroll 16
        for (int v = 0; v < V; v++) {
            x[v] = (const struct act256 *)(act + (size_t)v * act_stride) + b;
            xd[v] = x[v]->d;
        }
        __m512i acc[16];
#pragma GCC unroll 16
        for (int k = 0; k < R * V; k++)
            acc[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i xq[16];
#pragma GCC unroll 16
            for (int v = 0; v < V; v++)
                xq[v] = _mm512_loadu_si512((const void *)(x[v]->q + 64 * c));
            const __m512i sidx = scale_index(type, c);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512i codes = codes64(type, blk[r], c);
                __m512i sc = _mm512_permutexvar_epi16(sidx, _mm512_loadu_si512((const void *)rb[r].sc));
                if (SIGNED_CODES(type)) {
                    __mmask64 neg = _mm512_movepi8_mask(codes);
                    codes = _mm512_abs_epi8(codes);
#pragma GCC unroll 16
                    for (int v = 0; v < V; v++)
                        acc[r * V + v] = _mm512_dpwssd_epi32(
                            acc[r * V + v],
                            _mm512_maddubs_epi16(codes, _mm512_mask_sub_epi8(xq[v], neg, _mm512_setzero_si512(), xq[v])), sc);
                    continue;
                }
#pragma GCC unroll 16
                for (int v = 0; v < V; v++)
                    acc[r * V + v] = _mm512_dpwssd_epi32(acc[r * V + v], _mm512_maddubs_epi16(codes, xq[v]), sc);
            }
        }
        /* each (row, vector)'s two integers for this block, lane r * V + v */
        __m256i half[16], offs[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) {
            if (k < R * V) {
                half[k] = _mm256_add_epi32(_mm512_castsi512_si256(acc[k]), _mm512_extracti64x4_epi64(acc[k], 1));
                offs[k] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[k % V]->bsum),
                                            _mm256_loadu_si256((const __m256i *)rb[k / V].offw));
            } else {
                half[k] = offs[k] = _mm256_setzero_si256();
            }
        }
        __m512i is = sum16x8(half), off = sum16x8(offs);
        /* cpu_quant.c's combine, lane by lane */
        __m512i g = _mm512_permutexvar_epi32(row_of, _mm512_loadu_si512((const void *)dd));
        __m512 dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        __m512 xv = _mm512_permutexvar_ps(vec_of, _mm512_loadu_ps(xd));
        if (type == GGML_TYPE_Q6_K || type == GGML_TYPE_IQ4_XS) { /* iq4_xs: off is 0 */
            __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(is, _mm512_slli_epi32(off, 5)));
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_mul_ps(xv, dv), t));
        } else {
            __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
            __m512 t = _mm512_sub_ps(_mm512_mul_ps(dv, _mm512_cvtepi32_ps(is)), _mm512_mul_ps(mv, _mm512_cvtepi32_ps(off)));
            s = _mm512_add_ps(s, _mm512_mul_ps(xv, t));
        }
    }
    _mm512_storeu_ps(out, s);
}

/* The decode tile of q4_K/q5_K, 16 rows x 1 vector, with the scales unpacked for the 16 rows
 * at once: each row's 12 bytes of 6-bit scales and mins are gathered into one lane per row and
 * unpacked there (the scalar unpacking per row was ~30% of the tile's time), and the mins'
 * product with the activations' 16-value sums is made in those lanes too: sum over j of
 * min_j * (bsum[2j] + bsum[2j + 1]), the same integer as tile()'s. Rows row_bytes apart with
 * 15 * row_bytes < 2^31 (the gathers' 32-bit offsets). */
KQ_INLINE void tile16_q45k(const int type, const uint8_t *w, size_t row_bytes, const uint8_t *act, int nb,
                           float out[16])
{
    const size_t bb = type == GGML_TYPE_Q5_K ? Q5_K_BYTES : Q4_K_BYTES;
    int16_t sc16[16 * 8 + 24]; /* row r's 8 scales at 8r: vpermw reads 32 words from there */
    memset(sc16 + 128, 0, 24 * sizeof(int16_t));
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)row_bytes));
    const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f),
                  m30 = _mm512_set1_epi32(0x30303030), mff = _mm512_set1_epi32(0xff);
    const __m512i rows_lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), rows_hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __m512 s = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *bp = w + (size_t)b * bb;
        const struct act256 *x = (const struct act256 *)act + b;
        /* the next 16 rows' super-blocks, as these stream by (cpu_f16.c tile_direct says why) */
        for (int r = 16; r < 32; r++)
            for (size_t o = 0; o < bb; o += 64)
                _mm_prefetch((const char *)(bp + (size_t)r * row_bytes + o), _MM_HINT_T0);
        __m512i w0 = _mm512_i32gather_epi32(offs, (const void *)(bp + 4), 1);
        __m512i w1 = _mm512_i32gather_epi32(offs, (const void *)(bp + 8), 1);
        __m512i w2 = _mm512_i32gather_epi32(offs, (const void *)(bp + 12), 1);
        __m512i g = _mm512_i32gather_epi32(offs, (const void *)bp, 1); /* d | dmin << 16 */
        __m512i slo = _mm512_and_si512(w0, m3f), mlo = _mm512_and_si512(w1, m3f);
        __m512i shi = _mm512_or_si512(_mm512_and_si512(w2, m0f), _mm512_and_si512(_mm512_srli_epi32(w0, 2), m30));
        __m512i mhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m0f),
                                      _mm512_and_si512(_mm512_srli_epi32(w1, 2), m30));
        /* the scales, row by row: 8 bytes a row (lo then hi), widened to int16 */
        __m512i a = _mm512_unpacklo_epi32(slo, shi), c = _mm512_unpackhi_epi32(slo, shi);
        __m512i r07 = _mm512_permutex2var_epi64(a, rows_lo, c), r815 = _mm512_permutex2var_epi64(a, rows_hi, c);
        _mm512_storeu_si512((void *)sc16, _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r07)));
        _mm512_storeu_si512((void *)(sc16 + 32), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(r07, 1)));
        _mm512_storeu_si512((void *)(sc16 + 64), _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r815)));
        _mm512_storeu_si512((void *)(sc16 + 96), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(r815, 1)));
        /* the mins times the activations' 32-value sums, a row a lane (madd of a byte in the
         * low int16 of each lane with the sum: exact) */
        __m512i off = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i mj = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? mlo : mhi, 8 * (j & 3)), mff);
            off = _mm512_add_epi32(off, _mm512_madd_epi16(mj, _mm512_set1_epi32(x->bsum[2 * j] + x->bsum[2 * j + 1])));
        }
        __m512i acc[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            acc[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int cc = 0; cc < 4; cc++) {
            __m512i xq = _mm512_loadu_si512((const void *)(x->q + 64 * cc));
            const __m512i sidx = scale_index(type, cc);
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) {
                __m512i codes = codes64(type, bp + (size_t)r * row_bytes, cc);
                __m512i sc = _mm512_permutexvar_epi16(sidx, _mm512_loadu_si512((const void *)(sc16 + 8 * r)));
                acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(codes, xq), sc);
            }
        }
        __m256i half[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            half[k] = _mm256_add_epi32(_mm512_castsi512_si256(acc[k]), _mm512_extracti64x4_epi64(acc[k], 1));
        __m512i is = sum16x8(half);
        /* cpu_quant.c's combine, lane by lane */
        __m512 dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
        __m512 xv = _mm512_set1_ps(x->d);
        __m512 t = _mm512_sub_ps(_mm512_mul_ps(dv, _mm512_cvtepi32_ps(is)), _mm512_mul_ps(mv, _mm512_cvtepi32_ps(off)));
        s = _mm512_add_ps(s, _mm512_mul_ps(xv, t));
    }
    _mm512_storeu_ps(out, s);
}

/* ---------------- AVX2 (and F16C): the same tiles in eight lanes ----------------
 * 32 values an instruction; no vpdpwssd, so the scale-weighting is vpmaddwd then an add (the
 * same exact integers). Eight accumulators of 256 bits: tiles of 2 rows x 4 vectors, or 8, 4
 * and 2 rows with one vector. */
/* 32 weight codes, values 64c + 32j .. 64c + 32j + 31 of the block (j = 0, 1), unsigned */
KQ2_INLINE __m256i codes32(const int type, const uint8_t *blk, const int c, const int j)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (type == GGML_TYPE_IQ4_XS) { /* signed: sub-block 2c + j's 16 nibble bytes, low nibbles first */
        __m128i v = _mm_loadu_si128((const __m128i *)(blk + 8 + 16 * (2 * c + j)));
        __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4);
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values)), n);
    }
    if (type == GGML_TYPE_Q6_K) {
        const int h = c >> 1, k = 2 * (c & 1) + j; /* 32 values 128h + 32k.. */
        __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * j));
        __m256i lo = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(l, 4) : l, low4);
        __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        hb = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    }
    __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (type == GGML_TYPE_Q5_K ? 48 : 16) + 32 * c));
    __m256i codes = _mm256_and_si256(j ? _mm256_srli_epi16(v, 4) : v, low4);
    if (type == GGML_TYPE_Q5_K) {
        const __m256i bit = _mm256_set1_epi8((char)(1 << (2 * c + j)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return codes;
}

/* those 32 values' scales over the 16 int16 products: one (q4_K/q5_K), or two 16-value ones */
KQ2_INLINE __m256i scales32(const int type, const struct row_block *rb, const int c, const int j)
{
    if (type == GGML_TYPE_Q6_K)
        return _mm256_set_m128i(_mm_set1_epi16(rb->sc[4 * c + 2 * j + 1]), _mm_set1_epi16(rb->sc[4 * c + 2 * j]));
    return _mm256_set1_epi16(rb->sc[2 * c + j]);
}

KQ2_INLINE void tile_avx2(const int type, const int R, const int V, const uint8_t *w, size_t row_bytes,
                          const uint8_t *act, size_t act_stride, int nb, float out[16])
{
    const size_t bb = kq_block_bytes(type);
    struct row_block rb[8];
    uint16_t dh[8] = {0}, mh[8] = {0}; /* each row's f16 d and dmin */
    float xd[8] = {0};
    int32_t lane_row[8], lane_vec[8];
    for (int k = 0; k < 8; k++) {
        lane_row[k] = k / V < R ? k / V : 0;
        lane_vec[k] = k % V;
    }
    const __m256i row_of = _mm256_loadu_si256((const __m256i *)lane_row), vec_of = _mm256_loadu_si256((const __m256i *)lane_vec);
    __m256 s = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk[8];
        const struct act256 *x[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            blk[r] = w + (size_t)r * row_bytes + (size_t)b * bb;
            unpack_row_scales(type, blk[r], &rb[r]);
            if (type == GGML_TYPE_Q6_K) {
                dh[r] = (uint16_t)(blk[r][208] | blk[r][209] << 8);
            } else {
                dh[r] = (uint16_t)(blk[r][0] | blk[r][1] << 8);
                mh[r] = (uint16_t)(blk[r][2] | blk[r][3] << 8);
            }
        }
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            x[v] = (const struct act256 *)(act + (size_t)v * act_stride) + b;
            xd[v] = x[v]->d;
        }
        __m256i acc[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[k] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
#pragma GCC unroll 2
            for (int j = 0; j < 2; j++) {
                __m256i xq[8];
#pragma GCC unroll 8
                for (int v = 0; v < V; v++)
                    xq[v] = _mm256_loadu_si256((const __m256i *)(x[v]->q + 64 * c + 32 * j));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m256i codes = codes32(type, blk[r], c, j), sc = scales32(type, &rb[r], c, j);
                    if (SIGNED_CODES(type)) {
                        __m256i mag = _mm256_abs_epi8(codes);
#pragma GCC unroll 8
                        for (int v = 0; v < V; v++)
                            acc[r * V + v] = _mm256_add_epi32(
                                acc[r * V + v],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(xq[v], codes)), sc));
                        continue;
                    }
#pragma GCC unroll 8
                    for (int v = 0; v < V; v++)
                        acc[r * V + v] = _mm256_add_epi32(acc[r * V + v],
                                                          _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq[v]), sc));
                }
            }
        }
        __m256i offs[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            offs[k] = k < R * V ? _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[k % V]->bsum),
                                                    _mm256_loadu_si256((const __m256i *)rb[k / V].offw))
                                : _mm256_setzero_si256();
        __m256i is = sum8x8(acc), off = sum8x8(offs);
        /* cpu_quant.c's combine, lane by lane */
        __m256 dv = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)), row_of);
        __m256 xv = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xd), vec_of);
        if (type == GGML_TYPE_Q6_K || type == GGML_TYPE_IQ4_XS) { /* iq4_xs: off is 0 */
            __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(is, _mm256_slli_epi32(off, 5)));
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(xv, dv), t));
        } else {
            __m256 mv = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh)), row_of);
            __m256 t = _mm256_sub_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(is)), _mm256_mul_ps(mv, _mm256_cvtepi32_ps(off)));
            s = _mm256_add_ps(s, _mm256_mul_ps(xv, t));
        }
    }
    _mm256_storeu_ps(out, s);
}

/* cpu_quant_act's 256-value form, 32 values an iteration: the same bytes (the max of |v| is
 * exact; v * id is one rounded product either way; vcvtps2dq rounds to nearest even as lrintf
 * does in the default mode; |v * id| <= 127 up to rounding, so neither the scalar clamp nor
 * the saturating packs change a code). */
KQ2 void cpu_kquant_act(const float *x, int nb, struct act256 *o)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < nb; b++) {
        const float *v = x + (size_t)b * QK_K;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < QK_K; i += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        o[b].d = d;
        const __m256 s = _mm256_set1_ps(id);
        for (int g = 0; g < QK_K; g += 32) {
            __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + g), s));
            __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + g + 8), s));
            __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + g + 16), s));
            __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + g + 24), s));
            /* the two 16-value sums, in lanes 0 and 4 after two horizontal adds */
            __m256i s01 = _mm256_add_epi32(q0, q1), s23 = _mm256_add_epi32(q2, q3);
            __m256i hs = _mm256_hadd_epi32(s01, s23); /* lanes: s01 pairs, s23 pairs (per half) */
            hs = _mm256_hadd_epi32(hs, hs);
            __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(hs), _mm256_extracti128_si256(hs, 1));
            o[b].bsum[g / 16] = (int16_t)_mm_cvtsi128_si32(sum);
            o[b].bsum[g / 16 + 1] = (int16_t)_mm_extract_epi32(sum, 1);
            /* packs interleave the 128-bit lanes: put the bytes back in order */
            __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(o[b].q + g), q);
        }
    }
}

/* ---------------- the tiles of each type and ISA, and the matmul's share ---------------- */
typedef void tile_fn(const uint8_t *w, size_t row_bytes, const uint8_t *act, size_t act_stride, int nb, float *out);

#define TILE(NAME, FN, ATTR, TYPE, R, V)                                                                    \
    ATTR static void NAME(const uint8_t *w, size_t row_bytes, const uint8_t *act, size_t act_stride, int nb, \
                          float *out)                                                                       \
    {                                                                                                       \
        FN(TYPE, R, V, w, row_bytes, act, act_stride, nb, out);                                             \
    }
/* AVX-512: 4 rows x 4 vectors (8 x 2, 2 x 8, 2 x 4 and 4 x 2 measured no faster), and 16, 8
 * and 4 rows x 1 */
#define TILES512(T, TYPE)                       \
    TILE(T##_4x4, tile, KQ, TYPE, 4, 4)         \
    TILE(T##_16x1, tile, KQ, TYPE, 16, 1)       \
    TILE(T##_8x1, tile, KQ, TYPE, 8, 1)         \
    TILE(T##_4x1, tile, KQ, TYPE, 4, 1)         \
    TILE(T##_2x4_avx2, tile_avx2, KQ2, TYPE, 2, 4) \
    TILE(T##_8x1_avx2, tile_avx2, KQ2, TYPE, 8, 1) \
    TILE(T##_4x1_avx2, tile_avx2, KQ2, TYPE, 4, 1) \
    TILE(T##_2x1_avx2, tile_avx2, KQ2, TYPE, 2, 1)
TILES512(q4k, GGML_TYPE_Q4_K)
TILES512(q5k, GGML_TYPE_Q5_K)
TILES512(q6k, GGML_TYPE_Q6_K)
TILES512(iq4xs, GGML_TYPE_IQ4_XS)
KQ static void q4k_16x1_gathered(const uint8_t *w, size_t row_bytes, const uint8_t *act, size_t act_stride, int nb,
                                 float *out)
{
    (void)act_stride;
    tile16_q45k(GGML_TYPE_Q4_K, w, row_bytes, act, nb, out);
}
KQ static void q5k_16x1_gathered(const uint8_t *w, size_t row_bytes, const uint8_t *act, size_t act_stride, int nb,
                                 float *out)
{
    (void)act_stride;
    tile16_q45k(GGML_TYPE_Q5_K, w, row_bytes, act, nb, out);
}

/* an ISA's tiles for a type: pr rows x pv vectors, then rows[i] rows x 1 vector */
struct tiles { int pr, pv; tile_fn *many; int rows[3]; tile_fn *one[3]; };
#define TILES(T, T16)                                                                                 \
    {{4, 4, T##_4x4, {16, 8, 4}, {T16, T##_8x1, T##_4x1}},                                            \
     {2, 4, T##_2x4_avx2, {8, 4, 2}, {T##_8x1_avx2, T##_4x1_avx2, T##_2x1_avx2}}}
/* q4_K/q5_K decode: the 16-row tile with gathered scales where the rows' offsets fit 32 bits */
static const struct tiles q4k_tiles[2] = TILES(q4k, q4k_16x1_gathered), q5k_tiles[2] = TILES(q5k, q5k_16x1_gathered),
                          q6k_tiles[2] = TILES(q6k, q6k_16x1), iq4xs_tiles[2] = TILES(iq4xs, iq4xs_16x1);
static const struct tiles q4k_far[2] = TILES(q4k, q4k_16x1), q5k_far[2] = TILES(q5k, q5k_16x1);

bool cpu_kquant_avx2_cpu(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

void cpu_kquant_rows(uint32_t type, const uint8_t *w, size_t row_bytes, int r0, int r1, const uint8_t *act,
                     size_t act_stride, int n, int cols, float *y, size_t y_stride, bool avx512)
{
    bool far = row_bytes > (1u << 27); /* the gathers' offsets would not fit */
    const struct tiles *tl = &(type == GGML_TYPE_Q4_K   ? (far ? q4k_far : q4k_tiles)
                               : type == GGML_TYPE_Q5_K ? (far ? q5k_far : q5k_tiles)
                               : type == GGML_TYPE_Q6_K ? q6k_tiles
                                                        : iq4xs_tiles)[!avx512];
    const int pr = tl->pr, pv = tl->pv;
    int nb = cols / QK_K, nv = n / pv * pv, r;
    float o[16];
    /* prefill: pr rows at a time against every group of pv vectors: the rows' blocks stay in
     * the first-level cache while the vectors stream past */
    for (r = r0; r + pr <= r1 && nv > 0; r += pr)
        for (int t = 0; t < nv; t += pv) {
            tl->many(w + (size_t)r * row_bytes, row_bytes, act + (size_t)t * act_stride, act_stride, nb, o);
            for (int i = 0; i < pr; i++)
                for (int v = 0; v < pv; v++)
                    y[(size_t)(t + v) * y_stride + r + i] = o[i * pv + v];
        }
    for (int t = 0; t < nv; t++) /* rows left over */
        for (int i = r; i < r1; i++)
            y[(size_t)t * y_stride + i] =
                cpu_quant_dot(type, w + (size_t)i * row_bytes, act + (size_t)t * act_stride, cols, CPU_ISA_AVX2);
    /* decode, and the vectors left over: rows[0] rows at a time, then one tile of each smaller
     * height that fits, then single rows */
    for (int t = nv; t < n; t++) {
        const uint8_t *x = act + (size_t)t * act_stride;
        float *yt = y + (size_t)t * y_stride;
        r = r0;
        for (; r + tl->rows[0] <= r1; r += tl->rows[0]) {
            tl->one[0](w + (size_t)r * row_bytes, row_bytes, x, act_stride, nb, o);
            memcpy(yt + r, o, sizeof(float) * tl->rows[0]);
        }
        for (int i = 1; i < 3; i++)
            if (r + tl->rows[i] <= r1) {
                tl->one[i](w + (size_t)r * row_bytes, row_bytes, x, act_stride, nb, o);
                memcpy(yt + r, o, sizeof(float) * tl->rows[i]);
                r += tl->rows[i];
            }
        for (; r < r1; r++)
            yt[r] = cpu_quant_dot(type, w + (size_t)r * row_bytes, x, cols, CPU_ISA_AVX2);
    }
}

#else /* not x86-64: never chosen */
bool cpu_kquant_avx2_cpu(void) { return false; }
void cpu_kquant_act(const float *x, int nb, struct act256 *o) { (void)x; (void)nb; (void)o; }
bool cpu_kquant_has(uint32_t type) { (void)type; return false; }
void cpu_kquant_rows(uint32_t type, const uint8_t *w, size_t row_bytes, int r0, int r1, const uint8_t *act,
                     size_t act_stride, int n, int cols, float *y, size_t y_stride, bool avx512)
{
    (void)type; (void)w; (void)row_bytes; (void)r0; (void)r1; (void)act; (void)act_stride; (void)n; (void)cols;
    (void)y; (void)y_stride; (void)avx512;
}
#endif
