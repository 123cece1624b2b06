/* json_text.c - JSON string literals from (pointer, length) text, and the one pass over a
 * raw request body before cJSON sees it; see json_text.h. */
#include "server/json_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the valid UTF-8 character at s (at most n bytes), 0 when it is not one. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t k = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    if (!k || n <= k) return 0;
    unsigned char c1 = s[1];
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
        (c == 0xF4 && c1 > 0x8F))
        return 0;
    for (size_t i = 1; i <= k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return k + 1;
}

char *json_quote(const char *s, size_t len)
{
    /* worst case: every byte becomes \u00XX (6) or U+FFFD (3) */
    if (len > (SIZE_MAX - 3) / 6) return NULL;
    char *out = malloc(len * 6 + 3), *o = out;
    if (!out) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    *o++ = '"';
    for (size_t i = 0; i < len;) {
        unsigned char c = u[i];
        if (c >= 0x80) {
            size_t k = utf8_char(u + i, len - i);
            if (k) { memcpy(o, u + i, k); o += k; i += k; }
            else { memcpy(o, "\xEF\xBF\xBD", 3); o += 3; i++; }
            continue;
        }
        i++;
        switch (c) {
        case '"': *o++ = '\\'; *o++ = '"'; break;
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        case '\b': *o++ = '\\'; *o++ = 'b'; break;
        case '\f': *o++ = '\\'; *o++ = 'f'; break;
        default:
            if (c < 0x20) o += sprintf(o, "\\u%04x", c);   /* NUL too: \u0000 */
            else *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

cJSON *json_string_n(const char *s, size_t len)
{
    char *q = json_quote(s, len);
    if (!q) return NULL;
    cJSON *item = cJSON_CreateRaw(q);
    free(q);
    return item;
}

bool json_add_string_n(cJSON *obj, const char *key, const char *s, size_t len)
{
    cJSON *item = json_string_n(s, len);
    if (!item) return false;
    if (!cJSON_AddItemToObject(obj, key, item)) { cJSON_Delete(item); return false; }
    return true;
}

/* The request fields an error in the raw body can be blamed on (param must outlive the
 * request: these are static). */
static const char *const known_fields[] = {
    "messages", "prompt", "model", "stop", "user", "response_format", "stream_options", "suffix",
    "logit_bias", "tools", "tool_choice", "functions", "function_call", "metadata", "seed", "n",
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "stream", "logprobs", "top_logprobs",
};

static const char *field_named(const unsigned char *k, size_t n)
{
    for (size_t i = 0; i < sizeof known_fields / sizeof known_fields[0]; i++)
        if (strlen(known_fields[i]) == n && memcmp(known_fields[i], k, n) == 0) return known_fields[i];
    return NULL;
}

const char *json_body_check(const char *body, size_t len, long *elements, const char **field)
{
    const unsigned char *s = (const unsigned char *)body;
    bool in_str = false, in_value = false;
    long n = 1, depth = 0;
    size_t str_at = 0, key_at = 0, key_len = 0;
    const char *why = NULL;
    size_t i;
    for (i = 0; i < len && !why; i++) {
        unsigned char c = s[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') { why = "contains a raw control character"; break; }
        if (c == '"') {
            in_str = !in_str;
            if (in_str) { str_at = i + 1; continue; }
            if (depth == 1 && !in_value) { key_at = str_at; key_len = i - str_at; }   /* a top-level key */
            continue;
        }
        if (!in_str) {
            if (c == ',') { n++; if (depth == 1) in_value = false; }
            else if (c == ':' && depth == 1) in_value = true;
            else if (c == '[' || c == '{') {
                n += 2;
                if (++depth > JSON_MAX_DEPTH) { why = "is nested too deeply (JSON depth over 128)"; break; }
            } else if (c == ']' || c == '}') depth--;
        }
        if (c == '\\' && i + 1 < len) {
            if (len - i >= 6 && memcmp(s + i + 1, "u0000", 5) == 0) { why = "must not contain NUL characters (\\u0000)"; break; }
            i++;                      /* skip the escaped byte: it may be a quote */
            continue;
        }
        if (c < 0x80) continue;
        /* UTF-8: shortest form only, no surrogates, nothing above U+10FFFF. */
        int k = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        bool ok = k > 0 && len - i > (size_t)k;
        if (ok) {
            unsigned char c1 = s[i + 1];
            ok = !((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
                   (c == 0xF4 && c1 > 0x8F));
            for (int m = 1; ok && m <= k; m++) ok = (s[i + m] & 0xC0) == 0x80;
        }
        if (!ok) { why = "is not valid UTF-8"; break; }
        i += (size_t)k;
    }
    *elements = n;
    /* blame the top-level member the bad byte is in, when it is one of ours */
    *field = why && in_value && depth >= 1 ? field_named(s + key_at, key_len) : NULL;
    return why;
}
