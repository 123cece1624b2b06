/* prof-cpu-prefill.c - the ops of one prefill chunk on the CPU backend, timed: the engine driven
 * directly (no HTTP), every backend_i slot a forward prefill uses wrapped with wall-clock and
 * process CPU-time (CLOCK_PROCESS_CPUTIME_ID) timers, so an op whose CPU time at 2 threads is
 * its wall time ran on one thread while the other waited (or spun). docs/BENCHMARKS.md "CPU
 * prefill: the second core".
 *   make CUDA_HOME=/nonexistent build/libtide.a
 *   gcc -O2 -Isrc -o /tmp/prof scripts/prof-cpu-prefill.c build/libtide.a \
 *       -lmicrohttpd -lcjson -lpcre2-8 -lnettle -lm -pthread
 *   /tmp/prof MODEL.gguf THREADS [CHUNK=512] [REPS=3]   (NOPROF=1: the totals only, unwrapped)
 * One untimed 512-token prefill first (the first touch of each weight page), then REPS timed. */
#include "engine/forward.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double wnow(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static double cnow(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
enum {
    O_MMD,
    O_MME,
    O_MMADD,
    O_MM3,
    O_NORM,
    O_QKR,
    O_ATT,
    O_SWI,
    O_AXPY,
    O_SCAT,
    O_GATH,
    O_ROUTE,
    O_ROWS,
    O_ZERO,
    O_N
};
static const char *nm[O_N] = {"matmul n=chunk", "matmul expert", "matmul_add", "matmul3", "rmsnorm",
                              "qk_norm_rope",   "attention",     "swiglu",     "axpy",    "scatter_axpy",
                              "gather_rows",    "route",         "get_rows",   "zero"};
static double tw[O_N], tc[O_N];
static long cnt[O_N];
static int on;
static struct backend_i W;
static const struct backend_i *R;
static int chunk;
#define T0 double w0 = wnow(), c0 = cnow();
#define T1(o)                                                                                                          \
    if (on) {                                                                                                          \
        tw[o] += wnow() - w0;                                                                                          \
        tc[o] += cnow() - c0;                                                                                          \
        cnt[o]++;                                                                                                      \
    }
static void mm(void *c, const struct tensor *w, const float *x, float *y, int n)
{
    T0 R->matmul(c, w, x, y, n);
    T1(n == chunk ? O_MMD : O_MME)
}
static void mma(void *c, const struct tensor *w, const float *x, float *y, int n)
{
    T0 R->matmul_add(c, w, x, y, n);
    T1(O_MMADD)
}
static void mm3(void *c, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                const struct tensor *no, float e, float *xn)
{
    T0 R->matmul3(c, w, x, y, n, no, e, xn);
    T1(O_MM3)
}
static void nrm(void *c, const float *x, const struct tensor *w, float *o, int d, int n, float e)
{
    T0 R->rmsnorm(c, x, w, o, d, n, e);
    T1(O_NORM)
}
static void qkr(void *c, float *q, float *k, const struct tensor *qn, const struct tensor *kn, int n, int nh, int nkv,
                int hd, int pos, float th, enum rope_kind kd, float e)
{
    T0 R->qk_norm_rope(c, q, k, qn, kn, n, nh, nkv, hd, pos, th, kd, e);
    T1(O_QKR)
}
static void att(void *c, const float *q, const float *kc, const float *vc, float *o, float *a, int n, int pos, int nh,
                int nkv, int hd)
{
    T0 R->attention(c, q, kc, vc, o, a, n, pos, nh, nkv, hd);
    T1(O_ATT)
}
static void swi(void *c, float *g, const float *u, int n)
{
    T0 R->swiglu(c, g, u, n);
    T1(O_SWI)
}
static void axp(void *c, float *y, const float *x, float a, int n)
{
    T0 R->axpy(c, y, x, a, n);
    T1(O_AXPY)
}
static void sca(void *c, float *y, const float *x, const int *r, const float *w, int n, int d)
{
    T0 R->scatter_axpy(c, y, x, r, w, n, d);
    T1(O_SCAT)
}
static void gat(void *c, float *d, const float *s, const int *r, int n, int dm)
{
    T0 R->gather_rows(c, d, s, r, n, dm);
    T1(O_GATH)
}
static void rou(void *c, const float *l, int n, int ne, int k, bool no, int32_t *o)
{
    T0 R->route(c, l, n, ne, k, no, o);
    T1(O_ROUTE)
}
static void gr(void *c, const struct tensor *t, const int *ids, int n, float *o)
{
    T0 R->get_rows(c, t, ids, n, o);
    T1(O_ROWS)
}
static void zr(void *c, float *x, int n)
{
    T0 R->zero(c, x, n);
    T1(O_ZERO)
}
int main(int argc, char **argv)
{
    struct model m;
    char err[256];
    if (model_load(&m, argv[1], err, sizeof(err)) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct backend be;
    backend_cpu_init(&be, atoi(argv[2]));
    chunk = argc > 3 ? atoi(argv[3]) : 512;
    int prof = !getenv("NOPROF");
    R = be.i;
    W = *R;
    W.matmul = mm;
    W.matmul_add = mma;
    W.matmul3 = mm3;
    W.rmsnorm = nrm;
    W.qk_norm_rope = qkr;
    W.attention = att;
    W.swiglu = swi;
    W.axpy = axp;
    W.scatter_axpy = sca;
    W.gather_rows = gat;
    W.route = rou;
    W.get_rows = gr;
    W.zero = zr;
    if (prof)
        be.i = &W;
    struct forward_state f;
    struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer};
    if (forward_init_stages(&f, &m, 1024, 1, chunk, &sp, 1) < 0 || forward_setup_prefill(&f, 0, PREFILL_OWN) < 0)
        return 1;
    int n = 512, toks[512];
    for (int i = 0; i < 512; i++)
        toks[i] = (i * 7 + 1) % (int)m.cfg.n_vocab;
    if (forward_eval(&f, toks, n, 0) < 0)
        return 1;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    on = 1;
    double w0 = wnow(), c0 = cnow();
    for (int r = 0; r < reps; r++)
        if (forward_eval(&f, toks, n, 0) < 0)
            return 1;
    double w = wnow() - w0, c = cnow() - c0;
    printf("threads %s chunk %d: prefill %.0f tok/s wall, %.0f tok/cpu-s (cpu/wall %.2f)\n", argv[2], chunk,
           reps * n / w, reps * n / c, c / w);
    double sw = 0;
    for (int o = 0; o < O_N; o++)
        if (cnt[o]) {
            sw += tw[o];
            printf("  %-16s %6ld calls  wall %7.1f ms (%4.1f%%)  cpu %7.1f ms  cpu/wall %.2f\n", nm[o], cnt[o] / reps,
                   tw[o] * 1e3 / reps, 100 * tw[o] / w, tc[o] * 1e3 / reps, tc[o] / tw[o]);
        }
    if (prof)
        printf("  %-16s wall %7.1f ms (%4.1f%%)\n", "unwrapped", (w - sw) * 1e3 / reps, 100 * (w - sw) / w);
    return 0;
}
