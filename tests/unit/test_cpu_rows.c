/* test_cpu_rows.c - the CPU backend's element-wise ops over a prefill chunk (backend_cpu_rows.c:
 * rmsnorm, head norms and rope, swiglu, axpy, the MoE's gather and scatter): against double-
 * precision references, and the same bits on 1, 2 and 3 threads (the ops split over the pool
 * when a chunk is large) and token by token (a decode step's calls stay on the caller). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#define TEST_RAND_SEED 0x2545f4914f6cdd1dULL
#include "test_rand.h"

enum { N = 96, H = 8, HKV = 2, HD = 64, DIM = H * HD, KD = HKV * HD, POS = 37, NS = 40 };
#define THETA 10000.0f
#define EPS 1e-5f

/* uniform in [-1, 1) on a grid of 2^-23 (its own scale, over the shared generator) */
static float frand24(void) { return (float)((test_rand_next() >> 40) / (double)(1 << 24)) * 2.0f - 1.0f; }

struct outs {
    float q[N * DIM], k[N * KD], norm[N * DIM], gate[N * DIM], y[N * DIM], gathered[NS * DIM];
};

static const int rows[NS] = {5, 0, 95, 17, 17, 33, 2, 80, 81, 9, 64, 12, 3, 44, 45, 46, 47, 90, 91, 7,
                             50, 51, 52, 1, 60, 61, 62, 63, 70, 71, 72, 73, 20, 21, 22, 23, 24, 25, 26, 27};

/* every op once over the whole chunk (step 0) or a token at a time (step 1) */
static void run_ops(const struct backend *be, const float *x, const float *up, const float *qn, const float *kn,
                    const float *nw, float *wt, int step, struct outs *o)
{
    struct tensor tq = {GGML_TYPE_F32, {HD, 1}, qn, HD * 4}, tk = {GGML_TYPE_F32, {HD, 1}, kn, HD * 4};
    struct tensor tn = {GGML_TYPE_F32, {DIM, 1}, nw, DIM * 4};
    memcpy(o->q, x, sizeof(o->q));
    memcpy(o->k, x, sizeof(o->k));
    memcpy(o->gate, x, sizeof(o->gate));
    memset(o->y, 0, sizeof(o->y));
    int per = step ? 1 : N;
    for (int t = 0; t < N; t += per) {
        be->i->qk_norm_rope(be->ctx, o->q + t * DIM, o->k + t * KD, &tq, &tk, per, H, HKV, HD, POS + t, THETA,
                            ROPE_NEOX, EPS);
        be->i->rmsnorm(be->ctx, x + t * DIM, &tn, o->norm + t * DIM, DIM, per, EPS);
        be->i->swiglu(be->ctx, o->gate + t * DIM, up + t * DIM, per * DIM);
        be->i->axpy(be->ctx, o->y + t * DIM, x + t * DIM, 0.5f, per * DIM);
    }
    be->i->gather_rows(be->ctx, o->gathered, x, rows, NS, DIM);
    be->i->scatter_axpy(be->ctx, o->y, o->gathered, rows, wt, NS, DIM);
}

Test(cpu_rows, ops_match_double_references_and_bits_on_any_thread_count)
{
    static float x[N * DIM], up[N * DIM], qn[HD], kn[HD], nw[DIM], wt[NS];
    for (int i = 0; i < N * DIM; i++) x[i] = 2.0f * frand24(), up[i] = frand24();
    for (int i = 0; i < HD; i++) qn[i] = 1.0f + 0.5f * frand24(), kn[i] = 1.0f + 0.5f * frand24();
    for (int i = 0; i < DIM; i++) nw[i] = 1.0f + 0.5f * frand24();
    for (int i = 0; i < NS; i++) wt[i] = frand24();
    struct outs *o[4];
    for (int threads = 1; threads <= 3; threads++) {
        struct backend be;
        cr_assert_eq(backend_cpu_init(&be, threads), 0);
        o[threads - 1] = malloc(sizeof(struct outs));
        run_ops(&be, x, up, qn, kn, nw, wt, 0, o[threads - 1]);
        if (threads == 2) {
            o[3] = malloc(sizeof(struct outs));
            run_ops(&be, x, up, qn, kn, nw, wt, 1, o[3]);
        }
        backend_cpu_free(&be);
    }
    for (int i = 1; i < 4; i++)
        cr_assert(memcmp(o[0], o[i], sizeof(struct outs)) == 0, "results differ (%s)",
                  i == 3 ? "token by token" : i == 1 ? "2 threads" : "3 threads");
    const struct outs *r = o[0];
    for (int t = 0; t < N; t++) {
        /* q: head norm then neox rope at POS + t; k the same with kn over its KD floats */
        for (int h = 0; h < H; h++) {
            const float *v = x + t * DIM + h * HD;
            double ss = 0, nv[HD];
            for (int i = 0; i < HD; i++) ss += (double)v[i] * v[i];
            for (int i = 0; i < HD; i++) nv[i] = v[i] / sqrt(ss / HD + EPS) * qn[i];
            for (int i = 0; i < HD / 2; i++) {
                double a = (POS + t) * pow(THETA, -2.0 * i / HD);
                double e0 = nv[i] * cos(a) - nv[i + HD / 2] * sin(a), e1 = nv[i] * sin(a) + nv[i + HD / 2] * cos(a);
                cr_assert_leq(fabs(r->q[t * DIM + h * HD + i] - e0), 1e-5 + 1e-5 * fabs(e0), "q t %d h %d i %d", t, h, i);
                cr_assert_leq(fabs(r->q[t * DIM + h * HD + i + HD / 2] - e1), 1e-5 + 1e-5 * fabs(e1));
            }
        }
        double ss = 0;
        for (int i = 0; i < DIM; i++) ss += (double)x[t * DIM + i] * x[t * DIM + i];
        for (int i = 0; i < DIM; i++) {
            double e = x[t * DIM + i] / sqrt(ss / DIM + EPS) * nw[i], g = x[t * DIM + i];
            cr_assert_leq(fabs(r->norm[t * DIM + i] - e), 1e-5 + 1e-5 * fabs(e), "rmsnorm t %d i %d", t, i);
            double s = g / (1.0 + exp(-g)) * up[t * DIM + i];
            cr_assert_leq(fabs(r->gate[t * DIM + i] - s), 1e-6 + 1e-5 * fabs(s), "swiglu t %d i %d", t, i);
        }
    }
    for (int t = 0; t < N; t++) /* y = 0.5 x plus every scattered weighted row */
        for (int i = 0; i < DIM; i++) {
            double e = 0.5 * x[t * DIM + i];
            for (int s = 0; s < NS; s++)
                if (rows[s] == t)
                    e += (double)wt[s] * x[t * DIM + i];
            cr_assert_leq(fabs(r->y[t * DIM + i] - e), 1e-5 + 1e-5 * fabs(e), "y t %d i %d", t, i);
        }
    for (int s = 0; s < NS; s++)
        cr_assert(memcmp(r->gathered + s * DIM, x + rows[s] * DIM, sizeof(float) * DIM) == 0, "gather %d", s);
    for (int i = 0; i < 4; i++)
        free(o[i]);
}
