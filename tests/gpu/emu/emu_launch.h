/* emu_launch.h - one kernel launch on the CPU for the host emulations here that use the
 * common.cuh stand-in: `threads` host threads are the CTA's threads and walk the grid's CTAs
 * together (x fastest, then y, z), a barrier between CTAs; before each CTA the dynamic shared
 * memory is filled with NaN and the static __shared__ arrays met so far (EMU_SHARED) with 0xff
 * bytes, so a read of a slot nobody wrote shows. The definitions of the stand-in's globals live
 * here (include it once, from the emulator's .cpp). */
#pragma once
#include "engine/cuda/common.cuh"
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#include <stdlib.h>

thread_local emu_dim threadIdx, blockIdx;
emu_dim gridDim, blockDim;
float *emu_dyn_smem;
std::barrier<> *emu_cta_bar;
emu_warp *emu_warps;
static std::mutex emu_shared_mu;
static std::vector<std::pair<void *, size_t>> emu_shared_arrays;

/* under the static's guard: no thread of the CTA is past the declaration yet */
void emu_shared_add(void *p, size_t bytes)
{
    std::lock_guard<std::mutex> lk(emu_shared_mu);
    memset(p, 0xff, bytes);
    emu_shared_arrays.push_back({p, bytes});
}

template <typename F>
static void emu_launch(emu_dim grid, int threads, size_t smem_bytes, F kernel)
{
    size_t nf = smem_bytes / sizeof(float) + 4;
    float *smem = (float *)aligned_alloc(64, (nf * sizeof(float) + 63) & ~(size_t)63);
    emu_dyn_smem = smem;
    gridDim = grid;
    blockDim = {(unsigned)threads, 1, 1};
    std::barrier<> cta(threads);
    emu_cta_bar = &cta;
    int nw = (threads + 31) / 32;
    std::vector<emu_warp> warps(nw);
    for (auto &w : warps) w.bar = new std::barrier<>(32);
    emu_warps = warps.data();
    std::vector<std::thread> th;
    for (int t = 0; t < threads; t++)
        th.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = {x, y, z};
                        cta.arrive_and_wait(); /* the previous CTA is done with shared memory */
                        if (t == 0) {
                            for (size_t i = 0; i < nf; i++) smem[i] = NAN;
                            std::lock_guard<std::mutex> lk(emu_shared_mu);
                            for (auto &a : emu_shared_arrays) memset(a.first, 0xff, a.second);
                        }
                        cta.arrive_and_wait();
                        kernel();
                    }
        });
    for (auto &h : th) h.join();
    for (auto &w : warps) delete w.bar;
    free(smem);
}
