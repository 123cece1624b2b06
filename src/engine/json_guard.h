/* json_guard.h - JSON mode (`response_format: {"type": "json_object"}`): a byte-level checker
 * that says whether a text is still the start of a valid JSON object (RFC 8259).
 *
 * The sampler asks it, for every candidate token, whether appending the token's bytes keeps
 * the text a valid prefix, and masks the tokens that do not; end-of-generation is allowed only
 * once the object is complete. So the reply is valid JSON whenever it ends with "stop"; a reply
 * cut by max_tokens ("length") is a valid prefix only. The state is a small value type: copy it
 * to try bytes without committing them. */
#ifndef TIDE_JSON_GUARD_H
#define TIDE_JSON_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_GUARD_MAX_DEPTH 32

struct json_guard {
    uint8_t state;           /* enum in json_guard.c */
    uint8_t in_key;          /* the string being read is an object key */
    uint8_t aux;             /* \u hex digits left, or the position in a literal */
    uint8_t literal;         /* which literal: 't', 'f' or 'n' */
    uint8_t depth;
    char stack[JSON_GUARD_MAX_DEPTH]; /* '{' or '[' per open container */
};

void json_guard_init(struct json_guard *g);
/* Feed n bytes; false when they make the text something no valid JSON object starts with
 * (g is then undefined: feed a copy when only trying). */
bool json_guard_feed(struct json_guard *g, const char *bytes, size_t n);
/* The text so far is one complete JSON object (trailing whitespace allowed). */
bool json_guard_complete(const struct json_guard *g);

#endif
