/* tool_calls.c - parse a model's tool calls out of its reply, in the format its chat template
 * teaches (see tool_calls.h). Pure text in, calls out: no engine, no request. Every parser
 * gives up (the reply stays content) rather than guess at a half-written call. */
#include "server/tool_calls.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"
#define OSS_TO "to=functions."
#define OSS_MESSAGE "<|message|>"

enum tool_format tool_format_detect(const char *src)
{
    if (!src) return TOOL_FMT_HERMES;
    if (strstr(src, MISTRAL_OPEN)) return TOOL_FMT_MISTRAL;
    if (strstr(src, "to=functions") || strstr(src, "<|channel|>")) return TOOL_FMT_GPT_OSS;
    if (strstr(src, HERMES_OPEN)) return TOOL_FMT_HERMES;
    if (strstr(src, PYTHON_TAG) || strstr(src, "<|start_header_id|>")) return TOOL_FMT_LLAMA3;
    return TOOL_FMT_HERMES;
}

const char *tool_format_name(enum tool_format f)
{
    switch (f) {
    case TOOL_FMT_LLAMA3: return "llama3";
    case TOOL_FMT_MISTRAL: return "mistral";
    case TOOL_FMT_GPT_OSS: return "gpt-oss";
    default: return "hermes";
    }
}

void tool_calls_free(struct tool_calls *tc)
{
    for (int i = 0; i < tc->n; i++) {
        free(tc->call[i].name);
        free(tc->call[i].arguments);
    }
    free(tc->call);
    free(tc->content);
    memset(tc, 0, sizeof *tc);
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* What a function name written outside JSON may hold (mistral name[ARGS], gpt-oss to=functions.NAME). */
static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

static size_t skip_ws(const char *t, size_t p, size_t len)
{
    while (p < len && is_ws(t[p])) p++;
    return p;
}

static bool starts(const char *t, size_t p, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    return p + n <= len && !memcmp(t + p, lit, n);
}

static const char *find(const char *t, size_t from, size_t len, const char *lit)
{
    return from <= len ? memmem(t + from, len - from, lit, strlen(lit)) : NULL;
}

/* One JSON value at t[p..len): parsed, with *end just past it; NULL when there is none. */
static cJSON *json_at(const char *t, size_t p, size_t len, size_t *end)
{
    const char *e = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(t + p, len - p, &e, false);
    if (v) *end = (size_t)(e - t);
    return v;
}

/* Arguments as compact object text: an object, or a string that holds one (some models write
 * it so), or none at all (a function without parameters). NULL when they are anything else. */
static char *arguments_text(const cJSON *a)
{
    if (!a) return strdup("{}");
    if (cJSON_IsObject(a)) return cJSON_PrintUnformatted(a);
    if (!cJSON_IsString(a)) return NULL;
    cJSON *o = cJSON_Parse(a->valuestring);
    char *s = cJSON_IsObject(o) ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* Append a call; TIDE_EINVAL when name/args are not a call, TIDE_ENOMEM. Takes args. */
static int add_call(struct tool_calls *tc, const char *name, size_t name_len, char *args)
{
    if (!args) return TIDE_EINVAL;
    if (!name_len) { free(args); return TIDE_EINVAL; }
    struct tool_call *nc = realloc(tc->call, sizeof *nc * (size_t)(tc->n + 1));
    char *nm = malloc(name_len + 1);
    if (!nc || !nm) { free(nm); free(args); if (nc) tc->call = nc; return TIDE_ENOMEM; }
    tc->call = nc;
    memcpy(nm, name, name_len);
    nm[name_len] = 0;
    tc->call[tc->n++] = (struct tool_call){nm, args};
    return 0;
}

/* {"name": .., "arguments"|"parameters": ..} as a call. */
static int add_object_call(struct tool_calls *tc, const cJSON *o)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name)) return TIDE_EINVAL;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    return add_call(tc, name->valuestring, strlen(name->valuestring), arguments_text(a));
}

/* The content: text pieces outside the calls, joined and trimmed. */
struct text_acc {
    char *p;
    size_t len;
    bool oom;
};

static void acc_add(struct text_acc *a, const char *s, size_t n)
{
    if (!n || a->oom) return;
    char *np = realloc(a->p, a->len + n + 1);
    if (!np) { a->oom = true; return; }
    memcpy(np + a->len, s, n);
    a->p = np;
    a->len += n;
    a->p[a->len] = 0;
}

/* Move the trimmed text into tc->content (NULL when only whitespace). */
static int acc_finish(struct text_acc *a, struct tool_calls *tc)
{
    if (a->oom) { free(a->p); return TIDE_ENOMEM; }
    size_t b = 0, e = a->len;
    while (b < e && is_ws(a->p[b])) b++;
    while (e > b && is_ws(a->p[e - 1])) e--;
    if (b == e) { free(a->p); return 0; }
    memmove(a->p, a->p + b, e - b);
    a->p[e - b] = 0;
    tc->content = a->p;
    return 0;
}

static int parse_hermes(const char *t, size_t len, struct tool_calls *tc, struct text_acc *acc)
{
    size_t pos = 0;
    for (;;) {
        const char *s = find(t, pos, len, HERMES_OPEN);
        if (!s) { acc_add(acc, t + pos, len - pos); return 0; }
        acc_add(acc, t + pos, (size_t)(s - t) - pos);
        size_t p = skip_ws(t, (size_t)(s - t) + strlen(HERMES_OPEN), len), end = 0;
        cJSON *o = json_at(t, p, len, &end);
        int rc = o ? add_object_call(tc, o) : TIDE_EINVAL;
        cJSON_Delete(o);
        if (rc) return rc;
        p = skip_ws(t, end, len);
        if (starts(t, p, len, HERMES_CLOSE)) p += strlen(HERMES_CLOSE);
        else if (p != len) return TIDE_EINVAL;   /* the close may only be missing at the end */
        pos = p;
    }
}

/* Calls from p on: objects separated by whitespace or ';'; text after them is content. */
static int parse_json_run(const char *t, size_t p, size_t len, struct tool_calls *tc, struct text_acc *acc)
{
    for (;;) {
        size_t end = 0;
        cJSON *o = json_at(t, p, len, &end);
        int rc = o ? add_object_call(tc, o) : TIDE_EINVAL;
        cJSON_Delete(o);
        if (rc) return rc;
        p = end;
        while (p < len && (is_ws(t[p]) || t[p] == ';')) p++;
        if (p == len || t[p] != '{') break;
    }
    acc_add(acc, t + p, len - p);
    return 0;
}

static int parse_llama3(const char *t, size_t len, struct tool_calls *tc, struct text_acc *acc)
{
    size_t p = skip_ws(t, 0, len);
    if (starts(t, p, len, PYTHON_TAG)) return parse_json_run(t, skip_ws(t, p + strlen(PYTHON_TAG), len), len, tc, acc);
    if (p < len && t[p] == '{') return parse_json_run(t, p, len, tc, acc);
    const char *s = find(t, 0, len, PYTHON_TAG);
    if (!s) return TIDE_EINVAL;
    acc_add(acc, t, (size_t)(s - t));
    return parse_json_run(t, skip_ws(t, (size_t)(s - t) + strlen(PYTHON_TAG), len), len, tc, acc);
}

static int parse_mistral(const char *t, size_t len, struct tool_calls *tc, struct text_acc *acc)
{
    const char *s = find(t, 0, len, MISTRAL_OPEN);
    if (!s) return TIDE_EINVAL;
    acc_add(acc, t, (size_t)(s - t));
    size_t p = (size_t)(s - t) + strlen(MISTRAL_OPEN), end = len;
    for (;;) {
        p = skip_ws(t, p, len);
        if (p < len && t[p] == '[') {   /* [{"name": .., "arguments": ..}, ..] */
            cJSON *arr = json_at(t, p, len, &end), *o;
            int rc = cJSON_IsArray(arr) && cJSON_GetArraySize(arr) > 0 ? 0 : TIDE_EINVAL;
            cJSON_ArrayForEach(o, arr) if (!rc) rc = add_object_call(tc, o);
            cJSON_Delete(arr);
            if (rc) return rc;
        } else {                        /* name[ARGS]{..}: the newer templates */
            const char *a = find(t, p, len, MISTRAL_ARGS);
            if (!a) return TIDE_EINVAL;
            size_t ne = (size_t)(a - t);
            while (ne > p && is_ws(t[ne - 1])) ne--;
            for (size_t k = p; k < ne; k++)
                if (!name_char(t[k])) return TIDE_EINVAL;
            cJSON *o = json_at(t, skip_ws(t, (size_t)(a - t) + strlen(MISTRAL_ARGS), len), len, &end);
            char *args = cJSON_IsObject(o) ? cJSON_PrintUnformatted(o) : NULL;
            cJSON_Delete(o);
            int rc = add_call(tc, t + p, ne - p, args);
            if (rc) return rc;
        }
        p = skip_ws(t, end, len);
        if (!starts(t, p, len, MISTRAL_OPEN)) break;
        p += strlen(MISTRAL_OPEN);
    }
    acc_add(acc, t + p, len - p);
    return 0;
}

/* Where the gpt-oss message header holding t[at] begins: the first <|start|> or <|channel|>
 * after the last message that ended (<|end|>), or at itself when there is none. */
static size_t oss_header_start(const char *t, size_t at)
{
    size_t from = 0;
    for (const char *e; (e = memmem(t + from, at - from, "<|end|>", 7));) from = (size_t)(e - t) + 7;
    const char *h1 = memmem(t + from, at - from, "<|start|>", 9), *h2 = memmem(t + from, at - from, "<|channel|>", 11);
    const char *h = h1 && (!h2 || h1 < h2) ? h1 : h2;
    return h ? (size_t)(h - t) : at;
}

static int parse_gpt_oss(const char *t, size_t len, struct tool_calls *tc, struct text_acc *acc)
{
    size_t pos = 0;
    for (;;) {
        const char *s = find(t, pos, len, OSS_TO);
        if (!s) break;
        size_t at = (size_t)(s - t);
        if (!tc->n) acc_add(acc, t, oss_header_start(t, at));
        size_t nb = at + strlen(OSS_TO), ne = nb;
        while (ne < len && name_char(t[ne])) ne++;
        const char *m = find(t, ne, len, OSS_MESSAGE);
        const char *next = find(t, ne, len, OSS_TO);
        if (!m || (next && next < m)) return TIDE_EINVAL;
        size_t p = skip_ws(t, (size_t)(m - t) + strlen(OSS_MESSAGE), len), end = 0;
        cJSON *o = json_at(t, p, len, &end);
        char *args = cJSON_IsObject(o) ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        int rc = add_call(tc, t + nb, ne - nb, args);
        if (rc) return rc;
        p = skip_ws(t, end, len);
        if (starts(t, p, len, "<|call|>")) p += 8;
        else if (p != len && !starts(t, p, len, "<|start|>") && !starts(t, p, len, "<|end|>")) return TIDE_EINVAL;
        pos = p;
    }
    return tc->n ? 0 : TIDE_EINVAL;
}

int tool_calls_parse(enum tool_format f, const char *text, size_t len, int max_calls, struct tool_calls *out)
{
    memset(out, 0, sizeof *out);
    struct text_acc acc = {0};
    int rc;
    switch (f) {
    case TOOL_FMT_LLAMA3: rc = parse_llama3(text, len, out, &acc); break;
    case TOOL_FMT_MISTRAL: rc = parse_mistral(text, len, out, &acc); break;
    case TOOL_FMT_GPT_OSS: rc = parse_gpt_oss(text, len, out, &acc); break;
    default: rc = parse_hermes(text, len, out, &acc); break;
    }
    if (rc == 0 && out->n > 0) rc = acc_finish(&acc, out);
    else free(acc.p);
    if (rc || out->n == 0) {
        tool_calls_free(out);
        return rc == TIDE_ENOMEM ? rc : 0;   /* not a call: the text stays content */
    }
    if (max_calls > 0)
        while (out->n > max_calls) {
            out->n--;
            free(out->call[out->n].name);
            free(out->call[out->n].arguments);
        }
    return out->n;
}

int tool_calls_parse_forced(enum tool_format f, const char *forced_name, const char *text, size_t len,
                            struct tool_calls *out)
{
    memset(out, 0, sizeof *out);
    size_t p = skip_ws(text, 0, len), end = 0;
    cJSON *o = json_at(text, p, len, &end);
    int rc = TIDE_EINVAL;
    if (o && skip_ws(text, end, len) == len) {
        if (forced_name)
            rc = cJSON_IsObject(o) ? add_call(out, forced_name, strlen(forced_name), cJSON_PrintUnformatted(o))
                                   : TIDE_EINVAL;
        else
            rc = add_object_call(out, o);
    }
    (void)f;   /* the grammar's key ("arguments" or "parameters") is read either way */
    cJSON_Delete(o);
    if (rc) {
        tool_calls_free(out);
        return rc == TIDE_ENOMEM ? rc : 0;
    }
    return 1;
}

/* The longest suffix of t[0..len) that is a proper prefix of lit. */
static size_t partial_suffix(const char *t, size_t len, const char *lit)
{
    size_t ll = strlen(lit);
    for (size_t k = ll - 1 < len ? ll - 1 : len; k > 0; k--)
        if (!memcmp(t + len - k, lit, k)) return k;
    return 0;
}

/* Text up to a marker (or the part of one at the end) is content; from the marker on, a call. */
static size_t safe_before(const char *t, size_t len, const char *marker, bool *started)
{
    const char *s = find(t, 0, len, marker);
    if (s) { *started = true; return (size_t)(s - t); }
    return len - partial_suffix(t, len, marker);
}

size_t tool_calls_stream_safe(enum tool_format f, const char *t, size_t len, bool at_start, bool *started)
{
    *started = false;
    switch (f) {
    case TOOL_FMT_LLAMA3: {
        if (at_start) {   /* a reply that opens with '{' is a call; whitespace alone may still become one */
            size_t p = skip_ws(t, 0, len);
            if (p == len) return 0;
            if (t[p] == '{') { *started = true; return 0; }
            size_t safe = safe_before(t, len, PYTHON_TAG, started);
            return safe <= p ? 0 : safe;
        }
        return safe_before(t, len, PYTHON_TAG, started);
    }
    case TOOL_FMT_MISTRAL: return safe_before(t, len, MISTRAL_OPEN, started);
    case TOOL_FMT_GPT_OSS: {
        /* a header is content unless it turns out to address a function: hold each one until
         * its <|message|> says which */
        size_t p = 0;
        for (;;) {
            const char *h1 = find(t, p, len, "<|start|>"), *h2 = find(t, p, len, "<|channel|>");
            const char *to = find(t, p, len, OSS_TO);
            const char *h = h1 && (!h2 || h1 < h2) ? h1 : h2;
            if (to && (!h || to < h)) h = to;
            if (!h) {
                size_t k = partial_suffix(t + p, len - p, "<|start|>"), k2 = partial_suffix(t + p, len - p, "<|channel|>");
                size_t k3 = partial_suffix(t + p, len - p, OSS_TO);
                if (k2 > k) k = k2;
                if (k3 > k) k = k3;
                return len - k;
            }
            size_t hs = (size_t)(h - t);
            const char *m = find(t, hs, len, OSS_MESSAGE);
            if (!m) return hs;   /* header still being written */
            const char *to_in = find(t, hs, (size_t)(m - t), OSS_TO);
            if (to_in) { *started = true; return hs; }
            p = (size_t)(m - t) + strlen(OSS_MESSAGE);
        }
    }
    default: return safe_before(t, len, HERMES_OPEN, started);
    }
}

void tool_call_id(char *buf, size_t size)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static uint64_t counter;
    uint64_t x = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(tide_now() * 1e9) ^
                 (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0xBF58476D1CE4E5B9ull);
    char id[32] = "call_";
    for (int i = 5; i < 29; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;   /* xorshift64 */
        id[i] = alnum[x % 62];
    }
    id[29] = 0;
    snprintf(buf, size, "%s", id);
}
