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
void cuda_attention_sinks(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                          float *att, int n, int pos, int n_head, int n_head_kv, int head_dim, const float *sinks,
                          int window);
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

/* ---- device helpers ---- */
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* acc + the dot of four int8x4 words w with the 16 int8 of x (dp4a, in w's order): the int8
 * block dots of mmq.cuh, kquant.cuh and qblock.cu are built from it, so they add in one order. */
__device__ __forceinline__ int dp4a_dot4(const int *w, int4 x, int acc)
{
    acc = __dp4a(w[0], x.x, acc);
    acc = __dp4a(w[1], x.y, acc);
    acc = __dp4a(w[2], x.z, acc);
    return __dp4a(w[3], x.w, acc);
}

/* The dot of eight int8x4 words w with a 32-value int8 block held as two int4, a then c. */
__device__ __forceinline__ int dp4a_dot8(const int *w, int4 a, int4 c)
{
    return dp4a_dot4(w + 4, c, dp4a_dot4(w, a, 0));
}

/* The sum of a 32-value int8 block held as a then c (dp4a against all-ones words). Written
 * out with one scalar word: dp4a_dot4 over an array of ones gives the same instructions but
 * another register numbering, and so another ptxas schedule. */
__device__ __forceinline__ int dp4a_sum32(int4 a, int4 c)
{
    const int ones = 0x01010101;
    int sx = __dp4a(ones, a.x, 0);
    sx = __dp4a(ones, a.y, sx);
    sx = __dp4a(ones, a.z, sx);
    sx = __dp4a(ones, a.w, sx);
    sx = __dp4a(ones, c.x, sx);
    sx = __dp4a(ones, c.y, sx);
    sx = __dp4a(ones, c.z, sx);
    return __dp4a(ones, c.w, sx);
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* The KV cache's elements, f32 or f16 (backend_i's f16 cache ops): stored from f32 (f16 rounded
 * to nearest even, the CPU's cpu_f16_round), read as f32 (exact). kv_load4: 4 elements from p,
 * 16-byte (f32) or 8-byte (f16) aligned. */
__device__ __forceinline__ float kv_load(const float *p) { return __ldg(p); }
__device__ __forceinline__ float kv_load(const __half *p)
{
    return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}
__device__ __forceinline__ float4 kv_load4(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ float4 kv_load4(const __half *p)
{
    uint2 u = __ldg((const uint2 *)p);
    float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void kv_store(float *p, float x) { *p = x; }
__device__ __forceinline__ void kv_store(__half *p, float x) { *p = __float2half_rn(x); }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Element i of a k-quant row (256-value super-blocks; layouts in kquant.cuh / gguf.c). */
__device__ __forceinline__ float kq_elem(uint32_t type, const uint8_t *row, int i)
{
    int j = (i & 255) >> 5, l = i & 31; /* sub-block of 32 and the value in it */
    if (type == 14) { /* Q6_K: 210 bytes */
        const uint8_t *b = row + (size_t)(i >> 8) * 210;
        int hh = j >> 2, sub = j & 3;
        uint8_t lo = b[64 * hh + 32 * (sub & 1) + l], hi = b[128 + 32 * hh + l];
        int q = (((sub & 2) ? lo >> 4 : lo & 15) | (((hi >> (2 * sub)) & 3) << 4)) - 32;
        float d = f16_bits_to_f32((uint16_t)(b[208] | (b[209] << 8)));
        return d * (float)(int8_t)b[192 + 8 * hh + 2 * sub + (l >> 4)] * (float)q;
    }
    /* Q4_K (144 bytes) / Q5_K (176): f16 d, f16 dmin, 12 scale bytes, [32 fifth-bit bytes], nibbles */
    const uint8_t *b = row + (size_t)(i >> 8) * (type == 12 ? 144 : 176), *s = b + 4;
    int sc, mn;
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    uint8_t qb = b[(type == 12 ? 16 : 48) + 32 * (j >> 1) + l];
    int q = (j & 1) ? qb >> 4 : qb & 15;
    if (type == 13)
        q |= ((b[16 + l] >> j) & 1) << 4;
    float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8))), dmin = f16_bits_to_f32((uint16_t)(b[2] | (b[3] << 8)));
    return d * (float)sc * (float)q - dmin * (float)mn;
}

/* gguf.c's fixed tables of the 4-bit non-linear types (quants.c: iq4nl_values, and MXFP4's
 * e2m1 codes doubled, so that they are integers) */
static __constant__ int8_t qb_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
static __constant__ int8_t qb_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4's e8m0 exponent as the scale of the doubled table: 2^(e - 128) (quants.c mxfp4_scale) */
__device__ __forceinline__ float qb_mxfp4_scale(uint8_t e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* Element i of a q5_0 (6), q5_1 (7), iq4_xs (23) or MXFP4 (39) row (layouts: quants.c). */
__device__ __forceinline__ float qb_elem(uint32_t type, const uint8_t *row, int i)
{
    int j = i & 31, lo = j & 15, hi = j >> 4;
    if (type == 23) { /* iq4_xs: 136-byte super-blocks of 8 sub-blocks */
        const uint8_t *b = row + (size_t)(i >> 8) * 136;
        int sb = (i & 255) >> 5, sh = b[2] | (b[3] << 8);
        int ls = (((b[4 + sb / 2] >> (4 * (sb % 2))) & 15) | (((sh >> (2 * sb)) & 3) << 4)) - 32;
        uint8_t q = b[8 + 16 * sb + lo];
        float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        return d * (float)ls * (float)qb_iq4nl[hi ? q >> 4 : q & 15];
    }
    if (type == 39) { /* MXFP4: 17 bytes */
        const uint8_t *b = row + (size_t)(i >> 5) * 17;
        uint8_t q = b[1 + lo];
        return (float)qb_mxfp4[hi ? q >> 4 : q & 15] * qb_mxfp4_scale(b[0]);
    }
    bool q51 = type == 7; /* q5_0: 22 bytes f16 d, u32 qh, nibbles; q5_1: 24, f16 d, f16 m first */
    const uint8_t *b = row + (size_t)(i >> 5) * (q51 ? 24 : 22), *p = b + (q51 ? 4 : 2);
    uint32_t qh = p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
    uint8_t qb = p[4 + lo];
    int q = (hi ? qb >> 4 : qb & 15) | (int)(((qh >> j) & 1) << 4);
    float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
    return q51 ? (float)q * d + f16_bits_to_f32((uint16_t)(b[2] | (b[3] << 8))) : (float)(q - 16) * d;
}

/* Element i of a row of any supported type (slow path: norms, embeddings, fallbacks). */
__device__ __forceinline__ float row_elem(uint32_t type, const uint8_t *row, int i)
{
    switch (type) {
    case 0: /* F32 */
        return ((const float *)row)[i];
    case 1: /* F16 */
        return f16_bits_to_f32(((const uint16_t *)row)[i]);
    case 30: /* BF16 */
        return bf16_bits_to_f32(((const uint16_t *)row)[i]);
    case 8: { /* Q8_0: 34-byte blocks, f16 scale then 32 int8 */
        const uint8_t *b = row + (size_t)(i / QK) * 34;
        uint16_t d = (uint16_t)(b[0] | (b[1] << 8));
        return f16_bits_to_f32(d) * (float)(int8_t)b[2 + i % QK];
    }
    case 2: { /* Q4_0: 18-byte blocks, f16 scale, low nibbles = 0..15, high = 16..31 */
        const uint8_t *b = row + (size_t)(i / QK) * 18;
        uint16_t d = (uint16_t)(b[0] | (b[1] << 8));
        int j = i % QK;
        uint8_t q = b[2 + (j & 15)];
        int v = j < 16 ? (q & 15) : (q >> 4);
        return f16_bits_to_f32(d) * (float)(v - 8);
    }
    case 12: case 13: case 14: /* Q4_K, Q5_K, Q6_K */
        return kq_elem(type, row, i);
    case 6: case 7: case 23: case 39: /* q5_0, q5_1, iq4_xs, MXFP4 */
        return qb_elem(type, row, i);
    default:
        return 0.0f;
    }
}

/* The block size rmsnorm runs a vector of dim with: the reduction order, and so the bits,
 * depend on it, and the kernels that norm on the way (qk_norm_rope_kernel,
 * mmvq_fused3_kernel) must reduce as rmsnorm_kernel does. */
static inline int norm_block(int dim) { return dim <= 32 ? 32 : dim <= 128 ? 128 : 256; }

/* The CTA's total of each thread's ss, in one fixed order (warp sums, then warp 0 over those):
 * every kernel that norms reduces through here, so their scales agree to the bit. Every
 * thread calls it; red is 32 shared floats, free again after the call returns. */
__device__ __forceinline__ float block_sum(float ss, float *red)
{
    ss = warp_sum(ss);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0)
        red[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0)
            red[0] = t;
    }
    __syncthreads();
    float total = red[0];
    __syncthreads(); /* everyone has read red[0] before red is written again */
    return total;
}

/* rms_scale over values the threads already hold: v[k] is element k * stride + threadIdx.x
 * (stride = blockDim.x), none past cols; the same f32 per-thread sum and block_sum. */
template <int N>
__device__ __forceinline__ float rms_scale_held(const float (&v)[N], int cols, int stride, float eps, float *red)
{
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < N; k++)
        if (k * stride + (int)threadIdx.x < cols)
            ss = fmaf(v[k], v[k], ss);
    return 1.0f / sqrtf(block_sum(ss, red) / (float)cols + eps);
}

/* 1 / sqrt(mean(v^2) + eps) as rmsnorm_kernel computes it: f32 sum of squares per thread
 * (stride blockDim), reduced across the CTA through red (32 shared floats). Every thread of
 * the CTA calls it; a second call needs a __syncthreads() first (red is reused). */
__device__ __forceinline__ float rms_scale(const float *v, int dim, float eps, float *red)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss = fmaf(v[i], v[i], ss);
    return 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
}

/* Element e of a vector quantised to q8 blocks of 32 (one warp holds a block: lane = e % 32):
 * the scale from the block's largest magnitude, as quantize_q8_kernel does. */
__device__ __forceinline__ void quantize_q8_elem(float v, int e, int8_t *xq, float *xd)
{
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    xq[e] = (int8_t)__float2int_rn(v * id);
    if ((threadIdx.x & 31) == 0)
        xd[e / QK] = __half2float(__float2half_rn(d));
}

#endif
