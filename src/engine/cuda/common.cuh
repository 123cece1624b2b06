/* common.cuh - what every CUDA source of the backend shares: the backend context, the
 * checked-call macro, the sticky error, the stream-ordered scratch buffer and small device
 * helpers (warp reductions, element dequantisation).
 *
 * The backend ops return void (struct backend_i), so a failed CUDA call cannot be handed
 * back to the caller directly: the first failure is kept in the context (call, file, line,
 * CUDA's message), logged once, and read back with backend_cuda_error(). */
#ifndef TIDE_CUDA_COMMON_CUH
#define TIDE_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stddef.h>

extern "C" {
#include "common.h"
#include "engine/backend.h"
}

#define QK 32 /* elements per q8_0 / q4_0 block, as in ggml */

struct cuda_ctx {
    int dev;                 /* CUDA ordinal */
    int sm_count;
    cudaStream_t st;         /* every op runs here, in order */
    cudaStream_t copy;       /* upload; ordered against st by the two events below */
    cudaEvent_t ev_st, ev_copy;
    void *scratch;           /* stream-ordered workspace: quantised x, attention partials */
    size_t scratch_n;
    void *sum;               /* a fused-add op's product before the add (stream-ordered too) */
    size_t sum_n;
    int err;                 /* first failure: 0 or TIDE_EINTERNAL / TIDE_ENOMEM */
    char errmsg[320];
    unsigned long n_errors;  /* failures seen (only the first is kept in errmsg) */
    unsigned long ws_gen;    /* bumped whenever scratch or sum is replaced (graphs go stale) */
    bool capturing;          /* between graph_begin and graph_end */
    void *smp_host;          /* sample.cu: pinned staging of the calls' edits, used as a ring */
    size_t smp_host_n, smp_host_at; /* its bytes, and where the next call's edits go */
    void *smp_dev;           /* a call's edits on the device, their old values and the rows' lse */
    size_t smp_n;
    cudaEvent_t ev_smp;      /* the staging's last upload (0: none yet) */
    int capture_rc;          /* why the recording under way cannot be used (0: it can) */
};

/* cudaSetDevice through a per-thread cache of the current device (backend_cuda.cu). */
cudaError_t cuda_use_device(int dev);

/* Records a failed call; returns false so callers can bail out. */
bool cuda_fail(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file, int line);

static inline bool cuda_ok(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file,
                           int line)
{
    return e == cudaSuccess ? true : cuda_fail(c, e, call, file, line);
}

/* Every CUDA runtime call goes through CU(); kernel launches are followed by CU_LAUNCH(). */
#define CU(c, call) cuda_ok((c), (call), #call, __FILE__, __LINE__)
#define CU_LAUNCH(c, what) cuda_ok((c), cudaGetLastError(), what, __FILE__, __LINE__)

/* The start of every op: false once the context holds an error (the op is skipped: the
 * first failure is the one kept) or when its device cannot be made current. */
static inline bool cuda_enter(struct cuda_ctx *c)
{
    return !c->err && CU(c, cuda_use_device(c->dev));
}

/* The CTAs for n elements in blocks of block threads, at least 1 and at most cap: the
 * grid-stride kernels that take it loop over what a smaller grid leaves. The default cap is
 * the 65535 most launches use; small_ops.cu's launches pass their own 65536. */
static inline unsigned cuda_grid(size_t n, int block, size_t cap = 65535)
{
    size_t g = (n + (size_t)block - 1) / (size_t)block;
    return (unsigned)(g < cap ? (g ? g : 1) : cap);
}

/* A workspace of at least bytes on the op stream. Reused by consecutive ops: they run in
 * stream order, so one op's use is over before the next op's kernels start. Growth frees
 * the old buffer stream-ordered too, so it never synchronises the host. NULL on failure. */
void *cuda_scratch(struct cuda_ctx *c, size_t bytes);
/* The same kind of workspace, apart from the scratch (which the product itself uses). */
void *cuda_sum_buf(struct cuda_ctx *c, size_t bytes);

/* ---- launchers implemented in matmul.cu / attention.cu ---- */
/* add: y += W x (backend_i.matmul_add), bit for bit the product, then axpy with a = 1 */
void cuda_matmul(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n, bool add = false);
/* kquant.cu: cuda_matmul for q4_K / q5_K / q6_K weights; false (nothing queued) for other
 * types and for rows its word loads cannot read (matmul.cu's element-wise kernel runs them) */
bool cuda_matmul_kq(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n, bool add);
/* backend_i.matmul3 (matmul.cu). With a norm it runs only where it fuses the rmsnorm in and
 * returns false otherwise, nothing queued (the caller then norms first). */
bool cuda_matmul3(struct cuda_ctx *c, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                  const struct tensor *norm, float eps, float *xn);
/* qblock.cu: cuda_matmul for q5_0 / q5_1 / iq4_xs / MXFP4 weights (kquant.cu's cuda_matmul_kq
 * hands them over); false (nothing queued) for other types or shapes */
bool cuda_matmul_qb(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, int n, bool add);
/* oai_ops.cu: gpt-oss's ops (backend_i.attention_sinks, rope_freqs, swiglu_oai) */
void cuda_attention_sinks(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos, int n_head,
                          int n_head_kv, int head_dim, const float *sinks, int window);
void cuda_rope_freqs(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs,
                     float mscale, enum rope_kind kind);
void cuda_swiglu_oai(void *ctx, float *gate, const float *up, int n, float alpha, float limit);
/* backend_i.norm_matmul (norm_matmul.cu): false, nothing queued, for shapes it does not take */
bool cuda_norm_matmul(struct cuda_ctx *c, const struct tensor *w, const float *x, float *y, const struct tensor *norm,
                      float eps, float *xn);
/* backend_i.argmax (argmax.cu): out[0] (device memory) = the greedy choice among x[0..n) */
void cuda_argmax(struct cuda_ctx *c, const float *x, int n, int32_t *out);
/* backend_i.sample (sample.cu): out[0..n) (device memory) = a draw from each row of logits after
 * its edits, lp[] (device memory) the logprobs of the rows that want them */
void cuda_sample(struct cuda_ctx *c, float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                 struct sample_logprob *lp);
/* backend_i.attention_at (attention.cu); f16: the caches hold f16 (attention_at_f16), slot_floats
 * then counts their elements */
void cuda_attention_at(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                       float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx,
                       int n_head, int n_head_kv, int head_dim);
/* n query tokens at positions pos..pos+n-1 (backend_i.attention, attention_f16 with f16); attention.cu */
void cuda_attention(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                    float *out, int n, int pos, int n_head, int n_head_kv, int head_dim);
/* graph.cu: backend_i.graph_begin / graph_end / graph_launch / graph_free (CUDA graphs) */
int cuda_graph_begin(void *ctx);
int cuda_graph_end(void *ctx, void **graph);
int cuda_graph_launch(void *ctx, void *graph);
void cuda_graph_free(void *ctx, void *graph);
/* mmq_mma.cu: y = W x on the int8 tensor cores from x quantised by quantize_q8_kernel<true>
 * (q8_0 or q4_0 W that cuda_mmq_ok takes); cuda_mmq_min_n() is the smallest n that cuda_matmul
 * sends there. False if the launch failed (recorded in c). */
bool cuda_mmq_mma(struct cuda_ctx *c, uint32_t type, const uint8_t *W, size_t row_bytes, int rows, int nb,
                  const int8_t *xq, const float *xd, int n, float *y, float *part);
int cuda_mmq_min_n(void);
/* whether the tensor-core kernel takes W (mma_tile.cuh's tile_shape_ok: nb % 4 == 0, rows
 * and W 8-byte aligned); the rest stays on the dp4a kernels */
bool cuda_mmq_ok(const void *W, size_t row_bytes, int nb);
/* bytes of part (split-K partial sums) that cuda_mmq_mma needs for this product; 0 = none */
size_t cuda_mmq_scratch(struct cuda_ctx *c, int rows, int nb, int n);
/* gemm_f16_mma.cu: y (+)= W x for f16 / bf16 W (ldw elements a row) on the big-tile mma.sync
 * kernel, when TIDE_F16_MMA=1 (cuda_set_f16_mma) and the shape qualifies (n >= 64, cols % 8 == 0,
 * W and its rows 16-byte aligned); false: not taken, nothing queued. Takes the sum buffer
 * (cuda_sum_buf) for x rounded to W's type and split-K partials: cuda_f16_mma_workspace bytes. */
bool cuda_f16_mma(struct cuda_ctx *c, uint32_t type, const void *W, size_t ldw, int rows, int cols,
                  const float *x, int n, float *y, bool add);
size_t cuda_f16_mma_workspace(struct cuda_ctx *c, uint32_t type, const void *W, size_t ldw, int rows, int cols,
                              int n);
/* attention_prefill.cu: the tiled kernel for a chunk, one launch. false: not launched (shape
 * it does not take; nothing queued, c->err untouched) so the caller runs it token by token. */
bool cuda_attention_prefill(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                            float *out, int n, int pos, int n_head, int n_head_kv, int head_dim);
/* moe.cu: backend_i.moe_ffn for q8_0 / q4_0 experts; TIDE_EUNSUPPORTED for anything else. */
int cuda_moe_ffn(struct cuda_ctx *c, const struct expert_weights *ex, const float *w, int k, const float *x,
                 float *y, bool add);
/* moe.cu: backend_i.moe_ffn_table and backend_i.route. */
int cuda_moe_ffn_table(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                       const int32_t *routed, int k, const float *x, float *y, bool add);
void cuda_route(struct cuda_ctx *c, const float *logits, int n, int n_expert, int k, bool norm, int32_t *out);
/* moe.cu: backend_i.moe_ffn_table_route (n tokens; n > 1: moe_rows.cu's grouped kernels) */
int cuda_moe_ffn_table_route(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                             const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                             const float *x, float *y, bool add);
int cuda_moe_ffn_table_rows(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                            const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                            const float *x, float *y, bool add);
/* attention_decode.cu: attention of one query token a row (rows rows; at, n_ctx, slot as
 * attention.cu's attention_one takes them) over a contiguous cache by the short-context split
 * kernels, when cuda_set_decode_opt turns them on and the shape fits (head_dim <= 128, a
 * multiple of 4, 16-byte aligned q and caches); false: nothing queued, the caller runs its own
 * kernels. backend_cuda.cu's attention entry points call it first. */
bool cuda_attention_split(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          float *out, int pos, int n_head, int n_head_kv, int head_dim, const int32_t *at, int n_ctx,
                          int rows, const int32_t *slot, size_t slot_elems);
/* matmul_decode.cu: y[m] (+)= w[m] x for m < nm (1 or 3; matmul3 with its norm when norm is
 * set) through quantise-once + the weight-streaming kernel, the bits of cuda_matmul /
 * cuda_matmul3; false: switched off or a shape it does not take, nothing queued. */
bool cuda_matmul_qonce(struct cuda_ctx *c, int nm, const struct tensor *const *w, const float *x, float *const *y,
                       int n, bool add, const struct tensor *norm, float eps, float *xn);
/* gemm_f32.cu: y(rows, n) = W x (add: +=) for f32 W with rows ldw floats apart, one launch */
void cuda_sgemm(struct cuda_ctx *c, const float *W, size_t ldw, int rows, int cols, const float *x, int n, float *y,
                bool add);
/* moe_prefill.cu: backend_i.moe_ffn_batch (q8_0 / q4_0; TIDE_EUNSUPPORTED for anything else) */
int cuda_moe_ffn_batch(struct cuda_ctx *c, const struct moe_batch *b, const float *x, float *y, bool add);
/* A decode step's MoE (moe_ffn_table_route of n > 1 tokens, routed already on the device) on
 * the grouped prefill tiles (moe_prefill.cu): TIDE_EUNSUPPORTED unless TIDE_MOE_ROWS_MMA=1 and
 * the shape is one moe_ffn_batch takes (x NULL: only that probe). */
int cuda_moe_rows_grouped(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                          const int32_t *routed, int n, int k, int n_expert, const float *x, float *y, bool add);

#include "engine/cuda/common_device.cuh" /* ---- device helpers ---- */

#endif
