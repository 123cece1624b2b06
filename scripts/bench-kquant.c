/* bench-kquant.c - one thread's CPU time per quantised product (cpu_quant_rows) on each ISA: a
 * ROWSxCOLS matrix of random blocks with 1 vector (decode) and 64 (a prefill share), the best
 * of REPS runs, so a busy neighbour costs wall time but not the numbers (up to cache sharing).
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc scripts/bench-kquant.c build/libtide.a -lm -lpthread -o /tmp/bench-kquant
 *   [NV=64] [TYPES=q4_K,q5_K,q6_K] /tmp/bench-kquant [ROWS COLS]
 * (default 2048 2048; NV: the vectors of the second run; TYPES: any of the quantised types by
 * their ggml names, e.g. TYPES=mxfp4,q4_0,q5_0,q8_0) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cpu_quant.h"
#include "engine/gguf.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int rows = argc > 2 ? atoi(argv[1]) : 2048, cols = argc > 2 ? atoi(argv[2]) : 2048;
    static const enum cpu_isa isas[] = {CPU_ISA_AVX2, CPU_ISA_AVX512VNNI};
    const int NV = getenv("NV") ? atoi(getenv("NV")) : 64;
    char names[256];
    snprintf(names, sizeof names, "%s", getenv("TYPES") ? getenv("TYPES") : "q4_K,q5_K,q6_K");
    enum { REPS = 7 };
    srand(1);
    for (char *name = strtok(names, ","); name; name = strtok(NULL, ",")) {
        uint32_t type = 0;
        while (type < 64 && (!ggml_block_size(type) || strcmp(ggml_type_name(type), name)))
            type++;
        if (type == 64 || type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
            fprintf(stderr, "bench-kquant: %s is not a quantised type tide knows\n", name);
            return 2;
        }
        uint32_t bs = ggml_block_size(type);
        size_t bb = ggml_row_size(type, bs);
        size_t rb = ggml_row_size(type, (uint64_t)cols), ab = cpu_quant_act_bytes(type, cols);
        uint8_t *w = malloc(rb * rows), *act = malloc(ab * NV);
        float *x = malloc(sizeof(float) * cols), *y = malloc(sizeof(float) * rows * NV);
        for (size_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)rand();
        for (int r = 0; r < rows; r++) /* finite scales: f16 0x2000 is about 0.008, MXFP4 2^-8 */
            for (int b = 0; b < cols / (int)bs; b++) {
                uint8_t *blk = w + r * rb + (size_t)b * bb;
                uint8_t *d = type == GGML_TYPE_Q6_K ? blk + 208 : blk;
                if (type == GGML_TYPE_MXFP4) {
                    d[0] = 120;
                    continue;
                }
                d[0] = 0; d[1] = 0x20;
                if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q5_1) { d[2] = 0; d[3] = 0x20; }
            }
        for (int v = 0; v < NV; v++) {
            for (int i = 0; i < cols; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
            cpu_quant_act(type, x, cols, act + v * ab);
        }
        for (int i = 0; i < 2; i++) {
            if (!cpu_quant_isa_available(isas[i]))
                continue;
            for (int n = 1; n <= NV; n += NV - 1) {
                double best = 1e9;
                for (int rep = 0; rep < REPS; rep++) {
                    double t0 = now();
                    cpu_quant_rows(type, w, rb, 0, rows, act, ab, n, cols, y, rows, isas[i]);
                    double dt = now() - t0;
                    best = dt < best ? dt : best;
                }
                printf("%-5s %-10s %dx%d n=%-3d %8.3f ms\n", ggml_type_name(type),
                       isas[i] == CPU_ISA_AVX2 ? "avx2" : "avx512vnni", rows, cols, n, best * 1e3);
            }
        }
        free(w); free(act); free(x); free(y);
    }
    return 0;
}
