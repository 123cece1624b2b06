/* mma_q.cuh - the primitives of the int8 tensor-core kernels (mma_tile.cuh): cp.async copies
 * into shared memory, the m16n8k32 s8 mma and an exact small int32 -> f32. */
#ifndef TIDE_CUDA_MMA_Q_CUH
#define TIDE_CUDA_MMA_Q_CUH

#include "engine/cuda/mmq.cuh"

__device__ __forceinline__ void cp_async16(void *smem, const void *g, int bytes)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(bytes) : "memory");
}

/* bytes 0 or 8: a zero-filled 8 bytes when 0 */
__device__ __forceinline__ void cp_async8(void *smem, const void *g, int bytes)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(g), "r"(bytes) : "memory");
}

/* bytes < 4 copies that many and zero-fills the rest */
__device__ __forceinline__ void cp_async4(void *smem, const void *g, int bytes)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(g), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* c = A(16x32) B(32x8), int8 in, int32 out, from zero: one K block's integer dots */
__device__ __forceinline__ void mma_s8(int c[4], const uint32_t a[4], uint2 b)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0));
}

/* Exact int32 -> f32 for |v| < 2^22 (a block dot is at most 32 * 128 * 127 < 2^19) with an
 * integer add and a float subtract: I2F issues at a quarter of the FP32 rate on sm_90 and
 * would be the busiest pipe here. */
__device__ __forceinline__ float i2f_small(int v)
{
    return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

#endif
