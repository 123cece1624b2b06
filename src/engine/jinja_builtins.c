/* jinja_builtins.c - the filters, tests, string and dict methods, and globals the Jinja
 * subset offers (the list is in docs/TEMPLATES.md), each with the result Python's
 * jinja2 gives under Hugging Face's settings (tojson is HF's: json.dumps, no HTML
 * escaping, keys in insertion order unless sort_keys). */
#include "jinja_internal.h"
#include "../common.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANGE 100000   /* as jinja2's sandbox */

static const char *const FILTERS[] = {
    "trim", "length", "count", "tojson", "string", "upper", "lower", "title", "capitalize", "default", "d",
    "items", "join", "replace", "first", "last", "safe", "list", "int", "float", "abs", "selectattr",
    "rejectattr", "select", "reject", "map", "indent", "escape", "e", "reverse", "unique", "sum", "sort", "dictsort",
    "min", "max", NULL};
static const char *const TESTS[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer",
    "float", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=", "lt", "le", "gt", "ge",
    "in", "odd", "even", "divisibleby", "sameas", "callable", "lower", "upper", NULL};
static const char *const GLOBALS[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", NULL};

static bool in_table(const char *const *t, const char *name)
{
    for (; *t; t++) if (!strcmp(*t, name)) return true;
    return false;
}
bool jb_has_filter(const char *name) { return in_table(FILTERS, name); }
bool jb_has_test(const char *name) { return in_table(TESTS, name); }
bool jb_is_global(const char *name) { return in_table(GLOBALS, name); }

/* argument i by position or by keyword name, else dflt */
static struct jv arg(const struct jargs *a, int i, const char *kw, struct jv dflt)
{
    for (int k = 0; kw && k < a->nkw; k++) if (!strcmp(a->kwname[k], kw)) return a->kw[k];
    return i >= 0 && i < a->npos ? a->pos[i] : dflt;
}

static bool is_str(struct jv v) { return v.t == JV_STR; }
static bool need_str(struct jctx *c, struct jv v, const char *what, int line)
{
    if (v.t == JV_STR) return true;
    jc_fail(c, TIDE_EINVAL, line, "%s needs a string, not a %s", what, jv_typename(v));
    return false;
}

struct jv jb_getattr(struct jctx *c, struct jv obj, struct jv key, int line)
{
    if (obj.t == JV_DICT) {
        for (int i = 0; i < obj.u.d->n; i++) if (jv_equal(obj.u.d->k[i], key)) return obj.u.d->v[i];
        return jv_undef();
    }
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        struct jlist *l = jv_iter_list(c, obj, line);
        if (!l) return jv_undef();
        long long i = key.t == JV_INT ? key.u.i : key.u.b;
        if (i < 0) i += l->n;
        return i >= 0 && i < l->n ? l->v[i] : jv_undef();
    }
    return jv_undef();
}

static bool is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

static struct jv strip(struct jv s, struct jv chars, bool left, bool right)
{
    const char *p = s.u.s.p, *e = p + s.u.s.n;
    bool ws = chars.t != JV_STR;
#define STRIPPABLE(ch) (ws ? is_ws(ch) : memchr(chars.u.s.p, (ch), chars.u.s.n) != NULL)
    while (left && p < e && STRIPPABLE(*p)) p++;
    while (right && e > p && STRIPPABLE(e[-1])) e--;
#undef STRIPPABLE
    return jv_str(p, (size_t)(e - p));
}

static struct jv case_map(struct jctx *c, struct jv s, int mode /* 0 lower 1 upper 2 title 3 capitalize */)
{
    struct jv r = jv_strdup(c, s.u.s.p, s.u.s.n);
    if (c->rc) return r;
    char *p = (char *)r.u.s.p;
    bool prev_letter = false;
    for (size_t i = 0; i < r.u.s.n; i++) {
        char ch = p[i];
        bool letter = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        bool up = mode == 1 || (mode == 2 && !prev_letter) || (mode == 3 && i == 0);
        if (letter) p[i] = up ? (char)(ch & ~0x20) : (char)(ch | 0x20);
        if (mode == 2) prev_letter = letter || (unsigned char)ch >= 0x80;
    }
    return r;
}

static struct jv replace(struct jctx *c, struct jv s, struct jv old, struct jv new_, long long count, int line)
{
    if (!need_str(c, s, "replace", line) || !need_str(c, old, "replace", line) || !need_str(c, new_, "replace", line))
        return jv_undef();
    struct jbuf b = {.max = c->lim->max_output};
    const char *p = s.u.s.p, *e = p + s.u.s.n;
    long long done = 0;
    if (!old.u.s.n) {   /* Python inserts new between every character */
        for (size_t i = 0; i <= s.u.s.n; i++) {
            if (count < 0 || done < count) { jb_put(&b, new_.u.s.p, new_.u.s.n); done++; }
            if (i < s.u.s.n) jb_put(&b, p + i, 1);
        }
    } else {
        while (p < e) {
            const char *m = (count < 0 || done < count) ? memmem(p, (size_t)(e - p), old.u.s.p, old.u.s.n) : NULL;
            if (!m) { jb_put(&b, p, (size_t)(e - p)); break; }
            jb_put(&b, p, (size_t)(m - p));
            jb_put(&b, new_.u.s.p, new_.u.s.n);
            p = m + old.u.s.n;
            done++;
        }
    }
    if (b.failed) { free(b.p); jc_fail(c, TIDE_ERANGE, line, "replace: the result passed the output limit"); return jv_undef(); }
    struct jv r = jv_strdup(c, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

static struct jv split(struct jctx *c, struct jv s, struct jv sep, long long maxsplit, int line)
{
    struct jv l = jv_newlist(c);
    const char *p = s.u.s.p, *e = p + s.u.s.n;
    if (sep.t != JV_STR) {
        while (p < e) {
            while (p < e && is_ws(*p)) p++;
            if (p == e) break;
            const char *q = p;
            if (maxsplit >= 0 && l.u.l->n >= maxsplit) q = e;
            else while (q < e && !is_ws(*q)) q++;
            const char *qe = q;
            if (q == e) while (qe > p && is_ws(qe[-1])) qe--;
            jl_push(c, l.u.l, jv_str(p, (size_t)(qe - p)));
            p = q;
        }
        return l;
    }
    if (!sep.u.s.n) { jc_fail(c, TIDE_EINVAL, line, "split: empty separator"); return jv_undef(); }
    for (;;) {
        const char *m = (maxsplit < 0 || l.u.l->n < maxsplit) ? memmem(p, (size_t)(e - p), sep.u.s.p, sep.u.s.n) : NULL;
        if (!m) { jl_push(c, l.u.l, jv_str(p, (size_t)(e - p))); break; }
        jl_push(c, l.u.l, jv_str(p, (size_t)(m - p)));
        p = m + sep.u.s.n;
    }
    return l;
}

static bool affix(struct jv s, struct jv x, bool end)
{
    if (x.t == JV_LIST) {
        for (int i = 0; i < x.u.l->n; i++) if (affix(s, x.u.l->v[i], end)) return true;
        return false;
    }
    if (x.t != JV_STR || x.u.s.n > s.u.s.n) return false;
    return !memcmp(s.u.s.p + (end ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n);
}

static struct jv items_of(struct jctx *c, struct jv d)
{
    struct jv l = jv_newlist(c);
    for (int i = 0; d.t == JV_DICT && i < d.u.d->n && !c->rc; i++) {
        struct jv pair = jv_newlist(c);
        pair.tuple = 1;
        jl_push(c, pair.u.l, d.u.d->k[i]);
        jl_push(c, pair.u.l, d.u.d->v[i]);
        jl_push(c, l.u.l, pair);
    }
    return l;
}

bool jb_method(struct jctx *c, struct jv o, const char *m, const struct jargs *a, struct jv *out, int line)
{
    struct jv none = jv_none();
    if (o.t == JV_STR) {
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) { *out = jv_bool(affix(o, arg(a, 0, NULL, none), m[0] == 'e')); return true; }
        if (!strcmp(m, "strip")) { *out = strip(o, arg(a, 0, NULL, none), true, true); return true; }
        if (!strcmp(m, "lstrip")) { *out = strip(o, arg(a, 0, NULL, none), true, false); return true; }
        if (!strcmp(m, "rstrip")) { *out = strip(o, arg(a, 0, NULL, none), false, true); return true; }
        if (!strcmp(m, "lower")) { *out = case_map(c, o, 0); return true; }
        if (!strcmp(m, "upper")) { *out = case_map(c, o, 1); return true; }
        if (!strcmp(m, "title")) { *out = case_map(c, o, 2); return true; }
        if (!strcmp(m, "capitalize")) { *out = case_map(c, case_map(c, o, 0), 3); return true; }
        if (!strcmp(m, "split")) {
            struct jv mx = arg(a, 1, "maxsplit", jv_int(-1));
            *out = split(c, o, arg(a, 0, "sep", none), mx.t == JV_INT ? mx.u.i : -1, line);
            return true;
        }
        if (!strcmp(m, "replace")) {
            struct jv cnt = arg(a, 2, "count", jv_int(-1));
            *out = replace(c, o, arg(a, 0, NULL, none), arg(a, 1, NULL, none), cnt.t == JV_INT ? cnt.u.i : -1, line);
            return true;
        }
        if (!strcmp(m, "format")) {   /* '{}' and '{0}' fields and '{{' '}}' only */
            struct jbuf b = {.max = c->lim->max_output};
            int next = 0, manual = 0;
            for (size_t i = 0; i < o.u.s.n; i++) {
                char ch = o.u.s.p[i];
                if ((ch == '{' || ch == '}') && i + 1 < o.u.s.n && o.u.s.p[i + 1] == ch) { jb_put(&b, &ch, 1); i++; continue; }
                if (ch != '{') { jb_put(&b, &ch, 1); continue; }
                size_t e = i + 1;
                int idx = -1;
                if (e < o.u.s.n && o.u.s.p[e] >= '0' && o.u.s.p[e] <= '9') idx = o.u.s.p[e++] - '0';
                if (e >= o.u.s.n || o.u.s.p[e] != '}') { free(b.p); jc_fail(c, TIDE_EUNSUPPORTED, line, "format: only {} and {N} fields are supported"); return true; }
                if ((idx < 0 && manual) || (idx >= 0 && next)) {
                    free(b.p);
                    jc_fail(c, TIDE_EINVAL, line, "format: cannot mix {} and {N} fields");
                    return true;
                }
                if (idx < 0) idx = next++;
                else manual = 1;
                if (idx >= a->npos) { free(b.p); jc_fail(c, TIDE_EINVAL, line, "format: replacement index %d out of range", idx); return true; }
                jv_str_into(&b, a->pos[idx]);
                i = e;
            }
            if (b.failed) { free(b.p); jc_fail(c, TIDE_ERANGE, line, "format: the result passed the output limit"); return true; }
            *out = jv_strdup(c, b.p ? b.p : "", b.len);
            free(b.p);
            return true;
        }
        if (!strcmp(m, "find")) {
            struct jv x = arg(a, 0, NULL, none);
            if (!need_str(c, x, "find", line)) return true;
            const char *f = x.u.s.n ? memmem(o.u.s.p, o.u.s.n, x.u.s.p, x.u.s.n) : o.u.s.p;
            *out = jv_int(f ? (long long)utf8_count(o.u.s.p, (size_t)(f - o.u.s.p)) : -1);
            return true;
        }
        return false;
    }
    if (o.t == JV_DICT) {
        if (!strcmp(m, "get")) {
            struct jv r = jb_getattr(c, o, arg(a, 0, NULL, none), line);
            *out = r.t == JV_UNDEF ? arg(a, 1, NULL, none) : r;
            return true;
        }
        if (!strcmp(m, "items")) { *out = items_of(c, o); return true; }
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            struct jv l = jv_newlist(c);
            for (int i = 0; i < o.u.d->n; i++) jl_push(c, l.u.l, m[0] == 'k' ? o.u.d->k[i] : o.u.d->v[i]);
            *out = l;
            return true;
        }
    }
    return false;
}

/* value.attr.attr (selectattr and map take dotted names) */
static struct jv dotted(struct jctx *c, struct jv v, struct jv path, int line)
{
    if (path.t == JV_INT) return jb_getattr(c, v, path, line);
    if (path.t != JV_STR) return jv_undef();
    const char *p = path.u.s.p, *e = p + path.u.s.n;
    while (p <= e && v.t != JV_UNDEF) {
        const char *d = memchr(p, '.', (size_t)(e - p));
        if (!d) d = e;
        v = jb_getattr(c, v, jv_str(p, (size_t)(d - p)), line);
        p = d + 1;
    }
    return v;
}

static struct jv select_items(struct jctx *c, struct jv v, const struct jargs *a, bool attr, bool keep, int line)
{
    struct jlist *items = jv_iter_list(c, v, line);
    struct jv l = jv_newlist(c);
    if (!items || c->rc) return l;
    int first = attr ? 1 : 0;
    for (int i = 0; i < items->n && !c->rc; i++) {
        struct jv x = attr ? dotted(c, items->v[i], arg(a, 0, NULL, jv_undef()), line) : items->v[i];
        bool r;
        if (a->npos > first) {
            struct jv tn = a->pos[first];
            if (!need_str(c, tn, "select", line)) return l;
            struct jargs ta = {0};
            for (int k = first + 1; k < a->npos; k++) ta.pos[ta.npos++] = a->pos[k];
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)tn.u.s.n, tn.u.s.p);
            if (!jb_has_test(name)) { jc_fail(c, TIDE_EINVAL, line, "no test named '%s'", name); return l; }
            r = jb_test(c, name, x, &ta, line);
        } else {
            r = jv_truthy(x);
        }
        if (r == keep) jl_push(c, l.u.l, items->v[i]);
    }
    return l;
}

static struct jv tojson(struct jctx *c, struct jv v, const struct jargs *a, int line)
{
    struct jv ea = arg(a, 0, "ensure_ascii", jv_bool(false)), ind = arg(a, 1, "indent", jv_none());
    struct jv sep = arg(a, 2, "separators", jv_none()), sk = arg(a, 3, "sort_keys", jv_bool(false));
    if (sep.t != JV_NONE && (sep.t != JV_LIST || sep.u.l->n != 2 || sep.u.l->v[0].t != JV_STR || sep.u.l->v[1].t != JV_STR)) {
        jc_fail(c, TIDE_EINVAL, line, "tojson: separators must be a pair of strings");
        return jv_undef();
    }
    int indent = -1;
    if (ind.t == JV_INT) indent = ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : (int)ind.u.i;
    else if (ind.t != JV_NONE) { jc_fail(c, TIDE_EUNSUPPORTED, line, "tojson: indent must be an integer"); return jv_undef(); }
    struct jbuf b = {.max = c->lim->max_output};
    struct jv item_sep = sep.t == JV_LIST ? sep.u.l->v[0] : jv_str(indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
    struct jv key_sep = sep.t == JV_LIST ? sep.u.l->v[1] : jv_str(": ", 2);
    c->json_ascii = jv_truthy(ea);
    int jrc = jv_json_into(c, &b, v, indent, jv_truthy(sk), item_sep, key_sep, 0, line);
    c->json_ascii = false;
    if (jrc) { free(b.p); return jv_undef(); }
    if (b.failed) { free(b.p); jc_fail(c, TIDE_ERANGE, line, "tojson: the result passed the output limit"); return jv_undef(); }
    struct jv r = jv_strdup(c, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

static struct jv to_int(struct jctx *c, struct jv v, struct jv dflt)
{
    if (v.t == JV_INT) return v;
    if (v.t == JV_BOOL) return jv_int(v.u.b);
    if (v.t == JV_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9e18 ? jv_int((long long)v.u.f) : dflt;
    if (v.t == JV_STR) {
        char buf[64];
        if (v.u.s.n >= sizeof buf) return dflt;
        memcpy(buf, v.u.s.p, v.u.s.n);
        buf[v.u.s.n] = 0;
        char *end;
        long long i = strtoll(buf, &end, 10);
        while (is_ws(*end)) end++;
        if (end != buf && !*end) return jv_int(i);
        double d = strtod(buf, &end);
        while (is_ws(*end)) end++;
        if (end != buf && !*end && isfinite(d) && fabs(d) < 9e18) return jv_int((long long)d);
    }
    return dflt;
}

/* the key sort/min/max/dictsort compare by: an attribute, and strings case-folded unless asked */
struct sort_opts { struct jv attr; bool case_sensitive; int by_value; };

static struct jv sort_key(struct jctx *c, struct jv v, const struct sort_opts *o, int line)
{
    if (o->by_value >= 0 && v.t == JV_LIST && v.u.l->n == 2) v = v.u.l->v[o->by_value];
    if (o->attr.t != JV_NONE && o->attr.t != JV_UNDEF) v = dotted(c, v, o->attr, line);
    if (v.t == JV_STR && !o->case_sensitive) v = case_map(c, v, 0);
    return v;
}

/* stable merge sort (Python's sort is stable); keys[i] sorts items[i] */
static void merge_sort(struct jctx *c, struct jv *items, struct jv *keys, struct jv *ti, struct jv *tk, int n, bool rev, int line)
{
    if (n < 2 || c->rc) return;
    int h = n / 2;
    merge_sort(c, items, keys, ti, tk, h, rev, line);
    merge_sort(c, items + h, keys + h, ti, tk, n - h, rev, line);
    int i = 0, k = h, o = 0;
    while (i < h || k < n) {
        bool take_right = false;
        if (i < h && k < n) {
            bool ok;
            int r = jv_compare(c, keys[k], keys[i], line, &ok);
            if (!ok) return;
            take_right = rev ? r > 0 : r < 0;
        } else {
            take_right = i >= h;
        }
        if (take_right) { ti[o] = items[k]; tk[o++] = keys[k++]; }
        else { ti[o] = items[i]; tk[o++] = keys[i++]; }
    }
    memcpy(items, ti, sizeof *ti * (size_t)n);
    memcpy(keys, tk, sizeof *tk * (size_t)n);
}

static struct jv sorted(struct jctx *c, struct jlist *in, const struct sort_opts *o, bool rev, int line)
{
    struct jv out = jv_newlist(c);
    if (!in || c->rc) return out;
    int n = in->n;
    struct jv *keys = ja_alloc(c->ar, sizeof *keys * (size_t)(n ? n : 1) * 3);
    if (!keys) { jc_fail(c, TIDE_ENOMEM, line, "out of memory"); return out; }
    for (int i = 0; i < n; i++) { jl_push(c, out.u.l, in->v[i]); keys[i] = sort_key(c, in->v[i], o, line); }
    if (!c->rc) merge_sort(c, out.u.l->v, keys, keys + n, keys + 2 * n, n, rev, line);
    return out;
}

struct jv jb_filter(struct jctx *c, const char *f, struct jv v, const struct jargs *a, int line)
{
    if (c->rc) return jv_undef();
    struct jv none = jv_none();
    if (!strcmp(f, "safe")) return v;
    if (!jb_has_filter(f)) { jc_fail(c, TIDE_EUNSUPPORTED, line, "unknown filter '%s'", f); return jv_undef(); }
    /* select, reject and map give nothing for none, as jinja2's do */
    if (v.t == JV_NONE && (strstr(f, "select") || strstr(f, "reject") || !strcmp(f, "map"))) return jv_newlist(c);
    if (!strcmp(f, "sort") || !strcmp(f, "dictsort") || !strcmp(f, "min") || !strcmp(f, "max")) {
        bool dict = f[0] == 'd';
        struct sort_opts o = {.attr = none, .by_value = -1};
        bool rev = false;
        if (f[0] == 's') {
            rev = jv_truthy(arg(a, 0, "reverse", jv_bool(false)));
            o.case_sensitive = jv_truthy(arg(a, 1, "case_sensitive", jv_bool(false)));
            o.attr = arg(a, 2, "attribute", none);
        } else if (dict) {
            o.case_sensitive = jv_truthy(arg(a, 0, "case_sensitive", jv_bool(false)));
            struct jv by = arg(a, 1, "by", jv_str("key", 3));
            o.by_value = by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5) ? 1 : 0;
            rev = jv_truthy(arg(a, 2, "reverse", jv_bool(false)));
        } else {
            o.case_sensitive = jv_truthy(arg(a, 0, "case_sensitive", jv_bool(false)));
            o.attr = arg(a, 1, "attribute", none);
        }
        if (dict && v.t != JV_DICT) { jc_fail(c, TIDE_EINVAL, line, "dictsort needs a mapping, not a %s", jv_typename(v)); return jv_undef(); }
        struct jv l = sorted(c, dict ? items_of(c, v).u.l : jv_iter_list(c, v, line), &o, rev, line);
        if (c->rc || f[0] == 's' || dict) return l;
        if (!l.u.l->n) return jv_undef();
        return l.u.l->v[f[1] == 'i' ? 0 : l.u.l->n - 1];
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        bool use = v.t == JV_UNDEF || (jv_truthy(arg(a, 1, "boolean", jv_bool(false))) && !jv_truthy(v));
        return use ? arg(a, 0, "default_value", jv_str("", 0)) : v;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        int n = jv_length(v);
        if (n < 0) { jc_fail(c, TIDE_EINVAL, line, "a %s has no length", jv_typename(v)); return jv_undef(); }
        return jv_int(n);
    }
    if (!strcmp(f, "tojson")) return tojson(c, v, a, line);
    if (!strcmp(f, "string")) return jv_to_str(c, v);
    if (!strcmp(f, "list")) {
        struct jlist *l = jv_iter_list(c, v, line);
        struct jv r = jv_newlist(c);
        for (int i = 0; l && i < l->n; i++) jl_push(c, r.u.l, l->v[i]);
        return r;
    }
    if (!strcmp(f, "items")) {
        if (v.t == JV_UNDEF) return jv_newlist(c);
        if (v.t != JV_DICT) { jc_fail(c, TIDE_EINVAL, line, "items needs a mapping, not a %s", jv_typename(v)); return jv_undef(); }
        return items_of(c, v);
    }
    if (!strcmp(f, "int")) return to_int(c, v, arg(a, 0, "default", jv_int(0)));
    if (!strcmp(f, "float")) {
        if (v.t == JV_FLOAT) return v;
        if (v.t == JV_INT || v.t == JV_BOOL) return jv_float(v.t == JV_INT ? (double)v.u.i : v.u.b);
        if (v.t == JV_STR) {
            char buf[64];
            if (v.u.s.n < sizeof buf) {
                memcpy(buf, v.u.s.p, v.u.s.n); buf[v.u.s.n] = 0;
                char *end; double d = strtod(buf, &end);
                if (end != buf && !*end) return jv_float(d);
            }
        }
        return arg(a, 0, "default", jv_float(0));
    }
    if (!strcmp(f, "abs")) {
        if (v.t == JV_BOOL) return jv_int(v.u.b);
        if (v.t == JV_INT) return v.u.i == LLONG_MIN ? jv_float(-(double)v.u.i) : jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        jc_fail(c, TIDE_EINVAL, line, "abs needs a number");
        return jv_undef();
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        struct jlist *l = jv_iter_list(c, v, line);
        if (!l || !l->n) return jv_undef();
        return l->v[f[0] == 'f' ? 0 : l->n - 1];
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == JV_STR) {
            struct jlist *l = jv_iter_list(c, v, line);
            struct jbuf b = {0};
            for (int i = l ? l->n - 1 : -1; i >= 0; i--) jb_put(&b, l->v[i].u.s.p, l->v[i].u.s.n);
            struct jv r = jv_strdup(c, b.p ? b.p : "", b.len);
            free(b.p);
            return r;
        }
        struct jlist *l = jv_iter_list(c, v, line);
        struct jv r = jv_newlist(c);
        for (int i = l ? l->n - 1 : -1; i >= 0; i--) jl_push(c, r.u.l, l->v[i]);
        return r;
    }
    if (!strcmp(f, "unique")) {
        struct jlist *l = jv_iter_list(c, v, line);
        struct jv r = jv_newlist(c);
        for (int i = 0; l && i < l->n && !c->rc; i++) {
            bool seen = false;
            for (int k = 0; k < r.u.l->n && !seen; k++) seen = jv_equal(r.u.l->v[k], l->v[i]);
            if (!seen) jl_push(c, r.u.l, l->v[i]);
        }
        return r;
    }
    if (!strcmp(f, "sum")) {
        struct jlist *l = jv_iter_list(c, v, line);
        long long si = 0; double sd = 0; bool fl = false;
        for (int i = 0; l && i < l->n; i++) {
            struct jv x = l->v[i];
            if (x.t == JV_INT || x.t == JV_BOOL) { si += x.t == JV_INT ? x.u.i : x.u.b; sd += x.t == JV_INT ? (double)x.u.i : x.u.b; }
            else if (x.t == JV_FLOAT) { fl = true; sd += x.u.f; }
            else { jc_fail(c, TIDE_EINVAL, line, "sum needs numbers"); return jv_undef(); }
        }
        return fl ? jv_float(sd) : jv_int(si);
    }
    if (!strcmp(f, "join")) {
        struct jv sep = arg(a, 0, "d", jv_str("", 0)), at = arg(a, 1, "attribute", none);
        struct jlist *l = jv_iter_list(c, v, line);
        struct jbuf b = {.max = c->lim->max_output};
        for (int i = 0; l && i < l->n; i++) {
            if (i) jv_str_into(&b, sep);
            jv_str_into(&b, at.t == JV_NONE ? l->v[i] : dotted(c, l->v[i], at, line));
        }
        if (b.failed) { free(b.p); jc_fail(c, TIDE_ERANGE, line, "join: the result passed the output limit"); return jv_undef(); }
        struct jv r = jv_strdup(c, b.p ? b.p : "", b.len);
        free(b.p);
        return r;
    }
    if (!strcmp(f, "selectattr")) return select_items(c, v, a, true, true, line);
    if (!strcmp(f, "rejectattr")) return select_items(c, v, a, true, false, line);
    if (!strcmp(f, "select")) return select_items(c, v, a, false, true, line);
    if (!strcmp(f, "reject")) return select_items(c, v, a, false, false, line);
    if (!strcmp(f, "map")) {
        struct jlist *l = jv_iter_list(c, v, line);
        struct jv r = jv_newlist(c), at = arg(a, -1, "attribute", jv_undef());
        for (int i = 0; l && i < l->n && !c->rc; i++) {
            if (at.t != JV_UNDEF) {
                struct jv x = dotted(c, l->v[i], at, line);
                if (x.t == JV_UNDEF) x = arg(a, -1, "default", jv_undef());
                jl_push(c, r.u.l, x);
            } else if (a->npos >= 1 && a->pos[0].t == JV_STR) {
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)a->pos[0].u.s.n, a->pos[0].u.s.p);
                if (!jb_has_filter(name)) { jc_fail(c, TIDE_EINVAL, line, "no filter named '%s'", name); return r; }
                struct jargs fa = {0};
                for (int k = 1; k < a->npos; k++) fa.pos[fa.npos++] = a->pos[k];
                jl_push(c, r.u.l, jb_filter(c, name, l->v[i], &fa, line));
            } else {
                jc_fail(c, TIDE_EINVAL, line, "map needs a filter name or attribute=");
                return r;
            }
        }
        return r;
    }
    /* the rest work on text: str() of the value first, as Jinja's do */
    struct jv s = jv_to_str(c, v);
    if (!strcmp(f, "trim")) return strip(s, arg(a, 0, "chars", none), true, true);
    if (!strcmp(f, "upper")) return case_map(c, s, 1);
    if (!strcmp(f, "lower")) return case_map(c, s, 0);
    if (!strcmp(f, "title")) return case_map(c, s, 2);
    if (!strcmp(f, "capitalize")) return case_map(c, case_map(c, s, 0), 3);
    if (!strcmp(f, "replace")) {
        struct jv cnt = arg(a, 2, "count", none);
        return replace(c, s, arg(a, 0, NULL, none), arg(a, 1, NULL, none), cnt.t == JV_INT ? cnt.u.i : -1, line);
    }
    if (!strcmp(f, "escape") || !strcmp(f, "e")) {
        struct jbuf b = {.max = c->lim->max_output};
        for (size_t i = 0; i < s.u.s.n; i++) {
            char ch = s.u.s.p[i];
            if (ch == '&') jb_puts(&b, "&amp;");
            else if (ch == '<') jb_puts(&b, "&lt;");
            else if (ch == '>') jb_puts(&b, "&gt;");
            else if (ch == '"') jb_puts(&b, "&#34;");
            else if (ch == '\'') jb_puts(&b, "&#39;");
            else jb_put(&b, &ch, 1);
        }
        struct jv r = b.failed ? jv_str("", 0) : jv_strdup(c, b.p ? b.p : "", b.len);
        if (b.failed) jc_fail(c, TIDE_ERANGE, line, "escape: the result passed the output limit");
        free(b.p);
        return r;
    }
    if (!strcmp(f, "indent")) {
        struct jv w = arg(a, 0, "width", jv_int(4));
        bool first = jv_truthy(arg(a, 1, "first", jv_bool(false))), blank = jv_truthy(arg(a, 2, "blank", jv_bool(false)));
        char pad[65];
        struct jv padv = w;
        if (w.t == JV_INT) {
            int k = w.u.i < 0 ? 0 : w.u.i > 64 ? 64 : (int)w.u.i;
            memset(pad, ' ', (size_t)k);
            pad[k] = 0;
            padv = jv_str(pad, (size_t)k);
        } else if (w.t != JV_STR) { jc_fail(c, TIDE_EINVAL, line, "indent: width must be a number or string"); return jv_undef(); }
        struct jbuf b = {.max = c->lim->max_output};
        const char *p = s.u.s.p, *e = p + s.u.s.n;
        bool line0 = true;
        while (p <= e) {
            const char *nl = memchr(p, '\n', (size_t)(e - p));
            const char *le = nl ? nl : e;
            bool is_blank = le == p;
            if ((line0 ? first : true) && (blank || !is_blank) && !(line0 && !first)) jb_put(&b, padv.u.s.p, padv.u.s.n);
            jb_put(&b, p, (size_t)(le - p));
            if (!nl) break;
            jb_puts(&b, "\n");
            p = nl + 1;
            line0 = false;
        }
        struct jv r = b.failed ? jv_str("", 0) : jv_strdup(c, b.p ? b.p : "", b.len);
        if (b.failed) jc_fail(c, TIDE_ERANGE, line, "indent: the result passed the output limit");
        free(b.p);
        return r;
    }
    jc_fail(c, TIDE_EUNSUPPORTED, line, "filter '%s' is not supported", f);
    return jv_undef();
}

bool jb_test(struct jctx *c, const char *t, struct jv v, const struct jargs *a, int line)
{
    struct jv x = arg(a, 0, NULL, jv_undef());
    if (!strcmp(t, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(t, "none")) return v.t == JV_NONE;
    if (!strcmp(t, "string")) return is_str(v);
    if (!strcmp(t, "mapping")) return v.t == JV_DICT;
    if (!strcmp(t, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (!strcmp(t, "sequence")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    if (!strcmp(t, "number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (!strcmp(t, "integer")) return v.t == JV_INT;
    if (!strcmp(t, "float")) return v.t == JV_FLOAT;
    if (!strcmp(t, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(t, "true")) return v.t == JV_BOOL && v.u.b;
    if (!strcmp(t, "false")) return v.t == JV_BOOL && !v.u.b;
    if (!strcmp(t, "callable")) return v.t == JV_FUNC;
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==")) return jv_equal(v, x);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !jv_equal(v, x);
    if (!strcmp(t, "sameas")) return v.t == x.t && (v.t == JV_NONE || v.t == JV_UNDEF || (v.t == JV_BOOL && v.u.b == x.u.b));
    if (!strcmp(t, "in")) {
        bool r = false;
        if (x.t == JV_STR && v.t == JV_STR) r = !v.u.s.n || memmem(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n);
        else if (x.t == JV_LIST) for (int i = 0; i < x.u.l->n && !r; i++) r = jv_equal(v, x.u.l->v[i]);
        else if (x.t == JV_DICT) for (int i = 0; i < x.u.d->n && !r; i++) r = jv_equal(v, x.u.d->k[i]);
        return r;
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (!is_str(v)) return false;
        bool cased = false;
        for (size_t i = 0; i < v.u.s.n; i++) {
            char ch = v.u.s.p[i];
            if ((t[0] == 'l' && ch >= 'A' && ch <= 'Z') || (t[0] == 'u' && ch >= 'a' && ch <= 'z')) return false;
            if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z')) cased = true;
        }
        return cased;
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v.t == JV_BOOL) v = jv_int(v.u.b);   /* a bool is an int in Python */
        if (v.t != JV_INT) { jc_fail(c, TIDE_EINVAL, line, "test '%s' needs an integer", t); return false; }
        if (t[0] == 'o') return (v.u.i & 1) != 0;
        if (t[0] == 'e') return (v.u.i & 1) == 0;
        if (x.t != JV_INT || x.u.i == 0) { jc_fail(c, TIDE_EINVAL, line, "divisibleby needs a nonzero integer"); return false; }
        return x.u.i == -1 || v.u.i % x.u.i == 0;
    }
    bool ok;
    int r = jv_compare(c, v, x, line, &ok);
    if (!ok) return false;
    if (!strcmp(t, "lt")) return r < 0;
    if (!strcmp(t, "le")) return r <= 0;
    if (!strcmp(t, "gt")) return r > 0;
    if (!strcmp(t, "ge")) return r >= 0;
    jc_fail(c, TIDE_EUNSUPPORTED, line, "test '%s' is not supported", t);
    return false;
}

struct jv jb_call_global(struct jctx *c, const char *g, const struct jargs *a, int line)
{
    if (!strcmp(g, "raise_exception")) {
        struct jv m = jv_to_str(c, arg(a, 0, NULL, jv_str("", 0)));
        jc_fail(c, TIDE_EINVAL, line, "the template raised an exception: %.*s", (int)(m.u.s.n > 300 ? 300 : m.u.s.n), m.u.s.p);
        return jv_undef();
    }
    if (!strcmp(g, "strftime_now")) {
        struct jv fmt = arg(a, 0, NULL, jv_undef());
        if (!need_str(c, fmt, "strftime_now", line)) return jv_undef();
        time_t now = c->lim->now ? c->lim->now : time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char f[256], out[512];
        snprintf(f, sizeof f, "%.*s", (int)fmt.u.s.n, fmt.u.s.p);
        size_t n = f[0] ? strftime(out, sizeof out, f, &tm) : 0;
        return jv_strdup(c, out, n);
    }
    if (!strcmp(g, "namespace") || !strcmp(g, "dict")) {
        struct jv d = jv_newdict(c);
        if (a->npos == 1 && a->pos[0].t == JV_DICT)
            for (int i = 0; i < a->pos[0].u.d->n; i++) jd_set(c, d.u.d, a->pos[0].u.d->k[i], a->pos[0].u.d->v[i]);
        else if (a->npos) { jc_fail(c, TIDE_EINVAL, line, "%s() takes keyword arguments", g); return jv_undef(); }
        for (int i = 0; i < a->nkw; i++) jd_set(c, d.u.d, jv_str(a->kwname[i], strlen(a->kwname[i])), a->kw[i]);
        return d;
    }
    if (!strcmp(g, "range")) {
        long long lo = 0, hi, st = 1;
        for (int i = 0; i < a->npos; i++)
            if (a->pos[i].t != JV_INT) { jc_fail(c, TIDE_EINVAL, line, "range() needs integers"); return jv_undef(); }
        if (a->npos == 1) hi = a->pos[0].u.i;
        else if (a->npos == 2 || a->npos == 3) { lo = a->pos[0].u.i; hi = a->pos[1].u.i; if (a->npos == 3) st = a->pos[2].u.i; }
        else { jc_fail(c, TIDE_EINVAL, line, "range() takes 1 to 3 arguments"); return jv_undef(); }
        if (st == 0) { jc_fail(c, TIDE_EINVAL, line, "range() step must not be zero"); return jv_undef(); }
        double n = st > 0 ? ceil(((double)hi - (double)lo) / (double)st) : ceil(((double)lo - (double)hi) / (double)-st);
        if (n > MAX_RANGE) { jc_fail(c, TIDE_ERANGE, line, "range too big (at most %d items)", MAX_RANGE); return jv_undef(); }
        struct jv l = jv_newlist(c);
        for (long long i = lo; st > 0 ? i < hi : i > hi; i += st) jl_push(c, l.u.l, jv_int(i));
        return l;
    }
    jc_fail(c, TIDE_EINVAL, line, "'%s' is not callable", g);
    return jv_undef();
}
