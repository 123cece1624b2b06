/* backend_cpu.c - the CPU backend: every forward op in plain C, matmul on a thread pool.
 *
 * Matmul splits the output rows across a persistent pool of pthreads (created once, so a
 * decode step does not pay thread start-up), in chunks the threads claim. For quantised
 * weights (q8_0, q4_0, q5_0, q5_1, MXFP4, the k-quants, iq4_xs) x is quantised to int8 blocks
 * once per call and rows are int8 dot products (cpu_quant.c, with AVX-512 VNNI tiles in
 * cpu_quant_vnni.c); f16 rows are register tiles (cpu_f16.c: 4 rows by 3 vectors in AVX2, 8 by
 * 4 in AVX-512) where the CPU has F16C and FMA; bf16 rows (and f16 without F16C) are widened into a per-thread float
 * buffer then dotted. Attention is backend_cpu_attention.c. */
#include "backend.h"
#include "route.h"
#include "sample.h"
#include "sample_rows.h"
#include "backend_cpu_vision.h"
#include "backend_cpu_oai.h"
#include "cpu_quant.h"
#include "cpu_f16.h"
#include "backend_cpu_attention.h"
#include "backend_cpu_moe.h"
#include "backend_cpu_rows.h"
#include "mrope.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* not under ThreadSanitizer (make tsan): the clones' ifunc resolvers run before its runtime is up and crash */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KERNEL
#endif

typedef cpu_job_fn job_fn;

struct cpu_ctx {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t gen;            /* bumped for each job; workers wait for a change */
    uint64_t open;           /* the gen of the job workers may still join; 0 once closed */
    int n_active;            /* workers inside a job */
    bool quit;
    job_fn fn;
    void *arg;
    float **scratch;         /* (n_threads) per-thread row buffers */
    size_t *scratch_n;
    uint8_t *xq;             /* quantised input (cpu_quant_act_bytes per vector) */
    size_t xq_n;             /* its bytes */
    float *sum;              /* the fused-add slots' result before it is added (sum_n floats) */
    size_t sum_n;
    pthread_mutex_t maps_mu; /* big_maps is used by alloc/free from any thread */
    struct big_map *big_maps; /* (n_big_maps) live mappings made by cpu_alloc */
    void *moe;               /* backend_cpu_moe.c's buffers */
    int n_big_maps, cap_big_maps;
};

/* A big buffer (an expert-cache segment, the KV cache) as cpu_alloc mapped it. */
struct big_map { void *user, *raw; size_t len; };

static float f16_table[65536];

/* ---- thread pool ---- */

struct worker_arg { struct cpu_ctx *c; int ith; };

/* Workers spin briefly on the job generation before sleeping on the condition variable:
 * a decode step issues ~100 small matmuls, and a futex wake per matmul cost more than the
 * matmul itself. gen is read with atomics outside the mutex; every write of gen happens
 * under the mutex so a sleeping worker never misses one.
 *
 * Jobs claim their work in chunks from a counter (cpu_claim) instead of taking a fixed
 * share, and a worker that comes late to a job finds it closed and skips it: the caller never
 * waits for a thread the OS has not run yet. On a machine shared with other processes that
 * wait was the cost of a second thread (a fixed half of every matmul waited for a descheduled
 * worker); now the caller takes what is left and the job ends when the work does. Results
 * do not depend on who computes a chunk. */
#define POOL_SPIN 20000

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    struct cpu_ctx *c = wa.c;
    uint64_t seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE) == seen &&
                        !__atomic_load_n(&c->quit, __ATOMIC_ACQUIRE); i++)
            cpu_relax();
        pthread_mutex_lock(&c->mu);
        while (c->gen == seen && !c->quit)
            pthread_cond_wait(&c->cv_start, &c->mu);
        bool quit = c->quit;
        seen = c->gen;
        job_fn fn = c->fn;
        void *arg = c->arg;
        pthread_mutex_unlock(&c->mu);
        if (quit)
            break;
        /* join only the job that is still open (with the caller's close, a Dekker pair) */
        __atomic_add_fetch(&c->n_active, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&c->open, __ATOMIC_SEQ_CST) == seen)
            fn(arg, wa.ith, c->n_threads);
        __atomic_sub_fetch(&c->n_active, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* Run fn on the caller (thread 0) and on every worker that joins before the caller's own
 * call returns; fn claims its work with cpu_claim, so when the caller's call returns all of
 * it has been claimed. Returns when the joined workers have finished theirs. */
static void pool_run(struct cpu_ctx *c, job_fn fn, void *arg)
{
    if (c->n_threads <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->fn = fn;
    c->arg = arg;
    uint64_t g = __atomic_add_fetch(&c->gen, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&c->open, g, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&c->cv_start);
    pthread_mutex_unlock(&c->mu);
    fn(arg, 0, c->n_threads);
    __atomic_store_n(&c->open, 0, __ATOMIC_SEQ_CST);
    /* the workers inside finish their last chunk: spin, yielding now and then */
    for (unsigned i = 0; __atomic_load_n(&c->n_active, __ATOMIC_SEQ_CST) > 0; i++) {
        cpu_relax();
        if ((i & 1023) == 1023) sched_yield();
    }
}

void cpu_pool_run(void *ctx, cpu_job_fn fn, void *arg) { pool_run(ctx, fn, arg); }

static float *thread_scratch(struct cpu_ctx *c, int ith, size_t n)
{
    if (c->scratch_n[ith] < n) {
        free(c->scratch[ith]);
        c->scratch[ith] = malloc(n * sizeof(float));
        c->scratch_n[ith] = c->scratch[ith] ? n : 0;
    }
    return c->scratch[ith];
}

float *cpu_thread_scratch(void *ctx, int ith, size_t n) { return thread_scratch(ctx, ith, n); }
int cpu_thread_scratch_all(void *ctx, size_t n)
{
    struct cpu_ctx *c = ctx;
    for (int i = 0; i < c->n_threads; i++)
        if (!thread_scratch(c, i, n))
            return TIDE_ENOMEM;
    return 0;
}
void **cpu_moe_state(void *ctx) { return &((struct cpu_ctx *)ctx)->moe; }

/* ---- kernels ---- */

KERNEL static float dot_f32(const float *a, const float *b, int n)
{
    float acc[16] = {0}; /* 16 lanes so gcc keeps independent vector accumulators */
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

float cpu_dot_f32(const float *a, const float *b, int n) { return dot_f32(a, b, n); }

/* Four dot products of one weight row with four input vectors: the row is read once per
 * four tokens, which is what makes prefill compute-bound instead of load-bound. Each token's
 * sum is dot_f32's, operation for operation (16 lanes, the same reduction): a row's result
 * must not depend on which batch it ran in, so that a sequence batched with others gets the
 * bits it gets alone (the scheduler's "batched equals alone"). */
KERNEL static void dot4_f32(const float *w, const float *x, size_t stride, int n, float *out)
{
    const float *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
    float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            float wv = w[i + j];
            a0[j] += wv * x0[i + j];
            a1[j] += wv * x1[i + j];
            a2[j] += wv * x2[i + j];
            a3[j] += wv * x3[i + j];
        }
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int j = 0; j < 16; j++) {
        s0 += a0[j];
        s1 += a1[j];
        s2 += a2[j];
        s3 += a3[j];
    }
    for (; i < n; i++) {
        s0 += w[i] * x0[i];
        s1 += w[i] * x1[i];
        s2 += w[i] * x2[i];
        s3 += w[i] * x3[i];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

/* y[t*rows + r] = row . x_t for every token t, four tokens at a time. */
static void dot_row_tokens(const float *row, const float *x, int cols, int n, float *y, int rows, int r)
{
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        float o[4];
        dot4_f32(row, x + (size_t)t * cols, (size_t)cols, cols, o);
        for (int k = 0; k < 4; k++)
            y[(size_t)(t + k) * rows + r] = o[k];
    }
    for (; t < n; t++)
        y[(size_t)t * rows + r] = dot_f32(row, x + (size_t)t * cols, cols);
}

static void widen_f16_table(const uint16_t *src, float *dst, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = f16_table[src[i]];
}

#if defined(__x86_64__)
#include <immintrin.h>
/* F16C converts 8 halves per instruction: decode is bound by reading f16 weights, so this
 * (not the table) is the path on any x86-64 of the last decade. Chosen at run time. */
__attribute__((target("avx2,f16c,fma"))) static void widen_f16_f16c(const uint16_t *src, float *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = f16_table[src[i]];
}

static bool have_f16c;
#endif

static void widen_f16(const uint16_t *src, float *dst, int n)
{
#if defined(__x86_64__)
    if (have_f16c) {
        widen_f16_f16c(src, dst, n);
        return;
    }
#endif
    widen_f16_table(src, dst, n);
}

static pthread_once_t f16_once = PTHREAD_ONCE_INIT;
static void f16_init(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = tide_f16_to_f32((uint16_t)i);
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_f16c = cpu_f16_fast();
#endif
}

KERNEL static void widen_bf16(const uint16_t *src, float *dst, int n)
{
    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* ---- matmul ---- */

struct mm_job {
    struct cpu_ctx *c;
    const struct tensor *w;
    const float *x;
    float *y;
    int n;
    int next;  /* the first row (or vector, quantising) no thread has claimed */
    int chunk; /* rows a claim takes */
};

static void mm_rows(struct mm_job *j, int ith, int r0, int r1);

/* Rows in chunks of contiguous rows (a multiple of 16, the VNNI prefill GEMM's height; the
 * other tiles' 8 and 4 divide it), about four a thread, claimed until none is left. */
static void mm_worker(void *p, int ith, int nth)
{
    struct mm_job *j = p;
    int rows = (int)j->w->ne[1];
    (void)nth;
    for (int r0; (r0 = cpu_claim(&j->next, j->chunk, rows)) >= 0;)
        mm_rows(j, ith, r0, r0 + j->chunk < rows ? r0 + j->chunk : rows);
}

static void mm_rows(struct mm_job *j, int ith, int r0, int r1)
{
    const struct tensor *w = j->w;
    int rows = (int)w->ne[1], cols = (int)w->ne[0];
    const uint8_t *base = w->data;
#if defined(__x86_64__)
    if (w->type == GGML_TYPE_F16 && have_f16c) { /* register tiles (cpu_f16.c) */
        float *tbuf = thread_scratch(j->c, ith, 8 * (size_t)cols);
        if (tbuf && r0 < r1)
            cpu_f16_rows(base, w->row_bytes, r0, r1, j->x, j->n, cols, j->y, (size_t)rows, tbuf);
        return;
    }
#endif
    float *buf = NULL;
    bool widen = w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16;
    if (widen) {
        buf = thread_scratch(j->c, ith, (size_t)cols);
        if (!buf)
            return;
    }
    if (cpu_quant_has(w->type)) {
        /* each dot is one fixed-order result, so a row's bits do not depend on n or the thread
         * split; rows and vectors are tiled where the CPU has the ISA for it (cpu_quant.c) */
        if (r0 < r1)
            cpu_quant_rows(w->type, base, w->row_bytes, r0, r1, j->c->xq, cpu_quant_act_bytes(w->type, cols), j->n,
                           cols, j->y, (size_t)rows, CPU_ISA_BEST);
        return;
    }
    for (int r = r0; r < r1; r++) {
        const void *row = base + (size_t)r * w->row_bytes;
        switch (w->type) {
        case GGML_TYPE_F32:
            dot_row_tokens(row, j->x, cols, j->n, j->y, rows, r);
            break;
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16:
            if (w->type == GGML_TYPE_F16)
                widen_f16(row, buf, cols);
            else
                widen_bf16(row, buf, cols);
            dot_row_tokens(buf, j->x, cols, j->n, j->y, rows, r);
            break;
        default: /* a type without a CPU path */
            for (int t = 0; t < j->n; t++)
                j->y[(size_t)t * rows + r] = 0.0f;
        }
    }
}

/* Quantise the matmul's input vectors for cpu_quant (each vector's bytes are the same
 * whichever thread makes them). */
static void act_worker(void *p, int ith, int nth)
{
    struct mm_job *j = p;
    int cols = (int)j->w->ne[0];
    size_t per = cpu_quant_act_bytes(j->w->type, cols);
    (void)ith; (void)nth;
    for (int t; (t = cpu_claim(&j->next, 1, j->n)) >= 0;)
        cpu_quant_act(j->w->type, j->x + (size_t)t * cols, cols, j->c->xq + (size_t)t * per);
}

static void cpu_matmul(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    struct cpu_ctx *c = ctx;
    int cols = (int)w->ne[0];
    if (cpu_quant_has(w->type)) {
        size_t per = cpu_quant_act_bytes(w->type, cols), need = (size_t)n * per;
        if (c->xq_n < need) {
            free(c->xq);
            c->xq = malloc(need);
            c->xq_n = c->xq ? need : 0;
            if (!c->xq)
                return;
        }
    }
    struct mm_job j = {c, w, x, y, n, 0, 0};
    if (cpu_quant_has(w->type)) /* a prefill's hundreds of vectors are worth the pool */
        n >= 8 ? pool_run(c, act_worker, &j) : act_worker(&j, 0, 1);
    int rows = (int)w->ne[1], chunk = (rows + 4 * c->n_threads - 1) / (4 * c->n_threads);
    j.next = 0;
    j.chunk = chunk < 16 ? 16 : (chunk + 15) / 16 * 16;
    /* tiny matrices are not worth waking the pool for */
    if ((size_t)w->ne[0] * w->ne[1] * n < 16384)
        mm_worker(&j, 0, 1);
    else
        pool_run(c, mm_worker, &j);
}

/* ---- small ops ---- */

static void cpu_get_row(void *ctx, const struct tensor *t, int id, float *out)
{
    const uint8_t *row = (const uint8_t *)t->data + (size_t)id * t->row_bytes;
    int n = (int)t->ne[0];
    switch (t->type) {
    case GGML_TYPE_F32: memcpy(out, row, sizeof(float) * n); break;
    case GGML_TYPE_F16: widen_f16((const uint16_t *)row, out, n); break;
    case GGML_TYPE_BF16: widen_bf16((const uint16_t *)row, out, n); break;
    default: ggml_dequantize(t->type, row, out, (uint64_t)n); break;
    }
}

static void cpu_get_rows(void *ctx, const struct tensor *t, const int *ids, int n, float *out)
{
    for (int i = 0; i < n; i++)
        cpu_get_row(ctx, t, ids[i], out + (size_t)i * t->ne[0]);
}

static void cpu_rmsnorm(void *ctx, const float *x, const struct tensor *w, float *out,
                        int dim, int n, float eps)
{
    struct cpu_ctx *c = ctx;
    float *wf = thread_scratch(c, 0, (size_t)dim); /* the norm weight as f32 */
    if (!wf)
        return;
    cpu_get_row(ctx, w, 0, wf);
    cpu_rows_rmsnorm(ctx, x, wf, out, dim, n, eps); /* over the pool's threads (backend_cpu_rows.c) */
}

static void cpu_rope(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, float theta,
                     enum rope_kind kind)
{
    cpu_rows_rope(ctx, vec, n_heads, NULL, 0, n, head_dim, pos, theta, kind);
}

static void cpu_rope_multi(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta,
                           const uint32_t sections[4], bool interleaved)
{
    (void)ctx;
    mrope_rotate(vec, n, n_heads, head_dim, pos, theta, sections, interleaved);
}

/* backend_i.qk_norm_rope: the ops it stands for, in the forward's old order. */
static void cpu_qk_norm_rope(void *ctx, float *q, float *k, const struct tensor *q_norm, const struct tensor *k_norm,
                             int n, int n_head, int n_head_kv, int head_dim, int pos, float theta,
                             enum rope_kind kind, float eps)
{
    if (q_norm)
        cpu_rmsnorm(ctx, q, q_norm, q, head_dim, n * n_head, eps);
    if (k_norm)
        cpu_rmsnorm(ctx, k, k_norm, k, head_dim, n * n_head_kv, eps);
    cpu_rows_rope(ctx, q, n_head, k, n_head_kv, n, head_dim, pos, theta, kind); /* one cos/sin for both */
}

static void cpu_swiglu(void *ctx, float *gate, const float *up, int n) { cpu_rows_swiglu(ctx, gate, up, n); }

static void cpu_axpy(void *ctx, float *y, const float *x, float a, int n) { cpu_rows_axpy(ctx, y, x, a, n); }

static void cpu_axpy_sigmoid(void *ctx, float *y, const float *x, const float *g, int n, int dim)
{
    for (int t = 0; t < n; t++)
        cpu_axpy(ctx, y + (size_t)t * dim, x + (size_t)t * dim, 1.0f / (1.0f + expf(-g[t])), dim);
}

/* The product of a fused-add slot before the add: a buffer of the engine thread's context. */
static float *cpu_sum_buf(struct cpu_ctx *c, size_t n)
{
    if (c->sum_n < n) {
        free(c->sum);
        c->sum = malloc(n * sizeof(float));
        c->sum_n = c->sum ? n : 0;
    }
    return c->sum;
}

static void cpu_matmul3(void *ctx, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                        const struct tensor *norm, float eps, float *xn)
{
    if (norm) {
        cpu_rmsnorm(ctx, x, norm, xn, (int)w[0]->ne[0], n, eps);
        x = xn;
    }
    for (int m = 0; m < 3; m++)
        cpu_matmul(ctx, w[m], x, y[m], n);
}

/* y += W x as the two ops it stands for (matmul into a buffer, axpy with a = 1), so the CPU
 * results of a fused forward are the bits of the unfused one. */
static void cpu_matmul_add(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    size_t len = (size_t)n * (w->ne[1] ? w->ne[1] : 1);
    float *t = cpu_sum_buf(ctx, len);
    if (!t)
        return;
    cpu_matmul(ctx, w, x, t, n);
    cpu_axpy(ctx, y, t, 1.0f, (int)len);
}

static void cpu_scatter_axpy(void *ctx, float *y, const float *x, const int *rows, const float *w, int n,
                             int dim)
{
    cpu_rows_scatter_axpy(ctx, y, x, rows, w, n, dim);
}

/* Buffers of 4 MiB and up get their own 2 MiB-aligned mapping advised for transparent huge
 * pages (THP is often in "madvise" mode). Why: a regrow maps fresh segments and refills them at
 * once, and with 4 KiB pages refilling 1.5 GiB costs ~390,000 page faults; with huge pages ~750.
 * Smaller buffers stay on malloc. */
#define CPU_BIG_ALLOC ((size_t)4 << 20)
#define CPU_HUGE_PAGE ((size_t)2 << 20)

static void *cpu_alloc(void *ctx, size_t bytes)
{
    struct cpu_ctx *c = ctx;
    if (bytes < CPU_BIG_ALLOC)
        return malloc(bytes ? bytes : 1);
    size_t use = (bytes + CPU_HUGE_PAGE - 1) & ~(CPU_HUGE_PAGE - 1), len = use + CPU_HUGE_PAGE;
    void *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    void *user = (void *)(((uintptr_t)raw + CPU_HUGE_PAGE - 1) & ~(uintptr_t)(CPU_HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    madvise(user, use, MADV_HUGEPAGE); /* advice only: fine if the kernel says no */
#endif
    pthread_mutex_lock(&c->maps_mu);
    if (c->n_big_maps == c->cap_big_maps) {
        int cap = c->cap_big_maps ? 2 * c->cap_big_maps : 16;
        struct big_map *m = realloc(c->big_maps, (size_t)cap * sizeof(*m));
        if (!m) {
            pthread_mutex_unlock(&c->maps_mu);
            munmap(raw, len);
            return NULL;
        }
        c->big_maps = m;
        c->cap_big_maps = cap;
    }
    c->big_maps[c->n_big_maps++] = (struct big_map){user, raw, len};
    pthread_mutex_unlock(&c->maps_mu);
    return user;
}

static void cpu_free(void *ctx, void *ptr)
{
    struct cpu_ctx *c = ctx;
    if (!ptr)
        return;
    pthread_mutex_lock(&c->maps_mu);
    for (int i = 0; i < c->n_big_maps; i++) {
        if (c->big_maps[i].user != ptr)
            continue;
        struct big_map m = c->big_maps[i];
        c->big_maps[i] = c->big_maps[--c->n_big_maps];
        pthread_mutex_unlock(&c->maps_mu);
        munmap(m.raw, m.len);
        return;
    }
    pthread_mutex_unlock(&c->maps_mu);
    free(ptr);
}
static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n, int dim)
{
    cpu_rows_gather(ctx, dst, src, rows, n, dim);
}
static void cpu_zero(void *ctx, float *x, int n) { memset(x, 0, sizeof(float) * (size_t)n); }
/* a step's new K/V rows into the f16 cache: a few thousand values, not worth the pool */
static void cpu_store_f16(void *ctx, uint16_t *dst, const float *src, size_t n) { cpu_f16_from_f32(dst, src, n); }
static void cpu_sync(void *ctx) { (void)ctx; }

/* The fused MoE slot as the per-expert ops it stands for (the CUDA form must match this). */
static int cpu_moe_ffn(void *ctx, const struct expert_weights *ex, const float *w, int k, const float *x,
                       float *y, float *hb, float *hb2, float *tmp, bool add)
{
    int E = (int)ex[0].gate.ne[0], F = (int)ex[0].gate.ne[1];
    if (!x)
        return 0; /* a probe: every type runs here */
    float *out = y;
    if (add && !(y = cpu_sum_buf(ctx, (size_t)E))) /* the sum first, then y += sum */
        return TIDE_ENOMEM;
    cpu_zero(ctx, y, E);
    for (int j = 0; j < k; j++) {
        cpu_matmul(ctx, &ex[j].gate, x, hb, 1);
        cpu_matmul(ctx, &ex[j].up, x, hb2, 1);
        cpu_swiglu(ctx, hb, hb2, F);
        cpu_matmul(ctx, &ex[j].down, hb, tmp, 1);
        cpu_axpy(ctx, y, tmp, w[j], E);
    }
    if (add)
        cpu_axpy(ctx, out, y, 1.0f, E);
    return 0;
}

/* backend_i.route: the host routing of route.c, on host memory */
static void cpu_route(void *ctx, const float *logits, int n, int n_expert, int k, bool norm, int32_t *out)
{
    (void)ctx;
    route_topk(logits, n, n_expert, k, norm, out);
}

static void cpu_argmax(void *ctx, const float *x, int n, int32_t *out)
{
    (void)ctx;
    out[0] = n > 0 ? sampler_argmax(x, n) : 0;
}

/* Out of memory for the candidates' scratch: each row's greedy token (a valid, likely one)
 * rather than nothing, with no logprobs, and a line in the log. */
static void cpu_sample(void *ctx, float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                       struct sample_logprob *lp)
{
    (void)ctx;
    if (sample_rows_full(logits, n, n_vocab, rows, out, lp) == 0)
        return;
    tide_log("sample: out of memory for %d rows of %d logits; the greedy token is taken", n, n_vocab);
    for (int i = 0; i < n; i++) {
        out[i] = sampler_argmax(logits + (size_t)i * n_vocab, n_vocab);
        if (lp && rows[i].logprobs)
            lp[i] = (struct sample_logprob){.id = out[i]};
    }
}

static const struct backend_i cpu_iface = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .matmul = cpu_matmul,
    .matmul_add = cpu_matmul_add,
    .matmul3 = cpu_matmul3,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .qk_norm_rope = cpu_qk_norm_rope,
    .attention = cpu_attention,
    .store_f16 = cpu_store_f16, /* the f16 KV cache: backend_cpu_attention.c */
    .attention_f16 = cpu_attention_f16,
    .attention_paged = cpu_attention_paged,
    .swiglu = cpu_swiglu,
    .attention_sinks = cpu_attention_sinks, /* the plain attention's code (backend_cpu_attention.c) */
    .attention_sinks_any_cache = true,
    .swiglu_oai = cpu_swiglu_oai,
    .rope_freqs = cpu_rope_freqs,
    .rope_multi = cpu_rope_multi,
    .axpy = cpu_axpy,
    .axpy_sigmoid = cpu_axpy_sigmoid,
    .scatter_axpy = cpu_scatter_axpy,
    .get_row = cpu_get_row,
    .get_rows = cpu_get_rows,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .gather_rows = cpu_gather_rows,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .moe_ffn = cpu_moe_ffn,
    .moe_ffn_batch = cpu_moe_ffn_batch, /* backend_cpu_moe.c */
    .route = cpu_route,
    .moe_ffn_table = NULL, /* a CPU device computes experts where the cache put them */
    .moe_ffn_table_route = NULL,
    .layernorm = cpu_layernorm, /* the vision encoder's ops: backend_cpu_vision.c */
    .add_bias = cpu_add_bias,
    .activate = cpu_activate,
    .rope_2d = cpu_rope_2d,
    .attention_full = cpu_attention_full,
    .matmul_scratch = NULL, /* its quantised x is host memory */
    .argmax = cpu_argmax,
    .sample = cpu_sample, /* sample_rows.c */
};

void backend_cpu_matmul(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    cpu_matmul(ctx, w, x, y, n);
}

int backend_cpu_init(struct backend *b, int n_threads)
{
    pthread_once(&f16_once, f16_init);
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    struct cpu_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return TIDE_ENOMEM;
    c->n_threads = n_threads;
    c->scratch = calloc(n_threads, sizeof(float *));
    c->scratch_n = calloc(n_threads, sizeof(size_t));
    c->threads = calloc(n_threads, sizeof(pthread_t));
    if (!c->scratch || !c->scratch_n || !c->threads) {
        free(c->scratch); free(c->scratch_n); free(c->threads); free(c);
        return TIDE_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->maps_mu, NULL);
    pthread_cond_init(&c->cv_start, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    int started = 1;
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (!wa)
            break;
        wa->c = c; /* set before the thread can read it */
        wa->ith = i;
        if (pthread_create(&c->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            break;
        }
        started++;
    }
    if (started != n_threads) {
        /* run with what we have rather than fail: fewer threads is still correct */
        c->n_threads = started;
    }
    b->i = &cpu_iface;
    b->ctx = c;
    return 0;
}

void backend_cpu_free(struct backend *b)
{
    struct cpu_ctx *c = b->ctx;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->quit, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->cv_start);
    pthread_mutex_unlock(&c->mu);
    for (int i = 1; i < c->n_threads; i++)
        pthread_join(c->threads[i], NULL);
    for (int i = 0; i < c->n_threads; i++)
        free(c->scratch[i]);
    free(c->scratch);
    free(c->scratch_n);
    free(c->threads);
    free(c->xq);
    free(c->sum);
    cpu_moe_free(c->moe);
    pthread_mutex_destroy(&c->mu);
    for (int i = 0; i < c->n_big_maps; i++) /* buffers the owner never freed */
        munmap(c->big_maps[i].raw, c->big_maps[i].len);
    free(c->big_maps);
    pthread_mutex_destroy(&c->maps_mu);
    pthread_cond_destroy(&c->cv_start);
    pthread_cond_destroy(&c->cv_done);
    free(c);
    b->ctx = NULL;
    b->i = NULL;
}
