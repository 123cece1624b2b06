/* backend_cpu_oai.h - the CPU backend's ops for gpt-oss (backend_i.rope_freqs and swiglu_oai;
 * its attention_sinks is in backend_cpu_attention.h), kept out of backend_cpu.c, which fills its
 * table slots with them. */
#ifndef TIDE_BACKEND_CPU_OAI_H
#define TIDE_BACKEND_CPU_OAI_H

#include "engine/backend.h"

void cpu_rope_freqs(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs, float mscale,
                    enum rope_kind kind);
void cpu_swiglu_oai(void *ctx, float *gate, const float *up, int n, float alpha, float limit);

#endif
