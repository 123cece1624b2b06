/* sample.c - the sampler: logits -> next token, in the order sample.h documents.
 *
 * penalties -> (temperature 0: greedy) -> top_k -> softmax(T) -> top_p -> min_p -> draw.
 * Logprobs are always taken from the raw logits (before any of the above) so that the
 * numbers reported to clients describe the model, not the sampling settings. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64* must never hold 0 (it would stay 0 forever). */
#define SEED_ZERO_REPLACEMENT 0x9E3779B97F4A7C15ULL

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1) from the top 53 bits. */
static double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

void sampling_params_default(struct sampling_params *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->top_k = 0;
}

void sampler_reset(struct sampler *s, uint64_t seed)
{
    s->p.seed = seed;
    s->rng = seed ? seed : SEED_ZERO_REPLACEMENT;
    if (s->counts)
        memset(s->counts, 0, sizeof(int) * s->n_vocab);
}

int sampler_init(struct sampler *s, const struct sampling_params *p, uint32_t n_vocab)
{
    memset(s, 0, sizeof(*s));
    if (n_vocab == 0)
        return TIDE_EINVAL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->counts = calloc(n_vocab, sizeof(int));
    s->probs = malloc(sizeof(float) * n_vocab);
    s->idx = malloc(sizeof(int) * n_vocab);
    if (!s->counts || !s->probs || !s->idx) {
        sampler_free(s);
        return TIDE_ENOMEM;
    }
    sampler_reset(s, p->seed);
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->counts);
    free(s->probs);
    free(s->idx);
    s->counts = NULL;
    s->probs = NULL;
    s->idx = NULL;
}

void sampler_accept(struct sampler *s, int id)
{
    if (id >= 0 && (uint32_t)id < s->n_vocab)
        s->counts[id]++;
}

int sampler_argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) /* strict: ties keep the lowest id */
            best = i;
    return best;
}

/* qsort has no context pointer in C11, so the comparison sorts (value, id) pairs. */
struct vi {
    float v;
    int id;
};

static int cmp_vi_desc(const void *a, const void *b)
{
    const struct vi *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The candidates in buckets by distance below the best logit, in units of the temperature:
 * [0, 1), [1, 2), ... [15, 16), then the rest. Each bucket is sorted only when the walk
 * (top_k, top_p, min_p or the draw) reaches it; the buckets' value ranges do not overlap, so
 * the sorted buckets side by side are exactly the full sort. Unit-wide buckets keep a draw
 * that lands in the crowd of low logits from sorting the whole crowd. */
#define N_BUCKETS 17

struct lazy_order {
    struct vi *c;        /* (n) candidates, grouped by bucket */
    float *pr;           /* (n) probabilities, valid in c order for the sorted prefix */
    int sorted;          /* c[0..sorted) is in final order, its pr set */
    int end[N_BUCKETS];  /* bucket b is c[end[b-1]..end[b]) */
    int m;               /* candidates whose pr is wanted */
    float top, temp;
    double sum;
};

/* Make c[0..i] final: sort each bucket the index reaches and refill its probabilities (the
 * same formula as the softmax pass, so each is what a full sort gives). */
static void order_upto(struct lazy_order *o, int i)
{
    for (int b = 0; b < N_BUCKETS && i >= o->sorted; b++) {
        if (o->end[b] <= o->sorted) continue;
        qsort(o->c + o->sorted, (size_t)(o->end[b] - o->sorted), sizeof(*o->c), cmp_vi_desc);
        if (o->sum > 0)
            for (int j = o->sorted; j < o->end[b] && j < o->m; j++)
                o->pr[j] = (float)((float)exp(((double)o->c[j].v - o->top) / o->temp) / o->sum);
        o->sorted = o->end[b];
    }
}

/* Fill lp from the raw logits: log_softmax, chosen id's logprob, top-N descending. */
static void fill_logprobs(const struct sampler *s, const float *raw, int chosen,
                          struct token_logprob *lp)
{
    int n = (int)s->n_vocab;
    float mx = raw[sampler_argmax(raw, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)raw[i] - mx);
    double lse = mx + log(sum);
    lp->id = chosen;
    lp->logprob = (float)(raw[chosen] - lse);
    int k = s->p.top_logprobs;
    if (k < 0) k = 0;
    if (k > SAMPLE_MAX_TOP_LOGPROBS) k = SAMPLE_MAX_TOP_LOGPROBS;
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

int sampler_sample(struct sampler *s, float *logits, struct token_logprob *lp)
{
    int n = (int)s->n_vocab;
    const struct sampling_params *p = &s->p;
    float *raw = NULL;

    /* Keep a copy of the raw logits only when logprobs are wanted. */
    if (lp) {
        raw = malloc(sizeof(float) * n);
        if (raw) memcpy(raw, logits, sizeof(float) * n);
    }

    /* 1. penalties over the generated tokens */
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int i = 0; i < n; i++) {
            int c = s->counts[i];
            if (c > 0)
                logits[i] -= p->presence_penalty + p->frequency_penalty * (float)c;
        }
    }

    int chosen;
    if (p->temperature <= 0.0f) {
        /* 2. greedy */
        chosen = sampler_argmax(logits, n);
    } else {
        /* 3. top_k: candidates sorted by logit descending, ties by lower id. Sorting the
         * whole vocabulary (151,936 entries for Qwen3) every token cost ~35 ms, so the
         * candidates are bucketed by distance from the best logit and a bucket is sorted
         * when the walk reaches it (struct lazy_order): the order walked, and so the token
         * a seed draws, is a full sort's; only the softmax sum adds in another order. */
        struct vi *c = malloc(sizeof(struct vi) * n);
        if (!c) {
            free(raw);
            return sampler_argmax(logits, n);
        }
        struct lazy_order o = {.c = c, .pr = s->probs, .temp = p->temperature};
        o.top = logits[sampler_argmax(logits, n)];
        int count[N_BUCKETS] = {0};
        uint8_t *bk = (uint8_t *)s->idx;  /* (n) bucket of each id; idx is n ints of scratch */
        float inv_t = 1.0f / p->temperature;
        for (int i = 0; i < n; i++) {
            float d = (o.top - logits[i]) * inv_t;
            int b = d < (float)(N_BUCKETS - 1) ? (int)d : N_BUCKETS - 1;  /* NaN: the last */
            bk[i] = (uint8_t)b;
            count[b]++;
        }
        int at[N_BUCKETS];
        for (int b = 0, e = 0; b < N_BUCKETS; b++) {
            at[b] = e;
            e += count[b];
            o.end[b] = e;
        }
        for (int i = 0; i < n; i++) {
            c[at[bk[i]]].v = logits[i];
            c[at[bk[i]]++].id = i;
        }
        int m = n;
        if (p->top_k > 0 && p->top_k < m)
            m = p->top_k;
        o.m = m;
        order_upto(&o, m < n ? m - 1 : 0);  /* c[0] is the max; top_k needs its m best */

        /* 4. softmax with temperature over the m candidates (c[0] is the max). */
        double sum = 0.0;
        float *pr = s->probs; /* (m) probabilities of c[0..m) */
        for (int i = 0; i < m; i++) {
            pr[i] = (float)exp(((double)c[i].v - c[0].v) / p->temperature);
            sum += pr[i];
        }
        for (int i = 0; i < m; i++)
            pr[i] = (float)(pr[i] / sum);
        o.sum = sum;

        /* 5. top_p: the smallest prefix whose mass reaches top_p (at least one). */
        if (p->top_p > 0.0f && p->top_p < 1.0f) {
            double cum = 0.0;
            int keep = m;
            for (int i = 0; i < m; i++) {
                order_upto(&o, i);
                cum += pr[i];
                if (cum >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            m = keep;
        }

        /* 6. min_p: drop candidates below min_p * the best probability. */
        if (p->min_p > 0.0f) {
            float thr = p->min_p * pr[0];
            int keep = 1;
            while (keep < m) {
                order_upto(&o, keep);
                if (pr[keep] < thr)
                    break;
                keep++;
            }
            m = keep;
        }

        /* 7. draw from the renormalised survivors. The mass is order-free but for
         * rounding; the walk runs in sorted order. */
        double mass = 0.0;
        for (int i = 0; i < m; i++)
            mass += pr[i];
        double r = rng_uniform(&s->rng) * mass;
        int last = m - 1;
        double acc = 0.0;
        for (int i = 0; i < m; i++) {
            order_upto(&o, i);
            acc += pr[i];
            if (r < acc) {
                last = i;
                break;
            }
        }
        order_upto(&o, last);
        chosen = c[last].id;
        free(c);
    }

    if (lp) {
        if (raw) {
            fill_logprobs(s, raw, chosen, lp);
        } else {
            memset(lp, 0, sizeof(*lp));
            lp->id = chosen;
        }
    }
    free(raw);
    return chosen;
}
