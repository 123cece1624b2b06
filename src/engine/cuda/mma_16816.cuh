/* mma_16816.cuh - the m16n8k16 tensor-core mma, f16 or bf16 in, f32 accumulate: gemm_f16_mma.cuh
 * (through mma_f16.cuh) and attention_full_mma.cuh. A header of its own, with nothing else in
 * it, so that tests/gpu/emu/engine/cuda/mma_16816.cuh can stand in for it on the host beside
 * the common.cuh stand-in (full-mma-emu); f16-tile-emu's mma_f16.cuh stand-in has its own. */
#ifndef TIDE_CUDA_MMA_16816_CUH
#define TIDE_CUDA_MMA_16816_CUH

#include "engine/cuda/common.cuh"

/* d += A(16x16) B(16x8), T (__half or __nv_bfloat16) in, f32 accumulate */
template <typename T>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
