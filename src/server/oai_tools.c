/* oai_tools.c - tools, tool_choice and parallel_tool_calls into a job (see oai_tools.h), on the
 * HTTP thread before queueing: a bad tool list or a choice that names no tool is a 400 that
 * names the field, and a forced call's grammar is compiled here so the engine only runs it. */
#include "server/oai_tools.h"
#include "engine/json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum tool_format model_format = TOOL_FMT_HERMES;

void oai_tools_set_format(enum tool_format f) { model_format = f; }

#define FAIL(p, ...) do { snprintf(msg, msglen, __VA_ARGS__); *param = (p); return TIDE_EINVAL; } while (0)

void oai_tools_free(struct oai_tools *t)
{
    grammar_free(t->grammar);
    free(t->prefix);
    free(t->names);
    memset(t, 0, sizeof *t);
}

/* OpenAI's rule for function names: a-z, A-Z, 0-9, underscores and dashes, 1 to 64 of them. */
static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

static int parse_tool_list(const cJSON *tools, struct oai_tools *t, char *msg, size_t msglen, const char **param)
{
    if (!cJSON_IsArray(tools))
        FAIL("tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {\"name\", ...}}");
    int n = cJSON_GetArraySize(tools);
    if (n && !(t->names = calloc((size_t)n, sizeof *t->names))) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    const cJSON *e;
    cJSON_ArrayForEach(e, tools) {
        int i = t->n_names;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type"), *fn = cJSON_GetObjectItemCaseSensitive(e, "function");
        if (!cJSON_IsObject(e) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            FAIL("tools", "tools[%d] must be {\"type\": \"function\", \"function\": {...}} (only function tools are supported)", i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description"), *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
        if (!cJSON_IsObject(fn)) FAIL("tools", "tools[%d].function must be an object", i);
        if (!cJSON_IsString(name) || !valid_name(name->valuestring))
            FAIL("tools", "tools[%d].function.name must be a string of 1 to 64 letters, digits, '_' or '-'", i);
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            FAIL("tools", "tools[%d].function.parameters must be a JSON Schema object", i);
        if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
            FAIL("tools", "tools[%d].function.description must be a string", i);
        if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
            FAIL("tools", "tools[%d].function.strict must be a boolean", i);
        for (int k = 0; k < i; k++)
            if (!strcmp(t->names[k], name->valuestring))
                FAIL("tools", "tools[%d]: the function name '%s' is used twice", i, name->valuestring);
        t->names[t->n_names++] = name->valuestring;
    }
    return 0;
}

/* The function's parameters schema ({"type": "object"} when it has none). */
static const cJSON *params_of(const cJSON *tool)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "parameters");
    return cJSON_IsObject(p) ? p : NULL;
}

/* {"name": {"const": NAME}, KEY: params} with params' $defs moved up to root, where their
 * "#/$defs/..." references resolve. */
static cJSON *call_schema(const cJSON *tool, const char *key, cJSON *root)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function"), *p = params_of(tool);
    cJSON *s = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(s, "properties");
    cJSON_AddStringToObject(s, "type", "object");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const",
                            cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
    cJSON *args = p ? cJSON_Duplicate(p, true) : cJSON_CreateObject();
    if (!p) cJSON_AddStringToObject(args, "type", "object");
    static const char *const defs[] = {"$defs", "definitions"};
    for (int d = 0; d < 2; d++) {
        cJSON *dd = cJSON_DetachItemFromObjectCaseSensitive(args, defs[d]), *x;
        if (!dd) continue;
        cJSON *to = cJSON_GetObjectItemCaseSensitive(root, defs[d]);
        if (!to) to = cJSON_AddObjectToObject(root, defs[d]);
        while ((x = dd->child)) {   /* the first tool to define a name keeps it */
            cJSON_DetachItemViaPointer(dd, x);
            if (cJSON_GetObjectItemCaseSensitive(to, x->string)) cJSON_Delete(x);
            else cJSON_AddItemToObject(to, x->string, x);
        }
        cJSON_Delete(dd);
    }
    cJSON_AddItemToObject(props, key, args);
    cJSON *req = cJSON_AddArrayToObject(s, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(key));
    cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

/* The grammar and prompt opening of a forced call: one tool (named, or the only one) or any of
 * them (required). */
static int build_forced(const cJSON *tools, const cJSON *only, struct oai_tools *t, char *msg, size_t msglen,
                        const char **param)
{
    char why[400];
    int i = 0;
    const cJSON *e;
    /* each function's parameters alone first, so a schema outside the subset is named by tool */
    cJSON_ArrayForEach(e, tools) {
        const cJSON *p = params_of(e);
        if ((only && e != only) || !p) { i++; continue; }
        struct grammar *g = NULL;
        int rc = json_schema_compile(p, false, &g, why, sizeof why);
        grammar_free(g);
        if (rc == TIDE_ENOMEM) { snprintf(msg, msglen, "out of memory"); return rc; }
        if (rc) FAIL("tools", "tools[%d].function.parameters: %s (a forced tool_choice constrains the arguments "
                     "to the schema, and only this JSON Schema subset can be)", i, why);
        i++;
    }
    const char *key = t->fmt == TOOL_FMT_LLAMA3 ? "parameters" : "arguments";
    cJSON *schema = cJSON_CreateObject();
    if (only && t->fmt == TOOL_FMT_GPT_OSS) {   /* the opening names the function: arguments alone */
        const cJSON *p = params_of(only);
        cJSON_Delete(schema);
        schema = p ? cJSON_Duplicate(p, true) : cJSON_CreateObject();
        if (!p) cJSON_AddStringToObject(schema, "type", "object");
        t->forced_name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(only, "function"), "name")->valuestring;
    } else if (only) {
        cJSON *one = call_schema(only, key, schema);
        cJSON_AddItemToObject(schema, "anyOf", cJSON_CreateArray());
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(schema, "anyOf"), one);
    } else {
        cJSON *any = cJSON_AddArrayToObject(schema, "anyOf");
        cJSON_ArrayForEach(e, tools) cJSON_AddItemToArray(any, call_schema(e, key, schema));
    }
    int rc = json_schema_compile(schema, false, &t->grammar, why, sizeof why);
    cJSON_Delete(schema);
    if (rc == TIDE_ENOMEM) { snprintf(msg, msglen, "out of memory"); return rc; }
    if (rc) FAIL("tool_choice", "the tools do not make one call grammar (%s); 'required' takes at most 16 tools", why);
    char pre[200];
    switch (t->fmt) {
    case TOOL_FMT_GPT_OSS:
        if (t->forced_name) snprintf(pre, sizeof pre, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", t->forced_name);
        else snprintf(pre, sizeof pre, "<|channel|>commentary<|message|>");
        break;
    case TOOL_FMT_MISTRAL: snprintf(pre, sizeof pre, "[TOOL_CALLS]["); break;
    case TOOL_FMT_LLAMA3: pre[0] = 0; break;
    default: snprintf(pre, sizeof pre, "<tool_call>\n"); break;
    }
    if (!(t->prefix = strdup(pre))) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    return 0;
}

int oai_parse_tools(const cJSON *root, struct gen_job *g, struct oai_tools *t, char *msg, size_t msglen,
                    const char **param)
{
    memset(t, 0, sizeof *t);
    t->fmt = model_format;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        int rc = parse_tool_list(tools, t, msg, msglen, param);
        if (rc) return rc;
    }
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (par && !cJSON_IsNull(par)) {
        if (!cJSON_IsBool(par)) FAIL("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        t->max_calls = cJSON_IsTrue(par) ? 0 : 1;
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice"), *only = NULL;
    const char *choice = t->n_names ? "auto" : "none";
    if (cJSON_IsString(tc)) {
        choice = tc->valuestring;
        if (strcmp(choice, "none") && strcmp(choice, "auto") && strcmp(choice, "required"))
            FAIL("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                 "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (tc && !cJSON_IsNull(tc)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            FAIL("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                 "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        const cJSON *e, *list = t->n_names ? tools : NULL;
        cJSON_ArrayForEach(e, list)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "function"), "name")->valuestring,
                        name->valuestring))
                only = e;
        if (!only) FAIL("tool_choice", "'tool_choice' names the function '%.64s', which is not in 'tools'", name->valuestring);
        choice = "required";
    }
    if (!strcmp(choice, "required") && !t->n_names)
        FAIL("tool_choice", "'tool_choice' \"required\" needs a non-empty 'tools' list");
    if (!strcmp(choice, "none") || !t->n_names) return 0;
    t->active = true;
    if (!strcmp(choice, "required")) {
        if (!only && t->n_names == 1) only = cJSON_GetArrayItem(tools, 0);
        int rc = build_forced(tools, only, t, msg, msglen, param);
        if (rc) return rc;
        t->forced = true;
        g->sp.json_object = true;     /* replaces a response_format grammar: the reply is the call */
        g->sp.grammar = t->grammar;
        g->assistant_prefix = t->prefix;
        return 0;
    }
    /* the end of a call, where the model's vocabulary does not end the turn there itself */
    const char *end = t->fmt == TOOL_FMT_GPT_OSS ? "<|call|>" : t->fmt == TOOL_FMT_LLAMA3 ? "<|eom_id|>" : NULL;
    if (end && g->n_stop < JOB_MAX_STOP) g->stop[g->n_stop++] = end;
    return 0;
}

int oai_tools_reply(const struct oai_tools *t, const char *text, size_t len, struct tool_calls *out)
{
    int n = t->forced ? tool_calls_parse_forced(t->fmt, t->forced_name, text, len, out)
                      : tool_calls_parse(t->fmt, text, len, t->max_calls, out);
    if (n <= 0) return n;
    for (int i = 0; i < out->n; i++) {   /* a call of a function the client does not have is text */
        bool known = false;
        for (int k = 0; k < t->n_names && !known; k++) known = !strcmp(out->call[i].name, t->names[k]);
        if (!known) {
            tool_calls_free(out);
            return 0;
        }
    }
    return n;
}

cJSON *oai_tool_calls_json(const struct tool_calls *tc, bool with_index)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < tc->n; i++) {
        cJSON *c = cJSON_CreateObject();
        char id[32];
        tool_call_id(id, sizeof id);
        if (with_index) cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", tc->call[i].name);
        cJSON_AddStringToObject(f, "arguments", tc->call[i].arguments);
        cJSON_AddItemToArray(arr, c);
    }
    return arr;
}
