/* small_ops.cuh - the CUDA backend's small ops (backend_i.rmsnorm, rope, qk_norm_rope(_at,
 * _f16), swiglu, axpy(_sigmoid), scatter_axpy, get_row(s), get_row_at, gather_rows, store_f16),
 * implemented in small_ops.cu; backend_cuda.cu puts them in its table. */
#ifndef TIDE_CUDA_SMALL_OPS_CUH
#define TIDE_CUDA_SMALL_OPS_CUH

#include "engine/cuda/common.cuh"

void cu_rmsnorm(void *ctx, const float *x, const struct tensor *w, float *out, int dim, int n, float eps);
void cu_rope(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, float theta,
             enum rope_kind kind);
void cu_qk_norm_rope(void *ctx, float *q, float *k, const struct tensor *q_norm, const struct tensor *k_norm,
                     int n, int n_head, int n_head_kv, int head_dim, int pos, float theta, enum rope_kind kind,
                     float eps);
void cu_qk_norm_rope_at(void *ctx, float *q, const float *k_new, const float *v_new, float *k_cache,
                        float *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_floats,
                        const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                        int head_dim, float theta, enum rope_kind kind, float eps);
void cu_qk_norm_rope_at_f16(void *ctx, float *q, const float *k_new, const float *v_new, uint16_t *k_cache,
                            uint16_t *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_elems,
                            const struct tensor *q_norm, const struct tensor *k_norm, int n_head,
                            int n_head_kv, int head_dim, float theta, enum rope_kind kind, float eps);
void cu_store_f16(void *ctx, uint16_t *dst, const float *src, size_t n);
void cu_get_row_at(void *ctx, const struct tensor *t, const int32_t *at, float *out);
void cu_swiglu(void *ctx, float *gate, const float *up, int n);
void cu_axpy(void *ctx, float *y, const float *x, float a, int n);
void cu_axpy_sigmoid(void *ctx, float *y, const float *x, const float *g, int n, int dim);
void cu_scatter_axpy(void *ctx, float *y, const float *x, const int *rows, const float *w, int n, int dim);
void cu_get_row(void *ctx, const struct tensor *t, int id, float *out);
void cu_get_rows(void *ctx, const struct tensor *t, const int *ids, int n, float *out);
void cu_gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n, int dim);

#endif
