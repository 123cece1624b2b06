/* cpu_lanes512.h - the lanes' sums of sixteen 8-lane accumulators at once in AVX-512, in the
 * order the CPU backend's 8-lane products sum their lanes (cpu_f16.c's f16 tiles, the
 * attention's scores in backend_cpu_attention.c), so an AVX-512 path gives AVX2's bits.
 *
 * An 8-lane v sums as ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)): the 128-bit halves
 * added, then their high pair onto the low pair, then the two left. Here those additions are
 * done across registers by shuffles (a + b is b + a, bit for bit), about 1.4 instructions a
 * sum instead of 6 dependent ones. Only for x86-64 GCC-compatible compilers; callers are
 * compiled for AVX-512 F and DQ. */
#ifndef TIDE_CPU_LANES512_H
#define TIDE_CPU_LANES512_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* a0..a3 and b0..b3 each hold two accumulators (lanes 0-7 and 8-15): the 16 sums, a0's low,
 * a0's high, a1's low, ..., a3's high, then b's the same way. */
__attribute__((target("avx2,fma,avx512f,avx512dq"))) static inline __attribute__((always_inline)) __m512
lane_sums16(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 b0, __m512 b1, __m512 b2, __m512 b3)
{
    /* v_j + v_(j+4): the 128-bit halves of each 8 lanes; lane block k of H(a0, a1) is
     * accumulator k's (a0 low, a0 high, a1 low, a1 high) */
#define H(x, y) _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xdd))
    __m512 ha0 = H(a0, a1), ha1 = H(a2, a3), hb0 = H(b0, b1), hb1 = H(b2, b3);
#undef H
    /* (h0 + h2, h1 + h3) of accumulator k and k + 4, in lane block k */
#define G(x, y) _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee))
    __m512 ga = G(ha0, ha1), gb = G(hb0, hb1);
#undef G
    /* g0 + g1: lane block k holds (a: k, k + 4; b: k, k + 4), then put in order */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(ga, gb, 0x88), _mm512_shuffle_ps(ga, gb, 0xdd));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}
#endif

#endif
