/* backend_cuda.cu - the CUDA backend table: context, streams, error keeping, the scratch
 * buffers, the copies (upload, download, copy, zero) and the adapters from struct backend_i's
 * slots to the kernels' files. small_ops.cu holds the small ops (rmsnorm, rope, qk_norm_rope,
 * swiglu, axpy, scatter_axpy, get_row(s), gather_rows, store_f16); matmul.cu, moe.cu,
 * attention.cu (decode), attention_prefill.cu and norm_matmul.cu the big kernels; graph.cu the
 * recording of decode steps. */
#include "engine/cuda/common.cuh"
#include "engine/cuda/small_ops.cuh"
#include "engine/cuda/attention.cuh"
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
    if (cuda_enter(c))
        cuda_matmul(c, w, x, y, n);
}

static void cu_matmul3(void *ctx, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                       const struct tensor *norm, float eps, float *xn)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || cuda_matmul3(c, w, x, y, n, norm, eps, xn))
        return;
    cu_rmsnorm(ctx, x, norm, xn, (int)w[0]->ne[0], n, eps); /* the norm did not fuse: first, alone */
    cuda_matmul3(c, w, xn, y, n, NULL, 0.0f, NULL);
}

static void cu_matmul_add(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c))
        cuda_matmul(c, w, x, y, n, true);
}

static int cu_moe_ffn(void *ctx, const struct expert_weights *ex, const float *w, int k, const float *x,
                      float *y, float *hb, float *hb2, float *tmp, bool add)
{
    (void)hb, (void)hb2, (void)tmp;
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return c->err;
    return cuda_moe_ffn(c, ex, w, k, x, y, add);
}

static int cu_moe_ffn_table(void *ctx, const struct expert_weights *shape, const void *const *table,
                            const int32_t *routed, int k, const float *x, float *y, bool add)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return c->err;
    return cuda_moe_ffn_table(c, shape, table, routed, k, x, y, add);
}

static int cu_moe_ffn_table_route(void *ctx, const struct expert_weights *shape, const void *const *table,
                                  const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                                  const float *x, float *y, bool add)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return c->err;
    return cuda_moe_ffn_table_route(c, shape, table, logits, n, n_expert, norm, routed, k, x, y, add);
}

static int cu_moe_ffn_batch(void *ctx, const struct moe_batch *b, const float *x, float *y, bool add)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (x && !cuda_enter(c))
        return c->err;
    return cuda_moe_ffn_batch(c, b, x, y, add);
}

static void cu_route(void *ctx, const float *logits, int n, int n_expert, int k, bool norm, int32_t *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c))
        cuda_route(c, logits, n, n_expert, k, norm, out);
}

static void cu_attention_at(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out, int n,
                            const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx, int n_head,
                            int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    /* the contiguous cache only (the paged forms have entry points of their own) */
    if (cuda_enter(c) && !(n_ctx > 0 && n > 0 &&
                           cuda_attention_split(c, q, k_cache, v_cache, false, out, n_ctx - 1, n_head, n_head_kv,
                                                head_dim, at, n_ctx, n, slot, slot_floats)))
        cuda_attention_at(c, q, k_cache, v_cache, false, out, n, at, slot, slot_floats, n_ctx, n_head, n_head_kv,
                          head_dim);
}

static void cu_attention_at_f16(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_elems,
                                int n_ctx, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c) && !(n_ctx > 0 && n > 0 &&
                           cuda_attention_split(c, q, k_cache, v_cache, true, out, n_ctx - 1, n_head, n_head_kv,
                                                head_dim, at, n_ctx, n, slot, slot_elems)))
        cuda_attention_at(c, q, k_cache, v_cache, true, out, n, at, slot, slot_elems, n_ctx, n_head, n_head_kv,
                          head_dim);
}

static int cu_norm_matmul(void *ctx, const struct tensor *w, const float *x, float *y, const struct tensor *norm,
                          float eps, float *xn)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return c->err;
    if (!cuda_norm_matmul(c, w, x, y, norm, eps, xn))
        return TIDE_EUNSUPPORTED;
    return c->err;
}

static void cu_argmax(void *ctx, const float *x, int n, int32_t *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c))
        cuda_argmax(c, x, n, out);
}

static void cu_sample(void *ctx, float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                      struct sample_logprob *lp)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c))
        cuda_sample(c, logits, n, n_vocab, rows, out, lp);
}

static void cu_attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                         float *att, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)att;
    /* one token: TIDE_DECODE_ATTN_SPLIT's kernels where they take the shape (attention_decode.cu) */
    if (cuda_enter(c) && n > 0 &&
        !(n == 1 && cuda_attention_split(c, q, k_cache, v_cache, false, out, pos, n_head, n_head_kv, head_dim, NULL,
                                         0, 1, NULL, 0)))
        cuda_attention(c, q, k_cache, v_cache, false, out, n, pos, n_head, n_head_kv, head_dim);
}

static void cu_attention_f16(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache, float *out,
                             float *att, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)att;
    if (cuda_enter(c) && n > 0 &&
        !(n == 1 && cuda_attention_split(c, q, k_cache, v_cache, true, out, pos, n_head, n_head_kv, head_dim, NULL,
                                         0, 1, NULL, 0)))
        cuda_attention(c, q, k_cache, v_cache, true, out, n, pos, n_head, n_head_kv, head_dim);
}

/* upload: on the copy stream, after everything already queued on the op stream (which may
 * still read dst), and before anything queued after it. */
static void cu_upload(void *ctx, void *dst, const void *src_host, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || !bytes)
        return;
    if (CU(c, cudaEventRecord(c->ev_st, c->st)) && CU(c, cudaStreamWaitEvent(c->copy, c->ev_st, 0)) &&
        CU(c, cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->copy)) &&
        CU(c, cudaEventRecord(c->ev_copy, c->copy)))
        CU(c, cudaStreamWaitEvent(c->st, c->ev_copy, 0));
}

static void cu_download(void *ctx, void *dst_host, const void *src, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || !bytes)
        return;
    if (CU(c, cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->st)))
        CU(c, cudaStreamSynchronize(c->st));
}

/* On the compute stream: ordered after the steps that wrote src, before the next that reads dst. */
static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c) || !bytes)
        return;
    CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st));
}

static void cu_zero(void *ctx, float *x, int n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c) && n > 0)
        CU(c, cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, c->st));
}

static void cu_sync(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (cuda_enter(c) && CU(c, cudaStreamSynchronize(c->copy)))
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
    .attention_sinks_any_cache = true, /* f16 and paged too (attention_sinks.cuh) */
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
    .attention_paged = cu_attention_paged, /* the paged KV cache (attention.cu, small_ops.cu) */
    .qk_norm_rope_at_paged = cu_qk_norm_rope_at_paged,
    .attention_at_paged = cu_attention_at_paged,
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
