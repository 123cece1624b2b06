/* mma_q.cuh, host form: the cp.async copies of src/engine/cuda/mma_q.cuh for the emulations that
 * use the common.cuh stand-in here (attention_chunk.cuh). A copy of `bytes` bytes into a slot of
 * 16, 8 or 4, zero-filled past them. With emu_cp_late the copies land as late as
 * cp.async.wait_group allows (a thread's committed groups queued, the oldest landed until at
 * most N are pending; uncommitted copies wait for their commit), otherwise at once: two valid
 * orders of the asynchronous copies, so a buffer read before its copy landed, or refilled while
 * still read, shows.
 *
 * The MMAs (for mma_tile.cuh and mma_kq_tile.cuh, the real files, as kq_tile_emu.cpp compiles
 * them): each is exchanged through its warp's slots and computed per lane from the PTX ISA's
 * fragment layouts (m16n8k32 and m16n8k16 .s8: A word w of lane 4g + t is row g (+8), k 4t..
 * (+16); B word of lane 4g + t is column g, k 4t.. (+16); C c0..c3 rows g, g, g + 8, g + 8 by
 * columns 2t, 2t + 1), exact int32 sums. i2f_small is the real one. */
#pragma once
#include "engine/cuda/common.cuh"
#include <vector>
extern bool emu_cp_late;
struct emu_copy { void *d; const void *s; int bytes, size; };
extern thread_local std::vector<std::vector<emu_copy>> emu_groups; /* committed, oldest first */
extern thread_local std::vector<emu_copy> emu_open;                /* not committed yet */
inline void emu_land(const emu_copy &c) { memset(c.d, 0, c.size); if (c.bytes) memcpy(c.d, c.s, c.bytes); }
inline void emu_cp(void *d, const void *s, int bytes, int size)
{
    if (emu_cp_late) emu_open.push_back({d, s, bytes, size});
    else emu_land({d, s, bytes, size});
}
inline void cp_async16(void *d, const void *s, int bytes) { emu_cp(d, s, bytes, 16); }
inline void cp_async8(void *d, const void *s, int bytes) { emu_cp(d, s, bytes, 8); }
inline void cp_async4(void *d, const void *s, int bytes) { emu_cp(d, s, bytes, 4); }
inline void cp_async_commit() { emu_groups.push_back(emu_open); emu_open.clear(); }
template <int N> inline void cp_async_wait()
{
    while (emu_groups.size() > (size_t)N) {
        for (const emu_copy &c : emu_groups.front()) emu_land(c);
        emu_groups.erase(emu_groups.begin());
    }
}
/* a CTA's start: nothing left in flight from the previous one (a kernel that returned early) */
inline void emu_cp_reset() { emu_groups.clear(); emu_open.clear(); }

/* the warps' MMA operands (one CTA at a time: emu_launch), exchanged between a warp's 32 host
 * threads between two barriers of the warp (every lane takes part, as mma.sync requires) */
struct emu_mma_slots { uint32_t a[32][4], b[32][2]; };
inline emu_mma_slots emu_mma_slot[32];
inline int8_t emu_s8(uint32_t w, int e) { return (int8_t)(w >> (8 * e)); }
/* mma_q.cuh's mma_s8: c = A(16x32) B(32x8) */
inline void mma_s8(int c[4], const uint32_t a[4], uint2 b)
{
    int lane = threadIdx.x & 31;
    emu_mma_slots &W = emu_mma_slot[threadIdx.x >> 5];
    std::barrier<> *bar = emu_warps[threadIdx.x >> 5].bar;
    for (int i = 0; i < 4; i++) W.a[lane][i] = a[i];
    W.b[lane][0] = b.x; W.b[lane][1] = b.y;
    bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    /* A[r][k]: lane (r%8)*4 + (k%16)/4, reg (r/8) + 2*(k/16) */
    auto A = [&](int r, int k) { return emu_s8(W.a[(r % 8) * 4 + (k % 16) / 4][(r / 8) + 2 * (k / 16)], k % 4); };
    auto B = [&](int k, int n) { return emu_s8(W.b[n * 4 + (k % 16) / 4][k / 16], k % 4); };
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), n = 2 * t + (e & 1), s = 0;
        for (int k = 0; k < 32; k++) s += A(r, k) * B(k, n);
        c[e] = s;
    }
    bar->arrive_and_wait();
}
/* mma_kq_tile.cuh's mma_s8_k16 (c = A(16x16) B(16x8)), whose one asm statement the emulator
 * turns into a call of this (kq_tile_emu.cpp) */
inline void emu_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    int lane = threadIdx.x & 31;
    emu_mma_slots &W = emu_mma_slot[threadIdx.x >> 5];
    std::barrier<> *bar = emu_warps[threadIdx.x >> 5].bar;
    W.a[lane][0] = a0; W.a[lane][1] = a1; W.b[lane][0] = b;
    bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    auto A = [&](int r, int k) { return emu_s8(W.a[(r % 8) * 4 + k / 4][r / 8], k % 4); };
    auto B = [&](int k, int n) { return emu_s8(W.b[n * 4 + k / 4][0], k % 4); };
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), n = 2 * t + (e & 1), s = 0;
        for (int k = 0; k < 16; k++) s += A(r, k) * B(k, n);
        c[e] = s;
    }
    bar->arrive_and_wait();
}
/* mma_q.cuh's, as it is */
inline float i2f_small(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }
