/* cpu_quant.h - int8 dot products of quantised weight rows with quantised activations, for
 * the CPU backend's matmul (cpu_quant.c).
 *
 * The activations of a matmul are quantised once per call: per 32 values with an f16 scale
 * (for the 32-value weight blocks: q8_0, q4_0, q5_0, q5_1, MXFP4), or per 256 values with an
 * f32 scale and 16-value sums (for the super-blocks: q4_K, q5_K, q6_K, iq4_xs). A row's dot
 * product is then exact integer sums per block, combined in float in one fixed order: so the
 * SIMD paths and the scalar one give the same bits, and a row's result does not depend on how
 * many vectors or threads the matmul has. */
#ifndef TIDE_CPU_QUANT_H
#define TIDE_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cpu_isa {
    CPU_ISA_BEST = 0,   /* what this CPU has, chosen once at run time */
    CPU_ISA_SCALAR,     /* portable C */
    CPU_ISA_AVX2,       /* x86-64 AVX2 */
    CPU_ISA_AVX512VNNI, /* AVX-512 with VNNI: q8_0 and q4_0 in tiles of eight (cpu_quant_vnni.c),
                         * q4_K, q5_K and q6_K in tiles of sixteen (cpu_kquant.c),
                         * the rest as AVX2 */
};

/* Whether weights of this ggml type have an int8 path here. */
bool cpu_quant_has(uint32_t type);
/* Whether this CPU (and build) can run isa. */
bool cpu_quant_isa_available(enum cpu_isa isa);
/* The ISA CPU_ISA_BEST stands for: the best this CPU has, capped by TIDE_CPU_ISA. */
enum cpu_isa cpu_quant_isa_best(void);
/* The ISA CPU_ISA_BEST picks, as a name ("avx512vnni", "avx2", "scalar"); the environment's
 * TIDE_CPU_ISA=avx2 or scalar caps it. */
const char *cpu_quant_isa_name(void);
/* Bytes of one vector of cols activations quantised for weights of type (cols a multiple of
 * the type's block size). */
size_t cpu_quant_act_bytes(uint32_t type, int cols);
/* Quantise x (cols floats) for dot products with rows of type into out. */
void cpu_quant_act(uint32_t type, const float *x, int cols, void *out);
/* The same on a given ISA (the bytes are the same on every one; for tests). */
void cpu_quant_act_isa(uint32_t type, const float *x, int cols, void *out, enum cpu_isa isa);
/* The dot product of one weight row (cols values of type) with quantised activations. */
float cpu_quant_dot(uint32_t type, const void *row, const void *act, int cols, enum cpu_isa isa);
/* The same for n vectors (act_stride bytes apart), results y[t * y_stride]: each exactly
 * what cpu_quant_dot gives; the row's blocks are unpacked once for all n (prefill). */
void cpu_quant_dot_many(uint32_t type, const void *row, const void *act, size_t act_stride, int n, int cols,
                        float *y, size_t y_stride, enum cpu_isa isa);
/* A matmul's share: y[t * y_stride + r] for rows r0 <= r < r1 (row_bytes apart from w) and n
 * vectors (act_stride bytes apart), each exactly what cpu_quant_dot gives. */
void cpu_quant_rows(uint32_t type, const void *w, size_t row_bytes, int r0, int r1, const void *act,
                    size_t act_stride, int n, int cols, float *y, size_t y_stride, enum cpu_isa isa);

#endif
