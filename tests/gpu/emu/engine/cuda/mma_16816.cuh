/* mma_16816.cuh, host form: the f16 m16n8k16 mma of src/engine/cuda/mma_16816.cuh for the
 * emulations that use the common.cuh stand-in here (attention_full_mma.cuh; f16-tile-emu's
 * mma_f16.cuh stand-in has its own). This directory comes first on the include path, so it stands
 * in for the CUDA header. A warp's 32 threads put their A and B registers in the warp's slots,
 * meet at the warp's barrier, and each computes its own C from the PTX ISA's layouts ("Matrix
 * Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4): A register i of lane 4g + t holds row
 * g + 8 (i & 1), k 2t + 8 (i >> 1) (low half) and k + 1 (high half); B register i column g, k 2t
 * + 8 i and k + 1; C e row g + 8 (e >> 1), column 2t + (e & 1). Products of halves are exact in
 * double and summed there, then added to the f32 accumulator (the real unit's order and
 * rounding inside a step are its own; test-gpu checks the real one). Every lane must take part
 * (as .sync.aligned requires), or the barrier hangs. bf16 is not provided. */
#pragma once
#include "engine/cuda/common.cuh"

template <typename T>
void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

struct emu_mma_slots { uint32_t a[32][4], b[32][2]; };
inline emu_mma_slots emu_mma_x[32]; /* a warp of the CTA's */

template <>
inline void mma_16816<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_warp &W = emu_warps[w];
    emu_mma_slots &X = emu_mma_x[w];
    for (int i = 0; i < 4; i++) X.a[lane][i] = a[i];
    X.b[lane][0] = b0, X.b[lane][1] = b1;
    W.bar->arrive_and_wait();
    auto h = [](uint32_t r, int k) { return (double)tide_f16_to_f32((uint16_t)(r >> (16 * (k & 1)))); };
    auto A = [&](int r, int k) { return h(X.a[(r % 8) * 4 + (k % 8) / 2][r / 8 + 2 * (k / 8)], k); };
    auto B = [&](int k, int c) { return h(X.b[c * 4 + (k % 8) / 2][k / 8], k); };
    int g = lane >> 2, t = lane & 3;
    float r[4];
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = 0;
        for (int k = 0; k < 16; k++) s += A(row, k) * B(k, col);
        r[e] = (float)((double)d[e] + s);
    }
    W.bar->arrive_and_wait(); /* every lane has read the slots before any writes them again */
    for (int e = 0; e < 4; e++) d[e] = r[e];
}
