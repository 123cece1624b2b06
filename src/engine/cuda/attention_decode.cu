/* attention_decode.cu - attention of one query token a row over a short KV cache with enough
 * CTAs to fill the GPU (issue 21; on unless TIDE_DECODE_ATTN_SPLIT=0).
 *
 * attention.cu's split-K kernel cuts the keys into chunks of at least 32 (its tile) on CTAs of
 * 256 threads, so at 513 keys of Qwen3-30B (4 kv heads) it runs 68 CTAs on 132 SMs, each doing
 * one tile: the step is a chain of latencies, and half the SMs wait. Here a CTA is 128 threads
 * and a tile 16 keys, and chunks are as short as 16 keys, aiming at AD_PER_SM CTAs an SM: at 513
 * keys 33 chunks a kv head, 132 CTAs; at 2000 keys 125 chunks, 500 CTAs. A longer context gets
 * longer chunks (never more than `want` of them), so the same kernel takes any length.
 *
 * A CTA: (kv head, chunk, group of up to 8 query heads). Its tiles' K and V rows go through
 * registers (16-byte f32 or 8-byte f16 loads, widened to f32 on the way into shared memory):
 * the next tile's loads are issued before the current tile is computed, so a chunk of one or
 * two tiles costs one round trip, for f32 and f16 caches alike. Then, from shared memory:
 *   - scores: one thread per (key, head), 16 keys x 8 heads = the 128 threads, each a whole
 *     dot of its K row with its head's q;
 *   - online softmax per head over 16 lanes (half a warp), running max / sum in registers;
 *   - P V: one thread per head dim for all 8 heads (keys split between threads when hd < 128).
 * The partials (unnormalised output, max, sum) of every chunk are merged by attn_split_merge,
 * one CTA a (row, head), by the same log-sum-exp rule as attention.cu's merge: exact up to
 * float summation order (the chunks differ from attention.cu's, so the bits do too).
 *
 * Shared memory at head_dim 128: 4.2 KB of q rows, 8.4 + 8.2 KB of K and V tile, 0.6 KB of
 * probabilities: ~22 KB, so registers, not shared memory, bound CTAs an SM.
 *
 * attention_at (the recordable step): the query's position is read on the device, the grid
 * is sized for `want` chunks (the most any length cuts into) and CTAs past the row's chunk
 * count return at once; the merge reads the same cut. */
#include "engine/cuda/common.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/attention_decode.cuh"

/* ---- the switches of issue 21 (read once from the environment; tests flip them) ---- */

static int decode_opt[CUDA_DECODE_OPTS] = {-1, -1, -1};

extern "C" int cuda_set_decode_opt(int which, int on)
{
    static const char *const env[CUDA_DECODE_OPTS] = {"TIDE_DECODE_ATTN_SPLIT", "TIDE_DECODE_QONCE",
                                                      "TIDE_MOE_ROUTE_ONCE"};
    if (which < 0 || which >= CUDA_DECODE_OPTS)
        return 0;
    /* TIDE_DECODE_QONCE has two forms (1, 2: matmul_decode.cu); the others are on or off */
    int top = which == CUDA_DECODE_QONCE ? 2 : 1;
    if (decode_opt[which] < 0) {
        const char *e = getenv(env[which]);
        /* on (1) unless set to 0: each passed test-gpu on an H100 and made the decode step faster */
        int v = e && e[0] >= '0' && e[0] <= '9' && !e[1] ? e[0] - '0' : 1;
        decode_opt[which] = v <= top ? v : 1;
    }
    int old = decode_opt[which];
    if (on >= 0)
        decode_opt[which] = on <= top ? on : top;
    return old;
}

bool cuda_attention_split(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          float *out, int pos, int n_head, int n_head_kv, int head_dim, const int32_t *at, int n_ctx,
                          int rows, const int32_t *slot, size_t slot_elems)
{
    if (!cuda_set_decode_opt(CUDA_DECODE_ATTN_SPLIT, -1) || c->err)
        return false;
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 || head_dim > 128 || head_dim % 4 ||
        pos < 0 || rows <= 0 || (((uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache | (uintptr_t)out) & 15))
        return false;
    int group = n_head / n_head_kv, zgroups = (group + AD_G - 1) / AD_G;
    int per = n_head_kv * zgroups * rows;
    int want = (AD_PER_SM * (c->sm_count > 0 ? c->sm_count : 1) + per - 1) / per;
    int n_keys = at ? n_ctx : pos + 1, chunk, n_chunks;
    ad_split(n_keys, want, &chunk, &n_chunks);
    /* attention_at: any position below n_ctx cuts into at most `want` chunks */
    int pstride = at ? want : n_chunks;
    float *part_o = NULL, *part_ml = NULL;
    if (pstride > 1) {
        size_t po = (size_t)rows * n_head * pstride * head_dim;
        float *ws = (float *)cuda_scratch(c, (po + (size_t)rows * n_head * pstride * 2) * sizeof(float));
        if (!ws)
            return true; /* the error (or the failed recording) is kept in c */
        part_o = ws;       /* (rows, n_head, pstride, head_dim) */
        part_ml = ws + po; /* (rows, n_head, pstride, 2) */
    }
    int hdb = head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : 128;
    size_t smem = (size_t)ad_smem_floats(head_dim) * sizeof(float); /* < 48 KB at head_dim <= 128 */
    float scale = 1.0f / sqrtf((float)head_dim);
    dim3 grid((unsigned)n_head_kv, (unsigned)pstride, (unsigned)(zgroups * rows));
#define AD_LAUNCH_T(D, T)                                                                                         \
    attn_split_kernel<D, T><<<grid, AD_THREADS, smem, c->st>>>(q, (const T *)k_cache, (const T *)v_cache, out,     \
                                                               part_o, part_ml, pos + 1, n_head_kv, group,         \
                                                               head_dim, want, zgroups, scale, at, slot, slot_elems)
#define AD_LAUNCH(D)                  \
    do {                              \
        if (f16)                      \
            AD_LAUNCH_T(D, __half);   \
        else                          \
            AD_LAUNCH_T(D, float);    \
    } while (0)
    switch (hdb) {
    case 32: AD_LAUNCH(32); break;
    case 64: AD_LAUNCH(64); break;
    default: AD_LAUNCH(128); break;
    }
#undef AD_LAUNCH
#undef AD_LAUNCH_T
    if (!CU_LAUNCH(c, "attn_split_kernel") || pstride == 1)
        return true;
    attn_split_merge<<<n_head * rows, AD_MERGE, 0, c->st>>>(part_o, part_ml, out, head_dim, pos + 1, want, pstride,
                                                            at, n_head);
    CU_LAUNCH(c, "attn_split_merge");
    return true;
}
