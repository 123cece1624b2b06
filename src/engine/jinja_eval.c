/* jinja_eval.c - walks the syntax tree: scopes (a for loop's body and a macro call get
 * their own, as in Jinja, so a plain 'set' inside a loop does not leak out; namespace()
 * objects carry values out), expressions with Python's semantics, the loop object,
 * macros, break/continue, and the limits that keep a render bounded. Also the public
 * entry points jinja_parse/jinja_render/jinja_free. */
#include "jinja_internal.h"
#include "../common.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CALL_DEPTH 64

struct jframe {
    struct jframe *parent;
    int n, cap;
    const char **names;
    struct jv *vals;
};

void jc_fail(struct jctx *c, int rc, int line, const char *fmt, ...)
{
    if (c->rc) return;
    c->rc = rc;
    va_list ap;
    va_start(ap, fmt);
    int k = line > 0 ? snprintf(c->err, c->errlen, "line %d: ", line) : 0;
    if (k >= 0 && (size_t)k < c->errlen) vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

static bool frame_get(const struct jframe *f, const char *name, struct jv *out)
{
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) { *out = f->vals[i]; return true; }
    return false;
}

static void frame_set(struct jctx *c, struct jframe *f, const char *name, struct jv v)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) { f->vals[i] = v; return; }
    if (f->n == f->cap) {
        int nc = f->cap ? f->cap * 2 : 8;
        const char **nn = ja_alloc(c->ar, sizeof *nn * (size_t)nc);
        struct jv *nv = ja_alloc(c->ar, sizeof *nv * (size_t)nc);
        if (!nn || !nv) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return; }
        if (f->n) { memcpy(nn, f->names, sizeof *nn * (size_t)f->n); memcpy(nv, f->vals, sizeof *nv * (size_t)f->n); }
        f->names = nn;
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static struct jframe *frame_new(struct jctx *c, struct jframe *parent)
{
    struct jframe *f = ja_alloc(c->ar, sizeof *f);
    if (!f) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return NULL; }
    f->parent = parent;
    return f;
}

static bool step(struct jctx *c, int line)
{
    if (c->rc) return false;
    long max = c->lim->max_steps > 0 ? c->lim->max_steps : 10000000;
    if (++c->steps > max) { jc_fail(c, TIDE_ERANGE, line, "the template ran past its step limit (%ld)", max); return false; }
    return true;
}

static struct jv eval(struct jctx *c, struct jframe *f, const struct jnode *n);
static void exec_body(struct jctx *c, struct jframe *f, const struct jvec *body, struct jbuf *out);
static void exec_node_inner(struct jctx *c, struct jframe *f, const struct jnode *n, struct jbuf *out);

static bool eval_args(struct jctx *c, struct jframe *f, const struct jnode *n, struct jargs *a)
{
    memset(a, 0, sizeof *a);
    if (n->other.n > 8 || n->kwvals.n > 8) { jc_fail(c, TIDE_EUNSUPPORTED, n->line, "more than 8 arguments"); return false; }
    for (int i = 0; i < n->other.n; i++) a->pos[a->npos++] = eval(c, f, n->other.v[i]);
    for (int i = 0; i < n->kwvals.n; i++) {
        a->kwname[a->nkw] = n->names[i];
        a->kw[a->nkw++] = eval(c, f, n->kwvals.v[i]);
    }
    return !c->rc;
}

static struct jv call_macro(struct jctx *c, const struct jnode *m, const struct jargs *a, int line)
{
    if (c->depth >= MAX_CALL_DEPTH) { jc_fail(c, TIDE_ERANGE, line, "macros nested deeper than %d", MAX_CALL_DEPTH); return jv_undef(); }
    if (a->npos > m->n_names) {
        jc_fail(c, TIDE_EINVAL, line, "macro '%s' takes not more than %d argument(s)", m->s, m->n_names);
        return jv_undef();
    }
    struct jframe *f = frame_new(c, c->root);
    if (!f) return jv_undef();
    for (int i = 0; i < m->n_names; i++) {
        struct jv v = jv_undef();
        bool set = false;
        if (i < a->npos) { v = a->pos[i]; set = true; }
        for (int k = 0; k < a->nkw && !set; k++) if (!strcmp(a->kwname[k], m->names[i])) { v = a->kw[k]; set = true; }
        if (!set && !m->kwvals.v[i]->negated) v = eval(c, f, m->kwvals.v[i]);
        frame_set(c, f, m->names[i], v);
    }
    for (int k = 0; k < a->nkw; k++) {
        bool known = false;
        for (int i = 0; i < m->n_names; i++) if (!strcmp(a->kwname[k], m->names[i])) known = true;
        if (!known) { jc_fail(c, TIDE_EINVAL, line, "macro '%s' has no parameter '%s'", m->s, a->kwname[k]); return jv_undef(); }
    }
    struct jbuf b = {.max = c->lim->max_output};
    c->depth++;
    exec_body(c, f, &m->body, &b);
    c->depth--;
    if (b.failed && !c->rc) jc_fail(c, TIDE_ERANGE, line, "a macro's output passed the output limit");
    struct jv r = c->rc ? jv_undef() : jv_strdup(c, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

struct jv jinja_call_value(struct jctx *c, struct jv fn, const struct jargs *a, int line)
{
    if (fn.t != JV_FUNC) {
        jc_fail(c, TIDE_EINVAL, line, "a %s is not callable", jv_typename(fn));
        return jv_undef();
    }
    if (!step(c, line)) return jv_undef();
    if (fn.u.fn->macro) return call_macro(c, fn.u.fn->macro, a, line);
    return jb_call_global(c, fn.u.fn->name, a, line);
}

static long long pyfloordiv(long long a, long long b)
{
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static struct jv concat(struct jctx *c, struct jv a, struct jv b)
{
    size_t n = a.u.s.n + b.u.s.n;
    size_t max = c->lim->max_output ? c->lim->max_output : ((size_t)4 << 20);
    if (n > max) { jc_fail(c, TIDE_ERANGE, 0, "a string grew past the output limit"); return jv_str("", 0); }
    char *p = ja_alloc(c->ar, n + 1);
    if (!p) { jc_fail(c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)"); return jv_str("", 0); }
    memcpy(p, a.u.s.p, a.u.s.n);
    memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
    return jv_str(p, n);
}

static bool isnum(struct jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double dnum(struct jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.t == JV_BOOL ? v.u.b : 0; }
static long long inum(struct jv v) { return v.t == JV_INT ? v.u.i : v.t == JV_BOOL ? v.u.b : 0; }

static struct jv repeat(struct jctx *c, struct jv s, long long k, int line)
{
    if (k <= 0) return s.t == JV_STR ? jv_str("", 0) : jv_newlist(c);
    size_t max = c->lim->max_output ? c->lim->max_output : ((size_t)4 << 20);
    size_t unit = s.t == JV_STR ? s.u.s.n : (size_t)s.u.l->n * sizeof(struct jv);
    if (unit && (unsigned long long)k > max / unit) { jc_fail(c, TIDE_ERANGE, line, "a repetition grew past the output limit"); return jv_undef(); }
    if (s.t == JV_STR) {
        char *p = ja_alloc(c->ar, unit * (size_t)k + 1);
        if (!p) { jc_fail(c, TIDE_ENOMEM, line, "out of memory"); return jv_undef(); }
        for (long long i = 0; i < k; i++) memcpy(p + unit * (size_t)i, s.u.s.p, unit);
        return jv_str(p, unit * (size_t)k);
    }
    struct jv l = jv_newlist(c);
    for (long long i = 0; i < k && !c->rc; i++)
        for (int j = 0; j < s.u.l->n; j++) jl_push(c, l.u.l, s.u.l->v[j]);
    return l;
}

static struct jv binary(struct jctx *c, const char *op, struct jv a, struct jv b, int line)
{
    if (!strcmp(op, "~")) {
        struct jv x = jv_to_str(c, a), y = jv_to_str(c, b);
        return concat(c, x, y);
    }
    if (!strcmp(op, "==")) return jv_bool(jv_equal(a, b));
    if (!strcmp(op, "!=")) return jv_bool(!jv_equal(a, b));
    if (!strcmp(op, "in") || !strcmp(op, "not in")) {
        bool r = false, neg = op[0] == 'n';
        if (b.t == JV_STR) {
            if (a.t != JV_STR) { jc_fail(c, TIDE_EINVAL, line, "'in <string>' requires a string on the left, not a %s", jv_typename(a)); return jv_undef(); }
            r = a.u.s.n == 0 || memmem(b.u.s.p, b.u.s.n, a.u.s.p, a.u.s.n) != NULL;
        } else if (b.t == JV_LIST) {
            for (int i = 0; i < b.u.l->n && !r; i++) r = jv_equal(a, b.u.l->v[i]);
        } else if (b.t == JV_DICT) {
            for (int i = 0; i < b.u.d->n && !r; i++) r = jv_equal(a, b.u.d->k[i]);
        } else if (b.t != JV_UNDEF) {
            jc_fail(c, TIDE_EINVAL, line, "argument of type %s is not iterable", jv_typename(b));
            return jv_undef();
        }
        return jv_bool(r != neg);
    }
    if (op[0] == '<' || op[0] == '>') {
        bool ok;
        int r = jv_compare(c, a, b, line, &ok);
        if (!ok) return jv_undef();
        if (!strcmp(op, "<")) return jv_bool(r < 0);
        if (!strcmp(op, "<=")) return jv_bool(r <= 0);
        if (!strcmp(op, ">")) return jv_bool(r > 0);
        return jv_bool(r >= 0);
    }
    if (!strcmp(op, "+")) {
        if (a.t == JV_STR && b.t == JV_STR) return concat(c, a, b);
        if (a.t == JV_LIST && b.t == JV_LIST) {
            struct jv l = jv_newlist(c);
            for (int i = 0; i < a.u.l->n; i++) jl_push(c, l.u.l, a.u.l->v[i]);
            for (int i = 0; i < b.u.l->n; i++) jl_push(c, l.u.l, b.u.l->v[i]);
            return l;
        }
    }
    if (!strcmp(op, "*")) {
        if ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(c, a, inum(b), line);
        if ((b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(c, b, inum(a), line);
    }
    if (!isnum(a) || !isnum(b)) {
        jc_fail(c, TIDE_EINVAL, line, "unsupported operand types for %s: %s and %s", op, jv_typename(a), jv_typename(b));
        return jv_undef();
    }
    bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    long long x = inum(a), y = inum(b), r;
    double dx = dnum(a), dy = dnum(b);
    switch (op[0]) {
    case '+':
        if (ints && !__builtin_add_overflow(x, y, &r)) return jv_int(r);
        return jv_float(dx + dy);
    case '-':
        if (ints && !__builtin_sub_overflow(x, y, &r)) return jv_int(r);
        return jv_float(dx - dy);
    case '*':
        if (op[1] == '*') {
            if (ints && y >= 0) {
                double p = pow(dx, dy);
                if (fabs(p) < 9e18) { long long acc = 1; for (long long i = 0; i < y; i++) acc *= x; return jv_int(acc); }
            }
            return jv_float(pow(dx, dy));
        }
        if (ints && !__builtin_mul_overflow(x, y, &r)) return jv_int(r);
        return jv_float(dx * dy);
    case '/':
        if (dy == 0) { jc_fail(c, TIDE_EINVAL, line, "division by zero"); return jv_undef(); }
        if (op[1] == '/') {
            if (ints) { if (x == LLONG_MIN && y == -1) return jv_float(-(double)x); return jv_int(pyfloordiv(x, y)); }
            return jv_float(floor(dx / dy));
        }
        return jv_float(dx / dy);
    case '%':
        if (dy == 0) { jc_fail(c, TIDE_EINVAL, line, "modulo by zero"); return jv_undef(); }
        if (ints) { if (y == -1) return jv_int(0); long long m = x % y; if (m && ((m < 0) != (y < 0))) m += y; return jv_int(m); }
        { double m = fmod(dx, dy); if (m != 0 && ((m < 0) != (dy < 0))) m += dy; return jv_float(m); }
    }
    jc_fail(c, TIDE_EINVAL, line, "unsupported operator %s", op);
    return jv_undef();
}

/* Python slice [lo:hi:st] of a list or string (strings by character). */
static struct jv slice(struct jctx *c, struct jv v, struct jv lo, struct jv hi, struct jv st, int line)
{
    long long step = st.t == JV_UNDEF || st.t == JV_NONE ? 1 : inum(st);
    if ((st.t != JV_UNDEF && st.t != JV_NONE && st.t != JV_INT) || step == 0) {
        jc_fail(c, TIDE_EINVAL, line, "bad slice step");
        return jv_undef();
    }
    struct jlist *items = NULL;
    if (v.t == JV_LIST || v.t == JV_STR) items = jv_iter_list(c, v, line);
    else { jc_fail(c, TIDE_EINVAL, line, "a %s cannot be sliced", jv_typename(v)); return jv_undef(); }
    if (!items) return jv_undef();
    long long n = items->n;
    long long b, e;
    bool has_lo = lo.t == JV_INT, has_hi = hi.t == JV_INT;
    if (step > 0) {
        b = has_lo ? lo.u.i : 0;
        e = has_hi ? hi.u.i : n;
        b = b < 0 ? (b + n < 0 ? 0 : b + n) : (b > n ? n : b);
        e = e < 0 ? (e + n < 0 ? 0 : e + n) : (e > n ? n : e);
    } else {
        b = has_lo ? lo.u.i : n - 1;
        e = has_hi ? hi.u.i : -n - 1;
        if (b < 0) b += n;
        b = b < -1 ? -1 : b > n - 1 ? n - 1 : b;
        if (has_hi && e < 0) e += n;
        e = e < -1 ? -1 : e > n - 1 ? n - 1 : e;
    }
    struct jv out = jv_newlist(c);
    for (long long i = b; step > 0 ? i < e : i > e; i += step) jl_push(c, out.u.l, items->v[i]);
    if (v.t != JV_STR || c->rc) return out;
    size_t len = 0;
    for (int i = 0; i < out.u.l->n; i++) len += out.u.l->v[i].u.s.n;
    char *p = ja_alloc(c->ar, len + 1);
    if (!p) { jc_fail(c, TIDE_ENOMEM, line, "out of memory"); return jv_undef(); }
    len = 0;
    for (int i = 0; i < out.u.l->n; i++) { memcpy(p + len, out.u.l->v[i].u.s.p, out.u.l->v[i].u.s.n); len += out.u.l->v[i].u.s.n; }
    return jv_str(p, len);
}

static struct jv eval_node(struct jctx *c, struct jframe *f, const struct jnode *n);

/* Expression trees can be deep without nesting (a + a + a ..., x|f|f|f ...): bounded here so
 * that evaluation cannot run off the stack. */
#define MAX_EVAL_DEPTH 1000
static struct jv eval(struct jctx *c, struct jframe *f, const struct jnode *n)
{
    if (c->rc) return jv_undef();
    if (c->eval_depth >= MAX_EVAL_DEPTH) {
        jc_fail(c, TIDE_ERANGE, n->line, "expression nested deeper than %d", MAX_EVAL_DEPTH);
        return jv_undef();
    }
    c->eval_depth++;
    struct jv v = eval_node(c, f, n);
    c->eval_depth--;
    return v;
}

static struct jv eval_node(struct jctx *c, struct jframe *f, const struct jnode *n)
{
    struct jv a, b;
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME:
        if (frame_get(f, n->s, &a)) return a;
        if (jb_is_global(n->s)) {
            struct jfunc *fn = ja_alloc(c->ar, sizeof *fn);
            if (!fn) { jc_fail(c, TIDE_ENOMEM, n->line, "out of memory"); return jv_undef(); }
            fn->name = n->s;
            struct jv v = {.t = JV_FUNC};
            v.u.fn = fn;
            return v;
        }
        return jv_undef();
    case E_ATTR:
        a = eval(c, f, n->a);
        if (a.t == JV_UNDEF) { jc_fail(c, TIDE_EINVAL, n->line, "undefined value has no attribute '%s'", n->s); return a; }
        return jb_getattr(c, a, jv_str(n->s, n->slen), n->line);
    case E_ITEM:
        a = eval(c, f, n->a);
        b = eval(c, f, n->b);
        if (a.t == JV_UNDEF) { jc_fail(c, TIDE_EINVAL, n->line, "undefined value is not subscriptable"); return a; }
        return jb_getattr(c, a, b, n->line);
    case E_SLICE: {
        a = eval(c, f, n->a);
        struct jv lo = n->b ? eval(c, f, n->b) : jv_undef(), hi = n->c ? eval(c, f, n->c) : jv_undef();
        struct jv st = n->other.n ? eval(c, f, n->other.v[0]) : jv_undef();
        if (c->rc) return jv_undef();
        return slice(c, a, lo, hi, st, n->line);
    }
    case E_CALL: {
        struct jargs args;
        if (n->a->kind == E_ATTR) {
            a = eval(c, f, n->a->a);
            if (!eval_args(c, f, n, &args)) return jv_undef();
            struct jv r;
            if (a.t != JV_UNDEF && jb_method(c, a, n->a->s, &args, &r, n->line)) return r;
            if (c->rc) return jv_undef();
            if (a.t == JV_UNDEF) { jc_fail(c, TIDE_EINVAL, n->line, "undefined value has no method '%s'", n->a->s); return a; }
            b = jb_getattr(c, a, jv_str(n->a->s, n->a->slen), n->line);
            if (b.t == JV_UNDEF && !c->rc) { jc_fail(c, TIDE_EINVAL, n->line, "a %s has no method '%s'", jv_typename(a), n->a->s); return b; }
            return jinja_call_value(c, b, &args, n->line);
        }
        a = eval(c, f, n->a);
        if (!eval_args(c, f, n, &args)) return jv_undef();
        if (a.t == JV_UNDEF) {
            jc_fail(c, TIDE_EINVAL, n->line, "'%s' is undefined", n->a->kind == E_NAME ? n->a->s : "callee");
            return a;
        }
        return jinja_call_value(c, a, &args, n->line);
    }
    case E_FILTER: {
        struct jargs args;
        a = eval(c, f, n->a);
        if (!eval_args(c, f, n, &args)) return jv_undef();
        return jb_filter(c, n->s, a, &args, n->line);
    }
    case E_TEST: {
        struct jargs args;
        a = eval(c, f, n->a);
        if (!eval_args(c, f, n, &args)) return jv_undef();
        bool r = jb_test(c, n->s, a, &args, n->line);
        return jv_bool(r != n->negated);
    }
    case E_NEG:
        a = eval(c, f, n->a);
        if (a.t == JV_INT) return a.u.i == LLONG_MIN ? jv_float(-(double)a.u.i) : jv_int(-a.u.i);
        if (a.t == JV_BOOL) return jv_int(-(long long)a.u.b);
        if (a.t == JV_FLOAT) return jv_float(-a.u.f);
        jc_fail(c, TIDE_EINVAL, n->line, "bad operand type for unary -: %s", jv_typename(a));
        return jv_undef();
    case E_NOT: return jv_bool(!jv_truthy(eval(c, f, n->a)));
    case E_AND: a = eval(c, f, n->a); return jv_truthy(a) ? eval(c, f, n->b) : a;
    case E_OR: a = eval(c, f, n->a); return jv_truthy(a) ? a : eval(c, f, n->b);
    case E_COND: return jv_truthy(eval(c, f, n->a)) ? eval(c, f, n->b) : n->c ? eval(c, f, n->c) : jv_undef();
    case E_BIN:
        a = eval(c, f, n->a);
        b = eval(c, f, n->b);
        if (c->rc) return jv_undef();
        return binary(c, n->s, a, b, n->line);
    case E_LIST: case E_TUPLE: {
        struct jv l = jv_newlist(c);
        if (c->rc) return l;
        l.tuple = n->kind == E_TUPLE;
        for (int i = 0; i < n->other.n; i++) jl_push(c, l.u.l, eval(c, f, n->other.v[i]));
        return l;
    }
    case E_DICT: {
        struct jv d = jv_newdict(c);
        for (int i = 0; i < n->other.n && !c->rc; i++) jd_set(c, d.u.d, eval(c, f, n->other.v[i]), eval(c, f, n->kwvals.v[i]));
        return d;
    }
    default:
        jc_fail(c, TIDE_EINTERNAL, n->line, "bad expression node");
        return jv_undef();
    }
}

static void assign(struct jctx *c, struct jframe *f, const struct jnode *n, struct jv v)
{
    if (n->n_names == 1) { frame_set(c, f, n->names[0], v); return; }
    if (v.t != JV_LIST || v.u.l->n != n->n_names) {
        jc_fail(c, TIDE_EINVAL, n->line, "cannot unpack a %s into %d names", jv_typename(v), n->n_names);
        return;
    }
    for (int i = 0; i < n->n_names; i++) frame_set(c, f, n->names[i], v.u.l->v[i]);
}

static void exec_for(struct jctx *c, struct jframe *f, const struct jnode *n, struct jbuf *out)
{
    struct jv it = eval(c, f, n->a);
    if (c->rc) return;
    if (!jv_iterable(it) && it.t != JV_NONE) { jc_fail(c, TIDE_EINVAL, n->line, "a %s is not iterable", jv_typename(it)); return; }
    struct jlist *items = it.t == JV_NONE ? NULL : jv_iter_list(c, it, n->line);
    if (c->rc) return;
    if (it.t == JV_NONE) { jc_fail(c, TIDE_EINVAL, n->line, "'NoneType' object is not iterable"); return; }
    if (n->b) {   /* for x in xs if cond: the loop sees only the items that pass */
        struct jv kept = jv_newlist(c);
        for (int i = 0; i < items->n && step(c, n->line); i++) {
            struct jframe *tf = frame_new(c, f);
            if (!tf) return;
            assign(c, tf, n, items->v[i]);
            if (jv_truthy(eval(c, tf, n->b))) jl_push(c, kept.u.l, items->v[i]);
        }
        if (c->rc) return;
        items = kept.u.l;
    }
    int len = items->n;
    for (int i = 0; i < len && step(c, n->line); i++) {
        struct jframe *lf = frame_new(c, f);
        if (!lf) return;
        struct jv loop = jv_newdict(c);
        if (c->rc) return;
        struct { const char *k; struct jv v; } fields[] = {
            {"index", jv_int(i + 1)}, {"index0", jv_int(i)}, {"revindex", jv_int(len - i)},
            {"revindex0", jv_int(len - i - 1)}, {"first", jv_bool(i == 0)}, {"last", jv_bool(i == len - 1)},
            {"length", jv_int(len)}, {"previtem", i > 0 ? items->v[i - 1] : jv_undef()},
            {"nextitem", i + 1 < len ? items->v[i + 1] : jv_undef()}, {"depth", jv_int(1)}, {"depth0", jv_int(0)}};
        for (size_t k = 0; k < sizeof fields / sizeof *fields; k++)
            jd_set(c, loop.u.d, jv_str(fields[k].k, strlen(fields[k].k)), fields[k].v);
        frame_set(c, lf, "loop", loop);
        assign(c, lf, n, items->v[i]);
        exec_body(c, lf, &n->body, out);
        if (c->loop_ctl == 1) { c->loop_ctl = 0; break; }
        c->loop_ctl = 0;
    }
    if (len == 0 && !c->rc) exec_body(c, f, &n->other, out);
}

static void exec_node(struct jctx *c, struct jframe *f, const struct jnode *n, struct jbuf *out)
{
    if (c->eval_depth >= MAX_EVAL_DEPTH) {   /* elif chains nest */
        jc_fail(c, TIDE_ERANGE, n->line, "blocks nested deeper than %d", MAX_EVAL_DEPTH);
        return;
    }
    c->eval_depth++;
    exec_node_inner(c, f, n, out);
    c->eval_depth--;
}

static void exec_node_inner(struct jctx *c, struct jframe *f, const struct jnode *n, struct jbuf *out)
{
    switch (n->kind) {
    case N_TEXT: jb_put(out, n->s, n->slen); break;
    case N_OUTPUT: {
        struct jv v = eval(c, f, n->a);
        if (!c->rc) jv_str_into(out, v);
        break;
    }
    case N_IF: {
        struct jv v = eval(c, f, n->a);
        if (c->rc) return;
        exec_body(c, f, jv_truthy(v) ? &n->body : &n->other, out);
        break;
    }
    case N_FOR: exec_for(c, f, n, out); break;
    case N_SET: {
        struct jv v = eval(c, f, n->a);
        if (c->rc) return;
        if (n->c) {
            struct jv ns;
            if (!frame_get(f, n->s, &ns) || ns.t != JV_DICT) {
                jc_fail(c, TIDE_EINVAL, n->line, "cannot assign attribute on non-namespace object '%s'", n->s);
                return;
            }
            jd_set(c, ns.u.d, jv_str(n->c->s, strlen(n->c->s)), v);
        } else {
            assign(c, f, n, v);
        }
        break;
    }
    case N_SET_BLOCK: {
        struct jbuf b = {.max = c->lim->max_output};
        exec_body(c, f, &n->body, &b);
        if (b.failed && !c->rc) jc_fail(c, TIDE_ERANGE, n->line, "a block set passed the output limit");
        if (!c->rc) frame_set(c, f, n->names[0], jv_strdup(c, b.p ? b.p : "", b.len));
        free(b.p);
        break;
    }
    case N_MACRO: {
        struct jfunc *fn = ja_alloc(c->ar, sizeof *fn);
        if (!fn) { jc_fail(c, TIDE_ENOMEM, n->line, "out of memory"); return; }
        fn->macro = n;
        fn->name = n->s;
        struct jv v = {.t = JV_FUNC};
        v.u.fn = fn;
        frame_set(c, f, n->s, v);
        break;
    }
    case N_BREAK: c->loop_ctl = 1; break;
    case N_CONTINUE: c->loop_ctl = 2; break;
    default: jc_fail(c, TIDE_EINTERNAL, n->line, "bad statement node"); break;
    }
}

static void exec_body(struct jctx *c, struct jframe *f, const struct jvec *body, struct jbuf *out)
{
    for (int i = 0; i < body->n && !c->loop_ctl; i++) {
        if (!step(c, body->v[i]->line)) return;
        exec_node(c, f, body->v[i], out);
        if (out->failed && !c->rc) jc_fail(c, TIDE_ERANGE, body->v[i]->line, "the output passed its limit");
        if (c->rc) return;
    }
}

int jinja_parse(const char *src, struct jinja_template **out, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen) err[0] = 0;
    struct jinja_template *t = calloc(1, sizeof *t);
    if (!t) return TIDE_ENOMEM;
    t->arena.cap = (size_t)256 << 20;
    struct jtok *toks;
    int n;
    int rc = jinja_lex(src, &t->arena, &toks, &n, err, errlen);
    if (!rc) rc = jinja_parse_tokens(t, toks, n, err, errlen);
    if (!rc && t->arena.failed) rc = TIDE_ENOMEM;
    if (rc) {
        if (rc == TIDE_ENOMEM && errlen && !err[0]) snprintf(err, errlen, "out of memory");
        jinja_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int jinja_render(const struct jinja_template *t, const cJSON *ctx, const struct jinja_limits *lim0,
                 char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen) err[0] = 0;
    struct jinja_limits lim = lim0 ? *lim0 : (struct jinja_limits){0};
    if (!lim.max_output) lim.max_output = (size_t)4 << 20;
    if (!lim.max_memory) lim.max_memory = (size_t)64 << 20;
    struct jarena ar = {.cap = lim.max_memory};
    struct jctx c = {.ar = &ar, .lim = &lim, .err = err, .errlen = errlen};
    c.root = frame_new(&c, NULL);
    if (c.root && ctx) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ctx) if (e->string) frame_set(&c, c.root, e->string, jv_from_json(&c, e));
    }
    struct jbuf b = {.max = lim.max_output};
    jb_put(&b, "", 0);
    if (!c.rc) exec_body(&c, c.root, &t->body, &b);
    if (!c.rc && b.failed) jc_fail(&c, TIDE_ERANGE, 0, "the output passed its limit (%zu bytes)", lim.max_output);
    if (!c.rc && ar.failed) jc_fail(&c, TIDE_ENOMEM, 0, "out of memory (the template made too much data)");
    ja_free(&ar);
    if (c.rc) { free(b.p); return c.rc; }
    if (!b.p) { b.p = strdup(""); if (!b.p) return TIDE_ENOMEM; }
    *out = b.p;
    return 0;
}

void jinja_free(struct jinja_template *t)
{
    if (!t) return;
    ja_free(&t->arena);
    free(t);
}
