/* oai_fields.h - the OpenAI / llama-server / vLLM request fields beyond the core ones, parsed
 * into a job: response_format (text, json_object, json_schema), logit_bias, repetition_penalty,
 * min_tokens, ignore_eos; and on /v1/completions the prompt forms (a string, one string in an
 * array, token ids), suffix (fill-in-the-middle) and echo. Everything a job points at is owned
 * by struct oai_extras, which lives as long as the request. */
#ifndef TIDE_OAI_FIELDS_H
#define TIDE_OAI_FIELDS_H

#include "common.h"
#include "engine/session.h"

#include <cjson/cJSON.h>

#define OAI_MAX_PROMPTS 16 /* prompts x n: 16 choices at most */

struct oai_extras {
    struct grammar *grammar;   /* json_schema's compiled grammar */
    struct logit_bias *bias;
    int *prompt_ids;           /* a token-id prompt */
    struct gen_prompt prompts[OAI_MAX_PROMPTS]; /* several prompts (n_prompts > 1) */
    int *prompt_id_lists[OAI_MAX_PROMPTS];      /* their token ids, when given as ids */
    int n_prompts;
    char *prompt_text;         /* the fill-in-the-middle prompt built around suffix */
    bool echo;
    char *echo_text;           /* echo: the prompt as the client sent it (ids as text) */
};

/* The model's vocabulary, for token ids in logit_bias and prompts and for suffix's FIM tokens.
 * Set once the engine is loaded; the tokenizer is read-only from then on. */
struct tokenizer;
void openai_set_tokenizer(const struct tokenizer *tok);

/* Both endpoints. Call after max_tokens is parsed (min_tokens is checked against it). Errors:
 * TIDE_EINVAL with msg and *param naming the field, TIDE_ENOMEM. */
int oai_parse_sampling(const cJSON *root, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                       const char **param);
/* /v1/completions: prompt, suffix, echo. */
int oai_parse_prompt(const cJSON *root, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                     const char **param);
void oai_extras_free(struct oai_extras *x);

#endif
