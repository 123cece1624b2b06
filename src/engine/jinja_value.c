/* jinja_value.c - the arena, the output buffer and the values of the Jinja subset: making
 * them (also from cJSON), truthiness, equality and ordering, and printing them the way
 * Python does (str(), repr(), json.dumps), so that tide's output equals python3-jinja2's
 * byte for byte. */
#include "jinja_internal.h"
#include "../common.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jblock { struct jblock *next; size_t size; max_align_t data[]; };

void *ja_alloc(struct jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (a->failed || (a->cap && a->used + n > a->cap)) { a->failed = true; return NULL; }
    struct jblock *b = a->head;
    /* blocks are bump-allocated; 'size' counts what is left */
    if (!b || b->size < n) {
        size_t bs = n > 32768 ? n : 32768;
        b = malloc(sizeof *b + bs);
        if (!b) { a->failed = true; return NULL; }
        b->size = bs;
        b->next = a->head;
        a->head = b;
    }
    b->size -= n;
    a->used += n;
    void *p = (char *)b->data + b->size;
    memset(p, 0, n);
    return p;
}

char *ja_strndup(struct jarena *a, const char *s, size_t n)
{
    char *p = ja_alloc(a, n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

void ja_free(struct jarena *a)
{
    for (struct jblock *b = a->head, *nx; b; b = nx) { nx = b->next; free(b); }
    a->head = NULL;
    a->used = 0;
}

int jvec_push(struct jarena *a, struct jvec *v, struct jnode *n)
{
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = ja_alloc(a, sizeof *nv * (size_t)nc);
        if (!nv) return TIDE_ENOMEM;
        if (v->n) memcpy(nv, v->v, sizeof *nv * (size_t)v->n);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = n;
    return 0;
}

void jb_put(struct jbuf *b, const char *s, size_t n)
{
    if (b->failed || !n) return;
    if (b->max && b->len + n > b->max) { b->failed = true; return; }
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->failed = true; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
void jb_puts(struct jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

struct jv jv_undef(void) { struct jv v = {.t = JV_UNDEF}; return v; }
struct jv jv_none(void) { struct jv v = {.t = JV_NONE}; return v; }
struct jv jv_bool(bool b) { struct jv v = {.t = JV_BOOL}; v.u.b = b; return v; }
struct jv jv_int(long long i) { struct jv v = {.t = JV_INT}; v.u.i = i; return v; }
struct jv jv_float(double f) { struct jv v = {.t = JV_FLOAT}; v.u.f = f; return v; }
struct jv jv_str(const char *p, size_t n) { struct jv v = {.t = JV_STR}; v.u.s.p = p; v.u.s.n = n; return v; }

struct jv jv_strdup(struct jctx *c, const char *p, size_t n)
{
    char *s = ja_strndup(c->ar, p, n);
    if (!s) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return jv_str("", 0); }
    return jv_str(s, n);
}

struct jv jv_newlist(struct jctx *c)
{
    struct jv v = {.t = JV_LIST};
    v.u.l = ja_alloc(c->ar, sizeof *v.u.l);
    if (!v.u.l) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return jv_none(); }
    return v;
}

struct jv jv_newdict(struct jctx *c)
{
    struct jv v = {.t = JV_DICT};
    v.u.d = ja_alloc(c->ar, sizeof *v.u.d);
    if (!v.u.d) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return jv_none(); }
    return v;
}

void jl_push(struct jctx *c, struct jlist *l, struct jv v)
{
    if (!l) return;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 4;
        struct jv *nv = ja_alloc(c->ar, sizeof *nv * (size_t)nc);
        if (!nv) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return; }
        if (l->n) memcpy(nv, l->v, sizeof *nv * (size_t)l->n);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
}

void jd_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v)
{
    if (!d) return;
    for (int i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k)) { d->v[i] = v; return; }
    if (d->n == d->cap) {
        int nc = d->cap ? d->cap * 2 : 4;
        struct jv *nk = ja_alloc(c->ar, sizeof *nk * (size_t)nc), *nv = ja_alloc(c->ar, sizeof *nv * (size_t)nc);
        if (!nk || !nv) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return; }
        if (d->n) { memcpy(nk, d->k, sizeof *nk * (size_t)d->n); memcpy(nv, d->v, sizeof *nv * (size_t)d->n); }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

bool jd_get(const struct jdict *d, const char *key, size_t klen, struct jv *out)
{
    for (int i = 0; d && i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == klen && !memcmp(d->k[i].u.s.p, key, klen)) {
            *out = d->v[i];
            return true;
        }
    return false;
}

struct jv jv_from_json(struct jctx *c, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON keeps no int/float distinction: an integral value in range is an int */
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int((long long)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) return jv_str(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        struct jv l = jv_newlist(c);
        const cJSON *e;
        cJSON_ArrayForEach(e, j) jl_push(c, l.u.l, jv_from_json(c, e));
        return l;
    }
    if (cJSON_IsObject(j)) {
        struct jv d = jv_newdict(c);
        const cJSON *e;
        cJSON_ArrayForEach(e, j) jd_set(c, d.u.d, jv_str(e->string, strlen(e->string)), jv_from_json(c, e));
        return d;
    }
    return jv_none();
}

bool jv_truthy(struct jv v)
{
    switch (v.t) {
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n > 0;
    case JV_LIST: return v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    case JV_FUNC: return true;
    default: return false;
    }
}

static bool is_num(struct jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(struct jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.t == JV_BOOL ? v.u.b : 0; }

static bool equal_at(struct jv a, struct jv b, int depth);
bool jv_equal(struct jv a, struct jv b) { return equal_at(a, b, 0); }

/* values nest (a list can hold itself through a namespace): past 200 levels they differ */
static bool equal_at(struct jv a, struct jv b, int depth)
{
    if (depth > 200) return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return num(a) == num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (int i = 0; i < a.u.l->n; i++) if (!equal_at(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (int i = 0; i < a.u.d->n; i++) {
            bool found = false;
            for (int k = 0; k < b.u.d->n && !found; k++)
                if (equal_at(a.u.d->k[i], b.u.d->k[k], depth + 1)) { if (!equal_at(a.u.d->v[i], b.u.d->v[k], depth + 1)) return false; found = true; }
            if (!found) return false;
        }
        return true;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

int jv_compare(struct jctx *c, struct jv a, struct jv b, int line, bool *ok)
{
    *ok = true;
    if (c->eval_depth > 1200) {
        *ok = false;
        jc_fail(c, TIDE_ERANGE, line, "values nested too deeply to compare");
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        if (a.t == JV_INT && b.t == JV_INT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        double x = num(a), y = num(b);
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, n);
        if (r) return r < 0 ? -1 : 1;
        return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (int i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            c->eval_depth++;
            int r = jv_compare(c, a.u.l->v[i], b.u.l->v[i], line, ok);
            c->eval_depth--;
            return r;
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    *ok = false;
    jc_fail(c, TIDE_EINVAL, line, "cannot compare %s with %s", jv_typename(a), jv_typename(b));
    return 0;
}

const char *jv_typename(struct jv v)
{
    static const char *const names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "function"};
    return names[v.t];
}

/* Python's repr(float): the shortest text that reads back the same. */
void jv_fmt_float(char *out, size_t cap, double f)
{
    if (isnan(f)) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf is d.ddde[+-]XX: digits and exponent, then laid out as Python does */
    char digits[40];
    int nd = 0;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++) if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t k = 0;
    char o[64];
    if (neg) o[k++] = '-';
    if (exp < -4 || exp >= 16) {
        o[k++] = digits[0];
        if (nd > 1) { o[k++] = '.'; for (int i = 1; i < nd; i++) o[k++] = digits[i]; }
        k += (size_t)snprintf(o + k, sizeof o - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        o[k++] = '0'; o[k++] = '.';
        for (int i = 0; i < -exp - 1; i++) o[k++] = '0';
        for (int i = 0; i < nd; i++) o[k++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) o[k++] = i < nd ? digits[i] : '0';
        o[k++] = '.';
        if (nd > exp + 1) for (int i = exp + 1; i < nd; i++) o[k++] = digits[i];
        else o[k++] = '0';
    }
    o[k] = 0;
    snprintf(out, cap, "%s", o);
}

static void repr_str(struct jbuf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ch == '\\') jb_puts(b, "\\\\");
        else if (ch == (unsigned char)q) { e[0] = '\\'; e[1] = q; jb_put(b, e, 2); }
        else if (ch == '\n') jb_puts(b, "\\n");
        else if (ch == '\r') jb_puts(b, "\\r");
        else if (ch == '\t') jb_puts(b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) { snprintf(e, sizeof e, "\\x%02x", ch); jb_puts(b, e); }
        else jb_put(b, (const char *)&ch, 1);
    }
    jb_put(b, &q, 1);
}

static void str_or_repr(struct jbuf *b, struct jv v, bool repr, int depth)
{
    if (depth > 200) { b->failed = true; return; }   /* nested too deeply to print */
    char num[64];
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: jb_puts(b, "None"); break;
    case JV_BOOL: jb_puts(b, v.u.b ? "True" : "False"); break;
    case JV_INT: snprintf(num, sizeof num, "%lld", v.u.i); jb_puts(b, num); break;
    case JV_FLOAT: jv_fmt_float(num, sizeof num, v.u.f); jb_puts(b, num); break;
    case JV_STR: if (repr) repr_str(b, v.u.s.p, v.u.s.n); else jb_put(b, v.u.s.p, v.u.s.n); break;
    case JV_LIST:
        jb_puts(b, v.tuple ? "(" : "[");
        for (int i = 0; i < v.u.l->n && !b->failed; i++) {
            if (i) jb_puts(b, ", ");
            str_or_repr(b, v.u.l->v[i], true, depth + 1);
        }
        if (v.tuple && v.u.l->n == 1) jb_puts(b, ",");
        jb_puts(b, v.tuple ? ")" : "]");
        break;
    case JV_DICT:
        jb_puts(b, "{");
        for (int i = 0; i < v.u.d->n && !b->failed; i++) {
            if (i) jb_puts(b, ", ");
            str_or_repr(b, v.u.d->k[i], true, depth + 1);
            jb_puts(b, ": ");
            str_or_repr(b, v.u.d->v[i], true, depth + 1);
        }
        jb_puts(b, "}");
        break;
    case JV_FUNC: jb_puts(b, "<function "); jb_puts(b, v.u.fn->name ? v.u.fn->name : "?"); jb_puts(b, ">"); break;
    }
}
void jv_str_into(struct jbuf *b, struct jv v) { str_or_repr(b, v, false, 0); }
void jv_repr_into(struct jbuf *b, struct jv v) { str_or_repr(b, v, true, 0); }

struct jv jv_to_str(struct jctx *c, struct jv v)
{
    if (v.t == JV_STR) return v;
    struct jbuf b = {.max = c->lim->max_output};
    jv_str_into(&b, v);
    if (b.failed) { free(b.p); jc_fail(c, TIDE_ERANGE, 0, "a string grew past the output limit"); return jv_str("", 0); }
    struct jv r = jv_strdup(c, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

/* one UTF-8 character at s (n bytes left) as \uXXXX (a surrogate pair above U+FFFF);
 * returns the bytes it took */
static size_t json_ascii_char(struct jbuf *b, const unsigned char *s, size_t n)
{
    unsigned cp = s[0];
    size_t len = 1;
    if (cp >= 0xF0 && n >= 4) { cp = (cp & 7u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu); len = 4; }
    else if (cp >= 0xE0 && n >= 3) { cp = (cp & 15u) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu); len = 3; }
    else if (cp >= 0xC0 && n >= 2) { cp = (cp & 31u) << 6 | (s[1] & 0x3Fu); len = 2; }
    char e[16];
    if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
        snprintf(e, sizeof e, "\\u%04x", cp);
    }
    jb_puts(b, e);
    return len;
}

static void json_str(struct jbuf *b, const char *s, size_t n, bool ascii)
{
    jb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ascii && ch >= 0x80) { i += json_ascii_char(b, (const unsigned char *)s + i, n - i) - 1; continue; }
        if (ch == '"') jb_puts(b, "\\\"");
        else if (ch == '\\') jb_puts(b, "\\\\");
        else if (ch == '\n') jb_puts(b, "\\n");
        else if (ch == '\r') jb_puts(b, "\\r");
        else if (ch == '\t') jb_puts(b, "\\t");
        else if (ch == '\b') jb_puts(b, "\\b");
        else if (ch == '\f') jb_puts(b, "\\f");
        else if (ch < 0x20) { snprintf(e, sizeof e, "\\u%04x", ch); jb_puts(b, e); }
        else jb_put(b, (const char *)&ch, 1);
    }
    jb_puts(b, "\"");
}

static void json_nl(struct jbuf *b, int indent, int level)
{
    jb_puts(b, "\n");
    for (int i = 0; i < indent * level && !b->failed; i++) jb_puts(b, " ");
}

int jv_json_into(struct jctx *c, struct jbuf *b, struct jv v, int indent, bool sort_keys, struct jv item_sep,
                 struct jv key_sep, int level, int line)
{
    if (level > 100) { jc_fail(c, TIDE_EINVAL, line, "tojson: value nested too deeply"); return -1; }
    char num[64];
    switch (v.t) {
    case JV_NONE: jb_puts(b, "null"); return 0;
    case JV_BOOL: jb_puts(b, v.u.b ? "true" : "false"); return 0;
    case JV_INT: snprintf(num, sizeof num, "%lld", v.u.i); jb_puts(b, num); return 0;
    case JV_FLOAT:
        if (isnan(v.u.f)) jb_puts(b, "NaN");
        else if (isinf(v.u.f)) jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else { jv_fmt_float(num, sizeof num, v.u.f); jb_puts(b, num); }
        return 0;
    case JV_STR: json_str(b, v.u.s.p, v.u.s.n, c->json_ascii); return 0;
    case JV_LIST:
        if (!v.u.l->n) { jb_puts(b, "[]"); return 0; }
        jb_puts(b, "[");
        for (int i = 0; i < v.u.l->n; i++) {
            if (i) jb_put(b, item_sep.u.s.p, item_sep.u.s.n);
            if (indent >= 0) json_nl(b, indent, level + 1);
            if (jv_json_into(c, b, v.u.l->v[i], indent, sort_keys, item_sep, key_sep, level + 1, line)) return -1;
        }
        if (indent >= 0) json_nl(b, indent, level);
        jb_puts(b, "]");
        return 0;
    case JV_DICT: {
        if (!v.u.d->n) { jb_puts(b, "{}"); return 0; }
        int n = v.u.d->n;
        int *order = ja_alloc(c->ar, sizeof *order * (size_t)n);
        if (!order) { jc_fail(c, TIDE_ENOMEM, line, "out of memory"); return -1; }
        for (int i = 0; i < n; i++) order[i] = i;
        if (sort_keys)   /* insertion sort: dicts in templates are small */
            for (int i = 1; i < n; i++)
                for (int k = i; k > 0; k--) {
                    bool ok;
                    if (jv_compare(c, v.u.d->k[order[k - 1]], v.u.d->k[order[k]], line, &ok) <= 0) break;
                    int t = order[k]; order[k] = order[k - 1]; order[k - 1] = t;
                }
        jb_puts(b, "{");
        for (int i = 0; i < n; i++) {
            struct jv k = v.u.d->k[order[i]];
            if (i) jb_put(b, item_sep.u.s.p, item_sep.u.s.n);
            if (indent >= 0) json_nl(b, indent, level + 1);
            if (k.t == JV_STR) json_str(b, k.u.s.p, k.u.s.n, c->json_ascii);
            else { jb_puts(b, "\""); jv_str_into(b, k); jb_puts(b, "\""); }
            jb_put(b, key_sep.u.s.p, key_sep.u.s.n);
            if (jv_json_into(c, b, v.u.d->v[order[i]], indent, sort_keys, item_sep, key_sep, level + 1, line)) return -1;
        }
        if (indent >= 0) json_nl(b, indent, level);
        jb_puts(b, "}");
        return 0;
    }
    default:
        jc_fail(c, TIDE_EINVAL, line, "tojson: a %s is not JSON serializable", jv_typename(v));
        return -1;
    }
}

size_t utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

int jv_length(struct jv v)
{
    switch (v.t) {
    case JV_STR: return (int)utf8_count(v.u.s.p, v.u.s.n);
    case JV_LIST: return v.u.l->n;
    case JV_DICT: return v.u.d->n;
    case JV_UNDEF: return 0;
    default: return -1;
    }
}

bool jv_iterable(struct jv v) { return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF; }

struct jlist *jv_iter_list(struct jctx *c, struct jv v, int line)
{
    if (v.t == JV_LIST) return v.u.l;
    struct jv l = jv_newlist(c);
    if (l.t != JV_LIST) return NULL;
    if (v.t == JV_DICT) {
        for (int i = 0; i < v.u.d->n; i++) jl_push(c, l.u.l, v.u.d->k[i]);
    } else if (v.t == JV_STR) {
        for (size_t i = 0; i < v.u.s.n;) {
            size_t k = i + 1;
            while (k < v.u.s.n && ((unsigned char)v.u.s.p[k] & 0xC0) == 0x80) k++;
            jl_push(c, l.u.l, jv_str(v.u.s.p + i, k - i));
            i = k;
        }
    } else if (v.t != JV_UNDEF) {
        jc_fail(c, TIDE_EINVAL, line, "a %s is not iterable", jv_typename(v));
        return NULL;
    }
    return l.u.l;
}
