/* backend_cpu_rows.c - the CPU backend's element-wise ops (rmsnorm, rope, swiglu, axpy, the
 * MoE's gather and scatter) over a prefill chunk's rows, split over the thread pool.
 *
 * Why: these ran on the calling thread alone while the other waited. In a 512-token f16
 * prefill at 2 threads they were ~8% of the wall clock (rope's pow/sin/cos per token and pair
 * the largest, then swiglu's expf), which capped what a second core could give. Each output
 * element is computed by the same code in the same order whichever thread takes it, so the
 * bits do not depend on the split; small calls (a decode token) stay on the caller. */
#include "backend_cpu_rows.h"
#include "backend_cpu_attention.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* below this many floats of work a call is not worth waking the pool for */
#define ROWS_PARALLEL_MIN 16384

struct rows_job {
    void (*body)(const struct rows_job *j, int i0, int i1);
    int total, chunk, next;
    float *y, *k;
    const float *x, *g, *w;
    const int *rows;
    float a, eps, theta;
    int dim, n_head_q, n_head_k, pos;
    enum rope_kind kind;
    const double *freq;
};

static void rows_worker(void *p, int ith, int nth)
{
    struct rows_job *j = p;
    (void)ith; (void)nth;
    for (int i0; (i0 = cpu_claim(&j->next, j->chunk, j->total)) >= 0;)
        j->body(j, i0, i0 + j->chunk < j->total ? i0 + j->chunk : j->total);
}

/* body over [0, total) in chunks of chunk, on the pool when work (floats touched) is large */
static void rows_run(void *ctx, struct rows_job *j, size_t work)
{
    if (work < ROWS_PARALLEL_MIN || j->total <= j->chunk) {
        j->body(j, 0, j->total);
        return;
    }
    j->next = 0;
    cpu_pool_run(ctx, rows_worker, j);
}

static void rmsnorm_body(const struct rows_job *j, int t0, int t1)
{
    int dim = j->dim;
    for (int t = t0; t < t1; t++) {
        const float *v = j->x + (size_t)t * dim;
        float *o = j->y + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)v[i] * v[i];
        float s = 1.0f / sqrtf((float)(ss / dim) + j->eps);
        for (int i = 0; i < dim; i++)
            o[i] = v[i] * s * j->w[i];
    }
}

void cpu_rows_rmsnorm(void *ctx, const float *x, const float *wf, float *out, int dim, int n, float eps)
{
    int chunk = 8192 / (dim > 0 ? dim : 1);
    struct rows_job j = {.body = rmsnorm_body, .total = n, .chunk = chunk < 1 ? 1 : chunk, .y = out, .x = x,
                         .w = wf, .eps = eps, .dim = dim};
    rows_run(ctx, &j, (size_t)n * dim);
}

static void rotate_heads(float *vec, int n_heads, int head_dim, int i, float cs, float sn, enum rope_kind kind)
{
    int half = head_dim / 2;
    int i0 = kind == ROPE_NORM ? 2 * i : i, i1 = kind == ROPE_NORM ? 2 * i + 1 : i + half;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs - x1 * sn;
        v[i1] = x0 * sn + x1 * cs;
    }
}

/* The frequencies are the same pow() values whether made once per call or per token; each
 * (token, pair)'s angle, cos and sin are what the old per-token loop made, now shared by q
 * and k. */
static void rope_body(const struct rows_job *j, int t0, int t1)
{
    int hd = j->dim, half = hd / 2;
    for (int t = t0; t < t1; t++) {
        float *q = j->y + (size_t)t * j->n_head_q * hd;
        float *k = j->k ? j->k + (size_t)t * j->n_head_k * hd : NULL;
        for (int i = 0; i < half; i++) {
            double freq = j->freq ? j->freq[i] : pow((double)j->theta, -2.0 * i / hd);
            double a = (j->pos + t) * freq;
            float cs = (float)cos(a), sn = (float)sin(a);
            rotate_heads(q, j->n_head_q, hd, i, cs, sn, j->kind);
            if (k)
                rotate_heads(k, j->n_head_k, hd, i, cs, sn, j->kind);
        }
    }
}

#define ROPE_MAX_TABLE 512

void cpu_rows_rope(void *ctx, float *q, int n_head_q, float *k, int n_head_k, int n, int head_dim, int pos,
                   float theta, enum rope_kind kind)
{
    double freq[ROPE_MAX_TABLE];
    int half = head_dim / 2;
    bool table = half <= ROPE_MAX_TABLE;
    for (int i = 0; table && i < half; i++)
        freq[i] = pow((double)theta, -2.0 * i / head_dim);
    struct rows_job j = {.body = rope_body, .total = n, .chunk = 8, .y = q, .k = k, .theta = theta,
                         .dim = head_dim, .n_head_q = n_head_q, .n_head_k = k ? n_head_k : 0, .pos = pos,
                         .kind = kind, .freq = table ? freq : NULL};
    /* a rope pair costs a cos and a sin: count it as more than a float of work */
    rows_run(ctx, &j, (size_t)n * half * 64);
}

static void swiglu_body(const struct rows_job *j, int i0, int i1)
{
    float *gate = j->y;
    const float *up = j->x;
    for (int i = i0; i < i1; i++)
        gate[i] = cpu_silu_mul(gate[i], up[i]);
}

void cpu_rows_swiglu(void *ctx, float *gate, const float *up, int n)
{
    struct rows_job j = {.body = swiglu_body, .total = n, .chunk = 4096, .y = gate, .x = up};
    rows_run(ctx, &j, (size_t)n * 8); /* an expf is worth several floats of work */
}

static void axpy_body(const struct rows_job *j, int i0, int i1)
{
    float *y = j->y, a = j->a;
    const float *x = j->x;
    for (int i = i0; i < i1; i++)
        y[i] += a * x[i];
}

void cpu_rows_axpy(void *ctx, float *y, const float *x, float a, int n)
{
    struct rows_job j = {.body = axpy_body, .total = n, .chunk = 16384, .y = y, .x = x, .a = a};
    rows_run(ctx, &j, (size_t)n);
}

/* split over columns, so each element's adds keep the order of i even if rows repeat */
static void scatter_body(const struct rows_job *j, int c0, int c1)
{
    for (int i = 0; i < j->n_head_q; i++) {
        float *y = j->y + (size_t)j->rows[i] * j->dim;
        const float *x = j->x + (size_t)i * j->dim;
        float a = j->w[i];
        for (int c = c0; c < c1; c++)
            y[c] += a * x[c];
    }
}

void cpu_rows_scatter_axpy(void *ctx, float *y, const float *x, const int *rows, const float *w, int n, int dim)
{
    struct rows_job j = {.body = scatter_body, .total = dim, .chunk = 256, .y = y, .x = x, .rows = rows, .w = w,
                         .n_head_q = n, .dim = dim};
    rows_run(ctx, &j, (size_t)n * dim);
}

static void gather_body(const struct rows_job *j, int i0, int i1)
{
    for (int i = i0; i < i1; i++)
        memcpy(j->y + (size_t)i * j->dim, j->x + (size_t)j->rows[i] * j->dim, sizeof(float) * (size_t)j->dim);
}

void cpu_rows_gather(void *ctx, float *dst, const float *src, const int *rows, int n, int dim)
{
    struct rows_job j = {.body = gather_body, .total = n, .chunk = 8, .y = dst, .x = src, .rows = rows, .dim = dim};
    rows_run(ctx, &j, (size_t)n * dim);
}
