/* json_schema.h - compile a JSON Schema into the grammar json_guard.c runs while sampling.
 *
 * The subset is what OpenAI's strict structured outputs accept: type (object, array, string,
 * number, integer, boolean, null, or a list of them), properties, required,
 * additionalProperties, items, enum, const, anyOf, $ref to #/$defs/... (or #/definitions/...,
 * or # itself) with $defs/definitions, and nesting; title, description, default, examples,
 * $schema, $id and $comment are annotations and ignored. Any other keyword is refused, and the
 * error names it. With strict, every object must say additionalProperties: false and list every
 * property in required (OpenAI's rule).
 *
 * What is generated: object properties in the order the schema declares them, the required ones
 * always, an optional one may be left out; no property the schema does not declare (even when
 * additionalProperties allows them: the output is still valid). An object with no properties and
 * additionalProperties not false is any JSON object; a schema with no type ({} or true) any
 * value. enum and const values are written exactly as compact JSON. */
#ifndef TIDE_JSON_SCHEMA_H
#define TIDE_JSON_SCHEMA_H

#include "json_guard.h"

#include <cjson/cJSON.h>

enum gnode_kind {
    G_ANYOF,       /* one of child[0..n) */
    G_OBJECT,      /* declared properties: key set per start index, value child, required */
    G_FREE_OBJECT, /* any keys (strings), values: node items */
    G_ARRAY,       /* values: node items */
    G_STRING,
    G_NUMBER,
    G_INTEGER,
    G_LITERALS,    /* one of the texts, sorted bytewise (a prefix before its extensions); tag each */
};

struct gnode {
    int kind;
    int n;
    int *child;     /* anyOf: alternatives; object: value node of property i */
    int *keyset;    /* object: for next property i, the G_LITERALS node of the keys that may come */
    bool *required; /* object */
    char **text;    /* literals */
    uint16_t *len;
    uint16_t *tag;  /* literals: a key set's property index */
    int items;      /* array items / free object values */
    int key;        /* free object: the node its keys match (a string) */
};

struct grammar {
    struct gnode *node;
    int n, cap;
    int root;
    int any;        /* the "any JSON value" node, -1 until needed */
};

/* Compile schema; strict as response_format.json_schema.strict says. On a schema outside the
 * subset: TIDE_EINVAL, msg names the keyword and where it is (a JSON pointer). */
int json_schema_compile(const cJSON *schema, bool strict, struct grammar **out, char *msg, size_t msglen);

/* Grammar building blocks (json_guard.c builds JSON mode's grammar with them). Each returns the
 * new node's index, or -1 when out of memory or nodes. */
int grammar_add(struct grammar *g, int kind);
int grammar_add_literals(struct grammar *g, const char *const *texts, const uint16_t *tags, int n);
int grammar_any(struct grammar *g);

#endif
