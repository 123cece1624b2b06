/* json_text.h - JSON strings with explicit lengths, and the raw request body check.
 *
 * cJSON's strings end at the first NUL byte, so generated text that holds one (a model can
 * produce a 0x00 byte token) was cut short in the non-streamed answer (issue 27 item 8).
 * These helpers take (pointer, length), write NUL as \u0000, and hand cJSON the finished
 * literal as a raw item, which it prints verbatim. */
#ifndef TIDE_JSON_TEXT_H
#define TIDE_JSON_TEXT_H

#include "common.h"

#include <cjson/cJSON.h>

/* The JSON string literal (quotes included) for len bytes of s: ", \ and control bytes
 * escaped (NUL as \u0000), bytes that are not valid UTF-8 as U+FFFD. malloc'd; NULL when
 * out of memory. */
char *json_quote(const char *s, size_t len);
/* A cJSON item printing as that literal (cJSON_Raw); NULL when out of memory. */
cJSON *json_string_n(const char *s, size_t len);
/* Adds it to obj under key; false when out of memory. */
bool json_add_string_n(cJSON *obj, const char *key, const char *s, size_t len);

/* cJSON accepts what RFC 8259 forbids and then answers wrong: invalid UTF-8 passes through
 * to the tokenizer, and a raw control byte or a \u0000 escape inside a string silently cuts
 * the C string short. One pass over the raw body before parsing rejects all three (outside
 * strings valid JSON has no backslash, so tracking escapes is exact). The same pass bounds
 * the parse tree before cJSON builds it (a 32 MiB body of numbers cost 1.3 GiB of cJSON
 * items, issue 27): *elements counts the values cJSON would allocate (commas and brackets
 * outside strings, an upper bound) and nesting past JSON_MAX_DEPTH is refused. cJSON reads
 * strings as this pass does, so the counts hold up to wherever cJSON would stop on bad JSON.
 * Returns why the body is refused, to follow "request body" or "'field'" (NULL: it is not),
 * and *field the top-level member it happened in when that is a known request field
 * (static; else NULL). */
#define JSON_MAX_DEPTH 128
const char *json_body_check(const char *body, size_t len, long *elements, const char **field);

#endif
