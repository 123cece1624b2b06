/* test_json_schema.c - the JSON Schema compiler and the automaton it drives: documents the
 * schema allows are accepted byte by byte and end complete, wrong bytes are refused exactly
 * where they appear, whitespace and numbers are bounded, and schemas outside the subset are
 * refused with the keyword named. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <string.h>

#include "common.h"
#include "engine/json_schema.h"

static struct grammar *compile_ok(const char *schema, bool strict)
{
    cJSON *s = cJSON_Parse(schema);
    cr_assert(s, "bad test schema %s", schema);
    struct grammar *g = NULL;
    char msg[512] = "";
    int rc = json_schema_compile(s, strict, &g, msg, sizeof msg);
    cJSON_Delete(s);
    cr_assert_eq(rc, 0, "compile %s: %s", schema, msg);
    return g;
}

/* The offset of the first refused byte of text, or -1; *complete: whole value at the end. */
static long first_refusal(const struct grammar *g, const char *text, bool *complete)
{
    struct json_guard jg;
    json_guard_init(&jg, g);
    for (size_t i = 0; text[i]; i++)
        if (!json_guard_feed(&jg, text + i, 1)) return (long)i;
    if (complete) *complete = json_guard_complete(&jg);
    return -1;
}

static void expect_valid(const struct grammar *g, const char *text)
{
    bool done = false;
    long at = first_refusal(g, text, &done);
    cr_expect_eq(at, -1, "refused %s at %ld", text, at);
    cr_expect(done, "not complete: %s", text);
}

static void expect_refused(const struct grammar *g, const char *text, long where)
{
    long at = first_refusal(g, text, NULL);
    cr_expect_eq(at, where, "%s: refused at %ld, expected %ld", text, at, where);
}

#define PERSON "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"age\",\"tags\"]," \
    "\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}," \
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\",1,12,null]}}}}"

Test(json_schema, strict_object_accepts_its_documents)
{
    struct grammar *g = compile_ok(PERSON, true);
    expect_valid(g, "{\"name\":\"Ann\",\"age\":42,\"tags\":[]}");
    expect_valid(g, "{ \"name\": \"A \\\"q\\\" \\u00e9\", \"age\": -7, \"tags\": [\"a\", \"ab\", 1, 12, null] }");
    expect_valid(g, "{\"name\":\"\",\"age\":0,\"tags\":[12,1]}");
    grammar_free(g);
}

Test(json_schema, strict_object_refuses_where_the_document_goes_wrong)
{
    struct grammar *g = compile_ok(PERSON, true);
    expect_refused(g, "{\"age\":1", 2);                                  /* properties in order */
    expect_refused(g, "{\"name\":\"x\"}", 11);                            /* required age missing */
    expect_refused(g, "{\"name\":\"x\",\"age\":1.5", 19);                 /* integer */
    expect_refused(g, "{\"name\":\"x\",\"age\":1,\"tags\":[\"b\"", 29);    /* enum */
    expect_refused(g, "{\"name\":\"x\",\"age\":1,\"tags\":[123", 30);      /* enum: 12 then 3 */
    expect_refused(g, "{\"name\":\"x\",\"age\":1,\"tags\":[],", 29);       /* no extra property */
    expect_refused(g, "{\"name\":\"x\",\"age\":1,\"tags\":[]} ", 30);      /* nothing after */
    expect_refused(g, " {", 0);                                           /* nor before */
    expect_refused(g, "{\"name\":7", 8);
    bool done = true;
    cr_expect_eq(first_refusal(g, "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\"", &done), -1);
    cr_expect(!done, "a prefix is not complete");
    grammar_free(g);
}

Test(json_schema, whitespace_and_numbers_are_bounded)
{
    struct grammar *g = compile_ok(PERSON, true);
    expect_valid(g, "{\n \"name\":\"x\",\n \"age\":1,\n \"tags\":[]\n}");
    expect_refused(g, "{   \"name\"", 3);           /* a third blank in a row */
    expect_refused(g, "{\"name\":\"x\",\"age\":1234567890123456", 33); /* 16th digit */
    grammar_free(g);
    /* JSON mode (no schema) has the same bound: greedy decoding cannot run away in blanks */
    expect_refused(NULL, "{\"a\":[1,   2]}", 10);
    expect_refused(NULL, "{}\n", 2);
}

Test(json_schema, optional_properties_any_of_refs_and_types)
{
    struct grammar *g = compile_ok(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"$ref\":\"#/$defs/node\"},"
        "\"c\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"x\":{\"const\":\"X\"}},"
        "\"required\":[\"x\"]}]},\"d\":{\"type\":[\"boolean\",\"null\"]}},\"required\":[\"c\"],"
        "\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/node\"}}}}}", false);
    expect_valid(g, "{\"c\":null}");
    expect_valid(g, "{\"a\":-1.5e3,\"c\":\"s\"}");
    expect_valid(g, "{\"b\":{\"next\":{\"next\":{}}},\"c\":{\"x\":\"X\"},\"d\":true}");
    expect_valid(g, "{\"a\":2,\"b\":{},\"c\":\"\",\"d\":null}");
    expect_refused(g, "{}", 1);                        /* c is required */
    expect_refused(g, "{\"d\":true", 2);               /* d comes after the required c */
    expect_refused(g, "{\"c\":{\"x\":\"Y\"", 11);
    expect_refused(g, "{\"c\":1", 5);
    grammar_free(g);
    g = compile_ok("{\"type\":\"array\",\"items\":{}}", false); /* {}: any value */
    expect_valid(g, "[1,\"x\",{\"k\":[true,null]},[]]");
    grammar_free(g);
    g = compile_ok("{\"type\":\"number\"}", false);   /* a number at the top ends when the reply ends */
    expect_valid(g, "12.5");
    grammar_free(g);
}

Test(json_schema, outside_the_subset_is_refused_with_the_keyword)
{
    struct { const char *schema; bool strict; const char *word; } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", false, "'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\"}}}", false, "'format'"},
        {"{\"allOf\":[{}]}", false, "'allOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}", true, "additionalProperties"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":false}", true, "required"},
        {"{\"$ref\":\"http://x/y\"}", false, "$ref"},
        {"{\"$ref\":\"#/$defs/none\"}", false, "not defined"},
        {"{\"type\":\"text\"}", false, "type"},
        {"{\"enum\":[]}", false, "enum"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"z\"]}", false, "required"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *s = cJSON_Parse(bad[i].schema);
        struct grammar *g = NULL;
        char msg[512] = "";
        cr_expect_eq(json_schema_compile(s, bad[i].strict, &g, msg, sizeof msg), TIDE_EINVAL, "%s", bad[i].schema);
        cr_expect(strstr(msg, bad[i].word), "%s: message '%s' does not name %s", bad[i].schema, msg, bad[i].word);
        cJSON_Delete(s);
    }
}

/* A self-referencing anyOf cannot loop the automaton: the nesting bound stops it. */
Test(json_schema, recursive_any_of_terminates)
{
    struct grammar *g = compile_ok("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"integer\"}]}", false);
    expect_valid(g, "7");
    grammar_free(g);
}
