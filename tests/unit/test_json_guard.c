/* test_json_guard.c - JSON mode's prefix checker: valid objects are accepted byte by byte and
 * end complete (cJSON parses each as an object too), prefixes are open, and every wrong byte is
 * refused exactly where it appears. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <string.h>

#include "engine/json_guard.h"

/* Feeds s one byte at a time; returns the offset of the first refused byte, or -1. */
static long first_refusal(const char *s, struct json_guard *g)
{
    json_guard_init(g, NULL);
    for (size_t i = 0; s[i]; i++)
        if (!json_guard_feed(g, s + i, 1))
            return (long)i;
    return -1;
}

Test(json_guard, valid_objects_are_complete)
{
    const char *ok[] = {
        "{}", "{ }", "{\n \"a\": 1\n}", "{\"a\":1}", "{\"a\":-0.5e+10,\"b\":[1,2,{\"c\":null}],\"d\":true,\"e\":false}",
        "{\"s\":\"esc \\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9\"}", "{\"utf8\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}",
        "{\"n\":[0,10,1.25,-3,2E5,7e-2]}", "{\"pair\":\"\\ud83d\\ude00 \\uD7FF \\uE000\"}", "{\"deep\":[[[[{\"x\":[]}]]]]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct json_guard g;
        cr_assert_eq(first_refusal(ok[i], &g), -1, "refused %s", ok[i]);
        cr_assert(json_guard_complete(&g), "not complete: %s", ok[i]);
        cJSON *j = cJSON_Parse(ok[i]);
        cr_assert(j && cJSON_IsObject(j), "cJSON disagrees on %s", ok[i]);
        cJSON_Delete(j);
    }
}

Test(json_guard, prefixes_are_accepted_but_not_complete)
{
    const char *pre[] = {"", "{", "{\"a", "{\"a\"", "{\"a\":", "{\"a\":[", "{\"a\":1", "{\"a\":1.",
                         "{\"a\":\"\\u00", "{\"a\":tr", "{\"a\":{\"b\":[]", "{\"a\":\"\xe2\x82"};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) {
        struct json_guard g;
        cr_assert_eq(first_refusal(pre[i], &g), -1, "refused prefix %s", pre[i]);
        cr_assert(!json_guard_complete(&g), "complete too early: %s", pre[i]);
    }
}

Test(json_guard, wrong_bytes_are_refused_where_they_appear)
{
    struct { const char *s; long at; } bad[] = {
        {"[1]", 0}, {"\"x\"", 0}, {"1", 0}, {"{a:1}", 1}, {"{\"a\" 1}", 5}, {"{\"a\":01}", 6},
        {"{\"a\":1,}", 7}, {"{\"a\":[1,]}", 8}, {"{\"a\":tru}", 8}, {"{\"a\":\"\\x\"}", 7},
        {"{\"a\":\"\x01\"}", 6}, {"{\"a\":1]", 6}, {"{}}", 2}, {"{} x", 2}, {" {}", 0}, {"{   }", 3}, {"{\"a\":1   ,\"b\":2}", 8}, {"{\"a\":1234567890123456}", 20}, {"{\"a\":-}", 6},
        {"{\"a\":1.e5}", 7}, {"{\"a\":\"\xc0\xaf\"}", 6}, {"{\"a\":\"\xe2\x28\"}", 7}, {"{\"a\":\"\\u12g4\"}", 10},
        /* lone or reversed surrogates: cJSON and most decoders reject them */
        {"{\"a\":\"\\udc00\"}", 9}, {"{\"a\":\"\\uDFFF\"}", 9}, {"{\"a\":\"\\ud800\"}", 12},
        {"{\"a\":\"\\ud800x\"}", 12}, {"{\"a\":\"\\ud800\\n\"}", 13}, {"{\"a\":\"\\ud800\\u0041\"}", 14},
        {"{\"a\":\"\\ud800\\ud800\"}", 15},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct json_guard g;
        cr_assert_eq(first_refusal(bad[i].s, &g), bad[i].at, "%s refused at %ld, expected %ld", bad[i].s,
                     first_refusal(bad[i].s, &g), bad[i].at);
    }
}

Test(json_guard, nesting_deeper_than_the_limit_is_refused)
{
    char s[JSON_GUARD_MAX_DEPTH + 8] = "{\"a\":";
    size_t n = strlen(s);
    for (int i = 0; i < JSON_GUARD_MAX_DEPTH; i++) s[n++] = '[';
    s[n] = 0;
    struct json_guard g;
    cr_assert_eq(first_refusal(s, &g), (long)(5 + JSON_GUARD_MAX_DEPTH - 1), "depth limit");
}
