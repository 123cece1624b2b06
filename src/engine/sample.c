/* sample.c - the sampler: logits -> next token, in the order sample.h documents.
 *
 * logit_bias -> repetition -> penalties -> (temperature 0: greedy) -> top_k -> softmax(T) -> top_p -> min_p -> draw.
 * Logprobs are always taken from the raw logits (before any of the above) so that the
 * numbers reported to clients describe the model, not the sampling settings. */
#include "sample.h"
#include "json_guard.h"
#include "tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* qsort has no context pointer in C11, so the comparison sorts (value, id) pairs. */
struct vi {
    float v;
    int id;
    float p; /* its probability once the softmax has run (a function of v alone) */
};

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
    p->repetition_penalty = 1.0f;
}

void sampler_reset(struct sampler *s, uint64_t seed)
{
    s->p.seed = seed;
    s->rng = seed ? seed : SEED_ZERO_REPLACEMENT;
    if (s->counts)
        memset(s->counts, 0, sizeof(int) * s->n_vocab);
    if (s->seen)
        memset(s->seen, 0, s->n_vocab);
}

int sampler_init(struct sampler *s, const struct sampling_params *p, uint32_t n_vocab)
{
    memset(s, 0, sizeof(*s));
    if (n_vocab == 0)
        return TIDE_EINVAL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->counts = calloc(n_vocab, sizeof(int));
    s->idx = malloc(sizeof(int) * n_vocab);
    s->cand = malloc(sizeof(struct vi) * n_vocab);
    s->expo = malloc(sizeof(float) * n_vocab);
    s->seen = calloc(n_vocab, 1);
    if (!s->counts || !s->idx || !s->cand || !s->expo || !s->seen) {
        sampler_free(s);
        return TIDE_ENOMEM;
    }
    sampler_reset(s, p->seed);
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->counts);
    free(s->idx);
    free(s->cand);
    free(s->expo);
    free(s->seen);
    s->seen = NULL;
    s->cand = NULL;
    s->expo = NULL;
    s->counts = NULL;
    s->idx = NULL;
}

double sampler_next_uniform(struct sampler *s)
{
    return rng_uniform(&s->rng);
}

void sampler_accept(struct sampler *s, int id)
{
    if (id >= 0 && (uint32_t)id < s->n_vocab) {
        s->counts[id]++;
        s->seen[id] = 1;
    }
}

void sampler_note_prompt(struct sampler *s, const int *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < s->n_vocab)
            s->seen[ids[i]] = 1;
}

bool sampler_needs_logits(const struct sampling_params *p)
{
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f || p->logprobs || p->json_object ||
           p->n_logit_bias > 0 || p->repetition_penalty != 1.0f || p->min_tokens > 0 || p->ignore_eos;
}

void sampler_constrain(struct sampler *s, const struct json_guard *g, const struct tokenizer *tok,
                       int n_generated, float *logits)
{
    const struct sampling_params *p = &s->p;
    bool eog_ok = !p->ignore_eos && n_generated >= p->min_tokens;
    if (p->json_object) {
        json_guard_mask(g, tok, eog_ok, logits, s->n_vocab);
        return;
    }
    if (!eog_ok)
        for (uint32_t id = 0; id < s->n_vocab; id++)
            if (tokenizer_is_eog(tok, (int)id))
                logits[id] = -INFINITY;
}



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
    struct vi *c;        /* (n) candidates, grouped by bucket; each carries its probability */
    int sorted;          /* c[0..sorted) is in final order */
    int end[N_BUCKETS];  /* bucket b is c[end[b-1]..end[b]) */
};

/* Make c[0..i] final: sort each bucket the index reaches (a candidate's probability moves
 * with it, so each is what a full sort gives). */
static void order_upto(struct lazy_order *o, int i)
{
    for (int b = 0; b < N_BUCKETS && i >= o->sorted; b++) {
        if (o->end[b] <= o->sorted) continue;
        qsort(o->c + o->sorted, (size_t)(o->end[b] - o->sorted), sizeof(*o->c), cmp_vi_desc);
        o->sorted = o->end[b];
    }
}

/* ---- the draw without sorting ----
 * The draw walks the candidates in sorted order adding probabilities (a double acc) until the
 * uniform r falls below acc. A float probability of at least 2^-29 is a multiple of 2^-52, and
 * so is a sum of them below 2, which a double then holds exactly: over such candidates every
 * partial sum is exact and does not depend on the order of its terms. A bucket made only of
 * them is then passed with one order-free sum when r lies beyond it, and inside the bucket
 * that holds r the candidate is found by partitioning around pivots (quickselect on the
 * cumulative mass) instead of sorting: the same acc values, the same comparisons, the same
 * token as the sorted walk, in linear time. A flat distribution (a random-weight model, a high
 * temperature) made the sorted walk sort most of the vocabulary every token. */
#define EXACT_MIN_P 0x1p-29f

static bool exact_mass(double x) { return x < 2.0 && ldexp(nearbyint(ldexp(x, 52)), -52) == x; }

/* Whether every candidate of c[0..n) has p == 0 or p >= EXACT_MIN_P; *mass = their sum. */
static bool bucket_mass(const struct vi *c, int n, double *mass)
{
    double m = 0.0;
    for (int j = 0; j < n; j++) {
        if (c[j].p != 0.0f && !(c[j].p >= EXACT_MIN_P))
            return false;
        m += c[j].p;
    }
    *mass = m;
    return true;
}

/* In c[0..n), all exact candidates (bucket_mass), the one the sorted walk stops at, given the
 * mass acc of everything before c in the order: its id, or -1 with *acc advanced past c. */
static int select_draw(struct vi *c, int n, double r, double *acc)
{
    while (n > 32) {
        struct vi *a = &c[0], *b = &c[n / 2], *z = &c[n - 1], *pv; /* median of three */
        if (cmp_vi_desc(a, b) < 0)
            pv = cmp_vi_desc(b, z) < 0 ? b : cmp_vi_desc(a, z) < 0 ? z : a;
        else
            pv = cmp_vi_desc(a, z) < 0 ? a : cmp_vi_desc(b, z) < 0 ? z : b;
        struct vi t = *pv;
        *pv = c[n - 1];
        c[n - 1] = t;
        int lo = 0; /* c[0..lo) rank before the pivot */
        double before = 0.0;
        for (int j = 0; j < n - 1; j++)
            if (cmp_vi_desc(&c[j], &t) < 0) {
                struct vi u = c[j];
                c[j] = c[lo];
                c[lo++] = u;
                before += u.p;
            }
        if (r < *acc + before) {
            n = lo;
            continue;
        }
        *acc += before;
        if (r < *acc + t.p)
            return t.id;
        *acc += t.p;
        c[n - 1] = c[lo]; /* the candidates after the pivot: c[lo + 1 .. n) after this swap */
        c[lo] = t;
        c += lo + 1;
        n -= lo + 1;
    }
    qsort(c, (size_t)n, sizeof(*c), cmp_vi_desc);
    for (int j = 0; j < n; j++) {
        *acc += c[j].p;
        if (r < *acc)
            return c[j].id;
    }
    return -1;
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

    /* 1. logit_bias; -100 bans (a finite -100 could still win when everything else is
     * masked, which is not what a client banning a token means) */
    for (int i = 0; i < p->n_logit_bias; i++) {
        int id = p->logit_bias[i].id;
        if (id < 0 || id >= n) continue;
        logits[id] = p->logit_bias[i].bias <= -100.0f ? -INFINITY : logits[id] + p->logit_bias[i].bias;
    }
    /* repetition_penalty (llama.cpp / vLLM): a token of the prompt or the reply has a positive
     * logit divided by it and a negative one multiplied, so it always moves down when > 1 */
    if (p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f) {
        for (int i = 0; i < n; i++)
            if (s->seen[i])
                logits[i] = logits[i] > 0.0f ? logits[i] / p->repetition_penalty : logits[i] * p->repetition_penalty;
    }
    /* penalties over the generated tokens */
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
        struct vi *c = s->cand;
        struct lazy_order o = {.c = c};
        float top = logits[sampler_argmax(logits, n)];
        int count[N_BUCKETS] = {0};
        uint8_t *bk = (uint8_t *)s->idx;  /* (n) bucket of each id; idx is n ints of scratch */
        float inv_t = 1.0f / p->temperature;
        int m = n;
        if (p->top_k > 0 && p->top_k < m)
            m = p->top_k;
        /* Without top_k the softmax runs over every candidate and needs only the max, top
         * (unless the logits hold NaN): its exponentials are taken in the same pass as the
         * buckets, in id order, and normalised as the candidates are laid out, three passes
         * over the vocabulary instead of six. With top_k it needs the m best in order first. */
        bool fused = m == n && !isnan(top);
        bool unit_t = p->temperature == 1.0f; /* x / 1.0 is x: the division skipped, same bits */
        float *ex = s->expo;                  /* (n) exponentials by id, when fused */
        double sum = 0.0, mass_all = 0.0;
        for (int i = 0; i < n; i++) {
            float d = (top - logits[i]) * inv_t;
            int b = d < (float)(N_BUCKETS - 1) ? (int)d : N_BUCKETS - 1;  /* NaN: the last */
            bk[i] = (uint8_t)b;
            count[b]++;
            if (fused) {
                double x = (double)logits[i] - top;
                ex[i] = (float)exp(unit_t ? x : x / p->temperature);
                sum += ex[i];
            }
        }
        int at[N_BUCKETS];
        for (int b = 0, e = 0; b < N_BUCKETS; b++) {
            at[b] = e;
            e += count[b];
            o.end[b] = e;
        }
        if (fused) {
            for (int i = 0; i < n; i++) {
                struct vi *ci = &c[at[bk[i]]++];
                ci->v = logits[i];
                ci->id = i;
                ci->p = (float)(ex[i] / sum);
                mass_all += ci->p;
            }
        } else {
            for (int i = 0; i < n; i++) {
                c[at[bk[i]]].v = logits[i];
                c[at[bk[i]]++].id = i;
            }
            order_upto(&o, m < n ? m - 1 : 0); /* top_k's m best (or the max) in order */
            /* 4. softmax with temperature over the m candidates (c[0] is the max). */
            for (int i = 0; i < m; i++) {
                c[i].p = (float)exp(((double)c[i].v - c[0].v) / p->temperature);
                sum += c[i].p;
            }
            for (int i = 0; i < m; i++)
                c[i].p = (float)(c[i].p / sum);
        }

        /* 5. top_p: the smallest prefix whose mass reaches top_p (at least one). */
        if (p->top_p > 0.0f && p->top_p < 1.0f) {
            double cum = 0.0;
            int keep = m;
            for (int i = 0; i < m; i++) {
                order_upto(&o, i);
                cum += c[i].p;
                if (cum >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            m = keep;
        }

        /* 6. min_p: drop candidates below min_p * the best probability. */
        if (p->min_p > 0.0f) {
            order_upto(&o, 0);
            float thr = p->min_p * c[0].p;
            int keep = 1;
            while (keep < m) {
                order_upto(&o, keep);
                if (c[keep].p < thr)
                    break;
                keep++;
            }
            m = keep;
        }

        /* 7. draw from the renormalised survivors. The mass is order-free but for
         * rounding; the walk runs in sorted order. */
        double mass = 0.0;
        if (fused && m == n)
            mass = mass_all;
        else
            for (int i = 0; i < m; i++) /* [0, m) is sorted: top_k, top_p or min_p cut it */
                mass += c[i].p;
        double r = rng_uniform(&s->rng) * mass;
        double acc = 0.0;
        chosen = -1;
        int i = 0;
        for (; i < o.sorted && i < m && chosen < 0; i++) { /* the sorted prefix */
            acc += c[i].p;
            if (r < acc)
                chosen = c[i].id;
        }
        for (int b = 0; b < N_BUCKETS && chosen < 0 && i < m; b++) { /* then bucket by bucket */
            if (o.end[b] <= i)
                continue;
            int e = o.end[b] < m ? o.end[b] : m;
            double bm;
            if (e == o.end[b] && exact_mass(acc) && bucket_mass(c + i, e - i, &bm) && acc + bm < 2.0) {
                if (r < acc + bm)
                    chosen = select_draw(c + i, e - i, r, &acc);
                else
                    acc += bm;
                i = e;
                continue;
            }
            order_upto(&o, e - 1);
            for (; i < e && chosen < 0; i++) {
                acc += c[i].p;
                if (r < acc)
                    chosen = c[i].id;
            }
        }
        if (chosen < 0) { /* r at or past the last acc (rounding): the last candidate (a
                             * selection only reorders inside its bucket, so order_upto holds) */
            order_upto(&o, m - 1);
            chosen = c[m - 1].id;
        }
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
