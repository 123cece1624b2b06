/* sample.c - the sampler: logits -> next token, in the order sample.h documents.
 *
 * logit_bias -> repetition -> penalties -> (temperature 0: greedy) -> the row draw of
 * backend_i.sample's definition (sample_rows.c: top_k -> softmax(T) -> top_p -> min_p -> draw),
 * with u from the seeded generator here.
 * Logprobs are always taken from the raw logits (before any of the above) so that the
 * numbers reported to clients describe the model, not the sampling settings. */
#include "sample.h"
#include "sample_rows.h"
#include "json_guard.h"
#include "tokenizer.h"

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
    s->draw_scratch = malloc(sample_row_scratch_bytes((int)n_vocab));
    s->seen = calloc(n_vocab, 1);
    if (!s->counts || !s->draw_scratch || !s->seen) {
        sampler_free(s);
        return TIDE_ENOMEM;
    }
    sampler_reset(s, p->seed);
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->counts);
    free(s->draw_scratch);
    free(s->seen);
    s->seen = NULL;
    s->draw_scratch = NULL;
    s->counts = NULL;
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
        /* 3. the draw: top_k, softmax with temperature, top_p, min_p and a walk in id order,
         * exactly as backend_i.sample draws (a sequence drawn on its backend gets this token) */
        struct sample_row row = {.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                 .min_p = p->min_p, .u = rng_uniform(&s->rng)};
        chosen = sample_row_draw(logits, n, &row, s->draw_scratch);
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
