/* backend_cpu_oai.h - the CPU backend's ops for gpt-oss (backend_i.attention_sinks,
 * rope_freqs and swiglu_oai), kept out of backend_cpu.c, which fills its table slots with them. */
#ifndef TIDE_BACKEND_CPU_OAI_H
#define TIDE_BACKEND_CPU_OAI_H

#include "engine/backend.h"

void cpu_attention_sinks(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                         float *att, int n, int pos, int n_head, int n_head_kv, int head_dim, const float *sinks,
                         int window);
/* Run fn(arg, ith, nth) on the CPU backend's nth threads, ith = 0..nth-1, and wait (backend_cpu.c). */
void backend_cpu_parallel(void *ctx, void (*fn)(void *arg, int ith, int nth), void *arg);
void cpu_rope_freqs(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs, float mscale,
                    enum rope_kind kind);
void cpu_swiglu_oai(void *ctx, float *gate, const float *up, int n, float alpha, float limit);

#endif
