/* attention.cuh - the attention launchers' shared pieces (attention.cu, attention_prefill.cu)
 * and the paged KV cache's addressing, which the decode rows' store (small_ops.cu) uses too.
 * backend_cuda.cu puts the paged ops in its table. */
#ifndef TIDE_CUDA_ATTENTION_CUH
#define TIDE_CUDA_ATTENTION_CUH

#include "engine/cuda/common.cuh"

/* A paged KV cache's addressing (backend_i.attention_paged, attention_at_paged,
 * qk_norm_rope_at_paged; docs/DESIGN.md "KV blocks"): a sequence's row p is row p % block_rows
 * of block tab[p / block_rows], block_rows = 2^shift. The tables are in device memory and read
 * when a kernel runs, never when it is queued, so a recorded step sees a table as it is when it
 * replays (a sequence that grew a block since). tables NULL: the contiguous layout. */
struct kv_pages {
    const int32_t *tables; /* one sequence's table, or all slots' tables stride entries apart */
    int stride;            /* entries from one slot's table to the next (the rows' ops) */
    int shift;             /* log2(block_rows) */
};

/* The pool row (the index of its first element, over kvd) of row p of the sequence whose
 * table is tab. */
__device__ __forceinline__ size_t kv_page_row(const int32_t *tab, int shift, int p)
{
    return ((size_t)__ldg(tab + (p >> shift)) << shift) | (size_t)(p & ((1 << shift) - 1));
}

/* log2(block_rows) for a paged op, or -1 (and a CUDA error kept in c) when block_rows is not a
 * power of two of at least 16 */
int cuda_block_shift(struct cuda_ctx *c, int block_rows);

/* common.cuh's cuda_attention, cuda_attention_at and cuda_attention_prefill with the rows
 * addressed by pg (pg.tables set: k_cache, v_cache are a layer's block pools; cuda_attention_pg
 * reads one sequence's table at pg.tables, cuda_attention_at_pg row r's at pg.tables +
 * slot[r] * pg.stride). The plain forms are these with pg zero. */
void cuda_attention_pg(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                       float *out, int n, int pos, int n_head, int n_head_kv, int head_dim, struct kv_pages pg);
void cuda_attention_at_pg(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx,
                          int n_head, int n_head_kv, int head_dim, struct kv_pages pg);
bool cuda_attention_prefill_pg(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache,
                               bool f16, float *out, int n, int pos, int n_head, int n_head_kv, int head_dim,
                               struct kv_pages pg);

/* backend_i.attention_paged, attention_at_paged (attention.cu) and qk_norm_rope_at_paged
 * (small_ops.cu) */
void cu_attention_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                        const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                        int n_head_kv, int head_dim);
void cu_attention_at_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16, float *out,
                           int n, const int32_t *at, const int32_t *slot, const int32_t *tables, int table_stride,
                           int block_rows, int n_ctx, int n_head, int n_head_kv, int head_dim);
void cu_qk_norm_rope_at_paged(void *ctx, float *q, const float *k_new, const float *v_new, void *k_pool,
                              void *v_pool, bool f16, int n, const int32_t *at, const int32_t *slot,
                              const int32_t *tables, int table_stride, int block_rows, const struct tensor *q_norm,
                              const struct tensor *k_norm, int n_head, int n_head_kv, int head_dim, float theta,
                              enum rope_kind kind, float eps);

#endif
