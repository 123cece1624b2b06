/* backend_cpu_moe.h - the CPU backend's grouped MoE (backend_i.moe_ffn_batch, backend_cpu_moe.c),
 * and the two things of backend_cpu.c it uses. */
#ifndef TIDE_BACKEND_CPU_MOE_H
#define TIDE_BACKEND_CPU_MOE_H

#include "backend.h"

/* backend_i.moe_ffn_batch for f16 experts and the int8 products' types (TIDE_EUNSUPPORTED for
 * others, and where gate and up differ in type: the caller runs the per-expert ops). */
int cpu_moe_ffn_batch(void *ctx, const struct moe_batch *b, const float *x, float *y, bool add);
/* Frees what cpu_moe_ffn_batch kept in a context (its state pointer, *cpu_moe_state). */
void cpu_moe_free(void *state);

/* From backend_cpu.c: thread ith's scratch of at least n floats (NULL: out of memory); every
 * thread's made that large (TIDE_ENOMEM: some could not be), so that a pool job's threads find
 * theirs; and the context's slot for this module's state. */
float *cpu_thread_scratch(void *ctx, int ith, size_t n);
int cpu_thread_scratch_all(void *ctx, size_t n);
void **cpu_moe_state(void *ctx);

#endif
