/* test_sample.c - backend_i.sample on the GPU (test-gpu sample) against its host form
 * (sample_rows.c, itself checked against a sorting reference by the unit tests).
 *
 * Random rows (Qwen3's 151,936 ids and smaller, gaussian at several scales, ties, NaN, -inf,
 * +inf) with random temperature / top_k / top_p / min_p and u, several rows a call: the GPU's
 * id must be the CPU's. The two differ only where a libm exp() rounds the last bit otherwise,
 * which moves a weight by one unit in 2^44: such a draw is a boundary case, recognised by the
 * CPU giving the GPU's id at u +- 1e-9; they are counted and must stay rare, anything else
 * fails. Then frequencies: a row of 64 live ids among 151,936 drawn 8,192 times, evenly spaced
 * u (each id within one count of N * p) and seeded random u (chi-square over the 64 ids). Also
 * prints the time of a step's worth of rows (32 x 151,936). */
#include "gpu_test.h"
#include "engine/sample_rows.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_RAND_SEED 0x2545F4914F6CDD1Dull
#include "../unit/test_rand.h"

static void random_row(float *l, int V, int shape)
{
    double scale = (double[]){0.05, 1, 3, 12, 60}[test_rand_next() % 5];
    for (int i = 0; i < V; i++) {
        double x = test_rand_normal() * scale;
        if (shape == 1)
            x = floor(x * 2) / 2;
        if (shape == 2)
            x = (double)(test_rand_next() % 3);
        l[i] = (float)x;
        if (shape == 3 && test_rand_next() % 7 == 0)
            l[i] = (test_rand_next() & 1) ? -INFINITY : NAN;
        if (shape == 4 && test_rand_next() % 500 == 0)
            l[i] = -0.0f;
    }
    if (shape == 3 && test_rand_next() % 4 == 0)
        l[test_rand_next() % V] = INFINITY;
    if (shape == 3 && test_rand_next() % 8 == 0) /* nothing to draw */
        for (int i = 0; i < V; i++)
            l[i] = -INFINITY;
}

static struct sample_row random_params(int V)
{
    static const float temps[] = {0.05f, 0.3f, 0.7f, 1.0f, 1.5f, 3.0f};
    static const float top_ps[] = {1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f, 0.999999f, 0.0f};
    static const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.2f, 0.5f, 1.0f, 2.0f};
    int top_ks[] = {0, 0, 1, 2, 5, 40, V - 1, V, V + 3};
    return (struct sample_row){.temperature = temps[test_rand_next() % 6], .top_k = top_ks[test_rand_next() % 9],
                               .top_p = top_ps[test_rand_next() % 8], .min_p = min_ps[test_rand_next() % 7], .u = test_rand_u()};
}

static int cpu_one(const float *l, int V, struct sample_row p)
{
    int32_t id = -1;
    sample_rows(l, 1, V, &p, &id);
    return id;
}

/* n rows of V on both backends: counts mismatches that are boundary cases (*edge) and those
 * that are not (returned). */
static int compare_rows(const float *l, int n, int V, const struct sample_row *p, int *edge)
{
    int32_t *want = malloc(sizeof(int32_t) * (size_t)n), *got = malloc(sizeof(int32_t) * (size_t)n);
    sample_rows(l, n, V, p, want);
    float *ld = dev_put(l, sizeof(float) * (size_t)n * V);
    int32_t *od = dev_put(NULL, sizeof(int32_t) * (size_t)n);
    dev_poison(od, sizeof(int32_t) * (size_t)n);
    gpu.i->sample(gpu.ctx, ld, n, V, p, od, NULL);
    gpu.i->download(gpu.ctx, got, od, sizeof(int32_t) * (size_t)n);
    int bad = 0;
    for (int r = 0; r < n; r++) {
        if (got[r] == want[r])
            continue;
        const float *row = l + (size_t)r * V;
        struct sample_row lo = p[r], hi = p[r];
        lo.u -= 1e-9;
        hi.u += 1e-9;
        if (got[r] >= 0 && got[r] < V && (cpu_one(row, V, lo) == got[r] || cpu_one(row, V, hi) == got[r])) {
            (*edge)++;
            continue;
        }
        if (bad++ < 5)
            printf("  sample: V %d row %d T %g top_k %d top_p %g min_p %g u %.17g: gpu %d, cpu %d\n", V, r,
                   p[r].temperature, p[r].top_k, p[r].top_p, p[r].min_p, p[r].u, got[r], want[r]);
    }
    gpu.i->free(gpu.ctx, ld);
    gpu.i->free(gpu.ctx, od);
    free(want);
    free(got);
    return bad;
}

/* ids drawn from one row for u[0..n) on the GPU, 64 rows (copies of it) a call */
static void gpu_draws(const float *row, int V, struct sample_row p, const double *u, int n, int32_t *ids)
{
    enum { R = 64 };
    float *ld = gpu.i->alloc(gpu.ctx, sizeof(float) * (size_t)R * V);
    int32_t *od = dev_put(NULL, sizeof(int32_t) * R);
    for (int r = 0; r < R; r++)
        gpu.i->upload(gpu.ctx, ld + (size_t)r * V, row, sizeof(float) * (size_t)V);
    struct sample_row ps[R];
    for (int j0 = 0; j0 < n; j0 += R) {
        int k = n - j0 < R ? n - j0 : R;
        for (int r = 0; r < k; r++) {
            ps[r] = p;
            ps[r].u = u[j0 + r];
        }
        gpu.i->sample(gpu.ctx, ld, k, V, ps, od, NULL);
        gpu.i->download(gpu.ctx, ids + j0, od, sizeof(int32_t) * (size_t)k);
    }
    gpu.i->free(gpu.ctx, ld);
    gpu.i->free(gpu.ctx, od);
}

/* 64 live ids (logits ~ N(0, 1), at random places) among V at -30 or -inf: the probabilities
 * of the live ones under p (top_k 0 or one that cuts inside them, no top_p / min_p), in prob. */
static bool frequencies(int V, struct sample_row p, double *chi2_out, int *off_out)
{
    enum { LIVE = 64, N = 8192 };
    float *row = malloc(sizeof(float) * (size_t)V);
    int live[LIVE];
    double w[LIVE], s = 0, prob[LIVE];
    for (int i = 0; i < V; i++)
        row[i] = i % 2 ? -INFINITY : -1e4f; /* weight 0 (exp underflows), never drawn */
    for (int j = 0; j < LIVE; j++) {
        int id;
        do
            id = (int)(test_rand_next() % (uint64_t)V);
        while (row[id] > -1e4f);
        row[id] = (float)test_rand_normal();
        live[j] = id;
    }
    float kth = -INFINITY;
    if (p.top_k > 0) { /* the top_k-th largest live logit */
        float v[LIVE];
        for (int j = 0; j < LIVE; j++)
            v[j] = row[live[j]];
        for (int a = 0; a < p.top_k; a++)
            for (int b = a + 1; b < LIVE; b++)
                if (v[b] > v[a]) {
                    float t = v[a];
                    v[a] = v[b];
                    v[b] = t;
                }
        kth = v[p.top_k - 1];
    }
    float m = -INFINITY;
    for (int j = 0; j < LIVE; j++)
        m = row[live[j]] > m ? row[live[j]] : m;
    for (int j = 0; j < LIVE; j++) {
        w[j] = row[live[j]] >= kth ? exp(((double)row[live[j]] - m) / p.temperature) : 0;
        s += w[j];
    }
    for (int j = 0; j < LIVE; j++)
        prob[j] = w[j] / s;
    double *u = malloc(sizeof(double) * N);
    int32_t *ids = malloc(sizeof(int32_t) * N);
    int count[LIVE], off = 0, stray = 0;
    /* evenly spaced u: within one count of N p */
    for (int j = 0; j < N; j++)
        u[j] = (j + 0.5) / N;
    gpu_draws(row, V, p, u, N, ids);
    memset(count, 0, sizeof count);
    for (int j = 0; j < N; j++) {
        int k = 0;
        while (k < LIVE && live[k] != ids[j])
            k++;
        if (k == LIVE)
            stray++;
        else
            count[k]++;
    }
    for (int j = 0; j < LIVE; j++)
        off += fabs(count[j] - N * prob[j]) > 1.0 + 1e-6 * N;
    /* random u: chi-square over the ids that can be drawn */
    for (int j = 0; j < N; j++)
        u[j] = test_rand_u();
    gpu_draws(row, V, p, u, N, ids);
    memset(count, 0, sizeof count);
    for (int j = 0; j < N; j++)
        for (int k = 0; k < LIVE; k++)
            if (live[k] == ids[j])
                count[k]++;
    /* a bin per id expected 5 times or more, the rarer drawable ids pooled into one */
    double chi2 = 0, pool_want = 0;
    int df = -1, pool = 0;
    for (int j = 0; j < LIVE; j++) {
        double want = N * prob[j];
        if (prob[j] == 0) {
            stray += count[j];
        } else if (want < 5) {
            pool_want += want;
            pool += count[j];
        } else {
            chi2 += (count[j] - want) * (count[j] - want) / want;
            df++;
        }
    }
    if (pool_want >= 5) {
        chi2 += (pool - pool_want) * (pool - pool_want) / pool_want;
        df++;
    }
    free(row);
    free(u);
    free(ids);
    *chi2_out = chi2;
    *off_out = off + stray;
    /* chi-square with df degrees of freedom: mean df, sd sqrt(2 df); 6 sd is a broken sampler */
    return off == 0 && stray == 0 && chi2 < df + 6 * sqrt(2.0 * df);
}

void test_sample(void)
{
    if (!gpu.i->sample) {
        printf("SKIPPED sample (the CUDA backend has no sample slot)\n");
        return;
    }
    static const int Vs[] = {151936, 151936, 32000, 1000, 7, 2, 1};
    enum { ROWS = 24 };
    int bad = 0, edge = 0, draws = 0;
    float *l = malloc(sizeof(float) * 32 * 151936); /* ROWS, and 32 for the timing */
    struct sample_row p[ROWS];
    for (int vi = 0; vi < 7; vi++) {
        int V = Vs[vi];
        for (int rep = 0; rep < (V > 100000 ? 6 : 12); rep++) {
            for (int r = 0; r < ROWS; r++) {
                random_row(l + (size_t)r * V, V, (rep + r) % 5);
                p[r] = random_params(V);
                if (r % 6 == 0) /* the ends of u */
                    p[r].u = r % 12 == 0 ? 0.0 : 1.0 - 0x1p-53;
            }
            bad += compare_rows(l, ROWS, V, p, &edge);
            draws += ROWS;
        }
    }
    printf("  sample: %d rows compared, %d differ at a boundary (u within 1e-9), %d otherwise\n", draws, edge, bad);
    bool ok = bad == 0 && edge * 200 <= draws;

    /* the same rows twice: the same ids (no atomics, no timing in the result) */
    {
        int V = 151936;
        for (int r = 0; r < ROWS; r++) {
            random_row(l + (size_t)r * V, V, 0);
            p[r] = random_params(V);
        }
        float *ld = dev_put(l, sizeof(float) * (size_t)ROWS * V);
        int32_t *od = dev_put(NULL, sizeof(int32_t) * ROWS), a[ROWS], b[ROWS];
        gpu.i->sample(gpu.ctx, ld, ROWS, V, p, od, NULL);
        gpu.i->download(gpu.ctx, a, od, sizeof a);
        gpu.i->sample(gpu.ctx, ld, ROWS, V, p, od, NULL);
        gpu.i->download(gpu.ctx, b, od, sizeof b);
        if (memcmp(a, b, sizeof a)) {
            ok = false;
            printf("  sample: two runs of the same rows differ\n");
        }
        gpu.i->free(gpu.ctx, ld);
        gpu.i->free(gpu.ctx, od);
    }

    struct sample_row fp[] = {{.temperature = 1.0f}, {.temperature = 0.7f, .top_k = 20}, {.temperature = 1.6f}};
    for (int c = 0; c < 3; c++) {
        double chi2;
        int off;
        bool f = frequencies(151936, fp[c], &chi2, &off);
        printf("  sample: frequencies T %g top_k %d: chi2 %.1f over the drawable ids, %d ids off N*p by > 1\n",
               fp[c].temperature, fp[c].top_k, chi2, off);
        ok = ok && f;
    }

    /* a decode step's worth: 32 rows of Qwen3's vocabulary */
    {
        enum { B = 32 };
        int V = 151936;
        for (int r = 0; r < B; r++)
            random_row(l + (size_t)r * V, V, 0);
        float *ld = dev_put(l, sizeof(float) * (size_t)B * V);
        int32_t *od = dev_put(NULL, sizeof(int32_t) * B), ids[B];
        struct sample_row plain[B], cut[B];
        for (int r = 0; r < B; r++) {
            plain[r] = (struct sample_row){.temperature = 1.0f, .top_p = 1.0f, .u = test_rand_u()};
            cut[r] = (struct sample_row){.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .u = test_rand_u()};
        }
        double ms[2];
        for (int c = 0; c < 2; c++) {
            gpu.i->sample(gpu.ctx, ld, B, V, c ? cut : plain, od, NULL); /* warm */
            gpu.i->download(gpu.ctx, ids, od, sizeof ids);
            double t0 = now_s();
            for (int k = 0; k < 20; k++)
                gpu.i->sample(gpu.ctx, ld, B, V, c ? cut : plain, od, NULL);
            gpu.i->download(gpu.ctx, ids, od, sizeof ids);
            ms[c] = (now_s() - t0) / 20 * 1e3;
        }
        double c0 = now_s();
        sample_rows(l, B, V, plain, ids);
        double cpu_ms = (now_s() - c0) * 1e3;
        printf("  sample: 32 rows x 151936: %.3f ms (T 1), %.3f ms (top_k 40, top_p 0.95, min_p 0.05); the host "
               "form %.1f ms\n", ms[0], ms[1], cpu_ms);
        gpu.i->free(gpu.ctx, ld);
        gpu.i->free(gpu.ctx, od);
    }
    free(l);
    verdict("sample", ok, "%.0f rows differ beyond a boundary", (double)bad);
}
