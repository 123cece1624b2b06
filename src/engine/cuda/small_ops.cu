/* small_ops.cu - the CUDA backend's small ops, a launch or a few each: rmsnorm, rope,
 * qk_norm_rope(_at, _f16, _at_paged), swiglu, axpy, axpy_sigmoid, scatter_axpy, get_row(s), get_row_at,
 * gather_rows and store_f16 (the f16 KV cache's stores). backend_cuda.cu puts them in its
 * table (small_ops.cuh); the big kernels live in matmul.cu, moe.cu, attention*.cu.
 *
 * Semantics follow backend_cpu.c op for op. Where the CPU computes in double (rope angles)
 * so does this, so that positions in the tens of thousands rotate identically. */
#include "engine/cuda/small_ops.cuh"
#include "engine/cuda/attention.cuh" /* the paged cache's addressing */

#include <string.h>

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
 * them). pg.tables set (qk_norm_rope_at_paged): kc, vc are a layer's block pools and the row
 * goes where its slot's block table (read now, common.cuh's kv_pages) puts position at[r]. */
template <typename T>
__global__ void qk_norm_rope_at_kernel(float *q, const float *k_new, const float *v_new, T *kc, T *vc,
                                       const int32_t *slot, size_t slot_floats, uint32_t qtype,
                                       const uint8_t *__restrict__ qw, uint32_t ktype, const uint8_t *__restrict__ kw,
                                       int n_head, int n_head_kv, int head_dim, const int32_t *at, float theta,
                                       int neox, float eps, kv_pages pg)
{
    int h = blockIdx.x, r = blockIdx.y, pos = at[r];
    size_t kvd = (size_t)n_head_kv * head_dim;
    if (h < n_head) {
        float *v = q + ((size_t)r * n_head + h) * head_dim;
        head_norm_rope(v, v, qtype, qw, head_dim, pos, theta, neox, eps);
        return;
    }
    size_t o = (size_t)(h - n_head) * head_dim, so;
    if (pg.tables) /* the pool row of position pos of the slot's sequence */
        so = kv_page_row(pg.tables + (slot ? (size_t)slot[r] * pg.stride : 0), pg.shift, pos) * kvd;
    else
        so = (slot ? (size_t)slot[r] * slot_floats : 0) + (size_t)pos * kvd;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
        kv_store(vc + so + o + i, v_new[(size_t)r * kvd + o + i]);
    head_norm_rope(k_new + (size_t)r * kvd + o, kc + so + o, ktype, kw, head_dim, pos, theta, neox, eps);
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

/* These launches cap their grids at 65536 CTAs (cuda_grid's default is 65535); kept as it was. */
#define SMALL_OPS_GRID_CAP 65536

/* ---- the ops (backend_i's slots: small_ops.cuh) ---- */

void cu_rmsnorm(void *ctx, const float *x, const struct tensor *w, float *out, int dim, int n, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0 || dim <= 0)
        return;
    int block = norm_block(dim);
    rmsnorm_kernel<<<n, block, 0, c->st>>>(x, w->type, (const uint8_t *)w->data, out, dim, eps);
    CU_LAUNCH(c, "rmsnorm_kernel");
}

void cu_rope(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, float theta,
             enum rope_kind kind)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int work = n_heads * (head_dim / 2);
    if (!cuda_enter(c) || work <= 0 || n <= 0)
        return;
    if (n > 65535) {
        cuda_fail(c, cudaErrorInvalidValue, "rope (over 65535 tokens in one call)", __FILE__, __LINE__);
        return;
    }
    dim3 grid((unsigned)((work + 127) / 128), (unsigned)n);
    rope_kernel<<<grid, 128, 0, c->st>>>(vec, n_heads, head_dim, pos, theta, kind == ROPE_NEOX);
    CU_LAUNCH(c, "rope_kernel");
}

void cu_qk_norm_rope(void *ctx, float *q, float *k, const struct tensor *q_norm, const struct tensor *k_norm,
                     int n, int n_head, int n_head_kv, int head_dim, int pos, float theta, enum rope_kind kind,
                     float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0 || head_dim <= 0 || n_head + n_head_kv <= 0)
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
                              int head_dim, float theta, enum rope_kind kind, float eps, kv_pages pg = kv_pages{})
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || head_dim <= 0 || n_head <= 0 || n_head_kv <= 0 || n <= 0)
        return;
    if (n > 65535) {
        cuda_fail(c, cudaErrorInvalidValue, "qk_norm_rope_at (over 65535 rows in one call)", __FILE__, __LINE__);
        return;
    }
    dim3 grid((unsigned)(n_head + n_head_kv), (unsigned)n);
    qk_norm_rope_at_kernel<T><<<grid, norm_block(head_dim), sizeof(float) * (size_t)head_dim, c->st>>>(
        q, k_new, v_new, k_cache, v_cache, slot, slot_floats, q_norm ? q_norm->type : 0,
        q_norm ? (const uint8_t *)q_norm->data : NULL, k_norm ? k_norm->type : 0,
        k_norm ? (const uint8_t *)k_norm->data : NULL, n_head, n_head_kv, head_dim, at, theta, kind == ROPE_NEOX, eps,
        pg);
    CU_LAUNCH(c, "qk_norm_rope_at_kernel");
}

void cu_qk_norm_rope_at(void *ctx, float *q, const float *k_new, const float *v_new, float *k_cache,
                        float *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_floats,
                        const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                        int head_dim, float theta, enum rope_kind kind, float eps)
{
    qk_norm_rope_at_t(ctx, q, k_new, v_new, k_cache, v_cache, n, at, slot, slot_floats, q_norm, k_norm, n_head,
                      n_head_kv, head_dim, theta, kind, eps);
}

void cu_qk_norm_rope_at_f16(void *ctx, float *q, const float *k_new, const float *v_new, uint16_t *k_cache,
                            uint16_t *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_elems,
                            const struct tensor *q_norm, const struct tensor *k_norm, int n_head,
                            int n_head_kv, int head_dim, float theta, enum rope_kind kind, float eps)
{
    qk_norm_rope_at_t(ctx, q, k_new, v_new, (__half *)k_cache, (__half *)v_cache, n, at, slot, slot_elems, q_norm,
                      k_norm, n_head, n_head_kv, head_dim, theta, kind, eps);
}

void cu_qk_norm_rope_at_paged(void *ctx, float *q, const float *k_new, const float *v_new, void *k_pool,
                              void *v_pool, bool f16, int n, const int32_t *at, const int32_t *slot,
                              const int32_t *tables, int table_stride, int block_rows, const struct tensor *q_norm,
                              const struct tensor *k_norm, int n_head, int n_head_kv, int head_dim, float theta,
                              enum rope_kind kind, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return;
    int shift = cuda_block_shift(c, block_rows);
    if (shift <= 0)
        return;
    kv_pages pg = {tables, table_stride, shift};
    if (f16)
        qk_norm_rope_at_t(ctx, q, k_new, v_new, (__half *)k_pool, (__half *)v_pool, n, at, slot, 0, q_norm, k_norm,
                          n_head, n_head_kv, head_dim, theta, kind, eps, pg);
    else
        qk_norm_rope_at_t(ctx, q, k_new, v_new, (float *)k_pool, (float *)v_pool, n, at, slot, 0, q_norm, k_norm,
                          n_head, n_head_kv, head_dim, theta, kind, eps, pg);
}

/* backend_i.store_f16: a step's new K/V rows into an f16 cache */
__global__ void store_f16_kernel(__half *dst, const float *__restrict__ src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

void cu_store_f16(void *ctx, uint16_t *dst, const float *src, size_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || !n)
        return;
    store_f16_kernel<<<cuda_grid(n, 256, SMALL_OPS_GRID_CAP), 256, 0, c->st>>>((__half *)dst, src, n);
    CU_LAUNCH(c, "store_f16_kernel");
}

void cu_get_row_at(void *ctx, const struct tensor *t, const int32_t *at, float *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int n = (int)t->ne[0];
    if (!cuda_enter(c) || n <= 0)
        return;
    get_row_at_kernel<<<cuda_grid((size_t)n, 256, SMALL_OPS_GRID_CAP), 256, 0, c->st>>>(
        t->type, (const uint8_t *)t->data, t->row_bytes, at, out, n);
    CU_LAUNCH(c, "get_row_at_kernel");
}

void cu_swiglu(void *ctx, float *gate, const float *up, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0)
        return;
    swiglu_kernel<<<cuda_grid((size_t)n, 256, SMALL_OPS_GRID_CAP), 256, 0, c->st>>>(gate, up, (size_t)n);
    CU_LAUNCH(c, "swiglu_kernel");
}

void cu_axpy(void *ctx, float *y, const float *x, float a, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0)
        return;
    axpy_kernel<<<cuda_grid((size_t)n, 256, SMALL_OPS_GRID_CAP), 256, 0, c->st>>>(y, x, a, (size_t)n);
    CU_LAUNCH(c, "axpy_kernel");
}

void cu_axpy_sigmoid(void *ctx, float *y, const float *x, const float *g, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0 || dim <= 0)
        return;
    axpy_sigmoid_kernel<<<n, 256, 0, c->st>>>(y, x, g, dim);
    CU_LAUNCH(c, "axpy_sigmoid_kernel");
}

void cu_scatter_axpy(void *ctx, float *y, const float *x, const int *rows, const float *w, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0 || dim <= 0)
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

void cu_get_row(void *ctx, const struct tensor *t, int id, float *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int n = (int)t->ne[0];
    if (!cuda_enter(c) || n <= 0)
        return;
    const uint8_t *row = (const uint8_t *)t->data + (size_t)id * t->row_bytes;
    get_row_kernel<<<cuda_grid((size_t)n, 256, SMALL_OPS_GRID_CAP), 256, 0, c->st>>>(t->type, row, out, n);
    CU_LAUNCH(c, "get_row_kernel");
}

void cu_get_rows(void *ctx, const struct tensor *t, const int *ids, int n, float *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int dim = (int)t->ne[0];
    for (int i0 = 0; i0 < n && cuda_enter(c) && dim > 0; i0 += GATHER_MAX) {
        int k = n - i0 < GATHER_MAX ? n - i0 : GATHER_MAX;
        gather_ids gi;
        memcpy(gi.id, ids + i0, sizeof(int) * (size_t)k);
        get_rows_kernel<<<k, 256, 0, c->st>>>(t->type, (const uint8_t *)t->data, t->row_bytes, gi,
                                             out + (size_t)i0 * dim, dim);
        if (!CU_LAUNCH(c, "get_rows_kernel"))
            return;
    }
}

void cu_gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n, int dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || n <= 0 || dim <= 0)
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
