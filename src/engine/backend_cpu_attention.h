/* backend_cpu_attention.h - the CPU backend's causal attention (backend_cpu_attention.c) over
 * a contiguous KV cache or a paged one (blocks of rows and a block table), and what it uses of
 * backend_cpu.c: the thread pool and the f32 dot product. */
#ifndef TIDE_BACKEND_CPU_ATTENTION_H
#define TIDE_BACKEND_CPU_ATTENTION_H

#include "cpu_quant.h" /* enum cpu_isa */

#include <stdbool.h>
#include <stdint.h>

typedef void (*cpu_job_fn)(void *arg, int ith, int nth);

/* Run fn on the caller (thread 0, ith) and on the pool threads that join in time; fn must
 * claim its work with cpu_claim (a thread may not join at all), and the call returns when
 * all of it is done. */
void cpu_pool_run(void *ctx, cpu_job_fn fn, void *arg);
/* The start of the next chunk of [0, total) from the job's counter, or -1 when none is left. */
static inline int cpu_claim(int *next, int chunk, int total)
{
    int s = __atomic_fetch_add(next, chunk, __ATOMIC_RELAXED);
    return s < total ? s : -1;
}
/* a . b over n floats, in the one order every CPU op that dots f32 uses */
float cpu_dot_f32(const float *a, const float *b, int n);
/* backend_i.attention */
void cpu_attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out, float *att,
                   int n, int pos, int n_head, int n_head_kv, int head_dim);
/* backend_i.attention_f16: bit for bit cpu_attention over the caches widened to f32.
 * head_dim <= CPU_ATT_F16_MAX_HD: the widest head any attention op takes, deepseek2's MLA rows
 * (512 + 64) through attention_sinks (the f16 rows are widened into stack buffers that size). */
#define CPU_ATT_F16_MAX_HD 576
void cpu_attention_f16(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache, float *out,
                       float *att, int n, int pos, int n_head, int n_head_kv, int head_dim);
/* Either of the two (f16: the caches hold f16) with the AVX-512 scores only where isa is
 * CPU_ISA_AVX512VNNI (or CPU_ISA_BEST picks it) and the CPU has them: the bits are the same
 * either way (for tests). */
void cpu_attention_isa(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16, float *out,
                       float *att, int n, int pos, int n_head, int n_head_kv, int head_dim, enum cpu_isa isa);
/* backend_i.attention_paged: the sequence's KV row p is row p % block_rows of block
 * blocks[p / block_rows] of k_pool / v_pool (f16: they hold f16); bit for bit cpu_attention
 * (f16: cpu_attention_f16) over the same rows laid out contiguously. block_rows is a power of
 * two and a multiple of 16 (the AVX-512 scores' tiles of 16 rows must not cross a block). */
void cpu_attention_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                         const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                         int n_head_kv, int head_dim);
/* backend_i.attention_sinks: cpu_attention (f16: cpu_attention_f16; blocks: cpu_attention_paged)
 * where the query at position p sees rows p - window + 1..p only (window > 0) and each head h's
 * softmax has one more logit, sinks[h], in its max and its denominator, with no value row
 * (sinks NULL: none). gpt-oss's attention; deepseek2's MLA heads wider than 256 take it with
 * neither (forward_mla.c). */
void cpu_attention_sinks(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                         const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                         int n_head_kv, int head_dim, const float *sinks, int window);
/* cpu_attention_paged with the ISA chosen as cpu_attention_isa's (for tests) */
void cpu_attention_paged_isa(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                             const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos,
                             int n_head, int n_head_kv, int head_dim, enum cpu_isa isa);

#endif
