/* sample.h - turn logits into the next token.
 *
 * Order: penalties (presence/frequency over generated tokens) -> temperature 0 means
 * greedy (argmax, ties to the lowest id) -> top_k -> softmax with temperature -> top_p ->
 * min_p -> draw with a seeded xorshift RNG (same seed, same output). */
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
    bool json_object;         /* JSON mode: only tokens that keep the reply a JSON object prefix */
};

struct token_logprob {
    int id;
    float logprob;            /* of the chosen token, under the unmodified softmax */
    int n_top;
    int top_ids[SAMPLE_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLE_MAX_TOP_LOGPROBS];
};

struct vi;

struct sampler {
    struct sampling_params p;
    uint64_t rng;
    uint32_t n_vocab;
    int *counts;              /* (n_vocab) times each token was generated */
    int *idx;                 /* (n_vocab) scratch */
    struct vi *cand;          /* (n_vocab) candidates (value, id, probability), sample.c's */
    float *expo;              /* (n_vocab) scratch: the softmax's exponentials by id */
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
/* Tell the sampler a token was emitted (for penalties). */
void sampler_accept(struct sampler *s, int id);

#endif
