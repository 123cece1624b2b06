/* backend_cpu_vision.h - the CPU backend's vision-encoder ops (backend_i.layernorm ..
 * attention_full), kept out of backend_cpu.c, which fills its table slots with them. */
#ifndef TIDE_BACKEND_CPU_VISION_H
#define TIDE_BACKEND_CPU_VISION_H

#include "engine/backend.h"

void cpu_layernorm(void *ctx, const float *x, float *y, const float *w, const float *b, int n, int dim, float eps);
void cpu_add_bias(void *ctx, float *y, const float *b, int n, int dim);
void cpu_rope_2d(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta);
void cpu_activate(void *ctx, float *x, size_t n, enum act_kind act);
void cpu_attention_full(void *ctx, const float *q, const float *k, const float *v, float *out, int P, int n_head,
                        int head_dim, float *ws);
/* backend_i.matmul of the CPU backend (backend_cpu.c), for attention_full's two products */
void backend_cpu_matmul(void *ctx, const struct tensor *w, const float *x, float *y, int n);

#endif
