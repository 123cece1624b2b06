/* json_schema.c - JSON Schema (the strict-mode subset json_schema.h lists) to the grammar nodes
 * json_guard.c matches. One pass over the schema; $ref targets are compiled once (a node is
 * reserved before its body, so recursive schemas work). */
#include "json_schema.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 60000
#define MAX_PROPS 256          /* per object: key sets are quadratic in optional properties */
#define MAX_ANYOF 16
#define MAX_SCHEMA_DEPTH 64
#define MAX_LITERAL 4096       /* bytes of one enum/const value as JSON */

int grammar_add(struct grammar *g, int kind)
{
    if (g->n >= MAX_NODES) return -1;
    if (g->n == g->cap) {
        int nc = g->cap ? g->cap * 2 : 32;
        struct gnode *nn = realloc(g->node, sizeof *nn * (size_t)nc);
        if (!nn) return -1;
        g->node = nn;
        g->cap = nc;
    }
    struct gnode *nd = &g->node[g->n];
    memset(nd, 0, sizeof *nd);
    nd->kind = kind;
    nd->items = nd->key = -1;
    return g->n++;
}

struct lit { const char *s; uint16_t len, tag; };

static int cmp_lit(const void *a, const void *b)
{
    const struct lit *x = a, *y = b;
    int m = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
    if (m) return m;
    return (x->len > y->len) - (x->len < y->len); /* a prefix sorts before its extensions */
}

int grammar_add_literals(struct grammar *g, const char *const *texts, const uint16_t *tags, int n)
{
    if (n < 1 || n > 65535) return -1;
    struct lit *l = malloc(sizeof *l * (size_t)n);
    if (!l) return -1;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(texts[i]);
        if (len == 0 || len > MAX_LITERAL) { free(l); return -1; }
        l[i] = (struct lit){texts[i], (uint16_t)len, tags ? tags[i] : 0};
    }
    qsort(l, (size_t)n, sizeof *l, cmp_lit);
    int id = grammar_add(g, G_LITERALS);
    if (id < 0) { free(l); return -1; }
    struct gnode *nd = &g->node[id];
    nd->text = calloc((size_t)n, sizeof *nd->text);
    nd->len = calloc((size_t)n, sizeof *nd->len);
    nd->tag = calloc((size_t)n, sizeof *nd->tag);
    if (!nd->text || !nd->len || !nd->tag) { free(l); return -1; }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && !cmp_lit(&l[i], &l[i - 1])) continue; /* the same value twice: once is enough */
        if (!(nd->text[k] = strdup(l[i].s))) { nd->n = k; free(l); return -1; }
        nd->len[k] = l[i].len;
        nd->tag[k] = l[i].tag;
        k++;
    }
    nd->n = k;
    free(l);
    return id;
}

/* any value: anyOf [free object, array, string, number, false/null/true] */
int grammar_any(struct grammar *g)
{
    if (g->any >= 0) return g->any;
    static const char *const words[] = {"false", "null", "true"};
    int any = grammar_add(g, G_ANYOF), obj = grammar_add(g, G_FREE_OBJECT), arr = grammar_add(g, G_ARRAY);
    int str = grammar_add(g, G_STRING), num = grammar_add(g, G_NUMBER), lit = grammar_add_literals(g, words, NULL, 3);
    if (any < 0 || obj < 0 || arr < 0 || str < 0 || num < 0 || lit < 0) return -1;
    int *ch = malloc(sizeof(int) * 5);
    if (!ch) return -1;
    ch[0] = obj, ch[1] = arr, ch[2] = str, ch[3] = num, ch[4] = lit;
    g->node[any].child = ch;
    g->node[any].n = 5;
    g->node[obj].items = any;
    g->node[obj].key = str;
    g->node[arr].items = any;
    g->any = any;
    return any;
}

void grammar_free(struct grammar *g)
{
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        struct gnode *nd = &g->node[i];
        free(nd->child);
        free(nd->keyset);
        free(nd->required);
        for (int k = 0; nd->text && k < nd->n; k++) free(nd->text[k]);
        free(nd->text);
        free(nd->len);
        free(nd->tag);
    }
    free(g->node);
    free(g);
}

/* ---- the compiler ---- */

struct compiler {
    struct grammar *g;
    const cJSON *root;
    bool strict;
    char *msg;
    size_t msglen;
    const char *ref_name[256]; /* $ref targets compiled so far and their nodes */
    int ref_node[256];
    int n_ref;
};

#define FAIL(c, ...) do { snprintf((c)->msg, (c)->msglen, __VA_ARGS__); return -1; } while (0)
#define OOM(c) FAIL(c, "the schema is too large (out of memory or grammar nodes)")

static int compile(struct compiler *c, const cJSON *s, const char *path, int depth);

static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref",
    "$defs", "definitions", "title", "description", "default", "examples", "$schema", "$id", "$comment",
};

static int literal_of(struct compiler *c, const cJSON *v, const char *path)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) OOM(c);
    if (strlen(t) > MAX_LITERAL) { free(t); FAIL(c, "%s: an enum/const value longer than %d bytes is not supported", path, MAX_LITERAL); }
    const char *tx[1] = {t};
    int id = grammar_add_literals(c->g, tx, NULL, 1);
    free(t);
    if (id < 0) OOM(c);
    return id;
}

static int compile_enum(struct compiler *c, const cJSON *e, const char *path)
{
    int n = cJSON_GetArraySize(e);
    if (!cJSON_IsArray(e) || n < 1) FAIL(c, "%s/enum: must be a non-empty array", path);
    if (n > 1024) FAIL(c, "%s/enum: at most 1024 values are supported", path);
    char **t = calloc((size_t)n, sizeof *t);
    if (!t) OOM(c);
    int k = 0, id = -1;
    const cJSON *v;
    cJSON_ArrayForEach(v, e) {
        if (!(t[k] = cJSON_PrintUnformatted(v)) || strlen(t[k]) > MAX_LITERAL) { k += t[k] != NULL; goto out; }
        k++;
    }
    id = grammar_add_literals(c->g, (const char *const *)t, NULL, n);
out:
    for (int i = 0; i < k; i++) free(t[i]);
    free(t);
    if (id < 0) FAIL(c, "%s/enum: values must be at most %d bytes of JSON each", path, MAX_LITERAL);
    return id;
}

static int compile_object(struct compiler *c, const cJSON *s, const char *path, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char p[512];
    if (props && !cJSON_IsObject(props)) FAIL(c, "%s/properties: must be an object", path);
    if (req && !cJSON_IsArray(req)) FAIL(c, "%s/required: must be an array of property names", path);
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        FAIL(c, "%s/additionalProperties: must be a boolean or a schema", path);
    if (c->strict && !cJSON_IsFalse(addl))
        FAIL(c, "%s/additionalProperties: strict mode requires additionalProperties: false on every object", path);
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (n > MAX_PROPS) FAIL(c, "%s/properties: at most %d properties per object are supported", path, MAX_PROPS);
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) FAIL(c, "%s/required: must be an array of property names", path);
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            FAIL(c, "%s/required: '%s' is not in properties", path, r->valuestring);
    }
    if (n == 0) { /* no declared properties: any object, or only {} */
        if (cJSON_IsFalse(addl)) {
            int id = grammar_add(c->g, G_OBJECT);
            if (id < 0) OOM(c);
            return id;
        }
        int any = grammar_any(c->g);
        if (any < 0) OOM(c);
        return c->g->node[any].child[0];
    }
    int id = grammar_add(c->g, G_OBJECT);
    if (id < 0) OOM(c);
    int *child = calloc((size_t)n, sizeof(int)), *keyset = calloc((size_t)n, sizeof(int));
    bool *required = calloc((size_t)n, sizeof(bool));
    char **keys = calloc((size_t)n, sizeof(char *));
    uint16_t *tags = calloc((size_t)n, sizeof(uint16_t));
    c->g->node[id].child = child; /* owned by the node from here on: freed with the grammar */
    c->g->node[id].keyset = keyset;
    c->g->node[id].required = required;
    c->g->node[id].n = n;
    if (!child || !keyset || !required || !keys || !tags) { free(keys); free(tags); OOM(c); }
    int i = 0, rc = 0;
    const cJSON *pr;
    cJSON_ArrayForEach(pr, props) {
        cJSON *name = cJSON_CreateString(pr->string);
        keys[i] = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!keys[i]) { rc = -1; snprintf(c->msg, c->msglen, "out of memory"); break; }
        tags[i] = (uint16_t)i;
        bool in_req = false;
        cJSON_ArrayForEach(r, req) in_req |= !strcmp(r->valuestring, pr->string);
        if (c->strict && !in_req) {
            snprintf(c->msg, c->msglen, "%s/required: strict mode requires every property in required ('%s' is not)",
                     path, pr->string);
            rc = -1;
            break;
        }
        snprintf(p, sizeof p, "%s/properties/%s", path, pr->string);
        int v = compile(c, pr, p, depth + 1);
        if (v < 0) { rc = -1; break; }
        c->g->node[id].child[i] = v;
        c->g->node[id].required[i] = in_req;
        i++;
    }
    /* The keys that may come next when property i is the next one: i and the optional ones
     * after it, up to and including the first required one. */
    for (int k = 0; rc == 0 && k < n; k++) {
        int e = k;
        while (e < n - 1 && !c->g->node[id].required[e]) e++;
        int ks = grammar_add_literals(c->g, (const char *const *)keys + k, tags + k, e - k + 1);
        if (ks < 0) { rc = -1; snprintf(c->msg, c->msglen, "%s/properties: a property name is too long", path); }
        else c->g->node[id].keyset[k] = ks;
    }
    for (int k = 0; k < n; k++) free(keys[k]);
    free(keys);
    free(tags);
    return rc < 0 ? -1 : id;
}

/* "#", "#/$defs/NAME" or "#/definitions/NAME" */
static int compile_ref(struct compiler *c, const char *ref, const char *path, int depth)
{
    for (int i = 0; i < c->n_ref; i++)
        if (!strcmp(c->ref_name[i], ref)) return c->ref_node[i];
    const cJSON *target = NULL;
    if (!strcmp(ref, "#")) target = c->root;
    else if (!strncmp(ref, "#/$defs/", 8)) target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14)) target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "definitions"), ref + 14);
    else FAIL(c, "%s/$ref: only local references (#, #/$defs/..., #/definitions/...) are supported, not '%s'", path, ref);
    if (!target) FAIL(c, "%s/$ref: '%s' is not defined", path, ref);
    if (c->n_ref == 256) FAIL(c, "%s/$ref: at most 256 distinct references are supported", path);
    /* Reserve a node (an anyOf of one) so that a reference to itself inside resolves. */
    int id = grammar_add(c->g, G_ANYOF);
    if (id < 0) OOM(c);
    int *ch = malloc(sizeof(int));
    if (!ch) OOM(c);
    c->g->node[id].child = ch;
    c->ref_name[c->n_ref] = ref;
    c->ref_node[c->n_ref++] = id;
    int body = compile(c, target, ref, depth + 1);
    if (body < 0) return -1;
    c->g->node[id].child[0] = body;
    c->g->node[id].n = 1;
    return id;
}

static int compile_type(struct compiler *c, const cJSON *s, const char *type, const char *path, int depth)
{
    if (!strcmp(type, "object")) return compile_object(c, s, path, depth);
    if (!strcmp(type, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        char p[512];
        snprintf(p, sizeof p, "%s/items", path);
        int it = items ? compile(c, items, p, depth + 1) : grammar_any(c->g);
        if (it < 0) return -1;
        int id = grammar_add(c->g, G_ARRAY);
        if (id < 0) OOM(c);
        c->g->node[id].items = it;
        return id;
    }
    int kind = !strcmp(type, "string") ? G_STRING : !strcmp(type, "number") ? G_NUMBER
             : !strcmp(type, "integer") ? G_INTEGER : -1;
    if (kind >= 0) {
        int id = grammar_add(c->g, kind);
        if (id < 0) OOM(c);
        return id;
    }
    static const char *const boolean[] = {"false", "true"}, *const null[] = {"null"};
    if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        int id = !strcmp(type, "null") ? grammar_add_literals(c->g, null, NULL, 1) : grammar_add_literals(c->g, boolean, NULL, 2);
        if (id < 0) OOM(c);
        return id;
    }
    FAIL(c, "%s/type: '%s' is not a JSON Schema type", path, type);
}

static int compile(struct compiler *c, const cJSON *s, const char *path, int depth)
{
    if (depth > MAX_SCHEMA_DEPTH) FAIL(c, "%s: schemas nested deeper than %d are not supported", path, MAX_SCHEMA_DEPTH);
    if (cJSON_IsTrue(s)) {
        int any = grammar_any(c->g);
        if (any < 0) OOM(c);
        return any;
    }
    if (!cJSON_IsObject(s)) FAIL(c, "%s: a schema must be an object", path);
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        bool known = false;
        for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN; i++) known |= !strcmp(k->string, KNOWN[i]);
        if (!known) FAIL(c, "%s: keyword '%s' is not supported (the subset: type, properties, required, "
                         "additionalProperties, items, enum, const, anyOf, $ref, $defs)", path, k->string);
    }
    char p[512];
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) FAIL(c, "%s/$ref: must be a string", path);
        return compile_ref(c, ref->valuestring, path, depth);
    }
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cst) return literal_of(c, cst, path);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) return compile_enum(c, en, path);
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (any_of) {
        int n = cJSON_GetArraySize(any_of);
        if (!cJSON_IsArray(any_of) || n < 1) FAIL(c, "%s/anyOf: must be a non-empty array of schemas", path);
        if (n > MAX_ANYOF) FAIL(c, "%s/anyOf: at most %d alternatives are supported", path, MAX_ANYOF);
        if (type) FAIL(c, "%s: 'type' next to 'anyOf' is not supported (put the type in each alternative)", path);
        int id = grammar_add(c->g, G_ANYOF);
        int *ch = id >= 0 ? calloc((size_t)n, sizeof(int)) : NULL;
        if (!ch) OOM(c);
        c->g->node[id].child = ch;
        int i = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, any_of) {
            snprintf(p, sizeof p, "%s/anyOf/%d", path, i);
            int v = compile(c, a, p, depth + 1);
            if (v < 0) return -1;
            c->g->node[id].child[i++] = v;
            c->g->node[id].n = i;
        }
        return id;
    }
    if (!type) { /* no type: any value (strict mode asks for one, but nothing is lost) */
        int any = grammar_any(c->g);
        if (any < 0) OOM(c);
        return any;
    }
    if (cJSON_IsString(type)) return compile_type(c, s, type->valuestring, path, depth);
    int n = cJSON_GetArraySize(type);
    if (!cJSON_IsArray(type) || n < 1 || n > 7) FAIL(c, "%s/type: must be a type name or a list of them", path);
    int id = grammar_add(c->g, G_ANYOF);
    int *ch = id >= 0 ? calloc((size_t)n, sizeof(int)) : NULL;
    if (!ch) OOM(c);
    c->g->node[id].child = ch;
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, type) {
        if (!cJSON_IsString(t)) FAIL(c, "%s/type: must be a type name or a list of them", path);
        int v = compile_type(c, s, t->valuestring, path, depth);
        if (v < 0) return -1;
        c->g->node[id].child[i++] = v;
        c->g->node[id].n = i;
    }
    return id;
}

int json_schema_compile(const cJSON *schema, bool strict, struct grammar **out, char *msg, size_t msglen)
{
    struct grammar *g = calloc(1, sizeof *g);
    if (!g) { snprintf(msg, msglen, "out of memory"); return TIDE_ENOMEM; }
    g->any = -1;
    struct compiler c = {.g = g, .root = schema, .strict = strict, .msg = msg, .msglen = msglen};
    int root = compile(&c, schema, "#", 0);
    if (root < 0) {
        grammar_free(g);
        return TIDE_EINVAL;
    }
    g->root = root;
    *out = g;
    return 0;
}
