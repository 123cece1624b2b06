/* json_text.h - JSON strings with explicit lengths.
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

#endif
