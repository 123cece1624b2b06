/* mma_f16.cuh, host form: what src/engine/cuda/gemm_f16_mma.cuh takes from mma_f16.cuh (and its
 * includes), so that f16_tile_emu.cpp compiles the real gemm_f16_mma.cuh with g++ and runs it on
 * the CPU. This directory comes first on the include path, so it stands in for the CUDA header.
 *
 * A CUDA thread is a host thread (threadIdx thread_local), __syncthreads a barrier of the CTA's
 * 256 threads. cp.async: with emu_cp_late the copies land as late as cp.async.wait_group allows
 * (a thread's groups queued, the oldest landed until at most N are pending), otherwise at once:
 * two valid orders of the asynchronous copies, so a stage read before it landed or a slot
 * overwritten while still read shows. ldmatrix.x4 and mma.sync m16n8k16 are exchanged through a
 * warp's slots and computed per lane from the PTX ISA's layouts: ldmatrix gives lane l, in
 * register j, row l / 4 of the matrix whose row addresses lanes 8j..8j+7 supplied, elements
 * 2(l % 4) and 2(l % 4) + 1; the mma's A register i of lane 4g + t holds row g + 8 (i & 1), k 2t
 * + 8 (i >> 1) (and the next k), B register i column g, k 2t + 8 i, C e row g + 8 (e >> 1),
 * column 2t + (e & 1). Products are exact and summed in double, then added to the f32
 * accumulator. Also checked: every ldmatrix row 16-byte aligned and inside the shared block,
 * and each ldmatrix phase's 8 rows on 32 distinct banks (emu_conflicts counts those that are
 * not). What it cannot check: the real MMA unit, timing, speed (test-gpu does). */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <atomic>
#include <barrier>
#include <vector>
#include <algorithm>
extern "C" {
#include "engine/gguf.h"
}
#define __device__
#define __host__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
struct emu_idx { unsigned x; };
extern thread_local emu_idx threadIdx;
using std::min;
struct __half {};
struct __nv_bfloat16 {};

extern std::barrier<> *emu_cta_bar;
inline void __syncthreads() { emu_cta_bar->arrive_and_wait(); }

/* cp.async */
extern bool emu_cp_late;
struct emu_copy { void *d; const void *s; int bytes; };
extern thread_local std::vector<std::vector<emu_copy>> emu_groups; /* committed, oldest first */
extern thread_local std::vector<emu_copy> emu_open;                /* not committed yet */
inline void emu_land(const emu_copy &c) { memset(c.d, 0, 16); if (c.bytes) memcpy(c.d, c.s, c.bytes); }
inline void cp_async16(void *d, const void *s, int bytes)
{
    if (emu_cp_late) emu_open.push_back({d, s, bytes});
    else emu_land({d, s, bytes});
}
inline void cp_async_commit() { emu_groups.push_back(emu_open); emu_open.clear(); }
template <int N> inline void cp_async_wait()
{
    while (emu_groups.size() > (size_t)N) {
        for (const emu_copy &c : emu_groups.front()) emu_land(c);
        emu_groups.erase(emu_groups.begin());
    }
}

/* a warp's operands, exchanged between its 32 host threads */
struct emu_warp { const uint16_t *p[32]; uint32_t a[32][4]; uint32_t b[32][2]; std::barrier<> *bar; };
extern emu_warp *emu_warps;
extern const uint8_t *emu_smem_lo, *emu_smem_hi;
extern std::atomic<long> emu_conflicts, emu_phases, emu_bad_addr;

inline void ldsm_x4(uint32_t r[4], const uint16_t *p)
{
    int lane = threadIdx.x & 31;
    emu_warp &W = emu_warps[threadIdx.x >> 5];
    W.p[lane] = p;
    W.bar->arrive_and_wait();
    const uint8_t *q = (const uint8_t *)p;
    if (((uintptr_t)q & 15) || q < emu_smem_lo || q + 16 > emu_smem_hi)
        emu_bad_addr++;
    else if (lane % 8 == 0) { /* lane 8j: matrix j's phase */
        bool bank[32] = {false}, clash = false;
        for (int rr = 0; rr < 8; rr++)
            for (int w = 0; w < 4; w++) {
                int bk = (int)((((const uint8_t *)W.p[lane + rr] - emu_smem_lo) / 4 + w) % 32);
                clash |= bank[bk];
                bank[bk] = true;
            }
        emu_phases++;
        emu_conflicts += clash;
    }
    for (int j = 0; j < 4; j++) {
        const uint16_t *row = W.p[8 * j + lane / 4];
        r[j] = (uint32_t)row[2 * (lane % 4)] | (uint32_t)row[2 * (lane % 4) + 1] << 16;
    }
    W.bar->arrive_and_wait();
}

inline double emu_val(uint32_t w, int half, __half *) { return tide_f16_to_f32((uint16_t)(w >> (16 * half))); }
inline double emu_val(uint32_t w, int half, __nv_bfloat16 *) { return tide_bf16_to_f32((uint16_t)(w >> (16 * half))); }

template <typename T>
inline void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    int lane = threadIdx.x & 31;
    emu_warp &W = emu_warps[threadIdx.x >> 5];
    for (int i = 0; i < 4; i++) W.a[lane][i] = a[i];
    W.b[lane][0] = b0; W.b[lane][1] = b1;
    W.bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    auto A = [&](int r, int k) { return emu_val(W.a[(r % 8) * 4 + (k % 8) / 2][(r / 8) + 2 * (k / 8)], k % 2, (T *)0); };
    auto B = [&](int k, int c) { return emu_val(W.b[c * 4 + (k % 8) / 2][k / 8], k % 2, (T *)0); };
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), c = 2 * t + (e & 1);
        double s = 0;
        for (int k = 0; k < 16; k++) s += A(r, k) * B(k, c);
        d[e] = (float)((double)d[e] + s);
    }
    W.bar->arrive_and_wait();
}
