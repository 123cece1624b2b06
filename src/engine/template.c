/* template.c - chat templates: the GGUF's own Jinja template rendered by jinja.c, and three
 * fixed formats (recognised from the template by telltale substrings) as the fallback when
 * there is none or it fails (docs/TEMPLATES.md). */
#include "template.h"
#include "jinja.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum chat_template_kind template_detect(const char *jinja)
{
    if (!jinja) return TEMPLATE_CHATML;
    if (strstr(jinja, "<|im_start|>")) return TEMPLATE_CHATML;
    if (strstr(jinja, "<|start_header_id|>")) return TEMPLATE_LLAMA3;
    if (strstr(jinja, "[INST]")) return TEMPLATE_MISTRAL;
    return TEMPLATE_CHATML;
}

const char *template_name(enum chat_template_kind kind)
{
    switch (kind) {
    case TEMPLATE_LLAMA3: return "llama3";
    case TEMPLATE_MISTRAL: return "mistral";
    default: return "chatml";
    }
}

/* A growable string; on allocation failure it goes NULL and stays so. */
struct sbuf {
    char *p;
    size_t len, cap;
};

static void sb_add(struct sbuf *b, const char *s)
{
    if (!b->p && b->cap) return;
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            free(b->p);
            b->p = NULL;
            b->cap = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

/* The built-in formats know no tool turn: a tool result goes in as a user turn. */
static const char *role_of(const struct chat_message *m)
{
    return m->role && !strcmp(m->role, "tool") ? "user" : m->role ? m->role : "user";
}

char *template_apply(enum chat_template_kind kind, const struct chat_message *msgs, int n,
                     bool add_generation_prompt)
{
    struct sbuf b = {0};
    sb_add(&b, "");
    if (kind == TEMPLATE_CHATML) {
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|im_start|>");
            sb_add(&b, role_of(&msgs[i]));
            sb_add(&b, "\n");
            sb_add(&b, msgs[i].content ? msgs[i].content : "");
            sb_add(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) sb_add(&b, "<|im_start|>assistant\n");
    } else if (kind == TEMPLATE_LLAMA3) {
        sb_add(&b, "<|begin_of_text|>");
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|start_header_id|>");
            sb_add(&b, role_of(&msgs[i]));
            sb_add(&b, "<|end_header_id|>\n\n");
            sb_add(&b, msgs[i].content ? msgs[i].content : "");
            sb_add(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) sb_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else {
        /* Mistral: the system prompt goes in front of the first user turn. */
        const char *system = NULL;
        bool first_user = true;
        for (int i = 0; i < n; i++) {
            const char *c = msgs[i].content ? msgs[i].content : "";
            if (!strcmp(role_of(&msgs[i]), "system")) {
                system = c;
            } else if (!strcmp(role_of(&msgs[i]), "assistant")) {
                sb_add(&b, c);
                sb_add(&b, "</s>");
            } else {
                sb_add(&b, first_user ? "<s>[INST] " : "[INST] ");
                if (first_user && system) {
                    sb_add(&b, system);
                    sb_add(&b, "\n\n");
                }
                first_user = false;
                sb_add(&b, c);
                sb_add(&b, " [/INST]");
            }
        }
    }
    return b.p;
}

const char *const *template_stop_strings(enum chat_template_kind kind)
{
    static const char *const chatml[] = {"<|im_end|>", NULL};
    static const char *const llama3[] = {"<|eot_id|>", NULL};
    static const char *const mistral[] = {"</s>", NULL};
    switch (kind) {
    case TEMPLATE_LLAMA3: return llama3;
    case TEMPLATE_MISTRAL: return mistral;
    default: return chatml;
    }
}

/* ---- the GGUF's own template (jinja.h), with the formats above as the fallback ---- */

int chat_template_init(struct chat_template *t, const char *jinja_src, const char *bos, const char *eos,
                       bool tokenizer_adds_bos)
{
    memset(t, 0, sizeof *t);
    t->kind = template_detect(jinja_src);
    t->bos = strdup(bos ? bos : "");
    t->eos = strdup(eos ? eos : "");
    if (!t->bos || !t->eos) { chat_template_free(t); return TIDE_ENOMEM; }
    t->strip_bos = tokenizer_adds_bos && t->bos[0];
    if (!jinja_src) {
        tide_log("chat template: the model has none; using the built-in %s format", template_name(t->kind));
        t->fallback_logged = 1;
        return 0;
    }
    char err[300];
    int rc = jinja_parse(jinja_src, &t->jinja, err, sizeof err);
    if (rc == TIDE_ENOMEM) { chat_template_free(t); return rc; }
    if (rc) {
        tide_log("chat template: the model's template is outside the supported Jinja subset (%s); "
                 "using the built-in %s format", err, template_name(t->kind));
        t->fallback_logged = 1;
    } else {
        tide_log("chat template: rendering the model's own (%zu bytes of Jinja)", strlen(jinja_src));
    }
    return 0;
}

/* The template's data, as apply_chat_template passes it. */
static cJSON *template_context(const struct chat_template *t, const struct chat_message *m, int n,
                               const char *tools_json)
{
    cJSON *ctx = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(ctx, "messages");
    if (!msgs) { cJSON_Delete(ctx); return NULL; }
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(msgs, o)) { cJSON_Delete(o); cJSON_Delete(ctx); return NULL; }
        cJSON *calls = m[i].tool_calls_json ? cJSON_Parse(m[i].tool_calls_json) : NULL;
        bool ok = cJSON_AddStringToObject(o, "role", m[i].role ? m[i].role : "user") != NULL;
        if (m[i].content || !calls) ok = ok && cJSON_AddStringToObject(o, "content", m[i].content ? m[i].content : "");
        else ok = ok && cJSON_AddNullToObject(o, "content");
        if (calls) ok = ok && cJSON_AddItemToObject(o, "tool_calls", calls);
        if (m[i].tool_call_id) ok = ok && cJSON_AddStringToObject(o, "tool_call_id", m[i].tool_call_id);
        if (m[i].name) ok = ok && cJSON_AddStringToObject(o, "name", m[i].name);
        if (!ok) { cJSON_Delete(ctx); return NULL; }
    }
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (tools && !cJSON_AddItemToObject(ctx, "tools", tools)) { cJSON_Delete(tools); cJSON_Delete(ctx); return NULL; }
    if (!cJSON_AddTrueToObject(ctx, "add_generation_prompt") || !cJSON_AddStringToObject(ctx, "bos_token", t->bos) ||
        !cJSON_AddStringToObject(ctx, "eos_token", t->eos)) {
        cJSON_Delete(ctx);
        return NULL;
    }
    return ctx;
}

int chat_template_render(struct chat_template *t, const struct chat_message *m, int n, const char *tools_json,
                         char **out)
{
    *out = NULL;
    if (t->jinja) {
        cJSON *ctx = template_context(t, m, n, tools_json);
        if (!ctx) return TIDE_ENOMEM;
        char err[300];
        int rc = jinja_render(t->jinja, ctx, NULL, out, err, sizeof err);
        cJSON_Delete(ctx);
        if (rc == 0) {
            /* the tokenizer puts BOS in front itself: a second one from the text would double it */
            size_t bl = strlen(t->bos);
            if (t->strip_bos && !strncmp(*out, t->bos, bl)) memmove(*out, *out + bl, strlen(*out + bl) + 1);
            return 0;
        }
        if (rc == TIDE_ENOMEM) return rc;
        if (!__atomic_exchange_n(&t->fallback_logged, 1, __ATOMIC_RELAXED))
            tide_log("chat template: rendering the model's template failed (%s); using the built-in %s format "
                     "(logged once)", err, template_name(t->kind));
    }
    *out = template_apply(t->kind, m, n, true);
    return *out ? 0 : TIDE_ENOMEM;
}

void chat_template_free(struct chat_template *t)
{
    jinja_free(t->jinja);
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof *t);
}
