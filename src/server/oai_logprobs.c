/* oai_logprobs.c - the logprobs of a reply in OpenAI's two shapes (oai_logprobs.h). */
#include "server/oai_logprobs.h"
#include "server/json_text.h"
#include "engine/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *logprob_entry(const struct tokenizer *tok, int id, float lp)
{
    char buf[256];
    int n = tokenizer_token_bytes(tok, id, buf, sizeof buf - 1);
    if (n < 0) n = 0;
    buf[n] = 0;
    cJSON *e = cJSON_CreateObject();
    /* token as text (with its length: a 0x00 byte token is "\u0000"); a piece that is not
     * valid UTF-8 shows U+FFFD there and its exact bytes in "bytes" */
    json_add_string_n(e, "token", buf, (size_t)n);
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON *b = cJSON_AddArrayToObject(e, "bytes");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    return e;
}

cJSON *oai_logprob_json(const struct tokenizer *tok, const struct token_logprob *lp, int top_n)
{
    cJSON *e = logprob_entry(tok, lp->id, lp->logprob);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < lp->n_top && i < top_n; i++)
        cJSON_AddItemToArray(top, logprob_entry(tok, lp->top_ids[i], lp->top_logprobs[i]));
    return e;
}

/* The legacy top_logprobs object, token -> logprob, built as raw JSON: its keys are token
 * literals that may hold \u0000, which a cJSON key cannot. Two ids can print the same:
 * the first wins. */
static cJSON *top_object(const cJSON *entries)
{
    size_t cap = 64, len = 1;
    char *o = malloc(cap);
    if (!o) return cJSON_CreateObject();
    o[0] = '{';
    const cJSON *t;
    cJSON_ArrayForEach(t, entries) {
        const char *k = cJSON_GetObjectItem(t, "token")->valuestring;
        size_t kl = strlen(k);
        bool dup = false;
        for (const cJSON *u = entries->child; u != t && !dup; u = u->next)
            dup = strcmp(cJSON_GetObjectItem(u, "token")->valuestring, k) == 0;
        if (dup) continue;
        cJSON *num = cJSON_CreateNumber(cJSON_GetObjectItem(t, "logprob")->valuedouble);
        char *v = cJSON_PrintUnformatted(num);
        cJSON_Delete(num);
        if (!v) continue;
        size_t need = len + kl + strlen(v) + 4;
        if (need > cap) {
            while (cap < need) cap *= 2;
            char *no = realloc(o, cap);
            if (!no) { free(v); break; }
            o = no;
        }
        len += (size_t)sprintf(o + len, "%s%s:%s", len > 1 ? "," : "", k, v);
        free(v);
    }
    o[len++] = '}';
    o[len] = 0;
    cJSON *r = cJSON_CreateRaw(o);
    free(o);
    return r;
}

/* The legacy /v1/completions shape of a run of chat-style entries: parallel arrays tokens,
 * token_logprobs, top_logprobs (token -> logprob objects) and text_offset (bytes into the
 * completion; *offset carries on across stream chunks). */
cJSON *oai_legacy_logprobs(const cJSON *entries, size_t *offset)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        /* "token" items are raw JSON literals (json_text.h): copied as such */
        const char *tok = cJSON_GetObjectItem(e, "token")->valuestring;
        cJSON_AddItemToArray(tokens, cJSON_CreateRaw(tok));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
        cJSON_AddItemToArray(tops, top_object(cJSON_GetObjectItem(e, "top_logprobs")));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(e, "bytes"));
    }
    return o;
}
