/* attention.cu - causal attention of one query token over the KV cache, GQA, any length
 * (decode; a prefill chunk goes to attention_prefill.cu, see cuda_attention at the end).
 *
 * Split-K ("flash-decoding"): the n_keys = pos + 1 cached positions are cut into chunks, one
 * CTA per (kv head, chunk, group of up to 8 query heads), and a second kernel merges the
 * CTAs' unnormalised partial outputs by their maxima and sums. The chunk length adapts so
 * that a long context fills every SM while a short one runs as a single chunk that writes
 * the output directly (one launch).
 *
 * At short contexts the op is latency-bound, not bandwidth-bound (513 keys of Qwen3-30B are
 * 2 MB over 68 CTAs), so a CTA is built to make as few dependent global round trips as it
 * can: it walks its chunk in tiles of TK keys (32; 16 at head_dim 256), and each tile's K and
 * V rows (V does not depend on the scores) go into shared memory by cp.async in one batch,
 * the query rows with the first tile. Two tile buffers: the next tile is in flight while the
 * current one is computed, so a chunk of one or two tiles costs one round trip. Then, from
 * shared memory only:
 *   - scores: one thread per (key, head), lanes on consecutive keys, each a whole dot of its
 *     K row with its head's q (no cross-lane reduction for the dot);
 *   - online softmax per head: the tile's max and sum over the lanes of that head's keys
 *     (shuffles within a warp segment), the running max / sum kept in registers, the factor
 *     that rescales the previous tiles' accumulators handed to the P V threads;
 *   - P V: one thread per head dim for all 8 heads at once (each V element read once), the
 *     tile's keys split between the threads that share a dim when head_dim <= 128, their
 *     sums added once at the end.
 *
 * Shared memory: 70 KB a CTA at head_dim 128, 73 KB at 256 (opted into above 48 KB), so
 * three CTAs an SM on the H200; 256 threads of at most 80 registers.
 *
 * An f16 cache (attention_f16, attention_at_f16): the same kernels with T = __half; a tile's
 * rows are read with plain loads (8 bytes, 4 elements, a load) and widened into the same f32
 * tiles, so everything after the copy is the f32 form's. cp.async copies bytes and cannot
 * widen, so the next tile's loads go to registers before the current tile is computed and are
 * widened into its buffer after it: the same one round trip in flight as the f32 form. (f16
 * tiles in shared memory would halve its traffic too - not done yet.)
 *
 * A paged cache (attention_paged, attention_at_paged): the same kernels with PAGED set, each key
 * row's address found through the sequence's block table (attention.cuh) as a tile is loaded; the
 * chunks, tiles and sums are the contiguous op's, so the results are its bits over the same rows.
 * A 32-key tile may span two 16-row blocks: rows are addressed one by one, never as a run.
 *
 * Memory per call: only the partials, n_head * n_chunks * (head_dim + 2) floats, from the
 * backend's stream-ordered scratch. The (n_head, n_ctx) att buffer of the interface is not
 * needed here and is left untouched. */
#include "engine/cuda/attention.cuh"
#include "engine/cuda/mma_q.cuh" /* cp.async helpers */

extern "C" {
#include "engine/backend_cuda.h" /* cuda_set_attn_mma */
}

#include <math.h>

#include "engine/cuda/attention_chunk.cuh"

/* at NULL: the query at position pos. at set (attention_at): rows queries, row r at at[r], below
 * n_ctx, read when the kernels run, over slot slot[r]'s caches; pos is then unused but for the
 * shape check. */
static void attention_one(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          float *out, int pos, int n_head, int n_head_kv, int head_dim, const int32_t *at = NULL,
                          int n_ctx = 0, int rows = 1, const int32_t *slot = NULL, size_t slot_floats = 0,
                          kv_pages pg = kv_pages{})
{
    if (c->err)
        return;
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 || head_dim > 256 || pos < 0) {
        cuda_fail(c, cudaErrorInvalidValue, "attention (shape: need n_head % n_head_kv == 0, head_dim <= 256)",
                  __FILE__, __LINE__);
        return;
    }
    int n_keys = pos + 1, group = n_head / n_head_kv;
    int zgroups = (group + ATT_G - 1) / ATT_G;
    int hdb = head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
    size_t smem = (size_t)att_smem_floats(head_dim, att_tile(hdb)) * sizeof(float);
    int want, chunk, n_chunks;
    att_plan(c->sm_count, n_head_kv, zgroups, rows, at != NULL, n_ctx, n_keys, &want, &chunk, &n_chunks);
    float *part_o = NULL, *part_ml = NULL;
    if (n_chunks > 1 || at) {
        size_t po = (size_t)rows * n_head * n_chunks * head_dim;
        float *ws = (float *)cuda_scratch(c, (po + (size_t)rows * n_head * n_chunks * 2) * sizeof(float));
        if (!ws)
            return;
        part_o = ws;            /* (rows, n_head, n_chunks, head_dim) */
        part_ml = ws + po;      /* (rows, n_head, n_chunks, 2) */
    }
    /* (an f16 cache's rows are 8-byte aligned wherever the f32 rows would be 16-byte aligned) */
    bool vec = head_dim % 4 == 0 && (((uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15) == 0;
    float scale = 1.0f / sqrtf((float)head_dim);
    dim3 grid((unsigned)n_head_kv, (unsigned)n_chunks, (unsigned)(zgroups * rows));
#define ATT_LAUNCH_P(D, T, P)                                                                            \
    do {                                                                                                 \
        if (smem > 48 * 1024 &&                                                                          \
            !CU(c, cudaFuncSetAttribute(attn_chunk_kernel<D, T, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                        (int)smem)))                                                     \
            return;                                                                                      \
        attn_chunk_kernel<D, T, P><<<grid, ATT_THREADS, smem, c->st>>>(                                  \
            q, (const T *)k_cache, (const T *)v_cache, out, part_o, part_ml, n_keys, n_head_kv, group, head_dim, \
            chunk, n_chunks, scale, at, want, vec, zgroups, slot, slot_floats, pg);                      \
    } while (0)
#define ATT_LAUNCH_T(D, T)                \
    do {                                  \
        if (pg.tables)                    \
            ATT_LAUNCH_P(D, T, true);     \
        else                              \
            ATT_LAUNCH_P(D, T, false);    \
    } while (0)
#define ATT_LAUNCH(D)                     \
    do {                                  \
        if (f16)                          \
            ATT_LAUNCH_T(D, __half);      \
        else                              \
            ATT_LAUNCH_T(D, float);       \
    } while (0)
    switch (hdb) {
    case 32: ATT_LAUNCH(32); break;
    case 64: ATT_LAUNCH(64); break;
    case 128: ATT_LAUNCH(128); break;
    default: ATT_LAUNCH(256); break;
    }
#undef ATT_LAUNCH
#undef ATT_LAUNCH_T
#undef ATT_LAUNCH_P
    if (!CU_LAUNCH(c, "attn_chunk_kernel") || (n_chunks == 1 && !at))
        return;
    if (head_dim % 4 == 0) /* part_o rows then start 16-byte aligned (the scratch is) */
        attn_merge_kernel<4><<<n_head * rows, MERGE_THREADS, 0, c->st>>>(part_o, part_ml, out, head_dim, n_chunks, at,
                                                                        want, n_head);
    else
        attn_merge_kernel<1><<<n_head * rows, MERGE_THREADS, 0, c->st>>>(part_o, part_ml, out, head_dim, n_chunks, at,
                                                                        want, n_head);
    CU_LAUNCH(c, "attn_merge_kernel");
}

void cuda_attention_at(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                       float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx,
                       int n_head, int n_head_kv, int head_dim)
{
    cuda_attention_at_pg(c, q, k_cache, v_cache, f16, out, n, at, slot, slot_floats, n_ctx, n_head, n_head_kv, head_dim,
                         kv_pages{});
}

void cuda_attention_at_pg(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx,
                          int n_head, int n_head_kv, int head_dim, kv_pages pg)
{
    if (!c->err && n_ctx > 0 && n > 0)
        attention_one(c, q, k_cache, v_cache, f16, out, n_ctx - 1, n_head, n_head_kv, head_dim, at, n_ctx, n, slot,
                      slot_floats, pg);
}

/* A chunk of n tokens: the tiled kernel (attention_prefill.cu, one launch) or the split-K
 * decode kernel once per token, whichever a cost model from the H200's timings says is faster
 * (bench_attention, bench_attention_prefill): the tiled kernel takes ~7 us a 32-key tile on a
 * CTA, ~2 CTAs an SM at once, and its CTAs split only the queries, so a short chunk deep in a
 * long context leaves most SMs idle while a few CTAs walk every key; the decode kernel spreads
 * the keys over the SMs at ~8.2 us + ~1.8 ns a key per token (the tiled decode kernel above:
 * 15.4 us at 4096 keys, 65.7 at 32768, 32 query / 4 kv heads of 128; it was 8 us + 4 ns). */
void cuda_attention(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                    float *out, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    cuda_attention_pg(c, q, k_cache, v_cache, f16, out, n, pos, n_head, n_head_kv, head_dim, kv_pages{});
}

void cuda_attention_pg(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                       float *out, int n, int pos, int n_head, int n_head_kv, int head_dim, kv_pages pg)
{
    if (c->err || n <= 0)
        return;
    if (n > 1 && n_head_kv > 0 && n_head >= n_head_kv) {
        double ctas = (double)n_head_kv * ceil((double)n * (n_head / n_head_kv) / 64.0);
        double waves = ctas / (2.0 * (c->sm_count > 0 ? c->sm_count : 1));
        /* the f16 tensor-core form (attention_prefill.cu, head_dim 64 / 128): ~6.5 us a 64-key
         * tile (512 queries at pos 3584: 0.375 ms; at 31744: 3.52 ms) */
        bool tc = (head_dim == 64 || head_dim == 128) && cuda_set_attn_mma(-1);
        double t_tiled = (waves < 1.0 ? 1.0 : waves) * (tc ? ceil((pos + n) / 64.0) * 6.5 : ceil((pos + n) / 32.0) * 7.0);
        double t_token = n * (8.2 + 0.00176 * (pos + n / 2.0));
        if (t_tiled <= t_token &&
            cuda_attention_prefill_pg(c, q, k_cache, v_cache, f16, out, n, pos, n_head, n_head_kv, head_dim, pg))
            return;
    }
    size_t qd = (size_t)n_head * head_dim;
    for (int t = 0; t < n && !c->err; t++)
        attention_one(c, q + t * qd, k_cache, v_cache, f16, out + t * qd, pos + t, n_head, n_head_kv, head_dim, NULL, 0,
                      1, NULL, 0, pg);
}

int cuda_block_shift(struct cuda_ctx *c, int block_rows)
{
    int shift = 4;
    while (shift < 30 && (1 << shift) < block_rows)
        shift++;
    if (block_rows < 16 || (1 << shift) != block_rows) {
        cuda_fail(c, cudaErrorInvalidValue, "paged attention (block_rows must be a power of two >= 16)", __FILE__,
                  __LINE__);
        return -1;
    }
    return shift;
}

/* The paged forms: the same launches as attention / attention_at with each key row found through
 * a block table (kv_pages), so they cut the keys and the chunk the same way and agree with the
 * contiguous ops over the same rows up to nothing (the same kernels and summation order). */
void cu_attention_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                        const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                        int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)att;
    if (!cuda_enter(c) || n <= 0)
        return;
    int shift = cuda_block_shift(c, block_rows);
    if (shift > 0)
        cuda_attention_pg(c, q, k_pool, v_pool, f16, out, n, pos, n_head, n_head_kv, head_dim, kv_pages{blocks, 0, shift});
}

void cu_attention_at_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16, float *out,
                           int n, const int32_t *at, const int32_t *slot, const int32_t *tables, int table_stride,
                           int block_rows, int n_ctx, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return;
    int shift = cuda_block_shift(c, block_rows);
    if (shift > 0)
        cuda_attention_at_pg(c, q, k_pool, v_pool, f16, out, n, at, slot, 0, n_ctx, n_head, n_head_kv, head_dim,
                             kv_pages{tables, table_stride, shift});
}
