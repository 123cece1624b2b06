/* backend_cpu_attention.h - the CPU backend's causal attention (backend_cpu_attention.c), and
 * what it uses of backend_cpu.c: the thread pool and the f32 dot product. */
#ifndef TIDE_BACKEND_CPU_ATTENTION_H
#define TIDE_BACKEND_CPU_ATTENTION_H

typedef void (*cpu_job_fn)(void *arg, int ith, int nth);

/* Run fn on every pool thread (the caller is thread 0) and wait for all of them. */
void cpu_pool_run(void *ctx, cpu_job_fn fn, void *arg);
/* a . b over n floats, in the one order every CPU op that dots f32 uses */
float cpu_dot_f32(const float *a, const float *b, int n);
/* backend_i.attention */
void cpu_attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out, float *att,
                   int n, int pos, int n_head, int n_head_kv, int head_dim);

#endif
