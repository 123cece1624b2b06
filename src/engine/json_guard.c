/* json_guard.c - a pushdown automaton over bytes for JSON mode (see json_guard.h). */
#include "json_guard.h"

#include <string.h>

enum {
    S_START,          /* before the top-level object: whitespace, then '{' */
    S_VALUE,          /* a value must come (after ':' or ',' in an array) */
    S_ARR_FIRST,      /* after '[': a value or ']' */
    S_OBJ_FIRST,      /* after '{': a key or '}' */
    S_OBJ_KEY,        /* after ',' in an object: a key */
    S_COLON,          /* after a key */
    S_AFTER_VALUE,    /* after a value inside a container: ',' or the closing bracket */
    S_STRING,
    S_ESCAPE,         /* after a backslash */
    S_UNICODE,        /* in \uXXXX; aux = hex digits left */
    S_UTF8,           /* in a multi-byte UTF-8 character; aux = continuation bytes left */
    S_NUM_MINUS,      /* '-' read: a digit must follow */
    S_NUM_ZERO,       /* a leading 0: no more integer digits */
    S_NUM_INT,
    S_NUM_DOT,        /* '.' read: a digit must follow */
    S_NUM_FRAC,
    S_NUM_E,          /* 'e' read: sign or digit */
    S_NUM_E_SIGN,     /* exponent sign read: a digit must follow */
    S_NUM_EXP,
    S_LITERAL,        /* in true/false/null; literal and aux say which and where */
    S_DONE,           /* the top-level object is closed: whitespace only */
};

static const char *literal_text(char c) { return c == 't' ? "true" : c == 'f' ? "false" : "null"; }
static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

void json_guard_init(struct json_guard *g)
{
    memset(g, 0, sizeof *g);
    g->state = S_START;
}

static void value_done(struct json_guard *g)
{
    g->state = g->depth ? S_AFTER_VALUE : S_DONE;
}

static bool open_container(struct json_guard *g, char c)
{
    if (g->depth == JSON_GUARD_MAX_DEPTH)
        return false;
    g->stack[g->depth++] = c;
    g->state = c == '{' ? S_OBJ_FIRST : S_ARR_FIRST;
    return true;
}

static bool close_container(struct json_guard *g, char c)
{
    if (!g->depth || g->stack[g->depth - 1] != (c == '}' ? '{' : '['))
        return false;
    g->depth--;
    value_done(g);
    return true;
}

/* The first byte of a value. */
static bool start_value(struct json_guard *g, unsigned char c)
{
    if (c == '{' || c == '[')
        return open_container(g, (char)c);
    if (c == '"') {
        g->state = S_STRING;
        g->in_key = 0;
        return true;
    }
    if (c == '-') { g->state = S_NUM_MINUS; return true; }
    if (c == '0') { g->state = S_NUM_ZERO; return true; }
    if (is_digit(c)) { g->state = S_NUM_INT; return true; }
    if (c == 't' || c == 'f' || c == 'n') {
        g->state = S_LITERAL;
        g->literal = c;
        g->aux = 1;
        return true;
    }
    return false;
}

/* A number ends at the first byte that cannot continue it; that byte belongs to what follows. */
static bool number_ends(struct json_guard *g, unsigned char c)
{
    value_done(g);
    if (is_ws(c))
        return true;
    if (g->state != S_AFTER_VALUE)
        return false;
    if (c == ',') {
        g->state = g->stack[g->depth - 1] == '{' ? S_OBJ_KEY : S_VALUE;
        return true;
    }
    return (c == '}' || c == ']') && close_container(g, (char)c);
}

static bool feed_byte(struct json_guard *g, unsigned char c)
{
    switch (g->state) {
    case S_START:
        if (is_ws(c)) return true;
        return c == '{' && open_container(g, '{');
    case S_VALUE:
        if (is_ws(c)) return true;
        return start_value(g, c);
    case S_ARR_FIRST:
        if (is_ws(c)) return true;
        if (c == ']') return close_container(g, ']');
        return start_value(g, c);
    case S_OBJ_FIRST:
    case S_OBJ_KEY:
        if (is_ws(c)) return true;
        if (c == '}' && g->state == S_OBJ_FIRST) return close_container(g, '}');
        if (c != '"') return false;
        g->state = S_STRING;
        g->in_key = 1;
        return true;
    case S_COLON:
        if (is_ws(c)) return true;
        if (c != ':') return false;
        g->state = S_VALUE;
        return true;
    case S_AFTER_VALUE:
        if (is_ws(c)) return true;
        if (c == ',') {
            g->state = g->stack[g->depth - 1] == '{' ? S_OBJ_KEY : S_VALUE;
            return true;
        }
        return (c == '}' || c == ']') && close_container(g, (char)c);
    case S_STRING:
        if (c == '"') {
            if (g->in_key) g->state = S_COLON;
            else value_done(g);
            return true;
        }
        if (c == '\\') { g->state = S_ESCAPE; return true; }
        if (c < 0x20) return false;
        if (c < 0x80) return true;
        /* UTF-8 lead bytes C2-F4 (no overlongs of 2 bytes, nothing past U+10FFFF) */
        if (c >= 0xc2 && c <= 0xdf) g->aux = 1;
        else if (c >= 0xe0 && c <= 0xef) g->aux = 2;
        else if (c >= 0xf0 && c <= 0xf4) g->aux = 3;
        else return false;
        g->state = S_UTF8;
        return true;
    case S_UTF8:
        if ((c & 0xc0) != 0x80) return false;
        if (--g->aux == 0) g->state = S_STRING;
        return true;
    case S_ESCAPE:
        if (c == 'u') {
            g->state = S_UNICODE;
            g->aux = 4;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return false;
        g->state = S_STRING;
        return true;
    case S_UNICODE:
        if (!is_hex(c)) return false;
        if (--g->aux == 0) g->state = S_STRING;
        return true;
    case S_NUM_MINUS:
        if (c == '0') { g->state = S_NUM_ZERO; return true; }
        if (is_digit(c)) { g->state = S_NUM_INT; return true; }
        return false;
    case S_NUM_ZERO:
    case S_NUM_INT:
        if (is_digit(c) && g->state == S_NUM_INT) return true;
        if (c == '.') { g->state = S_NUM_DOT; return true; }
        if (c == 'e' || c == 'E') { g->state = S_NUM_E; return true; }
        return number_ends(g, c);
    case S_NUM_DOT:
        if (!is_digit(c)) return false;
        g->state = S_NUM_FRAC;
        return true;
    case S_NUM_FRAC:
        if (is_digit(c)) return true;
        if (c == 'e' || c == 'E') { g->state = S_NUM_E; return true; }
        return number_ends(g, c);
    case S_NUM_E:
        if (c == '+' || c == '-') { g->state = S_NUM_E_SIGN; return true; }
        if (!is_digit(c)) return false;
        g->state = S_NUM_EXP;
        return true;
    case S_NUM_E_SIGN:
        if (!is_digit(c)) return false;
        g->state = S_NUM_EXP;
        return true;
    case S_NUM_EXP:
        if (is_digit(c)) return true;
        return number_ends(g, c);
    case S_LITERAL: {
        const char *lit = literal_text((char)g->literal);
        if ((unsigned char)lit[g->aux] != c) return false;
        if (lit[++g->aux] == 0) value_done(g);
        return true;
    }
    case S_DONE:
        return is_ws(c);
    }
    return false;
}

bool json_guard_feed(struct json_guard *g, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(g, (unsigned char)bytes[i]))
            return false;
    return true;
}

bool json_guard_complete(const struct json_guard *g)
{
    return g->state == S_DONE;
}
