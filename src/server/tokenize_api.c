/* tokenize_api.c - POST /tokenize and POST /detokenize (see tokenize_api.h). */
#include "server/tokenize_api.h"
#include "engine/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *body_object(const struct http_request *rq, struct http_response *rs)
{
    cJSON *o = cJSON_ParseWithLength(rq->body, rq->body_len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        http_error(rs, 400, "invalid_request_error", "request body must be a JSON object", NULL, NULL);
        return NULL;
    }
    return o;
}

static bool flag(const cJSON *o, const char *name, bool dflt, bool *out, struct http_response *rs)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) {
        char m[96];
        snprintf(m, sizeof m, "'%s' must be a boolean", name);
        http_error(rs, 400, "invalid_request_error", m, name, NULL);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

/* A piece as a string when its bytes are whole UTF-8, else as its byte values (llama-server). */
static cJSON *piece_json(const char *p, int n)
{
    char out[3 * (256 + 8)];
    struct utf8_stream u = {0};
    size_t m = utf8_stream_feed(&u, p, (size_t)n, out);
    if (u.n_pending == 0 && m == (size_t)n && !memcmp(out, p, (size_t)n)) {
        out[m] = 0;
        if (strlen(out) == m) return cJSON_CreateString(out);
    }
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

void tokenize_handle(const struct tokenizer *tok, const struct http_request *rq, struct http_response *rs)
{
    cJSON *o = body_object(rq, rs);
    if (!o) return;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    bool add_special, parse_special, with_pieces;
    if (!cJSON_IsString(content)) {
        http_error(rs, 400, "invalid_request_error", "'content' must be a string", "content", NULL);
    } else if (flag(o, "add_special", false, &add_special, rs) && flag(o, "parse_special", true, &parse_special, rs) &&
               flag(o, "with_pieces", false, &with_pieces, rs)) {
        int *ids = NULL, n = 0;
        int rc = tokenizer_encode(tok, content->valuestring, strlen(content->valuestring), parse_special, NULL, &ids, &n);
        if (rc < 0) {
            http_error(rs, 500, "server_error", tide_strerror(rc), NULL, NULL);
        } else {
            cJSON *res = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(res, "tokens");
            int bos = add_special && tokenizer_add_bos(tok) ? tokenizer_bos(tok) : -1;
            for (int i = bos >= 0 ? -1 : 0; i < n; i++) {
                int id = i < 0 ? bos : ids[i];
                if (!with_pieces) {
                    cJSON_AddItemToArray(arr, cJSON_CreateNumber(id));
                    continue;
                }
                char p[256];
                int pl = tokenizer_token_bytes(tok, id, p, sizeof p);
                cJSON *e = cJSON_CreateObject();
                cJSON_AddNumberToObject(e, "id", id);
                cJSON_AddItemToObject(e, "piece", piece_json(p, pl < 0 ? 0 : pl));
                cJSON_AddItemToArray(arr, e);
            }
            rs->body = cJSON_PrintUnformatted(res);
            cJSON_Delete(res);
            if (!rs->body) http_error(rs, 500, "server_error", "out of memory", NULL, NULL);
        }
        free(ids);
    }
    cJSON_Delete(o);
}

void detokenize_handle(const struct tokenizer *tok, const struct http_request *rq, struct http_response *rs)
{
    cJSON *o = body_object(rq, rs);
    if (!o) return;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *t;
    uint32_t n_vocab = tokenizer_n_vocab(tok);
    size_t len = 0, cap = 4096;
    char *text = malloc(cap);
    struct utf8_stream u = {0};
    bool ok = cJSON_IsArray(tokens), oom = !text;
    const cJSON *list = ok && !oom ? tokens : NULL;
    cJSON_ArrayForEach(t, list) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= n_vocab) {
            ok = false;
            break;
        }
        char p[256];
        int pl = tokenizer_token_bytes(tok, (int)t->valuedouble, p, sizeof p);
        if (len + 3 * (sizeof p + 8) * 2 + 1 > cap) { /* room for this piece and the final flush */
            char *nt = realloc(text, cap *= 2);
            if (!nt) { oom = true; break; }
            text = nt;
        }
        len += utf8_stream_feed(&u, p, pl < 0 ? 0 : (size_t)pl, text + len);
    }
    if (oom) {
        http_error(rs, 500, "server_error", "out of memory", NULL, NULL);
    } else if (!ok) {
        char m[128];
        snprintf(m, sizeof m, "'tokens' must be an array of token ids of this model (0..%u)", n_vocab - 1);
        http_error(rs, 400, "invalid_request_error", m, "tokens", NULL);
    } else {
        len += utf8_stream_flush(&u, text + len);
        text[len] = 0;
        cJSON *res = cJSON_CreateObject();
        cJSON_AddStringToObject(res, "content", text);
        rs->body = cJSON_PrintUnformatted(res);
        cJSON_Delete(res);
        if (!rs->body) http_error(rs, 500, "server_error", "out of memory", NULL, NULL);
    }
    free(text);
    cJSON_Delete(o);
}
