/* jinja_parse.c - tokens to a syntax tree, by recursive descent with Jinja's precedence:
 * conditional < or < and < not < comparisons and 'in' < + - < ~ < * / // % < ** < unary
 * minus < primary with postfix (.attr, [index or slice], (call)), filters (|f) and tests
 * (is t). Unknown tests are refused here; an unknown filter fails only when it runs, as
 * in jinja2 3.x, where a template may guard it. Nesting is bounded so that hostile input cannot exhaust the stack. */
#include "jinja_internal.h"
#include "../common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_NESTING 200

struct parser {
    const struct jtok *t;
    int n, pos;
    struct jarena *a;
    char *err;
    size_t errlen;
    int rc;
    int depth;
};

static void *p_fail(struct parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *p_fail(struct parser *P, const char *fmt, ...)
{
    if (P->rc) return NULL;
    P->rc = TIDE_EFORMAT;
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(P->err, P->errlen, "line %d: ", P->t[P->pos].line);
    if (k >= 0 && (size_t)k < P->errlen) vsnprintf(P->err + k, P->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return NULL;
}

static const struct jtok *cur(struct parser *P) { return &P->t[P->pos]; }
static const struct jtok *peek(struct parser *P, int k)
{
    return P->pos + k < P->n ? &P->t[P->pos + k] : &P->t[P->n - 1];
}
static bool is_op(const struct jtok *t, const char *op)
{
    return t->kind == JT_OP && t->len == strlen(op) && !memcmp(t->s, op, t->len);
}
static bool is_name(const struct jtok *t, const char *nm)
{
    return t->kind == JT_NAME && t->len == strlen(nm) && !memcmp(t->s, nm, t->len);
}
static void advance(struct parser *P) { if (P->pos < P->n - 1) P->pos++; }
static bool accept_op(struct parser *P, const char *op)
{
    if (!is_op(cur(P), op)) return false;
    advance(P);
    return true;
}
static bool expect_op(struct parser *P, const char *op)
{
    if (accept_op(P, op)) return true;
    p_fail(P, "expected '%s'", op);
    return false;
}

static struct jnode *node(struct parser *P, enum jnode_kind k)
{
    struct jnode *n = ja_alloc(P->a, sizeof *n);
    if (!n) { if (!P->rc) { P->rc = TIDE_ENOMEM; snprintf(P->err, P->errlen, "out of memory"); } return NULL; }
    n->kind = k;
    n->line = cur(P)->line;
    return n;
}

static bool push(struct parser *P, struct jvec *v, struct jnode *n)
{
    if (!n) return false;
    if (jvec_push(P->a, v, n)) { p_fail(P, "out of memory"); return false; }
    return true;
}

static const char *name_str(struct parser *P, const struct jtok *t)
{
    const char *s = ja_strndup(P->a, t->s, t->len);
    if (!s) p_fail(P, "out of memory");
    return s;
}

static struct jnode *parse_expr(struct parser *P, bool condexpr);
static struct jnode *parse_unary(struct parser *P, bool with_filter);

/* (args, name=value, ...) after the '(' */
static bool parse_args(struct parser *P, struct jnode *n)
{
    const char *names[16];
    int nk = 0;
    while (!is_op(cur(P), ")")) {
        if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), "=")) {
            if (nk == 16) { p_fail(P, "too many keyword arguments"); return false; }
            names[nk++] = name_str(P, cur(P));
            advance(P);
            advance(P);
            if (!push(P, &n->kwvals, parse_expr(P, true))) return false;
        } else {
            if (!push(P, &n->other, parse_expr(P, true))) return false;
        }
        if (!accept_op(P, ",")) break;
    }
    if (!expect_op(P, ")")) return false;
    if (nk) {
        n->names = ja_alloc(P->a, sizeof *n->names * (size_t)nk);
        if (!n->names) { p_fail(P, "out of memory"); return false; }
        memcpy(n->names, names, sizeof *names * (size_t)nk);
        n->n_names = nk;
    }
    return true;
}

static struct jnode *parse_primary(struct parser *P)
{
    const struct jtok *t = cur(P);
    struct jnode *n;
    if (t->kind == JT_NAME) {
        n = node(P, E_LIT);
        if (!n) return NULL;
        if (is_name(t, "true") || is_name(t, "True")) n->lit = jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->lit = jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->lit = jv_none();
        else { n->kind = E_NAME; n->s = name_str(P, t); n->slen = t->len; }
        advance(P);
        return n;
    }
    if (t->kind == JT_STRING) {
        /* adjacent literals concatenate */
        size_t len = 0;
        int k = P->pos;
        while (P->t[k].kind == JT_STRING) len += P->t[k++].len;
        char *s = ja_alloc(P->a, len + 1);
        if (!s) return p_fail(P, "out of memory");
        len = 0;
        while (cur(P)->kind == JT_STRING) { memcpy(s + len, cur(P)->s, cur(P)->len); len += cur(P)->len; advance(P); }
        n = node(P, E_LIT);
        if (n) n->lit = jv_str(s, len);
        return n;
    }
    if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        n = node(P, E_LIT);
        if (n) n->lit = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        advance(P);
        return n;
    }
    if (accept_op(P, "(")) {
        if (accept_op(P, ")")) return node(P, E_TUPLE);
        struct jnode *e = parse_expr(P, true);
        if (!e) return NULL;
        if (is_op(cur(P), ",")) {
            n = node(P, E_TUPLE);
            if (!push(P, &n->other, e)) return NULL;
            while (accept_op(P, ",") && !is_op(cur(P), ")"))
                if (!push(P, &n->other, parse_expr(P, true))) return NULL;
            e = n;
        }
        return expect_op(P, ")") ? e : NULL;
    }
    if (accept_op(P, "[")) {
        n = node(P, E_LIST);
        while (n && !is_op(cur(P), "]")) {
            if (!push(P, &n->other, parse_expr(P, true))) return NULL;
            if (!accept_op(P, ",")) break;
        }
        return expect_op(P, "]") ? n : NULL;
    }
    if (accept_op(P, "{")) {
        n = node(P, E_DICT);
        while (n && !is_op(cur(P), "}")) {
            if (!push(P, &n->other, parse_expr(P, true))) return NULL;
            if (!expect_op(P, ":")) return NULL;
            if (!push(P, &n->kwvals, parse_expr(P, true))) return NULL;
            if (!accept_op(P, ",")) break;
        }
        return expect_op(P, "}") ? n : NULL;
    }
    if (t->kind == JT_EOF || t->kind == JT_VAR_END || t->kind == JT_BLOCK_END) return p_fail(P, "expected an expression");
    return p_fail(P, "unexpected '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s ? t->s : "");
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *n)
{
    while (n) {
        if (accept_op(P, ".")) {
            const struct jtok *t = cur(P);
            struct jnode *x;
            if (t->kind == JT_NAME) {
                x = node(P, E_ATTR);
                if (!x) return NULL;
                x->s = name_str(P, t);
                x->slen = t->len;
            } else if (t->kind == JT_INT) {
                x = node(P, E_ITEM);
                if (!x) return NULL;
                x->b = node(P, E_LIT);
                if (!x->b) return NULL;
                x->b->lit = jv_int(t->i);
            } else {
                return p_fail(P, "expected a name after '.'");
            }
            advance(P);
            x->a = n;
            n = x;
        } else if (accept_op(P, "[")) {
            struct jnode *x = node(P, E_ITEM);
            if (!x) return NULL;
            x->a = n;
            struct jnode *parts[3] = {0};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) {
                    parts[k] = parse_expr(P, true);
                    if (!parts[k]) return NULL;
                }
                if (k < 2 && accept_op(P, ":")) { slice = true; k++; continue; }
                break;
            }
            if (!expect_op(P, "]")) return NULL;
            if (slice) { x->kind = E_SLICE; x->b = parts[0]; x->c = parts[1];
                if (parts[2] && !push(P, &x->other, parts[2])) return NULL; }
            else x->b = parts[0];
            if (!x->b && !slice) return p_fail(P, "empty subscript");
            n = x;
        } else if (accept_op(P, "(")) {
            struct jnode *x = node(P, E_CALL);
            if (!x) return NULL;
            x->a = n;
            if (!parse_args(P, x)) return NULL;
            n = x;
        } else {
            break;
        }
    }
    return n;
}

static struct jnode *parse_filters(struct parser *P, struct jnode *n)
{
    while (n) {
        if (accept_op(P, "|")) {
            const struct jtok *t = cur(P);
            if (t->kind != JT_NAME) return p_fail(P, "expected a filter name after '|'");
            struct jnode *x = node(P, E_FILTER);
            if (!x) return NULL;
            x->s = name_str(P, t);
            x->slen = t->len;
            advance(P);
            x->a = n;
            if (accept_op(P, "(") && !parse_args(P, x)) return NULL;
            n = x;
        } else if (is_name(cur(P), "is")) {
            advance(P);
            struct jnode *x = node(P, E_TEST);
            if (!x) return NULL;
            if (is_name(cur(P), "not")) { x->negated = true; advance(P); }
            const struct jtok *t = cur(P);
            if (t->kind != JT_NAME) return p_fail(P, "expected a test name after 'is'");
            x->s = name_str(P, t);
            x->slen = t->len;
            if (x->s && !jb_has_test(x->s)) return p_fail(P, "unknown test '%s'", x->s);
            advance(P);
            x->a = n;
            const struct jtok *u = cur(P);
            if (accept_op(P, "(")) {
                if (!parse_args(P, x)) return NULL;
            } else if ((u->kind == JT_NAME && !is_name(u, "else") && !is_name(u, "or") && !is_name(u, "and") &&
                        !is_name(u, "if") && !is_name(u, "in") && !is_name(u, "is") && !is_name(u, "not")) ||
                       u->kind == JT_STRING || u->kind == JT_INT || u->kind == JT_FLOAT || is_op(u, "[") || is_op(u, "{")) {
                if (!push(P, &x->other, parse_postfix(P, parse_primary(P)))) return NULL;
            }
            n = x;
        } else if (accept_op(P, "(")) {
            struct jnode *x = node(P, E_CALL);
            if (!x) return NULL;
            x->a = n;
            if (!parse_args(P, x)) return NULL;
            n = x;
        } else {
            break;
        }
    }
    return n;
}

static struct jnode *parse_unary(struct parser *P, bool with_filter)
{
    if (++P->depth > MAX_NESTING) return p_fail(P, "expression nested too deeply");
    struct jnode *n;
    if (accept_op(P, "-")) {
        n = node(P, E_NEG);
        if (n) { n->a = parse_unary(P, false); if (!n->a) n = NULL; }
    } else if (accept_op(P, "+")) {
        n = parse_unary(P, false);
    } else {
        n = parse_postfix(P, parse_primary(P));
    }
    if (with_filter) n = parse_filters(P, n);
    P->depth--;
    return n;
}

static struct jnode *binop(struct parser *P, enum jnode_kind k, const char *op, struct jnode *l, struct jnode *r)
{
    if (!l || !r) return NULL;
    struct jnode *n = node(P, k);
    if (!n) return NULL;
    n->s = op;
    n->slen = strlen(op);
    n->a = l;
    n->b = r;
    return n;
}

static struct jnode *parse_pow(struct parser *P)
{
    struct jnode *l = parse_unary(P, true);
    while (l && accept_op(P, "**")) l = binop(P, E_BIN, "**", l, parse_unary(P, true));
    return l;
}

static struct jnode *parse_math2(struct parser *P)
{
    struct jnode *l = parse_pow(P);
    for (;;) {
        const char *op = is_op(cur(P), "*") ? "*" : is_op(cur(P), "/") ? "/" : is_op(cur(P), "//") ? "//" :
                         is_op(cur(P), "%") ? "%" : NULL;
        if (!op || !l) return l;
        advance(P);
        l = binop(P, E_BIN, op, l, parse_pow(P));
    }
}

static struct jnode *parse_concat(struct parser *P)
{
    struct jnode *l = parse_math2(P);
    while (l && accept_op(P, "~")) l = binop(P, E_BIN, "~", l, parse_math2(P));
    return l;
}

static struct jnode *parse_math1(struct parser *P)
{
    struct jnode *l = parse_concat(P);
    for (;;) {
        const char *op = is_op(cur(P), "+") ? "+" : is_op(cur(P), "-") ? "-" : NULL;
        if (!op || !l) return l;
        advance(P);
        l = binop(P, E_BIN, op, l, parse_concat(P));
    }
}

static struct jnode *parse_compare(struct parser *P)
{
    struct jnode *l = parse_math1(P);
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    while (l) {
        const char *op = NULL;
        for (size_t i = 0; i < 6; i++) if (is_op(cur(P), ops[i])) op = ops[i];
        if (op) advance(P);
        else if (is_name(cur(P), "in")) { op = "in"; advance(P); }
        else if (is_name(cur(P), "not") && is_name(peek(P, 1), "in")) { op = "not in"; advance(P); advance(P); }
        else return l;
        l = binop(P, E_BIN, op, l, parse_math1(P));
    }
    return l;
}

static struct jnode *parse_not(struct parser *P)
{
    if (is_name(cur(P), "not")) {
        advance(P);
        if (++P->depth > MAX_NESTING) return p_fail(P, "expression nested too deeply");
        struct jnode *n = node(P, E_NOT);
        if (n) { n->a = parse_not(P); if (!n->a) n = NULL; }
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static struct jnode *parse_and(struct parser *P)
{
    struct jnode *l = parse_not(P);
    while (l && is_name(cur(P), "and")) { advance(P); l = binop(P, E_AND, "and", l, parse_not(P)); }
    return l;
}

static struct jnode *parse_or(struct parser *P)
{
    struct jnode *l = parse_and(P);
    while (l && is_name(cur(P), "or")) { advance(P); l = binop(P, E_OR, "or", l, parse_and(P)); }
    return l;
}

static struct jnode *parse_expr(struct parser *P, bool condexpr)
{
    if (++P->depth > MAX_NESTING) return p_fail(P, "expression nested too deeply");
    struct jnode *l = parse_or(P);
    while (condexpr && l && is_name(cur(P), "if")) {
        advance(P);
        struct jnode *n = node(P, E_COND);
        if (!n) return NULL;
        n->b = l;
        n->a = parse_or(P);
        if (!n->a) return NULL;
        if (is_name(cur(P), "else")) {
            advance(P);
            n->c = parse_expr(P, true);
            if (!n->c) return NULL;
        }
        l = n;
    }
    P->depth--;
    return l;
}

static bool expect_block_end(struct parser *P)
{
    if (cur(P)->kind == JT_BLOCK_END) { advance(P); return true; }
    p_fail(P, "expected the end of the tag, not '%.*s'", (int)(cur(P)->len > 20 ? 20 : cur(P)->len),
           cur(P)->s ? cur(P)->s : "");
    return false;
}

/* Statements until {% name %} with name one of ends (NULL-terminated); returns that index
 * with the parser on the name, or -1 on error or at the end of input when ends is NULL. */
static int parse_body(struct parser *P, struct jvec *body, const char *const *ends);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};

static struct jnode *parse_if_inner(struct parser *P);
static struct jnode *parse_if(struct parser *P)   /* elif chains nest: counted like blocks */
{
    if (++P->depth > MAX_NESTING) return p_fail(P, "blocks nested too deeply");
    struct jnode *n = parse_if_inner(P);
    P->depth--;
    return n;
}

static struct jnode *parse_if_inner(struct parser *P)
{
    struct jnode *n = node(P, N_IF);
    if (!n) return NULL;
    n->a = parse_expr(P, true);
    if (!n->a || !expect_block_end(P)) return NULL;
    int e = parse_body(P, &n->body, END_IF);
    if (e < 0) return NULL;
    advance(P);
    if (e == 0) {
        if (!push(P, &n->other, parse_if(P))) return NULL;
    } else if (e == 1) {
        static const char *const end[] = {"endif", NULL};
        if (!expect_block_end(P) || parse_body(P, &n->other, end) < 0) return NULL;
        advance(P);
        if (!expect_block_end(P)) return NULL;
    } else if (!expect_block_end(P)) {
        return NULL;
    }
    return n;
}

static bool parse_targets(struct parser *P, struct jnode *n)
{
    const char *names[8];
    int k = 0;
    bool paren = accept_op(P, "(");
    do {
        if (cur(P)->kind != JT_NAME) { p_fail(P, "expected a variable name"); return false; }
        if (k == 8) { p_fail(P, "too many names to unpack"); return false; }
        names[k++] = name_str(P, cur(P));
        advance(P);
    } while (accept_op(P, ","));
    if (paren && !expect_op(P, ")")) return false;
    n->names = ja_alloc(P->a, sizeof *names * (size_t)k);
    if (!n->names) { p_fail(P, "out of memory"); return false; }
    memcpy(n->names, names, sizeof *names * (size_t)k);
    n->n_names = k;
    return true;
}

static struct jnode *parse_statement(struct parser *P)
{
    const struct jtok *t = cur(P);
    if (t->kind != JT_NAME) return p_fail(P, "expected a tag name");
    advance(P);
    struct jnode *n;
    if (is_name(t, "if")) return parse_if(P);
    if (is_name(t, "for")) {
        n = node(P, N_FOR);
        if (!n || !parse_targets(P, n)) return NULL;
        if (!is_name(cur(P), "in")) return p_fail(P, "expected 'in' in a for tag");
        advance(P);
        n->a = parse_expr(P, false);
        if (!n->a) return NULL;
        if (is_name(cur(P), "if")) { advance(P); n->b = parse_expr(P, true); if (!n->b) return NULL; }
        if (is_name(cur(P), "recursive")) return p_fail(P, "recursive for loops are not supported");
        if (!expect_block_end(P)) return NULL;
        int e = parse_body(P, &n->body, END_FOR);
        if (e < 0) return NULL;
        advance(P);
        if (!expect_block_end(P)) return NULL;
        if (e == 0) {
            static const char *const end[] = {"endfor", NULL};
            if (parse_body(P, &n->other, end) < 0) return NULL;
            advance(P);
            if (!expect_block_end(P)) return NULL;
        }
        return n;
    }
    if (is_name(t, "set")) {
        n = node(P, N_SET);
        if (!n) return NULL;
        if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), ".") && peek(P, 2)->kind == JT_NAME) {
            /* ns.attr = value */
            n->s = name_str(P, cur(P));
            n->slen = strlen(n->s ? n->s : "");
            advance(P);
            advance(P);
            n->c = node(P, E_LIT);
            if (!n->c) return NULL;
            n->c->s = name_str(P, cur(P));
            advance(P);
        } else if (!parse_targets(P, n)) {
            return NULL;
        }
        if (accept_op(P, "=")) {
            n->a = parse_expr(P, true);
            if (n->a && is_op(cur(P), ",")) {
                struct jnode *tp = node(P, E_TUPLE);
                if (!push(P, &tp->other, n->a)) return NULL;
                while (accept_op(P, ","))
                    if (!push(P, &tp->other, parse_expr(P, true))) return NULL;
                n->a = tp;
            }
            if (!n->a || !expect_block_end(P)) return NULL;
            return n;
        }
        if (n->c || n->n_names != 1) return p_fail(P, "a block set takes one name");
        n->kind = N_SET_BLOCK;
        if (!expect_block_end(P)) return NULL;
        static const char *const end[] = {"endset", NULL};
        if (parse_body(P, &n->body, end) < 0) return NULL;
        advance(P);
        return expect_block_end(P) ? n : NULL;
    }
    if (is_name(t, "macro")) {
        n = node(P, N_MACRO);
        if (!n) return NULL;
        if (cur(P)->kind != JT_NAME) return p_fail(P, "expected a macro name");
        n->s = name_str(P, cur(P));
        advance(P);
        if (!expect_op(P, "(")) return NULL;
        const char *names[32];
        int k = 0;
        while (!is_op(cur(P), ")")) {
            if (cur(P)->kind != JT_NAME || k == 32) return p_fail(P, "expected a parameter name");
            names[k++] = name_str(P, cur(P));
            advance(P);
            struct jnode *def = NULL;
            if (accept_op(P, "=")) { def = parse_expr(P, true); if (!def) return NULL; }
            else { def = node(P, E_LIT); if (!def) return NULL; def->lit = jv_undef(); def->negated = true; }   /* no default */
            if (!push(P, &n->kwvals, def)) return NULL;
            if (!accept_op(P, ",")) break;
        }
        if (!expect_op(P, ")") || !expect_block_end(P)) return NULL;
        n->names = ja_alloc(P->a, sizeof *names * (size_t)(k ? k : 1));
        if (!n->names) return p_fail(P, "out of memory");
        memcpy(n->names, names, sizeof *names * (size_t)k);
        n->n_names = k;
        static const char *const end[] = {"endmacro", NULL};
        if (parse_body(P, &n->body, end) < 0) return NULL;
        advance(P);
        if (cur(P)->kind == JT_NAME) advance(P);   /* {% endmacro name %} */
        return expect_block_end(P) ? n : NULL;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        n = node(P, is_name(t, "break") ? N_BREAK : N_CONTINUE);
        return n && expect_block_end(P) ? n : NULL;
    }
    P->pos--;
    return p_fail(P, "unsupported tag '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
}

static int parse_body(struct parser *P, struct jvec *body, const char *const *ends)
{
    if (++P->depth > MAX_NESTING) { p_fail(P, "blocks nested too deeply"); return -1; }
    for (;;) {
        const struct jtok *t = cur(P);
        if (t->kind == JT_EOF) {
            if (!ends) { P->depth--; return 0; }
            p_fail(P, "missing {%% %s %%}", ends[0] && ends[1] && ends[2] ? ends[2] : ends[1] ? ends[1] : ends[0]);
            return -1;
        }
        if (t->kind == JT_TEXT) {
            struct jnode *n = node(P, N_TEXT);
            if (!n) return -1;
            n->s = t->s;
            n->slen = t->len;
            advance(P);
            if (!push(P, body, n)) return -1;
        } else if (t->kind == JT_VAR_BEGIN) {
            advance(P);
            struct jnode *n = node(P, N_OUTPUT);
            if (!n) return -1;
            n->a = parse_expr(P, true);
            if (!n->a) return -1;
            if (cur(P)->kind != JT_VAR_END) { p_fail(P, "expected '}}'"); return -1; }
            advance(P);
            if (!push(P, body, n)) return -1;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            advance(P);
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(cur(P), ends[i])) { P->depth--; return i; }
            const struct jtok *nm = cur(P);
            if (nm->kind == JT_NAME && (is_name(nm, "endif") || is_name(nm, "endfor") || is_name(nm, "else") ||
                                        is_name(nm, "elif") || is_name(nm, "endmacro") || is_name(nm, "endset"))) {
                p_fail(P, "unexpected {%% %.*s %%}", (int)nm->len, nm->s);
                return -1;
            }
            if (!push(P, body, parse_statement(P))) return -1;
        } else {
            p_fail(P, "unexpected token");
            return -1;
        }
        if (P->rc) return -1;
    }
}

int jinja_parse_tokens(struct jinja_template *t, const struct jtok *toks, int n, char *err, size_t errlen)
{
    struct parser P = {.t = toks, .n = n, .a = &t->arena, .err = err, .errlen = errlen};
    if (parse_body(&P, &t->body, NULL) < 0 || P.rc) return P.rc ? P.rc : TIDE_EFORMAT;
    if (t->arena.failed) { snprintf(err, errlen, "out of memory"); return TIDE_ENOMEM; }
    return 0;
}
