/* json_guard.c - the pushdown automaton over bytes that json_guard.h describes, and the token
 * mask built on it. Each alternative is a stack of frames, one per grammar node being matched;
 * a byte goes to the top frame, which consumes it, refuses it, or (a number or a literal that
 * could have gone on) completes and hands the byte to the frame below. Pushing an anyOf forks
 * the alternative, one per branch; alternatives that become identical are merged. Also
 * sampler_constrain, the mask a sampler applies before each draw (sample.h keeps no grammar). */
#include "json_guard.h"
#include "json_schema.h"
#include "tokenizer.h"
#include "sample.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* container frames (object, free object, array) */
enum { C_OPEN, C_FIRST, C_KEY, C_COLON, C_VALUE_NEXT, C_AFTER_COMMA, C_IN_VALUE, C_AFTER_VALUE };
/* string frames */
enum { S_OPEN, S_BODY, S_ESCAPE, S_UNICODE, S_UTF8 };
/* number frames */
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_E_SIGN, N_EXP };

#define MAX_EXP_DIGITS 3
#define ANYOF_NESTING 8 /* anyOf directly inside anyOf (through $ref): deeper is refused */

static bool is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static void alt_copy(struct jg_alt *d, const struct jg_alt *s)
{
    d->depth = s->depth;
    d->ws = s->ws;
    memcpy(d->f, s->f, sizeof(struct jg_frame) * s->depth);
}

/* Add a to the set unless an identical alternative is there; past JSON_GUARD_MAX_ALT it is
 * dropped (the set only narrows). */
static void emit(struct json_guard *out, const struct jg_alt *a)
{
    for (int i = 0; i < out->n_alt; i++) {
        const struct jg_alt *b = &out->alt[i];
        if (b->depth == a->depth && b->ws == a->ws && !memcmp(b->f, a->f, sizeof(struct jg_frame) * a->depth))
            return;
    }
    if (out->n_alt < JSON_GUARD_MAX_ALT) alt_copy(&out->alt[out->n_alt++], a);
}

/* A required property at or after i: the object cannot close yet. */
static bool may_close(const struct gnode *nd, int i)
{
    if (nd->kind != G_OBJECT) return true;
    for (; i < nd->n; i++)
        if (nd->required[i]) return false;
    return true;
}

/* The top frame matched a whole value: pop it and move its parent on. */
static void complete(const struct grammar *g, struct jg_alt *a)
{
    uint16_t tag = a->f[a->depth - 1].idx;
    if (--a->depth == 0) return;
    struct jg_frame *p = &a->f[a->depth - 1];
    if (p->phase == C_KEY) {
        if (g->node[p->node].kind == G_OBJECT) p->idx = tag;
        p->phase = C_COLON;
    } else if (p->phase == C_IN_VALUE) {
        if (g->node[p->node].kind == G_OBJECT) p->idx++;
        p->phase = C_AFTER_VALUE;
    }
}

static void feed(const struct grammar *g, struct jg_alt *a, unsigned c, struct json_guard *out);

static struct jg_frame new_frame(const struct grammar *g, int node)
{
    struct jg_frame f;
    memset(&f, 0, sizeof f);
    f.node = (uint16_t)node;
    if (g->node[node].kind == G_LITERALS) f.hi = (uint16_t)g->node[node].n;
    return f;
}

/* Start matching node with byte c (an anyOf forks a, one alternative per branch). */
static void push_feed(const struct grammar *g, struct jg_alt *a, int node, unsigned c, struct json_guard *out,
                      int nesting)
{
    const struct gnode *nd = &g->node[node];
    if (nd->kind == G_ANYOF) {
        if (nesting >= ANYOF_NESTING) return;
        for (int i = 0; i < nd->n; i++) {
            struct jg_alt b;
            alt_copy(&b, a);
            push_feed(g, &b, nd->child[i], c, out, nesting + 1);
        }
        return;
    }
    if (a->depth == JSON_GUARD_MAX_DEPTH) return;
    a->f[a->depth++] = new_frame(g, node);
    feed(g, a, c, out);
}

/* Start matching node without a byte (the top-level value at init). */
static void push_only(const struct grammar *g, struct jg_alt *a, int node, struct json_guard *out, int nesting)
{
    const struct gnode *nd = &g->node[node];
    if (nd->kind == G_ANYOF) {
        if (nesting >= ANYOF_NESTING) return;
        for (int i = 0; i < nd->n; i++) {
            struct jg_alt b;
            alt_copy(&b, a);
            push_only(g, &b, nd->child[i], out, nesting + 1);
        }
        return;
    }
    a->f[a->depth++] = new_frame(g, node);
    emit(out, a);
}

static void consumed(struct jg_alt *a, struct json_guard *out)
{
    a->ws = 0;
    emit(out, a);
}

static void feed_container(const struct grammar *g, struct jg_alt *a, unsigned c, struct json_guard *out)
{
    struct jg_frame *f = &a->f[a->depth - 1];
    const struct gnode *nd = &g->node[f->node];
    bool obj = nd->kind != G_ARRAY;
    unsigned close = obj ? '}' : ']';
    if (f->phase == C_OPEN) {
        if (c != (obj ? '{' : '[')) return;
        f->phase = C_FIRST;
        consumed(a, out);
        return;
    }
    if (is_ws(c)) {
        if (a->ws >= JSON_GUARD_MAX_WS) return;
        a->ws++;
        emit(out, a);
        return;
    }
    switch (f->phase) {
    case C_FIRST:
    case C_AFTER_COMMA:
        if (c == close && f->phase == C_FIRST && may_close(nd, f->idx)) {
            complete(g, a);
            consumed(a, out);
            return;
        }
        if (!obj) {
            f->phase = C_IN_VALUE;
            a->ws = 0;
            push_feed(g, a, nd->items, c, out, 0);
            return;
        }
        if (c != '"') return;
        int key = nd->kind == G_FREE_OBJECT ? nd->key : f->idx < nd->n ? nd->keyset[f->idx] : -1;
        if (key < 0) return;
        f->phase = C_KEY;
        a->ws = 0;
        push_feed(g, a, key, c, out, 0);
        return;
    case C_COLON:
        if (c != ':') return;
        f->phase = C_VALUE_NEXT;
        consumed(a, out);
        return;
    case C_VALUE_NEXT:
        f->phase = C_IN_VALUE;
        a->ws = 0;
        push_feed(g, a, nd->kind == G_OBJECT ? nd->child[f->idx] : nd->items, c, out, 0);
        return;
    case C_AFTER_VALUE:
        if (c == ',' && (nd->kind != G_OBJECT || f->idx < nd->n)) {
            f->phase = C_AFTER_COMMA;
            consumed(a, out);
        } else if (c == close && may_close(nd, f->idx)) {
            complete(g, a);
            consumed(a, out);
        }
        return;
    }
}

/* A string frame keeps the \u escape it is reading in lo (the digits so far) and, after a high
 * surrogate, pos = 1: then only the escape of a low surrogate may follow. A lone or reversed
 * surrogate is refused at the first digit that makes it one, so every accepted prefix can still
 * be finished: JSON parsers such as cJSON and most languages' decoders reject lone surrogates. */
static unsigned hex_value(unsigned c) { return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

static bool unicode_digit_ok(const struct jg_frame *f, unsigned c)
{
    if (!is_hex(c)) return false;
    unsigned v = (unsigned)f->lo << 4 | hex_value(c), at = 4 - f->aux; /* digits read, c included: at + 1 */
    if (f->pos) /* after a high surrogate: DC00-DFFF */
        return at == 0 ? v == 0xd : at == 1 ? v >= 0xdc : true;
    return !(at == 1 && v >= 0xdc && v <= 0xdf); /* a low surrogate cannot come first */
}

static void feed_string(const struct grammar *g, struct jg_alt *a, unsigned c, struct json_guard *out)
{
    struct jg_frame *f = &a->f[a->depth - 1];
    switch (f->phase) {
    case S_OPEN:
        if (c != '"') return;
        f->phase = S_BODY;
        break;
    case S_BODY:
        if (f->pos && c != '\\') return; /* a high surrogate wants its low half */
        if (c == '"') complete(g, a);
        else if (c == '\\') f->phase = S_ESCAPE;
        else if (c < 0x20) return;
        else if (c >= 0x80) {
            /* UTF-8 lead bytes C2-F4 (no 2-byte overlongs, nothing past U+10FFFF) */
            if (c >= 0xc2 && c <= 0xdf) f->aux = 1;
            else if (c >= 0xe0 && c <= 0xef) f->aux = 2;
            else if (c >= 0xf0 && c <= 0xf4) f->aux = 3;
            else return;
            f->phase = S_UTF8;
        }
        break;
    case S_UTF8:
        if ((c & 0xc0) != 0x80) return;
        if (--f->aux == 0) f->phase = S_BODY;
        break;
    case S_ESCAPE:
        if (c == 'u') {
            f->phase = S_UNICODE;
            f->aux = 4;
            f->lo = 0;
        } else if (c && !f->pos && strchr("\"\\/bfnrt", (int)c)) {
            f->phase = S_BODY;
        } else {
            return;
        }
        break;
    case S_UNICODE:
        if (!unicode_digit_ok(f, c)) return;
        f->lo = (uint16_t)(f->lo << 4 | hex_value(c));
        if (--f->aux == 0) {
            f->phase = S_BODY;
            f->pos = f->lo >= 0xd800 && f->lo <= 0xdbff;
            f->lo = 0;
        }
        break;
    }
    consumed(a, out);
}

/* Returns true when the number ended before c: the caller hands c to the frame below. */
static bool feed_number(const struct grammar *g, struct jg_alt *a, unsigned c, struct json_guard *out)
{
    struct jg_frame *f = &a->f[a->depth - 1];
    bool real = g->node[f->node].kind == G_NUMBER;
    switch (f->phase) {
    case N_START:
    case N_MINUS:
        if (c == '-' && f->phase == N_START) f->phase = N_MINUS;
        else if (c == '0') f->phase = N_ZERO;
        else if (is_digit(c)) f->phase = N_INT, f->aux = 1;
        else return false;
        break;
    case N_ZERO:
    case N_INT:
        if (is_digit(c) && f->phase == N_INT) {
            if (f->aux >= JSON_GUARD_MAX_DIGITS) return false;
            f->aux++;
        } else if (real && c == '.') {
            f->phase = N_DOT;
        } else if (real && (c == 'e' || c == 'E')) {
            f->phase = N_E;
        } else {
            goto ends;
        }
        break;
    case N_DOT:
        if (!is_digit(c)) return false;
        f->phase = N_FRAC, f->aux = 1;
        break;
    case N_FRAC:
        if (is_digit(c)) {
            if (f->aux >= JSON_GUARD_MAX_DIGITS) return false;
            f->aux++;
        } else if (c == 'e' || c == 'E') {
            f->phase = N_E;
        } else {
            goto ends;
        }
        break;
    case N_E:
    case N_E_SIGN:
        if ((c == '+' || c == '-') && f->phase == N_E) f->phase = N_E_SIGN;
        else if (is_digit(c)) f->phase = N_EXP, f->aux = 1;
        else return false;
        break;
    case N_EXP:
        if (is_digit(c)) {
            if (f->aux >= MAX_EXP_DIGITS) return false;
            f->aux++;
            break;
        }
        goto ends;
    }
    consumed(a, out);
    return false;
ends:
    if (is_digit(c)) return false; /* the digit bound, not the end of the number */
    complete(g, a);
    return true;
}

/* Returns true when a literal ended before c (handed to the frame below). */
static bool feed_literals(const struct grammar *g, struct jg_alt *a, unsigned c, struct json_guard *out)
{
    struct jg_frame *f = &a->f[a->depth - 1];
    const struct gnode *nd = &g->node[f->node];
    int lo = f->lo, hi = f->hi, p = f->pos;
    /* The candidates share their first p bytes and are sorted: those going on with c are a run. */
    int nlo = lo;
    while (nlo < hi && !(nd->len[nlo] > p && (unsigned char)nd->text[nlo][p] == c)) nlo++;
    if (nlo < hi) {
        int nhi = nlo + 1;
        while (nhi < hi && nd->len[nhi] > p && (unsigned char)nd->text[nhi][p] == c) nhi++;
        f->lo = (uint16_t)nlo;
        f->hi = (uint16_t)nhi;
        f->pos = (uint16_t)(p + 1);
        if (nhi - nlo == 1 && nd->len[nlo] == p + 1) {
            f->idx = nd->tag[nlo];
            complete(g, a);
        }
        consumed(a, out);
        return false;
    }
    if (p > 0 && nd->len[lo] == p) { /* a shorter candidate is whole: it ends here */
        f->idx = nd->tag[lo];
        complete(g, a);
        return true;
    }
    return false;
}

static void feed(const struct grammar *g, struct jg_alt *a, unsigned c, struct json_guard *out)
{
    while (a->depth > 0) { /* nothing may follow the top-level value */
        switch (g->node[a->f[a->depth - 1].node].kind) {
        case G_OBJECT:
        case G_FREE_OBJECT:
        case G_ARRAY:
            feed_container(g, a, c, out);
            return;
        case G_STRING:
            feed_string(g, a, c, out);
            return;
        case G_NUMBER:
        case G_INTEGER:
            if (!feed_number(g, a, c, out)) return;
            break; /* ended: c goes to the frame below */
        case G_LITERALS:
            if (!feed_literals(g, a, c, out)) return;
            break;
        default:
            return;
        }
    }
}

/* ---- JSON mode's grammar ---- */

static struct grammar object_grammar;
static bool object_grammar_ok;
static pthread_once_t object_once = PTHREAD_ONCE_INIT;

static void build_object_grammar(void)
{
    struct grammar *g = &object_grammar;
    g->any = -1;
    int any = grammar_any(g);
    if (any < 0) return;
    g->root = g->node[any].child[0]; /* the free object */
    object_grammar_ok = g->node[g->root].kind == G_FREE_OBJECT;
}

const struct grammar *grammar_json_object(void)
{
    pthread_once(&object_once, build_object_grammar);
    return object_grammar_ok ? &object_grammar : NULL;
}

void json_guard_init(struct json_guard *g, const struct grammar *gr)
{
    g->g = gr ? gr : grammar_json_object();
    g->n_alt = 0;
    if (!g->g) return; /* out of memory at start-up: nothing is accepted, the reply ends */
    struct jg_alt a;
    a.depth = 0;
    a.ws = 0;
    push_only(g->g, &a, g->g->root, g, 0);
}

bool json_guard_feed(struct json_guard *g, const char *bytes, size_t n)
{
    struct json_guard next;
    for (size_t i = 0; i < n && g->n_alt; i++) {
        next.n_alt = 0;
        for (int k = 0; k < g->n_alt; k++) {
            struct jg_alt a;
            alt_copy(&a, &g->alt[k]);
            feed(g->g, &a, (unsigned char)bytes[i], &next);
        }
        g->n_alt = next.n_alt;
        for (int k = 0; k < next.n_alt; k++) alt_copy(&g->alt[k], &next.alt[k]);
    }
    return g->n_alt > 0;
}

bool json_guard_accepts(const struct json_guard *g, const char *bytes, size_t n)
{
    struct json_guard s;
    s.g = g->g;
    for (int k = 0; k < g->n_alt; k++) {
        const struct jg_alt *a = &g->alt[k];
        size_t i = 0;
        /* Inside a string, printable ASCII other than '"' and '\' changes nothing: most of the
         * vocabulary is tried there, so those bytes are passed over without a copy (not after a
         * high surrogate, pos set: only its low half's escape may follow). */
        if (a->depth && g->g->node[a->f[a->depth - 1].node].kind == G_STRING && a->f[a->depth - 1].phase == S_BODY &&
            !a->f[a->depth - 1].pos)
            while (i < n && (unsigned char)bytes[i] >= 0x20 && (unsigned char)bytes[i] < 0x80 && bytes[i] != '"' &&
                   bytes[i] != '\\')
                i++;
        if (i == n) return true;
        s.n_alt = 1;
        alt_copy(&s.alt[0], a);
        if (json_guard_feed(&s, bytes + i, n - i)) return true;
    }
    return false;
}

bool json_guard_complete(const struct json_guard *g)
{
    for (int k = 0; k < g->n_alt; k++) {
        const struct jg_alt *a = &g->alt[k];
        if (a->depth == 0) return true;
        if (a->depth > 1) continue;
        const struct jg_frame *f = &a->f[0];
        const struct gnode *nd = &g->g->node[f->node];
        if ((nd->kind == G_NUMBER || nd->kind == G_INTEGER) &&
            (f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP))
            return true;
        if (nd->kind == G_LITERALS && f->pos > 0 && nd->len[f->lo] == f->pos) return true;
    }
    return false;
}

void json_guard_mask(const struct json_guard *g, const struct tokenizer *tok, bool eog_ok, float *logits,
                     uint32_t n_vocab)
{
    bool done = json_guard_complete(g);
    /* Most tokens fail on their first byte: try each byte value once. */
    bool first_ok[256];
    for (int c = 0; c < 256; c++) {
        char b = (char)c;
        first_ok[c] = json_guard_accepts(g, &b, 1);
    }
    uint32_t allowed = 0;
    char piece[256];
    for (uint32_t id = 0; id < n_vocab; id++) {
        bool ok;
        if (tokenizer_is_eog(tok, (int)id)) {
            ok = done && eog_ok;
        } else if (tokenizer_is_special(tok, (int)id)) {
            ok = false;
        } else {
            int n = tokenizer_token_bytes(tok, (int)id, piece, sizeof piece);
            ok = n > 0 && n <= (int)sizeof piece && first_ok[(unsigned char)piece[0]] &&
                 (n == 1 || json_guard_accepts(g, piece, (size_t)n));
        }
        if (ok) allowed++;
        else logits[id] = -INFINITY;
    }
    int eos = tokenizer_eos(tok);
    if (!allowed && eos >= 0 && (uint32_t)eos < n_vocab)
        logits[eos] = 0.0f; /* nothing can follow: end here rather than sample from nothing */
}

void sampler_constrain(struct sampler *s, const struct json_guard *g, const struct tokenizer *tok,
                       int n_generated, float *logits)
{
    const struct sampling_params *p = &s->p;
    bool eog_ok = !p->ignore_eos && n_generated >= p->min_tokens;
    if (p->json_object) {
        json_guard_mask(g, tok, eog_ok, logits, s->n_vocab);
        return;
    }
    if (!eog_ok)
        for (uint32_t id = 0; id < s->n_vocab; id++)
            if (tokenizer_is_eog(tok, (int)id))
                logits[id] = -INFINITY;
}
