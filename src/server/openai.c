/* openai.c - OpenAI Chat Completions and legacy Completions: request validation, and the
 * rendering of generated text into response JSON / SSE chunks (called by the scheduler on the
 * engine thread through openai_gen). */
#include "server/openai.h"
#include "server/config.h"
#include "server/metrics.h"
#include "server/oai_fields.h"
#include "server/oai_tools.h"
#include "server/oai_logprobs.h"
#include "server/harmony.h"
#include "server/recent.h"
#include "server/json_text.h"
#include "memory/host_budget.h"
#include "engine/session.h"
#include "server/runtime.h"
#include "vision/image.h"

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
    size_t sent;          /* stream with tools: bytes of text sent as content (the rest may be a call);
                           * gpt-oss (harmony): bytes of the split's content sent */
    size_t sent_reasoning; /* stream, harmony: bytes of the split's reasoning sent */
    bool call_started;    /* stream with tools: a call began at text[sent] */
};

struct oai_req {
    bool chat, stream, include_usage;
    cJSON *root;          /* owns every string the job points at */
    struct chat_message *msgs;
    int n_msgs;
    char **owned;         /* joined text parts, tool_calls and tools as JSON text */
    int n_owned;
    struct gen_job gj;
    struct oai_extras x;  /* grammar, logit_bias, token prompt, echo text */
    struct oai_tools tools;   /* tools, tool_choice, parallel_tool_calls (chat) */
    char id[48];
    long created;
    char model[256];
    struct choice_out ch[16];
    size_t charged;       /* bytes charged to request_budget: released by openai_req_free */
    struct job *job;      /* back pointer while running */
    double t_tok;         /* when choice 0 got its last token (0: none yet), for TTFT and ITL */
    struct engine *eng;
    struct runtime *rt;
    /* images: decoded on the HTTP thread to check them, then only the compressed bytes are
     * kept while queued (img[] stays empty: vision_embed decodes again on a cache miss) */
    int n_images;
    uint8_t *img_bytes[CONFIG_MAX_IMAGES];
    size_t img_len[CONFIG_MAX_IMAGES];
    struct image_u8 img[CONFIG_MAX_IMAGES];
    float *img_embd[CONFIG_MAX_IMAGES];
    struct gen_image gimg[CONFIG_MAX_IMAGES];
};

static struct openai_image_limits img_limits = {8, (size_t)20 << 20, 50000000};
static long json_max_elements = OPENAI_JSON_MAX_ELEMENTS;

void openai_set_image_limits(const struct openai_image_limits *l)
{
    img_limits = *l;
    if (img_limits.max_images > CONFIG_MAX_IMAGES) /* the request's arrays hold no more */
        img_limits.max_images = CONFIG_MAX_IMAGES;
}
void openai_set_json_max_elements(long n) { json_max_elements = n; }

/* Charge n bytes of this request to the daemon's request budget. */
static bool charge(struct oai_req *r, size_t n)
{
    if (!host_budget_charge(&request_budget, n)) return false;
    r->charged += n;
    return true;
}

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
    host_budget_release(&request_budget, r->charged);
    oai_extras_free(&r->x);
    oai_tools_free(&r->tools);
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
    r->owned = calloc((size_t)n * 2 + 1, sizeof *r->owned);   /* per message: text, tool_calls; + tools */
    if (!r->msgs || !r->owned) FAIL(NULL, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        int i = r->n_msgs;
        if (!cJSON_IsObject(m)) FAIL("messages", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) FAIL("messages", "messages[%d].role must be a string", i);
        const char *rs = role->valuestring;
        if (strcmp(rs, "developer") == 0) rs = "system";
        else if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
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
                    if (r->n_images >= img_limits.max_images)
                        FAIL("messages", "too many images: at most %d per request", img_limits.max_images);
                    int k = r->n_images;
                    char e2[200] = "";
                    size_t ul = strlen(url->valuestring);
                    int irc = charge(r, ul / 4 * 3 + 3) ? 0 : TIDE_EFULL;   /* the bytes kept while queued */
                    if (irc == 0)
                        irc = image_parse_url(url->valuestring, ul, img_limits.max_bytes, &r->img_bytes[k],
                                              &r->img_len[k], e2, sizeof e2);
                    if (irc == 0) {
                        /* Decoded here only to refuse a bad image with a 400 before queueing;
                         * the pixels are not kept (issue 27: three queued requests held
                         * 3.44 GiB of them). The decode is charged to the request budget. */
                        struct image_limits lim = {img_limits.max_bytes, img_limits.max_pixels, &request_budget};
                        irc = image_decode(r->img_bytes[k], r->img_len[k], &lim, &r->img[k], e2, sizeof e2);
                        if (irc) { free(r->img_bytes[k]); r->img_bytes[k] = NULL; }
                        else {
                            host_budget_release(&request_budget, (size_t)r->img[k].w * r->img[k].h * 3);
                            image_u8_free(&r->img[k]);
                            /* the base64 text is not needed again either */
                            free(((cJSON *)url)->valuestring);
                            ((cJSON *)url)->valuestring = NULL;
                        }
                    }
                    if (irc == TIDE_EFULL) {
                        snprintf(msg, msglen, "messages[%d]: image %d: %s", i, k,
                                 e2[0] ? e2 : "no request memory left for it now (request_memory_mib), retry later");
                        *param = "messages";
                        return TIDE_EFULL;
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
        /* for the model's chat template (template.c): the tool call fields as sent */
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
            char *j = cJSON_PrintUnformatted(calls);
            if (!j) FAIL(NULL, "out of memory");
            r->owned[r->n_owned++] = j;
            r->msgs[i].tool_calls_json = j;
            if (cJSON_IsNull(c) || !c) r->msgs[i].content = NULL;
        }
        const cJSON *tcid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id"), *nm = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (cJSON_IsString(tcid)) r->msgs[i].tool_call_id = tcid->valuestring;
        if (cJSON_IsString(nm)) r->msgs[i].name = nm->valuestring;
        r->n_msgs++;
    }
    return 0;
}

int openai_parse(const char *body, size_t len, bool chat, const char *model_id,
                 struct oai_req **out, char *msg, size_t msglen, const char **param)
{
    *param = NULL;
    long elements = 0;
    const char *field = NULL;
    const char *bad = json_body_check(body, len, &elements, &field);
    if (bad) {
        if (field) snprintf(msg, msglen, "'%s' %s", field, bad);
        else snprintf(msg, msglen, "request body %s", bad);
        *param = field;
        return TIDE_EINVAL;
    }
    if (json_max_elements > 0 && elements > json_max_elements) {
        snprintf(msg, msglen, "request body has more than %ld JSON values (json_max_elements)", json_max_elements);
        return TIDE_ERANGE;
    }
    struct oai_req *r = calloc(1, sizeof *r);
    if (!r) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    r->chat = chat;
    /* the tree cJSON is about to build: its items and (at most) the body's text */
    if (!charge(r, (size_t)elements * sizeof(cJSON) + len)) {
        free(r);
        snprintf(msg, msglen, "server is out of request memory (request_memory_mib), retry later");
        return TIDE_EFULL;
    }
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
            goto fail;   /* TIDE_EFULL passes through: 503 */
        g->messages = r->msgs;
        g->n_messages = r->n_msgs;
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) {   /* for the chat template, as sent */
            char *j = cJSON_PrintUnformatted(tools);
            if (!j) { snprintf(msg, msglen, "out of memory"); rc = TIDE_ENOMEM; goto fail; }
            r->owned[r->n_owned++] = j;
            g->tools_json = j;
        }
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
    if (g->n_prompts > 1) { /* the choices of every prompt: n each, prompt by prompt */
        if (g->n * g->n_prompts > 16) {
            snprintf(msg, msglen, "%d prompts x n %d is %d choices; at most 16 a request", g->n_prompts, g->n,
                     g->n * g->n_prompts);
            *param = "n";
            goto fail;
        }
        g->n *= g->n_prompts;
    }
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
    if (chat && (rc = oai_parse_tools(root, g, &r->tools, msg, msglen, param))) goto fail;
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

/* A gpt-oss chat reply with no tools active: harmony text split (tools parse the raw text) */
static bool harmony_req(const struct oai_req *r) { return r->chat && !r->tools.active && r->tools.fmt == TOOL_FMT_GPT_OSS; }

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
    if (r->stream && r->tools.active) {
        /* the whole reply is kept for the call parser; content goes out up to what may start a
         * call (a forced call is all call) */
        if (append_text(c, text, len)) return 1;
        size_t safe = 0;
        if (!c->call_started && !r->tools.forced)
            safe = tool_calls_stream_safe(r->tools.fmt, c->text + c->sent, c->len - c->sent, c->sent == 0,
                                          &c->call_started);
        text = c->text + c->sent;
        len = safe;
        c->sent += safe;
    }
    cJSON *hd = NULL; /* gpt-oss, no tools: the reply kept, its new reasoning/content parts out (raw if not harmony) */
    if (r->stream && harmony_req(r)) {
        if (append_text(c, text, len)) return 1;
        bool h = harmony_text(c->text, c->len);
        if (h) hd = harmony_stream_next(c->text, c->len, &c->sent, &c->sent_reasoning);
        text = c->text + c->sent, len = h ? 0 : c->len - c->sent;
        if (!h) c->sent = c->len;
    }
    /* The engine calls once per token; an empty piece (text held back for a stop string)
     * needs no chunk unless it carries the token's logprob. */
    if (r->stream && len == 0 && !lp && !hd) return 0;
    if (r->stream) {
        cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddNumberToObject(ch, "index", choice);
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
            cJSON *delta = hd ? hd : cJSON_CreateObject();
            cJSON_AddItemToObject(ch, "delta", delta);
            if (!hd) json_add_string_n(delta, "content", text, len);
            if (lp) {
                cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemToArray(cJSON_AddArrayToObject(l, "content"), oai_logprob_json(r->eng->tok, lp, r->gj.sp.top_logprobs));
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        } else {
            json_add_string_n(ch, "text", text, len);
            if (lp) {
                cJSON *one = cJSON_CreateArray();
                cJSON_AddItemToArray(one, oai_logprob_json(r->eng->tok, lp, r->gj.sp.top_logprobs));
                cJSON_AddItemToObject(ch, "logprobs", oai_legacy_logprobs(one, &c->lp_offset));
                cJSON_Delete(one);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        }
        cJSON_AddNullToObject(ch, "finish_reason");
        send_sse(r, o);
    } else {
        if (append_text(c, text, len)) return 1;
        if (lp) {
            if (!c->logprobs) c->logprobs = cJSON_CreateArray();
            cJSON_AddItemToArray(c->logprobs, oai_logprob_json(r->eng->tok, lp, r->gj.sp.top_logprobs));
        }
    }
    return job_cancelled(r->job) ? 1 : 0;
}

static const char *finish_name(enum finish_reason f)
{
    return f == FINISH_LENGTH ? "length" : "stop";
}

/* Stream with tools, at the end of choice i: its calls as one delta.tool_calls chunk, or the
 * text held back as content after all. Returns whether there were calls. */
static bool stream_calls(struct oai_req *r, int i)
{
    struct choice_out *c = &r->ch[i];
    struct tool_calls tc;
    int n = oai_tools_reply(&r->tools, c->text ? c->text : "", c->len, &tc);
    if (n <= 0 && c->sent == c->len) return false;
    cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(chs, ch);
    cJSON_AddNumberToObject(ch, "index", i);
    cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
    if (!c->role_sent) cJSON_AddStringToObject(delta, "role", "assistant");
    c->role_sent = true;
    if (n > 0) cJSON_AddItemToObject(delta, "tool_calls", oai_tool_calls_json(&tc, true));
    else json_add_string_n(delta, "content", c->text + c->sent, c->len - c->sent);
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    send_sse(r, o);
    tool_calls_free(&tc);
    return n > 0;
}

static cJSON *usage_json(struct oai_req *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->gj.prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->gj.completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", r->gj.prompt_tokens + r->gj.completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", r->gj.cached_tokens);
    return u;
}

void openai_req_images(struct oai_req *r, struct req_images *out)
{
    *out = (struct req_images){r->n_images, r->img_bytes, r->img_len, r->img, r->img_embd, r->gimg};
}

/* Engine thread, as the scheduler admits the job: the gen_job to run, rendering through on_text. */
static struct gen_job *openai_begin(struct job *j, void *engine_ctx)
{
    struct oai_req *r = j->ud;
    r->job = j;
    r->rt = engine_ctx;
    r->eng = &r->rt->eng;
    r->gj.on_text = on_text;
    r->gj.ud = r;
    if (r->x.echo)
        echo_prompt(r);
    return &r->gj;
}

/* Engine thread: the generation ended (rc 0) or failed: the final chunks, or the whole reply. */
static void openai_end(struct job *j, void *engine_ctx, int rc, const char *err)
{
    struct oai_req *r = j->ud;
    if (!err)
        err = "";
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
            bool called = r->tools.active && stream_calls(r, i);
            cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
            cJSON_AddItemToArray(chs, ch);
            cJSON_AddNumberToObject(ch, "index", i);
            if (r->chat) {
                cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
                if (!r->ch[i].role_sent) cJSON_AddStringToObject(delta, "role", "assistant");
                struct choice_out *c = &r->ch[i]; /* harmony: what was held back, now complete */
                if (harmony_req(r) && c->text && harmony_text(c->text, c->len))
                    harmony_stream_delta(c->text, c->len, true, &c->sent, &c->sent_reasoning, delta);
            } else {
                cJSON_AddStringToObject(ch, "text", "");
            }
            cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddStringToObject(ch, "finish_reason", called ? "tool_calls" : finish_name(r->gj.finish[i]));
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
        /* with its length: generated text may hold NUL bytes (issue 27 item 8) */
        const char *text = r->ch[i].text ? r->ch[i].text : "";
        size_t text_len = r->ch[i].len;
        struct tool_calls tc = {0};
        int n_calls = r->chat && r->tools.active ? oai_tools_reply(&r->tools, text, text_len, &tc) : 0;
        if (r->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (n_calls > 0) {   /* content: the text around the calls, or null */
                if (tc.content) cJSON_AddStringToObject(m, "content", tc.content);
                else cJSON_AddNullToObject(m, "content");
                cJSON_AddItemToObject(m, "tool_calls", oai_tool_calls_json(&tc, false));
            } else if (!harmony_req(r) || harmony_message(m, text, text_len) <= 0) { /* gpt-oss: final, analysis */
                json_add_string_n(m, "content", text, text_len);
            }
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
            json_add_string_n(ch, "text", text, text_len);
            if (r->gj.sp.logprobs) {
                cJSON *none = cJSON_CreateArray();
                size_t off = 0;
                cJSON_AddItemToObject(ch, "logprobs", oai_legacy_logprobs(r->ch[i].logprobs ? r->ch[i].logprobs : none, &off));
                cJSON_Delete(none);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        }
        cJSON_AddStringToObject(ch, "finish_reason", n_calls > 0 ? "tool_calls" : finish_name(r->gj.finish[i]));
        tool_calls_free(&tc);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(r));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) { job_write(j, s, strlen(s)); free(s); }
    job_finish(j, s ? 200 : 500);
}

const struct job_gen openai_gen = {openai_begin, openai_end};
