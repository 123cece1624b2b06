/* backend_cuda.cu - the CUDA backend table: context, streams, error keeping, the small ops
 * (rmsnorm, rope, qk_norm_rope, swiglu, axpy, scatter_axpy, get_row(s), gather_rows, zero) and the copies.
 * matmul.cu, moe.cu, attention.cu (decode), attention_prefill.cu and norm_matmul.cu hold the big
 * kernels; graph.cu the recording of decode steps.
 *
 * Semantics follow backend_cpu.c op for op. Where the CPU computes in double (rope angles)
 * so does this, so that positions in the tens of thousands rotate identically. */
#include "engine/cuda/common.cuh"
#include "engine/cuda/vision_ops.cuh"
#include "engine/cuda/mrope.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "engine/backend_cuda.h"
}

/* ---- errors and scratch ---- */

bool cuda_fail(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file, int line)
{
    c->n_errors++;
    if (!c->err) {
        c->err = e == cudaErrorMemoryAllocation ? TIDE_ENOMEM : TIDE_EINTERNAL;
        snprintf(c->errmsg, sizeof c->errmsg, "%s failed at %s:%d: %s (%s)", call, file, line,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        tide_log("cuda: device %d: %s", c->dev, c->errmsg);
    }
    (void)cudaGetLastError(); /* clear a non-sticky error so the next check is about its own call */
    return false;
}

void *cuda_scratch(struct cuda_ctx *c, size_t bytes)
{
    if (bytes <= c->scratch_n)
        return c->scratch;
    if (c->capturing) { /* see cu_graph_begin */
        c->capture_rc = TIDE_ENOMEM;
        return NULL;
    }
    size_t want = bytes + bytes / 4;
    if (c->scratch && !CU(c, cudaFreeAsync(c->scratch, c->st)))
        return NULL;
    c->scratch = NULL;
    c->scratch_n = 0;
    if (!CU(c, cudaMallocAsync(&c->scratch, want, c->st)))
        return NULL;
    c->scratch_n = want;
    c->ws_gen++;
    return c->scratch;
}

void *cuda_sum_buf(struct cuda_ctx *c, size_t bytes)
{
    if (bytes <= c->sum_n)
        return c->sum;
    if (c->capturing) {
        c->capture_rc = TIDE_ENOMEM;
        return NULL;
    }
    size_t want = bytes + bytes / 4;
    if (c->sum && !CU(c, cudaFreeAsync(c->sum, c->st)))
        return NULL;
    c->sum = NULL;
    c->sum_n = 0;
    if (!CU(c, cudaMallocAsync(&c->sum, want, c->st)))
        return NULL;
    c->sum_n = want;
    c->ws_gen++;
    return c->sum;
}

/* The current device is per thread and several backends (GPUs) may share the engine
 * thread, so every entry point makes its device current; the thread-local cache skips the
 * runtime call in the common case (a decode step issues thousands of ops, and cudaSetDevice
 * costs about a microsecond each). Everything in these files sets devices through here. */
static __thread int cur_dev = -1;

cudaError_t cuda_use_device(int dev)
{
    if (dev == cur_dev)
        return cudaSuccess;
    cudaError_t e = cudaSetDevice(dev);
    cur_dev = e == cudaSuccess ? dev : -1;
    return e;
}

static inline bool enter(struct cuda_ctx *c)
{
    return !c->err && CU(c, cuda_use_device(c->dev));
}

/* ---- kernels ---- */

/* One CTA per vector (block size norm_block(dim)). */
__global__ void rmsnorm_kernel(const float *__restrict__ x, uint32_t wtype, const uint8_t *__restrict__ w,
                               float *out, int dim, float eps)
{
    __shared__ float red[32];
    const float *v = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float s = rms_scale(v, dim, eps, red);
    /* in place is fine: each element is read and written by the same thread, after the sum */
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = v[i] * s * row_elem(wtype, w, i);
}

/* Rotate pair i of one head v at position p (angles in double, as the CPU). */
__device__ __forceinline__ void rope_pair(float *v, int i, int head_dim, int p, float theta, int neox)
{
    int half = head_dim / 2;
    double freq = pow((double)theta, -2.0 * i / head_dim);
    double a = p * freq;
    float cs = (float)cos(a), sn = (float)sin(a);
    int i0 = neox ? i : 2 * i;
    int i1 = neox ? i + half : 2 * i + 1;
    float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * cs - x1 * sn;
    v[i1] = x0 * sn + x1 * cs;
}

/* grid.y = token t of the chunk, at position pos + t; vec (n, n_heads*head_dim) */
__global__ void rope_kernel(float *vec, int n_heads, int head_dim, int pos, float theta, int neox)
{
    int half = head_dim / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= half * n_heads)
        return;
    int t = blockIdx.y;
    int i = idx % half, h = idx / half;
    rope_pair(vec + ((size_t)t * n_heads + h) * head_dim, i, head_dim, pos + t, theta, neox);
}

/* One head: normed as rmsnorm_kernel norms it (same reduction, same products) into shared
 * memory, rotated by rope_pair there, written to out (may be v). smem: head_dim floats. */
/* out: float, or __half (an f16 KV cache's row: rounded as it is stored) */
template <typename T>
__device__ __forceinline__ void head_norm_rope(const float *v, T *out, uint32_t wtype, const uint8_t *w,
                                               int head_dim, int pos, float theta, int neox, float eps)
{
    extern __shared__ float hv[]; /* (head_dim) */
    __shared__ float red[32];
    if (w) { /* block-uniform */
        float s = rms_scale(v, head_dim, eps, red);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            hv[i] = v[i] * s * row_elem(wtype, w, i);
    } else {
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            hv[i] = v[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x)
        rope_pair(hv, i, head_dim, pos, theta, neox);
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
        kv_store(out + i, hv[i]);
}

/* backend_i.qk_norm_rope: grid (n_head + n_head_kv, n), one head of one token a CTA, block
 * norm_block(head_dim). The head is normed as rmsnorm_kernel norms it (same reduction, same
 * products) into shared memory, then rotated by rope_pair from there and written back: the
 * bits of rmsnorm + rope, in one launch instead of four. Without a norm weight the head is
 * only rotated. smem: head_dim floats. */
__global__ void qk_norm_rope_kernel(float *q, float *k, uint32_t qtype, const uint8_t *__restrict__ qw,
                                    uint32_t ktype, const uint8_t *__restrict__ kw, int n_head, int n_head_kv,
                                    int head_dim, int pos, float theta, int neox, float eps)
{
    int h = blockIdx.x, t = blockIdx.y;
    bool isq = h < n_head;
    float *v = isq ? q + ((size_t)t * n_head + h) * head_dim : k + ((size_t)t * n_head_kv + (h - n_head)) * head_dim;
    head_norm_rope(v, v, isq ? qtype : ktype, isq ? qw : kw, head_dim, pos + t, theta, neox, eps);
}

/* backend_i.qk_norm_rope_at: grid (n_head + n_head_kv, rows); row r's position from at[r] and
 * its caches slot[r] * slot_floats on (slot NULL: slot 0). A k head's CTA reads the new row
 * from k_new, writes it rotated to the cache row and copies the v head from v_new beside it.
 * T: the cache's elements (qk_norm_rope_at_f16: __half, rounded as stored; slot_floats counts
 * them). */
template <typename T>
__global__ void qk_norm_rope_at_kernel(float *q, const float *k_new, const float *v_new, T *kc, T *vc,
                                       const int32_t *slot, size_t slot_floats, uint32_t qtype,
                                       const uint8_t *__restrict__ qw, uint32_t ktype, const uint8_t *__restrict__ kw,
                                       int n_head, int n_head_kv, int head_dim, const int32_t *at, float theta,
                                       int neox, float eps)
{
    int h = blockIdx.x, r = blockIdx.y, pos = at[r];
    size_t kvd = (size_t)n_head_kv * head_dim;
    if (h < n_head) {
        float *v = q + ((size_t)r * n_head + h) * head_dim;
        head_norm_rope(v, v, qtype, qw, head_dim, pos, theta, neox, eps);
        return;
    }
    size_t o = (size_t)(h - n_head) * head_dim, so = slot ? (size_t)slot[r] * slot_floats : 0;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
        kv_store(vc + so + (size_t)pos * kvd + o + i, v_new[(size_t)r * kvd + o + i]);
    head_norm_rope(k_new + (size_t)r * kvd + o, kc + so + (size_t)pos * kvd + o, ktype, kw, head_dim, pos, theta, neox,
                   eps);
}

__global__ void swiglu_kernel(float *gate, const float *__restrict__ up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void axpy_kernel(float *y, const float *__restrict__ x, float a, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

/* backend_i.axpy_sigmoid: one CTA a row, its gate read once; axpy_kernel's expression. */
__global__ void axpy_sigmoid_kernel(float *y, const float *__restrict__ x, const float *__restrict__ g, int dim)
{
    float *yr = y + (size_t)blockIdx.x * dim;
    const float *xr = x + (size_t)blockIdx.x * dim;
    float a = 1.0f / (1.0f + expf(-g[blockIdx.x]));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] += a * xr[i];
}

/* Row indices and weights travel in the launch parameters, like gather's; one CTA per row
 * (rows distinct, so no two CTAs touch the same y row). Same expression as axpy_kernel, so
 * each row gets the bits a per-row axpy would give. */
#define SCATTER_MAX 128
struct scatter_args { int row[SCATTER_MAX]; float w[SCATTER_MAX]; };

__global__ void scatter_axpy_kernel(float *y, const float *__restrict__ x, scatter_args a, int dim)
{
    float *yr = y + (size_t)a.row[blockIdx.x] * dim;
    const float *xr = x + (size_t)blockIdx.x * dim;
    float w = a.w[blockIdx.x];
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] += w * xr[i];
}

__global__ void get_row_kernel(uint32_t type, const uint8_t *__restrict__ row, float *__restrict__ out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = row_elem(type, row, i);
}

__global__ void get_row_at_kernel(uint32_t type, const uint8_t *__restrict__ data, size_t row_bytes,
                                  const int32_t *at, float *__restrict__ out, int n)
{
    const uint8_t *row = data + (size_t)*at * row_bytes;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = row_elem(type, row, i);
}

/* Row indices travel in the launch parameters (no host-to-device copy, no sync). */
#define GATHER_MAX 128
struct gather_ids { int id[GATHER_MAX]; };

/* out row b = table row ids.id[b] (grid: one CTA a row) */
__global__ void get_rows_kernel(uint32_t type, const uint8_t *__restrict__ data, size_t row_bytes, gather_ids ids,
                                float *__restrict__ out, int n)
{
    const uint8_t *row = data + (size_t)ids.id[blockIdx.x] * row_bytes;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[(size_t)blockIdx.x * n + i] = row_elem(type, row, i);
}

__global__ void gather_kernel(float *__restrict__ dst, const float *__restrict__ src, gather_ids ids, int dim)
{
    const float *s = src + (size_t)ids.id[blockIdx.x] * dim;
    float *d = dst + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        d[i] = s[i];
}

static unsigned grid_for(size_t n, int block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 65536 ? (g ? g : 1) : 65536);
}

/* ---- the table ---- */

static void *cu_alloc(void *ctx, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    void *p = NULL;
    if (!CU(c, cuda_use_device(c->dev)))
        return NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        /* running out of device memory is an answer, not a broken backend: log, keep going */
        tide_log("cuda: device %d: cudaMalloc(%zu) failed: %s", c->dev, bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_free(void *ctx, void *ptr)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!ptr)
        return;
    cuda_use_device(c->dev);
    CU(c, cudaFree(ptr)); /* implicitly waits for work that may still read ptr */
}

static void cu_matmul(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_matmul(c, w, x, y, n);
}

static void cu_rmsnorm(void *ctx, const float *x, const struct tensor *w, float *out, int dim, int n, float eps);

static void cu_matmul3(void *ctx, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                       const struct tensor *norm, float eps, float *xn)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || cuda_matmul3(c, w, x, y, n, norm, eps, xn))
        return;
    cu_rmsnorm(ctx, x, norm, xn, (int)w[0]->ne[0], n, eps); /* the norm did not fuse: first, alone */
    cuda_matmul3(c, w, xn, y, n, NULL, 0.0f, NULL);
}

static void cu_matmul_add(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_matmul(c, w, x, y, n, true);
}

static int cu_moe_ffn(void *ctx, const struct expert_weights *ex, const float *w, int k, const float *x,
                      float *y, float *hb, float *hb2, float *tmp, bool add)
{
    (void)hb, (void)hb2, (void)tmp;
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c))
        return c->err;
    return cuda_moe_ffn(c, ex, w, k, x, y, add);
}

static int cu_moe_ffn_table(void *ctx, const struct expert_weights *shape, const void *const *table,
                            const int32_t *routed, int k, const float *x, float *y, bool add)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c))
        return c->err;
    return cuda_moe_ffn_table(c, shape, table, routed, k, x, y, add);
}

static int cu_moe_ffn_table_route(void *ctx, const struct expert_weights *shape, const void *const *table,
                                  const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                                  const float *x, float *y, bool add)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c))
        return c->err;
    return cuda_moe_ffn_table_route(c, shape, table, logits, n, n_expert, norm, routed, k, x, y, add);
}

static int cu_moe_ffn_batch(void *ctx, const struct moe_batch *b, const float *x, float *y, bool add)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (x && !enter(c))
        return c->err;
    return cuda_moe_ffn_batch(c, b, x, y, add);
}

static void cu_route(void *ctx, const float *logits, int n, int n_expert, int k, bool norm, int32_t *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_route(c, logits, n, n_expert, k, norm, out);
}

static void cu_rmsnorm(void *ctx, const float *x, const struct tensor *w, float *out, int dim, int n, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0 || dim <= 0)
        return;
    int block = norm_block(dim);
    rmsnorm_kernel<<<n, block, 0, c->st>>>(x, w->type, (const uint8_t *)w->data, out, dim, eps);
    CU_LAUNCH(c, "rmsnorm_kernel");
}

static void cu_rope(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, float theta,
                    enum rope_kind kind)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int work = n_heads * (head_dim / 2);
    if (!enter(c) || work <= 0 || n <= 0)
        return;
    if (n > 65535) {
        cuda_fail(c, cudaErrorInvalidValue, "rope (over 65535 tokens in one call)", __FILE__, __LINE__);
        return;
    }
    dim3 grid((unsigned)((work + 127) / 128), (unsigned)n);
    rope_kernel<<<grid, 128, 0, c->st>>>(vec, n_heads, head_dim, pos, theta, kind == ROPE_NEOX);
    CU_LAUNCH(c, "rope_kernel");
}

static void cu_qk_norm_rope(void *ctx, float *q, float *k, const struct tensor *q_norm, const struct tensor *k_norm,
                            int n, int n_head, int n_head_kv, int head_dim, int pos, float theta, enum rope_kind kind,
                            float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0 || head_dim <= 0 || n_head + n_head_kv <= 0)
        return;
    if (n > 65535) {
        cuda_fail(c, cudaErrorInvalidValue, "qk_norm_rope (over 65535 tokens in one call)", __FILE__, __LINE__);
        return;
    }
    dim3 grid((unsigned)(n_head + n_head_kv), (unsigned)n);
    size_t sm = sizeof(float) * (size_t)head_dim;
    qk_norm_rope_kernel<<<grid, norm_block(head_dim), sm, c->st>>>(
        q, k, q_norm ? q_norm->type : 0, q_norm ? (const uint8_t *)q_norm->data : NULL, k_norm ? k_norm->type : 0,
        k_norm ? (const uint8_t *)k_norm->data : NULL, n_head, n_head_kv, head_dim, pos, theta, kind == ROPE_NEOX,
        eps);
    CU_LAUNCH(c, "qk_norm_rope_kernel");
}

template <typename T>
static void qk_norm_rope_at_t(void *ctx, float *q, const float *k_new, const float *v_new, T *k_cache, T *v_cache,
                              int n, const int32_t *at, const int32_t *slot, size_t slot_floats,
                              const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                              int head_dim, float theta, enum rope_kind kind, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || head_dim <= 0 || n_head <= 0 || n_head_kv <= 0 || n <= 0)
        return;
    if (n > 65535) {
        cuda_fail(c, cudaErrorInvalidValue, "qk_norm_rope_at (over 65535 rows in one call)", __FILE__, __LINE__);
        return;
    }
    dim3 grid((unsigned)(n_head + n_head_kv), (unsigned)n);
    qk_norm_rope_at_kernel<T><<<grid, norm_block(head_dim), sizeof(float) * (size_t)head_dim, c->st>>>(
        q, k_new, v_new, k_cache, v_cache, slot, slot_floats, q_norm ? q_norm->type : 0,
        q_norm ? (const uint8_t *)q_norm->data : NULL, k_norm ? k_norm->type : 0,
        k_norm ? (const uint8_t *)k_norm->data : NULL, n_head, n_head_kv, head_dim, at, theta, kind == ROPE_NEOX, eps);
    CU_LAUNCH(c, "qk_norm_rope_at_kernel");
}

static void cu_qk_norm_rope_at(void *ctx, float *q, const float *k_new, const float *v_new, float *k_cache,
                               float *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_floats,
                               const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                               int head_dim, float theta, enum rope_kind kind, float eps)
{
    qk_norm_rope_at_t(ctx, q, k_new, v_new, k_cache, v_cache, n, at, slot, slot_floats, q_norm, k_norm, n_head,
                      n_head_kv, head_dim, theta, kind, eps);
}

static void cu_qk_norm_rope_at_f16(void *ctx, float *q, const float *k_new, const float *v_new, uint16_t *k_cache,
                                   uint16_t *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_elems,
                                   const struct tensor *q_norm, const struct tensor *k_norm, int n_head,
                                   int n_head_kv, int head_dim, float theta, enum rope_kind kind, float eps)
{
    qk_norm_rope_at_t(ctx, q, k_new, v_new, (__half *)k_cache, (__half *)v_cache, n, at, slot, slot_elems, q_norm,
                      k_norm, n_head, n_head_kv, head_dim, theta, kind, eps);
}

static void cu_attention_at(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out, int n,
                            const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx, int n_head,
                            int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_attention_at(c, q, k_cache, v_cache, false, out, n, at, slot, slot_floats, n_ctx, n_head, n_head_kv,
                          head_dim);
}

static void cu_attention_at_f16(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_elems,
                                int n_ctx, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_attention_at(c, q, k_cache, v_cache, true, out, n, at, slot, slot_elems, n_ctx, n_head, n_head_kv,
                          head_dim);
}

/* backend_i.store_f16: a step's new K/V rows into an f16 cache */
__global__ void store_f16_kernel(__half *dst, const float *__restrict__ src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

static void cu_store_f16(void *ctx, uint16_t *dst, const float *src, size_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || !n)
        return;
    store_f16_kernel<<<grid_for(n, 256), 256, 0, c->st>>>((__half *)dst, src, n);
    CU_LAUNCH(c, "store_f16_kernel");
}

static void cu_get_row_at(void *ctx, const struct tensor *t, const int32_t *at, float *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int n = (int)t->ne[0];
    if (!enter(c) || n <= 0)
        return;
    get_row_at_kernel<<<grid_for((size_t)n, 256), 256, 0, c->st>>>(t->type, (const uint8_t *)t->data, t->row_bytes,
                                                                  at, out, n);
    CU_LAUNCH(c, "get_row_at_kernel");
}

static int cu_norm_matmul(void *ctx, const struct tensor *w, const float *x, float *y, const struct tensor *norm,
                          float eps, float *xn)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c))
        return c->err;
    if (!cuda_norm_matmul(c, w, x, y, norm, eps, xn))
        return TIDE_EUNSUPPORTED;
    return c->err;
}

static void cu_argmax(void *ctx, const float *x, int n, int32_t *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_argmax(c, x, n, out);
}

static void cu_sample(void *ctx, float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                      struct sample_logprob *lp)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c))
        cuda_sample(c, logits, n, n_vocab, rows, out, lp);
}

static void cu_attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                         float *att, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)att;
    if (enter(c) && n > 0)
        cuda_attention(c, q, k_cache, v_cache, false, out, n, pos, n_head, n_head_kv, head_dim);
}

static void cu_attention_f16(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache, float *out,
                             float *att, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)att;
    if (enter(c) && n > 0)
        cuda_attention(c, q, k_cache, v_cache, true, out, n, pos, n_head, n_head_kv, head_dim);
}

static void cu_swiglu(void *ctx, float *gate, const float *up, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0)
        return;
    swiglu_kernel<<<grid_for((size_t)n, 256), 256, 0, c->st>>>(gate, up, (size_t)n);
    CU_LAUNCH(c, "swiglu_kernel");
}

static void cu_axpy(void *ctx, float *y, const float *x, float a, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0)
        return;
    axpy_kernel<<<grid_for((size_t)n, 256), 256, 0, c->st>>>(y, x, a, (size_t)n);
    CU_LAUNCH(c, "axpy_kernel");
}

static void cu_axpy_sigmoid(void *ctx, float *y, const float *x, const float *g, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0 || dim <= 0)
        return;
    axpy_sigmoid_kernel<<<n, 256, 0, c->st>>>(y, x, g, dim);
    CU_LAUNCH(c, "axpy_sigmoid_kernel");
}

static void cu_scatter_axpy(void *ctx, float *y, const float *x, const int *rows, const float *w, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0 || dim <= 0)
        return;
    int block = dim < 256 ? ((dim + 31) & ~31) : 256;
    for (int i0 = 0; i0 < n; i0 += SCATTER_MAX) {
        int k = n - i0 < SCATTER_MAX ? n - i0 : SCATTER_MAX;
        scatter_args a;
        memcpy(a.row, rows + i0, sizeof(int) * (size_t)k);
        memcpy(a.w, w + i0, sizeof(float) * (size_t)k);
        scatter_axpy_kernel<<<k, block, 0, c->st>>>(y, x + (size_t)i0 * dim, a, dim);
        if (!CU_LAUNCH(c, "scatter_axpy_kernel"))
            return;
    }
}

static void cu_get_row(void *ctx, const struct tensor *t, int id, float *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int n = (int)t->ne[0];
    if (!enter(c) || n <= 0)
        return;
    const uint8_t *row = (const uint8_t *)t->data + (size_t)id * t->row_bytes;
    get_row_kernel<<<grid_for((size_t)n, 256), 256, 0, c->st>>>(t->type, row, out, n);
    CU_LAUNCH(c, "get_row_kernel");
}

/* upload: on the copy stream, after everything already queued on the op stream (which may
 * still read dst), and before anything queued after it. */
static void cu_upload(void *ctx, void *dst, const void *src_host, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || !bytes)
        return;
    if (CU(c, cudaEventRecord(c->ev_st, c->st)) && CU(c, cudaStreamWaitEvent(c->copy, c->ev_st, 0)) &&
        CU(c, cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->copy)) &&
        CU(c, cudaEventRecord(c->ev_copy, c->copy)))
        CU(c, cudaStreamWaitEvent(c->st, c->ev_copy, 0));
}

static void cu_download(void *ctx, void *dst_host, const void *src, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || !bytes)
        return;
    if (CU(c, cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->st)))
        CU(c, cudaStreamSynchronize(c->st));
}

/* On the compute stream: ordered after the steps that wrote src, before the next that reads dst. */
static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || !bytes)
        return;
    CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st));
}

static void cu_get_rows(void *ctx, const struct tensor *t, const int *ids, int n, float *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int dim = (int)t->ne[0];
    for (int i0 = 0; i0 < n && enter(c) && dim > 0; i0 += GATHER_MAX) {
        int k = n - i0 < GATHER_MAX ? n - i0 : GATHER_MAX;
        gather_ids gi;
        memcpy(gi.id, ids + i0, sizeof(int) * (size_t)k);
        get_rows_kernel<<<k, 256, 0, c->st>>>(t->type, (const uint8_t *)t->data, t->row_bytes, gi,
                                             out + (size_t)i0 * dim, dim);
        if (!CU_LAUNCH(c, "get_rows_kernel"))
            return;
    }
}

static void cu_gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!enter(c) || n <= 0 || dim <= 0)
        return;
    int block = dim < 256 ? ((dim + 31) & ~31) : 256;
    for (int i0 = 0; i0 < n; i0 += GATHER_MAX) {
        int k = n - i0 < GATHER_MAX ? n - i0 : GATHER_MAX;
        gather_ids ids;
        memcpy(ids.id, rows + i0, sizeof(int) * (size_t)k);
        gather_kernel<<<k, block, 0, c->st>>>(dst + (size_t)i0 * dim, src, ids, dim);
        if (!CU_LAUNCH(c, "gather_kernel"))
            return;
    }
}

static void cu_zero(void *ctx, float *x, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c) && n > 0)
        CU(c, cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, c->st));
}

static void cu_sync(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (enter(c) && CU(c, cudaStreamSynchronize(c->copy)))
        CU(c, cudaStreamSynchronize(c->st));
}

static void *cu_host_alloc(void *ctx, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    void *p = NULL;
    if (cuda_use_device(c->dev) != cudaSuccess || cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* an answer (callers fall back to malloc), not a broken backend */
        return NULL;
    }
    return p;
}

static void cu_host_free(void *ctx, void *p)
{
    (void)ctx;
    if (p)
        cudaFreeHost(p);
}

static const struct backend_i cuda_iface = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .matmul = cu_matmul,
    .matmul_add = cu_matmul_add,
    .matmul3 = cu_matmul3,
    .rmsnorm = cu_rmsnorm,
    .rope = cu_rope,
    .qk_norm_rope = cu_qk_norm_rope,
    .attention = cu_attention,
    .swiglu = cu_swiglu,
    .attention_sinks = cuda_attention_sinks, /* gpt-oss's ops: oai_ops.cu */
    .rope_freqs = cuda_rope_freqs,
    .rope_multi = cu_rope_multi, /* M-RoPE and the ViT's 2-D rope: mrope.cu */
    .swiglu_oai = cuda_swiglu_oai,
    .axpy = cu_axpy,
    .axpy_sigmoid = cu_axpy_sigmoid,
    .scatter_axpy = cu_scatter_axpy,
    .get_row = cu_get_row,
    .get_rows = cu_get_rows,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .gather_rows = cu_gather_rows,
    .zero = cu_zero,
    .sync = cu_sync,
    .moe_ffn = cu_moe_ffn,
    .route = cu_route,
    .moe_ffn_table = cu_moe_ffn_table,
    .moe_ffn_table_route = cu_moe_ffn_table_route,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .qk_norm_rope_at = cu_qk_norm_rope_at,
    .attention_at = cu_attention_at,
    .get_row_at = cu_get_row_at,
    .store_f16 = cu_store_f16, /* the f16 KV cache (attention.cu, attention_prefill.cu) */
    .attention_f16 = cu_attention_f16,
    .qk_norm_rope_at_f16 = cu_qk_norm_rope_at_f16,
    .attention_at_f16 = cu_attention_at_f16,
    .norm_matmul = cu_norm_matmul,
    .moe_ffn_batch = cu_moe_ffn_batch,
    .layernorm = cu_layernorm, /* the vision encoder's ops: vision_ops.cu */
    .add_bias = cu_add_bias,
    .activate = cu_activate,
    .attention_full = cu_attention_full,
    .rope_2d = cu_rope_2d,
    .matmul_scratch = cu_matmul_scratch,
    .argmax = cu_argmax,
    .sample = cu_sample,
};

/* ---- public entry points ---- */

extern "C" int cuda_device_count(char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* with the static runtime and no driver this is cudaErrorInsufficientDriver or
         * cudaErrorNoDevice: an answer, not a crash */
        if (why && whylen)
            snprintf(why, whylen, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        (void)cudaGetLastError();
        return 0;
    }
    if (n == 0 && why && whylen)
        snprintf(why, whylen, "the CUDA driver reports no devices");
    return n;
}

extern "C" int cuda_mem_info(int dev, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    if (cuda_use_device(dev) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return TIDE_EINTERNAL;
    }
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return 0;
}

extern "C" int backend_cuda_init(struct backend *b, int device_index, char *err, size_t errlen)
{
    char why[200];
    int n = cuda_device_count(why, sizeof why);
    if (device_index < 0 || device_index >= n) {
        if (err && errlen)
            snprintf(err, errlen, "cuda device %d: %s", device_index,
                     n ? "no such device" : why);
        return n ? TIDE_EINVAL : TIDE_EUNSUPPORTED;
    }
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof(*c));
    if (!c)
        return TIDE_ENOMEM;
    c->dev = device_index;
    cudaDeviceProp prop;
    bool ok = CU(c, cuda_use_device(device_index)) && CU(c, cudaGetDeviceProperties(&prop, device_index)) &&
              CU(c, cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking)) &&
              CU(c, cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) &&
              CU(c, cudaEventCreateWithFlags(&c->ev_st, cudaEventDisableTiming)) &&
              CU(c, cudaEventCreateWithFlags(&c->ev_copy, cudaEventDisableTiming));
    if (!ok) {
        if (err && errlen)
            snprintf(err, errlen, "cuda device %d: %s", device_index, c->errmsg);
        int rc = c->err ? c->err : TIDE_EINTERNAL;
        b->i = &cuda_iface;
        b->ctx = c;
        backend_cuda_free(b);
        return rc;
    }
    if (prop.major < 7 || (prop.major == 7 && prop.minor < 5)) {
        /* compiled for sm_90 only; an older card would fail at the first launch */
        tide_log("cuda: device %d (%s, sm_%d%d) is older than this build targets", device_index, prop.name,
                 prop.major, prop.minor);
    }
    c->sm_count = prop.multiProcessorCount;
    tide_log("cuda: device %d: %s, sm_%d%d, %d SMs, %.1f GiB", device_index, prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    b->i = &cuda_iface;
    b->ctx = c;
    return 0;
}

extern "C" void backend_cuda_free(struct backend *b)
{
    struct cuda_ctx *c = (struct cuda_ctx *)b->ctx;
    if (!c)
        return;
    cuda_use_device(c->dev);
    if (c->st) cudaStreamSynchronize(c->st);
    if (c->copy) cudaStreamSynchronize(c->copy);
    if (c->scratch) cudaFree(c->scratch);
    if (c->sum) cudaFree(c->sum);
    if (c->smp_dev) cudaFree(c->smp_dev);
    if (c->smp_host) cudaFreeHost(c->smp_host);
    if (c->ev_smp) cudaEventDestroy(c->ev_smp);
    if (c->ev_st) cudaEventDestroy(c->ev_st);
    if (c->ev_copy) cudaEventDestroy(c->ev_copy);
    if (c->st) cudaStreamDestroy(c->st);
    if (c->copy) cudaStreamDestroy(c->copy);
    (void)cudaGetLastError();
    free(c);
    b->ctx = NULL;
    b->i = NULL;
}

extern "C" int backend_cuda_error(const struct backend *b, char *msg, size_t msglen)
{
    const struct cuda_ctx *c = (const struct cuda_ctx *)b->ctx;
    if (!c)
        return TIDE_EINVAL;
    if (c->err && msg && msglen)
        snprintf(msg, msglen, "%s", c->errmsg);
    return c->err;
}

extern "C" void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void cuda_host_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}
