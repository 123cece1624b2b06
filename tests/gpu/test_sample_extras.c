/* test_sample_extras.c - backend_i.sample's edits and logprobs on the GPU (test-gpu
 * sample_extras) against the host sampler (sample.c), the reference.
 *
 * Each row gets a random request: temperature (0 included: the greedy row sequence.c sends),
 * top_k / top_p / min_p, presence / frequency / repetition penalties, a logit_bias list (bans
 * included), logprobs with 0..20 top ones and now and then the end-of-generation ban (MASK edits
 * over the row's best id and others); a sampler noted a random prompt and accepted random
 * tokens (repeats: counts above 1). The host sampler draws from the row with u from its seeded
 * RNG; the GPU gets the sampler's edits (sampler_edits) and the same u, several rows a call. The
 * ids must be the host's (a boundary case, as in test_sample.c, is counted and must stay rare);
 * the logprobs within 1e-5 of the host's, the top ids the same. The CPU backend's slot must
 * give the host's answers exactly. Then the same rows twice (the same answers) and the time of a
 * step's worth of rows with edits and logprobs against the plain draw. */
#include "gpu_test.h"
#include "engine/sample.h"
#include "engine/sample_rows.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_RAND_SEED 0x9E3779B97F4A7C15ull
#include "../unit/test_rand.h"

enum { MAX_BIAS = 12, MAX_PROMPT = 300, MAX_GEN = 120 };

struct case_row {
    struct sampling_params sp;
    struct logit_bias bias[MAX_BIAS];
    struct sampler smp;
    int mask[4], n_mask;    /* ids banned by sampler_constrain (min_tokens, ignore_eos) this step */
    struct sample_edit *buf; /* sampler_edits_masking's */
    int cap;
    struct sample_row row;  /* what sequence.c would send */
    int want;               /* the host sampler's id */
    struct token_logprob lp;
};

static void random_logits(float *l, int V)
{
    double scale = (double[]){0.3, 1, 3, 10}[test_rand_next() % 4];
    int shape = (int)(test_rand_next() % 3);
    for (int i = 0; i < V; i++) {
        double x = test_rand_normal() * scale;
        if (shape == 1)
            x = floor(x * 2) / 2; /* ties */
        l[i] = (float)x;
        if (shape == 2 && test_rand_next() % 9 == 0)
            l[i] = -INFINITY;
    }
    l[test_rand_next() % V] = (float)(scale * 4); /* one stands out, never -inf: a row with a candidate */
}

/* A random request on c, its sampler fed a prompt and generated tokens; c->row from them. Its
 * end-of-generation ban, when it has one, masks the row's largest logit among others. */
static void random_case(struct case_row *c, int V, const float *row)
{
    static const float temps[] = {0.0f, 0.0f, 0.5f, 0.8f, 1.0f, 1.0f, 1.5f};
    static const float pres[] = {0.0f, 0.5f, -1.0f, 2.0f, 1.5f};
    static const float freq[] = {0.0f, 0.3f, -0.5f, 1.0f, 2.0f};
    static const float reps[] = {1.0f, 1.0f, 1.1f, 1.3f, 0.8f};
    static const float top_ps[] = {1.0f, 0.95f, 0.5f, 1.0f};
    static const float min_ps[] = {0.0f, 0.0f, 0.05f};
    sampling_params_default(&c->sp);
    c->sp.temperature = temps[test_rand_next() % 7];
    c->sp.top_k = (int[]){0, 0, 40, 5}[test_rand_next() % 4];
    c->sp.top_p = top_ps[test_rand_next() % 4];
    c->sp.min_p = min_ps[test_rand_next() % 3];
    c->sp.presence_penalty = pres[test_rand_next() % 5];
    c->sp.frequency_penalty = freq[test_rand_next() % 5];
    c->sp.repetition_penalty = reps[test_rand_next() % 5];
    c->sp.logprobs = test_rand_next() % 4 != 0;
    c->sp.top_logprobs = (int[]){0, 1, 5, 20}[test_rand_next() % 4];
    c->sp.seed = test_rand_next();
    int nb = (int)(test_rand_next() % (MAX_BIAS + 1)) * (test_rand_next() % 2);
    for (int j = 0; j < nb; j++) {
        int id;
        bool dup;
        do { /* unique ids: a duplicated one keeps the sequence on the host (sampler_edits) */
            id = (int)(test_rand_next() % (uint64_t)V);
            dup = false;
            for (int k = 0; k < j; k++)
                dup = dup || c->bias[k].id == id;
        } while (dup && V > MAX_BIAS);
        c->bias[j] = (struct logit_bias){id, (float[]){-100.0f, 5.0f, -3.5f, 0.25f, 100.0f}[test_rand_next() % 5]};
    }
    c->sp.logit_bias = c->bias;
    c->sp.n_logit_bias = V > MAX_BIAS ? nb : 0;
    sampler_init(&c->smp, &c->sp, (uint32_t)V);
    int prompt[MAX_PROMPT], np = (int)(test_rand_next() % MAX_PROMPT);
    for (int j = 0; j < np; j++)
        prompt[j] = (int)(test_rand_next() % (uint64_t)V);
    sampler_note_prompt(&c->smp, prompt, np);
    int ng = (int)(test_rand_next() % MAX_GEN);
    for (int j = 0; j < ng; j++) /* from a small set now and then: counts above 1 */
        sampler_accept(&c->smp, (int)(test_rand_next() % (uint64_t)(test_rand_next() % 2 ? 16 : V)));
    c->n_mask = test_rand_next() % 3 == 0 && V > 4 ? 4 : 0;
    for (int j = 0; j < c->n_mask; j++)
        c->mask[j] = (int)(test_rand_next() % (uint64_t)V);
    if (c->n_mask) {
        int best = 0;
        for (int i = 1; i < V; i++)
            best = row[i] > row[best] ? i : best;
        c->mask[0] = best;
    }
    const struct sample_edit *ed;
    int ne = c->n_mask ? sampler_edits_masking(&c->smp, c->mask, c->n_mask, &c->buf, &c->cap, &ed)
                       : sampler_edits(&c->smp, &ed);
    if (c->sp.temperature > 0.0f)
        c->row = (struct sample_row){.temperature = c->sp.temperature, .top_k = c->sp.top_k, .top_p = c->sp.top_p,
                                     .min_p = c->sp.min_p};
    else
        c->row = (struct sample_row){.temperature = 0.0f, .top_p = 1.0f};
    c->row.repetition_penalty = c->sp.repetition_penalty;
    c->row.logprobs = c->sp.logprobs;
    c->row.top_logprobs = c->sp.top_logprobs;
    c->row.edits = ed;
    c->row.n_edits = ne < 0 ? 0 : ne;
    if (c->sp.temperature > 0.0f) { /* the u the host sampler takes next, left for it to take */
        uint64_t keep = c->smp.rng;
        c->row.u = sampler_next_uniform(&c->smp);
        c->smp.rng = keep;
    }
}

/* within 1e-5, or one float step of b where a step is larger (|b| >= 128): lse is a double sum
 * in another order, and the float it rounds to may be the next one */
static bool near(float a, float b)
{
    if (isinf(a) || isinf(b))
        return a == b;
    float step = nextafterf(fabsf(b), INFINITY) - fabsf(b);
    return fabsf(a - b) <= (step > 1e-5f ? step : 1e-5f);
}

/* A logprob record against the host's; prints the first few differences. */
static bool same_logprobs(const struct token_logprob *h, const struct sample_logprob *g, int *shown, const char *who)
{
    bool ok = g->id == h->id && near(g->logprob, h->logprob) && g->n_top == h->n_top;
    for (int j = 0; ok && j < h->n_top; j++)
        ok = g->top_ids[j] == h->top_ids[j] && near(g->top_logprobs[j], h->top_logprobs[j]);
    if (!ok && (*shown)++ < 5)
        printf("  sample_extras: %s logprobs: id %d/%d logprob %.8g/%.8g n_top %d/%d top0 %d/%d\n", who, g->id,
               h->id, g->logprob, h->logprob, g->n_top, h->n_top, g->n_top ? g->top_ids[0] : -1,
               h->n_top ? h->top_ids[0] : -1);
    return ok;
}

/* Whether id is the draw from the edited row at u +- 1e-9 (a weight one unit off). */
static bool boundary(const float *raw, int V, const struct sample_row *p, int id)
{
    float *l = malloc(sizeof(float) * (size_t)V);
    memcpy(l, raw, sizeof(float) * (size_t)V);
    sample_row_edit(l, V, p);
    struct sample_row lo = *p, hi = *p;
    lo.u -= 1e-9;
    hi.u += 1e-9;
    int32_t a = -1, b = -1;
    sample_rows(l, 1, V, &lo, &a);
    sample_rows(l, 1, V, &hi, &b);
    free(l);
    return id == a || id == b;
}

/* n rows of V: the GPU's and the CPU slot's answers against the host sampler's. */
static void compare(int V, int n, int *bad, int *edge, int *lp_bad, int *cpu_bad)
{
    struct case_row *c = calloc((size_t)n, sizeof(*c));
    float *l = malloc(sizeof(float) * (size_t)n * V), *h = malloc(sizeof(float) * (size_t)V);
    struct sample_row *rows = malloc(sizeof(*rows) * (size_t)n);
    for (int r = 0; r < n; r++) {
        random_logits(l + (size_t)r * V, V);
        random_case(&c[r], V, l + (size_t)r * V);
        rows[r] = c[r].row;
        memcpy(h, l + (size_t)r * V, sizeof(float) * (size_t)V);
        for (int j = 0; j < c[r].n_mask; j++) /* sampler_constrain's ban */
            h[c[r].mask[j]] = -INFINITY;
        c[r].want = sampler_sample(&c[r].smp, h, c[r].sp.logprobs ? &c[r].lp : NULL);
    }
    float *ld = dev_put(l, sizeof(float) * (size_t)n * V);
    int32_t *od = dev_put(NULL, sizeof(int32_t) * (size_t)n), *got = malloc(sizeof(int32_t) * (size_t)n);
    struct sample_logprob *lpd = dev_put(NULL, sizeof(struct sample_logprob) * (size_t)n);
    struct sample_logprob *glp = malloc(sizeof(*glp) * (size_t)n), *clp = malloc(sizeof(*clp) * (size_t)n);
    gpu.i->sample(gpu.ctx, ld, n, V, rows, od, lpd);
    gpu.i->download(gpu.ctx, got, od, sizeof(int32_t) * (size_t)n);
    gpu.i->download(gpu.ctx, glp, lpd, sizeof(*glp) * (size_t)n);
    int32_t *cpu_ids = malloc(sizeof(int32_t) * (size_t)n);
    float *lc = malloc(sizeof(float) * (size_t)n * V);
    memcpy(lc, l, sizeof(float) * (size_t)n * V);
    cpu.i->sample(cpu.ctx, lc, n, V, rows, cpu_ids, clp);
    static int shown, shown_cpu;
    for (int r = 0; r < n; r++) {
        if (cpu_ids[r] != c[r].want || (c[r].sp.logprobs && !same_logprobs(&c[r].lp, &clp[r], &shown_cpu, "cpu")))
            ++*cpu_bad;
        if (got[r] != c[r].want) {
            if (got[r] >= 0 && got[r] < V && boundary(l + (size_t)r * V, V, &rows[r], got[r])) {
                ++*edge;
            } else {
                if ((*bad)++ < 5)
                    printf("  sample_extras: V %d row %d T %g pres %g freq %g rep %g edits %d: gpu %d, host %d\n",
                           V, r, c[r].sp.temperature, c[r].sp.presence_penalty, c[r].sp.frequency_penalty,
                           c[r].sp.repetition_penalty, rows[r].n_edits, got[r], c[r].want);
                continue;
            }
        }
        if (c[r].sp.logprobs && got[r] == c[r].want && !same_logprobs(&c[r].lp, &glp[r], &shown, "gpu"))
            ++*lp_bad;
    }
    for (int r = 0; r < n; r++) {
        sampler_free(&c[r].smp);
        free(c[r].buf);
    }
    gpu.i->free(gpu.ctx, ld);
    gpu.i->free(gpu.ctx, od);
    gpu.i->free(gpu.ctx, lpd);
    free(c), free(l), free(h), free(rows), free(got), free(glp), free(clp), free(cpu_ids), free(lc);
}

void test_sample_extras(void)
{
    if (!gpu.i->sample) {
        printf("SKIPPED sample_extras (the CUDA backend has no sample slot)\n");
        return;
    }
    static const int Vs[] = {151936, 32000, 1000, 7};
    int bad = 0, edge = 0, lp_bad = 0, cpu_bad = 0, rows = 0;
    for (int vi = 0; vi < 4; vi++)
        for (int rep = 0; rep < (Vs[vi] > 100000 ? 6 : 10); rep++) {
            int n = rep % 3 == 0 ? 1 : rep % 3 == 1 ? 16 : 70; /* 70: two launches of one call */
            compare(Vs[vi], n, &bad, &edge, &lp_bad, &cpu_bad);
            rows += n;
        }
    printf("  sample_extras: %d rows: %d ids differ at a boundary, %d otherwise; %d logprob records off by > 1e-5;"
           " the CPU slot differs from the host sampler in %d\n", rows, edge, bad, lp_bad, cpu_bad);
    bool ok = bad == 0 && lp_bad == 0 && cpu_bad == 0 && edge * 200 <= rows;

    /* the same rows twice (the edits run again on fresh copies): the same ids and records */
    enum { B = 32 };
    int V = 151936;
    struct case_row *c = calloc(B, sizeof(*c));
    float *l = malloc(sizeof(float) * (size_t)B * V);
    struct sample_row rows_b[B], plain[B];
    for (int r = 0; r < B; r++) {
        random_logits(l + (size_t)r * V, V);
        random_case(&c[r], V, l + (size_t)r * V);
        rows_b[r] = c[r].row;
        rows_b[r].logprobs = true;
        rows_b[r].top_logprobs = 5;
        plain[r] = (struct sample_row){.temperature = 1.0f, .top_p = 1.0f, .u = test_rand_u()};
    }
    float *ld = dev_put(l, sizeof(float) * (size_t)B * V);
    int32_t *od = dev_put(NULL, sizeof(int32_t) * B), a[B], b[B];
    struct sample_logprob *lpd = dev_put(NULL, sizeof(struct sample_logprob) * B), la[B], lb[B];
    gpu.i->sample(gpu.ctx, ld, B, V, rows_b, od, lpd);
    gpu.i->download(gpu.ctx, a, od, sizeof a);
    gpu.i->download(gpu.ctx, la, lpd, sizeof la);
    gpu.i->upload(gpu.ctx, ld, l, sizeof(float) * (size_t)B * V);
    gpu.i->sample(gpu.ctx, ld, B, V, rows_b, od, lpd);
    gpu.i->download(gpu.ctx, b, od, sizeof b);
    gpu.i->download(gpu.ctx, lb, lpd, sizeof lb);
    if (memcmp(a, b, sizeof a) || memcmp(la, lb, sizeof la)) {
        ok = false;
        printf("  sample_extras: two runs of the same rows differ\n");
    }
    /* a decode step's worth: 32 rows, each with its edits and 5 top logprobs, against the plain draw */
    double ms[2];
    for (int k = 0; k < 2; k++) {
        gpu.i->sample(gpu.ctx, ld, B, V, k ? rows_b : plain, od, k ? lpd : NULL);
        gpu.i->download(gpu.ctx, a, od, sizeof a);
        double t0 = now_s();
        for (int it = 0; it < 20; it++)
            gpu.i->sample(gpu.ctx, ld, B, V, k ? rows_b : plain, od, k ? lpd : NULL);
        gpu.i->download(gpu.ctx, a, od, sizeof a);
        ms[k] = (now_s() - t0) / 20 * 1e3;
    }
    int n_ed = 0;
    for (int r = 0; r < B; r++)
        n_ed += rows_b[r].n_edits;
    printf("  sample_extras: 32 rows x 151936: %.3f ms plain, %.3f ms with %d edits and 5 top logprobs a row\n",
           ms[0], ms[1], n_ed / B);
    for (int r = 0; r < B; r++) {
        sampler_free(&c[r].smp);
        free(c[r].buf);
    }
    gpu.i->free(gpu.ctx, ld);
    gpu.i->free(gpu.ctx, od);
    gpu.i->free(gpu.ctx, lpd);
    free(c);
    free(l);
    verdict("sample_extras", ok, "%.0f draws or records differ", (double)(bad + lp_bad + cpu_bad));
}
