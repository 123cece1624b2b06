/* mma_q.cuh, host form: the cp.async copies of src/engine/cuda/mma_q.cuh for the emulations that
 * use the common.cuh stand-in here (attention_chunk.cuh). A copy of `bytes` bytes into a slot of
 * 16, 8 or 4, zero-filled past them. With emu_cp_late the copies land as late as
 * cp.async.wait_group allows (a thread's committed groups queued, the oldest landed until at
 * most N are pending; uncommitted copies wait for their commit), otherwise at once: two valid
 * orders of the asynchronous copies, so a buffer read before its copy landed, or refilled while
 * still read, shows. (The MMA and i2f helpers of the real file are not needed here.) */
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
