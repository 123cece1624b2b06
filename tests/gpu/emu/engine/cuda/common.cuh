/* common.cuh, host form: what the CUDA sources emulated here (attention_decode.cuh, ...) take
 * from src/engine/cuda/common.cuh and the CUDA headers, so that g++ compiles their device code
 * and runs it on the CPU (see emu_launch.h for the grid). This directory comes first on the
 * include path, so it stands in for the CUDA header.
 *
 * A CUDA thread is a host thread (threadIdx and blockIdx thread_local), __syncthreads a barrier
 * of the CTA's threads, a warp shuffle an exchange through the warp's 32 slots between two
 * barriers of its 32 threads (every lane must take part, as the _sync forms require when the
 * mask is full). __shared__ arrays are function statics (one copy, shared by the threads); the
 * Makefile's copy of a header follows each static one's declaration with EMU_SHARED(name), which
 * fills it with 0xff bytes (NaN as f32 and as f16) when first reached and before every CTA
 * (emu_launch.h), as the dynamic block is filled with NaN, so a read of a slot the CTA did not
 * write shows; the kernel's dynamic `extern __shared__` array is rewritten by the Makefile into a
 * pointer to emu_dyn_smem (g++ has no static array of unknown size). Float arithmetic is the
 * kernel's own (fmaf, expf, the same expressions in the same order). */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <barrier>
#include <algorithm>
extern "C" {
#include "common.h"
#include "engine/backend.h"
#include "engine/gguf.h"
}
#define QK 32
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __constant__
struct emu_dim { unsigned x, y, z; };
extern thread_local emu_dim threadIdx, blockIdx;
extern emu_dim gridDim, blockDim;
extern float *emu_dyn_smem;
using std::min;
using std::max;

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { uint32_t x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct __half { uint16_t bits; };
struct alignas(4) __half2 { __half x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
template <typename T> inline T __ldg(const T *p) { return *p; }
inline float __half2float(__half h) { return tide_f16_to_f32(h.bits); }
inline float2 __half22float2(__half2 h) { return {tide_f16_to_f32(h.x.bits), tide_f16_to_f32(h.y.bits)}; }

extern std::barrier<> *emu_cta_bar;
inline void __syncthreads() { emu_cta_bar->arrive_and_wait(); }

/* a static __shared__ array, registered by EMU_SHARED (the Makefile's copy of the header puts it
 * after the declaration): emu_shared_add (emu_launch.h) poisons it now and before every CTA */
void emu_shared_add(void *p, size_t bytes);
struct emu_shared_reg {
    emu_shared_reg(void *p, size_t bytes) { emu_shared_add(p, bytes); }
};
#define EMU_SHARED(name) static emu_shared_reg emu_shared_##name(name, sizeof name)

/* a warp's shuffle slots, exchanged between its 32 host threads */
struct emu_warp { uint64_t v[32]; std::barrier<> *bar; };
extern emu_warp *emu_warps;
template <typename T> inline T emu_shfl(T v, int src_of_lane(int, int), int arg)
{
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    int lane = threadIdx.x & 31;
    emu_warp &W = emu_warps[threadIdx.x >> 5];
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    W.v[lane] = b;
    W.bar->arrive_and_wait();
    b = W.v[src_of_lane(lane, arg)];
    W.bar->arrive_and_wait();
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warps[threadIdx.x >> 5].bar->arrive_and_wait(); }
inline int emu_lane_xor(int l, int o) { return l ^ o; }
inline int emu_lane_down(int l, int o) { return l + o < 32 ? l + o : l; }
inline int emu_lane_idx(int, int s) { return s & 31; }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_shfl(v, emu_lane_xor, o); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, int o) { return emu_shfl(v, emu_lane_down, o); }
template <typename T> inline T __shfl_sync(unsigned, T v, int s) { return emu_shfl(v, emu_lane_idx, s); }

/* the intrinsics under common_device.cuh, mmq.cuh and the kernels */
inline __half __ushort_as_half(unsigned short h) { return {h}; }
inline __half __float2half_rn(float v) { return {tide_f32_to_f16(v)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline int __float2int_rn(float v) { return (int)rintf(v); }
inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(uint32_t v) { float f; memcpy(&f, &v, 4); return f; }
inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh)
{
    uint64_t v = ((uint64_t)hi << 32) | lo;
    return (uint32_t)(v >> (sh & 31));
}
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
    uint8_t b[8];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(x >> (8 * i)), b[4 + i] = (uint8_t)(y >> (8 * i));
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        unsigned sel = (s >> (4 * i)) & 15; /* bit 3: the byte's sign bit replicated */
        r |= (uint32_t)(sel & 8 ? (b[sel & 7] & 0x80 ? 0xFF : 0) : b[sel]) << (8 * i);
    }
    return r;
}
inline uint32_t __vsub4(uint32_t a, uint32_t b)
{
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)(uint8_t)((uint8_t)(a >> 8 * i) - (uint8_t)(b >> 8 * i)) << (8 * i);
    return r;
}
inline uint32_t __vsubss4(uint32_t a, uint32_t b) /* per byte, signed, saturated */
{
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        int v = (int)(int8_t)(a >> 8 * i) - (int)(int8_t)(b >> 8 * i);
        r |= (uint32_t)(uint8_t)(v < -128 ? -128 : v > 127 ? 127 : v) << (8 * i);
    }
    return r;
}

#include "engine/cuda/common_device.cuh"
