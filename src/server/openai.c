/* openai.c - OpenAI Chat Completions and legacy Completions: request validation and the
 * engine-thread side that turns generated text into response JSON / SSE chunks. */
#include "server/openai.h"
#include "server/metrics.h"
#include "server/oai_fields.h"
#include "server/recent.h"
#include "engine/session.h"
#include "server/runtime.h"
#include "vision/image.h"
#include "vision/vision.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct choice_out {
    char *text;
    size_t len, cap;
    cJSON *logprobs;      /* array (non-stream, logprobs on) */
    bool role_sent;       /* stream: first delta with the role went out */
    size_t lp_offset;     /* stream, legacy logprobs: bytes of completion so far (text_offset) */
};

struct oai_req {
    bool chat, stream, include_usage;
    cJSON *root;          /* owns every string the job points at */
    struct chat_message *msgs;
    int n_msgs;
    char **owned;         /* joined text parts */
    int n_owned;
    struct gen_job gj;
    struct oai_extras x;  /* grammar, logit_bias, token prompt, echo text */
    char id[48];
    long created;
    char model[256];
    struct choice_out ch[16];
    struct job *job;      /* back pointer while running */
    double t_tok;         /* when choice 0 got its last token (0: none yet), for TTFT and ITL */
    struct engine *eng;
    struct runtime *rt;
    /* images, decoded on the HTTP thread; embedded on the engine thread */
    int n_images;
    uint8_t *img_bytes[64];
    size_t img_len[64];
    struct image_u8 img[64];
    float *img_embd[64];
    struct gen_image gimg[64];
};

static struct openai_image_limits img_limits = {8, (size_t)20 << 20, 50000000};

void openai_set_image_limits(const struct openai_image_limits *l) { img_limits = *l; }

bool openai_req_stream(const struct oai_req *r) { return r->stream; }

char *openai_error_json(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param); else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code); else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

void openai_req_free(void *p)
{
    struct oai_req *r = p;
    if (!r) return;
    cJSON_Delete(r->root);
    oai_extras_free(&r->x);
    for (int i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    free(r->msgs);
    for (int i = 0; i < r->n_images; i++) {
        free(r->img_bytes[i]);
        image_u8_free(&r->img[i]);
        free(r->img_embd[i]);
    }
    for (int i = 0; i < 16; i++) { free(r->ch[i].text); cJSON_Delete(r->ch[i].logprobs); }
    free(r);
}

#define FAIL(p, ...) do { snprintf(msg, msglen, __VA_ARGS__); *param = (p); return TIDE_EINVAL; } while (0)

/* Number field in [lo, hi]; absent or null leaves *out alone. */
static int num_field(const cJSON *root, const char *name, double lo, double hi, bool lo_open,
                     double *out, char *msg, size_t msglen, const char **param)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        FAIL(name, "'%s' must be a number", name);
    double d = v->valuedouble;
    if (d > hi || d < lo || (lo_open && d == lo))
        FAIL(name, "'%s' must be in %s%g, %g]", name, lo_open ? "(" : "[", lo, hi);
    *out = d;
    return 0;
}

static int int_field(const cJSON *root, const char *name, double lo, double hi, long long *out,
                     char *msg, size_t msglen, const char **param)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        FAIL(name, "'%s' must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        FAIL(name, "'%s' must be between %.0f and %.0f", name, lo, hi);
    *out = (long long)v->valuedouble;
    return 0;
}

static int bool_field(const cJSON *root, const char *name, bool *out, char *msg, size_t msglen,
                      const char **param)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) FAIL(name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int parse_messages(struct oai_req *r, const cJSON *msgs, char *msg, size_t msglen,
                          const char **param)
{
    if (!msgs) FAIL("messages", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1)
        FAIL("messages", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(msgs);
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    r->owned = calloc((size_t)n, sizeof *r->owned);
    if (!r->msgs || !r->owned) FAIL(NULL, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        int i = r->n_msgs;
        if (!cJSON_IsObject(m)) FAIL("messages", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) FAIL("messages", "messages[%d].role must be a string", i);
        const char *rs = role->valuestring;
        if (strcmp(rs, "developer") == 0) rs = "system";
        else if (strcmp(rs, "tool") == 0) rs = "user";   /* the templates know no tool turn */
        else if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            FAIL("messages", "messages[%d].role must be system, developer, user, assistant or tool", i);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *text = "";
        if (cJSON_IsString(c)) {
            text = c->valuestring;
        } else if (cJSON_IsArray(c)) {
            size_t total = 1, ml = strlen(ENGINE_IMAGE_MARKER);
            const cJSON *p;
            cJSON_ArrayForEach(p, c) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
                if (!cJSON_IsObject(p) || !cJSON_IsString(t))
                    FAIL("messages", "messages[%d].content parts must be objects with a 'type'", i);
                if (strcmp(t->valuestring, "image_url") == 0) {
                    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(p, "image_url");
                    const cJSON *url = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url")
                                                          : cJSON_IsString(iu) ? iu : NULL;
                    if (!cJSON_IsString(url))
                        FAIL("messages", "messages[%d].content: image_url needs {\"url\": \"data:image/...;base64,...\"}", i);
                    if (strcmp(rs, "user") && strcmp(rs, "system"))
                        FAIL("messages", "messages[%d]: images are only accepted in user messages", i);
                    if (r->n_images >= img_limits.max_images || r->n_images >= 64)
                        FAIL("messages", "too many images: at most %d per request", img_limits.max_images);
                    int k = r->n_images;
                    char e2[200] = "";
                    int irc = image_parse_url(url->valuestring, strlen(url->valuestring), img_limits.max_bytes,
                                              &r->img_bytes[k], &r->img_len[k], e2, sizeof e2);
                    if (irc == 0) {
                        struct image_limits lim = {img_limits.max_bytes, img_limits.max_pixels};
                        irc = image_decode(r->img_bytes[k], r->img_len[k], &lim, &r->img[k], e2, sizeof e2);
                        if (irc) { free(r->img_bytes[k]); r->img_bytes[k] = NULL; }
                    }
                    if (irc) FAIL("messages", "messages[%d]: image %d: %s", i, k, e2[0] ? e2 : tide_strerror(irc));
                    r->n_images++;
                    total += ml;
                    continue;
                }
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (strcmp(t->valuestring, "text") || !cJSON_IsString(tx))
                    FAIL("messages", "messages[%d].content: unsupported part (expected text or image_url)", i);
                total += strlen(tx->valuestring);
            }
            char *joined = malloc(total);
            if (!joined) FAIL(NULL, "out of memory");
            joined[0] = 0;
            cJSON_ArrayForEach(p, c) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
                if (strcmp(t->valuestring, "image_url") == 0) strcat(joined, ENGINE_IMAGE_MARKER);
                else strcat(joined, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
            }
            r->owned[r->n_owned++] = joined;
            text = joined;
        } else if (!(cJSON_IsNull(c) || !c) || strcmp(rs, "assistant") != 0) {
            /* Only an assistant turn (e.g. one with tool_calls) may have no content. */
            FAIL("messages", "messages[%d].content must be a string or an array of parts", i);
        }
        r->msgs[i].role = rs;
        r->msgs[i].content = text;
        r->n_msgs++;
    }
    return 0;
}

/* cJSON accepts what RFC 8259 forbids and then answers wrong: invalid UTF-8 passes
 * through to the tokenizer, and a raw control byte or a \u0000 escape inside a string
 * silently cuts the C string short. One pass over the raw body before parsing rejects all
 * three. Outside strings valid JSON has no backslash, so tracking escapes is exact. */
static const char *body_check(const unsigned char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return "request body contains a raw control character";
        if (c == '\\' && i + 1 < len) {
            if (len - i >= 6 && memcmp(s + i + 1, "u0000", 5) == 0)
                return "strings must not contain NUL characters (\\u0000)";
            i++;                      /* skip the escaped byte: it may be a quote */
            continue;
        }
        if (c < 0x80) continue;
        /* UTF-8: shortest form only, no surrogates, nothing above U+10FFFF. */
        int n = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (n < 0 || len - i <= (size_t)n) return "request body is not valid UTF-8";
        unsigned char c1 = s[i + 1];
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
            (c == 0xF4 && c1 > 0x8F))
            return "request body is not valid UTF-8";
        for (int k = 1; k <= n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return "request body is not valid UTF-8";
        i += (size_t)n;
    }
    return NULL;
}

int openai_parse(const char *body, size_t len, bool chat, const char *model_id,
                 struct oai_req **out, char *msg, size_t msglen, const char **param)
{
    *param = NULL;
    const char *bad = body_check((const unsigned char *)body, len);
    if (bad) { snprintf(msg, msglen, "%s", bad); return TIDE_EINVAL; }
    struct oai_req *r = calloc(1, sizeof *r);
    if (!r) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    r->chat = chat;
    const char *end = NULL;
    r->root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    int rc = TIDE_EINVAL;
    if (!r->root) { snprintf(msg, msglen, "request body is not valid JSON"); goto fail; }
    /* cJSON stops after the first value; anything but whitespace after it is an error. */
    while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end != body + len) { snprintf(msg, msglen, "request body is not valid JSON (trailing data)"); goto fail; }
    if (!cJSON_IsObject(r->root)) { snprintf(msg, msglen, "request body must be a JSON object"); goto fail; }
    const cJSON *root = r->root;
    struct gen_job *g = &r->gj;
    sampling_params_default(&g->sp);
    g->max_tokens = -1;
    g->n = 1;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) {
        snprintf(msg, msglen, "'model' must be a string"); *param = "model"; goto fail;
    }
    snprintf(r->model, sizeof r->model, "%s", model_id);
    if (chat) {
        if ((rc = parse_messages(r, cJSON_GetObjectItemCaseSensitive(root, "messages"), msg, msglen, param)))
            goto fail;
        g->messages = r->msgs;
        g->n_messages = r->n_msgs;
    } else if ((rc = oai_parse_prompt(root, g, &r->x, msg, msglen, param))) {
        goto fail;
    }
    rc = TIDE_EINVAL;
    if (bool_field(root, "stream", &r->stream, msg, msglen, param)) goto fail;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) { snprintf(msg, msglen, "'stream_options' must be an object"); *param = "stream_options"; goto fail; }
        if (bool_field(so, "include_usage", &r->include_usage, msg, msglen, param)) { *param = "stream_options.include_usage"; goto fail; }
    }
    long long ll = -1;
    if (int_field(root, "max_tokens", 1, 1e9, &ll, msg, msglen, param)) goto fail;
    if (chat && int_field(root, "max_completion_tokens", 1, 1e9, &ll, msg, msglen, param)) goto fail;
    g->max_tokens = (int)ll;
    double d;
    d = g->sp.temperature; if (num_field(root, "temperature", 0, 2, false, &d, msg, msglen, param)) goto fail; g->sp.temperature = (float)d;
    d = g->sp.top_p; if (num_field(root, "top_p", 0, 1, true, &d, msg, msglen, param)) goto fail; g->sp.top_p = (float)d;
    d = g->sp.min_p; if (num_field(root, "min_p", 0, 1, false, &d, msg, msglen, param)) goto fail; g->sp.min_p = (float)d;
    d = g->sp.presence_penalty; if (num_field(root, "presence_penalty", -2, 2, false, &d, msg, msglen, param)) goto fail; g->sp.presence_penalty = (float)d;
    d = g->sp.frequency_penalty; if (num_field(root, "frequency_penalty", -2, 2, false, &d, msg, msglen, param)) goto fail; g->sp.frequency_penalty = (float)d;
    ll = g->sp.top_k; if (int_field(root, "top_k", 0, 1e9, &ll, msg, msglen, param)) goto fail; g->sp.top_k = (int)ll;
    ll = (long long)g->sp.seed;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (seed && !cJSON_IsNull(seed)) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble)) {
            snprintf(msg, msglen, "'seed' must be an integer"); *param = "seed"; goto fail;
        }
        /* Outside int64 the cast below is undefined behaviour (UBSan: float-cast-overflow). */
        if (!(seed->valuedouble >= -9223372036854775808.0 && seed->valuedouble < 9223372036854775808.0)) {
            snprintf(msg, msglen, "'seed' must be a 64-bit integer"); *param = "seed"; goto fail;
        }
        g->sp.seed = (uint64_t)(int64_t)seed->valuedouble;
    } else {
        /* No seed: a fresh one per request, as OpenAI does. */
        g->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)r << 16) ^ (uint64_t)(tide_now() * 1e6);
    }
    ll = 1; if (int_field(root, "n", 1, 16, &ll, msg, msglen, param)) goto fail; g->n = (int)ll;
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsString(stop)) {
            if (stop->valuestring[0]) g->stop[g->n_stop++] = stop->valuestring;
        } else if (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) <= JOB_MAX_STOP) {
            const cJSON *s;
            cJSON_ArrayForEach(s, stop) {
                if (!cJSON_IsString(s)) { snprintf(msg, msglen, "'stop' entries must be strings"); *param = "stop"; goto fail; }
                if (s->valuestring[0]) g->stop[g->n_stop++] = s->valuestring;
            }
        } else {
            snprintf(msg, msglen, "'stop' must be a string or an array of up to %d strings", JOB_MAX_STOP);
            *param = "stop"; goto fail;
        }
    }
    if (chat) {
        if (bool_field(root, "logprobs", &g->sp.logprobs, msg, msglen, param)) goto fail;
        ll = 0; if (int_field(root, "top_logprobs", 0, 20, &ll, msg, msglen, param)) goto fail;
        if (ll > 0 && !g->sp.logprobs) {
            snprintf(msg, msglen, "'top_logprobs' requires 'logprobs' to be true"); *param = "top_logprobs"; goto fail;
        }
        g->sp.top_logprobs = (int)ll;
    } else {
        /* Legacy: logprobs is an integer count of alternatives. */
        ll = -1; if (int_field(root, "logprobs", 0, 5, &ll, msg, msglen, param)) goto fail;
        if (ll >= 0) {
            g->sp.logprobs = true;
            g->sp.top_logprobs = (int)ll;
        }
    }
    if ((rc = oai_parse_sampling(root, g, &r->x, msg, msglen, param))) goto fail;
    static unsigned long counter;
    snprintf(r->id, sizeof r->id, "%s-%lx%08lx", chat ? "chatcmpl" : "cmpl", (unsigned long)time(NULL),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    r->created = (long)time(NULL);
    *out = r;
    return 0;
fail:
    openai_req_free(r);
    return rc ? rc : TIDE_EINVAL;
}

/* ---- engine thread side ---- */

static cJSON *chunk_base(struct oai_req *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    return o;
}

static void send_sse(struct oai_req *r, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return;
    job_write(r->job, "data: ", 6);
    job_write(r->job, s, strlen(s));
    job_write(r->job, "\n\n", 2);
    free(s);
}

static cJSON *logprob_entry(struct oai_req *r, int id, float lp)
{
    char buf[256];
    int n = tokenizer_token_bytes(r->eng->tok, id, buf, sizeof buf - 1);
    if (n < 0) n = 0;
    buf[n] = 0;
    cJSON *e = cJSON_CreateObject();
    /* token as text; invalid UTF-8 pieces still show their exact bytes in "bytes" */
    cJSON_AddStringToObject(e, "token", buf);
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON *b = cJSON_AddArrayToObject(e, "bytes");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    return e;
}

static cJSON *logprob_json(struct oai_req *r, const struct token_logprob *lp)
{
    cJSON *e = logprob_entry(r, lp->id, lp->logprob);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < lp->n_top && i < r->gj.sp.top_logprobs; i++)
        cJSON_AddItemToArray(top, logprob_entry(r, lp->top_ids[i], lp->top_logprobs[i]));
    return e;
}

/* The legacy /v1/completions shape of a run of chat-style entries: parallel arrays tokens,
 * token_logprobs, top_logprobs (token -> logprob objects) and text_offset (bytes into the
 * completion; *offset carries on across stream chunks). */
static cJSON *legacy_logprobs(const cJSON *entries, size_t *offset)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        const char *tok = cJSON_GetObjectItem(e, "token")->valuestring;
        cJSON_AddItemToArray(tokens, cJSON_CreateString(tok));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
        cJSON *top = cJSON_CreateObject();
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(e, "top_logprobs")) {
            const char *k = cJSON_GetObjectItem(t, "token")->valuestring;
            if (!cJSON_HasObjectItem(top, k)) /* two ids can print the same */
                cJSON_AddNumberToObject(top, k, cJSON_GetObjectItem(t, "logprob")->valuedouble);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(e, "bytes"));
    }
    return o;
}

static int append_text(struct choice_out *c, const char *text, size_t len)
{
    if (c->len + len + 1 > c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 256;
        while (nc < c->len + len + 1) nc *= 2;
        char *nb = realloc(c->text, nc);
        if (!nb) return TIDE_ENOMEM;
        c->text = nb;
        c->cap = nc;
    }
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = 0;
    return 0;
}

/* echo (/v1/completions): the prompt text leads every choice's text, or its first chunk. */
static void echo_prompt(struct oai_req *r)
{
    for (int i = 0; i < r->gj.n && i < 16; i++) {
        if (!r->stream) {
            append_text(&r->ch[i], r->x.echo_text, strlen(r->x.echo_text));
            continue;
        }
        cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddNumberToObject(ch, "index", i);
        cJSON_AddStringToObject(ch, "text", r->x.echo_text);
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        send_sse(r, o);
    }
}

static int on_text(void *ud, int choice, const char *text, size_t len, const struct token_logprob *lp)
{
    struct oai_req *r = ud;
    if (job_cancelled(r->job)) return 1;
    if (choice < 0 || choice >= 16) return 0;
    if (choice == 0) {
        /* Choice 0 only: with n > 1 the choices interleave, and their gaps are not ITL. */
        double now = tide_now();
        metrics_observe(r->t_tok > 0 ? METRICS_ITL : METRICS_TTFT,
                        now - (r->t_tok > 0 ? r->t_tok : r->job->t_enqueue));
        r->t_tok = now;
    }
    struct choice_out *c = &r->ch[choice];
    /* The engine calls once per token; an empty piece (text held back for a stop string)
     * needs no chunk unless it carries the token's logprob. */
    if (r->stream && len == 0 && !lp) return 0;
    if (r->stream) {
        cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddNumberToObject(ch, "index", choice);
        char *t = strndup(text, len);
        if (r->chat) {
            if (!c->role_sent) {
                /* OpenAI sends the role alone in the first delta. */
                cJSON *o0 = chunk_base(r), *a0 = cJSON_AddArrayToObject(o0, "choices"), *c0 = cJSON_CreateObject();
                cJSON_AddItemToArray(a0, c0);
                cJSON_AddNumberToObject(c0, "index", choice);
                cJSON_AddStringToObject(cJSON_AddObjectToObject(c0, "delta"), "role", "assistant");
                cJSON_AddNullToObject(c0, "logprobs");
                cJSON_AddNullToObject(c0, "finish_reason");
                send_sse(r, o0);
                c->role_sent = true;
            }
            cJSON_AddStringToObject(cJSON_AddObjectToObject(ch, "delta"), "content", t ? t : "");
            if (lp) {
                cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemToArray(cJSON_AddArrayToObject(l, "content"), logprob_json(r, lp));
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        } else {
            cJSON_AddStringToObject(ch, "text", t ? t : "");
            if (lp) {
                cJSON *one = cJSON_CreateArray();
                cJSON_AddItemToArray(one, logprob_json(r, lp));
                cJSON_AddItemToObject(ch, "logprobs", legacy_logprobs(one, &c->lp_offset));
                cJSON_Delete(one);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        }
        free(t);
        cJSON_AddNullToObject(ch, "finish_reason");
        send_sse(r, o);
    } else {
        if (append_text(c, text, len)) return 1;
        if (lp) {
            if (!c->logprobs) c->logprobs = cJSON_CreateArray();
            cJSON_AddItemToArray(c->logprobs, logprob_json(r, lp));
        }
    }
    return job_cancelled(r->job) ? 1 : 0;
}

static const char *finish_name(enum finish_reason f)
{
    return f == FINISH_LENGTH ? "length" : "stop";
}

static cJSON *usage_json(struct oai_req *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->gj.prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->gj.completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", r->gj.prompt_tokens + r->gj.completion_tokens);
    return u;
}

/* Engine thread: the images' embeddings (the encoder loads on demand unless all are cached). */
static int embed_images(struct oai_req *r, char *err, size_t errlen)
{
    struct vision_lifecycle *v = r->rt->vision;
    if (!v) {
        if (r->rt->vision_error[0])
            snprintf(err, errlen, "%s", r->rt->vision_error);
        else
            snprintf(err, errlen, "this server has no vision model: images need an mmproj in the config");
        return TIDE_EUNSUPPORTED;
    }
    vision_touch(v);
    v->busy = true; /* cleared by openai_run when the request ends */
    for (int i = 0; i < r->n_images; i++) {
        int nt = 0;
        int rc = vision_embed(v, r->img_bytes[i], r->img_len[i], &r->img[i], &r->img_embd[i], &nt, err, errlen);
        if (rc < 0) return rc;
        r->gimg[i] = (struct gen_image){r->img_embd[i], nt};
    }
    vision_touch(v); /* the idle timer counts from the end of the encode */
    r->gj.images = r->gimg;
    r->gj.n_images = r->n_images;
    return 0;
}

/* Between two tokens: control jobs (POST /v1/vram) and timers run here, so a resize
 * pauses this generation rather than waiting for it to end. */
static void at_boundary(void *ud)
{
    struct oai_req *r = ud;
    runtime_boundary(r->rt);
}

void openai_run(struct job *j, void *engine_ctx)
{
    struct oai_req *r = j->ud;
    r->job = j;
    r->rt = engine_ctx;
    r->eng = &r->rt->eng;
    r->gj.on_text = on_text;
    r->gj.boundary = at_boundary;
    r->gj.ud = r;
    char err[640] = "";
    int rc = 0;
    if (r->n_images) {
        rc = embed_images(r, err, sizeof err);
        runtime_publish(r->rt); /* the vision state a client reads next is this one */
    }
    if (rc == 0 && r->x.echo) echo_prompt(r);
    if (rc == 0)
        rc = engine_run(r->eng, &r->gj, err, sizeof err);
    if (r->n_images && r->rt->vision) {
        r->rt->vision->busy = false;
        vision_touch(r->rt->vision); /* idle counts from the end of the last image request */
    }
    metrics_tokens(r->gj.prompt_tokens, r->gj.completion_tokens);
    if (rc == 0) metrics_observe(METRICS_E2E, tide_now() - j->t_enqueue);
    recent_add(r->chat, r->stream, r->n_images, r->gj.prompt_tokens, r->gj.completion_tokens,
               tide_now() - j->t_enqueue,
               rc == TIDE_ECANCELED || job_cancelled(j) ? 499
               : rc == TIDE_ERANGE || rc == TIDE_EINVAL || rc == TIDE_EUNSUPPORTED ? 400 : rc < 0 ? 500 : 200);
    if (rc == TIDE_ECANCELED || job_cancelled(j)) { job_finish(j, 499); return; }
    if (rc < 0) {
        int status = rc == TIDE_ERANGE || rc == TIDE_EINVAL || rc == TIDE_EUNSUPPORTED ? 400 : 500;
        char *e = openai_error_json(err[0] ? err : tide_strerror(rc),
                                    status == 400 ? "invalid_request_error" : "server_error",
                                    /* as OpenAI: the prompt field is what does not fit */
                                    rc == TIDE_ERANGE ? (r->chat ? "messages" : "prompt") : NULL,
                                    rc == TIDE_ERANGE ? "context_length_exceeded" : NULL);
        if (r->stream) {
            job_write(j, "data: ", 6);
            job_write(j, e, strlen(e));
            job_write(j, "\n\ndata: [DONE]\n\n", 16);
        } else {
            job_write(j, e, strlen(e));
        }
        free(e);
        job_finish(j, status);
        return;
    }
    if (r->stream) {
        for (int i = 0; i < r->gj.n; i++) {
            cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
            cJSON_AddItemToArray(chs, ch);
            cJSON_AddNumberToObject(ch, "index", i);
            if (r->chat) {
                cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
                if (!r->ch[i].role_sent) cJSON_AddStringToObject(delta, "role", "assistant");
            } else {
                cJSON_AddStringToObject(ch, "text", "");
            }
            cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddStringToObject(ch, "finish_reason", finish_name(r->gj.finish[i]));
            send_sse(r, o);
        }
        if (r->include_usage) {
            cJSON *o = chunk_base(r);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(r));
            send_sse(r, o);
        }
        job_write(j, "data: [DONE]\n\n", 14);
        job_finish(j, 200);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", r->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->gj.n; i++) {
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddNumberToObject(ch, "index", i);
        const char *text = r->ch[i].text ? r->ch[i].text : "";
        if (r->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text);
            if (r->ch[i].logprobs) {
                cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemToObject(l, "content", r->ch[i].logprobs);
                r->ch[i].logprobs = NULL;
            } else if (r->gj.sp.logprobs) {
                cJSON_AddArrayToObject(cJSON_AddObjectToObject(ch, "logprobs"), "content");
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        } else {
            cJSON_AddStringToObject(ch, "text", text);
            if (r->gj.sp.logprobs) {
                cJSON *none = cJSON_CreateArray();
                size_t off = 0;
                cJSON_AddItemToObject(ch, "logprobs", legacy_logprobs(r->ch[i].logprobs ? r->ch[i].logprobs : none, &off));
                cJSON_Delete(none);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        }
        cJSON_AddStringToObject(ch, "finish_reason", finish_name(r->gj.finish[i]));
    }
    cJSON_AddItemToObject(o, "usage", usage_json(r));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) { job_write(j, s, strlen(s)); free(s); }
    job_finish(j, s ? 200 : 500);
}
