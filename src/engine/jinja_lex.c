/* jinja_lex.c - Jinja source to tokens, with Hugging Face's whitespace settings applied here:
 * trim_blocks (the newline after a block or comment tag goes), lstrip_blocks (spaces and tabs
 * before a block or comment tag on its own line go), '-' (all whitespace on that side goes),
 * '+' (lstrip/trim off for that tag), newlines normalised to \n and one trailing newline of
 * the source dropped (keep_trailing_newline false). */
#include "jinja_internal.h"
#include "../common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lexer {
    struct jarena *a;
    struct jtok *t;
    int n, cap;
    int line;
    char *err;
    size_t errlen;
};

static int lx_fail(struct lexer *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(L->err, L->errlen, "line %d: ", L->line);
    if (k >= 0 && (size_t)k < L->errlen) vsnprintf(L->err + k, L->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return TIDE_EFORMAT;
}

static struct jtok *lx_push(struct lexer *L, enum jtok_kind kind, const char *s, size_t len)
{
    if (L->n == L->cap) {
        int nc = L->cap ? L->cap * 2 : 256;
        struct jtok *nt = ja_alloc(L->a, sizeof *nt * (size_t)nc);
        if (!nt) return NULL;
        if (L->n) memcpy(nt, L->t, sizeof *nt * (size_t)L->n);
        L->t = nt;
        L->cap = nc;
    }
    struct jtok *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = L->line;
    t->s = s;
    t->len = len;
    return t;
}

static bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static bool is_name0(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static void put_utf8(char *o, size_t *k, unsigned cp)
{
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) { o[(*k)++] = (char)(0xC0 | cp >> 6); o[(*k)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | cp >> 12); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | cp >> 18); o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A quoted string with Python's escapes; *pp points at the quote, moves past the close. */
static int lex_string(struct lexer *L, const char **pp)
{
    const char *p = *pp;
    char q = *p++;
    const char *start = p;
    while (*p && *p != q) {
        if (*p == '\\' && p[1]) p++;
        if (*p == '\n') L->line++;
        p++;
    }
    if (!*p) return lx_fail(L, "unterminated string");
    size_t n = (size_t)(p - start);
    char *o = ja_alloc(L->a, n + 1);
    if (!o) return TIDE_ENOMEM;
    size_t k = 0;
    for (const char *s = start; s < p; s++) {
        if (*s != '\\') { o[k++] = *s; continue; }
        s++;
        unsigned cp;
        int nd = 0;
        switch (*s) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '0': o[k++] = '\0'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case 'a': o[k++] = '\a'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default: o[k++] = '\\'; o[k++] = *s; break;
        }
        if (nd) {
            cp = 0;
            for (int i = 0; i < nd; i++) {
                char h = s[1];
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0 || s + 1 >= p) return lx_fail(L, "bad \\%c escape in a string", nd == 2 ? 'x' : 'u');
                cp = cp * 16 + (unsigned)v;
                s++;
            }
            if (cp > 0x10FFFF) return lx_fail(L, "bad escape in a string");
            put_utf8(o, &k, cp);   /* \xNN -> at most 2 bytes for 4 source bytes: fits */
        }
    }
    o[k] = 0;
    struct jtok *t = lx_push(L, JT_STRING, o, k);
    if (!t) return TIDE_ENOMEM;
    *pp = p + 1;
    return 0;
}

/* The inside of a {{ }} or {% %} tag up to its end; returns the position after the end. */
static int lex_tag(struct lexer *L, const char **pp, bool block, bool *strip_after, bool *plus_after)
{
    const char *p = *pp;
    int depth = 0;
    char close = block ? '%' : '}';
    for (;;) {
        while (is_space(*p)) { if (*p == '\n') L->line++; p++; }
        if (!*p) return lx_fail(L, "unclosed %s tag", block ? "{% %}" : "{{ }}");
        if (depth == 0) {
            const char *q = p;
            bool minus = false, plus = false;
            if (*q == '-' && q[1] == close && q[2] == '}') { minus = true; q++; }
            else if (block && *q == '+' && q[1] == '%' && q[2] == '}') { plus = true; q++; }
            if (*q == close && q[1] == '}') {
                *strip_after = minus;
                *plus_after = plus;
                if (!lx_push(L, block ? JT_BLOCK_END : JT_VAR_END, NULL, 0)) return TIDE_ENOMEM;
                *pp = q + 2;
                return 0;
            }
        }
        if (*p == '\'' || *p == '"') {
            int rc = lex_string(L, &p);
            if (rc) return rc;
            continue;
        }
        if (is_name0(*p)) {
            const char *s = p;
            while (is_name0(*p) || is_digit(*p)) p++;
            if (!lx_push(L, JT_NAME, s, (size_t)(p - s))) return TIDE_ENOMEM;
            continue;
        }
        if (is_digit(*p)) {
            const char *s = p;
            while (is_digit(*p) || *p == '_') p++;
            bool fl = false;
            if (*p == '.' && is_digit(p[1])) { fl = true; p++; while (is_digit(*p) || *p == '_') p++; }
            if ((*p == 'e' || *p == 'E') && (is_digit(p[1]) || ((p[1] == '+' || p[1] == '-') && is_digit(p[2])))) {
                fl = true;
                p += 2;
                while (is_digit(*p)) p++;
            }
            char buf[64];
            size_t k = 0;
            for (const char *x = s; x < p && k < sizeof buf - 1; x++) if (*x != '_') buf[k++] = *x;
            buf[k] = 0;
            struct jtok *t = lx_push(L, fl ? JT_FLOAT : JT_INT, s, (size_t)(p - s));
            if (!t) return TIDE_ENOMEM;
            if (fl) t->f = strtod(buf, NULL);
            else t->i = strtoll(buf, NULL, 10);
            continue;
        }
        static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                          "(", ")", "[", "]", "{", "}", ",", ":", ".", "|", "=", "<", ">"};
        size_t i;
        for (i = 0; i < sizeof ops / sizeof *ops; i++) {
            size_t ol = strlen(ops[i]);
            if (!strncmp(p, ops[i], ol)) {
                if (!lx_push(L, JT_OP, ops[i], ol)) return TIDE_ENOMEM;
                if (*p == '(' || *p == '[' || *p == '{') depth++;
                else if ((*p == ')' || *p == ']' || *p == '}') && depth > 0) depth--;
                p += ol;
                break;
            }
        }
        if (i == sizeof ops / sizeof *ops) return lx_fail(L, "unexpected character '%c'", *p);
    }
}

int jinja_lex(const char *src0, struct jarena *a, struct jtok **toks, int *n, char *err, size_t errlen)
{
    struct lexer L = {.a = a, .line = 1, .err = err, .errlen = errlen};
    /* newlines normalised; one trailing newline dropped */
    size_t sl = strlen(src0);
    char *src = ja_alloc(a, sl + 1);
    if (!src) return TIDE_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < sl; i++) {
        if (src0[i] == '\r') { src[k++] = '\n'; if (src0[i + 1] == '\n') i++; }
        else src[k++] = src0[i];
    }
    if (k && src[k - 1] == '\n') k--;
    src[k] = 0;

    const char *p = src;
    bool strip_next = false;    /* the tag before ended with '-' */
    bool line_starting = true;  /* the text before this point ended a line (for lstrip_blocks) */
    while (*p) {
        /* the next tag opener */
        const char *o = p;
        while (*o && !(o[0] == '{' && (o[1] == '{' || o[1] == '%' || o[1] == '#'))) o++;
        const char *ts = p, *te = o;
        if (strip_next) {
            while (ts < te && is_space(*ts)) ts++;
            if (ts > p) line_starting = ts[-1] == '\n';
        }
        strip_next = false;
        char kind = *o ? o[1] : 0;
        char sign = *o ? o[2] : 0;
        if (kind && sign == '-') {
            while (te > ts && is_space(te[-1])) te--;
        } else if (kind && kind != '{' && sign != '+') {
            /* lstrip_blocks: only whitespace between the line's start and the tag */
            const char *ls = NULL;
            for (const char *x = te; x > ts; x--) if (x[-1] == '\n') { ls = x; break; }
            if (!ls && line_starting) ls = ts;
            if (ls) {
                const char *x = ls;
                while (x < te && is_space(*x)) x++;
                if (x == te) te = ls;
            }
        }
        if (te > ts) {
            if (!lx_push(&L, JT_TEXT, ts, (size_t)(te - ts))) return TIDE_ENOMEM;
        }
        for (const char *x = p; x < o; x++) if (*x == '\n') L.line++;
        if (!*o) break;
        p = o + 2;
        if (sign == '-' || sign == '+') p++;
        bool minus = false, plus = false;
        if (kind == '#') {
            const char *e = strstr(p, "#}");
            if (!e) return lx_fail(&L, "unclosed comment");
            minus = e > p && e[-1] == '-';
            for (const char *x = p; x < e; x++) if (*x == '\n') L.line++;
            p = e + 2;
        } else if (kind == '%' && !strncmp(p + strspn(p, " \t\n"), "raw", 3) &&
                   !is_name0(p[strspn(p, " \t\n") + 3])) {
            /* {% raw %}...{% endraw %}: the text between as is */
            const char *q = strstr(p, "%}");
            if (!q) return lx_fail(&L, "unclosed raw tag");
            bool rminus = q[-1] == '-';
            q += 2;
            const char *e = q;
            for (;;) {
                e = strstr(e, "{%");
                if (!e) return lx_fail(&L, "raw without endraw");
                const char *w = e + 2 + (e[2] == '-' || e[2] == '+');
                w += strspn(w, " \t\n");
                if (!strncmp(w, "endraw", 6)) break;
                e += 2;
            }
            const char *rs = q, *re = e;
            if (rminus) while (rs < re && is_space(*rs)) rs++;
            else if (*rs == '\n') rs++;
            if (e[2] == '-') while (re > rs && is_space(re[-1])) re--;
            if (re > rs && !lx_push(&L, JT_TEXT, rs, (size_t)(re - rs))) return TIDE_ENOMEM;
            const char *end = strstr(e, "%}");
            if (!end) return lx_fail(&L, "unclosed endraw tag");
            minus = end[-1] == '-';
            for (const char *x = p; x < end; x++) if (*x == '\n') L.line++;
            p = end + 2;
        } else {
            bool block = kind == '%';
            if (!lx_push(&L, block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, NULL, 0)) return TIDE_ENOMEM;
            int rc = lex_tag(&L, &p, block, &minus, &plus);
            if (rc) return rc;
            if (!block) { line_starting = false; strip_next = minus; continue; }
        }
        /* after a block or comment */
        strip_next = minus;
        line_starting = false;
        if (!minus && !plus && *p == '\n') { p++; L.line++; line_starting = true; }
    }
    if (!lx_push(&L, JT_EOF, NULL, 0)) return TIDE_ENOMEM;
    *toks = L.t;
    *n = L.n;
    return 0;
}
