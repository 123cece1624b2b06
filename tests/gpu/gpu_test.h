/* gpu_test.h - what the GPU test program's files share: the two backends under test, the
 * failure count, random inputs, device buffers and the PASS/FAIL line (test_cuda_ops.c). */
#ifndef TIDE_GPU_TEST_H
#define TIDE_GPU_TEST_H

#include "engine/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern struct backend cpu, gpu;
extern int n_fail;

uint64_t rnd64(void); /* the inputs' xorshift: one sequence for the whole program */
float *rand_vec(size_t n, float scale);
double now_s(void);
/* ||a - b|| / ||b||; NaN or Inf anywhere -> +inf */
double relerr(const float *a, const float *b, size_t n);
void *dev_put(const void *src, size_t bytes); /* src NULL: allocation only */
void dev_poison(void *d, size_t bytes);       /* NaN everywhere */
float *dev_get(const void *d, size_t n);      /* n floats back, malloc'ed */
void verdict(const char *name, bool ok, const char *fmt, double v);
/* Host tensor of type from f32 values (rows, cols), data malloc'ed; to_dev copies it over. */
struct tensor make_tensor(uint32_t type, int cols, int rows, const float *src);
struct tensor to_dev(const struct tensor *h);
void fill_repeat(uint8_t *buf, size_t total, const void *blk, size_t blen);
/* Paged KV cache fixtures (test_paged.c): a pool of nb blocks of br rows of kvd elements (es
 * bytes each), every byte 0xff (NaN in f32 and f16); perm[0..nb) a scrambled order of the
 * blocks; rows 0..rows-1 of the contiguous (rows, kvd) src into the pool through table tab; a
 * malloc'ed copy of x as a cache holds it (f16: rounded by the CPU backend's store_f16). */
uint8_t *nan_pool(int nb, int br, size_t kvd, size_t es);
void scramble(int32_t *perm, int nb);
void scatter_rows(uint8_t *pool, const void *src, const int32_t *tab, int br, int rows, size_t kvd, size_t es);
void *host_cache(const float *x, size_t n, bool f16);
/* A product benchmark's operands: nm copies (2..512, ~1 GiB) of a rows x cols weight of type,
 * each the same 64 random host rows repeated (they dequantise to finite values), so that a loop
 * rotating through the copies reads DRAM rather than L2 (time_product); x (n, cols) random and y
 * (n, rows) on the device; td the weight's header (its data set per copy by the timing loop). */
struct bench_product {
    uint8_t *buf;      /* (nm, mbytes) device */
    size_t mbytes;     /* one copy's bytes */
    int nm;
    float *x, *y;      /* device (n, cols), (n, rows) */
    struct tensor td;  /* rows x cols of type */
    float *wf, *xv;    /* host: the 64 rows' f32 values, x */
    void *rows64;      /* host: the 64 rows in type */
};
/* false when the device is out of memory (bench_product_free frees what was made) */
bool bench_product_make(struct bench_product *b, uint32_t type, int cols, int rows, int n);
void bench_product_free(struct bench_product *b);
/* bench_ops.c (--bench): copy bandwidth (d2d_gbs out), products, attention */
void bench_copy(double *d2d_gbs);
void bench_matmul(double d2d);
void bench_attention(double d2d);
void bench_attention_prefill(void);

/* test_small_ops.c: the small ops (small_ops.cu), the copies and zero vs the CPU */
void test_rmsnorm(void);
void test_rope(void);
void test_elementwise(void);   /* swiglu, axpy, zero */
void test_scatter(void);       /* scatter_axpy */
void test_axpy_sigmoid(void);
void test_get_row(void);       /* get_row and get_rows */
void test_gather_upload(void); /* gather_rows, upload_download, gather_copy_d2d */

void test_moe_ffn(void);
void test_route(void);
void test_moe_ffn_table(void);
void bench_decode(double d2d, int mode);
/* test_decode_opts.c: issue 21's decode switches on vs off vs the CPU (only: a name filter or NULL),
 * and their benchmark (bench_decode_ops / bench_decode_graph with each switch off and on) */
void test_decode_opts(const char *only);
void bench_decode_opts(double d2d);
void test_qk_norm_rope(void); /* test_fuse.c: the fused decode ops vs the separate ones */
void test_matmul_add(void);
void test_matmul3(void);
void test_step_at(void);      /* the position-from-device ops of a recorded decode step */
/* NE random experts of type T (down TD), E -> F -> E, in 256-aligned device slots (stride bytes
 * apart when larger), and their device table (gate, up, down a expert), as the expert cache
 * lays them out; shape: expert 0's views. mem NULL when out of device memory (test_rows.c). */
struct experts {
    uint8_t *mem;
    void *tab_d;
    struct expert_weights shape;
};
void experts_make_at(struct experts *x, uint32_t T, uint32_t TD, int E, int F, int NE, size_t stride);
void experts_make(struct experts *x, uint32_t T, uint32_t TD, int E, int F, int NE);
void test_rows(void);         /* test_rows.c: a decode step's rows in one op vs one row at a time */
void test_moe_rows_mma(void); /* test_rows.c: the same MoE on the tensor-core tiles (TIDE_MOE_ROWS_MMA) */
void bench_moe_rows(double d2d); /* test_rows.c: the MoE of n tokens on one layer, us and GB/s */
void test_norm_matmul(void);  /* the FFN rmsnorm + router product in one op */
void test_mmq(void);  /* test_mmq.c: the tensor-core q8_0/q4_0 matmul vs the dp4a one */
void bench_mmq(void);
/* seconds a call of y = W x of n tokens, W rotated through b's copies (test_mmq.c) */
double time_product(struct bench_product *b, int n);
/* test_kquant.c: q4_K / q5_K / q6_K products, get_rows and the fused MoE op vs the CPU */
void test_matmul_kq(void);
void test_get_rows_kq(void);
void test_moe_kq(void);
void bench_kquant(void);
/* test_kqmma.c: the k-quant int8 tensor-core products (mmq_kquant.cu, TIDE_KQ_MMA) vs the CPU,
 * and their timings against the widen + f16 GEMM path */
void test_matmul_kqmma(const char *only);
void bench_kqmma(void);
/* y = W x (add: y0 + W x) on the GPU from a device copy of th at byte offset off, against
 * kq_ref_product on x as the kernels see it: the rel err; *e_f32 the one against the CPU's product */
double kq_product(const struct tensor *th, const float *x, int n, bool add, size_t off, double *e_f32);
/* test_qblock.c: q5_0 / q5_1 / iq4_xs / MXFP4 products and get_rows vs the CPU (only: a filter) */
void test_qblock(const char *only);
/* test_f16_mma.c: the big-tile f16 / bf16 GEMM (TIDE_F16_MMA) vs the CPU and the wmma kernel
 * (only: a filter), and its timings against the wmma kernel */
void test_f16_mma(const char *only);
void bench_f16_mma(void);
/* test_oai.c: gpt-oss's ops (attention_sinks, rope_freqs, swiglu_oai) vs the CPU */
void test_oai(const char *only);
/* x (n, cols) as the CUDA k-quant products see it: int8 blocks at n <= 8, f16 beyond */
void kq_view_of_x(const float *x, float *out, int n, int cols);
/* the same, int8 blocks at any n when int8 is set (the k-quant tensor-core tiles, TIDE_KQ_MMA) */
void kq_view_as(const float *x, float *out, int n, int cols, bool int8);
/* y (+)= W xv: k-quant W decoded by be's get_row and dotted in double; other types be's matmul */
void kq_ref_product(struct backend be, const struct tensor *w, const float *xv, float *y, int n, bool add);
/* the fused MoE op's arithmetic for k-quant experts on backend be (x and h as the kernels see them) */
void kq_moe_ref(struct backend be, const struct expert_weights *eh, const float *w, int k, const float *x, float *y);
void bench_prefill(void);
/* test_moe_prefill.c: the grouped prefill MoE op vs the per-expert ops (moe_prefill: q8_0 / q4_0;
 * moe_prefill_kq: k-quants on the tensor-core tiles); only: a name filter or NULL */
void test_moe_prefill(const char *only);
/* an encoder's device allocations, counted (the daemon's allocator charges the ledger; at most 8
 * live blocks): dev_count_alloc / dev_count_free with ud a struct dev_count; pinned_alloc /
 * pinned_free: page-locked host memory (test_vision.c) */
struct dev_count {
    size_t live, peak;
    void *p[8];
    size_t n[8];
};
void *dev_count_alloc(void *ud, size_t bytes);
void dev_count_free(void *ud, void *p);
void *pinned_alloc(void *ud, size_t bytes);
void pinned_free(void *ud, void *p);
void test_vision_ops(void);    /* test_vision.c: the vision encoder on the GPU */
void test_vision_encode(void);
void bench_vision(void);
/* test_qwenvl.c: M-RoPE and the ViT's 2-D rope vs the CPU, the qwen3vlmoe / qwen2vl text with
 * M-RoPE ids end to end, the Qwen-VL towers' embeddings; bench_qwenvl (with bench) the
 * Qwen3-VL-30B-A3B-sized tower */
void test_qwenvl(const char *only, bool bench);
void test_sample(void); /* test_sample.c: backend_i.sample on the GPU vs its host form */
/* test_kv_f16.c: the f16 KV cache's ops on the GPU vs the CPU's */
void test_kv_f16_store(void);
void test_kv_f16_attention(void);
void test_kv_f16_rows(void);
/* test_paged.c: the paged KV cache's ops on the GPU vs the CPU's attention_paged and the GPU's
 * contiguous ops */
void test_paged_attention(void);
void test_paged_rows(void);
void test_sample_extras(void); /* test_sample_extras.c: its edits and logprobs vs the host sampler */
void test_batch(const char *only); /* only: a name filter or NULL */         /* test_batch.c: batched steps of several sequences vs the CPU */
void bench_batch(void);

#endif
