/* mma_q.cuh - what the int8 tensor-core kernels share (mmq_mma.cu: one product;
 * moe_prefill.cu: a chunk's experts grouped): cp.async copies into shared memory, the
 * m16n8k32 s8 mma, an exact small int32 -> f32, and the unpacking of a q8_0 / q4_0 block
 * copied raw into shared memory. */
#ifndef TIDE_CUDA_MMA_Q_CUH
#define TIDE_CUDA_MMA_Q_CUH

#include "engine/cuda/mmq.cuh"

__device__ __forceinline__ void cp_async16(void *smem, const void *g, int bytes)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(bytes) : "memory");
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

template <int QT>
struct qblock {
    static constexpr int BLK = QT == 8 ? 34 : 18; /* bytes per block */
    static constexpr int NW = QT == 8 ? 8 : 4;    /* 32-bit words of quants */
};

/* The scale and the 8 int8x4 words (element order) of the block at shared address p, which
 * is 2-byte aligned: aligned 32-bit loads from p rounded down to 4, then either whole words
 * (p = 2 mod 4: the quants start on a word) or a funnel shift by 16. Word NW is read as two
 * halves so that nothing past the block's last byte is read (the raw copy may end there). */
template <int QT>
__device__ __forceinline__ float unpack_block(const uint8_t *p, uint32_t q[8])
{
    constexpr int NW = qblock<QT>::NW;
    bool odd = ((uintptr_t)p & 2) != 0;
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    uint32_t w[NW + 1];
#pragma unroll
    for (int i = 0; i < NW; i++)
        w[i] = a[i];
    uint32_t lo = ((const uint16_t *)(a + NW))[0];
    uint32_t hi = odd ? ((const uint16_t *)(a + NW))[1] : 0u;
    w[NW] = lo | (hi << 16);
    uint32_t u[NW];
#pragma unroll
    for (int i = 0; i < NW; i++)
        u[i] = odd ? w[i + 1] : __funnelshift_r(w[i], w[i + 1], 16);
    if (QT == 8) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = u[i];
    } else {
        int wq[8];
        unpack_q4(u, wq);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = (uint32_t)wq[i];
    }
    return f16_bits_to_f32((uint16_t)(odd ? w[0] >> 16 : w[0] & 0xFFFFu));
}

#endif
