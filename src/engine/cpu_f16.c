/* cpu_f16.c - f16 weight rows times f32 vectors for the CPU backend's matmul (AVX2, F16C, FMA,
 * and AVX-512 where the CPU has it; cpu_f16.h), as register tiles.
 *
 * Why tiles: prefill used to widen a row and dot it with two vectors at a time, so every
 * vector was read from memory again for every row; with 512 vectors (2 MB of activations) that
 * was an L3 stream per row and the products were bound by it (78% of an f16 prefill's
 * profile). Here a tile is 4 rows by 3 vectors in twelve accumulators: per 8 columns, 4 + 3
 * loads feed 12 multiply-adds; the vectors are taken 64 at a time (256 KB, L2) and each group
 * of 4 rows is widened once per 64 vectors (exact: f16 to f32 loses nothing).
 *
 * The bits: every (row, vector) product, in every tile shape and in decode, is one 8-lane
 * accumulator, a fused multiply-add per 8 columns in column order starting from zero, then
 * the lanes' sum in one fixed order, then the columns past a multiple of 8 added one by one.
 * So a row's result does not depend on the batch, the tile it fell in, the thread or whether
 * AVX-512 ran it (its registers hold two such accumulators: see "AVX-512" below). */
#include "cpu_f16.h"
#include "cpu_lanes512.h"
#include "cpu_quant.h"
#include "gguf.h"

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define F16 __attribute__((target("avx2,f16c,fma")))
#define ALWAYS_INLINE inline __attribute__((always_inline))

bool cpu_f16_fast(void)
{
    static int fast = -1; /* asked once */
    int f = __atomic_load_n(&fast, __ATOMIC_RELAXED);
    if (f < 0) {
        __builtin_cpu_init();
        f = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
        __atomic_store_n(&fast, f, __ATOMIC_RELAXED);
    }
    return f;
}

F16 static ALWAYS_INLINE float lanes_sum(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

F16 static ALWAYS_INLINE float f16_value(uint16_t h) { return _cvtsh_ss(h); }

/* The columns past a multiple of 8, one by one after the lanes' sum. */
F16 static ALWAYS_INLINE float finish(__m256 acc, const float *w, const float *x, int c8, int cols)
{
    float s = lanes_sum(acc);
    for (int i = c8; i < cols; i++)
        s += w[i] * x[i];
    return s;
}

/* 4 widened rows (w, ws floats apart) times 3 vectors (x, xs apart): out[r * 3 + t]. Written
 * out by hand: gcc kept the array form's twelve accumulators on the stack. */
F16 static void tile4x3(const float *w, size_t ws, const float *x, size_t xs, int cols, float *out)
{
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    const float *x0 = x, *x1 = x + xs, *x2 = x + 2 * xs;
    int c8 = cols / 8 * 8;
    for (int i = 0; i < c8; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i), v2 = _mm256_loadu_ps(x2 + i);
        __m256 r = _mm256_loadu_ps(w0 + i);
        a00 = _mm256_fmadd_ps(r, v0, a00); a01 = _mm256_fmadd_ps(r, v1, a01); a02 = _mm256_fmadd_ps(r, v2, a02);
        r = _mm256_loadu_ps(w1 + i);
        a10 = _mm256_fmadd_ps(r, v0, a10); a11 = _mm256_fmadd_ps(r, v1, a11); a12 = _mm256_fmadd_ps(r, v2, a12);
        r = _mm256_loadu_ps(w2 + i);
        a20 = _mm256_fmadd_ps(r, v0, a20); a21 = _mm256_fmadd_ps(r, v1, a21); a22 = _mm256_fmadd_ps(r, v2, a22);
        r = _mm256_loadu_ps(w3 + i);
        a30 = _mm256_fmadd_ps(r, v0, a30); a31 = _mm256_fmadd_ps(r, v1, a31); a32 = _mm256_fmadd_ps(r, v2, a32);
    }
    out[0] = finish(a00, w0, x0, c8, cols); out[1] = finish(a01, w0, x1, c8, cols); out[2] = finish(a02, w0, x2, c8, cols);
    out[3] = finish(a10, w1, x0, c8, cols); out[4] = finish(a11, w1, x1, c8, cols); out[5] = finish(a12, w1, x2, c8, cols);
    out[6] = finish(a20, w2, x0, c8, cols); out[7] = finish(a21, w2, x1, c8, cols); out[8] = finish(a22, w2, x2, c8, cols);
    out[9] = finish(a30, w3, x0, c8, cols); out[10] = finish(a31, w3, x1, c8, cols); out[11] = finish(a32, w3, x2, c8, cols);
}

/* 4 widened rows times 1 vector: out[r * 3] (tile4x3's layout) */
F16 static void tile4x1(const float *w, size_t ws, const float *x, int cols, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    int c8 = cols / 8 * 8;
    for (int i = 0; i < c8; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), v, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), v, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), v, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), v, a3);
    }
    out[0] = finish(a0, w0, x, c8, cols);
    out[3] = finish(a1, w1, x, c8, cols);
    out[6] = finish(a2, w2, x, c8, cols);
    out[9] = finish(a3, w3, x, c8, cols);
}

/* 1 widened row times 1 vector */
F16 static float tile1x1(const float *w, const float *x, int cols)
{
    __m256 a = _mm256_setzero_ps();
    int c8 = cols / 8 * 8;
    for (int i = 0; i < c8; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a);
    return finish(a, w, x, c8, cols);
}

/* The same arithmetic on 4 f16 rows read directly (decode: one vector, nothing to reuse a
 * widened row for), and on 1. */
F16 static void direct4(const uint8_t *w, size_t row_bytes, const float *x, int cols, float *out)
{
    const uint16_t *w0 = (const uint16_t *)w, *w1 = (const uint16_t *)(w + row_bytes);
    const uint16_t *w2 = (const uint16_t *)(w + 2 * row_bytes), *w3 = (const uint16_t *)(w + 3 * row_bytes);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c8 = cols / 8 * 8;
#define H8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + i)))
    for (int i = 0; i < c8; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(H8(w0), v, a0);
        a1 = _mm256_fmadd_ps(H8(w1), v, a1);
        a2 = _mm256_fmadd_ps(H8(w2), v, a2);
        a3 = _mm256_fmadd_ps(H8(w3), v, a3);
    }
    const uint16_t *wr[4] = {w0, w1, w2, w3};
    __m256 acc[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; r++) {
        float s = lanes_sum(acc[r]);
        for (int i = c8; i < cols; i++)
            s += f16_value(wr[r][i]) * x[i];
        out[r] = s;
    }
}
F16 static float direct1(const uint16_t *w, const float *x, int cols)
{
    __m256 a = _mm256_setzero_ps();
    int c8 = cols / 8 * 8;
    for (int i = 0; i < c8; i += 8)
        a = _mm256_fmadd_ps(H8(w), _mm256_loadu_ps(x + i), a);
#undef H8
    float s = lanes_sum(a);
    for (int i = c8; i < cols; i++)
        s += f16_value(w[i]) * x[i];
    return s;
}

F16 static void widen(const uint16_t *src, float *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = f16_value(src[i]);
}

#define TOKEN_BLOCK 64

/* ---- AVX-512: the same products, two to a register ----
 * A 512-bit register holds two of the 8-lane accumulators above: lanes 0-7 row 2p's, lanes
 * 8-15 row 2p+1's, with one vector. The rows are widened as pairs, 8 columns of one then 8 of
 * the other, and the vector's 8 columns are broadcast to both halves; so each half does the
 * AVX2 form's multiply-adds on the same operands in the same order, and its lanes' sum and the
 * columns past a multiple of 8 are finished the same way. Twice the multiply-adds an
 * instruction, and 16 accumulators (8 rows by 4 vectors) of the 32 registers: 1024x1024 by 512
 * vectors, one thread, 102-120 GFLOP/s against AVX2's 76-78 (a loaded machine). Up to 4 vectors
 * (decode, a decode step of a few sequences, an expert's few tokens) the pairs are widened in
 * registers straight from the f16 rows (tile_direct): widening them through a buffer cost a store
 * and a load of every weight for 1-4 uses, and 2-4 vectors ran at half one vector's speed (1024 x
 * 1024, one thread: 195-240 us against 110-130; at 4 sequences of the --preset big f16 model the
 * q/k/v and output products took 3.5 ms a step, now 1.9). While a tile's rows stream by, the next
 * tile's are prefetched a line at a time: each tile starts 8 new streams the hardware prefetcher
 * has not seen yet, and their first misses stalled it (one thread, 1024 x 1024: 84-118 us -> 71
 * with one vector, 122-128 -> 92 with four; 4 clients of the big f16 model 328-350 -> 443-471
 * tok/s). */
#define W512 __attribute__((target("avx2,f16c,fma,avx512f,avx512vl,avx512dq")))

bool cpu_f16_wide_cpu(void)
{
    __builtin_cpu_init();
    return cpu_f16_fast() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

/* 8 f16 rows (row_bytes apart) widened as 4 pairs, pair p at dst + p * 2 * c8: for each 8
 * columns, the first row's then the second's. */
W512 static void widen_pairs(const uint8_t *w, size_t row_bytes, int c8, float *dst)
{
    for (int p = 0; p < 4; p++) {
        const uint16_t *a = (const uint16_t *)(w + (size_t)(2 * p) * row_bytes);
        const uint16_t *b = (const uint16_t *)(w + (size_t)(2 * p + 1) * row_bytes);
        float *d = dst + (size_t)p * 2 * c8;
        for (int i = 0; i < c8; i += 8) {
            __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + i))),
                                                _mm_loadu_si128((const __m128i *)(b + i)), 1);
            _mm512_storeu_ps(d + 2 * i, _mm512_cvtph_ps(h));
        }
    }
}

/* 8 rows (w: the f16 rows, wp: widen_pairs' copy) times T <= 4 vectors (x, xs floats apart),
 * columns i0 to i1 (multiples of 8) of c8: the accumulators start from zero at column 0, else
 * from st (where the previous columns left them); at c8 they are summed into y[t * y_stride +
 * k] for row k < 8, else saved to st. Stopping and going on loses nothing: the state is the
 * registers. */
W512 static ALWAYS_INLINE void tile_finish(__m512 acc[4][4], const uint8_t *w, size_t row_bytes, const float *x,
                                           size_t xs, int cols, float *y, size_t y_stride, const int T);

W512 static ALWAYS_INLINE void tile_wide(const uint8_t *w, size_t row_bytes, const float *wp, const float *x, size_t xs,
                                         int cols, float *y, size_t y_stride, const int T, int i0, int i1,
                                         __m512 *st)
{
    __m512 acc[4][4];
    int c8 = cols / 8 * 8;
    size_t ps = 2 * (size_t)c8;
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            acc[p][t] = i0 ? st[4 * t + p] : _mm512_setzero_ps();
    for (int i = i0; i < i1; i += 8) {
        __m512 w0 = _mm512_loadu_ps(wp + 2 * i), w1 = _mm512_loadu_ps(wp + ps + 2 * i);
        __m512 w2 = _mm512_loadu_ps(wp + 2 * ps + 2 * i), w3 = _mm512_loadu_ps(wp + 3 * ps + 2 * i);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 v = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (size_t)t * xs + i));
            acc[0][t] = _mm512_fmadd_ps(w0, v, acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(w1, v, acc[1][t]);
            acc[2][t] = _mm512_fmadd_ps(w2, v, acc[2][t]);
            acc[3][t] = _mm512_fmadd_ps(w3, v, acc[3][t]);
        }
    }
    if (i1 < c8) {
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                st[4 * t + p] = acc[p][t];
        return;
    }
    tile_finish(acc, w, row_bytes, x, xs, cols, y, y_stride, T);
}

/* tile_wide's 8 rows times T <= 4 vectors over all the columns, reading the f16 rows directly:
 * each pair of rows widened into a register as widen_pairs lays it out, not through a buffer.
 * For a few vectors (a decode step of several sequences, an expert's few tokens) the buffer was
 * a store and a load of every weight for 1-4 uses of it. The same multiply-adds on the same
 * operands in the same order as tile_wide, so the same bits. */
W512 static ALWAYS_INLINE void tile_direct(const uint8_t *w, size_t row_bytes, const float *x, size_t xs, int cols,
                                           float *y, size_t y_stride, const int T)
{
    __m512 acc[4][4];
    int c8 = cols / 8 * 8;
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            acc[p][t] = _mm512_setzero_ps();
    for (int i = 0; i < c8; i += 8) {
        __m512 wv[4];
        if (!(i & 31)) /* the next tile's rows, a line each, as this one's go by */
            for (int k = 0; k < 8; k++)
                _mm_prefetch((const char *)(w + (size_t)(8 + k) * row_bytes) + 2 * i, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const uint16_t *a = (const uint16_t *)(w + (size_t)(2 * p) * row_bytes);
            const uint16_t *b = (const uint16_t *)(w + (size_t)(2 * p + 1) * row_bytes);
            __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + i))),
                                                _mm_loadu_si128((const __m128i *)(b + i)), 1);
            wv[p] = _mm512_cvtph_ps(h);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 v = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (size_t)t * xs + i));
            acc[0][t] = _mm512_fmadd_ps(wv[0], v, acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(wv[1], v, acc[1][t]);
            acc[2][t] = _mm512_fmadd_ps(wv[2], v, acc[2][t]);
            acc[3][t] = _mm512_fmadd_ps(wv[3], v, acc[3][t]);
        }
    }
    tile_finish(acc, w, row_bytes, x, xs, cols, y, y_stride, T);
}

/* The end of a tile: the lanes' sums of its accumulators into y, then the columns past a
 * multiple of 8 (as finish() adds them). */
W512 static ALWAYS_INLINE void tile_finish(__m512 acc[4][4], const uint8_t *w, size_t row_bytes, const float *x,
                                           size_t xs, int cols, float *y, size_t y_stride, const int T)
{
    int c8 = cols / 8 * 8;
#pragma GCC unroll 2
    for (int t = 0; t < T; t += 2) {
        int u = t + 1 < T ? t + 1 : t; /* an odd last vector pairs with itself */
        /* the lanes' sums in lanes_sum's order, 16 at once (cpu_lanes512.h) */
        __m512 r = lane_sums16(acc[0][t], acc[1][t], acc[2][t], acc[3][t], acc[0][u], acc[1][u], acc[2][u], acc[3][u]);
        _mm256_storeu_ps(y + (size_t)t * y_stride, _mm512_castps512_ps256(r));
        if (u != t)
            _mm256_storeu_ps(y + (size_t)u * y_stride, _mm512_extractf32x8_ps(r, 1));
    }
    if (c8 < cols) /* the columns past a multiple of 8, after the lanes' sum as finish() adds them */
        for (int t = 0; t < T; t++)
            for (int k = 0; k < 8; k++) {
                const uint16_t *wk = (const uint16_t *)(w + (size_t)k * row_bytes);
                const float *xt = x + (size_t)t * xs;
                float v = y[(size_t)t * y_stride + k];
                for (int i = c8; i < cols; i++)
                    v += f16_value(wk[i]) * xt[i];
                y[(size_t)t * y_stride + k] = v;
            }
}

/* Rows r..r+7 (widened at wp) times vectors t0..t1 (at most TOKEN_BLOCK), KC columns at a time
 * for all the vectors: a column block of the 8 rows and of 4 vectors (KC * 48 bytes) stays in
 * L1, where whole rows of 1024 columns (48 KB) did not. */
#ifndef KC
#define KC 512
#endif
W512 static void rows_wide(const uint8_t *w, size_t row_bytes, int r, const float *x, int t0, int t1, int cols,
                           float *y, size_t y_stride, const float *wp)
{
    __m512 st[TOKEN_BLOCK / 4][16]; /* each 4-vector tile's accumulators between column blocks */
    const uint8_t *wr = w + (size_t)r * row_bytes;
    int c8 = cols / 8 * 8;
    for (int i0 = 0;; i0 += KC) {
        int i1 = c8 - i0 > KC ? i0 + KC : c8, t = t0;
        for (; t + 4 <= t1; t += 4)
            tile_wide(wr, row_bytes, wp, x + (size_t)t * cols, cols, cols, y + (size_t)t * y_stride + r, y_stride, 4,
                      i0, i1, st[(t - t0) / 4]);
        float *yt = y + (size_t)t * y_stride + r;
        const float *xt = x + (size_t)t * cols;
        switch (t1 - t) {
        case 3: tile_wide(wr, row_bytes, wp, xt, cols, cols, yt, y_stride, 3, i0, i1, st[(t - t0) / 4]); break;
        case 2: tile_wide(wr, row_bytes, wp, xt, cols, cols, yt, y_stride, 2, i0, i1, st[(t - t0) / 4]); break;
        case 1: tile_wide(wr, row_bytes, wp, xt, cols, cols, yt, y_stride, 1, i0, i1, st[(t - t0) / 4]); break;
        }
        if (i1 >= c8)
            break;
    }
}

static void rows_avx2(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                      size_t y_stride, float *buf);

/* Rows r0..r1 (a multiple of 8 apart) times n <= 4 vectors, tile_direct's way. */
W512 static void rows_direct(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols,
                             float *y, size_t y_stride)
{
    for (int r = r0; r < r1; r += 8) {
        const uint8_t *wr = w + (size_t)r * row_bytes;
        switch (n) {
        case 4: tile_direct(wr, row_bytes, x, cols, cols, y + r, y_stride, 4); break;
        case 3: tile_direct(wr, row_bytes, x, cols, cols, y + r, y_stride, 3); break;
        case 2: tile_direct(wr, row_bytes, x, cols, cols, y + r, y_stride, 2); break;
        default: tile_direct(wr, row_bytes, x, cols, cols, y + r, y_stride, 1); break;
        }
    }
}

void cpu_f16_rows(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                  size_t y_stride, float *buf)
{
    cpu_f16_rows_isa(w, row_bytes, r0, r1, x, n, cols, y, y_stride, buf,
                     cpu_quant_isa_best() == CPU_ISA_AVX512VNNI ? CPU_ISA_AVX512VNNI : CPU_ISA_AVX2);
}

void cpu_f16_rows_isa(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                      size_t y_stride, float *buf, enum cpu_isa isa)
{
    static _Atomic int wide_cpu = -1;
    if (wide_cpu < 0)
        wide_cpu = cpu_f16_wide_cpu();
    if (isa != CPU_ISA_AVX512VNNI || !wide_cpu) { /* AVX2's tiles (one vector: the rows read directly) */
        rows_avx2(w, row_bytes, r0, r1, x, n, cols, y, y_stride, buf);
        return;
    }
    int r8 = r0 + (r1 - r0) / 8 * 8, c8 = cols / 8 * 8;
    if (n <= 4) { /* a few vectors: the rows read directly (tile_direct), nothing widened to reuse */
        rows_direct(w, row_bytes, r0, r8, x, n, cols, y, y_stride);
        if (r8 < r1)
            rows_avx2(w, row_bytes, r8, r1, x, n, cols, y, y_stride, buf);
        return;
    }
    for (int t0 = 0; t0 < n; t0 += TOKEN_BLOCK) {
        int t1 = t0 + TOKEN_BLOCK < n ? t0 + TOKEN_BLOCK : n;
        for (int r = r0; r < r8; r += 8) {
            widen_pairs(w + (size_t)r * row_bytes, row_bytes, c8, buf);
            rows_wide(w, row_bytes, r, x, t0, t1, cols, y, y_stride, buf);
        }
    }
    if (r8 < r1) /* the last rows of a share whose height is not a multiple of 8 */
        rows_avx2(w, row_bytes, r8, r1, x, n, cols, y, y_stride, buf);
}

F16 static void rows_avx2(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                          size_t y_stride, float *buf)
{
    float o[4 * 3];
    if (n == 1) {
        int r = r0;
        for (; r + 4 <= r1; r += 4)
            direct4(w + (size_t)r * row_bytes, row_bytes, x, cols, &y[r]);
        for (; r < r1; r++)
            y[r] = direct1((const uint16_t *)(w + (size_t)r * row_bytes), x, cols);
        return;
    }
    for (int t0 = 0; t0 < n; t0 += TOKEN_BLOCK) {
        int t1 = t0 + TOKEN_BLOCK < n ? t0 + TOKEN_BLOCK : n;
        for (int r = r0; r < r1; r += 4) {
            int R = r1 - r < 4 ? r1 - r : 4;
            for (int k = 0; k < R; k++)
                widen((const uint16_t *)(w + (size_t)(r + k) * row_bytes), buf + (size_t)k * cols, cols);
            for (int t = t0; t < t1; t += 3) {
                int T = t1 - t < 3 ? t1 - t : 3;
                const float *xt = x + (size_t)t * cols;
                if (R == 4 && T == 3)
                    tile4x3(buf, cols, xt, cols, cols, o);
                else if (R == 4)
                    for (int u = 0; u < T; u++)
                        tile4x1(buf, cols, xt + (size_t)u * cols, cols, o + u);
                else /* the last rows of a matrix whose height is not a multiple of 4 */
                    for (int k = 0; k < R; k++)
                        for (int u = 0; u < T; u++)
                            o[3 * k + u] = tile1x1(buf + (size_t)k * cols, xt + (size_t)u * cols, cols);
                for (int k = 0; k < R; k++)
                    for (int u = 0; u < T; u++)
                        y[(size_t)(t + u) * y_stride + r + k] = o[3 * k + u];
            }
        }
    }
}

F16 static void from_f32_fast(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        dst[i] = cpu_f16_round(src[i]);
}

F16 static void to_f32_fast(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = f16_value(src[i]);
}

#else
static void from_f32_fast(uint16_t *dst, const float *src, size_t n) { (void)dst; (void)src; (void)n; }
static void to_f32_fast(float *dst, const uint16_t *src, size_t n) { (void)dst; (void)src; (void)n; }
bool cpu_f16_fast(void) { return false; }
bool cpu_f16_wide_cpu(void) { return false; }
void cpu_f16_rows(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                  size_t y_stride, float *buf)
{
    (void)w; (void)row_bytes; (void)r0; (void)r1; (void)x; (void)n; (void)cols; (void)y; (void)y_stride; (void)buf;
}
void cpu_f16_rows_isa(const uint8_t *w, size_t row_bytes, int r0, int r1, const float *x, int n, int cols, float *y,
                      size_t y_stride, float *buf, enum cpu_isa isa)
{
    (void)w; (void)row_bytes; (void)r0; (void)r1; (void)x; (void)n; (void)cols; (void)y; (void)y_stride; (void)buf;
    (void)isa;
}
#endif

/* The portable forms are gguf.c's conversions: the same bits for all 2^32 floats and all
 * 65536 halves (this file had its own copies until a check over every input found them equal). */
uint16_t cpu_f16_round(float f) { return tide_f32_to_f16(f); }
float cpu_f16_widen(uint16_t h) { return tide_f16_to_f32(h); }

void cpu_f16_from_f32(uint16_t *dst, const float *src, size_t n)
{
    if (cpu_f16_fast()) {
        from_f32_fast(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = cpu_f16_round(src[i]);
}

void cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    if (cpu_f16_fast()) {
        to_f32_fast(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = cpu_f16_widen(src[i]);
}
