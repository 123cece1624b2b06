/* oai_fields.c - the request fields beyond openai.c's core ones (see oai_fields.h). They run on
 * the HTTP thread, before the job is queued, so every bad value is a 400 naming the field and
 * the engine only ever sees valid settings. */
#include "server/oai_fields.h"
#include "engine/json_schema.h"
#include "engine/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct tokenizer *vocab;

void openai_set_tokenizer(const struct tokenizer *tok) { vocab = tok; }

#define FAIL(p, ...) do { snprintf(msg, msglen, __VA_ARGS__); *param = (p); return TIDE_EINVAL; } while (0)

void oai_extras_free(struct oai_extras *x)
{
    grammar_free(x->grammar);
    free(x->bias);
    free(x->prompt_ids);
    for (int i = 0; i < OAI_MAX_PROMPTS; i++)
        free(x->prompt_id_lists[i]);
    free(x->prompt_text);
    free(x->echo_text);
    memset(x, 0, sizeof *x);
}

static int parse_response_format(const cJSON *root, struct gen_job *g, struct oai_extras *x, char *msg,
                                 size_t msglen, const char **param)
{
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        FAIL("response_format", "'response_format' must be an object with a 'type'");
    if (!strcmp(t->valuestring, "text")) return 0;
    if (!strcmp(t->valuestring, "json_object")) {
        g->sp.json_object = true;
        return 0;
    }
    if (strcmp(t->valuestring, "json_schema"))
        FAIL("response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        FAIL("response_format", "'response_format.json_schema' must be an object {\"name\", \"schema\", \"strict\"}");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name"), *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (name && !cJSON_IsString(name)) FAIL("response_format", "'response_format.json_schema.name' must be a string");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        FAIL("response_format", "'response_format.json_schema.strict' must be a boolean");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        FAIL("response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
    char why[400];
    int rc = json_schema_compile(schema, cJSON_IsTrue(strict), &x->grammar, why, sizeof why);
    if (rc == TIDE_ENOMEM) { snprintf(msg, msglen, "out of memory"); return rc; }
    if (rc) FAIL("response_format", "response_format.json_schema.schema: %s", why);
    g->sp.json_object = true;
    g->sp.grammar = x->grammar;
    return 0;
}

static int parse_logit_bias(const cJSON *root, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                            const char **param)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb)) FAIL("logit_bias", "'logit_bias' must be an object mapping token ids to -100..100");
    int n = cJSON_GetArraySize(lb);
    if (n == 0) return 0;
    x->bias = calloc((size_t)n, sizeof *x->bias);
    if (!x->bias) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    uint32_t n_vocab = vocab ? tokenizer_n_vocab(vocab) : 0;
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, lb) {
        char *end;
        long id = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || id < 0 || (uint32_t)id >= n_vocab)
            FAIL("logit_bias", "'logit_bias' key '%.40s' is not a token id of this model (0..%u)", e->string,
                 n_vocab ? n_vocab - 1 : 0);
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 || e->valuedouble > 100)
            FAIL("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        x->bias[k++] = (struct logit_bias){(int)id, (float)e->valuedouble};
    }
    g->sp.logit_bias = x->bias;
    g->sp.n_logit_bias = k;
    return 0;
}

int oai_parse_sampling(const cJSON *root, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                       const char **param)
{
    int rc = parse_response_format(root, g, x, msg, msglen, param);
    if (!rc) rc = parse_logit_bias(root, g, x, msg, msglen, param);
    if (rc) return rc;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "repetition_penalty");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsNumber(rp) || !(rp->valuedouble > 0 && rp->valuedouble <= 10))
            FAIL("repetition_penalty", "'repetition_penalty' must be a number in (0, 10] (1 is off)");
        g->sp.repetition_penalty = (float)rp->valuedouble;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "min_tokens");
    if (mt && !cJSON_IsNull(mt)) {
        if (!cJSON_IsNumber(mt) || mt->valuedouble != floor(mt->valuedouble) || mt->valuedouble < 0 || mt->valuedouble > 1e9)
            FAIL("min_tokens", "'min_tokens' must be an integer between 0 and 1000000000");
        if (g->max_tokens >= 0 && mt->valuedouble > g->max_tokens)
            FAIL("min_tokens", "'min_tokens' (%d) must not be more than 'max_tokens' (%d)", (int)mt->valuedouble, g->max_tokens);
        g->sp.min_tokens = (int)mt->valuedouble;
    }
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(root, "ignore_eos");
    if (ie && !cJSON_IsNull(ie)) {
        if (!cJSON_IsBool(ie)) FAIL("ignore_eos", "'ignore_eos' must be a boolean");
        g->sp.ignore_eos = cJSON_IsTrue(ie);
    }
    return 0;
}

/* The fill-in-the-middle tokens a vocabulary may have, prefix/suffix/middle (PSM order). */
static const char *const FIM[][3] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},       /* Qwen2.5-Coder */
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},             /* StarCoder */
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>"},         /* DeepSeek-Coder */
};

/* One prompt as token ids: every entry an integer id of the vocabulary; *ids (malloc'ed, the
 * caller's to free) and *n. which: the prompt's index in a list, or -1. */
static int token_ids(const cJSON *arr, int which, int **ids, int *n_out, char *msg, size_t msglen, const char **param)
{
    int n = cJSON_GetArraySize(arr);
    uint32_t n_vocab = vocab ? tokenizer_n_vocab(vocab) : 0;
    *ids = malloc(sizeof(int) * (size_t)(n + 1));
    if (!*ids) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    int k = 0;
    const cJSON *t;
    char at[32] = "";
    if (which >= 0) snprintf(at, sizeof at, " of prompt %d", which);
    cJSON_ArrayForEach(t, arr) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= n_vocab)
            FAIL("prompt", "'prompt' token %d%s is not a token id of this model (0..%u)", k, at, n_vocab ? n_vocab - 1 : 0);
        (*ids)[k++] = (int)t->valuedouble;
    }
    *n_out = k;
    return 0;
}

static int token_prompt(const cJSON *arr, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                        const char **param)
{
    int rc = token_ids(arr, -1, &x->prompt_ids, &g->n_prompt_ids, msg, msglen, param);
    g->prompt_ids = x->prompt_ids;
    return rc;
}

/* Several prompts: each a string or an array of token ids (OpenAI's list of prompts). */
static int prompt_list(const cJSON *p, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                       const char **param)
{
    int k = cJSON_GetArraySize(p);
    if (k > OAI_MAX_PROMPTS)
        FAIL("prompt", "'prompt' holds %d prompts; at most %d a request", k, OAI_MAX_PROMPTS);
    const cJSON *e;
    cJSON_ArrayForEach(e, p) {
        int i = x->n_prompts;
        if (cJSON_IsString(e)) {
            x->prompts[i].text = e->valuestring;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) > 0) {
            int rc = token_ids(e, i, &x->prompt_id_lists[i], &x->prompts[i].n_ids, msg, msglen, param);
            if (rc) return rc;
            x->prompts[i].ids = x->prompt_id_lists[i];
        } else {
            FAIL("prompt", "prompt %d of 'prompt' must be a string or a non-empty array of token ids", i);
        }
        x->n_prompts++;
    }
    g->prompts = x->prompts;
    g->n_prompts = x->n_prompts;
    return 0;
}

/* The prompt's text for echo when it came as token ids. */
static char *ids_text(const int *ids, int n)
{
    size_t cap = 64, len = 0;
    char *s = malloc(cap), piece[256];
    struct utf8_stream u8 = {0};
    for (int i = 0; s && i <= n; i++) {
        int pl = 0;
        if (i < n) {
            pl = tokenizer_token_bytes(vocab, ids[i], piece, sizeof piece);
            if (pl < 0) pl = 0;
        }
        if (len + 3 * ((size_t)pl + 8) + 1 > cap) {
            cap = 2 * (len + 3 * ((size_t)pl + 8) + 1);
            char *ns = realloc(s, cap);
            if (!ns) { free(s); return NULL; }
            s = ns;
        }
        len += i < n ? utf8_stream_feed(&u8, piece, (size_t)pl, s + len) : utf8_stream_flush(&u8, s + len);
    }
    if (s) s[len] = 0;
    return s;
}

int oai_parse_prompt(const cJSON *root, struct gen_job *g, struct oai_extras *x, char *msg, size_t msglen,
                     const char **param)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) FAIL("prompt", "'prompt' is required");
    /* ["text"] or [[ids]] is one prompt; a list of numbers is one prompt of token ids; a list of
     * several strings or id lists is several prompts (n choices each, one after another) */
    int rc;
    bool several = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0));
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (several) {
        if ((rc = prompt_list(p, g, x, msg, msglen, param))) return rc;
        const cJSON *sx = cJSON_GetObjectItemCaseSensitive(root, "suffix"), *ec = cJSON_GetObjectItemCaseSensitive(root, "echo");
        if (sx && !cJSON_IsNull(sx) && !(cJSON_IsString(sx) && !sx->valuestring[0]))
            FAIL("suffix", "'suffix' takes one prompt; send one request per prompt");
        if (cJSON_IsTrue(ec))
            FAIL("echo", "'echo' takes one prompt; send one request per prompt");
        return 0;
    }
    if (cJSON_IsString(p)) {
        g->prompt = p->valuestring;
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0) {
        if ((rc = token_prompt(p, g, x, msg, msglen, param))) return rc;
    } else {
        FAIL("prompt", "'prompt' must be a string, an array of one string, or an array of token ids");
    }
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (suffix && !cJSON_IsNull(suffix)) {
        if (!cJSON_IsString(suffix)) FAIL("suffix", "'suffix' must be a string");
        if (suffix->valuestring[0]) {
            int f = 0;
            while (f < 3 && (!vocab || tokenizer_find(vocab, FIM[f][0]) < 0 || tokenizer_find(vocab, FIM[f][1]) < 0 ||
                             tokenizer_find(vocab, FIM[f][2]) < 0))
                f++;
            if (f == 3) FAIL("suffix", "'suffix' needs fill-in-the-middle tokens, and this model's vocabulary has none");
            if (!g->prompt) FAIL("suffix", "'suffix' needs a text prompt, not token ids");
            size_t n = strlen(FIM[f][0]) + strlen(g->prompt) + strlen(FIM[f][1]) + strlen(suffix->valuestring) +
                       strlen(FIM[f][2]) + 1;
            if (!(x->prompt_text = malloc(n))) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
            snprintf(x->prompt_text, n, "%s%s%s%s%s", FIM[f][0], g->prompt, FIM[f][1], suffix->valuestring, FIM[f][2]);
            x->echo_text = strdup(g->prompt);
            if (!x->echo_text) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
            g->prompt = x->prompt_text;
        }
    }
    const cJSON *echo = cJSON_GetObjectItemCaseSensitive(root, "echo");
    if (echo && !cJSON_IsNull(echo)) {
        if (!cJSON_IsBool(echo)) FAIL("echo", "'echo' must be a boolean");
        x->echo = cJSON_IsTrue(echo);
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
        if (x->echo && lp && cJSON_IsNumber(lp))
            FAIL("echo", "'echo' with 'logprobs' (prompt token logprobs) is not supported");
        if (x->echo && !x->echo_text) {
            x->echo_text = g->prompt ? strdup(g->prompt) : ids_text(g->prompt_ids, g->n_prompt_ids);
            if (!x->echo_text) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
        }
    }
    return 0;
}
