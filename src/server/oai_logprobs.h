/* oai_logprobs.h - a generated token's logprobs as the OpenAI API shows them: the chat shape
 * (an entry per token: token text, logprob, bytes, top_logprobs) and the legacy /v1/completions
 * shape (parallel arrays tokens, token_logprobs, top_logprobs objects, text_offset) built from a
 * run of chat-shape entries. */
#ifndef TIDE_OAI_LOGPROBS_H
#define TIDE_OAI_LOGPROBS_H

#include "engine/sample.h"

#include <cjson/cJSON.h>
#include <stddef.h>

struct tokenizer;

/* One token's entry with its first top_n alternatives. */
cJSON *oai_logprob_json(const struct tokenizer *tok, const struct token_logprob *lp, int top_n);
/* The legacy shape of entries (oai_logprob_json's); *offset: bytes of completion text before them,
 * advanced past them (it carries on across stream chunks). */
cJSON *oai_legacy_logprobs(const cJSON *entries, size_t *offset);

#endif
