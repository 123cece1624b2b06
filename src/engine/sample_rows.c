/* sample_rows.c - backend_i.sample on the host: a draw from each row of logits with its own
 * temperature, top_k, top_p, min_p and uniform u, by the definition in backend.h.
 *
 * This is the CPU backend's slot, the host sampler's temperature draw (sample.c) and the
 * reference the CUDA form (cuda/sample.cu) is tested against, so it follows the definition step by step rather than the fastest route: the
 * candidates in id order, top_k's and top_p's thresholds found by a three-way quickselect on a
 * copy (linear on average, no sort), then one walk in id order. Weights are integers (units of
 * 2^-44 of the best token's), so every sum is exact and the order of the additions, which
 * differs between this loop and a GPU's reductions, cannot change a draw. */
#include "sample_rows.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    float x;     /* the logit as a candidate (+inf -> FLT_MAX, -0 -> +0) */
    int id;
    uint64_t w;  /* 1 while top_k is decided, then the weight */
};

/* A logit as a candidate: false for NaN and -inf, which are never drawn. */
static bool as_candidate(float v, float *x)
{
    if (isnan(v) || v == -INFINITY)
        return false;
    if (v == INFINITY)
        v = FLT_MAX;
    if (v == 0.0f)
        v = 0.0f; /* -0 and +0 are one value */
    *x = v;
    return true;
}

/* The softmax numerator exp((x - m) / t) in units of 2^-44: m itself weighs exactly 2^44. Below
 * d = -32, exp(d) * 2^44 < 0.23 rounds to 0 whatever the last bit of exp(): no call. */
static uint64_t weight(float x, float m, float t)
{
    double d = ((double)x - (double)m) / (double)t;
    return d < -32.0 ? 0 : (uint64_t)rint(exp(d) * SAMPLE_W_ONE);
}

static void swap_cand(struct cand *a, struct cand *b)
{
    struct cand t = *a;
    *a = *b;
    *b = t;
}

/* The largest value v of a[0..n) such that the elements with x >= v weigh at least target:
 * (double)(sum of their w) >= target. Needs 0 < target <= the whole array's weight. A
 * three-way quickselect (a[] is reordered): elements above the pivot, equal, below. */
static float mass_threshold(struct cand *a, int n, double target)
{
    uint64_t above = 0; /* weight of the elements known to lie above a[0..n): (double)above < target */
    for (;;) {
        float x0 = a[0].x, x1 = a[n / 2].x, x2 = a[n - 1].x, pv; /* median of three */
        if (x0 < x1)
            pv = x1 < x2 ? x1 : x0 < x2 ? x2 : x0;
        else
            pv = x0 < x2 ? x0 : x1 < x2 ? x2 : x1;
        int gt = 0, i = 0, lt = n; /* [0, gt) > pv, [gt, i) == pv, [lt, n) < pv */
        uint64_t w_gt = 0, w_eq = 0;
        while (i < lt) {
            if (a[i].x > pv) {
                w_gt += a[i].w;
                swap_cand(&a[i++], &a[gt++]);
            } else if (a[i].x < pv) {
                swap_cand(&a[i], &a[--lt]);
            } else {
                w_eq += a[i++].w;
            }
        }
        if ((double)(above + w_gt) >= target) { /* the threshold lies above pv (gt > 0 by the invariant) */
            n = gt;
            continue;
        }
        if ((double)(above + w_gt + w_eq) >= target)
            return pv;
        above += w_gt + w_eq; /* below pv: there is weight left there, since the whole reaches target */
        a += lt;
        n -= lt;
    }
}

/* Keep the candidates c[0..n) with x >= tau, in order; returns how many. */
static int keep_from(struct cand *c, int n, float tau)
{
    int k = 0;
    for (int j = 0; j < n; j++)
        if (c[j].x >= tau)
            c[k++] = c[j];
    return k;
}

/* One row: c and tmp are n_vocab candidates of scratch. */
static int32_t sample_one(const float *l, int n_vocab, const struct sample_row *p, struct cand *c, struct cand *tmp)
{
    int n = 0;
    float m = -FLT_MAX;
    for (int i = 0; i < n_vocab; i++) {
        float x;
        if (!as_candidate(l[i], &x))
            continue;
        c[n++] = (struct cand){x, i, 1};
        if (x > m)
            m = x;
    }
    if (n == 0)
        return 0;
    if (p->top_k > 0 && p->top_k < n) {
        memcpy(tmp, c, sizeof(*c) * (size_t)n);
        n = keep_from(c, n, mass_threshold(tmp, n, (double)p->top_k)); /* w = 1: counts */
    }
    float t = p->temperature > 0.0f ? p->temperature : FLT_MIN;
    uint64_t s1 = 0;
    for (int j = 0; j < n; j++) {
        c[j].w = weight(c[j].x, m, t);
        s1 += c[j].w;
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        memcpy(tmp, c, sizeof(*c) * (size_t)n);
        n = keep_from(c, n, mass_threshold(tmp, n, (double)p->top_p * (double)s1));
    }
    if (p->min_p > 0.0f) {
        double w_min = (double)(p->min_p < 1.0f ? p->min_p : 1.0f) * SAMPLE_W_ONE; /* the best (2^44) stays */
        int k = 0;
        for (int j = 0; j < n; j++)
            if ((double)c[j].w >= w_min)
                c[k++] = c[j];
        n = k;
    }
    uint64_t s = 0;
    for (int j = 0; j < n; j++)
        s += c[j].w;
    double u = p->u >= 0.0 ? p->u : 0.0, rs = u * (double)s;
    uint64_t r = rs < (double)s ? (uint64_t)rs : s - 1;
    if (r >= s)
        r = s - 1;
    uint64_t acc = 0;
    for (int j = 0; j < n; j++) {
        acc += c[j].w;
        if (acc > r)
            return c[j].id;
    }
    return c[n - 1].id; /* not reached: acc ends at s > r */
}

size_t sample_row_scratch_bytes(int n_vocab)
{
    return 2 * sizeof(struct cand) * (size_t)(n_vocab > 0 ? n_vocab : 1);
}

int32_t sample_row_draw(const float *logits, int n_vocab, const struct sample_row *p, void *scratch)
{
    struct cand *c = scratch;
    return n_vocab > 0 ? sample_one(logits, n_vocab, p, c, c + n_vocab) : 0;
}

int sample_rows(const float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out)
{
    if (n <= 0 || n_vocab <= 0)
        return 0;
    void *scratch = malloc(sample_row_scratch_bytes(n_vocab));
    if (!scratch)
        return TIDE_ENOMEM;
    for (int i = 0; i < n; i++)
        out[i] = sample_row_draw(logits + (size_t)i * n_vocab, n_vocab, &rows[i], scratch);
    free(scratch);
    return 0;
}

void sample_row_edit(float *l, int n_vocab, const struct sample_row *p)
{
    for (int j = 0; j < p->n_edits; j++) {
        const struct sample_edit *e = &p->edits[j];
        if (e->id < 0 || e->id >= n_vocab)
            continue;
        float x = l[e->id];
        if (e->what & (SAMPLE_EDIT_BAN | SAMPLE_EDIT_MASK))
            x = -INFINITY;
        else if (e->what & SAMPLE_EDIT_BIAS)
            x = x + e->bias;
        if (e->what & SAMPLE_EDIT_SEEN)
            x = x > 0.0f ? x / p->repetition_penalty : x * p->repetition_penalty;
        if (e->what & SAMPLE_EDIT_SUB)
            x = x - e->sub;
        l[e->id] = x;
    }
}

/* The largest logit's index, ties to the lowest (sampler_argmax's rule, kept here so that this
 * file needs nothing of the sampler's). */
static int first_largest(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

void sample_row_logprobs(const float *raw, int n, int chosen, int k, struct sample_logprob *lp)
{
    float mx = raw[first_largest(raw, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)raw[i] - mx);
    double lse = mx + log(sum);
    lp->id = chosen;
    lp->logprob = (float)(raw[chosen] - lse);
    if (k < 0) k = 0;
    if (k > SAMPLE_ROW_MAX_TOP) k = SAMPLE_ROW_MAX_TOP;
    if (k > n) k = n;
    lp->n_top = k;
    /* One pass keeping the k best in order (k <= 20): a new value goes after every kept
     * one that is >= it, so ties keep the lower id first. */
    int kept = 0;
    for (int i = 0; i < n && k > 0; i++) {
        if (kept == k && !(raw[i] > raw[lp->top_ids[k - 1]]))
            continue;
        int at = kept < k ? kept : k - 1;
        while (at > 0 && raw[i] > raw[lp->top_ids[at - 1]]) {
            lp->top_ids[at] = lp->top_ids[at - 1];
            at--;
        }
        lp->top_ids[at] = i;
        if (kept < k) kept++;
    }
    for (int j = 0; j < k; j++)
        lp->top_logprobs[j] = (float)(raw[lp->top_ids[j]] - lse);
}

int sample_rows_full(float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                     struct sample_logprob *lp)
{
    if (n <= 0 || n_vocab <= 0)
        return 0;
    bool any_lp = false;
    for (int i = 0; i < n; i++)
        any_lp = any_lp || rows[i].logprobs;
    void *scratch = malloc(sample_row_scratch_bytes(n_vocab));
    float *raw = any_lp ? malloc(sizeof(float) * (size_t)n_vocab) : NULL;
    if (!scratch || (any_lp && !raw)) {
        free(scratch);
        free(raw);
        return TIDE_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        float *l = logits + (size_t)i * n_vocab;
        for (int j = 0; j < rows[i].n_edits; j++) /* the mask comes before the logprobs */
            if ((rows[i].edits[j].what & SAMPLE_EDIT_MASK) && rows[i].edits[j].id >= 0 &&
                rows[i].edits[j].id < n_vocab)
                l[rows[i].edits[j].id] = -INFINITY;
        if (rows[i].logprobs)
            memcpy(raw, l, sizeof(float) * (size_t)n_vocab);
        sample_row_edit(l, n_vocab, &rows[i]);
        out[i] = sample_row_draw(l, n_vocab, &rows[i], scratch);
        if (rows[i].logprobs && lp)
            sample_row_logprobs(raw, n_vocab, out[i], rows[i].top_logprobs, &lp[i]);
    }
    free(scratch);
    free(raw);
    return 0;
}
