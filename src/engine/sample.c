/* sample.c - the sampler: logits -> next token, in the order sample.h documents.
 *
 * logit_bias -> repetition -> penalties -> (temperature 0: greedy) -> the row draw of
 * backend_i.sample's definition (sample_rows.c: top_k -> softmax(T) -> top_p -> min_p -> draw),
 * with u from the seeded generator here.
 * Logprobs are always taken from the raw logits (before any of the above) so that the
 * numbers reported to clients describe the model, not the sampling settings. */
#include "sample.h"
#include "sample_rows.h"

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

/* The edit of id, made if there is none yet (NULL: out of memory, and edits_ok is then false). */
static struct sample_edit *edit_for(struct sampler *s, int id)
{
    if (s->edit_of[id] >= 0)
        return &s->edits[s->edit_of[id]];
    if (s->n_edits == s->cap_edits) {
        int cap = s->cap_edits ? 2 * s->cap_edits : 64;
        struct sample_edit *ne = realloc(s->edits, sizeof(*ne) * (size_t)cap);
        if (!ne) {
            s->edits_ok = false;
            return NULL;
        }
        s->edits = ne;
        s->cap_edits = cap;
    }
    s->edit_of[id] = s->n_edits;
    s->edits[s->n_edits] = (struct sample_edit){.id = id};
    return &s->edits[s->n_edits++];
}

static bool repetition_on(const struct sampling_params *p)
{
    return p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f;
}

void sampler_reset(struct sampler *s, uint64_t seed)
{
    s->p.seed = seed;
    s->rng = seed ? seed : SEED_ZERO_REPLACEMENT;
    if (s->counts)
        memset(s->counts, 0, sizeof(int) * s->n_vocab);
    if (s->seen)
        memset(s->seen, 0, s->n_vocab);
    if (!s->edit_of)
        return;
    for (int j = 0; j < s->n_edits; j++)
        s->edit_of[s->edits[j].id] = -1;
    s->n_edits = 0;
    s->edits_ok = true;
    for (int i = 0; i < s->p.n_logit_bias; i++) { /* sampler_sample's step 1, as edits */
        int id = s->p.logit_bias[i].id;
        if (id < 0 || (uint32_t)id >= s->n_vocab)
            continue;
        if (s->edit_of[id] >= 0) { /* twice: the host adds both in turn, which one edit cannot say */
            s->edits_ok = false;
            continue;
        }
        struct sample_edit *e = edit_for(s, id);
        if (!e)
            return;
        e->what = s->p.logit_bias[i].bias <= -100.0f ? SAMPLE_EDIT_BAN : SAMPLE_EDIT_BIAS;
        e->bias = s->p.logit_bias[i].bias;
    }
}

int sampler_edits(const struct sampler *s, const struct sample_edit **edits)
{
    *edits = s->edits;
    return s->edits_ok ? s->n_edits : -1;
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
    s->edit_of = malloc(sizeof(int32_t) * n_vocab);
    if (s->edit_of)
        memset(s->edit_of, 0xff, sizeof(int32_t) * n_vocab); /* -1: no edit */
    if (!s->counts || !s->draw_scratch || !s->seen || !s->edit_of) {
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
    free(s->edits);
    free(s->edit_of);
    s->edits = NULL;
    s->edit_of = NULL;
    s->n_edits = s->cap_edits = 0;
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
        const struct sampling_params *p = &s->p;
        bool pen = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
        if (!repetition_on(p) && !pen)
            return;
        struct sample_edit *e = edit_for(s, id);
        if (!e)
            return;
        if (repetition_on(p))
            e->what |= SAMPLE_EDIT_SEEN;
        if (pen) { /* the subtrahend exactly as sampler_sample computes it */
            e->what |= SAMPLE_EDIT_SUB;
            e->sub = p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
        }
    }
}

void sampler_note_prompt(struct sampler *s, const int *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < s->n_vocab) {
            s->seen[ids[i]] = 1;
            if (repetition_on(&s->p)) {
                struct sample_edit *e = edit_for(s, ids[i]);
                if (e)
                    e->what |= SAMPLE_EDIT_SEEN;
            }
        }
}

int sampler_edits_masking(const struct sampler *s, const int *ids, int n, struct sample_edit **buf, int *cap,
                          const struct sample_edit **edits)
{
    const struct sample_edit *own;
    int ne = sampler_edits(s, &own);
    if (ne < 0)
        return -1;
    if (ne + n > *cap) {
        int nc = ne + n + 64;
        struct sample_edit *nb = realloc(*buf, sizeof(*nb) * (size_t)nc);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = nc;
    }
    if (ne)
        memcpy(*buf, own, sizeof(**buf) * (size_t)ne);
    int k = ne;
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || (uint32_t)id >= s->n_vocab)
            continue;
        if (s->edit_of[id] >= 0) /* one edit an id: the mask joins the sampler's */
            (*buf)[s->edit_of[id]].what |= SAMPLE_EDIT_MASK;
        else
            (*buf)[k++] = (struct sample_edit){.id = id, .what = SAMPLE_EDIT_MASK};
    }
    *edits = *buf;
    return k;
}

bool sampler_needs_logits(const struct sampling_params *p)
{
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f || p->logprobs || p->json_object ||
           p->n_logit_bias > 0 || p->repetition_penalty != 1.0f || p->min_tokens > 0 || p->ignore_eos;
}

/* Fill lp from the raw logits: log_softmax, chosen id's logprob, top-N descending (the one
 * definition backend_i.sample's logprobs share, sample_rows.c). */
static void fill_logprobs(const struct sampler *s, const float *raw, int chosen, struct token_logprob *lp)
{
    struct sample_logprob r;
    sample_row_logprobs(raw, (int)s->n_vocab, chosen, s->p.top_logprobs, &r);
    lp->id = r.id;
    lp->logprob = r.logprob;
    lp->n_top = r.n_top;
    for (int j = 0; j < r.n_top; j++) {
        lp->top_ids[j] = r.top_ids[j];
        lp->top_logprobs[j] = r.top_logprobs[j];
    }
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
    if (repetition_on(p)) {
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
