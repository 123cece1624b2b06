/* mma_f16.cuh - the primitives of the f16 / bf16 tensor-core tiles (gemm_f16_mma.cuh): cp.async
 * (mma_q.cuh), ldmatrix.x4 and the m16n8k16 mma with f32 accumulate (mma_16816.cuh). A header
 * of its own so that tests/gpu/emu/engine/cuda/mma_f16.cuh can stand in for it on the host
 * (f16-tile-emu). */
#ifndef TIDE_CUDA_MMA_F16_CUH
#define TIDE_CUDA_MMA_F16_CUH

#include "engine/cuda/mma_q.cuh"
#include "engine/cuda/mma_16816.cuh"

/* four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 and gets, in
 * r[j], row l / 4 of matrix j, elements 2(l % 4), +1. volatile and "memory": the reads must
 * stay between the barriers that order them against cp.async. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

#endif
