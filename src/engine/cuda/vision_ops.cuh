/* vision_ops.cuh - the CUDA backend's vision-encoder slots (backend_i.layernorm ..
 * matmul_scratch), implemented in vision_ops.cu; backend_cuda.cu puts them in its table. */
#ifndef TIDE_CUDA_VISION_OPS_CUH
#define TIDE_CUDA_VISION_OPS_CUH

#include "engine/cuda/common.cuh"

void cu_layernorm(void *ctx, const float *x, float *y, const float *w, const float *b, int n, int dim, float eps);
void cu_add_bias(void *ctx, float *y, const float *b, int n, int dim);
void cu_activate(void *ctx, float *x, size_t n, enum act_kind act);
void cu_attention_full(void *ctx, const float *q, const float *k, const float *v, float *out, int P, int n_head,
                       int head_dim, float *ws);
size_t cu_matmul_scratch(void *ctx, const struct tensor *w, int n);
/* attention_full on the f16 tensor cores (attention_full_mma.cu): false, nothing queued, where it
 * does not take the shape (head_dim other than 64, 72, 80; unaligned buffers). */
bool cuda_attention_full_mma(struct cuda_ctx *c, const float *q, const float *k, const float *v, float *out, int P,
                             int n_head, int head_dim);

#endif
