/* jinja_internal.h - what the Jinja modules share: the arena, tokens, the syntax tree and
 * values. jinja_lex.c turns source into tokens, jinja_parse.c tokens into a tree,
 * jinja_eval.c walks the tree, jinja_value.c and jinja_builtins.c hold the value
 * operations, filters, tests and methods. */
#ifndef TIDE_JINJA_INTERNAL_H
#define TIDE_JINJA_INTERNAL_H

#include "jinja.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena: everything a parse or a render makes, freed at once ---- */
struct jarena {
    struct jblock *head;
    size_t used, cap;   /* bytes handed out / allowed (0: no cap) */
    bool failed;        /* an allocation failed or passed cap */
};
void *ja_alloc(struct jarena *a, size_t n);   /* zeroed; NULL and a->failed on failure */
char *ja_strndup(struct jarena *a, const char *s, size_t n);
void ja_free(struct jarena *a);

/* ---- tokens ---- */
enum jtok_kind {
    JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP
};
struct jtok {
    enum jtok_kind kind;
    int line;
    const char *s;   /* text, name, decoded string or operator (arena) */
    size_t len;
    long long i;
    double f;
};
int jinja_lex(const char *src, struct jarena *a, struct jtok **toks, int *n, char *err, size_t errlen);

/* ---- values ---- */
enum jtype { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC };
struct jv {
    uint8_t t;
    uint8_t tuple;      /* a list made by a tuple (prints as (a, b)) */
    union {
        bool b;
        long long i;
        double f;
        struct { const char *p; size_t n; } s;
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
    } u;
};
struct jlist { int n, cap; struct jv *v; };
struct jdict { int n, cap; struct jv *k, *v; };
struct jnode;
struct jfunc {
    const struct jnode *macro;  /* a macro, or NULL: a builtin global */
    const char *name;
};

/* ---- syntax tree ---- */
enum jnode_kind {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_NOT,
    E_BIN, E_AND, E_OR, E_COND, E_LIST, E_TUPLE, E_DICT
};
struct jvec { struct jnode **v; int n, cap; };
struct jnode {
    enum jnode_kind kind;
    int line;
    const char *s;          /* text, name, attribute, filter/test name, operator */
    size_t slen;
    struct jnode *a, *b, *c;  /* operands; a set's target/value; a for's iterable and filter */
    struct jvec body, other;  /* bodies (if: then/else, for: body/else); args; list items */
    struct jvec kwvals;       /* keyword argument values, dict values, macro defaults */
    const char **names;       /* keyword names, for targets, macro parameters */
    int n_names;
    bool negated;             /* a test with 'is not' */
    struct jv lit;
};
int jvec_push(struct jarena *a, struct jvec *v, struct jnode *n);

struct jinja_template {
    struct jarena arena;
    struct jvec body;
};
int jinja_parse_tokens(struct jinja_template *t, const struct jtok *toks, int n, char *err, size_t errlen);

/* ---- rendering ---- */
struct jbuf { char *p; size_t len, cap, max; bool failed; };
void jb_put(struct jbuf *b, const char *s, size_t n);
void jb_puts(struct jbuf *b, const char *s);

struct jframe;
struct jctx {
    struct jarena *ar;
    struct jframe *root;
    const struct jinja_limits *lim;
    long steps;
    int depth;        /* macro calls */
    int eval_depth;   /* expression and block recursion */
    int rc;           /* first error (negative), 0 while fine */
    char *err;
    size_t errlen;
    int loop_ctl;     /* 1: break, 2: continue pending */
    bool json_ascii;  /* tojson(ensure_ascii=true) is running: non-ASCII as \uXXXX */
};
void jc_fail(struct jctx *c, int rc, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* value helpers (jinja_value.c) */
struct jv jv_undef(void);
struct jv jv_none(void);
struct jv jv_bool(bool b);
struct jv jv_int(long long i);
struct jv jv_float(double f);
struct jv jv_str(const char *p, size_t n);   /* borrows p */
struct jv jv_strdup(struct jctx *c, const char *p, size_t n);
struct jv jv_newlist(struct jctx *c);
struct jv jv_newdict(struct jctx *c);
void jl_push(struct jctx *c, struct jlist *l, struct jv v);
void jd_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v);
bool jd_get(const struct jdict *d, const char *key, size_t klen, struct jv *out);
struct jv jv_from_json(struct jctx *c, const struct cJSON *j);
bool jv_truthy(struct jv v);
bool jv_equal(struct jv a, struct jv b);
int jv_compare(struct jctx *c, struct jv a, struct jv b, int line, bool *ok);  /* <0, 0, >0 */
const char *jv_typename(struct jv v);
void jv_str_into(struct jbuf *b, struct jv v);    /* Python str() */
void jv_repr_into(struct jbuf *b, struct jv v);   /* Python repr() */
struct jv jv_to_str(struct jctx *c, struct jv v);
void jv_fmt_float(char *out, size_t cap, double f);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), separators=(item_sep, key_sep), sort_keys) */
int jv_json_into(struct jctx *c, struct jbuf *b, struct jv v, int indent, bool sort_keys, struct jv item_sep,
                 struct jv key_sep, int level, int line);
size_t utf8_count(const char *s, size_t n);
int jv_length(struct jv v);   /* -1: no length */
bool jv_iterable(struct jv v);
/* The items iterating v gives (a dict: its keys; a string: its characters). */
struct jlist *jv_iter_list(struct jctx *c, struct jv v, int line);

/* builtins (jinja_builtins.c) */
struct jargs {
    struct jv pos[8];
    int npos;
    const char *kwname[8];
    struct jv kw[8];
    int nkw;
};
struct jv jb_filter(struct jctx *c, const char *name, struct jv v, const struct jargs *a, int line);
bool jb_test(struct jctx *c, const char *name, struct jv v, const struct jargs *a, int line);
bool jb_has_filter(const char *name);
bool jb_has_test(const char *name);
/* obj.name(args): true when the method exists, *out its result */
bool jb_method(struct jctx *c, struct jv obj, const char *name, const struct jargs *a, struct jv *out, int line);
bool jb_is_global(const char *name);
struct jv jb_call_global(struct jctx *c, const char *name, const struct jargs *a, int line);
struct jv jb_getattr(struct jctx *c, struct jv obj, struct jv key, int line);   /* obj[key] / obj.key */
/* evaluation hook the builtins need (select/map with a filter or test name) */
struct jv jinja_call_value(struct jctx *c, struct jv fn, const struct jargs *a, int line);

#endif
