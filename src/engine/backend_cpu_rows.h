/* backend_cpu_rows.h - the CPU backend's element-wise ops over a prefill chunk's rows, split
 * over the thread pool (backend_cpu_rows.c). */
#ifndef TIDE_BACKEND_CPU_ROWS_H
#define TIDE_BACKEND_CPU_ROWS_H

#include "model.h"

#include <math.h>

/* out (n, dim) = each row of x rmsnormed, times wf (dim floats) */
void cpu_rows_rmsnorm(void *ctx, const float *x, const float *wf, float *out, int dim, int n, float eps);
/* rope of n tokens at positions pos..: q (n, n_head_q*head_dim) and, when k is not NULL, k (n,
 * n_head_k*head_dim), both with one cos/sin per (token, pair) */
void cpu_rows_rope(void *ctx, float *q, int n_head_q, float *k, int n_head_k, int n, int head_dim, int pos,
                   float theta, enum rope_kind kind);
/* silu(g) * u: swiglu's element, the one expression every CPU form computes */
static inline float cpu_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
/* gate[i] = silu(gate[i]) * up[i] */
void cpu_rows_swiglu(void *ctx, float *gate, const float *up, int n);
/* y += a x over n floats */
void cpu_rows_axpy(void *ctx, float *y, const float *x, float a, int n);
/* y[rows[i]] += w[i] x[i] for rows of dim floats, i in order */
void cpu_rows_scatter_axpy(void *ctx, float *y, const float *x, const int *rows, const float *w, int n, int dim);
/* dst[i] = src[rows[i]] */
void cpu_rows_gather(void *ctx, float *dst, const float *src, const int *rows, int n, int dim);

#endif
