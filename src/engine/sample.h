/* sample.h - turn logits into the next token.
 *
 * Before sampler_sample the engine calls sampler_constrain: the grammar mask (JSON mode,
 * json_schema) and the end-of-generation ban (ignore_eos, min_tokens) set logits to -inf.
 *
 * Order: logit_bias -> repetition_penalty (prompt and generated tokens) -> presence/frequency
 * penalties (generated tokens) -> temperature 0 means greedy (argmax, ties to the lowest id);
 * else the draw of backend_i.sample's definition (backend.h: top_k -> softmax with temperature
 * -> top_p -> min_p -> a walk in id order) with u from a seeded xorshift RNG (same seed, same
 * output), so a request draws the same token whether its backend or this sampler draws. */
#ifndef TIDE_SAMPLE_H
#define TIDE_SAMPLE_H

#include "../common.h"

#define SAMPLE_MAX_TOP_LOGPROBS 20

struct sampling_params {
    float temperature;        /* 0 = greedy; default 1 */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    int top_k;                /* 0 = off */
    uint64_t seed;
    float presence_penalty;   /* -2..2 */
    float frequency_penalty;  /* -2..2 */
    bool logprobs;
    int top_logprobs;         /* 0..20 */
    bool json_object;         /* a grammar constrains the reply: grammar, or any JSON object */
    const struct grammar *grammar; /* json_schema's (json_object is then true); NULL: any object */
    const struct logit_bias *logit_bias; /* added to the logits; <= -100 bans the token */
    int n_logit_bias;
    float repetition_penalty; /* 1 = off; > 1 makes tokens of the prompt and reply less likely */
    int min_tokens;           /* end-of-generation (and stop strings) refused before this many */
    bool ignore_eos;          /* end-of-generation refused: only max_tokens or a stop ends */
};

struct logit_bias {
    int id;
    float bias;               /* -100..100 */
};

struct token_logprob {
    int id;
    float logprob;            /* of the chosen token, under the unmodified softmax */
    int n_top;
    int top_ids[SAMPLE_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLE_MAX_TOP_LOGPROBS];
};

struct sample_edit; /* backend.h */

struct sampler {
    struct sampling_params p;
    uint64_t rng;
    uint32_t n_vocab;
    int *counts;              /* (n_vocab) times each token was generated */
    void *draw_scratch;       /* sample_row_draw's (sample_rows.h) */
    uint8_t *seen;            /* (n_vocab) in the prompt or generated: repetition_penalty */
    /* The same changes as a sparse list (backend.h: struct sample_edit) that a backend applies
     * before its draw (backend_i.sample), kept up to date by reset, note_prompt and accept so
     * that no step needs a pass over the vocabulary: */
    struct sample_edit *edits;
    int n_edits, cap_edits;
    int32_t *edit_of;         /* (n_vocab) index into edits, or -1 */
    bool edits_ok;            /* false: the list is not the sampler's (out of memory, or a
                                 logit_bias that names an id twice): draw on the host */
};

void sampling_params_default(struct sampling_params *p);
int sampler_init(struct sampler *s, const struct sampling_params *p, uint32_t n_vocab);
void sampler_free(struct sampler *s);
/* Reset counts and reseed (start of a new choice). */
void sampler_reset(struct sampler *s, uint64_t seed);
/* logits (n_vocab) may be modified. lp may be NULL. Returns the token id. */
int sampler_sample(struct sampler *s, float *logits, struct token_logprob *lp);
/* The greedy choice: the index of the largest of v[0..n), ties to the lowest index (a NaN is
 * never chosen, unless at index 0, which nothing then replaces). backend_i.argmax matches it. */
int sampler_argmax(const float *v, int n);
/* The next uniform in [0, 1) of the sampler's seeded RNG, as sampler_sample takes one for each
 * temperature draw: the u of a draw made elsewhere (backend_i.sample), so a seed still decides it. */
double sampler_next_uniform(struct sampler *s);
/* Tell the sampler a token was emitted (for penalties). */
void sampler_accept(struct sampler *s, int id);
/* The prompt's tokens, for repetition_penalty (negative ids, image positions, are skipped).
 * Call after sampler_reset. */
void sampler_note_prompt(struct sampler *s, const int *ids, int n);
/* The sampler's logit changes as backend_i.sample's edits (its logit_bias, repetition_penalty,
 * presence and frequency penalties, for the tokens noted so far): sets *edits and returns how
 * many, or returns -1 when they cannot stand for the host's (sampler.edits_ok). The list stays
 * valid until the next reset, note_prompt or accept. */
int sampler_edits(const struct sampler *s, const struct sample_edit **edits);
/* sampler_edits with ids[0..n) masked as well (SAMPLE_EDIT_MASK: sampler_constrain's
 * end-of-generation ban, as edits), built in *buf (*cap entries, grown with realloc; the
 * caller frees it): sets *edits and returns how many, or -1 (as sampler_edits, or out of memory). */
int sampler_edits_masking(const struct sampler *s, const int *ids, int n, struct sample_edit **buf, int *cap,
                          const struct sample_edit **edits);
/* Whether sampling needs the logits themselves (anything but plain greedy): a device-side
 * argmax is the same as the sampler's choice only when this is false. */
bool sampler_needs_logits(const struct sampling_params *p);

/* sampler_constrain, the grammar mask and end-of-generation ban before each draw, is in
 * json_guard.h (it needs the grammar and the tokenizer; this file needs neither). */

#endif
