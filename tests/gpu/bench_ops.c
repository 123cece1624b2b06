/* bench_ops.c - test-gpu's op benchmarks (--bench): the copy bandwidth probe, the decode and
 * prefill products, and the attention kernels at decode and prefill sizes, each against the
 * bytes it has to move. */
#include "engine/backend.h"
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA
#include <cuda_runtime_api.h>

/* buf[0..total) = host block repeated: one upload, then doubling device-to-device copies */
void fill_repeat(uint8_t *buf, size_t total, const void *blk, size_t blen)
{
    gpu.i->upload(gpu.ctx, buf, blk, blen < total ? blen : total);
    gpu.i->sync(gpu.ctx);
    for (size_t off = blen; off < total; off *= 2)
        cudaMemcpy(buf + off, buf, total - off < off ? total - off : off, cudaMemcpyDeviceToDevice);
}

bool bench_product_make(struct bench_product *b, uint32_t type, int cols, int rows, int n)
{
    memset(b, 0, sizeof *b);
    b->mbytes = ggml_row_size(type, cols) * rows;
    b->nm = (int)((1ull << 30) / b->mbytes);
    b->nm = b->nm < 2 ? 2 : b->nm > 512 ? 512 : b->nm;
    b->buf = gpu.i->alloc(gpu.ctx, b->mbytes * b->nm);
    b->x = dev_put(NULL, (size_t)n * cols * 4);
    b->y = dev_put(NULL, (size_t)n * rows * 4);
    if (!b->buf || !b->x || !b->y)
        return false;
    b->wf = rand_vec((size_t)cols * 64, 0.05f);
    struct tensor th = make_tensor(type, cols, 64, b->wf);
    b->rows64 = (void *)th.data;
    fill_repeat(b->buf, b->mbytes * b->nm, th.data, th.row_bytes * 64);
    b->xv = rand_vec((size_t)n * cols, 1.0f);
    gpu.i->upload(gpu.ctx, b->x, b->xv, (size_t)n * cols * 4);
    b->td = th;
    b->td.ne[1] = rows;
    return true;
}

void bench_product_free(struct bench_product *b)
{
    if (b->buf) gpu.i->free(gpu.ctx, b->buf);
    if (b->x) gpu.i->free(gpu.ctx, b->x);
    if (b->y) gpu.i->free(gpu.ctx, b->y);
    free(b->wf);
    free(b->xv);
    free(b->rows64);
    memset(b, 0, sizeof *b);
}

void bench_copy(double *d2d_gbs)
{
    size_t bytes = 2ull << 30;
    void *a = NULL, *b = NULL;
    cudaMalloc(&a, bytes);
    cudaMalloc(&b, bytes);
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    int it = 10;
    for (int i = 0; i < it; i++)
        cudaMemcpy(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    *d2d_gbs = 2.0 * bytes * it / (ms * 1e-3) / 1e9;
    /* pinned host -> device, the expert refill path */
    void *h = cuda_host_alloc(1ull << 30);
    double h2d = 0;
    if (h) {
        memset(h, 1, 1ull << 30);
        cudaMemcpy(a, h, 1ull << 30, cudaMemcpyHostToDevice);
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 4; i++)
            cudaMemcpy(a, h, 1ull << 30, cudaMemcpyHostToDevice);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        h2d = 4.0 * (1ull << 30) / (ms * 1e-3) / 1e9;
        cuda_host_free(h);
    }
    cudaFree(a);
    cudaFree(b);
    int ok = cudaGetLastError() == cudaSuccess;
    printf("  copy: device-to-device %.0f GB/s (read + write, 2 GiB x %d); pinned host-to-device %.1f GB/s\n",
           *d2d_gbs, it, h2d);
    verdict("bench_copy", ok, "d2d %.0f GB/s", *d2d_gbs);
}

/* n = 1 matmul over a set of matrices larger than L2, host-timed between syncs. */
void bench_matmul(double d2d)
{
    uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32};
    static const int shapes[][3] = {{4096, 4096, 1}, {2048, 768, 1}, {768, 2048, 1}, {2048, 151936, 1},
                                    {2048, 4096, 8}, {2048, 4096, 64}, {4096, 4096, 512}};
    bool ok = true;
    printf("  matmul (cols x rows, n tokens): time per call, weight GB/s, %% of d2d %.0f GB/s, TFLOP/s\n", d2d);
    for (int t = 0; t < 5; t++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int cols = shapes[s][0], rows = shapes[s][1], n = shapes[s][2];
            struct bench_product bp; /* ~1 GiB of weights, rotated: no L2 reuse */
            if (!bench_product_make(&bp, types[t], cols, rows, n)) { bench_product_free(&bp); ok = false; continue; }
            int iters = n >= 64 ? 50 : 400;
            for (int i = 0; i < bp.nm; i++) {
                bp.td.data = bp.buf + (size_t)i * bp.mbytes;
                gpu.i->matmul(gpu.ctx, &bp.td, bp.x, bp.y, n);
            }
            gpu.i->sync(gpu.ctx);
            double t0 = now_s();
            for (int i = 0; i < iters; i++) {
                bp.td.data = bp.buf + (size_t)(i % bp.nm) * bp.mbytes;
                gpu.i->matmul(gpu.ctx, &bp.td, bp.x, bp.y, n);
            }
            gpu.i->sync(gpu.ctx);
            double dt = (now_s() - t0) / iters;
            double gbs = bp.mbytes / dt / 1e9, tf = 2.0 * cols * rows * n / dt / 1e12;
            printf("  %-5s %5d x %6d n %3d: %8.2f us  %7.0f GB/s  %5.1f%%  %6.1f TFLOP/s\n", ggml_type_name(types[t]),
                   cols, rows, n, dt * 1e6, gbs, 100.0 * gbs / d2d, tf);
            bench_product_free(&bp);
        }
    verdict("bench_matmul", ok, "%g types", 5.0);
}

void bench_attention(double d2d)
{
    static const int cfg[][4] = {{32, 4, 128, 511}, {32, 4, 128, 4095}, {32, 4, 128, 32767}, {32, 8, 128, 131071}};
    printf("  attention decode (n_head, n_kv, hd, keys): time, KV GB/s\n");
    for (int c = 0; c < 4; c++) {
        int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], pos = cfg[c][3];
        size_t kvb = (size_t)(pos + 1) * nkv * hd * 4;
        float *q = dev_put(NULL, (size_t)nh * hd * 4), *o = dev_put(NULL, (size_t)nh * hd * 4);
        float *k = dev_put(NULL, kvb), *v = dev_put(NULL, kvb);
        gpu.i->zero(gpu.ctx, q, nh * hd);
        gpu.i->zero(gpu.ctx, k, (int)(kvb / 4));
        gpu.i->zero(gpu.ctx, v, (int)(kvb / 4));
        /* the f32 cache, then the same keys as an f16 cache (attention_f16: half the bytes; its
         * tiles are filled by plain widening loads, not cp.async) */
        for (int f16 = 0; f16 < 2 && (!f16 || gpu.i->attention_f16); f16++) {
            size_t b = f16 ? kvb / 2 : kvb;
            for (int i = 0; i < 3; i++)
                if (f16)
                    gpu.i->attention_f16(gpu.ctx, q, (uint16_t *)k, (uint16_t *)v, o, NULL, 1, pos, nh, nkv, hd);
                else
                    gpu.i->attention(gpu.ctx, q, k, v, o, NULL, 1, pos, nh, nkv, hd);
            gpu.i->sync(gpu.ctx);
            int it = 200;
            double t0 = now_s();
            for (int i = 0; i < it; i++)
                if (f16)
                    gpu.i->attention_f16(gpu.ctx, q, (uint16_t *)k, (uint16_t *)v, o, NULL, 1, pos, nh, nkv, hd);
                else
                    gpu.i->attention(gpu.ctx, q, k, v, o, NULL, 1, pos, nh, nkv, hd);
            gpu.i->sync(gpu.ctx);
            double dt = (now_s() - t0) / it;
            printf("  %3d %2d %3d %7d %s: %8.2f us  %6.0f GB/s (%.0f%% of d2d)\n", nh, nkv, hd, pos + 1,
                   f16 ? "f16" : "f32", dt * 1e6, 2.0 * b / dt / 1e9, 100.0 * 2.0 * b / dt / 1e9 / d2d);
        }
        gpu.i->free(gpu.ctx, q); gpu.i->free(gpu.ctx, o); gpu.i->free(gpu.ctx, k); gpu.i->free(gpu.ctx, v);
    }
    verdict("bench_attention", true, "%g configs", 4.0);
}

/* A 512-token chunk of Qwen3-30B-A3B attention (32 q / 4 kv heads of 128) at positions
 * pos..pos+511: one call (the tiled kernel) against the decode kernel once per token. */
void bench_attention_prefill(void)
{
    /* pos, n: full chunks, then tails of a prompt (the op picks its kernel by itself) */
    static const int cfg[][2] = {{0, 512}, {3584, 512}, {31744, 512}, {512, 88}, {6000, 20}, {30000, 2}};
    int nh = 32, nkv = 4, hd = 128;
    printf("  attention prefill chunk (32/4 heads of 128): one call vs a decode call per token\n");
    bool ok = true;
    for (int c = 0; c < 6; c++) {
        int pos = cfg[c][0], n = cfg[c][1];
        size_t kvb = (size_t)(pos + n) * nkv * hd * 4, qb = (size_t)n * nh * hd * 4;
        float *q = dev_put(NULL, qb), *o = dev_put(NULL, qb), *k = dev_put(NULL, kvb), *v = dev_put(NULL, kvb);
        float *qh = rand_vec(qb / 4, 1.0f), *kh = rand_vec(kvb / 4, 1.0f);
        gpu.i->upload(gpu.ctx, q, qh, qb);
        gpu.i->upload(gpu.ctx, k, kh, kvb);
        gpu.i->upload(gpu.ctx, v, kh, kvb);
        double t[2];
        for (int way = 0; way < 2; way++) {
            int it = 5;
            for (int i = 0; i <= it; i++) {
                if (i == 1) { gpu.i->sync(gpu.ctx); t[way] = now_s(); }
                if (way == 0)
                    gpu.i->attention(gpu.ctx, q, k, v, o, NULL, n, pos, nh, nkv, hd);
                else
                    for (int j = 0; j < n; j++)
                        gpu.i->attention(gpu.ctx, q + (size_t)j * nh * hd, k, v, o + (size_t)j * nh * hd, NULL, 1,
                                         pos + j, nh, nkv, hd);
            }
            gpu.i->sync(gpu.ctx);
            t[way] = (now_s() - t[way]) / it;
        }
        double flop = 4.0 * nh * hd * ((double)n * pos + (double)n * (n + 1) / 2);
        printf("  pos %6d n %3d: chunk %8.3f ms (%5.1f TFLOP/s), per token %8.3f ms\n", pos, n, t[0] * 1e3,
               flop / t[0] / 1e12, t[1] * 1e3);
        ok = ok && !backend_cuda_error(&gpu, NULL, 0);
        gpu.i->free(gpu.ctx, q); gpu.i->free(gpu.ctx, o); gpu.i->free(gpu.ctx, k); gpu.i->free(gpu.ctx, v);
        free(qh); free(kh);
    }
    verdict("bench_attention_prefill", ok, "%g shapes", 6.0);
}

#endif
