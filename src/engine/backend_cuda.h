/* backend_cuda.h - the CUDA backend: the struct backend_i table on one NVIDIA GPU.
 *
 * Every pointer the ops take (activations, KV cache, tensor data) is device memory from
 * this backend's alloc (or an upload target). Ops are queued on one stream and never wait
 * for the GPU; download and sync are the only calls that block the host. Built only when
 * nvcc is found; otherwise backend_cuda_none.c provides the same functions, which report
 * that no CUDA device exists, so the daemon links and starts everywhere. */
#ifndef TIDE_BACKEND_CUDA_H
#define TIDE_BACKEND_CUDA_H

#include "engine/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 with a reason in why (no driver, no device, built
 * without CUDA). Never fails harder than that: safe on a machine with no NVIDIA driver. */
int cuda_device_count(char *why, size_t whylen);
/* cudaMemGetInfo for device dev. 0 or a negative TIDE_E* code. */
int cuda_mem_info(int dev, size_t *free_bytes, size_t *total_bytes);
/* Backend on CUDA device device_index: 0, or a negative code with the reason in err. */
int backend_cuda_init(struct backend *b, int device_index, char *err, size_t errlen);
void backend_cuda_free(struct backend *b);
/* The first CUDA failure inside an op since init (ops return void): 0 if none, else a
 * negative code and "call failed at file:line: message" in msg. */
int backend_cuda_error(const struct backend *b, char *msg, size_t msglen);
/* Page-locked host memory (fast, truly asynchronous uploads): the expert cache's host
 * mirrors. NULL on failure. */
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *p);
/* The decode kernels of issue 21, each on by default since its tests passed on an H100
 * (docs/CONFIG.md, docs/DESIGN.md "Decode is bound by kernel launches"):
 *   CUDA_DECODE_ATTN_SPLIT: attention of one query token in chunks of 16 keys on 128-thread
 *     CTAs (attention_decode.cu), so that 100-2000 keys fill the SMs;
 *   CUDA_DECODE_QONCE: q8_0 / q4_0 products of up to 8 tokens (matmul3 with its norm, matmul,
 *     matmul_add) through a kernel that streams weights several rows a warp (matmul_decode.cu),
 *     x quantised once into the scratch (1) or in each CTA after its weight loads (2); the same
 *     bits as without;
 *   CUDA_MOE_ROUTE_ONCE: the one-token MoE routes in one small kernel instead of inside every
 *     CTA of its first kernel (moe.cu); the same bits as without.
 * cuda_set_decode_opt(which, on): on 0 or 1 (CUDA_DECODE_QONCE: 0, 1 or 2) sets it
 * (process-wide: set before ops are queued or a step is recorded), -1 only reads; returns the
 * previous value. TIDE_DECODE_ATTN_SPLIT, TIDE_DECODE_QONCE (0, 1 or 2) and TIDE_MOE_ROUTE_ONCE
 * in the environment set them at start (=0 off; unset: 1). */
enum cuda_decode_opt { CUDA_DECODE_ATTN_SPLIT, CUDA_DECODE_QONCE, CUDA_MOE_ROUTE_ONCE, CUDA_DECODE_OPTS };
int cuda_set_decode_opt(int which, int on);
/* Tuning knobs of the q8_0/q4_0 tensor-core matmul (tests and benchmarks; process-wide, set
 * them before ops are queued): the smallest n it takes (a huge value keeps the dp4a path for
 * every n), a forced tile width in tokens (16, 32 or 64; 0 = chosen per product). Each
 * returns the previous value. */
int cuda_set_mmq_min_n(int n);
int cuda_set_mmq_tile(int bn);
int cuda_set_mmq_split(int max_splits); /* most K slices (1 = no split-K), 8 by default */
/* The int8 tensor-core path for q4_K / q5_K / q6_K products at prefill sizes, dense and in
 * moe_ffn_batch's grouped experts (mmq_kquant.cu): 1 on (the default), 0 off, -1 only reads.
 * TIDE_KQ_MMA=0 in the environment sets 0 at start. Returns the previous value. */
int cuda_set_kq_mma(int on);
/* Whether a product of this type, width (cols) and n tokens takes that path (rows aligned as
 * the loader allocates them): 1 or 0. Tests use it to know how the kernels see x. */
int cuda_kq_mma_takes(uint32_t type, int cols, int n);
/* Whether moe_ffn_batch runs (1, the default) or answers TIDE_EUNSUPPORTED, sending the forward
 * to the per-expert ops (0): before/after benchmarks and tests. Returns the previous value.
 * TIDE_MOE_GROUPED=0 in the environment sets 0 at start. */
int cuda_set_moe_grouped(int on);
/* A decode step's MoE of n > 1 tokens on the grouped tensor-core tiles (on by default;
 * TIDE_MOE_ROWS_MMA=0 keeps moe_rows.cu's CUDA-core kernels): on != 0 on, 0 off, < 0 only
 * reads; returns the old value. */
int cuda_set_moe_rows_mma(int on);
/* Whether prefill chunks with head_dim 64 or 128 take the f16 tensor-core attention kernel
 * (1, the default) or the f32 one (0); -1 only reads it. Returns the previous value.
 * TIDE_ATTN_MMA=0 in the environment sets 0 at start. */
int cuda_set_attn_mma(int on);
/* Whether the vision encoder's attention_full takes the f16 tensor-core kernel (1, the default)
 * or the f32 one (0); -1 only reads it. Returns the previous value. TIDE_VISION_TC=0 in the
 * environment sets 0 at start (docs/CONFIG.md; the Qwen-VL towers' weights follow the same
 * switch, qwen3vl_tc.h). */
int cuda_set_vision_tc(int on);

/* Whether prefill-size (n >= 64) f16 / bf16 products take the big-tile mma.sync kernel
 * (cuda/gemm_f16_mma.cu, 1, the default) or the wmma one (0); -1 only reads it. Returns the
 * previous value. TIDE_F16_MMA=0 in the environment sets 0 at start. */
int cuda_set_f16_mma(int on);
/* Its tile width in tokens (64 or 128; 0 = chosen per product) and most K slices (1 = no
 * split-K, 8 by default), for benchmarks. Returns the previous tile width. */
int cuda_set_f16_mma_tile(int bn, int max_splits);

#ifdef __cplusplus
}
#endif

#endif
