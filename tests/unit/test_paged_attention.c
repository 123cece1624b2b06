/* test_paged_attention.c - the CPU backend's attention over a paged KV cache
 * (backend_i.attention_paged, backend_cpu_attention.c): the sequence's rows lie in blocks of a
 * pool, in the order a block table gives (a permutation with gaps: blocks the sequence does not
 * own hold other data), and the op must give the contiguous op's bits over the same rows laid
 * out one after another. Checked for blocks of 16 and of 64 rows; head_dim 64 (AVX-512's pairs
 * of GQA heads, and its 16-position scores for MHA), 128, 32, 40 (AVX2 with a partial chunk of
 * the output) and 20 (the portable path: not a multiple of 8); prefill chunks that cross block
 * boundaries from positions that are not multiples of 16, and decode steps on both sides of a
 * block's end; f32 and f16 pools; each ISA the op can be asked for (CPU_ISA_SCALAR and
 * CPU_ISA_AVX2 both take AVX2's code where the CPU has it; AVX-512 is used only with
 * CPU_ISA_AVX512VNNI, or CPU_ISA_BEST on such a CPU); 1 and 2 threads. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/backend_cpu_attention.h"
#include "engine/cpu_f16.h"
#define TEST_RAND_SEED 0x2545f4914f6cdd1dULL
#include "test_rand.h"

struct shape { int head_dim, n_head, n_head_kv; };
static const struct shape shapes[] = {
    {64, 8, 2}, {64, 4, 4}, {128, 8, 2}, {128, 4, 4}, {32, 8, 2}, {40, 4, 2}, {20, 4, 4},
};
static const enum cpu_isa isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512VNNI, CPU_ISA_BEST};
static const char *const isa_names[] = {"best", "scalar", "avx2", "avx512vnni"}; /* by enum cpu_isa */

/* A pool of pool_blocks blocks of block_rows rows (random, f32 or f16 as the test asks) and a
 * sequence whose rows are its table's blocks in order; contiguous: the same rows one after
 * another (the sequence's first n_table * block_rows rows). Elements are f32 or f16. */
struct paged_kv {
    void *k_pool, *v_pool, *k, *v;
    const int32_t *table;
    int n_table, block_rows, max_rows;
};

static void paged_kv_fill(struct paged_kv *kv, int pool_blocks, int block_rows, const int32_t *table, int n_table,
                          size_t kvd, bool f16)
{
    size_t el = f16 ? sizeof(uint16_t) : sizeof(float), pool = (size_t)pool_blocks * block_rows * kvd;
    float *tmp = malloc(sizeof(float) * pool);
    kv->k_pool = malloc(el * pool);
    kv->v_pool = malloc(el * pool);
    for (int which = 0; which < 2; which++) {
        void *dst = which ? kv->v_pool : kv->k_pool;
        for (size_t i = 0; i < pool; i++) tmp[i] = frand();
        if (f16)
            cpu_f16_from_f32(dst, tmp, pool);
        else
            memcpy(dst, tmp, sizeof(float) * pool);
    }
    free(tmp);
    kv->max_rows = n_table * block_rows;
    kv->k = malloc(el * (size_t)kv->max_rows * kvd);
    kv->v = malloc(el * (size_t)kv->max_rows * kvd);
    size_t block_bytes = el * (size_t)block_rows * kvd;
    for (int b = 0; b < n_table; b++) {
        memcpy((char *)kv->k + b * block_bytes, (char *)kv->k_pool + table[b] * block_bytes, block_bytes);
        memcpy((char *)kv->v + b * block_bytes, (char *)kv->v_pool + table[b] * block_bytes, block_bytes);
    }
    kv->table = table;
    kv->n_table = n_table;
    kv->block_rows = block_rows;
}

static void paged_kv_free(struct paged_kv *kv)
{
    free(kv->k_pool); free(kv->v_pool); free(kv->k); free(kv->v);
}

/* (n, pos) steps: prefill chunks that cross blocks and decode steps around a block's end */
struct step { int n, pos; };

/* The paged op against the contiguous one over every shape, ISA, thread count and step. */
static void check_paged_equals_contiguous(int pool_blocks, int block_rows, const int32_t *table, int n_table,
                                          const struct step *steps, int n_steps)
{
    int max_n = 0;
    for (int s = 0; s < n_steps; s++)
        max_n = steps[s].n > max_n ? steps[s].n : max_n;
    for (int threads = 1; threads <= 2; threads++) {
        struct backend be;
        cr_assert_eq(backend_cpu_init(&be, threads), 0);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            struct shape sh = shapes[si];
            size_t qd = (size_t)sh.n_head * sh.head_dim, kvd = (size_t)sh.n_head_kv * sh.head_dim;
            for (int f16 = 0; f16 <= 1; f16++) {
                struct paged_kv kv;
                paged_kv_fill(&kv, pool_blocks, block_rows, table, n_table, kvd, f16);
                float *q = malloc(sizeof(float) * max_n * qd), *att = malloc(sizeof(float) * sh.n_head * kv.max_rows);
                float *want = malloc(sizeof(float) * max_n * qd), *got = malloc(sizeof(float) * max_n * qd);
                for (size_t i = 0; i < max_n * qd; i++) q[i] = 3.0f * frand();
                for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++)
                    for (int s = 0; s < n_steps; s++) {
                        int n = steps[s].n, pos = steps[s].pos;
                        cr_assert_leq(pos + n, kv.max_rows);
                        memset(got, 0xff, sizeof(float) * n * qd); /* NaNs where nothing is written */
                        cpu_attention_isa(be.ctx, q, kv.k, kv.v, f16, want, att, n, pos, sh.n_head, sh.n_head_kv,
                                          sh.head_dim, isas[ii]);
                        cpu_attention_paged_isa(be.ctx, q, kv.k_pool, kv.v_pool, f16, table, block_rows, got, att, n,
                                                pos, sh.n_head, sh.n_head_kv, sh.head_dim, isas[ii]);
                        cr_assert(memcmp(want, got, sizeof(float) * n * qd) == 0,
                                  "%d-row blocks, head_dim %d, heads %d/%d, %s, isa %s, %d threads, n %d at pos %d: "
                                  "paged differs from contiguous",
                                  block_rows, sh.head_dim, sh.n_head, sh.n_head_kv, f16 ? "f16" : "f32",
                                  isa_names[isas[ii]], threads, n, pos);
                    }
                free(q); free(att); free(want); free(got);
                paged_kv_free(&kv);
            }
        }
        backend_cpu_free(&be);
    }
}

Test(cpu_attention_paged, blocks_of_16_rows_give_the_contiguous_bits)
{
    static const int32_t table[] = {7, 2, 9, 0, 11, 4, 10, 5}; /* 1, 3, 6 and 8 belong to no one here */
    static const struct step steps[] = {
        {37, 5}, {20, 70}, {9, 119}, {16, 16}, {128, 0}, /* prefill */
        {1, 0}, {1, 14}, {1, 15}, {1, 16}, {1, 17}, {1, 31}, {1, 32}, {1, 63}, {1, 64}, {1, 100}, {1, 127},
    };
    check_paged_equals_contiguous(12, 16, table, 8, steps, sizeof steps / sizeof steps[0]);
}

Test(cpu_attention_paged, blocks_of_64_rows_give_the_contiguous_bits)
{
    static const int32_t table[] = {4, 1, 5, 2}; /* 0 and 3 belong to no one here */
    static const struct step steps[] = {
        {30, 50}, {70, 100}, {5, 250}, {1, 15}, {1, 16}, {1, 63}, {1, 64}, {1, 65}, {1, 200}, {1, 255},
    };
    check_paged_equals_contiguous(6, 64, table, 4, steps, sizeof steps / sizeof steps[0]);
}

/* The table is what the op reads: two of its blocks swapped give other outputs (else the
 * tests above could pass with an op that ignored it), and the backend's slot is the op. */
Test(cpu_attention_paged, the_backend_slot_follows_the_block_table)
{
    enum { H = 8, HKV = 2, HD = 64, N = 37, POS = 5 };
    static const int32_t table[] = {7, 2, 9, 0, 11, 4, 10, 5}, swapped[] = {2, 7, 9, 0, 11, 4, 10, 5};
    size_t qd = (size_t)H * HD, kvd = (size_t)HKV * HD;
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    cr_assert_not_null(be.i->attention_paged);
    for (int f16 = 0; f16 <= 1; f16++) {
        struct paged_kv kv;
        paged_kv_fill(&kv, 12, 16, table, 8, kvd, f16);
        float *q = malloc(sizeof(float) * N * qd), *att = malloc(sizeof(float) * H * kv.max_rows);
        float *want = malloc(sizeof(float) * N * qd), *got = malloc(sizeof(float) * N * qd);
        for (size_t i = 0; i < N * qd; i++) q[i] = 3.0f * frand();
        if (f16)
            be.i->attention_f16(be.ctx, q, kv.k, kv.v, want, att, N, POS, H, HKV, HD);
        else
            be.i->attention(be.ctx, q, kv.k, kv.v, want, att, N, POS, H, HKV, HD);
        be.i->attention_paged(be.ctx, q, kv.k_pool, kv.v_pool, f16, table, 16, got, att, N, POS, H, HKV, HD);
        cr_assert(memcmp(want, got, sizeof(float) * N * qd) == 0, "%s: the slot differs from contiguous",
                  f16 ? "f16" : "f32");
        be.i->attention_paged(be.ctx, q, kv.k_pool, kv.v_pool, f16, swapped, 16, got, att, N, POS, H, HKV, HD);
        for (int t = 0; t < N; t++) /* every token sees rows of the swapped blocks */
            cr_assert(memcmp(want + t * qd, got + t * qd, sizeof(float) * qd) != 0,
                      "%s: token %d's output ignores a swap of the table's first two blocks", f16 ? "f16" : "f32", t);
        free(q); free(att); free(want); free(got);
        paged_kv_free(&kv);
    }
    backend_cpu_free(&be);
}
