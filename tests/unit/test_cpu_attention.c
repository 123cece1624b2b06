/* test_cpu_attention.c - the CPU backend's causal attention (backend_cpu_attention.c): against
 * a double-precision softmax attention, and the same bits whichever way the work is split: a
 * prefill chunk on 1, 2 or 3 threads, and each of its tokens decoded alone at its position;
 * and whichever instruction set makes the scores (AVX2, or AVX-512 16 positions at a time:
 * contexts of 41 to 64 positions cover whole blocks of 16 and the ones left). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/backend_cpu_attention.h"
#include "engine/cpu_f16.h"
#include "ref_attention.h"
#include "test_rand.h"

enum { H = 8, HKV = 2, HD = 64, POS = 40, N = 24, CTX = POS + N };

Test(cpu_attention, prefill_matches_double_reference_and_decode_bits_on_any_thread_count)
{
    size_t qd = (size_t)H * HD, kvd = (size_t)HKV * HD;
    float *q = malloc(sizeof(float) * N * qd), *k = malloc(sizeof(float) * CTX * kvd);
    float *v = malloc(sizeof(float) * CTX * kvd), *att = malloc(sizeof(float) * H * CTX);
    float *out[3], *alone = malloc(sizeof(float) * N * qd);
    float *avx2 = malloc(sizeof(float) * N * qd), *avx512 = malloc(sizeof(float) * N * qd);
    for (size_t i = 0; i < N * qd; i++) q[i] = 3.0f * frand();
    for (size_t i = 0; i < CTX * kvd; i++) k[i] = frand(), v[i] = frand();
    for (int threads = 1; threads <= 3; threads++) {
        struct backend be;
        cr_assert_eq(backend_cpu_init(&be, threads), 0);
        out[threads - 1] = malloc(sizeof(float) * N * qd);
        be.i->attention(be.ctx, q, k, v, out[threads - 1], att, N, POS, H, HKV, HD);
        if (threads == 2) { /* decode: each token alone at its position, heads split over threads */
            for (int t = 0; t < N; t++)
                be.i->attention(be.ctx, q + t * qd, k, v, alone + t * qd, att, 1, POS + t, H, HKV, HD);
            /* AVX2's scores and AVX-512's (where the CPU has them) */
            cpu_attention_isa(be.ctx, q, k, v, false, avx2, att, N, POS, H, HKV, HD, CPU_ISA_AVX2);
            cpu_attention_isa(be.ctx, q, k, v, false, avx512, att, N, POS, H, HKV, HD, CPU_ISA_AVX512VNNI);
        }
        backend_cpu_free(&be);
    }
    cr_assert(memcmp(out[0], out[1], sizeof(float) * N * qd) == 0, "1 and 2 threads differ");
    cr_assert(memcmp(out[0], out[2], sizeof(float) * N * qd) == 0, "1 and 3 threads differ");
    cr_assert(memcmp(out[0], alone, sizeof(float) * N * qd) == 0, "prefill differs from decode alone");
    cr_assert(memcmp(out[0], avx2, sizeof(float) * N * qd) == 0, "the default ISA differs from AVX2");
    cr_assert(memcmp(avx2, avx512, sizeof(float) * N * qd) == 0, "AVX2 and AVX-512 scores differ");
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD; i += 7) {
                double ref = ref_attention(q, k, v, t, h, i, H, HKV, HD, POS);
                float got = out[1][((size_t)t * H + h) * HD + i];
                cr_assert_leq(fabs(got - ref), 1e-5 + 1e-5 * fabs(ref), "token %d head %d [%d]: %g vs %g", t, h, i,
                              got, ref);
            }
    for (int i = 0; i < 3; i++) free(out[i]);
    free(q); free(k); free(v); free(att); free(alone); free(avx2); free(avx512);
}

/* The f16 cache through both ISAs' code: AVX-512's pairs and 16-position scores over f16 rows
 * give AVX2's bits, and both are the f32 form's bits over the widened rows. */
Test(cpu_attention, f16_cache_gives_the_same_bits_in_avx2_and_avx512)
{
    size_t qd = (size_t)H * HD, kvd = (size_t)HKV * HD;
    float *q = malloc(sizeof(float) * N * qd), *k = malloc(sizeof(float) * CTX * kvd);
    float *v = malloc(sizeof(float) * CTX * kvd), *att = malloc(sizeof(float) * H * CTX);
    uint16_t *k16 = malloc(sizeof(uint16_t) * CTX * kvd), *v16 = malloc(sizeof(uint16_t) * CTX * kvd);
    float *wide = malloc(sizeof(float) * N * qd), *avx2 = malloc(sizeof(float) * N * qd);
    float *avx512 = malloc(sizeof(float) * N * qd);
    for (size_t i = 0; i < N * qd; i++) q[i] = 3.0f * frand();
    for (size_t i = 0; i < CTX * kvd; i++) k[i] = frand(), v[i] = frand();
    cpu_f16_from_f32(k16, k, CTX * kvd);
    cpu_f16_from_f32(v16, v, CTX * kvd);
    cpu_f16_to_f32(k, k16, CTX * kvd); /* the f32 caches hold the widened rows */
    cpu_f16_to_f32(v, v16, CTX * kvd);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    cpu_attention_isa(be.ctx, q, k, v, false, wide, att, N, POS, H, HKV, HD, CPU_ISA_AVX2);
    cpu_attention_isa(be.ctx, q, k16, v16, true, avx2, att, N, POS, H, HKV, HD, CPU_ISA_AVX2);
    cpu_attention_isa(be.ctx, q, k16, v16, true, avx512, att, N, POS, H, HKV, HD, CPU_ISA_AVX512VNNI);
    backend_cpu_free(&be);
    cr_assert(memcmp(wide, avx2, sizeof(float) * N * qd) == 0, "f16 (AVX2) differs from f32 over the widened rows");
    cr_assert(memcmp(avx2, avx512, sizeof(float) * N * qd) == 0, "f16: AVX2 and AVX-512 differ");
    free(q); free(k); free(v); free(att); free(k16); free(v16); free(wide); free(avx2); free(avx512);
}
