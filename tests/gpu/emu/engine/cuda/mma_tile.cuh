/* mma_tile.cuh, host form: what src/engine/cuda/mma_kq_tile.cuh takes from mma_tile.cuh (and
 * its includes), so that kq_tile_emu.cpp compiles the real mma_kq_tile.cuh with g++ and runs it
 * on the CPU. This directory comes first on the include path, so it stands in for the CUDA
 * header. A CUDA thread is a host thread (threadIdx thread_local), __syncthreads a barrier of
 * the CTA's 256 threads; cp.async copies at once (a valid order of the real asynchronous
 * copies: the ring never copies into the stage being read); each MMA is exchanged through a
 * warp's slots and computed per lane from the PTX ISA's fragment layouts (m16n8k32 and
 * m16n8k16 .s8: A word w of lane 4g + t is row g (+8), k 4t.. (+16); B word of lane 4g + t is
 * column g, k 4t.. (+16); C c0..c3 rows g, g, g + 8, g + 8 by columns 2t, 2t + 1), the same
 * layouts mma_tile.cuh's q8_0 tiles use on the GPU. The float arithmetic is the kernel's own
 * (fmaf, the same expressions), so only the order of nothing changes: results should match a
 * double-precision reference to float rounding. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <barrier>
#include <algorithm>
extern "C" {
#include "engine/gguf.h"
}
#define __device__
#define __host__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define QK 32
#define TILE_THREADS 256
#define TILE_WM 4
#define TILE_WN 2
#define TILE_BM 128
struct emu_idx { unsigned x; };
extern thread_local emu_idx threadIdx;
using std::min;
extern std::barrier<> *emu_cta_bar;
inline void __syncthreads() { emu_cta_bar->arrive_and_wait(); }
inline void cp_async16(void *d, const void *s, int bytes) { memset(d, 0, 16); if (bytes) memcpy(d, s, bytes); }
inline void cp_async8(void *d, const void *s, int bytes) { memset(d, 0, 8); if (bytes) memcpy(d, s, bytes); }
inline void cp_async4(void *d, const void *s, int bytes) { memset(d, 0, 4); if (bytes) memcpy(d, s, bytes); }
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(uint32_t v) { float f; memcpy(&f, &v, 4); return f; }
inline float i2f_small(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }
inline float f16_bits_to_f32(uint16_t h) { return tide_f16_to_f32(h); }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
    uint8_t b[8];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(x >> (8 * i)), b[4 + i] = (uint8_t)(y >> (8 * i));
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)b[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh)
{
    sh &= 31;
    uint64_t v = ((uint64_t)hi << 32) | lo;
    return (uint32_t)(v >> sh);
}
inline uint32_t __vsub4(uint32_t a, uint32_t b)
{
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)(uint8_t)((uint8_t)(a >> 8 * i) - (uint8_t)(b >> 8 * i)) << (8 * i);
    return r;
}
struct uint2 { uint32_t x, y; };
struct float2 { float x, y; };
struct int4 { int x, y, z, w; };
/* a warp's MMA operands, exchanged between its 32 host threads */
struct emu_warp { uint32_t a[32][4]; uint32_t b[32][2]; std::barrier<> *bar; };
extern emu_warp *emu_warps;
inline int8_t s8(uint32_t w, int e) { return (int8_t)(w >> (8 * e)); }
inline void mma_s8(int c[4], const uint32_t a[4], uint2 b)
{
    int lane = threadIdx.x & 31;
    emu_warp &W = emu_warps[threadIdx.x >> 5];
    for (int i = 0; i < 4; i++) W.a[lane][i] = a[i];
    W.b[lane][0] = b.x; W.b[lane][1] = b.y;
    W.bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    /* A[r][k]: lane (r%8)*4 + (k%16)/4, reg (r/8) + 2*(k/16) */
    auto A = [&](int r, int k) { return s8(W.a[(r % 8) * 4 + (k % 16) / 4][(r / 8) + 2 * (k / 16)], k % 4); };
    auto B = [&](int k, int n) { return s8(W.b[n * 4 + (k % 16) / 4][k / 16], k % 4); };
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), n = 2 * t + (e & 1), s = 0;
        for (int k = 0; k < 32; k++) s += A(r, k) * B(k, n);
        c[e] = s;
    }
    W.bar->arrive_and_wait();
}
inline void emu_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    int lane = threadIdx.x & 31;
    emu_warp &W = emu_warps[threadIdx.x >> 5];
    W.a[lane][0] = a0; W.a[lane][1] = a1; W.b[lane][0] = b;
    W.bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    auto A = [&](int r, int k) { return s8(W.a[(r % 8) * 4 + k / 4][r / 8], k % 4); };
    auto B = [&](int k, int n) { return s8(W.b[n * 4 + k / 4][0], k % 4); };
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), n = 2 * t + (e & 1), s = 0;
        for (int k = 0; k < 16; k++) s += A(r, k) * B(k, n);
        c[e] = s;
    }
    W.bar->arrive_and_wait();
}
/* mma_kq_tile.cuh's one asm statement is mma_s8_k16's: its body becomes the emulation (c, a0,
 * a1 and b are that function's parameters) */
#define asm(...) emu_k16(c, a0, a1, b)
