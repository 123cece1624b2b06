/* json_guard.h - constrained JSON output: a pushdown automaton over bytes that says whether a
 * text is still the start of a JSON value a grammar allows.
 *
 * Two grammars drive it: "any JSON object" (`response_format: {"type": "json_object"}`), and one
 * compiled from a JSON Schema (`json_schema`, json_schema.c). The sampler asks, for every
 * candidate token, whether appending the token's bytes keeps the text a valid prefix, and masks
 * the tokens that do not (json_guard_mask); end-of-generation is allowed only once the value is
 * complete. So a reply that ends with "stop" is a whole valid value; one cut by max_tokens
 * ("length") is a valid prefix only.
 *
 * Whitespace is bounded so that greedy decoding cannot run away in it: none before or after the
 * top-level value, at most JSON_GUARD_MAX_WS bytes in a row between the tokens of a container.
 * Numbers are bounded too (JSON_GUARD_MAX_DIGITS digits before and after the point, 3 in the
 * exponent), so "1111..." cannot run away either.
 *
 * anyOf makes the grammar nondeterministic: the state is a small set of alternative parse
 * stacks (at most JSON_GUARD_MAX_ALT; one more alternative is dropped, which only narrows what
 * may be written, never lets through what the schema refuses). */
#ifndef TIDE_JSON_GUARD_H
#define TIDE_JSON_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_GUARD_MAX_DEPTH 32
#define JSON_GUARD_MAX_ALT 16
#define JSON_GUARD_MAX_WS 2
#define JSON_GUARD_MAX_DIGITS 15

struct grammar; /* compiled, immutable once built: shared read-only by any number of guards */

/* One parse frame: a grammar node being matched and where in it (fields per node kind). */
struct jg_frame {
    uint16_t node;
    uint8_t phase;
    uint8_t aux;      /* digits so far, escape/UTF-8 bytes left */
    uint16_t idx;     /* object: the next property; literal set: the matched tag */
    uint16_t pos;     /* literal set: bytes matched */
    uint16_t lo, hi;  /* literal set: the sorted candidates still consistent with the bytes */
};

struct jg_alt {
    uint8_t depth;    /* 0: the top-level value is complete */
    uint8_t ws;       /* whitespace bytes in a row */
    struct jg_frame f[JSON_GUARD_MAX_DEPTH];
};

struct json_guard {
    const struct grammar *g;
    uint8_t n_alt;    /* 0: dead (no continuation) */
    struct jg_alt alt[JSON_GUARD_MAX_ALT];
};

/* The built-in grammar "one JSON object" (JSON mode); lives for the whole process. */
const struct grammar *grammar_json_object(void);
void grammar_free(struct grammar *g);

/* gr NULL: JSON mode (grammar_json_object()). */
void json_guard_init(struct json_guard *g, const struct grammar *gr);
/* Feed n bytes; false when they make the text something the grammar does not start with
 * (g is then dead: use json_guard_accepts to only try). */
bool json_guard_feed(struct json_guard *g, const char *bytes, size_t n);
/* Whether feeding these bytes would keep the text a valid prefix (g unchanged). */
bool json_guard_accepts(const struct json_guard *g, const char *bytes, size_t n);
/* The text so far is one complete value of the grammar (end-of-generation may come now). */
bool json_guard_complete(const struct json_guard *g);

struct tokenizer;
/* logits[id] = -inf for every token whose bytes the grammar refuses next; end-of-generation
 * tokens only while the value is complete (and eog_ok), and then nothing else unless the value
 * can still go on (a number). Special tokens are refused. When nothing at all is allowed, eos is
 * let through so the reply ends rather than sampling from nothing. One pass over the vocabulary. */
void json_guard_mask(const struct json_guard *g, const struct tokenizer *tok, bool eog_ok, float *logits,
                     uint32_t n_vocab);

struct sampler; /* sample.h */
/* The mask before each sampler_sample: the grammar's (g, when p.json_object) and the
 * end-of-generation ban while ignore_eos or fewer than min_tokens tokens (n_generated) have
 * been generated. Does nothing when neither applies. */
void sampler_constrain(struct sampler *s, const struct json_guard *g, const struct tokenizer *tok,
                       int n_generated, float *logits);

#endif
