/* json_text.c - JSON string literals from (pointer, length) text; see json_text.h. */
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
