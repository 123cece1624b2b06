/* attention_full_mma.cu - the vision encoder's full (bidirectional, unmasked) attention on the
 * f16 tensor cores: backend_i.attention_full when TIDE_VISION_TC=1 (cuda_set_vision_tc) and
 * the head is 64, 72 or 80 wide (CLIP-L, Qwen3-VL / SigLIP, Qwen2.5-VL).
 *
 * Why: attention_full_kernel (vision_ops.cu) is one CTA a query with its P scores in shared
 * memory and f32 dot products on the CUDA cores; a Qwen3-VL-30B-A3B image of 1024x768 is 3072
 * tokens x 16 heads x 27 blocks, about 1.2 TFLOP of attention, which that kernel takes hundreds
 * of milliseconds for. This is attention_prefill.cu's tensor-core kernel without the causal
 * mask: a CTA takes 64 queries of one head (4 warps of 16), walks the keys in tiles of 64,
 * S = Q K^T and O += P V as mma.sync m16n8k16 (f16 in, f32 accumulate) with the online
 * softmax (running max and sum, base 2), the S accumulators reused as P's A fragments
 * (FlashAttention-2), so no score table exists and the workspace is not used.
 *
 * Head widths that are not a multiple of 16 (72): Q K^T walks the head in k steps of 16, so the
 * head is padded to HP = 80 with zeros - Q's fragments are zero there and K's padding columns
 * in shared memory are zeroed once (zero times whatever the memory held could be NaN). P V's
 * output tiles are 8 wide and cover exactly HD columns (HD % 8 == 0), so V needs no padding.
 *
 * Numerics: q, k, v and the probabilities are rounded to f16 on the way in (2^-11 relative),
 * the sums are f32: the CPU's f32 attention to ~1e-3 relative (the test holds it to 3e-3), as
 * the causal tensor-core kernel. Not bit for bit with anything.
 *
 * The device code (the kernel and its helpers) is in attention_full_mma.cuh, a header so that
 * the CPU emulator (tests/gpu/emu/full_mma_emu.cpp, `make full-mma-emu`) compiles it with g++;
 * this file keeps the switch and the launch (the emulator copies the launch: keep in step). */
#include "engine/cuda/vision_ops.cuh"
#include "engine/cuda/attention_full_mma.cuh"

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "engine/backend_cuda.h"
}

static int vision_tc = -1; /* -1: TIDE_VISION_TC not read yet */

extern "C" int cuda_set_vision_tc(int on)
{
    if (vision_tc < 0) {
        const char *e = getenv("TIDE_VISION_TC");
        vision_tc = !(e && !strcmp(e, "0"));
    }
    int old = vision_tc;
    if (on >= 0)
        vision_tc = on != 0;
    return old;
}

bool cuda_attention_full_mma(struct cuda_ctx *c, const float *q, const float *k, const float *v, float *out, int P,
                             int n_head, int head_dim)
{
    if (head_dim != 64 && head_dim != 72 && head_dim != 80)
        return false;
    /* the float4 / float2 loads need 16-byte aligned rows (A % 4 == 0 holds for these widths) */
    if ((((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) & 15) || n_head > 65535)
        return false;
    float scale2 = 1.4426950408889634f / sqrtf((float)head_dim);
    int A = n_head * head_dim;
    dim3 grid((unsigned)((P + VA_ROWS - 1) / VA_ROWS), (unsigned)n_head);
    if (head_dim == 72)
        attn_full_mma_kernel<72><<<grid, VA_THREADS, 0, c->st>>>(q, k, v, out, P, A, scale2);
    else if (head_dim == 80)
        attn_full_mma_kernel<80><<<grid, VA_THREADS, 0, c->st>>>(q, k, v, out, P, A, scale2);
    else
        attn_full_mma_kernel<64><<<grid, VA_THREADS, 0, c->st>>>(q, k, v, out, P, A, scale2);
    CU_LAUNCH(c, "attn_full_mma_kernel");
    return true;
}
