/* test_sample_rows.c - backend_i.sample's host form (sample_rows.c) against a plain reference:
 * sort the candidates, softmax in double, cut top_k / top_p / min_p on the sorted list, then
 * walk the kept ids in ascending order. The two must pick the same id for every u that does
 * not land within a hair (1e-9 of the mass) of a boundary, where the op's 2^-44 fixed point
 * may round the other way; those are counted and must stay rare. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample_rows.h"

#define AMBIGUOUS (-2)
#define EPS 1e-9

#define TEST_RAND_SEED 0x243F6A8885A308D3ull
#include "test_rand.h"

struct rc {
    double x;
    int id;
    double w;
    bool kept;
};

static int by_x_desc(const void *a, const void *b)
{
    const struct rc *p = a, *q = b;
    return p->x < q->x ? 1 : p->x > q->x ? -1 : p->id - q->id;
}
static int by_id(const void *a, const void *b) { return ((const struct rc *)a)->id - ((const struct rc *)b)->id; }

/* The reference: the id drawn, or AMBIGUOUS when a cut or the draw is within EPS of a boundary.
 * probs (n_vocab, optional): each id's probability after the cuts. */
static int reference(const float *l, int V, const struct sample_row *p, double *probs)
{
    struct rc *c = malloc(sizeof(*c) * (size_t)V);
    int n = 0;
    for (int i = 0; i < V; i++) {
        float v = l[i];
        if (isnan(v) || v == -INFINITY)
            continue;
        c[n++] = (struct rc){v == INFINITY ? FLT_MAX : v, i, 0, true};
    }
    if (probs)
        memset(probs, 0, sizeof(double) * (size_t)V);
    if (n == 0) {
        free(c);
        return 0;
    }
    qsort(c, (size_t)n, sizeof(*c), by_x_desc);
    bool amb = false;
    int m = n;
    if (p->top_k > 0 && p->top_k < n) {
        double tau = c[p->top_k - 1].x;
        m = p->top_k;
        while (m < n && c[m].x >= tau)
            m++;
    }
    double t = p->temperature > 0 ? p->temperature : FLT_MIN, s1 = 0;
    for (int j = 0; j < m; j++) { /* the definition's floor: under half of 2^-44 of the best weighs nothing */
        c[j].w = exp((c[j].x - c[0].x) / t);
        if (fabs(c[j].w * 0x1p44 - 0.5) < 1e-3)
            amb = true;
        if (c[j].w * 0x1p44 < 0.5)
            c[j].w = 0;
        s1 += c[j].w;
    }
    if (p->top_p > 0 && p->top_p < 1) {
        double target = p->top_p * s1, cum = 0;
        int j = 0;
        while (j < m) { /* whole groups of equal logits */
            int g = j;
            while (g < m && c[g].x == c[j].x)
                cum += c[g++].w;
            if (fabs(cum - target) < EPS * s1)
                amb = true;
            j = g;
            if (cum >= target)
                break;
        }
        m = j;
    }
    if (p->min_p > 0) {
        double mp = p->min_p < 1 ? p->min_p : 1;
        int k = 0;
        for (int j = 0; j < m; j++) {
            if (c[j].w != 1 && fabs(c[j].w - mp) < EPS) /* the best weighs exactly 1 */
                amb = true;
            if (c[j].w >= mp)
                c[k++] = c[j];
        }
        m = k;
    }
    qsort(c, (size_t)m, sizeof(*c), by_id);
    double s = 0;
    for (int j = 0; j < m; j++)
        s += c[j].w;
    if (probs)
        for (int j = 0; j < m; j++)
            probs[c[j].id] = c[j].w / s;
    double r = (p->u >= 0 ? p->u : 0) * s, cum = 0;
    int id = c[m - 1].id;
    for (int j = 0; j < m; j++) {
        double before = cum;
        cum += c[j].w;
        if (cum > r) {
            id = c[j].id;
            if ((before > 0 && r - before < EPS * s) || (cum < s && cum - r < EPS * s)) /* not the ends */
                amb = true;
            break;
        }
    }
    free(c);
    return amb ? AMBIGUOUS : id;
}

static int op(const float *l, int V, struct sample_row p)
{
    int32_t out = -1;
    cr_assert_eq(sample_rows(l, 1, V, &p, &out), 0);
    cr_assert(out >= 0 && out < V, "id %d of %d", out, V);
    return out;
}

/* A random row of V logits in one of several shapes: gaussian at a scale, quantised to a few
 * levels (many ties), with -inf / NaN / +inf sprinkled in. */
static void random_row(float *l, int V, int shape)
{
    double scale = (double[]){0.05, 1, 3, 12, 60}[test_rand_next() % 5];
    for (int i = 0; i < V; i++) {
        double x = test_rand_normal() * scale;
        if (shape == 1)
            x = floor(x * 2) / 2; /* ties */
        if (shape == 2)
            x = (double)(test_rand_next() % 3); /* three levels */
        l[i] = (float)x;
        if (shape == 3 && test_rand_next() % 7 == 0)
            l[i] = (test_rand_next() & 1) ? -INFINITY : NAN;
        if (shape == 4 && test_rand_next() % 500 == 0)
            l[i] = -0.0f;
    }
    if (shape == 3 && test_rand_next() % 4 == 0)
        l[test_rand_next() % V] = INFINITY;
}

static struct sample_row random_params(int V)
{
    static const float temps[] = {0.05f, 0.3f, 0.7f, 1.0f, 1.5f, 3.0f};
    static const float top_ps[] = {1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f, 0.999999f, 0.0f};
    static const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.2f, 0.5f, 1.0f, 2.0f};
    int top_ks[] = {0, 0, 1, 2, 5, 40, V - 1, V, V + 3};
    struct sample_row p = {
        .temperature = temps[test_rand_next() % 6],
        .top_k = top_ks[test_rand_next() % 9],
        .top_p = top_ps[test_rand_next() % 8],
        .min_p = min_ps[test_rand_next() % 7],
    };
    return p;
}

Test(sample_rows, matches_the_sorted_reference, .timeout = 120)
{
    static const int Vs[] = {1, 2, 3, 7, 64, 1000, 5000};
    int rows = 0, draws = 0, amb = 0;
    float *l = malloc(sizeof(float) * 5000);
    for (int vi = 0; vi < 7; vi++)
        for (int k = 0; k < 120; k++, rows++) {
            int V = Vs[vi];
            random_row(l, V, k % 5);
            struct sample_row p = random_params(V);
            for (int d = 0; d < 12; d++, draws++) {
                p.u = d == 0 ? 0.0 : d == 1 ? 1.0 - 0x1p-53 : test_rand_u();
                int want = reference(l, V, &p, NULL), got = op(l, V, p);
                if (want == AMBIGUOUS) {
                    amb++;
                    continue;
                }
                cr_assert_eq(got, want, "V %d shape %d T %g top_k %d top_p %g min_p %g u %.17g: op %d, reference %d", V,
                             k % 5, p.temperature, p.top_k, p.top_p, p.min_p, p.u, got, want);
            }
        }
    printf("sample_rows: %d rows, %d draws, %d near a boundary (skipped)\n", rows, draws, amb);
    cr_expect(amb * 100 < draws, "%d of %d draws near a boundary", amb, draws);
    free(l);
}

/* Evenly spaced u: the draw is a step function of u over the kept ids, so N points give each id
 * within one count of N times its probability. */
Test(sample_rows, frequencies_follow_the_probabilities)
{
    enum { V = 300, N = 20000 };
    float l[V];
    double prob[V];
    int count[V];
    struct sample_row ps[] = {
        {.temperature = 1.0f, .top_p = 1.0f},
        {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f},
        {.temperature = 1.3f, .top_p = 0.5f, .min_p = 0.05f},
        {.temperature = 2.0f, .min_p = 0.1f},
    };
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < V; i++) /* a spread that keeps many ids; ties in the last case */
            l[i] = c == 3 ? (float)(floor(test_rand_normal() * 4) / 4) : (float)test_rand_normal();
        struct sample_row p = ps[c];
        p.u = 0;
        reference(l, V, &p, prob);
        memset(count, 0, sizeof count);
        for (int j = 0; j < N; j++) {
            p.u = (j + 0.5) / N;
            count[op(l, V, p)]++;
        }
        double chi2 = 0;
        int kept = 0;
        for (int i = 0; i < V; i++) {
            double want = N * prob[i];
            cr_assert(fabs(count[i] - want) <= 1.0 + 1e-6 * N, "case %d id %d: %d draws, expected %.2f", c, i, count[i],
                      want);
            if (prob[i] > 0) {
                kept++;
                chi2 += (count[i] - want) * (count[i] - want) / want;
            }
        }
        cr_expect(kept >= 2, "case %d keeps %d ids", c, kept);
        cr_expect(chi2 < kept, "case %d: chi2 %.2f over %d ids", c, chi2, kept);
    }
}

static void sweep(const float *l, int V, struct sample_row p, int *count, int N)
{
    memset(count, 0, sizeof(int) * (size_t)V);
    for (int j = 0; j < N; j++) {
        p.u = (j + 0.5) / N;
        count[op(l, V, p)]++;
    }
}

Test(sample_rows, nan_and_minus_inf_are_never_drawn)
{
    enum { V = 200 };
    float l[V];
    int count[V];
    for (int i = 0; i < V; i++)
        l[i] = i % 3 == 0 ? -INFINITY : i % 3 == 1 ? NAN : 0.01f * (float)(i % 17);
    sweep(l, V, (struct sample_row){.temperature = 50.0f, .top_p = 1.0f}, count, 5000);
    for (int i = 0; i < V; i++)
        if (i % 3 != 2)
            cr_assert_eq(count[i], 0, "id %d (logit %g) drawn %d times", i, l[i], count[i]);
    /* nothing to draw: id 0 */
    for (int i = 0; i < V; i++)
        l[i] = i & 1 ? NAN : -INFINITY;
    cr_assert_eq(op(l, V, (struct sample_row){.temperature = 1.0f, .u = 0.7}), 0);
    /* one finite logit among them: always that one */
    l[123] = -5.0f;
    for (int j = 0; j < 50; j++)
        cr_assert_eq(op(l, V, (struct sample_row){.temperature = 1.0f, .top_k = 3, .top_p = 0.2f, .u = j / 50.0}), 123);
}

Test(sample_rows, plus_inf_shares_everything)
{
    float l[6] = {0.0f, INFINITY, 5.0f, INFINITY, NAN, 1e30f};
    int count[6];
    sweep(l, 6, (struct sample_row){.temperature = 1.0f}, count, 1000);
    cr_expect(count[1] == 500 && count[3] == 500, "+inf ids drawn %d and %d of 1000", count[1], count[3]);
}

/* within one draw of the expected count (the weights are exp()s, not exact fractions) */
static bool near(int count, double want) { return fabs(count - want) <= 1.0; }

Test(sample_rows, top_k_keeps_every_tie_of_its_threshold)
{
    float l[8] = {1, 3, 3, 0, 3, 2, -1, 3};
    int count[8];
    sweep(l, 8, (struct sample_row){.temperature = 1.0f, .top_k = 2}, count, 4000);
    for (int i = 0; i < 8; i++)
        cr_expect(near(count[i], l[i] == 3 ? 1000 : 0), "id %d drawn %d times", i, count[i]);
    /* top_k 5: the four 3s and the 2, about evenly at a high temperature */
    sweep(l, 8, (struct sample_row){.temperature = 1e6f, .top_k = 5}, count, 5000);
    for (int i = 0; i < 8; i++)
        cr_expect(near(count[i], l[i] >= 2 ? 1000 : 0), "id %d drawn %d times", i, count[i]);
}

Test(sample_rows, top_p_and_min_p_cut_by_probability)
{
    /* at T 1 the probabilities of ids 0..3 are about 1/2, 1/4, 1/8, 1/8 (ids 2 and 3 tie) */
    float l[4] = {logf(4), logf(2), 0, 0};
    int c[4];
    sweep(l, 4, (struct sample_row){.temperature = 1.0f, .top_p = 0.45f}, c, 800);
    cr_expect(c[0] == 800, "top_p 0.45: the best alone reaches it (%d %d %d %d)", c[0], c[1], c[2], c[3]);
    sweep(l, 4, (struct sample_row){.temperature = 1.0f, .top_p = 0.7f}, c, 1200);
    cr_expect(near(c[0], 800) && near(c[1], 400) && c[2] + c[3] == 0, "top_p 0.7: %d %d %d %d", c[0], c[1], c[2], c[3]);
    /* top_p 0.8 reaches into the tie of ids 2 and 3: both stay */
    sweep(l, 4, (struct sample_row){.temperature = 1.0f, .top_p = 0.8f}, c, 800);
    cr_expect(near(c[0], 400) && near(c[1], 200) && near(c[2], 100) && near(c[3], 100), "top_p 0.8: %d %d %d %d", c[0],
              c[1], c[2], c[3]);
    /* min_p 0.4: p >= 0.4 * p_max keeps ids 0 and 1 */
    sweep(l, 4, (struct sample_row){.temperature = 1.0f, .min_p = 0.4f}, c, 1200);
    cr_expect(near(c[0], 800) && near(c[1], 400) && c[2] + c[3] == 0, "min_p 0.4: %d %d %d %d", c[0], c[1], c[2], c[3]);
    /* min_p 1 (and above, read as 1): the best only */
    sweep(l, 4, (struct sample_row){.temperature = 1.0f, .min_p = 3.0f}, c, 100);
    cr_expect(c[0] == 100);
}

Test(sample_rows, u_at_the_ends_and_rows_independent)
{
    enum { V = 50, N = 5 };
    float l[N * V];
    for (int i = 0; i < N * V; i++)
        l[i] = (float)((i * 7919) % 101) * 0.05f;
    struct sample_row p[N];
    int32_t out[N];
    for (int r = 0; r < N; r++)
        p[r] = (struct sample_row){.temperature = 0.5f + r, .top_k = r * 3, .top_p = 0.9f, .u = r / (double)N};
    cr_assert_eq(sample_rows(l, N, V, p, out), 0);
    for (int r = 0; r < N; r++) /* row r of a batch is the row alone */
        cr_expect_eq(out[r], op(l + r * V, V, p[r]), "row %d", r);
    /* u = 0: the first kept id; u just under 1: the last kept one */
    float k[5] = {-INFINITY, 2, 1, 2, 0.5f};
    cr_expect_eq(op(k, 5, (struct sample_row){.temperature = 1, .top_k = 2, .u = 0}), 1);
    cr_expect_eq(op(k, 5, (struct sample_row){.temperature = 1, .top_k = 2, .u = 1 - 0x1p-53}), 3);
    cr_expect_eq(op(k, 5, (struct sample_row){.temperature = 1, .u = -3}), 1);  /* u < 0 reads as 0 */
    cr_expect_eq(op(k, 5, (struct sample_row){.temperature = 1, .u = 7}), 4);   /* past 1: the last */
    cr_expect_eq(op(k, 5, (struct sample_row){.temperature = 0, .u = 0.99}), 3); /* T <= 0: the top ties */
}
