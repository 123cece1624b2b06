/* mrope.cuh - the CUDA backend's sectioned ropes (backend_i.rope_multi, the text models'
 * M-RoPE, and backend_i.rope_2d, the Qwen-VL ViT's 2-D rope), implemented in mrope.cu;
 * backend_cuda.cu puts them in its table. */
#ifndef TIDE_CUDA_MROPE_CUH
#define TIDE_CUDA_MROPE_CUH

#include "engine/cuda/common.cuh"

void cu_rope_multi(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta,
                   const uint32_t sections[4], bool interleaved);
void cu_rope_2d(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta);

#endif
